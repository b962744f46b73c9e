/*
 * files.c - open file descriptors: offsets, flags, close-on-exec, contents,
 * character devices, a directory fd and the cwd.
 *
 *   files PIDFILE
 *
 * Created in the starting directory D (truncated and recreated if present):
 *   files.a    10000 bytes of pattern, open O_RDWR|O_CLOEXEC at offset 1234
 *   files.b    100 bytes written through a temporary fd, then opened
 *              O_WRONLY|O_APPEND and 20 more bytes appended (offset 120)
 *   files.c    8192 bytes, open O_RDONLY (no cloexec); the main loop reads it
 *              one byte at a time from offset 5000 (wrapping back to 5000 at
 *              EOF) and checks every byte, so its offset is a function of the
 *              loop counter
 *   files.dir/ new cwd (chdir'ed into after everything is open)
 * Also: /dev/null O_WRONLY dup2'ed to fd 10, /dev/zero O_RDONLY, and D itself
 * open O_RDONLY|O_DIRECTORY.
 *
 * After SIGTERM: offsets (lseek SEEK_CUR), access modes and O_APPEND
 * (F_GETFL), FD_CLOEXEC (F_GETFD), which file each fd refers to (fstat vs
 * stat of the path), contents (pread), that a write to files.b lands at its
 * end, getcwd(), writes to fd 10, reads of /dev/zero, and that the set of
 * open fds (from /proc/self/fd) is exactly the starting set plus ours.
 */
#include "zdtm.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#define SEED_A 0x66696c6561000000ull
#define SEED_B 0x66696c6562000000ull
#define SEED_C 0x66696c6563000000ull
#define SEED_B2 0x66696c6562320000ull

#define A_SIZE 10000
#define A_OFF 1234
#define B_SIZE1 100
#define B_SIZE2 20
#define B_SIZE3 37 /* appended after SIGTERM */
#define C_SIZE 8192
#define C_START 5000
#define NULL_FD 10

#define MAX_FDS 64

static int fd_a, fd_b, fd_c, fd_zero, fd_dir;
static char dir0[PATH_MAX];       /* starting directory D */
static char expected_cwd[PATH_MAX];
static int base_fds[MAX_FDS], nbase; /* fds open at start */
static uint8_t buf[16384];

static void path_in(char *out, size_t outlen, const char *name)
{
	if ((size_t)snprintf(out, outlen, "%s/%s", dir0, name) >= outlen)
		zdtm_die("path too long");
}

static void write_all(int fd, const void *p, size_t len, const char *what)
{
	const uint8_t *b = p;

	while (len) {
		ssize_t n = write(fd, b, len);

		if (n <= 0)
			zdtm_die("write %s", what);
		b += n;
		len -= (size_t)n;
	}
}

static int list_fds(int *fds, int max, int *n)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;

	*n = 0;
	if (!d)
		return -1;
	while ((de = readdir(d))) {
		int fd;

		if (de->d_name[0] == '.')
			continue;
		fd = atoi(de->d_name);
		if (fd == dirfd(d))
			continue;
		if (*n < max)
			fds[*n] = fd;
		(*n)++;
	}
	closedir(d);
	return 0;
}

static int in_list(const int *fds, int n, int fd)
{
	int i;

	for (i = 0; i < n; i++)
		if (fds[i] == fd)
			return 1;
	return 0;
}

/* Does fd refer to the same inode as path? */
static void check_same_file(const char *what, int fd, const char *path)
{
	struct stat a, b;

	if (fstat(fd, &a)) {
		zdtm_fail("identity", "%s: fstat(%d): %s", what, fd,
			  strerror(errno));
		return;
	}
	if (stat(path, &b)) {
		zdtm_fail("identity", "%s: stat(%s): %s", what, path,
			  strerror(errno));
		return;
	}
	zdtm_check(a.st_dev == b.st_dev && a.st_ino == b.st_ino, "identity",
		   "%s: fd %d is dev %#llx ino %llu, %s is dev %#llx ino %llu",
		   what, fd, (unsigned long long)a.st_dev,
		   (unsigned long long)a.st_ino, path,
		   (unsigned long long)b.st_dev, (unsigned long long)b.st_ino);
}

static void check_chrdev(const char *what, int fd, unsigned maj, unsigned min)
{
	struct stat st;

	if (fstat(fd, &st)) {
		zdtm_fail("identity", "%s: fstat(%d): %s", what, fd,
			  strerror(errno));
		return;
	}
	zdtm_check(S_ISCHR(st.st_mode) && major(st.st_rdev) == maj &&
		   minor(st.st_rdev) == min, "identity",
		   "%s: fd %d mode %#o rdev %u:%u, expected char %u:%u", what,
		   fd, (unsigned)st.st_mode, major(st.st_rdev),
		   minor(st.st_rdev), maj, min);
}

