//! Building a local image directory from a page server: a whole chain of
//! checkpoints, with page data (`Full`) or as sparse packs whose runs are
//! fetched later with [`fill_runs`] (`Sparse`).

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;

use stasis_image::{
    checkpoint_dir_name, decode_manifest, load_chain, ImageDir, PackReader, RunEntry,
    CHECKPOINTS_DIR, FORMAT_VERSION, LATEST_NAME, MANIFEST_NAME, MARKER_NAME, PACK_HEADER_LEN,
    PACK_TRAILER_LEN, TEMP_PREFIX,
};

use crate::{Client, PageServerError};

/// Connections used to fetch page data for a `Full` mirror.
const PARALLEL: usize = 4;
/// Runs per unit of work handed to one connection (up to 64 MiB).
const UNIT_RUNS: usize = 64;

/// What a mirror holds of the page packs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MirrorData {
    /// Complete packs, byte-identical to the server's.
    Full,
    /// Packs of the right size with header, index and trailer, and holes
    /// where the page data goes (see [`fill_runs`]).
    Sparse,
}

/// A local image directory made by [`mirror`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// The new image directory.
    pub dir: PathBuf,
    /// The checkpoint mirrored (the directory's latest).
    pub checkpoint: u32,
    /// `checkpoint` and its ancestors, nearest first, all mirrored.
    pub chain: Vec<u32>,
}

/// A run fetch handed to one connection.
struct Unit {
    checkpoint: u32,
    pack: String,
    path: PathBuf,
    runs: Vec<RunEntry>,
}

/// Temporary checkpoint directories, removed unless committed.
struct Staging(Vec<(u32, PathBuf)>);

