#!/usr/bin/env python3
"""bench/compare: an A/B of two stasis builds on the headline benchmarks.

    sudo python3 bench/compare.py --old BIN --new BIN [--rounds 3] [--quick]
        [--only dump_restore,concurrent_downtime,lazy_restore]
        [--wait-quiet SECS] [--out-dir DIR] [--json-out FILE]

Runs dump_restore.py, concurrent_downtime.py and lazy_restore.py (this
checkout's scripts and workloads, for both builds) with --stasis set to each
binary in turn. Each round runs every benchmark once with each binary; the
order alternates between rounds, per benchmark: old new | new old | old new
| ..., so a slow drift of the machine weighs on both builds alike. Both
binaries are copied first into one private directory on /dev/shm, so they
are loaded from the same medium and a rebuild during the run changes
nothing; the JSON records their SHA-256 and the commit of the checkout each
came from.

A sample is one run's own headline figure: the median over that run's reps,
as the benchmark itself prints it. For each figure the table gives, per
build, the median of its N samples and their spread [min-max], the ratio of
the medians new/old (all figures are times: above 1 means the new build is
slower), and a verdict: "within noise" when |ratio - 1| is below the larger
of the two relative spreads (max - min) / median, else "new slower" or "new
faster". With one round there is no spread to judge by ("n/a").

Rows marked "control" measure no stasis code (the tmpfs copy baseline of
dump_restore): their ratio shows how much the machine itself drifted
between the runs of the two builds; outside noise, the verdict says
"MACHINE DRIFTED", and the other figures of that benchmark are suspect.

Sizes: 1 GiB for dump/restore, matrix N = 1024 with a 1 GiB working set
for the concurrent downtime, 1 GiB on local tmpfs and a loopback page
server for lazy restore (--quick: 64 MiB, N = 256 with 128 MiB, 64 MiB; for
a smoke run, the figures mean little).

Exit status: 1 if a benchmark run failed (non-zero exit or unreadable
JSON), else 0. No time is pass or fail.
"""

import argparse
import datetime
import hashlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True  # no bench/__pycache__
import concurrent_common as cc  # noqa: E402
import dump_restore as dr  # noqa: E402

PRE_REDESIGN = "1b47bc2"  # issue 13: the commit the redesign starts from

BENCHES = ("dump_restore", "concurrent_downtime", "lazy_restore")
ARGS = {
    "full": {
        "dump_restore": ["--size-mib", "1024", "--reps", "3"],
        "concurrent_downtime": ["--sizes", "1024", "--ws-mib", "1024", "--reps", "5"],
        "lazy_restore": ["--media", "local,loopback", "--sizes", "1024", "--reps", "3"],
    },
    "quick": {
        "dump_restore": ["--size-mib", "64", "--reps", "1"],
        "concurrent_downtime": ["--sizes", "256", "--ws-mib", "128", "--reps", "2"],
        "lazy_restore": ["--quick", "--media", "local,loopback", "--sizes", "64"],
    },
}
QUIET_OPTION = {"concurrent_downtime", "lazy_restore"}  # the scripts that take --wait-quiet
TIMEOUT_S = {"full": 1800, "quick": 600}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- binaries

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def binary_info(path):
    """SHA-256 and mtime of a binary and, if it is CHECKOUT/target/*/stasis
    of a git checkout, that checkout's commit and modified tracked files,
    and whether a source file there is newer than the binary (stale build)."""
    path = os.path.abspath(path)
    info = {"path": path, "sha256": sha256(path),
            "mtime_utc": datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
            .isoformat(timespec="seconds")}
    parts = path.split(os.sep)
    if "target" in parts:
        top = os.sep.join(parts[:len(parts) - 1 - parts[::-1].index("target")]) or os.sep

        def git(*a):
            r = subprocess.run(["git", "-C", top, *a], capture_output=True, text=True)
            return r.stdout.strip() if r.returncode == 0 else None
        commit = git("rev-parse", "HEAD")
        if commit:
            dirty = git("status", "--porcelain", "--untracked-files=no")
            # The binary is built from everything but bench/: the last commit
            # that changed something else names its sources.
            src = git("log", "-1", "--format=%H", "--", ".", ":(exclude)bench") or commit
            info.update({"checkout": top, "commit": commit, "source_commit": src,
                         "subject": git("log", "-1", "--format=%s", src),
                         "dirty_tracked_files": dirty.splitlines() if dirty else []})
            newest, newest_path = 0.0, None
            for sub in ("crates", "Cargo.toml", "Cargo.lock"):
                p = os.path.join(top, sub)
                walk = os.walk(p) if os.path.isdir(p) else [(top, [], [sub])] if os.path.exists(p) else []
                for root, dirs, files in walk:
                    dirs[:] = [d for d in dirs if d != "target"]
                    for name in files:
                        if name.endswith((".rs", ".toml", ".lock")):
                            q = os.path.join(root, name)
                            m = os.path.getmtime(q)
                            if m > newest:
                                newest, newest_path = m, q
            if newest > os.path.getmtime(path):
                info["stale"] = f"{newest_path} is newer than the binary"
    return info


