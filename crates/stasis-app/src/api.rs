//! The library's operations, in Rust, over one process-wide state. The C
//! functions of `ffi.rs` are thin wrappers of these.
//!
//! Locks: [`LIB`] (this state) is taken before [`crate::monitor::MON`],
//! never the other way round; the fault handler takes only `MON`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use stasis_kernel::selfmon::AppRegion;

use crate::config::{stasis_config, Config, Mode, TargetKind};
use crate::error::{AppError, Result};
use crate::format::{Meta, Snapshot};
use crate::monitor::{self, Monitor};
use crate::selfuffd::SelfUffd;
use crate::store::{check_name, dir::DirTarget, dir::MAX_CHAIN, pmem::PmemTarget, Target};

/// The checkpoint the next delta builds on.
#[derive(Debug, Clone)]
struct Last {
    name: String,
    version: i32,
    id: u64,
    depth: u32,
}

#[derive(Debug, Default)]
struct WriteStats {
    checkpoints: AtomicU64,
    bytes_written: AtomicU64,
    write_ns: AtomicU64,
}

struct Lib {
    dir: PathBuf,
    target: Arc<Mutex<Box<dyn Target>>>,
    last: Option<Last>,
    pending: Option<JoinHandle<Result<()>>>,
    w: Arc<WriteStats>,
    auto_note: Option<String>,
}

static LIB: Mutex<Option<Lib>> = Mutex::new(None);

fn lib() -> MutexGuard<'static, Option<Lib>> {
    LIB.lock().unwrap_or_else(PoisonError::into_inner)
}

fn with_lib<T>(f: impl FnOnce(&mut Lib) -> Result<T>) -> Result<T> {
    let mut g = lib();
    f(g.as_mut().ok_or(AppError::NotInit)?)
}

fn with_mon<T>(f: impl FnOnce(&mut Monitor) -> Result<T>) -> Result<T> {
    let mut g = monitor::lock();
    f(g.as_mut().ok_or(AppError::NotInit)?)
}

/// Picks `uffd` where this kernel has it, else `acck` (with the reason).
fn auto_mode() -> (Mode, Option<String>) {
    match SelfUffd::open() {
        Ok(_) => (Mode::Uffd, None),
        Err(e) => (
            Mode::Acck,
            Some(format!("auto: uffd unavailable ({e}), using acck")),
        ),
    }
}

/// `stasis_init`.
pub fn init(dir: &Path, cfg: Option<&stasis_config>) -> Result<()> {
    let mut g = lib();
    if g.is_some() {
        return Err(AppError::AlreadyInit);
    }
    let cfg = Config::resolve(cfg)?;
    let (mode, auto_note) = match cfg.mode {
        Some(m) => (m, None),
        None => auto_mode(),
    };
    let target: Box<dyn Target> = match cfg.target {
        TargetKind::Dir => Box::new(DirTarget::open(dir, cfg.max_versions)?),
        TargetKind::Pmem => Box::new(PmemTarget::open(dir, cfg.pmem_latency_ns)?),
    };
    let m = Monitor::new(mode, cfg.acck, cfg.huge_pages)?;
    *monitor::lock() = Some(m);
    *g = Some(Lib {
        dir: dir.to_path_buf(),
        target: Arc::new(Mutex::new(target)),
        last: None,
        pending: None,
        w: Arc::default(),
        auto_note,
    });
    Ok(())
}

/// `stasis_protect`.
pub fn protect(id: i32, mem: AppRegion) -> Result<()> {
    let g = lib();
    if g.as_ref().ok_or(AppError::NotInit)?.pending.is_some() {
        return Err(AppError::Busy);
    }
    if mem.is_empty() {
        return Err(AppError::Invalid(format!("region {id} is empty")));
    }
    with_mon(|m| m.add(id, mem))
}

/// `stasis_unprotect`.
pub fn unprotect(id: i32) -> Result<()> {
    let g = lib();
    if g.as_ref().ok_or(AppError::NotInit)?.pending.is_some() {
        return Err(AppError::Busy);
    }
    with_mon(|m| m.remove(id))
}