static void check_fd(const char *what, int fd, off_t off, int accmode,
		     int append, int cloexec)
{
	off_t cur = lseek(fd, 0, SEEK_CUR);
	int fl = fcntl(fd, F_GETFL);
	int fdf = fcntl(fd, F_GETFD);

	if (off >= 0)
		zdtm_check(cur == off, "offset",
			   "%s: fd %d offset %lld, expected %lld", what, fd,
			   (long long)cur, (long long)off);
	if (!zdtm_check(fl >= 0, "flags", "%s: F_GETFL(%d): %s", what, fd,
			strerror(errno)))
		return;
	zdtm_check((fl & O_ACCMODE) == accmode, "flags",
		   "%s: fd %d access mode %d, expected %d", what, fd,
		   fl & O_ACCMODE, accmode);
	zdtm_check(!!(fl & O_APPEND) == append, "flags",
		   "%s: fd %d O_APPEND %d, expected %d", what, fd,
		   !!(fl & O_APPEND), append);
	zdtm_check(fdf >= 0 && !!(fdf & FD_CLOEXEC) == cloexec, "cloexec",
		   "%s: fd %d F_GETFD %d, expected FD_CLOEXEC=%d", what, fd,
		   fdf, cloexec);
}

/* pread the whole file and compare to the expected bytes in exp. */
static void check_content(const char *what, int fd, const uint8_t *exp,
			  size_t len)
{
	static uint8_t got[16384];
	struct stat st;
	size_t off = 0;

	if (fstat(fd, &st) || (size_t)st.st_size != len) {
		zdtm_fail("content", "%s: size %lld, expected %zu", what,
			  (long long)st.st_size, len);
		return;
	}
	while (off < len) {
		ssize_t n = pread(fd, got + off, len - off, (off_t)off);

		if (n <= 0) {
			zdtm_fail("content", "%s: pread at %zu: %s", what, off,
				  n ? strerror(errno) : "EOF");
			return;
		}
		off += (size_t)n;
	}
	zdtm_verify_mem("content", what, got, exp, len);
}

/* Same, opening dir0/name read-only.  Returns 1 if it matched. */
static int check_content_path(const char *what, const char *name,
			      const uint8_t *exp, size_t len)
{
	char path[PATH_MAX + 32];
	unsigned long before = zdtm_nfail;
	int fd;

	path_in(path, sizeof(path), name);
	fd = open(path, O_RDONLY);
	if (fd < 0) {
		zdtm_fail("content", "open %s: %s", path, strerror(errno));
		return 0;
	}
	check_content(what, fd, exp, len);
	close(fd);
	return zdtm_nfail == before;
}

