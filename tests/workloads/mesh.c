/*
 * mesh.c - one node of a full mesh of TCP connections that stream
 * self-checking messages to each other as fast as they can (the workload
 * of distributed checkpoints: one node per host / network namespace).
 *
 *   mesh PIDFILE --id I --nodes N --listen IP:PORT --peer J=IP:PORT ...
 *        [--stats FILE] [--sockbuf BYTES]
 *
 * Node ids are 0..N-1 (N <= 16); every other node is given once with
 * --peer.  Node I listens on --listen, connects to every peer J > I and
 * accepts a connection from every peer J < I (retrying refused or
 * unreachable connects every 50 ms: the nodes start in any order).  The
 * first record each way is a HELLO carrying the sender's and the receiver's
 * id; an accepted connection is identified by it.  The pidfile is written
 * only once every one of the N-1 links has sent and received its HELLO (a
 * setup error after 30 s otherwise).  --sockbuf sets SO_SNDBUF/SO_RCVBUF
 * (the FORCE variants when allowed) of every connection, default 4 MiB
 * (the kernel doubles it); 0 leaves the kernel's autotuning.
 *
 * Records (native byte order, 32-byte header):
 *   magic "MESH", type (HELLO, DATA, END), sender, receiver, length, seq,
 *   check = a hash of the other fields.
 *   DATA seq S from A to B has a payload of len(A, B, S) bytes, 16 B to
 *   64 KiB, each a function of (A, B, S) (zdtm pattern, seed from A, B, S).
 *   END carries in seq the number of DATA records sent on that link.
 * Every node writes DATA to every peer until EAGAIN (no throttle: the
 * socket queues stay full) and reads everything it is sent, all in one
 * epoll loop over non-blocking sockets.
 *
 * Checked while running (tags):
 *   [header]  magic, check, type, sender = the link's peer, receiver = us,
 *             length = len(sender, us, seq);
 *   [seq]     DATA seqs on each link are exactly 0, 1, 2, ... (each once, in
 *             order); END's count = the next expected seq;
 *   [count]   END's count = the number of DATA records received;
 *   [payload] every byte of every payload;
 *   [end]     nothing after END;  [conn] no EOF before END, no socket error.
 * When SIGTERM arrives (before any peer can have closed), every link still
 * has the local and peer address it came up with ([addr]), its SO_SNDBUF
 * and SO_RCVBUF (with --sockbuf, [sockbuf]), O_RDWR|O_NONBLOCK and
 * FD_CLOEXEC ([flags]).
 * On SIGTERM it builds no new DATA: it finishes the record being sent,
 * sends END on every link, then reads until END has arrived from every
 * peer and its own ENDs are written (60 s deadline: [end]).  Then:
 *   [rx-bytes]  bytes received = sum of len(peer, us, s) for s < count;
 *   [checksum]  the running checksum of every received byte (kept per
 *               link) = the one recomputed from the patterns;
 *   [last-msg]  the last received payload, still in its buffer, is intact;
 *   [tx-bytes]  bytes sent = sum of len(us, peer, s) for s < sent;
 *   [listen]    no connection arrived after the mesh was complete;
 *   [stats]     every --stats write succeeded.
 * Before the final line it prints one summary line:
 *   summary: node I; peer J: tx M msgs B B, rx M msgs B B; peer K: ...
 * (payload bytes; unlike other workloads' output it depends on the run).
 *
 * --stats FILE: every 100 ms (and at ready and at the end), one JSON
 * record rewritten in place (fixed length, padded with spaces) in FILE,
 * which stays open for the whole run (so that a checkpoint never holds a
 * temporary file that is renamed away before a restore):
 *   {"seq":N,"id":I,"pid":P,"phase":"setup|running|stopping|done","links":
 *    [{"peer":J,"tx_msgs":..,"tx_bytes":..,"rx_msgs":..,"rx_bytes":..},..],
 *    "end":N}
 * A reader that finds "seq" and "end" different read a record being
 * rewritten and reads again.
 */
#include "zdtm.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#define MAX_NODES 16
#define MIN_PAYLOAD 16
#define MAX_PAYLOAD 65536
#define HDR_LEN 32
#define MAGIC 0x4853454du /* "MESH" read little endian */
#define T_HELLO 1
#define T_DATA 2
#define T_END 3
#define SEED_BASE 0x6d6573682d763100ull
#define SETUP_MS 30000
#define END_MS 60000
#define RETRY_MS 50
#define STATS_MS 100
#define IO_CAP (1 << 20)
#define RXBUF (256 * 1024)

