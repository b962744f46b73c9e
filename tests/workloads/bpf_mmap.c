/*
 * bpf_mmap.c - a BPF_F_MMAPABLE array mapped in the process's memory: the
 * map made again with its values and the areas put back at the same
 * addresses with the same protection, on that map.
 *
 *   bpf_mmap PIDFILE
 *
 * Needs CAP_BPF (root). Set up before "ready", with bpf(2) directly: an
 * array "wl_mmap" of 1024 8-byte values (two pages), BPF_F_MMAPABLE,
 * filled with pattern words through its fd; mapped whole read-write
 * shared at A, and its second page read-only shared at B; a hash
 * "wl_mmap_other" (not mappable) held too. Value 5 is then written
 * through A.
 * After SIGTERM (tags in brackets):
 *   [mmap-area]   A and B are where they were, "rw-s" and "r--s", at map
 *                 offsets 0 and 0x1000, mapping anon_inode:bpf-map;
 *   [mmap-values] every value reads the same through A (and B for the
 *                 second page) and through the fd, the pattern (value 5
 *                 the one written through A);
 *   [mmap-shared] a value written through A is what a lookup through the
 *                 fd gives, and one updated through the fd is what A and
 *                 B read.
 */
#include "bpf_sys.h"

#include <linux/bpf.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#define SEED_B 0x626d6d6170ull
#define N 1024
#define PAGE 4096
#define WRITTEN 0x5151515151515151ull

static __u64 want(__u32 i)
{
	return i == 5 ? WRITTEN : zdtm_pat_word(SEED_B, i);
}

/* The maps line of the area starting at `at`: its permissions and
 * offset, and whether it maps a BPF map, ending at `end`. */
static void check_area(void *at, void *end, const char *perms, unsigned long off, const char *what)
{
	char line[512], p[8], name[256];
	unsigned long s, e, o;
	FILE *f = fopen("/proc/self/maps", "r");
	int found = 0;

	if (!zdtm_check(f != NULL, "mmap-area", "/proc/self/maps: %s", strerror(errno)))
		return;
	while (fgets(line, sizeof(line), f)) {
		name[0] = 0;
		if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %255s", &s, &e, p, &o, name) < 4)
			continue;
		if (s != (unsigned long)at)
			continue;
		found = 1;
		zdtm_check(e == (unsigned long)end && strcmp(p, perms) == 0 && o == off &&
				   strcmp(name, "anon_inode:bpf-map") == 0,
			   "mmap-area", "%s: %s", what, line);
	}
	fclose(f);
	zdtm_check(found, "mmap-area", "%s: no area at %p", what, at);
}

int main(int argc, char **argv)
{
	volatile __u64 *a, *b;
	__u32 i, k;
	__u64 v, w;
	int fd, other;

	zdtm_init(argc, argv, 0, "");
	fd = create(BPF_MAP_TYPE_ARRAY, 4, 8, N, BPF_F_MMAPABLE, "wl_mmap");
	other = create(BPF_MAP_TYPE_HASH, 4, 8, 8, 0, "wl_mmap_other");
	for (i = 0; i < N; i++) {
		v = zdtm_pat_word(SEED_B, i);
		if (update(fd, &i, &v))
			zdtm_die("update %u: %s", i, strerror(errno));
	}
	k = 1;
	v = 77;
	if (update(other, &k, &v))
		zdtm_die("update of the hash: %s", strerror(errno));
	a = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	b = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, PAGE);
	if (a == MAP_FAILED || b == MAP_FAILED)
		zdtm_die("mmap: %s", strerror(errno));
	a[5] = WRITTEN;

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);

	ZDTM_CORRUPT("mmap-values", a[3] ^= 1);
	ZDTM_CORRUPT("mmap-area", {
		munmap((void *)b, PAGE);
		b = mmap((void *)b, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		for (i = 0; i < PAGE / 8; i++)
			b[i] = a[N / 2 + i];
	});
	ZDTM_CORRUPT("mmap-shared", {
		static __u64 copy[2 * PAGE / 8];

		memcpy(copy, (void *)a, sizeof(copy));
		mmap((void *)a, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		memcpy((void *)a, copy, sizeof(copy));
	});

	check_area((void *)a, (char *)a + 2 * PAGE, "rw-s", 0, "A");
	check_area((void *)b, (char *)b + PAGE, "r--s", PAGE, "B");
	for (i = 0; i < N; i++) {
		v = a[i];
		if (!zdtm_check(lookup(fd, &i, &w) == 0, "mmap-values", "lookup %u: %s", i,
				strerror(errno)))
			break;
		zdtm_check(v == want(i) && w == want(i), "mmap-values",
			   "value %u: %#llx through A, %#llx through the fd, expected %#llx", i,
			   (unsigned long long)v, (unsigned long long)w, (unsigned long long)want(i));
		if (i >= N / 2)
			zdtm_check(b[i - N / 2] == v, "mmap-values", "value %u: %#llx through B", i,
				   (unsigned long long)b[i - N / 2]);
	}
	a[10] = 0x1010;
	i = 10;
	w = 0;
	zdtm_check(lookup(fd, &i, &w) == 0 && w == 0x1010, "mmap-shared",
		   "written through A, the fd reads %#llx", (unsigned long long)w);
	i = N - 1;
	v = 0x7777;
	zdtm_check(update(fd, &i, &v) == 0 && a[N - 1] == 0x7777 && b[N / 2 - 1] == 0x7777,
		   "mmap-shared", "updated through the fd, A reads %#llx, B %#llx",
		   (unsigned long long)a[N - 1], (unsigned long long)b[N / 2 - 1]);
	k = 1;
	zdtm_check(lookup(other, &k, &v) == 0 && v == 77, "mmap-values", "the hash lost its value");
	zdtm_finish();
	return 0;
}
