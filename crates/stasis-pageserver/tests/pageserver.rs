//! The page server and its client over loopback, on small real images.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

use common::*;
use stasis_image::{load_chain, ImageDir, PackReader, RunEntry};
use stasis_pageserver::protocol::{self, kind, ErrorCode};
use stasis_pageserver::tls::Transport;
use stasis_pageserver::{
    fill_runs, mirror, Client, MirrorData, PageServerError, Server, ServerConfig,
};

/// A plaintext client (`--insecure-plaintext`), for the tests that look at
/// or meddle with the protocol's own bytes.
fn plain(addr: &str, token: &[u8]) -> Result<Client, PageServerError> {
    Client::connect_with(addr, token, Transport::InsecurePlaintext)
}

fn remote_code(e: &PageServerError) -> Option<ErrorCode> {
    match e {
        PageServerError::Remote { code, .. } => Some(*code),
        _ => None,
    }
}

#[test]
fn client_requests_return_the_servers_exact_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let addr = serve(&dir, TOKEN);
    let mut c = Client::connect(&addr, TOKEN).unwrap();

    assert_eq!(c.latest().unwrap(), 2);
    assert_eq!(c.chain(2).unwrap(), vec![2, 1]);
    assert_eq!(c.chain(1).unwrap(), vec![1]);

    let files = c.files(1).unwrap();
    let names: Vec<_> = files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "manifest.bin",
            "pages-100.pack",
            "pages-200.pack",
            "touch-set"
        ]
    );
    for f in &files {
        let path = cp_dir(&dir, 1).join(&f.name);
        assert_eq!(f.size, fs::metadata(&path).unwrap().len(), "{}", f.name);
        assert_eq!(
            c.file(1, &f.name).unwrap(),
            fs::read(&path).unwrap(),
            "{}",
            f.name
        );
    }

    let pack_path = cp_dir(&dir, 1).join("pages-100.pack");
    let raw = fs::read(&pack_path).unwrap();
    let sk = c.skeleton(1, "pages-100.pack").unwrap();
    assert_eq!(sk.size, raw.len() as u64);
    assert_eq!(sk.header, raw[..4096]);
    assert_eq!(sk.tail_off, 4096 + 301 * 4096);
    assert_eq!(sk.tail, raw[sk.tail_off as usize..]);

    // Runs: 300 pages split into 256 + 44, then one page elsewhere.
    let runs = PackReader::open(&pack_path, None).unwrap().runs().to_vec();
    assert_eq!(
        runs.iter().map(|r| r.npages).collect::<Vec<_>>(),
        [256, 44, 1]
    );
    let expected = [pages(1, 300), pages(2, 1)].concat();
    let mut buf = vec![0u8; runs[1].len() as usize];
    c.read_run(1, "pages-100.pack", &runs[1], &mut buf).unwrap();
    assert_eq!(buf, expected[256 * 4096..300 * 4096]);

    let mut got = Vec::new();
    c.read_runs(1, "pages-100.pack", &runs, |e, data| {
        got.push((e.vaddr, data.to_vec()));
        Ok(())
    })
    .unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(got.concat_data(), expected);
    assert_eq!(got[2].0, 0x2000_0000);
}

trait ConcatData {
    fn concat_data(&self) -> Vec<u8>;
}

impl ConcatData for Vec<(u64, Vec<u8>)> {
    fn concat_data(&self) -> Vec<u8> {
        self.iter().flat_map(|(_, d)| d.iter().copied()).collect()
    }
}

