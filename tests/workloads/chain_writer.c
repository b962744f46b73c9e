/*
 * chain_writer.c - the self-verifying writer for incremental checkpoint
 * chains.  Its memory is a pure function of its iteration counter, so after
 * restoring ANY checkpoint of a chain (each taken at an unknown iteration) it
 * can check itself byte for byte by replaying its history from iteration 0.
 *
 *   chain_writer PIDFILE [SIZE_MIB] [FORK_AT] [CHURN]
 *                              (defaults 64, 0 = never and 1)
 *
 * CHURN = 0: only the page writes below, no map/unmap/mremap/madvise
 * (the layout stays as set up; B stays mapped).
 *
 * Regions:
 *   A  SIZE_MIB MiB anonymous private mmap (2 MiB aligned and MADV_HUGEPAGE
 *      when SIZE_MIB >= 4, errors ignored), initially pattern(SEED_A).
 *   B  2 MiB anonymous mmap at an address the kernel picks; mapped at start
 *      with pattern(SEED_B), unmapped and mapped again on a schedule.
 *   C  1 MiB anonymous private mapping inside a 9 MiB PROT_NONE "arena"
 *      (guard 1 MiB | slot 0: 3 MiB | guard 1 MiB | slot 1: 3 MiB | guard
 *      1 MiB).  It starts in slot 0 with pattern(SEED_C), is grown to 3 MiB
 *      with mremap(MREMAP_MAYMOVE), in place (the PROT_NONE tail of its slot
 *      is unmapped first) or moved to the other slot (MREMAP_FIXED), and
 *      shrunk back to 1 MiB (the freed tail is reserved PROT_NONE again).
 *      So C's neighbours are always PROT_NONE: its VMA never merges, and
 *      /proc/self/maps shows exactly C.
 *
 * Iteration i = 1, 2, ... (role r = 0 in the original process, 1 in the
 * forked child from iteration FORK_AT on):
 *   - writes max(1, pages(A) / 100) pages of A, page = mix(SEED_A, r, i, k)
 *     % pages, each with a full-page pattern of (r, i, page); then one page
 *     of B (if mapped) and one page of C (within its current size), alike;
 *   - i % 64 ==  5: map B (if unmapped), fill it with a pattern of (r, i);
 *     i % 64 == 21: grow C to 3 MiB (in place if i / 64 is even, moved to
 *                   the other slot if odd), fill the new 2 MiB with a
 *                   pattern of (r, i);
 *     i % 64 == 37: unmap B (if mapped);
 *     i % 64 == 53: shrink C to 1 MiB;
 *     i % 32 == 13: MADV_DONTNEED a 256 KiB slice of A chosen by (r, i) (its
 *                   pages read as zero until written again);
 *   - a compiler barrier, counter = i, nanosleep(200 us).
 * zdtm_stop is only looked at between iterations (and at least one iteration
 * always completes), so the state is always exactly "after iteration
 * counter".  Unexpected syscall failures in the loop are recorded (tag of
 * the region) and stop the iterations; the process then just sleeps.
 *
 * FORK_AT > 0: at the start of iteration FORK_AT the process forks; the
 * child runs the same loop with r = 1 and its own counter, the parent keeps
 * r = 0.  On SIGTERM the parent forwards SIGTERM to the child, checks itself,
 * and reaps the child (20 s deadline).  The child checks itself, writes its
 * mismatch lines to stderr (zdtm_child_fail) and exits with a bit mask that
 * the parent turns into the tags child-A, child-B, child-C, child-counter
 * (child = no child, fork failure, killed, timeout, odd status).  The child
 * stops on its own if its parent changes (orphaned).
 *
 * Verification (each process): /proc/self/maps is read into a static buffer
 * before anything is allocated.  counter must be > 0 (and >= FORK_AT in the
 * child, <= 2^32 to be replayed at all).  The replay runs iterations
 * 1..counter (role switch at FORK_AT for the child) on a model that records,
 * for every page of A, B and C, the last event that wrote it (initial
 * pattern, page write, region fill, DONTNEED) plus B's mapped state and C's
 * size and slot; shadow buffers (malloc, same sizes) are then materialized
 * from it and compared with memcmp.  The replay costs O(pages touched), not
 * O(bytes written), so 64 MiB and ~5000 iterations check in well under a
 * second.  Checks:
 *   A        fully mapped rw-p in maps; content (first differing page, how
 *            many pages differ, what it was expected to hold and what it
 *            holds: zero / initial / previous content / the other role's).
 *   B        mapped iff expected (pointer, and maps covers it rw-p); when
 *            unmapped, its last address range must be unmapped in maps;
 *            content.
 *   C        the size global, the slot (address), maps: the arena is fully
 *            covered, every line in it is ---p except exactly one rw-p line
 *            [C, C + expected size); content of what is mapped.
 *   counter  plausibility (above); the parent must have a child once
 *            counter >= FORK_AT ("child").
 * On failure a line "detail: ..." gives the counter and the pages checked.
 *
 * Self-test (-DSELFTEST_CORRUPT): each process first resets itself to a
 * consistent iteration-0 state with counter = 0 (caught only by "counter"),
 * then flips a byte in A; the parent flips a byte in B and C and sets the
 * C size global to 3 MiB, the child unmaps B (keeping its pointer) and
 * shrinks C's mapping to 512 KiB (maps/arena checks).
 *
 * Build with -DCHAIN_WRITER_TIMING to get iterations/s and the check time on
 * stderr.
 */
