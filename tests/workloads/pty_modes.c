/*
 * pty_modes.c - pseudo-terminals in the modes a dump used to refuse: a
 * packet-mode control status not read yet, EXTPROC, another line
 * discipline (N_NULL).
 *
 *   pty_modes PIDFILE
 *
 * Needs root (stasis puts queued bytes back with TIOCSTI). Every pair is
 * held by the root, master and slave (both O_NONBLOCK). Set up before
 * "ready":
 *   F  packet mode, the default termios (IXON with ^S/^Q); then, in this
 *      order: the slave's input flushed (TIOCPKT_FLUSHREAD), its output
 *      flushed (TIOCPKT_FLUSHWRITE), VSTOP disabled and set back
 *      (TIOCPKT_NOSTOP, then DOSTOP), "queued\n" written to the master
 *      (its echo, "queued\r\n", waited for), output stopped with TCOOFF
 *      (TIOCPKT_STOP). Status pending: 0x27.
 *   G  packet mode, default termios; ^S written to the master: output
 *      stopped by the STOP character (TIOCPKT_STOP pending).
 *   E  EXTPROC and ICANON, packet mode turned on, then the same termios
 *      set again (TIOCPKT_IOCTL pending); "abc\ndef" written to the master
 *      (taken as it comes: no echo, no lines), "xyz" to the slave.
 *   N  the slave's line discipline set to N_NULL (TIOCSETD).
 * After SIGTERM (tags in brackets):
 *   [pkt-status]  F's master reads the status 0x27 alone, then the echo as
 *                 data; G's reads 0x04; E's 0x40 (TIOCPKT_IOCTL), then "xyz";
 *   [pkt-flow]    F's and G's slaves are stopped (not writable); TCOON
 *                 restarts F (the master then reads TIOCPKT_START), ^S's
 *                 counterpart ^Q written to G's master restarts G (so G
 *                 was stopped by the character, not by TCOOFF);
 *   [pty-input]   F's slave reads "queued\n"; E's reads "abc\ndef" in one
 *                 read (EXTPROC: no line structure);
 *   [extproc]     E's termios has EXTPROC and ICANON;
 *   [ldisc]       N's slave has line discipline 27 (TIOCGETD), its master
 *                 N_TTY.
 */
#include "zdtm.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>

#ifndef N_NULL
#define N_NULL 27
#endif

struct pair {
	int m, s;
};

static struct pair new_pair(void)
{
	struct pair p;

	p.m = posix_openpt(O_RDWR | O_NOCTTY | O_NONBLOCK);
	if (p.m < 0 || grantpt(p.m) || unlockpt(p.m))
		zdtm_die("/dev/ptmx");
	p.s = open(ptsname(p.m), O_RDWR | O_NOCTTY | O_NONBLOCK);
	if (p.s < 0)
		zdtm_die("opening a slave");
	return p;
}

static void packet_on(int m)
{
	int one = 1;

	if (ioctl(m, TIOCPKT, &one))
		zdtm_die("TIOCPKT");
}

static short poll_of(int fd, short events)
{
	struct pollfd p = { .fd = fd, .events = events };

	return poll(&p, 1, 0) == 1 ? p.revents : 0;
}

/* Waits (up to 5 s) until FIONREAD on fd says `n` bytes. */
static void wait_queued(int fd, int n, const char *what)
{
	int q = -1;

	for (int i = 0; i < 500; i++) {
		if (ioctl(fd, FIONREAD, &q) == 0 && q == n)
			return;
		zdtm_msleep(10);
	}
	zdtm_die("%s: %d bytes queued, want %d", what, q, n);
}

static void put(int fd, const char *s)
{
	if (write(fd, s, strlen(s)) != (ssize_t)strlen(s))
		zdtm_die("write %s", s);
}

/* A read of the master: the first byte (the status, or TIOCPKT_DATA) and
 * the data after it. */
static ssize_t read_pkt(int m, unsigned char *st, char *data, size_t size)
{
	char buf[256];
	ssize_t n = read(m, buf, sizeof(buf));

	if (n <= 0)
		return -1;
	*st = (unsigned char)buf[0];
	if ((size_t)(n - 1) >= size)
		n = (ssize_t)size;
	memcpy(data, buf + 1, (size_t)(n - 1));
	data[n - 1] = 0;
	return n - 1;
}

static void check_status(int m, unsigned want, const char *what)
{
	unsigned char st = 0xff;
	char data[256];
	ssize_t n;

	zdtm_check(poll_of(m, POLLPRI) & POLLPRI, "pkt-status", "%s: no status pending",
		   what);
	n = read_pkt(m, &st, data, sizeof(data));
	zdtm_check(n == 0 && st == want, "pkt-status",
		   "%s: read %zd data bytes after status %#x, want the status %#x alone", what, n, st,
		   want);
}