enum { K_LISTEN = 1, K_PENDING, K_LINK };

struct hdr {
	uint32_t magic;
	uint16_t type, sender, receiver, pad;
	uint32_t len;
	uint64_t seq;
	uint64_t check;
};
_Static_assert(sizeof(struct hdr) == HDR_LEN, "header size");

struct link {
	int used, peer, fd, outgoing, connecting, dead;
	struct sockaddr_in addr, name, peername; /* the last two once up */
	int sndbuf, rcvbuf;
	int64_t retry_at;
	uint32_t events;
	/* send side: txbuf[tx_off..tx_len) is still to be written */
	uint8_t *txbuf;
	size_t tx_len, tx_off;
	int tx_is_data, hello_sent, end_queued, end_sent;
	uint64_t tx_next, tx_msgs, tx_bytes;
	/* receive side */
	uint8_t hbuf[HDR_LEN];
	size_t hoff, moff;
	struct hdr cur;
	int in_payload, hello_rx, end_rx, broken, eof, flip_pending;
	uint8_t *msg;
	uint64_t rx_next, rx_msgs, rx_bytes, rx_sum, end_count, last_seq;
	size_t last_len;
};

struct pending {
	int fd;
	uint8_t buf[HDR_LEN];
	size_t off;
};

static int me = -1, nodes, ep, lfd, ready, stopping, stats_failed;
static unsigned long late_conns;
static struct sockaddr_in laddr;
static struct link links[MAX_NODES];
static struct pending pend[MAX_NODES];
static const char *stats_path;
static long sockbuf = 4 << 20;
static uint8_t rxbuf[RXBUF], scratch[MAX_PAYLOAD];

/* ------------------------------------------------------------------ */
/* records                                                             */

static uint64_t msg_seed(int from, int to, uint64_t seq)
{
	return zdtm_mix64(SEED_BASE ^ ((uint64_t)from << 56) ^
			  ((uint64_t)to << 48) ^ seq);
}

static size_t payload_len(int from, int to, uint64_t seq)
{
	uint64_t r = zdtm_mix64(msg_seed(from, to, seq) ^ 0x6c656eull);

	return MIN_PAYLOAD + r % (MAX_PAYLOAD - MIN_PAYLOAD + 1);
}

static uint64_t hdr_check(const struct hdr *h)
{
	return zdtm_mix64(((uint64_t)h->magic << 32 | h->type) ^
			  zdtm_mix64(((uint64_t)h->sender << 48) ^
				     ((uint64_t)h->receiver << 32) ^ h->len) ^
			  zdtm_mix64(h->seq));
}

static void put_hdr(uint8_t *p, int type, int from, int to, uint64_t seq,
		    uint32_t len)
{
	struct hdr h = { MAGIC, type, from, to, 0, len, seq, 0 };

	h.check = hdr_check(&h);
	memcpy(p, &h, sizeof(h));
}

/* Order-sensitive digest of a buffer (words rotated by their index). */
static uint64_t digest(const uint8_t *p, size_t len)
{
	uint64_t d = len, w;
	size_t i;

	for (i = 0; i + 8 <= len; i += 8) {
		memcpy(&w, p + i, 8);
		d ^= (w << ((i >> 3) & 63)) | (w >> ((64 - ((i >> 3) & 63)) & 63));
	}
	for (; i < len; i++)
		d = d * 31 + p[i];
	return d;
}

static uint64_t fold(uint64_t sum, uint64_t seq, size_t len, uint64_t d)
{
	return zdtm_mix64(sum ^ d ^ (seq << 20) ^ len);
}

/* ------------------------------------------------------------------ */
/* sockets                                                             */

static void set_bufs(int fd)
{
	int v = (int)sockbuf;

	if (!sockbuf)
		return;
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &v, sizeof(v)) &&
	    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v)))
		zdtm_die("SO_SNDBUF %d", v);
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &v, sizeof(v)) &&
	    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v)))
		zdtm_die("SO_RCVBUF %d", v);
}

static void ep_set(int op, int fd, uint32_t events, int kind, int idx)
{
	struct epoll_event ev = { .events = events };

	ev.data.u64 = (uint64_t)kind << 32 | (uint32_t)idx;
	if (epoll_ctl(ep, op, fd, &ev))
		zdtm_die("epoll_ctl(%d, fd %d)", op, fd);
}

