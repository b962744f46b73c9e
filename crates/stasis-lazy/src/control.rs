//! The restorer's line to the filler.
//!
//! The filler is a separate process (`stasis __lazy-filler`), so that it
//! outlives `stasis restore --detach`. Its standard input is one end of a
//! unix stream socket pair; the restorer keeps the other. Each frame is a
//! little-endian `u32` length and that many bytes of JSON; a frame that
//! hands over a userfaultfd carries it as `SCM_RIGHTS` on the same
//! `sendmsg`.
//!
//! ```text
//! filler   -> restorer  {"ready": {"pages": N}} | {"error": "..."}      once, first
//! filler   -> restorer  {"error": "..."}  a page could not be delivered: the tree was killed
//! restorer -> filler    {"hand": {"image_pid", "pid", "areas": [[s, e]..]}} + uffd
//! restorer -> filler    {"done": true}    the tree runs: fill, then exit
//! restorer -> filler    {"abort": true}   the restore failed: exit now
//! ```
//!
//! End of stream without `done` is an abort.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use stasis_kernel::scm;

use crate::LazyError;

/// Largest frame accepted (a hand-over lists the areas of one process).
const MAX_FRAME: u32 = 64 << 20;

/// One frame of the control protocol.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Msg {
    Ready { pages: u64 },
    Error(String),
    Hand(Hand),
    Done(bool),
    Abort(bool),
}

/// A process handed over: its userfaultfd comes with the frame.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hand {
    /// PID in the image (which pages it is owed).
    pub image_pid: i32,
    /// PID as the filler sees it (to kill the tree if pages cannot come).
    pub pid: i32,
    /// Registered areas `[start, end)`; what they owe is the image's data
    /// in them.
    pub areas: Vec<(u64, u64)>,
}

fn io_err(what: &str) -> impl FnOnce(std::io::Error) -> LazyError + '_ {
    move |e| LazyError::Control(format!("{what}: {e}"))
}

/// Encodes one frame: the length header and the JSON body.
pub fn encode_frame(msg: &Msg) -> Result<Vec<u8>, LazyError> {
    let body = serde_json::to_vec(msg).map_err(|e| LazyError::Control(e.to_string()))?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&l| l <= MAX_FRAME)
        .ok_or_else(|| LazyError::Control("control frame too large".into()))?;
    let mut frame = len.to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// The body length a frame header announces, refused over the limit
/// (before anything is allocated for the body).
pub fn frame_len(hdr: [u8; 4]) -> Result<usize, LazyError> {
    let len = u32::from_le_bytes(hdr);
    if len > MAX_FRAME {
        return Err(LazyError::Control(format!("frame of {len} bytes")));
    }
    usize::try_from(len).map_err(|_| LazyError::Control(format!("frame of {len} bytes")))
}

/// Decodes the body of a frame.
pub fn decode_body(body: &[u8]) -> Result<Msg, LazyError> {
    serde_json::from_slice(body).map_err(|e| LazyError::Control(e.to_string()))
}

/// Decodes the first frame of `bytes`: the message and the bytes it took,
/// or `Ok(None)` if `bytes` ends before the frame does.
pub fn decode_frame(bytes: &[u8]) -> Result<Option<(Msg, usize)>, LazyError> {
    let Some((hdr, rest)) = bytes.split_first_chunk::<4>() else {
        return Ok(None);
    };
    let len = frame_len(*hdr)?;
    let Some(body) = rest.get(..len) else {
        return Ok(None);
    };
    Ok(Some((decode_body(body)?, 4 + len)))
}

/// Sends one frame, with `fd` attached if given.
pub fn send(sock: BorrowedFd<'_>, msg: &Msg, fd: Option<BorrowedFd<'_>>) -> Result<(), LazyError> {
    let frame = encode_frame(msg)?;
    let mut stream = UnixStream::from(sock.try_clone_to_owned().map_err(io_err("dup"))?);
    match fd {
        Some(fd) => {
            // The header goes with the descriptor, the body after it.
            scm::send_with_fd(sock, &frame[..4], fd)
                .map_err(|e| LazyError::Control(e.to_string()))?;
            stream.write_all(&frame[4..]).map_err(io_err("sending"))?;
        }
        None => stream.write_all(&frame).map_err(io_err("sending"))?,
    }
    Ok(())
}

