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
 *   msg    a System V message queue (key MSGQ_KEY, mode 0640, msg_qbytes
 *          QBYTES) holding three messages: type 5 with MSGQ_LEN bytes of
 *          pattern(SEED_MSGQ), type 2 with "two", type 5 empty.
 *   sem    a System V semaphore set (key SEM_KEY, mode 0604) of three
 *          semaphores valued 1, 5 and 32767.
 *   kids   two children A and B, each asleep in a nanosleep loop until
 *          SIGTERM; the root keeps their PIDs (2 and 3: the first PIDs of
 *          the namespace after 1).
 *   tmpfs  a tmpfs (size=4m, mode=0755) mounted on /mnt, holding a directory
 *          stasis-ns with a file data (TMPFS_LEN bytes of pattern(SEED_FILE),
 *          mode 0640) and a symbolic link to it; the root keeps the file
 *          open read-write at offset FILE_POS and the directory open; a
 *          unix stream listener of the root bound to TSOCK there.
 *   pmq    POSIX message queues of the IPC namespace, its msg_max raised to
 *          PMQ_MSG_MAX (/proc/sys/fs/mqueue), its mqueue mounted on PMQ_DIR
 *          (in the tmpfs): PMQ_A (mode 0640, 40 messages of 200 bytes at
 *          most) holding five messages sent as (3, 200 bytes of
 *          pattern(SEED_PMQ)), (9, "nine"), (3, "three-2"), (0, empty),
 *          (9, "nine-2"); the root keeps it open read-write non-blocking
 *          (mq_open) and write-only, blocking, through the mount (open);
 *          PMQ_B (owner 1:2, mode 0604, 2 messages of 16 bytes at most)
 *          holding (32767, "last"), and PMQ_C (mode 0600, default
 *          attributes) empty, with no fd open on either.
 *   thread a second thread T of the root (TID 4 in the namespace), asleep
 *          until SIGTERM.
 *   net    a TCP listener of the root on 127.0.0.1:PORT; A connects to it
 *          (the root accepts) and sends IN_LEN bytes of pattern(SEED_IN)
 *          that the root leaves unread; a unix socketpair between the root
 *          and B.
 *
 * After SIGTERM:
 *   1. root: getpid() == 1; host and domain names; lo up; the segment's
 *      content and that it is the only one of the IPC namespace (shmctl
 *      SHM_INFO); /proc (the namespace's) lists exactly 1, A and B.
 *      The queue has its id (msgget of its key), mode, size and three
 *      messages, taken by type 2 first then in order, byte for byte; the
 *      set its id, mode and values; each is the only one of its kind in
 *      the namespace (MSG_INFO, SEM_INFO).
 *      The POSIX queues: PMQ_DIR lists exactly the three; msg_max; each
 *      queue's attributes, owner and mode; the fds' access modes and
 *      flags; PMQ_A's messages taken through the read-write fd in priority
 *      order (nine, nine-2, the pattern, three-2, empty), byte for byte
 *      with their priorities, then a message sent through the write-only
 *      fd comes out of the read-write one; PMQ_B's message.
 *      T's gettid() is still the TID it had (4), and getpid() 1 in it.
 *      /mnt is a tmpfs with the directory, the file (content and mode)
 *      and the link; the open file is that file (device and inode) at
 *      FILE_POS, the open directory that directory (fstatat of data);
 *      TSOCK is a socket a new client connects to and the listener accepts.
 *      The bytes A sent are still queued on the root's end of the TCP
 *      connection; a new connection to the listener is accepted.
 *   2. root sends MSG_LEN bytes of pattern(SEED_TCP) to A and of
 *      pattern(SEED_UNIX) to B, SIGTERMs A and B; each checks getpid() ==
 *      its saved PID, getppid() == 1, the host name and what it received,
 *      A sends MSG_LEN bytes of pattern(SEED_BACK) back, and each exits 0
 *      (1 on a mismatch, reported on stderr); the root checks A's bytes
 *      and both exit statuses.
 */
#include "zdtm.h"

#include <dirent.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <linux/magic.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <mqueue.h>

#define HOST     "stasis-ns-box"
#define DOMAIN   "stasis-ns-domain"
#define SHM_SIZE (64u << 10)
#define SEED_SHM 0x6e7373686d000000ull
#define SEED_IN   0x6e73696e00000000ull
#define SEED_TCP  0x6e73746370000000ull
#define SEED_UNIX 0x6e73756e78000000ull
#define SEED_BACK 0x6e736261636b0000ull
#define SEED_FILE 0x6e7366696c650000ull
#define TMPFS_LEN (100u << 10)
#define FILE_POS 4321
#define TDIR     "/mnt/stasis-ns"
#define TFILE    TDIR "/data"
#define TLINK    TDIR "/link"
#define TSOCK    TDIR "/sock"
#define PORT     47123
#define IN_LEN   3000
#define MSG_LEN  8192
#define MSGQ_KEY 0x57a5150
#define SEM_KEY  0x57a5151
#define MSGQ_LEN 1000
#define QBYTES   9000
#define PMQ_DIR  "/mnt/mq"
#define PMQ_A    "/stasis-pmq-a"
#define PMQ_B    "/stasis-pmq-b"
#define PMQ_C    "/stasis-pmq-c"
#define PMQ_LEN  200
#define PMQ_MSG_MAX 64
#define SEED_PMQ 0x6e73706d71000000ull
#define SEED_MSGQ 0x6e736d7367000000ull

union semun {
	int val;
	struct semid_ds *buf;
	unsigned short *array;
};

struct qmsg {
	long mtype;
	uint8_t text[MSGQ_LEN];
};

/* Sets up the queue and the semaphore set; their ids. */
static void ipc_setup(int *msq, int *sem)
{
	static struct qmsg m;
	struct msqid_ds ds;
	unsigned short vals[3] = { 1, 5, 32767 };
	union semun arg = { .array = vals };

	*msq = msgget(MSGQ_KEY, IPC_CREAT | IPC_EXCL | 0640);
	if (*msq < 0 || msgctl(*msq, IPC_STAT, &ds))
		zdtm_die("msgget: %s", strerror(errno));
	ds.msg_qbytes = QBYTES;
	if (msgctl(*msq, IPC_SET, &ds))
		zdtm_die("msgctl(IPC_SET): %s", strerror(errno));
	m.mtype = 5;
	zdtm_fill(m.text, MSGQ_LEN, SEED_MSGQ);
	if (msgsnd(*msq, &m, MSGQ_LEN, 0))
		zdtm_die("msgsnd: %s", strerror(errno));
	m.mtype = 2;
	memcpy(m.text, "two", 3);
	if (msgsnd(*msq, &m, 3, 0))
		zdtm_die("msgsnd: %s", strerror(errno));
	m.mtype = 5;
	if (msgsnd(*msq, &m, 0, 0))
		zdtm_die("msgsnd: %s", strerror(errno));
	*sem = semget(SEM_KEY, 3, IPC_CREAT | IPC_EXCL | 0604);
	if (*sem < 0 || semctl(*sem, 0, SETALL, arg))
		zdtm_die("semget: %s", strerror(errno));
}

/* Checks the queue and the set (ids msq and sem before the dump). */
static void ipc_check(int msq, int sem)
{
	static struct qmsg m;
	struct msqid_ds ds;
	struct semid_ds sds;
	struct msginfo mi;
	struct seminfo si;
	unsigned short vals[3] = { 0, 0, 0 };
	union semun arg;
	ssize_t n;

	zdtm_check(msgget(MSGQ_KEY, 0) == msq, "msg", "queue of key %#x: id %d, expected %d",
		   MSGQ_KEY, msgget(MSGQ_KEY, 0), msq);
	if (msgctl(msq, IPC_STAT, &ds))
		zdtm_fail("msg", "msgctl(IPC_STAT): %s", strerror(errno));
	else
		zdtm_check((ds.msg_perm.mode & 0777) == 0640 && ds.msg_qbytes == QBYTES &&
				   ds.msg_qnum == 3 && ds.msg_perm.__key == MSGQ_KEY,
			   "msg", "queue: mode %o, qbytes %lu, %lu messages",
			   (unsigned)ds.msg_perm.mode, (unsigned long)ds.msg_qbytes,
			   (unsigned long)ds.msg_qnum);
	n = msgrcv(msq, &m, MSGQ_LEN, 2, IPC_NOWAIT);
	zdtm_check(n == 3 && m.mtype == 2 && memcmp(m.text, "two", 3) == 0, "msg",
		   "message of type 2: %zd bytes, type %ld", n, m.mtype);
	memset(&m, 0, sizeof(m));
	n = msgrcv(msq, &m, MSGQ_LEN, 0, IPC_NOWAIT);
	if (n != MSGQ_LEN || m.mtype != 5)
		zdtm_fail("msg", "first message: %zd bytes, type %ld", n, m.mtype);
	else
		zdtm_verify_pattern("msg", "first message", m.text, MSGQ_LEN, SEED_MSGQ);
	n = msgrcv(msq, &m, MSGQ_LEN, 0, IPC_NOWAIT);
	zdtm_check(n == 0 && m.mtype == 5, "msg", "third message: %zd bytes, type %ld", n,
		   m.mtype);
	zdtm_check(msgrcv(msq, &m, MSGQ_LEN, 0, IPC_NOWAIT) < 0 && errno == ENOMSG, "msg",
		   "a fourth message");
	zdtm_check(msgctl(0, MSG_INFO, (struct msqid_ds *)&mi) >= 0 && mi.msgpool == 1, "msg",
		   "%d queues in the IPC namespace, expected 1", mi.msgpool);

	zdtm_check(semget(SEM_KEY, 0, 0) == sem, "sem", "set of key %#x: id %d, expected %d",
		   SEM_KEY, semget(SEM_KEY, 0, 0), sem);
	arg.buf = &sds;
	zdtm_check(semctl(sem, 0, IPC_STAT, arg) == 0 && (sds.sem_perm.mode & 0777) == 0604 &&
			   sds.sem_nsems == 3,
		   "sem", "set: mode %o, %lu semaphores", (unsigned)sds.sem_perm.mode,
		   (unsigned long)sds.sem_nsems);
	arg.array = vals;
	zdtm_check(semctl(sem, 0, GETALL, arg) == 0 && vals[0] == 1 && vals[1] == 5 &&
			   vals[2] == 32767,
		   "sem", "values %u %u %u, expected 1 5 32767", vals[0], vals[1], vals[2]);
	arg.buf = (struct semid_ds *)&si;
	zdtm_check(semctl(0, 0, SEM_INFO, arg) >= 0 && si.semusz == 1, "sem",
		   "%d sets in the IPC namespace, expected 1", si.semusz);
}

/* Sets up the POSIX queues (the mqueue mount on PMQ_DIR first); the
 * read-write and write-only fds on PMQ_A. */
static void pmq_setup(mqd_t *rw, int *wo)
{
	static uint8_t big[PMQ_LEN];
	struct mq_attr a = { .mq_maxmsg = 40, .mq_msgsize = PMQ_LEN };
	struct mq_attr b = { .mq_maxmsg = 2, .mq_msgsize = 16 };
	mqd_t q;
	int fd;

	if (mkdir(PMQ_DIR, 0755) || mount("mqueue", PMQ_DIR, "mqueue", 0, NULL))
		zdtm_die("mounting an mqueue on %s: %s", PMQ_DIR, strerror(errno));
	fd = open("/proc/sys/fs/mqueue/msg_max", O_WRONLY);
	if (fd < 0 || dprintf(fd, "%d\n", PMQ_MSG_MAX) < 0 || close(fd))
		zdtm_die("raising msg_max: %s", strerror(errno));
	umask(0);
	*rw = mq_open(PMQ_A, O_CREAT | O_EXCL | O_RDWR | O_NONBLOCK, 0640, &a);
	if (*rw < 0)
		zdtm_die("mq_open %s: %s", PMQ_A, strerror(errno));
	zdtm_fill(big, PMQ_LEN, SEED_PMQ);
	if (mq_send(*rw, (char *)big, PMQ_LEN, 3) || mq_send(*rw, "nine", 4, 9) ||
	    mq_send(*rw, "three-2", 7, 3) || mq_send(*rw, "", 0, 0) ||
	    mq_send(*rw, "nine-2", 6, 9))
		zdtm_die("mq_send: %s", strerror(errno));
	*wo = open(PMQ_DIR PMQ_A, O_WRONLY);
	if (*wo < 0)
		zdtm_die("opening %s: %s", PMQ_DIR PMQ_A, strerror(errno));
	q = mq_open(PMQ_B, O_CREAT | O_EXCL | O_RDWR, 0604, &b);
	if (q < 0 || mq_send(q, "last", 4, 32767) || fchown(q, 1, 2) || mq_close(q))
		zdtm_die("%s: %s", PMQ_B, strerror(errno));
	q = mq_open(PMQ_C, O_CREAT | O_EXCL | O_RDWR, 0600, NULL);
	if (q < 0 || mq_close(q))
		zdtm_die("%s: %s", PMQ_C, strerror(errno));
	umask(022);
}

/* Checks one queue's attributes, owner and mode. */
static void pmq_check_attrs(mqd_t q, const char *name, long maxmsg, long msgsize, long cur,
			    unsigned mode, uid_t uid, gid_t gid)
{
	struct mq_attr a;
	struct stat st;

	if (mq_getattr(q, &a) || fstat(q, &st)) {
		zdtm_fail("pmq", "%s: mq_getattr: %s", name, strerror(errno));
		return;
	}
	zdtm_check(a.mq_maxmsg == maxmsg && a.mq_msgsize == msgsize && a.mq_curmsgs == cur,
		   "pmq", "%s: maxmsg %ld, msgsize %ld, %ld messages; expected %ld, %ld, %ld",
		   name, a.mq_maxmsg, a.mq_msgsize, a.mq_curmsgs, maxmsg, msgsize, cur);
	zdtm_check((st.st_mode & 07777) == mode && st.st_uid == uid && st.st_gid == gid,
		   "pmq_owner", "%s: mode %o, owner %d:%d; expected %o, %d:%d", name,
		   (unsigned)(st.st_mode & 07777), (int)st.st_uid, (int)st.st_gid, mode,
		   (int)uid, (int)gid);
}

/* Checks the POSIX queues (rw, wo: the fds on PMQ_A). */
static void pmq_check(mqd_t rw, int wo)
{
	static const struct {
		unsigned prio;
		const char *text;
	} want[] = { { 9, "nine" }, { 9, "nine-2" }, { 3, NULL }, { 3, "three-2" }, { 0, "" } };
	static char m[PMQ_LEN];
	char text[32] = "";
	unsigned prio, i;
	ssize_t n;
	int names = 0;
	mqd_t q;
	DIR *d;
	struct dirent *e;

	d = opendir(PMQ_DIR);
	while (d && (e = readdir(d)))
		names += e->d_name[0] != '.';
	if (d)
		closedir(d);
	zdtm_check(names == 3, "pmq", "%s lists %d queues, expected 3", PMQ_DIR, names);
	zdtm_check(zdtm_read_text("/proc/sys/fs/mqueue/msg_max", text, sizeof(text)) > 0 &&
			   atoi(text) == PMQ_MSG_MAX,
		   "pmq", "msg_max %s, expected %d", text, PMQ_MSG_MAX);
	pmq_check_attrs(rw, PMQ_A, 40, PMQ_LEN, 5, 0640, 0, 0);
	zdtm_check((fcntl(rw, F_GETFL) & (O_ACCMODE | O_NONBLOCK)) == (O_RDWR | O_NONBLOCK),
		   "pmq", "the read-write fd's flags %#x", fcntl(rw, F_GETFL));
	zdtm_check((fcntl(wo, F_GETFL) & (O_ACCMODE | O_NONBLOCK)) == O_WRONLY, "pmq",
		   "the write-only fd's flags %#x", fcntl(wo, F_GETFL));
	for (i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		memset(m, 0, sizeof(m));
		n = mq_receive(rw, m, PMQ_LEN, &prio);
		if (n < 0) {
			zdtm_fail("pmq", "message %u: %s", i, strerror(errno));
			continue;
		}
		if (!want[i].text) {
			if (n != PMQ_LEN || prio != 3)
				zdtm_fail("pmq", "message %u: %zd bytes, priority %u", i, n, prio);
			else
				zdtm_verify_pattern("pmq", "the long message", m, PMQ_LEN, SEED_PMQ);
		} else {
			zdtm_check(n == (ssize_t)strlen(want[i].text) &&
					   memcmp(m, want[i].text, n) == 0 && prio == want[i].prio,
				   "pmq", "message %u: '%.*s' (priority %u), expected '%s' (%u)", i,
				   (int)(n > 0 ? n : 0), m, prio, want[i].text, want[i].prio);
		}
	}
	zdtm_check(mq_receive(rw, m, PMQ_LEN, &prio) < 0 && errno == EAGAIN, "pmq",
		   "a sixth message");
	n = -1;
	if (mq_send(wo, "via-wo", 6, 5) == 0)
		n = mq_receive(rw, m, PMQ_LEN, &prio);
	zdtm_check(n == 6 && memcmp(m, "via-wo", 6) == 0 && prio == 5, "pmq",
		   "the write-only fd is not on %s", PMQ_A);
	q = mq_open(PMQ_B, O_RDONLY | O_NONBLOCK);
	if (q < 0) {
		zdtm_fail("pmq", "%s: %s", PMQ_B, strerror(errno));
	} else {
		pmq_check_attrs(q, PMQ_B, 2, 16, 1, 0604, 1, 2);
		n = mq_receive(q, m, 16, &prio);
		zdtm_check(n == 4 && memcmp(m, "last", 4) == 0 && prio == 32767, "pmq",
			   "%s: message of %zd bytes, priority %u", PMQ_B, n, prio);
		mq_close(q);
	}
	q = mq_open(PMQ_C, O_RDONLY | O_NONBLOCK);
	if (q < 0) {
		zdtm_fail("pmq", "%s: %s", PMQ_C, strerror(errno));
	} else {
		pmq_check_attrs(q, PMQ_C, 10, 8192, 0, 0600, 0, 0);
		mq_close(q);
	}
}

static int tcp_a = -1, unix_b = -1;
static volatile pid_t t_tid, t_tid_after, t_pid_after;

/* T: its TID before and after */
static void *thread_main(void *arg)
{
	(void)arg;
	t_tid = (pid_t)syscall(SYS_gettid);
	while (!zdtm_stop)
		zdtm_msleep(20);
	t_tid_after = (pid_t)syscall(SYS_gettid);
	t_pid_after = getpid();
	return NULL;
}

static int read_full(int fd, void *buf, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, (char *)buf + got, len - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		got += n;
	}
	return 0;
}

