//! manifest.bin framing: round trip, determinism, and hostile input.
// Test code runs on 64-bit Linux only; offsets and lengths fit usize.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::path::Path;

use common::*;
use stasis_image::*;

fn small_manifest() -> Manifest {
    let pack = PackRef {
        name: "pages-100.pack".into(),
        size: 12345,
        pages: 3,
        index_checksum: 0xdead_beef,
    };
    manifest(3, vec![process(100, Some(pack)), process(101, None)])
}

fn p() -> &'static Path {
    Path::new("manifest.bin")
}

/// `m` calls for format `version`, is written with it, reads back equal,
/// and is refused when its header says `lower`.
fn assert_version_round_trips(m: &manifest::Manifest, version: u32, lower: u32) {
    assert_eq!(m.format_version(), version, "{m:?}");
    let bytes = encode_manifest(m).unwrap();
    assert_eq!(
        u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        version
    );
    assert_eq!(decode_manifest(&bytes, 3, p()).unwrap(), *m);
    let mut low = bytes.clone();
    low[8..12].copy_from_slice(&lower.to_le_bytes());
    assert!(decode_manifest(&low, 3, p()).is_err());
}

#[test]
fn round_trip_and_reencode_is_identical() {
    let m = small_manifest();
    let bytes = encode_manifest(&m).unwrap();
    assert_eq!(&bytes[..8], b"STASISMF");
    assert_eq!(
        u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        FORMAT_VERSION
    );
    assert_eq!(u32::from_le_bytes(bytes[12..16].try_into().unwrap()), 32);
    assert_eq!(
        u64::from_le_bytes(bytes[16..24].try_into().unwrap()),
        bytes.len() as u64 - 32
    );
    let back = decode_manifest(&bytes, 3, p()).unwrap();
    assert_eq!(back, m);
    let again = encode_manifest(&back).unwrap();
    assert_eq!(
        again, bytes,
        "re-encoding a decoded manifest must give identical bytes"
    );
}

#[test]
fn every_flipped_byte_is_an_error() {
    let m = small_manifest();
    let bytes = encode_manifest(&m).unwrap();
    for i in 0..bytes.len() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= mask;
            match decode_manifest(&b, 3, p()) {
                Ok(got) => panic!(
                    "flip at byte {i} (mask {mask:#x}) accepted (same content: {})",
                    got == m
                ),
                Err(e) => assert_style(&e),
            }
        }
    }
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = encode_manifest(&small_manifest()).unwrap();
    for len in 0..bytes.len() {
        let e = decode_manifest(&bytes[..len], 3, p()).unwrap_err();
        assert!(
            matches!(e, ImageError::CorruptManifest { checkpoint: 3, .. }),
            "len {len}: {e}"
        );
    }
    // Trailing garbage too.
    let mut long = bytes.clone();
    long.push(0);
    assert!(decode_manifest(&long, 3, p()).is_err());
}

#[test]
fn checksum_error_message() {
    let mut bytes = encode_manifest(&small_manifest()).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let e = decode_manifest(&bytes, 3, p()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "manifest manifest.bin of checkpoint 3 is corrupt (checksum mismatch): the image cannot be trusted; \
         restore an earlier checkpoint with --checkpoint N"
    );
}

#[test]
fn newer_version_is_refused_with_specific_error() {
    let mut bytes = encode_manifest(&small_manifest()).unwrap();
    let next = manifest::LATEST_MANIFEST_VERSION + 1;
    bytes[8..12].copy_from_slice(&next.to_le_bytes());
    let e = decode_manifest(&bytes, 3, p()).unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::NewerFormat {
                found,
                supported: stasis_image::FORMAT_VERSION,
                ..
            } if found == next
        ),
        "{e}"
    );
    assert!(
        e.to_string().starts_with(&format!(
            "image format version {next} is newer than this stasis supports (2): upgrade stasis"
        )),
        "{e}"
    );
    bytes[8..12].copy_from_slice(&0u32.to_le_bytes());
    let e = decode_manifest(&bytes, 3, p()).unwrap_err();
    assert!(matches!(e, ImageError::CorruptManifest { .. }), "{e}");
}

#[test]
fn oversize_payload_length_is_refused_before_allocating() {
    let mut bytes = encode_manifest(&small_manifest()).unwrap();
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = decode_manifest(&bytes, 3, p()).unwrap_err();
    assert!(e.to_string().contains("exceeds the limit"), "{e}");

    // Same through the file reader: a 32-byte file announcing 200 MiB.
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    write_checkpoint(&image, &[(0x1000, 1, 1)]);
    let mpath = dir.path().join("checkpoints/00000001/manifest.bin");
    let mut header = bytes[..32].to_vec();
    header[16..24].copy_from_slice(&(200u64 << 20).to_le_bytes());
    std::fs::write(&mpath, &header).unwrap();
    let e = image.load(Some(1)).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[test]
fn valid_checksum_over_garbage_payload_is_an_error_not_a_panic() {
    // An attacker can compute xxh3 too: frame random/hostile CBOR properly.
    let mut rng = Rng(42);
    let hostile: Vec<Vec<u8>> = vec![
        vec![0xbf; 10_000],                                         // deep indefinite maps
        vec![0x9f; 100_000],                                        // deep indefinite arrays
        vec![0x5b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // byte string of 2^64-1
        vec![0x7b, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // text string of 2^63-1
        vec![0x9b, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // array of 2^63-1
        vec![0xbb, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // map of 2^63-1
        vec![],
    ];
    let mut cases = hostile;
    for _ in 0..300 {
        let len = rng.below(300) as usize;
        let mut v = vec![0u8; len];
        rng.fill(&mut v);
        cases.push(v);
    }
    // Mutations of a valid payload with a recomputed checksum.
    let good = encode_manifest(&small_manifest()).unwrap();
    for _ in 0..2000 {
        let mut payload = good[32..].to_vec();
        let i = rng.below(payload.len() as u64) as usize;
        payload[i] = rng.next() as u8;
        cases.push(payload);
    }
    for payload in cases {
        let mut file = Vec::new();
        file.extend_from_slice(b"STASISMF");
        file.extend_from_slice(&1u32.to_le_bytes());
        file.extend_from_slice(&32u32.to_le_bytes());
        file.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        file.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&payload).to_le_bytes());
        file.extend_from_slice(&payload);
        if let Ok(m) = decode_manifest(&file, 3, p()) {
            // A mutation with a recomputed checksum may still be a valid
            // Manifest (unknown keys are ignored for compatibility); it must
            // then be a stable value.
            let again = encode_manifest(&m).unwrap();
            assert_eq!(decode_manifest(&again, 3, p()).unwrap(), m);
        }
    }
}

#[test]
fn load_reports_checkpoint_number_and_refuses_flipped_file() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    write_checkpoint(&image, &[(0x1000, 1, 1)]);
    let mpath = dir.path().join("checkpoints/00000001/manifest.bin");
    let good = std::fs::read(&mpath).unwrap();
    for i in (0..good.len()).step_by(7) {
        let mut b = good.clone();
        b[i] ^= 0x20;
        std::fs::write(&mpath, &b).unwrap();
        let e = image.load(Some(1)).unwrap_err();
        assert_style(&e);
    }
    for len in (0..good.len()).step_by(5) {
        std::fs::write(&mpath, &good[..len]).unwrap();
        let e = image.load(Some(1)).unwrap_err();
        assert!(
            matches!(e, ImageError::CorruptManifest { checkpoint: 1, .. }),
            "len {len}: {e}"
        );
    }
    std::fs::write(&mpath, &good).unwrap();
    assert_eq!(image.load(Some(1)).unwrap().number, 1);
}

#[test]
fn manifest_numbered_differently_from_its_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let image = ImageDir::create_or_open(dir.path()).unwrap();
    write_checkpoint(&image, &[(0x1000, 1, 1)]);
    let m = manifest(9, vec![process(100, None)]);
    let mpath = dir.path().join("checkpoints/00000001/manifest.bin");
    std::fs::write(&mpath, encode_manifest(&m).unwrap()).unwrap();
    let e = image.load(Some(1)).unwrap_err();
    assert!(e.to_string().contains("describes checkpoint 9"), "{e}");
}

/// Frames a CBOR value as a manifest.bin.
fn frame(value: &ciborium::Value) -> Vec<u8> {
    let mut payload = Vec::new();
    ciborium::into_writer(value, &mut payload).unwrap();
    let mut file = Vec::new();
    file.extend_from_slice(b"STASISMF");
    file.extend_from_slice(&1u32.to_le_bytes());
    file.extend_from_slice(&32u32.to_le_bytes());
    file.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    file.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&payload).to_le_bytes());
    file.extend_from_slice(&payload);
    file
}

