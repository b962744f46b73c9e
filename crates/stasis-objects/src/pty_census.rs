//! Who holds the ends of which pseudo-terminal, and whose controlling
//! terminal each one is, and who holds which pipe, over every process of
//! the machine: read once per dump, when the first pty master of the tree
//! is saved, or before the freeze.
//!
//! A pty pair can be held outside the dumped tree (a terminal the tree
//! shares with a process it does not contain), which a restore could not
//! rebuild: the save refuses it ([`crate::pty::check_external`]). Finding
//! out means walking the fds of every process in `/proc`; one walk per
//! dump, not one per pair and question, and that walk taken *before* the
//! tree is frozen ([`Census::for_tree`]; the tree's own processes are read
//! again once frozen, [`Census::refresh`]) keep it out of the frozen time
//! of a tree with terminals (Open MPI's daemon gives each of its ranks
//! one). Processes outside the tree run on either way: a census taken
//! during the freeze would be no more exact for them.
//!
//! Pipes likewise: a pipe with an end outside the tree (a shell pipeline
//! around it) is refused (`crate::pipe::check_external`), which takes the
//! same walk. When the tree holds a pipe of which it has only one end
//! before the freeze, or a pty master, the census is taken then, and the
//! check reads it ([`Census::pipe_holder`]) instead of walking `/proc`
//! while the tree is frozen. What that misses: a pipe end the tree passes
//! (over a unix socket) to a process outside it between the census and
//! the freeze; the frozen walk would see that process, if it still held
//! the end.

use std::os::unix::fs::{FileTypeExt, MetadataExt};

use crate::pty::{end_of, master_index, End};

/// An end of a pair open somewhere: (pid, fd, end, pair index).
type Held = (i32, i32, End, u32);

/// A pipe end open somewhere: (pid, pipe inode, [`READ`] | [`WRITE`]).
type PipeEnd = (i32, u64, u8);

/// A pipe end open for reading.
const READ: u8 = 1;
/// A pipe end open for writing.
const WRITE: u8 = 2;

/// The pty ends and controlling terminals of every process, this dumper
/// and its fork snapshots aside.
#[derive(Debug, Default)]
pub struct Census {
    ends: Vec<Held>,
    /// The devpts instance (its device; see [`instance_of_end`]) of each
    /// end of `ends`, by (pid, fd).
    instances: std::collections::HashMap<(i32, i32), u64>,
    /// (pid, session, `tty_nr`, foreground group) of every process.
    ctty: Vec<(i32, i32, u64, i32)>,
    /// The devpts instance each process sees on `/dev/pts` (its device),
    /// by pid: `tty_nr` names a slave by index alone, the same in every
    /// instance.
    seen: std::collections::HashMap<i32, u64>,
    /// Every pipe end of every process.
    pipes: Vec<PipeEnd>,
    /// The tree as it was when the census was taken ([`Census::for_tree`]).
    tree: Vec<i32>,
}

impl Census {
    /// The census, if one of the processes `tree` holds a pty master or
    /// a pipe of which the tree holds only one end (`None`: the dump will
    /// not need one, or will take it itself).
    pub fn for_tree(tree: &[i32]) -> Option<Census> {
        let mut mine = Census::default();
        for &pid in tree {
            mine.ends_of(pid, &std::path::Path::new("/proc").join(pid.to_string()));
        }
        let needed = mine.ends.iter().any(|e| e.2 == End::Master) || mine.half_pipe();
        let mut c = needed.then(Census::take)?;
        c.tree = tree.to_vec();
        Some(c)
    }

    /// Reads the processes `pids` again (frozen now: what they hold is
    /// what the dump saves). Processes of the tree seen before the freeze
    /// that are no longer in it (they exited) hold nothing.
    /// With the frozen tree's `fds` when they were listed: the sockets and
    /// anonymous inodes among them, neither a pipe nor a terminal, are not
    /// looked at again.
    pub fn refresh(&mut self, pids: &[i32], fds: Option<&crate::fd_census::FdCensus>) {
        let old = std::mem::take(&mut self.tree);
        let gone = |pid: i32| pids.contains(&pid) || old.contains(&pid);
        self.ends.retain(|e| !gone(e.0));
        self.instances.retain(|k, _| !gone(k.0));
        self.ctty.retain(|c| !gone(c.0));
        self.seen.retain(|k, _| !gone(*k));
        self.pipes.retain(|p| !gone(p.0));
        for &pid in pids {
            let dir = std::path::Path::new("/proc").join(pid.to_string());
            match fds.and_then(|c| c.fds_of(pid)) {
                Some(entries) => {
                    self.ctty_of(pid, &dir);
                    let maybe = entries
                        .iter()
                        .filter(|e| {
                            !e.link.starts_with("socket:[") && !e.link.starts_with("anon_inode:")
                        })
                        .map(|e| e.fd);
                    self.ends_in(pid, &dir, maybe);
                }
                None => self.process(pid, &dir),
            }
        }
        self.tree = pids.to_vec();
    }

