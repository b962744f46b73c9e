/*
 * pipes.c - pipes and a FIFO with unread data in them, a pipe shared with a
 * child, and a regular file whose open file description (offset) is shared
 * between parent and child.
 *
 *   pipes PIDFILE
 *
 * Set up before "ready" (files in the cwd, recreated if they exist):
 *   pipes.data  regular file, O_RDWR, opened before fork, 300 bytes of
 *               pattern(SEED_FILE) written, so the shared offset is 300.
 *   P1          pipe, F_SETPIPE_SZ 256 KiB, 100 000 bytes of pattern(SEED_P1)
 *               written by the root and NOT read before SIGTERM.  The root
 *               keeps only the write end, child D only the read end.
 *   D           child, blocked in sigsuspend() (SIGTERM blocked otherwise).
 *   P2          pipe2(O_NONBLOCK), both ends held only by the root (created
 *               after fork), 1000 bytes of pattern(SEED_P2) in it.
 *   P2 reopened its write end opened again through /proc/self/fd (zdtm's
 *               pipe01): an open file description of its own, blocking.
 *   pipes.fifo  mkfifo, opened O_RDWR (blocking) by the root only, 5000 bytes
 *               of pattern(SEED_FIFO) in it.
 * A setup pipe (closed before "ready") tells the root when D is set up.
 * The root waits in a nanosleep(100 ms) loop.
 *
 * After SIGTERM (root):
 *   P1    write end: O_WRONLY, blocking, F_GETPIPE_SZ >= 256 KiB, FIONREAD =
 *         100 000 (D read nothing).
 *   P2    both ends O_NONBLOCK with the right access mode, the reopened
 *         write end O_WRONLY without it (so not sharing their description);
 *         the reopened end with O_LARGEFILE (as open() sets it), the pipe's
 *         own ends without (as pipe2() makes them),
 *         FIONREAD 1000,
 *         reads give exactly the 1000 bytes then EAGAIN; a byte written to
 *         the write end comes out of the read end (same pipe).
 *   FIFO  fstat: a FIFO, same dev/inode as pipes.fifo; O_RDWR, blocking;
 *         FIONREAD 5000; then (O_NONBLOCK set) exactly the 5000 bytes and
 *         EAGAIN.
 *   file  offset 300 (lseek SEEK_CUR), same inode as pipes.data.
 * Then it sends SIGTERM to D, closes its P1 write end and waits for D.
 *   D     checks its read end (O_RDONLY, blocking, F_GETPIPE_SZ >= 256 KiB),
 *         reads P1 until EOF (poll, 5 s per step): exactly the 100 000 bytes
 *         and then EOF (no other write end anywhere); sees the shared file
 *         offset at 300, writes 10 bytes of pattern(SEED_DW) through it and
 *         sees 310.  It prints nothing on stdout: mismatch lines go to stderr
 *         and its exit status is a bit mask the root turns into tags.
 * Finally the root sees the shared offset at 310 and the file is exactly
 * 300 + 10 bytes of the two patterns (pread).
 */
#include "zdtm.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define P1_SIZE     (256 * 1024)
#define P1_DATA     100000
#define P2_DATA     1000
#define FIFO_DATA   5000
#define FILE_OFF    300
#define D_WRITE     10
#define SETUP_FAIL  100
#define DEADLINE_S  20
#define EOF_TIMEOUT_MS (ZDTM_SELFTEST ? 1000 : 5000)

#define SEED_P1   0x7069706573703100ull
#define SEED_P2   0x7069706573703200ull
#define SEED_FIFO 0x7069706566696600ull
#define SEED_FILE 0x7069706566696c00ull
#define SEED_DW   0x7069706564770000ull

#define F_DATA "pipes.data"
#define F_FIFO "pipes.fifo"

/* D's exit status bits */
#define R_DATA     0x01
#define R_EOF      0x02
#define R_SIZE     0x04
#define R_OFFSET   0x08
#define R_FLAGS    0x10
#define R_INTERNAL 0x40
#define R_NBITS    7

static const char *const d_tags[R_NBITS] = {
	"p1-data", "p1-eof", "p1-size", "file-offset", "p1-flags", "D-unused",
	"D-internal"
};

static int fd_file = -1, p1r = -1, p1w = -1;

/* ------------------------------------------------------------------ */
/* helpers                                                             */

#define dfail(tag, ...) zdtm_child_fail("pipes child D", tag, __VA_ARGS__)

