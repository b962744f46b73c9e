//! The dirty-page trackers an agent keeps from one round of a job to the
//! next ([`crate::protocol::DumpOrder::track`]): one per tree, by job and
//! root PID, lent to each of its dumps ([`stasis_capture::dump_tracked`]),
//! which arms it again at the release. A tree's checkpoint is incremental
//! when its tracker was armed right after its previous checkpoint (else
//! full, with a note saying why). A restore of the job, or a dump that
//! kills it, drops its trackers: the next chain starts full.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use stasis_capture::{DumpOptions, DumpReport};
use stasis_image::ImageDir;
use stasis_track::DirtyTracker;

use crate::ClusterError;

type Tracker = Box<dyn DirtyTracker + Send>;

fn all() -> MutexGuard<'static, HashMap<(String, i32), Tracker>> {
    static TRACKERS: OnceLock<Mutex<HashMap<(String, i32), Tracker>>> = OnceLock::new();
    TRACKERS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Dumps `opts.pid` (a tree of `job`) into `store` with its tracker (a new
/// one, starting a new chain, the first time).
pub(crate) fn dump_tracked(
    job: &str,
    store: &ImageDir,
    opts: &DumpOptions,
) -> Result<DumpReport, ClusterError> {
    let key = (job.to_string(), opts.pid);
    let taken = all().remove(&key);
    let mut tracker = match taken {
        Some(t) => t,
        None => {
            let backend = stasis_track::choose_for(None, opts.pid).map_err(|e| {
                ClusterError::Refused(format!(
                    "tree {}: no dirty tracking for incremental rounds: {e}",
                    opts.pid
                ))
            })?;
            // A new chain: no state of an earlier agent claims a base.
            let _ = stasis_track::state::clear(store.path());
            stasis_track::tracker(backend, &stasis_track::state::track_dir(store.path()))
        }
    };
    let r = stasis_capture::dump_tracked(store, opts, Some(&mut *tracker));
    // Kept whatever happened: the next dump finds out whether it is armed.
    all().insert(key, tracker);
    Ok(r?)
}

/// Forgets the trackers of every tree of `job`.
pub(crate) fn drop_job(job: &str) {
    all().retain(|(j, _), _| j != job);
}
