//! Namespaces: which ones a process has (by kind, against this process's),
//! running a piece of work inside another process's namespace (on a
//! thread of its own, which `setns` moves), and the loopback interface of
//! a network namespace.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::sched::CloneFlags;

use crate::{KernelError, Result};

/// The kinds of namespace, by their name under `/proc/PID/ns/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NsKind {
    Pid,
    Mnt,
    Net,
    Uts,
    Ipc,
    User,
    Cgroup,
    Time,
}

impl NsKind {
    /// Every kind, in the order the checks report them.
    pub const ALL: [NsKind; 8] = [
        NsKind::Pid,
        NsKind::Mnt,
        NsKind::Net,
        NsKind::Uts,
        NsKind::Ipc,
        NsKind::User,
        NsKind::Cgroup,
        NsKind::Time,
    ];

    /// Its name under `/proc/PID/ns/` (and in messages).
    pub fn name(self) -> &'static str {
        match self {
            NsKind::Pid => "pid",
            NsKind::Mnt => "mnt",
            NsKind::Net => "net",
            NsKind::Uts => "uts",
            NsKind::Ipc => "ipc",
            NsKind::User => "user",
            NsKind::Cgroup => "cgroup",
            NsKind::Time => "time",
        }
    }

    /// Its `CLONE_NEW*` flag.
    pub fn clone_flag(self) -> u64 {
        let f = match self {
            NsKind::Pid => libc::CLONE_NEWPID,
            NsKind::Mnt => libc::CLONE_NEWNS,
            NsKind::Net => libc::CLONE_NEWNET,
            NsKind::Uts => libc::CLONE_NEWUTS,
            NsKind::Ipc => libc::CLONE_NEWIPC,
            NsKind::User => libc::CLONE_NEWUSER,
            NsKind::Cgroup => libc::CLONE_NEWCGROUP,
            NsKind::Time => 0x80,
        };
        u64::from(f.unsigned_abs())
    }
}

/// The namespace of kind `kind` process `pid` is in, as the inode of
/// `/proc/PID/ns/KIND` (`None` if the process is gone, or the kernel lacks
/// the kind).
pub fn ns_id(pid: i32, kind: NsKind) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/{}", kind.name()))
        .ok()
        .map(|m| m.ino())
}

/// This process's namespace of kind `kind`, as it was the first time this
/// was asked (a thread of it may since have entered another one with
/// [`NetnsGuard`]).
pub fn own_ns_id(kind: NsKind) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    static OWN: std::sync::OnceLock<Vec<Option<u64>>> = std::sync::OnceLock::new();
    let own = OWN.get_or_init(|| {
        NsKind::ALL
            .iter()
            .map(|k| {
                std::fs::metadata(format!("/proc/self/ns/{}", k.name()))
                    .ok()
                    .map(|m| m.ino())
            })
            .collect()
    });
    NsKind::ALL
        .iter()
        .position(|&k| k == kind)
        .and_then(|i| own.get(i).copied().flatten())
}

/// The calling thread moved into the network namespace of another
/// process, until dropped (it then goes back to the one it had): sockets
/// it creates meanwhile, sock_diag queries included, are of that
/// namespace.
#[derive(Debug)]
pub struct NetnsGuard {
    back: OwnedFd,
}

/// The network namespace this process works in: the one of the first
/// thread that asked (every thread starts in it; only a [`NetnsGuard`]
/// moves one elsewhere, and it asks first).
fn home_net() -> Result<&'static OwnedFd> {
    static HOME: std::sync::OnceLock<Option<OwnedFd>> = std::sync::OnceLock::new();
    HOME.get_or_init(|| {
        std::fs::File::open("/proc/thread-self/ns/net")
            .ok()
            .map(OwnedFd::from)
    })
    .as_ref()
    .ok_or_else(|| {
        KernelError::io(
            "open /proc/thread-self/ns/net",
            std::io::Error::other("this process's own network namespace cannot be opened"),
        )
    })
}

/// Runs `f` on a thread of its own in this process's own network
/// namespace (the dumper's or restorer's), whichever namespace the calling
/// thread is in.
pub fn in_home_net<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T> {
    in_net(home_net()?, f)
}

