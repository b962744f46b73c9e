//! THE reader of `/proc/PID/*` text: maps, smaps, stat, status, limits,
//! fdinfo (and the anon-inode kinds' lines in it), timers.
//!
//! Parsers are pure functions over the file text, unit-tested on fixed
//! samples; callers add the I/O (and map a missing file to a dead
//! process). A text that does not parse is a [`FormatError`] saying what
//! was unexpected.
//!
//! (The `procfs` crate was weighed for these: its maps entry folds the
//! pathname into an enum that loses the exact name Stasis matches on
//! (`/SYSV…`, `(deleted)`, `[anon:…]`), and its stat keeps no exit code
//! for a zombie; so the files Stasis needs are parsed here, once.)

pub mod net;

/// A `/proc` file whose content is not what the parser expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FormatError(pub String);

impl From<String> for FormatError {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for FormatError {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

/// The `mm_struct` layout fields of `/proc/PID/stat` (fields 26-28, 45-51).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MmLayout {
    pub start_code: u64,
    pub end_code: u64,
    pub start_data: u64,
    pub end_data: u64,
    pub start_brk: u64,
    pub start_stack: u64,
    pub arg_start: u64,
    pub arg_end: u64,
    pub env_start: u64,
    pub env_end: u64,
}

/// Real, effective, saved and filesystem ids and supplementary groups
/// (`/proc/PID/status`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Creds {
    pub uid: [u32; 4],
    pub gid: [u32; 4],
    pub groups: Vec<u32>,
    /// Capability sets: inheritable, permitted, effective, bounding,
    /// ambient (`CapInh`...`CapAmb`); `None` if a line is missing.
    pub caps: Option<[u64; 5]>,
}

/// One resource limit of `/proc/PID/limits` (`resource`: its `RLIMIT_*`
/// number, the line's rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub resource: u32,
    pub soft: u64,
    pub hard: u64,
}

/// `/proc/PID/<name>`.
pub fn path(pid: i32, name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/{pid}/{name}"))
}

/// What failed reading a `/proc/PID/*` file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be read (a missing one: the process is gone).
    #[error("reading {}", path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Its content did not parse.
    #[error("{} has unexpected content", path.display())]
    Format {
        path: std::path::PathBuf,
        #[source]
        source: FormatError,
    },
}

impl From<ReadError> for crate::KernelError {
    fn from(e: ReadError) -> Self {
        let what = e.to_string();
        let source = match e {
            ReadError::Io { source, .. } => source,
            ReadError::Format { source, .. } => {
                std::io::Error::new(std::io::ErrorKind::InvalidData, source)
            }
        };
        crate::KernelError::Io { what, source }
    }
}

/// Reads `/proc/PID/<name>` and parses it with `parse`.
pub fn read_parsed<T>(
    pid: i32,
    name: &str,
    parse: impl FnOnce(&str) -> Result<T, FormatError>,
) -> Result<T, ReadError> {
    let path = path(pid, name);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(source) => return Err(ReadError::Io { path, source }),
    };
    parse(&text).map_err(|source| ReadError::Format { path, source })
}

/// The cgroup (v2) of `task` (`PID` or `PID/task/TID`): the path after
/// `0::` in its `cgroup` file (`None` if it is gone, or on a host without
/// cgroup v2).
pub fn cgroup_of(task: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{task}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// Of a `mountinfo` text, the first cgroup2 mount: its root in the file
/// system and where it is mounted.
pub fn parse_cgroup2_mount(mountinfo: &str) -> Option<(String, String)> {
    mountinfo.lines().find_map(|l| {
        let (a, b) = l.split_once(" - ")?;
        if b.split_whitespace().next() != Some("cgroup2") {
            return None;
        }
        let mut f = a.split_whitespace().skip(3);
        Some((f.next()?.to_string(), f.next()?.to_string()))
    })
}

/// Where this process reaches the cgroup (v2) at `path` (as
/// [`cgroup_of`] gives it): under the cgroup2 mount of its mount
/// namespace. `None`: no cgroup2 is mounted, `path` is not absolute, has
/// a `..`, or lies outside that mount's root.
pub fn cgroup2_dir(path: &str) -> Option<std::path::PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (root, point) = parse_cgroup2_mount(&info)?;
    cgroup2_dir_in(&root, &point, path)
}

/// [`cgroup2_dir`] with the mount's `root` and mount point given.
pub fn cgroup2_dir_in(root: &str, point: &str, path: &str) -> Option<std::path::PathBuf> {
    if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return None;
    }
    let rel = if root == "/" {
        path
    } else if path == root {
        ""
    } else {
        path.strip_prefix(root).filter(|r| r.starts_with('/'))?
    };
    let rel = rel.trim_start_matches('/');
    let base = std::path::Path::new(point);
    Some(if rel.is_empty() {
        base.to_path_buf()
    } else {
        base.join(rel)
    })
}

/// The memory map of `pid` (`/proc/PID/maps`).
pub fn maps(pid: i32) -> Result<Vec<MapsEntry>, ReadError> {
    read_parsed(pid, "maps", parse_maps)
}

/// The `/proc/PID/stat` of `pid`.
pub fn stat(pid: i32) -> Result<Stat, ReadError> {
    read_parsed(pid, "stat", parse_stat)
}

