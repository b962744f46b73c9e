"""Orphans under a child subreaper: the root is a subreaper; its child A
forks B and exits, so B is re-parented to the root. After restore the root
must still be a subreaper and B's parent, and a new orphan (B's own child
C, orphaned when B exits on SIGTERM) must come to the root as well.

Usage: python3 orphans.py PIDFILE; prints PASS or FAIL (exit 0/1).
"""

import ctypes
import os
import signal
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
stop = False


def on_term(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
assert libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
r, w = os.pipe()
a = os.fork()
if a == 0:
    b = os.fork()
    if b == 0:
        # B: waits for the word, then forks C and exits (C is orphaned).
        os.close(w)
        os.read(r, 1)
        c = os.fork()
        if c == 0:
            time.sleep(0.3)
            os._exit(5)
        os._exit(0)
    os._exit(0)
os.waitpid(a, 0)
time.sleep(0.1)
kids = open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while not stop:
    time.sleep(0.02)
problems = []
sub = ctypes.c_int(0)
libc.prctl(37, ctypes.byref(sub), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
if sub.value != 1:
    problems.append("not a subreaper any more")
now = open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()
if now != kids or len(kids) != 1:
    problems.append(f"children {now}, before {kids}")
os.write(w, b"x")
b_pid = int(kids[0]) if kids else 0
_, st = os.waitpid(b_pid, 0)
# C, orphaned by B's exit, must come to us and exit 5.
pid, st = os.wait()
if os.WEXITSTATUS(st) != 5:
    problems.append(f"orphan C not reaped by the subreaper (pid {pid}, status {st})")
print("PASS" if not problems else "FAIL " + "; ".join(problems), flush=True)
sys.exit(0 if not problems else 1)