#[test]
fn many_pipelined_runs_come_back_in_order_and_errors_keep_the_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("img");
    let image = ImageDir::create_or_open(&dir).unwrap();
    // 500 separate one-page runs: more than the client's window.
    let runs: Vec<(u64, usize, u64)> = (0..500)
        .map(|i| (0x4000_0000 + i * 0x2000, 1, i + 10))
        .collect();
    write_cp(&image, None, &[(7, &runs)]);
    let addr = serve(&dir, TOKEN);
    let mut c = Client::connect(&addr, TOKEN).unwrap();
    let entries = packs(&dir, 1).remove(0).2;
    assert_eq!(entries.len(), 500);
    let mut seen = Vec::new();
    c.read_runs(1, "pages-7.pack", &entries, |e, data| {
        let i = (e.vaddr - 0x4000_0000) / 0x2000;
        assert_eq!(data, pages(i + 10, 1), "run {i}");
        seen.push(i);
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, (0..500).collect::<Vec<_>>());

    // A run that is not in the index, in the middle of a pipeline.
    let mut bogus = entries[..40].to_vec();
    bogus[20].checksum ^= 1;
    let mut n = 0;
    let e = c
        .read_runs(1, "pages-7.pack", &bogus, |_, _| {
            n += 1;
            Ok(())
        })
        .unwrap_err();
    assert_eq!(remote_code(&e), Some(ErrorCode::NotFound), "{e}");
    assert_eq!(n, 20);
    // The rest of the pipeline was drained: the connection still works.
    assert_eq!(c.latest().unwrap(), 1);
    let mut buf = vec![0u8; 4096];
    c.read_run(1, "pages-7.pack", &entries[499], &mut buf)
        .unwrap();
    assert_eq!(buf, pages(509, 1));
}

#[test]
fn mirror_full_is_byte_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let addr = serve(&dir, TOKEN);
    let dest = tmp.path().join("mirror");
    let last = Mutex::new((0u64, 0u64));
    let progress = |done: u64, total: u64| {
        let mut l = last.lock().unwrap();
        assert!(done >= l.0 && done <= total);
        *l = (done, total);
    };
    let m = mirror(&addr, TOKEN, None, &dest, MirrorData::Full, Some(&progress)).unwrap();
    assert_eq!(
        (m.checkpoint, m.chain.clone(), m.dir.clone()),
        (2, vec![2, 1], dest.clone())
    );
    assert_eq!(checkpoint_files(&dest), checkpoint_files(&dir));
    assert_eq!(checkpoint_files(&dest).len(), 6);
    let (done, total) = *last.lock().unwrap();
    assert_eq!(done, total);
    let sizes: u64 = checkpoint_files(&dir)
        .values()
        .map(|v| v.len() as u64)
        .sum();
    assert_eq!(total, sizes);

    assert_eq!(fs::read(dest.join("latest")).unwrap(), b"2\n");
    assert_eq!(mode(&dest), 0o700);
    assert_eq!(mode(&cp_dir(&dest, 1)), 0o700);
    assert_eq!(mode(&cp_dir(&dest, 1).join("pages-100.pack")), 0o600);
    let image = ImageDir::open(&dest).unwrap();
    assert_eq!(image.latest().unwrap(), Some(2));
    let chain = load_chain(&image, None).unwrap();
    assert_eq!(chain.iter().map(|c| c.number).collect::<Vec<_>>(), [2, 1]);
    for cp in &chain {
        for p in &cp.manifest.processes {
            cp.open_process_pack(p).unwrap().unwrap().verify().unwrap();
        }
    }

    // An older checkpoint alone.
    let dest1 = tmp.path().join("mirror1");
    fs::create_dir(&dest1).unwrap(); // an empty directory is fine
    let m1 = mirror(&addr, TOKEN, Some(1), &dest1, MirrorData::Full, None).unwrap();
    assert_eq!(m1.chain, vec![1]);
    assert_eq!(fs::read(dest1.join("latest")).unwrap(), b"1\n");
    let only1 = checkpoint_files(&dest1);
    assert!(
        only1.keys().all(|k| k.starts_with("00000001/")),
        "{:?}",
        only1.keys()
    );
    assert_eq!(only1.len(), 4);

    // A non-empty destination is refused and left alone.
    let e = mirror(&addr, TOKEN, None, &dest, MirrorData::Full, None).unwrap_err();
    assert!(matches!(e, PageServerError::DestNotEmpty { .. }), "{e}");
    assert_eq!(checkpoint_files(&dest), checkpoint_files(&dir));
}

