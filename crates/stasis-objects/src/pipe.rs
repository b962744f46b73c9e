//! Pipes and FIFOs, with the bytes sitting in them.
//!
//! At dump, the content is copied with `tee(2)` from a read end taken out
//! of the process with `pidfd_getfd` (or reopened through `/proc/PID/fd/N`
//! when the process only holds the write end), so the data stays in the
//! pipe. At restore, each pipe is made once (sized, refilled) and each end
//! handed out as often as it was held; a FIFO is opened at its path, with
//! a read-write opener keeping its refilled data alive meanwhile.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};

use stasis_image::manifest::{FdImage, FdKind, PipeImage};
use stasis_kernel::{fdops, pidfd, scm};

use crate::error::{file_err, io_step};
use crate::restore::{open_with_mode, reopen_flags, setfl_flags};
use crate::save::proc_path;
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// The largest pipe stasis can recreate without CAP_SYS_RESOURCE.
const PIPE_MAX: usize = 1 << 20;

/// An anonymous pipe (one end).
pub struct Pipe;

/// A named pipe, reopened at its path.
pub struct Fifo;

fn write_end(flags: u32) -> bool {
    flags & libc::O_ACCMODE.unsigned_abs() == libc::O_WRONLY.unsigned_abs()
}

impl Object for Pipe {
    const NAME: &'static str = "pipe";

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if !fd.link.starts_with("pipe:") {
            return Ok(None);
        }
        save_content(cx, fd)?;
        Ok(Some(FdKind::Pipe {
            id: fd.meta.ino(),
            write_end: write_end(fd.flags),
        }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Pipe { .. })
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Pipe { id, write_end } = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let (r, w) = pipe(cx, *id)?;
        let end = if *write_end { w } else { r };
        // The end pipe2 made has no O_LARGEFILE, which F_SETFL cannot
        // change; a description with it was opened (through /proc): one
        // of its own is opened so.
        let made = if img.flags & stasis_sys::O_LARGEFILE != 0 {
            own_description(end, *write_end, img.fd)?
        } else {
            scm::dup_at_least(end.as_fd(), 3)?
        };
        set_flags(&made, img)?;
        Ok(made)
    }
}

impl Object for Fifo {
    const NAME: &'static str = "fifo";

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if fd.socket.is_some() || !fd.meta.file_type().is_fifo() {
            return Ok(None);
        }
        save_content(cx, fd)?;
        Ok(Some(FdKind::Fifo {
            path: fd.link.to_string(),
            id: fd.meta.ino(),
        }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Fifo { .. })
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::Fifo { path, id } = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let fd = img.fd;
        // Opened where the tree's paths are (a FIFO of a tmpfs of its own
        // mount namespace is there).
        if !cx.fifo_keepers.contains_key(id) {
            let keeper: OwnedFd = cx
                .in_tree_mounts(|| {
                    std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                        .open(path)
                })?
                .map_err(file_err(path.clone(), format!("FIFO of fd {fd}"), "open"))?
                .into();
            if let Some(img) = cx.pipe_data.get(id) {
                fill(&keeper, img)?;
            }
            cx.fifo_keepers.insert(*id, keeper);
        }
        let made: OwnedFd = cx
            .in_tree_mounts(|| {
                open_with_mode(
                    std::fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(reopen_flags(img.flags) | libc::O_NONBLOCK),
                    path,
                    img.flags,
                )
            })?
            .map_err(file_err(path.clone(), format!("fd {fd}"), "open"))?
            .into();
        set_flags(&made, img)?;
        Ok(made)
    }
}

/// A new open file description of one end of a pipe (opening
/// `/proc/self/fd/N` makes one, as a FIFO open does, with `O_LARGEFILE`):
/// fds that were one description share it through their `shared_id`, and
/// such a description gets its own, so status flags set on one (`O_NONBLOCK`
/// on a write end reopened by its program through `/proc`) do not reach
/// the pipe's own ends. The restorer holds both ends, so the open neither
/// blocks nor fails for want of a peer.
fn own_description(end: &OwnedFd, write: bool, fd: i32) -> Result<OwnedFd, RestoreError> {
    let path = format!("/proc/self/fd/{}", end.as_raw_fd());
    let opened: OwnedFd = std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .map_err(file_err(path, format!("pipe of fd {fd}"), "open"))?
        .into();
    Ok(scm::dup_at_least(opened.as_fd(), 3)?)
}

/// Status flags of the description (O_NONBLOCK, O_APPEND...): pipes are
/// made without them.
fn set_flags(made: &OwnedFd, img: &FdImage) -> Result<(), RestoreError> {
    fdops::set_status_flags(made.as_fd(), setfl_flags(img.flags)).map_err(io_step(
        format!("setting the flags of fd {}", img.fd),
        "F_SETFL",
    ))
}

