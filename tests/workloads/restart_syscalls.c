/*
 * restart_syscalls.c - the main loop spends almost all its time blocked in
 * sleeping syscalls, so checkpoints land mid-syscall; each result must still
 * make sense after a restore.
 *
 *   restart_syscalls PIDFILE
 *
 * Each iteration calls, measuring CLOCK_MONOTONIC around every call:
 *   nanosleep(200 ms)
 *   select(0, NULL, NULL, NULL, {0, 100 ms})
 *   poll(NULL, 0, 100)
 *   clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, now + 100 ms)
 * Acceptable results: success after at least the requested time (for select
 * also with the timeval updated to 0; for clock_nanosleep at or after the
 * deadline), or EINTR only if a signal handler (the SIGTERM one, the only
 * one installed) ran during the call.  Anything else (an early success, EINTR
 * without a handler, another errno, a bogus return value, nonsense remaining
 * times) is an anomaly; any anomaly means FAIL.
 *
 * After SIGTERM: no anomalies, the iteration counter advanced (at least one
 * call completed if >= 2 s passed since "ready"), and one more uninterrupted
 * round of the four calls behaves.
 */
#include "zdtm.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/select.h>

#define SLEEP_NS  (200 * 1000000ll)
#define SHORT_NS  (100 * 1000000ll)
#define SLACK_NS  (50 * 1000ll) /* clock read granularity safety margin */

enum { K_NANOSLEEP, K_SELECT, K_POLL, K_CLOCK_NANOSLEEP, K_NR };
static const char *const kname[K_NR] = { "nanosleep", "select", "poll",
					 "clock_nanosleep" };

static uint64_t completed[K_NR], interrupted[K_NR], anomalies;
uint64_t g_iterations; /* global copy of the iteration counter */

/*
 * Judge one call.  r/err: return value and errno (clock_nanosleep: r is the
 * error number, err unused).  elapsed: measured duration; want: requested
 * duration (for clock_nanosleep, ns between the deadline and the call start);
 * handler_ran: the SIGTERM handler ran during the call; rem_ns: remaining
 * time reported by the kernel (nanosleep rem / select timeval), -1 if none.
 */
static void judge(int k, long r, int err, int64_t elapsed, int64_t want,
		  int handler_ran, int64_t rem_ns)
{
	int ok;

	if (k == K_CLOCK_NANOSLEEP) {
		/* returns an error number, never -1 */
		if (r == 0) {
			ok = elapsed + SLACK_NS >= want;
			if (!ok)
				zdtm_fail(kname[k], "returned 0 after %lld ns, "
					  "before the deadline (%lld ns)",
					  (long long)elapsed, (long long)want);
		} else if (r == EINTR) {
			ok = handler_ran;
			if (!ok)
				zdtm_fail(kname[k], "EINTR after %lld ns but "
					  "no signal handler ran",
					  (long long)elapsed);
		} else {
			ok = 0;
			zdtm_fail(kname[k], "returned %ld (%s)", r,
				  r > 0 ? strerror((int)r) : "not an errno");
		}
	} else if (r == 0) {
		ok = elapsed + SLACK_NS >= want;
		if (!ok)
			zdtm_fail(kname[k], "returned 0 after only %lld ns "
				  "(requested %lld ns)", (long long)elapsed,
				  (long long)want);
		if (k == K_SELECT && rem_ns != 0) {
			ok = 0;
			zdtm_fail(kname[k], "timed out but timeval says %lld "
				  "ns remain", (long long)rem_ns);
		}
	} else if (r == -1 && err == EINTR) {
		ok = handler_ran;
		if (!ok)
			zdtm_fail(kname[k], "EINTR after %lld ns but no signal "
				  "handler ran", (long long)elapsed);
		/* The kernel reports the time left to the timer's hard
		 * expiry, which is the request plus the thread's timer slack:
		 * interrupted right away, a sleep may report a little more
		 * than it asked for. */
		if (rem_ns != -1 &&
		    (rem_ns < 0 || rem_ns > want + (int64_t)prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0))) {
			ok = 0;
			zdtm_fail(kname[k], "EINTR with remaining time %lld ns "
				  "(requested %lld ns)", (long long)rem_ns,
				  (long long)want);
		}
	} else {
		ok = 0;
		zdtm_fail(kname[k], "returned %ld errno %d (%s)", r, err,
			  strerror(err));
	}

	if (!ok)
		anomalies++;
	else if (r == 0)
		completed[k]++;
	else
		interrupted[k]++;
}

static int64_t ts_ns(const struct timespec *ts)
{
	return (int64_t)ts->tv_sec * 1000000000ll + ts->tv_nsec;
}

static int64_t tv_ns(const struct timeval *tv)
{
	if (tv->tv_usec < 0 || tv->tv_usec >= 1000000)
		return -2; /* nonsense */
	return (int64_t)tv->tv_sec * 1000000000ll + tv->tv_usec * 1000ll;
}

