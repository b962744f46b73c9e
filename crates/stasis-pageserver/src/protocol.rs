//! The page server protocol, version 1.
//!
//! This is the specification; the code below it is the reference encoder
//! and decoder. A page server serves one Stasis image directory (see
//! `docs/image-format.md`) to clients that mirror checkpoints or fetch runs
//! of pages for a restore on another machine. It never writes to the image.
//!
//! # Transport and encoding
//!
//! One TCP connection carries one session, encrypted with TLS 1.3 keyed by
//! the token (see [`crate::tls`]: raw Ed25519 public keys derived from the
//! token, purpose "stasis page server", mutual); everything below runs inside
//! it. With `--insecure-plaintext` on both ends it runs on the bare TCP
//! stream instead. A TLS server answers a plaintext client's greeting with
//! its greeting and an `Error` (code `Refused`, [`PLAINTEXT_REFUSED`]); a
//! plaintext server answers a TLS hello with its greeting, which the TLS
//! client reports as no TLS. Both name the flag. All integers are little-endian;
//! `u32`/`u64` are unsigned. A *string* is a `u16` byte length followed by
//! that many bytes of UTF-8. A *run entry* is 32 bytes: `vaddr u64`,
//! `npages u32`, `flags u32`, `file_off u64`, `checksum u64` (the fields of
//! the pack index entry, without its reserved word). Checksums are XXH3-64
//! (seed 0), as in the image format.
//!
//! # Greeting (version negotiation)
//!
//! The first 12 bytes in each direction are the greeting: the magic
//! `b"STASISPS"` then the protocol version (`u32`, [`PROTOCOL_VERSION`]).
//! The client sends its greeting first; the server reads it and answers with
//! its own. The greeting is the same in every version, so a mismatch is
//! always detected and reported by both sides with both versions named:
//!
//! - a wrong magic: the server closes the connection without answering;
//! - a different version: the server sends its greeting, logs both versions
//!   and closes; the client, having read the server's greeting, refuses to
//!   go on ([`PageServerError::VersionMismatch`](crate::PageServerError)).
//!   There is no downgrade: both sides must run the same version.
//!
//! # Frames
//!
//! After the greeting, everything is a frame: an 8-byte header `kind u32`,
//! `len u32`, then `len` bytes of payload. A receiver checks `len` against
//! the limit for its direction (and, where the kind fixes it, against the
//! exact expected length) *before* allocating anything for the payload:
//! [`MAX_REQUEST_BYTES`] for frames sent by a client, [`MAX_REPLY_BYTES`]
//! for frames sent by a server. A frame over the limit, of an unknown kind,
//! or whose payload does not decode exactly (bytes left over included) is a
//! protocol violation: the receiver closes the connection (a server first
//! sends an `Error` reply with code `BadRequest`).
//!
//! # Authentication
//!
//! Both sides hold the same secret token (at least one byte). Each proves it
//! knows the token without sending it, with HMAC-SHA256 over two fresh
//! 32-byte random nonces, one from each side:
//!
//! ```text
//! client -> server  ClientHello  (kind 1)  client_nonce[32]
//! server -> client  ServerHello  (kind 2)  server_nonce[32] server_proof[32]
//! client -> server  ClientProof  (kind 3)  client_proof[32]
//! server -> client  AuthOk       (kind 4)  (empty)   or an Error with code Auth
//!
//! server_proof = HMAC-SHA256(token, "stasis-ps 1 server" || client_nonce || server_nonce)
//! client_proof = HMAC-SHA256(token, "stasis-ps 1 client" || client_nonce || server_nonce)
//! ```
//!
//! The server checks `client_proof` in constant time; a wrong proof gets an
//! `Error` (code `Auth`, "the page server refused the token: check
//! --token-file"), is logged with the peer address, and the connection is
//! closed. No request is served before `AuthOk`. The token authenticates
//! the peers; the data itself travels unencrypted (use a private network or
//! a tunnel for images holding secrets).
//!
//! The client checks `server_proof` too, in constant time, and refuses the
//! session if it is wrong, whatever the server answers: a server without
//! the token is never used. It sends its own proof either way, so that a
//! server holding another token reports (and logs) the mismatch; each
//! proof covers a fresh nonce of the other side, so none can be replayed.
//!
//! A server with too many connections may answer the greeting and then send
//! an `Error` with code `Busy` instead of `ServerHello`.
//!
//! # Requests and replies
//!
//! After `AuthOk` the client sends requests; the server answers each with
//! exactly one reply, in order. Requests may be pipelined: a client may send
//! many requests before reading their replies (it should bound how many are
//! in flight so that neither side blocks writing while the other is not
//! reading). Every request may instead be answered by `Error`; that ends the
//! request, not the session (except for a protocol violation).
//!
//! | request (kind)      | payload                          | reply (kind)       | reply payload |
//! |---------------------|----------------------------------|--------------------|---------------|
//! | `Latest` (16)       | empty                            | `Latest` (144)     | `n u32`: the newest committed checkpoint |
//! | `Chain` (17)        | `n u32`                          | `Chain` (145)      | `count u32`, `count` x `u32`: `n` and its ancestors through the manifests' `parent`, nearest first |
//! | `Files` (18)        | `n u32`                          | `Files` (146)      | `count u32`, `count` x (`name` string, `size u64`): the regular files of the checkpoint directory |
//! | `File` (19)         | `n u32`, `name` string           | `FileData` (147)   | the file's bytes, then `xxh3 u64` of them |
//! | `Skeleton` (20)     | `n u32`, `pack` string           | `Skeleton` (148)   | `size u64`, `tail_off u64`, the 4096 header bytes, then the `size - tail_off` bytes from `tail_off` (index and trailer) |
//! | `ReadRun` (21)      | `n u32`, `pack` string, run entry| `RunData` (149)    | `checksum u64` (the entry's), then the run's `npages * 4096` bytes |
//! | any                 |                                  | `Error` (255)      | `code u32`, `message` string |
//!
//! - File names are plain names (`stasis_image::is_plain_name`) that do not
//!   start with `.`; anything else is refused (`Refused`). The server opens
//!   files with `O_NOFOLLOW` and serves regular files only, so a symbolic
//!   link, FIFO or directory in a checkpoint is refused, never followed.
//! - `Files` lists only entries that qualify; `File` serves at most
//!   [`MAX_FILE_BYTES`] (larger: `TooLarge`; use `Skeleton` + `ReadRun` for
//!   page packs of any size).
//! - `Skeleton` and `ReadRun` name a pack of the checkpoint's manifest; the
//!   server opens and validates it as the image format prescribes. With the
//!   skeleton a client recreates the pack as a sparse file of `size` bytes
//!   that a pack reader accepts, and fills its data from runs later.
//! - For `ReadRun` the entry must be exactly one of the pack's index entries
//!   (`NotFound` otherwise). The server reads the run and checks its
//!   checksum before sending it: a corrupt image is answered with `Corrupt`,
//!   never with its bytes. The client checks the checksum of what it
//!   received against the entry before using a byte of it.
//! - A connection that ends before a whole reply has arrived is an error for
//!   the client, never a short or zero-filled result.
//!
//! # Error codes
//!
//! See [`ErrorCode`]. The message is for people (at most
//! [`MAX_MESSAGE_BYTES`] bytes); programs use the code.
//!
//! # Limits
//!
//! | limit                                  | value                  |
//! |----------------------------------------|------------------------|
//! | request frame payload                  | [`MAX_REQUEST_BYTES`] (4 KiB) |
//! | reply frame payload                    | [`MAX_REPLY_BYTES`] (256 MiB + 8 KiB) |
//! | `File` size                            | [`MAX_FILE_BYTES`] (256 MiB + 4 KiB, the largest manifest) |
//! | name                                   | 255 bytes              |
//! | error message                          | [`MAX_MESSAGE_BYTES`] (4 KiB) |
//! | connections served at once             | [`MAX_CONNECTIONS`] (64) |
//! | handshake time / idle time per request | 30 s / 10 min          |

