//! Debian's python3.11 run end to end on the test CPU (`common::test_cpu`: KVM in the KVM tier):
//! the Python template's real file image (templates/python/image.json), the real ELF loader
//! (ld.so, shared libraries) and the real syscall layer.

mod common;

use std::time::Duration;

use common::{
    assert_prints, describe, python, python_image, python_request, run, scaled, time_scale,
};
use sandfork_vmm::status::RunStatus;

#[test]
fn prints_six_times_seven() {
    assert_prints("print(6*7)", "42\n");
}

#[test]
fn exit_code_and_uncaught_exception() {
    let outcome = python("import sys; print('partial'); sys.exit(7)");
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 7 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(outcome.stdout, b"partial\n");

    let outcome = python("raise ValueError('boom')");
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 1 },
        "{}",
        describe(&outcome)
    );
    let stderr = String::from_utf8_lossy(&outcome.stderr);
    assert!(
        stderr.starts_with("Traceback (most recent call last):")
            && stderr.ends_with("ValueError: boom\n"),
        "{stderr}"
    );
}

#[test]
fn stdlib_text_and_data_modules() {
    let code = r#"
import json, re, textwrap, collections, dataclasses
print(json.dumps({"b": [1, 2.5], "a": None, "c": "é"}, sort_keys=True))
print(json.loads('{"x": [1, {"y": true}]}')["x"][1]["y"])
print(re.findall(r"\d+", "a1b22c333"), re.sub(r"(\w+)@(\w+)", r"\2 at \1", "me@host"))
print(textwrap.wrap("the quick brown fox jumps over the lazy dog", 12))
print(collections.Counter("mississippi").most_common(2), collections.OrderedDict(a=1))
@dataclasses.dataclass(order=True)
class P:
    x: int
    y: int = 2
print(P(1), sorted([P(3, 1), P(1, 5)]), dataclasses.asdict(P(4)))
"#;
    assert_prints(
        code,
        concat!(
            "{\"a\": null, \"b\": [1, 2.5], \"c\": \"\\u00e9\"}\n",
            "True\n",
            "['1', '22', '333'] host at me\n",
            "['the quick', 'brown fox', 'jumps over', 'the lazy dog']\n",
            "[('i', 4), ('s', 4)] OrderedDict([('a', 1)])\n",
            "P(x=1, y=2) [P(x=1, y=5), P(x=3, y=1)] {'x': 4, 'y': 2}\n",
        ),
    );
}

#[test]
fn stdlib_number_modules() {
    let code = r#"
import math, decimal, random, itertools
print(math.factorial(20), round(math.sqrt(2), 6), math.gcd(84, 36))
decimal.getcontext().prec = 30
print(decimal.Decimal("0.1") + decimal.Decimal("0.2"), decimal.Decimal(1) / decimal.Decimal(7))
random.seed(42); print(random.randint(1, 1000), random.choice("abcdef"))
print(list(itertools.permutations("abc", 2))[:3], list(itertools.accumulate([1, 2, 3, 4])))
"#;
    assert_prints(
        code,
        concat!(
            "2432902008176640000 1.414214 12\n",
            "0.3 0.142857142857142857142857142857\n",
            "655 a\n",
            "[('a', 'b'), ('a', 'c'), ('b', 'a')] [1, 3, 6, 10]\n",
        ),
    );
}

#[test]
fn stdlib_hashlib_and_datetime() {
    let code = r#"
import hashlib, datetime
print(hashlib.sha256(b"abc").hexdigest())
print(hashlib.md5(b"").hexdigest())
print(datetime.date(2024, 3, 1) - datetime.timedelta(days=1), datetime.datetime(2024, 1, 1, 12).isoformat())
print(datetime.datetime.now().year >= 2024)
"#;
    assert_prints(
        code,
        concat!(
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n",
            "d41d8cd98f00b204e9800998ecf8427e\n",
            "2024-02-29 2024-01-01T12:00:00\n",
            "True\n",
        ),
    );
}

#[test]
fn reads_a_stdlib_source_file_from_the_image() {
    let first_line = std::fs::read_to_string("/usr/lib/python3.11/json/__init__.py")
        .expect("the host's json package (the image is built from it)");
    let first_line = first_line.lines().next().unwrap_or_default();
    assert_prints(
        "import json; print(json.__file__); print(open(json.__file__).readline(), end='')",
        &format!("/usr/lib/python3.11/json/__init__.py\n{first_line}\n"),
    );
}

#[test]
fn writes_and_reads_back_a_file_in_tmp() {
    let code = r#"
import os
with open('/tmp/x', 'w') as f:
    f.write('data' * 1000)
print(os.path.getsize('/tmp/x'), open('/tmp/x').read(8), 'x' in os.listdir('/tmp'))
os.remove('/tmp/x')
print(os.path.exists('/tmp/x'))
"#;
    assert_prints(code, "4000 datadata True\nFalse\n");
}