int main(int argc, char **argv)
{
	char path[PATH_MAX + 32];
	uint64_t iter = 0, anomalies = 0;
	int fd, i;

	zdtm_init(argc, argv, 0, "");
	if (list_fds(base_fds, MAX_FDS, &nbase) || nbase > MAX_FDS)
		zdtm_die("list /proc/self/fd");
	/* an inherited fd 10 gets replaced by dup2() below */
	for (i = 0; i < nbase; i++)
		if (base_fds[i] == NULL_FD)
			base_fds[i--] = base_fds[--nbase];
	if (!getcwd(dir0, sizeof(dir0)))
		zdtm_die("getcwd");
	if (strlen(dir0) + 32 > sizeof(expected_cwd))
		zdtm_die("cwd too long");
	strcpy(expected_cwd, dir0);
	strcat(expected_cwd, strcmp(dir0, "/") ? "/files.dir" : "files.dir");

	/* files.a */
	path_in(path, sizeof(path), "files.a");
	fd_a = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd_a < 0)
		zdtm_die("open %s", path);
	zdtm_fill(buf, A_SIZE, SEED_A);
	write_all(fd_a, buf, A_SIZE, "files.a");
	if (lseek(fd_a, A_OFF, SEEK_SET) != A_OFF)
		zdtm_die("lseek files.a");

	/* files.b */
	path_in(path, sizeof(path), "files.b");
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		zdtm_die("open %s", path);
	zdtm_fill(buf, B_SIZE1, SEED_B);
	write_all(fd, buf, B_SIZE1, "files.b");
	close(fd);
	fd_b = open(path, O_WRONLY | O_APPEND);
	if (fd_b < 0)
		zdtm_die("open %s O_APPEND", path);
	zdtm_fill(buf, B_SIZE2, SEED_B2);
	write_all(fd_b, buf, B_SIZE2, "files.b (append)");

	/* files.c */
	path_in(path, sizeof(path), "files.c");
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		zdtm_die("open %s", path);
	zdtm_fill(buf, C_SIZE, SEED_C);
	write_all(fd, buf, C_SIZE, "files.c");
	close(fd);
	fd_c = open(path, O_RDONLY);
	if (fd_c < 0 || lseek(fd_c, C_START, SEEK_SET) != C_START)
		zdtm_die("open/lseek %s", path);

	/* /dev/null at fd 10, /dev/zero, the starting directory */
	fd = open("/dev/null", O_WRONLY);
	if (fd < 0 || dup2(fd, NULL_FD) != NULL_FD)
		zdtm_die("/dev/null -> fd %d", NULL_FD);
	if (fd != NULL_FD)
		close(fd);
	fd_zero = open("/dev/zero", O_RDONLY);
	if (fd_zero < 0)
		zdtm_die("open /dev/zero");
	fd_dir = open(dir0, O_RDONLY | O_DIRECTORY);
	if (fd_dir < 0)
		zdtm_die("open %s", dir0);

	/* new cwd */
	if (mkdir(expected_cwd, 0755) && errno != EEXIST)
		zdtm_die("mkdir %s", expected_cwd);
	if (chdir(expected_cwd))
		zdtm_die("chdir %s", expected_cwd);

	zdtm_ready();

	while (!zdtm_stop) {
		uint8_t b = 0xFF, z[64];
		off_t pos = lseek(fd_c, 0, SEEK_CUR);
		ssize_t n;

		/* files.c: one byte forward, wrap to C_START at EOF */
		n = read(fd_c, &b, 1);
		if (n == 0) {
			if (pos != C_SIZE) {
				anomalies++;
				zdtm_fail("loop", "files.c: EOF at offset %lld",
					  (long long)pos);
			}
			if (lseek(fd_c, C_START, SEEK_SET) != C_START)
				anomalies++;
		} else if (n != 1 || pos < C_START || pos >= C_SIZE ||
			   b != zdtm_pat_byte(SEED_C, (uint64_t)pos)) {
			if (anomalies++ < 10)
				zdtm_fail("loop",
					  "files.c read at %lld returned %zd "
					  "byte 0x%02x, expected 0x%02x",
					  (long long)pos, n, b,
					  zdtm_pat_byte(SEED_C, (uint64_t)pos));
		}
		/* /dev/zero and /dev/null keep working */
		memset(z, 0xAB, sizeof(z));
		if (read(fd_zero, z, sizeof(z)) != sizeof(z) || z[0] || z[63])
			if (anomalies++ < 10)
				zdtm_fail("loop", "/dev/zero read failed");
		if (write(NULL_FD, z, sizeof(z)) != sizeof(z))
			if (anomalies++ < 10)
				zdtm_fail("loop", "/dev/null write failed");
		iter++;
		zdtm_usleep(2000);
	}

	/* ---------------- corruption hooks (selftest only) ---------------- */
	ZDTM_CORRUPT("content", {
		uint8_t x = (uint8_t)~zdtm_pat_byte(SEED_A, 9999);

		if (pwrite(fd_a, &x, 1, 9999) != 1)
			abort();
	});
	ZDTM_CORRUPT("offset", lseek(fd_a, A_OFF + 1, SEEK_SET));
	ZDTM_CORRUPT("flags", fcntl(fd_a, F_SETFL, O_APPEND));
	ZDTM_CORRUPT("cloexec", fcntl(fd_c, F_SETFD, FD_CLOEXEC));
	ZDTM_CORRUPT("identity", dup2(fd_c, fd_zero));
	ZDTM_CORRUPT("cwd", chdir(".."));
	ZDTM_CORRUPT("fdset", open("/dev/null", O_RDONLY));
	ZDTM_CORRUPT("devnull", close(NULL_FD));
	ZDTM_CORRUPT("append", {
		/* a plain (non-append) fd in place of fd_b: writes at 120 */
		char p[PATH_MAX + 32];
		int nfd;

		path_in(p, sizeof(p), "files.b");
		nfd = open(p, O_WRONLY);
		if (nfd < 0 || dup2(nfd, fd_b) != fd_b)
			abort();
		close(nfd);
		if (lseek(fd_b, B_SIZE1, SEEK_SET) != B_SIZE1)
			abort();
	});

	/* ---------------- verification ---------------- */
	zdtm_check(anomalies == 0, "loop", "%llu anomalies in the main loop",
		   (unsigned long long)anomalies);

	/* offsets, flags, cloexec */
	check_fd("files.a", fd_a, A_OFF, O_RDWR, 0, 1);
	check_fd("files.b", fd_b, B_SIZE1 + B_SIZE2, O_WRONLY, 1, 0);
	check_fd("files.c", fd_c,
		 C_START + (off_t)(iter % (C_SIZE - C_START + 1)), O_RDONLY, 0,
		 0);
	check_fd("/dev/null", NULL_FD, -1, O_WRONLY, 0, 0);
	check_fd("/dev/zero", fd_zero, -1, O_RDONLY, 0, 0);
	check_fd("starting dir", fd_dir, -1, O_RDONLY, 0, 0);

	/* identities */
	path_in(path, sizeof(path), "files.a");
	check_same_file("files.a", fd_a, path);
	path_in(path, sizeof(path), "files.b");
	check_same_file("files.b", fd_b, path);
	path_in(path, sizeof(path), "files.c");
	check_same_file("files.c", fd_c, path);
	check_same_file("starting dir", fd_dir, dir0);
	check_chrdev("/dev/null", NULL_FD, 1, 3);
	check_chrdev("/dev/zero", fd_zero, 1, 5);

	/* contents */
	zdtm_fill(buf, A_SIZE, SEED_A);
	check_content("files.a", fd_a, buf, A_SIZE);
	zdtm_fill(buf, B_SIZE1, SEED_B);
	zdtm_fill(buf + B_SIZE1, B_SIZE2, SEED_B2);
	/* fd_b is O_WRONLY: read through a new fd */
	check_content_path("files.b", "files.b", buf, B_SIZE1 + B_SIZE2);
	zdtm_fill(buf, C_SIZE, SEED_C);
	check_content("files.c", fd_c, buf, C_SIZE);

	/* append to files.b: must land at the end (offset 120) */
	{
		uint8_t extra[B_SIZE3];
		off_t end;

		zdtm_fill(extra, B_SIZE3, SEED_B2 + 1);
		if (!zdtm_check(write(fd_b, extra, B_SIZE3) == B_SIZE3,
				"append", "write to files.b: %s",
				strerror(errno))) {
			/* nothing */
		} else {
			end = lseek(fd_b, 0, SEEK_CUR);
			zdtm_check(end == B_SIZE1 + B_SIZE2 + B_SIZE3, "append",
				   "files.b offset after append %lld, "
				   "expected %d", (long long)end,
				   B_SIZE1 + B_SIZE2 + B_SIZE3);
		}
		zdtm_fill(buf, B_SIZE1, SEED_B);
		zdtm_fill(buf + B_SIZE1, B_SIZE2, SEED_B2);
		memcpy(buf + B_SIZE1 + B_SIZE2, extra, B_SIZE3);
		if (!check_content_path("files.b after append", "files.b", buf,
					B_SIZE1 + B_SIZE2 + B_SIZE3))
			zdtm_fail("append", "files.b content after append "
				  "differs");
	}

	/* getcwd */
	{
		char cwd[PATH_MAX];

		if (!getcwd(cwd, sizeof(cwd)))
			zdtm_fail("cwd", "getcwd: %s", strerror(errno));
		else
			zdtm_check(strcmp(cwd, expected_cwd) == 0, "cwd",
				   "cwd '%s', expected '%s'", cwd,
				   expected_cwd);
	}

	/* /dev/null and /dev/zero */
	{
		uint8_t z[4096];
		ssize_t n;
		size_t k;

		errno = 0;
		n = write(NULL_FD, "stasis\n", 7);
		zdtm_check(n == 7, "devnull", "write to fd %d returned %zd (%s)",
			   NULL_FD, n, strerror(errno));
		memset(z, 0xFF, sizeof(z));
		n = read(fd_zero, z, sizeof(z));
		for (k = 0; k < sizeof(z) && z[k] == 0; k++)
			;
		zdtm_check(n == (ssize_t)sizeof(z) && k == sizeof(z),
			   "identity",
			   "/dev/zero read returned %zd, first non-zero byte "
			   "at %zu", n, k);
	}

	/* exact fd set */
	{
		int fds[MAX_FDS], nfds, exp[MAX_FDS], nexp = 0;

		for (i = 0; i < nbase; i++)
			exp[nexp++] = base_fds[i];
		exp[nexp++] = fd_a;
		exp[nexp++] = fd_b;
		exp[nexp++] = fd_c;
		exp[nexp++] = NULL_FD;
		exp[nexp++] = fd_zero;
		exp[nexp++] = fd_dir;
		if (list_fds(fds, MAX_FDS, &nfds) || nfds > MAX_FDS) {
			zdtm_fail("fdset", "cannot list /proc/self/fd");
		} else {
			for (i = 0; i < nfds; i++)
				zdtm_check(in_list(exp, nexp, fds[i]), "fdset",
					   "unexpected open fd %d", fds[i]);
			for (i = 0; i < nexp; i++)
				zdtm_check(in_list(fds, nfds, exp[i]),
					   exp[i] == NULL_FD ? "devnull" :
					   "fdset", "fd %d is not open",
					   exp[i]);
		}
	}
	zdtm_finish();
}