static int write_full(int fd, const void *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = write(fd, (const char *)buf + done, len - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		done += n;
	}
	return 0;
}

static int pattern_ok(const uint8_t *b, size_t len, uint64_t seed)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (b[i] != zdtm_pat_byte(seed, i))
			return 0;
	return 1;
}

static struct sockaddr_in lo_addr(void)
{
	struct sockaddr_in a;

	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons(PORT);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

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
	if (tcp_a >= 0 || unix_b >= 0) {
		static uint8_t buf[MSG_LEN];
		int fd = tcp_a >= 0 ? tcp_a : unix_b;
		uint64_t seed = tcp_a >= 0 ? SEED_TCP : SEED_UNIX;

		if (read_full(fd, buf, MSG_LEN) != 0 || !pattern_ok(buf, MSG_LEN, seed)) {
			zdtm_child_fail(who, "kid_sock", "the root's %d bytes did not arrive intact",
					MSG_LEN);
			bad = 1;
		}
		if (tcp_a >= 0) {
			zdtm_fill(buf, MSG_LEN, SEED_BACK);
			if (write_full(tcp_a, buf, MSG_LEN) != 0) {
				zdtm_child_fail(who, "kid_sock", "send back: %s", strerror(errno));
				bad = 1;
			}
		}
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
	struct sockaddr_in addr;
	static uint8_t buf[MSG_LEN];
	pid_t a, b, extra = 0;
	pthread_t thr;
	int ulsn, ffd, dfd, msq, sem, shmid, pids[16], n, st, lsn, conn, pair[2], one = 1, c2, c3;
	int pmq_wo;
	mqd_t pmq_rw;
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
	ipc_setup(&msq, &sem);

	/* a tmpfs of our own mount namespace, with a closed file */
	if (mount("stasis-ns", "/mnt", "tmpfs", MS_NOSUID, "size=4m,mode=0755"))
		zdtm_die("mounting a tmpfs on /mnt: %s", strerror(errno));
	if (mkdir(TDIR, 0750) || symlink("data", TLINK))
		zdtm_die("%s: %s", TDIR, strerror(errno));
	{
		static uint8_t f[TMPFS_LEN];
		int fd = open(TFILE, O_WRONLY | O_CREAT | O_EXCL, 0640);

		zdtm_fill(f, TMPFS_LEN, SEED_FILE);
		if (fd < 0 || write_full(fd, f, TMPFS_LEN) || close(fd))
			zdtm_die("%s: %s", TFILE, strerror(errno));
	}
	{
		struct sockaddr_un un = { .sun_family = AF_UNIX };

		strcpy(un.sun_path, TSOCK);
		ulsn = socket(AF_UNIX, SOCK_STREAM, 0);
		if (ulsn < 0 || bind(ulsn, (struct sockaddr *)&un, sizeof(un)) || listen(ulsn, 4))
			zdtm_die("unix listener on %s: %s", TSOCK, strerror(errno));
	}
	pmq_setup(&pmq_rw, &pmq_wo);
	ffd = open(TFILE, O_RDWR);
	dfd = open(TDIR, O_RDONLY | O_DIRECTORY);
	if (ffd < 0 || dfd < 0 || lseek(ffd, FILE_POS, SEEK_SET) != FILE_POS)
		zdtm_die("opening %s: %s", TFILE, strerror(errno));

	/* the listener, A's connection with IN_LEN bytes queued, B's pair */
	addr = lo_addr();
	lsn = socket(AF_INET, SOCK_STREAM, 0);
	if (lsn < 0 || setsockopt(lsn, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(lsn, (struct sockaddr *)&addr, sizeof(addr)) || listen(lsn, 8))
		zdtm_die("listener: %s", strerror(errno));
	tcp_a = socket(AF_INET, SOCK_STREAM, 0);
	if (tcp_a < 0 || connect(tcp_a, (struct sockaddr *)&addr, sizeof(addr)))
		zdtm_die("connect: %s", strerror(errno));
	conn = accept(lsn, NULL, NULL);
	if (conn < 0)
		zdtm_die("accept: %s", strerror(errno));
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair))
		zdtm_die("socketpair: %s", strerror(errno));
	{
		uint8_t in[IN_LEN];

		zdtm_fill(in, IN_LEN, SEED_IN);
		if (write_full(tcp_a, in, IN_LEN))
			zdtm_die("send: %s", strerror(errno));
	}
	a = spawn("A", 2);
	close(tcp_a);
	tcp_a = -1;
	unix_b = pair[1];
	b = spawn("B", 3);
	close(pair[1]);
	if (pthread_create(&thr, NULL, thread_main, NULL))
		zdtm_die("pthread_create");
	while (!t_tid)
		zdtm_msleep(1);
	unix_b = -1;
	/* the bytes must be queued at the root's end before the dump */
	for (;;) {
		int queued = 0;

		if (ioctl(conn, FIONREAD, &queued) == 0 && queued == IN_LEN)
			break;
		zdtm_msleep(5);
	}
	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(20);

