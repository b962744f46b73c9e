//! Chain records: the `data_ranges` of incremental processes and pack runs,
//! as the chain resolution combines them (normalize, subtract, intersect,
//! clip, runs_touching). Small inputs are checked against a page-set model;
//! raw 64-bit inputs must keep the outputs well formed.
#![no_main]

use std::collections::BTreeSet;

use libfuzzer_sys::fuzz_target;
use stasis_image::chain::{
    clip_runs_to, intersect, is_ranges, normalize, ranges_bytes, runs_to_ranges, runs_touching,
    subtract,
};
use stasis_image::{RunEntry, PAGE_SIZE};

const P: u64 = PAGE_SIZE;

fn pages(r: &[(u64, u64)]) -> BTreeSet<u64> {
    r.iter().flat_map(|&(s, e)| (s / P)..(e / P)).collect()
}

/// Runs of at most 16 pages covering `r` (sorted), data packed back to back.
fn runs_over(r: &[(u64, u64)]) -> Vec<RunEntry> {
    let mut out = Vec::new();
    let mut off = 4096;
    for &(s, e) in r {
        let mut a = s;
        while a < e {
            let n = ((e - a) / P).min(16);
            out.push(RunEntry {
                vaddr: a,
                npages: n as u32,
                flags: 0,
                file_off: off,
                checksum: a ^ 0x5a5a,
            });
            off += n * P;
            a += n * P;
        }
    }
    out
}

fn model(data: &[u8]) {
    let half = data.len() / 2;
    let pairs = |b: &[u8]| -> Vec<(u64, u64)> {
        b.chunks_exact(2)
            .map(|c| {
                let s = u64::from(c[0]);
                (s * P, (s + u64::from(c[1] % 17)) * P)
            })
            .collect()
    };
    let (ra, rb) = (pairs(&data[..half]), pairs(&data[half..]));
    let (a, b) = (normalize(ra.clone()), normalize(rb.clone()));
    assert!(is_ranges(&a) && is_ranges(&b));
    let (sa, sb) = (pages(&ra), pages(&rb));
    assert_eq!(pages(&a), sa);
    assert_eq!(ranges_bytes(&a), sa.len() as u64 * P);
    let d = subtract(&a, &b);
    assert!(is_ranges(&d));
    assert_eq!(pages(&d), sa.difference(&sb).copied().collect());
    let i = intersect(&a, &b);
    assert!(is_ranges(&i));
    let si: BTreeSet<u64> = sa.intersection(&sb).copied().collect();
    assert_eq!(pages(&i), si);

    let runs = runs_over(&b);
    assert_eq!(runs_to_ranges(&runs), b);
    let clipped = clip_runs_to(&runs, &a);
    let got: Vec<(u64, u64)> = clipped.iter().map(|r| (r.vaddr, r.end())).collect();
    assert_eq!(pages(&got), si);
    for c in &clipped {
        assert!(c.npages >= 1);
        let src = runs
            .iter()
            .find(|r| r.vaddr <= c.vaddr && c.end() <= r.end())
            .expect("a clipped run lies inside a run");
        assert_eq!(c.file_off - src.file_off, c.vaddr - src.vaddr);
        assert_eq!(c.checksum, src.checksum);
    }
    let touching = runs_touching(&runs, &a);
    let want: Vec<RunEntry> = runs
        .iter()
        .filter(|r| !pages(&[(r.vaddr, r.end())]).is_disjoint(&sa))
        .copied()
        .collect();
    assert_eq!(touching, want);
}

fn raw(data: &[u8]) {
    let words: Vec<u64> = data
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    let pairs: Vec<(u64, u64)> = words.chunks_exact(2).map(|w| (w[0], w[1])).collect();
    let (ra, rb) = pairs.split_at(pairs.len() / 2);
    for r in [ra, rb] {
        // What a manifest may hold once the decoder accepted it.
        if is_ranges(r) {
            let _ = ranges_bytes(r);
            let runs = clip_runs_to(&[], r);
            assert!(runs.is_empty());
        }
    }
    let (a, b) = (normalize(ra.to_vec()), normalize(rb.to_vec()));
    for r in [&a, &b, &subtract(&a, &b), &intersect(&a, &b)] {
        assert!(r.windows(2).all(|w| w[0].1 < w[1].0) && r.iter().all(|x| x.0 < x.1));
    }
}

fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        Some((m, rest)) if m % 2 == 0 => model(rest),
        Some((_, rest)) => raw(rest),
        None => {}
    }
});
