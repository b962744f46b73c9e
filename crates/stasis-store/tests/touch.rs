//! Touch sets in an object store (`touch/NNNNNNNN/NAME`) against a real
//! S3 server (versitygw): written only for a committed checkpoint, read
//! with its chain, sealed under a key and bound to their name, ignored
//! when they do not open, deleted once their checkpoint is gone.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stasis_store::remote::S3Config;
use stasis_store::seal::SealOptions;
use stasis_store::{Key, Location, S3Image, StoreError};

/// versitygw on a free loopback port over a temporary directory with one
/// bucket, `bkt`; killed when dropped.
struct Server {
    root: tempfile::TempDir,
    port: u16,
    child: Child,
}

impl Server {
    fn start() -> Server {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/versitygw.sh");
        let o = Command::new("bash")
            .arg(&script)
            .arg("path")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "versitygw is not installed: run scripts/setup.sh"
        );
        let bin = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("bkt")).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(bin)
            .args(["--port", &format!("127.0.0.1:{port}"), "posix"])
            .arg(root.path())
            .env("ROOT_ACCESS_KEY", "k")
            .env("ROOT_SECRET_KEY", "s")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "versitygw did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Server { root, port, child }
    }

    fn image(&self, prefix: &str, key: Option<Key>) -> S3Image {
        let cfg = S3Config {
            endpoint: Some(format!("http://127.0.0.1:{}", self.port)),
            access_key: Some("k".into()),
            secret_key: Some("s".into()),
            region: Some("us-east-1".into()),
            allow_http: Some(true),
        };
        let loc = Location::parse(&format!("s3://bkt/{prefix}")).unwrap();
        S3Image::open_with(&loc, SealOptions { zstd: Some(1), key }, &cfg).unwrap()
    }

    /// The object `rel` of `prefix`, in the server's backing directory.
    fn object(&self, prefix: &str, rel: &str) -> PathBuf {
        self.root.path().join("bkt").join(prefix).join(rel)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Commits checkpoints 1 and 2 (2 over 1), each a directory of one file.
fn two_checkpoints(img: &S3Image) {
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("one"), b"some bytes").unwrap();
    img.upload(src.path(), (1, None), b"m1".to_vec(), &[])
        .unwrap();
    img.upload(src.path(), (2, Some(1)), b"m2".to_vec(), &[])
        .unwrap();
}

/// Checkpoint `n` and its chain, downloaded: its directory.
fn fetched(img: &S3Image, n: u32) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    img.download_chain(Some(n), &d.path().join("image"))
        .unwrap();
    let cp = d.path().join("image/checkpoints").join(format!("{n:08}"));
    (d, cp)
}

#[test]
fn touch_sets_go_with_committed_checkpoints_only() {
    let s = Server::start();
    let img = s.image("plain", None);
    two_checkpoints(&img);
    let window = b"the bytes of a touch-window file".to_vec();
    img.put_touch(1, "touch-window", &window).unwrap();
    img.put_touch(2, "touch-faults", b"faults of 2").unwrap();
    // Not for a checkpoint that is not committed, nor under another name.
    assert!(matches!(
        img.put_touch(3, "touch-window", b"x"),
        Err(StoreError::NoSuchCheckpoint { checkpoint: 3, .. })
    ));
    assert!(img.put_touch(1, "manifest.bin", b"x").is_err());
    // Read with the chain, each into its checkpoint's directory.
    let (_d, cp2) = fetched(&img, 2);
    assert_eq!(
        std::fs::read(cp2.join("touch-faults")).unwrap(),
        b"faults of 2"
    );
    assert!(!cp2.join("touch-window").exists());
    assert_eq!(
        std::fs::read(cp2.with_file_name("00000001").join("touch-window")).unwrap(),
        window
    );
    let listed = img.touch_files().unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    // Checkpoint 1 gone: its touch set goes, 2's stays.
    img.delete(1).unwrap();
    assert_eq!(img.sweep_touch().unwrap(), 1);
    assert!(!s.object("plain", "touch/00000001/touch-window").exists());
    assert!(s.object("plain", "touch/00000002/touch-faults").exists());
    assert_eq!(img.sweep_touch().unwrap(), 0);
}

#[test]
fn sealed_touch_sets_open_only_under_their_own_name() {
    let s = Server::start();
    let img = s.image("sealed", Some(Key::from_bytes([7; 32])));
    two_checkpoints(&img);
    let plain = b"STASISTS and the pages a process wrote".to_vec();
    img.put_touch(1, "touch-window", &plain).unwrap();
    img.put_touch(2, "touch-window", b"window of 2").unwrap();
    let one = s.object("sealed", "touch/00000001/touch-window");
    let two = s.object("sealed", "touch/00000002/touch-window");
    let stored = std::fs::read(&one).unwrap();
    assert!(
        !stored.windows(8).any(|w| w == b"STASISTS"),
        "stored in the clear"
    );
    let (_d, cp) = fetched(&img, 1);
    assert_eq!(std::fs::read(cp.join("touch-window")).unwrap(), plain);
    // 1's object copied over 2's: it does not open as 2's, and 2 is read
    // without a touch set (the checkpoint itself is whole).
    std::fs::copy(&one, &two).unwrap();
    let (_d, cp) = fetched(&img, 2);
    assert!(cp.join("one").exists());
    assert!(!cp.join("touch-window").exists());
    // An unsealed object in an encrypted store is not taken either.
    let mut unsealed = b"STSOBJ01".to_vec();
    unsealed.extend_from_slice(&[0; 8]);
    unsealed.extend_from_slice(b"planted");
    std::fs::write(&two, &unsealed).unwrap();
    let (_d, cp) = fetched(&img, 2);
    assert!(!cp.join("touch-window").exists());
    // Under another key, the checkpoint is refused (not only its touch set).
    let other = s.image("sealed", Some(Key::from_bytes([8; 32])));
    assert!(matches!(
        other.put_touch(1, "touch-window", b"x"),
        Err(StoreError::WrongKey { .. })
    ));
}
