#!/usr/bin/env python3
"""bench/concurrent_downtime: TIC-CKPT's downtime figure. How long a
checkpoint stops a process that keeps computing and writing, concurrent
(`dump --leave-running --concurrent`) against stop-the-world
(`dump --leave-running`), measured in the same run on the same process.

    sudo python3 bench/concurrent_downtime.py [--sizes 256,512,1024]
        [--ws-mib 1024] [--ws-pass-s 8] [--thp] [--reps 5]
        [--cow-buffer SIZE] [--no-verify] [--wait-quiet SECS]
        [--dir DIR] [--json-out FILE] [--stasis PATH]

Workload: bench/workloads/conc_matmul.c, C = A * B repeated on N x N
doubles, A perturbed every round, for each N of --sizes; then the largest N
plus a working set of --ws-mib MiB it keeps writing through (one word per
page, one pass every --ws-pass-s seconds). --thp adds that last case once
more with transparent huge pages.

Exit status: 1 only if something broke (a dump failed, the workload died or
found a wrong product, the restored concurrent image failed its check); the
times are measurements, never pass/fail.
"""

import argparse
import os
import shutil
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrent_common as cc  # noqa: E402
from concurrent_common import BenchError, log, stats  # noqa: E402

REFERENCE = {
    "tic_ckpt": "downtime cut by 50-90% against stop-the-world on matrix multiplication "
                "(90% at 512x512); checkpoint time about 20% longer than stop-the-world",
    "target_less_downtime_at_1gib": 0.98,
    "target_frozen_ms_per_gib": 20.0,
    "note": "targets from issue 5 (Performance); GiB = 2^30 bytes of the image (pages x 4096)",
}


def run_case(b, case, args):
    """Starts the workload of `case`, dumps it reps x (stop-the-world,
    concurrent), alternating which goes first; keeps the last concurrent
    image for the restore check."""
    exe = b["exes"]["conc_matmul"]
    wl = cc.Workload([exe, "@PIDFILE@", str(case["n"]), str(case["ws_mib"]), str(args.ws_pass_s),
                      str(int(case["thp"]))], b["workdir"], case["tag"])
    b["live"].append(wl)
    wl.wait_ready()
    time.sleep(1.0)
    thp_kib = {"start": cc.anon_huge_kib(wl.pid)}
    dumper = b["dumper"]
    recs = {"stop-the-world": [], "concurrent": []}
    warm = []
    keep = None
    img_seq = 0

    def one(conc):
        nonlocal img_seq
        img_seq += 1
        img = os.path.join(b["workdir"], f"img-{case['tag']}-{img_seq}")
        q = cc.wait_quiet(args.wait_quiet, own_pids=[wl.pid])
        r = dumper.dump(wl, img, conc, cow_buffer=args.cow_buffer)
        r["quiet_wait_s"] = q
        time.sleep(args.gap_s)
        return r, img

    # Warm-up (not counted): the first pass over fresh tmpfs pages is slow
    # on this VM (host memory backed lazily).
    for conc in (False, True):
        r, img = one(conc)
        warm.append(r)
        shutil.rmtree(img)
    for i in range(args.reps):
        order = (False, True) if i % 2 == 0 else (True, False)
        for conc in order:
            r, img = one(conc)
            recs[r["mode"]].append(r)
            if conc:
                if keep:
                    shutil.rmtree(keep)
                keep = img
            else:
                shutil.rmtree(img)
        s, c = recs["stop-the-world"][-1], recs["concurrent"][-1]
        log(f"  {case['name']} rep {i + 1}/{args.reps}: frozen stw {s['frozen_ms']:.1f} ms, concurrent "
            f"{c['frozen_ms']:.2f} ms (+stop2 {c['extra_stop_ms']:.2f}, {c['method']}); total {s['total_ms']:.0f} / "
            f"{c['total_ms']:.0f} ms; paused {c['paused']}"
            + (f" ({c['pause_ms_observed']:.0f} ms)" if c["paused"] else ""))
    thp_kib["end"] = cc.anon_huge_kib(wl.pid)
    out_lines = wl.stop()
    b["live"].remove(wl)
    res = {"case": case, "warmup": warm, "reps": recs, "workload_output": out_lines,
           "anon_huge_pages_kib": thp_kib}
    if args.verify and keep:
        res["restore_check"] = cc.restore_check(b["stasis"], keep, wl, b["workdir"], run_s=args.verify_run_s)
        log(f"  {case['name']}: concurrent image restored and checked: PASS")
    if keep:
        shutil.rmtree(keep)
    return res


