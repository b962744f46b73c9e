#!/usr/bin/env python3
"""bench/ldt: the LDT first-write micro-benchmark. A process writes 1 byte to
every 4 KiB page of SIZE MiB of present private anonymous memory, timing the
pass itself, with and without dirty tracking armed. Every tracked time is a
ratio of the untracked time measured in the same run.

    sudo python3 bench/ldt.py [--sizes 128,512,1024,2048] [--reps 3]
                              [--variants untracked,uffd,hash,mprotect]
                              [--no-check] [--dir DIR] [--json-out FILE]
                              [--stasis PATH] [--wait-quiet SECS]

Variants (a fresh `ldt_write` process each; see bench/README.md, "ldt"):
  untracked  `stasis dump --leave-running` without --track, then the pass (the
             baseline); the same process also times a pass before that dump
  uffd       `stasis dump --leave-running --track uffd`, then the pass
  hash       `stasis dump --leave-running --track hash`, then the pass
  mprotect   `stasis dump --leave-running` without --track, then the process
             arms its own mprotect(PROT_READ) + SIGSEGV tracker (not timed)
             and does the pass

Exit status: 1 if anything broke (a command failed, a workload found its
memory or its own tracker wrong, the uffd area was not registered, an
incremental dump after the pass missed pages), else 0. No time is pass/fail.
"""

import argparse
import os
import shutil
import signal
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True
import track_common as tc  # noqa: E402
from track_common import BenchError, log, stats  # noqa: E402

VARIANTS = ("untracked", "uffd", "uffd-wp", "soft-dirty", "hash", "mprotect")
LABELS = {
    "untracked": "untracked (after plain dump)",
    "nodump": "untracked, no dump at all",
    "uffd": "uffd WP_ASYNC (--track uffd)",
    "uffd-wp": "uffd WP, kept (run --cow-method uffd)",
    "soft-dirty": "soft-dirty (--track soft-dirty)",
    "hash": "hash (--track hash)",
    "mprotect": "mprotect + SIGSEGV, in-process",
}
REFERENCE = {
    "ldt_softdirty_slowdown": "10x at 128 MB to more than 40x at 2 GB (LDT Fig. 3, soft-dirty vs no tracking, "
                              "1 byte per page)",
    "ldt_vs_softdirty": "LDT 2x faster than soft-dirty under write-heavy load, 3x at 4 GB",
    "acck_mprotect_fault_us": "~100 us per 4 KiB page for mprotect + SIGSEGV monitoring (ACCK)",
    "target_uffd_max_ratio": 15.0,
    "target_hash_max_ratio": 1.05,
}


