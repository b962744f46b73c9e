"""A datagram socketpair whose receiving end has SO_PASSCRED, with a message
queued by a child running as another user: after restore the message must
still carry the child's pid, uid and gid. Usage: python3 creds.py PIDFILE."""
import socket, os, time, signal, struct, sys
stop=False
def h(s,f):
    global stop; stop=True
signal.signal(signal.SIGTERM,h)
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
b.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
pid = os.fork()
if pid == 0:
    os.setgid(1234); os.setuid(4321)
    a.send(b"from child"); 
    while not stop: time.sleep(0.02)
    os._exit(0)
time.sleep(0.2)
open(sys.argv[1]+".t","w").write(str(os.getpid())); os.rename(sys.argv[1]+".t", sys.argv[1])
while not stop: time.sleep(0.02)
msg, anc, flags, addr = b.recvmsg(100, socket.CMSG_SPACE(12))
cp, cu, cg = struct.unpack("iII", anc[0][2])
os.kill(pid, signal.SIGTERM); os.waitpid(pid, 0)
ok = msg == b"from child" and cp == pid and cu == 4321 and cg == 1234
print("PASS" if ok else f"FAIL {msg!r} {cp} {cu} {cg}", flush=True)
sys.exit(0 if ok else 1)