/// The state letter (`R`, `S`, `Z`...) of a `stat` text, without parsing
/// the rest.
pub fn state_of(stat: &str) -> Option<char> {
    let close = stat.rfind(')')?;
    stat[close + 1..].split_whitespace().next()?.chars().next()
}

/// The state letter of task `tid` of process `pid` (`None`: gone).
pub fn task_state(pid: i32, tid: i32) -> Option<char> {
    std::fs::read_to_string(path(pid, &format!("task/{tid}/stat")))
        .ok()
        .and_then(|s| state_of(&s))
}

/// `PF_IO_WORKER` in a task's `stat` flags (field 9).
const PF_IO_WORKER: u64 = 0x10;

/// Whether task `tid` of `pid` is an io_uring worker (`iou-wrk-*`,
/// `iou-sqp-*`): a thread of the kernel's in the process, which cannot be
/// traced, is not the program's and is not saved (the kernel starts
/// workers again when requests need them).
pub fn is_io_worker(pid: i32, tid: i32) -> bool {
    std::fs::read_to_string(path(pid, &format!("task/{tid}/stat"))).is_ok_and(|s| {
        s.rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().nth(6)?.parse::<u64>().ok())
            .is_some_and(|f| f & PF_IO_WORKER != 0)
    })
}

/// Whether every thread of `pid` is in a job-control stop (`T`): its
/// group stop is complete, so its parent's `waitpid(WUNTRACED)` reports
/// it. `false` while one still runs towards it, and for a process gone.
pub fn group_stopped(pid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir(path(pid, "task")) else {
        return false;
    };
    let mut any = false;
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if is_io_worker(pid, tid) {
            continue;
        }
        match task_state(pid, tid) {
            Some('T') => any = true,
            // Exited meanwhile.
            None => {}
            Some(_) => return false,
        }
    }
    any
}

/// Waits until every process of `pids` is in its group stop
/// ([`group_stopped`]), gone or a zombie; returns those that were not by
/// `timeout` (sent SIGCONT by someone else meanwhile, say).
pub fn wait_group_stopped(pids: &[i32], timeout: std::time::Duration) -> Vec<i32> {
    let deadline = std::time::Instant::now() + timeout;
    let mut left: Vec<i32> = pids.to_vec();
    loop {
        left.retain(|&pid| !group_stopped(pid) && !gone_or_zombie(pid));
        if left.is_empty() || std::time::Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Whether `pid` is gone or a zombie (`Z`, or `X` while being reaped)
/// whose other threads are gone too. A thread-group leader shows `Z` as
/// soon as it exits, while its other threads may still be exiting: until
/// they are, its parent cannot reap it, and its PID stays taken.
pub fn gone_or_zombie(pid: i32) -> bool {
    match std::fs::read_to_string(path(pid, "stat")) {
        Err(_) => true,
        Ok(s) => matches!(state_of(&s), Some('Z' | 'X')) && only_leader_left(pid),
    }
}

/// Whether no thread but the leader is left in `pid`'s task list (or the
/// process is gone).
fn only_leader_left(pid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir(path(pid, "task")) else {
        return true;
    };
    let leader = pid.to_string();
    dir.flatten()
        .all(|e| e.file_name().to_str() == Some(leader.as_str()))
}

/// `Private_Clean + Private_Dirty` of a `smaps`/`smaps_rollup` text, in
/// bytes (0 where the lines are missing).
pub fn parse_private_bytes(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("Private_Clean:") || l.starts_with("Private_Dirty:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum::<u64>()
        * 1024
}

/// The children of every thread of `pid` as they are now, from each
/// task's `children` file (none if it is gone; a thread that exits
/// meanwhile is skipped).
pub fn task_children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(path(pid, "task")) {
        for t in tasks.flatten() {
            if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(c.split_whitespace().filter_map(|x| x.parse::<i32>().ok()));
            }
        }
    }
    out
}

/// `roots` and all their descendants as they are now, each once (a tree
/// that forks meanwhile may have more).
pub fn tree_pids(roots: &[i32]) -> Vec<i32> {
    let mut out = Vec::new();
    let mut todo = roots.to_vec();
    while let Some(p) = todo.pop() {
        if out.contains(&p) {
            continue;
        }
        out.push(p);
        todo.extend(task_children(p));
    }
    out
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsEntry {
    pub start: u64,
    pub end: u64,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub shared: bool,
    pub offset: u64,
    pub dev: (u32, u32),
    pub ino: u64,
    /// Path or pseudo-name (`[heap]`), empty for anonymous memory.
    pub name: String,
}

impl MapsEntry {
    /// PROT_* bits.
    pub fn prot(&self) -> u32 {
        let mut p = 0;
        if self.read {
            p |= libc::PROT_READ;
        }
        if self.write {
            p |= libc::PROT_WRITE;
        }
        if self.exec {
            p |= libc::PROT_EXEC;
        }
        p.unsigned_abs()
    }
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s, 16).ok()
}

/// Parses the text of `/proc/PID/maps`.
pub fn parse_maps(text: &str) -> Result<Vec<MapsEntry>, FormatError> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let bad = || FormatError(format!("unexpected maps line: {line:?}"));
        // Five whitespace-separated fields, then the name (which may contain spaces).
        let mut rest = line;
        let mut fields = [""; 5];
        for f in &mut fields {
            rest = rest.trim_start();
            let end = rest.find(' ').unwrap_or(rest.len());
            *f = &rest[..end];
            rest = &rest[end..];
        }
        let name = rest.trim_start().to_string();
        let (a, b) = fields[0].split_once('-').ok_or_else(bad)?;
        let perms = fields[1].as_bytes();
        if perms.len() < 4 {
            return Err(bad());
        }
        let (maj, min) = fields[3].split_once(':').ok_or_else(bad)?;
        out.push(MapsEntry {
            start: hex(a).ok_or_else(bad)?,
            end: hex(b).ok_or_else(bad)?,
            read: perms[0] == b'r',
            write: perms[1] == b'w',
            exec: perms[2] == b'x',
            shared: perms[3] == b's',
            offset: hex(fields[2]).ok_or_else(bad)?,
            dev: (
                u32::from_str_radix(maj, 16).map_err(|_| bad())?,
                u32::from_str_radix(min, 16).map_err(|_| bad())?,
            ),
            ino: fields[4].parse().map_err(|_| bad())?,
            name,
        });
    }
    Ok(out)
}

