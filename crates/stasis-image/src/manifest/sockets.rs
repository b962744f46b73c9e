//! The sockets of a manifest: unix, IPv4/IPv6, and what `TCP_REPAIR`
//! reads of an established connection.

use serde::{Deserialize, Serialize};

/// A unix domain socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnixSocket {
    /// Socket inode at dump (identifies it, and its peer, in the image).
    pub ino: u64,
    /// `SOCK_STREAM`, `SOCK_DGRAM` or `SOCK_SEQPACKET`.
    pub sock_type: i32,
    /// Bound address (`sun_path` bytes; a leading NUL means abstract).
    pub name: Option<Vec<u8>>,
    pub state: UnixState,
    /// Data waiting to be read: one entry per message (datagram and
    /// seqpacket sockets) or a single byte stream.
    pub queue: Vec<Vec<u8>>,
    /// Credentials (pid, uid, gid) each queued message carries, when the
    /// socket receives them (`SO_PASSCRED`); same order as `queue`.
    #[serde(default)]
    pub queue_creds: Vec<Option<(i32, u32, u32)>>,
    /// Socket options as (level, option, value).
    #[serde(default)]
    pub options: Vec<(i32, i32, i32)>,
    /// Owner, group and mode of the socket file of a path name at dump.
    #[serde(default)]
    pub file_owner: Option<(u32, u32, u32)>,
    /// The socket file of its path name was gone at dump (unlinked after
    /// the bind).
    #[serde(default)]
    pub file_deleted: bool,
    /// Files in flight (`SCM_RIGHTS`) with each queued message, same
    /// order as `queue` (shorter when the last messages carry none); each
    /// is an image of its own (`fd` -1).
    #[serde(default)]
    pub queue_fds: Vec<Vec<super::FdImage>>,
    /// `sk_shutdown` at dump: 1 receiving shut down, 2 sending, 3 both
    /// (by the socket's own `shutdown` or its peer's).
    #[serde(default)]
    pub shutdown: u8,
    /// A listener's connections waiting to be accepted: the inode of each
    /// one's client (a socket of the image), in accept order.
    #[serde(default)]
    pub pending: Vec<u64>,
}

/// State of a unix socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum UnixState {
    Unconnected,
    Listening {
        backlog: u32,
    },
    /// Connected to `peer` (a socket of the image), or, when the peer is
    /// outside the image, to the socket bound at `peer_name`.
    Connected {
        peer: u64,
        peer_name: Option<Vec<u8>>,
    },
}

/// A netlink socket (its receive queue was empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetlinkSocket {
    /// `SOCK_RAW` or `SOCK_DGRAM`.
    pub sock_type: i32,
    /// `NETLINK_ROUTE`, `NETLINK_KOBJECT_UEVENT`...
    pub protocol: i32,
    /// Its port id (`nl_pid` of its name; 0: never bound).
    pub portid: u32,
    /// The multicast groups it listens to, a bitmap in 32-bit words
    /// (`NETLINK_LIST_MEMBERSHIPS`).
    pub groups: Vec<u32>,
    /// The port id and group it is connected to (0, 0: not connected).
    pub dst_portid: u32,
    pub dst_group: u32,
    /// Socket options as (level, option, value).
    pub options: Vec<(i32, i32, i32)>,
}

/// An IPv4/IPv6 socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InetSocket {
    pub family: i32,
    pub sock_type: i32,
    pub protocol: i32,
    /// Raw `sockaddr_in`/`sockaddr_in6` of the local address (empty: unbound).
    pub local: Vec<u8>,
    /// Raw address of the peer (empty: not connected).
    pub peer: Vec<u8>,
    pub state: InetState,
    /// Socket options as (level, option, value).
    pub options: Vec<(i32, i32, i32)>,
    /// A UDP socket's unread datagrams: (sender's raw address, bytes).
    #[serde(default)]
    pub datagrams: Vec<(Vec<u8>, Vec<u8>)>,
    /// Its classic BPF filter (`SO_ATTACH_FILTER`), if it has one.
    #[serde(default)]
    pub filter: Option<SocketFilter>,
    /// A datagram socket's `shutdown` (`sk_shutdown`: 1 receive side,
    /// 2 send side, 3 both).
    #[serde(default)]
    pub shutdown: u8,
    /// Options whose value is not an int, as (level, option, bytes): a raw
    /// ICMPv6 socket's `ICMPV6_FILTER`.
    #[serde(default)]
    pub byte_options: Vec<(i32, i32, Vec<u8>)>,
}

/// A socket's classic BPF filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketFilter {
    /// `struct sock_filter` instructions as `SO_GET_FILTER` gives them (8
    /// bytes each, native byte order).
    #[serde(with = "serde_bytes")]
    pub insns: Vec<u8>,
    /// `SO_LOCK_FILTER`: the program can no longer change it.
    pub locked: bool,
}

