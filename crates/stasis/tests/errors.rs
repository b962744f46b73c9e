//! Bad input gives a clear error, a non-zero exit, no panic, and leaves
//! nothing running that should not run.

mod common;
use common::*;

/// Dumps `pid` into `dir`, which must fail with `needle`, leaving each of
/// `pids` running and untraced.
fn dump_refused(pid: i32, dir: &std::path::Path, needle: &str, pids: &[i32]) {
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(dir)
        .output()
        .unwrap();
    assert_fails_with(&o, needle);
    for &p in pids {
        assert!(alive(p), "the refused process {p} must keep running");
        let stat = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap();
        assert!(stat.contains("TracerPid:\t0"), "left traced: {stat}");
    }
}

/// Waits (up to 20 s) until `ready` says the child (still running) has
/// set up what the dump must refuse, then checks the refusal
/// ([`dump_refused`]) and ends the child.
fn refused_once_ready(
    mut child: std::process::Child,
    dir: &std::path::Path,
    (waiting_for, ready): (&str, &dyn Fn(i32) -> bool),
    needle: &str,
) {
    let pid = child.id() as i32;
    let t0 = std::time::Instant::now();
    while !ready(pid) {
        assert!(
            t0.elapsed().as_secs() < 20 && child.try_wait().unwrap().is_none(),
            "waited in vain for {waiting_for}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    dump_refused(pid, dir, needle, &[pid]);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `python3 -c script`, quiet, with no inherited fds.
fn python(script: &str) -> std::process::Child {
    let mut c = std::process::Command::new("python3");
    c.args(["-c", script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    close_inherited_fds(&mut c);
    c.spawn().unwrap()
}

#[test]
fn dump_of_a_pid_that_does_not_exist() {
    let d = tempfile::tempdir().unwrap();
    let pid = unused_pid();
    let o = stasis()
        .args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(d.path().join("img"))
        .output()
        .unwrap();
    assert_fails_with(&o, "does not exist");
}

#[test]
fn dump_of_a_process_already_traced_leaves_it_untouched() {
    let mut w = Workload::start("counter", &[]);
    // Trace it ourselves: stasis cannot seize it then.
    // SAFETY: ptrace on our own child with integer arguments.
    let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, w.pid, 0, 0) };
    assert_eq!(r, 0, "seize: {}", std::io::Error::last_os_error());
    let o = w.dump(&[]);
    assert_fails_with(&o, "cannot trace");
    // SAFETY: detaching our own seize (a running tracee may be detached only
    // when stopped; interrupt first).
    unsafe {
        libc::ptrace(libc::PTRACE_INTERRUPT, w.pid, 0, 0);
        let mut st = 0;
        libc::waitpid(w.pid, &mut st, libc::__WALL);
        libc::ptrace(libc::PTRACE_DETACH, w.pid, 0, 0);
    }
    assert!(alive(w.pid));
    assert!(
        !w.images().join("checkpoints").exists()
            || std::fs::read_dir(w.images().join("checkpoints"))
                .unwrap()
                .count()
                == 0
    );
    w.finish_pass();
}

#[test]
fn unsupported_fd_is_refused_and_process_keeps_running() {
    let d = tempfile::tempdir().unwrap();
    let child = python(
        "import socket,time; s=socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM, 0); time.sleep(100)",
    );
    let has_socket = |pid: i32| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .any(|e| {
                std::fs::read_link(e.unwrap().path())
                    .map(|l| l.to_string_lossy().starts_with("socket:"))
                    .unwrap_or(false)
            })
    };
    refused_once_ready(
        child,
        &d.path().join("img"),
        ("python to open its socket", &has_socket),
        "a vsock socket (address family 40)",
    );
}

/// `python3` holding what `setup` (Python, with `bpf(cmd, attr)` and
/// `ctypes`/`struct`/`socket` at hand) makes, then sleeping.
fn python_bpf(setup: &str) -> std::process::Child {
    python(&format!(
        "import ctypes,struct,socket,time\n\
         libc=ctypes.CDLL(None,use_errno=True)\n\
         libc.syscall.restype=ctypes.c_long\n\
         def bpf(cmd,attr):\n    b=ctypes.create_string_buffer(attr,128)\n    r=libc.syscall(321,cmd,b,128)\n    assert r>=0\n    return r\n\
         {setup}\n\
         time.sleep(100)\n"
    ))
}

/// Whether `pid` holds a fd whose link starts with `prefix`.
fn holds(pid: i32, prefix: &str) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .any(|l| l.to_string_lossy().starts_with(prefix))
        })
        .unwrap_or(false)
}