fn as_map(v: &mut ciborium::Value) -> &mut Vec<(ciborium::Value, ciborium::Value)> {
    match v {
        ciborium::Value::Map(m) => m,
        other => panic!("not a map: {other:?}"),
    }
}

#[test]
fn older_writers_without_defaulted_fields_are_readable() {
    let m = small_manifest();
    let bytes = encode_manifest(&m).unwrap();
    let mut v: ciborium::Value = ciborium::from_reader(&bytes[32..]).unwrap();
    // Drop the fields marked #[serde(default)] at top level.
    as_map(&mut v)
        .retain(|(k, _)| !matches!(k, ciborium::Value::Text(t) if t == "stats" || t == "parent"));
    let back = decode_manifest(&frame(&v), 3, p()).unwrap();
    assert_eq!(back.stats, DumpStats::default());
    assert_eq!(back.parent, None);
    assert_eq!(back.processes, m.processes);
}

#[test]
fn unknown_fields_from_newer_writers_of_the_same_version_are_ignored() {
    let m = small_manifest();
    let bytes = encode_manifest(&m).unwrap();
    let mut v: ciborium::Value = ciborium::from_reader(&bytes[32..]).unwrap();
    as_map(&mut v).push((
        ciborium::Value::Text("future_field".into()),
        ciborium::Value::Array(vec![ciborium::Value::Integer(1.into())]),
    ));
    assert_eq!(decode_manifest(&frame(&v), 3, p()).unwrap(), m);
}

#[test]
fn missing_required_field_is_an_error() {
    let bytes = encode_manifest(&small_manifest()).unwrap();
    let mut v: ciborium::Value = ciborium::from_reader(&bytes[32..]).unwrap();
    as_map(&mut v).retain(|(k, _)| !matches!(k, ciborium::Value::Text(t) if t == "processes"));
    let e = decode_manifest(&frame(&v), 3, p()).unwrap_err();
    assert!(matches!(e, ImageError::CorruptManifest { .. }), "{e}");
}

/// Found by the `manifest` fuzz target: `data_ranges` out of order (or
/// empty, or unaligned) were accepted, and the chain code, which relies on
/// them being sorted and disjoint, then computed nonsense (an underflow in
/// the page count of `inspect`).
#[test]
fn manifest_with_unsorted_data_ranges_is_refused() {
    let good = [(0x1000, 0x3000), (0x5000, 0x6000)];
    let bads: [&[(u64, u64)]; 4] = [
        &[(0x5000, 0x6000), (0x1000, 0x3000)],
        &[(0x3000, 0x1000)],
        &[(0x1000, 0x3000), (0x2000, 0x4000)],
        &[(0x1000, 0x1800)],
    ];
    let mut m = small_manifest();
    m.parent = Some(1);
    m.checkpoint = 2;
    m.processes[0].data_ranges = Some(good.to_vec());
    let bytes = encode_manifest(&m).unwrap();
    assert_eq!(decode_manifest(&bytes, 2, p()).unwrap(), m);
    for bad in bads {
        m.processes[0].data_ranges = Some(bad.to_vec());
        let bytes = encode_manifest(&m).unwrap();
        let e = decode_manifest(&bytes, 2, p()).unwrap_err();
        assert!(e.to_string().contains("data ranges"), "{bad:x?}: {e}");
        assert_style(&e);
    }
}

/// Version 2 writes bulk bytes as CBOR byte strings; version 1 wrote them
/// as arrays of integers, which still decode.
#[test]
fn version_1_byte_arrays_still_decode_and_version_2_writes_byte_strings() {
    use ciborium::Value;
    use stasis_image::manifest::Extent;
    let key = |k: &str| Value::Text(k.into());
    let old = Value::Map(vec![
        (key("offset"), Value::Integer(4096.into())),
        (
            key("data"),
            Value::Array(vec![Value::Integer(1.into()), Value::Integer(200.into())]),
        ),
    ]);
    let mut buf = Vec::new();
    ciborium::into_writer(&old, &mut buf).unwrap();
    let e: Extent = ciborium::from_reader(&buf[..]).unwrap();
    assert_eq!((e.offset, e.data.clone()), (4096, vec![1, 200]));
    let mut buf = Vec::new();
    ciborium::into_writer(&e, &mut buf).unwrap();
    let v: Value = ciborium::from_reader(&buf[..]).unwrap();
    let data = v
        .as_map()
        .and_then(|m| m.iter().find(|(k, _)| *k == key("data")))
        .map(|(_, v)| v.clone());
    assert_eq!(data, Some(Value::Bytes(vec![1, 200])));
}

