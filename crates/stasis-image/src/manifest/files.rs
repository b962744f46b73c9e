//! The files of a manifest that have no name any more: deleted files and
//! memfds (with their content), and deleted directories, FIFOs and device
//! nodes; and BPF maps (anonymous, with their elements).

use serde::{Deserialize, Serialize};

use super::{check_extents, content, Content, ContentError, Extent};

impl GhostFile {
    /// Size of the file and its data extents, in order
    /// (checked: inside the size, no overlap).
    pub fn content(&self) -> Result<Content<'_>, ContentError> {
        let (size, ext) = content(&self.data, self.size, &self.extents);
        check_extents(size, &ext, || format!("deleted file or memfd {}", self.id))?;
        Ok((size, ext))
    }
}

/// A file that no longer has a name (deleted while open, or a memfd),
/// saved with its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GhostFile {
    /// Inode number at dump (identifies it within the image).
    pub id: u64,
    pub mode: u32,
    /// The whole content, in images written before sparse content
    /// (`size` 0 and no `extents`); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "serde_bytes")]
    pub data: Vec<u8>,
    /// memfd seals (`F_GET_SEALS`), 0 for a deleted file.
    #[serde(default)]
    pub seals: u32,
    /// Size of the file in bytes.
    #[serde(default)]
    pub size: u64,
    /// The byte runs that hold data (`SEEK_DATA`); the rest is holes.
    #[serde(default)]
    pub extents: Vec<Extent>,
    /// Owner and group (`None` in images written before they were kept:
    /// the restorer's).
    #[serde(default)]
    pub owner: Option<(u32, u32)>,
    /// Last access and modification times (`None` in older images).
    #[serde(default)]
    pub times: Option<FileTimes>,
    /// On hugetlbfs: a memfd made with `MFD_HUGETLB`, or the hidden file
    /// of `MAP_HUGETLB` anonymous memory (made again on huge pages).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hugetlb: bool,
}

/// A file's access and modification times, to the nanosecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileTimes {
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
}

/// A directory, FIFO, character/block device node or symbolic link
/// deleted while open
/// (or the deleted working directory of a process). Made again at its old
/// path (or next to it), opened and removed at once; a FIFO's queued
/// bytes are in `Manifest::pipes` under `id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedNode {
    /// Where it lived (without the " (deleted)" of `/proc`).
    pub path: String,
    /// Inode number at dump: one node per id, shared by its fds.
    pub id: u64,
    /// Type and permission bits (`st_mode`).
    pub mode: u32,
    /// Device number of a device node (`st_rdev`), 0 otherwise.
    pub rdev: u64,
    pub uid: u32,
    pub gid: u32,
    /// Offset (a directory's `readdir` position is not kept).
    pub pos: u64,
    /// What a symbolic link (held by an `O_PATH` fd) points to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// A BPF map: what `BPF_MAP_CREATE` was given and its elements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BpfMap {
    /// `enum bpf_map_type` (hash, array, LRU hash, their per-CPU kinds,
    /// queue, stack, array or hash of maps).
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub map_extra: u64,
    /// Its name (up to 15 bytes).
    pub name: String,
    /// Frozen (`BPF_MAP_FREEZE`): the syscall side can no longer change it.
    pub frozen: bool,
    /// (key, value) of every element, in the kernel's key order. A
    /// per-CPU map's value is one `value_size` rounded up to 8 bytes per
    /// possible CPU; a queue's or stack's keys are empty and its values in
    /// the order they are popped; a map of maps' value is the index in
    /// `inner` of the map it holds (u32, native endian).
    pub elements: Vec<(Vec<u8>, Vec<u8>)>,
    /// The map's id at the dump (0 in older images): fds and maps of maps
    /// holding one map share it again.
    #[serde(default)]
    pub id: u32,
    /// Possible CPUs of the dumping host, for a per-CPU map (0 otherwise).
    #[serde(default)]
    pub cpus: u32,
    /// Its BTF object and the key and value type ids in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub btf: Option<BpfBtf>,
    /// The maps a map of maps holds, each once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inner: Vec<BpfMap>,
}

/// The BTF object of a BPF map: its raw data (`BPF_BTF_LOAD` loads it
/// again) and the type ids of the map's keys and values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BpfBtf {
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    pub key_type_id: u32,
    pub value_type_id: u32,
}
