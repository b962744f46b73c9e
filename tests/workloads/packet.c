/*
 * packet.c - packet sockets must come back bound as they were, with their
 * options, fanout group, memberships and rings (zdtm's packet_sock,
 * packet_sock_spkt).
 *
 *   packet PIDFILE
 *
 * Needs CAP_NET_RAW. Set up before "ready":
 *   R  SOCK_RAW, protocol 0 (never bound: receives nothing), TPACKET_V2,
 *      PACKET_AUXDATA, an RX ring of 4 blocks of 4 KiB (8 frames of 2 KiB),
 *      promiscuous membership on lo;
 *   D  SOCK_DGRAM, ETH_P_IP, bound to lo, PACKET_RESERVE 64,
 *      PACKET_ORIGDEV, fanout group 77 (hash), a unicast membership on lo
 *      (address 02:00:00:00:00:07), a TX ring of 2 blocks of 4 KiB;
 *   S  SOCK_PACKET bound to "lo"; U  SOCK_PACKET, not bound;
 *   M  SOCK_DGRAM, ETH_P_IP, TPACKET_V2, bound to lo, an RX ring of 2
 *      blocks of 4 KiB (4 frames of 2 KiB) mapped shared (zdtm's
 *      packet_sock_mmap).
 * After SIGTERM (tags in brackets):
 *   [packet-bind]     D is bound to lo, protocol ETH_P_IP; S to "lo", U
 *                     to nothing;
 *   [packet-opts]     R: version 2, aux data on; D: reserve 64, origdev
 *                     on, fanout 77 | hash << 16;
 *   [packet-ring]     R's RX ring and D's TX ring map with their sizes
 *                     (mmap checks them), and a new ring is refused
 *                     (EBUSY) while they exist;
 *   (The memberships cannot be seen from here: dropping one that is not
 *   there succeeds. stasis-objects' packet tests check them through
 *   sock_diag.)
 *   [packet-traffic]  a UDP datagram sent on lo reaches D and S (5 s).
 *   [packet-mmap]     M's ring is still mapped at its address, from M's
 *                     socket (/proc/self/maps), and a UDP datagram sent
 *                     on lo shows up in one of its frames (5 s).
 */
#include "zdtm.h"

#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <poll.h>

static int lo;

static int get(int fd, int opt)
{
	int v = -1;
	socklen_t l = sizeof(v);

	if (getsockopt(fd, SOL_PACKET, opt, &v, &l))
		return -1;
	return v;
}

static void set(int fd, int opt, int v, const char *what)
{
	if (setsockopt(fd, SOL_PACKET, opt, &v, sizeof(v)))
		zdtm_die("setsockopt %s", what);
}

static struct packet_mreq mreq(int type)
{
	struct packet_mreq m;

	memset(&m, 0, sizeof(m));
	m.mr_ifindex = lo;
	m.mr_type = (unsigned short)type;
	if (type == PACKET_MR_UNICAST) {
		static const unsigned char a[6] = { 2, 0, 0, 0, 0, 7 };

		m.mr_alen = 6;
		memcpy(m.mr_address, a, 6);
	}
	return m;
}

/* Whether a ring of `size` bytes maps on fd. */
static int ring_maps(int fd, size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	if (p == MAP_FAILED)
		return 0;
	munmap(p, size);
	return 1;
}

/* Whether /proc/self/maps has an area at `at` backed by fd's inode. */
static int mapped_from(void *at, int fd)
{
	char line[512];
	struct stat st;
	int found = 0;
	FILE *f = fopen("/proc/self/maps", "r");

	if (!f || fstat(fd, &st))
		return 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long start;
		unsigned long long ino;

		if (sscanf(line, "%lx-%*x %*s %*s %*s %llu", &start, &ino) == 2 &&
		    start == (unsigned long)at && ino == (unsigned long long)st.st_ino)
			found = 1;
	}
	fclose(f);
	return found;
}

/* Whether a datagram sent on lo shows up in a frame of M's RX ring
 * (frames handed back to the kernel as they are read). */
