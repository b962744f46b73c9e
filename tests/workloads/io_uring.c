/*
 * io_uring.c - an idle io_uring instance (no request in flight) must come
 * back with its rings at their addresses, its positions, the completions
 * not reaped yet, the entries written but not submitted yet, and its
 * registered files and buffers.
 *
 *   io_uring PIDFILE
 *
 * Set up before "ready" (raw syscalls, no liburing):
 *   a ring of 8 entries (16 CQEs), its rings mapped twice (at the SQ
 *   ring's offset, used for the SQ, and at the CQ ring's, used for the
 *   CQ: the same pages) and its SQE array mapped;
 *   io_uring.data (a pattern file in the cwd) and io_uring.out (empty);
 *   registered files [data, (empty), out]; registered buffers
 *   [fixed, fixed+4096]; 19 NOPs submitted and reaped (the positions wrap
 *   the ring), a READ_FIXED of 4 KiB through file 0 and buffer 0
 *   (checked), a WRITE of 100 bytes at 0 of out through file 2;
 *   3 requests completed and left unreaped: NOP (0xa1), READ of 512 bytes
 *   at 4096 into rbuf (0xa2), READ_FIXED of 256 bytes at 0 into buffer 1
 *   through file 0 (0xa3);
 *   2 entries written and the SQ tail moved, not submitted: NOP (0xb1),
 *   READ of 512 bytes at 8192 into rbuf2 (0xb2).
 * After SIGTERM (tags in brackets):
 *   [pos]    the rings are mapped where they were, with the SQ head/tail
 *            and CQ head/tail of before;
 *   [cqe]    the 3 unreaped completions are there, in order, with their
 *            user_data and results; rbuf and buffer 1 hold the bytes read;
 *   [sq]     io_uring_enter submits the 2 waiting entries: their
 *            completions come with their user_data and results, and rbuf2
 *            holds the file's bytes at 8192;
 *   [fixed]  a READ_FIXED of 4 KiB at 12288 through file 0 into buffer 1
 *            gives the file's bytes; a WRITE_FIXED of buffer 0 at 100
 *            through file 2 lands in out after the 100 bytes written
 *            before; slot 1 is still empty (-EBADF);
 *   [nop]    20 more NOPs complete with their user_data.
 *   [alias]  after all that, the two mappings of the rings still show
 *            the same CQ tail (one memory).
 *   [wait]   until SIGTERM the program waits in io_uring_enter for a
 *            completion on an idle ring W (4 entries, 50 ms timeouts):
 *            no wait ended with EINTR but the one SIGTERM ended (a dump
 *            interrupts the wait; the restored or released program must
 *            wait on, as the kernel restarts other syscalls).
 * Rings B (8 entries) and C (1024, and 4096 CQEs: IORING_SETUP_CQSIZE;
 * its rings take fewer pages than with an index array) are made with
 * IORING_SETUP_NO_SQARRAY (liburing's default): on each, 5 NOPs reaped, a NOP (0xd1) completed and left
 * unreaped, a NOP (0xd2) written at SQE 6 and not submitted.
 *   [noarray] after SIGTERM, on B and C: the unreaped completion is
 *            there, the waiting entry submits and completes, and 10 more
 *            NOPs do (at SQE i & mask, with no index array).
 *
 *   io_uring PIDFILE inflight
 *
 * A ring with a request in flight, which a dump must refuse (errors.rs):
 * a READ of 16 bytes on an empty pipe (waiting on a poll), tagged 0xc1.
 * After SIGTERM: [inflight] it has not completed; once 16 bytes are
 * written to the pipe it completes with them (the refused dump left the
 * ring untouched).
 *
 *   io_uring PIDFILE issuer
 *
 * Rings bound to a thread, or disabled (IORING_SETUP_NO_SQARRAY, each
 * prepared as B and C are):
 *   S (8 entries): IORING_SETUP_SINGLE_ISSUER, made by the main thread;
 *   T (8): SINGLE_ISSUER | DEFER_TASKRUN, made by thread X, which waits
 *          on a pipe until the main thread lets it check;
 *   D (4): IORING_SETUP_R_DISABLED, never enabled, a NOP (0xd3) written.
 * After SIGTERM:
 *   [issuer] in the main thread, a register probe on T is turned down
 *            (EEXIST) and so is a wait for completions (DEFER_TASKRUN);
 *            S works as B does; in thread X, a probe on T is not turned
 *            down for that (it fails for want of a buffer), one on S is,
 *            a wait on S is not
 *            (no DEFER_TASKRUN), and T works as B does.
 *   [disabled] io_uring_enter on D fails with EBADFD; once enabled, the
 *            NOP written completes.
 *
 *   io_uring PIDFILE sqpoll
 *
 * A ring Q (8 entries, NO_SQARRAY) with an SQ poll thread
 * (IORING_SETUP_SQPOLL, 50 ms idle) bound to CPU 1 (0 on one CPU:
 * IORING_SETUP_SQ_AFF): 5 NOPs served, one (0xd1) completed and left
 * unreaped, one (0xd2) written once the thread sleeps, not taken.
 * After SIGTERM, with no io_uring_enter but to wake the thread when it
 * sleeps (IORING_SQ_NEED_WAKEUP):
 *   [sqpoll] the unreaped completion is there, the waiting entry
 *            completes, and 10 more NOPs do;
 *   [sqaff]  the iou-sqp thread may run on that CPU only.
 *
 *   io_uring PIDFILE shared
 *
 * The ring, inherited by a child (it holds it until its parent ends).
 * After SIGTERM: [shared] told to (SIGUSR1), the child submits a NOP
 * (0xc5) through its own mappings and exits; the parent reaps its
 * completion; [ring] a NOP of the parent completes.
 *
 *   io_uring PIDFILE issuer_gone | eventfd | ring_fds
 *
 * Rings a dump must refuse: one made with IORING_SETUP_SINGLE_ISSUER by
 * a thread that has exited (its issuer is gone); one with an eventfd
 * registered; one whose fd the main thread registered
 * (IORING_REGISTER_RING_FDS). After SIGTERM: [ring] submitting on the
 * first fails with EEXIST; on the second, a NOP completes and the eventfd
 * counts 1; on the third, a NOP submitted through its registered slot
 * completes.
 */
