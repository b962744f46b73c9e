/*
 * mqueue_fds.c - fds on POSIX message queues of the dumper's IPC namespace
 * (no namespace of the workload's own): a named queue and one unlinked
 * since it was opened. Both are saved with their fds: the named one is
 * made again over whatever holds its name at the restore (a
 * --leave-running dump's run removes it at its end), the unlinked one
 * under a name of its own, then unlinked.
 *
 *   mqueue_fds PIDFILE
 *
 * Set up before "ready":
 *   /stasis-wl-mqn-PID, mode 0640, 6 messages of 40 bytes at most, open
 *     read-write non-blocking (rw) and write-only blocking (wo), holding 5
 *     messages of priorities 2, 0, 7, 2, 7 (one empty, one of 40 bytes);
 *   /stasis-wl-mqd-PID, mode 0600, 3 messages of 16 bytes at most, open
 *     read-only non-blocking (dr) and write-only blocking (dw), holding 2
 *     messages, then unlinked.
 * After SIGTERM (tags in brackets):
 *   [attrs]    each fd's mq_getattr (flags, maxmsg, msgsize, curmsgs), its
 *              access mode (F_GETFL), close-on-exec, the queues' modes;
 *   [named]    the name opens the queue rw and wo are on;
 *   [deleted]  dr and dw are on one queue, which no name opens;
 *   [messages] each queue gives its messages back highest priority first,
 *              oldest first within one, byte for byte, then is empty;
 *   [shared]   a message sent through wo (dw) is received through rw (dr).
 */
#include "zdtm.h"

#include <fcntl.h>
#include <mqueue.h>
#include <sys/stat.h>

#define SEED_M 0x6d71666400ull
#define NLEN 40
#define DLEN 16

struct msg {
	const char *data; /* NULL: the 40 pattern bytes */
	size_t len;
	unsigned prio;
};

/* In the order sent. */
static const struct msg named_sent[] = {
	{ "alpha", 5, 2 }, { "", 0, 0 }, { "beta", 4, 7 }, { NULL, NLEN, 2 }, { "gamma", 5, 7 },
};
/* In the order they are received. */
static const struct msg named_got[] = {
	{ "beta", 4, 7 }, { "gamma", 5, 7 }, { "alpha", 5, 2 }, { NULL, NLEN, 2 }, { "", 0, 0 },
};
static const struct msg del_got[] = { { "two", 3, 5 }, { "one", 3, 1 } };

static char named[64], del[64];
static unsigned char pat[NLEN];

static void check_attrs(mqd_t q, const char *what, long flags, long maxmsg, long msgsize,
			long cur, int access, mode_t mode)
{
	struct mq_attr a;
	struct stat st;
	int fl, fdf;

	if (!zdtm_check(mq_getattr(q, &a) == 0 && fstat(q, &st) == 0, "attrs",
			"%s: mq_getattr: %s", what, strerror(errno)))
		return;
	zdtm_check(a.mq_flags == flags && a.mq_maxmsg == maxmsg && a.mq_msgsize == msgsize &&
			   a.mq_curmsgs == cur,
		   "attrs", "%s: flags %lx maxmsg %ld msgsize %ld curmsgs %ld; expected %lx %ld %ld %ld",
		   what, a.mq_flags, a.mq_maxmsg, a.mq_msgsize, a.mq_curmsgs, flags, maxmsg, msgsize,
		   cur);
	zdtm_check((st.st_mode & 07777) == mode, "attrs", "%s: mode %o, expected %o", what,
		   st.st_mode & 07777, mode);
	fl = fcntl(q, F_GETFL);
	fdf = fcntl(q, F_GETFD);
	zdtm_check(fl >= 0 && (fl & O_ACCMODE) == access, "attrs",
		   "%s: access mode %d, expected %d", what, fl & O_ACCMODE, access);
	zdtm_check(fdf >= 0 && (fdf & FD_CLOEXEC), "attrs", "%s: not close-on-exec", what);
}

static void check_messages(mqd_t q, const char *what, const struct msg *want, int n, size_t size)
{
	char buf[NLEN + 1];
	unsigned prio;
	ssize_t got;
	int i;

	for (i = 0; i < n; i++) {
		const void *data = want[i].data ? (const void *)want[i].data : pat;

		got = mq_receive(q, buf, size, &prio);
		if (!zdtm_check(got >= 0, "messages", "%s: message %d: %s", what, i,
				strerror(errno)))
			return;
		zdtm_check((size_t)got == want[i].len && prio == want[i].prio &&
				   memcmp(buf, data, want[i].len) == 0,
			   "messages", "%s: message %d: %zd bytes of priority %u, expected %zu of %u",
			   what, i, got, prio, want[i].len, want[i].prio);
	}
	got = mq_receive(q, buf, size, &prio);
	zdtm_check(got < 0 && errno == EAGAIN, "messages", "%s: a message more (%zd)", what,
		   got);
}

static int same_queue(mqd_t a, mqd_t b)
{
	struct stat x, y;

	return fstat(a, &x) == 0 && fstat(b, &y) == 0 && x.st_dev == y.st_dev &&
	       x.st_ino == y.st_ino;
}

