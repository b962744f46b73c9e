//! One module per kernel object: how each is saved and how it is rebuilt,
//! side by side (as CRIU keeps `pipes.c`, `sk-unix.c`, `sk-tcp.c`...).
//!
//! Every kind of open file implements [`Object`]: `save` looks at one fd of
//! a process being dumped ([`OpenFd`], in a [`SaveCtx`]) and, if it is of
//! its kind, says what to keep ([`FdKind`]); `restore` looks at one saved
//! fd ([`FdImage`], in a [`RestoreCtx`]) and, if it is of its kind, makes
//! the open file description again. [`REGISTRY`] lists the kinds: the
//! save side asks them in order, the first that recognises an fd saves it.
//!
//! | object | module |
//! |---|---|
//! | regular file, directory, device | [`file`] |
//! | deleted file, memfd | [`ghost`] |
//! | deleted directory, FIFO, device node; deleted working directory | [`deleted`] |
//! | pipe, FIFO | [`pipe`] |
//! | eventfd | [`eventfd`] |
//! | timerfd | [`timerfd`] |
//! | signalfd | [`signalfd`] |
//! | BPF map | [`bpfmap`] |
//! | epoll | [`epoll`] |
//! | io_uring (idle) | [`io_uring`] |
//! | pidfd | [`pidfd`] |
//! | namespace file (`/proc/PID/ns/*`) | [`nsfile`] |
//! | inotify | [`inotify`] |
//! | unix socket | [`unix`] |
//! | netlink socket | [`netlink`] |
//! | packet socket | [`packet`] |
//! | POSIX message queue (fds; the queues of an IPC namespace) | [`mqueue`] |
//! | pseudo-terminal pair | [`pty`] |
//! | virtual console, serial line | [`ttyline`] |
//! | the terminal of a shell job (`--shell-job`) | [`shell_job`] |
//! | userfaultfd | [`userfaultfd`] |
//! | fd attached to a tun/tap device | [`tun`] |
//! | TCP/UDP socket | [`inet`] (listening, UDP), [`tcp`] (established: `TCP_REPAIR`) |
//! | socket options, the accept gate | [`socket`] |
//! | flock/POSIX/OFD locks | [`locks`] |
//! | System V shared memory | [`sysv`] |
//!
//! Adding a kind: a new module implementing [`Object`], its variant in
//! `stasis_image::manifest::FdKind`, and one line in [`REGISTRY`].

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::os::fd::OwnedFd;

use stasis_image::manifest::{FdImage, FdKind};

pub mod bpfmap;
pub mod content;
pub mod deleted;
pub mod epoll;
pub mod error;
pub mod eventfd;
pub mod fanotify;
pub mod fd_census;
pub mod file;
pub mod fown;
pub mod ghost;
pub mod inet;
pub mod inotify;
pub mod io_uring;
pub mod locks;
pub mod mqueue;
pub mod netlink;
pub mod nsfile;
pub mod packet;
pub mod pidfd;
pub mod pipe;
pub mod posix_shm;
pub mod pty;
pub mod pty_census;
pub mod restore;
pub mod save;
pub mod shell_job;
pub mod signalfd;
pub mod socket;
pub mod sysv;
pub mod sysv_ipc;
pub mod tcp;
pub mod timerfd;
pub mod ttyline;
pub mod tun;
pub mod unix;
pub mod userfaultfd;

pub use error::{RestoreError, SaveError};
pub use restore::{plant, FdRef, RestoreCtx, Scratch};
pub use save::{OpenFd, SaveCtx};

/// A kind of kernel object reachable through an fd.
pub trait Object {
    /// What it is, for diagnostics and the docs.
    const NAME: &'static str;

    /// The `/proc/PID/fd` link of an anonymous-inode kind
    /// (`anon_inode:[eventfd]`...): fds with other anonymous inodes are
    /// refused before any kind is asked.
    const ANON_INODE: Option<&'static str> = None;

