//! The restore as a pipeline of stages over one state struct ([`Build`],
//! one [`Record`] per process): load → verify (in parallel) → build the
//! tree (stub, tree, per process: memory, files, threads) → jump.
//!
//! Every stage that can fail after the root stub exists returns an error
//! that [`restore`] turns into killing and reaping the whole half-built tree
//! ([`crate::reap::kill_tree`]) before it is returned.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Instant;

use stasis_image::manifest::{Manifest, ProcessImage};
use stasis_image::{Checkpoint, ImageDir, ImageError, PackReader, PageSource};
use stasis_kernel::child::{spawn_stopped, SpawnError};
use stasis_kernel::{scm, Tracee};
use stasis_sys as sys;

use crate::proc::Proc;
use crate::reap::{kill_stub, kill_tree, wait_pid_free, Watchdog};
use crate::ObjectError;
use crate::{files, memory, process, stub, sysv, tree};
use crate::{RestoreError, RestoreOptions, Restored, Result};

/// One process of the image on its way through the pipeline.
pub(crate) struct Record<'a> {
    pub img: &'a ProcessImage,
    /// Where its pages are: its own pack, and for an incremental
    /// checkpoint the packs of its ancestors (none for a zombie).
    pub sources: Vec<PageSource>,
    /// Its stub, from the moment it exists.
    pub proc: Option<Proc>,
}

impl Record<'_> {
    /// Its stub (an error if it was never created).
    pub fn proc_mut(&mut self) -> Result<&mut Proc> {
        let pid = self.img.pid;
        self.proc.as_mut().ok_or_else(|| {
            ObjectError::Inconsistent(format!("process {pid} was not created")).into()
        })
    }
}

/// The fd transport: the restorer's end, and the number of the stubs' end
/// (above every fd of the image).
pub(crate) struct Transport {
    pub sock: OwnedFd,
    pub h: u64,
}

/// The state every stage of a restore works on.
pub(crate) struct Build<'a> {
    pub m: &'a Manifest,
    pub plan: &'a tree::Plan,
    pub records: Vec<Record<'a>>,
    pub transport: &'a Transport,
    pub opts: &'a RestoreOptions,
    /// The checkpoint's saved file content (its content pack, verified).
    pub content: &'a stasis_image::ContentSource,
    /// Of the bytes restored, those left to the lazy filler.
    pub lazy_bytes: u64,
    /// The terminal a shell job goes on (`--shell-job`).
    pub terminal: Option<&'a crate::shell_job::Terminal>,
    /// The cgroups each process is put in.
    pub cgroups: &'a crate::cgroup::Placer,
    /// The restorer's own namespaces as it started (kind, an fd on it).
    pub home_ns: Vec<(String, OwnedFd)>,
}

impl Build<'_> {
    /// The stub of process `i` (an error if it was never created).
    pub fn proc_mut(&mut self, i: usize) -> Result<&mut Proc> {
        let pid = self.records.get(i).map_or(0, |r| r.img.pid);
        self.records
            .get_mut(i)
            .and_then(|r| r.proc.as_mut())
            .ok_or_else(|| {
                ObjectError::Inconsistent(format!("process {pid} was not created")).into()
            })
    }

    /// The root's stub.
    pub fn root(&mut self) -> Result<&mut Proc> {
        self.proc_mut(0)
    }

    /// Every stub created so far, in manifest order.
    fn into_procs(self) -> Vec<Proc> {
        self.records.into_iter().filter_map(|r| r.proc).collect()
    }
}

/// Stage 1, load: reads a checkpoint and checks that this version can
/// restore it here.
pub fn load(store: &ImageDir, n: Option<u32>) -> Result<(Checkpoint, tree::Plan)> {
    let cp = store.load(n)?;
    let m = &cp.manifest;
    if m.host.page_size != sys::PAGE_SIZE {
        return Err(ObjectError::Incompatible(format!(
            "image page size {} differs from {}",
            m.host.page_size,
            sys::PAGE_SIZE
        ))
        .into());
    }
    for p in &m.processes {
        if p.zombie.is_none() && p.threads.is_empty() {
            return Err(
                ObjectError::Inconsistent(format!("process {} has no threads", p.pid)).into(),
            );
        }
    }
    let plan = tree::plan(&m.processes)?;
    Ok((cp, plan))
}