#include "zdtm.h"

#include <linux/io_uring.h>
#include <dirent.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#define SEED_F 0x75726e67ull
#define FLEN (64 * 1024)
#define ENTRIES 8

static char fixed[8192] __attribute__((aligned(4096)));
static char rbuf[512], rbuf2[512], wbuf[100], outbuf[4096 + 100];

static int ring_fd;
static struct io_uring_params p;
static unsigned char *sq_ring, *cq_ring;
static struct io_uring_sqe *sqes;

#define SQ_U32(off) ((volatile unsigned *)(sq_ring + (off)))
#define CQ_U32(off) ((volatile unsigned *)(cq_ring + (off)))

static struct io_uring_cqe *cqe_at(unsigned pos)
{
	return (struct io_uring_cqe *)(cq_ring + p.cq_off.cqes) + (pos & *CQ_U32(p.cq_off.ring_mask));
}

/* Writes one SQE at the SQ tail and moves the tail (not submitted). */
static void queue(unsigned char op, unsigned char flags, int fd, unsigned long addr, unsigned len,
		  unsigned long long off, unsigned buf_index, unsigned long long user_data)
{
	unsigned tail = *SQ_U32(p.sq_off.tail), idx = tail & (ENTRIES - 1);
	struct io_uring_sqe *s = &sqes[idx];

	memset(s, 0, sizeof(*s));
	s->opcode = op;
	s->flags = flags;
	s->fd = fd;
	s->addr = addr;
	s->len = len;
	s->off = off;
	s->buf_index = buf_index;
	s->user_data = user_data;
	((unsigned *)(sq_ring + p.sq_off.array))[idx] = idx;
	__atomic_store_n(SQ_U32(p.sq_off.tail), tail + 1, __ATOMIC_RELEASE);
}

static long enter(unsigned submit, unsigned wait)
{
	return syscall(SYS_io_uring_enter, ring_fd, submit, wait, wait ? IORING_ENTER_GETEVENTS : 0,
		       NULL, 0);
}

/* Reaps one completion: its result, and its user_data in *ud. */
static int reap(unsigned long long *ud)
{
	unsigned head = *CQ_U32(p.cq_off.head);
	struct io_uring_cqe *c;

	*ud = 0;
	if (__atomic_load_n(CQ_U32(p.cq_off.tail), __ATOMIC_ACQUIRE) == head && enter(0, 1) < 0)
		return -100000;
	if (*CQ_U32(p.cq_off.tail) == head)
		return -100001;
	c = cqe_at(head);
	*ud = c->user_data;
	__atomic_store_n(CQ_U32(p.cq_off.head), head + 1, __ATOMIC_RELEASE);
	return c->res;
}

/* Submits what is queued (n entries) and reaps n completions, checking
 * each has user_data ud0 + i and result res; 0 if all did. */
static int run(unsigned n, unsigned long long ud0, int res, const char *tag)
{
	unsigned long long ud;
	long r = enter(n, n);
	unsigned i;
	int ok = 1;

	if (!zdtm_check(r == (long)n, tag, "io_uring_enter(%u): %ld (%s)", n, r,
			r < 0 ? strerror(errno) : ""))
		return -1;
	for (i = 0; i < n; i++) {
		int got = reap(&ud);

		ok &= zdtm_check(got == res && ud == ud0 + i, tag,
				 "completion %u: user_data %#llx res %d, expected %#llx %d", i, ud,
				 got, ud0 + i, res);
	}
	return ok ? 0 : -1;
}

#define SETUP_NO_SQARRAY (1U << 16)
#define ENTER_EXT_ARG (1U << 3)

/* A ring without an SQ index array (rings B and C). */
struct nring {
	int fd;
	struct io_uring_params p;
	unsigned char *ring;
	struct io_uring_sqe *sqes;
};

