/*
 * fanotify.c - a fanotify group with marks on inodes, a mount and a whole
 * filesystem must come back with the same flags and marks, and report the
 * same events (zdtm's fanotify00).
 *
 *   fanotify PIDFILE
 *
 * Needs CAP_SYS_ADMIN (fanotify_init without FAN_REPORT_FID). Set up before
 * "ready" (files in the cwd, recreated):
 *   g = fanotify_init(FAN_CLASS_NOTIF|FAN_NONBLOCK, O_RDONLY|O_LARGEFILE),
 *   then FD_CLOEXEC set with fcntl (the fd's flag, not the group's), with
 *   marks added in this order:
 *     fanotify.w      FAN_MODIFY|FAN_CLOSE_WRITE, and FAN_OPEN in its
 *                     ignored mask (FAN_MARK_IGNORED_SURV_MODIFY);
 *     fanotify.d      FAN_OPEN|FAN_EVENT_ON_CHILD (a directory);
 *     /dev/shm        a mount mark, FAN_OPEN_EXEC;
 *     /dev/shm        a filesystem mark, FAN_OPEN_EXEC (nothing executes
 *                     there: neither mark sees events during the test).
 *   The fdinfo's "fanotify" lines are kept.
 *
 * After SIGTERM (tags in brackets):
 *   [fanotify-info]   the "fanotify" lines of g's fdinfo are the kept ones,
 *                     in the same order (the group's flags too: its
 *                     fanotify_init flags, without FAN_CLOEXEC);
 *   [fanotify-flags]  g keeps FD_CLOEXEC and O_NONBLOCK;
 *   [fanotify-events] after draining what is queued: appending to
 *                     fanotify.w, reading it, and opening fanotify.d/child
 *                     report exactly FAN_MODIFY|FAN_CLOSE_WRITE on
 *                     fanotify.w (its FAN_OPEN ignored) and FAN_OPEN on
 *                     fanotify.d/child, each event's fd on that file
 *                     (5 s deadline).
 */
#include "zdtm.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/fanotify.h>
#include <sys/stat.h>

#define F_W "fanotify.w"
#define F_D "fanotify.d"
#define F_CHILD "fanotify.d/child"

static char kept[4096];

/* Which of our files inode `ino` is now ("?" if neither). */
static const char *file_of(unsigned long ino)
{
	struct stat st;

	if (stat(F_W, &st) == 0 && st.st_ino == ino)
		return F_W;
	if (stat(F_D, &st) == 0 && st.st_ino == ino)
		return F_D;
	return "?";
}

/* The "fanotify " lines of fd's fdinfo: the group line's flags masked, an
 * inode mark named by the file of ours it is on now (a restored copy may
 * run in a copy of the directory, on other inodes: so inotify's check). */
static int fan_lines(int fd, char *out, size_t size)
{
	char info[4096], *line, *save = NULL;
	size_t len = 0;

	out[0] = 0;
	if (zdtm_fdinfo(fd, info, sizeof(info)) < 0)
		return -1;
	for (line = strtok_r(info, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		unsigned int flags, ev;

		if (strncmp(line, "fanotify ", 9))
			continue;
		unsigned long ino;
		char *rest, *fh;

		if (sscanf(line, "fanotify flags:%x event-flags:%x", &flags, &ev) == 2)
			len += (size_t)snprintf(out + len, size - len, "group %x %x\n", flags, ev);
		else if (sscanf(line, "fanotify ino:%lx", &ino) == 1 && (rest = strchr(line, ' ')) &&
			 (rest = strchr(rest + 1, ' '))) {
			if ((fh = strstr(rest, " fhandle-bytes:")))
				*fh = 0;
			len += (size_t)snprintf(out + len, size - len, "inode %s%s\n", file_of(ino), rest);
		} else
			len += (size_t)snprintf(out + len, size - len, "%s\n", line);
		if (len >= size)
			return -1;
	}
	return 0;
}

static int mark(int g, unsigned int flags, uint64_t mask, const char *path)
{
	if (fanotify_mark(g, FAN_MARK_ADD | flags, mask, AT_FDCWD, path)) {
		printf("FAIL: fanotify_mark %s: %s\n", path, strerror(errno));
		exit(1);
	}
	return 0;
}

static void touch(const char *path)
{
	int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);

	if (fd < 0 || close(fd)) {
		printf("FAIL: create %s: %s\n", path, strerror(errno));
		exit(1);
	}
}

/* Reads every queued event (non-blocking); for each whose fd is on `w` or
 * `child` ORs its mask in, counts the others; closes the event fds. */