/// Restores the process tree of a checkpoint and lets it run.
pub fn restore(store: &ImageDir, opts: &RestoreOptions) -> Result<Restored> {
    let t0 = Instant::now();
    // Processes of a tree abandoned half-built come back to us to be
    // reaped at once (not to an init that reaps late, keeping their PIDs).
    let _reaper = stasis_kernel::child::Subreaper::enable();
    let (mut cp, plan) = load(store, opts.checkpoint)?;
    crate::ns::creds_inside(&mut cp.manifest)?;
    let m = &cp.manifest;
    lazy_allowed(m, opts)?;
    // A shell job's terminal, before anything is built.
    let terminal = crate::shell_job::open(m, opts)?;
    let chain = stasis_image::load_chain(store, Some(cp.number))?;
    let mut records = page_sources(&chain, m)?;
    // The content of the files saved whole, checked before anything is
    // made (a damaged run is refused here, as a damaged page run is).
    let content = cp.open_content().map_err(RestoreError::Corrupt)?;
    let waited = Instant::now();
    wait_pids_free(m, &plan, opts)?;
    let pid_wait_us = micros(waited);

    // The names the tree's veths need here are free, their bridges there.
    crate::ns::check_net(m)?;
    // The tree's cgroups, made where missing (removed again when this
    // restore fails: it is dropped after the tree is killed).
    let cgroups = crate::cgroup::Placer::prepare(m)?;
    // Before any thread of this process enters the tree's namespaces.
    let home_ns = home_namespaces();
    let guard = crate::guard::Guard::start(|pid| saved_pid(m, &plan, opts, pid))?;
    let (transport, remote_end) = transport(m)?;
    let (root, init) = spawn_root(m, remote_end, opts.new_pidns)?;
    let root_outer = root.t.pid();
    records[0].proc = Some(root);
    // The tree's sockets are made in its network namespace: this thread
    // works there until the restore is over.
    // Its cgroup, and a cgroup namespace of its own before its mounts
    // (a cgroup2 among them is mounted from inside it) and before anyone
    // is forked into it.
    let spawned = cgroups
        .join_root(root_outer)
        .and_then(|()| match records[0].proc.as_mut() {
            Some(r) => crate::ns::enter_cgroup_ns(m, &cgroups, r, root_outer),
            None => Ok(()),
        })
        .and_then(|()| crate::ns::after_spawn(m, root_outer, &content));
    let _netns = match spawned {
        Ok(n) => n,
        Err(e) => {
            let procs = records.into_iter().filter_map(|r| r.proc);
            kill_tree(procs.collect::<Vec<_>>(), init);
            return Err(e);
        }
    };
    let mut b = Build {
        m,
        plan: &plan,
        records,
        transport: &transport,
        opts,
        content: &content,
        lazy_bytes: 0,
        terminal: terminal.as_ref(),
        cgroups: &cgroups,
        home_ns,
    };

    // Stage 2, verify: pack checksums, in parallel with the rebuild.
    let verifier = start_verifier(&chain, &b);
    let watchdog = Watchdog::start();
    // Stage 3, build.
    let built = build_tree(&mut b);
    let verified = match verifier.join() {
        Ok(r) => r.map_err(RestoreError::Corrupt),
        Err(_) => Err(ObjectError::Layout("the checksum verifier panicked".into()).into()),
    };
    // A damaged pack is the error to report even if the build also failed
    // (damaged data can make it fail first, with a vaguer message).
    let result = verified.and(built).and_then(|bytes| {
        // Stage 4, jump. From the first process let go until the last,
        // a restorer killed would leave part of the tree running: the
        // guard kills it then.
        let live = b.records.iter().filter_map(|r| r.proc.as_ref());
        for pid in live.filter(|p| p.live).map(|p| p.t.pid()).chain(init) {
            guard.watch(pid)?;
        }
        jump_all(&mut b)?;
        if let (Some(t), Some(job)) = (&terminal, &m.shell_job) {
            t.after_release(job, root_outer);
        }
        Ok(bytes)
    });
    drop(watchdog);
    if result.is_ok() {
        cgroups.keep();
    }
    match result {
        Ok(bytes) => {
            guard.commit();
            Ok(Restored {
                checkpoint: cp.number,
                pid: b.root()?.t.pid(),
                pid_in_namespace: (init.is_some() || own_pidns(m)).then(|| m.processes[0].pid),
                init_pid: init,
                processes: m.processes.len(),
                threads: m.processes.iter().map(|p| p.threads.len()).sum(),
                pages: bytes / sys::PAGE_SIZE,
                bytes,
                lazy_bytes: b.lazy_bytes,
                total_us: micros(t0),
                pid_wait_us,
            })
        }
        Err(e) => {
            kill_tree(b.into_procs(), init);
            guard.abort();
            Err(e)
        }
    }
}