/// Runs `f` on a thread of its own in the network namespace `ns` (an fd
/// on one: [`open_net_of`]).
pub fn in_net<T: Send>(ns: &OwnedFd, f: impl FnOnce() -> T + Send) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(move || -> Result<T> {
            nix::sched::setns(ns, CloneFlags::CLONE_NEWNET).map_err(|e| {
                KernelError::io(
                    "setns",
                    std::io::Error::other(format!("entering a network namespace: {e}")),
                )
            })?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| {
            Err(KernelError::io(
                "setns",
                std::io::Error::other("the thread working in another network namespace panicked"),
            ))
        })
    })
}

/// An fd on the network namespace of process `pid`.
pub fn open_net_of(pid: i32) -> Result<OwnedFd> {
    std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map(OwnedFd::from)
        .map_err(|e| KernelError::io(format!("open /proc/{pid}/ns/net"), e))
}

impl NetnsGuard {
    /// Moves the calling thread into the network namespace of `pid`.
    pub fn enter(pid: i32) -> Result<NetnsGuard> {
        // Known before any thread leaves it.
        home_net()?;
        let open = |p: String| {
            std::fs::File::open(&p)
                .map(OwnedFd::from)
                .map_err(|e| KernelError::io("open", e))
        };
        let back = open("/proc/thread-self/ns/net".into())?;
        let target = open(format!("/proc/{pid}/ns/net"))?;
        nix::sched::setns(&target, CloneFlags::CLONE_NEWNET).map_err(|e| {
            KernelError::io(
                "setns",
                std::io::Error::other(format!(
                    "entering the network namespace of process {pid}: {e}"
                )),
            )
        })?;
        Ok(NetnsGuard { back })
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        // Going back to a namespace this thread was in, by an fd held on
        // it, needs nothing that can have changed since.
        let _ = nix::sched::setns(&self.back, CloneFlags::CLONE_NEWNET);
    }
}

