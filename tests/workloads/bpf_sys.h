/*
 * bpf_sys.h - bpf(2) called directly, for the BPF map workloads (no
 * libbpf): making a map, updating and looking up an element.
 */
#ifndef BPF_SYS_H
#define BPF_SYS_H

#include "zdtm.h"

#include <linux/bpf.h>
#include <sys/syscall.h>

static long sys_bpf(int cmd, union bpf_attr *a)
{
	return syscall(SYS_bpf, cmd, a, sizeof(*a));
}

/* A map of `type` named `name`; dies if the kernel refuses it. */
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
		zdtm_die("BPF_MAP_CREATE %s (needs CAP_BPF): %s", name, strerror(errno));
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

#endif
