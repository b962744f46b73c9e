//! Errors of the kernel layer.

use std::io;

/// A kernel facility failed; each variant names the operation and the target.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("process {pid} does not exist (it may have exited)")]
    NoSuchProcess { pid: i32 },
    #[error("cannot trace process {pid} (run stasis as root or with CAP_SYS_PTRACE, and check that no debugger is attached)")]
    Seize {
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("ptrace {op} on thread {pid} failed")]
    Ptrace {
        op: &'static str,
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("waiting for thread {pid} failed")]
    Wait {
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("process {pid} died while stasis was working on it ({how})")]
    Died {
        pid: i32,
        how: String,
        /// The raw wait status (collected by stasis: for a child of stasis,
        /// it is reaped).
        status: i32,
    },
    #[error("thread {pid} stopped unexpectedly ({what}) during {during}")]
    UnexpectedStop {
        pid: i32,
        what: String,
        during: &'static str,
    },
    #[error("no `syscall` instruction found in process {pid}'s vDSO or code: cannot run remote syscalls")]
    NoSyscallInsn { pid: i32 },
    #[error("remote {name} in process {pid} failed")]
    RemoteSyscall {
        name: &'static str,
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("reading memory of process {pid} at {addr:#x} (+{len:#x}) failed")]
    ReadMem {
        pid: i32,
        addr: u64,
        len: u64,
        #[source]
        source: io::Error,
    },
    #[error("writing memory of process {pid} at {addr:#x} (+{len:#x}) failed")]
    WriteMem {
        pid: i32,
        addr: u64,
        len: u64,
        #[source]
        source: io::Error,
    },
    #[error("{what} failed")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("the kernel does not support {feature}: {why}")]
    Unsupported { feature: &'static str, why: String },
}

impl KernelError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        KernelError::Io {
            what: what.into(),
            source,
        }
    }
}
