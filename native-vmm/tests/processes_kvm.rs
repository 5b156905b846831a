//! A process tree in the sandbox, on the KVM vCPU: fork, execve, wait, pipes between processes,
//! signals across them, stopped and continued processes (job control), UDP over the VM's
//! loopback and AF_UNIX datagram socketpairs within and between processes, a TCP connection's
//! close and reset (SO_LINGER) on that loopback, the shell and the tools the Python template
//! ships. Shell commands run in the VM and natively (the same `/bin/bash` on the host, in an
//! empty directory) and must print the same.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use common::{describe, python, python_image, python_request, request, run};
use sandfork_vmm::status::RunStatus;
use sandfork_vmm::vm::RunOutcome;

/// Fails unless `printed` contains each of `parts`.
fn assert_contains(printed: &str, parts: &[&str]) {
    for part in parts {
        assert!(printed.contains(part), "{part:?} not in:\n{printed}");
    }
}

/// Runs `script` with bash in the VM and natively; both must exit 0 and print the same.
fn same_as_native(script: &str) -> String {
    let outcome = run(&python_image(), &request("/bin/bash", &["-c", script]));
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    static RUNS: AtomicU32 = AtomicU32::new(0);
    let run_number = RUNS.fetch_add(1, Ordering::Relaxed);
    let dir = common::process_dir(&format!("processes-native-{run_number}"));
    std::fs::create_dir_all(&dir).expect("a directory for the native run");
    let native = Command::new("/bin/bash")
        .args(["-c", script])
        .current_dir(&dir)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C")
        .env("HOME", &dir)
        .output()
        .expect("running bash natively");
    assert!(native.status.success(), "native: {native:?}");
    let vm = String::from_utf8_lossy(&outcome.stdout).into_owned();
    assert_eq!(
        vm,
        String::from_utf8_lossy(&native.stdout),
        "{}",
        describe(&outcome)
    );
    vm
}

#[test]
fn fork_and_wait_give_the_childs_status_and_ids() {
    let outcome = python(
        r#"
import os
pid = os.fork()
if pid == 0:
    print("child", os.getppid(), flush=True)
    os._exit(7)
got, status = os.waitpid(pid, 0)
print("parent", got == pid, pid != os.getpid(), os.WEXITSTATUS(status))
try:
    os.waitpid(-1, 0)
except ChildProcessError:
    print("no more children")
"#,
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "child 1\nparent True True 7\nno more children\n",
        "{}",
        describe(&outcome)
    );
}

/// A child runs first on its parent's memory, lent: what either writes once both run stays
/// its own, whether the child ends without the parent running again, blocks until the parent
/// has written (the parent's memory is frozen when it runs), or forks again meanwhile.
#[test]
fn a_fork_and_its_parent_never_see_each_others_writes() {
    let outcome = python(
        r#"
import os
data = bytearray(b"parent-before" + bytes(16384))
pid = os.fork()
if pid == 0:
    data[:13] = b"first-child!!"
    os._exit(0)
os.waitpid(pid, 0)
print("after a child that wrote and ended:", bytes(data[:13]).decode(), flush=True)
to_child, from_parent = os.pipe()
from_child, to_parent = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(to_child, 1)
    print("the child sees:", bytes(data[:13]).decode(), flush=True)
    data[:13] = b"child-wrote!!"
    grandchild = os.fork()
    if grandchild == 0:
        print("the grandchild sees:", bytes(data[:13]).decode(), flush=True)
        os._exit(0)
    os.waitpid(grandchild, 0)
    os.write(to_parent, b"x")
    os._exit(0)
data[:13] = b"parent-after!"
os.write(from_parent, b"x")
os.read(from_child, 1)
os.waitpid(pid, 0)
print("the parent sees:", bytes(data[:13]).decode())
"#,
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "after a child that wrote and ended: parent-before\n\
         the child sees: parent-before\n\
         the grandchild sees: child-wrote!!\n\
         the parent sees: parent-after!\n",
        "{}",
        describe(&outcome)
    );
}

/// A wait reports what the child used with its reaped children's, an execve's programs
/// included, and getrusage(RUSAGE_CHILDREN) sums the reaped children: each spins until its own
/// CPU clock passes a mark, so the times are bounds whatever the host's load; the peak memory
/// is the grandchild's 64 MiB.
#[test]
fn waits_and_getrusage_report_the_reaped_childrens_usage() {
    let printed = common::python_as_native(
        "rusage",
        r#"
import os, resource, sys, time
SPIN = "import time\nend = time.process_time() + {}\nwhile time.process_time() < end: pass\n"
def cpu(usage):
    return usage.ru_utime + usage.ru_stime
def children():
    return resource.getrusage(resource.RUSAGE_CHILDREN)
print("none reaped", cpu(children()), children().ru_maxrss)
pid = os.fork()
if pid == 0:
    grandchild = os.fork()
    if grandchild == 0:
        code = "data = b'x' * (64 << 20)\n" + SPIN.format(0.2)
        os.execv(sys.executable, [sys.executable, "-c", code])
    os.waitpid(grandchild, 0)
    exec(SPIN.format(0.1))
    os._exit(3)
got, status, usage = os.wait4(pid, 0)
print("status", got == pid, os.waitstatus_to_exitcode(status))
print("child with its child", cpu(usage) >= 0.3, usage.ru_maxrss >= 64 << 10)
print("reaped", cpu(children()) >= 0.3, children().ru_maxrss >= 64 << 10)
print("the same", cpu(children()) == cpu(usage), children().ru_maxrss == usage.ru_maxrss)
"#,
    );
    assert_eq!(
        printed,
        "none reaped 0.0 0\n\
         status True 3\n\
         child with its child True True\n\
         reaped True True\n\
         the same True True\n"
    );
}

/// An edge-triggered epoll registration of loopback TCP sockets and of a pipe reports a change
/// once, as natively: right after a non-blocking connect both ends are writable, a second wait
/// finds nothing new, bytes sent are a new edge.
#[test]
fn edge_triggered_epoll_reports_each_change_once() {
    let printed = common::python_as_native(
        "epoll-edges",
        r#"
import errno, os, select, socket
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
client = socket.socket()
client.setblocking(False)
try:
    client.connect(listener.getsockname())
except BlockingIOError as e:
    print("connect", errno.errorcode[e.errno])
server, _ = listener.accept()
names = {client.fileno(): "client", server.fileno(): "server"}
ep = select.epoll()
for s in (client, server):
    ep.register(s, select.EPOLLIN | select.EPOLLOUT | select.EPOLLET)
def show(events):
    return sorted((names.get(fd, fd), ev) for fd, ev in events)
print("connected", show(ep.poll(5)))
print("again", show(ep.poll(0)))
client.send(b"Hello!")
server.send(b"world!!!")
print("sent", show(ep.poll(5)))
print("again", show(ep.poll(0)))
ep.modify(server, select.EPOLLOUT)
print("modified", show(ep.poll(5)))
ep.unregister(client)
ep.unregister(server)
r, w = os.pipe()
ep.register(r, select.EPOLLIN | select.EPOLLET)
print("pipe empty", ep.poll(0))
os.write(w, b"a")
print("written", [ev for _, ev in ep.poll(5)], ep.poll(0))
os.write(w, b"b")
print("more", [ev for _, ev in ep.poll(5)], ep.poll(0))
os.read(r, 10)
os.write(w, b"c")
print("read and written", [ev for _, ev in ep.poll(5)])
"#,
    );
    assert_eq!(
        printed,
        "connect EINPROGRESS\n\
         connected [('client', 4), ('server', 4)]\n\
         again []\n\
         sent [('client', 5), ('server', 5)]\n\
         again []\n\
         modified [('server', 4)]\n\
         pipe empty []\n\
         written [1] []\n\
         more [1] []\n\
         read and written [1]\n"
    );
}

/// Urgent data sent on a loopback TCP connection to a socket that reads it inline
/// (SO_OOBINLINE, as ftplib's servers set for its ABOR) arrives in the stream, as natively.
#[test]
fn urgent_data_to_a_socket_reading_it_inline_arrives_in_the_stream() {
    let printed = common::python_as_native(
        "urgent-inline",
        r#"
import socket
listener = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(listener.getsockname())
server, _ = listener.accept()
server.setsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE, 1)
print("sent", client.send(b"ABOR\r\n", socket.MSG_OOB))
client.sendall(b"NOOP\r\n")
got = b""
while len(got) < 12:
    got += server.recv(100)
print("received", got)
"#,
    );
    assert_eq!(printed, "sent 6\nreceived b'ABOR\\r\\nNOOP\\r\\n'\n");
}

