/*
 * signals.c - signal dispositions, blocked mask, pending (queued) signals,
 * alternate signal stack and a running interval timer.
 *
 *   signals PIDFILE
 *
 * Set up:
 *   SIGUSR1      h_usr1, SA_SIGINFO|SA_RESTART|SA_ONSTACK, mask {USR2, HUP}
 *   SIGHUP       SIG_IGN
 *   SIGWINCH     h_winch, SA_NODEFER|SA_RESETHAND
 *   SIGRTMIN+3   h_rt3, SA_RESTART, mask {SIGINT, SIGQUIT}
 *   SIGALRM      h_alrm (counter++), SA_RESTART
 *   SIGTERM      the zdtm handler
 *   blocked      {SIGUSR2, SIGRTMIN+5}
 *   pending      SIGUSR2 (kill), SIGRTMIN+5 queued twice with sigqueue
 *                values 12345 then 67890
 *   sigaltstack  64 KiB malloc'd
 *   ITIMER_REAL  10 ms interval (SIGALRM keeps interrupting the nanosleeps)
 *
 * After SIGTERM: every disposition (handler, flags, mask), the blocked mask,
 * the pending set, the queued values in order (sigtimedwait), the altstack,
 * the timer interval and that SIGALRMs still arrive (>= 50 in 1 s); then
 * raises SIGUSR1 (must run on the altstack with the right mask), SIGWINCH
 * (NODEFER, then reset to SIG_DFL) and SIGRTMIN+3.
 */
#include "zdtm.h"

#include <sys/time.h>

#ifndef SA_RESTORER
#define SA_RESTORER 0x04000000 /* x86-64 kernel ABI; glibc hides it */
#endif

#define ALTSTACK_SIZE (64 * 1024)
#define TIMER_US      10000

static volatile sig_atomic_t alarm_count;
static volatile sig_atomic_t usr1_count, winch_count, rt3_count;
static volatile uintptr_t usr1_local_addr;
static volatile int usr1_onstack, usr1_si_code, usr1_si_pid;
static sigset_t usr1_mask; /* blocked set seen inside h_usr1 */
static volatile int winch_blocked_inside = -1;
static sigset_t rt3_mask;

static void h_usr1(int sig, siginfo_t *si, void *uc)
{
	volatile char local = 0;
	stack_t ss;

	(void)sig;
	(void)uc;
	usr1_local_addr = (uintptr_t)&local;
	usr1_onstack = sigaltstack(NULL, &ss) == 0 &&
		       (ss.ss_flags & SS_ONSTACK);
	usr1_si_code = si->si_code;
	usr1_si_pid = si->si_pid;
	sigprocmask(SIG_BLOCK, NULL, &usr1_mask);
	usr1_count++;
}

static void h_winch(int sig)
{
	sigset_t cur;

	(void)sig;
	sigprocmask(SIG_BLOCK, NULL, &cur);
	winch_blocked_inside = sigismember(&cur, SIGWINCH);
	winch_count++;
}

static void h_rt3(int sig)
{
	(void)sig;
	sigprocmask(SIG_BLOCK, NULL, &rt3_mask);
	rt3_count++;
}

static void h_alrm(int sig)
{
	(void)sig;
	alarm_count++;
}

struct disp {
	int sig;
	const char *name;
	void *handler;
	int flags;
	int mask[4]; /* 0-terminated */
};

static struct disp disps[6];
static int ndisps;
static void *restorer; /* glibc's __restore_rt, as the kernel reported it */

static void install(int sig, const char *name, void *handler, int flags,
		    int m0, int m1)
{
	struct disp *d = &disps[ndisps++];
	struct sigaction sa, old;

	memset(&sa, 0, sizeof(sa));
	d->sig = sig;
	d->name = name;
	d->handler = handler;
	d->flags = flags;
	d->mask[0] = m0;
	d->mask[1] = m1;
	d->mask[2] = 0;
	if (flags & SA_SIGINFO)
		sa.sa_sigaction = (void (*)(int, siginfo_t *, void *))handler;
	else
		sa.sa_handler = (void (*)(int))handler;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	if (m0)
		sigaddset(&sa.sa_mask, m0);
	if (m1)
		sigaddset(&sa.sa_mask, m1);
	if (sigaction(sig, &sa, NULL) || sigaction(sig, NULL, &old))
		zdtm_die("sigaction(%s)", name);
	if (old.sa_flags & SA_RESTORER)
		restorer = (void *)old.sa_restorer;
}

