/*
 * tree_fill.c - process-tree benchmark workload for bench/tree_threads.py.
 *
 *   tree_fill PIDFILE SHARED_MIB NPROC [PRIVATE_MIB]
 *
 * A tree of NPROC processes (the root and NPROC-1 children) that share
 * SHARED_MIB MiB of anonymous memory:
 *
 * 1. The root maps SHARED_MIB MiB MAP_SHARED|MAP_ANONYMOUS and writes every
 *    byte (8-byte words, shared_pattern(offset) = mix64(offset ^ SEED_SH)).
 *    It also maps a 4 KiB MAP_SHARED control page (a ready counter).
 * 2. It forks NPROC-1 children, which inherit both mappings. Child k
 *    (1..NPROC-1) maps its own PRIVATE_MIB MiB (default 1) of private
 *    anonymous memory, writes it with private_pattern(k, offset) =
 *    mix64(offset ^ SEED_PRIV ^ k << 48), counts itself ready in the control
 *    page and sleeps in 50 ms nanosleep()s. The root then maps and writes
 *    its own private buffer (k = 0; mapped after the forks so the children
 *    do not get a copy-on-write copy of it).
 * 3. When every child is ready, the root writes PIDFILE (PIDFILE.tmp +
 *    rename): the root's PID on the first line, the children's PIDs on the
 *    second, and sleeps in 50 ms nanosleep()s.
 *
 * On SIGTERM (sent to the root only, after the restore):
 * - the root sends SIGTERM to every child and waits for each;
 * - child k checks the whole shared buffer (a marker word, see below, is
 *   accepted in place of the pattern at the marker offsets), checks its
 *   private buffer, then writes its marker word marker(k) at offset k*4096
 *   of the shared buffer and exits 0 (1 and a "FAIL: child ..." line if
 *   something was wrong);
 * - the root requires every child to have exited 0, requires every marker
 *   to be there (a child's write after the restore must be visible to the
 *   root, so the area is still shared, not copied per process), checks the
 *   rest of the shared buffer and its own private buffer, and prints "PASS"
 *   (exit 0) or "FAIL: ..." (exit 1).
 *
 * No pipes, sockets or extra fds. Start it with stdin from /dev/null and
 * stdout/stderr to a regular file (opened O_APPEND: the children write to
 * it too) so it can be checkpointed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define SEED_SH   0x7472656573686172ull /* "treeshar" */
#define SEED_PRIV 0x7472656570726976ull /* "treepriv" */
#define SEED_MARK 0x747265656d61726bull /* "treemark" */
#define MARK_STRIDE 4096
#define MAX_PROC 4096


struct control {
	int ready; /* children that have written their private buffer */
};

static uint64_t *shared;
static uint64_t shared_words;
static int nproc;
static pid_t children[MAX_PROC];

static inline uint64_t shared_pattern(uint64_t off)
{
	return mix64(off ^ SEED_SH);
}

static inline uint64_t private_pattern(int k, uint64_t off)
{
	return mix64(off ^ SEED_PRIV ^ ((uint64_t)k << 48));
}

static inline uint64_t marker(int k)
{
	return mix64((uint64_t)k ^ SEED_MARK);
}

/* The process that owns the marker slot at word i, or 0 if i is no slot. */
static inline int marker_slot(uint64_t i)
{
	uint64_t off = i * sizeof(uint64_t);

	if (off % MARK_STRIDE || off == 0 || off / MARK_STRIDE >= (uint64_t)nproc)
		return 0;
	return (int)(off / MARK_STRIDE);
}

static void sleep_until_stop(void)
{
	struct timespec ts = { 0, 50 * 1000 * 1000 };

	while (!stop)
		nanosleep(&ts, NULL); /* EINTR on SIGTERM: loop test sees stop */
}

/*
 * Checks the shared buffer. require_markers: every marker slot must hold
 * its marker (the root, after all children exited); otherwise a slot may
 * hold the pattern or its marker (a child, while its siblings write theirs).
 * Prints one FAIL line (prefixed by who) and returns the number of bad words.
 */