impl Drop for Staging {
    fn drop(&mut self) {
        for (_, dir) in &self.0 {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// Mirrors checkpoint `n` (default: the server's latest) and its ancestors
/// from the page server at `addr` into `dest`, which must not exist or be an
/// empty directory. The result is an image directory that
/// `stasis_image::ImageDir` reads, whose `latest` is `n`. Each checkpoint
/// is assembled in a temporary directory and renamed into place once
/// complete and synced. `progress` gets (bytes done, bytes in all).
pub fn mirror(
    addr: &str,
    token: &[u8],
    n: Option<u32>,
    dest: &Path,
    data: MirrorData,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<Mirror, PageServerError> {
    let dest_exists = check_dest(dest)?;
    let mut client = Client::connect(addr, token)?;
    let n = match n {
        Some(n) => n,
        None => client.latest()?,
    };
    let chain = client.chain(n)?;
    make_dest(dest, dest_exists)?;
    let built = build(addr, token, client, &chain, dest, data, progress);
    if built.is_err() {
        // Leave `dest` as it was: absent or empty.
        let _ = fs::remove_dir_all(dest.join(CHECKPOINTS_DIR));
        for name in [MARKER_NAME, LATEST_NAME] {
            let _ = fs::remove_file(dest.join(name));
            let _ = fs::remove_file(dest.join(format!("{name}.tmp")));
        }
        if !dest_exists {
            let _ = fs::remove_dir(dest);
        }
    }
    built?;
    Ok(Mirror {
        dir: dest.to_path_buf(),
        checkpoint: n,
        chain,
    })
}

/// Fills the freshly made `dest` with `chain` (a checkpoint and its
/// ancestors, nearest first) and checks the result.
fn build(
    addr: &str,
    token: &[u8],
    mut client: Client,
    chain: &[u32],
    dest: &Path,
    data: MirrorData,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<(), PageServerError> {
    // `Client::chain` returns a non-empty chain starting at the checkpoint.
    let n = chain.first().copied().unwrap_or_default();
    let cps = dest.join(CHECKPOINTS_DIR);
    make_dir(&cps)?;
    write_atomic(
        dest,
        MARKER_NAME,
        format!("stasis image directory\nformat {FORMAT_VERSION}\n").as_bytes(),
    )?;

    // Metadata first, on one connection: manifests, small files, skeletons.
    let mut staging = Staging(Vec::new());
    let mut units = Vec::new();
    let mut done = 0u64;
    for &c in chain.iter().rev() {
        let tmp = cps.join(format!(
            "{TEMP_PREFIX}{}-mirror-{}",
            checkpoint_dir_name(c),
            std::process::id()
        ));
        make_dir(&tmp)?;
        staging.0.push((c, tmp.clone()));
        done += stage_checkpoint(&mut client, c, &tmp, data, &mut units)?;
    }
    let total = done
        + units
            .iter()
            .flat_map(|u| &u.runs)
            .map(RunEntry::len)
            .sum::<u64>();
    if let Some(p) = progress {
        p(done, total);
    }
    // A sparse mirror still holds the content packs whole (a restore reads
    // them before it builds anything): their units are the only ones.
    if !units.is_empty() {
        fetch_units(addr, token, client, &units, progress, done, total)?;
    }

    // Commit, oldest first, so that every committed checkpoint has its parent.
    for (c, tmp) in &staging.0 {
        for entry in fs::read_dir(tmp).map_err(PageServerError::local("list", tmp))? {
            let path = entry.map_err(PageServerError::local("list", tmp))?.path();
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(PageServerError::local("fsync", &path))?;
        }
        sync_dir(tmp)?;
        let final_dir = cps.join(checkpoint_dir_name(*c));
        fs::rename(tmp, &final_dir).map_err(PageServerError::local("rename", tmp))?;
        sync_dir(&cps)?;
    }
    staging.0.clear();
    write_atomic(dest, LATEST_NAME, format!("{n}\n").as_bytes())?;

    // Check the result with the image reader.
    let bad = |error| PageServerError::BadMirror {
        dir: dest.to_path_buf(),
        error,
    };
    let image = ImageDir::open(dest).map_err(bad)?;
    let loaded = load_chain(&image, Some(n)).map_err(bad)?;
    for cp in &loaded {
        for r in stasis_image::pack_refs(&cp.manifest) {
            cp.open_pack(r).map_err(bad)?;
        }
    }
    if loaded.iter().map(|c| c.number).ne(chain.iter().copied()) {
        return Err(PageServerError::Protocol {
            addr: addr.to_string(),
            during: format!("mirroring checkpoint {n}"),
            reason: "the mirrored chain differs from the one the server listed".into(),
        });
    }
    Ok(())
}

/// Writes the files of checkpoint `c` into `tmp` (packs as skeletons) and
/// queues the runs of its packs. Returns the bytes received.
fn stage_checkpoint(
    client: &mut Client,
    c: u32,
    tmp: &Path,
    data: MirrorData,
    units: &mut Vec<Unit>,
) -> Result<u64, PageServerError> {
    let files = client.files(c)?;
    let manifest_bytes = client.file(c, MANIFEST_NAME)?;
    let mpath = tmp.join(MANIFEST_NAME);
    let manifest = decode_manifest(&manifest_bytes, c, &mpath).map_err(|error| {
        PageServerError::BadMirror {
            dir: tmp.to_path_buf(),
            error,
        }
    })?;
    let mut f = create_new(&mpath)?;
    f.write_all(&manifest_bytes)
        .map_err(PageServerError::local("write", &mpath))?;
    let mut done = manifest_bytes.len() as u64;
    let packs: HashMap<&str, _> = stasis_image::pack_refs(&manifest)
        .map(|r| (r.name.as_str(), r))
        .collect();
    for r in packs.values() {
        if !crate::protocol::is_servable_name(&r.name) {
            return Err(PageServerError::Protocol {
                addr: client.addr().to_string(),
                during: format!("mirroring checkpoint {c}"),
                reason: format!("its manifest names the pack {:?}", r.name),
            });
        }
        let path = tmp.join(&r.name);
        let sk = client.skeleton(c, &r.name)?;
        let file = create_new(&path)?;
        let write = file
            .set_len(sk.size)
            .and_then(|()| file.write_all_at(&sk.header, 0))
            .and_then(|()| file.write_all_at(&sk.tail, sk.tail_off));
        write.map_err(PageServerError::local("write", &path))?;
        done += (sk.header.len() + sk.tail.len()) as u64;
        let content = manifest.content.as_ref().is_some_and(|x| x.name == r.name);
        if data == MirrorData::Full || content {
            let reader =
                PackReader::open(&path, Some(r)).map_err(|error| PageServerError::BadMirror {
                    dir: tmp.to_path_buf(),
                    error,
                })?;
            for runs in reader.runs().chunks(UNIT_RUNS) {
                units.push(Unit {
                    checkpoint: c,
                    pack: r.name.clone(),
                    path: path.clone(),
                    runs: runs.to_vec(),
                });
            }
        }
    }
    for f in files
        .iter()
        .filter(|f| f.name != MANIFEST_NAME && !packs.contains_key(f.name.as_str()))
    {
        let path = tmp.join(&f.name);
        let mut out = BufWriter::new(create_new(&path)?);
        done += client.file_to(c, &f.name, &mut out)?;
        out.flush()
            .map_err(PageServerError::local("write", &path))?;
    }
    Ok(done)
}

/// Fetches the runs of `units` over up to [`PARALLEL`] connections (the
/// first being `first`) and writes them into their packs.
fn fetch_units(
    addr: &str,
    token: &[u8],
    first: Client,
    units: &[Unit],
    progress: Option<&dyn Fn(u64, u64)>,
    mut done: u64,
    total: u64,
) -> Result<(), PageServerError> {
    let workers = PARALLEL.min(units.len());
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<u64>();
    let mut first = Some(first);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let (tx, client, next, failed) = (tx.clone(), first.take(), &next, &failed);
                s.spawn(move || {
                    let r = fetch_worker(addr, token, client, units, next, failed, &tx);
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        drop(tx);
        for bytes in rx {
            done += bytes;
            if let Some(p) = progress {
                p(done, total);
            }
        }
        let mut result = Ok(());
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        result
    })
}

fn fetch_worker(
    addr: &str,
    token: &[u8],
    client: Option<Client>,
    units: &[Unit],
    next: &AtomicUsize,
    failed: &AtomicBool,
    tx: &mpsc::Sender<u64>,
) -> Result<(), PageServerError> {
    let mut client = match client {
        Some(c) => c,
        None => Client::connect(addr, token)?,
    };
    let mut files: HashMap<&Path, File> = HashMap::new();
    while !failed.load(Ordering::Relaxed) {
        let Some(u) = units.get(next.fetch_add(1, Ordering::Relaxed)) else {
            break;
        };
        if !files.contains_key(u.path.as_path()) {
            files.insert(&u.path, open_pack_for_write(&u.path)?);
        }
        let Some(file) = files.get(u.path.as_path()) else {
            continue;
        };
        client.read_runs(u.checkpoint, &u.pack, &u.runs, |e, data| {
            file.write_all_at(data, e.file_off)
                .map_err(PageServerError::local("write", &u.path))?;
            let _ = tx.send(e.len());
            Ok(())
        })?;
    }
    Ok(())
}

/// Fetches `runs` of page pack `pack_name` of checkpoint `n` and writes each
/// at its `file_off` in `dest_pack`, a sparse pack made by a `Sparse`
/// [`mirror`] (pipelined; checksums verified before writing; not fsynced).
pub fn fill_runs(
    client: &mut Client,
    n: u32,
    pack_name: &str,
    dest_pack: &Path,
    runs: &[RunEntry],
) -> Result<(), PageServerError> {
    let file = open_pack_for_write(dest_pack)?;
    let len = file
        .metadata()
        .map_err(PageServerError::local("stat", dest_pack))?
        .len();
    let data_end = len.saturating_sub(PACK_TRAILER_LEN);
    for r in runs {
        let fits = matches!(r.file_off.checked_add(r.len()), Some(end) if end <= data_end);
        if r.file_off < PACK_HEADER_LEN || !fits {
            return Err(PageServerError::BadRequest {
                during: format!("filling {}", dest_pack.display()),
                reason: format!(
                    "the run at file offset {:#x} ({} pages) is outside the page data of a {len}-byte pack",
                    r.file_off, r.npages
                ),
            });
        }
    }
    client.read_runs(n, pack_name, runs, |e, data| {
        file.write_all_at(data, e.file_off)
            .map_err(PageServerError::local("write", dest_pack))
    })
}

/// Opens an existing pack (a regular file, never through a link) to write
/// page data into it.
fn open_pack_for_write(path: &Path) -> Result<File, PageServerError> {
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(PageServerError::local("open", path))?;
    let meta = file
        .metadata()
        .map_err(PageServerError::local("stat", path))?;
    if !meta.is_file() {
        return Err(PageServerError::Local {
            action: "open",
            path: path.to_path_buf(),
            error: io::Error::other("not a regular file"),
        });
    }
    Ok(file)
}

/// `Ok(true)` if `dest` is an existing empty directory, `Ok(false)` if it
/// does not exist; anything else is refused.
fn check_dest(dest: &Path) -> Result<bool, PageServerError> {
    match fs::symlink_metadata(dest) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(PageServerError::local("stat", dest)(e)),
        Ok(m) if m.is_dir() => {
            let mut entries = fs::read_dir(dest).map_err(PageServerError::local("list", dest))?;
            if entries.next().is_some() {
                return Err(PageServerError::DestNotEmpty {
                    path: dest.to_path_buf(),
                });
            }
            Ok(true)
        }
        Ok(_) => Err(PageServerError::DestNotEmpty {
            path: dest.to_path_buf(),
        }),
    }
}

fn make_dest(dest: &Path, exists: bool) -> Result<(), PageServerError> {
    if exists {
        fs::set_permissions(dest, fs::Permissions::from_mode(0o700))
            .map_err(PageServerError::local("chmod", dest))
    } else {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dest)
            .map_err(PageServerError::local("create directory", dest))
    }
}

fn make_dir(path: &Path) -> Result<(), PageServerError> {
    DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(PageServerError::local("create directory", path))
}

/// Creates a new file, mode 0600, never through a link.
fn create_new(path: &Path) -> Result<File, PageServerError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(PageServerError::local("create", path))
}

fn sync_dir(path: &Path) -> Result<(), PageServerError> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .and_then(|d| d.sync_all())
        .map_err(PageServerError::local("fsync directory", path))
}

/// Writes `dir/name` through `name.tmp`, fsynced, renamed into place
/// ([`stasis_image::write_atomic_file`]).
fn write_atomic(dir: &Path, name: &str, contents: &[u8]) -> Result<(), PageServerError> {
    stasis_image::write_atomic_file(&dir.join(name), contents).map_err(|e| match e {
        stasis_image::ImageError::Io {
            action,
            path,
            source,
        } => PageServerError::Local {
            action,
            path,
            error: source,
        },
        error => PageServerError::BadMirror {
            dir: dir.to_path_buf(),
            error,
        },
    })
}
