/*
 * attrs.c - process and thread attributes that must survive
 * checkpoint/restore: scheduling policies and nice values, the OOM score
 * adjustment, PR_SET_THP_DISABLE, the audit login uid and the membarrier
 * registrations (zdtm's sched_prio00, sched_policy00, oom_score_adj,
 * thp_disable, loginuid, membarrier).
 *
 *   attrs PIDFILE
 *
 * Set up before "ready" (needs root for the real-time policies):
 *   main      SCHED_OTHER, nice 3
 *   worker 0  SCHED_BATCH, nice 7
 *   worker 1  SCHED_IDLE
 *   worker 2  SCHED_FIFO, priority 10, SCHED_FLAG_RESET_ON_FORK
 *   worker 3  SCHED_RR, priority 5
 *   process   oom_score_adj 321, PR_SET_THP_DISABLE, loginuid 4242 (where
 *             the kernel has audit: /proc/self/loginuid exists), registered
 *             for private expedited membarriers (and sync-core ones where
 *             the kernel has them)
 * Each thread sets its own attributes with sched_setattr(0, ...) and records
 * what sched_getattr(0) then reports.  While waiting, every thread sleeps in
 * 5 ms steps (a real-time thread must not spin).  After SIGTERM, every
 * thread reads sched_getattr(0) again, and main compares each with what was
 * recorded (policy, flags, nice, priority; zdtm.h is not thread-safe, so
 * main alone reports) and reads back /proc/self/oom_score_adj,
 * PR_GET_THP_DISABLE and /proc/self/loginuid; a private expedited
 * membarrier must succeed, and MEMBARRIER_CMD_GET_REGISTRATIONS (where the
 * kernel has it) report what it did (`membarrier`).
 */
#include "zdtm.h"

#include <pthread.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#define NWORKERS 4

struct attr {
	uint32_t size;
	uint32_t policy;
	uint64_t flags;
	int32_t nice;
	uint32_t priority;
	uint64_t runtime, deadline, period;
	uint32_t util_min, util_max;
};

#define RESET_ON_FORK 0x01ull

struct want {
	uint32_t policy;
	uint64_t flags;
	int32_t nice;
	uint32_t priority;
};

static const struct want wants[NWORKERS + 1] = {
	{ SCHED_OTHER, 0, 3, 0 },
	{ SCHED_BATCH, 0, 7, 0 },
	{ SCHED_IDLE, 0, 0, 0 },
	{ SCHED_FIFO, RESET_ON_FORK, 0, 10 },
	{ SCHED_RR, 0, 0, 5 },
};

static struct attr got[NWORKERS + 1], after[NWORKERS + 1];
static int after_rc[NWORKERS + 1];
static volatile int finish;
static pthread_barrier_t set_up;

static int get_attr(struct attr *a)
{
	memset(a, 0, sizeof(*a));
	return (int)syscall(SYS_sched_getattr, 0, a, sizeof(*a), 0);
}

static int set_own(int i)
{
	struct attr a;

	memset(&a, 0, sizeof(a));
	a.size = 48; /* version 0: no utilization clamps */
	a.policy = wants[i].policy;
	a.flags = wants[i].flags;
	a.nice = wants[i].nice;
	a.priority = wants[i].priority;
	if (syscall(SYS_sched_setattr, 0, &a, 0) != 0)
		return -1;
	return get_attr(&got[i]);
}

static void nap(void)
{
	struct timespec ts = { 0, 5 * 1000 * 1000 };

	nanosleep(&ts, NULL);
}

static void check(int i)
{
	const struct attr a = after[i];
	const char *tags[NWORKERS + 1] = { "main", "batch", "idle", "fifo", "rr" };

	if (after_rc[i] != 0) {
		zdtm_fail(tags[i], "sched_getattr failed");
		return;
	}
	zdtm_check(a.policy == got[i].policy, tags[i], "policy %u, want %u", a.policy,
		   got[i].policy);
	zdtm_check(a.flags == got[i].flags, tags[i], "flags %#llx, want %#llx",
		   (unsigned long long)a.flags, (unsigned long long)got[i].flags);
	zdtm_check(a.nice == got[i].nice, tags[i], "nice %d, want %d", a.nice, got[i].nice);
	zdtm_check(a.priority == got[i].priority, tags[i], "priority %u, want %u", a.priority,
		   got[i].priority);
}

