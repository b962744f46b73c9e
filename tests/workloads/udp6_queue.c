/*
 * udp6_queue.c - IPv6 UDP sockets with datagrams queued and unread at the
 * checkpoint: from IPv6 senders, one of which is gone, and from an IPv4
 * sender to a dual-stack socket (an IPv4-mapped address).
 *
 *   udp6_queue PIDFILE
 *
 * Set up before "ready" (ephemeral ports):
 *   r    bound to ::1; queued, in this order: D1 (100 bytes) from s1, D2
 *        (1500) from s2, D3 (3000) from s1.
 *   d    bound to :: with IPV6_V6ONLY off; queued: D4 (700) from v4 (an
 *        IPv4 socket on 127.0.0.1), then D5 (64) from s1.
 *   s1   bound to ::1, kept open; s2 bound to ::1, closed after sending;
 *   v4   bound to 127.0.0.1, kept open.
 * After SIGTERM it checks: r yields D1, D2, D3 in order, each byte for
 * byte from its sender's address, then nothing ("r"); d yields D4 from
 * ::ffff:127.0.0.1 and v4's port, then D5 from s1, then nothing ("d"); a
 * new datagram from s1 reaches r ("after").
 */
#include "zdtm.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define SEED_D 0x7564703600ull

static const size_t dlen[5] = { 100, 1500, 3000, 700, 64 };

static int bound6(struct sockaddr_in6 *a, const struct in6_addr *ip, int v6only)
{
	socklen_t l = sizeof(*a);
	int s = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (s < 0)
		zdtm_die("socket");
	if (setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only)))
		zdtm_die("IPV6_V6ONLY");
	memset(a, 0, sizeof(*a));
	a->sin6_family = AF_INET6;
	a->sin6_addr = *ip;
	if (bind(s, (struct sockaddr *)a, sizeof(*a)) ||
	    getsockname(s, (struct sockaddr *)a, &l))
		zdtm_die("bind");
	return s;
}

static void send_d(int from, int k, const struct sockaddr *to, socklen_t tl)
{
	unsigned char buf[4096];

	zdtm_fill(buf, dlen[k], SEED_D + k);
	if (sendto(from, buf, dlen[k], 0, to, tl) != (ssize_t)dlen[k])
		zdtm_die("sendto D%d", k + 1);
}

/* Receives D(k+1) on s: its length, its bytes and its sender (an IPv6
 * address and port). */
static void expect(int s, int k, const struct in6_addr *ip, in_port_t port, const char *tag)
{
	unsigned char buf[4096];
	struct sockaddr_in6 from;
	socklen_t l = sizeof(from);
	char want[INET6_ADDRSTRLEN], got[INET6_ADDRSTRLEN];
	ssize_t n = recvfrom(s, buf, sizeof(buf), MSG_DONTWAIT, (struct sockaddr *)&from, &l);

	if (!zdtm_check(n == (ssize_t)dlen[k], tag, "D%d: got %zd bytes (%s), expected %zu",
			k + 1, n, n < 0 ? strerror(errno) : "ok", dlen[k]))
		return;
	inet_ntop(AF_INET6, ip, want, sizeof(want));
	inet_ntop(AF_INET6, &from.sin6_addr, got, sizeof(got));
	zdtm_check(from.sin6_family == AF_INET6 && from.sin6_port == port &&
			   !memcmp(&from.sin6_addr, ip, sizeof(*ip)),
		   tag, "D%d came from [%s]:%d, expected [%s]:%d", k + 1, got,
		   ntohs(from.sin6_port), want, ntohs(port));
	zdtm_verify_pattern(tag, "datagram", buf, dlen[k], SEED_D + k);
}

static void expect_empty(int s, const char *tag)
{
	char b;
	ssize_t n = recv(s, &b, 1, MSG_DONTWAIT);

	zdtm_check(n < 0 && errno == EAGAIN, tag, "a datagram more than expected (%zd)", n);
}

int main(int argc, char **argv)
{
	struct sockaddr_in6 ra, da, s1a, s2a;
	struct sockaddr_in v4a, d4;
	struct in6_addr mapped;
	socklen_t l = sizeof(v4a);
	int r, d, s1, s2, v4;

	zdtm_init(argc, argv, 0, "");
	r = bound6(&ra, &in6addr_loopback, 1);
	d = bound6(&da, &in6addr_any, 0);
	s1 = bound6(&s1a, &in6addr_loopback, 1);
	s2 = bound6(&s2a, &in6addr_loopback, 1);
	v4 = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	memset(&v4a, 0, sizeof(v4a));
	v4a.sin_family = AF_INET;
	v4a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (v4 < 0 || bind(v4, (struct sockaddr *)&v4a, sizeof(v4a)) ||
	    getsockname(v4, (struct sockaddr *)&v4a, &l))
		zdtm_die("v4 socket");
	memset(&d4, 0, sizeof(d4));
	d4.sin_family = AF_INET;
	d4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	d4.sin_port = da.sin6_port;
	inet_pton(AF_INET6, "::ffff:127.0.0.1", &mapped);

	send_d(s1, 0, (struct sockaddr *)&ra, sizeof(ra));
	send_d(s2, 1, (struct sockaddr *)&ra, sizeof(ra));
	send_d(s1, 2, (struct sockaddr *)&ra, sizeof(ra));
	send_d(v4, 3, (struct sockaddr *)&d4, sizeof(d4));
	{
		struct sockaddr_in6 dl = da;

		dl.sin6_addr = in6addr_loopback;
		send_d(s1, 4, (struct sockaddr *)&dl, sizeof(dl));
	}
	close(s2);
	zdtm_msleep(50);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(20);

	ZDTM_CORRUPT("r", {
		char b[4096];
		recv(r, b, sizeof(b), MSG_DONTWAIT);
	});
	ZDTM_CORRUPT("d", {
		char b[4096];
		recv(d, b, sizeof(b), MSG_DONTWAIT);
	});
	expect(r, 0, &in6addr_loopback, s1a.sin6_port, "r");
	expect(r, 1, &in6addr_loopback, s2a.sin6_port, "r");
	expect(r, 2, &in6addr_loopback, s1a.sin6_port, "r");
	expect_empty(r, "r");
	expect(d, 3, &mapped, v4a.sin_port, "d");
	expect(d, 4, &in6addr_loopback, s1a.sin6_port, "d");
	expect_empty(d, "d");
	send_d(s1, 0, (struct sockaddr *)&ra, sizeof(ra));
	zdtm_msleep(20);
	expect(r, 0, &in6addr_loopback, s1a.sin6_port, "after");
	zdtm_finish();
	return 0;
}
