/*
 * hugetlbfs_files.c - files of a hugetlbfs must come back with their pages,
 * holes, sizes and owners, and a shared mapping of one must still share it
 * with the file (issue 17).
 *
 *   hugetlbfs_files PIDFILE [DIR]
 *
 * DIR is a hugetlbfs mount of the tree's own (the test mounts it in the
 * tree's mount namespace); without it, the workload unshares a mount
 * namespace and mounts one on "huge" in its directory (the self-test).
 * Needs 5 free huge pages of DIR's size. Set up before "ready" (hp: the
 * huge page size):
 *   d/       a directory, mode 0750, owned by 5:6;
 *   d/data   3 huge pages, mapped shared whole and its fd kept open; pages
 *            0 and 2 filled with a pattern, page 1 never touched (a hole);
 *            mode 0640, owned by 7:8;
 *   flat     1 huge page filled with a pattern through a mapping since
 *            unmapped, its fd closed; mode 0604;
 *   odd      hp + 100 bytes (fallocate), its first 4 KiB a pattern;
 *   empty    an empty file.
 * (Linux 6.18's hugetlbfs refuses symbolic links: EINVAL.)
 * After SIGTERM (tags in brackets):
 *   [data]   the mapping of d/data has its patterns, page 1 zeros;
 *   [hole]   d/data has 2 huge pages (st_blocks): page 1 is still a hole;
 *   [file]   d/data's kept fd reads page 0's pattern;
 *   [shared] a new pattern written through the mapping is what d/data,
 *            opened again by path, and the kept fd read;
 *   [flat]   flat reads its pattern whole, size hp, mode 0604;
 *   [odd]    odd is hp + 100 bytes, its pattern then zeros;
 *   [meta]   owners, modes, d/data's size and the empty file.
 */
#include "zdtm.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>

#define SEED 0x68666600ull

static size_t hp;
static char dir[PATH_MAX - 64];

static void path(char *out, const char *name)
{
	snprintf(out, PATH_MAX, "%s/%s", dir, name);
}

/* Whole huge page `page` of a file's pattern `seed`. */
static void fill_page(unsigned char *p, uint64_t seed, int page)
{
	zdtm_fill(p, hp, seed + (uint64_t)page);
}

static int stat_of(const char *name, struct stat *st)
{
	char p[PATH_MAX];

	path(p, name);
	return lstat(p, st);
}

