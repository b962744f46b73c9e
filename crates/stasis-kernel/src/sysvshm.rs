//! Safe wrappers over System V shared memory (`shmget`, `shmctl`, `shmat`).

use std::io;

/// Key and size of segment `shmid`, if it exists.
pub fn stat(shmid: i32) -> Option<(i32, usize)> {
    // SAFETY: shmid_ds is plain data; zeroes are a valid value.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT writes into `ds`.
    if unsafe { libc::shmctl(shmid, libc::IPC_STAT, &mut ds) } < 0 {
        return None;
    }
    Some((ds.shm_perm.__key, ds.shm_segsz))
}

/// `shmget(key, size, flags)`: the new segment's id.
pub fn create(key: i32, size: usize, flags: i32) -> io::Result<i32> {
    // SAFETY: shmget takes integers only.
    let id = unsafe { libc::shmget(key, size, flags) };
    if id < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(id)
}

/// `shmctl(IPC_RMID)`: the segment goes once nobody has it attached.
pub fn remove(shmid: i32) {
    // SAFETY: IPC_RMID takes no buffer.
    unsafe { libc::shmctl(shmid, libc::IPC_RMID, std::ptr::null_mut()) };
}

/// Gives segment `shmid` an owner (best effort, as `IPC_SET` does).
pub fn set_owner(shmid: i32, uid: u32, gid: u32) {
    // SAFETY: shmid_ds is plain data; zeroes are a valid value.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT fills `ds`, IPC_SET reads it.
    unsafe {
        if libc::shmctl(shmid, libc::IPC_STAT, &mut ds) == 0 {
            ds.shm_perm.uid = uid;
            ds.shm_perm.gid = gid;
            libc::shmctl(shmid, libc::IPC_SET, &mut ds);
        }
    }
}

/// Why [`Attached::open`] or [`Attached::write_at`] failed.
#[derive(Debug)]
pub enum RefillError {
    /// `shmat` failed.
    Attach(io::Error),
    /// Freeing the old pages (`MADV_REMOVE`) failed.
    Empty(io::Error),
    /// An extent does not fit in the segment.
    OutOfBounds { offset: u64, len: usize },
}

/// Segment `shmid` of `size` bytes attached in this process to put content
/// back into it, a piece at a time ([`Attached::write_at`]); detached on
/// drop.
#[derive(Debug)]
pub struct Attached {
    p: *mut libc::c_void,
    size: usize,
}

impl Attached {
    /// Attaches segment `shmid` of `size` bytes, emptied first when
    /// `empty` (`MADV_REMOVE` punches holes in shmem).
    pub fn open(shmid: i32, size: usize, empty: bool) -> Result<Attached, RefillError> {
        // SAFETY: attaching anywhere in this process (the kernel picks a free range).
        let p = unsafe { libc::shmat(shmid, std::ptr::null(), 0) };
        if p as isize == -1 {
            return Err(RefillError::Attach(io::Error::last_os_error()));
        }
        let a = Attached { p, size };
        // SAFETY: `p` is a fresh attachment of `size` bytes.
        if empty && size > 0 && unsafe { libc::madvise(p, size, libc::MADV_REMOVE) } != 0 {
            return Err(RefillError::Empty(io::Error::last_os_error()));
        }
        Ok(a)
    }

    /// Copies `d` to offset `off` of the segment.
    pub fn write_at(&mut self, off: u64, d: &[u8]) -> Result<(), RefillError> {
        let at = usize::try_from(off)
            .ok()
            .filter(|o| o.checked_add(d.len()).is_some_and(|e| e <= self.size))
            .ok_or(RefillError::OutOfBounds {
                offset: off,
                len: d.len(),
            })?;
        // SAFETY: at + d.len() <= size (checked above): inside the
        // attachment; the source is our own slice, not overlapping it.
        unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), self.p.cast::<u8>().add(at), d.len()) };
        Ok(())
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        // SAFETY: detaching the attachment made by `open`, once.
        unsafe { libc::shmdt(self.p) };
    }
}
