/*
 * timens.c - a tree in a time namespace of its own, whose clocks are far
 * from the host's: CLOCK_MONOTONIC and CLOCK_BOOTTIME must go on from
 * where they were at the checkpoint (never backwards, never a jump larger
 * than the real time that passed), in that namespace.
 *
 *   timens PIDFILE          (must start as root: it makes a time namespace)
 *
 * Set up before "ready" (root R):
 *   ns     R notes the inode of its time namespace (the host's), unshares
 *          a new one (CLONE_NEWTIME), gives it the offsets CLOCK_MONOTONIC
 *          +MONO_DAYS days + MONO_NS ns and CLOCK_BOOTTIME minus half the
 *          host's boot time (whole seconds) + BOOT_NS ns, and enters it
 *          (setns on /proc/self/ns/time_for_children): its monotonic clock
 *          reads more than MONO_DAYS days, its boot-time clock less than
 *          the host's. It notes D = boottime - monotonic, and the
 *          difference of the two offsets in /proc/self/timens_offsets.
 *   C      a child, forked after that (in the namespace too).
 * Both then sample CLOCK_MONOTONIC, CLOCK_BOOTTIME and CLOCK_REALTIME every
 * 10 ms, and check each sample against the one before (a checkpoint falls
 * between two of them): neither clock went backwards (`backwards`), nor
 * moved on more than CLOCK_REALTIME did plus MARGIN_NS (`jump`: real time
 * from a read before the last sample's clocks to one after this one's).  A lost
 * +MONO_DAYS days offset is a jump of 1000 days backwards; offsets given
 * twice, one of as much forwards.
 *
 * After SIGTERM (R):
 *   1. R samples once more (the same checks); its time namespace is its
 *      time_for_children and not the host's (`ns`); its monotonic clock
 *      reads at least MONO_DAYS days (`offset`); D is what it was (within
 *      MARGIN_NS: only a suspend of the host changes it) (`boot-vs-mono`),
 *      and so is the difference of the offsets /proc/self/timens_offsets
 *      shows (`offsets`: a restore gives new offsets, as the host's clocks
 *      have moved on, but both at one instant).
 *   2. R asks C (a byte on a pipe); C samples once more, and answers with
 *      its time namespace and time_for_children, its monotonic clock and
 *      how many of its samples failed which check; R checks they are R's
 *      namespace (`child-ns`), none failed and the clock reads at least
 *      MONO_DAYS days (`child-clock`), and that C exits 0 (`exit`).
 * Self-test: R and C enter the time namespace of R's parent (the host's)
 * right before their last sample, as a restore that lost the namespace
 * would leave them; and R's sample before that is moved a day back, as a
 * restore that gave the offsets twice would look.
 */
#include "zdtm.h"

#include <sched.h>
#include <sys/stat.h>

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

#define NSEC      1000000000ll
#define MONO_DAYS 1000ll
#define MONO_NS   987654321ll
#define BOOT_NS   123456789ll
#define DAY_NS    (86400ll * NSEC)
#define MARGIN_NS (NSEC)

/* The clocks inside, read between two reads of CLOCK_REALTIME: the
 * process may be frozen (or dumped and restored) between any two of them,
 * so a step's real time is counted from the first read of the sample
 * before to the last of this one, which surround both samples' clocks. */
struct sample {
	int64_t real_a, mono, boot, real_b;
};

/* What one process found over its samples. */
struct record {
	unsigned long samples, backwards, jumps;
	struct sample last;
	/* the first failed step, for the report */
	struct sample bad_from, bad_to;
};

struct answer {
	uint64_t ino, kids_ino;
	struct record rec;
};

static int64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	if (clock_gettime(id, &ts))
		return -1;
	return (int64_t)ts.tv_sec * NSEC + ts.tv_nsec;
}

static struct sample take(void)
{
	struct sample s;

	s.real_a = clock_ns(CLOCK_REALTIME);
	s.mono = clock_ns(CLOCK_MONOTONIC);
	s.boot = clock_ns(CLOCK_BOOTTIME);
	s.real_b = clock_ns(CLOCK_REALTIME);
	return s;
}

/* One more sample, checked against the last. */
static void step(struct record *r)
{
	struct sample s = take();
	const struct sample *p = &r->last;
	int64_t real = s.real_b - p->real_a;
	int back = s.mono < p->mono || s.boot < p->boot;
	int jump = s.mono - p->mono > real + MARGIN_NS ||
		   s.boot - p->boot > real + MARGIN_NS;

	if ((back || jump) && !r->backwards && !r->jumps) {
		r->bad_from = *p;
		r->bad_to = s;
	}
	r->backwards += back;
	r->jumps += jump;
	r->samples++;
	r->last = s;
}