#[test]
fn subprocess_runs_programs_with_pipes_both_ways() {
    let outcome = python(
        r#"
import subprocess, sys
r = subprocess.run([sys.executable, "-c", "import sys; print(sys.argv[1:]); sys.exit(3)", "a b"],
                   capture_output=True, text=True)
print(r.returncode, r.stdout.strip())
p = subprocess.Popen([sys.executable, "-c", "import sys; print(len(sys.stdin.buffer.read()))"],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
out, _ = p.communicate(b"x" * 300000)
print(p.returncode, out.decode().strip())
try:
    subprocess.run(["/no/such/program"])
except FileNotFoundError:
    print("not found")
print(subprocess.run(["true"]).returncode, subprocess.run(["false"]).returncode)
"#,
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "3 ['a b']\n0 300000\nnot found\n0 1\n",
        "{}",
        describe(&outcome)
    );
}

#[test]
fn os_system_runs_the_shell() {
    let outcome = python(
        r#"
import os, sys
sys.stdout.flush()
status = os.system("echo from the shell; exit 3")
print(os.waitstatus_to_exitcode(status))
"#,
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "from the shell\n3\n",
        "{}",
        describe(&outcome)
    );
}

#[test]
fn shell_pipelines_print_what_they_print_natively() {
    same_as_native("seq 1 100000 | sort -rn | uniq | wc -l");
    same_as_native("seq 1 1000 | cat | cat | cat | cat | cat | cat | wc -c");
    same_as_native("x=$(echo sub | tr a-z A-Z); echo \"$x\"; echo $((6*7)) | sed 's/4/four/'");
    same_as_native(
        "mkdir -p d/e && seq 1 50 > d/e/n.txt && printf 'a\\nb\\n' > d/x.txt && \
         find d -name '*.txt' | sort | xargs grep -c . | head -5",
    );
}

#[test]
fn jobs_timeouts_and_signals_between_processes() {
    same_as_native("sleep 0.2 & echo started; wait; echo done $?");
    same_as_native("timeout 1 sleep 5; echo $?");
    same_as_native("sleep 5 & kill -9 $!; wait $!; echo $?");
    same_as_native("(exit 4); echo $?; bash -c 'kill -TERM $$'; echo $?");
}

/// flock and fcntl record locks hold between processes as on Linux: a lock another
/// description holds stops a non-blocking request and makes a blocking one wait for its
/// release; a fork's copy of a description shares its flock; F_GETLK names the holder; a
/// process's record locks go when it closes any fd of the file. SQLite, which locks with
/// fcntl, keeps a second process's write out of an open transaction.
#[test]
fn file_locks_hold_between_processes() {
    same_as_native(concat!(
        "/usr/bin/python3.11 - <<'EOF'\n",
        include_str!("programs/file_locks.py"),
        "EOF\n",
        "/usr/bin/python3.11 - <<'EOF'\n",
        include_str!("programs/sqlite_two_writers.py"),
        "EOF",
    ));
}

/// /dev/stdin, /dev/stdout, /dev/stderr and /dev/fd lead to the caller's fds: a pipe is
/// reopened through them (so `cat /dev/stdin` and bash's process substitution work), a path
/// stat follows them to the object, a pipe is no directory, and a file opened there is the file.
#[test]
fn dev_fd_links_reopen_the_callers_descriptors() {
    same_as_native(
        "{ diff <(printf 'a\\nb\\n') <(printf 'a\\nc\\n'); echo \"diff $?\"; \
           paste -d, <(seq 3) <(seq 4 6); \
           echo piped | cat /dev/stdin; echo also | cat /dev/fd/0 /proc/self/fd/0; \
           echo | cat /dev/stdin/x; \
           echo to-stdout > /dev/stdout; echo to-stderr > /dev/stderr; \
           readlink /dev/stdin /dev/fd; stat -L -c %F /dev/stdin < /dev/null; \
           echo x | stat -L -c %F /dev/stdin; echo file > f.txt; cat /dev/stdin < f.txt; \
           python3 -c 'import sys; print(open(\"/dev/stdin\").read().upper(), end=\"\")' <<< py; \
         } 2>&1",
    );
}

#[test]
fn tar_gzip_and_zip_round_trip() {
    same_as_native(
        "mkdir -p src/sub && seq 1 2000 > src/sub/a && echo hi > src/b && \
         tar czf t.tgz src && mkdir out && tar xzf t.tgz -C out && \
         diff -r src out/src && echo same && tar tzf t.tgz | sort",
    );
    same_as_native(
        "mkdir -p src/sub && seq 1 2000 > src/sub/a && echo hi > src/b && \
         zip -qr t.zip src && mkdir out && unzip -q t.zip -d out && \
         diff -r src out/src && echo same && unzip -Z1 t.zip | sort",
    );
}

#[test]
fn orphans_go_to_the_first_process_and_signals_reach_one_child() {
    let outcome = python(
        r#"
import os, signal, subprocess, time
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    if os.fork() == 0:
        time.sleep(0.2)
        os.write(w, str(os.getppid()).encode())
        os._exit(0)
    os._exit(0)
os.waitpid(pid, 0)
os.close(w)
print("orphan's parent", os.read(r, 16).decode())
sleeper = subprocess.Popen(["sleep", "30"])
other = subprocess.Popen(["sleep", "0.3"])
sleeper.kill()
print(sleeper.wait(), other.wait())
"#,
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "orphan's parent 1\n-9 0\n",
        "{}",
        describe(&outcome)
    );
}

/// A thread waiting on a pipe wakes for bytes another process wrote while its own process was
/// only preempted, not waiting: here the child writes while the parent computes, and the parent
/// then waits on a lock the reader releases. Compared with the same program run natively.
#[test]
fn a_waiting_thread_sees_what_another_process_did_while_its_process_computed() {
    let printed = common::python_as_native(
        "preempted-waiters",
        r#"
import os, threading, time
r, w = os.pipe()
got = threading.Event()
def reader():
    print("read", os.read(r, 1))
    got.set()
t = threading.Thread(target=reader)
t.start()
time.sleep(0.05)
def spin(n):
    total = 0
    for i in range(n):
        total += i
    return total
pid = os.fork()
if pid == 0:
    spin(1_000_000)
    os.write(w, b"x")
    os._exit(0)
spin(4_000_000)
print("woken", got.wait())
t.join()
print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"#,
    );
    assert_eq!(printed, "read b'x'\nwoken True\nchild 0\n");
}

/// A fork loop whose children stay: `limit_mib` of memory for the tree.
fn fork_until_refused(limit_mib: u64) -> RunOutcome {
    let mut req = common::python_request(common::FORK_UNTIL_REFUSED);
    req.mem_bytes = limit_mib << 20;
    req.timeout = common::scaled(std::time::Duration::from_secs(30));
    run(&python_image(), &req)
}

/// `FORK_UNTIL_REFUSED` made `children` children, then fork was EAGAIN, and the run ended well.
fn assert_forked_until_eagain(outcome: &RunOutcome, children: u64, context: &str) {
    assert_eq!(
        (
            outcome.status.clone(),
            String::from_utf8_lossy(&outcome.stdout)
        ),
        (
            RunStatus::Exited { code: 0 },
            format!("{children} EAGAIN\n").into()
        ),
        "{context}: {}",
        describe(outcome)
    );
    assert_eq!(outcome.stats.processes_created, children, "{context}");
}

#[test]
fn a_fork_bomb_meets_the_process_limit_and_the_run_ends() {
    // A fork copies nothing up front (Linux's heuristic overcommit): in little memory as in
    // much, the process limit (64 with the first) stops it.
    for limit_mib in [2048, 128] {
        let outcome = fork_until_refused(limit_mib);
        assert_forked_until_eagain(&outcome, 63, &format!("{limit_mib} MiB"));
    }
}

#[test]
fn a_process_limit_of_three_lets_the_program_fork_twice() {
    let mut req = python_request(common::FORK_UNTIL_REFUSED);
    req.process_limit = 3;
    assert_forked_until_eagain(&run(&python_image(), &req), 2, "limit 3");

    req.process_limit = 1;
    let alone = run(&python_image(), &req);
    assert_eq!(
        String::from_utf8_lossy(&alone.stdout),
        "0 EAGAIN\n",
        "{}",
        describe(&alone)
    );
    assert_eq!(alone.stats.processes_created, 0);
}

#[test]
fn run_max_processes_sets_the_limit_and_refuses_what_is_out_of_range() {
    let image = common::python_image_dir();
    let sandfork = |limit: &str| {
        Command::new(env!("CARGO_BIN_EXE_sandfork-vmm"))
            .args(["run", "--image"])
            .arg(&image)
            .args([
                "--max-processes",
                limit,
                "--",
                "python3",
                "-c",
                common::FORK_UNTIL_REFUSED,
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("running sandfork-vmm run")
    };
    let three = sandfork("3");
    assert!(three.status.success(), "{three:?}");
    assert_eq!(
        String::from_utf8_lossy(&three.stdout),
        "2 EAGAIN\n",
        "{three:?}"
    );
    for bad in ["0", "1025", "many"] {
        let refused = sandfork(bad);
        assert_eq!(refused.status.code(), Some(2), "{bad}: {refused:?}");
        assert!(
            String::from_utf8_lossy(&refused.stderr)
                .contains("--max-processes expects an integer from 1 to 1024"),
            "{bad}: {refused:?}"
        );
    }
}

#[test]
fn scripts_run_by_their_interpreter_line() {
    assert!(Path::new("/usr/bin/env").exists());
    same_as_native(
        "printf '#!/bin/sh\\necho script \"$@\"\\n' > s.sh && chmod +x s.sh && ./s.sh one two && \
         printf '#!/usr/bin/env python3\\nimport sys; print(sys.argv[1:])\\n' > p.py && \
         chmod +x p.py && ./p.py x",
    );
}

/// ctypes finds libraries as natively: `ctypes.util.find_library` runs `ldconfig -p`, which
/// reads the image's library cache.
#[test]
fn ctypes_finds_and_loads_libraries_by_name() {
    same_as_native(
        "/usr/bin/python3.11 -c 'import ctypes, ctypes.util as u; c = u.find_library(\"c\"); \
         print(c, u.find_library(\"ssl\"), u.find_library(\"nonesuch\"), ctypes.CDLL(c).abs(-7))'",
    );
}

/// A file's modification time is when it last changed, so make rebuilds what an edit made
/// stale and Python recompiles an edited module of the same size (its .pyc is checked by
/// mtime), as natively.
#[test]
fn edits_move_modification_times_for_make_and_python() {
    same_as_native(
        "printf 'out: in\\n\\tcp in out\\n' > Makefile; echo 1 > in; make -s; cat out; \
         printf 'x = 1\\n' > m.py; python3.11 -c 'import m; print(m.x)'; sleep 1.1; \
         echo 2 > in; make -s; cat out; printf 'x = 2\\n' > m.py; \
         python3.11 -c 'import m; print(m.x)'; [ in -nt Makefile ] && echo newer",
    );
}

#[test]
fn git_make_and_patch_work_as_natively() {
    same_as_native(
        "git config --global user.email a@example.com && git config --global user.name A && \
         git config --global init.defaultBranch main && \
         git init -q repo && cd repo && echo one > f && git add f && git commit -qm first && \
         git checkout -qb feature && echo two >> f && git commit -qam second && \
         git checkout -q main && echo other > g && git add g && git commit -qm third && \
         git merge -q --no-edit feature && git log --format=%s | sort && \
         git diff HEAD~1 --stat | tail -1 && git branch | sort && git status --short | wc -l",
    );
    same_as_native(
        "printf 'all: out.txt\\n\\tcat out.txt\\nout.txt:\\n\\tseq 3 | sed s/^/n/ > out.txt\\n' > Makefile && \
         make -s && seq 1 5 > a && seq 1 6 | sed 3d > b; diff a b > p; echo diff $?; \
         patch -s a p && cmp a b && echo patched",
    );
}

#[test]
fn a_venv_installs_a_local_wheel_with_pip() {
    let mut req = common::python_request(
        r#"
import os, subprocess, sys, zipfile
os.chdir("/work")
name = "tinypkg-1.0-py3-none-any.whl"
with zipfile.ZipFile(name, "w") as z:
    z.writestr("tinypkg/__init__.py", "X = 42\n")
    z.writestr("tinypkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")
    z.writestr("tinypkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr("tinypkg-1.0.dist-info/RECORD", "")
subprocess.run([sys.executable, "-m", "venv", "/work/v"], check=True)
subprocess.run(["/work/v/bin/pip", "install", "--no-index", "--disable-pip-version-check", "-q", name], check=True)
r = subprocess.run(["/work/v/bin/python", "-c", "import tinypkg, sys; print(tinypkg.X, sys.prefix)"],
                   check=True, capture_output=True, text=True)
print(r.stdout.strip())
"#,
    );
    // venv and pip start many interpreters: minutes on a busy host, seconds on a quiet one.
    req.timeout = common::scaled(std::time::Duration::from_secs(600));
    req.mem_bytes = 512 << 20;
    let outcome = run(&python_image(), &req);
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "42 /work/v\n",
        "{}",
        describe(&outcome)
    );
}

#[test]
fn exec_keeps_the_signal_mask_and_fexecve_runs_an_open_file() {
    let outcome = python(
        r#"
import os, signal, sys
code = "import os, signal; os.kill(os.getpid(), signal.SIGUSR1); print('blocked')"
pid = os.posix_spawn(sys.executable, [sys.executable, "-c", code], os.environ,
                     setsigmask=[signal.SIGUSR1])
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
fd = os.open(sys.executable, os.O_RDONLY)
pid = os.fork()
if pid == 0:
    os.execve(fd, [sys.executable, "-c", "print('fexecve')"], os.environ)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"#,
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "blocked\n0\nfexecve\n0\n",
        "{}",
        describe(&outcome)
    );
}

/// A vfork child (vfork, and glibc's posix_spawn) runs on its parent's memory while the parent
/// waits: the parent reads what the child wrote and mapped, errno after a failed exec, and
/// posix_spawn's error for a missing program; it goes on once the child exec'd. Compared line
/// for line with the same static program run natively.
#[test]
fn a_vfork_child_runs_on_its_parents_memory_until_it_execs_or_exits() {
    let out = common::process_dir("vfork-program");
    let binary = common::compile("vfork", common::Linking::Static, &out);
    let image = common::build_image(
        "vfork-image",
        &format!(
            r#"{{"name": "vfork", "paths": [{{"host": "{}", "guest": "/bin/vfork-static"}}], "writable_dirs": ["/tmp"]}}"#,
            binary.display()
        ),
    );
    let outcome = run(&image, &request("/bin/vfork-static", &[]));
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    common::assert_prints_as_natively(&outcome, &binary);
}

#[test]
fn a_signal_reaches_a_child_spinning_without_system_calls() {
    let outcome = python(
        r#"
import subprocess, sys, time
try:
    subprocess.call([sys.executable, "-c", "while True: pass"], timeout=0.3)
except subprocess.TimeoutExpired:
    print("timed out", flush=True)
p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
time.sleep(0.2)
p.terminate()
print(p.wait())
"#,
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "timed out\n-15\n",
        "{}",
        describe(&outcome)
    );
}

#[test]
fn shared_mappings_hard_links_and_futexes_reach_across_processes() {
    let outcome = python(
        r#"
import ctypes, mmap, os, threading
anon = mmap.mmap(-1, 8192)
with open("/dev/shm/f", "wb") as f:
    f.write(b"." * 4096)
fd = os.open("/dev/shm/f", os.O_RDWR)
filemap = mmap.mmap(fd, 4096)
private = bytearray(b"private")
pid = os.fork()
if pid == 0:
    anon[4096:4101] = b"child"
    filemap[:5] = b"wrote"
    private[:] = b"changed"
    os._exit(0)
os.waitpid(pid, 0)
print(anon[4096:4101], filemap[:5], os.pread(fd, 5, 0), bytes(private))
# A futex word in shared memory: the child waits on it, the parent wakes it.
libc = ctypes.CDLL(None, use_errno=True)
word = ctypes.c_uint32.from_buffer(anon, 0)
pid = os.fork()
if pid == 0:
    while word.value == 0:
        libc.syscall(202, ctypes.addressof(word), 0, 0, None, None, 0)  # FUTEX_WAIT
    os._exit(word.value)
word.value = 7
libc.syscall(202, ctypes.addressof(word), 1, 1, None, None, 0)  # FUTEX_WAKE
print("woken", os.WEXITSTATUS(os.waitpid(pid, 0)[1]))
os.link("/dev/shm/f", "/dev/shm/g")
print(os.stat("/dev/shm/f").st_nlink, open("/dev/shm/g", "rb").read(5))
os.unlink("/dev/shm/f")
print(os.stat("/dev/shm/g").st_nlink, sorted(os.listdir("/dev/shm")))
try:
    os.link("/usr/bin", "/tmp/bin")
except OSError as e:
    print("directory:", e.errno)
try:
    os.link("/usr/bin/env", "/tmp/env")
except OSError as e:
    print("image file:", e.errno)
"#,
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "b'child' b'wrote' b'wrote' b'private'\nwoken 7\n2 b'wrote'\n1 ['g']\ndirectory: 1\nimage file: 18\n",
        "{}",
        describe(&outcome)
    );
}

#[test]
fn file_descriptors_pass_over_unix_sockets_between_and_within_processes() {
    let printed = same_as_native(
        r#"/usr/bin/python3.11 - <<'EOF'
import os, socket
def fd_count():
    return len(os.listdir("/proc/self/fd"))
# A socketpair across fork: the child writes through the pipe end the parent passed.
a, b = socket.socketpair()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    a.close()
    msg, fds, flags, _ = socket.recv_fds(b, 16, 4)
    print("child got", msg, len(fds), flags, [os.get_inheritable(f) for f in fds], flush=True)
    os.write(fds[0], b"through the passed fd")
    os._exit(0)
b.close()
socket.send_fds(a, [b"fds"], [w])
os.close(w)
os.waitpid(pid, 0)
print("parent read", os.read(r, 100))
# A stream socket by path: the child passes an open file, the parent reads it.
with open("passed.txt", "w") as f:
    f.write("file contents")
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind("fd.sock")
server.listen(1)
pid = os.fork()
if pid == 0:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect("fd.sock")
    fd = os.open("passed.txt", os.O_RDONLY)
    socket.send_fds(client, [b"file"], [fd])
    os._exit(0)
conn, _ = server.accept()
msg, fds, _, _ = socket.recv_fds(conn, 16, 1)
os.waitpid(pid, 0)
print("by path", msg, os.pread(fds[0], 100, 0))
os.close(fds[0])
# Within one process: a short control buffer, MSG_CMSG_CLOEXEC, reads that drop the fds.
before = fd_count()
c, d = socket.socketpair()
socket.send_fds(c, [b"x"], [r, r, r])
msg, anc, flags, _ = d.recvmsg(1, socket.CMSG_LEN(4))
print("truncated", msg, len(anc), len(anc[0][2]) // 4, bool(flags & socket.MSG_CTRUNC))
os.close(int.from_bytes(anc[0][2][:4], "little"))
socket.send_fds(c, [b"y"], [r])
msg, anc, flags, _ = d.recvmsg(1, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC)
got = int.from_bytes(anc[0][2], "little")
print("cloexec", msg, os.get_inheritable(got), os.path.samestat(os.fstat(got), os.fstat(r)))
os.close(got)
socket.send_fds(c, [b"z"], [r])
print("plain recv", d.recv(10))
socket.send_fds(c, [b"w"], [r])
msg, anc, flags, _ = d.recvmsg(1)
print("no room", msg, anc, bool(flags & socket.MSG_CTRUNC))
try:
    socket.send_fds(c, [b"v"], [9999])
except OSError as e:
    print("bad fd", e.errno)
c.close()
d.close()
print("fds left", fd_count() - before)
EOF
"#,
    );
    assert!(printed.contains("through the passed fd"), "{printed}");
}

#[test]
fn proc_has_a_directory_per_live_process_and_self_is_the_caller() {
    let printed = same_as_native(
        r#"/usr/bin/python3.11 - <<'EOF'
import os
r, w = os.pipe()
go_r, go_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    os.close(go_w)
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    ids = [status["Pid"].strip(), status["PPid"].strip(), os.readlink("/proc/self")]
    os.write(w, " ".join(ids).encode())
    os.read(go_r, 1)
    os._exit(0)
os.close(go_r)
me = os.getpid()
child_pid, child_ppid, child_self = map(int, os.read(r, 100).split())
print("child's status and self", child_pid == pid, child_ppid == me, child_self == pid)
print("self", os.readlink("/proc/self") == str(me))
pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
print("listed", pid in pids, me in pids)
status = open(f"/proc/{pid}/status").read()
print("status", f"Pid:\t{pid}\n" in status, f"PPid:\t{me}\n" in status, f"Tgid:\t{pid}\n" in status)
stat = open(f"/proc/{pid}/stat").read().split()
print("stat", stat[0] == str(pid), stat[3] == str(me))
print("cmdline", open(f"/proc/{pid}/cmdline", "rb").read() == open("/proc/self/cmdline", "rb").read())
print("task", os.listdir(f"/proc/{pid}/task") == [str(pid)])
fds = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
print("fds", go_r in fds, r in fds, w in fds, go_w in fds)
print("fd link", os.readlink(f"/proc/{pid}/fd/{go_r}").startswith("pipe:["))
print("cwd", os.readlink(f"/proc/{pid}/cwd") == os.getcwd())
os.close(go_w)
os.waitpid(pid, 0)
print("gone", os.path.exists(f"/proc/{pid}"), pid in [int(n) for n in os.listdir("/proc") if n.isdigit()])
EOF
"#,
    );
    assert_eq!(
        printed,
        "child's status and self True True True\nself True\nlisted True True\n\
         status True True True\nstat True True\ncmdline True\ntask True\n\
         fds True False True False\nfd link True\ncwd True\ngone False False\n"
    );
}

/// A multiprocessing program written to /work and run under `method` (spawn imports it by path).
fn multiprocessing_prints(method: &str) -> String {
    let program = r#"
import multiprocessing as mp, sys
from multiprocessing import shared_memory
def square(x):
    return x * x
def produce(q, n):
    for i in range(n):
        q.put(i)
def count(v, lock):
    for _ in range(200):
        with lock:
            v.value += 1
def fill(name):
    s = shared_memory.SharedMemory(name=name)
    s.buf[:3] = b"abc"
    s.close()
if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    with ctx.Pool(4) as pool:
        print("pool", sum(pool.map(square, range(1000))))
    q = ctx.Queue()
    p = ctx.Process(target=produce, args=(q, 50))
    p.start()
    print("queue", sum(q.get() for _ in range(50)))
    p.join()
    v, lock = ctx.Value("i", 0, lock=False), ctx.Lock()
    ps = [ctx.Process(target=count, args=(v, lock)) for _ in range(3)]
    for p in ps: p.start()
    for p in ps: p.join()
    print("value", v.value)
    s = shared_memory.SharedMemory(create=True, size=4096)
    p = ctx.Process(target=fill, args=(s.name,))
    p.start()
    p.join()
    print("shared_memory", bytes(s.buf[:3]), p.exitcode)
    s.close()
    s.unlink()
"#;
    let mut req = common::python_request(&format!(
        "import os, sys\nopen('/work/mp.py', 'w').write({program:?})\nsys.stdout.flush()\n\
         os.execv('/usr/bin/python3.11', ['python3.11', '/work/mp.py', {method:?}])\n"
    ));
    req.timeout = common::scaled(std::time::Duration::from_secs(60));
    req.mem_bytes = 512 << 20;
    let tag = format!("multiprocessing-{method}");
    common::prints_as_native(&req, &tag, program, &[method])
}

#[test]
fn multiprocessing_pool_queue_lock_value_and_shared_memory_under_fork_spawn_and_forkserver() {
    let expected = "pool 332833500\nqueue 1225\nvalue 600\nshared_memory b'abc' 0\n";
    for method in ["fork", "spawn", "forkserver"] {
        assert_eq!(multiprocessing_prints(method), expected, "{method}");
    }
}

/// Runs Python `code` in a tree whose memory limit is 128 MiB: it must exit 0 having printed
/// `stdout`.
fn prints_in_128_mib(code: &str, stdout: &str) {
    let mut req = common::python_request(code);
    req.mem_bytes = 128 << 20;
    req.timeout = common::scaled(std::time::Duration::from_secs(120));
    let outcome = run(&python_image(), &req);
    assert_eq!(
        (
            outcome.status.clone(),
            String::from_utf8_lossy(&outcome.stdout)
        ),
        (RunStatus::Exited { code: 0 }, stdout.into()),
        "{}",
        describe(&outcome)
    );
}

/// 80 MiB held, and the same again copied, do not fit 128 MiB: the copier is killed. Once the
/// parent freed it, a child's new 48 MiB fit (beside the 80 they would not).
#[test]
fn a_large_process_forks_and_a_child_copying_past_the_trees_memory_limit_is_killed() {
    prints_in_128_mib(
        r#"
import os
def touch(buf, value):
    for i in range(0, len(buf), 4096):
        buf[i] = value
held = bytearray(80 << 20)
touch(held, 1)
pid = os.fork()
if pid == 0:
    os._exit(7)
print("a fork of a large process:", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
pid = os.fork()
if pid == 0:
    while True:
        touch(held, 2)
print("a child copying it all:", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
held[0] = 3
del held
pid = os.fork()
if pid == 0:
    touch(bytearray(48 << 20), 4)
    os._exit(0)
print("after freeing:", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"#,
        "a fork of a large process: 7\na child copying it all: -9\nafter freeing: 0\n",
    );
}

/// Each of two programs fits the tree's 128 MiB alone; the two do not: one is killed.
#[test]
fn programs_a_tree_execs_share_its_memory_limit() {
    prints_in_128_mib(
        r#"
import subprocess, sys
fill = """
import time
held = bytearray(60 << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
time.sleep(2)
"""
children = [subprocess.Popen([sys.executable, "-c", fill]) for _ in range(2)]
print(sorted(child.wait() for child in children))
"#,
        "[-9, 0]\n",
    );
}

#[test]
fn a_child_asking_for_a_signal_when_its_parent_ends_gets_it() {
    let outcome = python(
        r#"
import ctypes, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
middle = os.fork()
if middle == 0:
    if os.fork() == 0:
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        got = ctypes.c_int()
        libc.prctl(2, ctypes.byref(got), 0, 0, 0)
        os.write(w, bytes([got.value]))
        time.sleep(30)
        os._exit(0)
    time.sleep(0.2)
    os._exit(0)
print("asked for", os.read(r, 1)[0])
os.waitpid(middle, 0)
pid, status = os.wait()
print("orphan ended by", signal.Signals(os.WTERMSIG(status)).name)
name = ctypes.create_string_buffer(16)
libc.prctl(16, name, 0, 0, 0)
print(name.value, libc.prctl(12345, 0, 0, 0, 0), ctypes.get_errno())
"#,
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "asked for 15\norphan ended by SIGTERM\nb'python3' -1 22\n",
        "{}",
        describe(&outcome)
    );
}

#[test]
fn udp_datagrams_travel_over_the_vms_loopback_within_and_between_processes() {
    let printed = same_as_native(
        r#"/usr/bin/python3.11 - <<'EOF'
import errno, fcntl, os, select, socket, struct, termios
# One socket sends itself datagrams: boundaries, source, MSG_PEEK, MSG_TRUNC, FIONREAD.
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
me = s.getsockname()
print("bound", me[0], me[1] > 0)
poller = select.poll()
poller.register(s, select.POLLIN)
print("ready before", [e for _, e in poller.poll(0)] == [select.POLLOUT])
print("sent", s.sendto(b"hello", me), s.sendto(b"", me), s.sendto(b"bc", me))
print("ready after", poller.poll(0) == [(s.fileno(), select.POLLIN)])
print("fionread", struct.unpack("i", fcntl.ioctl(s, termios.FIONREAD, b"\0" * 4))[0])
data, source = s.recvfrom(100, socket.MSG_PEEK)
print("peek", data, source == me)
data, _, flags, source = s.recvmsg(2)
print("truncated", data, flags & socket.MSG_TRUNC != 0, source == me)
print("empty", s.recvfrom(100) == (b"", me))
print("whole length", len(s.recv(1, socket.MSG_TRUNC)))
s.setblocking(False)
try:
    s.recv(100)
except BlockingIOError as e:
    print("nothing left", e.errno == errno.EAGAIN)
s.setblocking(True)
# An unbound socket gets an ephemeral port at its first send.
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
print("unbound", u.getsockname())
u.sendto(b"from u", me)
name = u.getsockname()
data, source = s.recvfrom(100)
print("autobound", name[0], name[1] > 0, data, source == ("127.0.0.1", name[1]))
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).bind(("127.0.0.1", me[1]))
except OSError as e:
    print("taken", e.errno == errno.EADDRINUSE)
# A connected socket: nobody at the port, the next call reports it.
gone = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
gone.bind(("127.0.0.1", 0))
port = gone.getsockname()[1]
gone.close()
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
c.connect(("127.0.0.1", port))
print("connected from", c.getsockname()[0])
print("first send", c.send(b"x"))
try:
    c.send(b"x")
except ConnectionRefusedError:
    print("refused")
u.sendto(b"dropped", ("127.0.0.1", port))
# A parent and a forked child: the parent waits in recvfrom until the child sends.
server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
server.bind(("0.0.0.0", 0))
port = server.getsockname()[1]
pid = os.fork()
if pid == 0:
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.connect(("127.0.0.1", port))
    for i in range(3):
        client.send(b"ping %d" % i)
        print("child got", client.recv(100), flush=True)
    os._exit(0)
for i in range(3):
    data, source = server.recvfrom(100)
    server.sendto(data.replace(b"ping", b"pong"), source)
_, status = os.waitpid(pid, 0)
print("parent served", data, source[0], os.WEXITSTATUS(status))
# IPv6 loopback.
six = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
six.bind(("::1", 0))
six.sendto(b"six", six.getsockname())
data, source = six.recvfrom(100)
print("ipv6", data, source[:2] == six.getsockname()[:2])
# A timeout on a socket nobody sends to.
t = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
t.bind(("127.0.0.1", 0))
t.settimeout(0.2)
try:
    t.recvfrom(100)
except socket.timeout:
    print("timed out")
EOF"#,
    );
    assert!(printed.contains("child got b'pong 2'"), "{printed}");
    assert!(printed.ends_with("timed out\n"), "{printed}");
}

#[test]
fn udp_control_messages_carry_hop_limit_traffic_class_and_pktinfo_as_on_linux() {
    let program = include_str!("programs/udp_ancillary.py");
    let req = common::python_request(program);
    let printed = common::prints_as_native(&req, "udp-ancillary", program, &[]);
    assert_contains(
        &printed,
        &[
            "udp defaults [64, 0, 0, 0, 0]",
            "plain (b'early', [(41, 50, ('::1', 1)), (41, 52, 64), (41, 67, 0)], <MsgFlag: 0>)",
            "one datagram (b'cmsg', [(41, 50, ('::1', 1)), (41, 52, 2), (41, 67, 255)], \
             <MsgFlag: 0>) (b'after', [(41, 50, ('::1', 1)), (41, 52, 5), (41, 67, 40)]",
            "room 43 (b't', [(41, 52, 5), (41, 67, b'(\\x00\\x00')], <MsgFlag.MSG_CTRUNC: 8>)",
            "room 44 (b't', [(41, 52, 5), (41, 67, 40)], <MsgFlag: 0>)",
            "odd EINVAL\nshort EINVAL\nhops EINVAL\nclass EINVAL\ntype EINVAL\nrights 1\n\
             interface ENODEV\nsource EINVAL\n",
            "lite defaults",
            "v4 from 127.0.0.7",
            "v4 plain (b'v4', [(0, 8, (1, '127.0.0.5', '127.0.0.5')), (0, 2, 64), (0, 1, b'\\x00')]",
            "raw 3 3 3 EINVAL EINVAL EINVAL 3 ENOBUFS",
        ],
    );
}

/// TCP_NODELAY and SO_BROADCAST read back as set, before and after bind and listen, and an
/// accepted connection has its listener's, as on Linux.
#[test]
fn socket_options_read_back_as_set_and_pass_to_accepted_connections() {
    same_as_native(concat!(
        "/usr/bin/python3.11 - <<'EOF'\n",
        include_str!("programs/socket_options.py"),
        "EOF",
    ));
}

/// A loopback TCP connection: a non-blocking connect is EINPROGRESS, a close and a zero-linger
/// reset read and send as on Linux.
#[test]
fn a_tcp_connection_on_the_vms_loopback_closes_and_resets_as_on_linux() {
    let printed = same_as_native(
        r#"/usr/bin/python3.11 - <<'EOF'
import errno, os, socket, struct
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
# A connect that does not wait is EINPROGRESS, then writable with no error (a Unix one
# completes at once).
c = socket.socket()
c.setblocking(False)
print("nonblocking connect", errno.errorcode[c.connect_ex(srv.getsockname())])
import select
print("writable", select.select([], [c], [], 5)[1] == [c], c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
u = socket.socket(socket.AF_UNIX)
u.setblocking(False)
unix = socket.socket(socket.AF_UNIX)
unix.bind("nonblocking.sock")
unix.listen()
print("unix connect", u.connect_ex("nonblocking.sock"))
c.close(), srv.accept()[0].close(), u.close(), unix.close()
# A plain close: the peer reads the bytes, then end of file; it is still connected and a send
# of nothing succeeds.
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
c.sendall(b"bye")
c.close()
print("closed", s.recv(10), s.recv(10), s.getpeername()[0], s.send(b""))
# The first send after the peer's close is taken; the peer's reset makes the next ones EPIPE.
sent = []
for _ in range(3):
    try:
        sent.append(s.send(b"more"))
    except OSError as e:
        sent.append(errno.errorcode[e.errno])
print("sends after the close", sent)
s.close()
# SO_LINGER on with a zero timeout: the close resets the connection.
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
print("linger", struct.unpack("ii", c.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8)))
c.send(b"data")
c.close()
try:
    s.getpeername()
except OSError as e:
    print("getpeername", errno.errorcode[e.errno])
print("reset", s.recv(10))
for _ in range(2):
    try:
        print("then", s.recv(10))
    except OSError as e:
        print("then", errno.errorcode[e.errno])
try:
    s.send(b"x")
except OSError as e:
    print("send", errno.errorcode[e.errno])
# A pipe nobody reads takes a write of nothing.
r, w = os.pipe()
os.close(r)
print("pipe", os.write(w, b""))
# Options that change nothing in the VM read back as set.
names = [(socket.SOL_SOCKET, socket.SO_REUSEADDR), (socket.SOL_SOCKET, socket.SO_REUSEPORT),
         (socket.SOL_SOCKET, socket.SO_KEEPALIVE), (socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)]
for family, kind in [(socket.AF_INET6, socket.SOCK_STREAM), (socket.AF_INET6, socket.SOCK_DGRAM)]:
    o = socket.socket(family, kind)
    before = [o.getsockopt(*name) for name in names]
    for name in names:
        o.setsockopt(*name, 1)
    after = [o.getsockopt(*name) for name in names]
    o.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    print("options", kind, before, after, o.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR))
with socket.create_server(("::1", 0), family=socket.AF_INET6, reuse_port=True) as server:
    print("create_server", server.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY),
          server.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT))
# A TCP connection ignores the address sendto names.
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
print("sendto", c.sendto(b"to", ("127.0.0.1", 9)), s.recv(10))
# An AF_INET6 listener on the wildcard takes IPv4 connections unless IPV6_V6ONLY is set.
for v6only in [0, 1]:
    listener = socket.socket(socket.AF_INET6)
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
    listener.bind(("::", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        c = socket.create_connection(("127.0.0.1", port))
    except ConnectionRefusedError:
        print("dual stack", v6only, "refused")
        continue
    s, peer = listener.accept()
    c.sendall(b"dual")
    print("dual stack", v6only, s.recv(10), peer[0], peer[1] == c.getsockname()[1],
          s.getsockname()[:2] == ("::ffff:127.0.0.1", port), c.getpeername() == ("127.0.0.1", port))
EOF"#,
    );
    assert!(printed.contains("getpeername ENOTCONN\n"), "{printed}");
    assert!(
        printed.contains("sends after the close [4, 'EPIPE', 'EPIPE']\n"),
        "{printed}"
    );
    assert!(
        printed.contains("options 1 [0, 0, 0, 0] [1, 1, 1, 1] 0\n"),
        "{printed}"
    );
    assert!(
        printed.contains(
            "sendto 2 b'to'\ndual stack 0 b'dual' ::ffff:127.0.0.1 True True True\n\
             dual stack 1 refused\n"
        ),
        "{printed}"
    );
}

#[test]
fn unix_datagram_socketpairs_keep_boundaries_within_and_between_processes() {
    let printed = same_as_native(
        r#"/usr/bin/python3.11 - <<'EOF'
import errno, os, select, socket
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
print("type", a.type == socket.SOCK_DGRAM, a.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE))
poller = select.poll()
poller.register(b, select.POLLIN | select.POLLOUT)
print("ready before", [e for _, e in poller.poll(0)] == [select.POLLOUT])
print("sent", a.send(b"hello"), a.send(b""), a.sendmsg([b"in ", b"two"]), a.send(b"abcdef"))
print("ready after", [e for _, e in poller.poll(0)] == [select.POLLIN | select.POLLOUT])
print("peek", b.recv(100, socket.MSG_PEEK), b.recv(2, socket.MSG_PEEK))
print("whole", b.recv(100))
print("empty", b.recvfrom(100))
print("gathered", b.recv(100))
data, _, flags, source = b.recvmsg(3)
print("truncated", data, flags & socket.MSG_TRUNC != 0, source)
a.send(b"longer")
print("whole length", len(b.recv(1, socket.MSG_TRUNC)))
b.setblocking(False)
try:
    b.recv(100)
except BlockingIOError as e:
    print("nothing left", e.errno == errno.EAGAIN)
# Both ends shared across fork: the parent waits in recv until the child sends.
pid = os.fork()
if pid == 0:
    b.setblocking(True)
    for i in range(3):
        b.send(b"ping %d" % i)
        print("child got", b.recv(100), flush=True)
    os._exit(0)
for i in range(3):
    a.send(a.recv(100).replace(b"ping", b"pong"))
_, status = os.waitpid(pid, 0)
print("parent done", os.WEXITSTATUS(status))
# A nonblocking pair: a full queue is EAGAIN; a closed peer refuses the next send.
c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
sent = 0
try:
    while sent < 100000:
        c.send(b"x" * 1000)
        sent += 1
except BlockingIOError:
    print("queue full", sent > 10)
d.recv(1000)
c.send(b"x" * 1000)
print("room again")
d.close()
try:
    c.send(b"x")
except ConnectionRefusedError:
    print("refused")
try:
    c.send(b"x")
except OSError as e:
    print("then", errno.errorcode[e.errno])
try:
    c.recv(10)
except BlockingIOError:
    print("recv still waits")
EOF"#,
    );
    assert!(printed.contains("child got b'pong 2'"), "{printed}");
    assert!(printed.ends_with("recv still waits\n"), "{printed}");
}

#[test]
fn unix_datagram_sockets_bind_to_paths_and_names_and_send_by_address() {
    let printed = same_as_native(
        r#"/usr/bin/python3.11 - <<'EOF'
import asyncio, errno, logging, logging.handlers, os, select, socket, stat
def dgram():
    return socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
def error(call):
    try:
        call()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
# Bound to a path: a socket file; a second bind there is taken.
server = dgram()
server.bind("server.sock")
print("name", server.getsockname(), stat.S_ISSOCK(os.stat("server.sock").st_mode))
print("taken", error(lambda: dgram().bind("server.sock")))
print("bound twice", error(lambda: server.bind("other.sock")))
# By address from a bound and an unbound socket: the source comes back (None: unnamed).
client = dgram()
client.bind("client.sock")
print("sent", client.sendto(b"hello", "server.sock"))
print("from bound", server.recvfrom(100))
anonymous = dgram()
anonymous.sendto(b"anonymous", "server.sock")
print("from unbound", server.recvfrom(100), anonymous.getsockname())
# MSG_PEEK, MSG_DONTWAIT, recvmsg and sendmsg with names, truncation.
client.sendmsg([b"gath", b"ered"], [], 0, "server.sock")
print("peek", server.recv(100, socket.MSG_PEEK))
data, _, flags, source = server.recvmsg(4)
print("recvmsg", data, flags & socket.MSG_TRUNC != 0, source)
print("dontwait", error(lambda: server.recv(100, socket.MSG_DONTWAIT)))
# Readiness in poll, select and epoll.
poller = select.poll()
poller.register(server, select.POLLIN)
ep = select.epoll()
ep.register(server, select.EPOLLIN)
print("idle", poller.poll(0), select.select([server], [], [], 0)[0], ep.poll(0))
client.sendto(b"wake", "server.sock")
print("ready", [e for _, e in poller.poll(0)], len(select.select([server], [], [], 0)[0]),
      [e for _, e in ep.poll(0)])
server.recv(100)
# connect: sends without an address, getpeername; the peer takes only its peer's datagrams.
client.connect("server.sock")
print("peer", client.getpeername(), client.send(b"connected"), server.recvfrom(100))
server.connect("client.sock")
print("not the peer", error(lambda: anonymous.sendto(b"x", "server.sock")))
# Errors: no file, a file with no socket bound, a stream socket's path, no name at all.
print("missing", error(lambda: anonymous.sendto(b"x", "missing.sock")))
print("missing dir", error(lambda: anonymous.sendto(b"x", "nodir/x.sock")))
gone = dgram()
gone.bind("gone.sock")
gone.close()
print("closed", os.path.exists("gone.sock"), error(lambda: anonymous.sendto(b"x", "gone.sock")))
print("unconnected send", error(lambda: anonymous.send(b"x")))
stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
stream.bind("stream.sock")
stream.listen()
print("stream path", error(lambda: anonymous.sendto(b"x", "stream.sock")),
      error(lambda: socket.socket(socket.AF_UNIX).connect("server.sock")))
print("listen", error(lambda: dgram().listen()))
# A connected socket whose peer closed: refused once, then not connected.
a = dgram()
a.bind("a.sock")
b = dgram()
b.connect("a.sock")
a.close()
print("peer closed", error(lambda: b.send(b"x")), error(lambda: b.send(b"x")))
# Abstract names: no file, and a name nobody has is refused.
abstract = dgram()
abstract.bind("\0sandfork-abstract")
print("abstract", abstract.getsockname(), sorted(os.listdir(".")))
anonymous.sendto(b"abs", "\0sandfork-abstract")
print("abstract got", abstract.recvfrom(100))
print("abstract missing", error(lambda: anonymous.sendto(b"x", "\0nobody-here")))
# Across fork: the child sends from its own bound socket, the parent waits and answers it.
hub = dgram()
hub.bind("hub.sock")
pid = os.fork()
if pid == 0:
    child = dgram()
    child.bind("child.sock")
    for i in range(3):
        child.sendto(b"ping %d" % i, "hub.sock")
        print("child got", child.recvfrom(100), flush=True)
    os._exit(0)
for i in range(3):
    data, source = hub.recvfrom(100)
    hub.sendto(data.replace(b"ping", b"pong"), source)
_, status = os.waitpid(pid, 0)
print("parent done", os.WEXITSTATUS(status))
# logging's SysLogHandler to a Unix datagram socket.
log = dgram()
log.bind("log.sock")
handler = logging.handlers.SysLogHandler(address="log.sock")
logger = logging.getLogger("sandfork")
logger.addHandler(handler)
logger.warning("to syslog")
print("syslog", handler.socktype == socket.SOCK_DGRAM, log.recv(100))
handler.close()
# asyncio datagram endpoints over Unix sockets.
class Echo(asyncio.DatagramProtocol):
    def connection_made(self, transport):
        self.transport = transport
    def datagram_received(self, data, addr):
        self.transport.sendto(data.upper(), addr)
class Client(asyncio.DatagramProtocol):
    def __init__(self, done):
        self.done = done
    def datagram_received(self, data, addr):
        self.done.set_result((data, addr))
async def main():
    loop = asyncio.get_running_loop()
    server, _ = await loop.create_datagram_endpoint(Echo, local_addr="echo.sock", family=socket.AF_UNIX)
    done = loop.create_future()
    client, _ = await loop.create_datagram_endpoint(lambda: Client(done), local_addr="asker.sock", remote_addr="echo.sock", family=socket.AF_UNIX)
    client.sendto(b"asyncio")
    print("asyncio", await asyncio.wait_for(done, 5))
    client.close()
    server.close()
asyncio.run(main())
EOF"#,
    );
    assert_contains(
        &printed,
        &[
            "child got (b'pong 2', 'hub.sock')",
            "asyncio (b'ASYNCIO', 'echo.sock')",
            "missing ENOENT",
            "closed True ECONNREFUSED",
            "taken EADDRINUSE",
        ],
    );
}

#[test]
fn unix_seqpacket_sockets_keep_boundaries_and_end_with_the_peer() {
    let printed = same_as_native(
        r#"/usr/bin/python3.11 - <<'EOF'
import errno, os, select, socket
def error(call):
    try:
        call()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
print("type", a.type == socket.SOCK_SEQPACKET, a.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE))
print("sent", a.send(b"one"), a.send(b""), a.sendmsg([b"two ", b"parts"]), a.send(b"abcdef"))
print("peek", b.recv(100, socket.MSG_PEEK))
print("each", b.recv(100), b.recv(100), b.recv(100))
data, _, flags, _ = b.recvmsg(3)
print("truncated", data, flags & socket.MSG_TRUNC != 0)
b.setblocking(False)
print("nothing", error(lambda: b.recv(100)))
# The peer closes: the queue first, then end of file; sends are EPIPE; poll sees the hang-up.
b.send(b"last")
b.close()
poller = select.poll()
poller.register(a, select.POLLIN | select.POLLRDHUP)
print("hung up", [e for _, e in poller.poll(0)] == [select.POLLIN | select.POLLRDHUP | select.POLLHUP])
print("after close", a.recv(100), a.recv(100), error(lambda: a.send(b"x")))
# A listener: a forked child connects, sends three messages and closes.
server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
server.bind("seq.sock")
server.listen()
print("listening", server.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE), server.getsockname())
pid = os.fork()
if pid == 0:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    client.connect("seq.sock")
    print("child peer", client.getpeername(), flush=True)
    for i in range(3):
        client.send(b"message %d" % i)
    print("child got", client.recv(100), flush=True)
    client.close()
    os._exit(0)
conn, peer = server.accept()
print("accepted", repr(peer), conn.getsockname(), conn.type == socket.SOCK_SEQPACKET)
got = []
while True:
    data = conn.recv(5)
    if not data:
        break
    got.append(data)
    if len(got) == 3:
        conn.send(b"thanks")
_, status = os.waitpid(pid, 0)
print("parent got", got, os.WEXITSTATUS(status))
# Errors: a stream socket to a seqpacket listener, a missing path, a listener gone.
print("stream to seqpacket", error(lambda: socket.socket(socket.AF_UNIX).connect("seq.sock")))
seq = lambda: socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
print("missing", error(lambda: seq().connect("missing.sock")))
print("unconnected send", error(lambda: seq().send(b"x")))
EOF"#,
    );
    assert_contains(
        &printed,
        &[
            "parent got [b'messa', b'messa', b'messa'] 0",
            "after close b'last' b'' EPIPE",
            "stream to seqpacket EPROTOTYPE",
        ],
    );
}

#[test]
fn udp_lite_stays_on_the_loopback_and_unix_sockets_autobind() {
    let printed = same_as_native(
        r#"/usr/bin/python3.11 - <<'EOF'
import re, socket
for family, host in [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]:
    lite = socket.socket(family, socket.SOCK_DGRAM, socket.IPPROTO_UDPLITE)
    lite.bind((host, 0))
    port = lite.getsockname()[1]
    # UDP-Lite ports are apart from UDP's: a UDP socket takes the same one.
    udp = socket.socket(family, socket.SOCK_DGRAM)
    udp.bind((host, port))
    client = socket.socket(family, socket.SOCK_DGRAM, socket.IPPROTO_UDPLITE)
    client.sendto(b"lite", (host, port))
    data, source = lite.recvfrom(100)
    print("lite", data, source[1] == client.getsockname()[1],
          lite.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL))
    udp.setblocking(False)
    try:
        udp.recv(100)
    except BlockingIOError:
        print("not to udp")
# bind("") gives a Unix socket an abstract name of five hex digits, a different one each.
bound = [socket.socket(socket.AF_UNIX, kind) for kind in [socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_STREAM]]
for s in bound:
    s.bind("")
names = [s.getsockname() for s in bound]
print("autobind", [bool(re.fullmatch(rb"\0[0-9a-f]{5}", n)) for n in names], len(set(names)))
EOF"#,
    );
    assert_contains(
        &printed,
        &[
            "lite b'lite' True 136\nnot to udp\n",
            "autobind [True, True, True] 3",
        ],
    );
}

#[test]
fn pidfds_name_one_process_until_it_is_reaped() {
    let printed = same_as_native(
        r#"/usr/bin/python3.11 - <<'EOF'
import ctypes, errno, os, select, signal, struct, time
libc = ctypes.CDLL(None, use_errno=True)
PIDFD_NONBLOCK = os.O_NONBLOCK
CLONE_PIDFD, CLONE_PARENT_SETTID = 0x1000, 0x100000

def err(f, *args):
    try:
        f(*args)
    except OSError as e:
        return errno.errorcode[e.errno]
    return "ok"

def raw(nr, *args):
    got = libc.syscall(nr, *args)
    return got if got >= 0 else errno.errorcode[ctypes.get_errno()]

print("pidfd_open -1:", err(os.pidfd_open, -1), "bad flags:", err(os.pidfd_open, os.getpid(), 1))
own = os.pidfd_open(os.getpid())
print("own: close-on-exec", not os.get_inheritable(own), os.readlink(f"/proc/self/fd/{own}"))
print("not a pidfd:", err(signal.pidfd_send_signal, 0, signal.SIGTERM),
      err(os.waitid, os.P_PIDFD, 0, os.WEXITED),
      "unknown flags:", err(signal.pidfd_send_signal, own, 0, None, 8),
      "read:", err(os.read, own, 8))
os.close(own)

got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append("usr1"))
mine = os.open(f"/proc/{os.getpid()}", os.O_DIRECTORY)
signal.pidfd_send_signal(mine, signal.SIGUSR1)
print("through /proc/<pid>:", got)
os.close(mine)

# A child that waits to be signalled: its pidfd is readable only once it ended.
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, b"x")
    while True:
        signal.pause()
os.read(r, 1)
pidfd = os.pidfd_open(pid, PIDFD_NONBLOCK)
p = select.poll()
p.register(pidfd, select.POLLIN)
print("alive: poll", p.poll(0), "select", select.select([pidfd], [], [], 0)[0],
      "waitid", err(os.waitid, os.P_PIDFD, pidfd, os.WEXITED),
      "WNOHANG", os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG))