static void link_events(struct link *l, uint32_t events)
{
	if (l->events == events)
		return;
	if (!events)
		epoll_ctl(ep, EPOLL_CTL_DEL, l->fd, NULL);
	else
		ep_set(l->events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, l->fd,
		       events, K_LINK, l->peer);
	l->events = events;
}

static void link_dead(struct link *l, const char *what, int err)
{
	if (!ready)
		zdtm_die("link to node %d: %s", l->peer, what);
	zdtm_fail("conn", "link to node %d: %s (%s)", l->peer, what,
		  err ? strerror(err) : "end of stream");
	link_events(l, 0);
	l->dead = 1;
}

static int get_int(int fd, int opt)
{
	int v = -1;
	socklen_t len = sizeof(v);

	if (getsockopt(fd, SOL_SOCKET, opt, &v, &len))
		return -1;
	return v;
}

static int get_names(int fd, struct sockaddr_in *name,
		     struct sockaddr_in *peer)
{
	socklen_t a = sizeof(*name), b = sizeof(*peer);

	memset(name, 0, sizeof(*name));
	memset(peer, 0, sizeof(*peer));
	return getsockname(fd, (struct sockaddr *)name, &a) ||
	       getpeername(fd, (struct sockaddr *)peer, &b) ? -1 : 0;
}

/* The socket is connected: note its addresses and buffer sizes, queue our
 * HELLO, watch both ways. */
static void link_up(struct link *l)
{
	if (get_names(l->fd, &l->name, &l->peername))
		zdtm_die("getsockname/getpeername of the link to node %d",
			 l->peer);
	l->sndbuf = get_int(l->fd, SO_SNDBUF);
	l->rcvbuf = get_int(l->fd, SO_RCVBUF);
	l->connecting = 0;
	put_hdr(l->txbuf, T_HELLO, me, l->peer, 0, 0);
	l->tx_len = HDR_LEN;
	l->tx_off = 0;
	link_events(l, EPOLLIN | EPOLLOUT);
}

static void start_connect(struct link *l, int64_t now)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0)
		zdtm_die("socket");
	set_bufs(fd);
	l->fd = fd;
	l->events = 0;
	if (connect(fd, (struct sockaddr *)&l->addr, sizeof(l->addr)) == 0) {
		link_up(l);
		return;
	}
	if (errno == EINPROGRESS) {
		l->connecting = 1;
		link_events(l, EPOLLOUT);
		return;
	}
	close(fd);
	l->fd = -1;
	l->retry_at = now + RETRY_MS * 1000000ll;
}

static void connect_done(struct link *l, int64_t now)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && !err) {
		link_up(l);
		return;
	}
	if (err == EINPROGRESS || err == EALREADY)
		return;
	close(l->fd); /* also leaves the epoll set */
	l->fd = -1;
	l->events = 0;
	l->connecting = 0;
	l->retry_at = now + RETRY_MS * 1000000ll;
}

