#!/usr/bin/env python3
"""bench/matmul_incremental: the TIC-CKPT incremental-checkpoint experiment.
A 1024x1024 double matrix multiplication program (workloads/matmul.c: C = A*B
again and again, the product becoming the next A) runs under `stasis run
--every 10` and `--every 20`; the pages each incremental checkpoint saves are
compared with the pages of the full checkpoint of the same process (the first
checkpoint of the same run): "% fewer pages than full".

    sudo python3 bench/matmul_incremental.py [--intervals 10,20]
                                             [--checkpoints 4] [--scale 1]
                                             [--n 1024] [--mult-s 0]
                                             [--track uffd] [--baseline-s S]
                                             [--dir DIR]
                                             [--json-out FILE] [--stasis PATH]
                                             [--wait-quiet SECS]

Each interval I gets its own `stasis run` of its own matmul process that
runs for I*scale*(checkpoints + 1.5) seconds: one full checkpoint, then
--checkpoints incremental ones. --scale 0.1 gives a quick run (1 s and 2 s).
--mult-s S paces the program so that one multiplication takes S seconds (the
write rate of a slower machine; 0, the default, is full speed). First, the
same job runs without stasis (2 x the shortest interval): the baseline of the
job's speed.

Exit status: 1 if anything broke (`stasis run` or the job failed, the job's
own check of its products failed, a run made no incremental checkpoint),
else 0. No figure is pass/fail.
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True
import track_common as tc  # noqa: E402
from track_common import BenchError, log, stats  # noqa: E402

REFERENCE = {
    "tic_ckpt_fewer_pages_pct": {"10": 84.9, "20": 69.7},
    "note": "TIC-CKPT: incremental checkpoints copy 84.9% (10 s interval) and 69.7% (20 s) fewer pages than "
            "full ones, 1024x1024 double matrix multiplication on a 600 MHz SH-4A with software floating "
            "point",
}


def parse_job(text, n):
    """The job's last line before PASS: "mults M panels P elapsed_s T cpu_s U";
    the rates count partial multiplications (panels of 16 rows)."""
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == "mults" and len(f) >= 8:
            st = {"mults": int(f[1]), "panels": int(f[3]), "elapsed_s": float(f[5]), "cpu_s": float(f[7])}
            per_mult = -(-n // 16)
            st["mults_per_s"] = st["panels"] / per_mult / st["elapsed_s"]
            st["mults_per_cpu_s"] = st["panels"] / per_mult / st["cpu_s"] if st["cpu_s"] > 0 else None
            return st
    return {}


def run_untracked(args, exe, workdir, seconds):
    """The same job without stasis: its speed is the baseline of mult/s."""
    logf = os.path.join(workdir, "untracked.log")
    argv = [exe, str(args.n), f"{seconds:g}", f"{args.mult_s:g}"]
    log(f"untracked baseline: `{shlex.join(argv)}` ({seconds:g} s)")
    busy0 = tc.dr.cpu_busy_s()
    p = tc.start_workload(argv, logf, workdir)
    try:
        code = p.wait(timeout=seconds * 3 + 60)
    except subprocess.TimeoutExpired:
        tc.kill_quietly(p)
        raise BenchError(f"`{shlex.join(argv)}` did not finish")
    text = open(logf).read()
    os.unlink(logf)
    if code != 0 or not text.strip().endswith("PASS"):
        raise BenchError(f"`{shlex.join(argv)}` exited {code}: {text[-500:]}")
    st = parse_job(text, args.n)
    st["argv"] = argv
    st["machine_busy_cpu_s"] = tc.dr.cpu_busy_s() - busy0
    st["other_cpu_s"] = max(0.0, st["machine_busy_cpu_s"] - st.get("cpu_s", 0))
    return st


def run_interval(args, exe, workdir, interval, tag):
    every = interval * args.scale
    duration = every * (args.checkpoints + 1.5)
    img = os.path.join(workdir, f"img-{tag}")
    logf = os.path.join(workdir, f"{tag}.job.log")
    job = [exe, str(args.n), f"{duration:g}", f"{args.mult_s:g}"]
    argv = [args.stasis, "run", "-D", img, "--every", f"{every:g}", "--track", args.track, "--json",
            "--log", logf, "--"] + job
    out_path = os.path.join(workdir, f"{tag}.run.out")
    err_path = os.path.join(workdir, f"{tag}.run.err")
    log(f"interval {every:g} s: `{shlex.join(argv)}` ({duration:g} s)")
    busy0 = tc.dr.cpu_busy_s()
    t0 = time.monotonic()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True,
                             start_new_session=True)
        timer = threading.Timer(duration * 3 + 120, p.kill)
        timer.start()
        try:
            # wait4: stasis run's CPU time, the job's (which it reaped) included
            _pid, status, ru = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        code = p.returncode = os.waitstatus_to_exitcode(status)
        if time.monotonic() - t0 >= duration * 3 + 120:
            raise BenchError(f"`{shlex.join(argv)}` did not finish within {duration * 3 + 120:.0f} s")
    wall = time.monotonic() - t0
    busy = tc.dr.cpu_busy_s() - busy0
    run_cpu = ru.ru_utime + ru.ru_stime
    events = []
    for line in open(out_path):
        line = line.strip()
        if line.startswith("{"):
            events.append(json.loads(line))
    err = open(err_path).read()
    joblog = open(logf).read() if os.path.exists(logf) else ""
    if code != 0 or not joblog.strip().endswith("PASS"):
        raise BenchError(f"`{shlex.join(argv)}` exited {code}; job log: {joblog[-500:]}; stderr: {err[-2000:]}")
    cps = [e for e in events if e.get("event") == "checkpoint"]
    full = [e for e in cps if e.get("parent") is None]
    inc = [e for e in cps if e.get("parent") is not None]
    if len(full) != 1 or not inc:
        raise BenchError(f"`{shlex.join(argv)}`: {len(full)} full and {len(inc)} incremental checkpoints: {cps}")
    job_stats = parse_job(joblog, args.n)
    keys = ("checkpoint", "kind", "pages", "bytes", "frozen_us", "total_us", "parent")
    rec = {
        "interval_s": interval, "every_s": every, "duration_s": duration, "argv": argv, "wall_s": wall,
        "machine_busy_cpu_s": busy, "stasis_run_and_job_cpu_s": run_cpu,
        "other_cpu_s": max(0.0, busy - run_cpu), "job": job_stats,
        "full": {k: full[0].get(k) for k in keys},
        "incrementals": [{k: e.get(k) for k in keys} for e in inc],
        "checkpoint_failures": [line for line in err.splitlines() if "checkpoint failed" in line],
        "image_bytes": tc.dr.dir_size(img)[0],
    }
    fp = full[0]["pages"]
    fewer = [100.0 * (1 - e["pages"] / fp) for e in inc]
    rec["fewer_pages_pct"] = fewer
    rec["summary"] = {
        "full_pages": fp,
        "incremental_pages": stats([e["pages"] for e in inc]),
        "fewer_pages_pct": stats(fewer),
        "fewer_pages_pct_mean": sum(fewer) / len(fewer),
        "fewer_pages_pct_of_total": 100.0 * (1 - sum(e["pages"] for e in inc) / (fp * len(inc))),
        "full_total_ms": full[0]["total_us"] / 1e3, "full_frozen_ms": full[0]["frozen_us"] / 1e3,
        "incremental_total_ms": stats([e["total_us"] / 1e3 for e in inc]),
        "incremental_frozen_ms": stats([e["frozen_us"] / 1e3 for e in inc]),
    }
    rec["summary"]["mults_per_s"] = job_stats.get("mults_per_s")
    rec["summary"]["mults_per_cpu_s"] = job_stats.get("mults_per_cpu_s")
    shutil.rmtree(img, ignore_errors=True)
    for p in (out_path, err_path, logf):
        os.unlink(p)
    return rec


def table(recs, args, base=None):
    n = args.n
    mib = n * n * 8 / 2**20
    pace = "full speed" if args.mult_s == 0 else f"paced to {args.mult_s:g} s per multiplication"
    lines = [f"incremental checkpoints of a {n}x{n} double matrix multiplication (3 matrices of {mib:g} MiB; "
             f"C = s*A*B, then A <- C, s = 1/max|A|; {pace}), `stasis run --every I --track {args.track}`", ""]
    lines.append(f"{'interval':>9} {'full pages':>10} {'incr. pages median [min-max]':>29} {'% fewer than full':>27} "
                 f"{'TIC-CKPT':>9}  {'full ms':>7} {'incr. ms total/frozen':>21}  {'mult/s':>6} {'per CPU-s':>9}")
    for r in recs:
        s = r["summary"]
        ip, fw = s["incremental_pages"], s["fewer_pages_pct"]
        ref = REFERENCE["tic_ckpt_fewer_pages_pct"].get(f"{r['interval_s']:g}")
        ipc = f"{ip['median']:.0f} [{ip['min']:.0f}-{ip['max']:.0f}]"
        fwc = f"{fw['median']:.1f}% [{fw['min']:.1f}-{fw['max']:.1f}]"
        lines.append(f"{r['every_s']:8g}s {s['full_pages']:10d} {ipc:>29} {fwc:>27} "
                     f"{(f'{ref:.1f}%' if ref is not None else '-'):>9}  {s['full_total_ms']:7.0f} "
                     f"{s['incremental_total_ms']['median']:10.0f}/{s['incremental_frozen_ms']['median']:<10.0f}  "
                     f"{s.get('mults_per_s') or 0:6.2f} {s.get('mults_per_cpu_s') or 0:9.2f}")
    if base:
        lines.append(f"{'untracked':>9} {'':10} {'':>29} {'':>27} {'':>9}  {'':7} {'':21}  "
                     f"{base.get('mults_per_s') or 0:6.2f} {base.get('mults_per_cpu_s') or 0:9.2f}")
        for r in recs:
            s = r["summary"]
            if s.get("mults_per_s") and base.get("mults_per_s"):
                r["summary"]["mults_per_s_vs_untracked"] = s["mults_per_s"] / base["mults_per_s"]
                r["summary"]["mults_per_cpu_s_vs_untracked"] = s["mults_per_cpu_s"] / base["mults_per_cpu_s"]
        lines.append("job speed vs untracked (same job, no stasis, same run): " + ", ".join(
            f"every {r['every_s']:g} s {r['summary'].get('mults_per_s_vs_untracked', 0):.3f}x per second, "
            f"{r['summary'].get('mults_per_cpu_s_vs_untracked', 0):.3f}x per CPU-second" for r in recs))
    lines.append("")
    lines.append("full pages: the first checkpoint of the run (everything present). % fewer: 1 - incremental pages / "
                 "full pages, per incremental checkpoint (median [min-max]); TIC-CKPT: the paper's figure for that "
                 "interval. mult/s: multiplications per second of the job (wall clock: frozen time and CPU contention "
                 "count); per CPU-s: per second of the job's own CPU time (its tracking faults count).")
    lines.append("other processes' CPU s during each run (> ~1 s: the machine was shared): "
                 + (f"untracked {base['other_cpu_s']:.1f}, " if base else "")
                 + ", ".join(f"every {r['every_s']:g} s {r['other_cpu_s']:.1f}" for r in recs))
    fails = sum(len(r["checkpoint_failures"]) for r in recs)
    if fails:
        lines.append(f"checkpoints that failed (the job ran on): {fails}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--intervals", default="10,20", help="seconds between checkpoints, comma-separated")
    ap.add_argument("--checkpoints", type=int, default=4, help="incremental checkpoints per run (default 4)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the intervals (and run lengths) by this")
    ap.add_argument("--n", type=int, default=1024, help="matrix order (default 1024)")
    ap.add_argument("--mult-s", type=float, default=0.0, help="pace: seconds per multiplication (0: full speed)")
    ap.add_argument("--track", default="uffd")
    ap.add_argument("--baseline-s", type=float, default=0.0,
                    help="length of the untracked run of the job (default: 2 x the shortest interval, scaled)")
    ap.add_argument("--dir", default=None, help="work dir for images (default: a fresh dir under /dev/shm)")
    ap.add_argument("--json-out", default=os.path.join(tc.RESULTS, "matmul_incremental.json"))
    ap.add_argument("--stasis", default=tc.DEFAULT_STASIS)
    tc.add_quiet_option(ap)
    args = ap.parse_args()
    try:
        intervals = [float(x) for x in args.intervals.split(",") if x]
    except ValueError:
        ap.error("--intervals: comma-separated seconds")
    if not intervals or min(intervals) <= 0 or args.checkpoints <= 0 or args.scale <= 0 or args.n < 16 \
            or args.mult_s < 0:
        ap.error("--intervals, --checkpoints, --scale must be positive, --n >= 16, --mult-s >= 0")
    args.stasis = os.path.abspath(args.stasis)
    if not tc.check_root_and_binary("matmul_incremental", args.stasis):
        return 1

    t0 = time.monotonic()
    try:
        exe = tc.dr.compile_workloads(("matmul",))["matmul"]
    except BenchError as e:
        log(f"matmul_incremental: FAILED: {e}")
        return 1
    workdir, fstype = tc.make_workdir(args.dir, "matmul")
    result = tc.result_header("matmul_incremental", args, args.stasis, workdir, fstype, REFERENCE)
    recs, failure, base = [], None, None
    try:
        quiet = tc.wait_quiet(args.wait_quiet)
        base = run_untracked(args, exe, workdir, args.baseline_s or 2 * min(intervals) * args.scale)
        base["quiet_wait_s"] = quiet
        log(f"untracked: {base.get('mults_per_s', 0):.2f} multiplications/s")
        for i, interval in enumerate(intervals):
            quiet = tc.wait_quiet(args.wait_quiet)
            rec = run_interval(args, exe, workdir, interval, f"i{i}")
            rec["quiet_wait_s"] = quiet
            recs.append(rec)
            s = rec["summary"]
            log(f"interval {rec['every_s']:g} s: full {s['full_pages']} pages; incremental "
                f"{[e['pages'] for e in rec['incrementals']]} pages; fewer than full "
                f"{s['fewer_pages_pct']['median']:.1f}% (median)")
    except BenchError as e:
        failure = str(e)
        log(f"matmul_incremental: FAILED: {e}")
    txt = table(recs, args, base) if recs else "(no results)"
    result.update({"untracked": base, "runs": recs, "failure": failure})
    return tc.finish("matmul_incremental", args, result, txt, t0, workdir, failure)


if __name__ == "__main__":
    sys.exit(main())
