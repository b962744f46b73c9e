//! BPF maps (`anon_inode:bpf-map`): hash, array and LRU hash maps, their
//! per-CPU kinds, queues, stacks and maps of maps, with their type, sizes,
//! flags, name, BTF, elements and frozen state (zdtm's bpf_hash,
//! bpf_array).
//!
//! **Save.** From a fd of our own on the map (`BPF_MAP_GET_FD_BY_ID`, so a
//! read-only or write-only fd of the program's is read too; a copy of its
//! fd without CAP_SYS_ADMIN): `bpf_map_info`, every element
//! (`BPF_MAP_GET_NEXT_KEY`, `BPF_MAP_LOOKUP_ELEM`) and, from fdinfo,
//! whether it is frozen.
//! - Per-CPU maps: a value per possible CPU (each rounded up to 8 bytes),
//!   restored only on a host with as many possible CPUs.
//! - Queues and stacks have no keys: every value is popped
//!   (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`) and pushed back at once, so the
//!   map is as it was; the image keeps them in pop order. A frozen one
//!   cannot be popped: only an empty one is saved.
//! - Maps of maps: a value reads as the id of the inner map, which is
//!   saved as a map of the image (once, however many slots or fds hold
//!   it). The kernel does not tell the inner map an outer one was made
//!   with: an empty map of maps is refused; a filled one is made again
//!   with its first inner map as the template.
//! - BTF: the map's BTF object, its raw data read by id
//!   (`BPF_BTF_GET_FD_BY_ID`, `bpf_btf_info`), loaded again
//!   (`BPF_BTF_LOAD`) with the same key and value type ids. Values holding
//!   kernel objects (timers, work queues, kptrs, lists, trees, refcounts)
//!   cannot be read back and are refused, as are struct_ops maps.
//!
//! - An array made mappable (`BPF_F_MMAPABLE`) is read and written through
//!   the syscall side like any other; the areas of the process mapping it
//!   (`VmaKind::BpfMap`, found by `stasis_capture::collect`) are mapped
//!   again from the process's fd on the made map at restore
//!   (`stasis_restore::build::map_socket_rings`).
//!
//! - A ring buffer (kernel or user) that holds no record (its consumer
//!   and producer positions, read from its first two pages mapped
//!   read-only, are equal) is made again empty: a consumer that maps it
//!   reads the positions there, new ones, equal again.
//!
//! Refused by name: bloom filters (the kernel gives no way to read their
//! bits: a lookup only tests one value), ring buffers holding records
//! (only a BPF program writes records, and the positions cannot be set),
//! program arrays and other maps of kernel objects, maps bound to a
//! device.
//!
//! **Restore.** `BPF_BTF_LOAD` of its BTF, `BPF_MAP_CREATE` with the same
//! description, every element written again (pushed, in order, for a
//! queue or stack), then `BPF_MAP_FREEZE` if it was frozen; a fd that was
//! read-only or write-only is opened so by id. Every fd and map of maps
//! that held one map holds one again. An LRU map's recency order and the
//! NUMA node a map was on are not visible, so not kept. Needs CAP_BPF, and
//! CAP_SYS_ADMIN for a read-only or write-only fd (saving needs root).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use stasis_image::manifest::{BpfBtf, BpfMap, FdImage, FdKind};
use stasis_kernel::{bpf, pidfd, KernelError};
use stasis_sys::bpf as sys;

use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// A map's (key, value) pairs.
type Elements = Vec<(Vec<u8>, Vec<u8>)>;

/// Most elements saved of one map.
const ELEMENTS_MAX: usize = 1 << 20;

/// Names in a map's BTF of the kernel objects a value may hold, which a
/// lookup does not give and an update does not make (`btf_parse_fields`).
const KERNEL_FIELDS: [&str; 12] = [
    "bpf_timer",
    "bpf_wq",
    "bpf_task_work",
    "bpf_list_head",
    "bpf_list_node",
    "bpf_rb_root",
    "bpf_rb_node",
    "bpf_refcount",
    "kptr",
    "kptr_untrusted",
    "percpu_kptr",
    "uptr",
];