/// A manifest with namespaces says format version 3 (an older reader
/// refuses it), round-trips, and one of version 2 (none) still loads as
/// the dumper's namespaces.
#[test]
fn namespaces_raise_the_manifest_version_and_round_trip() {
    let mut m = small_manifest();
    let old = encode_manifest(&m).unwrap();
    assert_eq!(decode_manifest(&old, 3, p()).unwrap().namespaces, None);
    m.namespaces = Some(manifest::Namespaces {
        pid: true,
        stand_in_init: false,
        uts: Some(manifest::UtsNamespace {
            hostname: "box".into(),
            domainname: "(none)".into(),
        }),
        ipc: true,
        msg_queues: Vec::new(),
        sem_sets: Vec::new(),
        user: None,
        net: Some(manifest::NetNamespace {
            lo_up: true,
            ..Default::default()
        }),
        cgroup: Some("/box".into()),
        cgroup_ns: None,
        time: None,
        posix_queues: None,
        mnt: Some(manifest::MountNamespace {
            proc: true,
            tmpfs: vec![manifest::TmpfsMount {
                target: "/mnt".into(),
                flags: 2,
                options: "size=1024k".into(),
                source: "shm".into(),
                entries: vec![manifest::TmpfsEntry {
                    path: "f".into(),
                    mode: 0o100644,
                    uid: 0,
                    gid: 0,
                    data: b"content".to_vec(),
                    ..Default::default()
                }],
            }],
            binds: vec![manifest::BindMount {
                source: "/srv/data".into(),
                target: "/data".into(),
                flags: 1,
            }],
            later: Vec::new(),
            root: None,
            slave_copies: false,
        }),
    });
    let bytes = encode_manifest(&m).unwrap();
    assert_eq!(
        u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        manifest::NAMESPACES_MANIFEST_VERSION
    );
    let back = decode_manifest(&bytes, 3, p()).unwrap();
    assert_eq!(back, m);
    assert_eq!(encode_manifest(&back).unwrap(), bytes);
    // Message queues and semaphore sets raise it to 4 (a reader of 3
    // would restore the IPC namespace without them).
    let mut with_ipc = m.clone();
    if let Some(n) = &mut with_ipc.namespaces {
        let perm = |id| manifest::SysvIpcPerm {
            id,
            key: 0x1234,
            uid: 1,
            gid: 2,
            mode: 0o640,
        };
        n.msg_queues = vec![manifest::SysvMsgQueue {
            perm: perm(32768),
            qbytes: 16384,
            messages: vec![manifest::SysvMessage {
                mtype: 7,
                data: b"hello".to_vec(),
            }],
        }];
        n.sem_sets = vec![manifest::SysvSemSet {
            perm: perm(0),
            values: vec![1, 5],
        }];
    }
    let ipc_bytes = encode_manifest(&with_ipc).unwrap();
    assert_eq!(
        u32::from_le_bytes(ipc_bytes[8..12].try_into().unwrap()),
        manifest::NAMESPACE_OBJECTS_MANIFEST_VERSION
    );
    assert_eq!(decode_manifest(&ipc_bytes, 3, p()).unwrap(), with_ipc);
    // The version must be the one the content calls for.
    let mut lower = ipc_bytes.clone();
    lower[8..12].copy_from_slice(&3u32.to_le_bytes());
    assert!(decode_manifest(&lower, 3, p()).is_err());
    // So do mounts made later (here a fresh sysfs).
    let mut with_later = m.clone();
    if let Some(mnt) = with_later.namespaces.as_mut().and_then(|n| n.mnt.as_mut()) {
        mnt.later = vec![manifest::LaterMount {
            target: "/sys".into(),
            flags: 1,
            what: manifest::LaterKind::Fresh {
                fstype: "sysfs".into(),
                source: "sysfs".into(),
                options: String::new(),
            },
            propagation: 0,
        }];
    }
    let later_bytes = encode_manifest(&with_later).unwrap();
    assert_eq!(
        u32::from_le_bytes(later_bytes[8..12].try_into().unwrap()),
        manifest::NAMESPACE_OBJECTS_MANIFEST_VERSION
    );
    assert_eq!(decode_manifest(&later_bytes, 3, p()).unwrap(), with_later);
    // So does a user namespace.
    let mut with_user = m.clone();
    if let Some(n) = &mut with_user.namespaces {
        n.user = Some(manifest::UserNamespace {
            uid_map: vec![[0, 100_000, 65536]],
            gid_map: vec![[0, 100_000, 65536]],
            setgroups_deny: true,
        });
    }
    let user_bytes = encode_manifest(&with_user).unwrap();
    assert_eq!(
        u32::from_le_bytes(user_bytes[8..12].try_into().unwrap()),
        manifest::NAMESPACE_OBJECTS_MANIFEST_VERSION
    );
    assert_eq!(decode_manifest(&user_bytes, 3, p()).unwrap(), with_user);
    // A tmpfs file described by its size (data in the content pack, or
    // all holes) is one an older reader would make empty: 5.
    let mut sized = m.clone();
    let mnt = sized.namespaces.as_mut().unwrap().mnt.as_mut().unwrap();
    mnt.tmpfs[0].entries[0].data.clear();
    mnt.tmpfs[0].entries[0].size = 1 << 30;
    assert_eq!(sized.format_version(), manifest::CONTENT_MANIFEST_VERSION);
    let b = encode_manifest(&sized).unwrap();
    assert_eq!(decode_manifest(&b, 3, p()).unwrap(), sized);
    // A veth and routes in the network namespace: 6 (a reader of 5
    // would restore the namespace with only lo).
    let mut veth = m.clone();
    let net = veth.namespaces.as_mut().unwrap().net.as_mut().unwrap();
    let addr = |a: [u8; 4], prefix| manifest::NetAddress {
        addr: std::net::IpAddr::from(a),
        prefix,
        broadcast: None,
        flags: 0,
        scope: 0,
        peer: None,
    };
    net.veths = vec![manifest::Veth {
        inside: manifest::NetInterface {
            name: "eth0".into(),
            mac: vec![2, 0, 0, 0, 0, 1],
            mtu: 1500,
            up: true,
            addrs: vec![addr([10, 0, 0, 2], 24)],
            master: None,
            port_no: None,
        },
        peer: manifest::NetInterface {
            name: "veth0".into(),
            mac: vec![2, 0, 0, 0, 0, 2],
            mtu: 1500,
            up: true,
            addrs: Vec::new(),
            master: None,
            port_no: None,
        },
        master: Some("br0".into()),
    }];
    net.routes = vec![manifest::NetRoute {
        family: 2,
        dst: None,
        dst_len: 0,
        gateway: Some(std::net::IpAddr::from([10, 0, 0, 1])),
        dev: Some("eth0".into()),
        metric: None,
        prefsrc: None,
        protocol: 3,
        scope: 0,
        kind: 1,
        table: manifest::RT_TABLE_MAIN,
        nexthops: Vec::new(),
        flags: 0,
        attrs: Vec::new(),
        src: None,
        src_len: 0,
        nhid: None,
        encap_devs: Vec::new(),
    }];
    let b = encode_manifest(&veth).unwrap();
    assert_eq!(
        u32::from_le_bytes(b[8..12].try_into().unwrap()),
        manifest::NET_DEVICES_MANIFEST_VERSION
    );
    assert_eq!(decode_manifest(&b, 3, p()).unwrap(), veth);
    assert_eq!(encode_manifest(&veth).unwrap(), b);
    let mut lower = b.clone();
    lower[8..12].copy_from_slice(&manifest::CONTENT_MANIFEST_VERSION.to_le_bytes());
    assert!(decode_manifest(&lower, 3, p()).is_err());
    // A time namespace: 7, whatever else the namespaces hold (a reader of
    // 6 would restore the tree with the host's clocks).
    for base in [&m, &veth] {
        let mut timens = base.clone();
        timens.namespaces.as_mut().unwrap().time = Some(manifest::TimeNamespace {
            monotonic: 86_400_000 * 1_000_000_000 + 123,
            boottime: 5_000_000_001,
            monotonic_offset: 86_400_000 * 1_000_000_000,
            boottime_offset: -7_000_000_000,
        });
        assert_eq!(
            timens.format_version(),
            manifest::TIME_NAMESPACE_MANIFEST_VERSION
        );
        let b = encode_manifest(&timens).unwrap();
        assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 7);
        assert_eq!(decode_manifest(&b, 3, p()).unwrap(), timens);
        let mut lower = b.clone();
        lower[8..12].copy_from_slice(&manifest::NET_DEVICES_MANIFEST_VERSION.to_le_bytes());
        assert!(decode_manifest(&lower, 3, p()).is_err());
    }
    // A version after the newest is newer than this reader.
    let next = manifest::LATEST_MANIFEST_VERSION + 1;
    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&next.to_le_bytes());
    assert!(matches!(
        decode_manifest(&newer, 3, p()),
        Err(ImageError::NewerFormat { found, .. }) if found == next
    ));
    // Content of version 3 under another version: refused as damaged.
    let mut other = bytes.clone();
    other[8..12].copy_from_slice(&manifest::SHELL_JOB_MANIFEST_VERSION.to_le_bytes());
    assert!(decode_manifest(&other, 3, p()).is_err());
}

