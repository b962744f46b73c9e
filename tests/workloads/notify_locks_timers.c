/*
 * notify_locks_timers.c - inotify watches (with a watch-descriptor gap),
 * flock / POSIX / OFD locks, POSIX timers at non-zero ids and an itimer.
 *
 *   notify_locks_timers PIDFILE
 *
 * Set up before "ready" (one process; files in the cwd, recreated):
 *   inotify   ifd = inotify_init1(IN_NONBLOCK|IN_CLOEXEC) with three watches:
 *             wd_a on notify_locks_timers.wa (IN_MODIFY|IN_CLOSE_WRITE),
 *             wd_b on notify_locks_timers.wb (IN_MODIFY|IN_ATTRIB), then
 *             removed again, and wd_d on the directory notify_locks_timers.d
 *             (IN_CREATE|IN_DELETE|IN_ONLYDIR): wds 1 and 3 with a gap at 2.
 *             The IN_IGNORED event of the removal is read at setup, so the
 *             queue is empty.
 *   flock     notify_locks_timers.flock: LOCK_EX on fd fl_ex;
 *             notify_locks_timers.flock-sh: LOCK_SH on fd fl_sh.
 *   POSIX     notify_locks_timers.posix (fd px, O_RDWR): F_SETLK F_WRLCK on
 *             [100, 200) and F_RDLCK on [300, 400).
 *   OFD       notify_locks_timers.ofd (fd of, O_RDWR): F_OFD_SETLK F_WRLCK
 *             on [0, 50) and F_RDLCK on [1000, 1100).
 *   timers    3 POSIX timers created and deleted (burnt ids), then
 *             ptimer: CLOCK_MONOTONIC, SIGEV_SIGNAL|SIGEV_THREAD_ID (the main
 *             thread) SIGRTMIN+2, sigev_value
 *             PT_VALUE (64 bits), periodic 10 ms;
 *             otimer: CLOCK_MONOTONIC, SIGEV_NONE (signo SIGUSR2, value
 *             OT_VALUE recorded by the kernel anyway), one-shot in 1000 s.
 *             Their ids (from /proc/self/timers) are non-zero and saved.
 *   itimer    ITIMER_REAL: value 2000 s, interval 3 s (SIGALRM is counted
 *             and must never come).
 * The SIGRTMIN+2 handler (SA_SIGINFO|SA_RESTART) counts timer signals, and
 * any signal without si_code SI_TIMER, the value or ptimer's id as "bad".
 * The loop sleeps 100 ms at a time (interrupted by the 10 ms timer).
 *
 * After SIGTERM (tags in brackets):
 *   [inotify-watches] fdinfo of ifd lists exactly wd_a and wd_d, on the
 *             current inodes of their paths, with their masks; ifd keeps
 *             FD_CLOEXEC and O_NONBLOCK;
 *   [inotify-queue]   no event queued (FIONREAD 0, read gives EAGAIN);
 *   [inotify-events]  writing .wb (unwatched now) gives nothing; appending
 *             to .wa gives IN_MODIFY then IN_CLOSE_WRITE with wd_a;
 *             creating and unlinking .d/new gives IN_CREATE and IN_DELETE
 *             "new" with wd_d; exactly these 4 events (5 s deadline);
 *   [inotify-next-wd] a new watch (on .wn) gets wd_d + 1, as the kernel's
 *             cyclic allocator would have given the original;
 *   [flock]   fdinfo of fl_ex: one FLOCK WRITE lock (its pid is not
 *             checked: see check_flocks()); a second open file
 *             description gets EWOULDBLOCK for LOCK_SH and LOCK_EX;
 *   [flock-sh] fdinfo of fl_sh: one FLOCK READ lock; a second description
 *             gets LOCK_SH but EWOULDBLOCK for LOCK_EX;
 *   [posix]   fdinfo of px: exactly POSIX WRITE 100-199 and POSIX READ
 *             300-399 held by our pid; a child forked now (not part of the
 *             dumped tree) sees with F_GETLK: a write query on [100, 200)
 *             -> F_WRLCK 100/100 by our pid, a write query on [300, 400)
 *             -> F_RDLCK 300/100 by our pid, a read query on [300, 400) and a
 *             write query on [200, 300) -> F_UNLCK;
 *   [ofd]     fdinfo of of: exactly OFDLCK WRITE 0-49 and OFDLCK READ
 *             1000-1099 (pid -1); F_OFD_GETLK from a second description:
 *             write query [0, 50) -> F_WRLCK 0/50 pid -1, write query
 *             [1000, 1100) -> F_RDLCK, read query [1000, 1100) and write
 *             query [50, 1000) -> F_UNLCK;
 *   [timer-id] /proc/self/timers lists exactly the two saved ids: ptimer
 *             with signal SIGRTMIN+2 / PT_VALUE, notify signal/tid.<pid>
 *             (directed at the main thread, SIGEV_THREAD_ID),
 *             clock 1; otimer with SIGUSR2 / OT_VALUE, notify none/pid.<pid>,
 *             clock 1;
 *   [timer-value] every timer signal so far had SI_TIMER, PT_VALUE and
 *             ptimer's id;
 *   [timer-fire] timer_gettime(ptimer): interval exactly 10 ms, value in
 *             (0, 10 ms]; at least 20 more signals arrive (5 s deadline);
 *   [oneshot] timer_gettime(otimer): no interval, value in
 *             [1000 s - elapsed - 1 s, 1000 s] (elapsed = since arming);
 *   [itimer]  getitimer(ITIMER_REAL): interval exactly 3 s, value in
 *             [2000 s - elapsed - 1 s, 2000 s]; no SIGALRM ever came.
 */
