#!/usr/bin/env python3
"""bench/big_incremental: incremental checkpoint of a big process (4 GiB) of
which 1% of the pages were written since the previous checkpoint: total and
frozen time, against a full checkpoint of the same process in the same run.
Image on tmpfs.

    sudo python3 bench/big_incremental.py [--size-mib 4096] [--pct 1]
                                          [--reps 5] [--pattern scattered]
                                          [--track uffd] [--concurrent]
                                          [--supervised [--cow-buffer SIZE]]
                                          [--no-restore]
                                          [--dir DIR] [--json-out FILE]
                                          [--stasis PATH] [--wait-quiet SECS]

One `dirty_pages` process (SIZE MiB, every byte written):
  1. full, no tracking:  `stasis dump --leave-running` into a separate
     directory (the cost of a checkpoint without incremental), deleted after;
     twice, the first one a warm-up (shown, not compared);
  2. full + arm:         `stasis dump --leave-running --track T` (the first
     checkpoint of the chain);
  3. REPS times: the process writes PCT% of its pages, then
     `stasis dump --leave-running` into the chain's directory (incremental);
     then, as a baseline, tmpfs_write copies as many MiB as that checkpoint
     saved into a fresh tmpfs file (the copy the dump could not avoid), twice
     in a row (see README), and the script pauses 3 s;
  4. SIGTERM: the process checks all its memory (PASS);
  5. unless --no-restore: `stasis restore --detach` of the latest incremental
     checkpoint (which needs the whole chain), at the same PID, and SIGTERM:
     the restored process checks all its memory (PASS).

With --supervised the chain is made by `stasis run --concurrent --cow-method
uffd` instead (the write-protection of each concurrent copy kept as the
dirty tracking; TIC-CKPT-CI): the script asks for each checkpoint through
the job's request socket (STASIS_RUN_REQUEST, as stasis_request_checkpoint()
does), skips step 1, and reads each checkpoint's report from `stasis run
--json`; the freeze then only collects the written pages and protects them
again, and they are copied after the release.

Exit status: 1 if anything broke (a command failed, a memory check failed,
an incremental checkpoint saved fewer pages than were written), else 0. No
time is pass/fail.
"""

import argparse
import ctypes
import os
import shutil
import signal
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True
import track_common as tc  # noqa: E402
from track_common import BenchError, log, stats  # noqa: E402

PR_SET_CHILD_SUBREAPER = 36
REFERENCE = {
    "target_incremental_total_ms": 100,
    "target_incremental_frozen_ms": 20,
    "note": "issue: 4 GiB process, 1% of pages dirty between two checkpoints",
}
KEYS = ("checkpoint", "pages", "bytes", "frozen_us", "total_us", "parent", "track", "armed", "note", "wall_s",
        "argv")


def brief(d):
    out = {k: d.get(k) for k in KEYS}
    out["usage"] = d.get("usage")
    out["frozen_stages"] = d.get("frozen_stages", [])
    return out


def incremental_record(d, r, quiet, busy0, what):
    """The record of one incremental checkpoint `d` (a dump report) after
    the round `r`; fails unless it is incremental and holds every page
    written."""
    rec = brief(d)
    rec["machine_busy_cpu_s"] = tc.dr.cpu_busy_s() - busy0
    rec["quiet_wait_s"] = quiet
    rec["written_pages"] = r["pages"]
    rec["write_ns"] = r["write_ns"]
    if d.get("parent") is None:
        raise BenchError(f"{what} was not incremental: {d}")
    if d["pages"] < r["pages"]:
        raise BenchError(f"{what} saved {d['pages']} pages, {r['pages']} were written")
    return rec


def stage_lengths(rec):
    """{stage: ms} of one report's frozen time (its `frozen_stages` marks)."""
    out, prev = {}, 0
    for m in rec.get("frozen_stages") or []:
        out[m["stage"]] = (m["end_us"] - prev) / 1e3
        prev = m["end_us"]
    return out