int main(int argc, char **argv)
{
	char p[PATH_MAX];
	unsigned char *data, *m, *buf, want[4096];
	struct statfs sfs;
	struct stat st;
	int fd, f2;
	ssize_t n;

	zdtm_init(argc, argv, 1, "[DIR]");
	if (argc > 2) {
		snprintf(dir, sizeof(dir), "%s", argv[2]);
	} else {
		if (!getcwd(dir, sizeof(dir) - 8))
			zdtm_die("getcwd");
		strcat(dir, "/huge");
		if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL))
			zdtm_die("a mount namespace of its own");
		if (mkdir(dir, 0755) || mount("wl_huge", dir, "hugetlbfs", 0, NULL))
			zdtm_die("mounting a hugetlbfs on %s", dir);
	}
	if (statfs(dir, &sfs) || sfs.f_type != 0x958458f6)
		zdtm_die("%s is not a hugetlbfs", dir);
	hp = (size_t)sfs.f_bsize;
	buf = malloc(hp);
	if (!buf)
		zdtm_die("malloc");

	path(p, "d");
	if (mkdir(p, 0750) || chown(p, 5, 6) || chmod(p, 0750))
		zdtm_die("mkdir d");
	path(p, "d/data");
	fd = open(p, O_RDWR | O_CREAT | O_EXCL, 0640);
	if (fd < 0 || ftruncate(fd, (off_t)(3 * hp)) || fchown(fd, 7, 8))
		zdtm_die("making d/data");
	data = mmap(NULL, 3 * hp, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (data == MAP_FAILED)
		zdtm_die("mapping d/data (free huge pages? /proc/sys/vm/nr_hugepages)");
	fill_page(data, SEED, 0);
	fill_page(data + 2 * hp, SEED, 2);

	path(p, "flat");
	f2 = open(p, O_RDWR | O_CREAT | O_EXCL, 0604);
	if (f2 < 0 || ftruncate(f2, (off_t)hp) || fchmod(f2, 0604))
		zdtm_die("making flat");
	m = mmap(NULL, hp, PROT_READ | PROT_WRITE, MAP_SHARED, f2, 0);
	if (m == MAP_FAILED)
		zdtm_die("mapping flat");
	fill_page(m, SEED + 100, 0);
	munmap(m, hp);
	close(f2);

	path(p, "odd");
	f2 = open(p, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (f2 < 0 || fallocate(f2, 0, 0, (off_t)hp + 100))
		zdtm_die("making odd");
	m = mmap(NULL, hp, PROT_READ | PROT_WRITE, MAP_SHARED, f2, 0);
	if (m == MAP_FAILED)
		zdtm_die("mapping odd");
	zdtm_fill(m, 4096, SEED + 200);
	munmap(m, hp);
	close(f2);

	path(p, "empty");
	f2 = open(p, O_RDWR | O_CREAT | O_EXCL, 0644);
	if (f2 < 0)
		zdtm_die("making empty");
	close(f2);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("data", data[hp / 2] ^= 1);
	ZDTM_CORRUPT("hole", data[hp + 7] = 0);
	ZDTM_CORRUPT("shared", {
		void *q = mmap(data, 3 * hp, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE, fd, 0);
		(void)q;
	});
	ZDTM_CORRUPT("flat", {
		path(p, "flat");
		f2 = open(p, O_RDWR);
		m = mmap(NULL, hp, PROT_READ | PROT_WRITE, MAP_SHARED, f2, 0);
		if (m != MAP_FAILED)
			m[hp - 1] ^= 1;
	});
	ZDTM_CORRUPT("odd", {
		path(p, "odd");
		f2 = open(p, O_RDWR);
		(void)fallocate(f2, 0, 0, (off_t)hp + 200);
	});
	ZDTM_CORRUPT("meta", {
		path(p, "d");
		(void)chmod(p, 0700);
	});

	/* [data] */
	fill_page(buf, SEED, 0);
	zdtm_check(!memcmp(data, buf, hp), "data", "d/data: huge page 0 differs");
	fill_page(buf, SEED, 2);
	zdtm_check(!memcmp(data + 2 * hp, buf, hp), "data", "d/data: huge page 2 differs");
	/* [hole] (read before page 1 is looked at through the mapping) */
	zdtm_check(stat_of("d/data", &st) == 0 && (size_t)st.st_blocks * 512 == 2 * hp, "hole",
		   "d/data holds %lld bytes of pages, not 2 huge pages", (long long)st.st_blocks * 512);
	memset(buf, 0, hp);
	zdtm_check(!memcmp(data + hp, buf, hp), "data", "d/data: huge page 1 is not zeros");
	/* [file] */
	zdtm_fill(want, sizeof(want), SEED);
	n = pread(fd, buf, 4096, 0);
	zdtm_check(n == 4096 && !memcmp(buf, want, 4096), "file", "d/data's fd read %zd bytes", n);
	/* [shared] */
	zdtm_fill(data + 2 * hp, 4096, SEED + 300);
	zdtm_fill(want, sizeof(want), SEED + 300);
	path(p, "d/data");
	f2 = open(p, O_RDONLY);
	n = f2 < 0 ? -1 : pread(f2, buf, 4096, (off_t)(2 * hp));
	zdtm_check(n == 4096 && !memcmp(buf, want, 4096), "shared",
		   "d/data opened again does not read what the mapping wrote (%zd)", n);
	n = pread(fd, buf, 4096, (off_t)(2 * hp));
	zdtm_check(n == 4096 && !memcmp(buf, want, 4096), "shared",
		   "d/data's fd does not read what the mapping wrote (%zd)", n);
	if (f2 >= 0)
		close(f2);
	/* [flat] */
	path(p, "flat");
	f2 = open(p, O_RDONLY);
	n = f2 < 0 ? -1 : pread(f2, buf, hp, 0);
	{
		unsigned char *w = malloc(hp);

		if (!w)
			zdtm_die("malloc");
		fill_page(w, SEED + 100, 0);
		zdtm_check(n == (ssize_t)hp && !memcmp(buf, w, hp), "flat", "flat read %zd bytes",
			   n);
		free(w);
	}
	zdtm_check(stat_of("flat", &st) == 0 && st.st_size == (off_t)hp &&
			   (st.st_mode & 07777) == 0604,
		   "flat", "flat: size %lld mode %o", (long long)st.st_size, st.st_mode & 07777);
	/* [odd] */
	zdtm_check(stat_of("odd", &st) == 0 && st.st_size == (off_t)hp + 100, "odd",
		   "odd: size %lld", (long long)st.st_size);
	path(p, "odd");
	f2 = open(p, O_RDONLY);
	n = f2 < 0 ? -1 : pread(f2, buf, hp + 100, 0);
	zdtm_fill(want, sizeof(want), SEED + 200);
	zdtm_check(n == (ssize_t)hp + 100 && !memcmp(buf, want, 4096), "odd", "odd read %zd bytes",
		   n);
	{
		size_t i, nz = 0;

		for (i = 4096; n > 0 && i < (size_t)n; i++)
			nz += buf[i] != 0;
		zdtm_check(nz == 0, "odd", "odd: %zu bytes after its pattern are not zeros", nz);
	}
	/* [meta] */
	zdtm_check(stat_of("d", &st) == 0 && (st.st_mode & 07777) == 0750 && st.st_uid == 5 &&
			   st.st_gid == 6,
		   "meta", "d: mode %o owner %d:%d", st.st_mode & 07777, st.st_uid, st.st_gid);
	zdtm_check(stat_of("d/data", &st) == 0 && (st.st_mode & 07777) == 0640 &&
			   st.st_uid == 7 && st.st_gid == 8 && st.st_size == (off_t)(3 * hp),
		   "meta", "d/data: mode %o owner %d:%d size %lld", st.st_mode & 07777, st.st_uid,
		   st.st_gid, (long long)st.st_size);
	zdtm_check(stat_of("empty", &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0, "meta",
		   "empty: size %lld", (long long)st.st_size);
	zdtm_finish();
}
