/*
 * udp_queue.c - UDP sockets with datagrams queued and unread at the
 * checkpoint, from several senders, one of which is gone.
 *
 *   udp_queue PIDFILE
 *
 * Set up before "ready" (all on 127.0.0.1, ephemeral ports):
 *   r    bound; queued, in this order: D1 (100 bytes) from s1, D2 (1500)
 *        from s2, D3 (3000) from s1.
 *   c    bound and connected to s1; queued: D4 (700) from s1.
 *   s1   bound, kept open; s2 bound, closed after sending.
 * After SIGTERM it checks: r yields D1, D2, D3 in order, each byte for
 * byte from its sender's address, then nothing; c yields D4 from s1, then
 * nothing; a new datagram from s1 reaches r (the sockets still work).
 */
#include "zdtm.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define SEED_D 0x7564707100ull

static const size_t dlen[4] = { 100, 1500, 3000, 700 };

static int bound_udp(struct sockaddr_in *a)
{
	socklen_t l = sizeof(*a);
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (s < 0)
		zdtm_die("socket");
	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(s, (struct sockaddr *)a, sizeof(*a)) ||
	    getsockname(s, (struct sockaddr *)a, &l))
		zdtm_die("bind");
	return s;
}

static void send_d(int from, int k, struct sockaddr_in *to)
{
	unsigned char buf[4096];

	zdtm_fill(buf, dlen[k], SEED_D + k);
	if (sendto(from, buf, dlen[k], 0, (struct sockaddr *)to, sizeof(*to)) !=
	    (ssize_t)dlen[k])
		zdtm_die("sendto D%d", k + 1);
}

static void expect(int s, int k, struct sockaddr_in *sender, const char *tag)
{
	unsigned char buf[4096];
	struct sockaddr_in from;
	socklen_t l = sizeof(from);
	ssize_t n = recvfrom(s, buf, sizeof(buf), MSG_DONTWAIT,
			     (struct sockaddr *)&from, &l);

	if (!zdtm_check(n == (ssize_t)dlen[k], tag,
			"D%d: got %zd bytes (%s), expected %zu", k + 1, n,
			n < 0 ? strerror(errno) : "ok", dlen[k]))
		return;
	zdtm_check(from.sin_port == sender->sin_port &&
		   from.sin_addr.s_addr == sender->sin_addr.s_addr, tag,
		   "D%d came from port %d, expected %d", k + 1,
		   ntohs(from.sin_port), ntohs(sender->sin_port));
	zdtm_verify_pattern(tag, "datagram", buf, dlen[k], SEED_D + k);
}

static void expect_empty(int s, const char *tag)
{
	char b;
	ssize_t n = recv(s, &b, 1, MSG_DONTWAIT);

	zdtm_check(n < 0 && errno == EAGAIN, tag,
		   "a datagram more than expected (%zd)", n);
}

int main(int argc, char **argv)
{
	struct sockaddr_in ra, ca, s1a, s2a;
	int r, c, s1, s2;

	zdtm_init(argc, argv, 0, "");
	r = bound_udp(&ra);
	c = bound_udp(&ca);
	s1 = bound_udp(&s1a);
	s2 = bound_udp(&s2a);
	if (connect(c, (struct sockaddr *)&s1a, sizeof(s1a)))
		zdtm_die("connect");
	send_d(s1, 0, &ra);
	send_d(s2, 1, &ra);
	send_d(s1, 2, &ra);
	send_d(s1, 3, &ca);
	close(s2);
	zdtm_msleep(50);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(20);

	ZDTM_CORRUPT("r", {
		char b[4096];
		recv(r, b, sizeof(b), MSG_DONTWAIT);
	});
	ZDTM_CORRUPT("c", {
		char b[4096];
		recv(c, b, sizeof(b), MSG_DONTWAIT);
	});
	expect(r, 0, &s1a, "r");
	expect(r, 1, &s2a, "r");
	expect(r, 2, &s1a, "r");
	expect_empty(r, "r");
	expect(c, 3, &s1a, "c");
	expect_empty(c, "c");
	send_d(s1, 0, &ra);
	zdtm_msleep(20);
	expect(r, 0, &s1a, "after");
	zdtm_finish();
	return 0;
}
