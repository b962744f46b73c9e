//! The cluster protocol, version 2: a coordinator (`stasis cluster ...`)
//! and the agents (`stasis agent`, one per host) take and restore one
//! consistent cut of an application spread over several hosts.
//!
//! This is the specification; the code below it is the reference encoder
//! and decoder, [`crate::agent`] and [`crate::coordinator`] the two sides.
//!
//! # Transport, greeting, frames
//!
//! One TCP connection from the coordinator to each agent carries one
//! session (one operation), encrypted with TLS 1.3 keyed by the token
//! (`stasis_pageserver::tls`, purpose "stasis cluster": the coordinator is
//! the TLS client, the agent the server, each proves it holds the token's
//! key); with `--insecure-plaintext` on both ends it runs on bare TCP. An
//! agent answers a plaintext coordinator's `Hello` with an `Error` naming
//! the flag; a plaintext agent answers a TLS hello with its greeting, which
//! the coordinator reports as no TLS. A peer with another token fails the
//! TLS handshake (an authentication error naming `--token-file`). Inside
//! the session, the first 12 bytes in each direction are the
//! greeting, `b"STASISCL"` and the version (`u32` little-endian); the
//! coordinator sends first, the agent answers with its own and closes if
//! they differ (both sides report both versions; no downgrade). Then every
//! message is a frame: a `u32` little-endian length, then that many bytes
//! of JSON, one [`Msg`]. A frame over [`MAX_FRAME`] bytes, or that does not
//! decode, ends the session.
//!
//! # Authentication
//!
//! As the page server's (same token file format, same HMAC-SHA256 over a
//! fresh 32-byte nonce from each side, checked in constant time), with the
//! roles `cluster-agent` and `cluster-coordinator` so that a proof of one
//! protocol is never accepted by the other:
//!
//! ```text
//! coordinator -> agent   Hello     { nonce }
//! agent -> coordinator   Challenge { nonce, proof }   proof of the agent
//! coordinator -> agent   Proof     { proof }          proof of the coordinator
//! agent -> coordinator   Welcome   { host }  or  Error { .. } (wrong token)
//! ```
//!
//! The coordinator refuses an agent whose proof is wrong; nothing but these
//! four frames is accepted before `Welcome`.
//!
//! # A cluster dump: one round, three phases (Elnozahy, Johnson, Zwaenepoel)
//!
//! The coordinator first asks every agent which rounds of the job it holds
//! (`Inspect` → `Jobs`) and numbers the new round one past the highest. Then:
//!
//! ```text
//! coordinator -> agent   Dump { job, round, pids, leave_running, concurrent, track, hosts }
//! agent -> coordinator   Ready                     every tree checked and prepared,
//!                                                  nothing frozen yet
//! coordinator -> agent   Freeze                    (once every agent is Ready)
//! agent -> coordinator   Frozen { frozen_us }      every tree of the agent frozen,
//!                                                  its TCP connections locked (and
//!                                                  read in repair mode), its state read
//! coordinator -> agent   Release                   (once every agent is Frozen)
//! agent -> coordinator   Written { checkpoints }   every tentative checkpoint
//!                                                  written and synced, not visible
//! coordinator -> agent   Commit                    (once every agent has Written):
//!                                                  the decision
//! agent -> coordinator   Committed { reports }
//! ```
//!
//! 0. **Check.** Each agent first refuses (`Failed`, nothing touched) if a
//!    TCP connection of its trees has its other end outside the job: not a
//!    socket of these trees on this host, nor on one of the job's `hosts`
//!    (the addresses of its agents). The error names the process, fd,
//!    connection and peer.
//! 1. **Freeze.** Each agent dumps its trees as `stasis dump` does. Each dump
//!    first does what needs no freeze (the checks, the census of who holds
//!    the tree's ptys and pipes, its listeners closed to new connections)
//!    and stops before the freeze; the agent says `Ready` once every tree
//!    is, and `Freeze` sets every host off at once: a host does not stay
//!    frozen while another still prepares (their preparations take from a
//!    few to tens of milliseconds, and differ). Each dump then stops again
//!    when its tree is frozen and read: no process of the job runs from the
//!    moment its host acks until every host has. Every TCP
//!    connection of the job is locked (a drop-everything filter) and in repair
//!    mode on both ends before either end's queues are read, so a byte sent
//!    and not yet read is in the send queue of one end or the receive queue of
//!    the other; where the acknowledgement was lost to the lock it is in both,
//!    with the same sequence numbers, and the restored receiver's TCP drops the
//!    retransmitted copy: delivered once, never lost.
//! 2. **Release.** With `leave_running`, each tree runs on while its pages are
//!    copied (write-protection or fork snapshot with `concurrent`); a dump
//!    that kills keeps its trees frozen until the commit. With `track`, the
//!    agent keeps a dirty-page tracker per tree (job, root PID) from one
//!    round to the next, armed again at each release: a tree's checkpoint is
//!    incremental against its checkpoint of the previous round when that
//!    round committed and the tracker has been armed since (else full, with
//!    a note in its report). A restore of the job drops its trackers.
//! 3. **Commit.** Each agent writes and syncs its checkpoints under temporary
//!    names (tentative: invisible to restores) and says `Written`. When all
//!    have, the coordinator sends `Commit`; each agent first records the
//!    decision durably (`jobs/JOB/decision.json`, written atomically and
//!    synced) and then renames its checkpoints into place (a dump that kills
//!    kills its trees then). An agent that dies between the two finishes the
//!    commit when it starts again, from the record. An agent whose storage
//!    is an object store ([`crate::storage`]) uploads each checkpoint
//!    before it says `Written` (a failed upload is `Failed`) and creates its
//!    commit record in the store after recording the decision, before the
//!    local commit (docs/storage.md, "Cluster agents").
//!
//! **Failures.** Before `Commit`, any failure aborts the round: an agent
//! that cannot dump says `Failed { error }`; the coordinator then sends
//! `Abort` to every agent (and closes); an agent whose coordinator closes
//! the connection, or says `Abort`, aborts too. An aborting agent puts its
//! trees back as they were (they run on), removes its tentative checkpoints,
//! and answers `Aborted`. Every host's previous checkpoints stay, so the
//! previous complete round stays the restorable cut. A round is *complete*
//! when every target holds it; `cluster restore` takes the newest complete
//! round (or the one asked for), so a round committed by some agents and not
//! others (the coordinator died during the commit) is never mixed with
//! another.
//!
//! # A cluster restore
//!
//! ```text
//! coordinator -> agent   Restore { job, round, pids, lazy }
//! agent -> coordinator   Built                     every tree built and stopped, its
//!                                                  connections in repair mode (which
//!                                                  drops what reaches them)
//! coordinator -> agent   Go                        (once every agent is Built)
//! agent -> coordinator   Running { pids }
//! ```
//!
//! With `lazy`, each agent builds its trees without their private memory
//! and starts a page filler (`stasis __lazy-filler`, one per tree) that
//! fills it in as it is touched and in the background: `Built` comes
//! sooner, and the job runs while its memory arrives.
//!
//! Nothing of the job runs, and no restored connection sends, before every
//! host has built its trees: a segment sent to a host whose socket does not
//! exist yet would reset the connection. A failure before `Go` (an agent
//! says `Failed`, or the coordinator is gone) kills every tree already
//! built, on every host (`Abort`).
//!
//! # Other requests
//!
//! `Inspect { job }` → `Jobs { rounds }`: for each target tree the agent
//! holds under the job, the rounds it has committed.
//!
//! `Status { job, pids }` → `Alive { pids }`: which of the trees (root
//! PIDs) still run on the agent's host (a process that exists and is not a
//! zombie); `stasis cluster run` checkpoints a job until none does.
//!
//! `Error { message }` answers any request the agent cannot serve.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use serde::{Deserialize, Serialize};
use stasis_pageserver::protocol::{check_proof, nonce, proof, NONCE_LEN};
use stasis_pageserver::tls::Transport;
use stasis_pageserver::tls::{self, ClientTls, Hello, Purpose, ServerTls, Stream, TlsError};

