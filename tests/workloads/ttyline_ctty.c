/*
 * ttyline_ctty.c - a session whose controlling terminal is a virtual
 * console (a program started on a text console, a getty's login shell),
 * with another process group in the foreground.
 *
 *   ttyline_ctty PIDFILE [VT [devtty]]     (default /dev/tty8)
 *
 * Set up before "ready": the root calls setsid() and opens VT O_RDWR
 * without O_NOCTTY: it becomes the session's controlling terminal (if the
 * line is another session's, the run dies: it is not this test's to
 * take). Its termios gets VMIN 5. It forks M, which leads a process group
 * of its own that the root makes the terminal's foreground group
 * (tcsetpgrp), and waits for SIGTERM (sigtimedwait; it leaves if its
 * parent changes).
 * After SIGTERM (root; tags in brackets):
 *   [session] the root leads its session, and M is in it, in its own group;
 *   [ctty]    /proc/self/stat's tty_nr is VT's device, in the root and in
 *             M; tcgetsid(VT) is the root; /dev/tty opens, on VT's device;
 *   [fg]      tcgetpgrp(VT) is M's group;
 *   [termios] VMIN is 5 on the line.
 * M checks [ctty] and [session] for itself and exits 0 (1 on a failure,
 * which the root reports).
 * With "devtty", the terminal is held only through /dev/tty (a program
 * that opened it by that name, as getty's children and editors do): the
 * root opens /dev/tty and closes its fd on VT (every check on VT is then
 * made through /dev/tty), M opens /dev/tty too and keeps it; both check
 *   [devtty]  the fd is /dev/tty itself (5:0), not the line, and reaches
 *             VT's device (TIOCGDEV).
 * At the end the root puts the line's termios back and its own group in
 * the foreground.
 * A VT that does not exist here (ENOENT, ENXIO, ENODEV at open) makes the
 * run fail: the test that runs it checks that one does first.
 */
#include "zdtm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <termios.h>

/* tty_nr (the 7th field of /proc/self/stat) as a device number. */
static dev_t ctty_of_self(void)
{
	char buf[1024], *p;
	unsigned long long nr = 0;
	int fd = open("/proc/self/stat", O_RDONLY), n;

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %*c %*d %*d %*d %llu", &nr) != 1)
		return 0;
	/* new_encode_dev */
	return makedev((nr & 0xfff00) >> 8, (nr & 0xff) | ((nr >> 12) & 0xfff00));
}

/* The terminal /dev/tty opens (TIOCGDEV: its inode is /dev/tty's, 5:0). */
static dev_t dev_tty_rdev(void)
{
	unsigned int nr = 0;
	int fd = open("/dev/tty", O_RDWR | O_NOCTTY);

	if (fd < 0)
		return 0;
	if (ioctl(fd, TIOCGDEV, &nr))
		nr = 0;
	close(fd);
	return makedev((nr & 0xfff00) >> 8, (nr & 0xff) | ((nr >> 12) & 0xfff00));
}

/* Whether fd is /dev/tty (5:0) reaching the terminal rdev. */
static int is_dev_tty_of(int fd, dev_t rdev)
{
	struct stat st;
	unsigned int nr = 0;

	if (fstat(fd, &st) || st.st_rdev != makedev(5, 0) || ioctl(fd, TIOCGDEV, &nr))
		return 0;
	return makedev((nr & 0xfff00) >> 8, (nr & 0xff) | ((nr >> 12) & 0xfff00)) == rdev;
}

/* M: check what it sees of the terminal (and its /dev/tty fd dt, when
 * not -1), exit 0 or 1. */