    /// Walks `/proc` once.
    pub fn take() -> Census {
        let me = i32::try_from(std::process::id()).unwrap_or(0);
        let mut c = Census::default();
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return c;
        };
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|x| x.parse::<i32>().ok()) else {
                continue;
            };
            if pid == me || crate::save::is_snapshot(pid) {
                continue;
            }
            c.process(pid, &p.path());
        }
        c
    }

    fn process(&mut self, pid: i32, dir: &std::path::Path) {
        self.ctty_of(pid, dir);
        self.ends_of(pid, dir);
    }

    /// The pipe and pty ends among the fds of process `pid`.
    fn ends_of(&mut self, pid: i32, dir: &std::path::Path) {
        let Ok(fds) = std::fs::read_dir(dir.join("fd")) else {
            return;
        };
        let fds = fds
            .flatten()
            .filter_map(|f| f.file_name().to_str().and_then(|x| x.parse::<i32>().ok()));
        self.ends_in(pid, dir, fds);
    }

    /// The controlling terminal of process `pid`, but for a zombie: its
    /// `stat` still names the terminal it had, but it can use none, and
    /// its root, which says which devpts instance a pty's index is of,
    /// is gone (taken for "any instance", a zombie outside the tree made
    /// a pty of the tree's own devpts with the same index look shared);
    /// likewise a process that exited meanwhile.
    fn ctty_of(&mut self, pid: i32, dir: &std::path::Path) {
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            return;
        };
        let Some((sid, mut nr, fg)) = ctty_fields(&stat) else {
            return;
        };
        if nr != 0 && is_zombie(&stat) {
            nr = 0;
        }
        if nr != 0 {
            let seen = seen_instance(pid);
            if seen == 0 && !dir.join("stat").exists() {
                return;
            }
            self.seen.insert(pid, seen);
        }
        self.ctty.push((pid, sid, nr, fg));
    }

    /// The pipe and pty ends among fds `fds` of process `pid`.
    fn ends_in(&mut self, pid: i32, dir: &std::path::Path, fds: impl Iterator<Item = i32>) {
        for fd in fds {
            let path = dir.join(format!("fd/{fd}"));
            let Ok(m) = std::fs::metadata(&path) else {
                continue;
            };
            if m.file_type().is_fifo() && Some(m.dev()) == pipefs_dev() {
                // The link's own mode says how the end is open.
                let mode = std::fs::symlink_metadata(&path).map_or(0, |l| l.mode());
                let read = if mode & 0o400 != 0 { READ } else { 0 };
                let write = if mode & 0o200 != 0 { WRITE } else { 0 };
                self.pipes.push((pid, m.ino(), read | write));
                continue;
            }
            let index = match end_of(m.rdev()).filter(|_| m.file_type().is_char_device()) {
                Some(End::Slave(i)) => Some((End::Slave(i), i)),
                Some(End::Master) => std::fs::read_to_string(dir.join(format!("fdinfo/{fd}")))
                    .ok()
                    .and_then(|i| master_index(&i))
                    .map(|i| (End::Master, i)),
                None => None,
            };
            if let Some((end, i)) = index {
                self.ends.push((pid, fd, end, i));
                let link = std::fs::read_link(&path).unwrap_or_default();
                let inst = instance_of_end(pid, &path, &link.to_string_lossy(), &m);
                self.instances.insert((pid, fd), inst);
            }
        }
    }

    /// Every (pid, fd, end) outside `skip` holding an end of pair `index`.
    pub fn holders(&self, index: u32, skip: &[i32]) -> Vec<(i32, i32, End)> {
        self.ends
            .iter()
            .filter(|h| h.3 == index && !skip.contains(&h.0))
            .map(|&(pid, fd, end, _)| (pid, fd, end))
            .collect()
    }

    /// [`Census::holders`] of pair `index` of the devpts instance `inst`
    /// (0, or an end's instance unknown: any).
    pub fn holders_in(&self, index: u32, inst: u64, skip: &[i32]) -> Vec<(i32, i32, End)> {
        self.holders(index, skip)
            .into_iter()
            .filter(|h| {
                let theirs = self.instances.get(&(h.0, h.1)).copied().unwrap_or(0);
                inst == 0 || theirs == 0 || theirs == inst
            })
            .collect()
    }

    /// [`Census::ctty_holders`] of the slave `rdev` of the devpts instance
    /// `inst`: those that see that instance on `/dev/pts` (0, or unknown:
    /// any).
    pub fn ctty_holders_in(&self, rdev: u64, inst: u64) -> Vec<(i32, i32, i32)> {
        self.ctty_holders(rdev)
            .into_iter()
            .filter(|h| {
                let theirs = self.seen.get(&h.0).copied().unwrap_or(0);
                inst == 0 || theirs == 0 || theirs == inst
            })
            .collect()
    }

    /// Whether a pipe is held with only one of its ends (by the processes
    /// read).
    fn half_pipe(&self) -> bool {
        let mut ends: std::collections::HashMap<u64, u8> = std::collections::HashMap::new();
        for &(_, ino, mode) in &self.pipes {
            *ends.entry(ino).or_default() |= mode;
        }
        ends.values().any(|&m| m != READ | WRITE)
    }

    /// The first process outside `skip` holding one of the pipes `ids`
    /// (by inode): (its pid, the pipe).
    pub fn pipe_holder(&self, ids: &[u64], skip: &[i32]) -> Option<(i32, u64)> {
        self.pipes
            .iter()
            .find(|p| ids.contains(&p.1) && !skip.contains(&p.0))
            .map(|p| (p.0, p.1))
    }

    /// Every process (pid, session, foreground group) whose controlling
    /// terminal is the device `rdev`.
    pub fn ctty_holders(&self, rdev: u64) -> Vec<(i32, i32, i32)> {
        let want = encode_dev(rdev);
        self.ctty
            .iter()
            .filter(|c| c.2 == want)
            .map(|&(pid, sid, _, fg)| (pid, sid, fg))
            .collect()
    }
}

