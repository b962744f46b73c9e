//! Encryption in transit: TLS 1.3 (rustls) keyed by the shared token, for
//! the page server and the cluster protocol.
//!
//! # Keys
//!
//! There is no certificate authority and no certificate file: both ends
//! hold the token, and each derives the same two Ed25519 key pairs from it,
//! one for the server role and one for the client role, with HKDF-SHA256:
//!
//! ```text
//! prk  = HMAC-SHA256("stasis-tls 1", token)
//! seed = HMAC-SHA256(prk, purpose || 0x00 || role || 0x01)     role: "server" or "client"
//! ```
//!
//! where `purpose` names the protocol ([`Purpose`]), so a key of one
//! protocol is never accepted by the other. The keys travel as raw public
//! keys (RFC 7250, no X.509). The client accepts only the server key of its
//! token and presents the client key; the server requires that client key
//! (mutual authentication). A peer holding another token therefore fails
//! the handshake ([`TlsError::KeyMismatch`] on the client,
//! [`TlsError::PeerRefusedKey`] on the server, both naming `--token-file`).
//! Inside the TLS session the protocols run their own HMAC handshake as
//! before, so both ends still prove knowledge of the token.
//!
//! The token is the only secret: anyone holding it can impersonate either
//! end, and a short token can be guessed offline from a recorded handshake.
//! Use a random token (`head -c 32 /dev/urandom | base64`).
//!
//! # Plaintext
//!
//! [`Transport::InsecurePlaintext`] (the commands' `--insecure-plaintext`)
//! skips TLS; both ends must agree. A TLS server that sees a plaintext
//! greeting (its first byte is not a TLS handshake record) reports
//! [`TlsError::PlaintextPeer`] and the protocol answers it, in plaintext,
//! with an error naming the flag; a plaintext server that sees a TLS
//! hello answers with its plaintext greeting, which the TLS client reports
//! as [`TlsError::NotTls`].

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use hmac::{Hmac, Mac};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::AlwaysResolvesClientRawPublicKeys;
use rustls::crypto::{verify_tls13_signature_with_raw_key, CryptoProvider};
use rustls::pki_types::{
    CertificateDer, PrivatePkcs8KeyDer, ServerName, SubjectPublicKeyInfoDer, UnixTime,
};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::AlwaysResolvesServerRawPublicKeys;
use rustls::sign::CertifiedKey;
use rustls::{
    AlertDescription, CertificateError, ClientConnection, DigitallySignedStruct, DistinguishedName,
    ServerConnection, SignatureScheme, StreamOwned,
};
use sha2::Sha256;

/// The first byte of a TLS handshake record (a ClientHello starts with it).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// The server name the client asks for (no certificate carries it).
const SERVER_NAME: &str = "stasis";
/// How long [`refuse_tls_client`] waits for each read.
pub const REFUSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether a connection is encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// TLS 1.3 keyed by the token (the default).
    #[default]
    Tls,
    /// No encryption (`--insecure-plaintext`): the token still
    /// authenticates the peers, but anyone on the path reads the data.
    InsecurePlaintext,
}

static PROCESS_PLAINTEXT: AtomicBool = AtomicBool::new(false);

impl Transport {
    /// The transport chosen for this process (by the command's
    /// `--insecure-plaintext`), used where no transport is passed
    /// explicitly ([`crate::Client::connect`], the cluster protocol).
    pub fn process_default() -> Transport {
        if PROCESS_PLAINTEXT.load(Ordering::Relaxed) {
            Transport::InsecurePlaintext
        } else {
            Transport::Tls
        }
    }

    /// Sets [`process_default`](Self::process_default); called once by the
    /// command line before any connection.
    pub fn set_process_default(t: Transport) {
        PROCESS_PLAINTEXT.store(t == Transport::InsecurePlaintext, Ordering::Relaxed);
    }

    /// `InsecurePlaintext` if `plaintext`, else `Tls`.
    pub fn from_flag(plaintext: bool) -> Transport {
        if plaintext {
            Transport::InsecurePlaintext
        } else {
            Transport::Tls
        }
    }
}

