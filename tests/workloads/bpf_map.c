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
 *   Each one's bpf_map_info is kept.
 * After SIGTERM (tags in brackets):
 *   [bpf-info]      type, key and value sizes, max entries, flags and name
 *                   are the kept ones (not the id: a new map);
 *   [bpf-elements]  H has exactly its 20 elements, A its 8 values;
 *   [bpf-frozen]    A refuses an update (EPERM) and says frozen in its
 *                   fdinfo; H takes one and does not.
 */
#include "zdtm.h"

#include <linux/bpf.h>
#include <sys/syscall.h>

#define SEED_H 0x6270666800ull
#define SEED_A 0x6270666100ull
#define NH 20
#define NA 8

static long sys_bpf(int cmd, union bpf_attr *a)
{
	return syscall(SYS_bpf, cmd, a, sizeof(*a));
}

static int create(__u32 type, __u32 ksz, __u32 vsz, __u32 max, __u32 flags,
		  const char *name)
{
	union bpf_attr a;
	int fd;

	memset(&a, 0, sizeof(a));
	a.map_type = type;
	a.key_size = ksz;
	a.value_size = vsz;
	a.max_entries = max;
	a.map_flags = flags;
	strncpy(a.map_name, name, sizeof(a.map_name) - 1);
	fd = (int)sys_bpf(BPF_MAP_CREATE, &a);
	if (fd < 0)
		zdtm_die("BPF_MAP_CREATE %s (needs CAP_BPF)", name);
	return fd;
}

static int update(int fd, const void *k, const void *v)
{
	union bpf_attr a;

	memset(&a, 0, sizeof(a));
	a.map_fd = (__u32)fd;
	a.key = (__u64)(unsigned long)k;
	a.value = (__u64)(unsigned long)v;
	a.flags = BPF_ANY;
	return (int)sys_bpf(BPF_MAP_UPDATE_ELEM, &a);
}

static int lookup(int fd, const void *k, void *v)
{
	union bpf_attr a;

	memset(&a, 0, sizeof(a));
	a.map_fd = (__u32)fd;
	a.key = (__u64)(unsigned long)k;
	a.value = (__u64)(unsigned long)v;
	return (int)sys_bpf(BPF_MAP_LOOKUP_ELEM, &a);
}

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

int main(int argc, char **argv)
{
	struct bpf_map_info ih, ia;
	int h, am, k, n;
	__u32 key, nk;
	__u64 v;
	unsigned char av[16], got[16];

	zdtm_init(argc, argv, 0, "");
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

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("bpf-info", ih.max_entries++);
	ZDTM_CORRUPT("bpf-elements", {
		key = 4;
		v = 0;
		update(h, &key, &v);
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
	zdtm_finish();
}
