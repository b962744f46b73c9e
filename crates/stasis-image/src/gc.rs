//! Garbage collection: keep the newest checkpoints, delete the older ones,
//! and first merge into a full checkpoint every kept checkpoint whose chain
//! reaches into the deleted ones.
//!
//! The protocol (see `docs/image-format.md`, "Garbage collection") keeps
//! every visible checkpoint restorable if the process is killed at any
//! point:
//!
//! 1. Under the directory lock, leftovers of interrupted dumps and gcs
//!    (`.tmp-*`) are removed.
//! 2. Each kept checkpoint `K` whose parent is not kept is rebuilt as a full
//!    checkpoint `K'` (same number and manifest, `parent` and `data_ranges`
//!    cleared, one pack per process holding every page of `K` resolved
//!    through its chain) in a `.tmp-*` directory, and fsynced.
//! 3. The chains of the kept checkpoints are resolved against the state gc
//!    will leave (the `K'`, without the deleted checkpoints); if any page
//!    would be missing, gc stops here and nothing has changed.
//! 4. `K'` and `K` are exchanged with `renameat2(RENAME_EXCHANGE)`: the name
//!    `K` holds either the old or the new content, never nothing, and both
//!    restore the same memory. Then the old `K` (now under the `.tmp-*`
//!    name) is removed.
//! 5. The older checkpoints are deleted newest first, each by renaming it to
//!    a `.tmp-*` name (it disappears atomically) and then removing the tree.
//!    Since a parent is always older than its child, a checkpoint not yet
//!    deleted still has all of its ancestors.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{renameat2, RenameFlags};
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::chain::{load_chain, page_sources, PageSource};
use crate::fsutil::{self, Kind};
use crate::pack::{PackReader, PackWriter, RunEntry};
use crate::store::{
    checkpoint_dir_name, pack_file_name, sync_tree, write_manifest, Checkpoint, ImageDir, Pointer,
    LATEST_NAME, TEMP_PREFIX,
};
use crate::ImageError;

/// What [`ImageDir::gc`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GcReport {
    /// Checkpoints kept, ascending (the newest `keep`).
    pub kept: Vec<u32>,
    /// Checkpoints deleted, ascending.
    pub deleted: Vec<u32>,
    /// Kept checkpoints rewritten as full ones, ascending (usually at most
    /// one: the oldest kept checkpoint, when it is incremental).
    pub merged: Vec<MergeReport>,
    /// Leftover temporary directories of interrupted dumps or gcs removed.
    pub stale_temps_removed: usize,
}

/// One kept checkpoint rewritten as a full checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MergeReport {
    /// The checkpoint rewritten (it keeps its number).
    pub checkpoint: u32,
    /// Its former ancestors, ascending, whose pages were merged into it.
    pub ancestors: Vec<u32>,
    /// Pages stored in the new full checkpoint.
    pub pages: u64,
    /// Bytes of its new packs.
    pub bytes: u64,
}

/// Whole runs kept in memory while merging (each at most 1 MiB). Pieces of
/// one run that are interleaved with pages of other checkpoints are read
/// once as long as no more than this many runs are interleaved.
const CACHE_RUNS: usize = 8;

impl ImageDir {
    /// Deletes every checkpoint but the newest `keep` (>= 1), after merging
    /// into a full checkpoint each kept one that depends on a deleted one.
    /// Crash-safe: killed at any point, every checkpoint still listed is
    /// restorable, and running gc again finishes the job. Takes the
    /// directory lock, so it fails with [`ImageError::Locked`] during a dump.
    pub fn gc(&self, keep: usize) -> Result<GcReport, ImageError> {
        self.gc_with_hook(keep, &mut |_| true)
    }

