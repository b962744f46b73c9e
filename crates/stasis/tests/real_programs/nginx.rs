//! nginx (a master and two workers) serving static files: an 8 MiB file
//! and 200 small ones. Four clients download them over kept-alive
//! connections through the checkpoint, each body checked by its SHA-256.
//! After a plain or lazy restore the clients go on on their connections;
//! nginx's access log then has exactly one line per request the clients
//! completed. Every file is downloaded again after the restore, and nginx
//! serves new clients, then stops on SIGTERM (a graceful SIGQUIT would
//! wait out the send timeout of the restored connections whose clients
//! are gone, after a concurrent dump).

use crate::harness::*;
use crate::kv::Http;

use std::process::Command;

const SMALL: u64 = 200;

fn files() -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = (0..SMALL)
        .map(|i| {
            let len = 100 + usize::try_from(i * 997 % 20_000).expect("small");
            (format!("f{i}.txt"), value(i, len))
        })
        .collect();
    v.push(("big.bin".into(), value(424_242, 8 << 20)));
    v
}

fn config(dir: &std::path::Path, port: u16) -> String {
    let d = dir.display();
    format!(
        "daemon off;\nmaster_process on;\nworker_processes 2;\nuser root;\n\
         pid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log {d}/access.log;\n  keepalive_requests 1000000;\n\
           keepalive_timeout 300s;\n  client_body_temp_path {d}/tmp/body;\n\
           proxy_temp_path {d}/tmp/proxy;\n  fastcgi_temp_path {d}/tmp/fastcgi;\n\
           uwsgi_temp_path {d}/tmp/uwsgi;\n  scgi_temp_path {d}/tmp/scgi;\n\
           server {{ listen 127.0.0.1:{port}; root {d}/www; }}\n}}\n"
    )
}

fn log_lines(prog: &Prog) -> usize {
    std::fs::read_to_string(prog.path("access.log"))
        .unwrap_or_default()
        .lines()
        .count()
}

pub fn downloads(mode: Mode) {
    let port = free_port();
    let dir = Prog::dir("nginx");
    std::fs::create_dir_all(dir.path().join("www")).expect("www");
    std::fs::create_dir_all(dir.path().join("tmp")).expect("tmp");
    let files = files();
    for (name, data) in &files {
        std::fs::write(dir.path().join("www").join(name), data).expect("write file");
    }
    let conf = dir.path().join("nginx.conf");
    std::fs::write(&conf, config(dir.path(), port)).expect("nginx.conf");
    // Debian's nginx is in /usr/sbin, not on every user's PATH.
    let sbin = std::path::Path::new("/usr/sbin/nginx");
    let mut cmd = Command::new(if sbin.exists() {
        sbin
    } else {
        "nginx".as_ref()
    });
    cmd.arg("-c").arg(&conf).arg("-p").arg(dir.path());
    let mut prog = Prog::start("nginx", dir, cmd);
    prog.wait_port(port);
    prog.wait("two workers", || descendants_of(prog.pid) == 2);
    let sums: Vec<(String, String)> = files
        .iter()
        .map(|(n, d)| (n.clone(), sha256_hex(d)))
        .collect();
    let clients: Vec<Step> = (0..4u64)
        .map(|c| {
            let mut h = Http::connect(port).expect("connect to nginx");
            let sums = sums.clone();
            Box::new(move |i: u64| {
                // Every eighth request of client 0 is the big file.
                let k = if c == 0 && i.is_multiple_of(8) {
                    sums.len() - 1
                } else {
                    usize::try_from((i * 31 + c * 7) % SMALL).expect("small")
                };
                let (name, sum) = &sums[k];
                let (status, body) = h
                    .request("GET", &format!("/{name}"), b"")
                    .map_err(|e| e.to_string())?;
                if status != 200 || &sha256_hex(&body) != sum {
                    return Err(format!("/{name}: {status}, {} bytes, wrong", body.len()));
                }
                Ok(())
            }) as Step
        })
        .collect();
    let load = Load::start(clients);
    load.wait_beyond(
        &prog,
        &[0; 4],
        50,
        "50 downloads per client before the dump",
    );
    let fig = prog.checkpoint(mode);
    let at_dump = load.counts();
    if mode != Mode::Concurrent {
        prog.restore(mode);
    }
    load.wait_beyond(&prog, &at_dump, 50, "downloads after the dump");
    let done: u64 = load.finish().iter().sum();
    if mode == Mode::Concurrent {
        prog.kill();
        prog.restore(mode);
    } else {
        // One log line per completed request, none lost, none twice.
        let lines = u64::try_from(log_lines(&prog)).expect("small");
        assert_eq!(
            lines, done,
            "access log lines vs requests the clients completed"
        );
    }
    prog.wait("two workers after the restore", || {
        descendants_of(prog.pid) == 2
    });
    prog.lazy_done();
    let mut h = Http::connect(port).expect("connect to the restored nginx");
    for (name, sum) in &sums {
        let (status, body) = h.request("GET", &format!("/{name}"), b"").expect("GET");
        assert!(
            status == 200 && &sha256_hex(&body) == sum,
            "/{name} after the restore"
        );
    }
    let total: usize = files.iter().map(|f| f.1.len()).sum();
    eprintln!(
        "nginx {mode:?}: {done} downloads through the checkpoint, {} files ({} MiB) verified; \
         frozen {} us, image {} MiB",
        files.len(),
        total >> 20,
        fig.frozen_us,
        fig.bytes >> 20
    );
    prog.stop(libc::SIGTERM, 0);
}

/// The number of processes under `pid`.
fn descendants_of(pid: i32) -> usize {
    crate::common::descendants(pid).len()
}
