//! The client side of the protocol: one authenticated connection to a page
//! server. Every reply is checked (length, kind, checksum) before use.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use stasis_image::{RunEntry, MAX_RUN_PAGES};
use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};

use crate::protocol::{self, kind, Request, MAX_NAME_BYTES, MAX_REPLY_BYTES};
pub use crate::protocol::{FileInfo, Skeleton};
use crate::tls::{self, ClientTls, Purpose, Stream, TlsError, Transport};
use crate::PageServerError;

/// Time to establish a TCP connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time any read or write may block: a hung server is an error.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Run requests a client keeps in flight when pipelining.
const WINDOW: usize = 32;

/// An authenticated connection to a page server. Requests on one client
/// are sequential; use one client per thread.
#[derive(Debug)]
pub struct Client {
    addr: String,
    reader: BufReader<Stream>,
    writer: BufWriter<Stream>,
    /// Set when an error left the stream at an unknown position.
    broken: bool,
}

impl Client {
    /// Connects to `addr` (`host:port`) over the process's transport
    /// ([`Transport::process_default`]: TLS unless the command was given
    /// `--insecure-plaintext`) and authenticates with `token`.
    /// A peer that does not answer is an error naming it after
    /// [`CONNECT_TIMEOUT`] (connecting) or [`IO_TIMEOUT`] (any read or
    /// write), never a hang.
    pub fn connect(addr: &str, token: &[u8]) -> Result<Client, PageServerError> {
        Self::connect_with(addr, token, Transport::process_default())
    }

    /// As [`connect`](Self::connect), over the given transport.
    pub fn connect_with(
        addr: &str,
        token: &[u8],
        transport: Transport,
    ) -> Result<Client, PageServerError> {
        Self::connect_within(addr, token, transport, IO_TIMEOUT)
    }

    fn connect_within(
        addr: &str,
        token: &[u8],
        transport: Transport,
        io_timeout: Duration,
    ) -> Result<Client, PageServerError> {
        if token.is_empty() {
            return Err(PageServerError::EmptyToken);
        }
        let connect_err = |error| PageServerError::Connect {
            addr: addr.to_string(),
            error,
        };
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address");
        let mut stream = None;
        for sa in addr.to_socket_addrs().map_err(connect_err)? {
            match TcpStream::connect_timeout(&sa, CONNECT_TIMEOUT) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let stream = stream.ok_or_else(|| connect_err(last))?;
        let setup = |s: &TcpStream| -> io::Result<()> {
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(io_timeout))?;
            s.set_write_timeout(Some(io_timeout))
        };
        setup(&stream).map_err(connect_err)?;
        let stream = secure(addr, token, transport, stream)?;
        let clones = stream
            .try_clone()
            .and_then(|r| Ok((r, stream.try_clone()?)));
        let (r, w) = clones.map_err(connect_err)?;
        let mut client = Client {
            addr: addr.to_string(),
            reader: BufReader::with_capacity(256 << 10, r),
            writer: BufWriter::with_capacity(64 << 10, w),
            broken: false,
        };
        client.handshake(token)?;
        Ok(client)
    }

    /// The address this client connected to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn handshake(&mut self, token: &[u8]) -> Result<(), PageServerError> {
        let during = "negotiating the protocol version";
        protocol::write_greeting(&mut self.writer, protocol::PROTOCOL_VERSION)
            .and_then(|()| self.writer.flush())
            .map_err(|e| self.net(during, e))?;
        match protocol::read_greeting(&mut self.reader) {
            Ok(Some(v)) if v == protocol::PROTOCOL_VERSION => {}
            Ok(Some(theirs)) => {
                return Err(PageServerError::VersionMismatch {
                    addr: self.addr.clone(),
                    ours: protocol::PROTOCOL_VERSION,
                    theirs,
                })
            }
            Ok(None) => {
                return Err(PageServerError::NotAPageServer {
                    addr: self.addr.clone(),
                    reason: "wrong greeting".into(),
                })
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(PageServerError::NotAPageServer {
                    addr: self.addr.clone(),
                    reason: "it closed the connection without a greeting".into(),
                })
            }
            Err(e) => return Err(self.net(during, e)),
        }