    /// [`gc`](Self::gc) calling `hook` with the name of each step once it is
    /// done (`"cleaned"`, `"packed 4 pid 100"`, `"built 4"`, `"verified"`,
    /// `"exchanged 4"`, `"removed old 4"`, `"hid 3"`, `"removed 3"`,
    /// `"pointer"`). When the hook returns `false`, gc returns
    /// [`ImageError::GcInterrupted`] at once and leaves every file as it is,
    /// like a process killed at that point. For crash tests.
    #[doc(hidden)]
    pub fn gc_with_hook(
        &self,
        keep: usize,
        hook: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GcReport, ImageError> {
        if keep == 0 {
            return Err(ImageError::KeepZero {
                dir: self.path().to_path_buf(),
            });
        }
        fsutil::require_real_dir(self.path(), |path| ImageError::NoSuchDir { path })?;
        let _lock = self.lock()?;
        let mut run = Run {
            image: self,
            cps: self.checkpoints_path(),
            hook,
            temps: Vec::new(),
        };
        let result = run.gc(keep);
        if let Err(e) = &result {
            if !matches!(e, ImageError::GcInterrupted { .. }) {
                run.remove_temps();
            }
        }
        result
    }
}

/// One run of gc, holding the lock.
struct Run<'a> {
    image: &'a ImageDir,
    cps: PathBuf,
    hook: &'a mut dyn FnMut(&str) -> bool,
    /// Temporary directories made by this run (all of them are garbage at
    /// every moment: removing any of them never loses a checkpoint).
    temps: Vec<PathBuf>,
}

/// A kept checkpoint rebuilt as a full one in a temporary directory.
struct Merged {
    report: MergeReport,
    temp: PathBuf,
}