use std::fmt;
use std::io::{self, Read, Write};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use stasis_image::{RunEntry, PACK_HEADER_LEN, PACK_TRAILER_LEN};

pub use crate::error::PayloadError;

/// First 8 bytes of every greeting.
pub const MAGIC: [u8; 8] = *b"STASISPS";
/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// Length of a greeting (magic + version).
pub const GREETING_LEN: usize = 12;
/// Length of a frame header (kind + len).
pub const FRAME_HEADER_LEN: usize = 8;
/// Length of an authentication nonce.
pub const NONCE_LEN: usize = 32;
/// Length of an HMAC-SHA256 proof.
pub const PROOF_LEN: usize = 32;
/// Largest payload of a frame sent by a client.
pub const MAX_REQUEST_BYTES: u32 = 4096;
/// Largest file served by a `File` request.
pub const MAX_FILE_BYTES: u64 = (256 << 20) + 4096;
/// Largest payload of a frame sent by a server.
pub const MAX_REPLY_BYTES: u32 = (256 << 20) + 8192;
/// Longest name (NAME_MAX).
pub const MAX_NAME_BYTES: usize = 255;
/// Longest error message.
pub const MAX_MESSAGE_BYTES: usize = 4096;
/// Connections a server serves at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Length of an encoded run entry.
pub const RUN_ENTRY_LEN: usize = 32;