pub struct BpfMapFd;

impl Object for BpfMapFd {
    const NAME: &'static str = "BPF map";
    const ANON_INODE: Option<&'static str> = Some("anon_inode:bpf-map");

    fn save(_cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if Some(fd.link) != Self::ANON_INODE {
            return Ok(None);
        }
        let n = fd.fd;
        let copy = pidfd::pidfd_getfd(fd.pidfd, n)?;
        let info = bpf::map_info(copy.as_fd()).map_err(|e| {
            fd.unsupported(format!("fd {n}: reading the BPF map's description: {e}"))
        })?;
        // A fd of our own, readable and writable (popping a queue writes).
        let own = bpf::map_by_id(info.id, 0).unwrap_or(copy);
        let mut inner = Inner::default();
        let map = save_map(own.as_fd(), &info, Some(&mut inner)).map_err(|why| {
            fd.unsupported(format!("fd {n} is a BPF map {why}; stasis saves hash, array and LRU hash maps, their per-CPU kinds, queues, stacks and maps of maps"))
        })?;
        Ok(Some(FdKind::BpfMap(map)))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::BpfMap(_))
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::BpfMap(m) = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let fd = img.fd;
        let made = made_map(cx, m, fd)?;
        let access = match img.flags & libc::O_ACCMODE.unsigned_abs() {
            a if a == libc::O_RDONLY.unsigned_abs() => sys::BPF_F_RDONLY,
            a if a == libc::O_WRONLY.unsigned_abs() => sys::BPF_F_WRONLY,
            _ => 0,
        };
        let by_id = bpf::map_info(made).and_then(|i| bpf::map_by_id(i.id, access));
        let map = match by_id {
            Ok(m) => m,
            // Without CAP_SYS_ADMIN: a read-write fd shares the made one's
            // description.
            Err(_) if access == 0 => made.try_clone_to_owned().map_err(crate::error::io_step(
                format!("holding the BPF map of fd {fd}"),
                "dup",
            ))?,
            Err(e) => return Err(step(fd, "opening it by id, read-only or write-only")(e)),
        };
        // Best effort, as for sockets.
        let _ = stasis_kernel::fdops::set_status_flags(
            map.as_fd(),
            crate::restore::setfl_flags(img.flags),
        );
        Ok(map)
    }
}

/// The inner maps of a map of maps being saved, by id: their index.
#[derive(Default)]
struct Inner {
    index: HashMap<u32, u32>,
    maps: Vec<BpfMap>,
}

/// Why the map behind `fd` cannot be saved, for its type.
fn refused_type(t: u32) -> Option<String> {
    Some(match t {
        sys::BPF_MAP_TYPE_HASH
        | sys::BPF_MAP_TYPE_ARRAY
        | sys::BPF_MAP_TYPE_LRU_HASH
        | sys::BPF_MAP_TYPE_PERCPU_HASH
        | sys::BPF_MAP_TYPE_PERCPU_ARRAY
        | sys::BPF_MAP_TYPE_LRU_PERCPU_HASH
        | sys::BPF_MAP_TYPE_QUEUE
        | sys::BPF_MAP_TYPE_STACK
        | sys::BPF_MAP_TYPE_ARRAY_OF_MAPS
        | sys::BPF_MAP_TYPE_HASH_OF_MAPS
        | sys::BPF_MAP_TYPE_RINGBUF
        | sys::BPF_MAP_TYPE_USER_RINGBUF => return None,
        sys::BPF_MAP_TYPE_BLOOM_FILTER => "that is a bloom filter: the kernel gives no way to read its bits (a lookup only tests one value)".into(),
        sys::BPF_MAP_TYPE_PROG_ARRAY => "that holds BPF programs, which the kernel gives back only as its verifier rewrote them (not loadable again)".into(),
        t => format!("of type {t} (one of kernel objects: perf events, sockets, cgroups, devices, storage...)"),
    })
}