class Run:
    def __init__(self, args, exe, workdir):
        self.args = args
        self.exe = exe
        self.workdir = workdir
        self.dumper = tc.Dumper(args.stasis, workdir)
        self.live = None

    def round(self, proc, ctl, k, timeout, pid=None):
        """Round k of the process `pid` (default: `proc`'s; `proc` is what
        must not exit meanwhile)."""
        pid = pid or proc.pid
        q = tc.wait_quiet(self.args.wait_quiet)
        cpu0, busy0 = tc.dr.proc_cpu_s(pid), tc.dr.cpu_busy_s()
        os.kill(pid, signal.SIGUSR1)
        path = os.path.join(ctl, f"round.{k}")
        tc.wait_file(path, proc, timeout, f"ldt_write round {k}", os.path.join(ctl, "log"))
        r = tc.read_kv(path)
        r["quiet_wait_s"] = q
        # CPU the rest of the machine used while the round ran (this script's
        # polling included, about 1 ms per 100 ms).
        r["other_cpu_s"] = max(0.0, tc.dr.cpu_busy_s() - busy0 - (tc.dr.proc_cpu_s(pid) - cpu0))
        return r

    def variant_kept_wp(self, size_mib, tag, check):
        """The process under `stasis run --concurrent --cow-method uffd`:
        a checkpoint asked for through its request socket arms the
        write-protection that stays as the dirty tracking (synchronous
        faults through stasis run's handler, which lifts a huge page whole),
        then the pass."""
        ctl = os.path.join(self.workdir, tag)
        os.makedirs(ctl)
        logf = os.path.join(ctl, "log")
        argv = [self.exe, ctl, str(size_mib), "plain"] + (["huge"] if self.args.thp else [])
        img = os.path.join(self.workdir, f"img-{tag}")
        sup = tc.RunSupervisor(self.args.stasis, argv, img, logf, ctl, [])
        self.live = sup.proc
        pid = sup.event("started", 60)["pid"]
        tc.wait_file(os.path.join(ctl, "pid"), sup.proc, 300, "ldt_write", logf)
        rec = {"variant": "uffd-wp", "size_mib": size_mib, "pid": pid, "workload_argv": argv,
               "run_argv": sup.argv, "syscall_ns": tc.read_kv(os.path.join(ctl, "syscall"))["syscall_ns"]}
        npages = (size_mib << 20) // 4096
        d = sup.checkpoint(pid)
        rec["dump"] = {key: d.get(key) for key in ("checkpoint", "pages", "bytes", "frozen_us", "total_us",
                                                    "parent", "track", "armed", "note", "wall_s")}
        if self.args.thp:
            rec["anon_huge_kib"] = anon_huge_kib(pid)
        rec["pass"] = self.round(sup.proc, ctl, 1, 60 + npages * 20e-6, pid=pid)
        if self.args.thp:
            rec["anon_huge_kib_after_pass"] = anon_huge_kib(pid)
        if check:
            d2 = sup.checkpoint(pid)
            rec["incremental_after_pass"] = {key: d2.get(key) for key in (
                "checkpoint", "pages", "bytes", "frozen_us", "total_us", "parent", "track", "note")}
            if d2.get("parent") is None or d2["pages"] < npages:
                raise BenchError(f"incremental checkpoint after a pass over {npages} pages saved {d2['pages']} "
                                 f"pages (parent {d2.get('parent')}) under `{' '.join(sup.argv)}`")
        os.kill(pid, signal.SIGTERM)
        code = sup.finish()
        self.live = None
        out = open(logf).read().strip()
        if code != 0 or not out.endswith("PASS"):
            raise BenchError(f"ldt_write (uffd-wp, {size_mib} MiB) failed its check (exit {code}): {out}")
        rec["verified"] = "PASS"
        shutil.rmtree(img, ignore_errors=True)
        shutil.rmtree(ctl, ignore_errors=True)
        return rec

    def variant(self, v, size_mib, tag, check):
        """One fresh process, one variant. Returns the record."""
        if v == "uffd-wp":
            return self.variant_kept_wp(size_mib, tag, check)
        ctl = os.path.join(self.workdir, tag)
        os.makedirs(ctl)
        logf = os.path.join(ctl, "log")
        mode = "mprotect" if v == "mprotect" else "plain"
        argv = [self.exe, ctl, str(size_mib), mode] + (["huge"] if self.args.thp else [])
        proc = tc.start_workload(argv, logf, ctl)
        self.live = proc
        tc.wait_file(os.path.join(ctl, "pid"), proc, 300, "ldt_write", logf)
        rec = {"variant": v, "size_mib": size_mib, "pid": proc.pid, "workload_argv": argv,
               "syscall_ns": tc.read_kv(os.path.join(ctl, "syscall"))["syscall_ns"]}
        npages = (size_mib << 20) // 4096
        # A pass of 4 GiB with mprotect takes seconds: allow 20 us a page.
        timeout = 60 + npages * 20e-6
        k = 0
        if v == "untracked":
            k += 1
            rec["nodump"] = self.round(proc, ctl, k, timeout)
        img = os.path.join(self.workdir, f"img-{tag}")
        track = v if v in ("uffd", "soft-dirty", "hash") else None
        d = self.dumper.dump(proc.pid, img, leave_running=True, track=track)
        rec["dump"] = {key: d.get(key) for key in ("checkpoint", "pages", "bytes", "frozen_us", "total_us",
                                                    "parent", "track", "armed", "note", "wall_s", "argv")}
        if track and d.get("armed") != track:
            raise BenchError(f"`{' '.join(d['argv'])}` did not arm {track}: {d}")
        start, end, flags = tc.largest_anon_area(proc.pid)
        rec["area"] = {"start": hex(start), "mib": (end - start) >> 20, "vmflags": flags}
        if (end - start) >> 20 < size_mib:
            raise BenchError(f"pid {proc.pid}: largest anonymous area is {(end - start) >> 20} MiB, want {size_mib}")
        if v == "uffd" and "uw" not in flags:
            raise BenchError(f"after `{' '.join(d['argv'])}` the {size_mib} MiB area is not registered for "
                             f"uffd write-protect (VmFlags {' '.join(flags)})")
        if self.args.thp:
            rec["anon_huge_kib"] = anon_huge_kib(proc.pid)
            if rec["anon_huge_kib"] < (size_mib << 10) // 2:
                raise BenchError(f"--thp: only {rec['anon_huge_kib']} KiB of the {size_mib} MiB area are in "
                                 f"transparent huge pages (is THP enabled? /sys/kernel/mm/transparent_hugepage)")
        k += 1
        r = self.round(proc, ctl, k, timeout)
        rec["pass"] = r
        if self.args.thp:
            # Whether the pass split the huge pages (uffd WP_ASYNC does: the
            # kernel splits a write-protected huge page at its first write
            # and then faults per 4 KiB page).
            rec["anon_huge_kib_after_pass"] = anon_huge_kib(proc.pid)
        if v == "mprotect" and r["faults"] != npages:
            raise BenchError(f"mprotect tracker took {r['faults']} faults for {npages} pages")
        if check and track:
            # The tracker saw the pass: the incremental dump after it must save
            # every page of the buffer (and its parent is the first dump).
            d2 = self.dumper.dump(proc.pid, img, leave_running=True)
            rec["incremental_after_pass"] = {key: d2.get(key) for key in (
                "checkpoint", "pages", "bytes", "frozen_us", "total_us", "parent", "track", "armed", "note",
                "wall_s", "argv")}
            if d2.get("parent") is None or d2["pages"] < npages:
                raise BenchError(f"incremental dump after a pass over {npages} pages saved {d2['pages']} pages "
                                 f"(parent {d2.get('parent')}): `{' '.join(d2['argv'])}`")
        code = tc.stop_workload(proc)
        self.live = None
        out = open(logf).read().strip()
        if code != 0 or not out.endswith("PASS"):
            raise BenchError(f"ldt_write ({v}, {size_mib} MiB) failed its check (exit {code}): {out}")
        rec["verified"] = "PASS"
        shutil.rmtree(img, ignore_errors=True)
        shutil.rmtree(ctl, ignore_errors=True)
        return rec


