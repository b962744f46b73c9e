//! Files without a name: deleted while open, and memfds. Their content is
//! saved (extent by extent: holes stay holes) and the file is made again
//! at restore: a memfd with its name and seals, a deleted file created at
//! its old path (or next to it) and unlinked at once. One "keeper" fd per
//! file; every description (and mapping) is reopened from it.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use stasis_image::manifest::{FdImage, FdKind, FileTimes, GhostFile};
use stasis_image::ContentSource;
use stasis_kernel::fdops;

use crate::error::{file_err, io_step, os_err};
use crate::restore::{open_with_mode, reopen_flags};
use crate::save::proc_path;
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// A deleted file or a memfd.
pub struct Ghost;

impl Object for Ghost {
    const NAME: &'static str = "deleted file or memfd";

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        let Some(name) = fd.link.strip_suffix(" (deleted)") else {
            return Ok(None);
        };
        if fd.socket.is_some() {
            return Ok(None);
        }
        if !fd.meta.file_type().is_file() {
            // Directories, FIFOs and device nodes: `crate::deleted`.
            return Ok(None);
        }
        if fd.meta.nlink() > 0 && !name.starts_with("/memfd:") {
            // Unlinked under this name, linked under another that /proc
            // does not give: a copy would be another file. A name found
            // in the same directory is opened again, as a plain file is.
            let Some(other) = other_link(name, fd.meta.dev(), fd.meta.ino()) else {
                return Err(fd.unsupported(format!(
                    "fd {} is a file removed from {name} that still has {} other hard link(s), none of them in that directory, which stasis cannot find to open it again; keep a name for it there",
                    fd.fd,
                    fd.meta.nlink()
                )));
            };
            return Ok(Some(FdKind::Path {
                path: other,
                pos: fd.pos,
                mode: fd.meta.mode(),
                size: fd.meta.size(),
            }));
        }
        save_content(cx, fd.pid, &format!("fd/{}", fd.fd))?;
        let (id, pos) = (fd.meta.ino(), fd.pos);
        Ok(Some(match name.strip_prefix("/memfd:") {
            Some(n) => FdKind::Memfd {
                name: n.to_string(),
                id,
                pos,
            },
            None => FdKind::Ghost {
                path: name.to_string(),
                id,
                pos,
            },
        }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Ghost { .. } | FdKind::Memfd { .. })
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let (path, id, pos, memfd) = match &img.kind {
            FdKind::Ghost { path, id, pos } => (path, id, pos, false),
            FdKind::Memfd { name, id, pos } => (name, id, pos, true),
            _ => return Err(crate::restore::not_mine(Self::NAME, img)),
        };
        let fd = img.fd;
        let accmode = img.flags & libc::O_ACCMODE.unsigned_abs();
        let first_rw =
            memfd && accmode == libc::O_RDWR.unsigned_abs() && !cx.memfd_firsts.contains(id);
        let keeper = keeper(
            cx,
            *id,
            (!memfd).then_some(path.as_str()),
            memfd.then_some(path.as_str()),
        )?;
        // A memfd's first read-write description is the one
        // memfd_create made, as it was: a reopen through /proc counts as
        // a writer of the inode, and exec of the memfd (execveat) would
        // then fail with ETXTBSY.
        if first_rw {
            let o = stasis_kernel::scm::dup_at_least(keeper.as_fd(), 3)?;
            cx.memfd_firsts.insert(*id);
            fdops::set_status_flags(o.as_fd(), crate::restore::setfl_flags(img.flags))
                .map_err(io_step(format!("setting the flags of fd {fd}"), "F_SETFL"))?;
            fdops::seek_to(o.as_fd(), i64::try_from(*pos).unwrap_or(0))
                .map_err(io_step(format!("seeking fd {fd} to {pos}"), "lseek"))?;
            return Ok(o);
        }
        let reopen = format!("/proc/self/fd/{}", keeper.as_raw_fd());
        // An O_TMPFILE file: its flags say O_DIRECTORY too, which the
        // reopen of a regular file cannot have.
        let flags = img.flags & !libc::O_TMPFILE.unsigned_abs();
        let o: OwnedFd = open_with_mode(
            std::fs::OpenOptions::new().custom_flags(reopen_flags(flags)),
            &reopen,
            flags,
        )
        .map_err(file_err(
            path.clone(),
            format!("fd {fd} (deleted file or memfd)"),
            "reopen",
        ))?
        .into();
        fdops::seek_to(o.as_fd(), i64::try_from(*pos).unwrap_or(0))
            .map_err(io_step(format!("seeking fd {fd} to {pos}"), "lseek"))?;
        Ok(o)
    }
}

