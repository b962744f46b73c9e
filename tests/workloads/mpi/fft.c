/* fft LOG2N ITERS: distributed complex FFTs of N = 2^LOG2N points,
 * ITERS times (a new seeded input each time), each followed by the inverse.
 *
 * "Four-step" FFT: the points form an N2 x N1 matrix distributed by rows;
 * each rank transforms its rows, multiplies by the twiddle factors, and an
 * MPI_Ialltoall transposes the matrix; then the rows are transformed
 * again. Every forward and every inverse transform moves all the data
 * across all ranks once. After each iteration the ranks reduce
 * (MPI_Iallreduce) the input's and the spectrum's energy (Parseval:
 * sum|X|^2 = N sum|x|^2) and the largest error of inverse(forward(x)) - x.
 * At the end rank 0 gathers the last spectrum and compares it with a
 * serial radix-2 FFT of the same input. The checksum covers every spectrum
 * (a position-weighted sum of its bits: independent of the rank count). */
#include "mpiw.h"
#include <complex.h>
#include <math.h>

typedef double complex cplx;

static uint64_t seed_of(int it) { return 0xff7 + (uint64_t)it; }

static cplx input_at(int it, uint64_t n)
{
    return mpiw_unit(seed_of(it), 2 * n) + I * mpiw_unit(seed_of(it), 2 * n + 1);
}

/* In-place radix-2 FFT of length L (a power of two); SIGN -1 forward. */
static void fft_serial(cplx *a, size_t len, int sign)
{
    for (size_t i = 1, j = 0; i < len; i++) {
        size_t bit = len >> 1;
        for (; j & bit; bit >>= 1)
            j ^= bit;
        j ^= bit;
        if (i < j) {
            cplx t = a[i];
            a[i] = a[j];
            a[j] = t;
        }
    }
    for (size_t half = 1; half < len; half <<= 1) {
        for (size_t k = 0; k < half; k++) {
            double ang = sign * M_PI * (double)k / (double)half;
            cplx w = cos(ang) + I * sin(ang);
            for (size_t i = k; i < len; i += 2 * half) {
                cplx u = a[i], v = a[i + half] * w;
                a[i] = u + v;
                a[i + half] = u - v;
            }
        }
    }
}

/* One distributed transform. IN: ROWS x LEN matrix (this rank's ROWS/P
 * rows starting at row r0), element [r][c] = x[ROWS*c + r]. OUT: LEN x ROWS
 * (this rank's LEN/P rows), element [k][j] = X[k + LEN*j]. TMP: scratch of
 * the same size. */
static void fft4(cplx *in, cplx *out, cplx *tmp, size_t rows, size_t len, int sign)
{
    size_t p = (size_t)mpiw_size, my_rows = rows / p, my_out = len / p;
    size_t r0 = (size_t)mpiw_rank * my_rows, n = rows * len;
    for (size_t r = 0; r < my_rows; r++) {
        cplx *row = in + r * len;
        fft_serial(row, len, sign);
        for (size_t k = 0; k < len; k++) {
            double ang = sign * 2.0 * M_PI * (double)(((r0 + r) * k) % n) / (double)n;
            row[k] *= cos(ang) + I * sin(ang);
        }
    }
    /* Block q of TMP: my rows x q's output columns, row by row. */
    size_t blk = my_rows * my_out;
    for (size_t q = 0; q < p; q++)
        for (size_t r = 0; r < my_rows; r++)
            memcpy(tmp + q * blk + r * my_out, in + r * len + q * my_out, sizeof(cplx) * my_out);
    MPI_Request req;
    MPI_Ialltoall(tmp, (int)(blk * 2), MPI_DOUBLE, in, (int)(blk * 2), MPI_DOUBLE, MPI_COMM_WORLD, &req);
    mpiw_wait(&req, NULL);
    /* From q: q's rows (r0 = q * my_rows) x my columns. */
    for (size_t q = 0; q < p; q++)
        for (size_t r = 0; r < my_rows; r++)
            for (size_t k = 0; k < my_out; k++)
                out[k * rows + q * my_rows + r] = in[q * blk + r * my_out + k];
    for (size_t k = 0; k < my_out; k++)
        fft_serial(out + k * rows, rows, sign);
}

/* Position-weighted sum of the bits of this rank's part of a spectrum in
 * layout OUT of fft4 (global index k0 + k + LEN*j). */
static uint64_t spectrum_sum(const cplx *x, size_t my_out, size_t k0, size_t rows, size_t len)
{
    uint64_t s = 0;
    for (size_t k = 0; k < my_out; k++)
        for (size_t j = 0; j < rows; j++) {
            double re = creal(x[k * rows + j]), im = cimag(x[k * rows + j]);
            uint64_t a, b;
            memcpy(&a, &re, 8);
            memcpy(&b, &im, 8);
            s += mpiw_mix64(k0 + k + len * j) * (a ^ mpiw_mix64(b));
        }
    return s;
}