signal.pidfd_send_signal(pidfd, signal.SIGTERM)
ep = select.epoll()
ep.register(pidfd, select.EPOLLIN)
print("ended: epoll", [(fd == pidfd, bool(ev & select.EPOLLIN)) for fd, ev in ep.poll(60)],
      "select", select.select([pidfd], [], [], 60)[0] == [pidfd])
info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT)
print("zombie:", info.si_pid == pid, info.si_code == os.CLD_KILLED, info.si_status,
      "signal 0:", err(signal.pidfd_send_signal, pidfd, 0),
      "pidfd_open:", err(lambda: os.close(os.pidfd_open(pid))))
os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
other = os.fork()
if other == 0:
    time.sleep(60)
    os._exit(0)
print("reaped:", err(signal.pidfd_send_signal, pidfd, signal.SIGKILL),
      err(os.waitid, os.P_PIDFD, pidfd, os.WEXITED), err(os.pidfd_open, pid),
      "readable", bool(p.poll(0)[0][1] & select.POLLIN))
os.kill(other, signal.SIGKILL)
print("the next child lives on:", os.waitpid(other, 0)[1] == signal.SIGKILL)
os.close(pidfd)

# clone and clone3 with CLONE_PIDFD give the parent a close-on-exec pidfd of the child.
fd = ctypes.c_int(-1)
child = libc.syscall(56, CLONE_PIDFD | signal.SIGCHLD, 0, ctypes.byref(fd), 0, 0)
if child == 0:
    os._exit(5)
