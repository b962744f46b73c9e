//! The namespaces of the dumped tree, against the dumper's.
//!
//! [`check`] (preflight, nothing stopped) refuses a tree whose processes do
//! not all share the root's namespaces, and the namespaces of its own that
//! stasis cannot restore: user, cgroup and time namespaces; a PID namespace
//! whose init is not the root; a network namespace with another interface
//! than `lo`; System V message queues and semaphores of an
//! IPC namespace; and mounts of a mount namespace other than a proc on
//! `/proc`. [`describe`] (frozen) records what the restore needs: the host
//! and domain names, whether `lo` is up, the proc mount, and the PID (and
//! TID) of every process in its namespace. The dump itself works with the
//! PIDs stasis sees (ptrace, `/proc`); [`translate_pids`] gives the
//! manifest the in-namespace ones at the commit.

use std::collections::{HashMap, HashSet};

use stasis_image::manifest::{
    FdKind, Manifest, MountNamespace, Namespaces, NetNamespace, ProcessImage, UtsNamespace,
};
use stasis_kernel::ns::{self as kns, NsKind};

use crate::{proc, CaptureError, Result, SaveError};

/// The kinds a tree may have of its own.
const RESTORABLE: [NsKind; 5] = [
    NsKind::Pid,
    NsKind::Mnt,
    NsKind::Net,
    NsKind::Uts,
    NsKind::Ipc,
];

fn refuse(pid: i32, what: String) -> CaptureError {
    SaveError::Unsupported { pid, what }.into()
}

/// The kinds of namespace process `root` has that differ from the dumper's.
pub fn own_kinds(root: i32) -> Vec<NsKind> {
    NsKind::ALL
        .into_iter()
        .filter(|&k| match (kns::ns_id(root, k), kns::own_ns_id(k)) {
            (Some(a), Some(b)) => a != b,
            _ => false,
        })
        .collect()
}

/// Refuses, before anything is stopped, a tree whose namespaces stasis
/// cannot restore (`tree`: the root first, then its descendants).
pub fn check(root: i32, tree: &[i32]) -> Result<()> {
    for &p in tree.iter().filter(|&&p| p != root) {
        for k in NsKind::ALL {
            match (kns::ns_id(p, k), kns::ns_id(root, k)) {
                (Some(a), Some(b)) if a != b => {
                    return Err(refuse(
                        p,
                        format!(
                            "it is in a {} namespace other than the root's ({root}); stasis restores a tree whose processes all share the root's namespaces",
                            k.name()
                        ),
                    ))
                }
                _ => {}
            }
        }
    }
    let own = own_kinds(root);
    if let Some(k) = own.iter().find(|k| !RESTORABLE.contains(k)) {
        return Err(refuse(
            root,
            format!(
                "it is in a {} namespace of its own; stasis restores only pid, uts, ipc, net and mnt namespaces",
                k.name()
            ),
        ));
    }
    if own.contains(&NsKind::Pid) && kns::pid_in_own_ns(root, root) != Some(1) {
        return Err(refuse(
            root,
            "it is in a PID namespace of its own but is not its init (PID 1 there); dump the namespace's init".into(),
        ));
    }
    if own.contains(&NsKind::Net) {
        check_net(root)?;
    }
    if own.contains(&NsKind::Ipc) {
        check_ipc(root)?;
    }
    if own.contains(&NsKind::Mnt) {
        let proc = extra_mounts(root, own.contains(&NsKind::Pid))?;
        if proc && !own.contains(&NsKind::Pid) {
            return Err(refuse(
                root,
                "its mount namespace has a proc file system on /proc of its own but the tree shares the dumper's PID namespace".into(),
            ));
        }
    }
    Ok(())
}

/// A network namespace of the tree's own: only `lo` (its sockets are
/// saved as in the dumper's, from inside it: [`enter_net`]).
fn check_net(root: i32) -> Result<()> {
    let dev = proc::read(root, "net/dev")?;
    for name in dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
    {
        if name != "lo" {
            return Err(refuse(
                root,
                format!("its network namespace has the interface {name}; stasis restores a network namespace with only lo"),
            ));
        }
    }
    Ok(())
}

/// With a network namespace of the tree's own: the calling thread in it
/// until the guard is dropped, so that its sockets are read there
/// (sock_diag answers about the namespace of the socket asking).
pub fn enter_net(root: i32) -> Result<Option<kns::NetnsGuard>> {
    if !own_kinds(root).contains(&NsKind::Net) {
        return Ok(None);
    }
    Ok(Some(kns::NetnsGuard::enter(root)?))
}

/// An IPC namespace of the tree's own: System V shared memory only (its
/// segments are saved as in the dumper's namespace, read from inside).
fn check_ipc(root: i32) -> Result<()> {
    let read = || -> Vec<(&'static str, usize)> {
        [("message queue", "msg"), ("semaphore set", "sem")]
            .into_iter()
            .map(|(what, f)| {
                let rows = std::fs::read_to_string(format!("/proc/sysvipc/{f}"))
                    .map(|t| t.lines().skip(1).filter(|l| !l.trim().is_empty()).count())
                    .unwrap_or(0);
                (what, rows)
            })
            .collect()
    };
    let counts = kns::in_namespaces_of(root, &[NsKind::Ipc], read)?;
    if let Some((what, n)) = counts.into_iter().find(|&(_, n)| n > 0) {
        return Err(refuse(
            root,
            format!("its IPC namespace holds {n} System V {what}(s); only System V shared memory is supported there"),
        ));
    }
    Ok(())
}

