//! What Linux offers a process tree besides fork and exec, on the KVM vCPU: waiting for signals
//! (sigwait, sigwaitinfo, sigtimedwait), the CPU-time interval timers, FIFOs and memfd files,
//! and the clocks it may not set.
//! Each Python program runs in the VM and natively (`/usr/bin/python3.11`), and both must
//! print the same.

mod common;

use std::time::Duration;

use common::python_request;

/// Runs `program` in the VM and natively; both must exit 0 and print the same, which is
/// returned.
fn same_as_native(tag: &str, program: &str) -> String {
    let mut req = python_request(program);
    req.timeout = common::scaled(Duration::from_secs(30));
    common::prints_as_native(&req, tag, program, &[])
}

#[test]
fn sigwait_sigwaitinfo_and_sigtimedwait_take_signals_without_their_handlers() {
    let printed = same_as_native(
        "sigwait",
        r#"
import os, signal, threading, time
S1, S2 = signal.SIGUSR1, signal.SIGUSR2
signal.signal(S1, lambda *a: print("handler ran"))
signal.pthread_sigmask(signal.SIG_BLOCK, [S1, S2, signal.SIGALRM])
os.kill(os.getpid(), S1)
print("sigwait", signal.sigwait([S1, S2]).name)
os.kill(os.getpid(), S2)
info = signal.sigwaitinfo([S2])
print("sigwaitinfo", info.si_signo == S2, info.si_code == 0, info.si_uid == os.getuid())
print("poll", signal.sigtimedwait([S1], 0))
t0 = time.monotonic()
print("timeout", signal.sigtimedwait([S1], 0.2), time.monotonic() - t0 >= 0.19)
signal.setitimer(signal.ITIMER_REAL, 0.05)
info = signal.sigtimedwait([signal.SIGALRM], 10)
print("timer", info.si_signo == signal.SIGALRM, info.si_code == 0x80)
def later():
    time.sleep(0.1)
    os.kill(os.getpid(), S1)
threading.Thread(target=later).start()
print("sent by a thread", signal.sigwait([S1]).name)
got = []
waiter = threading.Thread(target=lambda: got.append(signal.sigwait([S2])))
waiter.start()
time.sleep(0.1)
signal.pthread_kill(waiter.ident, S2)
waiter.join()
print("waited in a thread", got[0].name)
pid = os.fork()
if pid == 0:
    time.sleep(0.1)
    os.kill(os.getppid(), S1)
    os._exit(0)
print("sent by a child", signal.sigwait([S1]).name, os.waitpid(pid, 0)[1])
signal.pthread_sigmask(signal.SIG_UNBLOCK, [S1, S2])
print("nothing left pending")
"#,
    );
    assert_eq!(
        printed,
        "sigwait SIGUSR1\nsigwaitinfo True True True\npoll None\ntimeout None True\n\
         timer True True\nsent by a thread SIGUSR1\nwaited in a thread SIGUSR2\n\
         sent by a child SIGUSR1 0\nnothing left pending\n"
    );
}

#[test]
fn cpu_time_interval_timers_fire_on_the_processs_cpu_time_only() {
    let printed = same_as_native(
        "itimers",
        r#"
import signal, time
for which, sig in ((signal.ITIMER_VIRTUAL, signal.SIGVTALRM), (signal.ITIMER_PROF, signal.SIGPROF)):
    hits = []
    def handler(signum, frame):
        hits.append(signum)
        if len(hits) == 3:
            signal.setitimer(which, 0)
    signal.signal(sig, handler)
    signal.setitimer(which, 0.1, 0.05)
    time.sleep(0.3)
    left, interval = signal.getitimer(which)
    print(sig.name, "not while sleeping", hits == [], 0.05 < left <= 0.11, interval == 0.05)
    # A loop that makes no system call: the timer interrupts it.
    while len(hits) < 3:
        sum(range(1000))
    print(sig.name, "fired", hits == [sig] * 3, signal.getitimer(which) == (0.0, 0.0))
"#,
    );
    assert_eq!(
        printed,
        "SIGVTALRM not while sleeping True True True\nSIGVTALRM fired True True\n\
         SIGPROF not while sleeping True True True\nSIGPROF fired True True\n"
    );
}

