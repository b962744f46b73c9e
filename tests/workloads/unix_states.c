/*
 * unix_states.c - unix sockets in the states zdtm's sk-unix-unconn and
 * sk-unix-rel leave them: never connected, and bound to a path whose file
 * belongs to another user.
 *
 *   unix_states PIDFILE
 *
 * Set up before "ready" (as root, in the cwd):
 *   U1  SOCK_STREAM, never connected nor bound
 *   U2  SOCK_SEQPACKET, never connected nor bound
 *   L   SOCK_STREAM listener on the relative path unix_states.sock, whose
 *       file is then given to uid 4242, gid 4343, mode 0640
 *   G   SOCK_STREAM listener on unix_states.gone, a client C connected and
 *       accepted (A), then the file unlinked (zdtm's deleted_unix_sock)
 * After SIGTERM:
 *   U1, U2  still of their type (SO_TYPE), unconnected (getpeername fails
 *           with ENOTCONN), nothing to read (recv MSG_DONTWAIT fails), and
 *           each can still connect to L and exchange a byte (`unconnected`)
 *   L       the socket file's owner and mode as set (`owner`), and a new
 *           client connects, is accepted and its byte read (`listener`)
 *   G       unix_states.gone still absent, and a byte from C reaches A
 *           (`deleted`)
 */
#include "zdtm.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#define SOCK_PATH "unix_states.sock"
#define GONE_PATH "unix_states.gone"
#define UID 4242
#define GID 4343
#define MODE 0640

static struct sockaddr_un addr;

static int round_trip(const char *tag, const char *what, int listener, int c)
{
	char x = 'q', y = 0;
	int a;

	if (connect(c, (struct sockaddr *)&addr, sizeof(addr)))
		return zdtm_fail(tag, "%s: connect: %s", what, strerror(errno));
	a = accept(listener, NULL, NULL);
	if (a < 0)
		return zdtm_fail(tag, "%s: accept: %s", what, strerror(errno));
	if (write(c, &x, 1) != 1 || read(a, &y, 1) != 1 || y != x) {
		close(a);
		return zdtm_fail(tag, "%s: byte not through (got %#x)", what,
				 y);
	}
	close(a);
	return 1;
}

static void check_unconnected(const char *what, int s, int type)
{
	struct sockaddr_un peer;
	socklen_t len = sizeof(peer);
	int t = -1;
	char c;

	len = sizeof(t);
	zdtm_check(getsockopt(s, SOL_SOCKET, SO_TYPE, &t, &len) == 0 &&
			   t == type,
		   "unconnected", "%s: SO_TYPE %d, expected %d", what, t, type);
	len = sizeof(peer);
	zdtm_check(getpeername(s, (struct sockaddr *)&peer, &len) < 0 &&
			   errno == ENOTCONN,
		   "unconnected", "%s: getpeername did not fail with ENOTCONN",
		   what);
	zdtm_check(recv(s, &c, 1, MSG_DONTWAIT) < 0, "unconnected",
		   "%s: something to read", what);
}

int main(int argc, char **argv)
{
	int u1, u2, l, c, g, gc, ga;
	struct stat st;

	zdtm_init(argc, argv, 0, "");
	memset(&addr, 0, sizeof(addr));
	addr.sun_family = AF_UNIX;
	strcpy(addr.sun_path, SOCK_PATH);
	unlink(SOCK_PATH);

	u1 = socket(AF_UNIX, SOCK_STREAM, 0);
	u2 = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	l = socket(AF_UNIX, SOCK_STREAM, 0);
	if (u1 < 0 || u2 < 0 || l < 0)
		zdtm_die("socket");
	if (bind(l, (struct sockaddr *)&addr, sizeof(addr)) || listen(l, 4))
		zdtm_die("bind/listen %s", SOCK_PATH);
	if (chown(SOCK_PATH, UID, GID) || chmod(SOCK_PATH, MODE))
		zdtm_die("chown/chmod %s", SOCK_PATH);
	{
		struct sockaddr_un ga_addr = { .sun_family = AF_UNIX };

		strcpy(ga_addr.sun_path, GONE_PATH);
		unlink(GONE_PATH);
		g = socket(AF_UNIX, SOCK_STREAM, 0);
		gc = socket(AF_UNIX, SOCK_STREAM, 0);
		if (g < 0 || gc < 0 ||
		    bind(g, (struct sockaddr *)&ga_addr, sizeof(ga_addr)) ||
		    listen(g, 4) ||
		    connect(gc, (struct sockaddr *)&ga_addr, sizeof(ga_addr)))
			zdtm_die("listener %s", GONE_PATH);
		ga = accept(g, NULL, NULL);
		if (ga < 0 || unlink(GONE_PATH))
			zdtm_die("accept/unlink %s", GONE_PATH);
	}

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("owner", chmod(SOCK_PATH, 0600));
	ZDTM_CORRUPT("deleted", close(open(GONE_PATH, O_CREAT | O_WRONLY, 0600)));
	ZDTM_CORRUPT("unconnected", {
		struct sockaddr_un a = { .sun_family = AF_UNIX };

		/* autobind: a name it did not have */
		bind(u1, (struct sockaddr *)&a, sizeof(sa_family_t));
		close(u2);
		u2 = socket(AF_UNIX, SOCK_STREAM, 0);
	});
	ZDTM_CORRUPT("listener", close(l), l = socket(AF_UNIX, SOCK_STREAM, 0));

	zdtm_check(stat(SOCK_PATH, &st) == 0 && S_ISSOCK(st.st_mode) &&
			   st.st_uid == UID && st.st_gid == GID &&
			   (st.st_mode & 07777) == MODE,
		   "owner", "%s: uid %u gid %u mode %o, expected %u %u %o",
		   SOCK_PATH, st.st_uid, st.st_gid, st.st_mode & 07777, UID,
		   GID, MODE);
	{
		char x = 'g', y = 0;

		zdtm_check(access(GONE_PATH, F_OK) < 0 && errno == ENOENT,
			   "deleted", "%s exists again", GONE_PATH);
		zdtm_check(write(gc, &x, 1) == 1 && read(ga, &y, 1) == 1 &&
				   y == x,
			   "deleted", "byte from C to A: got %#x", y);
	}
	check_unconnected("U1", u1, SOCK_STREAM);
	check_unconnected("U2", u2, SOCK_SEQPACKET);
	{
		struct sockaddr_un own;
		socklen_t len = sizeof(own);

		zdtm_check(getsockname(u1, (struct sockaddr *)&own, &len) == 0 &&
				   len == sizeof(sa_family_t),
			   "unconnected", "U1 has a name (length %u)", len);
	}

	c = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (round_trip("listener", "new client", l, c))
		(void)0;
	close(c);
	round_trip("unconnected", "U1", l, u1);
	zdtm_finish();
}
