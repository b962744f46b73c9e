//! The cgroups (v2) the restored tree is put in: with namespaces of its
//! own, the root's ([`Namespaces::cgroup`]) and, in a cgroup namespace of
//! its own, that namespace's root; for a tree whose processes were in
//! several ([`Manifest::cgroups`]), each process's.
//!
//! [`Placer::prepare`] makes every one that is missing before the root
//! stub exists, and gives those it makes the settings saved of them: the
//! controllers they enabled for their children and their limits (enabling,
//! in a parent, a controller a limit needs; an existing cgroup's limits
//! are never written). Each process is moved into its cgroup as soon as it
//! is forked, before it runs any code of its own (a child forked by its
//! parent's stub starts in the parent's). If the restore fails, the
//! cgroups it made are removed (once the tree is killed) and the
//! controllers it enabled disabled again.
//!
//! [`Namespaces::cgroup`]: stasis_image::manifest::Namespaces::cgroup

use std::cell::Cell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use stasis_image::manifest::{is_cgroup_limit, CgroupDir, Manifest};
use stasis_kernel::procfs;

use crate::{ObjectError, RestoreError, Result};

/// The restored tree's cgroups, made where missing; those made are
/// removed when it is dropped, unless [`Placer::keep`] was called.
pub(crate) struct Placer {
    /// The cgroup2 mount of the restorer's mount namespace: its root and
    /// mount point (`None`: the tree's cgroups are the restorer's).
    mount: Option<(String, String)>,
    /// The root's cgroup.
    root: Option<String>,
    /// Each process's cgroup, by PID in the image (none: its parent's).
    by_pid: HashMap<i32, String>,
    /// The cgroup of each thread in another than its process's, by TID
    /// in the image.
    by_tid: HashMap<i32, String>,
    /// The cgroups this restore made, parents first.
    made: Vec<PathBuf>,
    /// Controllers enabled in cgroups that existed, in order.
    enabled: Vec<(PathBuf, String)>,
    keep: Cell<bool>,
}

impl Placer {
    /// Makes the cgroups of the tree of `m` that are missing, with their
    /// saved settings.
    pub fn prepare(m: &Manifest) -> Result<Placer> {
        let ns = m.namespaces.as_ref();
        let root_pid = m.processes.first().map_or(0, |p| p.pid);
        let (root, by_pid) = match &m.cgroups {
            Some(c) => {
                let by_pid: HashMap<i32, String> =
                    c.procs.iter().map(|p| (p.pid, p.path.clone())).collect();
                (by_pid.get(&root_pid).cloned(), by_pid)
            }
            None => (ns.and_then(|n| n.cgroup.clone()), HashMap::new()),
        };
        let by_tid = m
            .cgroups
            .iter()
            .flat_map(|c| c.threads.iter())
            .map(|t| (t.tid, t.path.clone()))
            .collect();
        let mut p = Placer {
            mount: None,
            root,
            by_pid,
            by_tid,
            made: Vec::new(),
            enabled: Vec::new(),
            keep: Cell::new(false),
        };
        let mut wanted: Vec<String> = ns.and_then(|n| n.cgroup_ns.clone()).into_iter().collect();
        wanted.extend(p.root.clone());
        wanted.extend(p.by_pid.values().cloned());
        wanted.extend(p.by_tid.values().cloned());
        if wanted.is_empty() {
            return Ok(p);
        }
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let Some(mount) = procfs::parse_cgroup2_mount(&info) else {
            return Err(ObjectError::Incompatible(format!(
                "the tree was in cgroup {}, but no cgroup2 file system is mounted here",
                wanted[0]
            ))
            .into());
        };
        p.mount = Some(mount);
        wanted.sort();
        wanted.dedup();
        for w in &wanted {
            p.make(w)?;
        }
        if let Some(c) = &m.cgroups {
            p.apply(&c.dirs)?;
        }
        Ok(p)
    }