/// Each area's start and its `VmFlags` in `/proc/PID/smaps` as
/// [`stasis_sys::vmflags`] bits, for the areas with any of them.
pub fn parse_smaps_vmflags(text: &str) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    let mut cur: Option<u64> = None;
    for line in text.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            let bits = flags
                .split_whitespace()
                .filter_map(|f| stasis_sys::vmflags::MNEMONICS.iter().find(|m| m.0 == f))
                .fold(0, |acc, m| acc | m.1);
            if let (Some(start), true) = (cur, bits != 0) {
                out.push((start, bits));
            }
        } else if let Some(first) = line.split_whitespace().next() {
            if !first.ends_with(':') {
                cur = first.split_once('-').and_then(|(a, _)| hex(a));
            }
        }
    }
    out
}

/// Start addresses of the areas whose `VmFlags` in `/proc/PID/smaps` hold
/// `flag` (`gd`: grows down; `uw`: registered for userfaultfd write-protect).
pub fn parse_smaps_flagged(text: &str, flag: &str) -> Vec<u64> {
    let mut out = Vec::new();
    let mut cur: Option<u64> = None;
    for line in text.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if flags.split_whitespace().any(|f| f == flag) {
                out.extend(cur);
            }
        } else if let Some(first) = line.split_whitespace().next() {
            if !first.ends_with(':') {
                cur = first.split_once('-').and_then(|(a, _)| hex(a));
            }
        }
    }
    out
}

/// Fields of `/proc/PID/stat` that Stasis needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stat {
    pub comm: String,
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    pub num_threads: i64,
    /// Field 10: minor page faults.
    pub minflt: u64,
    /// Field 22: start time in clock ticks after boot.
    pub start_time: u64,
    pub mm: MmLayout,
    /// Field 52: the wait status of a zombie.
    pub exit_code: i32,
}

/// Parses `/proc/PID/stat` (the comm field may hold spaces and parentheses).
pub fn parse_stat(text: &str) -> Result<Stat, FormatError> {
    let bad = || FormatError(format!("unexpected stat: {text:?}"));
    let open = text.find('(').ok_or_else(bad)?;
    let close = text.rfind(')').ok_or_else(bad)?;
    let comm = text[open + 1..close].to_string();
    // Field 3 (state) is the first after ")".
    let f: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let n = |i: usize| -> Result<u64, FormatError> {
        f.get(i - 3)
            .ok_or_else(bad)?
            .parse::<u64>()
            .map_err(|_| bad())
    };
    let s = |i: usize| -> Result<i64, FormatError> {
        f.get(i - 3)
            .ok_or_else(bad)?
            .parse::<i64>()
            .map_err(|_| bad())
    };
    if f.len() < 52 - 2 {
        return Err(bad());
    }
    let to_i32 = |v: i64| i32::try_from(v).map_err(|_| bad());
    Ok(Stat {
        comm,
        state: f[0].chars().next().unwrap_or('?'),
        ppid: to_i32(s(4)?)?,
        pgrp: to_i32(s(5)?)?,
        session: to_i32(s(6)?)?,
        num_threads: s(20)?,
        minflt: n(10)?,
        start_time: n(22)?,
        mm: MmLayout {
            start_code: n(26)?,
            end_code: n(27)?,
            start_stack: n(28)?,
            start_data: n(45)?,
            end_data: n(46)?,
            start_brk: n(47)?,
            arg_start: n(48)?,
            arg_end: n(49)?,
            env_start: n(50)?,
            env_end: n(51)?,
        },
        exit_code: to_i32(s(52)?)?,
    })
}

/// Whether process group `pgrp` is orphaned now, as the kernel judges it
/// before a job-control stop signal (`is_current_pgrp_orphaned`): no member
/// has a parent (other than init) in another process group of the same
/// session. Such a group
/// ignores SIGTSTP, SIGTTIN and SIGTTOU; only SIGSTOP stops it. Processes
/// that vanish during the scan are skipped.
pub fn pgrp_orphaned(pgrp: i32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    let members: Vec<Stat> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| stat(pid).ok())
        .filter(|s| s.pgrp == pgrp && s.state != 'Z')
        .collect();
    !members.iter().any(|m| {
        m.ppid != 1 && stat(m.ppid).is_ok_and(|p| p.pgrp != pgrp && p.session == m.session)
    })
}

