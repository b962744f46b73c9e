//! System V message queues and semaphore sets of a tree's IPC namespace.
//!
//! Unlike segments ([`crate::sysv`]), which are saved when a process
//! attaches them, queues and sets are reached by no fd or mapping: when the
//! tree has an IPC namespace of its own, every one of that namespace is
//! the tree's and is saved ([`save`], on a thread in the namespace): its
//! id, key, owner, mode, and the queued messages (read with `MSG_COPY`,
//! which leaves them queued) with their types, or the semaphore values.
//! [`restore`] (on a thread in the new namespace, before the tree runs)
//! makes each at its id (written first to `/proc/sys/kernel/msg_next_id`
//! or `sem_next_id`, which are the namespace's), queues the messages
//! again in order, sets the values, then the owner and mode. Semaphore
//! undo adjustments (`SEM_UNDO`) of the processes are not saved.

use stasis_image::manifest::{SysvIpcPerm, SysvMessage, SysvMsgQueue, SysvSemSet};
use stasis_kernel::{sysvipc, KernelError};
use stasis_sys::net::{MSG_NEXT_ID, SEM_NEXT_ID};

use crate::{RestoreError, SaveError};

/// The ids listed in a `/proc/sysvipc/{msg,sem}` table (second column).
fn ids(table: &str) -> Vec<i32> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect()
}

fn perm(id: i32, p: sysvipc::IpcStat) -> SysvIpcPerm {
    SysvIpcPerm {
        id,
        key: p.key,
        uid: p.uid,
        gid: p.gid,
        mode: p.mode & 0o777,
    }
}

/// The message queues and semaphore sets of the calling thread's IPC
/// namespace (the tree's, whose root is `pid`, for messages).
pub fn save(pid: i32) -> Result<(Vec<SysvMsgQueue>, Vec<SysvSemSet>), SaveError> {
    let table = |f: &str| {
        std::fs::read_to_string(format!("/proc/sysvipc/{f}")).map_err(|e| SaveError::Proc {
            pid,
            file: format!("../sysvipc/{f}"),
            source: e,
        })
    };
    let os = |what: String| {
        move |e: std::io::Error| SaveError::Kernel(KernelError::Io { what, source: e })
    };
    let mut queues = Vec::new();
    for id in ids(&table("msg")?) {
        let st = sysvipc::msg_stat(id).map_err(os(format!("msgctl(IPC_STAT) of queue {id}")))?;
        let max = usize::try_from(st.cbytes).unwrap_or(usize::MAX);
        let mut messages = Vec::new();
        let mut bytes = 0u64;
        for i in 0..st.qnum {
            let (mtype, data) = sysvipc::msg_peek(id, i, max).map_err(|e| {
                if e.raw_os_error() == Some(libc::ENOSYS) {
                    SaveError::Unsupported {
                        pid,
                        what: format!("reading the messages of System V queue {id} needs MSG_COPY (a kernel with CONFIG_CHECKPOINT_RESTORE)"),
                    }
                } else {
                    os(format!("msgrcv(MSG_COPY) of message {i} of queue {id}"))(e)
                }
            })?;
            bytes += data.len() as u64;
            messages.push(SysvMessage { mtype, data });
        }
        // The tree is frozen: nothing changes the queue meanwhile.
        if bytes != st.cbytes {
            return Err(SaveError::Unsupported {
                pid,
                what: format!("System V queue {id} changed while it was read ({bytes} bytes read, {} queued): a process outside the tree uses it", st.cbytes),
            });
        }
        queues.push(SysvMsgQueue {
            perm: perm(id, st.perm),
            qbytes: st.qbytes,
            messages,
        });
    }
    let mut sets = Vec::new();
    for id in ids(&table("sem")?) {
        let (p, values) =
            sysvipc::sem_stat(id).map_err(os(format!("semctl(IPC_STAT, GETALL) of set {id}")))?;
        sets.push(SysvSemSet {
            perm: perm(id, p),
            values,
        });
    }
    Ok((queues, sets))
}

fn step(what: String) -> impl FnOnce(std::io::Error) -> RestoreError {
    move |source| RestoreError::Step {
        what,
        source: KernelError::Io {
            what: "System V IPC".into(),
            source,
        },
    }
}

/// Makes an object at id `p.id` with `create` (`IPC_CREAT | IPC_EXCL`
/// and the mode), its id chosen through `next_id`.
fn create_at(
    what: &str,
    p: &SysvIpcPerm,
    next_id: &str,
    create: impl FnOnce(i32) -> std::io::Result<i32>,
    remove: impl FnOnce(i32),
) -> Result<(), RestoreError> {
    std::fs::write(next_id, format!("{}\n", p.id)).map_err(step(format!(
        "choosing the id of System V {what} {} ({next_id})",
        p.id
    )))?;
    let flags = libc::IPC_CREAT | libc::IPC_EXCL | i32::try_from(p.mode & 0o777).unwrap_or(0o600);
    let id = create(flags);
    let _ = std::fs::write(next_id, "-1\n");
    let id = id.map_err(step(format!(
        "creating System V {what} {} (key {:#x})",
        p.id, p.key
    )))?;
    if id != p.id {
        remove(id);
        return Err(RestoreError::Incompatible(format!(
            "System V {what} {} came back as {id}",
            p.id
        )));
    }
    Ok(())
}

