//! The image directory: numbered checkpoints, atomic commit, `latest` pointer.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::fcntl::{Flock, FlockArg};
use tracing::{debug, warn};

use crate::fsutil::{self, is_plain_name, Kind};
use crate::manifest::{Manifest, PackRef};
use crate::manifest_io::{encode_manifest, read_manifest_file};
use crate::pack::{PackReader, PackWriter};
use crate::prepared::{check_pack_names, check_packs, place, CUT_NAME};
use crate::{ImageError, FORMAT_VERSION};

/// Name of the marker file that identifies an image directory.
pub const MARKER_NAME: &str = "STASIS-IMAGE";
/// Name of the pointer to the newest committed checkpoint.
pub const LATEST_NAME: &str = "latest";
/// Name of the directory holding the checkpoints.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// The PID of the process that made the temporary checkpoint directory
/// named `name` (`.tmp-NUMBER-PID-NANOS`, see `begin_checkpoint`).
pub fn temp_owner(name: &str) -> Option<u32> {
    name.strip_prefix(TEMP_PREFIX)?
        .split('-')
        .nth(1)?
        .parse()
        .ok()
}

/// Removes the temporary checkpoint directories that process `pid` made
/// in the image directory `dir`, without the directory lock: for a dump
/// aborting (SIGTERM) while it holds that lock and its writers still run.
/// Each is first renamed, so that they cannot add to it by its path, and
/// its removal is tried again for a while (a writer may still create a
/// file through an open directory fd); whatever is left keeps a temporary
/// name, which the next dump removes. Returns how many were removed.
pub fn remove_temps_of(dir: &Path, pid: u32) -> usize {
    let cps = dir.join(CHECKPOINTS_DIR);
    let Ok(rd) = fs::read_dir(&cps) else {
        return 0;
    };
    let ours: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .filter(|e| temp_owner(&e.file_name().to_string_lossy()) == Some(pid))
        .map(|e| e.path())
        .collect();
    let mut removed = 0;
    for p in ours {
        let gone = cps.join(format!(
            "{}-aborted",
            p.file_name().unwrap_or_default().to_string_lossy()
        ));
        let p = if fs::rename(&p, &gone).is_ok() {
            gone
        } else {
            p
        };
        let t0 = std::time::Instant::now();
        loop {
            if fs::remove_dir_all(&p).is_ok() || !p.exists() {
                removed += 1;
                break;
            }
            if t0.elapsed() > std::time::Duration::from_secs(5) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    removed
}

/// Name of the lock file.
pub const LOCK_NAME: &str = ".lock";
/// Prefix of in-progress (uncommitted) checkpoint directories.
pub const TEMP_PREFIX: &str = ".tmp-";
/// Name of the manifest inside a checkpoint directory.
pub const MANIFEST_NAME: &str = "manifest.bin";

/// First line of the marker file.
const MARKER_FIRST_LINE: &str = "stasis image directory";
/// Largest marker / `latest` file accepted.
const SMALL_FILE_LIMIT: u64 = 4096;

/// Directory name of checkpoint `n` (`00000001`).
pub fn checkpoint_dir_name(n: u32) -> String {
    format!("{n:08}")
}

/// Parses a committed checkpoint directory name (canonical `{n:08}`, n >= 1).
fn parse_checkpoint_name(name: &OsStr) -> Option<u32> {
    let s = name.to_str()?;
    if !(8..=10).contains(&s.len()) || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u32 = s.parse().ok()?;
    (n >= 1 && checkpoint_dir_name(n) == s).then_some(n)
}

/// Name of the page pack of process `pid`.
pub fn pack_file_name(pid: i32) -> String {
    format!("pages-{pid}.pack")
}

/// What the `latest` file says.
pub(crate) enum Pointer {
    Missing,
    Value(u32),
    Garbage(String),
}

/// Why a `stasis-image` marker was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerProblem {
    /// Not a valid marker: what is wrong with it.
    Bad(&'static str),
    /// It names a format newer than this one.
    Newer(u32),
}

/// Parses the contents of the `stasis-image` marker: the format version.
pub fn parse_marker(bytes: &[u8]) -> Result<u32, MarkerProblem> {
    let text = std::str::from_utf8(bytes).map_err(|_| MarkerProblem::Bad("is not text"))?;
    let mut lines = text.lines();
    if lines.next() != Some(MARKER_FIRST_LINE) {
        return Err(MarkerProblem::Bad("has a bad first line"));
    }
    let version = lines
        .next()
        .and_then(|l| l.strip_prefix("format "))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .ok_or(MarkerProblem::Bad("has no format line"))?;
    if version == 0 {
        return Err(MarkerProblem::Bad("names format 0"));
    }
    if version > FORMAT_VERSION {
        return Err(MarkerProblem::Newer(version));
    }
    Ok(version)
}

/// Parses the contents of the `latest` pointer: a checkpoint number >= 1
/// and a newline; `None` for anything else.
pub fn parse_latest(bytes: &[u8]) -> Option<u32> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.strip_suffix('\n'))
        .filter(|s| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|&n| n >= 1)
}