/// Which protocol the keys are for (part of the key derivation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The page server protocol.
    PageServer,
    /// The cluster protocol (coordinator and agents).
    Cluster,
}

impl Purpose {
    fn label(self) -> &'static [u8] {
        match self {
            Purpose::PageServer => b"stasis page server",
            Purpose::Cluster => b"stasis cluster",
        }
    }
}

/// Why a TLS session could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The peer speaks plaintext (server side; nothing of it was consumed
    /// but the bytes the protocol reads to answer it).
    #[error("the peer speaks plaintext but this end requires TLS: drop --insecure-plaintext on the other end (or give it on both)")]
    PlaintextPeer,
    /// The peer answered a TLS hello with something that is not TLS.
    #[error("the peer does not speak TLS: it runs with --insecure-plaintext (give it on both ends or on neither), or it is not a stasis server")]
    NotTls,
    /// The server's key is not the one of our token.
    #[error("the peer's TLS key is not the one derived from this token: it holds another token (check --token-file on both sides), or it is not the right server")]
    KeyMismatch,
    /// The client refused our key, or presented another one.
    #[error("the peer refused this end's TLS key ({0}): it holds another token (check --token-file on both sides)")]
    PeerRefusedKey(String),
    /// The peer closed the connection during the handshake, without a
    /// word of TLS (an answer in plaintext is [`TlsError::NotTls`], another
    /// token [`TlsError::KeyMismatch`]).
    /// `after`: how long after this end began the handshake (a close
    /// right away after a long wait means this end began late; one after
    /// the server's handshake time, that its hello never reached it).
    #[error("the peer closed the connection before the TLS handshake ended, without an answer, {} ms after this end began it: a stasis server does so when it is overloaded, when it cannot start a thread for the connection, or when this end sent nothing within its handshake time (30 s), and its log says which; try again, and if it persists, check that the address is the server's", .after.as_millis())]
    ClosedInHandshake { after: std::time::Duration },
    /// A network error (timeouts included).
    #[error("{0}")]
    Io(#[source] io::Error),
    /// Any other TLS failure.
    #[error("TLS failed: {0}")]
    Tls(#[source] rustls::Error),
}

impl TlsError {
    fn from_io(e: io::Error, client: bool, began: std::time::Instant) -> TlsError {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            return TlsError::ClosedInHandshake {
                after: began.elapsed(),
            };
        }
        let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
            return TlsError::Io(e);
        };
        match tls {
            rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure) => {
                if client {
                    TlsError::KeyMismatch
                } else {
                    TlsError::PeerRefusedKey("it presented another key".into())
                }
            }
            rustls::Error::InvalidMessage(_) if client => TlsError::NotTls,
            rustls::Error::AlertReceived(
                a @ (AlertDescription::AccessDenied
                | AlertDescription::BadCertificate
                | AlertDescription::CertificateUnknown
                | AlertDescription::DecryptError),
            ) => TlsError::PeerRefusedKey(format!("alert {a:?}")),
            other => TlsError::Tls(other.clone()),
        }
    }

    /// Whether the failure says the peer holds another token.
    pub fn is_other_token(&self) -> bool {
        matches!(self, TlsError::KeyMismatch | TlsError::PeerRefusedKey(_))
    }
}

