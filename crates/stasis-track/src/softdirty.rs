//! The soft-dirty backend: `clear_refs` and bit 55 of `/proc/PID/pagemap`.
//!
//! Writing `4` to `/proc/PID/clear_refs` clears the soft-dirty bit of every
//! page of the process and write-protects them; the first write after that
//! sets the bit again. Areas created after the clear are soft-dirty as a
//! whole (`VM_SOFTDIRTY`), so new, grown and moved areas show up by
//! themselves. This needs `CONFIG_MEM_SOFT_DIRTY`, which some kernels (this
//! project's CI machine among them) do not have: [`probe`] finds out, and
//! the logic is tested through the [`SoftDirtyOps`] seam.

use std::io::Write;

use stasis_kernel::pagemap::Pagemap;
use stasis_sys as sys;

use crate::{Area, ArmReport, Backend, Dirty, DirtyTracker, Remote, Result, TrackError};

/// The kernel operations the backend needs.
pub trait SoftDirtyOps {
    /// Clears the soft-dirty bits of every page of `pid`.
    fn clear(&mut self, pid: i32) -> Result<()>;
    /// Raw pagemap entries of the pages of `[start, end)` of `pid`.
    fn entries(&mut self, pid: i32, start: u64, end: u64) -> Result<Vec<u64>>;
}

/// The real operations, through `/proc`.
pub struct ProcOps;

impl SoftDirtyOps for ProcOps {
    fn clear(&mut self, pid: i32) -> Result<()> {
        let path = format!("/proc/{pid}/clear_refs");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(b"4"))
            .map_err(|source| TrackError::Io {
                what: "writing 4 to",
                path,
                source,
            })
    }

    fn entries(&mut self, pid: i32, start: u64, end: u64) -> Result<Vec<u64>> {
        Pagemap::open(pid)
            .and_then(|pm| pm.read_entries(start, end))
            .map_err(|source| TrackError::Process {
                pid,
                what: format!("reading pagemap entries of {start:#x}-{end:#x}"),
                source,
            })
    }
}

/// Checks that soft-dirty bits work here: a page of this process written
/// after a clear must show the bit, and not before the write.
pub fn probe() -> Result<()> {
    let unsupported = |why: String| TrackError::Unsupported {
        backend: "soft-dirty",
        why,
    };
    let pid = std::process::id() as i32;
    let mut buf = vec![1u8; 3 * 4096];
    let base = buf.as_ptr() as u64;
    let page = (base + sys::PAGE_SIZE - 1) & !(sys::PAGE_SIZE - 1);
    let off = usize::try_from(page - base).unwrap_or(0);
    let mut ops = ProcOps;
    let bit = |ops: &mut ProcOps| -> Result<bool> {
        Ok(ops
            .entries(pid, page, page + sys::PAGE_SIZE)?
            .first()
            .copied()
            .unwrap_or(0)
            & sys::PM_SOFT_DIRTY
            != 0)
    };
    ops.clear(pid).map_err(|e| unsupported(e.to_string()))?;
    let before = bit(&mut ops)?;
    buf[off] = std::hint::black_box(2);
    let after = bit(&mut ops)?;
    std::hint::black_box(&buf);
    if before || !after {
        return Err(unsupported(
            "the kernel does not keep soft-dirty bits (CONFIG_MEM_SOFT_DIRTY is off)".into(),
        ));
    }
    Ok(())
}

/// The soft-dirty tracker over some [`SoftDirtyOps`].
pub struct SoftDirtyTracker<O> {
    ops: O,
}

impl<O: SoftDirtyOps> SoftDirtyTracker<O> {
    pub fn new(ops: O) -> Self {
        Self { ops }
    }
}

impl<O: SoftDirtyOps> DirtyTracker for SoftDirtyTracker<O> {
    fn backend(&self) -> Backend {
        Backend::SoftDirty
    }