#include "zdtm.h"

#include <poll.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/time.h>

#define F_WA     "notify_locks_timers.wa"
#define F_WB     "notify_locks_timers.wb"
#define F_WN     "notify_locks_timers.wn"
#define F_WN2    "notify_locks_timers.wn2"
#define F_D      "notify_locks_timers.d"
#define NEW_NAME "new"
#define F_DNEW   F_D "/" NEW_NAME
#define F_FLEX   "notify_locks_timers.flock"
#define F_FLSH   "notify_locks_timers.flock-sh"
#define F_POSIX  "notify_locks_timers.posix"
#define F_OFD    "notify_locks_timers.ofd"

#define MASK_A (IN_MODIFY | IN_CLOSE_WRITE)
#define MASK_B (IN_MODIFY | IN_ATTRIB)
#define MASK_D (IN_CREATE | IN_DELETE)

#define FILE_LEN   4096
#define SEED_FILE  0x6e6c7466696c6500ull

#define PT_PERIOD_NS (10 * 1000000l)
#define PT_VALUE     0x5eed7133c0ffee42ull
#define OT_VALUE     0x0000000000000077ull
#define OT_SECS      1000
#define IT_SECS      2000
#define IT_INTERVAL  3
#define MIN_FIRES    20
#define FIRE_MS      (ZDTM_SELFTEST ? 1000 : 5000)
#define EVENT_MS     (ZDTM_SELFTEST ? 1000 : 5000)
#define CHILD_MS     20000

static int ifd, wd_a, wd_b, wd_d;
static int fl_ex, fl_sh, px, of;
static timer_t ptimer, otimer;
static int pt_id, ot_id; /* kernel ids, from /proc/self/timers */
static int64_t t_armed;  /* CLOCK_MONOTONIC when otimer/itimer were armed */
static int sig_pt;

static volatile sig_atomic_t fires, bad_fires, alarms;
static volatile sig_atomic_t bad_code, bad_id;
static volatile uint64_t bad_value;

/* ------------------------------------------------------------------ */
/* helpers                                                             */

static void on_timer(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	if (si->si_code == SI_TIMER &&
	    (uint64_t)(uintptr_t)si->si_value.sival_ptr == PT_VALUE &&
	    si->si_timerid == pt_id) {
		fires += 1 + (si->si_overrun > 0 ? si->si_overrun : 0);
	} else {
		bad_fires++;
		bad_code = si->si_code;
		bad_id = si->si_timerid;
		bad_value = (uint64_t)(uintptr_t)si->si_value.sival_ptr;
	}
}

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