use crate::ClusterError;

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 2;
/// The greeting's magic.
pub const MAGIC: &[u8; 8] = b"STASISCL";
/// Largest frame accepted.
pub const MAX_FRAME: u32 = 4 << 20;

/// One message of the protocol (see the module docs for the sequences).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Msg {
    Hello { nonce: String },
    Challenge { nonce: String, proof: String },
    Proof { proof: String },
    Welcome { host: String },
    Error { message: String },

    Inspect { job: String },
    Jobs { trees: Vec<TreeRounds> },
    Status { job: String, pids: Vec<i32> },
    Alive { pids: Vec<i32> },

    Dump(DumpOrder),
    Ready,
    Freeze,
    Frozen { frozen_us: u64 },
    Release,
    Written { checkpoints: Vec<(i32, u32)> },
    Commit,
    Committed { reports: Vec<serde_json::Value> },

    Restore(RestoreOrder),
    Built,
    Go,
    Running { pids: Vec<i32> },

    Failed { error: String },
    Abort { why: String },
    Aborted,
}

/// What one agent dumps in a round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpOrder {
    pub job: String,
    pub round: u64,
    /// Roots of the trees of this host.
    pub pids: Vec<i32>,
    pub leave_running: bool,
    pub concurrent: bool,
    /// Incremental checkpoints: a dirty tracker per tree, kept by the agent
    /// from round to round.
    #[serde(default)]
    pub track: bool,
    /// The addresses of every host of the job: a connection to a peer
    /// elsewhere is refused before anything is touched.
    #[serde(default)]
    pub hosts: Vec<std::net::IpAddr>,
}

