/*
 * bpf_map.c - BPF maps must come back with their description, elements and
 * frozen state (zdtm's bpf_hash, bpf_array).
 *
 *   bpf_map PIDFILE
 *
 * Needs CAP_BPF (root). Set up before "ready", with bpf(2) directly:
 *   H  a hash map "wl_hash" (4-byte keys, 8-byte values, at most 64,
 *      BPF_F_NO_PREALLOC) with 20 elements: key 3k+1 -> pattern word k;
 *   A  an array map "wl_array" (16-byte values, 8 entries), every entry
 *      a pattern, then frozen.
 *   P  a per-CPU hash "wl_pcpu_hash" (12-byte values: 16 bytes a CPU) with
 *      6 elements, a pattern per key and CPU;
 *   PA a per-CPU array "wl_pcpu_array" (BPF_F_RDONLY_PROG), LP an LRU
 *      per-CPU hash "wl_lru_pcpu" with 3 elements;
 *   Q  a queue "wl_queue" of 10 8-byte values, S a stack "wl_stack" of 7;
 *   O  an array of maps "wl_aom": slots 0 and 2 hold I1 (an array the
 *      program also holds by fd), slot 1 I2 (held by no fd), slot 3 none;
 *      M a hash of maps "wl_hom": key 7 holds I3 (a hash held by no fd);
 *   B  a hash "wl_btf" with BTF (one INT type, id 1, for key and value);
 *   R  a hash "wl_rdonly" held only by a read-only fd (BPF_F_RDONLY),
 *      filled through another fd closed since.
 *   X  an array "wl_mmapable" made BPF_F_MMAPABLE (not mapped), 4 values.
 *   K  an empty ring buffer "wl_ringbuf" (16 KiB), U an empty user ring
 *      buffer "wl_user_ring" (8 KiB), neither mapped.
 *   Each one's bpf_map_info is kept.
 * After SIGTERM (tags in brackets):
 *   [bpf-info]      type, key and value sizes, max entries, flags and name
 *                   are the kept ones (not the id: a new map);
 *   [bpf-elements]  H has exactly its 20 elements, A its 8 values;
 *   [bpf-frozen]    A refuses an update (EPERM) and says frozen in its
 *                   fdinfo; H takes one and does not;
 *   [bpf-percpu]    every value of P, PA and LP on every possible CPU;
 *   [bpf-queue]     Q pops its 10 values oldest first, S its 7 newest
 *                   first, then both are empty and take a push again;
 *   [bpf-inner]     O's slots 0 and 2 hold the map of I1's fd (an update
 *                   through the fd is seen through the slot), slot 1 a
 *                   map "wl_in2" with I2's values, slot 3 nothing; M's
 *                   key 7 a map "wl_in3" with I3's values;
 *   [bpf-btf]       B has a BTF object with the same bytes and type ids,
 *                   and its elements;
 *   [bpf-access]    R's fd is read-only (an update fails with EPERM) and
 *                   R has its elements;
 *   [bpf-elements]  X has its 4 values (and its flags: [bpf-info]);
 *   [bpf-ring]      K and U, mapped now, have equal consumer and producer
 *                   positions (empty).
 */
#include "bpf_sys.h"

#include <linux/bpf.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#define SEED_H 0x6270666800ull
#define SEED_A 0x6270666100ull
#define NH 20
#define NA 8
#define SEED_P 0x6270667000ull
#define SEED_Q 0x6270667100ull
#define SEED_I 0x6270666900ull
#define NP 6
#define NQ 10
#define NS 7
/* The most possible CPUs this workload handles. */
#define MAX_CPUS 256

static int next_key(int fd, const void *k, void *next)
{
	union bpf_attr a;

	memset(&a, 0, sizeof(a));
	a.map_fd = (__u32)fd;
	a.key = (__u64)(unsigned long)k;
	a.next_key = (__u64)(unsigned long)next;
	return (int)sys_bpf(BPF_MAP_GET_NEXT_KEY, &a);
}

