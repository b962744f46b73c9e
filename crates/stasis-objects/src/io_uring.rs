//! io_uring: an idle instance (no request in flight), with its rings'
//! content, its positions, and its registered files and buffers.
//!
//! **What the kernel shows.** `/proc/PID/fdinfo` gives the rings' sizes
//! (`SqMask`, `CqMask`), the positions (`SqHead`/`CachedSqHead`: entries
//! the kernel took; `CqTail`/`CachedCqTail`: completions it posted;
//! `SqTail`, `CqHead`: the program's), an SQ poll thread, the registered
//! files (by name) and buffers (address/length), personalities (older
//! kernels only: 6.18 does not show them), the
//! requests waiting on a poll (`PollList`) and the overflowed completions.
//! The areas mapping the rings are `anon_inode:[io_uring]` in maps, with
//! the instance's inode and the mmap offset of what they map. The setup
//! flags are not shown: those that change what the caller may do are
//! found by asking the kernel, on a copy of the fd (`io_uring_enter` of
//! nothing: `EBADFD` for a ring still disabled, then a restrictions
//! request without any: `EBUSY` if it has some; a register request
//! turned down: `EEXIST` for a single issuer, `EACCES` for restrictions
//! that do not allow it; a wait for no completion turned down: `EEXIST`
//! for `DEFER_TASKRUN`), and the single issuer by the capture, the thread
//! in which the register request is not turned down ([`is_issuer`]);
//! `IORING_SETUP_NO_SQARRAY` by the rings' size or their never-written
//! index array; the others are not seen (see the README).
//!
//! **What is refused**, with the fd number: entries an SQ poll thread
//! took while the ring was read (it runs on while the process is
//! frozen), restrictions
//! (any on a disabled ring), a single issuer no thread of the process is,
//! personalities holding other credentials than the process's, NAPI,
//! requests in flight
//! (the kernel cannot give them back: a poll list, or more entries taken
//! than completions posted), overflowed completions, rings or SQEs not
//! mapped whole (`IORING_SETUP_NO_MMAP`), an area at another offset (a
//! provided-buffer ring), 128-byte SQEs or 32-byte CQEs (seen by the areas' sizes), a
//! registered file that no fd of the process is, a registered eventfd
//! (a registration with no fd is turned down with `EBUSY`; which file it
//! is, nothing shows).
//!
//! **Restore**, by the process itself ([`restore_in`], after all its fds
//! exist). The kernel maps a ring's own memory only where it chooses
//! (its `get_unmapped_area` refuses any address, `MAP_FIXED` and
//! `mremap` included), so the ring is made with `IORING_SETUP_NO_MMAP`
//! in memory of the process at the saved addresses: a memfd for the
//! rings and one for the SQEs ([`memfd_name`], which a later dump
//! recognises), each mapped shared at every area that mapped them
//! (aliases stay aliases), over the placeholders the memory restore left
//! there (`stasis_restore::build`); `io_uring_setup` with the same sizes
//! and flags; the kernel-owned positions (SQ head, CQ
//! tail) brought to the saved ones by submitting and reaping NOPs, as
//! `stasis_restore::build::aio_refill` does for AIO; then the saved
//! bytes written over the areas: unsubmitted entries and unreaped
//! completions are back where they were. Files and buffers are registered
//! again (a sparse table, then its slots), and the fd is moved to its
//! number. A ring whose single issuer is another thread than the main one
//! is made disabled and left empty, and enabled, driven and filled by
//! that thread once it exists ([`finish_in`]). A ring with an SQ poll
//! thread (`SqThread` in fdinfo) is made with one, bound to the CPU the
//! old one was bound to ([`sq_thread_cpu`]); that thread takes the NOPs
//! and, once written back, the entries the program left unsubmitted (the
//! files are registered before), and is woken once more at the end.
//! Personalities are registered again by the thread that registers on
//! the ring (its issuer, or the main one) once its credentials are back
//! ([`register_personalities`]), at their ids. A ring several processes
//! hold is made by the first restored; the others take it from that one
//! and map their areas from its memory ([`share_in`]).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use stasis_image::manifest::{FdImage, FdKind, IoUringArea, IoUringRing};
use stasis_kernel::remote::Remote;
use stasis_sys::io_uring as sys;

use crate::error::step;
use crate::{Object, OpenFd, RestoreCtx, RestoreError, SaveCtx, SaveError, Scratch};

/// The `/proc/PID/fd` link and maps name of an instance.
pub const LINK: &str = "anon_inode:[io_uring]";

/// Registered files or buffers registered again per update call.
const CHUNK: usize = 128;

pub struct IoUring;

impl Object for IoUring {
    const NAME: &'static str = "io_uring";
    const ANON_INODE: Option<&'static str> = Some(LINK);

    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError> {
        if fd.link != LINK {
            return Ok(None);
        }
        let info = parse(fd.info).map_err(|e| fd.bad_info(crate::save::BadFormat(e)))?;
        // An instance an earlier process of the tree holds too (inherited,
        // or passed): made by that one, handed over to this one, whose
        // own areas mapping it are mapped again from its memory.
        let ino = fd.meta.ino();
        if cx
            .seen
            .iter()
            .any(|s| s.0 != fd.pid && s.3 == ino && same_open_file(s.0, s.1, fd))
        {
            return Ok(Some(FdKind::IoUring(sharer_ring(fd, &info)?)));
        }
        let issuer = cx.io_uring_issuers.get(&(fd.pid, fd.fd)).copied();
        let eventfd = cx.io_uring_eventfds.contains(&(fd.pid, fd.fd));
        let ring = save_ring(fd, &info, issuer, eventfd)?;
        Ok(Some(FdKind::IoUring(ring)))
    }

    fn owns(kind: &FdKind) -> bool {
        matches!(kind, FdKind::IoUring(_))
    }

    fn restore(_: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError> {
        Err(RestoreError::Inconsistent(format!(
            "fd {}: an io_uring instance is made by its process (io_uring::restore_in), not handed over",
            img.fd
        )))
    }
}

/// Whether fd `f` of `pid` is the open file of `fd` (`kcmp`).
fn same_open_file(pid: i32, f: i32, fd: &OpenFd<'_>) -> bool {
    stasis_kernel::fdops::kcmp_same_file(pid, f, fd.pid, fd.fd)
}

/// Whether `img` is made by its process with [`restore_in`] rather than
/// handed over.
pub fn made_in_process(img: &FdImage) -> bool {
    matches!(img.kind, FdKind::IoUring(_))
}

/// What `/proc/PID/fdinfo` says of an instance.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Info {
    pub sq_mask: u32,
    pub sq_head: u32,
    pub sq_tail: u32,
    pub cached_sq_head: u32,
    pub cq_mask: u32,
    pub cq_head: u32,
    pub cq_tail: u32,
    pub cached_cq_tail: u32,
    pub sq_thread: i32,
    /// (slot, name) of each registered file.
    pub files: Vec<(u32, String)>,
    pub nr_files: u32,
    /// (slot, address, length) of each registered buffer.
    pub buffers: Vec<(u32, u64, u64)>,
    pub nr_buffers: u32,
    /// Registered personalities (`IORING_REGISTER_PERSONALITY`).
    pub personalities: Vec<Personality>,
    /// Lines of `PollList` and `CqOverflowList`.
    pub polls: usize,
    pub overflowed: usize,
    pub napi: bool,
}

/// A registered personality: its id and the credentials it holds, as
/// fdinfo shows them (and `/proc/PID/status` a task's).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Personality {
    pub id: u16,
    pub uid: Vec<u32>,
    pub gid: Vec<u32>,
    pub groups: Vec<u32>,
    pub cap_eff: u64,
}

impl Personality {
    /// Fills the field a `Uid:`/`Gid:`/`Groups:`/`CapEff:` line gives
    /// (others are left alone).
    fn take(&mut self, line: &str) -> Result<(), String> {
        let Some((key, v)) = line.trim().split_once(':') else {
            return Ok(());
        };
        let nums = |v: &str| -> Result<Vec<u32>, String> {
            v.split_whitespace()
                .map(|n| {
                    n.parse()
                        .map_err(|_| format!("{key}: {n:?} is not a number"))
                })
                .collect()
        };
        match key {
            "Uid" => self.uid = nums(v)?,
            "Gid" => self.gid = nums(v)?,
            "Groups" => self.groups = nums(v)?,
            "CapEff" => {
                self.cap_eff = u64::from_str_radix(v.trim(), 16)
                    .map_err(|_| format!("CapEff: {v:?} is not a number"))?;
            }
            _ => {}
        }
        Ok(())
    }

    /// The credentials of a task, from its `status`.
    pub fn of_status(status: &str) -> Result<Self, String> {
        let mut p = Self::default();
        for l in status.lines() {
            p.take(l)?;
        }
        Ok(p)
    }

    /// Whether it holds the same credentials as `other` (ids aside).
    pub fn same_creds(&self, other: &Self) -> bool {
        let mut a = self.groups.clone();
        let mut b = other.groups.clone();
        a.sort_unstable();
        b.sort_unstable();
        (&self.uid, &self.gid, a, self.cap_eff) == (&other.uid, &other.gid, b, other.cap_eff)
    }
}

