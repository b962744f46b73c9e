/*
 * lazy_job.c - benchmark workload for bench/lazy_restore.py.
 *
 *   lazy_job PIDFILE SIZE_MIB HOT_MIB [HOT_PASSES]
 *
 * Maps SIZE_MIB MiB of private anonymous memory and writes every byte with
 * the fill.c pattern (8-byte words, pattern(offset) = mix64(offset ^ SEED)),
 * then writes its PID to PIDFILE and loops:
 *
 *   - one pass over the "hot set": HOT_MIB MiB in the middle of the buffer
 *     (starting at (SIZE_MIB - HOT_MIB) / 2 MiB, so that neither the start
 *     nor the end of an address-order stream reaches it first); a pass
 *     reads and writes back one word of every page (the page is written,
 *     its contents stay the pattern);
 *   - ten 1 ms nanosleep()s.
 *
 * A heartbeat runs before every 4th page of a pass and after every sleep:
 * it reads CLOCK_MONOTONIC and, if more than GAP_MS passed since the
 * previous heartbeat, checks whether the file "go" exists next to PIDFILE.
 * The benchmark creates "go" only after the original process was killed,
 * so the first heartbeat that sees it runs in the restored process: it is
 * the first heartbeat after the restore (a restore is always a gap of at
 * least a second; the gaps the dump's freeze leaves in the original
 * process find no "go"). That heartbeat takes the CLOCK_REALTIME time
 * (t_resume), writes it to "resume", and runs "the job" at once:
 *
 *   - HOT_PASSES (default 5) passes over the hot set (then t_hot);
 *   - one pass over all SIZE_MIB MiB checking every word against the
 *     pattern (this touches every page, so every page must have arrived;
 *     then t_done);
 *
 * and writes "done" next to PIDFILE: one line
 *   PASS|FAIL t_resume_ns t_hot_ns t_done_ns gap_ns bad_words first_bad_offset passes_before
 * (CLOCK_REALTIME nanoseconds), then exits 0 (PASS) or 1 (FAIL).
 * Both "resume" and "done" are written as NAME.tmp + rename.
 *
 * Single-threaded; no pipes, sockets or extra fds.  Start it with stdin from
 * /dev/null and stdout/stderr to a regular file so it can be checkpointed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define SEED 0x66696c6c62656e63ull /* "fillbenc", as fill.c */
#define PAGE 4096u
#define GAP_MS 200
#define BEAT_EVERY 4 /* pages */

static uint64_t *buf;
static size_t size, hot_off, hot_len;
static unsigned long hot_passes = 5;
static uint64_t last_beat, passes;
static char go_path[PATH_MAX], resume_path[PATH_MAX], done_path[PATH_MAX];
static volatile uint64_t sink;

static inline uint64_t pattern(uint64_t off)
{
	return mix64(off ^ SEED);
}

