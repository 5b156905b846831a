# attack: open a socket of every address family and type, connect to the host
# expect: ok
# must not: reach any network; socket(2) fails with EACCES for every family
import errno, socket

opened = []
for family in range(0, 46):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET):
        try:
            s = socket.socket(family, kind)
        except OSError as e:
            assert e.errno == errno.EACCES, (family, kind, e)
            continue
        opened.append((family, kind))
        s.close()
assert not opened, opened
for address in (("127.0.0.1", 5432), ("10.0.2.2", 80), ("169.254.169.254", 80)):
    try:
        socket.create_connection(address, timeout=1)
    except OSError as e:
        assert e.errno == errno.EACCES, (address, e)
    else:
        raise SystemExit(f"connected to {address}")
try:
    socket.getaddrinfo("example.com", 80)
except OSError:
    pass
else:
    raise SystemExit("a name resolved")
# socketpair is an in-memory pipe inside the VM, not a host socket.
a, b = socket.socketpair()
a.sendall(b"inside")
assert b.recv(6) == b"inside"
print("contained")
