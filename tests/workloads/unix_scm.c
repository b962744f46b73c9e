/*
 * unix_scm.c - unix sockets with file descriptors in flight in their queues
 * (SCM_RIGHTS) and shut down in part (zdtm's scm00-scm04, scm09,
 * sockets01, sockets03 and their seqpacket variants).
 *
 *   unix_scm PIDFILE
 *
 * Set up before "ready" (in the cwd):
 *   D   SOCK_DGRAM pair d0/d1: d0 sends "pipe-r" with the read end of a
 *       pipe holding "inpipe", then "pipe-w" with its write end, then
 *       "sock" with x1, one end of a stream pair x0/x1 (x1 holding
 *       "hello" from x0); the sent fds and d0 are closed (scm09)
 *   S   SOCK_SEQPACKET pair s0/s1: s0 sends "file" with two fds, a file
 *       unix_scm.data open read-write at offset 3 and an eventfd of count
 *       7 (scm03), then an empty message; both closed
 *   T   SOCK_STREAM pair t0/t1: t0 writes "abc", "def" with a second
 *       pipe's read end (the pipe kept open here, holding "second"), "ghi"
 *   H   SOCK_STREAM pair h0/h1, h0 shut for writing (sockets01)
 *   R   SOCK_STREAM pair r0/r1, r1 shut for reading (sockets03)
 *   Q   SOCK_SEQPACKET pair q0/q1: "last" queued to q1, q0 shut for
 *       writing (sockets01-seqpacket)
 *   E   SOCK_DGRAM pair g0/g1: g0 sends "ep" twice with the same epoll,
 *       which has the read end of a third pipe (at fd 101, data 0xA1)
 *       and an eventfd of count 1 (data 0xB2) registered; the epoll is
 *       closed here (scm05)
 * After SIGTERM:
 *   `dgram`     d1 gives "pipe-r", "pipe-w", "sock" in order, one fd each;
 *               the pipe reads "inpipe", then what is written to the
 *               received write end
 *   `socket`    the received x1 reads "hello", and bytes go both ways
 *               between x0 and x1
 *   `seqpacket` s1 gives "file" with two fds: the file at offset 3 reading
 *               its 4th byte on, the eventfd reading 7; then an empty
 *               message, then nothing
 *   `stream`    t1 gives "abcdef" with one fd (the second pipe: "second"
 *               written here comes out of it), then "ghi"
 *   `shutdown`  h1 reads end of file, h0 cannot write (EPIPE), h1 still
 *               writes to h0; r0 cannot write to r1 (EPIPE), r1 still
 *               writes to r0; q1 reads "last" then end of file (0)
 *   `epoll`     g1 gives "ep" twice, one fd each, both the same epoll
 *               (kcmp); it reports the eventfd (0xB2) ready, and the pipe
 *               (0xA1) too once a byte is written to it; its registration
 *               of fd 101 can be deleted by that number here, and is then
 *               gone from the second copy too
 */
#include "zdtm.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define DATA "unix_scm.data"
#define CONTENT "0123456789"

static int send_fds(int s, const char *msg, size_t len, int *fds, int n)
{
	char cbuf[CMSG_SPACE(sizeof(int) * 4)];
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *c;

	if (n) {
		memset(cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * n);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * n);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
	}
	return sendmsg(s, &mh, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

/* Receives one message (non-blocking): its length (-1 on error), up to 4
 * fds into fds, their count into *n. */
static ssize_t recv_fds(int s, char *buf, size_t size, int *fds, int *n)
{
	char cbuf[CMSG_SPACE(sizeof(int) * 4)];
	struct iovec iov = { .iov_base = buf, .iov_len = size };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c;
	ssize_t r;

	*n = 0;
	r = recvmsg(s, &mh, MSG_DONTWAIT);
	if (r < 0)
		return r;
	for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		*n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		memcpy(fds, CMSG_DATA(c), sizeof(int) * *n);
	}
	return r;
}