/// Saves the content of a deleted file or memfd that `pid` maps at
/// `start..end` (once per inode), through `/proc/PID/map_files`.
pub fn save_mapped(cx: &mut SaveCtx, pid: i32, start: u64, end: u64) -> Result<(), SaveError> {
    save_content(cx, pid, &format!("map_files/{start:x}-{end:x}"))
}

/// Reads the file behind `/proc/PID/<name>` into the ghost table.
fn save_content(cx: &mut SaveCtx, pid: i32, name: &str) -> Result<(), SaveError> {
    let path = proc_path(pid, name);
    let proc_err = |source| SaveError::Proc {
        pid,
        file: name.to_string(),
        source,
    };
    let meta = std::fs::metadata(&path).map_err(proc_err)?;
    if cx.ghosts.contains_key(&meta.ino()) {
        return Ok(());
    }
    let (size, content) = read_sparse(pid, name)?;
    let f = &content.file;
    // Not a memfd (an error): no seals.
    let seals = fdops::seals(f.as_fd()).unwrap_or(0);
    let hugetlb = nix::sys::statfs::fstatfs(f)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::HUGETLBFS_MAGIC);
    cx.ghosts.insert(
        meta.ino(),
        GhostFile {
            id: meta.ino(),
            mode: meta.mode(),
            data: Vec::new(),
            seals: u32::try_from(seals).unwrap_or(0),
            size,
            extents: Vec::new(),
            owner: Some((meta.uid(), meta.gid())),
            times: Some(FileTimes {
                atime: (meta.atime(), meta.atime_nsec()),
                mtime: (meta.mtime(), meta.mtime_nsec()),
            }),
            hugetlb,
        },
    );
    cx.ghost_content.insert(meta.ino(), content);
    Ok(())
}

/// Opens the file behind `/proc/PID/<name>` and finds its data ranges
/// (`SEEK_DATA`/`SEEK_HOLE`): holes are neither read nor saved, so a large
/// shared memory segment with little in use costs what it uses, and its
/// holes stay holes after a restore. The data is read later, into the
/// content pack ([`crate::content`]). Returns the file's size.
pub(crate) fn read_sparse(
    pid: i32,
    name: &str,
) -> Result<(u64, crate::content::PendingContent), SaveError> {
    let proc_err = |file: &str| {
        let file = file.to_string();
        move |source| SaveError::Proc { pid, file, source }
    };
    let path = proc_path(pid, name);
    // O_NOATIME: reading it must not change what the program sees of it
    // (a left-running tree, a deleted file's times).
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME)
        .open(&path)
        .or_else(|_| std::fs::File::open(&path))
        .map_err(proc_err(name))?;
    let size = f.metadata().map_err(proc_err(name))?.size();
    let ranges = stasis_kernel::fdops::data_extents(&f, 0, size)
        .map_err(proc_err(&format!("{name} (SEEK_DATA)")))?;
    Ok((
        size,
        crate::content::PendingContent {
            file: f,
            path,
            ranges,
        },
    ))
}

impl RestoreCtx<'_> {
    /// An fd on the rebuilt deleted file or memfd `id` (named `name` at
    /// dump: `/memfd:...` or a path), to map it.
    pub fn ghost_for_mapping(
        &mut self,
        id: u64,
        name: &str,
        writable: bool,
    ) -> Result<OwnedFd, RestoreError> {
        let memfd = name.strip_prefix("/memfd:");
        let keeper = keeper(
            self,
            id,
            if memfd.is_none() { Some(name) } else { None },
            memfd,
        )?;
        std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .custom_flags(libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", keeper.as_raw_fd()))
            .map(OwnedFd::from)
            .map_err(file_err(name, "a mapped deleted file or memfd", "reopen"))
    }
}

/// The keeper fd of the rebuilt deleted file `id` (named `path` at dump),
/// made on first use.
pub(crate) fn keeper_of_deleted<'c>(
    cx: &'c mut RestoreCtx<'_>,
    id: u64,
    path: &str,
) -> Result<&'c OwnedFd, RestoreError> {
    keeper(cx, id, Some(path), None)
}

