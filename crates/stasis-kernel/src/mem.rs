//! Reading and writing another process's memory.
//!
//! `process_vm_readv`/`process_vm_writev` copy between address spaces in one
//! syscall with many iovecs, but honour page protections; `/proc/PID/mem`
//! (opened once per process) reaches unreadable pages too (`FOLL_FORCE`).

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::{last_err, KernelError, Result};

/// Access to one process's memory.
#[derive(Debug)]
pub struct ProcessMemory {
    pid: i32,
    mem: File,
    /// Read through `/proc/PID/mem` only (see [`ProcessMemory::open_for_snapshot`]).
    file_only: bool,
}

impl ProcessMemory {
    /// Opens `/proc/PID/mem` read-write.
    pub fn open(pid: i32) -> Result<Self> {
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    KernelError::NoSuchProcess { pid }
                } else {
                    KernelError::io(format!("open /proc/{pid}/mem"), e)
                }
            })?;
        Ok(Self {
            pid,
            mem,
            file_only: false,
        })
    }

    /// Opens the memory of a copy-on-write snapshot (a forked child that
    /// shares its pages with its parent) for reading through
    /// `/proc/PID/mem` only: `process_vm_readv` pins the pages it reads,
    /// and pinning a shared anonymous page makes the kernel give the reader
    /// its own copy first, which would double the memory and the time.
    pub fn open_for_snapshot(pid: i32) -> Result<Self> {
        let mut m = Self::open(pid)?;
        m.file_only = true;
        Ok(m)
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Reads `buf.len()` bytes at `addr` with `process_vm_readv`, falling
    /// back to `/proc/PID/mem` for pages the process cannot read itself.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        if self.file_only {
            return self.read_forced(addr, buf);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &mut buf[done..];
            let local = libc::iovec {
                iov_base: rest.as_mut_ptr().cast(),
                iov_len: rest.len(),
            };
            let remote = libc::iovec {
                iov_base: (addr + done as u64) as *mut libc::c_void,
                iov_len: rest.len(),
            };
            // SAFETY: `local` describes a live, writable buffer of iov_len
            // bytes; `remote` is only interpreted in the other process.
            let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
            if n <= 0 {
                // Unreadable (PROT_NONE, guard) or partially readable: finish
                // through /proc/PID/mem, which ignores protections.
                return self.read_forced(addr + done as u64, rest);
            }
            done += usize::try_from(n).unwrap_or(0);
        }
        Ok(())
    }

    /// Reads through `/proc/PID/mem` only.
    pub fn read_forced(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        self.mem
            .read_exact_at(buf, addr)
            .map_err(|source| KernelError::ReadMem {
                pid: self.pid,
                addr,
                len: buf.len() as u64,
                source,
            })
    }

    /// Writes `data` at `addr`, through `process_vm_writev` when possible and
    /// `/proc/PID/mem` for read-only pages.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        let local = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: data.len(),
        };
        // SAFETY: `local` describes a live buffer of iov_len bytes that the
        // kernel only reads; `remote` is interpreted in the other process.
        let n = unsafe { libc::process_vm_writev(self.pid, &local, 1, &remote, 1, 0) };
        if usize::try_from(n).ok() == Some(data.len()) {
            return Ok(());
        }
        let _ = last_err();
        self.mem
            .write_all_at(data, addr)
            .map_err(|source| KernelError::WriteMem {
                pid: self.pid,
                addr,
                len: data.len() as u64,
                source,
            })
    }

    /// Reads `n` little-endian words at `addr`.
    pub fn read_u64s(&self, addr: u64, n: usize) -> Result<Vec<u64>> {
        let mut bytes = vec![0u8; n * 8];
        self.read(addr, &mut bytes)?;
        Ok(le_u64s(&bytes))
    }
}

/// `bytes` as little-endian words (a short tail is dropped).
pub fn le_u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect()
}

/// Reads many ranges of another process into `buf` (laid out back to back)
/// with one `process_vm_readv` per batch of up to 1024 iovecs. Used by the
/// dumper on its hot path. Falls back to per-range reads on a short read.
pub fn read_ranges(mem: &ProcessMemory, ranges: &[(u64, usize)], buf: &mut [u8]) -> Result<()> {
    let total: usize = ranges.iter().map(|r| r.1).sum();
    assert!(buf.len() >= total, "read_ranges: buffer too small");
    let mut off = 0usize;
    if mem.file_only {
        for &(a, l) in ranges {
            mem.read_forced(a, &mut buf[off..off + l])?;
            off += l;
        }
        return Ok(());
    }
    for batch in ranges.chunks(1024) {
        let bytes: usize = batch.iter().map(|r| r.1).sum();
        let local = libc::iovec {
            iov_base: buf[off..].as_mut_ptr().cast(),
            iov_len: bytes,
        };
        let remote: Vec<libc::iovec> = batch
            .iter()
            .map(|&(a, l)| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: l,
            })
            .collect();
        // SAFETY: `local` covers `bytes` writable bytes of `buf` (checked by
        // the assert above); the remote iovecs are interpreted in the target.
        let n = unsafe {
            libc::process_vm_readv(
                mem.pid(),
                &local,
                1,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        if usize::try_from(n).ok() != Some(bytes) {
            let mut o = off;
            for &(a, l) in batch {
                mem.read(a, &mut buf[o..o + l])?;
                o += l;
            }
        }
        off += bytes;
    }
    Ok(())
}
