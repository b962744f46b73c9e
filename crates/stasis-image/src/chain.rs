//! Chains of checkpoints: an incremental checkpoint stores the pages written
//! since its parent and refers to its ancestors for the rest.
//!
//! A process of an incremental checkpoint lists every page range that holds
//! data (`ProcessImage::data_ranges`). The pages of those ranges come from
//! the checkpoint's own pack first, then from the pack of the same process
//! (same pid and start time) in the parent, the grandparent, and so on: the
//! nearest checkpoint that has a page holds its content at the time of the
//! child. A page missing from the whole chain is an error, never a zero.

use crate::manifest::ProcessImage;
use crate::pack::{PackReader, RunEntry};
use crate::store::{Checkpoint, ImageDir};
use crate::{ImageError, PAGE_SIZE};

pub use crate::ranges::{intersect, normalize, ranges_bytes, subtract, Ranges};

/// Loads checkpoint `n` (or the latest) and every ancestor it depends on:
/// `[n, parent of n, ...]`, ending with a full checkpoint.
pub fn load_chain(store: &ImageDir, n: Option<u32>) -> Result<Vec<Checkpoint>, ImageError> {
    let first = store.load(n)?;
    let mut chain = vec![first];
    while let Some(parent) = chain.last().and_then(|c| c.manifest.parent) {
        let child = chain.last().map(|c| c.number).unwrap_or(0);
        if parent >= child {
            return Err(ImageError::BrokenChain {
                checkpoint: child,
                parent,
                reason: "a parent must be older than its child".into(),
            });
        }
        let cp = store.load(Some(parent)).map_err(|e| match e {
            ImageError::NoSuchCheckpoint { .. } => ImageError::BrokenChain {
                checkpoint: child,
                parent,
                reason: "the parent checkpoint does not exist (deleted by hand?)".into(),
            },
            other => other,
        })?;
        chain.push(cp);
    }
    Ok(chain)
}

/// The pages of one process found in one pack of the chain.
#[derive(Debug)]
pub struct PageSource {
    /// Checkpoint whose pack this is.
    pub checkpoint: u32,
    pub pack: PackReader,
    /// The runs of the pack to use, clipped to the pages this source
    /// provides (sorted by address, hence by file offset).
    pub runs: Vec<RunEntry>,
}

impl PageSource {
    /// Bytes provided by this source.
    pub fn bytes(&self) -> u64 {
        self.runs.iter().map(RunEntry::len).sum()
    }
}

/// Merged `[start, end)` ranges of pack runs.
pub fn runs_to_ranges(runs: &[RunEntry]) -> Ranges {
    let mut out: Ranges = Vec::new();
    for r in runs {
        match out.last_mut() {
            Some(last) if last.1 == r.vaddr => last.1 = r.end(),
            _ => out.push((r.vaddr, r.end())),
        }
    }
    out
}

/// Is `r` a [`Ranges`] list: every range non-empty and page aligned, sorted,
/// disjoint?
pub fn is_ranges(r: &[(u64, u64)]) -> bool {
    let mut prev_end = 0;
    r.iter().all(|&(s, e)| {
        let ok = s < e && s % PAGE_SIZE == 0 && e % PAGE_SIZE == 0 && s >= prev_end;
        prev_end = e;
        ok
    })
}

/// The runs of `runs` (sorted) restricted to `keep`, split where needed.
pub fn clip_runs_to(runs: &[RunEntry], keep: &[(u64, u64)]) -> Vec<RunEntry> {
    let mut out = Vec::new();
    let mut j = 0;
    for r in runs {
        while j < keep.len() && keep[j].1 <= r.vaddr {
            j += 1;
        }
        let mut k = j;
        while let Some(&(ks, ke)) = keep.get(k) {
            if ks >= r.end() {
                break;
            }
            let s = ks.max(r.vaddr);
            let e = ke.min(r.end());
            if s < e {
                out.push(RunEntry {
                    vaddr: s,
                    npages: u32::try_from((e - s) / PAGE_SIZE).unwrap_or(0),
                    flags: r.flags,
                    file_off: r.file_off + (s - r.vaddr),
                    checksum: r.checksum,
                });
            }
            k += 1;
        }
    }
    out
}