/// What one agent restores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreOrder {
    pub job: String,
    pub round: u64,
    /// Roots of the trees to restore (empty: every tree of the job here).
    pub pids: Vec<i32>,
    /// Lazy: each tree runs as soon as it is built, its memory filled in
    /// on demand and in the background by a page filler of the agent's.
    #[serde(default)]
    pub lazy: bool,
}

/// The committed rounds of one tree of a job on an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeRounds {
    pub pid: i32,
    /// (round, checkpoint number), oldest first.
    pub rounds: Vec<(u64, u32)>,
}

/// One end of a session: frames over a TCP stream (TLS once
/// authenticated, unless the process runs with `--insecure-plaintext`).
pub struct Conn {
    s: Stream,
    /// Who is at the other end (`host:port`), for messages.
    pub peer: String,
    /// TLS or not, from the process's `--insecure-plaintext`.
    transport: Transport,
}

impl Conn {
    pub fn new(s: TcpStream, peer: String) -> Conn {
        Conn {
            s: Stream::plain(s),
            peer,
            transport: Transport::process_default(),
        }
    }

    /// The same, over `transport` rather than the process's.
    pub fn with_transport(mut self, transport: Transport) -> Conn {
        self.transport = transport;
        self
    }

    /// The TCP socket (to set timeouts).
    pub fn stream(&self) -> &TcpStream {
        self.s.tcp()
    }

    /// The coordinator's side of the transport: TLS as the client.
    fn secure_to_agent(&mut self, token: &[u8]) -> Result<(), ClusterError> {
        if self.transport == Transport::InsecurePlaintext {
            return Ok(());
        }
        let tcp = self.s.tcp().try_clone();
        let tcp = tcp.map_err(|e| self.net("setting up TLS", e))?;
        let config = ClientTls::new(token, Purpose::Cluster);
        match config.and_then(|c| tls::connect(tcp, &c)) {
            Ok(s) => {
                self.s = s;
                Ok(())
            }
            Err(TlsError::Io(e)) => Err(self.net("setting up TLS", e)),
            Err(e) => Err(self.tls_failed(&e)),
        }
    }