#define NR_U32(n, off) ((volatile unsigned *)((n)->ring + (off)))

/* The CPU of an SQ poll thread (IORING_SETUP_SQ_AFF; sqpoll mode). */
static unsigned sq_cpu_want;

static void nring_setup(struct nring *n, unsigned entries, unsigned cq_entries, unsigned flags)
{
	size_t len;

	memset(&n->p, 0, sizeof(n->p));
	n->p.flags = SETUP_NO_SQARRAY | flags;
	n->p.sq_thread_cpu = sq_cpu_want;
	n->p.sq_thread_idle = 50;
	if (cq_entries) {
		n->p.flags |= IORING_SETUP_CQSIZE;
		n->p.cq_entries = cq_entries;
	}
	n->fd = syscall(SYS_io_uring_setup, entries, &n->p);
	if (n->fd < 0 || (cq_entries && n->p.cq_entries != cq_entries))
		zdtm_die("io_uring_setup(NO_SQARRAY)");
	len = n->p.cq_off.cqes + n->p.cq_entries * sizeof(struct io_uring_cqe);
	n->ring = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, n->fd,
		       IORING_OFF_SQ_RING);
	n->sqes = mmap(NULL, entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_POPULATE, n->fd, IORING_OFF_SQES);
	if (n->ring == MAP_FAILED || n->sqes == MAP_FAILED)
		zdtm_die("mapping a NO_SQARRAY ring");
}

/* A NOP at the SQ tail (SQE tail & mask), not submitted. */
static void nring_nop(struct nring *n, unsigned long long ud)
{
	unsigned tail = *NR_U32(n, n->p.sq_off.tail);
	struct io_uring_sqe *s = &n->sqes[tail & (n->p.sq_entries - 1)];

	memset(s, 0, sizeof(*s));
	s->opcode = IORING_OP_NOP;
	s->user_data = ud;
	__atomic_store_n(NR_U32(n, n->p.sq_off.tail), tail + 1, __ATOMIC_RELEASE);
}

/* Submits `submit` and waits for one completion (with nothing to submit:
 * takes one if there is one); reaps it: its user_data, or 0. */
static unsigned long long nring_one(struct nring *n, unsigned submit)
{
	unsigned head = *NR_U32(n, n->p.cq_off.head);
	struct io_uring_cqe *c;

	if ((submit && syscall(SYS_io_uring_enter, n->fd, submit, 1, IORING_ENTER_GETEVENTS, NULL,
			       0) < 0) ||
	    __atomic_load_n(NR_U32(n, n->p.cq_off.tail), __ATOMIC_ACQUIRE) == head)
		return 0;
	c = (struct io_uring_cqe *)(n->ring + n->p.cq_off.cqes) + (head & (n->p.cq_entries - 1));
	__atomic_store_n(NR_U32(n, n->p.cq_off.head), head + 1, __ATOMIC_RELEASE);
	return c->res ? 0 : c->user_data;
}

/* Before "ready" (see the top). */
static void nring_prepare(struct nring *n, unsigned entries, unsigned cq_entries, unsigned flags)
{
	unsigned i;

	nring_setup(n, entries, cq_entries, flags);
	for (i = 0; i < 5; i++) {
		nring_nop(n, 0xd00 + i);
		if (nring_one(n, 1) != 0xd00 + i)
			zdtm_die("NOP %u on a NO_SQARRAY ring", i);
	}
	nring_nop(n, 0xd1);
	if (syscall(SYS_io_uring_enter, n->fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) != 1)
		zdtm_die("the NOP left unreaped");
	nring_nop(n, 0xd2);
}

/* After SIGTERM (see the top), reporting under `tag`. */
static void nring_check_tag(struct nring *n, const char *name, const char *tag)
{
	unsigned long long ud;
	unsigned i;

	ud = nring_one(n, 0);
	zdtm_check(ud == 0xd1, tag, "ring %s: unreaped completion %#llx", name, ud);
	ud = nring_one(n, 1);
	zdtm_check(ud == 0xd2, tag, "ring %s: the waiting entry gave %#llx", name, ud);
	for (i = 0; i < 10; i++) {
		nring_nop(n, 0xe00 + i);
		ud = nring_one(n, 1);
		if (!zdtm_check(ud == 0xe00 + i, tag, "ring %s: NOP %u gave %#llx", name, i, ud))
			break;
	}
}

static void nring_check(struct nring *n, const char *name)
{
	nring_check_tag(n, name, "noarray");
}

