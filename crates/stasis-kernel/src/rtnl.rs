//! Route netlink (rtnetlink) of the calling thread's network namespace:
//! its interfaces, addresses, routes, next-hop objects and policy routing
//! rules as plain values, and the few changes a restore makes (a veth
//! pair, an interface, an address, a next-hop object, a route, a rule, an
//! interface's master and up state). Messages are packed and parsed by
//! the `netlink-packet-route` crate; the socket is `netlink-sys`, used
//! synchronously (one request at a time, its answers read to the end).
//! Next-hop objects, which the crate does not know, and the attributes
//! of a route kept as the kernel gave them (an encapsulation) are read
//! and written as bytes ([`RawMessage`]).

use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd};

use netlink_packet_core::{
    DefaultNla, NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    NetlinkSerializable, Nla, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoTun, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::nsid::{NsidAttribute, NsidMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteNextHop,
    RouteNextHopFlags, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleFlags, RuleHeader, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::{KernelError, Result};

/// An interface, as `RTM_GETLINK` tells it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// Its kind (`veth`, `bridge`, ...; `None` for `lo` and physical
    /// devices).
    pub kind: Option<String>,
    /// Its hardware address.
    pub mac: Vec<u8>,
    pub mtu: u32,
    /// `IFF_UP`.
    pub up: bool,
    /// The index of the device it is linked to (a veth: its peer), in the
    /// namespace `link_netnsid` names, else in this one.
    pub link: Option<u32>,
    /// The id (in this namespace) of the namespace of its `link`.
    pub link_netnsid: Option<i32>,
    /// The index of its master (a bridge it is a port of).
    pub master: Option<u32>,
    /// A tun or tap device (kind `tun`): what its `IFLA_INFO_DATA` says.
    pub tun: Option<TunInfo>,
    /// `IFLA_TXQLEN`.
    pub txqlen: u32,
    /// Its number as a bridge's port (`IFLA_BRPORT_NO`).
    pub port_no: Option<u16>,
    /// Its `IFLA_INFO_DATA` attributes as the kernel gave them (kind
    /// specific: `IFLA_BR_*`, `IFLA_VXLAN_*`, `IFLA_MACVLAN_*`...).
    pub info_data: Vec<RawAttr>,
}

/// The attributes of a netlink attribute stream (`struct nlattr`s, each
/// padded to 4 bytes), their types without the flag bits.
pub fn split_attrs(mut b: &[u8]) -> Vec<RawAttr> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        let kind = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            break;
        }
        out.push(RawAttr {
            kind,
            value: b[4..len].to_vec(),
        });
        b = b.get(len.div_ceil(4) * 4..).unwrap_or(&[]);
    }
    out
}

/// Gives the attribute `kind` (without its flag bits) of the netlink
/// attribute stream `b`, a u32, the value `v`, in place (the other
/// attributes' bytes, flags included, left as they are); false if it has
/// none.
pub fn set_u32_attr(b: &mut [u8], kind: u16, v: u32) -> bool {
    let mut off = 0;
    while b.len() >= off + 4 {
        let len = usize::from(u16::from_ne_bytes([b[off], b[off + 1]]));
        let k = u16::from_ne_bytes([b[off + 2], b[off + 3]]) & 0x3fff;
        if len < 4 || off + len > b.len() {
            return false;
        }
        if k == kind && len == 8 {
            b[off + 4..off + 8].copy_from_slice(&v.to_ne_bytes());
            return true;
        }
        off += len.div_ceil(4) * 4;
    }
    false
}

/// `attrs` as a netlink attribute stream.
pub fn join_attrs(attrs: &[RawAttr]) -> Vec<u8> {
    let mut out = Vec::new();
    for a in attrs {
        let len = u16::try_from(4 + a.value.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&a.kind.to_ne_bytes());
        out.extend_from_slice(&a.value);
        out.resize(out.len().div_ceil(4) * 4, 0);
    }
    out
}

/// A new interface of a kind made by rtnetlink alone (a bridge, an ifb,
/// a macvlan, a vxlan).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewLink {
    pub spec: LinkSpec,
    pub kind: String,
    pub txqlen: u32,
    /// The index of its lower device (`IFLA_LINK`: a macvlan's).
    pub link: Option<u32>,
    /// Its `IFLA_INFO_DATA`.
    pub info_data: Vec<RawAttr>,
}

/// What rtnetlink says of a tun or tap device (`IFLA_TUN_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TunInfo {
    /// `IFF_TUN` or `IFF_TAP`, with `IFF_NO_PI`, `IFF_VNET_HDR` and
    /// `IFF_MULTI_QUEUE` as the device has them.
    pub flags: u16,
    pub persist: bool,
    /// The uid and gid allowed to attach (`None`: anyone).
    pub owner: Option<u32>,
    pub group: Option<u32>,
}

/// An address of an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addr {
    /// The interface's index.
    pub index: u32,
    pub addr: IpAddr,
    pub prefix: u8,
    /// The IPv4 broadcast address.
    pub broadcast: Option<IpAddr>,
    /// `IFA_F_*`.
    pub flags: u32,
    /// `RT_SCOPE_*`.
    pub scope: u8,
    /// The other end of a point-to-point link (`IFA_ADDRESS`, where
    /// `addr` is `IFA_LOCAL`).
    pub peer: Option<IpAddr>,
}

