#!/usr/bin/env python3
"""bench/random_writer: the worst case for a copy-on-write checkpoint
(TIC-CKPT's memperf workload). A process writes 64-bit words at random
places in 1 GiB as fast as it can and logs its write count every
millisecond. The driver checkpoints it stop-the-world
(`dump --leave-running`) and concurrently (`dump --leave-running
--concurrent`) with several --cow-buffer caps, and reports each
checkpoint's time and the writer's throughput during it against the second
before it.

    sudo python3 bench/random_writer.py [--size-mib 1024] [--reps 3]
        [--cow-buffers 0,64M,default] [--gap-s 2] [--no-verify]
        [--wait-quiet SECS] [--dir DIR] [--json-out FILE] [--stasis PATH]

--cow-buffers lists the concurrent variants: a size for `--cow-buffer`
(0 = no cap), or `default` (no option: stasis's default, 256M).

Workload: bench/workloads/rand_writer.c. Exit status: 1 only if something
broke (a dump failed, the writer died or found a wrong word, the restored
concurrent image failed its check); the times are measurements, never
pass/fail.
"""

import argparse
import array
import bisect
import os
import shutil
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrent_common as cc  # noqa: E402
from concurrent_common import BenchError, log, stats  # noqa: E402

REFERENCE = {
    "tic_ckpt": "memperf (random reads and writes) is TIC-CKPT's worst case: its concurrent incremental "
                "checkpoint was slightly slower than CRAK's there (many checks of its TLB-loaded page list); "
                "concurrent checkpoint time in general ~20% longer than stop-the-world",
}


def load_log(path):
    a = array.array("q")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return list(a[0::2]), list(a[1::2])


def count_at(log2, t):
    """Writes done by time t (linear between the log entries)."""
    ts, cs = log2
    i = bisect.bisect_right(ts, t)
    if i == 0:
        return None
    if i >= len(ts):
        return cs[-1] if t - ts[-1] < 5_000_000 else None
    t0, t1, c0, c1 = ts[i - 1], ts[i], cs[i - 1], cs[i]
    return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c0


def rate(log2, t0, t1):
    a, b = count_at(log2, t0), count_at(log2, t1)
    if a is None or b is None or t1 <= t0:
        return None
    return (b - a) / ((t1 - t0) / 1e9)


