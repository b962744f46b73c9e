/*
 * fanotify_ghost.c - a fanotify mark on a file deleted since, which the
 * process still holds open: the mark comes back on the rebuilt file.
 *
 *   fanotify_ghost PIDFILE
 *
 * Needs CAP_SYS_ADMIN. Set up before "ready" (in the cwd): a file "gone"
 * holding "abc", open read-write as f; a fanotify group g with an inode
 * mark on it for FAN_MODIFY; then the file is removed.
 *
 * After SIGTERM:
 *   `mark`     appending to f reports FAN_MODIFY on g, its event's fd on
 *              f's file (same inode), within 5 s
 *   `content`  f still reads "abc" before the append
 */
#include "zdtm.h"

#include <sys/fanotify.h>
#include <sys/stat.h>

int main(int argc, char **argv)
{
	int f, g;
	char buf[8] = { 0 };

	zdtm_init(argc, argv, 0, "");
	unlink("gone");
	f = open("gone", O_RDWR | O_CREAT, 0600);
	g = fanotify_init(FAN_CLASS_NOTIF | FAN_NONBLOCK, O_RDONLY);
	if (f < 0 || g < 0 || write(f, "abc", 3) != 3 ||
	    fanotify_mark(g, FAN_MARK_ADD, FAN_MODIFY, AT_FDCWD, "gone") || unlink("gone"))
		zdtm_die("setup");

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("mark", {
		char p[64];

		snprintf(p, sizeof(p), "/proc/self/fd/%d", f);
		fanotify_mark(g, FAN_MARK_REMOVE, FAN_MODIFY, AT_FDCWD, p);
	});
	zdtm_check(pread(f, buf, 3, 0) == 3 && !memcmp(buf, "abc", 3), "content",
		   "f reads \"%s\"", buf);
	/* Nothing queued before the append. */
	{
		char ev[4096];

		while (read(g, ev, sizeof(ev)) > 0)
			;
	}
	if (pwrite(f, "d", 1, 3) != 1)
		zdtm_fail("content", "append: %s", strerror(errno));
	{
		char ev[4096];
		struct fanotify_event_metadata *md = (struct fanotify_event_metadata *)ev;
		int64_t end = zdtm_now_ns() + 5000000000ll;
		ssize_t r = -1;
		struct stat a, b;

		while ((r = read(g, ev, sizeof(ev))) < 0 && zdtm_now_ns() < end)
			zdtm_msleep(5);
		if (zdtm_check(r >= (ssize_t)sizeof(*md) && (md->mask & FAN_MODIFY), "mark",
			       "no FAN_MODIFY event (read %zd)", r)) {
			zdtm_check(fstat(md->fd, &a) == 0 && fstat(f, &b) == 0 && a.st_ino == b.st_ino &&
					   a.st_dev == b.st_dev,
				   "mark", "the event is not on f's file");
			close(md->fd);
		}
	}
	zdtm_finish();
}
