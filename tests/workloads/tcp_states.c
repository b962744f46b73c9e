/*
 * tcp_states.c - half-closed TCP connections at the checkpoint, both ends
 * in the workload, with data queued each way.
 *
 *   tcp_states PIDFILE
 *
 * Set up before "ready" (loopback, ephemeral ports; x-y also on ::1):
 *   x-y  x sent X (1000 bytes) and shut down its write side, y sent Y
 *        (700) back; neither read: x FIN_WAIT2, y CLOSE_WAIT.
 *   a-b  a filled its send buffer (A, N bytes, b not reading) and shut
 *        down: its FIN waits behind never-sent bytes: a FIN_WAIT1.
 *   c-d  c shut down first (d CLOSE_WAIT), then d filled its buffer (D)
 *        and shut down: d LAST_ACK with never-sent bytes and FIN.
 *   e-f  e filled its buffer (E) and shut down (FIN_WAIT1), then f shut
 *        down: f's FIN reached e first: e CLOSING, f FIN_WAIT2.
 *   g-h  both shut down and read to the end: the connection ended, both
 *        ends TCP_CLOSE (zdtm's socket-tcp-close2).
 *   m, n two listeners sharing a port through SO_REUSEPORT, m's then
 *        cleared (zdtm's socket-tcp-reuseport).
 *   u-w  UDP sockets connected to each other; u's send side shut down,
 *        w's receive side (zdtm's socket_udp_shutdown).
 * After SIGTERM it checks, before reading anything: every state as above
 * (e may be LAST_ACK: a CLOSING connection with never-sent bytes is
 * rebuilt so; both wait for the ack of their FIN and end alike; a may be
 * FIN_WAIT2: b's receive queue, rebuilt in fewer and fuller buffers than
 * loopback left it, can take less of its receive buffer, so the window probe
 * of a's never-sent bytes can find room, and they and a's FIN then reach
 * b before SIGTERM, as they would once b read); then
 * every byte of X, Y, A, D and E in order, each followed by end of file
 * where the peer shut down (and not where it did not); a send on a
 * shut-down side fails with EPIPE; y can still send to x, then close;
 * u cannot send (EPIPE), w polls POLLRDHUP and u was not (`udp`); g and
 * h are TCP_CLOSE, read end of file and cannot send (`ended`); m has
 * SO_REUSEPORT 0 and n 1, both on the same port, and a client is
 * accepted by one of them (`reuseport`).
 */
#include "zdtm.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#define SEED 0x7463707300ull
#define XLEN 1000
#define YLEN 700
#define BUF (64 * 1024)

struct pair {
	int c, s;
};

static struct pair connect_pair(int family)
{
	struct sockaddr_storage a;
	socklen_t l = sizeof(a);
	struct pair p;
	int lst = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, buf = BUF;

	memset(&a, 0, sizeof(a));
	if (family == AF_INET) {
		struct sockaddr_in *v4 = (struct sockaddr_in *)&a;

		v4->sin_family = AF_INET;
		v4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	} else {
		struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&a;

		v6->sin6_family = AF_INET6;
		v6->sin6_addr = in6addr_loopback;
	}
	if (lst < 0 || setsockopt(lst, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    setsockopt(lst, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf)) ||
	    bind(lst, (struct sockaddr *)&a, l) ||
	    getsockname(lst, (struct sockaddr *)&a, &l) || listen(lst, 4))
		zdtm_die("listener");
	p.c = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (p.c < 0 || setsockopt(p.c, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf)) ||
	    setsockopt(p.c, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf)) ||
	    connect(p.c, (struct sockaddr *)&a, l))
		zdtm_die("connect");
	p.s = accept4(lst, NULL, NULL, SOCK_CLOEXEC);
	if (p.s < 0 || setsockopt(p.s, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf)))
		zdtm_die("accept");
	close(lst);
	return p;
}

static int state_of(int s)
{
	struct tcp_info ti;
	socklen_t l = sizeof(ti);

	if (getsockopt(s, IPPROTO_TCP, TCP_INFO, &ti, &l))
		return -1;
	return ti.tcpi_state;
}

static void wait_state(int s, int want, const char *who)
{
	for (int i = 0; i < 2000 && state_of(s) != want; i++)
		zdtm_msleep(1);
	if (state_of(s) != want)
		zdtm_die("%s: state %d, expected %d", who, state_of(s), want);
}

