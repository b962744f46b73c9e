//! `stasis_request_checkpoint`: the job's side of `stasis run`'s request
//! channel. The protocol is specified with its other side, in
//! `stasis_supervise::request` (crates/stasis-supervise/src/request.rs);
//! the wire words are repeated here because libstasis does not link the
//! supervisor.
//!
//! Each call makes its own datagram socket, bound to a fresh abstract name
//! and connected to the path in `STASIS_RUN_REQUEST`, sends the request
//! with an id, and polls for the answer every [`POLL`], sending the same
//! request again every [`RESEND`] (a requester frozen by another
//! checkpoint and restored from it is then served as new). Nothing stays open between calls, so a restored
//! program has no stale connection: a call interrupted by the checkpoint it
//! asked for is rebuilt by the restore (same name, reconnected by path) and
//! answered `restored`; later calls connect afresh.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{AppError, Result};

/// The environment variable `stasis run` gives its job.
pub const ENV: &str = "STASIS_RUN_REQUEST";
const REQUEST: &str = "stasis-request 1 checkpoint";
/// How often the socket is looked at while waiting.
pub const POLL: Duration = Duration::from_millis(5);
/// How often the request is sent again while waiting.
pub const RESEND: Duration = Duration::from_secs(1);

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requested {
    /// Checkpoint `N` is committed; the program simply goes on.
    Committed(u32),
    /// The program was restored from checkpoint `N`, which this call took.
    Restored(u32),
}

/// A datagram socket bound to an abstract name of its own.
fn bound_socket() -> Result<(UnixDatagram, u64)> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("stasis-req.{}.{n}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(AppError::io("naming the request socket", name.clone()))?;
        match UnixDatagram::bind_addr(&addr) {
            Ok(s) => return Ok((s, n)),
            // A name left bound by a process restored with our pid.
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {}
            Err(e) => return Err(AppError::io("binding the request socket", name)(e)),
        }
    }
}

/// Asks the surrounding `stasis run` for a checkpoint and waits for it.
pub fn request_checkpoint() -> Result<Requested> {
    let Some(path) = std::env::var_os(ENV) else {
        return Err(AppError::NotUnderRun);
    };
    let (sock, seq) = bound_socket()?;
    sock.connect(&path).map_err(|e| {
        AppError::RequestFailed(format!(
            "cannot reach `stasis run` at {}: {e}",
            path.to_string_lossy()
        ))
    })?;
    sock.set_nonblocking(true)
        .map_err(AppError::io("setting up the request socket for", &path))?;
    // Unique among the requests `stasis run` sees (pid, call, time).
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let id = xxhash_rust::xxh3::xxh3_64(format!("{}.{seq}.{t}", std::process::id()).as_bytes());
    let msg = format!("{REQUEST} {id:x}");
    let send = || match sock.send(msg.as_bytes()) {
        // Its queue is full: the next resend tries again.
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        r => r.map(|_| ()),
    };
    send().map_err(AppError::io("sending the checkpoint request to", &path))?;
    let mut sent = Instant::now();
    let mut buf = [0u8; 512];
    let len = loop {
        match sock.recv(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if sent.elapsed() >= RESEND {
                    send().map_err(AppError::io("sending the checkpoint request to", &path))?;
                    sent = Instant::now();
                }
                std::thread::sleep(POLL);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(AppError::io("waiting for the checkpoint on", &path)(e)),
        }
    };
    decode(&buf[..len])
}

/// The answer datagram.
fn decode(b: &[u8]) -> Result<Requested> {
    let s = String::from_utf8_lossy(b);
    let (word, rest) = s.split_once(' ').unwrap_or((&s, ""));
    let n = || {
        rest.parse::<u32>()
            .map_err(|_| AppError::Internal(format!("`stasis run` answered {s:?}")))
    };
    match word {
        "ok" => Ok(Requested::Committed(n()?)),
        "restored" => Ok(Requested::Restored(n()?)),
        "failed" => Err(AppError::RequestFailed(rest.to_string())),
        _ => Err(AppError::Internal(format!("`stasis run` answered {s:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        assert_eq!(decode(b"ok 4").unwrap(), Requested::Committed(4));
        assert_eq!(decode(b"restored 4").unwrap(), Requested::Restored(4));
        assert!(matches!(
            decode(b"failed no space"),
            Err(AppError::RequestFailed(m)) if m == "no space"
        ));
        assert!(matches!(decode(b"ok"), Err(AppError::Internal(_))));
    }
}
