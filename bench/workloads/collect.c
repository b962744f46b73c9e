/*
 * collect.c - cost of collecting the dirty set, for bench/collect.py.
 *
 *   collect SIZE_MIB REPS VEC_LEN PCT [PCT...]
 *
 * Everything happens in this one process, on its own memory:
 *
 *   1. map SIZE_MIB MiB of private anonymous memory (MADV_NOHUGEPAGE: 4 KiB
 *      pages) and write every page, so that every page is present;
 *   2. create a userfaultfd (syscall, O_CLOEXEC|O_NONBLOCK) with
 *      UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED and register the
 *      region in write-protect mode, as Stasis's uffd tracker does in a
 *      target;
 *   3. for each PCT and each pattern (scattered: each page written with
 *      probability PCT/100, chosen by a hash of its index; contiguous: the
 *      first PCT% of the pages):
 *      a. arm: one PAGEMAP_SCAN with PM_SCAN_WP_MATCHING|PM_SCAN_CHECK_WPASYNC
 *         over the region (write-protects every page), timed;
 *      b. write 1 byte to each chosen page (timed: the first-write faults);
 *      c. REPS times each, interleaved, timed with CLOCK_MONOTONIC:
 *         - scan: PAGEMAP_SCAN on /proc/self/pagemap, category_mask =
 *           return_mask = PAGE_IS_WRITTEN, a vector of VEC_LEN page_regions,
 *           looping until walk_end == end; the regions are merged and their
 *           pages counted (what Stasis's tracker does at a checkpoint);
 *         - pagemap: pread() of the region's whole range of /proc/self/pagemap
 *           (8 bytes a page, one call) and a loop over the entries that
 *           builds the same list of written ranges: present (bit 63) and not
 *           uffd-wp protected (bit 57).  This is the classic way (CRIU with
 *           soft-dirty reads the same file and tests bit 55 instead);
 *      d. once, after the timed reps: scan + re-arm in one PAGEMAP_SCAN
 *         call (PM_SCAN_WP_MATCHING), timed: collection and re-protection.
 *      Both methods must find exactly the pages written, else FAIL.
 *
 * Output, one line per measurement:
 *   arm PCT PATTERN NS
 *   write PCT PATTERN PAGES NS
 *   scan PCT PATTERN PAGES REGIONS CALLS NS
 *   pagemap PCT PATTERN PAGES REGIONS NS READ_NS   (READ_NS: the pread part)
 *   rearm PCT PATTERN PAGES REGIONS CALLS NS
 * and "PASS" at the end (or "FAIL: ..." and exit 1).
 *
 * The kernel ABI is defined here when the installed headers are older than
 * the running kernel (PAGEMAP_SCAN: Linux 6.7; WP_ASYNC: 6.7).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <linux/fs.h>
#include <linux/userfaultfd.h>

#include "bench.h"

#define PAGE 4096ul

#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif

#ifndef PAGEMAP_SCAN
#define PAGE_IS_WPALLOWED (1 << 0)
#define PAGE_IS_WRITTEN (1 << 1)
#define PAGE_IS_FILE (1 << 2)
#define PAGE_IS_PRESENT (1 << 3)
#define PAGE_IS_SWAPPED (1 << 4)
#define PAGE_IS_PFNZERO (1 << 5)
#define PAGE_IS_HUGE (1 << 6)
#define PAGE_IS_SOFT_DIRTY (1 << 7)

struct page_region {
	uint64_t start;
	uint64_t end;
	uint64_t categories;
};

#define PM_SCAN_WP_MATCHING (1 << 0)
#define PM_SCAN_CHECK_WPASYNC (1 << 1)

struct pm_scan_arg {
	uint64_t size;
	uint64_t flags;
	uint64_t start;
	uint64_t end;
	uint64_t walk_end;
	uint64_t vec;
	uint64_t vec_len;
	uint64_t max_pages;
	uint64_t category_inverted;
	uint64_t category_mask;
	uint64_t category_anyof_mask;
	uint64_t return_mask;
};

#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#endif

_Static_assert(sizeof(struct pm_scan_arg) == 96, "pm_scan_arg");
_Static_assert(sizeof(struct page_region) == 24, "page_region");

#define PM_PRESENT (1ull << 63)
#define PM_UFFD_WP (1ull << 57)

static char *buf;
static size_t size, npages;
static int pagemap_fd;
static struct page_region *vec;
static size_t vec_len;
static uint64_t *pm_buf;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what)
{
	printf("FAIL: %s: %s\n", what, strerror(errno));
	exit(1);
}

struct result {
	uint64_t pages, regions, calls;
	uint64_t read_ns; /* pagemap_read(): the pread() part */
};