/// Whether `pid` is one the restore must create the tree at (a PID or TID
/// of the image, or a group helper's, in this PID namespace).
fn saved_pid(m: &Manifest, plan: &tree::Plan, opts: &RestoreOptions, pid: i32) -> bool {
    if opts.new_pidns || own_pidns(m) {
        return false;
    }
    m.processes
        .iter()
        .any(|p| p.pid == pid || p.threads.iter().any(|t| t.tid == pid))
        || plan.helpers.iter().any(|&(g, _)| g == pid)
}

/// A lazy restore makes a userfaultfd inside each process, which the
/// kernel refuses in a user namespace other than the initial one unless
/// `vm.unprivileged_userfaultfd` is 1: refused before anything is built.
fn lazy_allowed(m: &Manifest, opts: &RestoreOptions) -> Result<()> {
    let userns = m.namespaces.as_ref().is_some_and(|n| n.user.is_some());
    if opts.lazy.is_none() || !userns {
        return Ok(());
    }
    let sysctl =
        std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    if sysctl.trim() == "1" {
        return Ok(());
    }
    Err(ObjectError::Incompatible(
        "the tree is in a user namespace of its own, where the kernel lets a process make the userfaultfd a lazy restore needs only with vm.unprivileged_userfaultfd=1: restore it without --lazy, or set that sysctl".into(),
    )
    .into())
}

/// Whether the tree had a PID namespace of its own (its root is PID 1 of
/// a new one).
fn own_pidns(m: &Manifest) -> bool {
    m.namespaces.as_ref().is_some_and(|n| n.pid)
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// The pages of each process: its own pack, and for an incremental
/// checkpoint the packs of its ancestors. One record per process.
fn page_sources<'a>(chain: &[Checkpoint], m: &'a Manifest) -> Result<Vec<Record<'a>>> {
    let mut records = Vec::with_capacity(m.processes.len());
    for img in &m.processes {
        let sources = if img.zombie.is_some() {
            Vec::new()
        } else {
            stasis_image::page_sources(chain, img)?
        };
        records.push(Record {
            img,
            sources,
            proc: None,
        });
    }
    Ok(records)
}

/// Every saved PID and TID must be free (zombies holding one are waited
/// out), and the PID of each group leader that had exited (its helper's);
/// not needed in a new PID namespace.
fn wait_pids_free(m: &Manifest, plan: &tree::Plan, opts: &RestoreOptions) -> Result<()> {
    if opts.new_pidns || own_pidns(m) {
        return Ok(());
    }
    for p in &m.processes {
        wait_pid_free(p.pid, opts.pid_wait)?;
        for th in p.threads.iter().filter(|t| t.tid != p.pid) {
            wait_pid_free(th.tid, opts.pid_wait)?;
        }
    }
    for &(pgid, _) in &plan.helpers {
        wait_pid_free(pgid, opts.pid_wait)?;
    }
    Ok(())
}