/* Makes the ring (8 entries) and maps its rings and SQE array. */
static void setup_ring(void)
{
	size_t ring_len;

	ring_fd = syscall(SYS_io_uring_setup, ENTRIES, &p);
	if (ring_fd < 0)
		zdtm_die("io_uring_setup");
	if (!(p.features & IORING_FEAT_SINGLE_MMAP))
		zdtm_die("no IORING_FEAT_SINGLE_MMAP");
	ring_len = p.sq_off.array + ENTRIES * sizeof(unsigned);
	if (p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe) > ring_len)
		ring_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	sq_ring = mmap(NULL, ring_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd,
		       IORING_OFF_SQ_RING);
	sqes = mmap(NULL, ENTRIES * sizeof(*sqes), PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_POPULATE, ring_fd, IORING_OFF_SQES);
	/* The CQ ring mapped apart too, as programs written for kernels
	 * without IORING_FEAT_SINGLE_MMAP do: the same pages (aliases). */
	cq_ring = mmap(NULL, p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe),
		       PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd, IORING_OFF_CQ_RING);
	if (sq_ring == MAP_FAILED || sqes == MAP_FAILED || cq_ring == MAP_FAILED)
		zdtm_die("mapping the rings");
}

/* The "inflight" mode (see the top). */
static int in_flight(void)
{
	static const char msg[16] = "sixteen bytes!!";
	unsigned long long ud = 0;
	int pfd[2], r;

	if (pipe2(pfd, O_CLOEXEC))
		zdtm_die("pipe");
	setup_ring();
	queue(IORING_OP_READ, 0, pfd[0], (unsigned long)rbuf, 16, 0, 0, 0xc1);
	if (enter(1, 0) != 1)
		zdtm_die("submitting the READ");
	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);
	zdtm_check(*CQ_U32(p.cq_off.tail) == 0, "inflight", "a completion before the write");
	if (write(pfd[1], msg, sizeof(msg)) != (ssize_t)sizeof(msg))
		zdtm_die("write");
	r = reap(&ud);
	zdtm_check(r == 16 && ud == 0xc1 && !memcmp(rbuf, msg, 16), "inflight",
		   "the READ: user_data %#llx res %d", ud, r);
	zdtm_finish();
	return 0;
}

/* The "shared" and "issuer_gone" modes (see the top). */
static void *make_ring_and_exit(void *arg)
{
	(void)arg;
	setup_ring();
	return NULL;
}

static volatile sig_atomic_t child_go;

static void on_usr1(int sig)
{
	(void)sig;
	child_go = 1;
}

static int refused_ring(const char *mode)
{
	unsigned long long ud = 0;
	pid_t c = -1;
	int r, st = 0, efd = -1, slot = -1;

	if (!strcmp(mode, "issuer_gone")) {
		pthread_t t;

		p.flags = IORING_SETUP_SINGLE_ISSUER;
		if (pthread_create(&t, NULL, make_ring_and_exit, NULL) || pthread_join(t, NULL))
			zdtm_die("the thread making the ring");
	} else {
		setup_ring();
	}
	if (!strcmp(mode, "ring_fds")) {
		struct io_uring_rsrc_update up = { .offset = -1U, .data = ring_fd };

		if (syscall(SYS_io_uring_register, ring_fd, IORING_REGISTER_RING_FDS, &up, 1) != 1)
			zdtm_die("registering the ring's fd");
		slot = up.offset;
	}
	if (!strcmp(mode, "eventfd")) {
		efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (efd < 0 || syscall(SYS_io_uring_register, ring_fd, IORING_REGISTER_EVENTFD, &efd, 1))
			zdtm_die("registering an eventfd");
	}
	if (!strcmp(mode, "shared")) {
		signal(SIGUSR1, on_usr1);
		c = fork();
		if (c < 0)
			zdtm_die("fork");
		if (c == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() == 1)
				_exit(0);
			while (!child_go)
				pause();
			/* Through the child's own mappings of the ring. */
			queue(IORING_OP_NOP, 0, -1, 0, 0, 0, 0, 0xc5);
			_exit(enter(1, 0) == 1 ? 0 : 1);
		}
	}
	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);
	if (!strcmp(mode, "issuer_gone")) {
		/* Nobody may submit any more: still so. */
		queue(IORING_OP_NOP, 0, -1, 0, 0, 0, 0, 0xf1);
		r = (int)enter(1, 0);
		zdtm_check(r < 0 && errno == EEXIST, "ring", "submitting a NOP: %d (%s)", r,
			   r < 0 ? strerror(errno) : "");
		zdtm_finish();
		return 0;
	}
	if (c > 0) {
		/* [shared] the child submits a NOP on the ring; the parent
		 * reaps its completion. */
		ZDTM_CORRUPT("shared", kill(c, SIGKILL));
		kill(c, SIGUSR1);
		zdtm_check(waitpid(c, &st, 0) == c && WIFEXITED(st) && !WEXITSTATUS(st), "shared",
			   "the child's NOP: wait status %#x", st);
		r = -1;
		if (*CQ_U32(p.cq_off.tail) != *CQ_U32(p.cq_off.head))
			r = reap(&ud);
		zdtm_check(r == 0 && ud == 0xc5, "shared", "the child's NOP: user_data %#llx res %d",
			   ud, r);
	}
	queue(IORING_OP_NOP, 0, -1, 0, 0, 0, 0, 0xf1);
	if (slot >= 0)
		r = (int)syscall(SYS_io_uring_enter, slot, 1, 1,
				 IORING_ENTER_GETEVENTS | IORING_ENTER_REGISTERED_RING, NULL, 0);
	else
		r = (int)enter(1, 1);
	zdtm_check(r == 1, "ring", "submitting a NOP: %d (%s)", r, r < 0 ? strerror(errno) : "");
	r = reap(&ud);
	zdtm_check(r == 0 && ud == 0xf1, "ring", "the NOP: user_data %#llx res %d", ud, r);
	if (efd >= 0) {
		uint64_t n = 0;

		zdtm_check(read(efd, &n, sizeof(n)) == sizeof(n) && n == 1, "ring",
			   "the registered eventfd counts %llu", (unsigned long long)n);
	}
	zdtm_finish();
	return 0;
}