static int mask_has(const int *mask, int sig)
{
	for (; *mask; mask++)
		if (*mask == sig)
			return 1;
	return 0;
}

static void check_set(const char *tag, const char *what, const sigset_t *set,
		      const int *expected)
{
	int s;

	for (s = 1; s < _NSIG; s++) {
		int want = mask_has(expected, s);
		int have = sigismember(set, s) == 1;

		zdtm_check(want == have, tag, "%s: signal %d (%s) %s", what, s,
			   strsignal(s), have ? "present but not expected" :
			   "expected but missing");
	}
}

static void check_disposition(const struct disp *d)
{
	struct sigaction old;
	void *h;

	if (sigaction(d->sig, NULL, &old)) {
		zdtm_fail("handler", "sigaction(%s): %s", d->name,
			  strerror(errno));
		return;
	}
	h = (old.sa_flags & SA_SIGINFO) ? (void *)old.sa_sigaction :
					  (void *)old.sa_handler;
	zdtm_check(h == d->handler, "handler", "%s: handler %p, expected %p",
		   d->name, h, d->handler);
	zdtm_check((old.sa_flags & ~SA_RESTORER) == d->flags, "handler",
		   "%s: sa_flags %#x, expected %#x (+SA_RESTORER)", d->name,
		   (unsigned)(old.sa_flags & ~SA_RESTORER), (unsigned)d->flags);
	zdtm_check(!restorer || ((old.sa_flags & SA_RESTORER) &&
				 (void *)old.sa_restorer == restorer),
		   "handler", "%s: sa_restorer %p (flags %#x), expected %p",
		   d->name, (void *)old.sa_restorer, (unsigned)old.sa_flags,
		   restorer);
	check_set("handler", d->name, &old.sa_mask, d->mask);
}

/* sleep for ns nanoseconds, continuing after EINTR */
static void sleep_ns(int64_t ns)
{
	int64_t deadline = zdtm_now_ns() + ns, left;

	while ((left = deadline - zdtm_now_ns()) > 0) {
		struct timespec ts = { left / 1000000000, left % 1000000000 };

		nanosleep(&ts, NULL);
	}
}

static int wait_sig(int sig, siginfo_t *si)
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

