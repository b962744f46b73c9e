"""bench/track_common: helpers shared by the incremental-checkpoint and
dirty-tracking benchmarks (ldt.py, collect.py, matmul_incremental.py,
redis_track.py, big_incremental.py). Not a benchmark itself.

It builds on dump_restore.py's helpers (compile step, rusage runner, machine
and git info) and adds: starting a checkpointable workload in its own
session, running `stasis dump --json`, waiting for a workload's files, the
common header of every result JSON, and writing it atomically.
"""

import datetime
import hashlib
import json
import os
import queue
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True  # no bench/__pycache__
import dump_restore as dr  # noqa: E402
from dump_restore import BenchError, log  # noqa: E402,F401  (re-exported)

REPO = dr.REPO
BUILD = dr.BUILD
RESULTS = os.path.join(BENCH, "results")
DEFAULT_STASIS = dr.STASIS


def med(values):
    return statistics.median(values)


def stats(values):
    """median, min, max, n of a list (None if empty)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": med(values), "min": min(values), "max": max(values), "n": len(values)}


def check_root_and_binary(name, stasis):
    if os.geteuid() != 0:
        log(f"{name}: needs root (ptrace, userfaultfd in the target): run with sudo")
        return False
    if not os.access(stasis, os.X_OK):
        log(f"{name}: {stasis} not found: run `cargo build --release` first")
        return False
    return True


def make_workdir(dir_arg, name):
    """A fresh directory under DIR (default /dev/shm); warns if not tmpfs."""
    base = dir_arg or "/dev/shm"
    os.makedirs(base, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix=f"stasis-bench-{name}-", dir=base)
    fstype = dr.fs_type(workdir)
    if fstype != "tmpfs":
        log(f"{name}: warning: {workdir} is on {fstype}, not tmpfs; the figures are not comparable")
    return workdir, fstype


def stasis_info(stasis):
    """The binary (SHA-256, mtime) and, if it is this checkout's
    target/release/stasis, the commit and modified tracked files."""
    h = hashlib.sha256()
    with open(stasis, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    info = {"binary": stasis, "binary_sha256": h.hexdigest(),
            "binary_mtime_utc": datetime.datetime.fromtimestamp(
                os.path.getmtime(stasis), datetime.timezone.utc).isoformat(timespec="seconds")}
    git = dr.git_info()
    if os.path.abspath(stasis).startswith(os.path.join(REPO, "target") + os.sep):
        info.update(git)
    else:
        info["bench_checkout"] = git
    return info


def result_header(name, args, stasis, workdir, fstype, reference):
    return {
        "benchmark": name,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable] + sys.argv),
        "params": {**{k: v for k, v in vars(args).items()}, "workdir": workdir, "fs_type": fstype},
        "machine": dr.machine_info(),
        "stasis": stasis_info(stasis),
        "reference": reference,
    }


def write_json(path, result):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)


def finish(name, args, result, txt, t_start, workdir, failure=None):
    """The common end of a benchmark: runtime, table and load at the end go
    into `result`, which is written to args.json_out; the table is printed.
    The work dir is removed, unless something failed (then it is left for
    inspection and the exit status is 1)."""
    result.update({"runtime_s": time.monotonic() - t_start, "table": txt.splitlines()})
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    write_json(args.json_out, result)
    print(txt)
    print(f"\n(json: {args.json_out}; runtime {result['runtime_s']:.0f} s)")
    if failure:
        log(f"{name}: work dir left for inspection: {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def wait_file(path, proc, timeout, what, logf=None):
    """Waits until `path` exists; fails if `proc` (a Popen) exits first."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc is not None and proc.poll() is not None:
            out = open(logf).read() if logf and os.path.exists(logf) else ""
            raise BenchError(f"{what} exited ({proc.returncode}) before writing {path}: {out}")
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: {path} did not appear within {timeout} s")
        time.sleep(0.002)


def read_kv(path):
    """A file of "key value" lines, as numbers where they parse."""
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split(None, 1)
            if len(parts) != 2:
                continue
            k, v = parts[0], parts[1].strip()
            try:
                out[k] = int(v)
            except ValueError:
                try:
                    out[k] = float(v)
                except ValueError:
                    out[k] = v
    return out


def start_workload(argv, logf, cwd, env=None):
    """Starts a workload Stasis can checkpoint: stdin /dev/null, stdout and
    stderr appended to a regular file, no inherited descriptors, its own
    session and process group (so it shares no terminal or pipe with us)."""
    with open(logf, "a") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                close_fds=True, cwd=cwd, start_new_session=True, env=env)


def stop_workload(proc, timeout=60, sig=signal.SIGTERM):
    """Sends `sig` and reaps; returns the exit code (negative: signal)."""
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise BenchError(f"pid {proc.pid} did not exit within {timeout} s of signal {sig}")


def kill_quietly(proc):
    if proc is not None and proc.poll() is None:
        try:
            proc.kill()
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