static void info_of(int fd, struct bpf_map_info *i)
{
	union bpf_attr a;

	memset(i, 0, sizeof(*i));
	memset(&a, 0, sizeof(a));
	a.info.bpf_fd = (__u32)fd;
	a.info.info_len = sizeof(*i);
	a.info.info = (__u64)(unsigned long)i;
	if (sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &a))
		zdtm_die("BPF_OBJ_GET_INFO_BY_FD");
}

static int fdinfo_frozen(int fd)
{
	char info[4096];

	if (zdtm_fdinfo(fd, info, sizeof(info)) < 0)
		return -1;
	return strstr(info, "frozen:\t1") != NULL;
}

static void check_info(int fd, const struct bpf_map_info *want, const char *what)
{
	struct bpf_map_info i;

	info_of(fd, &i);
	zdtm_check(i.type == want->type && i.key_size == want->key_size &&
			   i.value_size == want->value_size &&
			   i.max_entries == want->max_entries &&
			   i.map_flags == want->map_flags &&
			   !strncmp(i.name, want->name, sizeof(i.name)),
		   "bpf-info",
		   "%s: type %u key %u value %u max %u flags %#x name %.16s, expected "
		   "%u %u %u %u %#x %.16s",
		   what, i.type, i.key_size, i.value_size, i.max_entries, i.map_flags, i.name,
		   want->type, want->key_size, want->value_size, want->max_entries,
		   want->map_flags, want->name);
}

static int ncpus;

/* Possible CPUs (/sys/devices/system/cpu/possible: "0-3"), the values of a
 * per-CPU map's element. */
static int possible_cpus(void)
{
	char buf[256], *p;
	ssize_t n;
	int fd = open("/sys/devices/system/cpu/possible", O_RDONLY);

	if (fd < 0)
		zdtm_die("open /sys/devices/system/cpu/possible");
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		zdtm_die("read possible CPUs");
	buf[n] = 0;
	p = buf + strlen(buf);
	while (p > buf && (p[-1] < '0' || p[-1] > '9'))
		*--p = 0;
	while (p > buf && p[-1] >= '0' && p[-1] <= '9')
		p--;
	n = atoi(p) + 1;
	if (n > MAX_CPUS)
		zdtm_die("%d possible CPUs, at most %d handled", (int)n, MAX_CPUS);
	return (int)n;
}

static int create_full(union bpf_attr *a, const char *name)
{
	int fd;

	strncpy(a->map_name, name, sizeof(a->map_name) - 1);
	fd = (int)sys_bpf(BPF_MAP_CREATE, a);
	if (fd < 0)
		zdtm_die("BPF_MAP_CREATE %s", name);
	return fd;
}

static int by_id(__u32 id, __u32 flags)
{
	union bpf_attr a;

	memset(&a, 0, sizeof(a));
	a.map_id = id;
	a.open_flags = flags;
	return (int)sys_bpf(BPF_MAP_GET_FD_BY_ID, &a);
}

static int pop(int fd, void *v)
{
	union bpf_attr a;

	memset(&a, 0, sizeof(a));
	a.map_fd = (__u32)fd;
	a.value = (__u64)(unsigned long)v;
	return (int)sys_bpf(BPF_MAP_LOOKUP_AND_DELETE_ELEM, &a);
}

/* A per-CPU value of `vsz` bytes for key index k: a pattern per CPU, each
 * in its 8-byte-rounded slot, padding zero. */
static void pcpu_value(unsigned char *buf, __u32 vsz, __u64 seed, int k)
{
	__u32 stride = (vsz + 7) & ~7u;

	memset(buf, 0, (size_t)stride * ncpus);
	for (int c = 0; c < ncpus; c++)
		zdtm_fill(buf + (size_t)stride * c, vsz, seed + (__u64)k * MAX_CPUS + c);
}

static void check_pcpu(int fd, __u32 key, __u32 vsz, __u64 seed, int k, const char *what)
{
	static unsigned char want[16 * MAX_CPUS], got[16 * MAX_CPUS];
	__u32 stride = (vsz + 7) & ~7u;

	pcpu_value(want, vsz, seed, k);
	memset(got, 0xee, sizeof(got));
	if (!zdtm_check(lookup(fd, &key, got) == 0, "bpf-percpu", "%s: key %u: %s", what, key,
			strerror(errno)))
		return;
	for (int c = 0; c < ncpus; c++)
		zdtm_check(!memcmp(got + (size_t)stride * c, want + (size_t)stride * c, vsz),
			   "bpf-percpu", "%s: key %u differs on CPU %d", what, key, c);
}

