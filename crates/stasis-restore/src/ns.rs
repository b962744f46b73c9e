//! The namespaces of a tree that lived in namespaces of its own
//! ([`Manifest::namespaces`]): the root stub is created in new ones of the
//! same kinds (PID 1 of a new PID namespace, with the saved host and domain
//! names and a proc of that namespace on `/proc`), and what the restorer
//! does inside them runs on a thread moved there
//! ([`stasis_kernel::ns::in_namespaces_of`]).

use std::ffi::CString;

use stasis_image::manifest::{Manifest, Namespaces};
use stasis_kernel::child::NsSetup;
use stasis_kernel::ns::{self as kns, NsKind};

use crate::{ObjectError, RestoreError, Result};

/// The kinds of `ns`.
pub(crate) fn kinds(ns: &Namespaces) -> Vec<NsKind> {
    let mut k = Vec::new();
    if ns.pid {
        k.push(NsKind::Pid);
    }
    if ns.mnt.is_some() {
        k.push(NsKind::Mnt);
    }
    if ns.net.is_some() {
        k.push(NsKind::Net);
    }
    if ns.uts.is_some() {
        k.push(NsKind::Uts);
    }
    if ns.ipc {
        k.push(NsKind::Ipc);
    }
    k
}

/// What the root stub sets up as it is created.
pub(crate) fn setup(ns: &Namespaces) -> Result<NsSetup> {
    let cstr = |what: &str, s: &str| {
        CString::new(s).map_err(|_| {
            RestoreError::from(ObjectError::Inconsistent(format!(
                "the saved {what} holds a NUL byte"
            )))
        })
    };
    let (hostname, domainname) = match &ns.uts {
        Some(u) => (
            Some(cstr("host name", &u.hostname)?),
            Some(cstr("domain name", &u.domainname)?),
        ),
        None => (None, None),
    };
    if ns.mnt.as_ref().is_some_and(|m| m.proc) && !ns.pid {
        return Err(ObjectError::Inconsistent(
            "a proc mount of the tree's own without a PID namespace of its own".into(),
        )
        .into());
    }
    Ok(NsSetup {
        flags: kinds(ns)
            .iter()
            .map(|k| k.clone_flag())
            .fold(0, |a, f| a | f),
        hostname,
        domainname,
        mount_proc: ns.mnt.as_ref().is_some_and(|m| m.proc),
    })
}

/// Once the root stub (`root`, as stasis sees it) exists in its new
/// namespaces: brings their loopback up if it was, and moves the calling
/// thread into the new network namespace (until the guard is dropped), so
/// that the sockets it makes for the tree are there.
pub(crate) fn after_spawn(m: &Manifest, root: i32) -> Result<Option<kns::NetnsGuard>> {
    let Some(net) = m.namespaces.as_ref().and_then(|n| n.net.as_ref()) else {
        return Ok(None);
    };
    if net.lo_up {
        kns::in_namespaces_of(root, &[NsKind::Net], kns::set_loopback_up)??;
    }
    Ok(Some(kns::NetnsGuard::enter(root)?))
}

/// Runs `f` in the IPC namespace of the tree (whose root is `root` as
/// stasis sees it) if it has one of its own, else here.
pub(crate) fn in_ipc<T: Send>(m: &Manifest, root: i32, f: impl FnOnce() -> T + Send) -> Result<T> {
    if m.namespaces.as_ref().is_some_and(|n| n.ipc) {
        Ok(kns::in_namespaces_of(root, &[NsKind::Ipc], f)?)
    } else {
        Ok(f())
    }
}
