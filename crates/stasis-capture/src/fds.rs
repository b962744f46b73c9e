//! File descriptors of the dumped tree: what each one is, which ones share
//! an open file description, the data sitting in pipes and socket queues.
//!
//! Each kind of kernel object is saved by its own module of
//! `stasis-objects` (`pipe.rs`, `unix.rs`, `tcp/`...; see
//! [`stasis_objects::REGISTRY`]); this module adapts them to the capture:
//! the fd table of a dump (errors convert into `CaptureError` in lib.rs).

use stasis_objects::SaveCtx;

pub use stasis_objects::save::unsupported_reason;
pub use stasis_objects::socket::{transient_socket, AcceptGate};
pub use stasis_objects::tcp::{dismiss_guard, kill_owners, leave_repair, Repaired, Repairs};

use crate::freeze::Frozen;
use crate::Result;

/// Lists the fd numbers of `pid`.
pub fn list_fds(pid: i32) -> Result<Vec<i32>> {
    Ok(stasis_objects::save::list_fds(pid)?)
}

/// Collects the fds of every process of a dump (the objects' [`SaveCtx`],
/// whose fields it derefs to: `tables`, `pipes`, `ghosts`, `sysv`,
/// `repaired`).
#[derive(Default)]
pub struct FdCollector(SaveCtx);

impl std::ops::Deref for FdCollector {
    type Target = SaveCtx;
    fn deref(&self) -> &SaveCtx {
        &self.0
    }
}

impl std::ops::DerefMut for FdCollector {
    fn deref_mut(&mut self) -> &mut SaveCtx {
        &mut self.0
    }
}

impl FdCollector {
    /// See [`SaveCtx::add_process`].
    pub fn add_process(&mut self, pid: i32) -> Result<()> {
        Ok(self.0.add_process(pid)?)
    }

    /// See [`SaveCtx::freeze_tcp`]; the owners of the connections are
    /// held among the threads of `frozen` ([`Frozen::hold`]).
    pub fn freeze_tcp(&mut self, frozen: &mut Frozen) -> Result<()> {
        let pids = frozen.live_pids();
        let stopped = frozen.stopped_pids();
        Ok(self
            .0
            .freeze_tcp(&pids, &stopped, &mut |held| Ok(frozen.hold(held)?))?)
    }

    /// See [`SaveCtx::read_tcp`].
    pub fn read_tcp(&mut self) -> Result<()> {
        Ok(self.0.read_tcp()?)
    }

    /// See [`SaveCtx::check_external_sockets`].
    pub fn check_external_sockets(&self) -> Result<()> {
        Ok(self.0.check_external_sockets()?)
    }

    /// See [`SaveCtx::link_in_flight`].
    pub fn link_in_flight(&mut self) {
        self.0.link_in_flight();
    }

    /// See [`SaveCtx::take_shell_job`].
    pub fn take_shell_job(&mut self) -> Option<stasis_image::manifest::ShellJob> {
        self.0.take_shell_job()
    }

    /// See [`SaveCtx::uffd_ranges`].
    pub fn uffd_ranges(&self, pid: i32) -> Vec<(u64, u64)> {
        self.0.uffd_ranges(pid)
    }

    /// See [`SaveCtx::check_ghost_watches`].
    pub fn check_ghost_watches(&self) -> Result<()> {
        Ok(self.0.check_ghost_watches()?)
    }

    /// See [`SaveCtx::check_external_pipes`].
    pub fn check_external_pipes(&self, tree: &[i32]) -> Result<()> {
        Ok(self.0.check_external_pipes(tree)?)
    }

    /// See [`SaveCtx::check_external_ptys`].
    pub fn check_external_ptys(&mut self, tree: &[i32]) -> Result<()> {
        Ok(self.0.check_external_ptys(tree)?)
    }

    /// See [`SaveCtx::capture_sysv`].
    pub fn capture_sysv(
        &mut self,
        pid: i32,
        shmid: i32,
        area: (u64, u64),
        offset: u64,
    ) -> Result<bool> {
        Ok(self.0.capture_sysv(pid, shmid, area, offset)?)
    }

    /// See [`SaveCtx::capture_mapped_ghost`].
    pub fn capture_mapped_ghost(&mut self, pid: i32, start: u64, end: u64) -> Result<()> {
        Ok(self.0.capture_mapped_ghost(pid, start, end)?)
    }
}