#[test]
fn mirror_sparse_then_fill_runs_gives_identical_pages() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let addr = serve(&dir, TOKEN);
    let dest = tmp.path().join("sparse");
    let m = mirror(&addr, TOKEN, None, &dest, MirrorData::Sparse, None).unwrap();
    assert_eq!(m.chain, vec![2, 1]);

    let src = checkpoint_files(&dir);
    let before = checkpoint_files(&dest);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        src.keys().collect::<Vec<_>>()
    );
    for (k, v) in &before {
        assert_eq!(v.len(), src[k].len(), "{k}");
        if !k.ends_with(".pack") {
            assert_eq!(v, &src[k], "{k}");
        }
    }
    let big = cp_dir(&dest, 1).join("pages-100.pack");
    let meta = fs::metadata(&big).unwrap();
    assert!(
        meta.blocks() * 512 < meta.len() / 2,
        "not sparse: {} blocks",
        meta.blocks()
    );

    let mut c = Client::connect(&addr, TOKEN).unwrap();
    let image = ImageDir::open(&dest).unwrap();
    for n in [1, 2] {
        let cp = image.load(Some(n)).unwrap();
        for (name, _, runs) in packs(&dir, n) {
            let r = cp
                .manifest
                .processes
                .iter()
                .filter_map(|p| p.pack.as_ref())
                .find(|r| r.name == name)
                .unwrap();
            let reader = cp.open_pack(r).unwrap();
            assert_eq!(reader.runs(), runs.as_slice());
            // Holes read as zeros and fail their checksums.
            assert!(reader.verify().is_err());
            let path = cp.pack_path(r).unwrap();
            // Fill in two steps, out of order.
            let (a, b) = runs.split_at(runs.len() / 2);
            fill_runs(&mut c, n, &name, &path, b).unwrap();
            fill_runs(&mut c, n, &name, &path, a).unwrap();
            reader.verify().unwrap();
        }
    }
    assert_eq!(checkpoint_files(&dest), src);
    // Exact pages of the full checkpoint.
    let cp = image.load(Some(1)).unwrap();
    let p = &cp.manifest.processes[0];
    let reader = cp.open_process_pack(p).unwrap().unwrap();
    let mut buf = vec![0u8; 44 * 4096];
    reader.read_run(&reader.runs()[1], &mut buf).unwrap();
    assert_eq!(buf, pages(1, 300)[256 * 4096..]);
}

#[test]
fn a_wrong_token_is_refused_both_ways() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let addr = serve(&dir, TOKEN);

    // The honest server refuses a client with another token.
    let e = Client::connect(&addr, b"wrong token").unwrap_err();
    assert!(matches!(e, PageServerError::TokenRefused { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("refused the token: check --token-file"),
        "{e}"
    );

    // A server with another token is refused by the client even if it
    // accepts the client: here a fake server that says AuthOk to anyone.
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_addr = fake.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        let mut g = [0u8; 12];
        s.read_exact(&mut g).unwrap();
        protocol::write_greeting(&mut s, protocol::PROTOCOL_VERSION).unwrap();
        let mut hello = [0u8; 8 + 32];
        s.read_exact(&mut hello).unwrap();
        let client_nonce: [u8; 32] = hello[8..].try_into().unwrap();
        let server_nonce = [9u8; 32];
        let mut reply = server_nonce.to_vec();
        reply.extend(protocol::proof(
            b"another token",
            "server",
            &client_nonce,
            &server_nonce,
        ));
        protocol::write_frame(&mut s, kind::SERVER_HELLO, &reply).unwrap();
        let mut proof = [0u8; 8 + 32];
        s.read_exact(&mut proof).unwrap();
        protocol::write_frame(&mut s, kind::AUTH_OK, &[]).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        rest
    });
    let e = plain(&fake_addr, TOKEN).unwrap_err();
    assert!(
        matches!(e, PageServerError::ServerNotAuthenticated { .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("check --token-file"), "{e}");

    // A real server with another token: refused too (by the server or the
    // client, both with a message naming the token file).
    let other = serve(&dir, b"another token");
    let e = Client::connect(&other, TOKEN).unwrap_err();
    assert!(matches!(e, PageServerError::TokenRefused { .. }), "{e:?}");
}

#[test]
fn a_client_that_skips_authentication_gets_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let addr = serve_with(&dir, TOKEN, Transport::InsecurePlaintext);

    // Hand-made: greeting, then a request without the handshake.
    let mut s = TcpStream::connect(&addr).unwrap();
    protocol::write_greeting(&mut s, protocol::PROTOCOL_VERSION).unwrap();
    let (k, p) = protocol::Request::Latest.encode();
    protocol::write_frame(&mut s, k, &p).unwrap();
    assert_eq!(
        protocol::read_greeting(&mut s).unwrap(),
        Some(protocol::PROTOCOL_VERSION)
    );
    let (k, len) = protocol::read_header(&mut s).unwrap().unwrap();
    assert_eq!(k, kind::ERROR);
    let payload = protocol::read_payload(&mut s, len, 10_000).unwrap();
    assert_eq!(
        protocol::decode_error(&payload).unwrap().0,
        ErrorCode::BadRequest
    );
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());

    // Hand-made: a wrong proof gets the Auth error, then the connection closes.
    let mut s = TcpStream::connect(&addr).unwrap();
    protocol::write_greeting(&mut s, protocol::PROTOCOL_VERSION).unwrap();
    protocol::write_frame(&mut s, kind::CLIENT_HELLO, &[1u8; 32]).unwrap();
    assert_eq!(
        protocol::read_greeting(&mut s).unwrap(),
        Some(protocol::PROTOCOL_VERSION)
    );
    let (k, len) = protocol::read_header(&mut s).unwrap().unwrap();
    assert_eq!((k, len), (kind::SERVER_HELLO, 64));
    let hello = protocol::read_payload(&mut s, len, 64).unwrap();
    let server_nonce: [u8; 32] = hello[..32].try_into().unwrap();
    assert_eq!(
        hello[32..],
        protocol::proof(TOKEN, "server", &[1u8; 32], &server_nonce)
    );
    protocol::write_frame(&mut s, kind::CLIENT_PROOF, &[0u8; 32]).unwrap();
    let (k, len) = protocol::read_header(&mut s).unwrap().unwrap();
    assert_eq!(k, kind::ERROR);
    let (code, msg) =
        protocol::decode_error(&protocol::read_payload(&mut s, len, 10_000).unwrap()).unwrap();
    assert_eq!(
        (code, msg.as_str()),
        (ErrorCode::Auth, protocol::TOKEN_REFUSED)
    );
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());

    // Empty tokens are refused on both sides.
    assert!(matches!(
        Client::connect(&addr, b""),
        Err(PageServerError::EmptyToken)
    ));
    let e = Server::bind(ServerConfig {
        dir: dir.clone(),
        listen: "127.0.0.1:0".into(),
        token: vec![],
        transport: Transport::Tls,
    })
    .unwrap_err();
    assert!(matches!(e, PageServerError::EmptyToken), "{e}");

    // The server still serves honest clients.
    assert_eq!(plain(&addr, TOKEN).unwrap().latest().unwrap(), 2);
}

