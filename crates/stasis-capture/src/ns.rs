//! The namespaces of the dumped tree, against the dumper's.
//!
//! [`check`] (preflight, nothing stopped) refuses a tree whose processes do
//! not all share the root's namespaces, and the namespaces of its own
//! that stasis cannot restore: a network namespace with
//! another interface than `lo`, tun and tap devices, veths whose peer
//! is in the dumper's namespace (as a container runtime makes them) or in
//! it, and bridges, ifbs, macvlans and vxlans on devices of it (dummy,
//! vlan, ipvlan, VRF, bond and tunnel devices are not made yet: the
//! kernels stasis is tested on lack them; wireguard's keys are not
//! rtnetlink's), or a route or next-hop object with an encapsulation
//! stasis does not make again ([`encap_refusal`]: a BPF program, a
//! kind other than ip, ip6, seg6 and seg6local);
//! and mounts of a mount
//! namespace that cannot be made again from the image (a disk's file
//! system the dumper has no mount of, an overlay on a directory the
//! dumper does not see, a FUSE or network file system, a bpf file system
//! with pinned objects). [`describe`] (frozen) records
//! what the restore needs: the host and domain names, the System V message
//! queues and semaphore sets of an IPC namespace, whether `lo` is up, the
//! veths (both ends: names, hardware addresses, MTUs, up states,
//! addresses, the peer's bridge), the tun and tap devices (their flags,
//! persistence, owner and group, and the same of their link), the
//! interfaces made in it (kind, configuration, lower device, bridge, a
//! source-mode macvlan's addresses), the next-hop objects, the routes
//! of every table (but the kernel's: with their encapsulations, gateways
//! of another family, source prefixes and next-hop ids) and the policy
//! routing rules (when not only the kernel's), the proc mount, the
//! `CLOCK_MONOTONIC` and `CLOCK_BOOTTIME` of a time namespace as seen
//! inside it (and its offsets), and the PID (and TID) of every process in
//! its namespace (and whether the root is its init: if not, the restore
//! makes a stand-in init that forks the root at its PID); the files of
//! its tmpfs, ramfs and hugetlbfs mounts go into the content pack. The dump itself works with the
//! PIDs stasis sees (ptrace, `/proc`); [`translate_pids`] gives the
//! manifest the in-namespace ones at the commit.

use std::collections::{HashMap, HashSet};

use stasis_image::manifest::{
    BindMount, EncapDev, FdKind, LaterKind, LaterMount, Manifest, MountNamespace, Namespaces,
    NetAddress, NetAttr, NetInterface, NetLink, NetNamespace, NetNextHop, NetNexthopObject,
    NetRoute, NetRule, PendingTimeNamespace, ProcessImage, TimeNamespace, TmpfsEntry, TmpfsMount,
    TunDevice, UserNamespace, UtsNamespace, Veth, IFLA_MACVLAN_MACADDR_DATA,
};
use stasis_image::ContentWriter;
use stasis_kernel::fdops as kns_fdops;
use stasis_kernel::ns::{self as kns, NsKind};
use stasis_kernel::rtnl::{self, Rtnl};

use crate::{proc, CaptureError, Result, SaveError};

/// The kinds a tree may have of its own.
const RESTORABLE: [NsKind; 8] = [
    NsKind::User,
    NsKind::Cgroup,
    NsKind::Pid,
    NsKind::Mnt,
    NsKind::Net,
    NsKind::Uts,
    NsKind::Ipc,
    NsKind::Time,
];

fn refuse(pid: i32, what: String) -> CaptureError {
    SaveError::Unsupported { pid, what }.into()
}

/// The kinds of namespace process `root` has that differ from the dumper's.
pub fn own_kinds(root: i32) -> Vec<NsKind> {
    NsKind::ALL
        .into_iter()
        .filter(|&k| match (kns::ns_id(root, k), kns::own_ns_id(k)) {
            (Some(a), Some(b)) => a != b,
            _ => false,
        })
        .collect()
}

/// Refuses, before anything is stopped, a tree whose namespaces stasis
/// cannot restore (`tree`: the root first, then its descendants).
pub fn check(root: i32, tree: &[i32]) -> Result<()> {
    for &p in tree.iter().filter(|&&p| p != root) {
        for k in NsKind::ALL {
            match (kns::ns_id(p, k), kns::ns_id(root, k)) {
                (Some(a), Some(b)) if a != b => {
                    return Err(refuse(
                        p,
                        format!(
                            "it is in a {} namespace other than the root's ({root}); stasis restores a tree whose processes all share the root's namespaces",
                            k.name()
                        ),
                    ))
                }
                _ => {}
            }
        }
    }
    let own = own_kinds(root);
    if let Some(k) = own.iter().find(|k| !RESTORABLE.contains(k)) {
        return Err(refuse(
            root,
            format!(
                "it is in a {} namespace of its own; stasis restores only user, pid, mnt, net, uts, ipc, cgroup and time namespaces",
                k.name()
            ),
        ));
    }
    if own.contains(&NsKind::User) {
        user_namespace(root)?;
    }
    if own.contains(&NsKind::Pid) && kns::pid_in_own_ns(root, root).is_none() {
        return Err(refuse(
            root,
            "it is in a PID namespace of its own but its PID there is unknown (no NSpid in its status)".into(),
        ));
    }
    if own.contains(&NsKind::Net) {
        check_net(root)?;
    }
    if own.contains(&NsKind::Ipc) {
        kns::in_namespaces_of(root, &[NsKind::Ipc], || {
            stasis_objects::mqueue::check_namespace(root)
        })??;
    }
    if own.contains(&NsKind::Mnt) {
        let cgns = if own.contains(&NsKind::Cgroup) {
            Some(cgroup_ns_root(root)?)
        } else {
            None
        };
        // (The tree's files are reopened, and its deleted ones made
        // again, in the restored namespace: on its own mounts.)
        extra_mounts(root, own.contains(&NsKind::Pid), cgns.as_deref(), None)?;
    }
    Ok(())
}

/// Whether process (or thread) `p` makes its children in another time
/// namespace than its own: one it unshared (`CLONE_NEWTIME`) that no
/// process has entered yet.
fn time_pending(p: i32) -> bool {
    matches!(
        (kns::ns_id(p, NsKind::Time), kns::time_for_children_id(p)),
        (Some(own), Some(kids)) if own != kids
    )
}

/// The time namespace process `pid` (frozen) has unshared and not
/// entered, if it has: its offsets (its `timens_offsets` shows those of
/// the namespace it makes its children in), and whether its other
/// threads share it (made after the unshare) or make their children in
/// its own (made before). Refused: a thread with another one than the
/// main thread's.
pub fn pending_time(pid: i32) -> Result<Option<PendingTimeNamespace>> {
    let main = kns::time_for_children_id(pid);
    let mut tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&t| t != pid)
        .collect();
    tids.sort_unstable();
    let pending = time_pending(pid);
    let sharing: Vec<bool> = tids
        .iter()
        .map(|&t| pending && kns::time_for_children_id(t) == main)
        .collect();
    if let Some((&tid, _)) = tids
        .iter()
        .zip(&sharing)
        .find(|&(&t, &shares)| time_pending(t) && !shares)
    {
        return Err(refuse(
            pid,
            format!("its thread {tid} has unshared a time namespace (CLONE_NEWTIME) that no process is in yet, other than its main thread's; stasis restores one unshared by the main thread, shared by all its threads or by none"),
        ));
    }
    if !pending {
        return Ok(None);
    }
    let threads = sharing.iter().any(|&s| s);
    if threads && !sharing.iter().all(|&s| s) {
        return Err(refuse(
            pid,
            "some of its threads make their children in the time namespace it has unshared, others in its own; stasis restores one shared by all its threads or by none".into(),
        ));
    }
    let off = kns::timens_offsets(Some(pid)).map_err(|e| {
        refuse(
            pid,
            format!("the clock offsets of the time namespace it has unshared cannot be read: {e}"),
        )
    })?;
    Ok(Some(PendingTimeNamespace {
        monotonic_offset: off.monotonic,
        boottime_offset: off.boottime,
        threads,
    }))
}

/// The time namespace of `root` (the tree frozen): its clocks now, as
/// seen inside it (the host's plus its offsets), and its offsets. Those
/// are read from `/proc/PID/timens_offsets` of a process of the tree
/// (`images`) that makes its children there: the root, unless it has
/// unshared another one.
fn time_namespace(root: i32, images: &[ProcessImage]) -> Result<TimeNamespace> {
    let clocks = |e: stasis_kernel::KernelError| {
        refuse(
            root,
            format!("the clocks of its time namespace cannot be read: {e}"),
        )
    };
    let own = kns::ns_id(root, NsKind::Time);
    let reader = std::iter::once(root)
        .chain(images.iter().filter(|p| p.zombie.is_none()).map(|p| p.pid))
        .find(|&p| own.is_some() && kns::time_for_children_id(p) == own)
        .ok_or_else(|| {
            refuse(
                root,
                "it has unshared a time namespace (CLONE_NEWTIME) of its own, then another that no process is in yet, and no process of the tree makes its children in the first: the kernel shows the offsets of a time namespace only to those".into(),
            )
        })?;
    let off = kns::timens_offsets(Some(reader)).map_err(clocks)?;
    let host = kns::host_clocks().map_err(clocks)?;
    Ok(TimeNamespace {
        monotonic: host.monotonic + off.monotonic,
        boottime: host.boottime + off.boottime,
        monotonic_offset: off.monotonic,
        boottime_offset: off.boottime,
    })
}