// A bloom filter's bits cannot be read back (a lookup only tests a value):
// refused by name, saying so.
#[test]
fn bpf_bloom_filter_is_refused_saying_why() {
    let d = tempfile::tempdir().unwrap();
    // BPF_MAP_CREATE: BPF_MAP_TYPE_BLOOM_FILTER, no key, 4-byte values.
    let child = python_bpf("m=bpf(0,struct.pack('IIIII',30,0,4,16,0))");
    refused_once_ready(
        child,
        &d.path().join("img"),
        ("python to make its map", &|pid| {
            holds(pid, "anon_inode:bpf-map")
        }),
        "no way to read its bits",
    );
}

// A BPF array mapped in the process's memory whose fd the process closed
// since: which map the area is cannot be learnt (the kernel shows one
// anonymous inode for all), so it is refused with its area. (One held by
// an fd is mapped again: the bpf_mmap workload.)
#[test]
fn bpf_map_mapped_in_memory_without_its_fd_is_refused() {
    let d = tempfile::tempdir().unwrap();
    // BPF_MAP_CREATE: an array of one 4096-byte value, BPF_F_MMAPABLE
    // (1 << 10), mapped shared (by mmap(2): Python's mmap module keeps a
    // dup of the fd), then its fd closed.
    let child = python_bpf(
        "m=bpf(0,struct.pack('IIIII',2,4,4096,1,1<<10))\n\
         import os\n\
         libc.mmap.restype=ctypes.c_void_p\n\
         libc.mmap.argtypes=[ctypes.c_void_p,ctypes.c_size_t,ctypes.c_int,ctypes.c_int,ctypes.c_int,ctypes.c_long]\n\
         a=libc.mmap(None,4096,3,1,m,0)\n\
         assert a not in (None,ctypes.c_void_p(-1).value)\n\
         ctypes.memmove(a,b'hello',5)\n\
         os.close(m)\n\
         open('/proc/self/comm','w').write('mapped')",
    );
    refused_once_ready(
        child,
        &d.path().join("img"),
        ("python to map its BPF map", &|pid| comm_of(pid) == "mapped"),
        "maps a BPF map, and the process holds fds on 0 maps it could be",
    );
}

// A ring buffer holding records: they cannot be written back (only a BPF
// program writes records, the positions cannot be set).
#[test]
fn bpf_ring_buffer_holding_records_is_refused() {
    let d = tempfile::tempdir().unwrap();
    // A user ring buffer (BPF_MAP_TYPE_USER_RINGBUF, 8 KiB) whose producer
    // position the program moved on (its producer page is the program's
    // to write), then unmapped.
    let child = python_bpf(
        "m=bpf(0,struct.pack('IIIII',31,0,0,8192,0))\n\
         import mmap\n\
         a=mmap.mmap(m,4096,mmap.MAP_SHARED,mmap.PROT_READ|mmap.PROT_WRITE,offset=4096)\n\
         a[0:8]=struct.pack('Q',8)\n\
         a.close()\n\
         open('/proc/self/comm','w').write('filled')",
    );
    refused_once_ready(
        child,
        &d.path().join("img"),
        ("python to fill its ring buffer", &|pid| {
            comm_of(pid) == "filled"
        }),
        "ring buffer holding 8 bytes of records",
    );
}

// An eBPF socket filter: the kernel keeps only the instructions its
// verifier rewrote, not a loadable program.
#[test]
fn ebpf_socket_filter_is_refused_saying_why() {
    let d = tempfile::tempdir().unwrap();
    // BPF_PROG_LOAD of a socket filter "r0 = 0; exit", attached with
    // SO_ATTACH_BPF to a UDP socket.
    let child = python_bpf(
        "ib=ctypes.create_string_buffer(struct.pack('BBhi',0xb7,0,0,0)+struct.pack('BBhi',0x95,0,0,0))\n\
         lic=ctypes.create_string_buffer(b'GPL')\n\
         p=bpf(5,struct.pack('IIQQ',1,2,ctypes.addressof(ib),ctypes.addressof(lic)))\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         s.setsockopt(socket.SOL_SOCKET,50,p)\n\
         import os\n\
         os.close(p)",
    );
    refused_once_ready(
        child,
        &d.path().join("img"),
        ("python to attach its filter", &|pid| {
            holds(pid, "socket:") && !holds(pid, "anon_inode:bpf-prog")
        }),
        "keeps no loadable copy of a program",
    );
}

