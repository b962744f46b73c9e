"""NumPy keeps iterating over a 32 MiB array: each step mixes every
element (a multiply, an add and a shift over uint64, wrapping), so every
page of the array is written at every step.

Usage: python3 numpy_iter.py PIDFILE

Prints `progress N CHECK` after step N (CHECK: the XOR of every element),
and writes PIDFILE once it runs. On SIGTERM it finishes the step, computes
the N steps again from scratch on a fresh array, compares both arrays
element by element and prints PASS or FAIL (exit 0 or 1).
"""

import os
import signal
import sys

import numpy as np

ELEMS = 4 << 20  # 32 MiB of uint64
MUL = np.uint64(6364136223846793005)

stop = False


def on_term(signum, frame):
    global stop
    stop = True


def start():
    return np.arange(ELEMS, dtype=np.uint64) * np.uint64(2654435761)


def step(x, n):
    x *= MUL
    x += np.uint64(n)
    x ^= x >> np.uint64(29)


def main():
    signal.signal(signal.SIGTERM, on_term)
    x = start()
    n = 0
    pidfile = sys.argv[1]
    with open(pidfile + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(pidfile + ".tmp", pidfile)
    while not stop:
        n += 1
        step(x, n)
        print(f"progress {n} {int(np.bitwise_xor.reduce(x))}", flush=True)
    y = start()
    for i in range(1, n + 1):
        step(y, i)
    if np.array_equal(x, y):
        print(f"steps {n}")
        print("PASS", flush=True)
        sys.exit(0)
    bad = int(np.count_nonzero(x != y))
    print(f"FAIL: {bad} of {ELEMS} elements differ after {n} steps", flush=True)
    sys.exit(1)


main()
