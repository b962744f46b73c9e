//! Stop-the-world: the pages are planned and copied while the tree is
//! frozen, straight from the processes.

use super::{CopyCx, CopyStrategy, PlanCx, Planned};
use crate::copy::Pending;
use crate::{cow, incremental, memory, ms, proc, Result};

/// Copies while the tree is frozen.
pub struct StopTheWorld;

impl CopyStrategy for StopTheWorld {
    fn method(&self) -> Option<&'static str> {
        None
    }

    fn plan(&mut self, cx: PlanCx<'_>) -> Result<Planned> {
        plan_in_place(cx, None)
    }

    fn copy(&mut self, p: &mut Pending, cx: CopyCx<'_, '_>) -> Result<()> {
        p.copy_pages(cx)
    }
}

/// Plans the pages to copy from the process itself (stop-the-world, and
/// write-protection `cow`): the pages with data (and, under protection,
/// which of them lost it), and of an incremental dump those the tracker
/// (or the protection kept since the parent) reports written.
pub fn plan_in_place(cx: PlanCx<'_>, cow: Option<&cow::Cow>) -> Result<Planned> {
    let tracked = cx.tracked();
    let PlanCx {
        fp,
        image,
        maps,
        frozen_at,
        base,
        parent_proc,
        mut tracker,
        note,
        seen_shm,
    } = cx;
    let pid = fp.pid;
    // VmFlags (grows down, advice, locks) come from smaps, whose page
    // walk costs milliseconds per GiB: an incremental dump reuses the
    // parent's when the process has exactly the same areas.
    // A write-protected concurrent dump read them before the freeze.
    let reuse = parent_proc
        .and_then(|pp| incremental::same_layout(pp, maps))
        .or_else(|| cow.and_then(|c| c.vmflags(pid, maps)));
    let vmflags = match reuse {
        Some(g) => g,
        None => proc::parse_smaps_vmflags(&proc::read(pid, "smaps")?),
    };
    let scan = if cow.is_some() {
        memory::Scan::DataAndProtection
    } else {
        memory::Scan::Data
    };
    let mut plan = memory::plan_with(pid, maps, &vmflags, seen_shm, scan)?;
    tracing::debug!(pid, ms = ms(frozen_at), "pages with data found");
    let areas = incremental::areas(&plan.vmas);
    let mut selection = None;
    if let (Some(b), Some(t), Some(pp)) = (base, tracker.as_mut(), parent_proc) {
        if tracked {
            let parent_data = b.parent_data(pp)?;
            let data = memory::spans(&plan.ranges);
            let collected = incremental::collect(&mut **t, image.pid, &areas)?;
            tracing::debug!(pid, ms = ms(frozen_at), "dirty pages found");
            if incremental::tracking_lost(t.backend(), &collected) {
                note.get_or_insert_with(|| incremental::lost_note(image.pid));
            } else {
                let sel = incremental::select_collected(&collected, &data, &parent_data);
                plan.ranges = memory::lengths(&sel.read);
                image.data_ranges = Some(data);
                selection = Some(sel);
            }
        }
    } else if let (Some(b), Some(_), Some(pp)) = (base, cow, parent_proc) {
        // Write-protection kept since the parent: the pages with
        // data that lost their protection are those written since.
        if tracked {
            let parent_data = b.parent_data(pp)?;
            let data = memory::spans(&plan.ranges);
            let collected = incremental::unprotected_as_dirty(&areas, &plan.unprotected);
            let sel = incremental::select_collected(&collected, &data, &parent_data);
            plan.ranges = memory::lengths(&sel.read);
            image.data_ranges = Some(data);
            selection = Some(sel);
        }
    }
    Ok(Planned {
        plan,
        no_fork: Vec::new(),
        areas,
        selection,
        deferred: None,
    })
}
