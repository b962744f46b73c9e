/*
 * unix_pending.c - unix sockets whose peers or names are not plain:
 * connections waiting to be accepted, names in a directory removed since,
 * datagram sockets many connected to one whose name was unlinked and taken
 * by a FIFO, a datagram socket connected to itself (zdtm's sockets00,
 * sk-unix01, sk-unix-dgram-ghost, fifo_upon_unix_socket00, sockets_dgram).
 *
 *   unix_pending PIDFILE
 *
 * Set up before "ready" (in the cwd):
 *   L   SOCK_STREAM listener (non-blocking) on unix_pending.d/l.sock; C1
 *       connected and accepted (A1); C2 connected, not accepted. Then the
 *       socket file unlinked and unix_pending.d removed
 *   LS  SOCK_SEQPACKET listener (non-blocking) on unix_pending.seq, C3
 *       connected, not accepted
 *   G   SOCK_DGRAM socket bound to unix_pending.g, G1 and G2 connected to
 *       it; then unix_pending.g unlinked and a FIFO made there, open
 *       read-write as F
 *   S   SOCK_DGRAM socket bound to unix_pending.self and connected to
 *       itself, "self" queued
 * After SIGTERM:
 *   `pending` one connection waits on L: accepted, a byte goes from C2 to
 *             it and back; then none (EAGAIN); the same for LS and C3 (one
 *             record each way); a byte goes from C1 to A1
 *   `names`   L is still named unix_pending.d/l.sock and that directory
 *             does not exist
 *   `dgram`   G1 and G2 send "1" and "2", G reads them in order; G is
 *             named unix_pending.g, which is a FIFO, and a byte goes
 *             through F
 *   `self`    S reads "self", then what it sends to itself
 */
#include "zdtm.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#define DIR "unix_pending.d"
#define LNAME DIR "/l.sock"
#define SEQNAME "unix_pending.seq"
#define GNAME "unix_pending.g"
#define SNAME "unix_pending.self"

static struct sockaddr_un addr(const char *name)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };

	strcpy(a.sun_path, name);
	return a;
}

static int bound(int type, const char *name)
{
	struct sockaddr_un a = addr(name);
	int s = socket(AF_UNIX, type, 0);

	unlink(name);
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)))
		zdtm_die("bind %s", name);
	return s;
}

static int connected(int type, const char *name)
{
	struct sockaddr_un a = addr(name);
	int s = socket(AF_UNIX, type, 0);

	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)))
		zdtm_die("connect %s", name);
	return s;
}

static int through(int from, int to, const char *what)
{
	char y[16] = { 0 };

	return write(from, what, strlen(what)) == (ssize_t)strlen(what) &&
	       read(to, y, sizeof(y) - 1) == (ssize_t)strlen(what) &&
	       !strcmp(y, what);
}

static int named(int s, const char *name)
{
	struct sockaddr_un a;
	socklen_t len = sizeof(a);

	return getsockname(s, (struct sockaddr *)&a, &len) == 0 &&
	       !strcmp(a.sun_path, name);
}

static void check_pending(const char *what, int l, int c)
{
	int a = accept(l, NULL, NULL);

	if (!zdtm_check(a >= 0, "pending", "%s: no connection waits (%s)", what,
			strerror(errno)))
		return;
	zdtm_check(through(c, a, "p") && through(a, c, "q"), "pending",
		   "%s: bytes do not go through the waiting connection", what);
	close(a);
	a = accept(l, NULL, NULL);
	zdtm_check(a < 0 && errno == EAGAIN, "pending",
		   "%s: a second connection waits", what);
}

int main(int argc, char **argv)
{
	int l, c1, a1, c2, ls, c3, g, g1, g2, f, s;
	struct sockaddr_un sa;
	struct stat st;
	char buf[16] = { 0 };

	zdtm_init(argc, argv, 0, "");
	rmdir(DIR);
	if (mkdir(DIR, 0755))
		zdtm_die("mkdir");
	l = bound(SOCK_STREAM | SOCK_NONBLOCK, LNAME);
	ls = bound(SOCK_SEQPACKET | SOCK_NONBLOCK, SEQNAME);
	if (listen(l, 8) || listen(ls, 8))
		zdtm_die("listen");
	c1 = connected(SOCK_STREAM, LNAME);
	a1 = accept(l, NULL, NULL);
	c2 = connected(SOCK_STREAM, LNAME);
	c3 = connected(SOCK_SEQPACKET, SEQNAME);
	if (a1 < 0 || unlink(LNAME) || rmdir(DIR))
		zdtm_die("accept/unlink/rmdir");

	g = bound(SOCK_DGRAM, GNAME);
	g1 = connected(SOCK_DGRAM, GNAME);
	g2 = connected(SOCK_DGRAM, GNAME);
	if (unlink(GNAME) || mkfifo(GNAME, 0600))
		zdtm_die("fifo upon %s", GNAME);
	f = open(GNAME, O_RDWR);
	if (f < 0)
		zdtm_die("open fifo");

	s = bound(SOCK_DGRAM, SNAME);
	sa = addr(SNAME);
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) || send(s, "self", 4, 0) != 4)
		zdtm_die("self");

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("pending", close(accept(l, NULL, NULL)));
	ZDTM_CORRUPT("names", mkdir(DIR, 0755));
	ZDTM_CORRUPT("dgram", close(g1), g1 = socket(AF_UNIX, SOCK_DGRAM, 0));
	ZDTM_CORRUPT("self", recv(s, buf, sizeof(buf), 0));

	check_pending("L", l, c2);
	check_pending("LS", ls, c3);
	zdtm_check(through(c1, a1, "a"), "pending", "C1 and A1 are not connected");

	zdtm_check(named(l, LNAME), "names", "L lost its name");
	zdtm_check(access(DIR, F_OK) < 0 && errno == ENOENT, "names",
		   "%s exists again", DIR);

	zdtm_check(through(g1, g, "1") && through(g2, g, "2"), "dgram",
		   "G1, G2 do not reach G");
	zdtm_check(named(g, GNAME), "dgram", "G lost its name");
	zdtm_check(stat(GNAME, &st) == 0 && S_ISFIFO(st.st_mode), "dgram",
		   "%s is no longer a FIFO", GNAME);
	zdtm_check(through(f, f, "f"), "dgram", "the FIFO does not work");

	memset(buf, 0, sizeof(buf));
	zdtm_check(recv(s, buf, sizeof(buf), MSG_DONTWAIT) == 4 &&
			   !memcmp(buf, "self", 4),
		   "self", "S holds \"%s\", expected self", buf);
	zdtm_check(through(s, s, "again"), "self", "S does not reach itself");
	zdtm_finish();
}
