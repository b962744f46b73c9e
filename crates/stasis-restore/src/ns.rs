//! The namespaces of a tree that lived in namespaces of its own
//! ([`Manifest::namespaces`]): the root stub is created in new ones of the
//! same kinds (PID 1 of a new PID namespace, with the saved host and domain
//! names and a proc of that namespace on `/proc`; in a new time namespace
//! whose clocks go on from where they were at the dump), and what the
//! restorer does inside them runs on a thread moved there
//! ([`stasis_kernel::ns::in_namespaces_of`]).

use std::ffi::CString;

use std::os::fd::AsFd;

use stasis_image::manifest::{
    BindMount, EncapDev, LaterKind, Manifest, MountNamespace, Namespaces, NetAddress, NetAttr,
    NetInterface, NetLink, NetNamespace, NetNexthopObject, NetRoute, NetRule, TimeNamespace,
    TmpfsEntry, TunDevice, UserNamespace, IFLA_MACVLAN_MACADDR_DATA,
};
use stasis_kernel::child::NsSetup;
use stasis_kernel::fdops as kfdops;
use stasis_kernel::ns::{self as kns, NsKind};
use stasis_kernel::rtnl::{self, Rtnl};
use stasis_kernel::tun;
use stasis_sys::tun as tun_abi;

use crate::{ObjectError, RestoreError, Result};

/// The kinds of `ns`.
pub(crate) fn kinds(ns: &Namespaces) -> Vec<NsKind> {
    let mut k = Vec::new();
    // First: the others are made owned by it.
    if ns.user.is_some() {
        k.push(NsKind::User);
    }
    if ns.pid {
        k.push(NsKind::Pid);
    }
    if ns.mnt.is_some() {
        k.push(NsKind::Mnt);
    }
    if ns.net.is_some() {
        k.push(NsKind::Net);
    }
    if ns.uts.is_some() {
        k.push(NsKind::Uts);
    }
    if ns.ipc {
        k.push(NsKind::Ipc);
    }
    k
}

/// What the root stub sets up as it is created.
pub(crate) fn setup(ns: &Namespaces) -> Result<NsSetup> {
    let cstr = |what: &str, s: &str| {
        CString::new(s).map_err(|_| {
            RestoreError::from(ObjectError::Inconsistent(format!(
                "the saved {what} holds a NUL byte"
            )))
        })
    };
    let (hostname, domainname) = match &ns.uts {
        Some(u) => (
            Some(cstr("host name", &u.hostname)?),
            Some(cstr("domain name", &u.domainname)?),
        ),
        None => (None, None),
    };
    if ns.mnt.as_ref().is_some_and(|m| m.proc) && !ns.pid {
        return Err(ObjectError::Inconsistent(
            "a proc mount of the tree's own without a PID namespace of its own".into(),
        )
        .into());
    }
    let mut tmpfs = Vec::new();
    for t in ns.mnt.iter().flat_map(|m| m.tmpfs.iter()) {
        tmpfs.push((
            cstr(
                "tmpfs mount point",
                &before_pivot(ns.mnt.as_ref(), &t.target),
            )?,
            t.flags,
            cstr(
                "tmpfs options",
                &options_inside(&t.options, ns.user.as_ref())?,
            )?,
            cstr(
                "tmpfs source",
                if t.source.is_empty() {
                    "tmpfs"
                } else {
                    &t.source
                },
            )?,
        ));
    }
    let mut binds = Vec::new();
    for b in ns.mnt.iter().flat_map(|m| m.binds.iter()) {
        binds.push((
            cstr("bind mount source", &b.source)?,
            cstr(
                "bind mount point",
                &before_pivot(ns.mnt.as_ref(), &b.target),
            )?,
            b.flags,
        ));
    }
    let lines = |map: &[[u32; 3]]| {
        map.iter()
            .map(|[i, o, n]| format!("{i} {o} {n}\n"))
            .collect::<String>()
    };
    // (A namespace without maps is left so: no id is mapped in it.)
    let id_maps = ns
        .user
        .as_ref()
        .filter(|u| !u.uid_map.is_empty() || !u.gid_map.is_empty())
        .map(|u| (lines(&u.uid_map), lines(&u.gid_map), u.setgroups_deny));
    let time_offsets = match &ns.time {
        Some(t) => Some(cstr("clock offsets", &time_offsets(t)?)?),
        None => None,
    };
    Ok(NsSetup {
        time_offsets,
        id_maps,
        flags: kinds(ns)
            .iter()
            .map(|k| k.clone_flag())
            .fold(0, |a, f| a | f),
        hostname,
        domainname,
        mount_proc: ns.mnt.as_ref().is_some_and(|m| m.proc),
        mount_slave: ns.mnt.as_ref().is_some_and(|m| m.slave_copies),
        tmpfs,
        binds,
    })
}

/// The offsets of the tree's new time namespace, as `timens_offsets`
/// takes them: those that make its clocks read now what they read at the
/// dump (the saved ones, less the host's now). Its clocks go on from
/// there: the tree sees no time pass while it was dumped, and they never
/// go backwards.
fn time_offsets(t: &TimeNamespace) -> Result<String> {
    if t.monotonic < 0 || t.boottime < 0 {
        return Err(ObjectError::Inconsistent(format!(
            "the saved clocks of the tree's time namespace are negative (monotonic {} ns, boot time {} ns)",
            t.monotonic, t.boottime
        ))
        .into());
    }
    let host = kns::host_clocks()?;
    let offsets = kns::ClockOffsets {
        monotonic: t.monotonic - host.monotonic,
        boottime: t.boottime - host.boottime,
    };
    tracing::debug!(
        saved = ?t,
        ?host,
        ?offsets,
        "the clock offsets of the tree's new time namespace"
    );
    Ok(kns::timens_offsets_text(offsets))
}

/// Mount options with their `uid=`/`gid=` as the tree's user namespace
/// has them (the stub mounts from inside it; the image has them as the
/// dumper saw them).
fn options_inside(opts: &str, user: Option<&UserNamespace>) -> Result<String> {
    let Some(u) = user else {
        return Ok(opts.to_string());
    };
    opts.split(',')
        .map(|o| {
            let (key, table) = match o.split_once('=') {
                Some(("uid", _)) => ("uid", &u.uid_map),
                Some(("gid", _)) => ("gid", &u.gid_map),
                _ => return Ok(o.to_string()),
            };
            let v = o[key.len() + 1..].parse::<u32>().ok();
            v.and_then(|v| UserNamespace::inside(table, v))
                .map(|i| format!("{key}={i}"))
                .ok_or_else(|| {
                    ObjectError::Inconsistent(format!(
                        "mount option {o} is not mapped in the tree's user namespace"
                    ))
                    .into()
                })
        })
        .collect::<Result<Vec<_>>>()
        .map(|v| v.join(","))
}