impl Run<'_> {
    fn step(&mut self, name: &str) -> Result<(), ImageError> {
        if (self.hook)(name) {
            Ok(())
        } else {
            Err(ImageError::GcInterrupted { step: name.into() })
        }
    }

    fn gc(&mut self, keep: usize) -> Result<GcReport, ImageError> {
        let stale_temps_removed = self.image.remove_stale_temps_locked()?;
        self.step("cleaned")?;
        let all = self.image.checkpoints()?;
        let split = all.len().saturating_sub(keep);
        let (older, kept) = all.split_at(split);
        let mut report = GcReport {
            kept: kept.to_vec(),
            deleted: Vec::new(),
            merged: Vec::new(),
            stale_temps_removed,
        };
        if older.is_empty() {
            self.fix_pointer()?;
            return Ok(report);
        }

        // The state gc will leave, checkpoint by checkpoint.
        let kept_set: BTreeSet<u32> = kept.iter().copied().collect();
        let mut view: BTreeMap<u32, Checkpoint> = BTreeMap::new();
        for &n in kept {
            view.insert(n, self.image.load(Some(n))?);
        }
        let roots: Vec<u32> = view
            .values()
            .filter(|c| c.manifest.parent.is_some_and(|p| !kept_set.contains(&p)))
            .map(|c| c.number)
            .collect();
        let mut merged = Vec::new();
        for &n in &roots {
            let (cp, m) = self.build_full(n)?;
            view.insert(n, cp);
            merged.push(m);
        }
        check_view(&view, &roots)?;
        self.step("verified")?;

        for m in &merged {
            let n = m.report.checkpoint;
            self.exchange(&m.temp, n)?;
            self.step(&format!("exchanged {n}"))?;
            fsutil::sync_dir(&self.cps)?;
            // The temporary name now holds the old, incremental `n`.
            remove_tree(&m.temp)?;
            fsutil::sync_dir(&self.cps)?;
            info!(checkpoint = n, ancestors = ?m.report.ancestors, pages = m.report.pages, "merged checkpoint with its ancestors");
            self.step(&format!("removed old {n}"))?;
        }
        report.merged = merged.into_iter().map(|m| m.report).collect();

        for &d in older.iter().rev() {
            let from = self.cps.join(checkpoint_dir_name(d));
            let hidden = self.new_temp(d, "deleted");
            fs::rename(&from, &hidden).map_err(ImageError::io("rename for deletion", &from))?;
            self.temps.push(hidden.clone());
            fsutil::sync_dir(&self.cps)?;
            self.step(&format!("hid {d}"))?;
            remove_tree(&hidden)?;
            debug!(checkpoint = d, "deleted checkpoint");
            report.deleted.insert(0, d);
            self.step(&format!("removed {d}"))?;
        }
        fsutil::sync_dir(&self.cps)?;
        self.fix_pointer()?;
        Ok(report)
    }

    /// Rebuilds checkpoint `n` as a full checkpoint in a temporary directory.
    fn build_full(&mut self, n: u32) -> Result<(Checkpoint, Merged), ImageError> {
        let chain = load_chain(self.image, Some(n))?;
        let head = &chain[0];
        let temp = self.new_temp(n, "merged");
        fsutil::create_dir(&temp)?;
        self.temps.push(temp.clone());
        let mut manifest = head.manifest.clone();
        manifest.parent = None;
        let (mut pages, mut bytes) = (0u64, 0u64);
        for (i, p) in head.manifest.processes.iter().enumerate() {
            let sources = page_sources(&chain, p)?;
            let pack = if sources.iter().all(|s| s.runs.is_empty()) {
                None
            } else {
                let mut w = PackWriter::create(&temp, pack_file_name(p.pid), p.pid)?;
                copy_by_address(&mut w, &sources)?;
                let r = w.finish()?;
                PackReader::open_inner(&temp.join(&r.name), Some(&r), Some(n))?;
                pages += r.pages;
                bytes += r.size;
                Some(r)
            };
            let q = &mut manifest.processes[i];
            q.data_ranges = None;
            q.pack = pack;
            self.step(&format!("packed {n} pid {}", p.pid))?;
        }
        // The content pack is the checkpoint's own (never shared along a
        // chain): copied as it is, checked against its reference.
        if let Some(r) = &manifest.content {
            let from = head.pack_path(r)?;
            let to = temp.join(&r.name);
            let mut src = fsutil::open_read(&from)?;
            let mut dst = fsutil::create_file(&to)?;
            std::io::copy(&mut src, &mut dst).map_err(ImageError::io("copy", &to))?;
            PackReader::open_inner(&to, Some(r), Some(n))?;
            bytes += r.size;
        }
        write_manifest(&temp, &manifest)?;
        sync_tree(&temp)?;
        self.step(&format!("built {n}"))?;
        let mut ancestors: Vec<u32> = chain[1..].iter().map(|c| c.number).collect();
        ancestors.reverse();
        let cp = Checkpoint::at(n, manifest, temp.clone(), self.image.path().to_path_buf());
        Ok((
            cp,
            Merged {
                report: MergeReport {
                    checkpoint: n,
                    ancestors,
                    pages,
                    bytes,
                },
                temp,
            },
        ))
    }

    /// A fresh temporary name in `checkpoints/` for checkpoint `n`.
    fn new_temp(&self, n: u32, what: &str) -> PathBuf {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        self.cps.join(format!(
            "{TEMP_PREFIX}{}-gc-{what}-{}-{nanos}-{}",
            checkpoint_dir_name(n),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Atomically exchanges the directory `temp` with checkpoint `n`.
    fn exchange(&self, temp: &Path, n: u32) -> Result<(), ImageError> {
        let target = self.cps.join(checkpoint_dir_name(n));
        let dir = fsutil::open_dir(&self.cps)?;
        let temp_name = temp.file_name().unwrap_or(temp.as_os_str());
        let fd = Some(dir.as_raw_fd());
        renameat2(
            fd,
            temp_name,
            fd,
            checkpoint_dir_name(n).as_str(),
            RenameFlags::RENAME_EXCHANGE,
        )
        .map_err(|errno| match errno {
            Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP => ImageError::NoAtomicExchange {
                path: self.cps.clone(),
            },
            other => ImageError::Io {
                action: "exchange the merged checkpoint with",
                path: target,
                source: std::io::Error::from(other),
            },
        })
    }

    /// Points `latest` at the newest checkpoint if it lags behind it or is
    /// unreadable (never lowers it: numbers are not reused).
    fn fix_pointer(&mut self) -> Result<(), ImageError> {
        let Some(&newest) = self.image.checkpoints()?.last() else {
            return Ok(());
        };
        let stale = match self.image.read_pointer()? {
            Pointer::Value(p) => p < newest,
            Pointer::Missing | Pointer::Garbage(_) => true,
        };
        if stale {
            fsutil::write_atomic(
                self.image.path(),
                LATEST_NAME,
                format!("{newest}\n").as_bytes(),
            )?;
            self.step("pointer")?;
        }
        Ok(())
    }

    /// After a real error: removes the temporary directories of this run
    /// (best effort; `remove_stale_temps` removes what is left).
    fn remove_temps(&mut self) {
        for t in self.temps.drain(..) {
            if let Err(e) = remove_tree(&t) {
                warn!(dir = %t.display(), error = %e, "cannot remove a temporary directory of gc; the next gc or dump will");
            }
        }
        let _ = fsutil::sync_dir(&self.cps);
    }
}

/// Removes a directory tree (or a file or symlink) if it exists, never
/// following a symlink.
fn remove_tree(path: &Path) -> Result<(), ImageError> {
    match fsutil::kind(path)? {
        Kind::Missing => Ok(()),
        Kind::Dir => fs::remove_dir_all(path).map_err(ImageError::io("remove directory", path)),
        Kind::File | Kind::Symlink | Kind::Other => fsutil::remove_if_exists(path).map(drop),
    }
}

/// Checks that every kept checkpoint whose chain goes through a merged one
/// resolves all its pages in the state gc will leave (`view`).
fn check_view(view: &BTreeMap<u32, Checkpoint>, merged: &[u32]) -> Result<(), ImageError> {
    for (&n, cp) in view {
        let mut numbers = vec![n];
        let mut through_merged = merged.contains(&n);
        let mut cur = cp;
        while let Some(p) = cur.manifest.parent {
            let unrestorable = |reason: String| ImageError::GcWouldBreak {
                checkpoint: n,
                reason,
            };
            if p >= cur.number {
                return Err(unrestorable(format!(
                    "checkpoint {} names {p} as its parent, which is not older",
                    cur.number
                )));
            }
            cur = view
                .get(&p)
                .ok_or_else(|| unrestorable(format!("its ancestor {p} would be deleted")))?;
            through_merged |= merged.contains(&p);
            numbers.push(p);
        }
        if !through_merged {
            continue;
        }
        let chain: Vec<Checkpoint> = numbers
            .iter()
            .filter_map(|k| view.get(k).cloned())
            .collect();
        for p in cp.manifest.processes.iter().filter(|p| p.zombie.is_none()) {
            page_sources(&chain, p).map_err(|e| ImageError::GcWouldBreak {
                checkpoint: n,
                reason: match e {
                    ImageError::BrokenChain { reason, .. } => reason,
                    other => other.to_string(),
                },
            })?;
        }
    }
    Ok(())
}

/// Writes the pages of `sources` (disjoint) into `w` in address order.
fn copy_by_address(w: &mut PackWriter, sources: &[PageSource]) -> Result<(), ImageError> {
    let mut pieces: Vec<(usize, RunEntry)> = sources
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.runs.iter().map(move |r| (i, *r)))
        .collect();
    pieces.sort_unstable_by_key(|(_, r)| r.vaddr);
    let mut cache = RunCache::default();
    for (i, piece) in pieces {
        let pack = &sources[i].pack;
        // Pieces are clipped runs: read (and verify) the whole run.
        let whole = pack
            .run_containing(piece.vaddr)
            .filter(|r| r.end() >= piece.end())
            .copied()
            .ok_or_else(|| ImageError::RunNotInPack {
                path: pack.path().to_path_buf(),
                vaddr: piece.vaddr,
            })?;
        let data = cache.get(i, &whole, pack)?;
        let start = usize::try_from(piece.vaddr - whole.vaddr).unwrap_or(usize::MAX);
        let len = usize::try_from(piece.len()).unwrap_or(usize::MAX);
        let slice = start
            .checked_add(len)
            .and_then(|end| data.get(start..end))
            .ok_or_else(|| ImageError::RunNotInPack {
                path: pack.path().to_path_buf(),
                vaddr: piece.vaddr,
            })?;
        w.write_run(piece.vaddr, slice)?;
    }
    Ok(())
}

/// The last few whole runs read, most recently used last.
#[derive(Default)]
struct RunCache {
    slots: Vec<(usize, u64, Vec<u8>)>,
}

impl RunCache {
    /// The verified bytes of run `run` of source `src`.
    fn get(&mut self, src: usize, run: &RunEntry, pack: &PackReader) -> Result<&[u8], ImageError> {
        if let Some(pos) = self
            .slots
            .iter()
            .position(|s| s.0 == src && s.1 == run.vaddr)
        {
            let slot = self.slots.remove(pos);
            self.slots.push(slot);
        } else {
            let mut buf = if self.slots.len() >= CACHE_RUNS {
                self.slots.remove(0).2
            } else {
                Vec::new()
            };
            buf.resize(usize::try_from(run.len()).unwrap_or(usize::MAX), 0);
            pack.read_run(run, &mut buf)?;
            self.slots.push((src, run.vaddr, buf));
        }
        let last = self.slots.len() - 1;
        Ok(&self.slots[last].2)
    }
}
