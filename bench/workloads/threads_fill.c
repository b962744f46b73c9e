/*
 * threads_fill.c - multi-threaded benchmark workload for bench/tree_threads.py.
 *
 *   threads_fill PIDFILE SIZE_MIB NTHREADS
 *
 * Maps SIZE_MIB MiB of private anonymous memory and splits it into NTHREADS
 * page-aligned slices, one per thread. NTHREADS counts every thread of the
 * process, main included: main fills slice 0 and starts NTHREADS-1 pthreads
 * for the others, so NTHREADS=1 is a plain single-threaded process (the
 * same as fill.c). Each thread writes its slice with the pattern of fill.c
 * (8-byte words, pattern(offset) = mix64(offset ^ SEED), offset from the
 * start of the whole buffer), so the memory contents do not depend on
 * NTHREADS. Then the workers wait: even-numbered workers in
 * pthread_cond_wait(), odd-numbered ones in 50 ms nanosleep()s. Once every
 * slice is written, main writes its PID to PIDFILE (PIDFILE.tmp + rename)
 * and sleeps in 50 ms nanosleep()s.
 *
 * Workers block SIGTERM, so SIGTERM always goes to main. On SIGTERM main
 * wakes the workers and joins them (each returns whether its own stack and
 * TID are as they were before the dump), checks that the process still has
 * NTHREADS threads in /proc/self/task until then, checks the whole buffer
 * against the pattern, and prints "PASS" (exit 0) or "FAIL: ..." (exit 1).
 *
 * No pipes, sockets or extra fds. Start it with stdin from /dev/null and
 * stdout/stderr to a regular file so it can be checkpointed.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define SEED 0x66696c6c62656e63ull /* "fillbenc", as fill.c */
#define MAX_THREADS 1024


static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t filled_cv = PTHREAD_COND_INITIALIZER; /* workers -> main */
static pthread_cond_t stop_cv = PTHREAD_COND_INITIALIZER;   /* main -> workers */
static int nfilled;                      /* under mu */
static int stop_workers;                 /* under mu; read unlocked by sleepers */

static uint64_t *buf;
static size_t slice_words;               /* words per slice (the last one takes the rest) */
static uint64_t nwords;
static int nthreads;

struct worker {
	pthread_t th;
	int idx;
	pid_t tid;                       /* gettid() before the dump */
};
static struct worker workers[MAX_THREADS];

static inline uint64_t pattern(uint64_t off)
{
	return mix64(off ^ SEED);
}

static void slice_bounds(int idx, uint64_t *lo, uint64_t *hi)
{
	*lo = (uint64_t)idx * slice_words;
	*hi = idx == nthreads - 1 ? nwords : *lo + slice_words;
}

static void fill_slice(int idx)
{
	uint64_t lo, hi, i;

	slice_bounds(idx, &lo, &hi);
	for (i = lo; i < hi; i++)
		buf[i] = pattern(i * sizeof(uint64_t));
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	/* Kept on this thread's stack across the dump and checked after. */
	volatile uint64_t canary[64];
	struct timespec ts = { 0, 50 * 1000 * 1000 };
	int idx = w->idx, i;
	uintptr_t bad = 0;

	w->tid = (pid_t)syscall(SYS_gettid);
	for (i = 0; i < 64; i++)
		canary[i] = mix64(((uint64_t)idx << 32) | (uint64_t)i);

	fill_slice(idx);

	pthread_mutex_lock(&mu);
	nfilled++;
	pthread_cond_signal(&filled_cv);
	if (idx % 2 == 0) {
		while (!stop_workers)
			pthread_cond_wait(&stop_cv, &mu);
		pthread_mutex_unlock(&mu);
	} else {
		pthread_mutex_unlock(&mu);
		while (!__atomic_load_n(&stop_workers, __ATOMIC_ACQUIRE))
			nanosleep(&ts, NULL);
	}

	if (idx != w->idx || (pid_t)syscall(SYS_gettid) != w->tid)
		bad |= 1;
	for (i = 0; i < 64; i++)
		if (canary[i] != mix64(((uint64_t)idx << 32) | (uint64_t)i))
			bad |= 2;
	return (void *)bad;
}