/// A network namespace of the tree's own: `lo` and the interfaces
/// [`net_namespace`] takes (its sockets are saved as in the dumper's,
/// from inside it: [`enter_net`]).
fn check_net(root: i32) -> Result<()> {
    net_namespace(root).map(|_| ())
}

/// What the network namespace of `root` holds, read by rtnetlink from
/// inside it (its interfaces, addresses, routes, next-hop objects, rules)
/// and from the dumper's (the veths' peers); refuses an interface other
/// than `lo`, tun and tap devices, veths whose peer is in the dumper's
/// namespace and the kinds [`own_link`] takes, and routes and next-hop
/// objects stasis does not make again.
fn net_namespace(root: i32) -> Result<NetNamespace> {
    let (links, addrs, routes, rules, nexthops) =
        kns::in_namespaces_of(root, &[NsKind::Net], || {
            let mut nl = Rtnl::open()?;
            Ok::<_, stasis_kernel::KernelError>((
                nl.links()?,
                nl.addrs()?,
                nl.routes()?,
                nl.rules()?,
                nl.nexthops()?,
            ))
        })??;
    let lo_up = links.iter().any(|l| l.name == "lo" && l.up);
    let mut net = NetNamespace {
        lo_up,
        ..Default::default()
    };
    // Only with a veth is the dumper's side looked at.
    let mut home = None;
    for l in &links {
        if l.name == "lo" && l.kind.is_none() {
            continue;
        }
        let master = master_of(root, l, &links)?;
        let inside = |l: &rtnl::Link| {
            let mut i = interface(l, &addrs);
            i.master = master.clone();
            i.port_no = master.as_ref().and(l.port_no);
            i
        };
        if let (Some("tun"), Some(t)) = (l.kind.as_deref(), l.tun.as_ref()) {
            net.tuns.push(TunDevice {
                iface: inside(l),
                flags: u32::from(t.flags),
                persist: t.persist,
                owner: t.owner,
                group: t.group,
            });
            continue;
        }
        let kind = l.kind.as_deref().unwrap_or_default();
        let own_veth = kind == "veth" && l.link_netnsid.is_none();
        if own_veth || ["bridge", "ifb", "macvlan", "vxlan"].contains(&kind) {
            net.links.push(own_link(root, l, inside(l), &links)?);
            continue;
        }
        if l.kind.as_deref() != Some("veth") {
            return Err(refuse(
                root,
                format!(
                    "its network namespace has the interface {} (a {} device); stasis restores a network namespace with lo, tun and tap, bridge, ifb, macvlan and vxlan interfaces, and veth interfaces whose peer is in the dumper's namespace or in it",
                    l.name,
                    l.kind.as_deref().unwrap_or("physical or unknown")
                ),
            ));
        }
        if home.is_none() {
            home = Some(kns::in_home_net(|| {
                let mut nl = Rtnl::open()?;
                // Listing the links first gives the tree's namespace an
                // id here, if it had none.
                let links = nl.links()?;
                let nsid = nl.nsid_of_pid(root)?;
                Ok::<_, stasis_kernel::KernelError>((links, nsid, nl.addrs()?))
            })??);
        }
        let Some((home_links, nsid, home_addrs)) = home.as_ref() else {
            continue;
        };
        let peer = home_links.iter().find(|h| {
            Some(h.index) == l.link
                && h.kind.as_deref() == Some("veth")
                && h.link == Some(l.index)
                && nsid.is_some()
                && h.link_netnsid == *nsid
        });
        let Some(peer) = peer else {
            return Err(refuse(
                root,
                format!(
                    "its network namespace has the veth {} whose peer is in a third network namespace (neither the tree's nor the dumper's); stasis restores veths whose peer is in the dumper's namespace",
                    l.name
                ),
            ));
        };
        let master = match peer.master {
            None => None,
            Some(m) => {
                let b = home_links.iter().find(|h| h.index == m);
                match b {
                    Some(b) if b.kind.as_deref() == Some("bridge") => Some(b.name.clone()),
                    _ => {
                        return Err(refuse(
                            root,
                            format!(
                                "the peer {} of its veth {} is a port of {}, not a bridge; stasis attaches a veth's peer only to a bridge",
                                peer.name,
                                l.name,
                                b.map_or("an unknown device", |b| b.name.as_str())
                            ),
                        ))
                    }
                }
            }
        };
        net.veths.push(Veth {
            inside: inside(l),
            peer: interface(peer, home_addrs),
            master,
        });
    }
    let name_of = |o: u32| links.iter().find(|l| l.index == o).map(|l| l.name.clone());
    for r in &routes {
        // The routes made from addresses and interfaces (in the main and
        // local tables) are the kernel's, made again with the addresses.
        if r.protocol == rtnl::RTPROT_KERNEL {
            continue;
        }
        let dst = r
            .dst
            .map_or("default".to_string(), |d| format!("{d}/{}", r.dst_len));
        let dev = r.oif.map(name_of);
        let hop_devs: Vec<Option<String>> = r
            .nexthops
            .iter()
            .map(|h| if h.oif == 0 { None } else { name_of(h.oif) })
            .collect();
        let unknown_dev = dev == Some(None)
            || r.nexthops
                .iter()
                .zip(&hop_devs)
                .any(|(h, d)| h.oif != 0 && d.is_none());
        let refused = |why: String| {
            refuse(
                root,
                format!(
                    "its network namespace has the route to {dst} in table {} ({why})",
                    r.table
                ),
            )
        };
        if unknown_dev {
            return Err(refused(
                "through an interface that is not in the namespace".into(),
            ));
        }
        let mut devs = Vec::new();
        for attrs in std::iter::once(&r.attrs).chain(r.nexthops.iter().map(|h| &h.attrs)) {
            if let Some(why) = encap_refusal(attrs, rtnl::RTA_ENCAP_TYPE, rtnl::RTA_ENCAP) {
                return Err(refused(why));
            }
            devs.push(
                encap_devs(attrs, rtnl::RTA_ENCAP_TYPE, rtnl::RTA_ENCAP, &links)
                    .map_err(&refused)?,
            );
        }
        let mut devs = devs.into_iter();
        let raw = |attrs: &[rtnl::RawAttr]| -> Vec<NetAttr> {
            attrs
                .iter()
                // An IPv6 route's preference is told even when it is the
                // default (medium, 0).
                .filter(|a| !(a.kind == rtnl::RTA_PREF && a.value == [0]))
                // Through a next-hop object, the route's own next hop
                // (gateway, encapsulation) is the object's, listed with it.
                .filter(|a| {
                    r.nhid.is_none()
                        || ![rtnl::RTA_VIA, rtnl::RTA_ENCAP_TYPE, rtnl::RTA_ENCAP].contains(&a.kind)
                })
                .map(|a| NetAttr {
                    kind: a.kind,
                    value: a.value.clone(),
                })
                .collect()
        };
        let own_hop = r.nhid.is_none();
        net.routes.push(NetRoute {
            family: r.family,
            dst: r.dst,
            dst_len: r.dst_len,
            gateway: r.gateway.filter(|_| own_hop),
            dev: dev.flatten().filter(|_| own_hop),
            metric: r.priority,
            prefsrc: r.prefsrc,
            protocol: r.protocol,
            scope: r.scope,
            kind: r.kind,
            table: r.table,
            nexthops: r
                .nexthops
                .iter()
                .zip(hop_devs)
                .filter(|_| own_hop)
                .map(|(h, dev)| NetNextHop {
                    gateway: h.gateway,
                    dev,
                    hops: h.hops,
                    flags: h.flags & rtnl::RTNH_F_ONLINK,
                    attrs: raw(&h.attrs),
                    encap_devs: Vec::new(),
                })
                .collect(),
            flags: if own_hop {
                r.flags & u32::from(rtnl::RTNH_F_ONLINK)
            } else {
                0
            },
            attrs: raw(&r.attrs),
            src: r.src,
            src_len: r.src_len,
            nhid: r.nhid,
            encap_devs: devs.next().filter(|_| own_hop).unwrap_or_default(),
        });
        let route = net.routes.last_mut().expect("just pushed");
        for (h, d) in route.nexthops.iter_mut().zip(devs) {
            h.encap_devs = d;
        }
    }
    for n in &nexthops {
        net.nexthops.push(nexthop_object(root, n, &links)?);
    }
    if !only_kernel_rules(&rules) {
        net.rules = rules
            .iter()
            .map(|r| NetRule {
                family: r.family,
                dst_len: r.dst_len,
                src_len: r.src_len,
                tos: r.tos,
                table: r.table,
                action: r.action,
                flags: r.flags,
                attrs: r
                    .attrs
                    .iter()
                    .map(|a| NetAttr {
                        kind: a.kind,
                        value: a.value.clone(),
                    })
                    .collect(),
            })
            .collect();
    }
    Ok(net)
}