static uint64_t check_shared(const char *who, int require_markers)
{
	uint64_t i, bad = 0, first_bad = 0, want = 0;
	int k;

	for (i = 0; i < shared_words; i++) {
		uint64_t v = __atomic_load_n(&shared[i], __ATOMIC_RELAXED);
		uint64_t p = shared_pattern(i * sizeof(uint64_t));

		if (v == p && !(require_markers && marker_slot(i)))
			continue;
		k = marker_slot(i);
		if (k && v == marker(k))
			continue;
		if (!bad) {
			first_bad = i;
			want = require_markers && k ? marker(k) : p;
		}
		bad++;
	}
	if (bad) {
		k = marker_slot(first_bad);
		printf("FAIL: %s: %llu of %llu shared words wrong, first at offset %llu%s "
		       "(got %016llx, want %016llx)\n",
		       who, (unsigned long long)bad, (unsigned long long)shared_words,
		       (unsigned long long)(first_bad * sizeof(uint64_t)),
		       k ? (require_markers ? " (marker of child, not seen by the root: not shared?)" : " (marker slot)") : "",
		       (unsigned long long)shared[first_bad], (unsigned long long)want);
	}
	return bad;
}

static uint64_t check_private(const char *who, int k, const uint64_t *priv, uint64_t nwords)
{
	uint64_t i, bad = 0, first_bad = 0;

	for (i = 0; i < nwords; i++) {
		if (priv[i] != private_pattern(k, i * sizeof(uint64_t))) {
			if (!bad)
				first_bad = i;
			bad++;
		}
	}
	if (bad)
		printf("FAIL: %s: %llu of %llu private words wrong, first at offset %llu (got %016llx, want %016llx)\n",
		       who, (unsigned long long)bad, (unsigned long long)nwords,
		       (unsigned long long)(first_bad * sizeof(uint64_t)), (unsigned long long)priv[first_bad],
		       (unsigned long long)private_pattern(k, first_bad * sizeof(uint64_t)));
	return bad;
}

static uint64_t *map_private(int k, size_t size)
{
	uint64_t *p, i;

	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	for (i = 0; i < size / sizeof(uint64_t); i++)
		p[i] = private_pattern(k, i * sizeof(uint64_t));
	return p;
}

static void child_main(int k, struct control *ctl, size_t priv_size)
{
	uint64_t *priv, bad;
	char who[64];

	snprintf(who, sizeof(who), "child %d (pid %d)", k, (int)getpid());
	priv = map_private(k, priv_size);
	if (!priv) {
		printf("FAIL: %s: mmap: %s\n", who, strerror(errno));
		fflush(stdout);
		_exit(2);
	}
	__atomic_add_fetch(&ctl->ready, 1, __ATOMIC_RELEASE);

	sleep_until_stop();

	bad = check_shared(who, 0);
	bad += check_private(who, k, priv, priv_size / sizeof(uint64_t));
	/* After the restore: this write must reach the root's view. */
	__atomic_store_n(&shared[(uint64_t)k * MARK_STRIDE / sizeof(uint64_t)], marker(k), __ATOMIC_RELEASE);
	fflush(stdout);
	_exit(bad ? 1 : 0);
}

/* The pid file of the tree: "ROOT\nCHILD1 CHILD2 ...\n". */
static int write_tree_pidfile(const char *path)
{
	static char text[32 + MAX_PROC * 12];
	size_t len;
	int k;

	len = (size_t)snprintf(text, sizeof(text), "%d\n", (int)getpid());
	for (k = 1; k < nproc; k++)
		len += (size_t)snprintf(text + len, sizeof(text) - len, "%s%d",
					k > 1 ? " " : "", (int)children[k]);
	snprintf(text + len, sizeof(text) - len, "\n");
	return publish_file(path, text);
}

