//! The userfaultfd backend: `WP_ASYNC` write-protection read back with
//! `PAGEMAP_SCAN`.
//!
//! A userfaultfd registers the memory of the process that created it, so it
//! is created inside the frozen target by a remote `userfaultfd()`, taken
//! out with `pidfd_getfd` and closed in the target again. The handshake
//! asks for `WP_ASYNC` (the kernel clears the protection of a written page
//! itself, with no message to read) and `WP_UNPOPULATED` (pages never
//! touched are protected too, so a first write to them is seen).
//!
//! The areas stay registered only as long as someone holds the descriptor:
//! `stasis run` holds it itself; `stasis dump --track --leave-running`
//! hands it to a small keeper process ([`crate::keeper`]).

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use stasis_kernel::pagemap::{Pagemap, ScanQuery};
use stasis_kernel::uffd::{self, Userfaultfd};
use stasis_kernel::uffd_remote::{self, UffdRemoteError};
use stasis_kernel::KernelError;
use stasis_sys as sys;

use crate::{Area, ArmReport, Backend, Dirty, DirtyTracker, Remote, Result, TrackError};

/// Features asked of the userfaultfd.
pub const FEATURES: u64 = sys::UFFD_FEATURE_WP_ASYNC | sys::UFFD_FEATURE_WP_UNPOPULATED;

/// Checks that this kernel has what the backend needs: a userfaultfd with
/// `WP_ASYNC` + `WP_UNPOPULATED`, and `PAGEMAP_SCAN`.
pub fn probe() -> Result<()> {
    let unsupported = |why: String| TrackError::Unsupported {
        backend: "uffd",
        why,
    };
    let (fd, _) = uffd::create_raw().map_err(|e| unsupported(e.to_string()))?;
    let got = uffd::api(&fd, FEATURES).map_err(|e| unsupported(e.to_string()))?;
    if got & FEATURES != FEATURES {
        return Err(unsupported(
            "userfaultfd lacks WP_ASYNC or WP_UNPOPULATED (Linux 6.7 or later has them)".into(),
        ));
    }
    let pm = Pagemap::open(std::process::id() as i32).map_err(|e| unsupported(e.to_string()))?;
    let local = 0u8;
    let probe_at = std::ptr::addr_of!(local) as u64 & !(sys::PAGE_SIZE - 1);
    pm.scan(
        probe_at,
        probe_at + sys::PAGE_SIZE,
        ScanQuery::private_data(),
    )
    .map_err(|e| unsupported(e.to_string()))?;
    Ok(())
}

/// Whether a userfaultfd can be created inside process `pid`: not in a
/// user namespace other than this process's (the kernel asks for
/// `CAP_SYS_PTRACE` in the initial one) unless the
/// `vm.unprivileged_userfaultfd` sysctl is 1. The reason if not.
pub fn allowed_in(pid: i32) -> std::result::Result<(), String> {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/user")).ok();
    if ns(&pid.to_string()) == ns("self") {
        return Ok(());
    }
    let sysctl =
        std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    if sysctl.trim() == "1" {
        return Ok(());
    }
    Err(format!(
        "process {pid} is in a user namespace of its own, where the kernel lets it make a userfaultfd only with vm.unprivileged_userfaultfd=1 (sysctl)"
    ))
}

/// The userfaultfd tracker. It holds the descriptors it created until they
/// are taken with [`UffdTracker::take_held`].
#[derive(Default)]
pub struct UffdTracker {
    pagemaps: HashMap<i32, Pagemap>,
    held: Vec<(i32, OwnedFd)>,
    /// Areas (pid, start, end) whose written pages were collected and
    /// write-protected again in the same scan during this dump.
    rearmed: std::collections::HashSet<(i32, u64, u64)>,
}

impl UffdTracker {
    pub fn new() -> Self {
        Self::default()
    }

    fn pagemap(&mut self, pid: i32) -> Result<&Pagemap> {
        use std::collections::hash_map::Entry;
        Ok(match self.pagemaps.entry(pid) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => {
                v.insert(Pagemap::open(pid).map_err(|source| TrackError::Process {
                    pid,
                    what: "opening its pagemap".into(),
                    source,
                })?)
            }
        })
    }

    /// Forgets processes that are gone (their pagemap and descriptors).
    pub fn forget(&mut self, pid: i32) {
        self.pagemaps.remove(&pid);
        self.held.retain(|(p, _)| *p != pid);
    }

    /// Creates a userfaultfd inside the frozen process and takes it out.
    fn create_in(pid: i32, remote: &mut dyn Remote) -> Result<Userfaultfd> {
        uffd_remote::create_in(remote, pid, "userfaultfd", FEATURES).map_err(|e| {
            let (what, source) = match e {
                UffdRemoteError::Missing { .. } => {
                    return TrackError::Unsupported {
                        backend: "uffd",
                        why: "userfaultfd lacks WP_ASYNC or WP_UNPOPULATED".into(),
                    }
                }
                UffdRemoteError::Create { source, .. } => {
                    ("creating a userfaultfd inside it", source)
                }
                UffdRemoteError::Take { source, .. } => ("taking its userfaultfd out", source),
                UffdRemoteError::Close { source, .. } => {
                    ("closing its copy of the userfaultfd", source)
                }
                UffdRemoteError::Handshake { source, .. } => ("the userfaultfd handshake", source),
            };
            TrackError::Process {
                pid,
                what: what.into(),
                source,
            }
        })
    }
}

