/*
 * uffd.c - a program's own userfaultfd (as a garbage collector or a
 * libstasis program in `uffd` mode has): one userfaultfd with the
 * WP_ASYNC and WP_UNPOPULATED features over two areas of 16 pages:
 *   W  registered for write-protection, all protected, then pages 3 and 7
 *      written (asynchronous mode: their protection lifts, no fault)
 *   M  registered for missing pages, served by a handler thread that
 *      fills each faulting page with pattern(page address); page 0
 *      touched before the checkpoint
 *
 *   uffd PIDFILE
 *
 * After SIGTERM:
 *   `wp`       pagemap says W's pages 3 and 7 are written, the others still
 *              write-protected
 *   `async`    writing page 9 of W lifts its protection
 *   `missing`  M's page 0 holds the handler's pattern; reading page 9 of M
 *              (never touched) gets the handler's pattern too, within 10 s
 *   `features` the fdinfo of the userfaultfd shows the same features
 */
#include "zdtm.h"

#include <poll.h>
#include <pthread.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#define FEATURES (UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED)

#define PG 4096UL
#define NP 16

static int u;
static char *w, *m;
static volatile int done_reading;

static void *handler(void *arg)
{
	static char page[PG] __attribute__((aligned(4096)));

	(void)arg;
	for (;;) {
		struct uffd_msg msg;
		struct pollfd p = { .fd = u, .events = POLLIN };

		if (poll(&p, 1, -1) < 0)
			continue;
		if (read(u, &msg, sizeof(msg)) != sizeof(msg) ||
		    msg.event != UFFD_EVENT_PAGEFAULT)
			continue;
		{
			unsigned long at = msg.arg.pagefault.address & ~(PG - 1);
			struct uffdio_copy c = { .dst = at, .src = (unsigned long)page, .len = PG };

			zdtm_fill(page, PG, at);
			ioctl(u, UFFDIO_COPY, &c);
		}
	}
	return NULL;
}

/* Whether pagemap says the page at `p` is uffd write-protected (bit 57). */
static int protected(void *p)
{
	uint64_t e = 0;
	int f = open("/proc/self/pagemap", O_RDONLY);

	if (f < 0 || pread(f, &e, 8, (unsigned long)p / PG * 8) != 8)
		e = 0;
	if (f >= 0)
		close(f);
	return (e >> 57) & 1;
}

static void *reader(void *arg)
{
	volatile char c = m[9 * PG];

	(void)arg;
	(void)c;
	done_reading = 1;
	return NULL;
}

int main(int argc, char **argv)
{
	struct uffdio_api api = { .api = UFFD_API, .features = FEATURES };
	pthread_t h, r;
	int i;

	zdtm_init(argc, argv, 0, "");
	u = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (u < 0 || ioctl(u, UFFDIO_API, &api))
		zdtm_die("userfaultfd");
	w = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	m = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (w == MAP_FAILED || m == MAP_FAILED)
		zdtm_die("mmap");
	zdtm_fill(w, NP * PG, 0x77);
	{
		struct uffdio_register rw = { .range = { (unsigned long)w, NP * PG },
					      .mode = UFFDIO_REGISTER_MODE_WP };
		struct uffdio_register rm = { .range = { (unsigned long)m, NP * PG },
					      .mode = UFFDIO_REGISTER_MODE_MISSING };
		struct uffdio_writeprotect wp = { .range = { (unsigned long)w, NP * PG },
						  .mode = UFFDIO_WRITEPROTECT_MODE_WP };

		if (ioctl(u, UFFDIO_REGISTER, &rw) || ioctl(u, UFFDIO_REGISTER, &rm) ||
		    ioctl(u, UFFDIO_WRITEPROTECT, &wp))
			zdtm_die("register");
	}
	w[3 * PG] = 1;
	w[7 * PG] = 1;
	if (pthread_create(&h, NULL, handler, NULL))
		zdtm_die("handler");
	if (m[0] == 0 && m[1] == 0 && m[2] == 0)
		zdtm_die("the handler did not fill page 0");

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("wp", w[5 * PG] = 2);
	ZDTM_CORRUPT("missing", {
		struct uffdio_range rg = { (unsigned long)m, NP * PG };

		ioctl(u, UFFDIO_UNREGISTER, &rg);
	});
	for (i = 0; i < NP; i++) {
		int want = !(i == 3 || i == 7);

		zdtm_check(protected(w + i * PG) == want, "wp", "page %d of W: protected %d, expected %d",
			   i, protected(w + i * PG), want);
	}
	w[9 * PG] = 3;
	zdtm_check(!protected(w + 9 * PG), "async", "page 9 of W still protected after a write");
	{
		char want[PG];

		zdtm_fill(want, PG, (unsigned long)m);
		zdtm_check(!memcmp(m, want, PG), "missing", "page 0 of M lost the handler's pattern");
	}
	{
		int64_t end = zdtm_now_ns() + 10000000000ll;
		char want[PG];

		if (pthread_create(&r, NULL, reader, NULL))
			zdtm_die("reader");
		while (!done_reading && zdtm_now_ns() < end)
			zdtm_msleep(5);
		zdtm_fill(want, PG, (unsigned long)m + 9 * PG);
		zdtm_check(done_reading && !memcmp(m + 9 * PG, want, PG), "missing",
			   "page 9 of M: %s", done_reading ? "not the handler's pattern"
							    : "the read did not finish in 10 s");
	}
	{
		char path[64], info[512], *api_line;
		unsigned long long a, f;

		snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", u);
		info[0] = 0;
		zdtm_read_text(path, info, sizeof(info));
		api_line = strstr(info, "API:");
		zdtm_check(api_line && sscanf(api_line, "API:\t%llx:%llx", &a, &f) == 2 &&
				   (f & FEATURES) == FEATURES,
			   "features", "fdinfo: %s", api_line ? api_line : "(no API line)");
	}
	zdtm_finish();
}