/// The keys derived from a token for one purpose.
struct Keys {
    server: Arc<CertifiedKey>,
    client: Arc<CertifiedKey>,
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes keys of any length: this cannot fail.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// The PKCS#8 (v1) encoding of an Ed25519 private key, before its 32-byte seed.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

fn derive_key(
    provider: &CryptoProvider,
    token: &[u8],
    purpose: Purpose,
    role: &[u8],
) -> Result<Arc<CertifiedKey>, TlsError> {
    let prk = hmac(b"stasis-tls 1", &[token]);
    let seed = hmac(&prk, &[purpose.label(), b"\0", role, b"\x01"]);
    let mut der = ED25519_PKCS8_PREFIX.to_vec();
    der.extend_from_slice(&seed);
    let key = provider
        .key_provider
        .load_private_key(PrivatePkcs8KeyDer::from(der).into())
        .map_err(TlsError::Tls)?;
    let spki = key
        .public_key()
        .ok_or(TlsError::Tls(rustls::Error::General(
            "an Ed25519 key without a public key".into(),
        )))?
        .as_ref()
        .to_vec();
    Ok(Arc::new(CertifiedKey::new(
        vec![CertificateDer::from(spki)],
        key,
    )))
}

impl Keys {
    fn derive(provider: &CryptoProvider, token: &[u8], purpose: Purpose) -> Result<Keys, TlsError> {
        Ok(Keys {
            server: derive_key(provider, token, purpose, b"server")?,
            client: derive_key(provider, token, purpose, b"client")?,
        })
    }
}

/// The cryptography TLS runs on: aws-lc's. A build without the `aws-lc`
/// feature (the fuzz targets', which only decode) has none.
#[cfg(feature = "aws-lc")]
fn provider() -> Result<Arc<CryptoProvider>, TlsError> {
    Ok(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
}

#[cfg(not(feature = "aws-lc"))]
fn provider() -> Result<Arc<CryptoProvider>, TlsError> {
    Err(TlsError::Tls(rustls::Error::General(
        "this build of stasis has no TLS (built without the aws-lc feature of stasis-pageserver)"
            .into(),
    )))
}

/// Accepts exactly one raw public key.
#[derive(Debug)]
struct Pinned {
    spki: Vec<u8>,
    provider: Arc<CryptoProvider>,
}

impl Pinned {
    fn check(&self, end_entity: &CertificateDer<'_>, others: &[CertificateDer<'_>]) -> bool {
        others.is_empty() && end_entity.as_ref() == self.spki.as_slice()
    }

    fn verify13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature_with_raw_key(
            message,
            &SubjectPublicKeyInfoDer::from(cert.as_ref()),
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

fn refused() -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure)
}

fn tls12() -> rustls::Error {
    rustls::Error::General("TLS 1.2 is not used".into())
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.check(end_entity, intermediates) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(refused())
        }
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(tls12())
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify13(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes()
    }
    fn requires_raw_public_keys(&self) -> bool {
        true
    }
}

impl ClientCertVerifier for Pinned {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if self.check(end_entity, intermediates) {
            Ok(ClientCertVerified::assertion())
        } else {
            Err(refused())
        }
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(tls12())
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify13(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes()
    }
    fn requires_raw_public_keys(&self) -> bool {
        true
    }
}

/// The server side's TLS configuration for one token (build it once).
#[derive(Debug, Clone)]
pub struct ServerTls(Arc<rustls::ServerConfig>);

impl ServerTls {
    /// The configuration of a server holding `token`.
    pub fn new(token: &[u8], purpose: Purpose) -> Result<ServerTls, TlsError> {
        let provider = provider()?;
        let keys = Keys::derive(&provider, token, purpose)?;
        let verifier = Pinned {
            spki: keys.client.cert[0].as_ref().to_vec(),
            provider: Arc::clone(&provider),
        };
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(TlsError::Tls)?
            .with_client_cert_verifier(Arc::new(verifier))
            .with_cert_resolver(Arc::new(AlwaysResolvesServerRawPublicKeys::new(
                keys.server,
            )));
        Ok(ServerTls(Arc::new(config)))
    }
}

/// The client side's TLS configuration for one token.
#[derive(Debug, Clone)]
pub struct ClientTls(Arc<rustls::ClientConfig>);

impl ClientTls {
    /// The configuration of a client holding `token`.
    pub fn new(token: &[u8], purpose: Purpose) -> Result<ClientTls, TlsError> {
        let provider = provider()?;
        let keys = Keys::derive(&provider, token, purpose)?;
        let verifier = Pinned {
            spki: keys.server.cert[0].as_ref().to_vec(),
            provider: Arc::clone(&provider),
        };
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(TlsError::Tls)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_client_cert_resolver(Arc::new(AlwaysResolvesClientRawPublicKeys::new(
                keys.client,
            )));
        Ok(ClientTls(Arc::new(config)))
    }
}