/// The runs (whole: a run is checked as one) that overlap `keep` (sorted,
/// disjoint), in one pass over both.
pub fn runs_touching(runs: &[RunEntry], keep: &[(u64, u64)]) -> Vec<RunEntry> {
    let mut out = Vec::new();
    let mut j = 0;
    for r in runs {
        while j < keep.len() && keep[j].1 <= r.vaddr {
            j += 1;
        }
        if keep.get(j).is_some_and(|&(ks, _)| ks < r.end()) {
            out.push(*r);
        }
    }
    out
}

/// Finds the process of `cp` that is `p` (same pid and, when both are
/// known, same start time).
pub fn same_process<'a>(cp: &'a Checkpoint, p: &ProcessImage) -> Option<&'a ProcessImage> {
    cp.manifest.processes.iter().find(|q| {
        q.pid == p.pid
            && q.zombie.is_none()
            && (q.start_time == 0 || p.start_time == 0 || q.start_time == p.start_time)
    })
}

/// Every range of `p` (a process of `cp`) that holds data: its
/// `data_ranges`, or for a full checkpoint the runs of its pack.
pub fn data_ranges(cp: &Checkpoint, p: &ProcessImage) -> Result<Ranges, ImageError> {
    if let Some(r) = &p.data_ranges {
        return Ok(r.clone());
    }
    Ok(match cp.open_process_pack(p)? {
        Some(pk) => runs_to_ranges(pk.runs()),
        None => Vec::new(),
    })
}

/// The packs and runs that hold the pages of process `p` of `chain[0]`,
/// nearest checkpoint first. Fails if a page is in no pack of the chain.
pub fn page_sources(chain: &[Checkpoint], p: &ProcessImage) -> Result<Vec<PageSource>, ImageError> {
    let Some(head) = chain.first() else {
        return Ok(Vec::new());
    };
    let mut needed = data_ranges(head, p)?;
    let mut out = Vec::new();
    for cp in chain {
        if needed.is_empty() {
            break;
        }
        let Some(q) = same_process(cp, p) else {
            break;
        };
        let Some(pack) = cp.open_process_pack(q)? else {
            if q.data_ranges.is_none() {
                break;
            }
            continue;
        };
        let runs = clip_runs_to(pack.runs(), &needed);
        if !runs.is_empty() {
            needed = subtract(&needed, &runs_to_ranges(&runs));
            out.push(PageSource {
                checkpoint: cp.number,
                pack,
                runs,
            });
        }
        if q.data_ranges.is_none() {
            break; // a full checkpoint ends the search
        }
    }
    if let Some(&(s, e)) = needed.first() {
        return Err(ImageError::BrokenChain {
            checkpoint: head.number,
            parent: head.manifest.parent.unwrap_or(0),
            reason: format!(
                "pages {s:#x}..{e:#x} of process {} ({} KiB in all) are in no checkpoint of the chain",
                p.pid,
                ranges_bytes(&needed) / 1024
            ),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = PAGE_SIZE;

    #[test]
    fn runs_touching_keeps_whole_runs_that_overlap() {
        let run = |page: u64, n: u32| RunEntry {
            vaddr: page * P,
            npages: n,
            flags: 0,
            file_off: 4096,
            checksum: 0,
        };
        let runs = [run(0, 2), run(4, 2), run(10, 4), run(20, 1)];
        let keep = [(P, 3 * P), (11 * P, 12 * P), (30 * P, 40 * P)];
        assert_eq!(runs_touching(&runs, &keep), vec![runs[0], runs[2]]);
        assert!(runs_touching(&runs, &[]).is_empty());
    }

    #[test]
    fn clip_runs_keeps_file_offsets() {
        let runs = vec![
            RunEntry {
                vaddr: 0,
                npages: 4,
                flags: 0,
                file_off: 4096,
                checksum: 1,
            },
            RunEntry {
                vaddr: 10 * P,
                npages: 2,
                flags: 0,
                file_off: 5 * 4096,
                checksum: 2,
            },
        ];
        let c = clip_runs_to(&runs, &[(P, 2 * P), (3 * P, 11 * P)]);
        let got: Vec<(u64, u32, u64)> = c.iter().map(|r| (r.vaddr, r.npages, r.file_off)).collect();
        assert_eq!(
            got,
            vec![
                (P, 1, 2 * 4096),
                (3 * P, 1, 4 * 4096),
                (10 * P, 1, 5 * 4096)
            ]
        );
    }
}
