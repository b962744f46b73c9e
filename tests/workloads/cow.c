/*
 * cow.c - private memory shared copy-on-write between a parent and its
 * children (a forked server and its workers) must be shared again once
 * restored, not copied for every process (zdtm's cow00, cow01, at scale).
 *
 *   cow PIDFILE [noshare]
 *
 * With "noshare" only the content and the tree are checked, not the
 * sharing (a lazy restore gives each process its own pages).
 *
 * Set up before "ready" (region: 8 MiB of private anonymous memory between
 * two PROT_NONE pages, each page i filled with pattern (S0, i); ro: 16
 * pages, filled, then read-only; c = i % 16):
 *   R (root)  fills both, forks A, then B; once both are set up writes its
 *             pages c == 1 (seed SR) and drops c == 7 (MADV_DONTNEED).
 *   A         writes c == 2 (SA), forks G, writes c == 3 (SA), and page 0
 *             of ro (made writable for that, then read-only again).
 *   G         (A's child) writes c == 4 (SG).
 *   B         writes c == 5 (SB), drops c == 6.
 *
 * After SIGTERM each process checks, the root first, then (signalled by
 * their parent once it has checked itself) A and B, then G:
 *   content  every byte of both areas is what it wrote, or what it had at
 *            its fork, or zero where it dropped the page;
 *   shared   (children) each page neither the process nor its parent wrote
 *            since the fork has the same frame as in the parent
 *            (/proc/PID/pagemap, root only), each page it wrote another;
 *   memory   the pages of the region mapped by this process alone (smaps
 *            Private_*) are at most the two classes it may own (1/8 of it,
 *            plus 8 pages): not a copy of the whole region.
 * A child reports mismatches on stderr and exits with bits; the root turns
 * them into tags ("child" when one did not exit as it should).
 */
#include "zdtm.h"

#include <sys/mman.h>

#define PAGE 4096ul
#define NPAGES 2048ul
#define RO_PAGES 16ul

#define S0 0x5eed0000ull
#define SR 0x5eed0001ull
#define SA 0x5eed0002ull
#define SG 0x5eed0003ull
#define SB 0x5eed0004ull
#define S_RO 0x5eed0005ull
#define S_RO_A 0x5eed0006ull

enum { B_CONTENT = 1, B_SHARED = 2, B_MEMORY = 4, B_CHILD = 8, NBITS = 4 };
static const char *const tags[NBITS] = { "content", "shared", "memory", "child" };

static uint8_t *region, *ro;
static int noshare;
static const char *who = "R";

enum { ROOT, CHILD_A, CHILD_G, CHILD_B };

/* The seed of page i of the region in process `p` (0: zero page). */
static uint64_t seed_of(int p, unsigned long i)
{
	unsigned long c = i % 16;

	switch (p) {
	case ROOT:
		return c == 1 ? SR : c == 7 ? 0 : S0;
	case CHILD_A:
		return c == 2 || c == 3 ? SA : S0;
	case CHILD_G:
		return c == 2 ? SA : c == 4 ? SG : S0;
	default:
		return c == 5 ? SB : c == 6 ? 0 : S0;
	}
}

/* Whether page i must be shared with the parent (1), must not (0), or
 * either (-1: a page one of them dropped). */
static int shared_of(int p, unsigned long i)
{
	unsigned long c = i % 16;

	switch (p) {
	case CHILD_A:
		return c == 7 ? -1 : !(c == 1 || c == 2 || c == 3);
	case CHILD_G:
		return !(c == 3 || c == 4);
	case CHILD_B:
		return c == 6 || c == 7 ? -1 : !(c == 1 || c == 5);
	default:
		return -1;
	}
}

static void fill_page(uint8_t *p, uint64_t seed, unsigned long i)
{
	zdtm_fill(p, PAGE, seed ^ (i * 0x9E37ull));
}

static void write_class(unsigned long c, uint64_t seed)
{
	unsigned long i;

	for (i = c; i < NPAGES; i += 16)
		fill_page(region + i * PAGE, seed, i);
}

static void drop_class(unsigned long c)
{
	unsigned long i;

	for (i = c; i < NPAGES; i += 16)
		if (madvise(region + i * PAGE, PAGE, MADV_DONTNEED))
			zdtm_die("madvise(MADV_DONTNEED)");
}

