/* gauss N SOLVES: Gaussian elimination with partial pivoting on seeded
 * N x N systems A x = b, SOLVES of them in a row.
 *
 * Column j of the augmented matrix [A | b] lives on rank j % P. At step k
 * the owner of column k picks the pivot row and broadcasts the pivot index
 * with the column's multipliers (MPI_Ibcast: N broadcasts per solve);
 * every rank swaps the rows and eliminates in its own columns. Rank 0 then
 * gathers the reduced matrix (MPI_Igatherv) and back-substitutes. It
 * checks every solution against a serial elimination of the same system
 * (same operations in the same order: bit for bit) and the residual
 * max|A x - b| against the original matrix. */
#include "mpiw.h"
#include <math.h>

static uint64_t seed_of(int s) { return 0x6a055 + (uint64_t)s; }

/* Element (i, j) of the augmented matrix of system S (j == n: b). */
static double elem(int s, int n, int i, int j) { return mpiw_unit(seed_of(s), (uint64_t)i * (uint64_t)(n + 1) + (uint64_t)j); }

/* Eliminates below row K in column COL (length N) with multipliers L,
 * after the row swap K <-> PIV. Shared by the parallel and serial paths. */
static void eliminate(double *col, int n, int k, int piv, const double *l)
{
    double t = col[k];
    col[k] = col[piv];
    col[piv] = t;
    for (int i = k + 1; i < n; i++)
        col[i] -= l[i] * col[k];
}

/* Multipliers of column COL at step K (after choosing the pivot): l[n] = pivot row. */
static void pivot(double *col, int n, int k, double *l)
{
    int piv = k;
    for (int i = k + 1; i < n; i++)
        if (fabs(col[i]) > fabs(col[piv]))
            piv = i;
    double t = col[k];
    col[k] = col[piv];
    col[piv] = t;
    for (int i = k + 1; i < n; i++)
        l[i] = col[i] / col[k];
    l[n] = piv;
}

static void back_substitute(double **cols, int n, double *x)
{
    for (int i = n - 1; i >= 0; i--) {
        double v = cols[n][i];
        for (int j = i + 1; j < n; j++)
            v -= cols[j][i] * x[j];
        x[i] = v / cols[i][i];
    }
}

/* The same elimination, serially, on all columns. */
static void serial_solve(int s, int n, double *x)
{
    double **cols = mpiw_alloc(sizeof(double *) * (size_t)(n + 1));
    double *l = mpiw_alloc(sizeof(double) * (size_t)(n + 1));
    for (int j = 0; j <= n; j++) {
        cols[j] = mpiw_alloc(sizeof(double) * (size_t)n);
        for (int i = 0; i < n; i++)
            cols[j][i] = elem(s, n, i, j);
    }
    for (int k = 0; k < n; k++) {
        pivot(cols[k], n, k, l);
        for (int i = k + 1; i < n; i++)
            cols[k][i] = 0;
        for (int j = k + 1; j <= n; j++)
            eliminate(cols[j], n, k, (int)l[n], l);
    }
    back_substitute(cols, n, x);
    for (int j = 0; j <= n; j++)
        free(cols[j]);
    free(cols);
    free(l);
}

