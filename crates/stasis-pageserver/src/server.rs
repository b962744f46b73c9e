//! The page server: serves one image directory, read-only, one thread per
//! connection (see [`crate::protocol`] for what it answers).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stasis_image::{load_chain, Checkpoint, ImageDir, ImageError, PackReader, RunEntry};
use stasis_image::{MAX_RUN_PAGES, PACK_HEADER_LEN};
use tracing::{debug, info, warn};
use xxhash_rust::xxh3::Xxh3Default;

use crate::protocol::{self, kind, ErrorCode, Request, MAX_REPLY_BYTES, MAX_REQUEST_BYTES};
use crate::tls::{self, Hello, Purpose, ServerTls, Stream, TlsError, Transport};
use crate::PageServerError;

/// Time a client has for the whole handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Time an authenticated client may stay silent between requests.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Time a write to a client may block (a client that stops reading).
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Time a refused (busy) client has to send its greeting and leave.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Busy refusals handled at once; beyond, connections are just closed.
const MAX_REFUSING: usize = 16;
/// Open packs kept per connection.
const PACK_CACHE: usize = 32;
/// Largest number of entries in a `Files` reply.
const MAX_FILES: usize = 65536;

/// What a server serves, and where.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The image directory.
    pub dir: PathBuf,
    /// Address to listen on, e.g. `0.0.0.0:7070` (port 0 picks a free one).
    pub listen: String,
    /// The shared secret clients must prove they know.
    pub token: Vec<u8>,
    /// TLS keyed by the token, or plaintext (`--insecure-plaintext`).
    pub transport: Transport,
}

/// A bound page server. [`serve`](Self::serve) runs it.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    image: ImageDir,
    token: Vec<u8>,
    /// `None`: plaintext.
    tls: Option<ServerTls>,
    /// Connections being served.
    active: AtomicUsize,
    /// Threads telling a client the server is busy.
    refusing: AtomicUsize,
}