static uint64_t ns_ino(const char *name)
{
	char path[64];
	struct stat st;

	snprintf(path, sizeof(path), "/proc/self/ns/%s", name);
	if (stat(path, &st))
		return 0;
	return st.st_ino;
}

/* The offsets of /proc/self/timens_offsets, in ns; 0 if read. */
static int offsets(int64_t *mono, int64_t *boot)
{
	char buf[256], name[32], *line = buf;
	long long sec, nsec;
	int n, found = 0;

	if (zdtm_read_text("/proc/self/timens_offsets", buf, sizeof(buf)) < 0)
		return -1;
	while (sscanf(line, "%31s %lld %lld%n", name, &sec, &nsec, &n) == 3) {
		if (!strcmp(name, "monotonic"))
			*mono = sec * NSEC + nsec, found |= 1;
		else if (!strcmp(name, "boottime"))
			*boot = sec * NSEC + nsec, found |= 2;
		line += n;
	}
	return found == 3 ? 0 : -1;
}

/* Moves the caller into the time namespace of process pid. */
static void enter_time_of(pid_t pid)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/ns/time", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || setns(fd, CLONE_NEWTIME))
		printf("selftest: entering %s failed: %s\n", path,
		       strerror(errno));
	if (fd >= 0)
		close(fd);
}

/* The failed steps of R's samples, under their tags. */
static void report(const struct record *r)
{
	const char *tags[2] = { "backwards", "jump" };
	unsigned long counts[2] = { r->backwards, r->jumps };
	int i;

	for (i = 0; i < 2; i++)
		if (counts[i])
			zdtm_fail(tags[i],
				  "R: %lu of %lu samples went backwards, %lu "
				  "jumped; the first from monotonic %lld "
				  "boottime %lld realtime %lld to %lld %lld "
				  "%lld (ns)",
				  r->backwards, r->samples, r->jumps,
				  (long long)r->bad_from.mono,
				  (long long)r->bad_from.boot,
				  (long long)r->bad_from.real_a,
				  (long long)r->bad_to.mono,
				  (long long)r->bad_to.boot,
				  (long long)r->bad_to.real_b);
}

static void child(int q, int a, pid_t parent)
{
	struct answer ans;
	char c;

	signal(SIGTERM, SIG_IGN);
	memset(&ans, 0, sizeof(ans));
	ans.rec.last = take();
	for (;;) {
		struct timeval tv = { 0, 10000 };
		fd_set fds;

		FD_ZERO(&fds);
		FD_SET(q, &fds);
		if (select(q + 1, &fds, NULL, NULL, &tv) > 0)
			break;
		step(&ans.rec);
	}
	if (read(q, &c, 1) != 1)
		_exit(3);
	if (c == 'c') /* the self-test's corruption, asked for by R */
		enter_time_of(parent);
	step(&ans.rec);
	ans.ino = ns_ino("time");
	ans.kids_ino = ns_ino("time_for_children");
	_exit(write(a, &ans, sizeof(ans)) == sizeof(ans) ? 0 : 4);
}