def summarize(recs_by, sizes, variants):
    """recs_by[(size, variant)] = [records]; returns per-size figures."""
    out = {}
    for size in sizes:
        base = recs_by.get((size, "untracked"), [])
        if not base:
            continue
        npages = (size << 20) // 4096
        s = {"pages": npages}
        base_first = [r["pass"]["first_ns"] for r in base]
        bm = tc.med(base_first)
        rows = {}
        series = [("untracked", [r["pass"] for r in base])]
        series.append(("nodump", [r["nodump"] for r in base]))
        series += [(v, [r["pass"] for r in recs_by.get((size, v), [])]) for v in variants if v != "untracked"]
        for v, passes in series:
            if not passes:
                continue
            first = [p["first_ns"] for p in passes]
            second = [p["second_ns"] for p in passes]
            row = {
                "first_ms": stats([x / 1e6 for x in first]),
                "second_ms": stats([x / 1e6 for x in second]),
                "first_ns_per_page": tc.med(first) / npages,
                "ratio_to_untracked": tc.med(first) / bm,
                # paired with the untracked run of the same rep
                "ratio_per_rep": [a / b for a, b in zip(first, base_first)],
                "second_ratio_to_untracked": tc.med(second) / tc.med([p["second_ns"] for p in
                                                                      (r["pass"] for r in base)]),
                # first pass / second pass of the same process: a baseline
                # that shares the process's memory and its backing by the host
                "first_to_own_second": tc.med([a / b for a, b in zip(first, second)]),
            }
            if v == "mprotect":
                row["arm_ms"] = stats([p["arm_ns"] / 1e6 for p in passes])
            rows[v] = row
        s["rows"] = rows
        dumps = {}
        for v in variants:
            recs = recs_by.get((size, v), [])
            if recs:
                dumps[v] = {"total_ms": stats([r["dump"]["total_us"] / 1e3 for r in recs]),
                            "frozen_ms": stats([r["dump"]["frozen_us"] / 1e3 for r in recs])}
        s["dumps"] = dumps
        s["syscall_ns"] = tc.med([r["syscall_ns"] for v in variants for r in recs_by.get((size, v), [])])
        out[size] = s
    return out


