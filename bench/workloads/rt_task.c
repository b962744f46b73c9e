/*
 * rt_task.c - the rt-benchmark workload, for bench/rt_latency.py: one
 * process, two threads.
 *
 *   rt_task PIDFILE LOGFILE WS_MIB WS_PASS_S PERIOD_US MAX_S FIFO_PRIO
 *
 * The periodic thread is released every PERIOD_US microseconds on an
 * absolute CLOCK_MONOTONIC grid (clock_nanosleep TIMER_ABSTIME). Each job
 * adds 1 to every word of a private 64 KiB buffer (about 5 us of work that
 * writes 16 pages) and records, in a log prepared in advance, three
 * CLOCK_MONOTONIC times in ns: its release, when it woke, and when it
 * finished. A job that comes too late is not skipped: the next release is
 * always the next point of the grid, so after a stop of S ms the backlog of
 * about S / PERIOD jobs runs back to back, each one late. FIFO_PRIO > 0 runs
 * it SCHED_FIFO at that priority (needs root; if refused it runs
 * SCHED_OTHER and says so in its summary).
 *
 * The neighbour (the main thread) holds WS_MIB MiB (its own mmap, every
 * byte written at start) and writes one 64-bit word in each of its pages in
 * turn, paced so that one pass takes WS_PASS_S seconds (it sleeps 1 ms
 * between bursts; after a stop it catches up, at most one pass at a time).
 * WS_PASS_S = 0: it writes as fast as it can, without sleeping.
 *
 * It writes its PID file once both threads run. At most MAX_S seconds of
 * jobs are logged (later jobs run but are not logged). On SIGTERM it stops
 * both threads, writes the log to LOGFILE as raw native int64 triples
 * (release_ns, wake_ns, end_ns), one per logged job, prints
 * "jobs J logged L ws_writes W policy fifo|other prio P" and "PASS"
 * (exit 0).
 *
 * No pipes, sockets or extra fds. Start it with stdin from /dev/null and
 * stdout/stderr to a regular file so it can be checkpointed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define PAGE 4096
#define WORK_WORDS (64 * 1024 / 8)

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static atomic_int quit;
static int64_t period_ns;
static int64_t *logbuf;   /* 3 int64 per job */
static size_t log_cap, logged;
static unsigned long long jobs;
static uint64_t work[WORK_WORDS];

static void *periodic(void *arg)
{
	int64_t release = now_ns() + period_ns;
	struct timespec ts;
	size_t i;

	(void)arg;
	while (!atomic_load_explicit(&quit, memory_order_relaxed)) {
		int64_t wake, end;

		ts.tv_sec = release / 1000000000;
		ts.tv_nsec = release % 1000000000;
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
		wake = now_ns();
		for (i = 0; i < WORK_WORDS; i++)
			work[i] += 1;
		end = now_ns();
		if (logged < log_cap) {
			logbuf[3 * logged] = release;
			logbuf[3 * logged + 1] = wake;
			logbuf[3 * logged + 2] = end;
			logged++;
		}
		jobs++;
		release += period_ns;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	unsigned long long ws_done = 0;
	struct sched_param sp;
	struct sigaction sa;
	pthread_attr_t attr;
	pthread_t th;
	sigset_t set;
	size_t ws_mib, ws_pages, i, log_bytes;
	double ws_pass_s, max_s;
	int64_t t0;
	uint64_t *ws;
	int prio, fifo = 0, err;
	FILE *f;

	if (argc != 8) {
		fprintf(stderr, "usage: %s PIDFILE LOGFILE WS_MIB WS_PASS_S PERIOD_US MAX_S FIFO_PRIO\n", argv[0]);
		return 2;
	}
	ws_mib = strtoul(argv[3], NULL, 10);
	ws_pass_s = strtod(argv[4], NULL);
	period_ns = strtoll(argv[5], NULL, 10) * 1000;
	max_s = strtod(argv[6], NULL);
	prio = atoi(argv[7]);
	if (ws_mib == 0 || ws_pass_s < 0 || period_ns <= 0 || max_s <= 0) {
		fprintf(stderr, "rt_task: WS_MIB > 0, WS_PASS_S >= 0, PERIOD_US > 0, MAX_S > 0\n");
		return 2;
	}

	/* The log, written in advance so that no job takes a page fault on it
	 * (only the copy-on-write faults of a concurrent dump). */
	log_cap = (size_t)(max_s * 1e9 / (double)period_ns) + 1;
	log_bytes = log_cap * 3 * sizeof(int64_t);
	logbuf = mmap(NULL, log_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (logbuf == MAP_FAILED) {
		perror("rt_task: mmap log");
		return 2;
	}
	memset(logbuf, 0xff, log_bytes);

	ws_pages = (ws_mib << 20) / PAGE;
	ws = mmap(NULL, ws_mib << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ws == MAP_FAILED) {
		perror("rt_task: mmap");
		return 2;
	}
	(void)madvise(ws, ws_mib << 20, MADV_NOHUGEPAGE);
	for (i = 0; i < (ws_mib << 20) / 8; i++)
		ws[i] = mix64(i ^ 0x7274);

	/* SIGTERM reaches only the main thread: block it in the periodic one. */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	pthread_attr_init(&attr);
	if (prio > 0) {
		pthread_attr_setinheritsched(&attr, PTHREAD_EXPLICIT_SCHED);
		pthread_attr_setschedpolicy(&attr, SCHED_FIFO);
		sp.sched_priority = prio;
		pthread_attr_setschedparam(&attr, &sp);
		fifo = 1;
	}
	err = pthread_create(&th, &attr, periodic, NULL);
	if (err && fifo) {
		fifo = 0;
		pthread_attr_destroy(&attr);
		pthread_attr_init(&attr);
		err = pthread_create(&th, &attr, periodic, NULL);
	}
	if (err) {
		fprintf(stderr, "rt_task: pthread_create: %s\n", strerror(err));
		return 2;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_term;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGTERM, &sa, NULL)) {
		perror("rt_task: sigaction");
		return 2;
	}
	pthread_sigmask(SIG_UNBLOCK, &set, NULL);
	if (write_pidfile(argv[1])) {
		perror("rt_task: pidfile");
		return 2;
	}

	t0 = now_ns();
	while (!stop) {
		unsigned long long due, limit;

		if (ws_pass_s > 0) {
			due = (unsigned long long)((double)(now_ns() - t0) * 1e-9 / ws_pass_s * (double)ws_pages);
			limit = ws_done + ws_pages;
			if (due > limit)
				ws_done = due - ws_pages;
		} else {
			due = ws_done + 4096;
		}
		while (ws_done < due) {
			size_t pg = (size_t)(ws_done % ws_pages);

			ws[pg * (PAGE / 8) + (ws_done / ws_pages) % (PAGE / 8)] = mix64(ws_done);
			ws_done++;
		}
		if (ws_pass_s > 0) {
			struct timespec ms = { 0, 1000000 };

			nanosleep(&ms, NULL);
		}
	}

	atomic_store(&quit, 1);
	pthread_join(th, NULL);
	f = fopen(argv[2], "wb");
	if (!f || fwrite(logbuf, 3 * sizeof(int64_t), logged, f) != logged || fclose(f)) {
		perror("rt_task: writing the log");
		return 2;
	}
	printf("jobs %llu logged %zu ws_writes %llu policy %s prio %d\n", jobs, logged, ws_done,
	       fifo ? "fifo" : "other", fifo ? prio : 0);
	printf("PASS\n");
	fflush(stdout);
	return 0;
}
