/*
 * tree.c - a process tree: a session leader, a process group with two
 * members, a grandchild and a zombie.
 *
 *   tree PIDFILE
 *
 * Set up before "ready":
 *   root  setsid() (session leader and group leader); forks
 *   Z     exits at once with status 7; NOT reaped until after SIGTERM (the
 *         pidfile is written only once /proc/Z/stat says 'Z')
 *   A     setpgid(0, 0): leader of its own group; forks
 *   C     A's child (root's grandchild), stays in A's group
 *   B     root's child, setpgid(0, A): joins A's group (the root also calls
 *         setpgid for A and B, as shells do, so there is no race)
 * Memory: "common" (512 KiB, pattern(SEED_COMMON), filled by the root before
 * forking and never written again, so it stays COW-shared) and "own"
 * (256 KiB, pattern(SEED_OWN ^ mix(pid)), rewritten by every process after
 * fork with its own PID-derived seed).
 * A setup pipe (closed by everyone before "ready") tells the root when A, B
 * and C are done.
 *
 * While waiting: root nanosleep(100 ms) loop; A sigsuspend() with SIGTERM
 * blocked otherwise (race free); B nanosleep(50 ms) loop; C sigtimedwait()
 * for SIGTERM (blocked), 500 ms timeouts.  B and C leave their loop early
 * if their parent changes (orphaned: the check then fails on ppid).
 *
 * After SIGTERM (sent to the root only):
 *   root  checks getpid, getsid == getpgrp == its pid, its memory; that
 *         /proc/Z/stat says zombie with the root as parent, and that
 *         waitpid(Z, WNOHANG) reaps exactly Z with exit status 7; then sends
 *         SIGTERM to A and B and waits (20 s deadline) for exit status 0;
 *         finally that it has no other child (ECHILD).
 *   A     forwards SIGTERM to C and waits for it (status 0 required).
 *   A/B/C each check getpid, getppid (original parent), getpgrp (A's pid),
 *         getsid (root's pid), both buffers; they print nothing on stdout:
 *         mismatch lines go to stderr (one write each) and the result is the
 *         exit status, a bit mask (below) the root turns into tags "A-ppid",
 *         "B-mem", ...  C's result reaches the root as A's "child" bit.
 *
 * Self-test: the root corrupts its own state; A, B and C corrupt theirs
 * (for real where possible: A moves to the root's group, C calls setsid())
 * and the root records the tags it expects to come back in exit statuses.
 */
#include "zdtm.h"

#include <sys/wait.h>

#define COMMON_SIZE (512 * 1024)
#define OWN_SIZE    (256 * 1024)
#define SEED_COMMON 0x74726565636f6d00ull
#define SEED_OWN    0x747265656f776e00ull
#define Z_STATUS    7
#define SETUP_FAIL  100
#define DEADLINE_S  20

/* child exit status bits */
#define R_PID      0x01
#define R_PPID     0x02
#define R_PGRP     0x04
#define R_SID      0x08
#define R_MEM      0x10
#define R_CHILD    0x20
#define R_INTERNAL 0x40
#define R_NBITS    7

static const char *const tags_a[R_NBITS] = {
	"A-pid", "A-ppid", "A-pgrp", "A-sid", "A-mem", "A-child", "A-internal"
};
static const char *const tags_b[R_NBITS] = {
	"B-pid", "B-ppid", "B-pgrp", "B-sid", "B-mem", "B-child", "B-internal"
};

struct ident {
	const char *name;
	pid_t pid, ppid, pgrp, sid;
	uint64_t seed; /* of the "own" buffer */
};

static uint8_t *common, *own;
static int ready_w = -1;

static uint64_t own_seed(pid_t pid)
{
	return SEED_OWN ^ zdtm_mix64((uint64_t)pid);
}

/* ------------------------------------------------------------------ */
/* child-side reporting: stderr only, one write() per line             */

