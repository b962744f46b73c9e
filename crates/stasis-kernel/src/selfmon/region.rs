//! Memory an application protected: the one place that reads, writes and
//! changes the protection of it.
//!
//! An [`AppRegion`] is made from a raw pointer and a length that the
//! application vouches for (`stasis_protect`: the memory stays mapped and
//! writable until `stasis_unprotect` or `stasis_finalize`). That promise is
//! the safety contract of [`AppRegion::new`]; every method after it is safe.
//!
//! Protection changes act on whole pages: the *span* of a region is its
//! bytes rounded out to page boundaries, so pages shared with other data
//! (a heap chunk's header, a neighbouring array) are protected too. The
//! caller (the monitor) accounts for those pages.

use std::io;

use crate::{last_err, KernelError, Result};

/// Size of a base page.
pub const PAGE_SIZE: usize = 4096;

/// Size of a transparent huge page (x86-64, PMD level).
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// Bytes of this process an application handed over for checkpointing.
#[derive(Debug)]
pub struct AppRegion {
    addr: usize,
    len: usize,
}

impl AppRegion {
    /// Wraps `[addr, addr + len)`.
    ///
    /// # Safety
    /// The range must be memory of this process that stays mapped, readable
    /// and writable for as long as the returned value lives, and no Rust
    /// reference to it may exist (the program writes it through its own
    /// pointers meanwhile; we only ever copy bytes in and out).
    pub unsafe fn new(addr: usize, len: usize) -> Self {
        Self { addr, len }
    }

    /// First byte.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// First byte of the first page of the span.
    pub fn span_start(&self) -> usize {
        super::page_floor(self.addr)
    }

    /// Number of pages the region touches.
    pub fn span_pages(&self) -> usize {
        (super::page_ceil(self.addr + self.len) - self.span_start()) / PAGE_SIZE
    }

    /// Copies `dst.len()` bytes from offset `off` of the region into `dst`.
    /// Panics if the range leaves the region (a caller bug).
    pub fn copy_out(&self, off: usize, dst: &mut [u8]) {
        assert!(off.checked_add(dst.len()).is_some_and(|e| e <= self.len));
        // SAFETY: the range is inside the region (checked above), which is
        // mapped and readable by the contract of `new`; `dst` is a distinct
        // Rust buffer, so the two cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.addr + off) as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
    }

    /// Copies `src` to offset `off` of the region. The pages written must
    /// not be write-protected (the caller lifts monitoring first). Panics
    /// if the range leaves the region.
    pub fn copy_in(&self, off: usize, src: &[u8]) {
        assert!(off.checked_add(src.len()).is_some_and(|e| e <= self.len));
        // SAFETY: the range is inside the region, mapped and writable by
        // the contract of `new`; `src` is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), (self.addr + off) as *mut u8, src.len());
        }
    }
}

/// Changes the protection of `pages` pages at page-aligned `start`:
/// read-only (`writable == false`) or read-write.
///
/// Only ever called on spans of [`AppRegion`]s (whose memory the program
/// gave us) by the monitor; async-signal-safe (one syscall, no allocation),
/// so the `SIGSEGV` handler may call it.
pub fn set_writable(start: usize, pages: usize, writable: bool) -> Result<()> {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: mprotect changes page permissions only; the range is a span
    // of memory the application handed over (the caller's contract), so no
    // Rust object of ours lives there. Errors are reported, not ignored.
    let r = unsafe { libc::mprotect(start as *mut libc::c_void, pages * PAGE_SIZE, prot) };
    if r != 0 {
        return Err(KernelError::io(
            format!("mprotect [{start:#x}, +{pages} pages) writable={writable}"),
            last_err(),
        ));
    }
    Ok(())
}

/// Asks for `[start, start + len)` to be backed by transparent huge pages
/// (`MADV_HUGEPAGE`), then collapses it now (`MADV_COLLAPSE`). Returns the
/// error of the collapse (the caller reports it and carries on at 4 KiB).
pub fn collapse_huge(start: usize, len: usize) -> io::Result<()> {
    // SAFETY: madvise with these advices changes how pages are backed,
    // never their contents; the range is application memory handed over.
    let r = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
    if r != 0 {
        return Err(last_err());
    }
    // SAFETY: as above; MADV_COLLAPSE (25) copies the range into huge pages
    // synchronously and keeps the data.
    let r = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_COLLAPSE) };
    if r != 0 {
        return Err(last_err());
    }
    Ok(())
}

/// Takes back the huge-page advice of [`collapse_huge`] (`MADV_NOHUGEPAGE`),
/// so the next `mprotect` at 4 KiB splits the huge pages again.
pub fn release_huge(start: usize, len: usize) -> io::Result<()> {
    // SAFETY: madvise(MADV_NOHUGEPAGE) changes backing policy only.
    let r = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_NOHUGEPAGE) };
    if r != 0 {
        return Err(last_err());
    }
    Ok(())
}