class Dumper:
    """Runs `stasis dump --json` and keeps the exact commands for the report."""

    def __init__(self, stasis, workdir):
        self.stasis = stasis
        self.workdir = workdir
        self.seq = 0

    def dump(self, pid, img, leave_running=True, track=None, timeout=600, extra=()):
        """Returns the stasis JSON report plus wall_s, rusage and argv."""
        argv = [self.stasis, "dump", "-t", str(pid), "-D", img, "--json"]
        if leave_running:
            argv.append("--leave-running")
        if track:
            argv += ["--track", track]
        argv += list(extra)
        self.seq += 1
        base = os.path.join(self.workdir, f"dump{self.seq}")
        rc, wall, usage, stdout, stderr = dr.run_rusage(argv, base + ".out", base + ".err", timeout=timeout)
        if rc != 0:
            raise BenchError(f"`{shlex.join(argv)}` failed (exit {rc}):\n{stderr}{stdout}")
        d = dr.parse_json_line(stdout, shlex.join(argv))
        for p in (base + ".out", base + ".err"):
            os.unlink(p)
        return {**d, "wall_s": wall, "usage": usage, "argv": argv}


def vmflags_of(pid, addr):
    """VmFlags of the area of process `pid` containing `addr` (None if none)."""
    cur = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                s, e = head.split("-")
                try:
                    cur = int(s, 16) <= addr < int(e, 16)
                except ValueError:
                    pass
            elif cur and line.startswith("VmFlags:"):
                return line.split()[1:]
    return None


def largest_anon_area(pid):
    """(start, end, vmflags) of the largest anonymous mapping of `pid`."""
    best = None
    cur = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if parts and "-" in parts[0] and not parts[0].endswith(":"):
                s, e = (int(x, 16) for x in parts[0].split("-"))
                anon = len(parts) < 6  # no path column
                cur = [s, e, None] if anon else None
            elif cur is not None and line.startswith("VmFlags:"):
                cur[2] = line.split()[1:]
                if best is None or cur[1] - cur[0] > best[1] - best[0]:
                    best = tuple(cur)
    return best


def wait_quiet(max_s, window_s=1.0, busy_share=0.05):
    """Waits (at most max_s) for a window of window_s seconds in which the
    whole machine used less than busy_share of one CPU (other sessions'
    builds and tests share this VM). Returns the seconds waited, or None if
    the machine never went quiet (the caller records it and carries on)."""
    if max_s <= 0:
        return 0.0
    t0 = time.monotonic()
    while True:
        b0 = dr.cpu_busy_s()
        time.sleep(window_s)
        if dr.cpu_busy_s() - b0 < busy_share * window_s:
            return time.monotonic() - t0
        if time.monotonic() - t0 >= max_s:
            return None


def add_quiet_option(ap):
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECS",
                    help="before each measurement, wait up to SECS for a second in which the machine is idle "
                         "(other work shares this VM); 0 (default): do not wait")


class RunSupervisor:
    """`stasis run --concurrent --cow-method uffd` over the workload, its
    checkpoints asked for through the request socket it gives the job
    (`STASIS_RUN_REQUEST`; protocol in crates/stasis-supervise/src/request.rs),
    its JSON events read from its stdout."""

    def __init__(self, stasis, argv, img, logf, cwd, extra):
        self.argv = [stasis, "run", "-D", img, "--every", "24h", "--concurrent", "--cow-method", "uffd",
                     "--json", "--log", logf, *extra, "--", *argv]
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=open(logf + ".run-err", "w"), cwd=cwd, close_fds=True,
                                     start_new_session=True, text=True)
        self.events = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.seq = 0
        self.sock_path = None

    def _read(self):
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                self.events.put(json.loads(line))
        self.events.put(None)

    def event(self, kind, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"`stasis run` gave no {kind} event within {timeout} s")
            try:
                ev = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if ev is None:
                raise BenchError(f"`stasis run` ended (exit {self.proc.wait()}) before a {kind} event")
            if ev.get("event") == kind:
                return ev

    def checkpoint(self, job_pid, timeout=600):
        """Asks for a checkpoint now; returns its event (the dump report)."""
        if self.sock_path is None:
            env = open(f"/proc/{job_pid}/environ", "rb").read().split(b"\0")
            found = [e.split(b"=", 1)[1] for e in env if e.startswith(b"STASIS_RUN_REQUEST=")]
            if not found:
                raise BenchError(f"the job {job_pid} has no STASIS_RUN_REQUEST: not under `stasis run`?")
            self.sock_path = found[0].decode()
        self.seq += 1
        ident = f"{os.getpid():x}{self.seq:04x}"
        t0 = time.monotonic()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.bind(f"\0stasis-bench-{ident}")
            s.connect(self.sock_path)
            s.settimeout(1.0)
            answer = None
            while answer is None:
                if time.monotonic() - t0 > timeout:
                    raise BenchError(f"no answer to checkpoint request {ident} within {timeout} s")
                try:
                    # Again every second, as the library does; a full
                    # queue (a long checkpoint) just drops this one.
                    s.send(f"stasis-request 1 checkpoint {ident}".encode(), socket.MSG_DONTWAIT)
                except (BlockingIOError, TimeoutError):
                    pass
                try:
                    answer = s.recv(4096).decode()
                except socket.timeout:
                    pass
        wall = time.monotonic() - t0
        if not answer.startswith("ok "):
            raise BenchError(f"`stasis run` answered the checkpoint request with: {answer}")
        n = int(answer.split()[1])
        while True:
            ev = self.event("checkpoint", timeout)
            if ev.get("checkpoint") == n:
                return {**ev, "wall_s": wall, "argv": self.argv}

    def finish(self, timeout=300):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise BenchError(f"`stasis run` did not exit within {timeout} s of the job's end")