static int drain(int g, uint64_t *on_w, uint64_t *on_child, const char *w, const char *child)
{
	char buf[4096] __attribute__((aligned(8)));
	int others = 0;

	for (;;) {
		ssize_t n = read(g, buf, sizeof(buf));
		struct fanotify_event_metadata *m = (void *)buf;

		if (n <= 0)
			break;
		for (; FAN_EVENT_OK(m, n); m = FAN_EVENT_NEXT(m, n)) {
			char link[64], path[PATH_MAX];
			ssize_t l = -1;

			if (m->fd >= 0) {
				snprintf(link, sizeof(link), "/proc/self/fd/%d", m->fd);
				l = readlink(link, path, sizeof(path) - 1);
				close(m->fd);
			}
			if (l > 0) {
				path[l] = 0;
				if (on_w && !strcmp(path, w)) {
					*on_w |= m->mask;
					continue;
				}
				if (on_child && !strcmp(path, child)) {
					*on_child |= m->mask;
					continue;
				}
			}
			others++;
		}
	}
	return others;
}

int main(int argc, char **argv)
{
	char w[PATH_MAX], child[PATH_MAX], now[4096];
	uint64_t on_w = 0, on_child = 0;
	int g, fd, others, fl;
	int64_t deadline;

	zdtm_init(argc, argv, 0, "");
	unlink(F_CHILD);
	rmdir(F_D);
	unlink(F_W);
	touch(F_W);
	if (mkdir(F_D, 0700)) {
		printf("FAIL: mkdir: %s\n", strerror(errno));
		return 1;
	}
	touch(F_CHILD);
	if (!realpath(F_W, w) || !realpath(F_CHILD, child)) {
		printf("FAIL: realpath: %s\n", strerror(errno));
		return 1;
	}
	g = fanotify_init(FAN_CLASS_NOTIF | FAN_NONBLOCK, O_RDONLY | O_LARGEFILE);
	if (g < 0 || fcntl(g, F_SETFD, FD_CLOEXEC)) {
		printf("FAIL: fanotify_init: %s\n", strerror(errno));
		return 1;
	}
	mark(g, 0, FAN_MODIFY | FAN_CLOSE_WRITE, F_W);
	mark(g, FAN_MARK_IGNORED_MASK | FAN_MARK_IGNORED_SURV_MODIFY, FAN_OPEN, F_W);
	mark(g, 0, FAN_OPEN | FAN_EVENT_ON_CHILD, F_D);
	mark(g, FAN_MARK_MOUNT, FAN_OPEN_EXEC, "/dev/shm");
	mark(g, FAN_MARK_FILESYSTEM, FAN_OPEN_EXEC, "/dev/shm");
	if (fan_lines(g, kept, sizeof(kept)) || !strstr(kept, "mnt_id:") || strchr(kept, '?')) {
		printf("FAIL: fdinfo of the group: %s\n", kept);
		return 1;
	}
	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("fanotify-info",
		     fanotify_mark(g, FAN_MARK_REMOVE, FAN_CLOSE_WRITE, AT_FDCWD, F_W));
	if (fan_lines(g, now, sizeof(now)) == 0)
		zdtm_check(!strcmp(now, kept), "fanotify-info", "fdinfo now:\n%s\nwas:\n%s", now, kept);
	else
		zdtm_fail("fanotify-info", "cannot read the fdinfo of fd %d", g);

	ZDTM_CORRUPT("fanotify-flags", fcntl(g, F_SETFL, 0));
	fl = fcntl(g, F_GETFL);
	zdtm_check(fl >= 0 && (fl & O_NONBLOCK), "fanotify-flags", "O_NONBLOCK lost (%#x)", fl);
	fl = fcntl(g, F_GETFD);
	zdtm_check(fl >= 0 && (fl & FD_CLOEXEC), "fanotify-flags", "FD_CLOEXEC lost (%#x)", fl);

	ZDTM_CORRUPT("fanotify-events",
		     fanotify_mark(g, FAN_MARK_REMOVE, FAN_OPEN | FAN_EVENT_ON_CHILD, AT_FDCWD, F_D));
	fcntl(g, F_SETFL, O_NONBLOCK);
	drain(g, NULL, NULL, w, child);
	fd = open(F_W, O_WRONLY | O_APPEND);
	if (fd < 0 || write(fd, "x", 1) != 1 || close(fd))
		zdtm_fail("fanotify-events", "append to %s: %s", F_W, strerror(errno));
	fd = open(F_W, O_RDONLY);
	if (fd >= 0)
		close(fd);
	fd = open(F_CHILD, O_RDONLY);
	if (fd >= 0)
		close(fd);
	others = 0;
	deadline = zdtm_now_ns() + 5000000000ll;
	while (zdtm_now_ns() < deadline &&
	       (on_w != (FAN_MODIFY | FAN_CLOSE_WRITE) || on_child != FAN_OPEN)) {
		others += drain(g, &on_w, &on_child, w, child);
		zdtm_msleep(10);
	}
	others += drain(g, &on_w, &on_child, w, child);
	zdtm_check(on_w == (FAN_MODIFY | FAN_CLOSE_WRITE), "fanotify-events",
		   "events on %s: %#llx, want MODIFY|CLOSE_WRITE", F_W, (unsigned long long)on_w);
	zdtm_check(on_child == FAN_OPEN, "fanotify-events", "events on %s: %#llx, want OPEN",
		   F_CHILD, (unsigned long long)on_child);
	zdtm_check(others == 0, "fanotify-events", "%d other events", others);
	zdtm_finish();
	return 0;
}