        let during = "authenticating";
        let client_nonce = protocol::nonce().map_err(|e| self.net(during, e))?;
        protocol::write_frame(&mut self.writer, kind::CLIENT_HELLO, &client_nonce)
            .and_then(|()| self.writer.flush())
            .map_err(|e| self.net(during, e))?;
        let hello = self.reply(kind::SERVER_HELLO, during)?;
        let parsed = protocol::decode_server_hello(&hello);
        let (server_nonce, server_proof) =
            parsed.map_err(|reason| self.protocol(during, reason))?;
        // The proof is sent even when the server's is wrong, so that a
        // server holding another token says so (and logs it); a server
        // that accepts it anyway is still refused.
        let server_ok =
            protocol::check_proof(token, "server", &client_nonce, &server_nonce, &server_proof);
        let proof = protocol::proof(token, "client", &client_nonce, &server_nonce);
        protocol::write_frame(&mut self.writer, kind::CLIENT_PROOF, &proof)
            .and_then(|()| self.writer.flush())
            .map_err(|e| self.net(during, e))?;
        match self.reply(kind::AUTH_OK, during) {
            Ok(_) if !server_ok => {
                self.broken = true;
                Err(PageServerError::ServerNotAuthenticated {
                    addr: self.addr.clone(),
                })
            }
            Ok(p) if p.is_empty() => Ok(()),
            Ok(_) => Err(self.protocol(during, "AuthOk with a payload")),
            Err(PageServerError::Remote {
                code: protocol::ErrorCode::Auth,
                ..
            }) => Err(PageServerError::TokenRefused {
                addr: self.addr.clone(),
            }),
            Err(_) if !server_ok => Err(PageServerError::ServerNotAuthenticated {
                addr: self.addr.clone(),
            }),
            Err(e) => Err(e),
        }
    }

    /// The newest committed checkpoint of the served image.
    pub fn latest(&mut self) -> Result<u32, PageServerError> {
        let during = "resolving the latest checkpoint";
        let p = self.call(&Request::Latest, kind::LATEST_REPLY, during)?;
        let n = protocol::decode_latest_reply(&p);
        n.map_err(|r| self.protocol(during, r))
    }

    /// Checkpoint `n` and its ancestors, nearest first (as `load_chain`).
    pub fn chain(&mut self, n: u32) -> Result<Vec<u32>, PageServerError> {
        let during = format!("listing the chain of checkpoint {n}");
        let p = self.call(&Request::Chain { n }, kind::CHAIN_REPLY, &during)?;
        let parsed = protocol::decode_chain_reply(n, &p);
        parsed.map_err(|r| self.protocol(&during, r))
    }

    /// The files of checkpoint `n` (plain regular files), by name.
    pub fn files(&mut self, n: u32) -> Result<Vec<FileInfo>, PageServerError> {
        let during = format!("listing the files of checkpoint {n}");
        let p = self.call(&Request::Files { n }, kind::FILES_REPLY, &during)?;
        let parsed = protocol::decode_files_reply(&p);
        parsed.map_err(|r| self.protocol(&during, r))
    }

    /// Reads file `name` of checkpoint `n` (checksum verified).
    pub fn file(&mut self, n: u32, name: &str) -> Result<Vec<u8>, PageServerError> {
        let mut out = Vec::new();
        self.file_to(n, name, &mut out)?;
        Ok(out)
    }

    /// Streams file `name` of checkpoint `n` into `out` and returns its
    /// size. The checksum is checked at the end: on error, discard what was
    /// written.
    pub fn file_to(
        &mut self,
        n: u32,
        name: &str,
        out: &mut dyn Write,
    ) -> Result<u64, PageServerError> {
        let during = format!("reading file {name} of checkpoint {n}");
        let req = Request::File {
            n,
            name: name.to_string(),
        };
        self.send(&req, &during)?;
        self.flush(&during)?;
        let len = self.reply_header(kind::FILE_DATA, &during)?;
        let size = u64::from(len)
            .checked_sub(8)
            .filter(|s| *s <= protocol::MAX_FILE_BYTES)
            .ok_or_else(|| self.protocol(&during, format!("file reply of {len} bytes")))?;
        let mut hasher = Xxh3Default::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut left = size;
        while left > 0 {
            let want = usize::try_from(left.min(1 << 20)).unwrap_or(1 << 20);
            self.read_exact(&mut buf[..want], &during)?;
            hasher.update(&buf[..want]);
            if let Err(e) = out.write_all(&buf[..want]) {
                // The rest of the reply is not read: the stream is lost.
                self.broken = true;
                return Err(PageServerError::Local {
                    action: "write the received file",
                    path: name.into(),
                    error: e,
                });
            }
            left -= want as u64;
        }
        let mut sum = [0u8; 8];
        self.read_exact(&mut sum, &during)?;
        if u64::from_le_bytes(sum) != hasher.digest() {
            return Err(PageServerError::FileChecksum {
                addr: self.addr.clone(),
                checkpoint: n,
                name: name.to_string(),
            });
        }
        Ok(size)
    }

    /// The header, index and trailer of page pack `pack` of checkpoint `n`.
    pub fn skeleton(&mut self, n: u32, pack: &str) -> Result<Skeleton, PageServerError> {
        let during = format!("reading the index of page pack {pack} of checkpoint {n}");
        let req = Request::Skeleton {
            n,
            pack: pack.to_string(),
        };
        let p = self.call(&req, kind::SKELETON_REPLY, &during)?;
        let parsed = protocol::decode_skeleton_reply(&p);
        parsed.map_err(|r| self.protocol(&during, r))
    }

    /// Reads run `run` of page pack `pack` of checkpoint `n` into `buf`
    /// (exactly `run.len()` bytes), checksum verified.
    pub fn read_run(
        &mut self,
        n: u32,
        pack: &str,
        run: &RunEntry,
        buf: &mut [u8],
    ) -> Result<(), PageServerError> {
        let during = run_during(n, pack, run);
        if buf.len() as u64 != run.len() {
            return Err(PageServerError::BadRequest {
                during,
                reason: format!("a buffer of {} bytes for a run of {}", buf.len(), run.len()),
            });
        }
        self.read_runs(n, pack, std::slice::from_ref(run), |_, data| {
            buf.copy_from_slice(data);
            Ok(())
        })
    }

    /// Reads runs of page pack `pack` of checkpoint `n`, pipelined, and
    /// gives each to `sink` in order once its checksum is verified.
    pub fn read_runs(
        &mut self,
        n: u32,
        pack: &str,
        runs: &[RunEntry],
        mut sink: impl FnMut(&RunEntry, &[u8]) -> Result<(), PageServerError>,
    ) -> Result<(), PageServerError> {
        for run in runs {
            if run.npages == 0 || run.npages > MAX_RUN_PAGES {
                return Err(PageServerError::BadRequest {
                    during: run_during(n, pack, run),
                    reason: format!("{} pages (must be 1..={MAX_RUN_PAGES})", run.npages),
                });
            }
        }
        let mut buf = Vec::new();
        let mut sent = 0;
        let mut received = 0;
        let mut result = Ok(());
        while received < runs.len() {
            let step = (|| {
                while sent < runs.len() && sent < received + WINDOW {
                    let run = &runs[sent];
                    let req = Request::ReadRun {
                        n,
                        pack: pack.to_string(),
                        run: *run,
                    };
                    self.send(&req, &run_during(n, pack, run))?;
                    sent += 1;
                }
                let run = &runs[received];
                let during = run_during(n, pack, run);
                self.flush(&during)?;
                buf.resize(usize::try_from(run.len()).unwrap_or(0), 0);
                let got = self.recv_run(n, pack, run, &mut buf, &during);
                received += 1;
                got?;
                sink(run, &buf)
            })();
            if let Err(e) = step {
                result = Err(e);
                break;
            }
        }
        // Replies to requests already sent must be consumed to keep the
        // connection usable after an error that did not break it.
        if result.is_err() && !self.broken {
            while received < sent {
                let during = run_during(n, pack, &runs[received]);
                buf.resize(usize::try_from(runs[received].len()).unwrap_or(0), 0);
                let r = self.recv_run(n, pack, &runs[received], &mut buf, &during);
                received += 1;
                if r.is_err() && self.broken {
                    break;
                }
            }
        }
        result
    }

    fn recv_run(
        &mut self,
        n: u32,
        pack: &str,
        run: &RunEntry,
        buf: &mut [u8],
        during: &str,
    ) -> Result<(), PageServerError> {
        let len = self.reply_header(kind::RUN_DATA, during)?;
        if u64::from(len) != 8 + run.len() {
            return Err(self.protocol(during, format!("a run reply of {len} bytes")));
        }
        let mut sum = [0u8; 8];
        self.read_exact(&mut sum, during)?;
        self.read_exact(buf, during)?;
        if u64::from_le_bytes(sum) != run.checksum || xxh3_64(buf) != run.checksum {
            return Err(PageServerError::RunChecksum {
                addr: self.addr.clone(),
                checkpoint: n,
                pack: pack.to_string(),
                vaddr: run.vaddr,
                npages: run.npages,
            });
        }
        Ok(())
    }

    /// Sends one request and reads its whole reply of kind `want`.
    fn call(&mut self, req: &Request, want: u32, during: &str) -> Result<Vec<u8>, PageServerError> {
        self.send(req, during)?;
        self.flush(during)?;
        self.reply(want, during)
    }

    fn send(&mut self, req: &Request, during: &str) -> Result<(), PageServerError> {
        if self.broken {
            return Err(self.unusable(during));
        }
        let name = match req {
            Request::File { name, .. } => Some(name),
            Request::Skeleton { pack, .. } | Request::ReadRun { pack, .. } => Some(pack),
            _ => None,
        };
        if let Some(name) = name.filter(|s| s.len() > MAX_NAME_BYTES) {
            return Err(PageServerError::BadRequest {
                during: during.to_string(),
                reason: format!(
                    "file name of {} bytes (at most {MAX_NAME_BYTES})",
                    name.len()
                ),
            });
        }
        let (k, payload) = req.encode();
        protocol::write_frame(&mut self.writer, k, &payload).map_err(|e| self.net(during, e))
    }

    fn flush(&mut self, during: &str) -> Result<(), PageServerError> {
        self.writer.flush().map_err(|e| self.net(during, e))
    }

    /// Reads a whole reply of kind `want` (an `Error` reply becomes
    /// [`PageServerError::Remote`]).
    fn reply(&mut self, want: u32, during: &str) -> Result<Vec<u8>, PageServerError> {
        let len = self.reply_header(want, during)?;
        let mut p = vec![0u8; len as usize];
        self.read_exact(&mut p, during)?;
        Ok(p)
    }

    /// Reads the header of a reply of kind `want` and returns its length
    /// (checked against the limit); handles `Error` replies.
    fn reply_header(&mut self, want: u32, during: &str) -> Result<u32, PageServerError> {
        if self.broken {
            return Err(self.unusable(during));
        }
        let (k, len) = match protocol::read_header(&mut self.reader) {
            Ok(Some(h)) => h,
            Ok(None) => {
                self.broken = true;
                return Err(PageServerError::Disconnected {
                    addr: self.addr.clone(),
                    during: during.to_string(),
                });
            }
            Err(e) => return Err(self.net(during, e)),
        };
        if len > MAX_REPLY_BYTES {
            return Err(self.protocol(during, format!("a reply of {len} bytes")));
        }
        if k == kind::ERROR {
            if len as usize > protocol::MAX_MESSAGE_BYTES + 6 {
                return Err(self.protocol(during, format!("an error reply of {len} bytes")));
            }
            let mut p = vec![0u8; len as usize];
            self.read_exact(&mut p, during)?;
            let (code, message) =
                protocol::decode_error(&p).map_err(|r| self.protocol(during, r))?;
            if matches!(
                code,
                protocol::ErrorCode::Auth
                    | protocol::ErrorCode::Busy
                    | protocol::ErrorCode::BadRequest
            ) {
                // The server closes the connection after these.
                self.broken = true;
            }
            return Err(PageServerError::Remote {
                addr: self.addr.clone(),
                during: during.to_string(),
                code,
                message,
            });
        }
        if k != want {
            return Err(self.protocol(during, format!("reply kind {k} instead of {want}")));
        }
        Ok(len)
    }

    fn read_exact(&mut self, buf: &mut [u8], during: &str) -> Result<(), PageServerError> {
        self.reader.read_exact(buf).map_err(|e| self.net(during, e))
    }

    /// A network error: the stream position is lost.
    fn net(&mut self, during: &str, e: io::Error) -> PageServerError {
        self.broken = true;
        PageServerError::net(&self.addr, during, e)
    }

    /// A protocol violation: the stream position is lost.
    fn protocol(&mut self, during: &str, reason: impl std::fmt::Display) -> PageServerError {
        self.broken = true;
        PageServerError::Protocol {
            addr: self.addr.clone(),
            during: during.to_string(),
            reason: reason.to_string(),
        }
    }

    fn unusable(&self, during: &str) -> PageServerError {
        PageServerError::Disconnected {
            addr: self.addr.clone(),
            during: format!("{during} (the connection was lost after an earlier error; reconnect)"),
        }
    }
}