fn per_cpu(t: u32) -> bool {
    matches!(
        t,
        sys::BPF_MAP_TYPE_PERCPU_HASH
            | sys::BPF_MAP_TYPE_PERCPU_ARRAY
            | sys::BPF_MAP_TYPE_LRU_PERCPU_HASH
    )
}

fn queue(t: u32) -> bool {
    matches!(t, sys::BPF_MAP_TYPE_QUEUE | sys::BPF_MAP_TYPE_STACK)
}

fn ring(t: u32) -> bool {
    matches!(
        t,
        sys::BPF_MAP_TYPE_RINGBUF | sys::BPF_MAP_TYPE_USER_RINGBUF
    )
}

fn of_maps(t: u32) -> bool {
    matches!(
        t,
        sys::BPF_MAP_TYPE_ARRAY_OF_MAPS | sys::BPF_MAP_TYPE_HASH_OF_MAPS
    )
}

/// Bytes of one element's value as the syscall side reads and writes it.
fn value_len(map_type: u32, value_size: u32, cpus: u32) -> usize {
    if per_cpu(map_type) {
        (value_size as usize).next_multiple_of(8) * cpus as usize
    } else {
        value_size as usize
    }
}

/// Saves the map behind `fd` (described by `info`); `inner` collects the
/// maps a map of maps holds (`None`: an inner map, which cannot hold
/// maps). The error says why it is refused.
fn save_map(
    fd: BorrowedFd<'_>,
    info: &sys::BpfMapInfo,
    inner: Option<&mut Inner>,
) -> Result<BpfMap, String> {
    let t = info.map_type;
    let flags = info.map_flags;
    let why = refused_type(t)
        .or_else(|| {
            (info.btf_vmlinux_value_type_id != 0)
                .then(|| "of kernel structure operations (struct_ops)".to_string())
        })
        .or_else(|| (info.ifindex != 0).then(|| "bound to a network device".to_string()));
    if let Some(why) = why {
        return Err(why);
    }
    let btf = if info.btf_id != 0 {
        let data = bpf::btf_data(info.btf_id)
            .map_err(|e| format!("whose BTF type information cannot be read: {e}"))?;
        if let Some(k) = kernel_field(&data) {
            return Err(format!("whose BTF names {k:?}: its values may hold kernel objects (timers, kptrs, lists...) that a lookup does not give back"));
        }
        Some(BpfBtf {
            data,
            key_type_id: info.btf_key_type_id,
            value_type_id: info.btf_value_type_id,
        })
    } else {
        None
    };
    let cpus = if per_cpu(t) {
        bpf::possible_cpus().map_err(|e| format!("with a value per CPU: {e}"))?
    } else {
        0
    };
    let frozen = frozen_fd(fd);
    let read = |e: KernelError| format!("whose elements cannot be read: {e}");
    let vlen = value_len(t, info.value_size, cpus);
    let mut elements = if queue(t) {
        take_queue(fd, t, vlen, frozen)?
    } else if ring(t) {
        let (consumer, producer) = bpf::ringbuf_positions(fd)
            .map_err(|e| format!("that is a ring buffer whose positions cannot be read: {e}"))?;
        if consumer != producer {
            return Err(format!("that is a ring buffer holding {} bytes of records: the kernel gives no way to set its producer and consumer positions, and only a BPF program writes records into one (an empty one, its records consumed, is saved)", producer.wrapping_sub(consumer)));
        }
        Vec::new()
    } else {
        bpf::map_elements(fd, info.key_size as usize, vlen, ELEMENTS_MAX).map_err(read)?
    };
    let mut inner_maps = Vec::new();
    if of_maps(t) {
        let Some(inner) = inner else {
            return Err("inside a map of maps that is itself a map of maps".into());
        };
        if elements.is_empty() {
            return Err("of maps that holds none: the kernel does not tell which inner map it was made with, and it cannot be made without one".into());
        }
        for (_, v) in &mut elements {
            let id = v
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_ne_bytes)
                .ok_or_else(|| format!("of maps whose value is {} bytes, not 4", v.len()))?;
            let index = match inner.index.get(&id) {
                Some(&i) => i,
                None => {
                    let m = bpf::map_by_id(id, 0)
                        .map_err(|e| format!("whose inner map {id} cannot be opened: {e}"))?;
                    let i = bpf::map_info(m.as_fd())
                        .map_err(|e| format!("whose inner map {id} cannot be read: {e}"))?;
                    let saved = save_map(m.as_fd(), &i, None)
                        .map_err(|why| format!("holding a map {why}"))?;
                    let index = u32::try_from(inner.maps.len()).unwrap_or(u32::MAX);
                    inner.maps.push(saved);
                    inner.index.insert(id, index);
                    index
                }
            };
            *v = index.to_ne_bytes().to_vec();
        }
        inner_maps = std::mem::take(&mut inner.maps);
    }
    let name_len = info
        .name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(info.name.len());
    Ok(BpfMap {
        map_type: t,
        key_size: info.key_size,
        value_size: info.value_size,
        max_entries: info.max_entries,
        map_flags: flags,
        map_extra: info.map_extra,
        name: String::from_utf8_lossy(&info.name[..name_len]).into_owned(),
        frozen,
        elements,
        id: info.id,
        cpus,
        btf,
        inner: inner_maps,
    })
}