/// `IFA_F_PERMANENT`: an address set by hand, not by autoconfiguration.
pub const IFA_F_PERMANENT: u32 = 0x80;
/// `IFA_F_NODAD`: no duplicate address detection.
pub const IFA_F_NODAD: u32 = 0x02;
/// `IFA_F_NOPREFIXROUTE`: no prefix route made with it.
pub const IFA_F_NOPREFIXROUTE: u32 = 0x200;
/// `RT_TABLE_MAIN`.
pub const RT_TABLE_MAIN: u32 = 254;
/// `RT_TABLE_LOCAL`.
pub const RT_TABLE_LOCAL: u32 = 255;
/// `RTPROT_KERNEL`: a route the kernel made (from an address).
pub const RTPROT_KERNEL: u8 = 2;
/// `RTN_UNICAST`.
pub const RTN_UNICAST: u8 = 1;
/// `RTNH_F_ONLINK`: the gateway is on the link whatever its address.
pub const RTNH_F_ONLINK: u8 = 4;
/// `RTA_METRICS`, `RTA_FLOW`, `RTA_PREF`, `RTA_VIA`, `RTA_ENCAP_TYPE`
/// and `RTA_ENCAP`: the attributes of a route kept as the kernel gives
/// them ([`Route::attrs`]).
pub const RTA_METRICS: u16 = 8;
pub const RTA_FLOW: u16 = 11;
pub const RTA_PREF: u16 = 20;
pub const RTA_VIA: u16 = 18;
pub const RTA_ENCAP_TYPE: u16 = 21;
pub const RTA_ENCAP: u16 = 22;
/// The attributes of [`Route::attrs`].
pub const ROUTE_RAW_ATTRS: [u16; 6] = [
    RTA_METRICS,
    RTA_FLOW,
    RTA_PREF,
    RTA_VIA,
    RTA_ENCAP_TYPE,
    RTA_ENCAP,
];
/// `RTA_GATEWAY`, `RTA_MULTIPATH`.
const RTA_GATEWAY: u16 = 5;
const RTA_MULTIPATH: u16 = 9;
/// `LWTUNNEL_ENCAP_*`: the kinds of a route's encapsulation
/// (`RTA_ENCAP_TYPE`).
pub const LWTUNNEL_ENCAP_MPLS: u16 = 1;
pub const LWTUNNEL_ENCAP_IP: u16 = 2;
pub const LWTUNNEL_ENCAP_ILA: u16 = 3;
pub const LWTUNNEL_ENCAP_IP6: u16 = 4;
pub const LWTUNNEL_ENCAP_SEG6: u16 = 5;
pub const LWTUNNEL_ENCAP_BPF: u16 = 6;
pub const LWTUNNEL_ENCAP_SEG6_LOCAL: u16 = 7;
pub const LWTUNNEL_ENCAP_RPL: u16 = 8;
pub const LWTUNNEL_ENCAP_IOAM6: u16 = 9;
pub const LWTUNNEL_ENCAP_XFRM: u16 = 10;
/// `SEG6_LOCAL_IIF`, `SEG6_LOCAL_OIF`, `SEG6_LOCAL_BPF`: the attributes
/// of a seg6local encapsulation that name an interface or a program.
pub const SEG6_LOCAL_IIF: u16 = 6;
pub const SEG6_LOCAL_OIF: u16 = 7;
pub const SEG6_LOCAL_BPF: u16 = 8;

/// A netlink attribute as the kernel gave it: its type (without the
/// `NLA_F_NESTED` and `NLA_F_NET_BYTEORDER` bits) and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawAttr {
    pub kind: u16,
    pub value: Vec<u8>,
}

fn raw_of(nla: &impl Nla) -> RawAttr {
    let mut value = vec![0u8; nla.value_len()];
    nla.emit_value(&mut value);
    RawAttr {
        kind: nla.kind() & 0x3fff,
        value,
    }
}

/// One next hop of a route with several (`struct rtnexthop`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextHop {
    pub gateway: Option<IpAddr>,
    /// The output interface's index (0: none).
    pub oif: u32,
    /// The weight less one.
    pub hops: u8,
    /// `RTNH_F_*`.
    pub flags: u8,
    /// Its other attributes (`RTA_VIA`, `RTA_ENCAP_TYPE`, `RTA_ENCAP`,
    /// `RTA_FLOW`), as the kernel gave them.
    pub attrs: Vec<RawAttr>,
}

/// The next hops of an `RTA_MULTIPATH` (`struct rtnexthop`s, each with
/// its attributes), as the kernel gave them.
fn nexthops_of(mut b: &[u8]) -> Vec<NextHop> {
    let mut out = Vec::new();
    while b.len() >= 8 {
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        if len < 8 || len > b.len() {
            break;
        }
        let mut hop = NextHop {
            gateway: None,
            oif: u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
            hops: b[3],
            flags: b[2],
            attrs: Vec::new(),
        };
        for a in split_attrs(&b[8..len]) {
            if a.kind == RTA_GATEWAY {
                hop.gateway = match a.value.len() {
                    4 => <[u8; 4]>::try_from(&a.value[..]).ok().map(IpAddr::from),
                    16 => <[u8; 16]>::try_from(&a.value[..]).ok().map(IpAddr::from),
                    _ => None,
                };
            } else {
                hop.attrs.push(a);
            }
        }
        out.push(hop);
        b = b.get(len.div_ceil(4) * 4..).unwrap_or(&[]);
    }
    out
}

/// A policy routing rule (`struct fib_rule_hdr` and its `FRA_*`
/// attributes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub family: u8,
    pub dst_len: u8,
    pub src_len: u8,
    pub tos: u8,
    pub table: u8,
    /// `FR_ACT_*`.
    pub action: u8,
    /// `FIB_RULE_*`.
    pub flags: u32,
    pub attrs: Vec<RawAttr>,
}

/// `IFLA_MACVLAN_MACADDR_MODE` and its `MACVLAN_MACADDR_SET`: a
/// source-mode macvlan's list of source addresses
/// (`IFLA_MACVLAN_MACADDR_DATA`) replaced by the one given.
pub const IFLA_MACVLAN_MACADDR_MODE: u16 = 3;
pub const MACVLAN_MACADDR_SET: u32 = 3;

/// `IFLA_BRPORT_NO`: a bridge port's number.
pub const IFLA_BRPORT_NO: u16 = 18;

/// `FRA_PRIORITY`, `FRA_TABLE`, `FRA_PROTOCOL`.
pub const FRA_PRIORITY: u16 = 6;
pub const FRA_TABLE: u16 = 15;
pub const FRA_PROTOCOL: u16 = 21;

impl Rule {
    fn attr(&self, kind: u16) -> Option<&[u8]> {
        self.attrs
            .iter()
            .find(|a| a.kind == kind)
            .map(|a| &a.value[..])
    }

    fn u32_attr(&self, kind: u16) -> Option<u32> {
        self.attr(kind)
            .and_then(|v| <[u8; 4]>::try_from(v).ok())
            .map(u32::from_ne_bytes)
    }

    /// Its priority (`FRA_PRIORITY`; 0 when absent).
    pub fn priority(&self) -> u32 {
        self.u32_attr(FRA_PRIORITY).unwrap_or(0)
    }

    /// Its table (`FRA_TABLE`, else the header's).
    pub fn table_id(&self) -> u32 {
        self.u32_attr(FRA_TABLE).unwrap_or(u32::from(self.table))
    }

    /// `FRA_PROTOCOL` (`RTPROT_KERNEL` for the kernel's own rules).
    pub fn protocol(&self) -> u8 {
        self.attr(FRA_PROTOCOL)
            .and_then(|v| v.first().copied())
            .unwrap_or(0)
    }
}

