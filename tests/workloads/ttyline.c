/*
 * ttyline.c - fds on a virtual console and a serial line, each with a
 * termios and window size of its own (zdtm's vt, CRIU's tty reopening).
 *
 *   ttyline PIDFILE [VT [SERIAL]]     (defaults /dev/tty9 and /dev/ttyS0)
 *
 * Set up before "ready": VT opened O_RDWR|O_NOCTTY|O_NONBLOCK, not
 * close-on-exec; SERIAL opened O_WRONLY|O_NOCTTY|O_APPEND, close-on-exec.
 * Each gets echo, canonical mode and IXON off, IXOFF on, VMIN 3, VTIME 4,
 * VINTR ^B (the speeds are left alone: a serial line may be the
 * machine's console), and a window size of its own (40x100, 33x77).
 * After SIGTERM (tags in brackets):
 *   [device]  each fd is on its device (the path's device number);
 *   [termios] each line's termios is the one set (flags, line, control
 *             characters, speeds: what tcgetattr gives, byte for byte);
 *   [winsize] each window size is the one set;
 *   [flags]   each fd's access mode, O_NONBLOCK/O_APPEND and FD_CLOEXEC.
 * The lines get their original termios and window size back at the end.
 * A device that does not exist here (ENOENT, ENXIO, ENODEV at open) is
 * skipped with a note; the run fails if both are.
 */
#include "zdtm.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <termios.h>

struct line {
	const char *path;
	int flags, cloexec, fd;
	unsigned short rows, cols;
	struct termios orig, want;
	struct winsize orig_ws;
	dev_t rdev;
};

static int set_up(struct line *l)
{
	struct stat st;
	struct winsize ws = { .ws_row = l->rows, .ws_col = l->cols };

	l->fd = open(l->path, l->flags | O_NOCTTY | (l->cloexec ? O_CLOEXEC : 0));
	if (l->fd < 0) {
		if (errno == ENOENT || errno == ENXIO || errno == ENODEV) {
			printf("note: %s: %s, skipped\n", l->path, strerror(errno));
			return 0;
		}
		zdtm_die("open %s: %s", l->path, strerror(errno));
	}
	if (fstat(l->fd, &st) || !S_ISCHR(st.st_mode))
		zdtm_die("%s is not a character device", l->path);
	l->rdev = st.st_rdev;
	if (tcgetattr(l->fd, &l->orig) || ioctl(l->fd, TIOCGWINSZ, &l->orig_ws))
		zdtm_die("%s: tcgetattr: %s", l->path, strerror(errno));
	l->want = l->orig;
	l->want.c_lflag &= ~(ECHO | ICANON);
	l->want.c_iflag &= ~IXON;
	l->want.c_iflag |= IXOFF;
	l->want.c_cc[VMIN] = 3;
	l->want.c_cc[VTIME] = 4;
	l->want.c_cc[VINTR] = 2;
	if (tcsetattr(l->fd, TCSANOW, &l->want) || tcgetattr(l->fd, &l->want) ||
	    ioctl(l->fd, TIOCSWINSZ, &ws))
		zdtm_die("%s: tcsetattr: %s", l->path, strerror(errno));
	return 1;
}

static void check(struct line *l)
{
	struct termios t;
	struct winsize ws;
	struct stat st;
	int fl, fdf;

	if (l->fd < 0)
		return;
	zdtm_check(fstat(l->fd, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == l->rdev,
		   "device", "%s: fd is not on device %u:%u", l->path, major(l->rdev),
		   minor(l->rdev));
	if (zdtm_check(tcgetattr(l->fd, &t) == 0, "termios", "%s: tcgetattr: %s", l->path,
		       strerror(errno)))
		zdtm_check(memcmp(&t, &l->want, sizeof(t)) == 0, "termios",
			   "%s: iflag %o oflag %o cflag %o lflag %o VMIN %d VTIME %d; expected %o %o %o %o %d %d",
			   l->path, t.c_iflag, t.c_oflag, t.c_cflag, t.c_lflag, t.c_cc[VMIN],
			   t.c_cc[VTIME], l->want.c_iflag, l->want.c_oflag, l->want.c_cflag,
			   l->want.c_lflag, l->want.c_cc[VMIN], l->want.c_cc[VTIME]);
	if (zdtm_check(ioctl(l->fd, TIOCGWINSZ, &ws) == 0, "winsize", "%s: TIOCGWINSZ: %s",
		       l->path, strerror(errno)))
		zdtm_check(ws.ws_row == l->rows && ws.ws_col == l->cols, "winsize",
			   "%s: %ux%u, expected %ux%u", l->path, ws.ws_col, ws.ws_row, l->cols,
			   l->rows);
	fl = fcntl(l->fd, F_GETFL);
	fdf = fcntl(l->fd, F_GETFD);
	zdtm_check(fl >= 0 &&
			   (fl & (O_ACCMODE | O_NONBLOCK | O_APPEND)) ==
				   (l->flags & (O_ACCMODE | O_NONBLOCK | O_APPEND)),
		   "flags", "%s: status flags %o, expected %o", l->path,
		   fl & (O_ACCMODE | O_NONBLOCK | O_APPEND),
		   l->flags & (O_ACCMODE | O_NONBLOCK | O_APPEND));
	zdtm_check(fdf >= 0 && !!(fdf & FD_CLOEXEC) == l->cloexec, "flags",
		   "%s: close-on-exec %d, expected %d", l->path, !!(fdf & FD_CLOEXEC), l->cloexec);
}

static void put_back(struct line *l)
{
	int fd;

	if (l->fd < 0)
		return;
	fd = open(l->path, O_RDWR | O_NOCTTY | O_NONBLOCK);
	if (fd >= 0) {
		tcsetattr(fd, TCSANOW, &l->orig);
		ioctl(fd, TIOCSWINSZ, &l->orig_ws);
		close(fd);
	}
}

int main(int argc, char **argv)
{
	struct line vt = { .path = "/dev/tty9", .flags = O_RDWR | O_NONBLOCK, .rows = 40, .cols = 100 };
	struct line ser = { .path = "/dev/ttyS0", .flags = O_WRONLY | O_APPEND, .cloexec = 1,
			    .rows = 33, .cols = 77 };
	int n;

	zdtm_init(argc, argv, 2, "[VT [SERIAL]]");
	if (argc > 2)
		vt.path = argv[2];
	if (argc > 3)
		ser.path = argv[3];
	n = set_up(&vt) + set_up(&ser);
	if (!n)
		zdtm_die("neither %s nor %s exists here", vt.path, ser.path);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);

	ZDTM_CORRUPT("device", {
		int o = open("/dev/null", O_RDWR);
		dup2(o, vt.fd >= 0 ? vt.fd : ser.fd);
	});
	ZDTM_CORRUPT("termios", {
		struct termios t = ser.want;
		t.c_cc[VTIME] = 9;
		tcsetattr(ser.fd >= 0 ? ser.fd : vt.fd, TCSANOW, &t);
	});
	ZDTM_CORRUPT("winsize", {
		struct winsize ws = { .ws_row = 1, .ws_col = 1 };
		ioctl(ser.fd >= 0 ? ser.fd : vt.fd, TIOCSWINSZ, &ws);
	});
	ZDTM_CORRUPT("flags", fcntl(ser.fd >= 0 ? ser.fd : vt.fd, F_SETFD, 0));
	check(&vt);
	check(&ser);
	put_back(&vt);
	put_back(&ser);
	zdtm_finish();
	return 0;
}
