//! Throughput of `PackWriter::write_run` and `PackReader::verify`.
//!
//! `cargo run --release -p stasis-image --example pack_bench -- [DIR] [MiB]`
//! (DIR defaults to /dev/shm, size to 1024 MiB). Writes the pack three ways
//! (one huge slice, 2 MiB slices, 4 KiB slices) after a warm-up, and prints
//! a raw `write(2)` baseline for comparison. Each figure is the best of 3.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use stasis_image::{ImageDir, ImageError, PackReader, PAGE_SIZE};

fn raw_write(dir: &Path, data: &[u8]) -> f64 {
    let path = dir.join("raw");
    let mut f = std::fs::File::create(&path).expect("create raw file");
    let t = Instant::now();
    for c in data.chunks(1 << 20) {
        f.write_all(c).expect("write raw file");
    }
    let secs = t.elapsed().as_secs_f64();
    drop(f);
    std::fs::remove_file(&path).expect("remove raw file");
    secs
}

fn main() -> Result<(), ImageError> {
    let mut args = std::env::args().skip(1);
    let base = PathBuf::from(args.next().unwrap_or_else(|| "/dev/shm".into()));
    let mib: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1024);
    let len = mib << 20;
    let dir = base.join(format!("stasis-pack-bench-{}", std::process::id()));
    let image = ImageDir::create_or_open(&dir)?;

    // Non-trivial content (so nothing is special-cased for zeros).
    let mut data = vec![0u8; len];
    let mut x: u64 = 0x1234_5678_9abc_def1;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let gbps = |secs: f64| len as f64 / secs / 1e9;

    // Warm-up: the first write to tmpfs pays for fresh memory.
    raw_write(&dir, &data);
    let raw = (0..3)
        .map(|_| raw_write(&dir, &data))
        .fold(f64::MAX, f64::min);
    println!("   raw write(2): {:.2} GB/s", gbps(raw));

    for (label, slice) in [
        ("one slice", len),
        ("2 MiB slices", 2 << 20),
        ("4 KiB slices", 4096),
    ] {
        let (mut best_w, mut best_v) = (f64::MAX, f64::MAX);
        let mut runs = 0;
        for _ in 0..3 {
            let mut b = image.begin_checkpoint()?;
            let mut w = b.create_pack(1)?;
            let t = Instant::now();
            let mut vaddr = 0x7f00_0000_0000u64;
            for chunk in data.chunks(slice) {
                w.write_run(vaddr, chunk)?;
                vaddr += chunk.len() as u64;
            }
            let r = w.finish()?;
            best_w = best_w.min(t.elapsed().as_secs_f64());
            assert_eq!(r.pages * PAGE_SIZE, len as u64);
            let path = b.temp_dir().join(&r.name);
            let t = Instant::now();
            let reader = PackReader::open(&path, Some(&r))?;
            reader.verify()?;
            best_v = best_v.min(t.elapsed().as_secs_f64());
            runs = reader.runs().len();
        }
        println!(
            "{label:>15}: write {:.2} GB/s, open+verify {:.2} GB/s ({runs} runs)",
            gbps(best_w),
            gbps(best_v),
        );
    }
    std::fs::remove_dir_all(&dir).map_err(|e| ImageError::Io {
        action: "remove",
        path: dir.clone(),
        source: e,
    })?;
    Ok(())
}
