/*
 * sockopts.c - socket options must survive checkpoint/restore (zdtm's
 * sock_opts00..02, sock_ip_opts00/01, sock_tcp_opts00, socket-linger,
 * socket-tcp-keepalive, sk-freebind, sk-freebind-false).
 *
 *   sockopts PIDFILE
 *
 * Set up before "ready" (as root: SO_MARK and SO_BINDTOIFINDEX need it):
 *   U  UDP, bound to 127.0.0.1 (ephemeral port): SO_PRIORITY 5,
 *      SO_RCVLOWAT 7, SO_MARK 0x42, SO_DONTROUTE, SO_OOBINLINE, SO_NO_CHECK,
 *      SO_BINDTOIFINDEX lo, SO_LINGER on for 9 s, IP_TOS 0x10, IP_TTL 33,
 *      IP_PKTINFO; SO_SNDBUF 96 KiB then SO_BUF_LOCK 0 (a size the program
 *      set, not locked)
 *   B  UDP, SO_RCVBUF 80 KiB (locked by that: SO_BUF_LOCK 2)
 *   F  UDP, bound with IP_FREEBIND to 192.0.2.7 (an address this host does
 *      not have; ephemeral port), then IP_FREEBIND turned off
 *   T  TCP, not connected: TCP_NODELAY, TCP_CORK, SO_KEEPALIVE,
 *      TCP_KEEPIDLE 77, TCP_KEEPINTVL 11, TCP_KEEPCNT 4, SO_LINGER on for 3 s
 *   V  UDP over IPv6 (if the host has it): IPV6_V6ONLY, IPV6_RECVPKTINFO,
 *      IPV6_FREEBIND
 *   R  raw IPv4, IPPROTO_UDP, with IP_HDRINCL (zdtm's socket-raw)
 *   I  raw IPv4 ICMP with an ICMP_FILTER (echo request and timestamp
 *      blocked)
 *   J  raw ICMPv6 (if the host has IPv6) with an ICMPV6_FILTER that
 *      passes echo replies only
 *   D  UDP bound to 127.0.0.1 (ephemeral port), R's destination
 * After SIGTERM every option above is read back and compared (the tag of
 * each group in brackets below), and F's address and port are as bound
 * (`freebind`); R sends D a datagram whose IP and UDP headers it wrote
 * itself, which D must receive as sent (`raw`: without IP_HDRINCL the
 * kernel would put its own header in front, and D would get nothing).
 */
#include "zdtm.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/tcp.h>
#include <netinet/udp.h>
#include <netinet/icmp6.h>
#include <linux/icmp.h>
#include <poll.h>
#include <sys/socket.h>

#ifndef SO_BUF_LOCK
#define SO_BUF_LOCK 72
#endif

static int u, b, f, t, v = -1, r, ic, j = -1, d;

struct opt {
	int *fd;
	int level, opt, val;
	const char *tag;
};

/* IP_TOS first: it sets SO_PRIORITY too */
static struct opt opts[] = {
	{ &u, IPPROTO_IP, IP_TOS, 0x10, "ip" },
	{ &u, IPPROTO_IP, IP_TTL, 33, "ip" },
	{ &u, IPPROTO_IP, IP_PKTINFO, 1, "ip" },
	{ &u, SOL_SOCKET, SO_PRIORITY, 5, "sol-socket" },
	{ &u, SOL_SOCKET, SO_RCVLOWAT, 7, "sol-socket" },
	{ &u, SOL_SOCKET, SO_MARK, 0x42, "sol-socket" },
	{ &u, SOL_SOCKET, SO_DONTROUTE, 1, "sol-socket" },
	{ &u, SOL_SOCKET, SO_OOBINLINE, 1, "sol-socket" },
	{ &u, SOL_SOCKET, SO_NO_CHECK, 1, "sol-socket" },
	{ &t, IPPROTO_TCP, TCP_NODELAY, 1, "tcp" },
	{ &t, IPPROTO_TCP, TCP_CORK, 1, "tcp" },
	{ &t, SOL_SOCKET, SO_KEEPALIVE, 1, "tcp" },
	{ &t, IPPROTO_TCP, TCP_KEEPIDLE, 77, "tcp" },
	{ &t, IPPROTO_TCP, TCP_KEEPINTVL, 11, "tcp" },
	{ &t, IPPROTO_TCP, TCP_KEEPCNT, 4, "tcp" },
	{ &v, IPPROTO_IPV6, IPV6_V6ONLY, 1, "ipv6" },
	{ &v, IPPROTO_IPV6, IPV6_RECVPKTINFO, 1, "ipv6" },
	{ &v, IPPROTO_IPV6, IPV6_FREEBIND, 1, "ipv6" },
	{ &r, IPPROTO_IP, IP_HDRINCL, 1, "raw" },
	{ &ic, SOL_RAW, ICMP_FILTER, (1 << ICMP_ECHO) | (1 << ICMP_TIMESTAMP), "raw" },
};
#define NOPTS (sizeof(opts) / sizeof(opts[0]))

static int get(int fd, int level, int opt)
{
	int val = -1;
	socklen_t len = sizeof(val);

	if (getsockopt(fd, level, opt, &val, &len))
		return -1;
	return val;
}

