//! Memory areas of a process: what backs them, which pages to save, and the
//! copy pipeline that streams those pages into a page pack.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use stasis_image::manifest::{Vma, VmaKind};
use stasis_kernel::mem::{read_ranges, ProcessMemory};
use stasis_kernel::pagemap::{Pagemap, ScanQuery};
use stasis_kernel::KernelError;
use stasis_sys::vmflags::{DROPPABLE, GROWSDOWN, MAYWRITE};

use crate::SaveError;
use crate::{proc, CaptureError, Result};

/// Why an area cannot be dumped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnsupportedArea(pub String);

/// What backs a maps entry, or why it is unsupported. `Ok(None)` means the
/// area is not part of the image (`[vsyscall]`).
pub fn vma_kind(m: &proc::MapsEntry) -> Result<Option<VmaKind>, UnsupportedArea> {
    let n = m.name.as_str();
    Ok(Some(match n {
        "[vsyscall]" => return Ok(None),
        "[vdso]" => VmaKind::Vdso,
        "[vvar]" => VmaKind::Vvar,
        "[vvar_vclock]" => VmaKind::VvarVclock,
        "" | "[heap]" | "[stack]" => VmaKind::Anon,
        _ if n.starts_with("[anon:") || n.starts_with("[anon_shmem:") => VmaKind::Anon,
        _ if m.shared && n.starts_with("/dev/zero (deleted)") => VmaKind::Anon,
        _ if n.starts_with("/SYSV") => VmaKind::SysvShm {
            shmid: i32::try_from(m.ino).map_err(|_| {
                UnsupportedArea(format!(
                    "area {:#x}-{:#x}: odd System V segment id {}",
                    m.start, m.end, m.ino
                ))
            })?,
            offset: m.offset,
            // (Known once the segment's size is: `SaveCtx::capture_sysv`.)
            partial: false,
        },
        "/[aio] (deleted)" if m.shared => VmaKind::Aio,
        // Saved with the instance's fd (`stasis_objects::io_uring`).
        stasis_objects::io_uring::LINK if m.shared => VmaKind::IoUring {
            ino: m.ino,
            offset: m.offset,
        },
        // The memory of a ring stasis restored (`IORING_SETUP_NO_MMAP`).
        _ if m.shared && stasis_objects::io_uring::restored_area(n).is_some() => VmaKind::IoUring {
            ino: m.ino,
            offset: stasis_objects::io_uring::restored_area(n).map_or(0, |a| a.1),
        },
        _ if n.ends_with(" (deleted)") && n.starts_with('/') => VmaKind::Ghost {
            id: m.ino,
            offset: m.offset,
            name: n.trim_end_matches(" (deleted)").to_string(),
        },
        _ if n.starts_with('/') => VmaKind::File {
            path: n.to_string(),
            offset: m.offset,
            dev: (u64::from(m.dev.0) << 32) | u64::from(m.dev.1),
            ino: m.ino,
        },
        // Its fd is found once the process's fds are known (`collect`).
        _ if n.starts_with("socket:[") => VmaKind::SocketRing {
            ino: m.ino,
            fd: -1,
            offset: m.offset,
        },
        // Its fd, and so its map, is found once the process's fds are
        // known (`collect`).
        "anon_inode:bpf-map" if m.shared => VmaKind::BpfMap {
            fd: -1,
            offset: m.offset,
        },
        "anon_inode:bpf-map" => {
            return Err(UnsupportedArea(format!(
                "area {:#x}-{:#x} maps a BPF map privately, which stasis does not map again; map it shared (MAP_SHARED) or unmap it (stasis saves the array itself through its fd)",
                m.start, m.end
            )))
        }
        _ if n.starts_with('[') => {
            return Err(UnsupportedArea(format!(
                "area {:#x}-{:#x} is a special mapping {n} that stasis does not know",
                m.start, m.end
            )))
        }
        _ => {
            return Err(UnsupportedArea(format!(
                "area {:#x}-{:#x} has an unexpected name {n:?}",
                m.start, m.end
            )))
        }
    }))
}

