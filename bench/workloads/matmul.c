/*
 * matmul.c - iterated dense matrix multiplication, for
 * bench/matmul_incremental.py (the TIC-CKPT incremental-checkpoint workload).
 *
 *   matmul N SECONDS MULT_S
 *
 * Memory (glibc malloc, so each N x N matrix of doubles is its own mmap for
 * N >= 128): three matrices of N*N doubles, 8 MiB each for N = 1024.
 *   A  the current left operand;
 *   B  the right operand, written once at start and then only read;
 *   C  the product.
 * Each multiplication computes C = s * (A * B) with a cache-blocked i-k-j
 * loop: row panels of 16 rows of C, k-blocks of 256 (so the 256 rows of B in
 * use stay in L2), the inner j loop vectorized by the compiler; each panel is
 * scaled by s as soon as it is done.  So C is written once, progressively,
 * panel after panel.  The product then becomes the next left operand (power
 * iteration, A <- A*B/||A*B||): the A and C pointers are swapped, and s for
 * the next multiplication is 1 / max |a_ij| of the new A (tracked while the
 * panels were written), which keeps the entries near 1 without a separate
 * pass over the matrix.  So every multiplication writes one 8 MiB buffer
 * once, the two buffers alternate, and B is never written again.  C starts
 * out holding data (a hash, like A and B), as both A and C do in the steady
 * state, so that a full checkpoint sees all three matrices whenever it
 * comes.
 *
 * MULT_S = 0 runs at full speed.  MULT_S > 0 paces the computation so that
 * one multiplication takes MULT_S seconds (it sleeps after each panel until
 * the panel's share of MULT_S has passed): the write pattern of a slower
 * machine, such as TIC-CKPT's, where one multiplication took many seconds.
 *
 * After every multiplication it checks 8 entries of C, chosen by a hash,
 * against s times a fresh dot product of a row of A and a column of B
 * (relative error < 1e-9).  It runs for SECONDS (checked after every panel), then
 * prints "mults M panels P elapsed_s T cpu_s U" and "PASS" (or "FAIL: ..." and
 * exit 1).
 *
 * Single-threaded; no pipes, sockets or extra fds.  Start it with stdin from
 * /dev/null and stdout/stderr to a regular file so it can be checkpointed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define PANEL 16
#define KB 256

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_until(double t)
{
	struct timespec ts;

	ts.tv_sec = (time_t)t;
	ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* Rows [i0, i0 + PANEL) of C = s * (A * B); returns their max |c_ij|. */
static double panel(size_t n, const double *restrict a, const double *restrict b, double *restrict c, size_t i0,
		    double s)
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
	for (i = i0; i < iend; i++) {
		double *restrict ci = c + i * n;

		for (j = 0; j < n; j++) {
			ci[j] *= s;
			if (fabs(ci[j]) > mx)
				mx = fabs(ci[j]);
		}
	}
	return mx;
}

int main(int argc, char **argv)
{
	unsigned long long mults = 0, panels = 0;
	double seconds, mult_s, t_start, t_mult, scale = 1.0, mx;
	double *a, *b, *c;
	size_t n, i, p = 0;
	int done = 0;

	if (argc != 4) {
		fprintf(stderr, "usage: %s N SECONDS MULT_S\n", argv[0]);
		return 2;
	}
	n = strtoul(argv[1], NULL, 10);
	seconds = strtod(argv[2], NULL);
	mult_s = strtod(argv[3], NULL);
	if (n < PANEL || seconds <= 0 || mult_s < 0) {
		fprintf(stderr, "matmul: N >= %d, SECONDS > 0, MULT_S >= 0\n", PANEL);
		return 2;
	}
	a = malloc(n * n * sizeof(double));
	b = malloc(n * n * sizeof(double));
	c = malloc(n * n * sizeof(double));
	if (!a || !b || !c) {
		perror("matmul: malloc");
		return 2;
	}
	/* Entries in [-1, 1), from a hash of the index. */
	for (i = 0; i < n * n; i++) {
		a[i] = (double)(mix64(i ^ 0x41) >> 11) / (double)(1ull << 52) - 1.0;
		b[i] = (double)(mix64(i ^ 0x42) >> 11) / (double)(1ull << 52) - 1.0;
		c[i] = (double)(mix64(i ^ 0x43) >> 11) / (double)(1ull << 52) - 1.0;
	}

	t_start = now_s();
	t_mult = t_start;
	while (!done) {
		size_t i0;

		mx = 0.0;
		for (i0 = 0; i0 < n; i0 += PANEL) {
			double m = panel(n, a, b, c, i0, scale);

			if (m > mx)
				mx = m;
			panels++;
			if (mult_s > 0)
				sleep_until(t_mult + mult_s * (double)(i0 + PANEL) / (double)n);
			if (now_s() - t_start >= seconds) {
				done = 1;
				break;
			}
		}
		if (done)
			break;
		mults++;
		/* Check 8 entries of C against fresh dot products. */
		for (p = 0; p < 8; p++) {
			uint64_t h = mix64(mults * 8 + p);
			size_t r = h % n, col = (h >> 32) % n, k;
			double want = 0.0;

			for (k = 0; k < n; k++)
				want += a[r * n + k] * b[k * n + col];
			want *= scale;
			if (fabs(c[r * n + col] - want) > 1e-9 * (fabs(want) + 1.0)) {
				printf("FAIL: multiplication %llu: C[%zu][%zu] = %.17g, want %.17g\n", mults, r, col,
				       c[r * n + col], want);
				return 1;
			}
		}
		/* The product is the next A; the next product is scaled by
		 * 1 / max |a_ij|, so the entries stay near 1. */
		{
			double *t = a;

			a = c;
			c = t;
			if (mx == 0.0 || !isfinite(mx)) {
				printf("FAIL: multiplication %llu: max |entry| = %g\n", mults, mx);
				return 1;
			}
			scale = 1.0 / mx;
		}
		t_mult = now_s();
	}
	{
		struct timespec cpu;

		clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
		printf("mults %llu panels %llu elapsed_s %.3f cpu_s %.3f\n", mults, panels, now_s() - t_start,
		       (double)cpu.tv_sec + (double)cpu.tv_nsec * 1e-9);
	}
	printf("PASS\n");
	fflush(stdout);
	return 0;
}