/// Every value of a queue or stack, in pop order: popped, then pushed
/// back at once in the order that rebuilds it. A frozen one cannot be
/// popped: only an empty one is saved.
fn take_queue(fd: BorrowedFd<'_>, t: u32, vlen: usize, frozen: bool) -> Result<Elements, String> {
    if frozen {
        return match bpf::map_take(fd, vlen, false) {
            Ok(None) => Ok(Vec::new()),
            Ok(Some(_)) => Err("that is a frozen, non-empty queue or stack: its values can only be read by popping them, which a frozen map refuses".into()),
            Err(e) => Err(format!("whose next value cannot be read: {e}")),
        };
    }
    let mut popped = Vec::new();
    let mut failed = None;
    while popped.len() < ELEMENTS_MAX {
        match bpf::map_take(fd, vlen, true) {
            Ok(Some(v)) => popped.push(v),
            Ok(None) => break,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    push_all(fd, t, &popped).map_err(|e| {
        format!("whose values were popped and could not all be pushed back (the program's map lost some): {e}")
    })?;
    if let Some(e) = failed {
        return Err(format!("whose values cannot be popped: {e}"));
    }
    Ok(popped.into_iter().map(|v| (Vec::new(), v)).collect())
}

/// Pushes values given in pop order so that they pop in that order again.
fn push_all(fd: BorrowedFd<'_>, t: u32, popped: &[Vec<u8>]) -> Result<(), KernelError> {
    let push = |v: &Vec<u8>| bpf::map_update(fd, &[], v);
    if t == sys::BPF_MAP_TYPE_STACK {
        popped.iter().rev().try_for_each(push)
    } else {
        popped.iter().try_for_each(push)
    }
}

/// The first name of [`KERNEL_FIELDS`] among the strings of raw BTF data.
fn kernel_field(data: &[u8]) -> Option<&'static str> {
    let word = |o: usize| {
        data.get(o..o + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    };
    // struct btf_header: magic, version, flags, hdr_len, type_off,
    // type_len, str_off, str_len (in the host's order: 0xeB9F reads so).
    let host = |o: usize| {
        word(o).map(|w| {
            if cfg!(target_endian = "big") {
                w.swap_bytes()
            } else {
                w
            }
        })
    };
    let (hdr, str_off, str_len) = (host(4)?, host(16)?, host(20)?);
    let start = (hdr as usize).checked_add(str_off as usize)?;
    let strings = data.get(start..start.checked_add(str_len as usize)?)?;
    strings
        .split(|&b| b == 0)
        .find_map(|s| KERNEL_FIELDS.iter().find(|k| k.as_bytes() == s).copied())
}

fn step(fd: i32, what: &'static str) -> impl Fn(KernelError) -> RestoreError {
    move |e| RestoreError::Step {
        what: format!("{what} (the BPF map of fd {fd}; needs CAP_BPF and CAP_SYS_ADMIN)"),
        source: e,
    }
}

/// The map of `m`, made once per saved map id (fds and maps of maps
/// holding one map hold one again).
fn made_map<'c>(
    cx: &'c mut RestoreCtx<'_>,
    m: &BpfMap,
    fd: i32,
) -> Result<BorrowedFd<'c>, RestoreError> {
    if m.id == 0 || !cx.bpf_maps.contains_key(&m.id) {
        let made = make_map(cx, m, fd)?;
        if m.id == 0 {
            cx.bpf_maps_unnamed.push(made);
            return cx
                .bpf_maps_unnamed
                .last()
                .map(AsFd::as_fd)
                .ok_or_else(|| RestoreError::Inconsistent("a BPF map just made is gone".into()));
        }
        cx.bpf_maps.insert(m.id, made);
    }
    cx.bpf_maps
        .get(&m.id)
        .map(AsFd::as_fd)
        .ok_or_else(|| RestoreError::Inconsistent("a BPF map just made is gone".into()))
}

