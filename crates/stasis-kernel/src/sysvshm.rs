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

/// Why [`refill`] failed.
#[derive(Debug)]
pub enum RefillError {
    /// `shmat` failed.
    Attach(io::Error),
    /// Freeing the old pages (`MADV_REMOVE`) failed.
    Empty(io::Error),
    /// An extent does not fit in the segment.
    OutOfBounds { offset: u64, len: usize },
}

/// Puts content back into segment `shmid` of `size` bytes: attached in
/// this process, emptied first when `empty` (`MADV_REMOVE` punches holes
/// in shmem), each extent `(offset, bytes)` copied to its offset, detached.
pub fn refill(
    shmid: i32,
    size: usize,
    empty: bool,
    extents: &[(u64, &[u8])],
) -> Result<(), RefillError> {
    for &(off, d) in extents {
        let end = usize::try_from(off)
            .ok()
            .and_then(|o| o.checked_add(d.len()));
        if end.is_none_or(|e| e > size) {
            return Err(RefillError::OutOfBounds {
                offset: off,
                len: d.len(),
            });
        }
    }
    // SAFETY: attaching anywhere in this process (the kernel picks a free range).
    let p = unsafe { libc::shmat(shmid, std::ptr::null(), 0) };
    if p as isize == -1 {
        return Err(RefillError::Attach(io::Error::last_os_error()));
    }
    // SAFETY: `p` is a fresh attachment of `size` bytes.
    if empty && size > 0 && unsafe { libc::madvise(p, size, libc::MADV_REMOVE) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: detaching the attachment made above.
        unsafe { libc::shmdt(p) };
        return Err(RefillError::Empty(e));
    }
    for &(off, d) in extents {
        let off = usize::try_from(off).unwrap_or(0);
        // SAFETY: off + d.len() <= size (checked above): inside the
        // attachment; the source is our own slice, not overlapping it.
        unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), p.cast::<u8>().add(off), d.len()) };
    }
    // SAFETY: detaching the attachment made above.
    unsafe { libc::shmdt(p) };
    Ok(())
}
