//! Human/JSON-oriented summary of a checkpoint and whole-checkpoint checks.

use serde::Serialize;

use crate::store::Checkpoint;
use crate::ImageError;

/// What `stasis inspect` shows about a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckpointSummary {
    pub number: u32,
    pub parent: Option<u32>,
    pub created_unix: u64,
    pub tool_version: String,
    pub hostname: String,
    pub kernel_release: String,
    pub root_pid: i32,
    pub processes: Vec<ProcessSummary>,
    /// Sum of `pack_pages` over all processes.
    pub total_pages: u64,
    /// Sum of `pack_bytes` over all processes.
    pub total_bytes: u64,
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
        })
        .collect();
    CheckpointSummary {
        number: cp.number,
        parent: m.parent,
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
        processes,
    }
}

/// Opens every pack the checkpoint references and verifies all checksums.
pub fn verify_checkpoint(cp: &Checkpoint) -> Result<(), ImageError> {
    for p in &cp.manifest.processes {
        if let Some(pack) = cp.open_process_pack(p)? {
            pack.verify()?;
        }
    }
    Ok(())
}
