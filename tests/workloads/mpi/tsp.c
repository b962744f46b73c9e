/* tsp CITIES ROUNDS: branch and bound for the travelling salesman problem,
 * ROUNDS seeded instances of CITIES cities each (integer Euclidean
 * distances on a 1000x1000 grid).
 *
 * Rank 0 is the master: it keeps the best tour so far and a queue of tasks
 * (tour prefixes 0 -> a -> b, cheapest first). Each other rank asks for a
 * task, sending the best tour it found; the master updates its best and
 * answers with the next task and the current best cost (or "done"). With
 * one rank, rank 0 solves the tasks itself. At the end rank 0 checks every
 * round's cost against a serial Held-Karp dynamic program (exact optimum)
 * and that the tour is a permutation of the cities with that cost. */
#include "mpiw.h"
#include <limits.h>
#include <math.h>

#define MAXC 20 /* Held-Karp needs 2^(n-1) (n-1) ints: 40 MB at 20 */
/* Tags of one round (a worker may ask for round r+1's first task while
 * the master still waits for round r's last askers). */
#define TAG_ASK(round) (1 + 2 * ((round) & 0x3fff))
#define TAG_TASK(round) (2 + 2 * ((round) & 0x3fff))

static int nc;
static int dist[MAXC][MAXC], min_out[MAXC];

typedef struct {
    int cost;
    int tour[MAXC];
} result;

static void make_instance(uint64_t seed)
{
    int x[MAXC], y[MAXC];
    mpiw_rng r = {seed};
    for (int i = 0; i < nc; i++) {
        x[i] = (int)(mpiw_next(&r) % 1000);
        y[i] = (int)(mpiw_next(&r) % 1000);
    }
    for (int i = 0; i < nc; i++) {
        min_out[i] = INT_MAX;
        for (int j = 0; j < nc; j++) {
            double dx = x[i] - x[j], dy = y[i] - y[j];
            dist[i][j] = (int)lround(sqrt(dx * dx + dy * dy));
            if (i != j && dist[i][j] < min_out[i])
                min_out[i] = dist[i][j];
        }
    }
}

/* Depth-first search below a prefix; BEST is the bound, improved in place. */
static void dfs(int *path, int depth, unsigned visited, int cost, int rest_min, result *best)
{
    int last = path[depth - 1];
    if (depth == nc) {
        int total = cost + dist[last][0];
        if (total < best->cost) {
            best->cost = total;
            memcpy(best->tour, path, sizeof(int) * (size_t)nc);
        }
        return;
    }
    for (int c = 1; c < nc; c++) {
        if (visited & (1u << c))
            continue;
        int ncost = cost + dist[last][c];
        int nrest = rest_min - min_out[c];
        if (ncost + nrest + min_out[c] >= best->cost) /* lower bound: leave every open city once */
            continue;
        path[depth] = c;
        dfs(path, depth + 1, visited | (1u << c), ncost, nrest, best);
    }
}

static void solve_task(int a, int b, result *best)
{
    int path[MAXC] = {0, a, b};
    int rest = 0;
    for (int c = 1; c < nc; c++)
        if (c != a && c != b)
            rest += min_out[c];
    /* Lower bound: the prefix, then one edge out of b and of every open city. */
    int cost = dist[0][a] + dist[a][b];
    if (cost + min_out[b] + rest >= best->cost)
        return;
    dfs(path, 3, 1u | (1u << a) | (1u << b), cost, rest, best);
}

static int cmp_task(const void *x, const void *y)
{
    const int *p = x, *q = y;
    int cp = dist[0][p[0]] + dist[p[0]][p[1]], cq = dist[0][q[0]] + dist[q[0]][q[1]];
    if (cp != cq)
        return cp < cq ? -1 : 1;
    return p[0] != q[0] ? p[0] - q[0] : p[1] - q[1];
}

static int nearest_neighbour(void)
{
    unsigned seen = 1;
    int at = 0, cost = 0;
    for (int k = 1; k < nc; k++) {
        int next = -1;
        for (int c = 1; c < nc; c++)
            if (!(seen & (1u << c)) && (next < 0 || dist[at][c] < dist[at][next]))
                next = c;
        cost += dist[at][next];
        seen |= 1u << next;
        at = next;
    }
    return cost + dist[at][0];
}

/* Master side of one round: hands out tasks until every worker is told
 * to stop. */
static void master(int round, int (*tasks)[2], int ntasks, result *best)
{
    int next = 0, stopped = 0;
    while (stopped < mpiw_size - 1) {
        result got;
        MPI_Request r;
        MPI_Status st;
        MPI_Irecv(&got, (int)sizeof got, MPI_BYTE, MPI_ANY_SOURCE, TAG_ASK(round), MPI_COMM_WORLD, &r);
        mpiw_wait(&r, &st);
        if (got.cost < best->cost)
            *best = got;
        int reply[3] = {-1, -1, best->cost};
        if (next < ntasks) {
            reply[0] = tasks[next][0];
            reply[1] = tasks[next][1];
            next++;
        } else {
            stopped++;
        }
        MPI_Isend(reply, 3, MPI_INT, st.MPI_SOURCE, TAG_TASK(round), MPI_COMM_WORLD, &r);
        mpiw_wait(&r, NULL);
    }
}

