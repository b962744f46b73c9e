/*
 * scm_kinds.c - files in flight (SCM_RIGHTS) of the kinds that hold state
 * of their own outside any fd table: an inotify, a fanotify group, a UDP
 * socket, an established TCP connection, a TCP listener, a pseudo-terminal
 * slave, and an open file that a process of the tree holds too.
 *
 *   scm_kinds PIDFILE
 *
 * Set up before "ready" (in the cwd), each sent from a0 to a1 (a
 * SOCK_DGRAM pair; a0 closed) in a message of its own, then closed here
 * unless said otherwise:
 *   "ino"   an inotify watching scm_kinds.d for IN_CREATE
 *   "fan"   a fanotify group with a FAN_OPEN mark on scm_kinds.f
 *   "udp"   a UDP socket bound to 127.0.0.1:P, "dgram" queued to it from
 *           a second UDP socket u2 (kept)
 *   "tcp"   the accepted end s of a loopback TCP connection, "to-s"
 *           queued to it by the client c (c and the listener kept)
 *   "lis"   a second TCP listener on 127.0.0.1:Q
 *   "tty"   the slave of a pty (no echo), "line\n" typed on the master
 *           (kept)
 *   "file"  scm_kinds.data open read-write at offset 5, the fd kept: one
 *           open file in flight and in the table
 *   "pair"  q1 of a unix stream pair q0/q1, both kept, "q" queued to q1
 * After SIGTERM, a1 gives each message in order with one fd, and:
 *   `inotify`  the inotify reports a file created in scm_kinds.d, with
 *              the watch descriptor it had
 *   `fanotify` the fanotify reports opening scm_kinds.f (root only)
 *   `udp`      the socket is bound to port P, reads "dgram", then what u2
 *              sends
 *   `tcp`      s reads "to-s", then bytes go both ways between c and s
 *   `listen`   the listener is on port Q and accepts a new connection
 *   `tty`      the slave reads "line\n", the master reads what it writes
 *   `file`     the fd that arrived and the kept one are one open file
 *              (kcmp; a seek on one moves the other)
 *   `pair`     the socket that arrived is q1 (kcmp); it reads "q", then
 *              what q0 writes
 */
#include "zdtm.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/fanotify.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <termios.h>

#define DIR_ "scm_kinds.d"
#define FAN "scm_kinds.f"
#define DATA "scm_kinds.data"

static int send_fd(int s, const char *msg, int fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = strlen(msg) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c;

	memset(cbuf, 0, sizeof(cbuf));
	c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	return sendmsg(s, &mh, MSG_NOSIGNAL) == (ssize_t)strlen(msg) ? 0 : -1;
}

/* The fd of the next message of a1, which must read `msg`; -1 if not. */
static int recv_fd(int s, const char *msg, const char *tag)
{
	char buf[16] = { 0 }, cbuf[CMSG_SPACE(sizeof(int) * 4)];
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) - 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c;
	int fd = -1, n = 0;
	ssize_t r = recvmsg(s, &mh, MSG_DONTWAIT);

	for (c = CMSG_FIRSTHDR(&mh); r >= 0 && c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			memcpy(&fd, CMSG_DATA(c), sizeof(int));
		}
	if (!zdtm_check(r == (ssize_t)strlen(msg) && !strcmp(buf, msg) && n == 1, tag,
			"message %zd \"%s\" with %d fd(s), expected \"%s\" with one", r, buf, n,
			msg))
		return -1;
	return fd;
}

static int port_of(int s)
{
	struct sockaddr_in a;
	socklen_t l = sizeof(a);

	if (getsockname(s, (struct sockaddr *)&a, &l))
		return -1;
	return ntohs(a.sin_port);
}

static int tcp_listener(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int l = socket(AF_INET, SOCK_STREAM, 0);

	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 4))
		zdtm_die("tcp listener");
	return l;
}

