#!/usr/bin/env python3
"""bench/collect: the cost of collecting the dirty set of SIZE MiB when PCT% of
its pages were written: PAGEMAP_SCAN (PAGE_IS_WRITTEN over a WP_ASYNC
userfaultfd registration, what Stasis's uffd tracker does) against reading
/proc/PID/pagemap (8 bytes a page) and scanning the entries (the classic
way, LDT's baseline), both measured in the same process on the same memory.

    sudo python3 bench/collect.py [--size-mib 1024] [--pcts 1,10,50,100]
                                  [--reps 10] [--runs 3] [--vec-len 1024]
                                  [--json-out FILE] [--wait-quiet SECS]

Stasis itself is not run: the C program (workloads/collect.c) does on its own
memory exactly what the tracker does in a target (see bench/README.md,
"collect").

Exit status: 1 if the program failed or the two methods disagreed on the
written pages, else 0. No time is pass/fail.
"""

import argparse
import datetime
import os
import shlex
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True
import track_common as tc  # noqa: E402
from track_common import BenchError, log, stats  # noqa: E402

REFERENCE = {
    "ldt_collection_speedup": "LDT's dirty-list interface 7x-15x faster than reading pagemap, 1 GB area, "
                              "0-100% of pages dirtied (LDT Fig. 11)",
    "target_speedup_min": 20.0,
}
PATTERNS = ("scattered", "contiguous")


def parse(out):
    """The program's lines -> {(pct, pattern): {kind: [records]}}."""
    res = {}
    for line in out.splitlines():
        f = line.split()
        if not f or f[0] in ("PASS",):
            continue
        if f[0].startswith("FAIL"):
            raise BenchError(line)
        kind, pct, pat = f[0], int(f[1]), f[2]
        nums = [int(x) for x in f[3:]]
        d = res.setdefault((pct, pat), {})
        if kind == "arm":
            rec = {"ns": nums[0]}
        elif kind == "write":
            rec = {"pages": nums[0], "ns": nums[1]}
        elif kind in ("scan", "rearm"):
            rec = {"pages": nums[0], "regions": nums[1], "calls": nums[2], "ns": nums[3]}
        elif kind == "pagemap":
            rec = {"pages": nums[0], "regions": nums[1], "ns": nums[2], "read_ns": nums[3]}
        else:
            raise BenchError(f"collect: unexpected line {line!r}")
        d.setdefault(kind, []).append(rec)
    return res


def summarize(runs, pcts):
    """Merges the runs; medians per (pct, pattern)."""
    out = {}
    for pct in pcts:
        for pat in PATTERNS:
            merged = {}
            for r in runs:
                for kind, recs in r.get((pct, pat), {}).items():
                    merged.setdefault(kind, []).extend(recs)
            if not merged.get("scan"):
                continue
            scan = stats([x["ns"] / 1e6 for x in merged["scan"]])
            pm = stats([x["ns"] / 1e6 for x in merged["pagemap"]])
            pm_read = stats([x["read_ns"] / 1e6 for x in merged["pagemap"]])
            rearm = stats([x["ns"] / 1e6 for x in merged["rearm"]])
            write = merged["write"]
            pages = write[0]["pages"]
            s = {
                "pages_written": pages,
                "ranges": merged["scan"][0]["regions"],
                "ioctl_calls": merged["scan"][0]["calls"],
                "pagemap_scan_ms": scan,
                "pagemap_scan_rearm_ms": rearm,
                "pagemap_read_and_scan_ms": pm,
                "pagemap_read_only_ms": pm_read,
                "speedup": pm["median"] / scan["median"],
                "speedup_min_max": [pm["min"] / scan["max"], pm["max"] / scan["min"]],
                "speedup_rearm": pm["median"] / rearm["median"],
                "arm_ms": stats([x["ns"] / 1e6 for x in merged["arm"]]),
                "first_write_ns_per_page": (tc.med([x["ns"] / x["pages"] for x in write])
                                            if pages else None),
            }
            out[f"{pct}/{pat}"] = s
    return out