#[test]
fn another_protocol_version_is_refused_naming_both() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let addr = serve_with(&dir, TOKEN, Transport::InsecurePlaintext);

    // A client speaking version 99: the server answers with its version and closes.
    let mut s = TcpStream::connect(&addr).unwrap();
    let mut hello = protocol::MAGIC.to_vec();
    hello.extend(99u32.to_le_bytes());
    s.write_all(&hello).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    let mut expected = protocol::MAGIC.to_vec();
    expected.extend(protocol::PROTOCOL_VERSION.to_le_bytes());
    assert_eq!(rest, expected);

    // Wrong magic: closed without a word.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty());

    // A server speaking version 2: the client refuses it.
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_addr = fake.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for _ in 0..2 {
            let (mut s, _) = fake.accept().unwrap();
            let mut g = [0u8; 12];
            s.read_exact(&mut g).unwrap();
            protocol::write_greeting(&mut s, 2).unwrap();
        }
    });
    let e = plain(&fake_addr, TOKEN).unwrap_err();
    assert!(
        matches!(
            e,
            PageServerError::VersionMismatch {
                ours: 1,
                theirs: 2,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("version 2") && msg.contains("version 1"),
        "{msg}"
    );

    // Something that is not a page server at all.
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let http_addr = http.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let (mut s, _) = http.accept().unwrap();
        let _ = s.write_all(b"HTTP/1.0 400 Bad Request\r\n\r\n");
    });
    let e = plain(&http_addr, TOKEN).unwrap_err();
    assert!(matches!(e, PageServerError::NotAPageServer { .. }), "{e:?}");

    assert_eq!(plain(&addr, TOKEN).unwrap().latest().unwrap(), 2);
}

/// What a test proxy does to the bytes coming from the server.
#[derive(Clone, Copy)]
enum Meddle {
    /// Forward only the first N bytes, then cut both directions.
    CutAfter(usize),
    /// Flip one bit of byte N.
    Flip(usize),
}