static int write_all(int fd, const void *p, size_t len)
{
	const uint8_t *b = p;

	while (len) {
		ssize_t n = write(fd, b, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		b += n;
		len -= n;
	}
	return 0;
}

/* Reads a non-blocking fd until EAGAIN into buf (at most cap bytes; more
 * data counts in *extra).  Returns total bytes in buf, or -1 on an error
 * other than EAGAIN (errno kept). */
static ssize_t drain_nonblock(int fd, uint8_t *buf, size_t cap, size_t *extra)
{
	size_t total = 0;
	uint8_t scratch[4096];

	*extra = 0;
	for (;;) {
		ssize_t n;

		if (total < cap)
			n = read(fd, buf + total, cap - total);
		else
			n = read(fd, scratch, sizeof(scratch));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return (ssize_t)total;
		if (n < 0)
			return -1;
		if (n == 0) /* EOF: no writer */
			return (ssize_t)total;
		if (total < cap)
			total += n;
		else
			*extra += n;
	}
}

static size_t pat_diff(const uint8_t *p, size_t len, uint64_t seed,
		       size_t *first)
{
	size_t off, bad = 0;

	for (off = 0; off < len; off++) {
		if (p[off] != zdtm_pat_byte(seed, off)) {
			if (!bad)
				*first = off;
			bad++;
		}
	}
	return bad;
}

/* ------------------------------------------------------------------ */
/* child D                                                             */

__attribute__((noreturn))
static void run_d(int ready_w, const sigset_t *waitmask)
{
	static uint8_t buf[P1_DATA];
	uint8_t scratch[4096], w[D_WRITE];
	size_t total = 0, extra = 0, bad, first = 0, i;
	int bits = 0, fl, sz;
	off_t off;
	char c = 'D';

	close(p1w);
	p1w = -1;
	while (write(ready_w, &c, 1) != 1)
		if (errno != EINTR)
			_exit(SETUP_FAIL);
	close(ready_w);

	while (!zdtm_stop)
		sigsuspend(waitmask);

	if (ZDTM_SELFTEST) {
		/* a second write end of P1: EOF never comes */
		char path[64];

		snprintf(path, sizeof(path), "/proc/self/fd/%d", p1r);
		if (open(path, O_WRONLY | O_CLOEXEC) < 0)
			dfail("D-internal", "selftest: open %s: errno %d", path,
			      errno);
	}

	fl = fcntl(p1r, F_GETFL);
	if (fl < 0 || (fl & O_ACCMODE) != O_RDONLY || (fl & O_NONBLOCK)) {
		dfail("p1-flags", "P1 read end F_GETFL %#x, expected O_RDONLY "
		      "without O_NONBLOCK", fl);
		bits |= R_FLAGS;
	}
	sz = fcntl(p1r, F_GETPIPE_SZ);
	if (sz < P1_SIZE) {
		dfail("p1-size", "P1 read end F_GETPIPE_SZ %d, expected >= %d",
		      sz, P1_SIZE);
		bits |= R_SIZE;
	}

	/* read everything until EOF */
	for (;;) {
		struct pollfd pfd = { .fd = p1r, .events = POLLIN };
		int pr = poll(&pfd, 1, EOF_TIMEOUT_MS);
		ssize_t n;

		if (pr < 0 && errno == EINTR)
			continue;
		if (pr < 0) {
			dfail("D-internal", "poll: errno %d", errno);
			bits |= R_INTERNAL;
			break;
		}
		if (pr == 0) {
			dfail("p1-eof", "no data and no EOF on P1 after %d ms "
			      "(%zu bytes read): a write end is still open",
			      EOF_TIMEOUT_MS, total);
			bits |= R_EOF;
			break;
		}
		if (total < P1_DATA)
			n = read(p1r, buf + total, P1_DATA - total);
		else
			n = read(p1r, scratch, sizeof(scratch));
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0) {
			dfail("D-internal", "read P1: errno %d", errno);
			bits |= R_INTERNAL;
			break;
		}
		if (n == 0)
			break; /* EOF */
		if (total < P1_DATA)
			total += n;
		else
			extra += n;
	}
	if (total != P1_DATA || extra) {
		dfail("p1-data", "read %zu bytes from P1, expected exactly %d",
		      total + extra, P1_DATA);
		bits |= R_DATA;
	}
	bad = pat_diff(buf, total, SEED_P1, &first);
	if (bad) {
		dfail("p1-data", "P1 data: %zu of %zu bytes differ, first at "
		      "offset %zu: got 0x%02x expected 0x%02x", bad, total,
		      first, buf[first], zdtm_pat_byte(SEED_P1, first));
		bits |= R_DATA;
	}

	/* the shared file offset */
	off = lseek(fd_file, 0, SEEK_CUR);
	if (off != FILE_OFF) {
		dfail("file-offset", "shared offset %lld before D's write, "
		      "expected %d", (long long)off, FILE_OFF);
		bits |= R_OFFSET;
	}
	for (i = 0; i < D_WRITE; i++)
		w[i] = zdtm_pat_byte(SEED_DW, i);
	if (write_all(fd_file, w, D_WRITE)) {
		dfail("file-offset", "write of %d bytes: errno %d", D_WRITE,
		      errno);
		bits |= R_OFFSET;
	}
	off = lseek(fd_file, 0, SEEK_CUR);
	if (off != FILE_OFF + D_WRITE) {
		dfail("file-offset", "shared offset %lld after D's write, "
		      "expected %d", (long long)off, FILE_OFF + D_WRITE);
		bits |= R_OFFSET;
	}
	_exit(bits);
}

