/*
 * fdtable_relay.c - a process sharing the fd table of its grandparent but
 * not of its parent, which passed it on and then unshared it: the root R
 * and its grandchild G share one table, R's child M has its own.
 *
 *   fdtable_relay PIDFILE
 *
 * Set up before "ready":
 *   R  opens "f0" at fd 50; clones
 *   M  with CLONE_FILES; M clones
 *   G  with CLONE_FILES (R's table), then unshares its table and opens
 *      "fm" at fd 70 in its own
 * M and G sleep in 50 ms steps until SIGTERM.
 *
 * After SIGTERM (R):
 *   `shared`  R and G have one table (kcmp KCMP_FILES); fd 61, opened by
 *             R now, is G's too (/proc/G/fd/61)
 *   `own`     M's table is another (kcmp), without fd 61
 *   `M-own`   fd 70 is M's only (/proc/M/fd/70, not R's)
 *   `parent`  G's parent is M
 * Then R stops G and M (SIGTERM) and reaps M (M reaps G).
 */
#include "zdtm.h"

#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static void make_file(const char *name, const char *content, int at)
{
	int fd = open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);

	if (fd < 0 || write(fd, content, strlen(content)) != (ssize_t)strlen(content) ||
	    dup2(fd, at) != at)
		zdtm_die("open %s at %d", name, at);
	close(fd);
}

static pid_t clone_files(void)
{
	return (pid_t)syscall(SYS_clone, CLONE_FILES | SIGCHLD, 0, NULL, NULL, 0);
}

static int has_fd(pid_t pid, int fd)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
	return access(path, F_OK) == 0;
}

static pid_t parent_of(pid_t pid)
{
	char path[64], buf[512], *p;
	int ppid = -1;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (zdtm_read_text(path, buf, sizeof(buf)) < 0 || !(p = strrchr(buf, ')')) ||
	    sscanf(p + 2, "%*c %d", &ppid) != 1)
		return -1;
	return ppid;
}

static int same_table(pid_t a, pid_t b)
{
	return syscall(SYS_kcmp, a, b, 2 /* KCMP_FILES */, 0, 0) == 0;
}

int main(int argc, char **argv)
{
	int p[2], st = 0;
	pid_t m, g = -1;

	zdtm_init(argc, argv, 0, "");
	make_file("f0", "f0", 50);
	if (pipe(p))
		zdtm_die("pipe");
	m = clone_files();
	if (m < 0)
		zdtm_die("clone M");
	if (m == 0) {
		g = clone_files();
		if (g == 0) {
			while (!zdtm_stop)
				zdtm_msleep(50);
			_exit(0);
		}
		/* The pipe is in the table shared with R until here. */
		if (g < 0 || unshare(CLONE_FILES))
			_exit(1);
		make_file("fm", "fm", 70);
		if (write(p[1], &g, sizeof(g)) != sizeof(g))
			_exit(1);
		while (!zdtm_stop)
			zdtm_msleep(50);
		kill(g, SIGTERM);
		_exit(zdtm_wait_deadline(g, &st, 20000) == 0 ? 0 : 1);
	}
	if (read(p[0], &g, sizeof(g)) != sizeof(g))
		zdtm_die("M did not set up G");
	close(p[0]);
	close(p[1]);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);

	ZDTM_CORRUPT("shared", unshare(CLONE_FILES));
	ZDTM_CORRUPT("M-own", make_file("fx", "fx", 70));
	make_file("f1", "f1", 61);
	zdtm_check(same_table(getpid(), g), "shared", "R and G (%d) have two fd tables", (int)g);
	zdtm_check(has_fd(g, 61), "shared", "fd 61 opened by R is not G's");
	zdtm_check(!same_table(getpid(), m), "own", "M (%d) shares R's table", (int)m);
	zdtm_check(!has_fd(m, 61), "own", "fd 61 opened by R is M's too");
	zdtm_check(has_fd(m, 70) && !has_fd(getpid(), 70), "M-own",
		   "fd 70: M's %d, R's %d (expected M's only)", has_fd(m, 70), has_fd(getpid(), 70));
	zdtm_check(parent_of(g) == m, "parent", "G's parent is %d, expected M (%d)",
		   (int)parent_of(g), (int)m);

	kill(m, SIGTERM);
	if (zdtm_wait_deadline(m, &st, 30000) != 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
		zdtm_fail("parent", "M did not end well (status %#x)", st);
		kill(m, SIGKILL);
	}
	zdtm_finish();
}
