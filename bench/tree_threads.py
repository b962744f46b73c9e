#!/usr/bin/env python3
"""bench/tree_threads: dump and restore a 16-thread process with 1 GiB and a
tree of 8 processes sharing 512 MiB, against a single-process, single-thread
1 GiB process measured in the same run (the figures of bench/dump_restore.py),
image on tmpfs.

    sudo python3 bench/tree_threads.py [--size-mib 1024] [--threads 16]
                                       [--shared-mib 512] [--nproc 8]
                                       [--private-mib 1] [--reps 3]
                                       [--dir DIR] [--json-out FILE]
                                       [--stasis PATH]

Workloads (each rep runs a tmpfs baseline, then all three, in an order
rotated by one from rep to rep):
  (a) single   threads_fill SIZE 1:        1 process, 1 thread, SIZE MiB private
  (b) threads  threads_fill SIZE THREADS:  1 process, THREADS threads, same memory
  (c) tree     tree_fill SHARED NPROC:     NPROC processes sharing SHARED MiB
               (MAP_SHARED|MAP_ANONYMOUS) plus PRIVATE MiB private each

Needs a release build (cargo build --release) and root (ptrace, clone3
set_tid). See bench/README.md ("tree_threads") for what each figure means.

Exit status: 0 if every dump, restore and memory check worked, 1 if anything
broke (a command failed, a restored process printed FAIL, ...). A workload
that breaks is left out of the remaining reps; the others still run. There
is no pass/fail on the times themselves.
"""

import argparse
import ctypes
import datetime
import hashlib
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
sys.dont_write_bytecode = True  # no bench/__pycache__ from importing dump_restore
import dump_restore as dr  # noqa: E402  (helpers: run_rusage, dir_size, wait_pid, ...)
from dump_restore import BenchError, log, med  # noqa: E402

STASIS = dr.STASIS
BUILD = dr.BUILD
REPO = dr.REPO
PR_SET_CHILD_SUBREAPER = dr.PR_SET_CHILD_SUBREAPER

# The single-process figures of the core issue (bench/README.md, dump_restore.py).
REFERENCE = dict(dr.REFERENCE)
REFERENCE["issue"] = ("Dump and restore time of a 16-thread process with 1 GiB and of a tree of 8 processes "
                      "sharing 512 MiB, against the single-process figures of the core issue; sharing must "
                      "not be copied per process (image size and time prove it).")


# ---------------------------------------------------------------- build

def build_workloads():
    exes = dr.build_workloads()  # fill, tmpfs_write
    exes.update(dr.compile_workloads(("threads_fill", "tree_fill"), ["-pthread"]))
    return exes


# ---------------------------------------------------------------- workloads

def workloads(args, exes):
    """The three workloads. mem_bytes is the memory the workload has written,
    each byte counted once (shared memory once, not once per process): the
    amount a dump must save, and the base of every GB/s figure."""
    size = args.size_mib << 20
    shared = args.shared_mib << 20
    priv = args.private_mib << 20
    return [
        {"key": "single", "label": "(a) 1 thread", "tag": "a",
         "what": f"threads_fill {args.size_mib} MiB, 1 thread: 1 process, 1 thread, {args.size_mib} MiB private",
         "argv": lambda pidfile: [exes["threads_fill"], pidfile, str(args.size_mib), "1"],
         "mem_bytes": size, "processes": 1, "threads": 1, "shared_bytes": 0},
        {"key": "threads", "label": f"(b) {args.threads} threads", "tag": "b",
         "what": (f"threads_fill {args.size_mib} MiB, {args.threads} threads: 1 process, {args.threads} threads, "
                  f"{args.size_mib} MiB private, {args.size_mib / args.threads:g} MiB written by each thread"),
         "argv": lambda pidfile: [exes["threads_fill"], pidfile, str(args.size_mib), str(args.threads)],
         "mem_bytes": size, "processes": 1, "threads": args.threads, "shared_bytes": 0},
        {"key": "tree", "label": f"(c) {args.nproc} processes", "tag": "c",
         "what": (f"tree_fill {args.shared_mib} MiB shared, {args.nproc} processes: {args.shared_mib} MiB "
                  f"MAP_SHARED|MAP_ANONYMOUS + {args.nproc} x {args.private_mib} MiB private = "
                  f"{(shared + args.nproc * priv) >> 20} MiB"),
         "argv": lambda pidfile: [exes["tree_fill"], pidfile, str(args.shared_mib), str(args.nproc),
                                  str(args.private_mib)],
         "mem_bytes": shared + args.nproc * priv, "processes": args.nproc, "threads": args.nproc,
         "shared_bytes": shared},
    ]


