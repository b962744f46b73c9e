/* Shared helpers of the MPI workloads (see README.md): seeded inputs,
 * checksums, "polite" waits, the host report and the final PASS/FAIL line.
 *
 * Polite waits: every wait on a request is a loop of MPI_Test and short
 * nanosleeps (20 us doubling to 500 us). With 16 ranks on 2 cores, MPI's
 * own busy-polling waits would take the CPU from the ranks that have work;
 * here a waiting rank sleeps, and between two MPI_Test calls the bytes of
 * a message sit in the socket buffers (a checkpoint finds them there).
 * Nonblocking collectives (MPI_Iallreduce, MPI_Ibcast, ...) are used the
 * same way. */
#ifndef MPIW_H
#define MPIW_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int mpiw_rank, mpiw_size;
static double mpiw_t0;

#ifdef SELFTEST_CORRUPT
/* Runs STMT (a corruption of the result) only in the selftest build. */
#define MPIW_CORRUPT(stmt)                                                     \
    do {                                                                       \
        stmt;                                                                  \
        if (mpiw_rank == 0)                                                    \
            printf("selftest: corrupted %s\n", #stmt);                         \
    } while (0)
#else
#define MPIW_CORRUPT(stmt)                                                     \
    do {                                                                       \
    } while (0)
#endif

static inline uint64_t mpiw_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* splitmix64 stream. */
typedef struct {
    uint64_t s;
} mpiw_rng;

static inline uint64_t mpiw_next(mpiw_rng *r)
{
    r->s += 0x9e3779b97f4a7c15ULL;
    uint64_t z = r->s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A double in [-1, 1) that depends only on (seed, index). */
static inline double mpiw_unit(uint64_t seed, uint64_t index)
{
    uint64_t z = mpiw_mix64(seed * 0x100000001b3ULL ^ mpiw_mix64(index));
    return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* Checksums: an order-dependent chain of 64-bit words. */
static inline uint64_t mpiw_ck(uint64_t h, uint64_t v)
{
    return mpiw_mix64(h ^ v) + 0x632be59bd9b4e019ULL;
}

static inline uint64_t mpiw_ck_double(uint64_t h, double d)
{
    uint64_t v;
    memcpy(&v, &d, sizeof v);
    return mpiw_ck(h, v);
}

static inline uint64_t mpiw_ck_doubles(uint64_t h, const double *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = mpiw_ck_double(h, d[i]);
    return h;
}

static inline void mpiw_sleep_ns(long ns)
{
    struct timespec t = {0, ns};
    nanosleep(&t, NULL);
}

static inline void mpiw_waitall(int n, MPI_Request *reqs)
{
    long ns = 20000;
    for (;;) {
        int done = 0;
        MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (done)
            return;
        mpiw_sleep_ns(ns);
        if (ns < 500000)
            ns *= 2;
    }
}

static inline void mpiw_wait(MPI_Request *req, MPI_Status *st)
{
    long ns = 20000;
    for (;;) {
        int done = 0;
        MPI_Test(req, &done, st ? st : MPI_STATUS_IGNORE);
        if (done)
            return;
        mpiw_sleep_ns(ns);
        if (ns < 500000)
            ns *= 2;
    }
}

static inline void mpiw_allreduce(const void *in, void *out, int n, MPI_Datatype t, MPI_Op op)
{
    MPI_Request r;
    MPI_Iallreduce(in, out, n, t, op, MPI_COMM_WORLD, &r);
    mpiw_wait(&r, NULL);
}

static inline void mpiw_bcast(void *buf, int n, MPI_Datatype t, int root)
{
    MPI_Request r;
    MPI_Ibcast(buf, n, t, root, MPI_COMM_WORLD, &r);
    mpiw_wait(&r, NULL);
}

static inline void mpiw_barrier(void)
{
    MPI_Request r;
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    mpiw_wait(&r, NULL);
}

/* Adds TAG to the comma-separated list WHY (once). */
static inline void mpiw_tag(char *why, size_t size, const char *tag)
{
    size_t len = strlen(why), tl = strlen(tag);
    for (const char *p = why; (p = strstr(p, tag)) != NULL; p += tl)
        if ((p == why || p[-1] == ',') && (p[tl] == ',' || p[tl] == 0))
            return;
    if (len + tl + 2 <= size)
        snprintf(why + len, size - len, "%s%s", len ? "," : "", tag);
}

/* Positional argument I (1-based) as a positive integer, or DEF. */
static inline long mpiw_arg(int argc, char **argv, int i, long def, const char *name)
{
    if (argc <= i)
        return def;
    char *end;
    long v = strtol(argv[i], &end, 10);
    if (*end || v <= 0) {
        if (mpiw_rank == 0)
            fprintf(stderr, "bad argument %s: '%s' (a positive integer)\n", name, argv[i]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return v;
}

static inline void *mpiw_alloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "rank %d: out of memory (%zu bytes)\n", mpiw_rank, bytes);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return p;
}

/* MPI_Init, then rank 0 prints which host (MPI_Get_processor_name, the
 * UTS hostname) each rank runs on:
 *   hosts: 4 distinct: stasis-h1 stasis-h1 ... (rank order) */
static inline void mpiw_init(int *argc, char ***argv, const char *prog)
{
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &mpiw_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mpiw_size);
    setvbuf(stdout, NULL, _IOLBF, 0);
    char name[MPI_MAX_PROCESSOR_NAME] = {0};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    char *all = mpiw_alloc((size_t)mpiw_size * MPI_MAX_PROCESSOR_NAME);
    MPI_Request r;
    MPI_Igather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0,
                MPI_COMM_WORLD, &r);
    mpiw_wait(&r, NULL);
    if (mpiw_rank == 0) {
        int distinct = 0;
        for (int i = 0; i < mpiw_size; i++) {
            int seen = 0;
            for (int j = 0; j < i && !seen; j++)
                seen = !strcmp(all + (size_t)i * MPI_MAX_PROCESSOR_NAME,
                               all + (size_t)j * MPI_MAX_PROCESSOR_NAME);
            distinct += !seen;
        }
        printf("%s: %d ranks\n", prog, mpiw_size);
        printf("hosts: %d distinct:", distinct);
        for (int i = 0; i < mpiw_size; i++)
            printf(" %s", all + (size_t)i * MPI_MAX_PROCESSOR_NAME);
        printf("\n");
    }
    free(all);
    mpiw_t0 = MPI_Wtime();
}

/* Rank 0 prints "PROG: progress K/10" each time DONE of TOTAL steps
 * crosses a tenth (K = 1..9), so that a test can act at a known point of
 * the run, whatever the machine's load (a fraction of the CPU time is no
 * such point: ranks that wait for others spin). */
static inline void mpiw_progress(const char *prog, long done, long total)
{
    static long shown;
    if (mpiw_rank != 0 || total <= 0)
        return;
    long k = done * 10 / total;
    for (; shown < k && shown < 9; shown++)
        printf("%s: progress %ld/10\n", prog, shown + 1);
}

/* Ends the run: rank 0 prints the time, then exactly one final line,
 * "PASS <summary> checksum=<hex>" or "FAIL: <why>", and exits 1 on FAIL.
 * FAILS is only meaningful on rank 0. */
static inline int mpiw_finish(int fails, const char *why, const char *summary, uint64_t checksum)
{
    mpiw_barrier();
    if (mpiw_rank == 0) {
        printf("time: %.2f s\n", MPI_Wtime() - mpiw_t0);
        if (fails)
            printf("FAIL: %s (%d mismatches)\n", why, fails);
        else
            printf("PASS %s checksum=%016llx\n", summary, (unsigned long long)checksum);
        fflush(stdout);
    }
    MPI_Finalize();
    return mpiw_rank == 0 && fails ? 1 : 0;
}

#endif
