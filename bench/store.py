#!/usr/bin/env python3
"""bench/store: checkpoints in an object store against a local tmpfs image,
and the server's own speed, in one run.

    sudo python3 bench/store.py [--size-mib 1024] [--reps 3]
                                [--chain 10] [--chain-mib 64]
                                [--json-out FILE] [--stasis PATH]

1. Dump and restore (killed, then restored at the same PID, which checks
   its memory) of one `fill` process (SIZE MiB written, incompressible) in
   four modes, alternating, REPS times each:
     local   -D a directory on tmpfs (the baseline of each ratio);
     s3      -D s3://... on a versitygw on loopback over tmpfs, --compress-level 0;
     zstd    the same, zstd at the default level;
     sealed  zstd + --encrypt-key-file.
   Each rep uses a fresh prefix (no chunk is shared with an earlier rep).
   Dumps stage on tmpfs (STASIS_S3_STAGING), restores download to tmpfs
   (TMPDIR).
2. In each rep, the server's own put and get throughput measured with a
   plain client (boto3, 8 threads, SIZE MiB in all), twice: in 8 MiB
   objects (what the server can do) and in 1 MiB objects (stasis's chunk
   size; it keeps 8 requests in flight too), which shows what the
   server's cost per object leaves for any client storing 1 MiB chunks.
3. Bytes stored for a 10-checkpoint incremental chain (`--leave-running
   --track`) of a Python heap (CHAIN MiB: half random bytes, half text;
   2% of its objects replaced between checkpoints, the same sequence in
   each mode, from a fixed seed), and of a Redis server holding CHAIN MiB
   of values (2 KiB each, half random bytes, half text; 2% of the keys set
   again between checkpoints, through a pipelined client, from a fixed
   seed): plain (a local image directory), dedup (s3 with --compress-level
   0), dedup + zstd (s3, default). `--reps 0` runs only the chains.

Prints a table (median [min-max] of the reps, ratios to the local dump of
the same rep) and writes JSON. Exit status 1 if anything broke (a command
failed, a restored process did not PASS); no time is pass/fail.
"""

import argparse
import concurrent.futures
import ctypes
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
BUILD = os.path.join(BENCH, "build")
ACCESS, SECRET, BUCKET = "bench", "bench-secret", "ckpts"
MODES = ("local", "s3", "zstd", "sealed")
PART = 8 << 20
CHUNK = 1 << 20

HEAP_PY = r'''
import os, random, signal, sys, time
random.seed(1)
mib, counter = int(sys.argv[2]), sys.argv[3]
def obj(i):
    if i % 2:
        return random.randbytes(2048)
    return ("entry %d of the bench heap; " % i).encode() * 64
n = mib * 1024 * 1024 // 2048
objs = [obj(i) for i in range(n)]
step = [0]
def mutate(*_):
    for _ in range(n // 50):
        i = random.randrange(n)
        objs[i] = obj(i)
    step[0] += 1
    with open(counter + ".tmp", "w") as f:
        f.write(str(step[0]))
    os.rename(counter + ".tmp", counter)
signal.signal(signal.SIGUSR1, mutate)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    signal.pause()
'''


def redis_value(rng, i, step):
    """Value of key `i` at `step`: half random bytes, half text (2 KiB)."""
    if i % 2:
        return rng.randbytes(2048)
    return (f"key {i} at step {step} of the bench dataset; " * 64).encode()[:2048]


def redis_set(port, items):
    """SETs `items` ((key, value) pairs), pipelined 500 at a time; checks
    every reply."""
    with socket.create_connection(("127.0.0.1", port)) as c:
        for i in range(0, len(items), 500):
            batch = items[i:i + 500]
            buf = bytearray()
            for k, v in batch:
                kb = k.encode()
                buf += b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(kb), kb, len(v)) + v + b"\r\n"
            c.sendall(buf)
            want, got = b"+OK\r\n" * len(batch), b""
            while len(got) < len(want):
                d = c.recv(65536)
                if not d:
                    raise BenchError("redis closed the connection")
                got += d
            if got != want:
                raise BenchError(f"redis answered {got[:80]!r}")


