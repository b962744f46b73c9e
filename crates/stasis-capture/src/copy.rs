//! The copy stage: the pages planned for each process, where to read them,
//! and the checkpoint being written ([`Pending`]) until it is committed.

use std::time::{Duration, Instant};

use stasis_image::manifest::Manifest;
use stasis_image::{ImageDir, PackWriter};
use stasis_kernel::mem::ProcessMemory;
use stasis_sys as sys;

use crate::strategy::CopyCx;
use crate::SaveError;
use crate::{
    freeze, incremental, memory, micros, proc, snapshot, ConcurrentStats, DumpReport, Result,
    TrackerRef,
};

/// The pages of one process to save, and where to read them.
pub struct ProcCopy {
    /// Index of the process in the manifest.
    pub idx: usize,
    pub pid: i32,
    /// Ranges to save, in address order.
    pub ranges: Vec<(u64, usize)>,
    /// The process itself (stop-the-world, and what the snapshot lacks).
    pub mem: ProcessMemory,
    pub snapshot: Option<snapshot::Snapshot>,
    /// Areas a fork does not copy.
    pub unforked: Vec<(u64, u64)>,
    /// Their pages, read while frozen (concurrent dumps).
    pub preread: Vec<(u64, Vec<u8>)>,
    pub selection: Option<incremental::Selection>,
    /// Concurrent dumps: what is planned after the release.
    pub deferred: Option<Deferred>,
    /// Write-protected concurrent dumps: the process's index in the
    /// [`crate::cow::Cow`], and its pages with data the prepare step left
    /// unprotected.
    pub cow: Option<usize>,
    pub unprotected: Vec<(u64, u64)>,
}

/// The part of a concurrent dump's memory plan made after the release,
/// from the snapshot: which pages hold data, `VmFlags`, and the dirty set.
pub struct Deferred {
    pub snapshot: Option<snapshot::Snapshot>,
    pub maps: Vec<proc::MapsEntry>,
    /// Incremental: what the tracker collected in the freeze, and the
    /// parent's data ranges of this process.
    pub collected: Option<Collected>,
    /// Shared memory objects (read in the freeze, not from the snapshot).
    pub shm_seen: crate::memory::SeenShm,
    /// Each area's `VmFlags` bits, when they had to be read in the freeze
    /// (the snapshot's would miss some); else they come from the snapshot.
    pub vmflags: Option<Vec<(u64, u32)>>,
}

/// What a tracker collected for each area, and the parent's data ranges.
pub type Collected = (
    Vec<(stasis_track::Area, stasis_track::Dirty)>,
    stasis_image::chain::Ranges,
);

impl ProcCopy {
    /// Concurrent dumps: plans the pages to copy from the snapshot, and
    /// fixes the process's areas (with `VmFlags` from the snapshot's smaps)
    /// and data ranges in the manifest.
    pub fn plan_from_snapshot(&mut self, image: &mut stasis_image::ProcessImage) -> Result<()> {
        let (Some(mut d), Some(snap)) = (self.deferred.take(), self.snapshot.as_ref()) else {
            return Ok(());
        };
        let smaps = proc::read(snap.pid, "smaps")?;
        if let Some(a) = proc::parse_smaps_flagged(&smaps, "wf").first() {
            return Err(SaveError::Unsupported {
                pid: self.pid,
                what: format!(
                    "area {a:#x} is MADV_WIPEONFORK, which a copy-on-write snapshot does not keep: dump it without --concurrent"
                ),
            }.into());
        }
        let vmflags = d
            .vmflags
            .take()
            .unwrap_or_else(|| proc::parse_smaps_vmflags(&smaps));
        let plan = memory::plan(snap.pid, &d.maps, &vmflags, &mut d.shm_seen)?;
        // Shared memory and areas not mapped in the snapshot
        // (MADV_DONTFORK) were read in the freeze.
        let pre = stasis_image::chain::normalize(
            self.preread
                .iter()
                .map(|(a, b)| (*a, *a + b.len() as u64))
                .collect(),
        );
        let mut data = memory::spans(&plan.ranges);
        data.extend(pre.iter().copied());
        let data = stasis_image::chain::normalize(data);
        let read = match &d.collected {
            Some((collected, parent_data)) => {
                let sel = incremental::select_collected(collected, &data, parent_data);
                let read = sel.read.clone();
                image.data_ranges = Some(data);
                self.selection = Some(sel);
                read
            }
            None => memory::spans(&plan.ranges),
        };
        // The pre-read pieces are written whole, from their buffers.
        self.ranges = memory::lengths(&stasis_image::chain::subtract(&read, &pre));
        image.vmas = plan.vmas;
        Ok(())
    }

