//! Stateful sessions through the real `sandfork-vmm serve --sessions` binary on the KVM vCPU:
//! interpreter state between cells, pause and resume (twice, then across a daemon restart)
//! keeping every file, and acknowledged checkpoints surviving SIGKILL of the daemon at random
//! moments; a session saved as a template, forked by executions and sessions with its state.
//! `SANDFORK_SESSION_CRASH_KILLS` sets the crash test's number of kills (default 20,
//! the KVM tier's; `npm run test:sessions-crash` runs a long one).

mod daemon_support;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use daemon_support::{scaled, scratch, snapshot_templates_dir, str_of, u64_of, wait_for, Client};
use serde_json::{json, Value};

/// `sandfork-vmm serve --sessions DIR/sessions` on DIR/s.sock, restartable.
struct Daemon {
    dir: PathBuf,
    /// Its `--sessions` folder (default DIR/sessions).
    sessions: PathBuf,
    /// Its `--templates` folder (default the shared one with the Python template).
    templates: PathBuf,
    child: Option<Child>,
    /// More `serve` options.
    args: Vec<&'static str>,
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        Daemon::start_with(dir, &[])
    }

    fn start_with(dir: &Path, args: &[&'static str]) -> Daemon {
        Daemon::start_on(dir, &dir.join("sessions"), args)
    }

    fn start_on(dir: &Path, sessions: &Path, args: &[&'static str]) -> Daemon {
        let mut daemon = Daemon {
            dir: dir.to_owned(),
            sessions: sessions.to_owned(),
            templates: snapshot_templates_dir().to_owned(),
            child: None,
            args: args.to_vec(),
        };
        daemon.restart();
        daemon
    }

    /// A daemon on scratch folder `name` with a templates folder of its own (holding the
    /// Python template), so that the templates it makes stay out of other tests', and a client
    /// with a new python session `session`; that folder too.
    fn with_own_templates(name: &str, session: &str) -> (PathBuf, Daemon, Session) {
        let dir = scratch(name);
        let templates = dir.join("templates");
        std::fs::create_dir_all(&templates).unwrap();
        std::os::unix::fs::symlink(
            snapshot_templates_dir().join("python"),
            templates.join("python"),
        )
        .unwrap();
        let mut daemon = Daemon {
            dir: dir.clone(),
            sessions: dir.join("sessions"),
            templates: templates.clone(),
            child: None,
            args: Vec::new(),
        };
        daemon.restart();
        let mut s = daemon.client();
        s.expect(
            "session",
            json!({"type": "session_create", "session": session, "template": "python"}),
        );
        (templates, daemon, s)
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("s.sock")
    }

    /// Starts the daemon (after a kill) and waits until it accepts connections.
    fn restart(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_sandfork-vmm"))
            .args(["serve", "--pool-size", "1", "--socket"])
            .arg(self.socket())
            .arg("--templates")
            .arg(&self.templates)
            .arg("--sessions")
            .arg(&self.sessions)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting sandfork-vmm serve");
        self.child = Some(child);
        let socket = self.socket();
        assert!(
            wait_for(scaled(Duration::from_secs(30)), || UnixStream::connect(
                &socket
            )
            .is_ok()),
            "the daemon did not start listening"
        );
    }

    /// SIGKILL, and waits for the process to be gone.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("the daemon runs").id()
    }

    fn client(&self) -> Session {
        Session {
            client: Client::hello(&self.socket()),
            next_id: 1,
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A protocol client for session requests.
struct Session {
    client: Client,
    next_id: u64,
}

impl Session {
    /// Sends `request` (an object without id) and returns the answer, whatever it is.
    fn call(&mut self, mut request: Value) -> Value {
        request["id"] = Value::from(self.next_id);
        self.next_id += 1;
        self.client.call(&request.to_string())
    }

    /// `call`, failing the test unless the answer has `type`.
    fn expect(&mut self, kind: &str, request: Value) -> Value {
        let answer = self.call(request.clone());
        assert_eq!(
            answer.get("type").and_then(Value::as_str),
            Some(kind),
            "{request} got {answer}"
        );
        answer
    }

    /// Pauses `session` (a checkpoint); returns the answer.
    fn pause(&mut self, session: &str) -> Value {
        self.expect(
            "checkpoint",
            json!({"type": "session_pause", "session": session}),
        )
    }

    /// Runs a cell that must succeed; returns its result's value (the last expression's repr).
    fn cell(&mut self, session: &str, code: &str) -> Option<String> {
        let answer = self.expect(
            "execution",
            json!({"type": "session_execute", "session": session, "code": code}),
        );
        assert_eq!(str_of(&answer, "status"), "ok", "{code}: {answer}");
        answer["result"]["value"].as_str().map(str::to_owned)
    }
}

/// A daemon on a scratch folder `name` with one new python session `session`, and a client.
fn daemon_with_session(name: &str, session: &str) -> (PathBuf, Daemon, Session) {
    let dir = scratch(name);
    let daemon = Daemon::start(&dir);
    let mut s = daemon.client();
    s.expect(
        "session",
        json!({"type": "session_create", "session": session, "template": "python"}),
    );
    (dir, daemon, s)
}

#[test]
fn interpreter_state_survives_between_cells() {
    let dir = scratch("sessions-state");
    let daemon = Daemon::start(&dir);
    let mut s = daemon.client();
    let created = s.expect(
        "session",
        json!({"type": "session_create", "session": "state", "template": "python"}),
    );
    assert_eq!(str_of(&created, "state"), "running", "{created}");

    assert_eq!(s.cell("state", "x = 41\nimport fractions\nhandle = open('/work/notes.txt', 'w')\nhandle.write('one ')\nx + 1"), Some("42".into()));
    // A variable, an import, a file in /work and an open file handle, one call later.
    let value = s.cell("state", "handle.write('two'); handle.flush()\n(x, fractions.Fraction(1, 3) * 3, open('/work/notes.txt').read())");
    assert_eq!(value, Some("(41, Fraction(1, 1), 'one two')".into()));
    // A statement has no value; a failing cell reports its exception and keeps the state.
    assert_eq!(s.cell("state", "y = x * 2"), None);
    let failed = s.expect(
        "execution",
        json!({"type": "session_execute", "session": "state", "code": "undefined_name"}),
    );
    assert_eq!(
        (
            str_of(&failed, "status"),
            failed["result"]["error"]["name"].as_str()
        ),
        ("error", Some("NameError")),
        "{failed}"
    );
    assert!(str_of(&failed, "stderr").contains("NameError"), "{failed}");
    assert_eq!(s.cell("state", "print('out'); y"), Some("82".into()));
    // A file put by the protocol is seen by the code, and the code's file read back.
    s.expect("session_file", json!({"type": "session_write_file", "session": "state", "path": "in/data.csv", "content": "a,b\n1,2\n"}));
    assert_eq!(
        s.cell("state", "open('/work/in/data.csv').read().splitlines()[1]"),
        Some("'1,2'".into())
    );
    let read = s.expect(
        "session_file",
        json!({"type": "session_read_file", "session": "state", "path": "notes.txt"}),
    );
    assert_eq!(
        str_of(&read, "content"),
        "b25lIHR3bw==",
        "base64 of 'one two': {read}"
    );
    let missing =
        s.call(json!({"type": "session_read_file", "session": "state", "path": "nope.txt"}));
    assert_eq!(str_of(&missing, "code"), "not_found", "{missing}");
    let escape = s.call(json!({"type": "session_write_file", "session": "state", "path": "../etc/passwd", "content": "x"}));
    assert_eq!(str_of(&escape, "code"), "bad_request", "{escape}");
    // A program that ends its process ends the session.
    let exited = s.expect(
        "execution",
        json!({"type": "session_execute", "session": "state", "code": "import os; os._exit(3)"}),
    );
    assert_eq!(
        (str_of(&exited, "status"), str_of(&exited, "session_state")),
        ("error", "ended"),
        "{exited}"
    );
    let after = s.call(json!({"type": "session_execute", "session": "state", "code": "x"}));
    assert_eq!(str_of(&after, "code"), "session_ended", "{after}");
    s.expect(
        "session",
        json!({"type": "session_delete", "session": "state"}),
    );
    assert_eq!(
        str_of(
            &s.call(json!({"type": "session_info", "session": "state"})),
            "code"
        ),
        "not_found"
    );
}

/// `serve --max-processes` is a cell's default and maximum process limit, and
/// `limits.processes` a lower one for one cell: the cell forks until refused, prints how
/// many children it made, then kills and waits for them (they would outlive the cell).
#[test]
fn each_cell_gets_its_own_process_limit_within_the_daemons() {
    let dir = scratch("sessions-processes");
    let daemon = Daemon::start_with(&dir, &["--max-processes", "4"]);
    let mut s = daemon.client();
    s.expect(
        "session",
        json!({"type": "session_create", "session": "forks", "template": "python"}),
    );
    let code = format!(
        "{}{}",
        include_str!("programs/fork_until_refused.py"),
        KILL_AND_WAIT_CHILDREN
    );
    for (limits, limit) in [
        (json!({"processes": 2}), 2),
        (json!({}), 4),
        (json!({"processes": 100}), 4),
    ] {
        let answer = s.expect(
            "execution",
            json!({"type": "session_execute", "session": "forks", "code": code, "limits": limits}),
        );
        assert_eq!(
            (str_of(&answer, "status"), str_of(&answer, "stdout")),
            ("ok", format!("{} EAGAIN\n", limit - 1).as_str()),
            "{limits}: {answer}"
        );
        assert_eq!(answer["limits"]["processes"], json!(limit), "{answer}");
        assert_eq!(
            u64_of(&answer["usage"], "processes_created"),
            limit - 1,
            "{answer}"
        );
    }
    let refused = s.call(json!({"type": "session_execute", "session": "forks", "code": "1", "limits": {"processes": 0}}));
    assert_eq!(str_of(&refused, "code"), "bad_request", "{refused}");
}

/// Python that kills every other process of the sandbox (`/proc` lists the tree's) and waits
/// for it.
const KILL_AND_WAIT_CHILDREN: &str = "
import signal
for other in [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:
    os.kill(other, signal.SIGKILL)
    os.waitpid(other, 0)
";

/// Processes a session starts over its life hold no host mapping once they end: two more
/// cells of 40 subprocesses each leave the daemon with the mappings it had after the first
/// (each process's memory is unmapped when it ends, not kept for the session's life).
#[test]
fn ended_processes_leave_no_mappings_behind_in_a_session() {
    let (_dir, daemon, mut s) = daemon_with_session("sessions-retired", "many");
    // 40 processes take seconds under a software CPU: up to the daemon's largest timeout.
    let timeout_ms = u64::try_from(scaled(Duration::from_secs(10)).as_millis())
        .unwrap_or(u64::MAX)
        .min(60_000);
    let mut cell = || {
        let answer = s.expect(
            "execution",
            json!({"type": "session_execute", "session": "many", "limits": {"timeout_ms": timeout_ms},
                   "code": "import subprocess\nfor _ in range(40):\n    subprocess.run(['true'])"}),
        );
        assert_eq!(str_of(&answer, "status"), "ok", "{answer}");
    };
    cell();
    let maps = || {
        std::fs::read_to_string(format!("/proc/{}/maps", daemon.pid()))
            .expect("the daemon's maps")
            .lines()
            .count()
    };
    let before = maps();
    cell();
    cell();
    // VMs are destroyed off the request path: a bounded wait for those of the last cell.
    assert!(
        wait_for(scaled(Duration::from_secs(30)), || maps() < before + 40),
        "{} mappings after 80 more processes, {before} before",
        maps()
    );
}

/// Outside sessions nothing outlives its execution: after a program that left a child
/// running, the next execution (on the pool's reset VM, or a fresh fork) has process 1 alone.
#[test]
fn a_pooled_executions_children_end_with_it() {
    let dir = scratch("sessions-pooled-children");
    let daemon = Daemon::start(&dir);
    let mut s = daemon.client();
    let code = "import os, subprocess\nsubprocess.Popen(['sleep', '100'])\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))";
    let first = s.expect(
        "execution",
        json!({"type": "execute", "template": "python", "code": code}),
    );
    assert!(
        str_of(&first, "stdout").starts_with("[1, "),
        "a child beside process 1: {first}"
    );
    let next = s.expect(
        "execution",
        json!({"type": "execute", "template": "python", "code": "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"}),
    );
    assert_eq!(str_of(&next, "stdout"), "[1]\n", "{next}");
}

/// A process a cell starts lives on between cells, as on Linux: the next cell sees it alive
/// and can kill and wait for it; a server child answers the next cell over the VM's loopback;
/// a child that ended in one cell is waited for in the next. A checkpoint cannot hold the
/// server's listening socket: a pause is refused naming the process and its fd.
#[test]
fn a_child_process_lives_on_between_cells() {
    let (_dir, _daemon, mut s) = daemon_with_session("sessions-children", "kids");
    s.cell(
        "kids",
        "import os, signal, socket, subprocess, sys\nsleeper = subprocess.Popen(['sleep', '100'])",
    );
    assert_eq!(
        s.cell(
            "kids",
            "(sleeper.poll(), os.path.exists(f'/proc/{sleeper.pid}'), open(f'/proc/{sleeper.pid}/cmdline').read())"
        ),
        Some("(None, True, 'sleep\\x00100\\x00')".into())
    );
    // The process limit counts it: with a limit of 2, the program and the sleeper, a third
    // process is refused.
    let limited = s.expect(
        "execution",
        json!({"type": "session_execute", "session": "kids", "limits": {"processes": 2},
               "code": "try:\n    subprocess.run(['true'])\n    r = 'ran'\nexcept BlockingIOError:\n    r = 'EAGAIN'\nr"}),
    );
    assert_eq!(limited["result"]["value"], json!("'EAGAIN'"), "{limited}");
    assert_eq!(
        s.cell(
            "kids",
            "sleeper.kill()\n(sleeper.wait(), os.path.exists(f'/proc/{sleeper.pid}'))"
        ),
        Some("(-9, False)".into())
    );

    // A TCP server child on the VM's loopback, started in one cell, answers the next.
    let server = "import socket, sys\n\
        listener = socket.socket()\n\
        listener.bind(('127.0.0.1', 0))\n\
        listener.listen()\n\
        print(listener.getsockname()[1], flush=True)\n\
        while True:\n    \
            conn, _ = listener.accept()\n    \
            conn.sendall(b'echo:' + conn.recv(100))\n    \
            conn.close()\n";
    s.cell(
        "kids",
        &format!("server = subprocess.Popen([sys.executable, '-c', {server:?}], stdout=subprocess.PIPE)\nport = int(server.stdout.readline())"),
    );
    assert_eq!(
        s.cell(
            "kids",
            "with socket.create_connection(('127.0.0.1', port)) as c:\n    c.sendall(b'hi')\n    reply = c.recv(100)\nreply"
        ),
        Some("b'echo:hi'".into())
    );
    let server_pid = s.cell("kids", "server.pid").unwrap();
    let refused = s.call(json!({"type": "session_pause", "session": "kids"}));
    assert_eq!(str_of(&refused, "code"), "bad_request", "{refused}");
    assert!(
        str_of(&refused, "message").contains(&format!(
            "process {server_pid} holds a socket bound, listening or connected by address"
        )),
        "{refused}"
    );
    // The refused pause left the session running, its server too.
    assert_eq!(
        s.cell(
            "kids",
            "with socket.create_connection(('127.0.0.1', port)) as c:\n    c.sendall(b'again')\n    reply = c.recv(100)\nreply"
        ),
        Some("b'echo:again'".into())
    );
    assert_eq!(
        s.cell("kids", "server.kill()\nserver.wait()"),
        Some("-9".into())
    );

    // A child that ended in one cell is a zombie until the next waits for it.
    s.cell(
        "kids",
        "r, w = os.pipe()\npid = os.fork()\nif pid == 0:\n    os._exit(7)\nos.close(w)\nassert os.read(r, 1) == b''",
    );
    assert_eq!(
        s.cell(
            "kids",
            "status = os.waitpid(pid, 0)\n(status[0] == pid, os.waitstatus_to_exitcode(status[1]))"
        ),
        Some("(True, 7)".into())
    );
    // Process 1's own socket bound by address is refused alike.
    s.cell(
        "kids",
        "bound = socket.socket()\nbound.bind(('127.0.0.1', 0))",
    );
    let refused = s.call(json!({"type": "session_pause", "session": "kids"}));
    assert_eq!(str_of(&refused, "code"), "bad_request", "{refused}");
    assert!(
        str_of(&refused, "message").contains("process 1 holds a socket"),
        "{refused}"
    );
    s.cell("kids", "bound.close()");
    // With every child waited for, the session pauses and resumes.
    s.pause("kids");
    assert_eq!(
        s.cell("kids", "(sleeper.returncode, server.returncode)"),
        Some("(-9, -9)".into())
    );
}

/// A session's checkpoint holds its whole process tree. Paused with a sleeper, a stopped
/// sleeper, a shell loop that appends a counter to a /work file, a `cat` that echoes a pipe
/// back, and a zombie, and resumed after a SIGKILL of the daemon: the sleeper is alive, the
/// stopped one still stopped until SIGCONT, the counter goes on from where it was, the pipes
/// talk both ways, the zombie is waited for with its status; a fork of the
/// checkpoint gets copies of them all. A copy of the checkpoint whose process table names pids
/// past its next id (its hash made right again) is refused as a damaged checkpoint, and the
/// session resumes from the good one.
#[test]
fn a_session_paused_with_live_children_resumes_them_after_a_daemon_sigkill() {
    let (dir, mut daemon, mut s) = daemon_with_session("sessions-tree", "tree");
    let lines = "def lines():\n    with open('/work/counter') as f:\n        return [int(n) for n in f.read().split()]";
    s.cell(
        "tree",
        &format!(
            "import os, signal, subprocess, time\n{lines}\n\
             sleeper = subprocess.Popen(['sleep', '100'])\n\
             stopped = subprocess.Popen(['sleep', '100'])\n\
             os.kill(stopped.pid, signal.SIGSTOP)\n\
             assert os.WIFSTOPPED(os.waitpid(stopped.pid, os.WUNTRACED)[1])\n\
             counter = subprocess.Popen(['sh', '-c', 'i=0; while :; do i=$((i+1)); echo $i >> /work/counter; sleep 0.05; done'], start_new_session=True)\n\
             echo = subprocess.Popen(['cat'], stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n\
             echo.stdin.write(b'before\\n'); echo.stdin.flush()\n\
             assert echo.stdout.readline() == b'before\\n'\n\
             r, w = os.pipe()\n\
             zombie = os.fork()\n\
             if zombie == 0:\n    os._exit(7)\n\
             os.close(w)\n\
             assert os.read(r, 1) == b''\n\
             for _ in range(400):\n    \
                 if os.path.exists('/work/counter') and len(lines()) >= 2:\n        break\n    \
                 time.sleep(0.05)"
        ),
    );
    let before: u64 = s.cell("tree", "len(lines())").unwrap().parse().unwrap();
    assert!(before >= 2, "the counter ran: {before} lines");
    let paused = s.pause("tree");
    daemon.kill();
    // A damaged copy as a newer checkpoint: its process table's next id made 2, below every
    // child's pid, and its content hash computed again, so only the decoding can refuse it.
    let sessions = dir.join("sessions/tree");
    let good = std::fs::read(sessions.join(format!("{:012}.sfck", u64_of(&paused, "checkpoint"))))
        .unwrap();
    let root: Vec<u8> = [1u64, 0, 1, 1]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .chain([0u8])
        .collect();
    let at = good
        .windows(root.len())
        .position(|w| w == root.as_slice())
        .expect("the process table's first entry");
    let mut damaged = good.clone();
    damaged[at - 32..at - 24].copy_from_slice(&2u64.to_le_bytes());
    let end = damaged.len() - 32;
    let hash = <sha2::Sha256 as sha2::Digest>::digest(&damaged[..end]);
    damaged[end..].copy_from_slice(&hash);
    std::fs::write(sessions.join(format!("{:012}.sfck", 999)), &damaged).unwrap();
    daemon.restart();
    let mut s = daemon.client();
    let refused = s.call(json!({"type": "session_fork", "session": "from-damaged", "from": "tree", "checkpoint": 999}));
    assert_eq!(str_of(&refused, "code"), "not_found", "{refused}");
    assert!(
        str_of(&refused, "message").contains("past the next id 2"),
        "{refused}"
    );
    // A fork of the good checkpoint gets every process too, copies of its own.
    s.expect(
        "session",
        json!({"type": "session_fork", "session": "tree-fork", "from": "tree", "checkpoint": u64_of(&paused, "checkpoint")}),
    );
    assert_eq!(
        s.cell(
            "tree-fork",
            "sleeper.kill()\n(sleeper.wait(), counter.poll(), echo.poll())"
        )
        .as_deref(),
        Some("(-9, None, None)")
    );
    s.call(json!({"type": "session_delete", "session": "tree-fork"}));
    // The session resumes from the good checkpoint, every process with it: the sleeper alive,
    // the pipes to `cat` both ways, the counter going on from where it was (no number lost or
    // repeated), the zombie's status; then every process is killed and waited for.
    let counted = format!(
        "{lines}\nstart = len(lines())\nfor _ in range(400):\n    \
         if len(lines()) >= start + 3:\n        break\n    time.sleep(0.05)\n\
         n = lines()\n(len(n) >= start + 3, n == list(range(1, len(n) + 1)), start >= {before})"
    );
    for (code, expected) in [
        (
            "(sleeper.poll(), os.path.exists(f'/proc/{sleeper.pid}'), counter.poll(), echo.poll())",
            "(None, True, None, None)",
        ),
        (
            "state = open(f'/proc/{stopped.pid}/stat').read().split()[2]\n\
             os.kill(stopped.pid, signal.SIGCONT)\n\
             (state, os.WIFCONTINUED(os.waitpid(stopped.pid, os.WCONTINUED)[1]))",
            "('T', True)",
        ),
        (
            "echo.stdin.write(b'after\\n'); echo.stdin.flush()\necho.stdout.readline()",
            "b'after\\n'",
        ),
        (counted.as_str(), "(True, True, True)"),
        (
            "status = os.waitpid(zombie, 0)\n(status[0] == zombie, os.waitstatus_to_exitcode(status[1]))",
            "(True, 7)",
        ),
        (
            "sleeper.kill()\nstopped.kill()\nos.killpg(counter.pid, signal.SIGKILL)\necho.stdin.close()\n\
             codes = (sleeper.wait(), stopped.wait(), counter.wait(), echo.wait())\n\
             while True:\n    try:\n        os.waitpid(-1, 0)\n    except ChildProcessError:\n        break\n\
             (codes, sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [os.getpid()])",
            "((-9, -9, -9, 0), True)",
        ),
    ] {
        assert_eq!(s.cell("tree", code).as_deref(), Some(expected), "{code}");
    }
    s.pause("tree");
    assert_eq!(s.cell("tree", "sleeper.returncode"), Some("-9".into()));
}

#[test]
fn pause_and_resume_twice_then_after_a_restart_keep_every_file() {
    let (_dir, mut daemon, mut s) = daemon_with_session("sessions-pause", "files");
    let files = "import os\nos.makedirs('/work/deep/er', exist_ok=True)\nfor i in range(20):\n    open(f'/work/deep/er/f{i}.txt', 'w').write(str(i) * (i + 1))\n";
    s.cell("files", files);
    s.expect("session_file", json!({"type": "session_write_file", "session": "files", "path": "put.bin", "content": "AAEC/w==", "encoding": "base64"}));
    let check = "import hashlib, os\nnames = sorted(os.listdir('/work/deep/er'))\nok = all(open(f'/work/deep/er/f{i}.txt').read() == str(i) * (i + 1) for i in range(20))\n(len(names), ok, open('/work/put.bin', 'rb').read())";
    let expected = Some("(20, True, b'\\x00\\x01\\x02\\xff')".to_owned());
    assert_eq!(s.cell("files", check), expected);
    for round in 0..2 {
        let paused = s.pause("files");
        assert_eq!(str_of(&paused, "state"), "paused", "{paused}");
        assert_eq!(
            str_of(
                &s.expect(
                    "session",
                    json!({"type": "session_info", "session": "files"})
                ),
                "state"
            ),
            "paused"
        );
        if round == 1 {
            let resumed = s.expect(
                "session",
                json!({"type": "session_resume", "session": "files"}),
            );
            assert_eq!(str_of(&resumed, "state"), "running", "{resumed}");
        }
        // Resumed by the cell itself in round 0.
        let answer = s.expect(
            "execution",
            json!({"type": "session_execute", "session": "files", "code": check}),
        );
        assert_eq!(
            answer["result"]["value"].as_str().map(str::to_owned),
            expected,
            "round {round}: {answer}"
        );
        assert_eq!(answer["resumed"], Value::Bool(round == 0), "{answer}");
        s.cell(
            "files",
            &format!("open('/work/round{round}.txt', 'w').write('r{round}')"),
        );
    }
    s.pause("files");
    daemon.kill();
    daemon.restart();
    let mut s = daemon.client();
    let found = s.expect(
        "session",
        json!({"type": "session_info", "session": "files"}),
    );
    assert_eq!(str_of(&found, "state"), "paused", "{found}");
    assert_eq!(s.cell("files", check), expected);
    assert_eq!(
        s.cell(
            "files",
            "open('/work/round0.txt').read() + open('/work/round1.txt').read()"
        ),
        Some("'r0r1'".into())
    );
    let read = s.expect(
        "session_file",
        json!({"type": "session_read_file", "session": "files", "path": "deep/er/f3.txt"}),
    );
    assert_eq!(str_of(&read, "content"), "MzMzMw==", "{read}");
}

/// Two daemons with sessions folders side by side (a cluster's nodes on shared storage): a
/// session paused on the first, whose daemon is then killed, is adopted by the second with
/// `--adopt-sessions` (its folder moved over) and resumes with its interpreter's state; a
/// session no folder holds stays unknown.
#[test]
fn a_stopped_daemons_paused_session_is_adopted_by_its_sibling() {
    let root = scratch("sessions-adopt");
    let shared = root.join("shared");
    std::fs::create_dir_all(root.join("a")).unwrap();
    std::fs::create_dir_all(root.join("b")).unwrap();
    let mut first = Daemon::start_on(&root.join("a"), &shared.join("a"), &[]);
    let mut s = first.client();
    s.expect(
        "session",
        json!({"type": "session_create", "session": "moved", "template": "python"}),
    );
    s.cell("moved", "x = 41");
    s.pause("moved");
    first.kill();

    let second = Daemon::start_on(&root.join("b"), &shared.join("b"), &["--adopt-sessions"]);
    let mut s = second.client();
    assert_eq!(s.cell("moved", "x + 1"), Some("42".to_owned()));
    assert!(shared.join("b/moved/session.json").is_file());
    assert!(!shared.join("a/moved").exists());
    let unknown = s.call(json!({"type": "session_info", "session": "nowhere"}));
    assert_eq!(str_of(&unknown, "code"), "not_found", "{unknown}");
}

/// Checkpoints in a loop while the daemon is SIGKILLed at random moments; after each restart
/// the client carries on from the session's newest checkpoint. At the end every checkpoint
/// the daemon acknowledged is forked, and must hold the content hash and the counter the
/// client recorded for it.
#[test]
fn acknowledged_checkpoints_survive_sigkill_of_the_daemon() {
    let kills: u32 = std::env::var("SANDFORK_SESSION_CRASH_KILLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20);
    let dir = scratch("sessions-crash");
    // Every checkpoint kept: each acknowledged one is forked at the end.
    let mut daemon = Daemon::start_with(&dir, &["--keep-checkpoints", "1048576"]);
    daemon.client().expect(
        "session",
        json!({"type": "session_create", "session": "crash", "template": "python"}),
    );
    let mut first = daemon.client();
    first.cell("crash", "n = 0\nblob = bytearray(256 << 10)");
    first.expect(
        "checkpoint",
        json!({"type": "session_checkpoint", "session": "crash"}),
    );
    // (checkpoint number, sha256, n) of every acknowledged checkpoint.
    let mut acknowledged: Vec<(u64, String, u64)> = Vec::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..kills {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        // Scaled: on the QEMU path a resume and one cell can take longer than the whole native window.
        let delay = scaled(Duration::from_millis(20 + seed % 200));
        let stop = Arc::new(AtomicBool::new(false));
        let socket = daemon.socket();
        let client_stop = stop.clone();
        // The client loop: bump n, dirty some memory, checkpoint; until its connection dies
        // (a read that fails is the kill, not a test failure).
        let client = thread::spawn(move || {
            let mut s = Session {
                client: Client::hello(&socket),
                next_id: 1,
            };
            let mut call = |mut request: Value| {
                request["id"] = Value::from(1);
                s.client.send(&request.to_string());
                sandfork_vmm::daemon::frame::read_frame(&mut s.client.stream).ok()
            };
            let mut acked = Vec::new();
            while !client_stop.load(Ordering::SeqCst) {
                let Some(bumped) = call(
                    json!({"type": "session_execute", "session": "crash", "code": "n += 1\nblob[n % len(blob)] = n % 256\nn"}),
                ) else {
                    break;
                };
                let Some(n) = bumped["result"]["value"]
                    .as_str()
                    .and_then(|v| v.parse::<u64>().ok())
                else {
                    break;
                };
                let Some(taken) = call(json!({"type": "session_checkpoint", "session": "crash"}))
                else {
                    break;
                };
                if taken.get("type").and_then(Value::as_str) != Some("checkpoint") {
                    break;
                }
                acked.push((
                    u64_of(&taken, "checkpoint"),
                    str_of(&taken, "sha256").to_owned(),
                    n,
                ));
            }
            acked
        });
        thread::sleep(delay);
        daemon.kill();
        stop.store(true, Ordering::SeqCst);
        acknowledged.extend(client.join().unwrap_or_default());
        daemon.restart();
    }
    assert!(
        !acknowledged.is_empty(),
        "no checkpoint was acknowledged in {kills} rounds"
    );
    let mut s = daemon.client();
    let info = s.expect(
        "session",
        json!({"type": "session_info", "session": "crash"}),
    );
    let on_disk: Vec<(u64, String)> = info["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (u64_of(c, "checkpoint"), str_of(c, "sha256").to_owned()))
        .collect();
    let mut recovered = 0;
    for (number, sha256, n) in &acknowledged {
        let listed = on_disk
            .iter()
            .any(|(k, hash)| k == number && hash == sha256);
        let fork = format!("fork-{number}");
        let forked = s.call(
            json!({"type": "session_fork", "session": fork, "from": "crash", "checkpoint": number}),
        );
        let restored = forked.get("type").and_then(Value::as_str) == Some("session")
            && s.cell(&fork, "n") == Some(n.to_string());
        if listed && restored {
            recovered += 1;
        }
        s.call(json!({"type": "session_delete", "session": fork}));
    }
    println!("session checkpoints: {recovered}/{} acknowledged recovered after {kills} SIGKILLs of the daemon", acknowledged.len());
    assert_eq!(
        recovered,
        acknowledged.len(),
        "acknowledged checkpoints lost"
    );
    // The session itself goes on from its newest checkpoint (at least the last acknowledged).
    let last = acknowledged.iter().map(|(_, _, n)| *n).max().unwrap();
    let now: u64 = s.cell("crash", "n").unwrap().parse().unwrap();
    assert!(
        now >= last,
        "the session resumed at n={now}, before the last acknowledged n={last}"
    );
    assert_eq!(s.cell("crash", "n += 1\nn"), Some((now + 1).to_string()));
}

/// A checkpoint file damaged after it was written (a torn write the disk acknowledged) is
/// detected by its content hash: the session resumes from the one before, and a fork from the
/// damaged one is refused.
#[test]
fn damaged_newest_checkpoints_are_detected_and_the_last_good_one_kept() {
    let (dir, mut daemon, mut s) = daemon_with_session("sessions-torn", "torn");
    s.cell("torn", "state = 'first'");
    let first = s.expect(
        "checkpoint",
        json!({"type": "session_checkpoint", "session": "torn"}),
    );
    s.cell("torn", "state = 'second'");
    let second = s.expect(
        "checkpoint",
        json!({"type": "session_checkpoint", "session": "torn"}),
    );
    s.cell("torn", "state = 'third'");
    let third = s.pause("torn");
    daemon.kill();
    let path = |taken: &Value| {
        dir.join("sessions/torn")
            .join(format!("{:012}.sfck", u64_of(taken, "checkpoint")))
    };
    // The newest torn short; the one before it whole but with a byte of its pages changed.
    let length = std::fs::metadata(path(&third)).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(path(&third))
        .unwrap()
        .set_len(length / 2)
        .unwrap();
    let mut flipped = std::fs::read(path(&second)).unwrap();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    std::fs::write(path(&second), &flipped).unwrap();
    daemon.restart();
    let mut s = daemon.client();
    for (taken, why) in [(&third, "truncated"), (&second, "content hash")] {
        let refused = s.call(json!({"type": "session_fork", "session": "from-torn", "from": "torn", "checkpoint": u64_of(taken, "checkpoint")}));
        assert_eq!(str_of(&refused, "code"), "not_found", "{refused}");
        assert!(str_of(&refused, "message").contains(why), "{refused}");
    }
    assert_eq!(
        s.cell("torn", "state"),
        Some("'first'".into()),
        "resumed from checkpoint {}",
        u64_of(&first, "checkpoint")
    );
}

/// Checkpoints after the first hold only the pages written since the one before, naming it;
/// forks from each restore its whole chain, from the files this daemon wrote and after a
/// restart (every file hashed). A changed byte in a parent makes every checkpoint after it
/// refused (the session resumes from the one before it), and format-2 and format-4 files are
/// refused as such.
/// A page written with the bytes it held is restored from the parent that holds it.
#[test]
fn incremental_checkpoints_restore_their_chain_and_a_damaged_parent_is_refused() {
    let (dir, mut daemon, mut s) = daemon_with_session("sessions-chain", "chain");
    let mut taken = Vec::new();
    for (step, code) in [
        // The first cell also keeps 512 KiB of random bytes that no later cell writes, so the
        // full checkpoint is clearly larger than what one cell's own writes add to later ones.
        "import os\nv = 'c1'\nblob = bytearray(512 << 10)\nkept = os.urandom(512 << 10)",
        "v = 'c2'\nblob[0] = 2",
        "v = 'c3'\nblob[300000] = 3",
        "v = 'c4'\nblob[0] = 2\nblob[300000] = 4",
    ]
    .iter()
    .enumerate()
    {
        s.cell("chain", code);
        let checkpoint = s.expect(
            "checkpoint",
            json!({"type": "session_checkpoint", "session": "chain"}),
        );
        let parent = if step == 0 {
            Value::Null
        } else {
            Value::from(u64_of(&taken[step - 1], "checkpoint"))
        };
        assert_eq!(checkpoint["parent"], parent, "{checkpoint}");
        taken.push(checkpoint);
    }
    let full = u64_of(&taken[0], "dirty_bytes");
    assert!(
        taken[1..].iter().all(|c| u64_of(c, "dirty_bytes") < full
            && u64_of(c, "file_bytes") < u64_of(&taken[0], "file_bytes")),
        "incremental ones are smaller: {taken:?}"
    );
    // c4 writes blob[0]'s page with the bytes it held: left out of checkpoint 4, read from 2.
    let expected = [
        "('c1', 0, 0)",
        "('c2', 2, 0)",
        "('c3', 2, 3)",
        "('c4', 2, 4)",
    ];
    let check_forks = |s: &mut Session, round: &str| {
        for (checkpoint, want) in taken.iter().zip(expected) {
            let fork = format!("{round}-{}", u64_of(checkpoint, "checkpoint"));
            s.expect("session", json!({"type": "session_fork", "session": fork, "from": "chain", "checkpoint": u64_of(checkpoint, "checkpoint")}));
            assert_eq!(
                s.cell(&fork, "(v, blob[0], blob[300000])"),
                Some(want.to_owned()),
                "{round}: fork of {checkpoint}"
            );
            s.expect(
                "session",
                json!({"type": "session_delete", "session": fork}),
            );
        }
    };
    check_forks(&mut s, "known");
    daemon.kill();
    daemon.restart();
    let mut s = daemon.client();
    check_forks(&mut s, "hashed");
    daemon.kill();
    let path = |checkpoint: &Value| {
        dir.join("sessions/chain")
            .join(format!("{:012}.sfck", u64_of(checkpoint, "checkpoint")))
    };
    let mut damaged = std::fs::read(path(&taken[1])).unwrap();
    // The first byte after the head (its length is the body's first word): a stored page's.
    let first_stored = u64::from_le_bytes(damaged[24..32].try_into().unwrap()) as usize;
    damaged[first_stored] ^= 0x01;
    std::fs::write(path(&taken[1]), &damaged).unwrap();
    daemon.restart();
    let mut s = daemon.client();
    let refused = s.call(json!({"type": "session_fork", "session": "from-damaged", "from": "chain", "checkpoint": u64_of(&taken[2], "checkpoint")}));
    assert_eq!(str_of(&refused, "code"), "not_found", "{refused}");
    assert!(
        str_of(&refused, "message").contains("content hash of its parent"),
        "{refused}"
    );
    assert_eq!(
        s.cell("chain", "(v, blob[0], blob[300000])"),
        Some(expected[0].to_owned()),
        "resumed from the checkpoint before the damaged one"
    );
    daemon.kill();
    for (checkpoint, version) in [(&taken[0], 2u32), (&taken[3], 4)] {
        let mut old = std::fs::read(path(checkpoint)).unwrap();
        old[8..12].copy_from_slice(&version.to_le_bytes());
        std::fs::write(path(checkpoint), &old).unwrap();
    }
    daemon.restart();
    let mut s = daemon.client();
    for (checkpoint, version) in [(&taken[0], 2u32), (&taken[3], 4)] {
        let refused = s.call(json!({"type": "session_fork", "session": "from-old", "from": "chain", "checkpoint": u64_of(checkpoint, "checkpoint")}));
        assert!(
            str_of(&refused, "message").contains(&format!(
                "checkpoint format {version}; this daemon reads formats 5 to 8"
            )),
            "{refused}"
        );
    }
}

/// A cell that sets its GS base to a kernel-half address (wrgsbase allows any canonical one)
/// leaves a session that pauses, resumes, runs its next cell and forks with that base, as the
/// program left it: what a live program can hold, a checkpoint holds and restores.
#[test]
fn a_kernel_half_gs_base_survives_pause_resume_and_fork() {
    let (_dir, _daemon, mut s) = daemon_with_session("sessions-gs-base", "gs");
    // wrgsbase rdi; rdgsbase rax; ret  /  rdgsbase rax; ret
    let setup = "import ctypes, mmap\n\
        page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n\
        page.write(bytes.fromhex('f3480faedff3480faec8c3f3480faec8c3'))\n\
        at = ctypes.addressof(ctypes.c_char.from_buffer(page))\n\
        set_gs = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64)(at)\n\
        read_gs = ctypes.CFUNCTYPE(ctypes.c_uint64)(at + 11)\n\
        hex(set_gs(0xffff888000000000))";
    let base = Some("'0xffff888000000000'".to_owned());
    assert_eq!(s.cell("gs", setup), base);
    let paused = s.pause("gs");
    assert_eq!(str_of(&paused, "state"), "paused", "{paused}");
    let number = u64_of(&paused, "checkpoint");
    assert_eq!(s.cell("gs", "hex(read_gs())"), base, "resumed by the cell");
    s.expect(
        "session",
        json!({"type": "session_fork", "session": "gs-fork", "from": "gs", "checkpoint": number}),
    );
    assert_eq!(s.cell("gs-fork", "hex(read_gs())"), base, "in the fork");
}

/// The bytes of a session's checkpoint files, as they are on disk.
fn stored_checkpoint_bytes(dir: &Path, session: &str) -> u64 {
    std::fs::read_dir(dir.join("sessions").join(session))
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".sfck"))
        .map(|entry| entry.metadata().unwrap().len())
        .sum()
}

/// A session resumed from a checkpoint and paused again unchanged writes a checkpoint of
/// (nearly) no pages, building on the one it resumed from; five pause and resume cycles of a
/// 50 MiB session store little more than one full checkpoint. The 50 MiB and a variable come
/// back whole from the chain, also after a daemon restart.
#[test]
fn a_pause_after_a_resume_holds_only_what_changed_since() {
    let (dir, mut daemon, mut s) = daemon_with_session("sessions-repause", "big");
    let fill = "import random, hashlib\n\
        b = bytearray(50 << 20)\n\
        for i in range(50):\n    b[i << 20:(i + 1) << 20] = random.randbytes(1 << 20)\n\
        v = 'kept'\n\
        digest = hashlib.sha256(b).hexdigest()\n\
        len(b)";
    assert_eq!(s.cell("big", fill), Some((50u64 << 20).to_string()));
    let mut pauses = Vec::new();
    for cycle in 0..5 {
        if cycle > 0 {
            let resumed = s.expect(
                "session",
                json!({"type": "session_resume", "session": "big"}),
            );
            assert_eq!(str_of(&resumed, "state"), "running", "{resumed}");
        }
        let paused = s.pause("big");
        assert_eq!(str_of(&paused, "state"), "paused", "{paused}");
        pauses.push(paused);
    }
    eprintln!(
        "five pause and resume cycles of a 50 MiB session: {} checkpoint bytes stored ({:?})",
        stored_checkpoint_bytes(&dir, "big"),
        pauses
            .iter()
            .map(|p| u64_of(p, "file_bytes"))
            .collect::<Vec<_>>()
    );
    let full = u64_of(&pauses[0], "file_bytes");
    assert!(full > 50 << 20, "the first pause is full: {}", pauses[0]);
    for (before, paused) in pauses.iter().zip(&pauses[1..]) {
        assert_eq!(
            paused["parent"],
            Value::from(u64_of(before, "checkpoint")),
            "{paused}"
        );
        assert!(
            u64_of(paused, "file_bytes") * 20 < full,
            "an unchanged pause is < 5% of the full one ({full} bytes): {paused}"
        );
    }
    assert!(stored_checkpoint_bytes(&dir, "big") < full + full / 4);
    let check = "(v, len(b), hashlib.sha256(b).hexdigest() == digest)";
    let intact = Some(format!("('kept', {}, True)", 50u64 << 20));
    assert_eq!(s.cell("big", check), intact, "resumed by the cell");
    s.cell("big", "v = 'changed'");
    let paused = s.pause("big");
    assert!(u64_of(&paused, "file_bytes") * 20 < full, "{paused}");
    daemon.kill();
    daemon.restart();
    let mut s = daemon.client();
    let intact = Some(format!("('changed', {}, True)", 50u64 << 20));
    assert_eq!(s.cell("big", check), intact, "after a restart");
    let number = u64_of(&pauses[2], "checkpoint");
    s.expect(
        "session",
        json!({"type": "session_fork", "session": "big-fork", "from": "big", "checkpoint": number}),
    );
    let forked = Some(format!("('kept', {}, True)", 50u64 << 20));
    assert_eq!(s.cell("big-fork", check), forked, "a fork from the chain");
}

/// The numbers of a session's checkpoint files.
fn stored_checkpoints(dir: &Path, session: &str) -> std::collections::BTreeSet<u64> {
    std::fs::read_dir(dir.join("sessions").join(session))
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".sfck").and_then(|n| n.parse().ok())
        })
        .collect()
}

/// Of a session's checkpoints, the newest 4 (`serve --keep-checkpoints`' default) and every
/// one they build on are kept, the others deleted: after 8 checkpoints (each cell rewrites
/// 8 MiB, so the chain limit makes some of them full again) only that set's files are left,
/// each still restores, the deleted ones are `not_found`, and the bytes the daemon reports
/// are those of the files, also after a restart.
#[test]
fn old_checkpoints_are_pruned_and_the_newest_with_their_chains_kept() {
    let (dir, mut daemon, mut s) = daemon_with_session("sessions-prune", "prune");
    s.cell("prune", "import random\nb = bytearray(8 << 20)");
    let mut taken = Vec::new();
    for i in 1..=8 {
        s.cell(
            "prune",
            &format!("b[:] = random.randbytes(8 << 20)\nv = {i}"),
        );
        let kind = if i % 3 == 0 {
            "session_pause"
        } else {
            "session_checkpoint"
        };
        taken.push(s.expect("checkpoint", json!({"type": kind, "session": "prune"})));
    }
    let number = |c: &Value| u64_of(c, "checkpoint");
    let mut kept: std::collections::BTreeSet<u64> = taken[4..].iter().map(number).collect();
    loop {
        let parents: Vec<u64> = taken
            .iter()
            .filter(|c| kept.contains(&number(c)))
            .filter_map(|c| c["parent"].as_u64())
            .collect();
        let before = kept.len();
        kept.extend(parents);
        if kept.len() == before {
            break;
        }
    }
    assert!(kept.len() < taken.len(), "none was deleted: {taken:?}");
    assert_eq!(stored_checkpoints(&dir, "prune"), kept, "{taken:?}");
    let check = |s: &mut Session, round: &str| {
        let info = s.expect(
            "session",
            json!({"type": "session_info", "session": "prune"}),
        );
        assert_eq!(
            u64_of(&info, "checkpoint_bytes"),
            stored_checkpoint_bytes(&dir, "prune"),
            "{round}: {info}"
        );
        let listed: std::collections::BTreeSet<u64> = info["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(number)
            .collect();
        assert_eq!(listed, kept, "{round}: {info}");
        for (i, checkpoint) in taken.iter().enumerate() {
            let fork = format!("{round}-{}", number(checkpoint));
            let answer = s.call(json!({"type": "session_fork", "session": fork, "from": "prune", "checkpoint": number(checkpoint)}));
            if !kept.contains(&number(checkpoint)) {
                assert_eq!(str_of(&answer, "code"), "not_found", "{round}: {answer}");
                continue;
            }
            assert_eq!(str_of(&answer, "type"), "session", "{round}: {answer}");
            assert_eq!(
                s.cell(&fork, "(v, len(b))"),
                Some(format!("({}, {})", i + 1, 8u64 << 20)),
                "{round}: fork of {checkpoint}"
            );
            s.expect(
                "session",
                json!({"type": "session_delete", "session": fork}),
            );
        }
    };
    check(&mut s, "known");
    daemon.kill();
    daemon.restart();
    let mut s = daemon.client();
    check(&mut s, "hashed");
}

/// A session's state saved as a template (`session_template`): executions of it see the
/// session's variables, imports and /work files and leave nothing behind for the next; a new
/// session of it goes on from there; the session itself runs on; the template is served again
/// after a restart. Refused: a name taken, a session holding a bound socket, an ended session,
/// an unknown one.
#[test]
fn a_session_saved_as_a_template_forks_with_its_state() {
    let (templates, mut daemon, mut s) = Daemon::with_own_templates("sessions-template", "prep");
    s.cell("prep", "import fractions\nbase = 40\ndef answer():\n    return base + 2\nopen('/work/data.txt', 'w').write('kept')");
    let saved = s.expect(
        "session_template",
        json!({"type": "session_template", "session": "prep", "name": "prep@1"}),
    );
    assert!(u64_of(&saved, "file_bytes") > 1 << 20, "{saved}");
    assert!(templates.join("prep@1/template.sfsnap").is_file());

    let code = "print(answer(), open('/work/data.txt').read(), fractions.Fraction(base, 80))\nbase = 0\nopen('/work/data.txt', 'w').write('changed')";
    for round in 0..3 {
        let ran = s.call(json!({"type": "execute", "template": "prep@1", "code": code}));
        assert_eq!(
            (str_of(&ran, "status"), str_of(&ran, "stdout")),
            ("ok", "42 kept 1/2\n"),
            "round {round}: {ran}"
        );
    }
    // The session runs on as it was; a session of the template goes on from its state.
    assert_eq!(s.cell("prep", "base"), Some("40".into()));
    s.expect(
        "session",
        json!({"type": "session_create", "session": "child", "template": "prep@1"}),
    );
    assert_eq!(
        s.cell("child", "base = base + 1\nanswer()"),
        Some("43".into())
    );

    let taken = s.call(json!({"type": "session_template", "session": "prep", "name": "prep@1"}));
    assert_eq!(str_of(&taken, "code"), "bad_request", "{taken}");
    assert!(str_of(&taken, "message").contains("immutable"), "{taken}");
    s.cell("prep", "import socket\nsk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nsk.bind(('127.0.0.1', 0))");
    let bound = s.call(json!({"type": "session_template", "session": "prep", "name": "prep@2"}));
    assert_eq!(str_of(&bound, "code"), "bad_request", "{bound}");
    assert!(str_of(&bound, "message").contains("socket"), "{bound}");
    assert!(!templates.join("prep@2").exists());
    let unknown = s.call(json!({"type": "session_template", "session": "nobody", "name": "x@1"}));
    assert_eq!(str_of(&unknown, "code"), "not_found", "{unknown}");
    s.call(
        json!({"type": "session_execute", "session": "child", "code": "import os; os._exit(0)"}),
    );
    let ended = s.call(json!({"type": "session_template", "session": "child", "name": "x@1"}));
    assert_eq!(str_of(&ended, "code"), "session_ended", "{ended}");

    // A restarted daemon serves it from its folder.
    daemon.kill();
    daemon.restart();
    let mut s = daemon.client();
    let ran = s.call(json!({"type": "execute", "template": "prep@1", "code": "print(answer())"}));
    assert_eq!(str_of(&ran, "stdout"), "42\n", "{ran}");
}

/// Extended attributes live in the overlay: a paused session's checkpoints (full, then
/// incremental) keep them across a daemon restart, and a session saved as a template gives
/// them to its executions.
#[test]
fn extended_attributes_survive_checkpoints_a_restart_and_a_session_template() {
    let (_templates, mut daemon, mut s) = Daemon::with_own_templates("sessions-xattrs", "attrs");
    s.cell("attrs", "import os\nos.makedirs('/work/d')\nopen('/work/d/f', 'w').write('x')\nos.setxattr('/work/d/f', 'user.kept', b'value')\nos.setxattr('/work/d', 'user.dir', bytes(range(256)) * 4)");
    let check = "(sorted(os.listxattr('/work/d/f')), os.getxattr('/work/d/f', 'user.kept'), os.getxattr('/work/d', 'user.dir') == bytes(range(256)) * 4)";
    let kept = Some("(['user.kept'], b'value', True)".to_owned());
    assert_eq!(s.cell("attrs", check), kept);
    s.pause("attrs");
    daemon.kill();
    daemon.restart();
    let mut s = daemon.client();
    assert_eq!(s.cell("attrs", check), kept, "after the restart");
    s.cell(
        "attrs",
        "os.removexattr('/work/d/f', 'user.kept')\nos.setxattr('/work/d/f', 'user.new', b'2')",
    );
    s.pause("attrs");
    let changed = "(os.listxattr('/work/d/f'), os.getxattr('/work/d/f', 'user.new'), len(os.getxattr('/work/d', 'user.dir')))";
    assert_eq!(
        s.cell("attrs", changed),
        Some("(['user.new'], b'2', 1024)".to_owned()),
        "after the incremental checkpoint"
    );
    s.expect(
        "session_template",
        json!({"type": "session_template", "session": "attrs", "name": "attrs@1"}),
    );
    let ran = s.call(json!({"type": "execute", "template": "attrs@1", "code": "import os\nprint(os.listxattr('/work/d/f'), os.getxattr('/work/d/f', 'user.new'))"}));
    assert_eq!(
        (str_of(&ran, "status"), str_of(&ran, "stdout")),
        ("ok", "['user.new'] b'2'\n"),
        "{ran}"
    );
}