    /// Saves `fd` if it is of this kind (`None`: not this kind).
    fn save(cx: &mut SaveCtx, fd: &OpenFd<'_>) -> Result<Option<FdKind>, SaveError>;

    /// Whether a saved fd of kind `kind` is this kind's to restore.
    fn owns(kind: &FdKind) -> bool;

    /// Makes the description of `img` (of a kind it [`owns`](Object::owns)) again.
    fn restore(cx: &mut RestoreCtx<'_>, img: &FdImage) -> Result<OwnedFd, RestoreError>;
}

/// Saves an fd if it is of the entry's kind.
pub type SaveFn = fn(&mut SaveCtx, &OpenFd<'_>) -> Result<Option<FdKind>, SaveError>;
/// Restores a saved fd of the entry's kind.
pub type RestoreFn = fn(&mut RestoreCtx<'_>, &FdImage) -> Result<OwnedFd, RestoreError>;

/// One registered kind.
pub struct Entry {
    pub name: &'static str,
    pub anon_inode: Option<&'static str>,
    pub save: SaveFn,
    pub owns: fn(&FdKind) -> bool,
    pub restore: RestoreFn,
}

/// The registry entry of kind `O`.
pub const fn entry<O: Object>() -> Entry {
    Entry {
        name: O::NAME,
        anon_inode: O::ANON_INODE,
        save: O::save,
        owns: O::owns,
        restore: O::restore,
    }
}

/// The registered kind that restores saved fds of kind `kind`.
pub fn owner(kind: &FdKind) -> Option<&'static Entry> {
    REGISTRY.iter().find(|e| (e.owns)(kind))
}

/// Every kind, in the order the save side tries them (sockets and
/// anonymous inodes first, deleted files before FIFOs, plain files last:
/// [`file::File`] takes whatever is left).
pub const REGISTRY: &[Entry] = &[
    entry::<unix::Unix>(),
    entry::<inet::Inet>(),
    entry::<netlink::Netlink>(),
    entry::<packet::Packet>(),
    entry::<pipe::Pipe>(),
    entry::<eventfd::Eventfd>(),
    entry::<timerfd::Timerfd>(),
    entry::<signalfd::Signalfd>(),
    entry::<bpfmap::BpfMapFd>(),
    entry::<inotify::Inotify>(),
    entry::<fanotify::Fanotify>(),
    entry::<epoll::Epoll>(),
    entry::<io_uring::IoUring>(),
    entry::<pidfd::Pidfd>(),
    entry::<nsfile::NsFile>(),
    entry::<mqueue::Mqueue>(),
    entry::<ghost::Ghost>(),
    entry::<deleted::Deleted>(),
    entry::<pipe::Fifo>(),
    entry::<ttyline::TtyLine>(),
    entry::<pty::Pty>(),
    entry::<shell_job::ShellJobTty>(),
    entry::<userfaultfd::Userfaultfd>(),
    entry::<tun::Tun>(),
    entry::<file::File>(),
];

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use stasis_image::manifest::{
        DeletedNode, InetSocket, InetState, PipeImage, PtyPair, PtyTermios, UnixSocket, UnixState,
    };

    use super::*;

    /// One saved fd of every kind the image knows. The `match` has no
    /// wildcard: a new `FdKind` variant does not compile here until it has
    /// a sample, and so an owner checked below.
    fn samples() -> Vec<FdKind> {
        let path = || "/x".to_string();
        let all = vec![
            FdKind::Path {
                path: path(),
                pos: 0,
                mode: libc::S_IFREG,
                size: 0,
            },
            FdKind::Pipe {
                id: 1,
                write_end: false,
            },
            FdKind::Fifo {
                path: path(),
                id: 1,
            },
            FdKind::Eventfd {
                count: 0,
                semaphore: false,
            },
            FdKind::Timerfd {
                clockid: 0,
                value_ns: 0,
                interval_ns: 0,
                ticks: 0,
            },
            FdKind::Signalfd { mask: 0 },
            FdKind::BpfMap(stasis_image::manifest::BpfMap {
                map_type: 1,
                key_size: 4,
                value_size: 4,
                max_entries: 1,
                map_flags: 0,
                map_extra: 0,
                name: String::new(),
                frozen: false,
                elements: vec![],
                id: 0,
                cpus: 0,
                btf: None,
                inner: vec![],
            }),
            FdKind::Epoll {
                targets: vec![],
                registrar: None,
            },
            FdKind::Ghost {
                path: path(),
                id: 1,
                pos: 0,
            },
            FdKind::Memfd {
                name: path(),
                id: 1,
                pos: 0,
            },
            FdKind::Inotify { watches: vec![] },
            FdKind::Fanotify {
                flags: 0,
                event_flags: 0,
                marks: vec![],
            },
            FdKind::DeletedNode(DeletedNode {
                path: path(),
                id: 1,
                mode: libc::S_IFIFO,
                rdev: 0,
                uid: 0,
                gid: 0,
                pos: 0,
                target: None,
            }),
            FdKind::Unix(UnixSocket {
                ino: 1,
                sock_type: libc::SOCK_STREAM,
                name: None,
                state: UnixState::Unconnected,
                queue: vec![],
                queue_creds: vec![],
                options: vec![],
                file_owner: None,
                file_deleted: false,
                queue_fds: Vec::new(),
                shutdown: 0,
                pending: Vec::new(),
            }),
            FdKind::Inet(InetSocket {
                family: libc::AF_INET,
                sock_type: libc::SOCK_DGRAM,
                protocol: 0,
                local: vec![],
                peer: vec![],
                state: InetState::Plain,
                options: vec![],
                datagrams: vec![],
                filter: None,
                shutdown: 0,
                byte_options: vec![],
            }),
            FdKind::Netlink(stasis_image::manifest::NetlinkSocket {
                sock_type: libc::SOCK_RAW,
                protocol: 0,
                portid: 0,
                groups: vec![],
                dst_portid: 0,
                dst_group: 0,
                options: vec![],
            }),
            FdKind::Packet(stasis_image::manifest::PacketSocket {
                sock_type: libc::SOCK_RAW,
                protocol: 0,
                bound: vec![],
                packet_options: vec![],
                fanout: None,
                memberships: vec![],
                rx_ring: None,
                tx_ring: None,
                options: vec![],
            }),
            FdKind::PtyMaster(PtyPair {
                index: 3,
                termios: PtyTermios::default(),
                winsize: [0; 4],
                locked: false,
                packet: false,
                master_exclusive: false,
                slave_exclusive: false,
                slave_closed: false,
                input_lines: vec![],
                input: vec![],
                output: vec![],
                session: None,
                slave_node: None,
                pkt_status: 0,
                stopped_by_ioctl: false,
                ldisc: 0,
                devpts: None,
            }),
            FdKind::PtySlave { index: 3 },
            FdKind::PtyHungUp { index: 3 },
            FdKind::CurrentTty { index: 3 },
            FdKind::Pidfd { pid: 1, dead: None },
            FdKind::NsFile {
                kind: "net".into(),
                ino: 1,
                of: Default::default(),
            },
            FdKind::IoUring(stasis_image::manifest::IoUringRing {
                ino: 1,
                sq_entries: 1,
                cq_entries: 2,
                setup_flags: 0,
                sq_head: 0,
                cq_tail: 0,
                sq_tail: 0,
                cq_head: 0,
                areas: vec![],
                files: vec![],
                buffers: vec![],
                issuer: None,
                sq_thread_cpu: None,
                personalities: vec![],
            }),
            FdKind::ExternalTty { current: false },
            FdKind::TtyLine {
                path: "/dev/tty7".into(),
                rdev: libc::makedev(4, 7),
                termios: PtyTermios::default(),
                winsize: [24, 80, 0, 0],
                session: None,
            },
            FdKind::LineDevTty {
                path: "/dev/tty7".into(),
                rdev: libc::makedev(4, 7),
                termios: PtyTermios::default(),
                winsize: [24, 80, 0, 0],
                session: stasis_image::manifest::PtySession {
                    sid: 1,
                    foreground: 1,
                },
            },
            FdKind::Mqueue {
                name: "q".into(),
                queue: None,
            },
            FdKind::Userfaultfd(stasis_image::manifest::UffdImage {
                features: None,
                ranges: vec![],
                protected: vec![],
            }),
            FdKind::Tun(stasis_image::manifest::TunFile {
                iff: "tun0".into(),
                flags: 1,
                persist: false,
            }),
        ];
        for k in &all {
            match k {
                FdKind::Path { .. }
                | FdKind::Pipe { .. }
                | FdKind::Fifo { .. }
                | FdKind::Eventfd { .. }
                | FdKind::Timerfd { .. }
                | FdKind::Signalfd { .. }
                | FdKind::BpfMap(_)
                | FdKind::Epoll { .. }
                | FdKind::Ghost { .. }
                | FdKind::Memfd { .. }
                | FdKind::Inotify { .. }
                | FdKind::Fanotify { .. }
                | FdKind::DeletedNode(_)
                | FdKind::Unix(_)
                | FdKind::Inet(_)
                | FdKind::Netlink(_)
                | FdKind::Packet(_)
                | FdKind::PtyMaster(_)
                | FdKind::PtySlave { .. }
                | FdKind::PtyHungUp { .. }
                | FdKind::CurrentTty { .. }
                | FdKind::Pidfd { .. }
                | FdKind::NsFile { .. }
                | FdKind::IoUring(_)
                | FdKind::ExternalTty { .. }
                | FdKind::Mqueue { .. }
                | FdKind::TtyLine { .. }
                | FdKind::LineDevTty { .. }
                | FdKind::Userfaultfd(_)
                | FdKind::Tun(_) => {}
            }
        }
        all
    }

    #[test]
    fn every_saved_kind_has_exactly_one_owner() {
        for k in samples() {
            let owners: Vec<_> = REGISTRY
                .iter()
                .filter(|e| (e.owns)(&k))
                .map(|e| e.name)
                .collect();
            assert_eq!(owners.len(), 1, "{k:?} is restored by {owners:?}");
        }
    }

    #[test]
    fn registry_order_and_known_anonymous_inodes() {
        let names: Vec<_> = REGISTRY.iter().map(|e| e.name).collect();
        let at = |n: &str| names.iter().position(|x| *x == n).unwrap();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        // Plain files take whatever is left; deleted files before FIFOs.
        assert_eq!(names.last(), Some(&file::File::NAME));
        assert!(at(ghost::Ghost::NAME) < at(pipe::Fifo::NAME));
        assert!(at(deleted::Deleted::NAME) < at(pipe::Fifo::NAME));
        // A queue whose name was unlinked is refused, not saved as a
        // deleted file.
        assert!(at(mqueue::Mqueue::NAME) < at(ghost::Ghost::NAME));
        let mut anon: Vec<_> = REGISTRY.iter().filter_map(|e| e.anon_inode).collect();
        anon.sort_unstable();
        assert_eq!(
            anon,
            [
                "anon_inode:[eventfd]",
                "anon_inode:[eventpoll]",
                "anon_inode:[fanotify]",
                "anon_inode:[io_uring]",
                "anon_inode:[pidfd]",
                "anon_inode:[signalfd]",
                "anon_inode:[timerfd]",
                "anon_inode:[userfaultfd]",
                "anon_inode:bpf-map",
                "anon_inode:inotify"
            ]
        );
        for a in anon {
            assert_eq!(save::unsupported_reason(1, 3, a), None, "{a}");
        }
        let refused = save::unsupported_reason(1, 3, "anon_inode:[perf_event]").unwrap();
        assert!(refused.contains("fd 3"), "{refused}");
    }

    /// A running process may close a file between the preflight's listing
    /// of its fds and the look at one of them: that is no reason to refuse
    /// the dump (the frozen capture sees what is really there).
    #[test]
    fn an_fd_closed_since_it_was_listed_is_not_refused() {
        let me = std::process::id() as i32;
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let link = format!("/proc/{me}/status");
        assert_eq!(save::unsupported_reason(me, fd, &link), None);
        drop(file);
        assert_eq!(save::unsupported_reason(me, fd, &link), None);
    }

    fn image(fd: i32, flags: u32, shared_id: Option<u32>, kind: FdKind) -> FdImage {
        FdImage {
            fd,
            flags,
            cloexec: false,
            shared_id,
            locks: vec![],
            owner: None,
            kind,
        }
    }

    fn link_of(fd: &FdRef<'_>) -> String {
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn restore_makes_the_saved_kind_with_its_state() {
        let pipes = [PipeImage {
            id: 9,
            capacity: 65536,
            data: b"queued".to_vec(),
        }];
        let mut cx = RestoreCtx::new(&pipes, &[], std::iter::empty());
        let count = 5u64 << 32 | 7;
        let ev = image(
            4,
            libc::O_NONBLOCK.unsigned_abs(),
            None,
            FdKind::Eventfd {
                count,
                semaphore: false,
            },
        );
        let e = cx.get(&ev).unwrap();
        assert_eq!(link_of(&e), "anon_inode:[eventfd]");
        let mut buf = [0u8; 8];
        assert_eq!(nix::unistd::read(e.as_fd().as_raw_fd(), &mut buf), Ok(8));
        assert_eq!(u64::from_ne_bytes(buf), count, "the counter, beyond u32");
        drop(e);
        // Both ends of pipe 9, the read end shared by two fds.
        let rd = image(
            5,
            libc::O_NONBLOCK.unsigned_abs(),
            Some(1),
            FdKind::Pipe {
                id: 9,
                write_end: false,
            },
        );
        let wr = image(
            6,
            libc::O_WRONLY.unsigned_abs(),
            None,
            FdKind::Pipe {
                id: 9,
                write_end: true,
            },
        );
        let w = match cx.get(&wr).unwrap() {
            FdRef::Owned(o) => o,
            FdRef::Borrowed(_) => panic!("an unshared fd is owned"),
        };
        let first = cx.get(&rd).unwrap().as_fd().as_raw_fd();
        let again = cx.get(&rd).unwrap();
        assert_eq!(again.as_fd().as_raw_fd(), first, "one shared description");
        assert!(link_of(&again).starts_with("pipe:["));
        let mut buf = [0u8; 16];
        let n = nix::unistd::read(again.as_fd().as_raw_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"queued");
        assert_eq!(
            nix::unistd::read(again.as_fd().as_raw_fd(), &mut buf),
            Err(nix::errno::Errno::EAGAIN),
            "O_NONBLOCK is set on the read end"
        );
        assert_eq!(nix::unistd::write(&w, b"x"), Ok(1));
    }

    #[test]
    fn a_pipe_missing_its_data_and_a_kind_asked_for_another_are_errors() {
        let mut cx = RestoreCtx::new(&[], &[], std::iter::empty());
        let ghost = image(
            3,
            0,
            None,
            FdKind::Memfd {
                name: "m".into(),
                id: 4,
                pos: 0,
            },
        );
        let e = cx.get(&ghost).err().unwrap().to_string();
        assert!(
            e.contains("no saved content for deleted file or memfd 4"),
            "{e}"
        );
        let e = <eventfd::Eventfd as Object>::restore(&mut cx, &ghost)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not a saved eventfd"), "{e}");
    }
}
