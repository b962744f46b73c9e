//! Hand-made TCP segments delivered to a local socket through a raw
//! socket (needs CAP_NET_RAW): how a connection rebuilt in repair mode is
//! given the FIN (or the ack of its own FIN) it had received before the
//! checkpoint, which no peer will send again.

use crate::{KernelError, Result};

/// One TCP segment without payload or options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub seq: u32,
    pub ack: u32,
    /// `TH_*` flags.
    pub flags: u8,
    pub window: u16,
}

/// The IP addresses and ports of a raw `sockaddr_in`/`sockaddr_in6`
/// (an IPv4-mapped IPv6 address is IPv4: that is what goes on the wire).
#[derive(Debug, PartialEq, Eq)]
struct Ends {
    ip: Vec<u8>,
    port: [u8; 2],
}

fn ends(addr: &[u8]) -> Option<Ends> {
    let port = [*addr.get(2)?, *addr.get(3)?];
    let family = i32::from(u16::from_ne_bytes([*addr.first()?, *addr.get(1)?]));
    let ip = if family == libc::AF_INET {
        addr.get(4..8)?.to_vec()
    } else {
        let v6 = addr.get(8..24)?;
        if v6[..10].iter().all(|b| *b == 0) && v6[10..12] == [0xff, 0xff] {
            v6[12..].to_vec()
        } else {
            v6.to_vec()
        }
    };
    Some(Ends { ip, port })
}

/// The internet checksum of `parts` concatenated.
fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    let all: Vec<u8> = parts.concat();
    for c in all.chunks(2) {
        let w = u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]);
        sum = sum.wrapping_add(u32::from(w));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !u16::try_from(sum).unwrap_or(0xffff)
}

/// The bytes of the IP packet carrying `seg` from `from` to `to`.
fn build(from: &Ends, to: &Ends, seg: Segment) -> Vec<u8> {
    let mut tcp = Vec::with_capacity(20);
    tcp.extend_from_slice(&from.port);
    tcp.extend_from_slice(&to.port);
    tcp.extend_from_slice(&seg.seq.to_be_bytes());
    tcp.extend_from_slice(&seg.ack.to_be_bytes());
    tcp.extend_from_slice(&[5 << 4, seg.flags]);
    tcp.extend_from_slice(&seg.window.to_be_bytes());
    tcp.extend_from_slice(&[0, 0, 0, 0]);
    let len = [0, 20];
    let v4 = from.ip.len() == 4;
    let pseudo: Vec<u8> = if v4 {
        [&from.ip[..], &to.ip[..], &[0, 6], &len].concat()
    } else {
        [&from.ip[..], &to.ip[..], &[0, 0], &len, &[0, 0, 0, 6]].concat()
    };
    let sum = checksum(&[&pseudo, &tcp]);
    tcp[16..18].copy_from_slice(&sum.to_be_bytes());
    let mut p = Vec::with_capacity(60);
    if v4 {
        // Version 4, 20-byte header, length 40, DF, TTL 64, TCP; the
        // kernel fills in the id and header checksum (IP_HDRINCL).
        p.extend_from_slice(&[0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0]);
    } else {
        // Version 6, payload 20 bytes, next header TCP, hop limit 64.
        p.extend_from_slice(&[0x60, 0, 0, 0, 0, 20, 6, 64]);
    }
    p.extend_from_slice(&from.ip);
    p.extend_from_slice(&to.ip);
    p.extend_from_slice(&tcp);
    p
}

/// Delivers `seg` to the local TCP socket at `to` as if `from` (its
/// peer) had sent it. Both are raw socket addresses of one family.
pub fn inject_tcp(from: &[u8], to: &[u8], seg: Segment) -> Result<()> {
    let bad = || {
        KernelError::io(
            "a TCP segment's addresses",
            std::io::Error::other("not an inet address pair"),
        )
    };
    let (Some(f), Some(t)) = (ends(from), ends(to)) else {
        return Err(bad());
    };
    if f.ip.len() != t.ip.len() {
        return Err(bad());
    }
    let p = build(&f, &t, seg);
    let (family, dst) = if t.ip.len() == 4 {
        let mut d = vec![0u8; 16];
        d[..2].copy_from_slice(&u16::try_from(libc::AF_INET).unwrap_or(2).to_ne_bytes());
        d[4..8].copy_from_slice(&t.ip);
        (libc::AF_INET, d)
    } else {
        let mut d = vec![0u8; 28];
        d[..2].copy_from_slice(&u16::try_from(libc::AF_INET6).unwrap_or(10).to_ne_bytes());
        d[8..24].copy_from_slice(&t.ip);
        (libc::AF_INET6, d)
    };
    // IPPROTO_RAW implies a header of our own, for IPv6 too.
    super::send_raw(family, &p, &dst, "a TCP segment")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(ip: [u8; 4], port: u16) -> Vec<u8> {
        let mut a = vec![0u8; 16];
        a[..2].copy_from_slice(&2u16.to_ne_bytes());
        a[2..4].copy_from_slice(&port.to_be_bytes());
        a[4..8].copy_from_slice(&ip);
        a
    }

    #[test]
    fn mapped_v6_addresses_are_v4_on_the_wire() {
        let mut a = vec![0u8; 28];
        a[..2].copy_from_slice(&10u16.to_ne_bytes());
        a[2..4].copy_from_slice(&80u16.to_be_bytes());
        a[18..20].copy_from_slice(&[0xff, 0xff]);
        a[20..24].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(ends(&a), ends(&v4([127, 0, 0, 1], 80)));
    }

    #[test]
    fn the_tcp_checksum_verifies() {
        let (f, t) = (
            ends(&v4([127, 0, 0, 1], 1000)).unwrap(),
            ends(&v4([127, 0, 0, 2], 2000)).unwrap(),
        );
        let seg = Segment {
            seq: 7,
            ack: 9,
            flags: 0x11,
            window: 512,
        };
        let p = build(&f, &t, seg);
        assert_eq!(p.len(), 40);
        assert_eq!(p[20 + 13], 0x11);
        // Summing the pseudo-header and the segment with its checksum gives 0.
        let pseudo = [&f.ip[..], &t.ip[..], &[0, 6, 0, 20]].concat();
        assert_eq!(checksum(&[&pseudo, &p[20..]]), 0);
    }
}