/// An image directory (see `docs/image-format.md`).
#[derive(Debug, Clone)]
pub struct ImageDir {
    path: PathBuf,
}

impl ImageDir {
    /// Opens `dir` for dumping, creating it (mode 0700, with missing parents)
    /// if needed. An existing directory must be an image directory or empty.
    pub fn create_or_open(dir: &Path) -> Result<ImageDir, ImageError> {
        match fsutil::kind(dir)? {
            Kind::Missing => {
                fsutil::create_dir_all(dir)?;
                if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                    fsutil::sync_dir(parent)?;
                }
                debug!(dir = %dir.display(), "created image directory");
                return Ok(ImageDir {
                    path: dir.to_path_buf(),
                });
            }
            Kind::Dir => {}
            Kind::Symlink => {
                return Err(ImageError::Symlink {
                    path: dir.to_path_buf(),
                })
            }
            Kind::File | Kind::Other => {
                return Err(ImageError::NotADirectory {
                    path: dir.to_path_buf(),
                })
            }
        }
        let image = ImageDir {
            path: dir.to_path_buf(),
        };
        if image.read_marker()?.is_none() {
            // Not marked: accept only an empty directory or the leftovers of a
            // first dump that stopped before writing the marker.
            let entries = fs::read_dir(dir).map_err(ImageError::io("list", dir))?;
            for entry in entries {
                let entry = entry.map_err(ImageError::io("list", dir))?;
                let name = entry.file_name();
                let ok = [LOCK_NAME, CHECKPOINTS_DIR, "STASIS-IMAGE.tmp"]
                    .iter()
                    .any(|n| name == OsStr::new(n));
                if !ok {
                    return Err(ImageError::ForeignDir {
                        path: dir.to_path_buf(),
                    });
                }
            }
        }
        image.warn_if_accessible();
        Ok(image)
    }

    /// Opens an existing image directory for reading.
    pub fn open(dir: &Path) -> Result<ImageDir, ImageError> {
        fsutil::require_real_dir(dir, |path| ImageError::NoSuchDir { path })?;
        let image = ImageDir {
            path: dir.to_path_buf(),
        };
        if image.read_marker()?.is_none() {
            return Err(ImageError::NotImageDir {
                path: dir.to_path_buf(),
                reason: format!("no {MARKER_NAME} marker"),
            });
        }
        Ok(image)
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn checkpoints_path(&self) -> PathBuf {
        self.path.join(CHECKPOINTS_DIR)
    }

    fn warn_if_accessible(&self) {
        if let Ok(m) = fs::symlink_metadata(&self.path) {
            if m.permissions().mode() & 0o077 != 0 {
                warn!(
                    dir = %self.path.display(),
                    "image directory is accessible to other users; images hold process memory, consider chmod 700"
                );
            }
        }
    }

    /// Reads and validates the marker; `Ok(None)` if it does not exist.
    fn read_marker(&self) -> Result<Option<u32>, ImageError> {
        let path = self.path.join(MARKER_NAME);
        let Some(bytes) = fsutil::read_small(&path, SMALL_FILE_LIMIT)? else {
            return Ok(None);
        };
        let not_image = |reason: &str| ImageError::NotImageDir {
            path: self.path.clone(),
            reason: format!("{MARKER_NAME} marker {reason}"),
        };
        if bytes.len() as u64 > SMALL_FILE_LIMIT {
            return Err(not_image("is too large"));
        }
        match parse_marker(&bytes) {
            Ok(version) => Ok(Some(version)),
            Err(MarkerProblem::Newer(found)) => Err(ImageError::NewerFormat {
                path: path.clone(),
                found,
                supported: FORMAT_VERSION,
            }),
            Err(MarkerProblem::Bad(reason)) => Err(not_image(reason)),
        }
    }

    /// Committed checkpoint numbers, ascending. Temporary (`.tmp-*`) and
    /// unrelated entries are ignored.
    pub fn checkpoints(&self) -> Result<Vec<u32>, ImageError> {
        let cps = self.checkpoints_path();
        match fsutil::kind(&cps)? {
            Kind::Missing => return Ok(Vec::new()),
            Kind::Dir => {}
            Kind::Symlink => return Err(ImageError::Symlink { path: cps }),
            Kind::File | Kind::Other => return Err(ImageError::NotADirectory { path: cps }),
        }
        let mut out = Vec::new();
        for entry in fs::read_dir(&cps).map_err(ImageError::io("list", &cps))? {
            let entry = entry.map_err(ImageError::io("list", &cps))?;
            if let Some(n) = parse_checkpoint_name(&entry.file_name()) {
                out.push(n);
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    pub(crate) fn read_pointer(&self) -> Result<Pointer, ImageError> {
        let path = self.path.join(LATEST_NAME);
        let Some(bytes) = fsutil::read_small(&path, 32)? else {
            return Ok(Pointer::Missing);
        };
        let parsed = parse_latest(&bytes);
        Ok(match parsed {
            Some(n) => Pointer::Value(n),
            None => Pointer::Garbage(format!(
                "unparsable content {:?}",
                String::from_utf8_lossy(&bytes)
            )),
        })
    }

    /// The newest committed checkpoint.
    ///
    /// The commit point of a checkpoint is the rename of its directory; the
    /// `latest` file is updated right after. So the answer is the largest
    /// committed checkpoint, and the pointer is cross-checked: a pointer that
    /// lags (crash between rename and pointer update), names a missing
    /// checkpoint, or is unreadable is reported with a warning. If the pointer
    /// names a checkpoint but none exists, that is an error (the image lost
    /// its checkpoints). `Ok(None)` for a fresh image.
    pub fn latest(&self) -> Result<Option<u32>, ImageError> {
        let list = self.checkpoints()?;
        let max = list.last().copied();
        match (self.read_pointer()?, max) {
            (Pointer::Missing, max) => Ok(max),
            (Pointer::Value(p), Some(m)) => {
                if p != m {
                    warn!(
                        dir = %self.path.display(),
                        pointer = p,
                        newest = m,
                        "latest pointer is stale; using the newest committed checkpoint"
                    );
                }
                Ok(Some(m))
            }
            (Pointer::Value(p), None) => Err(ImageError::LatestMissing {
                dir: self.path.clone(),
                pointer: p,
            }),
            (Pointer::Garbage(reason), Some(m)) => {
                warn!(dir = %self.path.display(), %reason, "latest pointer is corrupt; using the newest committed checkpoint");
                Ok(Some(m))
            }
            (Pointer::Garbage(reason), None) => Err(ImageError::CorruptLatest {
                dir: self.path.clone(),
                reason,
            }),
        }
    }

    /// Loads checkpoint `n` (or the latest one) and validates its manifest.
    pub fn load(&self, n: Option<u32>) -> Result<Checkpoint, ImageError> {
        let number = match n {
            Some(n) => n,
            None => self.latest()?.ok_or_else(|| ImageError::NoCheckpoints {
                dir: self.path.clone(),
            })?,
        };
        let dir = self.checkpoints_path().join(checkpoint_dir_name(number));
        let missing = |_: PathBuf| ImageError::NoSuchCheckpoint {
            dir: self.path.clone(),
            number,
            available: self.checkpoints().unwrap_or_default(),
        };
        if number == 0 {
            return Err(missing(dir));
        }
        fsutil::require_real_dir(&self.checkpoints_path(), missing)?;
        fsutil::require_real_dir(&dir, missing)?;
        let mpath = dir.join(crate::store::MANIFEST_NAME);
        let manifest = read_manifest_file(&mpath, number)?;
        if manifest.checkpoint != number {
            return Err(ImageError::CorruptManifest {
                checkpoint: number,
                path: mpath,
                reason: format!(
                    "it describes checkpoint {} but is stored as checkpoint {number}",
                    manifest.checkpoint
                ),
            });
        }
        check_pack_names(&manifest, number)?;
        Ok(Checkpoint {
            number,
            manifest,
            dir,
            image: self.path.clone(),
        })
    }

    /// Takes the directory lock (non-blocking). It is held until the
    /// returned file is dropped.
    pub(crate) fn lock(&self) -> Result<Flock<File>, ImageError> {
        let path = self.path.join(LOCK_NAME);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(fsutil::FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::ELOOP) {
                    ImageError::Symlink { path: path.clone() }
                } else {
                    ImageError::Io {
                        action: "open lock file",
                        path: path.clone(),
                        source: e,
                    }
                }
            })?;
        try_flock(file, &path, &self.path)
    }

    /// Starts checkpoint number max(existing, pointer) + 1 in a temporary
    /// directory. The builder holds the directory lock until it is committed
    /// or dropped.
    pub fn begin_checkpoint(&self) -> Result<CheckpointBuilder, ImageError> {
        fsutil::require_real_dir(&self.path, |path| ImageError::NoSuchDir { path })?;
        let lock = self.lock()?;
        if self.read_marker()?.is_none() {
            let text = format!("{MARKER_FIRST_LINE}\nformat {FORMAT_VERSION}\n");
            fsutil::write_atomic(&self.path, MARKER_NAME, text.as_bytes())?;
        }
        let cps = self.checkpoints_path();
        match fsutil::kind(&cps)? {
            Kind::Missing => {
                fsutil::create_dir(&cps)?;
                fsutil::sync_dir(&self.path)?;
            }
            Kind::Dir => {}
            Kind::Symlink => return Err(ImageError::Symlink { path: cps }),
            Kind::File | Kind::Other => return Err(ImageError::NotADirectory { path: cps }),
        }
        let mut max = self.checkpoints()?.last().copied().unwrap_or(0);
        if let Pointer::Value(p) = self.read_pointer()? {
            max = max.max(p);
        }
        let number = max
            .checked_add(1)
            .ok_or_else(|| ImageError::TooManyCheckpoints {
                dir: self.path.clone(),
            })?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let temp_dir = cps.join(format!(
            "{TEMP_PREFIX}{}-{}-{nanos}",
            checkpoint_dir_name(number),
            std::process::id()
        ));
        debug_assert_eq!(
            temp_owner(&temp_dir.file_name().unwrap_or_default().to_string_lossy()),
            Some(std::process::id())
        );
        fsutil::create_dir(&temp_dir)?;
        debug!(dir = %temp_dir.display(), number, "began checkpoint");
        Ok(CheckpointBuilder {
            image: self.path.clone(),
            number,
            temp_dir,
            committed: false,
            pack_pids: std::collections::HashMap::new(),
            _lock: lock,
        })
    }

    /// Removes leftover temporary checkpoint directories (and temporary
    /// pointer files) of interrupted dumps. Takes the lock, so it fails with
    /// [`ImageError::Locked`] while a dump is running. Returns the number of
    /// temporary checkpoint directories removed.
    pub fn remove_stale_temps(&self) -> Result<usize, ImageError> {
        fsutil::require_real_dir(&self.path, |path| ImageError::NoSuchDir { path })?;
        let _lock = self.lock()?;
        self.remove_stale_temps_locked()
    }

    /// [`remove_stale_temps`](Self::remove_stale_temps) for a caller that
    /// already holds the lock.
    pub(crate) fn remove_stale_temps_locked(&self) -> Result<usize, ImageError> {
        for name in ["latest.tmp", "STASIS-IMAGE.tmp"] {
            fsutil::remove_if_exists(&self.path.join(name))?;
        }
        let cps = self.checkpoints_path();
        match fsutil::kind(&cps)? {
            Kind::Missing => return Ok(0),
            Kind::Dir => {}
            Kind::Symlink => return Err(ImageError::Symlink { path: cps }),
            Kind::File | Kind::Other => return Err(ImageError::NotADirectory { path: cps }),
        }
        let mut removed = 0;
        for entry in fs::read_dir(&cps).map_err(ImageError::io("list", &cps))? {
            let entry = entry.map_err(ImageError::io("list", &cps))?;
            let name = entry.file_name();
            if !name.to_string_lossy().starts_with(TEMP_PREFIX) {
                continue;
            }
            let path = entry.path();
            match fsutil::kind(&path)? {
                Kind::Dir => {
                    fs::remove_dir_all(&path).map_err(ImageError::io("remove directory", &path))?
                }
                Kind::Missing => continue,
                _ => {
                    fsutil::remove_if_exists(&path)?;
                }
            }
            debug!(path = %path.display(), "removed stale temporary checkpoint");
            removed += 1;
        }
        if removed > 0 {
            fsutil::sync_dir(&cps)?;
        }
        Ok(removed)
    }
}

/// Takes the image directory's lock without waiting (`flock` LOCK_EX |
/// LOCK_NB); the lock lasts as long as the returned value.
fn try_flock(mut file: File, path: &Path, dir: &Path) -> Result<Flock<File>, ImageError> {
    use nix::errno::Errno;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((f, Errno::EINTR)) => file = f,
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(ImageError::Locked {
                    dir: dir.to_path_buf(),
                })
            }
            Err((_, e)) => {
                return Err(ImageError::Io {
                    action: "lock",
                    path: path.to_path_buf(),
                    source: e.into(),
                })
            }
        }
    }
}

