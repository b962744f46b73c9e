//! The new mount API (`linux/mount.h`): `fsopen`, `fsconfig`, `fsmount`,
//! `move_mount`, x86-64 numbers.

pub const SYS_MOVE_MOUNT: i64 = 429;
pub const SYS_FSOPEN: i64 = 430;
pub const SYS_FSCONFIG: i64 = 431;
pub const SYS_FSMOUNT: i64 = 432;

pub const FSOPEN_CLOEXEC: u32 = 0x1;
pub const FSMOUNT_CLOEXEC: u32 = 0x1;
pub const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;

// `fsconfig` commands.
pub const FSCONFIG_SET_FLAG: u32 = 0;
pub const FSCONFIG_SET_STRING: u32 = 1;
pub const FSCONFIG_SET_FD: u32 = 5;
pub const FSCONFIG_CMD_CREATE: u32 = 6;

// `fsmount` attributes.
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub const MOUNT_ATTR_NOATIME: u64 = 0x10;
pub const MOUNT_ATTR_STRICTATIME: u64 = 0x20;
pub const MOUNT_ATTR_NODIRATIME: u64 = 0x80;