static void make_file(const char *name)
{
	static uint8_t buf[FILE_LEN];
	int fd = open(name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	if (fd < 0)
		zdtm_die("create %s", name);
	zdtm_fill(buf, FILE_LEN, SEED_FILE);
	if (write(fd, buf, FILE_LEN) != FILE_LEN)
		zdtm_die("write %s", name);
	close(fd);
}

static int open_rw(const char *name)
{
	int fd = open(name, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		zdtm_die("open %s", name);
	return fd;
}

static int setlk(int fd, int cmd, short type, off_t start, off_t len)
{
	struct flock l;

	memset(&l, 0, sizeof(l));
	l.l_type = type;
	l.l_whence = SEEK_SET;
	l.l_start = start;
	l.l_len = len;
	return fcntl(fd, cmd, &l);
}

/* F_GETLK / F_OFD_GETLK of `type` on [start, start+len). */
static int getlk(int fd, int cmd, short type, off_t start, off_t len,
		 struct flock *out)
{
	memset(out, 0, sizeof(*out));
	out->l_type = type;
	out->l_whence = SEEK_SET;
	out->l_start = start;
	out->l_len = len;
	return fcntl(fd, cmd, out);
}

static const char *ltype(int t)
{
	return t == F_WRLCK ? "F_WRLCK" : t == F_RDLCK ? "F_RDLCK" :
	       t == F_UNLCK ? "F_UNLCK" : "?";
}

/* Touching a file: append n bytes and close. */
static int append(const char *name, size_t n)
{
	uint8_t b[64];
	int fd = open(name, O_WRONLY | O_APPEND | O_CLOEXEC);
	ssize_t w;

	if (fd < 0)
		return -1;
	memset(b, 0x5a, sizeof(b));
	w = write(fd, b, n);
	close(fd);
	return w == (ssize_t)n ? 0 : -1;
}

/* ------------------------------------------------------------------ */
/* /proc/self/timers                                                   */

struct ptimer_info {
	int id, signo, pid, clock;
	unsigned long long value;
	char notify[16], target[8];
};

static int read_timers(struct ptimer_info *t, int max)
{
	static char buf[8192];
	char *p, *line;
	int n = -1;

	if (zdtm_read_text("/proc/self/timers", buf, sizeof(buf)) < 0)
		return -1;
	for (line = strtok_r(buf, "\n", &p); line;
	     line = strtok_r(NULL, "\n", &p)) {
		int id;

		if (sscanf(line, "ID: %d", &id) == 1) {
			if (++n >= max)
				return max + 1;
			memset(&t[n], 0, sizeof(t[n]));
			t[n].id = id;
			t[n].signo = t[n].pid = t[n].clock = -1;
		} else if (n < 0) {
			continue;
		} else if (strncmp(line, "signal:", 7) == 0) {
			sscanf(line, "signal: %d/%llx", &t[n].signo,
			       &t[n].value);
		} else if (strncmp(line, "notify:", 7) == 0) {
			sscanf(line, "notify: %15[^/]/%7[^.].%d", t[n].notify,
			       t[n].target, &t[n].pid);
		} else if (strncmp(line, "ClockID:", 8) == 0) {
			sscanf(line, "ClockID: %d", &t[n].clock);
		}
	}
	return n + 1;
}

static const struct ptimer_info *find_timer(const struct ptimer_info *t,
					    int n, int id)
{
	int i;

	for (i = 0; i < n; i++)
		if (t[i].id == id)
			return &t[i];
	return NULL;
}

static void check_timer_info(const struct ptimer_info *t, int n, int id,
			     const char *what, int signo,
			     unsigned long long value, const char *notify,
			     const char *target)
{
	const struct ptimer_info *i = find_timer(t, n, id);

	if (!zdtm_check(i, "timer-id", "%s: id %d not in /proc/self/timers",
			what, id))
		return;
	zdtm_check(i->signo == signo && i->clock == CLOCK_MONOTONIC &&
		   strcmp(i->notify, notify) == 0 &&
		   strcmp(i->target, target) == 0 && i->pid == getpid(),
		   "timer-id", "%s (id %d): signal %d, notify %s/%s.%d, clock "
		   "%d; expected signal %d, notify %s/%s.%d, clock %d", what,
		   id, i->signo, i->notify, i->target, i->pid, i->clock, signo,
		   notify, target, (int)getpid(), CLOCK_MONOTONIC);
	zdtm_check(i->value == value, "timer-value", "%s (id %d): sigev_value "
		   "%#llx, expected %#llx", what, id, i->value, value);
}

/* ------------------------------------------------------------------ */
/* locks in fdinfo                                                     */

/* lock_line.pid that matches any pid */
#define PID_ANY INT_MIN

struct lock_line {
	char kind[16], mode[16];
	int pid;
	long long start;
	char end[24];
};

static int fd_locks(int fd, struct lock_line *l, int max)
{
	char buf[4096], *p;
	int n = 0;

	if (zdtm_fdinfo(fd, buf, sizeof(buf)) <= 0)
		return -1;
	for (p = strstr(buf, "lock:"); p; p = strstr(p + 1, "lock:")) {
		long long id;
		char adv[16];
		unsigned maj, min;
		unsigned long ino;

		if (n >= max)
			return max + 1;
		memset(&l[n], 0, sizeof(l[n]));
		if (sscanf(p, "lock: %lld: %15s %15s %15s %d %x:%x:%lu %lld "
			   "%23s", &id, l[n].kind, adv, l[n].mode, &l[n].pid,
			   &maj, &min, &ino, &l[n].start, l[n].end) != 10)
			snprintf(l[n].kind, sizeof(l[n].kind), "unparsable");
		n++;
	}
	return n;
}

/* fdinfo of fd must list exactly the locks want[0..nwant) (any order). */
static void check_fd_locks(const char *tag, const char *what, int fd,
			   const struct lock_line *want, int nwant)
{
	struct lock_line got[8];
	int n = fd_locks(fd, got, 8), i, j, seen[8] = { 0 };

	if (!zdtm_check(n == nwant, tag, "%s (fd %d): %d locks in fdinfo, "
			"expected %d", what, fd, n, nwant) && n < 0)
		return;
	if (n > 8)
		n = 8;
	for (i = 0; i < n; i++) {
		for (j = 0; j < nwant; j++)
			if (!seen[j] && strcmp(got[i].kind, want[j].kind) == 0 &&
			    strcmp(got[i].mode, want[j].mode) == 0 &&
			    (want[j].pid == PID_ANY ||
			     got[i].pid == want[j].pid) &&
			    got[i].start == want[j].start &&
			    strcmp(got[i].end, want[j].end) == 0)
				break;
		if (j < nwant)
			seen[j] = 1;
		else
			zdtm_fail(tag, "%s (fd %d): unexpected lock %s %s pid "
				  "%d %lld-%s", what, fd, got[i].kind,
				  got[i].mode, got[i].pid, got[i].start,
				  got[i].end);
	}
	for (j = 0; j < nwant; j++)
		zdtm_check(seen[j], tag, "%s (fd %d): lock %s %s pid %d "
			   "%lld-%s missing", what, fd, want[j].kind,
			   want[j].mode, want[j].pid, want[j].start,
			   want[j].end);
}

/* ------------------------------------------------------------------ */
/* the POSIX lock checker child (forked at verification time only)     */

#define C_WR   0x01
#define C_RD   0x02
#define C_FREE 0x04
#define C_INT  0x08

static void cfail(const char *tag, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	zdtm_child_vfail("posix checker", tag, fmt, ap);
	va_end(ap);
}

static int child_getlk(int fd, short type, off_t start, off_t len,
		       short want_type, off_t want_start, off_t want_len,
		       pid_t want_pid, const char *what)
{
	struct flock l;

	if (getlk(fd, F_GETLK, type, start, len, &l)) {
		cfail("posix", "%s: F_GETLK: errno %d", what, errno);
		return 1;
	}
	if (l.l_type != want_type ||
	    (want_type != F_UNLCK &&
	     (l.l_start != want_start || l.l_len != want_len ||
	      l.l_pid != want_pid))) {
		cfail("posix", "%s: F_GETLK says %s start %lld len %lld pid %d, "
		      "expected %s start %lld len %lld pid %d", what,
		      ltype(l.l_type), (long long)l.l_start,
		      (long long)l.l_len, (int)l.l_pid, ltype(want_type),
		      (long long)want_start, (long long)want_len,
		      (int)want_pid);
		return 1;
	}
	return 0;
}

__attribute__((noreturn))
static void posix_checker(pid_t parent)
{
	int fd = open(F_POSIX, O_RDWR | O_CLOEXEC), bits = 0;

	if (fd < 0) {
		cfail("posix", "open %s: errno %d", F_POSIX, errno);
		_exit(C_INT);
	}
	if (child_getlk(fd, F_WRLCK, 100, 100, F_WRLCK, 100, 100, parent,
			"write query [100, 200)"))
		bits |= C_WR;
	if (child_getlk(fd, F_WRLCK, 300, 100, F_RDLCK, 300, 100, parent,
			"write query [300, 400)"))
		bits |= C_RD;
	if (child_getlk(fd, F_RDLCK, 300, 100, F_UNLCK, 0, 0, 0,
			"read query [300, 400)"))
		bits |= C_RD;
	if (child_getlk(fd, F_WRLCK, 200, 100, F_UNLCK, 0, 0, 0,
			"write query [200, 300)"))
		bits |= C_FREE;
	_exit(bits);
}

/* ------------------------------------------------------------------ */
/* setup                                                               */

static void setup_inotify(void)
{
	char buf[4096] __attribute__((aligned(8)));
	struct inotify_event *ev = (struct inotify_event *)buf;
	ssize_t n;

	make_file(F_WA);
	make_file(F_WB);
	unlink(F_WN);
	unlink(F_WN2);
	unlink(F_DNEW);
	rmdir(F_D);
	if (mkdir(F_D, 0755))
		zdtm_die("mkdir %s", F_D);

	ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (ifd < 0)
		zdtm_die("inotify_init1");
	wd_a = inotify_add_watch(ifd, F_WA, MASK_A);
	wd_b = inotify_add_watch(ifd, F_WB, MASK_B);
	wd_d = inotify_add_watch(ifd, F_D, MASK_D | IN_ONLYDIR);
	if (wd_a < 0 || wd_b < 0 || wd_d < 0)
		zdtm_die("inotify_add_watch");
	if (!(wd_a < wd_b && wd_b < wd_d)) {
		errno = EINVAL;
		zdtm_die("watch descriptors %d %d %d not increasing", wd_a,
			 wd_b, wd_d);
	}
	if (inotify_rm_watch(ifd, wd_b))
		zdtm_die("inotify_rm_watch");
	/* exactly the IN_IGNORED of wd_b, then nothing */
	do
		n = read(ifd, buf, sizeof(buf));
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof(*ev) || ev->wd != wd_b ||
	    ev->mask != IN_IGNORED)
		zdtm_die("reading IN_IGNORED of wd %d (read %zd)", wd_b, n);
	n = read(ifd, buf, sizeof(buf));
	if (n >= 0 || errno != EAGAIN)
		zdtm_die("inotify queue not empty after setup");
}

static void setup_locks(void)
{
	make_file(F_FLEX);
	make_file(F_FLSH);
	make_file(F_POSIX);
	make_file(F_OFD);

	fl_ex = open_rw(F_FLEX);
	if (flock(fl_ex, LOCK_EX | LOCK_NB))
		zdtm_die("flock LOCK_EX");
	fl_sh = open_rw(F_FLSH);
	if (flock(fl_sh, LOCK_SH | LOCK_NB))
		zdtm_die("flock LOCK_SH");
	px = open_rw(F_POSIX);
	if (setlk(px, F_SETLK, F_WRLCK, 100, 100) ||
	    setlk(px, F_SETLK, F_RDLCK, 300, 100))
		zdtm_die("F_SETLK");
	of = open_rw(F_OFD);
	if (setlk(of, F_OFD_SETLK, F_WRLCK, 0, 50) ||
	    setlk(of, F_OFD_SETLK, F_RDLCK, 1000, 100))
		zdtm_die("F_OFD_SETLK");
}

static int timer_id_of(timer_t t, const struct ptimer_info *before, int nb)
{
	struct ptimer_info after[16];
	int na = read_timers(after, 16), i;

	(void)t;
	for (i = 0; i < na && i < 16; i++)
		if (!find_timer(before, nb, after[i].id))
			return after[i].id;
	return -1;
}

static void setup_timers(void)
{
	struct sigaction sa;
	struct sigevent sev;
	struct itimerspec its;
	struct itimerval itv;
	struct ptimer_info before[16];
	timer_t burn[3];
	sigset_t rt;
	int i, nb;

	sig_pt = SIGRTMIN + 2;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_timer;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	if (sigaction(sig_pt, &sa, NULL))
		zdtm_die("sigaction timer signal");
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGALRM, &sa, NULL))
		zdtm_die("sigaction SIGALRM");

	/* burn a few ids */
	memset(&sev, 0, sizeof(sev));
	sev.sigev_notify = SIGEV_NONE;
	for (i = 0; i < 3; i++)
		if (timer_create(CLOCK_MONOTONIC, &sev, &burn[i]))
			zdtm_die("timer_create (burn %d)", i);
	for (i = 0; i < 3; i++)
		if (timer_delete(burn[i]))
			zdtm_die("timer_delete (burn %d)", i);

	/* the periodic one: its signal blocked until its id is known */
	sigemptyset(&rt);
	sigaddset(&rt, sig_pt);
	sigprocmask(SIG_BLOCK, &rt, NULL);
	nb = read_timers(before, 16);
	memset(&sev, 0, sizeof(sev));
	/* directed at this thread (the only one: its tid is the pid), as
	 * glibc's SIGEV_THREAD helper does (zdtm's pthread_timers) */
	sev.sigev_notify = SIGEV_SIGNAL | SIGEV_THREAD_ID;
	sev._sigev_un._tid = getpid(); /* sigev_notify_thread_id */
	sev.sigev_signo = sig_pt;
	sev.sigev_value.sival_ptr = (void *)(uintptr_t)PT_VALUE;
	if (timer_create(CLOCK_MONOTONIC, &sev, &ptimer))
		zdtm_die("timer_create periodic");
	pt_id = timer_id_of(ptimer, before, nb);

	nb = read_timers(before, 16);
	memset(&sev, 0, sizeof(sev));
	sev.sigev_notify = SIGEV_NONE;
	sev.sigev_signo = SIGUSR2;
	sev.sigev_value.sival_ptr = (void *)(uintptr_t)OT_VALUE;
	if (timer_create(CLOCK_MONOTONIC, &sev, &otimer))
		zdtm_die("timer_create one-shot");
	ot_id = timer_id_of(otimer, before, nb);
	if (pt_id <= 0 || ot_id <= 0 || pt_id == ot_id) {
		errno = EINVAL;
		zdtm_die("timer ids %d / %d (expected non-zero, distinct)",
			 pt_id, ot_id);
	}

	memset(&its, 0, sizeof(its));
	its.it_interval.tv_nsec = PT_PERIOD_NS;
	its.it_value.tv_nsec = PT_PERIOD_NS;
	if (timer_settime(ptimer, 0, &its, NULL))
		zdtm_die("timer_settime periodic");
	memset(&its, 0, sizeof(its));
	its.it_value.tv_sec = OT_SECS;
	t_armed = zdtm_now_ns();
	if (timer_settime(otimer, 0, &its, NULL))
		zdtm_die("timer_settime one-shot");
	memset(&itv, 0, sizeof(itv));
	itv.it_value.tv_sec = IT_SECS;
	itv.it_interval.tv_sec = IT_INTERVAL;
	if (setitimer(ITIMER_REAL, &itv, NULL))
		zdtm_die("setitimer");
	sigprocmask(SIG_UNBLOCK, &rt, NULL);
}

