#!/usr/bin/env python3
"""bench/vs_criu: Stasis and CRIU side by side on the same workloads, images
on tmpfs, against the machine's own memory<->tmpfs copy speed measured in the
same run (issue 18, section 1).

    sudo python3 bench/vs_criu.py --criu PATH [--runs 5] [--stasis PATH]
                                  [--size-mib 1024] [--only KEY,...]
                                  [--dir DIR] [--json] [--json-out FILE]

Workloads (KEY: what):
  single   threads_fill 1024 MiB, 1 thread: 1 process of 1 GiB written
           anonymous memory
  threads  threads_fill 1024 MiB, 16 threads: 1 process, 16 threads of 64 MiB
  tree     tree_fill 512 MiB shared, 8 processes (+ 1 MiB private each)
  python   workloads/py_heap.py 1024: a Python heap of 1 GiB (64 KiB bytes
           objects on the malloc heap + a dict of small objects)

Each run (--runs of them) measures the baseline (workloads/tmpfs_write.c:
1 GiB memory -> tmpfs, and tmpfs -> freshly mapped memory), then every
workload under both engines, one after the other, the engine that goes first
alternating from run to run (and the workload order rotating). One cycle:
start the workload, dump it (the engine kills it), reap it, restore it
detached (the command returns once the restored tree runs again), check the
tree's shape, SIGTERM it: the workload checks all its memory and prints PASS.

  stasis: stasis dump -t PID -D IMG --json
          stasis restore -D IMG --detach --json --pidfile F
  criu:   criu dump -t PID -D IMG -o dump.log --shell-job
          criu restore -D IMG -o restore.log --shell-job -d --pidfile F
(--shell-job: the workload is a child of this script, in its session, as a
process started from a shell is.)

Times are the wall time of each command (what a user waits for); for Stasis
the JSON also gives total_us and the frozen stages. Ratios are of medians:
"vs CRIU" = CRIU time / Stasis time (> 1: Stasis faster); "vs copy" = the
time the baseline takes to copy the bytes Stasis saved / Stasis time (1.0 =
as fast as a plain copy). Targets (issue 18): >= 1.5x CRIU, >= 0.9x copy.

Needs root, a release build (cargo build --release -p stasis) and a CRIU 4.x
binary. Exit status 0 if every cycle worked and verified, 1 otherwise; there
is no pass/fail on the times.
"""

import argparse
import ctypes
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True  # no bench/__pycache__
import dump_restore as dr  # noqa: E402  (run_rusage, parse_json_line, baseline, ...)
import tree_threads as tt  # noqa: E402  (the workloads, start, check_shape, wait4_pid)
from dump_restore import BenchError, log  # noqa: E402

ENGINES = ("stasis", "criu")
TARGET_VS_CRIU = 1.5
TARGET_VS_COPY = 0.9


def workloads(args, exes):
    """tree_threads' three workloads, and the Python heap."""
    ns = argparse.Namespace(size_mib=args.size_mib, threads=16, shared_mib=args.size_mib // 2, nproc=8,
                            private_mib=1)
    wl = tt.workloads(ns, exes)
    names = {"single": "1 process, 1 GiB", "threads": "16 threads x 64 MiB",
             "tree": "8 processes sharing 512 MiB"}
    for w in wl:
        w["label"] = names[w["key"]] if args.size_mib == 1024 else w["label"]
    py = os.path.join(BENCH, "workloads", "py_heap.py")
    wl.append({"key": "python", "label": "Python heap, 1 GiB" if args.size_mib == 1024 else "(d) Python heap",
               "tag": "d", "what": f"py_heap.py {args.size_mib} MiB: 64 KiB bytes objects + a small-object dict",
               "argv": lambda pidfile: [sys.executable, "-S", py, pidfile, str(args.size_mib)],
               "mem_bytes": args.size_mib << 20, "processes": 1, "threads": 1, "shared_bytes": 0})
    return wl