static void set(int fd, int level, int opt, int val, const char *what)
{
	if (setsockopt(fd, level, opt, &val, sizeof(val)))
		zdtm_die("setsockopt %s", what);
}

static void check_linger(int fd, int secs, const char *what)
{
	struct linger l = { 0, 0 };
	socklen_t len = sizeof(l);

	zdtm_check(getsockopt(fd, SOL_SOCKET, SO_LINGER, &l, &len) == 0 &&
			   l.l_onoff == 1 && l.l_linger == secs,
		   "linger", "%s: SO_LINGER {%d, %d}, expected {1, %d}", what,
		   l.l_onoff, l.l_linger, secs);
}

/* R sends D a datagram with headers of its own; D must get it. */
static void check_raw(int dport)
{
	char pkt[sizeof(struct iphdr) + sizeof(struct udphdr) + 4] = { 0 }, got[64];
	struct iphdr *ip = (struct iphdr *)pkt;
	struct udphdr *uh = (struct udphdr *)(pkt + sizeof(*ip));
	struct sockaddr_in to = { .sin_family = AF_INET };
	struct pollfd p = { .fd = d, .events = POLLIN };
	ssize_t n = -1;

	to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ip->version = 4;
	ip->ihl = 5;
	ip->ttl = 64;
	ip->protocol = IPPROTO_UDP;
	ip->saddr = to.sin_addr.s_addr;
	ip->daddr = to.sin_addr.s_addr;
	/* (tot_len, id and the IP checksum are the kernel's; UDP's 0: none) */
	uh->source = htons(1234);
	uh->dest = htons(dport);
	uh->len = htons(sizeof(*uh) + 4);
	memcpy(pkt + sizeof(*ip) + sizeof(*uh), "raw!", 4);
	if (sendto(r, pkt, sizeof(pkt), 0, (struct sockaddr *)&to, sizeof(to)) !=
	    (ssize_t)sizeof(pkt)) {
		zdtm_fail("raw", "R: sendto: %s", strerror(errno));
		return;
	}
	if (poll(&p, 1, 5000) == 1)
		n = recv(d, got, sizeof(got), MSG_DONTWAIT);
	zdtm_check(n == 4 && !memcmp(got, "raw!", 4), "raw",
		   "D got %zd bytes of R's hand-made datagram, expected \"raw!\"", n);
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	struct linger l9 = { 1, 9 }, l3 = { 1, 3 };
	int lo = if_nametoindex("lo"), sndbuf, rcvbuf, fport, dport;
	struct icmp6_filter j6, j6now;
	socklen_t len;
	size_t i;

	zdtm_init(argc, argv, 0, "");
	if (!lo)
		zdtm_die("no lo");
	u = socket(AF_INET, SOCK_DGRAM, 0);
	b = socket(AF_INET, SOCK_DGRAM, 0);
	f = socket(AF_INET, SOCK_DGRAM, 0);
	t = socket(AF_INET, SOCK_STREAM, 0);
	if (u < 0 || b < 0 || f < 0 || t < 0)
		zdtm_die("socket");
	v = socket(AF_INET6, SOCK_DGRAM, 0);
	r = socket(AF_INET, SOCK_RAW, IPPROTO_UDP);
	ic = socket(AF_INET, SOCK_RAW, IPPROTO_ICMP);
	d = socket(AF_INET, SOCK_DGRAM, 0);
	if (r < 0 || ic < 0 || d < 0)
		zdtm_die("raw sockets (needs CAP_NET_RAW)");
	j = socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6);
	ICMP6_FILTER_SETBLOCKALL(&j6);
	ICMP6_FILTER_SETPASS(ICMP6_ECHO_REPLY, &j6);
	if (j >= 0 && setsockopt(j, IPPROTO_ICMPV6, ICMP6_FILTER, &j6, sizeof(j6)))
		zdtm_die("ICMP6_FILTER");
	for (i = 0; i < NOPTS; i++)
		if (*opts[i].fd >= 0)
			set(*opts[i].fd, opts[i].level, opts[i].opt,
			    opts[i].val, opts[i].tag);
	set(u, SOL_SOCKET, SO_BINDTOIFINDEX, lo, "SO_BINDTOIFINDEX");
	if (setsockopt(u, SOL_SOCKET, SO_LINGER, &l9, sizeof(l9)) ||
	    setsockopt(t, SOL_SOCKET, SO_LINGER, &l3, sizeof(l3)))
		zdtm_die("SO_LINGER");
	set(u, SOL_SOCKET, SO_SNDBUF, 96 * 1024, "SO_SNDBUF");
	set(u, SOL_SOCKET, SO_BUF_LOCK, 0, "SO_BUF_LOCK");
	set(b, SOL_SOCKET, SO_RCVBUF, 80 * 1024, "SO_RCVBUF");
	sndbuf = get(u, SOL_SOCKET, SO_SNDBUF);
	rcvbuf = get(b, SOL_SOCKET, SO_RCVBUF);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(u, (struct sockaddr *)&a, sizeof(a)))
		zdtm_die("bind U");
	set(f, IPPROTO_IP, IP_FREEBIND, 1, "IP_FREEBIND");
	inet_pton(AF_INET, "192.0.2.7", &a.sin_addr);
	if (bind(f, (struct sockaddr *)&a, sizeof(a)))
		zdtm_die("bind F to 192.0.2.7");
	len = sizeof(a);
	if (getsockname(f, (struct sockaddr *)&a, &len))
		zdtm_die("getsockname F");
	fport = ntohs(a.sin_port);
	set(f, IPPROTO_IP, IP_FREEBIND, 0, "IP_FREEBIND");
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	a.sin_port = 0;
	len = sizeof(a);
	if (bind(d, (struct sockaddr *)&a, sizeof(a)) ||
	    getsockname(d, (struct sockaddr *)&a, &len))
		zdtm_die("bind D");
	dport = ntohs(a.sin_port);

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("sol-socket", set(u, SOL_SOCKET, SO_PRIORITY, 6, "x"));
	ZDTM_CORRUPT("ip", set(u, IPPROTO_IP, IP_TTL, 34, "x"));
	ZDTM_CORRUPT("tcp", set(t, IPPROTO_TCP, TCP_KEEPCNT, 5, "x"));
	ZDTM_CORRUPT("ipv6", if (v >= 0)
		set(v, IPPROTO_IPV6, IPV6_RECVPKTINFO, 0, "x"));
	ZDTM_CORRUPT("linger", setsockopt(t, SOL_SOCKET, SO_LINGER, &l9,
					  sizeof(l9)));
	ZDTM_CORRUPT("device", set(u, SOL_SOCKET, SO_BINDTOIFINDEX, 0, "x"));
	ZDTM_CORRUPT("buffers", set(u, SOL_SOCKET, SO_BUF_LOCK, 1, "x"));
	ZDTM_CORRUPT("freebind", set(f, IPPROTO_IP, IP_FREEBIND, 1, "x"));
	ZDTM_CORRUPT("raw", set(r, IPPROTO_IP, IP_HDRINCL, 0, "x"));
	ZDTM_CORRUPT("raw6", if (j >= 0) {
		j6now = j6;
		ICMP6_FILTER_SETPASS(ICMP6_ECHO_REQUEST, &j6now);
		setsockopt(j, IPPROTO_ICMPV6, ICMP6_FILTER, &j6now, sizeof(j6now));
	});

	for (i = 0; i < NOPTS; i++) {
		int got;

		if (*opts[i].fd < 0)
			continue;
		got = get(*opts[i].fd, opts[i].level, opts[i].opt);
		zdtm_check(got == opts[i].val, opts[i].tag,
			   "option (%d, %d): %d, expected %d", opts[i].level,
			   opts[i].opt, got, opts[i].val);
	}
	check_linger(u, 9, "U");
	check_linger(t, 3, "T");
	zdtm_check(get(u, SOL_SOCKET, SO_BINDTOIFINDEX) == lo, "device",
		   "U: SO_BINDTOIFINDEX %d, expected lo (%d)",
		   get(u, SOL_SOCKET, SO_BINDTOIFINDEX), lo);
	zdtm_check(get(u, SOL_SOCKET, SO_SNDBUF) == sndbuf &&
			   get(u, SOL_SOCKET, SO_BUF_LOCK) == 0,
		   "buffers", "U: SO_SNDBUF %d lock %d, expected %d lock 0",
		   get(u, SOL_SOCKET, SO_SNDBUF),
		   get(u, SOL_SOCKET, SO_BUF_LOCK), sndbuf);
	zdtm_check(get(b, SOL_SOCKET, SO_RCVBUF) == rcvbuf &&
			   get(b, SOL_SOCKET, SO_BUF_LOCK) == 2,
		   "buffers", "B: SO_RCVBUF %d lock %d, expected %d lock 2",
		   get(b, SOL_SOCKET, SO_RCVBUF),
		   get(b, SOL_SOCKET, SO_BUF_LOCK), rcvbuf);
	memset(&a, 0, sizeof(a));
	len = sizeof(a);
	zdtm_check(getsockname(f, (struct sockaddr *)&a, &len) == 0 &&
			   a.sin_addr.s_addr == inet_addr("192.0.2.7") &&
			   ntohs(a.sin_port) == fport &&
			   get(f, IPPROTO_IP, IP_FREEBIND) == 0,
		   "freebind", "F: bound to %s:%d (port %d), IP_FREEBIND %d",
		   inet_ntoa(a.sin_addr), ntohs(a.sin_port), fport,
		   get(f, IPPROTO_IP, IP_FREEBIND));
	check_raw(dport);
	if (j >= 0) {
		len = sizeof(j6now);
		memset(&j6now, 0, sizeof(j6now));
		zdtm_check(getsockopt(j, IPPROTO_ICMPV6, ICMP6_FILTER, &j6now, &len) == 0 &&
				   len == sizeof(j6now) && !memcmp(&j6now, &j6, sizeof(j6)),
			   "raw6", "J: ICMP6_FILTER differs (len %u)", (unsigned)len);
	}
	zdtm_finish();
}