static void accept_all(void)
{
	int fd, i;

	while ((fd = accept4(lfd, NULL, NULL,
			     SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
		for (i = 0; i < MAX_NODES && pend[i].fd >= 0; i++)
			;
		if (ready || i == MAX_NODES) {
			late_conns++;
			close(fd);
			continue;
		}
		pend[i].fd = fd;
		pend[i].off = 0;
		ep_set(EPOLL_CTL_ADD, fd, EPOLLIN, K_PENDING, i);
	}
	if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
		zdtm_die("accept");
}

/* An accepted connection: its HELLO says which lower node it is. */
static void pending_read(struct pending *p)
{
	struct hdr h;
	struct link *l;
	ssize_t n = recv(p->fd, p->buf + p->off, HDR_LEN - p->off,
			 MSG_DONTWAIT);

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0)
		zdtm_die("accepted connection closed before its HELLO");
	p->off += n;
	if (p->off < HDR_LEN)
		return;
	memcpy(&h, p->buf, sizeof(h));
	if (h.magic != MAGIC || h.check != hdr_check(&h) ||
	    h.type != T_HELLO || h.receiver != me || h.sender >= me ||
	    !links[h.sender].used || links[h.sender].fd >= 0)
		zdtm_die("bad HELLO on an accepted connection (type %u, "
			 "from %u to %u)", h.type, h.sender, h.receiver);
	l = &links[h.sender];
	epoll_ctl(ep, EPOLL_CTL_DEL, p->fd, NULL);
	l->fd = p->fd;
	l->hello_rx = 1; /* buffer sizes are inherited from lfd */
	p->fd = -1;
	link_up(l);
}

/* ------------------------------------------------------------------ */
/* sending                                                             */

/* The record in txbuf is written: account for it, build the next one. */
static void next_record(struct link *l)
{
	if (!l->hello_sent) {
		l->hello_sent = 1;
	} else if (l->tx_is_data) {
		l->tx_msgs++;
		l->tx_bytes += l->tx_len - HDR_LEN;
	} else if (l->end_queued) {
		l->end_sent = 1;
		return;
	}
	l->tx_is_data = 0;
	l->tx_off = 0;
	if (stopping) {
		put_hdr(l->txbuf, T_END, me, l->peer, l->tx_next, 0);
		l->tx_len = HDR_LEN;
		l->end_queued = 1;
		return;
	}
	{
		size_t len = payload_len(me, l->peer, l->tx_next);

		put_hdr(l->txbuf, T_DATA, me, l->peer, l->tx_next, len);
		zdtm_fill(l->txbuf + HDR_LEN, len,
			  msg_seed(me, l->peer, l->tx_next));
		l->tx_len = HDR_LEN + len;
		l->tx_is_data = 1;
		l->tx_next++;
	}
}

static void do_send(struct link *l)
{
	size_t done = 0;
	ssize_t n;

	while (!l->dead && done < IO_CAP) {
		if (l->tx_off == l->tx_len) {
			next_record(l);
			if (l->end_sent) {
				link_events(l, l->eof ? 0 : EPOLLIN);
				return;
			}
		}
		n = send(l->fd, l->txbuf + l->tx_off, l->tx_len - l->tx_off,
			 MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n > 0) {
			l->tx_off += n;
			done += n;
		} else if (n < 0 && errno == EINTR) {
			continue;
		} else if (n < 0 && errno == EAGAIN) {
			return;
		} else {
			link_dead(l, "send", errno);
		}
	}
}

/* ------------------------------------------------------------------ */
/* receiving                                                           */

static void on_header(struct link *l)
{
	struct hdr *h = &l->cur;

	memcpy(h, l->hbuf, sizeof(*h));
	l->hoff = 0;
	if (h->magic != MAGIC || h->check != hdr_check(h)) {
		zdtm_fail("header", "link from node %d: bad header after seq "
			  "%lu (magic %#x)", l->peer,
			  (unsigned long)l->rx_next, h->magic);
		l->broken = 1;
		return;
	}
	if (!l->hello_rx) {
		if (h->type != T_HELLO || h->sender != l->peer ||
		    h->receiver != me)
			zdtm_die("bad HELLO from node %d (type %u, from %u to "
				 "%u)", l->peer, h->type, h->sender,
				 h->receiver);
		l->hello_rx = 1;
		return;
	}
	if (l->end_rx) {
		zdtm_fail("end", "link from node %d: record type %u after END",
			  l->peer, h->type);
		l->broken = 1;
		return;
	}
	if (h->type == T_END) {
		l->end_rx = 1;
		l->end_count = h->seq;
		zdtm_check(h->seq == l->rx_next, "seq", "link from node %d: "
			   "END says %lu messages, next expected seq %lu",
			   l->peer, (unsigned long)h->seq,
			   (unsigned long)l->rx_next);
		zdtm_check(h->seq == l->rx_msgs, "count", "link from node %d: "
			   "END says %lu messages, %lu received", l->peer,
			   (unsigned long)h->seq, (unsigned long)l->rx_msgs);
		return;
	}
	if (h->type != T_DATA || h->sender != l->peer || h->receiver != me ||
	    h->len != payload_len(l->peer, me, h->seq)) {
		zdtm_fail("header", "link from node %d: type %u from %u to %u "
			  "seq %lu len %u (expected DATA, len %zu)", l->peer,
			  h->type, h->sender, h->receiver,
			  (unsigned long)h->seq, h->len,
			  payload_len(l->peer, me, h->seq));
		l->broken = 1;
		return;
	}
	if (!zdtm_check(h->seq == l->rx_next, "seq", "link from node %d: "
			"seq %lu, expected %lu", l->peer,
			(unsigned long)h->seq, (unsigned long)l->rx_next))
		l->rx_next = h->seq;
	l->in_payload = 1;
	l->moff = 0;
}

static void on_payload(struct link *l)
{
	uint64_t seq = l->cur.seq;
	size_t len = l->cur.len;

	zdtm_fill(scratch, len, msg_seed(l->peer, me, seq));
	if (memcmp(l->msg, scratch, len)) {
		char what[64];

		snprintf(what, sizeof(what), "link from node %d, seq %lu",
			 l->peer, (unsigned long)seq);
		zdtm_verify_mem("payload", what, l->msg, scratch, len);
	}
	l->rx_sum = fold(l->rx_sum, seq, len, digest(l->msg, len));
	l->rx_msgs++;
	l->rx_bytes += len;
	l->rx_next++; /* (= seq + 1, see on_header) */
	l->last_seq = seq;
	l->last_len = len;
	l->in_payload = 0;
}

static void parse(struct link *l, const uint8_t *p, size_t n)
{
	size_t take;

	while (n && !l->broken) {
		if (!l->in_payload) {
			take = HDR_LEN - l->hoff < n ? HDR_LEN - l->hoff : n;
			memcpy(l->hbuf + l->hoff, p, take);
			l->hoff += take;
			p += take;
			n -= take;
			if (l->hoff == HDR_LEN)
				on_header(l);
			continue;
		}
		take = l->cur.len - l->moff < n ? l->cur.len - l->moff : n;
		memcpy(l->msg + l->moff, p, take);
		if (l->flip_pending) {
			l->flip_pending = 0;
			ZDTM_CORRUPT("payload", l->msg[l->moff] ^= 0x5a);
		}
		l->moff += take;
		p += take;
		n -= take;
		if (l->moff == l->cur.len)
			on_payload(l);
	}
}

static void do_recv(struct link *l)
{
	size_t done = 0;
	ssize_t n;

	while (!l->dead && !l->eof && done < IO_CAP) {
		n = recv(l->fd, rxbuf, sizeof(rxbuf), MSG_DONTWAIT);
		if (n > 0) {
			parse(l, rxbuf, n);
			done += n;
		} else if (n == 0) {
			l->eof = 1;
			if (!l->end_rx)
				link_dead(l, "EOF before END", 0);
			else
				link_events(l, l->end_sent ? 0 : EPOLLOUT);
		} else if (errno == EINTR) {
			continue;
		} else if (errno == EAGAIN) {
			return;
		} else {
			link_dead(l, "recv", errno);
		}
	}
}

/* ------------------------------------------------------------------ */
/* stats                                                               */

static void write_stats(const char *phase)
{
	/* One record of fixed length rewritten in place (pwrite at 0) in a
	 * file kept open for the whole run: a checkpoint never finds a
	 * temporary file open (one renamed away before a restore could not
	 * be reopened). "seq" and "end" carry the same number: a reader that
	 * sees them differ read a record being rewritten, and reads again. */
	static char buf[MAX_NODES * 160 + 256];
	static int fd = -1;
	static unsigned long seq;
	size_t n;
	int i, first = 1;

	if (!stats_path)
		return;
	seq++;
	n = snprintf(buf, sizeof(buf), "{\"seq\":%lu,\"id\":%d,\"pid\":%d,"
		     "\"phase\":\"%s\",\"links\":[", seq, me, (int)getpid(),
		     phase);
	for (i = 0; i < MAX_NODES; i++) {
		struct link *l = &links[i];

		if (!l->used)
			continue;
		n += snprintf(buf + n, sizeof(buf) - n, "%s{\"peer\":%d,"
			      "\"tx_msgs\":%lu,\"tx_bytes\":%lu,\"rx_msgs\":"
			      "%lu,\"rx_bytes\":%lu}", first ? "" : ",", i,
			      (unsigned long)l->tx_msgs,
			      (unsigned long)l->tx_bytes,
			      (unsigned long)l->rx_msgs,
			      (unsigned long)l->rx_bytes);
		first = 0;
	}
	n += snprintf(buf + n, sizeof(buf) - n, "],\"end\":%lu}", seq);
	/* Pad to the fixed length with spaces, ending in a newline. */
	memset(buf + n, ' ', sizeof(buf) - 1 - n);
	buf[sizeof(buf) - 1] = '\n';
	if (fd < 0)
		fd = open(stats_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0 || pwrite(fd, buf, sizeof(buf), 0) != (ssize_t)sizeof(buf)) {
		if (stats_failed++ == 0)
			zdtm_fail("stats", "writing %s: %s", stats_path,
				  strerror(errno));
	}
}

/* ------------------------------------------------------------------ */
/* setup                                                               */

static void parse_addr(const char *s, struct sockaddr_in *a)
{
	char ip[64];
	const char *colon = strrchr(s, ':');

	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	if (!colon || colon - s >= (long)sizeof(ip))
		zdtm_die("bad address %s (want IP:PORT)", s);
	memcpy(ip, s, colon - s);
	ip[colon - s] = 0;
	if (inet_pton(AF_INET, ip, &a->sin_addr) != 1 || !atoi(colon + 1) ||
	    atoi(colon + 1) > 65535)
		zdtm_die("bad address %s (want IP:PORT)", s);
	a->sin_port = htons(atoi(colon + 1));
}

static void parse_args(int argc, char **argv)
{
	int i, npeers = 0, have_listen = 0;

	for (i = 2; i + 1 < argc; i += 2) {
		const char *o = argv[i], *v = argv[i + 1];

		if (!strcmp(o, "--id")) {
			me = atoi(v);
		} else if (!strcmp(o, "--nodes")) {
			nodes = atoi(v);
		} else if (!strcmp(o, "--listen")) {
			parse_addr(v, &laddr);
			have_listen = 1;
		} else if (!strcmp(o, "--stats")) {
			stats_path = v;
		} else if (!strcmp(o, "--sockbuf")) {
			sockbuf = atol(v);
		} else if (!strcmp(o, "--peer")) {
			int j = atoi(v);
			const char *eq = strchr(v, '=');

			if (!eq || j < 0 || j >= MAX_NODES || links[j].used)
				zdtm_die("bad or repeated --peer %s", v);
			links[j].used = 1;
			parse_addr(eq + 1, &links[j].addr);
			npeers++;
		} else {
			zdtm_die("unknown option %s", o);
		}
	}
	if (i != argc || me < 0 || nodes < 2 || nodes > MAX_NODES ||
	    me >= nodes || !have_listen || npeers != nodes - 1 ||
	    links[me].used || sockbuf < 0 || sockbuf > (1l << 30))
		zdtm_die("usage: mesh PIDFILE --id I --nodes N --listen IP:PORT"
			 " --peer J=IP:PORT (each other node J < N once) "
			 "[--stats FILE] [--sockbuf BYTES]");
	for (i = 0; i < MAX_NODES; i++)
		if (links[i].used && i >= nodes)
			zdtm_die("peer %d but only %d nodes", i, nodes);
}

static void setup(void)
{
	int i, one = 1;

	ep = epoll_create1(EPOLL_CLOEXEC);
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (ep < 0 || lfd < 0)
		zdtm_die("epoll_create1 / socket");
	if (setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)))
		zdtm_die("SO_REUSEADDR");
	set_bufs(lfd);
	if (bind(lfd, (struct sockaddr *)&laddr, sizeof(laddr)) ||
	    listen(lfd, MAX_NODES))
		zdtm_die("bind/listen");
	ep_set(EPOLL_CTL_ADD, lfd, EPOLLIN, K_LISTEN, 0);
	for (i = 0; i < MAX_NODES; i++) {
		pend[i].fd = -1;
		links[i].fd = -1;
		links[i].peer = i;
		if (!links[i].used)
			continue;
		links[i].outgoing = i > me;
		links[i].txbuf = malloc(HDR_LEN + MAX_PAYLOAD);
		links[i].msg = malloc(MAX_PAYLOAD);
		if (!links[i].txbuf || !links[i].msg)
			zdtm_die("malloc");
	}
}

