# Control messages on UDP and UDP-Lite sockets over ::1 and 127.0.0.1: what recvmsg returns for
# the IP_RECV*/IPV6_RECV* options, how it cuts them short (MSG_CTRUNC), what sendmsg's IP_TTL,
# IP_TOS, IP_PKTINFO, IPV6_HOPLIMIT, IPV6_TCLASS and IPV6_PKTINFO change for one datagram, and
# the errors of bad ones (some in a control buffer made by hand).
import ctypes, errno, socket, struct
from socket import CMSG_LEN, CMSG_SPACE
I = struct.Struct("i")

def show(ancdata):
    out = []
    for level, kind, data in ancdata:
        if len(data) == 4:
            data = I.unpack(data)[0]
        elif len(data) == 20:
            data = (socket.inet_ntop(socket.AF_INET6, data[:16]), struct.unpack("I", data[16:])[0])
        elif len(data) == 12:
            data = (struct.unpack("i", data[:4])[0], socket.inet_ntoa(data[4:8]), socket.inet_ntoa(data[8:]))
        out.append((level, kind, data))
    return out

def error(call):
    try:
        return call()
    except OSError as e:
        return errno.errorcode[e.errno]

def receive(sock, ancbufsize, flags=0):
    data, anc, msg_flags, source = sock.recvmsg(100, ancbufsize, flags)
    return data, show(anc), msg_flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC)

for lite in [False, True]:
    proto = socket.IPPROTO_UDPLITE if lite else 0
    r = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM, proto)
    r.bind(("::1", 0))
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM, proto)
    s.bind(("::", 0))
    to = r.getsockname()[:2]
    P6 = socket.IPPROTO_IPV6
    print("lite" if lite else "udp", "defaults", [s.getsockopt(P6, o) for o in
          (socket.IPV6_UNICAST_HOPS, socket.IPV6_TCLASS, socket.IPV6_RECVHOPLIMIT, socket.IPV6_RECVTCLASS, socket.IPV6_RECVPKTINFO)])
    # Asked for after the datagram came: the flags at the receive count.
    s.sendto(b"early", to)
    for o in (socket.IPV6_RECVHOPLIMIT, socket.IPV6_RECVTCLASS, socket.IPV6_RECVPKTINFO):
        r.setsockopt(P6, o, 1)
    print("plain", receive(r, 1024))
    s.setsockopt(P6, socket.IPV6_UNICAST_HOPS, 5)
    s.setsockopt(P6, socket.IPV6_TCLASS, 0x28)
    print("options", s.getsockopt(P6, socket.IPV6_UNICAST_HOPS), s.getsockopt(P6, socket.IPV6_TCLASS))
    s.sendto(b"set", to)
    print("socket's", receive(r, 1024, socket.MSG_PEEK), receive(r, 1024))
    s.sendmsg([b"cmsg"], [(P6, socket.IPV6_HOPLIMIT, I.pack(2)), (P6, socket.IPV6_TCLASS, I.pack(0xFF))], 0, to)
    s.sendto(b"after", to)
    print("one datagram", receive(r, 1024), receive(r, 1024))
    pktinfo = socket.inet_pton(socket.AF_INET6, "::1") + struct.pack("I", 1)
    print("pktinfo", s.sendmsg([b"pk"], [(P6, socket.IPV6_PKTINFO, pktinfo)], 0, to))
    data, anc, flags, source = r.recvmsg(10, 1024)
    print("from", source[0], source[1] == s.getsockname()[1], show(anc))
    r.setsockopt(P6, socket.IPV6_RECVPKTINFO, 0)
    for size in [0, 1, CMSG_LEN(0) - 1, CMSG_LEN(0), CMSG_LEN(4) - 1, CMSG_LEN(4), CMSG_SPACE(4),
                 CMSG_SPACE(4) + 1, CMSG_SPACE(4) + CMSG_LEN(0) - 1, CMSG_SPACE(4) + CMSG_LEN(4) - 1,
                 CMSG_SPACE(4) + CMSG_LEN(4), 2 * CMSG_SPACE(4)]:
        s.sendto(b"t", to)
        print("room", size, receive(r, size))
    s.sendto(b"none", to)
    print("no buffer", r.recvmsg(100)[1:3])
    bad = [
        ("odd", [(P6, socket.IPV6_TCLASS, I.pack(0) + b"\0")]),
        ("short", [(P6, socket.IPV6_HOPLIMIT, b"\1")]),
        ("hops", [(P6, socket.IPV6_HOPLIMIT, I.pack(256))]),
        ("class", [(P6, socket.IPV6_TCLASS, I.pack(-2))]),
        ("type", [(P6, 1000, I.pack(1))]),
        ("rights", [(socket.SOL_SOCKET, socket.SCM_RIGHTS, I.pack(0))]),
        ("interface", [(P6, socket.IPV6_PKTINFO, pktinfo[:16] + struct.pack("I", 99))]),
        ("source", [(P6, socket.IPV6_PKTINFO, socket.inet_pton(socket.AF_INET6, "2001:db8::1") + bytes(4))]),
        ("pktinfo short", [(P6, socket.IPV6_PKTINFO, pktinfo[:19])]),
        ("ipv4 level", [(socket.IPPROTO_IP, socket.IP_TTL, I.pack(0))]),
        ("other level", [(250, 1, b"x")]),
    ]
    for name, cmsgs in bad:
        print(name, error(lambda: s.sendmsg([b"b"], cmsgs, 0, to)))
    r.setblocking(False)
    got = []
    while True:
        try:
            got.append(receive(r, 1024))
        except BlockingIOError:
            break
    print("sent anyway", got)
    print("setsockopt", [error(lambda: s.setsockopt(P6, o, v)) for o, v in
          [(socket.IPV6_UNICAST_HOPS, 256), (socket.IPV6_UNICAST_HOPS, -2), (socket.IPV6_TCLASS, 256),
           (socket.IPV6_TCLASS, -1), (socket.IPV6_UNICAST_HOPS, -1)]],
          error(lambda: s.setsockopt(P6, socket.IPV6_TCLASS, b"\1")),
          s.getsockopt(P6, socket.IPV6_UNICAST_HOPS), s.getsockopt(P6, socket.IPV6_TCLASS))

