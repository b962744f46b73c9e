#!/usr/bin/env python3
"""bench/rt_latency: TIC-CKPT's rt-benchmark. Does a checkpoint make a
periodic real-time task miss its deadline? One process, two threads: a
periodic task (1 ms period, released on an absolute CLOCK_MONOTONIC grid,
SCHED_FIFO) that logs its release, wake-up and finish times, and a
neighbour thread that holds and keeps writing 1 GiB. While it runs, the
driver checkpoints it stop-the-world (`dump --leave-running`) and
concurrently (`dump --leave-running --concurrent`), alternately, and
compares the jobs released during each checkpoint with those of the second
before it.

    sudo python3 bench/rt_latency.py [--ws-mib 1024] [--ws-pass-s 4]
        [--period-us 1000] [--deadline-us PERIOD] [--prio 50] [--reps 3]
        [--cow-buffer SIZE] [--gap-s 2] [--wait-quiet SECS]
        [--dir DIR] [--json-out FILE] [--stasis PATH]

Workload: bench/workloads/rt_task.c. Exit status: 1 only if something broke
(a dump failed, the workload died or did not print PASS); the latencies are
measurements, never pass/fail.
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
    "tic_ckpt": "rt-benchmark: with TIC-CKPT the task meets a 17.5 ms deadline (19 ms with margin; worst "
                "execution time without checkpoint 8.8 ms) with high probability while one checkpoint is set; "
                "with stop-the-world (and CLL) it misses it with high probability",
}


def load_log(path):
    a = array.array("q")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a[0::3], a[1::3], a[2::3]


def window(log3, t0, t1, deadline_ns):
    """Jobs released in [t0, t1]: count, worst lateness (wake - release),
    worst response (end - release), deadline misses (end - release >
    deadline)."""
    rel, wake, end = log3
    i0 = bisect.bisect_left(rel, t0)
    i1 = bisect.bisect_right(rel, t1)
    n = i1 - i0
    if n <= 0:
        return {"jobs": 0, "worst_lateness_ms": None, "worst_response_ms": None, "misses": 0,
                "window_ms": (t1 - t0) / 1e6}
    late = max(wake[i] - rel[i] for i in range(i0, i1))
    resp = [end[i] - rel[i] for i in range(i0, i1)]
    return {
        "jobs": n,
        "window_ms": (t1 - t0) / 1e6,
        "worst_lateness_ms": late / 1e6,
        "worst_response_ms": max(resp) / 1e6,
        "misses": sum(1 for r in resp if r > deadline_ns),
        "p99_lateness_ms": sorted(wake[i] - rel[i] for i in range(i0, i1))[min(n - 1, int(0.99 * n))] / 1e6,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ws-mib", type=int, default=1024, help="memory the neighbour thread holds and writes")
    ap.add_argument("--ws-pass-s", type=float, default=4.0,
                    help="seconds per pass of the neighbour's writes (one word per page); 0: as fast as it can")
    ap.add_argument("--period-us", type=int, default=1000)
    ap.add_argument("--deadline-us", type=int, default=None, help="relative deadline (default: the period)")
    ap.add_argument("--prio", type=int, default=50, help="SCHED_FIFO priority of the periodic task (0: SCHED_OTHER)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gap-s", type=float, default=2.0, help="time between checkpoints (the baseline window is "
                                                             "the second before each one)")
    ap.add_argument("--baseline-s", type=float, default=1.0)
    ap.add_argument("--cow-buffer", default=None, help="--cow-buffer for the concurrent dumps (default: stasis's)")
    ap.add_argument("--cow-method", default=None, choices=["auto", "uffd", "fork"],
                    help="--cow-method for the concurrent dumps (default: stasis's, auto)")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECS",
                    help="before each dump, wait up to SECS for a second in which the rest of the machine is idle")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json-out", default=os.path.join(cc.RESULTS, "rt_latency.json"))
    ap.add_argument("--stasis", default=cc.DEFAULT_STASIS)
    args = ap.parse_args()
    if args.reps <= 0 or args.ws_mib <= 0 or args.period_us <= 0 or args.gap_s <= args.baseline_s:
        ap.error("--reps, --ws-mib, --period-us > 0; --gap-s > --baseline-s")
    deadline_us = args.deadline_us or args.period_us
    if not cc.check_root_and_binary("rt_latency", args.stasis):
        return 1
    cc.set_subreaper()

    t_start = time.monotonic()
    exes = cc.compile_workloads(["rt_task"])
    workdir, fstype = cc.make_workdir(args.dir, "rt-latency")
    result = cc.result_header("rt_latency", args, args.stasis, workdir, fstype, REFERENCE)
    dumper = cc.Dumper(args.stasis, workdir, args.cow_method)
    max_s = 120 + (args.reps + 1) * 2 * (args.gap_s + 10) + args.wait_quiet * (args.reps + 1) * 2
    wl = cc.Workload([exes["rt_task"], "@PIDFILE@", "@DATAFILE@", str(args.ws_mib), str(args.ws_pass_s),
                      str(args.period_us), str(int(max_s)), str(args.prio)], workdir, "rt")
    dumps = []
    try:
        wl.wait_ready()
        time.sleep(max(2.0, args.gap_s))
        seq = 0
        plan = [("warmup", False), ("warmup", True)]
        for i in range(args.reps):
            plan += [(i, c) for c in ((False, True) if i % 2 == 0 else (True, False))]
        for rep, conc in plan:
            seq += 1
            img = os.path.join(workdir, f"img{seq}")
            q = cc.wait_quiet(args.wait_quiet, own_pids=[wl.pid])
            if q:  # the wait ate into the baseline window: refill it
                time.sleep(args.baseline_s)
            r = dumper.dump(wl, img, conc, cow_buffer=args.cow_buffer)
            r["rep"] = rep
            r["quiet_wait_s"] = q
            shutil.rmtree(img)
            dumps.append(r)
            log(f"rep {rep} {r['mode']}: wall {r['wall_s']:.3f} s, frozen {r['frozen_ms']:.1f} ms"
                + (f" (+reap {r['reap_stop_ms']:.2f} ms, paused {r['paused']})" if conc else ""))
            time.sleep(args.gap_s)
        out_lines = wl.stop()
    except BenchError as e:
        wl.kill()
        log(f"rt_latency: FAILED: {e}")
        log(f"rt_latency: work dir left for inspection: {workdir}")
        return 1
    except BaseException:
        wl.kill()
        raise

    log3 = load_log(wl.datafile)
    if not log3[0]:
        log("rt_latency: FAILED: the task logged no job")
        return 1
    dl_ns = deadline_us * 1000
    for r in dumps:
        t0, t1 = r["t_start_ns"], r["t_end_ns"]
        r["window"] = window(log3, t0, t1, dl_ns)
        b1 = t0 - 20_000_000
        r["baseline"] = window(log3, b1 - int(args.baseline_s * 1e9), b1, dl_ns)
    summary = {}
    for mode in ("stop-the-world", "concurrent"):
        rs = [r for r in dumps if r["mode"] == mode and r["rep"] != "warmup"]
        summary[mode] = {
            "window_ms": stats([r["window"]["window_ms"] for r in rs]),
            "jobs": stats([r["window"]["jobs"] for r in rs]),
            "worst_lateness_ms": stats([r["window"]["worst_lateness_ms"] for r in rs]),
            "worst_response_ms": stats([r["window"]["worst_response_ms"] for r in rs]),
            "misses": stats([r["window"]["misses"] for r in rs]),
            "frozen_ms": stats([r["frozen_ms"] for r in rs]),
            "downtime_ms": stats([r["downtime_ms"] for r in rs]),
            "observed_stopped_ms": stats([r["watched"]["stopped_total_ms"] for r in rs]),
            "paused_total": sum(r["paused"] or 0 for r in rs),
            "write_faults": stats([r["write_faults"] for r in rs]) if mode == "concurrent" else None,
            "methods": sorted({r.get("method") or "?" for r in rs}),
            "fault_p50_us": stats([r.get("fault_p50_us") for r in rs]),
            "fault_p99_us": stats([r.get("fault_p99_us") for r in rs]),
            "other_cpu_s": stats([r["other_cpu_s"] for r in rs]),
        }
    base = [r["baseline"] for r in dumps if r["rep"] != "warmup"]
    summary["baseline"] = {
        "window_ms": stats([b["window_ms"] for b in base]),
        "jobs": stats([b["jobs"] for b in base]),
        "worst_lateness_ms": stats([b["worst_lateness_ms"] for b in base]),
        "worst_response_ms": stats([b["worst_response_ms"] for b in base]),
        "misses": stats([b["misses"] for b in base]),
    }
    policy = out_lines[-2] if len(out_lines) >= 2 else ""
    fifo = "policy fifo" in policy

    L = []
    L.append(f"rt-benchmark: periodic task, period {args.period_us} us, deadline {deadline_us} us, "
             f"{'SCHED_FIFO ' + str(args.prio) if fifo else 'SCHED_OTHER'}; neighbour thread holding "
             f"{args.ws_mib} MiB, writing one word per page, "
             + (f"one pass / {args.ws_pass_s:g} s" if args.ws_pass_s > 0 else "as fast as it can")
             + f"; {args.reps} reps, median [min-max]")
    L.append("jobs released during each checkpoint (wall time of the `stasis dump` command), and during the "
             f"{args.baseline_s:g} s before it (baseline)")
    L.append("")
    L.append(f"{'':16} {'window ms':>17} {'jobs':>17} {'worst lateness ms':>27} {'worst response ms':>27} "
             f"{'deadline misses':>16} {'stasis stop ms':>21} {'observed stop ms':>21}")

    def f(st, fmt="{:.2f}"):
        if st is None:
            return "-"
        return f"{fmt.format(st['median'])} [{fmt.format(st['min'])}-{fmt.format(st['max'])}]"

    for name in ("baseline", "stop-the-world", "concurrent"):
        s = summary[name]
        L.append(f"{name:16} {f(s['window_ms'], '{:.0f}'):>17} {f(s['jobs'], '{:.0f}'):>17} "
                 f"{f(s['worst_lateness_ms'], '{:.2f}'):>27} {f(s['worst_response_ms'], '{:.2f}'):>27} "
                 f"{f(s['misses'], '{:.0f}'):>16} "
                 f"{(f(s['downtime_ms'], '{:.1f}') if 'downtime_ms' in s else ''):>21} "
                 f"{(f(s['observed_stopped_ms'], '{:.1f}') if 'downtime_ms' in s else ''):>21}")
    c = summary["concurrent"]
    L.append("")
    L.append(f"concurrent ({','.join(c['methods'])}): {c['paused_total']} cap pause(s) over {args.reps} reps; "
             f"write faults during the copy {f(c['write_faults'], '{:.0f}')}, latency p50 "
             f"{f(c['fault_p50_us'], '{:.0f}')} us, p99 {f(c['fault_p99_us'], '{:.0f}')} us; "
             f"other processes' CPU s per dump (median): stw "
             f"{summary['stop-the-world']['other_cpu_s']['median']:.2f}, concurrent {c['other_cpu_s']['median']:.2f}")
    L.append("lateness = wake-up - release; response = finish - release; a miss = response > deadline. After a "
             "stop, the backlog of jobs runs back to back: each one is late and counts as a miss.")
    L.append("stasis stop = frozen_us (+ reap_stop_us for concurrent); observed stop = time the process was seen "
             "in a ptrace stop during the dump (sampled every 0.5 ms; includes a cap pause; below frozen_us when "
             "the freeze runs syscalls inside the process).")
    L.append("reference: TIC-CKPT met a 17.5 ms deadline with high probability during a checkpoint; "
             "stop-the-world missed it with high probability.")
    txt = "\n".join(L)
    result.update({"deadline_us": deadline_us, "workload_output": out_lines, "dumps": dumps, "summary": summary,
                   "jobs_logged": len(log3[0])})
    cc.reap_orphans()
    return cc.finish("rt_latency", args, result, txt, t_start, workdir)


if __name__ == "__main__":
    sys.exit(main())