/// The bridge of the tree's namespace (`links`) interface `l` is a port
/// of; refuses another master (a bond, a VRF...).
fn master_of(root: i32, l: &rtnl::Link, links: &[rtnl::Link]) -> Result<Option<String>> {
    let Some(m) = l.master else {
        return Ok(None);
    };
    match links.iter().find(|b| b.index == m) {
        Some(b) if b.kind.as_deref() == Some("bridge") => Ok(Some(b.name.clone())),
        b => Err(refuse(
            root,
            format!(
                "its interface {} is a port of {}, not a bridge; stasis restores bridges' ports only",
                l.name,
                b.map_or("an unknown device", |b| b.name.as_str())
            ),
        )),
    }
}

/// `IFLA_BR_FORWARD_DELAY` to `IFLA_BR_VLAN_FILTERING`: a bridge's
/// configuration (the rest of its `IFLA_INFO_DATA` is its state: timers,
/// ids, topology changes).
const BRIDGE_CONFIG: std::ops::RangeInclusive<u16> = 1..=7;
/// `IFLA_MACVLAN_MODE` and `IFLA_MACVLAN_FLAGS`.
const MACVLAN_CONFIG: std::ops::RangeInclusive<u16> = 1..=2;
/// `IFLA_VXLAN_ID` to `IFLA_VXLAN_UDP_ZERO_CSUM6_RX`: a vxlan's id,
/// addresses, port and options (but its lower device, `IFLA_VXLAN_LINK`).
const VXLAN_CONFIG: std::ops::RangeInclusive<u16> = 1..=20;
/// `IFLA_VXLAN_LINK`: a vxlan's lower device, by index.
const IFLA_VXLAN_LINK: u16 = 3;

/// Interface `l` (`iface`) made inside the tree's namespace: its kind,
/// queue length, the device it is linked to (by name, in `links`) and
/// its configuration.
fn own_link(
    root: i32,
    l: &rtnl::Link,
    iface: NetInterface,
    links: &[rtnl::Link],
) -> Result<NetLink> {
    let kind = l.kind.clone().unwrap_or_default();
    let by_index = |i: u32| {
        links.iter().find(|x| x.index == i).map(|x| x.name.clone()).ok_or_else(|| {
            refuse(
                root,
                format!(
                    "its {kind} interface {} is linked to interface {i}, which is not in its network namespace; stasis restores one linked to an interface of the namespace",
                    l.name
                ),
            )
        })
    };
    let mut link = None;
    let mut data = Vec::new();
    for a in &l.info_data {
        let keep = match kind.as_str() {
            // VLAN filtering off is left out: a kernel without it
            // refuses the attribute, even 0.
            "bridge" => BRIDGE_CONFIG.contains(&a.kind) && !(a.kind == 7 && a.value == [0]),
            // A source-mode macvlan's list of source addresses
            // (IFLA_MACVLAN_MACADDR_DATA, not there when empty), set
            // again at its making.
            "macvlan" => MACVLAN_CONFIG.contains(&a.kind) || a.kind == IFLA_MACVLAN_MACADDR_DATA,
            "vxlan" => {
                if a.kind == IFLA_VXLAN_LINK {
                    let i = <[u8; 4]>::try_from(&a.value[..])
                        .map(u32::from_ne_bytes)
                        .unwrap_or(0);
                    if i != 0 {
                        link = Some(by_index(i)?);
                    }
                    false
                } else {
                    VXLAN_CONFIG.contains(&a.kind)
                }
            }
            _ => false,
        };
        if keep {
            data.push(NetAttr {
                kind: a.kind,
                value: a.value.clone(),
            });
        }
    }
    if matches!(kind.as_str(), "macvlan" | "veth") {
        match l.link {
            Some(i) if l.link_netnsid.is_none() => link = Some(by_index(i)?),
            _ => {
                return Err(refuse(
                    root,
                    format!(
                        "its {kind} interface {} has its link in another network namespace; stasis restores one linked to an interface of the namespace",
                        l.name
                    ),
                ))
            }
        }
    }
    Ok(NetLink {
        iface,
        kind,
        txqlen: l.txqlen,
        link,
        data,
    })
}

/// Why stasis does not make again the encapsulation of a route or
/// next-hop object (`attrs`, whose encapsulation attributes are
/// `type_attr` and `encap_attr`), if it does not: one that names a BPF
/// program (the kernel gives it back by id, not as something to load),
/// or a kind stasis does not make (`mpls`, `ila`, `rpl`, `ioam6`, ...).
fn encap_refusal(attrs: &[rtnl::RawAttr], type_attr: u16, encap_attr: u16) -> Option<String> {
    let kind = attrs
        .iter()
        .find(|a| a.kind == type_attr)
        .and_then(|a| <[u8; 2]>::try_from(&a.value[..]).ok())
        .map(u16::from_ne_bytes)?;
    let encap = attrs
        .iter()
        .find(|a| a.kind == encap_attr)
        .map(|a| &a.value[..])
        .unwrap_or(&[]);
    match kind {
        rtnl::LWTUNNEL_ENCAP_IP | rtnl::LWTUNNEL_ENCAP_IP6 | rtnl::LWTUNNEL_ENCAP_SEG6 => None,
        rtnl::LWTUNNEL_ENCAP_SEG6_LOCAL => rtnl::split_attrs(encap)
            .into_iter()
            .any(|a| a.kind == rtnl::SEG6_LOCAL_BPF)
            .then(|| {
                "an encapsulation seg6local with a BPF program, which the kernel gives back by id and name, not as something to load again; stasis restores seg6local actions without one".into()
            }),
        rtnl::LWTUNNEL_ENCAP_BPF => Some(
            "an encapsulation bpf: BPF programs, which the kernel gives back only by id and name, not as programs; stasis restores encap ip, ip6, seg6 and seg6local".into(),
        ),
        k => Some(format!(
            "an encapsulation of kind {} ({k}); stasis restores encap ip, ip6, seg6 and seg6local",
            match k {
                rtnl::LWTUNNEL_ENCAP_MPLS => "mpls",
                rtnl::LWTUNNEL_ENCAP_ILA => "ila",
                rtnl::LWTUNNEL_ENCAP_RPL => "rpl",
                rtnl::LWTUNNEL_ENCAP_IOAM6 => "ioam6",
                rtnl::LWTUNNEL_ENCAP_XFRM => "xfrm",
                _ => "unknown",
            }
        )),
    }
}

/// The interfaces (of `links`) the `seg6local` encapsulation of `attrs`
/// (whose encapsulation attributes are `type_attr` and `encap_attr`)
/// names by index (`iif`, `oif`), by name; an index of no interface of
/// the namespace is refused (`Err`: why).
fn encap_devs(
    attrs: &[rtnl::RawAttr],
    type_attr: u16,
    encap_attr: u16,
    links: &[rtnl::Link],
) -> std::result::Result<Vec<EncapDev>, String> {
    let seg6local = attrs
        .iter()
        .any(|a| a.kind == type_attr && a.value == rtnl::LWTUNNEL_ENCAP_SEG6_LOCAL.to_ne_bytes());
    let encap = attrs.iter().find(|a| a.kind == encap_attr);
    let Some(encap) = encap.filter(|_| seg6local) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for a in rtnl::split_attrs(&encap.value) {
        if ![rtnl::SEG6_LOCAL_IIF, rtnl::SEG6_LOCAL_OIF].contains(&a.kind) {
            continue;
        }
        let i = <[u8; 4]>::try_from(&a.value[..])
            .map(u32::from_ne_bytes)
            .unwrap_or(0);
        match links.iter().find(|l| l.index == i) {
            Some(l) => out.push(EncapDev {
                kind: a.kind,
                dev: l.name.clone(),
            }),
            None => {
                return Err(format!(
                    "an encapsulation seg6local naming interface {i}, which is not in the namespace"
                ))
            }
        }
    }
    Ok(out)
}

