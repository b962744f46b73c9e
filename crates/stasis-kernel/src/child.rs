//! Creating a traced, stopped child: the restore stub and the probe child.
//!
//! The child is created with `clone3` (optionally at a chosen PID with
//! `set_tid`), calls `PTRACE_TRACEME` and stops itself with `SIGSTOP` before
//! running any Rust code. The parent then owns it as a [`Tracee`] with
//! `PTRACE_O_EXITKILL`, so if stasis dies the half-built child dies too.

use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;

use stasis_sys::{self as sys, CloneArgs};

use crate::ptrace::{describe_exit, wait_raw, StopKind};
use crate::{last_err, KernelError, Result, Tracee};

/// Errors specific to creating the child.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("PID {0} is already in use")]
    PidTaken(i32),
    #[error("creating a process at PID {pid} needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE)")]
    NoPermission {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// Raw `clone3` with `args` (fork-like when `args` has no `CLONE_VM`):
/// the child's pid in the parent, 0 in the child, -1 on error (errno set).
///
/// # Safety
/// Like `fork`: the child of a multithreaded process may only call
/// async-signal-safe functions, and must not return into code that expects
/// to be the parent.
pub(crate) unsafe fn clone3(args: &CloneArgs) -> i64 {
    // SAFETY: `args` is a live `clone_args` of the size passed; what the
    // child runs is the caller's contract.
    unsafe {
        libc::syscall(
            sys::SYS_CLONE3,
            args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    }
}

/// Forks a child (at PID `set_tid` if given) that stops right away under our
/// trace. It has `PR_SET_PDEATHSIG(SIGKILL)`: it dies with the caller even
/// before `PTRACE_O_EXITKILL` is set (a caller that lets it live on must
/// clear that). Returns it in its initial `SIGSTOP` signal-delivery stop, with the
/// address of the `syscall` instruction it stopped after recorded for remote
/// syscalls.
pub fn spawn_stopped(set_tid: Option<i32>) -> Result<Tracee, SpawnError> {
    spawn_stopped_with(set_tid, None)
}

/// What the root of a tree restored in new namespaces sets up in them
/// before it stops (it is created in them, PID 1 of a new PID namespace).
#[derive(Debug, Default)]
pub struct NsSetup {
    /// The `CLONE_NEW*` flags of the namespaces to create.
    pub flags: u64,
    /// The host and domain names of a new UTS namespace.
    pub hostname: Option<std::ffi::CString>,
    pub domainname: Option<std::ffi::CString>,
    /// In a new mount namespace: make every mount private, and mount a
    /// proc file system of the new PID namespace on `/proc`.
    pub mount_proc: bool,
    /// In a new mount namespace: its mounts made slaves (`MS_SLAVE`: those
    /// shared here go on receiving this namespace's mounts), not private.
    pub mount_slave: bool,
    /// In a new mount namespace: tmpfs mounts to make, in order (where,
    /// `MS_*` flags, options, source), after every mount is made private.
    pub tmpfs: Vec<(std::ffi::CString, u64, std::ffi::CString, std::ffi::CString)>,
    /// In a new mount namespace: bind mounts to make after those (source,
    /// target, `MS_*` flags applied by a remount).
    pub binds: Vec<(std::ffi::CString, std::ffi::CString, u64)>,
    /// With a new user namespace: its `uid_map` and `gid_map` text, and
    /// whether `setgroups` is denied first. Written by the parent before
    /// the child sets anything up (it waits for them: ids in mount options
    /// and files mean nothing in a namespace without maps).
    pub id_maps: Option<(String, String, bool)>,
    /// A new time namespace, made last: the child unshares it, writes
    /// this text (its clock offsets, [`crate::ns::timens_offsets_text`])
    /// to its `timens_offsets` before anyone is in it, then enters it
    /// (`setns` on its `ns/time_for_children`), and its children are
    /// made in it. Not in `flags`: a namespace made by `clone3` is entered
    /// at once, its offsets fixed at the host's.
    pub time_offsets: Option<std::ffi::CString>,
}

/// Writes the id maps of the user namespace of `pid`.
fn write_id_maps(
    pid: i32,
    (uid_map, gid_map, deny): &(String, String, bool),
) -> std::io::Result<()> {
    if *deny {
        std::fs::write(format!("/proc/{pid}/setgroups"), "deny")?;
    }
    std::fs::write(format!("/proc/{pid}/uid_map"), uid_map)?;
    std::fs::write(format!("/proc/{pid}/gid_map"), gid_map)
}

/// The pipe a child made in a new user namespace waits on for its id
/// maps (none without maps to write).
struct MapsGate<'a> {
    maps: Option<&'a (String, String, bool)>,
    fds: Option<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)>,
}