/// A committed checkpoint with its validated manifest.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub number: u32,
    pub manifest: Manifest,
    dir: PathBuf,
    /// The image directory the checkpoint belongs to.
    image: PathBuf,
}

impl Checkpoint {
    /// A checkpoint of image `image` whose files are in `dir` (which, for
    /// `gc`, may be a temporary directory not yet committed).
    pub(crate) fn at(number: u32, manifest: Manifest, dir: PathBuf, image: PathBuf) -> Checkpoint {
        Checkpoint {
            number,
            manifest,
            dir,
            image,
        }
    }

    /// The image directory this checkpoint belongs to (to load its
    /// ancestors with [`crate::load_chain`]).
    pub fn image(&self) -> ImageDir {
        ImageDir {
            path: self.image.clone(),
        }
    }

    /// The checkpoint's directory (`DIR/checkpoints/0000000N`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of a pack of this checkpoint, after checking that its name is a
    /// plain file name.
    pub fn pack_path(&self, r: &PackRef) -> Result<PathBuf, ImageError> {
        if !is_plain_name(&r.name) {
            return Err(ImageError::UnsafeName {
                checkpoint: Some(self.number),
                name: r.name.clone(),
            });
        }
        Ok(self.dir.join(&r.name))
    }

    /// Opens and validates a pack of this checkpoint (structure, size, page
    /// count and index checksum against `r`; page data is checked by
    /// [`PackReader::verify`] or [`PackReader::read_run`]).
    pub fn open_pack(&self, r: &PackRef) -> Result<PackReader, ImageError> {
        let path = self.pack_path(r)?;
        PackReader::open_inner(&path, Some(r), Some(self.number))
    }

