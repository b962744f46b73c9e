/*
 * hugetlb.c - huge-page memory must come back on huge pages, with its data
 * (zdtm's maps09, memfd02-hugetlb).
 *
 *   hugetlb PIDFILE
 *
 * Needs 6 free huge pages of the default size (scripts/test.sh keeps a
 * pool: /proc/sys/vm/nr_hugepages). Set up before "ready":
 *   S  MAP_HUGETLB | MAP_SHARED | MAP_ANONYMOUS, 2 huge pages;
 *   P  MAP_HUGETLB | MAP_PRIVATE | MAP_ANONYMOUS, 2 huge pages;
 *   M  a memfd_create(MFD_HUGETLB) of 2 huge pages, mapped shared (and
 *      its fd kept open).
 *   In each, the first and last 4 KiB of every huge page get a pattern.
 *   Each area's device (from /proc/self/maps) is kept.
 * After SIGTERM (tags in brackets):
 *   [data]  every pattern is there;
 *   [huge]  each area is still a huge-page one: the same device, and
 *           smaps says KernelPageSize is the huge page size.
 */
#include "zdtm.h"

#include <sys/mman.h>

#define SEED 0x6875676500ull

static size_t hp;

struct area {
	const char *name;
	unsigned char *p;
	size_t len;
	char dev[16];
};

/* The device ("MM:mm") and kernel page size (KiB) of the area at p. */
static int dev_of(const void *p, char *dev, size_t devlen, long *kps)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	int found = 0;

	if (!f)
		return -1;
	*kps = -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long s, e;
		char d[16];

		if (sscanf(line, "%lx-%lx %*s %*s %15s", &s, &e, d) == 3 && strchr(line, '-') < strchr(line, ' ')) {
			found = (unsigned long)p >= s && (unsigned long)p < e;
			if (found)
				snprintf(dev, devlen, "%s", d);
			continue;
		}
		if (found && sscanf(line, "KernelPageSize: %ld kB", kps) == 1)
			break;
	}
	fclose(f);
	return *kps > 0 ? 0 : -1;
}

static void fill(struct area *a, int k)
{
	for (size_t off = 0; off < a->len; off += hp) {
		zdtm_fill(a->p + off, 4096, SEED + (uint64_t)(k * 64 + (int)(off / hp) * 2));
		zdtm_fill(a->p + off + hp - 4096, 4096, SEED + (uint64_t)(k * 64 + (int)(off / hp) * 2 + 1));
	}
}

static void verify(struct area *a, int k)
{
	unsigned char want[4096];

	for (size_t off = 0; off < a->len; off += hp) {
		zdtm_fill(want, 4096, SEED + (uint64_t)(k * 64 + (int)(off / hp) * 2));
		zdtm_check(!memcmp(a->p + off, want, 4096), "data", "%s: start of huge page %zu", a->name,
			   off / hp);
		zdtm_fill(want, 4096, SEED + (uint64_t)(k * 64 + (int)(off / hp) * 2 + 1));
		zdtm_check(!memcmp(a->p + off + hp - 4096, want, 4096), "data",
			   "%s: end of huge page %zu", a->name, off / hp);
	}
}

int main(int argc, char **argv)
{
	struct area a[3] = { { .name = "S" }, { .name = "P" }, { .name = "M" } };
	long kps;
	int fd, k;

	zdtm_init(argc, argv, 0, "");
	{
		FILE *f = fopen("/proc/meminfo", "r");
		char line[256];
		long kb = 0;

		while (f && fgets(line, sizeof(line), f))
			if (sscanf(line, "Hugepagesize: %ld kB", &kb) == 1)
				break;
		if (f)
			fclose(f);
		if (kb <= 0)
			zdtm_die("no huge page size in /proc/meminfo");
		hp = (size_t)kb * 1024;
	}
	for (k = 0; k < 3; k++)
		a[k].len = 2 * hp;
	a[0].p = mmap(NULL, a[0].len, PROT_READ | PROT_WRITE,
		      MAP_HUGETLB | MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	a[1].p = mmap(NULL, a[1].len, PROT_READ | PROT_WRITE,
		      MAP_HUGETLB | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	fd = memfd_create("wl_huge", MFD_HUGETLB | MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)a[2].len))
		zdtm_die("memfd_create(MFD_HUGETLB)");
	a[2].p = mmap(NULL, a[2].len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	for (k = 0; k < 3; k++) {
		if (a[k].p == MAP_FAILED)
			zdtm_die("mapping %s (free huge pages? /proc/sys/vm/nr_hugepages)", a[k].name);
		fill(&a[k], k);
		if (dev_of(a[k].p, a[k].dev, sizeof(a[k].dev), &kps) || (size_t)kps * 1024 != hp)
			zdtm_die("%s: not a huge-page area (kernel page size %ld kB)", a[k].name, kps);
	}

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("data", a[1].p[hp + 5] ^= 1);
	ZDTM_CORRUPT("huge", {
		void *n = mmap(a[0].p, a[0].len, PROT_READ | PROT_WRITE,
			       MAP_FIXED | MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (n != MAP_FAILED)
			fill(&a[0], 0);
	});

	for (k = 0; k < 3; k++) {
		char dev[16] = "";

		verify(&a[k], k);
		zdtm_check(dev_of(a[k].p, dev, sizeof(dev), &kps) == 0 && (size_t)kps * 1024 == hp &&
				   !strcmp(dev, a[k].dev),
			   "huge", "%s: device %s (was %s), kernel page size %ld kB", a[k].name, dev,
			   a[k].dev, kps);
	}
	zdtm_finish();
}
