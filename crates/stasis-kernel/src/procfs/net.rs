//! `/proc/PID/net/tcp` and `tcp6`: the TCP sockets of a network namespace
//! (the one `PID` is in), with their addresses, state and inode.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::FormatError;

/// One line of `/proc/PID/net/tcp{,6}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpEntry {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// `TCP_ESTABLISHED` is 1, `TCP_LISTEN` 10.
    pub state: u8,
    /// 0 for a socket no file holds (an orphan, a TIME_WAIT).
    pub inode: u64,
}

/// The inode of a socket from its fd link (`socket:[N]`).
pub fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")
        .and_then(|r| r.strip_suffix(']'))
        .and_then(|n| n.parse::<u64>().ok())
}

/// The TCP sockets (IPv4 and IPv6) of the network namespace of `pid`.
pub fn tcp_table(pid: i32) -> Result<Vec<TcpEntry>, super::ReadError> {
    let mut out = Vec::new();
    for name in ["net/tcp", "net/tcp6"] {
        match super::read_parsed(pid, name, parse_tcp) {
            Ok(v) => out.extend(v),
            // A kernel without IPv6 has no tcp6.
            Err(super::ReadError::Io { source, .. })
                if name == "net/tcp6" && source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Parses the text of `/proc/net/tcp` or `tcp6`.
pub fn parse_tcp(text: &str) -> Result<Vec<TcpEntry>, FormatError> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            return Err(format!("a short line in net/tcp: {line:?}").into());
        }
        let state = u8::from_str_radix(f[3], 16)
            .map_err(|_| FormatError(format!("bad state in {line:?}")))?;
        let inode = f[9]
            .parse()
            .map_err(|_| FormatError(format!("bad inode in {line:?}")))?;
        out.push(TcpEntry {
            local: addr(f[1])?,
            remote: addr(f[2])?,
            state,
            inode,
        });
    }
    Ok(out)
}

/// `HEX:PORT`: an IPv4 address as one native-endian 32-bit word, an IPv6
/// one as four.
fn addr(s: &str) -> Result<SocketAddr, FormatError> {
    let bad = || FormatError(format!("bad address {s:?} in net/tcp"));
    let (ip, port) = s.split_once(':').ok_or_else(bad)?;
    let port = u16::from_str_radix(port, 16).map_err(|_| bad())?;
    let word = |i: usize| -> Result<[u8; 4], FormatError> {
        let w = u32::from_str_radix(ip.get(8 * i..8 * i + 8).ok_or_else(bad)?, 16)
            .map_err(|_| bad())?;
        Ok(w.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[4 * i..4 * i + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return Err(bad()),
    };
    Ok(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_links_give_their_inode() {
        assert_eq!(socket_inode("socket:[12345]"), Some(12345));
        assert_eq!(socket_inode("pipe:[12345]"), None);
        assert_eq!(socket_inode("socket:[x]"), None);
    }

    #[test]
    fn lines_of_both_families_parse() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 20 4 30 10 -1
   1: 00000000:1CF2 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0
";
        let t = parse_tcp(v4).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].local, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(t[0].remote, "127.0.0.1:50000".parse().unwrap());
        assert_eq!((t[0].state, t[0].inode), (1, 12345));
        assert_eq!((t[1].state, t[1].inode), (10, 777));
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:C350 01 00000000:00000000 00:00000000 00000000     0        0 99 1 0000000000000000 20 4 30 10 -1
";
        let t = parse_tcp(v6).unwrap();
        assert_eq!(t[0].local, "[::1]:8080".parse().unwrap());
        assert!(parse_tcp("header\n 0: zz:1 00:0 01 x x x x x 1\n").is_err());
        assert!(parse_tcp("header\n short line\n").is_err());
    }

    /// The table of this process's namespace lists a connection it holds.
    #[test]
    fn a_live_connection_is_listed_with_its_inode() {
        use std::os::unix::fs::MetadataExt;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&c);
        let ino = std::fs::metadata(format!("/proc/self/fd/{fd}"))
            .unwrap()
            .ino();
        let t = tcp_table(i32::try_from(std::process::id()).unwrap()).unwrap();
        let e = t.iter().find(|e| e.inode == ino).expect("our socket");
        assert_eq!(e.local, c.local_addr().unwrap());
        assert_eq!(e.remote, l.local_addr().unwrap());
        assert_eq!(e.state, 1);
    }
}