/// Receives one frame and the descriptor that came with it. `Ok(None)` at
/// end of stream.
pub fn recv(sock: BorrowedFd<'_>) -> Result<Option<(Msg, Option<OwnedFd>)>, LazyError> {
    let mut hdr = [0u8; 4];
    // A wait cut short by a signal (the socket has a read timeout, so the
    // kernel does not restart it, not even after a stop and continue of
    // this process) is waited again.
    let (n, fd) = loop {
        match scm::recv_with_fd(sock, &mut hdr) {
            Err(stasis_kernel::KernelError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::Interrupted => {}
            r => break r.map_err(|e| LazyError::Control(e.to_string()))?,
        }
    };
    if n == 0 {
        return Ok(None);
    }
    let mut stream = UnixStream::from(sock.try_clone_to_owned().map_err(io_err("dup"))?);
    stream
        .read_exact(&mut hdr[n..])
        .map_err(io_err("reading a frame"))?;
    let mut body = vec![0u8; frame_len(hdr)?];
    stream
        .read_exact(&mut body)
        .map_err(io_err("reading a frame"))?;
    let msg = decode_body(&body)?;
    Ok(Some((msg, fd)))
}

/// What the filler is started with.
#[derive(Debug, Clone, Default)]
pub struct FillerArgs {
    /// Local image, or the mirror of a remote one.
    pub dir: std::path::PathBuf,
    pub checkpoint: u32,
    /// Page server address and token file (pages come from there).
    pub from: Option<(String, std::path::PathBuf)>,
    /// Background copier threads.
    pub threads: usize,
    /// Write fault and completion statistics here (JSON) when done.
    pub stats_file: Option<std::path::PathBuf>,
    /// Record the order pages fault in, into the image (local images).
    pub record_faults: bool,
    /// Background streaming cap, bytes per second (0: none).
    pub bandwidth: u64,
    /// Where the filler's messages go: `None` inherits stderr (the
    /// restorer waits for the tree, so the terminal is there); a detached
    /// restore must not leave its caller's pipes open, so they go to a file
    /// (or nowhere).
    pub log: Option<Option<std::path::PathBuf>>,
    /// Further arguments, given as they are (the transport, a store).
    pub extra: Vec<String>,
}

impl FillerArgs {
    /// The command line of `stasis __lazy-filler`.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            "__lazy-filler".to_string(),
            "--dir".into(),
            self.dir.to_string_lossy().into_owned(),
            "--checkpoint".into(),
            self.checkpoint.to_string(),
            "--threads".into(),
            self.threads.to_string(),
        ];
        if let Some((addr, token)) = &self.from {
            a.extend([
                "--from".into(),
                addr.clone(),
                "--token-file".into(),
                token.to_string_lossy().into_owned(),
            ]);
        }
        if let Some(s) = &self.stats_file {
            a.extend(["--stats-file".into(), s.to_string_lossy().into_owned()]);
        }
        if self.record_faults {
            a.push("--record-faults".into());
        }
        if self.bandwidth > 0 {
            a.extend(["--bandwidth".into(), self.bandwidth.to_string()]);
        }
        a.extend(self.extra.iter().cloned());
        a
    }
}

/// The restorer's handle on a running filler.
#[derive(Debug, Clone)]
pub struct Filler {
    sock: Arc<Mutex<OwnedFd>>,
    pub pid: i32,
    /// Pages the filler will serve (as it counted them in the image).
    pub pages: u64,
}

