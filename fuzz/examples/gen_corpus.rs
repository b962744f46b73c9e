//! Writes the seed corpus of every fuzz target into `fuzz/corpus/TARGET/`
//! from real encoded values (the encoders of the crates themselves).
//!
//! ```text
//! cd fuzz && cargo run --example gen_corpus
//! ```

use std::fs;
use std::path::{Path, PathBuf};

#[path = "../../crates/stasis-image/tests/common/mod.rs"]
mod common;

use stasis_image::touch::{TouchSet, TouchSource};
use stasis_image::{encode_manifest, ImageDir, RunEntry};
use stasis_lazy::control::{encode_frame, Hand, Msg};
use stasis_pageserver::protocol::{
    encode_error, kind, write_frame, write_greeting, Enc, ErrorCode, Request, PROTOCOL_VERSION,
};
use stasis_track::state::TrackState;
use stasis_track::Backend;

fn put(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    fs::create_dir_all(&dir).expect("create corpus dir");
    fs::write(dir.join(format!("seed-{name}")), bytes).expect("write seed");
}

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("stasis-fuzz-seeds-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    d
}

fn image_seeds() {
    let dir = scratch();
    let image = ImageDir::create_or_open(&dir).expect("image dir");
    // A full checkpoint: two runs (one of two pages), and an empty pack.
    let mut b = image.begin_checkpoint().expect("begin");
    let mut w = b.create_pack(100).expect("pack");
    w.write_run(0x7f00_0000_0000, &common::pages(1, 2))
        .expect("run");
    w.write_run(0x7f00_0001_0000, &common::pages(2, 1))
        .expect("run");
    let r = w.finish().expect("finish");
    let pack = fs::read(b.temp_dir().join(&r.name)).expect("read pack");
    put("pack", "two-runs", &pack);
    let e = b.create_pack(101).expect("pack");
    let r2 = e.finish().expect("finish");
    let empty = fs::read(b.temp_dir().join(&r2.name)).expect("read pack");
    put("pack", "empty", &empty);

    let mut full = common::manifest(1, vec![common::process(100, Some(r.clone()))]);
    put("manifest", "full", &encode_manifest(&full).expect("encode"));
    let mut p = common::process(100, Some(r));
    p.data_ranges = Some(vec![
        (0x7f00_0000_0000, 0x7f00_0000_4000),
        (0x7f00_0001_0000, 0x7f00_0001_1000),
    ]);
    p.start_time = 4242;
    let mut inc = common::manifest(2, vec![p, common::process(101, None)]);
    inc.parent = Some(1);
    put(
        "manifest",
        "incremental",
        &encode_manifest(&inc).expect("encode"),
    );
    // Found by the manifest target: out-of-order data_ranges were accepted.
    inc.processes[0].data_ranges = Some(vec![
        (0x7f00_0001_0000, 0x7f00_0001_1000),
        (0x7f00_0000_4000, 0x7f00_0000_0000),
    ]);
    put(
        "manifest",
        "unsorted-data-ranges",
        &encode_manifest(&inc).expect("encode"),
    );
    full.processes.clear();
    full.pipes.clear();
    full.ghosts.clear();
    full.sysv_shm.clear();
    put(
        "manifest",
        "minimal",
        &encode_manifest(&full).expect("encode"),
    );
    drop(b);
    let _ = fs::remove_dir_all(&dir);

    // Touch sets.
    let ts = TouchSet {
        source: TouchSource::Window,
        window_ms: 1500,
        procs: vec![
            (100, vec![(0x7f00_0000_0000, 3), (0x1000, 1)]),
            (101, vec![(0x40_0000, 16)]),
        ],
    };
    put("touch", "window", &ts.encode());
    let ts = TouchSet {
        source: TouchSource::Faults,
        window_ms: 0,
        procs: vec![(7, vec![(0x2000, 1), (0x1000, 1), (0x3000, 2)])],
    };
    put("touch", "faults", &ts.encode());

    // Chain records: model mode (even first byte: pairs of page, length)
    // and raw mode (odd: little-endian u64 pairs).
    put(
        "chain",
        "model",
        &[0, 1, 4, 10, 3, 40, 16, 2, 2, 8, 5, 12, 1, 39, 9],
    );
    let mut raw = vec![1u8];
    for w in [
        0x1000u64, 0x3000, 0x5000, 0x9000, 0x2000, 0x6000, 0x8000, 0xa000,
    ] {
        raw.extend_from_slice(&w.to_le_bytes());
    }
    put("chain", "raw", &raw);

    // Store records.
    put("store_records", "latest", b"12\n");
    put(
        "store_records",
        "marker",
        b"stasis image directory\nformat 1\n",
    );
}