/// Next-hop object `n` of the tree's namespace (`links`): its output
/// interface by name and its configuration (id, gateway, blackhole, fdb,
/// encapsulation, group, a resilient group's buckets and timers);
/// refuses one through an interface of another namespace or with an
/// encapsulation stasis does not make ([`encap_refusal`]).
fn nexthop_object(
    root: i32,
    n: &rtnl::NexthopObject,
    links: &[rtnl::Link],
) -> Result<NetNexthopObject> {
    let id = n.id().unwrap_or(0);
    let dev = match n.oif() {
        None => None,
        Some(i) => match links.iter().find(|l| l.index == i) {
            Some(l) => Some(l.name.clone()),
            None => {
                return Err(refuse(
                    root,
                    format!("its network namespace has the next-hop object {id} through interface {i}, which is not in it"),
                ))
            }
        },
    };
    let why = encap_refusal(&n.attrs, rtnl::NHA_ENCAP_TYPE, rtnl::NHA_ENCAP);
    let devs = match why {
        Some(why) => Err(why),
        None => encap_devs(&n.attrs, rtnl::NHA_ENCAP_TYPE, rtnl::NHA_ENCAP, links),
    };
    let encap_devs = devs.map_err(|why| {
        refuse(
            root,
            format!("its network namespace has the next-hop object {id} with {why}"),
        )
    })?;
    const CONFIG: [u16; 9] = [
        rtnl::NHA_ID,
        rtnl::NHA_GROUP,
        rtnl::NHA_GROUP_TYPE,
        rtnl::NHA_BLACKHOLE,
        rtnl::NHA_GATEWAY,
        rtnl::NHA_ENCAP_TYPE,
        rtnl::NHA_ENCAP,
        rtnl::NHA_FDB,
        rtnl::NHA_RES_GROUP,
    ];
    let attrs = n
        .attrs
        .iter()
        .filter(|a| CONFIG.contains(&a.kind))
        .map(|a| NetAttr {
            kind: a.kind,
            value: if a.kind == rtnl::NHA_RES_GROUP {
                // Its buckets and timers, not its state (the time it
                // has been unbalanced).
                let config: Vec<rtnl::RawAttr> = rtnl::split_attrs(&a.value)
                    .into_iter()
                    .filter(|x| rtnl::NHA_RES_GROUP_CONFIG.contains(&x.kind))
                    .collect();
                rtnl::join_attrs(&config)
            } else {
                a.value.clone()
            },
        })
        .collect();
    Ok(NetNexthopObject {
        family: n.family,
        scope: n.scope,
        protocol: n.protocol,
        flags: n.flags & u32::from(rtnl::RTNH_F_ONLINK),
        dev,
        attrs,
        encap_devs,
    })
}

/// Whether `rules` are those the kernel gives a new network namespace:
/// lookups of the local (priority 0), main (32766) and, for IPv4,
/// default (32767) tables, each of protocol `kernel`.
fn only_kernel_rules(rules: &[rtnl::Rule]) -> bool {
    const KERNEL: [(u8, u32, u32); 5] = [
        (rtnl::AF_INET, 0, rtnl::RT_TABLE_LOCAL),
        (rtnl::AF_INET, 32766, rtnl::RT_TABLE_MAIN),
        (rtnl::AF_INET, 32767, 253),
        (rtnl::AF_INET6, 0, rtnl::RT_TABLE_LOCAL),
        (rtnl::AF_INET6, 32766, rtnl::RT_TABLE_MAIN),
    ];
    let key = |r: &rtnl::Rule| (r.family, r.priority(), r.table_id());
    let kernel = |r: &rtnl::Rule| {
        r.protocol() == rtnl::RTPROT_KERNEL
            && r.src_len == 0
            && r.dst_len == 0
            && r.action == 1
            && KERNEL.contains(&key(r))
    };
    let has = |k: (u8, u32, u32)| rules.iter().filter(|r| key(r) == k).count() == 1;
    let v6 = rules.iter().any(|r| r.family == rtnl::AF_INET6);
    rules.iter().all(kernel)
        && KERNEL
            .iter()
            .all(|&k| has(k) || (k.0 == rtnl::AF_INET6 && !v6))
}

/// Interface `l` and its addresses (of `addrs`), but IPv6 link-local
/// ones and those not set by hand (the kernel makes them itself).
fn interface(l: &rtnl::Link, addrs: &[rtnl::Addr]) -> NetInterface {
    let addrs = addrs
        .iter()
        .filter(|a| a.index == l.index)
        .filter(|a| match a.addr {
            std::net::IpAddr::V6(v6) => {
                (v6.segments()[0] & 0xffc0) != 0xfe80 && a.flags & rtnl::IFA_F_PERMANENT != 0
            }
            std::net::IpAddr::V4(_) => true,
        })
        .map(|a| NetAddress {
            addr: a.addr,
            prefix: a.prefix,
            broadcast: a.broadcast,
            flags: a.flags & (rtnl::IFA_F_NODAD | rtnl::IFA_F_NOPREFIXROUTE),
            scope: a.scope,
            peer: a.peer,
        })
        .collect();
    NetInterface {
        name: l.name.clone(),
        mac: l.mac.clone(),
        mtu: l.mtu,
        up: l.up,
        addrs,
        master: None,
        port_no: None,
    }
}

/// After a dump that killed the tree: removes the veths of its network
/// namespace (`ns`, opened before the kill), and with them their peers
/// in the dumper's namespace, so that their names are free for the
/// restore at once (the namespace itself may live on a while, held by
/// the killed tree's connections until the restore takes them over).
pub fn remove_veths(ns: &std::os::fd::OwnedFd) {
    // A namespace kept by a name (`ip netns add`: an nsfs mount) outlives
    // the tree: its interfaces are not the tree's to remove.
    if let Some(name) = persistent_netns(ns) {
        tracing::info!(%name, "the killed tree's network namespace is kept by a mount: its veths are left");
        return;
    }
    let removed = kns::in_net(ns, || -> stasis_kernel::Result<Vec<String>> {
        let mut nl = Rtnl::open()?;
        let mut gone = Vec::new();
        for l in nl.links()? {
            if l.kind.as_deref() == Some("veth") {
                nl.del_link(l.index)?;
                gone.push(l.name);
            }
        }
        Ok(gone)
    });
    match removed {
        Ok(Ok(gone)) if !gone.is_empty() => {
            tracing::info!(?gone, "removed the killed tree's veth interfaces")
        }
        Ok(Ok(_)) => {}
        Ok(Err(e)) | Err(e) => {
            tracing::warn!("removing the killed tree's veth interfaces: {e}")
        }
    }
}

/// The nsfs mount that keeps network namespace `ns` alive, if one does
/// (`ip netns add` mounts it on /run/netns/NAME).
fn persistent_netns(ns: &std::os::fd::OwnedFd) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::File::from(ns.try_clone().ok()?)
        .metadata()
        .ok()?
        .ino();
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (a, b) = l.split_once(" - ")?;
        let f: Vec<&str> = a.split_whitespace().collect();
        (b.split_whitespace().next() == Some("nsfs")
            && f.get(3) == Some(&format!("net:[{ino}]").as_str()))
        .then(|| f.get(4).map(|s| (*s).to_string()))
        .flatten()
    })
}

/// The id maps of the user namespace of `root`, as this process sees
/// them; refuses one with no map (nothing could be restored in it).
fn user_namespace(root: i32) -> Result<UserNamespace> {
    let map = |f: &str| -> Result<Vec<[u32; 3]>> {
        let t = proc::read(root, f)?;
        let mut out = Vec::new();
        for l in t.lines().filter(|l| !l.trim().is_empty()) {
            let v: Vec<u32> = l
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            match v.as_slice() {
                &[i, o, n] => out.push([i, o, n]),
                _ => {
                    return Err(refuse(root, format!("its {f} has the line {l:?}")));
                }
            }
        }
        Ok(out)
    };
    let (uid_map, gid_map) = (map("uid_map")?, map("gid_map")?);
    // Both written, or neither (a namespace without maps: its processes
    // keep the ids they had when it was made, and it is made so again).
    if uid_map.is_empty() != gid_map.is_empty() {
        let f = if uid_map.is_empty() {
            "uid_map"
        } else {
            "gid_map"
        };
        return Err(refuse(
            root,
            format!(
                "its user namespace has an empty {f} and the other map written; stasis restores one with both written, or neither"
            ),
        ));
    }
    Ok(UserNamespace {
        uid_map,
        gid_map,
        setgroups_deny: proc::read(root, "setgroups")?.trim() == "deny",
    })
}

/// The root of the cgroup namespace of `root`, as the dumper sees it: its
/// cgroup seen from here less the same seen from inside the namespace.
fn cgroup_ns_root(root: i32) -> Result<String> {
    let outside = cgroup_of(root).unwrap_or_default();
    let inside =
        kns::in_namespaces_of(root, &[NsKind::Cgroup], || cgroup_of(root))?.unwrap_or_default();
    let base = if inside == "/" {
        Some(outside.as_str())
    } else {
        outside.strip_suffix(inside.as_str())
    };
    match base {
        Some(b) if outside.starts_with('/') && inside.starts_with('/') => {
            Ok(if b.is_empty() { "/".into() } else { b.to_string() })
        }
        _ => Err(refuse(
            root,
            format!("its cgroup namespace's root cannot be told: it is in cgroup {outside:?}, {inside:?} from inside"),
        )),
    }
}