    /// Reads the ranges that lie in `now` (normalized spans) at once;
    /// the rest stays to copy.
    pub fn preread(&mut self, now: &[(u64, u64)]) -> Result<()> {
        use stasis_image::chain;
        let ranges = memory::spans(&self.ranges);
        for (a, e) in chain::intersect(&ranges, now) {
            let mut buf = vec![0u8; usize::try_from(e - a).unwrap_or(0)];
            stasis_kernel::mem::read_ranges(&self.mem, &[(a, buf.len())], &mut buf)?;
            self.preread.push((a, buf));
        }
        self.preread.sort_by_key(|p| p.0);
        self.ranges = memory::lengths(&chain::subtract(&ranges, now));
        Ok(())
    }
}

/// Size of the pieces a concurrent dump copies, then frees in the snapshot.
pub const SNAPSHOT_CHUNK: usize = 32 << 20;

/// Splits ranges longer than `max` bytes.
pub fn split_ranges(ranges: Vec<(u64, usize)>, max: usize) -> Vec<(u64, usize)> {
    let mut out = Vec::with_capacity(ranges.len());
    for (mut a, mut l) in ranges {
        while l > max {
            out.push((a, max));
            a += max as u64;
            l -= max;
        }
        out.push((a, l));
    }
    out
}

/// Minor faults of the live processes of a tree (`/proc/PID/stat` field 10).
fn minor_faults(pids: &[i32]) -> u64 {
    pids.iter()
        .filter_map(|p| stasis_kernel::procfs::stat(*p).ok())
        .map(|s| s.minflt)
        .sum()
}

/// A checkpoint written but not yet committed, and what to record once it
/// is.
pub struct Pending {
    pub ck: stasis_image::CheckpointBuilder,
    pub manifest: Manifest,
    pub state: Option<stasis_track::state::TrackState>,
    pub copies: Vec<ProcCopy>,
    pub by_content: bool,
    pub report: DumpReport,
    /// A tree in a PID namespace of its own: each PID (and TID) there, by
    /// the one stasis uses; the manifest is given the former at the commit
    /// (everything before it works with the latter).
    pub ns_pids: Option<std::collections::HashMap<i32, i32>>,
}

/// Fork snapshots: the copy-on-write memory they hold, watched against
/// the cap while the tree runs (it is stopped above the cap), and the
/// figures of the copy.
struct CapWatch {
    live: Vec<i32>,
    snapshot_pids: Vec<i32>,
    faults0: u64,
    last_sample: Instant,
    held_now: u64,
    /// Pages still to copy.
    remaining: u64,
    paused: Option<(freeze::Frozen, Instant)>,
    stats: ConcurrentStats,
}

impl CapWatch {
    fn new(p: &Pending, concurrent: bool, total: u64) -> Self {
        let live: Vec<i32> = p.copies.iter().map(|c| c.pid).collect();
        Self {
            faults0: if concurrent { minor_faults(&live) } else { 0 },
            snapshot_pids: p
                .copies
                .iter()
                .filter_map(|c| c.snapshot.as_ref().map(|s| s.pid))
                .collect(),
            live,
            last_sample: Instant::now(),
            held_now: 0,
            remaining: total / sys::PAGE_SIZE,
            paused: None,
            stats: ConcurrentStats {
                method: "fork".into(),
                ..Default::default()
            },
        }
    }

