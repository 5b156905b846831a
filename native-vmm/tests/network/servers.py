"""The test network's servers, run inside the namespace the test made (tests/network_kvm.rs).

usage: servers.py ADDR [--files DIR] [--tls CERT KEY] NAME=IP...

- DNS on ADDR:53 (UDP): each NAME answers its IPs (A or AAAA); any other name is NXDOMAIN.
- HTTP on ADDR:8080: GET /index.html -> "hello-from-netns\n"; POST /echo -> the body back;
  GET /bytes/N -> N bytes of "x"; GET /slow -> waits 60 s before answering; with --files, GET
  of a path under DIR -> that file (a path ending in "/" -> its index.html).
- With --tls: the same HTTP server over TLS on ADDR:8443 (CERT and KEY: PEM files).
- UDP echo on ADDR:7.
Prints "ready" once every socket listens.
"""
import argparse
import http.server
import pathlib
import socket
import socketserver
import ssl
import struct
import sys
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("addr")
parser.add_argument("names", nargs="*", metavar="NAME=IP")
parser.add_argument("--files", type=pathlib.Path)
parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
ARGS = parser.parse_intermixed_args()
ADDR = ARGS.addr
TABLE = {}
for pair in ARGS.names:
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

    def answer(self, body, content_type="text/plain"):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def served_file(self):
        """The file under --files that the request's path names, if any."""
        if ARGS.files is None:
            return None
        root = ARGS.files.resolve()
        path = (root / self.path.split("?")[0].lstrip("/")).resolve()
        if self.path.endswith("/"):
            path = path / "index.html"
        return path if path.is_relative_to(root) and path.is_file() else None

    def do_GET(self):
        if self.path == "/slow":
            time.sleep(60)
        if (path := self.served_file()) is not None:
            html = path.suffix == ".html"
            self.answer(path.read_bytes(), "text/html" if html else "application/octet-stream")
        elif self.path.startswith("/bytes/"):
            self.answer(b"x" * int(self.path[len("/bytes/") :]))
        else:
            self.answer(b"hello-from-netns\n")

    def do_POST(self):
        self.answer(self.rfile.read(int(self.headers["Content-Length"])))


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client gone mid-answer (the byte cap's test) is expected


servers = [Server((ADDR, 8080), Handler)]
if ARGS.tls:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(*ARGS.tls)
    https_server = Server((ADDR, 8443), Handler)
    https_server.socket = tls.wrap_socket(https_server.socket, server_side=True)
    servers.append(https_server)
threads = [(dns, (udp(53),)), (udp_echo, (udp(7),))] + [(server.serve_forever, ()) for server in servers]
for target, args in threads:
    threading.Thread(target=target, args=args, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
