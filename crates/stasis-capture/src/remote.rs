//! A frozen thread as the kernel seam, [`stasis_kernel::remote::Remote`]:
//! syscalls run inside the process, its memory, a scratch page (trackers
//! arm through it too).
//!
//! The capture logic that runs syscalls inside a process (remote state,
//! userfaultfds) takes a `&mut dyn Remote`, so its decisions are
//! unit-tested with [`stasis_kernel::remote::Recorder`].

use stasis_kernel::escape::BATCH_ENTRY;
use stasis_kernel::mem::ProcessMemory;
use stasis_kernel::remote::{Remote, Syscall, BATCH_TABLE};
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
    /// The signal a batch ends with (`None`: no batches, one stop per
    /// syscall). See [`batch_signal`].
    batch_sig: Option<i32>,
}

/// A signal the batch code can end with: one the process does not catch
/// whose default action is to ignore it (SIGURG, else SIGWINCH), from
/// `SigCgt` of its `status`. `None` if it catches both.
pub fn batch_signal(status: &str) -> Option<i32> {
    let caught = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())?;
    [libc::SIGURG, libc::SIGWINCH]
        .into_iter()
        .find(|&s| caught & (1u64 << (s - 1)) == 0)
}

impl<'a> ThreadRemote<'a> {
    /// Syscalls only (no memory access, no scratch page).
    pub fn new(t: &'a mut FrozenThread) -> Self {
        Self {
            tracee: &mut t.tracee,
            base: &t.orig_regs,
            mem: None,
            scratch: 0,
            batch_sig: None,
        }
    }

    /// Syscalls, the process's memory, and the scratch page at `scratch`.
    pub fn with_memory(t: &'a mut FrozenThread, mem: &'a ProcessMemory, scratch: u64) -> Self {
        Self {
            tracee: &mut t.tracee,
            base: &t.orig_regs,
            mem: Some(mem),
            scratch,
            batch_sig: None,
        }
    }

    /// Runs batches in one stop of the thread, ending them with `sig`
    /// (from [`batch_signal`]; `None` keeps one stop per syscall).
    pub fn batching(mut self, sig: Option<i32>) -> Self {
        self.batch_sig = sig;
        self
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

    fn batch(&mut self, calls: &[Syscall]) -> Result<Vec<u64>, KernelError> {
        let (Some(sig), Some(mem), true) = (
            self.batch_sig,
            self.mem,
            self.tracee.hatch().is_some() && self.scratch != 0,
        ) else {
            return stasis_kernel::remote::one_by_one(self, calls);
        };
        let per = (SCRATCH_LEN - BATCH_TABLE) / BATCH_ENTRY;
        let table = self.scratch + BATCH_TABLE as u64;
        let mut out = Vec::with_capacity(calls.len());
        for chunk in calls.chunks(per) {
            let mut t = Vec::with_capacity(chunk.len() * BATCH_ENTRY);
            for c in chunk {
                t.extend_from_slice(&c.nr.to_le_bytes());
                for a in c.args {
                    t.extend_from_slice(&a.to_le_bytes());
                }
                t.extend_from_slice(&(-1i64).to_le_bytes());
            }
            mem.write(table, &t)?;
            self.tracee
                .syscall_batch(self.base, table, chunk.len(), sig)?;
            mem.read(table, &mut t)?;
            for (c, e) in chunk.iter().zip(t.chunks_exact(BATCH_ENTRY)) {
                let r = i64::from_le_bytes(e[56..64].try_into().unwrap_or([0; 8]));
                if (-4095..0).contains(&r) {
                    return Err(KernelError::RemoteSyscall {
                        name: c.name,
                        pid: self.tracee.pid(),
                        source: std::io::Error::from_raw_os_error(
                            i32::try_from(-r).unwrap_or(libc::EIO),
                        ),
                    });
                }
                out.push(stasis_kernel::sarg(r));
            }
        }
        Ok(out)
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
