//! Pseudo-terminals on the KVM vCPU: os.openpty's pair with its line discipline (echo, ONLCR,
//! line editing, raw mode), pty.spawn and os.forkpty children whose terminal is their
//! controlling one, ^C signalling the foreground group, ^Z stopping it and a background read
//! stopping its reader, and EIO once the child is gone. Each
//! Python program runs in the VM and natively (`/usr/bin/python3.11`), and both must print the
//! same.

mod common;

#[test]
fn openpty_echoes_translates_and_edits_lines() {
    let printed = common::python_as_native(
        "terminal-openpty",
        r#"
import os, stat, termios, tty, fcntl, struct

def drain(fd, end):
    # Linux moves bytes between a pty's ends in a worker: read until the expected end.
    got = b""
    while not got.endswith(end):
        got += os.read(fd, 100)
    return got

master, slave = os.openpty()
print("tty", os.isatty(master), os.isatty(slave), os.isatty(1))
print("inheritable", os.get_inheritable(master), os.get_inheritable(slave))
name = os.ttyname(slave)
print("name", name.startswith("/dev/pts/"), os.path.exists(name))
st = os.fstat(slave)
print("chr", stat.S_ISCHR(st.st_mode), os.major(st.st_rdev), os.major(os.fstat(master).st_rdev))
attrs = termios.tcgetattr(slave)
print("modes", [hex(x) for x in attrs[:4]], attrs[6][termios.VINTR], attrs[6][termios.VMIN])
print("master sees", termios.tcgetattr(master)[:4] == attrs[:4])
# The slave's output gets ONLCR; what the master types is echoed and edited into a line.
os.write(slave, b"out\n")
print("read", drain(master, b"\n"))
os.write(master, b"abx\x7fc\r")
print("echo", drain(master, b"\n"))
print("line", os.read(slave, 100))
os.write(master, b"one two\x17three\x15again\n")
print("echo", drain(master, b"\n"))
print("line", os.read(slave, 100))
os.write(master, b"part\x04")
print("eof-line", os.read(slave, 100))
os.write(master, b"\x04")
print("eof", os.read(slave, 100))
print("echo", drain(master, b"part"))
os.set_blocking(master, False)
try:
    os.read(master, 10)
except BlockingIOError:
    print("master empty: EAGAIN")
os.set_blocking(master, True)
os.write(master, b"unfinished")
print("echo", drain(master, b"unfinished"))
os.set_blocking(slave, False)
try:
    os.read(slave, 10)
except BlockingIOError:
    print("no whole line: EAGAIN")
os.set_blocking(slave, True)
termios.tcflush(slave, termios.TCIFLUSH)
# Echo off, ECHONL on.
new = termios.tcgetattr(slave)
new[3] = (new[3] & ~termios.ECHO) | termios.ECHONL
termios.tcsetattr(slave, termios.TCSANOW, new)
os.write(master, b"secret\n")
print("no echo", drain(master, b"\n"), os.read(slave, 100))
# Window size.
fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
print("winsize", struct.unpack("HHHH", fcntl.ioctl(master, termios.TIOCGWINSZ, bytes(8))))
print("size", os.get_terminal_size(slave))
print("pgrp without ctty", end=" ")
try:
    os.tcgetpgrp(slave)
except OSError as e:
    print(e.errno == 25)
os.close(slave)
try:
    os.read(master, 10)
except OSError as e:
    print("after slave close", e.errno)
"#,
    );
    assert!(
        printed.contains("echo b'abx\\x08 \\x08c\\r\\n'"),
        "{printed}"
    );
    assert!(printed.contains("after slave close 5"), "{printed}");
}