/// The keeper fd of a deleted file (`path`) or memfd (`memfd` name),
/// made on first use: created, filled, sealed or unlinked.
fn keeper<'c>(
    cx: &'c mut RestoreCtx<'_>,
    id: u64,
    path: Option<&str>,
    memfd: Option<&str>,
) -> Result<&'c OwnedFd, RestoreError> {
    if !cx.ghost_keepers.contains_key(&id) {
        let g = *cx.ghost_data.get(&id).ok_or_else(|| {
            RestoreError::Inconsistent(format!("no saved content for deleted file or memfd {id}"))
        })?;
        let src = cx.content;
        let keeper = match memfd {
            Some(name) => make_memfd(name, g, src)?,
            // A MAP_HUGETLB area's hidden file ("/anon_hugepage").
            None if g.hugetlb => make_hugetlb(c"anon_hugepage", g, 0, src)?,
            // Made where the tree's paths are: a deleted file of a tmpfs
            // of its own mount namespace is made again on that tmpfs.
            None => cx.in_tree_mounts(|| {
                make_deleted(path.unwrap_or("/tmp/stasis-ghost"), id, g, src)
            })??,
        };
        cx.ghost_keepers.insert(id, keeper);
    }
    Ok(&cx.ghost_keepers[&id])
}

/// A huge-page file named `name` (`memfd_create(MFD_HUGETLB)`, on the
/// same internal hugetlbfs as `MAP_HUGETLB`: its mappings are huge-page
/// ones, on the same device) with the content of `g`, written through a
/// mapping (hugetlbfs takes no `write`). Needs huge pages free in the
/// pool. Used for `MAP_HUGETLB` areas (their hidden file, saved as the
/// deleted file "/anon_hugepage") and `MFD_HUGETLB` memfds.
fn make_hugetlb(
    name: &std::ffi::CStr,
    g: &GhostFile,
    flags: u32,
    src: Option<&ContentSource>,
) -> Result<OwnedFd, RestoreError> {
    let k = fdops::memfd_create(name, flags | libc::MFD_CLOEXEC | libc::MFD_HUGETLB)
        .map_err(os_err("memfd_create(MFD_HUGETLB)"))?;
    let (size, extents) = g
        .content()
        .map_err(|e| RestoreError::Inconsistent(e.to_string()))?;
    let err = || {
        io_step(
            "filling a huge-page mapping again (are enough huge pages free? /proc/sys/vm/nr_hugepages)",
            "mmap",
        )
    };
    let mut map = fdops::SharedMap::open(k.as_fd(), size).map_err(err())?;
    crate::content::put_back(src, &extents, |off, data| {
        map.write_at(off, data).map_err(err())
    })?;
    Ok(k)
}

/// A memfd named `name` with the content, mode and seals of `g`.
fn make_memfd(
    name: &str,
    g: &GhostFile,
    src: Option<&ContentSource>,
) -> Result<OwnedFd, RestoreError> {
    let cname = CString::new(name)
        .map_err(|_| RestoreError::Inconsistent(format!("memfd name {name:?} has a NUL")))?;
    let sealable = g.seals & !libc::F_SEAL_SEAL.unsigned_abs() != 0 || g.seals == 0;
    let flags = libc::MFD_CLOEXEC | if sealable { libc::MFD_ALLOW_SEALING } else { 0 };
    let k = if g.hugetlb {
        make_hugetlb(&cname, g, flags, src)?
    } else {
        let k = fdops::memfd_create(&cname, flags).map_err(os_err("memfd_create"))?;
        write_sparse(&k, g, src)?;
        k
    };
    nix::sys::stat::fchmod(
        k.as_raw_fd(),
        nix::sys::stat::Mode::from_bits_truncate(g.mode & 0o7777),
    )
    .map_err(|e| {
        io_step(format!("giving memfd {name} its mode"), "fchmod")(std::io::Error::from(e))
    })?;
    if g.seals != 0 && sealable {
        fdops::add_seals(k.as_fd(), i32::try_from(g.seals).unwrap_or(0))
            .map_err(io_step(format!("sealing memfd {name}"), "F_ADD_SEALS"))?;
    }
    Ok(k)
}

