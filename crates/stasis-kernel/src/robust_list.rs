//! `get_robust_list` of another thread (no wrapper in libc or nix).

use crate::{KernelError, Result};

/// The robust futex list of thread `tid`: (head address, length).
pub fn get_robust_list(tid: i32) -> Result<(u64, u64)> {
    let mut head = 0u64;
    let mut len = 0usize;
    // SAFETY: get_robust_list writes a pointer and a size to the two valid
    // out-pointers we pass, which live for the whole call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_robust_list,
            tid,
            &mut head as *mut u64,
            &mut len as *mut usize,
        )
    };
    if r < 0 {
        return Err(KernelError::Io {
            what: format!("get_robust_list({tid})"),
            source: crate::last_err(),
        });
    }
    Ok((head, len as u64))
}

#[cfg(test)]
mod tests {
    #[test]
    fn own_thread_has_a_robust_list() {
        // glibc registers one for every thread it starts.
        let tid = nix::unistd::gettid().as_raw();
        let (head, len) = super::get_robust_list(tid).unwrap();
        assert_ne!(head, 0);
        assert!(len > 0);
        assert!(super::get_robust_list(-5).is_err());
    }
}
