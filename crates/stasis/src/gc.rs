//! `stasis gc`: delete old checkpoints, merging what the kept ones need.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use stasis_image::{GcReport, ImageDir};

/// `stasis gc -D DIR --keep N [--json]`; with `-D s3://...`, each
/// `--replica` store is collected the same way after the primary.
pub fn cmd_gc(
    dir: &Path,
    keep: usize,
    json: bool,
    seal: stasis_store::seal::SealOptions,
    replicas: Vec<stasis_store::S3Image>,
) -> Result<ExitCode> {
    let mut replicated = Vec::new();
    let (report, swept) = match crate::store::s3(dir, seal.clone())? {
        Some(image) => {
            anyhow::ensure!(keep >= 1, "--keep must be at least 1");
            if let Some(code) = gc_stores_under(&image, keep, json, &replicas)? {
                return Ok(code);
            }
            let (r, s) = gc_store(&image, keep)?;
            for replica in &replicas {
                replicated.push((replica.url.clone(), gc_store(replica, keep)?));
            }
            (r, Some(s))
        }
        None => {
            crate::store::refuse_for_local(dir, &seal, &replicas)?;
            (
                ImageDir::open(dir)
                    .with_context(|| format!("opening image directory {}", dir.display()))?
                    .gc(keep)
                    .with_context(|| format!("deleting old checkpoints of {}", dir.display()))?,
                None,
            )
        }
    };
    if json {
        let mut v = serde_json::to_value(&report)?;
        if let Some(s) = swept {
            v["swept"] = serde_json::to_value(s)?;
        }
        if !replicated.is_empty() {
            let r: Vec<_> = replicated
                .iter()
                .map(|(url, (r, s))| serde_json::json!({"url": url, "report": r, "swept": s}))
                .collect();
            v["replicas"] = serde_json::Value::Array(r);
        }
        println!("{v}");
    } else {
        println!("{}", line(&report, swept));
        for (url, (r, s)) in &replicated {
            println!("replica {url}: {}", line(r, Some(*s)));
        }
    }
    let _ = std::io::stdout().flush();
    Ok(ExitCode::SUCCESS)
}

/// The gc of one store (primary or replica).
fn gc_store(image: &stasis_store::S3Image, keep: usize) -> Result<(GcReport, stasis_store::Swept)> {
    stasis_store::gc(image, keep, sweep_age())
        .with_context(|| format!("deleting old checkpoints of {}", image.url))
}

fn sweep_age() -> i64 {
    std::env::var("STASIS_S3_SWEEP_AGE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(stasis_store::SWEEP_AGE_S)
}

/// `gc -D s3://...` of a prefix that holds no checkpoint but stores below
/// it (a cluster agent's `PREFIX`, `PREFIX/HOST/jobs/JOB`...): each store
/// keeps its newest `keep`, then the chunks they share are swept once.
/// `None`: `image` is a store (or holds none), collected as one.
fn gc_stores_under(
    image: &stasis_store::S3Image,
    keep: usize,
    json: bool,
    replicas: &[stasis_store::S3Image],
) -> Result<Option<ExitCode>> {
    let listing = || format!("listing {}", image.url);
    if !image.committed().with_context(listing)?.is_empty()
        || image.stores_under().with_context(listing)?.is_empty()
    {
        return Ok(None);
    }
    anyhow::ensure!(
        replicas.is_empty(),
        "{} holds the stores of several trees: --replica is for one store (give each tree's URL)",
        image.url
    );
    let (stores, swept) = stasis_store::gc_under(image, keep, sweep_age())
        .with_context(|| format!("deleting old checkpoints of the stores under {}", image.url))?;
    if json {
        let v: Vec<_> = stores
            .iter()
            .map(|(url, r)| serde_json::json!({"url": url, "report": r}))
            .collect();
        println!("{}", serde_json::json!({"stores": v, "swept": swept}));
    } else {
        for (url, r) in &stores {
            println!("{url}: {}", summary(r));
        }
        println!(
            "swept {} unneeded chunk(s), {}",
            swept.chunks,
            crate::ui::bytes(swept.bytes)
        );
    }
    let _ = std::io::stdout().flush();
    Ok(Some(ExitCode::SUCCESS))
}

/// The summary line, with what was swept.
fn line(report: &GcReport, swept: Option<stasis_store::Swept>) -> String {
    let mut line = summary(report);
    if let Some(s) = swept {
        line.push_str(&format!(
            "; swept {} unneeded chunk(s), {}",
            s.chunks,
            crate::ui::bytes(s.bytes)
        ));
    }
    line
}

/// "kept 4..6; merged 1..3 into 4 (12345 pages); deleted 1, 2, 3".
fn summary(r: &GcReport) -> String {
    let mut parts = vec![if r.kept.is_empty() {
        "no checkpoints".to_string()
    } else {
        format!("kept {}", numbers(&r.kept))
    }];
    for m in &r.merged {
        parts.push(format!(
            "merged {} into {} ({} pages)",
            numbers(&m.ancestors),
            m.checkpoint,
            m.pages
        ));
    }
    parts.push(if r.deleted.is_empty() {
        "nothing to delete".to_string()
    } else {
        format!("deleted {}", list(&r.deleted))
    });
    if r.stale_temps_removed > 0 {
        parts.push(format!(
            "removed {} leftover temporary director{}",
            r.stale_temps_removed,
            if r.stale_temps_removed == 1 {
                "y"
            } else {
                "ies"
            }
        ));
    }
    parts.join("; ")
}

/// "4..6" for a run of consecutive numbers, else "1, 3, 4".
fn numbers(v: &[u32]) -> String {
    match (v.first(), v.last()) {
        (Some(&a), Some(&b)) if v.len() > 1 && u64::from(b - a) + 1 == v.len() as u64 => {
            format!("{a}..{b}")
        }
        _ => list(v),
    }
}

fn list(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use stasis_image::MergeReport;

    #[test]
    fn summaries() {
        let mut r = GcReport {
            kept: vec![4, 5, 6],
            deleted: vec![1, 2, 3],
            merged: vec![MergeReport {
                checkpoint: 4,
                ancestors: vec![1, 2, 3],
                pages: 12345,
                bytes: 0,
            }],
            stale_temps_removed: 0,
        };
        assert_eq!(
            summary(&r),
            "kept 4..6; merged 1..3 into 4 (12345 pages); deleted 1, 2, 3"
        );
        r.merged.clear();
        r.kept = vec![2, 7];
        r.deleted = vec![1];
        r.stale_temps_removed = 1;
        assert_eq!(
            summary(&r),
            "kept 2, 7; deleted 1; removed 1 leftover temporary directory"
        );
        r.kept = vec![3];
        r.deleted.clear();
        assert_eq!(
            summary(&r),
            "kept 3; nothing to delete; removed 1 leftover temporary directory"
        );
    }
}
