/*
 * shm_parts.c - shared anonymous memory that processes map in different
 * parts (zdtm's maps01): one object, mapped whole by a child and only in
 * parts, at offsets other than 0, by the root, must come back as one
 * object with every page, each area at its offset in it.
 *
 *   shm_parts PIDFILE
 *
 * Set up before "ready": the root maps a 4 MiB shared anonymous object
 * and fills it with pattern(SEED) (before forking, so the pages exist),
 * forks K (which keeps the whole mapping), then unmaps its first MiB and
 * moves its last MiB elsewhere (mremap): the root maps [1, 3) MiB and
 * [3, 4) MiB of the object, K all of it; the first MiB is in K's mapping
 * only.
 *
 * After SIGTERM (root):
 *   root  its two areas hold the pattern (`root-mem`); /proc/self/maps
 *         gives them offsets 1 MiB and 3 MiB (`offsets`); it writes a
 *         marker at object offset 2 MiB and sends SIGTERM to K.
 *   K     the whole object holds the pattern (the first MiB: `front`,
 *         the rest: `K-mem`) but for the root's marker, which it sees
 *         (`shared`); it writes a reply at object offset 3.5 MiB and exits
 *         with its result bits.
 *   root  waits for K, turns its bits into tags, and sees K's reply
 *         through its moved area (`shared`).
 * The root also maps the object's third MiB privately (through
 * /proc/self/map_files; zdtm's shmemfd-priv) and writes a word to its
 * second page before "ready": after SIGTERM the private mapping sees the
 * root's marker (not copied on write) and keeps its word, which never
 * reached the object (`private`).
 */
#include "zdtm.h"

#include <sys/mman.h>
#include <sys/wait.h>

#define MIB (1UL << 20)
#define SIZE (4 * MIB)
#define SEED 0x5eed0fa27ULL
#define MARK 0x6d61726b65723231ULL  /* root's marker at 2 MiB */
#define REPLY 0x7265706c79323131ULL /* K's reply at 3.5 MiB */
#define PRIV 0x7072697661746521ULL  /* the root's private copy's word */

enum { R_FRONT = 1, R_K_MEM = 2, R_SHARED = 4, R_NBITS = 3 };
static const char *const tags[R_NBITS] = { "front", "K-mem", "shared" };

/* Whether [off, off + len) of the object (mapped at BASE, object offset
 * FROM) holds the pattern, but for the 8 bytes at SKIP (object offset). */
static int pattern_ok(const char *base, size_t from, size_t off, size_t len, size_t skip)
{
	size_t i;

	for (i = off; i < off + len; i += 8) {
		uint64_t w;

		if (i == skip)
			continue;
		memcpy(&w, base + (i - from), 8);
		if (w != zdtm_pat_word(SEED, i >> 3))
			return 0;
	}
	return 1;
}

static void run_k(char *m)
{
	int bits = 0;
	uint64_t w;

	while (!zdtm_stop)
		zdtm_msleep(50);
	if (ZDTM_SELFTEST)
		m[MIB / 2] ^= 1; /* front */
	if (!pattern_ok(m, 0, 0, MIB, SIZE)) {
		zdtm_child_fail("K", "front", "the first MiB (mapped by K only) lost its pattern");
		bits |= R_FRONT;
	}
	if (!pattern_ok(m, 0, MIB, SIZE - MIB, 2 * MIB)) {
		zdtm_child_fail("K", "K-mem", "MiB 1-4 of the object lost their pattern");
		bits |= R_K_MEM;
	}
	memcpy(&w, m + 2 * MIB, 8);
	if (w != MARK) {
		zdtm_child_fail("K", "shared", "the root's marker is not at 2 MiB (%#llx)",
				(unsigned long long)w);
		bits |= R_SHARED;
	}
	w = REPLY;
	memcpy(m + 3 * MIB + MIB / 2, &w, 8);
	_exit(bits);
}

/* The offset /proc/self/maps gives the area starting at ADDR (-1: none). */
static long long maps_offset(const void *addr)
{
	char line[512];
	long long off = -1;
	FILE *f = fopen("/proc/self/maps", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long start, end;
		unsigned long long o;
		char perms[8];

		if (sscanf(line, "%lx-%lx %7s %llx", &start, &end, perms, &o) == 4 &&
		    start == (unsigned long)addr)
			off = (long long)o;
	}
	fclose(f);
	return off;
}

