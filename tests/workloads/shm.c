/*
 * shm.c - shared memory between two processes: a MAP_SHARED|MAP_ANONYMOUS
 * region and a MAP_SHARED mapping of a /dev/shm file, both inherited by a
 * child; both must still be ONE object after restore (not two copies).
 *
 *   shm PIDFILE
 *
 * Set up before "ready" (root):
 *   anon   8 MiB MAP_SHARED|MAP_ANONYMOUS: pattern(SEED_ANON) over its
 *          offsets, except a 32 KiB tail that is never touched (must read as
 *          zero) and a last "control" page (futex word, E's ready flag).
 *   file   /dev/shm/stasis-shm-<root pid>, ftruncate 1 MiB, MAP_SHARED,
 *          pattern(SEED_FILE); the fd is closed after mmap.
 *   E      forked child (inherits both mappings).  Before "ready" it writes
 *          a 4 KiB setup marker into each mapping (at anon 1 MiB, file
 *          128 KiB) and sets a ready flag in the control page, which the
 *          root polls.  Then E blocks in FUTEX_WAIT (shared futex, 1 s
 *          timeouts) on a word of the anon mapping (and exits if orphaned).
 *   The root waits in a nanosleep(100 ms) loop.
 *
 * After SIGTERM:
 *   1. root: both mappings hold exactly pattern + E's setup markers (+ zero
 *      tail); /proc/self/maps and /proc/E/maps show each mapping at the same
 *      address, "rw-s", with the SAME dev:inode in both processes (one
 *      object); the file mapping's inode is the one at the /dev/shm path.
 *   2. root writes a 64-byte marker into each mapping, sets the futex word
 *      and FUTEX_WAKEs it (a shared futex: only reaches E if the page is
 *      really shared).  If E has not exited after 5 s the root sends SIGUSR1
 *      (E reports that the futex wake never came).
 *   3. E: sees the root's markers and everything else intact, writes its own
 *      64-byte markers into both mappings and exits with a bit mask (mismatch
 *      lines on stderr, nothing on stdout).
 *   4. root: after E's exit, sees E's markers in both mappings and the rest
 *      intact; pread() of the /dev/shm file equals the mapping.  Then it
 *      unlinks the /dev/shm file.
 */
#include "zdtm.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define ANON_SIZE   (8u << 20)
#define FILE_SIZE   (1u << 20)
#define CTL_OFF     (ANON_SIZE - 4096)
#define ZERO_OFF    (CTL_OFF - 32 * 1024)
#define ESET_LEN    4096
#define MARK_LEN    64
#define DEADLINE_S  20
#define WAKE_GRACE_MS (ZDTM_SELFTEST ? 1500 : 5000)

#define SEED_ANON  0x73686d616e6f6e00ull
#define SEED_FILE  0x73686d66696c6500ull
#define SEED_ESET  0x73686d6573657400ull
#define SEED_RMARK 0x73686d726d726b00ull
#define SEED_EMARK 0x73686d656d726b00ull

/* E's exit status bits */
#define R_ANON     0x01
#define R_FILE     0x02
#define R_WAKE     0x04
#define R_INTERNAL 0x40
#define R_NBITS    7

static const char *const e_tags[R_NBITS] = {
	"E-anon", "E-file", "E-wake", "E-unused3", "E-unused4", "E-unused5",
	"E-internal"
};

/* where the markers go, per mapping */
struct layout {
	const char *name;
	size_t size;     /* checked bytes: [0, size) */
	uint64_t seed;   /* base pattern */
	size_t zero_off; /* [zero_off, size) must be zero; == size: none */
	size_t eset_off, rmark_off, emark_off;
};

static const struct layout L_ANON = {
	"anon", CTL_OFF, SEED_ANON, ZERO_OFF, 1u << 20, 3u << 20, 5u << 20
};
static const struct layout L_FILE = {
	"file", FILE_SIZE, SEED_FILE, FILE_SIZE, 128u << 10, 512u << 10,
	768u << 10
};

struct ctl {
	int go;      /* futex word: root sets 1 after SIGTERM */
	int e_ready; /* E's setup is done */
};