int main(int argc, char **argv)
{
	struct pair f, g, e, n;
	struct termios t, t2;
	unsigned char st;
	char data[256];
	ssize_t k;
	int disc;
	unsigned want_f = TIOCPKT_FLUSHREAD | TIOCPKT_FLUSHWRITE | TIOCPKT_DOSTOP | TIOCPKT_STOP;

	zdtm_init(argc, argv, 0, "");

	/* F */
	f = new_pair();
	packet_on(f.m);
	if (tcflush(f.s, TCIFLUSH) || tcflush(f.s, TCOFLUSH))
		zdtm_die("tcflush");
	if (tcgetattr(f.s, &t))
		zdtm_die("tcgetattr");
	t2 = t;
	t2.c_cc[VSTOP] = 0;
	if (tcsetattr(f.s, TCSANOW, &t2) || tcsetattr(f.s, TCSANOW, &t))
		zdtm_die("tcsetattr");
	put(f.m, "queued\n");
	wait_queued(f.s, 7, "F's slave");
	wait_queued(f.m, 8, "F's master");
	if (tcflow(f.s, TCOOFF))
		zdtm_die("TCOOFF");

	/* G */
	g = new_pair();
	packet_on(g.m);
	put(g.m, "\023");
	for (int i = 0; i < 500 && (poll_of(g.s, POLLOUT) & POLLOUT); i++)
		zdtm_msleep(10);

	/* E */
	e = new_pair();
	if (tcgetattr(e.s, &t))
		zdtm_die("tcgetattr");
	t.c_lflag |= EXTPROC;
	if (tcsetattr(e.s, TCSANOW, &t))
		zdtm_die("tcsetattr EXTPROC");
	packet_on(e.m);
	if (tcsetattr(e.s, TCSANOW, &t))
		zdtm_die("tcsetattr EXTPROC again");
	put(e.m, "abc\ndef");
	put(e.s, "xyz");
	wait_queued(e.s, 7, "E's slave");
	wait_queued(e.m, 3, "E's master");

	/* N */
	n = new_pair();
	disc = N_NULL;
	if (ioctl(n.s, TIOCSETD, &disc))
		zdtm_die("TIOCSETD N_NULL");

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);

	ZDTM_CORRUPT("pkt-status", want_f ^= TIOCPKT_FLUSHWRITE);
	ZDTM_CORRUPT("pkt-flow", tcflow(f.s, TCOON));
	ZDTM_CORRUPT("pty-input", put(e.m, "!"));
	ZDTM_CORRUPT("extproc", {
		tcgetattr(e.s, &t);
		t.c_lflag &= ~(tcflag_t)EXTPROC;
		tcsetattr(e.s, TCSANOW, &t);
	});
	ZDTM_CORRUPT("ldisc", {
		disc = N_TTY;
		ioctl(n.s, TIOCSETD, &disc);
	});

	/* [pkt-status], [pkt-flow], [pty-input]: F */
	zdtm_check(!(poll_of(f.s, POLLOUT) & POLLOUT), "pkt-flow", "F's slave is not stopped");
	check_status(f.m, want_f, "F");
	k = read_pkt(f.m, &st, data, sizeof(data));
	zdtm_check(k == 8 && st == TIOCPKT_DATA && !strcmp(data, "queued\r\n"), "pkt-status",
		   "F's master: %zd bytes after %#x: \"%s\"", k, st, k > 0 ? data : "");
	k = read(f.s, data, sizeof(data) - 1);
	zdtm_check(k == 7 && !memcmp(data, "queued\n", 7), "pty-input", "F's slave read %zd bytes",
		   k);
	zdtm_check(tcflow(f.s, TCOON) == 0 && (poll_of(f.s, POLLOUT) & POLLOUT), "pkt-flow",
		   "F: TCOON does not restart it");
	check_status(f.m, TIOCPKT_START, "F after TCOON");

	/* G */
	zdtm_check(!(poll_of(g.s, POLLOUT) & POLLOUT), "pkt-flow", "G's slave is not stopped");
	check_status(g.m, TIOCPKT_STOP, "G");
	put(g.m, "\021");
	for (int i = 0; i < 500 && !(poll_of(g.s, POLLOUT) & POLLOUT); i++)
		zdtm_msleep(10);
	zdtm_check(poll_of(g.s, POLLOUT) & POLLOUT, "pkt-flow", "G: ^Q does not restart it");

	/* E */
	zdtm_check(tcgetattr(e.s, &t) == 0 && (t.c_lflag & (EXTPROC | ICANON)) == (EXTPROC | ICANON),
		   "extproc", "E's lflag %#x", (unsigned)t.c_lflag);
	check_status(e.m, TIOCPKT_IOCTL, "E");
	k = read_pkt(e.m, &st, data, sizeof(data));
	zdtm_check(k == 3 && st == TIOCPKT_DATA && !strcmp(data, "xyz"), "pkt-status",
		   "E's master: %zd bytes after %#x", k, st);
	k = read(e.s, data, sizeof(data) - 1);
	zdtm_check(k == 7 && !memcmp(data, "abc\ndef", 7), "pty-input",
		   "E's slave read %zd bytes", k);

	/* N */
	disc = -1;
	zdtm_check(ioctl(n.s, TIOCGETD, &disc) == 0 && disc == N_NULL, "ldisc",
		   "N's slave has line discipline %d", disc);
	disc = -1;
	zdtm_check(ioctl(n.m, TIOCGETD, &disc) == 0 && disc == N_TTY, "ldisc",
		   "N's master has line discipline %d", disc);
	zdtm_finish();
	return 0;
}