static int send_pattern(int s, size_t len, uint64_t seed)
{
	static unsigned char buf[4096];

	zdtm_fill(buf, len, seed);
	return send(s, buf, len, MSG_NOSIGNAL) == (ssize_t)len;
}

/* Writes the pattern `seed` until the buffers are full; returns how much. */
static size_t fill(int s, uint64_t seed)
{
	size_t off = 0;
	int fl = fcntl(s, F_GETFL);

	fcntl(s, F_SETFL, fl | O_NONBLOCK);
	for (int idle = 0; idle < 20;) {
		unsigned char buf[1024];
		ssize_t n;

		for (size_t i = 0; i < sizeof(buf); i++)
			buf[i] = zdtm_pat_byte(seed, off + i);
		n = send(s, buf, sizeof(buf), MSG_NOSIGNAL);
		if (n > 0) {
			off += n;
			idle = 0;
		} else if (errno == EAGAIN) {
			idle++;
			zdtm_msleep(2);
		} else {
			zdtm_die("fill");
		}
	}
	fcntl(s, F_SETFL, fl);
	return off;
}

/* Reads `len` bytes of the pattern `seed`, then expects end of file
 * (`eof`) or nothing yet. */
static void expect(int s, size_t len, uint64_t seed, int eof, const char *tag)
{
	unsigned char buf[4096];
	size_t off = 0, bad = 0;
	ssize_t n = 0;
	char c;

	while (off < len) {
		size_t want = len - off < sizeof(buf) ? len - off : sizeof(buf);

		n = recv(s, buf, want, MSG_DONTWAIT);
		if (n < 0 && errno == EAGAIN) {
			struct pollfd pfd = { .fd = s, .events = POLLIN };

			if (poll(&pfd, 1, 5000) == 1)
				continue;
		}
		if (n <= 0)
			break;
		for (ssize_t i = 0; i < n; i++)
			if (buf[i] != zdtm_pat_byte(seed, off + i) && bad++ < 4)
				zdtm_fail(tag, "byte %zu: got %#x, expected %#x",
					  off + i, buf[i],
					  zdtm_pat_byte(seed, off + i));
		off += n;
	}
	if (!zdtm_check(off == len, tag, "got %zu bytes (last recv %zd: %s), expected %zu",
			off, n, n < 0 ? strerror(errno) : "ok", len))
		return;
	if (eof) {
		struct pollfd pfd = { .fd = s, .events = POLLIN };

		poll(&pfd, 1, 5000);
		n = recv(s, &c, 1, MSG_DONTWAIT);
		zdtm_check(n == 0, tag, "no end of file after the data (%zd: %s)",
			   n, n < 0 ? strerror(errno) : "a byte more");
	} else {
		n = recv(s, &c, 1, MSG_DONTWAIT);
		zdtm_check(n < 0 && errno == EAGAIN, tag,
			   "something after the data (%zd)", n);
	}
}

static void expect_epipe(int s, const char *tag)
{
	ssize_t n = send(s, "z", 1, MSG_DONTWAIT | MSG_NOSIGNAL);

	zdtm_check(n < 0 && errno == EPIPE, tag,
		   "a send after shutdown gave %zd (%s), expected EPIPE", n,
		   n < 0 ? strerror(errno) : "sent");
}

static void check_state(int s, int want, int or_else, const char *who)
{
	int st = state_of(s);

	zdtm_check(st == want || st == or_else, "state", "%s in state %d, expected %d",
		   who, st, want);
}

/* x-y: sets it up. */
static struct pair half_closed(int family, uint64_t seed)
{
	struct pair p = connect_pair(family);

	if (!send_pattern(p.c, XLEN, seed))
		zdtm_die("send X");
	shutdown(p.c, SHUT_WR);
	if (!send_pattern(p.s, YLEN, seed + 1))
		zdtm_die("send Y");
	wait_state(p.c, TCP_FIN_WAIT2, "x");
	wait_state(p.s, TCP_CLOSE_WAIT, "y");
	return p;
}

