//! Linux native AIO (include/uapi/linux/aio_abi.h, fs/aio.c): the layout
//! of a context's ring, which is mapped in the process, and of `struct
//! iocb`, which Stasis writes into a process's memory to submit requests
//! there.

use core::mem::{offset_of, size_of};

/// `struct aio_ring`'s header (id, nr, head, tail, magic, features,
/// header length), before the events.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct AioRingHeader {
    pub id: u32,
    pub nr: u32,
    pub head: u32,
    pub tail: u32,
    pub magic: u32,
    pub compat_features: u32,
    pub incompat_features: u32,
    pub header_length: u32,
}
pub const AIO_RING_HEADER_LEN: usize = 32;
const _: () = assert!(size_of::<AioRingHeader>() == AIO_RING_HEADER_LEN);
/// Byte offsets of `nr`, `head` and `tail` in the header.
pub const AIO_RING_NR: usize = offset_of!(AioRingHeader, nr);
pub const AIO_RING_HEAD: usize = offset_of!(AioRingHeader, head);
pub const AIO_RING_TAIL: usize = offset_of!(AioRingHeader, tail);

/// `struct io_event`: data, obj, res, res2.
pub const IO_EVENT_LEN: usize = 32;

/// `struct iocb` (little-endian layout).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Iocb {
    pub aio_data: u64,
    pub aio_key: u32,
    pub aio_rw_flags: u32,
    pub aio_lio_opcode: u16,
    pub aio_reqprio: i16,
    pub aio_fildes: u32,
    pub aio_buf: u64,
    pub aio_nbytes: u64,
    pub aio_offset: i64,
    pub aio_reserved2: u64,
    pub aio_flags: u32,
    pub aio_resfd: u32,
}
pub const IOCB_LEN: usize = 64;
const _: () = assert!(size_of::<Iocb>() == IOCB_LEN);
const _: () = assert!(offset_of!(Iocb, aio_lio_opcode) == 16);
const _: () = assert!(offset_of!(Iocb, aio_fildes) == 20);
const _: () = assert!(offset_of!(Iocb, aio_buf) == 24);
const _: () = assert!(offset_of!(Iocb, aio_nbytes) == 32);

/// `IOCB_CMD_PREAD`.
pub const IOCB_CMD_PREAD: u16 = 0;

impl Iocb {
    /// Its bytes, as the kernel reads them (native byte order).
    pub fn to_bytes(&self) -> [u8; IOCB_LEN] {
        let mut b = [0u8; IOCB_LEN];
        b[0..8].copy_from_slice(&self.aio_data.to_ne_bytes());
        b[8..12].copy_from_slice(&self.aio_key.to_ne_bytes());
        b[12..16].copy_from_slice(&self.aio_rw_flags.to_ne_bytes());
        b[16..18].copy_from_slice(&self.aio_lio_opcode.to_ne_bytes());
        b[18..20].copy_from_slice(&self.aio_reqprio.to_ne_bytes());
        b[20..24].copy_from_slice(&self.aio_fildes.to_ne_bytes());
        b[24..32].copy_from_slice(&self.aio_buf.to_ne_bytes());
        b[32..40].copy_from_slice(&self.aio_nbytes.to_ne_bytes());
        b[40..48].copy_from_slice(&self.aio_offset.to_ne_bytes());
        b[48..56].copy_from_slice(&self.aio_reserved2.to_ne_bytes());
        b[56..60].copy_from_slice(&self.aio_flags.to_ne_bytes());
        b[60..64].copy_from_slice(&self.aio_resfd.to_ne_bytes());
        b
    }
}
