"""A server that waits on epoll (level-triggered) while a client's request
sits unread in its socket's receive queue: the request is read only once
the file GO exists in the working directory, and then answered.

Usage: python3 epoll_queued.py PIDFILE PORT

Accepts one client on 127.0.0.1:PORT, registers the connection in an
epoll instance, prints `queued N` once N bytes wait in its receive queue
(not read), and writes PIDFILE. After GO appears, each epoll_wait that
reports the connection reads a line and answers `echo LINE`. Exits 0 on
SIGTERM after printing PASS if it answered, FAIL otherwise.
"""

import fcntl
import os
import select
import signal
import socket
import struct
import sys
import termios

stop = False
answered = 0


def on_term(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
pidfile, port = sys.argv[1], int(sys.argv[2])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(1)
conn, _ = srv.accept()
ep = select.epoll()
ep.register(conn.fileno(), select.EPOLLIN)


def queued():
    b = fcntl.ioctl(conn.fileno(), termios.FIONREAD, b"\0\0\0\0")
    return struct.unpack("i", b)[0]


while queued() == 0:
    ep.poll(0.05)
print(f"queued {queued()}", flush=True)
with open(pidfile + ".tmp", "w") as f:
    f.write(f"{os.getpid()}\n")
os.rename(pidfile + ".tmp", pidfile)
while not stop:
    events = ep.poll(0.05)
    if not os.path.exists("GO"):
        continue
    for fd, _ in events:
        line = conn.recv(4096)
        if line:
            conn.sendall(b"echo " + line)
            answered += 1
print("PASS" if answered else "FAIL", flush=True)
sys.exit(0)
