//! The `bpf(2)` system call's commands and attribute layouts for BPF maps
//! (include/uapi/linux/bpf.h): creating one, reading and writing its
//! elements, its `bpf_map_info`, freezing it, opening one by id; BTF
//! objects (`bpf_btf_info`, loading one).
//!
//! Each layout is the prefix of the kernel's `union bpf_attr` member (or of
//! `struct bpf_map_info`) that Stasis uses: the kernel takes the size
//! passed with the command and zero-fills (or checks zero) the rest.

use core::mem::size_of;

pub const BPF_MAP_CREATE: i32 = 0;
pub const BPF_MAP_LOOKUP_ELEM: i32 = 1;
pub const BPF_MAP_UPDATE_ELEM: i32 = 2;
pub const BPF_MAP_GET_NEXT_KEY: i32 = 4;
pub const BPF_PROG_GET_FD_BY_ID: i32 = 13;
pub const BPF_MAP_GET_FD_BY_ID: i32 = 14;
pub const BPF_OBJ_GET_INFO_BY_FD: i32 = 15;
pub const BPF_BTF_LOAD: i32 = 18;
pub const BPF_BTF_GET_FD_BY_ID: i32 = 19;
/// Pops a queue's or stack's next value (key NULL).
pub const BPF_MAP_LOOKUP_AND_DELETE_ELEM: i32 = 21;
pub const BPF_MAP_FREEZE: i32 = 22;

/// `enum bpf_map_type`: the types Stasis saves, and those it names when
/// it refuses one.
pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub const BPF_MAP_TYPE_PROG_ARRAY: u32 = 3;
pub const BPF_MAP_TYPE_PERF_EVENT_ARRAY: u32 = 4;
/// Per-CPU maps: a value per possible CPU, each rounded up to 8 bytes.
pub const BPF_MAP_TYPE_PERCPU_HASH: u32 = 5;
pub const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
pub const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
pub const BPF_MAP_TYPE_LRU_PERCPU_HASH: u32 = 10;
/// Maps of maps: values are inner map fds when written, ids when read.
pub const BPF_MAP_TYPE_ARRAY_OF_MAPS: u32 = 12;
pub const BPF_MAP_TYPE_HASH_OF_MAPS: u32 = 13;
pub const BPF_MAP_TYPE_QUEUE: u32 = 22;
pub const BPF_MAP_TYPE_STACK: u32 = 23;
pub const BPF_MAP_TYPE_RINGBUF: u32 = 27;
pub const BPF_MAP_TYPE_BLOOM_FILTER: u32 = 30;
pub const BPF_MAP_TYPE_USER_RINGBUF: u32 = 31;

/// `map_flags` bits.
pub const BPF_F_NO_PREALLOC: u32 = 1 << 0;
pub const BPF_F_NUMA_NODE: u32 = 1 << 2;
/// The syscall side may only read (`BPF_F_RDONLY`) or only write
/// (`BPF_F_WRONLY`) the map.
pub const BPF_F_RDONLY: u32 = 1 << 3;
pub const BPF_F_WRONLY: u32 = 1 << 4;
/// Programs may only read (or only write) the map.
pub const BPF_F_RDONLY_PROG: u32 = 1 << 7;
pub const BPF_F_WRONLY_PROG: u32 = 1 << 8;
/// Its memory is mapped in the process (an array).
pub const BPF_F_MMAPABLE: u32 = 1 << 10;
/// An inner map whose max_entries may differ from its template's.
pub const BPF_F_INNER_MAP: u32 = 1 << 12;
/// `BPF_MAP_UPDATE_ELEM` flag: create or update.
pub const BPF_ANY: u64 = 0;

/// Length of a map's name, NUL included (`BPF_OBJ_NAME_LEN`).
pub const BPF_OBJ_NAME_LEN: usize = 16;

/// `union bpf_attr` for `BPF_MAP_CREATE`, up to `map_extra`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct BpfMapCreateAttr {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub inner_map_fd: u32,
    pub numa_node: u32,
    pub map_name: [u8; BPF_OBJ_NAME_LEN],
    pub map_ifindex: u32,
    pub btf_fd: u32,
    pub btf_key_type_id: u32,
    pub btf_value_type_id: u32,
    pub btf_vmlinux_value_type_id: u32,
    pub map_extra: u64,
}
const _: () = assert!(size_of::<BpfMapCreateAttr>() == 72);

/// `union bpf_attr` for the element commands (`key`, `value` or
/// `next_key`, and `flags`: user addresses and a u64).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct BpfMapElemAttr {
    pub map_fd: u32,
    pub _pad: u32,
    pub key: u64,
    /// `value`, or `next_key` for `BPF_MAP_GET_NEXT_KEY`.
    pub value: u64,
    pub flags: u64,
}
const _: () = assert!(size_of::<BpfMapElemAttr>() == 32);

/// `union bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD` (and, its first word
/// only, `BPF_MAP_FREEZE`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct BpfInfoAttr {
    pub bpf_fd: u32,
    pub info_len: u32,
    pub info: u64,
}
const _: () = assert!(size_of::<BpfInfoAttr>() == 16);

/// `struct bpf_map_info`, up to `map_extra`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct BpfMapInfo {
    pub map_type: u32,
    pub id: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub name: [u8; BPF_OBJ_NAME_LEN],
    pub ifindex: u32,
    pub btf_vmlinux_value_type_id: u32,
    pub netns_dev: u64,
    pub netns_ino: u64,
    pub btf_id: u32,
    pub btf_key_type_id: u32,
    pub btf_value_type_id: u32,
    pub btf_vmlinux_id: u32,
    pub map_extra: u64,
}
const _: () = assert!(size_of::<BpfMapInfo>() == 88);

/// `union bpf_attr` for the `*_GET_FD_BY_ID` commands.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct BpfGetIdAttr {
    pub id: u32,
    pub next_id: u32,
    /// `BPF_F_RDONLY` / `BPF_F_WRONLY`: the access of the new fd.
    pub open_flags: u32,
}
const _: () = assert!(size_of::<BpfGetIdAttr>() == 12);

/// `union bpf_attr` for `BPF_BTF_LOAD`, up to `btf_log_level`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct BpfBtfLoadAttr {
    pub btf: u64,
    pub btf_log_buf: u64,
    pub btf_size: u32,
    pub btf_log_size: u32,
    pub btf_log_level: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<BpfBtfLoadAttr>() == 32);

/// `struct bpf_btf_info`, up to `kernel_btf`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct BpfBtfInfo {
    /// User address the raw BTF data is copied to.
    pub btf: u64,
    pub btf_size: u32,
    pub id: u32,
    pub name: u64,
    pub name_len: u32,
    pub kernel_btf: u32,
}
const _: () = assert!(size_of::<BpfBtfInfo>() == 32);