def describe(label, info):
    s = f"{label}: {info['path']} (sha256 {info['sha256'][:12]}, built {info['mtime_utc']})"
    if info.get("commit"):
        s += f", checkout {info['checkout']}, sources at {info['source_commit'][:7]} {info['subject'][:60]!r}"
        if info["source_commit"] != info["commit"]:
            s += f" (HEAD {info['commit'][:7]} changed only bench/)"
        if info["dirty_tracked_files"]:
            s += f", MODIFIED: {' '.join(f.split()[-1] for f in info['dirty_tracked_files'])}"
    if info.get("stale"):
        s += f"; WARNING: stale build? {info['stale']}"
    return s


# ---------------------------------------------------------------- headline figures

def figures(bench, res):
    """The headline figures of one run's JSON: {name: (value, unit, role)};
    role "headline" or "control" (no stasis code: the machine's own noise).
    Every figure is a time (lower is better)."""
    out = {}
    if bench == "dump_restore":
        m, size = res["median"], res["params"]["size_mib"]
        out[f"dump {size} MiB (stasis total_us)"] = (m["dump_total_s"]["median"], "s", "headline")
        out[f"restore {size} MiB (total_us - pid_wait_us)"] = (m["restore_net_s"]["median"], "s", "headline")
        out[f"dump {size} MiB, wall"] = (m["dump_wall_s"]["median"], "s", "headline")
        out[f"restore {size} MiB, wall"] = (m["restore_wall_s"]["median"], "s", "headline")
        out[f"tmpfs write {size} MiB"] = (m["tmpfs_write_s"]["median"], "s", "control")
        out[f"tmpfs read {size} MiB, fresh memory"] = (m["tmpfs_read_fresh_s"]["median"], "s", "control")
    elif bench == "concurrent_downtime":
        for c in res["cases"]:
            name, s = c["case"]["name"], c["summary"]
            out[f"concurrent downtime {name} (all stops)"] = (s["conc_downtime_ms"]["median"], "ms", "headline")
            out[f"concurrent frozen {name}"] = (s["conc_frozen_ms"]["median"], "ms", "headline")
            out[f"stop-the-world frozen {name}"] = (s["stw_frozen_ms"]["median"], "ms", "headline")
    elif bench == "lazy_restore":
        for medium, sizes in res["summary"].items():
            for size, v in sorted(sizes.items(), key=lambda x: int(x[0])):
                for variant in ("lazy", "lazy+touch", "full"):
                    if variant in v:
                        out[f"restart latency {variant} {medium} {size} MiB"] = (
                            v[variant]["latency_s"]["median"] * 1e3, "ms", "headline")
                f = (v.get("lazy") or {}).get("filler_fault_p50_us")
                if f:
                    out[f"fault p50 lazy {medium} {size} MiB"] = (f["median"], "us", "headline")
        if res.get("errors"):
            raise ValueError(f"the run reported errors: {res['errors']}")
    return out


def compare_figure(old, new):
    """The comparison of two lists of samples (one per run)."""
    def st(v):
        med = statistics.median(v)
        return {"median": med, "min": min(v), "max": max(v), "n": len(v),
                "rel_spread": (max(v) - min(v)) / med if med else None}
    o, n = st(old), st(new)
    ratio = n["median"] / o["median"] if o["median"] else None
    if ratio is None or o["rel_spread"] is None or n["rel_spread"] is None:
        verdict = "n/a (a zero median)"
    elif o["n"] < 2 or n["n"] < 2:
        verdict = "n/a (1 run each: no spread)"
    else:
        noise = max(o["rel_spread"], n["rel_spread"])
        if abs(ratio - 1) < noise:
            verdict = "within noise"
        else:
            verdict = "new slower" if ratio > 1 else "new faster"
    return {"old": o, "new": n, "ratio": ratio, "noise": max(o["rel_spread"] or 0, n["rel_spread"] or 0),
            "verdict": verdict}


