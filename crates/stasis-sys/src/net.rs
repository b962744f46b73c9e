//! Kernel constants of the objects Stasis saves and rebuilds: TCP repair,
//! socket queue ioctls, `kcmp`, timerfd, System V shared memory.
//!
//! Where `libc` has the same constant, a compile-time assertion checks the
//! two agree; the others are checked against their kernel definition.

use core::mem::size_of;

// --- Raw sockets (include/uapi/linux/icmp.h, icmpv6.h) ---------------------

/// `SOL_RAW` option of an IPPROTO_ICMP raw socket: `struct icmp_filter`
/// (one 32-bit mask of the ICMP types it does not receive).
pub const ICMP_FILTER: i32 = 1;
/// `IPPROTO_ICMPV6` option of an IPPROTO_ICMPV6 raw socket:
/// `struct icmp6_filter` (256 bits, one per ICMPv6 type, set: blocked).
pub const ICMPV6_FILTER: i32 = 1;
pub const ICMP6_FILTER_LEN: usize = 32;

// --- Packet sockets' sock_diag (include/uapi/linux/packet_diag.h) ----------

/// `pdiag_show` bits.
pub const PACKET_SHOW_MCLIST: u32 = 0x2;
pub const PACKET_SHOW_RING_CFG: u32 = 0x4;
/// Attribute types of a `packet_diag_msg`.
pub const PACKET_DIAG_MCLIST: u16 = 1;
pub const PACKET_DIAG_RX_RING: u16 = 2;
pub const PACKET_DIAG_TX_RING: u16 = 3;
/// `struct packet_diag_req`: family, protocol, pad, ino, show, cookie[2].
pub const PACKET_DIAG_REQ_LEN: usize = 20;
/// `struct packet_diag_msg`: family, type, num, ino, cookie[2].
pub const PACKET_DIAG_MSG_LEN: usize = 16;
/// `struct packet_diag_mclist`: index, count, type, alen, addr[32].
pub const PACKET_DIAG_MCLIST_LEN: usize = 44;
/// `struct packet_diag_ring`: seven u32 (block size and count, frame size
/// and count, retire timeout, private size, features).
pub const PACKET_DIAG_RING_LEN: usize = 28;
/// `struct packet_mreq`: ifindex (i32), type (u16), alen (u16), address[8].
pub const PACKET_MREQ_LEN: usize = 16;
const _: () = assert!(size_of::<libc::packet_mreq>() == PACKET_MREQ_LEN);

// --- TCP repair (include/uapi/linux/tcp.h) ---------------------------------

pub const TCP_REPAIR: i32 = 19;
pub const TCP_REPAIR_QUEUE: i32 = 20;
pub const TCP_QUEUE_SEQ: i32 = 21;
pub const TCP_REPAIR_OPTIONS: i32 = 22;
pub const TCP_TIMESTAMP: i32 = 24;
pub const TCP_REPAIR_WINDOW: i32 = 29;
/// `TCP_REPAIR_QUEUE` values.
pub const TCP_RECV_QUEUE: i32 = 1;
pub const TCP_SEND_QUEUE: i32 = 2;
/// `TCP_REPAIR` value that leaves repair mode without a window probe.
pub const TCP_REPAIR_OFF_NO_WP: i32 = -1;
/// `struct tcp_repair_opt` option codes (TCPOPT_* of include/net/tcp.h).
pub const TCPOPT_MAXSEG: u32 = 2;
pub const TCPOPT_WINDOW: u32 = 3;
pub const TCPOPT_SACK_PERM: u32 = 4;
pub const TCPOPT_TIMESTAMP: u32 = 8;
/// `tcpi_options` bits of `struct tcp_info`.
pub const TCPI_OPT_TIMESTAMPS: u8 = 1;
pub const TCPI_OPT_SACK: u8 = 2;
pub const TCPI_OPT_WSCALE: u8 = 4;
/// `tcpi_state` values (include/net/tcp_states.h).
pub const TCP_ESTABLISHED: u8 = 1;
pub const TCP_SYN_SENT: u8 = 2;
pub const TCP_FIN_WAIT1: u8 = 4;
pub const TCP_FIN_WAIT2: u8 = 5;
pub const TCP_CLOSE_WAIT: u8 = 8;
pub const TCP_LAST_ACK: u8 = 9;
pub const TCP_CLOSING: u8 = 11;
/// TCP header flags.
pub const TH_FIN: u8 = 0x01;
pub const TH_ACK: u8 = 0x10;
pub const TCP_CLOSE: u8 = 7;
pub const TCP_LISTEN: u8 = 10;
/// Option bytes a timestamp adds to each segment (`TCPOLEN_TSTAMP_ALIGNED`).
pub const TCPOLEN_TSTAMP_ALIGNED: u32 = 12;
/// Largest value `TCP_MAXSEG` accepts (`MAX_TCP_WINDOW`).
pub const MAX_TCP_WINDOW: u32 = 32_767;
/// `struct tcp_repair_window`: five u32.
pub const TCP_REPAIR_WINDOW_LEN: usize = 20;