	ZDTM_CORRUPT("uts", sethostname("x", 1));
	ZDTM_CORRUPT("lo", lo_set(0));
	ZDTM_CORRUPT("shm", seg[100] ^= 1);
	ZDTM_CORRUPT("msg", {
		static struct qmsg m;

		(void)!msgrcv(msq, &m, MSGQ_LEN, 2, IPC_NOWAIT);
	});
	ZDTM_CORRUPT("pmq", {
		static char m[PMQ_LEN];

		(void)!mq_receive(pmq_rw, m, PMQ_LEN, NULL);
	});
	ZDTM_CORRUPT("pmq_owner", {
		mqd_t q = mq_open(PMQ_B, O_RDONLY);

		(void)!fchmod(q, 0600);
		mq_close(q);
	});
	ZDTM_CORRUPT("sem", {
		union semun v = { .val = 6 };

		semctl(sem, 1, SETVAL, v);
	});
	ZDTM_CORRUPT("proc", extra = spawn("X", 4));
	ZDTM_CORRUPT("pid", a = 7);
	ZDTM_CORRUPT("tcp", (void)!read(conn, buf, 1));
	ZDTM_CORRUPT("tmpfs", {
		int fd = open(TFILE, O_WRONLY);
		(void)!pwrite(fd, "x", 1, 5000);
		close(fd);
	});
	ZDTM_CORRUPT("tmpfs_fd", lseek(ffd, 1, SEEK_SET));
	ZDTM_CORRUPT("tmpfs_sock", close(ulsn));
	ZDTM_CORRUPT("tmpfs_dir", dup2(ffd, dfd));
	ZDTM_CORRUPT("kids", (void)!write(pair[0], "x", 1));