/* ------------------------------------------------------------------ */
/* checks                                                              */

static void check_inotify(void)
{
	char buf[4096] __attribute__((aligned(8))), *p;
	struct stat sa_, sd;
	int n, nread = -1, seen_a = 0, seen_d = 0, entries = 0, fl, wd;
	ssize_t r;

	/* watches in fdinfo */
	ZDTM_CORRUPT("inotify-watches", inotify_rm_watch(ifd, wd_a));
	fl = fcntl(ifd, F_GETFL);
	n = fcntl(ifd, F_GETFD);
	zdtm_check(fl >= 0 && (fl & O_NONBLOCK) && n >= 0 && (n & FD_CLOEXEC),
		   "inotify-watches", "inotify fd %d: F_GETFL %#x F_GETFD %#x, "
		   "expected O_NONBLOCK and FD_CLOEXEC", ifd, fl, n);
	if (stat(F_WA, &sa_) || stat(F_D, &sd))
		zdtm_die("stat watched files");
	if (zdtm_check(zdtm_fdinfo(ifd, buf, sizeof(buf)) > 0, "inotify-watches",
		       "fdinfo of inotify fd %d unreadable", ifd)) {
		for (p = strstr(buf, "inotify wd:"); p;
		     p = strstr(p + 1, "inotify wd:")) {
			unsigned w, mask, ign, sdev;
			unsigned long ino;
			int ok;

			entries++;
			if (sscanf(p, "inotify wd:%x ino:%lx sdev:%x mask:%x "
				   "ignored_mask:%x", &w, &ino, &sdev, &mask,
				   &ign) != 5) {
				zdtm_fail("inotify-watches", "unparsable "
					  "fdinfo line: %.60s", p);
				continue;
			}
			mask &= IN_ALL_EVENTS;
			if ((int)w == wd_a) {
				seen_a++;
				ok = ino == sa_.st_ino && mask == MASK_A;
			} else if ((int)w == wd_d) {
				seen_d++;
				ok = ino == sd.st_ino && mask == MASK_D;
			} else {
				zdtm_fail("inotify-watches", "unexpected watch "
					  "wd %u (ino %lu mask %#x)", w, ino,
					  mask);
				continue;
			}
			zdtm_check(ok, "inotify-watches", "wd %u: ino %lu "
				   "mask %#x, expected ino %lu mask %#x", w,
				   ino, mask,
				   (unsigned long)((int)w == wd_a ?
						   sa_.st_ino : sd.st_ino),
				   (int)w == wd_a ? MASK_A : MASK_D);
		}
		zdtm_check(seen_a == 1 && seen_d == 1 && entries == 2,
			   "inotify-watches", "fdinfo lists %d watches, wd %d "
			   "%d times, wd %d %d times; expected exactly one each "
			   "(wd %d removed)", entries, wd_a, seen_a, wd_d,
			   seen_d, wd_b);
	}

	/* nothing queued */
	ZDTM_CORRUPT("inotify-queue", append(F_WA, 1));
	zdtm_check(ioctl(ifd, FIONREAD, &nread) == 0 && nread == 0,
		   "inotify-queue", "FIONREAD %d, expected 0", nread);
	do
		r = read(ifd, buf, sizeof(buf));
	while (r < 0 && errno == EINTR);
	if (!zdtm_check(r < 0 && errno == EAGAIN, "inotify-queue",
			"read gives %zd (%s), expected EAGAIN", r,
			r < 0 ? strerror(errno) : "events")) {
		for (p = buf; r > 0 && p < buf + r;) {
			struct inotify_event *ev = (struct inotify_event *)p;

			zdtm_fail("inotify-queue", "queued event wd %d mask "
				  "%#x name '%s'", ev->wd, ev->mask,
				  ev->len ? ev->name : "");
			p += sizeof(*ev) + ev->len;
		}
		/* drain, so that [inotify-events] judges only its own */
		while (read(ifd, buf, sizeof(buf)) > 0)
			;
	}

	/* fresh events */
	ZDTM_CORRUPT("inotify-events", inotify_add_watch(ifd, F_WA, IN_ATTRIB));
	{
		struct {
			int wd;
			uint32_t mask;
			const char *name;
		} want[] = {
			{ wd_a, IN_MODIFY, "" },
			{ wd_a, IN_CLOSE_WRITE, "" },
			{ wd_d, IN_CREATE, NEW_NAME },
			{ wd_d, IN_DELETE, NEW_NAME },
		};
		int got = 0, fd, k;
		int64_t end = zdtm_now_ns() + (int64_t)EVENT_MS * 1000000ll;

		zdtm_check(append(F_WB, 3) == 0 && append(F_WA, 10) == 0,
			   "inotify-events", "appending to %s / %s: %s",
			   F_WB, F_WA, strerror(errno));
		fd = open(F_DNEW, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
			  0644);
		zdtm_check(fd >= 0, "inotify-events", "create %s: %s", F_DNEW,
			   strerror(errno));
		if (fd >= 0)
			close(fd);
		zdtm_check(unlink(F_DNEW) == 0, "inotify-events", "unlink "
			   "%s: %s", F_DNEW, strerror(errno));
		while (got < 5 && zdtm_now_ns() < end) {
			struct pollfd pf = { .fd = ifd, .events = POLLIN };

			/* after all 4, wait 100 ms for an unexpected 5th */
			if (got >= 4)
				end = zdtm_now_ns() + 100 * 1000000ll < end ?
				      zdtm_now_ns() + 100 * 1000000ll : end;
			if (poll(&pf, 1, 50) <= 0)
				continue;
			r = read(ifd, buf, sizeof(buf));
			if (r <= 0)
				continue;
			for (p = buf; p < buf + r; got++) {
				struct inotify_event *ev =
					(struct inotify_event *)p;
				const char *name = ev->len ? ev->name : "";

				p += sizeof(*ev) + ev->len;
				if (!zdtm_check(got < 4, "inotify-events",
						"extra event %d: wd %d mask "
						"%#x name '%s'", got + 1,
						ev->wd, ev->mask, name))
					continue;
				zdtm_check(ev->wd == want[got].wd &&
					   ev->mask == want[got].mask &&
					   strcmp(name, want[got].name) == 0,
					   "inotify-events", "event %d: wd %d "
					   "mask %#x name '%s', expected wd %d "
					   "mask %#x name '%s'", got + 1,
					   ev->wd, ev->mask, name,
					   want[got].wd, want[got].mask,
					   want[got].name);
			}
		}
		zdtm_check(got >= 4, "inotify-events", "only %d of 4 events "
			   "within %d ms", got, EVENT_MS);
		for (k = got; k < 4; k++)
			zdtm_fail("inotify-events", "missing event wd %d mask "
				  "%#x name '%s'", want[k].wd, want[k].mask,
				  want[k].name);
	}

	/* the next watch descriptor */
	ZDTM_CORRUPT("inotify-next-wd", {
		make_file(F_WN2);
		inotify_add_watch(ifd, F_WN2, IN_MODIFY);
	});
	make_file(F_WN);
	wd = inotify_add_watch(ifd, F_WN, IN_MODIFY);
	zdtm_check(wd == wd_d + 1, "inotify-next-wd", "a new watch got wd %d "
		   "(%s), expected %d", wd, wd < 0 ? strerror(errno) : "ok",
		   wd_d + 1);
}

