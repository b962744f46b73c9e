#!/usr/bin/env python3
"""bench/lazy_restore: restart latency and completion time of a restored job,
full restore vs lazy restore (`stasis restore --lazy`) without and with a
touch set, over local tmpfs, a loopback page server, and a shaped veth link
between two network namespaces (FREM's experiment).

    sudo python3 bench/lazy_restore.py [--sizes 256,1024,4096]
                                       [--media local,loopback,veth-1gbit,veth-100mbit]
                                       [--reps 3] [--net-reps 3] [--quick]
                                       [--hot-div 16] [--hot-passes 5]
                                       [--touch-window 2] [--lazy-threads N]
                                       [--dir DIR] [--json-out FILE]
                                       [--stasis PATH] [--wait-quiet SECS]

For each size, one image: `workloads/lazy_job.c` (SIZE MiB written with a
pattern, looping over a hot set of SIZE/16 MiB) is checkpointed with
`stasis dump --leave-running --touch-window W` (its touch set: the pages it
writes in the W s after the checkpoint), killed and reaped. Then, for each
medium and rep, three restores of that same image at the same PID, in a
rotating order:

  full        `stasis restore -D IMG --detach` (or `--from ADDR`, which first
              mirrors the whole image into a temporary directory on tmpfs)
  lazy        the same with `--lazy`, with no touch set in the checkpoint
  lazy+touch  the same with `--lazy`, with only the `touch-window` file

Before each restore the script creates the file `go` next to the job's pid
file. The restored job's first heartbeat after the restore sees it, takes
CLOCK_REALTIME (t_resume) and runs the job: 5 passes over the hot set
(t_hot), then a check of every word of all SIZE MiB (t_done), and exits.

  restart latency   t_resume - t0, t0 = CLOCK_REALTIME just before the
                    `stasis restore` command is started
  completion        t_done - t0 (every page has arrived and was checked)

Media: local (image on /dev/shm, `restore -D`), loopback (page server on
127.0.0.1, image on /dev/shm), veth-1gbit and veth-100mbit (page server in
one network namespace, restore in another, joined by a veth pair shaped with
`tc ... tbf` on both ends). Default sizes: 256, 1024, 4096 MiB locally and on
loopback, 256 and 1024 at 1 Gbit/s, 256 at 100 Mbit/s; `--sizes` applies to
all media given.

Exit status: 1 if anything broke (a dump or restore failed, a job reported
FAIL or did not finish, a filler reported an error), else 0. No time is
pass/fail.
"""

import argparse
import ctypes
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True  # no bench/__pycache__
import track_common as tc  # noqa: E402
from track_common import BenchError, log  # noqa: E402

PR_SET_CHILD_SUBREAPER = 36

REFERENCE = {
    "frem_restart_latency_lower_pct": {"slow_network": 61.96, "fast_network": 72.43},
    "target_lazy_latency_vs_full_max": 0.10,
    "target_lazy_latency_min_size_mib": 1024,
    "target_completion_vs_full_max": 1.10,
    "note": "FREM (seed 001): lazy restore with a touch set had 61.96% (slow network) and 72.43% (fast network) "
            "lower restart latency than a full restore. Target (issue): lazy restart latency <= 10% of the full "
            "restore's at >= 1 GiB, completion time <= 1.1x the full restore's.",
}

VARIANTS = ("full", "lazy", "lazy+touch")
# medium -> (rate for tc tbf or None, page server?, default sizes)
MEDIA = {
    "local": (None, False, (256, 1024, 4096)),
    "loopback": (None, True, (256, 1024, 4096)),
    "veth-1gbit": ("1gbit", True, (256, 1024)),
    "veth-100mbit": ("100mbit", True, (256,)),
}
RATE_BPS = {"1gbit": 1e9, "100mbit": 1e8}
QUICK_SIZES = {"local": (256,), "loopback": (256,), "veth-1gbit": (256,), "veth-100mbit": (64,)}
NS_SRV, NS_CLI = "stasis-lzb-srv", "stasis-lzb-cli"
DEV_SRV, DEV_CLI = "lzb-s", "lzb-c"
IP_SRV, IP_CLI = "10.213.77.1", "10.213.77.2"


# ---------------------------------------------------------------- processes

