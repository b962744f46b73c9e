//! The library's errors and the codes the C API returns for them.

use std::io;
use std::path::PathBuf;

use stasis_kernel::KernelError;

/// Success.
pub const STASIS_SUCCESS: i32 = 0;
/// `stasis_request_checkpoint`: the program was restored from the
/// checkpoint this call asked for (and goes on from there), a success.
pub const STASIS_RESTORED: i32 = 1;
/// `stasis_restart_test`: no complete version of that name.
pub const STASIS_NONE: i32 = -1;
/// The library is not initialised (`stasis_init` first).
pub const STASIS_ERR_NOT_INIT: i32 = -2;
/// `stasis_init` called twice without `stasis_finalize`.
pub const STASIS_ERR_ALREADY_INIT: i32 = -3;
/// An argument is invalid (null pointer, empty or bad name, negative version...).
pub const STASIS_ERR_INVALID: i32 = -4;
/// The region overlaps one already protected.
pub const STASIS_ERR_OVERLAP: i32 = -5;
/// No region has that id.
pub const STASIS_ERR_UNKNOWN_REGION: i32 = -6;
/// The checkpoint directory or file cannot be written or read.
pub const STASIS_ERR_IO: i32 = -7;
/// A checkpoint is damaged (checksum, truncated, broken chain).
pub const STASIS_ERR_DAMAGED: i32 = -8;
/// No such checkpoint version.
pub const STASIS_ERR_NOT_FOUND: i32 = -9;
/// The protected regions do not match the checkpoint's.
pub const STASIS_ERR_MISMATCH: i32 = -10;
/// The monitoring mode cannot work here.
pub const STASIS_ERR_MONITOR: i32 = -11;
/// A background checkpoint is still running (`stasis_checkpoint_wait`).
pub const STASIS_ERR_BUSY: i32 = -12;
/// `stasis_request_checkpoint`: the program is not running under `stasis run`.
pub const STASIS_ERR_NOT_UNDER_RUN: i32 = -13;
/// An internal error (a bug): the call failed, the program goes on.
pub const STASIS_ERR_INTERNAL: i32 = -14;
/// `stasis_request_checkpoint`: `stasis run` could not take the checkpoint
/// (the program goes on; the message says why).
pub const STASIS_ERR_CHECKPOINT_FAILED: i32 = -15;

/// Everything that can fail in the library.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("stasis is not initialised: call stasis_init first")]
    NotInit,
    #[error("stasis is already initialised: call stasis_finalize before stasis_init again")]
    AlreadyInit,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("region {id} [{addr:#x}, +{len}) overlaps region {other}")]
    Overlap {
        id: i32,
        addr: usize,
        len: usize,
        other: i32,
    },
    #[error("no protected region has id {0}")]
    UnknownRegion(i32),
    #[error("{what} {path} failed")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("checkpoint {path} is damaged: {why}")]
    Damaged { path: PathBuf, why: String },
    #[error("no checkpoint {name} version {version}")]
    NotFound { name: String, version: i32 },
    #[error("the protected regions do not match checkpoint {name} version {version}: {why}")]
    Mismatch {
        name: String,
        version: i32,
        why: String,
    },
    #[error("monitoring mode {mode} cannot be used here")]
    Monitor {
        mode: &'static str,
        #[source]
        source: KernelError,
    },
    #[error("a background checkpoint is still running: call stasis_checkpoint_wait first")]
    Busy,
    #[error("not running under `stasis run`: no transparent checkpoint can be requested")]
    NotUnderRun,
    #[error("internal error: {0}")]
    Internal(String),
    #[error("the requested checkpoint failed: {0}")]
    RequestFailed(String),
}

impl AppError {
    /// The C error code of this error.
    pub fn code(&self) -> i32 {
        match self {
            AppError::NotInit => STASIS_ERR_NOT_INIT,
            AppError::AlreadyInit => STASIS_ERR_ALREADY_INIT,
            AppError::Invalid(_) => STASIS_ERR_INVALID,
            AppError::Overlap { .. } => STASIS_ERR_OVERLAP,
            AppError::UnknownRegion(_) => STASIS_ERR_UNKNOWN_REGION,
            AppError::Io { .. } => STASIS_ERR_IO,
            AppError::Damaged { .. } => STASIS_ERR_DAMAGED,
            AppError::NotFound { .. } => STASIS_ERR_NOT_FOUND,
            AppError::Mismatch { .. } => STASIS_ERR_MISMATCH,
            AppError::Monitor { .. } => STASIS_ERR_MONITOR,
            AppError::Busy => STASIS_ERR_BUSY,
            AppError::NotUnderRun => STASIS_ERR_NOT_UNDER_RUN,
            AppError::Internal(_) => STASIS_ERR_INTERNAL,
            AppError::RequestFailed(_) => STASIS_ERR_CHECKPOINT_FAILED,
        }
    }

    /// An I/O error on `path`.
    pub fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| AppError::Io { what, path, source }
    }

    /// A damaged checkpoint file.
    pub fn damaged(path: impl Into<PathBuf>, why: impl Into<String>) -> Self {
        AppError::Damaged {
            path: path.into(),
            why: why.into(),
        }
    }

    /// The message with its causes, one after the other.
    pub fn full_message(&self) -> String {
        let mut s = self.to_string();
        let mut src = std::error::Error::source(self);
        while let Some(e) = src {
            s.push_str(": ");
            s.push_str(&e.to_string());
            src = e.source();
        }
        s
    }
}

/// The generic message of a code (`stasis_strerror`).
pub fn code_message(code: i32) -> &'static std::ffi::CStr {
    match code {
        STASIS_SUCCESS => c"success",
        STASIS_RESTORED => c"restored from the requested checkpoint",
        STASIS_NONE => c"no complete checkpoint of that name",
        STASIS_ERR_NOT_INIT => c"stasis is not initialised",
        STASIS_ERR_ALREADY_INIT => c"stasis is already initialised",
        STASIS_ERR_INVALID => c"invalid argument",
        STASIS_ERR_OVERLAP => c"the region overlaps a protected region",
        STASIS_ERR_UNKNOWN_REGION => c"no protected region has that id",
        STASIS_ERR_IO => c"the checkpoint directory or file cannot be written or read",
        STASIS_ERR_DAMAGED => c"the checkpoint is damaged",
        STASIS_ERR_NOT_FOUND => c"no such checkpoint version",
        STASIS_ERR_MISMATCH => c"the protected regions do not match the checkpoint",
        STASIS_ERR_MONITOR => c"the monitoring mode cannot be used here",
        STASIS_ERR_BUSY => c"a background checkpoint is still running",
        STASIS_ERR_NOT_UNDER_RUN => c"not running under `stasis run`",
        STASIS_ERR_INTERNAL => c"internal error",
        STASIS_ERR_CHECKPOINT_FAILED => c"the requested checkpoint failed",
        _ => c"unknown error code",
    }
}

/// Result alias of the library.
pub type Result<T, E = AppError> = std::result::Result<T, E>;
