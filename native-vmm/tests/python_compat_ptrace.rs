//! Python features agents commonly use that need more than files and memory: asyncio (epoll
//! and an in-memory socketpair), the /dev device nodes, file-system statistics and mmap of a
//! file. Run with Debian's python3.11 on the test CPU (KVM in the KVM tier), as python_ptrace.rs.

mod common;

use std::time::Duration;

use common::{assert_prints, describe, python, scaled};
use sandfork_vmm::status::RunStatus;

#[test]
fn asyncio_tasks_sleep_gather_and_queue() {
    let code = r#"
import asyncio, time

async def worker(name, delay, log):
    await asyncio.sleep(delay)
    log.append(name)
    return name.upper()

async def producer(q):
    for i in range(5):
        await q.put(i)
        await asyncio.sleep(0)
    await q.put(None)

async def consumer(q):
    total = 0
    while (item := await q.get()) is not None:
        total += item
    return total

async def main():
    log = []
    start = time.monotonic()
    results = await asyncio.gather(worker('b', 0.2, log), worker('a', 0.1, log), worker('c', 0, []))
    elapsed = time.monotonic() - start
    print(results, log, 0.18 <= elapsed < 2)
    q = asyncio.Queue(maxsize=2)
    _, total = await asyncio.gather(producer(q), consumer(q))
    print('queue total', total)
    task = asyncio.create_task(worker('t', 0.05, log))
    print(await task, task.done())
    started = time.monotonic()
    try:
        await asyncio.wait_for(asyncio.sleep(5), timeout=0.1)
    except asyncio.TimeoutError:
        print('timed out', time.monotonic() - started < 2)
    return 'done'

print(asyncio.run(main()))
"#;
    let outcome = python(code);
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "['B', 'A', 'C'] ['a', 'b'] True\nqueue total 10\nT True\ntimed out True\ndone\n",
        "{}",
        describe(&outcome)
    );
    // wait_for's 5 s sleep was cancelled after 0.1 s (on the guest's clock, above): the run did
    // not sleep it out.
    assert!(
        outcome.stats.wall < scaled(Duration::from_secs(4)),
        "the run took {:?}",
        outcome.stats.wall
    );
}

#[test]
fn asyncio_run_in_executor_and_to_thread_run_in_threads() {
    let code = r#"
import asyncio, threading
async def main():
    loop = asyncio.get_running_loop()
    print(await loop.run_in_executor(None, sum, [1, 2]))
    print(await asyncio.to_thread(lambda: threading.current_thread() is not threading.main_thread()))
asyncio.run(main())
"#;
    assert_prints(code, "3\nTrue\n");
}

#[test]
fn dev_null_zero_and_urandom_are_character_devices() {
    let code = r#"
import os, stat
with open('/dev/null', 'w') as f:
    print(f.write('discarded'))
with open('/dev/null', 'rb') as f:
    print(f.read())
fd = os.open(os.devnull, os.O_RDWR)   # what subprocess.DEVNULL opens
print(os.write(fd, b'abc'), os.read(fd, 10))
os.close(fd)
with open('/dev/zero', 'rb') as f:
    print(f.read(5))
with open('/dev/urandom', 'rb') as f:
    a, b = f.read(32), f.read(32)
with open('/dev/random', 'rb') as f:
    c = f.read(32)
print(len(a), len(b), len(c), len({a, b, c}))
for name in ('null', 'zero', 'random', 'urandom'):
    st = os.stat('/dev/' + name)
    print(name, stat.S_ISCHR(st.st_mode), oct(st.st_mode & 0o777), os.major(st.st_rdev), os.minor(st.st_rdev))
print(sorted(os.listdir('/dev')), 'dev' in os.listdir('/'))
try:
    open('/dev/new', 'w')
except OSError as e:
    print('create in /dev:', e.errno)
"#;
    assert_prints(
        code,
        concat!(
            "9\n",
            "b''\n",
            "3 b''\n",
            "b'\\x00\\x00\\x00\\x00\\x00'\n",
            "32 32 32 3\n",
            "null True 0o666 1 3\n",
            "zero True 0o666 1 5\n",
            "random True 0o666 1 8\n",
            "urandom True 0o666 1 9\n",
            "['fd', 'null', 'ptmx', 'pts', 'random', 'shm', 'stderr', 'stdin', 'stdout', 'tty', 'urandom', 'zero'] True\n",
            "create in /dev: 30\n",
        ),
    );
}

