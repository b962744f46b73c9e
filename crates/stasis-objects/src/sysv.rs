//! System V shared memory segments.
//!
//! A segment is an object of the IPC namespace, not of a process; it is
//! saved (once, with its key, mode, owner and data extents) when a process
//! of the tree attaches it. At restore, one the processes did not remove
//! outlives their kill and is reused as it is (same id, key and size; its
//! content is put back to the image's). A removed one (`SHM_DEST`) is
//! created again at its id, by writing the id to
//! `/proc/sys/kernel/shm_next_id` first, and removed again once everyone
//! has attached it ([`finish`]).

use stasis_image::manifest::SysvShm;
use stasis_image::ContentSource;
use stasis_kernel::{sysvshm, KernelError};
use stasis_sys::net::{SHM_DEST, SHM_NEXT_ID};

use crate::ghost::read_sparse;
use crate::{RestoreError, SaveCtx, SaveError};

/// One row of `/proc/sysvipc/shm`: key shmid perms(octal) size cpid lpid
/// nattch uid gid cuid cgid, as numbers.
fn row(table: &str, shmid: i32) -> Option<Vec<u64>> {
    table
        .lines()
        .skip(1)
        .map(|l| {
            l.split_whitespace()
                .take(11)
                .enumerate()
                .filter_map(|(i, x)| {
                    if i == 2 {
                        u64::from_str_radix(x, 8).ok()
                    } else {
                        x.parse::<u64>().ok()
                    }
                })
                .collect::<Vec<u64>>()
        })
        .find(|f| f.len() == 11 && f[1] == u64::from(shmid.unsigned_abs()))
}

impl SaveCtx {
    /// Saves a System V segment `pid` attaches at `start..end` from byte
    /// `offset` (once; whole, whatever part is attached: the mapping's
    /// file is the segment). Returns whether the area maps only part of
    /// it.
    pub fn capture_sysv(
        &mut self,
        pid: i32,
        shmid: i32,
        (start, end): (u64, u64),
        offset: u64,
    ) -> Result<bool, SaveError> {
        let partial = |size: u64| offset != 0 || end - start != size.div_ceil(4096) * 4096;
        if let Some(s) = self.sysv.iter().find(|s| s.shmid == shmid) {
            return Ok(partial(s.size));
        }
        // The table of the process's IPC namespace (read from inside it,
        // if it is not ours).
        let read = || std::fs::read_to_string("/proc/sysvipc/shm");
        let ipc = stasis_kernel::ns::NsKind::Ipc;
        let table = if stasis_kernel::ns::ns_id(pid, ipc) == stasis_kernel::ns::own_ns_id(ipc) {
            read()
        } else {
            stasis_kernel::ns::in_namespaces_of(pid, &[ipc], read)?
        }
        .map_err(|e| SaveError::Proc {
            pid,
            file: "../sysvipc/shm".into(),
            source: e,
        })?;
        let row = row(&table, shmid).ok_or_else(|| SaveError::Unsupported { pid, what: format!("System V segment {shmid} is not listed in /proc/sysvipc/shm (another IPC namespace?)") })?;
        let (key, mode, size, uid, gid) = (row[0], row[2], row[3], row[7], row[8]);
        if offset + (end - start) > size.div_ceil(4096) * 4096 {
            return Err(SaveError::Unsupported { pid, what: format!("area {start:#x}-{end:#x} maps System V segment {shmid} ({size} bytes) from byte {offset}, beyond its end") });
        }
        let name = format!("map_files/{start:x}-{end:x}");
        let (_, content) = read_sparse(pid, &name)?;
        self.sysv_content.insert(shmid, content);
        let to32 = |v: u64| u32::try_from(v).unwrap_or(0);
        self.sysv.push(SysvShm {
            key: i32::from_ne_bytes(to32(key).to_ne_bytes()),
            shmid,
            mode: to32(mode),
            uid: to32(uid),
            gid: to32(gid),
            data: Vec::new(),
            size,
            extents: Vec::new(),
        });
        Ok(partial(size))
    }
}

fn os_err(what: String) -> impl FnOnce(std::io::Error) -> RestoreError {
    move |source| RestoreError::Step {
        what,
        source: KernelError::Io {
            what: "System V shared memory".into(),
            source,
        },
    }
}

/// Makes every segment exist at its id with the image's content: its data
/// extents, and holes (no page) everywhere else.
pub fn prepare(segs: &[SysvShm], src: Option<&ContentSource>) -> Result<(), RestoreError> {
    for s in segs {
        let (size, extents) = s
            .content()
            .map_err(|e| RestoreError::Inconsistent(e.to_string()))?;
        let size = usize::try_from(size).map_err(|_| {
            RestoreError::Inconsistent(format!("System V segment {} is too large", s.shmid))
        })?;
        let reused = match sysvshm::stat(s.shmid).filter(|(key, _)| *key == s.key) {
            Some((_, sz)) if sz == size => true,
            Some((_, sz)) => {
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
        // Put the content back (a reused segment is emptied first).
        let refill_err = |e| match e {
            sysvshm::RefillError::Attach(e) => os_err(format!(
                "attaching System V segment {} to refill it",
                s.shmid
            ))(e),
            sysvshm::RefillError::Empty(e) => os_err(format!(
                "emptying System V segment {} to refill it",
                s.shmid
            ))(e),
            sysvshm::RefillError::OutOfBounds { offset, len } => {
                RestoreError::Inconsistent(format!(
                    "System V segment {}: extent {offset}+{len} past the size {size}",
                    s.shmid
                ))
            }
        };
        let mut seg = sysvshm::Attached::open(s.shmid, size, reused).map_err(refill_err)?;
        crate::content::put_back(src, &extents, |off, data| {
            seg.write_at(off, data).map_err(refill_err)
        })?;
    }
    Ok(())
}

fn create(s: &SysvShm, size: usize) -> Result<(), RestoreError> {
    std::fs::write(SHM_NEXT_ID, format!("{}\n", s.shmid)).map_err(|e| RestoreError::Step {
        what: format!("choosing the id of System V segment {}", s.shmid),
        source: KernelError::Io {
            what: SHM_NEXT_ID.into(),
            source: e,
        },
    })?;
    let flags = libc::IPC_CREAT | libc::IPC_EXCL | i32::try_from(s.mode & 0o777).unwrap_or(0o600);
    let id = sysvshm::create(s.key, size, flags);
    let _ = std::fs::write(SHM_NEXT_ID, "-1\n");
    let id = id.map_err(os_err(format!(
        "creating System V segment {} (key {:#x})",
        s.shmid, s.key
    )))?;
    if id != s.shmid {
        sysvshm::remove(id);
        return Err(RestoreError::Incompatible(format!(
            "System V segment {} came back as {id}",
            s.shmid
        )));
    }
    sysvshm::set_owner(id, s.uid, s.gid);
    Ok(())
}

/// Removes again the segments that were removed while attached.
pub fn finish(segs: &[SysvShm]) {
    for s in segs.iter().filter(|s| s.mode & SHM_DEST != 0) {
        sysvshm::remove(s.shmid);
    }
}