/* ------------------------------------------------------------------ */
/* root                                                                */

static void check_flags(const char *tag, const char *what, int fd, int want)
{
	int fl = fcntl(fd, F_GETFL);

	zdtm_check(fl >= 0 && (fl & (O_ACCMODE | O_NONBLOCK)) == want, tag,
		   "%s: F_GETFL %#x, expected access mode %d%s", what, fl,
		   want & O_ACCMODE, want & O_NONBLOCK ? " + O_NONBLOCK" :
		   " without O_NONBLOCK");
}

static void check_nread(const char *tag, const char *what, int fd, int want)
{
	int n = -1;

	zdtm_check(ioctl(fd, FIONREAD, &n) == 0 && n == want, tag,
		   "%s: FIONREAD %d, expected %d", what, n, want);
}

static void check_drain(const char *tag, const char *what, int fd,
			size_t want, uint64_t seed)
{
	static uint8_t buf[64 * 1024];
	size_t extra;
	ssize_t got = drain_nonblock(fd, buf, sizeof(buf), &extra);

	if (!zdtm_check(got >= 0, tag, "%s: read: %s", what, strerror(errno)))
		return;
	zdtm_check((size_t)got == want && !extra, tag,
		   "%s: %zu bytes readable, expected exactly %zu", what,
		   (size_t)got + extra, want);
	zdtm_verify_pattern(tag, what, buf, (size_t)got < want ? (size_t)got :
			    want, seed);
}