    fn dirty(&mut self, pid: i32, area: &Area) -> Result<Dirty> {
        let entries = self.ops.entries(pid, area.start, area.end)?;
        let pages = (0u64..).zip(entries).filter_map(|(i, e)| {
            let marker =
                e & sys::PM_PRESENT == 0 && e & sys::PM_SWAP_TYPE_MASK == sys::SWP_PTE_MARKER;
            let has_data = e & (sys::PM_PRESENT | sys::PM_SWAPPED) != 0 && !marker;
            (has_data && e & sys::PM_SOFT_DIRTY != 0).then(|| {
                let a = area.start + i * sys::PAGE_SIZE;
                (a, a + sys::PAGE_SIZE)
            })
        });
        Ok(Dirty::Ranges(crate::merge_ranges(pages)))
    }

    fn arm(&mut self, pid: i32, _areas: &[Area], _remote: &mut dyn Remote) -> Result<ArmReport> {
        self.ops.clear(pid)?;
        Ok(ArmReport::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const P: u64 = sys::PAGE_SIZE;

    /// A fake kernel: pages with data and soft-dirty bits per process, and
    /// a log of the calls.
    #[derive(Default)]
    struct Fake {
        pages: HashMap<(i32, u64), u64>,
        log: Vec<String>,
    }

    impl Fake {
        fn write(&mut self, pid: i32, addr: u64) {
            self.pages
                .insert((pid, addr), sys::PM_PRESENT | sys::PM_SOFT_DIRTY);
        }
    }

    impl SoftDirtyOps for Fake {
        fn clear(&mut self, pid: i32) -> Result<()> {
            self.log.push(format!("clear {pid}"));
            for ((p, _), e) in self.pages.iter_mut() {
                if *p == pid {
                    *e &= !sys::PM_SOFT_DIRTY;
                }
            }
            Ok(())
        }
        fn entries(&mut self, pid: i32, start: u64, end: u64) -> Result<Vec<u64>> {
            self.log.push(format!("entries {pid} {start:#x}-{end:#x}"));
            Ok((start..end)
                .step_by(4096)
                .map(|a| self.pages.get(&(pid, a)).copied().unwrap_or(0))
                .collect())
        }
    }

    fn area(start: u64, end: u64) -> Area {
        Area {
            start,
            end,
            private_anon: true,
        }
    }

    #[test]
    fn reports_pages_written_since_the_clear() {
        let mut fake = Fake::default();
        for a in 0..8 {
            fake.write(7, 0x10000 + a * P);
        }
        let mut t = SoftDirtyTracker::new(fake);
        let a = area(0x10000, 0x10000 + 8 * P);
        // Before any clear every page with data is dirty.
        assert_eq!(
            t.dirty(7, &a).unwrap(),
            Dirty::Ranges(vec![(0x10000, 0x10000 + 8 * P)])
        );
        let mut remote = stasis_kernel::remote::Recorder::default();
        t.arm(7, &[a], &mut remote).unwrap();
        assert!(
            remote.calls.is_empty(),
            "no remote syscall: {:?}",
            remote.calls
        );
        assert_eq!(t.dirty(7, &a).unwrap(), Dirty::Ranges(vec![]));
        t.ops.write(7, 0x10000 + 2 * P);
        t.ops.write(7, 0x10000 + 3 * P);
        t.ops.write(7, 0x10000 + 6 * P);
        t.ops.write(8, 0x10000 + 5 * P); // another process
        assert_eq!(
            t.dirty(7, &a).unwrap(),
            Dirty::Ranges(vec![
                (0x10000 + 2 * P, 0x10000 + 4 * P),
                (0x10000 + 6 * P, 0x10000 + 7 * P)
            ])
        );
        assert_eq!(t.ops.log[1], "clear 7");
    }

    #[test]
    fn soft_dirty_without_data_is_not_saved() {
        let mut fake = Fake::default();
        // Soft-dirty but neither present nor swapped (dropped by MADV_DONTNEED
        // in a new area): nothing to save.
        fake.pages.insert((1, 0x5000), sys::PM_SOFT_DIRTY);
        fake.pages
            .insert((1, 0x6000), sys::PM_SWAPPED | sys::PM_SOFT_DIRTY);
        let mut t = SoftDirtyTracker::new(fake);
        assert_eq!(
            t.dirty(1, &area(0x5000, 0x7000)).unwrap(),
            Dirty::Ranges(vec![(0x6000, 0x7000)])
        );
    }
}
