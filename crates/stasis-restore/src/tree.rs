//! The shape of the tree to rebuild: who forks whom, who leads a session,
//! who joins which process group. Pure logic over the manifest.
//!
//! Processes are created top-down (each by its parent, with `clone3` and
//! `set_tid`), so a process that led its session calls `setsid()` right after
//! it is created, before it forks its own children. Process groups are set
//! once the whole tree exists: group leaders first, then members join.
//! A group whose leader has exited (it lives on while it has members) is
//! rebuilt around a helper process at the leader's PID, forked by the
//! group's first member: it makes the group, the members join, and it
//! exits and is reaped by that member before anything runs. A session
//! whose leader is neither in the tree nor the one the root was started in
//! cannot be rebuilt and is refused.

use stasis_image::manifest::ProcessImage;

/// What a process does about its process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// Keep the group inherited at creation.
    Keep,
    /// `setpgid(0, 0)`: lead a group of its own.
    Own,
    /// `setpgid(0, leader)`.
    Join(i32),
}

/// The plan for every process (same order as the manifest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Index of the parent (None for the root).
    pub parent: Vec<Option<usize>>,
    /// Whether the process calls `setsid()` right after creation.
    pub setsid: Vec<bool>,
    pub group: Vec<Group>,
    /// Groups whose leader has exited: (the group's ID, the index of the
    /// member that forks the helper leading it for a moment).
    pub helpers: Vec<(i32, usize)>,
    /// Whether the process is forked with `CLONE_FILES`: it shares its
    /// parent's fd table (`fds_shared_with`), or its forker's.
    pub share_files: Vec<bool>,
    /// Index of the process that forks it: its parent, or, for a process
    /// sharing the fd table of a sibling that its parent does not share
    /// (made by `clone(CLONE_PARENT | CLONE_FILES)`, or by a parent that
    /// unshared its table since), that sibling, with `CLONE_PARENT`. It
    /// inherits the forker's memory, session and group.
    pub forker: Vec<Option<usize>>,
    /// Processes with a table of their own forked sharing their parent's
    /// (`CLONE_FILES`) only to pass it on to a descendant that shares it
    /// while they do not (they unshared it after forking it): each
    /// unshares it again once every process is forked, before any fd is
    /// made.
    pub relay: Vec<bool>,
}

impl Plan {
    /// Whether process `i` is forked by a sibling (`CLONE_PARENT`).
    pub fn by_sibling(&self, i: usize) -> bool {
        self.forker.get(i) != self.parent.get(i)
    }
}

/// A tree stasis cannot rebuild.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("the image holds no process")]
    Empty,
    #[error("the root process {0} is a zombie")]
    ZombieRoot(i32),
    #[error("process {pid}'s parent {ppid} is not in the image before it")]
    ParentMissing { pid: i32, ppid: i32 },
    #[error("process {pid} is in session {sid} but its parent is in {parent_sid}; stasis cannot rebuild that session")]
    SessionOfParent { pid: i32, sid: i32, parent_sid: i32 },
    #[error("the root process {pid} is in session {sid}, led by another process of the tree")]
    RootSession { pid: i32, sid: i32 },
    #[error("process {pid} is in process group {pgid} of another session")]
    GroupOtherSession { pid: i32, pgid: i32 },
    #[error("process {pid} is in process group {pgid} whose leader is not in the tree")]
    GroupLeaderOutside { pid: i32, pgid: i32 },
    #[error("process {pid} shares the fd table of process {with}, which its parent does not share or which is not saved before it (a damaged image?)")]
    FilesShared { pid: i32, with: i32 },
}

/// Session of "outside the tree" (the one the restorer runs in).
const OUTSIDE: i32 = -1;