// An epoll in flight is saved with its registrations matched against the
// fds of the socket's holder. Here the registered pipe end is itself in
// flight, held by no process: the registration could not be made again,
// so the dump is refused by name and the process left running.
#[test]
fn epoll_in_flight_registering_a_file_no_process_holds_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let ready = d.path().join("ready");
    let child = python(&format!(
        "import os,socket,select,array,time\n\
         a,b=socket.socketpair(socket.AF_UNIX,socket.SOCK_DGRAM)\n\
         r,w=os.pipe()\n\
         e=select.epoll()\n\
         e.register(r, select.EPOLLIN)\n\
         a.sendmsg([b'e'],[(socket.SOL_SOCKET,socket.SCM_RIGHTS,array.array('i',[e.fileno(),r]))])\n\
         e.close()\n\
         os.close(r)\n\
         open('{}','w').close()\n\
         time.sleep(100)",
        ready.display()
    ));
    let is_ready = |_: i32| ready.exists();
    refused_once_ready(
        child,
        &d.path().join("img"),
        ("python to send its epoll", &is_ready),
        "an epoll in flight (SCM_RIGHTS) in the queue of one of its sockets has a registration of fd",
    );
}

#[test]
fn pipe_to_a_process_outside_the_tree_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut c = std::process::Command::new("sleep");
    c.arg("100")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    close_inherited_fds(&mut c);
    let mut child = c.spawn().unwrap();
    let pid = child.id() as i32;
    // Once it is sleep (exec done), not this test's fork.
    wait_until(std::time::Duration::from_secs(20), "sleep's exec", || {
        std::fs::read_link(format!("/proc/{pid}/exe"))
            .is_ok_and(|e| e.to_string_lossy().ends_with("/sleep"))
    });
    // This test process holds the write end of sleep's stdin.
    dump_refused(
        pid,
        &d.path().join("img"),
        "outside the dumped tree",
        &[pid],
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// An io_uring instance with a READ waiting on an empty pipe: the kernel
/// cannot give a request back, so the dump is refused, naming the ring's
/// fd, and the process runs on untouched (the workload's READ completes
/// with the bytes written to the pipe after the refusal).
#[test]
fn io_uring_with_a_request_in_flight_is_refused_and_left_untouched() {
    let mut w = Workload::start("io_uring", &["inflight"]);
    let ring = std::fs::read_dir(format!("/proc/{}/fd", w.pid))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            std::fs::read_link(p).is_ok_and(|l| l.to_string_lossy() == "anon_inode:[io_uring]")
        })
        .and_then(|p| p.file_name()?.to_str()?.parse::<i32>().ok())
        .expect("the workload's io_uring fd");
    dump_refused(
        w.pid,
        &w.images(),
        &format!("io_uring fd {ring} has 1 request(s) in flight"),
        &[w.pid],
    );
    w.finish_pass();
}

/// Rings stasis cannot make again as they were are refused by name, and
/// left as they were: one bound to a single issuer that has exited (no
/// thread can make it again: nobody may submit), one with an eventfd
/// registered (the kernel does not show which: it still counts), one
/// whose fd a thread registered (`IORING_REGISTER_RING_FDS`, not shown:
/// it still submits through it).
#[test]
fn io_uring_whose_issuer_is_gone_or_with_an_eventfd_or_registered_fd_is_refused_and_left_untouched()
{
    for (mode, needle) in [
        (
            "issuer_gone",
            "has a single issuer (IORING_SETUP_SINGLE_ISSUER) that is no thread of the process",
        ),
        (
            "eventfd",
            "has an eventfd registered (IORING_REGISTER_EVENTFD)",
        ),
        (
            "ring_fds",
            "has an io_uring ring registered in slot 0 (IORING_REGISTER_RING_FDS)",
        ),
    ] {
        let mut w = Workload::start("io_uring", &[mode]);
        dump_refused(w.pid, &w.images(), needle, &[w.pid]);
        w.finish_pass();
    }
}