/// Runs `f` on a thread of its own moved into the namespaces of `kinds` of
/// process `pid`, and returns what it returns. Not `User` (a
/// multithreaded process cannot enter one); `Mnt` is entered after the
/// thread has unshared its file system attributes (`CLONE_FS`: root and
/// working directory, which `setns` resets to the namespace's root), as
/// the kernel wants them to be the thread's alone.
pub fn in_namespaces_of<T: Send>(
    pid: i32,
    kinds: &[NsKind],
    f: impl FnOnce() -> T + Send,
) -> Result<T> {
    let mut fds: Vec<(OwnedFd, NsKind)> = Vec::new();
    for &k in kinds {
        if k == NsKind::User {
            return Err(KernelError::io(
                "setns",
                std::io::Error::other("a thread cannot enter a user namespace alone"),
            ));
        }
        let path = format!("/proc/{pid}/ns/{}", k.name());
        let file = std::fs::File::open(&path).map_err(|e| KernelError::io("open", e))?;
        fds.push((file.into(), k));
    }
    std::thread::scope(|s| {
        s.spawn(move || -> Result<T> {
            if fds.iter().any(|(_, k)| *k == NsKind::Mnt) {
                nix::sched::unshare(CloneFlags::CLONE_FS).map_err(|e| {
                    KernelError::io(
                        "unshare",
                        std::io::Error::other(format!(
                            "unsharing the file system attributes of a thread to enter a mount namespace: {e}"
                        )),
                    )
                })?;
            }
            for (fd, k) in &fds {
                let flag =
                    CloneFlags::from_bits_truncate(i32::try_from(k.clone_flag()).unwrap_or(0));
                nix::sched::setns(fd, flag).map_err(|e| {
                    KernelError::io(
                        "setns",
                        std::io::Error::other(format!(
                            "entering the {} namespace of process {pid}: {e}",
                            k.name()
                        )),
                    )
                })?;
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| {
            Err(KernelError::io(
                "setns",
                std::io::Error::other("the thread working in another namespace panicked"),
            ))
        })
    })
}

/// Runs `f` on a thread of its own whose file system ids are `uid` and
/// `gid` (files it creates are theirs: a tmpfs of a user namespace takes
/// only ids mapped there), its effective capabilities raised back to its
/// permitted ones (a change of fsuid away from 0 drops the file ones).
pub fn as_fs_ids<T: Send>(uid: u32, gid: u32, f: impl FnOnce() -> T + Send) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(move || -> Result<T> {
            // SAFETY: setfsgid/setfsuid take integers and change only this
            // thread's ids (the raw syscalls; glibc does not broadcast them).
            unsafe {
                libc::syscall(libc::SYS_setfsgid, gid);
                libc::syscall(libc::SYS_setfsuid, uid);
            }
            let mut hdr = [stasis_sys::prctl::LINUX_CAPABILITY_VERSION_3, 0u32];
            let mut data = [0u32; 6];
            // SAFETY: capget writes two `__user_cap_data_struct` (3 words
            // each) into `data`, for the calling thread (pid 0 in `hdr`).
            if unsafe { libc::syscall(libc::SYS_capget, hdr.as_mut_ptr(), data.as_mut_ptr()) } != 0
            {
                return Err(KernelError::io("capget", crate::last_err()));
            }
            // effective = permitted, word by word.
            data[0] = data[1];
            data[3] = data[4];
            // SAFETY: capset reads the header and two data structs, as above.
            if unsafe { libc::syscall(libc::SYS_capset, hdr.as_mut_ptr(), data.as_ptr()) } != 0 {
                return Err(KernelError::io("capset", crate::last_err()));
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| {
            Err(KernelError::io(
                "setfsuid",
                std::io::Error::other("the thread working with other file system ids panicked"),
            ))
        })
    })
}

/// `mount(2)` in the calling thread's mount namespace (`fstype` and
/// `data` may be absent, as for a bind or a remount).
pub fn mount(
    source: &str,
    target: &str,
    fstype: Option<&str>,
    flags: u64,
    data: Option<&str>,
) -> std::io::Result<()> {
    use std::ffi::CString;
    let c = |s: &str| CString::new(s).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL));
    let (src, dst) = (c(source)?, c(target)?);
    let fstype = fstype.map(c).transpose()?;
    let data = data.map(c).transpose()?;
    // SAFETY: every pointer is null or a NUL-terminated string alive for
    // the call.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            fstype.as_ref().map_or(std::ptr::null(), |f| f.as_ptr()),
            flags,
            data.as_ref()
                .map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Mounts a proc of PID namespace `pidns` (an fd on an `ns/pid` file) on