/// A process that had unshared a time namespace no process entered
/// ([`ProcessImage::pending_time`]): its main thread (`s`, its children
/// made) unshares a new one, and the restorer writes the saved offsets
/// to its `timens_offsets` (which shows the namespace it makes its
/// children in), as the process did. Called before its other threads
/// are made (`before_threads`) and after: it acts once, before if they
/// shared it (a thread made then shares it), else after.
///
/// [`ProcessImage::pending_time`]: stasis_image::manifest::ProcessImage::pending_time
pub(crate) fn unshare_pending_time(
    s: &mut crate::proc::Proc,
    p: &stasis_image::manifest::ProcessImage,
    before_threads: bool,
) -> Result<()> {
    let Some(t) = p.pending_time.filter(|t| t.threads == before_threads) else {
        return Ok(());
    };
    s.cur = None;
    stasis_kernel::remote::Remote::sys(
        s,
        "unshare",
        libc::SYS_unshare,
        &[libc::CLONE_NEWTIME as u64],
    )
    .map_err(crate::build::step(format!(
        "unsharing the time namespace process {} had made for its children",
        p.pid
    )))?;
    kns::set_timens_offsets(
        s.t.pid(),
        kns::ClockOffsets {
            monotonic: t.monotonic_offset,
            boottime: t.boottime_offset,
        },
    )
    .map_err(crate::build::step(format!(
        "writing the clock offsets of the time namespace process {} had made for its children",
        p.pid
    )))?;
    Ok(())
}

/// What the root stub's exit code says went wrong in setting up its
/// namespaces ([`stasis_kernel::child::spawn_stopped_in`]).
pub(crate) fn setup_failure(code: i32) -> Option<&'static str> {
    match code {
        125 => Some("setting the saved host or domain name failed"),
        124 => Some("making the mounts private or mounting a proc on /proc failed"),
        123 => Some("mounting a saved tmpfs failed (does its mount point exist here?)"),
        122 => Some("a saved bind mount failed (do its source and mount point exist here?)"),
        121 => Some("the id maps of the new user namespace were not written"),
        120 => Some("making or entering a new time namespace failed"),
        119 => Some("writing the clock offsets of the new time namespace failed"),
        118 => Some("the stand-in init of the new PID namespace could not execute stasis"),
        126 => {
            Some("the stand-in init of the new PID namespace could not create the root at its PID")
        }
        _ => None,
    }
}

/// A tree with a cgroup namespace of its own: the root stub (`r`, `pid` as
/// stasis sees it) enters the cgroup at the namespace's root, makes its new
/// cgroup namespace there (rooted at its cgroup), then goes on to its own
/// cgroup (`cgroups`, made by the restore). Its children inherit the
/// namespace.
pub(crate) fn enter_cgroup_ns<R: stasis_kernel::remote::Remote>(
    m: &Manifest,
    cgroups: &crate::cgroup::Placer,
    r: &mut R,
    pid: i32,
) -> Result<()> {
    let Some(n) = m.namespaces.as_ref() else {
        return Ok(());
    };
    let Some(ns_root) = n.cgroup_ns.as_deref() else {
        return Ok(());
    };
    cgroups.join(ns_root, pid)?;
    r.sys(
        "unshare",
        libc::SYS_unshare,
        &[libc::CLONE_NEWCGROUP as u64],
    )
    .map_err(crate::build::step(format!(
        "making the tree's cgroup namespace (rooted at {ns_root})"
    )))?;
    cgroups.join_root(pid)
}

/// Puts back the content of the tree's tmpfs mounts, through
/// `/proc/ROOT/root` (`root` as stasis sees it: its mount namespace).
/// Files' data comes from `content` (the checkpoint's content pack) or,
/// in older images, the manifest.
fn fill_tmpfs(m: &Manifest, root: i32, content: &stasis_image::ContentSource) -> Result<()> {
    let Some(mnt) = m.namespaces.as_ref().and_then(|n| n.mnt.as_ref()) else {
        return Ok(());
    };
    // A tmpfs the stub mounted in a user namespace of the tree's takes
    // only files of ids mapped there: they are made as its root.
    let ids = m
        .namespaces
        .as_ref()
        .and_then(|n| n.user.as_ref())
        .map(|u| {
            // The host id of its root (0 there), else of its first mapped id.
            let outside = |map: &[[u32; 3]]| {
                map.iter()
                    .find(|[i, _, n]| *i == 0 && *n > 0)
                    .or(map.first())
                    .map_or(0, |[_, o, _]| *o)
            };
            (outside(&u.uid_map), outside(&u.gid_map))
        });
    let fill = || -> Result<()> {
        for t in &mnt.tmpfs {
            let base = std::path::PathBuf::from(format!(
                "/proc/{root}/root{}",
                before_pivot(Some(mnt), &t.target)
            ));
            fill_entries(&base, &t.target, &t.entries, content, None)?;
        }
        Ok(())
    };
    match ids {
        Some((uid, gid)) => kns::as_fs_ids(uid, gid, fill)?,
        None => fill(),
    }
}

/// Makes `entries` (of the tmpfs mounted on `target`) under `base`, its
/// root as this thread sees it. `huge`: the huge page size of a
/// hugetlbfs, whose files are filled through a shared mapping
/// ([`fill_huge`]).
fn fill_entries(
    base: &std::path::Path,
    target: &str,
    entries: &[TmpfsEntry],
    content: &stasis_image::ContentSource,
    huge: Option<u64>,
) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let mut dirs = std::collections::HashSet::new();
    for e in entries {
        let rel = std::path::Path::new(&e.path);
        // Only plain names, each under a directory made before.
        let plain = rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        let parent_ok = rel
            .parent()
            .is_none_or(|p| p.as_os_str().is_empty() || dirs.contains(p));
        let first = e.path.is_empty();
        if !plain || !parent_ok || first != dirs.is_empty() {
            return Err(ObjectError::Inconsistent(format!(
                "tmpfs entry {:?} under {target} is not under a saved directory",
                e.path
            ))
            .into());
        }
        let path = if first {
            base.to_path_buf()
        } else {
            base.join(rel)
        };
        let step = |what: &'static str| {
            let p = format!("{target}/{}", e.path);
            move |err: std::io::Error| {
                RestoreError::from(ObjectError::Inconsistent(format!(
                    "{what} {p} in the restored tmpfs: {err}"
                )))
            }
        };
        let node = |kind: nix::sys::stat::SFlag| {
            nix::sys::stat::mknod(
                &path,
                kind,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                e.rdev,
            )
            .map_err(|err| step("making")(err.into()))
        };
        match e.mode & libc::S_IFMT {
            libc::S_IFDIR => {
                if !first {
                    std::fs::create_dir(&path).map_err(step("making"))?;
                }
                dirs.insert(rel.to_path_buf());
            }
            libc::S_IFREG => {
                use std::os::unix::fs::FileExt;
                let (size, extents) = e
                    .content()
                    .map_err(|err| ObjectError::Inconsistent(err.to_string()))?;
                let f = std::fs::OpenOptions::new()
                    .read(huge.is_some())
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(step("making"))?;
                if let Some(page) = huge {
                    fill_huge(&f, size, page, &extents, content)
                        .map_err(|err| step("filling")(err))?;
                    std::os::unix::fs::lchown(&path, Some(e.uid), Some(e.gid))
                        .map_err(step("chown of"))?;
                    std::fs::set_permissions(
                        &path,
                        std::fs::Permissions::from_mode(e.mode & 0o7777),
                    )
                    .map_err(step("chmod of"))?;
                    continue;
                }
                stasis_objects::content::put_back(Some(content), &extents, |off, data| {
                    f.write_all_at(data, off).map_err(|err| {
                        ObjectError::Inconsistent(format!(
                            "writing {target}/{} in the restored tmpfs: {err}",
                            e.path
                        ))
                    })
                })?;
                f.set_len(size).map_err(step("sizing"))?;
            }
            libc::S_IFLNK => {
                let target = std::ffi::OsStr::from_bytes(&e.data);
                std::os::unix::fs::symlink(target, &path).map_err(step("linking"))?;
            }
            libc::S_IFIFO => node(nix::sys::stat::SFlag::S_IFIFO)?,
            libc::S_IFCHR => node(nix::sys::stat::SFlag::S_IFCHR)?,
            libc::S_IFBLK => node(nix::sys::stat::SFlag::S_IFBLK)?,
            libc::S_IFSOCK => node(nix::sys::stat::SFlag::S_IFSOCK)?,
            _ => {
                return Err(ObjectError::Inconsistent(format!(
                    "tmpfs entry {target}/{} of mode {:o}",
                    e.path, e.mode
                ))
                .into())
            }
        }
        std::os::unix::fs::lchown(&path, Some(e.uid), Some(e.gid)).map_err(step("chown of"))?;
        if e.mode & libc::S_IFMT != libc::S_IFLNK {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(e.mode & 0o7777))
                .map_err(step("chmod of"))?;
        }
    }
    Ok(())
}

