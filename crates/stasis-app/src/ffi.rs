//! The C ABI: every `stasis_*` function, a panic boundary around each, and
//! the conversion of raw pointers into Rust values. The only module of this
//! crate with `unsafe`.
//!
//! Each function returns `STASIS_SUCCESS` (0) or a negative `STASIS_ERR_*`
//! code; `stasis_last_error()` gives the detailed message of the last
//! failure in the calling thread. A panic inside the library becomes
//! `STASIS_ERR_INTERNAL`; nothing here aborts the program.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use stasis_kernel::selfmon::AppRegion;

use crate::api;
use crate::config::stasis_config;
use crate::error::{
    code_message, AppError, Result, STASIS_ERR_INTERNAL, STASIS_NONE, STASIS_RESTORED,
    STASIS_SUCCESS,
};

/// What `stasis_stats` fills in.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct stasis_stats {
    /// The monitoring mode in use (`STASIS_MONITOR_*`).
    pub monitor: c_int,
    /// Checkpoints committed.
    pub checkpoints: u64,
    /// Write faults taken (`page`, `acck`; 0 for `uffd` and `full`).
    pub faults: u64,
    /// ACCK: pieces released, and the pages in them.
    pub pieces_released: u64,
    pub pages_released: u64,
    /// 2 MiB ranges collapsed into huge pages, and collapses that failed.
    pub huge_collapsed: u64,
    pub huge_failed: u64,
    /// Bytes copied out of the protected regions.
    pub bytes_copied: u64,
    /// Bytes written to the target.
    pub bytes_written: u64,
    /// Time spent monitoring: in the fault handler, protecting again after
    /// each checkpoint, scanning (`uffd`).
    pub monitor_ns: u64,
    /// Time spent copying out of the regions.
    pub copy_ns: u64,
    /// Time spent writing the target (background for `checkpoint_begin`).
    pub write_ns: u64,
    /// Pages of a background checkpoint copied early because the program
    /// wrote them (copy-on-write, `page` and `acck` modes).
    pub cow_copies: u64,
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

fn guard(f: impl FnOnce() -> Result<i32>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last(e.full_message());
            e.code()
        }
        Err(_) => {
            set_last(
                "internal error: the library panicked (the call had no effect or a partial one)"
                    .into(),
            );
            STASIS_ERR_INTERNAL
        }
    }
}

fn ok(r: Result<()>) -> Result<i32> {
    r.map(|()| STASIS_SUCCESS)
}

/// # Safety
/// `s` is null or a NUL-terminated string.
unsafe fn str_arg<'a>(s: *const c_char, what: &str) -> Result<&'a str> {
    if s.is_null() {
        return Err(AppError::Invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-null, NUL-terminated by the caller's contract.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str()
        .map_err(|_| AppError::Invalid(format!("{what} is not UTF-8")))
}

/// Initialises the library: checkpoints go to `dir` (created if missing).
///
/// # Safety
/// `dir` is a NUL-terminated string; `cfg` is NULL or points to a config.
#[no_mangle]
pub unsafe extern "C" fn stasis_init(dir: *const c_char, cfg: *const stasis_config) -> c_int {
    guard(|| {
        // SAFETY: the caller passes a C string.
        let d = unsafe { str_arg(dir, "dir") }?;
        // SAFETY: the caller passes NULL or a valid config, read only here.
        let c = unsafe { cfg.as_ref() };
        ok(api::init(Path::new(d), c))
    })
}

/// Protects `len` bytes at `ptr` as region `id` (replacing a region with
/// the same id): they are saved by every checkpoint and refilled in place
/// by `stasis_restart`.
///
/// # Safety
/// `[ptr, ptr + len)` is readable and writable memory of the program that
/// stays mapped until `stasis_unprotect(id)` or `stasis_finalize()`.
#[no_mangle]
pub unsafe extern "C" fn stasis_protect(id: c_int, ptr: *mut c_void, len: usize) -> c_int {
    guard(|| {
        if ptr.is_null() {
            return Err(AppError::Invalid(format!("region {id}: pointer is NULL")));
        }
        if (ptr as usize).checked_add(len).is_none() {
            return Err(AppError::Invalid(format!(
                "region {id}: length wraps around"
            )));
        }
        // SAFETY: the caller vouches for the memory until unprotect/finalize
        // (this function's contract), which is AppRegion::new's contract.
        let mem = unsafe { AppRegion::new(ptr as usize, len) };
        ok(api::protect(id, mem))
    })
}

/// Stops protecting region `id`.
#[no_mangle]
pub extern "C" fn stasis_unprotect(id: c_int) -> c_int {
    guard(|| ok(api::unprotect(id)))
}

/// Writes a checkpoint `name` at `version` and waits until it is committed.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn stasis_checkpoint(name: *const c_char, version: c_int) -> c_int {
    guard(|| {
        // SAFETY: the caller passes a C string.
        let n = unsafe { str_arg(name, "name") }?;
        ok(api::checkpoint(n, version))
    })
}

/// Copies what changed since the last checkpoint and returns; the target is
/// written in the background until `stasis_checkpoint_wait`.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn stasis_checkpoint_begin(name: *const c_char, version: c_int) -> c_int {
    guard(|| {
        // SAFETY: the caller passes a C string.
        let n = unsafe { str_arg(name, "name") }?;
        ok(api::checkpoint_begin(n, version))
    })
}