impl Filler {
    /// Starts `exe __lazy-filler ...` in its own process group (a Ctrl-C
    /// meant for the restorer must not stop the filler of a running tree)
    /// and waits until it has loaded the image.
    pub fn spawn(exe: &Path, args: &FillerArgs) -> Result<Filler, LazyError> {
        let (mine, theirs) = UnixStream::pair().map_err(io_err("socketpair"))?;
        let stderr = match &args.log {
            None => std::process::Stdio::inherit(),
            Some(None) => std::process::Stdio::null(),
            Some(Some(path)) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| LazyError::Control(format!("opening {}: {e}", path.display())))?
                .into(),
        };
        let child = std::process::Command::new(exe)
            .args(args.to_args())
            .stdin(std::process::Stdio::from(OwnedFd::from(theirs)))
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .process_group(0)
            .spawn()
            .map_err(|e| LazyError::Control(format!("starting {}: {e}", exe.display())))?;
        let pid = i32::try_from(child.id()).unwrap_or(-1);
        // Not waited for: the filler outlives a detached restorer and is
        // then reaped by whoever inherits it.
        drop(child);
        mine.set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(io_err("timeout"))?;
        let sock = OwnedFd::from(mine);
        match recv(sock.as_fd())? {
            Some((Msg::Ready { pages }, _)) => Ok(Filler {
                sock: Arc::new(Mutex::new(sock)),
                pid,
                pages,
            }),
            Some((Msg::Error(e), _)) => Err(LazyError::Filler(e)),
            other => Err(LazyError::Filler(format!(
                "the page filler did not start (it said {other:?})"
            ))),
        }
    }

    /// Hands a process's userfaultfd over.
    pub fn hand(&self, hand: Hand, uffd: &OwnedFd) -> Result<(), LazyError> {
        let s = self
            .sock
            .lock()
            .map_err(|_| LazyError::Control("poisoned".into()))?;
        send(s.as_fd(), &Msg::Hand(hand), Some(uffd.as_fd()))
    }

    /// The tree runs: the filler finishes on its own.
    pub fn done(&self) -> Result<(), LazyError> {
        let s = self
            .sock
            .lock()
            .map_err(|_| LazyError::Control("poisoned".into()))?;
        send(s.as_fd(), &Msg::Done(true), None)
    }

    /// After a failed restore: the filler's own failure, if it reported
    /// one within `wait` (a page it could not deliver made it kill the
    /// tree under construction, which is then the cause to report).
    pub fn failure(&self, wait: Duration) -> Option<String> {
        let s = self.sock.lock().ok()?;
        let stream = UnixStream::from(s.try_clone().ok()?);
        stream.set_read_timeout(Some(wait)).ok()?;
        let got = recv(s.as_fd());
        let _ = stream.set_read_timeout(Some(Duration::from_secs(120)));
        match got {
            Ok(Some((Msg::Error(e), _))) => Some(e),
            _ => None,
        }
    }

    /// The restore failed: the filler exits.
    pub fn abort(&self) {
        if let Ok(s) = self.sock.lock() {
            let _ = send(s.as_fd(), &Msg::Abort(true), None);
        }
    }
}

/// A running filler as a restore's lazy sink: each process's userfaultfd
/// goes to it.
#[derive(Debug, Clone)]
pub struct FillerSink(pub Filler);

impl stasis_restore::LazySink for FillerSink {
    fn features(&self) -> u64 {
        crate::FEATURES
    }
    fn hand(
        &self,
        image_pid: i32,
        pid: i32,
        areas: &[(u64, u64)],
        uffd: &OwnedFd,
    ) -> Result<(), stasis_restore::LazyHandError> {
        self.0
            .hand(
                Hand {
                    image_pid,
                    pid,
                    areas: areas.to_vec(),
                },
                uffd,
            )
            .map_err(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restorer (or filler) stopped and continued while it waits for a
    /// frame, on a socket with a read timeout (where the kernel does not
    /// restart the wait: `EINTR`), still gets the frame: `restore --lazy`
    /// failed with "recvmsg(SCM_RIGHTS) failed" when stopped and continued
    /// (job control, a debugger) while it waited for its filler.
    #[test]
    fn a_frame_waited_for_across_a_stop_and_continue_arrives() {
        let (mine, theirs) = UnixStream::pair().unwrap();
        mine.set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        // This thread, as /proc names it: the helper stops this process once
        // the thread waits in recvmsg, continues it, then sends the frame.
        let me = std::fs::read_link("/proc/thread-self").unwrap();
        let tid = me.file_name().unwrap().to_str().unwrap().to_string();
        let pid = std::process::id();
        let frame = encode_frame(&Msg::Done(true)).unwrap();
        let octal: String = frame.iter().map(|b| format!("\\{b:03o}")).collect();
        let script = format!(
            "while [ \"$(cut -d' ' -f1 /proc/{pid}/task/{tid}/syscall)\" != {nr} ]; do sleep 0.01; done
             kill -STOP {pid}
             while [ \"$(sed 's/.*) //' /proc/{pid}/stat | cut -c1)\" != T ]; do sleep 0.01; done
             kill -CONT {pid}
             printf '{octal}'",
            nr = libc::SYS_recvmsg,
        );
        let mut helper = std::process::Command::new("sh")
            .args(["-c", &script])
            .stdout(std::process::Stdio::from(OwnedFd::from(theirs)))
            .spawn()
            .unwrap();
        let got = recv(mine.as_fd());
        let status = helper.wait().unwrap();
        assert!(status.success(), "the helper failed: {status}");
        match got {
            Ok(Some((Msg::Done(true), None))) => {}
            other => panic!("after a stop and continue: {other:?}"),
        }
    }
}
