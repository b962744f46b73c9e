/*
 * anonfds.c - anonymous-inode fds: eventfd, timerfd, signalfd, epoll (with a
 * dup of the epoll fd) and a pipe watched by the epoll instance.
 *
 *   anonfds PIDFILE
 *
 * Set up before "ready" (one process):
 *   efd1   eventfd(5, EFD_CLOEXEC)                       counter 5, blocking
 *   efd2   eventfd(3, EFD_SEMAPHORE|EFD_NONBLOCK)        counter 3, no CLOEXEC
 *   tfd    timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC)  periodic 20 ms
 *   sfd    signalfd({SIGUSR1}, SFD_NONBLOCK|SFD_CLOEXEC); SIGUSR1 blocked and
 *          one SIGUSR1 pending (raise()).  A first raise() is read back at
 *          setup as a probe: the pending one must later give the same
 *          ssi_code (SI_TKILL), ssi_pid and ssi_uid.
 *   pipe   pipe2(O_NONBLOCK|O_CLOEXEC), 10 bytes of pattern(SEED_PIPE) in it
 *   ep     epoll_create1(EPOLL_CLOEXEC): efd1 (EPOLLIN, data 0x1111), tfd
 *          (EPOLLIN, 0x2222), the pipe's read end (EPOLLIN, 0x3333)
 *   ep2    dup(ep) (same open file description, no CLOEXEC)
 * While waiting it blocks in read(tfd) (20 ms ticks) until SIGTERM.
 *
 * After SIGTERM:
 *   - every fd: its type (readlink /proc/self/fd: anon_inode:[eventfd] ...),
 *     FD_CLOEXEC, O_NONBLOCK; fdinfo: eventfd-count 5 / 3, timerfd clockid,
 *     signalfd sigmask, the epoll registrations (tfd, events, data);
 *   - tfd is readable within 100 ms; epoll_wait(ep, 100 ms) reports exactly
 *     the 3 registrations (EPOLLIN, data 0x1111/0x2222/0x3333), and so does
 *     epoll_wait(ep2); EPOLL_CTL_DEL of the pipe through ep makes it vanish
 *     from epoll_wait(ep2), and EPOLL_CTL_ADD through ep2 (data 0x4444)
 *     shows up in epoll_wait(ep);
 *   - efd1 reads 5, then EAGAIN; efd2 reads 1, 1, 1, then EAGAIN;
 *   - timerfd_gettime: interval exactly 20 ms, 0 < value <= 20 ms; it has
 *     expirations (read >= 1), and new ones within 100 ms;
 *   - SIGUSR1 is still blocked; sfd gives exactly one SIGUSR1 with the
 *     probe's ssi_code/ssi_pid/ssi_uid, then EAGAIN;
 *   - the pipe holds exactly its 10 bytes, then EAGAIN.
 */
#include "zdtm.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>

#define PERIOD_NS  (20 * 1000000l)
#define PIPE_DATA  10
#define D_EFD      0x1111
#define D_TFD      0x2222
#define D_PIPE     0x3333
#define D_PIPE2    0x4444
#define SEED_PIPE  0x616e6f6e70697000ull

static int efd1, efd2, tfd, sfd, ep, ep2, pp[2];

/* ------------------------------------------------------------------ */
/* helpers                                                             */

/* Value after "key" (e.g. "eventfd-count:") in fdinfo of fd, parsed in
 * base; 0 on success. */
static int fdinfo_num(int fd, const char *key, int base,
		      unsigned long long *out)
{
	char buf[4096], *p;

	if (zdtm_fdinfo(fd, buf, sizeof(buf)) <= 0)
		return -1;
	p = strstr(buf, key);
	if (!p)
		return -1;
	*out = strtoull(p + strlen(key), NULL, base);
	return 0;
}

static void check_fd(const char *tag, const char *what, int fd,
		     const char *link, int cloexec, int nonblock)
{
	char path[64], buf[128];
	ssize_t n;
	int fdfl = fcntl(fd, F_GETFD), fl = fcntl(fd, F_GETFL);

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, buf, sizeof(buf) - 1);
	buf[n > 0 ? n : 0] = 0;
	zdtm_check(strncmp(buf, link, strlen(link)) == 0, tag,
		   "%s (fd %d) is '%s', expected '%s'", what, fd, buf, link);
	zdtm_check(fdfl >= 0 && !!(fdfl & FD_CLOEXEC) == cloexec, "cloexec",
		   "%s (fd %d): F_GETFD %#x, expected FD_CLOEXEC %s", what, fd,
		   fdfl, cloexec ? "set" : "clear");
	zdtm_check(fl >= 0 && !!(fl & O_NONBLOCK) == nonblock &&
		   (fl & O_ACCMODE) == (fd == pp[0] ? O_RDONLY : O_RDWR),
		   "flags", "%s (fd %d): F_GETFL %#x, expected O_NONBLOCK %s",
		   what, fd, fl, nonblock ? "set" : "clear");
}

