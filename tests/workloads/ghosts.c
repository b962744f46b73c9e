/*
 * ghosts.c - objects deleted while open must come back as they were
 * (zdtm's fifo-ghost, unlink_fifo*, rmdir_open, cwd01/02, deleted_dev,
 * unlink_fstat00/04/041, file_attr, opath_file, symlink, symlink01).
 *
 *   ghosts PIDFILE
 *
 * Set up before "ready" (in the starting cwd):
 *   file    ghosts.file: 1 MiB, pattern data at 64 KiB..72 KiB and in the
 *           last 4 KiB (holes elsewhere), owner uid+1/gid+1 (as root), mode
 *           0751, atime/mtime set to fixed values with nanoseconds, offset
 *           70000; unlinked
 *   tmpfile an O_TMPFILE file with 5000 pattern bytes, mode 0640
 *   fifo    ghosts.fifo: read end (O_NONBLOCK) and write end, 3000
 *           pattern bytes queued; unlinked
 *   dir     ghosts.dir (mode 0750): an fd on it and the working directory;
 *           removed
 *   dev     ghosts.dev, a character device 1:3 (/dev/null), opened
 *           O_RDWR; unlinked (only as root: mknod needs CAP_MKNOD)
 *   link    ghosts.link -> "some/target": an O_PATH | O_NOFOLLOW fd;
 *           ghosts.link2 -> "other/target" likewise, then unlinked
 *   opath   an O_PATH fd on the directory the workload started in
 *   watch   an inotify watch (IN_MODIFY) on the deleted ghosts.file: a
 *           write to it after the checks is reported on that watch
 *           (zdtm's inotify00)
 *   memfd   a memfd (O_RDWR, as memfd_create makes it) holding a script,
 *           "#!/bin/true", that execveat runs (zdtm's memfd04: a restored
 *           memfd whose fd counts as a writer fails with ETXTBSY)
 * After SIGTERM every property above is checked (content byte for byte,
 * holes with SEEK_DATA, owner, mode, times, link count, offsets, flags,
 * the working directory the same inode as the dir fd, the link targets).
 */
#include "zdtm.h"

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define FILE_SIZE (1 << 20)
#define DATA1 65536
#define DATA1_LEN 8192
#define DATA2 (FILE_SIZE - 4096)
#define FILE_POS 70000
#define TMP_LEN 5000
#define FIFO_LEN 3000
#define MTIME_S 123456
#define MTIME_NS 789
#define ATIME_S 2345
#define ATIME_NS 42

static char buf[FILE_SIZE];

static void die(const char *what)
{
	printf("setup error: %s: %s\nFAIL: setup\n", what, strerror(errno));
	exit(1);
}

static int make_file(uid_t *uid, gid_t *gid)
{
	struct timespec ts[2] = { { ATIME_S, ATIME_NS }, { MTIME_S, MTIME_NS } };
	int fd = open("ghosts.file", O_RDWR | O_CREAT | O_TRUNC, 0600);

	if (fd < 0 || ftruncate(fd, FILE_SIZE) != 0)
		die("ghosts.file");
	zdtm_fill(buf, DATA1_LEN, 1);
	if (pwrite(fd, buf, DATA1_LEN, DATA1) != DATA1_LEN)
		die("pwrite");
	zdtm_fill(buf, 4096, 2);
	if (pwrite(fd, buf, 4096, DATA2) != 4096)
		die("pwrite");
	*uid = getuid();
	*gid = getgid();
	if (*uid == 0) {
		*uid = 1;
		*gid = 1;
		if (fchown(fd, *uid, *gid) != 0)
			die("fchown");
	}
	if (fchmod(fd, 0751) != 0 || futimens(fd, ts) != 0 || unlink("ghosts.file") != 0 ||
	    lseek(fd, FILE_POS, SEEK_SET) != FILE_POS)
		die("ghosts.file attributes");
	return fd;
}

