//! `prctl` options the libc crate does not name.

/// `PR_GET_TID_ADDRESS`: writes the thread's `clear_child_tid` address to
/// the `u64` at arg2 (since Linux 3.5, with `CONFIG_CHECKPOINT_RESTORE`).
pub const PR_GET_TID_ADDRESS: i32 = 40;

/// `SECBIT_KEEP_CAPS` (`<linux/securebits.h>`): permitted capabilities
/// survive a change of every uid away from 0.
pub const SECBIT_KEEP_CAPS: u32 = 1 << 4;
/// `SECBIT_KEEP_CAPS_LOCKED`: `SECBIT_KEEP_CAPS` can no longer change.
pub const SECBIT_KEEP_CAPS_LOCKED: u32 = 1 << 5;

/// `_LINUX_CAPABILITY_VERSION_3`: `capget`/`capset` with two 32-bit words
/// per set.
pub const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