def ppid_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


class Bench(dr.Bench):
    """dr.Bench gives baseline() (tmpfs_write) and kill_live(); this adds a
    cycle for any workload, including process trees."""

    def start(self, w, tag):
        pidfile = os.path.join(self.workdir, f"{tag}.pid")
        logf = os.path.join(self.workdir, f"{tag}.log")
        for p in (pidfile, pidfile + ".tmp"):
            if os.path.exists(p):
                os.unlink(p)
        with open(logf, "w"):
            pass
        argv = w["argv"](pidfile)
        out = open(logf, "a")  # O_APPEND: the children of tree_fill write to it too
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 close_fds=True, pass_fds=(), cwd=self.workdir)
        finally:
            out.close()
        self.live.add(p.pid)
        deadline = time.monotonic() + 120
        while not os.path.exists(pidfile):
            if p.poll() is not None:
                self.live.discard(p.pid)
                raise BenchError(f"{shlex.join(argv)} exited early ({p.returncode}): {open(logf).read()}")
            if time.monotonic() > deadline:
                raise BenchError(f"{shlex.join(argv)} did not write its pidfile within 120 s")
            time.sleep(0.005)
        with open(pidfile) as f:
            lines = f.read().splitlines()
        pid = int(lines[0])
        children = [int(x) for x in lines[1].split()] if len(lines) > 1 else []
        self.live.update(children)
        if pid != p.pid:
            raise BenchError(f"workload pidfile says {pid}, child is {p.pid}")
        return p, logf, children, argv

    def check_shape(self, w, pid, children, when):
        """The tree and threads are what the workload made: every child a
        child of the root, THREADS tasks in the threaded process."""
        if len(children) != w["processes"] - 1:
            raise BenchError(f"{when}: {len(children)} children, want {w['processes'] - 1}")
        for c in children:
            try:
                pp = ppid_of(c)
            except OSError:
                raise BenchError(f"{when}: child {c} does not exist")
            if pp != pid:
                raise BenchError(f"{when}: child {c} has parent {pp}, want {pid}")
        tasks = sum(len(os.listdir(f"/proc/{q}/task")) for q in [pid] + children)
        if tasks != w["threads"]:
            raise BenchError(f"{when}: {tasks} threads in the tree, want {w['threads']}")

    def cycle(self, w, tag):
        """start -> dump (kill) -> reap the tree -> restore -> check shape ->
        SIGTERM -> PASS."""
        size = w["mem_bytes"]
        img = os.path.join(self.workdir, f"img-{tag}")
        if os.path.exists(img):
            shutil.rmtree(img)
        proc, logf, children, argv = self.start(w, tag)
        pid = proc.pid
        self.check_shape(w, pid, children, "before the dump")
        rec = {"workload": w["key"], "mem_bytes": size, "pid": pid, "children": children,
               "workload_argv": argv}

        # dump
        rk0 = dr.reported_kib()
        # CPU the workload has used so far: what it uses during the dump (its
        # exit after the kill, freeing its memory) is not "other processes".
        wl_cpu0 = sum(dr.proc_cpu_s(q) for q in [pid] + children)
        dump_argv = [STASIS, "dump", "-t", str(pid), "-D", img, "--json"]
        rec["dump_argv"] = dump_argv
        rc, wall, usage, stdout, stderr = dr.run_rusage(
            dump_argv, os.path.join(self.workdir, f"{tag}.dump.out"),
            os.path.join(self.workdir, f"{tag}.dump.err"))
        if rc != 0:
            raise BenchError(f"stasis dump failed (exit {rc}): {shlex.join(dump_argv)}\n"
                             f"workload: {shlex.join(argv)}\n{stderr}{stdout}")
        d = dr.parse_json_line(stdout, "stasis dump")
        if not d.get("killed"):
            raise BenchError(f"stasis dump did not kill the process: {d}")
        status, wl_cpu1 = wait4_pid(pid, 30, "dumped process")
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        self.live.discard(pid)
        if proc.returncode != -signal.SIGKILL:
            raise BenchError(f"dumped process {pid} ended with {proc.returncode}, expected SIGKILL; "
                             f"log: {open(logf).read()}")
        # The root's children were re-parented to us (subreaper) when it died.
        for c in children:
            status, c_cpu = wait4_pid(c, 30, "dumped child")
            wl_cpu1 += c_cpu
            self.live.discard(c)
            if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                raise BenchError(f"dumped child {c} ended with status {status:#x}, expected SIGKILL")
        usage["dumped_process_cpu_s"] = max(0.0, wl_cpu1 - wl_cpu0)
        usage["other_cpu_s"] = max(0.0, usage["other_cpu_s"] - usage["dumped_process_cpu_s"])
        if (d["processes"], d["threads"]) != (w["processes"], w["threads"]):
            raise BenchError(f"stasis dump saw {d['processes']} processes, {d['threads']} threads; "
                             f"want {w['processes']}, {w['threads']}: {d}")
        apparent, allocated, nfiles = dr.dir_size(img)
        rec["dump"] = dr.dump_record(d, wall, usage, size)
        rec["image"] = {"apparent_bytes": apparent, "allocated_bytes": allocated, "files": nfiles,
                        "ratio_to_memory": apparent / size}
        if w["shared_bytes"]:
            rec["image"]["ratio_to_shared"] = apparent / w["shared_bytes"]

        # restore
        pidfile = os.path.join(self.workdir, f"{tag}.restored.pid")
        if os.path.exists(pidfile):
            os.unlink(pidfile)
        restore_argv = [STASIS, "restore", "-D", img, "--detach", "--json", "--pidfile", pidfile]
        rec["restore_argv"] = restore_argv
        rc, wall, usage, stdout, stderr = dr.run_rusage(
            restore_argv, os.path.join(self.workdir, f"{tag}.restore.out"),
            os.path.join(self.workdir, f"{tag}.restore.err"))
        if rc != 0:
            raise BenchError(f"stasis restore failed (exit {rc}): {shlex.join(restore_argv)}\n"
                             f"(image of: {shlex.join(argv)})\n{stderr}{stdout}")
        r = dr.parse_json_line(stdout, "stasis restore")
        rpid = r["pid"]
        self.live.add(rpid)
        self.live.update(children)
        if rpid != pid:
            raise BenchError(f"restored at pid {rpid}, dumped pid was {pid}")
        if (r["processes"], r["threads"]) != (w["processes"], w["threads"]):
            raise BenchError(f"stasis restore made {r['processes']} processes, {r['threads']} threads; "
                             f"want {w['processes']}, {w['threads']}: {r}")
        rk1 = dr.reported_kib()
        # The restored processes fill their own memory (their CPU time is not
        # the restorer's): count it, and take it out of "other processes".
        child_cpu = sum(dr.proc_cpu_s(q) for q in [rpid] + children)
        usage["restored_process_cpu_s"] = child_cpu
        usage["other_cpu_s"] = max(0.0, usage["other_cpu_s"] - child_cpu)
        self.check_shape(w, rpid, children, "after the restore")
        rec["restore"] = dr.restore_record(r, wall, usage, size)

        # check the restored memory (the root signals and reaps its children)
        dr.check_restored_pass(rpid, logf, "restored process", context=f"; workload: {shlex.join(argv)}")
        self.live.discard(rpid)
        self.live.difference_update(children)
        rec["verified"] = "PASS"
        if rk0 is not None and rk1 is not None:
            rec["free_page_reporting_kib_during_cycle"] = rk1 - rk0
        shutil.rmtree(img)
        for p in (logf, pidfile):
            if os.path.exists(p):
                os.unlink(p)
        return rec

    def kill_live(self):
        super().kill_live()
        reap_orphans(1.0)