fn track_seeds() {
    for (name, backend) in [
        ("uffd", Backend::Uffd),
        ("soft-dirty", Backend::SoftDirty),
        ("hash", Backend::Hash),
    ] {
        let s = TrackState {
            backend,
            armed_at: 3,
            root_pid: 100,
            procs: vec![(100, 12345), (101, 12399)],
        };
        put(
            "track_state",
            name,
            &stasis_track::state::encode(&s).expect("encode"),
        );
    }
    put(
        "track_hashes",
        "three",
        &stasis_track::hash::encode(&[(0x1000, 1), (0x2000, 0xdead), (0x7f00_0000_0000, 7)]),
    );
    put("track_hashes", "empty", &stasis_track::hash::encode(&[]));
}

fn protocol_seeds() {
    let run = RunEntry {
        vaddr: 0x7f00_0000_0000,
        npages: 2,
        flags: 0,
        file_off: 4096,
        checksum: 0x1234_5678,
    };
    let mut s = Vec::new();
    write_greeting(&mut s, PROTOCOL_VERSION).expect("greeting");
    write_frame(&mut s, kind::CLIENT_HELLO, &[7u8; 32]).expect("frame");
    write_frame(&mut s, kind::CLIENT_PROOF, &[9u8; 32]).expect("frame");
    for r in [
        Request::Latest,
        Request::Chain { n: 3 },
        Request::Files { n: 3 },
        Request::File {
            n: 3,
            name: "manifest.bin".into(),
        },
        Request::Skeleton {
            n: 3,
            pack: "pages-100.pack".into(),
        },
        Request::ReadRun {
            n: 3,
            pack: "pages-100.pack".into(),
            run,
        },
    ] {
        let (k, p) = r.encode();
        write_frame(&mut s, k, &p).expect("frame");
    }
    put("ps_request", "session", &s);

    let with = |sel: u8, p: &[u8]| [&[sel][..], p].concat();
    put("ps_reply", "hello", &with(0, &[5u8; 64]));
    put("ps_reply", "latest", &with(1, &3u32.to_le_bytes()));
    let mut e = Enc::default();
    e.u32(3);
    for c in [3u32, 2, 1] {
        e.u32(c);
    }
    put(
        "ps_reply",
        "chain",
        &with(2, &[&3u32.to_le_bytes()[..], &e.0].concat()),
    );
    let mut e = Enc::default();
    e.u32(2);
    e.str("manifest.bin");
    e.u64(900);
    e.str("pages-100.pack");
    e.u64(16384);
    put("ps_reply", "files", &with(3, &e.0));
    let mut e = Enc::default();
    e.u64(4096 + 40 + 48);
    e.u64(4096);
    e.bytes(&[0u8; 4096]);
    e.bytes(&[1u8; 88]);
    put("ps_reply", "skeleton", &with(4, &e.0));
    put(
        "ps_reply",
        "error",
        &with(5, &encode_error(ErrorCode::NotFound, "no checkpoint 9")),
    );
    let mut st = Vec::new();
    write_frame(&mut st, kind::LATEST_REPLY, &3u32.to_le_bytes()).expect("frame");
    write_frame(&mut st, kind::ERROR, &encode_error(ErrorCode::Busy, "busy")).expect("frame");
    put("ps_reply", "stream", &with(6, &st));

    let mut c = Vec::new();
    for m in [
        Msg::Ready { pages: 1234 },
        Msg::Hand(Hand {
            image_pid: 100,
            pid: 4321,
            areas: vec![(0x1000, 0x5000), (0x7f00_0000_0000, 0x7f00_0010_0000)],
        }),
        Msg::Done(true),
        Msg::Abort(true),
        Msg::Error("the image is gone".into()),
    ] {
        c.extend_from_slice(&encode_frame(&m).expect("frame"));
    }
    put("lazy_control", "session", &c);
}

fn main() {
    image_seeds();
    track_seeds();
    protocol_seeds();
    println!("seeds written under {}/corpus", env!("CARGO_MANIFEST_DIR"));
}