info = os.waitid(os.P_PIDFD, fd.value, os.WEXITED)
print("clone:", info.si_pid == child, info.si_status, not os.get_inheritable(fd.value))
os.close(fd.value)
print("clone with PARENT_SETTID:",
      raw(56, CLONE_PIDFD | CLONE_PARENT_SETTID | signal.SIGCHLD, 0, ctypes.byref(fd), 0, 0))
args = (ctypes.c_uint64 * 8)(CLONE_PIDFD, ctypes.addressof(fd), 0, 0, signal.SIGCHLD, 0, 0, 0)
child = libc.syscall(435, ctypes.byref(args), 64)
if child == 0:
    os._exit(6)
info = os.waitid(os.P_PIDFD, fd.value, os.WEXITED)
print("clone3:", info.si_pid == child, info.si_status, not os.get_inheritable(fd.value))
os.close(fd.value)

# pidfd_getfd: a copy of the child's fd 50, the write end of a pipe the parent reads.
r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:
    os.dup2(w2, 50)
    os.close(w2)
    os.write(w, b"x")
    time.sleep(60)
    os._exit(0)
os.close(w2)
os.read(r, 1)
pidfd = os.pidfd_open(pid)
copy = raw(438, pidfd, 50, 0)
os.write(copy, b"through the child's fd")
print("pidfd_getfd:", os.read(r2, 100), not os.get_inheritable(copy),
      "no such fd", raw(438, pidfd, 51, 0), "flags", raw(438, pidfd, 50, 1))
