/*
 * pty.c - two pseudo-terminal pairs with bytes queued both ways, one of them
 * the controlling terminal of a child.
 *
 *   pty PIDFILE
 *
 * Set up before "ready":
 *   P1  canonical pair (the kernel's default termios: ICANON, ECHO, ECHOE,
 *       ISIG, ICRNL, OPOST|ONLCR..., plus VEOF = ^D), window 24x80 640x480.
 *       The root keeps only the master (O_RDWR|O_NONBLOCK).  Child C calls
 *       setsid(), opens the slave without O_NOCTTY (it becomes C's
 *       controlling terminal), makes it its stdin and stdout, writes
 *       "C says hello\n" and waits for SIGTERM (sigtimedwait, leaves if its
 *       parent changes).  The root then writes P1_INPUT to the master:
 *       "first line\n", "sec<DEL>cond<^D>" (an erase, an end-of-file
 *       line), "third\n", "partial li" (a line being typed).  Nothing is
 *       read: the slave's line discipline holds 3 lines and a partial one,
 *       the master holds C's output and the echo of the input.
 *   P2  raw pair (cfmakeraw), both ends in the root: master O_RDWR|
 *       O_NONBLOCK in packet mode (TIOCPKT), slave O_RDWR in exclusive mode
 *       (TIOCEXCL), window 40x132, then locked again (TIOCSPTLCK).  3000
 *       bytes of pattern(SEED_IN) written to the master (queued for the
 *       slave) and 2000 of pattern(SEED_OUT) to the slave (queued for the
 *       master), waited for with FIONREAD.  Its slave's node is given owner
 *       4242:4343 and mode 0600 (fchown, fchmod; zdtm's pty01).
 *   P3  child D calls setsid(), opens P3's slave (its controlling terminal)
 *       and closes it: it leads the terminal's session holding no fd of it
 *       (zdtm's tty00). C also opens /dev/tty at fd 20 (inherited by G).
 * The root waits in a nanosleep(100 ms) loop.
 *
 * After SIGTERM (root):
 *   p2-*  packet mode, exclusive mode, lock, termios (= cfmakeraw of a new
 *         pair's default), window size, pairing (the slave's rdev is the
 *         master's pts), the slave node's owner and mode, FIONREAD and exactly the queued bytes each way
 *         (each packet-mode read starts with TIOCPKT_DATA), then a fresh
 *         byte each way.
 *   p1-*  C's stdin is P1's slave (rdev); the master's flags.  It writes
 *         "ne\n" to the master and SIGTERMs C.  C checks: its session and
 *         controlling terminal (getsid, tcgetsid, tcgetpgrp, /dev/tty is
 *         its stdin), termios and window size, and reads exactly
 *         "first line\n", "second", "third\n", "partial line\n" (one read
 *         each, canonical), then nothing.  The root reaps C, then reads the
 *         master to the end: it must equal what a new pair in the same
 *         state gives for the same history (C's hello, the echo of the
 *         input and of "ne\n"): the echo is the kernel's to compute.
 *   c-devtty  C's fd 20 is still /dev/tty (link, rdev 5,0).
 *   p3-ctty  D's tty_nr is P3's slave; D exits 0 on SIGTERM.
 *   g-ctty   G (a member of C's session) has P1's slave as its terminal.
 *   g-devtty G's fd 20 (C's, inherited) is still /dev/tty.
 * Mismatches of C go to stderr; its exit status is a bit mask of tags.
 */
#include "zdtm.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <termios.h>

#define P2_IN      3000
#define P2_OUT     2000
#define SEED_IN    0x7074792d696e0000ull
#define SEED_OUT   0x7074792d6f757400ull
#define DEADLINE_MS 20000
#define WAIT_MS    (ZDTM_SELFTEST ? 1000 : 5000)
#define SETUP_FAIL 100

static const char P1_HELLO[] = "C says hello\n";
static const char P1_INPUT[] = "first line\nsec\177cond\004third\npartial li";
static const char P1_MORE[] = "ne\n";
static const char *const c_reads[] = {
	"first line\n", "second", "third\n", "partial line\n"
};

