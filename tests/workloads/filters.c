/*
 * filters.c - seccomp filters shared by the threads of a process (zdtm's
 * seccomp_filter_threads, seccomp_filter_tsync): once restored the
 * threads must share one filter tree again, so that a filter installed
 * with SECCOMP_FILTER_FLAG_TSYNC reaches them all.
 *
 *   filters PIDFILE
 *
 * Set up before "ready": the root forks F, which sets no_new_privs and
 * installs filter A (getpid fails with errno 77), then starts thread T
 * (which inherits A) and waits, as T does, reading a pipe.
 *
 * After SIGTERM (root): the root writes to F's pipe. F installs filter B
 * (getppid fails with errno 78) with TSYNC, which must succeed (`tsync`:
 * it fails, naming a thread, when the threads' filters are not one tree),
 * then lets T go: in T getpid fails with 77 (`inherited`) and getppid
 * with 78 (`tsync`). F exits with T's and its own result bits.
 */
#include "zdtm.h"

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

enum { R_TSYNC = 1, R_INHERITED = 2, R_INTERNAL = 4, R_NBITS = 3 };
static const char *const tags[R_NBITS] = { "tsync", "inherited", "F-internal" };

static int go_t[2];

/* A filter failing syscall NR with errno ERR; FLAGS for seccomp(2). */
static long deny(int nr, int err, unsigned int flags)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned int)nr, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (unsigned int)err),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { sizeof(f) / sizeof(f[0]), f };

	return syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
}

static void *run_t(void *arg)
{
	long bits = 0;
	char c;

	(void)arg;
	if (read(go_t[0], &c, 1) != 1)
		return (void *)(long)R_INTERNAL;
	if (syscall(SYS_getpid) != -1 || errno != (ZDTM_SELFTEST ? 76 : 77)) { /* inherited */
		zdtm_child_fail("T", "inherited", "getpid did not fail with 77 (errno %d)", errno);
		bits |= R_INHERITED;
	}
	if (syscall(SYS_getppid) != -1 || errno != 78) {
		zdtm_child_fail("T", "tsync", "getppid did not fail with 78 (errno %d)", errno);
		bits |= R_TSYNC;
	}
	return (void *)bits;
}

static void run_f(int ready, int go)
{
	pthread_t t;
	void *tbits = NULL;
	long r;
	int bits = 0;
	char c = 'F';

	if (pipe(go_t) || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || deny(SYS_getpid, 77, 0))
		_exit(64);
	if (pthread_create(&t, NULL, run_t, NULL) || write(ready, &c, 1) != 1)
		_exit(64);
	if (read(go, &c, 1) != 1)
		_exit(R_INTERNAL);
	if (ZDTM_SELFTEST) /* tsync, in T */
		r = deny(SYS_getppid, 78, 0);
	else
		r = deny(SYS_getppid, 78, SECCOMP_FILTER_FLAG_TSYNC);
	if (r != 0) {
		zdtm_child_fail("F", "tsync", "TSYNC failed: %ld (errno %d)", r, errno);
		bits |= R_TSYNC;
	}
	if (write(go_t[1], &c, 1) != 1 || pthread_join(t, &tbits))
		bits |= R_INTERNAL;
	syscall(SYS_exit_group, bits | (int)(long)tbits);
}

int main(int argc, char **argv)
{
	int ready[2], go[2], st = 0, i;
	char c;
	pid_t f;

	zdtm_init(argc, argv, 0, "");
	if (pipe(ready) || pipe(go))
		zdtm_die("pipe");
	f = fork();
	if (f < 0)
		zdtm_die("fork");
	if (f == 0) {
		close(ready[0]);
		close(go[1]);
		run_f(ready[1], go[0]);
	}
	close(ready[1]);
	close(go[0]);
	if (read(ready[0], &c, 1) != 1)
		zdtm_die("F could not install its filter");

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("tsync", (void)0);
	ZDTM_CORRUPT("inherited", (void)0);
	if (write(go[1], "g", 1) != 1)
		zdtm_fail("F-internal", "write to F: errno %d", errno);
	if (zdtm_wait_deadline(f, &st, 30000) != 0 || !WIFEXITED(st)) {
		zdtm_fail("F-internal", "F (pid %d) did not exit (status %#x)", (int)f, st);
		kill(f, SIGKILL);
	} else {
		for (i = 0; i < R_NBITS; i++)
			zdtm_check(!(WEXITSTATUS(st) & (1 << i)), tags[i], "see stderr");
	}
	zdtm_finish();
}