/// Frame kinds.
pub mod kind {
    pub const CLIENT_HELLO: u32 = 1;
    pub const SERVER_HELLO: u32 = 2;
    pub const CLIENT_PROOF: u32 = 3;
    pub const AUTH_OK: u32 = 4;
    pub const LATEST: u32 = 16;
    pub const CHAIN: u32 = 17;
    pub const FILES: u32 = 18;
    pub const FILE: u32 = 19;
    pub const SKELETON: u32 = 20;
    pub const READ_RUN: u32 = 21;
    pub const LATEST_REPLY: u32 = 144;
    pub const CHAIN_REPLY: u32 = 145;
    pub const FILES_REPLY: u32 = 146;
    pub const FILE_DATA: u32 = 147;
    pub const SKELETON_REPLY: u32 = 148;
    pub const RUN_DATA: u32 = 149;
    pub const ERROR: u32 = 255;
}

/// The code of an `Error` reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// Malformed or unexpected message (the connection is closed).
    BadRequest,
    /// No such checkpoint, file, pack or run.
    NotFound,
    /// The name or file is not allowed (not plain, hidden, symlink, not a regular file).
    Refused,
    /// The image on the server is corrupt (checksum, structure).
    Corrupt,
    /// The file is over [`MAX_FILE_BYTES`].
    TooLarge,
    /// The server failed (I/O error).
    Internal,
    /// Authentication failed (the connection is closed).
    Auth,
    /// The server has too many connections (the connection is closed).
    Busy,
    /// A code this version does not know.
    Other(u32),
}

impl ErrorCode {
    pub fn to_u32(self) -> u32 {
        match self {
            ErrorCode::BadRequest => 1,
            ErrorCode::NotFound => 2,
            ErrorCode::Refused => 3,
            ErrorCode::Corrupt => 4,
            ErrorCode::TooLarge => 5,
            ErrorCode::Internal => 6,
            ErrorCode::Auth => 7,
            ErrorCode::Busy => 8,
            ErrorCode::Other(n) => n,
        }
    }

    pub fn from_u32(n: u32) -> ErrorCode {
        match n {
            1 => ErrorCode::BadRequest,
            2 => ErrorCode::NotFound,
            3 => ErrorCode::Refused,
            4 => ErrorCode::Corrupt,
            5 => ErrorCode::TooLarge,
            6 => ErrorCode::Internal,
            7 => ErrorCode::Auth,
            8 => ErrorCode::Busy,
            n => ErrorCode::Other(n),
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorCode::BadRequest => f.write_str("bad request"),
            ErrorCode::NotFound => f.write_str("not found"),
            ErrorCode::Refused => f.write_str("refused"),
            ErrorCode::Corrupt => f.write_str("corrupt image"),
            ErrorCode::TooLarge => f.write_str("too large"),
            ErrorCode::Internal => f.write_str("server error"),
            ErrorCode::Auth => f.write_str("authentication failed"),
            ErrorCode::Busy => f.write_str("busy"),
            ErrorCode::Other(n) => write!(f, "error code {n}"),
        }
    }
}

/// The message a TLS server sends a plaintext client.
pub const PLAINTEXT_REFUSED: &str = "this page server requires TLS but the client runs with --insecure-plaintext: give the flag on both ends or on neither";
/// The message a server sends a client whose token is wrong.
pub const TOKEN_REFUSED: &str = "the page server refused the token: check --token-file";

/// A request, as sent by a client after authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Latest,
    Chain { n: u32 },
    Files { n: u32 },
    File { n: u32, name: String },
    Skeleton { n: u32, pack: String },
    ReadRun { n: u32, pack: String, run: RunEntry },
}