/* Raw BTF: one type, "int" (id 1), a signed 32-bit INT. */
static const struct {
	__u16 magic;
	__u8 version, flags;
	__u32 hdr_len, type_off, type_len, str_off, str_len;
	__u32 name_off, info, size, enc;
	char strings[5];
} __attribute__((packed)) btf_raw = {
	0xeB9F, 1, 0, 24, 0, 16, 16, 5,
	1, 1u << 24 /* BTF_KIND_INT */, 4, (1u << 24) | 32 /* signed, 32 bits */,
	"\0int",
};

static int btf_load(void)
{
	union bpf_attr a;
	int fd;

	memset(&a, 0, sizeof(a));
	a.btf = (__u64)(unsigned long)&btf_raw;
	a.btf_size = sizeof(btf_raw);
	fd = (int)sys_bpf(BPF_BTF_LOAD, &a);
	if (fd < 0)
		zdtm_die("BPF_BTF_LOAD");
	return fd;
}

/* The raw data of BTF object `id` into buf (its size, or -1). */
static int btf_bytes(__u32 id, void *buf, __u32 size)
{
	union bpf_attr a;
	struct bpf_btf_info bi;
	int fd, r;

	memset(&a, 0, sizeof(a));
	a.btf_id = id;
	fd = (int)sys_bpf(BPF_BTF_GET_FD_BY_ID, &a);
	if (fd < 0)
		return -1;
	memset(&bi, 0, sizeof(bi));
	bi.btf = (__u64)(unsigned long)buf;
	bi.btf_size = size;
	memset(&a, 0, sizeof(a));
	a.info.bpf_fd = (__u32)fd;
	a.info.info_len = sizeof(bi);
	a.info.info = (__u64)(unsigned long)&bi;
	r = (int)sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &a);
	close(fd);
	return r ? -1 : (int)bi.btf_size;
}

/* The 4 values of an inner array/hash map made with seed `seed`. */
static void check_inner(int fd, const char *name, __u64 seed, int keys_step, const char *what)
{
	struct bpf_map_info i;
	__u32 key;
	__u64 v;

	info_of(fd, &i);
	zdtm_check(!strncmp(i.name, name, sizeof(i.name)), "bpf-inner", "%s: named %.16s, not %s",
		   what, i.name, name);
	for (int k = 0; k < 4; k++) {
		key = (__u32)(k * keys_step);
		v = 0;
		zdtm_check(lookup(fd, &key, &v) == 0 && v == zdtm_pat_word(seed, k), "bpf-inner",
			   "%s: key %u: %#llx", what, key, (unsigned long long)v);
	}
}

static int inner_map(__u32 type, const char *name, __u64 seed, int keys_step)
{
	int fd = create(type, 4, 8, 4, 0, name);
	__u32 key;
	__u64 v;

	for (int k = 0; k < 4; k++) {
		key = (__u32)(k * keys_step);
		v = zdtm_pat_word(seed, k);
		if (update(fd, &key, &v))
			zdtm_die("update %s", name);
	}
	return fd;
}

/* A ring buffer's consumer and producer positions (its first two pages)
 * are equal. `user`: a user ring buffer, whose consumer page is the
 * kernel's. */
static void check_ring_empty(int fd, const char *what, int user)
{
	long page = sysconf(_SC_PAGESIZE);
	volatile __u64 *c = mmap(NULL, (size_t)page, PROT_READ, MAP_SHARED, fd, 0);
	volatile __u64 *pr = mmap(NULL, (size_t)page, PROT_READ, MAP_SHARED, fd, page);

	if (!zdtm_check(c != MAP_FAILED && pr != MAP_FAILED, "bpf-ring", "%s: mmap: %s", what,
			strerror(errno)))
		return;
	zdtm_check(*c == *pr, "bpf-ring", "%s%s: consumer %llu, producer %llu", what,
		   user ? " (user)" : "", (unsigned long long)*c, (unsigned long long)*pr);
	munmap((void *)c, (size_t)page);
	munmap((void *)pr, (size_t)page);
}

