/*
 * advice.c - memory areas with the properties smaps shows in `VmFlags`
 * (zdtm's maps02, maps_file_prot, mlock_setuid): each must come back with
 * the same flags and the same data.
 *
 *   advice PIDFILE [fork]
 *
 * With `fork`, no MADV_WIPEONFORK area and no MAP_DROPPABLE one (which is
 * wipe-on-fork too): a concurrent dump by fork snapshot refuses them (the
 * snapshot holds them zeroed).
 *
 * Areas of 8 anonymous private pages, each filled with its own pattern:
 *   MADV_DONTFORK (dc), MADV_SEQUENTIAL (sr), MADV_RANDOM (rr),
 *   MADV_DONTDUMP (dd), MADV_HUGEPAGE (hg), MADV_NOHUGEPAGE (nh),
 *   MADV_WIPEONFORK (wf), MADV_MERGEABLE (mg, if this kernel has KSM),
 *   mlock (lo), mlock2(MLOCK_ONFAULT) (lo lf; only its first 4 pages are
 *   touched), MAP_NORESERVE (nr), MAP_DROPPABLE (dp, if this kernel has it;
 *   its data is not checked: the kernel may drop it, and a restore brings
 *   it back empty).
 * And a file (advice.data, in the current directory) opened read-write,
 * mapped MAP_SHARED with PROT_READ only (mw), the fd closed. And 8 pages
 * with guard pages (MADV_GUARD_INSTALL) at pages 2 and 5 (zdtm's maps12;
 * if this kernel has them).
 *
 * Checks after SIGTERM: each area's flags among those above equal what
 * they were before "ready" (`flags`); each area's data (`memory`); the
 * shared file mapping can be made writable with mprotect (`maywrite`) and
 * a write through it reaches the file (`file`); exactly pages 2 and 5 of
 * the guarded area are guard pages (pagemap bit 58), and its other pages
 * hold their data (`guards`).
 */
#include "zdtm.h"

#include <sys/mman.h>
#include <sys/syscall.h>

#ifndef MAP_DROPPABLE
#define MAP_DROPPABLE 0x08
#endif
#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif
#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#define MADV_GUARD_REMOVE 103
#endif
#define PM_GUARD_REGION (1ull << 58)

#define PAGES 8
#define SEED 0x61647669636500ull
#define F_DATA "advice.data"

static const char *const mnemonics[] = { "dc", "sr", "rr", "dd", "hg", "nh", "wf",
					 "mg", "lo", "lf", "nr", "dp", "mw" };
#define NMNEM (sizeof(mnemonics) / sizeof(mnemonics[0]))

struct area {
	const char *what;
	unsigned char *p;
	size_t checked; /* bytes holding the pattern */
	char flags[64]; /* the mnemonics above it had before "ready" */
};

static size_t pg;
static struct area areas[16];
static int nareas;

/* The mnemonics of `mnemonics` in the VmFlags of the area holding `addr`,
 * in a fixed order, into out. Returns 0, or -1 if the area is not found. */
