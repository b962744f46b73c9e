//! Errors of the cluster agent and coordinator.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{during} with {peer}: {source}")]
    Net {
        peer: String,
        during: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("cannot reach the agent at {peer}: {source} (is `stasis agent --listen {peer}` running there?)")]
    Connect {
        peer: String,
        #[source]
        source: io::Error,
    },
    #[error("{peer} closed the connection")]
    Closed { peer: String },
    #[error("{peer} broke the cluster protocol: {reason}")]
    Protocol { peer: String, reason: String },
    #[error("{peer} speaks version {theirs} of the cluster protocol, this stasis {ours}: run the same stasis on every host")]
    Version {
        peer: String,
        ours: u32,
        theirs: u32,
    },
    #[error("authentication with {peer} failed: {why}")]
    Auth { peer: String, why: String },
    #[error("{peer}: {message}")]
    Peer { peer: String, message: String },
    #[error("--target {0}")]
    BadTarget(String),
    #[error("job name {0:?} is not usable: use letters, digits, '-', '_' and '.' (up to 64)")]
    BadJob(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Image(#[from] stasis_image::ImageError),
    #[error(transparent)]
    Capture(#[from] stasis_capture::CaptureError),
    #[error(transparent)]
    Restore(#[from] stasis_restore::RestoreError),
    #[error("{0}")]
    Refused(String),
    #[error("the object store {url}: {message}")]
    Store { url: String, message: String },
}
