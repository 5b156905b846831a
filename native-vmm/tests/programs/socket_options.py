import socket
for fam, typ in [(socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_DGRAM), (socket.AF_INET6, socket.SOCK_STREAM), (socket.AF_UNIX, socket.SOCK_STREAM)]:
    s = socket.socket(fam, typ)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE, 1)
    r = [s.getsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST),
         s.getsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE)]
    if typ == socket.SOCK_STREAM and fam != socket.AF_UNIX:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        r.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        s.bind(("127.0.0.1" if fam == socket.AF_INET else "::1", 0)); s.listen()
        r.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        c = socket.create_connection(s.getsockname()[:2])
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        r.append(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        a, _ = s.accept(); r.append(a.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    print(fam.name, typ.name, r)