/// Gives the new hugetlbfs file `f` its `size` and the data `extents`
/// (whole huge pages of `page` bytes, inside its last whole one), each
/// written through a shared mapping of its pages (hugetlbfs takes no
/// `write`; a page left out stays a hole). A size that is not a whole
/// number of pages is set by `fallocate` of its last byte (that page,
/// never mappable, reads as zeros, as it did).
fn fill_huge(
    f: &std::fs::File,
    size: u64,
    page: u64,
    extents: &[stasis_image::manifest::Extent],
    content: &stasis_image::ContentSource,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let whole = size / page * page;
    f.set_len(whole)?;
    for e in extents {
        let end = e.offset.saturating_add(e.bytes());
        let cover = end.div_ceil(page).saturating_mul(page);
        if e.offset % page != 0 || cover > whole {
            return Err(std::io::Error::other(format!(
                "its saved data at {}+{} is not in whole huge pages of {page} bytes inside its size {size}",
                e.offset,
                e.bytes()
            )));
        }
        let mut map =
            kfdops::SharedMap::range(f.as_fd(), e.offset, cover - e.offset).map_err(|err| {
                std::io::Error::new(
                    err.kind(),
                    format!(
                        "mapping it (are enough huge pages free? /proc/sys/vm/nr_hugepages): {err}"
                    ),
                )
            })?;
        stasis_objects::content::put_back(Some(content), std::slice::from_ref(e), |off, data| {
            map.write_at(off - e.offset, data)
                .map_err(|err| RestoreError::from(ObjectError::Inconsistent(err.to_string())))
        })
        .map_err(|err| std::io::Error::other(err.to_string()))?;
    }
    if size > whole {
        nix::fcntl::fallocate(
            f.as_fd().as_raw_fd(),
            nix::fcntl::FallocateFlags::empty(),
            i64::try_from(size - 1).map_err(|_| std::io::Error::from_raw_os_error(libc::EFBIG))?,
            1,
        )?;
    }
    Ok(())
}