    /// Opens the pack of process `p` (`Ok(None)` if it has none), checking
    /// also that the pack header names the same pid.
    pub fn open_process_pack(
        &self,
        p: &crate::manifest::ProcessImage,
    ) -> Result<Option<PackReader>, ImageError> {
        let Some(r) = &p.pack else {
            return Ok(None);
        };
        let reader = self.open_pack(r)?;
        if reader.pid() != p.pid {
            return Err(ImageError::CorruptPack {
                checkpoint: Some(self.number),
                path: reader.path().to_path_buf(),
                reason: format!(
                    "it holds the pages of pid {} but the manifest gives it to pid {}",
                    reader.pid(),
                    p.pid
                ),
            });
        }
        Ok(Some(reader))
    }
}

/// A checkpoint being written. Holds the directory lock and the temporary
/// directory; dropping it without [`commit`](Self::commit) removes the
/// temporary directory.
#[derive(Debug)]
pub struct CheckpointBuilder {
    image: PathBuf,
    number: u32,
    temp_dir: PathBuf,
    committed: bool,
    /// For a tree in a PID namespace of its own: each process's PID there,
    /// by its PID as the dumper sees it (the packs are named and marked
    /// with the former, as the manifest's processes are).
    pack_pids: std::collections::HashMap<i32, i32>,
    _lock: Flock<File>,
}