/// `VmLck` of `/proc/PID/status`: the KiB of locked memory (0 if absent).
pub fn parse_status_locked_kib(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `Umask`, credentials from `/proc/PID/status`.
pub fn parse_status(text: &str) -> Result<(u32, Creds), FormatError> {
    let bad = |what: &str| FormatError(format!("/proc/PID/status has no usable {what} line"));
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let umask = field("Umask:")
        .and_then(|v| u32::from_str_radix(v, 8).ok())
        .ok_or_else(|| bad("Umask"))?;
    let four = |name: &str| -> Result<[u32; 4], FormatError> {
        let v: Vec<u32> = field(name)
            .ok_or_else(|| bad(name))?
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        v.try_into().map_err(|_| bad(name))
    };
    let groups = field("Groups:")
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let caps: Option<Vec<u64>> = ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"]
        .iter()
        .map(|n| field(n).and_then(|v| u64::from_str_radix(v, 16).ok()))
        .collect();
    Ok((
        umask,
        Creds {
            uid: four("Uid:")?,
            gid: four("Gid:")?,
            groups,
            caps: caps.and_then(|v| v.try_into().ok()),
        },
    ))
}

/// Parses `/proc/PID/limits` (lines in resource order, fixed columns).
pub fn parse_limits(text: &str) -> Result<Vec<Limit>, FormatError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().skip(1).enumerate() {
        let val = |s: &str| -> Result<u64, FormatError> {
            let s = s.trim();
            if s == "unlimited" {
                Ok(u64::MAX)
            } else {
                s.parse()
                    .map_err(|_| FormatError(format!("bad limit value {s:?} in {line:?}")))
            }
        };
        let soft = line
            .get(26..46)
            .ok_or_else(|| format!("short limits line {line:?}"))?;
        let hard = line
            .get(47..67)
            .ok_or_else(|| format!("short limits line {line:?}"))?;
        out.push(Limit {
            resource: u32::try_from(i).unwrap_or(u32::MAX),
            soft: val(soft)?,
            hard: val(hard)?,
        });
    }
    Ok(out)
}

/// `pos` and `flags` (octal) from `/proc/PID/fdinfo/N`.
pub fn parse_fdinfo(text: &str) -> Result<(u64, u32), FormatError> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let pos = field("pos:")
        .and_then(|v| v.parse().ok())
        .ok_or("fdinfo without pos")?;
    let flags = field("flags:")
        .and_then(|v| u32::from_str_radix(v, 8).ok())
        .ok_or("fdinfo without flags")?;
    Ok((pos, flags))
}

/// A `name:` field of an fdinfo text.
fn fdinfo_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .map(str::trim)
}

/// eventfd fdinfo: (count, semaphore).
pub fn parse_eventfd(text: &str) -> Result<(u64, bool), FormatError> {
    let count = fdinfo_field(text, "eventfd-count:")
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .ok_or("eventfd fdinfo without eventfd-count")?;
    let sem = fdinfo_field(text, "eventfd-semaphore:").is_some_and(|v| v == "1");
    Ok((count, sem))
}

/// signalfd fdinfo: the signal mask.
pub fn parse_signalfd(text: &str) -> Result<u64, FormatError> {
    fdinfo_field(text, "sigmask:")
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .ok_or_else(|| "signalfd fdinfo without sigmask".into())
}

/// timerfd fdinfo: (clockid, ticks, value_ns, interval_ns).
pub fn parse_timerfd(text: &str) -> Result<(i32, u64, u64, u64), FormatError> {
    let pair = |name: &str| -> Result<u64, FormatError> {
        let v = fdinfo_field(text, name).ok_or_else(|| format!("timerfd fdinfo without {name}"))?;
        let v = v.trim_start_matches('(').trim_end_matches(')');
        let (s, ns) = v
            .split_once(',')
            .ok_or_else(|| format!("bad {name} {v:?}"))?;
        let s: u64 = s.trim().parse().map_err(|_| format!("bad {name} {v:?}"))?;
        let ns: u64 = ns.trim().parse().map_err(|_| format!("bad {name} {v:?}"))?;
        Ok(s * 1_000_000_000 + ns)
    };
    let clockid = fdinfo_field(text, "clockid:")
        .and_then(|v| v.parse().ok())
        .ok_or("timerfd fdinfo without clockid")?;
    let ticks = fdinfo_field(text, "ticks:")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok((clockid, ticks, pair("it_value:")?, pair("it_interval:")?))
}

/// epoll fdinfo: (target fd, events, data) per registration.
pub fn parse_epoll(text: &str) -> Result<Vec<(i32, u32, u64)>, FormatError> {
    let mut out = Vec::new();
    for l in text.lines().filter(|l| l.starts_with("tfd:")) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let get = |k: &str| {
            f.iter()
                .position(|x| *x == k)
                .and_then(|i| f.get(i + 1))
                .copied()
                .ok_or_else(|| format!("bad epoll line {l:?}"))
        };
        let fd = get("tfd:")?
            .parse()
            .map_err(|_| format!("bad tfd in {l:?}"))?;
        let events =
            u32::from_str_radix(get("events:")?, 16).map_err(|_| format!("bad events in {l:?}"))?;
        let data =
            u64::from_str_radix(get("data:")?, 16).map_err(|_| format!("bad data in {l:?}"))?;
        out.push((fd, events, data));
    }
    Ok(out)
}

/// One inotify watch line of an fdinfo: (wd, sdev (kernel encoding), mask,
/// handle type, handle bytes).
pub type InotifyLine = (i32, u32, u32, i32, Vec<u8>);