static int count_tasks(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

int main(int argc, char **argv)
{
	struct sigaction sa;
	struct timespec ts = { 0, 50 * 1000 * 1000 };
	sigset_t term, old;
	uint64_t i, bad = 0, first_bad = 0;
	unsigned long mib, nt;
	size_t size;
	char *end;
	int k, tasks, thread_fail = 0, err;

	if (argc != 4) {
		fprintf(stderr, "usage: %s PIDFILE SIZE_MIB NTHREADS\n", argv[0]);
		return 2;
	}
	errno = 0;
	mib = strtoul(argv[2], &end, 10);
	if (errno || *end || mib == 0) {
		fprintf(stderr, "threads_fill: bad SIZE_MIB '%s'\n", argv[2]);
		return 2;
	}
	errno = 0;
	nt = strtoul(argv[3], &end, 10);
	if (errno || *end || nt == 0 || nt > MAX_THREADS) {
		fprintf(stderr, "threads_fill: bad NTHREADS '%s' (1-%d)\n", argv[3], MAX_THREADS);
		return 2;
	}
	nthreads = (int)nt;
	size = (size_t)mib << 20;
	nwords = size / sizeof(uint64_t);
	/* Page-aligned slices, so no two threads write the same page. */
	slice_words = (size / (size_t)nthreads) / 4096 * 4096 / sizeof(uint64_t);
	if (slice_words == 0) {
		fprintf(stderr, "threads_fill: %lu MiB is too small for %d threads\n", mib, nthreads);
		return 2;
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_term; /* no SA_RESTART */
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGTERM, &sa, NULL)) {
		perror("threads_fill: sigaction");
		return 2;
	}

	buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		perror("threads_fill: mmap");
		return 2;
	}

	/* Workers inherit a mask with SIGTERM blocked; main unblocks it after. */
	sigemptyset(&term);
	sigaddset(&term, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &term, &old);
	for (k = 1; k < nthreads; k++) {
		workers[k].idx = k;
		err = pthread_create(&workers[k].th, NULL, worker_main, &workers[k]);
		if (err) {
			fprintf(stderr, "threads_fill: pthread_create: %s\n", strerror(err));
			return 2;
		}
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);

	fill_slice(0);
	pthread_mutex_lock(&mu);
	while (nfilled < nthreads - 1)
		pthread_cond_wait(&filled_cv, &mu);
	pthread_mutex_unlock(&mu);

	if (write_pidfile(argv[1])) {
		perror("threads_fill: pidfile");
		return 2;
	}

	while (!stop)
		nanosleep(&ts, NULL); /* EINTR on SIGTERM: loop test sees stop */

	tasks = count_tasks();
	pthread_mutex_lock(&mu);
	__atomic_store_n(&stop_workers, 1, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&stop_cv);
	pthread_mutex_unlock(&mu);
	for (k = 1; k < nthreads; k++) {
		void *ret;

		err = pthread_join(workers[k].th, &ret);
		if (err || ret != NULL) {
			printf("FAIL: worker %d (tid %d): %s\n", k, (int)workers[k].tid,
			       err ? strerror(err) : ((uintptr_t)ret & 1) ? "TID or index changed" : "stack canary changed");
			thread_fail = 1;
		}
	}

	for (i = 0; i < nwords; i++) {
		if (buf[i] != pattern(i * sizeof(uint64_t))) {
			if (!bad)
				first_bad = i;
			bad++;
		}
	}
	if (tasks != nthreads) {
		printf("FAIL: %d threads in /proc/self/task after restore, want %d\n", tasks, nthreads);
		thread_fail = 1;
	}
	if (bad) {
		printf("FAIL: %llu of %llu words differ, first at offset %llu (got %016llx, want %016llx)\n",
		       (unsigned long long)bad, (unsigned long long)nwords,
		       (unsigned long long)(first_bad * sizeof(uint64_t)),
		       (unsigned long long)buf[first_bad],
		       (unsigned long long)pattern(first_bad * sizeof(uint64_t)));
	}
	if (bad || thread_fail) {
		fflush(stdout);
		return 1;
	}
	printf("PASS\n");
	fflush(stdout);
	return 0;
}
