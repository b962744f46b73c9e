//! BPF maps through `bpf(2)`: a map's description (`bpf_map_info`), its
//! elements (a queue's or stack's popped and pushed), and making one again
//! with them; maps opened by id; BTF objects read and loaded again.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use stasis_sys::bpf as sys;

use crate::{last_err, KernelError, Result};

/// `bpf(cmd, attr, size_of(attr))`.
fn bpf<T>(cmd: i32, attr: &mut T, what: &str) -> Result<i64> {
    // SAFETY: `attr` is a `#[repr(C)]` prefix of `union bpf_attr` for
    // `cmd` (stasis_sys::bpf), valid and writable for its size, and every
    // user address in it points into a live buffer of the caller's of the
    // size the map says.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut T).cast::<u8>(),
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        return Err(KernelError::io(what, last_err()));
    }
    Ok(r)
}

/// What `BPF_OBJ_GET_INFO_BY_FD` tells of the map behind `fd`.
pub fn map_info(fd: BorrowedFd<'_>) -> Result<sys::BpfMapInfo> {
    let mut info = sys::BpfMapInfo::default();
    let mut attr = sys::BpfInfoAttr {
        bpf_fd: fd.as_raw_fd().unsigned_abs(),
        info_len: u32::try_from(std::mem::size_of::<sys::BpfMapInfo>()).unwrap_or(0),
        info: &mut info as *mut sys::BpfMapInfo as u64,
    };
    bpf(
        sys::BPF_OBJ_GET_INFO_BY_FD,
        &mut attr,
        "BPF_OBJ_GET_INFO_BY_FD",
    )?;
    Ok(info)
}