/// Waits for the checkpoint started by `stasis_checkpoint_begin`.
#[no_mangle]
pub extern "C" fn stasis_checkpoint_wait() -> c_int {
    guard(|| ok(api::checkpoint_wait()))
}

/// The newest complete version of `name`, or `STASIS_NONE`.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn stasis_restart_test(name: *const c_char) -> c_int {
    guard(|| {
        // SAFETY: the caller passes a C string.
        let n = unsafe { str_arg(name, "name") }?;
        Ok(api::restart_test(n)?.unwrap_or(STASIS_NONE))
    })
}

/// Refills the protected regions in place from `name` at `version`.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn stasis_restart(name: *const c_char, version: c_int) -> c_int {
    guard(|| {
        // SAFETY: the caller passes a C string.
        let n = unsafe { str_arg(name, "name") }?;
        ok(api::restart(n, version))
    })
}

/// Fills `out` with the library's counters.
///
/// # Safety
/// `out` points to a writable `struct stasis_stats`.
#[no_mangle]
pub unsafe extern "C" fn stasis_stats(out: *mut stasis_stats) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(AppError::Invalid("stats pointer is NULL".into()));
        }
        let s = api::stats()?;
        let v = stasis_stats {
            monitor: s.mode.map_or(0, |m| m.code()),
            checkpoints: s.checkpoints,
            faults: s.c.faults,
            pieces_released: s.c.pieces_released,
            pages_released: s.c.pages_released,
            huge_collapsed: s.c.huge_collapsed,
            huge_failed: s.c.huge_failed,
            bytes_copied: s.c.bytes_copied,
            bytes_written: s.bytes_written,
            monitor_ns: s.c.monitor_ns,
            copy_ns: s.c.copy_ns,
            write_ns: s.write_ns,
            cow_copies: s.c.cow_copies,
        };
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { out.write(v) };
        Ok(STASIS_SUCCESS)
    })
}

/// Asks a surrounding `stasis run` for a transparent checkpoint now, at
/// this safe point, and blocks until it is committed: returns
/// `STASIS_SUCCESS`, or `STASIS_RESTORED` (1) when the program was later
/// restored from that checkpoint and goes on from this call, or
/// `STASIS_ERR_CHECKPOINT_FAILED`; `STASIS_ERR_NOT_UNDER_RUN` outside
/// `stasis run`. Needs no `stasis_init`; any thread may call it.
#[no_mangle]
pub extern "C" fn stasis_request_checkpoint() -> c_int {
    guard(|| {
        api::request_checkpoint().map(|r| match r {
            crate::request::Requested::Committed(_) => STASIS_SUCCESS,
            crate::request::Requested::Restored(_) => STASIS_RESTORED,
        })
    })
}

/// Waits for a background checkpoint, lifts all protection, forgets state.
#[no_mangle]
pub extern "C" fn stasis_finalize() -> c_int {
    guard(|| ok(api::finalize()))
}

/// A static message for an error code.
#[no_mangle]
pub extern "C" fn stasis_strerror(err: c_int) -> *const c_char {
    code_message(err).as_ptr()
}

/// The detailed message of the last failure in this thread (valid until
/// the next failing call in this thread).
#[no_mangle]
pub extern "C" fn stasis_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// A note from the library, if any (why `auto` chose its mode, why huge
/// pages could not be used), else an empty string; valid until the next
/// call of this function in this thread.
#[no_mangle]
pub extern "C" fn stasis_note() -> *const c_char {
    thread_local! {
        static NOTE: RefCell<CString> = RefCell::new(CString::default());
    }
    let s = api::stats().ok().and_then(|s| s.note).unwrap_or_default();
    NOTE.with(|n| {
        *n.borrow_mut() = CString::new(s.replace('\0', " ")).unwrap_or_default();
        n.borrow().as_ptr()
    })
}
