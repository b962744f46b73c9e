//! POSIX shared memory objects (`shm_open`: files in `/dev/shm`) that a
//! dump is asked to keep (`dump --shm-file GLOB`).
//!
//! A file in `/dev/shm` is the file system's, like any other: a mapping
//! of one is saved by name, and an object no process maps or holds open
//! is not seen at all. But a program may name such objects in its memory
//! and open them later (PostgreSQL's dynamic shared memory segments,
//! `/dev/shm/PostgreSQL.N`), and, left running after a `--leave-running`
//! dump, free one that the checkpoint still names. The objects whose
//! names match one of the patterns are then saved whole while the tree is
//! frozen (their data extents, holes left out, into the checkpoint's
//! content pack: see [`crate::content`]), and put back at restore before any process is built. Each is
//! written under a temporary name with its mode and owner, then moved
//! under its own, so a reader never sees it half-written:
//! - one the tree maps or holds open at the dump is the tree's own: it
//!   replaces whatever holds its name (PostgreSQL's control segment,
//!   whose list of segments the server changed as it ran on);
//! - one the tree neither maps nor holds may be another program's (the
//!   pattern matches names, not owners): it is put back only if its name
//!   is free, and one that exists is left as it is (its content is then
//!   the file system's, as for any file).

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use stasis_image::manifest::ShmFile;
use stasis_image::ContentSource;
use stasis_kernel::fdops;

use crate::content::PendingContent;
use crate::error::io_step;
use crate::{RestoreError, SaveError};

/// Where POSIX shared memory objects live.
pub const SHM_DIR: &str = "/dev/shm";

/// Reads every regular file of [`SHM_DIR`] whose name matches one of
/// `patterns` (shell patterns, `fnmatch`), in name order; `held`: the
/// paths the tree maps or holds open. No pattern, no read at all. Each
/// object comes with its data, to be written into the content pack (its
/// `extents` are filled then).
pub fn save(
    patterns: &[String],
    held: &std::collections::HashSet<String>,
) -> Result<Vec<(ShmFile, PendingContent)>, SaveError> {
    save_from(Path::new(SHM_DIR), patterns, held)
}

fn save_from(
    dir: &Path,
    patterns: &[String],
    held: &std::collections::HashSet<String>,
) -> Result<Vec<(ShmFile, PendingContent)>, SaveError> {
    if patterns.is_empty() {
        return Ok(Vec::new());
    }
    let err = |path: &Path| {
        let path = path.display().to_string();
        move |source| SaveError::ShmFile { path, source }
    };
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(err(dir))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| patterns.iter().any(|p| fdops::fnmatch(p, n)))
        .collect();
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let path = dir.join(&name);
        // O_NOFOLLOW: a link is not an object; O_NOATIME: reading it
        // changes nothing a program sees.
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NOATIME | libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(f) => f,
            // Removed since it was listed, or a link / a FIFO: not one.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ELOOP | libc::ENXIO)
                ) =>
            {
                continue
            }
            Err(e) => return Err(err(&path)(e)),
        };
        let meta = f.metadata().map_err(err(&path))?;
        if !meta.file_type().is_file() {
            continue;
        }
        let size = meta.size();
        let ranges = fdops::data_extents(&f, 0, size).map_err(err(&path))?;
        let file = ShmFile {
            held: held.contains(&path.display().to_string()),
            name,
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
            size,
            extents: Vec::new(),
        };
        out.push((
            file,
            PendingContent {
                file: f,
                path,
                ranges,
            },
        ));
    }
    Ok(out)
}

/// Puts back in [`SHM_DIR`] every saved object the tree held, and every
/// other one that is missing there. Returns the paths written.
pub fn restore(
    files: &[ShmFile],
    src: Option<&ContentSource>,
) -> Result<Vec<PathBuf>, RestoreError> {
    restore_into(Path::new(SHM_DIR), files, src)
}

fn restore_into(
    dir: &Path,
    files: &[ShmFile],
    src: Option<&ContentSource>,
) -> Result<Vec<PathBuf>, RestoreError> {
    let mut done = Vec::with_capacity(files.len());
    for f in files {
        // An image names objects of the directory only (a damaged or
        // crafted one must not write anywhere else).
        if f.name.is_empty() || f.name == "." || f.name == ".." || f.name.contains(['/', '\0']) {
            return Err(RestoreError::Inconsistent(format!(
                "a POSIX shared memory object is named {:?}, not a name in {}",
                f.name,
                dir.display()
            )));
        }
        let path = dir.join(&f.name);
        let tmp = dir.join(format!(".stasis-{}-{}", std::process::id(), f.name));
        let step = |what: &str, op: &str| {
            io_step(
                format!("{what} {} (saved with --shm-file)", path.display()),
                op,
            )
        };
        let written = write_object(&tmp, f, src, |e| step("writing", "write")(e));
        // The tree's own replaces (rename); another only takes a free
        // name (link(2) makes it only then, atomically).
        let linked = written.and_then(|()| {
            if f.held {
                return std::fs::rename(&tmp, &path)
                    .map(|()| true)
                    .map_err(step("replacing", "rename"));
            }
            match std::fs::hard_link(&tmp, &path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(step("making", "link")(e)),
            }
        });
        let _ = std::fs::remove_file(&tmp);
        if linked? {
            done.push(path);
        } else {
            tracing::debug!(path = %path.display(), "POSIX shared memory object exists: left as it is");
        }
    }
    Ok(done)
}

