//! The error type of the crate.

use std::io;
use std::path::PathBuf;

use stasis_image::ImageError;

use crate::protocol::ErrorCode;

/// Why a frame's payload does not decode (the `reason` of a protocol
/// violation).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("payload ends early ({left} bytes left, {needed} needed)")]
    Short { left: usize, needed: usize },
    #[error("string is not UTF-8")]
    NotUtf8,
    #[error("{0} unexpected bytes at the end")]
    Trailing(usize),
    #[error("unknown request kind {0}")]
    UnknownRequest(u32),
    #[error("{count} checkpoints in {bytes} bytes")]
    ChainLength { count: usize, bytes: usize },
    #[error("chain {chain:?} does not start at {n} and descend")]
    ChainOrder { chain: Vec<u32>, n: u32 },
    #[error("unsafe file name {0:?}")]
    UnsafeName(String),
    #[error("inconsistent skeleton (size {size}, index at {tail_off}, {tail} tail bytes)")]
    Skeleton {
        size: u64,
        tail_off: u64,
        tail: usize,
    },
}

/// Everything that can go wrong while serving or fetching an image.
///
/// Messages are lowercase, name the server address and what was being done
/// (checkpoint, file, run), and end with what the user can do about it.
/// Each message includes its cause (the `error` fields), so the cause is
/// not repeated as an error `source`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PageServerError {
    /// The token given is empty.
    #[error(
        "the page server token is empty: put a secret of at least one byte in the --token-file"
    )]
    EmptyToken,

    /// The server could not listen on the address.
    #[error("cannot listen on {listen}: {error}")]
    Bind { listen: String, error: io::Error },

    /// The image directory given to the server cannot be served.
    #[error("cannot serve {}: {error}", .dir.display())]
    BadImage { dir: PathBuf, error: ImageError },

    /// The client could not reach the server.
    #[error("cannot connect to the page server at {addr}: {error}")]
    Connect { addr: String, error: io::Error },

    /// A network read or write failed (including timeouts).
    #[error("connection to the page server at {addr} failed while {during}: {error}")]
    Net {
        addr: String,
        during: String,
        error: io::Error,
    },

    /// The server did not answer in time.
    #[error("the page server at {addr} did not answer in time while {during}: check that it is running and reachable")]
    Timeout { addr: String, during: String },

    /// The peer closed the connection in the middle of a message.
    #[error("the page server at {addr} closed the connection while {during}: the server stopped or the network failed; retry")]
    Disconnected { addr: String, during: String },

    /// The peer does not speak this protocol at all.
    #[error("{addr} is not a stasis page server ({reason}): check the address")]
    NotAPageServer { addr: String, reason: String },

    /// Both sides speak the protocol, in different versions.
    #[error("the page server at {addr} speaks protocol version {theirs} but this stasis speaks version {ours}: run the same stasis version on both machines")]
    VersionMismatch {
        addr: String,
        ours: u32,
        theirs: u32,
    },

    /// The server did not accept our token.
    #[error("the page server at {addr} refused the token: check --token-file (both sides must use the same token)")]
    TokenRefused { addr: String },

    /// The server could not prove that it knows the token.
    #[error("the page server at {addr} did not prove it knows the token: check --token-file on both sides, and that {addr} is the right server")]
    ServerNotAuthenticated { addr: String },

    /// The peer sent something that breaks the protocol.
    #[error("the page server at {addr} sent an invalid message while {during} ({reason}): run the same stasis version on both machines")]
    Protocol {
        addr: String,
        during: String,
        reason: String,
    },

    /// The server answered a request with an error.
    #[error("the page server at {addr} answered with an error while {during}: {message} ({code})")]
    Remote {
        addr: String,
        during: String,
        code: ErrorCode,
        message: String,
    },

    /// A run received from the server does not match its checksum.
    #[error("pages {vaddr:#x} (+{npages} pages) of {pack} in checkpoint {checkpoint} received from the page server at {addr} fail their checksum: the transfer was corrupted; retry")]
    RunChecksum {
        addr: String,
        checkpoint: u32,
        pack: String,
        vaddr: u64,
        npages: u32,
    },

    /// A file received from the server does not match its checksum.
    #[error("file {name} of checkpoint {checkpoint} received from the page server at {addr} fails its checksum: the transfer was corrupted; retry")]
    FileChecksum {
        addr: String,
        checkpoint: u32,
        name: String,
    },

    /// A request the client refuses to send (bad name, too large, ...).
    #[error("invalid request {during}: {reason}")]
    BadRequest { during: String, reason: String },

    /// A local file operation of the client (mirror, fill) failed.
    #[error("cannot {action} {}: {error}", .path.display())]
    Local {
        action: &'static str,
        path: PathBuf,
        error: io::Error,
    },

    /// TLS could not be set up with the server (another token is
    /// [`PageServerError::TokenRefused`] instead).
    #[error("cannot set up TLS with the page server at {addr}: {error}")]
    Tls {
        addr: String,
        error: crate::tls::TlsError,
    },

    /// The mirror destination already holds something.
    #[error("{} already exists and is not an empty directory: pass a new or empty directory to mirror into", .path.display())]
    DestNotEmpty { path: PathBuf },

    /// The local mirror fails validation with the image format reader.
    #[error("the mirror in {} is not a valid image: {error}", .dir.display())]
    BadMirror { dir: PathBuf, error: ImageError },
}

impl PageServerError {
    /// `map_err` helper for local file operations.
    pub(crate) fn local(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> PageServerError {
        let path = path.into();
        move |error| PageServerError::Local {
            action,
            path,
            error,
        }
    }

    /// Classifies a network I/O error: an end of stream in the middle of a
    /// message is a disconnection, anything else keeps its cause.
    pub(crate) fn net(addr: &str, during: &str, error: io::Error) -> PageServerError {
        match error.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => PageServerError::Disconnected {
                addr: addr.to_string(),
                during: during.to_string(),
            },
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => PageServerError::Timeout {
                addr: addr.to_string(),
                during: during.to_string(),
            },
            _ => PageServerError::Net {
                addr: addr.to_string(),
                during: during.to_string(),
                error,
            },
        }
    }
}