static int report(int p, const char *tag, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int report(int p, const char *tag, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	if (p == ROOT)
		zdtm_vfail(tag, fmt, ap);
	else
		zdtm_child_vfail(who, tag, fmt, ap);
	va_end(ap);
	return 0;
}

static int check_content(int p)
{
	static uint8_t zero[PAGE];
	unsigned long i, bad = 0, first = 0;
	uint8_t want[PAGE];

	for (i = 0; i < NPAGES; i++) {
		uint64_t s = seed_of(p, i);
		const uint8_t *exp = zero;

		if (s) {
			fill_page(want, s, i);
			exp = want;
		}
		if (memcmp(region + i * PAGE, exp, PAGE)) {
			if (!bad++)
				first = i;
		}
	}
	if (bad)
		report(p, "content", "%lu of %lu pages of the region differ, first %lu", bad,
		       NPAGES, first);
	for (i = 0; i < RO_PAGES; i++) {
		fill_page(want, i == 0 && (p == CHILD_A) ? S_RO_A : S_RO, i);
		if (memcmp(ro + i * PAGE, want, PAGE)) {
			report(p, "content", "read-only page %lu differs", i);
			bad++;
		}
	}
	return bad ? B_CONTENT : 0;
}

/* The pagemap entries of n pages at addr in process pid. */
static int pagemap(pid_t pid, const void *addr, unsigned long n, uint64_t *out)
{
	char path[64];
	int fd;
	ssize_t r;

	snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	r = pread(fd, out, n * 8, (off_t)((uintptr_t)addr / PAGE * 8));
	close(fd);
	return r == (ssize_t)(n * 8) ? 0 : -1;
}

#define PM_PRESENT (1ull << 63)
#define PM_PFN ((1ull << 55) - 1)

/* Compares the frames of n pages at addr with the parent's; want(i) says
 * which must be shared. */
static int check_frames(int p, const uint8_t *addr, unsigned long n,
			int (*want)(int, unsigned long), const char *what)
{
	static uint64_t mine[NPAGES], theirs[NPAGES];
	unsigned long i, bad = 0, first = 0, shared = 0;

	if (pagemap(getpid(), addr, n, mine) || pagemap(getppid(), addr, n, theirs)) {
		report(p, "shared", "%s: pagemap unreadable (errno %d)", what, errno);
		return B_SHARED;
	}
	for (i = 0; i < n; i++) {
		int w = want(p, i);
		int same = (mine[i] & PM_PRESENT) && (theirs[i] & PM_PRESENT) &&
			   (mine[i] & PM_PFN) == (theirs[i] & PM_PFN);

		if ((mine[i] & PM_PRESENT) && !(mine[i] & PM_PFN)) {
			report(p, "shared", "%s: no frame numbers in pagemap (not root?)", what);
			return B_SHARED;
		}
		shared += same;
		if (w >= 0 && same != w && !bad++)
			first = i;
	}
	if (bad)
		report(p, "shared",
		       "%s: %lu of %lu pages shared with the parent as they should not be or "
		       "not as they should, first %lu (%s); %lu shared",
		       what, bad, n, first, want(p, first) ? "not shared" : "shared", shared);
	return bad ? B_SHARED : 0;
}

/* Page 0 of ro: A wrote it after it forked G. */
static int ro_want(int p, unsigned long i)
{
	return p == CHILD_B || i != 0;
}

/* Private_Clean + Private_Dirty (kB) of the area starting at `start`, which
 * must end at `end`; -1 if not found. */
static long private_kb(const void *start, const void *end)
{
	char line[256], want[64];
	long kb = -1, v;
	int in = 0;
	FILE *f = fopen("/proc/self/smaps", "r");

	if (!f)
		return -1;
	snprintf(want, sizeof(want), "%lx-%lx ", (unsigned long)(uintptr_t)start,
		 (unsigned long)(uintptr_t)end);
	while (fgets(line, sizeof(line), f)) {
		if (strchr(line, '-') && strchr(line, ' ') &&
		    strchr(line, '-') < strchr(line, ' ')) {
			in = strncmp(line, want, strlen(want)) == 0;
			if (in)
				kb = 0;
			continue;
		}
		if (in && (sscanf(line, "Private_Clean: %ld kB", &v) == 1 ||
			   sscanf(line, "Private_Dirty: %ld kB", &v) == 1))
			kb += v;
	}
	fclose(f);
	return kb;
}

static int check_memory(int p)
{
	long kb = private_kb(region, region + NPAGES * PAGE);
	unsigned long c, own = 0;
	long max;

	/* The classes it may hold alone: those not shared with its parent
	 * (the root: those it wrote or dropped). A page its parent wrote after
	 * the fork was shared by all its children; restored, the children
	 * share it with the parent's other children only where they inherit it
	 * from each other. */
	for (c = 0; c < 16; c++)
		own += p == ROOT ? (c == 1 || c == 7) : shared_of(p, c) != 1;
	max = (long)(own * NPAGES / 16 + 8) * (long)(PAGE / 1024);

	if (kb < 0 || kb > max) {
		report(p, "memory",
		       "%ld kB of the %lu kB region are this process's alone (at most %ld)", kb,
		       NPAGES * PAGE / 1024, max);
		return B_MEMORY;
	}
	return 0;
}

static int check_all(int p)
{
	int bits = check_content(p);

	if (!noshare) {
		if (p != ROOT) {
			bits |= check_frames(p, region, NPAGES, shared_of, "region");
			bits |= check_frames(p, ro, RO_PAGES, ro_want, "read-only area");
		}
		bits |= check_memory(p);
	}
	return bits;
}

static int wait_child(pid_t pid, const char *name)
{
	int st = 0;

	if (zdtm_wait_deadline(pid, &st, 30000) != 0 || !WIFEXITED(st)) {
		report(ROOT, "child", "%s (pid %d) did not exit (status %#x)", name, (int)pid, st);
		kill(pid, SIGKILL);
		return B_CHILD;
	}
	return WEXITSTATUS(st);
}

static void wait_stop(void)
{
	while (!zdtm_stop)
		zdtm_msleep(20);
}

/* A child: set up by `setup`, says so on `ready`, waits for SIGTERM,
 * checks, and signals and waits for `kid` (if any). */
static void run_child(int p, int ready, pid_t kid)
{
	int bits;

	if (write(ready, "r", 1) != 1)
		_exit(B_CHILD);
	close(ready);
	wait_stop();
	if (ZDTM_SELFTEST && p == CHILD_A) /* shared: a copy of one page */
		((volatile uint8_t *)region)[0] = region[0];
	if (ZDTM_SELFTEST && p == CHILD_G) {
		unsigned long i;

		for (i = 0; i < NPAGES; i++) /* memory: a copy of every page */
			((volatile uint8_t *)region)[i * PAGE] = region[i * PAGE];
	}
	bits = check_all(p);
	if (kid > 0) {
		if (kill(kid, SIGTERM))
			bits |= B_CHILD;
		bits |= wait_child(kid, "G");
	}
	_exit(bits);
}

int main(int argc, char **argv)
{
	int pa[2], pb[2], pg[2], bits, i;
	pid_t a, b, g;
	unsigned long k;
	uint8_t *all;
	char c;

	zdtm_init(argc, argv, 1, "[noshare]");
	noshare = argc > 2 && strcmp(argv[2], "noshare") == 0;
	all = mmap(NULL, (NPAGES + 2) * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (all == MAP_FAILED)
		zdtm_die("mmap");
	region = all + PAGE;
	if (mprotect(region, NPAGES * PAGE, PROT_READ | PROT_WRITE))
		zdtm_die("mprotect");
	ro = mmap(NULL, RO_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ro == MAP_FAILED)
		zdtm_die("mmap");
	for (k = 0; k < NPAGES; k++)
		fill_page(region + k * PAGE, S0, k);
	for (k = 0; k < RO_PAGES; k++)
		fill_page(ro + k * PAGE, S_RO, k);
	if (mprotect(ro, RO_PAGES * PAGE, PROT_READ))
		zdtm_die("mprotect");
	if (pipe(pa) || pipe(pb))
		zdtm_die("pipe");

	a = fork();
	if (a < 0)
		zdtm_die("fork");
	if (a == 0) {
		who = "A";
		close(pa[0]);
		write_class(2, SA);
		if (pipe(pg))
			_exit(B_CHILD);
		g = fork();
		if (g < 0)
			_exit(B_CHILD);
		if (g == 0) {
			who = "G";
			close(pg[0]);
			write_class(4, SG);
			run_child(CHILD_G, pg[1], 0);
		}
		close(pg[1]);
		write_class(3, SA);
		if (mprotect(ro, PAGE, PROT_READ | PROT_WRITE))
			_exit(B_CHILD);
		fill_page(ro, S_RO_A, 0);
		if (mprotect(ro, PAGE, PROT_READ))
			_exit(B_CHILD);
		if (read(pg[0], &c, 1) != 1)
			_exit(B_CHILD);
		close(pg[0]);
		run_child(CHILD_A, pa[1], g);
	}
	b = fork();
	if (b < 0)
		zdtm_die("fork");
	if (b == 0) {
		who = "B";
		close(pa[0]);
		close(pb[0]);
		write_class(5, SB);
		drop_class(6);
		run_child(CHILD_B, pb[1], 0);
	}
	if (read(pa[0], &c, 1) != 1 || read(pb[0], &c, 1) != 1)
		zdtm_die("a child did not set up");
	close(pa[0]);
	close(pa[1]);
	close(pb[0]);
	close(pb[1]);
	write_class(1, SR);
	drop_class(7);

	zdtm_ready();
	wait_stop();

	ZDTM_CORRUPT("content", region[NPAGES * PAGE / 2 + 5] ^= 1);
	ZDTM_CORRUPT("shared", (void)0);
	ZDTM_CORRUPT("memory", (void)0);
	check_all(ROOT);
	zdtm_check(kill(a, SIGTERM) == 0 && kill(b, SIGTERM) == 0, "child", "kill: errno %d",
		   errno);
	bits = wait_child(a, "A") | wait_child(b, "B");
	for (i = 0; i < NBITS; i++)
		zdtm_check(!(bits & (1 << i)), tags[i], "a child failed, see stderr");
	zdtm_finish();
}