/// The fd transport: the stub inherits the second socket at a number above
/// every fd of the image.
fn transport(m: &Manifest) -> Result<(Transport, OwnedFd)> {
    let (sock, remote_end) = scm::dgram_pair()?;
    let max_fd = m
        .processes
        .iter()
        .flat_map(|p| p.fds.iter().map(|f| f.fd))
        .max()
        .unwrap_or(2);
    let remote_end = scm::dup_at_least(remote_end.as_fd(), max_fd.max(2) + 1)?;
    let h = u64::from(remote_end.as_raw_fd().unsigned_abs());
    Ok((Transport { sock, h }, remote_end))
}

/// The root stub at the root's PID (and, with a new PID namespace, that
/// namespace's init). `remote_end` is closed here once the stub has it.
fn spawn_root(m: &Manifest, remote_end: OwnedFd, new_pidns: bool) -> Result<(Proc, Option<i32>)> {
    let root = &m.processes[0];
    let spawn_err = |e| match e {
        SpawnError::PidTaken(pid) => RestoreError::PidTaken {
            pid,
            by: "a process that appeared meanwhile".into(),
        },
        SpawnError::NoPermission { pid, source } => RestoreError::NoPermission { pid, source },
        SpawnError::Kernel(k) => RestoreError::Kernel(k),
    };
    let (t, init): (Tracee, Option<i32>) = if let Some(ns) = &m.namespaces {
        // The tree had namespaces of its own: the root is created in new
        // ones (PID 1 of a new PID namespace, or at its PID).
        if new_pidns && !ns.pid {
            return Err(RestoreError::Unsupported(
                "--new-pidns with an image of a tree that had namespaces of its own but shared the dumper's PID namespace".into(),
            ));
        }
        let setup = crate::ns::setup(ns)?;
        let set_tid = (!ns.pid).then_some(root.pid);
        let spawned = if ns.pid && ns.stand_in_init {
            // The namespace's init was not dumped: a stand-in init (stasis
            // exec'd anew) is PID 1 and the root keeps its PID.
            stasis_kernel::child::spawn_init_in(root.pid, &setup, stub_options())
                .map(|(init, t)| (t, Some(init)))
        } else {
            stasis_kernel::child::spawn_stopped_in(set_tid, &setup).map(|t| (t, None))
        };
        let (t, init) = spawned.map_err(|e| {
            let why = match &e {
                SpawnError::Kernel(stasis_kernel::KernelError::Died { status, .. })
                    if libc::WIFEXITED(*status) =>
                {
                    crate::ns::setup_failure(libc::WEXITSTATUS(*status))
                }
                _ => None,
            };
            match why {
                Some(w) => ObjectError::Incompatible(format!(
                    "the tree's new namespaces could not be set up: {w}"
                ))
                .into(),
                None => spawn_err(e),
            }
        })?;
        (t, init)
    } else if new_pidns {
        // The namespace's init is stasis exec'd anew: keep the transport
        // across that exec, so the root stub (forked by init) has it.
        let _ = nix::fcntl::fcntl(
            remote_end.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        );
        let (init, t) = stasis_kernel::child::spawn_in_new_pidns(root.pid, stub_options())
            .map_err(spawn_err)?;
        (t, Some(init))
    } else {
        (spawn_stopped(Some(root.pid)).map_err(spawn_err)?, None)
    };
    drop(remote_end);
    let root_outer = t.pid();
    match Proc::adopt(t, 0, root.pid) {
        Ok(p) => Ok((p, init)),
        Err(e) => {
            kill_stub(root_outer, init);
            Err(e)
        }
    }
}

/// This thread's namespaces (kind, an fd on it), each that it can open.
fn home_namespaces() -> Vec<(String, OwnedFd)> {
    stasis_kernel::ns::NsKind::ALL
        .into_iter()
        .filter_map(|k| {
            let f = std::fs::File::open(format!("/proc/thread-self/ns/{}", k.name())).ok()?;
            Some((k.name().to_string(), OwnedFd::from(f)))
        })
        .collect()
}