/// Decrements the connection count when a connection ends.
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Server {
    /// Opens the image directory (refusing anything that is not one) and
    /// listens on `config.listen`.
    pub fn bind(config: ServerConfig) -> Result<Server, PageServerError> {
        if config.token.is_empty() {
            return Err(PageServerError::EmptyToken);
        }
        let bad = |error| PageServerError::BadImage {
            dir: config.dir.clone(),
            error,
        };
        let image = ImageDir::open(&config.dir).map_err(bad)?;
        image.checkpoints().map_err(bad)?;
        let tls = match config.transport {
            Transport::Tls => Some(ServerTls::new(&config.token, Purpose::PageServer).map_err(
                |error| PageServerError::Tls {
                    addr: config.listen.clone(),
                    error,
                },
            )?),
            Transport::InsecurePlaintext => None,
        };
        let listener =
            TcpListener::bind(&config.listen).map_err(|error| PageServerError::Bind {
                listen: config.listen.clone(),
                error,
            })?;
        Ok(Server {
            listener,
            shared: Arc::new(Shared {
                image,
                token: config.token,
                tls,
                active: AtomicUsize::new(0),
                refusing: AtomicUsize::new(0),
            }),
        })
    }

    /// The address the server listens on (with the real port).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// Accepts connections until the process ends, each in its own thread.
    /// A failing connection is logged and closed; it never stops the server.
    pub fn serve(self) -> Result<(), PageServerError> {
        let tls = self.shared.tls.is_some();
        info!(dir = %self.shared.image.path().display(), addr = %self.local_addr(), tls, "page server listening");
        for stream in self.listener.incoming() {
            let stream = match stream {
                Ok(s) => s,
                // A signal (the server stopped and continued): no error.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    warn!("page server: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let peer = stream
                .peer_addr()
                .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
            if self.shared.active.fetch_add(1, Ordering::AcqRel) >= protocol::MAX_CONNECTIONS {
                self.shared.active.fetch_sub(1, Ordering::AcqRel);
                warn!(%peer, "page server: too many connections; refusing one");
                if self.shared.refusing.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSING {
                    // Under a flood: just close.
                    self.shared.refusing.fetch_sub(1, Ordering::AcqRel);
                    warn!(%peer, "page server: closing a connection without an answer: {MAX_REFUSING} other clients are being told the server is busy (the client sees the connection closed during its TLS handshake)");
                    continue;
                }
                let shared = Arc::clone(&self.shared);
                let spawned = std::thread::Builder::new()
                    .name(format!("page-server busy {peer}"))
                    .spawn(move || {
                        if let Err(e) = refuse_busy(&shared, stream, peer) {
                            debug!(%peer, "page server: cannot tell a client it is busy: {e}");
                        }
                        shared.refusing.fetch_sub(1, Ordering::AcqRel);
                    });
                if let Err(e) = spawned {
                    self.shared.refusing.fetch_sub(1, Ordering::AcqRel);
                    warn!(%peer, "page server: closing a connection without an answer: cannot start a thread to tell it the server is busy: {e}");
                }
                continue;
            }
            let slot = Slot(Arc::clone(&self.shared));
            let spawned = std::thread::Builder::new()
                .name(format!("page-server {peer}"))
                .spawn(move || {
                    let shared = Arc::clone(&slot.0);
                    match session(&shared, stream, peer) {
                        Ok(()) => debug!(%peer, "page server: connection closed"),
                        Err(e) => info!(%peer, "page server: connection ended: {e}"),
                    }
                    drop(slot);
                });
            if let Err(e) = spawned {
                warn!(%peer, "page server: closing a connection without an answer: cannot start a thread for it: {e}");
            }
        }
        Ok(())
    }
}

/// Tells a client the server is full: reads its greeting, answers with
/// ours and a `Busy` error, and waits (briefly) for it to close, so that the
/// answer is not lost to a reset. Bounded by [`MAX_REFUSING`] threads.
fn refuse_busy(shared: &Shared, tcp: TcpStream, peer: SocketAddr) -> io::Result<()> {
    tcp.set_read_timeout(Some(REFUSE_TIMEOUT))?;
    tcp.set_write_timeout(Some(REFUSE_TIMEOUT))?;
    let Some(stream) = open(shared, tcp, peer)? else {
        return Ok(());
    };
    let msg = format!(
        "the page server is busy ({} connections): try again later",
        protocol::MAX_CONNECTIONS
    );
    refuse_early(stream, ErrorCode::Busy, &msg)?;
    debug!(%peer, "page server: told a client it is busy");
    Ok(())
}

/// Reads a client's greeting, answers with ours and an error, and waits
/// (briefly) for the client to close.
fn refuse_early(mut stream: Stream, code: ErrorCode, msg: &str) -> io::Result<()> {
    let mut greeting = [0u8; protocol::GREETING_LEN];
    stream.read_exact(&mut greeting)?;
    let mut out = Vec::new();
    protocol::write_greeting(&mut out, protocol::PROTOCOL_VERSION)?;
    protocol::write_frame(&mut out, kind::ERROR, &protocol::encode_error(code, msg))?;
    stream.write_all(&out)?;
    stream.flush()?;
    let tcp = stream.tcp().try_clone()?;
    tcp.shutdown(Shutdown::Write)?;
    // Drain until the client closes (it may have sent its hello already).
    io::copy(&mut (&tcp).take(1 << 16), &mut io::sink())?;
    Ok(())
}

/// Sets up the connection's transport. `Ok(None)`: the client was refused
/// (it speaks the other transport, or holds another token), and logged.
fn open(shared: &Shared, tcp: TcpStream, peer: SocketAddr) -> io::Result<Option<Stream>> {
    let Some(config) = &shared.tls else {
        let hello = match tls::sniff(&tcp) {
            Ok(h) => h,
            Err(e) => {
                log_handshake_failure(peer, &tcp, "greeting", &e);
                return Ok(None);
            }
        };
        if hello == Hello::Tls {
            warn!(%peer, "page server: refused a TLS client: this server runs with --insecure-plaintext (give it on both ends or on neither)");
            // Our plaintext greeting tells its TLS library this is no TLS.
            let mut greeting = Vec::new();
            protocol::write_greeting(&mut greeting, protocol::PROTOCOL_VERSION)?;
            tls::refuse_tls_client(&tcp, &greeting)?;
            return Ok(None);
        }
        return Ok(Some(Stream::plain(tcp)));
    };
    match tls::accept(tcp.try_clone()?, config) {
        Ok(s) => Ok(Some(s)),
        Err(TlsError::PlaintextPeer) => {
            warn!(%peer, "page server: refused a plaintext client: this server requires TLS (the client runs with --insecure-plaintext)");
            refuse_early(
                Stream::plain(tcp),
                ErrorCode::Refused,
                protocol::PLAINTEXT_REFUSED,
            )?;
            Ok(None)
        }
        Err(TlsError::Io(e)) => {
            log_handshake_failure(peer, &tcp, "TLS handshake", &e);
            Ok(None)
        }
        Err(TlsError::ClosedInHandshake { .. }) => {
            info!(%peer, "page server: a client closed its connection before its TLS handshake ended");
            Ok(None)
        }
        Err(e) if e.is_other_token() => {
            warn!(%peer, "page server: refused a client with a wrong token ({e}); closing the connection");
            Ok(None)
        }
        Err(e) => {
            warn!(%peer, "page server: TLS with a client failed: {e}; closing the connection");
            Ok(None)
        }
    }
}

/// Logs why a connection on `tcp` ends before its handshake (`stage`: TLS,
/// the greeting, authentication) did, on network error `e`: at `info` if
/// the client left, at `warn` if the server gives up on it (the client
/// then sees its connection closed without an answer).
fn log_handshake_failure(peer: SocketAddr, tcp: &TcpStream, stage: &str, e: &io::Error) {
    use io::ErrorKind as K;
    match e.kind() {
        K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => {
            info!(%peer, "page server: a client left before its {stage} ended ({e})")
        }
        K::WouldBlock | K::TimedOut => {
            let wait = tcp
                .read_timeout()
                .ok()
                .flatten()
                .unwrap_or(HANDSHAKE_TIMEOUT);
            warn!(%peer, "page server: closing a connection before its {stage} ended: the client sent nothing for {wait:?}")
        }
        _ => warn!(%peer, "page server: closing a connection before its {stage} ended: {e}"),
    }
}

/// Why a request failed: answered with an `Error` reply, or fatal for the
/// connection.
enum Fail {
    Reply(ErrorCode, String),
    Io(io::Error),
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Fail {
        Fail::Io(e)
    }
}

impl From<ImageError> for Fail {
    fn from(e: ImageError) -> Fail {
        use ImageError as E;
        let code = match &e {
            E::NoSuchCheckpoint { .. }
            | E::NoCheckpoints { .. }
            | E::LatestMissing { .. }
            | E::RunNotInPack { .. } => ErrorCode::NotFound,
            E::Symlink { .. } | E::NotAFile { .. } | E::UnsafeName { .. } => ErrorCode::Refused,
            E::CorruptManifest { .. }
            | E::CorruptPack { .. }
            | E::PageChecksum { .. }
            | E::ContentChecksum { .. }
            | E::BrokenChain { .. }
            | E::NewerFormat { .. }
            | E::CorruptLatest { .. } => ErrorCode::Corrupt,
            _ => ErrorCode::Internal,
        };
        Fail::Reply(code, e.to_string())
    }
}

fn refuse(code: ErrorCode, message: impl Into<String>) -> Fail {
    Fail::Reply(code, message.into())
}

/// One connection.
struct Conn<'a> {
    shared: &'a Shared,
    peer: SocketAddr,
    reader: BufReader<Stream>,
    writer: BufWriter<Stream>,
    packs: HashMap<(u32, String), PackReader>,
    buf: Vec<u8>,
}

