"""A thread pool that keeps computing: 4 worker threads hash integers, the
main thread folds the results, in order, into one running digest.

Usage: python3 pool.py PIDFILE

Prints `progress N` after each batch (N = integers folded so far) and writes
PIDFILE once the pool is running. On SIGTERM it finishes the current batch,
recomputes the digest of 0..N from scratch in the main thread and prints
PASS or FAIL (exit 0 or 1). It also checks that the four worker threads that
did the work are still the pool's threads and still alive.
"""

import hashlib
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

WORKERS = 4
BATCH = 64
ROUNDS = 500

stop = False


def on_term(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)

seen_lock = threading.Lock()
seen = {}  # worker thread ident -> items it computed


def work(i, nap=0.005):
    # The nap releases the GIL: the four threads really run side by side.
    if nap:
        time.sleep(nap)
    d = str(i).encode()
    for _ in range(ROUNDS):
        d = hashlib.sha256(d).digest()
    with seen_lock:
        me = threading.get_ident()
        seen[me] = seen.get(me, 0) + 1
    return d


def fold(acc, d):
    return hashlib.sha256(acc + d).digest()


def main():
    pidfile = sys.argv[1]
    acc = b"\0" * 32
    n = 0
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        # The pool starts a thread per task only while none is idle: hold
        # the first WORKERS tasks at a barrier so that all threads exist.
        start = threading.Barrier(WORKERS)
        list(pool.map(lambda _: start.wait(), range(WORKERS)))
        while not stop:
            for d in pool.map(work, range(n, n + BATCH)):
                acc = fold(acc, d)
            n += BATCH
            print(f"progress {n}", flush=True)
            if n == BATCH * 4:
                with open(pidfile + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.rename(pidfile + ".tmp", pidfile)
        pool_threads = {t.ident for t in pool._threads if t.is_alive()}
        workers = len(pool._threads)

    want = b"\0" * 32
    for i in range(n):
        want = fold(want, work(i, nap=0))
    problems = []
    if want != acc:
        problems.append(f"digest of 0..{n}: {acc.hex()} != recomputed {want.hex()}")
    if workers != WORKERS or len(pool_threads) != WORKERS:
        problems.append(f"pool has {workers} threads, {len(pool_threads)} alive")
    with seen_lock:
        # Drop the main thread's entries from the recomputation above.
        helpers = {t: c for t, c in seen.items() if t != threading.get_ident()}
    if set(helpers) != pool_threads:
        problems.append(f"work done by {sorted(helpers)}, pool is {sorted(pool_threads)}")
    if sum(helpers.values()) != n:
        problems.append(f"workers computed {sum(helpers.values())} items, expected {n}")
    if problems:
        print("FAIL " + "; ".join(problems), flush=True)
        sys.exit(1)
    print(f"checked {n} items over {len(helpers)} threads", flush=True)
    print("PASS", flush=True)


main()
