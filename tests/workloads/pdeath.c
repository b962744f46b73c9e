/*
 * pdeath.c - the parent-death signal of a process that changed its
 * credentials must survive checkpoint/restore (zdtm's pdeath_sig, which
 * runs under zdtm's uid: a restore that set the signal before the
 * credentials lost it, since a change of credentials clears it).
 *
 *   pdeath PIDFILE          (must start as root)
 *
 * Set up before "ready":
 *   C  child: switches to gid 4343 and uid 4242 (setresgid, setresuid),
 *      sets PR_SET_PDEATHSIG to SIGUSR1 (handled), says so on pipe r, then
 *      waits for a byte on pipe w.
 * After SIGTERM (root): writes the byte ('c' in the self-test: C then
 *   clears its parent-death signal first); C answers with its
 *   PR_GET_PDEATHSIG (`pdeath`: SIGUSR1) and its real, effective and saved
 *   uid and gid (`creds`: all 4242 / 4343), then exits 0 (`exit`).
 */
#include "zdtm.h"

#include <sys/prctl.h>

struct answer {
	int sig;
	uid_t uid[3];
	gid_t gid[3];
};

static void on_usr1(int sig)
{
	(void)sig;
}

static void child(int r, int w)
{
	struct answer a;
	char c;

	signal(SIGTERM, SIG_DFL);
	signal(SIGUSR1, on_usr1);
	if (setresgid(4343, 4343, 4343) || setresuid(4242, 4242, 4242) ||
	    prctl(PR_SET_PDEATHSIG, SIGUSR1, 0, 0, 0))
		_exit(2);
	if (write(r, "r", 1) != 1)
		_exit(3);
	if (read(w, &c, 1) != 1)
		_exit(4);
	memset(&a, 0, sizeof(a));
	if (c == 'c') /* the self-test's corruption, asked for by the root */
		prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
	if (prctl(PR_GET_PDEATHSIG, &a.sig, 0, 0, 0))
		a.sig = -1;
	getresuid(&a.uid[0], &a.uid[1], &a.uid[2]);
	getresgid(&a.gid[0], &a.gid[1], &a.gid[2]);
	_exit(write(r, &a, sizeof(a)) == sizeof(a) ? 0 : 5);
}

int main(int argc, char **argv)
{
	int r[2], w[2], st = 0, i;
	struct answer a;
	char b, cmd = 'w';
	pid_t c;

	zdtm_init(argc, argv, 0, "");
	if (geteuid() != 0)
		zdtm_die("must start as root (it changes a child's uid)");
	if (pipe(r) || pipe(w))
		zdtm_die("pipe");
	c = fork();
	if (c < 0)
		zdtm_die("fork");
	if (c == 0) {
		close(r[0]);
		close(w[1]);
		child(r[1], w[0]);
	}
	close(r[1]);
	close(w[0]);
	if (read(r[0], &b, 1) != 1 || b != 'r') {
		kill(c, SIGKILL);
		zdtm_die("C did not start (exit status of C tells which step)");
	}

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	memset(&a, 0, sizeof(a));
	ZDTM_CORRUPT("pdeath", cmd = 'c');
	if (write(w[1], &cmd, 1) != 1 || read(r[0], &a, sizeof(a)) != sizeof(a)) {
		zdtm_fail("exit", "no answer from C: %s", strerror(errno));
	} else {
		zdtm_check(a.sig == SIGUSR1, "pdeath",
			   "C's parent-death signal is %d, expected %d (SIGUSR1)",
			   a.sig, SIGUSR1);
		for (i = 0; i < 3; i++) {
			zdtm_check(a.uid[i] == 4242, "creds", "C's uid[%d] is %u, expected 4242",
				   i, (unsigned)a.uid[i]);
			zdtm_check(a.gid[i] == 4343, "creds", "C's gid[%d] is %u, expected 4343",
				   i, (unsigned)a.gid[i]);
		}
	}
	if (zdtm_wait_deadline(c, &st, 5000))
		zdtm_fail("exit", "C did not exit: %s", strerror(errno));
	else
		zdtm_check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit",
			   "C ended with status %#x, expected exit 0", st);
	zdtm_finish();
}