def table(summary, sizes, variants, reps, thp=False):
    lines = [f"LDT first-write micro-benchmark: 1 byte to every 4 KiB page of SIZE MiB of present private "
             f"anonymous memory{' in transparent huge pages (2 MiB)' if thp else ''}, timed inside the process "
             f"(CLOCK_MONOTONIC); {reps} reps, median [min-max]",
             ""]
    lines.append(f"{'size':>8}  {'variant':31} {'first pass ms':>27} {'ns/page':>8} {'vs untracked':>13} "
                 f"{'[per-rep min-max]':>17}  {'vs own 2nd pass':>15}  {'2nd pass vs untr.':>17}")
    for size in sizes:
        if size not in summary:
            continue
        s = summary[size]
        first = True
        order = ["untracked", "nodump"] + [v for v in variants if v != "untracked"]
        for v in order:
            row = s["rows"].get(v)
            if row is None:
                continue
            f = row["first_ms"]
            rr = row["ratio_per_rep"]
            extra = f"[{min(rr):.2f}-{max(rr):.2f}]" if v != "untracked" else ""
            fcol = f"{f['median']:.2f} [{f['min']:.2f}-{f['max']:.2f}]"
            lines.append(f"{(str(size) + ' MiB') if first else '':>8}  {LABELS[v]:31} {fcol:>27} "
                         f"{row['first_ns_per_page']:8.0f} {row['ratio_to_untracked']:12.2f}x {extra:>17}  "
                         f"{row['first_to_own_second']:14.2f}x  {row['second_ratio_to_untracked']:16.2f}x")
            first = False
        if "mprotect" in s["rows"]:
            a = s["rows"]["mprotect"]["arm_ms"]
            lines.append(f"{'':8}  (mprotect arming, not in the pass: {a['median']:.2f} ms)")
    lines.append("")
    lines.append("stasis dump --leave-running before the pass (median ms total/frozen): " + "; ".join(
        f"{size} MiB " + ", ".join(f"{v} {d['total_ms']['median']:.0f}/{d['frozen_ms']['median']:.0f}"
                                   for v, d in summary[size]["dumps"].items())
        for size in sizes if size in summary))
    sc = [summary[size]["syscall_ns"] for size in sizes if size in summary]
    if sc:
        lines.append(f"one getppid() system call (kernel entry + exit) costs {tc.med(sc):.0f} ns here (median over "
                     f"the processes): a floor for any tracker that takes a fault per page")
    lines.append("targets (issue): uffd <= 15x untracked, hash <= 1.05x. LDT paper: soft-dirty 10x (128 MB) to "
                 ">40x (2 GB) over no tracking.")
    lines.append("vs untracked: median first-pass time / median untracked first-pass time of the same size; "
                 "per-rep: paired with the untracked process of the same rep. vs own 2nd pass: median of first pass / "
                 "second pass (the same loop again, right after, every page now writable) in the same process. "
                 "2nd pass vs untr.: second passes compared.")
    return "\n".join(lines)


