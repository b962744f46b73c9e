//! File descriptors: what each one is, which ones share an open file
//! description (across the tree), and the data sitting in pipes.
//!
//! Sharing is found by `kcmp(KCMP_FILE)` among fds whose targets have the
//! same device and inode (a cheap pre-filter: anonymous inodes all share one
//! inode, so `kcmp` has the last word). Pipe contents are copied with
//! `tee(2)` from a read end taken out of the process with `pidfd_getfd` (or
//! reopened through `/proc/PID/fd/N` when the process only holds the write
//! end), so the data stays in the pipe.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};

use stasis_image::manifest::{EpollTarget, FdImage, FdKind, PipeImage};
use stasis_kernel::pidfd;

use crate::{proc, CaptureError, Result};

/// The largest pipe stasis can recreate without CAP_SYS_RESOURCE.
const PIPE_MAX: usize = 1 << 20;

/// Why an fd cannot be checkpointed, or `None` if its kind is known.
pub fn unsupported_reason(pid: i32, fd: i32, link: &str) -> Option<String> {
    let kind = if link.starts_with("socket:") {
        Some("a socket")
    } else if link.starts_with("anon_inode:")
        && ![
            "anon_inode:[eventfd]",
            "anon_inode:[timerfd]",
            "anon_inode:[signalfd]",
            "anon_inode:[eventpoll]",
        ]
        .contains(&link)
    {
        Some("an anonymous inode of a kind stasis does not know (userfaultfd, io_uring, pidfd, inotify...)")
    } else if link.starts_with("/dev/pts/")
        || link.starts_with("/dev/tty")
        || link == "/dev/console"
        || link.starts_with("/dev/ptmx")
    {
        Some("a terminal")
    } else if link.ends_with(" (deleted)") {
        Some("a deleted file")
    } else if link.starts_with("pipe:") || link.starts_with("anon_inode:") {
        None
    } else if !link.starts_with('/') {
        Some("a special file")
    } else {
        None
    };
    if let Some(k) = kind {
        let hint = if k == "a terminal" {
            "; redirect the program's stdin/stdout/stderr to files (or /dev/null) to checkpoint it"
        } else {
            ""
        };
        return Some(format!(
            "fd {fd} is {k} ({link}), which this version of stasis cannot checkpoint yet{hint}"
        ));
    }
    if link.starts_with('/') {
        match std::fs::metadata(format!("/proc/{pid}/fd/{fd}")) {
            Ok(m) => {
                let ft = m.file_type();
                if !(ft.is_file() || ft.is_dir() || ft.is_char_device() || ft.is_fifo()) {
                    return Some(format!("fd {fd} ({link}) is a block device or special file, which this version of stasis cannot checkpoint yet"));
                }
            }
            Err(e) => return Some(format!("fd {fd} ({link}): {e}")),
        }
    }
    None
}

/// Lists the fd numbers of `pid`.
pub fn list_fds(pid: i32) -> Result<Vec<i32>> {
    let rd = std::fs::read_dir(proc::proc_path(pid, "fd"))
        .map_err(|e| CaptureError::from_proc(pid, "fd", e))?;
    let mut fds: Vec<i32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    Ok(fds)
}

/// Collects the fds of every process of a dump.
#[derive(Default)]
pub struct FdCollector {
    /// (pid, fd, dev, ino, index of the process, index in its fd list).
    seen: Vec<(i32, i32, u64, u64, usize, usize)>,
    /// Per process, in dump order.
    pub tables: Vec<Vec<FdImage>>,
    next_shared: u32,
    /// Pipe contents by pipe inode.
    pub pipes: HashMap<u64, PipeImage>,
}

fn kcmp_same_file(pid1: i32, fd1: i32, pid2: i32, fd2: i32) -> bool {
    const KCMP_FILE: i32 = 0;
    // SAFETY: kcmp takes integers only.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid1, pid2, KCMP_FILE, fd1, fd2) };
    r == 0
}