/// Writes `f`'s content (from `src`), size, owner and mode into a new
/// file at `tmp`.
fn write_object(
    tmp: &Path,
    f: &ShmFile,
    src: Option<&ContentSource>,
    err: impl Fn(std::io::Error) -> RestoreError,
) -> Result<(), RestoreError> {
    use std::os::unix::fs::FileExt;
    let (size, extents) = f
        .content()
        .map_err(|e| RestoreError::Inconsistent(e.to_string()))?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(tmp)
        .map_err(&err)?;
    crate::content::put_back(src, &extents, |off, data| {
        file.write_all_at(data, off).map_err(&err)
    })?;
    file.set_len(size).map_err(&err)?;
    std::os::unix::fs::fchown(file.as_fd(), Some(f.uid), Some(f.gid)).map_err(&err)?;
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(f.mode))
        .map_err(&err)?;
    (&file).flush().map_err(&err)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use stasis_image::manifest::Extent;

    use super::*;

    /// Saves the matching objects of `dir` as a dump does: their data
    /// into a content pack (in a temporary image), read back from it.
    fn save_packed(
        dir: &Path,
        patterns: &[String],
        held: &HashSet<String>,
    ) -> (Vec<ShmFile>, ContentSource) {
        let img = tempfile::tempdir().unwrap();
        let image = stasis_image::ImageDir::create_or_open(img.path()).unwrap();
        let ck = image.begin_checkpoint().unwrap();
        let mut w = ck.content_writer();
        let mut out = Vec::new();
        for (mut f, c) in save_from(dir, patterns, held).unwrap() {
            f.extents = c.write(&mut w).unwrap();
            out.push(f);
        }
        let src = match w.finish().unwrap() {
            Some(r) => ContentSource::open(&ck.temp_dir().join(&r.name), &r).unwrap(),
            None => ContentSource::inline_only(),
        };
        (out, src)
    }

    // Only matching regular files are saved, whole and with their holes;
    // a missing one comes back byte for byte, with its mode; one that
    // exists is left as it is.
    #[test]
    fn objects_round_trip_with_holes_mode_and_names() {
        use std::os::unix::fs::{FileExt, PermissionsExt};
        let d = tempfile::tempdir().unwrap();
        let a = std::fs::File::create(d.path().join("PostgreSQL.1")).unwrap();
        a.write_all_at(b"head", 0).unwrap();
        a.write_all_at(b"tail", 1 << 20).unwrap();
        std::fs::set_permissions(
            d.path().join("PostgreSQL.1"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        std::fs::write(d.path().join("other"), b"not saved").unwrap();
        std::os::unix::fs::symlink("PostgreSQL.1", d.path().join("PostgreSQL.link")).unwrap();
        let (saved, src) = save_packed(d.path(), &["PostgreSQL.*".to_string()], &HashSet::new());
        assert_eq!(saved.len(), 1, "{saved:?}");
        assert!(!saved[0].held);
        let s = &saved[0];
        assert_eq!(
            (s.name.as_str(), s.size, s.mode),
            ("PostgreSQL.1", (1 << 20) + 4, 0o640)
        );
        assert!(
            s.extents.len() >= 2,
            "holes left out: {:?}",
            s.extents.len()
        );
        let data: u64 = s.extents.iter().map(Extent::bytes).sum();
        assert!(data < 1 << 20, "{data} bytes saved of a sparse file");

        let out = tempfile::tempdir().unwrap();
        std::fs::write(out.path().join("PostgreSQL.1"), b"made since").unwrap();
        assert!(restore_into(out.path(), &saved, Some(&src))
            .unwrap()
            .is_empty());
        let kept = std::fs::read(out.path().join("PostgreSQL.1")).unwrap();
        assert_eq!(kept, b"made since");
        std::fs::remove_file(out.path().join("PostgreSQL.1")).unwrap();
        let done = restore_into(out.path(), &saved, Some(&src)).unwrap();
        assert_eq!(done, [out.path().join("PostgreSQL.1")]);
        let back = std::fs::read(out.path().join("PostgreSQL.1")).unwrap();
        let orig = std::fs::read(d.path().join("PostgreSQL.1")).unwrap();
        assert!(back == orig, "content differs");
        let mode = std::fs::metadata(out.path().join("PostgreSQL.1"))
            .unwrap()
            .mode()
            & 0o7777;
        assert_eq!(mode, 0o640);
        // No temporary left behind.
        assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 1);

        // Held by the tree: it replaces what holds its name.
        let held = HashSet::from([d.path().join("PostgreSQL.1").display().to_string()]);
        let (saved, src) = save_packed(d.path(), &["PostgreSQL.*".to_string()], &held);
        assert!(saved[0].held);
        std::fs::write(out.path().join("PostgreSQL.1"), b"changed since").unwrap();
        let done = restore_into(out.path(), &saved, Some(&src)).unwrap();
        assert_eq!(done, [out.path().join("PostgreSQL.1")]);
        assert!(std::fs::read(out.path().join("PostgreSQL.1")).unwrap() == orig);
    }

    #[test]
    fn no_pattern_reads_nothing() {
        let none = HashSet::new();
        assert!(save_from(Path::new("/nonexistent"), &[], &none)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_name_leaving_the_directory_is_refused() {
        let out = tempfile::tempdir().unwrap();
        for name in ["../escape", "..", "", "a/b"] {
            let f = ShmFile {
                held: true,
                name: name.to_string(),
                mode: 0o600,
                uid: 0,
                gid: 0,
                size: 0,
                extents: vec![],
            };
            let e = restore_into(out.path(), &[f], None).unwrap_err();
            assert!(e.to_string().contains("not a name in"), "{name}: {e}");
        }
        assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
    }
}
