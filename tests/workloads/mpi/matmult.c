/* matmult N PRODUCTS: C = A B for seeded N x N integer matrices (entries
 * in -8..8, held in doubles: every product and sum is exact), PRODUCTS
 * times with new matrices.
 *
 * Rank r owns a block of rows of A and C, and starts with block r of the
 * columns of B. In P steps it multiplies by the column block it holds
 * while passing that block on around a ring (MPI_Isend to r-1, MPI_Irecv
 * from r+1), so blocks of B are always on the wire. After each product
 * every rank checks its rows with Freivalds' test (C r == A (B r), exact)
 * and the ranks reduce the error count and a checksum. At the end rank 0
 * gathers the last C, recomputes some rows serially, and runs Freivalds'
 * test on the whole matrix with another vector. */
#include "mpiw.h"

static uint64_t seed_of(int prod, int which) { return 0x3a7 + 2 * (uint64_t)prod + (uint64_t)which; }

static double entry(int prod, int which, int n, int i, int j)
{
    uint64_t z = mpiw_mix64(seed_of(prod, which) * 0x100000001b3ULL ^ ((uint64_t)i * (uint64_t)n + (uint64_t)j));
    return (double)(int)(z % 17) - 8.0;
}

static int lo_of(int n, int q) { return (int)((long)n * q / mpiw_size); }

/* B r for the vector r_j = 1 + (mix(seed, j) % 7), from B's definition. */
static void b_times_r(int prod, int n, uint64_t rseed, double *out)
{
    for (int i = 0; i < n; i++) {
        double v = 0;
        for (int j = 0; j < n; j++)
            v += entry(prod, 1, n, i, j) * (double)(1 + mpiw_mix64(rseed + (uint64_t)j) % 7);
        out[i] = v;
    }
}

/* Rows [lo, hi) of C (row-major, n columns) against A (B r): wrong rows. */
static int freivalds(int prod, int n, int lo, int hi, const double *c, uint64_t rseed, double *br)
{
    b_times_r(prod, n, rseed, br);
    int bad = 0;
    for (int i = lo; i < hi; i++) {
        double cr = 0, abr = 0;
        for (int j = 0; j < n; j++) {
            cr += c[(size_t)(i - lo) * n + j] * (double)(1 + mpiw_mix64(rseed + (uint64_t)j) % 7);
            abr += entry(prod, 0, n, i, j) * br[j];
        }
        bad += cr != abr;
    }
    return bad;
}

static void product(int prod, int n, double *a, double *c, double *blk[2], int wmax)
{
    int r = mpiw_rank, p = mpiw_size, lo = lo_of(n, r), rows = lo_of(n, r + 1) - lo;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < n; j++)
            a[(size_t)i * n + j] = entry(prod, 0, n, lo + i, j);
    memset(c, 0, sizeof(double) * (size_t)rows * n);
    int b0 = lo_of(n, r), w = lo_of(n, r + 1) - b0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < w; j++)
            blk[0][(size_t)i * wmax + j] = entry(prod, 1, n, i, b0 + j);
    for (int s = 0, cur = 0; s < p; s++, cur ^= 1) {
        int b = (r + s) % p;
        int bl = lo_of(n, b), bw = lo_of(n, b + 1) - bl;
        MPI_Request q[2];
        int moving = s < p - 1;
        if (moving) {
            MPI_Irecv(blk[cur ^ 1], n * wmax, MPI_DOUBLE, (r + 1) % p, s, MPI_COMM_WORLD, &q[0]);
            MPI_Isend(blk[cur], n * wmax, MPI_DOUBLE, (r + p - 1) % p, s, MPI_COMM_WORLD, &q[1]);
        }
        for (int i = 0; i < rows; i++) {
            double *ci = c + (size_t)i * n + bl;
            for (int k = 0; k < n; k++) {
                double aik = a[(size_t)i * n + k];
                const double *bk = blk[cur] + (size_t)k * wmax;
                for (int j = 0; j < bw; j++)
                    ci[j] += aik * bk[j];
            }
        }
        if (moving)
            mpiw_waitall(2, q);
    }
}

