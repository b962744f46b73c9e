//! Kernel ABI of tun/tap devices (linux/if_tun.h, linux/if.h): the ioctls
//! of an fd on `/dev/net/tun`, its interface flags, `struct ifreq` as
//! `TUNSETIFF` and `TUNGETIFF` use it, and the `IFLA_TUN_*` attributes
//! rtnetlink gives a tun link (kind `tun`) in `IFLA_INFO_DATA`.

use core::mem::size_of;

/// `_IOW('T', 202, int)`: attaches the fd to the device its `ifreq` names
/// (made if missing), with its flags.
pub const TUNSETIFF: u64 = 0x4004_54ca;
/// `_IOR('T', 210, unsigned int)`: the attached device's name and flags.
pub const TUNGETIFF: u64 = 0x8004_54d2;
/// `_IOW('T', 203, int)`: the device outlives its fds (1) or not (0).
pub const TUNSETPERSIST: u64 = 0x4004_54cb;
/// `_IOW('T', 204, int)`: the uid allowed to attach (the argument itself).
pub const TUNSETOWNER: u64 = 0x4004_54cc;
/// `_IOW('T', 206, int)`: the gid allowed to attach (the argument itself).
pub const TUNSETGROUP: u64 = 0x4004_54ce;
/// `_IOW('T', 217, int)`: attaches or detaches a queue of a multi-queue
/// device (`IFF_ATTACH_QUEUE`, `IFF_DETACH_QUEUE` in an `ifreq`).
pub const TUNSETQUEUE: u64 = 0x4004_54d9;

/// `SIOCGSKNS` (linux/sockios.h): a new fd on the network namespace of
/// the tun fd (of its device), as its return value.
pub const SIOCGSKNS: u64 = 0x894C;

/// The device's kind: layer 3 (`tun`) or Ethernet (`tap`).
pub const IFF_TUN: u16 = 0x0001;
pub const IFF_TAP: u16 = 0x0002;
/// The kinds' mask.
pub const TUN_TYPE_MASK: u16 = 0x000f;
pub const IFF_NAPI: u16 = 0x0010;
pub const IFF_NAPI_FRAGS: u16 = 0x0020;
/// Without the 4-byte packet information header.
pub const IFF_NO_PI: u16 = 0x1000;
/// Ignored since Linux 3.8, kept as given.
pub const IFF_ONE_QUEUE: u16 = 0x2000;
/// With a `virtio_net_hdr` before each packet.
pub const IFF_VNET_HDR: u16 = 0x4000;
pub const IFF_TUN_EXCL: u16 = 0x8000;
pub const IFF_MULTI_QUEUE: u16 = 0x0100;
pub const IFF_ATTACH_QUEUE: u16 = 0x0200;
/// `TUNGETIFF`: this queue is detached; `TUNSETQUEUE`: detach it.
pub const IFF_DETACH_QUEUE: u16 = 0x0400;
/// `TUNGETIFF` only: the device is persistent.
pub const IFF_PERSIST: u16 = 0x0800;
/// `TUNGETIFF` only: the fd has no socket filter.
pub const IFF_NOFILTER: u16 = 0x1000;

/// The flags `TUNSETIFF` takes as features of a device (`TUN_FEATURES`
/// with the kind): what an fd gives when it attaches.
pub const TUN_SET_FLAGS: u16 = TUN_TYPE_MASK
    | IFF_NO_PI
    | IFF_ONE_QUEUE
    | IFF_VNET_HDR
    | IFF_MULTI_QUEUE
    | IFF_NAPI
    | IFF_NAPI_FRAGS;

/// `IFNAMSIZ`: an interface name with its terminating zero.
pub const IFNAMSIZ: usize = 16;

/// `struct ifreq` with its `ifr_flags` member (the union is 24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IfreqFlags {
    pub name: [u8; IFNAMSIZ],
    pub flags: u16,
    pub pad: [u8; 22],
}
const _: () = assert!(size_of::<IfreqFlags>() == 40);

/// `IFLA_TUN_*` (nested in `IFLA_INFO_DATA` of a link of kind `tun`).
pub const IFLA_TUN_OWNER: u16 = 1;
pub const IFLA_TUN_GROUP: u16 = 2;
/// `IFF_TUN` or `IFF_TAP` (u8).
pub const IFLA_TUN_TYPE: u16 = 3;
/// u8: packets carry the information header (not `IFF_NO_PI`).
pub const IFLA_TUN_PI: u16 = 4;
pub const IFLA_TUN_VNET_HDR: u16 = 5;
pub const IFLA_TUN_PERSIST: u16 = 6;
pub const IFLA_TUN_MULTI_QUEUE: u16 = 7;
pub const IFLA_TUN_NUM_QUEUES: u16 = 8;
pub const IFLA_TUN_NUM_DISABLED_QUEUES: u16 = 9;

/// The misc device `/dev/net/tun`: major 10, minor 200.
pub const TUN_MAJOR: u32 = 10;
pub const TUN_MINOR: u32 = 200;

#[cfg(test)]
mod tests {
    use super::*;

    const fn ioc(dir: u64, ty: u8, nr: u8, size: u64) -> u64 {
        (dir << 30) | (size << 16) | ((ty as u64) << 8) | nr as u64
    }

    #[test]
    fn ioctl_numbers_match_their_encoding() {
        const W: u64 = 1;
        const R: u64 = 2;
        assert_eq!(TUNSETIFF, ioc(W, b'T', 202, 4));
        assert_eq!(TUNSETPERSIST, ioc(W, b'T', 203, 4));
        assert_eq!(TUNSETOWNER, ioc(W, b'T', 204, 4));
        assert_eq!(TUNSETGROUP, ioc(W, b'T', 206, 4));
        assert_eq!(TUNGETIFF, ioc(R, b'T', 210, 4));
        assert_eq!(TUNSETQUEUE, ioc(W, b'T', 217, 4));
        assert_eq!(libc::IFNAMSIZ, IFNAMSIZ);
        assert_eq!(size_of::<libc::ifreq>(), size_of::<IfreqFlags>());
    }
}