enum Session {
    Client(StreamOwned<ClientConnection, TcpStream>),
    Server(StreamOwned<ServerConnection, TcpStream>),
}

impl Session {
    /// Runs the handshake to its end. A read or write interrupted by a
    /// signal (`EINTR`: sockets with a timeout are not restarted, even
    /// after a mere stop and continue of the process) is tried again.
    fn handshake(&mut self) -> io::Result<()> {
        loop {
            let step = match self {
                Session::Client(s) if s.conn.is_handshaking() => s.conn.complete_io(&mut s.sock),
                Session::Server(s) if s.conn.is_handshaking() => s.conn.complete_io(&mut s.sock),
                _ => return Ok(()),
            };
            match step {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
                Ok(_) => {}
            }
        }
    }
}

impl Drop for Session {
    /// Says goodbye (`close_notify`), so the peer sees a clean end of the
    /// stream rather than a truncation; best effort, never blocking for long
    /// (the socket's write timeout bounds it).
    fn drop(&mut self) {
        match self {
            Session::Client(s) => {
                s.conn.send_close_notify();
                let _ = s.conn.write_tls(&mut s.sock);
            }
            Session::Server(s) => {
                s.conn.send_close_notify();
                let _ = s.conn.write_tls(&mut s.sock);
            }
        }
    }
}

/// A connection's byte stream: plain TCP, or a TLS session over it. Clones
/// ([`try_clone`](Self::try_clone)) share the session, so one can be read
/// and another written, from one thread at a time.
pub struct Stream {
    tcp: TcpStream,
    tls: Option<Arc<Mutex<Session>>>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("tcp", &self.tcp)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Stream {
    /// A plaintext stream.
    pub fn plain(tcp: TcpStream) -> Stream {
        Stream { tcp, tls: None }
    }

    /// The TCP socket under the stream (for timeouts and addresses; never
    /// read or write it directly under TLS).
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Whether the stream is encrypted.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Another handle on the same stream.
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(Stream {
            tcp: self.tcp.try_clone()?,
            tls: self.tls.clone(),
        })
    }

