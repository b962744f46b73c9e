//! The request channel of `stasis run`: how a job asks for a transparent
//! checkpoint now (`stasis_request_checkpoint()` in libstasis).
//!
//! # Protocol
//!
//! - `stasis run` binds a `SOCK_DGRAM` unix socket `request.sock` (mode
//!   0600) in a directory of its own (mode 0700, removed when it ends) and
//!   gives the job its path in the environment variable [`ENV`]
//!   (`STASIS_RUN_REQUEST`). Outside `stasis run` the variable is unset
//!   and the library answers `STASIS_ERR_NOT_UNDER_RUN` itself.
//! - The requester makes a datagram socket **bound to an abstract name**
//!   (so that it can be answered, and so that a restore binds it again),
//!   connects it to that path and sends one datagram, [`REQUEST`] followed
//!   by a space and an id of its own in hex (`stasis-request 1 checkpoint
//!   5f3a...`: the protocol version is the `1`).
//! - It then polls its socket (non-blocking, every few milliseconds) for
//!   one answer datagram, and sends the same request again every second
//!   until one comes. `stasis run` ignores an id it has seen since the job
//!   last started or was restored, so a request is served once however
//!   long its checkpoint takes. The answers:
//!   - `ok N`: checkpoint `N` is committed. It is sent after the dump
//!     returned, so after the job was thawed (a concurrent dump thaws it
//!     before it copies): the datagram waits in the requester's queue and
//!     is never part of the image.
//!   - `restored N`: the job was restored from checkpoint `N`, which it was
//!     in the middle of this call. The dump froze the requester while it
//!     waited; the restore rebuilt its socket (bound to the same abstract
//!     name, reconnected to `request.sock` by name); `stasis run` sends
//!     this answer to the recorded name after every restore of `N`, and
//!     counts its id as seen in the new run.
//!   - `failed MESSAGE`: the checkpoint failed (the job runs on), or the
//!     request was not understood.
//! - A restore forgets the ids seen: a requester frozen by some other
//!   checkpoint (a periodic one taken while it waited) and restored from
//!   it sends its request again a second later, and is served as new.
//! - Requests that arrive together (threads of the job asking at once) are
//!   served by one checkpoint. A requester whose socket has no name cannot
//!   be answered and is ignored.
//!
//! Only the same user can reach the socket (0600 in a 0700 directory);
//! the requests carry no other authority than "checkpoint me now".

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The environment variable that gives the job the socket's path.
pub const ENV: &str = "STASIS_RUN_REQUEST";
/// The one request of protocol version 1 (then a space and the id).
pub const REQUEST: &[u8] = b"stasis-request 1 checkpoint";

/// What a requester is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Checkpoint `N` is committed.
    Committed(u32),
    /// The job was restored from checkpoint `N`, taken at its request.
    Restored(u32),
    /// The checkpoint failed, with why.
    Failed(String),
}

impl Answer {
    /// The answer datagram.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Answer::Committed(n) => format!("ok {n}"),
            Answer::Restored(n) => format!("restored {n}"),
            Answer::Failed(why) => format!("failed {why}"),
        }
        .into_bytes()
    }

    /// An answer datagram read back (`None`: not one).
    pub fn decode(b: &[u8]) -> Option<Answer> {
        let s = std::str::from_utf8(b).ok()?;
        let (word, rest) = s.split_once(' ').unwrap_or((s, ""));
        match word {
            "ok" => rest.parse().ok().map(Answer::Committed),
            "restored" => rest.parse().ok().map(Answer::Restored),
            "failed" => Some(Answer::Failed(rest.to_string())),
            _ => None,
        }
    }
}

/// Who asked: the name to answer to, and the request's id.
#[derive(Debug, Clone)]
pub struct Requester(SocketAddr, u64);

/// The id of a request datagram (`None`: not a request).
fn request_id(msg: &[u8]) -> Option<u64> {
    let rest = msg.strip_prefix(REQUEST)?.strip_prefix(b" ")?;
    u64::from_str_radix(std::str::from_utf8(rest).ok()?, 16).ok()
}

/// The channel's socket and its private directory.
#[derive(Debug)]
pub struct Channel {
    sock: UnixDatagram,
    path: PathBuf,
    /// Ids of the requests seen since the job started or was restored.
    seen: HashSet<u64>,
    _dir: tempfile::TempDir,
}

impl Channel {
    /// Makes the private directory and binds the socket in it.
    pub fn open() -> io::Result<Channel> {
        // tempfile makes the directory 0700 with a fresh name.
        let dir = tempfile::Builder::new().prefix("stasis-run.").tempdir()?;
        let path = dir.path().join("request.sock");
        let sock = UnixDatagram::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        Ok(Channel {
            sock,
            path,
            seen: HashSet::new(),
            _dir: dir,
        })
    }

