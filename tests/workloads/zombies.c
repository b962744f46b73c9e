/*
 * zombies.c - unreaped children that died of a signal must come back as
 * zombies with the same wait status (zdtm's zombie00), and in the same
 * process group, even one whose leader has exited (zombie01).
 *
 *   zombies PIDFILE
 *
 * Set up before "ready": three children, each left unreaped once
 * /proc/PID/stat says `Z`:
 *   E  _exit(5)
 *   K  killed by SIGKILL (raised by itself)
 *   S  killed by SIGSEGV (raised by itself, no core dump: RLIMIT_CORE 0)
 *   G  _exit(0), in the process group of L, a child that made a group of
 *      its own, forked G as the root's child (CLONE_PARENT) and exited
 *      (reaped): G's group has no leader any more
 * After SIGTERM (root): getpgid(G) is still L (`group`); waitpid of each
 * gives exactly its status (`status`), and there is no other child
 * (`children`).
 */
#include "zdtm.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>

static char state_of(pid_t pid)
{
	char path[64], buf[512], *p;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (zdtm_read_text(path, buf, sizeof(buf)) <= 0)
		return '?';
	p = strrchr(buf, ')');
	return p && p[1] && p[2] ? p[2] : '?';
}

static pid_t child(int how)
{
	struct rlimit no_core = { 0, 0 };
	pid_t pid = fork();
	int i;

	if (pid < 0)
		zdtm_die("fork");
	if (pid == 0) {
		signal(SIGTERM, SIG_DFL);
		setrlimit(RLIMIT_CORE, &no_core);
		if (how == 0)
			_exit(5);
		raise(how);
		_exit(99);
	}
	for (i = 0; i < 2000 && state_of(pid) != 'Z'; i++)
		zdtm_msleep(5);
	if (state_of(pid) != 'Z')
		zdtm_die("child %d is not a zombie", (int)pid);
	return pid;
}

/* G, a zombie in the group of L, which has exited; *leader: L. */
static pid_t orphan_group_zombie(pid_t *leader)
{
	int p[2], i;
	pid_t l, g = -1;

	if (pipe(p))
		zdtm_die("pipe");
	l = fork();
	if (l < 0)
		zdtm_die("fork");
	if (l == 0) {
		signal(SIGTERM, SIG_DFL);
		if (setpgid(0, 0))
			_exit(1);
		g = (pid_t)syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, NULL, NULL, 0);
		if (g == 0)
			_exit(0);
		_exit(write(p[1], &g, sizeof(g)) == sizeof(g) ? 0 : 2);
	}
	close(p[1]);
	if (read(p[0], &g, sizeof(g)) != sizeof(g) || g <= 0 || waitpid(l, &i, 0) != l || i != 0)
		zdtm_die("making a zombie in a group whose leader exited");
	close(p[0]);
	for (i = 0; i < 2000 && state_of(g) != 'Z'; i++)
		zdtm_msleep(5);
	if (state_of(g) != 'Z' || getpgid(g) != l)
		zdtm_die("G %d: state %c, group %d", (int)g, state_of(g), (int)getpgid(g));
	*leader = l;
	return g;
}

int main(int argc, char **argv)
{
	const int how[3] = { 0, SIGKILL, SIGSEGV };
	const char *name[3] = { "E", "K", "S" };
	pid_t pid[3], g, l;
	int i, st;

	zdtm_init(argc, argv, 0, "");
	for (i = 0; i < 3; i++)
		pid[i] = child(how[i]);
	g = orphan_group_zombie(&l);

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("status", waitpid(pid[2], &st, 0), pid[2] = child(SIGBUS));
	ZDTM_CORRUPT("children", child(0));
	ZDTM_CORRUPT("group", l = getpgrp());

	zdtm_check(getpgid(g) == l, "group", "G (pid %d) is in group %d, expected %d", (int)g,
		   (int)getpgid(g), (int)l);
	zdtm_check(waitpid(g, &st, WNOHANG) == g && st == 0, "status",
		   "G (pid %d): not a zombie with status 0 (%#x)", (int)g, st);

	for (i = 0; i < 3; i++) {
		int want = how[i] ? how[i] : 5 << 8;
		pid_t got = waitpid(pid[i], &st, WNOHANG);

		zdtm_check(got == pid[i] && st == want, "status",
			   "%s (pid %d): waitpid %d, status %#x, expected %#x",
			   name[i], (int)pid[i], (int)got, st, want);
	}
	i = waitpid(-1, &st, WNOHANG);
	zdtm_check(i < 0 && errno == ECHILD, "children",
		   "another child: waitpid(-1) = %d", i);
	zdtm_finish();
}
