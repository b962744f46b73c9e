//! The seam between checkpoint/restore logic and the kernel.
//!
//! Logic above this crate decides *what* to do and asks one of two traits
//! to do it, each with a recording fake that can inject failures, so the
//! decisions are unit-tested without root:
//!
//! - [`Remote`] ([`crate::remote`]): system calls run *inside another
//!   process* (a traced target during a dump, the stub a restore builds),
//!   and that process's memory. Used by capture (`ThreadRemote`), restore
//!   (the stub) and the dirty trackers. Fake: [`Recorder`].
//! - [`Pages`]: the page operations issued *from here* on another process's
//!   memory through its userfaultfd (`UFFDIO_COPY`, `UFFDIO_ZEROPAGE`,
//!   `UFFDIO_WAKE`, `UFFDIO_WRITEPROTECT`), each of whose errors is a
//!   decision (already there, an event to read first, unmapped since, the
//!   process gone). Used by the lazy filler's delivery and fault service
//!   and by the concurrent dump's copy-on-write handler. Fake:
//!   [`PageRecorder`].
//!
//! The remaining local system calls (open a pidfd, read `/proc`, send a
//! signal) are leaves with no decision around them: they are called
//! directly through their safe wrappers in this crate.

use std::sync::Mutex;

pub use crate::remote::{Call, Recorder, Remote};
use crate::uffd::{FillError, Userfaultfd};
use crate::KernelError;

/// Page operations on a process's memory through its userfaultfd. Errors
/// carry the errno the logic decides on.
pub trait Pages {
    /// Maps a copy of `src` at `dst` (whole pages) and wakes its waiters.
    fn copy(&self, dst: u64, src: &[u8]) -> Result<(), FillError>;
    /// Maps zero pages over `[start, start + len)` and wakes their waiters.
    fn zeropage(&self, start: u64, len: u64) -> Result<(), FillError>;
    /// Wakes the threads waiting on `[start, start + len)`.
    fn wake(&self, start: u64, len: u64) -> Result<(), KernelError>;
    /// Write-protects `[start, start + len)` (`protect`) or lifts it; the
    /// error is the errno.
    fn write_protect(&self, start: u64, len: u64, protect: bool) -> Result<(), i32>;
}

impl Pages for Userfaultfd {
    fn copy(&self, dst: u64, src: &[u8]) -> Result<(), FillError> {
        Userfaultfd::copy(self, dst, src)
    }
    fn zeropage(&self, start: u64, len: u64) -> Result<(), FillError> {
        Userfaultfd::zeropage(self, start, len)
    }
    fn wake(&self, start: u64, len: u64) -> Result<(), KernelError> {
        Userfaultfd::wake(self, start, len)
    }
    fn write_protect(&self, start: u64, len: u64, protect: bool) -> Result<(), i32> {
        Userfaultfd::write_protect(self, start, len, protect)
    }
}

/// One recorded call of a [`PageRecorder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageCall {
    /// A copy of `data` to `dst` (recorded whole, even if it failed).
    Copy {
        dst: u64,
        data: Vec<u8>,
    },
    Zero {
        start: u64,
        len: u64,
    },
    Wake {
        start: u64,
        len: u64,
    },
    Protect {
        start: u64,
        len: u64,
        protect: bool,
    },
}

/// A fake [`Pages`] over a pretend address space: what is mapped
/// (registered), what is filled, and scripted errors.
#[derive(Debug, Default)]
pub struct PageRecorder {
    st: Mutex<PageState>,
}

#[derive(Debug, Default)]
struct PageState {
    calls: Vec<PageCall>,
    /// Registered areas `[start, end)`: a fill must stay inside one
    /// (`ENOENT` otherwise, as when the process split or unmapped one).
    areas: Vec<(u64, u64)>,
    /// Pages already filled (`EEXIST` for a fill over one).
    filled: std::collections::BTreeSet<u64>,
    /// Errno to return for every call from then on (`ESRCH`: the process
    /// is gone), or once (`EAGAIN`: an event to read first).
    fail_always: Option<i32>,
    fail_once: Option<i32>,
}

const PAGE: u64 = 4096;

