/*
 * sparse_shm.c - large shared memory objects with only a few MiB written:
 * a dump must save (and a restore rebuild) only the pages that exist,
 * never fault in the holes.
 *
 *   sparse_shm PIDFILE
 *
 * Set up before "ready":
 *   sysv   System V segment of 128 MiB (IPC_PRIVATE, 0600), attached, then
 *          removed (IPC_RMID: it goes away with the process).
 *   anon   128 MiB MAP_SHARED|MAP_ANONYMOUS.
 *   memfd  memfd "sparse" of 128 MiB (ftruncate), mapped MAP_SHARED; the
 *          fd stays open; its mode made 0642 (fchmod; zdtm's memfd00).
 * In each, CHUNKS chunks of CHUNK bytes are written with pattern(seed +
 * chunk number) at the offsets in `offs` (spread over the object, the
 * last one ending at its end); everything else is never touched.  So each
 * object has 3 MiB of data and 125 MiB of holes.
 * The loop waits in nanosleep(100 ms).
 *
 * After SIGTERM, for each object: every chunk holds its pattern and every
 * other byte is zero (read through the mapping: the test measures the
 * objects' sizes before this); the memfd's mode is 0642 (`memfd-mode`).
 */
#include "zdtm.h"

#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#define OBJ_SIZE (128ul << 20)
#define CHUNK    (1ul << 20)
#define CHUNKS   3

#define SEED_SYSV  0x7370737973760000ull
#define SEED_ANON  0x7370616e6f6e0000ull
#define SEED_MEMFD 0x73706d656d666400ull

static const size_t offs[CHUNKS] = {
	0,
	(61ul << 20) + 4096 * 3,
	OBJ_SIZE - CHUNK,
};

static void fill(uint8_t *p, uint64_t seed)
{
	int i;

	for (i = 0; i < CHUNKS; i++)
		zdtm_fill(p + offs[i], CHUNK, seed + i);
}

static void check(const char *tag, const uint8_t *p, uint64_t seed)
{
	size_t off = 0, bad = 0, first = 0;
	int i;

	for (i = 0; i < CHUNKS; i++) {
		char what[64];

		for (; off < offs[i]; off++)
			if (p[off]) {
				if (!bad)
					first = off;
				bad++;
			}
		snprintf(what, sizeof(what), "chunk %d at %zu", i, offs[i]);
		zdtm_verify_pattern(tag, what, p + offs[i], CHUNK, seed + i);
		off = offs[i] + CHUNK;
	}
	for (; off < OBJ_SIZE; off++)
		if (p[off]) {
			if (!bad)
				first = off;
			bad++;
		}
	if (bad)
		zdtm_fail(tag, "%zu bytes of the holes are not zero, first at %zu",
			  bad, first);
}

int main(int argc, char **argv)
{
	uint8_t *sysv, *anon, *mem;
	int id, fd;

	zdtm_init(argc, argv, 0, "");

	id = shmget(IPC_PRIVATE, OBJ_SIZE, IPC_CREAT | 0600);
	if (id < 0)
		zdtm_die("shmget");
	sysv = shmat(id, NULL, 0);
	if (sysv == (void *)-1)
		zdtm_die("shmat");
	if (shmctl(id, IPC_RMID, NULL))
		zdtm_die("IPC_RMID");

	anon = mmap(NULL, OBJ_SIZE, PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (anon == MAP_FAILED)
		zdtm_die("mmap anon");

	fd = (int)syscall(SYS_memfd_create, "sparse", 0);
	if (fd < 0)
		zdtm_die("memfd_create");
	if (ftruncate(fd, OBJ_SIZE) || fchmod(fd, 0642))
		zdtm_die("ftruncate/fchmod");
	mem = mmap(NULL, OBJ_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (mem == MAP_FAILED)
		zdtm_die("mmap memfd");

	fill(sysv, SEED_SYSV);
	fill(anon, SEED_ANON);
	fill(mem, SEED_MEMFD);
	ZDTM_CORRUPT("sysv", sysv[5 << 20] = 1);
	ZDTM_CORRUPT("anon", anon[offs[1] + 100] ^= 1);
	ZDTM_CORRUPT("memfd", mem[OBJ_SIZE - 1] ^= 1);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	check("sysv", sysv, SEED_SYSV);
	check("anon", anon, SEED_ANON);
	check("memfd", mem, SEED_MEMFD);
	ZDTM_CORRUPT("memfd-mode", fchmod(fd, 0644));
	{
		struct stat st;

		zdtm_check(fstat(fd, &st) == 0 && (st.st_mode & 07777) == 0642,
			   "memfd-mode", "memfd mode %o, expected 642",
			   st.st_mode & 07777);
	}
	close(fd);
	zdtm_finish();
}
