//! The keeper: a small process that holds the userfaultfds of a tracked
//! tree between two `stasis dump` runs.
//!
//! Write-protection stays armed only while someone holds the userfaultfd.
//! `stasis run` holds them itself; a one-shot `stasis dump --track
//! --leave-running` exits, so it hands them to a keeper, one per image
//! directory, found at the abstract unix socket `stasis-track-<hash of the
//! directory's path>`.
//!
//! # Protocol
//! A stream connection; each message is 4 bytes (the pid, little-endian)
//! with one userfaultfd attached (`SCM_RIGHTS`). The client half-closes
//! when done; the keeper answers with one byte `K` once it holds them all.
//! Only a peer with the keeper's own uid is served (`SO_PEERCRED`).
//!
//! The keeper exits when every process it holds descriptors for has exited
//! (a pidfd of each is polled), or after 10 s without any.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use stasis_kernel::{pidfd, scm};

use crate::{Result, TrackError};

/// The keeper's socket name for an image directory.
pub fn socket_name(image_dir: &Path) -> String {
    let canon = std::fs::canonicalize(image_dir).unwrap_or_else(|_| image_dir.to_path_buf());
    let h = xxhash_rust::xxh3::xxh3_64(canon.as_os_str().as_encoded_bytes());
    format!("stasis-track-{h:016x}")
}

fn addr(name: &str) -> Result<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| TrackError::Keeper(format!("socket name {name}: {e}")))
}

/// Hands `fds` (pid, userfaultfd) to the keeper of `image_dir`, starting
/// one (`exe __track-keeper NAME`) if none runs.
pub fn hand_over(image_dir: &Path, fds: Vec<(i32, OwnedFd)>, exe: &Path) -> Result<()> {
    if fds.is_empty() {
        return Ok(());
    }
    let name = socket_name(image_dir);
    let a = addr(&name)?;
    let mut conn = UnixStream::connect_addr(&a);
    if conn.is_err() {
        std::process::Command::new(exe)
            .arg("__track-keeper")
            .arg(&name)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| TrackError::Keeper(format!("starting {}: {e}", exe.display())))?;
        let t0 = Instant::now();
        while conn.is_err() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
            conn = UnixStream::connect_addr(&a);
        }
    }
    let mut conn = conn.map_err(|e| TrackError::Keeper(format!("connecting to {name}: {e}")))?;
    for (pid, fd) in &fds {
        scm::send_with_fd(conn.as_fd(), &pid.to_le_bytes(), fd.as_fd())
            .map_err(|e| TrackError::Keeper(e.to_string()))?;
    }
    conn.shutdown(std::net::Shutdown::Write)
        .map_err(|e| TrackError::Keeper(format!("shutdown: {e}")))?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut ack = [0u8; 1];
    conn.read_exact(&mut ack)
        .map_err(|e| TrackError::Keeper(format!("no answer from the keeper: {e}")))?;
    if ack != *b"K" {
        return Err(TrackError::Keeper(
            "the keeper refused the descriptors".into(),
        ));
    }
    Ok(())
}

/// Runs the keeper: serves `name` until every held process has exited.
pub fn serve(name: &str) -> Result<()> {
    let listener = match UnixListener::bind_addr(&addr(name)?) {
        Ok(l) => l,
        // Another keeper already serves this directory.
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => return Ok(()),
        Err(e) => return Err(TrackError::Keeper(format!("bind {name}: {e}"))),
    };
    // pid -> (pidfd, userfaultfds)
    let mut held: HashMap<i32, (OwnedFd, Vec<OwnedFd>)> = HashMap::new();
    let mut idle_since = Instant::now();
    let me = nix::unistd::geteuid();
    loop {
        let pids: Vec<i32> = held.keys().copied().collect();
        let mut pfds = vec![PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        pfds.extend(
            pids.iter()
                .map(|p| PollFd::new(held[p].0.as_fd(), PollFlags::POLLIN)),
        );
        let _ = poll(&mut pfds, PollTimeout::from(1000u16));
        let ready: Vec<bool> = pfds.iter().map(|p| p.any().unwrap_or(false)).collect();
        drop(pfds);
        for (i, pid) in pids.iter().enumerate() {
            if ready[i + 1] {
                held.remove(pid); // exited: its descriptors go
            }
        }
        if ready[0] {
            if let Ok((mut conn, _)) = listener.accept() {
                let peer_ok =
                    nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials)
                        .map(|c| c.uid() == me.as_raw())
                        .unwrap_or(false);
                if peer_ok {
                    conn.set_read_timeout(Some(Duration::from_secs(5))).ok();
                    let mut ok = true;
                    loop {
                        let mut buf = [0u8; 4];
                        match scm::recv_with_fd(conn.as_fd(), &mut buf) {
                            Ok((0, _)) => break,
                            Ok((4, Some(fd))) => {
                                let pid = i32::from_le_bytes(buf);
                                match held.get_mut(&pid) {
                                    Some(e) => e.1.push(fd),
                                    None => {
                                        // A pid already gone is dropped.
                                        if let Ok(p) = pidfd::pidfd_open(pid) {
                                            held.insert(pid, (p, vec![fd]));
                                        }
                                    }
                                }
                            }
                            _ => {
                                ok = false;
                                break;
                            }
                        }
                    }
                    let _ = conn.write_all(if ok { b"K" } else { b"E" });
                }
            }
        }
        if !held.is_empty() {
            idle_since = Instant::now();
        } else if idle_since.elapsed() > Duration::from_secs(10) {
            return Ok(());
        }
    }
}
