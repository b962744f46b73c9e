//! A userfaultfd of the program (garbage collectors, live migration, a
//! libstasis program in `uffd` monitoring mode): the features it asked for,
//! the areas it registers and, in write-protect areas, which pages are
//! write-protected (in asynchronous mode, the program reads what it wrote
//! from that: every page written since it protected them).
//!
//! **Save.** The features come from fdinfo (`API:`); the areas from the
//! `VmFlags` of the process's areas (`um`, `uw`, `ui`: a process may hold
//! one userfaultfd, so every registered area is that one's; two are
//! refused), the protected pages from `PAGEMAP_SCAN` (pages not
//! `WRITTEN`). Stasis's own write tracking (`--track uffd`, concurrent
//! copies through write-protection) registers areas too: a process with a
//! userfaultfd of its own is refused with those (see
//! `stasis_capture::collect`). One held by several processes is refused
//! (its areas are its creator's only).
//!
//! **Restore**, once the process's memory holds its pages: a userfaultfd
//! made inside the process (`stasis_kernel::uffd_remote::create_in`, so that
//! it is the process's), the handshake with the saved features, each area
//! registered with its modes, the protected pages write-protected again, and
//! the fd planted at its number. Faults pending at the dump come again when
//! the faulting threads run (the access is retried). A lazy restore leaves
//! these areas to no filler (`stasis_sys::vmflags::USERFAULTFD`).

use std::os::fd::OwnedFd;

use stasis_image::manifest::{FdImage, FdKind, UffdImage};
use stasis_kernel::remote::Remote;
use stasis_kernel::uffd_remote;

use crate::save::BadFormat;
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError};

/// The kernel's own bit in fdinfo's features (`UFFD_FEATURE_INITIALIZED`,
/// fs/userfaultfd.c): the handshake was made.
const INITIALIZED: u64 = 1 << 31;

/// A userfaultfd.
pub struct Userfaultfd;

impl Object for Userfaultfd {
    const NAME: &'static str = "userfaultfd";
    const ANON_INODE: Option<&'static str> = Some("anon_inode:[userfaultfd]");

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if Some(fd.link) != Self::ANON_INODE {
            return Ok(None);
        }
        save(cx, fd).map(|u| Some(FdKind::Userfaultfd(u)))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::Userfaultfd(_))
    }

    /// Never made from the restorer alone: [`restore_in`] makes it inside
    /// its process.
    fn restore(_cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        Err(RestoreError::Inconsistent(format!(
            "fd {}: a userfaultfd is made inside its process",
            img.fd
        )))
    }
}

/// Whether `img` is made by its process ([`restore_in`]).
pub fn made_in_process(img: &FdImage) -> bool {
    matches!(img.kind, FdKind::Userfaultfd(_))
}

/// The `API:` line of a userfaultfd's fdinfo: the features, `None` before
/// the handshake.
fn features(info: &str) -> Option<Option<u64>> {
    let v = info.lines().find_map(|l| l.strip_prefix("API:"))?;
    let f = u64::from_str_radix(v.trim().split(':').nth(1)?, 16).ok()?;
    Some((f & INITIALIZED != 0).then_some(f & !INITIALIZED))
}

/// The registered areas of `smaps`: `(start, end, UFFDIO_REGISTER_MODE_*)`.
fn registered(smaps: &str) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    let mut cur: Option<(u64, u64)> = None;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            let mode = flags
                .split_whitespace()
                .map(|f| match f {
                    "um" => stasis_sys::UFFDIO_REGISTER_MODE_MISSING,
                    "uw" => stasis_sys::UFFDIO_REGISTER_MODE_WP,
                    "ui" => stasis_sys::UFFDIO_REGISTER_MODE_MINOR,
                    _ => 0,
                })
                .fold(0, |a, b| a | b);
            if let (Some((s, e)), true) = (cur, mode != 0) {
                out.push((s, e, mode));
            }
        } else if let Some(first) = line.split_whitespace().next() {
            if !first.ends_with(':') {
                cur = first.split_once('-').and_then(|(a, b)| {
                    Some((
                        u64::from_str_radix(a, 16).ok()?,
                        u64::from_str_radix(b, 16).ok()?,
                    ))
                });
            }
        }
    }
    out
}

fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<UffdImage, SaveError> {
    let n = fd.fd;
    let refuse = |why: String| fd.unsupported(format!("fd {n} is a userfaultfd {why}"));
    // One per process; one process per userfaultfd.
    let me = crate::save::list_fds(fd.pid)?;
    let others = me.iter().filter(|&&m| {
        m != n
            && crate::save::read_link(fd.pid, &format!("fd/{m}"))
                .is_ok_and(|l| Some(l.as_str()) == Userfaultfd::ANON_INODE)
            && !stasis_kernel::fdops::kcmp_same_file(fd.pid, n, fd.pid, m)
    });
    if let Some(m) = others.into_iter().next() {
        return Err(refuse(format!(
            "and so is fd {m} (another one): stasis cannot tell which areas each registers"
        )));
    }
    if let Some(p) = cx.holder_of_file(fd) {
        return Err(refuse(format!(
            "also held by process {p}: its areas are its creator's only, which stasis cannot tell"
        )));
    }
    let features = features(fd.info).ok_or_else(|| fd.bad_info(BadFormat("no API line".into())))?;
    let smaps =
        std::fs::read_to_string(crate::save::proc_path(fd.pid, "smaps")).map_err(|source| {
            SaveError::Proc {
                pid: fd.pid,
                file: "smaps".into(),
                source,
            }
        })?;
    let ranges = registered(&smaps);
    let pm = stasis_kernel::pagemap::Pagemap::open(fd.pid)?;
    let mut protected = Vec::new();
    for &(s, e, mode) in &ranges {
        if mode & stasis_sys::UFFDIO_REGISTER_MODE_WP == 0 {
            continue;
        }
        let found = pm
            .scan(s, e, stasis_kernel::pagemap::ScanQuery::wp_protected())
            .map_err(|k| refuse(format!("whose write-protected pages in {s:#x}-{e:#x} cannot be read (PAGEMAP_SCAN): {k}")))?;
        protected.extend(found.iter().map(|r| (r.start, r.end)));
    }
    Ok(UffdImage {
        features,
        ranges,
        protected,
    })
}

/// Makes the userfaultfd of `img` inside the process behind `r` (`pid`,
/// as the restorer sees it): registered, its pages protected again.
/// Returns the restorer's copy, for planting at its number.
pub fn restore_in(r: &mut dyn Remote, pid: i32, img: &FdImage) -> Result<OwnedFd, RestoreError> {
    let FdKind::Userfaultfd(u) = &img.kind else {
        return Err(crate::restore::not_mine(Userfaultfd::NAME, img));
    };
    let what = |w: String| format!("{w} (userfaultfd fd {})", img.fd);
    let made = uffd_remote::create_in(
        r,
        pid,
        "userfaultfd (the program's)",
        u.features.unwrap_or(0),
    )
    .map_err(|e| RestoreError::Step {
        what: what("making it again".into()),
        source: e.into_kernel(),
    })?;
    for &(s, e, mode) in &u.ranges {
        made.register(s, e - s, mode)
            .map_err(|k| RestoreError::Step {
                what: what(format!("registering {s:#x}-{e:#x}")),
                source: k,
            })?;
    }
    for &(s, e) in &u.protected {
        made.write_protect(s, e - s, true)
            .map_err(|errno| RestoreError::Step {
                what: what(format!("write-protecting {s:#x}-{e:#x}")),
                source: stasis_kernel::KernelError::Io {
                    what: "UFFDIO_WRITEPROTECT".into(),
                    source: std::io::Error::from_raw_os_error(errno),
                },
            })?;
    }
    let fd = made.into_fd();
    stasis_kernel::fdops::set_status_flags(
        std::os::fd::AsFd::as_fd(&fd),
        crate::restore::setfl_flags(img.flags),
    )
    .map_err(crate::error::io_step(
        what("setting the flags".into()),
        "F_SETFL",
    ))?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_and_areas_are_read() {
        assert_eq!(
            features("pos:\t0\nAPI:\taa:8000a000:80000000000001ff\n"),
            Some(Some(0xa000))
        );
        assert_eq!(features("API:\taa:0:0\n"), Some(None));
        let smaps = "7f00-7f10 rw-p 00000000 00:00 0\nRss: 4 kB\nVmFlags: rd wr mr mw me uw ac\n\
                     7f10-7f20 rw-p 00000000 00:00 0\nVmFlags: rd wr\n\
                     7f20-7f30 rw-p 00000000 00:00 0\nVmFlags: rd um uw\n";
        assert_eq!(
            registered(smaps),
            vec![
                (0x7f00, 0x7f10, stasis_sys::UFFDIO_REGISTER_MODE_WP),
                (
                    0x7f20,
                    0x7f30,
                    stasis_sys::UFFDIO_REGISTER_MODE_MISSING | stasis_sys::UFFDIO_REGISTER_MODE_WP
                ),
            ]
        );
    }
}