/// Finds a `syscall` instruction (0f 05) in the process: in its vDSO, or,
/// for a process that unmapped its vDSO, in its executable mappings (the
/// two bytes anywhere will do: the thread runs that one instruction).
pub fn find_syscall_insn(mem: &ProcessMemory, maps: &[proc::MapsEntry]) -> Option<u64> {
    let in_area = |start: u64, end: u64| -> Option<u64> {
        // The first 16 MiB of an area are plenty for a libc or a program.
        let len = usize::try_from((end - start).min(16 << 20)).ok()?;
        let mut buf = vec![0u8; len];
        mem.read(start, &mut buf).ok()?;
        buf.windows(2)
            .position(|w| w == [0x0f, 0x05])
            .map(|p| start + p as u64)
    };
    if let Some(v) = maps.iter().find(|m| m.name == "[vdso]") {
        return in_area(v.start, v.end);
    }
    maps.iter()
        .filter(|m| m.exec && m.read && m.name != "[vsyscall]")
        .find_map(|m| in_area(m.start, m.end))
}

/// The areas of one process and the ranges of it to save.
pub struct MemoryPlan {
    pub vmas: Vec<Vma>,
    pub ranges: Vec<(u64, usize)>,
    /// [`Scan::DataAndProtection`]: the ranges of private anonymous data
    /// whose userfaultfd write-protection is not set.
    pub unprotected: Vec<(u64, u64)>,
}

/// What [`plan_with`] looks for in private areas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// Nothing: their ranges are left out (planned later, elsewhere).
    None,
    /// The pages that hold data.
    Data,
    /// The pages that hold data, and which of those in anonymous areas are
    /// not write-protected (same page-table walk).
    DataAndProtection,
}

pub use stasis_image::ranges::{lengths, spans};

/// Of each shared anonymous object (by inode), the ranges of offsets in
/// it that an earlier area of the image covers: their pages are saved once,
/// by that area.
pub type SeenShm = HashMap<u64, Vec<(u64, u64)>>;

/// Decides what to save of each area. `seen_shm`: the parts of
/// shared-memory objects already saved by an earlier process (or area) of
/// the image.
pub fn plan(
    pid: i32,
    maps: &[proc::MapsEntry],
    vmflags: &[(u64, u32)],
    seen_shm: &mut SeenShm,
) -> Result<MemoryPlan> {
    plan_with(pid, maps, vmflags, seen_shm, Scan::Data)
}