static uint64_t now_ns(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void job(uint64_t t_resume, uint64_t gap);

static inline void beat(void)
{
	uint64_t now = now_ns(CLOCK_MONOTONIC);

	if (now - last_beat > (uint64_t)GAP_MS * 1000000ull) {
		uint64_t t = now_ns(CLOCK_REALTIME);

		if (access(go_path, F_OK) == 0)
			job(t, now - last_beat); /* does not return */
	}
	last_beat = now;
}

/* Reads and writes back one word of every page of the hot set. */
static void hot_pass(int beats)
{
	volatile uint64_t *p = (volatile uint64_t *)((char *)buf + hot_off);
	size_t words_per_page = PAGE / sizeof(uint64_t), npages = hot_len / PAGE, i;
	uint64_t acc = 0;

	for (i = 0; i < npages; i++) {
		size_t w = i * words_per_page + (i % words_per_page);
		uint64_t v;

		if (beats && i % BEAT_EVERY == 0)
			beat();
		v = p[w];
		acc += v;
		p[w] = v;
	}
	sink = acc;
}

static void job(uint64_t t_resume, uint64_t gap)
{
	char line[256];
	uint64_t t_hot, t_done, nwords = size / sizeof(uint64_t), i, bad = 0, first_bad = 0;
	unsigned long k;

	snprintf(line, sizeof(line), "%llu %llu\n", (unsigned long long)t_resume, (unsigned long long)gap);
	publish_file(resume_path, line);
	for (k = 0; k < hot_passes; k++)
		hot_pass(0);
	t_hot = now_ns(CLOCK_REALTIME);
	for (i = 0; i < nwords; i++) {
		if (buf[i] != pattern(i * sizeof(uint64_t))) {
			if (!bad)
				first_bad = i * sizeof(uint64_t);
			bad++;
		}
	}
	t_done = now_ns(CLOCK_REALTIME);
	snprintf(line, sizeof(line), "%s %llu %llu %llu %llu %llu %llu %llu\n", bad ? "FAIL" : "PASS",
		 (unsigned long long)t_resume, (unsigned long long)t_hot, (unsigned long long)t_done,
		 (unsigned long long)gap, (unsigned long long)bad, (unsigned long long)first_bad,
		 (unsigned long long)passes);
	if (publish_file(done_path, line)) {
		perror("lazy_job: done file");
		_exit(2);
	}
	if (bad)
		printf("FAIL: %llu of %llu words differ, first at offset %llu\n", (unsigned long long)bad,
		       (unsigned long long)nwords, (unsigned long long)first_bad);
	else
		printf("PASS\n");
	fflush(stdout);
	_exit(bad ? 1 : 0);
}

static int sibling(char *out, const char *pidfile, const char *name)
{
	const char *slash = strrchr(pidfile, '/');
	int n;

	if (slash)
		n = snprintf(out, PATH_MAX, "%.*s/%s", (int)(slash - pidfile), pidfile, name);
	else
		n = snprintf(out, PATH_MAX, "%s", name);
	return n < 0 || n >= PATH_MAX ? -1 : 0;
}

static unsigned long parse(const char *s, const char *what)
{
	unsigned long v;
	char *end;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v == 0) {
		fprintf(stderr, "lazy_job: bad %s '%s'\n", what, s);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	struct timespec ms = { 0, 1000 * 1000 };
	unsigned long mib, hot_mib;
	uint64_t nwords, i;
	int s;

	if (argc != 4 && argc != 5) {
		fprintf(stderr, "usage: %s PIDFILE SIZE_MIB HOT_MIB [HOT_PASSES]\n", argv[0]);
		return 2;
	}
	mib = parse(argv[2], "SIZE_MIB");
	hot_mib = parse(argv[3], "HOT_MIB");
	if (argc == 5)
		hot_passes = parse(argv[4], "HOT_PASSES");
	if (hot_mib > mib) {
		fprintf(stderr, "lazy_job: HOT_MIB %lu > SIZE_MIB %lu\n", hot_mib, mib);
		return 2;
	}
	if (sibling(go_path, argv[1], "go") || sibling(resume_path, argv[1], "resume") ||
	    sibling(done_path, argv[1], "done")) {
		fprintf(stderr, "lazy_job: PIDFILE path too long\n");
		return 2;
	}
	size = (size_t)mib << 20;
	hot_len = (size_t)hot_mib << 20;
	hot_off = (size_t)((mib - hot_mib) / 2) << 20;
	nwords = size / sizeof(uint64_t);

	buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		perror("lazy_job: mmap");
		return 2;
	}
	for (i = 0; i < nwords; i++)
		buf[i] = pattern(i * sizeof(uint64_t));

	if (write_pidfile(argv[1])) {
		perror("lazy_job: pidfile");
		return 2;
	}
	last_beat = now_ns(CLOCK_MONOTONIC);
	for (;;) {
		hot_pass(1);
		passes++;
		for (s = 0; s < 10; s++) {
			nanosleep(&ms, NULL);
			beat();
		}
	}
}
