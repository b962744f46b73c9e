/* sor N ITERS: red-black successive over-relaxation (omega 1.5) of the
 * Laplace equation on an N x N grid with fixed, seeded boundary values,
 * ITERS iterations.
 *
 * Rank r owns a block of rows (plus one ghost row above and below). Each
 * iteration updates the red points, exchanges the edge rows with both
 * neighbours (MPI_Isend/MPI_Irecv), updates the black points and
 * exchanges again: the whole grid is rewritten every iteration. Every 50
 * iterations the ranks reduce the squared change (MPI_Iallreduce). At the
 * end rank 0 gathers the grid and compares it, bit for bit, with the same
 * iterations run serially (same update order per point: red-black makes
 * the parallel and serial sweeps identical). */
#include "mpiw.h"

#define OMEGA 1.5

static int lo_of(int n, int q) { return 1 + (int)((long)(n - 2) * q / mpiw_size); }

static double boundary(int n, int i, int j)
{
    if (i == 0 || j == 0 || i == n - 1 || j == n - 1)
        return mpiw_unit(0x50f, (uint64_t)i * (uint64_t)n + (uint64_t)j) * 100.0;
    return 0.0;
}

/* One colour over rows [r0, r1) of G (global row i at G + (i - base) * n). */
static double sweep(double *g, int base, int n, int r0, int r1, int colour)
{
    double change = 0;
    for (int i = r0; i < r1; i++) {
        double *row = g + (size_t)(i - base) * n, *up = row - n, *down = row + n;
        for (int j = 1 + ((i + 1 + colour) & 1); j < n - 1; j += 2) {
            double v = row[j] + OMEGA * (0.25 * (up[j] + down[j] + row[j - 1] + row[j + 1]) - row[j]);
            change += (v - row[j]) * (v - row[j]);
            row[j] = v;
        }
    }
    return change;
}

/* Sends my first and last rows, receives the ghost rows. */
static void exchange(double *g, int base, int n, int r0, int r1)
{
    MPI_Request q[4];
    int k = 0, up = mpiw_rank - 1, down = mpiw_rank + 1;
    if (up >= 0) {
        MPI_Irecv(g + (size_t)(r0 - 1 - base) * n, n, MPI_DOUBLE, up, 1, MPI_COMM_WORLD, &q[k++]);
        MPI_Isend(g + (size_t)(r0 - base) * n, n, MPI_DOUBLE, up, 0, MPI_COMM_WORLD, &q[k++]);
    }
    if (down < mpiw_size) {
        MPI_Irecv(g + (size_t)(r1 - base) * n, n, MPI_DOUBLE, down, 0, MPI_COMM_WORLD, &q[k++]);
        MPI_Isend(g + (size_t)(r1 - 1 - base) * n, n, MPI_DOUBLE, down, 1, MPI_COMM_WORLD, &q[k++]);
    }
    mpiw_waitall(k, q);
}

int main(int argc, char **argv)
{
    mpiw_init(&argc, &argv, "sor");
    int n = (int)mpiw_arg(argc, argv, 1, 512, "N");
    int iters = (int)mpiw_arg(argc, argv, 2, 8000, "ITERS");
    if (n < mpiw_size + 2 || n > 16384) {
        if (mpiw_rank == 0)
            fprintf(stderr, "N must be in %d..16384\n", mpiw_size + 2);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (mpiw_rank == 0)
        printf("sor: n=%d iters=%d\n", n, iters);
    int r0 = lo_of(n, mpiw_rank), r1 = lo_of(n, mpiw_rank + 1), base = r0 - 1;
    double *g = mpiw_alloc(sizeof(double) * (size_t)(r1 - r0 + 2) * n);
    for (int i = base; i <= r1; i++)
        for (int j = 0; j < n; j++)
            g[(size_t)(i - base) * n + j] = boundary(n, i, j);
    int fails = 0;
    char why[64] = "";
    for (int it = 0; it < iters; it++) {
        double change = sweep(g, base, n, r0, r1, 0);
        exchange(g, base, n, r0, r1);
        change += sweep(g, base, n, r0, r1, 1);
        exchange(g, base, n, r0, r1);
        if (it % 50 == 49 || it == iters - 1) {
            double total;
            mpiw_allreduce(&change, &total, 1, MPI_DOUBLE, MPI_SUM);
            if (mpiw_rank == 0 && it == iters - 1)
                printf("sor: last squared change %.6g\n", total);
        }
        mpiw_progress("sor", it + 1, iters);
    }
    /* Rank 0 gathers the interior rows 1..n-2. */
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
    MPI_Igatherv(g + n, (r1 - r0) * n, MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, 0, MPI_COMM_WORLD, &req);
    mpiw_wait(&req, NULL);
    uint64_t ck = 0;
    if (mpiw_rank == 0) {
        double *s = mpiw_alloc(sizeof(double) * (size_t)n * n);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                s[(size_t)i * n + j] = boundary(n, i, j);
        for (int it = 0; it < iters; it++) {
            sweep(s, 0, n, 1, n - 1, 0);
            sweep(s, 0, n, 1, n - 1, 1);
        }
        MPIW_CORRUPT(all[(size_t)(n / 2) * n + n / 3] += 1e-9);
        for (int i = 1; i < n - 1 && !fails; i++)
            for (int j = 0; j < n; j++)
                if (memcmp(&all[(size_t)i * n + j], &s[(size_t)i * n + j], sizeof(double))) {
                    printf("mismatch[serial]: g[%d][%d] = %.17g, serially %.17g\n", i, j, all[(size_t)i * n + j],
                           s[(size_t)i * n + j]);
                    fails++;
                    mpiw_tag(why, sizeof why, "serial");
                    break;
                }
        ck = mpiw_ck_doubles(0, all + n, (size_t)(n - 2) * n);
        free(s);
        free(counts);
        free(displs);
        free(all);
    }
    char summary[128];
    snprintf(summary, sizeof summary, "sor n=%d iters=%d", n, iters);
    free(g);
    return mpiw_finish(fails, why, summary, ck);
}