static void *worker(void *arg)
{
	int i = (int)(intptr_t)arg;

	if (set_own(i + 1) != 0) {
		fprintf(stderr, "worker %d: sched_setattr: %s\n", i, strerror(errno));
		exit(2);
	}
	pthread_barrier_wait(&set_up);
	while (!finish)
		nap();
	if (i == 2)
		ZDTM_CORRUPT("fifo", {
			struct attr a = got[3];
			a.size = 48;
			a.priority = 11;
			syscall(SYS_sched_setattr, 0, &a, 0);
		});
	after_rc[i + 1] = get_attr(&after[i + 1]);
	return NULL;
}

static long read_proc(const char *path)
{
	FILE *f = fopen(path, "r");
	long v = -9999;

	if (!f)
		return v;
	if (fscanf(f, "%ld", &v) != 1)
		v = -9999;
	fclose(f);
	return v;
}

static void write_proc(const char *path, long v)
{
	FILE *f = fopen(path, "w");

	if (!f || fprintf(f, "%ld", v) < 0 || fclose(f) != 0) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		exit(2);
	}
}

#define OOM "/proc/self/oom_score_adj"
#define LOGINUID "/proc/self/loginuid"

#define MB_QUERY 0
#define MB_REGISTER_GLOBAL_EXPEDITED (1 << 2)
#define MB_PRIVATE_EXPEDITED (1 << 3)
#define MB_REGISTER_PRIVATE_EXPEDITED (1 << 4)
#define MB_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE (1 << 6)
#define MB_GET_REGISTRATIONS (1 << 9)

static long membarrier(int cmd)
{
	return syscall(SYS_membarrier, cmd, 0, 0);
}

int main(int argc, char **argv)
{
	pthread_t t[NWORKERS];
	long mb_supported, mb_registered = -1;
	int i;

	int audit = access(LOGINUID, F_OK) == 0;

	zdtm_init(argc, argv, 0, "");
	write_proc(OOM, 321);
	if (audit)
		write_proc(LOGINUID, 4242);
	if (prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0) {
		fprintf(stderr, "PR_SET_THP_DISABLE: %s\n", strerror(errno));
		return 2;
	}
	mb_supported = membarrier(MB_QUERY);
	if (mb_supported < 0 || membarrier(MB_REGISTER_PRIVATE_EXPEDITED) ||
	    ((mb_supported & MB_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE) &&
	     membarrier(MB_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE))) {
		fprintf(stderr, "membarrier: %s\n", strerror(errno));
		return 2;
	}
	if (mb_supported & MB_GET_REGISTRATIONS)
		mb_registered = membarrier(MB_GET_REGISTRATIONS);
	if (set_own(0) != 0) {
		fprintf(stderr, "main: sched_setattr: %s\n", strerror(errno));
		return 2;
	}
	pthread_barrier_init(&set_up, NULL, NWORKERS + 1);
	for (i = 0; i < NWORKERS; i++)
		if (pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i) != 0) {
			fprintf(stderr, "pthread_create failed\n");
			return 2;
		}
	pthread_barrier_wait(&set_up);
	zdtm_ready();
	while (!zdtm_stop)
		nap();
	ZDTM_CORRUPT("oom", write_proc(OOM, 100));
	ZDTM_CORRUPT("thp", prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0));
	if (audit)
		ZDTM_CORRUPT("loginuid", write_proc(LOGINUID, 4343));
	ZDTM_CORRUPT("main", setpriority(PRIO_PROCESS, 0, 4));
	ZDTM_CORRUPT("membarrier", membarrier(MB_REGISTER_GLOBAL_EXPEDITED));
	finish = 1;
	for (i = 0; i < NWORKERS; i++)
		pthread_join(t[i], NULL);
	after_rc[0] = get_attr(&after[0]);
	for (i = 0; i <= NWORKERS; i++)
		check(i);
	zdtm_check(read_proc(OOM) == 321, "oom", "oom_score_adj %ld, want 321", read_proc(OOM));
	zdtm_check(prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1, "thp", "THP not disabled");
	if (audit)
		zdtm_check(read_proc(LOGINUID) == 4242, "loginuid", "loginuid %ld, want 4242",
			   read_proc(LOGINUID));
	zdtm_check(membarrier(MB_PRIVATE_EXPEDITED) == 0, "membarrier",
		   "a private expedited membarrier: %s", strerror(errno));
	if (mb_registered >= 0)
		zdtm_check(membarrier(MB_GET_REGISTRATIONS) == mb_registered, "membarrier",
			   "registrations %#lx, were %#lx", membarrier(MB_GET_REGISTRATIONS),
			   mb_registered);
	zdtm_finish();
}