fn session(shared: &Shared, tcp: TcpStream, peer: SocketAddr) -> io::Result<()> {
    tcp.set_nodelay(true)?;
    tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    tcp.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let Some(stream) = open(shared, tcp, peer)? else {
        return Ok(());
    };
    let mut conn = Conn {
        shared,
        peer,
        reader: BufReader::with_capacity(64 << 10, stream.try_clone()?),
        writer: BufWriter::with_capacity(1 << 20, stream.try_clone()?),
        packs: HashMap::new(),
        buf: Vec::new(),
    };
    match conn.handshake() {
        Ok(true) => {}
        Ok(false) => return Ok(()),
        Err(e) => {
            log_handshake_failure(peer, stream.tcp(), "authentication", &e);
            return Ok(());
        }
    }
    stream.tcp().set_read_timeout(Some(IDLE_TIMEOUT))?;
    conn.serve_requests()
}

impl Conn<'_> {
    /// Greeting and authentication. `Ok(false)`: the client was refused.
    fn handshake(&mut self) -> io::Result<bool> {
        let peer = self.peer;
        match protocol::read_greeting(&mut self.reader)? {
            None => {
                warn!(%peer, "page server: a client that does not speak the page server protocol connected (wrong magic); closing");
                return Ok(false);
            }
            Some(v) if v != protocol::PROTOCOL_VERSION => {
                protocol::write_greeting(&mut self.writer, protocol::PROTOCOL_VERSION)?;
                self.writer.flush()?;
                warn!(%peer, "page server: refused a client speaking protocol version {v}; this server speaks version {}: run the same stasis version on both machines", protocol::PROTOCOL_VERSION);
                return Ok(false);
            }
            Some(_) => {}
        }
        protocol::write_greeting(&mut self.writer, protocol::PROTOCOL_VERSION)?;
        self.writer.flush()?;

        let Some(client_nonce) =
            self.handshake_frame::<{ protocol::NONCE_LEN }>(kind::CLIENT_HELLO)?
        else {
            return Ok(false);
        };
        let server_nonce = protocol::nonce()?;
        let token = &self.shared.token;
        let mut hello = server_nonce.to_vec();
        hello.extend_from_slice(&protocol::proof(
            token,
            "server",
            &client_nonce,
            &server_nonce,
        ));
        protocol::write_frame(&mut self.writer, kind::SERVER_HELLO, &hello)?;
        self.writer.flush()?;

        let Some(client_proof) =
            self.handshake_frame::<{ protocol::PROOF_LEN }>(kind::CLIENT_PROOF)?
        else {
            warn!(%peer, "page server: a client left without proving it has the token (it may hold another token: check --token-file)");
            return Ok(false);
        };
        if !protocol::check_proof(token, "client", &client_nonce, &server_nonce, &client_proof) {
            warn!(%peer, "page server: refused a client with a wrong token; closing the connection");
            self.send_error(ErrorCode::Auth, protocol::TOKEN_REFUSED)?;
            self.writer.flush()?;
            return Ok(false);
        }
        protocol::write_frame(&mut self.writer, kind::AUTH_OK, &[])?;
        self.writer.flush()?;
        debug!(%peer, "page server: client authenticated");
        Ok(true)
    }

    /// Reads a handshake frame of kind `k` with an `N`-byte payload.
    /// `Ok(None)` if the client left or sent something else (logged).
    fn handshake_frame<const N: usize>(&mut self, k: u32) -> io::Result<Option<[u8; N]>> {
        let peer = self.peer;
        let Some((got, len)) = protocol::read_header(&mut self.reader)? else {
            info!(%peer, "page server: client left during authentication (it may have refused this server's token)");
            return Ok(None);
        };
        if got != k || len as usize != N {
            warn!(%peer, "page server: unexpected message {got} ({len} bytes) during authentication; closing");
            self.send_error(
                ErrorCode::BadRequest,
                "unexpected message during authentication",
            )?;
            self.writer.flush()?;
            return Ok(None);
        }
        let mut a = [0u8; N];
        self.reader.read_exact(&mut a)?;
        Ok(Some(a))
    }

    fn send_error(&mut self, code: ErrorCode, message: &str) -> io::Result<()> {
        protocol::write_frame(
            &mut self.writer,
            kind::ERROR,
            &protocol::encode_error(code, message),
        )
    }

    fn serve_requests(&mut self) -> io::Result<()> {
        loop {
            let Some((k, len)) = protocol::read_header(&mut self.reader)? else {
                return self.writer.flush();
            };
            if len > MAX_REQUEST_BYTES {
                let msg =
                    format!("request of {len} bytes is over the limit of {MAX_REQUEST_BYTES}");
                return self.violation(&msg);
            }
            let payload = protocol::read_payload(&mut self.reader, len, MAX_REQUEST_BYTES)?;
            let req = match Request::decode(k, &payload) {
                Ok(r) => r,
                Err(reason) => return self.violation(&reason.to_string()),
            };
            match self.answer(&req) {
                Ok(()) => {}
                Err(Fail::Reply(code, message)) => {
                    if matches!(code, ErrorCode::Corrupt | ErrorCode::Internal) {
                        warn!(peer = %self.peer, "page server: {message}");
                    } else {
                        debug!(peer = %self.peer, ?req, "page server: refused: {message}");
                    }
                    self.send_error(code, &message)?;
                }
                Err(Fail::Io(e)) => return Err(e),
            }
            // Pipelined requests already received are answered before flushing.
            if self.reader.buffer().is_empty() {
                self.writer.flush()?;
            }
        }
    }

    /// Answers a protocol violation and ends the connection.
    fn violation(&mut self, reason: &str) -> io::Result<()> {
        warn!(peer = %self.peer, "page server: protocol violation ({reason}); closing");
        self.send_error(ErrorCode::BadRequest, reason)?;
        self.writer.flush()
    }

    fn answer(&mut self, req: &Request) -> Result<(), Fail> {
        let image = &self.shared.image;
        match req {
            Request::Latest => {
                let n = image.latest()?.ok_or_else(|| {
                    refuse(
                        ErrorCode::NotFound,
                        format!(
                            "image directory {} has no committed checkpoint",
                            image.path().display()
                        ),
                    )
                })?;
                protocol::write_frame(&mut self.writer, kind::LATEST_REPLY, &n.to_le_bytes())?;
            }
            Request::Chain { n } => {
                let chain = load_chain(image, Some(*n))?;
                let mut e = protocol::Enc::default();
                e.u32(len_u32(chain.len())?);
                for cp in &chain {
                    e.u32(cp.number);
                }
                protocol::write_frame(&mut self.writer, kind::CHAIN_REPLY, &e.0)?;
            }
            Request::Files { n } => {
                let payload = list_files(&image.load(Some(*n))?)?;
                protocol::write_frame(&mut self.writer, kind::FILES_REPLY, &payload)?;
            }
            Request::File { n, name } => self.send_file(*n, name)?,
            Request::Skeleton { n, pack } => self.send_skeleton(*n, pack)?,
            Request::ReadRun { n, pack, run } => self.send_run(*n, pack, run)?,
        }
        Ok(())
    }

    fn send_file(&mut self, n: u32, name: &str) -> Result<(), Fail> {
        let cp = self.shared.image.load(Some(n))?;
        let mut file = open_servable(&cp, name)?;
        let size = file.metadata()?.len();
        if size > protocol::MAX_FILE_BYTES {
            return Err(refuse(
                ErrorCode::TooLarge,
                format!(
                    "file {name} of checkpoint {n} is {size} bytes, more than the limit of {}",
                    protocol::MAX_FILE_BYTES
                ),
            ));
        }
        // size + 8 <= MAX_REPLY_BYTES, checked just above.
        protocol::write_header(&mut self.writer, kind::FILE_DATA, len_u32(size + 8)?)?;
        // From here on the reply is under way: any failure must end the
        // connection (the client then sees a truncated reply, an error).
        let mut hasher = Xxh3Default::new();
        let mut left = size;
        self.buf.resize(1 << 20, 0);
        while left > 0 {
            let want = usize::try_from(left.min(1 << 20)).unwrap_or(1 << 20);
            let got = file.read(&mut self.buf[..want])?;
            if got == 0 {
                return Err(Fail::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("file {name} of checkpoint {n} shrank while it was sent"),
                )));
            }
            hasher.update(&self.buf[..got]);
            self.writer.write_all(&self.buf[..got])?;
            left -= got as u64;
        }
        self.writer.write_all(&hasher.digest().to_le_bytes())?;
        Ok(())
    }

    fn send_skeleton(&mut self, n: u32, pack: &str) -> Result<(), Fail> {
        let reader = self.pack(n, pack)?;
        let (size, tail_off) = (reader.size(), reader.data_end());
        let tail_len = size - tail_off;
        let payload_len = 16 + PACK_HEADER_LEN + tail_len;
        if payload_len > u64::from(MAX_REPLY_BYTES) {
            return Err(refuse(
                ErrorCode::TooLarge,
                format!("the index of pack {pack} of checkpoint {n} is too large to send ({tail_len} bytes)"),
            ));
        }
        let mut out = Vec::with_capacity(usize::try_from(payload_len).unwrap_or(0));
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&tail_off.to_le_bytes());
        out.resize(usize::try_from(payload_len).unwrap_or(0), 0);
        let (head, tail) = out[16..].split_at_mut(4096);
        let path = reader.path().display().to_string();
        let file = reader.file();
        read_at(file, head, 0, &path)?;
        read_at(file, tail, tail_off, &path)?;
        protocol::write_frame(&mut self.writer, kind::SKELETON_REPLY, &out)?;
        Ok(())
    }

    fn send_run(&mut self, n: u32, pack: &str, run: &RunEntry) -> Result<(), Fail> {
        if run.npages == 0 || run.npages > MAX_RUN_PAGES {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!(
                    "a run of {} pages is invalid (1..={MAX_RUN_PAGES})",
                    run.npages
                ),
            ));
        }
        let len = usize::try_from(run.len()).unwrap_or(usize::MAX);
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(len, 0);
        let read = self
            .pack(n, pack)
            .and_then(|r| Ok(r.read_run(run, &mut buf)?));
        let sent = read.and_then(|()| {
            protocol::write_header(&mut self.writer, kind::RUN_DATA, len_u32(8 + run.len())?)?;
            self.writer.write_all(&run.checksum.to_le_bytes())?;
            self.writer.write_all(&buf)?;
            Ok(())
        });
        self.buf = buf;
        sent
    }

    /// The validated pack `name` of checkpoint `n` (cached per connection).
    fn pack(&mut self, n: u32, name: &str) -> Result<&PackReader, Fail> {
        let key = (n, name.to_string());
        if !self.packs.contains_key(&key) {
            if !protocol::is_servable_name(name) {
                return Err(refused_name(n, name));
            }
            let cp = self.shared.image.load(Some(n))?;
            let r = stasis_image::pack_refs(&cp.manifest)
                .find(|r| r.name == name)
                .ok_or_else(|| {
                    refuse(
                        ErrorCode::NotFound,
                        format!("checkpoint {n} has no page pack named {name:?}"),
                    )
                })?;
            let reader = cp.open_pack(r)?;
            if self.packs.len() >= PACK_CACHE {
                self.packs.clear();
            }
            self.packs.insert(key.clone(), reader);
        }
        self.packs
            .get(&key)
            .ok_or_else(|| refuse(ErrorCode::Internal, "pack cache lost an entry"))
    }
}

