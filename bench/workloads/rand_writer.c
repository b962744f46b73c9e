/*
 * rand_writer.c - the memperf-style random writer, for
 * bench/random_writer.py: the worst case for a copy-on-write checkpoint.
 *
 *   rand_writer PIDFILE LOGFILE SIZE_MIB MAX_S THP
 *
 * Maps SIZE_MIB MiB of private anonymous memory and writes every byte
 * (pattern mix64(offset ^ seed)), then writes 64-bit words at random places
 * in it (xorshift64*: a random page, a random word in it) as fast as it
 * can, single-threaded. Every 256 writes it reads CLOCK_MONOTONIC; at most
 * once a millisecond it appends (time_ns, total writes so far) to a log
 * prepared in advance. So a stop shows up as a gap in the log, and the
 * driver gets the number of writes in any window by interpolation.
 *
 * Write number c (from 0) stores c + 1. At the end it checks that every
 * word holds either its start pattern or a value in [1, writes] (a page
 * that lost its content, for instance zeroed by a misdirected
 * MADV_DONTNEED, fails this), and that each of the last 65536 words written
 * holds at least the value written there.
 *
 * THP = 1 asks for transparent huge pages (MADV_HUGEPAGE), THP = 0 refuses
 * them (MADV_NOHUGEPAGE).
 *
 * It writes its PID file once the buffer is written, and runs until SIGTERM
 * (or MAX_S seconds of log are full: then it keeps writing without logging).
 * On SIGTERM it writes the log to LOGFILE as raw native int64 pairs
 * (time_ns, writes), prints "writes W logged L elapsed_s T" and "PASS"
 * (exit 0), or "FAIL: ..." (exit 1).
 *
 * Single-threaded; no pipes, sockets or extra fds. Start it with stdin from
 * /dev/null and stdout/stderr to a regular file so it can be checkpointed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define SEED 0x72616e64ull
#define RECENT 65536

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	static uint64_t recent_idx[RECENT];
	uint64_t *buf, nwords, npages, x = 0x9e3779b97f4a7c15ull, count = 0, i;
	size_t size, mib, log_cap, logged = 0, bad = 0;
	int64_t *logbuf, t0, next_log;
	struct sigaction sa;
	double max_s;
	int thp;
	FILE *f;

	if (argc != 6) {
		fprintf(stderr, "usage: %s PIDFILE LOGFILE SIZE_MIB MAX_S THP\n", argv[0]);
		return 2;
	}
	mib = strtoul(argv[3], NULL, 10);
	max_s = strtod(argv[4], NULL);
	thp = atoi(argv[5]);
	if (mib == 0 || max_s <= 0) {
		fprintf(stderr, "rand_writer: SIZE_MIB > 0, MAX_S > 0\n");
		return 2;
	}
	size = mib << 20;
	nwords = size / 8;
	npages = size / 4096;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_term;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGTERM, &sa, NULL)) {
		perror("rand_writer: sigaction");
		return 2;
	}

	log_cap = (size_t)(max_s * 1000.0) + 1;
	logbuf = mmap(NULL, log_cap * 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (logbuf == MAP_FAILED || buf == MAP_FAILED) {
		perror("rand_writer: mmap");
		return 2;
	}
	memset(logbuf, 0xff, log_cap * 16);
	(void)madvise(buf, size, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	for (i = 0; i < nwords; i++)
		buf[i] = mix64((i * 8) ^ SEED);

	if (write_pidfile(argv[1])) {
		perror("rand_writer: pidfile");
		return 2;
	}

	t0 = now_ns();
	next_log = t0;
	while (!stop) {
		int k;

		for (k = 0; k < 256; k++) {
			uint64_t r, idx;

			/* xorshift64* */
			x ^= x >> 12;
			x ^= x << 25;
			x ^= x >> 27;
			r = x * 0x2545f4914f6cdd1dull;
			idx = (uint64_t)(((unsigned __int128)(r >> 9) * npages) >> 55) * 512 + (r & 511);
			recent_idx[count & (RECENT - 1)] = idx;
			count++;
			buf[idx] = count;
		}
		{
			int64_t t = now_ns();

			if (t >= next_log && logged < log_cap) {
				logbuf[2 * logged] = t;
				logbuf[2 * logged + 1] = (int64_t)count;
				logged++;
				next_log = t + 1000000;
			}
		}
	}

	for (i = 0; i < nwords; i++) {
		uint64_t v = buf[i];

		if (v != mix64((i * 8) ^ SEED) && (v == 0 || v > count) && bad++ == 0)
			printf("FAIL: word %llu holds %#llx: neither its start pattern nor a write\n",
			       (unsigned long long)i, (unsigned long long)v);
	}
	for (i = 0; i < RECENT && i < count; i++) {
		uint64_t c = count - 1 - i, idx = recent_idx[c & (RECENT - 1)];

		if (buf[idx] < c + 1 && bad++ == 0)
			printf("FAIL: word %llu holds %llu, but write %llu stored %llu there\n",
			       (unsigned long long)idx, (unsigned long long)buf[idx], (unsigned long long)c,
			       (unsigned long long)(c + 1));
	}

	f = fopen(argv[2], "wb");
	if (!f || fwrite(logbuf, 16, logged, f) != logged || fclose(f)) {
		perror("rand_writer: writing the log");
		return 2;
	}
	printf("writes %llu logged %zu elapsed_s %.3f\n", (unsigned long long)count, logged,
	       (double)(now_ns() - t0) * 1e-9);
	if (bad) {
		printf("FAIL: %zu words wrong\n", bad);
		fflush(stdout);
		return 1;
	}
	printf("PASS\n");
	fflush(stdout);
	return 0;
}