# IPv4: TTL, TOS and PKTINFO.
P4 = socket.IPPROTO_IP
IP_RECVTTL, IP_PKTINFO = 12, 8
r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
r.bind(("0.0.0.0", 0))
port = r.getsockname()[1]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
print("v4 defaults", [s.getsockopt(P4, o) for o in (socket.IP_TTL, socket.IP_TOS, IP_RECVTTL, socket.IP_RECVTOS, IP_PKTINFO)],
      s.getsockopt(P4, socket.IP_TTL, 1))
for o in (IP_RECVTTL, socket.IP_RECVTOS, IP_PKTINFO):
    r.setsockopt(P4, o, 1)
s.sendto(b"v4", ("127.0.0.5", port))
print("v4 plain", receive(r, 1024))
s.setsockopt(P4, socket.IP_TTL, 9)
s.setsockopt(P4, socket.IP_TOS, 0x10)
s.sendmsg([b"v4 cmsg"], [(P4, socket.IP_TTL, I.pack(3)), (P4, socket.IP_TOS, b"\x08")], 0, ("127.0.0.1", port))
s.sendto(b"v4 set", ("127.0.0.1", port))
print("v4 options", receive(r, 1024), receive(r, 1024), s.getsockopt(P4, socket.IP_TTL), s.getsockopt(P4, socket.IP_TOS))
print("v4 pktinfo", s.sendmsg([b"pk"], [(P4, IP_PKTINFO, struct.pack("i4s4s", 0, socket.inet_aton("127.0.0.7"), bytes(4)))], 0, ("127.0.0.1", port)))
data, anc, flags, source = r.recvmsg(10, 1024)
print("v4 from", source[0], show(anc))
for name, cmsgs in [("ttl 0", [(P4, socket.IP_TTL, I.pack(0))]), ("tos 2 bytes", [(P4, socket.IP_TOS, b"\0\0")]),
                    ("pktinfo", [(P4, IP_PKTINFO, bytes(11))]), ("v6 level", [(socket.IPPROTO_IPV6, socket.IPV6_HOPLIMIT, I.pack(300))])]:
    print(name, error(lambda: s.sendmsg([b"b"], cmsgs, 0, ("127.0.0.1", port))))
print("v4 setsockopt", error(lambda: s.setsockopt(P4, socket.IP_TTL, 0)), error(lambda: s.setsockopt(P4, socket.IP_TTL, 256)),
      error(lambda: s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, 1)), error(lambda: s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS)))

# A control buffer made by hand: bad lengths are EINVAL, one too large ENOBUFS.
libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_char_p), ("len", ctypes.c_size_t)]
class msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.POINTER(iovec)), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_char_p), ("controllen", ctypes.c_size_t), ("flags", ctypes.c_int)]
sink = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
sink.bind(("::1", 0))
s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s6.connect(sink.getsockname())
def raw_send(control, controllen=None):
    iov = iovec(b"raw", 3)
    m = msghdr(None, 0, ctypes.pointer(iov), 1, control, len(control) if controllen is None else controllen, 0)
    n = libc.sendmsg(s6.fileno(), ctypes.byref(m), 0)
    return n if n >= 0 else errno.errorcode[ctypes.get_errno()]
hop = struct.pack("QiiI", CMSG_LEN(4), P6, socket.IPV6_HOPLIMIT, 7) + bytes(4)
print("raw", raw_send(hop), raw_send(hop, 15), raw_send(hop, CMSG_LEN(4)),
      raw_send(struct.pack("QiiI", 8, P6, socket.IPV6_HOPLIMIT, 7) + bytes(4)),
      raw_send(struct.pack("QiiI", 1 << 40, P6, socket.IPV6_HOPLIMIT, 7) + bytes(4)),
      raw_send(hop + struct.pack("Qii", 0, P6, 0)), raw_send(hop + bytes(15)),
      raw_send(ctypes.create_string_buffer(200000).raw, 200000))
print("raw received", [sink.recvmsg(10)[0] for _ in range(2)])
r.close()
