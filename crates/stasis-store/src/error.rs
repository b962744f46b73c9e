//! The one error enum of the storage layer.

use std::path::PathBuf;

/// What went wrong reaching or using a checkpoint store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "{url} is not a valid store URL: {reason} (expected s3://BUCKET[/PREFIX] or a directory)"
    )]
    BadUrl { url: String, reason: String },
    #[error("configuring the S3 client for {url}: {source} (check AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_ALLOW_HTTP)")]
    Config {
        url: String,
        #[source]
        source: Box<object_store::Error>,
    },
    #[error("cannot reach the object store at {endpoint} ({action} {key}): {detail}; is the server running, and is AWS_ENDPOINT_URL right (AWS_ALLOW_HTTP=true for http://)?")]
    Unreachable {
        endpoint: String,
        action: &'static str,
        key: String,
        detail: String,
    },
    #[error("the object store at {endpoint} refused the credentials ({action} {key}): {detail}; check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")]
    Credentials {
        endpoint: String,
        action: &'static str,
        key: String,
        detail: String,
    },
    #[error("bucket {bucket} does not exist at {endpoint}: create it first")]
    NoBucket { endpoint: String, bucket: String },
    #[error("object {key} is missing from {url} ({action}): deleted while in use, or the store was changed by hand")]
    Missing {
        url: String,
        action: &'static str,
        key: String,
    },
    #[error("checkpoint {checkpoint} of {url} was committed concurrently by another dump")]
    CommitRace { url: String, checkpoint: u32 },
    #[error("object store error at {endpoint} ({action} {key}): {source}")]
    Remote {
        endpoint: String,
        action: &'static str,
        key: String,
        #[source]
        source: Box<object_store::Error>,
    },
    #[error("{path}: {action}: {source}")]
    Local {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("object {key} of {url} is damaged or was tampered with: {reason}")]
    Damaged {
        url: String,
        key: String,
        reason: String,
    },
    #[error("commit record {key} of {url} is unreadable: {reason}")]
    BadRecord {
        url: String,
        key: String,
        reason: String,
    },
    #[error("checkpoint {checkpoint} of {url} is encrypted: give the key with --encrypt-key-file")]
    NeedKey { url: String, checkpoint: u32 },
    #[error(
        "the key in {key_file} is not the key checkpoint {checkpoint} of {url} was encrypted with"
    )]
    WrongKey {
        url: String,
        key_file: PathBuf,
        checkpoint: u32,
    },
    #[error("checkpoint {checkpoint} of {url} is encrypted to age recipients: give an identity file with --decrypt-identity")]
    NeedIdentity { url: String, checkpoint: u32 },
    #[error("none of the identities in {files} is a recipient of checkpoint {checkpoint} of {url}: give the identity file of one of the recipients it was dumped with")]
    WrongIdentity {
        url: String,
        files: String,
        checkpoint: u32,
    },
    #[error("{origin}: {reason}")]
    BadRecipient { origin: String, reason: String },
    #[error("identity file {path}: {reason} (it must hold age identities, AGE-SECRET-KEY-1... lines, as age-keygen writes)")]
    BadIdentity { path: PathBuf, reason: String },
    #[error("key file {path}: {reason} (it must hold a 32-byte key: raw, or as 64 hex digits, or base64)")]
    BadKey { path: PathBuf, reason: String },
    #[error("{url} has no checkpoint {checkpoint} (committed: {available:?})")]
    NoSuchCheckpoint {
        url: String,
        checkpoint: u32,
        available: Vec<u32>,
    },
    #[error("{url} has no committed checkpoint")]
    Empty { url: String },
    #[error("the download from {url} stopped: {why}")]
    DownloadStopped { url: String, why: &'static str },
    #[error("checkpoint {checkpoint} of {url} needs its parent {parent}, which is not committed")]
    BrokenChain {
        url: String,
        checkpoint: u32,
        parent: u32,
    },
    #[error(
        "checkpoint not committed to {url}: {held} replica(s) hold it, {needed} needed ({detail})"
    )]
    Replicas {
        url: String,
        held: usize,
        needed: usize,
        detail: String,
    },
    #[error(transparent)]
    Image(#[from] stasis_image::ImageError),
}

impl StoreError {
    pub(crate) fn local(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.into();
        move |source| StoreError::Local {
            action,
            path,
            source,
        }
    }
}
