"""bench/concurrent_common: helpers shared by the concurrent-checkpoint
benchmarks (concurrent_downtime.py, rt_latency.py, random_writer.py). Not a
benchmark itself.

It builds on dump_restore.py's helpers (rusage runner, machine and git info)
and adds: compiling the workloads (with libm and pthreads), starting a
checkpointable workload in its own session, running `stasis -vv dump --json`
with the CLOCK_MONOTONIC times of its start and end and the phase times of
its debug log, a watcher that samples the workload's state every 0.5 ms
(how long it was really stopped) and the memory its copy-on-write snapshot
holds, waiting for a quiet machine, a restore check of a concurrent image,
and the common header of every result JSON.
"""

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True  # no bench/__pycache__
import dump_restore as dr  # noqa: E402
from dump_restore import BenchError, log  # noqa: E402,F401  (re-exported)
from track_common import (  # noqa: E402,F401  (re-exported)
    check_root_and_binary, finish, make_workdir, med, result_header, stasis_info, stats, write_json)

REPO = dr.REPO
BUILD = dr.BUILD
RESULTS = os.path.join(BENCH, "results")
DEFAULT_STASIS = dr.STASIS
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def compile_workloads(names):
    """bench/workloads/<name>.c -> bench/build/<name> when stale (libraries
    after the source, so that --as-needed linkers keep them)."""
    os.makedirs(BUILD, exist_ok=True)
    out = {}
    hdr = os.path.join(BENCH, "workloads", "bench.h")
    for name in names:
        src = os.path.join(BENCH, "workloads", name + ".c")
        exe = os.path.join(BUILD, name)
        if not os.path.exists(exe) or os.path.getmtime(exe) < max(os.path.getmtime(src), os.path.getmtime(hdr)):
            cmd = ["cc", "-O2", "-Wall", "-Wextra", "-pthread", "-o", exe, src, "-lm"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise BenchError(f"compiling {src} failed:\n{r.stderr}")
        out[name] = exe
    return out


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def set_subreaper():
    """Makes us a child subreaper (restored processes are re-parented to
    us), and turns SIGTERM into KeyboardInterrupt so that the benchmarks'
    clean-up (kill the workloads) runs."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(dr.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise BenchError("prctl(PR_SET_CHILD_SUBREAPER) failed")


def reap_orphans():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# ---------------------------------------------------------------- workloads

class Workload:
    """A checkpointable workload: stdin /dev/null, stdout and stderr to a
    regular file, no inherited fds, its own session. In argv, "@PIDFILE@"
    and "@DATAFILE@" stand for its pid file and a data file (tag.bin) in
    the work dir."""

    def __init__(self, argv, workdir, tag):
        self.logf = os.path.join(workdir, f"{tag}.log")
        self.pidfile = os.path.join(workdir, f"{tag}.pid")
        self.datafile = os.path.join(workdir, f"{tag}.bin")
        self.argv = [{"@PIDFILE@": self.pidfile, "@DATAFILE@": self.datafile}.get(a, a) for a in argv]
        argv = self.argv
        for p in (self.pidfile, self.pidfile + ".tmp", self.logf, self.datafile):
            if os.path.exists(p):
                os.unlink(p)
        with open(self.logf, "a") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         close_fds=True, cwd=workdir, start_new_session=True)
        self.pid = self.proc.pid

    def output(self):
        with open(self.logf) as f:
            return f.read()

    def wait_ready(self, timeout=180):
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.pidfile):
            if self.proc.poll() is not None:
                raise BenchError(f"{self.argv[0]} exited ({self.proc.returncode}) before it was ready: "
                                 f"{self.output()}")
            if time.monotonic() > deadline:
                raise BenchError(f"{self.argv[0]}: no pid file within {timeout} s")
            time.sleep(0.005)
        with open(self.pidfile) as f:
            pid = int(f.read().strip())
        if pid != self.pid:
            raise BenchError(f"{self.argv[0]}: pid file says {pid}, child is {self.pid}")

    def alive(self):
        return self.proc.poll() is None

    def stop(self, timeout=120):
        """SIGTERM, reap; the workload must exit 0 and end with PASS.
        Returns its output lines."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise BenchError(f"{self.argv[0]} (pid {self.pid}) did not exit within {timeout} s of SIGTERM")
        out = self.output()
        lines = out.strip().splitlines()
        if rc != 0 or not lines or lines[-1] != "PASS":
            raise BenchError(f"{self.argv[0]} (pid {self.pid}) ended with {rc}, output:\n{out}")
        return lines

    def kill(self):
        if self.proc.poll() is None:
            try:
                self.proc.kill()
                self.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


def proc_cpu_s(pid):
    try:
        return dr.proc_cpu_s(pid)
    except (OSError, IndexError, ValueError):
        return None


def proc_state(pid):
    """State letter of the main thread of `pid` (None if gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read()
        return chr(s[s.rindex(b")") + 2])
    except (OSError, ValueError, IndexError):
        return None


def children_of(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def anon_huge_kib(pid):
    """AnonHugePages of `pid` (smaps_rollup), KiB."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def private_kib(pid):
    """Private_Clean + Private_Dirty of `pid` (smaps_rollup), KiB: for a
    snapshot, the pages it alone holds (see Watcher)."""
    tot = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Private_Clean:") or line.startswith("Private_Dirty:"):
                    tot += int(line.split()[1])
    except (OSError, ValueError):
        return None
    return tot


class Watcher:
    """While a dump runs: samples the workload's main-thread state every
    `interval` s (stopped = ptrace stop 't' or 'T'), and every 100 ms the
    private memory of its snapshot children: what a snapshot holds that the
    process no longer maps (the originals of pages it wrote since the
    snapshot), plus the private copies that the dumper's own reads make
    (process_vm_readv pins pages, and pinning a page shared with the process
    copies it: "unshare"), until each 32 MiB piece is freed. Resolution of
    the stopped times: about one interval."""

    def __init__(self, pid, interval=0.0005, cow=True):
        self.pid = pid
        self.interval = interval
        self.cow = cow
        self.done = threading.Event()
        self.stops = []          # [start_ns, end_ns]
        self.samples = 0
        self.prev_sample = None
        self.max_sample_gap_ns = 0
        self.cow_peak_kib = 0
        self.cow_samples = 0
        self.threads = [threading.Thread(target=self._state, daemon=True)]
        if cow:
            self.threads.append(threading.Thread(target=self._cow, daemon=True))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        for t in self.threads:
            t.join()
        return False

    def _state(self):
        # Each stop is recorded from the last sample that saw the process
        # running to the first that sees it running again: an upper bound,
        # whatever the sampling delays (on a busy machine this thread may
        # sleep longer than asked).
        cur = None
        last_run = None
        while not self.done.is_set():
            st = proc_state(self.pid)
            now = time.monotonic_ns()
            self.samples += 1
            if self.prev_sample is not None:
                self.max_sample_gap_ns = max(self.max_sample_gap_ns, now - self.prev_sample)
            self.prev_sample = now
            stopped = st in ("t", "T")
            if stopped and cur is None:
                cur = [last_run if last_run is not None else now, now]
                self.stops.append(cur)
            elif stopped:
                cur[1] = now
            else:
                if cur is not None:
                    cur[1] = now
                    cur = None
                last_run = now
            time.sleep(self.interval)

    def _cow(self):
        while not self.done.is_set():
            for c in children_of(self.pid):
                kib = private_kib(c)
                if kib is not None:
                    self.cow_samples += 1
                    self.cow_peak_kib = max(self.cow_peak_kib, kib)
            self.done.wait(0.1)

    def summary(self, t0_ns):
        """Stops as (start, length) in ms from t0_ns (upper bounds: from the
        last sample that saw the process run); total and longest."""
        stops = [((a - t0_ns) / 1e6, (b - a) / 1e6) for a, b in self.stops]
        return {
            "stops_ms": [[round(s, 3), round(l, 3)] for s, l in stops],
            "stopped_total_ms": sum(l for _, l in stops),
            "longest_stop_ms": max((l for _, l in stops), default=0.0),
            "state_samples": self.samples,
            "max_sample_gap_ms": self.max_sample_gap_ns / 1e6,
            "snapshot_private_peak_bytes": self.cow_peak_kib * 1024 if self.cow else None,
            "snapshot_samples": self.cow_samples if self.cow else None,
        }


def busy_other_s(b0, b1, pids_cpu0, pids_cpu1):
    """Machine busy CPU seconds minus those of the listed processes."""
    own = sum((c1 - c0) for c0, c1 in zip(pids_cpu0, pids_cpu1) if c0 is not None and c1 is not None)
    return max(0.0, (b1 - b0) - own)


def wait_quiet(max_s, own_pids=(), window_s=1.0, busy_share=0.10):
    """Waits (at most max_s) for a window of window_s seconds in which the
    rest of the machine (all but `own_pids`, our running workloads) used less
    than busy_share of one CPU. Returns the seconds waited, or None if it
    never went quiet (the caller records that and carries on)."""
    if max_s <= 0:
        return 0.0
    t0 = time.monotonic()
    while True:
        c0 = [proc_cpu_s(p) for p in own_pids]
        b0 = dr.cpu_busy_s()
        time.sleep(window_s)
        b1 = dr.cpu_busy_s()
        c1 = [proc_cpu_s(p) for p in own_pids]
        if busy_other_s(b0, b1, c0, c1) < busy_share * window_s:
            return time.monotonic() - t0
        if time.monotonic() - t0 >= max_s:
            return None


def parse_phases(stderr):
    """{message: ms since the freeze} from the `-vv` debug log of a dump."""
    out = {}
    for line in ANSI.sub("", stderr).splitlines():
        if "ms=" not in line or "DEBUG" not in line:
            continue
        body = line.split("DEBUG", 1)[1].strip()
        ms = re.search(r"\bms=([0-9.]+)", body)
        msg = re.split(r"\s+\w+=", body, maxsplit=1)[0].strip()
        if ms:
            key = msg
            k = 2
            while key in out:  # one line per process
                key = f"{msg} #{k}"
                k += 1
            out[key] = float(ms.group(1))
    return out


class Dumper:
    def __init__(self, stasis, workdir, cow_method=None):
        self.stasis = stasis
        self.workdir = workdir
        self.seq = 0
        # --cow-method for the concurrent dumps (None: stasis's default).
        self.cow_method = cow_method

    def dump(self, wl, img, concurrent, cow_buffer=None, watch=True, timeout=600):
        """One `stasis -vv dump --leave-running [--concurrent] --json` of the
        workload `wl`. Returns a record: the stasis JSON, the wall time and
        the CLOCK_MONOTONIC ns of the command's start and end, rusage,
        the phases from the debug log, and what the watcher saw."""
        argv = [self.stasis, "-vv", "dump", "-t", str(wl.pid), "-D", img, "--leave-running", "--json"]
        if concurrent:
            argv.append("--concurrent")
            if cow_buffer is not None:
                argv += ["--cow-buffer", str(cow_buffer)]
            if self.cow_method:
                argv += ["--cow-method", self.cow_method]
        self.seq += 1
        base = os.path.join(self.workdir, f"dump{self.seq}")
        wcpu0 = proc_cpu_s(wl.pid)
        b0 = dr.cpu_busy_s()
        watcher = Watcher(wl.pid, cow=concurrent) if watch else None
        t0 = time.monotonic_ns()
        if watcher:
            with watcher:
                rc, wall, usage, stdout, stderr = dr.run_rusage(argv, base + ".out", base + ".err", timeout=timeout)
        else:
            rc, wall, usage, stdout, stderr = dr.run_rusage(argv, base + ".out", base + ".err", timeout=timeout)
        t1 = time.monotonic_ns()
        b1 = dr.cpu_busy_s()
        wcpu1 = proc_cpu_s(wl.pid)
        if rc != 0:
            raise BenchError(f"`{shlex.join(argv)}` failed (exit {rc}):\n{stderr[-4000:]}{stdout}")
        d = dr.parse_json_line(stdout, shlex.join(argv))
        for p in (base + ".out", base + ".err"):
            os.unlink(p)
        if d.get("killed"):
            raise BenchError(f"`{shlex.join(argv)}` killed the process: {d}")
        if concurrent and not d.get("concurrent"):
            raise BenchError(f"`{shlex.join(argv)}`: no \"concurrent\" figures in its report: {d}")
        if not wl.alive():
            raise BenchError(f"the workload (pid {wl.pid}) died during `{shlex.join(argv)}`: {wl.output()}")
        wl_cpu = (wcpu1 - wcpu0) if wcpu0 is not None and wcpu1 is not None else None
        c = d.get("concurrent") or {}
        rec = {
            "mode": "concurrent" if concurrent else "stop-the-world",
            "cow_buffer": cow_buffer if concurrent else None,
            "argv": argv,
            "t_start_ns": t0,
            "t_end_ns": t1,
            "wall_s": wall,
            "total_ms": d["total_us"] / 1e3,
            "frozen_ms": d["frozen_us"] / 1e3,
            "method": c.get("method"),
            "reap_stop_ms": c.get("reap_stop_us", 0) / 1e3,
            "prepare_stop_ms": c.get("prepare_stop_us", 0) / 1e3,
            # The concurrent dump's other stop: the reap (fork) or the
            # prepare stop before the freeze (uffd).
            "extra_stop_ms": (c.get("reap_stop_us", 0) + c.get("prepare_stop_us", 0)) / 1e3,
            "fault_p50_us": c.get("fault_p50_us"),
            "fault_p99_us": c.get("fault_p99_us"),
            "writer_waits": c.get("writer_waits"),
            "fallback": c.get("fallback"),
            # The freeze, plus the other stop and any cap pause (as the
            # watcher saw it) of a concurrent dump.
            "pause_ms_observed": 0.0,
            "downtime_ms": (d["frozen_us"] + c.get("reap_stop_us", 0) + c.get("prepare_stop_us", 0)) / 1e3,
            "pages": d["pages"],
            "bytes": d["bytes"],
            "paused": c.get("paused"),
            "write_faults": c.get("write_faults"),
            "cow_peak_bytes": c.get("cow_peak_bytes"),
            "pages_after_release": c.get("pages_after_release"),
            "phases_ms": parse_phases(stderr),
            "usage": usage,
            "workload_cpu_s": wl_cpu,
            "other_cpu_s": max(0.0, (b1 - b0) - usage["cpu_s"] - (wl_cpu or 0.0)),
            "raw": d,
        }
        if watcher:
            w = watcher.summary(t0)
            rec["watched"] = w
            # A --cow-buffer pause is not timed by stasis: take it from the
            # watcher, as the stops seen after the freeze (the first stop
            # seen + frozen_ms) less the reap stop.
            if c.get("paused") and w["stops_ms"]:
                freeze_end = w["stops_ms"][0][0] + rec["frozen_ms"]
                after = sum(l for s, l in w["stops_ms"] if s >= freeze_end)
                rec["pause_ms_observed"] = max(0.0, after - rec["extra_stop_ms"])
                rec["downtime_ms"] += rec["pause_ms_observed"]
        return rec


def restore_check(stasis, img, wl, workdir, run_s=1.0):
    """Restores the latest checkpoint of `img` (the workload `wl` must have
    exited: its PID must be free), lets it run `run_s` s, then SIGTERMs it;
    it must print PASS again (its log continues in the same file) and exit
    0. Returns a short record."""
    argv = [stasis, "restore", "-D", img, "--detach", "--json"]
    rc, wall, _usage, stdout, stderr = dr.run_rusage(
        argv, os.path.join(workdir, "restore.out"), os.path.join(workdir, "restore.err"))
    if rc != 0:
        raise BenchError(f"`{shlex.join(argv)}` failed (exit {rc}):\n{stderr}{stdout}")
    r = dr.parse_json_line(stdout, shlex.join(argv))
    pid = r["pid"]
    n_before = len(wl.output().strip().splitlines())
    time.sleep(run_s)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    status = dr.wait_pid(pid, 120, "restored process")
    code = os.waitstatus_to_exitcode(status)
    lines = wl.output().strip().splitlines()
    new = lines[n_before:]
    if code != 0 or not new or new[-1] != "PASS":
        raise BenchError(f"the process restored from {img} (pid {pid}) failed (exit {code}); new output:\n"
                         + "\n".join(new))
    return {"restored_pid": pid, "restore_wall_s": wall, "ran_s": run_s, "output": new}


def fmt_pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def mib(b):
    return "-" if b is None else f"{b / 2**20:.0f}M"
