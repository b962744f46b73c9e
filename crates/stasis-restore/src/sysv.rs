//! System V shared memory segments: saved and rebuilt by
//! [`stasis_objects::sysv`]; this module adapts the errors.

use stasis_image::manifest::SysvShm;

use crate::RestoreError;

/// Makes every segment exist at its id with the image's content.
pub fn prepare(
    segs: &[SysvShm],
    content: &stasis_image::ContentSource,
) -> Result<(), RestoreError> {
    Ok(stasis_objects::sysv::prepare(segs, Some(content))?)
}

/// Removes again the segments that were removed while attached.
pub fn finish(segs: &[SysvShm]) {
    stasis_objects::sysv::finish(segs);
}