impl<'a> MapsGate<'a> {
    fn new(maps: Option<&'a (String, String, bool)>) -> Result<MapsGate<'a>> {
        let mut raw = [-1i32; 2];
        // SAFETY: pipe2 writes two fds into `raw`.
        if maps.is_some() && unsafe { libc::pipe2(raw.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(KernelError::io("pipe2", last_err()));
        }
        // SAFETY: the fds were just made by pipe2 and are ours alone.
        let fds = maps.map(|_| unsafe {
            (
                std::os::fd::OwnedFd::from_raw_fd(raw[0]),
                std::os::fd::OwnedFd::from_raw_fd(raw[1]),
            )
        });
        Ok(MapsGate { maps, fds })
    }

    /// The (read, write) fds for the child's side ([`set_up_namespaces`]),
    /// -1 without maps.
    fn raw(&self) -> [i32; 2] {
        use std::os::fd::AsRawFd;
        self.fds
            .as_ref()
            .map_or([-1, -1], |(r, w)| [r.as_raw_fd(), w.as_raw_fd()])
    }

    /// Writes the maps of child `pid` and lets it go on; on a failure the
    /// child reads EOF and exits (status 121), and is reaped.
    fn open(self, pid: i32) -> Result<()> {
        let (Some(m), Some((r, w))) = (self.maps, self.fds) else {
            return Ok(());
        };
        drop(r);
        if let Err(e) = write_id_maps(pid, m) {
            drop(w);
            let _ = wait_raw(pid);
            return Err(KernelError::io(
                "writing the id maps of the new user namespace",
                e,
            ));
        }
        let mut f = std::fs::File::from(w);
        let _ = std::io::Write::write_all(&mut f, b"1");
        Ok(())
    }
}

/// Like [`spawn_stopped`], but the child is created in the new namespaces
/// of `ns` (PID 1 of its PID namespace, if it makes one: then `set_tid`
/// must be `None`), and sets them up before it stops.
pub fn spawn_stopped_in(set_tid: Option<i32>, ns: &NsSetup) -> Result<Tracee, SpawnError> {
    spawn_stopped_with(set_tid, Some(ns))
}

fn spawn_stopped_with(set_tid: Option<i32>, ns: Option<&NsSetup>) -> Result<Tracee, SpawnError> {
    let tid_arr = [set_tid.unwrap_or(0)];
    let new_pidns = ns.is_some_and(|n| n.flags & u64::from(libc::CLONE_NEWPID.unsigned_abs()) != 0);
    let args = CloneArgs {
        flags: ns.map_or(0, |n| n.flags),
        exit_signal: libc::SIGCHLD as u64,
        set_tid: if set_tid.is_some() {
            tid_arr.as_ptr() as u64
        } else {
            0
        },
        set_tid_size: u64::from(set_tid.is_some()),
        ..Default::default()
    };
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // With id maps to write: the child waits on this pipe for them.
    let gate = MapsGate::new(ns.and_then(|n| n.id_maps.as_ref()))?;
    let gate_raw = gate.raw();
    // SAFETY: clone3 with a valid `clone_args` and no CLONE_VM duplicates
    // this process like fork. In the child only async-signal-safe raw
    // syscalls run before it stops and is taken over by the parent (it never
    // returns into Rust code on its own: _exit follows).
    let pid = unsafe { clone3(&args) };
    if pid == 0 {
        // SAFETY: child side; raw syscalls only, then _exit.
        unsafe {
            // Until the parent has set PTRACE_O_EXITKILL, nothing else
            // ties the child's life to it: a parent killed in between
            // would leave it stopped for ever (holding copies of all the
            // parent's fds). The restorer clears this once EXITKILL holds.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            // In a new PID namespace the parent is outside: PID 0.
            if libc::getppid() != if new_pidns { 0 } else { parent } {
                libc::_exit(127);
            }
            if let Some(n) = ns {
                set_up_namespaces(n, gate_raw);
            }
            libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0);
            libc::kill(libc::getpid(), libc::SIGSTOP);
            libc::_exit(127);
        }
    }
    if pid < 0 {
        let e = last_err();
        let want = set_tid.unwrap_or(0);
        return Err(match e.raw_os_error() {
            Some(libc::EEXIST) => SpawnError::PidTaken(want),
            Some(libc::EPERM) => SpawnError::NoPermission {
                pid: want,
                source: e,
            },
            _ => SpawnError::Kernel(KernelError::io("clone3", e)),
        });
    }
    let pid = i32::try_from(pid)
        .map_err(|_| KernelError::io("clone3", std::io::Error::other("pid out of range")))?;
    gate.open(pid)?;
    let status = wait_raw(pid)?;
    if !libc::WIFSTOPPED(status) || libc::WSTOPSIG(status) != libc::SIGSTOP {
        return Err(KernelError::Died {
            pid,
            how: describe_exit(status),
            status,
        }
        .into());
    }
    let mut t = Tracee::adopt_traceme_child(pid, sys::PTRACE_O_EXITKILL)?;
    let regs = t.regs()?;
    t.set_syscall_insn(regs.rip - 2);
    Ok(t)
}

/// The set-up a child created in new namespaces (`n`) does before
/// anything else: waits for its id maps (on `gate`, when it has maps to
/// wait for), sets its host and domain names, makes its mounts private (or
/// slaves), mounts a proc, its tmpfs and bind mounts, and makes and enters a
/// new time namespace. On a failure it leaves with `_exit` and a code
/// [`NsSetup`]'s users translate (119-125).
///
/// # Safety
/// Only in a child just created by [`clone3`] (without `CLONE_VM`): it
/// makes raw, async-signal-safe syscalls only, and may `_exit`.
unsafe fn set_up_namespaces(n: &NsSetup, gate: [i32; 2]) {
    let (proc_src, proc_dir, root_dir, tmpfs) = (c"proc", c"/proc", c"/", c"tmpfs");
    let (offsets_file, time_ns) = (
        c"/proc/self/timens_offsets",
        c"/proc/self/ns/time_for_children",
    );
    // SAFETY: the caller's contract: a fresh child, raw syscalls only, on
    // pointers to data that lives as long as the call.
    unsafe {
        if gate[0] >= 0 {
            // Wait for the parent to write the id maps (EOF: it
            // failed to; our copy of the write end closed first).
            libc::close(gate[1]);
            let mut b = 0u8;
            if libc::read(gate[0], (&mut b as *mut u8).cast(), 1) != 1 {
                libc::_exit(121);
            }
        }
        if let Some(h) = &n.hostname {
            if libc::sethostname(h.as_ptr(), h.as_bytes().len()) != 0 {
                libc::_exit(125);
            }
        }
        if let Some(d) = &n.domainname {
            if libc::setdomainname(d.as_ptr(), d.as_bytes().len()) != 0 {
                libc::_exit(125);
            }
        }
        // A new mount namespace: its mounts private, so that none
        // made in it (here or by the restorer later) is seen out.
        if n.flags & u64::from(libc::CLONE_NEWNS.unsigned_abs()) != 0
            && libc::mount(
                std::ptr::null(),
                root_dir.as_ptr(),
                std::ptr::null(),
                libc::MS_REC
                    | if n.mount_slave {
                        libc::MS_SLAVE
                    } else {
                        libc::MS_PRIVATE
                    },
                std::ptr::null(),
            ) != 0
        {
            libc::_exit(124);
        }
        if n.mount_proc
            && libc::mount(
                proc_src.as_ptr(),
                proc_dir.as_ptr(),
                proc_src.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ) != 0
        {
            libc::_exit(124);
        }
        for (at, flags, opts, src) in &n.tmpfs {
            if libc::mount(
                src.as_ptr(),
                at.as_ptr(),
                tmpfs.as_ptr(),
                *flags,
                opts.as_ptr().cast(),
            ) != 0
            {
                libc::_exit(123);
            }
        }
        for (from, at, flags) in &n.binds {
            if libc::mount(
                from.as_ptr(),
                at.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) != 0
            {
                libc::_exit(122);
            }
            if *flags != 0
                && libc::mount(
                    std::ptr::null(),
                    at.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REMOUNT | libc::MS_BIND | *flags,
                    std::ptr::null(),
                ) != 0
            {
                libc::_exit(122);
            }
        }
        if let Some(text) = &n.time_offsets {
            if libc::unshare(libc::CLONE_NEWTIME) != 0 {
                libc::_exit(120);
            }
            let fd = libc::open(offsets_file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            let len = text.as_bytes().len();
            if fd < 0
                || usize::try_from(libc::write(fd, text.as_ptr().cast(), len)) != Ok(len)
                || libc::close(fd) != 0
            {
                libc::_exit(119);
            }
            let fd = libc::open(time_ns.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::setns(fd, libc::CLONE_NEWTIME) != 0 {
                libc::_exit(120);
            }
            libc::close(fd);
        }
    }
}

/// Kills a child created by [`spawn_stopped`] and reaps it.
pub fn kill_and_reap(mut t: Tracee) {
    let pid = t.pid();
    t.forget();
    // SAFETY: kill with a pid we created and have not reaped.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = wait_raw(pid);
}

/// Waits until the child is in a stop, skipping nothing else.
pub fn expect_stop(t: &mut Tracee, during: &'static str) -> Result<StopKind> {
    t.wait_stop(during)
}

/// Starts an init process in a new PID namespace: stasis itself, run as
/// `STASIS pidns-init --root ROOT` (the binary is `/proc/self/exe`), which
/// creates the root stub at PID `root` inside the namespace, asleep, and
/// then reaps children until the root exits (with its status). Returns the
/// init's PID and the root stub, seized and stopped, with its
/// `syscall` instruction recorded. Both PIDs are as seen from here.
pub fn spawn_in_new_pidns(root: i32, options: u64) -> Result<(i32, Tracee), SpawnError> {
    use std::ffi::CString;
    let exe = CString::new("/proc/self/exe")
        .map_err(|_| KernelError::io("argv", std::io::Error::other("NUL")))?;
    let args: Vec<CString> = ["stasis", "pidns-init", "--root", &root.to_string()]
        .iter()
        .filter_map(|a| CString::new(*a).ok())
        .collect();
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let args_c = CloneArgs {
        flags: libc::CLONE_NEWPID as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    // SAFETY: clone3 without CLONE_VM duplicates this process like fork; the
    // child only calls execv (async-signal-safe) with argv prepared above,
    // then _exit if that fails.
    let init = unsafe { clone3(&args_c) };
    if init == 0 {
        // SAFETY: child side: exec or leave.
        unsafe {
            libc::execv(exe.as_ptr(), argv.as_ptr());
            libc::_exit(127);
        }
    }
    let init = init_pid(init, root, "clone3(CLONE_NEWPID)")?;
    adopt_root_of(init, root, options)
}

/// Like [`spawn_in_new_pidns`], for a tree whose PID namespace's init was
/// not dumped: the init is created in the new namespaces of `ns` (which
/// must make a PID namespace), sets them up as [`spawn_stopped_in`]'s
/// child does, and then runs `stasis pidns-init --root ROOT`, executed
/// through a descriptor of this binary opened before (its path may not
/// exist under the new mounts), with an empty environment and none of
/// this process's fds. The root stub is at `root` there: the
/// root keeps its PID in its namespace, under a stand-in PID 1. Returns
/// the init's PID and the root stub, seized and stopped with `options`.
/// The init forks the root stub before its exec (with `--adopt`, it only
/// reaps).
pub fn spawn_init_in(root: i32, ns: &NsSetup, options: u64) -> Result<(i32, Tracee), SpawnError> {
    use std::ffi::CString;
    if ns.flags & u64::from(libc::CLONE_NEWPID.unsigned_abs()) == 0 {
        return Err(KernelError::io(
            "starting a stand-in init",
            std::io::Error::other("the new namespaces have no PID namespace"),
        )
        .into());
    }
    let exe = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open("/proc/self/exe")
        .map_err(|e| KernelError::io("opening this program (/proc/self/exe)", e))?;
    let args: Vec<CString> = [
        "stasis",
        "pidns-init",
        "--root",
        &root.to_string(),
        "--adopt",
    ]
    .iter()
    .filter_map(|a| CString::new(*a).ok())
    .collect();
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let tid = [root];
    let root_args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tid.as_ptr() as u64,
        set_tid_size: 1,
        ..Default::default()
    };
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let empty = c"";
    let gate = MapsGate::new(ns.id_maps.as_ref())?;
    let gate_raw = gate.raw();
    let args_c = CloneArgs {
        flags: ns.flags,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    // SAFETY: clone3 without CLONE_VM duplicates this process like fork;
    // the child makes raw syscalls only (the set-up, then execveat with
    // argv and envp prepared above), then _exit if they fail.
    let init = unsafe { clone3(&args_c) };
    if init == 0 {
        // SAFETY: child side: raw syscalls, then exec or leave.
        unsafe {
            set_up_namespaces(ns, gate_raw);
            // The root stub, forked here while this init still has every
            // capability in the new namespaces (an exec as an id other
            // than 0 there would drop them, and set_tid needs them). It
            // sleeps until the restorer takes it over.
            let stub = clone3(&root_args);
            if stub == 0 {
                loop {
                    libc::pause();
                }
            }
            if stub < 0 {
                libc::_exit(126);
            }
            libc::syscall(
                libc::SYS_execveat,
                exe.as_raw_fd(),
                empty.as_ptr(),
                argv.as_ptr(),
                envp.as_ptr(),
                libc::AT_EMPTY_PATH,
            );
            libc::_exit(118);
        }
    }
    // (errno first: closing the descriptor may change it.)
    let init = init_pid(init, root, "clone3 (the new namespaces)");
    drop(exe);
    let init = init?;
    gate.open(init)?;
    adopt_root_of(init, root, options)
}

/// The PID `clone3` returned for a namespace's init (`what`), or its
/// error (`EPERM`: no privilege to make the root `root` there).
fn init_pid(ret: i64, root: i32, what: &'static str) -> Result<i32, SpawnError> {
    if ret < 0 {
        let e = last_err();
        return Err(match e.raw_os_error() {
            Some(libc::EPERM) => SpawnError::NoPermission {
                pid: root,
                source: e,
            },
            _ => SpawnError::Kernel(KernelError::io(what, e)),
        });
    }
    Ok(i32::try_from(ret)
        .map_err(|_| KernelError::io("clone3", std::io::Error::other("pid out of range")))?)
}

/// Waits for the root stub that the init `init` (a child of this process,
/// running `stasis pidns-init --root ROOT`) forks at `root` inside its
/// namespace, and seizes it with `options`, stopped, its `syscall`
/// instruction recorded. Kills and reaps the init on a failure.
fn adopt_root_of(init: i32, root: i32, options: u64) -> Result<(i32, Tracee), SpawnError> {
    let kill_init = || {
        // SAFETY: killing and reaping the init we just started.
        unsafe {
            libc::kill(init, libc::SIGKILL);
            libc::waitpid(init, std::ptr::null_mut(), 0);
        }
    };
    // Wait for the init's child (the root stub) to exist and be stopped.
    let t0 = std::time::Instant::now();
    let stub = loop {
        if let Some(&k) = crate::procfs::task_children(init).first() {
            if crate::procfs::task_state(k, k) == Some('S') {
                break k;
            }
        }
        let mut status = 0;
        // SAFETY: non-blocking wait on our child.
        if unsafe { libc::waitpid(init, &mut status, libc::WNOHANG) } == init {
            return Err(KernelError::Died {
                pid: init,
                how: format!("the PID namespace init {}", describe_exit(status)),
                status,
            }
            .into());
        }
        if t0.elapsed() > std::time::Duration::from_secs(10) {
            kill_init();
            return Err(KernelError::io(
                "starting the PID namespace",
                std::io::Error::other(format!(
                    "its root process (PID {root} there) did not appear"
                )),
            )
            .into());
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    let mut t = match Tracee::seize(stub, options) {
        Ok(t) => t,
        Err(e) => {
            kill_init();
            return Err(e.into());
        }
    };
    let started = (|| -> Result<()> {
        t.interrupt()?;
        let regs = t.regs()?;
        t.set_syscall_insn(regs.rip - 2);
        Ok(())
    })();
    if let Err(e) = started {
        kill_init();
        return Err(e.into());
    }
    Ok((init, t))
}

/// The body of `stasis pidns-init --root ROOT [--adopt]`: PID 1 of a
/// namespace made by [`spawn_in_new_pidns`] or [`spawn_init_in`]. Forks
/// the root stub at `root` (which sleeps in `pause()` until it is taken
/// over; with `adopt`, the stub is there already), then reaps every child
/// until the root exits, and returns the root's exit code (128+signal if
/// it was killed).
pub fn pidns_init(root: i32, adopt: bool) -> i32 {
    let pid = if adopt {
        i64::from(root)
    } else {
        fork_root_stub(root)
    };
    if pid < 0 {
        return 126;
    }
    // Keep nothing of the restorer's (its stdout may be a pipe someone
    // waits on): fds 0-2 on /dev/null, everything else closed.
    // SAFETY: closing our own fds and opening /dev/null on the lowest free ones.
    unsafe {
        libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
        let null = c"/dev/null".as_ptr();
        for _ in 0..3 {
            libc::open(null, libc::O_RDWR);
        }
    }
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid out-pointer.
        let r = unsafe { libc::waitpid(-1, &mut status, 0) };
        if r < 0 {
            if last_err().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return 0;
        }
        if i64::from(r) == pid {
            if libc::WIFEXITED(status) {
                return libc::WEXITSTATUS(status);
            }
            if libc::WIFSIGNALED(status) {
                return 128 + libc::WTERMSIG(status);
            }
        }
    }
}

/// Forks the root stub at `root` (it sleeps in `pause()` until taken
/// over): its PID, or -1.
fn fork_root_stub(root: i32) -> i64 {
    let tid = [root];
    let args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tid.as_ptr() as u64,
        set_tid_size: 1,
        ..Default::default()
    };
    // SAFETY: a fork-like clone3 of this single-threaded process; the child
    // only stops itself until the restorer takes it over and replaces its
    // whole state.
    let pid = unsafe { clone3(&args) };
    if pid == 0 {
        // Sleep until taken over (no job-control stop: that would outlive
        // the tracer's detach).
        loop {
            // SAFETY: a raw syscall only, in the child.
            unsafe { libc::pause() };
        }
    }
    pid
}

/// Every task (thread) of process `pid` now, the process itself first.
fn tasks_of(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        out.extend(
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
                .filter(|&t| t != pid),
        );
    }
    out
}

/// Kills the processes `pids` (SIGKILL to each) and reaps every task of
/// them that this process has to reap: its children, and every thread and
/// process it traces. A traced thread that dies stays a zombie until its
/// tracer waits for it, and its thread-group leader cannot be reaped
/// before, so waiting only for a leader can wait forever; this waits for
/// each task, polling, and at most `timeout`. Returns the tasks still
/// present then (none, unless the kernel or a late reaper is slow: a
/// killed process whose parent is not this one is reaped by that parent,
/// or by the nearest subreaper, see [`Subreaper`]).
pub fn kill_and_reap_all(pids: &[i32], timeout: std::time::Duration) -> Vec<i32> {
    let mut left: Vec<i32> = pids
        .iter()
        .filter(|&&p| p > 0)
        .flat_map(|&p| tasks_of(p))
        .collect();
    left.sort_unstable();
    left.dedup();
    for &p in pids.iter().filter(|&&p| p > 0) {
        // SAFETY: kill with a pid of a process this restorer created and
        // still traces or waits for (not reaped yet).
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    let t0 = std::time::Instant::now();
    loop {
        left.retain(|&t| {
            let mut status = 0i32;
            // SAFETY: a non-blocking waitpid with a valid out-pointer; it
            // only reaps a task that is our child or our tracee.
            unsafe { libc::waitpid(t, &mut status, libc::WNOHANG | libc::__WALL) };
            std::path::Path::new(&format!("/proc/{t}")).exists()
        });
        if left.is_empty() || t0.elapsed() >= timeout {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Makes this process a child subreaper while it lives (orphaned
/// descendants are re-parented to it, so it can reap a killed tree at
/// once instead of leaving zombies to a late init), and puts the previous
/// setting back when dropped.
#[derive(Debug)]
pub struct Subreaper {
    was: bool,
}

impl Subreaper {
    pub fn enable() -> Subreaper {
        let mut cur: libc::c_int = 0;
        // SAFETY: PR_GET_CHILD_SUBREAPER writes an int through the pointer,
        // which is valid for the call; PR_SET_CHILD_SUBREAPER takes an
        // integer.
        let was = unsafe {
            libc::prctl(
                libc::PR_GET_CHILD_SUBREAPER,
                &mut cur as *mut libc::c_int,
                0,
                0,
                0,
            ) == 0
                && cur != 0
        };
        if !was {
            // SAFETY: prctl with integer arguments.
            unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        }
        Subreaper { was }
    }
}

impl Drop for Subreaper {
    fn drop(&mut self) {
        if !self.was {
            // SAFETY: prctl with integer arguments.
            unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) };
        }
    }
}

/// Reaps every thread of process `pid` other than its leader that has
/// died and is waiting as a zombie for this process (its tracer). Returns
/// how many were reaped.
///
/// A traced thread that dies stays a zombie until its tracer waits for
/// it, and until then the leader's own exit is not reported: a tracer
/// blocked waiting for the leader of a process killed from outside (the
/// OOM killer, `kill -9`, a lazy restore's filler that found a damaged
/// page) would wait forever. Calling this from another thread of the
/// tracer, periodically, breaks that wait (the leader's exit is then
/// reported to it).
pub fn reap_dead_threads(pid: i32) -> usize {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    let mut n = 0;
    for tid in rd
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|&t| t != pid)
    {
        if !matches!(crate::procfs::task_state(pid, tid), Some('Z' | 'X')) {
            continue;
        }
        let mut status = 0i32;
        // SAFETY: a non-blocking waitpid with a valid out-pointer for one
        // thread that is already dead; it only reaps our own tracee.
        if unsafe { libc::waitpid(tid, &mut status, libc::WNOHANG | libc::__WALL) } == tid {
            n += 1;
        }
    }
    n
}
