#!/usr/bin/env python3
"""Elnozahy, Johnson and Zwaenepoel's table, on Stasis: the running time of
the seed's MPI programs (16 ranks over 4 namespace hosts, Open MPI over TCP,
launched through an rsh daemon per host as on a cluster) with `stasis
cluster run --every A` and `--every B` against no checkpoint, measured in
the same run, runs alternating; plus, per round, the time each host's job
was frozen and the bytes written (the first round full, later ones
incremental).

Needs root, Open MPI (scripts/setup.sh) and a built stasis:

    cargo build --release
    sudo python3 bench/cluster_mpi.py                       # all six, --every 10,30, 3 reps
    sudo python3 bench/cluster_mpi.py --quick               # sor and nqueens, --every 3,9, 2 reps

Each job's own `time:` line is not used: the figure is the wall time of
mpirun on host 1, from its start to its exit (what a user waits for). Every
run must end with PASS and the checksum of the first undisturbed run of its
program (a checkpointed run that computed something else is an error, not a
figure). Output: a table, and JSON (--json-out) with every run.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS_SH = os.path.join(ROOT, "scripts", "hosts.sh")
AGENT_PORT = 7700
RSH_PORT = 7222
TOKEN = "bench-cluster-mpi-token-0123456789abcdef"


class Lines:
    """The lines of a child's stdout, read by a thread."""

    def __init__(self, stream):
        self.lines = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for raw in stream:
            with self.cv:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.lines.append(None)
            self.cv.notify_all()

    def wait_for(self, pred, start, timeout):
        """The first line at index >= start satisfying pred: (index, line)."""
        deadline = time.time() + timeout
        with self.cv:
            i = start
            while True:
                while i < len(self.lines):
                    line = self.lines[i]
                    if line is None:
                        raise RuntimeError("the stream ended")
                    if pred(line):
                        return i, line
                    i += 1
                left = deadline - time.time()
                if left <= 0:
                    raise TimeoutError("no such line")
                self.cv.wait(left)