#[test]
fn dev_urandom_differs_between_runs() {
    let code = "print(open('/dev/urandom', 'rb').read(16).hex())";
    let (first, second) = (python(code), python(code));
    assert_eq!(
        first.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&first)
    );
    assert_eq!(first.stdout.len(), 33, "{}", describe(&first));
    assert_ne!(first.stdout, second.stdout);
}

#[test]
fn disk_usage_reports_the_overlay_limit_and_a_full_read_only_image() {
    let code = r#"
import os, shutil
total, used, free = shutil.disk_usage('/tmp')
print(total == 64 << 20, 0 < used < 1 << 20, used + free == total)
with open('/tmp/big', 'wb') as f:
    f.write(b'x' * (8 << 20))
_, used_after, free_after = shutil.disk_usage('/tmp')
print(used_after - used >= 8 << 20, free - free_after >= 8 << 20)
st = os.statvfs('/')
print(st.f_blocks > 1000, st.f_bfree, st.f_bavail, bool(st.f_flag & os.ST_RDONLY), st.f_namemax)
fd = os.open('/work', os.O_RDONLY)
print(os.fstatvfs(fd).f_blocks == (64 << 20) // 4096, bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY))
"#;
    assert_prints(
        code,
        "True True True\nTrue True\nTrue 0 0 True 255\nTrue False\n",
    );
}

#[test]
fn mmap_of_a_file_reads_copies_and_shares_writes_with_the_file() {
    let code = r#"
import mmap, os
with open('/tmp/data.bin', 'wb') as f:
    f.write(b'hello mapped world')
with open('/tmp/data.bin', 'rb') as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
    print(m[:5], m.find(b'world'), len(m))
with open('/tmp/data.bin', 'r+b') as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m:
    m[:5] = b'HELLO'
    print(m[:5], f.read(5))
with open('/tmp/data.bin', 'r+b') as f, mmap.mmap(f.fileno(), 0) as m:
    m[:5] = b'JELLO'
    os.pwrite(f.fileno(), b'MAPPED', 6)
    print(open('/tmp/data.bin', 'rb').read(), m[6:12])
    m.resize(8192)
    m[8000:8003] = b'end'
print(os.stat('/tmp/data.bin').st_size, open('/tmp/data.bin', 'rb').read()[8000:8004])
with open('/usr/lib/python3.11/os.py', 'rb') as f:
    try:
        mmap.mmap(f.fileno(), 0)
    except OSError as e:
        print('image file, shared writable:', e.errno)
"#;
    // A shared mapping shows the file's own bytes (syscalls/memory.rs): writes through it and
    // through the descriptor see each other; an image file, opened read-only, cannot be mapped
    // shared and writable (EACCES).
    assert_prints(
        code,
        "b'hello' 13 18\nb'HELLO' b'hello'\nb'JELLO MAPPED world' b'MAPPED'\n8192 b'end\\x00'\nimage file, shared writable: 13\n",
    );
}

#[test]
fn socketpair_and_the_default_selector() {
    let code = r#"
import selectors, socket
a, b = socket.socketpair()
print(a.family.name, a.type.name, repr(a.getsockname()))
sel = selectors.DefaultSelector()
print(type(sel).__name__)
sel.register(b, selectors.EVENT_READ, 'b')
print(sel.select(0))
a.sendall(b'hi there')
print([(key.data, events) for key, events in sel.select(0)], b.recv(2), b.recv(100))
a.shutdown(socket.SHUT_WR)
print(b.recv(10), b.send(b'back'), a.recv(10))
a.setblocking(False)
try:
    a.recv(10)
except BlockingIOError:
    print('would block')
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_RAW)
except OSError as e:
    print('raw socket():', e.errno)
"#;
    assert_prints(
        code,
        "AF_UNIX SOCK_STREAM ''\nEpollSelector\n[]\n[('b', 1)] b'hi' b' there'\nb'' 4 b'back'\nwould block\nraw socket(): 94\n",
    );
}