def fmt(x, unit):
    if unit == "s":
        return f"{x:.3f}"
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def table(result):
    L = []
    rows = result["figures"]
    w = max([len(r["name"]) for r in rows] + [6])
    L.append(f"{'figure':{w}} {'unit':>4} {'old median [min-max]':>26} {'new median [min-max]':>26} "
             f"{'new/old':>7} {'noise':>6}  verdict")
    last = None
    for r in rows:
        if r["bench"] != last:
            L.append(f"-- {r['bench']}")
            last = r["bench"]
        cells = []
        for side in ("old", "new"):
            s = r[side]
            cells.append(f"{fmt(s['median'], r['unit'])} [{fmt(s['min'], r['unit'])}-{fmt(s['max'], r['unit'])}]")
        name = r["name"] + (" (control)" if r["role"] == "control" else "")
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        L.append(f"{name:{w}} {r['unit']:>4} {cells[0]:>26} {cells[1]:>26} {ratio:>7} "
                 f"{100 * r['noise']:5.1f}%  {r['verdict']}")
    L.append("")
    L.append("samples: one per run (that run's median over its reps); noise = the larger relative spread "
             "(max-min)/median of old and new; 'within noise' when |new/old - 1| < noise. All figures are "
             "times: new/old > 1 means the new build is slower. Controls run no stasis code.")
    for label in ("old", "new"):
        loads = [r["loadavg_start"][0] for r in result["runs"] if r["label"] == label]
        if loads:
            L.append(f"load average (1 min) at the start of the {label} runs: median {statistics.median(loads):.2f} "
                     f"[{min(loads):.2f}-{max(loads):.2f}]")
    if result["failures"]:
        L.append(f"FAILED RUNS ({len(result['failures'])}): " + "; ".join(result["failures"]))
    return "\n".join(L)


# ---------------------------------------------------------------- running