/// Makes the mounts saved as made later, in order, from a thread in the
/// tree's new mount namespace (`root` as stasis sees it): each mount
/// point made if missing; a tmpfs filled, then made read-only if it was;
/// a bind remounted with its flags.
fn later_mounts(m: &Manifest, root: i32, content: &stasis_image::ContentSource) -> Result<()> {
    let Some(mnt) = m.namespaces.as_ref().and_then(|n| n.mnt.as_ref()) else {
        return Ok(());
    };
    if mnt.later.is_empty() && mnt.root.is_none() {
        return Ok(());
    }
    // A sysfs shows the devices of the mounting thread's network
    // namespace, an mqueue the queues of its IPC namespace: the tree's.
    let ns = m.namespaces.as_ref();
    let mut kinds = vec![NsKind::Mnt];
    if ns.is_some_and(|n| n.net.is_some()) {
        kinds.push(NsKind::Net);
    }
    if ns.is_some_and(|n| n.ipc) {
        kinds.push(NsKind::Ipc);
    }
    // A cgroup2 is rooted at the mounting thread's cgroup namespace's
    // root: the tree's.
    if ns.is_some_and(|n| n.cgroup_ns.is_some()) {
        kinds.push(NsKind::Cgroup);
    }
    // Its PID namespace, for a proc mounted in it (but that on /proc,
    // the stub's).
    let pidns = if ns.is_some_and(|n| n.pid) {
        Some(
            std::fs::File::open(format!("/proc/{root}/ns/pid"))
                .map(std::os::fd::OwnedFd::from)
                .map_err(|e| {
                    RestoreError::from(ObjectError::Incompatible(format!(
                        "opening the PID namespace of the restored tree ({root}): {e}"
                    )))
                })?,
        )
    } else {
        None
    };
    kns::in_namespaces_of(root, &kinds, || -> Result<()> {
        use std::os::fd::AsFd;
        // Under a root of its own, the proc the stub mounted on /proc.
        if let Some(r) = mnt.root.as_ref().filter(|_| mnt.proc) {
            let at = before_pivot(Some(mnt), "/proc");
            kns::mount("/proc", &at, None, libc::MS_BIND, None).map_err(|e| {
                RestoreError::from(ObjectError::Incompatible(format!(
                    "making the tree's mount: binding its proc on /proc under its root {}: {e}",
                    r.source
                )))
            })?;
        }
        for l in &mnt.later {
            let fail = |what: &str| {
                let what = format!("{what} on {}", l.target);
                move |e: std::io::Error| {
                    RestoreError::from(ObjectError::Incompatible(format!(
                        "making the tree's mount: {what}: {e}"
                    )))
                }
            };
            if !l.target.starts_with('/') || l.target.split('/').any(|c| c == "..") {
                return Err(ObjectError::Inconsistent(format!("mount point {}", l.target)).into());
            }
            let target = before_pivot(Some(mnt), &l.target);
            if std::fs::symlink_metadata(&target).is_err() {
                std::fs::create_dir_all(&target).map_err(fail("making the mount point"))?;
            }
            let remount = |flags: u64| {
                kns::mount(
                    "none",
                    &target,
                    None,
                    libc::MS_REMOUNT | libc::MS_BIND | flags,
                    None,
                )
            };
            match &l.what {
                LaterKind::Tmpfs {
                    source,
                    options,
                    entries,
                }
                | LaterKind::Ramfs {
                    source,
                    options,
                    entries,
                }
                | LaterKind::Hugetlbfs {
                    source,
                    options,
                    entries,
                } => {
                    let fstype = match l.what {
                        LaterKind::Tmpfs { .. } => "tmpfs",
                        LaterKind::Ramfs { .. } => "ramfs",
                        _ => "hugetlbfs",
                    };
                    // (Images that predate a tmpfs's source have none.)
                    let source = if source.is_empty() && fstype == "tmpfs" {
                        "tmpfs"
                    } else {
                        source
                    };
                    kns::mount(
                        source,
                        &target,
                        Some(fstype),
                        l.flags & !libc::MS_RDONLY,
                        Some(options),
                    )
                    .map_err(fail(&format!("mounting a {fstype}")))?;
                    // A hugetlbfs's files are written a huge page at a time.
                    let page = if fstype == "hugetlbfs" {
                        let size = nix::sys::statfs::statfs(target.as_str())
                            .map_err(|e| fail("reading its huge page size")(e.into()))?
                            .block_size();
                        Some(u64::try_from(size).ok().filter(|&p| p > 0).ok_or_else(|| {
                            fail("reading its huge page size")(std::io::Error::from_raw_os_error(
                                libc::EINVAL,
                            ))
                        })?)
                    } else {
                        None
                    };
                    fill_entries(
                        std::path::Path::new(&target),
                        &l.target,
                        entries,
                        content,
                        page,
                    )?;
                    if l.flags & libc::MS_RDONLY != 0 {
                        remount(l.flags).map_err(fail(&format!("making a {fstype} read-only")))?;
                    }
                }
                LaterKind::Overlay {
                    source,
                    lowerdir,
                    upperdir,
                    workdir,
                    options,
                } => {
                    // Its directories, as the dumper saw them, are
                    // resolved here as a bind's source is.
                    let opts: Vec<String> = [
                        ("lowerdir", lowerdir),
                        ("upperdir", upperdir),
                        ("workdir", workdir),
                    ]
                    .into_iter()
                    .filter(|(_, v)| !v.is_empty())
                    .map(|(k, v)| format!("{k}={v}"))
                    .chain((!options.is_empty()).then(|| options.clone()))
                    .collect();
                    let opts = opts.join(",");
                    kns::mount(source, &target, Some("overlay"), l.flags, Some(&opts))
                        .map_err(fail(&format!(
                            "mounting an overlay ({opts}: its directories must be where they were at the dump)"
                        )))?;
                }
                LaterKind::Bind { source } => {
                    kns::mount(source, &target, None, libc::MS_BIND, None)
                        .map_err(fail(&format!("bind mount of {source}")))?;
                    if l.flags != 0 {
                        remount(l.flags).map_err(fail("remounting a bind mount"))?;
                    }
                }
                LaterKind::Fresh {
                    fstype,
                    source,
                    options,
                } => {
                    match pidns.as_ref().filter(|_| fstype == "proc") {
                        // A proc of the tree's PID namespace (the
                        // mounting thread's is the restorer's).
                        Some(ns) => {
                            kns::mount_proc_of(ns.as_fd(), source, &target, l.flags, options)
                        }
                        None => kns::mount(source, &target, Some(fstype), l.flags, Some(options)),
                    }
                    .map_err(fail(&format!("mounting a {fstype}")))?;
                }
            }
            // A slave that is shared too: made a slave first.
            for p in [libc::MS_SLAVE, libc::MS_SHARED, libc::MS_UNBINDABLE] {
                if l.propagation & p != 0 {
                    kns::mount("none", &target, None, p, None)
                        .map_err(fail("setting its propagation"))?;
                }
            }
        }
        if let Some(r) = &mnt.root {
            pivot(r)?;
        }
        Ok(())
    })?
}

/// Where the tree's mount on `target` is made before the tree pivots
/// into a root of its own (`mnt.root`): under the saved root's path;
/// else on `target`.
fn before_pivot(mnt: Option<&MountNamespace>, target: &str) -> String {
    match mnt.and_then(|m| m.root.as_ref()) {
        Some(r) if target == "/" => r.source.clone(),
        Some(r) => format!("{}{target}", r.source.trim_end_matches('/')),
        None => target.to_string(),
    }
}

/// From a thread in the tree's new mount namespace whose mounts are made
/// under the saved root (`r.source`): the root bound on itself with every
/// mount under it, pivoted into (the old root detached, as runc does), then
/// given its saved flags. Every process of the namespace (the root stub)
/// then has it as its `/`.
fn pivot(r: &BindMount) -> Result<()> {
    let fail = |what: &str| {
        let what = what.to_string();
        let at = r.source.clone();
        move |e: std::io::Error| {
            RestoreError::from(ObjectError::Incompatible(format!(
                "making the tree's root of its own, {at}: {what}: {e} (its root file system must be mounted there, as at the dump)"
            )))
        }
    };
    if !r.source.starts_with('/') || r.source.split('/').any(|c| c == "..") {
        return Err(ObjectError::Inconsistent(format!("root directory {}", r.source)).into());
    }
    kns::mount(
        &r.source,
        &r.source,
        None,
        libc::MS_BIND | libc::MS_REC,
        None,
    )
    .map_err(fail("binding it on itself"))?;
    kns::pivot_root_into(&r.source).map_err(fail("pivot_root into it"))?;
    if r.flags != 0 {
        kns::mount(
            "none",
            "/",
            None,
            libc::MS_REMOUNT | libc::MS_BIND | r.flags,
            None,
        )
        .map_err(fail("remounting it with its flags"))?;
    }
    Ok(())
}

/// Gives the credentials of every process of a tree in a user namespace
/// of its own as that namespace has them (the image has them as the
/// dumper saw them; the processes set them from inside).
pub(crate) fn creds_inside(m: &mut Manifest) -> Result<()> {
    let Some(u) = m.namespaces.as_ref().and_then(|n| n.user.clone()) else {
        return Ok(());
    };
    if u.uid_map.is_empty() && u.gid_map.is_empty() {
        return creds_unmapped(m, &own_ids());
    }
    for p in &mut m.processes {
        let pid = p.pid;
        let map = |ids: &mut [u32], table: &[[u32; 3]], what: &str| -> Result<()> {
            for id in ids {
                *id = UserNamespace::inside(table, *id).ok_or_else(|| {
                    RestoreError::from(ObjectError::Inconsistent(format!(
                        "process {pid} has the {what} {id}, not mapped in its user namespace"
                    )))
                })?;
            }
            Ok(())
        };
        let c = &mut p.creds;
        map(&mut c.uid, &u.uid_map, "uid")?;
        map(&mut c.gid, &u.gid_map, "gid")?;
        if !c.groups_fixed {
            map(&mut c.groups, &u.gid_map, "group")?;
        }
    }
    Ok(())
}

/// The restorer's ids: real, effective, saved, and groups (a stub starts
/// with them).
struct OwnIds {
    uid: [u32; 3],
    gid: [u32; 3],
    groups: Vec<u32>,
}