#[test]
fn fifos_block_for_the_other_end_then_carry_bytes_between_processes() {
    let printed = same_as_native(
        "fifos",
        r#"
import errno, os, stat, tempfile, time
d = tempfile.mkdtemp()
path = os.path.join(d, "fifo")
os.mkfifo(path, 0o640)
st = os.stat(path)
print("made", stat.S_ISFIFO(st.st_mode), oct(st.st_mode & 0o777), st.st_size)
try:
    os.mkfifo(path)
except FileExistsError:
    print("exists")
os.mknod(os.path.join(d, "plain"), 0o600 | stat.S_IFREG)
print("mknod file", stat.S_ISREG(os.stat(os.path.join(d, "plain")).st_mode))
dfd = os.open(d, os.O_RDONLY)
os.mkfifo("at", dir_fd=dfd)
print("at", stat.S_ISFIFO(os.stat("at", dir_fd=dfd).st_mode), sorted(os.listdir(d)))
os.close(dfd)
try:
    os.open(path, os.O_WRONLY | os.O_NONBLOCK)
except OSError as e:
    print("writer without a reader", errno.errorcode[e.errno])
r = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
w = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
os.write(w, b"hello")
print("nonblocking", os.read(r, 100), stat.S_ISFIFO(os.fstat(r).st_mode))
os.close(w)
print("eof", os.read(r, 100))
os.close(r)
# A blocking open waits for the other end, in another process.
pid = os.fork()
if pid == 0:
    time.sleep(0.2)
    with open(path, "wb") as f:
        f.write(b"from the child " * 1000)
    os._exit(0)
t0 = time.monotonic()
with open(path, "rb") as f:
    waited = time.monotonic() - t0 >= 0.15
    data = f.read()
print("reader waited", waited, len(data), data[:15], os.waitpid(pid, 0)[1])
pid = os.fork()
if pid == 0:
    time.sleep(0.2)
    with open(path, "rb") as f:
        os.write(1, b"child read " + f.read() + b"\n")
    os._exit(0)
t0 = time.monotonic()
with open(path, "wb") as f:
    print("writer waited", time.monotonic() - t0 >= 0.15, flush=True)
    f.write(b"from the parent")
print("child", os.waitpid(pid, 0)[1])
os.unlink(path)
print("gone", os.path.exists(path))
"#,
    );
    assert_eq!(
        printed,
        "made True 0o640 0\nexists\nmknod file True\n\
         at True ['at', 'fifo', 'plain']\nwriter without a reader ENXIO\n\
         nonblocking b'hello' True\neof b''\nreader waited True 15000 b'from the child ' 0\n\
         writer waited True\nchild read from the parent\nchild 0\ngone False\n"
    );
}

#[test]
fn memfd_files_are_written_sealed_and_mapped_shared_across_fork() {
    let printed = same_as_native(
        "memfd",
        r#"
import fcntl, mmap, os, stat
fd = os.memfd_create("buffer", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
print("cloexec", not os.get_inheritable(fd), os.readlink(f"/proc/self/fd/{fd}"))
os.write(fd, b"memfd_create")
print("tell", os.lseek(fd, 0, os.SEEK_CUR), os.pread(fd, 5, 0))
os.ftruncate(fd, 4096)
st = os.fstat(fd)
print("regular", stat.S_ISREG(st.st_mode), st.st_size, oct(st.st_mode & 0o777))
m = mmap.mmap(fd, 4096)
pid = os.fork()
if pid == 0:
    m[:5] = b"child"
    os._exit(0)
os.waitpid(pid, 0)
print("shared", m[:12], os.pread(fd, 12, 0))
m.close()
print("seals", fcntl.fcntl(fd, fcntl.F_GET_SEALS))
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
print("sealed", fcntl.fcntl(fd, fcntl.F_GET_SEALS))
for what, call in (("shrink", lambda: os.ftruncate(fd, 10)), ("grow", lambda: os.pwrite(fd, b"x", 4096))):
    try:
        call()
    except PermissionError:
        print(what, "EPERM")
print("in place", os.pwrite(fd, b"y", 0))
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL)
try:
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
except PermissionError:
    print("no more seals")
fd2 = os.memfd_create("plain")
print("unsealable", fcntl.fcntl(fd2, fcntl.F_GET_SEALS) == fcntl.F_SEAL_SEAL, os.get_inheritable(fd2))
try:
    os.memfd_create("x" * 250)
except OSError as e:
    print("long name", e.errno == 22)
"#,
    );
    assert_eq!(
        printed,
        "cloexec True /memfd:buffer (deleted)\ntell 12 b'memfd'\nregular True 4096 0o777\n\
         shared b'child_create' b'child_create'\nseals 0\nsealed 6\nshrink EPERM\ngrow EPERM\n\
         in place 1\nno more seals\nunsealable True False\nlong name True\n"
    );
}

/// Setting a clock is refused as for an unprivileged user (EPERM), and the clocks read on. Not
/// compared with a native run: as root that would set the host's clock.
#[test]
fn setting_a_clock_is_refused_as_for_an_unprivileged_user() {
    common::assert_prints(
        r#"
import ctypes, errno, time
for clock in (time.CLOCK_REALTIME, time.CLOCK_MONOTONIC):
    try:
        time.clock_settime(clock, 0)
    except PermissionError as e:
        print("clock_settime", e.errno == errno.EPERM)
libc = ctypes.CDLL(None, use_errno=True)
SYS_settimeofday = 164
print("settimeofday", libc.syscall(SYS_settimeofday, None, None), ctypes.get_errno() == errno.EPERM)
print("clock reads", time.time() > 1.6e9)
"#,
        "clock_settime True\nclock_settime True\nsettimeofday -1 True\nclock reads True\n",
    );
}