/* PAGEMAP_SCAN for written pages over the region (flags 0: look only, or
 * PM_SCAN_WP_MATCHING|PM_SCAN_CHECK_WPASYNC: look and re-protect). */
static struct result scan(uint64_t flags)
{
	struct result r = { 0, 0, 0, 0 };
	uint64_t cur = (uint64_t)buf, end = (uint64_t)buf + size, last_end = 0;

	while (cur < end) {
		struct pm_scan_arg arg = {
			.size = sizeof(arg),
			.flags = flags,
			.start = cur,
			.end = end,
			.vec = (uint64_t)vec,
			.vec_len = vec_len,
			.category_mask = PAGE_IS_WRITTEN,
			.return_mask = PAGE_IS_WRITTEN,
		};
		long n = ioctl(pagemap_fd, PAGEMAP_SCAN, &arg);
		long i;

		if (n < 0)
			die("PAGEMAP_SCAN");
		r.calls++;
		for (i = 0; i < n; i++) {
			uint64_t s = vec[i].start, e = vec[i].end;

			if (s < last_end)
				s = last_end;
			if (s >= e)
				continue;
			if (s != last_end)
				r.regions++; /* adjacent regions are merged */
			r.pages += (e - s) / PAGE;
			last_end = e;
		}
		if (arg.walk_end <= cur)
			break;
		cur = arg.walk_end;
	}
	return r;
}

/* pread the pagemap of the region and find the written pages in it. */
static struct result pagemap_read(void)
{
	struct result r = { 0, 0, 1, 0 };
	uint64_t t0 = now_ns();
	off_t off = (off_t)((uint64_t)buf / PAGE * 8);
	size_t want = npages * 8, got = 0;
	int prev = 0;
	size_t i;

	while (got < want) {
		ssize_t n = pread(pagemap_fd, (char *)pm_buf + got, want - got, off + (off_t)got);

		if (n <= 0)
			die("pread pagemap");
		got += (size_t)n;
	}
	r.read_ns = now_ns() - t0;
	for (i = 0; i < npages; i++) {
		uint64_t e = pm_buf[i];
		int w = (e & PM_PRESENT) && !(e & PM_UFFD_WP);

		if (w) {
			r.pages++;
			if (!prev)
				r.regions++;
		}
		prev = w;
	}
	return r;
}

static int chosen(size_t i, unsigned pct, int contiguous)
{
	if (contiguous)
		return i < npages * pct / 100;
	return mix64(i ^ 0x636f6c6c656374ull) % 10000 < pct * 100ull;
}

