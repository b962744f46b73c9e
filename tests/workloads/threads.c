/*
 * threads.c - a multi-threaded process whose per-thread state must survive
 * checkpoint/restore (every thread restored at its own TID).
 *
 *   threads PIDFILE
 *
 * Set up before "ready": 5 pthreads besides main ("workers" 0..4).  Each one
 *   - records gettid() and pthread_self();
 *   - fills a 4 KiB __thread array with pattern(index) and keeps a __thread
 *     counter (mirrored in a global slot) that it increments as it works;
 *   - fills an 8 KiB array on its own stack with pattern(index);
 *   - is named "wk-I" (pthread_setname_np);
 *   - blocks its own signal set: SIGTERM (so SIGTERM always reaches main),
 *     SIGRTMIN+I, SIGRTMIN+10+I, SIGRTMAX-I, SIGUSR2 for odd I, SIGUSR1 for
 *     worker 0, SIGPIPE for worker 4;
 *   - records its robust-futex list head (get_robust_list) and FS base.
 * Worker 1 sends itself a probe SIGRTMIN+1 (pthread_kill) and records the
 * siginfo sigtimedwait reports (si_code SI_TKILL on Linux).  Worker 2 has a
 * 64 KiB sigaltstack filled with a pattern.  Main then sends SIGRTMIN+1 to
 * worker 1 and SIGUSR2 to worker 3 (thread-directed, blocked there, so they
 * stay pending in those threads only).  Main blocks {SIGUSR1, SIGRTMIN+8},
 * holds a robust mutex and fills its own __thread array.
 *
 * While waiting (so a checkpoint lands in different places):
 *   worker 0  pthread_cond_wait on a condvar (futex wait)
 *   worker 1  nanosleep(20 ms) loop
 *   worker 2  poll(NULL, 0, 30) loop
 *   worker 3  pure compute: 8 xorshift64 lanes plus an iteration count held
 *             in registers, stored to a global slot every 64 chunks of 4096
 *             iterations, no syscalls
 *   worker 4  pthread_mutex_lock on the robust mutex main holds
 *   main      nanosleep(50 ms) loop until SIGTERM
 *
 * After SIGTERM: main checks /proc/self/task is exactly {main, workers},
 * sets the finish flag, broadcasts the condvar, unlocks the robust mutex
 * (must succeed: main must still own it) and checks its own state.  Every
 * worker checks its TID, pthread_self, TLS (address, FS base, pattern,
 * counter), stack array (address, pattern), name (prctl and
 * /proc/self/task/TID/comm), blocked mask (pthread_sigmask and SigBlk),
 * pending set (sigpending exact, SigPnd exact, ShdPnd empty), sigaltstack,
 * robust list head and its own activity (worker 3: the stored lanes must
 * equal the seeds jumped ahead by the stored iteration count, computed with
 * GF(2) matrix powers; worker 4: the lock returned 0, not EOWNERDEAD).
 * Everyone meets at a barrier; then worker 1 and 3 take their pending
 * signal with sigtimedwait (same siginfo as the probe: signo, si_code,
 * si_pid, si_uid; exactly one instance) and worker 2 raises SIGUSR1
 * (SA_ONSTACK handler) which must run on its altstack.  Main joins every
 * worker (20 s deadline), checks they all reported, that workers 1-3 made
 * progress while main slept >= 10 times, and that /proc/self/task shrinks
 * to main alone.
 *
 * Reporting goes through a mutex (zdtm.h is not thread-safe).
 */
#include "zdtm.h"

#include <poll.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#ifdef __x86_64__
#include <asm/prctl.h>
#endif

#define NTHREADS      5
#define TLS_SIZE      4096
#define STACK_ARR     8192
#define ALTSTACK_SIZE (64 * 1024)
#define LANES         8
#define CHUNK         4096
#define STORE_EVERY   64 /* chunks between stores to the slot */
#define MAIN_MASK_RT  8  /* main blocks SIGRTMIN+8 */
#define DEADLINE_S    20

#define SEED_TLS(i)   (0x544c530000000000ull + (uint64_t)(i))
#define SEED_STACK(i) (0x535441434b000000ull + (uint64_t)(i))
#define SEED_ALT      0x414c545354414b00ull
#define SEED_LANE(k)  (zdtm_mix64(0x6c616e6500000000ull + (k)) | 1)

/* ------------------------------------------------------------------ */
/* shared state                                                        */

struct worker {
	pthread_t self;
	pid_t tid;
	void *tls_addr;
	void *stack_addr;
	unsigned long fsbase;
	void *robust_head;
	size_t robust_len;
	uint64_t count;       /* mirror of tls_count (atomic) */
	uint64_t ready_count; /* count when main wrote the pidfile */
	int waiting;          /* worker 0/4: about to block (atomic) */
	int lock_rc;          /* worker 4: pthread_mutex_lock result */
	int reported;         /* finished its checks (atomic) */
};

static struct worker wk[NTHREADS];
static pthread_t thr[NTHREADS];

static __thread uint8_t tls_buf[TLS_SIZE] __attribute__((aligned(64)));
static __thread volatile uint64_t tls_count;

static int finish_flag; /* atomic */