fn join(l: &mut Lib) -> Result<()> {
    let Some(h) = l.pending.take() else {
        return Ok(());
    };
    let r = h
        .join()
        .unwrap_or_else(|_| Err(AppError::Internal("the checkpoint writer panicked".into())));
    if r.is_err() {
        // The committed parent is unknown now: the next checkpoint is full.
        l.last = None;
        if let Some(m) = monitor::lock().as_mut() {
            m.mark_all_whole();
        }
    }
    r
}

fn new_id() -> u64 {
    static N: AtomicU64 = AtomicU64::new(1);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let x = t
        ^ (u64::from(std::process::id()) << 40)
        ^ N.fetch_add(1, Ordering::Relaxed).rotate_left(20);
    xxhash_rust::xxh3::xxh3_64(&x.to_le_bytes()) | 1
}

/// `stasis_checkpoint_begin`: copies what changed and returns; the target
/// is written by a background thread until [`checkpoint_wait`].
pub fn checkpoint_begin(name: &str, version: i32) -> Result<()> {
    check_name(name)?;
    if version < 0 {
        return Err(AppError::Invalid(format!(
            "version {version}: must be >= 0"
        )));
    }
    let mut g = lib();
    let l = g.as_mut().ok_or(AppError::NotInit)?;
    if l.pending.is_some() {
        return Err(AppError::Busy);
    }
    let deltas = l
        .target
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .takes_deltas();
    let parent = l
        .last
        .clone()
        .filter(|p| deltas && p.name == name && p.version != version && p.depth + 1 < MAX_CHAIN);
    let meta = Meta {
        depth: parent.as_ref().map_or(0, |p| p.depth + 1),
        id: new_id(),
        parent_id: parent.as_ref().map_or(0, |p| p.id),
        version,
        parent_version: parent.as_ref().map_or(-1, |p| p.version),
    };
    with_mon(|m| {
        if parent.is_none() {
            m.mark_all_whole();
        }
        m.snapshot_begin(true)
    })?;
    l.last = Some(Last {
        name: name.to_string(),
        version,
        id: meta.id,
        depth: meta.depth,
    });
    let (target, w, name) = (l.target.clone(), l.w.clone(), name.to_string());
    l.pending = Some(std::thread::spawn(move || {
        let snap = copy_out()?;
        let t0 = Instant::now();
        let n = target
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .commit(&name, &meta, &snap)?;
        if let Some(m) = monitor::lock().as_mut() {
            m.give_back(snap.data);
        }
        w.bytes_written.fetch_add(n, Ordering::Relaxed);
        w.write_ns.fetch_add(
            u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        w.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }));
    Ok(())
}

/// Copies the pages of the checkpoint in progress that the program has
/// not written yet, a megabyte at a time (the program's first write to a
/// page copies it first), and returns the snapshot.
fn copy_out() -> Result<Snapshot> {
    loop {
        stasis_sys::fault::delay(stasis_sys::fault::Slow::AppCopy);
        let mut g = monitor::lock();
        let m = g.as_mut().ok_or(AppError::NotInit)?;
        if let Some(s) = m.snapshot_step(256) {
            return Ok(s);
        }
    }
}

/// `stasis_checkpoint_wait`.
pub fn checkpoint_wait() -> Result<()> {
    with_lib(join)
}

/// `stasis_checkpoint`: begin and wait.
pub fn checkpoint(name: &str, version: i32) -> Result<()> {
    checkpoint_begin(name, version)?;
    checkpoint_wait()
}

/// `stasis_restart_test`: the newest complete version of `name`.
pub fn restart_test(name: &str) -> Result<Option<i32>> {
    check_name(name)?;
    with_lib(|l| {
        join(l)?;
        let t = l.target.lock().unwrap_or_else(PoisonError::into_inner);
        t.latest(name)
    })
}

/// `stasis_restart`: refills the protected regions from `name` at `version`.
pub fn restart(name: &str, version: i32) -> Result<()> {
    check_name(name)?;
    with_lib(|l| {
        join(l)?;
        let (meta, chain) = l
            .target
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .load(name, version)?;
        let mismatch = |why: String| AppError::Mismatch {
            name: name.to_string(),
            version,
            why,
        };
        with_mon(|m| {
            let have = m.regions();
            let want = &chain
                .last()
                .ok_or_else(|| mismatch("empty checkpoint".into()))?
                .regions;
            for r in want {
                match have.iter().find(|(id, _)| *id == r.id) {
                    None => return Err(mismatch(format!("region {} is not protected", r.id))),
                    Some((_, len)) if *len as u64 != r.len => {
                        return Err(mismatch(format!(
                            "region {} has {len} bytes, the checkpoint {}",
                            r.id, r.len
                        )))
                    }
                    Some(_) => {}
                }
            }
            let mut based = vec![false; want.len()];
            m.disarm_all()?;
            for s in &chain {
                apply(m, s, want, &mut based)?;
            }
            if let Some(i) = based.iter().position(|b| !b) {
                return Err(AppError::Damaged {
                    path: l.dir.clone(),
                    why: format!(
                        "no full copy of region {} in the chain of {name} {version}",
                        want[i].id
                    ),
                });
            }
            m.rescan()?;
            m.rearm_all()?;
            // Regions protected now but not in the checkpoint have no base
            // in it: the next checkpoint copies them whole.
            for (id, _) in have
                .iter()
                .filter(|(id, _)| !want.iter().any(|w| w.id == *id))
            {
                m.mark_whole(*id);
            }
            Ok(())
        })?;
        l.last = Some(Last {
            name: name.to_string(),
            version,
            id: meta.id,
            depth: meta.depth,
        });
        Ok(())
    })
}

fn apply(
    m: &Monitor,
    s: &Snapshot,
    want: &[crate::format::RegionData],
    based: &mut [bool],
) -> Result<()> {
    let mut at = 0usize;
    for r in &s.regions {
        let target = want.iter().position(|w| w.id == r.id && w.len == r.len);
        if r.whole {
            if let Some(i) = target {
                based[i] = true;
            }
        }
        for &(off, len) in &r.chunks {
            let len =
                usize::try_from(len).map_err(|_| AppError::Internal("chunk too long".into()))?;
            if target.is_some() {
                let off = usize::try_from(off)
                    .map_err(|_| AppError::Internal("offset too large".into()))?;
                m.write_region(r.id, off, &s.data[at..at + len])?;
            }
            at += len;
        }
    }
    Ok(())
}

/// Statistics (see `struct stasis_stats`).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub mode: Option<Mode>,
    pub c: monitor::Counters,
    pub checkpoints: u64,
    pub bytes_written: u64,
    pub write_ns: u64,
    pub note: Option<String>,
}

