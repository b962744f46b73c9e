//! Python with NumPy: tests/programs/numpy_iter.py rewrites a 32 MiB array
//! at every step and prints a checksum per step; after the restore it goes on, and on SIGTERM it recomputes every
//! step from scratch and compares the whole array element by element.

use crate::harness::*;

use std::process::Command;

/// The `progress N CHECK` lines printed so far, as (N, CHECK).
fn steps(prog: &Prog) -> Vec<(u64, String)> {
    prog.out()
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("progress ")?.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.to_string()))
        })
        .collect()
}

fn last_step(prog: &Prog) -> u64 {
    steps(prog).last().map_or(0, |s| s.0)
}

pub fn iterate(mode: Mode) {
    let dir = Prog::dir("numpy");
    let pidfile = dir.path().join("pid");
    let mut c = Command::new("python3");
    c.arg(programs_dir().join("numpy_iter.py")).arg(&pidfile);
    let mut prog = Prog::start("numpy", dir, c);
    prog.wait_pidfile(&pidfile);
    prog.wait("5 steps before the dump", || last_step(&prog) >= 5);
    let fig = prog.checkpoint(mode);
    let at_dump = last_step(&prog);
    if mode == Mode::Concurrent {
        prog.wait("5 steps after the concurrent dump", || {
            last_step(&prog) >= at_dump + 5
        });
        prog.kill();
    }
    let printed = last_step(&prog);
    prog.restore(mode);
    prog.wait("5 steps after the restore", || {
        last_step(&prog) >= printed + 5
    });
    prog.lazy_done();
    prog.stop(libc::SIGTERM, 0);
    let out = prog.out();
    assert_eq!(out.lines().last(), Some("PASS"), "{}", prog.tail());
    // Each step N printed once, in order, except those a concurrent dump's
    // image rewinds over, printed again with the same checksum.
    let all = steps(&prog);
    let mut seen = std::collections::BTreeMap::new();
    for (n, check) in &all {
        if let Some(old) = seen.insert(*n, check.clone()) {
            assert_eq!(&old, check, "step {n} computed twice, differently");
        }
    }
    let n = seen.len();
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        (1..=u64::try_from(n).expect("small")).collect::<Vec<_>>(),
        "steps"
    );
    eprintln!(
        "numpy {mode:?}: {n} steps over 32 MiB verified; frozen {} us, image {} MiB",
        fig.frozen_us,
        fig.bytes >> 20
    );
}
