/*
 * namespaces.c - a tree in PID, mount, UTS, IPC and network namespaces of
 * its own, as a container runtime starts one.  Must be started as
 *
 *   unshare --pid --fork --mount-proc --mount --uts --ipc --net \
 *       namespaces PIDFILE
 *
 * (it is PID 1 of its PID namespace; the pidfile says 1: the harness finds
 * the PID the host sees as the child of unshare).
 *
 * Set up before "ready" (root, PID 1):
 *   uts    host name "stasis-ns-box", domain name "stasis-ns-domain".
 *   lo     the loopback brought up (a new network namespace has it down).
 *   shm    a System V segment (IPC_PRIVATE, 64 KiB) attached and filled
 *          with pattern(SEED_SHM); the IPC namespace has no other segment.
 *   kids   two children A and B, each asleep in a nanosleep loop until
 *          SIGTERM; the root keeps their PIDs (2 and 3: the first PIDs of
 *          the namespace after 1).
 *
 * After SIGTERM:
 *   1. root: getpid() == 1; host and domain names; lo up; the segment's
 *      content and that it is the only one of the IPC namespace (shmctl
 *      SHM_INFO); /proc (the namespace's) lists exactly 1, A and B.
 *   2. root SIGTERMs A and B; each checks getpid() == its saved PID,
 *      getppid() == 1 and the host name, and exits 0 (1 on a mismatch,
 *      reported on stderr); the root checks both exit statuses.
 */
#include "zdtm.h"

#include <dirent.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/socket.h>

#define HOST     "stasis-ns-box"
#define DOMAIN   "stasis-ns-domain"
#define SHM_SIZE (64u << 10)
#define SEED_SHM 0x6e7373686d000000ull

static int lo_flags(short *flags)
{
	struct ifreq r;
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), ok;

	if (s < 0)
		return -1;
	memset(&r, 0, sizeof(r));
	strcpy(r.ifr_name, "lo");
	ok = ioctl(s, SIOCGIFFLAGS, &r);
	close(s);
	*flags = r.ifr_flags;
	return ok;
}

static int lo_set(int up)
{
	struct ifreq r;
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), ok;

	if (s < 0)
		return -1;
	memset(&r, 0, sizeof(r));
	strcpy(r.ifr_name, "lo");
	ok = ioctl(s, SIOCGIFFLAGS, &r);
	if (ok == 0) {
		if (up)
			r.ifr_flags |= IFF_UP | IFF_RUNNING;
		else
			r.ifr_flags &= ~IFF_UP;
		ok = ioctl(s, SIOCSIFFLAGS, &r);
	}
	close(s);
	return ok;
}

/* A and B: sleep until SIGTERM, then check themselves. */
static void kid(const char *who, pid_t want)
{
	char host[64] = "";
	int bad = 0;

	while (!zdtm_stop)
		zdtm_msleep(50);
	if (getpid() != want) {
		zdtm_child_fail(who, "kid_pid", "getpid() %d, expected %d",
				(int)getpid(), (int)want);
		bad = 1;
	}
	if (getppid() != 1) {
		zdtm_child_fail(who, "kid_ppid", "getppid() %d, expected 1",
				(int)getppid());
		bad = 1;
	}
	if (gethostname(host, sizeof(host)) != 0 || strcmp(host, HOST) != 0) {
		zdtm_child_fail(who, "kid_uts", "host name '%s'", host);
		bad = 1;
	}
	_exit(bad);
}

static pid_t spawn(const char *who, pid_t want)
{
	pid_t p = fork();

	if (p < 0)
		zdtm_die("fork: %s", strerror(errno));
	if (p == 0)
		kid(who, want);
	return p;
}

/* The numeric entries of /proc: as a sorted list in out, their count. */
static int proc_pids(int *out, int max)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	int n = 0, i, j;

	if (!d)
		return -1;
	while ((e = readdir(d))) {
		char *end;
		long v = strtol(e->d_name, &end, 10);

		if (*end || end == e->d_name)
			continue;
		if (n < max)
			out[n] = (int)v;
		n++;
	}
	closedir(d);
	for (i = 1; i < n && i < max; i++)
		for (j = i; j > 0 && out[j - 1] > out[j]; j--) {
			int t = out[j];
			out[j] = out[j - 1];
			out[j - 1] = t;
		}
	return n;
}