/// Sets up the transport on a connected socket.
fn secure(
    addr: &str,
    token: &[u8],
    transport: Transport,
    tcp: TcpStream,
) -> Result<Stream, PageServerError> {
    if transport == Transport::InsecurePlaintext {
        return Ok(Stream::plain(tcp));
    }
    let config = ClientTls::new(token, Purpose::PageServer);
    match config.and_then(|c| tls::connect(tcp, &c)) {
        Ok(s) => Ok(s),
        Err(TlsError::Io(e)) => Err(PageServerError::net(addr, "setting up TLS", e)),
        Err(TlsError::KeyMismatch) => Err(PageServerError::TokenRefused {
            addr: addr.to_string(),
        }),
        Err(error) => Err(PageServerError::Tls {
            addr: addr.to_string(),
            error,
        }),
    }
}

fn run_during(n: u32, pack: &str, run: &RunEntry) -> String {
    format!(
        "reading pages {:#x}..{:#x} of page pack {pack} of checkpoint {n}",
        run.vaddr,
        run.end()
    )
}

#[cfg(test)]
mod tests {
    /// A peer that accepts the connection and then says nothing is an
    /// error naming it, in bounded time.
    #[test]
    fn a_peer_that_never_answers_is_a_timeout_naming_it() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let held = std::thread::spawn(move || l.accept().map(|(s, _)| s));
        let t0 = std::time::Instant::now();
        let e = super::Client::connect_within(
            &addr,
            b"token",
            super::Transport::Tls,
            super::Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(t0.elapsed() < super::Duration::from_secs(5));
        assert!(matches!(e, crate::PageServerError::Timeout { .. }), "{e:?}");
        assert!(e.to_string().contains(&addr), "{e}");
        drop(held.join());
    }

    /// The restorer moves one client into each filler thread.
    #[test]
    fn client_is_send() {
        fn is_send<T: Send>() {}
        is_send::<super::Client>();
    }
}