impl DirtyTracker for UffdTracker {
    fn backend(&self) -> Backend {
        Backend::Uffd
    }

    fn take_held(&mut self) -> Vec<(i32, OwnedFd)> {
        std::mem::take(&mut self.held)
    }

    /// Collects the written pages of a registered area and write-protects
    /// them again in the same walk (`PM_SCAN_WP_MATCHING`). The caller must
    /// make sure a dump that fails after this does not leave the tracking
    /// state claiming the old checkpoint as a base (the capture clears it
    /// before collecting). An area that is not registered (`EPERM` from
    /// `PM_SCAN_CHECK_WPASYNC`) is untracked.
    fn dirty(&mut self, pid: i32, area: &Area) -> Result<Dirty> {
        if !area.private_anon {
            return Ok(Dirty::All);
        }
        let scanned = self
            .pagemap(pid)?
            .scan(area.start, area.end, ScanQuery::written_and_rearm());
        let regions = match scanned {
            Ok(r) => r,
            Err(KernelError::Io { source, .. }) if source.raw_os_error() == Some(libc::EPERM) => {
                return Ok(Dirty::All);
            }
            Err(source) => {
                return Err(TrackError::Process {
                    pid,
                    what: format!(
                        "scanning {:#x}-{:#x} for written pages",
                        area.start, area.end
                    ),
                    source,
                })
            }
        };
        self.rearmed.insert((pid, area.start, area.end));
        Ok(Dirty::Ranges(crate::merge_ranges(
            regions.iter().map(|r| (r.start, r.end)),
        )))
    }

    fn arm(&mut self, pid: i32, areas: &[Area], remote: &mut dyn Remote) -> Result<ArmReport> {
        let mut report = ArmReport::default();
        // Areas collected in this dump are protected again already.
        let todo: Vec<&Area> = areas
            .iter()
            .filter(|a| a.private_anon && !self.rearmed.remove(&(pid, a.start, a.end)))
            .collect();
        let mut protect: Vec<(u64, u64)> = Vec::new();
        if !todo.is_empty() {
            let u = Self::create_in(pid, remote)?;
            for a in todo {
                match u.register(a.start, a.end - a.start, sys::UFFDIO_REGISTER_MODE_WP) {
                    Ok(()) => {
                        protect.push((a.start, a.end));
                        report.registered += 1;
                    }
                    // Registered already (by the descriptor of an earlier
                    // dump, still held): protect it again.
                    Err(KernelError::Io { source, .. })
                        if source.raw_os_error() == Some(libc::EBUSY) =>
                    {
                        protect.push((a.start, a.end));
                    }
                    Err(e) => {
                        tracing::info!(
                            pid,
                            "area {:#x}-{:#x} stays untracked: {e}",
                            a.start,
                            a.end
                        );
                        report.untracked += 1;
                    }
                }
            }
            if report.registered > 0 {
                let fd = u.fd().try_clone().map_err(|e| TrackError::Process {
                    pid,
                    what: "keeping its userfaultfd".into(),
                    source: KernelError::Io {
                        what: "dup".into(),
                        source: e,
                    },
                })?;
                self.held.push((pid, fd));
            }
        }
        protect.sort_unstable();
        let pm = self.pagemap(pid)?;
        for (s, e) in protect {
            match pm.scan(s, e, ScanQuery::written_and_rearm()) {
                Ok(_) => {}
                Err(KernelError::Io { source, .. })
                    if source.raw_os_error() == Some(libc::EPERM) =>
                {
                    // Registered, but not write-protect-async (someone
                    // else's registration): it counts as untracked.
                    report.untracked += 1;
                }
                Err(source) => {
                    return Err(TrackError::Process {
                        pid,
                        what: format!("write-protecting {s:#x}-{e:#x}"),
                        source,
                    })
                }
            }
        }
        Ok(report)
    }
}