static int tcp_connect(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int c = socket(AF_INET, SOCK_STREAM, 0);

	if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof(a)))
		zdtm_die("tcp connect");
	return c;
}

/* Reads exactly `want` from fd (blocking, bounded by a 10 s poll). */
static int read_is(int fd, const char *want)
{
	char buf[32] = { 0 };
	size_t got = 0, n = strlen(want);
	int64_t end = zdtm_now_ns() + 5000000000ll;

	while (got < n && zdtm_now_ns() < end) {
		ssize_t r = recv(fd, buf + got, n - got, MSG_DONTWAIT);

		if (r < 0 && errno == ENOTSOCK)
			r = read(fd, buf + got, n - got);
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
	int a[2], ino, wd, fan = -1, u, u2, lis, c, s, lis2, k, f, q[2], mt, sl;
	int root = geteuid() == 0, udp_port, lis2_port;
	struct sockaddr_in ua = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t ul = sizeof(ua);

	zdtm_init(argc, argv, 0, "");
	if (socketpair(AF_UNIX, SOCK_DGRAM, 0, a))
		zdtm_die("socketpair");
	/* Room for every message and its fd. */
	{
		int big = 1 << 20;

		setsockopt(a[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
		setsockopt(a[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	}

	/* ino */
	if (mkdir(DIR_, 0700) && errno != EEXIST)
		zdtm_die("mkdir");
	unlink(DIR_ "/new");
	ino = inotify_init1(IN_NONBLOCK);
	wd = ino < 0 ? -1 : inotify_add_watch(ino, DIR_, IN_CREATE);
	if (wd < 0 || send_fd(a[0], "ino", ino))
		zdtm_die("inotify");
	close(ino);

	/* fan */
	if (root) {
		int t = open(FAN, O_RDWR | O_CREAT, 0600);

		if (t < 0)
			zdtm_die("create " FAN);
		close(t);
		fan = fanotify_init(FAN_CLASS_NOTIF | FAN_NONBLOCK, O_RDONLY);
		if (fan < 0 || fanotify_mark(fan, FAN_MARK_ADD, FAN_OPEN, AT_FDCWD, FAN) ||
		    send_fd(a[0], "fan", fan))
			zdtm_die("fanotify");
		close(fan);
	}

	/* udp */
	u = socket(AF_INET, SOCK_DGRAM, 0);
	u2 = socket(AF_INET, SOCK_DGRAM, 0);
	if (u < 0 || u2 < 0 || bind(u, (struct sockaddr *)&ua, sizeof(ua)) ||
	    getsockname(u, (struct sockaddr *)&ua, &ul))
		zdtm_die("udp");
	udp_port = ntohs(ua.sin_port);
	if (sendto(u2, "dgram", 5, 0, (struct sockaddr *)&ua, sizeof(ua)) != 5)
		zdtm_die("udp send");
	/* Queued before it travels. */
	{
		char b[8];

		while (recv(u, b, sizeof(b), MSG_PEEK | MSG_DONTWAIT) != 5)
			zdtm_msleep(1);
	}
	if (send_fd(a[0], "udp", u))
		zdtm_die("send udp");
	close(u);

	/* tcp */
	lis = tcp_listener();
	c = tcp_connect(port_of(lis));
	s = accept(lis, NULL, NULL);
	if (s < 0 || write(c, "to-s", 4) != 4 || send_fd(a[0], "tcp", s))
		zdtm_die("tcp");
	close(s);

	/* lis */
	lis2 = tcp_listener();
	lis2_port = port_of(lis2);
	if (send_fd(a[0], "lis", lis2))
		zdtm_die("send lis");
	close(lis2);

	/* tty */
	mt = posix_openpt(O_RDWR | O_NOCTTY);
	if (mt < 0 || grantpt(mt) || unlockpt(mt))
		zdtm_die("posix_openpt");
	sl = open(ptsname(mt), O_RDWR | O_NOCTTY);
	{
		struct termios tio;

		/* No echo: the master reads only what the slave writes. */
		if (sl < 0 || tcgetattr(sl, &tio))
			zdtm_die("tcgetattr");
		tio.c_lflag &= ~ECHO;
		if (tcsetattr(sl, TCSANOW, &tio))
			zdtm_die("tcsetattr");
	}
	if (write(mt, "line\n", 5) != 5 || send_fd(a[0], "tty", sl))
		zdtm_die("tty");
	close(sl);

	/* file */
	f = open(DATA, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (f < 0 || write(f, "0123456789", 10) != 10 || lseek(f, 5, SEEK_SET) != 5 ||
	    send_fd(a[0], "file", f))
		zdtm_die("file");
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, q) || write(q[0], "q", 1) != 1 ||
	    send_fd(a[0], "pair", q[1]))
		zdtm_die("pair");
	close(a[0]);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	{
		int i = recv_fd(a[1], "ino", "inotify");
		char buf[sizeof(struct inotify_event) + NAME_MAX + 1];
		struct inotify_event *ev = (struct inotify_event *)buf;
		ssize_t r = -1;
		int64_t end = zdtm_now_ns() + 5000000000ll;
		int t;

		ZDTM_CORRUPT("inotify", inotify_rm_watch(i, wd));
		t = open(DIR_ "/new", O_CREAT | O_RDWR, 0600);
		while (i >= 0 && r < 0 && zdtm_now_ns() < end) {
			r = read(i, buf, sizeof(buf));
			if (r < 0)
				zdtm_msleep(5);
		}
		if (i >= 0)
			zdtm_check(r >= (ssize_t)sizeof(*ev) && ev->wd == wd &&
					   (ev->mask & IN_CREATE) && !strcmp(ev->name, "new"),
				   "inotify", "event of %zd bytes (wd %d, mask %#x), expected IN_CREATE "
				   "of \"new\" on wd %d", r, r > 0 ? ev->wd : -1,
				   r > 0 ? ev->mask : 0, wd);
		close(t);
		unlink(DIR_ "/new");
	}

	if (root) {
		int g = recv_fd(a[1], "fan", "fanotify");
		char buf[4096];
		struct fanotify_event_metadata *md = (struct fanotify_event_metadata *)buf;
		ssize_t r = -1;
		int64_t end = zdtm_now_ns() + 5000000000ll;
		int t;

		ZDTM_CORRUPT("fanotify", fanotify_mark(g, FAN_MARK_REMOVE, FAN_OPEN, AT_FDCWD, FAN));
		t = open(FAN, O_RDONLY);
		while (g >= 0 && r < 0 && zdtm_now_ns() < end) {
			r = read(g, buf, sizeof(buf));
			if (r < 0)
				zdtm_msleep(5);
		}
		if (g >= 0)
			zdtm_check(r >= (ssize_t)sizeof(*md) && (md->mask & FAN_OPEN), "fanotify",
				   "read %zd bytes (mask %#llx), expected a FAN_OPEN event", r,
				   r > 0 ? (unsigned long long)md->mask : 0ull);
		if (t >= 0)
			close(t);
	}

	{
		int v = recv_fd(a[1], "udp", "udp");

		ZDTM_CORRUPT("udp", {
			char b[8];

			recv(v, b, sizeof(b), MSG_DONTWAIT);
		});
		if (v >= 0) {
			zdtm_check(port_of(v) == udp_port, "udp", "bound to port %d, expected %d",
				   port_of(v), udp_port);
			zdtm_check(read_is(v, "dgram"), "udp", "the queued datagram did not arrive");
			zdtm_check(sendto(u2, "again", 5, 0, (struct sockaddr *)&ua, sizeof(ua)) == 5 &&
					   read_is(v, "again"),
				   "udp", "a datagram sent after the restore did not arrive");
		}
	}

	{
		int t = recv_fd(a[1], "tcp", "tcp");

		ZDTM_CORRUPT("tcp", {
			char b[8];

			recv(t, b, 2, MSG_DONTWAIT);
		});
		if (t >= 0) {
			zdtm_check(read_is(t, "to-s"), "tcp", "the queued bytes did not arrive");
			zdtm_check(write(c, "more", 4) == 4 && read_is(t, "more"), "tcp",
				   "client to server after the restore");
			zdtm_check(write(t, "back", 4) == 4 && read_is(c, "back"), "tcp",
				   "server to client after the restore");
		}
	}

	{
		int l = recv_fd(a[1], "lis", "listen"), n = -1;

		ZDTM_CORRUPT("listen", close(l), l = tcp_listener());
		if (l >= 0) {
			struct sockaddr_in peer, mine;
			socklen_t pl = sizeof(peer), ml = sizeof(mine);
			int64_t end = zdtm_now_ns() + 5000000000ll;

			zdtm_check(port_of(l) == lis2_port, "listen", "listening on port %d, expected %d",
				   port_of(l), lis2_port);
			fcntl(l, F_SETFL, O_NONBLOCK);
			k = port_of(l) == lis2_port ? tcp_connect(lis2_port) : -1;
			while (k >= 0 && (n = accept(l, (struct sockaddr *)&peer, &pl)) < 0 &&
			       zdtm_now_ns() < end)
				zdtm_msleep(5);
			if (zdtm_check(n >= 0 && k >= 0, "listen", "no connection to accept")) {
				getsockname(k, (struct sockaddr *)&mine, &ml);
				zdtm_check(peer.sin_port == mine.sin_port, "listen",
					   "accepted a connection from port %d, expected k's %d",
					   ntohs(peer.sin_port), ntohs(mine.sin_port));
				zdtm_check(write(k, "hi", 2) == 2 && read_is(n, "hi"), "listen",
					   "bytes over the accepted connection");
			}
		}
	}

	{
		int t = recv_fd(a[1], "tty", "tty");

		ZDTM_CORRUPT("tty", tcflush(t, TCIFLUSH));
		if (t >= 0) {
			fcntl(t, F_SETFL, O_NONBLOCK);
			fcntl(mt, F_SETFL, O_NONBLOCK);
			zdtm_check(read_is(t, "line\n"), "tty", "the slave did not read the typed line");
			zdtm_check(write(t, "out", 3) == 3 && read_is(mt, "out"), "tty",
				   "the master did not read what the slave wrote");
		}
	}

	{
		int g = recv_fd(a[1], "file", "file");

		ZDTM_CORRUPT("file", lseek(f, 0, SEEK_SET), close(f), f = open(DATA, O_RDWR));
		if (g >= 0) {
			zdtm_check(syscall(SYS_kcmp, getpid(), getpid(), 0 /* KCMP_FILE */, f, g) == 0,
				   "file", "the file in flight and the kept fd are two open files");
			zdtm_check(lseek(f, 0, SEEK_CUR) == 5, "file", "offset %ld, expected 5",
				   (long)lseek(f, 0, SEEK_CUR));
			lseek(g, 2, SEEK_SET);
			zdtm_check(lseek(f, 0, SEEK_CUR) == 2, "file",
				   "a seek on the fd in flight did not move the kept one");
		}
	}
	{
		int r = recv_fd(a[1], "pair", "pair");

		ZDTM_CORRUPT("pair", close(q[1]), socketpair(AF_UNIX, SOCK_STREAM, 0, q));
		if (r >= 0) {
			zdtm_check(syscall(SYS_kcmp, getpid(), getpid(), 0 /* KCMP_FILE */, q[1], r) == 0,
				   "pair", "the socket in flight and the kept q1 are two open files");
			zdtm_check(read_is(r, "q"), "pair", "the queued byte did not arrive");
			zdtm_check(write(q[0], "more", 4) == 4 && read_is(r, "more"), "pair",
				   "q0 to the socket in flight");
		}
	}
	zdtm_finish();
}