    /// The directory of cgroup `path` here.
    fn dir(&self, path: &str) -> Result<PathBuf> {
        let Some((root, point)) = &self.mount else {
            return Err(ObjectError::Inconsistent(format!(
                "cgroup {path} was not prepared for the restore"
            ))
            .into());
        };
        if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
            return Err(ObjectError::Inconsistent(format!("cgroup path {path:?}")).into());
        }
        procfs::cgroup2_dir_in(root, point, path).ok_or_else(|| {
            ObjectError::Incompatible(format!(
                "the tree was in cgroup {path}, outside the cgroup2 mount here (of cgroup {root} on {point})"
            ))
            .into()
        })
    }

    fn fail(what: String, e: std::io::Error) -> RestoreError {
        ObjectError::Incompatible(format!("{what}: {e}")).into()
    }

    /// Makes cgroup `path` and its missing parents.
    fn make(&mut self, path: &str) -> Result<()> {
        let dir = self.dir(path)?;
        let mut missing = Vec::new();
        let mut cur = dir.as_path();
        while std::fs::symlink_metadata(cur).is_err() {
            missing.push(cur.to_path_buf());
            match cur.parent() {
                Some(p) => cur = p,
                None => break,
            }
        }
        for d in missing.into_iter().rev() {
            match std::fs::create_dir(&d) {
                Ok(()) => {
                    tracing::debug!(dir = %d.display(), "cgroup made for the restored tree");
                    self.made.push(d);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(Self::fail(
                        format!("making the tree's cgroup {}", d.display()),
                        e,
                    ))
                }
            }
        }
        Ok(())
    }

    /// Gives the cgroups this restore made the settings saved of them
    /// (`dirs`, parents first).
    fn apply(&mut self, dirs: &[CgroupDir]) -> Result<()> {
        let mut saved = HashMap::new();
        for d in dirs {
            saved.insert(self.dir(&d.path)?, d);
        }
        for made in self.made.clone() {
            let Some(d) = saved.get(&made) else {
                continue;
            };
            // Threaded first: a threaded cgroup takes only the threaded
            // controllers.
            if d.threaded {
                let f = made.join("cgroup.type");
                std::fs::write(&f, "threaded").map_err(|e| {
                    Self::fail(
                        format!(
                            "making the tree's cgroup {} threaded: writing {}",
                            d.path,
                            f.display()
                        ),
                        e,
                    )
                })?;
            }
            for l in &d.limits {
                if !is_cgroup_limit(&l.file) {
                    return Err(ObjectError::Inconsistent(format!(
                        "the saved limit {} of cgroup {} is not one stasis sets",
                        l.file, d.path
                    ))
                    .into());
                }
                let ctrl = l.file.split('.').next().unwrap_or_default();
                if let Some(parent) = made.parent() {
                    self.enable(parent, ctrl)?;
                }
                std::fs::write(made.join(&l.file), &l.value).map_err(|e| {
                    Self::fail(
                        format!(
                            "giving the tree's cgroup {} its {} {}",
                            made.display(),
                            l.file,
                            l.value
                        ),
                        e,
                    )
                })?;
            }
            for c in &d.subtree_control {
                self.enable(&made, c)?;
            }
        }
        Ok(())
    }

    /// Enables controller `ctrl` for the children of cgroup `dir` (and so
    /// in its parents where it is not).
    fn enable(&mut self, dir: &Path, ctrl: &str) -> Result<()> {
        if ctrl.is_empty() || !ctrl.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            return Err(ObjectError::Inconsistent(format!("cgroup controller {ctrl:?}")).into());
        }
        let control = dir.join("cgroup.subtree_control");
        let on = std::fs::read_to_string(&control)
            .map_err(|e| Self::fail(format!("reading {}", control.display()), e))?;
        if on.split_whitespace().any(|c| c == ctrl) {
            return Ok(());
        }
        let top = self.mount.as_ref().map(|(_, point)| Path::new(point));
        if Some(dir) != top {
            if let Some(parent) = dir.parent() {
                self.enable(parent, ctrl)?;
            }
        }
        std::fs::write(&control, format!("+{ctrl}")).map_err(|e| {
            Self::fail(
                format!(
                    "enabling the {ctrl} controller in {} for the tree's cgroups below it",
                    control.display()
                ),
                e,
            )
        })?;
        if !self.made.iter().any(|m| m == dir) {
            self.enabled.push((dir.to_path_buf(), ctrl.to_string()));
        }
        Ok(())
    }

    /// Moves process `outer` (as stasis sees it) into cgroup `path`: its
    /// main thread, if that is a threaded cgroup (the process into the
    /// domain at the top of its threaded subtree first).
    pub fn join(&self, path: &str, outer: i32) -> Result<()> {
        if procfs::cgroup_of(&outer.to_string()).as_deref() == Some(path) {
            return Ok(());
        }
        let dir = self.dir(path)?;
        let threaded = |d: &Path| {
            std::fs::read_to_string(d.join("cgroup.type")).is_ok_and(|t| t.trim() == "threaded")
        };
        if !threaded(&dir) {
            return Self::write_id(&dir, "cgroup.procs", "process", outer, path);
        }
        let mut domain = dir.as_path();
        while threaded(domain) {
            match domain.parent() {
                Some(p) => domain = p,
                None => break,
            }
        }
        Self::write_id(domain, "cgroup.procs", "process", outer, path)?;
        Self::write_id(
            &dir,
            "cgroup.threads",
            "the main thread of process",
            outer,
            path,
        )
    }

    /// Writes `outer` (a process or thread, `what`, as stasis sees it) to
    /// `file` of cgroup `path` (directory `dir`).
    fn write_id(dir: &Path, file: &str, what: &str, outer: i32, path: &str) -> Result<()> {
        let f = dir.join(file);
        std::fs::write(&f, outer.to_string()).map_err(|e| {
            Self::fail(
                format!(
                    "putting {what} {outer} into its cgroup {path}: writing {}",
                    f.display()
                ),
                e,
            )
        })
    }

    /// Moves a thread just made (`tid` in the image, `outer` as stasis
    /// sees it) into its cgroup, if it was in another than its process's
    /// (`cgroup.threads` of a threaded cgroup of its process's subtree).
    pub fn join_thread(&self, tid: i32, outer: i32) -> Result<()> {
        match self.by_tid.get(&tid) {
            Some(path) => Self::write_id(&self.dir(path)?, "cgroup.threads", "thread", outer, path),
            None => Ok(()),
        }
    }

    /// Moves the root stub (`outer`) into the root's cgroup, if it has one.
    pub fn join_root(&self, outer: i32) -> Result<()> {
        match &self.root {
            Some(path) => self.join(path, outer),
            None => Ok(()),
        }
    }

    /// Moves a process just forked (`pid` in the image, `outer` as stasis
    /// sees it) into its cgroup, if it had one of its own.
    pub fn join_child(&self, pid: i32, outer: i32) -> Result<()> {
        match self.by_pid.get(&pid) {
            Some(path) => self.join(path, outer),
            None => Ok(()),
        }
    }

    /// The restore succeeded: the cgroups it made stay.
    pub fn keep(&self) {
        self.keep.set(true);
    }
}

impl Drop for Placer {
    fn drop(&mut self) {
        if self.keep.get() {
            return;
        }
        for d in self.made.iter().rev() {
            if let Err(e) = std::fs::remove_dir(d) {
                tracing::warn!(dir = %d.display(), error = %e, "a cgroup made by the failed restore could not be removed");
            }
        }
        for (dir, ctrl) in self.enabled.iter().rev() {
            let _ = std::fs::write(dir.join("cgroup.subtree_control"), format!("-{ctrl}"));
        }
    }
}
