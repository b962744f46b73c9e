//! BPF maps (`anon_inode:bpf-map`): a hash, LRU hash or array map, with
//! its type, sizes, flags, name, elements and frozen state (zdtm's
//! bpf_hash, bpf_array).
//!
//! **Save.** From a copy of the fd (`pidfd_getfd`): `bpf_map_info`, every
//! element (`BPF_MAP_GET_NEXT_KEY`, `BPF_MAP_LOOKUP_ELEM`) and, from
//! fdinfo, whether it is frozen. Refused by name: other map types (per-CPU
//! values, maps of maps or programs, rings...), maps with BTF, bound to a
//! device, mapped in memory or not readable from the syscall side.
//! **Restore.** `BPF_MAP_CREATE` with the same description, every element
//! written again, then `BPF_MAP_FREEZE` if it was frozen. An LRU map's
//! recency order is not visible, so not kept. Needs CAP_BPF (root). Two
//! fds on one map share it only through one open file description (a map
//! opened twice by id comes back as two maps).

use std::os::fd::{AsFd, OwnedFd};

use stasis_image::manifest::{BpfMap, FdImage, FdKind};
use stasis_kernel::{bpf, pidfd, KernelError};
use stasis_sys::bpf as sys;

use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// Most elements saved of one map.
const ELEMENTS_MAX: usize = 1 << 20;

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
        let kind = match info.map_type {
            sys::BPF_MAP_TYPE_HASH | sys::BPF_MAP_TYPE_ARRAY | sys::BPF_MAP_TYPE_LRU_HASH => None,
            t => Some(format!("of type {t}")),
        };
        let flags = info.map_flags;
        let why = kind
            .or_else(|| (info.btf_id != 0).then(|| "with BTF type information".to_string()))
            .or_else(|| (info.ifindex != 0).then(|| "bound to a network device".to_string()))
            .or_else(|| (flags & sys::BPF_F_MMAPABLE != 0).then(|| "mapped in memory".to_string()))
            .or_else(|| {
                (flags & (sys::BPF_F_WRONLY | sys::BPF_F_RDONLY) != 0)
                    .then(|| "not both readable and writable from the syscall side".to_string())
            });
        if let Some(why) = why {
            return Err(fd.unsupported(format!(
                "fd {n} is a BPF map {why}; stasis saves hash, LRU hash and array maps without BTF"
            )));
        }
        let read =
            |e: KernelError| fd.unsupported(format!("fd {n}: reading the BPF map's elements: {e}"));
        let elements = bpf::map_elements(
            copy.as_fd(),
            info.key_size as usize,
            info.value_size as usize,
            ELEMENTS_MAX,
        )
        .map_err(read)?;
        let name_len = info
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(info.name.len());
        Ok(Some(FdKind::BpfMap(BpfMap {
            map_type: info.map_type,
            key_size: info.key_size,
            value_size: info.value_size,
            max_entries: info.max_entries,
            map_flags: flags,
            map_extra: info.map_extra,
            name: String::from_utf8_lossy(&info.name[..name_len]).into_owned(),
            frozen: frozen(fd.info),
            elements,
        })))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::BpfMap(_))
    }

    fn restore(_cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::BpfMap(m) = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let fd = img.fd;
        let step = |what: &'static str| {
            move |e: KernelError| RestoreError::Step {
                what: format!("{what} (the BPF map of fd {fd}; needs CAP_BPF)"),
                source: e,
            }
        };
        let mut name = [0u8; sys::BPF_OBJ_NAME_LEN];
        let n = m.name.len().min(sys::BPF_OBJ_NAME_LEN - 1);
        name[..n].copy_from_slice(&m.name.as_bytes()[..n]);
        let attr = sys::BpfMapCreateAttr {
            map_type: m.map_type,
            key_size: m.key_size,
            value_size: m.value_size,
            max_entries: m.max_entries,
            map_flags: m.map_flags,
            // Which node it was on is not visible: the first.
            numa_node: 0,
            map_name: name,
            map_extra: m.map_extra,
            ..Default::default()
        };
        let map = bpf::map_create(&attr).map_err(step("creating it again"))?;
        for (k, v) in &m.elements {
            if k.len() != m.key_size as usize || v.len() != m.value_size as usize {
                return Err(RestoreError::Inconsistent(format!(
                    "the BPF map of fd {fd} has an element of {} + {} bytes, not {} + {}",
                    k.len(),
                    v.len(),
                    m.key_size,
                    m.value_size
                )));
            }
            bpf::map_update(map.as_fd(), k, v).map_err(step("writing its elements"))?;
        }
        if m.frozen {
            bpf::map_freeze(map.as_fd()).map_err(step("freezing it"))?;
        }
        // Best effort, as for sockets.
        let _ = stasis_kernel::fdops::set_status_flags(
            map.as_fd(),
            crate::restore::setfl_flags(img.flags),
        );
        Ok(map)
    }
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
}
