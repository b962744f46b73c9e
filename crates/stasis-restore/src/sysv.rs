//! System V shared memory segments.
//!
//! A segment is an object of the IPC namespace, not of a process: one the
//! processes did not remove outlives their kill and is reused as it is (same
//! id, key and size; its content is put back to the image's). A removed one
//! (`SHM_DEST`) is created again at its id, by writing the id to
//! `/proc/sys/kernel/shm_next_id` first, and removed again once everyone has
//! attached it.

use stasis_image::manifest::SysvShm;
use stasis_kernel::KernelError;

use crate::RestoreError;

const SHM_DEST: u32 = 0o1000;
const NEXT_ID: &str = "/proc/sys/kernel/shm_next_id";

fn os_err(what: String) -> RestoreError {
    RestoreError::Step {
        what,
        source: KernelError::Io {
            what: "System V shared memory".into(),
            source: std::io::Error::last_os_error(),
        },
    }
}

/// Size of an existing segment `shmid` with key `key`, if there is one.
fn existing(shmid: i32, key: i32) -> Option<usize> {
    // SAFETY: shmid_ds is plain data; shmctl(IPC_STAT) fills it.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT writes into `ds`.
    if unsafe { libc::shmctl(shmid, libc::IPC_STAT, &mut ds) } < 0 {
        return None;
    }
    (ds.shm_perm.__key == key).then_some(ds.shm_segsz)
}

/// Makes every segment exist at its id with the image's content: its data
/// extents, and holes (no page) everywhere else.
pub fn prepare(segs: &[SysvShm]) -> Result<(), RestoreError> {
    for s in segs {
        let (size, extents) = s.content().map_err(RestoreError::Inconsistent)?;
        let size = usize::try_from(size).map_err(|_| {
            RestoreError::Inconsistent(format!("System V segment {} is too large", s.shmid))
        })?;
        let reused = match existing(s.shmid, s.key) {
            Some(sz) if sz == size => true,
            Some(sz) => {
                return Err(RestoreError::Incompatible(format!(
                    "System V segment {} exists with {sz} bytes, the image has {size}",
                    s.shmid
                )))
            }
            None => {
                create(s, size)?;
                false
            }
        };
        // Put the content back.
        // SAFETY: attaching the segment anywhere in stasis (`size` bytes
        // long), freeing the pages of a reused one (MADV_REMOVE punches
        // holes in shmem), copying each extent (checked to lie inside
        // `size`) to its offset, detaching.
        unsafe {
            let p = libc::shmat(s.shmid, std::ptr::null(), 0);
            if p as isize == -1 {
                return Err(os_err(format!(
                    "attaching System V segment {} to refill it",
                    s.shmid
                )));
            }
            if reused && size > 0 && libc::madvise(p, size, libc::MADV_REMOVE) != 0 {
                let e = os_err(format!(
                    "emptying System V segment {} to refill it",
                    s.shmid
                ));
                libc::shmdt(p);
                return Err(e);
            }
            for (off, data) in extents {
                let off = usize::try_from(off).unwrap_or(usize::MAX);
                std::ptr::copy_nonoverlapping(data.as_ptr(), p.cast::<u8>().add(off), data.len());
            }
            libc::shmdt(p);
        }
    }
    Ok(())
}

fn create(s: &SysvShm, size: usize) -> Result<(), RestoreError> {
    std::fs::write(NEXT_ID, format!("{}\n", s.shmid)).map_err(|e| RestoreError::Step {
        what: format!("choosing the id of System V segment {}", s.shmid),
        source: KernelError::Io {
            what: NEXT_ID.into(),
            source: e,
        },
    })?;
    let flags = libc::IPC_CREAT | libc::IPC_EXCL | i32::try_from(s.mode & 0o777).unwrap_or(0o600);
    // SAFETY: shmget with integer arguments.
    let id = unsafe { libc::shmget(s.key, size, flags) };
    let _ = std::fs::write(NEXT_ID, "-1\n");
    if id < 0 {
        return Err(os_err(format!(
            "creating System V segment {} (key {:#x})",
            s.shmid, s.key
        )));
    }
    if id != s.shmid {
        // SAFETY: removing the segment we just created.
        unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
        return Err(RestoreError::Incompatible(format!(
            "System V segment {} came back as {id}",
            s.shmid
        )));
    }
    // SAFETY: shmid_ds is plain data; IPC_STAT fills it, IPC_SET reads it.
    unsafe {
        let mut ds: libc::shmid_ds = std::mem::zeroed();
        if libc::shmctl(id, libc::IPC_STAT, &mut ds) == 0 {
            ds.shm_perm.uid = s.uid;
            ds.shm_perm.gid = s.gid;
            libc::shmctl(id, libc::IPC_SET, &mut ds);
        }
    }
    Ok(())
}

/// Removes again the segments that were removed while attached.
pub fn finish(segs: &[SysvShm]) {
    for s in segs.iter().filter(|s| s.mode & SHM_DEST != 0) {
        // SAFETY: IPC_RMID on a segment of the image.
        unsafe { libc::shmctl(s.shmid, libc::IPC_RMID, std::ptr::null_mut()) };
    }
}
