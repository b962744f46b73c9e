//! Touch windows (FREM): after a checkpoint, the pages each process writes
//! for a while are the pages a restart will want first. Read from the
//! uffd write tracking (`PAGEMAP_SCAN`), which stays armed: the next
//! incremental dump still sees those pages dirty.

use std::time::Duration;

use stasis_image::touch::{write_touch_set, TouchSet, TouchSource};
use stasis_image::ImageDir;
use stasis_kernel::pagemap::{Pagemap, ScanQuery};
use stasis_kernel::procfs::{self, MapsEntry};
use stasis_sys as sys;

use crate::{Result, TrackError};

/// Bytes a restore of checkpoint `n` brings back (for an incremental
/// checkpoint, with its ancestors' pages): what a restart must retrieve.
pub fn restored_bytes(store: &ImageDir, n: u32) -> Result<u64> {
    let cp = store.load(Some(n))?;
    Ok(stasis_image::summarize(&cp).memory_pages * sys::PAGE_SIZE)
}

/// Private writable areas `[start, end)` of a memory map.
fn private_writable(maps: &[MapsEntry]) -> Vec<(u64, u64)> {
    maps.iter()
        .filter(|m| m.read && m.write && !m.shared)
        .map(|m| (m.start, m.end))
        .collect()
}

/// Pages of `pid` written since its tracking was armed (present and
/// written; private writable areas only), as (address, pages) runs.
pub fn written_pages(pid: i32) -> Result<Vec<(u64, u32)>> {
    let maps = procfs::maps(pid).map_err(|e| TrackError::Process {
        pid,
        what: "reading its memory map".into(),
        source: e.into(),
    })?;
    let process = |source| TrackError::Process {
        pid,
        what: "reading the pages it wrote".into(),
        source,
    };
    let pm = Pagemap::open(pid).map_err(process)?;
    let q = ScanQuery {
        mask: sys::PAGE_IS_WRITTEN | sys::PAGE_IS_PRESENT,
        return_mask: sys::PAGE_IS_WRITTEN | sys::PAGE_IS_PRESENT,
        ..ScanQuery::written()
    };
    let mut out = Vec::new();
    for (a, b) in private_writable(&maps) {
        for r in pm.scan(a, b, q).map_err(process)? {
            let pages = u32::try_from((r.end - r.start) / sys::PAGE_SIZE).unwrap_or(u32::MAX);
            out.push((r.start, pages));
        }
    }
    Ok(out)
}

/// Waits `window`, then stores the pages each process of checkpoint `n`
/// wrote meanwhile as its touch set. Tracking (armed by the dump) is read,
/// not re-armed.
pub fn record_window(store: &ImageDir, n: u32, window: Duration) -> Result<TouchSet> {
    std::thread::sleep(window);
    record_now(store, n, window)
}

/// Stores what each process of checkpoint `n` wrote since the checkpoint
/// (`window` long ago) as its touch set.
pub fn record_now(store: &ImageDir, n: u32, window: Duration) -> Result<TouchSet> {
    let cp = store.load(Some(n))?;
    let ts = touch_set_of(&live_pids(&cp.manifest), n, window)?;
    write_touch_set(cp.dir(), &ts)?;
    Ok(ts)
}

/// The processes of a checkpoint that were not zombies.
pub fn live_pids(m: &stasis_image::Manifest) -> Vec<i32> {
    m.processes
        .iter()
        .filter(|p| p.zombie.is_none())
        .map(|p| p.pid)
        .collect()
}

/// What processes `pids` of checkpoint `n` wrote since it (`window`
/// long ago), as its touch set (not stored: for a checkpoint kept
/// elsewhere, an object store).
pub fn touch_set_of(pids: &[i32], n: u32, window: Duration) -> Result<TouchSet> {
    let mut procs = Vec::new();
    for &pid in pids {
        match written_pages(pid) {
            Ok(r) => procs.push((pid, r)),
            // Gone meanwhile: nothing to say about it.
            Err(e) if std::fs::metadata(format!("/proc/{pid}")).is_err() => {
                tracing::debug!(pid, "touch window: {e}");
            }
            Err(e) => return Err(e),
        }
    }
    if procs.is_empty() {
        return Err(TrackError::AllExited { checkpoint: n });
    }
    Ok(TouchSet {
        source: TouchSource::Window,
        window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
        procs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_private_writable_areas() {
        let maps = "\
55d0c0000000-55d0c0001000 r--p 00000000 08:01 1234 /bin/x
55d0c0001000-55d0c0003000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000004000 rw-s 00000000 00:01 77 /dev/zero (deleted)
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
7ffd00000000-7ffd00001000 -w-p 00000000 00:00 0
";
        assert_eq!(
            private_writable(&procfs::parse_maps(maps).unwrap()),
            vec![
                (0x55d0_c000_1000, 0x55d0_c000_3000),
                (0x7ffc_0000_0000, 0x7ffc_0002_1000)
            ]
        );
    }
}