fn own_ids() -> OwnIds {
    let (u, g) = (nix::unistd::getresuid(), nix::unistd::getresgid());
    let (uid, gid) = match (u, g) {
        (Ok(u), Ok(g)) => (
            [u.real, u.effective, u.saved].map(|i| i.as_raw()),
            [g.real, g.effective, g.saved].map(|i| i.as_raw()),
        ),
        _ => ([u32::MAX; 3], [u32::MAX; 3]),
    };
    let mut groups: Vec<u32> = nix::unistd::getgroups()
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.as_raw())
        .collect();
    groups.sort_unstable();
    OwnIds { uid, gid, groups }
}

/// A user namespace without id maps (made, its maps never written): no
/// id can be set in it, so its processes keep those they had when it was
/// made, and the restore makes it as itself (the root stub `clone3`d with
/// `CLONE_NEWUSER`): each process must have the restorer's ids and
/// groups, as the image has them (seen from outside), and they are left
/// as they are (with the restorer's, root: nothing to set).
fn creds_unmapped(m: &mut Manifest, own: &OwnIds) -> Result<()> {
    for p in m.processes.iter_mut().filter(|p| p.zombie.is_none()) {
        let c = &mut p.creds;
        let mut groups = c.groups.clone();
        groups.sort_unstable();
        let same = c.uid[..3] == own.uid
            && c.uid[3] == own.uid[1]
            && c.gid[..3] == own.gid
            && c.gid[3] == own.gid[1]
            && groups == own.groups;
        if !same || own.uid != [0; 3] || own.gid != [0; 3] {
            return Err(ObjectError::Incompatible(format!(
                "process {} is in a user namespace without id maps with uids {:?}, gids {:?} and groups {:?}: no id can be set in such a namespace, and the restore makes it as the restorer (uids {:?}, gids {:?}, groups {:?}); restore it as root with the same groups",
                p.pid, c.uid, c.gid, c.groups, own.uid, own.gid, own.groups
            ))
            .into());
        }
        c.groups_fixed = true;
    }
    Ok(())
}

/// Once the root stub (`root`, as stasis sees it) exists in its new
/// namespaces: puts back the content of its tmpfs mounts, brings their
/// loopback up if it was, makes its veths and routes again, and moves the calling
/// thread into the new network namespace (until the guard is dropped), so
/// that the sockets it makes for the tree are there.
pub(crate) fn after_spawn(
    m: &Manifest,
    root: i32,
    content: &stasis_image::ContentSource,
) -> Result<Option<kns::NetnsGuard>> {
    fill_tmpfs(m, root, content)?;
    later_mounts(m, root, content)?;
    let Some(net) = m.namespaces.as_ref().and_then(|n| n.net.as_ref()) else {
        return Ok(None);
    };
    if net.lo_up {
        kns::in_namespaces_of(root, &[NsKind::Net], kns::set_loopback_up)??;
    }
    net_devices(net, root)?;
    Ok(Some(kns::NetnsGuard::enter(root)?))
}

fn step(what: impl Into<String>) -> impl FnOnce(stasis_kernel::KernelError) -> RestoreError {
    let what = what.into();
    move |source| RestoreError::from(ObjectError::Step { what, source })
}

/// Before anything is made: the host end of each saved veth must be free
/// here (in the restorer's network namespace, where it is made again under
/// its old name), and the bridge it was a port of must exist.
pub(crate) fn check_net(m: &Manifest) -> Result<()> {
    let Some(net) = m.namespaces.as_ref().and_then(|n| n.net.as_ref()) else {
        return Ok(());
    };
    if net.veths.is_empty() {
        return Ok(());
    }
    let links = Rtnl::open().and_then(|mut nl| nl.links()).map_err(step(
        "listing the interfaces of the restorer's network namespace",
    ))?;
    for v in &net.veths {
        if let Some(l) = links.iter().find(|l| l.name == v.peer.name) {
            return Err(ObjectError::Incompatible(format!(
                "the tree's veth {} had its peer {} in the dumper's network namespace, and an interface named {} (a {} device) exists here: remove it (ip link del {}) or restore where the name is free",
                v.inside.name,
                v.peer.name,
                l.name,
                l.kind.as_deref().unwrap_or("physical"),
                l.name
            ))
            .into());
        }
        if let Some(b) = &v.master {
            let bridge = links.iter().find(|l| &l.name == b);
            if bridge.is_none_or(|l| l.kind.as_deref() != Some("bridge")) {
                return Err(ObjectError::Incompatible(format!(
                    "the peer {} of the tree's veth {} was a port of the bridge {b}, and there is no bridge {b} here: make it (ip link add {b} type bridge) before the restore",
                    v.peer.name, v.inside.name
                ))
                .into());
            }
        }
    }
    Ok(())
}

/// `a` as rtnetlink takes it, on interface `index`; an IPv6 address is
/// given without duplicate address detection (it was the tree's: left
/// tentative, it could not be bound at once).
fn addr_of(a: &NetAddress, index: u32) -> rtnl::Addr {
    let mut flags = a.flags & (rtnl::IFA_F_NODAD | rtnl::IFA_F_NOPREFIXROUTE);
    if a.addr.is_ipv6() {
        flags |= rtnl::IFA_F_NODAD;
    }
    rtnl::Addr {
        index,
        addr: a.addr,
        prefix: a.prefix,
        broadcast: a.broadcast.filter(std::net::IpAddr::is_ipv4),
        flags,
        scope: a.scope,
        peer: a.peer,
    }
}

/// The addresses of an interface (once it is up: an IPv6 address added
/// before is made ready with the link, and the kernel may then not make
/// the route to its point-to-point peer) in the order to add them so that the
/// kernel lists them as it did: IPv4 ones in their order (each added
/// after the others), then IPv6 ones from the last (each added before the
/// others of its scope).
fn making_order(addrs: &[NetAddress]) -> impl Iterator<Item = &NetAddress> {
    let v4 = addrs.iter().filter(|a| a.addr.is_ipv4());
    let v6 = addrs.iter().rev().filter(|a| a.addr.is_ipv6());
    v4.chain(v6)
}