/// A route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    pub table: u32,
    /// `None`: the default route.
    pub dst: Option<IpAddr>,
    pub dst_len: u8,
    pub gateway: Option<IpAddr>,
    /// The output interface's index.
    pub oif: Option<u32>,
    /// The metric.
    pub priority: Option<u32>,
    /// The preferred source address.
    pub prefsrc: Option<IpAddr>,
    /// `RTPROT_*`.
    pub protocol: u8,
    /// `RT_SCOPE_*`.
    pub scope: u8,
    /// `RTN_*`.
    pub kind: u8,
    /// Its next hops when it has several (`RTA_MULTIPATH`).
    pub nexthops: Vec<NextHop>,
    /// `rtm_flags` (`RTNH_F_ONLINK`, ...).
    pub flags: u32,
    /// Its [`ROUTE_RAW_ATTRS`] (metrics, realm, IPv6 preference, a
    /// gateway of another family, an encapsulation) as the kernel gave
    /// them.
    pub attrs: Vec<RawAttr>,
    /// Its source prefix (`from`: `RTA_SRC`, of IPv6 routes).
    pub src: Option<IpAddr>,
    pub src_len: u8,
    /// The next-hop object it goes through (`RTA_NH_ID`; the kernel
    /// lists that object's next hops with it too).
    pub nhid: Option<u32>,
}

/// A route netlink message as bytes: its type and what follows its
/// `struct nlmsghdr` (for the messages the crate does not know, and those
/// whose attributes are kept as the kernel sent them).
#[derive(Debug, Clone)]
pub struct RawMessage {
    pub kind: u16,
    pub payload: Vec<u8>,
}

impl NetlinkSerializable for RawMessage {
    fn message_type(&self) -> u16 {
        self.kind
    }

    fn buffer_len(&self) -> usize {
        self.payload.len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer.copy_from_slice(&self.payload);
    }
}

impl NetlinkDeserializable for RawMessage {
    type Error = std::convert::Infallible;

    fn deserialize(
        header: &NetlinkHeader,
        payload: &[u8],
    ) -> std::result::Result<Self, Self::Error> {
        Ok(RawMessage {
            kind: header.message_type,
            payload: payload.to_vec(),
        })
    }
}

/// `RTM_NEWROUTE`, `RTM_GETROUTE`; `RTM_NEWNEXTHOP`, `RTM_GETNEXTHOP`.
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEXTHOP: u16 = 104;
const RTM_GETNEXTHOP: u16 = 106;
/// `sizeof(struct rtmsg)`, `sizeof(struct nhmsg)`.
const RTMSG_LEN: usize = 12;
const NHMSG_LEN: usize = 8;
/// `NLA_F_NESTED`.
const NLA_F_NESTED: u16 = 0x8000;

/// `NHA_ID`, `NHA_GROUP`, `NHA_GROUP_TYPE`, `NHA_BLACKHOLE`, `NHA_OIF`,
/// `NHA_GATEWAY`, `NHA_ENCAP_TYPE`, `NHA_ENCAP`, `NHA_FDB`,
/// `NHA_RES_GROUP`: a next-hop object's attributes.
pub const NHA_ID: u16 = 1;
pub const NHA_GROUP: u16 = 2;
pub const NHA_GROUP_TYPE: u16 = 3;
pub const NHA_BLACKHOLE: u16 = 4;
pub const NHA_OIF: u16 = 5;
pub const NHA_GATEWAY: u16 = 6;
pub const NHA_ENCAP_TYPE: u16 = 7;
pub const NHA_ENCAP: u16 = 8;
pub const NHA_FDB: u16 = 11;
pub const NHA_RES_GROUP: u16 = 12;
/// `NHA_RES_GROUP_BUCKETS`, `NHA_RES_GROUP_IDLE_TIMER`,
/// `NHA_RES_GROUP_UNBALANCED_TIMER`: a resilient group's configuration
/// (the rest of `NHA_RES_GROUP` is its state).
pub const NHA_RES_GROUP_CONFIG: std::ops::RangeInclusive<u16> = 1..=3;

/// A next-hop object (`struct nhmsg` and its `NHA_*` attributes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NexthopObject {
    /// `AF_INET`, `AF_INET6`, or `AF_UNSPEC` (a group, a blackhole).
    pub family: u8,
    pub scope: u8,
    /// `RTPROT_*`.
    pub protocol: u8,
    /// `RTNH_F_*`.
    pub flags: u32,
    pub attrs: Vec<RawAttr>,
}

impl NexthopObject {
    /// Its attribute `kind`.
    pub fn attr(&self, kind: u16) -> Option<&[u8]> {
        self.attrs
            .iter()
            .find(|a| a.kind == kind)
            .map(|a| &a.value[..])
    }

    /// Its id (`NHA_ID`).
    pub fn id(&self) -> Option<u32> {
        self.attr(NHA_ID)
            .and_then(|v| <[u8; 4]>::try_from(v).ok())
            .map(u32::from_ne_bytes)
    }

    /// Its output interface (`NHA_OIF`).
    pub fn oif(&self) -> Option<u32> {
        self.attr(NHA_OIF)
            .and_then(|v| <[u8; 4]>::try_from(v).ok())
            .map(u32::from_ne_bytes)
    }
}

/// A route netlink socket of the calling thread's network namespace.
pub struct Rtnl {
    sock: Socket,
    seq: u32,
}

fn nl_err(what: impl Into<String>, e: std::io::Error) -> KernelError {
    KernelError::io(what, e)
}

impl Rtnl {
    /// Opens one (in the calling thread's network namespace).
    pub fn open() -> Result<Rtnl> {
        let mut sock =
            Socket::new(NETLINK_ROUTE).map_err(|e| nl_err("socket(NETLINK_ROUTE)", e))?;
        sock.bind_auto()
            .map_err(|e| nl_err("binding a route netlink socket", e))?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(|e| nl_err("connecting a route netlink socket", e))?;
        Ok(Rtnl { sock, seq: 0 })
    }

    /// Sends `msg` with `flags`, and reads every answer to it: the
    /// messages of a dump (until its end), or the acknowledgement.
    fn request(
        &mut self,
        what: &str,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        self.exchange(what, msg, flags)
    }

