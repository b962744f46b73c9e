/*
 * pty_hungup.c - two slave fds of a pseudo-terminal whose master was
 * closed (zdtm's pty04): they must come back hung up, on one terminal.
 *
 *   pty_hungup PIDFILE
 *
 * Set up before "ready": /dev/ptmx opened, unlocked, its slave opened
 * twice (s1, s2), the master closed (SIGHUP ignored meanwhile).
 * After SIGTERM (tags in brackets):
 *   [hungup] on each slave: write fails with EIO and read returns 0 (what
 *            a hung-up terminal does);
 *   [same]   both are the same pseudo-terminal slave (one device number,
 *            a /dev/pts one).
 */
#include "zdtm.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

/* A slave of a new pair, its master kept open (the selftest's decoy). */
static int live_slave(void)
{
	int m = posix_openpt(O_RDWR | O_NOCTTY);

	if (m < 0 || grantpt(m) || unlockpt(m))
		return -1;
	return open(ptsname(m), O_RDWR | O_NOCTTY);
}

static void check_hung_up(int fd, const char *name)
{
	char c;
	ssize_t n = write(fd, "x", 1);

	zdtm_check(n < 0 && errno == EIO, "hungup", "%s: write gave %zd (%s), want EIO", name, n,
		   n < 0 ? strerror(errno) : "written");
	/* (Not blocking: a terminal that is not hung up would wait.) */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	n = read(fd, &c, 1);
	zdtm_check(n == 0, "hungup", "%s: read gave %zd (%s), want 0", name, n,
		   n < 0 ? strerror(errno) : "data");
}

int main(int argc, char **argv)
{
	struct stat a, b;
	int m, s1, s2;

	zdtm_init(argc, argv, 0, "");
	signal(SIGHUP, SIG_IGN);
	m = posix_openpt(O_RDWR | O_NOCTTY);
	if (m < 0 || grantpt(m) || unlockpt(m))
		zdtm_die("/dev/ptmx");
	s1 = open(ptsname(m), O_RDWR | O_NOCTTY);
	s2 = open(ptsname(m), O_RDWR | O_NOCTTY);
	if (s1 < 0 || s2 < 0)
		zdtm_die("opening the slave");
	close(m);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);

	ZDTM_CORRUPT("hungup", dup2(live_slave(), s1));
	ZDTM_CORRUPT("same", dup2(live_slave(), s2));
	check_hung_up(s1, "s1");
	check_hung_up(s2, "s2");
	if (zdtm_check(fstat(s1, &a) == 0 && fstat(s2, &b) == 0, "same", "fstat: %s",
		       strerror(errno)))
		zdtm_check(S_ISCHR(a.st_mode) && a.st_rdev == b.st_rdev && major(a.st_rdev) >= 136 &&
				   major(a.st_rdev) < 144,
			   "same", "s1 is %u:%u, s2 %u:%u", major(a.st_rdev), minor(a.st_rdev),
			   major(b.st_rdev), minor(b.st_rdev));
	zdtm_finish();
	return 0;
}