static uint8_t *anon, *fmap;
static struct ctl *ctl;
static char shm_path[64];
static volatile sig_atomic_t usr1_seen;

static void h_usr1(int sig)
{
	(void)sig;
	usr1_seen = 1;
}

/* phase 0: base + E setup marker; 1: + root marker; 2: + E marker */
static uint64_t expected_word(const struct layout *l, size_t off, int phase)
{
	if (off >= l->zero_off)
		return 0;
	if (off >= l->eset_off && off < l->eset_off + ESET_LEN)
		return zdtm_pat_word(SEED_ESET, off >> 3);
	if (phase >= 1 && off >= l->rmark_off && off < l->rmark_off + MARK_LEN)
		return zdtm_pat_word(SEED_RMARK, off >> 3);
	if (phase >= 2 && off >= l->emark_off && off < l->emark_off + MARK_LEN)
		return zdtm_pat_word(SEED_EMARK, off >> 3);
	return zdtm_pat_word(l->seed, off >> 3);
}

static void write_marker(uint8_t *p, size_t off, size_t len, uint64_t seed)
{
	size_t o;

	for (o = off; o < off + len; o += 8) {
		uint64_t w = zdtm_pat_word(seed, o >> 3);

		memcpy(p + o, &w, 8);
	}
}

/* Compares p[0..l->size) with the expected content of phase; returns the
 * number of differing 8-byte words and the first one. */
static size_t diff_layout(const struct layout *l, const uint8_t *p, int phase,
			  size_t *first, uint64_t *got, uint64_t *exp)
{
	size_t off, bad = 0;

	for (off = 0; off < l->size; off += 8) {
		uint64_t e = expected_word(l, off, phase), a;

		memcpy(&a, p + off, 8);
		if (a != e) {
			if (!bad) {
				*first = off;
				*got = a;
				*exp = e;
			}
			bad++;
		}
	}
	return bad;
}

static void root_verify(const char *tag, const struct layout *l,
			const uint8_t *p, int phase, const char *when)
{
	size_t first = 0, bad;
	uint64_t got = 0, exp = 0;

	bad = diff_layout(l, p, phase, &first, &got, &exp);
	if (bad)
		zdtm_fail(tag, "%s mapping %s: %zu of %zu words differ, first "
			  "at offset %#zx (%s): got %016llx expected %016llx",
			  l->name, when, bad, l->size / 8, first,
			  first >= l->zero_off ? "zero tail" :
			  first >= l->eset_off && first < l->eset_off + ESET_LEN
			  ? "E's setup marker" :
			  first >= l->rmark_off && first < l->rmark_off + MARK_LEN
			  ? "root's marker" :
			  first >= l->emark_off && first < l->emark_off + MARK_LEN
			  ? "E's marker" : "pattern",
			  (unsigned long long)got, (unsigned long long)exp);
}

static long futex(int *uaddr, int op, int val, const struct timespec *ts)
{
	return syscall(SYS_futex, uaddr, op, val, ts, NULL, 0);
}

/* ------------------------------------------------------------------ */
/* child E                                                             */

#define efail(tag, ...) zdtm_child_fail("shm child E", tag, __VA_ARGS__)

static int e_verify(const char *tag, const struct layout *l, const uint8_t *p,
		    int bit)
{
	size_t first = 0, bad;
	uint64_t got = 0, exp = 0;

	bad = diff_layout(l, p, 1, &first, &got, &exp);
	if (!bad)
		return 0;
	efail(tag, "%s mapping after the root's marker: %zu of %zu words "
	      "differ, first at offset %#zx: got %016llx expected %016llx",
	      l->name, bad, l->size / 8, first, (unsigned long long)got,
	      (unsigned long long)exp);
	return bit;
}