/// Validates the tree and decides how to rebuild it.
pub fn plan(procs: &[ProcessImage]) -> Result<Plan, TreeError> {
    let root = procs.first().ok_or(TreeError::Empty)?;
    if root.zombie.is_some() {
        return Err(TreeError::ZombieRoot(root.pid));
    }
    let index_of = |pid: i32| procs.iter().position(|p| p.pid == pid);
    let n = procs.len();
    let mut parent = vec![None; n];
    let mut forker = vec![None; n];
    let mut setsid = vec![false; n];
    let mut sess = vec![OUTSIDE; n];
    // Group each process has right after creation (before the group pass).
    let mut inherited_group = vec![OUTSIDE; n];
    for (i, p) in procs.iter().enumerate() {
        if i > 0 {
            let j = index_of(p.ppid)
                .filter(|&j| j < i)
                .ok_or(TreeError::ParentMissing {
                    pid: p.pid,
                    ppid: p.ppid,
                })?;
            parent[i] = Some(j);
            forker[i] = Some(sibling_sharer(procs, i, j).unwrap_or(j));
        }
        let (parent_sess, parent_group) = match forker[i] {
            Some(j) => (sess[j], inherited_group[j]),
            None => (OUTSIDE, OUTSIDE),
        };
        if p.sid == p.pid {
            setsid[i] = true;
            sess[i] = p.pid;
            inherited_group[i] = p.pid;
        } else {
            let want = if index_of(p.sid).is_some() {
                p.sid
            } else {
                OUTSIDE
            };
            if i > 0 && want != parent_sess {
                return Err(TreeError::SessionOfParent {
                    pid: p.pid,
                    sid: p.sid,
                    parent_sid: procs[forker[i].unwrap_or(0)].sid,
                });
            }
            if i == 0 && want != OUTSIDE {
                return Err(TreeError::RootSession {
                    pid: p.pid,
                    sid: p.sid,
                });
            }
            sess[i] = parent_sess;
            inherited_group[i] = parent_group;
        }
    }
    let mut group = vec![Group::Keep; n];
    let mut helpers: Vec<(i32, usize)> = Vec::new();
    for (i, p) in procs.iter().enumerate() {
        let leader = index_of(p.pgid);
        group[i] = if p.pgid == p.pid {
            if inherited_group[i] == p.pid {
                Group::Keep
            } else {
                Group::Own
            }
        } else if let Some(j) = leader {
            if sess[j] != sess[i] {
                return Err(TreeError::GroupOtherSession {
                    pid: p.pid,
                    pgid: p.pgid,
                });
            }
            if inherited_group[i] == p.pgid {
                Group::Keep
            } else {
                Group::Join(p.pgid)
            }
        } else if p.pgid == root.pgid && inherited_group[i] == OUTSIDE && sess[i] == OUTSIDE {
            // The group the root was started in (the restorer's): kept.
            Group::Keep
        } else if p.pgid == root.pgid && i > 0 {
            // The root's group led from outside, but this process is not
            // in it as the root is.
            return Err(TreeError::GroupLeaderOutside {
                pid: p.pid,
                pgid: p.pgid,
            });
        } else {
            // The leader has exited: a helper at its PID leads the group
            // while the members join, in the first member's session.
            match helpers.iter().find(|h| h.0 == p.pgid) {
                Some(&(_, first)) if sess[first] != sess[i] => {
                    return Err(TreeError::GroupOtherSession {
                        pid: p.pid,
                        pgid: p.pgid,
                    });
                }
                Some(_) => {}
                None => helpers.push((p.pgid, i)),
            }
            Group::Join(p.pgid)
        };
    }
    let relay = relays(procs, &parent, &forker);
    let share_files = share_files(procs, &forker, &relay)?;
    Ok(Plan {
        parent,
        setsid,
        group,
        helpers,
        share_files,
        forker,
        relay: relay.iter().map(Option::is_some).collect(),
    })
}

/// For each process, the table (by its first holder's PID) it relays, if
/// any: the ancestors of a process sharing a table that neither its
/// forker nor they share, up to one that does (or holds it). Each must be
/// live with a table of its own that nobody shares, and relay one table.
fn relays(
    procs: &[ProcessImage],
    parent: &[Option<usize>],
    forker: &[Option<usize>],
) -> Vec<Option<i32>> {
    let mut relay: Vec<Option<i32>> = vec![None; procs.len()];
    let holds =
        |k: usize, with: i32| procs[k].pid == with || procs[k].fds_shared_with == Some(with);
    for (i, p) in procs.iter().enumerate() {
        let (Some(with), Some(f)) = (p.fds_shared_with, forker[i]) else {
            continue;
        };
        let mut chain = Vec::new();
        let mut k = f;
        let found = loop {
            if holds(k, with) || relay[k] == Some(with) {
                break true;
            }
            let own = procs[k].fds_shared_with.is_none()
                && procs[k].zombie.is_none()
                && relay[k].is_none()
                && !procs
                    .iter()
                    .any(|q| q.fds_shared_with == Some(procs[k].pid));
            match parent[k] {
                Some(up) if own => {
                    chain.push(k);
                    k = up;
                }
                _ => break false,
            }
        };
        if found {
            for k in chain {
                relay[k] = Some(with);
            }
        }
    }
    relay
}

