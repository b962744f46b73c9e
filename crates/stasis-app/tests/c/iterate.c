/* A self-checking iterative program for libstasis's kill/restart tests.
 *
 * usage: iterate DIR ITERS K OUT
 * Protects five regions (a streamed array, a randomly updated array, a
 * page-aligned mmap'd matrix, and two small heap objects that share a page
 * with malloc's own data), checkpoints "run" every K iterations, and on
 * start restores the newest complete version if there is one. At the end
 * it writes every region to OUT: a run killed any number of times and
 * restarted must write the same bytes as an uninterrupted one.
 * Everything the computation depends on lives in protected memory. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "stasis.h"

#define NA (1u << 16)          /* 512 KiB of doubles, streamed */
#define NB (1u << 19)          /* 4 MiB of u64, random updates */
#define NM (256u * 1024u)      /* 1 MiB matrix rows, a stencil sweep */

struct state { uint64_t it; uint64_t rng; };
struct small { uint64_t sum; uint32_t hist[17]; };

static uint64_t next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

static void die(const char *what, int rc) {
    fprintf(stderr, "FAIL %s: %d %s (%s)\n", what, rc, stasis_strerror(rc), stasis_last_error());
    exit(2);
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: iterate DIR ITERS K OUT\n"); return 2; }
    uint64_t iters = strtoull(argv[2], 0, 10), k = strtoull(argv[3], 0, 10);
    double *a = malloc(NA * sizeof *a);
    uint64_t *b = malloc(NB * sizeof *b);
    uint32_t *m = mmap(0, NM * sizeof *m, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct state *st = malloc(sizeof *st);
    struct small *sm = malloc(sizeof *sm);
    if (!a || !b || m == MAP_FAILED || !st || !sm) { fprintf(stderr, "FAIL alloc\n"); return 2; }
    for (uint32_t i = 0; i < NA; i++) a[i] = i * 0.25;
    memset(b, 0, NB * sizeof *b);
    for (uint32_t i = 0; i < NM; i++) m[i] = i;
    st->it = 0; st->rng = 42;
    memset(sm, 0, sizeof *sm);

    int rc;
    if ((rc = stasis_init(argv[1], NULL))) die("init", rc);
    if ((rc = stasis_protect(0, a, NA * sizeof *a))) die("protect a", rc);
    if ((rc = stasis_protect(1, b, NB * sizeof *b))) die("protect b", rc);
    if ((rc = stasis_protect(2, m, NM * sizeof *m))) die("protect m", rc);
    if ((rc = stasis_protect(3, st, sizeof *st))) die("protect st", rc);
    if ((rc = stasis_protect(4, sm, sizeof *sm))) die("protect sm", rc);
    int v = stasis_restart_test("run");
    if (v >= 0) {
        if ((rc = stasis_restart("run", v))) die("restart", rc);
        if (st->it != (uint64_t)v) { fprintf(stderr, "FAIL restored it=%llu, version %d\n", (unsigned long long)st->it, v); return 2; }
        printf("restarted %d\n", v);
    } else if (v != STASIS_NONE) {
        die("restart_test", v);
    }
    fflush(stdout);
    for (; st->it < iters;) {
        uint64_t it = st->it;
        uint32_t lo = (uint32_t)(it % 8) * (NA / 8);
        for (uint32_t i = lo; i < lo + NA / 8; i++) a[i] = a[i] * 0.5 + (double)(it + i);
        for (int j = 0; j < 64; j++) { uint64_t r = next(&st->rng); b[r % NB] ^= r; sm->hist[r % 17]++; }
        uint32_t row = (uint32_t)(next(&st->rng) % (NM / 1024 - 2)) + 1;
        for (uint32_t r = row; r < row + 32 && r < NM / 1024 - 1; r++)
            for (uint32_t c = 0; c < 1024; c++) m[r * 1024 + c] += m[(r - 1) * 1024 + c] / 2 + m[(r + 1) * 1024 + c] / 4;
        sm->sum += (uint64_t)a[lo] + b[it % NB];
        st->it = it + 1;
        if (st->it % k == 0 && (rc = stasis_checkpoint("run", (int)st->it))) die("checkpoint", rc);
    }
    struct stasis_stats s;
    if ((rc = stasis_stats(&s))) die("stats", rc);
    if ((rc = stasis_finalize())) die("finalize", rc);
    FILE *f = fopen(argv[4], "wb");
    if (!f) { fprintf(stderr, "FAIL open out\n"); return 2; }
    fwrite(a, sizeof *a, NA, f); fwrite(b, sizeof *b, NB, f); fwrite(m, sizeof *m, NM, f);
    fwrite(st, sizeof *st, 1, f); fwrite(sm, sizeof *sm, 1, f);
    fclose(f);
    printf("done monitor=%d checkpoints=%llu faults=%llu pieces=%llu copied=%llu\n", s.monitor,
           (unsigned long long)s.checkpoints, (unsigned long long)s.faults,
           (unsigned long long)s.pieces_released, (unsigned long long)s.bytes_copied);
    return 0;
}