static void check_flocks(void)
{
	struct lock_line lex[] = { { "FLOCK", "WRITE", 0, 0, "EOF" } };
	struct lock_line lsh[] = { { "FLOCK", "READ", 0, 0, "EOF" } };
	int fd, r, e;

	/*
	 * The pid of a FLOCK lock in fdinfo (and /proc/locks) is the process
	 * that called flock(): ours, before and after a restore.
	 */
	lex[0].pid = getpid();
	lsh[0].pid = getpid();

	ZDTM_CORRUPT("flock", flock(fl_ex, LOCK_UN));
	check_fd_locks("flock", F_FLEX, fl_ex, lex, 1);
	fd = open(F_FLEX, O_RDONLY | O_CLOEXEC);
	if (zdtm_check(fd >= 0, "flock", "open %s: %s", F_FLEX,
		       strerror(errno))) {
		r = flock(fd, LOCK_SH | LOCK_NB);
		e = errno;
		zdtm_check(r < 0 && e == EWOULDBLOCK, "flock", "%s: LOCK_SH "
			   "from a second description: %d (%s), expected "
			   "EWOULDBLOCK", F_FLEX, r, r ? strerror(e) : "ok");
		r = flock(fd, LOCK_EX | LOCK_NB);
		e = errno;
		zdtm_check(r < 0 && e == EWOULDBLOCK, "flock", "%s: LOCK_EX "
			   "from a second description: %d (%s), expected "
			   "EWOULDBLOCK", F_FLEX, r, r ? strerror(e) : "ok");
		close(fd);
	}

	ZDTM_CORRUPT("flock-sh", flock(fl_sh, LOCK_EX | LOCK_NB));
	check_fd_locks("flock-sh", F_FLSH, fl_sh, lsh, 1);
	fd = open(F_FLSH, O_RDONLY | O_CLOEXEC);
	if (zdtm_check(fd >= 0, "flock-sh", "open %s: %s", F_FLSH,
		       strerror(errno))) {
		r = flock(fd, LOCK_EX | LOCK_NB);
		e = errno;
		zdtm_check(r < 0 && e == EWOULDBLOCK, "flock-sh", "%s: LOCK_EX "
			   "from a second description: %d (%s), expected "
			   "EWOULDBLOCK", F_FLSH, r, r ? strerror(e) : "ok");
		r = flock(fd, LOCK_SH | LOCK_NB);
		e = errno;
		zdtm_check(r == 0, "flock-sh", "%s: LOCK_SH from a second "
			   "description: %s, expected success", F_FLSH,
			   r ? strerror(e) : "ok");
		close(fd);
	}
}

