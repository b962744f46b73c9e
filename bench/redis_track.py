#!/usr/bin/env python3
"""bench/redis_track: Redis under redis-benchmark load while `stasis run`
checkpoints it every 1, 5 and 10 s (the first checkpoint full, then
incremental with dirty tracking), against the same Redis run untracked in the
same run: throughput (requests/s) and p99 latency.

    sudo python3 bench/redis_track.py [--intervals 1,5,10] [--reps 2]
                                      [--window-s 20] [--tests set]
                                      [--keyspace 1000000] [--data-size 100]
                                      [--clients 50] [--track uffd] [--concurrent]
                                      [--dir DIR] [--json-out FILE]
                                      [--stasis PATH] [--wait-quiet SECS]

Each variant (untracked, every N s) is a fresh redis-server with
`--save '' --appendonly no`, filled with random keys (untimed), then loaded
by one redis-benchmark run of the same number of requests for every variant
(calibrated to last about --window-s on the untracked server). Under
`stasis run`, the timed load starts right after a checkpoint that follows
the fill, so the window holds only incremental checkpoints. redis-benchmark
is a child of this script, never part of the checkpointed tree; it talks to
Redis over TCP on 127.0.0.1.

Exit status: 1 if anything broke (a server did not start or exited badly,
redis-benchmark failed, `stasis run` failed), else 0. No time is pass/fail.
Checkpoints that `stasis run` reports as failed are counted and shown.
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True
import track_common as tc  # noqa: E402
from track_common import BenchError, log, stats  # noqa: E402

REFERENCE = {
    "ldt_redis": "LDT: Redis throughput +2% to +8% over soft-dirty tracking at 1, 5 and 10 s intervals "
                 "(YCSB 90:10 and 50:50 set:get); p99 write latency baseline 74-80 us, soft-dirty 80-92 us, "
                 "LDT 74-82 us (Table III)",
    "target": "throughput and p99 within 3% of untracked at a 1 s interval",
}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def which(name):
    p = shutil.which(name)
    if not p:
        raise BenchError(f"{name} not found (Debian: apt-get install redis-server redis-tools)")
    return p


class StasisRun:
    """`stasis run` with its JSON events read (and timestamped) as they come."""

    def __init__(self, argv, errf):
        self.argv = argv
        self.events = []
        self.lock = threading.Lock()
        self.err = open(errf, "w")
        self.errf = errf
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.err, close_fds=True, start_new_session=True, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            t = time.monotonic()
            line = line.strip()
            if not line:
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                ev = {"event": "unparsed", "line": line}
            ev["t_mono"] = t
            with self.lock:
                self.events.append(ev)

    def checkpoints(self):
        with self.lock:
            return [e for e in self.events if e.get("event") == "checkpoint"]

    def job_pid(self, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for e in self.events:
                    if e.get("event") == "started":
                        return e["pid"]
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        raise BenchError(f"`{shlex.join(self.argv)}` did not report its job: {self.stderr()}")

    def wait_checkpoint_after(self, t, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.checkpoints():
                if e["t_mono"] > t:
                    return e
            if self.proc.poll() is not None:
                raise BenchError(f"`{shlex.join(self.argv)}` exited early ({self.proc.returncode}): "
                                 f"{self.stderr()}")
            time.sleep(0.01)
        raise BenchError(f"no checkpoint within {timeout} s: {self.stderr()}")

    def stderr(self):
        if not self.err.closed:
            self.err.flush()
        with open(self.errf) as f:
            return f.read()

    def stop(self, timeout=60):
        code = tc.stop_workload(self.proc, timeout)
        self.thread.join(timeout=5)
        self.err.close()
        return code


class Bench:
    def __init__(self, args, workdir):
        self.args = args
        self.workdir = workdir
        self.server = which("redis-server")
        self.bench = which("redis-benchmark")
        self.cli = which("redis-cli")
        self.live = []

    def server_argv(self, port):
        return [self.server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--daemonize", "no"]

    def wait_ready(self, port, proc, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = subprocess.run([self.cli, "-p", str(port), "ping"], capture_output=True, text=True)
            if r.stdout.strip() == "PONG":
                return
            if proc.poll() is not None:
                raise BenchError(f"redis-server exited ({proc.returncode}) before answering PING")
            time.sleep(0.05)
        raise BenchError(f"redis-server on port {port} did not answer PING within {timeout} s")

    def info(self, port):
        r = subprocess.run([self.cli, "-p", str(port), "info"], capture_output=True, text=True)
        out = {}
        for line in r.stdout.splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.strip().split(":", 1)
                if k in ("used_memory", "used_memory_rss", "db0", "total_commands_processed", "total_forks",
                         "latest_fork_usec", "rdb_saves", "rdb_last_bgsave_status", "rdb_last_cow_size"):
                    out[k] = v
        return out

    def fill(self, port):
        """Untimed: SETs over the keyspace, pipelined, so the dataset is there."""
        a = self.args
        argv = [self.bench, "-p", str(port), "-t", "set", "-r", str(a.keyspace), "-n", str(a.keyspace),
                "-d", str(a.data_size), "-c", "16", "-P", "32", "-q"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise BenchError(f"`{shlex.join(argv)}` failed ({r.returncode}): {r.stderr}")

    def load(self, port, nreq):
        """The timed load; returns {test: {rps, avg, p50, p95, p99, max}} and the wall time."""
        a = self.args
        argv = [self.bench, "-p", str(port), "-t", a.tests, "-r", str(a.keyspace), "-n", str(nreq),
                "-d", str(a.data_size), "-c", str(a.clients), "--csv"]
        out_path = os.path.join(self.workdir, "bench.out")
        err_path = os.path.join(self.workdir, "bench.err")
        code, wall, usage, stdout, stderr = tc.dr.run_rusage(argv, out_path, err_path, timeout=a.window_s * 20 + 120)
        self.last_bench_cpu_s = usage["cpu_s"]
        if code != 0:
            raise BenchError(f"`{shlex.join(argv)}` failed ({code}): {stderr}{stdout}")
        res = {}
        lines = [x for x in stdout.splitlines() if x.startswith('"')]
        if not lines or not lines[0].startswith('"test"'):
            raise BenchError(f"redis-benchmark --csv printed no header: {stdout}")
        head = [h.strip('"') for h in lines[0].split(",")]
        for line in lines[1:]:
            vals = [v.strip('"') for v in line.split(",")]
            row = dict(zip(head, vals))
            test = row.pop("test")
            res[test.lower()] = {k: float(v) for k, v in row.items()}
        if not res:
            raise BenchError(f"redis-benchmark --csv printed no result: {stdout}")
        return res, wall, argv

    def bgsaves(self, port, stop, out):
        """BGSAVE every --bgsave seconds until `stop` is set (Redis's own
        snapshot: fork, the child writes dump.rdb into the variant's dir on
        the same file system as the images); counts what Redis answered."""
        while not stop.wait(self.args.bgsave):
            r = subprocess.run([self.cli, "-p", str(port), "bgsave"], capture_output=True, text=True)
            key = "started" if "started" in r.stdout else "refused"
            out[key] = out.get(key, 0) + 1
            if key == "refused":
                out["last_refusal"] = (r.stdout + r.stderr).strip()

    def variant(self, every, nreq, tag):
        """every = None: untracked; BGSAVE: Redis's own BGSAVE every
        --bgsave seconds, no stasis. Returns the record."""
        port = free_port()
        d = os.path.join(self.workdir, tag)
        os.makedirs(d)
        rec = {"interval_s": every, "port": port}
        run = proc = None
        saver = None
        if every is None or every == BGSAVE:
            argv = self.server_argv(port) + (["--dir", d] if every == BGSAVE else [])
            proc = tc.start_workload(argv, os.path.join(d, "redis.log"), d)
            self.live.append(proc)
            rec["server_argv"] = argv
        else:
            img = os.path.join(d, "img")
            conc = ["--concurrent", "--cow-method", self.args.cow_method] if self.args.concurrent else []
            argv = [self.args.stasis, "run", "-D", img, "--every", f"{every:g}", "--track", self.args.track,
                    "--json", "--log", os.path.join(d, "redis.log")] + conc + ["--"] + self.server_argv(port)
            rec["stasis_run_argv"] = argv
            run = StasisRun(argv, os.path.join(d, "stasis-run.err"))
            self.live.append(run.proc)
            proc = run.proc
        try:
            self.wait_ready(port, proc)
            self.fill(port)
            if run is not None:
                # Start the timed load right after a checkpoint that follows the
                # fill: the window then holds incremental checkpoints only.
                ev = run.wait_checkpoint_after(time.monotonic(), every * 3 + 60)
                rec["checkpoint_before_window"] = ev
            # Our own processes' CPU (server, stasis run with its dump
            # threads, the client): the rest of the machine's is contention.
            server_pid = run.job_pid() if run is not None else proc.pid
            ours = [server_pid] + ([run.proc.pid] if run is not None else [])
            cpu0 = sum(tc.dr.proc_cpu_s(q) for q in ours)
            busy0 = tc.dr.cpu_busy_s()
            if every == BGSAVE:
                stop, saves = threading.Event(), {}
                saver = threading.Thread(target=self.bgsaves, args=(port, stop, saves), daemon=True)
                saver.start()
            t0 = time.monotonic()
            res, wall, bargv = self.load(port, nreq)
            t1 = time.monotonic()
            if saver is not None:
                stop.set()
                saver.join()
                rec["bgsave_answers"] = saves
            rec["machine_busy_cpu_s"] = tc.dr.cpu_busy_s() - busy0
            rec["own_cpu_s"] = sum(tc.dr.proc_cpu_s(q) for q in ours) - cpu0 + self.last_bench_cpu_s
            rec["other_cpu_s"] = max(0.0, rec["machine_busy_cpu_s"] - rec["own_cpu_s"])
            rec["benchmark_argv"] = bargv
            rec["result"] = res
            rec["wall_s"] = wall
            rec["info_after"] = self.info(port)
            if saver is not None and rec["info_after"].get("rdb_last_bgsave_status") != "ok":
                raise BenchError(f"a BGSAVE failed: {rec['info_after']}")
            if run is not None:
                cps = run.checkpoints()
                rec["checkpoints_all"] = [{k: e.get(k) for k in ("checkpoint", "kind", "pages", "bytes",
                                                                  "frozen_us", "total_us", "parent", "t_mono")}
                                          for e in cps]
                inwin = [e for e in cps if t0 <= e["t_mono"] <= t1]
                rec["checkpoints_in_window"] = len(inwin)
                rec["window_frozen_s"] = sum(e["frozen_us"] for e in inwin) / 1e6
                rec["window_pages"] = [e["pages"] for e in inwin]
                rec["window_frozen_ms"] = [e["frozen_us"] / 1e3 for e in inwin]
                rec["full_pages"] = next((e["pages"] for e in cps if e.get("parent") is None), None)
                code = run.stop()
                err = run.stderr()
                rec["checkpoint_failures"] = [line for line in err.splitlines() if "checkpoint failed" in line]
                rec["stasis_run_exit"] = code
                exited = [e for e in run.events if e.get("event") == "exited"]
                if code != 0 or not exited or exited[-1].get("code") != 0:
                    raise BenchError(f"`{shlex.join(run.argv)}` ended with {code} (job: {exited}): {err}")
            else:
                code = tc.stop_workload(proc)
                if code != 0:
                    raise BenchError(f"redis-server exited with {code}: {open(os.path.join(d, 'redis.log')).read()}")
            self.live.remove(proc)
        except BaseException:
            tc.kill_quietly(proc)
            raise
        shutil.rmtree(d, ignore_errors=True)
        return rec

    def calibrate(self):
        """Requests for about --window-s on an untracked, filled server."""
        port = free_port()
        d = os.path.join(self.workdir, "calibrate")
        os.makedirs(d)
        proc = tc.start_workload(self.server_argv(port), os.path.join(d, "redis.log"), d)
        self.live.append(proc)
        try:
            self.wait_ready(port, proc)
            self.fill(port)
            n = 200000
            res, wall, _ = self.load(port, n)
            rps = min(v["rps"] for v in res.values())
            tc.stop_workload(proc)
            self.live.remove(proc)
        except BaseException:
            tc.kill_quietly(proc)
            raise
        shutil.rmtree(d, ignore_errors=True)
        ntests = len(res)
        return max(10000, int(rps * self.args.window_s / ntests)), rps, wall


BGSAVE = "bgsave"


def label(every):
    if every == BGSAVE:
        return "BGSAVE"
    return "untracked" if every is None else f"every {every:g} s"


def tracked(every):
    return every is not None and every != BGSAVE


def summarize(records, variants, tests):
    out = {}
    base = [r for r in records if r["interval_s"] is None]
    for v in variants:
        recs = [r for r in records if r["interval_s"] == v]
        if not recs:
            continue
        s = {"reps": len(recs)}
        for t in tests:
            rps = [r["result"][t]["rps"] for r in recs]
            p99 = [r["result"][t]["p99_latency_ms"] for r in recs]
            p50 = [r["result"][t]["p50_latency_ms"] for r in recs]
            mx = [r["result"][t]["max_latency_ms"] for r in recs]
            s[t] = {"rps": stats(rps), "p99_ms": stats(p99), "p50_ms": stats(p50), "max_ms": stats(mx)}
            if base and v is not None:
                brps = tc.med([r["result"][t]["rps"] for r in base])
                bp99 = tc.med([r["result"][t]["p99_latency_ms"] for r in base])
                s[t]["rps_vs_untracked"] = s[t]["rps"]["median"] / brps
                s[t]["p99_vs_untracked"] = s[t]["p99_ms"]["median"] / bp99
                # paired with the untracked run of the same rep
                pairs = [(r, b) for r in recs for b in base if b["rep"] == r["rep"]]
                s[t]["rps_vs_untracked_per_rep"] = [r["result"][t]["rps"] / b["result"][t]["rps"] for r, b in pairs]
        if v == BGSAVE:
            s["bgsave_answers"] = [r.get("bgsave_answers") for r in recs]
            s["forks"] = [r["info_after"].get("total_forks") for r in recs]
            s["latest_fork_usec"] = [r["info_after"].get("latest_fork_usec") for r in recs]
        if tracked(v):
            s["checkpoints_in_window"] = [r["checkpoints_in_window"] for r in recs]
            s["window_frozen_s"] = [r["window_frozen_s"] for r in recs]
            s["frozen_share_of_window"] = [r["window_frozen_s"] / r["wall_s"] for r in recs]
            s["incremental_pages_median"] = tc.med([p for r in recs for p in r["window_pages"]] or [0])
            s["incremental_frozen_ms_median"] = tc.med([p for r in recs for p in r["window_frozen_ms"]] or [0])
            s["full_pages"] = [r["full_pages"] for r in recs]
            s["checkpoint_failures"] = sum(len(r["checkpoint_failures"]) for r in recs)
        s["wall_s"] = stats([r["wall_s"] for r in recs])
        s["other_cpu_s"] = [r["other_cpu_s"] for r in recs]
        s["machine_busy_cpu_s"] = stats([r["machine_busy_cpu_s"] for r in recs])
        out[label(v)] = s
    return out


def table(summary, variants, tests, args, nreq):
    lines = [f"Redis {','.join(tests)} under redis-benchmark ({nreq} requests a test, {args.clients} clients, keyspace "
             f"{args.keyspace}, {args.data_size}-byte values), `stasis run --every N --track {args.track}"
             f"{' --concurrent' if args.concurrent else ''}` vs "
             f"untracked; {args.reps} reps, median [min-max]", ""]
    lines.append(f"{'variant':12} {'test':5} {'requests/s':>25} {'vs untr.':>8} {'[per rep]':>16} {'p99 ms':>19} {'vs untr.':>8} "
                 f"{'max ms':>8}  {'ckpts in window, frozen share, median incr. pages / frozen ms':>10}")
    for v in variants:
        s = summary.get(label(v))
        if not s:
            continue
        for i, t in enumerate(tests):
            x = s[t]
            r, p = x["rps"], x["p99_ms"]
            rr = f"{x['rps_vs_untracked']:.3f}x" if "rps_vs_untracked" in x else ""
            per = x.get("rps_vs_untracked_per_rep") or []
            per_txt = ("[" + " ".join(f"{q:.2f}" for q in per) + "]") if per else ""
            pr = f"{x['p99_vs_untracked']:.2f}x" if "p99_vs_untracked" in x else ""
            extra = ""
            if v == BGSAVE and i == 0:
                extra = (f"BGSAVE every {args.bgsave:g} s: forks " + "/".join(str(f) for f in s["forks"])
                         + ", last fork " + "/".join(f"{int(u) / 1e3:.1f}" for u in s["latest_fork_usec"] if u)
                         + " ms (no stasis)")
            if tracked(v) and i == 0:
                share = s["frozen_share_of_window"]
                extra = (f"{'/'.join(str(c) for c in s['checkpoints_in_window'])} ckpts, frozen "
                         f"{100 * tc.med(share):.1f}% of the time, {s['incremental_pages_median']:.0f} pages / "
                         f"{s['incremental_frozen_ms_median']:.0f} ms each")
                if s["checkpoint_failures"]:
                    extra += f", {s['checkpoint_failures']} failed"
            lines.append(f"{label(v) if i == 0 else '':12} {t:5} "
                         f"{r['median']:9.0f} [{r['min']:.0f}-{r['max']:.0f}] {rr:>8} {per_txt:>16} "
                         f"{p['median']:6.3f} [{p['min']:.3f}-{p['max']:.3f}] {pr:>8} "
                         f"{x['max_ms']['median']:8.1f}  {extra}")
    lines.append("")
    full = [p for v in variants if tracked(v) and label(v) in summary for p in summary[label(v)]["full_pages"]
            if p]
    if full:
        lines.append(f"full checkpoint (the first of each `stasis run`, during or after the fill): {tc.med(full):.0f} "
                     "pages median; incremental pages: median over the checkpoints inside the timed window")
    lines.append("other processes' CPU s during each timed load (> ~1 s: the machine was shared, the figures are "
                 "pessimistic or noisy): " + "; ".join(
                     f"{label(v)} " + ", ".join(f"{x:.1f}" for x in summary[label(v)]["other_cpu_s"])
                     for v in variants if label(v) in summary))
    lines.append("vs untr.: median of the variant / median of untracked (requests/s: > 1 is faster; p99: > 1 is "
                 "slower); [per rep]: requests/s / the untracked run of the same rep. frozen share: sum of frozen_us of the checkpoints inside the window / window length.")
    lines.append("target (issue): >= 0.97x untracked throughput and p99 <= 1.5x at 1 s, and better than Redis's own "
                 "BGSAVE every second (the BGSAVE row).")
    lines.append("earlier target: within 3% of untracked at 1 s. LDT paper: +2% to +8% throughput over soft-dirty; "
                 "p99 write latency 74-80 us untracked, 80-92 us soft-dirty, 74-82 us LDT.")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--intervals", default="1,5,10", help="seconds between checkpoints, comma-separated")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--window-s", type=float, default=20.0, help="length of the timed load, about (default 20)")
    ap.add_argument("--tests", default="set", help="redis-benchmark -t tests (default set; e.g. set,get)")
    ap.add_argument("--keyspace", type=int, default=1000000, help="redis-benchmark -r (default 1000000)")
    ap.add_argument("--data-size", type=int, default=100, help="redis-benchmark -d (default 100)")
    ap.add_argument("--clients", type=int, default=50, help="redis-benchmark -c (default 50)")
    ap.add_argument("--track", default="uffd", help="stasis run --track (default uffd)")
    ap.add_argument("--concurrent", action="store_true",
                    help="stasis run --concurrent (memory copied from copy-on-write snapshots while Redis runs on)")
    ap.add_argument("--cow-method", default="auto", help="with --concurrent: stasis run --cow-method (default auto)")
    ap.add_argument("--bgsave", type=float, default=1.0,
                    help="also a variant with no stasis and Redis's own BGSAVE every SECS (default 1; 0: none)")
    ap.add_argument("--dir", default=None, help="work dir for images (default: a fresh dir under /dev/shm)")
    ap.add_argument("--json-out", default=os.path.join(tc.RESULTS, "redis_track.json"))
    ap.add_argument("--stasis", default=tc.DEFAULT_STASIS)
    tc.add_quiet_option(ap)
    args = ap.parse_args()
    try:
        intervals = [float(x) for x in args.intervals.split(",") if x]
    except ValueError:
        ap.error("--intervals: comma-separated seconds")
    if not intervals or min(intervals) <= 0 or args.reps <= 0 or args.window_s <= 0:
        ap.error("--intervals, --reps, --window-s must be positive")
    tests = [t.strip().lower() for t in args.tests.split(",") if t.strip()]
    args.stasis = os.path.abspath(args.stasis)
    if not tc.check_root_and_binary("redis_track", args.stasis):
        return 1

    t_start = time.monotonic()
    workdir, fstype = tc.make_workdir(args.dir, "redis")
    result = tc.result_header("redis_track", args, args.stasis, workdir, fstype, REFERENCE)
    variants = [None] + intervals + ([BGSAVE] if args.bgsave > 0 else [])
    records, failure, nreq = [], None, None
    try:
        b = Bench(args, workdir)
        result["redis_version"] = subprocess.run([b.server, "--version"], capture_output=True,
                                                 text=True).stdout.strip()
        nreq, rps0, wall0 = b.calibrate()
        result["calibration"] = {"rps": rps0, "requests_per_test": nreq}
        log(f"work dir {workdir} ({fstype}); calibration: {rps0:.0f} requests/s untracked -> {nreq} requests "
            f"per test (~{args.window_s:g} s)")
        for rep in range(args.reps):
            order = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for v in order:
                quiet = tc.wait_quiet(args.wait_quiet)
                rec = b.variant(v, nreq, f"r{rep}-{label(v).replace(' ', '')}")
                rec["rep"] = rep
                rec["quiet_wait_s"] = quiet
                records.append(rec)
                first = rec["result"][tests[0]]
                msg = f"rep {rep + 1}/{args.reps}, {label(v)}: {first['rps']:.0f} requests/s, p99 " \
                      f"{first['p99_latency_ms']:.3f} ms, {rec['wall_s']:.1f} s"
                if tracked(v):
                    msg += (f"; {rec['checkpoints_in_window']} checkpoints in the window, frozen "
                            f"{rec['window_frozen_s'] * 1e3:.0f} ms in all")
                    if rec["checkpoint_failures"]:
                        msg += f"; {len(rec['checkpoint_failures'])} checkpoint(s) failed"
                log(msg)
    except BenchError as e:
        failure = str(e)
        log(f"redis_track: FAILED: {e}")
    except BaseException:
        for p in getattr(locals().get("b"), "live", []):
            tc.kill_quietly(p)
        raise
    for p in getattr(locals().get("b"), "live", []):
        tc.kill_quietly(p)

    summary = summarize(records, variants, tests) if records else {}
    txt = table(summary, variants, tests, args, nreq) if summary else "(no results)"
    result.update({"records": records, "summary": summary, "failure": failure})
    return tc.finish("redis_track", args, result, txt, t_start, workdir, failure)


if __name__ == "__main__":
    sys.exit(main())