    /// `size` bytes were saved from a snapshot: a cheap upper bound of the
    /// memory held first (the tree's minor faults since the snapshot); the
    /// snapshots' page walk only near the cap (and every 50 ms at most,
    /// for the figure). Stops the tree of `root` above the cap.
    fn saved(&mut self, size: u64, root: i32, cow_cap: u64) -> Result<()> {
        self.remaining = self.remaining.saturating_sub(size / sys::PAGE_SIZE);
        if self.paused.is_some() {
            return Ok(());
        }
        let faults = minor_faults(&self.live).saturating_sub(self.faults0);
        let bound = faults * sys::PAGE_SIZE;
        let near_cap = cow_cap > 0 && bound > cow_cap;
        let sample_due = self.last_sample.elapsed() >= Duration::from_millis(50);
        if near_cap || sample_due {
            self.last_sample = Instant::now();
            let held: u64 = self
                .snapshot_pids
                .iter()
                .map(|p| snapshot::private_bytes(*p))
                .sum();
            self.stats.cow_peak_bytes = self.stats.cow_peak_bytes.max(held);
            self.held_now = held;
        }
        let held = if near_cap { self.held_now } else { 0 };
        if cow_cap > 0 && held > cow_cap && self.remaining > 0 {
            self.paused = Some((
                freeze::freeze_tree_except(root, &self.snapshot_pids)?,
                Instant::now(),
            ));
            self.stats.paused += 1;
        }
        Ok(())
    }

    /// The copy is over: the figures, and the tree released if it was
    /// stopped.
    fn end(mut self, concurrent: bool, pages: u64) -> Result<ConcurrentStats> {
        if concurrent {
            self.stats.write_faults = minor_faults(&self.live).saturating_sub(self.faults0);
            self.stats.pages_after_release = pages;
        }
        if let Some((mut p, since)) = self.paused.take() {
            p.release()?;
            self.stats.paused_us = micros(since);
        }
        Ok(self.stats)
    }
}

/// Where the pages of one process go, and how the copy goes.
struct CopyRun<'a, 't> {
    tracker: &'a mut TrackerRef<'t>,
    by_content: bool,
    progress: Option<&'a (dyn Fn(u64, u64) + Send)>,
    root: i32,
    cow_cap: u64,
    done: u64,
    total: u64,
}