#[test]
fn a_shell_job_raises_the_manifest_version_and_round_trips() {
    let mut m = small_manifest();
    m.processes[0].fds.push(manifest::FdImage {
        fd: 0,
        flags: 2,
        cloexec: false,
        kind: manifest::FdKind::ExternalTty { current: false },
        shared_id: None,
        locks: vec![],
        owner: None,
    });
    m.shell_job = Some(manifest::ShellJob {
        termios: manifest::PtyTermios {
            lflag: 0o1,
            cc: vec![3; 19],
            ..Default::default()
        },
        winsize: [24, 80, 0, 0],
        foreground: Some(m.root_pid),
    });
    let bytes = encode_manifest(&m).unwrap();
    assert_eq!(
        u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        manifest::SHELL_JOB_MANIFEST_VERSION
    );
    let back = decode_manifest(&bytes, 3, p()).unwrap();
    assert_eq!(back, m);
}

/// A manifest whose saved files are in a content pack says version 5 (an
/// older reader refuses it as newer, rather than restoring them as
/// holes), round-trips, and must say 5: an older version in its header is
/// corruption.
#[test]
fn a_content_pack_raises_the_manifest_version_and_round_trips() {
    let mut m = small_manifest();
    m.ghosts[0].data = Vec::new();
    m.ghosts[0].size = 10 << 20;
    m.ghosts[0].extents = vec![manifest::Extent {
        offset: 4096,
        data: Vec::new(),
        len: (9 << 20) + 5,
        at: 0,
    }];
    m.content = Some(manifest::PackRef {
        name: stasis_image::CONTENT_PACK_NAME.into(),
        size: 12 << 20,
        pages: 2305,
        index_checksum: 7,
    });
    let bytes = encode_manifest(&m).unwrap();
    assert_eq!(
        u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        manifest::CONTENT_MANIFEST_VERSION
    );
    let back = decode_manifest(&bytes, 3, p()).unwrap();
    assert_eq!(back, m);
    assert_eq!(encode_manifest(&back).unwrap(), bytes);
    for older in [2u32, 3, 4] {
        let mut b = bytes.clone();
        b[8..12].copy_from_slice(&older.to_le_bytes());
        assert!(
            matches!(
                decode_manifest(&b, 3, p()),
                Err(ImageError::CorruptManifest { .. })
            ),
            "version {older}"
        );
    }
}

/// Processes in several cgroups: version 8 (a reader of 6 would put them
/// all in the root's), round-trips, and is refused under a lower version.
#[test]
fn cgroups_raise_the_manifest_version_and_round_trip() {
    let mut m = small_manifest();
    assert!(m.format_version() < manifest::CGROUPS_MANIFEST_VERSION);
    m.cgroups = Some(manifest::Cgroups {
        procs: vec![
            manifest::ProcessCgroup {
                pid: 100,
                path: "/box/a".into(),
            },
            manifest::ProcessCgroup {
                pid: 101,
                path: "/box/b".into(),
            },
        ],
        dirs: vec![manifest::CgroupDir {
            path: "/box/b".into(),
            subtree_control: vec![],
            limits: vec![manifest::CgroupLimit {
                file: "pids.max".into(),
                value: "16".into(),
            }],
            threaded: false,
        }],
        threads: vec![],
    });
    assert_eq!(m.format_version(), 8);
    let bytes = encode_manifest(&m).unwrap();
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 8);
    assert_eq!(decode_manifest(&bytes, 3, p()).unwrap(), m);
    assert_eq!(encode_manifest(&m).unwrap(), bytes);
    let mut lower = bytes.clone();
    lower[8..12].copy_from_slice(&manifest::NET_DEVICES_MANIFEST_VERSION.to_le_bytes());
    assert!(decode_manifest(&lower, 3, p()).is_err());
}

#[test]
fn cgroup_limits_are_named_files_only() {
    for f in [
        "pids.max",
        "memory.max",
        "cpu.weight",
        "hugetlb.2MB.max",
        "hugetlb.1GB.max",
    ] {
        assert!(manifest::is_cgroup_limit(f), "{f}");
    }
    for f in [
        "cgroup.procs",
        "cgroup.subtree_control",
        "../x",
        "hugetlb.MB.max",
        "hugetlb.2MB.rsvd.max",
        "hugetlb.2/MB.max",
        "memory.current",
    ] {
        assert!(!manifest::is_cgroup_limit(f), "{f}");
    }
}