/// A proxy for one connection that forwards everything from the client and
/// meddles with what comes from the server.
fn proxy(upstream: String, meddle: Meddle) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let (client, _) = l.accept().unwrap();
        let server = TcpStream::connect(upstream).unwrap();
        let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut c_in, &mut s_out);
        });
        let (mut s_in, mut c_out) = (server, client);
        let mut pos = 0;
        let mut buf = [0u8; 4096];
        loop {
            let want = match meddle {
                Meddle::CutAfter(limit) => (limit - pos).min(4096),
                Meddle::Flip(_) => 4096,
            };
            let n = match s_in.read(&mut buf[..want]) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Meddle::Flip(at) = meddle {
                if (pos..pos + n).contains(&at) {
                    buf[at - pos] ^= 1;
                }
            }
            if c_out.write_all(&buf[..n]).is_err() {
                break;
            }
            pos += n;
            if matches!(meddle, Meddle::CutAfter(limit) if pos >= limit) {
                break;
            }
        }
        let _ = c_out.shutdown(Shutdown::Both);
        let _ = s_in.shutdown(Shutdown::Both);
    });
    addr
}

/// Greeting, ServerHello, AuthOk: the bytes a server sends before replies.
const HANDSHAKE: usize = 12 + (8 + 64) + 8;

#[test]
fn the_client_checks_what_it_receives() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let addr = serve_with(&dir, TOKEN, Transport::InsecurePlaintext);
    let runs = packs(&dir, 1)
        .into_iter()
        .find(|p| p.0 == "pages-100.pack")
        .unwrap()
        .2;

    // A bit flipped in transit, inside the page data of a run.
    let p = proxy(addr.clone(), Meddle::Flip(HANDSHAKE + 16 + 5000));
    let mut c = plain(&p, TOKEN).unwrap();
    let mut buf = vec![0u8; runs[0].len() as usize];
    let e = c
        .read_run(1, "pages-100.pack", &runs[0], &mut buf)
        .unwrap_err();
    assert!(
        matches!(
            e,
            PageServerError::RunChecksum {
                checkpoint: 1,
                vaddr: 0x1000_0000,
                npages: 256,
                ..
            }
        ),
        "{e:?}"
    );

    // ... inside a file.
    let p = proxy(addr.clone(), Meddle::Flip(HANDSHAKE + 8 + 3));
    let mut c = plain(&p, TOKEN).unwrap();
    let e = c.file(1, "touch-set").unwrap_err();
    assert!(matches!(e, PageServerError::FileChecksum { .. }), "{e:?}");

    // ... in the server's proof: the client refuses the server.
    let p = proxy(addr.clone(), Meddle::Flip(12 + 8 + 32 + 1));
    let e = plain(&p, TOKEN).unwrap_err();
    assert!(
        matches!(e, PageServerError::ServerNotAuthenticated { .. }),
        "{e:?}"
    );
}

#[test]
fn a_connection_cut_in_the_middle_of_a_reply_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let addr = serve_with(&dir, TOKEN, Transport::InsecurePlaintext);
    let runs = packs(&dir, 1)
        .into_iter()
        .find(|p| p.0 == "pages-100.pack")
        .unwrap()
        .2;
    let handshake = HANDSHAKE;

    // Cut inside the data of the first run.
    let p = proxy(addr.clone(), Meddle::CutAfter(handshake + 16 + 1000));
    let mut c = plain(&p, TOKEN).unwrap();
    let mut buf = vec![0xEEu8; runs[0].len() as usize];
    let e = c
        .read_run(1, "pages-100.pack", &runs[0], &mut buf)
        .unwrap_err();
    assert!(matches!(e, PageServerError::Disconnected { .. }), "{e:?}");
    assert!(
        buf.iter().all(|&b| b == 0xEE),
        "a partial run reached the caller"
    );
    // The client knows the connection is gone.
    assert!(c.latest().is_err());

    // Pipelined: the first run arrives whole, the second is cut.
    let first = 16 + runs[0].len() as usize;
    let p = proxy(addr.clone(), Meddle::CutAfter(handshake + first + 100));
    let mut c = plain(&p, TOKEN).unwrap();
    let mut got = Vec::new();
    let e = c
        .read_runs(1, "pages-100.pack", &runs, |e, data| {
            got.push((e.vaddr, data.to_vec()));
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(e, PageServerError::Disconnected { .. }), "{e:?}");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, pages(1, 300)[..256 * 4096]);

    // Cut in a file reply (after its header).
    let p = proxy(addr.clone(), Meddle::CutAfter(handshake + 8 + 10));
    let mut c = plain(&p, TOKEN).unwrap();
    let e = c.file(1, "manifest.bin").unwrap_err();
    assert!(matches!(e, PageServerError::Disconnected { .. }), "{e:?}");

    // A sparse fill through a cut connection fails; a mirror too.
    let dest = tmp.path().join("m");
    let tls_addr = serve(&dir, TOKEN);
    mirror(&tls_addr, TOKEN, Some(1), &dest, MirrorData::Sparse, None).unwrap();
    let p = proxy(addr.clone(), Meddle::CutAfter(handshake + first + 100));
    let mut c = plain(&p, TOKEN).unwrap();
    let pack = cp_dir(&dest, 1).join("pages-100.pack");
    let e = fill_runs(&mut c, 1, "pages-100.pack", &pack, &runs).unwrap_err();
    assert!(matches!(e, PageServerError::Disconnected { .. }), "{e:?}");
}

