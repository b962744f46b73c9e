/*
 * epoll_fds.c - epoll registrations that outlive their fd numbers must
 * survive checkpoint/restore (zdtm's epoll, epoll01).
 *
 *   epoll_fds PIDFILE
 *
 * Set up before "ready", with three pipes A, B, C:
 *   A's read end is dup'd to fd 900, registered as 900 (data 0xA), and fd
 *     900 closed: the registration stays, keyed by 900, on A's read end;
 *   B's read end is dup'd to fd 800, registered (data 0xB), fd 800 closed;
 *     then C's read end is dup'd to 800 and registered too (data 0xC): two
 *     registrations of fd 800, on two files;
 *   fd 800 stays open (C's read end).
 * After SIGTERM: the instance's fdinfo has the three registrations (tfd
 * 900, 800, 800); a byte written to each pipe makes epoll_wait report
 * exactly that pipe's data (`closed` for A, `reused` for B, `current` for
 * C), and fd 800 is still C's read end.
 */
#include "zdtm.h"

#include <fcntl.h>
#include <sys/epoll.h>

static int count_tfd(int ep, int tfd)
{
	char info[4096], key[32];
	const char *p = info;
	int n = 0;

	if (zdtm_fdinfo(ep, info, sizeof(info)) < 0)
		return -1;
	snprintf(key, sizeof(key), "tfd: %8d ", tfd);
	while ((p = strstr(p, key))) {
		n++;
		p++;
	}
	return n;
}

/* Writes a byte into w; returns the data of the one event epoll reports
 * (0 if none, or more than one), then reads the byte back from r. */
static uint64_t fire(int ep, int w, int r)
{
	struct epoll_event ev[4];
	char c = 'e';
	int n;

	if (write(w, &c, 1) != 1)
		return 0;
	n = epoll_wait(ep, ev, 4, 1000);
	if (read(r, &c, 1) != 1 || n != 1)
		return 0;
	return ev[0].data.u64;
}

int main(int argc, char **argv)
{
	int a[2], b[2], c[2], ep;
	struct epoll_event ev = { .events = EPOLLIN };
	uint64_t got;

	zdtm_init(argc, argv, 0, "");
	/* A corrupted run writes into a pipe whose read end it closed. */
	signal(SIGPIPE, SIG_IGN);
	ep = epoll_create1(0);
	if (ep < 0 || pipe(a) || pipe(b) || pipe(c)) {
		printf("setup error: %s\nFAIL: setup\n", strerror(errno));
		return 1;
	}
	ev.data.u64 = 0xA;
	if (dup2(a[0], 900) != 900 || epoll_ctl(ep, EPOLL_CTL_ADD, 900, &ev) || close(900)) {
		printf("setup error: fd 900: %s\nFAIL: setup\n", strerror(errno));
		return 1;
	}
	ev.data.u64 = 0xB;
	if (dup2(b[0], 800) != 800 || epoll_ctl(ep, EPOLL_CTL_ADD, 800, &ev) || close(800)) {
		printf("setup error: fd 800: %s\nFAIL: setup\n", strerror(errno));
		return 1;
	}
	ev.data.u64 = 0xC;
	if (dup2(c[0], 800) != 800 || epoll_ctl(ep, EPOLL_CTL_ADD, 800, &ev)) {
		printf("setup error: fd 800 again: %s\nFAIL: setup\n", strerror(errno));
		return 1;
	}
	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(20);
	ZDTM_CORRUPT("closed", close(a[0]); a[0] = -1);
	ZDTM_CORRUPT("current", epoll_ctl(ep, EPOLL_CTL_DEL, 800, NULL));
	ZDTM_CORRUPT("reused", close(b[0]));

	zdtm_check(count_tfd(ep, 900) == 1, "closed", "%d registrations of fd 900",
		   count_tfd(ep, 900));
	zdtm_check(count_tfd(ep, 800) == 2, "reused", "%d registrations of fd 800",
		   count_tfd(ep, 800));
	if (a[0] >= 0) {
		got = fire(ep, a[1], a[0]);
		zdtm_check(got == 0xA, "closed", "pipe A's event has data %#llx, want 0xa",
			   (unsigned long long)got);
	}
	got = fire(ep, b[1], b[0]);
	zdtm_check(got == 0xB, "reused", "pipe B's event has data %#llx, want 0xb",
		   (unsigned long long)got);
	got = fire(ep, c[1], c[0]);
	zdtm_check(got == 0xC, "current", "pipe C's event has data %#llx, want 0xc",
		   (unsigned long long)got);
	{
		char x = 'y', y = 0;

		zdtm_check(write(c[1], &x, 1) == 1 && read(800, &y, 1) == 1 && y == 'y', "current",
			   "fd 800 is not pipe C's read end");
	}
	zdtm_finish();
}