/// The devpts instance (its device; 0: unknown) of a pty end `pid` holds
/// open on `fd_path` (`/proc/PID/fd/N`, whose target is `link`): a slave's
/// node, or a master opened through an instance's own `ptmx`, is on it; a
/// master opened through another `ptmx` node (`/dev/ptmx`) is of the
/// instance mounted on `pts` next to that node in the process's mount
/// namespace, where the kernel looked it up.
pub fn instance_of_end(
    pid: i32,
    fd_path: &std::path::Path,
    link: &str,
    meta: &std::fs::Metadata,
) -> u64 {
    let on_devpts = nix::sys::statfs::statfs(fd_path)
        .is_ok_and(|s| s.filesystem_type().0 == stasis_sys::tty::DEVPTS_SUPER_MAGIC);
    if on_devpts {
        return meta.dev();
    }
    let dir = std::path::Path::new(link)
        .parent()
        .map_or(String::from("/dev"), |d| d.display().to_string());
    std::fs::metadata(format!("/proc/{pid}/root{dir}/pts")).map_or(0, |m| m.dev())
}

/// The devpts instance `pid` sees on `/dev/pts` (its device; 0: none).
fn seen_instance(pid: i32) -> u64 {
    std::fs::metadata(format!("/proc/{pid}/root/dev/pts")).map_or(0, |m| m.dev())
}

/// The device of anonymous pipes (pipefs), from a pipe made once.
fn pipefs_dev() -> Option<u64> {
    static DEV: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *DEV.get_or_init(|| {
        let (r, _w) = nix::unistd::pipe().ok()?;
        std::fs::File::from(r).metadata().ok().map(|m| m.dev())
    })
}

/// Whether a `/proc/PID/stat` text is a zombie's (or a dead process's).
fn is_zombie(stat: &str) -> bool {
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    matches!(state, Some("Z" | "X"))
}

/// The controlling-terminal fields of a `/proc/PID/stat` text: (session,
/// `tty_nr`, foreground group `tpgid`).
pub fn ctty_fields(stat: &str) -> Option<(i32, u64, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let session = f.get(3)?.parse().ok()?;
    let tty_nr: i64 = f.get(4)?.parse().ok()?;
    let tpgid = f.get(5)?.parse().ok()?;
    Some((session, u64::try_from(tty_nr).ok()?, tpgid))
}