int main(int argc, char **argv)
{
	struct uffdio_api api;
	struct uffdio_register reg;
	unsigned long mib, reps;
	int uffd, a, pat;
	size_t i;

	if (argc < 5) {
		fprintf(stderr, "usage: %s SIZE_MIB REPS VEC_LEN PCT [PCT...]\n", argv[0]);
		return 2;
	}
	mib = strtoul(argv[1], NULL, 10);
	reps = strtoul(argv[2], NULL, 10);
	vec_len = strtoul(argv[3], NULL, 10);
	if (!mib || !reps || !vec_len) {
		fprintf(stderr, "collect: SIZE_MIB, REPS and VEC_LEN must be positive\n");
		return 2;
	}
	size = (size_t)mib << 20;
	npages = size / PAGE;

	buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		die("mmap");
	if (madvise(buf, size, MADV_NOHUGEPAGE))
		die("madvise");
	for (i = 0; i < npages; i++)
		buf[i * PAGE] = 1;
	vec = calloc(vec_len, sizeof(*vec));
	pm_buf = malloc(npages * 8);
	if (!vec || !pm_buf)
		die("malloc");
	/* Fault the helper buffers in now, not inside a timed call. */
	memset(pm_buf, 0, npages * 8);
	memset(vec, 0, vec_len * sizeof(*vec));

	pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (pagemap_fd < 0)
		die("open /proc/self/pagemap");
	uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (uffd < 0)
		die("userfaultfd");
	memset(&api, 0, sizeof(api));
	api.api = UFFD_API;
	api.features = UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED;
	if (ioctl(uffd, UFFDIO_API, &api))
		die("UFFDIO_API (WP_ASYNC|WP_UNPOPULATED)");
	memset(&reg, 0, sizeof(reg));
	reg.range.start = (uint64_t)buf;
	reg.range.len = size;
	reg.mode = UFFDIO_REGISTER_MODE_WP;
	if (ioctl(uffd, UFFDIO_REGISTER, &reg))
		die("UFFDIO_REGISTER (WP)");

	/* Untimed warm-up of both methods (the first pagemap read of a process
	 * is slower than the next ones). */
	scan(PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC);
	scan(0);
	pagemap_read();

	for (a = 4; a < argc; a++) {
		unsigned pct = (unsigned)strtoul(argv[a], NULL, 10);

		if (pct > 100) {
			fprintf(stderr, "collect: PCT must be 0-100\n");
			return 2;
		}
		for (pat = 0; pat < 2; pat++) {
			const char *pname = pat ? "contiguous" : "scattered";
			uint64_t t0, want = 0;
			struct result r;
			unsigned long k;

			t0 = now_ns();
			scan(PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC);
			printf("arm %u %s %llu\n", pct, pname, (unsigned long long)(now_ns() - t0));
			r = scan(0);
			if (r.pages != 0) {
				printf("FAIL: %llu pages still written after arming\n", (unsigned long long)r.pages);
				return 1;
			}
			t0 = now_ns();
			for (i = 0; i < npages; i++) {
				if (chosen(i, pct, pat)) {
					((volatile char *)buf)[i * PAGE] = 2;
					want++;
				}
			}
			printf("write %u %s %llu %llu\n", pct, pname, (unsigned long long)want,
			       (unsigned long long)(now_ns() - t0));
			for (k = 0; k < reps; k++) {
				struct result p;

				t0 = now_ns();
				r = scan(0);
				printf("scan %u %s %llu %llu %llu %llu\n", pct, pname, (unsigned long long)r.pages,
				       (unsigned long long)r.regions, (unsigned long long)r.calls,
				       (unsigned long long)(now_ns() - t0));
				t0 = now_ns();
				p = pagemap_read();
				printf("pagemap %u %s %llu %llu %llu %llu\n", pct, pname, (unsigned long long)p.pages,
				       (unsigned long long)p.regions, (unsigned long long)(now_ns() - t0),
				       (unsigned long long)p.read_ns);
				if (r.pages != want || p.pages != want || r.regions != p.regions) {
					printf("FAIL: %u%% %s: wrote %llu pages; PAGEMAP_SCAN found %llu in %llu ranges, "
					       "pagemap %llu in %llu ranges\n", pct, pname, (unsigned long long)want,
					       (unsigned long long)r.pages, (unsigned long long)r.regions,
					       (unsigned long long)p.pages, (unsigned long long)p.regions);
					return 1;
				}
			}
			t0 = now_ns();
			r = scan(PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC);
			printf("rearm %u %s %llu %llu %llu %llu\n", pct, pname, (unsigned long long)r.pages,
			       (unsigned long long)r.regions, (unsigned long long)r.calls,
			       (unsigned long long)(now_ns() - t0));
			if (r.pages != want) {
				printf("FAIL: scan+re-arm found %llu pages, wrote %llu\n", (unsigned long long)r.pages,
				       (unsigned long long)want);
				return 1;
			}
			fflush(stdout);
		}
	}
	printf("PASS\n");
	return 0;
}