static void worker(int round, result *best)
{
    result mine = *best;
    for (;;) {
        MPI_Request r[2];
        int reply[3];
        MPI_Irecv(reply, 3, MPI_INT, 0, TAG_TASK(round), MPI_COMM_WORLD, &r[1]);
        MPI_Isend(&mine, (int)sizeof mine, MPI_BYTE, 0, TAG_ASK(round), MPI_COMM_WORLD, &r[0]);
        mpiw_waitall(2, r);
        if (reply[2] < mine.cost)
            mine.cost = reply[2]; /* a better bound found elsewhere (its tour stays there) */
        if (reply[0] < 0)
            return;
        solve_task(reply[0], reply[1], &mine);
    }
}

/* Held-Karp: the exact optimum, serially (O(2^n n^2)). */
static int held_karp(void)
{
    int m = nc - 1; /* cities 1..nc-1 as bits 0..m-1 */
    size_t states = (size_t)1 << m;
    int *d = mpiw_alloc(sizeof(int) * states * (size_t)m);
    for (size_t s = 0; s < states * (size_t)m; s++)
        d[s] = INT_MAX;
    for (int j = 0; j < m; j++)
        d[((size_t)1 << j) * (size_t)m + (size_t)j] = dist[0][j + 1];
    for (size_t s = 1; s < states; s++)
        for (int j = 0; j < m; j++) {
            int v = d[s * (size_t)m + (size_t)j];
            if (!(s & ((size_t)1 << j)) || v == INT_MAX)
                continue;
            for (int k = 0; k < m; k++) {
                if (s & ((size_t)1 << k))
                    continue;
                size_t t = (s | ((size_t)1 << k)) * (size_t)m + (size_t)k;
                if (v + dist[j + 1][k + 1] < d[t])
                    d[t] = v + dist[j + 1][k + 1];
            }
        }
    int best = INT_MAX;
    for (int j = 0; j < m; j++) {
        int v = d[(states - 1) * (size_t)m + (size_t)j] + dist[j + 1][0];
        if (v < best)
            best = v;
    }
    free(d);
    return best;
}

int main(int argc, char **argv)
{
    mpiw_init(&argc, &argv, "tsp");
    nc = (int)mpiw_arg(argc, argv, 1, 18, "CITIES");
    int rounds = (int)mpiw_arg(argc, argv, 2, 15, "ROUNDS");
    if (nc < 4 || nc > MAXC) {
        if (mpiw_rank == 0)
            fprintf(stderr, "CITIES must be in 4..%d\n", MAXC);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (mpiw_rank == 0)
        printf("tsp: cities=%d rounds=%d tasks=%d\n", nc, rounds, (nc - 1) * (nc - 2));
    result *found = mpiw_alloc(sizeof(result) * (size_t)rounds);
    int(*tasks)[2] = mpiw_alloc(sizeof(int[2]) * (size_t)nc * (size_t)nc);
    for (int round = 0; round < rounds; round++) {
        make_instance(0x7359 + (uint64_t)round);
        result best = {nearest_neighbour() + 1, {0}}; /* +1: the search must find a tour */
        int ntasks = 0;
        for (int a = 1; a < nc; a++)
            for (int b = 1; b < nc; b++)
                if (a != b) {
                    tasks[ntasks][0] = a;
                    tasks[ntasks][1] = b;
                    ntasks++;
                }
        qsort(tasks, (size_t)ntasks, sizeof tasks[0], cmp_task);
        if (mpiw_size == 1)
            for (int t = 0; t < ntasks; t++)
                solve_task(tasks[t][0], tasks[t][1], &best);
        else if (mpiw_rank == 0)
            master(round, tasks, ntasks, &best);
        else
            worker(round, &best);
        found[round] = best;
    }

    int fails = 0;
    char why[64] = "";
    uint64_t ck = 0;
    if (mpiw_rank == 0) {
        MPIW_CORRUPT(found[rounds - 1].cost += 1);
        for (int round = 0; round < rounds; round++) {
            make_instance(0x7359 + (uint64_t)round);
            int opt = held_karp(), len = 0;
            unsigned seen = 0;
            for (int i = 0; i < nc; i++) {
                int c = found[round].tour[i];
                seen |= (c >= 0 && c < nc) ? 1u << c : 0;
                len += (c >= 0 && c < nc) ? dist[c][found[round].tour[(i + 1) % nc]] : 0;
            }
            if (found[round].cost != opt) {
                printf("mismatch[cost]: round %d: %d, Held-Karp says %d\n", round, found[round].cost, opt);
                fails++;
                mpiw_tag(why, sizeof why, "cost");
            } else if (seen != (1u << nc) - 1 || len != opt || found[round].tour[0] != 0) {
                printf("mismatch[tour]: round %d: not a tour of length %d (length %d)\n", round, opt, len);
                fails++;
                mpiw_tag(why, sizeof why, "tour");
            }
            ck = mpiw_ck(ck, (uint64_t)found[round].cost);
        }
    }
    char summary[128];
    snprintf(summary, sizeof summary, "tsp cities=%d rounds=%d last-cost=%d", nc, rounds, found[rounds - 1].cost);
    free(found);
    free(tasks);
    return mpiw_finish(fails, why, summary, ck);
}
