//! Touch windows (FREM): after a checkpoint, the pages the process writes
//! for a while are the pages a restart will want first.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use stasis_image::touch::{write_touch_set, TouchSet, TouchSource};
use stasis_kernel::pagemap::{Pagemap, ScanQuery};
use stasis_sys as sys;

/// Below this image size a touch window is not worth it (a full restore
/// takes about as long as the window would).
pub const MIN_IMAGE: u64 = 64 << 20;
/// Link speed assumed by `auto` for a restore from another host (1 Gbit/s).
const NET_BYTES_PER_SEC: f64 = 125e6;
const LATENCY_SECS: f64 = 0.001;

/// The window for `--touch-window SPEC`: seconds, or `auto` for FREM's rule
/// (the time to retrieve the image: from disk at the rate this dump wrote
/// it, over a 1 Gbit/s link, plus a latency), off for small images and when
/// longer than the checkpoint interval.
pub fn window(
    spec: &str,
    image_bytes: u64,
    dump_us: u64,
    interval: Option<f64>,
) -> Result<Option<Duration>> {
    let secs = if spec == "auto" {
        if image_bytes < MIN_IMAGE {
            return Ok(None);
        }
        #[allow(clippy::cast_precision_loss)]
        let (w, t) = (image_bytes as f64, dump_us.max(1) as f64 / 1e6);
        let disk = w / t;
        w / disk + w / NET_BYTES_PER_SEC + LATENCY_SECS
    } else {
        let s: f64 = spec
            .parse()
            .ok()
            .filter(|s: &f64| s.is_finite() && *s >= 0.0)
            .with_context(|| format!("--touch-window takes seconds or `auto`, not {spec:?}"))?;
        s
    };
    if interval.is_some_and(|i| secs > i) || secs == 0.0 {
        return Ok(None);
    }
    Ok(Some(Duration::from_secs_f64(secs)))
}

/// Bytes a restore of checkpoint `n` brings back (for an incremental
/// checkpoint, with its ancestors' pages): what a restart must retrieve.
pub fn restored_bytes(store: &stasis_image::ImageDir, n: u32) -> Result<u64> {
    let cp = store.load(Some(n))?;
    Ok(stasis_image::summarize(&cp).memory_pages * sys::PAGE_SIZE)
}

/// Pages of `pid` written since its tracking was armed (present and
/// written; private writable areas only).
fn written_pages(pid: i32) -> Result<Vec<(u64, u32)>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("reading /proc/{pid}/maps"))?;
    let pm = Pagemap::open(pid)?;
    let q = ScanQuery {
        mask: sys::PAGE_IS_WRITTEN | sys::PAGE_IS_PRESENT,
        return_mask: sys::PAGE_IS_WRITTEN | sys::PAGE_IS_PRESENT,
        ..ScanQuery::written()
    };
    let mut out = Vec::new();
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms)) = (it.next(), it.next()) else {
            continue;
        };
        if !perms.starts_with("rw") || !perms.ends_with('p') {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        for r in pm.scan(a, b, q)? {
            let pages = u32::try_from((r.end - r.start) / sys::PAGE_SIZE).unwrap_or(u32::MAX);
            out.push((r.start, pages));
        }
    }
    Ok(out)
}

/// Waits `window`, then stores the pages each process of checkpoint `n`
/// wrote meanwhile as its touch set. Tracking (armed by the dump) is read,
/// not re-armed: the next incremental dump still sees those pages dirty.
pub fn record_window(store: &stasis_image::ImageDir, n: u32, window: Duration) -> Result<TouchSet> {
    std::thread::sleep(window);
    record_now(store, n, window)
}

/// Stores what each process of checkpoint `n` wrote since the checkpoint
/// (`window` long ago) as its touch set.
pub fn record_now(store: &stasis_image::ImageDir, n: u32, window: Duration) -> Result<TouchSet> {
    let cp = store.load(Some(n))?;
    let mut procs = Vec::new();
    for p in cp.manifest.processes.iter().filter(|p| p.zombie.is_none()) {
        match written_pages(p.pid) {
            Ok(r) => procs.push((p.pid, r)),
            // Gone meanwhile: nothing to say about it.
            Err(e) if std::fs::metadata(format!("/proc/{}", p.pid)).is_err() => {
                tracing::debug!(pid = p.pid, "touch window: {e}");
            }
            Err(e) => return Err(e).context(format!("reading what process {} wrote", p.pid)),
        }
    }
    if procs.is_empty() {
        bail!("every process of checkpoint {n} exited during the touch window");
    }
    let ts = TouchSet {
        source: TouchSource::Window,
        window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
        procs,
    };
    write_touch_set(cp.dir(), &ts)?;
    Ok(ts)
}