/// Parses an io_uring fdinfo.
pub fn parse(text: &str) -> Result<Info, String> {
    #[derive(PartialEq)]
    enum Section {
        None,
        Files,
        Buffers,
        Polls,
        Overflow,
        Personalities,
    }
    let mut i = Info {
        sq_thread: -1,
        ..Info::default()
    };
    let mut seen = 0u32;
    let mut section = Section::None;
    let num = |v: &str, key: &str| -> Result<u32, String> {
        let v = v.trim();
        let r = match v.strip_prefix("0x") {
            Some(h) => u32::from_str_radix(h, 16),
            None => v.parse(),
        };
        r.map_err(|_| format!("{key}: {v:?} is not a number"))
    };
    for line in text.lines() {
        if line.starts_with(' ') || line.starts_with('\t') {
            let l = line.trim();
            match section {
                Section::Files => {
                    let (slot, name) = l
                        .split_once(": ")
                        .ok_or_else(|| format!("registered file line {l:?}"))?;
                    i.files.push((num(slot, "file slot")?, name.to_string()));
                }
                Section::Buffers => {
                    let (slot, rest) = l
                        .split_once(": ")
                        .ok_or_else(|| format!("registered buffer line {l:?}"))?;
                    let (addr, len) = rest
                        .split_once('/')
                        .ok_or_else(|| format!("registered buffer line {l:?}"))?;
                    let addr = u64::from_str_radix(addr.trim_start_matches("0x"), 16)
                        .map_err(|_| format!("registered buffer address {addr:?}"))?;
                    let len: u64 = len
                        .trim()
                        .parse()
                        .map_err(|_| format!("registered buffer length {len:?}"))?;
                    i.buffers.push((num(slot, "buffer slot")?, addr, len));
                }
                Section::Personalities => {
                    if let Ok(id) = l.parse::<u16>() {
                        i.personalities.push(Personality {
                            id,
                            ..Personality::default()
                        });
                    } else if let Some(p) = i.personalities.last_mut() {
                        p.take(l)?;
                    }
                }
                Section::Polls => i.polls += 1,
                Section::Overflow => i.overflowed += 1,
                Section::None => {}
            }
            continue;
        }
        section = Section::None;
        let Some((key, v)) = line.split_once(':') else {
            continue;
        };
        match key {
            "SqMask" => (i.sq_mask, seen) = (num(v, key)?, seen | 1),
            "SqHead" => (i.sq_head, seen) = (num(v, key)?, seen | 2),
            "SqTail" => (i.sq_tail, seen) = (num(v, key)?, seen | 4),
            "CachedSqHead" => (i.cached_sq_head, seen) = (num(v, key)?, seen | 8),
            "CqMask" => (i.cq_mask, seen) = (num(v, key)?, seen | 16),
            "CqHead" => (i.cq_head, seen) = (num(v, key)?, seen | 32),
            "CqTail" => (i.cq_tail, seen) = (num(v, key)?, seen | 64),
            "CachedCqTail" => (i.cached_cq_tail, seen) = (num(v, key)?, seen | 128),
            "SqThread" => {
                i.sq_thread = v
                    .trim()
                    .parse()
                    .map_err(|_| format!("SqThread: {v:?} is not a number"))?;
            }
            "UserFiles" => {
                i.nr_files = num(v, key)?;
                section = Section::Files;
            }
            "UserBufs" => {
                i.nr_buffers = num(v, key)?;
                section = Section::Buffers;
            }
            "Personalities" => section = Section::Personalities,
            "PollList" => section = Section::Polls,
            "CqOverflowList" => section = Section::Overflow,
            "NAPI" => i.napi = v.trim() != "disabled",
            _ => {}
        }
    }
    if seen != 255 {
        return Err("no ring positions (SqMask..CachedCqTail)".into());
    }
    Ok(i)
}

/// Why a ring cannot be saved as it is, by what `fdinfo` says.
pub fn refusal(fd: i32, i: &Info) -> Option<String> {
    let why = if i.napi {
        "has NAPI busy polling registered".into()
    } else if i.polls > 0 {
        format!(
            "has {} request(s) in flight waiting on a poll (the kernel cannot give them back); checkpoint it when its requests have completed",
            i.polls
        )
    } else if i.overflowed > 0 {
        format!(
            "has {} overflowed completion(s) (CqOverflowList) the kernel holds outside the ring",
            i.overflowed
        )
    } else if i.cached_sq_head != i.cached_cq_tail {
        format!(
            "has requests in flight: the kernel took {} entries and posted {} completions (the kernel cannot give requests back; requests that post no completion or several, IOSQE_CQE_SKIP_SUCCESS or multishot, cannot be told apart from them); checkpoint it when its requests have completed",
            i.cached_sq_head, i.cached_cq_tail
        )
    } else if i.sq_head != i.cached_sq_head || i.cq_tail != i.cached_cq_tail {
        "has positions the kernel is still moving".into()
    } else if !(i.sq_mask.wrapping_add(1)).is_power_of_two()
        || !(i.cq_mask.wrapping_add(1)).is_power_of_two()
    {
        format!(
            "has ring sizes {:#x}/{:#x} that are not powers of two",
            i.sq_mask, i.cq_mask
        )
    } else {
        return None;
    };
    Some(format!(
        "io_uring fd {fd} {why}, which stasis cannot checkpoint"
    ))
}

/// Where the kernel puts the SQ index array in `struct io_rings` for
/// `cq_entries` 16-byte CQEs: after them, cache-line aligned.
pub fn sq_array_offset(cq_entries: u64) -> u64 {
    (64 + cq_entries * sys::CQE_LEN as u64).div_ceil(64) * 64
}

/// The bytes of the kernel's `struct io_rings` for these sizes with
/// 16-byte CQEs, with the SQ index array or without it
/// (`IORING_SETUP_NO_SQARRAY`) (`rings_size`).
pub fn rings_len(sq_entries: u64, cq_entries: u64, array: bool) -> u64 {
    sq_array_offset(cq_entries) + if array { sq_entries * 4 } else { 0 }
}

fn page_up(n: u64) -> u64 {
    n.div_ceil(stasis_sys::PAGE_SIZE) * stasis_sys::PAGE_SIZE
}

/// The setup flags that bind a ring to a task or keep it disabled, found
/// by asking the kernel on a copy of the fd (the module docs), and its
/// single issuer: `issuer` is what the capture found
/// ([`SaveCtx::io_uring_issuers`]: `None` if it did not look).
fn task_flags(
    fd: &OpenFd<'_>,
    issuer: Option<Option<i32>>,
) -> Result<(u32, Option<i32>), SaveError> {
    use stasis_kernel::fdops::{io_uring_enter_nothing, io_uring_register_nothing};
    let refuse = |what: &str| {
        fd.unsupported(format!(
            "io_uring fd {} {what}, which stasis cannot checkpoint",
            fd.fd
        ))
    };
    let copy = stasis_kernel::pidfd::pidfd_getfd(fd.pidfd, fd.fd)?;
    let errno = |e: std::io::Error| e.raw_os_error();
    match io_uring_enter_nothing(copy.as_fd(), false).map_err(errno) {
        Ok(()) => {}
        // Made disabled and never enabled: made disabled again. Its
        // single issuer, if it has one, is the thread that enables it.
        Err(Some(libc::EBADFD)) => {
            return match errno(io_uring_register_nothing(
                copy.as_fd(),
                sys::IORING_REGISTER_RESTRICTIONS,
            )) {
                Some(libc::EBUSY) => Err(refuse(
                    "is disabled with restrictions (IORING_REGISTER_RESTRICTIONS) the kernel does not show",
                )),
                _ => Ok((sys::IORING_SETUP_R_DISABLED, None)),
            };
        }
        Err(e) => {
            return Err(refuse(&format!(
                "could not be examined ({})",
                std::io::Error::from_raw_os_error(e.unwrap_or(libc::EIO))
            )))
        }
    }
    match errno(io_uring_register_nothing(
        copy.as_fd(),
        sys::IORING_REGISTER_PROBE,
    )) {
        Some(libc::EEXIST) => {}
        // Register operations it does not allow, probes included.
        Some(libc::EACCES) => {
            return Err(refuse(
                "has restrictions (IORING_REGISTER_RESTRICTIONS) the kernel does not show",
            ))
        }
        _ => return Ok((0, None)),
    }
    // A single issuer: which thread, as the capture found it.
    let tid = match issuer {
        Some(Some(tid)) => tid,
        Some(None) => return Err(refuse(
            "has a single issuer (IORING_SETUP_SINGLE_ISSUER) that is no thread of the process (it exited, or the ring was passed from another process)",
        )),
        None => return Err(refuse(
            "has a single issuer (IORING_SETUP_SINGLE_ISSUER, DEFER_TASKRUN), a thread stasis could not tell",
        )),
    };
    // Completions posted to the issuer only: asking for them is turned
    // down too.
    let defer = match io_uring_enter_nothing(copy.as_fd(), true).map_err(errno) {
        Err(Some(libc::EEXIST)) => sys::IORING_SETUP_DEFER_TASKRUN,
        _ => 0,
    };
    Ok((sys::IORING_SETUP_SINGLE_ISSUER | defer, Some(tid)))
}

/// Whether the thread behind `r` (a frozen thread of the process) may
/// register on io_uring fd `fd` of its process: for a ring with a single
/// issuer (`IORING_SETUP_SINGLE_ISSUER`), whether it is that thread (a
/// register request from any other is turned down with `EEXIST`). The
/// request is a probe with no buffer, which changes nothing.
pub fn is_issuer<R: Remote>(r: &mut R, fd: i32) -> Result<bool, stasis_kernel::KernelError> {
    let probe = r.sys(
        "io_uring_register",
        libc::SYS_io_uring_register,
        &[
            u64::from(fd.unsigned_abs()),
            sys::IORING_REGISTER_PROBE.into(),
            0,
            1,
        ],
    );
    match probe {
        Err(stasis_kernel::KernelError::RemoteSyscall { ref source, .. }) => {
            Ok(source.raw_os_error() != Some(libc::EEXIST))
        }
        Err(e) => Err(e),
        Ok(_) => Ok(true),
    }
}