def engine_argv(engine, binary, pid, img, pidfile):
    if engine == "stasis":
        return ([binary, "dump", "-t", str(pid), "-D", img, "--json"],
                [binary, "restore", "-D", img, "--detach", "--json", "--pidfile", pidfile])
    return ([binary, "dump", "-t", str(pid), "-D", img, "-o", "dump.log", "--shell-job"],
            [binary, "restore", "-D", img, "-o", "restore.log", "--shell-job", "-d", "--pidfile", pidfile])


def stage_durations(d):
    """Stasis's frozen stages as durations (the JSON gives their end times)."""
    out, prev = {}, 0
    for m in d.get("frozen_stages", []):
        out[m["stage"]] = (m["end_us"] - prev) / 1e6
        prev = m["end_us"]
    return out


class Bench(tt.Bench):
    """tt.Bench starts a workload and checks its shape; dr.Bench measures the
    baseline. This adds a cycle for either engine."""

    def __init__(self, args, exes, workdir, binaries):
        super().__init__(args, exes, workdir)
        self.binaries = binaries

    def run(self, argv, tag, what):
        rc, wall, usage, stdout, stderr = dr.run_rusage(
            argv, os.path.join(self.workdir, f"{tag}.out"), os.path.join(self.workdir, f"{tag}.err"))
        if rc != 0:
            raise BenchError(f"{what} failed (exit {rc}): {shlex.join(argv)}\n{stderr}{stdout}")
        return wall, usage, stdout

    def cycle(self, w, tag, engine):
        img = os.path.join(self.workdir, f"img-{tag}")
        shutil.rmtree(img, ignore_errors=True)
        os.makedirs(img)
        proc, logf, children, argv = self.start(w, tag)
        pid = proc.pid
        self.check_shape(w, pid, children, "before the dump")
        pidfile = os.path.join(self.workdir, f"{tag}.restored.pid")
        if os.path.exists(pidfile):
            os.unlink(pidfile)
        dump_argv, restore_argv = engine_argv(engine, self.binaries[engine], pid, img, pidfile)
        rec = {"workload": w["key"], "engine": engine, "pid": pid, "dump_argv": dump_argv,
               "restore_argv": restore_argv}

        wall, usage, stdout = self.run(dump_argv, f"{tag}.dump", f"{engine} dump")
        rec["dump"] = {"wall_s": wall, **usage}
        if engine == "stasis":
            d = dr.parse_json_line(stdout, "stasis dump")
            rec["dump"].update(total_s=d["total_us"] / 1e6, frozen_s=d["frozen_us"] / 1e6, bytes=d["bytes"],
                               stages_s=stage_durations(d))
        status, _cpu = tt.wait4_pid(pid, 30, f"process dumped by {engine}")
        self.live.discard(pid)
        for c in children:  # re-parented to us (subreaper) when the root died
            tt.wait4_pid(c, 30, f"child dumped by {engine}")
            self.live.discard(c)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            raise BenchError(f"{engine} dump: process {pid} ended with status {status:#x}, expected SIGKILL")
        rec["image_bytes"] = dr.dir_size(img)[0]

        wall, usage, stdout = self.run(restore_argv, f"{tag}.restore", f"{engine} restore")
        with open(pidfile) as f:
            rpid = int(f.read().split()[0])
        self.live.add(rpid)
        self.live.update(children)
        rec["restore"] = {"wall_s": wall, **usage}
        if engine == "stasis":
            r = dr.parse_json_line(stdout, "stasis restore")
            rec["restore"].update(total_s=r["total_us"] / 1e6, pid_wait_s=r["pid_wait_us"] / 1e6)
        if rpid != pid:
            raise BenchError(f"{engine} restored at pid {rpid}, dumped pid was {pid}")
        self.check_shape(w, rpid, children, f"after the {engine} restore")

        # the workload checks its memory (the root its children)
        dr.check_restored_pass(rpid, logf, f"process restored by {engine}", timeout=120,
                               context=f"; workload: {shlex.join(argv)}")
        self.live.discard(rpid)
        self.live.difference_update(children)
        rec["verified"] = "PASS"
        shutil.rmtree(img)
        for p in (logf, pidfile):
            if os.path.exists(p):
                os.unlink(p)
        return rec


