//! Every zdtm-style workload survives dump/restore byte for byte: twice in a
//! row (each dump kills the process, each restore brings it back at the same
//! PID), and with `--leave-running` (the process carries on, and the image
//! it left also restores), stop-the-world and `--concurrent`. These run in a
//! network namespace of their own, dumps and restores too: between a dump
//! and its restore the ports the tree's sockets had are free, and no other
//! test's `connect` can be given one of them there.

mod common;
use common::*;

/// Dump + restore twice, then the workload checks itself.
fn twice(name: &str, args: &[&str]) {
    let mut w = Workload::start_isolated(name, args);
    std::thread::sleep(std::time::Duration::from_millis(300));
    for round in 1..=2 {
        w.dump_and_reap();
        assert!(
            !alive(w.pid),
            "{name}: still alive after dump round {round}"
        );
        w.restore(&[]);
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    // Both checkpoints are in the image, and the first still restores later.
    let o = stasis()
        .args(["inspect", "-D"])
        .arg(w.images())
        .output()
        .unwrap();
    assert_ok(&o, "inspect");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("checkpoint 1") && text.contains("checkpoint 2 (latest)"),
        "{text}"
    );
    w.finish_pass();
}

/// Dump with --leave-running: the process carries on and passes; then the
/// image restores into a process that passes too. Files are not part of an
/// image, so the workload's files are put back as they were at the dump
/// (what a user restoring an old checkpoint does with their data).
fn leave_running(name: &str, args: &[&str]) {
    leave_running_with(name, args, &[]);
}