static int through(int from, int to, const char *what)
{
	char y[16] = { 0 };

	return write(from, what, strlen(what)) == (ssize_t)strlen(what) &&
	       read(to, y, sizeof(y) - 1) == (ssize_t)strlen(what) &&
	       !strcmp(y, what);
}

static void check_dgram(int d1, int x0)
{
	static const char *const want[3] = { "pipe-r", "pipe-w", "sock" };
	char buf[16], got[3][16];
	int fd[3] = { -1, -1, -1 }, fds[4], n, i, r = -1, w = -1, x1 = -1;

	/* All three messages in their order, each with one fd; the fds are
	 * then used by the name they came with. */
	for (i = 0; i < 3; i++) {
		memset(got[i], 0, sizeof(got[i]));
		if (recv_fds(d1, got[i], sizeof(got[i]) - 1, fds, &n) < 0 || n != 1)
			break;
		fd[i] = fds[0];
		if (!strcmp(got[i], "pipe-r"))
			r = fds[0];
		if (!strcmp(got[i], "pipe-w"))
			w = fds[0];
		if (!strcmp(got[i], "sock"))
			x1 = fds[0];
	}
	for (i = 0; i < 3; i++)
		zdtm_check(fd[i] >= 0 && !strcmp(got[i], want[i]), "dgram",
			   "message %d: \"%s\" with fd %d, expected \"%s\" with one fd",
			   i, fd[i] >= 0 ? got[i] : "", fd[i], want[i]);
	memset(buf, 0, sizeof(buf));
	if (r >= 0) {
		zdtm_check(read(r, buf, 6) == 6 && !memcmp(buf, "inpipe", 6),
			   "dgram", "pipe holds \"%.6s\", expected inpipe", buf);
		if (w >= 0)
			zdtm_check(through(w, r, "more"), "dgram",
				   "the received pipe ends are not one pipe");
	}
	zdtm_check(x1 >= 0, "socket", "x1 did not arrive");
	if (x1 >= 0) {
		memset(buf, 0, sizeof(buf));
		zdtm_check(recv(x1, buf, sizeof(buf), MSG_DONTWAIT) == 5 &&
				   !memcmp(buf, "hello", 5),
			   "socket", "x1 holds \"%s\", expected hello", buf);
		zdtm_check(through(x0, x1, "there") && through(x1, x0, "back"),
			   "socket", "x0 and x1 are not connected");
	}
}

static void check_seqpacket(int s1)
{
	char buf[16] = { 0 };
	int fds[4], n;
	uint64_t v = 0;
	ssize_t r = recv_fds(s1, buf, sizeof(buf), fds, &n);

	if (!zdtm_check(r == 4 && !memcmp(buf, "file", 4) && n == 2,
			"seqpacket", "got %zd bytes with %d fds", r, n))
		return;
	zdtm_check(lseek(fds[0], 0, SEEK_CUR) == 3, "seqpacket",
		   "file offset %ld, expected 3", (long)lseek(fds[0], 0, SEEK_CUR));
	memset(buf, 0, sizeof(buf));
	zdtm_check(read(fds[0], buf, 7) == 7 && !memcmp(buf, CONTENT + 3, 7),
		   "seqpacket", "file reads \"%s\"", buf);
	zdtm_check(read(fds[1], &v, 8) == 8 && v == 7, "seqpacket",
		   "eventfd count %llu, expected 7", (unsigned long long)v);
	r = recv_fds(s1, buf, sizeof(buf), fds, &n);
	zdtm_check(r == 0 && n == 0, "seqpacket",
		   "second message: %zd bytes, %d fds (expected empty)", r, n);
	zdtm_check(recv_fds(s1, buf, sizeof(buf), fds, &n) < 0 &&
			   errno == EAGAIN,
		   "seqpacket", "more queued");
}