impl CheckpointBuilder {
    /// Number the checkpoint will have.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// The temporary directory the checkpoint is written into.
    pub fn temp_dir(&self) -> &Path {
        &self.temp_dir
    }

    /// Creates the page pack of process `pid` (`pages-<pid>.pack`; for a
    /// PID given to [`Self::set_pack_pids`], under its PID there).
    pub fn create_pack(&mut self, pid: i32) -> Result<PackWriter, ImageError> {
        let pid = self.pack_pids.get(&pid).copied().unwrap_or(pid);
        PackWriter::create(&self.temp_dir, pack_file_name(pid), pid)
    }

    /// The writer of the checkpoint's content pack (`content.pack`, made
    /// on its first extent with data).
    pub fn content_writer(&self) -> crate::ContentWriter {
        crate::ContentWriter::new(&self.temp_dir)
    }

    /// The tree is in a PID namespace of its own: `pids` maps the PIDs the
    /// dumper uses to the ones in that namespace, which the packs carry.
    pub fn set_pack_pids(&mut self, pids: std::collections::HashMap<i32, i32>) {
        self.pack_pids = pids;
    }

    /// Writes the manifest and commits the checkpoint atomically (see
    /// `docs/image-format.md`, "Commit protocol"). Every pack the manifest
    /// references must have been finished. Returns the checkpoint number.
    pub fn commit(mut self, manifest: &Manifest) -> Result<u32, ImageError> {
        self.prepare(manifest)?;
        self.commit_prepared()
    }