#[test]
fn raw_mode_passes_bytes_and_vmin_zero_returns_at_once() {
    let printed = common::python_as_native(
        "terminal-raw",
        r#"
import os, termios, tty, select
master, slave = os.openpty()
tty.setraw(slave)
attrs = termios.tcgetattr(slave)
print("raw", attrs[3] & (termios.ICANON | termios.ECHO | termios.ISIG), attrs[1] & termios.OPOST)
os.write(master, b"a\x03\r\x7f")
print("readable", select.select([slave], [], [], 5)[0] == [slave])
print("bytes", os.read(slave, 100))
os.write(slave, b"x\ny")
print("out", os.read(master, 100))
attrs[6][termios.VMIN] = 0
attrs[6][termios.VTIME] = 0
termios.tcsetattr(slave, termios.TCSANOW, attrs)
print("vmin 0", os.read(slave, 10))
attrs[6][termios.VTIME] = 1
termios.tcsetattr(slave, termios.TCSANOW, attrs)
print("vtime", os.read(slave, 10))
p = select.poll()
p.register(master, select.POLLIN | select.POLLOUT)
print("poll", p.poll(0))
"#,
    );
    assert!(printed.contains("bytes b'a\\x03\\r\\x7f'"), "{printed}");
}

#[test]
fn forkpty_child_has_a_controlling_terminal_and_the_master_reads_eio_after_it() {
    let printed = common::python_as_native(
        "terminal-forkpty",
        r#"
import os, sys, termios
pid, master = os.forkpty()
if pid == 0:
    try:
        os.setsid()
        print("setsid worked")
    except OSError:
        print("already a session leader")
    print("isatty", os.isatty(0), os.isatty(1), os.isatty(2))
    print("foreground", os.tcgetpgrp(0) == os.getpgrp())
    fd = os.open("/dev/tty", os.O_RDWR)
    os.write(fd, b"via /dev/tty\n")
    print("ready", flush=True)
    line = sys.stdin.readline()
    print("child got", repr(line))
    sys.stdout.flush()
    os._exit(3)
out = b""
while b"ready\r\n" not in out:
    out += os.read(master, 1024)
os.write(master, b"hello\n")
while True:
    try:
        data = os.read(master, 1024)
    except OSError as e:
        print("master read after exit: errno", e.errno)
        break
    if not data:
        break
    out += data
_, status = os.waitpid(pid, 0)
print(out.decode().replace("\r\n", "|"))
print("status", os.waitstatus_to_exitcode(status))
"#,
    );
    assert!(printed.contains("child got 'hello\\n'"), "{printed}");
    assert!(printed.contains("errno 5"), "{printed}");
}

#[test]
fn pty_spawn_runs_a_child_that_reads_a_line() {
    let printed = common::python_as_native(
        "terminal-spawn",
        r#"
import os, pty, sys
fed = []
def stdin_read(fd):
    if fed:
        return b""
    fed.append(1)
    return b"typed line\n"
out = []
def master_read(fd):
    data = os.read(fd, 1024)
    out.append(data)
    return data
child = "import sys; l = input('prompt> '); print('child read', repr(l), sys.stdin.isatty())"
status = pty.spawn([sys.executable, "-c", child], master_read, stdin_read)
sys.stdout.flush()
text = b"".join(out).decode()
print()
# The echo of the typed line may come before or after the prompt: only the parts are compared.
print("prompt", "prompt> " in text, "echo", "typed line\r\n" in text)
print([l for l in text.split("\r\n") if l.startswith("child")])
print("status", os.waitstatus_to_exitcode(status))
"#,
    );
    assert!(
        printed.contains("child read 'typed line' True"),
        "{printed}"
    );
}

/// Python for the tests that type a signal character at a master: typed again and again
/// until `seen` shows in what the master reads (one typed before the child waits for it only
/// sets a flag), at most 100 times; returns all that was read.
const TYPE_UNTIL: &str = r#"
def type_until(master, char, seen, out=b""):
    for _ in range(100):
        os.write(master, char)
        try:
            while select.select([master], [], [], 0.2)[0]:
                out += os.read(master, 100)
        except OSError:
            break
        if seen in out:
            break
    return out
"#;

/// `common::python_as_native` of `program` with `type_until` defined for it.
fn python_typing_at_a_master(tag: &str, program: &str) -> String {
    common::python_as_native(tag, &format!("{TYPE_UNTIL}{program}"))
}