/// [`leave_running`] with extra dump flags (`--concurrent`: the memory is
/// copied from a copy-on-write snapshot while the tree runs on).
fn leave_running_with(name: &str, args: &[&str], flags: &[&str]) {
    let mut w = Workload::start_isolated(name, args);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut dump_args = vec!["--leave-running"];
    dump_args.extend_from_slice(flags);
    let o = w.dump(&dump_args);
    assert_ok(&o, "dump --leave-running");
    assert!(alive(w.pid), "{name}: --leave-running killed the process");
    let saved = w.dir.path().join("files-at-dump");
    copy_tree(&w.dir.path().join("work"), &saved.join("work"));
    std::fs::copy(w.dir.path().join("out.log"), saved.join("out.log")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    w.finish_pass();
    // The image of the instant of the dump restores as well.
    std::fs::remove_dir_all(w.dir.path().join("work")).unwrap();
    copy_tree(&saved.join("work"), &w.dir.path().join("work"));
    std::fs::copy(saved.join("out.log"), w.dir.path().join("out.log")).unwrap();
    w.restore(&[]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    w.finish_pass();
}

/// Dump + lazy restore twice: the workload runs on while its private
/// memory is mapped in on demand and streamed behind it; the second dump
/// waits for the first filler to finish. Each filler must end cleanly.
/// With `via_server`, the image is served by `stasis page-server` on
/// loopback and restored with `--from`.
fn twice_lazy(name: &str, args: &[&str], via_server: bool) {
    let mut w = Workload::start(name, args);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let stats = w.dir.path().join("lazy-stats.json");
    let stats_arg = stats.to_str().unwrap().to_string();
    let mut server = None;
    for round in 1..=2 {
        w.dump_and_reap();
        assert!(
            !alive(w.pid),
            "{name}: still alive after dump round {round}"
        );
        let _ = std::fs::remove_file(&stats);
        if via_server {
            let images = w.images();
            let s =
                server.get_or_insert_with(|| PageServer::start(&images, "s3cret-token-0123456789"));
            let o = stasis()
                .args(["restore", "--detach", "--lazy", "--lazy-stats", &stats_arg])
                .args(["--from", &s.addr, "--token-file"])
                .arg(&s.token_file)
                .output()
                .unwrap();
            assert_ok(
                &o,
                &format!(
                    "restore --lazy --from of {name} (round {round}; the page server ({}) logged:\n{})",
                    s.describe(),
                    s.log_text()
                ),
            );
            assert!(alive(w.pid), "{name}: not running after restore --from");
        } else {
            w.restore(&["--lazy", "--lazy-stats", &stats_arg]);
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        let s = wait_json_file(&stats, std::time::Duration::from_secs(60));
        assert!(s.get("error").is_none(), "{name}: filler failed: {s}");
        assert_eq!(s["aborted"], false, "{name}: {s}");
        assert!(s["processes"].as_u64().unwrap() >= 1, "{name}: {s}");
    }
    w.finish_pass();
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let t = to.join(e.file_name());
        let ft = e.file_type().unwrap();
        if std::os::unix::fs::FileTypeExt::is_socket(&ft) {
            // A socket file is not content: the restore binds it anew.
            continue;
        }
        if ft.is_symlink() {
            // A link is its target, which need not exist (ghosts).
            std::os::unix::fs::symlink(std::fs::read_link(e.path()).unwrap(), &t).unwrap();
        } else if ft.is_dir() {
            copy_tree(&e.path(), &t);
        } else if std::os::unix::fs::FileTypeExt::is_fifo(&ft) {
            let c = std::ffi::CString::new(t.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: mkfifo with a valid C string.
            let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
            assert_eq!(r, 0, "mkfifo {}", t.display());
        } else {
            std::fs::copy(e.path(), t).unwrap();
        }
    }
}

macro_rules! workload_tests {
    ($($name:ident: $bin:literal $(, $arg:literal)*;)*) => {
        mod twice { use super::*; $( #[test] fn $name() { twice($bin, &[$($arg),*]); } )* }
        mod leave_running { use super::*; $( #[test] fn $name() { leave_running($bin, &[$($arg),*]); } )* }
        mod concurrent { use super::*; $( #[test] fn $name() { leave_running_with($bin, &[$($arg),*], &["--concurrent"]); } )* }
        mod lazy { use super::*; $( #[test] fn $name() { twice_lazy($bin, &[$($arg),*], false); } )* }
        mod lazy_page_server { use super::*; $( #[test] fn $name() { twice_lazy($bin, &[$($arg),*], true); } )* }
    };
}

workload_tests! {
    heap: "heap", "64";
    stack_globals: "stack_globals";
    mappings: "mappings";
    fpu: "fpu";
    signals: "signals";
    files: "files";
    counter: "counter";
    restart_syscalls: "restart_syscalls";
    threads: "threads";
    tree: "tree";
    pipes: "pipes";
    anonfds: "anonfds";
    sockets: "sockets";
    notify_locks_timers: "notify_locks_timers";
    udp_queue: "udp_queue";
    udp6_queue: "udp6_queue";
    sparse_shm: "sparse_shm";
    attrs: "attrs";
    fown: "fown";
    caps: "caps";
    unix_states: "unix_states";
    unix_scm: "unix_scm";
    scm_kinds: "scm_kinds";
    fdtable_relay: "fdtable_relay";
    tcp_pending: "tcp_pending";
    sysv_parts: "sysv_parts";
    uffd: "uffd";
    fanotify_ghost: "fanotify_ghost";
    unix_pending: "unix_pending";
    netlink: "netlink";
    sockopts: "sockopts";
    stopped: "stopped";
    zombies: "zombies";
    pdeath: "pdeath";
    novdso: "novdso";
    tcp_states: "tcp_states";
    sock_filter: "sock_filter";
    ghosts: "ghosts";
    leases: "leases";
    pidfds: "pidfds";
    epoll_fds: "epoll_fds";
    advice: "advice";
    fdtable: "fdtable";
    shm_parts: "shm_parts";
    chroot: "chroot";
    strict: "strict";
    filters: "filters";
    fanotify: "fanotify";
    aio: "aio";
    unlinked_link: "unlinked_link";
    pty_hungup: "pty_hungup";
    pty_modes: "pty_modes";
    bpf_map: "bpf_map";
    packet: "packet";
    hugetlb: "hugetlb";
    io_uring: "io_uring";
    io_uring_issuer: "io_uring", "issuer";
    io_uring_sqpoll: "io_uring", "sqpoll";
    io_uring_shared: "io_uring", "shared";
    timens: "timens";
    mqueue_fds: "mqueue_fds";
    bpf_mmap: "bpf_mmap";
}

// ttyline sets the termios and window size of a virtual console and a
// serial line of the machine (/dev/tty9, /dev/ttyS0), which every run
// shares: its runs take turns (a run's set-up would read another's
// settings as the line's own, and its end put them back under another's
// checks).
static TTY_LINES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn tty_lines() -> std::sync::MutexGuard<'static, ()> {
    TTY_LINES.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn twice_ttyline() {
    let _turn = tty_lines();
    twice("ttyline", &[]);
}

#[test]
fn leave_running_ttyline() {
    let _turn = tty_lines();
    leave_running("ttyline", &[]);
}

#[test]
fn concurrent_ttyline() {
    let _turn = tty_lines();
    leave_running_with("ttyline", &[], &["--concurrent"]);
}

#[test]
fn lazy_ttyline() {
    let _turn = tty_lines();
    twice_lazy("ttyline", &[], false);
}

#[test]
fn lazy_page_server_ttyline() {
    let _turn = tty_lines();
    twice_lazy("ttyline", &[], true);
}

// ttyline_ctty's session has a virtual console (/dev/tty8) as its
// controlling terminal, with another group in the foreground (issue 17:
// refused until now).
#[test]
fn twice_ttyline_ctty() {
    let _turn = tty_lines();
    twice("ttyline_ctty", &[]);
}

#[test]
fn leave_running_ttyline_ctty() {
    let _turn = tty_lines();
    leave_running("ttyline_ctty", &[]);
}

#[test]
fn lazy_ttyline_ctty() {
    let _turn = tty_lines();
    twice_lazy("ttyline_ctty", &[], false);
}

// The same session holding its terminal only through /dev/tty, in the
// leader and in a member (issue 17: /dev/tty on a virtual console was
// refused): each fd comes back as /dev/tty, reaching the line.
#[test]
fn twice_ttyline_devtty() {
    let _turn = tty_lines();
    twice("ttyline_ctty", &["/dev/tty8", "devtty"]);
}

#[test]
fn leave_running_ttyline_devtty() {
    let _turn = tty_lines();
    leave_running("ttyline_ctty", &["/dev/tty8", "devtty"]);
}

#[test]
fn lazy_ttyline_devtty() {
    let _turn = tty_lines();
    twice_lazy("ttyline_ctty", &["/dev/tty8", "devtty"], false);
}

/// A dump of M alone (its session's leader, the root, outside the tree)
/// is refused by name, and both run on untouched.
#[test]
fn refuses_a_line_that_is_the_terminal_of_a_session_outside_the_tree() {
    let _turn = tty_lines();
    let mut w = Workload::start("ttyline_ctty", &[]);
    let m = descendants(w.pid)[0];
    let o = w
        .stasis()
        .args(["dump", "-t", &m.to_string(), "-D"])
        .arg(w.dir.path().join("m-images"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "dump of M alone: {err}");
    assert!(
        err.contains("is the controlling terminal of session")
            && err.contains("outside the dumped tree"),
        "{err}"
    );
    w.finish_pass();
}

// shm keeps a file in /dev/shm that the original deletes when it ends, so
// its image can only be restored while the original has not finished:
// it is in the `twice` matrix only.
#[test]
fn twice_shm() {
    twice("shm", &[]);
}

// big_content holds a deleted file, a memfd and a System V segment with
// 80 MiB of data each (issue 17: more than 64 MiB was refused, as their
// content went into the manifest; it is in the content pack now). It is
// in the `twice` matrix, and restored lazily from a page server (a sparse
// mirror must still fetch the content pack whole), not in every matrix:
// each run moves a quarter of a GiB.
#[test]
fn twice_big_content() {
    twice("big_content", &[]);
}

#[test]
fn lazy_page_server_big_content() {
    twice_lazy("big_content", &[], true);
}

// lease_break holds a write lease being broken: any open of that file
// waits for the break (up to lease-break-time, 45 s), and the
// leave-running matrix copies the workload's files while it runs. It is
// in the matrices that kill the workload first.
#[test]
fn twice_lease_break() {
    twice("lease_break", &[]);
}

#[test]
fn lazy_lease_break() {
    twice_lazy("lease_break", &[], false);
}

#[test]
fn lazy_page_server_lease_break() {
    twice_lazy("lease_break", &[], true);
}

// A fork snapshot leaves MADV_DONTFORK areas out (they are read while the
// tree is frozen instead); the default method (write-protection) does not
// fork. (`fork`: no MADV_WIPEONFORK area, which a fork snapshot refuses.)
#[test]
fn concurrent_fork_snapshot_advice() {
    leave_running_with(
        "advice",
        &["fork"],
        &["--concurrent", "--cow-method", "fork"],
    );
}

// cow checks that the pages a parent and its children share copy-on-write
// are shared again after a restore. A lazy restore gives each process its
// own pages (the filler serves each one's faults from its own image): there
// it checks the content only.
#[test]
fn twice_cow() {
    twice("cow", &[]);
}

#[test]
fn leave_running_cow() {
    leave_running("cow", &[]);
}

#[test]
fn concurrent_cow() {
    leave_running_with("cow", &[], &["--concurrent"]);
}

#[test]
fn lazy_cow() {
    twice_lazy("cow", &["noshare"], false);
}

#[test]
fn lazy_page_server_cow() {
    twice_lazy("cow", &["noshare"], true);
}