/// The cgroup (v2) of process `pid`: the path after `0::` in its
/// `/proc/PID/cgroup` (`None` if it is gone).
pub fn cgroup_of(pid: i32) -> Option<String> {
    stasis_kernel::procfs::cgroup_of(&pid.to_string())
}

/// With a network namespace of the tree's own: the calling thread in it
/// until the guard is dropped, so that its sockets are read there
/// (sock_diag answers about the namespace of the socket asking).
pub fn enter_net(root: i32) -> Result<Option<kns::NetnsGuard>> {
    if !own_kinds(root).contains(&NsKind::Net) {
        return Ok(None);
    }
    Ok(Some(kns::NetnsGuard::enter(root)?))
}

/// One line of a `mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountLine {
    dev: String,
    root: String,
    at: String,
    kind: String,
    /// Per-mount options (`rw,nosuid,...`).
    mount_opts: String,
    /// The file system's options.
    super_opts: String,
    /// Its source (`none`, a device...).
    source: String,
    /// Its propagation from the optional fields (`shared:N`, `master:N`,
    /// `unbindable`): `MS_SHARED`, `MS_SLAVE`, `MS_UNBINDABLE` (0:
    /// private).
    propagation: u64,
    /// Its peer group (`shared:N`) and its master's (`master:N`).
    shared: Option<u32>,
    master: Option<u32>,
}

impl MountLine {
    /// What tells one mount from another across namespaces (a copied
    /// mount namespace has the same).
    fn key(&self) -> (String, String, String) {
        (self.dev.clone(), self.root.clone(), self.at.clone())
    }
}

/// The lines of a `mountinfo`.
fn mounts(info: &str) -> Vec<MountLine> {
    info.lines()
        .filter_map(|l| {
            let (a, b) = l.split_once(" - ")?;
            let f: Vec<&str> = a.split_whitespace().collect();
            let g: Vec<&str> = b.split_whitespace().collect();
            Some(MountLine {
                dev: f.get(2)?.to_string(),
                root: f.get(3)?.to_string(),
                at: f.get(4)?.to_string(),
                kind: g.first()?.to_string(),
                mount_opts: f.get(5)?.to_string(),
                super_opts: g.get(2).map_or(String::new(), |s| s.to_string()),
                source: g.get(1).map_or(String::new(), |s| s.to_string()),
                shared: f
                    .iter()
                    .skip(6)
                    .find_map(|o| o.strip_prefix("shared:")?.parse().ok()),
                master: f
                    .iter()
                    .skip(6)
                    .find_map(|o| o.strip_prefix("master:")?.parse().ok()),
                propagation: f.iter().skip(6).fold(0, |a, o| {
                    a | if o.starts_with("shared:") {
                        libc::MS_SHARED
                    } else if o.starts_with("master:") {
                        libc::MS_SLAVE
                    } else if *o == "unbindable" {
                        libc::MS_UNBINDABLE
                    } else {
                        0
                    }
                }),
            })
        })
        .collect()
}

/// The mounts of the root's mount namespace that the dumper's has not
/// (mounts it lacks are left as the restorer has them), each with its
/// flags, options, source and propagation: the stub's proc on `/proc`
/// (with `own_pid`, without options of its own), tmpfs and ramfs mounts
/// (their files' data copied into the content pack when `content` is
/// given), a hugetlbfs holding files (saved as a tmpfs's, whole huge
/// pages: [`huge_extents`]), an overlay on directories the dumper sees
/// ([`overlay`]), binds of mounts of its own saved before, bind mounts of what
/// the dumper sees, and file systems with nothing to save ([`FRESH`]:
/// another proc, sysfs, an mqueue (the queues of the tree's own IPC
/// namespace are saved with it, those of the dumper's that the tree holds
/// fds on with the fds, and the others are found as they are at the
/// restore), a devpts instance (its terminals are the tree's pty pairs),
/// an empty hugetlbfs or bpf, the kernel's views; a cgroup2 rooted at the
/// root of the tree's cgroup namespace: `cgns_root`, as the dumper sees
/// it, or the dumper's); refuses every other (a disk's file system by its
/// block device, a FUSE or network file system with the kernel's
/// reason). Copies of the dumper's mounts that are slaves of its
/// peer groups set `slave_copies`. A root of its own
/// (pivot_root) is saved as where the dumper sees it (refused if it does
/// not), every other mount then as the tree sees it from there. From the first
/// mount the root stub cannot make (nested in an earlier one, a read-only
/// tmpfs, a fresh file system, a bind of its own, one not private) on,
/// every mount is made later, by the restorer, in order.
/// The dumper's `mountinfo` and the tree's (`root`'s), read so that no
/// mount came or went in between: a mount propagated to both namespaces
/// (another program's `ip netns add` on the host, say, when both are
/// slaves of the host's mounts) could otherwise be in one and not the
/// other, and be refused as a mount of the tree's own. The dumper's is
/// read before and after the tree's, again until both reads agree (a few
/// times at most; then the last ones are taken).
fn both_mountinfos(root: i32) -> Result<(String, String)> {
    let me = std::process::id() as i32;
    let mut before = proc::read(me, "mountinfo")?;
    for _ in 0..8 {
        let theirs = proc::read(root, "mountinfo")?;
        let after = proc::read(me, "mountinfo")?;
        if after == before {
            return Ok((after, theirs));
        }
        before = after;
    }
    let theirs = proc::read(root, "mountinfo")?;
    Ok((before, theirs))
}