	ZDTM_CORRUPT("tid", t_tid = 9);
	zdtm_check(getpid() == 1, "pid", "getpid() %d, expected 1", (int)getpid());
	pthread_join(thr, NULL);
	zdtm_check(t_tid == 4 && t_tid_after == t_tid && t_pid_after == 1, "tid",
		   "thread: TID %d before, %d after (expected 4), getpid() %d",
		   (int)t_tid, (int)t_tid_after, (int)t_pid_after);
	zdtm_check(a == 2 && b == 3, "pid", "children %d and %d, expected 2 and 3",
		   (int)a, (int)b);
	if (gethostname(host, sizeof(host)) != 0 || getdomainname(dom, sizeof(dom)) != 0)
		zdtm_fail("uts", "gethostname: %s", strerror(errno));
	zdtm_check(strcmp(host, HOST) == 0, "uts", "host name '%s'", host);
	zdtm_check(strcmp(dom, DOMAIN) == 0, "uts", "domain name '%s'", dom);
	zdtm_check(lo_flags(&flags) == 0 && (flags & IFF_UP), "lo",
		   "lo flags %#x (not up)", (unsigned)flags);
	/* up for the TCP checks below, even if the self-test took it down */
	lo_set(1);
	zdtm_verify_pattern("shm", "System V segment", seg, SHM_SIZE, SEED_SHM);
	if (shmctl(0, SHM_INFO, (struct shmid_ds *)&info) < 0)
		zdtm_fail("shm", "shmctl(SHM_INFO): %s", strerror(errno));
	else
		zdtm_check(info.used_ids == 1, "shm",
			   "%d segments in the IPC namespace, expected 1",
			   (int)info.used_ids);
	ipc_check(msq, sem);
	pmq_check(pmq_rw, pmq_wo);
	n = proc_pids(pids, 16);
	zdtm_check(n == 3 && pids[0] == 1 && pids[1] == 2 && pids[2] == 3, "proc",
		   "/proc lists %d processes (%d %d %d...), expected 1 2 3", n,
		   n > 0 ? pids[0] : -1, n > 1 ? pids[1] : -1, n > 2 ? pids[2] : -1);