/* One parallel solve; rank 0 gets x. */
static void parallel_solve(int s, int n, double *mine, int nmine, double *l, double *x)
{
    int p = mpiw_size, r = mpiw_rank;
    for (int c = 0; c < nmine; c++)
        for (int i = 0; i < n; i++)
            mine[(size_t)c * n + i] = elem(s, n, i, r + c * p);
    for (int k = 0; k < n; k++) {
        int owner = k % p;
        if (owner == r) {
            double *col = mine + (size_t)(k / p) * n;
            pivot(col, n, k, l);
            for (int i = k + 1; i < n; i++)
                col[i] = 0;
        }
        mpiw_bcast(l, n + 1, MPI_DOUBLE, owner);
        for (int c = 0; c < nmine; c++)
            if (r + c * p > k)
                eliminate(mine + (size_t)c * n, n, k, (int)l[n], l);
    }
    /* Gather the reduced columns on rank 0 (rank q's columns q, q+P, ...). */
    int *counts = NULL, *displs = NULL;
    double *all = NULL;
    if (r == 0) {
        counts = mpiw_alloc(sizeof(int) * (size_t)p);
        displs = mpiw_alloc(sizeof(int) * (size_t)p);
        for (int q = 0, off = 0; q < p; q++) {
            counts[q] = ((n + 1 - q + p - 1) / p) * n;
            displs[q] = off;
            off += counts[q];
        }
        all = mpiw_alloc(sizeof(double) * (size_t)(n + 1) * n);
    }
    MPI_Request req;
    MPI_Igatherv(mine, nmine * n, MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, 0, MPI_COMM_WORLD, &req);
    mpiw_wait(&req, NULL);
    if (r == 0) {
        double **cols = mpiw_alloc(sizeof(double *) * (size_t)(n + 1));
        for (int j = 0; j <= n; j++)
            cols[j] = all + displs[j % p] + (size_t)(j / p) * n;
        back_substitute(cols, n, x);
        free(cols);
        free(counts);
        free(displs);
        free(all);
    }
}

int main(int argc, char **argv)
{
    mpiw_init(&argc, &argv, "gauss");
    int n = (int)mpiw_arg(argc, argv, 1, 300, "N");
    int solves = (int)mpiw_arg(argc, argv, 2, 40, "SOLVES");
    if (n < 2 || n > 20000) {
        if (mpiw_rank == 0)
            fprintf(stderr, "N must be in 2..20000\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (mpiw_rank == 0)
        printf("gauss: n=%d solves=%d\n", n, solves);
    int nmine = (n + 1 - mpiw_rank + mpiw_size - 1) / mpiw_size;
    double *mine = mpiw_alloc(sizeof(double) * (size_t)(nmine > 0 ? nmine : 1) * n);
    double *l = mpiw_alloc(sizeof(double) * (size_t)(n + 1));
    double *x = mpiw_alloc(sizeof(double) * (size_t)n * solves);
    for (int s = 0; s < solves; s++)
        parallel_solve(s, n, mine, nmine, l, x + (size_t)s * n);

    int fails = 0;
    char why[64] = "";
    uint64_t ck = 0;
    if (mpiw_rank == 0) {
        MPIW_CORRUPT(x[(size_t)(solves - 1) * n + n / 2] *= 1.0 + 1e-15);
        double *xs = mpiw_alloc(sizeof(double) * (size_t)n), worst = 0;
        for (int s = 0; s < solves; s++) {
            double *xp = x + (size_t)s * n;
            serial_solve(s, n, xs);
            for (int i = 0; i < n; i++)
                if (memcmp(&xs[i], &xp[i], sizeof(double))) {
                    printf("mismatch[serial]: solve %d: x[%d] = %.17g, serial %.17g\n", s, i, xp[i], xs[i]);
                    fails++;
                    mpiw_tag(why, sizeof why, "serial");
                    break;
                }
            double xmax = 0, res = 0;
            for (int i = 0; i < n; i++)
                xmax = fmax(xmax, fabs(xp[i]));
            for (int i = 0; i < n; i++) {
                double v = -elem(s, n, i, n);
                for (int j = 0; j < n; j++)
                    v += elem(s, n, i, j) * xp[j];
                res = fmax(res, fabs(v));
            }
            /* |A|inf <= n: backward-stable elimination gives ~n eps |A| |x|. */
            res /= (double)n * xmax;
            worst = fmax(worst, res);
            if (res > 1e-10) {
                printf("mismatch[residual]: solve %d: max|Ax-b| / (n max|x|) = %.3g\n", s, res);
                fails++;
                mpiw_tag(why, sizeof why, "residual");
            }
            ck = mpiw_ck_doubles(ck, xp, (size_t)n);
        }
        printf("gauss: worst scaled residual %.3g\n", worst);
        free(xs);
    }
    char summary[128];
    snprintf(summary, sizeof summary, "gauss n=%d solves=%d", n, solves);
    free(mine);
    free(l);
    free(x);
    return mpiw_finish(fails, why, summary, ck);
}