    /// The agent's side of the transport: TLS as the server. `Ok(false)`:
    /// the coordinator holds another token.
    fn secure_from_coordinator(&mut self, token: &[u8]) -> Result<bool, ClusterError> {
        let tcp = self.s.tcp().try_clone();
        let tcp = tcp.map_err(|e| self.net("setting up TLS", e))?;
        if self.transport == Transport::InsecurePlaintext {
            if tls::sniff(&tcp).map_err(|e| self.net("greeting", e))? == Hello::Tls {
                let _ = tls::refuse_tls_client(&tcp, &greeting());
                return Err(self.tls_failed(&TlsError::NotTls));
            }
            return Ok(true);
        }
        let config = ServerTls::new(token, Purpose::Cluster);
        match config.and_then(|c| tls::accept(tcp, &c)) {
            Ok(s) => {
                self.s = s;
                Ok(true)
            }
            Err(TlsError::PlaintextPeer) => {
                self.greet()?;
                let _ = self.expect()?;
                let message = "this agent requires TLS but the coordinator runs with --insecure-plaintext: give the flag on both ends or on neither";
                self.send(&Msg::Error {
                    message: message.into(),
                })?;
                Err(self.tls_failed(&TlsError::PlaintextPeer))
            }
            Err(TlsError::Io(e)) => Err(self.net("setting up TLS", e)),
            Err(e) if e.is_other_token() => Ok(false),
            Err(e) => Err(self.tls_failed(&e)),
        }
    }

    fn tls_failed(&self, e: &TlsError) -> ClusterError {
        ClusterError::Auth {
            peer: self.peer.clone(),
            why: e.to_string(),
        }
    }

    fn net(&self, during: &'static str, source: io::Error) -> ClusterError {
        ClusterError::Net {
            peer: self.peer.clone(),
            during,
            source,
        }
    }

    /// Sends one message.
    pub fn send(&mut self, m: &Msg) -> Result<(), ClusterError> {
        let body = serde_json::to_vec(m).map_err(|e| self.net("encoding", io::Error::other(e)))?;
        let len = u32::try_from(body.len())
            .ok()
            .filter(|&n| n <= MAX_FRAME)
            .ok_or_else(|| self.net("encoding", io::Error::other("frame too large")))?;
        let mut frame = Vec::with_capacity(body.len() + 4);
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(&body);
        self.s
            .write_all(&frame)
            .and_then(|()| self.s.flush())
            .map_err(|e| self.net("sending", e))
    }

