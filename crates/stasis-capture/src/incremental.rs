//! Incremental dumps: which pages of a process to save given a dirty
//! tracker and the parent checkpoint, and re-arming after the commit.

use stasis_image::areas::tracked_anon;
use stasis_image::chain::{self, Ranges};
use stasis_image::manifest::{Vma, VmaKind};
use stasis_image::{Checkpoint, ImageDir};
use stasis_track::state::TrackState;
use stasis_track::{Area, Dirty, DirtyTracker};

use crate::{CaptureError, Result};

/// Against what a dump is incremental.
pub struct Base {
    pub parent: Checkpoint,
    pub state: TrackState,
    /// The ranges with data of each process of the parent (by PID and
    /// start time), read when the base is loaded, before the freeze: a
    /// full parent's come from its packs' indexes, which are not read
    /// while the tree is frozen.
    parent_data: std::collections::HashMap<(i32, u64), stasis_image::ranges::Ranges>,
}

impl Base {
    /// The base of a dump whose parent is `parent`; reads the ranges with
    /// data of the parent's processes now (before the freeze). One that
    /// cannot be read is read again, and its error met, where it is needed.
    pub fn new(parent: Checkpoint, state: TrackState) -> Base {
        let parent_data = parent
            .manifest
            .processes
            .iter()
            .filter(|p| p.zombie.is_none())
            .filter_map(|p| {
                let r = chain::data_ranges(&parent, p).ok()?;
                Some(((p.pid, p.start_time), r))
            })
            .collect();
        Base {
            parent,
            state,
            parent_data,
        }
    }

    /// The ranges of the parent's process `pp` that hold data.
    pub fn parent_data(
        &self,
        pp: &stasis_image::manifest::ProcessImage,
    ) -> std::result::Result<stasis_image::ranges::Ranges, stasis_image::ImageError> {
        match self.parent_data.get(&(pp.pid, pp.start_time)) {
            Some(r) => Ok(r.clone()),
            None => chain::data_ranges(&self.parent, pp),
        }
    }
}

/// Why a dump is full although tracking may have been asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FullDump {
    /// No tracking, or the first checkpoint of an image (full by nature):
    /// nothing to say.
    Untracked,
    /// Tracking was asked for but gives no usable parent: why.
    Because(String),
}

impl FullDump {
    /// The note of the report and manifest, if there is one.
    pub fn note(self) -> Option<String> {
        match self {
            FullDump::Untracked => None,
            FullDump::Because(why) => Some(why),
        }
    }
}

impl From<String> for FullDump {
    fn from(why: String) -> Self {
        FullDump::Because(why)
    }
}

/// Decides whether this dump can be incremental: tracking with the same
/// backend must have been armed right after the latest checkpoint, on the
/// same root. Returns the base, or the reason it is a full dump.
pub fn base(
    store: &ImageDir,
    tracker: &dyn DirtyTracker,
    root: i32,
    root_start: u64,
) -> std::result::Result<Base, FullDump> {
    if matches!(store.latest(), Ok(None)) {
        return Err(FullDump::Untracked);
    }
    let state = match stasis_track::state::load(store.path()) {
        Ok(Some(s)) => s,
        Ok(None) => return Err(FullDump::Because("tracking was not armed after the latest checkpoint (it was restored, a dump failed since, or it was dumped without --track --leave-running)".into())),
        Err(e) => return Err(e.to_string().into()),
    };
    let latest = match store.latest() {
        Ok(Some(n)) => n,
        // The first checkpoint of an image is full by nature: no note.
        Ok(None) => return Err(FullDump::Untracked),
        Err(e) => return Err(e.to_string().into()),
    };
    if state.backend != tracker.backend() {
        return Err(FullDump::Because(format!(
            "tracking was armed with {} but this dump uses {}",
            state.backend,
            tracker.backend()
        )));
    }
    if state.armed_at != latest {
        return Err(FullDump::Because(format!(
            "tracking was armed after checkpoint {} but the latest is {latest}",
            state.armed_at
        )));
    }
    if state.root_pid != root || !state.procs.contains(&(root, root_start)) {
        return Err(FullDump::Because(format!(
            "tracking was armed on the tree of process {}, not this one",
            state.root_pid
        )));
    }
    match chain::load_chain(store, Some(latest)) {
        Ok(mut c) if !c.is_empty() => Ok(Base::new(c.swap_remove(0), state)),
        Ok(_) => Err(FullDump::Because(
            "the latest checkpoint cannot be loaded".into(),
        )),
        Err(e) => Err(FullDump::Because(format!(
            "the latest checkpoint cannot be used as a parent: {e}"
        ))),
    }
}