impl CopyRun<'_, '_> {
    /// Copies one process's pages into `pack`: the pre-read pieces between
    /// the copied ranges, in address order; from a snapshot, in chunks,
    /// each freed in the snapshot once saved, with the cap checked.
    fn process(&mut self, c: &mut ProcCopy, pack: &mut PackWriter, w: &mut CapWatch) -> Result<()> {
        let pid = c.pid;
        let sel = c.selection.as_ref();
        let tracker = &mut *self.tracker;
        let mut filter = |addr: u64, page: &[u8]| -> bool {
            let changed = tracker
                .as_mut()
                .is_none_or(|t| t.page_changed(pid, addr, page));
            match sel {
                Some(s) if s.by_content => changed || incremental::contains(&s.forced, addr),
                _ => true,
            }
        };
        // From the snapshot, or from the frozen process itself.
        let snap_mem = c.snapshot.as_ref().map(|s| s.memory()).transpose()?;
        let src = snap_mem.as_ref().unwrap_or(&c.mem);
        let mut pre = std::mem::take(&mut c.preread).into_iter().peekable();
        let chunk = if c.snapshot.is_some() {
            SNAPSHOT_CHUNK
        } else {
            usize::MAX
        };
        let mut ranges = split_ranges(std::mem::take(&mut c.ranges), chunk)
            .into_iter()
            .peekable();
        loop {
            let next_pre = pre.peek().map(|p| p.0);
            let next_range = ranges.peek().map(|r| r.0);
            match (next_pre, next_range) {
                (None, None) => break,
                (Some(a), r) if r.is_none_or(|r| a < r) => {
                    let (a, data) = pre.next().unwrap_or_default();
                    if self.by_content {
                        let mut f: memory::PageFilter<'_> = &mut filter;
                        memory::write_filtered(pack, &mut f, a, &data)?;
                    } else {
                        pack.write_run(a, &data)?;
                    }
                    self.done += data.len() as u64;
                }
                _ => {
                    // Every range up to the next pre-read piece.
                    let mut batch = Vec::new();
                    let mut batch_len = 0usize;
                    while let Some(&(a, l)) = ranges.peek() {
                        if next_pre.is_some_and(|p| p < a)
                            || (batch_len > 0 && batch_len + l > chunk)
                        {
                            break;
                        }
                        batch.push((a, l));
                        batch_len += l;
                        ranges.next();
                    }
                    let size: u64 = batch.iter().map(|r| r.1 as u64).sum();
                    memory::copy_pages(
                        src,
                        batch.clone(),
                        pack,
                        (self.done, self.total, self.progress),
                        self.by_content
                            .then_some(&mut filter as memory::PageFilter<'_>),
                    )?;
                    self.done += size;
                    if let Some(s) = c.snapshot.as_mut() {
                        // Saved: the snapshot's copies can go.
                        for &(a, l) in &batch {
                            s.release_range(a, l as u64)?;
                        }
                        w.saved(size, self.root, self.cow_cap)?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl Pending {
    /// Whether the dump copies from snapshots (after the release).
    fn copies_snapshots(&self) -> bool {
        self.copies.iter().any(|c| c.snapshot.is_some())
    }

    /// Copies every process's pages into its pack (from the snapshots if
    /// there are any, else from the frozen processes), then lets the
    /// tracker finish arming.
    pub fn copy_pages(&mut self, cx: CopyCx<'_, '_>) -> Result<()> {
        let CopyCx {
            root,
            mut tracker,
            progress,
            cow_cap,
        } = cx;
        let total = self.total_bytes();
        let concurrent = self.copies_snapshots();
        let mut watch = CapWatch::new(self, concurrent, total);
        let mut run = CopyRun {
            tracker: &mut tracker,
            by_content: self.by_content,
            progress,
            root,
            cow_cap,
            done: 0,
            total,
        };
        let (mut pages, mut bytes) = (0, 0);
        let result = (|| -> Result<()> {
            for c in &mut self.copies {
                let mut pack = self.ck.create_pack(c.pid)?;
                run.process(c, &mut pack, &mut watch)?;
                pages += pack.pages();
                bytes += pack.bytes();
                self.manifest.processes[c.idx].pack = Some(pack.finish()?);
            }
            Ok(())
        })();
        let stats = watch.end(concurrent, pages)?;
        result?;
        self.manifest.stats.pages_written = pages;
        self.report.pages = pages;
        self.report.bytes = bytes;
        if let Some(t) = tracker.as_mut() {
            if self.state.is_some() {
                if let Err(e) = t.finish_arm() {
                    self.state = None;
                    self.report.armed = None;
                    self.report.note = Some(format!(
                        "tracking could not be re-armed, the next dump will be full: {e}"
                    ));
                }
            }
        }
        if concurrent {
            self.report.concurrent = Some(stats);
        }
        Ok(())
    }

    /// Bytes to save: the ranges to copy and what was read in the freeze.
    pub fn total_bytes(&self) -> u64 {
        self.copies
            .iter()
            .flat_map(|c| {
                c.ranges
                    .iter()
                    .map(|r| r.1 as u64)
                    .chain(c.preread.iter().map(|p| p.1.len() as u64))
            })
            .sum()
    }

    /// Commits the checkpoint, then records the tracking state (or clears
    /// it: without a committed checkpoint to be incremental against, the
    /// next dump must be full).
    /// Commits the checkpoint (for a part of a cut, once the coordinator
    /// decided: [`crate::Cut::written`]) and records the tracking state.
    pub fn finish(self, store: &ImageDir, cut: Option<&dyn crate::Cut>) -> Result<DumpReport> {
        let Pending {
            mut ck,
            mut manifest,
            state,
            mut report,
            ns_pids,
            ..
        } = self;
        if let Some(pids) = &ns_pids {
            crate::ns::translate_pids(&mut manifest, pids);
        }
        let committed = match cut {
            None => ck.commit(&manifest).map_err(crate::CaptureError::from),
            Some(c) => ck
                .prepare(&manifest)
                .map_err(crate::CaptureError::from)
                .and_then(|()| Ok(c.written(manifest.checkpoint)?))
                .and_then(|()| Ok(ck.commit_prepared()?)),
        };
        if let Err(e) = committed {
            let _ = stasis_track::state::clear(store.path());
            return Err(e);
        }
        match state {
            Some(s) => {
                if let Err(e) = stasis_track::state::save(store.path(), &s) {
                    report.armed = None;
                    report.note = Some(format!("tracking could not be recorded: {e}"));
                }
            }
            None => {
                let _ = stasis_track::state::clear(store.path());
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_ranges_are_split_into_chunks() {
        assert_eq!(
            split_ranges(vec![(0, 10), (100, 3)], 4),
            vec![(0, 4), (4, 4), (8, 2), (100, 3)]
        );
        assert_eq!(split_ranges(vec![(0, 8)], usize::MAX), vec![(0, 8)]);
    }
}
