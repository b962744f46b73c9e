/*
 * pidfds.c - pidfds must point at the same processes, and namespace files
 * at the same namespaces, after checkpoint/restore (zdtm's pidfd_self,
 * pidfd_child, pidfd_kill, fd_from_pidfd, proc-self).
 *
 *   pidfds PIDFILE
 *
 * Set up before "ready": a child that sleeps until killed; a pidfd on this
 * process (PIDFD_NONBLOCK) and one on the child (blocking); fds on
 * /proc/self/ns/net and /proc/self/ns/uts; and pidfds on two processes
 * that have exited and been reaped: two (opened separately) on the first,
 * one on the second (zdtm's pidfd_dead, pidfd_diffdead).
 * After SIGTERM: each pidfd's fdinfo names its process (`Pid:`), the flags
 * are what they were (`self`, `child`), signal 0 through each is accepted,
 * and SIGKILL sent through the child's pidfd kills the child, whose exit
 * waitid(P_PIDFD) then reports (`kill`); each namespace fd is the
 * inode of /proc/self/ns/net and /proc/self/ns/uts (`ns`); each pidfd on
 * an exited process says `Pid: -1`, refuses signal 0 with ESRCH and polls
 * readable, the first process's two share an inode, and the second's
 * differs (`dead`).
 */
#include "zdtm.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#ifndef PIDFD_NONBLOCK
#define PIDFD_NONBLOCK O_NONBLOCK
#endif
#ifndef P_PIDFD
#define P_PIDFD 3
#endif

static int pidfd_open(pid_t pid, unsigned int flags)
{
	return (int)syscall(SYS_pidfd_open, pid, flags);
}

static int pidfd_signal(int fd, int sig)
{
	return (int)syscall(SYS_pidfd_send_signal, fd, sig, NULL, 0);
}

/* The Pid: of pidfd fd's fdinfo (-2 if none). */
static int pid_of(int fd)
{
	char info[512];
	char *p;

	if (zdtm_fdinfo(fd, info, sizeof(info)) < 0 || !(p = strstr(info, "Pid:")))
		return -2;
	return atoi(p + 4);
}

/* Whether fd is the namespace file /proc/self/ns/<kind>. */
static int same_ns(int fd, const char *kind)
{
	char path[64];
	struct stat a, b;

	snprintf(path, sizeof(path), "/proc/self/ns/%s", kind);
	return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino &&
	       a.st_dev == b.st_dev;
}

static ino_t ino_of(int fd)
{
	struct stat st;

	return fstat(fd, &st) ? 0 : st.st_ino;
}

/* A process that has exited and been reaped, with `n` pidfds on it
 * (opened one by one) in fds. */
static void dead_pidfds(int *fds, int n)
{
	pid_t c = fork();

	if (c < 0)
		zdtm_die("fork");
	if (c == 0) {
		for (;;)
			pause();
	}
	for (int i = 0; i < n; i++)
		if ((fds[i] = pidfd_open(c, 0)) < 0)
			zdtm_die("pidfd_open");
	kill(c, SIGKILL);
	if (waitpid(c, NULL, 0) != c)
		zdtm_die("waitpid");
}

/* Checks one pidfd on an exited process. */
static void check_dead(int fd, const char *name)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	zdtm_check(pid_of(fd) == -1, "dead", "%s: Pid: %d, want -1", name, pid_of(fd));
	zdtm_check(pidfd_signal(fd, 0) == -1 && errno == ESRCH, "dead",
		   "%s: signal 0 through it: %s, want ESRCH", name, strerror(errno));
	zdtm_check(poll(&p, 1, 0) == 1 && (p.revents & POLLIN), "dead",
		   "%s: poll says revents %#x, want POLLIN", name, p.revents);
}

int main(int argc, char **argv)
{
	int self, child_fd, fl, net, uts, dead_a[2], dead_b;
	pid_t child;
	siginfo_t si;

	zdtm_init(argc, argv, 0, "");
	dead_pidfds(dead_a, 2);
	dead_pidfds(&dead_b, 1);
	child = fork();
	if (child == 0) {
		for (;;)
			pause();
	}
	self = pidfd_open(getpid(), PIDFD_NONBLOCK);
	child_fd = pidfd_open(child, 0);
	net = open("/proc/self/ns/net", O_RDONLY);
	uts = open("/proc/self/ns/uts", O_RDONLY);
	if (child < 0 || self < 0 || child_fd < 0 || net < 0 || uts < 0) {
		printf("setup error: pidfd_open: %s\nFAIL: setup\n", strerror(errno));
		if (child > 0)
			kill(child, SIGKILL);
		return 1;
	}
	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(20);
	ZDTM_CORRUPT("self", fcntl(self, F_SETFL, 0));
	ZDTM_CORRUPT("child", dup2(self, child_fd));
	ZDTM_CORRUPT("ns", dup2(uts, net));
	ZDTM_CORRUPT("dead", dup2(dead_b, dead_a[1]));

	check_dead(dead_a[0], "first exited process's first pidfd");
	check_dead(dead_a[1], "first exited process's second pidfd");
	check_dead(dead_b, "second exited process's pidfd");
	zdtm_check(ino_of(dead_a[0]) == ino_of(dead_a[1]), "dead",
		   "the first exited process's pidfds have inodes %lu and %lu",
		   (unsigned long)ino_of(dead_a[0]), (unsigned long)ino_of(dead_a[1]));
	zdtm_check(ino_of(dead_a[0]) != ino_of(dead_b), "dead",
		   "pidfds on two exited processes share inode %lu",
		   (unsigned long)ino_of(dead_b));

	zdtm_check(same_ns(net, "net") && same_ns(uts, "uts"), "ns",
		   "the namespace fds are not the process's net and uts namespaces");

	zdtm_check(pid_of(self) == getpid(), "self", "self pidfd names %d, want %d", pid_of(self),
		   getpid());
	fl = fcntl(self, F_GETFL);
	zdtm_check(fl >= 0 && (fl & O_NONBLOCK), "self", "self pidfd flags %#x", fl);
	zdtm_check(pidfd_signal(self, 0) == 0, "self", "signal 0: %s", strerror(errno));
	zdtm_check(pid_of(child_fd) == child, "child", "child pidfd names %d, want %d",
		   pid_of(child_fd), child);
	fl = fcntl(child_fd, F_GETFL);
	zdtm_check(fl >= 0 && !(fl & O_NONBLOCK), "child", "child pidfd flags %#x", fl);
	if (pid_of(child_fd) != child) {
		kill(child, SIGKILL);
		waitpid(child, NULL, 0);
		zdtm_finish();
	}
	zdtm_check(pidfd_signal(child_fd, SIGKILL) == 0, "kill", "SIGKILL: %s", strerror(errno));
	memset(&si, 0, sizeof(si));
	zdtm_check(waitid(P_PIDFD, child_fd, &si, WEXITED) == 0 && si.si_pid == child &&
			   si.si_code == CLD_KILLED && si.si_status == SIGKILL,
		   "kill", "waitid: pid %d code %d status %d", si.si_pid, si.si_code,
		   si.si_status);
	zdtm_finish();
}