/* x-y: checks it, then y sends more and closes. */
static void check_half_closed(struct pair p, uint64_t seed, const char *tag)
{
	expect(p.s, XLEN, seed, 1, tag);
	expect(p.c, YLEN, seed + 1, 0, tag);
	expect_epipe(p.c, tag);
	zdtm_check(send_pattern(p.s, 100, seed + 2), tag,
		   "y cannot send to x after the restore: %s", strerror(errno));
	shutdown(p.s, SHUT_WR);
	expect(p.c, 100, seed + 2, 1, tag);
}

/* Two UDP sockets on 127.0.0.1 connected to each other. */
static struct pair udp_pair(void)
{
	struct sockaddr_in a[2];
	socklen_t l = sizeof(a[0]);
	int s[2];
	struct pair p;

	for (int i = 0; i < 2; i++) {
		s[i] = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		memset(&a[i], 0, sizeof(a[i]));
		a[i].sin_family = AF_INET;
		a[i].sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (s[i] < 0 || bind(s[i], (struct sockaddr *)&a[i], l) ||
		    getsockname(s[i], (struct sockaddr *)&a[i], &l))
			zdtm_die("udp bind");
	}
	if (connect(s[0], (struct sockaddr *)&a[1], l) ||
	    connect(s[1], (struct sockaddr *)&a[0], l))
		zdtm_die("udp connect");
	p.c = s[0];
	p.s = s[1];
	return p;
}

static int rdhup(int s)
{
	struct pollfd p = { .fd = s, .events = POLLRDHUP };

	return poll(&p, 1, 0) == 1 && (p.revents & POLLRDHUP);
}

/* A listener on 127.0.0.1, port `*port` (0: any), with SO_REUSEPORT. */
static int reuseport_listener(int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t l = sizeof(a);
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	a.sin_port = htons(*port);
	if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) ||
	    bind(s, (struct sockaddr *)&a, l) || getsockname(s, (struct sockaddr *)&a, &l) ||
	    listen(s, 4))
		zdtm_die("reuseport listener");
	*port = ntohs(a.sin_port);
	return s;
}

static void check_reuseport(int m, int n, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int vm = -1, vn = -1, c, got = -1;
	socklen_t l = sizeof(vm);

	getsockopt(m, SOL_SOCKET, SO_REUSEPORT, &vm, &l);
	getsockopt(n, SOL_SOCKET, SO_REUSEPORT, &vn, &l);
	zdtm_check(vm == 0 && vn == 1, "reuseport", "SO_REUSEPORT %d and %d, expected 0 and 1", vm, vn);
	for (int i = 0; i < 2; i++) {
		int s = i ? n : m;

		l = sizeof(a);
		getsockname(s, (struct sockaddr *)&a, &l);
		zdtm_check(ntohs(a.sin_port) == port, "reuseport", "listener %d on port %d, expected %d",
			   i, ntohs(a.sin_port), port);
	}
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	a.sin_port = htons(port);
	c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof(a))) {
		zdtm_fail("reuseport", "connect: %s", strerror(errno));
		return;
	}
	for (int i = 0; i < 1000 && got < 0; i++) {
		got = accept(m, NULL, NULL);
		if (got < 0)
			got = accept(n, NULL, NULL);
		if (got < 0)
			zdtm_msleep(2);
	}
	zdtm_check(got >= 0, "reuseport", "no listener accepted the client");
}

