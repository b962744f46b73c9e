"""Kernel state that only the process itself can see: inotify watches (with
a gap in the watch descriptors), a POSIX lock and a flock, a periodic POSIX
timer at a chosen ID, no_new_privs and a seccomp filter.

Usage: python3 misc.py PIDFILE. On SIGTERM it checks that each still works
as before the checkpoint and prints PASS or FAIL (exit 0/1).
"""

import ctypes
import fcntl
import os
import signal
import struct
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
stop = False
ticks = 0


def on_term(signum, frame):
    global stop
    stop = True


def on_usr1(signum, frame):
    global ticks
    ticks += 1


signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGUSR1, on_usr1)
here = os.getcwd()

# inotify: watch 1 on a directory, watch 2 removed (a gap), watch 3 on a file.
os.makedirs("watched", exist_ok=True)
open("watched-file", "w").close()
ino = libc.inotify_init1(os.O_NONBLOCK)
w1 = libc.inotify_add_watch(ino, b"watched", 0x100)  # IN_CREATE
w2 = libc.inotify_add_watch(ino, b".", 0x2)
libc.inotify_rm_watch(ino, w2)
w3 = libc.inotify_add_watch(ino, b"watched-file", 0x2)  # IN_MODIFY
try:
    os.read(ino, 4096)  # drop the IN_IGNORED of watch 2
except BlockingIOError:
    pass

# Locks: a POSIX write lock on bytes 5..14 and an exclusive flock.
lk = open("posix.lock", "w")
fcntl.lockf(lk, fcntl.LOCK_EX, 10, 5)
fl = open("flock.lock", "w")
fcntl.flock(fl, fcntl.LOCK_EX)

# A POSIX timer (SIGUSR1 every 10 ms) created as the third timer, the
# first two deleted: its ID is not 0.
class Sigevent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_uint64), ("signo", ctypes.c_int), ("notify", ctypes.c_int), ("pad", ctypes.c_int * 12)]


librt = ctypes.CDLL("librt.so.1", use_errno=True)
timers = []
for i in range(3):
    sev = Sigevent(0x1234 + i, signal.SIGUSR1, 0)
    t = ctypes.c_void_p()
    assert librt.timer_create(1, ctypes.byref(sev), ctypes.byref(t)) == 0
    timers.append(t)
librt.timer_delete(timers[0])
librt.timer_delete(timers[1])
its = struct.pack("qqqq", 0, 10_000_000, 0, 10_000_000)
assert librt.timer_settime(timers[2], 0, ctypes.c_char_p(its), None) == 0
def timer_ids():
    return sorted(int(x.split()[0]) for x in open("/proc/self/timers").read().split("ID: ")[1:])


ids_before = timer_ids()

# no_new_privs, then a seccomp filter: getppid() fails with errno 42.
libc.prctl(38, 1, 0, 0, 0)
prog = [(0x20, 0, 0, 0), (0x15, 0, 1, 110), (0x06, 0, 0, 0x00050000 | 42), (0x06, 0, 0, 0x7FFF0000)]
buf = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in prog))
fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(buf)))
assert libc.syscall(317, 1, 0, fprog) == 0

with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while not stop:
    time.sleep(0.02)

problems = []
# inotify: same watch descriptors, same masks, events arrive.
info = open(f"/proc/self/fdinfo/{ino}").read()
wds = sorted(int(l.split("wd:")[1].split()[0]) for l in info.splitlines() if l.startswith("inotify"))
if wds != [w1, w3] or (w1, w3) != (1, 3):
    problems.append(f"inotify watches {wds}")
open("watched/new", "w").close()
with open("watched-file", "a") as f:
    f.write("x")
time.sleep(0.05)
try:
    ev = os.read(ino, 4096)
except BlockingIOError:
    ev = b""
seen = []
while len(ev) >= 16:
    wd, mask, _, ln = struct.unpack("iIII", ev[:16])
    seen.append((wd, mask))
    ev = ev[16 + ln:]
if (1, 0x100) not in seen or (3, 0x2) not in seen:
    problems.append(f"inotify events {seen}")
# Locks held by this process: another process cannot take them.
pid = os.fork()
if pid == 0:
    codes = 0
    try:
        fcntl.lockf(open("posix.lock", "w"), fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 5)
    except OSError:
        codes |= 1
    try:
        fcntl.flock(open("flock.lock", "w"), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        codes |= 2
    os._exit(codes)
_, st = os.waitpid(pid, 0)
if os.WEXITSTATUS(st) != 3:
    problems.append(f"locks lost (child took {3 - os.WEXITSTATUS(st)})")
# The POSIX timer: same ID, still periodic.
t0 = ticks
deadline = time.monotonic() + 1.0
while ticks < t0 + 5 and time.monotonic() < deadline:
    time.sleep(0.02)
if ticks < t0 + 5:
    problems.append(f"timer ticks {t0}->{ticks}")
if timer_ids() != ids_before or ids_before == [0]:
    problems.append(f"timer ids {timer_ids()}, expected {ids_before}")
# no_new_privs and the filter.
if libc.prctl(39, 0, 0, 0, 0) != 1:
    problems.append("no_new_privs lost")
if libc.syscall(110) != -1 or ctypes.get_errno() != 42:
    problems.append("seccomp filter lost")
# Stop the timer before the interpreter shuts down (its handler goes away).
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
librt.timer_delete(timers[2])
print("PASS" if not problems else "FAIL " + "; ".join(problems), flush=True)
sys.exit(0 if not problems else 1)
