//! The eager half of a lazy restore from a page server.
//!
//! A lazy restore fills every area but private anonymous memory before the
//! tree runs ([`stasis_restore::eager_ranges`]); the restorer reads those
//! pages from a local mirror of the server's image whose packs are sparse.
//! [`fill_eager`] fetches exactly the runs those areas touch into the
//! mirror; the lazy areas are left to the filler.

use std::path::Path;

use stasis_image::manifest::Vma;
use stasis_image::RunEntry;
use stasis_pageserver::Client;

use crate::LazyError;

/// The runs of `runs` (a pack's index) that the eager areas among `vmas`
/// touch.
pub fn eager_runs(runs: &[RunEntry], vmas: &[Vma]) -> Vec<RunEntry> {
    let eager = stasis_restore::eager_ranges(vmas);
    stasis_image::chain::runs_touching(runs, &eager)
}

/// Fetches into the sparse mirror at `dir` (checkpoint `n`) the runs of
/// every area a lazy restore fills before the tree runs, from the page
/// server at `addr`.
pub fn fill_eager(addr: &str, token: &[u8], dir: &Path, n: u32) -> Result<(), LazyError> {
    let store = stasis_image::ImageDir::open(dir)?;
    let chain = stasis_image::load_chain(&store, Some(n))?;
    let head = chain
        .first()
        .ok_or_else(|| LazyError::Image(format!("checkpoint {n} has no chain")))?;
    let mut client = Client::connect(addr, token)?;
    for p in head
        .manifest
        .processes
        .iter()
        .filter(|p| p.zombie.is_none())
    {
        for src in stasis_image::page_sources(&chain, p)? {
            let runs = eager_runs(src.pack.runs(), &p.vmas);
            if runs.is_empty() {
                continue;
            }
            let name = src.pack.file_name();
            stasis_pageserver::fill_runs(
                &mut client,
                src.checkpoint,
                &name,
                src.pack.path(),
                &runs,
            )
            .map_err(|source| LazyError::EagerFetch { pid: p.pid, source })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use stasis_image::manifest::VmaKind;

    fn vma(start: u64, end: u64, kind: VmaKind, shared: bool) -> Vma {
        Vma {
            start,
            end,
            prot: 3,
            shared,
            growsdown: false,
            flags: 0,
            guards: Vec::new(),
            name: String::new(),
            kind,
            shm: None,
        }
    }

    fn run(vaddr: u64, npages: u32) -> RunEntry {
        RunEntry {
            vaddr,
            npages,
            flags: 0,
            file_off: 0,
            checksum: 0,
        }
    }

    #[test]
    fn only_runs_of_areas_filled_before_the_tree_runs_are_fetched() {
        let file = VmaKind::File {
            path: "/lib/x.so".into(),
            offset: 0,
            dev: 1,
            ino: 2,
        };
        let vmas = [
            // Private anonymous: left to the filler.
            vma(0x10000, 0x20000, VmaKind::Anon, false),
            // Shared anonymous: eager.
            vma(0x20000, 0x30000, VmaKind::Anon, true),
            // Private file mapping: eager.
            vma(0x40000, 0x50000, file, false),
        ];
        let runs = [
            run(0x10000, 4),
            run(0x20000, 2),
            run(0x2f000, 1),
            run(0x30000, 1),
            run(0x48000, 2),
        ];
        let got: Vec<u64> = eager_runs(&runs, &vmas).iter().map(|r| r.vaddr).collect();
        assert_eq!(got, vec![0x20000, 0x2f000, 0x48000]);
        // Nothing eager: nothing to fetch.
        assert!(eager_runs(&runs, &vmas[..1]).is_empty());
    }

    #[test]
    fn a_run_straddling_an_eager_area_is_fetched_whole() {
        let vmas = [vma(0x20000, 0x21000, VmaKind::Anon, true)];
        let got = eager_runs(&[run(0x1f000, 3)], &vmas);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].vaddr, got[0].npages), (0x1f000, 3));
    }
}