__attribute__((format(printf, 3, 4)))
static void cfail(const struct ident *e, const char *what, const char *fmt,
		  ...)
{
	char tag[64], who[64];
	va_list ap;

	snprintf(tag, sizeof(tag), "%s-%s", e->name, what);
	snprintf(who, sizeof(who), "tree child %s", e->name);
	va_start(ap, fmt);
	zdtm_child_vfail(who, tag, fmt, ap);
	va_end(ap);
}

/* Number of bytes of p[0..len) that differ from pattern seed. */
static size_t pat_diff(const uint8_t *p, size_t len, uint64_t seed,
		       size_t *first)
{
	size_t off, bad = 0;

	for (off = 0; off < len; off++) {
		if (p[off] != zdtm_pat_byte(seed, off)) {
			if (!bad)
				*first = off;
			bad++;
		}
	}
	return bad;
}

__attribute__((noreturn, format(printf, 2, 3)))
static void child_setup_fail(const struct ident *e, const char *fmt, ...)
{
	char buf[256];
	int n;
	va_list ap;

	n = snprintf(buf, sizeof(buf), "tree child %s: setup error: ", e->name);
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof(buf) - n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(buf) - 2)
		n = sizeof(buf) - 2;
	buf[n++] = '\n';
	if (write(2, buf, n) < 0) {
		/* ignore */
	}
	_exit(SETUP_FAIL);
}

/* Verify identity (strictly, at setup) and tell the root we are ready. */
static void child_ready(const struct ident *e, char c)
{
	if (getpid() != e->pid || getppid() != e->ppid ||
	    getpgrp() != e->pgrp || getsid(0) != e->sid)
		child_setup_fail(e, "identity pid %d ppid %d pgrp %d sid %d, "
				 "expected %d %d %d %d", (int)getpid(),
				 (int)getppid(), (int)getpgrp(), (int)getsid(0),
				 (int)e->pid, (int)e->ppid, (int)e->pgrp,
				 (int)e->sid);
	while (write(ready_w, &c, 1) != 1)
		if (errno != EINTR)
			child_setup_fail(e, "write setup pipe");
	close(ready_w);
	ready_w = -1;
}

/* Every check of one process's own state; returns R_* bits. */
static int check_self(const struct ident *e)
{
	int bits = 0;
	pid_t v;
	size_t bad, first = 0;

	if ((v = getpid()) != e->pid) {
		cfail(e, "pid", "getpid() %d, expected %d", (int)v, (int)e->pid);
		bits |= R_PID;
	}
	if ((v = getppid()) != e->ppid) {
		cfail(e, "ppid", "getppid() %d, expected %d", (int)v,
		      (int)e->ppid);
		bits |= R_PPID;
	}
	if ((v = getpgrp()) != e->pgrp) {
		cfail(e, "pgrp", "getpgrp() %d, expected %d", (int)v,
		      (int)e->pgrp);
		bits |= R_PGRP;
	}
	if ((v = getsid(0)) != e->sid) {
		cfail(e, "sid", "getsid(0) %d, expected %d", (int)v,
		      (int)e->sid);
		bits |= R_SID;
	}
	bad = pat_diff(own, OWN_SIZE, e->seed, &first);
	if (bad) {
		cfail(e, "mem", "own buffer: %zu of %d bytes differ, first at "
		      "offset %zu: got 0x%02x expected 0x%02x", bad, OWN_SIZE,
		      first, own[first], zdtm_pat_byte(e->seed, first));
		bits |= R_MEM;
	}
	bad = pat_diff(common, COMMON_SIZE, SEED_COMMON, &first);
	if (bad) {
		cfail(e, "mem", "common buffer: %zu of %d bytes differ, first "
		      "at offset %zu: got 0x%02x expected 0x%02x", bad,
		      COMMON_SIZE, first, common[first],
		      zdtm_pat_byte(SEED_COMMON, first));
		bits |= R_MEM;
	}
	return bits;
}

/* ------------------------------------------------------------------ */
/* the children                                                        */