os.close(copy)
signal.pidfd_send_signal(pidfd, signal.SIGKILL)
os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
print("after it was reaped:", raw(438, pidfd, 50, 0))
EOF"#,
    );
    assert_contains(
        &printed,
        &[
            "pidfd_open -1: EINVAL bad flags: EINVAL",
            "not a pidfd: EBADF EBADF unknown flags: EINVAL read: EINVAL",
            "through /proc/<pid>: ['usr1']",
            "alive: poll [] select [] waitid EAGAIN WNOHANG None",
            "ended: epoll [(True, True)] select True",
            "zombie: True True 15 signal 0: ok pidfd_open: ok",
            "reaped: ESRCH ECHILD ESRCH readable True",
            "clone: True 5 True",
            "clone with PARENT_SETTID: EINVAL",
            "clone3: True 6 True",
            "pidfd_getfd: b\"through the child's fd\" True no such fd EBADF flags EINVAL",
            "after it was reaped: ESRCH",
        ],
    );
}

#[test]
fn rlimit_nproc_is_lowered_for_the_caller_and_its_children() {
    let outcome = python(
        r#"
import os, resource, subprocess, sys
sys.stdout.reconfigure(line_buffering=True)
NPROC = resource.RLIMIT_NPROC
soft, hard = resource.getrlimit(NPROC)
print("limits", soft, hard)
for wanted in [(soft, hard + 1), (hard + 1, hard)]:
    try:
        resource.setrlimit(NPROC, wanted)
    except ValueError as e:
        print(wanted, e)
resource.setrlimit(NPROC, (2, 10))
pid = os.fork()
if pid == 0:
    try:
        os.fork()
        print("grandchild forked")
    except BlockingIOError:
        print("child at", resource.getrlimit(NPROC), "EAGAIN")
    os._exit(0)
os.waitpid(pid, 0)
resource.setrlimit(NPROC, (0, 10))
try:
    os.fork()
except BlockingIOError:
    print("soft 0: EAGAIN")
resource.setrlimit(NPROC, (10, 10))
print("raised back:", subprocess.run([sys.executable, "-c",
      "import resource; print(resource.getrlimit(resource.RLIMIT_NPROC))"],
      capture_output=True, text=True).stdout.strip())
with open("/proc/self/limits") as f:
    print([line.split()[2:4] for line in f if line.startswith("Max processes")])
"#,
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "limits 64 64\n(64, 65) not allowed to raise maximum limit\n\
         (65, 64) current limit exceeds maximum limit\n\
         child at (2, 10) EAGAIN\nsoft 0: EAGAIN\nraised back: (10, 10)\n[['10', '10']]\n",
        "{}",
        describe(&outcome)
    );
}