impl Request {
    /// Kind and payload of the request's frame.
    pub fn encode(&self) -> (u32, Vec<u8>) {
        let mut e = Enc::default();
        let k = match self {
            Request::Latest => kind::LATEST,
            Request::Chain { n } => {
                e.u32(*n);
                kind::CHAIN
            }
            Request::Files { n } => {
                e.u32(*n);
                kind::FILES
            }
            Request::File { n, name } => {
                e.u32(*n);
                e.str(name);
                kind::FILE
            }
            Request::Skeleton { n, pack } => {
                e.u32(*n);
                e.str(pack);
                kind::SKELETON
            }
            Request::ReadRun { n, pack, run } => {
                e.u32(*n);
                e.str(pack);
                e.run(run);
                kind::READ_RUN
            }
        };
        (k, e.0)
    }

    /// Decodes a request frame.
    pub fn decode(k: u32, payload: &[u8]) -> Result<Request, PayloadError> {
        let mut d = Dec(payload);
        let req = match k {
            kind::LATEST => Request::Latest,
            kind::CHAIN => Request::Chain { n: d.u32()? },
            kind::FILES => Request::Files { n: d.u32()? },
            kind::FILE => Request::File {
                n: d.u32()?,
                name: d.str()?,
            },
            kind::SKELETON => Request::Skeleton {
                n: d.u32()?,
                pack: d.str()?,
            },
            kind::READ_RUN => Request::ReadRun {
                n: d.u32()?,
                pack: d.str()?,
                run: d.run()?,
            },
            other => return Err(PayloadError::UnknownRequest(other)),
        };
        d.end()?;
        Ok(req)
    }
}

/// Writes a greeting.
pub fn write_greeting(w: &mut impl Write, version: u32) -> io::Result<()> {
    let mut g = [0u8; GREETING_LEN];
    g[..8].copy_from_slice(&MAGIC);
    g[8..].copy_from_slice(&version.to_le_bytes());
    w.write_all(&g)
}

/// Reads a greeting: `Ok(Some(version))`, or `Ok(None)` for a wrong magic.
pub fn read_greeting(r: &mut impl Read) -> io::Result<Option<u32>> {
    let mut g = [0u8; GREETING_LEN];
    r.read_exact(&mut g)?;
    if g[..8] != MAGIC {
        return Ok(None);
    }
    let mut v = [0u8; 4];
    v.copy_from_slice(&g[8..]);
    Ok(Some(u32::from_le_bytes(v)))
}

/// Writes a frame header.
pub fn write_header(w: &mut impl Write, k: u32, len: u32) -> io::Result<()> {
    let mut h = [0u8; FRAME_HEADER_LEN];
    h[..4].copy_from_slice(&k.to_le_bytes());
    h[4..].copy_from_slice(&len.to_le_bytes());
    w.write_all(&h)
}

/// Writes a whole frame.
pub fn write_frame(w: &mut impl Write, k: u32, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    write_header(w, k, len)?;
    w.write_all(payload)
}

/// Reads a frame header: `Ok(None)` on a clean end of stream (before the
/// first byte of the header).
pub fn read_header(r: &mut impl Read) -> io::Result<Option<(u32, u32)>> {
    let mut h = [0u8; FRAME_HEADER_LEN];
    let mut got = 0;
    while got < h.len() {
        match r.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let mut a = [0u8; 4];
    a.copy_from_slice(&h[..4]);
    let k = u32::from_le_bytes(a);
    a.copy_from_slice(&h[4..]);
    Ok(Some((k, u32::from_le_bytes(a))))
}

/// Reads `len` bytes of payload after checking `len <= max`. Memory grows
/// with the bytes that arrive, not with what the header announces.
pub fn read_payload(r: &mut impl Read, len: u32, max: u32) -> io::Result<Vec<u8>> {
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is over the limit of {max}"),
        ));
    }
    let want = len as usize;
    let mut buf = Vec::with_capacity(want.min(64 << 10));
    r.take(u64::from(len)).read_to_end(&mut buf)?;
    if buf.len() != want {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(buf)
}

/// Payload of an `Error` reply.
pub fn encode_error(code: ErrorCode, message: &str) -> Vec<u8> {
    let mut cut = message.len().min(MAX_MESSAGE_BYTES);
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut e = Enc::default();
    e.u32(code.to_u32());
    e.str(&message[..cut]);
    e.0
}

/// Decodes the payload of an `Error` reply.
pub fn decode_error(payload: &[u8]) -> Result<(ErrorCode, String), PayloadError> {
    let mut d = Dec(payload);
    let code = ErrorCode::from_u32(d.u32()?);
    let msg = d.str()?;
    d.end()?;
    Ok((code, msg))
}