#[test]
fn posix_queues_an_fd_on_one_or_a_pty_of_its_own_devpts_raise_the_manifest_version_to_9() {
    let base = small_manifest();
    assert!(base.format_version() < manifest::POSIX_QUEUES_MANIFEST_VERSION);
    // The queues of the tree's IPC namespace, with their messages.
    let mut queues = base.clone();
    queues.namespaces = Some(manifest::Namespaces {
        ipc: true,
        posix_queues: Some(manifest::PosixQueues {
            msg_max: 10,
            msgsize_max: 8192,
            queues_max: 256,
            msg_default: 10,
            msgsize_default: 8192,
            queues: vec![manifest::PosixQueue {
                name: "q".into(),
                uid: 0,
                gid: 0,
                mode: 0o640,
                maxmsg: 4,
                msgsize: 32,
                messages: vec![manifest::PosixMessage {
                    prio: 7,
                    data: b"high".to_vec(),
                }],
            }],
        }),
        ..Default::default()
    });
    assert_eq!(queues.format_version(), 9);
    let b = encode_manifest(&queues).unwrap();
    assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 9);
    assert_eq!(decode_manifest(&b, 3, p()).unwrap(), queues);
    // A reader of 8 would restore the namespace without them: the bytes
    // under an older version are refused.
    let mut older = b.clone();
    older[8..12].copy_from_slice(&8u32.to_le_bytes());
    assert!(decode_manifest(&older, 3, p()).is_err());
    // An fd on a queue alone (of the dumper's IPC namespace) raises it too.
    let mut fd = base.clone();
    fd.processes[0].fds.push(manifest::FdImage {
        fd: 3,
        flags: 2,
        cloexec: true,
        kind: manifest::FdKind::Mqueue {
            name: "q".into(),
            queue: None,
        },
        shared_id: None,
        locks: Vec::new(),
        owner: None,
    });
    assert_eq!(fd.format_version(), 9);
    let b = encode_manifest(&fd).unwrap();
    assert_eq!(decode_manifest(&b, 3, p()).unwrap(), fd);
    // So does a pty pair of a devpts instance of the tree's own (an
    // older reader would make it on /dev/ptmx, at any index); one of the
    // dumper's does not.
    let pair = |devpts: Option<&str>| {
        let mut m = base.clone();
        m.processes[0].fds.push(manifest::FdImage {
            fd: 4,
            flags: 2,
            cloexec: false,
            kind: manifest::FdKind::PtyMaster(manifest::PtyPair {
                index: 1,
                termios: manifest::PtyTermios::default(),
                winsize: [24, 80, 0, 0],
                locked: false,
                packet: false,
                master_exclusive: false,
                slave_exclusive: false,
                slave_closed: false,
                input_lines: Vec::new(),
                input: Vec::new(),
                output: Vec::new(),
                session: None,
                slave_node: None,
                pkt_status: 0,
                stopped_by_ioctl: false,
                ldisc: 0,
                devpts: devpts.map(str::to_string),
            }),
            shared_id: None,
            locks: Vec::new(),
            owner: None,
        });
        m
    };
    assert!(pair(None).format_version() < 9);
    let own = pair(Some("/dev/pts"));
    assert_eq!(own.format_version(), 9);
    let b = encode_manifest(&own).unwrap();
    assert_eq!(decode_manifest(&b, 3, p()).unwrap(), own);
}

/// A tun device of the network namespace, or an fd attached to one:
/// version 10 (a reader of 8 would restore the namespace without the
/// device and the fd unattached), round-trips, and is refused under a
/// lower version.
#[test]
fn tun_devices_and_fds_raise_the_manifest_version_and_round_trip() {
    let base = small_manifest();
    assert!(base.format_version() < manifest::TUN_MANIFEST_VERSION);
    let mut dev = base.clone();
    dev.namespaces = Some(manifest::Namespaces {
        net: Some(manifest::NetNamespace {
            lo_up: true,
            tuns: vec![manifest::TunDevice {
                iface: manifest::NetInterface {
                    name: "tap0".into(),
                    mac: vec![2, 0, 0, 0, 0, 9],
                    mtu: 1400,
                    up: true,
                    addrs: vec![manifest::NetAddress {
                        addr: std::net::IpAddr::from([10, 9, 0, 1]),
                        prefix: 24,
                        broadcast: None,
                        flags: 0,
                        scope: 0,
                        peer: None,
                    }],
                    master: None,
                    port_no: None,
                },
                flags: 0x1002,
                persist: true,
                owner: Some(1000),
                group: None,
            }],
            ..Default::default()
        }),
        ..Default::default()
    });
    let mut fd = base.clone();
    fd.processes[0].fds.push(manifest::FdImage {
        fd: 5,
        flags: 2,
        cloexec: false,
        kind: manifest::FdKind::Tun(manifest::TunFile {
            iff: "tun0".into(),
            flags: 0x1001,
            persist: false,
        }),
        shared_id: None,
        locks: vec![],
        owner: None,
    });
    for m in [dev, fd] {
        assert_eq!(m.format_version(), 10);
        let bytes = encode_manifest(&m).unwrap();
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 10);
        assert_eq!(decode_manifest(&bytes, 3, p()).unwrap(), m);
        assert_eq!(encode_manifest(&m).unwrap(), bytes);
        let mut lower = bytes.clone();
        lower[8..12].copy_from_slice(&manifest::CGROUPS_MANIFEST_VERSION.to_le_bytes());
        assert!(decode_manifest(&lower, 3, p()).is_err());
    }
    const { assert!(manifest::TUN_MANIFEST_VERSION < manifest::LATEST_MANIFEST_VERSION) };
}