#[test]
fn undecodable_bytes_in_argv_and_envp_reach_the_program_exactly() {
    let printed = same_as_native(
        r#"V=$'a\xff\x80b' bash -c 'printf %s "$V" | od -An -tx1'
/usr/bin/python3.11 - <<'EOF'
import subprocess
env = {b"PATH": b"/usr/bin:/bin", b"UNDECODABLE": b"abc\xff\xfe", b"K\xffEY": b"42"}
script = (b"import os, sys; print(ascii(os.environb[b'UNDECODABLE']), "
          b"ascii(os.environb[b'K\\xffEY']), ascii(os.fsencode(sys.argv[1])), "
          b"ascii(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[3]), "
          b"b'UNDECODABLE=abc\\xff\\xfe' in open('/proc/self/environ', 'rb').read().split(b'\\0'))")
out = subprocess.run([b"/usr/bin/python3.11", b"-c", script, b"arg\xff\x80"], env=env,
                     capture_output=True)
print(out.stdout.decode(), out.stderr.decode("ascii", "replace"), out.returncode)
EOF"#,
    );
    assert_contains(
        &printed,
        &[
            " 61 ff 80 62",
            r"b'abc\xff\xfe' b'42' b'arg\xff\x80' b'arg\xff\x80' True",
        ],
    );
}