/// The two ends of pipe `id`, made (and refilled) on first use.
fn pipe<'c>(cx: &'c mut RestoreCtx<'_>, id: u64) -> Result<&'c (OwnedFd, OwnedFd), RestoreError> {
    if !cx.pipes.contains_key(&id) {
        let (rd, wr) =
            fdops::pipe2(libc::O_CLOEXEC).map_err(io_step("creating a pipe", "pipe2"))?;
        if let Some(img) = cx.pipe_data.get(&id) {
            fill(&wr, img)?;
        }
        cx.pipes.insert(id, (rd, wr));
    }
    Ok(&cx.pipes[&id])
}

/// Sizes a pipe as it was and writes its saved bytes into it.
pub(crate) fn fill(w: &OwnedFd, img: &PipeImage) -> Result<(), RestoreError> {
    fdops::set_pipe_size(w.as_fd(), i32::try_from(img.capacity).unwrap_or(65536)).map_err(
        io_step(
            format!(
                "sizing a pipe to {} bytes (fs.pipe-max-size may be lower)",
                img.capacity
            ),
            "F_SETPIPE_SZ",
        ),
    )?;
    write_all(w, &img.data, "refilling a pipe")
}

/// Writes all of `data` to `f`.
pub(crate) fn write_all(f: &OwnedFd, mut data: &[u8], what: &str) -> Result<(), RestoreError> {
    while !data.is_empty() {
        let source = match nix::unistd::write(f, data) {
            Ok(0) => std::io::ErrorKind::WriteZero.into(),
            Ok(n) => {
                data = &data[n..];
                continue;
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => std::io::Error::from(e),
        };
        return Err(io_step(what, "write")(source));
    }
    Ok(())
}

/// Copies the unread bytes of the pipe behind `fd` (once per pipe).
pub(crate) fn save_content(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<(), SaveError> {
    let ino = fd.meta.ino();
    if cx.pipes.contains_key(&ino) {
        return Ok(());
    }
    let (pid, n) = (fd.pid, fd.fd);
    let err = |what: &str| {
        let file = format!("fd/{n} ({what})");
        move |source: std::io::Error| SaveError::Proc { pid, file, source }
    };
    // A read end of the same pipe.
    let read_end: OwnedFd = if write_end(fd.flags) {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(proc_path(pid, &format!("fd/{n}")))
            .map_err(err("reopening the pipe for reading"))?
            .into()
    } else {
        let pfd = pidfd::pidfd_open(pid)?;
        pidfd::pidfd_getfd(&pfd, n)?
    };
    let cap = fdops::pipe_size(read_end.as_fd()).map_err(err("F_GETPIPE_SZ"))?;
    if cap > PIPE_MAX {
        return Err(fd.unsupported(format!("fd {n} is a pipe of {cap} bytes; stasis can recreate pipes of at most {PIPE_MAX} bytes (fs.pipe-max-size)")));
    }
    let (r, w) = fdops::pipe2(libc::O_CLOEXEC | libc::O_NONBLOCK).map_err(err("pipe2"))?;
    let _ = fdops::set_pipe_size(w.as_fd(), i32::try_from(cap).unwrap_or(65536));
    let len = fdops::tee_nonblocking(read_end.as_fd(), w.as_fd(), cap).map_err(err("tee"))?;
    let mut data = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&r), &mut data[got..]) {
            Ok(k) if k > 0 => got += k,
            Ok(_) => {
                return Err(err("reading pipe data")(
                    std::io::ErrorKind::UnexpectedEof.into(),
                ))
            }
            Err(e) => return Err(err("reading pipe data")(e.into())),
        }
    }
    cx.pipes.insert(
        ino,
        PipeImage {
            id: ino,
            capacity: u32::try_from(cap).unwrap_or(65536),
            data,
        },
    );
    Ok(())
}

/// Refuses pipes with an end held outside the tree (a shell pipeline
/// around the dumped program, say): that process would lose its peer.
pub fn check_external(cx: &SaveCtx, tree: &[i32]) -> Result<(), SaveError> {
    let mut ends: HashMap<u64, (bool, bool)> = HashMap::new();
    for f in cx.tables.iter().flatten() {
        if let FdKind::Pipe { id, write_end } = f.kind {
            let e = ends.entry(id).or_default();
            if write_end {
                e.1 = true;
            } else {
                e.0 = true;
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
    // From the census when the dump took one (before the freeze), else
    // from one taken now (a walk of `/proc`).
    let outside = match cx.ptys.census() {
        Some(c) => c.pipe_holder(&half, tree),
        None => crate::pty_census::Census::take().pipe_holder(&half, tree),
    };
    let Some((pid, id)) = outside else {
        return Ok(());
    };
    let holder = cx.seen.iter().find(|s| s.3 == id).map_or(tree[0], |s| s.0);
    Err(SaveError::Unsupported {
        pid: holder,
        what: format!("it shares pipe:[{id}] with process {pid}, which is outside the dumped tree (dump their common ancestor, or redirect the program's input/output to files)"),
    })
}