def summarize(res):
    s = res["reps"]["stop-the-world"]
    c = res["reps"]["concurrent"]
    gib = stats([r["bytes"] for r in s + c])["median"] / 2**30

    def st(recs, key):
        return stats([r[key] for r in recs])

    def wst(recs, key):
        return stats([r["watched"][key] for r in recs if r.get("watched")])

    m = {
        "image_bytes": stats([r["bytes"] for r in s + c])["median"],
        "stw_frozen_ms": st(s, "frozen_ms"),
        "conc_frozen_ms": st(c, "frozen_ms"),
        "conc_reap_stop_ms": st(c, "reap_stop_ms"),
        "conc_extra_stop_ms": st(c, "extra_stop_ms"),
        "conc_methods": sorted({r.get("method") or "?" for r in c}),
        "conc_fallbacks": [r["fallback"] for r in c if r.get("fallback")],
        "conc_fault_p50_us": stats([r["fault_p50_us"] for r in c if r.get("fault_p50_us") is not None]),
        "conc_fault_p99_us": stats([r["fault_p99_us"] for r in c if r.get("fault_p99_us") is not None]),
        "conc_pause_ms_observed": st(c, "pause_ms_observed"),
        "conc_downtime_ms": st(c, "downtime_ms"),
        "stw_total_ms": st(s, "total_ms"),
        "conc_total_ms": st(c, "total_ms"),
        "stw_wall_s": st(s, "wall_s"),
        "conc_wall_s": st(c, "wall_s"),
        "conc_write_faults": st(c, "write_faults"),
        "conc_cow_peak_bytes": st(c, "cow_peak_bytes"),
        "conc_snapshot_private_peak_bytes": wst(c, "snapshot_private_peak_bytes"),
        "conc_paused_total": sum(r["paused"] or 0 for r in c),
        "stw_observed_stopped_ms": wst(s, "stopped_total_ms"),
        "conc_observed_stopped_ms": wst(c, "stopped_total_ms"),
        "conc_observed_longest_stop_ms": wst(c, "longest_stop_ms"),
        "other_cpu_s": stats([r["other_cpu_s"] for r in s + c]),
    }
    sf, cf, cd = m["stw_frozen_ms"]["median"], m["conc_frozen_ms"]["median"], m["conc_downtime_ms"]["median"]
    m["less_downtime_frozen"] = 1 - cf / sf
    m["less_downtime_all_stops"] = 1 - cd / sf
    m["stw_frozen_ms_per_gib"] = sf / gib
    m["conc_frozen_ms_per_gib"] = cf / gib
    m["conc_downtime_ms_per_gib"] = cd / gib
    m["total_ratio_conc_to_stw"] = m["conc_total_ms"]["median"] / m["stw_total_ms"]["median"]
    # Where the concurrent freeze goes (median over reps of each phase).
    phases = {}
    for r in c:
        for k, v in r["phases_ms"].items():
            phases.setdefault(k, []).append(v)
    m["conc_phases_ms"] = {k: cc.med(v) for k, v in phases.items()}
    return m