/* ------------------------------------------------------------------ */
/* main loop                                                           */

static int all_up(void)
{
	int i;

	for (i = 0; i < MAX_NODES; i++)
		if (links[i].used && (!links[i].hello_rx || !links[i].hello_sent))
			return 0;
	return 1;
}

static int all_done(void)
{
	int i;

	for (i = 0; i < MAX_NODES; i++)
		if (links[i].used && !links[i].dead &&
		    ((!links[i].end_rx && !links[i].broken) ||
		     !links[i].end_sent))
			return 0;
	return 1;
}

/* Each connection still has the addresses and buffer sizes it had when
 * it came up, and its flags.  Checked when SIGTERM arrives: no peer can
 * have closed its end yet (it waits for our END). */
static void check_sockets(void)
{
	struct sockaddr_in name, peer;
	char a[INET_ADDRSTRLEN], b[INET_ADDRSTRLEN];
	int i, fl, snd, rcv;

	for (i = 0; i < MAX_NODES; i++) {
		struct link *l = &links[i];

		if (!l->used || l->dead)
			continue;
		if (!zdtm_check(get_names(l->fd, &name, &peer) == 0, "addr",
				"link to node %d: getsockname/getpeername: %s",
				i, strerror(errno)))
			continue;
		inet_ntop(AF_INET, &name.sin_addr, a, sizeof(a));
		inet_ntop(AF_INET, &peer.sin_addr, b, sizeof(b));
		zdtm_check(!memcmp(&name, &l->name, sizeof(name)) &&
			   !memcmp(&peer, &l->peername, sizeof(peer)), "addr",
			   "link to node %d: now %s:%u -> %s:%u, was port %u -> "
			   "%u", i, a, ntohs(name.sin_port), b,
			   ntohs(peer.sin_port), ntohs(l->name.sin_port),
			   ntohs(l->peername.sin_port));
		snd = get_int(l->fd, SO_SNDBUF);
		rcv = get_int(l->fd, SO_RCVBUF);
		/* (without --sockbuf the kernel's autotuning changes them) */
		zdtm_check(!sockbuf || (snd == l->sndbuf && rcv == l->rcvbuf),
			   "sockbuf",
			   "link to node %d: SO_SNDBUF %d SO_RCVBUF %d, were "
			   "%d %d", i, snd, rcv, l->sndbuf, l->rcvbuf);
		fl = fcntl(l->fd, F_GETFL);
		zdtm_check(fl >= 0 && (fl & O_NONBLOCK) && (fl & O_ACCMODE) ==
			   O_RDWR && (fcntl(l->fd, F_GETFD) & FD_CLOEXEC),
			   "flags", "link to node %d: F_GETFL %#x, F_GETFD %#x",
			   i, fl, fcntl(l->fd, F_GETFD));
	}
}

