//! What the tracker left armed, kept next to the image so that the next
//! `stasis dump` knows whether it can be incremental.
//!
//! `DIR/track/state.json` says which backend armed which processes (pid
//! and start time) right after which checkpoint. The next dump is
//! incremental only against that very checkpoint: if another checkpoint was
//! taken since, or the file is missing, it is a full dump with a note.
//! Files are written under a temporary name, synced and renamed; they are
//! created 0600 in a 0700 directory and never through a symbolic link.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Backend, Result, TrackError};

/// Name of the tracking directory inside an image directory.
pub const TRACK_DIR: &str = "track";
const STATE_FILE: &str = "state.json";

/// What is armed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackState {
    pub backend: Backend,
    /// The checkpoint right after which tracking was armed.
    pub armed_at: u32,
    /// Root of the tree (pid given to dump).
    pub root_pid: i32,
    /// Armed processes: (pid, start time).
    pub procs: Vec<(i32, u64)>,
}

/// The tracking directory of an image directory.
pub fn track_dir(image_dir: &Path) -> PathBuf {
    image_dir.join(TRACK_DIR)
}

/// Reads a file without following a symbolic link at its last component.
pub fn read_nofollow(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

/// Creates `dir` (mode 0700) if missing; refuses a symbolic link.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    let io = |what: &'static str| {
        move |source| TrackError::Io {
            what,
            path: dir.display().to_string(),
            source,
        }
    };
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(TrackError::State {
            path: dir.display().to_string(),
            what: "it is not a directory (a symbolic link?)".into(),
        }),
        Err(_) => std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .map_err(io("creating")),
    }
}

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename):
/// [`stasis_image::write_atomic_file`].
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(stasis_image::write_atomic_file(path, bytes)?)
}

/// Decodes the contents of a state file.
pub fn decode(bytes: &[u8]) -> std::result::Result<TrackState, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// Encodes a state file (what [`decode`] reads).
pub fn encode(s: &TrackState) -> std::result::Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec_pretty(s)
}

/// Loads the tracking state of an image directory (`None`: nothing armed).
pub fn load(image_dir: &Path) -> Result<Option<TrackState>> {
    let path = track_dir(image_dir).join(STATE_FILE);
    match read_nofollow(&path) {
        Ok(b) => decode(&b).map(Some).map_err(|e| TrackError::State {
            path: path.display().to_string(),
            what: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TrackError::Io {
            what: "reading",
            path: path.display().to_string(),
            source,
        }),
    }
}

/// Saves the tracking state.
pub fn save(image_dir: &Path, s: &TrackState) -> Result<()> {
    let dir = track_dir(image_dir);
    create_private_dir(&dir)?;
    let bytes = encode(s).map_err(|e| TrackError::State {
        path: dir.display().to_string(),
        what: e.to_string(),
    })?;
    write_atomic(&dir.join(STATE_FILE), &bytes)
}

/// Forgets what was armed (the next dump is full).
pub fn clear(image_dir: &Path) -> Result<()> {
    let path = track_dir(image_dir).join(STATE_FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(TrackError::Io {
            what: "removing",
            path: path.display().to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_clear() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(load(d.path()).unwrap(), None);
        let s = TrackState {
            backend: Backend::SoftDirty,
            armed_at: 4,
            root_pid: 10,
            procs: vec![(10, 123), (11, 456)],
        };
        save(d.path(), &s).unwrap();
        assert_eq!(load(d.path()).unwrap(), Some(s));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(track_dir(d.path()).join(STATE_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        clear(d.path()).unwrap();
        assert_eq!(load(d.path()).unwrap(), None);
    }

    #[test]
    fn refuses_a_symlinked_state_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(track_dir(d.path())).unwrap();
        std::fs::write(d.path().join("elsewhere"), b"{}").unwrap();
        std::os::unix::fs::symlink(
            d.path().join("elsewhere"),
            track_dir(d.path()).join(STATE_FILE),
        )
        .unwrap();
        assert!(load(d.path()).is_err());
    }
}
