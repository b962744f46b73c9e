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
	zdtm_finish();
	return 0;
}