    fn session(&self) -> io::Result<MutexGuard<'_, Session>> {
        self.tls
            .as_ref()
            .map(|m| {
                m.lock()
                    .map_err(|_| io::Error::other("a TLS session's lock is poisoned"))
            })
            .unwrap_or_else(|| Err(io::Error::other("not a TLS stream")))
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.tls.is_none() {
            return self.tcp.read(buf);
        }
        match &mut *self.session()? {
            Session::Client(s) => s.read(buf),
            Session::Server(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.tls.is_none() {
            return self.tcp.write(buf);
        }
        match &mut *self.session()? {
            Session::Client(s) => s.write(buf),
            Session::Server(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.tls.is_none() {
            return self.tcp.flush();
        }
        match &mut *self.session()? {
            Session::Client(s) => s.flush(),
            Session::Server(s) => s.flush(),
        }
    }
}

/// Runs the client side of the handshake on `tcp` (whose timeouts bound
/// it) and returns the encrypted stream.
pub fn connect(tcp: TcpStream, tls: &ClientTls) -> Result<Stream, TlsError> {
    let began = std::time::Instant::now();
    let name = ServerName::try_from(SERVER_NAME)
        .map_err(|e| TlsError::Tls(rustls::Error::General(format!("server name: {e}"))))?;
    let conn = ClientConnection::new(Arc::clone(&tls.0), name).map_err(TlsError::Tls)?;
    let tcp2 = tcp.try_clone().map_err(TlsError::Io)?;
    let mut session = Session::Client(StreamOwned::new(conn, tcp2));
    session
        .handshake()
        .map_err(|e| TlsError::from_io(e, true, began))?;
    Ok(Stream {
        tcp,
        tls: Some(Arc::new(Mutex::new(session))),
    })
}

/// What the first byte a client sent says it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hello {
    /// A TLS ClientHello.
    Tls,
    /// Anything else (a plaintext greeting).
    Plain,
    /// Nothing: the client left.
    Closed,
}

/// Looks at the first byte a client sent, without consuming it (waiting
/// for it up to the socket's read timeout).
///
/// The wait is not cut short by a signal: with a read timeout set, the
/// kernel does not restart an interrupted `recv` (`EINTR`), not even after
/// the process was merely stopped and continued (`SIGSTOP`/`SIGCONT`, a
/// debugger attaching, a freezer). A server that gave up then closed the
/// connection of a client that had connected but not yet sent its hello,
/// which saw only the end of the stream ([`TlsError::ClosedInHandshake`]).
pub fn sniff(tcp: &TcpStream) -> io::Result<Hello> {
    let mut b = [0u8; 1];
    let n = loop {
        match tcp.peek(&mut b) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => break r?,
        }
    };
    Ok(match n {
        0 => Hello::Closed,
        _ if b[0] == TLS_HANDSHAKE_RECORD => Hello::Tls,
        _ => Hello::Plain,
    })
}

/// Answers a TLS client on a plaintext server with `greeting` (which its
/// TLS library reports as no TLS): reads what it sent first, so that closing
/// does not reset the connection before the answer is read, writes the
/// greeting and waits (at most [`REFUSE_WAIT`] for each read) for it to
/// leave.
pub fn refuse_tls_client(tcp: &TcpStream, greeting: &[u8]) -> io::Result<()> {
    tcp.set_read_timeout(Some(REFUSE_WAIT))?;
    tcp.set_write_timeout(Some(REFUSE_WAIT))?;
    let mut t = tcp;
    let mut hello = [0u8; 4096];
    loop {
        match t.read(&mut hello) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => break r.map(|_| ())?,
        }
    }
    t.write_all(greeting)?;
    tcp.shutdown(std::net::Shutdown::Write)?;
    io::copy(&mut t.take(1 << 16), &mut io::sink())?;
    Ok(())
}

