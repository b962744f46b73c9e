/*
 * zdtm.h - common protocol for the Stasis self-checking test workloads.
 *
 * Protocol (CRIU zdtm style), identical for every workload:
 *
 *   workload PIDFILE [ARGS...]
 *
 *   1. zdtm_init(): parse PIDFILE (made absolute, so a later chdir() does not
 *      matter) and install the SIGTERM handler (it only sets zdtm_stop).
 *   2. The workload builds all of its state.
 *   3. zdtm_ready(): write getpid() to PIDFILE.tmp, rename() to PIDFILE.
 *   4. The workload keeps working until zdtm_stop becomes non-zero.  In the
 *      meantime it may be checkpointed / killed / restored any number of
 *      times; it must not notice.
 *   5. It checks every invariant with zdtm_check()/zdtm_fail()/zdtm_verify_*
 *      (each mismatch prints a detail line "mismatch[TAG]: ...") and calls
 *      zdtm_finish(), which prints exactly one final line, "PASS" or
 *      "FAIL: <tags that differed> (N mismatches)", and exits 0 or 1.
 *
 * Self-test support: when compiled with -DSELFTEST_CORRUPT, ZDTM_CORRUPT(tag,
 * stmt...) runs "stmt" (meant to break one invariant right before the checks)
 * and remembers "tag".  zdtm_finish() then prints "SELFTEST-UNDETECTED: tag"
 * for every corruption whose tag was not reported by a failing check, so the
 * self-test proves that every check can actually fail.
 *
 * Everything is printed to stdout (a regular file, fully buffered); nothing
 * is printed before zdtm_finish() unless the workload says so.
 */
#ifndef STASIS_ZDTM_H
#define STASIS_ZDTM_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef SELFTEST_CORRUPT
#define ZDTM_SELFTEST 1
#else
#define ZDTM_SELFTEST 0
#endif

#define ZDTM_MAX_TAGS 64
#define ZDTM_MAX_DETAILS_PER_TAG 16

/* Set by the SIGTERM handler.  The only thing the handler does (besides
 * counting its invocations, which restart_syscalls.c uses). */
static volatile sig_atomic_t zdtm_stop;
static volatile sig_atomic_t zdtm_sigterm_count;

static const char *zdtm_name = "workload";
static char zdtm_pidfile[PATH_MAX];

static const char *zdtm_fail_tags[ZDTM_MAX_TAGS];
static unsigned long zdtm_fail_tag_count[ZDTM_MAX_TAGS];
static int zdtm_nfail_tags;
static unsigned long zdtm_nfail;

static const char *zdtm_corrupt_tags[ZDTM_MAX_TAGS];
static int zdtm_ncorrupt;

/* ------------------------------------------------------------------ */
/* deterministic patterns                                              */