/// The ptrace options of a root stub seized from the init that forked it.
fn stub_options() -> u64 {
    sys::PTRACE_O_EXITKILL
        | sys::PTRACE_O_TRACECLONE
        | sys::PTRACE_O_TRACEFORK
        | sys::PTRACE_O_SUSPEND_SECCOMP
}

/// Starts checking the checksums of every pack the restore reads. A lazy
/// restore checks only what it fills now; the filler checks each run it
/// reads.
fn start_verifier(
    chain: &[Checkpoint],
    b: &Build<'_>,
) -> std::thread::JoinHandle<Result<(), ImageError>> {
    let to_verify: Vec<_> = chain
        .iter()
        .flat_map(|c| {
            c.manifest
                .processes
                .iter()
                .filter_map(move |p| p.pack.as_ref().map(|r| (c.pack_path(r), r.clone())))
        })
        .filter(|(path, _)| {
            b.records
                .iter()
                .flat_map(|r| r.sources.iter())
                .any(|s| path.as_ref().is_ok_and(|p| p.as_path() == s.pack.path()))
        })
        .collect();
    let eager: Option<Vec<(u64, u64)>> = b
        .opts
        .lazy
        .as_ref()
        .map(|_| crate::eager_ranges(b.m.processes.iter().flat_map(|p| p.vmas.iter())));
    std::thread::spawn(move || -> Result<(), ImageError> {
        for (path, pref) in to_verify {
            let pack = PackReader::open(&path?, Some(&pref))?;
            match &eager {
                None => pack.verify()?,
                Some(ranges) => {
                    let mut buf = Vec::new();
                    for e in stasis_image::chain::runs_touching(pack.runs(), ranges) {
                        buf.resize(usize::try_from(e.len()).unwrap_or(0), 0);
                        pack.read_run(&e, &mut buf)?;
                    }
                }
            }
        }
        Ok(())
    })
}

/// Stage 3: everything up to (not including) the final jumps: the root
/// stub's clean slate, System V segments, the root's memory, the tree
/// (each process forked from its parent once the parent's memory is
/// built, then its own memory built, keeping what it inherited: see
/// [`crate::inherit`]), groups, zombies, then the rest of every live
/// process. Returns the bytes filled.
fn build_tree(b: &mut Build<'_>) -> Result<u64> {
    let m = b.m;
    // Every open file description is made by one factory; the ptys that
    // are controlling terminals are wanted as soon as the tree is forked.
    let mut factory = files::FdFactory::new(
        &m.pipes,
        &m.ghosts,
        m.processes.iter().flat_map(|p| p.fds.iter()),
    );
    factory.set_terminal(b.terminal.map(|t| t.path.clone()));
    factory.set_content(b.content);
    stub::prepare_root(b)?;
    let root_outer = b.root()?.t.pid();
    factory.set_ns_of(root_outer);
    factory.set_home_ns(std::mem::take(&mut b.home_ns));
    // Files of a tree with a mount namespace of its own are opened there.
    if m.namespaces.as_ref().is_some_and(|n| n.mnt.is_some()) {
        factory.set_mount_ns_of(root_outer);
    }
    crate::ns::in_ipc(m, root_outer, || sysv::prepare(&m.sysv_shm, b.content))??;
    // (With its message queues and semaphore sets, and its POSIX message
    // queues, before any fd is opened on one.)
    if let Some(ns) = m.namespaces.as_ref().filter(|n| n.ipc) {
        crate::ns::in_ipc(m, root_outer, || {
            stasis_objects::sysv_ipc::restore(&ns.msg_queues, &ns.sem_sets)
        })??;
        if let Some(q) = &ns.posix_queues {
            crate::ns::in_ipc(m, root_outer, || {
                stasis_objects::mqueue::restore_namespace(q)
            })??;
        }
        factory.set_ipc_ns_of(root_outer);
    }
    for p in stasis_objects::posix_shm::restore(&m.shm_files, Some(b.content))? {
        tracing::debug!(path = %p.display(), "POSIX shared memory object put back");
    }
    let mut cx = process::TreeCtx {
        root_pid: m.processes[0].pid,
        factory,
        shm_first: HashMap::new(),
        shm_sizes: shm_sizes(&m.processes),
        transport: b.transport,
        cgroups: b.cgroups,
        keep_transport: keep_transport(&m.processes),
        opts: b.opts,
        filled: 0,
        total: b
            .records
            .iter()
            .flat_map(|r| r.sources.iter())
            .map(PageSource::bytes)
            .sum(),
        lazy_bytes: 0,
        lazy_areas: HashMap::new(),
    };
    let built = build_memories(&mut b.records, b.plan, &mut cx);
    b.lazy_bytes = cx.lazy_bytes;
    built?;
    if cx.filled != cx.total {
        return Err(ObjectError::Inconsistent(format!(
            "{} pack bytes lie outside every saved area",
            cx.total - cx.filled
        ))
        .into());
    }
    stub::set_groups(b)?;
    stub::make_zombies(b)?;
    let filled = cx.filled;
    build_processes(b, cx)?;
    crate::ns::in_ipc(m, root_outer, || sysv::finish(&m.sysv_shm))?;
    if let (Some(t), Some(job)) = (b.terminal, &m.shell_job) {
        t.attach(job)?;
    }
    Ok(filled)
}