int main(int argc, char **argv)
{
	char *m, *mid, *last, *hole, *priv;
	uint64_t w;
	pid_t k;
	int st = 0, i;
	long long want_last = 3 * MIB;

	zdtm_init(argc, argv, 0, "");
	m = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		zdtm_die("mmap %lu bytes shared", SIZE);
	zdtm_fill(m, SIZE, SEED);
	k = fork();
	if (k < 0)
		zdtm_die("fork");
	if (k == 0)
		run_k(m);
	/* A free place for the last MiB: reserved, then replaced. */
	hole = mmap(NULL, MIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (hole == MAP_FAILED)
		zdtm_die("mmap a hole");
	last = mremap(m + 3 * MIB, MIB, MIB, MREMAP_MAYMOVE | MREMAP_FIXED, hole);
	if (last == MAP_FAILED)
		zdtm_die("mremap the last MiB");
	if (munmap(m, MIB))
		zdtm_die("munmap the first MiB");
	mid = m + MIB;
	{
		/* A private mapping of the object's third MiB (zdtm's
		 * shmemfd-priv), its second page copied on write. */
		char path[64];
		int fd;

		snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", (unsigned long)mid,
			 (unsigned long)(mid + 2 * MIB));
		fd = open(path, O_RDWR);
		if (fd < 0)
			zdtm_die("open %s (needs CAP_SYS_ADMIN)", path);
		priv = mmap(NULL, MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 2 * MIB);
		if (priv == MAP_FAILED)
			zdtm_die("mmap the object privately");
		close(fd);
		w = PRIV;
		memcpy(priv + 4096, &w, 8);
	}

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("root-mem", mid[MIB + 3] ^= 0x40);
	ZDTM_CORRUPT("offsets", want_last += 4096);
	zdtm_check(pattern_ok(mid, MIB, MIB, 2 * MIB, SIZE) && pattern_ok(last, 3 * MIB, 3 * MIB, MIB, SIZE),
		   "root-mem", "the root's areas lost their pattern");
	zdtm_check(maps_offset(mid) == (long long)MIB, "offsets",
		   "the area at %p has offset %#llx, expected %#lx", (void *)mid, maps_offset(mid), MIB);
	zdtm_check(maps_offset(last) == want_last, "offsets",
		   "the area at %p has offset %#llx, expected %#llx", (void *)last, maps_offset(last),
		   want_last);
	w = MARK;
	ZDTM_CORRUPT("shared", w = 0);
	memcpy(mid + MIB, &w, 8);
	/* The private mapping reads the object where it did not copy on
	 * write (the marker just written), and keeps its copy. */
	ZDTM_CORRUPT("private", memcpy(priv + 4096, &w, 8));
	memcpy(&w, priv, 8);
	zdtm_check(w == MARK, "private", "the private mapping does not see the object's marker (%#llx)",
		   (unsigned long long)w);
	memcpy(&w, priv + 4096, 8);
	zdtm_check(w == PRIV, "private", "the private copy lost its word (%#llx)",
		   (unsigned long long)w);
	zdtm_check(pattern_ok(mid, MIB, 2 * MIB + 4096, 4096, SIZE), "private",
		   "the private copy's write reached the object");
	ZDTM_CORRUPT("front", (void)0);
	zdtm_check(kill(k, SIGTERM) == 0, "shared", "kill(K = %d): errno %d", (int)k, errno);
	if (zdtm_wait_deadline(k, &st, 30000) != 0 || !WIFEXITED(st)) {
		zdtm_fail("shared", "K (pid %d) did not exit (status %#x)", (int)k, st);
		kill(k, SIGKILL);
	} else {
		for (i = 0; i < R_NBITS; i++)
			zdtm_check(!(WEXITSTATUS(st) & (1 << i)), tags[i], "see stderr");
	}
	memcpy(&w, last + MIB / 2, 8);
	zdtm_check(w == REPLY, "shared", "K's reply is not at 3.5 MiB (%#llx)", (unsigned long long)w);
	zdtm_finish();
}