static inline uint64_t zdtm_mix64(uint64_t x)
{
	/* splitmix64 finalizer */
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

/* 64-bit word number idx of the pattern named by seed. */
static inline uint64_t zdtm_pat_word(uint64_t seed, uint64_t idx)
{
	return zdtm_mix64(zdtm_mix64(seed) ^ (idx * 0xD6E8FEB86659FD93ull));
}

/* Byte at offset off of the pattern named by seed (little endian words). */
static inline uint8_t zdtm_pat_byte(uint64_t seed, uint64_t off)
{
	return (uint8_t)(zdtm_pat_word(seed, off >> 3) >> ((off & 7) * 8));
}

/* Fill p[0..len) with the pattern "seed", offsets relative to p. */
static inline void zdtm_fill(void *p, size_t len, uint64_t seed)
{
	uint8_t *b = p;
	size_t off = 0;

	for (; off + 8 <= len; off += 8) {
		uint64_t w = zdtm_pat_word(seed, off >> 3);
		memcpy(b + off, &w, 8);
	}
	for (; off < len; off++)
		b[off] = zdtm_pat_byte(seed, off);
}

/* ------------------------------------------------------------------ */
/* reporting                                                           */

static inline void zdtm_note_corrupt(const char *tag)
{
	if (zdtm_ncorrupt < ZDTM_MAX_TAGS)
		zdtm_corrupt_tags[zdtm_ncorrupt++] = tag;
}

#define ZDTM_CORRUPT(tag, ...)                                                 \
	do {                                                                   \
		if (ZDTM_SELFTEST) {                                           \
			zdtm_note_corrupt(tag);                                \
			__VA_ARGS__;                                           \
		}                                                              \
	} while (0)

static inline int zdtm_tag_index(const char *tag)
{
	int i;

	for (i = 0; i < zdtm_nfail_tags; i++)
		if (strcmp(zdtm_fail_tags[i], tag) == 0)
			return i;
	if (zdtm_nfail_tags < ZDTM_MAX_TAGS) {
		zdtm_fail_tags[zdtm_nfail_tags] = tag;
		return zdtm_nfail_tags++;
	}
	return ZDTM_MAX_TAGS - 1;
}

/* Record one failed check.  Always returns 0. */
static inline int zdtm_vfail(const char *tag, const char *fmt, va_list ap)
{
	int i = zdtm_tag_index(tag);

	zdtm_nfail++;
	if (zdtm_fail_tag_count[i]++ < ZDTM_MAX_DETAILS_PER_TAG) {
		printf("mismatch[%s]: ", tag);
		vprintf(fmt, ap);
		printf("\n");
	} else if (zdtm_fail_tag_count[i] == ZDTM_MAX_DETAILS_PER_TAG + 1) {
		printf("mismatch[%s]: (further details suppressed)\n", tag);
	}
	return 0;
}

__attribute__((format(printf, 2, 3)))
static inline int zdtm_fail(const char *tag, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	zdtm_vfail(tag, fmt, ap);
	va_end(ap);
	return 0;
}

/* A failed check in a child process, whose stdout is not the report: one
 * line "mismatch[tag]: (who, pid N) ..." written straight to stderr (one
 * write, so lines from several children do not interleave).  The parent
 * learns of the failure from the child's exit status. */
static inline void zdtm_child_vfail(const char *who, const char *tag,
				    const char *fmt, va_list ap)
{
	char buf[512];
	int n;

	n = snprintf(buf, sizeof(buf), "mismatch[%s]: (%s, pid %d) ", tag, who,
		     (int)getpid());
	n += vsnprintf(buf + n, sizeof(buf) - n - 1, fmt, ap);
	if (n > (int)sizeof(buf) - 2)
		n = sizeof(buf) - 2;
	buf[n++] = '\n';
	if (write(2, buf, n) < 0) {
		/* nothing else to do */
	}
}

__attribute__((format(printf, 3, 4)))
static inline void zdtm_child_fail(const char *who, const char *tag,
				   const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	zdtm_child_vfail(who, tag, fmt, ap);
	va_end(ap);
}

/* zdtm_check(cond, tag, fmt, ...): returns cond != 0; reports if false. */
#define zdtm_check(cond, tag, ...) ((cond) ? 1 : zdtm_fail(tag, __VA_ARGS__))

/* Compare memory; report first differing offset and number of differing
 * bytes.  Returns the number of differing bytes. */
static inline size_t zdtm_verify_mem(const char *tag, const char *what,
				     const void *actual, const void *expected,
				     size_t len)
{
	const uint8_t *a = actual, *e = expected;
	size_t i, bad = 0, first = 0;

	for (i = 0; i < len; i++) {
		if (a[i] != e[i]) {
			if (!bad)
				first = i;
			bad++;
		}
	}
	if (bad)
		zdtm_fail(tag,
			  "%s: %zu of %zu bytes differ, first at offset %zu "
			  "(0x%zx): got 0x%02x expected 0x%02x",
			  what, bad, len, first, first, a[first], e[first]);
	return bad;
}

/* Compare p[0..len) with pattern "seed".  Returns differing byte count. */
static inline size_t zdtm_verify_pattern(const char *tag, const char *what,
					 const void *p, size_t len,
					 uint64_t seed)
{
	const uint8_t *b = p;
	size_t off, bad = 0, first = 0;
	uint8_t got = 0, exp = 0;

	for (off = 0; off < len;) {
		if (off + 8 <= len) {
			uint64_t w = zdtm_pat_word(seed, off >> 3), a;

			memcpy(&a, b + off, 8);
			if (a == w) {
				off += 8;
				continue;
			}
		}
		/* slow path: byte by byte for this word */
		{
			size_t end = (off | 7) + 1;

			if (end > len)
				end = len;
			for (; off < end; off++) {
				uint8_t e = zdtm_pat_byte(seed, off);

				if (b[off] != e) {
					if (!bad) {
						first = off;
						got = b[off];
						exp = e;
					}
					bad++;
				}
			}
		}
	}
	if (bad)
		zdtm_fail(tag,
			  "%s: %zu of %zu bytes differ, first at offset %zu "
			  "(0x%zx): got 0x%02x expected 0x%02x",
			  what, bad, len, first, first, got, exp);
	return bad;
}

/* ------------------------------------------------------------------ */
/* /proc                                                               */

/* Reads a (small) text file into buf, NUL-terminated; returns its length
 * or -1.  At most size - 1 bytes are read. */
static inline int zdtm_read_text(const char *path, char *buf, size_t size)
{
	size_t len = 0;
	ssize_t r;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	while (len + 1 < size) {
		r = read(fd, buf + len, size - 1 - len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		len += r;
	}
	close(fd);
	buf[len] = 0;
	return (int)len;
}

/* /proc/self/fdinfo/FD into buf (see zdtm_read_text). */
static inline int zdtm_fdinfo(int fd, char *buf, size_t size)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	return zdtm_read_text(path, buf, size);
}

/* ------------------------------------------------------------------ */
/* time                                                                */

static inline int64_t zdtm_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* One nanosleep; returns early (without retry) if a signal interrupts it,
 * so that loops can notice zdtm_stop promptly. */
static inline void zdtm_msleep(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000l };

	nanosleep(&ts, NULL);
}

static inline void zdtm_usleep(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000l };

	nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------ */