/* The "issuer" mode (see the top). */
#define REGISTER_ENABLE_RINGS 12
static struct nring ring_s, ring_t, ring_d;
static int go[2], ready[2];
/* What thread X saw after SIGTERM: the errno of a register probe on T
 * and on S, of a wait for completions on S. */
static int x_probe_t, x_probe_s, x_wait_s;

/* errno of a call, 0 for success. */
static int err_of(long r)
{
	return r < 0 ? errno : 0;
}

static int probe(int fd)
{
	return err_of(syscall(SYS_io_uring_register, fd, IORING_REGISTER_PROBE, NULL, 1));
}

static int wait_none(int fd)
{
	return err_of(syscall(SYS_io_uring_enter, fd, 0, 0, IORING_ENTER_GETEVENTS, NULL, 0));
}

static void *issuer_x(void *arg)
{
	char c;

	(void)arg;
	nring_prepare(&ring_t, 8, 0, IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN);
	if (write(ready[1], "r", 1) != 1)
		zdtm_die("thread X: ready");
	while (read(go[0], &c, 1) != 1 || c != 'g')
		;
	x_probe_t = probe(ring_t.fd);
	x_probe_s = probe(ring_s.fd);
	x_wait_s = wait_none(ring_s.fd);
	nring_check_tag(&ring_t, "T", "issuer");
	return NULL;
}

static int issuer_mode(void)
{
	pthread_t x;
	char c;
	int r;

	if (pipe2(go, O_CLOEXEC) || pipe2(ready, O_CLOEXEC))
		zdtm_die("pipe");
	nring_prepare(&ring_s, 8, 0, IORING_SETUP_SINGLE_ISSUER);
	nring_setup(&ring_d, 4, 0, IORING_SETUP_R_DISABLED);
	nring_nop(&ring_d, 0xd3);
	if (pthread_create(&x, NULL, issuer_x, NULL) || read(ready[0], &c, 1) != 1 || c != 'r')
		zdtm_die("thread X");
	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);
	ZDTM_CORRUPT("issuer", {
		/* T made again by the main thread, at its number. */
		struct io_uring_params q = { .flags = IORING_SETUP_SINGLE_ISSUER };
		int f = syscall(SYS_io_uring_setup, 4, &q);

		dup2(f, ring_t.fd);
	});
	ZDTM_CORRUPT("disabled", syscall(SYS_io_uring_register, ring_d.fd, REGISTER_ENABLE_RINGS,
					 NULL, 0));
	/* [issuer] S: the main thread's, without DEFER_TASKRUN; T: thread X's,
	 * with DEFER_TASKRUN. */
	r = probe(ring_t.fd);
	zdtm_check(r == EEXIST, "issuer", "a register probe on T in the main thread: %s",
		   strerror(r));
	r = wait_none(ring_t.fd);
	zdtm_check(r == EEXIST, "issuer",
		   "waiting for completions of T in the main thread: %s (DEFER_TASKRUN lost?)",
		   strerror(r));
	nring_check_tag(&ring_s, "S", "issuer");
	if (write(go[1], "g", 1) != 1 || pthread_join(x, NULL))
		zdtm_die("thread X");
	zdtm_check(x_probe_t != EEXIST, "issuer", "a register probe on T in thread X: %s",
		   strerror(x_probe_t));
	zdtm_check(x_probe_s == EEXIST, "issuer", "a register probe on S in thread X: %s",
		   strerror(x_probe_s));
	zdtm_check(x_wait_s == 0, "issuer",
		   "waiting for no completion of S in thread X: %s (DEFER_TASKRUN gained?)",
		   strerror(x_wait_s));
	/* [disabled] D is still disabled; enabled, its waiting NOP completes. */
	r = err_of(syscall(SYS_io_uring_enter, ring_d.fd, 0, 0, 0, NULL, 0));
	zdtm_check(r == EBADFD, "disabled", "io_uring_enter on D: %s", strerror(r));
	r = err_of(syscall(SYS_io_uring_register, ring_d.fd, REGISTER_ENABLE_RINGS, NULL, 0));
	if (zdtm_check(r == 0, "disabled", "enabling D: %s", strerror(r))) {
		unsigned long long ud = nring_one(&ring_d, 1);

		zdtm_check(ud == 0xd3, "disabled", "the NOP written on D gave %#llx", ud);
	}
	zdtm_finish();
	return 0;
}