def wait4_pid(pid, timeout, what):
    """Reaps pid (our child, or re-parented to us as subreaper); returns its
    wait status and its CPU seconds (not counting its own reaped children:
    the dumped root never reaps its killed children)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got, status, ru = os.wait4(pid, os.WNOHANG)
        except ChildProcessError:
            raise BenchError(f"{what} (pid {pid}) is not our child: cannot reap it")
        if got == pid:
            return status, ru.ru_utime + ru.ru_stime
        if time.monotonic() > deadline:
            raise BenchError(f"{what} (pid {pid}) did not exit within {timeout}s")
        time.sleep(0.002)


def own_peak_rss_kib():
    """VmHWM of this script. subprocess starts commands with vfork(), and
    exec() folds the parent's peak RSS into the child's ru_maxrss, so no
    command's peak RSS can read lower than this."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reap_orphans(settle_s=0.0):
    """Reaps whatever was re-parented to us (we are a subreaper)."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.01)


# ---------------------------------------------------------------- report

KEYS = {
    "dump_total_s": lambda r: r["dump"]["total_s"],
    "dump_wall_s": lambda r: r["dump"]["wall_s"],
    "dump_frozen_s": lambda r: r["dump"]["frozen_s"],
    "restore_net_s": lambda r: r["restore"]["net_s"],
    "restore_wall_s": lambda r: r["restore"]["wall_s"],
    "restore_pid_wait_s": lambda r: r["restore"]["pid_wait_s"],
    "dump_cpu_s": lambda r: r["dump"]["cpu_s"],
    "dump_other_cpu_s": lambda r: r["dump"]["other_cpu_s"],
    "restore_cpu_s": lambda r: r["restore"]["cpu_s"],
    "restore_child_cpu_s": lambda r: r["restore"]["restored_process_cpu_s"],
    "restore_other_cpu_s": lambda r: r["restore"]["other_cpu_s"],
    "image_bytes": lambda r: r["image"]["apparent_bytes"],
    "pages": lambda r: r["dump"]["pages"],
    "dump_peak_rss_kib": lambda r: r["dump"]["peak_rss_kib"],
    "restore_peak_rss_kib": lambda r: r["restore"]["peak_rss_kib"],
}
TIMED = ("dump_total", "dump_wall", "dump_frozen", "restore_net", "restore_wall")


def stats(vals):
    return {"median": med(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def summarize_workload(recs, mem_bytes):
    gib = mem_bytes / 2**30
    m = {k: stats([f(r) for r in recs]) for k, f in KEYS.items()}
    for base in TIMED:
        s = m[base + "_s"]
        m[base + "_gbps"] = {"median": mem_bytes / s["median"] / 1e9, "min": mem_bytes / s["max"] / 1e9,
                             "max": mem_bytes / s["min"] / 1e9}
        m[base + "_s_per_gib"] = {"median": s["median"] / gib}
    m["image_ratio_to_memory"] = m["image_bytes"]["median"] / mem_bytes
    return m


def summarize_baseline(bases, size_mib):
    size = size_mib << 20
    m = {}
    for k in ("write_s", "read_s", "read_fresh_s", "other_cpu_s"):
        m[k] = stats([b[k] for b in bases])
    for k in ("write", "read", "read_fresh"):
        m[k + "_gbps"] = {"median": size / m[k + "_s"]["median"] / 1e9}
        m[k + "_s_per_gib"] = {"median": m[k + "_s"]["median"] / (size / 2**30)}
    return m


def compare(med_by, wl, bl):
    """Ratios of medians against (a). Time ratios for (b) (same memory size);
    seconds-per-GiB ratios for (c) (a different memory size); and each
    against the physical limit (stasis throughput / baseline throughput)."""
    a = med_by.get("single")
    a_mem = next(w["mem_bytes"] for w in wl if w["key"] == "single")
    out = {}
    for w in wl:
        m = med_by.get(w["key"])
        if m is None:
            continue
        c = {}
        if a is not None and w["key"] != "single":
            for base in TIMED:
                c[base + "_time_vs_single"] = m[base + "_s"]["median"] / a[base + "_s"]["median"]
                c[base + "_s_per_gib_vs_single"] = (m[base + "_s_per_gib"]["median"]
                                                     / a[base + "_s_per_gib"]["median"])
                # The same from the fastest rep of each: the noise on this VM
                # (lazily backed memory, other tenants) only ever slows down.
                c[base + "_s_per_gib_vs_single_min"] = ((m[base + "_s"]["min"] / w["mem_bytes"])
                                                         / (a[base + "_s"]["min"] / a_mem))
            c["image_vs_single"] = m["image_bytes"]["median"] / a["image_bytes"]["median"]
        if w["shared_bytes"]:
            c["image_vs_shared"] = m["image_bytes"]["median"] / w["shared_bytes"]
            c["image_if_copied_per_process_bytes"] = w["processes"] * w["shared_bytes"]
            c["image_vs_copied_per_process"] = m["image_bytes"]["median"] / (w["processes"] * w["shared_bytes"])
            if a is not None:
                # What the times would be if every process's view of the shared
                # area were saved and restored as its own copy, at (a)'s speed.
                copied_gib = (w["processes"] * w["shared_bytes"] + w["mem_bytes"] - w["shared_bytes"]) / 2**30
                for base in ("dump_total", "restore_net"):
                    c[base + "_if_copied_per_process_s"] = copied_gib * a[base + "_s_per_gib"]["median"]
        if bl is not None:
            c["dump_total_vs_tmpfs_write"] = m["dump_total_gbps"]["median"] / bl["write_gbps"]["median"]
            c["restore_net_vs_tmpfs_read_fresh"] = m["restore_net_gbps"]["median"] / bl["read_fresh_gbps"]["median"]
        out[w["key"]] = c
    return out


def table(args, wl, med_by, cmp, base, failures, dirpath, fstype, floor_kib, reps):
    lines = []
    lines.append(f"stasis dump/restore: threads and process trees vs one process, one thread; image in {dirpath} "
                 f"({fstype}), {args.reps} reps, median [min-max]")
    lines.append("")
    for w in wl:
        lines.append(f"{w['label']:17} {w['what']}")
    lines.append("")
    lines.append(f"{'':34} {'median [min-max] s':>21} {'GB/s':>6} {'s/GiB':>6}  {'vs (a)':28} vs physical limit")

    def row(name, m, key, vs_a="", vs_lim=""):
        s = m[key + "_s"]
        g = m[key + "_gbps"]["median"]
        spg = m[key + "_s_per_gib"]["median"]
        lines.append(f"{name:34} {s['median']:7.3f} [{s['min']:.3f}-{s['max']:.3f}] {g:6.2f} {spg:6.3f}  "
                     f"{vs_a:28} {vs_lim}".rstrip())

    for w in wl:
        k = w["key"]
        if k in failures:
            lines.append(f"{w['label']:17} FAILED: {failures[k]['error'].splitlines()[0]}")
            continue
        if k not in med_by:
            continue
        m, c = med_by[k], cmp.get(k, {})

        def vs(base_key):
            if k == "single" or base_key + "_time_vs_single" not in c:
                return ""
            if w["mem_bytes"] == wl[0]["mem_bytes"]:
                return f"{c[base_key + '_time_vs_single']:.2f}x the (a) time"
            return f"{c[base_key + '_s_per_gib_vs_single']:.2f}x the (a) s/GiB"

        lim_d = f"{c['dump_total_vs_tmpfs_write']:.2f}x tmpfs write" if "dump_total_vs_tmpfs_write" in c else ""
        lim_r = (f"{c['restore_net_vs_tmpfs_read_fresh']:.2f}x tmpfs read-fresh"
                 if "restore_net_vs_tmpfs_read_fresh" in c else "")
        p = w["label"].split(" ", 1)[0]
        row(f"{w['label']}: dump (total_us)", m, "dump_total", vs("dump_total"), lim_d)
        row(f"{p} dump (wall, whole command)", m, "dump_wall", vs("dump_wall"))
        row(f"{p}   of which process frozen", m, "dump_frozen", vs("dump_frozen"))
        row(f"{p} restore (total - pid_wait)", m, "restore_net", vs("restore_net"), lim_r)
        row(f"{p} restore (wall, whole command)", m, "restore_wall", vs("restore_wall"))
    mins = []
    for w in wl:
        c = cmp.get(w["key"], {})
        if "dump_total_s_per_gib_vs_single_min" in c:
            mins.append(f"{w['label'].split(' ', 1)[0]} dump {c['dump_total_s_per_gib_vs_single_min']:.2f}x, "
                        f"restore {c['restore_net_s_per_gib_vs_single_min']:.2f}x")
    if mins:
        lines.append(f"{'vs (a), fastest rep of each, s/GiB':34} " + "; ".join(mins))
    if base is not None:
        b = base
        for name, key in (("baseline: tmpfs write (mem->tmpfs)", "write"), ("baseline: tmpfs read (tmpfs->mem)", "read"),
                          ("baseline: tmpfs read, fresh memory", "read_fresh")):
            s = b[key + "_s"]
            lines.append(f"{name:34} {s['median']:7.3f} [{s['min']:.3f}-{s['max']:.3f}] "
                         f"{b[key + '_gbps']['median']:6.2f} {b[key + '_s_per_gib']['median']:6.3f}  "
                         f"(tmpfs_write, {args.size_mib} MiB)")
    lines.append("")
    lines.append("image size (all files of the checkpoint), pages saved (stasis JSON):")
    for w in wl:
        k = w["key"]
        if k not in med_by:
            continue
        m, c = med_by[k], cmp.get(k, {})
        img = m["image_bytes"]["median"]
        txt = (f"  {w['label']:17} {img / 2**20:8.1f} MiB = {m['image_ratio_to_memory']:.4f} x memory "
               f"({w['mem_bytes'] / 2**20:.0f} MiB)")
        if "image_vs_single" in c:
            txt += f", {c['image_vs_single']:.4f} x (a)"
        txt += f"; {m['pages']['median']:.0f} pages"
        lines.append(txt)
        if w["shared_bytes"]:
            lines.append(f"  {'':17} = {c['image_vs_shared']:.4f} x the shared area ({w['shared_bytes'] >> 20} MiB); "
                         f"copied per process it would be {w['processes']} x {w['shared_bytes'] >> 20} = "
                         f"{c['image_if_copied_per_process_bytes'] >> 20} MiB "
                         f"(this image is {c['image_vs_copied_per_process']:.3f} x that)")
            if "dump_total_if_copied_per_process_s" in c:
                lines.append(f"  {'':17} time: copied per process at (a)'s s/GiB, dump would take "
                             f"{c['dump_total_if_copied_per_process_s']:.2f} s and restore "
                             f"{c['restore_net_if_copied_per_process_s']:.2f} s; measured "
                             f"{m['dump_total_s']['median']:.2f} s and {m['restore_net_s']['median']:.2f} s")
    def rss(kib):
        # At the floor, the command's own peak is unknown: at most the floor.
        if floor_kib and kib <= floor_kib * 1.01:
            return f"<={floor_kib / 1024:.1f}"
        return f"{kib / 1024:.1f}"

    floor = f"; '<=': at most this script's own peak RSS, {floor_kib / 1024:.1f} MiB" if floor_kib else ""
    lines.append(f"dumper / restorer peak RSS (median{floor}): " + ", ".join(
        f"{w['label'].split(' ', 1)[0]} {rss(med_by[w['key']]['dump_peak_rss_kib']['median'])} / "
        f"{rss(med_by[w['key']]['restore_peak_rss_kib']['median'])} MiB" for w in wl if w["key"] in med_by))
    lines.append("CPU s (median), dump in stasis; restore in stasis + in the restored processes: " + ", ".join(
        f"{w['label'].split(' ', 1)[0]} {med_by[w['key']]['dump_cpu_s']['median']:.2f}; "
        f"{med_by[w['key']]['restore_cpu_s']['median']:.2f} + {med_by[w['key']]['restore_child_cpu_s']['median']:.2f}"
        for w in wl if w["key"] in med_by))
    lines.append("other processes' CPU s meanwhile (median; > ~0.1 means the machine was not quiet), dump/restore: "
                 + ", ".join(f"{w['label'].split(' ', 1)[0]} {med_by[w['key']]['dump_other_cpu_s']['median']:.3f}/"
                             f"{med_by[w['key']]['restore_other_cpu_s']['median']:.3f}"
                             for w in wl if w["key"] in med_by))
    fpr = [r["free_page_reporting_kib_during_rep"] for r in reps if "free_page_reporting_kib_during_rep" in r]
    if fpr:
        hit = [f"{w['label'].split(' ', 1)[0]}" for r in reps for w in wl
               if r.get(w["key"], {}).get("free_page_reporting_kib_during_cycle", 0) > 0]
        lines.append("free memory handed back to the host during each rep (free page reporting; such memory is "
                     "slow on first touch): " + ", ".join(f"{k / 1024:.0f}" for k in fpr) + " MiB; cycles with any: "
                     + (" ".join(hit) if hit else "none"))
    ok = [f"{w['label'].split(' ', 1)[0]} {med_by[w['key']]['dump_total_s']['n']}" for w in wl if w["key"] in med_by]
    if ok:
        lines.append("every restored process checked its memory and printed PASS (reps per workload: "
                     + ", ".join(ok) + ")" + ("; the tree also checked that each child's write after the restore "
                                              "reached the root through the shared area" if "tree" in med_by else ""))
    lines.append("GB = 1e9 bytes of the workload's memory, shared memory counted once; s/GiB per 2^30 bytes of it. "
                 "vs (a): ratio of medians (time, or s/GiB when the memory differs; > 1 is slower). "
                 "vs physical limit: stasis throughput / tmpfs throughput.")
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def stasis_info():
    """The binary, and the checkout it was built from if it is this one's
    target/ (commit, modified tracked files). A binary from elsewhere (e.g. a
    clean `git archive` export) is identified by its SHA-256 only."""
    h = hashlib.sha256()
    with open(STASIS, "rb") as f:  # in chunks: this process's peak RSS is a floor of the RSS figures
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    info = {"binary": STASIS, "binary_sha256": digest,
            "binary_mtime_utc": datetime.datetime.fromtimestamp(
                os.path.getmtime(STASIS), datetime.timezone.utc).isoformat(timespec="seconds")}
    git = dr.git_info()
    if STASIS.startswith(os.path.join(REPO, "target") + os.sep):
        info.update(git)
    else:
        info["bench_checkout"] = git
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024, help="memory of (a) and (b) (default 1024)")
    ap.add_argument("--threads", type=int, default=16, help="threads of (b), main included (default 16)")
    ap.add_argument("--shared-mib", type=int, default=512, help="shared memory of (c) (default 512)")
    ap.add_argument("--nproc", type=int, default=8, help="processes of (c), root included (default 8)")
    ap.add_argument("--private-mib", type=int, default=1, help="private memory of each process of (c) (default 1)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="work dir for images (default: a fresh dir under /dev/shm)")
    ap.add_argument("--json-out", default=os.path.join(BENCH, "results", "tree_threads.json"))
    ap.add_argument("--stasis", default=dr.STASIS,
                    help="stasis binary (default: target/release/stasis of this checkout)")
    args = ap.parse_args()
    for k in ("size_mib", "threads", "shared_mib", "nproc", "private_mib", "reps"):
        if getattr(args, k) <= 0:
            ap.error(f"--{k.replace('_', '-')} must be positive")
    if args.nproc * 4096 > args.shared_mib << 20:
        ap.error("--nproc must be at most --shared-mib * 256 (one marker page per process)")

    if os.geteuid() != 0:
        log("tree_threads: needs root (ptrace and clone3 set_tid): run with sudo")
        return 1
    global STASIS
    STASIS = os.path.abspath(args.stasis)
    if not os.access(STASIS, os.X_OK):
        log(f"tree_threads: {STASIS} not found: run `cargo build --release` first")
        return 1
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log("tree_threads: prctl(PR_SET_CHILD_SUBREAPER) failed")
        return 1

    t_start = time.monotonic()
    started = datetime.datetime.now(datetime.timezone.utc)
    try:
        exes = build_workloads()
    except BenchError as e:
        log(f"tree_threads: FAILED: {e}")
        return 1
    if args.dir is None:
        workdir = tempfile.mkdtemp(prefix="stasis-bench-", dir="/dev/shm")
    else:
        os.makedirs(args.dir, exist_ok=True)
        workdir = tempfile.mkdtemp(prefix="stasis-bench-", dir=args.dir)
    fstype = dr.fs_type(workdir)
    if fstype != "tmpfs":
        log(f"tree_threads: warning: {workdir} is on {fstype}, not tmpfs; the figures are not comparable")

    b = Bench(args, exes, workdir)
    wl = workloads(args, exes)
    result = {
        "benchmark": "tree_threads",
        "date_utc": started.isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable] + sys.argv),
        "params": {"size_mib": args.size_mib, "threads": args.threads, "shared_mib": args.shared_mib,
                   "nproc": args.nproc, "private_mib": args.private_mib, "reps": args.reps,
                   "dir": workdir, "fs_type": fstype},
        "workloads": {w["key"]: {"label": w["label"], "what": w["what"], "mem_bytes": w["mem_bytes"],
                                 "processes": w["processes"], "threads": w["threads"],
                                 "shared_bytes": w["shared_bytes"]} for w in wl},
        "machine": dr.machine_info(),
        "stasis": stasis_info(),
        "reference": REFERENCE,
    }
    failures = {}

    def run_cycle(w, tag):
        try:
            return b.cycle(w, tag)
        except BenchError as e:
            b.kill_live()
            failures[w["key"]] = {"tag": tag, "error": str(e)}
            log(f"tree_threads: {w['label']} FAILED ({tag}): {e}")
            return None

    reps = []
    try:
        log(f"work dir {workdir} ({fstype}); warm-up (untimed): baseline + one dump/restore cycle of each workload")
        try:
            b.baseline(args.size_mib)
        except BenchError as e:
            failures["baseline"] = {"tag": "warmup", "error": str(e)}
        result["warmup"] = {}
        for w in wl:
            result["warmup"][w["key"]] = run_cycle(w, f"warmup-{w['tag']}")
        for i in range(args.reps):
            rk0 = dr.reported_kib()
            rep = {"rep": i}
            if "baseline" not in failures:
                try:
                    rep["baseline"] = b.baseline(args.size_mib)
                except BenchError as e:
                    failures["baseline"] = {"tag": f"rep{i}", "error": str(e)}
            msg = []
            # Rotate the order from rep to rep, so that no workload always
            # runs right after the baseline (which leaves 2 GiB just freed).
            order = wl[i % len(wl):] + wl[:i % len(wl)]
            rep["order"] = [w["key"] for w in order]
            for w in order:
                if w["key"] in failures:
                    continue
                rec = run_cycle(w, f"rep{i}-{w['tag']}")
                if rec is not None:
                    rep[w["key"]] = rec
                    msg.append(f"{w['label'].split(' ', 1)[0]} dump {rec['dump']['total_s']:.3f} "
                               f"restore {rec['restore']['net_s']:.3f} {rec['verified']}")
            rk1 = dr.reported_kib()
            if rk0 is not None and rk1 is not None:
                rep["free_page_reporting_kib_during_rep"] = rk1 - rk0
            reps.append(rep)
            if "baseline" in rep:
                bb = rep["baseline"]
                msg.append(f"tmpfs write {bb['write_s']:.3f} read {bb['read_s']:.3f} "
                           f"read-fresh {bb['read_fresh_s']:.3f}")
            log(f"rep {i + 1}/{args.reps}: " + "; ".join(msg))
    except BaseException:
        b.kill_live()
        raise

    med_by = {}
    for w in wl:
        recs = [r[w["key"]] for r in reps if w["key"] in r]
        if recs and w["key"] not in failures:
            med_by[w["key"]] = summarize_workload(recs, w["mem_bytes"])
    bases = [r["baseline"] for r in reps if "baseline" in r]
    base = summarize_baseline(bases, args.size_mib) if bases else None
    cmp = compare(med_by, wl, base)
    floor_kib = own_peak_rss_kib()
    txt = table(args, wl, med_by, cmp, base, failures, workdir, fstype, floor_kib, reps)
    result.update({"reps": reps, "median": med_by, "baseline_median": base, "comparison": cmp,
                   "failures": failures, "runtime_s": time.monotonic() - t_start,
                   "bench_peak_rss_kib": floor_kib})
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    result["table"] = txt.splitlines()

    os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
    with open(args.json_out + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    os.replace(args.json_out + ".tmp", args.json_out)

    reap_orphans()
    print(txt)
    print(f"\n(json: {args.json_out}; runtime {result['runtime_s']:.0f} s)")
    if failures:
        for k, f in failures.items():
            log(f"tree_threads: FAILED: {k} ({f['tag']}): {f['error']}")
        log(f"tree_threads: work dir left for inspection: {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)  # our fresh dir (under /dev/shm or under --dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