__attribute__((noreturn))
static void run_e(pid_t parent)
{
	struct sigaction sa;
	int bits = 0;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = h_usr1;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGUSR1, &sa, NULL))
		_exit(R_INTERNAL);

	write_marker(anon, L_ANON.eset_off, ESET_LEN, SEED_ESET);
	write_marker(fmap, L_FILE.eset_off, ESET_LEN, SEED_ESET);
	__atomic_store_n(&ctl->e_ready, 1, __ATOMIC_RELEASE);

	while (!__atomic_load_n(&ctl->go, __ATOMIC_ACQUIRE) && !usr1_seen) {
		struct timespec ts = { 1, 0 };

		if (futex(&ctl->go, FUTEX_WAIT, 0, &ts) < 0 &&
		    errno != EAGAIN && errno != EINTR && errno != ETIMEDOUT) {
			efail("E-internal", "futex wait: errno %d", errno);
			bits |= R_INTERNAL;
			break;
		}
		if (getppid() != parent) {
			efail("E-internal", "orphaned: parent %d, expected %d",
			      (int)getppid(), (int)parent);
			_exit(bits | R_INTERNAL);
		}
	}
	if (!__atomic_load_n(&ctl->go, __ATOMIC_ACQUIRE)) {
		efail("E-wake", "woken by SIGUSR1: the root's futex word "
		      "never became 1 (anon mapping not shared?)");
		bits |= R_WAKE;
	}

	ZDTM_CORRUPT("E-anon", anon[(2u << 20) + 5] ^= 0x08);
	ZDTM_CORRUPT("E-file", fmap[(256u << 10) + 9] ^= 0x04);

	bits |= e_verify("E-anon", &L_ANON, anon, R_ANON);
	bits |= e_verify("E-file", &L_FILE, fmap, R_FILE);

	write_marker(anon, L_ANON.emark_off, MARK_LEN, SEED_EMARK);
	write_marker(fmap, L_FILE.emark_off, MARK_LEN, SEED_EMARK);
	_exit(bits);
}

/* ------------------------------------------------------------------ */
/* root                                                                */

struct mapinfo {
	int found;
	unsigned long start, end, ino;
	char perms[8], dev[16], path[256];
};