static int ring_receives(int m, char *ring, int frames)
{
	struct sockaddr_in to = { .sin_family = AF_INET };
	int o = socket(AF_INET, SOCK_DGRAM, 0), seen = 0, i;
	int64_t end = zdtm_now_ns() + 5000000000LL;

	to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	to.sin_port = htons(9);
	while (!seen && zdtm_now_ns() < end) {
		struct pollfd p = { .fd = m, .events = POLLIN };

		sendto(o, "packet-mm", 9, 0, (struct sockaddr *)&to, sizeof(to));
		poll(&p, 1, 200);
		for (i = 0; i < frames; i++) {
			struct tpacket2_hdr *h = (void *)(ring + i * 2048);

			if (!(__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER))
				continue;
			if (h->tp_net < 2048 && h->tp_snaplen <= 2048u - h->tp_net &&
			    memmem((char *)h + h->tp_net, h->tp_snaplen, "packet-mm", 9))
				seen = 1;
			__atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
		}
	}
	close(o);
	return seen;
}

static void check_spkt(int fd, const char *dev, const char *what)
{
	struct sockaddr a;
	socklen_t l = sizeof(a);

	memset(&a, 0, sizeof(a));
	zdtm_check(getsockname(fd, &a, &l) == 0 && a.sa_family == AF_PACKET &&
			   !strncmp(a.sa_data, dev, sizeof(a.sa_data)),
		   "packet-bind", "%s: bound to \"%.14s\", expected \"%s\"", what, a.sa_data, dev);
}