/// `target` in the calling thread's mount namespace, whatever its own PID
/// namespace (the kernel's `pidns` option, by fd: `fsopen`, `fsconfig`,
/// `fsmount`, `move_mount`), with `source`, the per-mount `MS_*` `flags`
/// and the file system's `options` (`hidepid=`, `subset=`...).
pub fn mount_proc_of(
    pidns: std::os::fd::BorrowedFd<'_>,
    source: &str,
    target: &str,
    flags: u64,
    options: &str,
) -> std::io::Result<()> {
    use stasis_sys::mount as sm;
    use std::ffi::CString;
    use std::os::fd::FromRawFd;
    let c = |s: &str| CString::new(s).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL));
    let check = |r: libc::c_long| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r)
        }
    };
    let proc_name = c("proc")?;
    // SAFETY: fsopen with a NUL-terminated name; the fd it returns is ours.
    let fs =
        check(unsafe { libc::syscall(sm::SYS_FSOPEN, proc_name.as_ptr(), sm::FSOPEN_CLOEXEC) })?;
    let fs = i32::try_from(fs).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: `fs` was just returned by fsopen and is owned by nobody else.
    let fs = unsafe { OwnedFd::from_raw_fd(fs) };
    let config = |cmd: u32, key: Option<&CString>, value: Option<&CString>, aux: i32| {
        // SAFETY: fsconfig on our fs context fd with NUL-terminated
        // strings (or null) alive for the call.
        check(unsafe {
            libc::syscall(
                sm::SYS_FSCONFIG,
                fs.as_raw_fd(),
                cmd,
                key.map_or(std::ptr::null(), |k| k.as_ptr()),
                value.map_or(std::ptr::null(), |v| v.as_ptr()),
                aux,
            )
        })
    };
    config(
        sm::FSCONFIG_SET_FD,
        Some(&c("pidns")?),
        None,
        pidns.as_raw_fd(),
    )?;
    config(
        sm::FSCONFIG_SET_STRING,
        Some(&c("source")?),
        Some(&c(source)?),
        0,
    )?;
    for o in options.split(',').filter(|o| !o.is_empty()) {
        match o.split_once('=') {
            Some((k, v)) => config(sm::FSCONFIG_SET_STRING, Some(&c(k)?), Some(&c(v)?), 0)?,
            None => config(sm::FSCONFIG_SET_FLAG, Some(&c(o)?), None, 0)?,
        };
    }
    config(sm::FSCONFIG_CMD_CREATE, None, None, 0)?;
    let attrs = [
        (libc::MS_RDONLY, sm::MOUNT_ATTR_RDONLY),
        (libc::MS_NOSUID, sm::MOUNT_ATTR_NOSUID),
        (libc::MS_NODEV, sm::MOUNT_ATTR_NODEV),
        (libc::MS_NOEXEC, sm::MOUNT_ATTR_NOEXEC),
        (libc::MS_NOATIME, sm::MOUNT_ATTR_NOATIME),
        (libc::MS_STRICTATIME, sm::MOUNT_ATTR_STRICTATIME),
        (libc::MS_NODIRATIME, sm::MOUNT_ATTR_NODIRATIME),
    ]
    .iter()
    .filter(|(ms, _)| flags & ms != 0)
    .fold(0, |a, (_, at)| a | at);
    // SAFETY: fsmount of our created context; the fd it returns is ours.
    let m = check(unsafe {
        libc::syscall(sm::SYS_FSMOUNT, fs.as_raw_fd(), sm::FSMOUNT_CLOEXEC, attrs)
    })?;
    let m = i32::try_from(m).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: `m` was just returned by fsmount and is owned by nobody else.
    let m = unsafe { OwnedFd::from_raw_fd(m) };
    let (empty, dst) = (c("")?, c(target)?);
    // SAFETY: move_mount of our detached mount fd onto a NUL-terminated
    // path alive for the call.
    check(unsafe {
        libc::syscall(
            sm::SYS_MOVE_MOUNT,
            m.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            sm::MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// Makes directory `dir` (a mount point) the root of the calling thread's
/// mount namespace, as runc does: `pivot_root(".", ".")` from it, then the
/// old root, left on top, detached. Every process whose root or working
/// directory was the old root has it there (the calling thread, with its
/// file system attributes unshared, too); the thread ends in `/`.
pub fn pivot_root_into(dir: &str) -> std::io::Result<()> {
    std::env::set_current_dir(dir)?;
    let dot = c".";
    // SAFETY: both pointers are a NUL-terminated string alive for the call.
    let r = unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the pointer is a NUL-terminated string alive for the call.
    let r = unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    std::env::set_current_dir("/")
}

/// A datagram socket of the calling thread's network namespace, and the
/// request for `lo`.
fn lo_request() -> Result<(OwnedFd, stasis_sys::net::IfreqFlags)> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| KernelError::io("socket", e.into()))?;
    let mut req = stasis_sys::net::IfreqFlags::default();
    req.name[..2].copy_from_slice(b"lo");
    Ok((sock, req))
}

/// Whether the loopback interface of the calling thread's network
/// namespace is up.
pub fn loopback_up() -> Result<bool> {
    let (sock, mut req) = lo_request()?;
    // SAFETY: SIOCGIFFLAGS reads the name and writes the flags of a
    // `struct ifreq`, which `req` is (its layout checked in stasis-sys), valid for
    // the call.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) };
    if r < 0 {
        return Err(KernelError::io("SIOCGIFFLAGS lo", crate::last_err()));
    }
    Ok(req.flags & i16::try_from(libc::IFF_UP).unwrap_or(1) != 0)
}

/// Brings the loopback interface of the calling thread's network
/// namespace up.
pub fn set_loopback_up() -> Result<()> {
    let (sock, mut req) = lo_request()?;
    // SAFETY: as in `loopback_up`.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) };
    if r < 0 {
        return Err(KernelError::io("SIOCGIFFLAGS lo", crate::last_err()));
    }
    req.flags |= i16::try_from(libc::IFF_UP | libc::IFF_RUNNING).unwrap_or(1);
    // SAFETY: SIOCSIFFLAGS reads the name and flags of `req`, a valid
    // `struct ifreq` for the call.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    if r < 0 {
        return Err(KernelError::io("SIOCSIFFLAGS lo", crate::last_err()));
    }
    Ok(())
}

