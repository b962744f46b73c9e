/*
 * aio.c - AIO contexts (io_setup) must keep their ids (the rings'
 * addresses) and work after restore (zdtm's aio00, aio01).
 *
 *   aio PIDFILE
 *
 * Set up before "ready" (raw syscalls, no libaio):
 *   c1   io_setup(1), never used;
 *   c2   io_setup(128): a 4 KiB pread of aio.data (a pattern file in the
 *        cwd) submitted and its event read (so its ring's head and tail
 *        are 1, not 0), checked;
 *   c3   io_setup(64), as zdtm's aio01: nr + 2 preads of 16 bytes, tagged
 *        0x5000 + i, every second one followed by one event read: about
 *        half of them wait unread, and the ring has wrapped (tail < head).
 * After SIGTERM (tags in brackets):
 *   [ring]    each context's ring is still at its id, with the AIO ring
 *             magic and its old capacity;
 *   [empty]   io_getevents(c1, 0, 1, zero timeout) returns 0 (zdtm aio00);
 *   [io]      on each context, a pread of 4 KiB at offset 8192 of aio.data
 *             completes with its tag (data) and 4096 bytes, and the
 *             bytes are the pattern (5 s timeout);
 *   [pending] c3's ring has its old head, tail and capacity; one more
 *             pread moves its tail by one, not its head; then every
 *             waiting event comes out in order, tags and results as
 *             before, the new one last (zdtm aio01);
 *   [destroy] io_destroy of each context succeeds.
 */
#include "zdtm.h"

#include <linux/aio_abi.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#define SEED_F 0x61696f00ull
#define FLEN (64 * 1024)
#define AIO_RING_MAGIC 0xa10a10a1u

static char buf[4096] __attribute__((aligned(4096)));

struct ring_head {
	unsigned id, nr, head, tail, magic;
};

/* A pread of 4 KiB at `off` of fd on ctx, tagged `tag`: submitted, then
 * its event read; returns the result (bytes read, or -errno), or -1000
 * if the event did not come or had another tag. */
static long pread_once(aio_context_t ctx, int fd, long off, unsigned long long tag)
{
	struct iocb cb, *cbs[1] = { &cb };
	struct io_event ev;
	struct timespec ts = { 5, 0 };

	memset(&cb, 0, sizeof(cb));
	cb.aio_lio_opcode = IOCB_CMD_PREAD;
	cb.aio_fildes = (unsigned)fd;
	cb.aio_buf = (unsigned long)buf;
	cb.aio_nbytes = sizeof(buf);
	cb.aio_offset = off;
	cb.aio_data = tag;
	memset(buf, 0, sizeof(buf));
	if (syscall(SYS_io_submit, ctx, 1, cbs) != 1)
		return -errno;
	if (syscall(SYS_io_getevents, ctx, 1, 1, &ev, &ts) != 1 || ev.data != tag)
		return -1000;
	return (long)ev.res;
}

/* Whether the page at addr is mapped (mincore fails with ENOMEM if not). */
static int mapped(aio_context_t addr)
{
	unsigned char v;

	return mincore((void *)(unsigned long)addr, 1, &v) == 0;
}

/* Submits a 16-byte pread of fd on ctx tagged `tag`; 0 on success. */
static int submit16(aio_context_t ctx, int fd, unsigned long long tag)
{
	static char small[16];
	struct iocb cb, *cbs[1] = { &cb };

	memset(&cb, 0, sizeof(cb));
	cb.aio_lio_opcode = IOCB_CMD_PREAD;
	cb.aio_fildes = (unsigned)fd;
	cb.aio_buf = (unsigned long)small;
	cb.aio_nbytes = sizeof(small);
	cb.aio_data = tag;
	return syscall(SYS_io_submit, ctx, 1, cbs) == 1 ? 0 : -1;
}