/// [`plan`], looking for `scan` in private areas. `vmflags`: each area's
/// start and its `VmFlags` bits (`proc::parse_smaps_vmflags`), sorted by
/// start.
pub fn plan_with(
    pid: i32,
    maps: &[proc::MapsEntry],
    vmflags: &[(u64, u32)],
    seen_shm: &mut SeenShm,
    scan: Scan,
) -> Result<MemoryPlan> {
    let mut vmas = Vec::new();
    let mut ranges: Vec<(u64, usize)> = Vec::new();
    let mut unprotected = Vec::new();
    let pagemap = Pagemap::open(pid)?;
    let mut have_scan = true;
    // Shared anonymous objects this process maps shared: a private
    // mapping of one of them (through `/proc/self/map_files`) reads it
    // where it has not copied on write.
    let shared_objects: HashSet<u64> = maps
        .iter()
        .filter(|m| m.shared && m.name.starts_with("/dev/zero (deleted)"))
        .map(|m| m.ino)
        .collect();
    for m in maps {
        let Some(mut kind) = vma_kind(m).map_err(|e| SaveError::Unsupported { pid, what: e.0 })?
        else {
            continue;
        };
        let private_of_shared =
            !m.shared && m.name == "/dev/zero (deleted)" && shared_objects.contains(&m.ino);
        if private_of_shared {
            kind = VmaKind::Anon;
        }
        let shm = (matches!(kind, VmaKind::Anon) && (m.shared || private_of_shared))
            .then_some((m.ino, m.offset));
        let bits = vmflags
            .binary_search_by_key(&m.start, |f| f.0)
            .map_or(0, |i| vmflags[i].1);
        // Guard pages (`MADV_GUARD_INSTALL`) found among the private pages.
        let mut guards = Vec::new();
        let data: Vec<(u64, u64)> = match (&kind, m.shared) {
            (
                VmaKind::Vdso
                | VmaKind::Vvar
                | VmaKind::VvarVclock
                | VmaKind::Aio
                | VmaKind::SocketRing { .. }
                | VmaKind::IoUring { .. }
                | VmaKind::BpfMap { .. },
                _,
            ) => Vec::new(),
            // MAP_DROPPABLE memory is a cache the kernel may empty at any
            // time: restored empty, as CRIU does (zdtm's maps11 checks it).
            _ if bits & DROPPABLE != 0 => Vec::new(),
            (VmaKind::File { .. }, true) | (VmaKind::SysvShm { .. }, _) => Vec::new(),
            (VmaKind::Anon, true) => shm_pages_to_save(pid, m, seen_shm)?,
            _ if scan == Scan::None => Vec::new(),
            _ => {
                // A private mapping of a shared object: only the pages it
                // copied on write are its own, as for a file.
                let anon = matches!(kind, VmaKind::Anon) && !private_of_shared;
                let query = if anon {
                    let mut q = ScanQuery::anon_data();
                    if scan == Scan::DataAndProtection {
                        q.return_mask |= stasis_sys::PAGE_IS_WRITTEN;
                    }
                    q
                } else {
                    ScanQuery::private_data()
                };
                let (regions, g) = if have_scan {
                    match pagemap
                        .scan(m.start, m.end, query)
                        .and_then(|r| pagemap.drop_markers(r))
                    {
                        Ok(r) => r,
                        Err(KernelError::Unsupported { .. }) => {
                            have_scan = false;
                            pagemap.private_data_by_entries(m.start, m.end)?
                        }
                        Err(e) => return Err(e.into()),
                    }
                } else {
                    pagemap.private_data_by_entries(m.start, m.end)?
                };
                if anon && scan == Scan::DataAndProtection {
                    unprotected.extend(
                        regions
                            .iter()
                            .filter(|r| r.categories & stasis_sys::PAGE_IS_WRITTEN != 0)
                            .map(|r| (r.start, r.end)),
                    );
                }
                guards = g;
                regions.iter().map(|r| (r.start, r.end)).collect()
            }
        };
        for (a, b) in data {
            ranges.push((a, usize::try_from(b - a).unwrap_or(0)));
        }
        let kept = if m.shared {
            !GROWSDOWN
        } else {
            !(GROWSDOWN | MAYWRITE)
        };
        vmas.push(Vma {
            start: m.start,
            end: m.end,
            prot: m.prot(),
            shared: m.shared,
            growsdown: bits & GROWSDOWN != 0,
            flags: bits & kept,
            guards,
            name: if m.name.starts_with('[') {
                m.name.clone()
            } else {
                String::new()
            },
            kind,
            shm,
        });
    }
    Ok(MemoryPlan {
        vmas,
        ranges,
        unprotected: stasis_image::chain::normalize(unprotected),
    })
}

pub use stasis_kernel::fdops::data_extents;

/// The pages of shared anonymous area `m` to save here: those that exist
/// in its object at offsets no earlier area covered (one process may map a
/// part of an object that another, or another area, does not).
fn shm_pages_to_save(pid: i32, m: &proc::MapsEntry, seen: &mut SeenShm) -> Result<Vec<(u64, u64)>> {
    let covers = [(m.offset, m.offset + (m.end - m.start))];
    let saved = seen.entry(m.ino).or_default();
    let todo = stasis_image::ranges::subtract(&covers, saved);
    if todo.is_empty() {
        return Ok(Vec::new());
    }
    *saved = stasis_image::ranges::normalize(saved.iter().copied().chain(covers).collect());
    // Offsets in the object, as addresses of this area.
    let todo: Vec<(u64, u64)> = todo
        .iter()
        .map(|&(a, b)| (m.start + (a - m.offset), m.start + (b - m.offset)))
        .collect();
    Ok(stasis_image::ranges::intersect(&shmem_data(pid, m)?, &todo))
}

