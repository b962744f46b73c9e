//! Write-protection kept from one dump to the next.

use super::Cow;
use crate::incremental::FullDump;

/// Write-protection kept between the dumps of one job (`stasis run
/// --concurrent`): between checkpoints the handlers let each write through
/// and the page loses its protection, so the pages unprotected at the next
/// freeze are exactly those written since the last one. That freeze reads
/// them in the memory plan's walk (as every write-protected dump does),
/// copies only them (concurrent incremental, TIC-CKPT-CI), protects only
/// them again (the others still are), and tracking goes on from that
/// instant. Any failure drops the protection; the next dump is then full.
#[derive(Default)]
pub struct CowTracking {
    pub(crate) cow: Option<Cow>,
    /// The checkpoint right after whose freeze tracking started.
    pub(crate) armed_at: Option<u32>,
    /// (pid, start time) of the processes tracked since then.
    pub(crate) procs: Vec<(i32, u64)>,
}

/// The name of this tracking in reports and manifests.
pub const TRACK_NAME: &str = "uffd-wp";

impl CowTracking {
    pub(crate) fn new_cow(cap: u64) -> Cow {
        Cow::with_tracking(cap, true)
    }

    /// The parent of an incremental dump of the tree of `root`: the
    /// checkpoint after whose freeze tracking started, if it is the latest.
    pub(crate) fn base(
        &self,
        store: &stasis_image::ImageDir,
        root: i32,
        root_start: u64,
    ) -> std::result::Result<crate::incremental::Base, FullDump> {
        let latest = match store.latest() {
            Ok(Some(n)) => n,
            Ok(None) => return Err(FullDump::Untracked),
            Err(e) => return Err(e.to_string().into()),
        };
        let Some(armed_at) = self.armed_at.filter(|_| self.cow.is_some()) else {
            return Err(FullDump::Because(
                "write-protection tracking starts with this dump".into(),
            ));
        };
        if armed_at != latest {
            return Err(FullDump::Because(format!(
                "tracking started after checkpoint {armed_at} but the latest is {latest}"
            )));
        }
        if !self.procs.contains(&(root, root_start)) {
            return Err(FullDump::Because(format!("process {root} was not tracked")));
        }
        match stasis_image::chain::load_chain(store, Some(latest)) {
            Ok(mut c) if !c.is_empty() => Ok(crate::incremental::Base::new(
                c.swap_remove(0),
                stasis_track::state::TrackState {
                    backend: stasis_track::Backend::Uffd,
                    armed_at,
                    root_pid: root,
                    procs: self.procs.clone(),
                },
            )),
            Ok(_) => Err(FullDump::Because(
                "the latest checkpoint cannot be loaded".into(),
            )),
            Err(e) => Err(FullDump::Because(format!(
                "the latest checkpoint cannot be used as a parent: {e}"
            ))),
        }
    }
}