static pthread_mutex_t report_mx = PTHREAD_MUTEX_INITIALIZER;

static pthread_mutex_t setup_mx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t setup_cv = PTHREAD_COND_INITIALIZER;
static int setup_ready;
static const char *setup_err;
static int setup_errno;

static pthread_mutex_t cv_mx = PTHREAD_MUTEX_INITIALIZER; /* worker 0 */
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static pthread_mutex_t m4; /* robust, held by main, wanted by worker 4 */

static pthread_mutex_t bar_mx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t bar_cv = PTHREAD_COND_INITIALIZER;
static int bar_count;

/* worker 1 probe siginfo */
static int probe_code, probe_pid;
static unsigned probe_uid;

/* worker 2 */
static uint8_t altstack_mem[ALTSTACK_SIZE] __attribute__((aligned(64)));
static volatile sig_atomic_t usr1_count;
static volatile pid_t usr1_tid;
static volatile uintptr_t usr1_addr;
static volatile int usr1_onstack;

/* worker 3: compute slot */
static struct {
	uint64_t lane[LANES];
	uint64_t n;      /* iterations done when lane[] was stored */
	uint64_t stores;
} slot;

/* main */
static void *main_robust_head;
static size_t main_robust_len;
static unsigned long main_fsbase;
static char main_comm[16];

/* ------------------------------------------------------------------ */
/* thread-safe reporting                                               */

#define TFAIL(tag, ...)                                                        \
	do {                                                                   \
		pthread_mutex_lock(&report_mx);                                \
		zdtm_fail(tag, __VA_ARGS__);                                   \
		pthread_mutex_unlock(&report_mx);                              \
	} while (0)

#define TCHECK(cond, tag, ...)                                                 \
	do {                                                                   \
		if (!(cond))                                                   \
			TFAIL(tag, __VA_ARGS__);                               \
	} while (0)

#define TCORRUPT(tag, ...)                                                     \
	do {                                                                   \
		if (ZDTM_SELFTEST) {                                           \
			pthread_mutex_lock(&report_mx);                        \
			ZDTM_CORRUPT(tag, __VA_ARGS__);                        \
			pthread_mutex_unlock(&report_mx);                      \
		}                                                              \
	} while (0)

static void tverify_pattern(const char *tag, const char *what, const void *p,
			    size_t len, uint64_t seed)
{
	pthread_mutex_lock(&report_mx);
	zdtm_verify_pattern(tag, what, p, len, seed);
	pthread_mutex_unlock(&report_mx);
}

static int finishing(void)
{
	return __atomic_load_n(&finish_flag, __ATOMIC_ACQUIRE);
}

