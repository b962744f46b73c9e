#!/usr/bin/env python3
"""bench/dump_restore: dump and restore a process with SIZE MiB of written
anonymous memory, image on tmpfs, against the same machine's memory<->tmpfs
copy speed measured in the same run (the physical limit).

    sudo python3 bench/dump_restore.py [--size-mib 1024] [--reps 3]
                                       [--dir DIR] [--json-out FILE]
                                       [--stasis PATH]

Needs a release build (cargo build --release) and root (ptrace, clone3
set_tid). See bench/README.md for what each figure means.

Exit status: 0 if every dump, restore and memory check worked, 1 if anything
broke (a command failed, the restored process printed FAIL, ...). There is no
pass/fail on the times themselves.
"""

import argparse
import ctypes
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
STASIS = os.path.join(REPO, "target", "release", "stasis")
BUILD = os.path.join(BENCH, "build")
PR_SET_CHILD_SUBREAPER = 36
REPORTED_KIB = "/sys/module/page_reporting/parameters/reported_kib"
RSS_SMALL_MIB = 256

# From the issue: CRIU 4.2 measured on this machine, and the target.
REFERENCE = {
    "criu_4_2_dump_s_per_gib": [0.6, 1.6],
    "criu_4_2_restore_s_per_gib": [0.4, 1.0],
    "target_dump_gb_per_s": 2.0,
    "target_restore_gb_per_s": 2.0,
    "note": "CRIU 4.2 figures were measured on the project machine (issue text); "
            "GB = 1e9 bytes, GiB = 2^30 bytes",
}


class BenchError(Exception):
    pass


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- helpers

def compile_workloads(names, extra_flags=()):
    """Compiles bench/workloads/<name>.c into bench/build/<name> when stale;
    returns {name: executable}."""
    os.makedirs(BUILD, exist_ok=True)
    out = {}
    for name in names:
        src = os.path.join(BENCH, "workloads", name + ".c")
        exe = os.path.join(BUILD, name)
        newest = max(os.path.getmtime(src), os.path.getmtime(os.path.join(BENCH, "workloads", "bench.h")))
        if not os.path.exists(exe) or os.path.getmtime(exe) < newest:
            cmd = ["cc", "-O2", "-Wall", "-Wextra", *extra_flags, "-o", exe, src]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise BenchError(f"compiling {src} failed:\n{r.stderr}")
        out[name] = exe
    return out


def build_workloads():
    return compile_workloads(("fill", "tmpfs_write"))


def dump_record(d, wall, usage, size):
    """The result record of one `stasis dump --json` run over `size` bytes."""
    return {
        "wall_s": wall,
        "total_s": d["total_us"] / 1e6,
        "frozen_s": d["frozen_us"] / 1e6,
        "pages": d["pages"],
        "bytes": d["bytes"],
        **usage,
        "wall_gbps": size / wall / 1e9,
        "total_gbps": size / (d["total_us"] / 1e6) / 1e9,
        "raw": d,
    }


def restore_record(r, wall, usage, size):
    """The result record of one `stasis restore --json` run over `size` bytes;
    `net` leaves out the wait for the PID to be free."""
    net_s = (r["total_us"] - r["pid_wait_us"]) / 1e6
    return {
        "wall_s": wall,
        "total_s": r["total_us"] / 1e6,
        "pid_wait_s": r["pid_wait_us"] / 1e6,
        "net_s": net_s,
        "pages": r["pages"],
        "bytes": r["bytes"],
        **usage,
        "wall_gbps": size / wall / 1e9,
        "net_gbps": size / net_s / 1e9,
        "raw": r,
    }