def wait4(pid, timeout, what):
    """Reaps pid (our child or re-parented to us as subreaper); returns
    (exit code, rusage)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got, status, ru = os.wait4(pid, os.WNOHANG)
        except ChildProcessError:
            raise BenchError(f"{what} (pid {pid}) is not our child: cannot reap it")
        if got == pid:
            return os.waitstatus_to_exitcode(status), ru
        if time.monotonic() > deadline:
            raise BenchError(f"{what} (pid {pid}) did not exit within {timeout:.0f} s")
        time.sleep(0.002)


def kill_pid(pid):
    """SIGKILLs and reaps a re-parented process if it still exists."""
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        wait4(pid, 30, "killed process")
    except BenchError:
        pass


def reap_strays():
    """Reaps whatever else exited and was re-parented to us (the dump's
    tracking keeper, helpers of the filler)."""
    n = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return n
        if pid == 0:
            return n
        n += 1


def run(cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise BenchError(f"`{shlex.join(cmd)}` failed (exit {r.returncode}): {r.stderr.strip()}")
    return r


# ---------------------------------------------------------------- network

class Net:
    """Two network namespaces joined by a veth pair, tbf on both egresses."""

    def __init__(self):
        self.up = False
        self.rate = None

    def setup(self):
        self.teardown()
        run(["ip", "netns", "add", NS_SRV])
        run(["ip", "netns", "add", NS_CLI])
        self.up = True
        run(["ip", "link", "add", DEV_SRV, "netns", NS_SRV, "type", "veth", "peer", "name", DEV_CLI,
             "netns", NS_CLI])
        for ns, dev, ip in ((NS_SRV, DEV_SRV, IP_SRV), (NS_CLI, DEV_CLI, IP_CLI)):
            run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev])
            run(["ip", "-n", ns, "link", "set", dev, "up"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def shape(self, rate):
        """tbf at `rate` on both ends: burst = 2 ms at the rate (at least
        64 KiB, one GSO packet), queue at most 20 ms."""
        burst = max(64 << 10, int(RATE_BPS[rate] / 8 * 0.002))
        for ns, dev in ((NS_SRV, DEV_SRV), (NS_CLI, DEV_CLI)):
            run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                 "burst", str(burst), "latency", "20ms"])
        self.rate = rate
        return {"rate": rate, "burst_bytes": burst, "latency": "20ms",
                "qdisc": run(["tc", "-n", NS_CLI, "qdisc", "show", "dev", DEV_CLI]).stdout.strip()}

    def teardown(self):
        for ns in (NS_SRV, NS_CLI):
            run(["ip", "netns", "del", ns], check=False)
        self.up = False


# ---------------------------------------------------------------- bench

class Bench:
    def __init__(self, args, exe, workdir, net):
        self.args = args
        self.exe = exe
        self.workdir = workdir
        self.net = net
        self.live = set()        # restored jobs and fillers to kill on error
        self.servers = []        # page servers (Popen)
        self.token_file = os.path.join(workdir, "token")
        with open(os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        self.mirror_tmp = os.path.join(workdir, "mirror-tmp")
        os.makedirs(self.mirror_tmp)

    # -- image ----------------------------------------------------------
    def make_image(self, size_mib):
        """Starts the job, dumps it with a touch window, kills and reaps it."""
        a = self.args
        jdir = os.path.join(self.workdir, f"job-{size_mib}")
        os.makedirs(jdir)
        img = os.path.join(jdir, "img")
        pidfile = os.path.join(jdir, "pid")
        logf = os.path.join(jdir, "job.log")
        hot = max(1, size_mib // a.hot_div)
        argv = [self.exe, pidfile, str(size_mib), str(hot), str(a.hot_passes)]
        t0 = time.monotonic()
        p = tc.start_workload(argv, logf, jdir)
        try:
            tc.wait_file(pidfile, p, 300, "lazy_job", logf)
            fill_s = time.monotonic() - t0
            time.sleep(0.5)  # a few hot passes before the checkpoint
            dargv = [a.stasis, "dump", "-t", str(p.pid), "-D", img, "--leave-running",
                     "--touch-window", str(a.touch_window), "--json"]
            rc, wall, usage, stdout, stderr = tc.dr.run_rusage(
                dargv, os.path.join(jdir, "dump.out"), os.path.join(jdir, "dump.err"), timeout=900)
            if rc != 0:
                raise BenchError(f"`{shlex.join(dargv)}` failed (exit {rc}):\n{stderr}{stdout}")
            lines = [json.loads(x) for x in stdout.splitlines() if x.strip().startswith("{")]
            dump = next((x for x in lines if "checkpoint" in x), None)
            touch = next((x for x in lines if "touch_pages" in x), None)
            if dump is None or touch is None:
                raise BenchError(f"`{shlex.join(dargv)}` printed no dump or touch-set JSON: {stdout}")
        finally:
            tc.kill_quietly(p)  # SIGKILL + reap: the PID is free for the restores
        cpdir = os.path.join(img, "checkpoints", f"{dump['checkpoint']:08d}")
        window = os.path.join(cpdir, "touch-window")
        if not os.path.exists(window):
            raise BenchError(f"the dump recorded no touch set: {window} missing")
        saved = os.path.join(jdir, "touch-window.saved")
        shutil.copy2(window, saved)
        reap_strays()
        apparent, _alloc, nfiles = tc.dr.dir_size(img)
        rec = {"size_mib": size_mib, "hot_mib": hot, "pid": p.pid, "argv": argv, "fill_s": fill_s,
               "dump_argv": dargv, "dump_wall_s": wall, "dump": dump, "touch": touch, "dump_usage": usage,
               "image_bytes": apparent, "image_files": nfiles}
        log(f"  image {size_mib} MiB: pid {p.pid}, dump {wall:.2f} s (frozen {dump['frozen_us'] / 1e6:.2f} s), "
            f"touch set {touch['touch_pages']} pages in {touch['touch_window_ms']} ms (hot set {hot} MiB = "
            f"{hot * 256} pages)")
        return {"dir": jdir, "img": img, "cpdir": cpdir, "saved_window": saved, "pidfile": pidfile,
                "pid": p.pid, "log": logf, "rec": rec}

    def set_touch(self, im, variant):
        """Leaves the checkpoint with no touch set (full, lazy) or only the
        window one (lazy+touch): a lazy restore adds touch-faults, which the
        next one would use first."""
        for name in ("touch-faults", "touch-window"):
            p = os.path.join(im["cpdir"], name)
            if os.path.exists(p):
                os.unlink(p)
        if variant == "lazy+touch":
            shutil.copy2(im["saved_window"], os.path.join(im["cpdir"], "touch-window"))

    # -- page server ----------------------------------------------------
    def start_server(self, im, medium, tag):
        listen = "127.0.0.1:0" if medium == "loopback" else f"{IP_SRV}:0"
        argv = [self.args.stasis, "page-server", "-D", im["img"], "--listen", listen,
                "--token-file", self.token_file, "--json"]
        if medium != "loopback":
            argv = ["ip", "netns", "exec", NS_SRV] + argv
        out = os.path.join(self.workdir, f"server-{tag}.out")
        with open(out, "w") as f:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                 close_fds=True, start_new_session=True)
        self.servers.append(p)
        deadline = time.monotonic() + 30
        while True:
            with open(out) as f:
                for line in f:
                    if line.strip().startswith("{"):
                        return p, json.loads(line)["listening"], argv
            if p.poll() is not None:
                raise BenchError(f"page server exited ({p.returncode}): {open(out).read()}")
            if time.monotonic() > deadline:
                raise BenchError(f"page server printed no address within 30 s: {open(out).read()}")
            time.sleep(0.005)

    def stop_servers(self):
        """Stops the page servers; returns the CPU seconds they used."""
        cpu = 0.0
        for p in self.servers:
            if p.poll() is None:
                try:
                    cpu += tc.dr.proc_cpu_s(p.pid)
                except OSError:
                    pass
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.servers = []
        return cpu

    # -- one restore ------------------------------------------------------
    def restore(self, im, medium, variant, tag, size_mib):
        a = self.args
        jdir = im["dir"]
        for name in ("go", "resume", "done", "restore.out", "restore.err", "stats.json", "lazy.log",
                     "restored.pid"):
            p = os.path.join(jdir, name)
            if os.path.exists(p):
                os.unlink(p)
        self.set_touch(im, variant)
        lazy = variant != "full"
        rate, served, _ = MEDIA[medium]
        server_argv = None
        if served:
            server, addr, server_argv = self.start_server(im, medium, tag)
            argv = [a.stasis, "restore", "--from", addr, "--token-file", self.token_file]
        else:
            server = None
            argv = [a.stasis, "restore", "-D", im["img"]]
        argv += ["--detach", "--json", "--pidfile", os.path.join(jdir, "restored.pid")]
        stats_f = os.path.join(jdir, "stats.json")
        if lazy:
            argv += ["--lazy", "--lazy-stats", stats_f, "--lazy-log", os.path.join(jdir, "lazy.log")]
            if a.lazy_threads:
                argv += ["--lazy-threads", str(a.lazy_threads)]
        if rate:
            argv = ["ip", "netns", "exec", NS_CLI] + argv
        with open(os.path.join(jdir, "go"), "w"):
            pass
        quiet = tc.wait_quiet(a.wait_quiet)
        rk0 = tc.dr.reported_kib()
        size = size_mib << 20
        # time for everything: the image over the link, 4x, plus 2 minutes
        timeout = 120 + 4 * (size * 8 / RATE_BPS[rate] if rate else size / 0.5e9)
        rec = {"medium": medium, "variant": variant, "size_mib": size_mib, "argv": argv,
               "server_argv": server_argv, "quiet_wait_s": quiet}
        busy0 = tc.dr.cpu_busy_s()
        t0 = time.time_ns()
        rpid = fpid = None
        try:
            rc, wall, usage, stdout, stderr = tc.dr.run_rusage(
                argv, os.path.join(jdir, "restore.out"), os.path.join(jdir, "restore.err"), timeout=timeout)
            if rc != 0:
                raise BenchError(f"`{shlex.join(argv)}` failed (exit {rc}):\n{stderr}{stdout}")
            r = tc.dr.parse_json_line(stdout, "stasis restore")
            rpid, fpid = r.get("pid"), r.get("filler_pid")
            self.live.update(x for x in (rpid, fpid) if x)
            if rpid != im["pid"]:
                raise BenchError(f"restored at pid {rpid}, dumped pid was {im['pid']}")
            if lazy and not fpid:
                raise BenchError(f"lazy restore reported no filler_pid: {r}")
            code, ru = wait4(rpid, timeout, f"restored job ({medium} {variant} {size_mib} MiB)")
            self.live.discard(rpid)
            rec["job_cpu_s"] = ru.ru_utime + ru.ru_stime
            if lazy:
                fcode, fru = wait4(fpid, 120, "lazy filler")
                self.live.discard(fpid)
                rec["filler_exit"] = fcode
                rec["filler_cpu_s"] = fru.ru_utime + fru.ru_stime
            t_end = time.time_ns()
            if server is not None:
                rec["server_cpu_s"] = self.stop_servers()
            busy = tc.dr.cpu_busy_s() - busy0
        finally:
            for pid in (rpid, fpid):
                if pid in self.live:
                    kill_pid(pid)
                    self.live.discard(pid)
            if server is not None:
                self.stop_servers()
            reap_strays()
        done_f = os.path.join(jdir, "done")
        if not os.path.exists(done_f):
            raise BenchError(f"restored job exited ({code}) without writing {done_f}; log: {open(im['log']).read()}")
        f = open(done_f).read().split()
        verdict, t_resume, t_hot, t_done, gap = f[0], int(f[1]), int(f[2]), int(f[3]), int(f[4])
        rec.update({
            "restore_json": r, "restore_wall_s": wall, "restore_usage": usage,
            "latency_s": (t_resume - t0) / 1e9, "hot_ready_s": (t_hot - t0) / 1e9,
            "completion_s": (t_done - t0) / 1e9, "job_s": (t_done - t_resume) / 1e9,
            "gap_s": gap / 1e9, "job_exit": code, "verdict": verdict, "done_line": " ".join(f),
            # CPU the rest of the machine used meanwhile (other sessions,
            # and the kernel's network processing on the veth links)
            "other_cpu_s": max(0.0, busy - usage["cpu_s"] - rec["job_cpu_s"] - rec.get("filler_cpu_s", 0.0)
                               - rec.get("server_cpu_s", 0.0)),
            "span_s": (t_end - t0) / 1e9,
        })
        rk1 = tc.dr.reported_kib()
        if rk0 is not None and rk1 is not None:
            rec["free_page_reporting_kib"] = rk1 - rk0
        if verdict != "PASS" or code != 0:
            raise BenchError(f"restored job reported {' '.join(f)} (exit {code}); log: {open(im['log']).read()}")
        if lazy:
            if not os.path.exists(stats_f):
                raise BenchError(f"the filler wrote no statistics ({stats_f}); lazy log: "
                                 f"{open(os.path.join(jdir, 'lazy.log')).read() if os.path.exists(os.path.join(jdir, 'lazy.log')) else ''}")
            st = json.load(open(stats_f))
            rec["filler_stats"] = st
            if st.get("error") or rec["filler_exit"] != 0:
                raise BenchError(f"the filler reported an error (exit {rec['filler_exit']}): {st}")
        return rec


# ---------------------------------------------------------------- report

def summarize(runs):
    out = {}
    for r in runs:
        key = (r["medium"], r["size_mib"], r["variant"])
        out.setdefault(key, []).append(r)
    summ = {}
    for (medium, size, variant), rs in out.items():
        s = {k: tc.stats([r.get(k) for r in rs]) for k in
             ("latency_s", "completion_s", "hot_ready_s", "job_s", "restore_wall_s", "other_cpu_s")}
        fs = [r["filler_stats"] for r in rs if r.get("filler_stats")]
        if fs:
            for k in ("faults", "pages_by_fault", "pages_streamed", "fault_p50_us", "fault_p99_us",
                      "fault_max_us", "fill_us", "total_us"):
                s["filler_" + k] = tc.stats([f.get(k) for f in fs])
        summ.setdefault(medium, {}).setdefault(str(size), {})[variant] = s
    for medium, sizes in summ.items():
        for size, v in sizes.items():
            full = v.get("full")
            if not full:
                continue
            for variant in ("lazy", "lazy+touch"):
                if variant not in v:
                    continue
                lat = v[variant]["latency_s"]["median"] / full["latency_s"]["median"]
                v[variant]["latency_vs_full"] = lat
                v[variant]["latency_lower_pct"] = 100 * (1 - lat)
                v[variant]["completion_vs_full"] = v[variant]["completion_s"]["median"] / full["completion_s"]["median"]
                v[variant]["hot_ready_vs_full"] = v[variant]["hot_ready_s"]["median"] / full["hot_ready_s"]["median"]
    return summ


def fmt_s(x):
    return f"{x * 1e3:8.1f}" if x < 10 else f"{x * 1e3:8.0f}"


def table(result):
    summ = result.get("summary", {})
    L = []
    L.append("restart latency (restore started -> first heartbeat of the restored job), ms, median of reps")
    L.append(f"{'medium':13} {'size':>5} {'reps':>4} {'full':>8} {'lazy':>8} {'+touch':>8}   "
             f"{'lazy/full':>9} {'+touch/full':>11}   {'% lower lazy, +touch':>20}")
    for medium in MEDIA:
        for size, v in sorted(summ.get(medium, {}).items(), key=lambda x: int(x[0])):
            if not all(k in v for k in VARIANTS):
                continue
            n = v["full"]["latency_s"]["n"]
            L.append(f"{medium:13} {int(size):>5} {n:>4} {fmt_s(v['full']['latency_s']['median'])} "
                     f"{fmt_s(v['lazy']['latency_s']['median'])} {fmt_s(v['lazy+touch']['latency_s']['median'])}   "
                     f"{v['lazy']['latency_vs_full']:8.3f}x {v['lazy+touch']['latency_vs_full']:10.3f}x   "
                     f"{v['lazy']['latency_lower_pct']:9.1f}% {v['lazy+touch']['latency_lower_pct']:8.1f}%")
    L.append("")
    L.append("completion (restore started -> job done: 5 hot-set passes + check of every word), s, median;"
             " hot = hot set passed")
    L.append(f"{'medium':13} {'size':>5} {'full':>7} {'lazy':>7} {'+touch':>7}   {'lazy/full':>9} "
             f"{'+touch/full':>11}   {'hot: full':>9} {'lazy':>7} {'+touch':>7}   {'faults lazy, +touch':>19}")
    for medium in MEDIA:
        for size, v in sorted(summ.get(medium, {}).items(), key=lambda x: int(x[0])):
            if not all(k in v for k in VARIANTS):
                continue
            c = {k: v[k]["completion_s"]["median"] for k in VARIANTS}
            h = {k: v[k]["hot_ready_s"]["median"] for k in VARIANTS}
            fl = [v[k].get("filler_faults", {}) or {} for k in ("lazy", "lazy+touch")]
            L.append(f"{medium:13} {int(size):>5} {c['full']:7.2f} {c['lazy']:7.2f} {c['lazy+touch']:7.2f}   "
                     f"{v['lazy']['completion_vs_full']:8.2f}x {v['lazy+touch']['completion_vs_full']:10.2f}x   "
                     f"{h['full']:9.2f} {h['lazy']:7.2f} {h['lazy+touch']:7.2f}   "
                     f"{fl[0].get('median', 0):>9.0f} {fl[1].get('median', 0):>9.0f}")
    L.append("")
    L.append("FREM (seed 001): 72.43% (fast network) and 61.96% (slow network) lower restart latency with lazy "
             "restore; target (issue): lazy latency <= 0.10x full at >= 1024 MiB, completion <= 1.10x full")
    if result.get("errors"):
        L.append(f"ERRORS ({len(result['errors'])}): " + "; ".join(e[:200] for e in result["errors"]))
    return "\n".join(L)


# ---------------------------------------------------------------- main

def parse_list(s, what):
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: comma-separated integers, not {s!r}")
    if not out or any(x <= 0 for x in out):
        raise argparse.ArgumentTypeError(f"{what}: positive integers")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=lambda s: parse_list(s, "--sizes"), default=None,
                    help="MiB, comma-separated, for every medium (default: per medium, see above)")
    ap.add_argument("--media", default=",".join(MEDIA),
                    help=f"comma-separated subset of {','.join(MEDIA)} (default: all)")
    ap.add_argument("--reps", type=int, default=3, help="reps on local and loopback (default 3)")
    ap.add_argument("--net-reps", type=int, default=3, help="reps on the veth links (default 3)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run (~2 min): 256 MiB (64 MiB at 100 Mbit/s), 1 rep, no warm-up")
    ap.add_argument("--hot-div", type=int, default=16, help="hot set = SIZE / N MiB (default 16)")
    ap.add_argument("--hot-passes", type=int, default=5, help="hot-set passes of the job after restore (default 5)")
    ap.add_argument("--touch-window", type=float, default=2.0,
                    help="seconds of `dump --touch-window` (default 2; at least 0.5)")
    ap.add_argument("--lazy-threads", type=int, default=None, help="pass --lazy-threads N (default: stasis's)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the untimed local full restore of each image before the measurements")
    ap.add_argument("--dir", default=None, help="work dir for images (default: a fresh dir under /dev/shm)")
    ap.add_argument("--json-out", default=os.path.join(tc.RESULTS, "lazy_restore.json"))
    ap.add_argument("--stasis", default=tc.DEFAULT_STASIS)
    tc.add_quiet_option(ap)
    args = ap.parse_args()
    media = [m.strip() for m in args.media.split(",") if m.strip()]
    bad = [m for m in media if m not in MEDIA]
    if bad or not media:
        ap.error(f"--media: unknown {bad}; choose from {','.join(MEDIA)}")
    if args.reps <= 0 or args.net_reps <= 0 or args.hot_div <= 0 or args.hot_passes <= 0:
        ap.error("--reps, --net-reps, --hot-div, --hot-passes must be positive")
    if args.touch_window < 0.5:
        ap.error("--touch-window: at least 0.5 s (the restore must be a gap of more than 200 ms for the job)")
    if args.quick:
        args.reps = args.net_reps = 1
        args.no_warmup = True
    args.media = media
    args.stasis = os.path.abspath(args.stasis)
    if not tc.check_root_and_binary("lazy_restore", args.stasis):
        return 1
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log("lazy_restore: prctl(PR_SET_CHILD_SUBREAPER) failed")
        return 1
    plan = {}  # medium -> sizes
    for m in media:
        plan[m] = args.sizes or (QUICK_SIZES[m] if args.quick else MEDIA[m][2])
    args.plan = {m: list(s) for m, s in plan.items()}

    t_start = time.monotonic()
    try:
        exe = tc.dr.compile_workloads(("lazy_job",))["lazy_job"]
    except BenchError as e:
        log(f"lazy_restore: FAILED: {e}")
        return 1
    workdir, fstype = tc.make_workdir(args.dir, "lazy")
    result = tc.result_header("lazy_restore", args, args.stasis, workdir, fstype, REFERENCE)
    # Run a private copy: other sessions rebuild target/release/stasis, and
    # one run must not mix two builds (the header has the copy's SHA-256).
    private = os.path.join(workdir, "stasis")
    shutil.copy2(args.stasis, private)
    args.stasis = private

    def interrupt(_sig, _frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)  # clean up (namespaces, processes) on kill too
    signal.signal(signal.SIGINT, interrupt)   # even when started in the background
    result.update({"images": [], "runs": [], "errors": [], "net": {}})
    net = Net()
    b = Bench(args, exe, workdir, net)
    # A full restore from a page server mirrors the image into a temporary
    # directory first: on tmpfs, like the image, not on this VM's disk.
    os.environ["TMPDIR"] = b.mirror_tmp
    interrupted = False
    try:
        if any(MEDIA[m][0] for m in media):
            net.setup()
            log(f"network namespaces {NS_SRV} ({IP_SRV}) and {NS_CLI} ({IP_CLI}) joined by veth {DEV_SRV}-{DEV_CLI}")
        sizes = sorted({s for ss in plan.values() for s in ss})
        for size in sizes:
            log(f"size {size} MiB:")
            try:
                im = b.make_image(size)
            except BenchError as e:
                result["errors"].append(f"image {size} MiB: {e}")
                log(f"  FAILED: {e}")
                continue
            result["images"].append(im["rec"])
            try:
                if not args.no_warmup:
                    w = b.restore(im, "local", "full", f"warmup-{size}", size)
                    im["rec"]["warmup"] = {k: w[k] for k in ("latency_s", "completion_s", "restore_wall_s")}
                    log(f"  warm-up (local full, untimed): latency {w['latency_s'] * 1e3:.0f} ms, "
                        f"completion {w['completion_s']:.2f} s")
                for medium in media:
                    if size not in plan[medium]:
                        continue
                    rate = MEDIA[medium][0]
                    if rate and net.rate != rate:
                        result["net"][medium] = net.shape(rate)
                    reps = args.net_reps if rate else args.reps
                    for rep in range(reps):
                        k = rep % len(VARIANTS)
                        for variant in VARIANTS[k:] + VARIANTS[:k]:  # rotating order
                            tag = f"{medium}-{size}-{variant}-{rep}"
                            try:
                                rec = b.restore(im, medium, variant, tag, size)
                            except BenchError as e:
                                result["errors"].append(f"{tag}: {e}")
                                log(f"  {tag}: FAILED: {e}")
                                continue
                            rec["rep"] = rep
                            result["runs"].append(rec)
                            fs = rec.get("filler_stats") or {}
                            extra = (f", {fs.get('faults')} faults (p50 {fs.get('fault_p50_us')} us, "
                                     f"p99 {fs.get('fault_p99_us')} us), filled in {fs.get('fill_us', 0) / 1e6:.2f} s"
                                     if fs else "")
                            log(f"  {medium:12} rep {rep + 1}/{reps} {variant:10}: latency "
                                f"{rec['latency_s'] * 1e3:8.1f} ms, hot set {rec['hot_ready_s']:6.2f} s, "
                                f"completion {rec['completion_s']:6.2f} s{extra}, {rec['verdict']}")
            finally:
                shutil.rmtree(im["img"], ignore_errors=True)  # SIZE MiB of tmpfs
    except KeyboardInterrupt:
        interrupted = True
        result["errors"].append("interrupted")
    except BenchError as e:
        result["errors"].append(str(e))
        log(f"lazy_restore: FAILED: {e}")
    finally:
        for pid in list(b.live):
            kill_pid(pid)
        b.stop_servers()
        if net.up or any(MEDIA[m][0] for m in media):
            net.teardown()
        reap_strays()

    result["summary"] = summarize(result["runs"])
    result["runtime_s"] = time.monotonic() - t_start
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    txt = table(result)
    result["table"] = txt.splitlines()
    tc.write_json(args.json_out, result)
    print(txt)
    print(f"\n(json: {args.json_out}; runtime {result['runtime_s']:.0f} s)")
    if result["errors"]:
        for e in result["errors"]:
            log(f"lazy_restore: error: {e}")
        log(f"lazy_restore: work dir left for inspection (images deleted): {workdir}")
        return 130 if interrupted else 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
