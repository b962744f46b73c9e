/* A program that asks `stasis run` for transparent checkpoints at its own
 * safe points (stasis_request_checkpoint), for crates/stasis/tests/libstasis.rs.
 *
 * usage: request DIR ITERS REQ1 REQ2 OUT MARK
 * Protects a 4 MiB array and its loop state with libstasis (the monitoring
 * mode from STASIS_MONITOR), updates them for ITERS iterations, and asks
 * for a checkpoint at iterations REQ1 and REQ2, printing "request N: RC".
 * After a request at REQ1 that returned STASIS_SUCCESS, it goes on for 100
 * more iterations (work the kill will lose), writes its pid to MARK and
 * waits to be killed; a run restored from that checkpoint gets
 * STASIS_RESTORED from the same call and runs to the end. Outside
 * `stasis run` the requests return STASIS_ERR_NOT_UNDER_RUN and it runs
 * straight through. At the end it writes the array and state to OUT: every
 * run must write the same bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "stasis.h"

#define N (1u << 19) /* 4 MiB of u64 */

struct state { uint64_t it; uint64_t rng; };

static uint64_t next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

static void step(uint64_t *a, struct state *st) {
    for (int j = 0; j < 64; j++) {
        uint64_t r = next(&st->rng);
        a[r % N] += r | 1;
    }
    for (uint32_t i = (uint32_t)(st->it % 64) * (N / 64); i < (uint32_t)(st->it % 64 + 1) * (N / 64); i++)
        a[i] ^= st->it;
    st->it++;
}

static int ask(int which) {
    int rc = stasis_request_checkpoint();
    printf("request %d: %d%s%s\n", which, rc, rc < 0 ? " " : "", rc < 0 ? stasis_last_error() : "");
    fflush(stdout);
    if (rc < 0 && rc != STASIS_ERR_NOT_UNDER_RUN) exit(3);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: request DIR ITERS REQ1 REQ2 OUT MARK\n"); return 2; }
    uint64_t iters = strtoull(argv[2], 0, 10);
    uint64_t req1 = strtoull(argv[3], 0, 10), req2 = strtoull(argv[4], 0, 10);
    uint64_t *a = calloc(N, sizeof *a);
    struct state *st = calloc(1, sizeof *st);
    if (!a || !st) return 2;
    st->rng = 7;
    int rc;
    if ((rc = stasis_init(argv[1], NULL)) || (rc = stasis_protect(0, a, N * sizeof *a)) ||
        (rc = stasis_protect(1, st, sizeof *st))) {
        fprintf(stderr, "FAIL init: %s\n", stasis_last_error());
        return 2;
    }
    int first = -100;
    while (st->it < iters) {
        if (st->it == req1) first = ask(1);
        if (st->it == req2) ask(2);
        step(a, st);
        if (first == STASIS_SUCCESS && st->it == req1 + 100) {
            FILE *f = fopen(argv[6], "w");
            if (!f) return 2;
            fprintf(f, "%d\n", (int)getpid());
            fclose(f);
            for (;;) pause(); /* killed here */
        }
    }
    FILE *f = fopen(argv[5], "w");
    if (!f || fwrite(a, sizeof *a, N, f) != N || fwrite(st, sizeof *st, 1, f) != 1 || fclose(f)) return 2;
    stasis_finalize();
    printf("done\n");
    return 0;
}