static void one_round(void)
{
	int64_t t0, t1, rem;
	sig_atomic_t sc;
	long r;
	int err;

	/* nanosleep */
	{
		struct timespec req = { SLEEP_NS / 1000000000,
					SLEEP_NS % 1000000000 };
		struct timespec left = { -1, -1 };

		sc = zdtm_sigterm_count;
		t0 = zdtm_now_ns();
		r = nanosleep(&req, &left);
		err = errno;
		t1 = zdtm_now_ns();
		rem = -1;
		if (r == -1 && err == EINTR)
			rem = (left.tv_nsec < 0 || left.tv_nsec >= 1000000000)
				      ? -2 : ts_ns(&left);
		judge(K_NANOSLEEP, r, err, t1 - t0, SLEEP_NS,
		      zdtm_sigterm_count != sc, rem);
	}
	/* select */
	{
		struct timeval tv = { 0, SHORT_NS / 1000 };

		sc = zdtm_sigterm_count;
		t0 = zdtm_now_ns();
		r = select(0, NULL, NULL, NULL, &tv);
		err = errno;
		t1 = zdtm_now_ns();
		judge(K_SELECT, r, err, t1 - t0, SHORT_NS,
		      zdtm_sigterm_count != sc, tv_ns(&tv));
	}
	/* poll */
	{
		sc = zdtm_sigterm_count;
		t0 = zdtm_now_ns();
		r = poll(NULL, 0, (int)(SHORT_NS / 1000000));
		err = errno;
		t1 = zdtm_now_ns();
		judge(K_POLL, r, err, t1 - t0, SHORT_NS,
		      zdtm_sigterm_count != sc, -1);
	}
	/* clock_nanosleep, absolute deadline */
	{
		struct timespec dl;
		int64_t d;

		sc = zdtm_sigterm_count;
		t0 = zdtm_now_ns();
		d = t0 + SHORT_NS;
		dl.tv_sec = d / 1000000000;
		dl.tv_nsec = d % 1000000000;
		r = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &dl, NULL);
		t1 = zdtm_now_ns();
		judge(K_CLOCK_NANOSLEEP, r, 0, t1 - t0, d - t0,
		      zdtm_sigterm_count != sc, -1);
	}
}

int main(int argc, char **argv)
{
	uint64_t iter = 0, total;
	int64_t t_ready, t_end;
	int k;

	zdtm_init(argc, argv, 0, "");
	zdtm_ready();
	t_ready = zdtm_now_ns();

	while (!zdtm_stop) {
		one_round();
		iter++;
		g_iterations++;
	}
	t_end = zdtm_now_ns();

	/* synthetic bogus results must be recognised as anomalies */
	ZDTM_CORRUPT("nanosleep", judge(K_NANOSLEEP, 0, 0, SLEEP_NS / 4,
					SLEEP_NS, 0, -1));
	ZDTM_CORRUPT("select", judge(K_SELECT, -1, EINTR, 1000, SHORT_NS, 0,
				     SHORT_NS / 2));
	ZDTM_CORRUPT("poll", judge(K_POLL, -1, EFAULT, SHORT_NS, SHORT_NS, 0,
				   -1));
	ZDTM_CORRUPT("clock_nanosleep", judge(K_CLOCK_NANOSLEEP, -1, 0,
					      SHORT_NS, SHORT_NS, 0, -1));
	ZDTM_CORRUPT("progress", iter = 0, g_iterations = 7,
		     memset(completed, 0, sizeof(completed)));

	zdtm_check(anomalies == 0, "anomalies",
		   "%llu anomalous syscall results",
		   (unsigned long long)anomalies);

	total = 0;
	for (k = 0; k < K_NR; k++)
		total += completed[k];
	zdtm_check(iter == g_iterations, "progress",
		   "iteration counters disagree: %llu vs %llu",
		   (unsigned long long)iter,
		   (unsigned long long)g_iterations);
	zdtm_check(t_end - t_ready < 2000000000ll || (iter > 0 && total > 0),
		   "progress",
		   "%lld ms since ready but %llu iterations, %llu completed "
		   "calls", (long long)((t_end - t_ready) / 1000000),
		   (unsigned long long)iter, (unsigned long long)total);

	/* one more full round, nothing may interrupt it now */
	{
		uint64_t before[K_NR], a = anomalies;

		memcpy(before, completed, sizeof(before));
		one_round();
		for (k = 0; k < K_NR; k++)
			zdtm_check(completed[k] == before[k] + 1, kname[k],
				   "final uninterrupted %s did not complete",
				   kname[k]);
		zdtm_check(anomalies == a, "anomalies",
			   "anomalies in the final round");
	}
	zdtm_finish();
}