int main(int argc, char **argv)
{
	const int rt3 = SIGRTMIN + 3, rt5 = SIGRTMIN + 5;
	struct itimerval itv;
	union sigval sv;
	sigset_t block;
	stack_t ss;
	void *altstack;

	zdtm_init(argc, argv, 0, "");

	/* SIGTERM as installed by zdtm_init() */
	disps[ndisps++] = (struct disp){ SIGTERM, "SIGTERM",
					 (void *)zdtm_sigterm_handler, 0,
					 { 0 } };
	install(SIGUSR1, "SIGUSR1", (void *)h_usr1,
		SA_SIGINFO | SA_RESTART | SA_ONSTACK, SIGUSR2, SIGHUP);
	install(SIGHUP, "SIGHUP", (void *)SIG_IGN, 0, 0, 0);
	install(SIGWINCH, "SIGWINCH", (void *)h_winch,
		SA_NODEFER | SA_RESETHAND, 0, 0);
	install(rt3, "SIGRTMIN+3", (void *)h_rt3, SA_RESTART, SIGINT, SIGQUIT);
	install(SIGALRM, "SIGALRM", (void *)h_alrm, SA_RESTART, 0, 0);

	altstack = malloc(ALTSTACK_SIZE);
	if (!altstack)
		zdtm_die("malloc altstack");
	memset(altstack, 0x5A, ALTSTACK_SIZE);
	ss.ss_sp = altstack;
	ss.ss_size = ALTSTACK_SIZE;
	ss.ss_flags = 0;
	if (sigaltstack(&ss, NULL))
		zdtm_die("sigaltstack");

	sigemptyset(&block);
	sigaddset(&block, SIGUSR2);
	sigaddset(&block, rt5);
	if (sigprocmask(SIG_SETMASK, &block, NULL))
		zdtm_die("sigprocmask");
	if (kill(getpid(), SIGUSR2)) /* kill(): si_code SI_USER */
		zdtm_die("kill(SIGUSR2)");
	sv.sival_int = 12345;
	if (sigqueue(getpid(), rt5, sv))
		zdtm_die("sigqueue 1");
	sv.sival_int = 67890;
	if (sigqueue(getpid(), rt5, sv))
		zdtm_die("sigqueue 2");

	itv.it_interval.tv_sec = 0;
	itv.it_interval.tv_usec = TIMER_US;
	itv.it_value = itv.it_interval;
	if (setitimer(ITIMER_REAL, &itv, NULL))
		zdtm_die("setitimer");

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(50); /* interrupted by SIGALRM every 10 ms */

	/* ---------------- corruption hooks (selftest only) ---------------- */
	ZDTM_CORRUPT("handler", {
		struct sigaction sa;

		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = h_rt3;
		sigaction(rt3, &sa, NULL); /* drops SA_RESTART and the mask */
	});
	ZDTM_CORRUPT("blocked", {
		sigset_t s;

		sigemptyset(&s);
		sigaddset(&s, SIGINT);
		sigprocmask(SIG_BLOCK, &s, NULL);
	});
	ZDTM_CORRUPT("pending", {
		siginfo_t si;

		wait_sig(SIGUSR2, &si); /* SIGUSR2 no longer pending */
	});
	ZDTM_CORRUPT("rt-queue", {
		siginfo_t si;

		wait_sig(rt5, &si); /* eat 12345: 67890 comes first */
	});
	ZDTM_CORRUPT("altstack", {
		stack_t s2 = { .ss_sp = altstack, .ss_size = ALTSTACK_SIZE / 2 };

		sigaltstack(&s2, NULL);
	});
	ZDTM_CORRUPT("itimer", {
		struct itimerval t = { { 0, 4 * TIMER_US }, { 0, 4 * TIMER_US } };

		setitimer(ITIMER_REAL, &t, NULL);
	});
	ZDTM_CORRUPT("onstack", {
		struct sigaction sa;

		sigaction(SIGUSR1, NULL, &sa);
		sa.sa_flags &= ~SA_ONSTACK;
		sigaction(SIGUSR1, &sa, NULL);
	});

	/* ---------------- verification ---------------- */
	{
		int i;

		for (i = 0; i < ndisps; i++)
			check_disposition(&disps[i]);
	}
	{
		sigset_t cur;
		const int exp[] = { SIGUSR2, rt5, 0 };

		if (sigprocmask(SIG_BLOCK, NULL, &cur))
			zdtm_fail("blocked", "sigprocmask: %s", strerror(errno));
		else
			check_set("blocked", "blocked mask", &cur, exp);
	}
	{
		sigset_t pend;
		const int exp[] = { SIGUSR2, rt5, 0 };

		if (sigpending(&pend))
			zdtm_fail("pending", "sigpending: %s", strerror(errno));
		else
			check_set("pending", "pending set", &pend, exp);
	}
	{
		static const int vals[2] = { 12345, 67890 };
		siginfo_t si;
		int i, r;

		for (i = 0; i < 2; i++) {
			memset(&si, 0, sizeof(si));
			r = wait_sig(rt5, &si);
			if (!zdtm_check(r == rt5, "rt-queue",
					"sigtimedwait(SIGRTMIN+5) #%d returned "
					"%d (%s)", i + 1, r,
					r < 0 ? strerror(errno) : "?"))
				continue;
			zdtm_check(si.si_value.sival_int == vals[i] &&
				   si.si_code == SI_QUEUE &&
				   si.si_pid == getpid() &&
				   si.si_uid == getuid(), "rt-queue",
				   "SIGRTMIN+5 #%d: value %d code %d pid %d "
				   "uid %d, expected %d %d %d %d", i + 1,
				   si.si_value.sival_int, si.si_code,
				   (int)si.si_pid, (int)si.si_uid, vals[i],
				   SI_QUEUE, (int)getpid(), (int)getuid());
		}
		r = wait_sig(rt5, &si);
		zdtm_check(r < 0 && errno == EAGAIN, "rt-queue",
			   "third SIGRTMIN+5 retrieved (%d, value %d)", r,
			   si.si_value.sival_int);

		memset(&si, 0, sizeof(si));
		r = wait_sig(SIGUSR2, &si);
		if (zdtm_check(r == SIGUSR2, "pending",
			       "sigtimedwait(SIGUSR2) returned %d (%s)", r,
			       r < 0 ? strerror(errno) : "?"))
			zdtm_check(si.si_code == SI_USER &&
				   si.si_pid == getpid() &&
				   si.si_uid == getuid(), "pending",
				   "SIGUSR2: code %d pid %d uid %d, expected "
				   "%d %d %d", si.si_code, (int)si.si_pid,
				   (int)si.si_uid, SI_USER, (int)getpid(),
				   (int)getuid());
		r = wait_sig(SIGUSR2, &si);
		zdtm_check(r < 0 && errno == EAGAIN, "pending",
			   "second SIGUSR2 retrieved (%d)", r);
	}
	{
		stack_t cur;

		if (sigaltstack(NULL, &cur))
			zdtm_fail("altstack", "sigaltstack: %s",
				  strerror(errno));
		else
			zdtm_check(cur.ss_sp == altstack &&
				   cur.ss_size == ALTSTACK_SIZE &&
				   cur.ss_flags == 0, "altstack",
				   "sigaltstack: sp %p size %zu flags %#x, "
				   "expected %p %d 0", cur.ss_sp, cur.ss_size,
				   (unsigned)cur.ss_flags, altstack,
				   ALTSTACK_SIZE);
	}
	{
		struct itimerval cur;
		sig_atomic_t before;

		if (getitimer(ITIMER_REAL, &cur))
			zdtm_fail("itimer", "getitimer: %s", strerror(errno));
		else
			/* it_value may legitimately read 0 between an expiry
			 * and the re-arm at SIGALRM delivery */
			zdtm_check(cur.it_interval.tv_sec == 0 &&
				   cur.it_interval.tv_usec == TIMER_US &&
				   cur.it_value.tv_sec == 0 &&
				   cur.it_value.tv_usec >= 0 &&
				   cur.it_value.tv_usec <= TIMER_US,
				   "itimer",
				   "ITIMER_REAL interval %ld.%06ld value "
				   "%ld.%06ld, expected interval 0.%06d",
				   (long)cur.it_interval.tv_sec,
				   (long)cur.it_interval.tv_usec,
				   (long)cur.it_value.tv_sec,
				   (long)cur.it_value.tv_usec, TIMER_US);
		before = alarm_count;
		sleep_ns(1000000000ll);
		zdtm_check(alarm_count - before >= 50, "itimer",
			   "only %d SIGALRMs in 1 s (expected ~100)",
			   (int)(alarm_count - before));
	}
	{
		uintptr_t lo = (uintptr_t)altstack, hi = lo + ALTSTACK_SIZE;
		const int exp[] = { SIGUSR1, SIGUSR2, SIGHUP, rt5, 0 };

		usr1_local_addr = 0;
		kill(getpid(), SIGUSR1);
		if (zdtm_check(usr1_count == 1, "onstack",
			       "SIGUSR1 handler ran %d times",
			       (int)usr1_count)) {
			zdtm_check(usr1_local_addr >= lo &&
				   usr1_local_addr < hi && usr1_onstack,
				   "onstack",
				   "SIGUSR1 handler local at %#lx, altstack "
				   "%#lx-%#lx, SS_ONSTACK %d",
				   (unsigned long)usr1_local_addr,
				   (unsigned long)lo, (unsigned long)hi,
				   usr1_onstack);
			zdtm_check(usr1_si_code == SI_USER &&
				   usr1_si_pid == getpid(), "handler",
				   "SIGUSR1 siginfo code %d pid %d",
				   usr1_si_code, usr1_si_pid);
			check_set("handler", "mask inside SIGUSR1 handler",
				  &usr1_mask, exp);
		}
	}
	{
		struct sigaction old;

		raise(SIGWINCH);
		zdtm_check(winch_count == 1 && winch_blocked_inside == 0,
			   "handler",
			   "SIGWINCH handler ran %d times, SIGWINCH blocked "
			   "inside: %d (SA_NODEFER => 0)", (int)winch_count,
			   winch_blocked_inside);
		zdtm_check(sigaction(SIGWINCH, NULL, &old) == 0 &&
			   old.sa_handler == SIG_DFL, "handler",
			   "SIGWINCH not reset to SIG_DFL (SA_RESETHAND)");
	}
	{
		const int exp[] = { rt3, SIGINT, SIGQUIT, SIGUSR2, rt5, 0 };

		raise(rt3);
		if (zdtm_check(rt3_count == 1, "handler",
			       "SIGRTMIN+3 handler ran %d times",
			       (int)rt3_count))
			check_set("handler", "mask inside SIGRTMIN+3 handler",
				  &rt3_mask, exp);
	}
	zdtm_finish();
}