    /// [`Rtnl::request`] for messages of any type (`M`: the crate's, or
    /// [`RawMessage`] for those it does not know or where the bytes the
    /// kernel sent are wanted as they are).
    fn exchange<M>(&mut self, what: &str, msg: M, flags: u16) -> Result<Vec<M>>
    where
        M: NetlinkSerializable + NetlinkDeserializable + std::fmt::Debug,
    {
        self.seq = self.seq.wrapping_add(1);
        let mut packet =
            NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(msg));
        packet.header.flags = NLM_F_REQUEST | flags;
        packet.header.sequence_number = self.seq;
        packet.finalize();
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf[..]);
        self.sock
            .send(&buf, 0)
            .map_err(|e| nl_err(format!("sending {what}"), e))?;
        // (NLM_F_EXCL, of a new object, is one of NLM_F_DUMP's bits.)
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut out = Vec::new();
        let mut rx = vec![0u8; 1 << 16];
        loop {
            let n = self
                .sock
                .recv(&mut &mut rx[..], 0)
                .map_err(|e| nl_err(format!("reading the answer to {what}"), e))?;
            let mut off = 0;
            while off < n {
                let m: NetlinkMessage<M> =
                    NetlinkMessage::deserialize(&rx[off..n]).map_err(|e| {
                        nl_err(
                            format!("parsing the answer to {what}"),
                            std::io::Error::other(e.to_string()),
                        )
                    })?;
                let len = usize::try_from(m.header.length).unwrap_or(0);
                if m.header.sequence_number == self.seq {
                    match m.payload {
                        NetlinkPayload::Done(_) => return Ok(out),
                        NetlinkPayload::Error(e) => match e.code {
                            None => {
                                if !dump {
                                    return Ok(out);
                                }
                            }
                            Some(c) => {
                                return Err(nl_err(
                                    what.to_string(),
                                    std::io::Error::from_raw_os_error(-c.get()),
                                ))
                            }
                        },
                        NetlinkPayload::InnerMessage(i) => {
                            out.push(i);
                            if !dump && flags & NLM_F_ACK == 0 {
                                return Ok(out);
                            }
                        }
                        _ => {}
                    }
                }
                if len == 0 {
                    break;
                }
                off += len.div_ceil(4) * 4;
            }
        }
    }

    /// Every interface.
    pub fn links(&mut self) -> Result<Vec<Link>> {
        let answers = self.request(
            "RTM_GETLINK",
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            NLM_F_DUMP,
        )?;
        Ok(answers
            .into_iter()
            .filter_map(|a| match a {
                RouteNetlinkMessage::NewLink(l) => Some(link_of(&l)),
                _ => None,
            })
            .collect())
    }

    /// Every address (IPv4 and IPv6).
    pub fn addrs(&mut self) -> Result<Vec<Addr>> {
        let answers = self.request(
            "RTM_GETADDR",
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_DUMP,
        )?;
        let mut out = Vec::new();
        for a in answers {
            let RouteNetlinkMessage::NewAddress(m) = a else {
                continue;
            };
            let (mut addr, mut local, mut broadcast) = (None, None, None);
            let mut flags = u32::from(m.header.flags.bits());
            for at in &m.attributes {
                match at {
                    AddressAttribute::Address(a) => addr = Some(*a),
                    AddressAttribute::Local(a) => local = Some(*a),
                    AddressAttribute::Broadcast(b) => broadcast = Some(IpAddr::V4(*b)),
                    AddressAttribute::Flags(f) => flags = f.bits(),
                    _ => {}
                }
            }
            // IFA_LOCAL is the interface's own address where both are
            // given (the other is then a point-to-point peer's).
            if let Some(a) = local.or(addr) {
                out.push(Addr {
                    index: m.header.index,
                    addr: a,
                    prefix: m.header.prefix_len,
                    broadcast,
                    flags,
                    scope: u8::from(m.header.scope),
                    peer: addr.filter(|p| local.is_some_and(|l| l != *p)),
                });
            }
        }
        Ok(out)
    }

    /// Every route (IPv4 and IPv6) of every table.
    pub fn routes(&mut self) -> Result<Vec<Route>> {
        let mut out = Vec::new();
        for family in [AF_INET, AF_INET6] {
            // Read as the kernel sent them, so that the attributes kept
            // as they are (an encapsulation...) are its bytes.
            let mut req = vec![0u8; RTMSG_LEN];
            req[0] = family;
            let answers = self.exchange(
                "RTM_GETROUTE",
                RawMessage {
                    kind: RTM_GETROUTE,
                    payload: req,
                },
                NLM_F_DUMP,
            )?;
            for a in answers.iter().filter(|a| a.kind == RTM_NEWROUTE) {
                let mut header = NetlinkHeader::default();
                header.message_type = RTM_NEWROUTE;
                let m = RouteNetlinkMessage::deserialize(&header, &a.payload).map_err(|e| {
                    nl_err(
                        "parsing a route (RTM_NEWROUTE)",
                        std::io::Error::other(e.to_string()),
                    )
                })?;
                if let RouteNetlinkMessage::NewRoute(m) = m {
                    let raw = split_attrs(a.payload.get(RTMSG_LEN..).unwrap_or(&[]));
                    out.push(route_of(&m, &raw));
                }
            }
        }
        Ok(out)
    }

    /// Every next-hop object (`ip nexthop`, `RTM_GETNEXTHOP`), in the
    /// kernel's order (by id).
    pub fn nexthops(&mut self) -> Result<Vec<NexthopObject>> {
        let answers = self.exchange(
            "RTM_GETNEXTHOP",
            RawMessage {
                kind: RTM_GETNEXTHOP,
                payload: vec![0u8; NHMSG_LEN],
            },
            NLM_F_DUMP,
        )?;
        Ok(answers
            .iter()
            .filter(|a| a.kind == RTM_NEWNEXTHOP && a.payload.len() >= NHMSG_LEN)
            .map(|a| {
                let p = &a.payload;
                NexthopObject {
                    family: p[0],
                    scope: p[1],
                    protocol: p[2],
                    flags: u32::from_ne_bytes([p[4], p[5], p[6], p[7]]),
                    attrs: split_attrs(&p[NHMSG_LEN..]),
                }
            })
            .collect())
    }

    /// Makes next-hop object `n` (its attributes as [`Rtnl::nexthops`]
    /// gave them, with its id).
    pub fn add_nexthop(&mut self, n: &NexthopObject) -> Result<()> {
        let mut payload = vec![n.family, n.scope, n.protocol, 0];
        payload.extend_from_slice(&n.flags.to_ne_bytes());
        // Strictly parsed: nested attributes must say so.
        let attrs: Vec<RawAttr> = n
            .attrs
            .iter()
            .map(|a| RawAttr {
                kind: if [NHA_ENCAP, NHA_RES_GROUP].contains(&a.kind) {
                    a.kind | NLA_F_NESTED
                } else {
                    a.kind
                },
                value: a.value.clone(),
            })
            .collect();
        payload.extend_from_slice(&join_attrs(&attrs));
        self.exchange(
            &format!("making the next-hop object {}", n.id().unwrap_or(0)),
            RawMessage {
                kind: RTM_NEWNEXTHOP,
                payload,
            },
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }

    /// The id this namespace gives the network namespace of process `pid`
    /// (`None`: none assigned).
    pub fn nsid_of_pid(&mut self, pid: i32) -> Result<Option<i32>> {
        let mut req = NsidMessage::default();
        req.attributes.push(NsidAttribute::Pid(pid.unsigned_abs()));
        let answers = self.request("RTM_GETNSID", RouteNetlinkMessage::GetNsId(req), 0)?;
        Ok(answers.into_iter().find_map(|a| match a {
            RouteNetlinkMessage::NewNsId(m) => m.attributes.iter().find_map(|at| match at {
                NsidAttribute::Id(id) if *id >= 0 => Some(*id),
                _ => None,
            }),
            _ => None,
        }))
    }

    /// Makes the veth pair `here` (in this namespace) and `peer` (in the
    /// network namespace `peer_ns`), each with its name, hardware address
    /// and MTU, both down.
    pub fn add_veth(
        &mut self,
        here: &LinkSpec,
        peer: &LinkSpec,
        peer_ns: BorrowedFd<'_>,
    ) -> Result<()> {
        let mut p = LinkMessage::default();
        p.attributes = spec_attrs(peer);
        p.attributes
            .push(LinkAttribute::NetNsFd(peer_ns.as_raw_fd()));
        let mut m = LinkMessage::default();
        m.attributes = spec_attrs(here);
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(p))),
        ]));
        self.request(
            &format!("making the veth pair {} / {}", here.name, peer.name),
            RouteNetlinkMessage::NewLink(m),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }

    /// Makes interface `l`, down.
    pub fn add_link(&mut self, l: &NewLink) -> Result<()> {
        let mut m = LinkMessage::default();
        m.attributes = spec_attrs(&l.spec);
        if l.txqlen != 0 {
            m.attributes.push(LinkAttribute::TxQueueLen(l.txqlen));
        }
        if let Some(i) = l.link {
            m.attributes.push(LinkAttribute::Link(i));
        }
        let mut info = vec![LinkInfo::Kind(InfoKind::from(l.kind.as_str()))];
        if !l.info_data.is_empty() {
            info.push(LinkInfo::Data(InfoData::Other(join_attrs(&l.info_data))));
        }
        m.attributes.push(LinkAttribute::LinkInfo(info));
        self.request(
            &format!("making the {} interface {}", l.kind, l.spec.name),
            RouteNetlinkMessage::NewLink(m),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }

    /// Sets the master of interface `index` (`Some`: a bridge's index)
    /// and brings it up or down.
    pub fn set_link(&mut self, index: u32, master: Option<u32>, up: bool) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.header.change_mask = LinkFlags::Up;
        if up {
            m.header.flags = LinkFlags::Up;
        }
        if let Some(b) = master {
            m.attributes.push(LinkAttribute::Controller(b));
        }
        self.request(
            &format!("setting interface {index} up ({up}) with master {master:?}"),
            RouteNetlinkMessage::SetLink(m),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    /// Gives interface `index` its MTU and (if not empty) hardware address.
    pub fn set_mtu_mac(&mut self, index: u32, mtu: u32, mac: &[u8]) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        if mtu != 0 {
            m.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if !mac.is_empty() {
            m.attributes.push(LinkAttribute::Address(mac.to_vec()));
        }
        self.request(
            &format!("setting the MTU ({mtu}) and hardware address of interface {index}"),
            RouteNetlinkMessage::SetLink(m),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    /// Gives interface `index` its transmit queue length.
    pub fn set_txqlen(&mut self, index: u32, txqlen: u32) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(LinkAttribute::TxQueueLen(txqlen));
        self.request(
            &format!("setting the queue length ({txqlen}) of interface {index}"),
            RouteNetlinkMessage::SetLink(m),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    /// Deletes interface `index` (a veth: both ends).
    pub fn del_link(&mut self, index: u32) -> Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        self.request(
            &format!("deleting interface {index}"),
            RouteNetlinkMessage::DelLink(m),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    /// Adds address `a` (its `index`, prefix, broadcast and `flags`).
    pub fn add_addr(&mut self, a: &Addr) -> Result<()> {
        let mut m = AddressMessage::default();
        m.header.family = family_of(&a.addr);
        m.header.prefix_len = a.prefix;
        m.header.index = a.index;
        m.header.scope = a.scope.into();
        m.attributes.push(AddressAttribute::Local(a.addr));
        if let Some(p) = a.peer {
            m.attributes.push(AddressAttribute::Address(p));
        } else if a.addr.is_ipv4() {
            m.attributes.push(AddressAttribute::Address(a.addr));
        }
        if let Some(IpAddr::V4(b)) = a.broadcast {
            m.attributes.push(AddressAttribute::Broadcast(b));
        }
        m.attributes
            .push(AddressAttribute::Flags(AddressFlags::from_bits_retain(
                a.flags,
            )));
        self.request(
            &format!(
                "adding address {}/{} to interface {}",
                a.addr, a.prefix, a.index
            ),
            RouteNetlinkMessage::NewAddress(m),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }

    /// Every policy routing rule (IPv4 and IPv6), in the kernel's order.
    pub fn rules(&mut self) -> Result<Vec<Rule>> {
        let answers = self.request(
            "RTM_GETRULE",
            RouteNetlinkMessage::GetRule(RuleMessage::default()),
            NLM_F_DUMP,
        )?;
        Ok(answers
            .into_iter()
            .filter_map(|a| match a {
                RouteNetlinkMessage::NewRule(m) => Some(Rule {
                    family: u8::from(m.header.family),
                    dst_len: m.header.dst_len,
                    src_len: m.header.src_len,
                    tos: m.header.tos,
                    table: m.header.table,
                    action: u8::from(m.header.action),
                    flags: m.header.flags.bits(),
                    attrs: m.attributes.iter().map(raw_of).collect(),
                }),
                _ => None,
            })
            .collect())
    }

    fn rule_message(r: &Rule) -> RuleMessage {
        let mut m = RuleMessage::default();
        m.header = RuleHeader {
            family: AddressFamily::from(r.family),
            dst_len: r.dst_len,
            src_len: r.src_len,
            tos: r.tos,
            table: r.table,
            action: RuleAction::from(r.action),
            flags: RuleFlags::from_bits_retain(r.flags),
        };
        m.attributes = r
            .attrs
            .iter()
            .map(|a| RuleAttribute::Other(DefaultNla::new(a.kind, a.value.clone())))
            .collect();
        m
    }

    /// Adds rule `r`.
    pub fn add_rule(&mut self, r: &Rule) -> Result<()> {
        self.request(
            &format!(
                "adding the routing rule of priority {} to table {}",
                r.priority(),
                r.table_id()
            ),
            RouteNetlinkMessage::NewRule(Self::rule_message(r)),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }

    /// Deletes rule `r` (as [`Rtnl::rules`] gave it).
    pub fn del_rule(&mut self, r: &Rule) -> Result<()> {
        self.request(
            &format!(
                "deleting the routing rule of priority {} to table {}",
                r.priority(),
                r.table_id()
            ),
            RouteNetlinkMessage::DelRule(Self::rule_message(r)),
            NLM_F_ACK,
        )?;
        Ok(())
    }

    /// Adds route `r`.
    pub fn add_route(&mut self, r: &Route) -> Result<()> {
        let mut m = RouteMessage::default();
        let family = if r.family == AF_INET6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        m.header = RouteHeader {
            address_family: family,
            destination_prefix_length: r.dst_len,
            source_prefix_length: r.src_len,
            table: u8::try_from(r.table).unwrap_or(0),
            protocol: RouteProtocol::from(r.protocol),
            scope: RouteScope::from(r.scope),
            kind: RouteType::from(r.kind),
            flags: RouteFlags::from_bits_retain(r.flags),
            ..Default::default()
        };
        m.attributes.push(RouteAttribute::Table(r.table));
        if let Some(d) = r.dst {
            m.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(d)));
        }
        if let Some(s) = r.src {
            m.attributes
                .push(RouteAttribute::Source(RouteAddress::from(s)));
        }
        if let Some(i) = r.nhid {
            m.attributes.push(RouteAttribute::NhId(i));
        }
        if let Some(g) = r.gateway {
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(g)));
        }
        if let Some(o) = r.oif {
            m.attributes.push(RouteAttribute::Oif(o));
        }
        if let Some(p) = r.priority {
            m.attributes.push(RouteAttribute::Priority(p));
        }
        if let Some(s) = r.prefsrc {
            m.attributes
                .push(RouteAttribute::PrefSource(RouteAddress::from(s)));
        }
        if !r.nexthops.is_empty() {
            let hops = r
                .nexthops
                .iter()
                .map(|h| {
                    let mut n = RouteNextHop::default();
                    n.flags = RouteNextHopFlags::from_bits_retain(h.flags);
                    n.hops = h.hops;
                    n.interface_index = h.oif;
                    if let Some(g) = h.gateway {
                        n.attributes
                            .push(RouteAttribute::Gateway(RouteAddress::from(g)));
                    }
                    for a in &h.attrs {
                        n.attributes.push(RouteAttribute::Other(DefaultNla::new(
                            a.kind,
                            a.value.clone(),
                        )));
                    }
                    n
                })
                .collect();
            m.attributes.push(RouteAttribute::MultiPath(hops));
        }
        for a in &r.attrs {
            m.attributes.push(RouteAttribute::Other(DefaultNla::new(
                a.kind,
                a.value.clone(),
            )));
        }
        let dst = r
            .dst
            .map_or("default".to_string(), |d| format!("{d}/{}", r.dst_len));
        self.request(
            &format!("adding the route to {dst}"),
            RouteNetlinkMessage::NewRoute(m),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }
}

/// What a new interface is given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkSpec {
    pub name: String,
    pub mac: Vec<u8>,
    pub mtu: u32,
}

fn spec_attrs(s: &LinkSpec) -> Vec<LinkAttribute> {
    let mut v = vec![LinkAttribute::IfName(s.name.clone())];
    if !s.mac.is_empty() {
        v.push(LinkAttribute::Address(s.mac.clone()));
    }
    if s.mtu != 0 {
        v.push(LinkAttribute::Mtu(s.mtu));
    }
    v
}

/// `AF_INET`.
pub const AF_INET: u8 = 2;
/// `AF_INET6`.
pub const AF_INET6: u8 = 10;

fn family_of(a: &IpAddr) -> AddressFamily {
    if a.is_ipv6() {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    }
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

fn link_of(l: &LinkMessage) -> Link {
    let mut out = Link {
        index: l.header.index,
        up: l.header.flags.contains(LinkFlags::Up),
        ..Default::default()
    };
    for a in &l.attributes {
        match a {
            LinkAttribute::IfName(n) => out.name = n.clone(),
            LinkAttribute::Address(m) => out.mac = m.clone(),
            LinkAttribute::Mtu(m) => out.mtu = *m,
            LinkAttribute::Link(i) => out.link = Some(*i),
            LinkAttribute::LinkNetNsId(i) => out.link_netnsid = Some(*i),
            LinkAttribute::Controller(i) => out.master = Some(*i),
            LinkAttribute::TxQueueLen(q) => out.txqlen = *q,
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(k) => out.kind = Some(k.to_string()),
                        LinkInfo::Data(InfoData::Tun(nlas)) => out.tun = Some(tun_info_of(nlas)),
                        LinkInfo::PortData(d) => {
                            let mut v = vec![0u8; d.value_len()];
                            d.emit_value(&mut v);
                            out.port_no = split_attrs(&v)
                                .into_iter()
                                .find(|a| a.kind == IFLA_BRPORT_NO)
                                .and_then(|a| <[u8; 2]>::try_from(&a.value[..]).ok())
                                .map(u16::from_ne_bytes);
                        }
                        LinkInfo::Data(d) => {
                            let mut v = vec![0u8; d.value_len()];
                            d.emit_value(&mut v);
                            out.info_data = split_attrs(&v);
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// The `IFLA_TUN_*` attributes of a tun link (the crate keeps them raw).
fn tun_info_of(nlas: &[InfoTun]) -> TunInfo {
    use netlink_packet_core::Nla;
    use stasis_sys::tun as t;
    let mut info = TunInfo::default();
    // Packets carry the information header unless told otherwise.
    let mut pi = true;
    for nla in nlas {
        let mut v = vec![0u8; nla.value_len()];
        nla.emit_value(&mut v);
        let byte = v.first().copied().unwrap_or(0);
        let word = v
            .get(..4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_ne_bytes);
        match nla.kind() & 0x3fff {
            t::IFLA_TUN_OWNER => info.owner = word,
            t::IFLA_TUN_GROUP => info.group = word,
            t::IFLA_TUN_TYPE => info.flags |= u16::from(byte) & t::TUN_TYPE_MASK,
            t::IFLA_TUN_PI => pi = byte != 0,
            t::IFLA_TUN_VNET_HDR if byte != 0 => info.flags |= t::IFF_VNET_HDR,
            t::IFLA_TUN_PERSIST => info.persist = byte != 0,
            t::IFLA_TUN_MULTI_QUEUE if byte != 0 => info.flags |= t::IFF_MULTI_QUEUE,
            _ => {}
        }
    }
    if !pi {
        info.flags |= t::IFF_NO_PI;
    }
    info
}

/// Route `m`, whose attributes as the kernel sent them are `raw`.
fn route_of(m: &RouteMessage, raw: &[RawAttr]) -> Route {
    let h = &m.header;
    let mut r = Route {
        family: if h.address_family == AddressFamily::Inet6 {
            AF_INET6
        } else {
            AF_INET
        },
        table: u32::from(h.table),
        dst: None,
        dst_len: h.destination_prefix_length,
        gateway: None,
        oif: None,
        priority: None,
        prefsrc: None,
        protocol: u8::from(h.protocol),
        scope: u8::from(h.scope),
        kind: u8::from(h.kind),
        nexthops: Vec::new(),
        flags: h.flags.bits(),
        attrs: raw
            .iter()
            .filter(|a| ROUTE_RAW_ATTRS.contains(&a.kind))
            .cloned()
            .collect(),
        src: None,
        src_len: h.source_prefix_length,
        nhid: None,
    };
    for a in &m.attributes {
        match a {
            RouteAttribute::Table(t) => r.table = *t,
            RouteAttribute::Destination(d) => r.dst = ip_of(d),
            RouteAttribute::Source(s) => r.src = ip_of(s),
            RouteAttribute::Gateway(g) => r.gateway = ip_of(g),
            RouteAttribute::Oif(o) => r.oif = Some(*o),
            RouteAttribute::Priority(p) => r.priority = Some(*p),
            RouteAttribute::PrefSource(s) => r.prefsrc = ip_of(s),
            RouteAttribute::NhId(i) => r.nhid = Some(*i),
            _ => {}
        }
    }
    if let Some(mp) = raw.iter().find(|a| a.kind == RTA_MULTIPATH) {
        r.nexthops = nexthops_of(&mp.value);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_veth_pair_is_made_addressed_routed_and_removed() {
        // On a thread of its own in a new network namespace.
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let me = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
            let mut nl = Rtnl::open().unwrap();
            let spec = |n: &str, last| LinkSpec {
                name: n.into(),
                mac: vec![2, 0, 0, 0, 0, last],
                mtu: 1400,
            };
            nl.add_veth(
                &spec("stasis-a", 1),
                &spec("stasis-b", 2),
                std::os::fd::AsFd::as_fd(&me),
            )
            .unwrap();
            let links = nl.links().unwrap();
            let a = links.iter().find(|l| l.name == "stasis-a").unwrap().clone();
            let b = links.iter().find(|l| l.name == "stasis-b").unwrap().clone();
            assert_eq!(
                (a.kind.as_deref(), a.mtu, &a.mac[..]),
                (Some("veth"), 1400, &[2, 0, 0, 0, 0, 1][..])
            );
            assert_eq!((a.link, b.link), (Some(b.index), Some(a.index)));
            nl.set_link(b.index, None, true).unwrap();
            nl.set_link(a.index, None, true).unwrap();
            nl.add_addr(&Addr {
                index: a.index,
                addr: IpAddr::from([10, 79, 0, 2]),
                prefix: 24,
                broadcast: None,
                flags: 0,
                scope: 0,
                peer: None,
            })
            .unwrap();
            nl.add_route(&Route {
                family: AF_INET,
                table: RT_TABLE_MAIN,
                dst: None,
                dst_len: 0,
                gateway: Some(IpAddr::from([10, 79, 0, 1])),
                oif: Some(a.index),
                priority: Some(7),
                prefsrc: None,
                protocol: 4,
                scope: 0,
                kind: RTN_UNICAST,
                nexthops: Vec::new(),
                flags: 0,
                attrs: Vec::new(),
                src: None,
                src_len: 0,
                nhid: None,
            })
            .unwrap();
            let routes = nl.routes().unwrap();
            assert!(routes.iter().any(|r| r.dst.is_none()
                && r.gateway == Some(IpAddr::from([10, 79, 0, 1]))
                && r.priority == Some(7)));
            assert!(nl
                .addrs()
                .unwrap()
                .iter()
                .any(|x| x.index == a.index && x.prefix == 24));
            nl.del_link(a.index).unwrap();
            assert!(!nl
                .links()
                .unwrap()
                .iter()
                .any(|l| l.name.starts_with("stasis-")));
        })
        .join()
        .unwrap();
    }

    /// In this thread's new network namespace: a veth pair stasis-a and
    /// stasis-b, both up; (the netlink socket, a's index).
    fn veth_pair_up() -> (Rtnl, u32) {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let me = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
        let mut nl = Rtnl::open().unwrap();
        let spec = |n: &str| LinkSpec {
            name: n.into(),
            ..Default::default()
        };
        nl.add_veth(
            &spec("stasis-a"),
            &spec("stasis-b"),
            std::os::fd::AsFd::as_fd(&me),
        )
        .unwrap();
        let links = nl.links().unwrap();
        let a = links.iter().find(|l| l.name == "stasis-a").unwrap().index;
        let b = links.iter().find(|l| l.name == "stasis-b").unwrap().index;
        nl.set_link(a, None, true).unwrap();
        nl.set_link(b, None, true).unwrap();
        (nl, a)
    }

    #[test]
    fn a_peer_a_multipath_route_of_another_table_and_a_rule_read_back_as_made() {
        std::thread::spawn(|| {
            let (mut nl, a) = veth_pair_up();
            let addr = Addr {
                index: a,
                addr: IpAddr::from([10, 80, 0, 1]),
                prefix: 32,
                broadcast: None,
                flags: 0,
                scope: 0,
                peer: Some(IpAddr::from([10, 80, 0, 2])),
            };
            nl.add_addr(&addr).unwrap();
            let got = nl.addrs().unwrap();
            let got = got.iter().find(|x| x.index == a).expect("the address");
            assert_eq!((got.addr, got.prefix, got.peer), (addr.addr, 32, addr.peer));
            let hop = |last, hops| NextHop {
                gateway: Some(IpAddr::from([10, 80, 0, last])),
                oif: a,
                hops,
                flags: if last == 9 { RTNH_F_ONLINK } else { 0 },
                attrs: Vec::new(),
            };
            let route = Route {
                family: AF_INET,
                table: 300,
                dst: Some(IpAddr::from([10, 81, 0, 0])),
                dst_len: 16,
                gateway: None,
                oif: None,
                priority: Some(9),
                prefsrc: None,
                protocol: 4,
                scope: 0,
                kind: RTN_UNICAST,
                nexthops: vec![hop(2, 2), hop(9, 0)],
                flags: 0,
                attrs: Vec::new(),
                src: None,
                src_len: 0,
                nhid: None,
            };
            nl.add_route(&route).unwrap();
            let got: Vec<Route> = nl
                .routes()
                .unwrap()
                .into_iter()
                .filter(|r| r.table == 300)
                .collect();
            assert_eq!(got, vec![route]);
            let before = nl.rules().unwrap();
            let mut rule = before[0].clone();
            rule.attrs.retain(|x| x.kind == FRA_PROTOCOL);
            rule.table = 0;
            rule.src_len = 16;
            rule.attrs.push(RawAttr {
                kind: 2, // FRA_SRC
                value: vec![10, 81, 0, 0],
            });
            rule.attrs.push(RawAttr {
                kind: FRA_TABLE,
                value: 300u32.to_ne_bytes().to_vec(),
            });
            rule.attrs.push(RawAttr {
                kind: FRA_PRIORITY,
                value: 500u32.to_ne_bytes().to_vec(),
            });
            nl.add_rule(&rule).unwrap();
            let after = nl.rules().unwrap();
            let made = after
                .iter()
                .find(|r| r.priority() == 500)
                .expect("the new rule")
                .clone();
            assert_eq!((made.table_id(), made.src_len), (300, 16));
            nl.del_rule(&made).unwrap();
            assert_eq!(nl.rules().unwrap(), before);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn next_hop_objects_and_a_route_through_a_group_read_back_as_made() {
        std::thread::spawn(|| {
            let (mut nl, a) = veth_pair_up();
            nl.add_addr(&Addr {
                index: a,
                addr: IpAddr::from([10, 82, 0, 1]),
                prefix: 24,
                broadcast: None,
                flags: 0,
                scope: 0,
                peer: None,
            })
            .unwrap();
            let attr = |kind, value: Vec<u8>| RawAttr { kind, value };
            let single = |id: u32, last: u8| NexthopObject {
                family: AF_INET,
                scope: 0,
                protocol: 4,
                flags: 0,
                attrs: vec![
                    attr(NHA_ID, id.to_ne_bytes().to_vec()),
                    attr(NHA_GATEWAY, vec![10, 82, 0, last]),
                    attr(NHA_OIF, a.to_ne_bytes().to_vec()),
                ],
            };
            nl.add_nexthop(&single(1, 2)).unwrap();
            nl.add_nexthop(&single(2, 3)).unwrap();
            // Members 1 (weight 1) and 2 (weight 3): struct nexthop_grp.
            let group = NexthopObject {
                family: 0,
                scope: 0,
                protocol: 4,
                flags: 0,
                attrs: vec![
                    attr(NHA_ID, 3u32.to_ne_bytes().to_vec()),
                    attr(
                        NHA_GROUP,
                        vec![1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0],
                    ),
                ],
            };
            nl.add_nexthop(&group).unwrap();
            let got = nl.nexthops().unwrap();
            assert_eq!(
                got.iter().map(|n| n.id()).collect::<Vec<_>>(),
                [Some(1), Some(2), Some(3)]
            );
            assert_eq!((got[0].oif(), got[0].protocol), (Some(a), 4));
            assert_eq!(got[1].attr(NHA_GATEWAY), Some(&[10, 82, 0, 3][..]));
            assert_eq!(got[2].attr(NHA_GROUP), group.attr(NHA_GROUP));
            nl.add_route(&Route {
                family: AF_INET,
                table: RT_TABLE_MAIN,
                dst: Some(IpAddr::from([10, 83, 0, 0])),
                dst_len: 16,
                gateway: None,
                oif: None,
                priority: None,
                prefsrc: None,
                protocol: 4,
                scope: 0,
                kind: RTN_UNICAST,
                nexthops: Vec::new(),
                flags: 0,
                attrs: Vec::new(),
                src: None,
                src_len: 0,
                nhid: Some(3),
            })
            .unwrap();
            let routes = nl.routes().unwrap();
            let r = routes
                .iter()
                .find(|r| r.dst == Some(IpAddr::from([10, 83, 0, 0])))
                .expect("the route through the group");
            // The group's members are listed with it.
            assert_eq!(r.nhid, Some(3));
            assert_eq!(
                r.nexthops
                    .iter()
                    .map(|h| (h.gateway, h.oif, h.hops))
                    .collect::<Vec<_>>(),
                [
                    (Some(IpAddr::from([10, 82, 0, 2])), a, 0),
                    (Some(IpAddr::from([10, 82, 0, 3])), a, 2)
                ]
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn this_namespace_has_a_loopback_with_its_address() {
        let mut nl = Rtnl::open().unwrap();
        let links = nl.links().unwrap();
        let lo = links.iter().find(|l| l.name == "lo").expect("lo");
        assert_eq!(lo.kind, None);
        assert_eq!(lo.mac, vec![0; 6]);
        let addrs = nl.addrs().unwrap();
        if lo.up {
            assert!(addrs
                .iter()
                .any(|a| a.index == lo.index && a.addr == IpAddr::from([127, 0, 0, 1])));
        }
        // The kernel's routes for 127.0.0.1 (table local).
        if lo.up {
            let routes = nl.routes().unwrap();
            assert!(routes.iter().any(|r| r.table == RT_TABLE_LOCAL
                && r.protocol == RTPROT_KERNEL
                && r.oif == Some(lo.index)));
        }
    }
}