#[test]
fn lists_the_stdlib_directory() {
    assert_prints("import os; names = os.listdir('/usr/lib/python3.11'); print('json' in names, 'os.py' in names, 'idlelib' in names)", "True True False\n");
}

#[test]
fn passes_stdin_through() {
    let mut req = python_request(
        "import sys; data = sys.stdin.read(); print(len(data), data.upper(), end='')",
    );
    req.stdin = b"hello\nworld\n".to_vec();
    let outcome = run(&python_image(), &req);
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "12 HELLO\nWORLD\n"
    );
}

#[test]
fn missing_host_file_is_not_found() {
    let code = r#"
try:
    open('/etc/shadow')
    print('opened')
except FileNotFoundError as e:
    print('FileNotFoundError', e.errno)
"#;
    assert_prints(code, "FileNotFoundError 2\n");
}

#[test]
fn sockets_reach_nothing_outside_the_vm() {
    let code = r#"
import socket
for family, address in ((socket.AF_INET, ("1.1.1.1", 80)), (socket.AF_INET6, ("2606:4700::1111", 80)), (socket.AF_INET, ("127.0.0.1", 5432))):
    try:
        socket.socket(family, socket.SOCK_STREAM).connect(address)
        print('connected')
    except OSError as e:
        print('OSError', e.errno)
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("1.1.1.1", 53))
except OSError as e:
    print('OSError', e.errno)
try:
    socket.getaddrinfo("example.com", 443)
except socket.gaierror as e:
    print('gaierror', e.errno)
"#;
    // A run with no network policy: every address outside the VM is refused (EACCES,
    // syscalls/inet.rs), names do not resolve; nothing listens on the VM's own loopback
    // unless the program does.
    assert_prints(
        code,
        "OSError 13\nOSError 13\nOSError 111\nOSError 13\ngaierror -2\n",
    );
}

#[test]
fn servers_and_clients_connect_inside_the_vm() {
    let code = r#"
import asyncio, os, socket, threading
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
port = s.getsockname()[1]
def serve():
    c, addr = s.accept()
    c.sendall(c.recv(100).upper())
    c.close()
t = threading.Thread(target=serve)
t.start()
with socket.create_connection(("localhost", port)) as c:
    c.sendall(b"tcp")
    print(c.recv(100), c.getpeername() == ("127.0.0.1", port), c.getsockname()[1] != port)
t.join()
try:
    socket.socket().bind(("127.0.0.1", port))
except OSError as e:
    print("OSError", e.errno)
s.close()
socket.socket().bind(("127.0.0.1", port))
print("port free again")
u = socket.socket(socket.AF_UNIX)
u.bind("unix.sock")
u.listen()
v = socket.socket(socket.AF_UNIX)
v.connect(os.path.abspath("unix.sock"))
w, _ = u.accept()
v.send(b"unix")
print(w.recv(4), w.getsockname())
async def main():
    async def handle(r, w):
        w.write((await r.readline()).upper())
        await w.drain()
        w.close()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    r, w = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    w.write(b"asyncio\n")
    print(await r.readline())
    w.close()
    server.close()
    await server.wait_closed()
asyncio.run(main())
"#;
    assert_prints(
        code,
        "b'TCP' True True\nOSError 98\nport free again\nb'unix' unix.sock\nb'ASYNCIO\\n'\n",
    );
}

#[test]
fn endless_loop_times_out() {
    let mut req = python_request("while True: pass");
    // Scaled, so that on a slow path the limit still falls in the loop, not in Python's start-up.
    req.timeout = scaled(Duration::from_millis(1500));
    let outcome = run(&python_image(), &req);
    assert_eq!(
        outcome.status,
        RunStatus::Timeout {
            limit_ms: req.timeout.as_millis() as u64
        },
        "{}",
        describe(&outcome)
    );
    // The run (loading excluded) ends at the limit, not long after it.
    let wall = outcome.stats.wall;
    assert!(
        wall >= req.timeout && wall < req.timeout + scaled(Duration::from_secs(2)),
        "the run took {wall:?}"
    );
}

#[test]
fn an_allocation_larger_than_memory_raises_memory_error_and_the_program_goes_on() {
    let code = "try:\n    b = b'x' * (2**40)\nexcept MemoryError:\n    b = b'x' * (2**20)\nprint('fell back to', len(b))";
    let mut req = python_request(code);
    req.mem_bytes = 256 << 20;
    let outcome = run(&python_image(), &req);
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "fell back to 1048576\n"
    );
}