impl PageRecorder {
    /// A fake whose process has the areas `areas` registered.
    pub fn with_areas(areas: &[(u64, u64)]) -> PageRecorder {
        let r = PageRecorder::default();
        r.state().areas = areas.to_vec();
        r
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PageState> {
        self.st
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks `[start, end)` as filled already.
    pub fn prefill(&self, start: u64, end: u64) {
        let mut st = self.state();
        let mut p = start;
        while p < end {
            st.filled.insert(p);
            p += PAGE;
        }
    }

    /// Every call fails with `errno` from now on.
    pub fn fail_always(&self, errno: i32) {
        self.state().fail_always = Some(errno);
    }

    /// The next fill fails with `errno`, having done nothing.
    pub fn fail_once(&self, errno: i32) {
        self.state().fail_once = Some(errno);
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<PageCall> {
        self.state().calls.clone()
    }

    /// The pages filled so far (by a copy or a zero page, or prefilled).
    pub fn filled(&self) -> Vec<u64> {
        self.state().filled.iter().copied().collect()
    }

    /// A fill of `[start, start + len)`: like the kernel, it stops at the
    /// first page already there (`EEXIST`) and refuses a range that is not
    /// inside one registered area (`ENOENT`), reporting what it did.
    fn fill(&self, start: u64, len: u64, call: PageCall) -> Result<(), FillError> {
        let mut st = self.state();
        st.calls.push(call);
        if let Some(errno) = st.fail_always.or(st.fail_once.take()) {
            return Err(FillError { done: 0, errno });
        }
        let end = start + len;
        if !st.areas.iter().any(|&(a, b)| a <= start && end <= b) {
            return Err(FillError {
                done: 0,
                errno: libc::ENOENT,
            });
        }
        let mut p = start;
        while p < end {
            if st.filled.contains(&p) {
                return Err(FillError {
                    done: p - start,
                    errno: libc::EEXIST,
                });
            }
            st.filled.insert(p);
            p += PAGE;
        }
        Ok(())
    }
}

impl Pages for PageRecorder {
    fn copy(&self, dst: u64, src: &[u8]) -> Result<(), FillError> {
        let call = PageCall::Copy {
            dst,
            data: src.to_vec(),
        };
        self.fill(dst, src.len() as u64, call)
    }

    fn zeropage(&self, start: u64, len: u64) -> Result<(), FillError> {
        self.fill(start, len, PageCall::Zero { start, len })
    }

    fn wake(&self, start: u64, len: u64) -> Result<(), KernelError> {
        self.state().calls.push(PageCall::Wake { start, len });
        Ok(())
    }

    fn write_protect(&self, start: u64, len: u64, protect: bool) -> Result<(), i32> {
        let mut st = self.state();
        st.calls.push(PageCall::Protect {
            start,
            len,
            protect,
        });
        if let Some(errno) = st.fail_always.or(st.fail_once.take()) {
            return Err(errno);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_refuses_fills_across_areas_and_over_filled_pages() {
        let f = PageRecorder::with_areas(&[(0x1000, 0x5000), (0x5000, 0x8000)]);
        assert_eq!(f.copy(0x1000, &[1; 4096]), Ok(()));
        // Across two areas: refused whole.
        assert_eq!(
            f.zeropage(0x4000, 0x2000),
            Err(FillError {
                done: 0,
                errno: libc::ENOENT
            })
        );
        // Over a filled page: what came before it is done.
        f.prefill(0x3000, 0x4000);
        assert_eq!(
            f.copy(0x2000, &[2; 8192]),
            Err(FillError {
                done: 4096,
                errno: libc::EEXIST
            })
        );
        assert_eq!(f.filled(), vec![0x1000, 0x2000, 0x3000]);
        f.fail_once(libc::EAGAIN);
        assert_eq!(f.zeropage(0x5000, 4096).unwrap_err().errno, libc::EAGAIN);
        assert_eq!(f.zeropage(0x5000, 4096), Ok(()));
        f.fail_always(libc::ESRCH);
        assert_eq!(f.write_protect(0x5000, 4096, true), Err(libc::ESRCH));
        assert_eq!(f.calls().len(), 6);
    }
}