/// A stop signal stops the whole child until SIGCONT, as on Linux: its parent's waitpid
/// (WUNTRACED) and waitid (WSTOPPED) report each stop once, waitpid and waitid (WCONTINUED)
/// report the continue, /proc shows the child stopped, a terminal's SIGTSTP stops a child in a
/// group of its own, and SIGKILL ends a stopped child.
#[test]
fn stopped_children_are_reported_continued_and_killed_as_on_linux() {
    let printed = common::python_as_native(
        "job-control-wait",
        r#"
import os, signal, subprocess
p = subprocess.Popen(["sleep", "100"], process_group=0)
os.kill(p.pid, signal.SIGSTOP)
pid, status = os.waitpid(p.pid, os.WUNTRACED)
print("stopped", pid == p.pid, os.WIFSTOPPED(status), os.WSTOPSIG(status), hex(status))
print("reported once", os.waitpid(p.pid, os.WUNTRACED | os.WNOHANG))
with open(f"/proc/{p.pid}/stat") as f:
    print("stat", f.read().rsplit(")", 1)[1].split()[0])
with open(f"/proc/{p.pid}/status") as f:
    print([line.strip() for line in f if line.startswith("State:")])
os.kill(p.pid, signal.SIGCONT)
info = os.waitid(os.P_PID, p.pid, os.WCONTINUED)
print("continued", info.si_pid == p.pid, info.si_code == os.CLD_CONTINUED, info.si_status)
print("not again", os.waitid(os.P_PID, p.pid, os.WCONTINUED | os.WNOHANG))
with open(f"/proc/{p.pid}/status") as f:
    print(["T" in line for line in f if line.startswith("State:")])
os.kill(p.pid, signal.SIGTSTP)
info = os.waitid(os.P_PID, p.pid, os.WSTOPPED)
print("tstp", info.si_code == os.CLD_STOPPED, info.si_status)
os.kill(p.pid, signal.SIGCONT)
pid, status = os.waitpid(p.pid, os.WCONTINUED)
print("waitpid continued", os.WIFCONTINUED(status), hex(status))
os.kill(p.pid, signal.SIGSTOP)
os.waitpid(p.pid, os.WUNTRACED)
os.kill(p.pid, signal.SIGTERM)
print("term waits", os.waitpid(p.pid, os.WNOHANG))
os.kill(p.pid, signal.SIGKILL)
pid, status = os.waitpid(p.pid, 0)
print("killed", os.WIFSIGNALED(status), os.WTERMSIG(status))
"#,
    );
    assert_eq!(
        printed,
        "stopped True True 19 0x137f\nreported once (0, 0)\nstat T\n['State:\\tT (stopped)']\n\
         continued True True 18\nnot again None\n[False]\ntstp True 20\n\
         waitpid continued True 0xffff\nterm waits (0, 0)\nkilled True 9\n"
    );
}

