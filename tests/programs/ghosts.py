"""Files without names: a memfd mapped shared by a parent and its child (its
fd closed), a deleted file mapped privately with a page changed in memory,
and a deleted file still open at an offset.

Usage: python3 ghosts.py PIDFILE. On SIGTERM the parent lets the child write
into the shared memfd, then checks that it sees the child's write (the
memfd is still shared), that the private mapping kept its changed page and
the file's content elsewhere, and that the open deleted file kept its
content and offset; prints PASS or FAIL.
"""

import mmap
import os
import signal
import sys
import time

stop = False


def on_term(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)

m = os.memfd_create("shared-buf")
os.ftruncate(m, 1 << 20)
shared = mmap.mmap(m, 1 << 20, mmap.MAP_SHARED)
shared[:11] = b"hello memfd"
os.close(m)

path = os.path.join(os.getcwd(), "ghost.data")
f = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(f, b"A" * 65536)
private = mmap.mmap(f, 65536, mmap.MAP_PRIVATE)
private[100:105] = b"PRIVX"
os.close(f)

g = open(path + ".open", "w+")
g.write("ghost content " * 100)
g.flush()
g.seek(7)
os.unlink(path)
os.unlink(path + ".open")

pid = os.fork()
if pid == 0:
    while not stop:
        time.sleep(0.02)
    shared[20:25] = b"CHILD"
    os._exit(0)

with open(sys.argv[1] + ".tmp", "w") as p:
    p.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while not stop:
    time.sleep(0.02)
os.kill(pid, signal.SIGTERM)
_, st = os.waitpid(pid, 0)
problems = []
if shared[:11] != b"hello memfd" or shared[20:25] != b"CHILD":
    problems.append(f"memfd: {bytes(shared[:30])!r}")
if private[100:105] != b"PRIVX" or private[:5] != b"AAAAA" or private[65531:] != b"AAAAA":
    problems.append(f"private mapping: {bytes(private[95:110])!r}")
if g.tell() != 7:
    problems.append(f"deleted file offset {g.tell()}")
g.seek(0)
if g.read() != "ghost content " * 100:
    problems.append("deleted file content")
if not os.readlink(f"/proc/self/fd/{g.fileno()}").endswith(" (deleted)"):
    problems.append("the open file is not deleted any more")
if st != 0:
    problems.append(f"child status {st}")
print("PASS" if not problems else "FAIL " + "; ".join(problems), flush=True)
sys.exit(0 if not problems else 1)
