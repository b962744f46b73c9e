//! io_uring (include/uapi/linux/io_uring.h, io_uring/io_uring.c,
//! io_uring/register.c): the setup parameters, the offsets at which a
//! ring's areas are mapped, and the register operations Stasis uses to
//! rebuild an idle ring in a restored process.

use core::mem::{offset_of, size_of};

/// `struct io_sqring_offsets`: where the SQ ring's fields are in its area.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SqringOffsets {
    pub head: u32,
    pub tail: u32,
    pub ring_mask: u32,
    pub ring_entries: u32,
    pub flags: u32,
    pub dropped: u32,
    pub array: u32,
    pub resv1: u32,
    pub user_addr: u64,
}
const _: () = assert!(size_of::<SqringOffsets>() == 40);

/// `struct io_cqring_offsets`: where the CQ ring's fields are in its area.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CqringOffsets {
    pub head: u32,
    pub tail: u32,
    pub ring_mask: u32,
    pub ring_entries: u32,
    pub overflow: u32,
    pub cqes: u32,
    pub flags: u32,
    pub resv1: u32,
    pub user_addr: u64,
}
const _: () = assert!(size_of::<CqringOffsets>() == 40);

/// `struct io_uring_params`: `io_uring_setup`'s argument and answer.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IoUringParams {
    pub sq_entries: u32,
    pub cq_entries: u32,
    pub flags: u32,
    pub sq_thread_cpu: u32,
    pub sq_thread_idle: u32,
    pub features: u32,
    pub wq_fd: u32,
    pub resv: [u32; 3],
    pub sq_off: SqringOffsets,
    pub cq_off: CqringOffsets,
}
pub const IO_URING_PARAMS_LEN: usize = 120;
const _: () = assert!(size_of::<IoUringParams>() == IO_URING_PARAMS_LEN);
const _: () = assert!(offset_of!(IoUringParams, sq_off) == 40);
const _: () = assert!(offset_of!(IoUringParams, cq_off) == 80);

impl IoUringParams {
    /// Its bytes (native byte order), as `io_uring_setup` reads them.
    pub fn to_bytes(&self) -> [u8; IO_URING_PARAMS_LEN] {
        let (s, c) = (&self.sq_off, &self.cq_off);
        let words = [
            self.sq_entries,
            self.cq_entries,
            self.flags,
            self.sq_thread_cpu,
            self.sq_thread_idle,
            self.features,
            self.wq_fd,
            self.resv[0],
            self.resv[1],
            self.resv[2],
            s.head,
            s.tail,
            s.ring_mask,
            s.ring_entries,
            s.flags,
            s.dropped,
            s.array,
            s.resv1,
        ];
        let mut b = [0u8; IO_URING_PARAMS_LEN];
        for (i, w) in words.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        b[72..80].copy_from_slice(&s.user_addr.to_ne_bytes());
        let cwords = [
            c.head,
            c.tail,
            c.ring_mask,
            c.ring_entries,
            c.overflow,
            c.cqes,
            c.flags,
            c.resv1,
        ];
        for (i, w) in cwords.iter().enumerate() {
            b[80 + i * 4..84 + i * 4].copy_from_slice(&w.to_ne_bytes());
        }
        b[112..120].copy_from_slice(&c.user_addr.to_ne_bytes());
        b
    }

    /// The parameters `io_uring_setup` wrote back (native byte order).
    pub fn from_bytes(b: &[u8; IO_URING_PARAMS_LEN]) -> Self {
        let w = |i: usize| u32::from_ne_bytes([b[i * 4], b[i * 4 + 1], b[i * 4 + 2], b[i * 4 + 3]]);
        let q = |i: usize| u64::from(w(i)) | u64::from(w(i + 1)) << 32;
        Self {
            sq_entries: w(0),
            cq_entries: w(1),
            flags: w(2),
            sq_thread_cpu: w(3),
            sq_thread_idle: w(4),
            features: w(5),
            wq_fd: w(6),
            resv: [w(7), w(8), w(9)],
            sq_off: SqringOffsets {
                head: w(10),
                tail: w(11),
                ring_mask: w(12),
                ring_entries: w(13),
                flags: w(14),
                dropped: w(15),
                array: w(16),
                resv1: w(17),
                user_addr: q(18),
            },
            cq_off: CqringOffsets {
                head: w(20),
                tail: w(21),
                ring_mask: w(22),
                ring_entries: w(23),
                overflow: w(24),
                cqes: w(25),
                flags: w(26),
                resv1: w(27),
                user_addr: q(28),
            },
        }
    }
}

/// `IORING_SETUP_*` flags Stasis names or uses.
pub const IORING_SETUP_SQPOLL: u32 = 1 << 1;
/// The SQ poll thread bound to CPU `sq_thread_cpu`.
pub const IORING_SETUP_SQ_AFF: u32 = 1 << 2;
pub const IORING_SETUP_CQSIZE: u32 = 1 << 3;
pub const IORING_SETUP_R_DISABLED: u32 = 1 << 6;
pub const IORING_SETUP_SINGLE_ISSUER: u32 = 1 << 12;
/// Completions are posted when the single issuer waits for them.
pub const IORING_SETUP_DEFER_TASKRUN: u32 = 1 << 13;
/// The rings are in memory the caller gives (`sq_off.user_addr`:
/// the SQE array, `cq_off.user_addr`: the rings).
pub const IORING_SETUP_NO_MMAP: u32 = 1 << 14;

/// No SQ index array: entry `i` of the SQ ring is SQE `i & mask`
/// (liburing's default when the kernel has it).
pub const IORING_SETUP_NO_SQARRAY: u32 = 1 << 16;