/// `stasis_stats`.
pub fn stats() -> Result<Stats> {
    with_lib(|l| {
        let (mode, c, huge) =
            with_mon(|m| Ok((m.mode(), m.c, m.huge_note.as_ref().map(ToString::to_string))))?;
        Ok(Stats {
            mode: Some(mode),
            c,
            checkpoints: l.w.checkpoints.load(Ordering::Relaxed),
            bytes_written: l.w.bytes_written.load(Ordering::Relaxed),
            write_ns: l.w.write_ns.load(Ordering::Relaxed),
            note: l
                .auto_note
                .clone()
                .or(huge.map(|h| format!("huge pages: {h}"))),
        })
    })
}

/// `stasis_request_checkpoint`: asks the surrounding `stasis run` for a
/// transparent checkpoint now and waits until it is committed (see
/// [`crate::request`]). Needs no `stasis_init`.
pub fn request_checkpoint() -> Result<crate::request::Requested> {
    crate::request::request_checkpoint()
}

/// `stasis_finalize`: waits for a background checkpoint, lifts all
/// protection, forgets everything.
pub fn finalize() -> Result<()> {
    let mut g = lib();
    let l = g.as_mut().ok_or(AppError::NotInit)?;
    let r = join(l);
    let mut mg = monitor::lock();
    if let Some(m) = mg.as_mut() {
        m.release_all()?;
    }
    *mg = None;
    *g = None;
    r
}
