/*
 * ldt_write.c - the LDT first-write micro-benchmark, for bench/ldt.py.
 *
 *   ldt_write CTLDIR SIZE_MIB MODE [huge]   MODE: plain | mprotect
 *
 * Maps SIZE_MIB MiB of private anonymous memory (MADV_NOHUGEPAGE: 4 KiB
 * pages, as in LDT; with "huge", 2 MiB-aligned and MADV_HUGEPAGE:
 * transparent huge pages, as a large heap gets where THP is on), writes one byte to every page so that every page is
 * present, writable and dirty, then writes CTLDIR/pid and waits in
 * sigwaitinfo() (SIGUSR1, SIGTERM blocked).
 *
 * Each SIGUSR1 is one measured round k = 1, 2, ...:
 *   - mprotect mode only, not timed: arm the classic user-space tracker,
 *     mprotect(buf, SIZE, PROT_READ) and clear its dirty bitmap (the time is
 *     reported as arm_ns);
 *   - pass 1, timed with CLOCK_MONOTONIC: write 1 byte (value k + 1) to
 *     every page, in address order (the LDT micro-benchmark);
 *   - pass 2, timed the same way: the same writes again (value k + 1 again,
 *     to a page that now is dirty and writable in every mode), the cost of
 *     the same loop once tracking has seen every page;
 *   - the result goes to CTLDIR/round.K (written to .tmp, then renamed):
 *     "pages P\nfirst_ns T1\nsecond_ns T2\narm_ns A\nfaults F\n".
 * In mprotect mode a SIGSEGV handler records the faulting page in a bitmap
 * and mprotects that page back to PROT_READ|PROT_WRITE (one fault, one
 * mprotect per first write: the classic tracker).  F is the number of
 * faults it took during pass 1 (it must be P) and during pass 2 (0).
 *
 * Before it writes CTLDIR/pid it also times 5 x 100000 getppid() system
 * calls and writes the fastest batch's cost per call to CTLDIR/syscall
 * ("syscall_ns X"): the price of one kernel entry and exit on this machine,
 * which bounds from below what any fault-based tracker costs per page.
 *
 * On SIGTERM it checks that every page holds the value of the last round
 * (or 1, the touch value, if there was none), that in mprotect mode every
 * page was recorded in every round, and prints PASS or FAIL: ... .
 *
 * Single-threaded; no pipes, sockets or extra fds.  Start it with stdin from
 * /dev/null and stdout/stderr to a regular file so it can be checkpointed.
 */
#define _GNU_SOURCE
#include <errno.h>
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

#define PAGE 4096ul
#define HUGE (2ul << 20)

static char *buf;
static size_t size, npages;
static uint64_t *bitmap;
static volatile uint64_t faults;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	uintptr_t a = (uintptr_t)si->si_addr;
	size_t pg;

	(void)sig;
	(void)uc;
	if (a < (uintptr_t)buf || a >= (uintptr_t)buf + size)
		abort(); /* a real crash, not the tracker */
	pg = (a - (uintptr_t)buf) / PAGE;
	bitmap[pg / 64] |= 1ull << (pg % 64);
	faults++;
	if (mprotect(buf + pg * PAGE, PAGE, PROT_READ | PROT_WRITE))
		abort();
}

/* One pass: 1 byte to every page, in address order. */
static uint64_t pass(char value)
{
	volatile char *p = buf;
	uint64_t t0, t1;
	size_t i;

	t0 = now_ns();
	for (i = 0; i < npages; i++)
		p[i * PAGE] = value;
	t1 = now_ns();
	return t1 - t0;
}