    /// The first phase of a two-phase commit (a cut across hosts): checks
    /// the packs, writes the manifest and syncs everything. The checkpoint
    /// is then complete on disk but invisible, under its temporary name,
    /// until [`commit_prepared`](Self::commit_prepared); dropped, or left
    /// by a process that died, it is removed like any temporary one, unless
    /// the decision to commit it was recorded (see
    /// [`ImageDir::prepared_temps`]).
    pub fn prepare(&mut self, manifest: &Manifest) -> Result<(), ImageError> {
        if manifest.checkpoint != self.number {
            return Err(ImageError::CheckpointMismatch {
                expected: self.number,
                found: manifest.checkpoint,
            });
        }
        check_packs(&self.temp_dir, manifest, self.number)?;
        write_manifest(&self.temp_dir, manifest)?;
        if let Some(c) = &manifest.cut {
            use std::io::Write;
            let path = self.temp_dir.join(CUT_NAME);
            let text = serde_json::to_vec(c).map_err(|e| ImageError::Encode {
                checkpoint: self.number,
                reason: e.to_string(),
            })?;
            fsutil::create_file(&path)?
                .write_all(&text)
                .map_err(ImageError::io("write", &path))?;
        }
        // fsync every file (packs were synced by finish(); this also covers
        // anything else the caller put in temp_dir()).
        sync_tree(&self.temp_dir)
    }

