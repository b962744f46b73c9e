//! Errors of saving and of rebuilding kernel objects: the one definition of
//! these messages. `stasis_capture::CaptureError::Save` and
//! `stasis_restore::RestoreError::Object` wrap them transparently (the
//! conversions live next to those types), and the capture builds its own
//! "cannot dump" and `/proc` errors as [`SaveError`] too.

use stasis_kernel::KernelError;

/// Saving a kernel object failed.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    #[error("cannot dump process {pid}: {what}")]
    Unsupported { pid: i32, what: String },
    #[error("reading /proc/{pid}/{file} failed")]
    Proc {
        pid: i32,
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("unexpected content in /proc/{pid}/{file}: {what}")]
    ProcFormat {
        pid: i32,
        file: String,
        what: String,
    },
    #[error("reading the POSIX shared memory object {path} (--shm-file) failed")]
    ShmFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// Rebuilding a kernel object failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("this image cannot be restored here: {0}")]
    Incompatible(String),
    #[error("cannot open {path} ({what}); the file must exist at the same path as at dump time")]
    File {
        path: String,
        what: String,
        #[source]
        source: KernelError,
    },
    #[error("restore step failed: {what}")]
    Step {
        what: String,
        #[source]
        source: KernelError,
    },
    #[error("port {port} of fd {fd} is taken by another process: stop it (or free the port), then restore again")]
    PortTaken { fd: i32, port: u16 },
    #[error("fd {fd}: cannot take back its {what}: the file is locked by another process; stop it, then restore again")]
    Locked {
        fd: i32,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("socket step failed: {what}")]
    Socket {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("restore step failed: {what}")]
    Spawn {
        what: String,
        #[source]
        source: stasis_kernel::child::SpawnError,
    },
    #[error("memory layout could not be rebuilt: {0}")]
    Layout(String),
    #[error("the image is inconsistent: {0}; the restore was abandoned and nothing was started")]
    Inconsistent(String),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// Saved content (of a deleted file, memfd or shared memory object)
    /// could not be read from the image.
    #[error("reading the saved content of a file: {0}")]
    Content(#[from] stasis_image::ImageError),
}

/// A failed step whose cause is an `io::Error` from `op` (a syscall name).
pub(crate) fn io_step(
    what: impl Into<String>,
    op: &str,
) -> impl FnOnce(std::io::Error) -> RestoreError {
    let what = what.into();
    let op = op.to_string();
    move |source| RestoreError::Step {
        what,
        source: KernelError::Io { what: op, source },
    }
}

/// A failed step whose cause is a [`KernelError`].
pub(crate) fn step(what: impl Into<String>) -> impl FnOnce(KernelError) -> RestoreError {
    let what = what.into();
    move |source| RestoreError::Step { what, source }
}

/// A file that could not be opened (or reopened: `op`).
pub(crate) fn file_err(
    path: impl Into<String>,
    what: impl Into<String>,
    op: &str,
) -> impl FnOnce(std::io::Error) -> RestoreError {
    let (path, what, op) = (path.into(), what.into(), op.to_string());
    move |source| RestoreError::File {
        path,
        what,
        source: KernelError::Io { what: op, source },
    }
}

/// A syscall `op` that failed making a new object (as the kernel layer
/// reports it).
pub(crate) fn os_err(op: &str) -> impl FnOnce(std::io::Error) -> RestoreError {
    let op = op.to_string();
    move |source| RestoreError::Kernel(KernelError::Io { what: op, source })
}