int main(int argc, char **argv)
{
	aio_context_t c1 = 0, c2 = 0, c3 = 0;
	struct ring_head h1, h2, h3;
	struct io_event evs[512];
	unsigned i, nr3, read3 = 0;
	struct io_event ev;
	struct timespec zero = { 0, 0 };
	unsigned char *file;
	int fd;
	long r;

	zdtm_init(argc, argv, 0, "");
	file = malloc(FLEN);
	if (!file)
		zdtm_die("malloc");
	zdtm_fill(file, FLEN, SEED_F);
	fd = open("aio.data", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, file, FLEN) != FLEN)
		zdtm_die("aio.data");
	if (syscall(SYS_io_setup, 1, &c1) || syscall(SYS_io_setup, 128, &c2))
		zdtm_die("io_setup");
	r = pread_once(c2, fd, 0, 0x1111);
	if (r != (long)sizeof(buf) || memcmp(buf, file, sizeof(buf)))
		zdtm_die("the first pread (%ld)", r);
	if (syscall(SYS_io_setup, 64, &c3))
		zdtm_die("io_setup c3");
	nr3 = ((struct ring_head *)c3)->nr;
	if (nr3 + 2 > 512)
		zdtm_die("c3 holds %u events", nr3);
	for (i = 0; i < nr3 + 2; i++) {
		if (submit16(c3, fd, 0x5000 + i))
			zdtm_die("submit %u on c3", i);
		if (i % 2 && syscall(SYS_io_getevents, c3, 1, 1, evs, NULL) == 1)
			read3++;
	}
	h1 = *(struct ring_head *)c1;
	h2 = *(struct ring_head *)c2;
	h3 = *(struct ring_head *)c3;
	if (h3.tail >= h3.head)
		zdtm_die("c3's ring has not wrapped (head %u tail %u)", h3.head, h3.tail);
	if (h1.magic != AIO_RING_MAGIC || h2.magic != AIO_RING_MAGIC || h2.head != 1 || h2.tail != 1)
		zdtm_die("unexpected rings (%x %u/%u)", h2.magic, h2.head, h2.tail);

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);

	ZDTM_CORRUPT("destroy", syscall(SYS_io_destroy, c1));
	ZDTM_CORRUPT("io", {
		struct iocb cb, *cbs[1] = { &cb };

		memset(&cb, 0, sizeof(cb));
		cb.aio_lio_opcode = IOCB_CMD_PREAD;
		cb.aio_fildes = (unsigned)fd;
		cb.aio_buf = (unsigned long)buf;
		cb.aio_nbytes = 16;
		cb.aio_data = 0xbad;
		syscall(SYS_io_submit, c2, 1, cbs);
	});
	ZDTM_CORRUPT("pending", syscall(SYS_io_getevents, c3, 1, 1, evs, NULL));
	if (zdtm_check(mapped(c1), "ring", "nothing mapped at c1 %#llx", (unsigned long long)c1)) {
		struct ring_head *n1 = (void *)c1;

		zdtm_check(n1->magic == AIO_RING_MAGIC && n1->nr == h1.nr, "ring",
			   "c1's ring: magic %x nr %u (was %u)", n1->magic, n1->nr, h1.nr);
	}
	if (zdtm_check(mapped(c2), "ring", "nothing mapped at c2 %#llx", (unsigned long long)c2)) {
		struct ring_head *n2 = (void *)c2;

		zdtm_check(n2->magic == AIO_RING_MAGIC && n2->nr == h2.nr, "ring",
			   "c2's ring: magic %x nr %u (was %u)", n2->magic, n2->nr, h2.nr);
	}
	r = syscall(SYS_io_getevents, c1, 0, 1, &ev, &zero);
	zdtm_check(r == 0, "empty", "io_getevents on c1: %ld (%s)", r, r < 0 ? strerror(errno) : "");
	r = pread_once(c1, fd, 8192, 0x2222);
	if (zdtm_check(r == (long)sizeof(buf), "io", "pread on c1: %ld", r))
		zdtm_check(!memcmp(buf, file + 8192, sizeof(buf)), "io", "c1's read: other bytes");
	r = pread_once(c2, fd, 8192, 0x3333);
	if (zdtm_check(r == (long)sizeof(buf), "io", "pread on c2: %ld", r))
		zdtm_check(!memcmp(buf, file + 8192, sizeof(buf)), "io", "c2's read: other bytes");
	{
		volatile struct ring_head *n3 = (void *)c3;
		unsigned waiting = nr3 + 2 - read3;

		zdtm_check(n3->head == h3.head && n3->tail == h3.tail && n3->nr == h3.nr, "pending",
			   "c3's ring: head %u tail %u nr %u, was %u %u %u", n3->head, n3->tail,
			   n3->nr, h3.head, h3.tail, h3.nr);
		if (zdtm_check(submit16(c3, fd, 0x9999) == 0, "pending", "a new pread on c3: %s",
			       strerror(errno)))
			zdtm_check(n3->tail == (h3.tail + 1) % h3.nr && n3->head == h3.head,
				   "pending", "c3 after one more pread: head %u tail %u, expected %u %u",
				   n3->head, n3->tail, h3.head, (h3.tail + 1) % h3.nr);
		r = syscall(SYS_io_getevents, c3, 0, 512, evs, &zero);
		if (zdtm_check(r == (long)waiting + 1, "pending", "c3: %ld events, expected %u", r,
			       waiting + 1))
			for (i = 0; i < waiting + 1; i++) {
				unsigned long long want = i < waiting ? 0x5000 + read3 + i : 0x9999;

				zdtm_check(evs[i].data == want && evs[i].res == 16, "pending",
					   "c3 event %u: tag %#llx res %lld, expected %#llx 16", i,
					   (unsigned long long)evs[i].data, (long long)evs[i].res, want);
			}
	}
	r = syscall(SYS_io_destroy, c3);
	zdtm_check(r == 0, "destroy", "io_destroy(c3): %ld (%s)", r, r ? strerror(errno) : "");
	r = syscall(SYS_io_destroy, c1);
	zdtm_check(r == 0, "destroy", "io_destroy(c1): %ld (%s)", r, r ? strerror(errno) : "");
	r = syscall(SYS_io_destroy, c2);
	zdtm_check(r == 0, "destroy", "io_destroy(c2): %ld (%s)", r, r ? strerror(errno) : "");
	zdtm_finish();
	return 0;
}
