"""Kill/restart workload: python3 iterate.py DIR ITERS K OUT MONITOR.

Protects a NumPy array (if NumPy is installed), a bytearray and an
array.array; checkpoints every K iterations; restores the newest version on
start; writes every region to OUT at the end."""
import array
import sys

import stasis

try:
    import numpy as np
except ImportError:  # the test still runs, with buffers only
    np = None

d, iters, k, out, monitor = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
state = array.array("Q", [0, 12345])          # iteration, rng
buf = bytearray(300_000)
arr = np.arange(1 << 17, dtype=np.float64) if np is not None else array.array("d", range(1 << 17))

with stasis.session(d, monitor=monitor) as s:
    s.protect(0, state)
    s.protect(1, buf)
    s.protect(2, arr)
    v = s.restart_test("py")
    if v is not None:
        s.restart("py", v)
        assert state[0] == v, (state[0], v)
        print("restarted", v, flush=True)
    try:
        s.restart("py", 999_999)
    except stasis.StasisError as e:
        assert e.code == -9, e
    while state[0] < iters:
        it = state[0]
        rng = state[1]
        for _ in range(50):
            rng = (rng * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            buf[rng % len(buf)] = (buf[rng % len(buf)] + it) & 0xFF
        state[1] = rng
        lo = (it % 16) * 8192
        if np is not None:
            arr[lo:lo + 8192] = arr[lo:lo + 8192] * 0.5 + it
        else:
            for i in range(lo, lo + 8192, 64):
                arr[i] = arr[i] * 0.5 + it
        state[0] = it + 1
        if state[0] % k == 0:
            s.checkpoint("py", state[0])
    st = s.stats()
with open(out, "wb") as f:
    f.write(bytes(state))
    f.write(bytes(buf))
    f.write(bytes(memoryview(arr).cast("B")))
print("done", st["monitor"], st["checkpoints"], st["faults"], st["bytes_copied"], flush=True)