    /// The second phase: renames the prepared checkpoint into place and
    /// points `latest` at it.
    pub fn commit_prepared(mut self) -> Result<u32, ImageError> {
        place(&self.image, self.number, &self.temp_dir, || {
            self.committed = true
        })?;
        Ok(self.number)
    }
}

/// Writes `dir/manifest.bin` (0600, exclusive) and fsyncs it.
pub(crate) fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), ImageError> {
    use std::io::Write;
    let bytes = encode_manifest(manifest)?;
    let mpath = dir.join(MANIFEST_NAME);
    let mut f = fsutil::create_file(&mpath)?;
    fsutil::write_fault(&mpath)?;
    f.write_all(&bytes)
        .map_err(ImageError::io("write", &mpath))?;
    f.sync_all().map_err(ImageError::io("fsync", &mpath))
}

/// fsyncs every entry of the (flat) directory `dir`, then `dir` itself.
/// A symlink inside is an error.
pub(crate) fn sync_tree(dir: &Path) -> Result<(), ImageError> {
    for entry in fs::read_dir(dir).map_err(ImageError::io("list", dir))? {
        let entry = entry.map_err(ImageError::io("list", dir))?;
        let path = entry.path();
        match fsutil::kind(&path)? {
            Kind::File => fsutil::sync_file(&path)?,
            Kind::Symlink => return Err(ImageError::Symlink { path }),
            Kind::Dir => fsutil::sync_dir(&path)?,
            Kind::Missing | Kind::Other => {}
        }
    }
    fsutil::sync_dir(dir)
}

impl Drop for CheckpointBuilder {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        if let Err(e) = fs::remove_dir_all(&self.temp_dir) {
            if e.kind() != io::ErrorKind::NotFound {
                warn!(
                    dir = %self.temp_dir.display(),
                    error = %e,
                    "cannot remove the temporary directory of an abandoned checkpoint; `remove_stale_temps` will"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_names() {
        assert_eq!(checkpoint_dir_name(1), "00000001");
        assert_eq!(parse_checkpoint_name(OsStr::new("00000001")), Some(1));
        assert_eq!(
            parse_checkpoint_name(OsStr::new("12345678")),
            Some(12_345_678)
        );
        assert_eq!(
            parse_checkpoint_name(OsStr::new("123456789")),
            Some(123_456_789)
        );
        assert_eq!(
            parse_checkpoint_name(OsStr::new("4294967295")),
            Some(u32::MAX)
        );
        for bad in [
            "00000000",
            "1",
            "0000001",
            "000000001",
            "4294967296",
            "0000000a",
            ".tmp-00000001",
            "+0000001",
            " 0000001",
        ] {
            assert_eq!(parse_checkpoint_name(OsStr::new(bad)), None, "{bad}");
        }
        assert_eq!(pack_file_name(42), "pages-42.pack");
    }

    #[test]
    fn plain_names() {
        assert!(is_plain_name("pages-1.pack"));
        assert!(is_plain_name("..."));
        assert!(is_plain_name(&"x".repeat(255)));
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "/abs",
            "a\0",
            &"x".repeat(256),
        ] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
    }
}