def cpu_busy_s():
    """Seconds of CPU time the whole machine spent busy (all CPUs, from
    /proc/stat: everything but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid):
    """utime + stime of a live process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_rusage(argv, out_path, err_path, timeout=120.0):
    """Runs argv with stdin /dev/null and stdout/stderr to files. Returns
    (exit code, wall seconds, rusage dict, stdout, stderr). The rusage is the
    child's own, from wait4(): peak RSS (KiB) and CPU time, plus the CPU time
    the rest of the machine used meanwhile (a measure of contention)."""
    with open(out_path, "w") as out, open(err_path, "w") as err:
        busy0 = cpu_busy_s()
        t0 = time.monotonic()
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True)
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        try:
            _pid, status, ru = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        wall = time.monotonic() - t0
        busy = cpu_busy_s() - busy0
        p.returncode = os.waitstatus_to_exitcode(status)
        if time.monotonic() - t0 >= timeout:
            raise BenchError(f"timeout after {timeout}s: {shlex.join(argv)}")
    with open(out_path) as f:
        stdout = f.read()
    with open(err_path) as f:
        stderr = f.read()
    cpu = ru.ru_utime + ru.ru_stime
    usage = {"peak_rss_kib": ru.ru_maxrss, "cpu_s": cpu, "user_s": ru.ru_utime, "sys_s": ru.ru_stime,
             "other_cpu_s": max(0.0, busy - cpu)}
    return p.returncode, wall, usage, stdout, stderr


def parse_json_line(stdout, what):
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    raise BenchError(f"{what}: no JSON line in its output:\n{stdout}")


def dir_size(path):
    apparent = allocated = nfiles = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            apparent += st.st_size
            allocated += st.st_blocks * 512
            nfiles += 1
    return apparent, allocated, nfiles


def fs_type(path):
    path = os.path.realpath(path)
    best, best_type = "", "?"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            mnt = left.split()[4]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, best_type = mnt, right.split()[0]
    return best_type


