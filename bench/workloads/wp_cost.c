/*
 * wp_cost.c - what re-protecting the written pages costs the kernel, for
 * bench/README.md (issue 18, section 2: the freeze of an incremental
 * checkpoint under kept write-protection protects every written run again).
 *
 *   cc -O2 -o /tmp/wp_cost bench/workloads/wp_cost.c && sudo /tmp/wp_cost [MIB]
 *
 * Maps MIB MiB (default 4096) of 4 KiB pages, writes them all, registers
 * them with a userfaultfd in write-protect mode (synchronous, as `stasis
 * run --cow-method uffd` does) and protects them. Then, 3 times: lifts the
 * protection of a scattered 1% of the pages (as writes would) and times,
 * in thread CPU time, protecting them again one UFFDIO_WRITEPROTECT per
 * page, against one ioctl over the whole range, and against runs merged
 * across gaps of at most 16, 64 and 256 pages.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096ul

static int uffd;

static double cpu_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void wp(unsigned long a, unsigned long len, int on)
{
	struct uffdio_writeprotect w = {
		.range = { a, len },
		.mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0,
	};

	if (ioctl(uffd, UFFDIO_WRITEPROTECT, &w)) {
		perror("wp_cost: UFFDIO_WRITEPROTECT");
		exit(1);
	}
}

int main(int argc, char **argv)
{
	unsigned long mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 4096, n = mib << 8, k = 0;
	size_t len = mib << 20;
	unsigned long gaps[] = { 16, 64, 256 };
	unsigned long *sel;
	char *p;
	int rep, g;

	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED || madvise(p, len, MADV_NOHUGEPAGE)) {
		perror("wp_cost: mmap");
		return 1;
	}
	for (size_t i = 0; i < len; i += PAGE)
		p[i] = 1;
	uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register r = { .range = { (unsigned long)p, len }, .mode = UFFDIO_REGISTER_MODE_WP };
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api) || ioctl(uffd, UFFDIO_REGISTER, &r)) {
		perror("wp_cost: userfaultfd");
		return 1;
	}
	wp((unsigned long)p, len, 1);
	sel = malloc(n * sizeof(*sel));
	srand(1);
	for (unsigned long i = 0; i < n; i++)
		if (rand() % 100 == 0)
			sel[k++] = i;
	for (rep = 0; rep < 3; rep++) {
		double t0, t1;

		for (unsigned long j = 0; j < k; j++)
			wp((unsigned long)p + sel[j] * PAGE, PAGE, 0);
		t0 = cpu_s();
		for (unsigned long j = 0; j < k; j++)
			wp((unsigned long)p + sel[j] * PAGE, PAGE, 1);
		t1 = cpu_s();
		printf("%lu of %lu pages: one ioctl each %.1f ms (%.2f us an ioctl)", k, n, (t1 - t0) * 1e3,
		       (t1 - t0) * 1e6 / k);
		for (unsigned long j = 0; j < k; j++)
			wp((unsigned long)p + sel[j] * PAGE, PAGE, 0);
		t0 = cpu_s();
		wp((unsigned long)p, len, 1);
		printf(", whole range %.1f ms", (cpu_s() - t0) * 1e3);
		for (g = 0; g < 3; g++) {
			unsigned long s = sel[0], e = sel[0] + 1, nio = 0;

			for (unsigned long j = 0; j < k; j++)
				wp((unsigned long)p + sel[j] * PAGE, PAGE, 0);
			t0 = cpu_s();
			for (unsigned long j = 1; j <= k; j++) {
				if (j < k && sel[j] - e <= gaps[g]) {
					e = sel[j] + 1;
					continue;
				}
				wp((unsigned long)p + s * PAGE, (e - s) * PAGE, 1);
				nio++;
				if (j < k) {
					s = sel[j];
					e = s + 1;
				}
			}
			printf(", gaps <= %lu merged %.1f ms (%lu ioctls)", gaps[g], (cpu_s() - t0) * 1e3, nio);
		}
		printf("\n");
	}
	return 0;
}
