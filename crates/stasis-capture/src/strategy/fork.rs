//! Fork snapshots: each process forks a copy-on-write child in the freeze
//! ([`crate::snapshot`]); the pages are planned and copied from the
//! children after the release, and the children reaped at the end.

use stasis_image::manifest::Manifest;

use super::{CopyCx, CopyStrategy, PlanCx, Planned};
use crate::copy::{Deferred, Pending, ProcCopy};
use crate::freeze::Frozen;
use crate::{incremental, memory, proc, snapshot, Result};

/// Copies from fork snapshots after the release.
pub struct ForkSnapshot;

impl CopyStrategy for ForkSnapshot {
    fn method(&self) -> Option<&'static str> {
        Some("fork")
    }

    /// The snapshot first: the pages are looked for in it after the
    /// release; only what a fork does not copy is planned now.
    fn plan(&mut self, mut cx: PlanCx<'_>) -> Result<Planned> {
        let tracked = cx.tracked();
        let (fp, maps) = (&mut *cx.fp, cx.maps);
        let snap = snapshot::take(fp)?;
        // A fork leaves out only `MADV_DONTFORK` areas, and takes their
        // size off the child's total (`statm`): with equal totals nothing
        // was left out, and the child's areas (hundreds in an MPI rank)
        // need not be read while the tree is frozen.
        let no_fork = if vm_pages(fp.pid)? == vm_pages(snap.pid)? {
            Vec::new()
        } else {
            let child_maps = proc::read_parsed(snap.pid, "maps", proc::parse_maps)?;
            unforked_areas(maps, &child_maps)
        };
        // A fork copies neither locks (`lo`) nor MADV_DONTFORK areas: then
        // the flags are read from the process itself now (a walk of its
        // page tables, paid only by a process with such areas); else from
        // its snapshot after the release.
        let locked = proc::parse_status_locked_kib(&proc::read(fp.pid, "status")?) > 0;
        let vmflags = if locked || !no_fork.is_empty() {
            Some(proc::parse_smaps_vmflags(&proc::read(fp.pid, "smaps")?))
        } else {
            None
        };
        let mut plan = memory::plan_with(fp.pid, maps, &[], cx.seen_shm, memory::Scan::None)?;
        let unforked: Vec<proc::MapsEntry> = maps
            .iter()
            .filter(|m| !m.shared && no_fork.contains(&m.start))
            .cloned()
            .collect();
        plan.ranges
            .extend(memory::plan(fp.pid, &unforked, &[], &mut memory::SeenShm::new())?.ranges);
        plan.ranges.sort_unstable();
        let areas = incremental::areas(&plan.vmas);
        let mut collected = None;
        if let (Some(b), Some(t), Some(pp)) = (cx.base, cx.tracker.as_mut(), cx.parent_proc) {
            if tracked {
                let c = incremental::collect(&mut **t, cx.image.pid, &areas)?;
                if incremental::tracking_lost(t.backend(), &c) {
                    cx.note
                        .get_or_insert_with(|| incremental::lost_note(cx.image.pid));
                } else {
                    let parent_data = b.parent_data(pp)?;
                    collected = Some((c, parent_data));
                }
            }
        }
        // Shared memory is planned above (read before the release): the
        // snapshot's plan leaves every shared area out.
        let mut shm_seen = memory::SeenShm::new();
        for m in maps.iter().filter(|m| m.shared) {
            let r = shm_seen.entry(m.ino).or_default();
            r.push((m.offset, m.offset + (m.end - m.start)));
        }
        for r in shm_seen.values_mut() {
            *r = stasis_image::ranges::normalize(std::mem::take(r));
        }
        Ok(Planned {
            plan,
            no_fork,
            areas,
            selection: None,
            deferred: Some(Deferred {
                snapshot: Some(snap),
                maps: maps.to_vec(),
                collected,
                shm_seen,
                vmflags,
            }),
        })
    }

    /// What a fork does not copy is read now; the snapshots hold the rest.
    fn before_release(
        &mut self,
        copies: &mut [ProcCopy],
        _manifest: &Manifest,
        _f: &mut Frozen,
    ) -> Result<()> {
        for c in copies.iter_mut().filter(|c| c.snapshot.is_some()) {
            let unforked = stasis_image::chain::normalize(c.unforked.clone());
            c.preread(&unforked)?;
        }
        Ok(())
    }

    /// Plans from the snapshots first, then copies from them.
    fn copy(&mut self, p: &mut Pending, cx: CopyCx<'_, '_>) -> Result<()> {
        for c in &mut p.copies {
            c.plan_from_snapshot(&mut p.manifest.processes[c.idx])?;
        }
        p.copy_pages(cx)
    }

    /// Kills the snapshots and has their parents reap them.
    fn after_copy(&mut self, p: &mut Pending, root: i32) -> Result<u64> {
        let mut reap = Vec::new();
        for c in &mut p.copies {
            if let Some(mut s) = c.snapshot.take() {
                s.kill();
                reap.push((s.parent, s.pid));
            }
        }
        snapshot::reap(root, &reap)
    }
}

/// The size of process `pid`'s address space in pages (the first field
/// of `/proc/PID/statm`: the kernel's count, no walk of the areas).
fn vm_pages(pid: i32) -> Result<u64> {
    let text = proc::read(pid, "statm")?;
    text.split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .ok_or_else(|| {
            crate::SaveError::ProcFormat {
                pid,
                file: "statm".into(),
                what: format!("no size in {text:?}"),
            }
            .into()
        })
}

/// The areas (by start) of `maps` that the snapshot `child_maps` lacks
/// (`MADV_DONTFORK`): a fork does not copy them.
pub fn unforked_areas(maps: &[proc::MapsEntry], child_maps: &[proc::MapsEntry]) -> Vec<u64> {
    maps.iter()
        .filter(|m| m.name != "[vsyscall]")
        .filter(|m| {
            !child_maps
                .iter()
                .any(|c| c.start == m.start && c.end == m.end)
        })
        .map(|m| m.start)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn areas_missing_in_the_snapshot_are_unforked() {
        let maps = proc::parse_maps(
            "1000-2000 rw-p 00000000 00:00 0\n3000-5000 rw-p 00000000 00:00 0\nffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]\n",
        )
        .unwrap();
        let child = proc::parse_maps("1000-2000 rw-p 00000000 00:00 0\n").unwrap();
        assert_eq!(unforked_areas(&maps, &child), vec![0x3000]);
        assert!(unforked_areas(&maps, &maps).is_empty());
    }
}