#[test]
fn a_corrupt_pack_on_the_server_is_reported_not_sent() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let (name, path, runs) = packs(&dir, 1)
        .into_iter()
        .find(|p| p.0 == "pages-100.pack")
        .unwrap();
    // Flip one byte in the second run.
    let mut raw = fs::read(&path).unwrap();
    raw[runs[1].file_off as usize + 5] ^= 0x40;
    fs::write(&path, &raw).unwrap();
    let addr = serve(&dir, TOKEN);
    let mut c = Client::connect(&addr, TOKEN).unwrap();

    let mut buf = vec![0u8; runs[1].len() as usize];
    let e = c.read_run(1, &name, &runs[1], &mut buf).unwrap_err();
    assert_eq!(remote_code(&e), Some(ErrorCode::Corrupt), "{e}");
    assert!(e.to_string().contains("checksum"), "{e}");
    assert!(buf.iter().all(|&b| b == 0));
    // Other runs are fine, on the same connection.
    let mut buf = vec![0u8; runs[2].len() as usize];
    c.read_run(1, &name, &runs[2], &mut buf).unwrap();
    assert_eq!(buf, pages(2, 1));

    // A full mirror fails and leaves its destination as it found it.
    let dest = tmp.path().join("m");
    let e = mirror(&addr, TOKEN, Some(1), &dest, MirrorData::Full, None).unwrap_err();
    assert_eq!(remote_code(&e), Some(ErrorCode::Corrupt), "{e}");
    assert!(!dest.exists());
    fs::create_dir(&dest).unwrap();
    mirror(&addr, TOKEN, Some(1), &dest, MirrorData::Full, None).unwrap_err();
    assert_eq!(fs::read_dir(&dest).unwrap().count(), 0);
}

#[test]
fn names_outside_the_checkpoint_and_links_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let cp1 = cp_dir(&dir, 1);
    fs::write(tmp.path().join("x"), b"secret outside the image").unwrap();
    std::os::unix::fs::symlink(tmp.path().join("x"), cp1.join("link")).unwrap();
    std::os::unix::fs::symlink("manifest.bin", cp1.join("link2")).unwrap();
    fs::write(cp1.join(".hidden"), b"hidden").unwrap();
    fs::create_dir(cp1.join("sub")).unwrap();
    fs::write(cp1.join("sub").join("b"), b"nested").unwrap();
    let addr = serve(&dir, TOKEN);
    let mut c = Client::connect(&addr, TOKEN).unwrap();

    let names: Vec<_> = c.files(1).unwrap().into_iter().map(|f| f.name).collect();
    assert_eq!(
        names,
        [
            "manifest.bin",
            "pages-100.pack",
            "pages-200.pack",
            "touch-set"
        ]
    );
    for bad in [
        "../x", "../../x", "sub/b", "a/b", ".lock", ".hidden", "..", ".", "", "link", "link2",
        "sub",
    ] {
        let e = c.file(1, bad).unwrap_err();
        assert_eq!(remote_code(&e), Some(ErrorCode::Refused), "{bad:?}: {e}");
        let e = c.skeleton(1, bad).unwrap_err();
        assert!(
            matches!(
                remote_code(&e),
                Some(ErrorCode::Refused | ErrorCode::NotFound)
            ),
            "{bad:?}: {e}"
        );
    }
    let e = c.file(1, "nonexistent").unwrap_err();
    assert_eq!(remote_code(&e), Some(ErrorCode::NotFound), "{e}");
    let e = c.skeleton(1, "touch-set").unwrap_err();
    assert_eq!(remote_code(&e), Some(ErrorCode::NotFound), "{e}");
    let e = c.file(9, "manifest.bin").unwrap_err();
    assert_eq!(remote_code(&e), Some(ErrorCode::NotFound), "{e}");
    let e = c.file(1, &"n".repeat(300)).unwrap_err();
    assert!(matches!(e, PageServerError::BadRequest { .. }), "{e}");
    // The connection is still good after all these refusals.
    assert_eq!(c.file(1, "touch-set").unwrap(), b"0x10000000 0x10001000\n");

    // A mirror copies neither the links nor the hidden file nor the directory.
    let dest = tmp.path().join("m");
    mirror(&addr, TOKEN, Some(1), &dest, MirrorData::Full, None).unwrap();
    let mut got: Vec<_> = fs::read_dir(cp_dir(&dest, 1))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            "manifest.bin",
            "pages-100.pack",
            "pages-200.pack",
            "touch-set"
        ]
    );
}