class BenchError(Exception):
    pass


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def wait_for(cond, what, timeout=60):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise BenchError(f"{what}: not after {timeout} s")
        time.sleep(0.01)


def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.lstat(os.path.join(root, f)).st_size
    return total


def versitygw():
    o = subprocess.run(["bash", os.path.join(REPO, "scripts/versitygw.sh"), "path"],
                       capture_output=True, text=True)
    if o.returncode:
        raise BenchError("versitygw is not installed: run scripts/versitygw.sh install")
    return o.stdout.strip()


class Server:
    """versitygw on a free loopback port over a directory on tmpfs."""

    def __init__(self, root):
        self.root = root
        os.makedirs(os.path.join(root, BUCKET))
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, ROOT_ACCESS_KEY=ACCESS, ROOT_SECRET_KEY=SECRET)
        self.log = open(os.path.join(os.path.dirname(root), "versitygw.log"), "w")
        self.proc = subprocess.Popen([versitygw(), "--port", f"127.0.0.1:{self.port}", "posix", root],
                                     env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)

        def up():
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                return False
        wait_for(up, "versitygw starting", 30)

    def env(self, work):
        return dict(os.environ, AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID=ACCESS,
                    AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1", AWS_ALLOW_HTTP="true",
                    STASIS_S3_STAGING=os.path.join(work, "staging"), TMPDIR=work)

    def stored(self, prefix):
        return du(os.path.join(self.root, BUCKET, prefix))

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def run(argv, env, what):
    t0 = time.monotonic()
    o = subprocess.run(argv, env=env, capture_output=True, text=True)
    dt = time.monotonic() - t0
    if o.returncode:
        raise BenchError(f"{what} failed ({o.returncode}): {o.stderr.strip()[-2000:]}")
    return dt, o.stdout


def start(argv, work, pidfile):
    out = open(os.path.join(work, "workload.log"), "a")
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=work)
    wait_for(lambda: os.path.exists(pidfile) or p.poll() is not None, "the workload's pid file", 600)
    if p.poll() is not None:
        raise BenchError(f"{argv[0]} exited with {p.returncode}")
    return p


def target(mode, srv, work, name, key):
    """(-D argument, extra flags, stored-bytes function) of a mode."""
    if mode == "local":
        d = os.path.join(work, name)
        return d, [], lambda: du(d)
    extra = {"s3": ["--compress-level", "0"], "zstd": [], "sealed": ["--encrypt-key-file", key]}[mode]
    return f"s3://{BUCKET}/{name}", extra, lambda: srv.stored(name)


def dump_restore(args, mode, rep, srv, work, key):
    env = srv.env(work)
    pidfile = os.path.join(work, f"fill-{mode}-{rep}.pid")
    proc = start([os.path.join(BUILD, "fill"), pidfile, str(args.size_mib)], work, pidfile)
    pid = int(open(pidfile).read())
    url, extra, stored = target(mode, srv, work, f"dr-{mode}-{rep}", key)
    dump_s, _ = run([args.stasis, "dump", "-t", str(pid), "-D", url] + extra, env, f"{mode} dump")
    proc.wait()
    if proc.returncode != -signal.SIGKILL:
        raise BenchError(f"the dumped process ended with {proc.returncode}, not SIGKILL")
    size = stored()
    # The download alone (`inspect` fetches the chain into a temporary
    # directory, as a restore does first, then only reads its manifest).
    fetch_s = 0.0
    if mode != "local":
        fetch_s, _ = run([args.stasis, "inspect", "-D", url] + extra, env, f"{mode} inspect")
    restore_s, _ = run([args.stasis, "restore", "--detach", "-D", url] + extra, env, f"{mode} restore")
    os.kill(pid, signal.SIGTERM)
    _, st = os.waitpid(pid, 0)
    if not (os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0):
        raise BenchError(f"{mode}: the restored process failed its check ({st:#x})")
    if mode == "local":
        shutil.rmtree(url)
    else:
        shutil.rmtree(os.path.join(srv.root, BUCKET, f"dr-{mode}-{rep}"))
    shutil.rmtree(os.path.join(work, "staging"), ignore_errors=True)
    return {"dump_s": dump_s, "restore_s": restore_s, "fetch_s": fetch_s, "stored_bytes": size}