/// A file with the content, owner, mode and times of `g`, made at `path`
/// (so it shows as "PATH (deleted)" again) when that name is free, else
/// next to it or in the temporary directory; unlinked.
fn make_deleted(
    path: &str,
    id: u64,
    g: &GhostFile,
    src: Option<&ContentSource>,
) -> Result<OwnedFd, RestoreError> {
    let mut last = None;
    for target in ghost_names(path, id) {
        let made = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&target);
        match made {
            Ok(f) => {
                let k: OwnedFd = f.into();
                let filled = write_sparse(&k, g, src).and_then(|()| set_attributes(&k, g));
                let _ = std::fs::remove_file(&target);
                filled?;
                return Ok(k);
            }
            Err(e) if name_unusable(&e) => last = Some((target, e)),
            Err(e) => {
                return Err(file_err(
                    target.display().to_string(),
                    "recreating a deleted file",
                    "open",
                )(e))
            }
        }
    }
    let (target, e) = last.unwrap_or_else(|| (path.into(), std::io::ErrorKind::NotFound.into()));
    Err(file_err(
        target.display().to_string(),
        "recreating a deleted file (no usable name next to it nor in the temporary directory)",
        "open",
    )(e))
}

/// Whether making a file at a name failed for that name only (taken, a
/// directory we may not write, a read-only or gone directory): the next
/// name is tried.
pub(crate) fn name_unusable(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EEXIST | libc::EACCES | libc::EPERM | libc::EROFS | libc::ENOENT | libc::ENOTDIR
        )
    )
}

/// The names to make a deleted object at, in order: its own path, a
/// name next to it, a name in the temporary directory.
pub(crate) fn ghost_names(path: &str, id: u64) -> Vec<std::path::PathBuf> {
    let own = std::path::PathBuf::from(path);
    let tag = format!(".stasis-ghost-{id}-{}", std::process::id());
    let mut names = Vec::with_capacity(3);
    if own.is_absolute() {
        if let Some(dir) = own.parent().filter(|d| d.is_dir()) {
            names.push(own.clone());
            names.push(dir.join(&tag));
        }
    }
    names.push(std::env::temp_dir().join(tag));
    names
}

/// Owner, mode and times of a rebuilt deleted file or memfd (what the
/// image holds of them): its owner first, as `fchown` clears set-id bits.
fn set_attributes(k: &OwnedFd, g: &GhostFile) -> Result<(), RestoreError> {
    use nix::sys::stat::{fchmod, futimens, Mode};
    use nix::sys::time::TimeSpec;
    let err = |what: &str, op: &str| {
        let f = io_step(format!("giving a rebuilt deleted file {what}"), op);
        move |e: nix::errno::Errno| f(std::io::Error::from(e))
    };
    if let Some((uid, gid)) = g.owner {
        nix::unistd::fchown(
            k.as_raw_fd(),
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )
        .map_err(err("its owner", "fchown"))?;
    }
    fchmod(k.as_raw_fd(), Mode::from_bits_truncate(g.mode & 0o7777))
        .map_err(err("its mode", "fchmod"))?;
    if let Some(t) = g.times {
        futimens(
            k.as_raw_fd(),
            &TimeSpec::new(t.atime.0, t.atime.1),
            &TimeSpec::new(t.mtime.0, t.mtime.1),
        )
        .map_err(err("its times", "futimens"))?;
    }
    Ok(())
}

/// Writes the content of a deleted file or memfd into the new, empty file
/// `f`: each data extent at its offset, then the size; the rest stays
/// holes, as it was.
fn write_sparse(
    f: &OwnedFd,
    g: &GhostFile,
    src: Option<&ContentSource>,
) -> Result<(), RestoreError> {
    use std::os::unix::fs::FileExt;
    let err = || io_step("writing the content of a deleted file or memfd", "pwrite");
    let (size, extents) = g
        .content()
        .map_err(|e| RestoreError::Inconsistent(e.to_string()))?;
    let file = std::fs::File::from(f.try_clone().map_err(err())?);
    crate::content::put_back(src, &extents, |off, data| {
        file.write_all_at(data, off).map_err(err())
    })?;
    file.set_len(size).map_err(err())
}
/// Another name of the file `(dev, ino)`, removed from `old`: an entry of
/// `old`'s directory that is that file (a hard link made next to it, as
/// `link(2)` users do). The directory is read once; a filesystem-wide
/// search would cost more than a dump may.
fn other_link(old: &str, dev: u64, ino: u64) -> Option<String> {
    let dir = std::path::Path::new(old).parent()?;
    std::fs::read_dir(dir).ok()?.find_map(|e| {
        let e = e.ok()?;
        let m = std::fs::symlink_metadata(e.path()).ok()?;
        (m.is_file() && m.dev() == dev && m.ino() == ino)
            .then(|| e.path().to_string_lossy().into_owned())
    })
}
