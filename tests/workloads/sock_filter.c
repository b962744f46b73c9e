/*
 * sock_filter.c - classic BPF socket filters (SO_ATTACH_FILTER), one of
 * them locked (SO_LOCK_FILTER).
 *
 *   sock_filter PIDFILE
 *
 * Set up before "ready" (zdtm's sock_filter00, sock_filter01):
 *   u    UDP on 127.0.0.1 with a 4-instruction filter dropping every
 *        datagram whose first byte is 'D', locked.
 *   v    UDP on 127.0.0.1 with a 1-instruction filter keeping the first
 *        16 bytes of each datagram, not locked.
 *   l    a TCP listener on 127.0.0.1 with a 14-instruction filter
 *        (accepts everything: a chain of jumps).
 * After SIGTERM it checks: each filter read back (SO_GET_FILTER) equals
 * the one attached, instruction for instruction (`filter`); u is locked
 * (SO_LOCK_FILTER 1, SO_DETACH_FILTER fails with EPERM), v is not and l
 * not (`lock`); u drops a 'D' datagram and takes an 'A' one, v truncates
 * a 100-byte datagram to 16 bytes (`works`); a client connects to l and is
 * accepted (`listen`); then v's filter comes off (`detach`).
 */
#include "zdtm.h"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#ifndef SO_LOCK_FILTER
#define SO_LOCK_FILTER 44
#endif

static struct sock_filter fu[] = {
	BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 8), /* the first byte after the UDP header */
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 'D', 0, 1),
	BPF_STMT(BPF_RET | BPF_K, 0),
	BPF_STMT(BPF_RET | BPF_K, 0xffff),
};
static struct sock_filter fv[] = {
	BPF_STMT(BPF_RET | BPF_K, 8 + 16), /* UDP header + 16 bytes */
};
static struct sock_filter fl[14];

static int bound(int type, struct sockaddr_in *a)
{
	socklen_t l = sizeof(*a);
	int s = socket(AF_INET, type | SOCK_CLOEXEC, 0);

	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (s < 0 || bind(s, (struct sockaddr *)a, sizeof(*a)) ||
	    getsockname(s, (struct sockaddr *)a, &l))
		zdtm_die("bind");
	return s;
}

static void attach(int s, struct sock_filter *f, int n)
{
	struct sock_fprog p = { .len = n, .filter = f };

	if (setsockopt(s, SOL_SOCKET, SO_ATTACH_FILTER, &p, sizeof(p)))
		zdtm_die("SO_ATTACH_FILTER");
}

static void check_filter(int s, struct sock_filter *f, int n, const char *who)
{
	struct sock_filter got[32];
	socklen_t len = 0;

	if (!zdtm_check(!getsockopt(s, SOL_SOCKET, SO_GET_FILTER, NULL, &len) &&
				(int)len == n,
			"filter", "%s: %u instructions (%s), expected %d", who, len,
			strerror(errno), n))
		return;
	memset(got, 0, sizeof(got));
	if (getsockopt(s, SOL_SOCKET, SO_GET_FILTER, got, &len))
		zdtm_die("SO_GET_FILTER");
	for (int i = 0; i < n; i++)
		zdtm_check(!memcmp(&got[i], &f[i], sizeof(got[i])), "filter",
			   "%s: instruction %d is {%#x %u %u %#x}, expected {%#x %u %u %#x}",
			   who, i, got[i].code, got[i].jt, got[i].jf, got[i].k,
			   f[i].code, f[i].jt, f[i].jf, f[i].k);
}

static void check_lock(int s, int want, const char *who)
{
	int v = -1;
	socklen_t l = sizeof(v);

	getsockopt(s, SOL_SOCKET, SO_LOCK_FILTER, &v, &l);
	zdtm_check(v == want, "lock", "%s: SO_LOCK_FILTER %d, expected %d", who, v, want);
}

static void send_to(int from, struct sockaddr_in *to, char first, size_t len)
{
	char buf[100];

	memset(buf, 'x', sizeof(buf));
	buf[0] = first;
	if (sendto(from, buf, len, 0, (struct sockaddr *)to, sizeof(*to)) != (ssize_t)len)
		zdtm_die("sendto");
}

static ssize_t recv_one(int s, char *first)
{
	char buf[200];
	struct pollfd p = { .fd = s, .events = POLLIN };
	ssize_t n;

	poll(&p, 1, 1000);
	n = recv(s, buf, sizeof(buf), MSG_DONTWAIT);
	*first = n > 0 ? buf[0] : 0;
	return n;
}

int main(int argc, char **argv)
{
	struct sockaddr_in ua, va, la, sa;
	int u, v, l, snd, c, a, one = 1;
	char first;
	ssize_t n;

	zdtm_init(argc, argv, 0, "");
	for (int i = 0; i < 13; i++)
		fl[i] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JA, 0, 0, 0);
	fl[13] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, 0xffff);
	fl[3] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JA, 1, 0, 0);
	u = bound(SOCK_DGRAM, &ua);
	v = bound(SOCK_DGRAM, &va);
	snd = bound(SOCK_DGRAM, &sa);
	l = bound(SOCK_STREAM, &la);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (listen(l, 4))
		zdtm_die("listen");
	attach(u, fu, 4);
	if (setsockopt(u, SOL_SOCKET, SO_LOCK_FILTER, &one, sizeof(one)))
		zdtm_die("SO_LOCK_FILTER");
	attach(v, fv, 1);
	attach(l, fl, 14);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(20);

	ZDTM_CORRUPT("filter", attach(v, fu, 4));
	ZDTM_CORRUPT("lock", setsockopt(v, SOL_SOCKET, SO_LOCK_FILTER, &one, sizeof(one)));
	ZDTM_CORRUPT("works", {
		send_to(snd, &ua, 'Z', 10);
		zdtm_msleep(20);
	});
	check_filter(u, fu, 4, "u");
	check_filter(v, fv, 1, "v");
	check_filter(l, fl, 14, "l");
	check_lock(u, 1, "u");
	check_lock(v, 0, "v");
	check_lock(l, 0, "l");
	zdtm_check(setsockopt(u, SOL_SOCKET, SO_DETACH_FILTER, &one, sizeof(one)) &&
			   errno == EPERM,
		   "lock", "u: its locked filter came off (%s)", strerror(errno));

	send_to(snd, &ua, 'D', 10);
	send_to(snd, &ua, 'A', 10);
	n = recv_one(u, &first);
	zdtm_check(n == 10 && first == 'A', "works", "u: got %zd bytes starting %#x, expected the 'A' datagram", n, first);
	send_to(snd, &va, 'B', 100);
	n = recv_one(v, &first);
	zdtm_check(n == 16 && first == 'B', "works", "v: got %zd bytes, expected 16", n);

	c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	zdtm_check(c >= 0 && !connect(c, (struct sockaddr *)&la, sizeof(la)), "listen",
		   "connect: %s", strerror(errno));
	a = accept(l, NULL, NULL);
	zdtm_check(a >= 0, "listen", "accept: %s", strerror(errno));

	zdtm_check(!setsockopt(v, SOL_SOCKET, SO_DETACH_FILTER, &one, sizeof(one)), "detach",
		   "v: SO_DETACH_FILTER: %s", strerror(errno));
	zdtm_finish();
	return 0;
}