/// A process sharing the fd table of its uncle, which no ancestor of it
/// holds (its parent passed it on, then unshared it): no fork from a
/// parent, an ancestor or a sibling rebuilds that, so the dump is refused
/// with the tree left running. (Tables shared with a sibling, or passed on
/// by ancestors, are restored: the `fdtable` and `fdtable_relay`
/// workloads.)
#[test]
fn fd_table_shared_with_an_uncle_only_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let marker = d.path().join("unshared");
    // R forks A; A clones B as R's child sharing its table (CLONE_PARENT),
    // then Y as its own child sharing it too, then unshares: B and Y share
    // one table that neither A nor R holds.
    let script = format!(
        "import ctypes,os,time\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        if os.fork() == 0:\n\
        \x20   if libc.syscall(56, 0x400 | 0x8000 | 17, 0, 0, 0, 0) != 0:\n\
        \x20       if libc.syscall(56, 0x400 | 17, 0, 0, 0, 0) != 0:\n\
        \x20           libc.unshare(0x400)\n\
        \x20           open('{}', 'w').close()\n\
        time.sleep(100)\n",
        marker.display()
    );
    let mut child = python(&script);
    let pid = child.id() as i32;
    wait_until(
        std::time::Duration::from_secs(20),
        "the unshared table",
        || marker.exists(),
    );
    let all: Vec<i32> = std::iter::once(pid).chain(descendants(pid)).collect();
    assert_eq!(all.len(), 4, "R, A, B and Y: {all:?}");
    dump_refused(
        pid,
        &d.path().join("img"),
        "no ancestor of it in the tree holds that table",
        &all,
    );
    for &k in &all[1..] {
        // SAFETY: killing the test's own descendants.
        unsafe { libc::kill(k, libc::SIGKILL) };
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A workload dumped (killed) once, for the restore error tests.
fn dumped() -> Workload {
    let mut w = Workload::start("counter", &[]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    w.dump_and_reap();
    w
}

fn ckpt_file(w: &Workload, prefix: &str) -> std::path::PathBuf {
    let d = w.images().join("checkpoints/00000001");
    std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .unwrap()
}

fn restore_fails(w: &Workload, needle: &str) {
    let o = stasis()
        .args(["restore", "--detach", "-D"])
        .arg(w.images())
        .output()
        .unwrap();
    assert_fails_with(&o, needle);
    assert!(
        !alive(w.pid),
        "a failed restore left process {} running",
        w.pid
    );
}

#[test]
fn restore_from_a_missing_dir() {
    let d = tempfile::tempdir().unwrap();
    let o = stasis()
        .args(["restore", "-D"])
        .arg(d.path().join("nope"))
        .output()
        .unwrap();
    assert_fails_with(&o, "nope");
}

#[test]
fn restore_with_a_flipped_manifest_byte() {
    let w = dumped();
    let m = ckpt_file(&w, "manifest");
    let mut b = std::fs::read(&m).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x40;
    std::fs::write(&m, b).unwrap();
    restore_fails(&w, "checksum");
}

#[test]
fn restore_with_a_truncated_pack() {
    let w = dumped();
    let p = ckpt_file(&w, "pages-");
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 5000)
        .unwrap();
    restore_fails(&w, "pack");
}

#[test]
fn restore_with_a_flipped_page_byte() {
    let w = dumped();
    let p = ckpt_file(&w, "pages-");
    let mut b = std::fs::read(&p).unwrap();
    b[4096 + 100] ^= 1;
    std::fs::write(&p, b).unwrap();
    restore_fails(&w, "corrupt");
}

/// The saved content of deleted files and memfds (the content pack) is
/// checked before anything is built: a flipped byte there is refused with
/// a message naming it, and no process is left behind. `inspect` lists
/// the content pack, and finds the damage too.
#[test]
fn restore_with_a_flipped_content_byte() {
    let mut w = Workload::start("ghosts", &[]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    w.dump_and_reap();
    let inspect = || {
        let o = stasis()
            .args(["inspect", "-D"])
            .arg(w.images())
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    let (ok, text) = inspect();
    assert!(
        ok && text.contains("saved file content: ") && text.contains("checksums ok"),
        "{text}"
    );
    let p = ckpt_file(&w, "content.pack");
    let mut b = std::fs::read(&p).unwrap();
    b[4096 + 100] ^= 1;
    std::fs::write(&p, b).unwrap();
    let (ok, text) = inspect();
    assert!(
        !ok && text.contains("checksums BAD: saved file content"),
        "{text}"
    );
    restore_fails(&w, "saved file content");
}

#[test]
fn restore_of_a_newer_format_version() {
    let w = dumped();
    let m = ckpt_file(&w, "manifest");
    let mut b = std::fs::read(&m).unwrap();
    b[8..12].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&m, b).unwrap();
    restore_fails(&w, "newer");
}

#[test]
fn restore_when_the_pid_is_taken() {
    let mut w = Workload::start("counter", &[]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_ok(&w.dump(&["--leave-running"]), "dump --leave-running");
    // The original still runs at that PID.
    let o = stasis()
        .args(["restore", "--detach", "-D"])
        .arg(w.images())
        .output()
        .unwrap();
    assert_fails_with(&o, "in use");
    assert!(alive(w.pid));
    w.finish_pass();
}

#[test]
fn restore_of_a_missing_checkpoint_number() {
    let w = dumped();
    let o = stasis()
        .args(["restore", "--checkpoint", "7", "-D"])
        .arg(w.images())
        .output()
        .unwrap();
    assert_fails_with(&o, "7");
    assert!(!alive(w.pid));
}

#[test]
fn dump_to_a_full_disk_leaves_the_process_running_and_no_checkpoint() {
    full_disk(&[]);
}

/// The same with a concurrent (write-protected) dump: the disk fills during
/// the copy, after the release; the process has run on all along, its
/// protection goes with the dumper's userfaultfds.
#[test]
fn concurrent_dump_to_a_full_disk_leaves_the_process_running_and_unprotected() {
    full_disk(&["--leave-running", "--concurrent", "--cow-method", "uffd"]);
}

fn full_disk(flags: &[&str]) {
    let mut w = Workload::start("heap", &["32"]);
    let small = w.dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(st.success(), "mounting a small tmpfs");
    let o = stasis()
        .args(["dump", "-t", &w.pid.to_string()])
        .args(flags)
        .arg("-D")
        .arg(small.join("img"))
        .output()
        .unwrap();
    let listing: Vec<String> = std::fs::read_dir(small.join("img/checkpoints"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let _ = std::process::Command::new("umount").arg(&small).status();
    assert_fails_with(&o, "No space left");
    assert!(listing.is_empty(), "a failed dump left {listing:?}");
    assert!(alive(w.pid));
    let uffds = std::fs::read_dir(format!("/proc/{}/fd", w.pid))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().contains("userfaultfd"))
        .count();
    assert_eq!(uffds, 0, "a userfaultfd was left in the process");
    w.finish_pass();
}

#[test]
fn dump_without_privileges_is_refused_cleanly() {
    if std::process::Command::new("setpriv")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("setpriv (util-linux) is needed for this test");
    }
    let mut w = Workload::start("counter", &[]);
    let d = tempfile::tempdir().unwrap();
    let mut c = std::process::Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
    ])
    .arg(env!("CARGO_BIN_EXE_stasis"))
    .args(["dump", "-t", &w.pid.to_string(), "-D"])
    .arg(d.path().join("img"));
    close_inherited_fds(&mut c);
    // The unprivileged user cannot create the image dir inside root's temp
    // dir either; let it have one of its own.
    std::fs::set_permissions(
        d.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let o = c.output().unwrap();
    assert_fails_with(&o, "cannot trace");
    assert!(alive(w.pid));
    w.finish_pass();
}

#[test]
fn restore_when_a_listening_port_is_taken() {
    let d = tempfile::tempdir().unwrap();
    let pidfile = d.path().join("pid");
    let mut c = std::process::Command::new("python3");
    c.args([
        "-c",
        "import socket,time,sys,os; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); open(sys.argv[1]+'.t','w').write(str(os.getpid())); os.rename(sys.argv[1]+'.t', sys.argv[1]); time.sleep(100)",
    ])
    .arg(&pidfile)
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    close_inherited_fds(&mut c);
    let mut child = c.spawn().unwrap();
    let pid = wait_pidfile(&pidfile, std::time::Duration::from_secs(10));
    let img = d.path().join("img");
    assert_ok(
        &stasis()
            .args(["dump", "--leave-running", "-t", &pid.to_string(), "-D"])
            .arg(&img)
            .output()
            .unwrap(),
        "dump",
    );
    // The original still listens on the port: a restore (in a new PID
    // namespace, so the PID is not the obstacle) must say the port is taken.
    let o = stasis()
        .args(["restore", "--detach", "--new-pidns", "-D"])
        .arg(&img)
        .output()
        .unwrap();
    assert_fails_with(&o, "is taken by another process");
    assert!(alive(pid));
    child.kill().unwrap();
    child.wait().unwrap();
}