const _: () = assert!(TCP_REPAIR == libc::TCP_REPAIR);
const _: () = assert!(TCP_REPAIR_QUEUE == libc::TCP_REPAIR_QUEUE);
const _: () = assert!(TCP_QUEUE_SEQ == libc::TCP_QUEUE_SEQ);
const _: () = assert!(TCP_REPAIR_OPTIONS == libc::TCP_REPAIR_OPTIONS);
const _: () = assert!(TCP_TIMESTAMP == libc::TCP_TIMESTAMP);
const _: () = assert!(TCP_REPAIR_WINDOW_LEN == 5 * size_of::<u32>());

// --- socket options and queue ioctls ---------------------------------------

pub const SO_PEEK_OFF: i32 = 42;
/// Bytes queued to read (`FIONREAD`).
pub const SIOCINQ: u64 = 0x541B;
/// Bytes in the send queue.
pub const SIOCOUTQ: u64 = 0x5411;
/// Bytes in the send queue not yet sent.
pub const SIOCOUTQNSD: u64 = 0x894B;

const _: () = assert!(SO_PEEK_OFF == libc::SO_PEEK_OFF);
const _: () = assert!(SIOCINQ == libc::FIONREAD);
const _: () = assert!(SIOCOUTQ == libc::TIOCOUTQ);

// --- sock_diag for unix sockets (linux/netlink.h, linux/unix_diag.h) ---------

pub const NETLINK_SOCK_DIAG: i32 = 4;
pub const SOCK_DIAG_BY_FAMILY: u16 = 20;
pub const NLM_F_REQUEST: u16 = 1;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLM_F_ACK: u16 = 4;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
/// `udiag_show` bits.
pub const UDIAG_SHOW_NAME: u32 = 1;
pub const UDIAG_SHOW_PEER: u32 = 4;
/// The peers of the connections waiting on a listener.
pub const UDIAG_SHOW_ICONS: u32 = 8;
pub const UDIAG_SHOW_RQLEN: u32 = 0x10;
/// Attribute types of a `unix_diag_msg`.
pub const UNIX_DIAG_NAME: u16 = 0;
pub const UNIX_DIAG_PEER: u16 = 2;
/// A listener's waiting connections: the inode of each one's client (`u32`s).
pub const UNIX_DIAG_ICONS: u16 = 3;
pub const UNIX_DIAG_RQLEN: u16 = 4;
/// `sk_shutdown` of the socket (a `u8`: `RCV_SHUTDOWN` 1, `SEND_SHUTDOWN` 2).
pub const UNIX_DIAG_SHUTDOWN: u16 = 6;
/// The `sk_shutdown` bits.
pub const RCV_SHUTDOWN: u8 = 1;
pub const SEND_SHUTDOWN: u8 = 2;

const _: () = assert!(NETLINK_SOCK_DIAG == libc::NETLINK_SOCK_DIAG);
const _: () = assert!(NLM_F_REQUEST as i32 == libc::NLM_F_REQUEST);
const _: () = assert!(NLM_F_DUMP as i32 == libc::NLM_F_DUMP);
const _: () = assert!(NLM_F_ACK as i32 == libc::NLM_F_ACK);
const _: () = assert!(NLMSG_ERROR as i32 == libc::NLMSG_ERROR);
const _: () = assert!(NLMSG_DONE as i32 == libc::NLMSG_DONE);

// --- kcmp (include/uapi/linux/kcmp.h) --------------------------------------

/// `enum kcmp_type`: same open file description.
pub const KCMP_FILE: i32 = 0;
/// `kcmp` type comparing two processes' file descriptor tables.
pub const KCMP_FILES: i32 = 2;
/// `kcmp` type comparing a file with an epoll instance's target.
pub const KCMP_EPOLL_TFD: i32 = 7;