/// State of an IPv4/IPv6 socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum InetState {
    /// Created, maybe bound, maybe connected (UDP), not listening.
    Plain,
    Listening {
        backlog: u32,
        /// Other listeners shared its address at dump (`SO_REUSEPORT`):
        /// it binds with `SO_REUSEPORT` set, whatever the program's value
        /// now (which comes back after), as it had when it was bound.
        #[serde(default)]
        shares_port: bool,
    },
    /// An established or half-closed TCP connection, saved with
    /// `TCP_REPAIR`.
    Established(TcpRepair),
    /// A TCP connection that ended, closed both ways (`TCP_CLOSE` with
    /// its receive side shut down): reads give end of file, writes
    /// `EPIPE`. Restored as a socket whose loopback connection ended so
    /// (its addresses are not the original's).
    Ended,
    /// A TCP connect in progress (`SYN_SENT`) to `peer`: no peer has
    /// answered it, so it is restored as a new non-blocking connect from
    /// the same address.
    Connecting,
    /// An established connection to `peer` whose server side still waits
    /// in its listener's accept queue, nothing of it acknowledged: made
    /// again by a real connect from the same address once the listener is
    /// restored, then `queued` (the bytes it had sent or queued, none of
    /// them acknowledged) sent again. Manifest version 4.
    Unaccepted {
        #[serde(with = "serde_bytes")]
        queued: Vec<u8>,
    },
}

/// What `TCP_REPAIR` needs to rebuild an established or half-closed
/// connection. The sequence numbers and queues are those of the data
/// alone: a FIN (which takes a sequence number) is in `state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpRepair {
    /// `TCP_QUEUE_SEQ` of the send queue (sequence of the next byte to
    /// queue), less the connection's own FIN if it sent one.
    pub snd_seq: u32,
    /// `TCP_QUEUE_SEQ` of the receive queue (next sequence expected), less
    /// the peer's FIN if it came.
    pub rcv_seq: u32,
    /// The TCP state at dump (`TCP_ESTABLISHED`, or one of the half-closed
    /// `TCP_FIN_WAIT1`, `TCP_FIN_WAIT2`, `TCP_CLOSE_WAIT`, `TCP_LAST_ACK`,
    /// `TCP_CLOSING`); images made before it was saved hold established
    /// connections only.
    #[serde(default = "tcp_established")]
    pub state: u8,
    /// Bytes sent but not acknowledged, then bytes not yet sent.
    #[serde(with = "serde_bytes")]
    pub send_queue: Vec<u8>,
    /// How many bytes at the end of `send_queue` were never sent.
    pub unsent: u32,
    /// Bytes received, not yet read by the process.
    #[serde(with = "serde_bytes")]
    pub recv_queue: Vec<u8>,
    /// The peer's MSS (`TCP_MAXSEG` in repair mode: `mss_clamp`).
    pub mss: u32,
    /// The segment size in use at the dump (`tcpi_snd_mss`); 0 in images
    /// made before it was saved.
    #[serde(default)]
    pub snd_mss: u32,
    pub snd_wscale: u8,
    pub rcv_wscale: u8,
    /// `tcpi_options` (SACK, timestamps, window scaling).
    pub tcpi_options: u8,
    /// `TCP_TIMESTAMP`.
    pub timestamp: u32,
    /// `struct tcp_repair_window`: snd_wl1, snd_wnd, max_window, rcv_wnd,
    /// rcv_wup (`rcv_wup` without the peer's FIN, as the rebuilt
    /// connection has it before the FIN is given to it again).
    pub window: [u32; 5],
}

fn tcp_established() -> u8 {
    1
}

/// A packet socket (`AF_PACKET`: `SOCK_RAW`, `SOCK_DGRAM`, or the old
/// `SOCK_PACKET`). Frames it had not read are not saved (lost, as on a
/// network).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PacketSocket {
    pub sock_type: i32,
    /// Its protocol (an ethertype in network byte order, as `socket(2)`
    /// was given it; from `sock_diag`).
    pub protocol: i32,
    /// The raw address it is bound to (`getsockname`: a `sockaddr_ll`, or a
    /// `SOCK_PACKET` socket's `sockaddr` with a device name); empty: not
    /// bound.
    pub bound: Vec<u8>,
    /// `SOL_PACKET` options as (option, value): version, reserve, aux
    /// data, original device, vnet header, loss, timestamps...
    pub packet_options: Vec<(i32, i32)>,
    /// Its fanout group (`PACKET_FANOUT`: id | type << 16), if it joined one.
    pub fanout: Option<u32>,
    /// Memberships (`PACKET_ADD_MEMBERSHIP`), each (ifindex, count, type,
    /// address): added `count` times.
    pub memberships: Vec<(i32, u32, u16, Vec<u8>)>,
    /// Receive and transmit rings (`struct packet_diag_ring`), if set up.
    pub rx_ring: Option<[u32; 7]>,
    pub tx_ring: Option<[u32; 7]>,
    /// `SOL_SOCKET` options as (level, option, value).
    pub options: Vec<(i32, i32, i32)>,
}
