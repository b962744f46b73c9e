//! Per process, once the whole tree is forked and every process's memory
//! built ([`crate::memory`]): the lazy filler's areas handed over, then the
//! exe link and mm fields, attributes, files, rlimits, signal handlers,
//! then its threads and what belongs to them ([`crate::threads`]).

use std::collections::HashMap;

use stasis_image::manifest::{FdImage, ProcessImage, Rlimit};
use stasis_image::PageSource;
use stasis_objects as objects;
use stasis_sys as sys;

use crate::build::{self, step};
use crate::memory::{self, ShmFirst};
use crate::pipeline::Transport;
use crate::proc::Proc;
use crate::remote::Remote;
use crate::ObjectError;
use crate::{files, threads, RestoreOptions, Result};

/// What the processes of one tree share while each is rebuilt.
pub(crate) struct TreeCtx<'a, 'm> {
    /// The root's PID in the image.
    pub root_pid: i32,
    /// Creates every open file description once, for all processes.
    pub factory: files::FdFactory<'m>,
    /// Shared anonymous objects (by inode) and where they were first mapped.
    pub shm_first: HashMap<u64, ShmFirst>,
    /// Shared anonymous objects (by inode): the furthest offset any area
    /// of the tree maps, the size each is made at.
    pub shm_sizes: HashMap<u64, u64>,
    pub transport: &'a Transport,
    /// The cgroups each process is put in.
    pub cgroups: &'a crate::cgroup::Placer,
    /// Processes that leave the transport open: it is in an fd table that
    /// a process built after them shares (`CLONE_FILES`).
    pub keep_transport: std::collections::HashSet<i32>,
    pub opts: &'a RestoreOptions,
    /// Bytes filled by the processes before this one, and in all.
    pub filled: u64,
    pub total: u64,
    /// Bytes left to the lazy filler so far.
    pub lazy_bytes: u64,
    /// Of each process (by image PID), the areas left to the lazy filler,
    /// handed over when the rest of the process is built.
    pub lazy_areas: HashMap<i32, Vec<(u64, u64)>>,
}

/// Builds the memory of one live process: vDSO and every area (a child
/// forked from its built parent keeps what `inherit` says and has the
/// rest unmapped first). Returns bytes filled.
pub(crate) fn build_memory(
    s: &mut Proc,
    p: &ProcessImage,
    sources: &[PageSource],
    inherit: Option<&memory::Inherit<'_>>,
    cx: &mut TreeCtx<'_, '_>,
) -> Result<u64> {
    s.cur = None;
    if let Some(h) = inherit {
        let ctl = s.ctl;
        crate::stub::keep_only(s, ctl, &h.kept(p))?;
    }
    memory::restore_vdso(s, p)?;
    memory::restore_memory(s, p, sources, inherit, cx)
}

/// Rebuilds the rest of one live process (not its final jump), its memory
/// built.
pub(crate) fn build_process(
    s: &mut Proc,
    p: &ProcessImage,
    cx: &mut TreeCtx<'_, '_>,
) -> Result<()> {
    s.cur = None;
    memory::arm_lazy_areas(s, p, cx)?;
    restore_exe_and_mm(s, p)?;
    restore_attributes(s, p)?;
    restore_files(s, p, cx)?;
    // The last step that names a path, and before the credentials (it
    // takes CAP_SYS_CHROOT): paths of the image are from the host's root.
    restore_root(s, p)?;
    restore_rlimits(s, s.pid, &p.rlimits)?;
    build::restore_sigactions(s, &p.sigactions)?;
    // The seccomp filters every thread has, before the threads exist:
    // they inherit them (one filter tree, as before).
    let shared = build::shared_seccomp(p);
    if let Some(main) = p.threads.first() {
        s.cur = None;
        build::install_seccomp(s, main.tid, &main.seccomp[..shared])?;
    }
    // (Shared by its threads: unshared before they are made.)
    crate::ns::unshare_pending_time(s, p, true)?;
    threads::create_threads(s, p)?;
    for ((t, _), th) in s.threads.iter().zip(p.threads.iter().skip(1)) {
        cx.cgroups.join_thread(th.tid, t.pid())?;
    }
    s.cur = None;
    build::create_posix_timers(s, &p.posix_timers)?;
    // Its children made, its threads too, and before the credentials
    // (it takes CAP_SYS_ADMIN).
    crate::ns::unshare_pending_time(s, p, false)?;
    threads::per_thread(s, p)?;
    s.cur = None;
    // After the credentials: changing them clears the parent-death signal.
    threads::process_prctls(s, p, s.pid == cx.root_pid)?;
    threads::restore_dumpable(s, p)?;
    threads::shared_signals(s, s.pid, p)?;
    build::restore_itimers(s, &p.itimers)?;
    build::arm_posix_timers(s, &p.posix_timers)?;
    Ok(())
}