    /// Receives one message; `Ok(None)` if the peer closed the connection
    /// between messages.
    pub fn recv(&mut self) -> Result<Option<Msg>, ClusterError> {
        let mut len = [0u8; 4];
        match self.s.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(self.net("receiving", e)),
        }
        let len = u32::from_le_bytes(len);
        if len > MAX_FRAME {
            return Err(ClusterError::Protocol {
                peer: self.peer.clone(),
                reason: format!("a frame of {len} bytes (the limit is {MAX_FRAME})"),
            });
        }
        let mut body = vec![0u8; len as usize];
        self.s
            .read_exact(&mut body)
            .map_err(|e| self.net("receiving", e))?;
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| ClusterError::Protocol {
                peer: self.peer.clone(),
                reason: format!("an undecodable frame ({e})"),
            })
    }

    /// Receives one message; the end of the connection is an error.
    pub fn expect(&mut self) -> Result<Msg, ClusterError> {
        self.recv()?.ok_or_else(|| ClusterError::Closed {
            peer: self.peer.clone(),
        })
    }

    fn greet(&mut self) -> Result<(), ClusterError> {
        let g = greeting();
        self.s.write_all(&g).map_err(|e| self.net("greeting", e))?;
        let mut theirs = [0u8; 12];
        self.s
            .read_exact(&mut theirs)
            .map_err(|e| self.net("greeting", e))?;
        if &theirs[..8] != MAGIC {
            return Err(ClusterError::Protocol {
                peer: self.peer.clone(),
                reason: "it is not a stasis agent or coordinator (wrong greeting)".into(),
            });
        }
        let v = u32::from_le_bytes([theirs[8], theirs[9], theirs[10], theirs[11]]);
        if v != PROTOCOL_VERSION {
            return Err(ClusterError::Version {
                peer: self.peer.clone(),
                ours: PROTOCOL_VERSION,
                theirs: v,
            });
        }
        Ok(())
    }

    /// The coordinator's side of the greeting and authentication; returns
    /// the agent's host name.
    pub fn authenticate_to_agent(&mut self, token: &[u8]) -> Result<String, ClusterError> {
        self.secure_to_agent(token)?;
        self.greet()?;
        let ours = nonce().map_err(|e| self.net("authenticating", e))?;
        self.send(&Msg::Hello { nonce: hex(&ours) })?;
        let (theirs, agent_proof) = match self.expect()? {
            Msg::Challenge { nonce, proof } => (nonce, proof),
            other => return Err(self.unexpected(&other, "a challenge")),
        };
        let theirs = unhex::<NONCE_LEN>(&theirs).ok_or_else(|| self.bad("a malformed nonce"))?;
        let agent_ok = unhex::<32>(&agent_proof)
            .is_some_and(|p| check_proof(token, ROLE_AGENT, &ours, &theirs, &p));
        // Our proof goes out either way, so an agent with another token
        // says so; an agent whose own proof was wrong is refused anyway.
        let mine = proof(token, ROLE_COORDINATOR, &ours, &theirs);
        self.send(&Msg::Proof { proof: hex(&mine) })?;
        if !agent_ok {
            return Err(ClusterError::Auth {
                peer: self.peer.clone(),
                why: "the agent does not know the token: check --token-file on both sides".into(),
            });
        }
        match self.expect()? {
            Msg::Welcome { host } => Ok(host),
            Msg::Error { message } => Err(ClusterError::Auth {
                peer: self.peer.clone(),
                why: message,
            }),
            other => Err(self.unexpected(&other, "a welcome")),
        }
    }

    /// The agent's side of the greeting and authentication: `Ok(true)` if
    /// the coordinator proved it knows `token` (then `Welcome` was sent).
    pub fn authenticate_coordinator(
        &mut self,
        token: &[u8],
        host: &str,
    ) -> Result<bool, ClusterError> {
        if !self.secure_from_coordinator(token)? {
            return Ok(false);
        }
        self.greet()?;
        let theirs = match self.expect()? {
            Msg::Hello { nonce } => nonce,
            other => return Err(self.unexpected(&other, "a hello")),
        };
        let theirs = unhex::<NONCE_LEN>(&theirs).ok_or_else(|| self.bad("a malformed nonce"))?;
        let ours = nonce().map_err(|e| self.net("authenticating", e))?;
        let mine = proof(token, ROLE_AGENT, &theirs, &ours);
        self.send(&Msg::Challenge {
            nonce: hex(&ours),
            proof: hex(&mine),
        })?;
        let got = match self.expect()? {
            Msg::Proof { proof } => proof,
            other => return Err(self.unexpected(&other, "a proof")),
        };
        let ok = unhex::<32>(&got)
            .is_some_and(|p| check_proof(token, ROLE_COORDINATOR, &theirs, &ours, &p));
        if !ok {
            let _ = self.send(&Msg::Error {
                message: "the agent refused the token: check --token-file".into(),
            });
            return Ok(false);
        }
        self.send(&Msg::Welcome { host: host.into() })?;
        Ok(true)
    }

    /// The error for message `got` where `wanted` was expected (an `Error`
    /// or `Failed` from the peer is reported as such).
    pub fn unexpected(&self, got: &Msg, wanted: &str) -> ClusterError {
        match got {
            Msg::Error { message } | Msg::Failed { error: message } => ClusterError::Peer {
                peer: self.peer.clone(),
                message: message.clone(),
            },
            other => self.bad(&format!("{other:?} instead of {wanted}")),
        }
    }

    fn bad(&self, reason: &str) -> ClusterError {
        ClusterError::Protocol {
            peer: self.peer.clone(),
            reason: reason.into(),
        }
    }
}

/// The greeting: magic and version.
fn greeting() -> [u8; 12] {
    let mut g = [0u8; 12];
    g[..8].copy_from_slice(MAGIC);
    g[8..].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    g
}