/// The time namespace the children process `pid` makes from now on will
/// be in (`/proc/PID/ns/time_for_children`, as an inode): another than its
/// own once it has unshared one (`CLONE_NEWTIME`) that no process has
/// entered yet.
pub fn time_for_children_id(pid: i32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/time_for_children"))
        .ok()
        .map(|m| m.ino())
}

/// The `CLOCK_MONOTONIC` and `CLOCK_BOOTTIME` offsets of a time namespace
/// against the host's clocks, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockOffsets {
    pub monotonic: i64,
    pub boottime: i64,
}

const NSEC: i64 = 1_000_000_000;

/// Parses a `timens_offsets` file (`monotonic SEC NSEC` and `boottime SEC
/// NSEC` lines; a clock not listed has no offset).
pub fn parse_timens_offsets(text: &str) -> Option<ClockOffsets> {
    let mut o = ClockOffsets::default();
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let [name, sec, nsec] = f.as_slice() else {
            return None;
        };
        let v = sec
            .parse::<i64>()
            .ok()?
            .checked_mul(NSEC)?
            .checked_add(nsec.parse::<i64>().ok().filter(|n| (0..NSEC).contains(n))?)?;
        match *name {
            "monotonic" | "1" => o.monotonic = v,
            "boottime" | "7" => o.boottime = v,
            _ => return None,
        }
    }
    Some(o)
}

/// The clock offsets of the time namespace process `pid` makes its
/// children in (`/proc/PID/timens_offsets`; `None`: `/proc/self`'s).
pub fn timens_offsets(pid: Option<i32>) -> Result<ClockOffsets> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/timens_offsets"),
        None => "/proc/self/timens_offsets".into(),
    };
    let text = std::fs::read_to_string(&path).map_err(|e| KernelError::io(&path, e))?;
    parse_timens_offsets(&text).ok_or_else(|| {
        KernelError::io(
            &path,
            std::io::Error::other(format!("unexpected content {text:?}")),
        )
    })
}

/// Sets the clock offsets of the time namespace process `pid` makes its
/// children in (one it unshared, that no process has entered yet: the
/// kernel refuses them once one has), through `/proc/PID/timens_offsets`.
pub fn set_timens_offsets(pid: i32, o: ClockOffsets) -> Result<()> {
    let path = format!("/proc/{pid}/timens_offsets");
    std::fs::write(&path, timens_offsets_text(o)).map_err(|e| KernelError::io(&path, e))
}

/// Clock `id` of the calling thread, in nanoseconds.
fn clock_ns(id: libc::clockid_t) -> Result<i64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one `struct timespec` through the
    // pointer, valid for the call.
    if unsafe { libc::clock_gettime(id, &mut ts) } != 0 {
        return Err(KernelError::io("clock_gettime", crate::last_err()));
    }
    Ok(ts.tv_sec * NSEC + ts.tv_nsec)
}

/// The host's `CLOCK_MONOTONIC` and `CLOCK_BOOTTIME` now: this process's
/// clocks less the offsets of its own time namespace (none in the
/// initial one). Refused if this process has unshared a time namespace it
/// is not in (its `timens_offsets` are not its own clocks').
pub fn host_clocks() -> Result<ClockOffsets> {
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    if ns_id(me, NsKind::Time) != time_for_children_id(me) {
        return Err(KernelError::io(
            "/proc/self/ns/time_for_children",
            std::io::Error::other(
                "this process makes its children in another time namespace than its own: its clock offsets cannot be read",
            ),
        ));
    }
    let own = timens_offsets(None)?;
    let monotonic = clock_ns(libc::CLOCK_MONOTONIC)?;
    let boottime = clock_ns(libc::CLOCK_BOOTTIME)?;
    Ok(ClockOffsets {
        monotonic: monotonic - own.monotonic,
        boottime: boottime - own.boottime,
    })
}