/// A mount namespace with a root of its own (pivot_root): version 11 (a
/// reader of 10 would restore the tree under the restorer's root),
/// round-trips, and is refused under a lower version.
#[test]
fn a_root_of_its_own_raises_the_manifest_version_and_round_trips() {
    let base = small_manifest();
    assert!(base.format_version() < manifest::OWN_ROOT_MANIFEST_VERSION);
    let mut m = base.clone();
    m.namespaces = Some(manifest::Namespaces {
        pid: true,
        mnt: Some(manifest::MountNamespace {
            proc: true,
            root: Some(manifest::BindMount {
                source: "/var/lib/containers/c1/merged".into(),
                target: "/".into(),
                flags: libc::MS_NOSUID,
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert_version_round_trips(&m, 11, manifest::TUN_MANIFEST_VERSION);
    // Without it, the same namespace is not raised to 11.
    let mut without = m.clone();
    if let Some(mnt) = without.namespaces.as_mut().and_then(|n| n.mnt.as_mut()) {
        mnt.root = None;
    }
    assert!(without.format_version() < manifest::OWN_ROOT_MANIFEST_VERSION);
    const { assert!(manifest::OWN_ROOT_MANIFEST_VERSION < manifest::LATEST_MANIFEST_VERSION) };
}

/// An fd on a POSIX message queue that carries the queue (of the dumper's
/// IPC namespace, or unlinked): version 12 (a reader of 11 would open the
/// queue by name as it is then), round-trips, and is refused under a lower
/// version; one without it stays below.
#[test]
fn a_queue_held_by_an_fd_raises_the_manifest_version_and_round_trips() {
    let base = small_manifest();
    assert!(base.format_version() < manifest::HELD_QUEUE_MANIFEST_VERSION);
    let fd = |queue| manifest::FdImage {
        fd: 4,
        flags: (libc::O_RDONLY | libc::O_NONBLOCK) as u32,
        cloexec: true,
        kind: manifest::FdKind::Mqueue {
            name: "q".into(),
            queue,
        },
        shared_id: None,
        locks: Vec::new(),
        owner: None,
    };
    let mut m = base.clone();
    m.processes[0].fds.push(fd(Some(manifest::HeldQueue {
        ino: 77,
        deleted: true,
        queue: manifest::PosixQueue {
            name: "q".into(),
            uid: 1,
            gid: 2,
            mode: 0o640,
            maxmsg: 7,
            msgsize: 33,
            messages: vec![
                manifest::PosixMessage {
                    prio: 9,
                    data: b"nine".to_vec(),
                },
                manifest::PosixMessage {
                    prio: 0,
                    data: Vec::new(),
                },
            ],
        },
    })));
    assert_version_round_trips(&m, 12, manifest::OWN_ROOT_MANIFEST_VERSION);
    let mut without = base.clone();
    without.processes[0].fds.push(fd(None));
    assert_eq!(
        without.format_version(),
        manifest::POSIX_QUEUES_MANIFEST_VERSION
    );
    const { assert!(manifest::HELD_QUEUE_MANIFEST_VERSION < manifest::LATEST_MANIFEST_VERSION) };
}

/// A process with a time namespace it unshared and no process entered:
/// version 13 (a reader of 12 would restore it making its children in
/// its own), round-trips, and is refused under a lower version.
#[test]
fn a_pending_time_namespace_raises_the_manifest_version_and_round_trips() {
    let base = small_manifest();
    assert!(base.format_version() < manifest::PENDING_TIME_MANIFEST_VERSION);
    let mut m = base.clone();
    m.processes[0].pending_time = Some(manifest::PendingTimeNamespace {
        monotonic_offset: 86_400_000_000_000_000,
        boottime_offset: -5,
        threads: true,
    });
    assert_version_round_trips(&m, 13, manifest::HELD_QUEUE_MANIFEST_VERSION);
}

/// A thread in a threaded cgroup other than its process's: version 13 (a
/// reader of 12 would restore it in its process's cgroup), round-trips,
/// and is refused under a lower version; so is a threaded cgroup alone.
#[test]
fn threaded_cgroups_raise_the_manifest_version_and_round_trip() {
    let base = small_manifest();
    assert!(base.format_version() < manifest::THREADED_CGROUPS_MANIFEST_VERSION);
    let mut m = base.clone();
    m.cgroups = Some(manifest::Cgroups {
        procs: vec![manifest::ProcessCgroup {
            pid: 100,
            path: "/box".into(),
        }],
        dirs: vec![manifest::CgroupDir {
            path: "/box/t".into(),
            threaded: true,
            ..Default::default()
        }],
        threads: vec![manifest::ThreadCgroup {
            tid: 101,
            path: "/box/t".into(),
        }],
    });
    assert_version_round_trips(&m, 13, manifest::HELD_QUEUE_MANIFEST_VERSION);
    let mut dir_only = m.clone();
    if let Some(c) = dir_only.cgroups.as_mut() {
        c.threads.clear();
    }
    assert_eq!(dir_only.format_version(), 13);
    // Neither: not raised to 13.
    if let Some(c) = dir_only.cgroups.as_mut() {
        c.dirs[0].threaded = false;
    }
    assert!(dir_only.format_version() < manifest::THREADED_CGROUPS_MANIFEST_VERSION);
    const { assert!(manifest::THREADED_CGROUPS_MANIFEST_VERSION < manifest::LATEST_MANIFEST_VERSION) };
}

/// A mount made again from nothing other than sysfs, mqueue, devpts and
/// cgroup2 (another proc), a ramfs, or a mount that is not private:
/// version 14 (a reader of 13 would mount the proc in its own PID
/// namespace, the ramfs as tmpfs, the shared mount private), round-trips,
/// and is refused under a lower version.
#[test]
fn fresh_mounts_raise_the_manifest_version_and_round_trip() {
    let base = small_manifest();
    assert!(base.format_version() < manifest::FRESH_MOUNTS_MANIFEST_VERSION);
    let later = |what: manifest::LaterKind, propagation: u64| manifest::LaterMount {
        target: "/mnt/x".into(),
        flags: libc::MS_NOSUID,
        what,
        propagation,
    };
    let fresh = |fstype: &str| manifest::LaterKind::Fresh {
        fstype: fstype.into(),
        source: fstype.into(),
        options: String::new(),
    };
    let with = |l: manifest::LaterMount| {
        let mut m = base.clone();
        m.namespaces = Some(manifest::Namespaces {
            pid: true,
            mnt: Some(manifest::MountNamespace {
                later: vec![l],
                ..Default::default()
            }),
            ..Default::default()
        });
        m
    };
    let ramfs = manifest::LaterKind::Ramfs {
        source: "r".into(),
        options: "mode=755".into(),
        entries: vec![manifest::TmpfsEntry {
            mode: libc::S_IFDIR | 0o755,
            ..Default::default()
        }],
    };
    for m in [
        with(later(fresh("proc"), 0)),
        with(later(fresh("hugetlbfs"), 0)),
        with(later(ramfs, 0)),
        with(later(fresh("sysfs"), libc::MS_SHARED)),
    ] {
        assert_version_round_trips(&m, 14, manifest::THREADED_CGROUPS_MANIFEST_VERSION);
    }
    // Copies of the dumper's mounts made slaves.
    let mut slaves = base.clone();
    slaves.namespaces = Some(manifest::Namespaces {
        mnt: Some(manifest::MountNamespace {
            slave_copies: true,
            ..Default::default()
        }),
        ..Default::default()
    });
    assert_eq!(slaves.format_version(), 14);
    let bytes = encode_manifest(&slaves).unwrap();
    assert_eq!(decode_manifest(&bytes, 3, p()).unwrap(), slaves);
    // A private sysfs, devpts, mqueue or cgroup2 stays below 14.
    for k in ["sysfs", "devpts", "mqueue", "cgroup2"] {
        assert!(with(later(fresh(k), 0)).format_version() < 14, "{k}");
    }
    const { assert!(manifest::FRESH_MOUNTS_MANIFEST_VERSION < manifest::LATEST_MANIFEST_VERSION) };
}

/// A point-to-point peer, a route of another table or with several next
/// hops, rules other than the kernel's, an interface made in the
/// namespace or a port of its bridge: version 15 (a reader of 14
/// would restore them as the main table's, single next hop, without the
/// peer or the rules), each round-trips, and is refused under a lower
/// version.
#[test]
fn routing_state_raises_the_manifest_version_and_round_trips() {
    let base = small_manifest();
    assert!(base.format_version() < manifest::NET_ROUTING_MANIFEST_VERSION);
    let route = manifest::NetRoute {
        family: 2,
        dst: Some(std::net::IpAddr::from([10, 8, 0, 0])),
        dst_len: 16,
        gateway: Some(std::net::IpAddr::from([10, 9, 0, 2])),
        dev: Some("tun0".into()),
        metric: None,
        prefsrc: None,
        protocol: 4,
        scope: 0,
        kind: 1,
        table: manifest::RT_TABLE_MAIN,
        nexthops: Vec::new(),
        flags: 0,
        attrs: Vec::new(),
        src: None,
        src_len: 0,
        nhid: None,
        encap_devs: Vec::new(),
    };
    let net = manifest::NetNamespace {
        lo_up: true,
        tuns: vec![manifest::TunDevice {
            iface: manifest::NetInterface {
                name: "tun0".into(),
                mtu: 1400,
                up: true,
                addrs: vec![manifest::NetAddress {
                    addr: std::net::IpAddr::from([10, 9, 0, 1]),
                    prefix: 32,
                    broadcast: None,
                    flags: 0,
                    scope: 0,
                    peer: None,
                }],
                ..Default::default()
            },
            flags: 0x1001,
            persist: true,
            owner: None,
            group: None,
        }],
        routes: vec![route.clone()],
        ..Default::default()
    };
    let with = |n: manifest::NetNamespace| {
        let mut m = base.clone();
        m.namespaces = Some(manifest::Namespaces {
            net: Some(n),
            ..Default::default()
        });
        m
    };
    let plain = with(net.clone());
    assert_eq!(plain.format_version(), manifest::TUN_MANIFEST_VERSION);
    let mut peer = net.clone();
    peer.tuns[0].iface.addrs[0].peer = Some(std::net::IpAddr::from([10, 9, 0, 2]));
    let mut table = net.clone();
    table.routes[0].table = 100;
    let mut multipath = net.clone();
    multipath.routes[0].gateway = None;
    multipath.routes[0].dev = None;
    multipath.routes[0].nexthops = vec![
        manifest::NetNextHop {
            gateway: Some(std::net::IpAddr::from([10, 9, 0, 2])),
            dev: Some("tun0".into()),
            hops: 0,
            flags: 0,
            attrs: Vec::new(),
            encap_devs: Vec::new(),
        },
        manifest::NetNextHop {
            gateway: Some(std::net::IpAddr::from([10, 9, 0, 3])),
            dev: Some("tun0".into()),
            hops: 2,
            flags: 4,
            attrs: Vec::new(),
            encap_devs: Vec::new(),
        },
    ];
    let mut metrics = net.clone();
    metrics.routes[0].attrs = vec![manifest::NetAttr {
        kind: 8,
        value: vec![8, 0, 2, 0, 0x78, 5, 0, 0],
    }];
    let mut rules = net.clone();
    rules.rules = vec![manifest::NetRule {
        family: 2,
        src_len: 24,
        table: 100,
        action: 1,
        attrs: vec![manifest::NetAttr {
            kind: 6,
            value: 100u32.to_ne_bytes().to_vec(),
        }],
        ..Default::default()
    }];
    let mut links = net.clone();
    links.links = vec![manifest::NetLink {
        iface: manifest::NetInterface {
            name: "br0".into(),
            mac: vec![2, 0, 0, 0, 0, 1],
            mtu: 1400,
            up: true,
            ..Default::default()
        },
        kind: "bridge".into(),
        txqlen: 1000,
        link: None,
        data: vec![manifest::NetAttr {
            kind: 5,
            value: 0u32.to_ne_bytes().to_vec(),
        }],
    }];
    let mut port = net.clone();
    port.tuns[0].iface.master = Some("br0".into());
    port.tuns[0].iface.port_no = Some(2);
    for n in [peer, table, multipath, metrics, rules, links, port] {
        let m = with(n);
        assert_version_round_trips(&m, 15, manifest::FRESH_MOUNTS_MANIFEST_VERSION);
    }
    const { assert!(manifest::NET_ROUTING_MANIFEST_VERSION < manifest::LATEST_MANIFEST_VERSION) };
}

/// Next-hop objects, a route through one, with a source prefix, a
/// gateway of another family or an encapsulation (of the route or of one
/// of its next hops), a macvlan's list of source addresses: version 16
/// (a reader of 15 would make those routes without them, refuse the
/// next-hop id, and the macvlan without its list), each round-trips, and
/// is refused under a lower version. A route of version 15 stays 15.
#[test]
fn next_hop_objects_encapsulations_and_source_lists_raise_the_manifest_version() {
    let base = small_manifest();
    let route = manifest::NetRoute {
        family: 10,
        dst: Some(std::net::IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 0])),
        dst_len: 64,
        gateway: None,
        dev: Some("eth0".into()),
        metric: Some(1024),
        prefsrc: None,
        protocol: 3,
        scope: 0,
        kind: 1,
        table: 100,
        nexthops: Vec::new(),
        flags: 0,
        attrs: Vec::new(),
        src: None,
        src_len: 0,
        nhid: None,
        encap_devs: Vec::new(),
    };
    let net = manifest::NetNamespace {
        lo_up: true,
        routes: vec![route],
        ..Default::default()
    };
    let with = |n: manifest::NetNamespace| {
        let mut m = base.clone();
        m.namespaces = Some(manifest::Namespaces {
            net: Some(n),
            ..Default::default()
        });
        m
    };
    assert_eq!(
        with(net.clone()).format_version(),
        manifest::NET_ROUTING_MANIFEST_VERSION
    );
    let mut nexthops = net.clone();
    nexthops.nexthops = vec![manifest::NetNexthopObject {
        family: 2,
        scope: 253,
        protocol: 3,
        flags: 0,
        dev: Some("eth0".into()),
        attrs: vec![
            manifest::NetAttr {
                kind: 1,
                value: 7u32.to_ne_bytes().to_vec(),
            },
            manifest::NetAttr {
                kind: 6,
                value: vec![10, 0, 0, 1],
            },
        ],
        encap_devs: Vec::new(),
    }];
    let mut nhid = net.clone();
    nhid.routes[0].dev = None;
    nhid.routes[0].nhid = Some(7);
    let mut src = net.clone();
    src.routes[0].src = Some(std::net::IpAddr::from([0xfd01, 0, 0, 0, 0, 0, 0, 0]));
    src.routes[0].src_len = 48;
    let via = manifest::NetAttr {
        kind: 18,
        value: vec![10, 0, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    };
    let mut gw = net.clone();
    gw.routes[0].attrs = vec![via.clone()];
    let mut hop = net.clone();
    hop.routes[0].dev = None;
    hop.routes[0].nexthops = vec![manifest::NetNextHop {
        dev: Some("eth0".into()),
        attrs: vec![via],
        ..Default::default()
    }];
    let mut macvlan = net.clone();
    macvlan.links = vec![manifest::NetLink {
        iface: manifest::NetInterface {
            name: "ms0".into(),
            ..Default::default()
        },
        kind: "macvlan".into(),
        txqlen: 1000,
        link: Some("eth0".into()),
        data: vec![
            manifest::NetAttr {
                kind: 1,
                value: 16u32.to_ne_bytes().to_vec(),
            },
            manifest::NetAttr {
                kind: manifest::IFLA_MACVLAN_MACADDR_DATA,
                value: vec![10, 0, 4, 0, 2, 0, 0, 0, 0, 5, 0, 0],
            },
        ],
    }];
    let mut seg6local = hop.clone();
    seg6local.routes[0].nexthops[0].encap_devs = vec![manifest::EncapDev {
        kind: 7,
        dev: "eth0".into(),
    }];
    for n in [nexthops, nhid, src, gw, hop, seg6local, macvlan] {
        let m = with(n);
        assert_version_round_trips(&m, 16, manifest::NET_ROUTING_MANIFEST_VERSION);
    }
    const { assert!(manifest::NET_NEXTHOPS_MANIFEST_VERSION < manifest::LATEST_MANIFEST_VERSION) };
}

/// A hugetlbfs holding files or an overlay (issue 17): version 17 (a
/// reader of 15 knows no `Hugetlbfs` nor `Overlay` mount), round-trips
/// (with the files' extents, with and without an upper directory), and
/// is refused under a lower version; an empty hugetlbfs stays a `Fresh`
/// mount of version 14.
#[test]
fn a_hugetlbfs_with_files_or_an_overlay_raise_the_manifest_version_and_round_trip() {
    let base = small_manifest();
    assert!(base.format_version() < manifest::OWN_MOUNTS_MANIFEST_VERSION);
    let with = |what: manifest::LaterKind| {
        let mut m = base.clone();
        m.namespaces = Some(manifest::Namespaces {
            pid: true,
            mnt: Some(manifest::MountNamespace {
                later: vec![manifest::LaterMount {
                    target: "/mnt/huge".into(),
                    flags: libc::MS_NOSUID,
                    what,
                    propagation: 0,
                }],
                ..Default::default()
            }),
            ..Default::default()
        });
        m
    };
    let huge = manifest::LaterKind::Hugetlbfs {
        source: "huge".into(),
        options: "pagesize=2M,size=16777216".into(),
        entries: vec![
            manifest::TmpfsEntry {
                mode: libc::S_IFDIR | 0o755,
                ..Default::default()
            },
            manifest::TmpfsEntry {
                path: "f".into(),
                mode: libc::S_IFREG | 0o640,
                uid: 7,
                gid: 8,
                size: 3 << 21,
                extents: vec![manifest::Extent {
                    offset: 2 << 21,
                    data: Vec::new(),
                    len: 2 << 20,
                    at: 4096,
                }],
                ..Default::default()
            },
        ],
    };
    assert_version_round_trips(&with(huge), 17, manifest::NET_ROUTING_MANIFEST_VERSION);
    // An overlay (read-only: lower layers only, a data-only one).
    for upper in ["", "/srv/u"] {
        let overlay = manifest::LaterKind::Overlay {
            source: "ovl".into(),
            lowerdir: "/srv/l1:/srv/l2::/srv/data".into(),
            upperdir: upper.into(),
            workdir: if upper.is_empty() { "" } else { "/srv/w" }.into(),
            options: "uuid=on".into(),
        };
        assert_version_round_trips(&with(overlay), 17, manifest::NET_ROUTING_MANIFEST_VERSION);
    }
    let empty = manifest::LaterKind::Fresh {
        fstype: "hugetlbfs".into(),
        source: "huge".into(),
        options: "pagesize=2M".into(),
    };
    assert_eq!(with(empty).format_version(), 14);
    const { assert!(manifest::OWN_MOUNTS_MANIFEST_VERSION < manifest::LATEST_MANIFEST_VERSION) };
}

#[test]
fn a_stand_in_init_raises_the_manifest_version_and_round_trips() {
    let mut m = small_manifest();
    m.namespaces = Some(manifest::Namespaces {
        pid: true,
        ..Default::default()
    });
    assert_eq!(m.format_version(), manifest::NAMESPACES_MANIFEST_VERSION);
    m.namespaces.as_mut().unwrap().stand_in_init = true;
    // A reader of any earlier version would make the root PID 1.
    assert_version_round_trips(&m, 18, manifest::NET_ROUTING_MANIFEST_VERSION);
}

#[test]
fn an_fd_on_another_namespace_raises_the_manifest_version_and_round_trips() {
    let mut m = small_manifest();
    let fd = |of| manifest::FdImage {
        fd: 7,
        flags: 0,
        cloexec: false,
        kind: manifest::FdKind::NsFile {
            kind: "net".into(),
            ino: 4026531840,
            of,
        },
        shared_id: None,
        locks: Vec::new(),
        owner: None,
    };
    m.processes[0].fds.push(fd(manifest::NsFileOf::Own));
    assert_eq!(m.format_version(), FORMAT_VERSION);
    for of in [
        manifest::NsFileOf::Dumper,
        manifest::NsFileOf::Path("/run/netns/a".into()),
    ] {
        let mut m = m.clone();
        m.processes[0].fds.push(fd(of));
        // An earlier reader would reopen the tree's own namespace.
        assert_version_round_trips(&m, 19, 18);
    }
}

#[test]
fn a_line_that_is_a_controlling_terminal_raises_the_manifest_version() {
    let mut m = small_manifest();
    let line = |session| manifest::FdImage {
        fd: 3,
        flags: 2,
        cloexec: false,
        kind: manifest::FdKind::TtyLine {
            path: "/dev/tty8".into(),
            rdev: libc::makedev(4, 8),
            termios: manifest::PtyTermios::default(),
            winsize: [24, 80, 0, 0],
            session,
        },
        shared_id: None,
        locks: Vec::new(),
        owner: None,
    };
    m.processes[0].fds.push(line(None));
    assert_eq!(m.format_version(), FORMAT_VERSION);
    m.processes[0].fds.push(line(Some(manifest::PtySession {
        sid: 100,
        foreground: 101,
    })));
    // An earlier reader would restore the session without its terminal.
    assert_version_round_trips(&m, 20, 19);
}

#[test]
fn dev_tty_on_a_line_raises_the_manifest_version() {
    let mut m = small_manifest();
    m.processes[0].fds.push(manifest::FdImage {
        fd: 4,
        flags: 2,
        cloexec: false,
        kind: manifest::FdKind::LineDevTty {
            path: "/dev/ttyS1".into(),
            rdev: libc::makedev(4, 65),
            termios: manifest::PtyTermios::default(),
            winsize: [24, 80, 0, 0],
            session: manifest::PtySession {
                sid: 100,
                foreground: 100,
            },
        },
        shared_id: None,
        locks: Vec::new(),
        owner: None,
    });
    // An earlier reader does not know the kind: it refuses by the version.
    assert_version_round_trips(&m, 21, 20);
    assert_eq!(
        manifest::LATEST_MANIFEST_VERSION,
        manifest::LINE_DEV_TTY_MANIFEST_VERSION
    );
}