/// `IORING_FEAT_SINGLE_MMAP`: the SQ and CQ rings are one area.
pub const IORING_FEAT_SINGLE_MMAP: u32 = 1 << 0;

/// mmap offsets of a ring's areas.
pub const IORING_OFF_SQ_RING: u64 = 0;
pub const IORING_OFF_CQ_RING: u64 = 0x800_0000;
pub const IORING_OFF_SQES: u64 = 0x1000_0000;
/// A provided-buffer ring the kernel allocated (`IOU_PBUF_RING_MMAP`).
pub const IORING_OFF_PBUF_RING: u64 = 0x8000_0000;

/// `struct io_uring_sqe` and `struct io_uring_cqe` (without
/// `IORING_SETUP_SQE128` / `IORING_SETUP_CQE32`).
pub const SQE_LEN: usize = 64;
pub const CQE_LEN: usize = 16;

/// `IORING_ENTER_GETEVENTS`: waits for completions.
pub const IORING_ENTER_GETEVENTS: u32 = 1 << 0;
/// `IORING_ENTER_REGISTERED_RING`: `fd` is a slot of the caller's
/// registered rings (`IORING_REGISTER_RING_FDS`), of which a task has
/// `IO_RINGFD_REG_MAX`.
pub const IORING_ENTER_REGISTERED_RING: u32 = 1 << 4;
pub const IO_RINGFD_REG_MAX: u32 = 16;
/// `IORING_ENTER_SQ_WAKEUP`: wakes the SQ poll thread.
pub const IORING_ENTER_SQ_WAKEUP: u32 = 1 << 1;

/// `io_uring_register` operations.
/// An eventfd signalled on completions (`_ASYNC`: 7, the same slot).
pub const IORING_REGISTER_EVENTFD: u32 = 4;
pub const IORING_REGISTER_PROBE: u32 = 8;
/// Registers the caller's credentials; answers their id.
pub const IORING_REGISTER_PERSONALITY: u32 = 9;
pub const IORING_UNREGISTER_PERSONALITY: u32 = 10;
pub const IORING_REGISTER_RESTRICTIONS: u32 = 11;
pub const IORING_REGISTER_ENABLE_RINGS: u32 = 12;
pub const IORING_REGISTER_FILES2: u32 = 13;
pub const IORING_REGISTER_FILES_UPDATE2: u32 = 14;
pub const IORING_REGISTER_BUFFERS2: u32 = 15;
pub const IORING_REGISTER_BUFFERS_UPDATE: u32 = 16;
/// `IORING_RSRC_REGISTER_SPARSE`: a table of empty slots.
pub const IORING_RSRC_REGISTER_SPARSE: u32 = 1 << 0;

/// `struct io_uring_rsrc_register`: a table of registered files or buffers.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RsrcRegister {
    pub nr: u32,
    pub flags: u32,
    pub resv2: u64,
    pub data: u64,
    pub tags: u64,
}
pub const RSRC_REGISTER_LEN: usize = 32;
const _: () = assert!(size_of::<RsrcRegister>() == RSRC_REGISTER_LEN);

/// `struct io_uring_rsrc_update2`: slots `offset..offset + nr` set from
/// `data` (fds, or `struct iovec`s).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RsrcUpdate2 {
    pub offset: u32,
    pub resv: u32,
    pub data: u64,
    pub tags: u64,
    pub nr: u32,
    pub resv2: u32,
}
pub const RSRC_UPDATE2_LEN: usize = 32;
const _: () = assert!(size_of::<RsrcUpdate2>() == RSRC_UPDATE2_LEN);
const _: () = assert!(offset_of!(RsrcUpdate2, nr) == 24);

impl RsrcRegister {
    /// Its bytes (native byte order).
    pub fn to_bytes(&self) -> [u8; RSRC_REGISTER_LEN] {
        let mut b = [0u8; RSRC_REGISTER_LEN];
        b[0..4].copy_from_slice(&self.nr.to_ne_bytes());
        b[4..8].copy_from_slice(&self.flags.to_ne_bytes());
        b[8..16].copy_from_slice(&self.resv2.to_ne_bytes());
        b[16..24].copy_from_slice(&self.data.to_ne_bytes());
        b[24..32].copy_from_slice(&self.tags.to_ne_bytes());
        b
    }
}

impl RsrcUpdate2 {
    /// Its bytes (native byte order).
    pub fn to_bytes(&self) -> [u8; RSRC_UPDATE2_LEN] {
        let mut b = [0u8; RSRC_UPDATE2_LEN];
        b[0..4].copy_from_slice(&self.offset.to_ne_bytes());
        b[4..8].copy_from_slice(&self.resv.to_ne_bytes());
        b[8..16].copy_from_slice(&self.data.to_ne_bytes());
        b[16..24].copy_from_slice(&self.tags.to_ne_bytes());
        b[24..28].copy_from_slice(&self.nr.to_ne_bytes());
        b[28..32].copy_from_slice(&self.resv2.to_ne_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_round_trip_through_bytes() {
        let p = IoUringParams {
            sq_entries: 8,
            cq_entries: 16,
            flags: IORING_SETUP_CQSIZE,
            features: 0x3ffff,
            sq_off: SqringOffsets {
                tail: 4,
                array: 320,
                user_addr: 1 << 40,
                ..Default::default()
            },
            cq_off: CqringOffsets {
                cqes: 64,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(IoUringParams::from_bytes(&p.to_bytes()), p);
        // The user addresses (IORING_SETUP_NO_MMAP) where the kernel reads them.
        assert_eq!(p.to_bytes()[72..80], (1u64 << 40).to_ne_bytes());
    }
}
