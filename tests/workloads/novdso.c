/*
 * novdso.c - a process that unmapped its vDSO (zdtm's vdso02; as on a
 * kernel booted with vdso=0) must be checkpointed and restored without
 * one: Stasis then runs its remote syscalls from a `syscall` instruction
 * in the process's code, and the restored process has no vDSO either.
 *
 *   novdso PIDFILE
 *
 * Set up before "ready": a 256 KiB buffer filled with a pattern; then
 * [vdso], [vvar] and [vvar_vclock] are unmapped. From then on the process
 * makes only real system calls (nanosleep, read, write), never a vDSO call.
 * After SIGTERM: /proc/self/maps shows none of the three (`unmapped`) and
 * the buffer holds its pattern (`memory`).
 */
#include "zdtm.h"

#include <sys/mman.h>

#define BUF (256 << 10)

/* Unmaps every area of /proc/self/maps whose name is `name`; returns how
 * many it found. */
static int unmap_named(const char *name)
{
	static char maps[1 << 16];
	unsigned long a, b;
	char *line, *save = NULL;
	int n = 0;

	if (zdtm_read_text("/proc/self/maps", maps, sizeof(maps)) <= 0)
		zdtm_die("reading /proc/self/maps");
	for (line = strtok_r(maps, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		size_t l = strlen(line), k = strlen(name);

		if (l < k || strcmp(line + l - k, name) || sscanf(line, "%lx-%lx", &a, &b) != 2)
			continue;
		if (munmap((void *)a, b - a))
			zdtm_die("munmap %s", name);
		n++;
	}
	return n;
}

static int mapped(const char *name)
{
	static char maps[1 << 16];

	if (zdtm_read_text("/proc/self/maps", maps, sizeof(maps)) <= 0)
		return -1;
	return strstr(maps, name) != NULL;
}

int main(int argc, char **argv)
{
	unsigned char *buf;

	zdtm_init(argc, argv, 0, "");
	buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		zdtm_die("mmap");
	zdtm_fill(buf, BUF, 0x7d50);
	if (unmap_named("[vdso]") != 1)
		zdtm_die("no [vdso] to unmap");
	unmap_named("[vvar]");
	unmap_named("[vvar_vclock]");

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("memory", buf[BUF / 3] ^= 0x40);
	zdtm_check(mapped("[vdso]") == 0 && mapped("[vvar") == 0, "unmapped",
		   "the process has a vDSO or vvar area again after restore");
	zdtm_verify_pattern("memory", "buffer", buf, BUF, 0x7d50);
	zdtm_finish();
}