static void check_posix(void)
{
	struct lock_line want[] = {
		{ "POSIX", "WRITE", 0, 100, "199" },
		{ "POSIX", "READ", 0, 300, "399" },
	};
	pid_t c;
	int st, code;

	want[0].pid = want[1].pid = getpid();
	ZDTM_CORRUPT("posix", setlk(px, F_SETLK, F_UNLCK, 100, 100));
	check_fd_locks("posix", F_POSIX, px, want, 2);

	fflush(stdout);
	c = fork();
	if (!zdtm_check(c >= 0, "posix", "fork: %s", strerror(errno)))
		return;
	if (c == 0)
		posix_checker(getppid());
	if (zdtm_wait_deadline(c, &st, CHILD_MS)) {
		zdtm_fail("posix", "waitpid(checker %d): %s", (int)c,
			  strerror(errno));
		kill(c, SIGKILL);
		waitpid(c, &st, 0);
		return;
	}
	code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	zdtm_check(code == 0, "posix", "checker child %d: %s %d (bits: "
		   "%s%s%s%s; details on stderr)", (int)c,
		   WIFEXITED(st) ? "exit status" : "killed by signal",
		   WIFEXITED(st) ? code : WTERMSIG(st),
		   code > 0 && (code & C_WR) ? "write-lock " : "",
		   code > 0 && (code & C_RD) ? "read-lock " : "",
		   code > 0 && (code & C_FREE) ? "unlocked-range " : "",
		   code > 0 && (code & C_INT) ? "internal" : "");
}

