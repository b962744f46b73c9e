//! PostgreSQL under pgbench: a fresh cluster (initdb), pgbench's tables at
//! scale 2 (200 000 accounts) and a fixed table of 50 000 rows whose
//! checksum is known. The server runs as the `postgres` user (it refuses
//! root).
//!
//! Plain and lazy: pgbench's 4 clients run 600 TPC-B transactions each
//! through the checkpoint, on their connections; pgbench must end with
//! every transaction processed and none failed, the history table must
//! then have exactly one row per transaction, and the balances of
//! accounts, tellers and branches must each sum to the history's deltas.
//!
//! Concurrent: the server runs on after the dump and writes its data
//! directory, which the image does not hold (as with CRIU: file contents
//! are the file system's), and frees dynamic shared memory segments
//! (/dev/shm/PostgreSQL.N) that the image names: they are saved with
//! `dump --shm-file 'PostgreSQL.*'`, and the restore puts back the
//! missing ones (in every mode, as a user would). So the load during a concurrent
//! dump is pgbench's read-only one (-S), after a CHECKPOINT, with nothing
//! else connecting until the kill, and the restored server must find its
//! files as it left them. The write load is then run on the restored
//! server.
//!
//! In every mode the fixed table's checksum is the same after the restore,
//! and the server takes new connections and writes, then stops on SIGINT
//! (fast shutdown) with exit 0 (plain and lazy: see the end of `pgbench`).

use crate::common::*;
use crate::harness::*;

use std::path::Path;
use std::process::{Command, Stdio};

const CLIENTS: u64 = 4;
const TRANSACTIONS: u64 = 600;

/// The uid and gid of the `postgres` user.
fn postgres_user() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let o = Command::new("id")
            .arg(flag)
            .arg("postgres")
            .output()
            .expect("id");
        assert_ok(
            &o,
            "id postgres (is PostgreSQL installed? run scripts/setup.sh)",
        );
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .expect("a number")
    };
    (id("-u"), id("-g"))
}

/// A command of the server's own binaries (initdb, postgres), run as the
/// postgres user.
fn server_cmd(name: &str) -> Command {
    use std::os::unix::process::CommandExt;
    let found = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|v| v.path().join("bin").join(name))
        .find(|p| p.exists());
    let mut c = Command::new(found.unwrap_or_else(|| name.into()));
    let (uid, gid) = postgres_user();
    c.uid(uid).gid(gid);
    c
}