/// ^C typed at the master signals the slave's foreground group: the forkpty child's read is
/// interrupted and its SIGINT handler runs. ^C is typed until that happens: a SIGINT that comes
/// before the child's read has begun only sets Python's flag, and the read then waits (as
/// natively, where the window is narrower).
#[test]
fn interrupt_character_signals_the_foreground_group() {
    let printed = python_typing_at_a_master(
        "terminal-isig",
        r#"
import os, select, signal, sys
pid, master = os.forkpty()
if pid == 0:
    def interrupted(signum, frame):
        os.write(1, b"child interrupted\n")
        os._exit(7)
    signal.signal(signal.SIGINT, interrupted)
    print("ready", flush=True)
    sys.stdin.readline()
    print("not interrupted", flush=True)
    os._exit(0)
buf = b""
while b"ready" not in buf:
    buf += os.read(master, 100)
out = type_until(master, b"\x03", b"child interrupted")
_, status = os.waitpid(pid, 0)
print(b"child interrupted" in out, b"not interrupted" in out, "status", os.waitstatus_to_exitcode(status))
"#,
    );
    assert_eq!(printed, "True False status 7\n");
}

/// Job control on the terminal, as an interactive shell uses it: the session leader puts a
/// job in a group of its own in the foreground; ^Z stops it (the leader's waitpid with
/// WUNTRACED sees SIGTSTP); continued in the background, its read of the terminal stops it
/// again with SIGTTIN; under TOSTOP a background job's write stops it with SIGTTOU and writes
/// nothing. ^Z is typed until the stop is seen, as ^C above.
#[test]
fn suspend_character_and_background_reads_and_writes_stop_jobs() {
    let printed = python_typing_at_a_master(
        "terminal-job-control",
        r#"
import os, re, select, signal, sys, termios, time
pid, master = os.forkpty()
if pid == 0:
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    job = os.fork()
    if job == 0:
        os.setpgid(0, 0)
        while os.tcgetpgrp(0) != os.getpid():
            time.sleep(0.01)
        print("job ready", flush=True)
        sys.stdin.readline()
        os._exit(0)
    os.setpgid(job, job)
    os.tcsetpgrp(0, job)
    _, status = os.waitpid(job, os.WUNTRACED)
    print("job stopped by", os.WSTOPSIG(status), flush=True)
    os.tcsetpgrp(0, os.getpgrp())
    os.kill(job, signal.SIGCONT)
    _, status = os.waitpid(job, os.WUNTRACED)
    print("background read stopped by", os.WSTOPSIG(status), flush=True)
    os.kill(job, signal.SIGKILL)
    os.waitpid(job, 0)
    attrs = termios.tcgetattr(0)
    attrs[3] |= termios.TOSTOP
    termios.tcsetattr(0, termios.TCSANOW, attrs)
    writer = os.fork()
    if writer == 0:
        signal.signal(signal.SIGTTOU, signal.SIG_DFL)
        os.setpgid(0, 0)
        os.write(1, b"background write\n")
        os._exit(0)
    _, status = os.waitpid(writer, os.WUNTRACED)
    print("background write stopped by", os.WSTOPSIG(status), flush=True)
    os.kill(writer, signal.SIGKILL)
    os.waitpid(writer, 0)
    os._exit(0)
out = b""
while b"job ready" not in out:
    out += os.read(master, 100)
out = type_until(master, b"\x1a", b"job stopped", out)
try:
    while True:
        chunk = os.read(master, 100)
        if not chunk:
            break
        out += chunk
except OSError:
    pass
os.waitpid(pid, 0)
print(re.findall(r"(job|background read|background write) stopped by (\d+)", out.decode()))
print(b"background write\r\n" in out)
"#,
    );
    assert_eq!(
        printed,
        "[('job', '20'), ('background read', '21'), ('background write', '22')]\nFalse\n"
    );
}
