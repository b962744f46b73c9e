/*
 * leases.c - file leases must survive checkpoint/restore (zdtm's
 * file_lease00, file_lease01).
 *
 *   leases PIDFILE
 *
 * Set up before "ready": leases.rd opened read-only three times, the
 * first and third descriptions with a read lease (F_SETLEASE F_RDLCK), the
 * second without. SIGIO is counted. (No write lease: the test harness
 * copies the workload's files after a --leave-running dump, and any open
 * breaks a write lease; zdtm's file_lease00 has one.)
 * After SIGTERM: F_GETLEASE of each fd is what it was (`read`, `free`);
 * the lease holder is this process (F_GETOWN); a child opening leases.rd
 * (O_WRONLY | O_NONBLOCK) gets EWOULDBLOCK and this process its SIGIO
 * (`break`): the kernel holds the lease, not just the image.
 */
#include "zdtm.h"

#include <fcntl.h>
#include <sys/wait.h>

static volatile sig_atomic_t io_count;

static void on_io(int sig)
{
	(void)sig;
	io_count++;
}

static int open_file(const char *name, int flags)
{
	int fd = open(name, flags | O_CREAT, 0644);

	if (fd < 0) {
		printf("setup error: %s: %s\nFAIL: setup\n", name, strerror(errno));
		exit(1);
	}
	return fd;
}

/* A child's non-blocking open of leases.rd for writing: its errno (0: it
 * opened). */
static int breaker(void)
{
	int st = 0;
	pid_t pid = fork();

	if (pid == 0) {
		int fd = open("leases.rd", O_WRONLY | O_NONBLOCK);

		_exit(fd < 0 ? errno : 0);
	}
	if (pid < 0)
		return -1;
	/* SIGIO (the lease break) interrupts the wait. */
	while (waitpid(pid, &st, 0) != pid)
		if (errno != EINTR)
			return -1;
	if (!WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

int main(int argc, char **argv)
{
	struct sigaction sa;
	int rd, free_rd, rd2, got, err, i;

	zdtm_init(argc, argv, 0, "");
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_io;
	sigaction(SIGIO, &sa, NULL);
	rd = open_file("leases.rd", O_RDONLY);
	free_rd = open_file("leases.rd", O_RDONLY);
	rd2 = open_file("leases.rd", O_RDONLY);
	if (fcntl(rd, F_SETLEASE, F_RDLCK) != 0 || fcntl(rd2, F_SETLEASE, F_RDLCK) != 0) {
		printf("setup error: F_SETLEASE: %s\nFAIL: setup\n", strerror(errno));
		return 1;
	}
	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(20);
	ZDTM_CORRUPT("read", fcntl(rd, F_SETLEASE, F_UNLCK));
	ZDTM_CORRUPT("read", fcntl(rd2, F_SETLEASE, F_UNLCK));
	ZDTM_CORRUPT("free", fcntl(free_rd, F_SETLEASE, F_RDLCK));
	ZDTM_CORRUPT("owner", fcntl(rd2, F_SETOWN, 1));

	got = fcntl(rd, F_GETLEASE);
	zdtm_check(got == F_RDLCK, "read", "read lease is %d, want %d", got, F_RDLCK);
	got = fcntl(free_rd, F_GETLEASE);
	zdtm_check(got == F_UNLCK, "free", "unleased fd has lease %d", got);
	got = fcntl(rd2, F_GETLEASE);
	zdtm_check(got == F_RDLCK, "read", "second read lease is %d, want %d", got, F_RDLCK);
	got = fcntl(rd2, F_GETOWN);
	zdtm_check(got == getpid(), "owner", "lease owner %d, want %d", got, getpid());
	ZDTM_CORRUPT("break", fcntl(rd, F_SETLEASE, F_UNLCK); fcntl(rd2, F_SETLEASE, F_UNLCK);
		     fcntl(free_rd, F_SETLEASE, F_UNLCK));
	err = breaker();
	zdtm_check(err == EWOULDBLOCK, "break", "an open during the lease gave %d", err);
	for (i = 0; i < 400 && !io_count; i++)
		zdtm_msleep(5);
	zdtm_check(io_count > 0, "break", "no SIGIO for the lease break");
	zdtm_finish();
}
