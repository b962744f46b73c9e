//! Reading a process's state from `/proc/PID/*`: the I/O around the one
//! procfs parser ([`stasis_kernel::procfs`], re-exported here), with a
//! missing file mapped to a dead process and bad content to
//! [`SaveError::ProcFormat`](crate::SaveError::ProcFormat).

use std::path::PathBuf;

use stasis_image::manifest::{Capabilities, Credentials, MmImage, Rlimit};
pub use stasis_kernel::procfs::{
    parse_epoll, parse_eventfd, parse_fdinfo, parse_inotify, parse_limits, parse_locks, parse_maps,
    parse_signalfd, parse_smaps_flagged, parse_smaps_vmflags, parse_stat, parse_status,
    parse_status_locked_kib, parse_timerfd, parse_timers, task_children, Creds, FormatError,
    InotifyLine, Limit, MapsEntry, MmLayout, Stat, TimerLine,
};

use crate::SaveError;
use crate::{CaptureError, Result};

/// Reads `/proc/PID/<name>` and parses it with `parse`.
pub fn read_parsed<T>(
    pid: i32,
    name: &str,
    parse: impl FnOnce(&str) -> std::result::Result<T, FormatError>,
) -> Result<T> {
    parse(&read(pid, name)?).map_err(|e| format_err(pid, name, e))
}

/// A parse error of `/proc/PID/<name>`.
pub fn format_err(pid: i32, name: &str, e: FormatError) -> CaptureError {
    SaveError::ProcFormat {
        pid,
        file: name.into(),
        what: e.0,
    }
    .into()
}

/// `root` and its descendants as they are now (read from each task's
/// `children`; a tree that forks meanwhile may have more).
pub fn tree_pids(root: i32) -> Vec<i32> {
    stasis_kernel::procfs::tree_pids(&[root])
}

/// The image's `mm` fields from stat's layout (`brk` and `auxv` are read
/// elsewhere).
pub fn mm_image(m: &MmLayout) -> MmImage {
    MmImage {
        start_code: m.start_code,
        end_code: m.end_code,
        start_data: m.start_data,
        end_data: m.end_data,
        start_brk: m.start_brk,
        brk: 0,
        start_stack: m.start_stack,
        arg_start: m.arg_start,
        arg_end: m.arg_end,
        env_start: m.env_start,
        env_end: m.env_end,
        auxv: Vec::new(),
    }
}

/// The image's credentials.
pub fn credentials(c: Creds, securebits: u32) -> Credentials {
    Credentials {
        uid: c.uid,
        gid: c.gid,
        groups: c.groups,
        groups_fixed: false,
        caps: c.caps.map(|[inh, prm, eff, bnd, amb]| Capabilities {
            inheritable: inh,
            permitted: prm,
            effective: eff,
            bounding: bnd,
            ambient: amb,
            securebits,
        }),
    }
}

/// The image's resource limits.
pub fn rlimits(l: Vec<Limit>) -> Vec<Rlimit> {
    l.into_iter()
        .map(|l| Rlimit {
            resource: l.resource,
            soft: l.soft,
            hard: l.hard,
        })
        .collect()
}

/// Reads `/proc/PID/<name>` as text, mapping "not found" to a dead process.
pub fn read(pid: i32, name: &str) -> Result<String, CaptureError> {
    std::fs::read_to_string(proc_path(pid, name)).map_err(|e| CaptureError::from_proc(pid, name, e))
}

/// Reads `/proc/PID/<name>` as bytes.
pub fn read_bytes(pid: i32, name: &str) -> Result<Vec<u8>, CaptureError> {
    std::fs::read(proc_path(pid, name)).map_err(|e| CaptureError::from_proc(pid, name, e))
}

/// Reads the link `/proc/PID/<name>`.
pub fn read_link(pid: i32, name: &str) -> Result<String, CaptureError> {
    std::fs::read_link(proc_path(pid, name))
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| CaptureError::from_proc(pid, name, e))
}

/// `/proc/PID/<name>`.
pub fn proc_path(pid: i32, name: &str) -> PathBuf {
    stasis_kernel::procfs::path(pid, name)
}
