//! The store's tests' real S3 server: versitygw (installed by
//! scripts/setup.sh) on a free loopback port over a temporary directory
//! with one bucket, `bkt`; killed when dropped.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stasis_store::remote::S3Config;
use stasis_store::seal::SealOptions;
use stasis_store::{Location, S3Image};

pub struct Server {
    pub root: tempfile::TempDir,
    pub port: u16,
    child: Child,
}

impl Server {
    pub fn start() -> Server {
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

    /// The store at `s3://bkt/PREFIX` with `seal`.
    pub fn image(&self, prefix: &str, seal: SealOptions) -> S3Image {
        let cfg = S3Config {
            endpoint: Some(format!("http://127.0.0.1:{}", self.port)),
            access_key: Some("k".into()),
            secret_key: Some("s".into()),
            region: Some("us-east-1".into()),
            allow_http: Some(true),
        };
        let loc = Location::parse(&format!("s3://bkt/{prefix}")).unwrap();
        S3Image::open_with(&loc, seal, &cfg).unwrap()
    }

    /// The object `rel` of `prefix`, in the server's backing directory.
    pub fn object(&self, prefix: &str, rel: &str) -> PathBuf {
        self.root.path().join("bkt").join(prefix).join(rel)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