/* protocol                                                            */

/* waitpid() with a deadline of `ms` milliseconds (polls WNOHANG): 0 and the
 * status, or -1 with errno set (ETIMEDOUT at the deadline). */
static inline int zdtm_wait_deadline(pid_t pid, int *status, long ms)
{
	int64_t end = zdtm_now_ns() + (int64_t)ms * 1000000ll;

	for (;;) {
		pid_t r = waitpid(pid, status, WNOHANG);

		if (r == pid)
			return 0;
		if (r < 0 && errno != EINTR)
			return -1;
		if (zdtm_now_ns() > end) {
			errno = ETIMEDOUT;
			return -1;
		}
		zdtm_msleep(5);
	}
}

static inline void zdtm_sigterm_handler(int sig)
{
	(void)sig;
	zdtm_stop = 1;
	zdtm_sigterm_count++;
}

/* Fatal setup error: print the FAIL line (the only output) and exit 1. */
__attribute__((format(printf, 1, 2), noreturn))
static inline void zdtm_die(const char *fmt, ...)
{
	va_list ap;
	int err = errno;

	printf("setup error: ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf(" (errno %d: %s)\n", err, strerror(err));
	printf("FAIL: setup\n");
	fflush(stdout);
	exit(1);
}

/*
 * Parse "PIDFILE [ARGS...]", install the SIGTERM handler.  max_args is the
 * number of optional arguments after PIDFILE the workload accepts.
 */
static inline void zdtm_init(int argc, char **argv, int max_args,
			     const char *args_usage)
{
	struct sigaction sa;
	const char *slash;

	if (argc > 0 && argv[0]) {
		slash = strrchr(argv[0], '/');
		zdtm_name = slash ? slash + 1 : argv[0];
	}
	if (argc < 2 || argc > 2 + max_args) {
		fprintf(stderr, "usage: %s PIDFILE %s\n", zdtm_name,
			args_usage ? args_usage : "");
		exit(2);
	}
	if (argv[1][0] == '/') {
		if (strlen(argv[1]) >= sizeof(zdtm_pidfile) - 8)
			zdtm_die("pidfile path too long");
		strcpy(zdtm_pidfile, argv[1]);
	} else {
		char cwd[PATH_MAX];

		if (!getcwd(cwd, sizeof(cwd)))
			zdtm_die("getcwd");
		if (strlen(cwd) + strlen(argv[1]) + 2 >= sizeof(zdtm_pidfile) - 8)
			zdtm_die("pidfile path too long");
		strcpy(zdtm_pidfile, cwd);
		strcat(zdtm_pidfile, "/");
		strcat(zdtm_pidfile, argv[1]);
	}

	/* A static stdout buffer: no allocation on the first printf (which
	 * happens after the checkpoints, and could otherwise land in a hole a
	 * workload keeps in its address space). */
	{
		static char zdtm_stdout_buf[1 << 16];

		setvbuf(stdout, zdtm_stdout_buf, _IOFBF,
			sizeof(zdtm_stdout_buf));
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = zdtm_sigterm_handler;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0; /* no SA_RESTART: let blocking calls see EINTR */
	if (sigaction(SIGTERM, &sa, NULL))
		zdtm_die("sigaction(SIGTERM)");
}

/* State is set up: publish the PID atomically (tmp file + rename). */
static inline void zdtm_ready(void)
{
	char tmp[PATH_MAX + 16];
	char buf[32];
	int fd, n;

	strcpy(tmp, zdtm_pidfile);
	strcat(tmp, ".tmp");
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		zdtm_die("open %s", tmp);
	n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());
	if (write(fd, buf, n) != n)
		zdtm_die("write %s", tmp);
	if (close(fd))
		zdtm_die("close %s", tmp);
	if (rename(tmp, zdtm_pidfile))
		zdtm_die("rename %s -> %s", tmp, zdtm_pidfile);
}

/* Print the final line and exit (0 = PASS, 1 = FAIL). */
__attribute__((noreturn))
static inline void zdtm_finish(void)
{
	int i, j;

	for (i = 0; i < zdtm_ncorrupt; i++) {
		int found = 0;

		for (j = 0; j < zdtm_nfail_tags; j++)
			if (strcmp(zdtm_fail_tags[j], zdtm_corrupt_tags[i]) == 0)
				found = 1;
		if (!found)
			printf("SELFTEST-UNDETECTED: %s\n", zdtm_corrupt_tags[i]);
	}
	if (ZDTM_SELFTEST)
		printf("selftest: %d corruptions injected\n", zdtm_ncorrupt);

	if (zdtm_nfail == 0) {
		printf("PASS\n");
		fflush(stdout);
		exit(0);
	}
	printf("FAIL: ");
	for (i = 0; i < zdtm_nfail_tags; i++)
		printf("%s%s", i ? ", " : "", zdtm_fail_tags[i]);
	printf(" (%lu mismatches)\n", zdtm_nfail);
	fflush(stdout);
	exit(1);
}

#endif /* STASIS_ZDTM_H */
