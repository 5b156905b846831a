"""The test network's servers, run inside the namespace the test made (tests/network_kvm.rs).

usage: servers.py ADDR NAME=IP...

- DNS on ADDR:53 (UDP): each NAME answers its IPs (A or AAAA); any other name is NXDOMAIN.
- HTTP on ADDR:8080: GET /index.html -> "hello-from-netns\n"; POST /echo -> the body back;
  GET /bytes/N -> N bytes of "x"; GET /slow -> waits 60 s before answering.
- UDP echo on ADDR:7.
Prints "ready" once every socket listens.
"""
import http.server
import socket
import socketserver
import struct
import sys
import threading
import time

ADDR = sys.argv[1]
TABLE = {}
for pair in sys.argv[2:]:
    name, ip = pair.split("=")
    TABLE.setdefault(name.lower(), []).append(ip)


def udp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ADDR, port))
    return s


def dns(s):
    while True:
        data, peer = s.recvfrom(512)
        ident, _flags = struct.unpack(">HH", data[:4])
        i, labels = 12, []
        while data[i]:
            labels.append(data[i + 1 : i + 1 + data[i]].decode())
            i += 1 + data[i]
        (qtype,) = struct.unpack(">H", data[i + 1 : i + 3])
        name = ".".join(labels).lower()
        family = {1: socket.AF_INET, 28: socket.AF_INET6}.get(qtype)
        ips = [ip for ip in TABLE.get(name, []) if family == (socket.AF_INET6 if ":" in ip else socket.AF_INET)]
        rcode = 0 if name in TABLE else 3
        out = struct.pack(">HHHHHH", ident, 0x8180 | rcode, 1, len(ips), 0, 0) + data[12 : i + 5]
        for ip in ips:
            raw = socket.inet_pton(family, ip)
            out += struct.pack(">HHHIH", 0xC00C, qtype, 1, 30, len(raw)) + raw
        s.sendto(out, peer)


def udp_echo(s):
    while True:
        data, peer = s.recvfrom(65535)
        s.sendto(data, peer)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/slow":
            time.sleep(60)
        if self.path.startswith("/bytes/"):
            self.answer(b"x" * int(self.path[len("/bytes/") :]))
        else:
            self.answer(b"hello-from-netns\n")

    def do_POST(self):
        self.answer(self.rfile.read(int(self.headers["Content-Length"])))


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client gone mid-answer (the byte cap's test) is expected


http_server = Server((ADDR, 8080), Handler)
for target, args in ((dns, (udp(53),)), (udp_echo, (udp(7),)), (http_server.serve_forever, ())):
    threading.Thread(target=target, args=args, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
