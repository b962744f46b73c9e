//! Self-monitoring: the syscalls a process makes on *its own* memory, for
//! application-level checkpointing (`stasis-app`, the `libstasis` C
//! library).
//!
//! * [`region`]: [`AppRegion`], memory an application handed over with
//!   `stasis_protect` (copy out, copy in, `mprotect` of its pages,
//!   `madvise` for huge pages).
//! * [`segv`]: the process-wide `SIGSEGV` handler that turns write faults
//!   on protected pages into calls of a plain Rust function, and chains
//!   every other fault to the handler the program had before.
//! * [`pmem`]: a file mapped shared and written with cache-line write-back
//!   and a store fence (a persistent-memory target).
//!
//! The userfaultfd used on the process's own memory is the ordinary
//! [`crate::uffd::Userfaultfd`] with [`crate::pagemap::Pagemap`] opened on
//! this process: no new unsafe code is needed for it.

pub mod pmem;
pub mod region;
pub mod segv;

pub use pmem::PmemMap;
pub use region::{AppRegion, PAGE_SIZE};

/// The page size this code assumes (x86-64 base pages).
pub const fn page_floor(addr: usize) -> usize {
    addr & !(PAGE_SIZE - 1)
}

/// `addr` rounded up to a page boundary.
pub const fn page_ceil(addr: usize) -> usize {
    (addr + PAGE_SIZE - 1) & !(PAGE_SIZE - 1)
}