static int member_checks(pid_t leader, dev_t rdev, int dt)
{
	int ok = 1;

	if (dt >= 0 && !is_dev_tty_of(dt, rdev)) {
		zdtm_child_fail("M", "devtty", "fd %d is not /dev/tty on the line", dt);
		ok = 0;
	}

	if (getsid(0) != leader || getpgrp() != getpid()) {
		zdtm_child_fail("M", "session", "sid %d pgrp %d, expected %d %d", getsid(0),
				getpgrp(), leader, getpid());
		ok = 0;
	}
	if (ctty_of_self() != rdev || dev_tty_rdev() != rdev) {
		zdtm_child_fail("M", "ctty", "tty_nr %u:%u, /dev/tty %u:%u, expected %u:%u",
				major(ctty_of_self()), minor(ctty_of_self()), major(dev_tty_rdev()),
				minor(dev_tty_rdev()), major(rdev), minor(rdev));
		ok = 0;
	}
	return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
	const char *path = "/dev/tty8";
	struct termios orig, want, t;
	struct stat st;
	sigset_t set;
	pid_t root, m;
	int vt, status, devtty = 0, dt = -1;

	zdtm_init(argc, argv, 2, "[VT [devtty]]");
	if (argc > 2)
		path = argv[2];
	if (argc > 3) {
		if (strcmp(argv[3], "devtty"))
			zdtm_die("unknown mode %s", argv[3]);
		devtty = 1;
	}
	root = getpid();
	if (getsid(0) != root && setsid() < 0)
		zdtm_die("setsid: %s", strerror(errno));
	vt = open(path, O_RDWR);
	if (vt < 0)
		zdtm_die("open %s: %s", path, strerror(errno));
	if (fstat(vt, &st) || !S_ISCHR(st.st_mode))
		zdtm_die("%s is not a character device", path);
	if (ctty_of_self() != st.st_rdev)
		zdtm_die("%s did not become the controlling terminal (another session's?)", path);
	if (tcgetattr(vt, &orig))
		zdtm_die("tcgetattr %s: %s", path, strerror(errno));
	want = orig;
	want.c_cc[VMIN] = 5;
	if (tcsetattr(vt, TCSANOW, &want))
		zdtm_die("tcsetattr %s: %s", path, strerror(errno));
	if (devtty) {
		/* From here on the line is reached only through /dev/tty. */
		dt = open("/dev/tty", O_RDWR);
		if (dt < 0)
			zdtm_die("open /dev/tty: %s", strerror(errno));
		close(vt);
		vt = dt;
	}

	/* The root is in the background once M's group is in the foreground:
	 * its tcsetpgrp at the end must not stop it. */
	signal(SIGTTOU, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigprocmask(SIG_BLOCK, &set, NULL);
	m = fork();
	if (m < 0)
		zdtm_die("fork: %s", strerror(errno));
	if (m == 0) {
		struct timespec ts = { 0, 200 * 1000 * 1000 };
		int mdt = -1;

		setpgid(0, 0);
		if (devtty) {
			close(dt);
			mdt = open("/dev/tty", O_RDWR);
			if (mdt < 0)
				_exit(3);
		}
		while (sigtimedwait(&set, NULL, &ts) < 0)
			if (getppid() != root)
				_exit(2);
		_exit(member_checks(root, st.st_rdev, mdt));
	}
	if (setpgid(m, m) && errno != EACCES)
		zdtm_die("setpgid: %s", strerror(errno));
	if (tcsetpgrp(vt, m))
		zdtm_die("tcsetpgrp: %s", strerror(errno));
	sigprocmask(SIG_UNBLOCK, &set, NULL);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);

	/* A session leader giving its terminal up (the "ctty" corruption)
	 * hangs up the foreground group. */
	signal(SIGHUP, SIG_IGN);
	ZDTM_CORRUPT("fg", tcsetpgrp(vt, getpgrp()));
	ZDTM_CORRUPT("termios", {
		t = want;
		t.c_cc[VMIN] = 7;
		tcsetattr(vt, TCSANOW, &t);
	});
	if (devtty)
		ZDTM_CORRUPT("devtty", {
			int l = open(path, O_RDWR | O_NOCTTY);

			dup2(l, dt);
			close(l);
		});
	ZDTM_CORRUPT("ctty", ioctl(vt, TIOCNOTTY));

	if (devtty)
		zdtm_check(is_dev_tty_of(dt, st.st_rdev), "devtty",
			   "root: fd %d is not /dev/tty on the line", dt);

	zdtm_check(getsid(0) == root, "session", "root: sid %d, expected %d", getsid(0), root);
	zdtm_check(ctty_of_self() == st.st_rdev && dev_tty_rdev() == st.st_rdev, "ctty",
		   "root: tty_nr %u:%u, /dev/tty %u:%u, expected %u:%u", major(ctty_of_self()),
		   minor(ctty_of_self()), major(dev_tty_rdev()), minor(dev_tty_rdev()),
		   major(st.st_rdev), minor(st.st_rdev));
	zdtm_check(tcgetsid(vt) == root, "ctty", "tcgetsid %d, expected %d", tcgetsid(vt), root);
	zdtm_check(tcgetpgrp(vt) == m, "fg", "foreground group %d, expected %d", tcgetpgrp(vt), m);
	if (zdtm_check(tcgetattr(vt, &t) == 0, "termios", "tcgetattr: %s", strerror(errno)))
		zdtm_check(t.c_cc[VMIN] == 5, "termios", "VMIN %d, expected 5", t.c_cc[VMIN]);
	kill(m, SIGTERM);
	if (zdtm_check(waitpid(m, &status, 0) == m, "session", "waitpid M: %s", strerror(errno)))
		zdtm_check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "ctty",
			   "M saw its terminal wrong (status %#x)", status);
	/* The foreground group back to the root's and the termios back (the
	 * kernel takes the terminal back when the root exits). */
	tcsetpgrp(vt, getpgrp());
	tcsetattr(vt, TCSANOW, &orig);
	zdtm_finish();
	return 0;
}
