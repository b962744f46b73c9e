//! Where a file is cut into chunks.
//!
//! A file is cut every [`CHUNK_BYTES`], except a page pack, whose page
//! data is cut where the *memory addresses* of its pages cross a multiple
//! of [`CHUNK_BYTES`] or jump (a new stretch of memory), and after its
//! header and before its index. A chunk of a pack then holds the pages of
//! one aligned 1 MiB window of one process's memory, whatever the pack
//! holds before it: the same memory in another process, or in a later
//! checkpoint of the same process whose other areas changed size, gives the
//! same chunk (stored once). Every chunk is at most [`CHUNK_BYTES`].

use std::path::Path;

use stasis_image::{PackReader, RunEntry, PACK_HEADER_LEN};

use crate::record::CHUNK_BYTES;

/// The chunks of a file of `size` bytes named `name` (read at `path` if
/// it is a page pack): `(offset, length)`, in order, covering the file.
pub(crate) fn plan(name: &str, path: Option<&Path>, size: u64) -> Vec<(u64, u64)> {
    if let (true, Some(p)) = (crate::sparse::is_pack(name), path) {
        if let Ok(r) = PackReader::open(p, None) {
            if r.size() == size {
                return pack_plan(r.runs(), r.data_end(), size);
            }
        }
    }
    split(&[0, size])
}

/// The chunks of a pack: cut after the header, at every run that does not
/// continue the previous one, where a run crosses an aligned address, at
/// the index.
fn pack_plan(runs: &[RunEntry], data_end: u64, size: u64) -> Vec<(u64, u64)> {
    let mut cuts = vec![0, PACK_HEADER_LEN.min(size), data_end.min(size), size];
    let mut prev_end = None;
    for r in runs {
        if prev_end != Some(r.vaddr) {
            cuts.push(r.file_off);
        }
        let mut a = r.vaddr.next_multiple_of(CHUNK_BYTES);
        while a < r.end() {
            cuts.push(r.file_off + (a - r.vaddr));
            a += CHUNK_BYTES;
        }
        prev_end = Some(r.end());
    }
    cuts.retain(|&c| c <= size);
    cuts.sort_unstable();
    cuts.dedup();
    split(&cuts)
}

/// Spans between consecutive `cuts` (sorted), none over [`CHUNK_BYTES`].
fn split(cuts: &[u64]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for w in cuts.windows(2) {
        let (mut off, end) = (w[0], w[1]);
        while off < end {
            let len = CHUNK_BYTES.min(end - off);
            out.push((off, len));
            off += len;
        }
    }
    out
}

/// Whether `spans` is the fixed cut of a file of `size` bytes (then the
/// record does not list the lengths).
pub(crate) fn is_fixed(spans: &[(u64, u64)], size: u64) -> bool {
    spans == split(&[0, size])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(vaddr: u64, npages: u32, file_off: u64) -> RunEntry {
        RunEntry {
            vaddr,
            npages,
            flags: 0,
            file_off,
            checksum: 0,
        }
    }

    /// The same aligned window of memory gives the same chunk whatever
    /// comes before it in the pack.
    #[test]
    fn windows_of_memory_cut_alike_whatever_precedes_them() {
        let m = CHUNK_BYTES;
        // Process A: 3 pages elsewhere, then 2.5 MiB from 0x7f00_0010_0000 + 12 KiB.
        let base = 0x7f00_0010_0000 + 3 * 4096;
        let a_runs = [
            run(0x1000, 3, 4096),
            run(base, 256, 4096 + 3 * 4096),
            run(base + m, 256, 4096 + 3 * 4096 + m),
            run(base + 2 * m, 128, 4096 + 3 * 4096 + 2 * m),
        ];
        let a_end = 4096 + 3 * 4096 + 2 * m + 128 * 4096;
        // Process B: 7 pages elsewhere, then the same memory.
        let b_runs = [
            run(0x1000, 7, 4096),
            run(base, 256, 4096 + 7 * 4096),
            run(base + m, 256, 4096 + 7 * 4096 + m),
            run(base + 2 * m, 128, 4096 + 7 * 4096 + 2 * m),
        ];
        let b_end = 4096 + 7 * 4096 + 2 * m + 128 * 4096;
        let a = pack_plan(&a_runs, a_end, a_end + 200);
        let b = pack_plan(&b_runs, b_end, b_end + 200);
        // Memory offsets of each chunk of the big area, relative to its run.
        let rel = |plan: &[(u64, u64)], start: u64, end: u64| -> Vec<(u64, u64)> {
            plan.iter()
                .filter(|(o, _)| *o >= start && *o < end)
                .map(|(o, l)| (o - start, *l))
                .collect()
        };
        let ra = rel(&a, 4096 + 3 * 4096, a_end);
        let rb = rel(&b, 4096 + 7 * 4096, b_end);
        assert_eq!(ra, rb);
        assert_eq!(ra[0], (0, m - 3 * 4096));
        assert!(a.iter().all(|(_, l)| *l <= m && *l > 0));
        // The spans cover the file in order.
        let mut pos = 0;
        for (o, l) in &a {
            assert_eq!(*o, pos);
            pos += l;
        }
        assert_eq!(pos, a_end + 200);
        assert!(is_fixed(&split(&[0, 5 * m + 3]), 5 * m + 3));
        assert!(!is_fixed(&a, a_end + 200));
    }
}