int main(int argc, char **argv)
{
    mpiw_init(&argc, &argv, "fft");
    int logn = (int)mpiw_arg(argc, argv, 1, 20, "LOG2N");
    int iters = (int)mpiw_arg(argc, argv, 2, 100, "ITERS");
    size_t n = (size_t)1 << logn, n1 = (size_t)1 << (logn / 2), n2 = n / n1, p = (size_t)mpiw_size;
    if (logn < 2 || logn > 26 || n1 % p || n2 % p) {
        if (mpiw_rank == 0)
            fprintf(stderr, "LOG2N must be in 2..26 and the ranks (%zu) must divide 2^%d and 2^%d\n", p,
                    logn / 2, logn - logn / 2);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (mpiw_rank == 0)
        printf("fft: n=2^%d (%zu x %zu) iters=%d\n", logn, n2, n1, iters);
    size_t local = n / p, my_rows = n2 / p, my_k = n1 / p;
    cplx *a = mpiw_alloc(sizeof(cplx) * local), *b = mpiw_alloc(sizeof(cplx) * local);
    cplx *t = mpiw_alloc(sizeof(cplx) * local), *last = mpiw_alloc(sizeof(cplx) * local);
    int fails = 0;
    char why[64] = "";
    uint64_t ck = 0;
    for (int it = 0; it < iters; it++) {
        /* Layout A: rows n2 (mine: my_rows from rank*my_rows), row = x[N2*n1 + n2]. */
        double e[3] = {0, 0, 0}, g[3];
        for (size_t r = 0; r < my_rows; r++)
            for (size_t c = 0; c < n1; c++) {
                a[r * n1 + c] = input_at(it, n2 * c + (size_t)mpiw_rank * my_rows + r);
                e[0] += creal(a[r * n1 + c] * conj(a[r * n1 + c]));
            }
        fft4(a, b, t, n2, n1, -1); /* b: rows k1 (my_k of them), b[k][j] = X[k1 + N1*j] */
        for (size_t i = 0; i < local; i++)
            e[1] += creal(b[i] * conj(b[i]));
        uint64_t s = spectrum_sum(b, my_k, (size_t)mpiw_rank * my_k, n2, n1), sum = 0;
        if (it == iters - 1)
            memcpy(last, b, sizeof(cplx) * local);
        fft4(b, a, t, n1, n2, +1); /* back to layout A, times N */
        for (size_t r = 0; r < my_rows; r++)
            for (size_t c = 0; c < n1; c++) {
                double err = cabs(a[r * n1 + c] / (double)n - input_at(it, n2 * c + (size_t)mpiw_rank * my_rows + r));
                e[2] = err > e[2] ? err : e[2];
            }
        mpiw_allreduce(e, g, 2, MPI_DOUBLE, MPI_SUM);
        mpiw_allreduce(&e[2], &g[2], 1, MPI_DOUBLE, MPI_MAX);
        mpiw_allreduce(&s, &sum, 1, MPI_UINT64_T, MPI_SUM);
        ck = mpiw_ck(ck, sum);
        if (mpiw_rank == 0 && (fabs(g[1] - (double)n * g[0]) > 1e-9 * g[1] || g[2] > 1e-9)) {
            printf("mismatch[parseval]: iteration %d: sum|X|^2 %.17g, N sum|x|^2 %.17g, inverse error %.3g\n", it,
                   g[1], (double)n * g[0], g[2]);
            fails++;
            mpiw_tag(why, sizeof why, "parseval");
        }
    }
    cplx *all = mpiw_rank == 0 ? mpiw_alloc(sizeof(cplx) * n) : NULL;
    MPI_Request req;
    MPI_Igather(last, (int)(2 * local), MPI_DOUBLE, all, (int)(2 * local), MPI_DOUBLE, 0, MPI_COMM_WORLD, &req);
    mpiw_wait(&req, NULL);
    if (mpiw_rank == 0) {
        /* all[k1 * N2 + j] = X[k1 + N1*j] */
        cplx *x = mpiw_alloc(sizeof(cplx) * n);
        for (size_t i = 0; i < n; i++)
            x[i] = input_at(iters - 1, i);
        fft_serial(x, n, -1);
        MPIW_CORRUPT(all[n / 3] += 1.0);
        double worst = 0, rms = 0;
        size_t at = 0;
        for (size_t k1 = 0; k1 < n1; k1++)
            for (size_t j = 0; j < n2; j++) {
                double d = cabs(all[k1 * n2 + j] - x[k1 + n1 * j]);
                rms += creal(x[k1 + n1 * j] * conj(x[k1 + n1 * j]));
                if (d > worst) {
                    worst = d;
                    at = k1 + n1 * j;
                }
            }
        rms = sqrt(rms / (double)n);
        if (worst > 1e-9 * rms) {
            printf("mismatch[serial]: X[%zu] differs by %.3g from the serial FFT (rms %.3g)\n", at, worst, rms);
            fails++;
            mpiw_tag(why, sizeof why, "serial");
        }
        free(x);
        free(all);
    }
    char summary[128];
    snprintf(summary, sizeof summary, "fft n=2^%d iters=%d", logn, iters);
    free(a);
    free(b);
    free(t);
    free(last);
    return mpiw_finish(fails, why, summary, ck);
}
