//! `stasis page-server`: serve an image directory to restores on other
//! machines (see `stasis_pageserver::protocol` for the wire protocol).

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use stasis_pageserver::tls::Transport;
use stasis_pageserver::{Server, ServerConfig};

/// Largest token file read.
const MAX_TOKEN_BYTES: u64 = 64 << 10;

/// `stasis page-server -D DIR --token-file FILE [--listen ADDR] [--json]`.
#[derive(clap::Args, Debug)]
pub struct PageServerArgs {
    /// Image directory to serve (read-only), or s3://BUCKET/PREFIX: a
    /// checkpoint and its chain are fetched from the object store into a
    /// private temporary copy (removed when the server ends), which is
    /// served.
    #[arg(short = 'D', long)]
    pub dir: PathBuf,
    /// With an s3:// store: the checkpoint to serve (default: the latest).
    #[arg(long)]
    pub checkpoint: Option<u32>,
    /// Address to listen on (`0.0.0.0:7070` for every interface; port 0
    /// picks a free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// File holding the secret token shared with the restoring side
    /// (keep it mode 0600; one trailing newline is ignored).
    #[arg(long)]
    pub token_file: PathBuf,
    /// Print the listening address as one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub transport: TransportArgs,
}

/// The transport flag of every command that has a token.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct TransportArgs {
    /// Talk without TLS (the other end must be given it too): the token
    /// still authenticates both ends, but everything sent, pages included,
    /// crosses the network readable by anyone on the path.
    #[arg(long)]
    pub insecure_plaintext: bool,
}

impl TransportArgs {
    /// The transport asked for.
    pub fn transport(self) -> Transport {
        Transport::from_flag(self.insecure_plaintext)
    }

    /// Makes it this process's transport (every connection it opens).
    pub fn apply(self) {
        Transport::set_process_default(self.transport());
    }
}

/// Binds, prints where it listens, then serves until killed.
pub fn cmd_page_server(
    a: PageServerArgs,
    seal: stasis_store::seal::SealOptions,
    replicas: Vec<stasis_store::S3Image>,
) -> Result<ExitCode> {
    a.transport.apply();
    let token = read_token_file(&a.token_file)?;
    // An object store: a private copy of the checkpoint, served.
    let mut _copy_guard = None;
    let (dir, copy) = match crate::store::s3(&a.dir, seal.clone())? {
        Some(image) => {
            let url = image.url.clone();
            let t = crate::store::fetch(image, replicas, a.checkpoint)?;
            let n = t.fetched.chain.first().copied().unwrap_or(0);
            let dir = t.image();
            // The copy goes when the server is stopped by a signal too.
            _copy_guard = Some(remove_on_signal(t)?);
            (dir, Some((url, n)))
        }
        None => {
            crate::store::refuse_for_local(&a.dir, &seal, &replicas)?;
            if a.checkpoint.is_some() {
                bail!("--checkpoint applies to an s3:// store: a page server serves every checkpoint of an image directory");
            }
            (a.dir.clone(), None)
        }
    };
    let what = match &copy {
        Some((url, n)) => format!("checkpoint {n} of {url}"),
        None => a.dir.display().to_string(),
    };
    let server = Server::bind(ServerConfig {
        dir,
        listen: a.listen.clone(),
        token,
        transport: a.transport.transport(),
    })
    .with_context(|| format!("starting the page server for {what}"))?;
    let addr = server.local_addr();
    {
        let mut out = std::io::stdout().lock();
        if a.json {
            let mut v = serde_json::json!({
                "listening": addr.to_string(),
                "dir": a.dir.display().to_string(),
                "tls": !a.transport.insecure_plaintext,
            });
            if let Some((_, n)) = &copy {
                v["checkpoint"] = (*n).into();
            }
            writeln!(out, "{v}")?;
        } else {
            let how = if a.transport.insecure_plaintext {
                " (plaintext)"
            } else {
                " (TLS)"
            };
            writeln!(out, "page server: serving {what} on {addr}{how}")?;
        }
        out.flush()?;
    }
    server
        .serve()
        .with_context(|| format!("serving {what} on {addr}"))?;
    Ok(ExitCode::SUCCESS)
}

/// A private copy of checkpoints, removed when dropped or when the
/// process is stopped by a signal.
struct CopyGuard(Arc<Mutex<Option<stasis_store::TempImage>>>);

impl Drop for CopyGuard {
    fn drop(&mut self) {
        if let Ok(mut g) = self.0.lock() {
            g.take();
        }
    }
}

/// Removes the copy `t` when SIGINT, SIGTERM or SIGHUP comes, then dies
/// of the signal as a page server does; or when the guard returned is
/// dropped. Those signals are blocked in this thread, and so in the
/// server's threads started after it: one thread takes them. (The store's
/// clients, and their I/O threads, are gone.)
fn remove_on_signal(t: stasis_store::TempImage) -> Result<CopyGuard> {
    let copy = Arc::new(Mutex::new(Some(t)));
    let held = Arc::clone(&copy);
    use nix::sys::signal::{self, SigSet, Signal};
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set.thread_block()
        .context("blocking SIGINT/SIGTERM/SIGHUP for the page server's clean-up")?;
    std::thread::Builder::new()
        .name("copy-cleanup".into())
        .spawn(move || {
            let Ok(sig) = set.wait() else { return };
            if let Ok(mut g) = held.lock() {
                g.take();
            }
            let mut one = SigSet::empty();
            one.add(sig);
            let _ = one.thread_unblock();
            let _ = signal::raise(sig);
            std::process::exit(128 + sig as i32);
        })
        .context("starting the page server's signal thread")?;
    Ok(CopyGuard(copy))
}

/// Reads a token file: refuses a missing, empty or oversized one, strips
/// one trailing newline, and warns if other users may read it.
pub fn read_token_file(path: &Path) -> Result<Vec<u8>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| {
            format!(
                "cannot read token file {}: create it with a secret shared with the other side, \
                 e.g. `head -c 32 /dev/urandom | base64 > {0}; chmod 600 {0}`",
                path.display()
            )
        })?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot stat token file {}", path.display()))?;
    if !meta.is_file() {
        bail!("token file {} is not a regular file", path.display());
    }
    let mode = meta.permissions().mode();
    if mode & 0o044 != 0 {
        eprintln!(
            "stasis: warning: token file {} is readable by other users (mode {:o}): run `chmod 600 {}`",
            path.display(),
            mode & 0o777,
            path.display()
        );
    }
    let mut token = Vec::new();
    file.take(MAX_TOKEN_BYTES + 1)
        .read_to_end(&mut token)
        .with_context(|| format!("cannot read token file {}", path.display()))?;
    if token.len() as u64 > MAX_TOKEN_BYTES {
        bail!(
            "token file {} is larger than {MAX_TOKEN_BYTES} bytes: is it the right file?",
            path.display()
        );
    }
    if token.last() == Some(&b'\n') {
        token.pop();
    }
    if token.is_empty() {
        bail!(
            "token file {} is empty: put a secret in it (the same on both sides)",
            path.display()
        );
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files_are_read_and_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("token");
        std::fs::write(&p, b"s3cret\n\n").unwrap();
        assert_eq!(read_token_file(&p).unwrap(), b"s3cret\n");
        std::fs::write(&p, b"s3cret").unwrap();
        assert_eq!(read_token_file(&p).unwrap(), b"s3cret");
        std::fs::write(&p, b"\n").unwrap();
        let e = read_token_file(&p).unwrap_err().to_string();
        assert!(e.contains("is empty"), "{e}");
        let e = read_token_file(&tmp.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read token file"), "{e}");
        let e = read_token_file(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