/// The pages of a shared anonymous area `m` that exist in its shmem object,
/// as address ranges. Reading a hole through the process's mapping would
/// allocate a page for it (shmem has no shared zero page): a 143 MiB
/// segment with 11 MiB in use would become fully resident, and its image
/// would hold all of it. So the object itself is asked, through
/// `/proc/PID/map_files`, where its data is.
fn shmem_data(pid: i32, m: &proc::MapsEntry) -> Result<Vec<(u64, u64)>> {
    let name = format!("map_files/{:x}-{:x}", m.start, m.end);
    let f = std::fs::File::open(proc::proc_path(pid, &name))
        .map_err(|e| CaptureError::from_proc(pid, &name, e))?;
    let ext = data_extents(&f, m.offset, m.offset + (m.end - m.start))
        .map_err(|e| CaptureError::from_proc(pid, &format!("{name} (SEEK_DATA)"), e))?;
    let page = stasis_sys::PAGE_SIZE;
    Ok(ext
        .into_iter()
        .map(|(a, b)| {
            let start = (m.start + (a - m.offset)) & !(page - 1);
            let end = (m.start + (b - m.offset)).div_ceil(page) * page;
            (start.max(m.start), end.min(m.end))
        })
        .filter(|(a, b)| a < b)
        .collect())
}

/// Writes the pages of `data` (at `addr`) that `filter` accepts, as runs of
/// consecutive accepted pages.
pub fn write_filtered(
    pack: &mut stasis_image::PackWriter,
    filter: &mut PageFilter<'_>,
    addr: u64,
    data: &[u8],
) -> Result<()> {
    let page = usize::try_from(stasis_sys::PAGE_SIZE).unwrap_or(4096);
    let mut run: Option<usize> = None; // start offset of the pending run
    for (i, p) in data.chunks(page).enumerate() {
        let off = i * page;
        if filter(addr + off as u64, p) {
            run.get_or_insert(off);
        } else if let Some(s) = run.take() {
            pack.write_run(addr + s as u64, &data[s..off])?;
        }
    }
    if let Some(s) = run {
        pack.write_run(addr + s as u64, &data[s..])?;
    }
    Ok(())
}

/// Size of each pipeline buffer, and how many are in flight: the dumper's
/// memory use is bounded by their product, whatever the image size.
const PIPE_BUF: usize = 8 << 20;
const PIPE_DEPTH: usize = 3;

/// Progress across the processes of a dump: (bytes done before this
/// process, total bytes, callback).
pub type Progress<'a> = (u64, u64, Option<&'a (dyn Fn(u64, u64) + Send)>);

/// Decides page by page whether a page read is written to the pack
/// (`(address, page) -> write it`).
pub type PageFilter<'a> = &'a mut dyn FnMut(u64, &[u8]) -> bool;