int main(int argc, char **argv)
{
	int lm, ln, lport = 0, zero = 0;
	struct pair xy, xy6, ab, cd, ef, gh, uw;
	size_t na, nd, ne;

	zdtm_init(argc, argv, 0, "");
	xy = half_closed(AF_INET, SEED);
	xy6 = half_closed(AF_INET6, SEED + 10);

	ab = connect_pair(AF_INET);
	na = fill(ab.c, SEED + 20);
	shutdown(ab.c, SHUT_WR);
	wait_state(ab.c, TCP_FIN_WAIT1, "a");

	cd = connect_pair(AF_INET);
	shutdown(cd.c, SHUT_WR);
	wait_state(cd.s, TCP_CLOSE_WAIT, "d");
	nd = fill(cd.s, SEED + 30);
	shutdown(cd.s, SHUT_WR);
	wait_state(cd.s, TCP_LAST_ACK, "d");

	ef = connect_pair(AF_INET);
	ne = fill(ef.c, SEED + 40);
	shutdown(ef.c, SHUT_WR);
	shutdown(ef.s, SHUT_WR);
	wait_state(ef.c, TCP_CLOSING, "e");
	wait_state(ef.s, TCP_FIN_WAIT2, "f");

	gh = connect_pair(AF_INET);
	shutdown(gh.c, SHUT_WR);
	shutdown(gh.s, SHUT_WR);
	expect(gh.c, 0, 0, 1, "setup");
	expect(gh.s, 0, 0, 1, "setup");
	wait_state(gh.c, TCP_CLOSE, "g");
	wait_state(gh.s, TCP_CLOSE, "h");
	lm = reuseport_listener(&lport);
	ln = reuseport_listener(&lport);
	setsockopt(lm, SOL_SOCKET, SO_REUSEPORT, &zero, sizeof(zero));
	uw = udp_pair();
	if (shutdown(uw.c, SHUT_WR) || shutdown(uw.s, SHUT_RD))
		zdtm_die("udp shutdown");

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(20);

	ZDTM_CORRUPT("state", shutdown(xy.s, SHUT_WR));
	ZDTM_CORRUPT("xy", {
		char b;
		recv(xy.s, &b, 1, 0);
	});
	ZDTM_CORRUPT("xy6", {
		char b;
		recv(xy6.c, &b, 1, 0);
	});
	ZDTM_CORRUPT("ab", {
		char b;
		recv(ab.s, &b, 1, 0);
	});
	ZDTM_CORRUPT("cd", {
		char b;
		recv(cd.c, &b, 1, 0);
	});
	ZDTM_CORRUPT("ef", {
		char b;
		recv(ef.s, &b, 1, 0);
	});
	ZDTM_CORRUPT("ended", gh = connect_pair(AF_INET));
	check_state(gh.c, TCP_CLOSE, TCP_CLOSE, "g");
	check_state(gh.s, TCP_CLOSE, TCP_CLOSE, "h");
	expect(gh.c, 0, 0, 1, "ended");
	expect(gh.s, 0, 0, 1, "ended");
	expect_epipe(gh.c, "ended");
	expect_epipe(gh.s, "ended");
	ZDTM_CORRUPT("reuseport", setsockopt(ln, SOL_SOCKET, SO_REUSEPORT, &zero, sizeof(zero)));
	check_reuseport(lm, ln, lport);
	ZDTM_CORRUPT("udp", uw = udp_pair());
	expect_epipe(uw.c, "udp");
	zdtm_check(rdhup(uw.s), "udp", "w: no POLLRDHUP: its receive side is open");
	zdtm_check(!rdhup(uw.c), "udp", "u: POLLRDHUP: its receive side is shut");
	check_state(xy.c, TCP_FIN_WAIT2, TCP_FIN_WAIT2, "x");
	check_state(xy.s, TCP_CLOSE_WAIT, TCP_CLOSE_WAIT, "y");
	check_state(xy6.c, TCP_FIN_WAIT2, TCP_FIN_WAIT2, "x6");
	check_state(xy6.s, TCP_CLOSE_WAIT, TCP_CLOSE_WAIT, "y6");
	check_state(ab.c, TCP_FIN_WAIT1, TCP_FIN_WAIT2, "a");
	check_state(cd.c, TCP_FIN_WAIT2, TCP_FIN_WAIT2, "c");
	check_state(cd.s, TCP_LAST_ACK, TCP_LAST_ACK, "d");
	check_state(ef.c, TCP_CLOSING, TCP_LAST_ACK, "e");
	check_state(ef.s, TCP_FIN_WAIT2, TCP_FIN_WAIT2, "f");

	check_half_closed(xy, SEED, "xy");
	check_half_closed(xy6, SEED + 10, "xy6");
	expect(ab.s, na, SEED + 20, 1, "ab");
	expect_epipe(ab.c, "ab");
	expect(cd.c, nd, SEED + 30, 1, "cd");
	expect(cd.s, 0, 0, 1, "cd");
	expect_epipe(cd.s, "cd");
	expect(ef.s, ne, SEED + 40, 1, "ef");
	expect(ef.c, 0, 0, 1, "ef");
	expect_epipe(ef.s, "ef");
	zdtm_finish();
	return 0;
}