static void set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl >= 0)
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* epoll_wait with EINTR retry; returns the count (or -1). */
static int ewait(int e, struct epoll_event *ev, int max, int ms)
{
	int n;

	do
		n = epoll_wait(e, ev, max, ms);
	while (n < 0 && errno == EINTR);
	return n;
}

/* Exactly the registrations want[0..nwant) (data.u64), each with EPOLLIN. */
static void check_events(const char *tag, const char *what,
			 const struct epoll_event *ev, int n,
			 const uint64_t *want, int nwant)
{
	int i, j, seen[8] = { 0 };

	if (!zdtm_check(n >= 0, tag, "%s: epoll_wait: %s", what,
			strerror(errno)))
		return;
	for (i = 0; i < n; i++) {
		for (j = 0; j < nwant; j++)
			if (ev[i].data.u64 == want[j])
				break;
		if (!zdtm_check(j < nwant, tag, "%s: unexpected event data %#llx "
				"(events %#x)", what,
				(unsigned long long)ev[i].data.u64,
				ev[i].events))
			continue;
		seen[j]++;
		zdtm_check(ev[i].events == EPOLLIN, tag, "%s: data %#llx has "
			   "events %#x, expected EPOLLIN", what,
			   (unsigned long long)want[j], ev[i].events);
	}
	for (j = 0; j < nwant; j++)
		zdtm_check(seen[j] == 1, tag, "%s: data %#llx reported %d "
			   "times, expected once (%d events in all, expected "
			   "%d)", what, (unsigned long long)want[j], seen[j], n,
			   nwant);
}

static int wait_readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int64_t end = zdtm_now_ns() + (int64_t)ms * 1000000ll;
	int r;

	for (;;) {
		int64_t left = (end - zdtm_now_ns()) / 1000000ll;

		r = poll(&p, 1, left > 0 ? (int)left : 0);
		if (r < 0 && errno == EINTR)
			continue;
		return r > 0 && (p.revents & POLLIN);
	}
}

static ssize_t read_retry(int fd, void *buf, size_t len)
{
	ssize_t n;

	do
		n = read(fd, buf, len);
	while (n < 0 && errno == EINTR);
	return n;
}

/* The epoll registrations listed in fdinfo of e: exactly want_fd/want_data. */
static void check_epoll_fdinfo(int e, const int *want_fd,
			       const uint64_t *want_data, int nwant)
{
	char buf[4096], *p;
	int seen[8] = { 0 }, n = 0, j;

	if (!zdtm_check(zdtm_fdinfo(e, buf, sizeof(buf)) > 0, "epoll",
			"fdinfo of epoll fd %d unreadable", e))
		return;
	for (p = strstr(buf, "tfd:"); p; p = strstr(p + 1, "tfd:")) {
		int tfd_n;
		unsigned events;
		unsigned long long data;

		if (sscanf(p, "tfd: %d events: %x data: %llx", &tfd_n, &events,
			   &data) != 3) {
			zdtm_fail("epoll", "unparsable fdinfo line of fd %d: "
				  "%.60s", e, p);
			continue;
		}
		n++;
		for (j = 0; j < nwant; j++)
			if (tfd_n == want_fd[j])
				break;
		if (!zdtm_check(j < nwant, "epoll", "epoll fd %d watches "
				"unexpected fd %d (data %#llx)", e, tfd_n, data))
			continue;
		seen[j]++;
		zdtm_check(data == want_data[j] &&
			   (events & ~(unsigned)(EPOLLERR | EPOLLHUP)) ==
			   EPOLLIN, "epoll", "epoll fd %d: fd %d has events %#x "
			   "data %#llx, expected EPOLLIN data %#llx", e, tfd_n,
			   events, data, (unsigned long long)want_data[j]);
	}
	for (j = 0; j < nwant; j++)
		zdtm_check(seen[j] == 1, "epoll", "epoll fd %d: fd %d listed "
			   "%d times in fdinfo (%d entries)", e, want_fd[j],
			   seen[j], n);
}

/* ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
	struct epoll_event ev[8], reg;
	struct itimerspec its;
	struct signalfd_siginfo probe, si;
	sigset_t usr1, cur;
	uint8_t buf[64];
	uint64_t v, ticks = 0;
	unsigned long long num;
	ssize_t n;
	int i, cnt;

	zdtm_init(argc, argv, 0, NULL);

	efd1 = eventfd(5, EFD_CLOEXEC);
	efd2 = eventfd(3, EFD_SEMAPHORE | EFD_NONBLOCK);
	if (efd1 < 0 || efd2 < 0)
		zdtm_die("eventfd");

	tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
	if (tfd < 0)
		zdtm_die("timerfd_create");
	its.it_interval.tv_sec = 0;
	its.it_interval.tv_nsec = PERIOD_NS;
	its.it_value = its.it_interval;
	if (timerfd_settime(tfd, 0, &its, NULL))
		zdtm_die("timerfd_settime");

	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	if (sigprocmask(SIG_BLOCK, &usr1, NULL))
		zdtm_die("sigprocmask");
	sfd = signalfd(-1, &usr1, SFD_NONBLOCK | SFD_CLOEXEC);
	if (sfd < 0)
		zdtm_die("signalfd");
	if (raise(SIGUSR1))
		zdtm_die("raise probe");
	if (read(sfd, &probe, sizeof(probe)) != sizeof(probe) ||
	    probe.ssi_signo != SIGUSR1)
		zdtm_die("signalfd probe");
	if (raise(SIGUSR1))
		zdtm_die("raise");

	if (pipe2(pp, O_NONBLOCK | O_CLOEXEC))
		zdtm_die("pipe2");
	zdtm_fill(buf, PIPE_DATA, SEED_PIPE);
	if (write(pp[1], buf, PIPE_DATA) != PIPE_DATA)
		zdtm_die("write pipe");

	ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		zdtm_die("epoll_create1");
	reg.events = EPOLLIN;
	reg.data.u64 = D_EFD;
	if (epoll_ctl(ep, EPOLL_CTL_ADD, efd1, &reg))
		zdtm_die("epoll_ctl efd1");
	reg.data.u64 = D_TFD;
	if (epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &reg))
		zdtm_die("epoll_ctl tfd");
	reg.data.u64 = D_PIPE;
	if (epoll_ctl(ep, EPOLL_CTL_ADD, pp[0], &reg))
		zdtm_die("epoll_ctl pipe");
	ep2 = dup(ep);
	if (ep2 < 0)
		zdtm_die("dup epoll");

	zdtm_ready();

	while (!zdtm_stop) {
		if (read(tfd, &v, sizeof(v)) == sizeof(v))
			ticks += v;
	}
	(void)ticks;

	/* ---------------- verification ---------------- */
	ZDTM_CORRUPT("flags", fcntl(efd2, F_SETFL, 0));
	ZDTM_CORRUPT("cloexec", fcntl(efd2, F_SETFD, FD_CLOEXEC));
	ZDTM_CORRUPT("eventfd", eventfd_write(efd1, 1));
	ZDTM_CORRUPT("eventfd-sem", read(efd2, &v, sizeof(v)));
	ZDTM_CORRUPT("timerfd", {
		struct itimerspec t = { { 0, 2 * PERIOD_NS },
					{ 0, 2 * PERIOD_NS } };

		timerfd_settime(tfd, 0, &t, NULL);
	});
	ZDTM_CORRUPT("signalfd", {
		struct timespec z = { 0, 0 };

		sigtimedwait(&usr1, NULL, &z);
	});
	ZDTM_CORRUPT("signalfd-mask", {
		sigset_t s;

		sigemptyset(&s);
		sigaddset(&s, SIGUSR1);
		sigaddset(&s, SIGUSR2);
		signalfd(sfd, &s, 0);
	});
	ZDTM_CORRUPT("epoll", {
		struct epoll_event r = { .events = EPOLLIN,
					 .data.u64 = D_PIPE + 1 };

		epoll_ctl(ep, EPOLL_CTL_MOD, pp[0], &r);
	});
	ZDTM_CORRUPT("epoll-dup", {
		/* an equivalent but separate epoll instance in ep2's place */
		int x = epoll_create1(0);
		struct epoll_event r = { .events = EPOLLIN };

		r.data.u64 = D_EFD;
		epoll_ctl(x, EPOLL_CTL_ADD, efd1, &r);
		r.data.u64 = D_TFD;
		epoll_ctl(x, EPOLL_CTL_ADD, tfd, &r);
		r.data.u64 = D_PIPE;
		epoll_ctl(x, EPOLL_CTL_ADD, pp[0], &r);
		dup2(x, ep2);
		close(x);
	});
	ZDTM_CORRUPT("pipe", read(pp[0], buf, 1));

	/* 1. types and flags */
	check_fd("eventfd", "efd1", efd1, "anon_inode:[eventfd]", 1, 0);
	check_fd("eventfd-sem", "efd2", efd2, "anon_inode:[eventfd]", 0, 1);
	check_fd("timerfd", "tfd", tfd, "anon_inode:[timerfd]", 1, 0);
	check_fd("signalfd", "sfd", sfd, "anon_inode:[signalfd]", 1, 1);
	check_fd("epoll", "ep", ep, "anon_inode:[eventpoll]", 1, 0);
	check_fd("epoll", "ep2", ep2, "anon_inode:[eventpoll]", 0, 0);
	check_fd("pipe", "pipe read end", pp[0], "pipe:", 1, 1);

	/* 2. fdinfo */
	zdtm_check(fdinfo_num(efd1, "eventfd-count:", 16, &num) == 0 &&
		   num == 5, "eventfd", "efd1 fdinfo eventfd-count %llu, "
		   "expected 5", num);
	num = 0;
	zdtm_check(fdinfo_num(efd2, "eventfd-count:", 16, &num) == 0 &&
		   num == 3, "eventfd-sem", "efd2 fdinfo eventfd-count %llu, "
		   "expected 3", num);
	num = 0;
	if (fdinfo_num(efd2, "eventfd-semaphore:", 10, &num) == 0)
		zdtm_check(num == 1, "eventfd-sem", "efd2 fdinfo "
			   "eventfd-semaphore %llu, expected 1", num);
	num = 99;
	zdtm_check(fdinfo_num(tfd, "clockid:", 10, &num) == 0 &&
		   num == CLOCK_MONOTONIC, "timerfd", "tfd fdinfo clockid "
		   "%llu, expected %d", num, CLOCK_MONOTONIC);
	num = 0;
	zdtm_check(fdinfo_num(sfd, "sigmask:", 16, &num) == 0 &&
		   num == 1ull << (SIGUSR1 - 1), "signalfd-mask",
		   "sfd fdinfo sigmask %016llx, expected %016llx", num,
		   1ull << (SIGUSR1 - 1));
	{
		int fds[3] = { efd1, tfd, pp[0] };
		uint64_t data[3] = { D_EFD, D_TFD, D_PIPE };

		check_epoll_fdinfo(ep, fds, data, 3);
	}

	/* non-blocking from here on, whatever the flags were */
	set_nonblock(efd1);
	set_nonblock(efd2);
	set_nonblock(tfd);
	set_nonblock(sfd);
	set_nonblock(pp[0]);

	/* 3. epoll through both fds */
	zdtm_check(wait_readable(tfd, 100), "timerfd",
		   "timerfd not readable within 100 ms");
	{
		uint64_t all[3] = { D_EFD, D_TFD, D_PIPE };
		uint64_t two[2] = { D_EFD, D_TFD };
		uint64_t with2[3] = { D_EFD, D_TFD, D_PIPE2 };

		cnt = ewait(ep, ev, 8, 100);
		check_events("epoll", "epoll_wait(ep)", ev, cnt, all, 3);
		cnt = ewait(ep2, ev, 8, 100);
		check_events("epoll", "epoll_wait(ep2, the dup)", ev, cnt, all,
			     3);

		zdtm_check(epoll_ctl(ep, EPOLL_CTL_DEL, pp[0], NULL) == 0,
			   "epoll", "EPOLL_CTL_DEL pipe via ep: %s",
			   strerror(errno));
		cnt = ewait(ep2, ev, 8, 100);
		check_events("epoll-dup", "epoll_wait(ep2) after DEL via ep",
			     ev, cnt, two, 2);
		reg.events = EPOLLIN;
		reg.data.u64 = D_PIPE2;
		zdtm_check(epoll_ctl(ep2, EPOLL_CTL_ADD, pp[0], &reg) == 0,
			   "epoll-dup", "EPOLL_CTL_ADD pipe via ep2: %s",
			   strerror(errno));
		cnt = ewait(ep, ev, 8, 100);
		check_events("epoll-dup", "epoll_wait(ep) after ADD via ep2",
			     ev, cnt, with2, 3);
	}

	/* 4. eventfds */
	v = 0;
	n = read_retry(efd1, &v, sizeof(v));
	zdtm_check(n == sizeof(v) && v == 5, "eventfd",
		   "efd1 read %zd bytes, value %llu, expected 5", n,
		   (unsigned long long)v);
	n = read_retry(efd1, &v, sizeof(v));
	zdtm_check(n < 0 && errno == EAGAIN, "eventfd",
		   "efd1 second read %zd (%s), expected EAGAIN", n,
		   n < 0 ? strerror(errno) : "data");
	for (i = 0; i < 3; i++) {
		v = 0;
		n = read_retry(efd2, &v, sizeof(v));
		zdtm_check(n == sizeof(v) && v == 1, "eventfd-sem",
			   "efd2 read #%d: %zd bytes, value %llu, expected 1 "
			   "(%s)", i + 1, n, (unsigned long long)v,
			   n < 0 ? strerror(errno) : "ok");
	}
	n = read_retry(efd2, &v, sizeof(v));
	zdtm_check(n < 0 && errno == EAGAIN, "eventfd-sem",
		   "efd2 read #4: %zd (%s), expected EAGAIN", n,
		   n < 0 ? strerror(errno) : "data");

	/* 5. timerfd */
	memset(&its, 0, sizeof(its));
	zdtm_check(timerfd_gettime(tfd, &its) == 0 &&
		   its.it_interval.tv_sec == 0 &&
		   its.it_interval.tv_nsec == PERIOD_NS &&
		   its.it_value.tv_sec == 0 && its.it_value.tv_nsec > 0 &&
		   its.it_value.tv_nsec <= PERIOD_NS, "timerfd",
		   "timerfd_gettime: interval %lld.%09ld value %lld.%09ld, "
		   "expected interval 0.020000000, value in (0, 0.02]",
		   (long long)its.it_interval.tv_sec, its.it_interval.tv_nsec,
		   (long long)its.it_value.tv_sec, its.it_value.tv_nsec);
	ZDTM_CORRUPT("timerfd-fire", {
		struct itimerspec t;

		memset(&t, 0, sizeof(t));
		timerfd_settime(tfd, 0, &t, NULL);
	});
	v = 0;
	n = read_retry(tfd, &v, sizeof(v));
	zdtm_check(n == sizeof(v) && v >= 1, "timerfd-fire",
		   "timerfd read %zd (%s), value %llu, expected >= 1 "
		   "expiration", n, n < 0 ? strerror(errno) : "ok",
		   (unsigned long long)v);
	v = 0;
	n = -1;
	if (wait_readable(tfd, 100))
		n = read_retry(tfd, &v, sizeof(v));
	zdtm_check(n == sizeof(v) && v >= 1, "timerfd-fire",
		   "no new timerfd expiration within 100 ms (read %zd, %llu)",
		   n, (unsigned long long)v);

	/* 6. signalfd */
	zdtm_check(sigprocmask(SIG_BLOCK, NULL, &cur) == 0 &&
		   sigismember(&cur, SIGUSR1) == 1, "signalfd",
		   "SIGUSR1 is not blocked any more");
	memset(&si, 0, sizeof(si));
	n = read_retry(sfd, &si, sizeof(si));
	if (zdtm_check(n == sizeof(si), "signalfd", "signalfd read %zd (%s), "
		       "expected the pending SIGUSR1", n,
		       n < 0 ? strerror(errno) : "short"))
		zdtm_check(si.ssi_signo == SIGUSR1 &&
			   si.ssi_code == probe.ssi_code &&
			   si.ssi_pid == probe.ssi_pid &&
			   si.ssi_uid == probe.ssi_uid &&
			   si.ssi_pid == (uint32_t)getpid(), "signalfd",
			   "signalfd gave signo %u code %d pid %u uid %u, "
			   "expected %d %d %u %u", si.ssi_signo, si.ssi_code,
			   si.ssi_pid, si.ssi_uid, SIGUSR1, probe.ssi_code,
			   probe.ssi_pid, probe.ssi_uid);
	n = read_retry(sfd, &si, sizeof(si));
	zdtm_check(n < 0 && errno == EAGAIN, "signalfd",
		   "second signalfd read %zd (%s, signo %u), expected EAGAIN",
		   n, n < 0 ? strerror(errno) : "data", si.ssi_signo);

	/* 7. the pipe */
	memset(buf, 0, sizeof(buf));
	n = read_retry(pp[0], buf, sizeof(buf));
	zdtm_check(n == PIPE_DATA, "pipe", "pipe read %zd (%s), expected "
		   "%d bytes", n, n < 0 ? strerror(errno) : "ok", PIPE_DATA);
	if (n > 0)
		zdtm_verify_pattern("pipe", "pipe data", buf,
				    n < PIPE_DATA ? (size_t)n : PIPE_DATA,
				    SEED_PIPE);
	n = read_retry(pp[0], buf, sizeof(buf));
	zdtm_check(n < 0 && errno == EAGAIN, "pipe",
		   "second pipe read %zd (%s), expected EAGAIN", n,
		   n < 0 ? strerror(errno) : "data");

	zdtm_finish();
}
