//! The remote half of the kernel seam ([`crate::seam`]): syscalls run
//! inside another process.
//!
//! [`Remote`] runs syscalls inside another process (a traced target or the
//! stub a restore builds) and reads and writes its memory. Restore, for
//! instance, decides *what* to do (which areas to map with which flags, how
//! to fill them, in which order fds come back) and asks a [`Remote`] to do
//! it inside the process being built. The real implementation drives a
//! traced stub with remote syscalls; [`Recorder`] records the calls and can
//! inject failures, so the decisions are unit-tested without root.

use crate::KernelError;

/// Something that runs syscalls inside the process being restored and
/// writes into its memory.
pub trait Remote {
    /// Runs syscall `nr` with `args`; a negative result is an error naming `name`.
    fn sys(&mut self, name: &'static str, nr: i64, args: &[u64]) -> Result<u64, KernelError>;
    /// Writes bytes into the process at `addr`.
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), KernelError>;
    /// Reads bytes of the process at `addr`.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), KernelError>;
    /// Start of a scratch area of [`Remote::scratch_len`] bytes inside the process.
    fn scratch(&self) -> u64;
    /// Size of the scratch area.
    fn scratch_len(&self) -> usize;

    /// Writes `s` NUL-terminated at scratch offset `off`; returns its address.
    fn put_cstr(&mut self, off: usize, s: &str) -> Result<u64, KernelError> {
        let mut b = Vec::with_capacity(s.len() + 1);
        b.extend_from_slice(s.as_bytes());
        b.push(0);
        if off + b.len() > self.scratch_len() || s.as_bytes().contains(&0) {
            return Err(KernelError::Io {
                what: format!("path too long or with NUL: {s:?}"),
                source: std::io::Error::from_raw_os_error(libc::ENAMETOOLONG),
            });
        }
        let a = self.scratch() + off as u64;
        self.write(a, &b)?;
        Ok(a)
    }

    /// Runs `calls` in order and returns their results; the first that
    /// fails is an error naming it. A remote that can runs them all in
    /// one stop of the thread ([`crate::Tracee::syscall_batch`]), so only
    /// syscalls that change nothing belong in a batch, and their outputs
    /// must lie in the first [`BATCH_TABLE`] bytes of the scratch area
    /// (the table goes after them). This default runs them one by one.
    fn batch(&mut self, calls: &[Syscall]) -> Result<Vec<u64>, KernelError> {
        one_by_one(self, calls)
    }

    /// Writes raw bytes at scratch offset `off`; returns their address.
    fn put(&mut self, off: usize, data: &[u8]) -> Result<u64, KernelError> {
        assert!(off + data.len() <= self.scratch_len(), "scratch overflow");
        let a = self.scratch() + off as u64;
        self.write(a, data)?;
        Ok(a)
    }
}

/// Where a batch's table starts in the scratch area: outputs of the
/// batched syscalls go below it.
pub const BATCH_TABLE: usize = 2048;

/// Runs `calls` one by one with [`Remote::sys`] (the default batch, and
/// the fallback of a remote that cannot batch).
pub fn one_by_one<R: Remote + ?Sized>(
    r: &mut R,
    calls: &[Syscall],
) -> Result<Vec<u64>, KernelError> {
    calls.iter().map(|c| r.sys(c.name, c.nr, &c.args)).collect()
}

/// One syscall of a [`Remote::batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Syscall {
    pub name: &'static str,
    pub nr: i64,
    pub args: [u64; 6],
}

impl Syscall {
    /// `nr(args...)`, the missing arguments 0.
    pub fn new(name: &'static str, nr: i64, args: &[u64]) -> Self {
        let mut a = [0u64; 6];
        for (d, s) in a.iter_mut().zip(args) {
            *d = *s;
        }
        Self { name, nr, args: a }
    }
}

/// One recorded call of a [`Recorder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Sys { name: &'static str, args: Vec<u64> },
    Write { addr: u64, data: Vec<u8> },
}

/// A fake [`Remote`] for tests: records calls, answers from a script.
#[derive(Debug, Default)]
pub struct Recorder {
    pub calls: Vec<Call>,
    /// Fail the call whose syscall name equals this, with this errno.
    pub fail_on: Option<(&'static str, i32)>,
    /// Value returned by `open`-like calls (fds handed out in sequence).
    pub next_fd: u64,
}

impl Recorder {
    /// Names of the recorded syscalls, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.calls
            .iter()
            .filter_map(|c| {
                if let Call::Sys { name, .. } = c {
                    Some(*name)
                } else {
                    None
                }
            })
            .collect()
    }

    /// The data of every recorded memory write, in order.
    pub fn writes(&self) -> Vec<Vec<u8>> {
        self.calls
            .iter()
            .filter_map(|c| {
                if let Call::Write { data, .. } = c {
                    Some(data.clone())
                } else {
                    None
                }
            })
            .collect()
    }

    /// Arguments of every recorded call to `name`.
    pub fn args_of(&self, name: &str) -> Vec<Vec<u64>> {
        self.calls
            .iter()
            .filter_map(|c| match c {
                Call::Sys { name: n, args } if *n == name => Some(args.clone()),
                _ => None,
            })
            .collect()
    }
}

impl Remote for Recorder {
    fn sys(&mut self, name: &'static str, nr: i64, args: &[u64]) -> Result<u64, KernelError> {
        self.calls.push(Call::Sys {
            name,
            args: args.to_vec(),
        });
        if let Some((n, errno)) = self.fail_on {
            if n == name {
                return Err(KernelError::RemoteSyscall {
                    name,
                    pid: 0,
                    source: std::io::Error::from_raw_os_error(errno),
                });
            }
        }
        Ok(match nr {
            libc::SYS_mmap => args[0],
            libc::SYS_open | libc::SYS_openat => {
                self.next_fd += 1;
                self.next_fd + 99
            }
            libc::SYS_preadv => self.last_iov_total(),
            libc::SYS_dup3 => args[1],
            _ => 0,
        })
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), KernelError> {
        self.calls.push(Call::Write {
            addr,
            data: data.to_vec(),
        });
        Ok(())
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), KernelError> {
        // The last write to this address, or zeros.
        let last = self.calls.iter().rev().find_map(|c| match c {
            Call::Write { addr: a, data } if *a == addr => Some(data.clone()),
            _ => None,
        });
        buf.fill(0);
        if let Some(d) = last {
            let n = d.len().min(buf.len());
            buf[..n].copy_from_slice(&d[..n]);
        }
        Ok(())
    }

    fn scratch(&self) -> u64 {
        0x1000_0000
    }

    fn scratch_len(&self) -> usize {
        28 * 1024
    }
}

impl Recorder {
    /// Total length described by the iovec array written last (what a
    /// successful `preadv` returns).
    fn last_iov_total(&self) -> u64 {
        self.calls
            .iter()
            .rev()
            .find_map(|c| match c {
                Call::Write { data, .. } if data.len() % 16 == 0 => Some(
                    data.chunks_exact(16)
                        .map(|c| u64::from_le_bytes(c[8..16].try_into().unwrap_or([0; 8])))
                        .sum(),
                ),
                _ => None,
            })
            .unwrap_or(0)
    }
}