# ---------------------------------------------------------------- report

def summarize(runs, wl, size_mib):
    """Per workload and engine: stats of dump and restore wall times (and of
    Stasis's own figures); the ratios of medians; the baseline."""
    bases = [r["baseline"] for r in runs]
    size = size_mib << 20
    base = {k: tt.stats([b[k] for b in bases]) for k in ("write_s", "read_fresh_s", "read_s")}
    out = {"baseline": base, "workloads": {}}
    for w in wl:
        k = w["key"]
        m = {}
        for e in ENGINES:
            recs = [r[k][e] for r in runs if k in r and e in r[k]]
            if not recs:
                continue
            m[e] = {"dump_s": tt.stats([x["dump"]["wall_s"] for x in recs]),
                    "restore_s": tt.stats([x["restore"]["wall_s"] for x in recs]),
                    "image_bytes": tt.stats([x["image_bytes"] for x in recs]),
                    "dump_cpu_s": tt.stats([x["dump"]["cpu_s"] for x in recs]),
                    "dump_other_cpu_s": tt.stats([x["dump"]["other_cpu_s"] for x in recs]),
                    "restore_other_cpu_s": tt.stats([x["restore"]["other_cpu_s"] for x in recs])}
            if e == "stasis":
                m[e]["dump_total_s"] = tt.stats([x["dump"]["total_s"] for x in recs])
                m[e]["restore_total_s"] = tt.stats([x["restore"]["total_s"] for x in recs])
                m[e]["saved_bytes"] = tt.stats([x["dump"]["bytes"] for x in recs])
                stages = recs[0]["dump"]["stages_s"].keys()
                m[e]["stages_s"] = {s: tt.stats([x["dump"]["stages_s"].get(s, 0.0) for x in recs])["median"]
                                    for s in stages}
        if len(m) == 2:
            s, c = m["stasis"], m["criu"]
            nbytes = s["saved_bytes"]["median"]
            copy_out = base["write_s"]["median"] * nbytes / size
            copy_in = base["read_fresh_s"]["median"] * nbytes / size
            m["ratios"] = {
                "dump_vs_criu": c["dump_s"]["median"] / s["dump_s"]["median"],
                "restore_vs_criu": c["restore_s"]["median"] / s["restore_s"]["median"],
                "dump_vs_copy": copy_out / s["dump_s"]["median"],
                "restore_vs_copy": copy_in / s["restore_s"]["median"],
                "dump_cpu_vs_criu": c["dump_cpu_s"]["median"] / s["dump_cpu_s"]["median"],
                # Per run (the two cycles back to back), then the median: less
                # sensitive to load that changes from run to run.
                "dump_vs_criu_paired": tt.med([r[k]["criu"]["dump"]["wall_s"] / r[k]["stasis"]["dump"]["wall_s"]
                                               for r in runs if k in r]),
                "restore_vs_criu_paired": tt.med([r[k]["criu"]["restore"]["wall_s"]
                                                  / r[k]["stasis"]["restore"]["wall_s"] for r in runs if k in r]),
                "criu_dump_vs_copy": copy_out / c["dump_s"]["median"],
                "criu_restore_vs_copy": copy_in / c["restore_s"]["median"],
                "copy_out_s": copy_out, "copy_in_s": copy_in,
            }
        out["workloads"][k] = m
    return out


def fmt(st):
    return f"{st['median']:.3f} [{st['min']:.3f}-{st['max']:.3f}]"


def mark(x, target):
    return f"{x:.2f}x{'' if x >= target else ' (miss)'}"