/// Makes the queues and sets again in the calling thread's IPC namespace
/// (a new one: none of their ids is taken).
pub fn restore(queues: &[SysvMsgQueue], sets: &[SysvSemSet]) -> Result<(), RestoreError> {
    for q in queues {
        let p = &q.perm;
        create_at(
            "message queue",
            p,
            MSG_NEXT_ID,
            |flags| sysvipc::msg_create(p.key, flags),
            sysvipc::msg_remove,
        )?;
        // Room for every message first (the default may be smaller than
        // what the queue was given), the saved size after.
        let held: u64 = q.messages.iter().map(|m| m.data.len() as u64).sum();
        let room = held.max(q.qbytes);
        sysvipc::msg_set(p.id, 0, 0, 0o600, room)
            .map_err(step(format!("sizing System V message queue {}", p.id)))?;
        for (i, m) in q.messages.iter().enumerate() {
            if m.mtype <= 0 {
                return Err(RestoreError::Inconsistent(format!(
                    "message {i} of System V queue {} has type {}",
                    p.id, m.mtype
                )));
            }
            sysvipc::msg_send(p.id, m.mtype, &m.data).map_err(step(format!(
                "queueing message {i} ({} bytes) on System V queue {}",
                m.data.len(),
                p.id
            )))?;
        }
        sysvipc::msg_set(p.id, p.uid, p.gid, p.mode, q.qbytes).map_err(step(format!(
            "setting the owner, mode and size of System V message queue {}",
            p.id
        )))?;
    }
    for s in sets {
        let p = &s.perm;
        let n = i32::try_from(s.values.len())
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                RestoreError::Inconsistent(format!(
                    "System V semaphore set {} has {} semaphores",
                    p.id,
                    s.values.len()
                ))
            })?;
        create_at(
            "semaphore set",
            p,
            SEM_NEXT_ID,
            |flags| sysvipc::sem_create(p.key, n, flags),
            sysvipc::sem_remove,
        )?;
        sysvipc::sem_set(p.id, &s.values, p.uid, p.gid, p.mode).map_err(step(format!(
            "setting the values, owner and mode of System V semaphore set {}",
            p.id
        )))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_ids_are_the_second_column() {
        let t = "       key      msqid perms      cbytes       qnum\n\
                 0x00001234      32768   640           5          1\n\
                          0          1   600           0          0\n";
        assert_eq!(ids(t), vec![32768, 1]);
    }

    /// Saved from one IPC namespace, restored in another with the same ids,
    /// keys, modes, messages and values (a thread of its own each).
    #[test]
    fn save_then_restore_in_a_new_namespace() {
        let saved = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWIPC).unwrap();
            let q = sysvipc::msg_create(0x5151, libc::IPC_CREAT | 0o640).unwrap();
            let _ = sysvipc::msg_create(libc::IPC_PRIVATE, libc::IPC_CREAT | 0o600).unwrap();
            sysvipc::msg_send(q, 4, b"four").unwrap();
            sysvipc::msg_send(q, 2, b"").unwrap();
            let s = sysvipc::sem_create(0x5353, 2, libc::IPC_CREAT | 0o660).unwrap();
            sysvipc::sem_set(s, &[3, 9], 0, 0, 0o660).unwrap();
            save(0).unwrap()
        })
        .join()
        .unwrap();
        let (queues, sets) = saved;
        assert_eq!(queues.len(), 2);
        assert_eq!(queues[0].messages.len(), 2);
        assert_eq!(queues[0].messages[0].data, b"four");
        assert_eq!(queues[0].messages[1].mtype, 2);
        assert_eq!(sets[0].values, vec![3, 9]);
        let (q2, s2) = (queues.clone(), sets.clone());
        let again = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWIPC).unwrap();
            // An object made first takes id 0: the saved ids still come back.
            let _ = sysvipc::sem_create(libc::IPC_PRIVATE, 1, libc::IPC_CREAT | 0o600).unwrap();
            restore(&q2, &[]).unwrap();
            let err = restore(&[], &s2);
            (save(0).unwrap(), err.is_err())
        })
        .join()
        .unwrap();
        // The set's id 0 was taken by the one made first.
        assert!(again.1);
        assert_eq!(again.0 .0, queues);
    }
}