int main(int argc, char **argv)
{
	char host[64] = "", dom[64] = "";
	struct shm_info info;
	pid_t a, b, extra = 0;
	int shmid, pids[16], n, st;
	short flags = 0;
	uint8_t *seg;

	zdtm_init(argc, argv, 0, "");
	if (getpid() != 1)
		zdtm_die("not PID 1 (start it under unshare --pid --fork "
			 "--mount-proc --mount --uts --ipc --net)");
	if (sethostname(HOST, strlen(HOST)) || setdomainname(DOMAIN, strlen(DOMAIN)))
		zdtm_die("sethostname: %s", strerror(errno));
	if (lo_set(1) != 0)
		zdtm_die("bringing lo up: %s", strerror(errno));
	shmid = shmget(IPC_PRIVATE, SHM_SIZE, IPC_CREAT | 0600);
	if (shmid < 0)
		zdtm_die("shmget: %s", strerror(errno));
	seg = shmat(shmid, NULL, 0);
	if (seg == (void *)-1)
		zdtm_die("shmat: %s", strerror(errno));
	zdtm_fill(seg, SHM_SIZE, SEED_SHM);
	a = spawn("A", 2);
	b = spawn("B", 3);
	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(20);

	ZDTM_CORRUPT("uts", sethostname("x", 1));
	ZDTM_CORRUPT("lo", lo_set(0));
	ZDTM_CORRUPT("shm", seg[100] ^= 1);
	ZDTM_CORRUPT("proc", extra = spawn("X", 4));
	ZDTM_CORRUPT("pid", a = 7);

	zdtm_check(getpid() == 1, "pid", "getpid() %d, expected 1", (int)getpid());
	zdtm_check(a == 2 && b == 3, "pid", "children %d and %d, expected 2 and 3",
		   (int)a, (int)b);
	if (gethostname(host, sizeof(host)) != 0 || getdomainname(dom, sizeof(dom)) != 0)
		zdtm_fail("uts", "gethostname: %s", strerror(errno));
	zdtm_check(strcmp(host, HOST) == 0, "uts", "host name '%s'", host);
	zdtm_check(strcmp(dom, DOMAIN) == 0, "uts", "domain name '%s'", dom);
	zdtm_check(lo_flags(&flags) == 0 && (flags & IFF_UP), "lo",
		   "lo flags %#x (not up)", (unsigned)flags);
	zdtm_verify_pattern("shm", "System V segment", seg, SHM_SIZE, SEED_SHM);
	if (shmctl(0, SHM_INFO, (struct shmid_ds *)&info) < 0)
		zdtm_fail("shm", "shmctl(SHM_INFO): %s", strerror(errno));
	else
		zdtm_check(info.used_ids == 1, "shm",
			   "%d segments in the IPC namespace, expected 1",
			   (int)info.used_ids);
	n = proc_pids(pids, 16);
	zdtm_check(n == 3 && pids[0] == 1 && pids[1] == 2 && pids[2] == 3, "proc",
		   "/proc lists %d processes (%d %d %d...), expected 1 2 3", n,
		   n > 0 ? pids[0] : -1, n > 1 ? pids[1] : -1, n > 2 ? pids[2] : -1);

	if (extra > 0) {
		kill(extra, SIGKILL);
		waitpid(extra, NULL, 0);
	}
	kill(2, SIGTERM);
	kill(3, SIGTERM);
	for (n = 2; n <= 3; n++) {
		if (zdtm_wait_deadline(n, &st, 10000) != 0)
			zdtm_fail("kids", "child %d did not exit", n);
		else
			zdtm_check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kids",
				   "child %d: status %#x", n, st);
	}
	shmdt(seg);
	shmctl(shmid, IPC_RMID, NULL);
	zdtm_finish();
	return 0;
}