def table(results, args, workdir, fstype):
    L = []
    L.append(f"concurrent vs stop-the-world checkpoint downtime: matrix multiplication (conc_matmul), image in "
             f"{workdir} ({fstype}), {args.reps} reps, median [min-max]")
    L.append("")
    def rng(st, fmt):
        return f"{fmt.format(st['median'])} [{fmt.format(st['min'])}-{fmt.format(st['max'])}]"

    L.append(f"{'case':24} {'image':>6} {'stop-the-world':>24} {'concurrent frozen':>23} {'+stop2':>6} "
             f"{'+pause':>7} {'less downtime':>14} {'frozen ms/GiB':>15}")
    L.append(f"{'':24} {'':>6} {'frozen ms':>24} {'ms':>23} {'ms':>6} {'ms':>7} {'frozen / all':>14} "
             f"{'stw / conc':>15}")
    for res in results:
        m = res["summary"]
        L.append(f"{res['case']['name']:24} {m['image_bytes'] / 2**20:5.0f}M "
                 f"{rng(m['stw_frozen_ms'], '{:.1f}'):>24} {rng(m['conc_frozen_ms'], '{:.1f}'):>23} "
                 f"{m['conc_extra_stop_ms']['median']:6.2f} {m['conc_pause_ms_observed']['median']:7.1f} "
                 f"{100 * m['less_downtime_frozen']:5.1f}/{100 * m['less_downtime_all_stops']:6.1f}% "
                 f"{m['stw_frozen_ms_per_gib']:7.0f} / {m['conc_frozen_ms_per_gib']:6.1f}")
    L.append("")
    L.append(f"{'case':24} {'total ms stw':>13} {'total ms conc':>14} {'conc/stw':>8} {'write':>8} "
             f"{'cow peak':>9} {'snapshot':>9} {'paused':>6} {'observed stopped ms':>25} {'other':>6}")
    L.append(f"{'':24} {'':>13} {'':>14} {'':>8} {'faults':>8} {'reported':>9} {'private':>9} {'':>6} "
             f"{'stw / conc':>25} {'CPU s':>6}")
    for res in results:
        m = res["summary"]
        ls = m["stw_observed_stopped_ms"]
        lc = m["conc_observed_stopped_ms"]
        L.append(f"{res['case']['name']:24} {m['stw_total_ms']['median']:13.0f} {m['conc_total_ms']['median']:14.0f} "
                 f"{m['total_ratio_conc_to_stw']:7.2f}x {m['conc_write_faults']['median']:8.0f} "
                 f"{cc.mib(m['conc_cow_peak_bytes']['median']):>9} "
                 f"{cc.mib((m['conc_snapshot_private_peak_bytes'] or {}).get('median')):>9} "
                 f"{m['conc_paused_total']:6d} "
                 f"{(ls or {}).get('median', 0):11.1f} / {(lc or {}).get('median', 0):11.1f} "
                 f"{m['other_cpu_s']['median']:6.2f}")
    L.append("")
    L.append(f"{'case':24} {'method':>8} {'write-fault latency p50 / p99 us':>34}")
    for res in results:
        m = res["summary"]
        p50, p99 = m["conc_fault_p50_us"], m["conc_fault_p99_us"]
        lat = (f"{p50['median']:.0f} / {p99['median']:.0f}" if p50 and p50.get("median") is not None else "-")
        L.append(f"{res['case']['name']:24} {','.join(m['conc_methods']):>8} {lat:>34}"
                 + (f"  fallbacks: {len(m['conc_fallbacks'])}" if m["conc_fallbacks"] else ""))
    L.append("")
    for res in results:
        if res["case"]["thp"]:
            t = res["anon_huge_pages_kib"]
            L.append(f"{res['case']['name']}: AnonHugePages {(t['start'] or 0) // 1024} MiB at the start, "
                     f"{(t['end'] or 0) // 1024} MiB after the dumps")
    L.append("where the concurrent freeze goes (ms since the freeze, from `stasis -vv`, median):")
    for res in results:
        ph = res["summary"]["conc_phases_ms"]
        L.append(f"  {res['case']['name']:22} " + "; ".join(f"{k} {v:.1f}" for k, v in ph.items()))
    big = [r for r in results if r["case"]["ws_mib"] >= 1024]
    L.append("")
    L.append("reference: TIC-CKPT cut downtime by 50-90% (90% at 512x512); checkpoint time ~20% longer.")
    for res in big:
        m = res["summary"]
        ok1 = m["less_downtime_all_stops"] >= REFERENCE["target_less_downtime_at_1gib"]
        ok2 = m["conc_frozen_ms_per_gib"] <= REFERENCE["target_frozen_ms_per_gib"]
        L.append(f"target at 1 GiB ({res['case']['name']}): >= 98% less downtime: "
                 f"{100 * m['less_downtime_all_stops']:.1f}% ({'met' if ok1 else 'missed'}); "
                 f"frozen <= 20 ms/GiB: {m['conc_frozen_ms_per_gib']:.1f} ({'met' if ok2 else 'missed'})")
    L.append("frozen = frozen_us (the freeze); +stop2 = the concurrent dump's other brief stop: before the freeze "
             "to give the process its userfaultfd (method uffd), or after the copy to reap the snapshot (fork); "
             "+pause = --cow-buffer pauses of the fork method (timed by the watcher below); 'less downtime' = "
             "1 - concurrent/stop-the-world, frozen only / all stops (frozen + stop2 + pause).")
    L.append("observed stopped: time the workload was seen in a ptrace stop during the dump (its state sampled "
             "every 0.5 ms). It catches a --cow-buffer pause, which stasis does not time; it is below frozen_us "
             "when the freeze runs syscalls inside the process (then its state reads as running).")
    L.append("cow peak reported = the JSON's cow_peak_bytes (the snapshots' private memory, sampled by stasis "
             "after a 32 MiB piece); snapshot private = peak private memory of the snapshot process (sampled every "
             "100 ms): the originals of pages written since the snapshot, plus the copies the dumper's own reads "
             "make (see README).")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256,512,1024", help="matrix sizes N (comma-separated)")
    ap.add_argument("--ws-mib", type=int, default=1024,
                    help="working set of the large case, MiB, with the largest N (0: no large case)")
    ap.add_argument("--ws-pass-s", type=float, default=8.0,
                    help="seconds per pass of the large case's writes over its working set (0: held, not written)")
    ap.add_argument("--thp", action="store_true", help="also run the large case with transparent huge pages")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gap-s", type=float, default=0.5, help="pause after each dump")
    ap.add_argument("--cow-buffer", default=None, help="--cow-buffer for the concurrent dumps (default: stasis's)")
    ap.add_argument("--cow-method", default=None, choices=["auto", "uffd", "fork"],
                    help="--cow-method for the concurrent dumps (default: stasis's, auto)")
    ap.add_argument("--no-verify", dest="verify", action="store_false",
                    help="skip restoring the last concurrent image of each case")
    ap.add_argument("--verify-run-s", type=float, default=1.0)
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECS",
                    help="before each dump, wait up to SECS for a second in which the rest of the machine is idle")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json-out", default=os.path.join(cc.RESULTS, "concurrent_downtime.json"))
    ap.add_argument("--stasis", default=cc.DEFAULT_STASIS)
    args = ap.parse_args()
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        ap.error("--sizes: comma-separated integers")
    if not sizes or min(sizes) < 16 or args.reps <= 0 or args.ws_mib < 0:
        ap.error("--sizes >= 16, --reps > 0, --ws-mib >= 0")
    if not cc.check_root_and_binary("concurrent_downtime", args.stasis):
        return 1
    cc.set_subreaper()

    t_start = time.monotonic()
    exes = cc.compile_workloads(["conc_matmul"])
    workdir, fstype = cc.make_workdir(args.dir, "conc-downtime")
    cases = [{"name": f"N={n}", "tag": f"n{n}", "n": n, "ws_mib": 0, "thp": False} for n in sizes]
    if args.ws_mib:
        n = max(sizes)
        cases.append({"name": f"N={n} + {args.ws_mib} MiB", "tag": f"n{n}-ws", "n": n, "ws_mib": args.ws_mib,
                      "thp": False})
        if args.thp:
            cases.append({"name": f"N={n} + {args.ws_mib} MiB THP", "tag": f"n{n}-ws-thp", "n": n,
                          "ws_mib": args.ws_mib, "thp": True})
    result = cc.result_header("concurrent_downtime", args, args.stasis, workdir, fstype, REFERENCE)
    b = {"exes": exes, "workdir": workdir, "stasis": args.stasis, "live": [],
         "dumper": cc.Dumper(args.stasis, workdir, args.cow_method)}
    results = []
    try:
        for case in cases:
            log(f"case {case['name']}: {args.reps} reps (+1 warm-up) of stop-the-world and concurrent")
            res = run_case(b, case, args)
            res["summary"] = summarize(res)
            results.append(res)
    except BenchError as e:
        for wl in b["live"]:
            wl.kill()
        log(f"concurrent_downtime: FAILED: {e}")
        log(f"concurrent_downtime: work dir left for inspection: {workdir}")
        return 1
    except BaseException:
        for wl in b["live"]:
            wl.kill()
        raise
    txt = table(results, args, workdir, fstype)
    result["cases"] = results
    cc.reap_orphans()
    return cc.finish("concurrent_downtime", args, result, txt, t_start, workdir)


if __name__ == "__main__":
    sys.exit(main())