static void check_ofd(void)
{
	struct lock_line want[] = {
		{ "OFDLCK", "WRITE", -1, 0, "49" },
		{ "OFDLCK", "READ", -1, 1000, "1099" },
	};
	struct {
		short type;
		off_t start, len;
		short want;
		off_t wstart, wlen;
	} q[] = {
		{ F_WRLCK, 0, 50, F_WRLCK, 0, 50 },
		{ F_RDLCK, 10, 5, F_WRLCK, 0, 50 },
		{ F_WRLCK, 1000, 100, F_RDLCK, 1000, 100 },
		{ F_RDLCK, 1000, 100, F_UNLCK, 0, 0 },
		{ F_WRLCK, 50, 950, F_UNLCK, 0, 0 },
	};
	struct flock l;
	size_t i;
	int fd;

	ZDTM_CORRUPT("ofd", setlk(of, F_OFD_SETLK, F_UNLCK, 0, 50));
	check_fd_locks("ofd", F_OFD, of, want, 2);
	fd = open(F_OFD, O_RDWR | O_CLOEXEC);
	if (!zdtm_check(fd >= 0, "ofd", "open %s: %s", F_OFD,
			strerror(errno)))
		return;
	for (i = 0; i < sizeof(q) / sizeof(q[0]); i++) {
		int r = getlk(fd, F_OFD_GETLK, q[i].type, q[i].start, q[i].len,
			      &l);

		zdtm_check(r == 0 && l.l_type == q[i].want &&
			   (q[i].want == F_UNLCK ||
			    (l.l_start == q[i].wstart &&
			     l.l_len == q[i].wlen && l.l_pid == -1)), "ofd",
			   "F_OFD_GETLK %s [%lld, +%lld) from a second "
			   "description: %s %s start %lld len %lld pid %d, "
			   "expected %s start %lld len %lld pid -1",
			   ltype(q[i].type), (long long)q[i].start,
			   (long long)q[i].len, r ? strerror(errno) : "ok",
			   ltype(l.l_type), (long long)l.l_start,
			   (long long)l.l_len, (int)l.l_pid, ltype(q[i].want),
			   (long long)q[i].wstart, (long long)q[i].wlen);
	}
	close(fd);
}

static int64_t ts_ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000ll + t->tv_nsec;
}