/* Selftest: break local state the final checks (and END) must catch. */
static void begin_stop(void)
{
	int i, v = 1 << 16;

	stopping = 1;
	for (i = 0; i < MAX_NODES && !links[i].used; i++)
		;
	ZDTM_CORRUPT("seq", links[i].rx_next++);
	if (ZDTM_SELFTEST)
		links[i].flip_pending = 1; /* noted only if it happens */
	ZDTM_CORRUPT("addr", links[i].peername.sin_port ^= htons(1));
	ZDTM_CORRUPT("sockbuf", setsockopt(links[i].fd, SOL_SOCKET,
					   SO_SNDBUF, &v, sizeof(v)));
	ZDTM_CORRUPT("flags", fcntl(links[i].fd, F_SETFD, 0));
	check_sockets();
}

static void dispatch(struct epoll_event *e, int64_t now)
{
	int kind = e->data.u64 >> 32, idx = (uint32_t)e->data.u64;
	struct link *l = &links[idx];

	if (kind == K_LISTEN) {
		accept_all();
	} else if (kind == K_PENDING) {
		pending_read(&pend[idx]);
	} else if (l->connecting) {
		connect_done(l, now);
	} else {
		if (e->events & (EPOLLIN | EPOLLERR | EPOLLHUP))
			do_recv(l);
		if (e->events & EPOLLOUT)
			do_send(l);
	}
}