/// The tree, top-down (parents come before their children in the
/// manifest): the root's memory, then each process forked by its parent
/// and, if it lives on, its memory built.
fn build_memories(
    records: &mut [Record<'_>],
    plan: &tree::Plan,
    cx: &mut process::TreeCtx<'_, '_>,
) -> Result<()> {
    if plan.setsid[0] {
        // The root's terminal, before it forks its session's members.
        let pid = records[0].img.pid;
        let root = records[0]
            .proc
            .as_mut()
            .ok_or_else(|| ObjectError::Inconsistent("the root stub was not created".into()))?;
        let spare = stub::spare_fd(cx.transport.h)?;
        cx.factory
            .take_ctty(root, pid, (&cx.transport.sock, cx.transport.h, spare))?;
    }
    build_memory(records, plan, 0, cx)?;
    for i in 1..records.len() {
        stub::fork_one(records, plan, cx.transport, i, &mut cx.factory)?;
        // Into its cgroup before it runs any code of its own.
        if let Some(p) = records[i].proc.as_ref() {
            cx.cgroups.join_child(records[i].img.pid, p.t.pid())?;
        }
        if records[i].img.zombie.is_none() {
            build_memory(records, plan, i, cx)?;
        }
    }
    stub::unshare_relays(records, plan)
}

/// The memory of live process `i`; a child keeps what it can of what it
/// inherited from its parent, or the sibling that forked it (not in a lazy
/// restore's areas of the filler).
fn build_memory(
    records: &mut [Record<'_>],
    plan: &tree::Plan,
    i: usize,
    cx: &mut process::TreeCtx<'_, '_>,
) -> Result<()> {
    let (before, rest) = records.split_at_mut(i);
    let r = &mut rest[0];
    let lazy = cx.opts.lazy.is_some();
    let inherit = plan
        .forker
        .get(i)
        .copied()
        .flatten()
        .and_then(|pi| before.get(pi))
        .map(|pr| memory::Inherit::new(pr.img, &pr.sources, r.img, lazy));
    let pid = r.img.pid;
    let p = r
        .proc
        .as_mut()
        .ok_or_else(|| ObjectError::Inconsistent(format!("process {pid} was not created")))?;
    let done = process::build_memory(p, r.img, &r.sources, inherit.as_ref(), cx)?;
    cx.filled += done;
    if let Some(cb) = &cx.opts.progress {
        cb(cx.filled, cx.total);
    }
    Ok(())
}

/// The rest of every live process, in manifest order.
fn build_processes<'m>(b: &mut Build<'m>, mut cx: process::TreeCtx<'_, 'm>) -> Result<()> {
    let m = b.m;
    cx.factory.set_tcp_close(b.opts.tcp_close);
    cx.factory.reserve_pids(
        m.processes
            .iter()
            .flat_map(|p| std::iter::once(p.pid).chain(p.threads.iter().map(|t| t.tid))),
    );
    for r in &mut b.records {
        if r.img.zombie.is_some() {
            continue;
        }
        let img = r.img;
        process::build_process(r.proc_mut()?, img, &mut cx)?;
    }
    if let Some(c) = &b.opts.cut {
        // Every host's tree built, its connections in repair mode, before
        // any connection comes out of it (a packet to a host whose socket
        // does not exist yet would reset the connection).
        c.built()?;
    }
    cx.factory.check_in_flight_epolls()?;
    cx.factory.finish_tcp()?;
    cx.factory.finish_pidfds();
    Ok(())
}

/// Of each shared anonymous object (by inode), the furthest offset an
/// area of a live process maps.
fn shm_sizes(procs: &[ProcessImage]) -> HashMap<u64, u64> {
    let mut sizes = HashMap::new();
    for v in procs
        .iter()
        .filter(|p| p.zombie.is_none())
        .flat_map(|p| p.vmas.iter())
    {
        if let Some((ino, off)) = v.shm {
            let end = sizes.entry(ino).or_insert(0);
            *end = (*end).max(off + (v.end - v.start));
        }
    }
    sizes
}

/// The live processes built before another that shares their fd table:
/// they leave the transport open for it (the last one closes it).
fn keep_transport(procs: &[ProcessImage]) -> std::collections::HashSet<i32> {
    let live: Vec<_> = procs.iter().filter(|p| p.zombie.is_none()).collect();
    let table = |p: &ProcessImage| p.fds_shared_with.unwrap_or(p.pid);
    live.iter()
        .enumerate()
        .filter(|&(i, p)| live[i + 1..].iter().any(|q| table(q) == table(p)))
        .map(|(_, p)| p.pid)
        .collect()
}

/// How long a process sent its stop signal again may take to stop.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Stage 4: every process gets its registers back while all stay stopped
/// (children first); only then are they let go, all in one short loop, the
/// root last. A restorer killed before that loop takes the whole stopped
/// tree with it (`PTRACE_O_EXITKILL`), one killed during it leaves the
/// release guard to kill the processes let go: never a child running
/// without its parent.
fn jump_all(b: &mut Build<'_>) -> Result<()> {
    let mut ready = Vec::new();
    for (i, r) in b.records.iter_mut().enumerate().rev() {
        if let Some(p) = r.proc.as_mut().filter(|p| p.live) {
            crate::threads::jump(p, r.img)?;
            ready.push(i);
        }
    }
    // The processes stopped by job control go first, and the others only
    // once each of those is seen stopped again: the signal is taken only
    // when the process is next scheduled, and a parent (or the user) that
    // looks right after the restore must find it stopped, as at the dump.
    let (stopped, running): (Vec<usize>, Vec<usize>) =
        ready.into_iter().partition(|&i| b.records[i].img.stopped);
    let mut pids = Vec::new();
    for i in stopped {
        let img = b.records[i].img;
        let p = b.proc_mut(i)?;
        crate::threads::stop_again(p, img)?;
        crate::threads::release(p)?;
        stasis_sys::fault::die_at(stasis_sys::fault::Point::DieInRelease);
        pids.push(p.pid);
    }
    for pid in stasis_kernel::procfs::wait_group_stopped(&pids, STOP_WAIT) {
        tracing::warn!(pid, "not seen stopped again after the restore");
    }
    for i in running {
        crate::threads::release(b.proc_mut(i)?)?;
        stasis_sys::fault::die_at(stasis_sys::fault::Point::DieInRelease);
    }
    Ok(())
}
