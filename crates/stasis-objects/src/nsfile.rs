//! An fd on a namespace file (`/proc/PID/ns/net`...: `/proc` shows
//! `net:[INODE]`). Stasis restores a tree into its own namespaces, so such
//! an fd is saved as its namespace's type and inode, and reopened at
//! restore from the restorer's own `/proc/self/ns/TYPE`, which must be
//! that very namespace (its inode says so); any other is refused at dump
//! (a namespace that is not the holder's own) or at restore (the
//! restorer's is another one, so restoring would silently change it).

use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use stasis_image::manifest::{FdImage, FdKind};

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
        let Some((kind, ino)) = parse(fd.link) else {
            return Ok(None);
        };
        let own = std::fs::metadata(format!("/proc/{}/ns/{kind}", fd.pid))
            .map(|m| m.ino())
            .ok();
        if own != Some(ino) {
            return Err(fd.unsupported(format!(
                "fd {} is the file of a {kind} namespace ({}) other than the process's own, which stasis cannot checkpoint",
                fd.fd, fd.link
            )));
        }
        Ok(Some(FdKind::NsFile {
            kind: kind.to_string(),
            ino,
        }))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::NsFile { .. })
    }

    fn restore(_: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        let FdKind::NsFile { kind, ino } = &img.kind else {
            return Err(crate::restore::not_mine(Self::NAME, img));
        };
        let path = format!("/proc/self/ns/{kind}");
        let what = format!("fd {} ({kind}:[{ino}])", img.fd);
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
        if got != *ino {
            return Err(RestoreError::Inconsistent(format!(
                "{what} was the process's own {kind} namespace, and the restorer's is {kind}:[{got}]: restore from the namespaces the tree was dumped in"
            )));
        }
        Ok(f.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_links_are_recognised() {
        assert_eq!(parse("net:[4026531833]"), Some(("net", 4_026_531_833)));
        assert_eq!(parse("pid:[1]"), Some(("pid", 1)));
        assert_eq!(parse("pipe:[12]"), None);
        assert_eq!(parse("socket:[12]"), None);
        assert_eq!(parse("net:[x]"), None);
    }
}
