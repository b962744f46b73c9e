/*
 * bench.h - pieces shared by the benchmark workloads in this directory:
 * the SIGTERM flag, the data pattern and the atomic pid file.
 */
#ifndef STASIS_BENCH_H
#define STASIS_BENCH_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

/* Set by on_term(); the workloads sleep until it is.  (Unused in the
 * workloads that wait for their signals with sigwaitinfo().) */
static volatile sig_atomic_t stop;

__attribute__((unused)) static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

static inline uint64_t mix64(uint64_t x)
{
	/* splitmix64 finaliser */
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

/* Writes `text` to PATH.tmp and renames it to PATH, so a reader sees all of
 * it or nothing.  Returns 0, or -1 with errno set. */
static int publish_file(const char *path, const char *text)
{
	char tmp[4096];
	FILE *f;
	int n;

	n = snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if (n < 0 || (size_t)n >= sizeof(tmp))
		return -1;
	f = fopen(tmp, "w");
	if (!f)
		return -1;
	if (fputs(text, f) == EOF || fclose(f) != 0)
		return -1;
	return rename(tmp, path);
}

/* The pid file of a single-process workload: "PID\n". */
static inline int write_pidfile(const char *path)
{
	char line[32];

	snprintf(line, sizeof(line), "%d\n", (int)getpid());
	return publish_file(path, line);
}

#endif