class Runner:
    def __init__(self):
        self.child = None

    def run(self, argv, logf, timeout):
        """Runs a benchmark script in its own session, output to logf.
        Returns (exit code, wall s)."""
        t0 = time.monotonic()
        with open(logf, "w") as out:
            self.child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          close_fds=True, start_new_session=True)
        try:
            rc = self.child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"compare: timeout after {timeout} s: {shlex.join(argv)}; stopping it")
            self.stop()
            rc = "timeout"
        self.child = None
        return rc, time.monotonic() - t0

    def stop(self):
        """SIGINT to the benchmark script (each one kills its workloads and
        cleans up on it), then SIGKILL to its session if it is still there
        after 60 s."""
        p = self.child
        if p is None or p.poll() is not None:
            return
        try:
            os.kill(p.pid, signal.SIGINT)
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        except ProcessLookupError:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help=f"the reference stasis binary (e.g. built at {PRE_REDESIGN})")
    ap.add_argument("--new", required=True, help="the stasis binary under test")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each benchmark per binary (default 3)")
    ap.add_argument("--quick", action="store_true", help="small sizes, one rep per run: a smoke run")
    ap.add_argument("--only", default=",".join(BENCHES), help=f"comma-separated subset of {','.join(BENCHES)}")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECS",
                    help="passed to concurrent_downtime and lazy_restore: before each measurement, wait up to "
                         "SECS for an idle second")
    ap.add_argument("--out-dir", default=None,
                    help="where each run's JSON and output go (default: bench/results/compare-DATE/)")
    ap.add_argument("--json-out", default=os.path.join(cc.RESULTS, "compare.json"))
    args = ap.parse_args()
    benches = [b.strip() for b in args.only.split(",") if b.strip()]
    if not benches or any(b not in BENCHES for b in benches):
        ap.error(f"--only: a comma-separated subset of {','.join(BENCHES)}")
    if args.rounds <= 0:
        ap.error("--rounds must be positive")
    if os.geteuid() != 0:
        log("compare: the benchmarks need root (ptrace, clone3 set_tid, userfaultfd, network namespaces)")
        return 1
    for b in (args.old, args.new):
        if not os.access(b, os.X_OK):
            log(f"compare: {b} is not an executable file (build it with `cargo build --release`)")
            return 1

    mode = "quick" if args.quick else "full"
    started = datetime.datetime.now(datetime.timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    out_dir = os.path.abspath(args.out_dir or os.path.join(cc.RESULTS, f"compare-{stamp}"))
    os.makedirs(out_dir, exist_ok=True)
    bins = {"old": binary_info(args.old), "new": binary_info(args.new)}
    for label in ("old", "new"):
        log("compare: " + describe(label, bins[label]))
    if bins["old"]["sha256"] == bins["new"]["sha256"]:
        log("compare: note: both binaries are identical (an A/A run: it measures the noise alone)")

    # The workloads are compiled now, not inside the first (old) run.
    try:
        dr.compile_workloads(("fill", "tmpfs_write", "lazy_job"))
        cc.compile_workloads(["conc_matmul"])
    except dr.BenchError as e:
        log(f"compare: {e}")
        return 1

    private = tempfile.mkdtemp(prefix="stasis-compare-", dir="/dev/shm")
    runner = Runner()

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)

    result = {
        "benchmark": "compare",
        "date_utc": started.isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable] + sys.argv),
        "params": {"mode": mode, "rounds": args.rounds, "benches": benches, "wait_quiet": args.wait_quiet,
                   "bench_args": {b: ARGS[mode][b] for b in benches}, "out_dir": out_dir},
        "pre_redesign_commit": PRE_REDESIGN,
        "machine": dr.machine_info(),
        "bench_checkout": dr.git_info(),
        "binaries": bins,
        "runs": [],
        "failures": [],
    }
    samples = {}  # (bench, name) -> {"unit", "role", "old": [], "new": []}
    interrupted = False
    t_start = time.monotonic()
    try:
        copies = {}
        for label in ("old", "new"):
            d = os.path.join(private, label)
            os.makedirs(d)
            copies[label] = os.path.join(d, "stasis")
            shutil.copy2(bins[label]["path"], copies[label])
        plan = []
        for rnd in range(args.rounds):
            order = ("old", "new") if rnd % 2 == 0 else ("new", "old")
            for bench in benches:
                for label in order:
                    plan.append((rnd, bench, label))
        for i, (rnd, bench, label) in enumerate(plan):
            tag = f"{bench}-r{rnd + 1}-{label}"
            json_out = os.path.join(out_dir, tag + ".json")
            logf = os.path.join(out_dir, tag + ".log")
            argv = [sys.executable, os.path.join(BENCH, bench + ".py"), *ARGS[mode][bench],
                    "--stasis", copies[label], "--json-out", json_out]
            if bench in QUIET_OPTION and args.wait_quiet:
                argv += ["--wait-quiet", str(args.wait_quiet)]
            if os.path.exists(json_out):
                os.unlink(json_out)
            load = os.getloadavg()
            log(f"compare: [{i + 1}/{len(plan)}] round {rnd + 1}, {bench}, {label} (load {load[0]:.2f})")
            rc, wall = runner.run(argv, logf, TIMEOUT_S[mode])
            run = {"round": rnd + 1, "bench": bench, "label": label, "argv": argv, "exit": rc, "wall_s": wall,
                   "loadavg_start": load, "json": json_out, "log": logf}
            result["runs"].append(run)
            try:
                if rc != 0:
                    raise ValueError(f"exit {rc}")
                with open(json_out) as f:
                    figs = figures(bench, json.load(f))
            except (OSError, ValueError, KeyError, TypeError) as e:
                msg = f"{tag}: {e} (output: {logf})"
                result["failures"].append(msg)
                log(f"compare: FAILED: {msg}")
                continue
            run["figures"] = {k: v[0] for k, v in figs.items()}
            for name, (value, unit, role) in figs.items():
                s = samples.setdefault((bench, name), {"unit": unit, "role": role, "old": [], "new": []})
                s[label].append(value)
            log("compare:   " + ", ".join(f"{k} {fmt(v[0], v[1])} {v[1]}" for k, v in list(figs.items())[:3])
                + f" ({wall:.0f} s)")
    except KeyboardInterrupt:
        interrupted = True
        runner.stop()
        result["failures"].append("interrupted")
    finally:
        shutil.rmtree(private, ignore_errors=True)

    rows = []
    for (bench, name), s in samples.items():
        if s["old"] and s["new"]:
            row = {"bench": bench, "name": name, "unit": s["unit"], "role": s["role"],
                   "old_samples": s["old"], "new_samples": s["new"], **compare_figure(s["old"], s["new"])}
            if s["role"] == "control" and row["verdict"] in ("new slower", "new faster"):
                # No stasis code: a difference here is the machine's, and it
                # weighs on every other figure of the same benchmark.
                row["verdict"] = "MACHINE DRIFTED between the builds' runs"
            rows.append(row)
    result["figures"] = rows
    result["runtime_s"] = time.monotonic() - t_start
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    txt = table(result)
    result["table"] = txt.splitlines()
    cc.write_json(args.json_out, result)
    print(f"stasis A/B ({mode}, {args.rounds} round(s)): old vs new\n"
          + describe("old", bins["old"]) + "\n" + describe("new", bins["new"]) + "\n")
    print(txt)
    print(f"\n(json: {args.json_out}; each run's JSON and output: {out_dir}; runtime {result['runtime_s']:.0f} s)")
    if interrupted:
        return 130
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
