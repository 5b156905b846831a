# attack: open a socket of every address family and type, connect to the host and beyond, resolve a name
# expect: ok
# must not: reach any network without a policy: only stream and datagram sockets of AF_UNIX, AF_INET and AF_INET6 and seqpacket sockets of AF_UNIX exist; a connection or datagram to any other host is refused by the empty policy (EACCES); the host's own loopback services are not there; no name resolves
import errno, socket

opened = []
for family in range(0, 46):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET):
        try:
            s = socket.socket(family, kind)
        except OSError as e:
            assert e.errno in (errno.EAFNOSUPPORT, errno.ESOCKTNOSUPPORT, errno.EPROTONOSUPPORT, errno.EINVAL), (family, kind, e)
            continue
        opened.append((family, kind))
        s.close()
assert opened == [(socket.AF_UNIX, socket.SOCK_STREAM), (socket.AF_UNIX, socket.SOCK_DGRAM), (socket.AF_UNIX, socket.SOCK_SEQPACKET), (socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_DGRAM), (socket.AF_INET6, socket.SOCK_STREAM), (socket.AF_INET6, socket.SOCK_DGRAM)], opened
for address, expected in ((("10.0.2.2", 80), errno.EACCES), (("169.254.169.254", 80), errno.EACCES), (("93.184.216.34", 443), errno.EACCES), (("127.0.0.1", 5432), errno.ECONNREFUSED)):
    try:
        socket.create_connection(address, timeout=1)
    except OSError as e:
        assert e.errno == expected, (address, e)
    else:
        raise SystemExit(f"connected to {address}")
for address in (("10.0.2.2", 0), ("192.168.1.1", 8080)):
    try:
        socket.socket().bind(address)
    except OSError as e:
        assert e.errno == errno.EADDRNOTAVAIL, (address, e)
    else:
        raise SystemExit(f"bound {address}")
for address in (("10.0.2.2", 53), ("169.254.169.254", 80), ("255.255.255.255", 67), ("224.0.0.251", 5353)):
    try:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", address)
    except OSError as e:
        assert e.errno == errno.EACCES, (address, e)
    else:
        raise SystemExit(f"sent to {address}")
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
