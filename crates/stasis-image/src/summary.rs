//! Human/JSON-oriented summary of a checkpoint and whole-checkpoint checks.

use serde::Serialize;

use crate::chain::{load_chain, page_sources, ranges_bytes};
use crate::manifest::ProcessImage;
use crate::store::Checkpoint;
use crate::{ImageError, PAGE_SIZE};

/// What `stasis inspect` shows about a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckpointSummary {
    pub number: u32,
    /// The checkpoint this one is an increment over (`None`: full).
    pub parent: Option<u32>,
    /// True if the checkpoint stores only pages changed since `parent`.
    pub incremental: bool,
    /// Dirty-tracking backend that chose the pages of an incremental
    /// checkpoint (`uffd`, `soft-dirty`, `hash`; empty for a full one).
    pub track: String,
    /// Why a dump asked to be incremental was full instead (empty if not).
    pub note: String,
    pub created_unix: u64,
    pub tool_version: String,
    pub hostname: String,
    pub kernel_release: String,
    pub root_pid: i32,
    pub processes: Vec<ProcessSummary>,
    /// Sum of `pack_pages` over all processes: pages stored in this
    /// checkpoint's own packs.
    pub total_pages: u64,
    /// Sum of `pack_bytes` over all processes.
    pub total_bytes: u64,
    /// Sum of `memory_pages` over all processes: pages a restore of this
    /// checkpoint fills (equal to `total_pages` for a full checkpoint).
    pub memory_pages: u64,
    /// Size in bytes of the content pack (the saved bytes of deleted files,
    /// memfds, shared memory objects and tmpfs files); 0 without one.
    pub content_bytes: u64,
}

/// One process of a [`CheckpointSummary`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessSummary {
    pub pid: i32,
    pub ppid: i32,
    pub comm: String,
    pub exe: String,
    pub threads: usize,
    pub vmas: usize,
    pub fds: usize,
    /// File name of the page pack, if the process has one.
    pub pack: Option<String>,
    /// Pages in the pack (from the manifest).
    pub pack_pages: u64,
    /// Size of the pack file in bytes (from the manifest).
    pub pack_bytes: u64,
    /// Pages of the restored memory: the sum of `data_ranges` for a process
    /// of an incremental checkpoint, else `pack_pages`.
    pub memory_pages: u64,
}

/// Pages of the memory of `p` once restored (from the manifest only).
fn memory_pages(p: &ProcessImage) -> u64 {
    match &p.data_ranges {
        Some(r) => ranges_bytes(r) / PAGE_SIZE,
        None => p.pack.as_ref().map_or(0, |r| r.pages),
    }
}

/// Summarizes a checkpoint from its manifest (no file is read).
pub fn summarize(cp: &Checkpoint) -> CheckpointSummary {
    let m = &cp.manifest;
    let processes: Vec<ProcessSummary> = m
        .processes
        .iter()
        .map(|p| ProcessSummary {
            pid: p.pid,
            ppid: p.ppid,
            comm: p.comm.clone(),
            exe: p.exe.clone(),
            threads: p.threads.len(),
            vmas: p.vmas.len(),
            fds: p.fds.len(),
            pack: p.pack.as_ref().map(|r| r.name.clone()),
            pack_pages: p.pack.as_ref().map_or(0, |r| r.pages),
            pack_bytes: p.pack.as_ref().map_or(0, |r| r.size),
            memory_pages: memory_pages(p),
        })
        .collect();
    CheckpointSummary {
        number: cp.number,
        parent: m.parent,
        incremental: m.parent.is_some(),
        track: m.stats.track.clone(),
        note: m.stats.note.clone(),
        created_unix: m.created_unix,
        tool_version: m.tool_version.clone(),
        hostname: m.host.hostname.clone(),
        kernel_release: m.host.kernel_release.clone(),
        root_pid: m.root_pid,
        total_pages: processes
            .iter()
            .map(|p| p.pack_pages)
            .fold(0, u64::saturating_add),
        total_bytes: processes
            .iter()
            .map(|p| p.pack_bytes)
            .fold(0, u64::saturating_add),
        memory_pages: processes
            .iter()
            .map(|p| p.memory_pages)
            .fold(0, u64::saturating_add),
        content_bytes: m.content.as_ref().map_or(0, |r| r.size),
        processes,
    }
}

/// Opens every pack the checkpoint references and verifies all checksums.
/// For an incremental checkpoint, also loads its chain of ancestors and
/// checks that every page of every live process is found in it (the
/// ancestors' page data is verified when they are verified themselves).
pub fn verify_checkpoint(cp: &Checkpoint) -> Result<(), ImageError> {
    for p in &cp.manifest.processes {
        if let Some(pack) = cp.open_process_pack(p)? {
            pack.verify()?;
        }
    }
    cp.open_content()?;
    if cp.manifest.parent.is_some() {
        let chain = load_chain(&cp.image(), Some(cp.number))?;
        for p in cp.manifest.processes.iter().filter(|p| p.zombie.is_none()) {
            page_sources(&chain, p)?;
        }
    }
    Ok(())
}