/// Parses the `inotify` lines of an fdinfo.
pub fn parse_inotify(text: &str) -> Result<Vec<InotifyLine>, FormatError> {
    let mut out = Vec::new();
    for l in text.lines().filter_map(|l| l.strip_prefix("inotify ")) {
        let bad = || FormatError(format!("unexpected inotify line {l:?}"));
        let get = |k: &str| {
            l.split_whitespace()
                .find_map(|f| f.strip_prefix(k))
                .ok_or_else(bad)
        };
        let wd = get("wd:")?.parse().map_err(|_| bad())?;
        let sdev = u32::from_str_radix(get("sdev:")?, 16).map_err(|_| bad())?;
        let mask = u32::from_str_radix(get("mask:")?, 16).map_err(|_| bad())?;
        let ty = get("fhandle-type:")?.parse().map_err(|_| bad())?;
        let bytes = hex_bytes(get("f_handle:")?).ok_or_else(bad)?;
        out.push((wd, sdev, mask, ty, bytes));
    }
    Ok(out)
}

/// The bytes of an fdinfo `f_handle:` (hex digits, two per byte).
fn hex_bytes(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) || !hex.is_ascii() {
        return None;
    }
    (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect()
}

/// What a fanotify mark is attached to, as its fdinfo line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FanotifyObject {
    /// An inode: its device and the file handle that finds it again.
    Inode {
        sdev: u32,
        handle_type: i32,
        handle: Vec<u8>,
    },
    /// A mount, by its id.
    Mount { mnt_id: u32 },
    /// A whole filesystem, by its device.
    Filesystem { sdev: u32 },
}

/// One mark of a fanotify group: what it is on, its user flags
/// (`FAN_MARK_IGNORED_SURV_MODIFY`, `FAN_MARK_EVICTABLE`,
/// `FAN_MARK_IGNORE`), its mask and its ignored mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanotifyMark {
    pub on: FanotifyObject,
    pub mflags: u32,
    pub mask: u64,
    pub ignored_mask: u64,
}

/// A fanotify fd's fdinfo: the group's `fanotify_init` flags, the flags
/// of the fds its events carry, and its marks.
pub fn parse_fanotify(text: &str) -> Result<(u32, u32, Vec<FanotifyMark>), FormatError> {
    let mut group = None;
    let mut marks = Vec::new();
    for l in text.lines().filter_map(|l| l.strip_prefix("fanotify ")) {
        let bad = || FormatError(format!("unexpected fanotify line {l:?}"));
        let find = |k: &str| l.split_whitespace().find_map(|f| f.strip_prefix(k));
        let get = |k: &str| find(k).ok_or_else(bad);
        let hex32 = |k: &str| u32::from_str_radix(get(k)?, 16).map_err(|_| bad());
        let hex64 = |k: &str| u64::from_str_radix(get(k)?, 16).map_err(|_| bad());
        if find("flags:").is_some() && find("event-flags:").is_some() {
            group = Some((hex32("flags:")?, hex32("event-flags:")?));
            continue;
        }
        let on = if find("ino:").is_some() {
            FanotifyObject::Inode {
                sdev: hex32("sdev:")?,
                handle_type: get("fhandle-type:")?.parse().map_err(|_| bad())?,
                handle: hex_bytes(get("f_handle:")?).ok_or_else(bad)?,
            }
        } else if find("mnt_id:").is_some() {
            FanotifyObject::Mount {
                mnt_id: hex32("mnt_id:")?,
            }
        } else if find("sdev:").is_some() {
            FanotifyObject::Filesystem {
                sdev: hex32("sdev:")?,
            }
        } else {
            return Err(bad());
        };
        marks.push(FanotifyMark {
            on,
            mflags: hex32("mflags:")?,
            mask: hex64("mask:")?,
            ignored_mask: hex64("ignored_mask:")?,
        });
    }
    let (flags, event_flags) =
        group.ok_or_else(|| FormatError("no \"fanotify flags:\" line in the fdinfo".into()))?;
    Ok((flags, event_flags, marks))
}

/// The `lock:` lines of an fdinfo: (kind, write, start, len (0 = to EOF)).
pub fn parse_locks(text: &str) -> Result<Vec<(String, bool, u64, u64)>, FormatError> {
    let mut out = Vec::new();
    for l in text.lines().filter_map(|l| l.strip_prefix("lock:")) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let bad = || FormatError(format!("unexpected lock line {l:?}"));
        // "1:" KIND MANDATORY|ADVISORY READ|WRITE pid dev:ino start end
        if f.len() < 8 {
            return Err(bad());
        }
        let start: u64 = f[6].parse().map_err(|_| bad())?;
        let len = if f[7] == "EOF" {
            0
        } else {
            f[7].parse::<u64>().map_err(|_| bad())? + 1 - start
        };
        out.push((f[1].to_string(), f[3] == "WRITE", start, len));
    }
    Ok(out)
}

/// One entry of `/proc/PID/timers`: (id, signo, sigev_value, notify, tid, clockid).
pub type TimerLine = (i32, i32, u64, i32, i32, i32);