/// mm fields, with the exe file. The kernel refuses to switch the exe link
/// away from a file that is still mapped, so when the stub already runs
/// the same file (a stasis binary restoring a stasis workload) the link is
/// left as it is.
fn restore_exe_and_mm(s: &mut Proc, p: &ProcessImage) -> Result<()> {
    let same_exe = {
        use std::os::unix::fs::MetadataExt;
        let cur = std::fs::metadata(format!("/proc/{}/exe", s.t.pid())).ok();
        // (As the stub sees it: under the tree's root of its own, if any.)
        let want = std::fs::metadata(format!("/proc/{}/root{}", s.t.pid(), p.exe)).ok();
        matches!((cur, want), (Some(a), Some(b)) if a.dev() == b.dev() && a.ino() == b.ino())
    };
    if same_exe {
        return build::restore_mm(s, &p.mm, u64::from(u32::MAX));
    }
    let exe_fd = build::open_in(s, &p.exe, "the executable")?;
    let mm_res = build::restore_mm(s, &p.mm, exe_fd);
    s.sys("close", libc::SYS_close, &[exe_fd])
        .map_err(step("closing the exe fd"))?;
    mm_res
}

/// Working directory, umask, personality.
/// A deleted working directory is entered with the files ([`restore_files`]).
pub(crate) fn restore_attributes<R: Remote>(s: &mut R, p: &ProcessImage) -> Result<()> {
    if !p.cwd.ends_with(" (deleted)") {
        let cwd = s
            .put_cstr(build::SCRATCH_PATH, &p.cwd)
            .map_err(step("cwd path"))?;
        s.sys("chdir", libc::SYS_chdir, &[cwd])
            .map_err(|source| ObjectError::File {
                path: p.cwd.clone(),
                what: "working directory".into(),
                source,
            })?;
    }
    s.sys("umask", libc::SYS_umask, &[u64::from(p.umask)])
        .map_err(step("umask"))?;
    s.sys(
        "personality",
        libc::SYS_personality,
        &[u64::from(p.personality)],
    )
    .map_err(step("personality"))?;
    if let Some(adj) = p.oom_score_adj {
        write_proc_self(s, "oom_score_adj", &adj.to_string())?;
    }
    if let Some(uid) = p.loginuid.filter(|&u| Some(u) != own_loginuid()) {
        write_proc_self(s, "loginuid", &uid.to_string())?;
    }
    if p.thp_disabled {
        s.sys(
            "prctl(PR_SET_THP_DISABLE)",
            libc::SYS_prctl,
            &[libc::PR_SET_THP_DISABLE as u64, 1, 0, 0, 0],
        )
        .map_err(step("disabling transparent huge pages again"))?;
    }
    for cmd in sys::MEMBARRIER_REGISTER_CMDS {
        if u64::from(p.membarrier) & cmd != 0 {
            s.sys("membarrier", libc::SYS_membarrier, &[cmd, 0, 0])
                .map_err(step(format!(
                    "registering the process's memory for membarrier again (command {cmd:#x})"
                )))?;
        }
    }
    Ok(())
}

/// The restorer's own login uid, which the restored processes inherit
/// (it can be set only once without `CAP_AUDIT_CONTROL`: written only
/// when it differs).
fn own_loginuid() -> Option<u32> {
    std::fs::read_to_string("/proc/self/loginuid")
        .ok()
        .and_then(|t| t.trim().parse().ok())
}

/// Writes `value` to the process's own `/proc/self/<file>` (before its
/// credentials are restored: lowering `oom_score_adj` or setting
/// `loginuid` takes root's privileges).
fn write_proc_self<R: Remote>(s: &mut R, file: &str, value: &str) -> Result<()> {
    let what = || format!("setting {file} to {value}");
    let path = s
        .put_cstr(build::SCRATCH_PATH, &format!("/proc/self/{file}"))
        .map_err(step(what()))?;
    let flags = (libc::O_WRONLY | libc::O_CLOEXEC) as u64;
    let fd = s
        .sys(
            "openat",
            libc::SYS_openat,
            &[stasis_kernel::sarg(i64::from(libc::AT_FDCWD)), path, flags],
        )
        .map_err(step(what()))?;
    let wrote = s
        .put(build::SCRATCH_STRUCT, value.as_bytes())
        .and_then(|a| s.sys("write", libc::SYS_write, &[fd, a, value.len() as u64]));
    let closed = s.sys("close", libc::SYS_close, &[fd]);
    wrote.map_err(step(what()))?;
    closed.map_err(step(what()))?;
    Ok(())
}

