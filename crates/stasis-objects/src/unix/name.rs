//! The names of unix sockets: binding (a relative name from the
//! process's working directory, a name in a directory gone since: made for
//! the bind and removed again), connecting by name, and the socket file's
//! owner and mode.

use std::os::fd::{AsFd, OwnedFd};

use stasis_kernel::sock;

/// Owner, group and mode of the socket file of path name `name`, as the
/// process `pid` sees it (a relative name from its working directory);
/// `Err` if there is no socket file there any more (nothing, or another
/// kind of file), `None` for an abstract name or a path that cannot be
/// looked at.
pub(super) fn socket_file(pid: i32, name: &[u8]) -> Option<Result<(u32, u32, u32), ()>> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let (&first, _) = name.split_first()?;
    if first == 0 {
        return None;
    }
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let name = std::ffi::OsStr::from_bytes(&name[..end]);
    let mut path = std::path::PathBuf::from(format!(
        "/proc/{pid}/{}",
        if first == b'/' { "root" } else { "cwd" }
    ));
    path.push(
        std::path::Path::new(name)
            .strip_prefix("/")
            .unwrap_or(name.as_ref()),
    );
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(Err(())),
        Err(_) => return None,
    };
    if m.file_type().is_socket() {
        Some(Ok((m.uid(), m.gid(), m.mode() & 0o7777)))
    } else {
        // Another file (a FIFO...) took the name since.
        Some(Err(()))
    }
}

fn sockaddr_un(name: &[u8]) -> Vec<u8> {
    let mut a = Vec::with_capacity(2 + name.len());
    a.extend_from_slice(&u16::try_from(libc::AF_UNIX).unwrap_or(1).to_ne_bytes());
    a.extend_from_slice(name);
    a
}

/// Where the names of a process's sockets resolve: its working directory,
/// in the mount namespace of process `mnt` (the restored tree's own) if
/// set, else the restorer's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Place {
    pub(crate) cwd: String,
    pub(crate) mnt: Option<i32>,
}

/// Runs `f` with `name` resolvable: a relative path name is used from
/// the working directory of `at`, in a thread with its own working
/// directory (`unshare(CLONE_FS)`), so the socket keeps the very name the
/// process gave it; a path name in the tree's mount namespace from a
/// thread moved into it.
fn at_cwd<T>(
    name: &[u8],
    at: &Place,
    f: impl FnOnce() -> std::io::Result<T> + Send,
) -> std::io::Result<T>
where
    T: Send,
{
    let path = matches!(name.first(), Some(&c) if c != 0);
    let relative = path && name.first() != Some(&b'/') && !at.cwd.is_empty();
    match at.mnt {
        Some(pid) if path => {
            let cwd = &at.cwd;
            stasis_kernel::ns::in_namespaces_of(pid, &[stasis_kernel::ns::NsKind::Mnt], || {
                if relative {
                    nix::unistd::chdir(cwd.as_str())?;
                }
                f()
            })
            .map_err(|e| std::io::Error::other(e.to_string()))?
        }
        _ if relative => std::thread::scope(|sc| {
            sc.spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS)?;
                nix::unistd::chdir(at.cwd.as_str())?;
                f()
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("socket thread panicked")))
        }),
        _ => f(),
    }
}