/// One file of a checkpoint, as listed by the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    pub name: String,
    pub size: u64,
}

/// Everything of a page pack but its page data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skeleton {
    /// Size of the pack file.
    pub size: u64,
    /// The first 4096 bytes (header).
    pub header: Vec<u8>,
    /// Offset of the index (end of page data).
    pub tail_off: u64,
    /// Bytes from `tail_off` to the end (index and trailer).
    pub tail: Vec<u8>,
}

/// Decodes the payload of a `ServerHello`: the server's nonce and proof.
pub fn decode_server_hello(p: &[u8]) -> Result<([u8; NONCE_LEN], [u8; PROOF_LEN]), PayloadError> {
    let mut d = Dec(p);
    let nonce = d.array::<NONCE_LEN>()?;
    let proof = d.array::<PROOF_LEN>()?;
    d.end()?;
    Ok((nonce, proof))
}

/// Decodes the payload of a `Latest` reply.
pub fn decode_latest_reply(p: &[u8]) -> Result<u32, PayloadError> {
    let mut d = Dec(p);
    let n = d.u32()?;
    d.end()?;
    Ok(n)
}

/// Decodes the payload of a `Chain` reply to a request for checkpoint `n`:
/// it must start at `n` and descend.
pub fn decode_chain_reply(n: u32, p: &[u8]) -> Result<Vec<u32>, PayloadError> {
    let mut d = Dec(p);
    let count = d.u32()? as usize;
    if count.saturating_mul(4) != d.0.len() {
        return Err(PayloadError::ChainLength {
            count,
            bytes: d.0.len(),
        });
    }
    let chain = (0..count).map(|_| d.u32()).collect::<Result<Vec<_>, _>>()?;
    let ordered = chain.first() == Some(&n) && chain.windows(2).all(|w| w[1] < w[0]);
    if !ordered {
        return Err(PayloadError::ChainOrder { chain, n });
    }
    Ok(chain)
}

/// Decodes the payload of a `Files` reply; every name must be servable.
pub fn decode_files_reply(p: &[u8]) -> Result<Vec<FileInfo>, PayloadError> {
    let mut d = Dec(p);
    let count = d.u32()?;
    let mut files = Vec::new();
    for _ in 0..count {
        let name = d.str()?;
        if !is_servable_name(&name) {
            return Err(PayloadError::UnsafeName(name));
        }
        files.push(FileInfo {
            name,
            size: d.u64()?,
        });
    }
    d.end()?;
    Ok(files)
}

/// Decodes the payload of a `Skeleton` reply, checking that its sizes agree.
pub fn decode_skeleton_reply(p: &[u8]) -> Result<Skeleton, PayloadError> {
    let mut d = Dec(p);
    let size = d.u64()?;
    let tail_off = d.u64()?;
    let header = d.take(4096)?.to_vec();
    let tail = d.rest().to_vec();
    let ok = tail_off >= PACK_HEADER_LEN
        && size >= PACK_HEADER_LEN + PACK_TRAILER_LEN
        && tail_off.checked_add(tail.len() as u64) == Some(size)
        && tail.len() as u64 >= PACK_TRAILER_LEN;
    if !ok {
        return Err(PayloadError::Skeleton {
            size,
            tail_off,
            tail: tail.len(),
        });
    }
    Ok(Skeleton {
        size,
        header,
        tail_off,
        tail,
    })
}

/// The proof of `role` ("client" or "server") over both nonces.
pub fn proof(
    token: &[u8],
    role: &str,
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
) -> [u8; PROOF_LEN] {
    mac_for(token, role, client_nonce, server_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks a received proof in constant time.
pub fn check_proof(
    token: &[u8],
    role: &str,
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
    got: &[u8],
) -> bool {
    mac_for(token, role, client_nonce, server_nonce)
        .verify_slice(got)
        .is_ok()
}

fn mac_for(
    token: &[u8],
    role: &str,
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
) -> Hmac<Sha256> {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = match Hmac::<Sha256>::new_from_slice(token) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(format!("stasis-ps {PROTOCOL_VERSION} {role}").as_bytes());
    mac.update(client_nonce);
    mac.update(server_nonce);
    mac
}

/// A fresh random nonce.
pub fn nonce() -> io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| io::Error::other(format!("no random numbers: {e}")))?;
    Ok(n)
}