const ROLE_AGENT: &str = "cluster-agent";
const ROLE_COORDINATOR: &str = "cluster-coordinator";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (Conn, Conn) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (
            Conn::new(a, "agent".into()),
            Conn::new(b, "coordinator".into()),
        )
    }

    /// Both sides authenticate with the same token; with different tokens
    /// both refuse, and the coordinator says which side to check.
    #[test]
    fn authentication_needs_the_same_token_on_both_sides() {
        for (ct, at, ok) in [
            (b"t-one".as_slice(), b"t-one".as_slice(), true),
            (b"t-one", b"t-two", false),
        ] {
            let (mut c, mut a) = pair();
            let agent = std::thread::spawn(move || a.authenticate_coordinator(at, "h1").unwrap());
            let r = c.authenticate_to_agent(ct);
            let accepted = agent.join().unwrap();
            assert_eq!(accepted, ok);
            match r {
                Ok(host) => {
                    assert!(ok);
                    assert_eq!(host, "h1");
                }
                Err(e) => {
                    assert!(!ok);
                    assert!(e.to_string().contains("token"), "{e}");
                }
            }
        }
    }

    /// A plaintext coordinator and a TLS agent refuse each other, and so do
    /// a TLS coordinator and a plaintext agent, each naming the flag.
    #[test]
    fn tls_and_plaintext_ends_refuse_each_other_naming_the_flag() {
        for coordinator in [Transport::InsecurePlaintext, Transport::Tls] {
            let (c, a) = pair();
            let agent_side = match coordinator {
                Transport::Tls => Transport::InsecurePlaintext,
                Transport::InsecurePlaintext => Transport::Tls,
            };
            let (mut c, mut a) = (c.with_transport(coordinator), a.with_transport(agent_side));
            let agent = std::thread::spawn(move || a.authenticate_coordinator(b"tok", "h1"));
            let e = c.authenticate_to_agent(b"tok").unwrap_err().to_string();
            drop(c);
            let a = agent.join().unwrap().unwrap_err().to_string();
            assert!(e.contains("--insecure-plaintext"), "{coordinator:?}: {e}");
            assert!(a.contains("--insecure-plaintext"), "{coordinator:?}: {a}");
        }
        // Both plaintext: authenticated as before.
        let (c, a) = pair();
        let (mut c, mut a) = (
            c.with_transport(Transport::InsecurePlaintext),
            a.with_transport(Transport::InsecurePlaintext),
        );
        let agent = std::thread::spawn(move || a.authenticate_coordinator(b"tok", "h1").unwrap());
        assert_eq!(c.authenticate_to_agent(b"tok").unwrap(), "h1");
        assert!(agent.join().unwrap());
    }

    #[test]
    fn frames_round_trip_and_oversized_or_garbage_frames_are_errors() {
        let (mut c, mut a) = pair();
        let m = Msg::Dump(DumpOrder {
            job: "j".into(),
            round: 3,
            pids: vec![10, 20],
            leave_running: true,
            concurrent: false,
            track: true,
            hosts: vec!["10.0.0.1".parse().unwrap()],
        });
        c.send(&m).unwrap();
        assert_eq!(a.recv().unwrap(), Some(m));
        c.s.write_all(&(MAX_FRAME + 1).to_le_bytes()).unwrap();
        assert!(matches!(a.recv(), Err(ClusterError::Protocol { .. })));
        let (mut c, mut a) = pair();
        c.s.write_all(&3u32.to_le_bytes()).unwrap();
        c.s.write_all(b"{{{").unwrap();
        assert!(matches!(a.recv(), Err(ClusterError::Protocol { .. })));
        drop(c);
        assert!(a.recv().unwrap().is_none());
    }

    #[test]
    fn hex_round_trips_and_rejects_bad_input() {
        let n = [0xab_u8; 32];
        assert_eq!(unhex::<32>(&hex(&n)), Some(n));
        assert_eq!(unhex::<32>("zz"), None);
        assert_eq!(unhex::<2>("zzzz"), None);
    }
}