fn extra_mounts(
    root: i32,
    own_pid: bool,
    cgns_root: Option<&str>,
    mut content: Option<&mut ContentWriter>,
) -> Result<MountNamespace> {
    let (my_info, their_info) = both_mountinfos(root)?;
    let my_mounts = mounts(&my_info);
    let mine: HashSet<_> = my_mounts.iter().map(MountLine::key).collect();
    let mut ns = MountNamespace::default();
    let mut later = false;
    let mut made: Vec<String> = Vec::new();
    // The mounts of its own saved so far.
    let mut own: Vec<MountLine> = Vec::new();
    let theirs = mounts(&their_info);
    // (Where an overlay's directories are: on the mounts before it.)
    let all = theirs.clone();
    // A root of its own (as pivot_root makes): where the dumper sees its
    // file system, a mount of the same device whose root holds it; every
    // other mount, seen from that root, is then the tree's own.
    if let Some(m) = theirs
        .iter()
        .rfind(|m| m.at == "/")
        .filter(|m| !mine.contains(&m.key()))
    {
        let Some(source) = seen_by_dumper(&my_mounts, m) else {
            return Err(refuse(
                root,
                format!("its mount namespace has a root of its own (a {} mount on /, as pivot_root makes) that no mount of the dumper's mount namespace holds; stasis restores a root the dumper sees (dump it from a mount namespace where its root file system is mounted)", m.kind),
            ));
        };
        ns.root = Some(BindMount {
            source,
            target: "/".into(),
            flags: mount_flags(&m.mount_opts),
        });
    }
    for (index, m) in theirs.into_iter().enumerate() {
        if ns.root.is_none() && mine.contains(&m.key()) {
            // A copy of a shared mount of the dumper's made its slave
            // (`unshare --propagation slave`): all are, by the restore's
            // stub. (Copies that are slaves of the same master as the
            // dumper's, as `ip netns exec` makes both, are the dumper's.)
            ns.slave_copies |= m.master.is_some()
                && my_mounts
                    .iter()
                    .any(|h| h.key() == m.key() && h.shared == m.master);
            continue;
        }
        let (at, kind) = (&m.at, &m.kind);
        if at == "/" {
            continue;
        }
        // The stub's proc on /proc (without options of its own).
        if kind == "proc"
            && at == "/proc"
            && own_pid
            && m.root == "/"
            && m.super_opts == "rw"
            && m.propagation == 0
            && mount_flags(&m.mount_opts)
                & !(libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RELATIME)
                == 0
        {
            ns.proc = true;
            continue;
        }
        let flags = mount_flags(&m.mount_opts);
        let options = m
            .super_opts
            .split(',')
            .filter(|o| *o != "rw" && *o != "ro")
            .collect::<Vec<_>>()
            .join(",");
        let nested = made
            .iter()
            .any(|t| at == t || t == "/" || at.starts_with(&format!("{t}/")));
        // The stub makes its mounts private: one that is not is made
        // later, and every one after it.
        later |= nested || m.propagation != 0;
        made.push(at.clone());
        // A bind of a mount of its own made earlier (of the same file
        // system: a tmpfs bound elsewhere, a directory of it, a slave of
        // it): bound from there once that one is made again, so both
        // are one file system again (and in one peer group, if shared).
        if let Some(source) = bound_from_own(&own, &m, ns.root.as_ref()) {
            own.push(m.clone());
            later = true;
            ns.later.push(LaterMount {
                target: at.clone(),
                flags,
                what: LaterKind::Bind { source },
                propagation: m.propagation,
            });
            continue;
        }
        own.push(m.clone());
        if kind == "tmpfs" && m.root == "/" {
            let entries = if let Some(w) = content.as_deref_mut() {
                tmpfs_entries(root, at, w)?
            } else {
                Vec::new()
            };
            later |= flags & libc::MS_RDONLY != 0;
            if later {
                ns.later.push(LaterMount {
                    target: at.clone(),
                    flags,
                    what: LaterKind::Tmpfs {
                        options,
                        entries,
                        source: m.source.clone(),
                    },
                    propagation: m.propagation,
                });
            } else {
                ns.tmpfs.push(TmpfsMount {
                    target: at.clone(),
                    flags,
                    options,
                    source: m.source.clone(),
                    entries,
                });
            }
            continue;
        }
        // A ramfs, and a hugetlbfs holding files: saved with them (an
        // empty hugetlbfs is made again from nothing, below).
        let huge = kind == "hugetlbfs" && m.root == "/" && !dir_is_empty(root, at)?;
        if (kind == "ramfs" && m.root == "/") || huge {
            let entries = if let Some(w) = content.as_deref_mut() {
                tmpfs_entries(root, at, w)?
            } else {
                Vec::new()
            };
            let source = m.source.clone();
            later = true;
            ns.later.push(LaterMount {
                target: at.clone(),
                flags,
                what: if huge {
                    LaterKind::Hugetlbfs {
                        source,
                        options,
                        entries,
                    }
                } else {
                    LaterKind::Ramfs {
                        source,
                        options,
                        entries,
                    }
                },
                propagation: m.propagation,
            });
            continue;
        }
        let fresh = FRESH.contains(&kind.as_str()) && m.root == "/";
        // A cgroup2 mounted from inside the tree's cgroup namespace (a
        // container's, on /sys/fs/cgroup): mounted again from inside the
        // restored one.
        let cgroup2 = kind == "cgroup2" && m.root == cgns_root.unwrap_or("/");
        if fresh || cgroup2 {
            if fresh {
                check_fresh(root, kind, at)?;
            }
            later = true;
            ns.later.push(LaterMount {
                target: at.clone(),
                flags,
                what: LaterKind::Fresh {
                    fstype: kind.clone(),
                    source: m.source.clone(),
                    options,
                },
                propagation: m.propagation,
            });
            continue;
        }
        // A bind mount of something the dumper sees.
        if let Some(source) = seen_by_dumper(&my_mounts, &m) {
            if later {
                ns.later.push(LaterMount {
                    target: at.clone(),
                    flags,
                    what: LaterKind::Bind { source },
                    propagation: m.propagation,
                });
            } else {
                ns.binds.push(BindMount {
                    source,
                    target: at.clone(),
                    flags,
                });
            }
            continue;
        }
        // An overlay of the tree's own: mounted again on its directories
        // (which hold its content) if the dumper sees them.
        if kind == "overlay" && m.root == "/" {
            let what = overlay(root, &m, &all[..index], &my_mounts)?;
            later = true;
            ns.later.push(LaterMount {
                target: at.clone(),
                flags,
                what,
                propagation: m.propagation,
            });
            continue;
        }
        if kind == "fuse" || kind == "fuseblk" || kind.starts_with("fuse.") {
            return Err(refuse(
                root,
                format!("its mount namespace has a FUSE file system ({kind}, of {}) on {at} that no mount of the dumper's holds; stasis cannot make it again: the connection's state and the daemon's pending requests live in its /dev/fuse, which the kernel does not give back (mount it in the dumper's namespace too, where the tree's mount is then saved as a bind of it)", m.source),
            ));
        }
        if NETWORK_FS.contains(&kind.as_str()) {
            return Err(refuse(
                root,
                format!("its mount namespace has a network file system ({kind}, of {}) on {at} that no mount of the dumper's holds; stasis cannot make it again: the server's state (its session, the open files, locks and delegations) is not the host's to save (mount it in the dumper's namespace and bind it into the tree's, which stasis saves as a bind of it)", m.source),
            ));
        }
        if m.source.starts_with("/dev/") {
            return Err(refuse(
                root,
                format!("its mount namespace has a {kind} file system of the block device {} on {at} that no mount of the dumper's mount namespace holds; stasis cannot make a disk's file system again from the image (mount it in the dumper's namespace too, where the tree's mount is then saved as a bind of it)", m.source),
            ));
        }
        return Err(refuse(
            root,
            format!("its mount namespace has a {kind} mount on {at} (of {}) that no mount of the dumper's holds; stasis makes again tmpfs, ramfs, proc, sysfs, devpts, mqueue, hugetlbfs, cgroup2, overlays on directories the dumper sees and kernel views ({}), binds of its own mounts and of what the dumper sees (mount that file system in the dumper's namespace too)", m.source, FRESH.join(", ")),
        ));
    }
    Ok(ns)
}

/// Network file systems: their state is the server's.
const NETWORK_FS: [&str; 9] = [
    "nfs", "nfs4", "cifs", "smb3", "9p", "ceph", "afs", "ncpfs", "lustre",
];

/// The overlay `m` of the tree's mount namespace as the restore mounts it
/// again: its `lowerdir`, `upperdir` and `workdir` as the dumper sees
/// them, each found on the tree's mount that held it when the overlay was
/// mounted (the last of `before`, the mounts listed before it, whose
/// point holds it) and where the dumper sees that mount ([`seen_by_dumper`],
/// as a bind's source), and its other options. Refused, naming the
/// directory: one the dumper does not see (on a mount of the tree's
/// own: the overlay's content would not be saved), a relative path or a
/// name with escaped characters (as given to `mount`: which directory it
/// is cannot be told).
fn overlay(
    root: i32,
    m: &MountLine,
    before: &[MountLine],
    my_mounts: &[MountLine],
) -> Result<LaterKind> {
    let at = &m.at;
    let dir = |which: &str, d: &str| -> Result<String> {
        if !d.starts_with('/') || d.contains('\\') {
            return Err(refuse(
                root,
                format!("its overlay on {at} has the {which} {d}, a relative path or a name with a space, comma, colon or backslash (as given to mount): stasis cannot tell which directory it is (mount the overlay with absolute paths of plain names)"),
            ));
        }
        let holder = before
            .iter()
            .filter(|t| t.at == "/" || d == t.at || d.starts_with(&format!("{}/", t.at)))
            .max_by_key(|t| t.at.len());
        let seen = holder.and_then(|t| {
            let rest = if t.at == "/" { d } else { &d[t.at.len()..] };
            let base = seen_by_dumper(my_mounts, t)?;
            let p = format!("{}{rest}", base.trim_end_matches('/'));
            Some(if p.is_empty() { "/".to_string() } else { p })
        });
        match seen {
            Some(p) if std::fs::metadata(&p).is_ok_and(|md| md.is_dir()) => Ok(p),
            _ => Err(refuse(
                root,
                format!(
                    "its overlay on {at} has the {which} {d} on a {} mount that the dumper's mount namespace does not see; stasis mounts an overlay again on the directories where the dumper sees them (they hold its content): put them on a file system mounted in the dumper's namespace too",
                    holder.map_or("", |t| t.kind.as_str())
                ),
            )),
        }
    };
    let (mut lowerdir, mut upperdir, mut workdir) = (None, String::new(), String::new());
    let mut options = Vec::new();
    for o in m.super_opts.split(',') {
        match o.split_once('=') {
            Some(("lowerdir", v)) => {
                // `:` between layers, `::` before the data-only ones.
                let layers = v
                    .split(':')
                    .map(|l| {
                        if l.is_empty() {
                            Ok(String::new())
                        } else {
                            dir("lower directory", l)
                        }
                    })
                    .collect::<Result<Vec<_>>>()?;
                lowerdir = Some(layers.join(":"));
            }
            Some(("upperdir", v)) => upperdir = dir("upper directory", v)?,
            Some(("workdir", v)) => workdir = dir("work directory", v)?,
            _ if o == "rw" || o == "ro" || o.is_empty() => {}
            _ => options.push(o),
        }
    }
    let Some(lowerdir) = lowerdir else {
        return Err(refuse(
            root,
            format!("its overlay on {at} shows no lowerdir in its mountinfo ({}); stasis cannot mount it again", m.super_opts),
        ));
    };
    Ok(LaterKind::Overlay {
        source: m.source.clone(),
        lowerdir,
        upperdir,
        workdir,
        options: options.join(","),
    })
}