int main(int argc, char **argv)
{
    mpiw_init(&argc, &argv, "matmult");
    int n = (int)mpiw_arg(argc, argv, 1, 640, "N");
    int prods = (int)mpiw_arg(argc, argv, 2, 200, "PRODUCTS");
    if (n < mpiw_size || n > 8192) {
        if (mpiw_rank == 0)
            fprintf(stderr, "N must be in %d..8192\n", mpiw_size);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (mpiw_rank == 0)
        printf("matmult: n=%d products=%d\n", n, prods);
    int lo = lo_of(n, mpiw_rank), rows = lo_of(n, mpiw_rank + 1) - lo, wmax = 0;
    for (int q = 0; q < mpiw_size; q++)
        wmax = lo_of(n, q + 1) - lo_of(n, q) > wmax ? lo_of(n, q + 1) - lo_of(n, q) : wmax;
    double *a = mpiw_alloc(sizeof(double) * (size_t)rows * n), *c = mpiw_alloc(sizeof(double) * (size_t)rows * n);
    double *blk[2] = {mpiw_alloc(sizeof(double) * (size_t)n * wmax), mpiw_alloc(sizeof(double) * (size_t)n * wmax)};
    double *br = mpiw_alloc(sizeof(double) * (size_t)n);
    int fails = 0;
    char why[64] = "";
    uint64_t ck = 0;
    for (int prod = 0; prod < prods; prod++) {
        product(prod, n, a, c, blk, wmax);
        long long local[2] = {freivalds(prod, n, lo, lo + rows, c, 0x51 + (uint64_t)prod, br), 0}, sum[2];
        uint64_t s = 0, total = 0;
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < n; j++)
                s += mpiw_mix64((uint64_t)(lo + i) * (uint64_t)n + (uint64_t)j) *
                     (uint64_t)(int64_t)c[(size_t)i * n + j];
        mpiw_allreduce(local, sum, 2, MPI_LONG_LONG, MPI_SUM);
        mpiw_allreduce(&s, &total, 1, MPI_UINT64_T, MPI_SUM);
        ck = mpiw_ck(ck, total);
        if (mpiw_rank == 0 && sum[0]) {
            printf("mismatch[freivalds]: product %d: %lld rows fail C r == A (B r)\n", prod, sum[0]);
            fails++;
            mpiw_tag(why, sizeof why, "freivalds");
        }
    }
    /* The last C on rank 0. */
    int *counts = NULL, *displs = NULL;
    double *all = NULL;
    if (mpiw_rank == 0) {
        counts = mpiw_alloc(sizeof(int) * (size_t)mpiw_size);
        displs = mpiw_alloc(sizeof(int) * (size_t)mpiw_size);
        for (int q = 0; q < mpiw_size; q++) {
            displs[q] = lo_of(n, q) * n;
            counts[q] = (lo_of(n, q + 1) - lo_of(n, q)) * n;
        }
        all = mpiw_alloc(sizeof(double) * (size_t)n * n);
    }
    MPI_Request req;
    MPI_Igatherv(c, rows * n, MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, 0, MPI_COMM_WORLD, &req);
    mpiw_wait(&req, NULL);
    if (mpiw_rank == 0) {
        int last = prods - 1;
        MPIW_CORRUPT(all[(size_t)n * n / 2 + 1] += 1);
        int bad = freivalds(last, n, 0, n, all, 0xf00d, br);
        if (bad) {
            printf("mismatch[final]: %d rows of the gathered C fail Freivalds' test\n", bad);
            fails++;
            mpiw_tag(why, sizeof why, "final");
        }
        for (int t = 0; t < 4; t++) {
            int i = (int)((long)n * t / 4 + t);
            for (int j = 0; j < n; j++) {
                double v = 0;
                for (int k = 0; k < n; k++)
                    v += entry(last, 0, n, i, k) * entry(last, 1, n, k, j);
                if (v != all[(size_t)i * n + j]) {
                    printf("mismatch[serial]: C[%d][%d] = %.0f, serially %.0f\n", i, j, all[(size_t)i * n + j], v);
                    fails++;
                    mpiw_tag(why, sizeof why, "serial");
                    break;
                }
            }
        }
        free(counts);
        free(displs);
        free(all);
    }
    char summary[128];
    snprintf(summary, sizeof summary, "matmult n=%d products=%d", n, prods);
    free(a);
    free(c);
    free(blk[0]);
    free(blk[1]);
    free(br);
    return mpiw_finish(fails, why, summary, ck);
}