/// File descriptors, then what refers to them by number (epoll, locks);
/// finally the transport is closed in the process (by the last process
/// built of those that share one fd table; a sharer's own `fds` is empty).
fn restore_files(s: &mut Proc, p: &ProcessImage, cx: &mut TreeCtx<'_, '_>) -> Result<()> {
    let (transport, h) = (&cx.transport.sock, cx.transport.h);
    let factory = &mut cx.factory;
    factory.set_cwd(&p.cwd);
    for fd in p.fds.iter().filter(|f| {
        !objects::io_uring::made_in_process(f) && !objects::userfaultfd::made_in_process(f)
    }) {
        let desc = factory.get(fd)?;
        files::plant(s, transport, h, desc.as_fd(), fd.fd, fd.cloexec)?;
    }
    // A userfaultfd is the process's: made inside it, registered over its
    // memory (filled by now), then planted at its number.
    for fd in p
        .fds
        .iter()
        .filter(|f| objects::userfaultfd::made_in_process(f))
    {
        let outer = s.t.pid();
        let made = objects::userfaultfd::restore_in(s, outer, fd)?;
        files::plant(
            s,
            transport,
            h,
            std::os::fd::AsFd::as_fd(&made),
            fd.fd,
            fd.cloexec,
        )?;
    }
    // io_uring instances are made by the process, once its other fds
    // exist (their registered files), before what refers to fds by number;
    // one whose single issuer is another thread is enabled by that
    // thread once it exists (`threads::per_thread`).
    let main = p.threads.first().map_or(p.pid, |t| t.tid);
    let spare = p
        .fds
        .iter()
        .map(|f| f.fd)
        .max()
        .unwrap_or(2)
        .max(i32::try_from(h).unwrap_or(0))
        + 1;
    let host = s.t.pid();
    for fd in p
        .fds
        .iter()
        .filter(|f| objects::io_uring::made_in_process(f))
    {
        let later = objects::io_uring::enabled_by(fd, main).is_some();
        factory.io_uring(s, (p.pid, host), fd, later, (transport, h), spare)?;
    }
    for fd in &p.fds {
        // An epoll description shared by several fds is filled once.
        if factory.claim_epoll(fd) {
            files::restore_epoll(s, fd)?;
        }
        if factory.claim_flock(fd) {
            files::restore_flock(s, fd)?;
        }
        files::restore_posix_locks(s, fd)?;
        files::restore_owner(s, fd)?;
    }
    // Above every fd (and the transport): where a file is planted for a
    // moment.
    let top = p
        .fds
        .iter()
        .map(|f| f.fd)
        .max()
        .unwrap_or(2)
        .max(i32::try_from(h).unwrap_or(0));
    // Epolls in flight in its sockets' queues: registered by it, through
    // a copy planted above its fds for the moment (their numbers are its).
    for (epoll, img) in factory.take_in_flight_epolls(p.pid) {
        files::plant(
            s,
            transport,
            h,
            std::os::fd::AsFd::as_fd(&epoll),
            top + 1,
            true,
        )?;
        files::restore_epoll(s, &FdImage { fd: top + 1, ..img })?;
        let at = u64::from((top + 1).unsigned_abs());
        s.sys("close", libc::SYS_close, &[at])
            .map_err(step("closing the copy of an epoll in flight"))?;
    }
    // A deleted working directory: made again (or the one of an fd on
    // it), planted above every fd, entered, closed.
    if let Some(dir) = factory.deleted_cwd(&p.cwd, (p.creds.uid[1], p.creds.gid[1]))? {
        files::plant(
            s,
            transport,
            h,
            std::os::fd::AsFd::as_fd(&dir),
            top + 1,
            true,
        )?;
        let at = u64::from((top + 1).unsigned_abs());
        s.sys("fchdir", libc::SYS_fchdir, &[at])
            .map_err(step(format!(
                "entering the deleted working directory {}",
                p.cwd
            )))?;
        s.sys("close", libc::SYS_close, &[at])
            .map_err(step("closing the working directory's fd"))?;
    }
    // Sockets' rings mapped in memory, from their fds.
    build::map_socket_rings(s, &p.vmas)?;
    // A session leader takes its pty back as controlling terminal.
    factory.restore_ctty(s, p)?;
    if !cx.keep_transport.contains(&p.pid) {
        s.sys("close", libc::SYS_close, &[h])
            .map_err(step("closing the fd transport"))?;
    }
    Ok(())
}

/// Its root directory (`chroot`), when it was not `/`.
fn restore_root<R: Remote>(s: &mut R, p: &ProcessImage) -> Result<()> {
    let Some(root) = &p.root else {
        return Ok(());
    };
    let path = s
        .put_cstr(build::SCRATCH_PATH, root)
        .map_err(step("root directory path"))?;
    s.sys("chroot", libc::SYS_chroot, &[path])
        .map_err(|source| ObjectError::File {
            path: root.clone(),
            what: "root directory (chroot)".into(),
            source,
        })?;
    Ok(())
}

