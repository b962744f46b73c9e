//! Capabilities and securebits, given back around the credentials of each
//! thread (they are per thread in the kernel).
//!
//! A stub is root with every capability, as the restorer. Changing every
//! uid away from 0 empties the permitted and effective sets unless
//! `SECBIT_KEEP_CAPS` is set, so the order is:
//! 1. while still privileged: the bounding set (`PR_CAPBSET_DROP` of each
//!    capability the image lacks) and the securebits, with `KEEP_CAPS`
//!    added for the change of ids;
//! 2. the ids ([`crate::threads::restore_creds`]);
//! 3. `capset` of the effective, permitted and inheritable sets (only ever
//!    a reduction of what was kept), then `PR_CAP_AMBIENT_RAISE` of each
//!    ambient capability (it needs the capability permitted and
//!    inheritable), then `KEEP_CAPS` cleared again if the image lacks it.
//!
//! A thread whose saved sets are what the ids alone give (root with every
//! capability, or another user with none) is left to the ids.

use stasis_image::manifest::{Capabilities, Credentials};
use stasis_sys::prctl::{LINUX_CAPABILITY_VERSION_3, SECBIT_KEEP_CAPS, SECBIT_KEEP_CAPS_LOCKED};

use crate::build::{self, step};
use crate::remote::Remote;
use crate::Result;

/// What a stub starts with: the restorer's own capabilities.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Own {
    /// Every capability this kernel knows (bits 0..=`cap_last_cap`).
    pub all: u64,
    pub permitted: u64,
    pub bounding: u64,
}

impl Own {
    pub(crate) fn read() -> Own {
        let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .unwrap_or(40)
            .min(63);
        let all = u64::MAX >> (63 - last);
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let set = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or(all)
        };
        Own {
            all,
            permitted: set("CapPrm:"),
            bounding: set("CapBnd:"),
        }
    }
}

/// The capabilities to set explicitly, or `None` when the ids give them
/// (a root thread: the restorer's; another user: none).
pub(crate) fn to_set(c: &Credentials, own: &Own) -> Option<Capabilities> {
    let k = c.caps?;
    let root = c.uid[..3].contains(&0);
    let natural = if root { own.permitted } else { 0 };
    let given = k.permitted == natural
        && k.effective == natural
        && k.inheritable == 0
        && k.ambient == 0
        && k.bounding == own.bounding
        && k.securebits == 0;
    (!given).then_some(k)
}

/// Step 1: bounding set and securebits, while the thread is root.
pub(crate) fn before_ids<R: Remote>(s: &mut R, k: &Capabilities, all: u64) -> Result<()> {
    for cap in (0..64).filter(|c| all & !k.bounding & (1 << c) != 0) {
        s.sys(
            "prctl(PR_CAPBSET_DROP)",
            libc::SYS_prctl,
            &[libc::PR_CAPBSET_DROP as u64, cap],
        )
        .map_err(step(format!(
            "dropping capability {cap} from the bounding set"
        )))?;
    }
    let mut bits = k.securebits;
    if bits & SECBIT_KEEP_CAPS_LOCKED == 0 {
        bits |= SECBIT_KEEP_CAPS;
    }
    s.sys(
        "prctl(PR_SET_SECUREBITS)",
        libc::SYS_prctl,
        &[libc::PR_SET_SECUREBITS as u64, u64::from(bits)],
    )
    .map_err(step(format!("setting securebits {bits:#x}")))?;
    Ok(())
}