int main(int argc, char **argv)
{
	char path[4096], text[512];
	unsigned long mib, rounds = 0;
	size_t i, nwords;
	int mprot, huge, sig, bad = 0;
	sigset_t set;
	char *end;

	if (argc != 4 && !(argc == 5 && !strcmp(argv[4], "huge"))) {
		fprintf(stderr, "usage: %s CTLDIR SIZE_MIB plain|mprotect [huge]\n", argv[0]);
		return 2;
	}
	huge = argc == 5;
	errno = 0;
	mib = strtoul(argv[2], &end, 10);
	if (errno || *end || mib == 0) {
		fprintf(stderr, "ldt_write: bad SIZE_MIB '%s'\n", argv[2]);
		return 2;
	}
	if (!strcmp(argv[3], "plain"))
		mprot = 0;
	else if (!strcmp(argv[3], "mprotect"))
		mprot = 1;
	else {
		fprintf(stderr, "ldt_write: MODE must be plain or mprotect\n");
		return 2;
	}
	size = (size_t)mib << 20;
	npages = size / PAGE;
	nwords = (npages + 63) / 64;

	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigaddset(&set, SIGTERM);
	if (sigprocmask(SIG_BLOCK, &set, NULL)) {
		perror("ldt_write: sigprocmask");
		return 2;
	}
	if (mprot) {
		struct sigaction sa;

		memset(&sa, 0, sizeof(sa));
		sa.sa_sigaction = on_segv;
		sa.sa_flags = SA_SIGINFO;
		sigemptyset(&sa.sa_mask);
		if (sigaction(SIGSEGV, &sa, NULL)) {
			perror("ldt_write: sigaction");
			return 2;
		}
		bitmap = calloc(nwords, sizeof(*bitmap));
		if (!bitmap) {
			perror("ldt_write: calloc");
			return 2;
		}
	}

	buf = mmap(NULL, size + (huge ? HUGE : 0), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		   -1, 0);
	if (buf == MAP_FAILED) {
		perror("ldt_write: mmap");
		return 2;
	}
	if (huge)
		buf = (char *)(((uintptr_t)buf + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
	if (madvise(buf, size, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE)) {
		perror("ldt_write: madvise");
		return 2;
	}
	for (i = 0; i < npages; i++)
		buf[i * PAGE] = 1;

	{
		uint64_t best = UINT64_MAX;
		int b, c;

		for (b = 0; b < 5; b++) {
			uint64_t t0 = now_ns();

			for (c = 0; c < 100000; c++)
				syscall(SYS_getppid);
			if (now_ns() - t0 < best)
				best = now_ns() - t0;
		}
		snprintf(text, sizeof(text), "syscall_ns %.1f\n", (double)best / 100000.0);
		snprintf(path, sizeof(path), "%s/syscall", argv[1]);
		if (publish_file(path, text)) {
			perror("ldt_write: syscall file");
			return 2;
		}
	}

	snprintf(path, sizeof(path), "%s/pid", argv[1]);
	if (write_pidfile(path)) {
		perror("ldt_write: pidfile");
		return 2;
	}

	for (;;) {
		uint64_t arm_ns = 0, first, second, f1, f2;
		char value;

		sig = sigwaitinfo(&set, NULL);
		if (sig < 0) {
			if (errno == EINTR)
				continue; /* e.g. after a ptrace stop */
			perror("ldt_write: sigwaitinfo");
			return 2;
		}
		if (sig == SIGTERM)
			break;
		rounds++;
		value = (char)(rounds + 1);
		if (mprot) {
			uint64_t t0 = now_ns();

			if (mprotect(buf, size, PROT_READ)) {
				perror("ldt_write: mprotect");
				return 2;
			}
			memset(bitmap, 0, nwords * sizeof(*bitmap));
			faults = 0;
			arm_ns = now_ns() - t0;
		}
		first = pass(value);
		f1 = faults;
		second = pass(value);
		f2 = faults - f1;
		if (mprot) {
			for (i = 0; i < npages; i++)
				if (!(bitmap[i / 64] >> (i % 64) & 1))
					bad++;
			if (f1 != npages || f2 != 0)
				bad++;
		}
		snprintf(text, sizeof(text),
			 "pages %zu\nfirst_ns %llu\nsecond_ns %llu\narm_ns %llu\nfaults %llu\nfaults_second %llu\n",
			 npages, (unsigned long long)first, (unsigned long long)second,
			 (unsigned long long)arm_ns, (unsigned long long)f1, (unsigned long long)f2);
		snprintf(path, sizeof(path), "%s/round.%lu", argv[1], rounds);
		if (publish_file(path, text)) {
			perror("ldt_write: result file");
			return 2;
		}
	}

	{
		char want = (char)(rounds ? rounds + 1 : 1);
		size_t wrong = 0, first_wrong = 0;

		for (i = 0; i < npages; i++) {
			if (buf[i * PAGE] != want) {
				if (!wrong)
					first_wrong = i;
				wrong++;
			}
		}
		if (wrong || bad) {
			printf("FAIL: %zu of %zu pages hold the wrong value (first: page %zu), %d tracker errors\n",
			       wrong, npages, first_wrong, bad);
			fflush(stdout);
			return 1;
		}
	}
	printf("PASS\n");
	fflush(stdout);
	return 0;
}
