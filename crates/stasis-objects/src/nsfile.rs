//! An fd on a namespace file (`/proc/PID/ns/net`...: `/proc` shows
//! `net:[INODE]`), saved as its namespace's type and inode and whose it
//! is ([`NsFileOf`]):
//! - the holder's own (the tree's): reopened from the restored tree's
//!   (`/proc/ROOT/ns/TYPE`, a new namespace if the tree had one of its own
//!   of that type; else the restorer's, which must be that very namespace);
//! - the dumper's, held by a tree with a namespace of its own of that type
//!   (opened before an `unshare`, say): reopened from the restorer's own,
//!   which must be that very namespace;
//! - one bound to a path the dumper sees (an `nsfs` mount, as `ip netns
//!   add` makes under `/run/netns`): reopened from the path, which must
//!   hold a namespace of that type.
//!
//! Any other (a namespace only another process outside the tree is in) is
//! refused at the dump: nothing names it for the restore.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use stasis_image::manifest::{FdImage, FdKind, NsFileOf};

use crate::error::file_err;
use crate::restore::{open_with_mode, reopen_flags};
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// A namespace file.
pub struct NsFile;

/// The namespace types `/proc/PID/ns` has.
const KINDS: &[&str] = &["net", "mnt", "uts", "ipc", "pid", "user", "cgroup", "time"];

/// `(type, inode)` of a namespace link (`net:[4026531833]`).
pub(crate) fn parse(link: &str) -> Option<(&str, u64)> {
    let (kind, rest) = link.split_once(":[")?;
    let ino = rest.strip_suffix(']')?.parse().ok()?;
    KINDS.contains(&kind).then_some((kind, ino))
}

impl Object for NsFile {
    const NAME: &'static str = "namespace file";