/// A Unix socket's path names one address however it is spelled (its directory resolved, as
/// Linux does); a missing directory is ENOENT; the path is a socket file.
#[test]
fn a_unix_socket_path_names_one_address_however_it_is_spelled() {
    let code = r#"
import os, socket
os.makedirs("a", exist_ok=True)
server = socket.socket(socket.AF_UNIX)
server.bind("./s")
server.listen()
for path in ["s", os.getcwd() + "/s", "a/../s", ".//s"]:
    client = socket.socket(socket.AF_UNIX)
    client.connect(path)
    server.accept()[0].close()
    client.close()
    print("connected to", path)
try:
    socket.socket(socket.AF_UNIX).bind("missing/s")
except OSError as e:
    print("missing directory:", e.errno)
# The bound path is a socket file: stat and chmod see it, open cannot, a second bind finds it taken.
import stat
os.chmod("s", 0o600)
st = os.stat("s")
print(stat.S_ISSOCK(st.st_mode), oct(stat.S_IMODE(st.st_mode)), "s" in os.listdir("."))
for call in [lambda: open("s"), lambda: socket.socket(socket.AF_UNIX).bind("s")]:
    try:
        call()
    except OSError as e:
        print(e.errno)
os.unlink("s")
print(os.path.exists("s"))
"#;
    assert_prints(code, "connected to s\nconnected to /work/s\nconnected to a/../s\nconnected to .//s\nmissing directory: 2\nTrue 0o600 True\n6\n98\nFalse\n");
}

#[test]
fn signal_handlers_run_for_kill_raise_timers_and_interrupted_calls() {
    let code = r#"
import os, signal, sys, threading, time
sys.stdout.reconfigure(line_buffering=True)  # the last signal ends the process
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
os.kill(os.getpid(), signal.SIGUSR1)
signal.raise_signal(signal.SIGUSR1)
signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
print("kill, raise, pthread_kill:", got)
try:
    os.kill(os.getpid(), signal.SIGINT)
except KeyboardInterrupt:
    print("KeyboardInterrupt")
signal.signal(signal.SIGALRM, lambda s, f: got.append("alarm"))
signal.setitimer(signal.ITIMER_REAL, 0.05)
start = time.monotonic()
time.sleep(0.2)
print("sleep resumed after the handler:", time.monotonic() - start >= 0.2, got[-1])
class Timeout(Exception):
    pass
def timeout(s, f):
    raise Timeout
signal.signal(signal.SIGALRM, timeout)
signal.setitimer(signal.ITIMER_REAL, 0.05)
try:
    while True:
        sum(range(10))
except Timeout:
    print("a busy loop is interrupted")
r, w = os.pipe()
signal.setitimer(signal.ITIMER_REAL, 0.05)
try:
    os.read(r, 1)
except Timeout:
    print("a blocked read is interrupted")
signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)
ticks = []
signal.signal(signal.SIGALRM, lambda s, f: ticks.append(s))
while len(ticks) < 3:
    signal.pause()
signal.setitimer(signal.ITIMER_REAL, 0)
print("pause woke", len(ticks), "times; timer", signal.getitimer(signal.ITIMER_REAL))
signal.signal(signal.SIGALRM, signal.SIG_DFL)
signal.alarm(1)
time.sleep(5)
"#;
    let outcome = python(code);
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 128 + 14 },
        "{}",
        describe(&outcome)
    );
    let expected = "kill, raise, pthread_kill: [10, 10, 10]\nKeyboardInterrupt\nsleep resumed after the handler: True alarm\na busy loop is interrupted\na blocked read is interrupted\npause woke 3 times; timer (0.0, 0.0)\n";
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        expected,
        "{}",
        describe(&outcome)
    );
}