/// The tracker's view of a process's areas.
pub fn areas(vmas: &[Vma]) -> Vec<Area> {
    vmas.iter()
        .filter(|v| !matches!(v.kind, VmaKind::Vdso | VmaKind::Vvar | VmaKind::VvarVclock))
        .map(|v| Area {
            start: v.start,
            end: v.end,
            // PROT_NONE areas are left out (see `tracked_anon`).
            private_anon: tracked_anon(v),
        })
        .collect()
}

/// Each area's `VmFlags` bits (as `proc::parse_smaps_vmflags` gives
/// them), taken from the parent checkpoint's image of this process if the
/// process has exactly the same areas now (same starts and ends), else
/// `None`. (Advice given to a whole area since the parent, which changes
/// no boundary, is not seen: reading `smaps` again walks every page table.)
pub fn same_layout(
    parent: &stasis_image::ProcessImage,
    maps: &[crate::proc::MapsEntry],
) -> Option<Vec<(u64, u32)>> {
    let now = maps
        .iter()
        .filter(|m| m.name != "[vsyscall]")
        .map(|m| (m.start, m.end));
    let then = parent.vmas.iter().map(|v| (v.start, v.end));
    if !now.eq(then) {
        return None;
    }
    Some(
        parent
            .vmas
            .iter()
            .map(|v| {
                let gd = if v.growsdown {
                    stasis_sys::vmflags::GROWSDOWN
                } else {
                    0
                };
                (v.start, v.flags | gd)
            })
            .filter(|f| f.1 != 0)
            .collect(),
    )
}

/// What to save of one process in an incremental dump.
pub struct Selection {
    /// Ranges to read (the pages possibly changed).
    pub read: Ranges,
    /// Pages that must be written whatever a content filter says (they
    /// are in no ancestor).
    pub forced: Ranges,
    /// The tracker decides page by page from content.
    pub by_content: bool,
    /// Areas with data that the tracker covered (not [`Dirty::All`]).
    pub tracked: usize,
}

/// Asks the tracker what changed in every area of a frozen process (for
/// uffd this also re-arms the areas it covers).
pub fn collect(
    tracker: &mut dyn DirtyTracker,
    pid: i32,
    areas: &[Area],
) -> Result<Vec<(Area, Dirty)>> {
    areas
        .iter()
        .map(|a| {
            tracker
                .dirty(pid, a)
                .map(|d| (*a, d))
                .map_err(|e| CaptureError::Track(e.to_string()))
        })
        .collect()
}

/// Chooses the pages of a process to save: those the tracker reports
/// changed, whole untracked areas, and pages with data that the parent does
/// not have. `data` is every range with data now, `parent_data` the
/// parent's (for this same process).
pub fn select(
    tracker: &mut dyn DirtyTracker,
    pid: i32,
    areas: &[Area],
    data: &Ranges,
    parent_data: &Ranges,
) -> Result<Selection> {
    let collected = collect(tracker, pid, areas)?;
    Ok(select_collected(&collected, data, parent_data))
}

/// [`select`] from what [`collect`] returned.
pub fn select_collected(
    collected: &[(Area, Dirty)],
    data: &Ranges,
    parent_data: &Ranges,
) -> Selection {
    let mut dirty = Vec::new();
    let mut by_content = false;
    let mut tracked = 0;
    for (a, d) in collected {
        let here = chain::intersect(data, &[(a.start, a.end)]);
        if !matches!(d, Dirty::All) {
            tracked += 1;
        }
        match d {
            Dirty::All => dirty.extend(here),
            Dirty::Ranges(r) => dirty.extend(chain::intersect(&here, r)),
            Dirty::ByContent => {
                by_content = true;
                dirty.extend(here);
            }
        }
    }
    let dirty = chain::normalize(dirty);
    let orphans = chain::subtract(&chain::subtract(data, &dirty), parent_data);
    let forced = if by_content {
        chain::subtract(data, parent_data)
    } else {
        Vec::new()
    };
    let mut read = dirty;
    read.extend(orphans);
    Selection {
        read: chain::normalize(read),
        forced,
        by_content,
        tracked,
    }
}

/// Whether collection found the tracking lost in a process: the uffd
/// backend covers none of its private anonymous areas (after `exec`, or
/// when the holder of its userfaultfd died).
pub fn tracking_lost(backend: stasis_track::Backend, collected: &[(Area, Dirty)]) -> bool {
    backend == stasis_track::Backend::Uffd
        && collected.iter().any(|(a, _)| a.private_anon)
        && collected.iter().all(|(_, d)| matches!(d, Dirty::All))
}