/// Whether io_uring fd `fd` has an eventfd registered, asked in the thread
/// behind `r` (its single issuer: no other may register): a second
/// registration with no fd is turned down with `EBUSY`, and changes
/// nothing otherwise.
pub fn has_eventfd_in<R: Remote>(r: &mut R, fd: i32) -> Result<bool, stasis_kernel::KernelError> {
    match r.sys(
        "io_uring_register",
        libc::SYS_io_uring_register,
        &[
            u64::from(fd.unsigned_abs()),
            sys::IORING_REGISTER_EVENTFD.into(),
            0,
            1,
        ],
    ) {
        Err(stasis_kernel::KernelError::RemoteSyscall { ref source, .. }) => {
            Ok(source.raw_os_error() == Some(libc::EBUSY))
        }
        Err(e) => Err(e),
        Ok(_) => Ok(false),
    }
}

/// Refuses a thread (`tid` of `pid`, behind `r`) that has rings
/// registered (`IORING_REGISTER_RING_FDS`): the kernel does not show
/// them, and they would be lost. An `io_uring_enter` of nothing on each
/// slot tells: `EBADF` for an empty slot, `EINVAL` for a thread that
/// never used a ring; it changes nothing.
pub fn check_ring_fds<R: Remote>(r: &mut R, pid: i32, tid: i32) -> Result<(), SaveError> {
    for slot in 0..sys::IO_RINGFD_REG_MAX {
        match r.sys(
            "io_uring_enter",
            libc::SYS_io_uring_enter,
            &[
                slot.into(),
                0,
                0,
                sys::IORING_ENTER_REGISTERED_RING.into(),
                0,
                0,
            ],
        ) {
            Err(stasis_kernel::KernelError::RemoteSyscall { ref source, .. })
                if source.raw_os_error() == Some(libc::EINVAL) =>
            {
                return Ok(())
            }
            Err(stasis_kernel::KernelError::RemoteSyscall { ref source, .. })
                if source.raw_os_error() == Some(libc::EBADF) => {}
            Err(stasis_kernel::KernelError::RemoteSyscall { .. }) | Ok(_) => {
                return Err(SaveError::Unsupported {
                    pid,
                    what: format!("its thread {tid} has an io_uring ring registered in slot {slot} (IORING_REGISTER_RING_FDS), which the kernel does not show, so stasis cannot checkpoint it"),
                })
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether process `pid`, whose memory plan says whether it `maps_ring`
/// (an area of kind `IoUring`: its maps were read once, already), has an
/// io_uring fd or maps a ring. Its fds from `census` when it lists them.
pub fn uses_io_uring(
    pid: i32,
    maps_ring: bool,
    census: Option<&crate::fd_census::FdCensus>,
) -> bool {
    if maps_ring {
        return true;
    }
    match census.and_then(|c| c.fds_of(pid)) {
        Some(entries) => entries.iter().any(|e| e.link == LINK),
        None => crate::save::list_fds(pid).is_ok_and(|fds| {
            fds.iter()
                .any(|n| crate::save::read_link(pid, &format!("fd/{n}")).is_ok_and(|l| l == LINK))
        }),
    }
}

/// The io_uring fds of process `pid` whose single issuer is another task
/// than the caller's (a register request is turned down with `EEXIST`):
/// the rings whose issuer [`is_issuer`] is to find among its threads.
pub fn single_issuer_rings(pid: i32) -> Result<Vec<i32>, SaveError> {
    let mut rings = Vec::new();
    let mut pidfd = None;
    for n in crate::save::list_fds(pid)? {
        if !crate::save::read_link(pid, &format!("fd/{n}")).is_ok_and(|l| l == LINK) {
            continue;
        }
        let pfd = match &pidfd {
            Some(p) => p,
            None => pidfd.insert(stasis_kernel::pidfd::pidfd_open(pid)?),
        };
        let copy = stasis_kernel::pidfd::pidfd_getfd(pfd, n)?;
        let e = stasis_kernel::fdops::io_uring_register_nothing(
            copy.as_fd(),
            sys::IORING_REGISTER_PROBE,
        );
        if e.raw_os_error() == Some(libc::EEXIST) {
            rings.push(n);
        }
    }
    Ok(rings)
}

fn save_ring(
    fd: &OpenFd<'_>,
    i: &Info,
    issuer: Option<Option<i32>>,
    eventfd: bool,
) -> Result<IoUringRing, SaveError> {
    if let Some(why) = refusal(fd.fd, i) {
        return Err(fd.unsupported(why));
    }
    let refuse = |what: String| {
        fd.unsupported(format!(
            "io_uring fd {} {what}, which stasis cannot checkpoint",
            fd.fd
        ))
    };
    let (task_flags, issuer) = task_flags(fd, issuer)?;
    // A registered eventfd, which the kernel does not show (nor which
    // file it is): a second registration is turned down (`EBUSY`). Asked
    // here, or by the issuer of a ring that has one (`eventfd`).
    let busy = eventfd
        || issuer.is_none() && {
            let copy = stasis_kernel::pidfd::pidfd_getfd(fd.pidfd, fd.fd)?;
            stasis_kernel::fdops::io_uring_register_nothing(
                copy.as_fd(),
                sys::IORING_REGISTER_EVENTFD,
            )
            .raw_os_error()
                == Some(libc::EBUSY)
        };
    if busy {
        return Err(refuse(
            "has an eventfd registered (IORING_REGISTER_EVENTFD), which the kernel does not show"
                .into(),
        ));
    }
    // An SQ poll thread (`iou-sqp-N`, N the task that made it, which
    // fdinfo shows), and the CPU it is bound to if it is.
    let (sqpoll, sq_thread_cpu) = if i.sq_thread >= 0 {
        (sys::IORING_SETUP_SQPOLL, sq_thread_cpu(fd.pid, i.sq_thread))
    } else {
        (0, None)
    };
    let (sq_entries, cq_entries) = (i.sq_mask + 1, i.cq_mask + 1);
    let ino = fd.meta.ino();
    let maps = stasis_kernel::procfs::maps(fd.pid).map_err(stasis_kernel::KernelError::from)?;
    let mem = stasis_kernel::mem::ProcessMemory::open(fd.pid)?;
    let with_array = page_up(rings_len(sq_entries.into(), cq_entries.into(), true));
    let without_array = page_up(rings_len(sq_entries.into(), cq_entries.into(), false));
    let sqes_len = page_up(u64::from(sq_entries) * sys::SQE_LEN as u64);
    let mut areas: Vec<IoUringArea> = Vec::new();
    for m in &maps {
        let (offset, restored) = if m.name == LINK && m.ino == ino {
            (m.offset, false)
        } else if let Some((n, off)) = restored_area(&m.name) {
            if n != fd.fd {
                continue;
            }
            (off, true)
        } else {
            continue;
        };
        let (kind, most, offset) = match offset {
            // The SQ and CQ rings are one area (IORING_FEAT_SINGLE_MMAP):
            // mapped at either offset, or at both (aliases).
            sys::IORING_OFF_SQ_RING | sys::IORING_OFF_CQ_RING => {
                ("rings", with_array, sys::IORING_OFF_SQ_RING)
            }
            sys::IORING_OFF_SQES => ("SQE array", sqes_len, sys::IORING_OFF_SQES),
            o => {
                return Err(refuse(format!(
                    "is mapped at {:#x}-{:#x} at offset {o:#x} (a provided-buffer ring, say)",
                    m.start, m.end
                )))
            }
        };
        // Larger than the kernel's area for these entries: 128-byte SQEs
        // or 32-byte CQEs (IORING_SETUP_SQE128 / CQE32, not in fdinfo).
        if m.end - m.start > most {
            return Err(refuse(format!(
                "maps {:#x}-{:#x} as its {kind}, {} bytes where its {sq_entries}/{cq_entries} entries take {most} (IORING_SETUP_SQE128 or CQE32)",
                m.start,
                m.end,
                m.end - m.start
            )));
        }
        let len = usize::try_from(m.end - m.start).unwrap_or(0);
        let mut data = vec![0u8; len];
        mem.read(m.start, &mut data)?;
        if restored && offset == sys::IORING_OFF_SQ_RING && !header_matches(&data, i) {
            return Err(refuse(format!(
                "has rings at {:#x} (restored by stasis) whose positions are not the kernel's",
                m.start
            )));
        }
        areas.push(IoUringArea {
            start: m.start,
            end: m.end,
            offset,
            prot: m.prot(),
            data,
        });
    }
    // An SQ poll thread runs on while the process is frozen: it must not
    // have taken entries while they were read.
    if sqpoll != 0 {
        let again =
            std::fs::read_to_string(crate::save::proc_path(fd.pid, &format!("fdinfo/{}", fd.fd)))
                .ok()
                .and_then(|t| parse(&t).ok());
        if again.is_none_or(|a| {
            (a.sq_head, a.cached_sq_head, a.cq_tail) != (i.sq_head, i.cached_sq_head, i.cq_tail)
        }) {
            return Err(refuse(
                "had entries taken by its SQ poll thread while it was being saved (requests in flight); checkpoint it when its poll thread is idle"
                    .into(),
            ));
        }
    }
    // The whole of each area mapped somewhere (the restore gives the
    // kernel that place as the ring's memory).
    let (Some(rings), Some(_)) = (
        largest(&areas, sys::IORING_OFF_SQ_RING),
        largest(&areas, sys::IORING_OFF_SQES).filter(|a| a.end - a.start == sqes_len),
    ) else {
        return Err(refuse(
            "does not have its rings and SQE array mapped whole (IORING_SETUP_NO_MMAP, or unmapped)"
                .into(),
        ));
    };
    let rings_len = rings.end - rings.start;
    // Only the size without the index array: IORING_SETUP_NO_SQARRAY;
    // with its size, an index array never written: the same (the
    // kernel does not fill it; a program using it writes it).
    let no_sqarray = if rings_len == with_array {
        let at = usize::try_from(sq_array_offset(cq_entries.into())).unwrap_or(usize::MAX);
        let end = at.saturating_add(sq_entries as usize * 4);
        rings
            .data
            .get(at..end)
            .is_some_and(|a| a.iter().all(|&b| b == 0))
    } else if rings_len == without_array {
        true
    } else {
        return Err(refuse(format!(
            "maps its rings at {:#x} with {rings_len} bytes, a part of them",
            rings.start
        )));
    };
    let files = registered_files(fd, i)?;
    let personalities = personalities(fd, i)?;
    let mut buffers = vec![None; usize::try_from(i.nr_buffers).unwrap_or(0)];
    for &(slot, addr, len) in &i.buffers {
        if let Some(b) = buffers.get_mut(slot as usize) {
            *b = Some((addr, len));
        }
    }
    Ok(IoUringRing {
        ino,
        sq_entries,
        cq_entries,
        setup_flags: task_flags
            | sqpoll
            | if cq_entries == 2 * sq_entries {
                0
            } else {
                sys::IORING_SETUP_CQSIZE
            }
            | if no_sqarray {
                sys::IORING_SETUP_NO_SQARRAY
            } else {
                0
            },
        sq_head: i.sq_head,
        cq_tail: i.cq_tail,
        sq_tail: i.sq_tail,
        cq_head: i.cq_head,
        areas,
        files,
        buffers,
        issuer,
        sq_thread_cpu,
        personalities,
    })
}

/// The ids of the ring's personalities, each to hold the credentials
/// of the process (they are registered again by it, with its own, once
/// they are restored): others are refused. (6.18 does not show them:
/// see the README.)
fn personalities(fd: &OpenFd<'_>, i: &Info) -> Result<Vec<u16>, SaveError> {
    if i.personalities.is_empty() {
        return Ok(Vec::new());
    }
    let status =
        std::fs::read_to_string(crate::save::proc_path(fd.pid, "status")).map_err(|source| {
            SaveError::Proc {
                pid: fd.pid,
                file: "status".into(),
                source,
            }
        })?;
    let own =
        Personality::of_status(&status).map_err(|e| fd.bad_info(crate::save::BadFormat(e)))?;
    if let Some(p) = i.personalities.iter().find(|p| !p.same_creds(&own)) {
        return Err(fd.unsupported(format!(
            "io_uring fd {}: personality {} holds other credentials (uid {:?}, gid {:?}) than the process's (uid {:?}, gid {:?}), which stasis cannot checkpoint",
            fd.fd, p.id, p.uid, p.gid, own.uid, own.gid
        )));
    }
    Ok(i.personalities.iter().map(|p| p.id).collect())
}

/// The CPU the SQ poll thread of a ring is bound to
/// (`IORING_SETUP_SQ_AFF`): the one CPU its affinity allows, when it
/// allows one only (a thread not bound is allowed every CPU online).
/// `task` is what fdinfo's `SqThread` says: the task that made the
/// thread, whose number its name carries (`iou-sqp-N`), or the thread.
fn sq_thread_cpu(pid: i32, task: i32) -> Option<u32> {
    let name = format!("iou-sqp-{task}");
    let tasks = std::fs::read_dir(crate::save::proc_path(pid, "task")).ok()?;
    let sqp = tasks.flatten().find_map(|e| {
        let tid: i32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim_end() == name || tid == task && stasis_kernel::procfs::is_io_worker(pid, tid))
            .then_some(e.path())
    })?;
    let status = std::fs::read_to_string(sqp.join("status")).ok()?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
        .trim();
    list.parse().ok()
}

/// Ring `fd` as a process that is not the first of the tree to hold it
/// sees it: its sizes and the areas of this process mapping it (their
/// bytes are the first holder's, not saved again).
fn sharer_ring(fd: &OpenFd<'_>, i: &Info) -> Result<IoUringRing, SaveError> {
    let ino = fd.meta.ino();
    let maps = stasis_kernel::procfs::maps(fd.pid).map_err(stasis_kernel::KernelError::from)?;
    let mut areas = Vec::new();
    for m in &maps {
        let offset = if m.name == LINK && m.ino == ino {
            m.offset
        } else if let Some((_, off)) = restored_area(&m.name).filter(|a| a.0 == fd.fd) {
            off
        } else {
            continue;
        };
        let offset = match offset {
            sys::IORING_OFF_SQ_RING | sys::IORING_OFF_CQ_RING => sys::IORING_OFF_SQ_RING,
            sys::IORING_OFF_SQES => sys::IORING_OFF_SQES,
            o => {
                return Err(fd.unsupported(format!(
                    "io_uring fd {} is mapped at {:#x}-{:#x} at offset {o:#x} (a provided-buffer ring, say), which stasis cannot checkpoint",
                    fd.fd, m.start, m.end
                )))
            }
        };
        areas.push(IoUringArea {
            start: m.start,
            end: m.end,
            offset,
            prot: m.prot(),
            data: Vec::new(),
        });
    }
    Ok(IoUringRing {
        ino,
        sq_entries: i.sq_mask.wrapping_add(1),
        cq_entries: i.cq_mask.wrapping_add(1),
        setup_flags: 0,
        sq_head: i.sq_head,
        cq_tail: i.cq_tail,
        sq_tail: i.sq_tail,
        cq_head: i.cq_head,
        areas,
        files: Vec::new(),
        buffers: Vec::new(),
        issuer: None,
        sq_thread_cpu: None,
        personalities: Vec::new(),
    })
}

/// Per slot, the fd of the process that is the registered file: one
/// whose link is the file's name (several with that name: they must be
/// one open file description).
fn registered_files(fd: &OpenFd<'_>, i: &Info) -> Result<Vec<Option<i32>>, SaveError> {
    let mut files = vec![None; usize::try_from(i.nr_files).unwrap_or(0)];
    if i.files.is_empty() {
        return Ok(files);
    }
    let links: Vec<(i32, String)> = crate::save::list_fds(fd.pid)?
        .into_iter()
        .filter_map(|n| Some((n, crate::save::read_link(fd.pid, &format!("fd/{n}")).ok()?)))
        .collect();
    for (slot, name) in &i.files {
        let same: Vec<i32> = links
            .iter()
            .filter(|(_, l)| l == name)
            .map(|(n, _)| *n)
            .collect();
        let Some(&first) = same.first() else {
            return Err(fd.unsupported(format!(
                "io_uring fd {}: registered file {slot} ({name}) is not open as an fd of the process, which stasis cannot checkpoint",
                fd.fd
            )));
        };
        if same
            .iter()
            .any(|&o| !stasis_kernel::fdops::kcmp_same_file(fd.pid, first, fd.pid, o))
        {
            return Err(fd.unsupported(format!(
                "io_uring fd {}: registered file {slot} ({name}) may be any of fds {same:?}, which are different open files; stasis cannot tell which",
                fd.fd
            )));
        }
        if let Some(f) = files.get_mut(*slot as usize) {
            *f = Some(first);
        }
    }
    Ok(files)
}

/// The memfd name of the memory a restored instance's rings (`rings`) or
/// SQE array (`sqes`) are in: the instance is made with
/// `IORING_SETUP_NO_MMAP` in memory of the process (the kernel maps a
/// ring's own memory only where it chooses, never at a given address),
/// and a later dump finds that memory by this name.
pub fn memfd_name(fd: i32, offset: u64) -> String {
    let part = if offset == sys::IORING_OFF_SQES {
        "sqes"
    } else {
        "rings"
    };
    format!("stasis-io_uring:fd{fd}:{part}")
}

/// The fd and mmap offset a maps name of [`memfd_name`] stands for.
pub fn restored_area(maps_name: &str) -> Option<(i32, u64)> {
    let rest = maps_name
        .strip_prefix("/memfd:stasis-io_uring:fd")?
        .strip_suffix(" (deleted)")?;
    let (fd, part) = rest.split_once(':')?;
    let off = match part {
        "rings" => sys::IORING_OFF_SQ_RING,
        "sqes" => sys::IORING_OFF_SQES,
        _ => return None,
    };
    Some((fd.parse().ok()?, off))
}

/// The largest of the areas mapping `offset` (the rings, or the SQEs):
/// the first of them if several are that large.
fn largest(areas: &[IoUringArea], offset: u64) -> Option<&IoUringArea> {
    areas
        .iter()
        .filter(|a| a.offset == offset)
        .fold(None, |best: Option<&IoUringArea>, a| match best {
            Some(b) if b.end - b.start >= a.end - a.start => Some(b),
            _ => Some(a),
        })
}

/// Whether the `struct io_rings` header in `rings` has the positions and
/// masks fdinfo shows (sq head/tail, cq head/tail, sq/cq ring masks).
fn header_matches(rings: &[u8], i: &Info) -> bool {
    rings.len() >= 24
        && [
            i.sq_head, i.sq_tail, i.cq_head, i.cq_tail, i.sq_mask, i.cq_mask,
        ]
        .iter()
        .enumerate()
        .all(|(k, v)| u32_at(&rings[k * 4..]) == *v)
}

/// Refuses areas of process `pid` mapping an io_uring instance that no fd
/// of the process is (by inode; by fd number for a restored one): they
/// could not be made again.
pub fn check_areas(pid: i32) -> Result<(), SaveError> {
    let mut rings = Vec::new();
    for n in crate::save::list_fds(pid)? {
        let name = format!("fd/{n}");
        if crate::save::read_link(pid, &name).is_ok_and(|l| l == LINK) {
            if let Ok(m) = std::fs::metadata(crate::save::proc_path(pid, &name)) {
                rings.push((n, m.ino()));
            }
        }
    }
    let maps = stasis_kernel::procfs::maps(pid).map_err(stasis_kernel::KernelError::from)?;
    for m in maps {
        let held = if m.name == LINK {
            rings.iter().any(|r| r.1 == m.ino)
        } else if let Some((n, _)) = restored_area(&m.name) {
            rings.iter().any(|r| r.0 == n)
        } else {
            continue;
        };
        if !held {
            return Err(SaveError::Unsupported {
                pid,
                what: format!("it maps the rings of an io_uring instance at {:#x}-{:#x} whose fd it closed (or moved), which stasis cannot checkpoint", m.start, m.end),
            });
        }
    }
    Ok(())
}

/// What a process does for one of its io_uring fds ([`RestoreCtx::claim_io_uring`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Makes the instance ([`restore_in`]).
    Make,
    /// Dups its own fd `0`, of the instance it made already.
    Dup(i32),
    /// Is handed the instance another process made: fd `fd` of the
    /// process that is `pid` in the image and `host` to the restorer
    /// ([`share_in`]).
    Share { pid: i32, host: i32, fd: i32 },
}

impl RestoreCtx<'_> {
    /// For io_uring fd `img` of process `pid` (`host` to the restorer):
    /// whether it makes the instance, or it is another fd of one it or an
    /// earlier process made (inherited, or passed).
    pub fn claim_io_uring(
        &mut self,
        pid: i32,
        host: i32,
        img: &FdImage,
    ) -> Result<Claim, RestoreError> {
        let Some(id) = img.shared_id else {
            return Ok(Claim::Make);
        };
        Ok(match self.io_urings.get(&id) {
            None => {
                self.io_urings.insert(id, (pid, img.fd, host));
                Claim::Make
            }
            Some(&(p, fd, _)) if p == pid => Claim::Dup(fd),
            Some(&(pid, fd, host)) => Claim::Share { pid, host, fd },
        })
    }
}

/// Process `r` is handed io_uring fd `img` that fd `fd` of process `pid`
/// (`host` to the restorer) made ([`Claim::Share`]): it takes the fd
/// itself (`pidfd_getfd`: the kernel does not pass io_uring fds in
/// `SCM_RIGHTS`), and the areas of `img` mapping its rings are mapped
/// from the same memory, the
/// memfds of `host` ([`memfd_name`], opened through its `map_files`),
/// each planted in the process for the moment by `plant` (which answers
/// its number there).
pub fn share_in<R: Remote>(
    r: &mut R,
    img: &FdImage,
    (pid, host, fd): (i32, i32, i32),
    plant: &mut dyn FnMut(&mut R, std::os::fd::BorrowedFd<'_>) -> Result<u64, RestoreError>,
) -> Result<(), RestoreError> {
    let FdKind::IoUring(u) = &img.kind else {
        return Err(crate::restore::not_mine(IoUring::NAME, img));
    };
    let what = || {
        format!(
            "taking io_uring fd {} from fd {fd} of process {pid}",
            img.fd
        )
    };
    let pidfd = r
        .sys(
            "pidfd_open",
            libc::SYS_pidfd_open,
            &[u64::from(pid.unsigned_abs()), 0],
        )
        .map_err(step(what()))?;
    let got = r.sys(
        "pidfd_getfd",
        libc::SYS_pidfd_getfd,
        &[pidfd, u64::from(fd.unsigned_abs()), 0],
    );
    r.sys("close", libc::SYS_close, &[pidfd])
        .map_err(step(what()))?;
    let got = got.map_err(step(what()))?;
    let target = u64::from(img.fd.unsigned_abs());
    let cl = if img.cloexec { libc::O_CLOEXEC } else { 0 };
    r.sys(
        "dup3",
        libc::SYS_dup3,
        &[got, target, u64::from(cl.unsigned_abs())],
    )
    .map_err(step(what()))?;
    r.sys("close", libc::SYS_close, &[got])
        .map_err(step(what()))?;
    let maps = stasis_kernel::procfs::maps(host).map_err(stasis_kernel::KernelError::from)?;
    for offset in [sys::IORING_OFF_SQ_RING, sys::IORING_OFF_SQES] {
        let mine: Vec<&IoUringArea> = u.areas.iter().filter(|a| a.offset == offset).collect();
        if mine.is_empty() {
            continue;
        }
        let name = format!("/memfd:{} (deleted)", memfd_name(fd, offset));
        let Some(m) = maps.iter().find(|m| m.name == name) else {
            return Err(RestoreError::Inconsistent(format!(
                "io_uring fd {}: process {host} has no memory {name} for it",
                img.fd
            )));
        };
        let path = format!("/proc/{host}/map_files/{:x}-{:x}", m.start, m.end);
        let memfd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| RestoreError::Step {
                what: format!("opening {path} for io_uring fd {}", img.fd),
                source: stasis_kernel::KernelError::Io {
                    what: format!("open {path}"),
                    source,
                },
            })?;
        let at = plant(r, std::os::fd::AsFd::as_fd(&memfd))?;
        let flags = u64::from((libc::MAP_SHARED | libc::MAP_FIXED).unsigned_abs());
        let mut res = Ok(());
        for a in &mine {
            let len = a.end - a.start;
            res = r
                .sys(
                    "mmap",
                    libc::SYS_mmap,
                    &[a.start, len, u64::from(a.prot), flags, at, 0],
                )
                .map_err(step(format!(
                    "mapping the rings of io_uring fd {} at {:#x}",
                    img.fd, a.start
                )))
                .and_then(|got| {
                    if got == a.start {
                        Ok(())
                    } else {
                        Err(RestoreError::Layout(format!(
                            "the rings of io_uring fd {} landed at {got:#x}, not {:#x}",
                            img.fd, a.start
                        )))
                    }
                });
            if res.is_err() {
                break;
            }
        }
        r.sys("close", libc::SYS_close, &[at])
            .map_err(step("closing a ring's memory"))?;
        res?;
    }
    Ok(())
}

fn u32_at(b: &[u8]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

/// The thread (TID) other than the main one (`main`) that is the single
/// issuer of ring `img`: the ring is made disabled by the main thread
/// ([`restore_in`] with `later`) and enabled, then filled, by that thread
/// ([`finish_in`]) once it exists.
pub fn enabled_by(img: &FdImage, main: i32) -> Option<i32> {
    match &img.kind {
        FdKind::IoUring(u) => u.issuer.filter(|&t| t != main),
        _ => None,
    }
}

/// Where the kernel puts the positions of `struct io_rings` (the SQ
/// and CQ head and tail first, as `header_matches` reads them) and the
/// SQ index array, for ring `u`: what `io_uring_setup` answers.
fn layout(u: &IoUringRing) -> sys::IoUringParams {
    let mut p = sys::IoUringParams::default();
    (p.sq_off.head, p.sq_off.tail, p.cq_off.head, p.cq_off.tail) = (0, 4, 8, 12);
    if u.setup_flags & sys::IORING_SETUP_NO_SQARRAY == 0 {
        p.sq_off.array = u32::try_from(sq_array_offset(u.cq_entries.into())).unwrap_or(0);
    }
    p
}

/// Makes the instance `img` in the process behind `r` (all its other fds
/// made already), as the module docs say. With `later` (its single
/// issuer is another thread, [`enabled_by`]) it is made disabled and
/// left empty: [`finish_in`], in that thread, enables and fills it.
pub fn restore_in<R: Remote>(
    r: &mut R,
    at: Scratch,
    img: &FdImage,
    later: bool,
) -> Result<(), RestoreError> {
    let FdKind::IoUring(u) = &img.kind else {
        return Err(crate::restore::not_mine(IoUring::NAME, img));
    };
    let what = |w: &str| format!("{w} io_uring fd {}", img.fd);
    let (sq, sqes) = areas(img, u)?;
    for whole in [sq, sqes] {
        memory_at(r, at, img.fd, whole, &u.areas)?;
    }
    // The offsets it should answer (the kernel writes its own over them).
    let want = layout(u);
    let mut req = sys::IoUringParams {
        sq_entries: u.sq_entries,
        cq_entries: u.cq_entries,
        sq_off: want.sq_off,
        cq_off: want.cq_off,
        flags: u.setup_flags
            | sys::IORING_SETUP_NO_MMAP
            | if later {
                sys::IORING_SETUP_R_DISABLED
            } else {
                0
            }
            | if u.sq_thread_cpu.is_some() {
                sys::IORING_SETUP_SQ_AFF
            } else {
                0
            },
        sq_thread_cpu: u.sq_thread_cpu.unwrap_or(0),
        ..Default::default()
    };
    req.sq_off.user_addr = sqes.start;
    req.cq_off.user_addr = sq.start;
    let pa = r
        .put(at.structs, &req.to_bytes())
        .map_err(step(what("setting up")))?;
    let tmp = r
        .sys(
            "io_uring_setup",
            libc::SYS_io_uring_setup,
            &[u.sq_entries.into(), pa],
        )
        .map_err(step(what("making")))?;
    let mut b = [0u8; sys::IO_URING_PARAMS_LEN];
    r.read(pa, &mut b)
        .map_err(step(what("reading the parameters of")))?;
    let p = sys::IoUringParams::from_bytes(&b);
    if (p.sq_entries, p.cq_entries) != (u.sq_entries, u.cq_entries) {
        return Err(RestoreError::Incompatible(format!(
            "io_uring fd {} had {}/{} entries; io_uring_setup here gives {}/{}",
            img.fd, u.sq_entries, u.cq_entries, p.sq_entries, p.cq_entries
        )));
    }
    if (
        p.sq_off.head,
        p.sq_off.tail,
        p.cq_off.head,
        p.cq_off.tail,
        p.sq_off.array,
    ) != (
        want.sq_off.head,
        want.sq_off.tail,
        want.cq_off.head,
        want.cq_off.tail,
        want.sq_off.array,
    ) {
        return Err(RestoreError::Incompatible(format!(
            "io_uring fd {}: io_uring_setup here lays its rings out otherwise ({:?} / {:?})",
            img.fd, p.sq_off, p.cq_off
        )));
    }
    // Files and buffers first: an SQ poll thread takes the entries the
    // program left unsubmitted as soon as they are written back.
    register(r, at, tmp, u).map_err(|e| match e {
        RestoreError::Step { what: w, source } => RestoreError::Step {
            what: format!("{w} of io_uring fd {}", img.fd),
            source,
        },
        e => e,
    })?;
    if !later {
        fill(r, img, tmp)?;
    }
    let target = u64::from(img.fd.unsigned_abs());
    if tmp == target {
        let cloexec = if img.cloexec { libc::FD_CLOEXEC } else { 0 };
        r.sys(
            "fcntl",
            libc::SYS_fcntl,
            &[
                tmp,
                libc::F_SETFD.unsigned_abs().into(),
                cloexec.unsigned_abs().into(),
            ],
        )
        .map_err(step(what("setting the close-on-exec flag of")))?;
    } else {
        let cl = if img.cloexec { libc::O_CLOEXEC } else { 0 };
        r.sys(
            "dup3",
            libc::SYS_dup3,
            &[tmp, target, cl.unsigned_abs().into()],
        )
        .map_err(step(what("moving")))?;
        r.sys("close", libc::SYS_close, &[tmp])
            .map_err(step(what("closing the first fd of")))?;
    }
    let fl = crate::restore::setfl_flags(img.flags);
    if fl != 0 {
        r.sys(
            "fcntl",
            libc::SYS_fcntl,
            &[
                target,
                libc::F_SETFL.unsigned_abs().into(),
                fl.unsigned_abs().into(),
            ],
        )
        .map_err(step(what("setting the status flags of")))?;
    }
    Ok(())
}

/// The largest areas mapping the rings and the SQE array of ring `u`:
/// the memory the ring is made in.
fn areas<'a>(
    img: &FdImage,
    u: &'a IoUringRing,
) -> Result<(&'a IoUringArea, &'a IoUringArea), RestoreError> {
    match (
        largest(&u.areas, sys::IORING_OFF_SQ_RING),
        largest(&u.areas, sys::IORING_OFF_SQES),
    ) {
        (Some(sq), Some(sqes)) => Ok((sq, sqes)),
        _ => Err(RestoreError::Inconsistent(format!(
            "no rings or SQE array for io_uring fd {}",
            img.fd
        ))),
    }
}

/// Brings a made ring (`fd` in the process) to its saved positions
/// ([`drive`]), then writes the saved bytes over its areas and gives
/// them their protection.
fn fill<R: Remote>(r: &mut R, img: &FdImage, fd: u64) -> Result<(), RestoreError> {
    let FdKind::IoUring(u) = &img.kind else {
        return Err(crate::restore::not_mine(IoUring::NAME, img));
    };
    let what = |w: &str| format!("{w} io_uring fd {}", img.fd);
    let (sq, sqes) = areas(img, u)?;
    drive(r, u, (sq.start, sqes.start, sq.start), &layout(u), fd).map_err(|e| match e {
        RestoreError::Step { what: w, source } => RestoreError::Step {
            what: format!("{w} (io_uring fd {})", img.fd),
            source,
        },
        e => e,
    })?;
    let rw = u64::from((libc::PROT_READ | libc::PROT_WRITE).unsigned_abs());
    for a in &u.areas {
        r.write(a.start, &a.data)
            .map_err(step(what("writing the rings of")))?;
        if u64::from(a.prot) != rw {
            r.sys(
                "mprotect",
                libc::SYS_mprotect,
                &[a.start, a.end - a.start, a.prot.into()],
            )
            .map_err(step(what("protecting the rings of")))?;
        }
    }
    // The saved flags of the SQ ring were written too: if they say its
    // poll thread is awake (no IORING_SQ_NEED_WAKEUP) while it sleeps,
    // the program would never wake it. Woken, it sets the flag itself
    // when it sleeps again.
    if u.setup_flags & sys::IORING_SETUP_SQPOLL != 0 {
        r.sys(
            "io_uring_enter",
            libc::SYS_io_uring_enter,
            &[fd, 0, 0, sys::IORING_ENTER_SQ_WAKEUP.into(), 0, 0],
        )
        .map_err(step(what("waking the SQ poll thread of")))?;
    }
    Ok(())
}

/// Run by the thread that is the single issuer of ring `img` ([`enabled_by`]),
/// which [`restore_in`] made disabled: enables it
/// (`IORING_REGISTER_ENABLE_RINGS`, which makes the caller its issuer),
/// then brings it to its positions and content.
pub fn finish_in<R: Remote>(r: &mut R, img: &FdImage) -> Result<(), RestoreError> {
    let fd = u64::from(img.fd.unsigned_abs());
    r.sys(
        "io_uring_register",
        libc::SYS_io_uring_register,
        &[fd, sys::IORING_REGISTER_ENABLE_RINGS.into(), 0, 0],
    )
    .map_err(step(format!(
        "enabling io_uring fd {} in its single issuer",
        img.fd
    )))?;
    fill(r, img, fd)
}

/// The thread (TID) that registers the personalities of ring `img`
/// again, once its credentials are back ([`register_personalities`]):
/// its single issuer, else the main thread (`main`); `None` when it has
/// none.
pub fn personalities_by(img: &FdImage, main: i32) -> Option<i32> {
    match &img.kind {
        FdKind::IoUring(u) if !u.personalities.is_empty() => Some(u.issuer.unwrap_or(main)),
        _ => None,
    }
}

/// Registers the personalities of ring `img` again, with the credentials
/// of the thread behind `r` (the process's): the kernel gives ids in
/// turn from 1, so as many are registered as the largest saved id, and
/// those not saved are unregistered.
pub fn register_personalities<R: Remote>(r: &mut R, img: &FdImage) -> Result<(), RestoreError> {
    let FdKind::IoUring(u) = &img.kind else {
        return Err(crate::restore::not_mine(IoUring::NAME, img));
    };
    let Some(&last) = u.personalities.iter().max() else {
        return Ok(());
    };
    let fd = u64::from(img.fd.unsigned_abs());
    let what = || format!("registering the personalities of io_uring fd {}", img.fd);
    for want in 1..=last {
        let got = r
            .sys(
                "io_uring_register",
                libc::SYS_io_uring_register,
                &[fd, sys::IORING_REGISTER_PERSONALITY.into(), 0, 0],
            )
            .map_err(step(what()))?;
        if got != u64::from(want) {
            return Err(RestoreError::Incompatible(format!(
                "io_uring fd {}: the kernel gave personality id {got}, not {want}",
                img.fd
            )));
        }
    }
    for id in (1..last).filter(|id| !u.personalities.contains(id)) {
        r.sys(
            "io_uring_register",
            libc::SYS_io_uring_register,
            &[fd, sys::IORING_UNREGISTER_PERSONALITY.into(), 0, id.into()],
        )
        .map_err(step(what()))?;
    }
    Ok(())
}

/// Shared memory for the rings or the SQEs of io_uring fd `fd` (`whole`,
/// the largest of `areas` mapping them), at each of their places (over
/// the placeholders the memory restore left): one memfd named
/// [`memfd_name`], mapped at every such area (aliases, as the kernel's
/// own memory was), and closed.
fn memory_at<R: Remote>(
    r: &mut R,
    at: Scratch,
    fd: i32,
    whole: &IoUringArea,
    areas: &[IoUringArea],
) -> Result<(), RestoreError> {
    let what = |a: &IoUringArea| {
        format!(
            "making memory for the rings of io_uring fd {fd} at {:#x}-{:#x}",
            a.start, a.end
        )
    };
    let name = r
        .put_cstr(at.structs, &memfd_name(fd, whole.offset))
        .map_err(step(what(whole)))?;
    let m = r
        .sys(
            "memfd_create",
            libc::SYS_memfd_create,
            &[name, libc::MFD_CLOEXEC.into()],
        )
        .map_err(step(what(whole)))?;
    let rw = u64::from((libc::PROT_READ | libc::PROT_WRITE).unsigned_abs());
    let flags = u64::from((libc::MAP_SHARED | libc::MAP_FIXED).unsigned_abs());
    let mut res = r
        .sys(
            "ftruncate",
            libc::SYS_ftruncate,
            &[m, whole.end - whole.start],
        )
        .map_err(step(what(whole)));
    for a in areas.iter().filter(|a| a.offset == whole.offset) {
        if res.is_err() {
            break;
        }
        let len = a.end - a.start;
        res = match r.sys("mmap", libc::SYS_mmap, &[a.start, len, rw, flags, m, 0]) {
            Ok(got) if got == a.start => Ok(got),
            Ok(got) => Err(RestoreError::Layout(format!(
                "the rings of io_uring fd {fd} landed at {got:#x}, not {:#x}",
                a.start
            ))),
            Err(e) => Err(step(what(a))(e)),
        };
    }
    r.sys("close", libc::SYS_close, &[m])
        .map_err(step(what(whole)))?;
    res.map(drop)
}

/// Brings a new ring's SQ head and CQ tail (which only the kernel moves)
/// to the saved ones: batches of NOPs (zeroed entries) submitted and
/// reaped. `(sq, sqes, cq)`: where its areas are mapped; `p`: where its
/// positions are in them (what `io_uring_setup` answered, [`layout`]).
fn drive<R: Remote>(
    r: &mut R,
    u: &IoUringRing,
    (sq, sqes, cq): (u64, u64, u64),
    p: &sys::IoUringParams,
    fd: u64,
) -> Result<(), RestoreError> {
    let target = u.sq_head;
    if target == 0 {
        return Ok(());
    }
    let n = u64::from(u.sq_entries);
    if u.setup_flags & sys::IORING_SETUP_NO_SQARRAY == 0 {
        let index: Vec<u8> = (0..u.sq_entries).flat_map(u32::to_ne_bytes).collect();
        r.write(sq + u64::from(p.sq_off.array), &index)
            .map_err(step("writing the SQ index array"))?;
    }
    let zeros = vec![0u8; usize::try_from(n).unwrap_or(0) * sys::SQE_LEN];
    r.write(sqes, &zeros).map_err(step("writing NOP entries"))?;
    // With an SQ poll thread, io_uring_enter only wakes it (it takes the
    // entries itself) and waits for their completions.
    let sqpoll = u.setup_flags & sys::IORING_SETUP_SQPOLL != 0;
    let flags = sys::IORING_ENTER_GETEVENTS
        | if sqpoll {
            sys::IORING_ENTER_SQ_WAKEUP
        } else {
            0
        };
    let mut cur = 0u32;
    while cur != target {
        let batch = u64::from(target.wrapping_sub(cur)).min(n);
        let next = cur.wrapping_add(u32::try_from(batch).unwrap_or(0));
        r.write(sq + u64::from(p.sq_off.tail), &next.to_ne_bytes())
            .map_err(step("moving the SQ tail"))?;
        let got = r
            .sys(
                "io_uring_enter",
                libc::SYS_io_uring_enter,
                &[fd, batch, batch, flags.into(), 0, 0],
            )
            .map_err(step("submitting NOPs to bring its positions back"))?;
        if got != batch {
            return Err(RestoreError::Layout(format!(
                "io_uring took {got} of {batch} NOPs bringing its positions back"
            )));
        }
        cur = next;
        r.write(cq + u64::from(p.cq_off.head), &cur.to_ne_bytes())
            .map_err(step("reaping NOPs"))?;
    }
    // An SQ poll thread posts the completions of a batch a moment before
    // it moves the SQ head past it.
    let mut h = [0u8; 4];
    let since = std::time::Instant::now();
    loop {
        r.read(sq + u64::from(p.sq_off.head), &mut h)
            .map_err(step("reading the SQ head"))?;
        if !sqpoll || u32_at(&h) == target || since.elapsed().as_secs() >= 1 {
            break;
        }
        std::thread::yield_now();
    }
    let mut t = [0u8; 4];
    r.read(cq + u64::from(p.cq_off.tail), &mut t)
        .map_err(step("reading the CQ tail"))?;
    if (u32_at(&h), u32_at(&t)) != (u.sq_head, u.cq_tail) {
        return Err(RestoreError::Layout(format!(
            "io_uring has SQ head {} and CQ tail {} after the NOPs, not {} and {}",
            u32_at(&h),
            u32_at(&t),
            u.sq_head,
            u.cq_tail
        )));
    }
    Ok(())
}

/// Registers the saved files and buffers again: a sparse table of each,
/// then its slots in chunks.
fn register<R: Remote>(
    r: &mut R,
    at: Scratch,
    fd: u64,
    u: &IoUringRing,
) -> Result<(), RestoreError> {
    let files: Vec<Vec<u8>> = u
        .files
        .iter()
        .map(|f| f.unwrap_or(-1).to_ne_bytes().to_vec())
        .collect();
    let bufs: Vec<Vec<u8>> = u
        .buffers
        .iter()
        .map(|b| {
            let (a, l) = b.unwrap_or((0, 0));
            [a.to_ne_bytes(), l.to_ne_bytes()].concat()
        })
        .collect();
    for (slots, any, ops, what) in [
        (
            &files,
            u.files.iter().any(Option::is_some),
            (
                sys::IORING_REGISTER_FILES2,
                sys::IORING_REGISTER_FILES_UPDATE2,
            ),
            "registering the files",
        ),
        (
            &bufs,
            u.buffers.iter().any(Option::is_some),
            (
                sys::IORING_REGISTER_BUFFERS2,
                sys::IORING_REGISTER_BUFFERS_UPDATE,
            ),
            "registering the buffers",
        ),
    ] {
        if slots.is_empty() {
            continue;
        }
        let nr = u32::try_from(slots.len()).unwrap_or(u32::MAX);
        let reg = sys::RsrcRegister {
            nr,
            flags: sys::IORING_RSRC_REGISTER_SPARSE,
            ..Default::default()
        };
        let a = r.put(at.structs, &reg.to_bytes()).map_err(step(what))?;
        r.sys(
            "io_uring_register",
            libc::SYS_io_uring_register,
            &[fd, ops.0.into(), a, sys::RSRC_REGISTER_LEN as u64],
        )
        .map_err(step(what))?;
        if !any {
            continue;
        }
        for (k, chunk) in slots.chunks(CHUNK).enumerate() {
            let data = r
                .put(at.structs + 64, &chunk.concat())
                .map_err(step(what))?;
            let up = sys::RsrcUpdate2 {
                offset: u32::try_from(k * CHUNK).unwrap_or(u32::MAX),
                data,
                nr: u32::try_from(chunk.len()).unwrap_or(0),
                ..Default::default()
            };
            let a = r.put(at.structs, &up.to_bytes()).map_err(step(what))?;
            r.sys(
                "io_uring_register",
                libc::SYS_io_uring_register,
                &[fd, ops.1.into(), a, sys::RSRC_UPDATE2_LEN as u64],
            )
            .map_err(step(what))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use stasis_kernel::remote::Recorder;

    use super::*;

    const INFO: &str = "pos:\t0\nflags:\t02000002\nmnt_id:\t17\nino:\t8801541\nSqMask:\t0x7\nSqHead:\t24\nSqTail:\t26\nCachedSqHead:\t24\nCqMask:\t0xf\nCqHead:\t21\nCqTail:\t24\nCachedCqTail:\t24\nSQEs:\t2\n    0: opcode:NOP, fd:-1, flags:0, off:0, addr:0x0, rw_flags:0x0, buf_index:0 user_data:177\nCQEs:\t3\n    5: user_data:161, res:0, flag:0\nSqThread:\t-1\nSqThreadCpu:\t-1\nSqTotalTime:\t0\nSqWorkTime:\t0\nUserFiles:\t3\n    0: /tmp/ur/w/io_uring.data\n    2: pipe:[8801540]\nUserBufs:\t2\n    0: 0x559ac112f000/4096\n    1: 0x559ac1130000/4096\nPollList:\nCqOverflowList:\nNAPI:\tdisabled\n";

    #[test]
    fn fdinfo_gives_positions_files_and_buffers() {
        let i = parse(INFO).unwrap();
        assert_eq!(
            (i.sq_mask, i.sq_head, i.sq_tail, i.cached_sq_head),
            (7, 24, 26, 24)
        );
        assert_eq!(
            (i.cq_mask, i.cq_head, i.cq_tail, i.cached_cq_tail),
            (15, 21, 24, 24)
        );
        assert_eq!(i.sq_thread, -1);
        assert_eq!(i.nr_files, 3);
        assert_eq!(
            i.files,
            [
                (0, "/tmp/ur/w/io_uring.data".to_string()),
                (2, "pipe:[8801540]".to_string())
            ]
        );
        assert_eq!(
            i.buffers,
            [(0, 0x559a_c112_f000, 4096), (1, 0x559a_c113_0000, 4096)]
        );
        assert_eq!(
            (i.polls, i.overflowed, i.personalities.len(), i.napi),
            (0, 0, 0, false)
        );
        assert_eq!(refusal(6, &i), None);
        assert!(parse("pos:\t0\n").is_err());
    }

    #[test]
    fn requests_in_flight_and_other_state_are_refused_by_name() {
        let idle = parse(INFO).unwrap();
        let poll = INFO.replace("PollList:\n", "PollList:\n  op=22, task_works=0\n");
        let r = refusal(6, &parse(&poll).unwrap()).unwrap();
        assert!(
            r.contains("io_uring fd 6") && r.contains("in flight"),
            "{r}"
        );
        let taken = Info {
            cached_sq_head: 25,
            sq_head: 25,
            ..idle.clone()
        };
        let r = refusal(6, &taken).unwrap();
        assert!(r.contains("took 25 entries and posted 24"), "{r}");
        let over = INFO.replace(
            "CqOverflowList:\n",
            "CqOverflowList:\n  user_data=1, res=0, flags=0\n",
        );
        assert!(refusal(6, &parse(&over).unwrap())
            .unwrap()
            .contains("overflowed"));
    }

    #[test]
    fn rings_len_is_the_kernels() {
        // 8 SQ / 16 CQ entries: CQEs at 64, the index array at 320.
        assert_eq!(rings_len(8, 16, true), 320 + 32);
        assert_eq!(rings_len(8, 16, false), 320);
        assert_eq!(rings_len(4096, 8192, true), 64 + 8192 * 16 + 4096 * 4);
    }

    fn ring(sq_head: u32, files: Vec<Option<i32>>) -> FdImage {
        FdImage {
            fd: 9,
            flags: 0,
            cloexec: true,
            shared_id: None,
            locks: vec![],
            owner: None,
            kind: FdKind::IoUring(IoUringRing {
                ino: 1,
                sq_entries: 8,
                cq_entries: 16,
                setup_flags: 0,
                sq_head,
                cq_tail: sq_head,
                sq_tail: sq_head,
                cq_head: sq_head,
                areas: vec![
                    IoUringArea {
                        start: 0x7000_0000,
                        end: 0x7000_1000,
                        offset: sys::IORING_OFF_SQ_RING,
                        prot: (libc::PROT_READ | libc::PROT_WRITE).unsigned_abs(),
                        data: vec![1; 4096],
                    },
                    IoUringArea {
                        start: 0x7000_2000,
                        end: 0x7000_3000,
                        offset: sys::IORING_OFF_SQES,
                        prot: (libc::PROT_READ | libc::PROT_WRITE).unsigned_abs(),
                        data: vec![2; 4096],
                    },
                    // The CQ ring mapped apart: an alias of the rings.
                    IoUringArea {
                        start: 0x7000_4000,
                        end: 0x7000_5000,
                        offset: sys::IORING_OFF_SQ_RING,
                        prot: (libc::PROT_READ | libc::PROT_WRITE).unsigned_abs(),
                        data: vec![1; 4096],
                    },
                ],
                files,
                buffers: vec![None, Some((0x5000, 4096))],
                issuer: None,
                sq_thread_cpu: None,
                personalities: vec![],
            }),
        }
    }

    #[test]
    fn an_idle_ring_is_made_mapped_filled_registered_and_moved() {
        let mut r = Recorder::default();
        let img = ring(0, vec![Some(3), None]);
        // The recorder answers 0 to io_uring_setup and echoes the
        // parameters written: the sizes asked for.
        restore_in(&mut r, Scratch { structs: 4096 }, &img, false).unwrap();
        let mut want = vec!["memfd_create", "ftruncate", "mmap", "mmap", "close"];
        want.extend(["memfd_create", "ftruncate", "mmap", "close"]);
        want.extend(["io_uring_setup"]);
        want.extend(["io_uring_register"; 4]);
        want.extend(["dup3", "close"]);
        assert_eq!(r.names(), want);
        // One memfd for the rings, mapped at both their places; one for
        // the SQEs.
        let mm: Vec<u64> = r.args_of("mmap").iter().map(|a| a[0]).collect();
        assert_eq!(mm, [0x7000_0000, 0x7000_4000, 0x7000_2000]);
        let w = r.writes();
        let params = w
            .iter()
            .find(|w| w.len() == sys::IO_URING_PARAMS_LEN)
            .unwrap();
        let p = sys::IoUringParams::from_bytes(params.as_slice().try_into().unwrap());
        assert_eq!(p.flags, sys::IORING_SETUP_NO_MMAP);
        assert_eq!(
            (p.sq_off.user_addr, p.cq_off.user_addr),
            (0x7000_2000, 0x7000_0000)
        );
        assert!(r
            .writes()
            .contains(&b"stasis-io_uring:fd9:rings\0".to_vec()));
        assert_eq!(
            restored_area("/memfd:stasis-io_uring:fd9:sqes (deleted)"),
            Some((9, sys::IORING_OFF_SQES))
        );
        assert_eq!(restored_area("/memfd:other (deleted)"), None);
        let regs: Vec<u64> = r
            .args_of("io_uring_register")
            .iter()
            .map(|a| a[1])
            .collect();
        assert_eq!(
            regs,
            [
                u64::from(sys::IORING_REGISTER_FILES2),
                u64::from(sys::IORING_REGISTER_FILES_UPDATE2),
                u64::from(sys::IORING_REGISTER_BUFFERS2),
                u64::from(sys::IORING_REGISTER_BUFFERS_UPDATE)
            ]
        );
        // The file table: fd 3, then an empty slot.
        assert!(r
            .writes()
            .contains(&[3i32.to_ne_bytes(), (-1i32).to_ne_bytes()].concat()));
        assert!(r.writes().contains(&vec![1; 4096]) && r.writes().contains(&vec![2; 4096]));
        assert_eq!(
            r.args_of("dup3"),
            [vec![0, 9, libc::O_CLOEXEC.unsigned_abs().into()]]
        );
    }

    #[test]
    fn a_ring_of_another_issuer_is_made_disabled_then_enabled_and_filled_by_it() {
        let mut img = ring(0, vec![]);
        let FdKind::IoUring(u) = &mut img.kind else {
            unreachable!()
        };
        u.setup_flags = sys::IORING_SETUP_SINGLE_ISSUER | sys::IORING_SETUP_DEFER_TASKRUN;
        u.issuer = Some(101);
        assert_eq!(enabled_by(&img, 100), Some(101));
        assert_eq!(enabled_by(&img, 101), None, "the main thread's: made by it");
        let mut r = Recorder::default();
        restore_in(&mut r, Scratch { structs: 4096 }, &img, true).unwrap();
        let params = r
            .writes()
            .into_iter()
            .find(|w| w.len() == sys::IO_URING_PARAMS_LEN)
            .unwrap();
        let p = sys::IoUringParams::from_bytes(params.as_slice().try_into().unwrap());
        assert_eq!(
            p.flags,
            sys::IORING_SETUP_SINGLE_ISSUER
                | sys::IORING_SETUP_DEFER_TASKRUN
                | sys::IORING_SETUP_NO_MMAP
                | sys::IORING_SETUP_R_DISABLED
        );
        // Left empty: nothing written over its areas yet.
        assert!(!r.writes().contains(&vec![1; 4096]));
        let mut r = Recorder::default();
        finish_in(&mut r, &img).unwrap();
        assert_eq!(
            r.args_of("io_uring_register"),
            [vec![9, u64::from(sys::IORING_REGISTER_ENABLE_RINGS), 0, 0]]
        );
        assert!(r.writes().contains(&vec![1; 4096]) && r.writes().contains(&vec![2; 4096]));
    }

    #[test]
    fn a_ring_with_an_sq_poll_thread_gets_one_on_its_cpu_and_woken() {
        let mut img = ring(0, vec![Some(3)]);
        let FdKind::IoUring(u) = &mut img.kind else {
            unreachable!()
        };
        u.setup_flags = sys::IORING_SETUP_SQPOLL;
        u.sq_thread_cpu = Some(1);
        let mut r = Recorder::default();
        restore_in(&mut r, Scratch { structs: 4096 }, &img, false).unwrap();
        let params = r
            .writes()
            .into_iter()
            .find(|w| w.len() == sys::IO_URING_PARAMS_LEN)
            .unwrap();
        let p = sys::IoUringParams::from_bytes(params.as_slice().try_into().unwrap());
        assert_eq!(
            (p.flags, p.sq_thread_cpu),
            (
                sys::IORING_SETUP_SQPOLL | sys::IORING_SETUP_SQ_AFF | sys::IORING_SETUP_NO_MMAP,
                1
            )
        );
        // Files registered before the saved entries are written back
        // (the thread takes them at once), then the thread woken.
        let names = r.names();
        let at = |n: &str| names.iter().position(|x| *x == n).unwrap();
        assert!(at("io_uring_register") < at("io_uring_enter"), "{names:?}");
        assert_eq!(
            r.args_of("io_uring_enter"),
            [vec![0, 0, 0, u64::from(sys::IORING_ENTER_SQ_WAKEUP), 0, 0]]
        );
    }

    // Older kernels show personalities (6.18 does not).
    const PERSONALITIES: &str = "Personalities:\n    2\n\tUid:\t1000\t\t1000\t\t1000\t\t1000\n\tGid:\t100\t\t100\t\t100\t\t100\n\tGroups:\t27 100\n\tCapEff:\t0000000000000000\nPollList:\n";

    #[test]
    fn personalities_are_read_and_compared_with_the_process() {
        let i = parse(&INFO.replace("PollList:\n", PERSONALITIES)).unwrap();
        assert_eq!(
            i.personalities,
            [Personality {
                id: 2,
                uid: vec![1000; 4],
                gid: vec![100; 4],
                groups: vec![27, 100],
                cap_eff: 0
            }]
        );
        let status = "Name:\tx\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\nGroups:\t100 27 \nCapEff:\t0000000000000000\n";
        let own = Personality::of_status(status).unwrap();
        assert!(i.personalities[0].same_creds(&own));
        let root = Personality::of_status(&status.replace("1000", "0")).unwrap();
        assert!(!i.personalities[0].same_creds(&root));
    }

    /// A remote whose `IORING_REGISTER_PERSONALITY` answers ids in turn.
    struct Ids(Recorder, u64);

    impl Remote for Ids {
        fn sys(
            &mut self,
            name: &'static str,
            nr: i64,
            args: &[u64],
        ) -> Result<u64, stasis_kernel::KernelError> {
            self.0.sys(name, nr, args)?;
            if args.get(1) == Some(&u64::from(sys::IORING_REGISTER_PERSONALITY)) {
                self.1 += 1;
                return Ok(self.1);
            }
            Ok(0)
        }
        fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), stasis_kernel::KernelError> {
            self.0.write(addr, data)
        }
        fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), stasis_kernel::KernelError> {
            self.0.read(addr, buf)
        }
        fn scratch(&self) -> u64 {
            self.0.scratch()
        }
        fn scratch_len(&self) -> usize {
            self.0.scratch_len()
        }
    }

    #[test]
    fn personalities_get_their_ids_back() {
        let mut img = ring(0, vec![]);
        let FdKind::IoUring(u) = &mut img.kind else {
            unreachable!()
        };
        u.personalities = vec![2, 4];
        assert_eq!(personalities_by(&img, 100), Some(100), "the main thread");
        let mut r = Ids(Recorder::default(), 0);
        register_personalities(&mut r, &img).unwrap();
        let ops: Vec<(u64, u64)> =
            r.0.args_of("io_uring_register")
                .iter()
                .map(|a| (a[1], a[3]))
                .collect();
        let (reg, unreg) = (
            u64::from(sys::IORING_REGISTER_PERSONALITY),
            u64::from(sys::IORING_UNREGISTER_PERSONALITY),
        );
        // 1 to 4 registered, 1 and 3 (not saved) unregistered.
        assert_eq!(
            ops,
            [
                (reg, 0),
                (reg, 0),
                (reg, 0),
                (reg, 0),
                (unreg, 1),
                (unreg, 3)
            ]
        );
        // A kernel giving other ids: said so.
        let e = register_personalities(&mut Recorder::default(), &img).unwrap_err();
        assert!(
            e.to_string().contains("gave personality id 0, not 1"),
            "{e}"
        );
    }

    #[test]
    fn positions_are_brought_back_with_nops() {
        // The recorder's io_uring_enter takes nothing: the refill stops
        // there, saying so.
        let mut r = Recorder::default();
        let e =
            restore_in(&mut r, Scratch { structs: 4096 }, &ring(20, vec![]), false).unwrap_err();
        assert!(e.to_string().contains("took 0 of 8 NOPs"), "{e}");
        assert_eq!(r.args_of("io_uring_enter")[0][1..4], [8, 8, 1]);
    }
}
