/*
 * fown.c - the signal owner of open files must survive checkpoint/restore
 * (zdtm's file_fown): who gets SIGIO, and which signal.
 *
 *   fown PIDFILE
 *
 * Set up before "ready":
 *   pipe A  read end: O_ASYNC | O_NONBLOCK, owner this process
 *           (F_SETOWN_EX F_OWNER_PID), signal SIGRTMIN+2 (F_SETSIG)
 *   pipe B  read end: O_ASYNC | O_NONBLOCK, owner this process group
 *           (F_SETOWN with -pgrp), default signal (SIGIO); the process
 *           makes a group of its own first (SIGIO kills by default: it must
 *           not reach whoever started it)
 * Handlers count SIGRTMIN+2 (and record its si_fd) and SIGIO.
 * After SIGTERM: both owners and signals read back (F_GETOWN_EX, F_GETSIG);
 * then a byte written to each pipe must bring its signal: SIGRTMIN+2 with
 * si_fd the read end of A, and SIGIO (waited for up to 2 s each).
 */
#include "zdtm.h"

#include <fcntl.h>

#ifndef F_SETSIG
#define F_SETSIG 10
#define F_GETSIG 11
#endif

static volatile sig_atomic_t rt_count, rt_fd = -1, io_count;

static void on_rt(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	rt_count++;
	rt_fd = si->si_fd;
}

static void on_io(int sig)
{
	(void)sig;
	io_count++;
}

static int wait_for(volatile sig_atomic_t *count, int before)
{
	int i;

	for (i = 0; i < 400 && *count == before; i++) {
		struct timespec ts = { 0, 5 * 1000 * 1000 };

		nanosleep(&ts, NULL);
	}
	return *count != before;
}

static void setup_async(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_ASYNC | O_NONBLOCK) != 0) {
		fprintf(stderr, "F_SETFL: %s\n", strerror(errno));
		exit(2);
	}
}

int main(int argc, char **argv)
{
	int a[2], b[2];
	struct f_owner_ex own = { F_OWNER_PID, 0 }, got;
	struct sigaction sa;
	int before, sig;
	char c = 'x';

	zdtm_init(argc, argv, 0, "");
	if (setpgid(0, 0) != 0) {
		fprintf(stderr, "setpgid: %s\n", strerror(errno));
		return 2;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_rt;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigaction(SIGRTMIN + 2, &sa, NULL);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_io;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGIO, &sa, NULL);
	if (pipe(a) != 0 || pipe(b) != 0) {
		fprintf(stderr, "pipe: %s\n", strerror(errno));
		return 2;
	}
	own.pid = getpid();
	if (fcntl(a[0], F_SETOWN_EX, &own) != 0 || fcntl(a[0], F_SETSIG, SIGRTMIN + 2) != 0 ||
	    fcntl(b[0], F_SETOWN, -getpgrp()) != 0) {
		fprintf(stderr, "F_SETOWN: %s\n", strerror(errno));
		return 2;
	}
	setup_async(a[0]);
	setup_async(b[0]);
	zdtm_ready();
	while (!zdtm_stop) {
		struct timespec ts = { 0, 20 * 1000 * 1000 };

		nanosleep(&ts, NULL);
	}
	ZDTM_CORRUPT("owner", fcntl(a[0], F_SETOWN, 0));
	ZDTM_CORRUPT("pgrp", fcntl(b[0], F_SETOWN, 0));

	memset(&got, 0, sizeof(got));
	zdtm_check(fcntl(a[0], F_GETOWN_EX, &got) == 0 && got.type == F_OWNER_PID &&
			   got.pid == getpid(),
		   "owner", "pipe A owner type %d pid %d, want %d %d", got.type, got.pid,
		   F_OWNER_PID, getpid());
	sig = fcntl(a[0], F_GETSIG);
	zdtm_check(sig == SIGRTMIN + 2, "owner", "pipe A signal %d, want %d", sig, SIGRTMIN + 2);
	memset(&got, 0, sizeof(got));
	zdtm_check(fcntl(b[0], F_GETOWN_EX, &got) == 0 && got.type == F_OWNER_PGRP &&
			   got.pid == getpgrp(),
		   "pgrp", "pipe B owner type %d pid %d, want %d %d", got.type, got.pid,
		   F_OWNER_PGRP, getpgrp());
	sig = fcntl(b[0], F_GETSIG);
	zdtm_check(sig == 0, "pgrp", "pipe B signal %d, want 0 (SIGIO)", sig);

	before = rt_count;
	if (write(a[1], &c, 1) != 1)
		zdtm_fail("owner", "write: %s", strerror(errno));
	zdtm_check(wait_for(&rt_count, before), "owner", "no SIGRTMIN+2 for pipe A");
	zdtm_check(rt_fd == a[0], "owner", "si_fd %d, want %d", (int)rt_fd, a[0]);
	before = io_count;
	if (write(b[1], &c, 1) != 1)
		zdtm_fail("pgrp", "write: %s", strerror(errno));
	zdtm_check(wait_for(&io_count, before), "pgrp", "no SIGIO for pipe B");
	zdtm_finish();
}