/// The note of a dump that found the tracking of process `pid` lost.
pub fn lost_note(pid: i32) -> String {
    format!(
        "tracking is no longer armed in process {pid}: no area of it is registered (it called exec, or the holder of its userfaultfd exited); its pages are all saved"
    )
}

/// Write-protection kept since the parent as a tracker's report: in a
/// private anonymous area, the pages with data that lost their protection
/// (`unprotected`) are those written since; other areas are all dirty.
pub fn unprotected_as_dirty(areas: &[Area], unprotected: &Ranges) -> Vec<(Area, Dirty)> {
    areas
        .iter()
        .map(|a| {
            let d = if a.private_anon {
                Dirty::Ranges(chain::intersect(unprotected, &[(a.start, a.end)]))
            } else {
                Dirty::All
            };
            (*a, d)
        })
        .collect()
}

/// True if `addr` lies in one of the sorted `ranges`.
pub fn contains(ranges: &Ranges, addr: u64) -> bool {
    let i = ranges.partition_point(|r| r.1 <= addr);
    ranges.get(i).is_some_and(|r| r.0 <= addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use stasis_kernel::remote::Remote;
    use stasis_track::{ArmReport, Backend};

    const P: u64 = 4096;

    /// A tracker that reports fixed ranges for registered areas (by start).
    struct Fixed(Ranges, Vec<u64>);
    impl DirtyTracker for Fixed {
        fn backend(&self) -> Backend {
            Backend::Uffd
        }
        fn dirty(&mut self, _: i32, a: &Area) -> stasis_track::Result<Dirty> {
            Ok(if self.1.contains(&a.start) {
                Dirty::Ranges(self.0.clone())
            } else {
                Dirty::All
            })
        }
        fn arm(
            &mut self,
            _: i32,
            _: &[Area],
            _: &mut dyn Remote,
        ) -> stasis_track::Result<ArmReport> {
            Ok(ArmReport::default())
        }
    }

    fn area(s: u64, e: u64) -> Area {
        Area {
            start: s * P,
            end: e * P,
            private_anon: true,
        }
    }

    #[test]
    fn selects_written_untracked_and_orphan_pages() {
        // Area 0..10 tracked (pages 2..4 written), area 20..30 untracked
        // (new). Data everywhere except 5..6; the parent lacks page 8.
        let areas = [area(0, 10), area(20, 30)];
        let data = vec![(0, 5 * P), (6 * P, 10 * P), (20 * P, 25 * P)];
        let parent = vec![(0, 8 * P), (9 * P, 10 * P)];
        let mut t = Fixed(vec![(2 * P, 4 * P), (40 * P, 41 * P)], vec![0]);
        let s = select(&mut t, 1, &areas, &data, &parent).unwrap();
        assert_eq!(
            s.read,
            vec![(2 * P, 4 * P), (8 * P, 9 * P), (20 * P, 25 * P)]
        );
        assert!(!s.by_content);
        assert_eq!(s.tracked, 1);
    }

    #[test]
    fn unprotected_pages_are_the_dirty_set_of_protected_areas() {
        let areas = [
            area(0, 10),
            Area {
                start: 20 * P,
                end: 30 * P,
                private_anon: false,
            },
        ];
        let unprotected = vec![(2 * P, 3 * P), (9 * P, 22 * P)];
        let d = unprotected_as_dirty(&areas, &unprotected);
        assert_eq!(d[0].1, Dirty::Ranges(vec![(2 * P, 3 * P), (9 * P, 10 * P)]));
        assert_eq!(d[1].1, Dirty::All);
        // Written pages and orphans are read; the rest comes from the parent.
        let data = vec![(0, 10 * P)];
        let parent = vec![(0, 8 * P)];
        let s = select_collected(&d, &data, &parent);
        assert_eq!(s.read, vec![(2 * P, 3 * P), (8 * P, 10 * P)]);
    }

    #[test]
    fn contains_finds_ranges() {
        let r = vec![(P, 3 * P), (5 * P, 6 * P)];
        assert!(!contains(&r, 0));
        assert!(contains(&r, P));
        assert!(contains(&r, 2 * P + 7));
        assert!(!contains(&r, 3 * P));
        assert!(contains(&r, 5 * P));
        assert!(!contains(&r, 6 * P));
    }
}
