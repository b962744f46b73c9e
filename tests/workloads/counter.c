/*
 * counter.c - the demo workload, meant to be watched by a human.
 *
 *   counter PIDFILE [MAX_TICKS]     (0 or absent = unlimited)
 *
 * A 16 MiB buffer of 64-bit words starts as a pure function of the word
 * index.  Every 200 ms tick N (1, 2, ...) rewrites 4096 pseudo-randomly
 * chosen words, each new value depending on the old one (so the order of
 * the ticks matters), then computes S = a position-weighted sum of the whole
 * buffer and prints, with fflush:
 *
 *   tick N sum S                   (S as 16 hex digits; "tick 0" at start)
 *
 * On SIGTERM, or after MAX_TICKS ticks, it rebuilds the buffer from scratch
 * in a second allocation by replaying ticks 1..N, compares both buffers word
 * for word and the recomputed sum with the last printed one, and prints
 * PASS or FAIL.  Unlike the other workloads it prints while running; the
 * output is fully determined by the number of ticks.
 */
#include "zdtm.h"

#define BUF_SIZE    (16u << 20)
#define NWORDS      (BUF_SIZE / 8)
#define PER_TICK    4096
#define TICK_MS     200
#define SEED_INIT   0x636f756e74657200ull

static void init_buf(uint64_t *b)
{
	size_t i;

	for (i = 0; i < NWORDS; i++)
		b[i] = zdtm_mix64(SEED_INIT ^ i);
}

static void do_tick(uint64_t *b, uint64_t n)
{
	uint64_t j;

	for (j = 0; j < PER_TICK; j++) {
		uint64_t p = zdtm_mix64(n * PER_TICK + j) % NWORDS;

		b[p] = zdtm_mix64(b[p] ^ n);
	}
}

static uint64_t checksum(const uint64_t *b)
{
	uint64_t s = 0;
	size_t i;

	for (i = 0; i < NWORDS; i++)
		s += b[i] * (2 * i + 1);
	return s;
}

int main(int argc, char **argv)
{
	unsigned long long max_ticks = 0;
	uint64_t *buf, *ref, n = 0, sum;

	zdtm_init(argc, argv, 1, "[MAX_TICKS]");
	if (argc > 2) {
		char *end;

		max_ticks = strtoull(argv[2], &end, 0);
		if (*end) {
			fprintf(stderr, "bad MAX_TICKS '%s'\n", argv[2]);
			return 2;
		}
	}
	buf = malloc(BUF_SIZE);
	if (!buf)
		zdtm_die("malloc");
	init_buf(buf);
	sum = checksum(buf);

	zdtm_ready();
	printf("tick %llu sum %016llx\n", (unsigned long long)n,
	       (unsigned long long)sum);
	fflush(stdout);

	while (!zdtm_stop && (max_ticks == 0 || n < max_ticks)) {
		struct timespec ts = { TICK_MS / 1000,
				       (TICK_MS % 1000) * 1000000l };

		if (nanosleep(&ts, NULL) && zdtm_stop)
			break;
		n++;
		do_tick(buf, n);
		sum = checksum(buf);
		printf("tick %llu sum %016llx\n", (unsigned long long)n,
		       (unsigned long long)sum);
		fflush(stdout);
	}

	ZDTM_CORRUPT("buffer", buf[NWORDS / 3] ^= 1ull << 40);
	ZDTM_CORRUPT("sum", sum += 1);

	ref = malloc(BUF_SIZE);
	if (!ref)
		zdtm_die("malloc reference");
	init_buf(ref);
	{
		uint64_t t;
		size_t i, bad = 0, first = 0;

		for (t = 1; t <= n; t++)
			do_tick(ref, t);
		for (i = 0; i < NWORDS; i++)
			if (buf[i] != ref[i] && !bad++)
				first = i;
		zdtm_check(bad == 0, "buffer",
			   "after %llu ticks: %zu of %u words differ, first "
			   "word %zu (byte offset %#zx): %#llx, expected %#llx",
			   (unsigned long long)n, bad, NWORDS, first,
			   first * 8, (unsigned long long)buf[first],
			   (unsigned long long)ref[first]);
		zdtm_check(sum == checksum(ref), "sum",
			   "last printed sum %016llx, recomputed %016llx",
			   (unsigned long long)sum,
			   (unsigned long long)checksum(ref));
	}
	zdtm_finish();
}