/// Where the tree sees the root of mount `m` as a bind of a mount of its
/// own saved before (`own`, the last of the same file system first):
/// that mount's point and the rest of `m`'s root, under the saved root's
/// path (`root`) if it has one of its own. `None` for a file system with
/// one instance per namespace (a sysfs, an mqueue...: each mount of it is
/// made again from nothing), unless only a directory of it is bound.
fn bound_from_own(own: &[MountLine], m: &MountLine, root: Option<&BindMount>) -> Option<String> {
    let single = matches!(
        m.kind.as_str(),
        "sysfs"
            | "mqueue"
            | "cgroup2"
            | "tracefs"
            | "securityfs"
            | "debugfs"
            | "binfmt_misc"
            | "configfs"
            | "fusectl"
            | "pstore"
    );
    if single && m.root == "/" {
        return None;
    }
    own.iter()
        .rev()
        .filter(|o| o.dev == m.dev && o.kind == m.kind)
        .find_map(|o| {
            let rest = if o.root == "/" {
                Some(m.root.as_str())
            } else {
                m.root
                    .strip_prefix(o.root.as_str())
                    .filter(|r| r.is_empty() || r.starts_with('/'))
            }?;
            let rest = if rest == "/" { "" } else { rest };
            let at = if o.at == "/" { "" } else { o.at.as_str() };
            let prefix = root.map_or("", |r| r.source.trim_end_matches('/'));
            let path = format!("{prefix}{at}{rest}");
            Some(if path.is_empty() { "/".into() } else { path })
        })
        .filter(|p| !p.contains(" (deleted)"))
}

/// Where the dumper sees the root of mount `m` (of another mount
/// namespace): under a mount of its own of the same file system whose root
/// holds `m`'s root (`None`: no such mount, or a deleted directory).
fn seen_by_dumper(my_mounts: &[MountLine], m: &MountLine) -> Option<String> {
    my_mounts
        .iter()
        .filter(|h| h.dev == m.dev && h.kind == m.kind)
        .find_map(|h| {
            let rest = if h.root == "/" {
                Some(m.root.as_str())
            } else {
                m.root
                    .strip_prefix(h.root.as_str())
                    .filter(|r| r.is_empty() || r.starts_with('/'))
            }?;
            Some(format!("{}{}", h.at.trim_end_matches('/'), rest))
        })
        .filter(|s| s.starts_with('/') && !s.contains(" (deleted)"))
}

/// File systems made again from nothing at restore (views of the
/// kernel's state, or checked empty by [`check_fresh`]).
const FRESH: [&str; 13] = [
    "sysfs",
    "mqueue",
    "devpts",
    "proc",
    "hugetlbfs",
    "tracefs",
    "securityfs",
    "debugfs",
    "binfmt_misc",
    "configfs",
    "fusectl",
    "pstore",
    "bpf",
];

/// A file system mounted anew at restore holds nothing of its own: a
/// devpts instance's terminals are the pairs the tree holds (saved with
/// their masters, made again from its `ptmx` at their index; one no
/// process of the tree holds is not), and an mqueue's queues are saved
/// with the tree's IPC namespace or with the fds on them; a bpf file
/// system's pinned objects are not saved. (A hugetlbfs holding files is
/// saved with them, not made from nothing.)
fn check_fresh(root: i32, kind: &str, at: &str) -> Result<()> {
    if kind != "bpf" {
        return Ok(());
    }
    if let Some(n) = first_name(root, at)? {
        return Err(refuse(
            root,
            format!(
                "its {kind} mount on {at} holds the pinned BPF object {n}; stasis mounts an empty one again (pinned BPF objects are not saved)"
            ),
        ));
    }
    Ok(())
}

/// The first name in the directory the tree sees at `at` (through
/// `/proc/ROOT/root`), if any.
fn first_name(root: i32, at: &str) -> Result<Option<String>> {
    let dir = format!("/proc/{root}/root{at}");
    Ok(std::fs::read_dir(&dir)
        .map_err(|e| CaptureError::from_proc(root, &format!("root{at}"), e))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next())
}

/// Whether the directory the tree sees at `at` holds nothing.
fn dir_is_empty(root: i32, at: &str) -> Result<bool> {
    first_name(root, at).map(|n| n.is_none())
}

/// `MS_*` flags of per-mount options.
fn mount_flags(opts: &str) -> u64 {
    opts.split(',')
        .map(|o| match o {
            "ro" => libc::MS_RDONLY,
            "nosuid" => libc::MS_NOSUID,
            "nodev" => libc::MS_NODEV,
            "noexec" => libc::MS_NOEXEC,
            "noatime" => libc::MS_NOATIME,
            "nodiratime" => libc::MS_NODIRATIME,
            "relatime" => libc::MS_RELATIME,
            "strictatime" => libc::MS_STRICTATIME,
            _ => 0,
        })
        .fold(0, |a, f| a | f)
}

/// Everything in the tmpfs (or ramfs, or hugetlbfs) mounted on `at` in
/// the mount namespace of `root` (read through `/proc/ROOT/root`),
/// directories before what they hold; a regular file's data goes into
/// the content pack (`w`), extent by extent (holes stay holes), a buffer
/// at a time; on a hugetlbfs, whole huge pages ([`huge_extents`]).
fn tmpfs_entries(root: i32, at: &str, w: &mut ContentWriter) -> Result<Vec<TmpfsEntry>> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let base = std::path::PathBuf::from(format!("/proc/{root}/root{at}"));
    let io = |e: std::io::Error| CaptureError::from_proc(root, &format!("root{at}"), e);
    let mut out = Vec::new();
    let mut queue = vec![String::new()];
    let dev = std::fs::symlink_metadata(&base).map_err(io)?.dev();
    // A hugetlbfs's huge page size (its block size).
    let huge = nix::sys::statfs::statfs(&base)
        .map_err(|e| io(e.into()))
        .map(|s| {
            (s.filesystem_type() == nix::sys::statfs::HUGETLBFS_MAGIC)
                .then(|| u64::try_from(s.block_size()).unwrap_or(0))
                .filter(|&b| b > 0)
        })?;
    while let Some(rel) = queue.pop() {
        let path = if rel.is_empty() {
            base.clone()
        } else {
            base.join(&rel)
        };
        let md = std::fs::symlink_metadata(&path).map_err(io)?;
        let ft = md.file_type();
        if md.dev() != dev {
            // Another mount's root: only its mount point is this tmpfs's
            // (a directory, or an empty file a file is bound on).
            let mode = if ft.is_dir() {
                libc::S_IFDIR | 0o755
            } else {
                libc::S_IFREG | 0o644
            };
            out.push(TmpfsEntry {
                path: rel,
                mode,
                ..Default::default()
            });
            continue;
        }
        let mut rdev = 0;
        let (mut size, mut extents) = (0, Vec::new());
        let data = if ft.is_file() {
            // O_NOATIME (where allowed): reading changes nothing the tree
            // sees.
            let open = |flags| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(flags)
                    .open(&path)
            };
            let f = open(libc::O_NOATIME | libc::O_NOFOLLOW)
                .or_else(|_| open(libc::O_NOFOLLOW))
                .map_err(io)?;
            size = md.len();
            let ranges = match huge {
                Some(page) => huge_extents(&f, size, page).map_err(io)?,
                None => kns_fdops::data_extents(&f, 0, size).map_err(io)?,
            };
            for (a, b) in ranges {
                extents.push(w.copy_extent(&f, &path, a, b - a)?);
            }
            Vec::new()
        } else if ft.is_symlink() {
            std::fs::read_link(&path)
                .map_err(io)?
                .into_os_string()
                .into_encoded_bytes()
        } else if ft.is_dir() {
            let mut names: Vec<String> = std::fs::read_dir(&path)
                .map_err(io)?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            for n in names.into_iter().rev() {
                queue.push(if rel.is_empty() {
                    n
                } else {
                    format!("{rel}/{n}")
                });
            }
            Vec::new()
        } else {
            // A FIFO, a device node, or a socket file (a socket of the
            // tree bound there is bound again over it).
            rdev = md.rdev();
            Vec::new()
        };
        out.push(TmpfsEntry {
            path: rel,
            mode: md.mode(),
            uid: md.uid(),
            gid: md.gid(),
            data,
            size,
            extents,
            rdev,
        });
    }
    Ok(out)
}

/// The data ranges of a hugetlbfs file of `size` bytes and huge pages of
/// `page` bytes: runs of whole pages that are not all zeros (hugetlbfs
/// has no `SEEK_DATA`: every byte is data to `lseek`; `read` gives zeros
/// for a page not there, and a page all zeros is left a hole, which
/// reads the same and takes no page from the pool until touched). The
/// last page of a size that is not a whole number of pages (made by
/// `fallocate`) cannot be mapped, so never written: it is zeros, and left
/// out.
fn huge_extents(f: &std::fs::File, size: u64, page: u64) -> std::io::Result<Vec<(u64, u64)>> {
    use std::os::unix::fs::FileExt;
    const BUF: u64 = 2 << 20;
    let mut buf = vec![0u8; usize::try_from(page.min(BUF)).unwrap_or(2 << 20)];
    let mut out: Vec<(u64, u64)> = Vec::new();
    let whole = size / page * page;
    let mut at = 0;
    while at < whole {
        let mut data = false;
        let mut done = 0;
        while done < page {
            let n = usize::try_from((page - done).min(buf.len() as u64)).unwrap_or(buf.len());
            f.read_exact_at(&mut buf[..n], at + done)?;
            data = buf[..n].iter().any(|&b| b != 0);
            done += n as u64;
            if data {
                break;
            }
        }
        if data {
            match out.last_mut() {
                Some((_, end)) if *end == at => *end = at + page,
                _ => out.push((at, at + page)),
            }
        }
        at += page;
    }
    Ok(out)
}