def plain_client(args, srv, rep, part=PART):
    import boto3
    from botocore.config import Config
    s3 = boto3.client("s3", endpoint_url=srv.endpoint, aws_access_key_id=ACCESS,
                      aws_secret_access_key=SECRET, region_name="us-east-1",
                      config=Config(max_pool_connections=16))
    data = os.urandom(part)
    keys = [f"plain-{rep}/{i}" for i in range(args.size_mib * (1 << 20) // part)]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        t0 = time.monotonic()
        list(ex.map(lambda k: s3.put_object(Bucket=BUCKET, Key=k, Body=data), keys))
        put_s = time.monotonic() - t0
        t0 = time.monotonic()
        got = list(ex.map(lambda k: len(s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()), keys))
        get_s = time.monotonic() - t0
    if sum(got) != len(keys) * part:
        raise BenchError("the plain client read back fewer bytes than it wrote")
    shutil.rmtree(os.path.join(srv.root, BUCKET, f"plain-{rep}"))
    return {"put_s": put_s, "get_s": get_s}


def chain(args, mode, srv, work, key):
    env = srv.env(work)
    script = os.path.join(work, "heap.py")
    with open(script, "w") as f:
        f.write(HEAP_PY)
    pidfile, counter = os.path.join(work, f"heap-{mode}.pid"), os.path.join(work, f"heap-{mode}.count")
    proc = start([sys.executable, script, pidfile, str(args.chain_mib), counter], work, pidfile)
    pid = int(open(pidfile).read())
    url, extra, stored = target(mode, srv, work, f"chain-{mode}", key)
    try:
        for k in range(args.chain):
            if k:
                os.kill(pid, signal.SIGUSR1)
                wait_for(lambda: os.path.exists(counter) and open(counter).read() == str(k), "a heap step")
            run([args.stasis, "dump", "-t", str(pid), "-D", url, "--leave-running", "--track"] + extra,
                env, f"chain dump {k + 1} ({mode})")
    finally:
        proc.kill()
        proc.wait()
    return stored()


def chain_redis(args, mode, srv, work, key):
    """Stored bytes of a --chain incremental chain of a Redis holding
    --chain-mib MiB of values."""
    import random
    env = srv.env(work)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    rdir = os.path.join(work, f"redis-{mode}")
    os.makedirs(rdir)
    out = open(os.path.join(rdir, "redis.log"), "a")
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", rdir], stdin=subprocess.DEVNULL,
                            stdout=out, stderr=out, cwd=rdir)

    def up():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return proc.poll() is not None
    wait_for(up, "redis")
    if proc.poll() is not None:
        raise BenchError(f"redis-server exited with {proc.returncode}")
    n = args.chain_mib * 1024 * 1024 // 2048
    rng = random.Random(7)
    redis_set(port, [(f"k{i}", redis_value(rng, i, 0)) for i in range(n)])
    url, extra, stored = target(mode, srv, work, f"chain-redis-{mode}", key)
    try:
        for k in range(args.chain):
            if k:
                keys = [rng.randrange(n) for _ in range(n // 50)]
                redis_set(port, [(f"k{i}", redis_value(rng, i, k)) for i in keys])
            run([args.stasis, "dump", "-t", str(proc.pid), "-D", url, "--leave-running", "--track"] + extra,
                env, f"redis chain dump {k + 1} ({mode})")
    finally:
        proc.kill()
        proc.wait()
    return stored()


def med(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}


def fmt(m, unit=""):
    return f"{m['median']:.3g}{unit} [{m['min']:.3g}-{m['max']:.3g}]"


def report(args, reps, plain, chains):
    gb = args.size_mib * (1 << 20) / 1e9
    out = {"size_mib": args.size_mib, "reps": args.reps, "modes": {}, "plain_client": {}, "chain": chains}
    lines = [f"store.py: {args.size_mib} MiB, {args.reps} reps (median [min-max])", "",
             "| mode | dump s | dump GB/s | x local dump | restore s | restore GB/s | x local restore | stored MB |",
             "|---|---|---|---|---|---|---|---|"]
    for mode in MODES if args.reps else ():
        rs = reps[mode]
        d = med([r["dump_s"] for r in rs])
        r_ = med([r["restore_s"] for r in rs])
        dr = med([r["dump_s"] / l["dump_s"] for r, l in zip(rs, reps["local"])])
        rr = med([r["restore_s"] / l["restore_s"] for r, l in zip(rs, reps["local"])])
        st = med([r["stored_bytes"] / 1e6 for r in rs])
        out["modes"][mode] = {"dump_s": d, "restore_s": r_, "dump_x_local": dr, "restore_x_local": rr,
                              "stored_mb": st}
        lines.append(f"| {mode} | {fmt(d)} | {gb / d['median']:.2f} | {fmt(dr)} | {fmt(r_)} | "
                     f"{gb / r_['median']:.2f} | {fmt(rr)} | {st['median']:.0f} |")
    if not args.reps:
        lines = [f"store.py: chains only (--reps 0), {args.chain} checkpoints"]
        plain = []
    if plain:
        lines += plain_lines(args, gb, out, reps, plain)
    if chains:
        heap = {k: v for k, v in chains.items() if not k.startswith("redis ")}
        redis = {k[len("redis "):]: v for k, v in chains.items() if k.startswith("redis ")}
        lines += ["", f"{args.chain}-checkpoint incremental chain of a {args.chain_mib} MiB Python heap:"]
        lines += [f"  {k}: {v / 1e6:.1f} MB" for k, v in heap.items()]
        if redis:
            lines += ["", f"{args.chain}-checkpoint incremental chain of a Redis with {args.chain_mib} MiB of values:"]
            lines += [f"  {k}: {v / 1e6:.1f} MB" for k, v in redis.items()]
    return out, "\n".join(lines)


def plain_lines(args, gb, out, reps, plain):
    """The plain client's figures and stasis against them."""
    lines = []
    put, get = med([p["put_s"] for p in plain]), med([p["get_s"] for p in plain])
    put1, get1 = med([p["put1_s"] for p in plain]), med([p["get1_s"] for p in plain])
    out["plain_client"] = {"put_s": put, "get_s": get, "put_1mib_s": put1, "get_1mib_s": get1}
    lines += ["", f"plain client (boto3, 8 threads, 8 MiB objects): put {fmt(put, ' s')} "
              f"({gb / put['median']:.2f} GB/s), get {fmt(get, ' s')} ({gb / get['median']:.2f} GB/s)",
              f"plain client, 1 MiB objects (stasis's chunk size): put {fmt(put1, ' s')} "
              f"({gb / put1['median']:.2f} GB/s), get {fmt(get1, ' s')} ({gb / get1['median']:.2f} GB/s)"]
    for mode in ("s3", "zstd", "sealed"):
        dr = med([p["put_s"] / r["dump_s"] for p, r in zip(plain, reps[mode])])
        rr = med([p["get_s"] / r["restore_s"] for p, r in zip(plain, reps[mode])])
        dr1 = med([p["put1_s"] / r["dump_s"] for p, r in zip(plain, reps[mode])])
        rr1 = med([p["get1_s"] / r["restore_s"] for p, r in zip(plain, reps[mode])])
        out["modes"][mode].update(dump_vs_put=dr, restore_vs_get=rr, dump_vs_put_1mib=dr1,
                                  restore_vs_get_1mib=rr1)
        fr = med([p["get_s"] / r["fetch_s"] for p, r in zip(plain, reps[mode])])
        fr1 = med([p["get1_s"] / r["fetch_s"] for p, r in zip(plain, reps[mode])])
        fs = med([r["fetch_s"] for r in reps[mode]])
        out["modes"][mode].update(fetch_s=fs, fetch_vs_get=fr, fetch_vs_get_1mib=fr1)
        lines.append(f"{mode}: dump at {fmt(dr)} of the plain put throughput ({fmt(dr1)} of 1 MiB puts), "
                     f"restore at {fmt(rr)} of get ({fmt(rr1)} of 1 MiB gets); "
                     f"download alone (inspect) {fmt(fs, ' s')}, at {fmt(fr)} of get ({fmt(fr1)} of 1 MiB gets)")
    # A restore that downloads, then restores from the copy, takes at
    # least a plain get plus a local restore: the best ratio it can reach.
    bound = med([p["get_s"] / (p["get_s"] + l["restore_s"]) for p, l in zip(plain, reps["local"])])
    out["restore_vs_get_bound"] = bound
    lines.append(f"bound of download-then-restore, plain get / (plain get + local restore): {fmt(bound)}")
    # What compression and encryption add to a dump, against the local
    # dump of the same rep (the measure).
    for mode in ("zstd", "sealed"):
        c = med([(r["dump_s"] - b["dump_s"]) / l["dump_s"]
                 for r, b, l in zip(reps[mode], reps["s3"], reps["local"])])
        out["modes"][mode]["cost_vs_local_dump"] = c
        lines.append(f"{mode} dump minus s3 dump, as a fraction of the local dump: {fmt(c)}")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chain", type=int, default=10)
    ap.add_argument("--chain-mib", type=int, default=64)
    ap.add_argument("--stasis", default=os.path.join(REPO, "target", "release", "stasis"))
    ap.add_argument("--json-out", default=os.path.join(BENCH, "results", "store.json"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise BenchError("run as root (ptrace, restore at the same PID)")
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    os.makedirs(BUILD, exist_ok=True)
    subprocess.run(["cc", "-O2", "-o", os.path.join(BUILD, "fill"),
                    os.path.join(BENCH, "workloads", "fill.c")], check=True)
    work = tempfile.mkdtemp(prefix="stasis-store-bench-", dir="/dev/shm")
    srv = Server(os.path.join(work, "s3"))
    key = os.path.join(work, "key")
    with open(key, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    os.chmod(key, 0o600)
    try:
        reps = {m: [] for m in MODES}
        plain = []
        for rep in range(args.reps):
            order = MODES[rep % len(MODES):] + MODES[:rep % len(MODES)]
            for mode in order:
                r = dump_restore(args, mode, rep, srv, work, key)
                log(f"rep {rep} {mode}: dump {r['dump_s']:.2f} s, restore {r['restore_s']:.2f} s, "
                    f"{r['stored_bytes'] / 1e6:.0f} MB")
                reps[mode].append(r)
            p = plain_client(args, srv, rep)
            small = plain_client(args, srv, rep, CHUNK)
            p.update(put1_s=small["put_s"], get1_s=small["get_s"])
            plain.append(p)
            log(f"rep {rep} plain client: {plain[-1]}")
        chains = {}
        if args.chain:
            for mode, name in (("local", "plain"), ("s3", "dedup"), ("zstd", "dedup+zstd")):
                chains[name] = chain(args, mode, srv, work, key)
                log(f"chain {name}: {chains[name] / 1e6:.1f} MB")
            for mode, name in (("local", "plain"), ("s3", "dedup"), ("zstd", "dedup+zstd")):
                chains[f"redis {name}"] = chain_redis(args, mode, srv, work, key)
                log(f"redis chain {name}: {chains[f'redis {name}'] / 1e6:.1f} MB")
        out, text = report(args, reps, plain, chains)
        print(text)
        os.makedirs(os.path.dirname(args.json_out), exist_ok=True)
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        log(f"store.py: {e}")
        sys.exit(1)
