//! Kernel ABI of terminals and pseudo-terminals (asm-generic/ioctls.h,
//! asm-generic/termbits.h, linux/major.h): the ioctls that save and rebuild
//! a pty pair, and `struct termios2`.
//!
//! Where `libc` has the same constant, a compile-time assertion checks the
//! two agree; the others are checked against their kernel encoding.

use core::mem::size_of;

/// `_IOR('T', 0x30, unsigned int)`: the pts index of a master.
pub const TIOCGPTN: u64 = 0x8004_5430;
/// `_IOW('T', 0x31, int)`: lock (1) or unlock (0) the slave of a master.
pub const TIOCSPTLCK: u64 = 0x4004_5431;
/// `_IOR('T', 0x39, int)`: whether the slave is locked.
pub const TIOCGPTLCK: u64 = 0x8004_5439;
/// `_IO('T', 0x41)`: opens the slave of a master (flags as `open`'s).
pub const TIOCGPTPEER: u64 = 0x5441;
/// Packet mode of a master on (1) or off (0): `int *`.
pub const TIOCPKT: u64 = 0x5420;
/// `_IOR('T', 0x38, int)`: whether packet mode is on.
pub const TIOCGPKT: u64 = 0x8004_5438;
/// Exclusive mode on / off (no argument).
pub const TIOCEXCL: u64 = 0x540C;
pub const TIOCNXCL: u64 = 0x540D;
/// `_IOR('T', 0x40, int)`: whether exclusive mode is on.
pub const TIOCGEXCL: u64 = 0x8004_5440;
/// `struct winsize`.
pub const TIOCGWINSZ: u64 = 0x5413;
pub const TIOCSWINSZ: u64 = 0x5414;
/// Pushes one byte into the input of a terminal, through its line
/// discipline (needs `CAP_SYS_ADMIN`, or the caller's own terminal with
/// `dev.tty.legacy_tiocsti`).
pub const TIOCSTI: u64 = 0x5412;
/// Makes the terminal the caller's controlling terminal (the caller leads
/// its session and has none).
pub const TIOCSCTTY: u64 = 0x540E;
/// Foreground process group (`pid_t *`).
pub const TIOCGPGRP: u64 = 0x540F;
pub const TIOCSPGRP: u64 = 0x5410;
/// Bytes waiting to be read (`int *`): in canonical mode, those of
/// complete lines only.
pub const FIONREAD: u64 = 0x541B;
/// `struct termios2` get / set now.
pub const TCGETS2: u64 = 0x802C_542A;
pub const TCSETS2: u64 = 0x402C_542B;

/// Flush a queue (`TCIFLUSH`, `TCOFLUSH`, `TCIOFLUSH`: the int argument
/// itself, not a pointer).
pub const TCFLSH: u64 = 0x540B;
pub const TCIFLUSH: i32 = 0;
pub const TCOFLUSH: i32 = 1;
/// Stop or restart output (`TCOOFF`, `TCOON`: the int argument itself).
pub const TCXONC: u64 = 0x540A;
pub const TCOOFF: i32 = 0;
pub const TCOON: i32 = 1;
/// Get / set the line discipline (`int *`).
pub const TIOCGETD: u64 = 0x5424;
pub const TIOCSETD: u64 = 0x5423;
/// Line disciplines: the terminal one, and the one that discards
/// everything.
pub const N_TTY: u8 = 0;
pub const N_NULL: u8 = 27;

/// The control status bits a packet-mode master reads (`TIOCPKT_*`).
pub const TIOCPKT_FLUSHREAD: u8 = 1;
pub const TIOCPKT_FLUSHWRITE: u8 = 2;
pub const TIOCPKT_STOP: u8 = 4;
pub const TIOCPKT_START: u8 = 8;
pub const TIOCPKT_NOSTOP: u8 = 16;
pub const TIOCPKT_DOSTOP: u8 = 32;
pub const TIOCPKT_IOCTL: u8 = 64;

/// `f_type` of a devpts file system (`statfs`): a slave's node, or an
/// instance's own `ptmx`.
pub const DEVPTS_SUPER_MAGIC: i64 = 0x1cd1;