def table(summary, pcts, size_mib, reps, runs, vec_len):
    npages = (size_mib << 20) // 4096
    lines = [f"dirty-set collection, {size_mib} MiB ({npages} pages, all present), PCT% written: "
             f"PAGEMAP_SCAN vs pread(/proc/self/pagemap) + scan; {runs} runs x {reps} reps, median [min-max] ms",
             ""]
    lines.append(f"{'written':>8} {'pattern':10} {'pages':>7} {'ranges':>7}  {'PAGEMAP_SCAN':>19}  "
                 f"{'pagemap read+scan':>22}  {'speedup':>7}  {'scan+re-arm':>11} {'speedup':>8}  "
                 f"{'1st write':>9}")
    for pct in pcts:
        for pat in PATTERNS:
            s = summary.get(f"{pct}/{pat}")
            if not s:
                continue
            sc, pm, ra = s["pagemap_scan_ms"], s["pagemap_read_and_scan_ms"], s["pagemap_scan_rearm_ms"]
            fw = f"{s['first_write_ns_per_page']:.0f} ns" if s["first_write_ns_per_page"] else "-"
            lines.append(f"{pct:>7}% {pat:10} {s['pages_written']:>7} {s['ranges']:>7}  "
                         f"{sc['median']:6.3f} [{sc['min']:.3f}-{sc['max']:.3f}]  "
                         f"{pm['median']:7.3f} [{pm['min']:.3f}-{pm['max']:.3f}]  "
                         f"{s['speedup']:6.1f}x  {ra['median']:11.3f} {s['speedup_rearm']:7.1f}x  {fw:>9}")
    lines.append("")
    lines.append(f"PAGEMAP_SCAN: category PAGE_IS_WRITTEN, vector of {vec_len} regions, looped until walk_end == end "
                 "(as stasis's tracker). pagemap: one pread of 8 bytes/page + a loop that finds present, not "
                 "uffd-wp pages (the pread alone: "
                 + ", ".join(f"{summary[k]['pagemap_read_only_ms']['median']:.2f}" for k in
                             (f"{p}/scattered" for p in pcts) if k in summary) + " ms).")
    lines.append("speedup: pagemap read+scan / PAGEMAP_SCAN (medians). scan+re-arm: one PAGEMAP_SCAN with "
                 "PM_SCAN_WP_MATCHING that also write-protects again. 1st write: cost of the first write to a "
                 "protected page (WP_ASYNC fault), per page.")
    lines.append("target (issue): PAGEMAP_SCAN >= 20x faster; LDT paper: its interface 7x-15x faster than pagemap.")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--pcts", default="1,10,50,100", help="percentages written, comma-separated (0-100)")
    ap.add_argument("--reps", type=int, default=10, help="timed repetitions of each method per run")
    ap.add_argument("--runs", type=int, default=3, help="fresh processes (default 3)")
    ap.add_argument("--vec-len", type=int, default=1024, help="page_region entries per PAGEMAP_SCAN call "
                                                              "(stasis uses 1024)")
    ap.add_argument("--json-out", default=os.path.join(tc.RESULTS, "collect.json"))
    tc.add_quiet_option(ap)
    args = ap.parse_args()
    try:
        pcts = [int(x) for x in args.pcts.split(",") if x]
    except ValueError:
        ap.error("--pcts: comma-separated integers")
    if not pcts or any(p < 0 or p > 100 for p in pcts):
        ap.error("--pcts: values 0-100")
    if min(args.size_mib, args.reps, args.runs, args.vec_len) <= 0:
        ap.error("--size-mib, --reps, --runs, --vec-len must be positive")
    if os.geteuid() != 0:
        log("collect: needs root (userfaultfd with vm.unprivileged_userfaultfd=0, PFNs in pagemap)")
        return 1

    t0 = time.monotonic()
    try:
        exe = tc.dr.compile_workloads(("collect",))["collect"]
    except BenchError as e:
        log(f"collect: FAILED: {e}")
        return 1
    result = {
        "benchmark": "collect",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable] + sys.argv),
        "params": vars(args),
        "machine": tc.dr.machine_info(),
        "bench_checkout": tc.dr.git_info(),
        "reference": REFERENCE,
    }
    argv = [exe, str(args.size_mib), str(args.reps), str(args.vec_len)] + [str(p) for p in pcts]
    result["workload_argv"] = argv
    runs, failure, raw = [], None, []
    for i in range(args.runs):
        quiet = tc.wait_quiet(args.wait_quiet)
        busy0 = tc.dr.cpu_busy_s()
        p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        busy = tc.dr.cpu_busy_s() - busy0
        raw.append({"stdout": p.stdout.splitlines(), "stderr": p.stderr, "exit": p.returncode,
                    "machine_busy_cpu_s": busy, "quiet_wait_s": quiet})
        try:
            if p.returncode != 0 or not p.stdout.strip().endswith("PASS"):
                raise BenchError(f"`{shlex.join(argv)}` failed (exit {p.returncode}):\n"
                                 f"{p.stdout[-2000:]}{p.stderr}")
            runs.append(parse(p.stdout))
        except BenchError as e:
            failure = str(e)
            log(f"collect: FAILED: {e}")
            break
        log(f"run {i + 1}/{args.runs}: ok")
    summary = summarize(runs, pcts) if runs else {}
    txt = table(summary, pcts, args.size_mib, args.reps, len(runs), args.vec_len)
    result.update({"summary": summary, "raw": raw, "failure": failure, "runtime_s": time.monotonic() - t0,
                   "table": txt.splitlines()})
    tc.write_json(args.json_out, result)
    print(txt)
    print(f"\n(json: {args.json_out}; runtime {result['runtime_s']:.0f} s)")
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
