/*
 * mappings.c - a variety of memory mappings and protections.
 *
 *   mappings PIDFILE
 *
 * Files (created, or truncated and recreated, in the current directory):
 *   mappings.data    16 pages, mapped MAP_PRIVATE read-write   (c)
 *   mappings.shared   8 pages, mapped MAP_SHARED  read-write   (d)
 *   mappings.ro       4 pages, mapped MAP_PRIVATE read-only    (f)
 *
 * Regions:
 *   (a) ro      8 anonymous pages, written, then mprotect(PROT_READ)
 *   (b) none    4 anonymous pages, written, then mprotect(PROT_NONE)
 *   (c) priv    pages 2,5,7,11 overwritten in memory (COW); page 15 is
 *               rewritten by the main loop with a pattern of the iteration
 *               counter; other pages must still equal the file; the file on
 *               disk must be unchanged.
 *   (d) shared  written through the mapping; mapping and file (pread) must
 *               agree; after SIGTERM a new write through the mapping must
 *               reach the file.
 *   (e) hole    3 anonymous pages, middle one unmapped: first/last keep their
 *               data, the middle stays unmapped (mincore -> ENOMEM).
 *   (f) rofile  read-only private file mapping, never written.
 * The protections (and, for file mappings, the file names) are also checked
 * in /proc/self/maps.  No fds are kept open: the mappings are the only
 * references to the files.
 *
 * Note: nothing is mmap()ed after the hole is made (stdout has a static
 * buffer, /proc/self/maps is read with read() into a static buffer), so the
 * hole cannot legitimately be filled by the workload itself.
 */
#include "zdtm.h"

#include <sys/mman.h>
#include <sys/stat.h>

#define SEED_RO       0x6d61702d726f00ull
#define SEED_NONE     0x6d61702d6e6f00ull
#define SEED_PRIVFILE 0x6d61702d706600ull
#define SEED_PRIVMOD  0x6d61702d706d00ull
#define SEED_COUNTER  0x6d61702d637400ull
#define SEED_SHARED   0x6d61702d736800ull
#define SEED_SHARED2  0x6d61702d733200ull
#define SEED_HOLE     0x6d61702d686f00ull
#define SEED_ROFILE   0x6d61702d726600ull

#define RO_PAGES     8
#define NONE_PAGES   4
#define PRIV_PAGES   16
#define PRIV_COUNTER 15
#define SHARED_PAGES 8
#define ROFILE_PAGES 4

#define F_PRIV   "mappings.data"
#define F_SHARED "mappings.shared"
#define F_ROFILE "mappings.ro"

static const int priv_modified[] = { 2, 5, 7, 11 };
static size_t pg;

static int is_modified(int page)
{
	size_t i;

	for (i = 0; i < sizeof(priv_modified) / sizeof(priv_modified[0]); i++)
		if (priv_modified[i] == page)
			return 1;
	return 0;
}

/* Create NAME holding pattern(seed) of len bytes, return an fd (O_RDWR). */
static int make_file(const char *name, size_t len, uint64_t seed)
{
	static uint8_t buf[1 << 16];
	int fd = open(name, O_RDWR | O_CREAT | O_TRUNC, 0644);
	size_t off = 0;

	if (fd < 0)
		zdtm_die("open %s", name);
	if (len > sizeof(buf))
		zdtm_die("file too large");
	zdtm_fill(buf, len, seed);
	while (off < len) {
		ssize_t n = write(fd, buf + off, len - off);

		if (n <= 0)
			zdtm_die("write %s", name);
		off += (size_t)n;
	}
	return fd;
}

static void *map_or_die(size_t len, int prot, int flags, int fd,
			const char *what)
{
	void *p = mmap(NULL, len, prot, flags, fd, 0);

	if (p == MAP_FAILED)
		zdtm_die("mmap %s", what);
	return p;
}

