/*
 * tcp_pending.c - TCP connections waiting to be accepted, from clients of
 * the tree that have sent nothing yet: a listener L on 127.0.0.1 with two
 * connections in its accept queue, from c1 (blocking) and c2
 * (non-blocking, SO_KEEPALIVE set); the program never accepts before the
 * checkpoint.
 *
 *   tcp_pending PIDFILE
 *
 * After SIGTERM:
 *   `queue`    L accepts two connections, from c1's and c2's addresses
 *              (ports as at the start), and no third
 *   `data`     bytes go both ways on each
 *   `client`   c1 is still blocking, c2 still non-blocking with
 *              SO_KEEPALIVE, both bound to their first ports
 */
#include "zdtm.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static int port_of(int s, int peer)
{
	struct sockaddr_in a;
	socklen_t l = sizeof(a);

	if ((peer ? getpeername : getsockname)(s, (struct sockaddr *)&a, &l))
		return -1;
	return ntohs(a.sin_port);
}

static int connect_to(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int c = socket(AF_INET, SOCK_STREAM, 0);

	if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof(a)))
		zdtm_die("connect");
	return c;
}

/* Reads exactly `want` within 10 s. */
static int read_is(int fd, const char *want)
{
	char buf[32] = { 0 };
	size_t got = 0, n = strlen(want);
	int64_t end = zdtm_now_ns() + 10000000000ll;

	while (got < n && zdtm_now_ns() < end) {
		ssize_t r = recv(fd, buf + got, n - got, MSG_DONTWAIT);

		if (r > 0)
			got += r;
		else if (r == 0)
			break;
		else
			zdtm_msleep(5);
	}
	return got == n && !memcmp(buf, want, n);
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int l, c1, c2, p1, p2, one = 1, i, got[2] = { -1, -1 };

	zdtm_init(argc, argv, 0, "");
	l = socket(AF_INET, SOCK_STREAM, 0);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 8))
		zdtm_die("listener");
	c1 = connect_to(port_of(l, 0));
	c2 = connect_to(port_of(l, 0));
	if (fcntl(c2, F_SETFL, O_NONBLOCK) ||
	    setsockopt(c2, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)))
		zdtm_die("c2 options");
	p1 = port_of(c1, 0);
	p2 = port_of(c2, 0);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("queue", close(c2), c2 = connect_to(port_of(l, 0)));
	fcntl(l, F_SETFL, O_NONBLOCK);
	for (i = 0; i < 2; i++) {
		int64_t end = zdtm_now_ns() + 10000000000ll;
		int s, port;

		while ((s = accept(l, NULL, NULL)) < 0 && zdtm_now_ns() < end)
			zdtm_msleep(5);
		if (!zdtm_check(s >= 0, "queue", "connection %d not accepted", i + 1))
			break;
		port = port_of(s, 1);
		if (port == p1)
			got[0] = s;
		else if (port == p2)
			got[1] = s;
		else
			zdtm_fail("queue", "accepted a connection from port %d, expected %d or %d",
				  port, p1, p2);
	}
	/* Nothing else waits. */
	zdtm_msleep(20);
	zdtm_check(accept(l, NULL, NULL) < 0 && errno == EAGAIN, "queue",
		   "a third connection was waiting");
	if (got[0] >= 0)
		zdtm_check(write(c1, "one", 3) == 3 && read_is(got[0], "one") &&
				   write(got[0], "1back", 5) == 5 && read_is(c1, "1back"),
			   "data", "bytes over c1's connection");
	if (got[1] >= 0)
		zdtm_check(write(c2, "two", 3) == 3 && read_is(got[1], "two") &&
				   write(got[1], "2back", 5) == 5 && read_is(c2, "2back"),
			   "data", "bytes over c2's connection");
	{
		int ka = 0;
		socklen_t kl = sizeof(ka);

		ZDTM_CORRUPT("client", fcntl(c1, F_SETFL, O_NONBLOCK));
		getsockopt(c2, SOL_SOCKET, SO_KEEPALIVE, &ka, &kl);
		zdtm_check(!(fcntl(c1, F_GETFL) & O_NONBLOCK) && (fcntl(c2, F_GETFL) & O_NONBLOCK) &&
				   ka == 1,
			   "client", "flags c1 %#x c2 %#x, c2 keepalive %d", fcntl(c1, F_GETFL),
			   fcntl(c2, F_GETFL), ka);
		zdtm_check(port_of(c1, 0) == p1 && port_of(c2, 0) == p2, "client",
			   "ports %d %d, expected %d %d", port_of(c1, 0), port_of(c2, 0), p1, p2);
	}
	zdtm_finish();
}