/// Copies `ranges` of the process into the pack: a reader thread fills
/// buffers with `process_vm_readv` while this thread hashes and writes the
/// previous one, so reading and writing overlap. With a `filter`, only the
/// pages it accepts are written.
pub fn copy_pages(
    mem: &ProcessMemory,
    mut ranges: Vec<(u64, usize)>,
    pack: &mut stasis_image::PackWriter,
    progress: Progress<'_>,
    mut filter: Option<PageFilter<'_>>,
) -> Result<()> {
    use std::sync::mpsc;
    let (base, total, progress) = progress;
    let (full_tx, full_rx) = mpsc::sync_channel::<Result<(Vec<u8>, Vec<(u64, usize)>)>>(PIPE_DEPTH);
    let (empty_tx, empty_rx) = mpsc::sync_channel::<Vec<u8>>(PIPE_DEPTH);
    // Small copies (incremental dumps) get small buffers: every page of a
    // fresh buffer costs a fault and a zeroed page (and on a VM possibly a
    // host fault), which for a few MiB costs more than the copy itself.
    let need: usize = ranges.iter().map(|r| r.1).sum();
    let buf_len = (need / 16).clamp(64 << 10, PIPE_BUF) & !4095;
    for _ in 0..PIPE_DEPTH.min(need.div_ceil(buf_len).max(1)) {
        let _ = empty_tx.send(vec![0u8; buf_len]);
    }
    std::thread::scope(|scope| -> Result<()> {
        // Owned by this closure, so that an early return (a failed write)
        // drops it before the scope joins the reader: the reader, waiting
        // for an empty buffer, then ends instead of waiting for ever (a
        // dump whose image write failed hung here).
        let empty_tx = empty_tx;
        scope.spawn(move || {
            let mut i = 0;
            while i < ranges.len() {
                let Ok(mut buf) = empty_rx.recv() else { return };
                // Take ranges until the buffer is full, splitting a large one.
                let mut batch: Vec<(u64, usize)> = Vec::new();
                let mut used = 0usize;
                while i < ranges.len() && used < buf_len {
                    let (a, l) = ranges[i];
                    let take = l.min(buf_len - used);
                    batch.push((a, take));
                    used += take;
                    if take == l {
                        i += 1;
                    } else {
                        ranges[i] = (a + take as u64, l - take);
                    }
                }
                let r = read_ranges(mem, &batch, &mut buf[..used])
                    .map(|()| (buf, batch))
                    .map_err(CaptureError::from);
                let failed = r.is_err();
                if full_tx.send(r).is_err() || failed {
                    return;
                }
            }
        });
        let mut done = 0u64;
        let mut last = Instant::now();
        for item in full_rx {
            let (buf, batch) = item?;
            let mut off = 0usize;
            for (a, l) in batch {
                match filter.as_mut() {
                    None => pack.write_run(a, &buf[off..off + l])?,
                    Some(f) => write_filtered(pack, f, a, &buf[off..off + l])?,
                }
                off += l;
            }
            done += off as u64;
            let _ = empty_tx.send(buf);
            if let Some(p) = progress {
                if last.elapsed().as_millis() >= 100 {
                    p(base + done, total);
                    last = Instant::now();
                }
            }
        }
        if let Some(p) = progress {
            p(base + done, total);
        }
        Ok(())
    })
}

#[cfg(test)]
mod kind_tests {
    use super::*;

    #[test]
    fn a_mapped_socket_ring_is_known_by_its_socket() {
        let m = stasis_kernel::procfs::parse_maps(
            "7f0000000000-7f0000002000 rw-s 00000000 00:08 6444194                    socket:[6444194]\n",
        )
        .unwrap();
        assert_eq!(
            vma_kind(&m[0]).unwrap(),
            Some(VmaKind::SocketRing {
                ino: 6444194,
                fd: -1,
                offset: 0
            })
        );
    }

    #[test]
    fn a_shared_bpf_map_area_is_the_maps() {
        let m = stasis_kernel::procfs::parse_maps(
            "7f0000000000-7f0000001000 rw-s 00000000 00:10 1057                       anon_inode:bpf-map
             7f0000001000-7f0000002000 r--p 00000000 00:10 1057                       anon_inode:bpf-map
",
        )
        .unwrap();
        assert_eq!(
            vma_kind(&m[0]).unwrap(),
            Some(VmaKind::BpfMap { fd: -1, offset: 0 })
        );
        assert!(vma_kind(&m[1]).is_err());
    }

    // An io_uring instance's rings, mapped from its fd or (restored) in a
    // memfd stasis named, are saved with the fd: not as memory.
    #[test]
    fn io_uring_rings_are_the_instances() {
        let m = stasis_kernel::procfs::parse_maps(
            "7f0000000000-7f0000001000 rw-s 10000000 00:10 8801481                    anon_inode:[io_uring]
             7f0000001000-7f0000002000 rw-s 00000000 00:01 21609                      /memfd:stasis-io_uring:fd7:rings (deleted)
             7f0000002000-7f0000003000 rw-s 00000000 00:01 21610                      /memfd:other (deleted)
",
        )
        .unwrap();
        let kinds: Vec<_> = m.iter().map(|e| vma_kind(e).unwrap().unwrap()).collect();
        assert_eq!(
            kinds[0],
            VmaKind::IoUring {
                ino: 8_801_481,
                offset: 0x1000_0000
            }
        );
        assert_eq!(
            kinds[1],
            VmaKind::IoUring {
                ino: 21609,
                offset: 0
            }
        );
        assert!(matches!(kinds[2], VmaKind::Ghost { .. }));
    }
}
