//! One process being rebuilt: a traced stub and the remote syscalls run in it.

use stasis_kernel::mem::ProcessMemory;
use stasis_kernel::{KernelError, Tracee, UserRegs};

use crate::remote::Remote;
use crate::Result;

/// Size of the control area: one code page and scratch pages.
pub(crate) const CTL_SIZE: u64 = 8 * 4096;
/// End of the user address range.
pub(crate) const TASK_TOP: u64 = 0x7fff_ffff_f000;

/// One process being rebuilt: its threads (the main one first, the others
/// as they are created), and which of them runs the next remote syscall.
pub(crate) struct Proc {
    /// PID in the process's own namespace (the image's).
    pub pid: i32,
    pub t: Tracee,
    pub base: UserRegs,
    pub threads: Vec<(Tracee, UserRegs)>,
    /// `None`: the main thread; `Some(i)`: `threads[i]`.
    pub cur: Option<usize>,
    pub mem: ProcessMemory,
    pub ctl: u64,
    /// Whether the process still exists as a traced stub (zombies exit).
    pub live: bool,
}

impl Remote for Proc {
    fn sys(&mut self, name: &'static str, nr: i64, args: &[u64]) -> Result<u64, KernelError> {
        match self.cur {
            None => self.t.syscall(&self.base, name, nr, args),
            Some(i) => {
                let (t, base) = &mut self.threads[i];
                t.syscall(base, name, nr, args)
            }
        }
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), KernelError> {
        self.mem.write(addr, data)
    }
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), KernelError> {
        self.mem.read(addr, buf)
    }
    fn scratch(&self) -> u64 {
        self.ctl + 4096
    }
    fn scratch_len(&self) -> usize {
        usize::try_from(CTL_SIZE - 4096).unwrap_or(0)
    }
}

impl Proc {
    /// `pid` is the process's PID in its own namespace (the image's);
    /// `t.pid()` is the same process as stasis sees it.
    pub fn adopt(t: Tracee, ctl: u64, pid: i32) -> Result<Self> {
        let mem = ProcessMemory::open(t.pid())?;
        let mut base = t.regs()?;
        // The stub's own stack pointer must not look like it is on the
        // restored sigaltstack (sigaltstack() would refuse).
        base.rsp = 0;
        let mut p = Proc {
            pid,
            t,
            base,
            threads: Vec::new(),
            cur: None,
            mem,
            ctl,
            live: true,
        };
        if ctl != 0 {
            p.t.set_syscall_insn(ctl);
        }
        Ok(p)
    }
}
