//! Safe wrappers over System V message queues (`msgget`, `msgctl`,
//! `msgsnd`, `msgrcv`) and semaphore sets (`semget`, `semctl`), in the
//! calling thread's IPC namespace.

use std::io;

use stasis_sys::net::MSG_COPY;

/// What `IPC_STAT` says of an object: its key, owner and permission bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcStat {
    pub key: i32,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

fn perm_of(p: &libc::ipc_perm) -> IpcStat {
    IpcStat {
        key: p.__key,
        uid: p.uid,
        gid: p.gid,
        mode: u32::from(p.mode),
    }
}

fn check(r: i32) -> io::Result<i32> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A message queue's permissions, the number of messages in it, the bytes
/// they hold and the most it holds (`msg_qbytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgStat {
    pub perm: IpcStat,
    pub qnum: u64,
    pub cbytes: u64,
    pub qbytes: u64,
}

fn msg_ds(id: i32) -> io::Result<libc::msqid_ds> {
    // SAFETY: msqid_ds is plain data; zeroes are a valid value.
    let mut ds: libc::msqid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT writes one msqid_ds into `ds`.
    check(unsafe { libc::msgctl(id, libc::IPC_STAT, &mut ds) })?;
    Ok(ds)
}

/// `msgctl(IPC_STAT)` of queue `id`.
pub fn msg_stat(id: i32) -> io::Result<MsgStat> {
    let ds = msg_ds(id)?;
    Ok(MsgStat {
        perm: perm_of(&ds.msg_perm),
        qnum: ds.msg_qnum,
        cbytes: ds.__msg_cbytes,
        qbytes: ds.msg_qbytes,
    })
}