/// Step 3: the sets themselves, the ambient set, `KEEP_CAPS` as saved.
pub(crate) fn after_ids<R: Remote>(s: &mut R, k: &Capabilities, all: u64) -> Result<()> {
    let mut words = Vec::with_capacity(32);
    words.extend_from_slice(&LINUX_CAPABILITY_VERSION_3.to_le_bytes());
    words.extend_from_slice(&0i32.to_le_bytes());
    for half in [0, 32] {
        for set in [k.effective, k.permitted, k.inheritable] {
            let w = u32::try_from((set & all) >> half & 0xffff_ffff).unwrap_or(0);
            words.extend_from_slice(&w.to_le_bytes());
        }
    }
    let hdr = s
        .put(build::SCRATCH_STRUCT, &words)
        .map_err(step("capability sets"))?;
    s.sys("capset", libc::SYS_capset, &[hdr, hdr + 8])
        .map_err(step(format!(
            "capset (effective {:#x}, permitted {:#x}, inheritable {:#x})",
            k.effective, k.permitted, k.inheritable
        )))?;
    for cap in (0..64).filter(|c| k.ambient & all & (1 << c) != 0) {
        s.sys(
            "prctl(PR_CAP_AMBIENT)",
            libc::SYS_prctl,
            &[
                libc::PR_CAP_AMBIENT as u64,
                libc::PR_CAP_AMBIENT_RAISE as u64,
                cap,
                0,
                0,
            ],
        )
        .map_err(step(format!("raising ambient capability {cap}")))?;
    }
    if k.securebits & (SECBIT_KEEP_CAPS | SECBIT_KEEP_CAPS_LOCKED) == 0 {
        s.sys(
            "prctl(PR_SET_KEEPCAPS)",
            libc::SYS_prctl,
            &[libc::PR_SET_KEEPCAPS as u64, 0],
        )
        .map_err(step("clearing keep-caps"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::Recorder;

    const ALL: u64 = (1 << 41) - 1;
    const OWN: Own = Own {
        all: ALL,
        permitted: ALL,
        bounding: ALL,
    };

    fn creds(uid: u32, k: Capabilities) -> Credentials {
        Credentials {
            uid: [uid; 4],
            gid: [uid; 4],
            groups: Vec::new(),
            caps: Some(k),
            groups_fixed: false,
        }
    }

    #[test]
    fn what_the_ids_give_is_left_to_them() {
        let root = Capabilities {
            permitted: ALL,
            effective: ALL,
            bounding: ALL,
            ..Default::default()
        };
        assert_eq!(to_set(&creds(0, root), &OWN), None);
        let user = Capabilities {
            bounding: ALL,
            ..Default::default()
        };
        assert_eq!(to_set(&creds(1000, user), &OWN), None);
        // Root without CAP_CHOWN in its effective set, a user keeping one.
        let less = Capabilities {
            effective: ALL & !1,
            ..root
        };
        assert_eq!(to_set(&creds(0, less), &OWN), Some(less));
        let kept = Capabilities {
            permitted: 1 << 10,
            ..user
        };
        assert_eq!(to_set(&creds(1000, kept), &OWN), Some(kept));
        let mut old = creds(0, less);
        old.caps = None;
        assert_eq!(to_set(&old, &OWN), None, "an image without them");
        // A restorer without CAP_SYS_RESOURCE: a root thread saved the same.
        let own = Own {
            permitted: ALL & !(1 << 24),
            bounding: ALL & !(1 << 24),
            ..OWN
        };
        let same = Capabilities {
            permitted: own.permitted,
            effective: own.permitted,
            bounding: own.bounding,
            ..Default::default()
        };
        assert_eq!(to_set(&creds(0, same), &own), None);
    }

    #[test]
    fn bounding_drops_and_keepcaps_come_before_the_ids_and_the_sets_after() {
        let k = Capabilities {
            inheritable: 1 << 10,
            permitted: (1 << 10) | (1 << 33),
            effective: 1 << 33,
            bounding: ALL & !(1 << 8),
            ambient: 1 << 10,
            securebits: 0,
        };
        let mut r = Recorder::default();
        before_ids(&mut r, &k, ALL).unwrap();
        assert_eq!(
            r.args_of("prctl(PR_CAPBSET_DROP)"),
            [vec![libc::PR_CAPBSET_DROP as u64, 8]]
        );
        assert_eq!(
            r.args_of("prctl(PR_SET_SECUREBITS)"),
            [vec![libc::PR_SET_SECUREBITS as u64, 0x10]]
        );
        let mut r = Recorder::default();
        after_ids(&mut r, &k, ALL).unwrap();
        assert_eq!(
            r.names(),
            ["capset", "prctl(PR_CAP_AMBIENT)", "prctl(PR_SET_KEEPCAPS)"]
        );
        let data: Vec<u8> = [0x2008_0522u32, 0, 0, 1 << 10, 1 << 10, 2, 2, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert_eq!(r.writes(), [data]);
        assert_eq!(r.args_of("prctl(PR_CAP_AMBIENT)"), [vec![47, 2, 10, 0, 0]]);
    }
}
