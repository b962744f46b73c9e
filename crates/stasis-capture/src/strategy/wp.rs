//! Write-protection: private anonymous memory is write-protected by a
//! userfaultfd ([`crate::cow`]) before the freeze; after the release, the
//! copier and the fault handlers share the pages still owed. Kept between
//! dumps ([`cow::CowTracking`]), the protection also tells an incremental
//! dump which pages were written since the last one.

use stasis_image::manifest::Manifest;
use stasis_image::PackWriter;

use super::{cow_lost, CopyCx, CopyStrategy, PlanCx, Planned};
use crate::copy::{Pending, ProcCopy};
use crate::freeze::Frozen;
use crate::{cow, memory, ConcurrentStats, Result};

/// Copies from write-protected memory after the release.
pub struct WriteProtect {
    cow: Option<cow::Cow>,
    /// The protection kept after the copy for the next dump.
    kept: Option<(cow::Cow, Vec<(i32, u64)>)>,
}

impl WriteProtect {
    /// Uses the protection `kept` from the last dump, or protects the tree
    /// of `root` now (`tracked`: kept after this dump too); `cap`: most
    /// bytes the fault handlers hold.
    pub fn new(kept: Option<cow::Cow>, tracked: bool, root: i32, cap: u64) -> Result<Self> {
        let cow = match kept {
            Some(c) => c,
            None => {
                let mut c = if tracked {
                    cow::CowTracking::new_cow(cap)
                } else {
                    cow::Cow::new(cap)
                };
                c.prepare(root).map_err(|e| cow_lost(root, e))?;
                c
            }
        };
        Ok(Self {
            cow: Some(cow),
            kept: None,
        })
    }
}

impl CopyStrategy for WriteProtect {
    fn method(&self) -> Option<&'static str> {
        Some("uffd")
    }

    fn on_frozen(&mut self, f: &mut Frozen) {
        if let Some(c) = &self.cow {
            c.name_restarted_syscalls(f);
            c.enter_checkpoint();
        }
    }

    fn plan(&mut self, cx: PlanCx<'_>) -> Result<Planned> {
        super::stop::plan_in_place(cx, self.cow.as_ref())
    }

    fn track_name(&self) -> Option<&'static str> {
        Some(cow::TRACK_NAME)
    }

    /// Private anonymous pages are protected (those the prepare step left
    /// unprotected) and copied after the release; the rest is read now.
    /// A failure drops the protection at once, the tree still frozen.
    fn before_release(
        &mut self,
        copies: &mut [ProcCopy],
        manifest: &Manifest,
        f: &mut Frozen,
    ) -> Result<()> {
        let Some(mut armed) = self.cow.take() else {
            return Ok(());
        };
        for c in copies.iter_mut() {
            arm_one(&mut armed, c, manifest, f)?;
        }
        self.cow = Some(armed);
        tracing::debug!("memory write-protected");
        Ok(())
    }

    fn copy(&mut self, p: &mut Pending, cx: CopyCx<'_, '_>) -> Result<()> {
        let total = p.total_bytes();
        let (mut pages, mut bytes, mut done) = (0u64, 0u64, 0u64);
        let Some(cow) = self.cow.as_ref() else {
            return Ok(());
        };
        for c in &mut p.copies {
            let mut pack = p.ck.create_pack(c.pid)?;
            copy_process(cow, c, &mut pack, &mut done, (total, cx.progress))?;
            pages += pack.pages();
            bytes += pack.bytes();
            p.manifest.processes[c.idx].pack = Some(pack.finish()?);
        }
        let figures = match self.cow.take() {
            Some(mut cow) if cow.is_tracking() => {
                let procs: Vec<(i32, u64)> = p
                    .copies
                    .iter()
                    .filter(|c| c.cow.is_some())
                    .map(|c| {
                        let i = &p.manifest.processes[c.idx];
                        (i.pid, i.start_time)
                    })
                    .collect();
                let f = cow.end_copy()?;
                self.kept = Some((cow, procs));
                f
            }
            Some(cow) => cow.finish()?,
            None => cow::CowFigures::default(),
        };
        p.manifest.stats.pages_written = pages;
        p.report.pages = pages;
        p.report.bytes = bytes;
        p.report.concurrent = Some(ConcurrentStats {
            method: "uffd".into(),
            pages_after_release: pages,
            write_faults: figures.faults,
            cow_peak_bytes: figures.side_peak,
            fault_p50_us: Some(figures.p50_us),
            fault_p99_us: Some(figures.p99_us),
            fault_max_us: Some(figures.max_us),
            writer_waits: figures.waits,
            writer_wait_us: figures.wait_us,
            prepare_stop_us: figures.prepare_stop_us,
            ..Default::default()
        });
        Ok(())
    }

    fn take_kept(&mut self) -> Option<(cow::Cow, Vec<(i32, u64)>)> {
        self.kept.take()
    }
}