impl FdCollector {
    /// Records every fd of process `pid` (the `index`-th of the dump).
    pub fn add_process(&mut self, pid: i32) -> Result<()> {
        let index = self.tables.len();
        let mut table: Vec<FdImage> = Vec::new();
        for fd in list_fds(pid)? {
            let link = proc::read_link(pid, &format!("fd/{fd}"))?;
            if let Some(what) = unsupported_reason(pid, fd, &link) {
                return Err(CaptureError::Unsupported { pid, what });
            }
            let info_name = format!("fdinfo/{fd}");
            let info = proc::read(pid, &info_name)?;
            let fmt = |w: String| CaptureError::ProcFormat {
                pid,
                file: info_name.clone(),
                what: w,
            };
            let (pos, flags) = proc::parse_fdinfo(&info).map_err(fmt)?;
            let meta = std::fs::metadata(proc::proc_path(pid, &format!("fd/{fd}")))
                .map_err(|e| CaptureError::from_proc(pid, &format!("fd/{fd}"), e))?;
            let kind = match link.as_str() {
                l if l.starts_with("pipe:") => {
                    self.capture_pipe(pid, fd, flags, meta.ino())?;
                    FdKind::Pipe {
                        id: meta.ino(),
                        write_end: flags & libc::O_ACCMODE.unsigned_abs()
                            == libc::O_WRONLY.unsigned_abs(),
                    }
                }
                "anon_inode:[eventfd]" => {
                    let (count, semaphore) = proc::parse_eventfd(&info).map_err(fmt)?;
                    FdKind::Eventfd { count, semaphore }
                }
                "anon_inode:[timerfd]" => {
                    let (clockid, ticks, value_ns, interval_ns) =
                        proc::parse_timerfd(&info).map_err(fmt)?;
                    FdKind::Timerfd {
                        clockid,
                        value_ns,
                        interval_ns,
                        ticks,
                    }
                }
                "anon_inode:[signalfd]" => FdKind::Signalfd {
                    mask: proc::parse_signalfd(&info).map_err(fmt)?,
                },
                "anon_inode:[eventpoll]" => FdKind::Epoll {
                    targets: proc::parse_epoll(&info)
                        .map_err(fmt)?
                        .into_iter()
                        .map(|(fd, events, data)| EpollTarget { fd, events, data })
                        .collect(),
                },
                _ if meta.file_type().is_fifo() => {
                    self.capture_pipe(pid, fd, flags, meta.ino())?;
                    FdKind::Fifo {
                        path: link.clone(),
                        id: meta.ino(),
                    }
                }
                _ => FdKind::Path {
                    path: link.clone(),
                    pos,
                    mode: meta.mode(),
                    size: meta.size(),
                },
            };
            let cloexec = flags & libc::O_CLOEXEC.unsigned_abs() != 0;
            let mut img = FdImage {
                fd,
                flags: flags & !libc::O_CLOEXEC.unsigned_abs(),
                cloexec,
                kind,
                shared_id: None,
            };
            // Same open file description as an fd seen before?
            let twin = self
                .seen
                .iter()
                .find(|(p, f, dev, ino, _, _)| {
                    *dev == meta.dev() && *ino == meta.ino() && kcmp_same_file(*p, *f, pid, fd)
                })
                .map(|&(_, _, _, _, pi, fi)| (pi, fi));
            if let Some((pi, fi)) = twin {
                let existing = if pi == index {
                    table[fi].shared_id
                } else {
                    self.tables[pi][fi].shared_id
                };
                let id = existing.unwrap_or_else(|| {
                    self.next_shared += 1;
                    self.next_shared
                });
                if pi == index {
                    table[fi].shared_id = Some(id);
                } else {
                    self.tables[pi][fi].shared_id = Some(id);
                }
                img.shared_id = Some(id);
            }
            self.seen
                .push((pid, fd, meta.dev(), meta.ino(), index, table.len()));
            table.push(img);
        }
        self.tables.push(table);
        Ok(())
    }

