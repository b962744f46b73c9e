#!/usr/bin/env python3
"""ACCK benchmark: per kernel, the monitoring modes side by side in one run.

Builds libstasis (release) and kernels.c, then runs every kernel in every
mode, the modes alternating within each round, ROUNDS rounds. Reports the
median of each figure with its spread (min-max), and ratios against `page`
measured in the same run:

  monitor overhead = total - compute-only ("none" run) - checkpoint time
  (what faults, protection and scans cost the program), faults, the cost
  per fault (seen by the program, and the library's own monitor_ns),
  bytes copied out of the region, total time; and the bound: the speed-up
  over page a mode would have if checkpoints cost nothing.

usage: bench.py [--mb 64] [--steps 30] [--every 5] [--rounds 3]
                [--target pmem|dir] [--dir /dev/shm/stasis-acck-bench]
                [--modes none,full,page,acck,acck10,uffd] [--kernels ...]
`acck10` is acck with the paper's sampling window (the first 10% of a piece).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
KERNELS = ["stream", "stencil", "fft", "radix", "random", "scattered"]


def build():
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "stasis-app"], cwd=ROOT, check=True)
    lib = os.path.join(ROOT, "target", "release")
    exe = os.path.join(lib, "acck-kernels")
    subprocess.run(["cc", "-O2", "-I", os.path.join(ROOT, "include"), os.path.join(HERE, "kernels.c"),
                    "-L" + lib, "-Wl,--disable-new-dtags", "-Wl,-rpath," + lib, "-lstasis", "-lm", "-o", exe],
                   check=True)
    return exe


def run(exe, kernel, mode, a):
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    env["STASIS_TARGET"] = a.target
    env["STASIS_MONITOR"] = "acck" if mode == "acck10" else mode
    if mode == "acck10":
        env["STASIS_ACCK_WINDOW"] = "10"
    shutil.rmtree(a.dir, ignore_errors=True)
    out = subprocess.run([exe, kernel, str(a.mb), str(a.steps), str(a.every), a.dir],
                         env=env, check=True, capture_output=True, text=True).stdout
    shutil.rmtree(a.dir, ignore_errors=True)
    return {k: v for k, v in (f.split("=", 1) for f in out.split())}


def med(xs):
    return statistics.median(xs), min(xs), max(xs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--target", default="pmem")
    p.add_argument("--dir", default="/dev/shm/stasis-acck-bench")
    p.add_argument("--modes", default="none,full,page,acck,acck10,uffd")
    p.add_argument("--kernels", default=",".join(KERNELS))
    a = p.parse_args()
    modes, kernels = a.modes.split(","), a.kernels.split(",")
    exe = build()
    res = {}
    for r in range(a.rounds):
        for k in kernels:
            order = modes if r % 2 == 0 else list(reversed(modes))
            for m in order:
                res.setdefault((k, m), []).append(run(exe, k, m, a))
    print(f"# {a.mb} MiB region, {a.steps} steps, checkpoint every {a.every} steps, "
          f"target {a.target}, {a.rounds} rounds (median [min-max])")
    print("| kernel | mode | total s | checkpoint s | monitor overhead s | faults | us per fault (program / library) "
          "| MB copied | x faster than page | x less monitoring than page | copied vs page |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    geo = {}
    for k in kernels:
        none = statistics.median(float(x["total_s"]) for x in res[(k, "none")]) if "none" in modes else 0.0

        def fig(m):
            xs = res[(k, m)]
            tot = [float(x["total_s"]) for x in xs]
            mon = [max(0.0, float(x["total_s"]) - none - float(x["ckpt_s"])) for x in xs]
            return med(tot), med(mon), statistics.median(int(x["faults"]) for x in xs), \
                statistics.median(int(x["copied"]) for x in xs), \
                statistics.median(float(x["ckpt_s"]) for x in xs), \
                statistics.median(float(x["monitor_s"]) for x in xs)
        base = fig("page") if "page" in modes else None
        for m in modes:
            if m == "none":
                t = med([float(x["total_s"]) for x in res[(k, m)]])
                print(f"| {k} | none (compute only) | {t[0]:.3f} [{t[1]:.3f}-{t[2]:.3f}] | | | | | | | | |")
                continue
            (t, mon, faults, copied, ck, lib_mon) = fig(m)
            per = f"{mon[0] / faults * 1e6:.1f} / {lib_mon / faults * 1e6:.1f}" if faults else ""
            cells = ["", "", ""]
            if base:
                sp = base[0][0] / t[0]
                ml = base[1][0] / mon[0] if mon[0] > 0 else float("inf")
                cp = copied / base[3] if base[3] else float("nan")
                cells = [f"{sp:.2f}", f"{ml:.2f}", f"{cp:.3f}"]
                geo.setdefault(m, []).append((sp, ml, cp))
            print(f"| {k} | {m} | {t[0]:.3f} [{t[1]:.3f}-{t[2]:.3f}] | {ck:.3f} | {mon[0]:.3f} [{mon[1]:.3f}-{mon[2]:.3f}] "
                  f"| {faults} | {per} | {copied / 2**20:.1f} | {' | '.join(cells)} |")
    print()
    print("Bound: x faster than page if checkpoints cost nothing, (compute + page's monitoring) / "
          "(compute + this mode's), per kernel and geometric mean:")
    print()
    for m in modes:
        if m in ("none", "page", "full") or "none" not in modes or "page" not in modes:
            continue
        b = []
        for k in kernels:
            none = statistics.median(float(x["total_s"]) for x in res[(k, "none")])
            mon = {mm: statistics.median(max(0.0, float(x["total_s"]) - none - float(x["ckpt_s"]))
                                         for x in res[(k, mm)]) for mm in ("page", m)}
            b.append((none + mon["page"]) / max(1e-9, none + mon[m]))
        print(f"- {m}: " + ", ".join(f"{k} {x:.2f}" for k, x in zip(kernels, b))
              + f"; geometric mean {statistics.geometric_mean(b):.2f}")
    print()
    print("| mode | geometric mean: x faster than page | x less monitoring | data copied vs page |")
    print("|---|---|---|---|")
    for m, v in geo.items():
        g = [statistics.geometric_mean([max(1e-9, x[i]) for x in v]) if all(x[i] != float("inf") for x in v)
             else float("inf") for i in range(3)]
        print(f"| {m} | {g[0]:.2f} | {g[1]:.2f} | {g[2]:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
