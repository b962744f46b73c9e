/*
 * dirty_set.c - writes a known set of pages on request, so that the pages an
 * incremental checkpoint saves can be compared with the set written.
 *
 *   dirty_set PIDFILE
 *
 * State:
 *   region  32 MiB private anonymous mmap, filled with pattern(SEED, page 0).
 *           Its address and size are written to PIDFILE.region ("ADDR SIZE"
 *           in hex and decimal) before the PID file.
 *   round   0 at start.  Each SIGUSR1 runs round r = round + 1:
 *             - every page p with mix64(r * 100003 + p) % 8 == 0 is
 *               rewritten whole with pattern(SEED + r, p) (its content always
 *               changes: the seed is new);
 *             - pages [16 r, 16 r + 16) (mod the page count) are dropped
 *               with MADV_DONTNEED (they read as zero afterwards);
 *           then round = r is written to PIDFILE.ack (atomically).
 *   The test computes the same sets from the same formula.
 * Check (SIGTERM): the region equals the replay of rounds 1..round (with no
 * SIGUSR1 at all, the initial pattern).
 */
#include "zdtm.h"

#include <sys/mman.h>

#define SEED    0x6469727479736574ull
#define SIZE    (32ul << 20)
#define PAGE    4096ul
#define NPAGES  (SIZE / PAGE)

static volatile sig_atomic_t usr1;
static uint8_t *region;
static unsigned long round_no;

static void on_usr1(int sig)
{
	(void)sig;
	usr1++;
}

static int written_in(unsigned long r, unsigned long p)
{
	return zdtm_mix64(r * 100003ul + p) % 8 == 0;
}

static uint64_t page_seed(unsigned long r, unsigned long p)
{
	return zdtm_mix64(SEED + r) ^ p;
}

/* Applies round r to mem (the live region or the replay copy). */
static void apply(uint8_t *mem, unsigned long r, int live)
{
	unsigned long p, d = (16 * r) % NPAGES;

	for (p = 0; p < NPAGES; p++)
		if (written_in(r, p))
			zdtm_fill(mem + p * PAGE, PAGE, page_seed(r, p));
	if (live)
		madvise(mem + d * PAGE, 16 * PAGE, MADV_DONTNEED);
	else
		memset(mem + d * PAGE, 0, 16 * PAGE);
}

static void write_small(const char *suffix, const char *text)
{
	char path[PATH_MAX + 16], tmp[PATH_MAX + 32];
	FILE *f;

	snprintf(path, sizeof(path), "%s%s", zdtm_pidfile, suffix);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f || fputs(text, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
		perror(path);
		exit(2);
	}
}

int main(int argc, char **argv)
{
	unsigned long p;
	uint8_t *model;
	char text[64];

	zdtm_init(argc, argv, 0, "");
	signal(SIGUSR1, on_usr1);
	region = mmap(NULL, SIZE, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region == MAP_FAILED) {
		perror("mmap");
		return 2;
	}
	for (p = 0; p < NPAGES; p++)
		zdtm_fill(region + p * PAGE, PAGE, page_seed(0, p));
	snprintf(text, sizeof(text), "%lx %lu\n", (unsigned long)region, SIZE);
	write_small(".region", text);
	zdtm_ready();

	while (!zdtm_stop) {
		if (usr1) {
			usr1--;
			apply(region, ++round_no, 1);
			snprintf(text, sizeof(text), "%lu\n", round_no);
			write_small(".ack", text);
			continue;
		}
		zdtm_msleep(2);
	}

	model = malloc(SIZE);
	if (!model)
		return 2;
	for (p = 0; p < NPAGES; p++)
		zdtm_fill(model + p * PAGE, PAGE, page_seed(0, p));
	for (p = 1; p <= round_no; p++)
		apply(model, p, 0);
	ZDTM_CORRUPT("region", region[5 * PAGE + 7] ^= 1);
	zdtm_verify_mem("region", "the 32 MiB region", region, model, SIZE);
	zdtm_finish();
	return 0;
}