static void run(void)
{
	struct epoll_event evs[2 * MAX_NODES];
	int64_t now = zdtm_now_ns(), setup_end = now + SETUP_MS * 1000000ll;
	int64_t stop_end = 0, next_stats = now;
	int i, n;

	for (;;) {
		now = zdtm_now_ns();
		if (!ready) {
			if (all_up()) {
				ready = 1;
				zdtm_ready();
				write_stats("running");
			} else if (zdtm_stop) {
				zdtm_die("SIGTERM before every link was up");
			} else if (now > setup_end) {
				zdtm_die("links not up after %d ms", SETUP_MS);
			}
			for (i = 0; i < MAX_NODES; i++)
				if (links[i].used && links[i].outgoing &&
				    links[i].fd < 0 && now >= links[i].retry_at)
					start_connect(&links[i], now);
		}
		if (ready && zdtm_stop && !stopping) {
			begin_stop();
			stop_end = now + END_MS * 1000000ll;
		}
		if (stopping && (all_done() || now > stop_end))
			break;
		if (now >= next_stats) {
			write_stats(!ready ? "setup" :
				    stopping ? "stopping" : "running");
			next_stats = now + STATS_MS * 1000000ll;
		}
		n = epoll_wait(ep, evs, 2 * MAX_NODES, ready ? STATS_MS :
			       RETRY_MS);
		if (n < 0 && errno != EINTR)
			zdtm_die("epoll_wait");
		for (i = 0; i < n; i++)
			dispatch(&evs[i], now);
	}
}