static int parse_mib(const char *s, const char *what, unsigned long *out)
{
	char *end;

	errno = 0;
	*out = strtoul(s, &end, 10);
	if (errno || *end || *out == 0) {
		fprintf(stderr, "tree_fill: bad %s '%s'\n", what, s);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct timespec ms = { 0, 1000 * 1000 };
	struct sigaction sa;
	struct control *ctl;
	unsigned long shared_mib, np, priv_mib = 1;
	size_t shared_size, priv_size;
	uint64_t *priv, i, bad;
	int k, status, fail = 0;

	if (argc != 4 && argc != 5) {
		fprintf(stderr, "usage: %s PIDFILE SHARED_MIB NPROC [PRIVATE_MIB]\n", argv[0]);
		return 2;
	}
	if (parse_mib(argv[2], "SHARED_MIB", &shared_mib) || parse_mib(argv[3], "NPROC", &np) ||
	    (argc == 5 && parse_mib(argv[4], "PRIVATE_MIB", &priv_mib)))
		return 2;
	shared_size = (size_t)shared_mib << 20;
	priv_size = (size_t)priv_mib << 20;
	if (np > MAX_PROC || np * MARK_STRIDE > shared_size) {
		fprintf(stderr, "tree_fill: NPROC must be at most %d and at most SHARED_MIB*256\n", MAX_PROC);
		return 2;
	}
	nproc = (int)np;
	shared_words = shared_size / sizeof(uint64_t);
	for (k = 1; k < nproc; k++) {
		if (marker(k) == shared_pattern((uint64_t)k * MARK_STRIDE)) {
			fprintf(stderr, "tree_fill: marker %d equals the pattern\n", k);
			return 2;
		}
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_term; /* no SA_RESTART; inherited by the children */
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGTERM, &sa, NULL)) {
		perror("tree_fill: sigaction");
		return 2;
	}

	shared = mmap(NULL, shared_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ctl = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED || ctl == MAP_FAILED) {
		perror("tree_fill: mmap shared");
		return 2;
	}
	for (i = 0; i < shared_words; i++)
		shared[i] = shared_pattern(i * sizeof(uint64_t));

	fflush(stdout);
	for (k = 1; k < nproc; k++) {
		pid_t pid = fork();

		if (pid < 0) {
			perror("tree_fill: fork");
			for (k--; k >= 1; k--)
				kill(children[k], SIGKILL);
			return 2;
		}
		if (pid == 0)
			child_main(k, ctl, priv_size); /* does not return */
		children[k] = pid;
	}

	priv = map_private(0, priv_size);
	if (!priv) {
		perror("tree_fill: mmap private");
		for (k = 1; k < nproc; k++)
			kill(children[k], SIGKILL);
		return 2;
	}
	while (__atomic_load_n(&ctl->ready, __ATOMIC_ACQUIRE) < nproc - 1) {
		if (waitpid(-1, &status, WNOHANG) > 0) {
			fprintf(stderr, "tree_fill: a child exited before it was ready\n");
			for (k = 1; k < nproc; k++)
				kill(children[k], SIGKILL);
			return 2;
		}
		nanosleep(&ms, NULL);
	}

	if (write_tree_pidfile(argv[1])) {
		perror("tree_fill: pidfile");
		for (k = 1; k < nproc; k++)
			kill(children[k], SIGKILL);
		return 2;
	}

	sleep_until_stop();

	for (k = 1; k < nproc; k++) {
		if (kill(children[k], SIGTERM)) {
			printf("FAIL: root: kill(child %d, pid %d): %s\n", k, (int)children[k], strerror(errno));
			fail = 1;
		}
	}
	for (k = 1; k < nproc; k++) {
		pid_t got;

		do
			got = waitpid(children[k], &status, 0);
		while (got < 0 && errno == EINTR);
		if (got != children[k]) {
			printf("FAIL: root: waitpid(child %d, pid %d): %s\n", k, (int)children[k],
			       got < 0 ? strerror(errno) : "wrong pid");
			fail = 1;
		} else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			printf("FAIL: root: child %d (pid %d) ended with %s %d\n", k, (int)children[k],
			       WIFEXITED(status) ? "exit status" : "signal",
			       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
			fail = 1;
		}
	}
	/* Every child exited 0, so each wrote its marker: all must be visible here. */
	if (!fail) {
		bad = check_shared("root", 1);
		bad += check_private("root", 0, priv, priv_size / sizeof(uint64_t));
		if (bad)
			fail = 1;
	}
	if (fail) {
		fflush(stdout);
		return 1;
	}
	printf("PASS\n");
	fflush(stdout);
	return 0;
}
