/*
 * lazy_events.c - memory whose layout changes right after a restore: a
 * fork, an mremap, MADV_DONTNEED and munmap, at a moment the test chooses
 * (for a lazy restore: while pages are still arriving).
 *
 *   lazy_events PIDFILE [SIZE_MIB]      (default 64)
 *
 * Before ready: R = SIZE_MIB MiB anonymous private mmap, pattern(SEED_R)
 * over its offsets; a reserved PROT_NONE area M of a quarter of R.
 * After ready it polls (5 ms) for a file "go" in its cwd. When it appears
 * (once), with q = a quarter of R:
 *   1. fork: the child reads every page of R against the pattern and exits
 *      0 if all match, 1 otherwise; the parent waits for it (20 s).
 *   2. mremap R[q, 2q) onto M (MREMAP_MAYMOVE | MREMAP_FIXED).
 *   3. MADV_DONTNEED R[2q, 2q + q/2).
 *   4. munmap the last q/4 of R.
 * On SIGTERM it checks: R[0, q) pattern; M = the pattern of R[q, 2q) at its
 * old offsets; R[2q, 2q + q/2) zero; R[2q + q/2, 4q - q/4) pattern; the
 * child's status 0 (after "go"); without "go": all of R pattern.
 */
#include "zdtm.h"

#include <sys/mman.h>
#include <sys/wait.h>

#define SEED_R 0x6c617a79657600ull

int main(int argc, char **argv)
{
	size_t mib = 64, size, q;
	unsigned char *r, *m;
	int went = 0, child_status = -1;

	zdtm_init(argc, argv, 1, "[SIZE_MIB]");
	if (argc > 2) {
		char *end;

		mib = strtoul(argv[2], &end, 0);
		if (*end || mib < 4 || mib > 65536) {
			fprintf(stderr, "bad SIZE_MIB '%s'\n", argv[2]);
			return 2;
		}
	}
	size = mib << 20;
	q = size / 4;
	r = mmap(NULL, size, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	m = mmap(NULL, q, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r == MAP_FAILED || m == MAP_FAILED)
		zdtm_die("mmap");
	zdtm_fill(r, size, SEED_R);

	zdtm_ready();

	while (!zdtm_stop) {
		if (!went && access("go", F_OK) == 0) {
			pid_t c;

			went = 1;
			c = fork();
			if (c < 0)
				zdtm_die("fork");
			if (c == 0) {
				size_t bad = zdtm_verify_pattern("child", "R in the child",
								 r, size, SEED_R);
				_exit(bad ? 1 : 0);
			}
			if (zdtm_wait_deadline(c, &child_status, 20000) < 0)
				child_status = -1;
			if (mremap(r + q, q, q, MREMAP_MAYMOVE | MREMAP_FIXED, m) != m)
				zdtm_die("mremap");
			if (madvise(r + 2 * q, q / 2, MADV_DONTNEED))
				zdtm_die("madvise");
			if (munmap(r + size - q / 4, q / 4))
				zdtm_die("munmap");
		}
		zdtm_msleep(5);
	}

	ZDTM_CORRUPT("R", r[q / 2] ^= 0x10);
	if (!went) {
		zdtm_verify_pattern("R", "R", r, size, SEED_R);
	} else {
		size_t k;
		unsigned char *z = r + 2 * q;

		ZDTM_CORRUPT("moved", m[5] ^= 1);
		ZDTM_CORRUPT("dropped", z[100] = 1);
		zdtm_verify_pattern("R", "R[0, q)", r, q, SEED_R);
		/* The moved quarter keeps the pattern of its old offsets. */
		{
			unsigned char *full = malloc(2 * q);

			if (!full)
				zdtm_die("malloc");
			zdtm_fill(full, 2 * q, SEED_R);
			zdtm_verify_mem("moved", "R[q, 2q) moved by mremap",
					m, full + q, q);
			free(full);
		}
		for (k = 0; k < q / 2; k++)
			if (z[k])
				break;
		zdtm_check(k == q / 2, "dropped",
			   "byte %zu of the MADV_DONTNEED range is 0x%02x", k,
			   z[k]);
		{
			unsigned char *full = malloc(size);

			if (!full)
				zdtm_die("malloc");
			zdtm_fill(full, size, SEED_R);
			zdtm_verify_mem("R", "R[2q + q/2, 4q - q/4)",
					r + 2 * q + q / 2, full + 2 * q + q / 2,
					q + q / 2 - q / 4);
			free(full);
		}
		zdtm_check(WIFEXITED(child_status) &&
			   WEXITSTATUS(child_status) == 0, "child",
			   "the forked child's check failed (status %#x)",
			   child_status);
	}
	zdtm_finish();
	return 0;
}
