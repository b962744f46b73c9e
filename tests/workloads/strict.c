/*
 * strict.c - a process in seccomp strict mode (zdtm's seccomp_strict):
 * only read, write, exit and sigreturn are allowed to it. It must come
 * back in strict mode, still enforced.
 *
 *   strict PIDFILE
 *
 * Set up before "ready": the root forks S, which enters strict mode
 * (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT)), says so through a pipe
 * and blocks reading another.
 *
 * After SIGTERM (root): /proc/S/status says "Seccomp: 1" (`strict`); the
 * root writes a byte to S, which answers with that byte plus one (`io`)
 * and then calls getpid(), which strict mode answers with SIGKILL
 * (`enforced`).
 */
#include "zdtm.h"

#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static void run_s(int in, int out)
{
	char c = 's';

	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT))
		_exit(64);
	/* From here on: read, write, _exit and sigreturn only. */
	if (write(out, &c, 1) != 1)
		syscall(SYS_exit, 65);
	if (read(in, &c, 1) != 1)
		syscall(SYS_exit, 66);
	c++;
	if (write(out, &c, 1) != 1)
		syscall(SYS_exit, 67);
	if (!ZDTM_SELFTEST) /* enforced */
		syscall(SYS_getpid);
	syscall(SYS_exit, 0);
}

/* Whether /proc/PID/status says "Seccomp:" MODE. */
static int seccomp_mode_is(pid_t pid, int mode)
{
	char path[64], buf[4096], want[32], *l;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if (zdtm_read_text(path, buf, sizeof(buf)) <= 0)
		return 0;
	snprintf(want, sizeof(want), "Seccomp:\t%d\n", mode);
	l = strstr(buf, "Seccomp:");
	return l && strncmp(l, want, strlen(want)) == 0;
}

int main(int argc, char **argv)
{
	int to_s[2], from_s[2], st = 0, want_mode = 1;
	char c = 0;
	pid_t s;

	zdtm_init(argc, argv, 0, "");
	if (pipe(to_s) || pipe(from_s))
		zdtm_die("pipe");
	s = fork();
	if (s < 0)
		zdtm_die("fork");
	if (s == 0) {
		close(to_s[1]);
		close(from_s[0]);
		run_s(to_s[0], from_s[1]);
	}
	close(to_s[0]);
	close(from_s[1]);
	if (read(from_s[0], &c, 1) != 1 || c != 's')
		zdtm_die("S did not enter strict mode");

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("strict", want_mode = 2);
	zdtm_check(seccomp_mode_is(s, want_mode), "strict", "/proc/%d/status: not Seccomp %d",
		   (int)s, want_mode);
	c = 'a';
	ZDTM_CORRUPT("io", c = 'x');
	if (write(to_s[1], &c, 1) != 1)
		zdtm_fail("io", "write to S: errno %d", errno);
	c = 0;
	zdtm_check(read(from_s[0], &c, 1) == 1 && c == 'b', "io", "S answered %#x, expected 'b'",
		   c);
	ZDTM_CORRUPT("enforced", (void)0);
	if (zdtm_wait_deadline(s, &st, 30000) != 0) {
		zdtm_fail("enforced", "S (pid %d) did not end", (int)s);
		kill(s, SIGKILL);
	} else {
		zdtm_check(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "enforced",
			   "S was not killed for calling getpid (status %#x)", st);
	}
	zdtm_finish();
}