/* The "sqpoll" mode (see the top). */
static struct nring ring_q;

/* A NOP at the SQ tail of Q, served by its poll thread: woken if it
 * sleeps (IORING_SQ_NEED_WAKEUP), never asked to submit; its completion
 * waited for (2 s at most) and reaped: its user_data, or 0. */
static unsigned long long sq_served(int nop, unsigned long long ud)
{
	struct nring *n = &ring_q;
	unsigned head = *NR_U32(n, n->p.cq_off.head);
	struct io_uring_cqe *c;
	int i;

	if (nop)
		nring_nop(n, ud);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (*NR_U32(n, n->p.sq_off.flags) & IORING_SQ_NEED_WAKEUP)
		syscall(SYS_io_uring_enter, n->fd, 0, 0, IORING_ENTER_SQ_WAKEUP, NULL, 0);
	for (i = 0; i < 2000 && __atomic_load_n(NR_U32(n, n->p.cq_off.tail), __ATOMIC_ACQUIRE) == head;
	     i++)
		zdtm_msleep(1);
	if (*NR_U32(n, n->p.cq_off.tail) == head)
		return 0;
	c = (struct io_uring_cqe *)(n->ring + n->p.cq_off.cqes) + (head & (n->p.cq_entries - 1));
	__atomic_store_n(NR_U32(n, n->p.cq_off.head), head + 1, __ATOMIC_RELEASE);
	return c->res ? 0 : c->user_data;
}

/* The CPUs the SQ poll thread may run on ("0-1", "1"), or "". */
static void sqp_cpus(char *out, size_t len)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	char path[300], buf[4096];

	*out = 0;
	while (d && (e = readdir(d))) {
		FILE *f;
		char *l;

		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		l = fgets(buf, sizeof(buf), f);
		fclose(f);
		if (!l || strncmp(buf, "iou-sqp-", 8))
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
		f = fopen(path, "r");
		while (f && fgets(buf, sizeof(buf), f))
			if (!strncmp(buf, "Cpus_allowed_list:", 18))
				snprintf(out, len, "%s", buf + 18 + strspn(buf + 18, " \t"));
		if (f)
			fclose(f);
	}
	if (d)
		closedir(d);
	out[strcspn(out, "\n")] = 0;
}

static int sqpoll_mode(void)
{
	char want[16], got[64];
	unsigned long long ud;
	unsigned i;

	sq_cpu_want = sysconf(_SC_NPROCESSORS_ONLN) > 1 ? 1 : 0;
	nring_setup(&ring_q, 8, 0, IORING_SETUP_SQPOLL | IORING_SETUP_SQ_AFF);
	for (i = 0; i < 5; i++)
		if (sq_served(1, 0xd00 + i) != 0xd00 + i)
			zdtm_die("NOP %u on the SQPOLL ring", i);
	/* Completed, not reaped. */
	nring_nop(&ring_q, 0xd1);
	{
		unsigned tail = *NR_U32(&ring_q, ring_q.p.cq_off.tail);

		syscall(SYS_io_uring_enter, ring_q.fd, 0, 0, IORING_ENTER_SQ_WAKEUP, NULL, 0);
		for (i = 0; i < 2000 && *NR_U32(&ring_q, ring_q.p.cq_off.tail) == tail; i++)
			zdtm_msleep(1);
		if (*NR_U32(&ring_q, ring_q.p.cq_off.tail) == tail)
			zdtm_die("the NOP left unreaped");
	}
	/* Written once the poll thread sleeps, not taken. */
	for (i = 0; i < 2000 && !(*NR_U32(&ring_q, ring_q.p.sq_off.flags) & IORING_SQ_NEED_WAKEUP); i++)
		zdtm_msleep(1);
	if (!(*NR_U32(&ring_q, ring_q.p.sq_off.flags) & IORING_SQ_NEED_WAKEUP))
		zdtm_die("the SQ poll thread does not sleep");
	nring_nop(&ring_q, 0xd2);
	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);
	ZDTM_CORRUPT("sqpoll", {
		unsigned h = *NR_U32(&ring_q, ring_q.p.cq_off.head);

		__atomic_store_n(NR_U32(&ring_q, ring_q.p.cq_off.head), h + 1, __ATOMIC_RELEASE);
	});
	ZDTM_CORRUPT("sqaff", sq_cpu_want ^= 1);
	/* [sqpoll] */
	ud = sq_served(0, 0);
	zdtm_check(ud == 0xd1, "sqpoll", "unreaped completion %#llx", ud);
	ud = sq_served(0, 0);
	zdtm_check(ud == 0xd2, "sqpoll", "the waiting entry gave %#llx", ud);
	for (i = 0; i < 10; i++) {
		ud = sq_served(1, 0xe00 + i);
		if (!zdtm_check(ud == 0xe00 + i, "sqpoll", "NOP %u gave %#llx", i, ud))
			break;
	}
	/* [sqaff] */
	snprintf(want, sizeof(want), "%u", sq_cpu_want);
	sqp_cpus(got, sizeof(got));
	zdtm_check(!strcmp(got, want), "sqaff", "the SQ poll thread runs on CPUs '%s', not %s", got,
		   want);
	zdtm_finish();
	return 0;
}

