//! The cgroups (v2) of the dumped tree.
//!
//! A tree whose live processes are in several cgroups has each process's
//! recorded ([`describe`], paths as the dumper sees them), with the
//! settings of the cgroups below the deepest one that holds them all: the
//! controllers each enables for its children and its limits
//! ([`CGROUP_LIMITS`] and `hugetlb.<size>.max`) and whether it is
//! threaded, which a restore that has to make one gives it. A thread in
//! another cgroup than its process (a threaded subtree) is recorded with
//! its cgroup, and makes the tree's cgroups recorded so even if its
//! processes share one.

use std::collections::BTreeSet;

use stasis_image::manifest::{
    is_cgroup_limit, CgroupDir, CgroupLimit, Cgroups, ProcessCgroup, ProcessImage, ThreadCgroup,
    CGROUP_LIMITS,
};
use stasis_kernel::procfs;

use crate::Result;

/// The threads (not the main one) of process `pid` (in cgroup `cgroup`)
/// that are in another cgroup: a threaded one.
fn threads_elsewhere(pid: i32, cgroup: &str) -> Vec<ThreadCgroup> {
    let mut tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&t| t != pid)
        .collect();
    tids.sort_unstable();
    tids.into_iter()
        .filter_map(|tid| {
            let path = procfs::cgroup_of(&format!("{pid}/task/{tid}"))?;
            (path != cgroup).then_some(ThreadCgroup { tid, path })
        })
        .collect()
}

/// The deepest cgroup holding all of `paths` (absolute).
fn common_ancestor<'a>(paths: impl IntoIterator<Item = &'a str>) -> String {
    let mut common: Option<Vec<&str>> = None;
    for p in paths {
        let parts: Vec<&str> = p.split('/').filter(|c| !c.is_empty()).collect();
        common = Some(match common {
            None => parts,
            Some(c) => c
                .iter()
                .zip(&parts)
                .take_while(|(a, b)| a == b)
                .map(|(a, _)| *a)
                .collect(),
        });
    }
    format!("/{}", common.unwrap_or_default().join("/"))
}

/// Whether cgroup `path` is below `base` (not `base` itself).
fn strictly_below(path: &str, base: &str) -> bool {
    if base == "/" {
        path.len() > 1
    } else {
        path.strip_prefix(base).is_some_and(|r| r.starts_with('/'))
    }
}

/// The cgroups strictly below `base` down to each of `paths`, parents
/// first.
fn dirs_below<'a>(base: &str, paths: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut dirs = BTreeSet::new();
    for p in paths {
        let mut cur = p;
        while strictly_below(cur, base) {
            dirs.insert(cur.to_string());
            cur = match cur.rfind('/') {
                Some(0) | None => "/",
                Some(i) => &cur[..i],
            };
        }
    }
    let mut v: Vec<String> = dirs.into_iter().collect();
    v.sort_by_key(|d| (d.matches('/').count(), d.clone()));
    v
}

/// What the dumper reads of the cgroup at `path`: the controllers it
/// enables for its children and its limits (none if its directory cannot
/// be reached here).
fn settings(path: &str) -> CgroupDir {
    let mut d = CgroupDir {
        path: path.to_string(),
        ..Default::default()
    };
    let Some(dir) = procfs::cgroup2_dir(path) else {
        tracing::warn!(
            cgroup = path,
            "no cgroup2 mount here shows it: its settings are not saved"
        );
        return d;
    };
    d.threaded =
        std::fs::read_to_string(dir.join("cgroup.type")).is_ok_and(|t| t.trim() == "threaded");
    d.subtree_control = std::fs::read_to_string(dir.join("cgroup.subtree_control"))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let mut files: Vec<String> = CGROUP_LIMITS.iter().map(|f| f.to_string()).collect();
    let mut hugetlb: Vec<String> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.starts_with("hugetlb.") && is_cgroup_limit(f))
        .collect();
    hugetlb.sort();
    files.extend(hugetlb);
    for file in files {
        if let Ok(v) = std::fs::read_to_string(dir.join(&file)) {
            d.limits.push(CgroupLimit {
                file,
                value: v.trim().to_string(),
            });
        }
    }
    d
}

/// The cgroups of the frozen tree (`images`, PIDs as stasis sees them),
/// if its live processes are in several or a thread is in another than
/// its process's (`None`: one for all).
pub fn describe(images: &[ProcessImage]) -> Result<Option<Cgroups>> {
    let procs: Vec<ProcessCgroup> = images
        .iter()
        .filter(|p| p.zombie.is_none())
        .filter_map(|p| {
            procfs::cgroup_of(&p.pid.to_string()).map(|path| ProcessCgroup { pid: p.pid, path })
        })
        .collect();
    let threads: Vec<ThreadCgroup> = procs
        .iter()
        .flat_map(|p| threads_elsewhere(p.pid, &p.path))
        .collect();
    let distinct: BTreeSet<&str> = procs
        .iter()
        .map(|p| p.path.as_str())
        .chain(threads.iter().map(|t| t.path.as_str()))
        .collect();
    if distinct.len() < 2 {
        return Ok(None);
    }
    let base = common_ancestor(distinct.iter().copied());
    let dirs = dirs_below(&base, distinct.iter().copied())
        .iter()
        .map(|d| settings(d))
        .collect();
    Ok(Some(Cgroups {
        procs,
        dirs,
        threads,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_cgroup_and_those_below_it() {
        let paths = ["/t/a", "/t/a/b", "/t/c/d"];
        let base = common_ancestor(paths);
        assert_eq!(base, "/t");
        assert_eq!(
            dirs_below(&base, paths),
            ["/t/a", "/t/c", "/t/a/b", "/t/c/d"]
        );
        // One inside another: the outer one is the common one.
        let paths = ["/t/a", "/t/a/b"];
        assert_eq!(common_ancestor(paths), "/t/a");
        assert_eq!(dirs_below("/t/a", paths), ["/t/a/b"]);
        // Siblings of the top: the root of the hierarchy.
        let paths = ["/x", "/y/z"];
        assert_eq!(common_ancestor(paths), "/");
        assert_eq!(dirs_below("/", paths), ["/x", "/y", "/y/z"]);
        // Names sharing a prefix are not nested.
        assert_eq!(common_ancestor(["/ab/c", "/abc"]), "/");
        assert_eq!(common_ancestor(["/ab/c", "/ab"]), "/ab");
        assert_eq!(dirs_below("/ab", ["/abc"]), Vec::<String>::new());
    }
}