/// Reads now what cannot be protected, and protects the rest of one
/// frozen process.
fn arm_one(
    armed: &mut cow::Cow,
    c: &mut ProcCopy,
    manifest: &Manifest,
    f: &mut Frozen,
) -> Result<()> {
    let areas = stasis_image::chain::normalize(
        manifest.processes[c.idx]
            .vmas
            .iter()
            // userfaultfd refuses MAP_DROPPABLE areas (nothing of them is
            // saved).
            .filter(|v| {
                stasis_image::areas::private_anon(v)
                    && v.flags & stasis_sys::vmflags::DROPPABLE == 0
            })
            .map(|v| (v.start, v.end))
            .collect(),
    );
    let spans = memory::spans(&c.ranges);
    let rest = stasis_image::chain::subtract(&spans, &areas);
    c.preread(&rest)?;
    let protect = memory::spans(&c.ranges);
    let used: Vec<(u64, u64)> = areas
        .iter()
        .filter(|a| protect.iter().any(|r| r.0 < a.1 && r.1 > a.0))
        .copied()
        .collect();
    let Some(fp) = f.procs.iter_mut().find(|p| p.pid == c.pid) else {
        return Ok(());
    };
    let unprotected = stasis_image::chain::intersect(&c.unprotected, &protect);
    c.cow = Some(armed.arm_frozen(fp, &used, &protect, &unprotected)?);
    Ok(())
}

/// Copies one process's pages into its pack in address order: what was
/// read in the freeze, and the pieces to take now (aligned on
/// [`cow::PIECE`], so that no grain straddles two).
fn copy_process(
    cow: &cow::Cow,
    c: &mut ProcCopy,
    pack: &mut PackWriter,
    done: &mut u64,
    (total, progress): (u64, crate::ProgressFn<'_>),
) -> Result<()> {
    let mut pieces: Vec<(u64, u64, Option<Vec<u8>>)> = std::mem::take(&mut c.preread)
        .into_iter()
        .map(|(a, d)| (a, a + d.len() as u64, Some(d)))
        .collect();
    for (a, e) in memory::spans(&c.ranges) {
        let mut s = a;
        while s < e {
            let end = ((s / cow::PIECE + 1) * cow::PIECE).min(e);
            pieces.push((s, end, None));
            s = end;
        }
    }
    pieces.sort_by_key(|p| p.0);
    for (a, e, data) in pieces {
        let data = match (data, c.cow) {
            (Some(d), _) => d,
            (None, Some(i)) => cow.take_piece(i, a, e)?,
            (None, None) => {
                let mut d = vec![0u8; usize::try_from(e - a).unwrap_or(0)];
                stasis_kernel::mem::read_ranges(&c.mem, &[(a, d.len())], &mut d)?;
                d
            }
        };
        pack.write_run(a, &data)?;
        *done += e - a;
        if let Some(p) = progress {
            p(*done, total);
        }
    }
    Ok(())
}