#[test]
fn eight_clients_at_once_all_get_the_right_data() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let addr = serve(&dir, TOKEN);
    let src = checkpoint_files(&dir);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (addr, root, src) = (&addr, tmp.path(), &src);
                s.spawn(move || {
                    let dest = root.join(format!("m{i}"));
                    let data = if i % 2 == 0 {
                        MirrorData::Full
                    } else {
                        MirrorData::Sparse
                    };
                    mirror(addr, TOKEN, None, &dest, data, None).unwrap();
                    if data == MirrorData::Sparse {
                        let mut c = Client::connect(addr, TOKEN).unwrap();
                        for n in [1, 2] {
                            for (name, _, runs) in packs(&dest, n) {
                                let path = cp_dir(&dest, n).join(&name);
                                fill_runs(&mut c, n, &name, &path, &runs).unwrap();
                            }
                        }
                    }
                    assert_eq!(&checkpoint_files(&dest), src, "client {i}");
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[test]
fn bind_refuses_a_directory_that_is_not_an_image() {
    let tmp = tempfile::tempdir().unwrap();
    let e = Server::bind(ServerConfig {
        dir: tmp.path().to_path_buf(),
        listen: "127.0.0.1:0".into(),
        token: TOKEN.to_vec(),
        transport: Transport::Tls,
    })
    .unwrap_err();
    assert!(matches!(e, PageServerError::BadImage { .. }), "{e}");
    assert!(
        e.to_string().contains("not a stasis image directory"),
        "{e}"
    );
}

#[test]
fn fill_runs_refuses_runs_outside_the_page_data() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let addr = serve(&dir, TOKEN);
    let dest = tmp.path().join("m");
    mirror(&addr, TOKEN, Some(1), &dest, MirrorData::Sparse, None).unwrap();
    let pack = cp_dir(&dest, 1).join("pages-200.pack");
    let before = fs::read(&pack).unwrap();
    let mut c = Client::connect(&addr, TOKEN).unwrap();
    let bad = RunEntry {
        vaddr: 0x7f00_0000_0000,
        npages: 3,
        flags: 0,
        file_off: before.len() as u64 - 4096,
        checksum: 0,
    };
    let e = fill_runs(&mut c, 1, "pages-200.pack", &pack, &[bad]).unwrap_err();
    assert!(matches!(e, PageServerError::BadRequest { .. }), "{e}");
    assert_eq!(fs::read(&pack).unwrap(), before);
}

#[test]
fn a_full_server_says_it_is_busy_and_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let addr = serve(&dir, TOKEN);
    // Idle connections fill every slot (they are accepted in order).
    let idle: Vec<_> = (0..protocol::MAX_CONNECTIONS)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let e = Client::connect(&addr, TOKEN).unwrap_err();
    assert_eq!(remote_code(&e), Some(ErrorCode::Busy), "{e:?}");
    assert!(e.to_string().contains("busy"), "{e}");
    drop(idle);
    // The slots are freed as the server sees the idle clients leave.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match Client::connect(&addr, TOKEN) {
            Ok(mut c) => {
                assert_eq!(c.latest().unwrap(), 2);
                break;
            }
            Err(e) if std::time::Instant::now() < deadline => {
                assert_eq!(remote_code(&e), Some(ErrorCode::Busy), "{e:?}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("still refused: {e}"),
        }
    }
}

