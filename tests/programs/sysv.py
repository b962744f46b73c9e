"""System V shared memory across a parent and its child: a keyed segment and
a private one removed while attached (IPC_RMID). On SIGTERM the child writes
into both, and the parent must see it (the segments are still shared).

Usage: python3 sysv.py PIDFILE; prints PASS or FAIL."""

import ctypes, os, sys, time, signal
libc = ctypes.CDLL(None, use_errno=True); libc.shmat.restype = ctypes.c_void_p
stop=False
def h(s,f):
    global stop; stop=True
signal.signal(signal.SIGTERM,h)
a = libc.shmget(0x5151 + os.getpid() % 1000, 65536, 0o1600)
b = libc.shmget(0, 8192, 0o1600)   # private, removed while attached
pa = libc.shmat(a, None, 0); pb = libc.shmat(b, None, 0)
libc.shmctl(b, 0, None)  # IPC_RMID
ctypes.memmove(pa, b"keyed segment", 13); ctypes.memmove(pb, b"private removed", 15)
pid = os.fork()
if pid == 0:
    while not stop: time.sleep(0.02)
    ctypes.memmove(pa + 100, b"CHILD", 5); ctypes.memmove(pb + 100, b"KID", 3); os._exit(0)
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid())); os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while not stop: time.sleep(0.02)
os.kill(pid, signal.SIGTERM); os.waitpid(pid, 0)
A = ctypes.string_at(pa, 105); B = ctypes.string_at(pb, 103)
ok = A[:13] == b"keyed segment" and A[100:105] == b"CHILD" and B[:15] == b"private removed" and B[100:103] == b"KID"
print("PASS" if ok else f"FAIL {A[:13]} {A[100:]} {B[:15]} {B[100:]}", flush=True)
libc.shmctl(a, 0, None)