/// `psql -c QUERY`: its unaligned output.
fn sql(port: u16, query: &str) -> String {
    let o = Command::new("psql")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
        .args([
            "-d",
            "postgres",
            "-XAtq",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            query,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("running psql (run scripts/setup.sh)");
    assert_ok(&o, &format!("psql -c {query:?}"));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn num(port: u16, query: &str) -> i64 {
    sql(port, query).parse().expect("a number")
}

const FIXED_SUM: &str =
    "select count(*) || ' ' || md5(string_agg(g || ':' || m, ',' order by g)) from fixed";

/// The invariants of pgbench's TPC-B tables: every balance sums to the
/// history's deltas. Returns the number of history rows.
fn tpcb_consistent(port: u16, what: &str) -> i64 {
    let row = sql(
        port,
        "select (select count(*) from pgbench_history), \
         (select coalesce(sum(delta), 0) from pgbench_history), \
         (select sum(abalance) from pgbench_accounts), \
         (select sum(tbalance) from pgbench_tellers), \
         (select sum(bbalance) from pgbench_branches)",
    );
    let v: Vec<i64> = row.split('|').map(|x| x.parse().expect(&row)).collect();
    assert!(
        v[1] == v[2] && v[1] == v[3] && v[1] == v[4],
        "{what}: history count, deltas, account, teller, branch sums: {row}"
    );
    v[0]
}

fn run_pgbench(port: u16, args: &[&str], log: &Path) -> std::process::Child {
    Command::new("pgbench")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
        .args(args)
        .arg("postgres")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(log).expect("pgbench log"))
        .stderr(std::fs::File::create(log.with_extension("err")).expect("pgbench log"))
        .spawn()
        .expect("running pgbench (run scripts/setup.sh)")
}

/// Waits for pgbench; it must have processed `n` transactions, none failed.
/// A failure shows the server's last lines too (a backend's end is there).
fn pgbench_done(prog: &Prog, mut b: std::process::Child, log: &Path, n: u64) {
    let st = b.wait().expect("wait pgbench");
    let out = std::fs::read_to_string(log).unwrap_or_default();
    let err = std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
    let server = prog.tail();
    assert!(
        st.success(),
        "pgbench: {st}\n{out}\n{err}\nserver:\n{server}"
    );
    assert!(
        out.contains(&format!(
            "number of transactions actually processed: {n}/{n}"
        )),
        "pgbench:\n{out}\n{err}\nserver:\n{server}"
    );
    if let Some(l) = out
        .lines()
        .find(|l| l.starts_with("number of failed transactions"))
    {
        assert!(l.contains(": 0 "), "pgbench: {l}");
    }
}

fn start(mode: Mode) -> (Prog, u16) {
    let port = free_port();
    let dir = Prog::dir("postgres");
    let (uid, gid) = postgres_user();
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown");
    let data = dir.path().join("data");
    let o = server_cmd("initdb")
        .arg("-D")
        .arg(&data)
        .args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-N",
            "--no-locale",
            "-E",
            "UTF8",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("running initdb (run scripts/setup.sh)");
    assert_ok(&o, "initdb");
    let mut cmd = server_cmd("postgres");
    cmd.arg("-D")
        .arg(&data)
        .args(["-p", &port.to_string(), "-k"])
        .arg(dir.path())
        .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
        .args(["-c", "full_page_writes=off", "-c", "autovacuum=off"])
        .args(["-c", "shared_buffers=32MB", "-c", "max_connections=30"]);
    let prog = Prog::start(&format!("postgres-{mode:?}"), dir, cmd);
    prog.wait("psql connects", || {
        Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
            .args(["-XAtqc", "select 1", "postgres"])
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success())
    });
    (prog, port)
}

pub fn pgbench(mode: Mode) {
    let (mut prog, port) = start(mode);
    // Its dynamic shared memory segments: named in its shared memory,
    // mapped only while in use, freed when unused (by a server that runs
    // on after a concurrent dump, too). A restore puts back the missing.
    prog.dump_args = vec!["--shm-file".into(), "PostgreSQL.*".into()];
    let init = prog.path("init.log");
    let st = run_pgbench(port, &["-i", "-s", "2", "-q"], &init)
        .wait()
        .expect("pgbench -i");
    assert!(st.success(), "pgbench -i: {st}");
    sql(
        port,
        "create table fixed as select g, md5(g::text) as m from generate_series(1, 50000) g",
    );
    let fixed = sql(port, FIXED_SUM);
    let log = prog.path("pgbench.log");
    let total = CLIENTS * TRANSACTIONS;
    let (c, t) = (CLIENTS.to_string(), TRANSACTIONS.to_string());
    let fig;
    if mode == Mode::Concurrent {
        sql(port, "checkpoint");
        let history = tpcb_consistent(port, "before the dump");
        // pgbench keeps its connections (their backends are in the image)
        // until the server is killed, and no other client comes: a backend
        // that ended after the dump would free its PID for any process of
        // the host to take before the restore (seen twice on a busy host:
        // clone3 found it taken), and its statistics could free a dynamic
        // shared memory segment (/dev/shm/PostgreSQL.N) the image refers
        // to ("could not open shared memory segment" after the restore).
        let mut b = run_pgbench(
            port,
            &["-n", "-S", "-P", "1", "-c", &c, "-j", "2", "-T", "600"],
            &log,
        );
        let bench = KillOnDrop(i32::try_from(b.id()).expect("pid"));
        prog.wait("pgbench's clients connected, no other", || {
            sql(
                port,
                "select count(*) filter (where application_name = 'pgbench') || ' ' || \
                 count(*) filter (where application_name <> 'pgbench') \
                 from pg_stat_activity where backend_type = 'client backend'",
            ) == "4 1"
        });
        let progress = || {
            std::fs::read_to_string(log.with_extension("err"))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with("progress:") && !l.contains(" 0.0 tps"))
                .count()
        };
        let before = progress();
        fig = prog.checkpoint(mode);
        // The server ran on under the load: pgbench reports transactions
        // done after the dump.
        prog.wait("pgbench's progress after the dump", || {
            progress() >= before + 2
        });
        prog.kill();
        drop(bench);
        let _ = b.wait();
        prog.restore(mode);
        assert_eq!(tpcb_consistent(port, "after the restore"), history);
        let b = run_pgbench(port, &["-n", "-c", &c, "-j", "2", "-t", &t], &log);
        pgbench_done(&prog, b, &log, total);
        assert_eq!(
            tpcb_consistent(port, "after a load on the restored server"),
            history + i64::try_from(total).expect("small")
        );
    } else {
        let b = run_pgbench(port, &["-n", "-c", &c, "-j", "2", "-t", &t], &log);
        let _guard = KillOnDrop(i32::try_from(b.id()).expect("pid"));
        prog.wait("200 transactions before the dump", || {
            num(port, "select count(*) from pgbench_history") >= 200
        });
        fig = prog.checkpoint(mode);
        prog.restore(mode);
        pgbench_done(&prog, b, &log, total);
        assert_eq!(
            tpcb_consistent(port, "after the restore"),
            i64::try_from(total).expect("small"),
            "one history row per transaction pgbench completed"
        );
    }
    prog.lazy_done();
    assert_eq!(sql(port, FIXED_SUM), fixed, "the fixed table");
    sql(port, "insert into fixed values (50001, 'after')");
    assert_eq!(num(port, "select count(*) from fixed"), 50001);
    let size = num(port, "select pg_database_size('postgres')");
    eprintln!(
        "postgres {mode:?}: {} MiB database, fixed table {fixed}; frozen {} us, \
         {} processes, image {} MiB",
        size >> 20,
        fig.frozen_us,
        fig.processes,
        fig.bytes >> 20
    );
    prog.stop(libc::SIGINT, 0);
}