    /// Refuses pipes with an end held outside the tree (a shell pipeline
    /// around the dumped program, say): that process would lose its peer.
    pub fn check_external_pipes(&self, tree: &[i32]) -> Result<()> {
        let mut ends: HashMap<u64, (bool, bool)> = HashMap::new();
        for t in &self.tables {
            for f in t {
                if let FdKind::Pipe { id, write_end } = f.kind {
                    let e = ends.entry(id).or_default();
                    if write_end {
                        e.1 = true;
                    } else {
                        e.0 = true;
                    }
                }
            }
        }
        let half: Vec<u64> = ends
            .iter()
            .filter(|(_, (r, w))| !(*r && *w))
            .map(|(id, _)| *id)
            .collect();
        if half.is_empty() {
            return Ok(());
        }
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return Ok(());
        };
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|x| x.parse::<i32>().ok()) else {
                continue;
            };
            if tree.contains(&pid) || pid == std::process::id() as i32 {
                continue;
            }
            let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
                continue;
            };
            for fd in fds.flatten() {
                let Ok(link) = std::fs::read_link(fd.path()) else {
                    continue;
                };
                let link = link.to_string_lossy();
                if let Some(id) = half.iter().find(|id| link == format!("pipe:[{id}]")) {
                    let holder = self
                        .seen
                        .iter()
                        .find(|s| s.3 == *id)
                        .map_or(tree[0], |s| s.0);
                    return Err(CaptureError::Unsupported {
                        pid: holder,
                        what: format!("it shares pipe:[{id}] with process {pid}, which is outside the dumped tree (dump their common ancestor, or redirect the program's input/output to files)"),
                    });
                }
            }
        }
        Ok(())
    }

    /// Copies the unread bytes of the pipe behind `pid`'s `fd` (once per pipe).
    fn capture_pipe(&mut self, pid: i32, fd: i32, flags: u32, ino: u64) -> Result<()> {
        if self.pipes.contains_key(&ino) {
            return Ok(());
        }
        let err = |what: &str, e: std::io::Error| CaptureError::Proc {
            pid,
            file: format!("fd/{fd} ({what})"),
            source: e,
        };
        // A read end of the same pipe.
        let read_end: OwnedFd =
            if flags & libc::O_ACCMODE.unsigned_abs() == libc::O_WRONLY.unsigned_abs() {
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(proc::proc_path(pid, &format!("fd/{fd}")))
                    .map_err(|e| err("reopening the pipe for reading", e))?
                    .into()
            } else {
                let pfd = pidfd::pidfd_open(pid)?;
                pidfd::pidfd_getfd(&pfd, fd)?
            };
        // SAFETY: fcntl F_GETPIPE_SZ on a pipe fd we own.
        let cap = unsafe { libc::fcntl(read_end.as_raw_fd(), libc::F_GETPIPE_SZ) };
        let cap = usize::try_from(cap)
            .map_err(|_| err("F_GETPIPE_SZ", std::io::Error::last_os_error()))?;
        if cap > PIPE_MAX {
            return Err(CaptureError::Unsupported { pid, what: format!("fd {fd} is a pipe of {cap} bytes; stasis can recreate pipes of at most {PIPE_MAX} bytes (fs.pipe-max-size)") });
        }
        let mut p = [0i32; 2];
        // SAFETY: pipe2 writes two fds into the array.
        if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
            return Err(err("pipe2", std::io::Error::last_os_error()));
        }
        // SAFETY: pipe2 returned two new fds that we own.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        // SAFETY: fcntl on our own pipe.
        unsafe {
            libc::fcntl(
                w.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                i32::try_from(cap).unwrap_or(65536),
            )
        };
        // SAFETY: tee between two pipe fds we own; it copies without consuming.
        let n = unsafe {
            libc::tee(
                read_end.as_raw_fd(),
                w.as_raw_fd(),
                cap,
                libc::SPLICE_F_NONBLOCK,
            )
        };
        let n = if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                0
            } else {
                return Err(err("tee", e));
            }
        } else {
            usize::try_from(n).unwrap_or(0)
        };
        let mut data = vec![0u8; n];
        let mut got = 0;
        while got < n {
            // SAFETY: reading into our buffer from our pipe.
            let k = unsafe { libc::read(r.as_raw_fd(), data[got..].as_mut_ptr().cast(), n - got) };
            if k <= 0 {
                return Err(err("reading pipe data", std::io::Error::last_os_error()));
            }
            got += usize::try_from(k).unwrap_or(0);
        }
        self.pipes.insert(
            ino,
            PipeImage {
                id: ino,
                capacity: u32::try_from(cap).unwrap_or(65536),
                data,
            },
        );
        Ok(())
    }
}
