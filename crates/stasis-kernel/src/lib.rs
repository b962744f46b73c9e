//! Safe wrappers over the kernel facilities Stasis uses.
//!
//! Everything above this crate handles [`std::os::fd::OwnedFd`], typed
//! addresses and [`Tracee`] handles, never raw syscall results. The raw ABI
//! (ioctl numbers, structures) comes from `stasis-sys`.
//!
//! * [`ptrace`]: seize / interrupt / registers / signal state of a thread,
//!   and remote syscalls executed by a stopped tracee.
//! * [`mem`]: `process_vm_readv` / `process_vm_writev` and `/proc/PID/mem`.
//! * [`pidfd`]: `pidfd_open` and `pidfd_getfd`.
//! * [`uffd`]: userfaultfd creation and the API handshake.
//! * [`pagemap`]: `PAGEMAP_SCAN` and the `/proc/PID/pagemap` fallback.
//! * [`probe`]: a one-shot probe of what this kernel offers (`stasis check`).
//! * [`launch`]: closing inherited descriptors, forwarding signals to a job.
//! * [`tty`]: the ioctls of pseudo-terminal pairs.

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

pub mod bpf;
pub mod child;
pub mod error;
pub mod escape;
pub mod fdops;
pub mod launch;
pub mod mem;
pub mod mqueue;
pub mod ns;
pub mod pagemap;
pub mod pidfd;
pub mod priority;
pub mod probe;
pub mod procfs;
pub mod ptrace;
pub mod remote;
pub mod robust_list;
pub mod rtnl;
pub mod sched;
pub mod scm;
pub mod seam;
pub mod selfmon;
pub mod sock;
pub mod sockdiag;
pub mod sysvipc;
pub mod sysvshm;
pub mod tcpdiag;
pub mod tty;
pub mod tun;
pub mod uffd;
pub mod uffd_remote;

pub use error::KernelError;
pub use ptrace::{StopKind, Tracee};
pub use stasis_sys::UserRegs;

/// Abstract unix socket name a lazy restore's filler holds (bound, as a
/// datagram socket) for each process whose pages are still arriving: a
/// dump of that process waits until it is gone, since the pages not yet
/// there would be missing from the image.
pub fn lazy_fill_socket_name(pid: i32) -> String {
    format!("stasis-lazy-fill/{pid}")
}

/// A signed value as a 64-bit register or syscall argument (two's
/// complement, as the kernel ABI passes it).
#[allow(clippy::cast_sign_loss)]
pub const fn sarg(v: i64) -> u64 {
    v as u64
}

/// A 64-bit register or syscall argument as the signed value it holds.
#[allow(clippy::cast_possible_wrap)]
pub const fn sarg_i64(v: u64) -> i64 {
    v as i64
}

/// Result alias of this crate.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;

/// The last OS error as an `io::Error`.
pub(crate) fn last_err() -> std::io::Error {
    std::io::Error::last_os_error()
}