__attribute__((noreturn))
static void run_c(pid_t root, pid_t a)
{
	struct ident e = { "C", getpid(), a, a, root, own_seed(getpid()) };
	sigset_t set;
	int bits;

	/* SIGTERM is already blocked (inherited from A) */
	zdtm_fill(own, OWN_SIZE, e.seed);
	child_ready(&e, 'C');

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	for (;;) {
		struct timespec ts = { 0, 500 * 1000000l };
		siginfo_t si;
		int sig = sigtimedwait(&set, &si, &ts);

		if (sig == SIGTERM)
			break;
		if (sig < 0 && errno != EINTR && errno != EAGAIN)
			_exit(R_INTERNAL);
		if (getppid() != e.ppid)
			break; /* orphaned: reported by check_self */
	}

	ZDTM_CORRUPT("C-sid", setsid()); /* new session and group */

	bits = check_self(&e);
	_exit(bits);
}

__attribute__((noreturn))
static void run_a(pid_t root)
{
	struct ident e = { "A", getpid(), root, getpid(), root,
			   own_seed(getpid()) };
	sigset_t block, waitmask;
	pid_t c;
	int bits, st;

	if (setpgid(0, 0))
		child_setup_fail(&e, "setpgid(0, 0): errno %d", errno);
	zdtm_fill(own, OWN_SIZE, e.seed);

	/* block SIGTERM before C exists: C inherits the mask, and A's
	 * sigsuspend() cannot miss the signal */
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	if (sigprocmask(SIG_BLOCK, &block, &waitmask))
		child_setup_fail(&e, "sigprocmask");
	sigdelset(&waitmask, SIGTERM);

	c = fork();
	if (c < 0)
		child_setup_fail(&e, "fork C: errno %d", errno);
	if (c == 0)
		run_c(root, e.pid);
	child_ready(&e, 'A');

	while (!zdtm_stop)
		sigsuspend(&waitmask);

	ZDTM_CORRUPT("A-pgrp", setpgid(0, root)); /* move to root's group */
	ZDTM_CORRUPT("A-sid", e.sid += 1000);
	ZDTM_CORRUPT("A-mem", common[COMMON_SIZE / 2 + 7] ^= 0x10);

	bits = check_self(&e);

	if (kill(c, SIGTERM)) {
		cfail(&e, "child", "kill(C %d, SIGTERM): errno %d", (int)c,
		      errno);
		bits |= R_CHILD;
	}
	if (zdtm_wait_deadline(c, &st, DEADLINE_S * 1000)) {
		cfail(&e, "child", "waitpid(C %d): errno %d", (int)c, errno);
		kill(c, SIGKILL);
		bits |= R_CHILD;
	} else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		cfail(&e, "child", "C (pid %d) %s %d (see C's lines)", (int)c,
		      WIFEXITED(st) ? "exited with status" : "killed by signal",
		      WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
		bits |= R_CHILD;
	}
	_exit(bits);
}

__attribute__((noreturn))
static void run_b(pid_t root, pid_t a)
{
	struct ident e = { "B", getpid(), root, a, root, own_seed(getpid()) };
	int bits;

	if (setpgid(0, a))
		child_setup_fail(&e, "setpgid(0, %d): errno %d", (int)a, errno);
	zdtm_fill(own, OWN_SIZE, e.seed);
	child_ready(&e, 'B');

	while (!zdtm_stop) {
		zdtm_msleep(50);
		if (getppid() != e.ppid)
			break; /* orphaned: reported by check_self */
	}

	ZDTM_CORRUPT("B-pid", e.pid += 1000);
	ZDTM_CORRUPT("B-ppid", e.ppid += 1000);
	ZDTM_CORRUPT("B-mem", own[OWN_SIZE - 3] ^= 0x01);

	bits = check_self(&e);
	_exit(bits);
}

/* ------------------------------------------------------------------ */
/* root                                                                */

