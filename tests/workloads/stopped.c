/*
 * stopped.c - a child stopped by job control must be stopped again after
 * checkpoint/restore, and continue when told (zdtm's stopped, stopped01,
 * stopped02, stopped12).
 *
 *   stopped PIDFILE
 *
 * Set up before "ready":
 *   S  child: waits for a byte on a pipe, then exits 0 once it has read
 *      it; the root sends it SIGSTOP, sees it stop (waitid WSTOPPED
 *      WNOWAIT), and then writes the byte (S cannot read it while stopped)
 * After SIGTERM (root):
 *   waitpid(S, WUNTRACED | WNOHANG) reports S stopped by SIGSTOP, and
 *   /proc/S/stat says `T` (`stopped`); then SIGCONT: S reads the byte and
 *   exits 0 within 5 s (`continued`).
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

int main(int argc, char **argv)
{
	int p[2], st = 0;
	pid_t got;
	siginfo_t si;
	pid_t s;

	zdtm_init(argc, argv, 0, "");
	if (pipe(p))
		zdtm_die("pipe");
	s = fork();
	if (s < 0)
		zdtm_die("fork");
	if (s == 0) {
		char c;

		close(p[1]);
		signal(SIGTERM, SIG_DFL);
		_exit(read(p[0], &c, 1) == 1 && c == 's' ? 0 : 3);
	}
	close(p[0]);
	if (kill(s, SIGSTOP) ||
	    waitid(P_PID, s, &si, WSTOPPED | WNOWAIT) < 0) {
		kill(s, SIGKILL);
		zdtm_die("stopping S");
	}
	if (write(p[1], "s", 1) != 1) {
		kill(s, SIGKILL);
		zdtm_die("write");
	}
	close(p[1]);

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("stopped", kill(s, SIGCONT), zdtm_msleep(200));

	got = waitpid(s, &st, WUNTRACED | WNOHANG);
	if (zdtm_check(got == s && WIFSTOPPED(st) && WSTOPSIG(st) == SIGSTOP,
		       "stopped",
		       "waitpid(WUNTRACED) returned %d status %#x: not stopped "
		       "by SIGSTOP", got, st))
		zdtm_check(state_of(s) == 'T', "stopped",
			   "/proc/%d/stat state %c, expected T", (int)s,
			   state_of(s));
	ZDTM_CORRUPT("continued", kill(s, SIGKILL));
	kill(s, SIGCONT);
	if (zdtm_wait_deadline(s, &st, 5000))
		zdtm_fail("continued", "S did not exit after SIGCONT: %s",
			  strerror(errno));
	else
		zdtm_check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "continued",
			   "S ended with status %#x, expected exit 0", st);
	zdtm_finish();
}
