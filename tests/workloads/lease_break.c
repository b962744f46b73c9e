/*
 * lease_break.c - leases being broken must come back being broken, with
 * no second signal (zdtm's file_lease02, file_lease03).
 *
 *   lease_break PIDFILE
 *
 * Set up before "ready" (files in the cwd, recreated; SIGIO counted with
 * SA_SIGINFO, F_SETSIG SIGIO so si_fd names the fd):
 *   r   lease_break.r opened O_RDONLY, read lease, broken by a child's
 *       O_WRONLY | O_NONBLOCK open (EWOULDBLOCK): breaking to none;
 *   w   lease_break.w opened O_WRONLY, write lease, broken by a child's
 *       O_RDONLY | O_NONBLOCK open: breaking to a read lease.
 * Each break's SIGIO is awaited (2 signals, one per fd).
 * After SIGTERM (tags in brackets):
 *   [type]   F_GETLEASE is F_UNLCK for r and F_RDLCK for w (what a lease
 *            being broken reads as);
 *   [break]  fdinfo still shows each lease BREAKING, unless the kernel's
 *            break time (lease-break-time, 45 s by default) has run out
 *            since the setup;
 *   [signal] no SIGIO came after the setup's two (a restore that breaks
 *            the leases again must not signal the process).
 */
#include "zdtm.h"

#include <fcntl.h>
#include <sys/wait.h>

static volatile sig_atomic_t io_count, io_bad;
static volatile int fd_r = -1, fd_w = -1;

static void on_io(int sig, siginfo_t *si, void *ctx)
{
	(void)ctx;
	if (sig != SIGIO || (si->si_fd != fd_r && si->si_fd != fd_w))
		io_bad++;
	io_count++;
}

/* A child's non-blocking open of `name` with `flags`: its errno (0 if it
 * opened). */
static int open_in_child(const char *name, int flags)
{
	int st = 0;
	pid_t pid = fork();

	if (pid == 0) {
		int fd = open(name, flags | O_NONBLOCK);

		_exit(fd < 0 ? errno : 0);
	}
	while (waitpid(pid, &st, 0) != pid)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Opens `name` as *fd (set before the break, for the handler), takes a
 * lease of `type` and has a child break it. */
static void leased_and_broken(volatile int *fd, const char *name, int flags, int type, int breaker)
{
	int err;

	unlink(name);
	*fd = open(name, flags | O_CREAT, 0644);
	if (*fd < 0 || fcntl(*fd, F_SETSIG, SIGIO) || fcntl(*fd, F_SETLEASE, type))
		zdtm_die("lease on %s", name);
	err = open_in_child(name, breaker);
	if (err != EWOULDBLOCK)
		zdtm_die("breaking the lease on %s gave %d", name, err);
}

/* Whether fd's lease shows as being broken in its fdinfo. */
static int breaking(int fd)
{
	char info[4096];

	return zdtm_fdinfo(fd, info, sizeof(info)) > 0 && strstr(info, "LEASE") &&
	       strstr(info, "BREAKING");
}

int main(int argc, char **argv)
{
	struct sigaction sa;
	int64_t t0;
	int got, i, timed_out;

	zdtm_init(argc, argv, 0, "");
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_io;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigaction(SIGIO, &sa, NULL);
	leased_and_broken(&fd_r, "lease_break.r", O_RDONLY, F_RDLCK, O_WRONLY);
	leased_and_broken(&fd_w, "lease_break.w", O_WRONLY, F_WRLCK, O_RDONLY);
	for (i = 0; i < 1000 && io_count < 2; i++)
		zdtm_msleep(5);
	if (io_count != 2 || io_bad)
		zdtm_die("the breaks' signals: %d (%d bad)", (int)io_count, (int)io_bad);
	if (!breaking(fd_r) || !breaking(fd_w))
		zdtm_die("the leases are not being broken");
	t0 = zdtm_now_ns();

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(20);

	ZDTM_CORRUPT("type", fcntl(fd_w, F_SETLEASE, F_UNLCK));
	ZDTM_CORRUPT("signal", kill(getpid(), SIGIO));
	got = fcntl(fd_r, F_GETLEASE);
	zdtm_check(got == F_UNLCK, "type", "r's lease reads %d, want F_UNLCK", got);
	got = fcntl(fd_w, F_GETLEASE);
	zdtm_check(got == F_RDLCK, "type", "w's lease reads %d, want F_RDLCK", got);
	/* The break time runs from the setup (and again from the restore):
	 * before 40 s, both must still be breaking. */
	timed_out = zdtm_now_ns() - t0 > 40000000000ll;
	zdtm_check(timed_out || breaking(fd_r), "break", "r's lease is not being broken");
	zdtm_check(timed_out || breaking(fd_w), "break", "w's lease is not being broken");
	zdtm_msleep(50);
	zdtm_check(io_count == 2 && !io_bad, "signal", "%d SIGIO (%d bad), want the setup's 2",
		   (int)io_count, (int)io_bad);
	zdtm_finish();
	return 0;
}
