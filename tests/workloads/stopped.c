/*
 * stopped.c - a child stopped by job control must be stopped again after
 * checkpoint/restore, by the same signal, and continue when told (zdtm's
 * stopped, stopped01, stopped02, stopped03, stopped12).
 *
 *   stopped PIDFILE
 *
 * Set up before "ready", for each child:
 *   S  stopped by SIGSTOP;
 *   T  in a process group of its own (not orphaned: its parent, the root,
 *      is in another group of the same session), stopped by SIGTSTP.
 *   Each waits for a byte on a pipe, then exits 0 once it has read it; the
 *   root sends it its stop signal, sees it stop (waitid WSTOPPED WNOWAIT),
 *   and then writes the byte (it cannot read it while stopped).
 * After SIGTERM (root), for each child:
 *   waitpid(WUNTRACED | WNOHANG) reports it stopped by its own signal, and
 *   /proc/PID/stat says `T` (`stopped`); then SIGCONT: it reads the byte
 *   and exits 0 within 5 s (`continued`).
 */
#include "zdtm.h"

static char state_of(pid_t pid)
{
	char path[64], buf[512], *p;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (zdtm_read_text(path, buf, sizeof(buf)) <= 0)
		return '?';
	p = strrchr(buf, ')');
	return p && p[1] && p[2] ? p[2] : '?';
}

/* A child stopped by `sig` (in a process group of its own if `own_pgrp`),
 * with its byte already written. */
static pid_t stopped_child(int sig, int own_pgrp)
{
	int p[2];
	siginfo_t si;
	pid_t c;

	if (pipe(p))
		zdtm_die("pipe");
	c = fork();
	if (c < 0)
		zdtm_die("fork");
	if (c == 0) {
		char b;

		close(p[1]);
		signal(SIGTERM, SIG_DFL);
		_exit(read(p[0], &b, 1) == 1 && b == 's' ? 0 : 3);
	}
	close(p[0]);
	if ((own_pgrp && setpgid(c, c)) || kill(c, sig) ||
	    waitid(P_PID, c, &si, WSTOPPED | WNOWAIT) < 0 || si.si_status != sig) {
		kill(c, SIGKILL);
		zdtm_die("stopping a child with signal %d", sig);
	}
	if (write(p[1], "s", 1) != 1) {
		kill(c, SIGKILL);
		zdtm_die("write");
	}
	close(p[1]);
	return c;
}

static void check(pid_t c, int sig, const char *name)
{
	int st = 0;
	pid_t got = waitpid(c, &st, WUNTRACED | WNOHANG);

	if (zdtm_check(got == c && WIFSTOPPED(st) && WSTOPSIG(st) == sig, "stopped",
		       "%s: waitpid(WUNTRACED) returned %d status %#x: not stopped "
		       "by signal %d", name, got, st, sig))
		zdtm_check(state_of(c) == 'T', "stopped", "%s: /proc/%d/stat state %c, expected T",
			   name, (int)c, state_of(c));
}

static void cont(pid_t c, const char *name)
{
	int st = 0;

	kill(c, SIGCONT);
	if (zdtm_wait_deadline(c, &st, 5000))
		zdtm_fail("continued", "%s did not exit after SIGCONT: %s", name, strerror(errno));
	else
		zdtm_check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "continued",
			   "%s ended with status %#x, expected exit 0", name, st);
}

int main(int argc, char **argv)
{
	pid_t s, t;

	zdtm_init(argc, argv, 0, "");
	s = stopped_child(SIGSTOP, 0);
	t = stopped_child(SIGTSTP, 1);

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("stopped", kill(t, SIGCONT), kill(t, SIGSTOP), zdtm_msleep(200));
	check(s, SIGSTOP, "S");
	check(t, SIGTSTP, "T");
	ZDTM_CORRUPT("continued", kill(s, SIGKILL));
	cont(s, "S");
	cont(t, "T");
	zdtm_finish();
}
