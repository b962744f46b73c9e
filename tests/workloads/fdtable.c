/*
 * fdtable.c - processes that share one fd table (clone(CLONE_FILES),
 * zdtm's fdt_shared and fd01) must share it again once restored, and a
 * process with a table of its own must keep its own.
 *
 *   fdtable PIDFILE
 *
 * Set up before "ready":
 *   root  opens file "f0" at fd 50 (content "f0"); clones
 *   A     with CLONE_FILES (shares the root's table); A clones
 *   C     with CLONE_FILES (A's child, shares the same table), and forks
 *   B     (A's child, a table of its own: a copy of the shared one, fd 50
 *         included); B clones
 *   S     with CLONE_FILES | CLONE_PARENT: A's child sharing B's table,
 *         which A does not share
 * While waiting: A, B, C and S sleep in 50 ms steps until SIGTERM.
 *
 * After SIGTERM (root):
 *   root  fd 50 reads "f0" (`files`); opens file "f1" at fd 61 (content
 *         "f1"), then sends SIGTERM to A.
 *   A, C  fd 61 is there and reads "f1": they see the root's new fd
 *         (`A-sees`, `C-sees`); C then closes fd 50.
 *   B     fd 50 reads "f0" (`B-inherit`); fd 61 does not exist (`B-own`);
 *         it shares its table with S (kcmp KCMP_FILES: `S-shares`); it
 *         opens "f3" at fd 62 and sends SIGTERM to S.
 *   S     fd 62 reads "f3", and its parent is A (`S`).
 *   A sends SIGTERM to C and B, waits for both and exits with their
 *   result bits and its own; the root waits for A, turns the bits into
 *   tags, and checks that fd 50 is gone (C closed it in the shared table:
 *   `shared`) while fd 61 is still there (`shared`).
 * Children print nothing on stdout: mismatch lines go to stderr.
 */
#include "zdtm.h"

#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define FD_OLD 50
#define FD_NEW 61

enum {
	R_A_SEES = 1,
	R_C_SEES = 2,
	R_B_OWN = 4,
	R_B_INHERIT = 8,
	R_C_CLOSE = 16,
	R_INTERNAL = 32,
	R_S_SHARES = 64,
	R_S = 128,
	R_NBITS = 8,
};
static const char *const tags[R_NBITS] = { "A-sees",	"C-sees",  "B-own",	 "B-inherit",
					   "C-close",	"A-internal", "S-shares", "S" };

#define FD_S 62

/* Whether FD reads exactly WANT (from offset 0). */
static int reads(int fd, const char *want)
{
	char buf[16] = { 0 };
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	return n == (ssize_t)strlen(want) && memcmp(buf, want, (size_t)n) == 0;
}

static void make_file(const char *name, const char *content, int at)
{
	int fd = open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);

	if (fd < 0)
		zdtm_die("open %s", name);
	if (write(fd, content, strlen(content)) != (ssize_t)strlen(content))
		zdtm_die("write %s", name);
	if (dup2(fd, at) != at)
		zdtm_die("dup2 %s to %d", name, at);
	close(fd);
}

static pid_t clone_files(void)
{
	return (pid_t)syscall(SYS_clone, CLONE_FILES | SIGCHLD, 0, NULL, NULL, 0);
}

static void wait_stop(void)
{
	while (!zdtm_stop)
		zdtm_msleep(50);
}

/* C: shares the table; sees the root's new fd, then closes fd 50. */
static void run_c(void)
{
	int bits = 0;

	wait_stop();
	if (ZDTM_SELFTEST)
		close(FD_NEW); /* C-sees */
	if (!reads(FD_NEW, "f1")) {
		zdtm_child_fail("C", "C-sees", "fd %d does not read \"f1\" (errno %d)", FD_NEW,
				errno);
		bits |= R_C_SEES;
	}
	if (close(FD_OLD)) {
		zdtm_child_fail("C", "C-close", "close(%d): errno %d", FD_OLD, errno);
		bits |= R_C_CLOSE;
	}
	_exit(bits);
}

/* S: shares B's table, A's child. */
static void run_s(pid_t a)
{
	int bits = 0;

	wait_stop();
	if (ZDTM_SELFTEST)
		close(FD_S); /* S */
	if (!reads(FD_S, "f3")) {
		zdtm_child_fail("S", "S", "fd %d does not read \"f3\" (errno %d)", FD_S, errno);
		bits = 1;
	}
	if (getppid() != a) {
		zdtm_child_fail("S", "S", "parent %d, expected A (%d)", (int)getppid(), (int)a);
		bits = 1;
	}
	_exit(bits);
}