#[test]
fn the_guest_owns_its_files_and_their_permission_bits_hold() {
    let code = r#"
import os, shutil
with open("f", "wb") as f:
    os.chmod("f", 0o400)
    try:
        open("f", "wb")
    except PermissionError as e:
        print("read-only:", e.errno)
print(os.access("f", os.W_OK), os.access("f", os.R_OK), os.stat("f").st_uid == os.getuid())
os.chown("f", os.getuid(), os.getgid())
try:
    os.chown("f", 0, 0)
except PermissionError:
    print("giving it away: EPERM")
try:
    os.fchown(99, -1, -1)
except OSError as e:
    print("fchown of a closed fd:", e.errno)
os.chmod("f", 0o600)
shutil.copy2("f", "g")
print("copy2 ok", os.stat("/etc").st_mtime > 315532800)
"#;
    assert_prints(code, "read-only: 13\nFalse True True\ngiving it away: EPERM\nfchown of a closed fd: 9\ncopy2 ok True\n");
}

/// The CPU-time clocks under every id Linux gives them (test_time's pthread_getcpuclockid case):
/// a thread's clock id from pthread_getcpuclockid, the process's from clock_getcpuclockid(0),
/// each readable and never going back; each thread's clock counts its own time (a thread that
/// spins 100 ms has it, the main thread waiting for it does not) and the process's all of
/// theirs; a thread or process that is not this program's is EINVAL.
#[test]
fn cpu_time_clocks_of_this_process_and_its_threads() {
    assert_prints(
        r#"
import threading, time
ids = [time.pthread_getcpuclockid(threading.get_ident()), time.CLOCK_PROCESS_CPUTIME_ID, time.CLOCK_THREAD_CPUTIME_ID, -6, -2]
reads = [(time.clock_gettime(c), time.clock_gettime(c)) for c in ids]
print(ids[0] != time.CLOCK_THREAD_CPUTIME_ID, all(0 < a <= b for a, b in reads), time.clock_getres(ids[0]))
main_before, process_before = time.thread_time(), time.process_time()
spun = []
def spin():
    clock = time.pthread_getcpuclockid(threading.get_ident())
    start = time.clock_gettime(clock)
    while time.clock_gettime(clock) - start < 0.1:
        pass
    spun.append(time.clock_gettime(clock))
t = threading.Thread(target=spin)
t.start(); t.join()
main_used, process_used = time.thread_time() - main_before, time.process_time() - process_before
print(spun[0] >= 0.1, main_used < 0.05, process_used >= 0.1)
seen = []
for bad in [(~12345 << 3) | 6, (~12345 << 3) | 2, -1, 1000]:
    try:
        time.clock_gettime(bad)
    except OSError as e:
        seen.append(e.errno)
print(seen)
"#,
        "True True 1e-09\nTrue True True\n[22, 22, 22, 22]\n",
    );
}

