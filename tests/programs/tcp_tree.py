"""Two processes with megabytes in flight between them.

Usage: python3 tcp_tree.py PIDFILE [MAX_IN_FLIGHT]

The parent listens on 127.0.0.1:0 and forks a child that connects. Each side
sends N bytes of a deterministic pattern to the other, non-blocking, until
the kernel queues are full (EAGAIN), without the other reading: megabytes
sit in the send and receive queues in both directions. Besides, an
AF_UNIX stream socketpair carries unread messages each way, and a pipe holds
unread data from parent to child. PIDFILE is written once all of that is in
place (the child reports through the socketpair).

On SIGTERM the parent signals the child, and each side sends the rest while
reading everything (select loop), then checks byte for byte what it got. The
child exits 0 or 1; the parent prints PASS or FAIL (exit 0 or 1).
"""

import hashlib
import os
import select
import signal
import socket
import sys
import time

N = 6 * 1024 * 1024
# Bytes each side queues before the checkpoint (default: until EAGAIN, which
# fills both windows to zero).
CAP = int(sys.argv[2]) if len(sys.argv) > 2 else N
PIPE_DATA = 48 * 1024
stop = False


def on_term(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)


def pat(seed, n):
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}-{i}".encode()).digest()
        i += 1
    return bytes(out[:n])


def fill(sock, data):
    """Sends until the kernel says EAGAIN; returns how much went."""
    sock.setblocking(False)
    off = 0
    while off < min(len(data), CAP):
        try:
            off += sock.send(data[off : min(off + 65536, CAP)])
        except BlockingIOError:
            break
    return off


def exchange(sock, data, sent, want_len):
    """Sends data[sent:] and reads want_len bytes, at the same time."""
    sock.setblocking(False)
    got = bytearray()
    off = sent
    while len(got) < want_len or off < len(data):
        w = [sock] if off < len(data) else []
        r, wr, _ = select.select([sock], w, [], 10)
        if not r and not wr:
            raise RuntimeError(f"stalled: got {len(got)}/{want_len}, sent {off}/{len(data)}")
        if r:
            x = sock.recv(1 << 20)
            if not x:
                break
            got += x
        if wr:
            try:
                off += sock.send(data[off : off + 65536])
            except BlockingIOError:
                pass
    return bytes(got)


def recv_exactly(sock, n):
    sock.setblocking(True)
    got = b""
    while len(got) < n:
        x = sock.recv(n - len(got))
        if not x:
            break
        got += x
    return got


READY = "child-ready {:12d}"
READY_LEN = len(READY.format(0))
P2C = b"queued-in-pair" + b"queued-in-pair-2"
C2P = b"queued-child-to-parent"


def digest(b):
    return hashlib.sha256(b).hexdigest()[:16]


def wait_stop():
    while not stop:
        time.sleep(0.02)


def child(port, b, pr):
    c = socket.create_connection(("127.0.0.1", port))
    data = pat("c2s", N)
    sent = fill(c, data)
    b.sendall(READY.format(sent).encode())
    b.sendall(C2P)
    wait_stop()
    problems = []
    got = exchange(c, data, sent, N)
    if got != pat("s2c", N):
        problems.append(f"tcp s2c: got {len(got)} bytes, sha {digest(got)}")
    m = recv_exactly(b, len(P2C))
    if m != P2C:
        problems.append(f"socketpair: {m!r}")
    p = b""
    while len(p) < PIPE_DATA:
        x = os.read(pr, PIPE_DATA)
        if not x:
            break
        p += x
    if p != pat("pipe", PIPE_DATA):
        problems.append(f"pipe: got {len(p)} bytes, sha {digest(p)}")
    if problems:
        print("child FAIL " + "; ".join(problems), flush=True)
        os._exit(1)
    print("child ok", flush=True)
    os._exit(0)


def main():
    pidfile = sys.argv[1]
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    port = listener.getsockname()[1]
    a, b = socket.socketpair()
    a.send(b"queued-in-pair")
    pr, pw = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            listener.close()
            a.close()
            os.close(pw)
            child(port, b, pr)
        finally:
            os._exit(2)
    b.close()
    os.close(pr)
    os.write(pw, pat("pipe", PIPE_DATA))
    conn, _ = listener.accept()
    data = pat("s2c", N)
    sent = fill(conn, data)
    ready = recv_exactly(a, READY_LEN).decode()
    assert ready.startswith("child-ready "), ready
    child_sent = int(ready.split()[1])
    # Unread by the child until the end, like the other way round.
    a.send(b"queued-in-pair-2")
    print(f"ready port {port} in flight s2c {sent} c2s {child_sent}", flush=True)
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)

    wait_stop()
    os.kill(pid, signal.SIGTERM)
    problems = []
    try:
        got = exchange(conn, data, sent, N)
    except Exception as e:
        got = b""
        problems.append(str(e))
    if got != pat("c2s", N):
        problems.append(f"tcp c2s: got {len(got)} bytes, sha {digest(got)}")
    m = recv_exactly(a, len(C2P))
    if m != C2P:
        problems.append(f"socketpair: {m!r}")
    _, st = os.waitpid(pid, 0)
    if st != 0:
        problems.append(f"child exit status {st:#x}")
    if problems:
        print("FAIL " + "; ".join(problems), flush=True)
        sys.exit(1)
    print("PASS", flush=True)


main()