/// Runs the server side of the handshake on `tcp` (whose timeouts bound
/// it). A client that speaks plaintext is [`TlsError::PlaintextPeer`] and
/// nothing of what it sent is consumed, so the protocol can answer it.
pub fn accept(tcp: TcpStream, tls: &ServerTls) -> Result<Stream, TlsError> {
    let began = std::time::Instant::now();
    match sniff(&tcp).map_err(TlsError::Io)? {
        Hello::Tls => {}
        Hello::Plain => return Err(TlsError::PlaintextPeer),
        Hello::Closed => {
            return Err(TlsError::ClosedInHandshake {
                after: began.elapsed(),
            })
        }
    }
    let conn = ServerConnection::new(Arc::clone(&tls.0)).map_err(TlsError::Tls)?;
    let tcp2 = tcp.try_clone().map_err(TlsError::Io)?;
    let mut session = Session::Server(StreamOwned::new(conn, tcp2));
    session
        .handshake()
        .map_err(|e| TlsError::from_io(e, false, began))?;
    Ok(Stream {
        tcp,
        tls: Some(Arc::new(Mutex::new(session))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(
        server_token: &'static [u8],
        client_token: &'static [u8],
    ) -> (Result<Stream, TlsError>, Result<Stream, TlsError>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let tls = ServerTls::new(server_token, Purpose::PageServer).unwrap();
            accept(s, &tls)
        });
        let tcp = TcpStream::connect(addr).unwrap();
        let tls = ClientTls::new(client_token, Purpose::PageServer).unwrap();
        let c = connect(tcp, &tls);
        (server.join().unwrap(), c)
    }

    /// The same token on both ends: bytes go both ways, and a clean end of
    /// the stream is seen as such.
    #[test]
    fn same_token_talks_and_ends_cleanly() {
        let (s, c) = pair(b"tok", b"tok");
        let (mut s, mut c) = (s.unwrap(), c.unwrap());
        assert!(s.is_tls() && c.is_tls());
        c.write_all(b"ping").unwrap();
        c.flush().unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
        let mut w = s.try_clone().unwrap();
        w.write_all(b"pong").unwrap();
        w.flush().unwrap();
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"pong");
        drop(c);
        assert_eq!(s.read(&mut b).unwrap(), 0);
    }

    /// Another token: the client says the server's key is not its token's,
    /// the server that its key was refused.
    #[test]
    fn another_token_is_refused_on_both_ends() {
        let (s, c) = pair(b"tok-a", b"tok-b");
        let c = c.unwrap_err();
        assert!(matches!(c, TlsError::KeyMismatch), "{c:?}");
        assert!(c.to_string().contains("--token-file"), "{c}");
        let s = s.unwrap_err();
        assert!(s.is_other_token(), "{s:?}");
        assert!(s.to_string().contains("--token-file"), "{s}");
    }

    /// A server that closes a connection once it has read the hello is
    /// reported as a close during the handshake, with how long after the
    /// client began it (which tells a client that began late from a hello
    /// the server never saw).
    #[test]
    fn a_close_during_the_handshake_says_when() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            // The whole hello (one write of a few hundred bytes): a close
            // with bytes unread would be a reset, not an end of stream.
            let mut b = [0u8; 16 << 10];
            assert!(s.read(&mut b).unwrap() > 0);
            std::thread::sleep(std::time::Duration::from_millis(300));
        });
        let tcp = TcpStream::connect(addr).unwrap();
        let tls = ClientTls::new(b"tok", Purpose::PageServer).unwrap();
        let e = connect(tcp, &tls).unwrap_err();
        server.join().unwrap();
        let TlsError::ClosedInHandshake { after } = e else {
            panic!("{e:?}");
        };
        assert!(after >= std::time::Duration::from_millis(300), "{after:?}");
        assert!(
            e.to_string()
                .contains(&format!("{} ms after", after.as_millis())),
            "{e}"
        );
    }

    /// The keys of one protocol are not accepted by the other.
    #[test]
    fn keys_differ_by_purpose_and_role() {
        let p = provider().unwrap();
        let a = derive_key(&p, b"t", Purpose::PageServer, b"server").unwrap();
        let b = derive_key(&p, b"t", Purpose::Cluster, b"server").unwrap();
        let c = derive_key(&p, b"t", Purpose::PageServer, b"client").unwrap();
        let a2 = derive_key(&p, b"t", Purpose::PageServer, b"server").unwrap();
        assert_eq!(a.cert, a2.cert);
        assert_ne!(a.cert, b.cert);
        assert_ne!(a.cert, c.cert);
    }

    /// A plaintext client is told apart without consuming its bytes; a TLS
    /// client answered in plaintext says the peer does not speak TLS.
    #[test]
    fn plaintext_and_tls_peers_are_told_apart() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let tls = ServerTls::new(b"tok", Purpose::PageServer).unwrap();
            let e = accept(s.try_clone().unwrap(), &tls).unwrap_err();
            let mut g = [0u8; 8];
            (&s).read_exact(&mut g).unwrap();
            (e, g)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"STASISPS").unwrap();
        let (e, g) = server.join().unwrap();
        assert!(matches!(e, TlsError::PlaintextPeer), "{e:?}");
        assert_eq!(&g, b"STASISPS");

        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            assert_eq!(sniff(&s).unwrap(), Hello::Tls);
            s.write_all(b"STASISPS\x01\0\0\0").unwrap();
        });
        let tcp = TcpStream::connect(addr).unwrap();
        let e = connect(tcp, &ClientTls::new(b"tok", Purpose::PageServer).unwrap()).unwrap_err();
        server.join().unwrap();
        assert!(matches!(e, TlsError::NotTls), "{e:?}");
    }
}
