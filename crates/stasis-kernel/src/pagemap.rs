//! Which pages of a process hold data: `PAGEMAP_SCAN` and its fallback.
//!
//! `PAGEMAP_SCAN` (Linux 6.7) is an ioctl on `/proc/PID/pagemap` that walks
//! page tables and returns compact *ranges* of pages whose categories match a
//! query (present, swapped, file-backed, zero-page, written...). One call may
//! stop early (`walk_end < end`) when the output vector fills up, so callers
//! loop. Where it is missing, [`Pagemap::read_entries`] reads the classic
//! 8-byte-per-page pagemap file.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use stasis_sys::{self as sys, PageRegion, PmScanArg};

use crate::{last_err, KernelError, Result};

/// A category query for [`Pagemap::scan`], in the kernel's terms: a page
/// matches if `(categories ^ inverted) & mask == mask` and, when `anyof` is
/// non-zero, `(categories ^ inverted) & anyof != 0`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScanQuery {
    pub flags: u64,
    pub inverted: u64,
    pub mask: u64,
    pub anyof: u64,
    pub return_mask: u64,
}

impl ScanQuery {
    /// Pages that hold private anonymous data: present or swapped, not a
    /// page-cache page and not the shared zero page. For a private file
    /// mapping these are exactly the copied-on-write pages.
    pub fn private_data() -> Self {
        let not = sys::PAGE_IS_FILE | sys::PAGE_IS_PFNZERO;
        Self {
            flags: 0,
            inverted: not,
            mask: not,
            anyof: sys::PAGE_IS_PRESENT | sys::PAGE_IS_SWAPPED,
            return_mask: sys::PAGE_IS_PRESENT | sys::PAGE_IS_SWAPPED,
        }
    }
}

impl ScanQuery {
    /// [`ScanQuery::private_data`] for an anonymous area, which holds no
    /// page-cache page: leaving `PAGE_IS_FILE` out of the query spares the
    /// kernel a page lookup per entry (it computes only the categories a
    /// query mentions), which is most of the walk's cost.
    pub fn anon_data() -> Self {
        Self {
            inverted: sys::PAGE_IS_PFNZERO,
            mask: sys::PAGE_IS_PFNZERO,
            ..Self::private_data()
        }
    }

    /// Pages written since they were last write-protected through a
    /// `WP_ASYNC` userfaultfd (a page that is not protected counts as
    /// written, so an area that loses protection reports everything).
    pub fn written() -> Self {
        Self {
            flags: 0,
            inverted: 0,
            mask: sys::PAGE_IS_WRITTEN,
            anyof: 0,
            return_mask: sys::PAGE_IS_WRITTEN,
        }
    }

    /// Pages mapped by a transparent huge page (`PAGE_IS_HUGE`).
    pub fn huge() -> Self {
        Self {
            flags: 0,
            inverted: 0,
            mask: sys::PAGE_IS_HUGE,
            anyof: 0,
            return_mask: sys::PAGE_IS_HUGE,
        }
    }

    /// Pages whose userfaultfd write-protection is set (not `WRITTEN`).
    /// (`WPALLOWED` is reported for `WP_ASYNC` registrations only.)
    pub fn wp_protected() -> Self {
        Self {
            flags: 0,
            inverted: sys::PAGE_IS_WRITTEN,
            mask: sys::PAGE_IS_WRITTEN,
            anyof: 0,
            return_mask: sys::PAGE_IS_WRITTEN,
        }
    }

    /// Like [`ScanQuery::written`], and write-protects what it reports in the
    /// same walk (re-arms tracking). Fails with `EPERM` on an area that is
    /// not registered with a `WP_ASYNC` userfaultfd, rather than skip it.
    pub fn written_and_rearm() -> Self {
        Self {
            flags: sys::PM_SCAN_WP_MATCHING | sys::PM_SCAN_CHECK_WPASYNC,
            ..Self::written()
        }
    }
}

/// `/proc/PID/pagemap` of one process.
#[derive(Debug)]
pub struct Pagemap {
    pid: i32,
    file: File,
}