/// Parses `/proc/PID/timers`.
pub fn parse_timers(text: &str) -> Result<Vec<TimerLine>, FormatError> {
    let mut out = Vec::new();
    let mut cur: Option<TimerLine> = None;
    for l in text.lines() {
        let bad = || FormatError(format!("unexpected timers line {l:?}"));
        if let Some(v) = l.strip_prefix("ID: ") {
            out.extend(cur.take());
            cur = Some((v.trim().parse().map_err(|_| bad())?, 0, 0, 0, 0, 0));
        } else if let Some(v) = l.strip_prefix("signal: ") {
            let (sig, val) = v.trim().split_once('/').ok_or_else(bad)?;
            if let Some(c) = cur.as_mut() {
                c.1 = sig.parse().map_err(|_| bad())?;
                c.2 = u64::from_str_radix(val, 16).map_err(|_| bad())?;
            }
        } else if let Some(v) = l.strip_prefix("notify: ") {
            // "KIND/pid.N" or "KIND/tid.N": the kernel prints the notify
            // type without SIGEV_THREAD_ID, then "tid" if it is set.
            let (kind, who) = v.trim().split_once('/').ok_or_else(bad)?;
            let (target, tid) = who.rsplit_once('.').ok_or_else(bad)?;
            if let Some(c) = cur.as_mut() {
                let base = match kind {
                    "signal" => libc::SIGEV_SIGNAL,
                    "none" => libc::SIGEV_NONE,
                    "thread" => libc::SIGEV_THREAD,
                    _ => return Err(bad()),
                };
                c.3 = match target {
                    "tid" => base | libc::SIGEV_THREAD_ID,
                    "pid" => base,
                    _ => return Err(bad()),
                };
                c.4 = tid.parse().map_err(|_| bad())?;
            }
        } else if let Some(v) = l.strip_prefix("ClockID: ") {
            if let Some(c) = cur.as_mut() {
                c.5 = v.trim().parse().map_err(|_| bad())?;
            }
        }
    }
    out.extend(cur);
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cgroup2_mount_and_dirs() {
        let info = "22 1 0:5 / /proc rw - proc proc rw\n\
                    30 22 0:26 /box /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let (root, point) = super::parse_cgroup2_mount(info).unwrap();
        assert_eq!((root.as_str(), point.as_str()), ("/box", "/sys/fs/cgroup"));
        let dir = |r, p| super::cgroup2_dir_in(r, "/sys/fs/cgroup", p);
        assert_eq!(
            dir("/box", "/box/a").unwrap().to_str(),
            Some("/sys/fs/cgroup/a")
        );
        assert_eq!(
            dir("/box", "/box").unwrap().to_str(),
            Some("/sys/fs/cgroup")
        );
        assert_eq!(dir("/box", "/boxer"), None);
        assert_eq!(dir("/box", "/other"), None);
        assert_eq!(
            dir("/", "/a/b").unwrap().to_str(),
            Some("/sys/fs/cgroup/a/b")
        );
        assert_eq!(dir("/", "/").unwrap().to_str(), Some("/sys/fs/cgroup"));
        assert_eq!(dir("/", "/a/../b"), None);
        assert_eq!(dir("/", "a"), None);
        assert_eq!(
            super::parse_cgroup2_mount("22 1 0:5 / /proc rw - proc proc rw\n"),
            None
        );
    }

    use super::*;

    #[test]
    fn a_zombie_leader_with_a_live_thread_is_not_dead_yet() {
        // The main thread exits alone (SYS_exit, not exit_group); a thread
        // sleeps on.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import threading, time, ctypes\n\
                 threading.Thread(target=time.sleep, args=(60,)).start()\n\
                 ctypes.CDLL(None).syscall(60, 0)",
            ])
            .spawn()
            .expect("python3");
        let pid = child.id() as i32;
        let t0 = std::time::Instant::now();
        while stat(pid).map(|s| s.state).ok() != Some('Z') {
            assert!(t0.elapsed().as_secs() < 30, "the leader never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!gone_or_zombie(pid), "its thread still runs");
        child.kill().unwrap();
        while !gone_or_zombie(pid) {
            assert!(t0.elapsed().as_secs() < 30, "not dead after SIGKILL");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.wait().unwrap();
    }

    #[test]
    fn a_group_stop_is_waited_for_and_a_running_process_is_reported() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let short = std::time::Duration::from_millis(50);
        assert_eq!(wait_group_stopped(&[pid], short), [pid], "running");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGSTOP).unwrap();
        assert!(wait_group_stopped(&[pid], std::time::Duration::from_secs(30)).is_empty());
        assert!(group_stopped(pid));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!group_stopped(pid), "gone");
        assert!(
            wait_group_stopped(&[pid], short).is_empty(),
            "gone counts as done"
        );
    }

    #[test]
    fn maps_lines_with_spaces_and_specials() {
        let t = "55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]\n\
                 7f00aa000000-7f00aa001000 r--s 00002000 fe:01 1234                       /tmp/my file (deleted)\n\
                 7ffd1000-7ffd2000 ---p 00000000 00:00 0 \n";
        let m = parse_maps(t).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(
            (
                m[0].start,
                m[0].end,
                m[0].prot(),
                m[0].shared,
                m[0].name.as_str()
            ),
            (0x55d0c0a00000, 0x55d0c0a21000, 3, false, "[heap]")
        );
        assert_eq!(
            (
                m[1].offset,
                m[1].dev,
                m[1].ino,
                m[1].shared,
                m[1].name.as_str()
            ),
            (0x2000, (0xfe, 1), 1234, true, "/tmp/my file (deleted)")
        );
        assert_eq!((m[2].prot(), m[2].name.as_str()), (0, ""));
        assert!(parse_maps("garbage").is_err());
    }

    #[test]
    fn stat_with_parenthesised_comm() {
        let t = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 555 1000 100 18446744073709551615 4194304 4196000 140737488346000 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 6295000 6295600 6299648 140737488350000 140737488350100 140737488350100 140737488351000 0\n";
        let s = parse_stat(t).unwrap();
        assert_eq!(s.comm, "a) b (c)");
        assert_eq!(
            (s.state, s.ppid, s.pgrp, s.session, s.num_threads),
            ('S', 1, 1234, 1234, 1)
        );
        assert_eq!(
            (s.mm.start_code, s.mm.end_code, s.mm.start_stack),
            (4194304, 4196000, 140737488346000)
        );
        assert_eq!(
            (s.mm.start_data, s.mm.end_data, s.mm.start_brk),
            (6295000, 6295600, 6299648)
        );
        assert_eq!(
            (s.mm.arg_start, s.mm.env_end),
            (140737488350000, 140737488351000)
        );
        assert!(parse_stat("1 (x) S 1").is_err());
    }

    #[test]
    fn limits_columns() {
        let t = "Limit                     Soft Limit           Hard Limit           Units     \n\
                 Max cpu time              unlimited            unlimited            seconds   \n\
                 Max file size             1024                 unlimited            bytes     \n";
        let l = parse_limits(t).unwrap();
        assert_eq!(
            l,
            vec![
                Limit {
                    resource: 0,
                    soft: u64::MAX,
                    hard: u64::MAX
                },
                Limit {
                    resource: 1,
                    soft: 1024,
                    hard: u64::MAX
                }
            ]
        );
    }

    #[test]
    fn status_and_fdinfo() {
        let (umask, c) = parse_status(
            "Name:\tx\nUmask:\t0027\nUid:\t1\t2\t3\t4\nGid:\t5\t6\t7\t8\nGroups:\t10 20 \n",
        )
        .unwrap();
        assert_eq!(umask, 0o27);
        assert_eq!(
            (c.uid, c.gid, c.groups, c.caps),
            ([1, 2, 3, 4], [5, 6, 7, 8], vec![10, 20], None)
        );
        let (_, c) = parse_status(
            "Umask:\t0022\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\nCapInh:\t0000000000000000\n\
             CapPrm:\t000001fffffffffd\nCapEff:\t000001fffffffffc\nCapBnd:\t000001ffffffff7f\nCapAmb:\t0000000000000400\n",
        )
        .unwrap();
        assert_eq!(
            c.caps,
            Some([0, 0x1ff_ffff_fffd, 0x1ff_ffff_fffc, 0x1ff_ffff_ff7f, 0x400])
        );
        assert_eq!(
            parse_fdinfo("pos:\t1234\nflags:\t02102001\nmnt_id:\t20\n").unwrap(),
            (1234, 0o2102001)
        );
        assert!(parse_fdinfo("flags: 0").is_err());
    }

    #[test]
    fn fanotify_groups_and_marks() {
        let t = "pos:\t0\nflags:\t02004002\nfanotify flags:3 event-flags:8000\n\
fanotify sdev:1b mflags:0 mask:10 ignored_mask:0\n\
fanotify mnt_id:1b mflags:0 mask:10 ignored_mask:0\n\
fanotify ino:98a043 sdev:fe00000 mflags:0 mask:48000020 ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:43a098008b09a052\n\
fanotify ino:98a031 sdev:fe00000 mflags:40 mask:a ignored_mask:20 fhandle-bytes:8 fhandle-type:1 f_handle:31a098003c53b19a\n";
        let (flags, ev, marks) = parse_fanotify(t).unwrap();
        assert_eq!((flags, ev), (3, 0x8000));
        assert_eq!(marks.len(), 4);
        assert_eq!(marks[0].on, FanotifyObject::Filesystem { sdev: 0x1b });
        assert_eq!(marks[1].on, FanotifyObject::Mount { mnt_id: 0x1b });
        assert_eq!(
            marks[2].on,
            FanotifyObject::Inode {
                sdev: 0xfe00000,
                handle_type: 1,
                handle: vec![0x43, 0xa0, 0x98, 0, 0x8b, 0x09, 0xa0, 0x52]
            }
        );
        assert_eq!((marks[2].mask, marks[2].ignored_mask), (0x4800_0020, 0));
        assert_eq!(
            (marks[3].mflags, marks[3].mask, marks[3].ignored_mask),
            (0x40, 0xa, 0x20)
        );
        assert!(parse_fanotify("pos:\t0\n").is_err(), "no group line");
        assert!(parse_fanotify("fanotify flags:3 event-flags:0\nfanotify ino:1 sdev:2").is_err());
        assert!(parse_fanotify("fanotify flags:x event-flags:0\n").is_err());
    }

    #[test]
    fn inotify_watches() {
        let t = "pos:\t0\ninotify wd:2 ino:3c4a3 sdev:fe00000 mask:2 ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:a3c4030000000000\n";
        assert_eq!(
            parse_inotify(t).unwrap(),
            vec![(2, 0xfe00000, 2, 1, vec![0xa3, 0xc4, 3, 0, 0, 0, 0, 0])]
        );
        assert!(parse_inotify("inotify wd:x").is_err());
    }

    #[test]
    fn fdinfo_locks() {
        let t = "pos:\t0\nlock:\t1: POSIX  ADVISORY  WRITE 14746 fe:00:9977941 5 14\nlock:\t2: FLOCK  ADVISORY  READ 14746 fe:00:9977949 0 EOF\n";
        assert_eq!(
            parse_locks(t).unwrap(),
            vec![
                ("POSIX".to_string(), true, 5, 10),
                ("FLOCK".to_string(), false, 0, 0)
            ]
        );
        assert!(parse_locks("lock: 1: POSIX").is_err());
    }

    #[test]
    fn posix_timers() {
        // A thread-directed timer (glibc's SIGEV_THREAD helper uses one) is
        // "signal/tid.N": SIGEV_SIGNAL | SIGEV_THREAD_ID.
        let t = "ID: 0\nsignal: 10/0000000000001234\nnotify: signal/pid.77\nClockID: 1\nID: 3\nsignal: 32/0000000000000000\nnotify: signal/tid.78\nClockID: 1\nID: 4\nsignal: 14/0000000000000000\nnotify: thread/pid.77\nClockID: 0\n";
        assert_eq!(
            parse_timers(t).unwrap(),
            vec![
                (0, 10, 0x1234, 0, 77, 1),
                (3, 32, 0, 4, 78, 1),
                (4, 14, 0, 2, 77, 0)
            ]
        );
        assert!(parse_timers("ID: 1\nnotify: signal/who.3\n").is_err());
        assert!(parse_timers("ID: x").is_err());
    }

    #[test]
    fn anon_inode_fdinfo() {
        assert_eq!(parse_eventfd("pos:\t0\nflags:\t02\neventfd-count:               1f\neventfd-id: 1\neventfd-semaphore: 1\n").unwrap(), (31, true));
        assert_eq!(
            parse_signalfd("pos:\t0\nsigmask:\t0000000000000a00\n").unwrap(),
            0xa00
        );
        let t = "clockid: 1\nticks: 3\nsettime flags: 00\nit_value: (0, 250000000)\nit_interval: (2, 5)\n";
        assert_eq!(
            parse_timerfd(t).unwrap(),
            (1, 3, 250_000_000, 2_000_000_005)
        );
        let e = "pos:\t0\nflags:\t02\ntfd:        5 events:       19 data:       1234567890ab  pos:0 ino:3 sdev:f\ntfd:        7 events: 80000001 data:                7  pos:0 ino:4 sdev:f\n";
        assert_eq!(
            parse_epoll(e).unwrap(),
            vec![(5, 0x19, 0x1234567890ab), (7, 0x8000_0001, 7)]
        );
        assert!(parse_eventfd("pos: 0").is_err());
    }

    #[test]
    fn children_and_tree_of_this_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let kid = child.id() as i32;
        assert!(task_children(me).contains(&kid));
        let tree = tree_pids(&[me, me]);
        assert_eq!(tree.iter().filter(|p| **p == me).count(), 1);
        assert!(tree.contains(&kid));
        assert_eq!(tree_pids(&[kid]), vec![kid]);
        let _ = child.kill();
        let _ = child.wait();
        assert!(task_children(-1).is_empty());
        assert!(matches!(maps(-1), Err(ReadError::Io { .. })));
        let m = maps(me).unwrap();
        assert!(m.iter().any(|e| e.name == "[stack]"));
        assert!(stat(me).unwrap().ppid > 0);
    }

    #[test]
    fn private_bytes_of_smaps_rollup() {
        let t = "Rss: 100 kB\nPrivate_Clean: 8 kB\nPrivate_Dirty: 12 kB\nShared_Dirty: 4 kB\n";
        assert_eq!(parse_private_bytes(t), 20 * 1024);
        assert_eq!(parse_private_bytes("garbage"), 0);
    }

    #[test]
    fn states_and_minor_faults() {
        assert_eq!(state_of("12 (a) b) Z 1 2"), Some('Z'));
        assert_eq!(state_of("12 (x"), None);
        let me = i32::try_from(std::process::id()).unwrap();
        assert!(!gone_or_zombie(me));
        assert!(matches!(task_state(me, me), Some('R' | 'S')));
        // Past the largest PID possible (2^22).
        assert!(gone_or_zombie(1 << 23));
        assert_eq!(task_state(1 << 23, 1 << 23), None);
        // This process has faulted pages in by now.
        assert!(stat(me).unwrap().minflt > 0);
    }

    #[test]
    fn smaps_vmflags() {
        let t = "7ffd0000-7ffd2000 rw-p 00000000 00:00 0 [stack]\nSize: 8 kB\nVmFlags: rd wr mr mw me gd ac\n\
                 7ffe0000-7ffe1000 rw-p 00000000 00:00 0\nSize: 4 kB\nVmFlags: rd wr mr mw me ac\n";
        use stasis_sys::vmflags::{GROWSDOWN, LOCKED, MAYWRITE};
        assert_eq!(
            parse_smaps_vmflags(t),
            vec![(0x7ffd0000, GROWSDOWN | MAYWRITE), (0x7ffe0000, MAYWRITE)]
        );
        assert_eq!(
            parse_status_locked_kib("Name:\tx\nVmLck:\t     68 kB\n"),
            68
        );
        assert_eq!(parse_status_locked_kib("Name:\tx\n"), 0);
        let t = "1000-2000 r--s 00000000 08:01 12 /f\nVmFlags: rd sh mr me ms lo\n";
        assert_eq!(parse_smaps_vmflags(t), vec![(0x1000, LOCKED)]);
    }
}