#[test]
fn growing_list_is_out_of_memory() {
    let mut req = python_request("chunks = []\nwhile True: chunks.append(bytearray(1 << 20))");
    req.mem_bytes = 128 << 20;
    let outcome = run(&python_image(), &req);
    assert_eq!(
        outcome.status,
        RunStatus::OutOfMemory {
            limit_bytes: 128 << 20
        },
        "{}",
        describe(&outcome)
    );
}

#[test]
fn output_flood_is_truncated_exactly_at_the_cap() {
    const CAP: u64 = 100_000;
    let mut req = python_request("while True: print('x' * 99)");
    req.output_cap = CAP;
    let outcome = run(&python_image(), &req);
    assert_eq!(
        outcome.status,
        RunStatus::OutputLimit { cap_bytes: CAP },
        "{}",
        describe(&outcome)
    );
    let expected: Vec<u8> = format!("{}\n", "x".repeat(99))
        .into_bytes()
        .into_iter()
        .cycle()
        .take(CAP as usize)
        .collect();
    assert_eq!(outcome.stdout.len(), CAP as usize);
    assert!(
        outcome.stdout == expected,
        "stdout is not the flood's first {CAP} bytes"
    );
    assert!(outcome.stderr.is_empty());
}

#[test]
fn segfault_crashes_with_the_faulting_address() {
    let outcome = python("import ctypes; ctypes.string_at(8)");
    match outcome.status {
        RunStatus::Crashed { ref fault } => {
            assert_eq!((fault.vector, fault.address), (14, Some(8)), "{fault:?}")
        }
        _ => panic!("expected a crash\n{}", describe(&outcome)),
    }
}

#[test]
fn extension_modules_load_with_their_shared_libraries() {
    let code = r#"
import sqlite3, zlib, lzma
db = sqlite3.connect(':memory:')
print(db.execute('select 6 * 7').fetchone()[0])
print(zlib.decompress(zlib.compress(b'a' * 1000)) == b'a' * 1000, zlib.crc32(b'abc'))
print(lzma.decompress(lzma.compress(b'sandfork')))
"#;
    assert_prints(code, "42\nTrue 891568578\nb'sandfork'\n");
}

#[test]
fn binary_stdout_is_passed_through_unchanged() {
    let outcome = python("import sys; sys.stdout.buffer.write(bytes(range(256)))");
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(outcome.stdout, (0..=255u8).collect::<Vec<u8>>());
}

#[test]
fn relative_paths_resolve_in_the_working_directory() {
    let code = "import os; open('out.txt', 'w').write('x'); print(os.getcwd(), os.listdir('.'), open('/work/out.txt').read())";
    assert_prints(code, "/work ['out.txt'] x\n");
}

#[test]
fn sleeping_past_the_limit_times_out_at_the_limit() {
    // All three durations scaled: the limit falls in the sleep, the bound stays below the sleep.
    let mut req = python_request(&format!(
        "import time; time.sleep({}); print('woke')",
        30 * time_scale()
    ));
    req.timeout = scaled(Duration::from_millis(800));
    let outcome = run(&python_image(), &req);
    assert_eq!(
        outcome.status,
        RunStatus::Timeout {
            limit_ms: req.timeout.as_millis() as u64
        },
        "{}",
        describe(&outcome)
    );
    assert!(
        outcome.stats.wall < scaled(Duration::from_secs(3)),
        "the run took {:?}",
        outcome.stats.wall
    );
    assert!(outcome.stdout.is_empty());
}

#[test]
fn stderr_counts_toward_the_output_cap() {
    const CAP: u64 = 50_000;
    let mut req = python_request(
        "import sys\nprint('start', flush=True)\nwhile True: sys.stderr.write('e' * 1000)",
    );
    req.output_cap = CAP;
    let outcome = run(&python_image(), &req);
    assert_eq!(
        outcome.status,
        RunStatus::OutputLimit { cap_bytes: CAP },
        "{}",
        describe(&outcome)
    );
    assert_eq!(outcome.stdout, b"start\n");
    assert_eq!(outcome.stderr.len() as u64, CAP - 6);
    assert!(outcome.stderr.iter().all(|&b| b == b'e'));
}

#[test]
fn every_run_starts_with_empty_writable_directories() {
    let image = python_image();
    let first = run(
        &image,
        &python_request("open('/tmp/left-behind', 'w').write('x'); print('written')"),
    );
    assert_eq!(first.stdout, b"written\n", "{}", describe(&first));
    let second = run(
        &image,
        &python_request("import os; print(os.listdir('/tmp'), os.listdir('/work'))"),
    );
    assert_eq!(
        String::from_utf8_lossy(&second.stdout),
        "[] []\n",
        "{}",
        describe(&second)
    );
}
