/*
 * big_content.c - files saved whole that hold more than 64 MiB of data
 * (issue 17: stasis refused them, their content went into the manifest):
 * a deleted file, a memfd and a System V segment, each restored byte for
 * byte with its holes.
 *
 *   big_content PIDFILE
 *
 * Set up before "ready":
 *   deleted  big_content.file (in the starting cwd): 200 MiB, 80 MiB of
 *            pattern data in two runs of 40 MiB (at 8 MiB and at 120 MiB
 *            + 4 KiB + 123 bytes, so the second ends inside a page), holes
 *            elsewhere; offset 12345; unlinked
 *   memfd    memfd "big": the same layout, other seeds; offset 777
 *   sysv     System V segment of 100 MiB (IPC_PRIVATE, 0600), attached,
 *            80 MiB of pattern in two runs of 40 MiB (at 0 and at 60 MiB),
 *            then removed (IPC_RMID)
 * After SIGTERM, for each: the size, every data run holds its pattern,
 * every other byte is zero (read back in 1 MiB pieces; the holes are
 * also checked with SEEK_DATA for the two files), the fd offsets.
 */
#include "zdtm.h"

#include <fcntl.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#define MIB       (1ul << 20)
#define FILE_SIZE (200 * MIB)
#define RUN       (40 * MIB)
#define SHM_SIZE  (100 * MIB)

#define SEED_FILE  0x6269676669000000ull
#define SEED_MEMFD 0x6269676d66000000ull
#define SEED_SYSV  0x6269677379000000ull

static const size_t file_offs[2] = { 8 * MIB, 120 * MIB + 4096 + 123 };
static const size_t shm_offs[2] = { 0, 60 * MIB };

static uint8_t buf[MIB];

/* Writes the two runs of `fd` in 1 MiB pieces. */
static void fill_file(int fd, uint64_t seed)
{
	int r;

	for (r = 0; r < 2; r++) {
		size_t done;

		for (done = 0; done < RUN; done += MIB) {
			zdtm_fill(buf, MIB, seed + r * 1000 + done / MIB);
			if (pwrite(fd, buf, MIB, (off_t)(file_offs[r] + done)) != (ssize_t)MIB)
				zdtm_die("pwrite");
		}
	}
	if (ftruncate(fd, FILE_SIZE))
		zdtm_die("ftruncate");
}

/* Which run `off` is in (-1: a hole), and where the run starts. */
static int run_of(const size_t *offs, size_t off, size_t *start)
{
	int r;

	for (r = 0; r < 2; r++)
		if (off >= offs[r] && off < offs[r] + RUN) {
			*start = offs[r];
			return r;
		}
	return -1;
}

/* Checks bytes [at, at + len) of an object laid out as `offs` against
 * the patterns (1 MiB pieces of each run) and zeros. */
static void check_piece(const char *tag, const size_t *offs, uint64_t seed,
			const uint8_t *p, size_t at, size_t len)
{
	size_t i = 0, bad_zero = 0;

	while (i < len) {
		size_t start, off = at + i;
		int r = run_of(offs, off, &start);

		if (r < 0) {
			if (p[i])
				bad_zero++;
			i++;
			continue;
		}
		{
			size_t piece = (off - start) / MIB, in = (off - start) % MIB;
			size_t n = MIB - in;
			char what[64];

			if (n > len - i)
				n = len - i;
			zdtm_fill(buf, MIB, seed + r * 1000 + piece);
			snprintf(what, sizeof(what), "run %d piece %zu", r, piece);
			zdtm_verify_mem(tag, what, p + i, buf + in, n);
			i += n;
		}
	}
	if (bad_zero)
		zdtm_fail(tag, "%zu bytes of holes in [%zu, %zu) are not zero",
			  bad_zero, at, at + len);
}

static void check_file(const char *tag, int fd, uint64_t seed, off_t pos)
{
	static uint8_t got[MIB];
	struct stat st;
	size_t off;
	off_t d;

	if (fstat(fd, &st)) {
		zdtm_fail(tag, "fstat: %m");
		return;
	}
	zdtm_check(st.st_size == (off_t)FILE_SIZE, tag, "size %lld, expected %lu",
		   (long long)st.st_size, FILE_SIZE);
	zdtm_check(lseek(fd, 0, SEEK_CUR) == pos, tag, "offset %lld, expected %lld",
		   (long long)lseek(fd, 0, SEEK_CUR), (long long)pos);
	for (off = 0; off < FILE_SIZE; off += MIB) {
		if (pread(fd, got, MIB, (off_t)off) != (ssize_t)MIB) {
			zdtm_fail(tag, "pread at %zu: %m", off);
			return;
		}
		check_piece(tag, file_offs, seed, got, off, MIB);
	}
	/* Holes stay holes: no data before the first run. */
	d = lseek(fd, 0, SEEK_DATA);
	zdtm_check(d >= (off_t)(file_offs[0] & ~(4095ul)), tag,
		   "data at %lld, before the first run at %zu", (long long)d,
		   file_offs[0]);
}

int main(int argc, char **argv)
{
	uint8_t *shm;
	int fd, mfd, id, r;

	zdtm_init(argc, argv, 0, "");

	fd = open("big_content.file", O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		zdtm_die("open");
	fill_file(fd, SEED_FILE);
	if (unlink("big_content.file"))
		zdtm_die("unlink");
	if (lseek(fd, 12345, SEEK_SET) != 12345)
		zdtm_die("lseek");

	mfd = (int)syscall(SYS_memfd_create, "big", 0);
	if (mfd < 0)
		zdtm_die("memfd_create");
	fill_file(mfd, SEED_MEMFD);
	if (lseek(mfd, 777, SEEK_SET) != 777)
		zdtm_die("lseek");

	id = shmget(IPC_PRIVATE, SHM_SIZE, IPC_CREAT | 0600);
	if (id < 0)
		zdtm_die("shmget");
	shm = shmat(id, NULL, 0);
	if (shm == (void *)-1)
		zdtm_die("shmat");
	if (shmctl(id, IPC_RMID, NULL))
		zdtm_die("IPC_RMID");
	for (r = 0; r < 2; r++) {
		size_t done;

		for (done = 0; done < RUN; done += MIB)
			zdtm_fill(shm + shm_offs[r] + done, MIB,
				  SEED_SYSV + r * 1000 + done / MIB);
	}

	ZDTM_CORRUPT("deleted", {
		uint8_t x = 1;
		if (pwrite(fd, &x, 1, (off_t)(file_offs[1] + RUN - 1)) != 1)
			zdtm_die("pwrite");
	});
	ZDTM_CORRUPT("memfd", {
		uint8_t x = 1;
		if (pwrite(mfd, &x, 1, (off_t)(100 * MIB)) != 1)
			zdtm_die("pwrite");
	});
	ZDTM_CORRUPT("sysv", shm[shm_offs[1] + 5 * MIB + 3] ^= 1);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	check_file("deleted", fd, SEED_FILE, 12345);
	check_file("memfd", mfd, SEED_MEMFD, 777);
	{
		size_t off;

		for (off = 0; off < SHM_SIZE; off += MIB)
			check_piece("sysv", shm_offs, SEED_SYSV, shm + off, off, MIB);
	}
	close(fd);
	close(mfd);
	zdtm_finish();
}