#include "zdtm.h"

#include <sys/mman.h>

#define SEED_A   0x636861696e2d4100ull
#define SEED_B   0x636861696e2d4200ull
#define SEED_C   0x636861696e2d4300ull
#define SEED_ZAP 0x636861696e2d5a00ull

#define MIB         (1024ul * 1024ul)
#define B_SIZE      (2 * MIB)
#define C_SMALL     (1 * MIB)
#define C_BIG       (3 * MIB)
#define GUARD       (1 * MIB)
#define SLOT_STRIDE (C_BIG + GUARD)
#define ARENA_SIZE  (GUARD + 2 * SLOT_STRIDE)
#define ZAP_SIZE    (256 * 1024ul)
#define HUGE_SIZE   (2 * MIB)

#define PERIOD      64
#define PH_B_MAP    5
#define PH_C_GROW   21
#define PH_B_UNMAP  37
#define PH_C_SHRINK 53
#define ZAP_PERIOD  32
#define PH_ZAP      13

#define SLEEP_US    200
#define MAX_COUNTER (1ull << 32)
#define DEADLINE_S  20

/* check bits: tags in the parent / child; the child's exit status */
#define T_A        0
#define T_B        1
#define T_C        2
#define T_COUNTER  3
#define T_INTERNAL 4
#define T_N        5

static const char *const tags_own[T_N] = {
	"A", "B", "C", "counter", "child"
};
static const char *const tags_child[T_N] = {
	"child-A", "child-B", "child-C", "child-counter", "child"
};

/* ------------------------------------------------------------------ */
/* state (everything the restored process needs is in these globals)  */

static size_t ps;
static uint8_t *a;
static size_t a_size, a_pages, a_writes, a_slices;
static uint8_t *b, *b_last; /* b = NULL while unmapped */
static size_t b_pages;
static uint8_t *arena, *c;
static size_t c_size;
static int c_slot;

static volatile uint64_t counter;
static int role, is_child;
static uint64_t fork_at;
static pid_t child_pid, parent_pid;
static int fork_errno;

static int loop_err_bit = -1;
static uint64_t loop_err_iter;
static int loop_err_errno;
static const char *loop_err_what;

static int report_bits;

#ifdef CHAIN_WRITER_TIMING
static int64_t t_ready;
#endif

/* ------------------------------------------------------------------ */
/* events and patterns                                                 */

enum { EV_INIT = 0, EV_WRITE = 1, EV_ZERO = 2, EV_FILL = 3 };

static inline uint64_t ev_make(int kind, int r, uint64_t iter)
{
	return iter << 8 | (uint64_t)r << 4 | (uint64_t)kind;
}

#define EV_KIND(e) ((int)((e) & 15))
#define EV_ROLE(e) ((int)(((e) >> 4) & 1))
#define EV_ITER(e) ((unsigned long long)((e) >> 8))

/* The pattern seed of page `page` of the region named by rseed after event
 * ev (EV_ZERO has no pattern). */
static inline uint64_t ev_seed(uint64_t rseed, uint64_t ev, size_t page)
{
	switch (EV_KIND(ev)) {
	case EV_INIT:
		return rseed;
	case EV_WRITE:
		return zdtm_mix64(zdtm_mix64(rseed ^ ev) ^ page);
	default:
		return zdtm_mix64(rseed ^ zdtm_mix64(ev));
	}
}

/* dst[0..len) = pattern(seed) at region offsets off..off+len (all multiples
 * of 8), i.e. what zdtm_fill(region, ..., seed) puts there. */
static inline void pat_fill(void *dst, size_t off, size_t len, uint64_t seed)
{
	uint64_t *w = dst;
	uint64_t idx = off / 8;
	size_t k, n = len / 8;

	for (k = 0; k < n; k++)
		w[k] = zdtm_pat_word(seed, idx + k);
}

/* Deterministic choice number k of iteration i in role r. */
static inline uint64_t pick(uint64_t seed, int r, uint64_t i, uint64_t k)
{
	return zdtm_mix64(zdtm_mix64(seed ^ (i << 1 | (uint64_t)r)) ^ k);
}

#define OP_B_MAP    1u
#define OP_B_UNMAP  2u
#define OP_C_GROW   4u
#define OP_C_SHRINK 8u
#define OP_ZAP      16u

static int churn = 1;

