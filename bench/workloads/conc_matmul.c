/*
 * conc_matmul.c - the TIC-CKPT downtime workload, for
 * bench/concurrent_downtime.py: iterated dense matrix multiplication that
 * keeps writing, plus an optional large working set it keeps writing
 * through.
 *
 *   conc_matmul PIDFILE N WS_MIB WS_PASS_S THP
 *
 * Three N x N matrices of doubles (A, B, C), each its own mmap. Every
 * round computes C = A * B (cache-blocked i-k-j loop, 16-row panels), checks
 * 4 entries of C against fresh dot products, then perturbs A:
 * A = 0.5 A + 0.5 C / max|C| (every entry of A is written, and stays in
 * [0, 1]). So each round writes all of C and all of A; B is only read.
 *
 * WS_MIB > 0 adds a working set of that many MiB (its own mmap, every byte
 * written at start so no page is zero). The program writes one 64-bit word
 * in each of its pages in turn, paced so that one pass over all the pages
 * takes WS_PASS_S seconds (the writes are spread over the panels; after a
 * stop it catches up, at most one pass at a time). WS_PASS_S = 0 makes no
 * writes to it after the start (it is only held).
 *
 * THP = 1 asks for transparent huge pages on every mapping
 * (MADV_HUGEPAGE), THP = 0 refuses them (MADV_NOHUGEPAGE), whatever the
 * system default.
 *
 * It writes its PID file once everything is written, and runs until SIGTERM;
 * then prints "rounds R ws_writes W elapsed_s T" and "PASS" (exit 0). A
 * wrong product prints "FAIL: ..." and exits 1 at once.
 *
 * Single-threaded; no pipes, sockets or extra fds. Start it with stdin from
 * /dev/null and stdout/stderr to a regular file so it can be checkpointed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define PANEL 16
#define KB 256
#define PAGE 4096

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *map(size_t size, int thp)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		perror("conc_matmul: mmap");
		exit(2);
	}
	/* Best effort: a kernel without THP refuses both. */
	(void)madvise(p, size, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	return p;
}

/* Rows [i0, i0 + PANEL) of C = A * B; returns their max |c_ij|. */
static double panel(size_t n, const double *restrict a, const double *restrict b, double *restrict c, size_t i0)
{
	size_t i, j, k, kk, iend = i0 + PANEL < n ? i0 + PANEL : n;
	double mx = 0.0;

	for (i = i0; i < iend; i++)
		memset(c + i * n, 0, n * sizeof(double));
	for (kk = 0; kk < n; kk += KB) {
		size_t kend = kk + KB < n ? kk + KB : n;

		for (i = i0; i < iend; i++) {
			double *restrict ci = c + i * n;

			for (k = kk; k < kend; k++) {
				double aik = a[i * n + k];
				const double *restrict bk = b + k * n;

				for (j = 0; j < n; j++)
					ci[j] += aik * bk[j];
			}
		}
	}
	for (i = i0; i < iend; i++)
		for (j = 0; j < n; j++)
			if (fabs(c[i * n + j]) > mx)
				mx = fabs(c[i * n + j]);
	return mx;
}

/* The working set: one word per page, paced to one pass per pass_s. */
static uint64_t *ws;
static size_t ws_pages;
static double ws_pass_s, t0;
static unsigned long long ws_done;

static void pace_ws(void)
{
	unsigned long long due, limit;

	if (!ws_pages || ws_pass_s <= 0)
		return;
	due = (unsigned long long)((now_s() - t0) / ws_pass_s * (double)ws_pages);
	limit = ws_done + ws_pages; /* catch up at most one pass */
	if (due > limit)
		ws_done = due - ws_pages;
	while (ws_done < due) {
		size_t pg = (size_t)(ws_done % ws_pages);

		ws[pg * (PAGE / 8) + (ws_done / ws_pages) % (PAGE / 8)] = mix64(ws_done);
		ws_done++;
	}
}

int main(int argc, char **argv)
{
	unsigned long long rounds = 0;
	struct sigaction sa;
	double *a, *b, *c;
	size_t n, i, ws_mib;
	int thp;

	if (argc != 6) {
		fprintf(stderr, "usage: %s PIDFILE N WS_MIB WS_PASS_S THP\n", argv[0]);
		return 2;
	}
	n = strtoul(argv[2], NULL, 10);
	ws_mib = strtoul(argv[3], NULL, 10);
	ws_pass_s = strtod(argv[4], NULL);
	thp = atoi(argv[5]);
	if (n < PANEL || ws_pass_s < 0) {
		fprintf(stderr, "conc_matmul: N >= %d, WS_PASS_S >= 0\n", PANEL);
		return 2;
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_term;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGTERM, &sa, NULL)) {
		perror("conc_matmul: sigaction");
		return 2;
	}

	a = map(n * n * sizeof(double), thp);
	b = map(n * n * sizeof(double), thp);
	c = map(n * n * sizeof(double), thp);
	/* Entries in [0, 1) for A, [0, 1/n) for B, from a hash of the index. */
	for (i = 0; i < n * n; i++) {
		a[i] = (double)(mix64(i ^ 0x41) >> 11) / (double)(1ull << 53);
		b[i] = (double)(mix64(i ^ 0x42) >> 11) / (double)(1ull << 53) / (double)n;
		c[i] = (double)(mix64(i ^ 0x43) >> 11) / (double)(1ull << 53);
	}
	if (ws_mib) {
		size_t words = ws_mib << 17;

		ws = map(ws_mib << 20, thp);
		ws_pages = (ws_mib << 20) / PAGE;
		for (i = 0; i < words; i++)
			ws[i] = mix64(i ^ 0x5753);
	}
	if (write_pidfile(argv[1])) {
		perror("conc_matmul: pidfile");
		return 2;
	}

	t0 = now_s();
	while (!stop) {
		size_t i0, p;
		double mx = 0.0, s;

		for (i0 = 0; i0 < n; i0 += PANEL) {
			double m = panel(n, a, b, c, i0);

			if (m > mx)
				mx = m;
			pace_ws();
		}
		rounds++;
		for (p = 0; p < 4; p++) {
			uint64_t h = mix64(rounds * 4 + p);
			size_t r = h % n, col = (h >> 32) % n, k;
			double want = 0.0;

			for (k = 0; k < n; k++)
				want += a[r * n + k] * b[k * n + col];
			if (fabs(c[r * n + col] - want) > 1e-9 * (fabs(want) + 1e-300)) {
				printf("FAIL: round %llu: C[%zu][%zu] = %.17g, want %.17g\n", rounds, r, col,
				       c[r * n + col], want);
				fflush(stdout);
				return 1;
			}
		}
		if (mx == 0.0 || !isfinite(mx)) {
			printf("FAIL: round %llu: max |c_ij| = %g\n", rounds, mx);
			fflush(stdout);
			return 1;
		}
		s = 0.5 / mx;
		for (i = 0; i < n * n; i++)
			a[i] = 0.5 * a[i] + s * c[i];
		pace_ws();
	}
	printf("rounds %llu ws_writes %llu elapsed_s %.3f\n", rounds, ws_done, now_s() - t0);
	printf("PASS\n");
	fflush(stdout);
	return 0;
}