/* State letter and ppid from /proc/PID/stat; 0 on success. */
static int proc_stat(pid_t pid, char *state, pid_t *ppid)
{
	char path[64], buf[1024], *p;
	int fd, ppid_i;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	do
		n = read(fd, buf, sizeof(buf) - 1);
	while (n < 0 && errno == EINTR);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %c %d", state, &ppid_i) != 2)
		return -1;
	*ppid = ppid_i;
	return 0;
}

static void check_child(const char *name, const char *const tags[R_NBITS],
			pid_t pid)
{
	int st, b, code;

	if (zdtm_wait_deadline(pid, &st, DEADLINE_S * 1000)) {
		zdtm_fail(tags[R_NBITS - 1], "waitpid(%s = %d): %s", name,
			  (int)pid, strerror(errno));
		kill(-pid, SIGKILL);
		kill(pid, SIGKILL);
		return;
	}
	if (!WIFEXITED(st)) {
		zdtm_fail(tags[R_NBITS - 1], "child %s (pid %d) killed by "
			  "signal %d", name, (int)pid,
			  WIFSIGNALED(st) ? WTERMSIG(st) : -1);
		return;
	}
	code = WEXITSTATUS(st);
	for (b = 0; b < R_NBITS; b++)
		if (code & (1 << b))
			zdtm_fail(tags[b], "child %s (pid %d) exited with "
				  "status %#x (details on stderr)", name,
				  (int)pid, code);
	if (code & ~((1 << R_NBITS) - 1))
		zdtm_fail(tags[R_NBITS - 1], "child %s (pid %d) exited with "
			  "unexpected status %d", name, (int)pid, code);
}