def gaps(log2, t0, t1, min_ms=5.0):
    """(longest gap, sum of gaps >= min_ms) between log entries in [t0, t1], ms."""
    ts, _ = log2
    i0 = max(0, bisect.bisect_left(ts, t0) - 1)
    i1 = min(len(ts), bisect.bisect_right(ts, t1) + 1)
    g = [(ts[i + 1] - ts[i]) / 1e6 for i in range(i0, i1 - 1)]
    return max(g, default=0.0), sum(x for x in g if x >= min_ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cow-method", default=None, choices=["auto", "uffd", "fork"],
                    help="--cow-method for the concurrent dumps (default: stasis's, auto)")
    ap.add_argument("--cow-buffers", default="0,64M,default",
                    help="concurrent variants: --cow-buffer sizes (0 = no cap) or 'default'")
    ap.add_argument("--gap-s", type=float, default=2.0,
                    help="time between checkpoints (the second before each is its baseline)")
    ap.add_argument("--baseline-s", type=float, default=1.0)
    ap.add_argument("--no-verify", dest="verify", action="store_false",
                    help="skip restoring the last concurrent image (of the first variant) and checking it")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECS",
                    help="before each dump, wait up to SECS for a second in which the rest of the machine is idle")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json-out", default=os.path.join(cc.RESULTS, "random_writer.json"))
    ap.add_argument("--stasis", default=cc.DEFAULT_STASIS)
    args = ap.parse_args()
    variants = [("stop-the-world", None)]
    for v in args.cow_buffers.split(","):
        v = v.strip()
        if v:
            variants.append((f"concurrent, cow-buffer {v}" if v != "default" else "concurrent, default cap",
                             None if v == "default" else v))
    if args.reps <= 0 or args.size_mib <= 0 or len(variants) < 2 or args.gap_s <= args.baseline_s:
        ap.error("--reps, --size-mib > 0; at least one --cow-buffers variant; --gap-s > --baseline-s")
    if not cc.check_root_and_binary("random_writer", args.stasis):
        return 1
    cc.set_subreaper()

    t_start = time.monotonic()
    exes = cc.compile_workloads(["rand_writer"])
    workdir, fstype = cc.make_workdir(args.dir, "rand-writer")
    result = cc.result_header("random_writer", args, args.stasis, workdir, fstype, REFERENCE)
    dumper = cc.Dumper(args.stasis, workdir, args.cow_method)
    max_s = 120 + (args.reps + 1) * len(variants) * (args.gap_s + 15) + args.wait_quiet * (args.reps + 1) * len(variants)
    wl = cc.Workload([exes["rand_writer"], "@PIDFILE@", "@DATAFILE@", str(args.size_mib), str(int(max_s)), "0"],
                     workdir, "rw")
    dumps = []
    keep = None
    try:
        wl.wait_ready()
        time.sleep(max(2.0, args.gap_s))
        plan = [("warmup", variants[0]), ("warmup", variants[1])]
        for i in range(args.reps):
            k = i % len(variants)
            plan += [(i, v) for v in variants[k:] + variants[:k]]
        for seq, (rep, (name, cap)) in enumerate(plan):
            conc = name != "stop-the-world"
            img = os.path.join(workdir, f"img{seq}")
            q = cc.wait_quiet(args.wait_quiet, own_pids=[wl.pid])
            if q:
                time.sleep(args.baseline_s)
            r = dumper.dump(wl, img, conc, cow_buffer=cap)
            r["rep"] = rep
            r["variant"] = name
            r["quiet_wait_s"] = q
            if conc and rep != "warmup" and name == variants[1][0]:
                if keep:
                    shutil.rmtree(keep)
                keep = img
            else:
                shutil.rmtree(img)
            dumps.append(r)
            log(f"rep {rep} {name}: wall {r['wall_s']:.3f} s, frozen {r['frozen_ms']:.1f} ms"
                + (f" (+reap {r['reap_stop_ms']:.2f}), paused {r['paused']}, write faults {r['write_faults']}, "
                   f"cow peak {cc.mib(r['cow_peak_bytes'])}" if conc else ""))
            time.sleep(args.gap_s)
        out_lines = wl.stop()
        log2 = load_log(wl.datafile)  # now: a restored process rewrites it
        if args.verify and keep:
            result["restore_check"] = cc.restore_check(args.stasis, keep, wl, workdir, run_s=0.2)
            log(f"restored the last '{variants[1][0]}' image: PASS")
    except BenchError as e:
        wl.kill()
        log(f"random_writer: FAILED: {e}")
        log(f"random_writer: work dir left for inspection: {workdir}")
        return 1
    except BaseException:
        wl.kill()
        raise

    for r in dumps:
        t0, t1 = r["t_start_ns"], r["t_end_ns"]
        base = rate(log2, t0 - int(args.baseline_s * 1e9) - 20_000_000, t0 - 20_000_000)
        during = rate(log2, t0, t1)
        after = rate(log2, t1 + 20_000_000, t1 + 20_000_000 + int(args.baseline_s * 1e9))
        longest, stalled = gaps(log2, t0, t1)
        r["writer"] = {
            "baseline_writes_per_s": base,
            "window_writes_per_s": during,
            "after_writes_per_s": after,
            "throughput_ratio": during / base if base and during is not None else None,
            "slowdown": 1 - during / base if base and during is not None else None,
            "after_ratio": after / base if base and after is not None else None,
            "longest_gap_ms": longest,
            "stalled_ms": stalled,
        }
    summary = {}
    for name, _cap in variants:
        rs = [r for r in dumps if r["variant"] == name and r["rep"] != "warmup"]
        summary[name] = {
            "total_ms": stats([r["total_ms"] for r in rs]),
            "wall_s": stats([r["wall_s"] for r in rs]),
            "frozen_ms": stats([r["frozen_ms"] for r in rs]),
            "reap_stop_ms": stats([r["reap_stop_ms"] for r in rs]),
            "observed_stopped_total_ms": stats([r["watched"]["stopped_total_ms"] for r in rs]),
            "baseline_writes_per_s": stats([r["writer"]["baseline_writes_per_s"] for r in rs]),
            "window_writes_per_s": stats([r["writer"]["window_writes_per_s"] for r in rs]),
            "throughput_ratio": stats([r["writer"]["throughput_ratio"] for r in rs]),
            "slowdown": stats([r["writer"]["slowdown"] for r in rs]),
            "after_ratio": stats([r["writer"]["after_ratio"] for r in rs]),
            "stalled_ms": stats([r["writer"]["stalled_ms"] for r in rs]),
            "longest_gap_ms": stats([r["writer"]["longest_gap_ms"] for r in rs]),
            "write_faults": stats([r["write_faults"] for r in rs]),
            "cow_peak_bytes": stats([r["cow_peak_bytes"] for r in rs]),
            "snapshot_private_peak_bytes": stats([r["watched"]["snapshot_private_peak_bytes"] for r in rs]),
            "paused": stats([r["paused"] for r in rs]),
            "other_cpu_s": stats([r["other_cpu_s"] for r in rs]),
            "methods": sorted({r.get("method") or "-" for r in rs}),
            "fault_p50_us": stats([r.get("fault_p50_us") for r in rs]),
            "fault_p99_us": stats([r.get("fault_p99_us") for r in rs]),
            "writer_waits": stats([r.get("writer_waits") for r in rs]),
            "fallbacks": sum(1 for r in rs if r.get("fallback")),
        }
    stw_total = summary["stop-the-world"]["total_ms"]["median"]

    def f(st, fmt):
        return "-" if st is None else fmt.format(st["median"])

    L = []
    L.append(f"random writer (memperf-style): {args.size_mib} MiB, one thread writing words at random pages as fast "
             f"as it can; {args.reps} reps, median (writer throughput = writes/s during the `stasis dump` command "
             f"vs the {args.baseline_s:g} s before it)")
    L.append("")
    L.append(f"{'':32} {'total ms':>9} {'vs stw':>7} {'frozen':>8} {'stopped':>8} {'writes/s':>9} {'writes/s':>9} "
             f"{'through-':>9} {'stalled':>8} {'write':>8} {'cow peak':>9} {'snapshot':>9} {'paused':>6} "
             f"{'other':>6}")
    L.append(f"{'':32} {'':>9} {'':>7} {'ms':>8} {'ms(obs)':>8} {'before':>9} {'during':>9} "
             f"{'put':>9} {'ms':>8} {'faults':>8} {'reported':>9} {'private':>9} {'':>6} {'CPU s':>6}")
    for name, _cap in variants:
        s = summary[name]
        conc = name != "stop-the-world"
        L.append(f"{name:32} {f(s['total_ms'], '{:.0f}'):>9} "
                 f"{s['total_ms']['median'] / stw_total:6.2f}x "
                 f"{f(s['frozen_ms'], '{:.1f}'):>8} {f(s['observed_stopped_total_ms'], '{:.0f}'):>8} "
                 f"{s['baseline_writes_per_s']['median'] / 1e6:8.1f}M "
                 f"{s['window_writes_per_s']['median'] / 1e6:8.2f}M "
                 f"{100 * s['throughput_ratio']['median']:8.1f}% "
                 f"{f(s['stalled_ms'], '{:.0f}'):>8} "
                 f"{(f(s['write_faults'], '{:.0f}') if conc else '-'):>8} "
                 f"{(cc.mib(s['cow_peak_bytes']['median']) if conc else '-'):>9} "
                 f"{(cc.mib(s['snapshot_private_peak_bytes']['median']) if conc and s['snapshot_private_peak_bytes'] else '-'):>9} "
                 f"{(f(s['paused'], '{:.0f}') if conc else '-'):>6} "
                 f"{s['other_cpu_s']['median']:6.2f}")
    L.append("")
    L.append(f"{'':32} {'method':>8} {'fault latency p50 / p99 us':>28} {'writer waits':>13} {'fallbacks':>10}")
    for name, _cap in variants[1:]:
        s = summary[name]
        lat = (f"{s['fault_p50_us']['median']:.0f} / {s['fault_p99_us']['median']:.0f}"
               if s["fault_p50_us"] else "-")
        L.append(f"{name:32} {','.join(s['methods']):>8} {lat:>28} {f(s['writer_waits'], '{:.0f}'):>13} "
                 f"{s['fallbacks']:>10}")
    L.append("")
    L.append("throughput = writes/s during the checkpoint / writes/s before it (slowdown = 100% - throughput); "
             "stalled = time the writer made no progress (log gaps >= 5 ms); stopped ms(obs) = time it was seen "
             "in a ptrace stop (sampled every 0.5 ms): includes a --cow-buffer pause; below frozen_us when the freeze "
             "runs syscalls inside the process.")
    L.append("cow peak reported = the JSON's cow_peak_bytes (the snapshots' private memory, sampled by "
             "stasis after a 32 MiB piece); snapshot private = peak private memory of the snapshot process (every "
             "100 ms; includes pages the dumper's own reads unshare). Throughput after the checkpoint, median: "
             + ", ".join(f"{n} {100 * summary[n]['after_ratio']['median']:.0f}%" for n, _ in variants
                         if summary[n]['after_ratio']))
    L.append("reference: TIC-CKPT: memperf is the worst case of copy-before-write; its concurrent checkpoints "
             "took ~20% longer than stop-the-world.")
    txt = "\n".join(L)
    result.update({"variants": [v[0] for v in variants], "workload_output": out_lines, "dumps": dumps,
                   "summary": summary, "log_entries": len(log2[0])})
    cc.reap_orphans()
    return cc.finish("random_writer", args, result, txt, t_start, workdir)


if __name__ == "__main__":
    sys.exit(main())