/* C's exit status bits */
#define C_INPUT    0x01
#define C_TERMIOS  0x02
#define C_WINSIZE  0x04
#define C_CTTY     0x08
#define C_INTERNAL 0x10
#define C_FG       0x20
#define C_DEVTTY   0x40
#define C_NBITS    7
static const char *const c_tags[C_NBITS] = {
	"c-input", "c-termios", "c-winsize", "c-ctty", "C-internal",
	"c-foreground", "c-devtty"
};
/* C's fd on /dev/tty (its controlling terminal, whatever that is) */
#define C_DEVTTY_FD 20

#define cfail(tag, ...) zdtm_child_fail("pty child C", tag, __VA_ARGS__)

static int m1 = -1, m2 = -1, s2 = -1, m3 = -1;

static int write_all(int fd, const void *p, size_t len)
{
	const uint8_t *b = p;

	while (len) {
		ssize_t n = write(fd, b, len);

		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			return -1;
		b += n;
		len -= n;
	}
	return 0;
}

static int nread(int fd)
{
	int n = -1;

	if (ioctl(fd, FIONREAD, &n))
		return -1;
	return n;
}

/* Waits (WAIT_MS) until FIONREAD of fd is at least want; returns it. */
static int wait_nread(int fd, int want)
{
	int64_t end = zdtm_now_ns() + (int64_t)WAIT_MS * 1000000;
	int n;

	while ((n = nread(fd)) >= 0 && n < want && zdtm_now_ns() < end)
		zdtm_msleep(2);
	return n;
}

/* Reads fd until EAGAIN, EIO (no slave left) or end of file. */
static ssize_t read_to_end(int fd, uint8_t *buf, size_t cap)
{
	size_t total = 0;

	for (;;) {
		ssize_t n = read(fd, buf + total, cap - total);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EIO))
			return (ssize_t)total;
		if (n <= 0)
			return n < 0 ? -1 : (ssize_t)total;
		total += n;
		if (total == cap)
			return (ssize_t)total;
	}
}

static void p1_termios(struct termios *t)
{
	t->c_cc[VEOF] = 4;
	t->c_cc[VERASE] = 0177;
}