/// Makes `m` again: its BTF, the map, its elements, its frozen state.
fn make_map(cx: &mut RestoreCtx<'_>, m: &BpfMap, fd: i32) -> Result<OwnedFd, RestoreError> {
    let t = m.map_type;
    let inconsistent = |what: String| {
        RestoreError::Inconsistent(format!("the BPF map of fd {fd} (type {t}) {what}"))
    };
    if per_cpu(t) {
        let here = bpf::possible_cpus().map_err(step(fd, "counting the possible CPUs"))?;
        if here != m.cpus {
            return Err(RestoreError::Incompatible(format!("the per-CPU BPF map of fd {fd} has values for {} possible CPUs, this host has {here}: restore it on a host with as many", m.cpus)));
        }
    }
    let btf = m
        .btf
        .as_ref()
        .map(|b| bpf::btf_load(&b.data))
        .transpose()
        .map_err(step(fd, "loading its BTF again"))?;
    // The maps it holds first: the first is the template of the others.
    let mut inner = Vec::new();
    for i in &m.inner {
        let made = made_map(cx, i, fd)?;
        inner.push(made.try_clone_to_owned().map_err(crate::error::io_step(
            format!("holding an inner map of the BPF map of fd {fd}"),
            "dup",
        ))?);
    }
    if of_maps(t) && inner.is_empty() {
        return Err(inconsistent("is a map of maps without inner maps".into()));
    }
    let mut name = [0u8; sys::BPF_OBJ_NAME_LEN];
    let n = m.name.len().min(sys::BPF_OBJ_NAME_LEN - 1);
    name[..n].copy_from_slice(&m.name.as_bytes()[..n]);
    let raw = |f: &OwnedFd| f.as_raw_fd().unsigned_abs();
    let attr = sys::BpfMapCreateAttr {
        map_type: t,
        key_size: m.key_size,
        value_size: m.value_size,
        max_entries: m.max_entries,
        map_flags: m.map_flags,
        inner_map_fd: inner.first().map_or(0, raw),
        // Which node it was on is not visible: the first.
        numa_node: 0,
        map_name: name,
        btf_fd: btf.as_ref().map_or(0, raw),
        btf_key_type_id: m.btf.as_ref().map_or(0, |b| b.key_type_id),
        btf_value_type_id: m.btf.as_ref().map_or(0, |b| b.value_type_id),
        map_extra: m.map_extra,
        ..Default::default()
    };
    let map = bpf::map_create(&attr).map_err(step(fd, "creating it again"))?;
    let (klen, vlen) = if queue(t) {
        (0, m.value_size as usize)
    } else if of_maps(t) {
        (m.key_size as usize, 4)
    } else {
        (m.key_size as usize, value_len(t, m.value_size, m.cpus))
    };
    for (k, v) in &m.elements {
        if k.len() != klen || v.len() != vlen {
            return Err(inconsistent(format!(
                "has an element of {} + {} bytes, not {klen} + {vlen}",
                k.len(),
                v.len()
            )));
        }
    }
    if queue(t) {
        let values: Vec<Vec<u8>> = m.elements.iter().map(|(_, v)| v.clone()).collect();
        push_all(map.as_fd(), t, &values).map_err(step(fd, "pushing its values"))?;
    } else {
        for (k, v) in &m.elements {
            let value = if of_maps(t) {
                let i = v
                    .as_slice()
                    .try_into()
                    .map(u32::from_ne_bytes)
                    .ok()
                    .and_then(|i| inner.get(i as usize))
                    .ok_or_else(|| inconsistent("holds an inner map it does not have".into()))?;
                raw(i).to_ne_bytes().to_vec()
            } else {
                v.clone()
            };
            bpf::map_update(map.as_fd(), k, &value).map_err(step(fd, "writing its elements"))?;
        }
    }
    if m.frozen {
        bpf::map_freeze(map.as_fd()).map_err(step(fd, "freezing it"))?;
    }
    Ok(map)
}