def tmpfs_baseline(exe, workdir, nbytes):
    """tmpfs_write of the same amount (whole MiB), twice in a row: the time to
    copy that much memory into fresh tmpfs pages, as the dump had to. The
    first run mostly gets memory the VM's host must back again (free page
    reporting hands freed memory back), the second reuses what the first
    freed: the two ends of what a dump meets here."""
    mib = max(1, -(-nbytes // 2**20))
    out, err = os.path.join(workdir, "baseline.out"), os.path.join(workdir, "baseline.err")
    res = {"mib": mib}
    for key in ("write_s", "write_again_s"):
        rc, _wall, _usage, stdout, stderr = tc.dr.run_rusage(
            [exe, os.path.join(workdir, "baseline.bin"), str(mib)], out, err)
        if rc != 0:
            raise BenchError(f"tmpfs_write failed ({rc}): {stderr}")
        vals = dict(line.split() for line in stdout.splitlines() if line.strip())
        res[key] = float(vals["write_s"])
    return res


def run(args, exes, workdir, result):
    exe = exes["dirty_pages"]
    dumper = tc.Dumper(args.stasis, workdir)
    ctl = os.path.join(workdir, "ctl")
    os.makedirs(ctl)
    logf = os.path.join(ctl, "log")
    bp = int(round(args.pct * 100))
    argv = [exe, ctl, str(args.size_mib), str(bp), args.pattern]
    result["workload_argv"] = argv
    t0 = time.monotonic()
    proc = tc.start_workload(argv, logf, ctl)
    live = [proc]
    try:
        tc.wait_file(os.path.join(ctl, "pid"), proc, 600, "dirty_pages", logf)
        result["fill_s"] = time.monotonic() - t0
        pid = proc.pid
        npages = (args.size_mib << 20) // 4096

        # 1. full, no tracking (separate directory), twice: the first one
        # also makes the VM's host back the memory the image needs (a first
        # touch of guest memory is slow here), so the second is the figure.
        img_plain = os.path.join(workdir, "img-full-plain")
        for i in range(2):
            d = dumper.dump(pid, img_plain, leave_running=True)
            rec = brief(d)
            rec["image_bytes"] = tc.dr.dir_size(img_plain)[0]
            result["full_plain_warmup" if i == 0 else "full_plain"] = rec
            shutil.rmtree(img_plain)
            log(f"full, no tracking{' (warm-up)' if i == 0 else ''}: {d['pages']} pages, "
                f"total {d['total_us'] / 1e3:.0f} ms, frozen {d['frozen_us'] / 1e3:.0f} ms")

        # 2. full + arm: the first checkpoint of the chain
        img = os.path.join(workdir, "img")
        d = dumper.dump(pid, img, leave_running=True, track=args.track)
        if d.get("armed") != args.track:
            raise BenchError(f"`{' '.join(d['argv'])}` did not arm {args.track}: {d}")
        result["full_arm"] = brief(d)
        log(f"full + arm {args.track}: {d['pages']} pages, total {d['total_us'] / 1e3:.0f} ms, "
            f"frozen {d['frozen_us'] / 1e3:.0f} ms")

        # 3. incremental checkpoints
        incs = []
        for k in range(1, args.reps + 1):
            os.kill(pid, signal.SIGUSR1)
            rf = os.path.join(ctl, f"round.{k}")
            tc.wait_file(rf, proc, 120, f"dirty_pages round {k}", logf)
            r = tc.read_kv(rf)
            quiet = tc.wait_quiet(args.wait_quiet)
            busy0 = tc.dr.cpu_busy_s()
            d = dumper.dump(pid, img, leave_running=True, extra=["--concurrent"] if args.concurrent else [])
            rec = incremental_record(d, r, quiet, busy0, f"`{' '.join(d['argv'])}`")
            # The baseline, then a pause: the memory it frees is handed back
            # to the host (free page reporting) before the next dump, as it
            # was before this one.
            rec["tmpfs_baseline"] = tmpfs_baseline(exes["tmpfs_write"], workdir, d["bytes"])
            time.sleep(3)
            incs.append(rec)
            log(f"incremental {k}/{args.reps}: {r['pages']} pages written ({100 * r['pages'] / npages:.2f}%), "
                f"{d['pages']} saved, total {d['total_us'] / 1e3:.1f} ms, frozen {d['frozen_us'] / 1e3:.1f} ms; "
                f"tmpfs_write of {rec['tmpfs_baseline']['mib']} MiB {rec['tmpfs_baseline']['write_s'] * 1e3:.1f} ms, "
                f"again {rec['tmpfs_baseline']['write_again_s'] * 1e3:.1f} ms")
        result["incrementals"] = incs
        result["chain_image_bytes"] = tc.dr.dir_size(img)[0]

        # 4. the process checks itself
        code = tc.stop_workload(proc, timeout=300)
        live.remove(proc)
        out = open(logf).read().strip()
        if code != 0 or not out.endswith("PASS"):
            raise BenchError(f"dirty_pages failed its memory check after the checkpoints (exit {code}): {out}")
        result["verified_original"] = "PASS"

        # 5. restore the latest incremental checkpoint and check it
        if not args.no_restore:
            restore_chain(args, workdir, img, pid, logf, result)
    except BaseException:
        for p in live:
            tc.kill_quietly(p)
        raise


def restore_chain(args, workdir, img, pid, logf, result):
    """`stasis restore` of the chain's latest checkpoint at the same PID, then
    SIGTERM: the restored process checks all its memory."""
    pidfile = os.path.join(workdir, "restored.pid")
    rargv = [args.stasis, "restore", "-D", img, "--detach", "--json", "--pidfile", pidfile]
    rc, wall, usage, stdout, stderr = tc.dr.run_rusage(
        rargv, os.path.join(workdir, "restore.out"), os.path.join(workdir, "restore.err"), timeout=600)
    if rc != 0:
        raise BenchError(f"`{' '.join(rargv)}` failed (exit {rc}):\n{stderr}{stdout}")
    r = tc.dr.parse_json_line(stdout, "stasis restore")
    rpid = r["pid"]
    result["restore"] = {"argv": rargv, "wall_s": wall, "total_us": r.get("total_us"),
                         "pid_wait_us": r.get("pid_wait_us"), "pages": r.get("pages"), "pid": rpid}
    if rpid != pid:
        os.kill(rpid, signal.SIGKILL)
        raise BenchError(f"restored at pid {rpid}, dumped pid was {pid}")
    os.kill(rpid, signal.SIGTERM)
    status = tc.dr.wait_pid(rpid, 300, "restored process")
    out = open(logf).read().strip()
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or not out.endswith("PASS"):
        raise BenchError(f"the process restored from the chain failed its memory check (exit {code}): "
                         f"{out.splitlines()[-1] if out else ''}")
    result["verified_restored"] = "PASS"
    log(f"restored the chain's latest checkpoint ({r.get('pages')} pages) at pid {rpid}: PASS")


def run_supervised(args, exes, workdir, result):
    """The chain under `stasis run --concurrent --cow-method uffd`: the
    write-protection of each concurrent copy is kept as the dirty tracking,
    so a checkpoint's freeze only collects the written grains and protects
    them again, and they are copied after the release."""
    exe = exes["dirty_pages"]
    ctl = os.path.join(workdir, "ctl")
    os.makedirs(ctl)
    logf = os.path.join(ctl, "log")
    bp = int(round(args.pct * 100))
    argv = [exe, ctl, str(args.size_mib), str(bp), args.pattern]
    result["workload_argv"] = argv
    img = os.path.join(workdir, "img")
    t0 = time.monotonic()
    sup = tc.RunSupervisor(args.stasis, argv, img, logf, ctl, ["--cow-buffer", args.cow_buffer])
    try:
        started = sup.event("started", 60)
        pid = started["pid"]
        tc.wait_file(os.path.join(ctl, "pid"), sup.proc, 600, "dirty_pages", logf)
        result["fill_s"] = time.monotonic() - t0
        npages = (args.size_mib << 20) // 4096
        d = sup.checkpoint(pid)
        result["full_arm"] = brief(d)
        log(f"full (arms write-protection): {d['pages']} pages, total {d['total_us'] / 1e3:.0f} ms, "
            f"frozen {d['frozen_us'] / 1e3:.0f} ms")
        incs = []
        for k in range(1, args.reps + 1):
            os.kill(pid, signal.SIGUSR1)
            rf = os.path.join(ctl, f"round.{k}")
            tc.wait_file(rf, sup.proc, 120, f"dirty_pages round {k}", logf)
            r = tc.read_kv(rf)
            quiet = tc.wait_quiet(args.wait_quiet)
            busy0 = tc.dr.cpu_busy_s()
            d = sup.checkpoint(pid)
            rec = incremental_record(d, r, quiet, busy0, f"checkpoint {d.get('checkpoint')}")
            rec["tmpfs_baseline"] = tmpfs_baseline(exes["tmpfs_write"], workdir, d["bytes"])
            time.sleep(3)
            incs.append(rec)
            log(f"incremental {k}/{args.reps}: {r['pages']} pages written in {r['write_ns'] / 1e6:.1f} ms, "
                f"{d['pages']} saved, total {d['total_us'] / 1e3:.1f} ms, frozen {d['frozen_us'] / 1e3:.1f} ms")
        result["incrementals"] = incs
        result["chain_image_bytes"] = tc.dr.dir_size(img)[0]
        os.kill(pid, signal.SIGTERM)
        code = sup.finish()
        out = open(logf).read().strip()
        if code != 0 or not out.endswith("PASS"):
            raise BenchError(f"dirty_pages failed its memory check after the checkpoints (exit {code}): {out[-300:]}")
        result["verified_original"] = "PASS"
        if not args.no_restore:
            restore_chain(args, workdir, img, pid, logf, result)
    except BaseException:
        if sup.proc.poll() is None:
            try:
                os.kill(pid, signal.SIGKILL)
            except (NameError, ProcessLookupError):
                pass
            tc.kill_quietly(sup.proc)
        raise


def table(result, args):
    npages = (args.size_mib << 20) // 4096
    incs = result.get("incrementals", [])
    lines = [f"big incremental: {args.size_mib} MiB process ({npages} pages), {args.pct:g}% of the pages written "
             f"({args.pattern}) before each incremental checkpoint, "
             f"{'stasis run --concurrent --cow-method uffd' if args.supervised else '--track ' + args.track}"
             f"{', incremental dumps --concurrent' if args.concurrent else ''}, image in "
             f"{result['params']['workdir']} ({result['params']['fs_type']})", ""]
    lines.append(f"{'checkpoint':34} {'pages':>8} {'total ms':>20} {'frozen ms':>20} {'wall ms':>8}")

    def row(name, recs):
        t = stats([r["total_us"] / 1e3 for r in recs])
        f = stats([r["frozen_us"] / 1e3 for r in recs])
        w = stats([r["wall_s"] * 1e3 for r in recs])
        p = tc.med([r["pages"] for r in recs])
        tt = f"{t['median']:.1f}" + (f" [{t['min']:.1f}-{t['max']:.1f}]" if len(recs) > 1 else "")
        ff = f"{f['median']:.1f}" + (f" [{f['min']:.1f}-{f['max']:.1f}]" if len(recs) > 1 else "")
        lines.append(f"{name:34} {p:8.0f} {tt:>20} {ff:>20} {w['median']:8.0f}")
        return t, f

    fw = result.get("full_plain_warmup")
    fp = result.get("full_plain")
    fa = result.get("full_arm")
    if fw:
        row("full, no tracking (warm-up)", [fw])
    if fp:
        row("full, no tracking", [fp])
    if fa:
        row("full + arm write-protection" if args.supervised else f"full + arm {args.track} (chain's first)", [fa])
    if incs:
        t, f = row(f"incremental, {args.pct:g}% written (x{len(incs)})", incs)
        lines.append("")
        wr = tc.med([r["written_pages"] for r in incs])
        wn = stats([r["write_ns"] / 1e6 for r in incs])
        lines.append(f"the workload's write of {wr:.0f} pages a round: {wn['median']:.1f} ms "
                     f"[{wn['min']:.1f}-{wn['max']:.1f}] (under tracking; each first write to a page or grain "
                     f"may fault)")
        stages = [stage_lengths(r) for r in incs if r.get("frozen_stages")]
        if stages:
            names = list(dict.fromkeys(n for s in stages for n in s))
            lines.append("incremental frozen time by stage, median ms: " + ", ".join(
                f"{n} {tc.med([s.get(n, 0.0) for s in stages]):.1f}" for n in names))
    if incs:
        if fp:
            lines.append(f"incremental vs full, no tracking: total {t['median'] / (fp['total_us'] / 1e3):.3f}x "
                         f"({fp['total_us'] / 1e3 / t['median']:.0f} times faster), frozen "
                         f"{f['median'] / (fp['frozen_us'] / 1e3):.3f}x; pages {tc.med([r['pages'] for r in incs]) / fp['pages']:.4f}x "
                         f"(written: {wr:.0f} a round, saved {tc.med([r['pages'] for r in incs]) - wr:.0f} more: stack, "
                         f"generation array, libc)")
        bw = stats([r["tmpfs_baseline"]["write_s"] * 1e3 for r in incs])
        ba = stats([r["tmpfs_baseline"]["write_again_s"] * 1e3 for r in incs])
        lines.append(f"baseline, right after each incremental dump: tmpfs_write of the same "
                     f"{incs[0]['tmpfs_baseline']['mib']} MiB into a fresh tmpfs file: {bw['median']:.1f} ms "
                     f"[{bw['min']:.1f}-{bw['max']:.1f}], at once again (reusing the memory just freed): "
                     f"{ba['median']:.1f} ms [{ba['min']:.1f}-{ba['max']:.1f}]")
        lines.append("  (this VM's host backs freed guest memory lazily: a copy into memory it must back again is "
                     "several times slower, which is why single dumps above can take 3x the others)")
        lines.append(f"wall ms: the whole `stasis dump` command (exec to exit). Machine CPU busy during each "
                     f"incremental dump (median): {tc.med([r['machine_busy_cpu_s'] for r in incs]):.3f} s")
        lines.append(f"target (issue): incremental total <= 100 ms, frozen <= 20 ms: total "
                     f"{'met' if t['median'] <= 100 else 'MISSED'} ({t['median']:.1f} ms), frozen "
                     f"{'met' if f['median'] <= 20 else 'MISSED'} ({f['median']:.1f} ms) (medians)")
    checks = [k for k in ("verified_original", "verified_restored") if result.get(k) == "PASS"]
    if checks:
        lines.append("memory checks: " + ", ".join({"verified_original": "the process after all checkpoints PASS",
                                                    "verified_restored": "the process restored from the chain PASS"}[k]
                                                   for k in checks))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=4096)
    ap.add_argument("--pct", type=float, default=1.0, help="percentage of pages written per round (default 1)")
    ap.add_argument("--reps", type=int, default=5, help="incremental checkpoints (default 5)")
    ap.add_argument("--pattern", choices=("scattered", "contiguous"), default="scattered")
    ap.add_argument("--track", default="uffd", help="backend for the chain (default uffd)")
    ap.add_argument("--no-restore", action="store_true", help="skip the restore of the chain and its check")
    ap.add_argument("--concurrent", action="store_true",
                    help="incremental dumps with --concurrent (memory copied from a copy-on-write snapshot while "
                         "the process runs on)")
    ap.add_argument("--supervised", action="store_true",
                    help="the whole chain under `stasis run --concurrent --cow-method uffd` (write-protection kept "
                         "from one checkpoint to the next as the dirty tracking; each checkpoint asked for through "
                         "the job's request socket); no full dump without tracking")
    ap.add_argument("--cow-buffer", default="256M", help="with --supervised: `stasis run --cow-buffer` (default 256M)")
    ap.add_argument("--dir", default=None, help="work dir for images (default: a fresh dir under /dev/shm)")
    ap.add_argument("--json-out", default=os.path.join(tc.RESULTS, "big_incremental.json"))
    ap.add_argument("--stasis", default=tc.DEFAULT_STASIS)
    tc.add_quiet_option(ap)
    args = ap.parse_args()
    if args.size_mib <= 0 or not (0 < args.pct <= 100) or not (0 < args.reps <= 255):
        ap.error("--size-mib > 0, 0 < --pct <= 100, 1 <= --reps <= 255")
    args.stasis = os.path.abspath(args.stasis)
    if not tc.check_root_and_binary("big_incremental", args.stasis):
        return 1
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log("big_incremental: prctl(PR_SET_CHILD_SUBREAPER) failed")
        return 1

    t0 = time.monotonic()
    try:
        exes = tc.dr.compile_workloads(("dirty_pages", "tmpfs_write"))
    except BenchError as e:
        log(f"big_incremental: FAILED: {e}")
        return 1
    workdir, fstype = tc.make_workdir(args.dir, "big")
    result = tc.result_header("big_incremental", args, args.stasis, workdir, fstype, REFERENCE)
    failure = None
    try:
        (run_supervised if args.supervised else run)(args, exes, workdir, result)
    except BenchError as e:
        failure = str(e)
        log(f"big_incremental: FAILED: {e}")
    result["failure"] = failure
    result["runtime_s"] = time.monotonic() - t0
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    txt = table(result, args)
    result["table"] = txt.splitlines()
    tc.write_json(args.json_out, result)
    # Reap whatever was re-parented to us (the tracking keeper, as subreaper).
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    print(txt)
    print(f"\n(json: {args.json_out}; runtime {result['runtime_s']:.0f} s)")
    if failure:
        log(f"big_incremental: work dir left for inspection: {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
