//! A file mapped shared into this process and written as persistent
//! memory: stores, then each written cache line written back (`clflush`)
//! and a store fence (`sfence`), as the ACCK paper writes to NVM. On a DAX
//! file system this is what makes the data durable; on tmpfs (this
//! machine) it costs what it would and `msync` adds nothing.

use std::fs::File;
use std::os::fd::AsRawFd;

use crate::{last_err, KernelError, Result};

/// Size of a cache line.
pub const CACHE_LINE: usize = 64;

/// A file mapped shared, read-write, for its whole length.
#[derive(Debug)]
pub struct PmemMap {
    addr: usize,
    len: usize,
    _file: File,
}

// SAFETY: the mapping is plain memory owned by this value; access goes
// through `&self`/`&mut self` methods, so Rust's borrow rules serialise it.
unsafe impl Send for PmemMap {}

impl PmemMap {
    /// Maps `file` (already `len` bytes long) shared, read-write.
    pub fn map(file: File, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(KernelError::io(
                "mmap of an empty file",
                std::io::ErrorKind::InvalidInput.into(),
            ));
        }
        // SAFETY: a new shared mapping of a file we own, at an address the
        // kernel picks: it aliases no Rust object.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(KernelError::io(format!("mmap of {len} bytes"), last_err()));
        }
        Ok(Self {
            addr: p as usize,
            len,
            _file: file,
        })
    }

    /// Length of the mapping.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: `map` refuses that).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `addr..addr+len` is our live mapping; `&self` forbids
        // writes through `self` meanwhile.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// The mapped bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }

    /// Writes back every cache line of `[off, off + len)` and fences:
    /// after this returns the stores before it are persistent.
    pub fn persist(&self, off: usize, len: usize) {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.len));
        let start = (self.addr + off) & !(CACHE_LINE - 1);
        let end = self.addr + off + len;
        let mut p = start;
        while p < end {
            // SAFETY: `p` points into our mapping (checked range, rounded
            // down to a line boundary that is still inside the page);
            // clflush (SSE2, always present on x86-64) only writes back.
            unsafe { std::arch::x86_64::_mm_clflush(p as *const u8) };
            p += CACHE_LINE;
        }
        // SAFETY: sfence has no memory-safety preconditions.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
}

impl Drop for PmemMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference
        // into it outlives `self`.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}