static int vmflags_of(const void *addr, char *out, size_t size)
{
	static char smaps[1 << 20];
	unsigned long a, b, want = (unsigned long)addr;
	char *line, *save = NULL;
	int in = 0;

	if (zdtm_read_text("/proc/self/smaps", smaps, sizeof(smaps)) <= 0)
		return -1;
	for (line = strtok_r(smaps, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		size_t key = strcspn(line, " ");

		/* An area's first line ("a-b perms ..."), not a "Key:" line. */
		if (key > 0 && line[key - 1] != ':' && sscanf(line, "%lx-%lx ", &a, &b) == 2) {
			in = a <= want && want < b;
			continue;
		}
		if (!in || strncmp(line, "VmFlags:", 8))
			continue;
		out[0] = 0;
		for (size_t i = 0; i < NMNEM; i++) {
			char tok[5];

			snprintf(tok, sizeof(tok), " %s", mnemonics[i]);
			/* Each flag is " xx" followed by a space or the end. */
			for (char *s = strstr(line, tok); s; s = strstr(s + 1, tok))
				if (s[3] == ' ' || s[3] == 0) {
					strncat(out, tok, size - strlen(out) - 1);
					break;
				}
		}
		return 0;
	}
	return -1;
}

/* An anonymous area of PAGES pages mapped with `flags`, filled (its first
 * `touched` pages) with pattern SEED + index; NULL if this kernel refuses
 * `flags` with EINVAL. */
static unsigned char *anon(const char *what, int flags, size_t touched)
{
	unsigned char *p = mmap(NULL, PAGES * pg, PROT_READ | PROT_WRITE, flags | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		if (errno == EINVAL)
			return NULL;
		zdtm_die("mmap %s", what);
	}
	areas[nareas] = (struct area){ .what = what, .p = p, .checked = touched * pg };
	zdtm_fill(p, touched * pg, SEED + (uint64_t)nareas);
	nareas++;
	return p;
}

/* Whether page `i` of `p` is a guard page (-1 if pagemap cannot say). */
static int guarded(const unsigned char *p, size_t i)
{
	uint64_t e;
	int fd = open("/proc/self/pagemap", O_RDONLY);
	ssize_t n = fd < 0 ? -1 : pread(fd, &e, sizeof(e), (off_t)(((uintptr_t)p / pg + i) * 8));

	if (fd >= 0)
		close(fd);
	return n == sizeof(e) ? !!(e & PM_GUARD_REGION) : -1;
}

/* An area given `advice`; skipped if this kernel lacks it (EINVAL). */
static void advised(const char *what, int advice)
{
	unsigned char *p = anon(what, MAP_PRIVATE, PAGES);

	if (madvise(p, PAGES * pg, advice)) {
		if (errno != EINVAL)
			zdtm_die("madvise %s", what);
		areas[--nareas].p = NULL;
		munmap(p, PAGES * pg);
	}
}

int main(int argc, char **argv)
{
	unsigned char *file, *p, *guard;
	char now[64];
	int fd, i, fork_only;

	zdtm_init(argc, argv, 1, "[fork]");
	pg = (size_t)sysconf(_SC_PAGESIZE);

	advised("dontfork", MADV_DONTFORK);
	advised("sequential", MADV_SEQUENTIAL);
	advised("random", MADV_RANDOM);
	advised("dontdump", MADV_DONTDUMP);
	advised("hugepage", MADV_HUGEPAGE);
	advised("nohugepage", MADV_NOHUGEPAGE);
	fork_only = argc > 2 && !strcmp(argv[2], "fork");
	if (!fork_only)
		advised("wipeonfork", MADV_WIPEONFORK);
	advised("mergeable", MADV_MERGEABLE);
	p = anon("locked", MAP_PRIVATE, PAGES);
	if (mlock(p, PAGES * pg))
		zdtm_die("mlock");
	p = anon("locked on fault", MAP_PRIVATE, 0);
	if (syscall(SYS_mlock2, p, PAGES * pg, MLOCK_ONFAULT))
		zdtm_die("mlock2");
	zdtm_fill(p, PAGES / 2 * pg, SEED + (uint64_t)(nareas - 1));
	areas[nareas - 1].checked = PAGES / 2 * pg;
	anon("noreserve", MAP_PRIVATE | MAP_NORESERVE, PAGES);
	if (!fork_only && (p = anon("droppable", MAP_DROPPABLE, 0)) != NULL)
		memset(p, 0x5a, PAGES * pg);

	fd = open(F_DATA, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)(PAGES * pg)))
		zdtm_die("creating %s", F_DATA);
	file = mmap(NULL, PAGES * pg, PROT_READ, MAP_SHARED, fd, 0);
	if (file == MAP_FAILED)
		zdtm_die("mmap %s", F_DATA);
	close(fd);
	areas[nareas++] = (struct area){ .what = "shared file", .p = file };

	for (i = 0; i < nareas; i++)
		if (vmflags_of(areas[i].p, areas[i].flags, sizeof(areas[i].flags)))
			zdtm_die("no smaps entry for %s", areas[i].what);

	guard = mmap(NULL, PAGES * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (guard == MAP_FAILED)
		zdtm_die("mmap guarded");
	zdtm_fill(guard, PAGES * pg, SEED + 100);
	if (madvise(guard + 2 * pg, pg, MADV_GUARD_INSTALL) ||
	    madvise(guard + 5 * pg, pg, MADV_GUARD_INSTALL) || guarded(guard, 2) != 1) {
		if (errno != EINVAL && guarded(guard, 2) != -1)
			zdtm_die("MADV_GUARD_INSTALL");
		munmap(guard, PAGES * pg);
		guard = NULL;
	}

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("flags", madvise(areas[0].p, PAGES * pg, MADV_DOFORK));
	ZDTM_CORRUPT("memory", areas[1].p[pg + 5] ^= 0x10);
	ZDTM_CORRUPT("guards", madvise(guard + 2 * pg, pg, MADV_GUARD_REMOVE));
	ZDTM_CORRUPT("maywrite", {
		int ro = open(F_DATA, O_RDONLY);
		mmap(file, PAGES * pg, PROT_READ, MAP_SHARED | MAP_FIXED, ro, 0);
		close(ro);
	});
	for (i = 0; i < nareas; i++) {
		if (vmflags_of(areas[i].p, now, sizeof(now))) {
			zdtm_fail("flags", "%s: no area at %p any more", areas[i].what, areas[i].p);
			continue;
		}
		zdtm_check(!strcmp(now, areas[i].flags), "flags", "%s: VmFlags [%s], was [%s]",
			   areas[i].what, now, areas[i].flags);
		zdtm_verify_pattern("memory", areas[i].what, areas[i].p, areas[i].checked,
				    SEED + (uint64_t)i);
	}
	for (i = 0; guard && i < PAGES; i++) {
		int want = i == 2 || i == 5;

		if (!zdtm_check(guarded(guard, (size_t)i) == want, "guards",
				"page %d of the guarded area: guard %d, want %d", i,
				guarded(guard, (size_t)i), want) || want)
			continue;
		for (size_t k = 0; k < pg; k++)
			if (guard[i * pg + k] != zdtm_pat_byte(SEED + 100, i * pg + k)) {
				zdtm_fail("guards", "page %d of the guarded area: byte %zu differs", i, k);
				break;
			}
	}
	if (zdtm_check(mprotect(file, PAGES * pg, PROT_READ | PROT_WRITE) == 0, "maywrite",
		       "mprotect(PROT_WRITE) of the shared file mapping: %s", strerror(errno))) {
		char back = 0;

		file[3 * pg + 7] = 'w';
		fd = open(F_DATA, O_RDONLY);
		zdtm_check(fd >= 0 && pread(fd, &back, 1, (off_t)(3 * pg + 7)) == 1 && back == 'w',
			   "file", "a write through the mapping did not reach %s", F_DATA);
		close(fd);
	}
	zdtm_finish();
}
