#!/usr/bin/env python3
"""py_heap.py - Python-heap benchmark workload for bench/vs_criu.py.

    python3 py_heap.py PIDFILE SIZE_MIB

Builds SIZE_MIB MiB of Python objects on the interpreter's heap: SIZE_MIB * 16
`bytes` objects of 64 KiB each (malloc()ed from the brk heap, below glibc's
128 KiB mmap threshold, so this is heap, not one big mapping), held in a
list: chunk i is its index (8 bytes) followed by a window, at an offset that
depends on i, of 2 MiB of random.Random(SEED) bytes (no page is zero; fast to
build and to check again), plus a dict of 100,000 small int -> str entries
(pymalloc arenas).
Then it writes its PID to PIDFILE (PIDFILE.tmp + rename) and sleeps in 50 ms
steps until SIGTERM.

On SIGTERM it regenerates every chunk from its seed and compares it with the
one it holds, checks the dict, and prints "PASS" (exit 0) or "FAIL: ..." (exit
1). Single-threaded; no pipes, sockets or extra fds: start it with stdin from
/dev/null and stdout/stderr to a regular file so it can be checkpointed.
"""
import os
import random
import signal
import sys
import time

SEED = 0x70796865  # "pyhe"
CHUNK = 64 << 10
SMALL = 100_000


POOL = random.Random(SEED).randbytes(2 << 20)


def chunk(i):
    off = (i * 4104) % (len(POOL) - CHUNK)
    return i.to_bytes(8, "little") + POOL[off:off + CHUNK - 8]


def main():
    if len(sys.argv) != 3:
        print(f"usage: {sys.argv[0]} PIDFILE SIZE_MIB", file=sys.stderr)
        return 2
    pidfile, mib = sys.argv[1], int(sys.argv[2])
    if mib <= 0:
        print(f"py_heap: bad SIZE_MIB {mib}", file=sys.stderr)
        return 2
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    n = mib * ((1 << 20) // CHUNK)
    heap = [chunk(i) for i in range(n)]
    small = {i: str(i * 7919) for i in range(SMALL)}
    with open(pidfile + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(pidfile + ".tmp", pidfile)
    while not stop:
        time.sleep(0.05)
    bad = [i for i in range(n) if heap[i] != chunk(i)]
    if len(heap) != n or bad:
        print(f"FAIL: {len(bad)} of {n} chunks differ (first {bad[:1]}), {len(heap)} held", flush=True)
        return 1
    if len(small) != SMALL or any(small[i] != str(i * 7919) for i in range(SMALL)):
        print("FAIL: the small-object dict differs", flush=True)
        return 1
    print("PASS", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