static void tick(int i)
{
	tls_count++;
	__atomic_store_n(&wk[i].count, __atomic_load_n(&wk[i].count,
							__ATOMIC_RELAXED) + 1,
			 __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------------ */
/* /proc helpers (no stdio, no malloc)                                 */

/* Hex field of /proc/self/task/TID/status ("SigPnd" etc.); 0 on success. */
static int status_hex(pid_t tid, const char *field, uint64_t *out)
{
	char path[64], buf[8192], key[32], *p;

	snprintf(path, sizeof(path), "/proc/self/task/%d/status", (int)tid);
	if (zdtm_read_text(path, buf, sizeof(buf)) <= 0)
		return -1;
	snprintf(key, sizeof(key), "\n%s:", field);
	p = strstr(buf, key);
	if (!p)
		return -1;
	*out = strtoull(p + strlen(key), NULL, 16);
	return 0;
}

/* State letter of /proc/self/task/TID/stat, or 0. */
static char task_state(pid_t tid)
{
	char path[64], buf[1024], *p;

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	if (zdtm_read_text(path, buf, sizeof(buf)) <= 0)
		return 0;
	p = strrchr(buf, ')');
	return (p && p[1] == ' ') ? p[2] : 0;
}

struct ldirent64 {
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

/* TIDs in /proc/self/task; returns the count (stores at most max). */
static int list_tasks(pid_t *out, int max)
{
	char buf[4096] __attribute__((aligned(8)));
	int fd, n = 0;
	long r, off;

	fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	while ((r = syscall(SYS_getdents64, fd, buf, sizeof(buf))) > 0) {
		for (off = 0; off < r;) {
			struct ldirent64 *d = (struct ldirent64 *)(buf + off);

			if (d->d_name[0] != '.') {
				if (n < max)
					out[n] = (pid_t)atoi(d->d_name);
				n++;
			}
			off += d->d_reclen;
		}
	}
	close(fd);
	return n;
}

static unsigned long get_fsbase(void)
{
	unsigned long fs = 0;

#ifdef __x86_64__
	syscall(SYS_arch_prctl, ARCH_GET_FS, &fs);
#endif
	return fs;
}

static void get_robust(void **head, size_t *len)
{
	*head = NULL;
	*len = 0;
	syscall(SYS_get_robust_list, 0, head, len);
}

/* ------------------------------------------------------------------ */
/* signal sets                                                         */

static void worker_mask(int i, sigset_t *s)
{
	sigemptyset(s);
	sigaddset(s, SIGTERM);
	sigaddset(s, SIGRTMIN + i);
	sigaddset(s, SIGRTMIN + 10 + i);
	sigaddset(s, SIGRTMAX - i);
	if (i & 1)
		sigaddset(s, SIGUSR2);
	if (i == 0)
		sigaddset(s, SIGUSR1);
	if (i == 4)
		sigaddset(s, SIGPIPE);
}

static void main_mask(sigset_t *s)
{
	sigemptyset(s);
	sigaddset(s, SIGUSR1);
	sigaddset(s, SIGRTMIN + MAIN_MASK_RT);
}

/* Signal expected pending in worker i (0 = none). */
static int worker_pending_sig(int i)
{
	if (i == 1)
		return SIGRTMIN + 1;
	if (i == 3)
		return SIGUSR2;
	return 0;
}

static uint64_t set_bits(const sigset_t *s)
{
	uint64_t b = 0;
	int sig;

	for (sig = 1; sig <= 64 && sig < _NSIG; sig++)
		if (sigismember(s, sig) == 1)
			b |= 1ull << (sig - 1);
	return b;
}

/* Compare two sets signal by signal. */
static void check_set(const char *tag, const char *who, const char *what,
		      const sigset_t *got, const sigset_t *exp)
{
	int s;

	for (s = 1; s < _NSIG; s++) {
		int g = sigismember(got, s) == 1, e = sigismember(exp, s) == 1;

		TCHECK(g == e, tag, "%s: %s: signal %d %s", who, what, s,
		       g ? "present but not expected" :
		       "expected but missing");
	}
}

/* Kernel view: SigBlk, SigPnd (thread), ShdPnd (process). */
static void check_status_sets(const char *who, pid_t tid, uint64_t blk,
			      uint64_t pnd, const char *mask_tag,
			      const char *pnd_tag)
{
	uint64_t v;

	if (status_hex(tid, "SigBlk", &v))
		TFAIL(mask_tag, "%s: cannot read SigBlk of task %d", who,
		      (int)tid);
	else
		TCHECK(v == blk, mask_tag,
		       "%s: SigBlk %016llx, expected %016llx", who,
		       (unsigned long long)v, (unsigned long long)blk);
	if (status_hex(tid, "SigPnd", &v))
		TFAIL(pnd_tag, "%s: cannot read SigPnd of task %d", who,
		      (int)tid);
	else
		TCHECK(v == pnd, pnd_tag,
		       "%s: SigPnd %016llx, expected %016llx", who,
		       (unsigned long long)v, (unsigned long long)pnd);
	if (status_hex(tid, "ShdPnd", &v))
		TFAIL("pending-leak", "%s: cannot read ShdPnd", who);
	else
		TCHECK(v == 0, "pending-leak",
		       "%s: ShdPnd (process-wide pending) %016llx, expected 0",
		       who, (unsigned long long)v);
}

/* ------------------------------------------------------------------ */
/* worker 3: xorshift lanes and their jump-ahead                       */

static const unsigned char lane_sh[LANES][3] = {
	{ 13, 7, 17 }, { 1, 1, 54 }, { 1, 3, 45 }, { 1, 7, 9 },
	{ 1, 7, 44 },  { 1, 9, 50 }, { 1, 11, 35 }, { 3, 5, 29 },
};

#define XS(x, k)                                                               \
	do {                                                                   \
		x ^= x << lane_sh[k][0];                                       \
		x ^= x >> lane_sh[k][1];                                       \
		x ^= x << lane_sh[k][2];                                       \
	} while (0)

static uint64_t lane_step(int k, uint64_t x)
{
	XS(x, k);
	return x;
}

/* x -> M x over GF(2); M given by its columns c[j] = M e_j. */
struct gf2m {
	uint64_t c[64];
};

static uint64_t gf2_apply(const struct gf2m *m, uint64_t x)
{
	uint64_t r = 0;
	int j;

	for (j = 0; j < 64; j++)
		if ((x >> j) & 1)
			r ^= m->c[j];
	return r;
}

/* Lane k's state after n steps from x (T^n x by repeated squaring). */
static uint64_t lane_jump(int k, uint64_t x, uint64_t n)
{
	struct gf2m base, sq;
	int j;

	for (j = 0; j < 64; j++)
		base.c[j] = lane_step(k, 1ull << j);
	while (n) {
		if (n & 1)
			x = gf2_apply(&base, x);
		n >>= 1;
		if (n) {
			for (j = 0; j < 64; j++)
				sq.c[j] = gf2_apply(&base, base.c[j]);
			base = sq;
		}
	}
	return x;
}

/*
 * Run chunks of CHUNK iterations on st[] (n counts iterations).  With
 * live != 0: until finishing(), storing to the slot every STORE_EVERY
 * chunks; else exactly max_chunks chunks.  The lanes and the count live in
 * locals (registers) for the whole run.
 */
static void compute_run(uint64_t st[LANES], uint64_t *np, int live,
			uint64_t max_chunks)
{
	uint64_t l0 = st[0], l1 = st[1], l2 = st[2], l3 = st[3];
	uint64_t l4 = st[4], l5 = st[5], l6 = st[6], l7 = st[7];
	uint64_t n = *np, chunks = 0;
	unsigned k;

	for (;;) {
		if (live ? finishing() : chunks == max_chunks)
			break;
		for (k = 0; k < CHUNK; k++) {
			XS(l0, 0);
			XS(l1, 1);
			XS(l2, 2);
			XS(l3, 3);
			XS(l4, 4);
			XS(l5, 5);
			XS(l6, 6);
			XS(l7, 7);
			n++;
		}
		chunks++;
		if (live && chunks % STORE_EVERY == 0) {
			slot.lane[0] = l0;
			slot.lane[1] = l1;
			slot.lane[2] = l2;
			slot.lane[3] = l3;
			slot.lane[4] = l4;
			slot.lane[5] = l5;
			slot.lane[6] = l6;
			slot.lane[7] = l7;
			slot.n = n;
			slot.stores++;
			tick(3);
		}
	}
	st[0] = l0;
	st[1] = l1;
	st[2] = l2;
	st[3] = l3;
	st[4] = l4;
	st[5] = l5;
	st[6] = l6;
	st[7] = l7;
	*np = n;
}

/* ------------------------------------------------------------------ */
/* signals                                                             */

static void h_usr1(int sig, siginfo_t *si, void *uc)
{
	volatile char local = 0;
	stack_t ss;

	(void)sig;
	(void)si;
	(void)uc;
	usr1_addr = (uintptr_t)&local;
	usr1_onstack = sigaltstack(NULL, &ss) == 0 &&
		       (ss.ss_flags & SS_ONSTACK);
	usr1_tid = gettid();
	usr1_count++;
}

static int take_sig(int sig, siginfo_t *si)
{
	struct timespec zero = { 0, 0 };
	sigset_t set;
	int r;

	sigemptyset(&set);
	sigaddset(&set, sig);
	do
		r = sigtimedwait(&set, si, &zero);
	while (r < 0 && errno == EINTR);
	return r;
}

/* ------------------------------------------------------------------ */
/* barrier with a deadline (used once)                                 */

static void barrier_wait(const char *who)
{
	struct timespec dl;
	int ok;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += DEADLINE_S;
	pthread_mutex_lock(&bar_mx);
	if (++bar_count == NTHREADS + 1)
		pthread_cond_broadcast(&bar_cv);
	while (bar_count < NTHREADS + 1)
		if (pthread_cond_timedwait(&bar_cv, &bar_mx, &dl) == ETIMEDOUT)
			break;
	ok = bar_count >= NTHREADS + 1;
	pthread_mutex_unlock(&bar_mx);
	TCHECK(ok, "barrier", "%s: timed out at the check barrier", who);
}

/* ------------------------------------------------------------------ */
/* worker                                                              */

static void setup_fail(const char *what)
{
	pthread_mutex_lock(&setup_mx);
	if (!setup_err) {
		setup_err = what;
		setup_errno = errno;
	}
	pthread_cond_broadcast(&setup_cv);
	pthread_mutex_unlock(&setup_mx);
}

static void check_worker(int i, uint8_t *arr)
{
	struct worker *w = &wk[i];
	char who[16], name[32], path[64], buf[64];
	int psig = worker_pending_sig(i);
	const char *ptag = psig ? "pending" : "pending-leak";
	pid_t exp_tid = w->tid;
	unsigned long exp_fs = w->fsbase;
	sigset_t cur, exp;
	void *rhead;
	size_t rlen;
	stack_t ss;
	int r;

	snprintf(who, sizeof(who), "worker %d", i);

	/* self-test: break one invariant of each kind right before checking */
	if (i == 0) {
		TCORRUPT("tid", exp_tid += 1000);
		TCORRUPT("tls", tls_buf[777] ^= 0x04);
		TCORRUPT("tls-addr", exp_fs ^= 0x1000);
	}
	if (i == 1) {
		siginfo_t si;

		TCORRUPT("tls-count", tls_count += 3);
		TCORRUPT("pending", take_sig(SIGRTMIN + 1, &si));
	}
	if (i == 2) {
		TCORRUPT("stack", arr[4097] ^= 0x01);
		TCORRUPT("altstack", {
			stack_t s2 = { .ss_sp = altstack_mem,
				       .ss_size = ALTSTACK_SIZE - 4096 };
			sigaltstack(&s2, NULL);
		});
	}
	if (i == 3) {
		TCORRUPT("mask", {
			sigset_t s1;
			sigemptyset(&s1);
			sigaddset(&s1, SIGUSR1);
			pthread_sigmask(SIG_BLOCK, &s1, NULL);
		});
		TCORRUPT("compute", slot.lane[5] ^= 1ull << 33);
	}
	if (i == 4) {
		TCORRUPT("name", pthread_setname_np(pthread_self(), "wk-X"));
		TCORRUPT("pending-leak",
			 pthread_kill(pthread_self(), SIGRTMIN + 4));
		TCORRUPT("robust", syscall(SYS_set_robust_list,
					   (char *)w->robust_head + 8,
					   w->robust_len));
	}

	/* TID */
	TCHECK(gettid() == exp_tid, "tid", "%s: gettid() %d, expected %d",
	       who, (int)gettid(), (int)exp_tid);
	TCHECK(pthread_equal(pthread_self(), w->self), "tid",
	       "%s: pthread_self() changed", who);
	TCHECK(pthread_equal(pthread_self(), thr[i]), "tid",
	       "%s: pthread_self() differs from pthread_create's", who);

	/* TLS */
	TCHECK((void *)tls_buf == w->tls_addr, "tls-addr",
	       "%s: __thread array at %p, expected %p", who, (void *)tls_buf,
	       w->tls_addr);
#ifdef __x86_64__
	TCHECK(get_fsbase() == exp_fs, "tls-addr",
	       "%s: FS base %#lx, expected %#lx", who, get_fsbase(), exp_fs);
	TCHECK(get_fsbase() == (unsigned long)pthread_self(), "tls-addr",
	       "%s: FS base %#lx, pthread_self %#lx", who, get_fsbase(),
	       (unsigned long)pthread_self());
#else
	(void)exp_fs;
#endif
	snprintf(name, sizeof(name), "%s __thread array", who);
	tverify_pattern("tls", name, tls_buf, TLS_SIZE, SEED_TLS(i));
	TCHECK(tls_count == __atomic_load_n(&w->count, __ATOMIC_RELAXED),
	       "tls-count", "%s: __thread counter %llu, global mirror %llu",
	       who, (unsigned long long)tls_count,
	       (unsigned long long)__atomic_load_n(&w->count,
						   __ATOMIC_RELAXED));

	/* stack */
	TCHECK((void *)arr == w->stack_addr, "stack",
	       "%s: stack array at %p, expected %p", who, (void *)arr,
	       w->stack_addr);
	snprintf(name, sizeof(name), "%s stack array", who);
	tverify_pattern("stack", name, arr, STACK_ARR, SEED_STACK(i));

	/* name */
	snprintf(name, sizeof(name), "wk-%d", i);
	r = pthread_getname_np(pthread_self(), buf, sizeof(buf));
	TCHECK(r == 0 && strcmp(buf, name) == 0, "name",
	       "%s: pthread_getname_np -> %d '%s', expected '%s'", who, r,
	       r ? "" : buf, name);
	snprintf(path, sizeof(path), "/proc/self/task/%d/comm", (int)gettid());
	r = zdtm_read_text(path, buf, sizeof(buf));
	if (r > 0 && buf[r - 1] == '\n')
		buf[r - 1] = 0;
	TCHECK(r > 0 && strcmp(buf, name) == 0, "name",
	       "%s: %s reads '%s', expected '%s'", who, path,
	       r > 0 ? buf : "(unreadable)", name);

	/* blocked mask */
	worker_mask(i, &exp);
	pthread_sigmask(SIG_BLOCK, NULL, &cur);
	check_set("mask", who, "blocked mask", &cur, &exp);

	/* pending: exactly its own thread-directed signal, nothing shared */
	sigemptyset(&exp);
	if (psig)
		sigaddset(&exp, psig);
	sigpending(&cur);
	check_set(ptag, who, "sigpending", &cur, &exp);
	worker_mask(i, &cur);
	check_status_sets(who, gettid(), set_bits(&cur), set_bits(&exp),
			  "mask", ptag);

	/* sigaltstack */
	r = sigaltstack(NULL, &ss);
	if (r)
		TFAIL("altstack", "%s: sigaltstack: %s", who, strerror(errno));
	else if (i == 2)
		TCHECK(ss.ss_sp == altstack_mem &&
			       ss.ss_size == ALTSTACK_SIZE && ss.ss_flags == 0,
		       "altstack",
		       "%s: altstack sp %p size %zu flags %#x, expected %p "
		       "%u 0",
		       who, ss.ss_sp, ss.ss_size, (unsigned)ss.ss_flags,
		       (void *)altstack_mem, (unsigned)ALTSTACK_SIZE);
	else
		TCHECK(ss.ss_flags == SS_DISABLE, "altstack",
		       "%s: altstack flags %#x (sp %p size %zu), expected "
		       "SS_DISABLE",
		       who, (unsigned)ss.ss_flags, ss.ss_sp, ss.ss_size);
	if (i == 2)
		tverify_pattern("altstack", "worker 2 altstack contents",
				altstack_mem, ALTSTACK_SIZE, SEED_ALT);

	/* robust futex list head */
	get_robust(&rhead, &rlen);
	TCHECK(rhead == w->robust_head && rlen == w->robust_len, "robust",
	       "%s: robust list head %p len %zu, expected %p len %zu", who,
	       rhead, rlen, w->robust_head, w->robust_len);
	if (ZDTM_SELFTEST && i == 4) /* undo the corruption before exit */
		syscall(SYS_set_robust_list, w->robust_head, w->robust_len);

	/* per-worker activity */
	if (i == 3) {
		uint64_t n = slot.n;
		int k;

		TCHECK(n > 0 && n % CHUNK == 0, "compute",
		       "worker 3: iteration count %llu",
		       (unsigned long long)n);
		for (k = 0; k < LANES; k++) {
			uint64_t e = lane_jump(k, SEED_LANE(k), n);

			TCHECK(slot.lane[k] == e, "compute",
			       "worker 3: lane %d after %llu iterations: "
			       "%016llx, expected %016llx",
			       k, (unsigned long long)n,
			       (unsigned long long)slot.lane[k],
			       (unsigned long long)e);
		}
	}
	if (i == 4)
		TCHECK(w->lock_rc == 0, "robust",
		       "worker 4: pthread_mutex_lock returned %d (%s)",
		       w->lock_rc, strerror(w->lock_rc));
}

/* After the barrier: take the pending signal, use the altstack. */
static void check_worker_late(int i)
{
	char who[16];
	int psig = worker_pending_sig(i);
	siginfo_t si;
	sigset_t cur;
	int r;

	snprintf(who, sizeof(who), "worker %d", i);
	if (psig) {
		memset(&si, 0, sizeof(si));
		r = take_sig(psig, &si);
		TCHECK(r == psig, "pending-info",
		       "%s: sigtimedwait(%d) returned %d (%s)", who, psig, r,
		       r < 0 ? strerror(errno) : "wrong signal");
		if (r == psig) {
			TCHECK(si.si_signo == psig && si.si_code == probe_code,
			       "pending-info",
			       "%s: si_signo %d si_code %d, expected %d %d",
			       who, si.si_signo, si.si_code, psig, probe_code);
			TCHECK(si.si_pid == probe_pid &&
				       si.si_uid == probe_uid,
			       "pending-info",
			       "%s: si_pid %d si_uid %u, expected %d %u", who,
			       (int)si.si_pid, (unsigned)si.si_uid, probe_pid,
			       probe_uid);
		}
		r = take_sig(psig, &si);
		TCHECK(r < 0 && errno == EAGAIN, "pending-info",
		       "%s: signal %d pending more than once (second "
		       "sigtimedwait returned %d)",
		       who, psig, r);
		sigpending(&cur);
		TCHECK(set_bits(&cur) == 0, "pending-info",
		       "%s: still pending after sigtimedwait: %016llx", who,
		       (unsigned long long)set_bits(&cur));
	}
	if (i == 2) {
		pthread_kill(pthread_self(), SIGUSR1); /* delivered here */
		TCHECK(usr1_count == 1 && usr1_tid == gettid(), "altstack-use",
		       "%s: SIGUSR1 handler ran %d times, in task %d", who,
		       (int)usr1_count, (int)usr1_tid);
		TCHECK(usr1_onstack && usr1_addr >= (uintptr_t)altstack_mem &&
			       usr1_addr < (uintptr_t)altstack_mem +
						   ALTSTACK_SIZE,
		       "altstack-use",
		       "%s: SIGUSR1 handler onstack=%d local at %#lx, "
		       "altstack %p..+%u",
		       who, usr1_onstack, (unsigned long)usr1_addr,
		       (void *)altstack_mem, (unsigned)ALTSTACK_SIZE);
	}
}

static void *worker(void *arg)
{
	int i = (int)(intptr_t)arg;
	struct worker *w = &wk[i];
	uint8_t arr[STACK_ARR] __attribute__((aligned(16)));
	char name[16];
	sigset_t m;

	w->tid = gettid();
	w->self = pthread_self();
	snprintf(name, sizeof(name), "wk-%d", i);
	if (pthread_setname_np(pthread_self(), name)) {
		setup_fail("pthread_setname_np");
		return NULL;
	}
	zdtm_fill(tls_buf, TLS_SIZE, SEED_TLS(i));
	w->tls_addr = tls_buf;
	zdtm_fill(arr, STACK_ARR, SEED_STACK(i));
	w->stack_addr = arr;
	w->fsbase = get_fsbase();
	get_robust(&w->robust_head, &w->robust_len);
	if (!w->robust_head) {
		setup_fail("get_robust_list");
		return NULL;
	}
	worker_mask(i, &m);
	if (pthread_sigmask(SIG_SETMASK, &m, NULL)) {
		setup_fail("pthread_sigmask");
		return NULL;
	}
	if (i == 1) {
		siginfo_t si;

		memset(&si, 0, sizeof(si));
		if (pthread_kill(pthread_self(), SIGRTMIN + 1) ||
		    take_sig(SIGRTMIN + 1, &si) != SIGRTMIN + 1) {
			setup_fail("probe signal");
			return NULL;
		}
		probe_code = si.si_code;
		probe_pid = si.si_pid;
		probe_uid = si.si_uid;
	}
	if (i == 2) {
		stack_t ss = { .ss_sp = altstack_mem,
			       .ss_size = ALTSTACK_SIZE };

		zdtm_fill(altstack_mem, ALTSTACK_SIZE, SEED_ALT);
		if (sigaltstack(&ss, NULL)) {
			setup_fail("sigaltstack");
			return NULL;
		}
	}
	if (i == 3) {
		/* the compute loop must agree with the jump-ahead */
		uint64_t st[LANES], n = 0;
		int k;

		for (k = 0; k < LANES; k++)
			st[k] = SEED_LANE(k);
		compute_run(st, &n, 0, 5);
		for (k = 0; k < LANES; k++)
			if (st[k] != lane_jump(k, SEED_LANE(k), n)) {
				errno = 0;
				setup_fail("compute loop != jump-ahead");
				return NULL;
			}
	}

	pthread_mutex_lock(&setup_mx);
	setup_ready++;
	pthread_cond_broadcast(&setup_cv);
	pthread_mutex_unlock(&setup_mx);

	switch (i) {
	case 0:
		pthread_mutex_lock(&cv_mx);
		__atomic_store_n(&w->waiting, 1, __ATOMIC_RELEASE);
		while (!finishing()) {
			pthread_cond_wait(&cv, &cv_mx);
			tick(0);
		}
		pthread_mutex_unlock(&cv_mx);
		break;
	case 1:
		while (!finishing()) {
			struct timespec ts = { 0, 20 * 1000000l };

			nanosleep(&ts, NULL); /* EINTR: just go on */
			tick(1);
		}
		break;
	case 2:
		while (!finishing()) {
			poll(NULL, 0, 30); /* EINTR: just go on */
			tick(2);
		}
		break;
	case 3: {
		uint64_t st[LANES], n = 0;
		int k;

		for (k = 0; k < LANES; k++)
			st[k] = SEED_LANE(k);
		compute_run(st, &n, 1, 0);
		/* final state straight from the registers */
		memcpy(slot.lane, st, sizeof(st));
		slot.n = n;
		break;
	}
	case 4:
		__atomic_store_n(&w->waiting, 1, __ATOMIC_RELEASE);
		w->lock_rc = pthread_mutex_lock(&m4);
		tick(4);
		if (w->lock_rc == EOWNERDEAD)
			pthread_mutex_consistent(&m4);
		if (w->lock_rc == 0 || w->lock_rc == EOWNERDEAD)
			pthread_mutex_unlock(&m4);
		break;
	}

	check_worker(i, arr);
	barrier_wait(i == 0 ? "worker 0" : "worker");
	check_worker_late(i);
	__atomic_store_n(&w->reported, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* ------------------------------------------------------------------ */
/* main                                                                */

static void wait_blocked(int i)
{
	int64_t dl = zdtm_now_ns() + 5000000000ll;

	while (!__atomic_load_n(&wk[i].waiting, __ATOMIC_ACQUIRE) ||
	       task_state(wk[i].tid) != 'S') {
		if (zdtm_now_ns() > dl)
			zdtm_die("worker %d did not block (state %c)", i,
				 task_state(wk[i].tid));
		zdtm_usleep(1000);
	}
}

static void check_tasks(void)
{
	pid_t t[64];
	int n, i, j, found;

	n = list_tasks(t, 64);
	TCHECK(n == NTHREADS + 1, "tasks", "/proc/self/task has %d entries, "
	       "expected %d", n, NTHREADS + 1);
	if (n < 0)
		return;
	for (i = -1; i < NTHREADS; i++) {
		pid_t want = i < 0 ? getpid() : wk[i].tid;

		found = 0;
		for (j = 0; j < n && j < 64; j++)
			found |= t[j] == want;
		TCHECK(found, "tasks", "task %d (%s %d) missing from "
		       "/proc/self/task", (int)want, i < 0 ? "main" : "worker",
		       i);
	}
}

static void check_main(void)
{
	sigset_t cur, exp;
	char buf[32];
	void *rhead;
	size_t rlen;
	stack_t ss;

	TCORRUPT("main-mask", {
		sigset_t s1;
		sigemptyset(&s1);
		sigaddset(&s1, SIGRTMIN + 9);
		pthread_sigmask(SIG_BLOCK, &s1, NULL);
	});
	TCORRUPT("main-tls", tls_buf[4000] ^= 0x80);

	TCHECK(gettid() == getpid(), "tid", "main: gettid() %d != getpid() %d",
	       (int)gettid(), (int)getpid());
	tverify_pattern("main-tls", "main __thread array", tls_buf, TLS_SIZE,
			SEED_TLS(NTHREADS));
#ifdef __x86_64__
	TCHECK(get_fsbase() == main_fsbase, "tls-addr",
	       "main: FS base %#lx, expected %#lx", get_fsbase(), main_fsbase);
#endif
	main_mask(&exp);
	pthread_sigmask(SIG_BLOCK, NULL, &cur);
	check_set("main-mask", "main", "blocked mask", &cur, &exp);
	sigpending(&cur);
	sigemptyset(&exp);
	check_set("pending-leak", "main", "sigpending", &cur, &exp);
	main_mask(&exp);
	check_status_sets("main", getpid(), set_bits(&exp), 0, "main-mask",
			  "pending-leak");
	if (sigaltstack(NULL, &ss))
		TFAIL("altstack", "main: sigaltstack: %s", strerror(errno));
	else
		TCHECK(ss.ss_flags == SS_DISABLE, "altstack",
		       "main: altstack flags %#x, expected SS_DISABLE",
		       (unsigned)ss.ss_flags);
	memset(buf, 0, sizeof(buf));
	prctl(PR_GET_NAME, buf);
	TCHECK(strcmp(buf, main_comm) == 0, "name",
	       "main: comm '%s', expected '%s'", buf, main_comm);
	get_robust(&rhead, &rlen);
	TCHECK(rhead == main_robust_head && rlen == main_robust_len, "robust",
	       "main: robust list head %p len %zu, expected %p len %zu",
	       rhead, rlen, main_robust_head, main_robust_len);
}

int main(int argc, char **argv)
{
	pthread_mutexattr_t ma;
	struct sigaction sa;
	sigset_t all, m;
	struct timespec dl;
	uint64_t main_iters = 0;
	int i, r, n;

	zdtm_init(argc, argv, 0, "");

	/* SIGUSR1: run on the altstack (only worker 2 ever gets it) */
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = h_usr1;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGUSR1, &sa, NULL))
		zdtm_die("sigaction(SIGUSR1)");

	zdtm_fill(tls_buf, TLS_SIZE, SEED_TLS(NTHREADS));
	main_fsbase = get_fsbase();
	get_robust(&main_robust_head, &main_robust_len);
	if (!main_robust_head)
		zdtm_die("get_robust_list");
	if (prctl(PR_GET_NAME, main_comm))
		zdtm_die("prctl(PR_GET_NAME)");

	/* robust mutex, held by main until the finish phase */
	if (pthread_mutexattr_init(&ma) ||
	    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST) ||
	    pthread_mutex_init(&m4, &ma) || pthread_mutex_lock(&m4))
		zdtm_die("robust mutex");
	pthread_mutexattr_destroy(&ma);

	/* workers start with everything blocked, then set their own mask */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, NULL);
	for (i = 0; i < NTHREADS; i++) {
		r = pthread_create(&thr[i], NULL, worker, (void *)(intptr_t)i);
		if (r) {
			errno = r;
			zdtm_die("pthread_create %d", i);
		}
	}
	main_mask(&m);
	pthread_sigmask(SIG_SETMASK, &m, NULL);

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += DEADLINE_S;
	pthread_mutex_lock(&setup_mx);
	while (setup_ready < NTHREADS && !setup_err)
		if (pthread_cond_timedwait(&setup_cv, &setup_mx, &dl) ==
		    ETIMEDOUT)
			break;
	pthread_mutex_unlock(&setup_mx);
	if (setup_err) {
		errno = setup_errno;
		zdtm_die("worker: %s", setup_err);
	}
	if (setup_ready < NTHREADS)
		zdtm_die("workers did not start");

	wait_blocked(0);
	wait_blocked(4);

	/* thread-directed signals, blocked by their targets */
	if (pthread_kill(thr[1], SIGRTMIN + 1) || pthread_kill(thr[3], SIGUSR2))
		zdtm_die("pthread_kill");
	{
		uint64_t p1 = 0, p3 = 0;

		if (status_hex(wk[1].tid, "SigPnd", &p1) ||
		    status_hex(wk[3].tid, "SigPnd", &p3) ||
		    p1 != 1ull << (SIGRTMIN + 1 - 1) ||
		    p3 != 1ull << (SIGUSR2 - 1))
			zdtm_die("thread-directed signals not pending as "
				 "expected (%llx %llx)",
				 (unsigned long long)p1,
				 (unsigned long long)p3);
	}

	for (i = 0; i < NTHREADS; i++)
		wk[i].ready_count = __atomic_load_n(&wk[i].count,
						    __ATOMIC_RELAXED);
	zdtm_ready();

	while (!zdtm_stop) {
		zdtm_msleep(50);
		main_iters++;
	}

	/* every thread still there, at its TID */
	check_tasks();

	pthread_mutex_lock(&cv_mx);
	__atomic_store_n(&finish_flag, 1, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&cv_mx);
	r = pthread_mutex_unlock(&m4);
	TCHECK(r == 0, "robust", "main: unlocking the robust mutex: %d (%s)",
	       r, strerror(r));

	check_main();
	barrier_wait("main");

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += DEADLINE_S;
	n = 0;
	for (i = 0; i < NTHREADS; i++) {
		r = pthread_timedjoin_np(thr[i], NULL, &dl);
		TCHECK(r == 0, "join", "worker %d: join: %s", i, strerror(r));
		if (r == 0)
			n++;
	}
	for (i = 0; i < NTHREADS; i++)
		TCHECK(__atomic_load_n(&wk[i].reported, __ATOMIC_ACQUIRE),
		       "join", "worker %d did not finish its checks", i);

	/* progress while main slept (only judged after >= 10 main sleeps) */
	if (main_iters >= 10)
		for (i = 1; i <= 3; i++)
			TCHECK(wk[i].count >= wk[i].ready_count + 2,
			       "progress",
			       "worker %d: counter %llu at ready, %llu at end "
			       "(main slept %llu times)",
			       i, (unsigned long long)wk[i].ready_count,
			       (unsigned long long)wk[i].count,
			       (unsigned long long)main_iters);

	/* exited threads vanish from /proc shortly after join */
	if (n == NTHREADS) {
		int64_t end = zdtm_now_ns() + 2000000000ll;
		pid_t t[8];
		int cnt;

		while ((cnt = list_tasks(t, 8)) != 1 && zdtm_now_ns() < end)
			zdtm_usleep(1000);
		TCHECK(cnt == 1 && t[0] == getpid(), "tasks",
		       "after join /proc/self/task has %d entries", cnt);
	}

	zdtm_finish();
}
