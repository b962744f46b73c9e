//! `stasis page-server`: serve an image directory to restores on other
//! machines (see `stasis_pageserver::protocol` for the wire protocol).

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use stasis_pageserver::tls::Transport;
use stasis_pageserver::{Server, ServerConfig};

/// Largest token file read.
const MAX_TOKEN_BYTES: u64 = 64 << 10;

/// `stasis page-server -D DIR --token-file FILE [--listen ADDR] [--json]`.
#[derive(clap::Args, Debug)]
pub struct PageServerArgs {
    /// Image directory to serve (read-only).
    #[arg(short = 'D', long)]
    pub dir: PathBuf,
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
pub fn cmd_page_server(a: PageServerArgs) -> Result<ExitCode> {
    crate::store::local_only(&a.dir, "page-server")?;
    a.transport.apply();
    let token = read_token_file(&a.token_file)?;
    let server = Server::bind(ServerConfig {
        dir: a.dir.clone(),
        listen: a.listen.clone(),
        token,
        transport: a.transport.transport(),
    })
    .with_context(|| format!("starting the page server for {}", a.dir.display()))?;
    let addr = server.local_addr();
    {
        let mut out = std::io::stdout().lock();
        if a.json {
            let v = serde_json::json!({
                "listening": addr.to_string(),
                "dir": a.dir.display().to_string(),
                "tls": !a.transport.insecure_plaintext,
            });
            writeln!(out, "{v}")?;
        } else {
            let how = if a.transport.insecure_plaintext {
                " (plaintext)"
            } else {
                " (TLS)"
            };
            writeln!(
                out,
                "page server: serving {} on {addr}{how}",
                a.dir.display()
            )?;
        }
        out.flush()?;
    }
    server
        .serve()
        .with_context(|| format!("serving {} on {addr}", a.dir.display()))?;
    Ok(ExitCode::SUCCESS)
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
