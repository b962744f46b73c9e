//! Safe wrappers over the ioctls of an fd on `/dev/net/tun`: open one (in
//! the calling thread's network namespace, where its device is made or
//! looked up), attach it to a device by name with its flags
//! (`TUNSETIFF`), read what it is attached to (`TUNGETIFF`), and set a
//! device's persistence, owner and group, and a queue's detached state.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use stasis_sys::tun::{
    IfreqFlags, IFF_DETACH_QUEUE, IFNAMSIZ, SIOCGSKNS, TUNGETIFF, TUNSETGROUP, TUNSETIFF,
    TUNSETOWNER, TUNSETPERSIST, TUNSETQUEUE,
};

fn check(r: i32) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// An `ifreq` naming `name` with `flags` (a name too long is refused).
fn ifreq(name: &str, flags: u16) -> io::Result<IfreqFlags> {
    let mut r = IfreqFlags::default();
    let b = name.as_bytes();
    if b.len() >= IFNAMSIZ || b.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not an interface name"),
        ));
    }
    r.name[..b.len()].copy_from_slice(b);
    r.flags = flags;
    Ok(r)
}

/// Opens `/dev/net/tun` (`O_RDWR | O_CLOEXEC`, plus `flags`): an fd
/// attached to nothing, of the calling thread's network namespace.
pub fn open(flags: i32) -> io::Result<OwnedFd> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC | flags)
        .open("/dev/net/tun")?;
    Ok(f.into())
}

/// `TUNSETIFF`: attaches `fd` to the device `name` with `flags` (`IFF_TUN`
/// or `IFF_TAP`, `IFF_NO_PI`...), making it if it does not exist.
pub fn set_iff(fd: BorrowedFd<'_>, name: &str, flags: u16) -> io::Result<()> {
    let mut r = ifreq(name, flags)?;
    // SAFETY: TUNSETIFF reads (and writes back) one `struct ifreq`, which
    // `IfreqFlags` is in size and layout (asserted in stasis-sys).
    check(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &raw mut r) })
}

/// `TUNGETIFF`: the name of the device `fd` is attached to and its flags
/// (`IFF_DETACH_QUEUE` for a detached queue, `IFF_PERSIST`...); `None`
/// when attached to none (`EBADFD`).
pub fn get_iff(fd: BorrowedFd<'_>) -> io::Result<Option<(String, u16)>> {
    let mut r = IfreqFlags::default();
    // SAFETY: TUNGETIFF writes one `struct ifreq`, which `IfreqFlags` is
    // in size and layout (asserted in stasis-sys).
    match check(unsafe { libc::ioctl(fd.as_raw_fd(), TUNGETIFF, &raw mut r) }) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EBADFD) => return Ok(None),
        Err(e) => return Err(e),
    }
    let end = r.name.iter().position(|&c| c == 0).unwrap_or(IFNAMSIZ);
    let name = String::from_utf8_lossy(&r.name[..end]).into_owned();
    Ok(Some((name, r.flags)))
}

/// `SIOCGSKNS`: the network namespace of `fd` (the one it was opened in,
/// where its device is), as a new fd.
pub fn netns_of(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: SIOCGSKNS takes no argument and returns a new fd, or -1.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), SIOCGSKNS) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `r` is a new fd the kernel just opened for this process,
    // owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// An ioctl of an attached fd whose argument is the integer itself.
fn set_value(fd: BorrowedFd<'_>, req: u64, v: libc::c_ulong) -> io::Result<()> {
    // SAFETY: `req` (TUNSETPERSIST, TUNSETOWNER, TUNSETGROUP) takes its
    // argument by value, not through a pointer.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), req, v) })
}

/// `TUNSETPERSIST`: the device of `fd` outlives its fds, or not.
pub fn set_persist(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    set_value(fd, TUNSETPERSIST, libc::c_ulong::from(on))
}

/// `TUNSETOWNER`: only `uid` (or a process with `CAP_NET_ADMIN`) may
/// attach to the device of `fd`.
pub fn set_owner(fd: BorrowedFd<'_>, uid: u32) -> io::Result<()> {
    set_value(fd, TUNSETOWNER, libc::c_ulong::from(uid))
}

/// `TUNSETGROUP`: only members of `gid` (or a process with
/// `CAP_NET_ADMIN`) may attach to the device of `fd`.
pub fn set_group(fd: BorrowedFd<'_>, gid: u32) -> io::Result<()> {
    set_value(fd, TUNSETGROUP, libc::c_ulong::from(gid))
}

/// `TUNSETQUEUE(IFF_DETACH_QUEUE)`: detaches the queue of `fd` from its
/// multi-queue device (it stays bound to it, receiving nothing).
pub fn detach_queue(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut r = IfreqFlags {
        flags: IFF_DETACH_QUEUE,
        ..Default::default()
    };
    // SAFETY: TUNSETQUEUE reads one `struct ifreq` (its flags), which
    // `IfreqFlags` is in size and layout (asserted in stasis-sys).
    check(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETQUEUE, &raw mut r) })
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use stasis_sys::tun::{IFF_NO_PI, IFF_PERSIST, IFF_TAP, IFF_TUN};

    use super::*;

    #[test]
    fn a_tun_is_made_attached_read_back_and_gone_with_its_fd() {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let t = open(0).unwrap();
            assert_eq!(get_iff(t.as_fd()).unwrap(), None);
            set_iff(t.as_fd(), "stasis-t0", IFF_TUN | IFF_NO_PI).unwrap();
            let (name, flags) = get_iff(t.as_fd()).unwrap().unwrap();
            assert_eq!(name, "stasis-t0");
            assert_eq!(flags & (IFF_TUN | IFF_TAP | IFF_NO_PI), IFF_TUN | IFF_NO_PI);
            assert_eq!(flags & IFF_PERSIST, 0);
            use std::os::unix::fs::MetadataExt;
            let ns = std::fs::File::from(netns_of(t.as_fd()).unwrap());
            let me = std::fs::metadata("/proc/thread-self/ns/net").unwrap();
            assert_eq!(ns.metadata().unwrap().ino(), me.ino());
            set_persist(t.as_fd(), true).unwrap();
            set_owner(t.as_fd(), 1234).unwrap();
            drop(t);
            let links = crate::rtnl::Rtnl::open().unwrap().links().unwrap();
            let l = links.iter().find(|l| l.name == "stasis-t0").unwrap();
            let info = l.tun.clone().unwrap();
            assert_eq!(
                (info.flags & IFF_TUN, info.persist, info.owner),
                (IFF_TUN, true, Some(1234))
            );
            // Attached again by name, made not persistent: gone with its fd.
            let t = open(0).unwrap();
            set_iff(t.as_fd(), "stasis-t0", IFF_TUN | IFF_NO_PI).unwrap();
            set_persist(t.as_fd(), false).unwrap();
            drop(t);
            let links = crate::rtnl::Rtnl::open().unwrap().links().unwrap();
            assert!(!links.iter().any(|l| l.name == "stasis-t0"));
            assert!(ifreq("a-name-far-too-long", 0).is_err());
        })
        .join()
        .unwrap();
    }
}