int main(int argc, char **argv)
{
	static uint8_t tmp[P1_DATA];
	int p1[2], p2[2], p2w2, readyp[2], fifo, st, b, code;
	sigset_t block, waitmask;
	struct stat sf, sp;
	pid_t d;
	char c;
	ssize_t n;
	off_t off;

	zdtm_init(argc, argv, 0, NULL);

	/* (d) the regular file, offset 300, shared with D */
	fd_file = open(F_DATA, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd_file < 0)
		zdtm_die("open %s", F_DATA);
	zdtm_fill(tmp, FILE_OFF, SEED_FILE);
	if (write_all(fd_file, tmp, FILE_OFF))
		zdtm_die("write %s", F_DATA);

	/* (a) P1 with 100 000 unread bytes */
	if (pipe2(p1, O_CLOEXEC))
		zdtm_die("pipe2 P1");
	p1r = p1[0];
	p1w = p1[1];
	if (fcntl(p1w, F_SETPIPE_SZ, P1_SIZE) < P1_SIZE)
		zdtm_die("F_SETPIPE_SZ %d", P1_SIZE);
	zdtm_fill(tmp, P1_DATA, SEED_P1);
	if (write_all(p1w, tmp, P1_DATA))
		zdtm_die("write P1");

	/* D: SIGTERM blocked outside sigsuspend (no lost wake-up) */
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	if (sigprocmask(SIG_BLOCK, &block, &waitmask))
		zdtm_die("sigprocmask");
	sigdelset(&waitmask, SIGTERM);
	if (pipe2(readyp, O_CLOEXEC))
		zdtm_die("pipe2 setup");
	fflush(stdout);
	d = fork();
	if (d < 0)
		zdtm_die("fork");
	if (d == 0) {
		close(readyp[0]);
		run_d(readyp[1], &waitmask);
	}
	if (sigprocmask(SIG_SETMASK, &waitmask, NULL))
		zdtm_die("sigprocmask");
	close(readyp[1]);
	close(p1r);
	p1r = -1;
	do
		n = read(readyp[0], &c, 1);
	while (n < 0 && errno == EINTR);
	if (n != 1 || c != 'D') {
		kill(d, SIGKILL);
		zdtm_die("child D not ready");
	}
	do
		n = read(readyp[0], &c, 1);
	while (n < 0 && errno == EINTR);
	close(readyp[0]);
	if (n != 0) {
		kill(d, SIGKILL);
		zdtm_die("setup pipe not closed by D");
	}

	/* (b) P2, non-blocking, root only */
	if (pipe2(p2, O_NONBLOCK | O_CLOEXEC)) {
		kill(d, SIGKILL);
		zdtm_die("pipe2 P2");
	}
	zdtm_fill(tmp, P2_DATA, SEED_P2);
	if (write_all(p2[1], tmp, P2_DATA)) {
		kill(d, SIGKILL);
		zdtm_die("write P2");
	}

	{
		char path[64];

		snprintf(path, sizeof(path), "/proc/self/fd/%d", p2[1]);
		p2w2 = open(path, O_WRONLY | O_CLOEXEC);
		if (p2w2 < 0) {
			kill(d, SIGKILL);
			zdtm_die("reopen P2's write end");
		}
	}

	/* (c) the FIFO, O_RDWR */
	unlink(F_FIFO);
	if (mkfifo(F_FIFO, 0644)) {
		kill(d, SIGKILL);
		zdtm_die("mkfifo %s", F_FIFO);
	}
	fifo = open(F_FIFO, O_RDWR | O_CLOEXEC);
	if (fifo < 0) {
		kill(d, SIGKILL);
		zdtm_die("open %s", F_FIFO);
	}
	zdtm_fill(tmp, FIFO_DATA, SEED_FIFO);
	if (write_all(fifo, tmp, FIFO_DATA)) {
		kill(d, SIGKILL);
		zdtm_die("write %s", F_FIFO);
	}

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	/* ---------------- verification ---------------- */
	ZDTM_CORRUPT("p1-data", write_all(p1w, "x", 1));
	ZDTM_CORRUPT("p1-size", fcntl(p1w, F_SETPIPE_SZ, P1_SIZE / 2));
	ZDTM_CORRUPT("p1-flags", fcntl(p1w, F_SETFL, O_NONBLOCK));
	ZDTM_CORRUPT("p1-eof", (void)0); /* inside D: a 2nd write end */
	ZDTM_CORRUPT("p2-data", read(p2[0], tmp, 1));
	ZDTM_CORRUPT("p2-pair", {
		int x[2];

		if (pipe2(x, O_NONBLOCK | O_CLOEXEC) == 0) {
			dup3(x[1], p2[1], O_CLOEXEC);
			close(x[1]);
		}
	});
	/* after p2-pair, which replaces the write end */
	ZDTM_CORRUPT("p2-flags", fcntl(p2[1], F_SETFL, 0));
	ZDTM_CORRUPT("p2-reopened", fcntl(p2w2, F_SETFL, O_NONBLOCK));
	ZDTM_CORRUPT("p2-largefile", {
		char path[64];
		int x;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", p2[0]);
		x = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
		if (x >= 0) {
			dup3(x, p2[0], O_CLOEXEC);
			close(x);
		}
	});
	ZDTM_CORRUPT("fifo-id", unlink(F_FIFO), mkfifo(F_FIFO, 0644));
	ZDTM_CORRUPT("fifo-flags", fcntl(fifo, F_SETFL, O_NONBLOCK));
	ZDTM_CORRUPT("fifo-data", write_all(fifo, "y", 1));
	ZDTM_CORRUPT("file-offset", lseek(fd_file, FILE_OFF + 1, SEEK_SET));
	ZDTM_CORRUPT("file-data", pwrite(fd_file, "z", 1, 100));

	/* P1, root's write end */
	check_flags("p1-flags", "P1 write end", p1w, O_WRONLY);
	zdtm_check(fcntl(p1w, F_GETPIPE_SZ) >= P1_SIZE, "p1-size",
		   "P1 write end F_GETPIPE_SZ %d, expected >= %d",
		   fcntl(p1w, F_GETPIPE_SZ), P1_SIZE);
	check_nread("p1-data", "P1 (unread by D)", p1w, P1_DATA);

	/* P2 */
	check_flags("p2-flags", "P2 read end", p2[0], O_RDONLY | O_NONBLOCK);
	check_flags("p2-flags", "P2 write end", p2[1], O_WRONLY | O_NONBLOCK);
	check_flags("p2-reopened", "P2 write end reopened", p2w2, O_WRONLY);
	zdtm_check(!(fcntl(p2[0], F_GETFL) & 0100000) &&
			   !(fcntl(p2[1], F_GETFL) & 0100000) &&
			   (fcntl(p2w2, F_GETFL) & 0100000),
		   "p2-largefile",
		   "O_LARGEFILE: read end %#x, write end %#x, reopened %#x",
		   fcntl(p2[0], F_GETFL), fcntl(p2[1], F_GETFL),
		   fcntl(p2w2, F_GETFL));
	check_nread("p2-data", "P2", p2[0], P2_DATA);
	fcntl(p2[0], F_SETFL, O_NONBLOCK); /* never block below */
	check_drain("p2-data", "P2", p2[0], P2_DATA, SEED_P2);
	{
		uint8_t x = 0x5a, y = 0;
		ssize_t w = write(p2[1], &x, 1), r = read(p2[0], &y, 1);

		zdtm_check(w == 1 && r == 1 && y == x, "p2-pair",
			   "a byte written to P2's write end does not come out "
			   "of its read end (write %zd, read %zd, byte %#x)",
			   w, r, y);
	}

	/* the FIFO */
	zdtm_check(fstat(fifo, &sf) == 0 && S_ISFIFO(sf.st_mode) &&
		   stat(F_FIFO, &sp) == 0 && sf.st_dev == sp.st_dev &&
		   sf.st_ino == sp.st_ino, "fifo-id",
		   "fd is not the FIFO %s (mode %o ino %llu vs %llu)", F_FIFO,
		   (unsigned)sf.st_mode, (unsigned long long)sf.st_ino,
		   (unsigned long long)sp.st_ino);
	check_flags("fifo-flags", "FIFO", fifo, O_RDWR);
	check_nread("fifo-data", "FIFO", fifo, FIFO_DATA);
	fcntl(fifo, F_SETFL, O_NONBLOCK);
	check_drain("fifo-data", "FIFO", fifo, FIFO_DATA, SEED_FIFO);

	/* the shared file, before D writes */
	zdtm_check(fstat(fd_file, &sf) == 0 && stat(F_DATA, &sp) == 0 &&
		   sf.st_dev == sp.st_dev && sf.st_ino == sp.st_ino, "file-data",
		   "fd is not %s (ino %llu vs %llu)", F_DATA,
		   (unsigned long long)sf.st_ino,
		   (unsigned long long)sp.st_ino);
	check_flags("file-offset", F_DATA, fd_file, O_RDWR);
	off = lseek(fd_file, 0, SEEK_CUR);
	zdtm_check(off == FILE_OFF, "file-offset", "offset %lld before D's "
		   "write, expected %d", (long long)off, FILE_OFF);

	/* D: reads P1 to EOF, writes through the shared file */
	zdtm_check(kill(d, SIGTERM) == 0, "D-internal", "kill(D = %d): %s",
		   (int)d, strerror(errno));
	close(p1w);
	p1w = -1;
	if (zdtm_wait_deadline(d, &st, DEADLINE_S * 1000)) {
		zdtm_fail("D-internal", "waitpid(D = %d): %s", (int)d,
			  strerror(errno));
		kill(d, SIGKILL);
	} else if (!WIFEXITED(st)) {
		zdtm_fail("D-internal", "D (pid %d) killed by signal %d",
			  (int)d, WIFSIGNALED(st) ? WTERMSIG(st) : -1);
	} else {
		code = WEXITSTATUS(st);
		for (b = 0; b < R_NBITS; b++)
			if (code & (1 << b))
				zdtm_fail(d_tags[b], "child D (pid %d) exited "
					  "with status %#x (details on stderr)",
					  (int)d, code);
		if (code & ~((1 << R_NBITS) - 1))
			zdtm_fail("D-internal", "D (pid %d) exited with "
				  "status %d", (int)d, code);
	}

	/* the shared offset moved with D's write */
	off = lseek(fd_file, 0, SEEK_CUR);
	zdtm_check(off == FILE_OFF + D_WRITE, "file-offset",
		   "offset %lld after D's write, expected %d (not shared?)",
		   (long long)off, FILE_OFF + D_WRITE);
	{
		uint8_t f[FILE_OFF + D_WRITE + 16];

		n = pread(fd_file, f, sizeof(f), 0);
		zdtm_check(n == FILE_OFF + D_WRITE, "file-data",
			   "%s is %zd bytes, expected %d", F_DATA, n,
			   FILE_OFF + D_WRITE);
		if (n < 0)
			n = 0;
		zdtm_verify_pattern("file-data", "file bytes 0..299", f,
				    n < FILE_OFF ? (size_t)n : FILE_OFF,
				    SEED_FILE);
		if (n > FILE_OFF)
			zdtm_verify_pattern("file-data", "D's 10 bytes at 300",
					    f + FILE_OFF,
					    n < FILE_OFF + D_WRITE ?
					    (size_t)n - FILE_OFF : D_WRITE,
					    SEED_DW);
	}

	zdtm_finish();
}
