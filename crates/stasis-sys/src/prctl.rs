//! `prctl` options the libc crate does not name.

/// `PR_GET_TID_ADDRESS`: writes the thread's `clear_child_tid` address to
/// the `u64` at arg2 (since Linux 3.5, with `CONFIG_CHECKPOINT_RESTORE`).
pub const PR_GET_TID_ADDRESS: i32 = 40;
