#!/usr/bin/env python3
"""The frozen time of cluster rounds, side by side: two (or more) stasis
binaries alternating on the same MPI job (the seed's `sor`, `--quick`
size, 16 ranks over 4 namespace hosts by default), a round every EVERY
seconds. Per binary: every incremental round of every host's frozen time
(median, p25, p75, max), the longest host per round, the agent's CPU while
frozen per host (`frozen_stages[].cpu_us`; 0 for a binary older than that
field) and the round's bound (all hosts' frozen CPU / the machine's cores).

    cargo build --release
    sudo python3 bench/cluster_frozen.py --stasis /tmp/stasis-old,target/release/stasis
    sudo python3 bench/cluster_frozen.py --stasis A,B --hosts 2 --ranks 2 --reps 3

Uses bench/cluster_mpi.py's hosts, agents and launcher.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_mpi as cm  # noqa: E402


def quantile(xs, f):
    xs = sorted(xs)
    return xs[int(f * (len(xs) - 1))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stasis", required=True, help="binaries, comma-separated")
    ap.add_argument("--program", default="sor", choices=sorted(cm.QUICK_ARGS))
    ap.add_argument("--every", type=float, default=1.5)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--json-out", default=os.path.join(cm.ROOT, "bench/results/cluster_frozen.json"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("cluster_frozen.py needs root (namespaces, ptrace)")
    bins = [os.path.abspath(b) for b in a.stasis.split(",")]
    bin_dir = os.path.join(cm.ROOT, "target", "mpi-workloads")
    subprocess.run(["make", "-s", "-C", os.path.join(cm.ROOT, "tests/workloads/mpi"),
                    f"OUT={bin_dir}"] + [os.path.join(bin_dir, p) for p in [a.program, "rsh", "rshd"]],
                   check=True)
    res = {b: {"frozen": [], "longest": [], "cpu": [], "bound": []} for b in bins}
    for rep in range(a.reps):
        for b in bins if rep % 2 == 0 else bins[::-1]:
            ns = argparse.Namespace(stasis=b, hosts=a.hosts, ranks=a.ranks, bin=bin_dir)
            c = cm.Cluster(ns)
            try:
                secs, last, events = c.run_job(a.program, cm.QUICK_ARGS[a.program], a.every,
                                               f"frozen-{rep}")
            finally:
                c.close()
            for e in events:
                if e.get("event") != "checkpoint" or not e.get("incremental"):
                    continue
                reports = [r for h in e["hosts"] for r in h["reports"]]
                frozen = [r["frozen_us"] / 1e3 for r in reports]
                cpu = [cm.frozen_cpu_ms(r) for r in reports]
                res[b]["frozen"] += frozen
                res[b]["longest"].append(max(frozen))
                res[b]["cpu"] += cpu
                res[b]["bound"].append(sum(cpu) / (os.cpu_count() or 1))
            print(f"{b} rep {rep}: {secs:.1f} s, {last}", flush=True)
    print()
    for b in bins:
        r = res[b]
        if not r["frozen"]:
            print(f"{b}: no incremental round")
            continue
        med = statistics.median
        print(f"{b}: {len(r['longest'])} incremental rounds; frozen per host median "
              f"{med(r['frozen']):.1f} ms (p25 {quantile(r['frozen'], .25):.1f}, p75 "
              f"{quantile(r['frozen'], .75):.1f}, max {max(r['frozen']):.1f}); longest host per "
              f"round {med(r['longest']):.1f} ms; agent CPU while frozen per host "
              f"{med(r['cpu']):.1f} ms; bound {med(r['bound']):.1f} ms")
    os.makedirs(os.path.dirname(a.json_out), exist_ok=True)
    with open(a.json_out, "w") as f:
        json.dump({"hosts": a.hosts, "ranks": a.ranks, "every": a.every, "results": res}, f, indent=1)


if __name__ == "__main__":
    main()