/// What the restore needs of the tree's namespaces, and its PIDs there.
pub struct NsCapture {
    pub namespaces: Namespaces,
    /// In-namespace PID (and TID) by the one stasis sees; empty without a
    /// PID namespace.
    pub pids: HashMap<i32, i32>,
}

/// Reads the namespaces of the frozen tree (`None`: the dumper's).
/// The data of the files of its tmpfs mounts goes into the content pack
/// (`content`).
pub fn describe(
    root: i32,
    images: &[ProcessImage],
    content: &mut ContentWriter,
) -> Result<Option<NsCapture>> {
    let own = own_kinds(root);
    if own.is_empty() {
        return Ok(None);
    }
    let mut ns = Namespaces {
        user: if own.contains(&NsKind::User) {
            Some(user_namespace(root)?)
        } else {
            None
        },
        pid: own.contains(&NsKind::Pid),
        // The root is not the namespace's init (a job under a container's
        // shell): the restore makes a stand-in init.
        stand_in_init: own.contains(&NsKind::Pid) && kns::pid_in_own_ns(root, root) != Some(1),
        ipc: own.contains(&NsKind::Ipc),
        cgroup: cgroup_of(root),
        cgroup_ns: if own.contains(&NsKind::Cgroup) {
            Some(cgroup_ns_root(root)?)
        } else {
            None
        },
        ..Default::default()
    };
    if own.contains(&NsKind::Uts) {
        let (h, d) = kns::in_namespaces_of(root, &[NsKind::Uts], || {
            nix::sys::utsname::uname().map(|u| {
                (
                    u.nodename().to_string_lossy().into_owned(),
                    u.domainname().to_string_lossy().into_owned(),
                )
            })
        })?
        .map_err(|e| CaptureError::from_proc(root, "ns/uts", e.into()))?;
        // The same names as the dumper's: nothing of its own to restore
        // (the namespace hosts of `scripts/hosts.sh` give each command one
        // named as the host), so it is restored in the dumper's, as before
        // namespaces were saved.
        let mine = nix::sys::utsname::uname().map(|u| {
            (
                u.nodename().to_string_lossy().into_owned(),
                u.domainname().to_string_lossy().into_owned(),
            )
        });
        if mine.ok().as_ref() != Some(&(h.clone(), d.clone())) {
            ns.uts = Some(UtsNamespace {
                hostname: h,
                domainname: d,
            });
        }
    }
    if ns.ipc {
        // Every message queue and semaphore set of the namespace is the
        // tree's (its segments are saved as the processes attach them).
        let (queues, sets) = kns::in_namespaces_of(root, &[NsKind::Ipc], || {
            stasis_objects::sysv_ipc::save(root)
        })??;
        ns.msg_queues = queues;
        ns.sem_sets = sets;
        // And its POSIX message queues (each read and queued again).
        ns.posix_queues = kns::in_namespaces_of(root, &[NsKind::Ipc], || {
            stasis_objects::mqueue::save_namespace(root)
        })??;
    }
    if own.contains(&NsKind::Net) {
        ns.net = Some(net_namespace(root)?);
    }
    if own.contains(&NsKind::Mnt) {
        let m = extra_mounts(root, ns.pid, ns.cgroup_ns.as_deref(), Some(content))?;
        // A copy of the dumper's with nothing of its own (`ip netns exec`
        // gives each command one, with its own /sys): the dumper's, as
        // before namespaces were saved; its restore needs no new one.
        if m.proc
            || m.slave_copies
            || !m.tmpfs.is_empty()
            || !m.binds.is_empty()
            || !m.later.is_empty()
            || m.root.is_some()
        {
            ns.mnt = Some(m);
        }
    }
    if own.contains(&NsKind::Time) {
        ns.time = Some(time_namespace(root, images)?);
    }
    if !ns.pid
        && !ns.ipc
        && ns.time.is_none()
        && ns.user.is_none()
        && ns.uts.is_none()
        && ns.net.is_none()
        && ns.mnt.is_none()
        && ns.cgroup_ns.is_none()
    {
        return Ok(None);
    }
    let mut pids = HashMap::new();
    if ns.pid {
        for p in images {
            let tids = std::iter::once(p.pid).chain(p.threads.iter().map(|t| t.tid));
            for tid in tids {
                let inner = kns::pid_in_own_ns(p.pid, tid).ok_or_else(|| {
                    refuse(
                        p.pid,
                        format!("the PID of its thread {tid} in its PID namespace is unknown (no NSpid in its status)"),
                    )
                })?;
                pids.insert(tid, inner);
            }
        }
    }
    Ok(Some(NsCapture {
        namespaces: ns,
        pids,
    }))
}

/// Gives every PID of the manifest as the tree's PID namespace has it
/// (`pids`); one outside the tree (a parent, session or group outside the
/// namespace) becomes 0, as the namespace sees it.
pub fn translate_pids(m: &mut Manifest, pids: &HashMap<i32, i32>) {
    let map = |p: &mut i32| {
        if *p > 0 {
            *p = pids.get(p).copied().unwrap_or(0);
        }
    };
    map(&mut m.root_pid);
    for c in m.cgroups.iter_mut().flat_map(|c| c.procs.iter_mut()) {
        map(&mut c.pid);
    }
    for t in m.cgroups.iter_mut().flat_map(|c| c.threads.iter_mut()) {
        map(&mut t.tid);
    }
    for p in &mut m.processes {
        map(&mut p.pid);
        map(&mut p.ppid);
        map(&mut p.pgid);
        map(&mut p.sid);
        if let Some(w) = &mut p.fds_shared_with {
            map(w);
        }
        for t in &mut p.threads {
            map(&mut t.tid);
        }
        for t in &mut p.posix_timers {
            map(&mut t.tid);
        }
        for f in &mut p.fds {
            if let Some(o) = &mut f.owner {
                // A negative owner is a process group.
                let mut g = o.pid.abs();
                map(&mut g);
                o.pid = if o.pid < 0 { -g } else { g };
            }
            match &mut f.kind {
                FdKind::Pidfd { pid, .. } => map(pid),
                FdKind::PtyMaster(pair) => {
                    if let Some(s) = &mut pair.session {
                        map(&mut s.sid);
                        map(&mut s.foreground);
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_device_root_point_type_and_options() {
        let info = "22 1 0:5 / /proc rw,nosuid - proc proc rw\n\
                    30 22 0:40 / /mnt rw,nosuid,nodev - tmpfs t rw,size=1024k,mode=755\n";
        let m = mounts(info);
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].key(), ("0:40".into(), "/".into(), "/mnt".into()));
        assert_eq!(m[1].kind, "tmpfs");
        assert_eq!(m[1].super_opts, "rw,size=1024k,mode=755");
        assert_eq!(
            mount_flags(&m[1].mount_opts),
            libc::MS_NOSUID | libc::MS_NODEV
        );
        assert_ne!(m[0].key(), m[1].key());
        assert_eq!(
            (m[1].propagation, m[1].shared, m[1].master),
            (0, None, None)
        );
    }

    #[test]
    fn mountinfo_optional_fields_give_the_propagation_and_peer_groups() {
        let info = "40 30 0:50 / /a rw shared:7 - ramfs r rw\n\
                    41 30 0:50 /d /b rw shared:9 master:7 - ramfs r rw\n\
                    42 30 0:51 / /c rw unbindable - tmpfs t rw\n";
        let m = mounts(info);
        assert_eq!(
            (m[0].propagation, m[0].shared, m[0].master),
            (libc::MS_SHARED, Some(7), None)
        );
        assert_eq!(
            (m[1].propagation, m[1].shared, m[1].master),
            (libc::MS_SHARED | libc::MS_SLAVE, Some(9), Some(7))
        );
        assert_eq!(m[2].propagation, libc::MS_UNBINDABLE);
        // /b is a bind of a directory of /a (saved before): bound from it.
        assert_eq!(
            bound_from_own(&m[..1], &m[1], None).as_deref(),
            Some("/a/d")
        );
        let root = BindMount {
            source: "/srv/root/".into(),
            target: "/".into(),
            flags: 0,
        };
        assert_eq!(
            bound_from_own(&m[..1], &m[1], Some(&root)).as_deref(),
            Some("/srv/root/a/d")
        );
        // Not from a mount of another file system.
        assert_eq!(bound_from_own(&m[2..], &m[1], None), None);
    }
}