/* The /proc/PID/maps line that starts at addr. */
static int find_map(pid_t pid, const void *addr, struct mapinfo *mi)
{
	static char buf[256 * 1024];
	char path[64], *line, *save = NULL;
	size_t len = 0;
	ssize_t n;
	int fd;

	memset(mi, 0, sizeof(*mi));
	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	while (len + 1 < sizeof(buf)) {
		n = read(fd, buf + len, sizeof(buf) - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += n;
	}
	close(fd);
	buf[len] = 0;
	for (line = strtok_r(buf, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		unsigned long s, e, off, ino;
		char perms[8], dev[16];
		int pos = 0;

		if (sscanf(line, "%lx-%lx %7s %lx %15s %lu %n", &s, &e, perms,
			   &off, dev, &ino, &pos) < 6)
			continue;
		if (s != (unsigned long)addr)
			continue;
		mi->found = 1;
		mi->start = s;
		mi->end = e;
		mi->ino = ino;
		strcpy(mi->perms, perms);
		strcpy(mi->dev, dev);
		snprintf(mi->path, sizeof(mi->path), "%s", pos ? line + pos : "");
		return 0;
	}
	return 0;
}

static void check_maps(const char *name, const void *addr, size_t size,
		       pid_t e, int is_file)
{
	struct mapinfo r, c;
	struct stat st;

	find_map(getpid(), addr, &r);
	find_map(e, addr, &c);
	if (!zdtm_check(r.found && c.found, "maps", "%s mapping at %p missing "
			"from /proc/self/maps (%d) or /proc/E/maps (%d)", name,
			addr, r.found, c.found))
		return;
	zdtm_check(r.end - r.start == size && c.end == r.end, "maps",
		   "%s mapping: root %lx-%lx, E %lx-%lx, expected size %#zx",
		   name, r.start, r.end, c.start, c.end, size);
	zdtm_check(strcmp(r.perms, "rw-s") == 0 && strcmp(c.perms, "rw-s") == 0,
		   "maps", "%s mapping perms root '%s' E '%s', expected 'rw-s'",
		   name, r.perms, c.perms);
	zdtm_check(r.ino == c.ino && strcmp(r.dev, c.dev) == 0, "maps",
		   "%s mapping: root maps %s:%lu, E maps %s:%lu: not the same "
		   "object", name, r.dev, r.ino, c.dev, c.ino);
	if (is_file) {
		zdtm_check(strcmp(r.path, shm_path) == 0 &&
			   strcmp(c.path, shm_path) == 0, "maps",
			   "file mapping paths root '%s' E '%s', expected '%s'",
			   r.path, c.path, shm_path);
		zdtm_check(stat(shm_path, &st) == 0 && st.st_ino == r.ino,
			   "file-path", "%s has inode %lu, the mapping %lu",
			   shm_path, (unsigned long)st.st_ino, r.ino);
	}
}

static void check_file_content(void)
{
	static uint8_t buf[FILE_SIZE + 1];
	size_t len = 0;
	ssize_t n;
	int fd = open(shm_path, O_RDONLY | O_CLOEXEC);

	if (!zdtm_check(fd >= 0, "file-path", "open %s: %s", shm_path,
			strerror(errno)))
		return;
	while (len < sizeof(buf)) {
		n = pread(fd, buf + len, sizeof(buf) - len, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += n;
	}
	close(fd);
	if (zdtm_check(len == FILE_SIZE, "file-path", "%s: %zu bytes, expected "
		       "%u", shm_path, len, FILE_SIZE))
		zdtm_verify_mem("file-path", "pread of the /dev/shm file vs. "
				"the mapping", buf, fmap, FILE_SIZE);
}

/* Replaces [p, p+size) by a private anonymous copy (selftest). */
static void make_private(uint8_t *p, size_t size)
{
	uint8_t *copy = malloc(size);

	if (!copy)
		return;
	memcpy(copy, p, size);
	if (mmap(p, size, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == p)
		memcpy(p, copy, size);
	free(copy);
}

__attribute__((noreturn, format(printf, 2, 3)))
static void setup_fail(pid_t e, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	int err = errno;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (e > 0)
		kill(e, SIGKILL);
	if (shm_path[0])
		unlink(shm_path);
	errno = err;
	zdtm_die("%s", msg);
}

int main(int argc, char **argv)
{
	pid_t e, root = getpid();
	int fd, st, b, code, woke;
	int64_t end;

	zdtm_init(argc, argv, 0, NULL);

	anon = mmap(NULL, ANON_SIZE, PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (anon == MAP_FAILED)
		setup_fail(0, "mmap anon shared");
	zdtm_fill(anon, ZERO_OFF, SEED_ANON);
	ctl = (struct ctl *)(anon + CTL_OFF);

	snprintf(shm_path, sizeof(shm_path), "/dev/shm/stasis-shm-%d",
		 (int)getpid());
	fd = open(shm_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		setup_fail(0, "open %s", shm_path);
	if (ftruncate(fd, FILE_SIZE))
		setup_fail(0, "ftruncate %s", shm_path);
	fmap = mmap(NULL, FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (fmap == MAP_FAILED)
		setup_fail(0, "mmap %s", shm_path);
	close(fd);
	zdtm_fill(fmap, FILE_SIZE, SEED_FILE);

	fflush(stdout);
	e = fork();
	if (e < 0)
		setup_fail(0, "fork");
	if (e == 0)
		run_e(root);

	end = zdtm_now_ns() + 10 * 1000000000ll;
	while (!__atomic_load_n(&ctl->e_ready, __ATOMIC_ACQUIRE)) {
		if (zdtm_now_ns() > end || waitpid(e, &st, WNOHANG) == e) {
			errno = 0;
			setup_fail(e, "child E not ready");
		}
		zdtm_msleep(1);
	}

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	/* ---------------- verification ---------------- */
	ZDTM_CORRUPT("anon-data", anon[(6u << 20) + 11] ^= 0x20);
	ZDTM_CORRUPT("anon-zero", anon[ZERO_OFF + 100] = 1);
	ZDTM_CORRUPT("file-data", fmap[(1u << 20) - 1] ^= 0x01);
	ZDTM_CORRUPT("file-path", {
		/* a fresh file with the same content at the path */
		int nfd;

		unlink(shm_path);
		nfd = open(shm_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC,
			   0600);
		if (nfd >= 0) {
			if (write(nfd, fmap, FILE_SIZE) != FILE_SIZE) {
				/* best effort */
			}
			close(nfd);
		}
	});
	/* broken sharing: the root's views become private copies */
	ZDTM_CORRUPT("anon-share", make_private(anon, ANON_SIZE),
		     ctl = (struct ctl *)(anon + CTL_OFF));
	ZDTM_CORRUPT("file-share", make_private(fmap, FILE_SIZE));
	ZDTM_CORRUPT("maps", (void)0);   /* by anon-share / file-share */
	ZDTM_CORRUPT("E-wake", (void)0); /* by anon-share */
	ZDTM_CORRUPT("E-anon", (void)0); /* inside E */
	ZDTM_CORRUPT("E-file", (void)0); /* inside E */

	/* 1. as restored */
	root_verify("anon-data", &L_ANON, anon, 0, "after restore");
	root_verify("file-data", &L_FILE, fmap, 0, "after restore");
	{
		size_t k;

		for (k = ZERO_OFF; k < CTL_OFF; k++)
			if (anon[k])
				break;
		zdtm_check(k == CTL_OFF, "anon-zero", "untouched tail of the "
			   "anon mapping has 0x%02x at offset %#zx",
			   k < CTL_OFF ? anon[k] : 0, k);
	}
	check_maps("anon", anon, ANON_SIZE, e, 0);
	check_maps("file", fmap, FILE_SIZE, e, 1);

	/* 2. root's markers, wake E through the shared futex */
	write_marker(anon, L_ANON.rmark_off, MARK_LEN, SEED_RMARK);
	write_marker(fmap, L_FILE.rmark_off, MARK_LEN, SEED_RMARK);
	__atomic_store_n(&ctl->go, 1, __ATOMIC_RELEASE);
	woke = (int)futex(&ctl->go, FUTEX_WAKE, 1, NULL);

	/* 3. E checks and writes its markers */
	if (zdtm_wait_deadline(e, &st, WAKE_GRACE_MS)) {
		zdtm_fail("anon-share", "E did not exit within %d ms of the "
			  "futex wake (FUTEX_WAKE woke %d): sending SIGUSR1",
			  WAKE_GRACE_MS, woke);
		kill(e, SIGUSR1);
		if (zdtm_wait_deadline(e, &st, DEADLINE_S * 1000)) {
			zdtm_fail("E-internal", "waitpid(E = %d): %s", (int)e,
				  strerror(errno));
			kill(e, SIGKILL);
			st = -1;
		}
	}
	if (st == -1) {
		/* reported */
	} else if (!WIFEXITED(st)) {
		zdtm_fail("E-internal", "E (pid %d) killed by signal %d", (int)e,
			  WIFSIGNALED(st) ? WTERMSIG(st) : -1);
	} else {
		code = WEXITSTATUS(st);
		for (b = 0; b < R_NBITS; b++)
			if (code & (1 << b))
				zdtm_fail(e_tags[b], "child E (pid %d) exited "
					  "with status %#x (details on stderr)",
					  (int)e, code);
		if (code & ~((1 << R_NBITS) - 1))
			zdtm_fail("E-internal", "E (pid %d) exited with status "
				  "%d", (int)e, code);
	}

	/* 4. E's markers must be visible here */
	{
		size_t first = 0;
		uint64_t got, exp;
		const struct layout *ls[2] = { &L_ANON, &L_FILE };
		const uint8_t *ps[2] = { anon, fmap };
		const char *tags[2] = { "anon-share", "file-share" };
		int i;

		for (i = 0; i < 2; i++) {
			const struct layout *l = ls[i];
			size_t k, bad = 0;

			for (k = l->emark_off; k < l->emark_off + MARK_LEN; k += 8) {
				memcpy(&got, ps[i] + k, 8);
				exp = zdtm_pat_word(SEED_EMARK, k >> 3);
				if (got != exp && !bad++)
					first = k;
			}
			zdtm_check(!bad, tags[i], "%s mapping: E's marker at "
				   "%#zx not visible to the root (%zu of %d words "
				   "differ, first at %#zx): not shared", l->name,
				   l->emark_off, bad, MARK_LEN / 8, first);
		}
	}
	root_verify("anon-data", &L_ANON, anon, 2, "after E's write");
	root_verify("file-data", &L_FILE, fmap, 2, "after E's write");
	check_file_content();

	unlink(shm_path);
	zdtm_finish();
}