/// The sibling that forks process `i` (child of `parent`), if `i` shares
/// the fd table of an earlier sibling and its parent does not share it.
fn sibling_sharer(procs: &[ProcessImage], i: usize, parent: usize) -> Option<usize> {
    let with = procs[i].fds_shared_with?;
    let pp = &procs[parent];
    if pp.pid == with || pp.fds_shared_with == Some(with) {
        return None;
    }
    procs[..i]
        .iter()
        .position(|o| o.pid == with && o.ppid == procs[i].ppid && o.zombie.is_none())
}

/// Which processes are forked with `CLONE_FILES`: those sharing the table
/// of an earlier process that holds it (not itself a sharer), as their
/// forker does (or is).
fn share_files(
    procs: &[ProcessImage],
    forker: &[Option<usize>],
    relay: &[Option<i32>],
) -> Result<Vec<bool>, TreeError> {
    let mut share = vec![false; procs.len()];
    for (i, p) in procs.iter().enumerate() {
        let Some(with) = p.fds_shared_with else {
            continue;
        };
        let bad = TreeError::FilesShared { pid: p.pid, with };
        let owner_ok = procs[..i]
            .iter()
            .any(|o| o.pid == with && o.fds_shared_with.is_none() && o.zombie.is_none());
        let parent_ok = forker[i].is_some_and(|j| {
            procs[j].pid == with || procs[j].fds_shared_with == Some(with) || relay[j] == Some(with)
        });
        if !owner_ok || !parent_ok || !p.fds.is_empty() || p.zombie.is_some() {
            return Err(bad);
        }
        share[i] = true;
    }
    for (i, r) in relay.iter().enumerate() {
        share[i] |= r.is_some();
    }
    Ok(share)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, pgid: i32, sid: i32) -> ProcessImage {
        crate::testutil::image(pid, ppid, pgid, sid)
    }

    #[test]
    fn shell_job_root_keeps_the_restorers_session_and_group() {
        // Root started from a shell (session 1, group 50), child in the same group.
        let pl = plan(&[p(100, 1, 50, 1), p(101, 100, 50, 1)]).unwrap();
        assert_eq!(pl.parent, vec![None, Some(0)]);
        assert_eq!(pl.setsid, vec![false, false]);
        assert_eq!(pl.group, vec![Group::Keep, Group::Keep]);
    }

    #[test]
    fn daemon_tree_with_session_and_groups() {
        // 100 leads its session; 101 leads its own group; 102 joins 101's group.
        let pl = plan(&[
            p(100, 1, 100, 100),
            p(101, 100, 101, 100),
            p(102, 100, 101, 100),
            p(103, 101, 100, 100),
        ])
        .unwrap();
        assert_eq!(pl.setsid, vec![true, false, false, false]);
        assert_eq!(
            pl.group,
            vec![Group::Keep, Group::Own, Group::Join(101), Group::Keep]
        );
        assert_eq!(pl.parent, vec![None, Some(0), Some(0), Some(1)]);
    }

    #[test]
    fn a_group_whose_leader_exited_gets_a_helper_leader() {
        // zdtm's zombie01: 101 made group 101, forked 102 into it (as a
        // sibling) and exited; 102 is a zombie of 100's. And 104 and 105
        // share group 103, whose leader exited too.
        let mut z = p(102, 100, 101, 1);
        z.zombie = Some(0);
        let pl = plan(&[
            p(100, 1, 50, 1),
            z,
            p(104, 100, 103, 1),
            p(105, 100, 103, 1),
        ])
        .unwrap();
        assert_eq!(
            pl.group,
            vec![
                Group::Keep,
                Group::Join(101),
                Group::Join(103),
                Group::Join(103)
            ]
        );
        assert_eq!(pl.helpers, vec![(101, 1), (103, 2)]);
        // Members of one such group in two sessions: refused.
        let e = plan(&[
            p(100, 100, 100, 100),
            p(101, 100, 101, 101),
            p(102, 101, 103, 101),
            p(104, 100, 103, 100),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("group 103"), "{e}");
    }

    #[test]
    fn sharers_of_an_fd_table_are_forked_by_a_parent_that_shares_it() {
        // zdtm's fdt_shared: 101 and 102 share 100's table; 103 (101's
        // child) shares it too; 104 (101's) has a table of its own.
        let shared = |mut q: ProcessImage, with| {
            q.fds.clear();
            q.fds_shared_with = Some(with);
            q
        };
        let tree = [
            p(100, 1, 50, 1),
            shared(p(101, 100, 50, 1), 100),
            shared(p(102, 100, 50, 1), 100),
            shared(p(103, 101, 50, 1), 100),
            p(104, 101, 50, 1),
        ];
        let pl = plan(&tree).unwrap();
        assert_eq!(pl.share_files, vec![false, true, true, true, false]);
        assert_eq!(pl.forker, pl.parent);
        // 104's child sharing 100's table, which 104 does not: 104
        // relays it.
        let mut relayed = tree.to_vec();
        relayed.push(shared(p(105, 104, 50, 1), 100));
        assert_eq!(
            plan(&relayed).unwrap().relay,
            vec![false; 4]
                .into_iter()
                .chain([true, false])
                .collect::<Vec<_>>()
        );
        // 104's child sharing the table of 106, a cousin of its: no
        // ancestor holds it.
        let mut bad = tree.to_vec();
        bad.push(p(106, 100, 50, 1));
        bad.push(shared(p(105, 104, 50, 1), 106));
        assert_eq!(
            plan(&bad).unwrap_err(),
            TreeError::FilesShared {
                pid: 105,
                with: 106
            }
        );
        // Sharing a table no earlier process holds, or a sharer's.
        let mut bad = tree.to_vec();
        bad[1].fds_shared_with = Some(103);
        assert!(plan(&bad).is_err());
        let mut bad = tree.to_vec();
        bad[3].fds_shared_with = Some(101);
        assert!(plan(&bad).is_err());
    }

    #[test]
    fn refusals() {
        assert!(plan(&[p(100, 1, 50, 1), p(102, 101, 50, 1)])
            .unwrap_err()
            .to_string()
            .contains("parent 101"));
        // A child in a session led by nobody in its ancestry.
        assert!(plan(&[p(100, 1, 100, 100), p(101, 100, 101, 7)])
            .unwrap_err()
            .to_string()
            .contains("session"));
        // The root's group, led from outside, for a child in another session.
        assert!(plan(&[
            p(100, 1, 50, 1),
            p(101, 100, 101, 101),
            p(102, 101, 50, 101)
        ])
        .unwrap_err()
        .to_string()
        .contains("group 50"));
        let mut z = p(100, 1, 50, 1);
        z.zombie = Some(0);
        let err = plan(&[z]).unwrap_err();
        assert_eq!(err, TreeError::ZombieRoot(100));
        assert!(err.to_string().contains("zombie"));
    }

    #[test]
    fn a_sibling_sharing_a_table_its_parent_does_not_is_forked_by_that_sibling() {
        // 101 and 102 are 100's children sharing one table (101's); 100
        // has its own. 102 is forked by 101 with CLONE_PARENT. 103 shares
        // 101's table but is 102's child, which shares it: forked by 102.
        let mut b = p(102, 100, 50, 1);
        b.fds.clear();
        b.fds_shared_with = Some(101);
        let mut c = p(103, 102, 50, 1);
        c.fds.clear();
        c.fds_shared_with = Some(101);
        let pl = plan(&[p(100, 1, 50, 1), p(101, 100, 50, 1), b.clone(), c]).unwrap();
        assert_eq!(pl.parent, vec![None, Some(0), Some(0), Some(2)]);
        assert_eq!(pl.forker, vec![None, Some(0), Some(1), Some(2)]);
        assert_eq!(pl.share_files, vec![false, false, true, true]);
        assert!(pl.by_sibling(2) && !pl.by_sibling(3));
        // 101 leading a session of its own: 102, in 100's, cannot come
        // from it.
        let e = plan(&[p(100, 1, 50, 1), p(101, 100, 101, 101), b]).unwrap_err();
        assert!(
            matches!(e, TreeError::SessionOfParent { pid: 102, .. }),
            "{e}"
        );
    }

    #[test]
    fn a_table_shared_with_a_grandparent_is_relayed_by_the_parent() {
        // 101 (100's child) made 102 sharing its table, then unshared:
        // 100 and 102 share one table, 101 has its own. 101 is forked
        // sharing 100's, forks 102, and unshares. 103, 101's child with
        // a table of its own, is forked as usual.
        let mut g = p(102, 101, 50, 1);
        g.fds.clear();
        g.fds_shared_with = Some(100);
        let tree = [p(100, 1, 50, 1), p(101, 100, 50, 1), g, p(103, 101, 50, 1)];
        let pl = plan(&tree).unwrap();
        assert_eq!(pl.relay, vec![false, true, false, false]);
        assert_eq!(pl.share_files, vec![false, true, true, false]);
        assert_eq!(pl.forker, pl.parent);
        // 101's table shared by another process: it cannot relay 100's.
        let mut bad = tree.to_vec();
        let mut h = p(104, 101, 50, 1);
        h.fds.clear();
        h.fds_shared_with = Some(101);
        bad.push(h);
        assert_eq!(
            plan(&bad).unwrap_err(),
            TreeError::FilesShared {
                pid: 102,
                with: 100
            }
        );
    }
}