/// Whether our fd on a BPF map says it is frozen in its fdinfo.
fn frozen_fd(fd: BorrowedFd<'_>) -> bool {
    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
        .is_ok_and(|i| frozen(&i))
}

/// Whether a BPF map's fdinfo says it is frozen (`frozen:\t1`).
fn frozen(info: &str) -> bool {
    info.lines()
        .filter_map(|l| l.strip_prefix("frozen:"))
        .any(|v| v.trim() == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_is_read_from_fdinfo() {
        let info = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nmap_type:\t1\n\
                    key_size:\t4\nvalue_size:\t4\nmax_entries:\t10\nmap_flags:\t0x5\n\
                    map_extra:\t0x0\nmemlock:\t1234\nmap_id:\t7\nfrozen:\t1\n";
        assert!(frozen(info));
        assert!(!frozen(&info.replace("frozen:\t1", "frozen:\t0")));
        assert!(!frozen("pos:\t0\n"));
    }

    /// Raw BTF with no types and the strings `strings` (NUL-separated).
    fn btf_with(strings: &[u8]) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend_from_slice(&0xeb9f_u16.to_ne_bytes());
        d.extend_from_slice(&[1, 0]);
        for w in [24u32, 0, 0, 0, u32::try_from(strings.len()).unwrap()] {
            d.extend_from_slice(&w.to_ne_bytes());
        }
        d.extend_from_slice(strings);
        d
    }

    #[test]
    fn kernel_fields_are_found_in_btf_strings() {
        assert_eq!(kernel_field(&btf_with(b"\0int\0val\0")), None);
        assert_eq!(
            kernel_field(&btf_with(b"\0int\0bpf_timer\0")),
            Some("bpf_timer")
        );
        assert_eq!(kernel_field(&btf_with(b"\0kptr\0")), Some("kptr"));
        // A name only containing one is not one.
        assert_eq!(kernel_field(&btf_with(b"\0my_kptr_x\0")), None);
        assert_eq!(kernel_field(&[1, 2, 3]), None, "truncated data");
    }

    #[test]
    fn per_cpu_values_are_rounded_up_to_8_bytes_per_cpu() {
        assert_eq!(value_len(sys::BPF_MAP_TYPE_PERCPU_HASH, 12, 2), 32);
        assert_eq!(value_len(sys::BPF_MAP_TYPE_PERCPU_ARRAY, 8, 3), 24);
        assert_eq!(value_len(sys::BPF_MAP_TYPE_HASH, 12, 0), 12);
    }
}
