//! BPF maps through `bpf(2)`: a map's description (`bpf_map_info`), its
//! elements, and making one again with them.

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

/// A new map as `attr` describes it.
pub fn map_create(attr: &sys::BpfMapCreateAttr) -> Result<OwnedFd> {
    let mut a = *attr;
    let fd = bpf(sys::BPF_MAP_CREATE, &mut a, "BPF_MAP_CREATE")?;
    let fd = i32::try_from(fd).map_err(|_| KernelError::io("BPF_MAP_CREATE", last_err()))?;
    // SAFETY: a new descriptor the kernel just returned, nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    crate::fdops::set_cloexec(std::os::fd::AsFd::as_fd(&fd))
        .map_err(|e| KernelError::io("setting close-on-exec on a BPF map", e))?;
    Ok(fd)
}

/// Sets element `key` of the map behind `fd` to `value`.
pub fn map_update(fd: BorrowedFd<'_>, key: &[u8], value: &[u8]) -> Result<()> {
    let mut attr = sys::BpfMapElemAttr {
        map_fd: fd.as_raw_fd().unsigned_abs(),
        key: key.as_ptr() as u64,
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
