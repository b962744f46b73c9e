/*
 * chroot.c - a process whose root directory is not the host's (zdtm's
 * chroot): it must come back with the same root, and its paths must still
 * resolve inside it. Needs CAP_SYS_CHROOT (root).
 *
 *   chroot PIDFILE
 *
 * Set up before "ready": the root makes directory "jail" in its working
 * directory and forks C, which enters it (chroot, then chdir "/") and
 * writes "/f" ("inside the jail") there. C then sleeps in 50 ms steps.
 *
 * After SIGTERM (root): /proc/C/root is the jail (`root`); the root
 * signals C, which checks that "/f" reads "inside the jail" (`file`),
 * that its working directory is "/" (`cwd`) and that "/jail" does not
 * exist (it is inside, not above, the jail: `root`), and exits with its
 * result bits.
 */
#include "zdtm.h"

#include <limits.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define CONTENT "inside the jail"

enum { R_FILE = 1, R_CWD = 2, R_ROOT = 4, R_NBITS = 3 };
static const char *const tags[R_NBITS] = { "file", "cwd", "root" };

static void run_c(int ready)
{
	int bits = 0, fd;
	char buf[64] = { 0 }, cwd[PATH_MAX];
	struct stat st;

	if (chroot("jail") || chdir("/"))
		_exit(64);
	fd = open("/f", O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || write(fd, CONTENT, strlen(CONTENT)) != (ssize_t)strlen(CONTENT))
		_exit(64);
	close(fd);
	if (write(ready, "r", 1) != 1)
		_exit(64);
	close(ready);
	while (!zdtm_stop)
		zdtm_msleep(50);
	if (ZDTM_SELFTEST) {
		/* file */
		fd = open("/f", O_WRONLY | O_TRUNC);
		if (fd >= 0)
			close(fd);
		/* cwd */
		if (mkdir("/d", 0700) == 0 && chdir("/d")) {
			/* nothing else to do: the check fails either way */
		}
	}
	fd = open("/f", O_RDONLY);
	if (fd < 0 || read(fd, buf, sizeof(buf) - 1) != (ssize_t)strlen(CONTENT) ||
	    strcmp(buf, CONTENT)) {
		zdtm_child_fail("C", "file", "/f does not read \"%s\" (\"%s\", errno %d)", CONTENT,
				buf, errno);
		bits |= R_FILE;
	}
	if (fd >= 0)
		close(fd);
	if (!getcwd(cwd, sizeof(cwd)) || strcmp(cwd, "/")) {
		zdtm_child_fail("C", "cwd", "working directory is not \"/\" (errno %d)", errno);
		bits |= R_CWD;
	}
	if (stat("/jail", &st) == 0) {
		zdtm_child_fail("C", "root", "/jail exists: C is not inside its jail");
		bits |= R_ROOT;
	}
	_exit(bits);
}

int main(int argc, char **argv)
{
	char jail[PATH_MAX], want[PATH_MAX + 8], root[PATH_MAX + 8], link[64], c;
	int p[2], st = 0, i;
	ssize_t n;
	pid_t k;

	zdtm_init(argc, argv, 0, "");
	if (mkdir("jail", 0700) && errno != EEXIST)
		zdtm_die("mkdir jail");
	if (!realpath("jail", jail))
		zdtm_die("realpath jail");
	if (pipe(p))
		zdtm_die("pipe");
	k = fork();
	if (k < 0)
		zdtm_die("fork");
	if (k == 0) {
		close(p[0]);
		run_c(p[1]);
	}
	close(p[1]);
	if (read(p[0], &c, 1) != 1)
		zdtm_die("C could not enter its jail (chroot needs root)");
	close(p[0]);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	snprintf(want, sizeof(want), "%s", jail);
	ZDTM_CORRUPT("root", strcat(want, "x"));
	snprintf(link, sizeof(link), "/proc/%d/root", (int)k);
	n = readlink(link, root, sizeof(root) - 1);
	root[n > 0 ? n : 0] = 0;
	zdtm_check(strcmp(root, want) == 0, "root", "%s is %s, expected %s", link, root, want);
	ZDTM_CORRUPT("file", (void)0);
	ZDTM_CORRUPT("cwd", (void)0);
	zdtm_check(kill(k, SIGTERM) == 0, "root", "kill(C = %d): errno %d", (int)k, errno);
	if (zdtm_wait_deadline(k, &st, 30000) != 0 || !WIFEXITED(st)) {
		zdtm_fail("root", "C (pid %d) did not exit (status %#x)", (int)k, st);
		kill(k, SIGKILL);
	} else {
		for (i = 0; i < R_NBITS; i++)
			zdtm_check(!(WEXITSTATUS(st) & (1 << i)), tags[i], "see stderr");
	}
	zdtm_finish();
}