static void check_stream(int t1)
{
	char buf[16] = { 0 };
	int fds[4], n = 0, p2w;
	ssize_t r = recv_fds(t1, buf, sizeof(buf), fds, &n);

	if (!zdtm_check(r == 6 && !memcmp(buf, "abcdef", 6) && n == 1,
			"stream", "got %zd bytes \"%s\" with %d fds", r, buf, n))
		return;
	p2w = 100; /* the second pipe's write end, see main */
	zdtm_check(through(p2w, fds[0], "second"), "stream",
		   "the fd in flight is not the second pipe");
	memset(buf, 0, sizeof(buf));
	r = recv_fds(t1, buf, sizeof(buf), fds, &n);
	zdtm_check(r == 3 && !memcmp(buf, "ghi", 3) && n == 0, "stream",
		   "then %zd bytes \"%s\" with %d fds", r, buf, n);
}

static void check_shutdown(int h0, int h1, int r0, int r1, int q1)
{
	char buf[8];

	zdtm_check(recv(h1, buf, 1, MSG_DONTWAIT) == 0, "shutdown",
		   "h1 does not read end of file");
	zdtm_check(send(h0, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
			   errno == EPIPE,
		   "shutdown", "h0 writes after SHUT_WR");
	zdtm_check(through(h1, h0, "ok"), "shutdown", "h1 cannot write to h0");
	zdtm_check(send(r0, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
			   errno == EPIPE,
		   "shutdown", "r0 writes to r1 shut for reading");
	zdtm_check(through(r1, r0, "ok"), "shutdown", "r1 cannot write to r0");
	zdtm_check(recv(q1, buf, sizeof(buf), MSG_DONTWAIT) == 4 &&
			   !memcmp(buf, "last", 4),
		   "shutdown", "q1 lost its last message");
	zdtm_check(recv(q1, buf, sizeof(buf), MSG_DONTWAIT) == 0, "shutdown",
		   "q1 does not read end of file");
}

/* The data of the ready events of epoll `ep`, as a bit set: 1 for 0xA1,
 * 2 for 0xB2, 4 for anything else; -1 if epoll_wait fails. */
static int ready(int ep)
{
	struct epoll_event ev[4];
	int n = epoll_wait(ep, ev, 4, 0), i, set = 0;

	if (n < 0)
		return -1;
	for (i = 0; i < n; i++)
		set |= ev[i].data.u64 == 0xA1 ? 1 : ev[i].data.u64 == 0xB2 ? 2 : 4;
	return set;
}

static void check_epoll(int g1, int p3w)
{
	char buf[8];
	int fds[4], n, a = -1, b = -1;

	if (recv_fds(g1, buf, sizeof(buf), fds, &n) == 2 && n == 1)
		a = fds[0];
	if (recv_fds(g1, buf, sizeof(buf), fds, &n) == 2 && n == 1)
		b = fds[0];
	if (!zdtm_check(a >= 0 && b >= 0, "epoll",
			"the two epolls in flight did not both arrive (%d, %d)", a, b))
		return;
	zdtm_check(syscall(SYS_kcmp, getpid(), getpid(), 0 /* KCMP_FILE */, a, b) == 0,
		   "epoll", "the epoll sent twice came back as two epolls");
	zdtm_check(ready(a) == 2, "epoll", "ready set %d, expected the eventfd (2)", ready(a));
	zdtm_check(write(p3w, "x", 1) == 1, "epoll", "write to the third pipe");
	zdtm_check(ready(a) == 3, "epoll", "ready set %d after a write to the pipe, expected 3",
		   ready(a));
	zdtm_check(epoll_ctl(a, EPOLL_CTL_DEL, 101, NULL) == 0, "epoll",
		   "deleting the registration of fd 101: %s", strerror(errno));
	zdtm_check(ready(b) == 2, "epoll", "ready set %d of the second copy, expected 2", ready(b));
}

int main(int argc, char **argv)
{
	int d[2], x[2], s[2], t[2], h[2], r[2], q[2], p[2], p2[2], f, e;
	int g[2], p3[2], ep, e3;

	zdtm_init(argc, argv, 0, "");
	if (socketpair(AF_UNIX, SOCK_DGRAM, 0, d) ||
	    socketpair(AF_UNIX, SOCK_STREAM, 0, x) ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET, 0, s) ||
	    socketpair(AF_UNIX, SOCK_STREAM, 0, t) ||
	    socketpair(AF_UNIX, SOCK_STREAM, 0, h) ||
	    socketpair(AF_UNIX, SOCK_STREAM, 0, r) ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET, 0, q) || pipe(p) || pipe(p2))
		zdtm_die("socketpair/pipe");
	/* The second pipe's write end at a known number. */
	if (dup2(p2[1], 100) != 100)
		zdtm_die("dup2");
	close(p2[1]);

	if (write(p[1], "inpipe", 6) != 6 || write(x[0], "hello", 5) != 5)
		zdtm_die("write");
	if (send_fds(d[0], "pipe-r", 6, &p[0], 1) ||
	    send_fds(d[0], "pipe-w", 6, &p[1], 1) ||
	    send_fds(d[0], "sock", 4, &x[1], 1))
		zdtm_die("send on D");
	close(p[0]);
	close(p[1]);
	close(x[1]);
	close(d[0]);

	f = open(DATA, O_RDWR | O_CREAT | O_TRUNC, 0600);
	e = eventfd(7, 0);
	if (f < 0 || e < 0 || write(f, CONTENT, 10) != 10 || lseek(f, 3, SEEK_SET) != 3)
		zdtm_die("data file/eventfd");
	{
		int two[2] = { f, e };

		if (send_fds(s[0], "file", 4, two, 2) || send(s[0], "", 0, 0))
			zdtm_die("send on S");
	}
	close(f);
	close(e);

	if (write(t[0], "abc", 3) != 3 ||
	    send_fds(t[0], "def", 3, &p2[0], 1) || write(t[0], "ghi", 3) != 3)
		zdtm_die("send on T");
	close(p2[0]);

	if (shutdown(h[0], SHUT_WR) || shutdown(r[1], SHUT_RD) ||
	    write(q[0], "last", 4) != 4 || shutdown(q[0], SHUT_WR))
		zdtm_die("shutdown");

	if (socketpair(AF_UNIX, SOCK_DGRAM, 0, g) || pipe(p3) || dup2(p3[0], 101) != 101)
		zdtm_die("socketpair/pipe for E");
	close(p3[0]);
	ep = epoll_create1(0);
	e3 = eventfd(1, 0);
	if (ep < 0 || e3 < 0)
		zdtm_die("epoll/eventfd for E");
	{
		struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 0xA1 };

		if (epoll_ctl(ep, EPOLL_CTL_ADD, 101, &ev))
			zdtm_die("epoll_ctl pipe");
		ev.data.u64 = 0xB2;
		if (epoll_ctl(ep, EPOLL_CTL_ADD, e3, &ev))
			zdtm_die("epoll_ctl eventfd");
	}
	if (send_fds(g[0], "ep", 2, &ep, 1) || send_fds(g[0], "ep", 2, &ep, 1))
		zdtm_die("send on E");
	close(ep);

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("dgram", {
		char b[8];
		int fd[4], n;

		recv_fds(d[1], b, sizeof(b), fd, &n);
	});
	ZDTM_CORRUPT("socket", close(x[0]), x[0] = socket(AF_UNIX, SOCK_STREAM, 0));
	ZDTM_CORRUPT("seqpacket", send(s[0], "x", 1, 0), close(s[1]), s[1] = s[0]);
	ZDTM_CORRUPT("stream", close(t[1]), t[1] = t[0]);
	ZDTM_CORRUPT("shutdown", close(h[0]), close(h[1]), socketpair(AF_UNIX, SOCK_STREAM, 0, h));
	ZDTM_CORRUPT("epoll", {
		char b[8];
		int fd[4], n;

		recv_fds(g[1], b, sizeof(b), fd, &n);
	});

	check_dgram(d[1], x[0]);
	check_seqpacket(s[1]);
	check_stream(t[1]);
	check_shutdown(h[0], h[1], r[0], r[1], q[1]);
	check_epoll(g[1], p3[1]);
	zdtm_finish();
}
