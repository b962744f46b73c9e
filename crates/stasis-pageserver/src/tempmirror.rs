//! A restore's temporary local copy of a remote image (`restore --from`).
//!
//! The copy lives in `stasis-from-PID-*` under the temporary directory and
//! is removed when dropped. A restorer killed before it could remove its
//! copy leaves it behind: the next one removes every copy whose PID no
//! longer runs.

use std::path::{Path, PathBuf};

use crate::{mirror, MirrorData, PageServerError};

/// Prefix of the temporary copies (followed by the restorer's PID and `-`).
pub const TEMP_MIRROR_PREFIX: &str = "stasis-from-";

/// A local copy of a remote image, removed when dropped.
pub struct TempMirror {
    dir: tempfile::TempDir,
    /// The checkpoint copied (the server's latest if none was asked for).
    pub checkpoint: u32,
}

impl TempMirror {
    /// The image directory of the copy.
    pub fn image(&self) -> PathBuf {
        self.dir.path().join("image")
    }
}

/// Copies checkpoint `n` (default: the server's latest) and its ancestors
/// from the page server at `addr` into a fresh temporary directory, after
/// removing the copies of restorers that died. `progress` gets (bytes done,
/// bytes in all).
pub fn mirror_to_temp(
    addr: &str,
    token: &[u8],
    n: Option<u32>,
    data: MirrorData,
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<TempMirror, PageServerError> {
    remove_stale_mirrors(&std::env::temp_dir());
    let dir = tempfile::Builder::new()
        .prefix(&format!("{TEMP_MIRROR_PREFIX}{}-", std::process::id()))
        .tempdir()
        .map_err(|error| PageServerError::Local {
            action: "create a temporary directory for",
            path: std::env::temp_dir(),
            error,
        })?;
    let m = mirror(addr, token, n, &dir.path().join("image"), data, progress)?;
    Ok(TempMirror {
        dir,
        checkpoint: m.checkpoint,
    })
}

/// Removes the copies under `tmp` whose restorer (the PID in their name)
/// no longer runs; returns how many.
pub fn remove_stale_mirrors(tmp: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(tmp) else {
        return 0;
    };
    let mut removed = 0;
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(TEMP_MIRROR_PREFIX))
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() && std::fs::remove_dir_all(e.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_copies_of_dead_restorers_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let me = std::process::id();
        // A PID that runs no process: past the largest PID possible.
        let dead = 1u32 << 23;
        for n in [
            format!("{TEMP_MIRROR_PREFIX}{me}-a"),
            format!("{TEMP_MIRROR_PREFIX}{dead}-b"),
            format!("{TEMP_MIRROR_PREFIX}x-c"),
            "other".to_string(),
        ] {
            std::fs::create_dir(tmp.path().join(n)).unwrap();
        }
        assert_eq!(remove_stale_mirrors(tmp.path()), 1);
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec![
                "other".to_string(),
                format!("{TEMP_MIRROR_PREFIX}{me}-a"),
                format!("{TEMP_MIRROR_PREFIX}x-c")
            ]
        );
    }
}
