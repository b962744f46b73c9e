//! `sock_diag` for TCP (`linux/sock_diag.h`, `linux/inet_diag.h`): message
//! types and the layouts of the request and the reply, with their sizes
//! checked at compile time.
//! (The netlink constants they share with unix sockets are in [`crate::net`].)

/// `nlmsg_type` that closes one socket (`SOCK_DESTROY`, needs
/// `CONFIG_INET_DIAG_DESTROY` and `CAP_NET_ADMIN`).
pub const SOCK_DESTROY: u16 = 21;

/// `struct inet_diag_sockid`: ports and addresses in network byte order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InetDiagSockId {
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub ifindex: u32,
    pub cookie: [u32; 2],
}

/// `struct inet_diag_req_v2`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct InetDiagReqV2 {
    pub family: u8,
    pub protocol: u8,
    pub ext: u8,
    pub pad: u8,
    pub states: u32,
    pub id: InetDiagSockId,
}

/// `struct inet_diag_msg` (the fixed part of each reply; attributes follow).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct InetDiagMsg {
    pub family: u8,
    pub state: u8,
    pub timer: u8,
    pub retrans: u8,
    pub id: InetDiagSockId,
    pub expires: u32,
    pub rqueue: u32,
    pub wqueue: u32,
    pub uid: u32,
    pub inode: u32,
}

const _: () = assert!(std::mem::size_of::<InetDiagSockId>() == 48);
const _: () = assert!(std::mem::size_of::<InetDiagReqV2>() == 56);
const _: () = assert!(std::mem::size_of::<InetDiagMsg>() == 72);
const _: () = assert!(std::mem::offset_of!(InetDiagMsg, inode) == 68);