/// Makes the tree's veths again, before its sockets (a connection bound
/// to an address of one needs that address): each pair from the
/// restorer's namespace, its peer under its old name there (on its bridge,
/// with its addresses, up if it was), its other end in the tree's new
/// namespace (`root`'s) with its name, hardware address, MTU, addresses
/// and up state; its tun and tap devices ([`make_tun`]) with the same;
/// then the namespace's routes.
fn net_devices(net: &NetNamespace, root: i32) -> Result<()> {
    if net.veths.is_empty()
        && net.routes.is_empty()
        && net.tuns.is_empty()
        && net.rules.is_empty()
        && net.links.is_empty()
        && net.nexthops.is_empty()
    {
        return Ok(());
    }
    let spec = |i: &NetInterface| rtnl::LinkSpec {
        name: i.name.clone(),
        mac: i.mac.clone(),
        mtu: i.mtu,
    };
    let tree_ns = kns::open_net_of(root)?;
    let mut nl = Rtnl::open().map_err(step("opening a route netlink socket"))?;
    for v in &net.veths {
        nl.add_veth(&spec(&v.peer), &spec(&v.inside), tree_ns.as_fd())
            .map_err(step(format!(
                "making the tree's veth {} and its peer {}",
                v.inside.name, v.peer.name
            )))?;
    }
    let links = nl
        .links()
        .map_err(step("listing the restorer's interfaces"))?;
    let index = |links: &[rtnl::Link], name: &str| {
        links
            .iter()
            .find(|l| l.name == name)
            .map(|l| l.index)
            .ok_or_else(|| {
                RestoreError::from(ObjectError::Incompatible(format!(
                    "the interface {name} is missing right after it was made"
                )))
            })
    };
    for v in &net.veths {
        let peer = index(&links, &v.peer.name)?;
        let master = match &v.master {
            Some(b) => Some(index(&links, b)?),
            None => None,
        };
        nl.set_link(peer, master, v.peer.up).map_err(step(format!(
            "attaching {} to its bridge and bringing it up",
            v.peer.name
        )))?;
        for a in making_order(&v.peer.addrs) {
            nl.add_addr(&addr_of(a, peer))
                .map_err(step(format!("giving {} its address", v.peer.name)))?;
        }
    }
    kns::in_namespaces_of(root, &[NsKind::Net], || -> Result<()> {
        for t in &net.tuns {
            make_tun(t)?;
        }
        make_links(&net.links)?;
        let mut nl = Rtnl::open().map_err(step("opening a route netlink socket"))?;
        let links = nl
            .links()
            .map_err(step("listing the interfaces of the tree's namespace"))?;
        // The ports of its bridges first, in their numbers' order (a
        // bridge numbers a new port with the lowest free number).
        let mut ports: Vec<&NetInterface> = net
            .veths
            .iter()
            .map(|v| &v.inside)
            .chain(net.tuns.iter().map(|t| &t.iface))
            .chain(net.links.iter().map(|l| &l.iface))
            .filter(|i| i.master.is_some())
            .collect();
        ports.sort_by_key(|i| i.port_no.unwrap_or(u16::MAX));
        for p in ports {
            let i = index(&links, &p.name)?;
            nl.set_link(i, master_index(&links, p)?, p.up)
                .map_err(step(format!("attaching {} to its bridge", p.name)))?;
        }
        for v in &net.veths {
            let i = index(&links, &v.inside.name)?;
            let master = master_index(&links, &v.inside)?;
            nl.set_link(i, master, v.inside.up)
                .map_err(step(format!("bringing {} up", v.inside.name)))?;
            for a in making_order(&v.inside.addrs) {
                nl.add_addr(&addr_of(a, i))
                    .map_err(step(format!("giving {} its address", v.inside.name)))?;
            }
        }
        for t in &net.tuns {
            let d = &t.iface;
            let i = index(&links, &d.name)?;
            // A tun (layer 3) has no hardware address.
            let mac = if t.flags & u32::from(tun_abi::IFF_TAP) != 0 {
                &d.mac[..]
            } else {
                &[]
            };
            nl.set_mtu_mac(i, d.mtu, mac).map_err(step(format!(
                "giving the tun device {} its MTU and hardware address",
                d.name
            )))?;
            nl.set_link(i, master_index(&links, d)?, d.up)
                .map_err(step(format!("bringing {} up", d.name)))?;
            for a in making_order(&d.addrs) {
                nl.add_addr(&addr_of(a, i))
                    .map_err(step(format!("giving {} its address", d.name)))?;
            }
        }
        for l in &net.links {
            let d = &l.iface;
            let i = index(&links, &d.name)?;
            nl.set_link(i, master_index(&links, d)?, d.up)
                .map_err(step(format!("bringing {} up", d.name)))?;
        }
        for l in &net.links {
            let d = &l.iface;
            let i = index(&links, &d.name)?;
            // A bridge takes its ports' smallest MTU and an address of
            // one unless given its own once they are its ports.
            if l.kind == "bridge" {
                nl.set_mtu_mac(i, d.mtu, &d.mac).map_err(step(format!(
                    "giving the bridge {} its MTU and hardware address",
                    d.name
                )))?;
            }
            for a in making_order(&d.addrs) {
                nl.add_addr(&addr_of(a, i))
                    .map_err(step(format!("giving {} its address", d.name)))?;
            }
        }
        // The next-hop objects, once their interfaces are up with their
        // addresses (a gateway is checked reachable), groups last.
        let mut objects: Vec<&NetNexthopObject> = net.nexthops.iter().collect();
        objects.sort_by_key(|n| n.attrs.iter().any(|a| a.kind == rtnl::NHA_GROUP));
        for n in objects {
            let mut attrs: Vec<rtnl::RawAttr> = n.attrs.iter().map(raw_attr).collect();
            if let Some(d) = &n.dev {
                attrs.push(rtnl::RawAttr {
                    kind: rtnl::NHA_OIF,
                    value: index(&links, d)?.to_ne_bytes().to_vec(),
                });
            }
            encap_devs(&mut attrs, rtnl::NHA_ENCAP, &n.encap_devs, &links)?;
            let object = rtnl::NexthopObject {
                family: n.family,
                // The kernel works it out (and refuses one given).
                scope: 0,
                protocol: n.protocol,
                flags: n.flags & u32::from(rtnl::RTNH_F_ONLINK),
                attrs,
            };
            nl.add_nexthop(&object).map_err(step(format!(
                "making the next-hop object {} of the tree's network namespace",
                object.id().unwrap_or(0)
            )))?;
        }
        // Routes through a gateway after those that make it reachable.
        let mut routes: Vec<&NetRoute> = net.routes.iter().collect();
        routes.sort_by_key(|r| {
            r.gateway.is_some()
                || !r.nexthops.is_empty()
                || r.attrs.iter().any(|a| a.kind == rtnl::RTA_VIA)
        });
        for r in routes {
            let mut attrs: Vec<rtnl::RawAttr> = r
                .attrs
                .iter()
                .filter(|a| rtnl::ROUTE_RAW_ATTRS.contains(&a.kind))
                .map(raw_attr)
                .collect();
            encap_devs(&mut attrs, rtnl::RTA_ENCAP, &r.encap_devs, &links)?;
            let oif = match &r.dev {
                Some(d) => Some(index(&links, d)?),
                None => None,
            };
            let mut nexthops = Vec::new();
            for h in &r.nexthops {
                let mut attrs: Vec<rtnl::RawAttr> = h.attrs.iter().map(raw_attr).collect();
                encap_devs(&mut attrs, rtnl::RTA_ENCAP, &h.encap_devs, &links)?;
                nexthops.push(rtnl::NextHop {
                    gateway: h.gateway,
                    oif: match &h.dev {
                        Some(d) => index(&links, d)?,
                        None => 0,
                    },
                    hops: h.hops,
                    flags: h.flags & rtnl::RTNH_F_ONLINK,
                    attrs,
                });
            }
            let route = rtnl::Route {
                family: r.family,
                table: r.table,
                dst: r.dst,
                dst_len: r.dst_len,
                gateway: r.gateway,
                oif,
                priority: r.metric,
                prefsrc: r.prefsrc,
                protocol: r.protocol,
                scope: r.scope,
                kind: r.kind,
                nexthops,
                flags: r.flags & u32::from(rtnl::RTNH_F_ONLINK),
                attrs,
                src: r.src,
                src_len: r.src_len,
                nhid: r.nhid,
            };
            let dst = r
                .dst
                .map_or("default".to_string(), |d| format!("{d}/{}", r.dst_len));
            nl.add_route(&route).map_err(step(format!(
                "adding the route to {dst} (table {}) of the tree's network namespace",
                r.table
            )))?;
        }
        net_rules(&mut nl, &net.rules)?;
        Ok(())
    })??;
    Ok(())
}