/// Every element of the map behind `fd` (`key_size`- and
/// `value_size`-byte buffers), in the kernel's key order, up to `max`.
pub fn map_elements(
    fd: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    max: usize,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let map_fd = fd.as_raw_fd().unsigned_abs();
    let mut out = Vec::new();
    let mut key: Option<Vec<u8>> = None;
    loop {
        let mut next = vec![0u8; key_size];
        let mut attr = sys::BpfMapElemAttr {
            map_fd,
            // The first key: a NULL key.
            key: key.as_ref().map_or(0, |k| k.as_ptr() as u64),
            value: next.as_mut_ptr() as u64,
            ..Default::default()
        };
        match bpf(sys::BPF_MAP_GET_NEXT_KEY, &mut attr, "BPF_MAP_GET_NEXT_KEY") {
            Ok(_) => {}
            Err(KernelError::Io { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => {
                return Ok(out);
            }
            Err(e) => return Err(e),
        }
        if out.len() >= max {
            return Err(KernelError::io(
                format!("reading a BPF map of more than {max} elements"),
                std::io::Error::from_raw_os_error(libc::E2BIG),
            ));
        }
        let mut value = vec![0u8; value_size];
        let mut attr = sys::BpfMapElemAttr {
            map_fd,
            key: next.as_ptr() as u64,
            value: value.as_mut_ptr() as u64,
            ..Default::default()
        };
        match bpf(sys::BPF_MAP_LOOKUP_ELEM, &mut attr, "BPF_MAP_LOOKUP_ELEM") {
            Ok(_) => out.push((next.clone(), value)),
            // Deleted between the two calls (a program of the kernel's
            // changed it): not in the snapshot.
            Err(KernelError::Io { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        key = Some(next);
    }
}

/// `bpf(cmd, attr)` for a command that returns a new fd (close-on-exec).
fn bpf_fd<T>(cmd: i32, attr: &mut T, what: &str) -> Result<OwnedFd> {
    let fd = bpf(cmd, attr, what)?;
    let fd = i32::try_from(fd).map_err(|_| KernelError::io(what, last_err()))?;
    // SAFETY: a new descriptor the kernel just returned, nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    crate::fdops::set_cloexec(std::os::fd::AsFd::as_fd(&fd))
        .map_err(|e| KernelError::io(format!("setting close-on-exec after {what}"), e))?;
    Ok(fd)
}

/// A new map as `attr` describes it.
pub fn map_create(attr: &sys::BpfMapCreateAttr) -> Result<OwnedFd> {
    let mut a = *attr;
    bpf_fd(sys::BPF_MAP_CREATE, &mut a, "BPF_MAP_CREATE")
}

/// A new fd (and open file description) on the map of id `id`, with the
/// access `open_flags` gives (`BPF_F_RDONLY`, `BPF_F_WRONLY` or 0: both).
/// Needs CAP_SYS_ADMIN.
pub fn map_by_id(id: u32, open_flags: u32) -> Result<OwnedFd> {
    let mut attr = sys::BpfGetIdAttr {
        id,
        open_flags,
        ..Default::default()
    };
    bpf_fd(sys::BPF_MAP_GET_FD_BY_ID, &mut attr, "BPF_MAP_GET_FD_BY_ID")
}

/// The next value of a queue (its oldest) or stack (its newest), taken
/// out (`pop`) or only read (`peek`); `None` when it is empty.
pub fn map_take(fd: BorrowedFd<'_>, value_size: usize, pop: bool) -> Result<Option<Vec<u8>>> {
    let mut value = vec![0u8; value_size];
    let mut attr = sys::BpfMapElemAttr {
        map_fd: fd.as_raw_fd().unsigned_abs(),
        key: 0,
        value: value.as_mut_ptr() as u64,
        ..Default::default()
    };
    let (cmd, what) = if pop {
        (
            sys::BPF_MAP_LOOKUP_AND_DELETE_ELEM,
            "BPF_MAP_LOOKUP_AND_DELETE_ELEM",
        )
    } else {
        (sys::BPF_MAP_LOOKUP_ELEM, "BPF_MAP_LOOKUP_ELEM")
    };
    match bpf(cmd, &mut attr, what) {
        Ok(_) => Ok(Some(value)),
        Err(KernelError::Io { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The raw data (header, types, strings) of the BTF object of id `id`.
/// Needs CAP_SYS_ADMIN.
pub fn btf_data(id: u32) -> Result<Vec<u8>> {
    let mut attr = sys::BpfGetIdAttr {
        id,
        ..Default::default()
    };
    let btf = bpf_fd(sys::BPF_BTF_GET_FD_BY_ID, &mut attr, "BPF_BTF_GET_FD_BY_ID")?;
    let info_of = |buf: &mut [u8]| -> Result<sys::BpfBtfInfo> {
        let mut info = sys::BpfBtfInfo {
            btf: buf.as_mut_ptr() as u64,
            btf_size: u32::try_from(buf.len()).unwrap_or(u32::MAX),
            ..Default::default()
        };
        let mut attr = sys::BpfInfoAttr {
            bpf_fd: btf.as_raw_fd().unsigned_abs(),
            info_len: u32::try_from(std::mem::size_of::<sys::BpfBtfInfo>()).unwrap_or(0),
            info: &mut info as *mut sys::BpfBtfInfo as u64,
        };
        bpf(
            sys::BPF_OBJ_GET_INFO_BY_FD,
            &mut attr,
            "BPF_OBJ_GET_INFO_BY_FD (BTF)",
        )?;
        Ok(info)
    };
    // The first call says the size, the second copies that much.
    let size = info_of(&mut [])?.btf_size as usize;
    let mut data = vec![0u8; size];
    let info = info_of(&mut data)?;
    if info.btf_size as usize != size {
        return Err(KernelError::io(
            "reading a BTF object that changed size",
            std::io::Error::from_raw_os_error(libc::EAGAIN),
        ));
    }
    if info.kernel_btf != 0 {
        return Err(KernelError::io(
            "reading the kernel's own BTF as a program's",
            std::io::Error::from_raw_os_error(libc::EINVAL),
        ));
    }
    Ok(data)
}

/// A new BTF object loaded from raw `data` (as [`btf_data`] gives it).
pub fn btf_load(data: &[u8]) -> Result<OwnedFd> {
    let mut attr = sys::BpfBtfLoadAttr {
        btf: data.as_ptr() as u64,
        btf_size: u32::try_from(data.len()).unwrap_or(u32::MAX),
        ..Default::default()
    };
    bpf_fd(sys::BPF_BTF_LOAD, &mut attr, "BPF_BTF_LOAD")
}

/// The consumer and producer positions of the ring buffer map behind `fd`
/// (`BPF_MAP_TYPE_RINGBUF` or `_USER_RINGBUF`): the first word of its first
/// and second pages, each mapped read-only for that moment. The ring holds
/// records while they differ.
pub fn ringbuf_positions(fd: BorrowedFd<'_>) -> Result<(u64, u64)> {
    let page = usize::try_from(stasis_sys::PAGE_SIZE).unwrap_or(4096);
    let word_at = |index: usize| -> Result<u64> {
        let offset = libc::off_t::try_from(index * page).unwrap_or(0);
        // SAFETY: a new read-only shared mapping of one page of the map,
        // placed by the kernel (no address given), so it replaces nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(KernelError::io("mmap of a BPF ring buffer", last_err()));
        }
        // SAFETY: `p` is the start of the page just mapped, readable and
        // 8-byte aligned; the kernel writes the position with release
        // semantics, a volatile read takes one value of it.
        let v = unsafe { std::ptr::read_volatile(p.cast::<u64>()) };
        // SAFETY: unmaps exactly the page mapped above, which nothing else
        // refers to.
        unsafe { libc::munmap(p, page) };
        Ok(v)
    };
    Ok((word_at(0)?, word_at(1)?))
}

/// How many CPUs the system may ever have (`/sys/devices/system/cpu/possible`,
/// such as `0-3`): the number of values of a per-CPU map's element.
pub fn possible_cpus() -> Result<u32> {
    let path = "/sys/devices/system/cpu/possible";
    let text = std::fs::read_to_string(path).map_err(|e| KernelError::io(path, e))?;
    parse_cpu_list(&text).ok_or_else(|| {
        KernelError::io(
            format!("{path}: {text:?}"),
            std::io::Error::from_raw_os_error(libc::EINVAL),
        )
    })
}

/// One more than the last CPU of a list such as `0-3,8-11`.
fn parse_cpu_list(text: &str) -> Option<u32> {
    let last = text.trim().split(',').next_back()?;
    let end = last.split('-').next_back()?;
    end.trim().parse::<u32>().ok()?.checked_add(1)
}

/// Sets element `key` of the map behind `fd` to `value` (an empty key:
/// pushes `value` on a queue or stack).
pub fn map_update(fd: BorrowedFd<'_>, key: &[u8], value: &[u8]) -> Result<()> {
    let mut attr = sys::BpfMapElemAttr {
        map_fd: fd.as_raw_fd().unsigned_abs(),
        key: if key.is_empty() {
            0
        } else {
            key.as_ptr() as u64
        },
        value: value.as_ptr() as u64,
        flags: sys::BPF_ANY,
        ..Default::default()
    };
    bpf(sys::BPF_MAP_UPDATE_ELEM, &mut attr, "BPF_MAP_UPDATE_ELEM").map(drop)
}

/// Freezes the map behind `fd`: the syscall side cannot change it any more.
pub fn map_freeze(fd: BorrowedFd<'_>) -> Result<()> {
    let mut attr = sys::BpfInfoAttr {
        bpf_fd: fd.as_raw_fd().unsigned_abs(),
        ..Default::default()
    };
    bpf(sys::BPF_MAP_FREEZE, &mut attr, "BPF_MAP_FREEZE").map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn an_empty_ring_buffer_has_equal_positions() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: BPF_MAP_CREATE needs CAP_BPF (root)");
            return;
        }
        let attr = sys::BpfMapCreateAttr {
            map_type: sys::BPF_MAP_TYPE_RINGBUF,
            max_entries: 4096,
            ..Default::default()
        };
        let rb = map_create(&attr).unwrap();
        let (c, p) = ringbuf_positions(rb.as_fd()).unwrap();
        assert_eq!((c, p), (0, 0));
    }

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(parse_cpu_list("0-3\n"), Some(4));
        assert_eq!(parse_cpu_list("0\n"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8-11"), Some(12));
        assert_eq!(parse_cpu_list(""), None);
    }

    #[test]
    fn a_queue_is_popped_and_pushed() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: BPF_MAP_CREATE needs CAP_BPF (root)");
            return;
        }
        let attr = sys::BpfMapCreateAttr {
            map_type: sys::BPF_MAP_TYPE_QUEUE,
            value_size: 4,
            max_entries: 8,
            ..Default::default()
        };
        let q = map_create(&attr).unwrap();
        for v in 1u32..=3 {
            map_update(q.as_fd(), &[], &v.to_ne_bytes()).unwrap();
        }
        assert_eq!(
            map_take(q.as_fd(), 4, false).unwrap(),
            Some(1u32.to_ne_bytes().to_vec())
        );
        let popped: Vec<_> = std::iter::from_fn(|| map_take(q.as_fd(), 4, true).unwrap()).collect();
        assert_eq!(popped.len(), 3);
        assert_eq!(popped[2], 3u32.to_ne_bytes().to_vec());
        assert_eq!(map_take(q.as_fd(), 4, true).unwrap(), None);
        let id = map_info(q.as_fd()).unwrap().id;
        let again = map_by_id(id, 0).unwrap();
        map_update(again.as_fd(), &[], &7u32.to_ne_bytes()).unwrap();
        assert_eq!(
            map_take(q.as_fd(), 4, true).unwrap(),
            Some(7u32.to_ne_bytes().to_vec()),
            "one map by either fd"
        );
    }

    #[test]
    fn a_hash_map_is_read_and_made_again() {
        let mut name = [0u8; sys::BPF_OBJ_NAME_LEN];
        name[..4].copy_from_slice(b"test");
        let attr = sys::BpfMapCreateAttr {
            map_type: sys::BPF_MAP_TYPE_HASH,
            key_size: 4,
            value_size: 8,
            max_entries: 16,
            map_flags: sys::BPF_F_NO_PREALLOC,
            map_name: name,
            ..Default::default()
        };
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: BPF_MAP_CREATE needs CAP_BPF (root)");
            return;
        }
        let m = map_create(&attr).unwrap();
        for k in 0u32..5 {
            map_update(m.as_fd(), &k.to_ne_bytes(), &u64::from(k * 7).to_ne_bytes()).unwrap();
        }
        let info = map_info(m.as_fd()).unwrap();
        assert_eq!(
            (
                info.map_type,
                info.key_size,
                info.value_size,
                info.max_entries,
                info.map_flags
            ),
            (sys::BPF_MAP_TYPE_HASH, 4, 8, 16, sys::BPF_F_NO_PREALLOC)
        );
        assert_eq!(&info.name[..5], b"test\0");
        let mut els = map_elements(m.as_fd(), 4, 8, 100).unwrap();
        els.sort();
        let want: Vec<_> = (0u32..5)
            .map(|k| {
                (
                    k.to_ne_bytes().to_vec(),
                    u64::from(k * 7).to_ne_bytes().to_vec(),
                )
            })
            .collect();
        let mut want = want;
        want.sort();
        assert_eq!(els, want);
        assert!(map_elements(m.as_fd(), 4, 8, 3).is_err(), "more than max");
        map_freeze(m.as_fd()).unwrap();
        assert!(
            map_update(m.as_fd(), &9u32.to_ne_bytes(), &[0; 8]).is_err(),
            "frozen"
        );
    }
}