	/* the tmpfs and its content */
	{
		struct statfs sf;
		struct stat st_f, st_d;
		char target[16] = "";
		int fd;

		zdtm_check(statfs("/mnt", &sf) == 0 && sf.f_type == TMPFS_MAGIC, "tmpfs",
			   "/mnt is not a tmpfs");
		zdtm_check(stat(TDIR, &st_d) == 0 && S_ISDIR(st_d.st_mode) &&
				   (st_d.st_mode & 07777) == 0750,
			   "tmpfs", "%s: missing or mode %o", TDIR, (unsigned)st_d.st_mode);
		zdtm_check(stat(TFILE, &st_f) == 0 && (st_f.st_mode & 07777) == 0640 &&
				   st_f.st_size == TMPFS_LEN,
			   "tmpfs", "%s: missing, mode %o or size %lld", TFILE,
			   (unsigned)st_f.st_mode, (long long)st_f.st_size);
		zdtm_check(readlink(TLINK, target, sizeof(target) - 1) == 4 &&
				   strcmp(target, "data") == 0,
			   "tmpfs", "%s: link to '%s'", TLINK, target);
		fd = open(TFILE, O_RDONLY);
		{
			static uint8_t f[TMPFS_LEN];

			if (fd < 0 || read_full(fd, f, TMPFS_LEN))
				zdtm_fail("tmpfs", "reading %s: %s", TFILE, strerror(errno));
			else
				zdtm_verify_pattern("tmpfs", TFILE, f, TMPFS_LEN, SEED_FILE);
		}
		if (fd >= 0)
			close(fd);
		zdtm_check(fstat(ffd, &st_d) == 0 && st_d.st_dev == st_f.st_dev &&
				   st_d.st_ino == st_f.st_ino,
			   "tmpfs_fd", "the open fd is not on %s", TFILE);
		zdtm_check(lseek(ffd, 0, SEEK_CUR) == FILE_POS, "tmpfs_fd",
			   "the open fd is at %lld, expected %d",
			   (long long)lseek(ffd, 0, SEEK_CUR), FILE_POS);
		zdtm_check(fstatat(dfd, "data", &st_d, 0) == 0 && st_d.st_dev == st_f.st_dev &&
				   st_d.st_ino == st_f.st_ino,
			   "tmpfs_dir", "the open directory does not hold %s", TFILE);
		{
			struct sockaddr_un un = { .sun_family = AF_UNIX };
			int cl = socket(AF_UNIX, SOCK_STREAM, 0), sv = -1;

			strcpy(un.sun_path, TSOCK);
			zdtm_check(stat(TSOCK, &st_d) == 0 && S_ISSOCK(st_d.st_mode), "tmpfs_sock",
				   "%s is not a socket", TSOCK);
			if (cl < 0 || connect(cl, (struct sockaddr *)&un, sizeof(un)) != 0)
				zdtm_fail("tmpfs_sock", "connecting to %s: %s", TSOCK, strerror(errno));
			else if ((sv = accept(ulsn, NULL, NULL)) < 0)
				zdtm_fail("tmpfs_sock", "accept on %s: %s", TSOCK, strerror(errno));
			if (sv >= 0)
				close(sv);
			if (cl >= 0)
				close(cl);
		}
	}

