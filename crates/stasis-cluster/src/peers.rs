//! Before a round: the TCP connections of a host's trees whose other end
//! is not part of the job. Such a connection would be restored on this
//! side only (its peer knows nothing of the restore and resets it), so the
//! round is refused at once, naming the connection and its peer.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use stasis_kernel::procfs::net::{socket_inode, tcp_table, TcpEntry};

use crate::ClusterError;

/// `TCP_ESTABLISHED` in `/proc/net/tcp`.
const ESTABLISHED: u8 = 1;

/// One line per established connection of the trees rooted at `roots`
/// whose peer is outside the job: neither a socket of these trees on this
/// host, nor on one of `job_hosts` (the addresses of the job's hosts).
pub fn outside_peers(roots: &[i32], job_hosts: &[IpAddr]) -> Result<Vec<String>, ClusterError> {
    let Some(&first) = roots.first() else {
        return Ok(Vec::new());
    };
    let pids = stasis_kernel::procfs::tree_pids(roots);
    let ours = socket_inodes(&pids);
    // The table is read through any process of the trees (they share the
    // host's network namespace): one that is exiting has none left to
    // show, and the round must not fail for that.
    let e = match tcp_table(first) {
        Ok(table) => return Ok(judge(&table, &ours, job_hosts)),
        Err(e) => e,
    };
    for &other in roots.iter().chain(&pids).filter(|&&o| o != first) {
        if let Ok(table) = tcp_table(other) {
            return Ok(judge(&table, &ours, job_hosts));
        }
    }
    let cause = std::error::Error::source(&e)
        .map(|c| format!(": {c}"))
        .unwrap_or_default();
    Err(ClusterError::Refused(format!(
        "cannot list the TCP connections of process {first} (nor through any other process of the job on this host): {e}{cause}"
    )))
}

/// The decision, over a TCP table and the tree's socket inodes (with the
/// process and fd of each).
fn judge(table: &[TcpEntry], ours: &HashMap<u64, (i32, i32)>, job_hosts: &[IpAddr]) -> Vec<String> {
    let mut bad = Vec::new();
    for e in table.iter().filter(|e| e.state == ESTABLISHED) {
        let Some(&(pid, fd)) = ours.get(&e.inode) else {
            continue;
        };
        // The other end on this host: it must be one of ours (an IPv6
        // socket shows an IPv4 peer as ::ffff:a.b.c.d).
        let here = table
            .iter()
            .find(|p| canon(p.local) == canon(e.remote) && canon(p.remote) == canon(e.local));
        let why = match here {
            Some(p) if ours.contains_key(&p.inode) => continue,
            Some(p) if p.inode == 0 => "a closing socket of no process on this host".to_string(),
            Some(_) => "a process of this host outside the job's trees".to_string(),
            None if job_hosts.contains(&canon(e.remote).ip()) => continue,
            None if canon(e.remote).ip().is_loopback() => {
                "gone (a loopback peer without a socket)".to_string()
            }
            None => format!(
                "on a host outside the job (its hosts: {})",
                job_hosts
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        bad.push(format!(
            "process {pid} fd {fd}: TCP connection {} -> {}: the peer is {why}; checkpoint the peer's tree in the same job, or close the connection first",
            e.local, e.remote
        ));
    }
    bad
}

/// An IPv4-mapped IPv6 address as the IPv4 one.
fn canon(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

/// The socket inodes of `pids`, with the process and fd holding each.
fn socket_inodes(pids: &[i32]) -> HashMap<u64, (i32, i32)> {
    let mut out = HashMap::new();
    for &pid in pids {
        let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for e in rd.filter_map(Result::ok) {
            let Some(fd) = e.file_name().to_str().and_then(|f| f.parse().ok()) else {
                continue;
            };
            let Ok(link) = std::fs::read_link(e.path()) else {
                continue;
            };
            if let Some(ino) = link.to_str().and_then(socket_inode) {
                out.entry(ino).or_insert((pid, fd));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process of the job that is exiting (a zombie has no network
    /// namespace left to read the table through) does not fail the check:
    /// another process of the job is used. With none left, the error says
    /// why.
    #[test]
    fn an_exiting_root_does_not_fail_the_check() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let zombie = i32::try_from(child.id()).unwrap();
        let net_tcp = format!("/proc/{zombie}/net/tcp");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::fs::read_to_string(&net_tcp).is_ok() {
            assert!(std::time::Instant::now() < deadline, "`true` did not exit");
            std::thread::yield_now();
        }
        // The other process of the job: one with no TCP connection (not
        // this test process, whose other tests open and close loopback
        // connections meanwhile).
        let mut other = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let alive = i32::try_from(other.id()).unwrap();
        // (Once it is sleep: before its exec, a fork holds our sockets.)
        while !std::fs::read_link(format!("/proc/{alive}/exe"))
            .is_ok_and(|e| e.to_string_lossy().ends_with("/sleep"))
        {
            assert!(std::time::Instant::now() < deadline, "sleep did not start");
            std::thread::yield_now();
        }
        assert_eq!(
            outside_peers(&[zombie, alive], &[]).unwrap(),
            Vec::<String>::new()
        );
        other.kill().unwrap();
        other.wait().unwrap();
        let err = outside_peers(&[zombie], &[]).unwrap_err().to_string();
        assert!(err.contains(&format!("process {zombie}")), "{err}");
        assert!(err.contains("No such file"), "{err}");
        child.wait().unwrap();
    }

    fn e(local: &str, remote: &str, inode: u64) -> TcpEntry {
        TcpEntry {
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            state: ESTABLISHED,
            inode,
        }
    }

    #[test]
    fn peers_in_the_trees_or_on_job_hosts_pass_and_the_others_are_named() {
        let table = vec![
            // Loopback, both ends ours.
            e("127.0.0.1:5000", "127.0.0.1:6000", 1),
            e("127.0.0.1:6000", "127.0.0.1:5000", 2),
            // To another host of the job.
            e("10.0.0.1:7000", "10.0.0.2:7411", 3),
            // Loopback to a process outside the trees.
            e("127.0.0.1:5001", "127.0.0.1:6379", 4),
            e("127.0.0.1:6379", "127.0.0.1:5001", 99),
            // To a host outside the job.
            e("10.0.0.1:7001", "192.0.2.7:443", 5),
            // Accepted on an IPv6 listener from a job host, and from
            // ourselves over loopback.
            e("[::ffff:10.0.0.1]:7411", "[::ffff:10.0.0.2]:5555", 6),
            e("[::ffff:127.0.0.1]:7412", "[::ffff:127.0.0.1]:5556", 7),
            e("127.0.0.1:5556", "127.0.0.1:7412", 8),
        ];
        let ours: HashMap<u64, (i32, i32)> = [
            (1, (10, 3)),
            (2, (11, 4)),
            (3, (10, 5)),
            (4, (10, 6)),
            (5, (12, 7)),
        ]
        .into_iter()
        .collect();
        let hosts: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        let bad = judge(&table, &ours, &hosts);
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(
            bad[0].contains("process 10 fd 6") && bad[0].contains("127.0.0.1:6379"),
            "{}",
            bad[0]
        );
        assert!(bad[0].contains("outside the job's trees"), "{}", bad[0]);
        assert!(
            bad[1].contains("process 12 fd 7") && bad[1].contains("192.0.2.7:443"),
            "{}",
            bad[1]
        );
        assert!(bad[1].contains("10.0.0.1, 10.0.0.2"), "{}", bad[1]);
    }
}
