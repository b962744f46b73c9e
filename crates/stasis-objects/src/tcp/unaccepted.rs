//! TCP connections waiting in a listener's accept queue, from a client of
//! the tree that has had nothing acknowledged yet (it connected, and sent
//! nothing or only bytes still unacknowledged).
//!
//! The server side of such a connection is a socket no file refers to yet:
//! only `accept` reaches it, and what it holds cannot be read or rebuilt in
//! repair mode. When its client is in the tree and the server side holds
//! no byte of it (the client's `tcpi_bytes_acked` counts the SYN alone),
//! nothing of the
//! server side needs saving: the client is saved as
//! [`InetState::Unaccepted`] with the bytes it has queued, and the restore
//! connects it again, for real, to the restored listener once every socket
//! exists ([`RestoreCtx::finish_tcp`]), then queues those bytes: the
//! listener has the connection waiting again, with the same client address
//! and data. The dump does not wait for the program to accept those
//! (see `crate::socket::transient_socket`). Other waiting connections (from
//! outside the tree, or whose server side holds data) are still waited
//! for and refused (or left out with `--skip-in-flight`).

use std::os::fd::{AsFd, OwnedFd};

use stasis_image::manifest::InetSocket;
use stasis_kernel::sock;
use stasis_kernel::tcpdiag::{self, DiagAddr};
use stasis_sys::net::TCP_ESTABLISHED;

use crate::socket::{each_socket, is_inet};
use crate::{RestoreError, SaveCtx};

/// The tree's established TCP connections that have had nothing
/// acknowledged: (local, peer).
pub(crate) fn quiet_clients(
    census: Option<&crate::fd_census::FdCensus>,
    pids: &[i32],
) -> Vec<(DiagAddr, DiagAddr)> {
    let mut out = Vec::new();
    each_socket(census, pids, |_, _, _, b| {
        if !is_inet(b, libc::IPPROTO_TCP)
            || !sock::tcp_info(b)
                .is_ok_and(|i| i.state == TCP_ESTABLISHED && nothing_acked(i.bytes_acked))
        {
            return;
        }
        let local = sock::local_addr(b)
            .ok()
            .and_then(|a| DiagAddr::from_raw(&a));
        let peer = sock::peer_addr(b).ok().and_then(|a| DiagAddr::from_raw(&a));
        if let (Some(l), Some(p)) = (local, peer) {
            out.push((l, p));
        }
    });
    out
}

/// Whether a connection's `tcpi_bytes_acked` says the peer acknowledged
/// no data: the handshake's SYN, which it counts, at most.
pub(crate) fn nothing_acked(bytes_acked: u64) -> bool {
    bytes_acked <= 1
}

/// How many of the connections waiting in the accept queue of the listener
/// bound to `local` (raw address) come from `clients`.
pub(crate) fn waiting_from(local: &[u8], clients: &[(DiagAddr, DiagAddr)]) -> usize {
    let Some(l) = DiagAddr::from_raw(local) else {
        return 0;
    };
    tcpdiag::waiting_clients(l).map_or(0, |waiting| {
        waiting
            .iter()
            .filter(|w| clients.iter().any(|(c, p)| c == *w && p.port == l.port))
            .count()
    })
}

impl SaveCtx {
    /// Whether the tree's connection from `local` to `peer` (raw
    /// addresses), with nothing acknowledged, waits at its peer to be
    /// accepted. The connections waiting in accept queues are listed once
    /// per dump and family (each listing walks the kernel's whole
    /// established table).
    pub(crate) fn waits(&mut self, local: &[u8], peer: &[u8]) -> bool {
        let (Some(l), Some(p)) = (DiagAddr::from_raw(local), DiagAddr::from_raw(peer)) else {
            return false;
        };
        let waiting = self
            .waiting_accept
            .entry(l.family)
            .or_insert_with(|| tcpdiag::waiting_to_be_accepted(l.family).unwrap_or_default());
        waiting
            .iter()
            .any(|(server, client)| *server == p && *client == l)
    }

    /// The tree's quiet clients ([`quiet_clients`]), once per dump.
    pub(crate) fn quiet_clients(&mut self) -> &[(DiagAddr, DiagAddr)] {
        if self.quiet_clients.is_none() {
            self.quiet_clients = Some(quiet_clients(self.fd_census.as_ref(), &self.tree_pids));
        }
        self.quiet_clients.as_deref().unwrap_or(&[])
    }
}

/// A client of the tree to connect again once every socket exists, and
/// the bytes it had queued.
pub struct PendingConnect {
    pub(crate) fd: i32,
    pub(crate) sock: OwnedFd,
    pub(crate) socket: InetSocket,
    pub(crate) queued: Vec<u8>,
}

/// How long a restore waits for one such connect.
const CONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl PendingConnect {
    /// Connects (blocking, for [`CONNECT_WAIT`] at most: the listener is
    /// restored, or on another host), then queues the bytes; the socket's
    /// own flags and send timeout are put back after. The address pair
    /// may still be held by the killed tree's socket: taken over or
    /// closed first, as for a rebuilt connection. Returns the holders.
    pub(crate) fn connect(self) -> Result<Vec<i32>, RestoreError> {
        let b = self.sock.as_fd();
        let fd = self.fd;
        let step = |w: &str| {
            let what = format!("{w} (fd {fd}, a connection that was waiting to be accepted)");
            move |e: std::io::Error| RestoreError::Socket { what, source: e }
        };
        let flags = stasis_kernel::fdops::status_flags(b).map_err(step("reading its flags"))?;
        stasis_kernel::fdops::set_status_flags(b, flags & !libc::O_NONBLOCK)
            .map_err(step("making it blocking"))?;
        // (A blocking connect waits for SO_SNDTIMEO: a struct timeval.)
        let timeo = sock::get_bytes(b, libc::SOL_SOCKET, libc::SO_SNDTIMEO, 16).ok();
        let wait = [CONNECT_WAIT.as_secs().to_ne_bytes(), 0u64.to_ne_bytes()].concat();
        let _ = sock::set_bytes(b, libc::SOL_SOCKET, libc::SO_SNDTIMEO, &wait);
        let mut holders = Vec::new();
        let r = super::repair::reconnect(fd, b, &self.socket, &mut holders);
        if let Some(t) = &timeo {
            let _ = sock::set_bytes(b, libc::SOL_SOCKET, libc::SO_SNDTIMEO, t);
        }
        let queued = r.and_then(|()| {
            super::repair::send_waiting(&self.sock, &self.queued).map_err(|e| RestoreError::Step {
                what: format!("queueing the bytes of fd {fd} again"),
                source: e,
            })
        });
        stasis_kernel::fdops::set_status_flags(b, flags).map_err(step("putting its flags back"))?;
        queued.map(|()| holders)
    }
}