/// The text written to `timens_offsets` to set `o` (clock ids 1 and 7:
/// every kernel with time namespaces takes them; nanoseconds in 0..1e9).
pub fn timens_offsets_text(o: ClockOffsets) -> String {
    let line = |id: i32, v: i64| format!("{id} {} {}\n", v.div_euclid(NSEC), v.rem_euclid(NSEC));
    line(libc::CLOCK_MONOTONIC, o.monotonic) + &line(libc::CLOCK_BOOTTIME, o.boottime)
}

/// The PID of process (or thread) `tid` in its own PID namespace: the last
/// field of `NSpid` in its `status` (`None` if it is gone).
pub fn pid_in_own_ns(pid: i32, tid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    parse_nspid(&status)
}

/// The last field of the `NSpid:` line of a `status` file.
pub fn parse_nspid(status: &str) -> Option<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_is_the_innermost() {
        assert_eq!(parse_nspid("Name:\tx\nNSpid:\t1589\t1\nX: 2\n"), Some(1));
        assert_eq!(parse_nspid("NSpid:\t42\n"), Some(42));
        assert_eq!(parse_nspid("Pid:\t42\n"), None);
    }

    #[test]
    fn timens_offsets_parse_and_print_back() {
        let o = parse_timens_offsets(
            "monotonic    86400000         0\nboottime          -7 999999999\n",
        )
        .unwrap();
        assert_eq!(o.monotonic, 86_400_000 * NSEC);
        assert_eq!(o.boottime, -7 * NSEC + 999_999_999);
        assert_eq!(timens_offsets_text(o), "1 86400000 0\n7 -7 999999999\n");
        // A negative offset that is not whole seconds: the nanoseconds stay
        // in 0..1e9, the seconds below.
        let t = timens_offsets_text(ClockOffsets {
            monotonic: -1,
            boottime: -NSEC,
        });
        assert_eq!(t, "1 -1 999999999\n7 -1 0\n");
        assert_eq!(
            parse_timens_offsets(&t),
            Some(ClockOffsets {
                monotonic: -1,
                boottime: -NSEC
            })
        );
        assert_eq!(parse_timens_offsets("monotonic 1 1000000000\n"), None);
        assert_eq!(parse_timens_offsets("realtime 1 0\n"), None);
        assert_eq!(parse_timens_offsets(""), Some(ClockOffsets::default()));
    }

    #[test]
    fn the_host_clocks_are_this_process_s_less_its_offsets() {
        let own = timens_offsets(None).unwrap();
        let before = clock_ns(libc::CLOCK_MONOTONIC).unwrap();
        let host = host_clocks().unwrap();
        let after = clock_ns(libc::CLOCK_MONOTONIC).unwrap();
        assert!(host.monotonic + own.monotonic >= before);
        assert!(host.monotonic + own.monotonic <= after);
        assert!(host.boottime >= host.monotonic);
    }

    #[test]
    fn a_thread_enters_another_mount_namespace() {
        // A child in a mount namespace of its own, with a tmpfs on /mnt
        // holding a file; seen only from inside it.
        let mut child = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("mount -t tmpfs stasis-k /mnt && touch /mnt/stasis-ns-k && exec sleep 100")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let found = (0..500).any(|_| {
            let sleeping = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "sleep");
            if !sleeping {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            sleeping
        });
        let inside = in_namespaces_of(pid, &[NsKind::Mnt], || {
            std::path::Path::new("/mnt/stasis-ns-k").exists()
        });
        let _ = child.kill();
        let _ = child.wait();
        assert!(found, "the child did not set up its mount");
        assert!(inside.unwrap());
        assert!(!std::path::Path::new("/mnt/stasis-ns-k").exists());
    }

    #[test]
    fn this_process_is_in_its_own_namespaces() {
        let me = i32::try_from(std::process::id()).unwrap_or(0);
        for k in NsKind::ALL {
            assert_eq!(ns_id(me, k), own_ns_id(k), "{}", k.name());
        }
        assert_eq!(pid_in_own_ns(me, me), Some(me));
    }
}