/// Gives the interfaces the encapsulation (attribute `encap_attr` of
/// `attrs`) names, `devs`, their indexes in the tree's new namespace
/// (`links`).
fn encap_devs(
    attrs: &mut [rtnl::RawAttr],
    encap_attr: u16,
    devs: &[EncapDev],
    links: &[rtnl::Link],
) -> Result<()> {
    for d in devs {
        let Some(i) = links.iter().find(|l| l.name == d.dev).map(|l| l.index) else {
            return Err(ObjectError::Incompatible(format!(
                "the interface {} an encapsulation names is missing right after it was made",
                d.dev
            ))
            .into());
        };
        let encap = attrs.iter_mut().find(|a| a.kind == encap_attr);
        if !encap.is_some_and(|a| rtnl::set_u32_attr(&mut a.value, d.kind, i)) {
            return Err(ObjectError::Incompatible(format!(
                "the saved encapsulation has no interface attribute {} for {}",
                d.kind, d.dev
            ))
            .into());
        }
    }
    Ok(())
}

fn raw_attr(a: &NetAttr) -> rtnl::RawAttr {
    rtnl::RawAttr {
        kind: a.kind,
        value: a.value.clone(),
    }
}

/// The index (in `links`) of the bridge `i` was a port of.
fn master_index(links: &[rtnl::Link], i: &NetInterface) -> Result<Option<u32>> {
    let Some(m) = &i.master else {
        return Ok(None);
    };
    match links.iter().find(|l| &l.name == m) {
        Some(l) => Ok(Some(l.index)),
        None => Err(ObjectError::Incompatible(format!(
            "the bridge {m} of {} is missing right after it was made",
            i.name
        ))
        .into()),
    }
}

/// Makes the interfaces made inside the tree's namespace (`links`) in
/// the calling thread's (its new one), down, each with its name, hardware
/// address, MTU, queue length, lower device and configuration.
fn make_links(links: &[NetLink]) -> Result<()> {
    if links.is_empty() {
        return Ok(());
    }
    let spec = |i: &NetInterface| rtnl::LinkSpec {
        name: i.name.clone(),
        mac: i.mac.clone(),
        mtu: i.mtu,
    };
    let new = |l: &NetLink, link: Option<u32>, data: Vec<rtnl::RawAttr>| rtnl::NewLink {
        spec: spec(&l.iface),
        kind: l.kind.clone(),
        txqlen: l.txqlen,
        link,
        info_data: data,
    };
    let raw = |l: &NetLink| -> Vec<rtnl::RawAttr> {
        l.data
            .iter()
            .map(|a| rtnl::RawAttr {
                kind: a.kind,
                value: a.value.clone(),
            })
            .collect()
    };
    let what = |l: &NetLink| format!("making the {} interface {}", l.kind, l.iface.name);
    let mut nl = Rtnl::open().map_err(step("opening a route netlink socket"))?;
    let here = std::fs::File::open("/proc/thread-self/ns/net").map_err(|e| {
        step("opening the tree's network namespace")(stasis_kernel::KernelError::Io {
            what: "open /proc/thread-self/ns/net".into(),
            source: e,
        })
    })?;
    let mut made: Vec<&str> = Vec::new();
    // In their order (the kernel's, by index), so that each gets its old
    // index where the namespace's other interfaces allow it; a lower
    // device is older than the devices on it.
    for l in links {
        let lower = |nl: &mut Rtnl| -> Result<u32> {
            let name = l.link.as_deref().unwrap_or_default();
            let now = nl
                .links()
                .map_err(step("listing the interfaces of the tree's namespace"))?;
            now.iter()
                .find(|x| x.name == name)
                .map(|x| x.index)
                .ok_or_else(|| {
                    ObjectError::Incompatible(format!(
                        "the lower device {name} of the tree's {} {} is missing",
                        l.kind, l.iface.name
                    ))
                    .into()
                })
        };
        match l.kind.as_str() {
            "bridge" | "ifb" => nl.add_link(&new(l, None, raw(l))),
            "macvlan" => {
                let i = lower(&mut nl)?;
                let mut data = raw(l);
                // A source-mode macvlan's list of source addresses is
                // taken at its making with IFLA_MACVLAN_MACADDR_MODE set.
                if data.iter().any(|a| a.kind == IFLA_MACVLAN_MACADDR_DATA) {
                    data.push(rtnl::RawAttr {
                        kind: rtnl::IFLA_MACVLAN_MACADDR_MODE,
                        value: rtnl::MACVLAN_MACADDR_SET.to_ne_bytes().to_vec(),
                    });
                }
                nl.add_link(&new(l, Some(i), data))
            }
            "vxlan" => {
                let mut data = raw(l);
                if l.link.is_some() {
                    data.push(rtnl::RawAttr {
                        kind: 3, // IFLA_VXLAN_LINK
                        value: lower(&mut nl)?.to_ne_bytes().to_vec(),
                    });
                }
                nl.add_link(&new(l, None, data))
            }
            "veth" if !made.contains(&l.iface.name.as_str()) => {
                let peer = links
                    .iter()
                    .find(|p| Some(&p.iface.name) == l.link.as_ref() && p.kind == "veth");
                let Some(peer) = peer else {
                    return Err(ObjectError::Incompatible(format!(
                        "the tree's veth {} has no saved peer",
                        l.iface.name
                    ))
                    .into());
                };
                made.push(&peer.iface.name);
                // The peer is registered first: this end (listed first,
                // the older) is made as the peer.
                let mut v = nl.add_veth(&spec(&peer.iface), &spec(&l.iface), here.as_fd());
                if v.is_ok() {
                    // The pair is made with one queue length.
                    if let Ok(all) = nl.links() {
                        for (x, q) in [(&l.iface.name, l.txqlen), (&peer.iface.name, peer.txqlen)] {
                            if let Some(i) = all.iter().find(|a| &a.name == x) {
                                v = v.and(nl.set_txqlen(i.index, q));
                            }
                        }
                    }
                }
                v
            }
            _ => Ok(()),
        }
        .map_err(step(what(l)))?;
    }
    Ok(())
}