static inline unsigned ops_of(uint64_t i)
{
	unsigned ops = 0;

	if (!churn)
		return 0;

	switch (i % PERIOD) {
	case PH_B_MAP:
		ops |= OP_B_MAP;
		break;
	case PH_B_UNMAP:
		ops |= OP_B_UNMAP;
		break;
	case PH_C_GROW:
		ops |= OP_C_GROW;
		break;
	case PH_C_SHRINK:
		ops |= OP_C_SHRINK;
		break;
	}
	if (i % ZAP_PERIOD == PH_ZAP)
		ops |= OP_ZAP;
	return ops;
}

/* Does the C growth of iteration i move C to the other slot? */
static inline int grow_moves(uint64_t i)
{
	return (i / PERIOD) & 1;
}

static inline uint8_t *slot_addr(int s)
{
	return arena + GUARD + (size_t)s * SLOT_STRIDE;
}

/* ------------------------------------------------------------------ */
/* the real operations                                                 */

static int reserve(uint8_t *p, size_t len)
{
	void *r = mmap(p, len, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
		       -1, 0);

	return r == (void *)p ? 0 : -1;
}

static int b_map(uint64_t seed)
{
	void *p = mmap(NULL, B_SIZE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return -1;
	b = p;
	b_last = p;
	pat_fill(b, 0, B_SIZE, seed);
	return 0;
}

static int c_grow(uint64_t seed, int move)
{
	void *p;

	if (move) {
		uint8_t *old = c;
		int ns = !c_slot;

		p = mremap(c, C_SMALL, C_BIG, MREMAP_MAYMOVE | MREMAP_FIXED,
			   slot_addr(ns));
		if (p != slot_addr(ns))
			return -1;
		c = p;
		c_slot = ns;
		c_size = C_BIG;
		if (reserve(old, C_SMALL))
			return -1;
	} else {
		if (munmap(c + C_SMALL, C_BIG - C_SMALL))
			return -1;
		p = mremap(c, C_SMALL, C_BIG, MREMAP_MAYMOVE);
		if (p == MAP_FAILED)
			return -1;
		if (p != c) {
			/* moved out of the arena: the checks will say so */
			c = p;
			c_size = C_BIG;
			errno = 0;
			return -1;
		}
		c_size = C_BIG;
	}
	pat_fill(c + C_SMALL, C_SMALL, C_BIG - C_SMALL, seed);
	return 0;
}

static int c_shrink(void)
{
	void *p = mremap(c, C_BIG, C_SMALL, 0);

	if (p != c)
		return -1;
	c_size = C_SMALL;
	return reserve(c + C_SMALL, C_BIG - C_SMALL);
}

static int loop_error(int bit, uint64_t i, const char *what)
{
	loop_err_bit = bit;
	loop_err_iter = i;
	loop_err_errno = errno;
	loop_err_what = what;
	return -1;
}

/* Iteration i of the real process.  0, or -1 after loop_error(). */
static int iterate(uint64_t i)
{
	const int r = role;
	const unsigned ops = ops_of(i);
	size_t k, p;

	for (k = 0; k < a_writes; k++) {
		p = pick(SEED_A, r, i, k) % a_pages;
		pat_fill(a + p * ps, p * ps, ps,
			 ev_seed(SEED_A, ev_make(EV_WRITE, r, i), p));
	}
	if (b) {
		p = pick(SEED_B, r, i, 0) % b_pages;
		pat_fill(b + p * ps, p * ps, ps,
			 ev_seed(SEED_B, ev_make(EV_WRITE, r, i), p));
	}
	p = pick(SEED_C, r, i, 0) % (c_size / ps);
	pat_fill(c + p * ps, p * ps, ps,
		 ev_seed(SEED_C, ev_make(EV_WRITE, r, i), p));

	if ((ops & OP_B_MAP) && !b &&
	    b_map(ev_seed(SEED_B, ev_make(EV_FILL, r, i), 0)))
		return loop_error(T_B, i, "mmap B");
	if ((ops & OP_B_UNMAP) && b) {
		if (munmap(b, B_SIZE))
			return loop_error(T_B, i, "munmap B");
		b = NULL;
	}
	if ((ops & OP_C_GROW) && c_size == C_SMALL &&
	    c_grow(ev_seed(SEED_C, ev_make(EV_FILL, r, i), 0), grow_moves(i)))
		return loop_error(T_C, i, "grow C (mremap/mmap)");
	if ((ops & OP_C_SHRINK) && c_size == C_BIG && c_shrink())
		return loop_error(T_C, i, "shrink C (mremap/mmap)");
	if (ops & OP_ZAP) {
		size_t s = pick(SEED_ZAP, r, i, 0) % a_slices;

		if (madvise(a + s * ZAP_SIZE, ZAP_SIZE, MADV_DONTNEED))
			return loop_error(T_A, i, "madvise(A, MADV_DONTNEED)");
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* the model: last event of every page                                 */

struct region {
	const char *name;
	uint64_t seed;
	size_t npages;
	uint64_t *last, *prev; /* events; prev only for diagnostics */
};

struct model {
	struct region A, B, C;
	int b_mapped;
	uint64_t b_since; /* iteration of the last map/unmap of B */
	size_t c_pages;
	int c_slot;
};

static void set_ev(struct region *rg, size_t p, uint64_t ev)
{
	rg->prev[p] = rg->last[p];
	rg->last[p] = ev;
}

/* Exactly what iterate(i) does, on the model. */
static void model_iter(struct model *m, uint64_t i, int r)
{
	const unsigned ops = ops_of(i);
	size_t k, p;

	for (k = 0; k < a_writes; k++) {
		p = pick(SEED_A, r, i, k) % a_pages;
		set_ev(&m->A, p, ev_make(EV_WRITE, r, i));
	}
	if (m->b_mapped) {
		p = pick(SEED_B, r, i, 0) % b_pages;
		set_ev(&m->B, p, ev_make(EV_WRITE, r, i));
	}
	p = pick(SEED_C, r, i, 0) % m->c_pages;
	set_ev(&m->C, p, ev_make(EV_WRITE, r, i));

	if ((ops & OP_B_MAP) && !m->b_mapped) {
		m->b_mapped = 1;
		m->b_since = i;
		for (p = 0; p < b_pages; p++)
			set_ev(&m->B, p, ev_make(EV_FILL, r, i));
	}
	if ((ops & OP_B_UNMAP) && m->b_mapped) {
		m->b_mapped = 0;
		m->b_since = i;
	}
	if ((ops & OP_C_GROW) && m->c_pages == C_SMALL / ps) {
		if (grow_moves(i))
			m->c_slot = !m->c_slot;
		m->c_pages = C_BIG / ps;
		for (p = C_SMALL / ps; p < C_BIG / ps; p++)
			set_ev(&m->C, p, ev_make(EV_FILL, r, i));
	}
	if ((ops & OP_C_SHRINK) && m->c_pages == C_BIG / ps)
		m->c_pages = C_SMALL / ps;
	if (ops & OP_ZAP) {
		size_t s = pick(SEED_ZAP, r, i, 0) % a_slices;

		for (p = s * (ZAP_SIZE / ps); p < (s + 1) * (ZAP_SIZE / ps); p++)
			set_ev(&m->A, p, ev_make(EV_ZERO, r, i));
	}
}

/* ------------------------------------------------------------------ */
/* reporting (own stdout in the parent, stderr + exit bits in a child) */

__attribute__((format(printf, 2, 3)))
static void report(int bit, const char *fmt, ...)
{
	va_list ap;

	report_bits |= 1 << bit;
	va_start(ap, fmt);
	if (is_child)
		zdtm_child_vfail("chain_writer child", tags_child[bit], fmt, ap);
	else
		zdtm_vfail(tags_own[bit], fmt, ap);
	va_end(ap);
}

__attribute__((noreturn))
static void internal_error(const char *what)
{
	if (is_child) {
		report(T_INTERNAL, "%s: %s", what, strerror(errno));
		_exit(1 << T_INTERNAL);
	}
	zdtm_die("%s", what);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n);

	if (!p)
		internal_error("malloc");
	return p;
}

static void *xcalloc(size_t n, size_t sz)
{
	void *p = calloc(n, sz);

	if (!p)
		internal_error("calloc");
	return p;
}

/* ------------------------------------------------------------------ */
/* /proc/self/maps (read with read() into a static buffer)             */

static char maps_buf[1 << 18];
static int maps_ok;

struct mline {
	uintptr_t start, end;
	char perms[5];
};

static void maps_load(void)
{
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	size_t len = 0;

	maps_buf[0] = 0;
	if (fd < 0)
		return;
	for (;;) {
		ssize_t n = read(fd, maps_buf + len, sizeof(maps_buf) - 1 - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += n;
		if (len == sizeof(maps_buf) - 1)
			break;
	}
	close(fd);
	maps_buf[len] = 0;
	maps_ok = len > 0;
}

/* Parse the line at *pos; 0 at the end. */
static int maps_next(const char **pos, struct mline *l)
{
	const char *p = *pos;
	char *e;

	while (*p) {
		const char *nl = strchr(p, '\n');
		const char *next = nl ? nl + 1 : p + strlen(p);

		l->start = strtoull(p, &e, 16);
		if (*e == '-') {
			l->end = strtoull(e + 1, &e, 16);
			if (*e == ' ' && e + 5 <= next) {
				memcpy(l->perms, e + 1, 4);
				l->perms[4] = 0;
				*pos = next;
				return 1;
			}
		}
		p = next;
	}
	*pos = p;
	return 0;
}

/* Is [lo, hi) covered by consecutive lines with these perms? */
static int maps_cover(const void *lo_p, size_t len, const char *perms)
{
	uintptr_t pos = (uintptr_t)lo_p, hi = pos + len;
	const char *it = maps_buf;
	struct mline l;

	while (maps_next(&it, &l)) {
		if (l.end <= pos)
			continue;
		if (l.start > pos || strcmp(l.perms, perms))
			return 0;
		pos = l.end;
		if (pos >= hi)
			return 1;
	}
	return 0;
}

/* Does any line overlap [lo, lo + len)? */
static int maps_overlap(const void *lo_p, size_t len)
{
	uintptr_t lo = (uintptr_t)lo_p, hi = lo + len;
	const char *it = maps_buf;
	struct mline l;

	while (maps_next(&it, &l))
		if (l.start < hi && l.end > lo)
			return 1;
	return 0;
}

/* ------------------------------------------------------------------ */
/* comparison                                                          */

static uint8_t scratch[65536] __attribute__((aligned(64)));

static void make_page(uint8_t *dst, const struct region *rg, size_t p,
		      uint64_t ev)
{
	if (EV_KIND(ev) == EV_ZERO)
		memset(dst, 0, ps);
	else
		pat_fill(dst, p * ps, ps, ev_seed(rg->seed, ev, p));
}

static void ev_desc(char *buf, size_t n, uint64_t ev)
{
	switch (EV_KIND(ev)) {
	case EV_INIT:
		snprintf(buf, n, "the initial pattern");
		break;
	case EV_WRITE:
		snprintf(buf, n, "the page write of iteration %llu role %d",
			 EV_ITER(ev), EV_ROLE(ev));
		break;
	case EV_ZERO:
		snprintf(buf, n, "zeros (MADV_DONTNEED at iteration %llu)",
			 EV_ITER(ev));
		break;
	default:
		snprintf(buf, n, "the region fill of iteration %llu role %d",
			 EV_ITER(ev), EV_ROLE(ev));
		break;
	}
}

/* What does the (wrong) page hold?  Tries a few likely candidates: zeros,
 * the initial pattern, the page's previous content, the other role's. */
static void classify(char *buf, size_t n, const struct region *rg, size_t p,
		     const uint8_t *actual)
{
	uint64_t last = rg->last[p];
	uint64_t cand[4];
	int nc = 0, k;
	size_t len;

	if (ps > sizeof(scratch)) {
		snprintf(buf, n, "(not classified)");
		return;
	}
	cand[nc++] = ev_make(EV_ZERO, 0, 0);
	cand[nc++] = ev_make(EV_INIT, 0, 0);
	if (EV_KIND(rg->prev[p]) != EV_INIT && EV_KIND(rg->prev[p]) != EV_ZERO)
		cand[nc++] = rg->prev[p];
	if (EV_KIND(last) == EV_WRITE || EV_KIND(last) == EV_FILL)
		cand[nc++] = last ^ (1u << 4); /* the other role */
	for (k = 0; k < nc; k++) {
		make_page(scratch, rg, p, cand[k]);
		if (memcmp(actual, scratch, ps) == 0) {
			if (EV_KIND(cand[k]) == EV_ZERO)
				snprintf(buf, n, "zeros");
			else
				ev_desc(buf, n, cand[k]);
			return;
		}
	}
	len = snprintf(buf, n, "none of: zeros, the initial pattern");
	for (k = 2; k < nc && len + 2 < n; k++) {
		buf[len++] = ',';
		buf[len++] = ' ';
		ev_desc(buf + len, n - len, cand[k]);
		len += strlen(buf + len);
	}
}

/* Materialize rg's first npages into shadow and compare with real.
 * Returns the number of pages compared. */
static size_t compare_region(int bit, const struct region *rg,
			     const uint8_t *real, uint8_t *shadow,
			     size_t npages)
{
	size_t p, bad = 0, first = 0, off;
	char exp[96], got[256];

	for (p = 0; p < npages; p++)
		make_page(shadow + p * ps, rg, p, rg->last[p]);
	if (memcmp(real, shadow, npages * ps) == 0)
		return npages;
	for (p = 0; p < npages; p++) {
		if (memcmp(real + p * ps, shadow + p * ps, ps)) {
			if (!bad)
				first = p;
			bad++;
		}
	}
	for (off = first * ps; real[off] == shadow[off]; off++)
		;
	ev_desc(exp, sizeof(exp), rg->last[first]);
	classify(got, sizeof(got), rg, first, real + first * ps);
	report(bit, "%s page %zu (offset 0x%zx) differs, first at +%zu: got "
	       "0x%02x expected 0x%02x; %zu of %zu pages differ; expected %s, "
	       "the page holds %s", rg->name, first, first * ps,
	       off - first * ps, real[off], shadow[off], bad, npages, exp, got);
	return npages;
}

/* ------------------------------------------------------------------ */
/* verification                                                        */

static void verify(void)
{
	uint64_t n = counter, i;
	struct model m;
	size_t checked_a = 0, checked_b = 0, checked_c = 0;
	size_t c_exp, c_avail = 0;
	int a_ok, b_cmp = 0;
	char detail[512];
	int len;
#ifdef CHAIN_WRITER_TIMING
	int64_t t0 = zdtm_now_ns(), t1;
#endif

	/* before anything is allocated: nothing may be mapped by ourselves */
	maps_load();
	if (!maps_ok)
		report(T_INTERNAL, "cannot read /proc/self/maps: %s",
		       strerror(errno));

	if (loop_err_bit >= 0)
		report(loop_err_bit, "%s failed at iteration %llu: %s",
		       loop_err_what, (unsigned long long)loop_err_iter,
		       loop_err_errno ? strerror(loop_err_errno)
				      : "moved out of the arena");

	/* counter plausibility */
	if (n == 0)
		report(T_COUNTER, "counter is 0: no iteration completed");
	if (is_child && n < fork_at)
		report(T_COUNTER, "child's counter %llu < FORK_AT %llu",
		       (unsigned long long)n, (unsigned long long)fork_at);
	if (n > MAX_COUNTER) {
		report(T_COUNTER, "counter %llu is implausible (> %llu): not "
		       "replayed, nothing else checked", (unsigned long long)n,
		       (unsigned long long)MAX_COUNTER);
		return;
	}

	/* replay */
	memset(&m, 0, sizeof(m));
	m.A = (struct region){ "A", SEED_A, a_pages,
			       xcalloc(a_pages, 8), xcalloc(a_pages, 8) };
	m.B = (struct region){ "B", SEED_B, b_pages,
			       xcalloc(b_pages, 8), xcalloc(b_pages, 8) };
	m.C = (struct region){ "C", SEED_C, C_BIG / ps,
			       xcalloc(C_BIG / ps, 8), xcalloc(C_BIG / ps, 8) };
	m.b_mapped = 1;
	m.c_pages = C_SMALL / ps;
	m.c_slot = 0;
	for (i = 1; i <= n; i++)
		model_iter(&m, i, is_child && i >= fork_at);
	c_exp = m.c_pages * ps;

	/* A: mapped */
	a_ok = maps_cover(a, a_size, "rw-p");
	if (!a_ok)
		report(T_A, "A [%p, +0x%zx) is not fully mapped rw-p", (void *)a,
		       a_size);

	/* B: mapped iff expected */
	if (m.b_mapped && !b)
		report(T_B, "B is unmapped, expected mapped (since iteration "
		       "%llu)", (unsigned long long)m.b_since);
	if (!m.b_mapped && b)
		report(T_B, "B is mapped at %p, expected unmapped (since "
		       "iteration %llu)", (void *)b,
		       (unsigned long long)m.b_since);
	if (b) {
		if (!maps_cover(b, B_SIZE, "rw-p"))
			report(T_B, "B [%p, +0x%lx) is not mapped rw-p in "
			       "/proc/self/maps", (void *)b, B_SIZE);
		else
			b_cmp = m.b_mapped;
	} else if (b_last && maps_overlap(b_last, B_SIZE)) {
		report(T_B, "B was unmapped but its range [%p, +0x%lx) is "
		       "mapped in /proc/self/maps", (void *)b_last, B_SIZE);
	}

	/* C: size global, slot, arena layout in maps */
	if (c_size != c_exp)
		report(T_C, "C size %zu, expected %zu", c_size, c_exp);
	if (c != slot_addr(m.c_slot))
		report(T_C, "C at %p, expected slot %d at %p (arena %p)",
		       (void *)c, m.c_slot, (void *)slot_addr(m.c_slot),
		       (void *)arena);
	{
		uintptr_t lo = (uintptr_t)arena, hi = lo + ARENA_SIZE;
		uintptr_t pos = lo;
		const char *it = maps_buf;
		struct mline l;
		int rw = 0;

		while (maps_next(&it, &l) && pos < hi) {
			if (l.end <= pos)
				continue;
			if (l.start > pos) {
				report(T_C, "arena hole [%#lx, %#lx)",
				       (unsigned long)pos,
				       (unsigned long)(l.start < hi ? l.start
								   : hi));
				if (l.start >= hi)
					break;
			}
			if (strcmp(l.perms, "---p") == 0) {
				/* reserve */
			} else if (strcmp(l.perms, "rw-p") == 0) {
				rw++;
				if (l.start != (uintptr_t)c ||
				    l.end != (uintptr_t)c + c_exp)
					report(T_C, "arena mapping [%#lx, %#lx) "
					       "rw-p, expected exactly C [%p, "
					       "+0x%zx)", (unsigned long)l.start,
					       (unsigned long)l.end, (void *)c,
					       c_exp);
				if (l.start <= (uintptr_t)c &&
				    l.end > (uintptr_t)c)
					c_avail = l.end - (uintptr_t)c;
			} else {
				report(T_C, "arena mapping [%#lx, %#lx) has "
				       "perms %s", (unsigned long)l.start,
				       (unsigned long)l.end, l.perms);
			}
			pos = l.end;
		}
		if (pos < hi)
			report(T_C, "arena hole [%#lx, %#lx)",
			       (unsigned long)pos, (unsigned long)hi);
		if (rw != 1)
			report(T_C, "%d rw-p mappings in the arena, expected 1 "
			       "(C)", rw);
	}
	if (c_avail > c_exp)
		c_avail = c_exp;

	/* contents */
	if (a_ok) {
		uint8_t *sh = xmalloc(a_size);

		checked_a = compare_region(T_A, &m.A, a, sh, a_pages);
		free(sh);
	}
	if (b_cmp) {
		uint8_t *sh = xmalloc(B_SIZE);

		checked_b = compare_region(T_B, &m.B, b, sh, b_pages);
		free(sh);
	}
	if (c_avail) {
		uint8_t *sh = xmalloc(C_BIG);

		checked_c = compare_region(T_C, &m.C, c, sh, c_avail / ps);
		free(sh);
	}

#ifdef CHAIN_WRITER_TIMING
	t1 = zdtm_now_ns();
	fprintf(stderr, "timing: %s pid %d: counter %llu in %.3f s (%.0f "
		"iterations/s), check %.1f ms\n", is_child ? "child" : "parent",
		(int)getpid(), (unsigned long long)n,
		(t0 - t_ready) / 1e9, n / ((t0 - t_ready) / 1e9),
		(t1 - t0) / 1e6);
#endif

	if (!report_bits)
		return;
	len = snprintf(detail, sizeof(detail),
		       "detail: %s pid %d: counter %llu (FORK_AT %llu), "
		       "checked A %zu/%zu pages, B %s %zu pages, C %zu KiB in "
		       "slot %d: %zu pages\n",
		       is_child ? "child" : "parent", (int)getpid(),
		       (unsigned long long)n, (unsigned long long)fork_at,
		       checked_a, a_pages,
		       m.b_mapped ? "mapped" : "unmapped", checked_b,
		       c_exp / 1024, m.c_slot, checked_c);
	if (len > (int)sizeof(detail) - 1)
		len = sizeof(detail) - 1;
	if (is_child) {
		if (write(2, detail, len) < 0) {
			/* nothing else to do */
		}
	} else {
		fputs(detail, stdout);
	}
}

/* Self-test only: back to a consistent iteration-0 state, counter 0. */
static void selftest_reset(void)
{
	if (c_size == C_BIG && c_shrink())
		return;
	if (c_slot != 0) {
		uint8_t *old = c;

		if (mremap(c, C_SMALL, C_SMALL, MREMAP_MAYMOVE | MREMAP_FIXED,
			   slot_addr(0)) != slot_addr(0))
			return;
		c = slot_addr(0);
		c_slot = 0;
		if (reserve(old, C_SMALL))
			return;
	}
	zdtm_fill(c, C_SMALL, SEED_C);
	if (b)
		zdtm_fill(b, B_SIZE, SEED_B);
	else if (b_map(SEED_B))
		return;
	zdtm_fill(a, a_size, SEED_A);
	counter = 0;
}

/* ------------------------------------------------------------------ */

static void check_child(void)
{
	int st, bit, code;

	if (zdtm_wait_deadline(child_pid, &st, DEADLINE_S * 1000)) {
		zdtm_fail("child", "waitpid(child %d): %s", (int)child_pid,
			  strerror(errno));
		kill(child_pid, SIGKILL);
		return;
	}
	if (!WIFEXITED(st)) {
		zdtm_fail("child", "child (pid %d) killed by signal %d",
			  (int)child_pid, WIFSIGNALED(st) ? WTERMSIG(st) : -1);
		return;
	}
	code = WEXITSTATUS(st);
	for (bit = 0; bit < T_N; bit++)
		if (code & (1 << bit))
			zdtm_fail(tags_child[bit], "child (pid %d) exited with "
				  "status %#x (details on stderr)",
				  (int)child_pid, code);
	if (code & ~((1 << T_N) - 1))
		zdtm_fail("child", "child (pid %d) exited with unexpected "
			  "status %d", (int)child_pid, code);
}

static unsigned long long parse_arg(const char *s, const char *what,
				    unsigned long long max)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (*s == '-' || *end || errno || v > max) {
		fprintf(stderr, "bad %s '%s'\n", what, s);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	unsigned long long size_mib = 64;
	void *p;

	zdtm_init(argc, argv, 3, "[SIZE_MIB] [FORK_AT] [CHURN]");
	if (argc > 2)
		size_mib = parse_arg(argv[2], "SIZE_MIB", 65536);
	if (size_mib == 0) {
		fprintf(stderr, "bad SIZE_MIB '%s'\n", argv[2]);
		return 2;
	}
	if (argc > 3)
		fork_at = parse_arg(argv[3], "FORK_AT", MAX_COUNTER);
	if (argc > 4)
		churn = (int)parse_arg(argv[4], "CHURN", 1);

	ps = (size_t)sysconf(_SC_PAGESIZE);
	if (ps < 4096 || ZAP_SIZE % ps)
		zdtm_die("unsupported page size %zu", ps);
	a_size = (size_t)size_mib * MIB;
	a_pages = a_size / ps;
	a_writes = a_pages / 100 ? a_pages / 100 : 1;
	a_slices = a_size / ZAP_SIZE;
	b_pages = B_SIZE / ps;

	/* A: 2 MiB aligned, MADV_HUGEPAGE (THP where the kernel gives them) */
	if (size_mib >= 4) {
		uint8_t *raw = mmap(NULL, a_size + HUGE_SIZE,
				    PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		size_t head;

		if (raw == MAP_FAILED)
			zdtm_die("mmap A (%zu bytes)", a_size + HUGE_SIZE);
		head = (HUGE_SIZE - (uintptr_t)raw % HUGE_SIZE) % HUGE_SIZE;
		if (head && munmap(raw, head))
			zdtm_die("munmap A head");
		if (HUGE_SIZE - head &&
		    munmap(raw + head + a_size, HUGE_SIZE - head))
			zdtm_die("munmap A tail");
		a = raw + head;
		(void)madvise(a, a_size, MADV_HUGEPAGE);
	} else {
		a = mmap(NULL, a_size, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (a == MAP_FAILED)
			zdtm_die("mmap A (%zu bytes)", a_size);
	}
	zdtm_fill(a, a_size, SEED_A);

	if (b_map(SEED_B))
		zdtm_die("mmap B");

	p = mmap(NULL, ARENA_SIZE, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		zdtm_die("mmap arena");
	arena = p;
	p = mmap(slot_addr(0), C_SMALL, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	if (p != slot_addr(0))
		zdtm_die("mmap C");
	c = p;
	c_size = C_SMALL;
	c_slot = 0;
	zdtm_fill(c, C_SMALL, SEED_C);

	zdtm_ready();
#ifdef CHAIN_WRITER_TIMING
	t_ready = zdtm_now_ns();
#endif

	/* at least one iteration, then until SIGTERM (checked only here) */
	while (!zdtm_stop || (counter == 0 && loop_err_bit < 0)) {
		uint64_t next = counter + 1;

		if (is_child && getppid() != parent_pid)
			break; /* orphaned: check and exit */
		if (loop_err_bit >= 0) {
			zdtm_msleep(10);
			continue;
		}
		if (!is_child && next == fork_at && !child_pid && !fork_errno) {
			pid_t pid;

			fflush(stdout);
			parent_pid = getpid();
			pid = fork();
			if (pid < 0) {
				fork_errno = errno ? errno : EAGAIN;
			} else if (pid == 0) {
				is_child = 1;
				role = 1;
			} else {
				child_pid = pid;
			}
		}
		if (iterate(next) == 0) {
			/* every step of the iteration is done before this */
			__asm__ __volatile__("" ::: "memory");
			counter = next;
		}
		zdtm_usleep(SLEEP_US);
	}

	if (is_child) {
		ZDTM_CORRUPT("child-counter", selftest_reset());
		ZDTM_CORRUPT("child-A", a[a_size / 5 + 3] ^= 0x02);
		ZDTM_CORRUPT("child-B", (void)munmap(b, B_SIZE)); /* b kept */
		ZDTM_CORRUPT("child-C", (void)mremap(c, c_size, C_SMALL / 2, 0));
		verify();
		_exit(report_bits);
	}

	/* ---------------- verification (parent) ---------------- */
	if (child_pid > 0 && kill(child_pid, SIGTERM))
		zdtm_fail("child", "kill(child %d, SIGTERM): %s",
			  (int)child_pid, strerror(errno));

	ZDTM_CORRUPT("counter", selftest_reset());
	ZDTM_CORRUPT("A", a[a_size / 3 + 17] ^= 0x40);
	ZDTM_CORRUPT("B", b[B_SIZE / 2 + 5] ^= 0x01);
	ZDTM_CORRUPT("C", c[100] ^= 0x80, c_size = C_BIG);
	if (child_pid > 0) {
		/* corrupted by the child itself, reported via its status */
		ZDTM_CORRUPT("child-counter", (void)0);
		ZDTM_CORRUPT("child-A", (void)0);
		ZDTM_CORRUPT("child-B", (void)0);
		ZDTM_CORRUPT("child-C", (void)0);
	}

	if (fork_errno)
		zdtm_fail("child", "fork at iteration %llu: %s",
			  (unsigned long long)fork_at, strerror(fork_errno));
	else if (fork_at && counter >= fork_at && child_pid <= 0)
		zdtm_fail("child", "counter %llu >= FORK_AT %llu but there is "
			  "no child", (unsigned long long)counter,
			  (unsigned long long)fork_at);

	verify();
	if (child_pid > 0)
		check_child();
	zdtm_finish();
}