def table(summary, wl, nruns, workdir, load, size_mib):
    b = summary["baseline"]
    lines = [f"stasis vs criu: images in {workdir} (tmpfs), {nruns} alternating runs, wall seconds "
             f"median [min-max]; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
             f"baseline, {size_mib} MiB: memory -> tmpfs {fmt(b['write_s'])} s, tmpfs -> fresh memory "
             f"{fmt(b['read_fresh_s'])} s",
             "",
             f"{'workload':29} {'engine':7} {'dump s':>21} {'restore s':>21} {'dump CPU s':>10} "
             f"{'others CPU s':>12}",
             ]
    for w in wl:
        m = summary["workloads"].get(w["key"], {})
        for e in ENGINES:
            if e in m:
                lines.append(f"{w['label']:29} {e:7} {fmt(m[e]['dump_s']):>21} {fmt(m[e]['restore_s']):>21} "
                             f"{m[e]['dump_cpu_s']['median']:10.3f} {m[e]['dump_other_cpu_s']['median']:6.2f}/"
                             f"{m[e]['restore_other_cpu_s']['median']:.2f}")
    lines += ["(dump CPU s: the dump command's own CPU time; others CPU s: CPU time the rest of the machine used "
              "during the dump / the restore, out of 2 x wall on 2 cores: > ~0.1 means the machine was not quiet)"]
    lines += ["", f"{'workload':29} {'dump vs CRIU':>13} {'restore vs CRIU':>16} {'dump vs copy':>13} "
              f"{'restore vs copy':>16}   (targets >= {TARGET_VS_CRIU}x CRIU, >= {TARGET_VS_COPY}x copy)"]
    for w in wl:
        r = summary["workloads"].get(w["key"], {}).get("ratios")
        if r:
            lines.append(f"{w['label']:29} {mark(r['dump_vs_criu'], TARGET_VS_CRIU):>13} "
                         f"{mark(r['restore_vs_criu'], TARGET_VS_CRIU):>16} "
                         f"{mark(r['dump_vs_copy'], TARGET_VS_COPY):>13} "
                         f"{mark(r['restore_vs_copy'], TARGET_VS_COPY):>16}   "
                         f"(CRIU vs copy: {r['criu_dump_vs_copy']:.2f}x / {r['criu_restore_vs_copy']:.2f}x; "
                         f"dump CPU vs CRIU {r['dump_cpu_vs_criu']:.2f}x; paired per run: "
                         f"{r['dump_vs_criu_paired']:.2f}x / {r['restore_vs_criu_paired']:.2f}x)")
    lines += ["", "Stasis dump, frozen stages (median s):"]
    for w in wl:
        s = summary["workloads"].get(w["key"], {}).get("stasis")
        if s:
            st = ", ".join(f"{k} {v:.3f}" for k, v in s["stages_s"].items())
            lines.append(f"  {w['label']:27} total {s['dump_total_s']['median']:.3f}: {st}")
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--criu", help="a CRIU 4.x binary (required unless --from-json)")
    ap.add_argument("--stasis", default=dr.STASIS, help="default: target/release/stasis of this checkout")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--size-mib", type=int, default=1024, help="memory of each workload (tree: half, shared)")
    ap.add_argument("--only", default=None, help="comma-separated workload keys (single,threads,tree,python)")
    ap.add_argument("--dir", default="/dev/shm", help="a tmpfs directory for the images (default /dev/shm)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    ap.add_argument("--json-out", default=None, help="also write the JSON result to this file")
    ap.add_argument("--from-json", default=None, help="print the table of a saved --json-out result, run nothing")
    args = ap.parse_args()
    if not args.criu and not args.from_json:
        ap.error("--criu PATH is required")
    if args.runs <= 0 or args.size_mib < 16:
        ap.error("--runs must be positive and --size-mib at least 16")
    return args


def retable(path):
    """The table of a saved result (after a change to the report)."""
    r = json.load(open(path))
    size_mib = int(r["command"].split("--size-mib ")[1].split()[0]) if "--size-mib " in r["command"] else 1024
    wl = [w for w in workloads(argparse.Namespace(size_mib=size_mib), {"threads_fill": "", "tree_fill": ""})
          if w["key"] in r["workloads"]]
    summary = summarize(r["runs"], wl, size_mib)
    print(table(summary, wl, len(r["runs"]), r.get("dir", "?"), r["machine"]["loadavg_at_end"], size_mib))
    return 0


def main():
    args = parse_args()
    if args.from_json:
        return retable(args.from_json)
    binaries = {"stasis": os.path.abspath(args.stasis), "criu": os.path.abspath(args.criu)}
    if os.geteuid() != 0:
        log("vs_criu: needs root (ptrace, clone3 set_tid): run with sudo")
        return 1
    for e, p in binaries.items():
        if not os.access(p, os.X_OK):
            log(f"vs_criu: {e} binary {p} not found or not executable")
            return 1
    if ctypes.CDLL(None, use_errno=True).prctl(dr.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log("vs_criu: prctl(PR_SET_CHILD_SUBREAPER) failed")
        return 1
    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.monotonic()
    exes = tt.build_workloads()
    wl = workloads(args, exes)
    if args.only:
        keys = args.only.split(",")
        wl = [w for w in wl if w["key"] in keys]
    workdir = tempfile.mkdtemp(prefix="stasis-vs-criu-", dir=args.dir)
    if dr.fs_type(workdir) != "tmpfs":
        log(f"vs_criu: warning: {workdir} is not on tmpfs; the figures are not comparable")
    criu_version = subprocess.run([binaries["criu"], "--version"], capture_output=True, text=True).stdout.split()
    result = {"benchmark": "vs_criu", "date_utc": started.isoformat(timespec="seconds"),
              "command": shlex.join([sys.executable] + sys.argv), "machine": dr.machine_info(),
              "stasis": dr.git_info() | {"binary": binaries["stasis"]},
              "criu": {"binary": binaries["criu"], "version": " ".join(criu_version)},
              "workloads": {w["key"]: w["what"] for w in wl}, "dir": workdir}
    b = Bench(args, exes, workdir, binaries)
    runs = []
    try:
        log(f"vs_criu: work dir {workdir}; warm-up (untimed): baseline + one cycle of each workload and engine")
        b.baseline(args.size_mib)
        for w in wl:
            for e in ENGINES:
                b.cycle(w, f"warm-{w['tag']}-{e}", e)
        for i in range(args.runs):
            run = {"run": i, "baseline": b.baseline(args.size_mib)}
            order = wl[i % len(wl):] + wl[:i % len(wl)]
            engines = ENGINES if i % 2 == 0 else ENGINES[::-1]
            msg = []
            for w in order:
                run[w["key"]] = {}
                for e in engines:
                    rec = b.cycle(w, f"run{i}-{w['tag']}-{e}", e)
                    run[w["key"]][e] = rec
                    msg.append(f"{w['key']}/{e} {rec['dump']['wall_s']:.3f}/{rec['restore']['wall_s']:.3f}")
            runs.append(run)
            log(f"run {i + 1}/{args.runs}: tmpfs write {run['baseline']['write_s']:.3f} read-fresh "
                f"{run['baseline']['read_fresh_s']:.3f}; dump/restore s: " + ", ".join(msg))
    except BenchError as e:
        b.kill_live()
        log(f"vs_criu: FAILED: {e}\nvs_criu: work dir left for inspection: {workdir}")
        return 1
    except BaseException:
        b.kill_live()
        raise
    tt.reap_orphans()
    summary = summarize(runs, wl, args.size_mib)
    load = os.getloadavg()
    txt = table(summary, wl, args.runs, workdir, load, args.size_mib)
    result.update(runs=runs, summary=summary, table=txt.splitlines(), runtime_s=time.monotonic() - t0)
    result["machine"]["loadavg_at_end"] = load
    shutil.rmtree(workdir, ignore_errors=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    print(json.dumps(result, indent=2) if args.json else txt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