int main(int argc, char **argv)
{
	pid_t root, z, a, b, r, zppid = 0;
	pid_t exp_sid;
	int exp_zstatus = Z_STATUS;
	int readyp[2], st, got = 0;
	char seen[4] = { 0 }, zstate = 0;
	int64_t end;

	zdtm_init(argc, argv, 0, NULL);
	root = getpid();
	if (getsid(0) != root && setsid() < 0)
		zdtm_die("setsid");
	exp_sid = root;

	common = malloc(COMMON_SIZE);
	own = malloc(OWN_SIZE);
	if (!common || !own)
		zdtm_die("malloc");
	zdtm_fill(common, COMMON_SIZE, SEED_COMMON);
	zdtm_fill(own, OWN_SIZE, own_seed(root));

	if (pipe2(readyp, O_CLOEXEC))
		zdtm_die("pipe2");
	ready_w = readyp[1];
	fflush(stdout); /* nothing buffered may be inherited */

	z = fork();
	if (z < 0)
		zdtm_die("fork Z");
	if (z == 0)
		_exit(Z_STATUS);

	a = fork();
	if (a < 0)
		zdtm_die("fork A");
	if (a == 0) {
		close(readyp[0]);
		run_a(root);
	}
	if (setpgid(a, a) && errno != EACCES) {
		kill(a, SIGKILL);
		zdtm_die("setpgid(A, A)");
	}

	b = fork();
	if (b < 0) {
		kill(-a, SIGKILL);
		zdtm_die("fork B");
	}
	if (b == 0) {
		close(readyp[0]);
		run_b(root, a);
	}
	if (setpgid(b, a) && errno != EACCES) {
		kill(-a, SIGKILL);
		zdtm_die("setpgid(B, A)");
	}

	close(readyp[1]);
	ready_w = -1;
	for (;;) {
		char c;
		ssize_t n = read(readyp[0], &c, 1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (c == 'A')
			seen[0] = 1;
		else if (c == 'B')
			seen[1] = 1;
		else if (c == 'C')
			seen[2] = 1;
		got++;
	}
	close(readyp[0]);
	if (got != 3 || !seen[0] || !seen[1] || !seen[2]) {
		kill(-a, SIGKILL);
		errno = 0;
		zdtm_die("children not ready (%d setup bytes; see stderr)", got);
	}

	/* Z must be a zombie before we are ready */
	end = zdtm_now_ns() + 10 * 1000000000ll;
	while (proc_stat(z, &zstate, &zppid) || zstate != 'Z') {
		if (zdtm_now_ns() > end) {
			kill(-a, SIGKILL);
			zdtm_die("Z (%d) did not become a zombie (state %c)",
				 (int)z, zstate ? zstate : '?');
		}
		zdtm_msleep(1);
	}

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	/* ---------------- verification ---------------- */
	ZDTM_CORRUPT("root-id", exp_sid += 1000);
	ZDTM_CORRUPT("root-mem", own[OWN_SIZE / 3] ^= 0x80,
		     common[12345] ^= 0x02);
	ZDTM_CORRUPT("zombie", exp_zstatus = Z_STATUS + 1);
	/* corrupted inside the children, reported through exit statuses */
	ZDTM_CORRUPT("A-pgrp", (void)0);
	ZDTM_CORRUPT("A-sid", (void)0);
	ZDTM_CORRUPT("A-mem", (void)0);
	ZDTM_CORRUPT("A-child", (void)0); /* C-sid */
	ZDTM_CORRUPT("B-pid", (void)0);
	ZDTM_CORRUPT("B-ppid", (void)0);
	ZDTM_CORRUPT("B-mem", (void)0);
	ZDTM_CORRUPT("tree", {
		pid_t x = fork();

		if (x == 0)
			_exit(0);
	});

	zdtm_check(getpid() == root, "root-id", "getpid() %d, expected %d",
		   (int)getpid(), (int)root);
	zdtm_check(getsid(0) == exp_sid, "root-id",
		   "getsid(0) %d, expected %d (session leader)",
		   (int)getsid(0), (int)exp_sid);
	zdtm_check(getpgrp() == exp_sid, "root-id",
		   "getpgrp() %d, expected %d (group leader)", (int)getpgrp(),
		   (int)exp_sid);
	zdtm_verify_pattern("root-mem", "root own buffer", own, OWN_SIZE,
			    own_seed(root));
	zdtm_verify_pattern("root-mem", "root common buffer", common,
			    COMMON_SIZE, SEED_COMMON);

	/* the zombie: still a zombie child of ours, at its PID, status 7 */
	zstate = 0;
	if (zdtm_check(proc_stat(z, &zstate, &zppid) == 0, "zombie",
		       "/proc/%d/stat unreadable: Z is gone", (int)z)) {
		zdtm_check(zstate == 'Z', "zombie",
			   "Z (pid %d) state '%c', expected 'Z'", (int)z, zstate);
		zdtm_check(zppid == root, "zombie",
			   "Z (pid %d) ppid %d, expected %d", (int)z, (int)zppid,
			   (int)root);
	}
	do
		r = waitpid(z, &st, WNOHANG);
	while (r < 0 && errno == EINTR);
	if (zdtm_check(r == z, "zombie", "waitpid(Z = %d, WNOHANG) returned "
		       "%d (%s)", (int)z, (int)r,
		       r < 0 ? strerror(errno) : "not exited"))
		zdtm_check(WIFEXITED(st) && WEXITSTATUS(st) == exp_zstatus,
			   "zombie", "Z status %#x: exited %d status %d, "
			   "expected exit status %d", st, WIFEXITED(st),
			   WEXITSTATUS(st), exp_zstatus);

	/* the live children */
	zdtm_check(kill(a, SIGTERM) == 0, "A-internal", "kill(A = %d): %s",
		   (int)a, strerror(errno));
	zdtm_check(kill(b, SIGTERM) == 0, "B-internal", "kill(B = %d): %s",
		   (int)b, strerror(errno));
	check_child("A", tags_a, a);
	check_child("B", tags_b, b);

	/* nothing else is our child */
	do
		r = waitpid(-1, &st, WNOHANG);
	while (r < 0 && errno == EINTR);
	zdtm_check(r < 0 && errno == ECHILD, "tree",
		   "an unexpected child remains: waitpid(-1) returned %d",
		   (int)r);

	zdtm_finish();
}
