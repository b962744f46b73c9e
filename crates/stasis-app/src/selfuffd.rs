//! The `uffd` monitoring mode: a userfaultfd of this process registered in
//! write-protect mode with `WP_ASYNC` (the kernel resolves a write fault
//! itself: no signal, no thread, no round trip) and read back at each
//! checkpoint with `PAGEMAP_SCAN`, which reports the written pages and
//! protects them again in the same walk.

use stasis_kernel::pagemap::{Pagemap, ScanQuery};
use stasis_kernel::uffd::Userfaultfd;
use stasis_kernel::KernelError;
use stasis_sys as sys;

use stasis_kernel::selfmon::PAGE_SIZE;

/// The userfaultfd and pagemap of this process.
#[derive(Debug)]
pub struct SelfUffd {
    uffd: Userfaultfd,
    pagemap: Pagemap,
}

const FEATURES: u64 = sys::UFFD_FEATURE_WP_ASYNC | sys::UFFD_FEATURE_WP_UNPOPULATED;

fn errno(what: &str, e: i32) -> KernelError {
    KernelError::Io {
        what: what.to_string(),
        source: std::io::Error::from_raw_os_error(e),
    }
}

impl SelfUffd {
    /// Opens the userfaultfd (fails where the kernel lacks `WP_ASYNC`).
    pub fn open() -> Result<Self, KernelError> {
        let uffd = Userfaultfd::new(FEATURES)?;
        if uffd.features() & FEATURES != FEATURES {
            return Err(KernelError::Unsupported {
                feature: "userfaultfd WP_ASYNC",
                why: format!("granted features {:#x}", uffd.features()),
            });
        }
        let pagemap = Pagemap::open(i32::try_from(std::process::id()).unwrap_or(0))?;
        Ok(Self { uffd, pagemap })
    }

    /// Registers and write-protects `pages` pages at `start`.
    pub fn arm(&self, start: usize, pages: usize) -> Result<(), KernelError> {
        let len = (pages * PAGE_SIZE) as u64;
        self.uffd
            .register(start as u64, len, sys::UFFDIO_REGISTER_MODE_WP)?;
        self.protect(start, pages, true)
    }

    /// Sets or lifts the write-protection of a registered range.
    pub fn protect(&self, start: usize, pages: usize, on: bool) -> Result<(), KernelError> {
        let len = (pages * PAGE_SIZE) as u64;
        self.uffd
            .write_protect(start as u64, len, on)
            .map_err(|e| errno("UFFDIO_WRITEPROTECT", e))
    }

    /// The pages of `[start, +pages)` written since the last scan, as
    /// page-index runs relative to `start`; protects them again.
    pub fn take_written(
        &self,
        start: usize,
        pages: usize,
    ) -> Result<Vec<(usize, usize)>, KernelError> {
        let end = (start + pages * PAGE_SIZE) as u64;
        let got = self
            .pagemap
            .scan(start as u64, end, ScanQuery::written_and_rearm())?;
        Ok(got
            .iter()
            .map(|r| {
                let s = usize::try_from(r.start)
                    .unwrap_or(usize::MAX)
                    .saturating_sub(start)
                    / PAGE_SIZE;
                let e = usize::try_from(r.end)
                    .unwrap_or(usize::MAX)
                    .saturating_sub(start)
                    / PAGE_SIZE;
                (s, e.min(pages))
            })
            .collect())
    }
}