static void check_timers(void)
{
	struct ptimer_info t[16];
	struct itimerspec its;
	struct itimerval itv;
	int n, i;
	int64_t elapsed, v, lo, end;
	sig_atomic_t f0;

	/* ids and /proc/self/timers */
	ZDTM_CORRUPT("timer-id", {
		struct sigevent sev;
		struct itimerspec p = { { 0, PT_PERIOD_NS },
					{ 0, PT_PERIOD_NS } };

		memset(&sev, 0, sizeof(sev));
		sev.sigev_notify = SIGEV_SIGNAL;
		sev.sigev_signo = sig_pt;
		sev.sigev_value.sival_ptr = (void *)(uintptr_t)PT_VALUE;
		timer_delete(ptimer);
		timer_create(CLOCK_MONOTONIC, &sev, &ptimer);
		timer_settime(ptimer, 0, &p, NULL);
	});
	ZDTM_CORRUPT("timer-value", {
		union sigval sv;

		sv.sival_ptr = (void *)(uintptr_t)(PT_VALUE ^ 1);
		sigqueue(getpid(), sig_pt, sv);
	});
	n = read_timers(t, 16);
	if (!zdtm_check(n == 2, "timer-id", "/proc/self/timers lists %d "
			"timers, expected 2 (ids %d, %d)", n, pt_id, ot_id))
		for (i = 0; i < n && i < 16; i++)
			zdtm_fail("timer-id", "listed: id %d signal %d notify "
				  "%s", t[i].id, t[i].signo, t[i].notify);
	if (n > 16)
		n = 16;
	check_timer_info(t, n, pt_id, "periodic timer", sig_pt, PT_VALUE,
			 "signal", "tid");
	check_timer_info(t, n, ot_id, "one-shot timer", SIGUSR2, OT_VALUE,
			 "none", "pid");

	/* the periodic timer */
	ZDTM_CORRUPT("timer-fire", {
		struct itimerspec z;

		memset(&z, 0, sizeof(z));
		timer_settime(ptimer, 0, &z, NULL);
	});
	memset(&its, 0, sizeof(its));
	zdtm_check(timer_gettime(ptimer, &its) == 0 &&
		   ts_ns(&its.it_interval) == PT_PERIOD_NS &&
		   ts_ns(&its.it_value) > 0 &&
		   ts_ns(&its.it_value) <= PT_PERIOD_NS, "timer-fire",
		   "timer_gettime(periodic): interval %lld ns, value %lld ns; "
		   "expected interval %ld, value in (0, %ld]",
		   (long long)ts_ns(&its.it_interval),
		   (long long)ts_ns(&its.it_value), PT_PERIOD_NS,
		   PT_PERIOD_NS);
	f0 = fires;
	end = zdtm_now_ns() + (int64_t)FIRE_MS * 1000000ll;
	while (fires - f0 < MIN_FIRES && zdtm_now_ns() < end)
		zdtm_msleep(10);
	zdtm_check(fires - f0 >= MIN_FIRES, "timer-fire", "%d timer signals "
		   "in %d ms after SIGTERM, expected at least %d (period "
		   "10 ms)", (int)(fires - f0), FIRE_MS, MIN_FIRES);
	zdtm_check(bad_fires == 0, "timer-value", "%d timer signals with "
		   "unexpected siginfo (last: si_code %d, timer id %d, value "
		   "%#llx; expected SI_TIMER %d, id %d, value %#llx)",
		   (int)bad_fires, (int)bad_code, (int)bad_id,
		   (unsigned long long)bad_value, SI_TIMER, pt_id, PT_VALUE);

	/* the one-shot timer */
	/* (not by disarming it: on 6.18 timer_gettime of a disarmed
	 * SIGEV_NONE one-shot still reports the old remaining time) */
	ZDTM_CORRUPT("oneshot", {
		struct itimerspec z;

		memset(&z, 0, sizeof(z));
		z.it_value.tv_sec = 2 * OT_SECS;
		timer_settime(otimer, 0, &z, NULL);
	});
	elapsed = zdtm_now_ns() - t_armed;
	memset(&its, 0, sizeof(its));
	i = timer_gettime(otimer, &its);
	v = ts_ns(&its.it_value);
	lo = (int64_t)OT_SECS * 1000000000ll - elapsed - 1000000000ll;
	zdtm_check(i == 0 && ts_ns(&its.it_interval) == 0 && v >= lo &&
		   v <= (int64_t)OT_SECS * 1000000000ll, "oneshot",
		   "timer_gettime(one-shot): %s, interval %lld ns, value %lld "
		   "ns; expected no interval and value in [%lld, %lld] (armed "
		   "%lld ms ago for %d s)", i ? strerror(errno) : "ok",
		   (long long)ts_ns(&its.it_interval), (long long)v,
		   (long long)lo, (long long)OT_SECS * 1000000000ll,
		   (long long)(elapsed / 1000000), OT_SECS);

	/* ITIMER_REAL */
	ZDTM_CORRUPT("itimer", {
		struct itimerval z;

		memset(&z, 0, sizeof(z));
		setitimer(ITIMER_REAL, &z, NULL);
	});
	elapsed = zdtm_now_ns() - t_armed;
	memset(&itv, 0, sizeof(itv));
	i = getitimer(ITIMER_REAL, &itv);
	v = (int64_t)itv.it_value.tv_sec * 1000000000ll +
	    itv.it_value.tv_usec * 1000ll;
	lo = (int64_t)IT_SECS * 1000000000ll - elapsed - 1000000000ll;
	zdtm_check(i == 0 && itv.it_interval.tv_sec == IT_INTERVAL &&
		   itv.it_interval.tv_usec == 0 && v >= lo &&
		   v <= (int64_t)IT_SECS * 1000000000ll, "itimer",
		   "getitimer(ITIMER_REAL): %s, interval %lld.%06ld s, value "
		   "%lld ns; expected interval %d s and value in [%lld, %lld]",
		   i ? strerror(errno) : "ok",
		   (long long)itv.it_interval.tv_sec,
		   (long)itv.it_interval.tv_usec, (long long)v, IT_INTERVAL,
		   (long long)lo, (long long)IT_SECS * 1000000000ll);
	zdtm_check(alarms == 0, "itimer", "%d SIGALRMs, expected none",
		   (int)alarms);
}

/* ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
	zdtm_init(argc, argv, 0, NULL);

	setup_inotify();
	setup_locks();
	setup_timers();

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	/* ---------------- verification ---------------- */
	check_timers();
	check_inotify();
	check_flocks();
	check_posix();
	check_ofd();

	zdtm_finish();
}