/// `(device, root, mount point, type)` of each line of a `mountinfo`.
fn mounts(info: &str) -> Vec<(String, String, String, String)> {
    info.lines()
        .filter_map(|l| {
            let (a, b) = l.split_once(" - ")?;
            let f: Vec<&str> = a.split_whitespace().collect();
            let t = b.split_whitespace().next()?;
            Some((
                f.get(2)?.to_string(),
                f.get(3)?.to_string(),
                f.get(4)?.to_string(),
                t.to_string(),
            ))
        })
        .collect()
}

/// The mounts of the root's mount namespace that the dumper's has not
/// (mounts it lacks are left as the restorer has them): refuses every one
/// but a proc on `/proc`; returns whether there is one.
fn extra_mounts(root: i32, own_pid: bool) -> Result<bool> {
    let mine: HashSet<_> = mounts(&proc::read(std::process::id() as i32, "mountinfo")?)
        .into_iter()
        .collect();
    let mut proc_mount = false;
    for m in mounts(&proc::read(root, "mountinfo")?) {
        if mine.contains(&m) {
            continue;
        }
        let (_, _, at, kind) = &m;
        if kind == "proc" && at == "/proc" && own_pid {
            proc_mount = true;
            continue;
        }
        return Err(refuse(
            root,
            format!("its mount namespace has a {kind} mount on {at} that the dumper's has not; only a proc on /proc is supported there yet"),
        ));
    }
    Ok(proc_mount)
}

/// What the restore needs of the tree's namespaces, and its PIDs there.
pub struct NsCapture {
    pub namespaces: Namespaces,
    /// In-namespace PID (and TID) by the one stasis sees; empty without a
    /// PID namespace.
    pub pids: HashMap<i32, i32>,
}

/// Reads the namespaces of the frozen tree (`None`: the dumper's).
pub fn describe(root: i32, images: &[ProcessImage]) -> Result<Option<NsCapture>> {
    let own = own_kinds(root);
    if own.is_empty() {
        return Ok(None);
    }
    let mut ns = Namespaces {
        pid: own.contains(&NsKind::Pid),
        ipc: own.contains(&NsKind::Ipc),
        ..Default::default()
    };
    if own.contains(&NsKind::Uts) {
        let (h, d) = kns::in_namespaces_of(root, &[NsKind::Uts], || {
            nix::sys::utsname::uname().map(|u| {
                (
                    u.nodename().to_string_lossy().into_owned(),
                    u.domainname().to_string_lossy().into_owned(),
                )
            })
        })?
        .map_err(|e| CaptureError::from_proc(root, "ns/uts", e.into()))?;
        ns.uts = Some(UtsNamespace {
            hostname: h,
            domainname: d,
        });
    }
    if own.contains(&NsKind::Net) {
        let lo_up = kns::in_namespaces_of(root, &[NsKind::Net], kns::loopback_up)??;
        ns.net = Some(NetNamespace { lo_up });
    }
    if own.contains(&NsKind::Mnt) {
        ns.mnt = Some(MountNamespace {
            proc: extra_mounts(root, ns.pid)?,
        });
    }
    let mut pids = HashMap::new();
    if ns.pid {
        for p in images {
            let tids = std::iter::once(p.pid).chain(p.threads.iter().map(|t| t.tid));
            for tid in tids {
                let inner = kns::pid_in_own_ns(p.pid, tid).ok_or_else(|| {
                    refuse(
                        p.pid,
                        format!("the PID of its thread {tid} in its PID namespace is unknown (no NSpid in its status)"),
                    )
                })?;
                pids.insert(tid, inner);
            }
        }
    }
    Ok(Some(NsCapture {
        namespaces: ns,
        pids,
    }))
}

/// Gives every PID of the manifest as the tree's PID namespace has it
/// (`pids`); one outside the tree (a parent, session or group outside the
/// namespace) becomes 0, as the namespace sees it.
pub fn translate_pids(m: &mut Manifest, pids: &HashMap<i32, i32>) {
    let map = |p: &mut i32| {
        if *p > 0 {
            *p = pids.get(p).copied().unwrap_or(0);
        }
    };
    map(&mut m.root_pid);
    for p in &mut m.processes {
        map(&mut p.pid);
        map(&mut p.ppid);
        map(&mut p.pgid);
        map(&mut p.sid);
        if let Some(w) = &mut p.fds_shared_with {
            map(w);
        }
        for t in &mut p.threads {
            map(&mut t.tid);
        }
        for t in &mut p.posix_timers {
            map(&mut t.tid);
        }
        for f in &mut p.fds {
            if let Some(o) = &mut f.owner {
                // A negative owner is a process group.
                let mut g = o.pid.abs();
                map(&mut g);
                o.pid = if o.pid < 0 { -g } else { g };
            }
            match &mut f.kind {
                FdKind::Pidfd { pid, .. } => map(pid),
                FdKind::PtyMaster(pair) => {
                    if let Some(s) = &mut pair.session {
                        map(&mut s.sid);
                        map(&mut s.foreground);
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_device_root_point_and_type() {
        let info = "22 1 0:5 / /proc rw,nosuid - proc proc rw\n\
                    30 22 0:40 / /proc rw - proc proc rw\n";
        let m = mounts(info);
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[1],
            ("0:40".into(), "/".into(), "/proc".into(), "proc".into())
        );
        assert_ne!(m[0], m[1]);
    }
}