int main(int argc, char **argv)
{
	int64_t host_boot, boot_sec, mono_off, boot_off, d0, od0, m, b;
	uint64_t host_ino, mine, ino;
	struct record rec;
	struct answer ans;
	char buf[128], cmd = 'w';
	int q[2], a[2], fd, n, st = 0;
	pid_t c, parent = getppid();

	zdtm_init(argc, argv, 0, "");
	if (geteuid() != 0)
		zdtm_die("must start as root (it makes a time namespace)");
	host_ino = ns_ino("time");
	host_boot = clock_ns(CLOCK_BOOTTIME);
	if (!host_ino || host_boot < 2 * NSEC)
		zdtm_die("no time namespace, or a host up for under 2 s");
	if (unshare(CLONE_NEWTIME))
		zdtm_die("unshare(CLONE_NEWTIME)");
	/* Seconds (of either sign), then nanoseconds (0 to 1e9). */
	boot_sec = -(host_boot / NSEC / 2);
	mono_off = MONO_DAYS * DAY_NS + MONO_NS;
	boot_off = boot_sec * NSEC + BOOT_NS;
	n = snprintf(buf, sizeof(buf), "%d %lld %lld\n%d %lld %lld\n",
		     CLOCK_MONOTONIC, MONO_DAYS * 86400, MONO_NS,
		     CLOCK_BOOTTIME, (long long)boot_sec, BOOT_NS);
	fd = open("/proc/self/timens_offsets", O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, buf, n) != n || close(fd))
		zdtm_die("writing /proc/self/timens_offsets (%s)", buf);
	fd = open("/proc/self/ns/time_for_children", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || setns(fd, CLONE_NEWTIME))
		zdtm_die("entering the new time namespace");
	close(fd);
	if (ns_ino("time") == host_ino ||
	    ns_ino("time") != ns_ino("time_for_children"))
		zdtm_die("not in the new time namespace after setns");
	if (offsets(&m, &b) || m != mono_off || b != boot_off)
		zdtm_die("its offsets are not the ones written (%s)", buf);
	od0 = m - b;
	memset(&rec, 0, sizeof(rec));
	rec.last = take();
	d0 = rec.last.boot - rec.last.mono;
	if (rec.last.mono < MONO_DAYS * DAY_NS)
		zdtm_die("the monotonic clock reads %lld ns, not %lld days on",
			 (long long)rec.last.mono, MONO_DAYS);

	if (pipe(q) || pipe(a))
		zdtm_die("pipe");
	c = fork();
	if (c < 0)
		zdtm_die("fork");
	if (c == 0) {
		close(q[1]);
		close(a[0]);
		child(q[0], a[1], parent);
	}
	close(q[0]);
	close(a[1]);

	zdtm_ready();

	while (!zdtm_stop) {
		zdtm_msleep(10);
		step(&rec);
	}

	/* R's namespace, for C's check (before the self-test's move). */
	mine = ns_ino("time");
	ZDTM_CORRUPT("ns", enter_time_of(parent));
	/* Detected by each of these checks (the host's monotonic clock is
	 * 1000 days behind, its boottime - monotonic far from D). */
	ZDTM_CORRUPT("offset", (void)0);
	ZDTM_CORRUPT("backwards", (void)0);
	ZDTM_CORRUPT("boot-vs-mono", (void)0);
	ZDTM_CORRUPT("offsets", (void)0);
	/* The boot-time clock a day (and the namespace's negative offset)
	 * ahead of the last sample: a jump. */
	ZDTM_CORRUPT("jump", rec.last.boot -= DAY_NS);
	step(&rec);
	report(&rec);
	ino = ns_ino("time");
	zdtm_check(ino != host_ino && ino == ns_ino("time_for_children"), "ns",
		   "R's time namespace is %llu (the host's %llu), it makes its "
		   "children in %llu",
		   (unsigned long long)ino, (unsigned long long)host_ino,
		   (unsigned long long)ns_ino("time_for_children"));
	zdtm_check(rec.last.mono >= MONO_DAYS * DAY_NS, "offset",
		   "R's monotonic clock reads %lld ns, under %lld days",
		   (long long)rec.last.mono, MONO_DAYS);
	zdtm_check(llabs(rec.last.boot - rec.last.mono - d0) < MARGIN_NS,
		   "boot-vs-mono",
		   "boottime - monotonic is %lld ns, was %lld ns",
		   (long long)(rec.last.boot - rec.last.mono), (long long)d0);
	if (offsets(&m, &b))
		zdtm_fail("offsets", "/proc/self/timens_offsets unreadable");
	else
		zdtm_check(llabs(m - b - od0) < MARGIN_NS, "offsets",
			   "monotonic offset %lld - boottime offset %lld = "
			   "%lld ns, was %lld ns",
			   (long long)m, (long long)b, (long long)(m - b),
			   (long long)od0);

	ZDTM_CORRUPT("child-ns", cmd = 'c');
	ZDTM_CORRUPT("child-clock", (void)0);
	memset(&ans, 0, sizeof(ans));
	if (write(q[1], &cmd, 1) != 1 ||
	    read(a[0], &ans, sizeof(ans)) != sizeof(ans)) {
		zdtm_fail("exit", "no answer from C: %s", strerror(errno));
	} else {
		zdtm_check(ans.ino == mine && ans.kids_ino == mine &&
				   mine != host_ino,
			   "child-ns",
			   "C is in time namespace %llu, makes its children in "
			   "%llu; R is in %llu",
			   (unsigned long long)ans.ino,
			   (unsigned long long)ans.kids_ino,
			   (unsigned long long)mine);
		zdtm_check(!ans.rec.backwards && !ans.rec.jumps &&
				   ans.rec.last.mono >= MONO_DAYS * DAY_NS,
			   "child-clock",
			   "C: %lu of %lu samples went backwards, %lu jumped "
			   "(first from monotonic %lld boottime %lld to %lld "
			   "%lld); its monotonic clock reads %lld ns",
			   ans.rec.backwards, ans.rec.samples, ans.rec.jumps,
			   (long long)ans.rec.bad_from.mono,
			   (long long)ans.rec.bad_from.boot,
			   (long long)ans.rec.bad_to.mono,
			   (long long)ans.rec.bad_to.boot,
			   (long long)ans.rec.last.mono);
	}
	if (zdtm_wait_deadline(c, &st, 5000))
		zdtm_fail("exit", "C did not exit: %s", strerror(errno));
	else
		zdtm_check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit",
			   "C ended with status %#x, expected exit 0", st);
	zdtm_finish();
}