static __u32 slot_id(int outer, __u32 key)
{
	__u32 id = 0;

	return lookup(outer, &key, &id) ? 0 : id;
}

int main(int argc, char **argv)
{
	struct bpf_map_info ih, ia, ip, ipa, ilp, iq, is, io, im, ib, ir, ix, ik, iu;
	int h, am, k, n, p, pa, lp, q, st, i1, i2, i3, o, mm, b, r, btf, w, x, kr, ur;
	__u32 key, nk, id1, id2;
	__u64 v;
	unsigned char av[16], got[16];
	static unsigned char pv[16 * MAX_CPUS], bb[256];
	int accmode = O_RDONLY;

	zdtm_init(argc, argv, 0, "");
	ncpus = possible_cpus();
	h = create(BPF_MAP_TYPE_HASH, 4, 8, 64, BPF_F_NO_PREALLOC, "wl_hash");
	am = create(BPF_MAP_TYPE_ARRAY, 4, 16, NA, 0, "wl_array");
	for (k = 0; k < NH; k++) {
		key = 3 * k + 1;
		v = zdtm_pat_word(SEED_H, k);
		if (update(h, &key, &v))
			zdtm_die("update H");
	}
	for (k = 0; k < NA; k++) {
		key = k;
		zdtm_fill(av, sizeof(av), SEED_A + k);
		if (update(am, &key, av))
			zdtm_die("update A");
	}
	{
		union bpf_attr a;

		memset(&a, 0, sizeof(a));
		a.map_fd = (__u32)am;
		if (sys_bpf(BPF_MAP_FREEZE, &a))
			zdtm_die("BPF_MAP_FREEZE");
	}
	info_of(h, &ih);
	info_of(am, &ia);

	/* Per-CPU maps. */
	p = create(BPF_MAP_TYPE_PERCPU_HASH, 4, 12, 16, 0, "wl_pcpu_hash");
	pa = create(BPF_MAP_TYPE_PERCPU_ARRAY, 4, 8, 4, BPF_F_RDONLY_PROG, "wl_pcpu_array");
	lp = create(BPF_MAP_TYPE_LRU_PERCPU_HASH, 4, 4, 16, 0, "wl_lru_pcpu");
	for (k = 0; k < NP; k++) {
		key = 5 * k + 2;
		pcpu_value(pv, 12, SEED_P, k);
		if (update(p, &key, pv))
			zdtm_die("update P");
	}
	for (k = 0; k < 4; k++) {
		key = k;
		pcpu_value(pv, 8, SEED_P + 1, k);
		if (update(pa, &key, pv))
			zdtm_die("update PA");
	}
	for (k = 0; k < 3; k++) {
		key = 100 + k;
		pcpu_value(pv, 4, SEED_P + 2, k);
		if (update(lp, &key, pv))
			zdtm_die("update LP");
	}
	/* A queue and a stack. */
	q = create(BPF_MAP_TYPE_QUEUE, 0, 8, 16, 0, "wl_queue");
	st = create(BPF_MAP_TYPE_STACK, 0, 8, 16, 0, "wl_stack");
	for (k = 0; k < NQ; k++) {
		v = zdtm_pat_word(SEED_Q, k);
		if (update(q, NULL, &v))
			zdtm_die("push Q");
	}
	for (k = 0; k < NS; k++) {
		v = zdtm_pat_word(SEED_Q + 1, k);
		if (update(st, NULL, &v))
			zdtm_die("push S");
	}
	/* Maps of maps. */
	i1 = inner_map(BPF_MAP_TYPE_ARRAY, "wl_in1", SEED_I, 1);
	i2 = inner_map(BPF_MAP_TYPE_ARRAY, "wl_in2", SEED_I + 1, 1);
	i3 = inner_map(BPF_MAP_TYPE_HASH, "wl_in3", SEED_I + 2, 11);
	{
		union bpf_attr a;

		memset(&a, 0, sizeof(a));
		a.map_type = BPF_MAP_TYPE_ARRAY_OF_MAPS;
		a.key_size = 4;
		a.value_size = 4;
		a.max_entries = 4;
		a.inner_map_fd = (__u32)i1;
		o = create_full(&a, "wl_aom");
		a.map_type = BPF_MAP_TYPE_HASH_OF_MAPS;
		a.max_entries = 8;
		a.inner_map_fd = (__u32)i3;
		mm = create_full(&a, "wl_hom");
	}
	key = 0;
	if (update(o, &key, &i1))
		zdtm_die("update O 0");
	key = 1;
	if (update(o, &key, &i2))
		zdtm_die("update O 1");
	key = 2;
	if (update(o, &key, &i1))
		zdtm_die("update O 2");
	key = 7;
	if (update(mm, &key, &i3))
		zdtm_die("update M");
	close(i2);
	close(i3);
	/* A map with BTF. */
	btf = btf_load();
	{
		union bpf_attr a;

		memset(&a, 0, sizeof(a));
		a.map_type = BPF_MAP_TYPE_HASH;
		a.key_size = 4;
		a.value_size = 4;
		a.max_entries = 8;
		a.btf_fd = (__u32)btf;
		a.btf_key_type_id = 1;
		a.btf_value_type_id = 1;
		b = create_full(&a, "wl_btf");
	}
	close(btf);
	for (k = 0; k < 5; k++) {
		__u32 val = (__u32)zdtm_pat_word(SEED_I + 3, k);

		key = k * k;
		if (update(b, &key, &val))
			zdtm_die("update B");
	}
	/* A map held by a read-only fd only. */
	r = create(BPF_MAP_TYPE_HASH, 4, 8, 8, BPF_F_RDONLY, "wl_rdonly");
	info_of(r, &ir);
	w = by_id(ir.id, 0);
	if (w < 0)
		zdtm_die("BPF_MAP_GET_FD_BY_ID wl_rdonly");
	for (k = 0; k < 3; k++) {
		key = 40 + k;
		v = zdtm_pat_word(SEED_I + 4, k);
		if (update(w, &key, &v))
			zdtm_die("update R");
	}
	close(w);
	x = create(BPF_MAP_TYPE_ARRAY, 4, 8, 4, BPF_F_MMAPABLE, "wl_mmapable");
	for (k = 0; k < 4; k++) {
		key = k;
		v = zdtm_pat_word(SEED_I + 5, k);
		if (update(x, &key, &v))
			zdtm_die("update X");
	}
	info_of(x, &ix);
	kr = create(BPF_MAP_TYPE_RINGBUF, 0, 0, 16384, 0, "wl_ringbuf");
	ur = create(BPF_MAP_TYPE_USER_RINGBUF, 0, 0, 8192, 0, "wl_user_ring");
	info_of(kr, &ik);
	info_of(ur, &iu);
	info_of(p, &ip);
	info_of(pa, &ipa);
	info_of(lp, &ilp);
	info_of(q, &iq);
	info_of(st, &is);
	info_of(o, &io);
	info_of(mm, &im);
	info_of(b, &ib);

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("bpf-info", ih.max_entries++);
	ZDTM_CORRUPT("bpf-elements", {
		key = 4;
		v = 0;
		update(h, &key, &v);
	});
	ZDTM_CORRUPT("bpf-percpu", {
		key = 2;
		pcpu_value(pv, 12, SEED_P, 5);
		update(p, &key, pv);
	});
	ZDTM_CORRUPT("bpf-queue", pop(q, &v));
	ZDTM_CORRUPT("bpf-inner", {
		union bpf_attr a;

		key = 2;
		memset(&a, 0, sizeof(a));
		a.map_fd = (__u32)o;
		a.key = (__u64)(unsigned long)&key;
		sys_bpf(BPF_MAP_DELETE_ELEM, &a);
	});
	ZDTM_CORRUPT("bpf-frozen", {
		union bpf_attr a;

		memset(&a, 0, sizeof(a));
		a.map_fd = (__u32)h;
		sys_bpf(BPF_MAP_FREEZE, &a);
	});

	check_info(h, &ih, "H");
	check_info(am, &ia, "A");

	/* H: exactly its 20 elements */
	n = 0;
	for (int first = 1;; first = 0) {
		if (next_key(h, first ? NULL : &key, &nk))
			break;
		key = nk;
		n++;
		if (!zdtm_check(key % 3 == 1 && key / 3 < NH, "bpf-elements",
				"H: unexpected key %u", key))
			continue;
		v = 0;
		zdtm_check(lookup(h, &key, &v) == 0 && v == zdtm_pat_word(SEED_H, key / 3),
			   "bpf-elements", "H: key %u: value %#llx", key,
			   (unsigned long long)v);
	}
	zdtm_check(n == NH, "bpf-elements", "H: %d elements, expected %d", n, NH);
	for (k = 0; k < NA; k++) {
		key = k;
		zdtm_fill(av, sizeof(av), SEED_A + k);
		memset(got, 0, sizeof(got));
		zdtm_check(lookup(am, &key, got) == 0 && !memcmp(got, av, sizeof(av)),
			   "bpf-elements", "A: entry %d differs", k);
	}

	key = 0;
	memset(av, 0, sizeof(av));
	zdtm_check(update(am, &key, av) < 0 && errno == EPERM && fdinfo_frozen(am) == 1,
		   "bpf-frozen", "A: not frozen (update %s, fdinfo %d)",
		   strerror(errno), fdinfo_frozen(am));
	key = 1000;
	v = 1;
	zdtm_check(fdinfo_frozen(h) == 0 && update(h, &key, &v) == 0, "bpf-frozen",
		   "H: frozen (fdinfo %d, update %s)", fdinfo_frozen(h), strerror(errno));

	check_info(p, &ip, "P");
	check_info(pa, &ipa, "PA");
	check_info(lp, &ilp, "LP");
	check_info(q, &iq, "Q");
	check_info(st, &is, "S");
	check_info(o, &io, "O");
	check_info(mm, &im, "M");
	check_info(b, &ib, "B");
	check_info(r, &ir, "R");
	check_info(x, &ix, "X");
	check_info(kr, &ik, "K");
	check_info(ur, &iu, "U");
	ZDTM_CORRUPT("bpf-ring", {
		/* A user ring buffer's producer page is the program's to write. */
		long pg = sysconf(_SC_PAGESIZE);
		__u64 *prod = mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_SHARED, ur, pg);

		if (prod != MAP_FAILED)
			*prod += 8;
	});
	check_ring_empty(kr, "K", 0);
	check_ring_empty(ur, "U", 1);
	for (k = 0; k < 4; k++) {
		key = k;
		v = 0;
		zdtm_check(lookup(x, &key, &v) == 0 && v == zdtm_pat_word(SEED_I + 5, k),
			   "bpf-elements", "X: entry %d: %#llx", k, (unsigned long long)v);
	}

	/* [bpf-percpu] */
	for (k = 0; k < NP; k++)
		check_pcpu(p, 5 * k + 2, 12, SEED_P, k, "P");
	for (k = 0; k < 4; k++)
		check_pcpu(pa, k, 8, SEED_P + 1, k, "PA");
	for (k = 0; k < 3; k++)
		check_pcpu(lp, 100 + k, 4, SEED_P + 2, k, "LP");
	key = 1000;
	pcpu_value(pv, 12, SEED_P, 99);
	zdtm_check(update(p, &key, pv) == 0, "bpf-percpu", "P: update: %s", strerror(errno));
	check_pcpu(p, 1000, 12, SEED_P, 99, "P (updated after restore)");

	/* [bpf-queue] */
	for (k = 0; k < NQ; k++) {
		v = 0;
		zdtm_check(pop(q, &v) == 0 && v == zdtm_pat_word(SEED_Q, k), "bpf-queue",
			   "Q: pop %d: %#llx (%s)", k, (unsigned long long)v, strerror(errno));
	}
	zdtm_check(pop(q, &v) < 0 && errno == ENOENT, "bpf-queue", "Q: more than %d values", NQ);
	for (k = NS - 1; k >= 0; k--) {
		v = 0;
		zdtm_check(pop(st, &v) == 0 && v == zdtm_pat_word(SEED_Q + 1, k), "bpf-queue",
			   "S: pop %d: %#llx (%s)", k, (unsigned long long)v, strerror(errno));
	}
	zdtm_check(pop(st, &v) < 0 && errno == ENOENT, "bpf-queue", "S: more than %d values", NS);
	v = 0x1234;
	zdtm_check(update(q, NULL, &v) == 0 && pop(q, &v) == 0 && v == 0x1234, "bpf-queue",
		   "Q: push then pop after restore");

	/* [bpf-inner] */
	{
		struct bpf_map_info i;
		int f;

		info_of(i1, &i);
		id1 = slot_id(o, 0);
		id2 = slot_id(o, 1);
		zdtm_check(id1 == i.id && slot_id(o, 2) == i.id, "bpf-inner",
			   "O: slots 0 and 2 hold maps %u and %u, I1's fd map %u", id1,
			   slot_id(o, 2), i.id);
		zdtm_check(id2 != 0 && id2 != i.id, "bpf-inner", "O: slot 1 holds map %u", id2);
		zdtm_check(slot_id(o, 3) == 0 && errno == ENOENT, "bpf-inner",
			   "O: slot 3 holds a map");
		check_inner(i1, "wl_in1", SEED_I, 1, "I1");
		f = by_id(id2, 0);
		if (zdtm_check(f >= 0, "bpf-inner", "O: slot 1's map %u: %s", id2, strerror(errno))) {
			check_inner(f, "wl_in2", SEED_I + 1, 1, "I2");
			close(f);
		}
		key = 7;
		f = by_id(slot_id(mm, 7), 0);
		if (zdtm_check(f >= 0, "bpf-inner", "M: key 7's map: %s", strerror(errno))) {
			check_inner(f, "wl_in3", SEED_I + 2, 11, "I3");
			close(f);
		}
		/* An update through I1's fd is seen through slot 0. */
		key = 3;
		v = 0xfeed;
		f = by_id(id1, 0);
		zdtm_check(update(i1, &key, &v) == 0 && f >= 0 && lookup(f, &key, &v) == 0 &&
				   v == 0xfeed,
			   "bpf-inner", "O: slot 0 does not see I1's update");
		if (f >= 0)
			close(f);
	}

	/* [bpf-btf] */
	{
		struct bpf_map_info i;
		int len;

		info_of(b, &i);
		ZDTM_CORRUPT("bpf-btf", ((unsigned char *)&ib.btf_value_type_id)[0] ^= 1);
		len = i.btf_id ? btf_bytes(i.btf_id, bb, sizeof(bb)) : -1;
		zdtm_check(i.btf_id != 0 && i.btf_key_type_id == 1 &&
				   i.btf_value_type_id == ib.btf_value_type_id &&
				   len == (int)sizeof(btf_raw) && !memcmp(bb, &btf_raw, sizeof(btf_raw)),
			   "bpf-btf", "B: btf %u (%d bytes), key type %u, value type %u", i.btf_id,
			   len, i.btf_key_type_id, i.btf_value_type_id);
		for (k = 0; k < 5; k++) {
			__u32 val = 0;

			key = k * k;
			zdtm_check(lookup(b, &key, &val) == 0 &&
					   val == (__u32)zdtm_pat_word(SEED_I + 3, k),
				   "bpf-btf", "B: key %u: %#x", key, val);
		}
	}

	/* [bpf-access] */
	ZDTM_CORRUPT("bpf-access", accmode = O_RDWR);
	key = 40;
	v = 0;
	zdtm_check((fcntl(r, F_GETFL) & O_ACCMODE) == accmode && update(r, &key, &v) < 0 &&
			   errno == EPERM,
		   "bpf-access", "R: fd flags %#x, update %s", fcntl(r, F_GETFL),
		   strerror(errno));
	for (k = 0; k < 3; k++) {
		key = 40 + k;
		v = 0;
		zdtm_check(lookup(r, &key, &v) == 0 && v == zdtm_pat_word(SEED_I + 4, k),
			   "bpf-access", "R: key %u: %#llx", key, (unsigned long long)v);
	}
	zdtm_finish();
}