/// A stopped child is not scheduled: a child writing to a pipe in a loop writes nothing while
/// it is stopped (the pipe drained, a short wait sees no byte) and writes again once continued.
#[test]
fn a_stopped_child_writes_nothing_until_it_is_continued() {
    let printed = common::python_as_native(
        "job-control-pipe",
        r#"
import os, select, signal
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    while True:
        os.write(w, b"x" * 512)
os.close(w)
print("running", len(os.read(r, 512)) > 0)
os.kill(pid, signal.SIGSTOP)
print("stopped", os.WIFSTOPPED(os.waitpid(pid, os.WUNTRACED)[1]))
os.set_blocking(r, False)
try:
    while os.read(r, 1 << 16):
        pass
except BlockingIOError:
    pass
print("while stopped", select.select([r], [], [], 0.3)[0])
os.kill(pid, signal.SIGCONT)
print("after continue", select.select([r], [], [], 30)[0] == [r])
os.kill(pid, signal.SIGKILL)
print("killed", os.WTERMSIG(os.waitpid(pid, 0)[1]))
"#,
    );
    assert_eq!(
        printed,
        "running True\nstopped True\nwhile stopped []\nafter continue True\nkilled 9\n"
    );
}

/// The parent gets SIGCHLD when a child stops and when it continues, unless its SIGCHLD action
/// has SA_NOCLDSTOP (set here through libc's sigaction, which Python does not offer); its
/// siginfo tells which child and what happened (CLD_STOPPED, CLD_CONTINUED, CLD_KILLED).
#[test]
fn sa_nocldstop_keeps_sigchld_for_stops_and_continues_away() {
    let printed = common::python_as_native(
        "job-control-nocldstop",
        r#"
import ctypes, os, signal, subprocess
libc = ctypes.CDLL(None, use_errno=True)
class Sigaction(ctypes.Structure):
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
def sigchld(wait):
    info = signal.sigtimedwait([signal.SIGCHLD], wait)
    return info and (info.si_pid == p.pid, info.si_code, info.si_status)
for nocldstop in (False, True):
    act = Sigaction()
    act.flags = 1 if nocldstop else 0
    assert libc.sigaction(signal.SIGCHLD, ctypes.byref(act), None) == 0
    p = subprocess.Popen(["sleep", "100"])
    os.kill(p.pid, signal.SIGSTOP)
    os.waitpid(p.pid, os.WUNTRACED)
    # None comes with SA_NOCLDSTOP: a short look is enough to see that.
    wait = 0.3 if nocldstop else 30
    on_stop = sigchld(wait)
    os.kill(p.pid, signal.SIGCONT)
    on_continue = sigchld(wait)
    p.kill()
    p.wait()
    on_exit = sigchld(30)
    print("SA_NOCLDSTOP" if nocldstop else "default", on_stop, on_continue, on_exit)
"#,
    );
    assert_eq!(
        printed,
        "default (True, 5, 19) (True, 6, 18) (True, 2, 9)\n\
         SA_NOCLDSTOP None None (True, 2, 9)\n"
    );
}

/// bash's job control in a script (`set -m`): `wait` returns when a job stops, `jobs` shows it
/// stopped by SIGSTOP or SIGTSTP and running again after `kill -CONT`.
#[test]
fn bash_job_control_stops_and_continues_jobs_as_natively() {
    let printed = same_as_native(
        r#"set -m
sleep 100 & kill -STOP $!; wait $!; echo "wait $?"
jobs -l > jobs.txt; sed "s/ *[0-9][0-9]* Stopped/ PID Stopped/" jobs.txt
kill -CONT %1; jobs
kill -TSTP %1; wait %1; echo "wait $?"; jobs
kill -CONT %1; kill %1; wait %1; echo "wait $?"; jobs; echo end"#,
    );
    assert_contains(
        &printed,
        &[
            "wait 147\n",
            "Stopped (signal)",
            "Running",
            "wait 148\n",
            "wait 143\nend\n",
        ],
    );
}

/// A tree in which every process is stopped, or waits for what only a stopped process could
/// do, can never go on: the run ends deadlocked at once, as a deadlock of threads does.
#[test]
fn a_tree_of_stopped_and_waiting_processes_ends_deadlocked() {
    for code in [
        "import os, signal\nprint('stopping', flush=True)\nos.kill(os.getpid(), signal.SIGSTOP)",
        "import os, signal, subprocess\np = subprocess.Popen(['sleep', '100'])\n\
         os.kill(p.pid, signal.SIGSTOP)\nprint('stopping', flush=True)\nos.waitpid(p.pid, 0)",
    ] {
        let outcome = python(code);
        assert!(
            matches!(outcome.status, RunStatus::Deadlocked { .. }),
            "{}",
            describe(&outcome)
        );
        assert_eq!(outcome.stdout, b"stopping\n");
    }
}
