//! Where the pages come from: the catalog of a checkpoint's packs (which
//! pack, and which run of it, holds each page of each process), and the
//! [`RunSource`] that reads a run, from local packs or a page server.
//!
//! The unit of transfer is a whole pack run (at most 256 pages), because
//! that is what the image checksums: every run read is checked against the
//! XXH3 in the pack index before a byte of it reaches a process.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use stasis_image::{ImageDir, ImageError, PackReader, RunEntry};
use stasis_pageserver::{Client, PageServerError};

use crate::LazyError;

/// Why a run could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("no pack #{0}")]
    NoPack(usize),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    PageServer(#[from] PageServerError),
}

/// One pack of the chain.
#[derive(Debug)]
pub struct PackInfo {
    /// Checkpoint the pack belongs to.
    pub checkpoint: u32,
    /// File name inside the checkpoint (`pages-<pid>.pack`).
    pub name: String,
    /// The opened pack: its index (and, for a local image, its data).
    pub reader: PackReader,
}

/// Where one page of one process is: the pack and its run.
#[derive(Debug, Clone, Copy)]
pub struct Located {
    pub pack: usize,
    pub run: RunEntry,
    /// Image addresses `[lo, hi)` around the page that this run provides
    /// for this process (the run clipped to what the process takes from
    /// this pack).
    pub lo: u64,
    pub hi: u64,
}

/// Which pack provides each page of each process of a checkpoint.
#[derive(Debug)]
pub struct Catalog {
    pub checkpoint: u32,
    pub packs: Vec<PackInfo>,
    /// image pid -> sorted `(start, end, pack)` ranges.
    procs: HashMap<i32, Vec<(u64, u64, usize)>>,
}

impl Catalog {
    /// Reads checkpoint `n` of the image at `dir` and its chain (for a page
    /// server, a mirror whose packs may be sparse: only their indexes are
    /// read here).
    pub fn load(dir: &Path, n: u32) -> Result<Catalog, LazyError> {
        let store = ImageDir::open(dir)?;
        let chain = stasis_image::load_chain(&store, Some(n))?;
        let head = chain
            .first()
            .ok_or_else(|| LazyError::Image(format!("checkpoint {n} has no chain")))?;
        let mut packs: Vec<PackInfo> = Vec::new();
        let mut procs = HashMap::new();
        for p in head
            .manifest
            .processes
            .iter()
            .filter(|p| p.zombie.is_none())
        {
            let mut ranges = Vec::new();
            for src in stasis_image::page_sources(&chain, p)? {
                let name = src.pack.file_name();
                let idx = match packs
                    .iter()
                    .position(|k| k.checkpoint == src.checkpoint && k.name == name)
                {
                    Some(i) => i,
                    None => {
                        packs.push(PackInfo {
                            checkpoint: src.checkpoint,
                            name,
                            reader: src.pack,
                        });
                        packs.len() - 1
                    }
                };
                ranges.extend(
                    stasis_image::chain::runs_to_ranges(&src.runs)
                        .into_iter()
                        .map(|(s, e)| (s, e, idx)),
                );
            }
            ranges.sort_unstable();
            procs.insert(p.pid, ranges);
        }
        Ok(Catalog {
            checkpoint: n,
            packs,
            procs,
        })
    }

    /// Image ranges of process `pid` that hold data.
    pub fn data_ranges(&self, pid: i32) -> Vec<(u64, u64)> {
        self.procs
            .get(&pid)
            .map(|r| r.iter().map(|&(s, e, _)| (s, e)).collect())
            .unwrap_or_default()
    }

    /// Pack number `pack`.
    pub fn pack(&self, pack: usize) -> Result<&PackInfo, ReadError> {
        self.packs.get(pack).ok_or(ReadError::NoPack(pack))
    }

    /// The pack run holding image address `img` of process `pid`.
    pub fn locate(&self, pid: i32, img: u64) -> Option<Located> {
        let ranges = self.procs.get(&pid)?;
        let i = ranges.partition_point(|r| r.1 <= img);
        let &(s, e, pack) = ranges.get(i).filter(|r| r.0 <= img)?;
        let run = *self.packs.get(pack)?.reader.run_containing(img)?;
        Some(Located {
            pack,
            run,
            lo: s.max(run.vaddr),
            hi: e.min(run.end()),
        })
    }
}

/// Reads whole pack runs, checked against their checksums.
pub trait RunSource: Send + Sync {
    /// Reads run `e` of `catalog.packs[pack]` into `buf` (exactly
    /// `e.len()` bytes) and checks it against `e.checksum`.
    fn read_run(
        &self,
        catalog: &Catalog,
        pack: usize,
        e: &RunEntry,
        buf: &mut [u8],
    ) -> Result<(), ReadError>;
    /// Where the pages come from, for messages.
    fn describe(&self) -> String;
}

/// Runs read from the local packs of the catalog.
#[derive(Debug)]
pub struct LocalPacks {
    pub dir: String,
}

impl RunSource for LocalPacks {
    fn read_run(
        &self,
        catalog: &Catalog,
        pack: usize,
        e: &RunEntry,
        buf: &mut [u8],
    ) -> Result<(), ReadError> {
        Ok(catalog.pack(pack)?.reader.read_run(e, buf)?)
    }
    fn describe(&self) -> String {
        format!("the image at {}", self.dir)
    }
}

/// Where a filler reads runs: the page server `remote` (address, token) if
/// given, else the local packs of the image at `dir`.
pub fn open_source(
    dir: &Path,
    remote: Option<(&str, Vec<u8>)>,
) -> Result<Box<dyn RunSource>, LazyError> {
    Ok(match remote {
        Some((addr, token)) => Box::new(PageServerRuns::connect(addr, token)?),
        None => Box::new(LocalPacks {
            dir: dir.display().to_string(),
        }),
    })
}

/// Runs read from a page server, one connection per thread at a time.
pub struct PageServerRuns {
    addr: String,
    token: Vec<u8>,
    pool: Mutex<Vec<Client>>,
}

impl PageServerRuns {
    /// Connects to the page server at `addr` now (a server that is not
    /// there fails here, not at the first fault).
    pub fn connect(addr: &str, token: Vec<u8>) -> Result<PageServerRuns, PageServerError> {
        let c = Client::connect(addr, &token)?;
        Ok(PageServerRuns {
            addr: addr.to_string(),
            token,
            pool: Mutex::new(vec![c]),
        })
    }
}

impl RunSource for PageServerRuns {
    fn read_run(
        &self,
        catalog: &Catalog,
        pack: usize,
        e: &RunEntry,
        buf: &mut [u8],
    ) -> Result<(), ReadError> {
        let p = catalog.pack(pack)?;
        let pooled = self.pool.lock().ok().and_then(|mut v| v.pop());
        let mut client = match pooled {
            Some(c) => c,
            None => Client::connect(&self.addr, &self.token)?,
        };
        client.read_run(p.checkpoint, &p.name, e, buf)?;
        if let Ok(mut v) = self.pool.lock() {
            v.push(client);
        }
        Ok(())
    }
    fn describe(&self) -> String {
        format!("the page server at {}", self.addr)
    }
}

#[cfg(test)]
impl Catalog {
    /// A catalog of nothing (a checkpoint whose processes own no pages).
    pub(crate) fn empty() -> Catalog {
        Catalog {
            checkpoint: 1,
            packs: Vec::new(),
            procs: HashMap::new(),
        }
    }
}
