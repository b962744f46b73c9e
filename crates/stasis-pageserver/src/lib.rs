//! A page server for Stasis images, and its client.
//!
//! The [`Server`] serves one image directory, read-only, over TCP to clients
//! that hold the same secret token. A [`Client`] resolves checkpoints and
//! their chains, lists and reads files, and reads runs of pages (pipelined,
//! each checked against its checksum). [`mirror`] builds a local image
//! directory from a server, either complete or as sparse packs whose runs
//! [`fill_runs`] fetches on demand. The wire protocol is specified in
//! [`protocol`].
//!
//! ```no_run
//! # fn main() -> Result<(), stasis_pageserver::PageServerError> {
//! use stasis_pageserver::{mirror, MirrorData};
//! let m = mirror("10.0.0.5:7070", b"secret", None, "/tmp/job".as_ref(), MirrorData::Full, None)?;
//! println!("mirrored checkpoint {} (chain {:?})", m.checkpoint, m.chain);
//! # Ok(()) }
//! ```

mod client;
mod error;
mod mirror;
pub mod protocol;
mod server;
mod tempmirror;
pub mod tls;

pub use client::{Client, FileInfo, Skeleton, CONNECT_TIMEOUT, IO_TIMEOUT};
pub use error::PageServerError;
pub use mirror::{fill_runs, mirror, Mirror, MirrorData};
pub use server::{Server, ServerConfig};
pub use tempmirror::{mirror_to_temp, remove_stale_mirrors, TempMirror, TEMP_MIRROR_PREFIX};