fn len_u32(n: impl TryInto<u32>) -> Result<u32, Fail> {
    n.try_into()
        .map_err(|_| refuse(ErrorCode::TooLarge, "reply too large"))
}

fn refused_name(n: u32, name: &str) -> Fail {
    refuse(
        ErrorCode::Refused,
        format!("{name:?} is not a file name the page server serves from checkpoint {n} (plain names not starting with '.' only)"),
    )
}

fn read_at(file: &File, buf: &mut [u8], off: u64, path: &str) -> Result<(), Fail> {
    file.read_exact_at(buf, off).map_err(|e| {
        refuse(
            ErrorCode::Internal,
            format!("cannot read {path} at offset {off}: {e}"),
        )
    })
}

/// Opens file `name` of a checkpoint: a plain, non-hidden name, never
/// through a symbolic link, a regular file only.
fn open_servable(cp: &Checkpoint, name: &str) -> Result<File, Fail> {
    let n = cp.number;
    if !protocol::is_servable_name(name) {
        return Err(refused_name(n, name));
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(cp.dir().join(name))
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refuse(
                ErrorCode::Refused,
                format!("file {name} of checkpoint {n} is a symbolic link: the page server does not follow links"),
            ),
            Some(libc::ENOENT) => refuse(
                ErrorCode::NotFound,
                format!("checkpoint {n} has no file named {name:?}"),
            ),
            _ => refuse(
                ErrorCode::Internal,
                format!("cannot open file {name} of checkpoint {n}: {e}"),
            ),
        })?;
    if !file.metadata()?.is_file() {
        return Err(refuse(
            ErrorCode::Refused,
            format!("{name} in checkpoint {n} is not a regular file"),
        ));
    }
    Ok(file)
}

/// Payload of a `Files` reply: the servable regular files of a checkpoint.
fn list_files(cp: &Checkpoint) -> Result<Vec<u8>, Fail> {
    let mut files = Vec::new();
    let dir = cp.dir();
    let io_fail = |e: io::Error| {
        refuse(
            ErrorCode::Internal,
            format!("cannot list {}: {e}", dir.display()),
        )
    };
    for entry in std::fs::read_dir(dir).map_err(io_fail)? {
        let entry = entry.map_err(io_fail)?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        // `file_type` and `symlink_metadata` do not follow links.
        if !protocol::is_servable_name(&name) || !entry.file_type().map_err(io_fail)?.is_file() {
            continue;
        }
        files.push((name, entry.metadata().map_err(io_fail)?.len()));
    }
    if files.len() > MAX_FILES {
        return Err(refuse(
            ErrorCode::TooLarge,
            format!("checkpoint {} has more than {MAX_FILES} files", cp.number),
        ));
    }
    files.sort();
    let mut e = protocol::Enc::default();
    e.u32(len_u32(files.len())?);
    for (name, size) in &files {
        e.str(name);
        e.u64(*size);
    }
    Ok(e.0)
}