/* ------------------------------------------------------------------ */
/* final checks                                                        */

static void check_link(struct link *l)
{
	uint64_t s, sum = 0, bytes = 0;
	size_t len;

	zdtm_check(l->end_rx, "end", "no END from node %d (%lu messages "
		   "received, %s)", l->peer, (unsigned long)l->rx_msgs,
		   l->dead ? "link lost" : l->broken ? "stream out of sync" :
		   "timed out");
	zdtm_check(l->end_sent, "end", "END to node %d not written (%s)",
		   l->peer, l->dead ? "link lost" : "timed out");
	/* (Checked when END arrives too; again here, as END may arrive
	 * before this node even saw SIGTERM.) */
	zdtm_check(!l->end_rx || l->rx_next == l->end_count, "seq",
		   "link from node %d: next expected seq %lu, END said %lu",
		   l->peer, (unsigned long)l->rx_next,
		   (unsigned long)l->end_count);
	for (s = 0; s < l->rx_msgs; s++) {
		len = payload_len(l->peer, me, s);
		zdtm_fill(scratch, len, msg_seed(l->peer, me, s));
		sum = fold(sum, s, len, digest(scratch, len));
		bytes += len;
	}
	zdtm_check(bytes == l->rx_bytes, "rx-bytes", "from node %d: %lu "
		   "bytes counted, %lu expected for %lu messages", l->peer,
		   (unsigned long)l->rx_bytes, (unsigned long)bytes,
		   (unsigned long)l->rx_msgs);
	zdtm_check(sum == l->rx_sum, "checksum", "from node %d: running "
		   "checksum %#lx, recomputed %#lx over %lu messages", l->peer,
		   (unsigned long)l->rx_sum, (unsigned long)sum,
		   (unsigned long)l->rx_msgs);
	if (l->rx_msgs && !l->in_payload) {
		zdtm_fill(scratch, l->last_len, msg_seed(l->peer, me,
							 l->last_seq));
		zdtm_verify_mem("last-msg", "last payload received",
				l->msg, scratch, l->last_len);
	}
	for (bytes = 0, s = 0; s < l->tx_msgs; s++)
		bytes += payload_len(me, l->peer, s);
	zdtm_check(bytes == l->tx_bytes && l->tx_msgs == l->tx_next,
		   "tx-bytes", "to node %d: %lu of %lu messages written, %lu "
		   "bytes counted, %lu expected", l->peer,
		   (unsigned long)l->tx_msgs, (unsigned long)l->tx_next,
		   (unsigned long)l->tx_bytes, (unsigned long)bytes);
}

static void check_all(void)
{
	int i;

	for (i = 0; i < MAX_NODES && !links[i].used; i++)
		;
	ZDTM_CORRUPT("checksum", links[i].rx_sum ^= 1);
	ZDTM_CORRUPT("tx-bytes", links[i].tx_bytes += 1);
	if (links[i].rx_msgs && !links[i].in_payload)
		ZDTM_CORRUPT("last-msg", links[i].msg[links[i].last_len / 2] ^= 1);
	accept_all();
	zdtm_check(late_conns == 0, "listen", "%lu connections arrived after "
		   "the mesh was complete", late_conns);
	for (i = 0; i < MAX_NODES; i++)
		if (links[i].used)
			check_link(&links[i]);
	printf("summary: node %d", me);
	for (i = 0; i < MAX_NODES; i++) {
		struct link *l = &links[i];

		if (l->used)
			printf("; peer %d: tx %lu msgs %lu B, rx %lu msgs %lu B",
			       i, (unsigned long)l->tx_msgs,
			       (unsigned long)l->tx_bytes,
			       (unsigned long)l->rx_msgs,
			       (unsigned long)l->rx_bytes);
	}
	printf("\n");
}

int main(int argc, char **argv)
{
	zdtm_init(argc, argv, 2 * (MAX_NODES + 6),
		  "--id I --nodes N --listen IP:PORT --peer J=IP:PORT ... "
		  "[--stats FILE] [--sockbuf BYTES]");
	parse_args(argc, argv);
	setup();
	run();
	write_stats("done");
	check_all();
	zdtm_finish();
}
