/* nqueens N REPS: counts the solutions of the N-queens problem REPS times.
 *
 * The search space is cut into tasks (every valid placement of the first
 * three rows). Each repetition deals the tasks round-robin, shifted by the
 * repetition, in 16 phases; after each phase the ranks sum the per-task
 * counts of that phase (MPI_Iallreduce), so the ranks talk throughout.
 * Rank 0 checks, for every repetition, that the total equals the known
 * count for N, that the per-task counts equal those of repetition 0, and
 * that the counts by first-row column are mirror-symmetric. */
#include "mpiw.h"

#define PHASES 16
#define DEPTH 3

/* OEIS A000170. */
static const long long known[] = {1,        1,         0,          0,           2,
                                  10,       4,         40,         92,          352,
                                  724,      2680,      14200,      73712,       365596,
                                  2279184,  14772512,  95815104,   666090624,   4968057848LL};

typedef struct {
    unsigned cols, ld, rd;
    int first_col;
} task;

static long long solve(unsigned all, unsigned cols, unsigned ld, unsigned rd)
{
    if (cols == all)
        return 1;
    long long n = 0;
    unsigned free_ = all & ~(cols | ld | rd);
    while (free_) {
        unsigned bit = free_ & -free_;
        free_ ^= bit;
        n += solve(all, cols | bit, ((ld | bit) << 1) & all, (rd | bit) >> 1);
    }
    return n;
}

/* Every valid placement of the first DEPTH rows, in a fixed order. */
static int make_tasks(int n, task *out, unsigned all, unsigned cols, unsigned ld, unsigned rd,
                      int row, int first, int count)
{
    if (row == DEPTH || cols == all) {
        out[count] = (task){cols, ld, rd, first};
        return count + 1;
    }
    for (int c = 0; c < n; c++) {
        unsigned bit = 1u << c;
        if ((cols | ld | rd) & bit)
            continue;
        count = make_tasks(n, out, all, cols | bit, ((ld | bit) << 1) & all, (rd | bit) >> 1, row + 1,
                           row == 0 ? c : first, count);
    }
    return count;
}

int main(int argc, char **argv)
{
    mpiw_init(&argc, &argv, "nqueens");
    int n = (int)mpiw_arg(argc, argv, 1, 15, "N");
    int reps = (int)mpiw_arg(argc, argv, 2, 20, "REPS");
    if (n < DEPTH + 1 || n >= (int)(sizeof known / sizeof known[0])) {
        if (mpiw_rank == 0)
            fprintf(stderr, "N must be in %d..%d\n", DEPTH + 1, (int)(sizeof known / sizeof known[0]) - 1);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    unsigned all = (1u << n) - 1;
    task *tasks = mpiw_alloc(sizeof(task) * (size_t)n * n * n);
    int ntasks = make_tasks(n, tasks, all, 0, 0, 0, 0, 0, 0);
    long long *mine = mpiw_alloc(sizeof(long long) * (size_t)ntasks);
    long long *counts = mpiw_alloc(sizeof(long long) * (size_t)ntasks);
    long long *first = mpiw_alloc(sizeof(long long) * (size_t)ntasks);
    if (mpiw_rank == 0)
        printf("nqueens: n=%d reps=%d tasks=%d\n", n, reps, ntasks);

    int fails = 0;
    char why[256] = "";
    uint64_t ck = 0;
    for (int rep = 0; rep < reps; rep++) {
        memset(mine, 0, sizeof(long long) * (size_t)ntasks);
        for (int ph = 0; ph < PHASES; ph++) {
            int lo = (int)((long)ntasks * ph / PHASES), hi = (int)((long)ntasks * (ph + 1) / PHASES);
            for (int t = lo; t < hi; t++)
                if ((t + rep) % mpiw_size == mpiw_rank)
                    mine[t] = solve(all, tasks[t].cols, tasks[t].ld, tasks[t].rd);
            mpiw_allreduce(mine + lo, counts + lo, hi - lo, MPI_LONG_LONG, MPI_SUM);
            mpiw_progress("nqueens", (long)rep * PHASES + ph + 1, (long)reps * PHASES);
        }
        if (mpiw_rank != 0)
            continue;
        if (rep == reps - 1)
            MPIW_CORRUPT(counts[ntasks / 2] += 1);
        long long total = 0, by_col[32] = {0};
        for (int t = 0; t < ntasks; t++) {
            total += counts[t];
            by_col[tasks[t].first_col] += counts[t];
            ck = mpiw_ck(ck, (uint64_t)counts[t]);
        }
        if (rep == 0)
            memcpy(first, counts, sizeof(long long) * (size_t)ntasks);
        if (total != known[n]) {
            printf("mismatch[total]: rep %d: %lld solutions, expected %lld\n", rep, total, known[n]);
            fails++;
            mpiw_tag(why, sizeof why, "total");
        }
        for (int t = 0; t < ntasks; t++)
            if (counts[t] != first[t]) {
                printf("mismatch[task]: rep %d task %d: %lld, rep 0 had %lld\n", rep, t, counts[t], first[t]);
                fails++;
                mpiw_tag(why, sizeof why, "task");
                break;
            }
        for (int c = 0; c < n; c++)
            if (by_col[c] != by_col[n - 1 - c]) {
                printf("mismatch[mirror]: rep %d: column %d has %lld, column %d has %lld\n", rep, c, by_col[c],
                       n - 1 - c, by_col[n - 1 - c]);
                fails++;
                mpiw_tag(why, sizeof why, "mirror");
                break;
            }
    }
    char summary[128];
    snprintf(summary, sizeof summary, "nqueens n=%d reps=%d solutions=%lld", n, reps, known[n]);
    free(tasks);
    free(mine);
    free(counts);
    free(first);
    return mpiw_finish(fails, why, summary, ck);
}