class Cluster:
    def __init__(self, a):
        self.a = a
        self.prefix = "stbench-h"
        self.subnet = "10.219.0"
        self.dir = tempfile.mkdtemp(prefix="stasis-bench-cluster-")
        self.tf = os.path.join(self.dir, "token")
        with open(os.open(self.tf, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(TOKEN + "\n")
        self.agents, self.rshds = [], []
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self):
        a = self.a
        subprocess.run([HOSTS_SH, "up", str(a.hosts), "--prefix", self.prefix,
                        "--subnet", self.subnet + ".0/24"], check=True,
                       stdout=subprocess.DEVNULL)
        for i in range(a.hosts):
            p = self.on_host(i, [a.stasis, "agent", "--json", "--listen",
                                 f"{self.addr(i)}:{AGENT_PORT}", "--token-file", self.tf,
                                 "-D", os.path.join(self.dir, f"agent{i + 1}")])
            self.agents.append((p, f"{self.addr(i)}:{AGENT_PORT}"))
            Lines(p.stdout).wait_for(lambda l: "listening" in l, 0, 30)
        for i in range(1, a.hosts):
            p = self.on_host(i, [os.path.join(a.bin, "rshd"), f"{self.addr(i)}:{RSH_PORT}"])
            lines = Lines(p.stdout)
            self.rshds.append([p, lines, 0])
            lines.wait_for(lambda l: l.startswith("rshd: listening"), 0, 30)

    def addr(self, i):
        return f"{self.subnet}.{11 + i}"

    def host(self, i):
        return f"{self.prefix}{i + 1}"

    def on_host(self, i, argv, **kw):
        kw.setdefault("stdout", subprocess.PIPE)
        return subprocess.Popen([HOSTS_SH, "exec", self.host(i)] + argv,
                                stdin=subprocess.DEVNULL, close_fds=True, **kw)

    def run_job(self, prog, args, every, job):
        """One run of `prog`: (seconds, result line, rounds' events)."""
        a = self.a
        hostfile = os.path.join(self.dir, "hostfile")
        slots = -(-a.ranks // a.hosts)
        with open(hostfile, "w") as f:
            for i in range(a.hosts):
                f.write(f"{self.host(i)} slots={slots}\n")
        out = os.path.join(self.dir, f"{job}.out")
        sub = self.subnet + ".0/24"
        rsh = f"{os.path.join(a.bin, 'rsh')} -p {RSH_PORT}"
        argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--hostfile", hostfile,
                "-np", str(a.ranks), "--mca", "plm_rsh_agent", rsh,
                "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", sub, "--mca", "oob_tcp_if_include", sub,
                os.path.join(a.bin, prog)] + args
        with open(out, "w") as f:
            t0 = time.monotonic()
            mpirun = self.on_host(0, argv, stdout=f, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        roots = [mpirun.pid]
        for r in self.rshds:
            i, line = r[1].wait_for(lambda l: l.startswith("rshd: pid="), r[2], 60)
            r[2] = i + 1
            roots.append(int(line.split()[1].split("=")[1]))
        events, runner = [], None
        if every:
            targets = []
            for (_, addr), root in zip(self.agents, roots):
                targets += ["--target", f"{addr}={root}"]
            runner = self.on_host(0, [a.stasis, "cluster", "run", "--job", job, "--every",
                                      str(every), "--json", "--token-file", self.tf] + targets,
                                  stderr=subprocess.DEVNULL)
            ev_lines = Lines(runner.stdout)
        mpirun.wait()
        secs = time.monotonic() - t0
        if runner:
            runner.wait(timeout=120)
            time.sleep(0.1)
            events = [json.loads(l) for l in ev_lines.lines if l]
        text = open(out).read()
        last = [l for l in text.splitlines() if l.startswith(("PASS", "FAIL"))]
        if mpirun.returncode != 0 or not last or not last[-1].startswith("PASS"):
            raise RuntimeError(f"{prog} ({job}) failed:\n{text[-2000:]}")
        for i in range(self.a.hosts):
            shutil.rmtree(os.path.join(self.dir, f"agent{i + 1}", "jobs", job),
                          ignore_errors=True)
        return secs, last[-1], events

    def close(self):
        for p, *_ in self.rshds + self.agents:
            p.terminate()
        for p, *_ in self.rshds + self.agents:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run([HOSTS_SH, "down", "--prefix", self.prefix],
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


# Sized so that each undisturbed run lasts about 65 s on the 2-core machine
# (so `--every 30` makes two rounds): 13.6, 17, 17, 31.6, 23 and 25 s with
# the programs' own defaults.
DEFAULT_ARGS = {
    "nqueens": ["15", "100"], "tsp": ["18", "60"], "fft": ["20", "400"],
    "gauss": ["300", "80"], "matmult": ["640", "600"], "sor": ["512", "21000"],
}
QUICK_ARGS = {"sor": ["512", "4000"], "nqueens": ["15", "10"]}


def stopped_us(r):
    """Every stop of a host's tree in one round: the cut's freeze, plus the
    brief stop that gives a `uffd` dump its userfaultfds and the stops of a
    `fork` dump (reaping its snapshots, pauses at the copy-on-write cap)."""
    c = r.get("concurrent") or {}
    return (r["frozen_us"] + c.get("prepare_stop_us", 0) + c.get("reap_stop_us", 0)
            + c.get("paused_us", 0))


def stage_lengths(r):
    """{stage: ms} of one report's frozen time (`frozen_stages` marks)."""
    out, prev = {}, 0
    for m in r.get("frozen_stages", []):
        out[m["stage"]] = (m["end_us"] - prev) / 1e3
        prev = m["end_us"]
    return out


def frozen_cpu_ms(r):
    """The CPU time the agent spent while its tree was frozen (the last
    stage mark's `cpu_us`), in ms."""
    marks = r.get("frozen_stages", [])
    return marks[-1].get("cpu_us", 0) / 1e3 if marks else 0.0


def rounds_figures(events):
    """Per committed round: (max frozen ms of a host, max stopped ms of a
    host, bytes, incremental, [stage lengths of every host], [agent CPU ms
    while frozen, every host])."""
    out = []
    for e in events:
        if e.get("event") != "checkpoint":
            continue
        reps = [r for h in e["hosts"] for r in h["reports"]]
        out.append((max(r["frozen_us"] for r in reps) / 1e3,
                    max(stopped_us(r) for r in reps) / 1e3,
                    e["bytes"], e["incremental"], [stage_lengths(r) for r in reps],
                    [frozen_cpu_ms(r) for r in reps]))
    return out


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stasis", default=os.path.join(ROOT, "target/release/stasis"))
    ap.add_argument("--programs", default="nqueens,tsp,fft,gauss,matmult,sor")
    ap.add_argument("--every", default="10,30", help="two intervals, seconds")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--quick", action="store_true",
                    help="sor and nqueens, shorter runs, --every 3,9, 2 reps")
    ap.add_argument("--json-out", default=os.path.join(ROOT, "bench/results/cluster_mpi.json"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("cluster_mpi.py needs root (namespaces, ptrace)")
    table = DEFAULT_ARGS
    if a.quick:
        a.programs, a.every, a.reps, table = "sor,nqueens", "3,9", 2, QUICK_ARGS
    every = [float(x) for x in a.every.split(",")]
    a.bin = os.path.join(ROOT, "target", "mpi-workloads")
    progs = a.programs.split(",")
    subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "tests/workloads/mpi"),
                    f"OUT={a.bin}"] + [os.path.join(a.bin, p) for p in progs + ["rsh", "rshd"]],
                   check=True)
    # A SIGTERM (a killed bench) unwinds through `finally`, so the hosts,
    # agents and daemons are taken down, not left listening.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    c = Cluster(a)
    results = {}
    try:
        for prog in progs:
            args = table.get(prog, DEFAULT_ARGS[prog])
            configs = [None] + every
            runs = {str(x): [] for x in configs}
            want = None
            for rep in range(a.reps):
                order = configs if rep % 2 == 0 else list(reversed(configs))
                for cfg in order:
                    job = f"{prog}-{rep}-{cfg or 'none'}".replace(".", "_")
                    secs, last, events = c.run_job(prog, args, cfg, job)
                    want = want or last
                    if last != want:
                        raise RuntimeError(f"{prog}: {last!r} differs from {want!r}")
                    rf = rounds_figures(events)
                    runs[str(cfg)].append({"secs": secs, "rounds": rf,
                                           "failed": sum(e.get("event") == "failed" for e in events)})
                    print(f"{prog} rep {rep} every {cfg}: {secs:.1f} s, {len(rf)} rounds "
                          f"(frozen max {max((r[0] for r in rf), default=0):.1f} ms, "
                          f"stopped max {max((r[1] for r in rf), default=0):.1f} ms)", flush=True)
            results[prog] = {"args": args, "result": want, "runs": runs}
    finally:
        c.close()
    print()
    print(f"{'program':9} {'none s':>14} " + " ".join(
        f"{'every ' + format(x, 'g') + ' s':>24}" for x in every)
        + "   frozen ms/host/round (median, max)   stopped (median, max)"
        + "   MiB/round (first; incr. median)")
    for prog, r in results.items():
        base = [x["secs"] for x in r["runs"]["None"]]
        cells = [f"{med(base):7.1f} ±{(max(base) - min(base)) / 2:4.1f}"]
        frozen, stopped, first, incr, stages, cpu, bound = [], [], [], [], {}, [], []
        for x in every:
            s = [y["secs"] for y in r["runs"][str(x)]]
            over = (med(s) / med(base) - 1) * 100
            cells.append(f"{med(s):6.1f} ±{(max(s) - min(s)) / 2:4.1f} ({over:+5.1f}%)")
            for y in r["runs"][str(x)]:
                frozen += [rd[0] for rd in y["rounds"]]
                stopped += [rd[1] for rd in y["rounds"]]
                first += [rd[2] for rd in y["rounds"] if not rd[3]]
                incr += [rd[2] for rd in y["rounds"] if rd[3]]
                for rd in y["rounds"]:
                    for h in rd[4]:
                        for k, v in h.items():
                            stages.setdefault(k, []).append(v)
                    cpu += rd[5]
                    # No schedule of the round's frozen work (every
                    # host's agent CPU) on the machine's cores can end
                    # sooner than this.
                    bound.append(sum(rd[5]) / (os.cpu_count() or 1))
        print(f"{prog:9} {cells[0]:>14} " + " ".join(f"{c:>24}" for c in cells[1:])
              + f"   {med(frozen):7.1f} {max(frozen, default=0):7.1f}"
              + f"   {med(stopped):7.1f} {max(stopped, default=0):7.1f}"
              + f"   {med(first) / 2**20:7.2f}; {med(incr) / 2**20:7.2f}")
        print(f"{'':9} frozen stages, median ms per host: "
              + ", ".join(f"{k} {med(v):.1f}" for k, v in stages.items()))
        print(f"{'':9} agent CPU while frozen, ms per host: median {med(cpu):.1f}, "
              f"max {max(cpu, default=0):.1f}; all hosts' CPU / {os.cpu_count()} cores "
              f"per round: median {med(bound):.1f} ms")
        r["overhead_pct"] = {str(x): (med([y["secs"] for y in r["runs"][str(x)]]) / med(base) - 1) * 100
                             for x in every}
    os.makedirs(os.path.dirname(a.json_out), exist_ok=True)
    with open(a.json_out, "w") as f:
        json.dump({"hosts": a.hosts, "ranks": a.ranks, "every": every, "reps": a.reps,
                   "loadavg": os.getloadavg(), "programs": results}, f, indent=1)
    print(f"\nJSON: {a.json_out}")


if __name__ == "__main__":
    main()