    fn save(_: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        let (kind, ino) = match parse(fd.link) {
            Some(k) => k,
            // Opened through the path a namespace is bound to (`ip netns
            // add`'s /run/netns/NAME): that mount's root names it.
            // (Only a path on the namespace file system: every other fd of
            // the frozen tree is asked this, so no mountinfo read for them.)
            None if !fd.link.starts_with('/') || !is_nsfs(fd.meta) => return Ok(None),
            None => match nsfs_mounts().into_iter().find(|(_, at)| at == fd.link) {
                Some((root, at)) => {
                    let Some((kind, ino)) = parse(&root) else {
                        return Ok(None);
                    };
                    return Ok(Some(FdKind::NsFile {
                        kind: kind.to_string(),
                        ino,
                        of: NsFileOf::Path(at),
                    }));
                }
                _ => return Ok(None),
            },
        };
        let ino_of = |path: String| std::fs::metadata(path).map(|m| m.ino()).ok();
        // The dumper's own, as it was before any thread of it entered the
        // tree's.
        let dumpers = stasis_kernel::ns::NsKind::ALL
            .into_iter()
            .find(|k| k.name() == kind)
            .and_then(stasis_kernel::ns::own_ns_id);
        let of = if ino_of(format!("/proc/{}/ns/{kind}", fd.pid)) == Some(ino) {
            NsFileOf::Own
        } else if dumpers == Some(ino) {
            NsFileOf::Dumper
        } else if let Some(path) = bound_at(fd.link) {
            NsFileOf::Path(path)
        } else {
            return Err(fd.unsupported(format!(
                "fd {} is the file of a {kind} namespace ({}) that is neither the process's own nor the dumper's, and that no path of the dumper's mounts binds (as `ip netns add` does): nothing would name it at the restore",
                fd.fd, fd.link
            )));
        };
        Ok(Some(FdKind::NsFile {
            kind: kind.to_string(),
            ino,
            of,
        }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::NsFile { .. })
    }

    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::NsFile { kind, ino, of } = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let what = format!("fd {} ({kind}:[{ino}])", img.fd);
        // The restorer's own (a thread of it may be in the tree's network
        // namespace by now): the one it started in, kept open.
        let mine = match cx.home_ns.iter().find(|(k, _)| k == kind) {
            Some((_, f)) => format!("/proc/self/fd/{}", f.as_raw_fd()),
            None => format!("/proc/self/ns/{kind}"),
        };
        let path = match (of, cx.ns_of) {
            (NsFileOf::Own, Some(root)) => format!("/proc/{root}/ns/{kind}"),
            (NsFileOf::Own | NsFileOf::Dumper, _) => mine.clone(),
            (NsFileOf::Path(p), _) => p.clone(),
        };
        let f = open_with_mode(
            std::fs::OpenOptions::new().custom_flags(reopen_flags(img.flags)),
            &path,
            img.flags,
        )
        .map_err(file_err(path.clone(), what.clone(), "open"))?;
        let got = f
            .metadata()
            .map_err(file_err(path.clone(), what.clone(), "fstat"))?
            .ino();
        // What the path holds now: the root of the nsfs mount there, or
        // the namespace the fd's link names.
        let link = match of {
            NsFileOf::Path(p) => nsfs_mounts()
                .into_iter()
                .find_map(|(root, at)| (&at == p).then_some(root))
                .unwrap_or_else(|| "no namespace bound there".into()),
            _ => std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
                .map(|l| l.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        if parse(&link).map(|(k, _)| k) != Some(kind.as_str()) {
            return Err(RestoreError::Inconsistent(format!(
                "{what} was bound at {path}, which now holds {link:?}, not a {kind} namespace"
            )));
        }
        // The restorer's own namespace stands for the dumper's (and the
        // tree's, when the tree had none of its own): it must be that
        // very namespace, or restoring would silently change it.
        let restorers = std::fs::metadata(&mine).map(|m| m.ino()).ok();
        if got != *ino && restorers == Some(got) && !matches!(of, NsFileOf::Path(_)) {
            return Err(RestoreError::Inconsistent(format!(
                "{what} was the {} {kind} namespace, and the restorer's is {kind}:[{got}]: restore from the namespaces the tree was dumped in",
                if *of == NsFileOf::Dumper { "dumper's" } else { "process's own" }
            )));
        }
        Ok(f.into())
    }
}

/// Where the dumper's mount namespace binds the namespace `link`
/// (`net:[INODE]`): the mount point of an `nsfs` mount of it.
fn bound_at(link: &str) -> Option<String> {
    nsfs_mounts()
        .into_iter()
        .find_map(|(root, at)| (root == link).then_some(at))
}

/// The `nsfs` mounts of the dumper's mount namespace: (the namespace, as
/// `net:[INODE]`, its mount point).
fn nsfs_mounts() -> Vec<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (a, b) = l.split_once(" - ")?;
            let f: Vec<&str> = a.split_whitespace().collect();
            (b.split_whitespace().next() == Some("nsfs"))
                .then(|| Some((f.get(3)?.to_string(), unescape(f.get(4)?))))
                .flatten()
        })
        .collect()
}

/// Whether `meta` (of a file) is of the namespace file system (its
/// device, read once).
fn is_nsfs(meta: &std::fs::Metadata) -> bool {
    static NSFS: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let dev = NSFS.get_or_init(|| std::fs::metadata("/proc/self/ns/net").ok().map(|m| m.dev()));
    *dev == Some(meta.dev())
}

/// A mountinfo path with its octal escapes (`\040` for a space) undone.
fn unescape(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let digits = std::str::from_utf8(&b[i + 1..i + 4]).ok();
            if let Some(v) = digits.and_then(|d| u8::from_str_radix(d, 8).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape("/run/netns/a\\040b"), "/run/netns/a b");
        assert_eq!(unescape("/x\\134y"), "/x\\y");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/bad\\9z"), "/bad\\9z");
        assert_eq!(parse("net:[4026531840]"), Some(("net", 4026531840)));
        assert_eq!(parse("pipe:[12]"), None);
    }
}