#[test]
fn proc_shows_the_process_and_the_vm() {
    let code = r#"
import ctypes, errno, mmap, os, resource, sys, threading
print(os.readlink('/proc/self'), os.path.realpath(os.readlink('/proc/self/exe')) == os.path.realpath(sys.executable))
status = dict(line.split(':\t', 1) for line in open('/proc/self/status').read().splitlines())
print(status['Pid'], status['PPid'], status['Uid'].split()[0] == str(os.getuid()), status['Threads'], status['Name'] == open('/proc/self/comm').read().strip())
# The fd directory lists the fds open now (the listing's own one included) and links to
# their files; a magic link reaches an unlinked file.
f = open('/tmp/data', 'w+')
f.write('kept'); f.flush()
fds = sorted(int(n) for n in os.listdir('/proc/self/fd'))
print(f.fileno() in fds, fds[:3], os.readlink(f'/proc/self/fd/{f.fileno()}'))
r, w = os.pipe()
print(os.readlink(f'/proc/self/fd/{r}').startswith('pipe:['))
os.unlink('/tmp/data')
print(os.readlink(f'/proc/self/fd/{f.fileno()}'), open(f'/proc/self/fd/{f.fileno()}').read())
try:
    os.readlink('/proc/self/fd/999')
except OSError as e:
    print('closed fd', errno.errorcode[e.errno])
# The memory map holds a fresh mapping, the heap and the stack.
m = mmap.mmap(-1, 1 << 20)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
rows = [line.split() for line in open('/proc/self/maps')]
spans = [(int(r[0].split('-')[0], 16), int(r[0].split('-')[1], 16), r[1], r[-1] if len(r) > 5 else '') for r in rows]
print(any(s <= addr < e and p.startswith('rw') for s, e, p, _ in spans), [n for *_, n in spans if n.startswith('[')])
statm = open('/proc/self/statm').read().split()
stat = open('/proc/self/stat').read()
print(len(stat.split(') ')[1].split()) + 2, stat.split()[0], int(statm[0]) > 0)
print(open('/proc/self/cmdline', 'rb').read().split(b'\0')[:-1] == [a.encode() for a in sys.orig_argv])
print(b'PATH=' + os.environ['PATH'].encode() in open('/proc/self/environ', 'rb').read().split(b'\0'))
limits = [line for line in open('/proc/self/limits') if line.startswith('Max open files')][0].split()
print(int(limits[3]) == resource.getrlimit(resource.RLIMIT_NOFILE)[0])
# The machine is the VM: its memory limit and its one CPU.
meminfo = dict(line.split(':') for line in open('/proc/meminfo'))
print(int(meminfo['MemTotal'].split()[0]) * 1024 == os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE'))
print(open('/proc/cpuinfo').read().count('processor\t:') == os.cpu_count(), float(open('/proc/uptime').read().split()[0]) >= 0)
print(open('/proc/sys/kernel/osrelease').read().strip() == os.uname().release, open('/proc/loadavg').read().split()[3])
# Threads have their own directories; thread-self names the caller's.
seen = []
def look():
    me = threading.get_native_id()
    pid_line = [l for l in open(f'/proc/self/task/{me}/status') if l.startswith('Pid:')]
    seen.append((os.readlink('/proc/thread-self'), me, sorted(os.listdir('/proc/self/task')), pid_line == [f'Pid:\t{me}\n']))
t = threading.Thread(target=look); t.start(); t.join()
link, tid, tasks, own_status = seen[0]
# Python's join returns once the thread's state is gone, which is before the thread itself
# exits (natively too): its directory goes when it does.
import time
for _ in range(5000):
    if not os.path.exists(f'/proc/self/task/{tid}'):
        break
    time.sleep(0.001)
print(link == f'1/task/{tid}', tasks == sorted([str(threading.get_native_id()), str(tid)]), own_status, os.path.exists(f'/proc/self/task/{tid}'))
for path, mode in [('/proc/self/status', 'w'), ('/proc/meminfo', 'a'), ('/proc/self/newfile', 'w')]:
    try:
        open(path, mode)
    except OSError as e:
        print(path, errno.errorcode[e.errno])
print(sorted(os.listdir('/proc/self'))[:4], os.path.exists('/proc/self/mem'), os.path.exists('/proc/2'))
# O_CREAT through the program's /proc: the cwd link is its cwd, an fd link its open file.
os.makedirs('/work/here', exist_ok=True)
os.chdir('/work/here')
with open('/proc/self/cwd/made', 'w') as made:
    made.write('x'); made.flush()
    with open(f'/proc/self/fd/{made.fileno()}', 'a') as again:
        again.write('y')
print(open('/work/here/made').read(), os.path.exists('/made'))
# So do the calls that change the tree: mkdir, symlink, rename, unlink and rmdir.
os.mkdir('/proc/self/cwd/sub')
os.symlink('made', '/proc/self/cwd/link')
fd = os.open('/work/here/sub', os.O_RDONLY)
os.rename('/proc/self/cwd/made', f'/proc/self/fd/{fd}/moved')
print(sorted(os.listdir('/work/here')), os.listdir('/work/here/sub'), os.readlink('/work/here/link'))
os.unlink(f'/proc/self/fd/{fd}/moved')
os.close(fd)
os.unlink('/proc/self/cwd/link')
os.rmdir('/proc/self/cwd/sub')
print(os.listdir('/work/here'))
# sendfile from a /proc file moves the bytes read() gives.
src, dst = os.open('/proc/self/cmdline', os.O_RDONLY), os.open('/tmp/cmdline', os.O_WRONLY | os.O_CREAT)
cmdline = open('/proc/self/cmdline', 'rb').read()
print(os.sendfile(dst, src, None, 1 << 16) == len(cmdline) > 0, open('/tmp/cmdline', 'rb').read() == cmdline)
"#;
    assert_prints(
        code,
        "1 True\n1 0 True 1 True\nTrue [0, 1, 2] /tmp/data\nTrue\n/tmp/data (deleted) kept\nclosed fd ENOENT\n\
         True ['[heap]', '[stack]']\n52 1 True\nTrue\nTrue\nTrue\nTrue\nTrue True\nTrue 1/1\nTrue True True False\n\
         /proc/self/status EACCES\n/proc/meminfo EACCES\n/proc/self/newfile EROFS\n['cmdline', 'comm', 'cwd', 'environ'] False False\nxy False\n\
         ['link', 'sub'] ['moved'] made\n[]\nTrue True\n",
    );
}

#[test]
fn sendfile_copy_file_range_and_splice_move_bytes_between_fds() {
    let code = r#"
import errno, os, shutil, sys
data = bytes(range(256)) * 1200
with open('/tmp/src', 'wb') as f:
    f.write(data)
def err(call, *args, **kw):
    try:
        call(*args, **kw)
    except OSError as e:
        return errno.errorcode[e.errno]
src = os.open('/tmp/src', os.O_RDONLY)
dst = os.open('/tmp/dst', os.O_WRONLY | os.O_CREAT, 0o600)
# With an offset the file position stays; without, it moves.
print(os.sendfile(dst, src, 10, 100), os.lseek(src, 0, os.SEEK_CUR), os.sendfile(dst, src, None, 50), os.lseek(src, 0, os.SEEK_CUR))
print(open('/tmp/dst', 'rb').read() == data[10:110] + data[:50], os.sendfile(dst, src, len(data), 10))
sys.stdout.flush()
os.sendfile(1, src, 65, 3); print()
shutil.copyfile('/tmp/src', '/tmp/copy')  # sendfile on Linux
print(open('/tmp/copy', 'rb').read() == data)
out = os.open('/tmp/range', os.O_RDWR | os.O_CREAT, 0o600)
print(os.copy_file_range(src, out, 1000, 5, 3), os.lseek(out, 0, os.SEEK_CUR), os.copy_file_range(src, out, 10), os.lseek(src, 0, os.SEEK_CUR))
print(os.pread(out, 13, 0) == data[50:60] + data[12:15])
print(err(os.copy_file_range, out, out, 10, 0, 5), err(os.sendfile, dst, os.pipe()[0], None, 1))
r, w = os.pipe()
print(os.splice(src, w, 300, offset_src=0), os.splice(r, dst, 200), os.splice(r, out, 100, offset_dst=0), os.pread(out, 100, 0) == data[200:300])
print(err(os.splice, src, dst, 10), err(os.splice, r, dst, 10, offset_src=0))
os.set_blocking(w, False)
moved = 0
while True:
    try:
        moved += os.splice(src, w, 1 << 20, offset_src=0, flags=os.SPLICE_F_NONBLOCK)
    except BlockingIOError:
        break
print(moved, err(os.splice, src, w, 10, 0, None, os.SPLICE_F_NONBLOCK))
a = os.open('/tmp/append', os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
print(err(os.sendfile, a, src, 0, 1), err(os.copy_file_range, src, a, 1))
d, empty = os.open('/tmp', os.O_RDONLY), os.open('/tmp/empty', os.O_RDWR | os.O_CREAT, 0o600)
print(err(os.sendfile, dst, d, 0, 1), err(os.copy_file_range, d, dst, 1), os.copy_file_range(empty, empty, 10, 0, 5))
"#;
    assert_prints(
        code,
        "100 0 50 50\nTrue 0\nABC\nTrue\n1000 0 10 60\nTrue\nEINVAL EINVAL\n300 200 100 True\nEINVAL ESPIPE\n65536 EAGAIN\nEINVAL EBADF\nEINVAL EISDIR 0\n",
    );
}

#[test]
fn a_pipe_capacity_is_set_and_read_back() {
    let code = r#"
import errno, fcntl, os
r, w = os.pipe()
print(fcntl.fcntl(w, fcntl.F_GETPIPE_SZ), fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, 100000), fcntl.fcntl(w, fcntl.F_GETPIPE_SZ))
os.set_blocking(w, False)
print(os.write(w, bytes(200000)))
def refused(*args):
    try:
        fcntl.fcntl(*args)
    except OSError as e:
        return errno.errorcode[e.errno]
# Below what it holds, past the limit, not a pipe.
print(refused(w, fcntl.F_SETPIPE_SZ, 4096), refused(w, fcntl.F_SETPIPE_SZ, 1 << 21), refused(os.open('/tmp', os.O_RDONLY), fcntl.F_GETPIPE_SZ))
"#;
    assert_prints(code, "65536 131072 131072\n131072\nEBUSY EPERM EBADF\n");
}

#[test]
fn utime_sets_access_and_modification_times_apart() {
    let code = r#"
import os, time
open('/tmp/t', 'w').close()
os.utime('/tmp/t', ns=(1_500_000_000_123_456_789, 1_600_000_000_987_654_321))
st = os.stat('/tmp/t')
print(st.st_atime_ns, st.st_mtime_ns)
os.utime('/tmp/t', (-100, 5))
print(os.stat('/tmp/t').st_atime, os.stat('/tmp/t').st_mtime)
fd = os.open('/tmp/t', os.O_RDONLY)
os.utime(fd, ns=(7, 8))
print(os.fstat(fd).st_atime_ns, os.fstat(fd).st_mtime_ns)
before = time.time()
os.utime('/tmp/t')
st = os.stat('/tmp/t')
print(abs(st.st_atime - before) < 60, st.st_atime_ns == st.st_mtime_ns)
"#;
    assert_prints(
        code,
        "1500000000123456789 1600000000987654321\n-100.0 5.0\n7 8\nTrue True\n",
    );
}

#[test]
fn o_path_with_o_nofollow_opens_a_symlink_itself() {
    let code = r#"
import ctypes, errno, os, stat
os.symlink('/etc/passwd', '/tmp/link')
fd = os.open('/tmp/link', os.O_PATH | os.O_NOFOLLOW)
print(stat.S_ISLNK(os.fstat(fd).st_mode), os.fstat(fd).st_size)
buf = ctypes.create_string_buffer(64)
libc = ctypes.CDLL(None, use_errno=True)
n = libc.readlinkat(fd, b'', buf, 64)
print(buf.raw[:n])
try:
    os.read(fd, 1)
except OSError as e:
    print(errno.errorcode[e.errno])
try:
    os.open('/tmp/link', os.O_RDONLY | os.O_NOFOLLOW)
except OSError as e:
    print(errno.errorcode[e.errno])
print(stat.S_ISREG(os.fstat(os.open('/tmp/link', os.O_PATH)).st_mode))
try:
    os.open('/tmp/new', os.O_PATH | os.O_CREAT)
except OSError as e:
    print('O_CREAT is ignored', errno.errorcode[e.errno])
"#;
    assert_prints(
        code,
        "True 11\nb'/etc/passwd'\nEBADF\nELOOP\nTrue\nO_CREAT is ignored ENOENT\n",
    );
}

#[test]
fn a_read_only_directory_refuses_new_and_removed_entries() {
    let code = r#"
import errno, os
os.makedirs('/tmp/d/sub')
open('/tmp/d/f', 'w').close()
os.chmod('/tmp/d', 0o555)
for what, call in [('create', lambda: open('/tmp/d/g', 'w')), ('mkdir', lambda: os.mkdir('/tmp/d/e')), ('remove', lambda: os.remove('/tmp/d/f')), ('rename', lambda: os.rename('/tmp/d/f', '/tmp/f')), ('rmdir', lambda: os.rmdir('/tmp/d/sub'))]:
    try:
        call()
    except OSError as e:
        print(what, errno.errorcode[e.errno])
open('/tmp/d/f', 'w').write('still writable')
print(os.access('/tmp/d', os.W_OK), open('/tmp/d/f').read())
os.chmod('/tmp/d', 0o755)
os.remove('/tmp/d/f')
print(os.listdir('/tmp/d'))
"#;
    assert_prints(code, "create EACCES\nmkdir EACCES\nremove EACCES\nrename EACCES\nrmdir EACCES\nFalse still writable\n['sub']\n");
}

#[test]
fn hard_links_and_fifos_are_made_and_device_nodes_refused() {
    let code = r#"
import errno, io, os, stat, tarfile
open('/tmp/a', 'w').write('data')
os.link('/tmp/a', '/tmp/b')
print(os.stat('/tmp/a').st_nlink, os.stat('/tmp/a').st_ino == os.stat('/tmp/b').st_ino)
for call in [lambda: os.link('/tmp/a', '/tmp/b'), lambda: os.link('/tmp', '/tmp/d'), lambda: os.mknod('/tmp/null', stat.S_IFCHR | 0o600, os.makedev(1, 3))]:
    try:
        call()
    except OSError as e:
        print(errno.errorcode[e.errno])
# A FIFO and a plain file are made; a device node is not.
os.mkfifo('/tmp/fifo')
os.mknod('/tmp/node')
print(stat.S_ISFIFO(os.stat('/tmp/fifo').st_mode), stat.S_ISREG(os.stat('/tmp/node').st_mode))
# tarfile extracts a hard-link member as a hard link.
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode='w') as tar:
    tar.add('/tmp/a', arcname='a')
    info = tarfile.TarInfo('b'); info.type = tarfile.LNKTYPE; info.linkname = 'a'
    tar.addfile(info)
buf.seek(0)
with tarfile.open(fileobj=buf) as tar:
    tar.extractall('/tmp/out')
print(open('/tmp/out/b').read(), os.stat('/tmp/out/b').st_nlink)
"#;
    assert_prints(code, "2 True\nEEXIST\nEPERM\nEPERM\nTrue True\ndata 2\n");
}

#[test]
fn dev_shm_holds_files_like_a_tmpfs() {
    let code = r#"
import os, tempfile
d = tempfile.mkdtemp(dir='/dev/shm')
with open(os.path.join(d, 'f'), 'w') as f:
    f.write('in memory')
print(open(os.path.join(d, 'f')).read(), os.listdir(d), os.statvfs('/dev/shm').f_bsize, 'shm' in os.listdir('/dev'))
fd = os.open('/dev/shm/psm_test', os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
os.ftruncate(fd, 4096)
print(os.fstat(fd).st_size, oct(os.stat('/dev/shm').st_mode))
"#;
    assert_prints(code, "in memory ['f'] 4096 True\n4096 0o41777\n");
}