	/* TCP: A's queued bytes, then a new connection to the listener */
	memset(buf, 0, sizeof(buf));
	if (ioctl(conn, FIONREAD, &n) != 0 || n != IN_LEN)
		zdtm_fail("tcp", "%d bytes queued from A, expected %d", n, IN_LEN);
	else if (read_full(conn, buf, IN_LEN) != 0)
		zdtm_fail("tcp", "reading A's %d queued bytes: %s", IN_LEN, strerror(errno));
	else
		zdtm_verify_pattern("tcp", "bytes queued from A", buf, IN_LEN, SEED_IN);
	addr = lo_addr();
	c2 = socket(AF_INET, SOCK_STREAM, 0);
	{
		/* connect gives up after 3 s (lo down: the SYN is lost) */
		struct timeval tv = { .tv_sec = 3 };

		if (c2 >= 0)
			setsockopt(c2, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	}
	if (c2 < 0 || connect(c2, (struct sockaddr *)&addr, sizeof(addr)) != 0)
		zdtm_fail("tcp", "connecting to the listener: %s", strerror(errno));
	else if ((c3 = accept(lsn, NULL, NULL)) < 0)
		zdtm_fail("tcp", "accept: %s", strerror(errno));
	else
		close(c3);
	if (c2 >= 0)
		close(c2);
	zdtm_fill(buf, MSG_LEN, SEED_TCP);
	if (write_full(conn, buf, MSG_LEN))
		zdtm_fail("tcp", "sending to A: %s", strerror(errno));
	zdtm_fill(buf, MSG_LEN, SEED_UNIX);
	if (write_full(pair[0], buf, MSG_LEN))
		zdtm_fail("unix", "sending to B: %s", strerror(errno));

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
	memset(buf, 0, sizeof(buf));
	if (read_full(conn, buf, MSG_LEN) != 0)
		zdtm_fail("tcp", "A's reply did not arrive: %s", strerror(errno));
	else
		zdtm_verify_pattern("tcp", "A's reply", buf, MSG_LEN, SEED_BACK);
	shmdt(seg);
	shmctl(shmid, IPC_RMID, NULL);
	msgctl(msq, IPC_RMID, NULL);
	semctl(sem, 0, IPC_RMID);
	mq_unlink(PMQ_A);
	mq_unlink(PMQ_B);
	mq_unlink(PMQ_C);
	zdtm_finish();
	return 0;
}
