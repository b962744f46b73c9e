/* ACCK benchmark kernels: one region of MB MiB, STEPS steps, a checkpoint
 * every EVERY steps, monitoring from STASIS_MONITOR ("none": no library
 * call at all, the compute-only baseline).
 *
 * usage: kernels KERNEL MB STEPS EVERY DIR
 * kernels: stream (blackscholes-like), stencil (ocean/sor), fft, radix,
 *          random (canneal-like), scattered (freqmine-like)
 * prints one line of key=value. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include "stasis.h"

static uint64_t rng = 88172645463325252ull;
static inline uint64_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static void stream(double *a, size_t n, int s) { for (size_t i = 0; i < n; i++) a[i] = a[i] * 0.9999 + s; }

static void stencil(double *a, size_t n, int s) {
    size_t row = 4096, rows = n / row, band = rows / 4, r0 = 1 + (size_t)s * band / 2 % (rows - band - 1);
    for (size_t r = r0; r < r0 + band; r++)
        for (size_t c = 1; c < row - 1; c++)
            a[r * row + c] = 0.25 * (a[(r - 1) * row + c] + a[(r + 1) * row + c] + a[r * row + c - 1] + a[r * row + c + 1]);
}

static void fft(double *a, size_t n, int s) {
    size_t half = n / 2, stride = (size_t)1 << (s % 12), q = n / 4, base = (size_t)(s % 4) * q / 2;
    for (size_t i = base; i < base + q / 2 && i + stride < half; i += 2) {
        double x = a[i], y = a[i + stride];
        a[i] = x + y; a[i + stride] = (x - y) * 0.7071;
    }
}

static void radix(double *a, size_t n, int s) {
    uint64_t *k = (uint64_t *)a, *src = k, *dst = k + n / 2;
    if (s & 1) { uint64_t *t = src; src = dst; dst = t; }
    size_t m = n / 2, cnt[256] = {0};
    int shift = (s % 8) * 8;
    for (size_t i = 0; i < m; i++) cnt[(src[i] >> shift) & 255]++;
    size_t pos = 0;
    for (int b = 0; b < 256; b++) { size_t c = cnt[b]; cnt[b] = pos; pos += c; }
    for (size_t i = 0; i < m; i++) dst[cnt[(src[i] >> shift) & 255]++] = src[i];
}

static void randomk(double *a, size_t n, int s) {
    for (size_t j = 0; j < n / 512; j++) { size_t x = rnd() % n, y = rnd() % n; double t = a[x]; a[x] = a[y] + s; a[y] = t; }
}

static void scattered(double *a, size_t n, int s) {
    size_t pages = n / 512;
    for (size_t j = 0; j < pages / 64; j++) {
        size_t p = rnd() % (pages - 8), len = 1 + rnd() % 8;
        for (size_t q = p; q < p + len; q++) a[q * 512 + (size_t)s % 512] += 1.0;
    }
}

int main(int argc, char **argv) {
    if (argc != 6) { fprintf(stderr, "usage: kernels KERNEL MB STEPS EVERY DIR\n"); return 2; }
    const char *k = argv[1];
    size_t n = (size_t)atol(argv[2]) << 17;
    int steps = atoi(argv[3]), every = atoi(argv[4]);
    void (*f)(double *, size_t, int) =
        !strcmp(k, "stream") ? stream : !strcmp(k, "stencil") ? stencil : !strcmp(k, "fft") ? fft :
        !strcmp(k, "radix") ? radix : !strcmp(k, "random") ? randomk : !strcmp(k, "scattered") ? scattered : 0;
    if (!f) { fprintf(stderr, "unknown kernel %s\n", k); return 2; }
    double *a = mmap(0, n * sizeof *a, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (size_t i = 0; i < n; i++) a[i] = (double)(rnd() % 1000);
    const char *mon = getenv("STASIS_MONITOR");
    int lib = !(mon && !strcmp(mon, "none"));
    int rc;
    double t0 = now(), ck = 0;
    if (lib && ((rc = stasis_init(argv[5], NULL)) || (rc = stasis_protect(0, a, n * sizeof *a)))) {
        fprintf(stderr, "stasis: %s\n", stasis_last_error()); return 1;
    }
    for (int s = 0; s < steps; s++) {
        f(a, n, s);
        if (lib && (s + 1) % every == 0) {
            double c0 = now();
            if ((rc = stasis_checkpoint("bench", s + 1))) { fprintf(stderr, "stasis: %s\n", stasis_last_error()); return 1; }
            ck += now() - c0;
        }
    }
    double total = now() - t0;
    struct stasis_stats st = {0};
    if (lib) { stasis_stats(&st); stasis_finalize(); }
    double sum = 0;
    for (size_t i = 0; i < n; i += 4099) sum += a[i];
    printf("kernel=%s mode=%s total_s=%.6f ckpt_s=%.6f faults=%llu pieces=%llu huge=%llu copied=%llu written=%llu monitor_s=%.6f copy_s=%.6f write_s=%.6f check=%g\n",
           k, lib ? mon : "none", total, ck, (unsigned long long)st.faults, (unsigned long long)st.pieces_released,
           (unsigned long long)st.huge_collapsed, (unsigned long long)st.bytes_copied, (unsigned long long)st.bytes_written,
           st.monitor_ns * 1e-9, st.copy_ns * 1e-9, st.write_ns * 1e-9, sum);
    return 0;
}