static void check_file(int fd, uid_t uid, gid_t gid)
{
	struct stat st;

	if (fstat(fd, &st) != 0) {
		zdtm_fail("file", "fstat: %s", strerror(errno));
		return;
	}
	zdtm_check(st.st_uid == uid && st.st_gid == gid, "owner", "owner %d:%d, want %d:%d",
		   (int)st.st_uid, (int)st.st_gid, (int)uid, (int)gid);
	zdtm_check(st.st_mode == (S_IFREG | 0751), "owner", "mode %o", st.st_mode);
	zdtm_check(st.st_mtim.tv_sec == MTIME_S && st.st_mtim.tv_nsec == MTIME_NS, "times",
		   "mtime %ld.%09ld", (long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
	zdtm_check(st.st_atim.tv_sec == ATIME_S && st.st_atim.tv_nsec == ATIME_NS, "times",
		   "atime %ld.%09ld", (long)st.st_atim.tv_sec, st.st_atim.tv_nsec);
	zdtm_check(st.st_nlink == 0 && st.st_size == FILE_SIZE, "file", "nlink %ld size %ld",
		   (long)st.st_nlink, (long)st.st_size);
	zdtm_check(lseek(fd, 0, SEEK_CUR) == FILE_POS, "file", "offset %ld",
		   (long)lseek(fd, 0, SEEK_CUR));
	zdtm_check(lseek(fd, 0, SEEK_DATA) == DATA1, "file", "first data at %ld, want %d",
		   (long)lseek(fd, 0, SEEK_DATA), DATA1);
	if (pread(fd, buf, FILE_SIZE, 0) != FILE_SIZE) {
		zdtm_fail("file", "pread: %s", strerror(errno));
		return;
	}
	zdtm_verify_pattern("file", "first extent", buf + DATA1, DATA1_LEN, 1);
	zdtm_verify_pattern("file", "last extent", buf + DATA2, 4096, 2);
	for (size_t i = 0; i < FILE_SIZE; i++) {
		if ((i < DATA1 || (i >= DATA1 + DATA1_LEN && i < DATA2)) && buf[i]) {
			zdtm_fail("file", "byte %zu of a hole is %d", i, buf[i]);
			break;
		}
	}
}

static int make_tmpfile(void)
{
	int fd = open(".", O_RDWR | O_TMPFILE, 0640);

	zdtm_fill(buf, TMP_LEN, 3);
	if (fd < 0 || write(fd, buf, TMP_LEN) != TMP_LEN)
		die("O_TMPFILE");
	return fd;
}

static void check_tmpfile(int fd)
{
	struct stat st;

	zdtm_check(fstat(fd, &st) == 0 && st.st_nlink == 0 && st.st_size == TMP_LEN &&
			   (st.st_mode & 07777) == 0640,
		   "tmpfile", "nlink %ld size %ld mode %o", (long)st.st_nlink, (long)st.st_size,
		   st.st_mode);
	zdtm_check(lseek(fd, 0, SEEK_CUR) == TMP_LEN, "tmpfile", "offset %ld",
		   (long)lseek(fd, 0, SEEK_CUR));
	if (pread(fd, buf, TMP_LEN, 0) != TMP_LEN)
		zdtm_fail("tmpfile", "pread: %s", strerror(errno));
	else
		zdtm_verify_pattern("tmpfile", "content", buf, TMP_LEN, 3);
}

static void make_fifo(int *rd, int *wr)
{
	if (mkfifo("ghosts.fifo", 0640) != 0)
		die("mkfifo");
	*rd = open("ghosts.fifo", O_RDONLY | O_NONBLOCK);
	*wr = open("ghosts.fifo", O_WRONLY);
	zdtm_fill(buf, FIFO_LEN, 4);
	if (*rd < 0 || *wr < 0 || write(*wr, buf, FIFO_LEN) != FIFO_LEN ||
	    unlink("ghosts.fifo") != 0)
		die("ghosts.fifo");
}

static void check_fifo(int rd, int wr)
{
	struct stat st;
	char more = 'm';

	zdtm_check(fstat(rd, &st) == 0 && S_ISFIFO(st.st_mode) && st.st_nlink == 0 &&
			   (st.st_mode & 07777) == 0640,
		   "fifo", "mode %o nlink %ld", st.st_mode, (long)st.st_nlink);
	zdtm_check((fcntl(rd, F_GETFL) & (O_ACCMODE | O_NONBLOCK)) == (O_RDONLY | O_NONBLOCK), "fifo",
		   "read end flags %#x", fcntl(rd, F_GETFL));
	memset(buf, 0, FIFO_LEN + 1);
	if (read(rd, buf, FIFO_LEN + 1) != FIFO_LEN)
		zdtm_fail("fifo", "queued bytes lost");
	else
		zdtm_verify_pattern("fifo", "queued", buf, FIFO_LEN, 4);
	zdtm_check(write(wr, &more, 1) == 1 && read(rd, buf, 2) == 1 && buf[0] == 'm', "fifo",
		   "the ends are not one FIFO");
}

static void check_dir(int dir)
{
	struct stat st, cwd;

	zdtm_check(fstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_nlink == 0 &&
			   (st.st_mode & 07777) == 0750,
		   "dir", "mode %o nlink %ld", st.st_mode, (long)st.st_nlink);
	zdtm_check(stat("/proc/self/cwd", &cwd) == 0 && cwd.st_ino == st.st_ino &&
			   cwd.st_dev == st.st_dev,
		   "cwd", "the working directory is not the deleted directory of the fd");
}

static void check_link(int fd, const char *target, int deleted)
{
	struct stat st;
	char got[64] = "";

	zdtm_check(fcntl(fd, F_GETFL) & O_PATH, "link", "fd %d lost O_PATH", fd);
	zdtm_check(fstatat(fd, "", &st, AT_EMPTY_PATH) == 0 && S_ISLNK(st.st_mode) &&
			   (st.st_nlink == 0) == deleted,
		   "link", "fd %d: mode %o nlink %ld", fd, st.st_mode, (long)st.st_nlink);
	zdtm_check(readlinkat(fd, "", got, sizeof(got) - 1) == (ssize_t)strlen(target) &&
			   strcmp(got, target) == 0,
		   "link", "fd %d points to '%s', want '%s'", fd, got, target);
}

/* A memfd holding a script, run with execveat (zdtm's memfd04): exit 0. */
static int exec_memfd(int fd)
{
	static const char *const argv[] = { "true", NULL }, *const envp[] = { NULL };
	int st = -1;
	pid_t pid = fork();

	if (pid == 0) {
		syscall(SYS_execveat, fd, "", argv, envp, AT_EMPTY_PATH);
		_exit(errno);
	}
	if (pid < 0 || zdtm_wait_deadline(pid, &st, 10000))
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(int argc, char **argv)
{
	int file, tmp, rd, wr, dir, dev = -1, link1, link2, opath, top, mfd, ifd, iwd;
	uid_t uid;
	gid_t gid;
	struct stat st;
	char c;

	zdtm_init(argc, argv, 0, "");
	file = make_file(&uid, &gid);
	{
		/* An inotify watch on the deleted file (zdtm's inotify00). */
		char path[64];

		snprintf(path, sizeof(path), "/proc/self/fd/%d", file);
		ifd = inotify_init1(IN_NONBLOCK);
		if (ifd < 0 || (iwd = inotify_add_watch(ifd, path, IN_MODIFY)) < 0)
			die("inotify watch");
	}
	tmp = make_tmpfile();
	mfd = (int)syscall(SYS_memfd_create, "script", 0);
	if (mfd < 0 || write(mfd, "#!/bin/true\n", 12) != 12 || exec_memfd(mfd) != 0)
		die("memfd script");
	make_fifo(&rd, &wr);
	if (getuid() == 0) {
		unlink("ghosts.dev");
		if (mknod("ghosts.dev", S_IFCHR | 0620, makedev(1, 3)) != 0 ||
		    chmod("ghosts.dev", 0620) != 0)
			die("mknod");
		dev = open("ghosts.dev", O_RDWR);
		if (dev < 0 || unlink("ghosts.dev") != 0)
			die("ghosts.dev");
	}
	unlink("ghosts.link");
	unlink("ghosts.link2");
	if (symlink("some/target", "ghosts.link") != 0 ||
	    symlink("other/target", "ghosts.link2") != 0)
		die("symlink");
	link1 = open("ghosts.link", O_PATH | O_NOFOLLOW);
	link2 = open("ghosts.link2", O_PATH | O_NOFOLLOW);
	opath = open(".", O_PATH);
	top = open(".", O_RDONLY | O_DIRECTORY);
	if (link1 < 0 || link2 < 0 || opath < 0 || top < 0 || unlink("ghosts.link2") != 0)
		die("O_PATH");
	rmdir("ghosts.dir");
	if (mkdir("ghosts.dir", 0750) != 0)
		die("mkdir");
	dir = open("ghosts.dir", O_RDONLY | O_DIRECTORY);
	if (dir < 0 || chdir("ghosts.dir") != 0 || rmdir("../ghosts.dir") != 0)
		die("ghosts.dir");
	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(20);
	ZDTM_CORRUPT("owner", fchmod(file, 0755));
	ZDTM_CORRUPT("times", futimens(file, NULL));
	ZDTM_CORRUPT("file", pwrite(file, "x", 1, DATA1 + 5));
	ZDTM_CORRUPT("tmpfile", pwrite(tmp, "x", 1, 17));
	ZDTM_CORRUPT("fifo", read(rd, &c, 1));
	ZDTM_CORRUPT("cwd", fchdir(top));
	ZDTM_CORRUPT("dir", fchmod(dir, 0700));
	ZDTM_CORRUPT("link", dup2(link2, link1));
	ZDTM_CORRUPT("dev", dup2(file, dev >= 0 ? dev : 200));
	ZDTM_CORRUPT("opath", dup2(dir, opath));
	ZDTM_CORRUPT("memfd", {
		/* a writer of the memfd: exec fails with ETXTBSY */
		char path[64];
		snprintf(path, sizeof(path), "/proc/self/fd/%d", mfd);
		open(path, O_RDWR);
	});
	{
		int r = exec_memfd(mfd);

		zdtm_check(r == 0, "memfd", "exec of the memfd script: %s",
			   r < 0 ? "no exit status" : strerror(r));
	}

	check_file(file, uid, gid);
	{
		/* The watch is still on the (rebuilt) deleted file. */
		char ev[4096];
		struct inotify_event *e = (struct inotify_event *)ev;
		ssize_t n;

		while (read(ifd, ev, sizeof(ev)) > 0)
			;
		ZDTM_CORRUPT("watch", inotify_rm_watch(ifd, iwd));
		if (pwrite(file, "w", 1, 3) != 1)
			zdtm_fail("watch", "pwrite: %s", strerror(errno));
		n = read(ifd, ev, sizeof(ev));
		while (n > 0 && (e->mask & IN_IGNORED))
			n = read(ifd, ev, sizeof(ev));
		zdtm_check(n > 0 && e->wd == iwd && (e->mask & IN_MODIFY), "watch",
			   "no IN_MODIFY for watch %d (read %zd, wd %d, mask %#x)", iwd, n,
			   n > 0 ? e->wd : -1, n > 0 ? e->mask : 0);
	}
	check_tmpfile(tmp);
	check_fifo(rd, wr);
	check_dir(dir);
	check_link(link1, "some/target", 0);
	check_link(link2, "other/target", 1);
	if (dev >= 0) {
		zdtm_check(fstat(dev, &st) == 0 && S_ISCHR(st.st_mode) &&
				   st.st_rdev == makedev(1, 3) && st.st_nlink == 0 &&
				   (st.st_mode & 07777) == 0620,
			   "dev", "mode %o rdev %lx nlink %ld", st.st_mode, (long)st.st_rdev,
			   (long)st.st_nlink);
		zdtm_check(write(dev, "x", 1) == 1 && read(dev, &c, 1) == 0, "dev",
			   "not /dev/null");
	} else {
		/* Without mknod the tag still has a check that can fail. */
		zdtm_check(fcntl(200, F_GETFD) < 0, "dev", "fd 200 is open");
	}
	zdtm_check((fcntl(opath, F_GETFL) & O_PATH) && fstat(opath, &st) == 0 &&
			   fstat(top, &st) == 0,
		   "opath", "fd %d lost O_PATH", opath);
	{
		struct stat a, b;

		zdtm_check(fstat(opath, &a) == 0 && fstat(top, &b) == 0 && a.st_ino == b.st_ino,
			   "opath", "the O_PATH fd is not on the starting directory");
	}
	if (fchdir(top) != 0)
		zdtm_fail("cwd", "fchdir back: %s", strerror(errno));
	zdtm_finish();
}