/// Resource limits; one the kernel refuses is a warning, not a failure.
pub(crate) fn restore_rlimits<R: Remote>(s: &mut R, pid: i32, rlimits: &[Rlimit]) -> Result<()> {
    for rl in rlimits {
        let a = s
            .put(build::SCRATCH_STRUCT, &build::words(&[rl.soft, rl.hard]))
            .map_err(step("rlimit"))?;
        if let Err(e) = s.sys(
            "prlimit64",
            libc::SYS_prlimit64,
            &[0, u64::from(rl.resource), a, 0],
        ) {
            tracing::warn!(
                pid,
                "could not restore rlimit {} ({}/{}): {e}",
                rl.resource,
                rl.soft,
                rl.hard
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::Recorder;

    #[test]
    fn oom_score_adj_is_written_to_proc_self_and_closed() {
        let mut img = crate::testutil::image(100, 1, 100, 100);
        img.oom_score_adj = Some(-321);
        let mut r = Recorder::default();
        restore_attributes(&mut r, &img).unwrap();
        assert_eq!(
            r.names(),
            ["chdir", "umask", "personality", "openat", "write", "close"]
        );
        assert!(r.writes().contains(&b"/proc/self/oom_score_adj\0".to_vec()));
        assert!(r.writes().contains(&b"-321".to_vec()));
        assert_eq!(r.args_of("write")[0][2], 4);
        // A failed write still closes the fd, and names the value.
        let mut r = Recorder {
            fail_on: Some(("write", libc::EACCES)),
            ..Recorder::default()
        };
        let e = restore_attributes(&mut r, &img).unwrap_err();
        assert!(r.names().contains(&"close"));
        assert!(e.to_string().contains("oom_score_adj to -321"), "{e}");
    }

    #[test]
    fn thp_disable_and_a_login_uid_come_back() {
        let mut img = crate::testutil::image(100, 1, 100, 100);
        img.thp_disabled = true;
        img.loginuid = own_loginuid();
        let mut r = Recorder::default();
        restore_attributes(&mut r, &img).unwrap();
        assert_eq!(
            r.names(),
            ["chdir", "umask", "personality", "prctl(PR_SET_THP_DISABLE)"],
            "the restorer's own login uid is inherited: not written"
        );
        img.loginuid = Some(own_loginuid().unwrap_or(0).wrapping_add(1));
        let mut r = Recorder::default();
        restore_attributes(&mut r, &img).unwrap();
        assert!(r.writes().contains(&b"/proc/self/loginuid\0".to_vec()));
        assert!(r
            .writes()
            .contains(&img.loginuid.unwrap().to_string().into_bytes()));
    }

    #[test]
    fn attributes_are_cwd_umask_personality() {
        let mut img = crate::testutil::image(100, 1, 100, 100);
        img.cwd = "/srv".into();
        img.umask = 0o27;
        img.personality = 0x0040_0000;
        let mut r = Recorder::default();
        restore_attributes(&mut r, &img).unwrap();
        assert_eq!(r.names(), ["chdir", "umask", "personality"]);
        assert_eq!(r.writes()[0], b"/srv\0");
        assert_eq!(r.args_of("umask"), [vec![0o27]]);
        assert_eq!(r.args_of("personality"), [vec![0x0040_0000]]);
        // A missing working directory is a file error naming it.
        let mut r = Recorder {
            fail_on: Some(("chdir", libc::ENOENT)),
            ..Recorder::default()
        };
        let e = restore_attributes(&mut r, &img).unwrap_err();
        assert!(
            matches!(e, crate::RestoreError::Object(ObjectError::File { ref path, .. }) if path == "/srv"),
            "{e}"
        );
    }

    #[test]
    fn an_rlimit_the_kernel_refuses_is_not_fatal() {
        let rl = |resource, soft, hard| Rlimit {
            resource,
            soft,
            hard,
        };
        let limits = [rl(7, 1024, 4096), rl(3, 8 << 20, u64::MAX)];
        let mut r = Recorder::default();
        restore_rlimits(&mut r, 100, &limits).unwrap();
        assert_eq!(r.args_of("prlimit64").len(), 2);
        assert_eq!(r.args_of("prlimit64")[0][1], 7);
        assert_eq!(r.writes()[1], build::words(&[8 << 20, u64::MAX]));
        let mut r = Recorder {
            fail_on: Some(("prlimit64", libc::EPERM)),
            ..Recorder::default()
        };
        restore_rlimits(&mut r, 100, &limits).unwrap();
        assert_eq!(r.args_of("prlimit64").len(), 2);
    }
}