/// A proxy for one connection that forwards both ways and records what the
/// server sends.
fn recording_proxy(upstream: String) -> (String, std::sync::Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
    let rec = std::sync::Arc::clone(&seen);
    std::thread::spawn(move || {
        let (client, _) = l.accept().unwrap();
        let server = TcpStream::connect(upstream).unwrap();
        let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut c_in, &mut s_out);
            let _ = s_out.shutdown(Shutdown::Write);
        });
        let (mut s_in, mut c_out) = (server, client);
        let mut buf = [0u8; 65536];
        loop {
            let n = match s_in.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            rec.lock().unwrap().extend_from_slice(&buf[..n]);
            if c_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = c_out.shutdown(Shutdown::Both);
    });
    (addr, seen)
}

/// Whether any 32-byte window at a multiple of 512 bytes of `data` occurs
/// in `wire`.
fn leaks(data: &[u8], wire: &[u8]) -> bool {
    data.chunks(512)
        .map(|c| &c[..32.min(c.len())])
        .any(|needle| wire.windows(needle.len()).any(|w| w == needle))
}

/// Under TLS the pages never cross the wire as they are (the same read in
/// plaintext shows them, so the check can fail), and a bit flipped in
/// transit is refused by TLS before any byte reaches the caller.
#[test]
fn tls_keeps_the_pages_off_the_wire_and_refuses_tampering() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let runs = packs(&dir, 1)
        .into_iter()
        .find(|p| p.0 == "pages-100.pack")
        .unwrap()
        .2;
    let data = pages(1, 300);
    for transport in [Transport::Tls, Transport::InsecurePlaintext] {
        let addr = serve_with(&dir, TOKEN, transport);
        let (p, seen) = recording_proxy(addr);
        let mut c = Client::connect_with(&p, TOKEN, transport).unwrap();
        let mut buf = vec![0u8; runs[0].len() as usize];
        c.read_run(1, "pages-100.pack", &runs[0], &mut buf).unwrap();
        assert_eq!(buf, data[..buf.len()]);
        drop(c);
        let wire = seen.lock().unwrap().clone();
        assert!(wire.len() > buf.len(), "{} bytes seen", wire.len());
        assert_eq!(
            leaks(&buf, &wire),
            transport == Transport::InsecurePlaintext,
            "{transport:?}"
        );
    }

    let addr = serve(&dir, TOKEN);
    let p = proxy(addr, Meddle::Flip(20_000));
    let mut c = Client::connect(&p, TOKEN).unwrap();
    let mut buf = vec![0xEEu8; runs[0].len() as usize];
    let e = c
        .read_run(1, "pages-100.pack", &runs[0], &mut buf)
        .unwrap_err();
    assert!(
        !matches!(e, PageServerError::RunChecksum { .. }),
        "TLS let a flipped bit through: {e:?}"
    );
    assert!(
        buf.iter().all(|&b| b == 0xEE),
        "a tampered run reached the caller"
    );
}

/// A plaintext client of a TLS server, and a TLS client of a plaintext
/// server, are refused with a message naming --insecure-plaintext; the
/// servers go on serving clients of their own kind.
#[test]
fn tls_and_plaintext_ends_refuse_each_other_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = image(tmp.path());
    let tls = serve(&dir, TOKEN);
    let e = plain(&tls, TOKEN).unwrap_err();
    assert_eq!(remote_code(&e), Some(ErrorCode::Refused), "{e:?}");
    assert!(e.to_string().contains("--insecure-plaintext"), "{e}");
    assert!(e.to_string().contains("requires TLS"), "{e}");

    let clear = serve_with(&dir, TOKEN, Transport::InsecurePlaintext);
    let e = Client::connect(&clear, TOKEN).unwrap_err();
    assert!(matches!(e, PageServerError::Tls { .. }), "{e:?}");
    assert!(e.to_string().contains("--insecure-plaintext"), "{e}");

    assert_eq!(Client::connect(&tls, TOKEN).unwrap().latest().unwrap(), 2);
    assert_eq!(plain(&clear, TOKEN).unwrap().latest().unwrap(), 2);
}