/// Binds a unix socket; a stale socket file left at the path by the dumped
/// process is removed first, and the new one gets the owner and mode the
/// file had at dump (`owner`), or else the stale one's (made by the
/// restorer, it would be root's: another user's process could no longer
/// connect to it).
pub(super) fn bind_unix(
    s: &OwnedFd,
    name: &[u8],
    cwd: &Place,
    owner: Option<(u32, u32, u32)>,
    deleted: bool,
) -> std::io::Result<Dirs> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    at_cwd(name, cwd, || {
        let path = match name.first() {
            Some(&first) if first != 0 => {
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(
                    &name[..end],
                )))
            }
            _ => None,
        };
        let stale = path.as_ref().and_then(|p| {
            std::fs::symlink_metadata(p)
                .ok()
                .filter(|m| m.file_type().is_socket())
                .map(|m| (p, m))
        });
        if let Some((p, _)) = &stale {
            std::fs::remove_file(p)?;
        }
        let made = match (sock::bind(s.as_fd(), &sockaddr_un(name)), &path) {
            (Err(e), Some(p)) if e.kind() == std::io::ErrorKind::NotFound => {
                // Its directory is gone (removed or renamed after the
                // bind): made for the bind, removed again below.
                let made = make_dirs(p)?;
                let r = sock::bind(s.as_fd(), &sockaddr_un(name));
                if let Err(e) = r {
                    remove_dirs(&made);
                    return Err(e);
                }
                made
            }
            (Err(e), Some(p)) if e.kind() == std::io::ErrorKind::AddrInUse && deleted => {
                // Another file (a FIFO...) took the name the program had
                // unlinked: moved aside for the bind, put back below.
                let away = aside(p);
                std::fs::rename(p, &away)?;
                if let Err(e) = sock::bind(s.as_fd(), &sockaddr_un(name)) {
                    std::fs::rename(&away, p)?;
                    return Err(e);
                }
                return Ok(Dirs {
                    made: Vec::new(),
                    aside: Some((away, p.clone())),
                });
            }
            (r, _) => r.map(|()| Vec::new())?,
        };
        let owner = owner.or_else(|| {
            stale
                .as_ref()
                .map(|(_, m)| (m.uid(), m.gid(), m.mode() & 0o7777))
        });
        if let (Some(p), Some((uid, gid, mode))) = (&path, owner) {
            std::os::unix::fs::lchown(p, Some(uid), Some(gid))?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
        }
        Ok(Dirs { made, aside: None })
    })
}

/// A free name beside `p` to move a file to for a while.
fn aside(p: &std::path::Path) -> std::path::PathBuf {
    let mut name = p.as_os_str().to_owned();
    name.push(format!(".stasis-aside-{}", std::process::id()));
    std::path::PathBuf::from(name)
}

/// What was changed to bind a socket whose name was no longer free:
/// directories made (its own was gone) or a file moved aside (another took
/// its name); undone by [`forget_name`].
#[must_use]
#[derive(Debug, Default)]
pub(super) struct Dirs {
    made: Vec<std::path::PathBuf>,
    /// (where it is now, where it goes back).
    aside: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Dirs {
    /// Whether the socket file must go again.
    pub(super) fn made(&self) -> bool {
        !self.made.is_empty() || self.aside.is_some()
    }
}

/// Removes the socket file of path name `name` (the program had unlinked
/// it), then the directories made to bind it.
pub(super) fn forget_name(name: &[u8], cwd: &Place, dirs: Dirs) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    if end == 0 {
        return Ok(());
    }
    let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&name[..end]));
    at_cwd(name, cwd, || {
        let r = std::fs::remove_file(&path);
        if let Some((now, back)) = &dirs.aside {
            std::fs::rename(now, back)?;
        }
        remove_dirs(&dirs.made);
        r
    })
}

/// Makes the missing directories above `path`; returns those made, the
/// deepest last.
fn make_dirs(path: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut missing: Vec<std::path::PathBuf> = path
        .ancestors()
        .skip(1)
        .filter(|d| !d.as_os_str().is_empty())
        .take_while(|d| std::fs::symlink_metadata(d).is_err())
        .map(std::path::Path::to_path_buf)
        .collect();
    missing.reverse();
    let mut made = Vec::new();
    for d in missing {
        if let Err(e) = std::fs::create_dir(&d) {
            remove_dirs(&made);
            return Err(e);
        }
        made.push(d);
    }
    Ok(made)
}

/// Removes directories made by [`make_dirs`], deepest first.
fn remove_dirs(made: &[std::path::PathBuf]) {
    for d in made.iter().rev() {
        if let Err(e) = std::fs::remove_dir(d) {
            tracing::warn!(dir = %d.display(), "could not remove a directory made to bind a unix socket: {e}");
        }
    }
}

pub(super) fn connect_unix(s: &OwnedFd, name: &[u8], cwd: &Place) -> std::io::Result<()> {
    at_cwd(name, cwd, || sock::connect(s.as_fd(), &sockaddr_un(name)))
}
