/*
 * fill.c - benchmark workload for bench/dump_restore.py.
 *
 *   fill PIDFILE SIZE_MIB
 *
 * Maps SIZE_MIB MiB of private anonymous memory, writes every byte with a
 * pattern that is a function of the offset (8-byte words, pattern(offset) =
 * mix64(offset ^ SEED), so no page is zero and no two pages are alike), then
 * writes its PID to PIDFILE (PIDFILE.tmp + rename) and sleeps in 50 ms
 * nanosleep()s until SIGTERM.  On SIGTERM it checks the whole buffer against
 * the pattern and prints "PASS" (exit 0) or "FAIL: ..." (exit 1).
 *
 * Single-threaded; no pipes, sockets or extra fds.  Start it with stdin from
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

#define SEED 0x66696c6c62656e63ull /* "fillbenc" */


static inline uint64_t pattern(uint64_t off)
{
	return mix64(off ^ SEED);
}

int main(int argc, char **argv)
{
	struct sigaction sa;
	struct timespec ts = { 0, 50 * 1000 * 1000 };
	uint64_t *buf, nwords, i, bad = 0, first_bad = 0;
	unsigned long mib;
	size_t size;
	char *end;

	if (argc != 3) {
		fprintf(stderr, "usage: %s PIDFILE SIZE_MIB\n", argv[0]);
		return 2;
	}
	errno = 0;
	mib = strtoul(argv[2], &end, 10);
	if (errno || *end || mib == 0) {
		fprintf(stderr, "fill: bad SIZE_MIB '%s'\n", argv[2]);
		return 2;
	}
	size = (size_t)mib << 20;
	nwords = size / sizeof(uint64_t);

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_term; /* no SA_RESTART */
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGTERM, &sa, NULL)) {
		perror("fill: sigaction");
		return 2;
	}

	buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		perror("fill: mmap");
		return 2;
	}
	for (i = 0; i < nwords; i++)
		buf[i] = pattern(i * sizeof(uint64_t));

	if (write_pidfile(argv[1])) {
		perror("fill: pidfile");
		return 2;
	}

	while (!stop)
		nanosleep(&ts, NULL); /* EINTR on SIGTERM: loop test sees stop */

	for (i = 0; i < nwords; i++) {
		if (buf[i] != pattern(i * sizeof(uint64_t))) {
			if (!bad)
				first_bad = i;
			bad++;
		}
	}
	if (bad) {
		printf("FAIL: %llu of %llu words differ, first at offset %llu (got %016llx, want %016llx)\n",
		       (unsigned long long)bad, (unsigned long long)nwords,
		       (unsigned long long)(first_bad * sizeof(uint64_t)),
		       (unsigned long long)buf[first_bad],
		       (unsigned long long)pattern(first_bad * sizeof(uint64_t)));
		fflush(stdout);
		return 1;
	}
	printf("PASS\n");
	fflush(stdout);
	return 0;
}