/// Little-endian payload encoder.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
    /// A string; callers keep names within [`MAX_NAME_BYTES`] and messages
    /// within [`MAX_MESSAGE_BYTES`], both far below `u16::MAX`.
    pub fn str(&mut self, s: &str) {
        let len = u16::try_from(s.len()).unwrap_or(u16::MAX);
        self.0.extend_from_slice(&len.to_le_bytes());
        self.0.extend_from_slice(&s.as_bytes()[..usize::from(len)]);
    }
    pub fn run(&mut self, e: &RunEntry) {
        self.u64(e.vaddr);
        self.u32(e.npages);
        self.u32(e.flags);
        self.u64(e.file_off);
        self.u64(e.checksum);
    }
}

/// Little-endian payload decoder; every read is bounds-checked.
pub struct Dec<'a>(pub &'a [u8]);

impl<'a> Dec<'a> {
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], PayloadError> {
        if self.0.len() < n {
            return Err(PayloadError::Short {
                left: self.0.len(),
                needed: n,
            });
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], PayloadError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    pub fn u16(&mut self) -> Result<u16, PayloadError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, PayloadError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, PayloadError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn str(&mut self) -> Result<String, PayloadError> {
        let len = usize::from(self.u16()?);
        let b = self.take(len)?;
        String::from_utf8(b.to_vec()).map_err(|_| PayloadError::NotUtf8)
    }
    pub fn run(&mut self) -> Result<RunEntry, PayloadError> {
        Ok(RunEntry {
            vaddr: self.u64()?,
            npages: self.u32()?,
            flags: self.u32()?,
            file_off: self.u64()?,
            checksum: self.u64()?,
        })
    }
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
    /// Fails if bytes are left.
    pub fn end(&self) -> Result<(), PayloadError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(PayloadError::Trailing(self.0.len()))
        }
    }
}

/// Is `name` a file name the server may serve from a checkpoint directory?
pub fn is_servable_name(name: &str) -> bool {
    stasis_image::is_plain_name(name) && !name.starts_with('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip_and_trailing_bytes_refused() {
        let run = RunEntry {
            vaddr: 0x7f00_0000_0000,
            npages: 3,
            flags: 0,
            file_off: 4096,
            checksum: 0xdead_beef,
        };
        for r in [
            Request::Latest,
            Request::Chain { n: 7 },
            Request::Files { n: 1 },
            Request::File {
                n: 2,
                name: "manifest.bin".into(),
            },
            Request::Skeleton {
                n: 3,
                pack: "pages-1.pack".into(),
            },
            Request::ReadRun {
                n: 4,
                pack: "pages-1.pack".into(),
                run,
            },
        ] {
            let (k, mut p) = r.encode();
            assert_eq!(Request::decode(k, &p), Ok(r.clone()));
            p.push(0);
            assert!(Request::decode(k, &p).is_err());
        }
        assert!(Request::decode(99, &[]).is_err());
        assert!(Request::decode(kind::CHAIN, &[1, 2]).is_err());
    }

    #[test]
    fn proofs_depend_on_token_role_and_nonces() {
        let (c, s) = ([1u8; 32], [2u8; 32]);
        let p = proof(b"tok", "server", &c, &s);
        assert!(check_proof(b"tok", "server", &c, &s, &p));
        assert!(!check_proof(b"tok2", "server", &c, &s, &p));
        assert!(!check_proof(b"tok", "client", &c, &s, &p));
        assert!(!check_proof(b"tok", "server", &s, &c, &p));
        assert!(!check_proof(b"tok", "server", &c, &s, &p[..31]));
    }

    /// Found by the `ps_reply` fuzz target: a header announcing a 256 MiB
    /// reply made the client allocate 256 MiB before reading a byte.
    #[test]
    fn a_short_payload_allocates_only_what_arrived() {
        let mut r: &[u8] = &[7u8; 10];
        let e = read_payload(&mut r, MAX_REPLY_BYTES, MAX_REPLY_BYTES).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let mut r: &[u8] = &[7u8; 100_000];
        let mut rest = Vec::new();
        let got = read_payload(&mut r, 70_000, MAX_REPLY_BYTES).unwrap();
        assert_eq!(got, vec![7u8; 70_000]);
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest.len(), 30_000, "the payload took exactly its bytes");
    }

    #[test]
    fn oversized_frame_is_refused_before_allocating() {
        let mut r: &[u8] = &[];
        let e = read_payload(&mut r, u32::MAX, MAX_REQUEST_BYTES).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