int main(int argc, char **argv)
{
	struct tpacket_req rx = { 4096, 4, 2048, 8 }, tx = { 4096, 2, 2048, 4 };
	struct tpacket_req mrx = { 4096, 2, 2048, 4 };
	char *ring;
	int mm;
	struct sockaddr_ll ll;
	struct sockaddr sa;
	struct packet_mreq m;
	int r, d, s, u, fan = 77 | (PACKET_FANOUT_HASH << 16);
	socklen_t len;

	zdtm_init(argc, argv, 0, "");
	lo = (int)if_nametoindex("lo");
	r = socket(AF_PACKET, SOCK_RAW, 0);
	d = socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_IP));
	s = socket(AF_PACKET, SOCK_PACKET, htons(ETH_P_ALL));
	u = socket(AF_PACKET, SOCK_PACKET, htons(ETH_P_ALL));
	if (!lo || r < 0 || d < 0 || s < 0 || u < 0)
		zdtm_die("packet sockets (needs CAP_NET_RAW)");
	set(r, PACKET_VERSION, TPACKET_V2, "PACKET_VERSION");
	set(r, PACKET_AUXDATA, 1, "PACKET_AUXDATA");
	if (setsockopt(r, SOL_PACKET, PACKET_RX_RING, &rx, sizeof(rx)))
		zdtm_die("PACKET_RX_RING");
	m = mreq(PACKET_MR_PROMISC);
	if (setsockopt(r, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &m, sizeof(m)))
		zdtm_die("promiscuous membership");
	set(d, PACKET_RESERVE, 64, "PACKET_RESERVE");
	set(d, PACKET_ORIGDEV, 1, "PACKET_ORIGDEV");
	if (setsockopt(d, SOL_PACKET, PACKET_TX_RING, &tx, sizeof(tx)))
		zdtm_die("PACKET_TX_RING");
	memset(&ll, 0, sizeof(ll));
	ll.sll_family = AF_PACKET;
	ll.sll_protocol = htons(ETH_P_IP);
	ll.sll_ifindex = lo;
	if (bind(d, (struct sockaddr *)&ll, sizeof(ll)))
		zdtm_die("bind D");
	set(d, PACKET_FANOUT, fan, "PACKET_FANOUT");
	m = mreq(PACKET_MR_UNICAST);
	if (setsockopt(d, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &m, sizeof(m)))
		zdtm_die("unicast membership");
	memset(&sa, 0, sizeof(sa));
	sa.sa_family = AF_PACKET;
	strcpy(sa.sa_data, "lo");
	if (bind(s, &sa, sizeof(sa)))
		zdtm_die("bind S");
	mm = socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_IP));
	if (mm < 0)
		zdtm_die("socket M");
	set(mm, PACKET_VERSION, TPACKET_V2, "PACKET_VERSION M");
	if (setsockopt(mm, SOL_PACKET, PACKET_RX_RING, &mrx, sizeof(mrx)))
		zdtm_die("PACKET_RX_RING M");
	memset(&ll, 0, sizeof(ll));
	ll.sll_family = AF_PACKET;
	ll.sll_protocol = htons(ETH_P_IP);
	ll.sll_ifindex = lo;
	if (bind(mm, (struct sockaddr *)&ll, sizeof(ll)))
		zdtm_die("bind M");
	ring = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mm, 0);
	if (ring == MAP_FAILED)
		zdtm_die("mmap M's ring");

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("packet-opts", set(r, PACKET_AUXDATA, 0, "x"));
	ZDTM_CORRUPT("packet-mmap", {
		munmap(ring, 2 * 4096);
		mmap(ring, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
		     -1, 0);
	});
	ZDTM_CORRUPT("packet-ring", {
		struct tpacket_req none = { 0, 0, 0, 0 };

		setsockopt(r, SOL_PACKET, PACKET_RX_RING, &none, sizeof(none));
	});

	memset(&ll, 0, sizeof(ll));
	len = sizeof(ll);
	zdtm_check(getsockname(d, (struct sockaddr *)&ll, &len) == 0 &&
			   ll.sll_protocol == htons(ETH_P_IP) && ll.sll_ifindex == lo,
		   "packet-bind", "D: protocol %#x ifindex %d, expected %#x %d",
		   ntohs(ll.sll_protocol), ll.sll_ifindex, ETH_P_IP, lo);
	check_spkt(s, "lo", "S");
	check_spkt(u, "", "U");

	zdtm_check(get(r, PACKET_VERSION) == TPACKET_V2 && get(r, PACKET_AUXDATA) == 1,
		   "packet-opts", "R: version %d aux data %d", get(r, PACKET_VERSION),
		   get(r, PACKET_AUXDATA));
	zdtm_check(get(d, PACKET_RESERVE) == 64 && get(d, PACKET_ORIGDEV) == 1 &&
			   get(d, PACKET_FANOUT) == fan,
		   "packet-opts", "D: reserve %d origdev %d fanout %#x (expected %#x)",
		   get(d, PACKET_RESERVE), get(d, PACKET_ORIGDEV), get(d, PACKET_FANOUT), fan);

	zdtm_check(ring_maps(r, 4 * 4096), "packet-ring", "R's RX ring does not map (%s)",
		   strerror(errno));
	zdtm_check(ring_maps(d, 2 * 4096), "packet-ring", "D's TX ring does not map (%s)",
		   strerror(errno));
	zdtm_check(setsockopt(r, SOL_PACKET, PACKET_RX_RING, &rx, sizeof(rx)) < 0 && errno == EBUSY,
		   "packet-ring", "R: a new RX ring was not refused (%s)", strerror(errno));


	{
		struct sockaddr_in to = { .sin_family = AF_INET };
		int o = socket(AF_INET, SOCK_DGRAM, 0), seen = 0, seen_s = 0;
		int64_t end = zdtm_now_ns() + 5000000000LL;
		char buf[2048];

		to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		to.sin_port = htons(9); /* discard: nobody listens, D sees it */
		while ((!seen || !seen_s) && zdtm_now_ns() < end) {
			struct pollfd p[2] = { { .fd = d, .events = POLLIN },
					       { .fd = s, .events = POLLIN } };
			ssize_t n;

			sendto(o, "packet-wl", 9, 0, (struct sockaddr *)&to, sizeof(to));
			if (poll(p, 2, 200) < 1)
				continue;
			while ((n = recv(d, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
				if (memmem(buf, (size_t)n, "packet-wl", 9))
					seen = 1;
			while ((n = recv(s, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
				if (memmem(buf, (size_t)n, "packet-wl", 9))
					seen_s = 1;
		}
		close(o);
		zdtm_check(seen, "packet-traffic", "D received nothing of a datagram sent on lo");
		zdtm_check(mapped_from(ring, mm), "packet-mmap",
			   "M's ring is not mapped from M's socket at %p any more", (void *)ring);
		zdtm_check(ring_receives(mm, ring, 4), "packet-mmap",
			   "no frame of M's mapped ring got a datagram sent on lo");
		zdtm_check(seen_s, "packet-traffic", "S received nothing of a datagram sent on lo");
	}
	zdtm_finish();
}