static int open_pair(int mflags, int *slave)
{
	int m = posix_openpt(O_RDWR | O_NOCTTY | mflags);

	if (m < 0 || grantpt(m) || unlockpt(m))
		return -1;
	if (slave) {
		*slave = open(ptsname(m), O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (*slave < 0)
			return -1;
	}
	return m;
}

/* ------------------------------------------------------------------ */
/* child C                                                             */

static int c_check_state(void)
{
	struct termios t, want;
	struct winsize ws;
	int bits = 0, tty, ref, ref_s;

	if (getsid(0) != getpid() || tcgetsid(0) != getpid() ||
	    tcgetpgrp(0) != getpgrp()) {
		cfail("c-ctty", "sid %d tcgetsid %d tcgetpgrp %d, expected %d",
		      (int)getsid(0), (int)tcgetsid(0), (int)tcgetpgrp(0),
		      (int)getpid());
		bits |= C_CTTY;
	}
	/* tcgetsid(0) above answers only for the caller's own terminal */
	tty = open("/dev/tty", O_RDWR | O_CLOEXEC);
	if (tty < 0) {
		cfail("c-ctty", "open /dev/tty: errno %d", errno);
		bits |= C_CTTY;
	}
	if (tty >= 0)
		close(tty);
	{
		/* the fd C opened on /dev/tty is still /dev/tty, not its
		 * slave's node */
		char l[64] = { 0 };
		struct stat st;

		if (readlink("/proc/self/fd/20", l, sizeof(l) - 1) < 0 || strcmp(l, "/dev/tty") ||
		    fstat(C_DEVTTY_FD, &st) || st.st_rdev != makedev(5, 0)) {
			cfail("c-devtty", "fd %d is \"%s\", not /dev/tty", C_DEVTTY_FD, l);
			bits |= C_DEVTTY;
		}
	}
	/* the expected termios: a new pair's default, as set up */
	ref = open_pair(O_CLOEXEC, &ref_s);
	if (ref < 0 || tcgetattr(ref_s, &want) || tcgetattr(0, &t)) {
		cfail("C-internal", "reference pair: errno %d", errno);
		return bits | C_INTERNAL;
	}
	p1_termios(&want);
	if (t.c_iflag != want.c_iflag || t.c_oflag != want.c_oflag ||
	    t.c_cflag != want.c_cflag || t.c_lflag != want.c_lflag ||
	    memcmp(t.c_cc, want.c_cc, NCCS)) {
		cfail("c-termios", "iflag %#x oflag %#x cflag %#x lflag %#x, "
		      "expected %#x %#x %#x %#x (or c_cc differs)", t.c_iflag,
		      t.c_oflag, t.c_cflag, t.c_lflag, want.c_iflag,
		      want.c_oflag, want.c_cflag, want.c_lflag);
		bits |= C_TERMIOS;
	}
	close(ref);
	close(ref_s);
	if (ioctl(0, TIOCGWINSZ, &ws) || ws.ws_row != 24 || ws.ws_col != 80 ||
	    ws.ws_xpixel != 640 || ws.ws_ypixel != 480) {
		cfail("c-winsize", "%ux%u %ux%u, expected 24x80 640x480",
		      ws.ws_row, ws.ws_col, ws.ws_xpixel, ws.ws_ypixel);
		bits |= C_WINSIZE;
	}
	return bits;
}

static int c_check_input(void)
{
	char buf[4096];
	unsigned i;
	int bits = 0;

	for (i = 0; i <= sizeof(c_reads) / sizeof(c_reads[0]); i++) {
		struct pollfd p = { .fd = 0, .events = POLLIN };
		int last = i == sizeof(c_reads) / sizeof(c_reads[0]);
		int pr = poll(&p, 1, last ? 200 : WAIT_MS);
		ssize_t n;

		if (pr < 0 && errno == EINTR) {
			i--;
			continue;
		}
		if (last) {
			if (pr != 0) {
				cfail("c-input", "more input after the last line");
				bits |= C_INPUT;
			}
			break;
		}
		if (pr != 1) {
			cfail("c-input", "read %u: nothing within %d ms", i,
			      WAIT_MS);
			return bits | C_INPUT;
		}
		n = read(0, buf, sizeof(buf));
		if (n != (ssize_t)strlen(c_reads[i]) ||
		    memcmp(buf, c_reads[i], n)) {
			cfail("c-input", "read %u: %zd bytes \"%.*s\", expected "
			      "\"%s\"", i, n, n > 0 ? (int)n : 0, buf,
			      c_reads[i]);
			bits |= C_INPUT;
		}
	}
	return bits;
}

/* Waits for SIGTERM (blocked) or a new parent. */
static void wait_sigterm(pid_t parent)
{
	struct timespec tick = { 0, 100 * 1000000 };
	siginfo_t si;
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	for (;;) {
		if (sigtimedwait(&set, &si, &tick) == SIGTERM)
			return;
		if (getppid() != parent)
			_exit(SETUP_FAIL);
	}
}

/* G: C's child in a group of its own, the terminal's foreground group. */
__attribute__((noreturn))
static void run_g(pid_t parent)
{
	signal(SIGHUP, SIG_IGN); /* C's selftest gives up its terminal */
	setpgid(0, 0);
	wait_sigterm(parent);
	_exit(0);
}

/* C's foreground group is G's; then C takes the foreground back. */
static int c_check_foreground(pid_t g)
{
	int bits = 0, st;

	ZDTM_CORRUPT("c-foreground", tcsetpgrp(0, getpgrp()));
	if (tcgetpgrp(0) != g) {
		cfail("c-foreground", "tcgetpgrp %d, expected G's group %d",
		      (int)tcgetpgrp(0), (int)g);
		bits |= C_FG;
	}
	kill(g, SIGTERM);
	if (zdtm_wait_deadline(g, &st, DEADLINE_MS) || st != 0) {
		cfail("C-internal", "G: errno %d status %#x", errno, st);
		bits |= C_INTERNAL;
	}
	if (tcsetpgrp(0, getpgrp())) {
		cfail("c-foreground", "tcsetpgrp back to C: errno %d", errno);
		bits |= C_FG;
	}
	return bits;
}

__attribute__((noreturn))
static void run_c(int ready_w)
{
	sigset_t set;
	pid_t parent = getppid(), g;
	int fd, bits;
	char c = 'C';

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigprocmask(SIG_BLOCK, &set, NULL);
	if (setsid() < 0)
		_exit(SETUP_FAIL);
	fd = open(ptsname(m1), O_RDWR); /* becomes the controlling terminal */
	if (fd < 0 || dup2(fd, 0) < 0 || dup2(fd, 1) < 0 || close(fd))
		_exit(SETUP_FAIL);
	close(m1);
	close(m2);
	close(s2);
	close(m3);
	fd = open("/dev/tty", O_RDWR);
	if (fd < 0 || dup2(fd, C_DEVTTY_FD) < 0 || close(fd))
		_exit(SETUP_FAIL);
	if (write_all(1, P1_HELLO, strlen(P1_HELLO)))
		_exit(SETUP_FAIL);
	/* G leads the terminal's foreground group; C (in the background)
	 * ignores SIGTTOU to set it, and to take it back */
	signal(SIGTTOU, SIG_IGN);
	g = fork();
	if (g < 0)
		_exit(SETUP_FAIL);
	if (g == 0) {
		close(ready_w);
		run_g(getppid());
	}
	if ((setpgid(g, g) && errno != EACCES) || tcsetpgrp(0, g) ||
	    write(ready_w, &c, 1) != 1)
		_exit(SETUP_FAIL);
	close(ready_w);
	wait_sigterm(parent);
	bits = c_check_foreground(g);
	ZDTM_CORRUPT("c-termios", {
		struct termios t;
		tcgetattr(0, &t);
		t.c_lflag &= ~ECHOE;
		tcsetattr(0, TCSANOW, &t);
	});
	ZDTM_CORRUPT("c-winsize", {
		struct winsize w = { 25, 80, 640, 480 };
		signal(SIGWINCH, SIG_IGN);
		ioctl(0, TIOCSWINSZ, &w);
	});
	ZDTM_CORRUPT("c-input", {
		ioctl(0, TIOCSTI, "x");
		ioctl(0, TIOCSTI, "\n");
	});
	ZDTM_CORRUPT("c-devtty", dup2(0, C_DEVTTY_FD));
	ZDTM_CORRUPT("c-ctty", {
		signal(SIGHUP, SIG_IGN);
		signal(SIGCONT, SIG_IGN);
		ioctl(0, TIOCNOTTY);
	});
	bits |= c_check_state();
	bits |= c_check_input();
	_exit(bits);
}

/* ------------------------------------------------------------------ */
/* root                                                                */

static void check_int_ioctl(const char *tag, int fd, unsigned long req,
			    const char *what, int want)
{
	int v = -1;

	zdtm_check(ioctl(fd, req, &v) == 0 && v == want, tag,
		   "%s: %d, expected %d (errno %d)", what, v, want, errno);
}

static void check_p2(void)
{
	static uint8_t buf[8192], want[P2_OUT];
	struct termios t, raw;
	struct winsize ws;
	struct stat st;
	unsigned idx = 0;
	size_t got = 0;
	int ref, ref_s;
	ssize_t n;

	check_int_ioctl("p2-modes", m2, TIOCGPKT, "TIOCGPKT", 1);
	check_int_ioctl("p2-modes", s2, TIOCGEXCL, "slave TIOCGEXCL", 1);
	check_int_ioctl("p2-modes", m2, TIOCGEXCL, "master TIOCGEXCL", 0);
	check_int_ioctl("p2-lock", m2, TIOCGPTLCK, "TIOCGPTLCK", 1);
	zdtm_check((fcntl(m2, F_GETFL) & (O_ACCMODE | O_NONBLOCK)) ==
		   (O_RDWR | O_NONBLOCK) && (fcntl(s2, F_GETFL) &
		   (O_ACCMODE | O_NONBLOCK)) == O_RDWR, "p2-flags",
		   "F_GETFL master %#x slave %#x", fcntl(m2, F_GETFL),
		   fcntl(s2, F_GETFL));
	ref = open_pair(O_CLOEXEC, &ref_s);
	if (ref < 0 || tcgetattr(ref_s, &raw) || tcgetattr(s2, &t)) {
		zdtm_fail("p2-termios", "tcgetattr: errno %d", errno);
	} else {
		cfmakeraw(&raw);
		zdtm_check(t.c_iflag == raw.c_iflag && t.c_oflag == raw.c_oflag
			   && t.c_cflag == raw.c_cflag && t.c_lflag ==
			   raw.c_lflag && !memcmp(t.c_cc, raw.c_cc, NCCS),
			   "p2-termios", "lflag %#x iflag %#x, expected raw "
			   "%#x %#x", t.c_lflag, t.c_iflag, raw.c_lflag,
			   raw.c_iflag);
	}
	close(ref);
	close(ref_s);
	zdtm_check(ioctl(s2, TIOCGWINSZ, &ws) == 0 && ws.ws_row == 40 &&
		   ws.ws_col == 132, "p2-winsize", "%ux%u, expected 40x132",
		   ws.ws_row, ws.ws_col);
	zdtm_check(ioctl(m2, TIOCGPTN, &idx) == 0 && fstat(s2, &st) == 0 &&
		   (major(st.st_rdev) - 136u) * 256 + minor(st.st_rdev) == idx,
		   "p2-pair", "slave rdev %#lx is not pts %u",
		   (unsigned long)st.st_rdev, idx);
	zdtm_check(fstat(s2, &st) == 0 && st.st_uid == 4242 && st.st_gid == 4343 &&
		   (st.st_mode & 07777) == 0600, "p2-node",
		   "slave node %u:%u mode %o, expected 4242:4343 600",
		   (unsigned)st.st_uid, (unsigned)st.st_gid, (unsigned)(st.st_mode & 07777));
	/* the slave's input: exactly P2_IN bytes */
	zdtm_check(nread(s2) == P2_IN, "p2-slave-data", "slave FIONREAD %d, "
		   "expected %d", nread(s2), P2_IN);
	n = read(s2, buf, sizeof(buf));
	if (zdtm_check(n == P2_IN, "p2-slave-data", "read %zd, expected %d",
		       n, P2_IN))
		zdtm_verify_pattern("p2-slave-data", "slave input", buf, n,
				    SEED_IN);
	/* the master's input, by packets */
	while ((n = read(m2, buf, sizeof(buf))) > 0) {
		zdtm_check(buf[0] == TIOCPKT_DATA, "p2-master-data",
			   "packet status %#x", buf[0]);
		if (got + n - 1 > P2_OUT) {
			zdtm_fail("p2-master-data", "more than %d bytes", P2_OUT);
			break;
		}
		memcpy(want + got, buf + 1, n - 1);
		got += n - 1;
	}
	if (zdtm_check(got == P2_OUT, "p2-master-data", "%zu bytes, expected "
		       "%d", got, P2_OUT))
		zdtm_verify_pattern("p2-master-data", "master input", want, got,
				    SEED_OUT);
	/* still one pair */
	zdtm_check(write(m2, "z", 1) == 1 && wait_nread(s2, 1) == 1 &&
		   read(s2, buf, 4) == 1 && buf[0] == 'z', "p2-pair",
		   "a byte written to the master did not reach the slave");
}

/* What P1's master holds after its history, from a new pair in the same
 * state: C's hello, the echo of the input, of P1_MORE. */
static ssize_t p1_expected(uint8_t *buf, size_t cap)
{
	struct termios t;
	char tmp[4096];
	int s, m = open_pair(O_NONBLOCK | O_CLOEXEC, &s);
	ssize_t n;

	if (m < 0 || tcgetattr(s, &t) || fcntl(s, F_SETFL, O_NONBLOCK))
		return -1;
	p1_termios(&t);
	if (tcsetattr(s, TCSANOW, &t) ||
	    write_all(s, P1_HELLO, strlen(P1_HELLO)) ||
	    write_all(m, P1_INPUT, strlen(P1_INPUT)))
		return -1;
	/* reading the slave dry makes its line discipline take (and echo)
	 * everything written to the master */
	while (read(s, tmp, sizeof(tmp)) >= 0)
		;
	if (write_all(m, P1_MORE, strlen(P1_MORE)))
		return -1;
	while (read(s, tmp, sizeof(tmp)) >= 0)
		;
	n = read_to_end(m, buf, cap);
	close(s);
	close(m);
	return n;
}

/* Field 7 of /proc/PID/stat: its controlling terminal (0: none). */
static unsigned long long tty_nr_of(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long tty_nr = 0;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (zdtm_read_text(path, buf, sizeof(buf)) > 0 && (p = strrchr(buf, ')')))
		sscanf(p + 2, "%*c %*d %*d %*d %llu", &tty_nr);
	return tty_nr;
}

/* How tty_nr encodes device RDEV (the kernel's new_encode_dev). */
static unsigned long long encode_dev(dev_t rdev)
{
	unsigned long long ma = major(rdev), mi = minor(rdev);

	return (mi & 0xff) | (ma << 8) | ((mi & ~0xffull) << 12);
}

static void check_p1(pid_t c)
{
	static uint8_t got[4096], want[4096];
	char path[64];
	struct stat a, b;
	ssize_t n, w;
	int st, bit;

	snprintf(path, sizeof(path), "/proc/%d/fd/0", (int)c);
	zdtm_check(stat(path, &a) == 0 && stat(ptsname(m1), &b) == 0 &&
		   a.st_rdev == b.st_rdev, "p1-pair", "C's stdin is not the "
		   "slave of P1's master (%s)", ptsname(m1));
	zdtm_check((fcntl(m1, F_GETFL) & (O_ACCMODE | O_NONBLOCK)) ==
		   (O_RDWR | O_NONBLOCK), "p1-flags", "master F_GETFL %#x",
		   fcntl(m1, F_GETFL));
	{
		/* G, a member of C's session, has the terminal too */
		char cp[64], buf[64] = { 0 };
		unsigned long long want = encode_dev(b.st_rdev);
		pid_t g = 0;

		snprintf(cp, sizeof(cp), "/proc/%d/task/%d/children", (int)c, (int)c);
		if (zdtm_read_text(cp, buf, sizeof(buf)) > 0)
			g = atoi(buf);
		ZDTM_CORRUPT("g-ctty", want ^= 1);
		zdtm_check(g > 0 && tty_nr_of(g) == want, "g-ctty",
			   "G (pid %d) has tty_nr %#llx, expected %#llx (P1's slave)", (int)g,
			   g > 0 ? tty_nr_of(g) : 0, want);
	}
	{
		/* G's fd 20 (C's, inherited) is still /dev/tty, not the slave */
		char fdp[64], link[64] = { 0 }, cp[64], buf[64] = { 0 };
		const char *want_link = "/dev/tty";
		pid_t g = 0;

		snprintf(cp, sizeof(cp), "/proc/%d/task/%d/children", (int)c, (int)c);
		if (zdtm_read_text(cp, buf, sizeof(buf)) > 0)
			g = atoi(buf);
		snprintf(fdp, sizeof(fdp), "/proc/%d/fd/%d", (int)g, C_DEVTTY_FD);
		ZDTM_CORRUPT("g-devtty", want_link = "/dev/tty0");
		zdtm_check(g > 0 && readlink(fdp, link, sizeof(link) - 1) > 0 &&
				   !strcmp(link, want_link),
			   "g-devtty", "G (pid %d): fd %d is \"%s\", expected %s", (int)g,
			   C_DEVTTY_FD, link, want_link);
	}
	if (write_all(m1, P1_MORE, strlen(P1_MORE)))
		zdtm_fail("p1-master-data", "write: errno %d", errno);
	/* C corrupts its own state; the tags are recorded here */
	ZDTM_CORRUPT("c-devtty", );
	ZDTM_CORRUPT("c-termios", );
	ZDTM_CORRUPT("c-winsize", );
	ZDTM_CORRUPT("c-input", );
	ZDTM_CORRUPT("c-ctty", );
	ZDTM_CORRUPT("c-foreground", );
	kill(c, SIGTERM);
	if (zdtm_wait_deadline(c, &st, DEADLINE_MS)) {
		zdtm_fail("p1-child", "C did not end: errno %d", errno);
		kill(c, SIGKILL);
		waitpid(c, &st, 0);
	} else if (!WIFEXITED(st)) {
		zdtm_fail("p1-child", "C: wait status %#x", st);
	} else {
		for (bit = 0; bit < C_NBITS; bit++)
			if (WEXITSTATUS(st) & (1 << bit))
				zdtm_fail(c_tags[bit], "reported by C (stderr)");
		if (WEXITSTATUS(st) >= (1 << C_NBITS))
			zdtm_fail("p1-child", "C exit status %d",
				  WEXITSTATUS(st));
	}
	ZDTM_CORRUPT("p1-master-data", {
		char x;
		if (read(m1, &x, 1) != 1)
			zdtm_fail("p1-master-data", "selftest read");
	});
	n = read_to_end(m1, got, sizeof(got));
	w = p1_expected(want, sizeof(want));
	if (!zdtm_check(w > 0, "p1-internal", "reference pair: errno %d",
			errno))
		return;
	if (zdtm_check(n == w, "p1-master-data", "master holds %zd bytes, "
		       "expected %zd", n, w))
		zdtm_verify_mem("p1-master-data", "master input", got, want, n);
}

static void setup_p2(void)
{
	static uint8_t buf[P2_IN];
	struct termios t;
	struct winsize ws = { 40, 132, 0, 0 };
	int one = 1;

	m2 = open_pair(O_NONBLOCK | O_CLOEXEC, &s2);
	if (m2 < 0 || tcgetattr(s2, &t))
		zdtm_die("P2");
	cfmakeraw(&t);
	if (tcsetattr(s2, TCSANOW, &t) || ioctl(m2, TIOCSWINSZ, &ws) ||
	    ioctl(s2, TIOCEXCL) || ioctl(m2, TIOCPKT, &one) ||
	    ioctl(m2, TIOCSPTLCK, &one))
		zdtm_die("P2 modes");
	zdtm_fill(buf, P2_IN, SEED_IN);
	if (write_all(m2, buf, P2_IN))
		zdtm_die("P2 write to master");
	zdtm_fill(buf, P2_OUT, SEED_OUT);
	if (write_all(s2, buf, P2_OUT))
		zdtm_die("P2 write to slave");
	if (wait_nread(s2, P2_IN) != P2_IN || wait_nread(m2, P2_OUT) != P2_OUT)
		zdtm_die("P2 queues: %d and %d bytes", nread(s2), nread(m2));
}

/* D: leads a session whose controlling terminal is P3, and holds no fd
 * of it (zdtm's tty00): the restore must give it back all the same. */
__attribute__((noreturn))
static void run_d(int ready_w)
{
	pid_t parent = getppid();
	sigset_t set;
	char c = 'D';
	int fd;

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigprocmask(SIG_BLOCK, &set, NULL);
	if (setsid() < 0)
		_exit(SETUP_FAIL);
	fd = open(ptsname(m3), O_RDWR); /* becomes the controlling terminal */
	if (fd < 0 || close(fd))
		_exit(SETUP_FAIL);
	close(m1);
	close(m2);
	close(s2);
	close(m3);
	if (write(ready_w, &c, 1) != 1)
		_exit(SETUP_FAIL);
	close(ready_w);
	wait_sigterm(parent);
	_exit(0);
}

/* D's controlling terminal is P3's slave (its tty_nr); D exits 0. */
static void check_p3(pid_t d)
{
	unsigned int n = 0, index = 0;
	int st = 0;

	ZDTM_CORRUPT("p3-ctty", n = 1);
	if (ioctl(m3, TIOCGPTN, &index))
		zdtm_fail("p3-ctty", "TIOCGPTN: errno %d", errno);
	n += index;
	zdtm_check(tty_nr_of(d) == encode_dev(makedev(136 + n / 256, n % 256)), "p3-ctty",
		   "D's tty_nr is %#llx, expected pts %u", tty_nr_of(d), n);
	kill(d, SIGTERM);
	if (zdtm_wait_deadline(d, &st, DEADLINE_MS) || !WIFEXITED(st) || WEXITSTATUS(st)) {
		zdtm_fail("p3-ctty", "D did not exit 0 (status %#x)", st);
		kill(d, SIGKILL);
	}
}

int main(int argc, char **argv)
{
	struct termios t;
	struct winsize ws = { 24, 80, 640, 480 };
	struct timespec nap = { 0, 100 * 1000000 };
	int readyp[2];
	pid_t c, d;
	char ch;

	zdtm_init(argc, argv, 0, NULL);
	/* The slave is first opened by C: the master sets the pair's termios. */
	m1 = open_pair(O_NONBLOCK | O_CLOEXEC, NULL);
	if (m1 < 0 || tcgetattr(m1, &t))
		zdtm_die("P1");
	p1_termios(&t);
	if (tcsetattr(m1, TCSANOW, &t) || ioctl(m1, TIOCSWINSZ, &ws))
		zdtm_die("P1 modes");
	setup_p2();
	if (fchown(s2, 4242, 4343) || fchmod(s2, 0600))
		zdtm_die("P2 slave owner");
	if (pipe2(readyp, O_CLOEXEC))
		zdtm_die("pipe");
	c = fork();
	if (c < 0)
		zdtm_die("fork");
	if (c == 0) {
		close(readyp[0]);
		run_c(readyp[1]);
	}
	m3 = open_pair(O_NONBLOCK | O_CLOEXEC, NULL);
	if (m3 < 0)
		zdtm_die("P3");
	d = fork();
	if (d < 0)
		zdtm_die("fork");
	if (d == 0) {
		close(readyp[0]);
		run_d(readyp[1]);
	}
	close(readyp[1]);
	if (read(readyp[0], &ch, 1) != 1 || read(readyp[0], &ch, 1) != 1)
		zdtm_die("child C or D did not start");
	close(readyp[0]);
	if (write_all(m1, P1_INPUT, strlen(P1_INPUT)))
		zdtm_die("P1 write");
	zdtm_ready();

	while (!zdtm_stop)
		nanosleep(&nap, NULL);

	ZDTM_CORRUPT("p2-modes", ioctl(m2, TIOCPKT, &(int){ 0 }));
	ZDTM_CORRUPT("p2-lock", ioctl(m2, TIOCSPTLCK, &(int){ 0 }));
	ZDTM_CORRUPT("p2-node", fchmod(s2, 0620));
	ZDTM_CORRUPT("p2-termios", {
		tcgetattr(s2, &t);
		t.c_lflag |= ECHO;
		tcsetattr(s2, TCSANOW, &t);
	});
	ZDTM_CORRUPT("p2-winsize", ioctl(m2, TIOCSWINSZ,
					 &(struct winsize){ 41, 132, 0, 0 }));
	ZDTM_CORRUPT("p2-slave-data", {
		uint8_t x;
		if (read(s2, &x, 1) != 1)
			zdtm_fail("p2-slave-data", "selftest read");
	});
	ZDTM_CORRUPT("p2-master-data", write_all(s2, "!", 1));
	check_p2();
	check_p1(c);
	check_p3(d);
	zdtm_finish();
}