/// Message number `index` (0: the oldest) of queue `id`, left in the
/// queue (`MSG_COPY`): its type and bytes; `max` bounds its size.
pub fn msg_peek(id: i32, index: u64, max: usize) -> io::Result<(i64, Vec<u8>)> {
    let word = std::mem::size_of::<libc::c_long>();
    // The buffer: a long (mtype), then the text; as longs, for alignment.
    let mut buf = vec![0 as libc::c_long; 1 + max.div_ceil(word)];
    let index =
        libc::c_long::try_from(index).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `buf` holds a long and `max` bytes after it, as msgrcv
    // writes at most (it fails with E2BIG on a longer message).
    let n = unsafe {
        libc::msgrcv(
            id,
            buf.as_mut_ptr().cast(),
            max,
            index,
            libc::IPC_NOWAIT | MSG_COPY,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = usize::try_from(n).unwrap_or(0).min(max);
    let mtype = buf[0];
    // SAFETY: the text starts one long into `buf` and the kernel wrote
    // `n <= max` bytes of it, inside the buffer.
    let text = unsafe { std::slice::from_raw_parts(buf.as_ptr().add(1).cast::<u8>(), n) };
    Ok((mtype, text.to_vec()))
}

/// `msgget(key, flags)`: the queue's id.
pub fn msg_create(key: i32, flags: i32) -> io::Result<i32> {
    // SAFETY: msgget takes integers only.
    check(unsafe { libc::msgget(key, flags) })
}

/// Queues a message of type `mtype` on queue `id` (without waiting).
pub fn msg_send(id: i32, mtype: i64, data: &[u8]) -> io::Result<()> {
    let word = std::mem::size_of::<libc::c_long>();
    let mut buf = vec![0 as libc::c_long; 1 + data.len().div_ceil(word)];
    buf[0] = mtype;
    // SAFETY: the text area of `buf` (after its first long) holds at least
    // data.len() bytes; the source is our own slice.
    unsafe {
        std::ptr::copy_nonoverlapping(
            data.as_ptr(),
            buf.as_mut_ptr().add(1).cast::<u8>(),
            data.len(),
        );
    }
    // SAFETY: msgsnd reads a long and data.len() bytes from `buf`.
    check(unsafe { libc::msgsnd(id, buf.as_ptr().cast(), data.len(), libc::IPC_NOWAIT) })?;
    Ok(())
}

/// Gives queue `id` an owner, permission bits and size (`IPC_SET`).
pub fn msg_set(id: i32, uid: u32, gid: u32, mode: u32, qbytes: u64) -> io::Result<()> {
    let mut ds = msg_ds(id)?;
    ds.msg_perm.uid = uid;
    ds.msg_perm.gid = gid;
    ds.msg_perm.mode = u16::try_from(mode & 0o777).unwrap_or(0o600);
    ds.msg_qbytes = qbytes;
    // SAFETY: IPC_SET reads one msqid_ds from `ds`.
    check(unsafe { libc::msgctl(id, libc::IPC_SET, &mut ds) })?;
    Ok(())
}

/// `msgctl(IPC_RMID)`.
pub fn msg_remove(id: i32) {
    // SAFETY: IPC_RMID takes no buffer.
    unsafe { libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
}

fn sem_ds(id: i32) -> io::Result<libc::semid_ds> {
    // SAFETY: semid_ds is plain data; zeroes are a valid value.
    let mut ds: libc::semid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT writes one semid_ds through the pointer passed as
    // semctl's fourth (union semun) argument.
    check(unsafe { libc::semctl(id, 0, libc::IPC_STAT, &mut ds as *mut libc::semid_ds) })?;
    Ok(ds)
}

/// A semaphore set's permissions and the value of each semaphore.
pub fn sem_stat(id: i32) -> io::Result<(IpcStat, Vec<u16>)> {
    let ds = sem_ds(id)?;
    let n = usize::try_from(ds.sem_nsems).unwrap_or(0);
    let mut values = vec![0u16; n];
    // SAFETY: GETALL writes sem_nsems unsigned shorts through the pointer
    // (semun.array); `values` has that many.
    check(unsafe { libc::semctl(id, 0, libc::GETALL, values.as_mut_ptr()) })?;
    Ok((perm_of(&ds.sem_perm), values))
}

/// `semget(key, nsems, flags)`: the set's id.
pub fn sem_create(key: i32, nsems: i32, flags: i32) -> io::Result<i32> {
    // SAFETY: semget takes integers only.
    check(unsafe { libc::semget(key, nsems, flags) })
}

/// Sets every semaphore of set `id` (`SETALL`; `values` has one per
/// semaphore) and gives it an owner and permission bits (`IPC_SET`).
pub fn sem_set(id: i32, values: &[u16], uid: u32, gid: u32, mode: u32) -> io::Result<()> {
    let mut ds = sem_ds(id)?;
    if usize::try_from(ds.sem_nsems).ok() != Some(values.len()) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: SETALL reads sem_nsems unsigned shorts through the pointer
    // (semun.array); `values` has that many (checked above).
    check(unsafe { libc::semctl(id, 0, libc::SETALL, values.as_ptr()) })?;
    ds.sem_perm.uid = uid;
    ds.sem_perm.gid = gid;
    ds.sem_perm.mode = u16::try_from(mode & 0o777).unwrap_or(0o600);
    // SAFETY: IPC_SET reads one semid_ds through the pointer.
    check(unsafe { libc::semctl(id, 0, libc::IPC_SET, &mut ds as *mut libc::semid_ds) })?;
    Ok(())
}

/// `semctl(IPC_RMID)`.
pub fn sem_remove(id: i32) {
    // SAFETY: IPC_RMID takes no argument.
    unsafe { libc::semctl(id, 0, libc::IPC_RMID) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A private queue: two messages peeked in order and left there; a
    /// private set's values and owner come back from stat (on a thread
    /// in an IPC namespace of its own: nothing is left behind).
    #[test]
    fn queue_and_set_round_trip() {
        std::thread::spawn(round_trip).join().unwrap();
    }

    fn round_trip() {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWIPC).unwrap();
        let q = msg_create(libc::IPC_PRIVATE, libc::IPC_CREAT | 0o600).unwrap();
        msg_send(q, 3, b"first").unwrap();
        msg_send(q, 9, b"second message").unwrap();
        let st = msg_stat(q).unwrap();
        assert_eq!((st.qnum, st.cbytes), (2, 19));
        assert_eq!(msg_peek(q, 0, 64).unwrap(), (3, b"first".to_vec()));
        assert_eq!(msg_peek(q, 1, 64).unwrap(), (9, b"second message".to_vec()));
        assert_eq!(msg_stat(q).unwrap().qnum, 2);
        msg_set(q, 0, 0, 0o640, 4096).unwrap();
        let st = msg_stat(q).unwrap();
        assert_eq!((st.perm.mode & 0o777, st.qbytes), (0o640, 4096));
        msg_remove(q);
        let s = sem_create(libc::IPC_PRIVATE, 3, libc::IPC_CREAT | 0o600).unwrap();
        sem_set(s, &[1, 5, 7], 0, 0, 0o644).unwrap();
        let (perm, values) = sem_stat(s).unwrap();
        assert_eq!(values, vec![1, 5, 7]);
        assert_eq!(perm.mode & 0o777, 0o644);
        assert!(sem_set(s, &[1], 0, 0, 0o644).is_err());
        sem_remove(s);
    }
}