/* B: a table of its own, shared with S. */
static void run_b(void)
{
	int bits = 0;
	pid_t a = getppid();
	pid_t s = (pid_t)syscall(SYS_clone, CLONE_FILES | CLONE_PARENT | SIGCHLD, 0, NULL, NULL, 0);

	if (s == 0)
		run_s(a);
	if (s < 0)
		_exit(R_INTERNAL);
	wait_stop();
	if (ZDTM_SELFTEST)
		dup2(FD_OLD, FD_NEW); /* B-own */
	if (fcntl(FD_NEW, F_GETFD) >= 0 || errno != EBADF) {
		zdtm_child_fail("B", "B-own", "fd %d exists in B's own table", FD_NEW);
		bits |= R_B_OWN;
	}
	if (!reads(FD_OLD, "f0")) {
		zdtm_child_fail("B", "B-inherit", "fd %d does not read \"f0\" (errno %d)",
				FD_OLD, errno);
		bits |= R_B_INHERIT;
	}
	if (ZDTM_SELFTEST)
		unshare(CLONE_FILES); /* S-shares (and S) */
	if (syscall(SYS_kcmp, getpid(), s, 2 /* KCMP_FILES */, 0, 0) != 0) {
		zdtm_child_fail("B", "S-shares", "B and S (%d) have two fd tables", (int)s);
		bits |= R_S_SHARES;
	}
	make_file("f3", "f3", FD_S);
	if (kill(s, SIGTERM))
		bits |= R_INTERNAL;
	_exit(bits);
}

static int wait_bits(pid_t pid, const char *name)
{
	int st = 0;

	if (zdtm_wait_deadline(pid, &st, 20000) != 0 || !WIFEXITED(st)) {
		zdtm_child_fail("A", "A-internal", "%s (pid %d) did not exit (status %#x)", name,
				(int)pid, st);
		kill(pid, SIGKILL);
		return R_INTERNAL;
	}
	return WEXITSTATUS(st);
}

/* A: shares the table; makes C (sharing) and B (own table). */
static void run_a(int ready)
{
	int bits = 0;
	pid_t c, b;

	c = clone_files();
	if (c == 0)
		run_c();
	b = fork();
	if (b == 0) {
		/* Its own copy of the table: the setup pipe's copy is closed
		 * here only. */
		close(ready);
		run_b();
	}
	if (c < 0 || b < 0 || write(ready, "r", 1) != 1)
		_exit(R_INTERNAL);
	wait_stop();
	if (ZDTM_SELFTEST)
		close(FD_NEW); /* A-sees (C sees it closed too: C-sees) */
	if (!reads(FD_NEW, "f1")) {
		zdtm_child_fail("A", "A-sees", "fd %d does not read \"f1\" (errno %d)", FD_NEW,
				errno);
		bits |= R_A_SEES;
	}
	if (kill(c, SIGTERM) || kill(b, SIGTERM))
		bits |= R_INTERNAL;
	bits |= wait_bits(c, "C") | wait_bits(b, "B");
	/* S, B's sibling-made child of A. */
	{
		int st = 0;
		int64_t end = zdtm_now_ns() + 20000000000ll;
		pid_t r;

		while ((r = waitpid(-1, &st, WNOHANG)) == 0 && zdtm_now_ns() < end)
			zdtm_msleep(5);
		if (r <= 0 || !WIFEXITED(st)) {
			zdtm_child_fail("A", "A-internal", "S did not exit (status %#x)", st);
			bits |= R_INTERNAL;
		} else {
			bits |= WEXITSTATUS(st) ? R_S : 0;
		}
	}
	_exit(bits);
}

int main(int argc, char **argv)
{
	int p[2], st = 0, i;
	char c;
	pid_t a;

	zdtm_init(argc, argv, 0, "");
	make_file("f0", "f0", FD_OLD);
	if (pipe(p))
		zdtm_die("pipe");
	a = clone_files();
	if (a < 0)
		zdtm_die("clone(CLONE_FILES)");
	if (a == 0)
		run_a(p[1]);
	if (read(p[0], &c, 1) != 1)
		zdtm_die("A did not set up C and B");
	/* Closed for A and C too: one table. */
	close(p[0]);
	close(p[1]);

	zdtm_ready();
	wait_stop();

	zdtm_check(reads(FD_OLD, "f0"), "files", "fd %d does not read \"f0\"", FD_OLD);
	make_file("f1", "f1", FD_NEW);
	ZDTM_CORRUPT("A-sees", (void)0);
	ZDTM_CORRUPT("C-sees", (void)0);
	ZDTM_CORRUPT("B-own", (void)0);
	ZDTM_CORRUPT("S-shares", (void)0);
	ZDTM_CORRUPT("S", (void)0);
	zdtm_check(kill(a, SIGTERM) == 0, "A-internal", "kill(A = %d): errno %d", (int)a, errno);
	if (zdtm_wait_deadline(a, &st, 30000) != 0 || !WIFEXITED(st)) {
		zdtm_fail("A-internal", "A (pid %d) did not exit (status %#x)", (int)a, st);
		kill(a, SIGKILL);
	} else {
		for (i = 0; i < R_NBITS; i++)
			zdtm_check(!(WEXITSTATUS(st) & (1 << i)), tags[i], "see stderr");
	}
	ZDTM_CORRUPT("shared", make_file("f2", "f2", FD_OLD));
	zdtm_check(fcntl(FD_OLD, F_GETFD) < 0 && errno == EBADF, "shared",
		   "fd %d is still open in the root: C closed it in a table of its own", FD_OLD);
	zdtm_check(reads(FD_NEW, "f1"), "shared", "fd %d does not read \"f1\"", FD_NEW);
	zdtm_finish();
}