/// Gives the calling thread's network namespace (the tree's new one) the
/// policy routing rules `saved` (none: it keeps the kernel's): removes
/// each of its rules that is not saved (a kernel rule the tree had
/// removed), then adds each saved rule it lacks, in their order.
fn net_rules(nl: &mut Rtnl, saved: &[NetRule]) -> Result<()> {
    if saved.is_empty() {
        return Ok(());
    }
    let saved: Vec<rtnl::Rule> = saved
        .iter()
        .map(|r| rtnl::Rule {
            family: r.family,
            dst_len: r.dst_len,
            src_len: r.src_len,
            tos: r.tos,
            table: r.table,
            action: r.action,
            flags: r.flags,
            attrs: r
                .attrs
                .iter()
                .map(|a| rtnl::RawAttr {
                    kind: a.kind,
                    value: a.value.clone(),
                })
                .collect(),
        })
        .collect();
    let now = nl
        .rules()
        .map_err(step("listing the routing rules of the tree's namespace"))?;
    for r in now.iter().filter(|r| !saved.contains(r)) {
        nl.del_rule(r)
            .map_err(step("removing a routing rule the tree had not"))?;
    }
    for r in saved.iter().filter(|r| !now.contains(r)) {
        nl.add_rule(r).map_err(step(
            "adding a routing rule of the tree's network namespace",
        ))?;
    }
    Ok(())
}

/// Makes tun or tap device `t` in the calling thread's network namespace
/// (the tree's): `TUNSETIFF` with its name and flags from a new fd on
/// `/dev/net/tun`, persistent (so that it outlives that fd until the
/// tree's fds attach to it: `stasis_objects::tun` makes a device that was
/// not persistent so again), with its owner and group.
fn make_tun(t: &TunDevice) -> Result<()> {
    let name = &t.iface.name;
    let what = |s: &str| format!("{s} the tun device {name}");
    let io = |w: String, op: &'static str| {
        move |source: std::io::Error| {
            step(w)(stasis_kernel::KernelError::Io {
                what: op.into(),
                source,
            })
        }
    };
    let fd = tun::open(0).map_err(io(what("opening /dev/net/tun to make"), "open"))?;
    let flags = u16::try_from(t.flags).unwrap_or(0) & tun_abi::TUN_SET_FLAGS;
    tun::set_iff(fd.as_fd(), name, flags).map_err(io(what("making"), "TUNSETIFF"))?;
    tun::set_persist(fd.as_fd(), true).map_err(io(what("making persistent"), "TUNSETPERSIST"))?;
    if let Some(uid) = t.owner {
        tun::set_owner(fd.as_fd(), uid).map_err(io(what("giving its owner to"), "TUNSETOWNER"))?;
    }
    if let Some(gid) = t.group {
        tun::set_group(fd.as_fd(), gid).map_err(io(what("giving its group to"), "TUNSETGROUP"))?;
    }
    Ok(())
}

/// Runs `f` in the IPC namespace of the tree (whose root is `root` as
/// stasis sees it) if it has one of its own, else here.
pub(crate) fn in_ipc<T: Send>(m: &Manifest, root: i32, f: impl FnOnce() -> T + Send) -> Result<T> {
    if m.namespaces.as_ref().is_some_and(|n| n.ipc) {
        Ok(kns::in_namespaces_of(root, &[NsKind::Ipc], f)?)
    } else {
        Ok(f())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn userns() -> UserNamespace {
        UserNamespace {
            uid_map: vec![[0, 100_000, 1000], [1000, 5000, 10]],
            gid_map: vec![[0, 200_000, 65536]],
            setgroups_deny: true,
        }
    }

    #[test]
    fn ids_are_mapped_inside_by_their_line() {
        let u = userns();
        assert_eq!(UserNamespace::inside(&u.uid_map, 100_000), Some(0));
        assert_eq!(UserNamespace::inside(&u.uid_map, 100_999), Some(999));
        assert_eq!(UserNamespace::inside(&u.uid_map, 101_000), None);
        assert_eq!(UserNamespace::inside(&u.uid_map, 5003), Some(1003));
        assert_eq!(UserNamespace::inside(&u.uid_map, 0), None);
    }

    #[test]
    fn mount_options_get_the_ids_inside() {
        let u = userns();
        assert_eq!(
            options_inside("size=4k,uid=100005,gid=200006,mode=755", Some(&u)).unwrap(),
            "size=4k,uid=5,gid=6,mode=755"
        );
        assert!(options_inside("uid=7", Some(&u)).is_err());
        assert_eq!(options_inside("uid=7", None).unwrap(), "uid=7");
    }

    /// A manifest of one process in the user namespace `user`.
    fn one_process_in(user: UserNamespace) -> Manifest {
        Manifest {
            checkpoint: 1,
            parent: None,
            tool_version: String::new(),
            created_unix: 0,
            host: Default::default(),
            root_pid: 1,
            processes: vec![crate::testutil::image(1, 0, 1, 1)],
            stats: Default::default(),
            pipes: Vec::new(),
            ghosts: Vec::new(),
            sysv_shm: Vec::new(),
            shm_files: Vec::new(),
            cut: None,
            namespaces: Some(Namespaces {
                user: Some(user),
                ..Default::default()
            }),
            shell_job: None,
            content: None,
            cgroups: None,
        }
    }

    #[test]
    fn credentials_are_given_as_inside_fixed_groups_left() {
        let mut m = one_process_in(userns());
        let c = &mut m.processes[0].creds;
        c.uid = [100_001, 100_001, 5000, 100_000];
        c.gid = [200_000; 4];
        c.groups = vec![12345];
        c.groups_fixed = true;
        creds_inside(&mut m).unwrap();
        let c = &m.processes[0].creds;
        assert_eq!(c.uid, [1, 1, 1000, 0]);
        assert_eq!(c.gid, [0; 4]);
        assert_eq!(c.groups, vec![12345]);
        m.processes[0].creds.uid[0] = 7;
        assert!(creds_inside(&mut m).is_err());
    }

    #[test]
    fn credentials_in_a_namespace_without_maps_must_be_the_restorers() {
        let mut m = one_process_in(UserNamespace::default());
        let root = OwnIds {
            uid: [0; 3],
            gid: [0; 3],
            groups: vec![0],
        };
        m.processes[0].creds.groups = vec![0];
        creds_unmapped(&mut m, &root).unwrap();
        let c = &m.processes[0].creds;
        assert_eq!((c.uid, c.gid), ([0; 4], [0; 4]));
        assert!(c.groups_fixed);
        // Another group, another uid, or a restorer that is not root.
        m.processes[0].creds.groups = vec![0, 10];
        assert!(creds_unmapped(&mut m, &root).is_err());
        m.processes[0].creds.groups = vec![0];
        m.processes[0].creds.uid[2] = 1000;
        assert!(creds_unmapped(&mut m, &root).is_err());
        m.processes[0].creds.uid = [1000; 4];
        m.processes[0].creds.gid = [1000; 4];
        let user = OwnIds {
            uid: [1000; 3],
            gid: [1000; 3],
            groups: vec![0],
        };
        assert!(creds_unmapped(&mut m, &user).is_err());
    }
}