/* Read NAME fully (must be exactly len bytes) into buf. */
static int read_file(const char *name, uint8_t *buf, size_t len)
{
	int fd = open(name, O_RDONLY);
	struct stat st;
	size_t off = 0;

	if (fd < 0) {
		zdtm_fail("file", "open %s: %s", name, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) || (size_t)st.st_size != len) {
		zdtm_fail("file", "%s: size %lld, expected %zu", name,
			  (long long)st.st_size, len);
		close(fd);
		return -1;
	}
	while (off < len) {
		ssize_t n = pread(fd, buf + off, len - off, (off_t)off);

		if (n <= 0) {
			zdtm_fail("file", "pread %s: %s", name,
				  n ? strerror(errno) : "EOF");
			close(fd);
			return -1;
		}
		off += (size_t)n;
	}
	close(fd);
	return 0;
}

/* ---- /proc/self/maps ---- */

static char maps_buf[1 << 18];

static void load_maps(void)
{
	int fd = open("/proc/self/maps", O_RDONLY);
	size_t len = 0;

	maps_buf[0] = 0;
	if (fd < 0) {
		zdtm_fail("perms", "open /proc/self/maps: %s", strerror(errno));
		return;
	}
	for (;;) {
		ssize_t n = read(fd, maps_buf + len, sizeof(maps_buf) - 1 - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	maps_buf[len] = 0;
	close(fd);
}

/* Find the line covering addr; copy perms and path.  Returns 0 if found. */
static int find_map(const void *addr, char perms[8], char *path,
		    size_t pathlen)
{
	const char *line = maps_buf;
	uintptr_t a = (uintptr_t)addr;

	while (*line) {
		const char *eol = strchr(line, '\n');
		unsigned long start, end;
		char p[8];
		int pos = 0;

		if (sscanf(line, "%lx-%lx %7s %*s %*s %*s%n", &start, &end, p,
			   &pos) == 3 && a >= start && a < end) {
			const char *s = line + pos;
			size_t n;

			while (*s == ' ')
				s++;
			n = eol ? (size_t)(eol - s) : strlen(s);
			if (n >= pathlen)
				n = pathlen - 1;
			memcpy(path, s, n);
			path[n] = 0;
			memcpy(perms, p, 8);
			return 0;
		}
		if (!eol)
			break;
		line = eol + 1;
	}
	return -1;
}

static void check_map(const char *what, const void *addr, const char *perms,
		      const char *file)
{
	char p[8], path[PATH_MAX];

	if (find_map(addr, p, path, sizeof(path))) {
		zdtm_fail("perms", "%s at %p: not in /proc/self/maps", what,
			  addr);
		return;
	}
	zdtm_check(strcmp(p, perms) == 0, "perms",
		   "%s at %p: perms '%s', expected '%s'", what, addr, p, perms);
	if (file) {
		size_t lp = strlen(path), lf = strlen(file);

		zdtm_check(lp > lf && path[lp - lf - 1] == '/' &&
			   strcmp(path + lp - lf, file) == 0, "perms",
			   "%s at %p: maps to '%s', expected .../%s", what,
			   addr, path, file);
	}
}

int main(int argc, char **argv)
{
	static uint8_t filebuf[1 << 16];
	uint8_t *ro, *none, *priv, *shared, *hole, *rofile;
	uint64_t counter = 0;
	unsigned char vec[4];
	int fd, i;

	zdtm_init(argc, argv, 0, "");
	pg = (size_t)sysconf(_SC_PAGESIZE);

	/* (a) */
	ro = map_or_die(RO_PAGES * pg, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS, -1, "ro");
	zdtm_fill(ro, RO_PAGES * pg, SEED_RO);
	if (mprotect(ro, RO_PAGES * pg, PROT_READ))
		zdtm_die("mprotect ro");

	/* (b) */
	none = map_or_die(NONE_PAGES * pg, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, "none");
	zdtm_fill(none, NONE_PAGES * pg, SEED_NONE);
	if (mprotect(none, NONE_PAGES * pg, PROT_NONE))
		zdtm_die("mprotect none");

	/* (c) */
	fd = make_file(F_PRIV, PRIV_PAGES * pg, SEED_PRIVFILE);
	priv = map_or_die(PRIV_PAGES * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE,
			  fd, F_PRIV);
	close(fd);
	for (i = 0; i < PRIV_PAGES; i++)
		if (is_modified(i))
			zdtm_fill(priv + i * pg, pg, SEED_PRIVMOD + i);

	/* (d) */
	fd = open(F_SHARED, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || ftruncate(fd, SHARED_PAGES * pg))
		zdtm_die("create %s", F_SHARED);
	shared = map_or_die(SHARED_PAGES * pg, PROT_READ | PROT_WRITE,
			    MAP_SHARED, fd, F_SHARED);
	close(fd);
	zdtm_fill(shared, SHARED_PAGES * pg, SEED_SHARED);

	/* (f) */
	fd = make_file(F_ROFILE, ROFILE_PAGES * pg, SEED_ROFILE);
	rofile = map_or_die(ROFILE_PAGES * pg, PROT_READ, MAP_PRIVATE, fd,
			    F_ROFILE);
	close(fd);

	/* (e) last: nothing is mapped after the hole exists */
	hole = map_or_die(3 * pg, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, "hole");
	zdtm_fill(hole, pg, SEED_HOLE + 0);
	zdtm_fill(hole + 2 * pg, pg, SEED_HOLE + 2);
	if (munmap(hole + pg, pg))
		zdtm_die("munmap hole");

	zdtm_ready();

	while (!zdtm_stop) {
		uint64_t next = counter + 1;

		zdtm_fill(priv + PRIV_COUNTER * pg, pg, SEED_COUNTER ^ next);
		counter = next;
		zdtm_usleep(1000);
	}

	/* ---------------- corruption hooks (selftest only) ---------------- */
	ZDTM_CORRUPT("ro-data", mprotect(ro, pg, PROT_READ | PROT_WRITE),
		     ro[10] ^= 1, mprotect(ro, pg, PROT_READ));
	ZDTM_CORRUPT("none-data", mprotect(none, pg, PROT_READ | PROT_WRITE),
		     none[pg / 2] ^= 1, mprotect(none, pg, PROT_NONE));
	ZDTM_CORRUPT("perms", mprotect(none + pg, pg, PROT_READ));
	ZDTM_CORRUPT("priv-modified", priv[2 * pg + 7] ^= 1);
	ZDTM_CORRUPT("priv-unmodified", priv[4 * pg] ^= 1);
	ZDTM_CORRUPT("priv-counter", priv[PRIV_COUNTER * pg + 1] ^= 1);
	ZDTM_CORRUPT("priv-file", {
		int cfd = open(F_PRIV, O_RDWR);
		uint8_t b = 0xAA;

		if (cfd < 0 || pwrite(cfd, &b, 1, (off_t)(5 * pg + 9)) != 1)
			abort();
		close(cfd);
	});
	ZDTM_CORRUPT("shared-data", {
		int cfd = open(F_SHARED, O_RDWR);
		uint8_t b = (uint8_t)~shared[pg + 3];

		if (cfd < 0 || pwrite(cfd, &b, 1, (off_t)(pg + 3)) != 1)
			abort();
		close(cfd);
	});
	ZDTM_CORRUPT("shared-writeback", {
		int cfd = open(F_SHARED, O_RDWR);

		if (cfd < 0 || mmap(shared, SHARED_PAGES * pg,
				    PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_FIXED, cfd, 0) != shared)
			abort();
		close(cfd);
	});
	ZDTM_CORRUPT("hole-data", hole[2 * pg + 17] ^= 1);
	ZDTM_CORRUPT("hole-gap",
		     mmap(hole + pg, pg, PROT_READ,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
			  -1, 0));
	ZDTM_CORRUPT("rofile-data",
		     mprotect(rofile, pg, PROT_READ | PROT_WRITE),
		     rofile[pg - 1] ^= 1, mprotect(rofile, pg, PROT_READ));

	/* ---------------- verification ---------------- */
	load_maps();
	check_map("(a) read-only anon", ro, "r--p", NULL);
	for (i = 0; i < NONE_PAGES; i++)
		check_map("(b) PROT_NONE anon", none + i * pg, "---p", NULL);
	check_map("(c) private file", priv, "rw-p", F_PRIV);
	check_map("(d) shared file", shared, "rw-s", F_SHARED);
	check_map("(e) hole first page", hole, "rw-p", NULL);
	check_map("(e) hole last page", hole + 2 * pg, "rw-p", NULL);
	check_map("(f) read-only file", rofile, "r--p", F_ROFILE);

	/* (a) */
	zdtm_verify_pattern("ro-data", "(a) read-only anon", ro, RO_PAGES * pg,
			    SEED_RO);

	/* (b) */
	if (mprotect(none, NONE_PAGES * pg, PROT_READ))
		zdtm_fail("none-data", "mprotect(PROT_READ): %s",
			  strerror(errno));
	else
		zdtm_verify_pattern("none-data", "(b) PROT_NONE anon", none,
				    NONE_PAGES * pg, SEED_NONE);

	/* (c) */
	zdtm_fill(filebuf, PRIV_PAGES * pg, SEED_PRIVFILE);
	for (i = 0; i < PRIV_PAGES; i++) {
		char what[96];

		if (i == PRIV_COUNTER && counter > 0) {
			snprintf(what, sizeof(what),
				 "(c) private page %d (counter %llu)", i,
				 (unsigned long long)counter);
			zdtm_verify_pattern("priv-counter", what, priv + i * pg,
					    pg, SEED_COUNTER ^ counter);
		} else if (is_modified(i)) {
			snprintf(what, sizeof(what),
				 "(c) modified private page %d", i);
			zdtm_verify_pattern("priv-modified", what,
					    priv + i * pg, pg,
					    SEED_PRIVMOD + i);
		} else {
			/* unmodified page i == file pattern at offset i*pg */
			snprintf(what, sizeof(what),
				 "(c) unmodified private page %d", i);
			zdtm_verify_mem("priv-unmodified", what, priv + i * pg,
					filebuf + i * pg, pg);
		}
	}
	if (!read_file(F_PRIV, filebuf, PRIV_PAGES * pg))
		zdtm_verify_pattern("priv-file", "(c) " F_PRIV " on disk",
				    filebuf, PRIV_PAGES * pg, SEED_PRIVFILE);

	/* (d) */
	zdtm_verify_pattern("shared-data", "(d) shared mapping", shared,
			    SHARED_PAGES * pg, SEED_SHARED);
	if (!read_file(F_SHARED, filebuf, SHARED_PAGES * pg)) {
		zdtm_verify_pattern("shared-data", "(d) " F_SHARED " on disk",
				    filebuf, SHARED_PAGES * pg, SEED_SHARED);
		zdtm_verify_mem("shared-data", "(d) mapping vs file", shared,
				filebuf, SHARED_PAGES * pg);
	}
	zdtm_fill(shared + 3 * pg, pg, SEED_SHARED2);
	if (!read_file(F_SHARED, filebuf, SHARED_PAGES * pg))
		zdtm_verify_pattern("shared-writeback",
				    "(d) page 3 of " F_SHARED
				    " after writing through the mapping",
				    filebuf + 3 * pg, pg, SEED_SHARED2);

	/* (e) */
	zdtm_verify_pattern("hole-data", "(e) hole first page", hole, pg,
			    SEED_HOLE + 0);
	zdtm_verify_pattern("hole-data", "(e) hole last page", hole + 2 * pg,
			    pg, SEED_HOLE + 2);
	errno = 0;
	zdtm_check(mincore(hole + pg, pg, vec) == -1 && errno == ENOMEM,
		   "hole-gap", "(e) middle page %p: mincore returned errno %d "
		   "(%s), expected ENOMEM (unmapped)", (void *)(hole + pg),
		   errno, strerror(errno));
	zdtm_check(mincore(hole, pg, vec) == 0 &&
		   mincore(hole + 2 * pg, pg, vec) == 0, "hole-data",
		   "(e) first/last page: mincore failed: %s", strerror(errno));
	{
		char p[8], path[PATH_MAX];

		zdtm_check(find_map(hole + pg, p, path, sizeof(path)) != 0,
			   "hole-gap", "(e) middle page %p is in "
			   "/proc/self/maps (perms %s)", (void *)(hole + pg),
			   p);
	}

	/* (f) */
	zdtm_verify_pattern("rofile-data", "(f) read-only file mapping",
			    rofile, ROFILE_PAGES * pg, SEED_ROFILE);
	if (!read_file(F_ROFILE, filebuf, ROFILE_PAGES * pg)) {
		zdtm_verify_pattern("rofile-data", "(f) " F_ROFILE " on disk",
				    filebuf, ROFILE_PAGES * pg, SEED_ROFILE);
	}

	zdtm_finish();
}