static void pass_through(mqd_t to, mqd_t from, const char *what, size_t size)
{
	char buf[NLEN + 1];
	unsigned prio = 0;
	ssize_t n = -1;

	if (mq_send(to, "through", 7, 4) == 0)
		n = mq_receive(from, buf, size, &prio);
	zdtm_check(n == 7 && prio == 4 && memcmp(buf, "through", 7) == 0, "shared",
		   "%s: sent and received %zd bytes of priority %u (%s)", what, n, prio,
		   strerror(errno));
}

int main(int argc, char **argv)
{
	struct mq_attr na = { .mq_maxmsg = 6, .mq_msgsize = NLEN };
	struct mq_attr da = { .mq_maxmsg = 3, .mq_msgsize = DLEN };
	mqd_t rw, wo, dr, dw, q;
	mode_t um;
	size_t i;

	zdtm_init(argc, argv, 0, "");
	snprintf(named, sizeof(named), "/stasis-wl-mqn-%d", getpid());
	snprintf(del, sizeof(del), "/stasis-wl-mqd-%d", getpid());
	zdtm_fill(pat, NLEN, SEED_M);
	mq_unlink(named);
	mq_unlink(del);
	um = umask(0);
	rw = mq_open(named, O_CREAT | O_EXCL | O_RDWR | O_NONBLOCK, 0640, &na);
	dr = mq_open(del, O_CREAT | O_EXCL | O_RDONLY | O_NONBLOCK, 0600, &da);
	umask(um);
	if (rw < 0 || dr < 0)
		zdtm_die("mq_open: %s", strerror(errno));
	wo = mq_open(named, O_WRONLY);
	dw = mq_open(del, O_WRONLY);
	if (wo < 0 || dw < 0)
		zdtm_die("mq_open: %s", strerror(errno));
	for (i = 0; i < sizeof(named_sent) / sizeof(named_sent[0]); i++)
		if (mq_send(wo, named_sent[i].data ? named_sent[i].data : (const char *)pat,
			    named_sent[i].len, named_sent[i].prio))
			zdtm_die("mq_send: %s", strerror(errno));
	if (mq_send(dw, "one", 3, 1) || mq_send(dw, "two", 3, 5) || mq_unlink(del))
		zdtm_die("deleted queue: %s", strerror(errno));

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);

	ZDTM_CORRUPT("attrs", fchmod(dr, 0644));
	ZDTM_CORRUPT("named", {
		mq_unlink(named);
		mq_close(mq_open(named, O_CREAT | O_RDWR, 0640, &na));
	});
	ZDTM_CORRUPT("deleted", mq_close(mq_open(del, O_CREAT | O_RDWR, 0600, &da)));
	ZDTM_CORRUPT("messages", {
		char b[NLEN];
		mq_receive(dr, b, DLEN, NULL);
	});
	ZDTM_CORRUPT("shared", {
		char n2[80];
		mqd_t o;

		snprintf(n2, sizeof(n2), "%s-other", del);
		o = mq_open(n2, O_CREAT | O_RDWR, 0600, &da);
		mq_unlink(n2);
		dup2(o, dw);
	});

	check_attrs(rw, "rw", O_NONBLOCK, 6, NLEN, 5, O_RDWR, 0640);
	check_attrs(wo, "wo", 0, 6, NLEN, 5, O_WRONLY, 0640);
	check_attrs(dr, "dr", O_NONBLOCK, 3, DLEN, 2, O_RDONLY, 0600);
	check_attrs(dw, "dw", 0, 3, DLEN, 2, O_WRONLY, 0600);

	q = mq_open(named, O_RDONLY);
	if (zdtm_check(q >= 0, "named", "%s: %s", named, strerror(errno))) {
		zdtm_check(same_queue(q, rw) && same_queue(q, wo), "named",
			   "%s is not the queue of the fds", named);
		mq_close(q);
	}
	q = mq_open(del, O_RDONLY);
	zdtm_check(q < 0 && errno == ENOENT, "deleted", "%s opens (%s)", del, strerror(errno));
	if (q >= 0)
		mq_close(q);
	zdtm_check(same_queue(dr, dw), "deleted", "dr and dw are on two queues");

	check_messages(rw, "named", named_got, 5, NLEN);
	check_messages(dr, "deleted", del_got, 2, DLEN);
	pass_through(wo, rw, "named", NLEN);
	{
		struct mq_attr nb = { .mq_flags = O_NONBLOCK };
		char buf[DLEN];
		unsigned prio = 0;
		ssize_t n = -1;

		/* dr is non-blocking; dw blocking: a send to the wrong queue
		 * would block on a full one, so it is sent non-blocking. */
		mq_setattr(dw, &nb, NULL);
		if (mq_send(dw, "through", 7, 4) == 0)
			n = mq_receive(dr, buf, DLEN, &prio);
		zdtm_check(n == 7 && prio == 4 && memcmp(buf, "through", 7) == 0, "shared",
			   "deleted: sent and received %zd bytes of priority %u (%s)", n, prio,
			   strerror(errno));
	}
	mq_unlink(named);
	mq_unlink(del); /* made by a corruption */
	zdtm_finish();
	return 0;
}