impl Pagemap {
    /// Opens `/proc/PID/pagemap`.
    pub fn open(pid: i32) -> Result<Self> {
        let file = File::open(format!("/proc/{pid}/pagemap")).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                KernelError::NoSuchProcess { pid }
            } else {
                KernelError::io(format!("open /proc/{pid}/pagemap"), e)
            }
        })?;
        Ok(Self { pid, file })
    }

    /// Returns the ranges in `[start, end)` matching `q`, merged where
    /// adjacent, looping until the whole range is walked.
    pub fn scan(&self, start: u64, end: u64, q: ScanQuery) -> Result<Vec<PageRegion>> {
        let mut out: Vec<PageRegion> = Vec::new();
        let mut vec = vec![PageRegion::default(); 1024];
        let mut cur = start;
        while cur < end {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                flags: q.flags,
                start: cur,
                end,
                walk_end: 0,
                vec: vec.as_mut_ptr() as u64,
                vec_len: vec.len() as u64,
                max_pages: 0,
                category_inverted: q.inverted,
                category_mask: q.mask,
                category_anyof_mask: q.anyof,
                return_mask: q.return_mask,
            };
            // SAFETY: PAGEMAP_SCAN reads `arg` and writes at most `vec_len`
            // page_region entries into `vec`, which is live and that long.
            let n = unsafe { libc::ioctl(self.file.as_raw_fd(), sys::PAGEMAP_SCAN as _, &mut arg) };
            if n < 0 {
                let e = last_err();
                if e.raw_os_error() == Some(libc::ENOTTY)
                    || e.raw_os_error() == Some(libc::EINVAL) && cur == start
                {
                    return Err(KernelError::Unsupported {
                        feature: "PAGEMAP_SCAN",
                        why: e.to_string(),
                    });
                }
                return Err(KernelError::io(
                    format!("PAGEMAP_SCAN on process {} [{cur:#x}, {end:#x})", self.pid),
                    e,
                ));
            }
            let n = usize::try_from(n).unwrap_or(0).min(vec.len());
            for r in &vec[..n] {
                // A call may stop inside a huge page and the next one report
                // it again: keep regions strictly increasing.
                let mut r = *r;
                if let Some(last) = out.last() {
                    r.start = r.start.max(last.end);
                }
                if r.start >= r.end {
                    continue;
                }
                match out.last_mut() {
                    Some(last) if last.end == r.start && last.categories == r.categories => {
                        last.end = r.end
                    }
                    _ => out.push(r),
                }
            }
            if arg.walk_end <= cur {
                break;
            }
            cur = arg.walk_end;
        }
        Ok(out)
    }

    /// Drops from `regions` (a [`ScanQuery::private_data`] result) the
    /// pages that `PAGEMAP_SCAN` reports as swapped but that hold no data:
    /// PTE markers, which look like swap entries (of the last swap type,
    /// `SWP_PTE_MARKER`): the userfaultfd write-protect markers that
    /// `WP_UNPOPULATED` puts in empty page-table entries, and guard pages
    /// (`MADV_GUARD_INSTALL`), which are returned apart, as page ranges.
    /// Only swapped regions are re-read, from the classic pagemap, where the
    /// swap type is visible.
    pub fn drop_markers(&self, regions: Vec<PageRegion>) -> Result<(Vec<PageRegion>, Ranges)> {
        let mut out: Vec<PageRegion> = Vec::with_capacity(regions.len());
        let mut guards = Ranges::new();
        let push = |out: &mut Vec<PageRegion>, r: PageRegion| match out.last_mut() {
            Some(last) if last.end == r.start && last.categories == r.categories => {
                last.end = r.end
            }
            _ => out.push(r),
        };
        for r in regions {
            if r.categories & sys::PAGE_IS_PRESENT != 0 || r.categories & sys::PAGE_IS_SWAPPED == 0
            {
                push(&mut out, r);
                continue;
            }
            let entries = self.read_entries(r.start, r.end)?;
            for (i, e) in (0u64..).zip(entries) {
                let a = r.start + i * sys::PAGE_SIZE;
                if e & sys::PM_SWAPPED != 0 && e & sys::PM_SWAP_TYPE_MASK == sys::SWP_PTE_MARKER {
                    if e & sys::PM_GUARD_REGION != 0 {
                        add_page(&mut guards, a);
                    }
                    continue;
                }
                push(
                    &mut out,
                    PageRegion {
                        start: a,
                        end: a + sys::PAGE_SIZE,
                        categories: r.categories,
                    },
                );
            }
        }
        Ok((out, guards))
    }

    /// Reads raw pagemap entries for the pages of `[start, end)`.
    pub fn read_entries(&self, start: u64, end: u64) -> Result<Vec<u64>> {
        let pages = usize::try_from((end - start) / sys::PAGE_SIZE).unwrap_or(0);
        let mut bytes = vec![0u8; pages * 8];
        self.file
            .read_exact_at(&mut bytes, start / sys::PAGE_SIZE * 8)
            .map_err(|e| KernelError::io(format!("read /proc/{}/pagemap", self.pid), e))?;
        Ok(crate::mem::le_u64s(&bytes))
    }

    /// The fallback of [`ScanQuery::private_data`] without `PAGEMAP_SCAN`:
    /// present or swapped pages that are not page-cache pages (the zero
    /// page cannot be told apart here and is included).
    pub fn private_data_by_entries(
        &self,
        start: u64,
        end: u64,
    ) -> Result<(Vec<PageRegion>, Ranges)> {
        let entries = self.read_entries(start, end)?;
        let mut out: Vec<PageRegion> = Vec::new();
        let mut guards = Ranges::new();
        for (i, e) in entries.iter().enumerate() {
            let a = start + i as u64 * sys::PAGE_SIZE;
            let marker = e & sys::PM_PRESENT == 0
                && e & sys::PM_SWAPPED != 0
                && e & sys::PM_SWAP_TYPE_MASK == sys::SWP_PTE_MARKER;
            if marker && e & sys::PM_GUARD_REGION != 0 {
                add_page(&mut guards, a);
            }
            let has_data = e & (sys::PM_PRESENT | sys::PM_SWAPPED) != 0
                && e & sys::PM_FILE_OR_SHARED_ANON == 0
                && !marker;
            if !has_data {
                continue;
            }
            match out.last_mut() {
                Some(last) if last.end == a => last.end += sys::PAGE_SIZE,
                _ => out.push(PageRegion {
                    start: a,
                    end: a + sys::PAGE_SIZE,
                    categories: sys::PAGE_IS_PRESENT,
                }),
            }
        }
        Ok((out, guards))
    }
}

/// Page ranges `[start, end)`, sorted and disjoint.
pub type Ranges = Vec<(u64, u64)>;

/// Appends the page at `a` to `r` (pages come in address order).
fn add_page(r: &mut Ranges, a: u64) {
    match r.last_mut() {
        Some(last) if last.1 == a => last.1 += sys::PAGE_SIZE,
        _ => r.push((a, a + sys::PAGE_SIZE)),
    }
}
