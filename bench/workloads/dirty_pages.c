/*
 * dirty_pages.c - a big process that dirties a share of its pages on request,
 * for bench/big_incremental.py.
 *
 *   dirty_pages CTLDIR SIZE_MIB BASIS_POINTS scattered|contiguous
 *
 * Maps SIZE_MIB MiB of private anonymous memory and writes every byte of it
 * (8-byte words, pattern(offset) = mix64(offset ^ SEED), as fill.c), writes
 * CTLDIR/pid and waits in sigwaitinfo() (SIGUSR1, SIGTERM blocked).
 *
 * Each SIGUSR1 is round k = 1, 2, ...: it writes the first word of
 * BASIS_POINTS / 10000 of its pages (100 = 1%) with a value that depends on
 * the page and k, and records k for that page in a one-byte-per-page
 * generation array (1 MiB for 4 GiB, malloc'ed).  scattered: each page with
 * that probability, chosen by a hash of (page, k), so the pages differ from
 * round to round and hardly any two are adjacent; contiguous: one run of
 * pages starting at a different place in each round.  It then publishes
 * CTLDIR/round.K: "pages P\nwrite_ns T\n".
 *
 * On SIGTERM it checks every word of the buffer against the pattern and the
 * generation array and prints PASS or FAIL: ... .
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

#define PAGE 4096ul
#define WORDS (PAGE / 8)
#define SEED 0x6469727479706773ull /* "dirtypgs" */

static inline uint64_t pattern(uint64_t off)
{
	return mix64(off ^ SEED);
}

static inline uint64_t stamp(uint64_t page, unsigned gen)
{
	return mix64((page << 8 | gen) ^ 0x7374616d70ull);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	unsigned long mib, bp, rounds = 0;
	uint64_t *buf, npages, i, w;
	unsigned char *gen;
	char path[4096], text[256];
	int contiguous, sig;
	sigset_t set;
	char *end;

	if (argc != 5) {
		fprintf(stderr, "usage: %s CTLDIR SIZE_MIB BASIS_POINTS scattered|contiguous\n", argv[0]);
		return 2;
	}
	errno = 0;
	mib = strtoul(argv[2], &end, 10);
	if (errno || *end || !mib) {
		fprintf(stderr, "dirty_pages: bad SIZE_MIB\n");
		return 2;
	}
	bp = strtoul(argv[3], &end, 10);
	if (*end || bp > 10000) {
		fprintf(stderr, "dirty_pages: BASIS_POINTS must be 0-10000\n");
		return 2;
	}
	contiguous = !strcmp(argv[4], "contiguous");
	if (!contiguous && strcmp(argv[4], "scattered")) {
		fprintf(stderr, "dirty_pages: pattern must be scattered or contiguous\n");
		return 2;
	}
	npages = ((uint64_t)mib << 20) / PAGE;

	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigaddset(&set, SIGTERM);
	if (sigprocmask(SIG_BLOCK, &set, NULL)) {
		perror("dirty_pages: sigprocmask");
		return 2;
	}
	buf = mmap(NULL, npages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	gen = calloc(npages, 1);
	if (buf == MAP_FAILED || !gen) {
		perror("dirty_pages: mmap");
		return 2;
	}
	for (i = 0; i < npages * WORDS; i++)
		buf[i] = pattern(i * 8);
	snprintf(path, sizeof(path), "%s/pid", argv[1]);
	if (write_pidfile(path)) {
		perror("dirty_pages: pidfile");
		return 2;
	}

	for (;;) {
		uint64_t t0, n = 0, want, first;

		sig = sigwaitinfo(&set, NULL);
		if (sig < 0) {
			if (errno == EINTR)
				continue;
			perror("dirty_pages: sigwaitinfo");
			return 2;
		}
		if (sig == SIGTERM)
			break;
		rounds++;
		if (rounds > 255) {
			fprintf(stderr, "dirty_pages: at most 255 rounds\n");
			return 2;
		}
		t0 = now_ns();
		if (contiguous) {
			want = npages * bp / 10000;
			first = want ? mix64(rounds) % (npages - want + 1) : 0;
			for (i = first; i < first + want; i++) {
				buf[i * WORDS] = stamp(i, (unsigned)rounds);
				gen[i] = (unsigned char)rounds;
				n++;
			}
		} else {
			for (i = 0; i < npages; i++) {
				if (mix64(i ^ (rounds << 48) ^ 0x5eed) % 10000 < bp) {
					buf[i * WORDS] = stamp(i, (unsigned)rounds);
					gen[i] = (unsigned char)rounds;
					n++;
				}
			}
		}
		snprintf(text, sizeof(text), "pages %llu\nwrite_ns %llu\n", (unsigned long long)n,
			 (unsigned long long)(now_ns() - t0));
		snprintf(path, sizeof(path), "%s/round.%lu", argv[1], rounds);
		if (publish_file(path, text)) {
			perror("dirty_pages: result file");
			return 2;
		}
	}

	for (i = 0; i < npages; i++) {
		for (w = 0; w < WORDS; w++) {
			uint64_t want = (w == 0 && gen[i]) ? stamp(i, gen[i]) : pattern((i * WORDS + w) * 8);

			if (buf[i * WORDS + w] != want) {
				printf("FAIL: page %llu word %llu (generation %u): got %016llx, want %016llx\n",
				       (unsigned long long)i, (unsigned long long)w, gen[i],
				       (unsigned long long)buf[i * WORDS + w], (unsigned long long)want);
				fflush(stdout);
				return 1;
			}
		}
	}
	printf("PASS\n");
	fflush(stdout);
	return 0;
}