/// Major and minor of `/dev/ptmx` (and of devpts' own `ptmx`).
pub const PTMX_MAJOR: u32 = 5;
pub const PTMX_MINOR: u32 = 2;
/// Majors of Unix98 pty slaves (`UNIX98_PTY_SLAVE_MAJOR` and the next
/// `UNIX98_PTY_MAJOR_COUNT - 1`): index = (major - 136) * 256 + minor.
pub const PTY_SLAVE_MAJOR: u32 = 136;
pub const PTY_SLAVE_MAJOR_COUNT: u32 = 8;
/// `N_TTY_BUF_SIZE`: the line discipline's input buffer.
pub const N_TTY_BUF_SIZE: usize = 4096;
/// `NCCS` of the kernel's `struct termios2` (not glibc's 32).
pub const KERNEL_NCCS: usize = 19;

/// `struct termios2` (asm-generic/termbits.h).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Termios2 {
    pub c_iflag: u32,
    pub c_oflag: u32,
    pub c_cflag: u32,
    pub c_lflag: u32,
    pub c_line: u8,
    pub c_cc: [u8; KERNEL_NCCS],
    pub c_ispeed: u32,
    pub c_ospeed: u32,
}
const _: () = assert!(size_of::<Termios2>() == 44);
const _: () = assert!(size_of::<Termios2>() == size_of::<libc::termios2>());

/// `struct winsize`: rows, columns, x and y pixels.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Winsize {
    pub ws_row: u16,
    pub ws_col: u16,
    pub ws_xpixel: u16,
    pub ws_ypixel: u16,
}
const _: () = assert!(size_of::<Winsize>() == 8);
const _: () = assert!(size_of::<Winsize>() == size_of::<libc::winsize>());

/// The `_IOR`/`_IOW` encodings above, recomputed from their parts.
const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | ((b'T' as u64) << 8) | nr
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
const _: () = assert!(TIOCGPTN == ioc(IOC_READ, 0x30, size_of::<u32>()));
const _: () = assert!(TIOCSPTLCK == ioc(IOC_WRITE, 0x31, size_of::<i32>()));
const _: () = assert!(TIOCGPTLCK == ioc(IOC_READ, 0x39, size_of::<i32>()));
const _: () = assert!(TIOCGPKT == ioc(IOC_READ, 0x38, size_of::<i32>()));
const _: () = assert!(TIOCGEXCL == ioc(IOC_READ, 0x40, size_of::<i32>()));
const _: () = assert!(TCGETS2 == ioc(IOC_READ, 0x2A, size_of::<Termios2>()));
const _: () = assert!(TCSETS2 == ioc(IOC_WRITE, 0x2B, size_of::<Termios2>()));

const _: () = assert!(TIOCGPTN == libc::TIOCGPTN);
const _: () = assert!(TIOCSPTLCK == libc::TIOCSPTLCK);
const _: () = assert!(TIOCGPTLCK == libc::TIOCGPTLCK);
const _: () = assert!(TIOCGPTPEER == libc::TIOCGPTPEER);
const _: () = assert!(TIOCPKT == libc::TIOCPKT);
const _: () = assert!(TIOCGPKT == libc::TIOCGPKT);
const _: () = assert!(TIOCEXCL == libc::TIOCEXCL);
const _: () = assert!(TIOCNXCL == libc::TIOCNXCL);
const _: () = assert!(TIOCGEXCL == libc::TIOCGEXCL);
const _: () = assert!(TIOCGWINSZ == libc::TIOCGWINSZ);
const _: () = assert!(TIOCSWINSZ == libc::TIOCSWINSZ);
const _: () = assert!(TIOCSTI == libc::TIOCSTI);
const _: () = assert!(TIOCSCTTY == libc::TIOCSCTTY);
const _: () = assert!(TIOCGPGRP == libc::TIOCGPGRP);
const _: () = assert!(TIOCSPGRP == libc::TIOCSPGRP);
const _: () = assert!(FIONREAD == libc::FIONREAD);
const _: () = assert!(TCGETS2 == libc::TCGETS2);
const _: () = assert!(TCSETS2 == libc::TCSETS2);
const _: () = assert!(TCFLSH == libc::TCFLSH);
const _: () = assert!(TCIFLUSH == libc::TCIFLUSH);
const _: () = assert!(TCOFLUSH == libc::TCOFLUSH);
const _: () = assert!(TCXONC == libc::TCXONC);
const _: () = assert!(TCOOFF == libc::TCOOFF);
const _: () = assert!(TCOON == libc::TCOON);
const _: () = assert!(TIOCGETD == libc::TIOCGETD);
const _: () = assert!(TIOCSETD == libc::TIOCSETD);