/// `tty_nr` of `/proc/PID/stat` encodes the device as the kernel's
/// `new_encode_dev`; this is that of `rdev`.
pub fn encode_dev(rdev: u64) -> u64 {
    let (major, minor) = (u64::from(libc::major(rdev)), u64::from(libc::minor(rdev)));
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// The device number `tty_nr` (the kernel's `new_encode_dev`) encodes.
pub fn decode_dev(tty_nr: u64) -> u64 {
    let major = (tty_nr & 0xfff00) >> 8;
    let minor = (tty_nr & 0xff) | ((tty_nr >> 12) & 0xfff00);
    libc::makedev(
        u32::try_from(major).unwrap_or(0),
        u32::try_from(minor).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn census() -> Census {
        Census {
            ends: vec![
                (10, 3, End::Master, 4),
                (11, 0, End::Slave(4), 4),
                (50, 7, End::Slave(4), 4),
                (12, 1, End::Slave(5), 5),
            ],
            ctty: vec![(11, 11, encode_dev(crate::pty::slave_rdev(4)), 11)],
            instances: [((10, 3), 7), ((11, 0), 7), ((50, 7), 8)]
                .into_iter()
                .collect(),
            seen: [(11, 7)].into_iter().collect(),
            pipes: vec![(10, 700, READ), (11, 700, WRITE), (50, 701, READ)],
            tree: vec![10, 11, 12, 13],
        }
    }

    #[test]
    fn holders_outside_a_tree_are_the_others() {
        let c = census();
        assert_eq!(c.holders(4, &[10, 11, 12]), vec![(50, 7, End::Slave(4))]);
        assert_eq!(c.holders(4, &[]).len(), 3);
        assert!(c.holders(5, &[12]).is_empty());
        assert_eq!(
            c.ctty_holders(crate::pty::slave_rdev(4)),
            vec![(11, 11, 11)]
        );
        assert!(c.ctty_holders(crate::pty::slave_rdev(5)).is_empty());
        // Pair 4 of instance 7 (a container's devpts, say): process 50
        // holds pair 4 of instance 8; pid 12's end is of no known one.
        assert!(c.holders_in(4, 7, &[10, 11, 12]).is_empty());
        assert_eq!(c.holders_in(4, 8, &[10, 11]), vec![(50, 7, End::Slave(4))]);
        assert_eq!(c.holders_in(5, 8, &[]), vec![(12, 1, End::Slave(5))]);
        let rdev = crate::pty::slave_rdev(4);
        assert_eq!(c.ctty_holders_in(rdev, 7), vec![(11, 11, 11)]);
        assert!(c.ctty_holders_in(rdev, 8).is_empty());
    }

    #[test]
    fn a_zombie_holds_no_controlling_terminal() {
        // A session on a pty; its member B exited and is not reaped: its
        // stat still names the terminal, its root is gone.
        let prog = r#"
import os, sys, time
m, s = os.openpty()
name = os.ttyname(s)
os.setsid()
os.close(os.open(name, os.O_RDWR))
b = os.fork()
if b == 0:
    os._exit(0)
print(b, os.stat(name).st_rdev, flush=True)
time.sleep(60)
"#;
        let mut a = std::process::Command::new("python3")
            .args(["-c", prog])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(a.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let v: Vec<u64> = line
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        let (b, rdev) = (i32::try_from(v[0]).unwrap(), v[1]);
        let a_pid = i32::try_from(a.id()).unwrap();
        let stat = || std::fs::read_to_string(format!("/proc/{b}/stat")).unwrap_or_default();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !is_zombie(&stat()) {
            assert!(
                std::time::Instant::now() < deadline,
                "B never became a zombie"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(ctty_fields(&stat()).is_some_and(|f| f.1 == encode_dev(rdev)));
        let c = Census::take();
        let holders: Vec<i32> = c.ctty_holders(rdev).iter().map(|h| h.0).collect();
        let _ = a.kill();
        let _ = a.wait();
        assert_eq!(holders, vec![a_pid]);
    }

    #[test]
    fn a_refresh_forgets_tree_processes_that_exited() {
        // None of these pids exists: the tree before the freeze (10-13)
        // is gone, and the frozen tree (999999990) holds nothing.
        let mut c = census();
        c.refresh(&[999_999_990], None);
        assert_eq!(c.holders(4, &[]), vec![(50, 7, End::Slave(4))]);
        assert!(c.ctty.is_empty());
        assert_eq!(c.pipes, vec![(50, 701, READ)]);
        assert_eq!(c.tree, vec![999_999_990]);
    }

    #[test]
    fn pipe_holders_outside_a_tree_and_pipes_held_by_one_end() {
        let c = census();
        assert_eq!(c.pipe_holder(&[700, 701], &[10, 11]), Some((50, 701)));
        assert_eq!(c.pipe_holder(&[700], &[10, 11]), None);
        assert_eq!(c.pipe_holder(&[700], &[11]), Some((10, 700)));
        // 701 has only a reader.
        assert!(c.half_pipe());
        let whole = Census {
            pipes: vec![(10, 700, READ), (11, 700, WRITE)],
            ..Census::default()
        };
        assert!(!whole.half_pipe());
    }

    #[test]
    fn a_census_sees_the_pipes_of_a_process_and_how_they_are_open() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let r = std::fs::File::from(r);
        let ino = r.metadata().unwrap().ino();
        let me = i32::try_from(std::process::id()).unwrap();
        let mut c = Census::default();
        c.ends_of(me, std::path::Path::new("/proc/self"));
        let mine: Vec<u8> = c.pipes.iter().filter(|p| p.1 == ino).map(|p| p.2).collect();
        assert_eq!(mine.len(), 2, "{:?}", c.pipes);
        assert!(mine.contains(&READ) && mine.contains(&WRITE));
        assert!(c.pipes.iter().all(|p| p.0 == me));
        drop((r, w));
    }
}