int main(int argc, char **argv)
{
	unsigned sq_head, sq_tail, cq_head, cq_tail, i;
	unsigned char *file;
	int fd, out, files[3], wait_err = 0;
	static struct nring rb, rc, rw;
	unsigned long wait_eintr = 0;
	struct iovec iov[2] = { { fixed, 4096 }, { fixed + 4096, 4096 } };
	unsigned long long ud;
	int r;

	zdtm_init(argc, argv, 1, "[inflight|issuer|sqpoll|shared|issuer_gone|eventfd|ring_fds]");
	if (argc > 2) {
		if (!strcmp(argv[2], "inflight"))
			return in_flight();
		if (!strcmp(argv[2], "issuer"))
			return issuer_mode();
		if (!strcmp(argv[2], "sqpoll"))
			return sqpoll_mode();
		if (!strcmp(argv[2], "issuer_gone") || !strcmp(argv[2], "shared") ||
		    !strcmp(argv[2], "eventfd") || !strcmp(argv[2], "ring_fds"))
			return refused_ring(argv[2]);
		zdtm_die("unknown mode %s", argv[2]);
	}
	file = malloc(FLEN);
	if (!file)
		zdtm_die("malloc");
	zdtm_fill(file, FLEN, SEED_F);
	fd = open("io_uring.data", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, file, FLEN) != FLEN)
		zdtm_die("io_uring.data");
	out = open("io_uring.out", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (out < 0)
		zdtm_die("io_uring.out");
	setup_ring();
	files[0] = fd;
	files[1] = -1;
	files[2] = out;
	if (syscall(SYS_io_uring_register, ring_fd, IORING_REGISTER_FILES, files, 3))
		zdtm_die("registering files");
	if (syscall(SYS_io_uring_register, ring_fd, IORING_REGISTER_BUFFERS, iov, 2))
		zdtm_die("registering buffers");

	for (i = 0; i < 19; i++) {
		queue(IORING_OP_NOP, 0, -1, 0, 0, 0, 0, 0x100 + i);
		if (run(1, 0x100 + i, 0, "setup"))
			zdtm_die("NOP %u", i);
	}
	queue(IORING_OP_READ_FIXED, IOSQE_FIXED_FILE, 0, (unsigned long)fixed, 4096, 0, 0, 0x200);
	if (run(1, 0x200, 4096, "setup") || memcmp(fixed, file, 4096))
		zdtm_die("the first READ_FIXED");
	zdtm_fill(wbuf, sizeof(wbuf), SEED_F + 1);
	queue(IORING_OP_WRITE, IOSQE_FIXED_FILE, 2, (unsigned long)wbuf, sizeof(wbuf), 0, 0, 0x300);
	if (run(1, 0x300, sizeof(wbuf), "setup"))
		zdtm_die("the WRITE to io_uring.out");

	nring_prepare(&rb, 8, 0, 0);
	nring_prepare(&rc, 1024, 4096, 0);

	/* Completed, not reaped. */
	queue(IORING_OP_NOP, 0, -1, 0, 0, 0, 0, 0xa1);
	queue(IORING_OP_READ, 0, fd, (unsigned long)rbuf, sizeof(rbuf), 4096, 0, 0xa2);
	queue(IORING_OP_READ_FIXED, IOSQE_FIXED_FILE, 0, (unsigned long)(fixed + 4096), 256, 0, 1,
	      0xa3);
	if (enter(3, 3) != 3)
		zdtm_die("submitting the 3 requests left unreaped");
	/* Written, not submitted. */
	queue(IORING_OP_NOP, 0, -1, 0, 0, 0, 0, 0xb1);
	queue(IORING_OP_READ, 0, fd, (unsigned long)rbuf2, sizeof(rbuf2), 8192, 0, 0xb2);
	sq_head = *SQ_U32(p.sq_off.head);
	sq_tail = *SQ_U32(p.sq_off.tail);
	cq_head = *CQ_U32(p.cq_off.head);
	cq_tail = *CQ_U32(p.cq_off.tail);
	if (sq_head != 24 || sq_tail != 26 || cq_head != 21 || cq_tail != 24)
		zdtm_die("positions %u %u %u %u", sq_head, sq_tail, cq_head, cq_tail);

	nring_setup(&rw, 4, 0, 0);

	zdtm_ready();
	while (!zdtm_stop) {
		struct timespec ts = { 0, 50 * 1000 * 1000 };
		struct {
			uint64_t sigmask;
			uint32_t sigmask_sz, min_wait_usec;
			uint64_t ts;
		} arg = { 0, 0, 0, (uintptr_t)&ts };
		long w = syscall(SYS_io_uring_enter, rw.fd, 0, 1,
				 IORING_ENTER_GETEVENTS | ENTER_EXT_ARG, &arg, sizeof(arg));

		if (w < 0 && errno == EINTR && !zdtm_stop)
			wait_eintr++;
		else if (w < 0 && errno != EINTR && errno != ETIME && !wait_err)
			wait_err = errno;
	}
	zdtm_check(!wait_eintr && !wait_err, "wait",
		   "waiting on ring W: %lu EINTR before SIGTERM, error %s", wait_eintr,
		   wait_err ? strerror(wait_err) : "none");

	ZDTM_CORRUPT("cqe", __atomic_store_n(CQ_U32(p.cq_off.head), cq_head + 1, __ATOMIC_RELEASE));
	ZDTM_CORRUPT("sq", {
		enter(1, 0);
	});
	ZDTM_CORRUPT("noarray", nring_one(&rc, 0));
	ZDTM_CORRUPT("fixed", syscall(SYS_io_uring_register, ring_fd, IORING_UNREGISTER_BUFFERS,
				      NULL, 0));
	zdtm_check(*SQ_U32(p.sq_off.head) == sq_head && *SQ_U32(p.sq_off.tail) == sq_tail &&
			   *CQ_U32(p.cq_off.head) == cq_head && *CQ_U32(p.cq_off.tail) == cq_tail,
		   "pos", "positions sq %u/%u cq %u/%u, were %u/%u %u/%u", *SQ_U32(p.sq_off.head),
		   *SQ_U32(p.sq_off.tail), *CQ_U32(p.cq_off.head), *CQ_U32(p.cq_off.tail), sq_head,
		   sq_tail, cq_head, cq_tail);
	{
		static const unsigned long long uds[3] = { 0xa1, 0xa2, 0xa3 };
		static const int res[3] = { 0, 512, 256 };

		for (i = 0; i < 3; i++) {
			r = reap(&ud);
			zdtm_check(r == res[i] && ud == uds[i], "cqe",
				   "unreaped completion %u: user_data %#llx res %d, expected %#llx %d",
				   i, ud, r, uds[i], res[i]);
		}
		zdtm_check(!memcmp(rbuf, file + 4096, sizeof(rbuf)), "cqe", "rbuf: other bytes");
		zdtm_check(!memcmp(fixed + 4096, file, 256), "cqe", "buffer 1: other bytes");
	}
	r = (int)enter(2, 2);
	if (zdtm_check(r == 2, "sq", "submitting the 2 waiting entries: %d (%s)", r,
		       r < 0 ? strerror(errno) : "")) {
		r = reap(&ud);
		zdtm_check(r == 0 && ud == 0xb1, "sq", "NOP: user_data %#llx res %d", ud, r);
		r = reap(&ud);
		zdtm_check(r == 512 && ud == 0xb2, "sq", "READ: user_data %#llx res %d", ud, r);
	}
	zdtm_check(!memcmp(rbuf2, file + 8192, sizeof(rbuf2)), "sq", "rbuf2: other bytes");
	memset(fixed + 4096, 0, 4096);
	queue(IORING_OP_READ_FIXED, IOSQE_FIXED_FILE, 0, (unsigned long)(fixed + 4096), 4096, 12288,
	      1, 0x400);
	if (!run(1, 0x400, 4096, "fixed"))
		zdtm_check(!memcmp(fixed + 4096, file + 12288, 4096), "fixed",
			   "READ_FIXED into buffer 1: other bytes");
	queue(IORING_OP_WRITE_FIXED, IOSQE_FIXED_FILE, 2, (unsigned long)fixed, 4096, sizeof(wbuf),
	      0, 0x500);
	if (!run(1, 0x500, 4096, "fixed")) {
		ssize_t got = pread(out, outbuf, sizeof(outbuf), 0);

		zdtm_check(got == (ssize_t)sizeof(outbuf) && !memcmp(outbuf, wbuf, sizeof(wbuf)) &&
				   !memcmp(outbuf + sizeof(wbuf), fixed, 4096),
			   "fixed", "io_uring.out gave %zd bytes, or other bytes", got);
	}
	queue(IORING_OP_READ, IOSQE_FIXED_FILE, 1, (unsigned long)rbuf, 16, 0, 0, 0x600);
	run(1, 0x600, -EBADF, "fixed");
	for (i = 0; i < 20; i++) {
		queue(IORING_OP_NOP, 0, -1, 0, 0, 0, 0, 0x700 + i);
		if (run(1, 0x700 + i, 0, "nop"))
			break;
	}
	zdtm_check(*(volatile unsigned *)(sq_ring + p.cq_off.tail) == *CQ_U32(p.cq_off.tail) &&
			   (void *)cq_ring != (void *)sq_ring,
		   "alias", "the CQ tail reads %u through the SQ ring's mapping, %u through the CQ's",
		   *(volatile unsigned *)(sq_ring + p.cq_off.tail), *CQ_U32(p.cq_off.tail));
	nring_check(&rb, "B");
	nring_check(&rc, "C");
	zdtm_finish();
	return 0;
}