// --- timerfd (include/uapi/linux/timerfd.h) --------------------------------

/// `_IOW('T', 0, __u64)`: sets the expiration count of a timerfd.
pub const TFD_IOC_SET_TICKS: u64 =
    (IOC_WRITE << 30) | ((size_of::<u64>() as u64) << 16) | ((b'T' as u64) << 8);
/// `_IOC_WRITE` direction bits (asm-generic/ioctl.h).
const IOC_WRITE: u64 = 1;
const _: () = assert!(TFD_IOC_SET_TICKS == 0x4008_5400);

// --- System V shared memory (include/uapi/linux/shm.h) ---------------------

/// `shm_perm.mode` bit of a segment removed while still attached.
pub const SHM_DEST: u32 = 0o1000;
/// Where the next System V segment's id is chosen (checkpoint/restore).
pub const SHM_NEXT_ID: &str = "/proc/sys/kernel/shm_next_id";

// --- System V message queues and semaphores (include/uapi/linux/msg.h) -----

/// `msgrcv` flag: copy the message at index `msgtyp` without taking it
/// off the queue (with `IPC_NOWAIT`; kernels with CHECKPOINT_RESTORE).
pub const MSG_COPY: i32 = 0o40000;
/// Where the next System V message queue's id is chosen.
pub const MSG_NEXT_ID: &str = "/proc/sys/kernel/msg_next_id";
/// Where the next System V semaphore set's id is chosen.
pub const SEM_NEXT_ID: &str = "/proc/sys/kernel/sem_next_id";

// --- POSIX message queues (include/uapi/linux/mqueue.h, magic.h) ------------

/// `f_type` of the mqueue file system (`statfs`): an fd on a POSIX
/// message queue.
pub const MQUEUE_MAGIC: i64 = 0x1980_0202;
/// `struct mq_attr` (flags, maxmsg, msgsize, curmsgs, 4 reserved longs).
pub const MQ_ATTR_LEN: usize = 64;
const _: () = assert!(size_of::<libc::mq_attr>() == MQ_ATTR_LEN);
/// `fsopen` flag: the context fd is close-on-exec.
pub const FSOPEN_CLOEXEC: u32 = 1;
/// `fsconfig` command: create the superblock.
pub const FSCONFIG_CMD_CREATE: u32 = 6;
/// `fsmount` flag: the mount fd is close-on-exec.
pub const FSMOUNT_CLOEXEC: u32 = 1;
/// Where an IPC namespace's POSIX message queue limits are (read and
/// written by a thread in it): `msg_max`, `msgsize_max`, `queues_max`,
/// `msg_default`, `msgsize_default`.
pub const MQUEUE_SYSCTL_DIR: &str = "/proc/sys/fs/mqueue";

// --- structures passed by bytes ---------------------------------------------

/// `struct flock` on x86-64.
pub const FLOCK_LEN: usize = 32;
const _: () = assert!(size_of::<libc::flock>() == FLOCK_LEN);
/// `struct epoll_event` (packed on x86-64: u32 events, u64 data).
pub const EPOLL_EVENT_LEN: usize = 12;
const _: () = assert!(size_of::<libc::epoll_event>() == EPOLL_EVENT_LEN);
/// `struct msghdr`.
pub const MSGHDR_LEN: usize = 56;
const _: () = assert!(size_of::<libc::msghdr>() == MSGHDR_LEN);
/// `CMSG_SPACE(sizeof(int))`: a control message carrying one fd.
pub const CMSG_SPACE_ONE_FD: u64 = 24;
/// `CMSG_LEN(sizeof(int))`.
pub const CMSG_LEN_ONE_FD: u64 = 20;

// --- Interface flags (include/uapi/linux/if.h) -------------------------------

/// `struct ifreq` as `SIOCGIFFLAGS`/`SIOCSIFFLAGS` use it: the interface
/// name, then the flags member of the union (`ifr_flags`, a short), the
/// rest of the union unused.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IfreqFlags {
    pub name: [u8; 16],
    pub flags: i16,
    pub _pad: [u8; 22],
}
const _: () = assert!(size_of::<IfreqFlags>() == 40);
const _: () = assert!(size_of::<IfreqFlags>() == size_of::<libc::ifreq>());
