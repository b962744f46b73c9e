//! A frozen thread as the kernel seam, [`stasis_kernel::remote::Remote`]:
//! syscalls run inside the process, its memory, a scratch page (trackers
//! arm through it too).
//!
//! The capture logic that runs syscalls inside a process (remote state,
//! userfaultfds) takes a `&mut dyn Remote`, so its decisions are
//! unit-tested with [`stasis_kernel::remote::Recorder`].

use stasis_kernel::mem::ProcessMemory;
use stasis_kernel::remote::Remote;
use stasis_kernel::{KernelError, Tracee, UserRegs};

use crate::freeze::FrozenThread;

/// Length of the scratch page a dump maps in a process for the remote
/// syscalls that report through memory.
pub const SCRATCH_LEN: usize = 4096;

/// Runs syscalls in one frozen thread (from its frozen registers, through
/// its escape hatch if it has one), and reads and writes its process's
/// memory.
pub struct ThreadRemote<'a> {
    tracee: &'a mut Tracee,
    base: &'a UserRegs,
    mem: Option<&'a ProcessMemory>,
    scratch: u64,
}

impl<'a> ThreadRemote<'a> {
    /// Syscalls only (no memory access, no scratch page).
    pub fn new(t: &'a mut FrozenThread) -> Self {
        Self {
            tracee: &mut t.tracee,
            base: &t.orig_regs,
            mem: None,
            scratch: 0,
        }
    }

    /// Syscalls, the process's memory, and the scratch page at `scratch`.
    pub fn with_memory(t: &'a mut FrozenThread, mem: &'a ProcessMemory, scratch: u64) -> Self {
        Self {
            tracee: &mut t.tracee,
            base: &t.orig_regs,
            mem: Some(mem),
            scratch,
        }
    }

    fn mem(&self) -> Result<&'a ProcessMemory, KernelError> {
        self.mem.ok_or_else(|| KernelError::Io {
            what: format!(
                "memory of process {}: not opened for this remote",
                self.tracee.pid()
            ),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        })
    }
}

impl Remote for ThreadRemote<'_> {
    fn sys(&mut self, name: &'static str, nr: i64, args: &[u64]) -> Result<u64, KernelError> {
        self.tracee.syscall(self.base, name, nr, args)
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), KernelError> {
        self.mem()?.write(addr, data)
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), KernelError> {
        self.mem()?.read(addr, buf)
    }

    fn scratch(&self) -> u64 {
        self.scratch
    }

    fn scratch_len(&self) -> usize {
        SCRATCH_LEN
    }
}

/// Reads `n` little-endian words at `addr` of the process behind `r`.
pub fn read_u64s(r: &mut dyn Remote, addr: u64, n: usize) -> Result<Vec<u64>, KernelError> {
    let mut bytes = vec![0u8; n * 8];
    r.read(addr, &mut bytes)?;
    Ok(stasis_kernel::mem::le_u64s(&bytes))
}
