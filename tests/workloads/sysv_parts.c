/*
 * sysv_parts.c - a System V segment attached in part: the program attached
 * a 4 MiB segment, filled it with pattern(SEED), then unmapped the first
 * MiB of the attachment and moved its last MiB elsewhere (mremap). What is
 * left, [1, 3) MiB at its place and [3, 4) MiB at another address, must come
 * back so: the same segment, each area at its offset in it.
 *
 *   sysv_parts PIDFILE
 *
 * After SIGTERM:
 *   `mem`      both areas hold the pattern of their part of the segment
 *   `offsets`  /proc/self/maps gives them offsets 1 MiB and 3 MiB, at
 *              their addresses
 *   `shared`   a word written through each area is in the segment (seen
 *              through a new attachment), and so is its first MiB, which
 *              no area maps (pattern)
 *   `nattch`   the segment counts two attachments (one per area)
 */
#include "zdtm.h"

#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>

#define MIB (1UL << 20)
#define SIZE (4 * MIB)
#define SEED 0x5a5a5ULL

/* The maps offset of the area at `addr`, or -1. */
static long long offset_of(void *addr)
{
	char line[512];
	FILE *f = fopen("/proc/self/maps", "r");
	long long off = -1;

	while (f && fgets(line, sizeof(line), f)) {
		unsigned long s, e;
		unsigned long long o;

		if (sscanf(line, "%lx-%lx %*s %llx", &s, &e, &o) == 3 && s == (unsigned long)addr)
			off = (long long)o;
	}
	if (f)
		fclose(f);
	return off;
}

int main(int argc, char **argv)
{
	int id;
	char *a, *mid, *last;
	struct shmid_ds ds;

	zdtm_init(argc, argv, 0, "");
	id = shmget(IPC_PRIVATE, SIZE, IPC_CREAT | 0600);
	a = id < 0 ? MAP_FAILED : shmat(id, NULL, 0);
	if (a == (void *)-1 || a == MAP_FAILED)
		zdtm_die("shmget/shmat");
	zdtm_fill(a, SIZE, SEED);
	if (munmap(a, MIB))
		zdtm_die("munmap");
	mid = a + MIB;
	last = mremap(a + 3 * MIB, MIB, MIB, MREMAP_MAYMOVE | MREMAP_FIXED,
		      mmap(NULL, MIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	if (last == MAP_FAILED)
		zdtm_die("mremap");

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("mem", mid[5] ^= 1);
	ZDTM_CORRUPT("offsets", munmap(last, 4096), last += 4096);
	{
		char *want = malloc(SIZE);

		zdtm_fill(want, SIZE, SEED);
		zdtm_check(!memcmp(mid, want + MIB, 2 * MIB), "mem",
			   "[1, 3) MiB does not hold its pattern");
		zdtm_check(!memcmp(last + 4096, want + 3 * MIB + 4096, MIB - 4096), "mem",
			   "[3, 4) MiB does not hold its pattern");
		zdtm_check(offset_of(mid) == (long long)MIB && offset_of(last) == (long long)(3 * MIB),
			   "offsets", "offsets %lld and %lld, expected %lu and %lu", offset_of(mid),
			   offset_of(last), MIB, 3 * MIB);
		mid[100] = 'M';
		last[200] = 'L';
		{
			char *b = shmat(id, NULL, SHM_RDONLY);

			ZDTM_CORRUPT("shared", mid[100] = 'x');
			if (zdtm_check(b != (void *)-1, "shared", "shmat: %s", strerror(errno))) {
				zdtm_check(b[MIB + 100] == mid[100] && b[MIB + 100] == 'M' &&
						   b[3 * MIB + 200] == 'L',
					   "shared", "writes through the areas are not in the segment");
				zdtm_check(!memcmp(b, want, MIB), "shared",
					   "the first MiB (no area maps it) lost its pattern");
				shmdt(b);
			}
		}
		free(want);
	}
	ZDTM_CORRUPT("nattch", shmat(id, NULL, SHM_RDONLY));
	zdtm_check(shmctl(id, IPC_STAT, &ds) == 0 && ds.shm_nattch == 2, "nattch",
		   "%lu attachments, expected 2", (unsigned long)ds.shm_nattch);
	/* Gone once the areas go. */
	shmctl(id, IPC_RMID, NULL);
	zdtm_finish();
}
