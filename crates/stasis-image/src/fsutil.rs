//! Careful file-system helpers: no symlink following, private modes, fsync.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::ImageError;

/// Mode of every file stasis creates in an image.
pub(crate) const FILE_MODE: u32 = 0o600;
/// Mode of every directory stasis creates in an image.
pub(crate) const DIR_MODE: u32 = 0o700;
/// Longest file name accepted from a manifest (NAME_MAX).
pub(crate) const MAX_NAME_LEN: usize = 255;

/// Is `name` a plain file name that can safely be joined to a directory?
///
/// Rejects empty names, `.`, `..`, names containing `/` or NUL, and names
/// longer than 255 bytes (`NAME_MAX`).
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\0')
}

fn map_open_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ImageError {
    let path = path.to_path_buf();
    move |source| {
        if source.raw_os_error() == Some(libc::ELOOP) {
            ImageError::Symlink { path }
        } else {
            ImageError::Io {
                action,
                path,
                source,
            }
        }
    }
}

/// Opens an existing regular file for reading without following a symlink
/// (and without blocking on a FIFO). Errors with `Symlink` or `NotAFile`.
pub(crate) fn open_read(path: &Path) -> Result<File, ImageError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(map_open_err("open", path))?;
    let meta = file.metadata().map_err(ImageError::io("stat", path))?;
    if !meta.is_file() {
        return Err(ImageError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    Ok(file)
}

/// Like [`open_read`] but `Ok(None)` when the file does not exist.
pub(crate) fn open_read_opt(path: &Path) -> Result<Option<File>, ImageError> {
    match open_read(path) {
        Ok(f) => Ok(Some(f)),
        Err(ImageError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads a small file completely, refusing files larger than `limit` bytes.
/// Returns `Ok(None)` when the file does not exist.
pub(crate) fn read_small(path: &Path, limit: u64) -> Result<Option<Vec<u8>>, ImageError> {
    let Some(file) = open_read_opt(path)? else {
        return Ok(None);
    };
    let mut buf = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(ImageError::io("read", path))?;
    Ok(Some(buf))
}

/// Creates a new file (it must not exist) with mode 0600, never following a
/// symlink, open for writing.
pub(crate) fn create_file(path: &Path) -> Result<File, ImageError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(map_open_err("create", path))
}

/// Creates one directory (its parent must exist) with mode 0700.
pub(crate) fn create_dir(path: &Path) -> Result<(), ImageError> {
    DirBuilder::new()
        .mode(DIR_MODE)
        .create(path)
        .map_err(ImageError::io("create directory", path))
}

/// Creates a directory and its missing parents with mode 0700.
pub(crate) fn create_dir_all(path: &Path) -> Result<(), ImageError> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
        .map_err(ImageError::io("create directory", path))
}

/// Opens a directory (never a symlink to one) for `*at` calls and fsync.
pub(crate) fn open_dir(path: &Path) -> Result<File, ImageError> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
        .map_err(map_open_err("open directory", path))
}

/// fsyncs a directory (so that entries created or renamed in it are durable).
pub(crate) fn sync_dir(path: &Path) -> Result<(), ImageError> {
    let dir = open_dir(path)?;
    dir.sync_all()
        .map_err(ImageError::io("fsync directory", path))
}

/// fsyncs an existing regular file (refusing symlinks).
pub(crate) fn sync_file(path: &Path) -> Result<(), ImageError> {
    let file = open_read(path)?;
    file.sync_all().map_err(ImageError::io("fsync", path))
}

/// What is at a path, without following a final symlink.
pub(crate) enum Kind {
    Missing,
    Dir,
    File,
    Symlink,
    Other,
}

pub(crate) fn kind(path: &Path) -> Result<Kind, ImageError> {
    match fs::symlink_metadata(path) {
        Ok(m) => {
            let t = m.file_type();
            Ok(if t.is_symlink() {
                Kind::Symlink
            } else if t.is_dir() {
                Kind::Dir
            } else if t.is_file() {
                Kind::File
            } else {
                Kind::Other
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Kind::Missing),
        Err(e) => Err(ImageError::Io {
            action: "stat",
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

/// Checks that `path` is a real directory (not a symlink). `missing` builds
/// the error to return when it does not exist.
pub(crate) fn require_real_dir(
    path: &Path,
    missing: impl FnOnce(PathBuf) -> ImageError,
) -> Result<(), ImageError> {
    match kind(path)? {
        Kind::Dir => Ok(()),
        Kind::Missing => Err(missing(path.to_path_buf())),
        Kind::Symlink => Err(ImageError::Symlink {
            path: path.to_path_buf(),
        }),
        Kind::File | Kind::Other => Err(ImageError::NotADirectory {
            path: path.to_path_buf(),
        }),
    }
}

/// The test hook of fault injection (`STASIS_FAULT=image-write:N`): an
/// error as if writing `path` had failed.
pub(crate) fn write_fault(path: &Path) -> Result<(), ImageError> {
    stasis_sys::fault::check(stasis_sys::fault::Point::ImageWrite)
        .map_err(ImageError::io("write", path))
}

/// Writes `contents` to `dir/name` atomically: `name.tmp` is written, fsynced
/// and renamed over `name`, then `dir` is fsynced. Caller holds the lock.
/// Image writes count for fault injection (`image-write:N`).
pub(crate) fn write_atomic(dir: &Path, name: &str, contents: &[u8]) -> Result<(), ImageError> {
    write_atomic_in(dir, name, contents, true)
}

/// THE atomic file write of Stasis, for files outside an image too (dirty
/// tracking state, mirrors): `path.tmp` (mode 0600, never through a
/// symlink) is written, fsynced and renamed over `path`, then the directory
/// is fsynced. A reader sees the old contents or the new, never a part.
pub fn write_atomic_file(path: &Path, contents: &[u8]) -> Result<(), ImageError> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(ImageError::io("write", path)(io::Error::from(
            io::ErrorKind::InvalidInput,
        )));
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    write_atomic_in(dir, &name.to_string_lossy(), contents, false)
}

fn write_atomic_in(
    dir: &Path,
    name: &str,
    contents: &[u8],
    fault_point: bool,
) -> Result<(), ImageError> {
    use std::io::Write;
    let tmp = dir.join(format!("{name}.tmp"));
    let target = dir.join(name);
    remove_if_exists(&tmp)?;
    let mut f = create_file(&tmp)?;
    if fault_point {
        write_fault(&tmp)?;
    }
    f.write_all(contents)
        .map_err(ImageError::io("write", &tmp))?;
    f.sync_all().map_err(ImageError::io("fsync", &tmp))?;
    drop(f);
    fs::rename(&tmp, &target).map_err(ImageError::io("rename into place", &target))?;
    sync_dir(dir)
}

/// Removes a file or symlink if present (never follows the link).
pub(crate) fn remove_if_exists(path: &Path) -> Result<bool, ImageError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(ImageError::Io {
            action: "remove",
            path: path.to_path_buf(),
            source: e,
        }),
    }
}
