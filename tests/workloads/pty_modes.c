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
 *   H  packet mode; IXON turned off (TIOCPKT_NOSTOP), output stopped and
 *      restarted with TCOOFF, TCOON (TIOCPKT_START). Status pending: 0x18.
 *   E  EXTPROC and ICANON, packet mode turned on, then the same termios
 *      set again (TIOCPKT_IOCTL pending); "abc\ndef" written to the master
 *      (taken as it comes: no echo, no lines), "xyz" to the slave.
 *   N  the slave's line discipline set to N_NULL (TIOCSETD).
 *   R  raw (cfmakeraw) with more queued each way than a line discipline
 *      holds (4095): 6000 bytes of pattern(SEED_RIN) written to the master,
 *      7000 of pattern(SEED_ROUT) to the slave (the rest waits in the
 *      kernel's flip buffers).
 * After SIGTERM (tags in brackets):
 *   [pkt-status]  F's master reads the status 0x27 alone, then the echo as
 *                 data; G's reads 0x04; H's 0x18 (and its slave is
 *                 writable); E's 0x40 (TIOCPKT_IOCTL), then "xyz";
 *   [pkt-flow]    F's and G's slaves are stopped (not writable); TCOON
 *                 restarts F (the master then reads TIOCPKT_START), ^S's
 *                 counterpart ^Q written to G's master restarts G (so G
 *                 was stopped by the character, not by TCOOFF);
 *   [pty-input]   F's slave reads "queued\n"; E's reads "abc\ndef" in one
 *                 read (EXTPROC: no line structure);
 *   [extproc]     E's termios has EXTPROC and ICANON;
 *   [ldisc]       N's slave has line discipline 27 (TIOCGETD), its master
 *                 N_TTY;
 *   [big-queue]   R's slave reads exactly its 6000 bytes and its master its
 *                 7000, in order, then nothing; a fresh byte each way.
 */
#include "zdtm.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>

#ifndef N_NULL
#define N_NULL 27
#endif

#define R_IN 6000
#define R_OUT 7000
#define SEED_RIN 0x7274792d696e0000ull
#define SEED_ROUT 0x7274792d6f750000ull

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

static size_t mismatch_at(const unsigned char *a, const unsigned char *b, size_t n)
{
	size_t i = 0;

	while (i < n && a[i] == b[i])
		i++;
	return i;
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

/* Everything fd reads until it has nothing (non-blocking), up to size. */
static size_t read_all(int fd, unsigned char *buf, size_t size)
{
	size_t got = 0;
	ssize_t k;

	while (got < size && (k = read(fd, buf + got, size - got)) > 0)
		got += (size_t)k;
	return got;
}

static void check_big(int fd, size_t want, uint64_t seed, const char *what)
{
	static unsigned char buf[3 * R_OUT], pat[R_OUT];
	size_t got = read_all(fd, buf, sizeof(buf));

	zdtm_fill(pat, want, seed);
	zdtm_check(got == want && !memcmp(buf, pat, want), "big-queue",
		   "%s: read %zu bytes, want %zu (first difference at %zd)", what, got, want,
		   got ? (ssize_t)(mismatch_at(buf, pat, got < want ? got : want)) : -1);
}

int main(int argc, char **argv)
{
	struct pair f, g, h, e, n, r;
	static unsigned char big[R_OUT];
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

	/* H */
	h = new_pair();
	packet_on(h.m);
	if (tcgetattr(h.s, &t))
		zdtm_die("tcgetattr");
	t.c_iflag &= ~(tcflag_t)IXON;
	if (tcsetattr(h.s, TCSANOW, &t) || tcflow(h.s, TCOOFF) || tcflow(h.s, TCOON))
		zdtm_die("H's flow");

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

	/* R */
	r = new_pair();
	if (tcgetattr(r.s, &t))
		zdtm_die("tcgetattr");
	cfmakeraw(&t);
	if (tcsetattr(r.s, TCSANOW, &t))
		zdtm_die("tcsetattr raw");
	zdtm_fill(big, R_IN, SEED_RIN);
	if (write(r.m, big, R_IN) != R_IN)
		zdtm_die("writing %d bytes to R's master", R_IN);
	zdtm_fill(big, R_OUT, SEED_ROUT);
	if (write(r.s, big, R_OUT) != R_OUT)
		zdtm_die("writing %d bytes to R's slave", R_OUT);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);

	ZDTM_CORRUPT("pkt-status", want_f ^= TIOCPKT_FLUSHWRITE);
	ZDTM_CORRUPT("pkt-flow", tcflow(f.s, TCOON));
	/* (A master's write reaches the slave through the kernel's flip
	 * buffer, pushed by a worker: waited for, as under load it can lag
	 * behind the read below.) */
	ZDTM_CORRUPT("pty-input", {
		int q = 0;

		put(e.m, "!");
		for (int i = 0; i < 500 && !(ioctl(e.s, FIONREAD, &q) == 0 && q >= 8); i++)
			zdtm_msleep(10);
	});
	ZDTM_CORRUPT("extproc", {
		tcgetattr(e.s, &t);
		t.c_lflag &= ~(tcflag_t)EXTPROC;
		tcsetattr(e.s, TCSANOW, &t);
	});
	ZDTM_CORRUPT("big-queue", put(r.m, "!"));
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

	/* H */
	check_status(h.m, TIOCPKT_NOSTOP | TIOCPKT_START, "H");
	zdtm_check(poll_of(h.s, POLLOUT) & POLLOUT, "pkt-flow", "H's slave is stopped");

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

	/* R */
	check_big(r.s, R_IN, SEED_RIN, "R's slave");
	check_big(r.m, R_OUT, SEED_ROUT, "R's master");
	zdtm_check(write(r.m, "a", 1) == 1 && write(r.s, "b", 1) == 1, "big-queue",
		   "R: a fresh byte each way: %s", strerror(errno));
	/* (A non-blocking read waits for bytes on their way to the line
	 * discipline: n_tty_read flushes the flip buffer work first.) */
	k = read(r.s, data, sizeof(data));
	zdtm_check(k == 1 && data[0] == 'a', "big-queue", "R's slave: fresh read %zd", k);
	k = read(r.m, data, sizeof(data));
	zdtm_check(k == 1 && data[0] == 'b', "big-queue", "R's master: fresh read %zd", k);

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