def anon_huge_kib(pid):
    """AnonHugePages of a process, KiB (its memory in transparent huge pages)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="128,512,1024,2048",
                    help="MiB, comma-separated (default 128,512,1024,2048; 4096 takes about 3 more minutes)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", default="untracked,uffd,hash,mprotect",
                    help=f"a subset of {','.join(VARIANTS)} (default: all but soft-dirty)")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the incremental dump after the first rep's tracked passes (it checks that the "
                         "tracker saw every page)")
    ap.add_argument("--thp", action="store_true",
                    help="the buffer in transparent huge pages (MADV_HUGEPAGE, 2 MiB-aligned) instead of 4 KiB "
                         "pages; the per-page figures stay per 4 KiB of data")
    ap.add_argument("--dir", default=None, help="work dir for images (default: a fresh dir under /dev/shm)")
    ap.add_argument("--json-out", default=os.path.join(tc.RESULTS, "ldt.json"))
    ap.add_argument("--stasis", default=tc.DEFAULT_STASIS)
    tc.add_quiet_option(ap)
    args = ap.parse_args()
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x]
    except ValueError:
        ap.error("--sizes: comma-separated MiB")
    variants = [v for v in args.variants.split(",") if v]
    if any(v not in VARIANTS for v in variants) or "untracked" not in variants:
        ap.error(f"--variants: a subset of {','.join(VARIANTS)} that includes untracked (the baseline)")
    if args.reps <= 0 or not sizes or min(sizes) <= 0:
        ap.error("--reps and --sizes must be positive")
    args.stasis = os.path.abspath(args.stasis)
    if not tc.check_root_and_binary("ldt", args.stasis):
        return 1

    t0 = time.monotonic()
    try:
        exe = tc.dr.compile_workloads(("ldt_write",))["ldt_write"]
    except BenchError as e:
        log(f"ldt: FAILED: {e}")
        return 1
    workdir, fstype = tc.make_workdir(args.dir, "ldt")
    result = tc.result_header("ldt", args, args.stasis, workdir, fstype, REFERENCE)
    run = Run(args, exe, workdir)
    recs_by = {}
    records = []
    failure = None
    try:
        log(f"work dir {workdir} ({fstype}); sizes {sizes} MiB, {args.reps} reps, variants {variants}")
        for rep in range(args.reps):
            for size in sizes:
                order = variants[rep % len(variants):] + variants[:rep % len(variants)]
                msg = []
                for v in order:
                    busy0 = tc.dr.cpu_busy_s()
                    rec = run.variant(v, size, f"r{rep}-{size}-{v}", check=(rep == 0 and not args.no_check))
                    rec["rep"] = rep
                    rec["machine_busy_cpu_s"] = tc.dr.cpu_busy_s() - busy0
                    records.append(rec)
                    recs_by.setdefault((size, v), []).append(rec)
                    msg.append(f"{v} {rec['pass']['first_ns'] / 1e6:.2f} ms")
                log(f"rep {rep + 1}/{args.reps}, {size} MiB: first pass " + ", ".join(msg))
    except BenchError as e:
        failure = str(e)
        log(f"ldt: FAILED: {e}")
    except BaseException:
        tc.kill_quietly(run.live)
        raise
    tc.kill_quietly(run.live)

    summary = summarize(recs_by, sizes, variants)
    txt = table(summary, sizes, variants, args.reps, args.thp)
    result.update({"records": records, "summary": {str(k): v for k, v in summary.items()},
                   "failure": failure})
    return tc.finish("ldt", args, result, txt, t0, workdir, failure)


if __name__ == "__main__":
    sys.exit(main())
