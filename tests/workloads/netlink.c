/*
 * netlink.c - netlink sockets bound, unbound and connected (zdtm's
 * sk-netlink).
 *
 *   netlink PIDFILE
 *
 * Set up before "ready":
 *   R  NETLINK_ROUTE, bound to port id getpid() and group RTNLGRP_DCB (23,
 *      in the bind mask), then joined to RTNLGRP_MPLS_ROUTE (27) with
 *      NETLINK_ADD_MEMBERSHIP (two quiet groups: no event is expected)
 *   U  NETLINK_ROUTE, never bound
 *   K  NETLINK_KOBJECT_UEVENT, connected to port id 0x12345, group 0
 * After SIGTERM:
 *   `bound`     R's name has the port id and groups 23 and 27 (its name
 *               shows the first 32 groups), and NETLINK_LIST_MEMBERSHIPS
 *               lists those two only
 *   `request`   an RTM_GETLINK dump request sent on R (seq 0xabcd) is
 *               answered on R with that seq
 *   `unbound`   U's port id is 0
 *   `connected` K's peer is port id 0x12345, group 0
 */
#include "zdtm.h"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>

#define DST 0x12345
#define MASK (1u << (RTNLGRP_DCB - 1))
#define ALL (MASK | (1u << (RTNLGRP_MPLS_ROUTE - 1)))

static struct sockaddr_nl nl(unsigned pid, unsigned groups)
{
	struct sockaddr_nl a = { .nl_family = AF_NETLINK };

	a.nl_pid = pid;
	a.nl_groups = groups;
	return a;
}

static struct sockaddr_nl name_of(int s, int peer)
{
	struct sockaddr_nl a = { 0 };
	socklen_t len = sizeof(a);

	if (peer)
		getpeername(s, (struct sockaddr *)&a, &len);
	else
		getsockname(s, (struct sockaddr *)&a, &len);
	return a;
}

static int request(int s, unsigned seq)
{
	struct {
		struct nlmsghdr h;
		struct rtgenmsg g;
	} req = {
		.h = { .nlmsg_len = sizeof(req), .nlmsg_type = RTM_GETLINK,
		       .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP,
		       .nlmsg_seq = seq },
		.g = { .rtgen_family = AF_UNSPEC },
	};
	struct sockaddr_nl k = nl(0, 0);

	return sendto(s, &req, sizeof(req), 0, (struct sockaddr *)&k,
		      sizeof(k)) == sizeof(req)
		       ? 0
		       : -1;
}

/* The seq of the first answer to arrive on s (0 if none in 2 s). */
static unsigned answer(int s)
{
	static char buf[65536];
	struct timeval tv = { .tv_sec = 2 };
	ssize_t n;

	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	n = recv(s, buf, sizeof(buf), 0);
	if (n < (ssize_t)sizeof(struct nlmsghdr))
		return 0;
	return ((struct nlmsghdr *)buf)->nlmsg_seq;
}

int main(int argc, char **argv)
{
	struct sockaddr_nl a;
	unsigned groups[4] = { 0 };
	socklen_t len = sizeof(groups);
	int r, u, k, g = RTNLGRP_MPLS_ROUTE;
	unsigned portid;

	zdtm_init(argc, argv, 0, "");
	portid = getpid();
	r = socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE);
	u = socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE);
	k = socket(AF_NETLINK, SOCK_RAW, NETLINK_KOBJECT_UEVENT);
	if (r < 0 || u < 0 || k < 0)
		zdtm_die("socket");
	a = nl(portid, MASK);
	if (bind(r, (struct sockaddr *)&a, sizeof(a)))
		zdtm_die("bind R");
	if (setsockopt(r, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, &g, sizeof(g)))
		zdtm_die("join R");
	a = nl(DST, 0);
	if (connect(k, (struct sockaddr *)&a, sizeof(a)))
		zdtm_die("connect K");

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("bound", setsockopt(r, SOL_NETLINK, NETLINK_DROP_MEMBERSHIP, &g, sizeof(g)));
	ZDTM_CORRUPT("request", request(r, 0x1111));
	ZDTM_CORRUPT("unbound", {
		struct sockaddr_nl z = nl(0, 0);

		bind(u, (struct sockaddr *)&z, sizeof(z));
	});
	ZDTM_CORRUPT("connected", {
		struct sockaddr_nl o = nl(DST + 1, 0);

		connect(k, (struct sockaddr *)&o, sizeof(o));
	});

	a = name_of(r, 0);
	zdtm_check(a.nl_pid == portid && a.nl_groups == ALL, "bound",
		   "R: port id %u groups %#x, expected %u %#x", a.nl_pid,
		   a.nl_groups, portid, ALL);
	zdtm_check(getsockopt(r, SOL_NETLINK, NETLINK_LIST_MEMBERSHIPS, groups,
			      &len) == 0 &&
			   groups[0] == ALL &&
			   !groups[1],
		   "bound", "R's groups %#x %#x", groups[0], groups[1]);
	if (zdtm_check(request(r, 0xabcd) == 0, "request", "send: %s",
		       strerror(errno))) {
		unsigned seq = answer(r);

		zdtm_check(seq == 0xabcd, "request", "answer seq %#x, expected 0xabcd", seq);
	}
	a = name_of(u, 0);
	zdtm_check(a.nl_pid == 0, "unbound", "U has port id %u", a.nl_pid);
	a = name_of(k, 1);
	zdtm_check(a.nl_pid == DST && a.nl_groups == 0, "connected",
		   "K's peer %#x group %u", a.nl_pid, a.nl_groups);
	zdtm_finish();
}