    /// The socket's path, for [`ENV`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits up to `timeout` for requests and returns every one that came
    /// (none when the time passed). Malformed requests are answered
    /// `failed` at once and not returned.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<Vec<Requester>> {
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        self.sock.set_nonblocking(false)?;
        self.sock
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        loop {
            match self.sock.recv_from(&mut buf) {
                Ok((len, from)) => self.take(&buf[..len], from, &mut got),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(got)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            // Take what else is queued without waiting.
            self.sock.set_nonblocking(true)?;
        }
    }

    fn take(&mut self, msg: &[u8], from: SocketAddr, got: &mut Vec<Requester>) {
        if from.is_unnamed() {
            return;
        }
        match request_id(msg) {
            Some(id) => {
                if self.seen.insert(id) {
                    got.push(Requester(from, id));
                }
            }
            None => {
                let to = Requester(from, 0);
                let _ = self.answer(&to, &Answer::Failed("unknown request".into()));
            }
        }
    }

    /// The job was restored: the requests it sends again are new ones.
    pub fn restored(&mut self) {
        self.seen.clear();
    }

    /// Sends `answer` to `to` (a `restored` answer counts its request as
    /// seen in the restored run).
    pub fn answer(&mut self, to: &Requester, answer: &Answer) -> io::Result<()> {
        if matches!(answer, Answer::Restored(_)) {
            self.seen.insert(to.1);
        }
        self.sock.set_nonblocking(true)?;
        self.sock.send_to_addr(&answer.encode(), &to.0).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use std::os::linux::net::SocketAddrExt;

    use super::*;

    #[test]
    fn answers_round_trip() {
        for a in [
            Answer::Committed(3),
            Answer::Restored(12),
            Answer::Failed("no space left".into()),
        ] {
            assert_eq!(Answer::decode(&a.encode()), Some(a));
        }
        assert_eq!(Answer::decode(b"ok x"), None);
        assert_eq!(Answer::decode(b"what"), None);
    }

    /// A requester as libstasis makes it: abstract name, connected.
    fn requester(ch: &Channel, name: &str) -> UnixDatagram {
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let s = UnixDatagram::bind_addr(&addr).unwrap();
        s.connect(ch.path()).unwrap();
        s
    }

    #[test]
    fn requests_that_come_together_are_served_together() {
        let mut ch = Channel::open().unwrap();
        let mode = std::fs::metadata(ch.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let pid = std::process::id();
        let a = requester(&ch, &format!("stasis-test-a-{pid}"));
        let b = requester(&ch, &format!("stasis-test-b-{pid}"));
        a.send(&req(1)).unwrap();
        b.send(&req(2)).unwrap();
        // Sent again while being served: ignored.
        a.send(&req(1)).unwrap();
        let got = ch.wait(Duration::from_secs(5)).unwrap();
        assert_eq!(got.len(), 2);
        for r in &got {
            ch.answer(r, &Answer::Committed(7)).unwrap();
        }
        let mut buf = [0u8; 64];
        for s in [&a, &b] {
            let n = s.recv(&mut buf).unwrap();
            assert_eq!(Answer::decode(&buf[..n]), Some(Answer::Committed(7)));
        }
        assert!(ch.wait(Duration::from_millis(5)).unwrap().is_empty());
        a.send(&req(1)).unwrap();
        assert!(ch.wait(Duration::from_millis(5)).unwrap().is_empty());
        // After a restore: request 2 was answered `restored`, request 1
        // (frozen by another checkpoint) asks again and is new.
        ch.restored();
        ch.answer(&got[1], &Answer::Restored(7)).unwrap();
        b.send(&req(2)).unwrap();
        a.send(&req(1)).unwrap();
        let again = ch.wait(Duration::from_secs(5)).unwrap();
        assert_eq!(again.iter().map(|r| r.1).collect::<Vec<_>>(), [1]);
    }

    fn req(id: u64) -> Vec<u8> {
        [REQUEST, format!(" {id:x}").as_bytes()].concat()
    }

    #[test]
    fn a_malformed_request_is_answered_failed() {
        let mut ch = Channel::open().unwrap();
        let a = requester(&ch, &format!("stasis-test-c-{}", std::process::id()));
        a.send(b"checkpoint please").unwrap();
        assert!(ch.wait(Duration::from_millis(50)).unwrap().is_empty());
        let mut buf = [0u8; 64];
        let n = a.recv(&mut buf).unwrap();
        assert!(matches!(Answer::decode(&buf[..n]), Some(Answer::Failed(_))));
    }
}