def reported_kib():
    try:
        with open(REPORTED_KIB) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def wait_pid(pid, timeout, what):
    """Reaps pid (our child, or re-parented to us as subreaper)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            raise BenchError(f"{what} (pid {pid}) is not our child: cannot reap it")
        if got == pid:
            return status
        if time.monotonic() > deadline:
            raise BenchError(f"{what} (pid {pid}) did not exit within {timeout}s")
        time.sleep(0.002)


def check_restored_pass(pid, logf, what, timeout=60, context=""):
    """SIGTERM to a restored workload (it then checks its memory), wait for
    it, and fail unless it exited 0 with "PASS" as the last line of `logf`."""
    os.kill(pid, signal.SIGTERM)
    status = wait_pid(pid, timeout, what)
    with open(logf) as f:
        out = f.read()
    lines = out.strip().splitlines()
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or not lines or lines[-1] != "PASS":
        raise BenchError(f"{what} {pid} failed its memory check (exit {code}){context}; output:\n{out}")


def git_info():
    def git(*args):
        r = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty_tracked_files": status.splitlines() if status else []}


def machine_info():
    info = {"kernel": platform.release(), "nproc": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["mem_total_kib"] = int(line.split()[1])
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            info["thp_enabled"] = f.read().strip()
    except OSError:
        pass
    info["loadavg_at_start"] = os.getloadavg()
    return info


# ---------------------------------------------------------------- phases

class Bench:
    def __init__(self, args, exes, workdir):
        self.args = args
        self.exes = exes
        self.workdir = workdir
        self.live = set()   # pids to SIGKILL on error
        self.seq = 0

    def baseline(self, size_mib):
        path = os.path.join(self.workdir, "baseline.bin")
        out = os.path.join(self.workdir, "baseline.out")
        err = os.path.join(self.workdir, "baseline.err")
        rc, _wall, usage, stdout, stderr = run_rusage([self.exes["tmpfs_write"], path, str(size_mib)], out, err)
        if rc != 0:
            raise BenchError(f"tmpfs_write failed (exit {rc}):\n{stderr}")
        vals = {}
        for line in stdout.splitlines():
            k, v = line.split()
            vals[k] = float(v)
        size = size_mib << 20
        return {
            "write_s": vals["write_s"],
            "read_s": vals["read_s"],
            "read_fresh_s": vals["read_fresh_s"],
            "write_gbps": size / vals["write_s"] / 1e9,
            "read_gbps": size / vals["read_s"] / 1e9,
            "read_fresh_gbps": size / vals["read_fresh_s"] / 1e9,
            "other_cpu_s": usage["other_cpu_s"],
        }

    def start_fill(self, size_mib, tag):
        pidfile = os.path.join(self.workdir, f"{tag}.pid")
        logf = os.path.join(self.workdir, f"{tag}.log")
        for p in (pidfile, pidfile + ".tmp"):
            if os.path.exists(p):
                os.unlink(p)
        with open(logf, "w"):
            pass
        out = open(logf, "a")
        try:
            p = subprocess.Popen([self.exes["fill"], pidfile, str(size_mib)], stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT, close_fds=True, pass_fds=(),
                                 cwd=self.workdir)
        finally:
            out.close()
        self.live.add(p.pid)
        deadline = time.monotonic() + 120
        while not os.path.exists(pidfile):
            if p.poll() is not None:
                self.live.discard(p.pid)
                raise BenchError(f"fill exited early ({p.returncode}): {open(logf).read()}")
            if time.monotonic() > deadline:
                raise BenchError("fill did not write its pidfile within 120 s")
            time.sleep(0.005)
        with open(pidfile) as f:
            pid = int(f.read().strip())
        if pid != p.pid:
            raise BenchError(f"fill pidfile says {pid}, child is {p.pid}")
        return p, logf

    def cycle(self, size_mib, tag):
        """One fill -> dump (kill) -> reap -> restore -> SIGTERM -> check PASS."""
        size = size_mib << 20
        img = os.path.join(self.workdir, f"img-{tag}")
        if os.path.exists(img):
            shutil.rmtree(img)
        fill, logf = self.start_fill(size_mib, tag)
        pid = fill.pid
        rec = {"size_mib": size_mib, "pid": pid}

        # dump
        rk0 = reported_kib()
        rc, wall, usage, stdout, stderr = run_rusage(
            [STASIS, "dump", "-t", str(pid), "-D", img, "--json"],
            os.path.join(self.workdir, f"{tag}.dump.out"), os.path.join(self.workdir, f"{tag}.dump.err"))
        if rc != 0:
            raise BenchError(f"stasis dump failed (exit {rc}):\n{stderr}{stdout}")
        d = parse_json_line(stdout, "stasis dump")
        if not d.get("killed"):
            raise BenchError(f"stasis dump did not kill the process: {d}")
        try:
            fill.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise BenchError(f"dumped process {pid} still alive 30 s after the dump")
        self.live.discard(pid)
        if fill.returncode != -signal.SIGKILL:
            raise BenchError(f"dumped process {pid} ended with {fill.returncode}, expected SIGKILL; log: {open(logf).read()}")
        apparent, allocated, nfiles = dir_size(img)
        rec["dump"] = dump_record(d, wall, usage, size)
        rec["image"] = {"apparent_bytes": apparent, "allocated_bytes": allocated, "files": nfiles,
                        "ratio_to_memory": apparent / size}

        # restore
        pidfile = os.path.join(self.workdir, f"{tag}.restored.pid")
        if os.path.exists(pidfile):
            os.unlink(pidfile)
        rc, wall, usage, stdout, stderr = run_rusage(
            [STASIS, "restore", "-D", img, "--detach", "--json", "--pidfile", pidfile],
            os.path.join(self.workdir, f"{tag}.restore.out"), os.path.join(self.workdir, f"{tag}.restore.err"))
        if rc != 0:
            raise BenchError(f"stasis restore failed (exit {rc}):\n{stderr}{stdout}")
        r = parse_json_line(stdout, "stasis restore")
        rpid = r["pid"]
        self.live.add(rpid)
        if rpid != pid:
            raise BenchError(f"restored at pid {rpid}, dumped pid was {pid}")
        rk1 = reported_kib()
        # The restored process fills its own memory (its CPU time is not the
        # restorer's): count it, and take it out of "other processes".
        child_cpu = proc_cpu_s(rpid)
        usage["restored_process_cpu_s"] = child_cpu
        usage["other_cpu_s"] = max(0.0, usage["other_cpu_s"] - child_cpu)
        rec["restore"] = restore_record(r, wall, usage, size)

        # check the restored memory
        check_restored_pass(rpid, logf, "restored process")
        self.live.discard(rpid)
        rec["verified"] = "PASS"
        if rk0 is not None and rk1 is not None:
            rec["free_page_reporting_kib_during_cycle"] = rk1 - rk0
        shutil.rmtree(img)
        for p in (logf, pidfile):
            if os.path.exists(p):
                os.unlink(p)
        return rec

    def kill_live(self):
        for pid in list(self.live):
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.live.discard(pid)


# ---------------------------------------------------------------- report

def med(values):
    return statistics.median(values)


def summarize(reps, size_mib):
    size = size_mib << 20
    gib = size / 2**30

    def col(f):
        return [f(r) for r in reps]

    m = {}
    for key, f in {
        "dump_wall_s": lambda r: r["dump"]["wall_s"],
        "dump_total_s": lambda r: r["dump"]["total_s"],
        "dump_frozen_s": lambda r: r["dump"]["frozen_s"],
        "restore_wall_s": lambda r: r["restore"]["wall_s"],
        "restore_net_s": lambda r: r["restore"]["net_s"],
        "restore_pid_wait_s": lambda r: r["restore"]["pid_wait_s"],
        "tmpfs_write_s": lambda r: r["baseline"]["write_s"],
        "tmpfs_read_s": lambda r: r["baseline"]["read_s"],
        "tmpfs_read_fresh_s": lambda r: r["baseline"]["read_fresh_s"],
        "dump_cpu_s": lambda r: r["dump"]["cpu_s"],
        "dump_other_cpu_s": lambda r: r["dump"]["other_cpu_s"],
        "restore_cpu_s": lambda r: r["restore"]["cpu_s"],
        "restore_child_cpu_s": lambda r: r["restore"]["restored_process_cpu_s"],
        "restore_other_cpu_s": lambda r: r["restore"]["other_cpu_s"],
        "baseline_other_cpu_s": lambda r: r["baseline"]["other_cpu_s"],
        "image_bytes": lambda r: r["image"]["apparent_bytes"],
        "dump_peak_rss_kib": lambda r: r["dump"]["peak_rss_kib"],
        "restore_peak_rss_kib": lambda r: r["restore"]["peak_rss_kib"],
    }.items():
        vals = col(f)
        m[key] = {"median": med(vals), "min": min(vals), "max": max(vals)}
    for k in list(m):
        if k.endswith("_s") and "cpu" not in k:
            base = k[:-2]
            m[base + "_gbps"] = {"median": size / m[k]["median"] / 1e9, "min": size / m[k]["max"] / 1e9,
                                 "max": size / m[k]["min"] / 1e9}
            m[base + "_s_per_gib"] = {"median": m[k]["median"] / gib}
    # Ratios of medians (throughput of stasis / throughput of the baseline).
    m["ratio_dump_total_to_tmpfs_write"] = m["tmpfs_write_s"]["median"] / m["dump_total_s"]["median"]
    m["ratio_dump_wall_to_tmpfs_write"] = m["tmpfs_write_s"]["median"] / m["dump_wall_s"]["median"]
    m["ratio_restore_net_to_tmpfs_read"] = m["tmpfs_read_s"]["median"] / m["restore_net_s"]["median"]
    m["ratio_restore_net_to_tmpfs_read_fresh"] = m["tmpfs_read_fresh_s"]["median"] / m["restore_net_s"]["median"]
    m["ratio_restore_net_to_tmpfs_write"] = m["tmpfs_write_s"]["median"] / m["restore_net_s"]["median"]
    m["image_ratio_to_memory"] = m["image_bytes"]["median"] / size
    return m


def table(m, size_mib, reps, dirpath, fstype, rss):
    gib = (size_mib << 20) / 2**30
    lines = []
    lines.append(f"stasis dump/restore: {size_mib} MiB of written anonymous memory, image in {dirpath} ({fstype}), "
                 f"{reps} reps, median [min-max]")
    lines.append("")
    hdr = f"{'':34} {'median [min-max] s':>21} {'GB/s':>6} {'s/GiB':>6}  {'vs physical limit'}"
    lines.append(hdr)

    def row(name, key, vs=""):
        s = m[key + "_s"]
        g = m[key + "_gbps"]["median"]
        lines.append(f"{name:34} {s['median']:7.3f} [{s['min']:.3f}-{s['max']:.3f}] {g:6.2f} {s['median'] / gib:6.3f}  {vs}")

    row("dump (stasis total_us)", "dump_total",
        f"{m['ratio_dump_total_to_tmpfs_write']:.2f}x tmpfs write")
    row("dump (wall, whole command)", "dump_wall",
        f"{m['ratio_dump_wall_to_tmpfs_write']:.2f}x tmpfs write")
    row("  of which process frozen", "dump_frozen")
    row("restore (total_us - pid_wait_us)", "restore_net",
        f"{m['ratio_restore_net_to_tmpfs_read_fresh']:.2f}x tmpfs read-fresh, "
        f"{m['ratio_restore_net_to_tmpfs_read']:.2f}x read, {m['ratio_restore_net_to_tmpfs_write']:.2f}x write")
    row("restore (wall, whole command)", "restore_wall")
    row("baseline: tmpfs write (mem->tmpfs)", "tmpfs_write")
    row("baseline: tmpfs read (tmpfs->mem)", "tmpfs_read")
    row("baseline: tmpfs read, fresh memory", "tmpfs_read_fresh")
    lines.append("")
    img = m["image_bytes"]["median"]
    lines.append(f"image size: {img / 2**20:.1f} MiB = {m['image_ratio_to_memory']:.4f} x memory size ({size_mib} MiB)")
    lines.append(f"dumper peak RSS: {rss['small']['dump_peak_rss_kib'] / 1024:.1f} MiB at {RSS_SMALL_MIB} MiB, "
                 f"{m['dump_peak_rss_kib']['median'] / 1024:.1f} MiB at {size_mib} MiB (median)")
    lines.append(f"restorer peak RSS: {rss['small']['restore_peak_rss_kib'] / 1024:.1f} MiB at {RSS_SMALL_MIB} MiB, "
                 f"{m['restore_peak_rss_kib']['median'] / 1024:.1f} MiB at {size_mib} MiB (median)")
    lines.append(f"CPU s (median): dump {m['dump_cpu_s']['median']:.3f} in stasis; restore "
                 f"{m['restore_cpu_s']['median']:.3f} in stasis + {m['restore_child_cpu_s']['median']:.3f} in the "
                 f"restored process")
    lines.append(f"other processes' CPU s meanwhile (median; > ~0.1 means the machine was not quiet): "
                 f"dump {m['dump_other_cpu_s']['median']:.3f}, restore {m['restore_other_cpu_s']['median']:.3f}")
    lines.append("reference (issue): CRIU 4.2 on this machine dump 0.6-1.6 s/GiB (0.67-1.79 GB/s), "
                 "restore 0.4-1.0 s/GiB (1.07-2.68 GB/s); target >= 2 GB/s each")
    lines.append("GB = 1e9 bytes of the workload's memory size; ratios are stasis throughput / baseline throughput.")
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def stasis_info():
    """The binary (SHA-256, mtime) and, if it is this checkout's
    target/release/stasis, the commit and modified tracked files; a binary
    from elsewhere (--stasis) is identified by its SHA-256, and the
    checkout the script ran from is recorded as bench_checkout."""
    sys.dont_write_bytecode = True  # no bench/__pycache__
    import track_common  # it imports this module: so not at the top
    return track_common.stasis_info(STASIS)


def main():
    global STASIS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="work dir for images (default: a fresh dir under /dev/shm)")
    ap.add_argument("--json-out", default=os.path.join(BENCH, "results", "dump_restore.json"))
    ap.add_argument("--stasis", default=STASIS,
                    help="stasis binary (default: target/release/stasis of this checkout)")
    args = ap.parse_args()
    if args.size_mib <= 0 or args.reps <= 0:
        ap.error("--size-mib and --reps must be positive")
    STASIS = os.path.abspath(args.stasis)

    if os.geteuid() != 0:
        log("dump_restore: needs root (ptrace and clone3 set_tid): run with sudo")
        return 1
    if not os.access(STASIS, os.X_OK):
        log(f"dump_restore: {STASIS} not found: run `cargo build --release` first")
        return 1

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log("dump_restore: prctl(PR_SET_CHILD_SUBREAPER) failed")
        return 1

    t_start = time.monotonic()
    started = datetime.datetime.now(datetime.timezone.utc)
    exes = build_workloads()
    if args.dir is None:
        workdir = tempfile.mkdtemp(prefix="stasis-bench-", dir="/dev/shm")
    else:
        os.makedirs(args.dir, exist_ok=True)
        workdir = tempfile.mkdtemp(prefix="stasis-bench-", dir=args.dir)
    fstype = fs_type(workdir)
    if fstype != "tmpfs":
        log(f"dump_restore: warning: {workdir} is on {fstype}, not tmpfs; the figures are not comparable")

    b = Bench(args, exes, workdir)
    size = args.size_mib
    result = {
        "benchmark": "dump_restore",
        "date_utc": started.isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable] + sys.argv),
        "params": {"size_mib": size, "reps": args.reps, "dir": workdir, "fs_type": fstype},
        "machine": machine_info(),
        "stasis": stasis_info(),
        "reference": REFERENCE,
    }
    try:
        log(f"work dir {workdir} ({fstype}); warm-up (untimed): baseline + one dump/restore cycle of {size} MiB")
        b.baseline(size)
        result["warmup"] = b.cycle(size, "warmup")
        reps = []
        for i in range(args.reps):
            rk0 = reported_kib()
            base = b.baseline(size)
            rec = b.cycle(size, f"rep{i}")
            rec["baseline"] = base
            rk1 = reported_kib()
            if rk0 is not None and rk1 is not None:
                rec["free_page_reporting_kib_during_rep"] = rk1 - rk0
            reps.append(rec)
            log(f"rep {i + 1}/{args.reps}: dump {rec['dump']['total_s']:.3f} s (wall {rec['dump']['wall_s']:.3f}), "
                f"restore {rec['restore']['net_s']:.3f} s (wall {rec['restore']['wall_s']:.3f}), "
                f"tmpfs write {base['write_s']:.3f} s read {base['read_s']:.3f} s "
                f"read-fresh {base['read_fresh_s']:.3f} s, {rec['verified']}")
        small = b.cycle(RSS_SMALL_MIB, f"rss{RSS_SMALL_MIB}")
        log(f"{RSS_SMALL_MIB} MiB cycle: dumper peak RSS {small['dump']['peak_rss_kib'] / 1024:.1f} MiB, "
            f"restorer {small['restore']['peak_rss_kib'] / 1024:.1f} MiB, {small['verified']}")
    except BenchError as e:
        b.kill_live()
        log(f"dump_restore: FAILED: {e}")
        log(f"dump_restore: work dir left for inspection: {workdir}")
        return 1
    except BaseException:
        b.kill_live()
        raise

    m = summarize(reps, size)
    rss = {
        "small": {"size_mib": RSS_SMALL_MIB, "dump_peak_rss_kib": small["dump"]["peak_rss_kib"],
                  "restore_peak_rss_kib": small["restore"]["peak_rss_kib"]},
        "full": {"size_mib": size, "dump_peak_rss_kib": m["dump_peak_rss_kib"]["median"],
                 "restore_peak_rss_kib": m["restore_peak_rss_kib"]["median"]},
    }
    rss["dump_rss_growth_kib"] = rss["full"]["dump_peak_rss_kib"] - rss["small"]["dump_peak_rss_kib"]
    rss["restore_rss_growth_kib"] = rss["full"]["restore_peak_rss_kib"] - rss["small"]["restore_peak_rss_kib"]
    result.update({"reps": reps, "rss_cycle": small, "rss_scaling": rss, "median": m,
                   "runtime_s": time.monotonic() - t_start})
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    txt = table(m, size, args.reps, workdir, fstype, rss)
    result["table"] = txt.splitlines()

    os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
    with open(args.json_out + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    os.replace(args.json_out + ".tmp", args.json_out)

    shutil.rmtree(workdir, ignore_errors=True)  # our fresh dir (under /dev/shm or under --dir)
    # Reap anything else re-parented to us (we are a subreaper).
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break

    print(txt)
    print(f"\n(json: {args.json_out}; runtime {result['runtime_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
