//! Python threads in the VM (`process::threads`, `sched`): a program using the threading
//! features agents reach for gives the same output as the same program run natively by
//! /usr/bin/python3.11; a thread bomb meets the thread limit as a clean error; a program whose
//! threads all wait forever ends as deadlocked at once, not at its time limit; a thread
//! spinning in Python code cannot starve one woken by a timer; a timed poll times out on time
//! while another thread's polls keep returning; one preempted and picked again at once resumes
//! where it is, not where it was preempted; a template snapshotted with a second thread alive
//! gives every fork, and every reset VM, both threads.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::{assert_prints, describe, python, python_image, python_request, run, scaled};
use sandfork_vmm::agent::{AgentCommand, AgentRequest};
use sandfork_vmm::fs::Image;
use sandfork_vmm::snapshot::{self, ForkMemory, Template};
use sandfork_vmm::status::RunStatus;
use sandfork_vmm::vm::{self, RunLimits};

/// 16 threads over a bounded queue, a thread pool's map, a Timer, an Event wait that times
/// out, thread-local data and CPU-bound threads sharing the GIL; every line is deterministic.
const THREADING_PROGRAM: &str = r#"
import threading, queue, time, concurrent.futures as cf
q = queue.Queue(maxsize=8)
out = []
lock = threading.Lock()
def producer(p):
    for i in range(200):
        q.put((p, i))
def consumer():
    while (item := q.get()) is not None:
        with lock:
            out.append(item[0] * 1000 + item[1])
prods = [threading.Thread(target=producer, args=(p,)) for p in range(8)]
cons = [threading.Thread(target=consumer) for _ in range(8)]
for t in prods + cons: t.start()
for t in prods: t.join()
for _ in cons: q.put(None)
for t in cons: t.join()
print("queue", len(out), sum(out), sorted(out) == sorted(p * 1000 + i for p in range(8) for i in range(200)))
with cf.ThreadPoolExecutor(max_workers=4) as ex:
    print("pool", list(ex.map(lambda x: x * x, range(20))))
fired = threading.Event()
t0 = time.monotonic()
timer = threading.Timer(0.05, fired.set)
timer.start()
print("timer", fired.wait(5), time.monotonic() - t0 >= 0.05)
timer.join()
e = threading.Event()
t0 = time.monotonic()
print("event", e.wait(0.1), 0.1 <= time.monotonic() - t0 < 5)
local = threading.local()
local.v = "main"
seen = {}
def setlocal(n):
    local.v = n
    time.sleep(0.01)
    seen[n] = local.v
ts = [threading.Thread(target=setlocal, args=(n,)) for n in range(5)]
for t in ts: t.start()
for t in ts: t.join()
print("local", sorted(seen.items()), local.v)
sums = {}
def spin(n):
    sums[n] = sum(range(n))
ts = [threading.Thread(target=spin, args=(300000 + k,)) for k in range(3)]
for t in ts: t.start()
for t in ts: t.join()
print("gil", sorted(sums.values()), threading.active_count())
"#;

#[test]
fn a_threading_program_prints_what_it_prints_natively() {
    let native = Command::new("/usr/bin/python3.11")
        .args(["-c", THREADING_PROGRAM])
        .output()
        .expect("running /usr/bin/python3.11");
    assert!(
        native.status.success(),
        "natively: {}",
        String::from_utf8_lossy(&native.stderr)
    );
    let outcome = python(THREADING_PROGRAM);
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        String::from_utf8_lossy(&native.stdout),
        "{}",
        describe(&outcome)
    );
    let threads = outcome.stats.threads;
    assert!(threads.created >= 16 + 4 + 1 + 5 + 3, "{threads:?}");
    assert!(threads.peak >= 17 && threads.refused == 0, "{threads:?}");
    assert!(threads.switches > threads.created, "{threads:?}");
}

#[test]
fn a_thread_bomb_meets_the_thread_limit_as_a_clean_error() {
    let code = r#"
import threading, time
stop = threading.Event()
started = 0
try:
    while True:
        threading.Thread(target=stop.wait, daemon=True).start()
        started += 1
except RuntimeError as e:
    print(started, threading.active_count(), e)
stop.set()
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
        "63 64 can't start new thread\n"
    );
    assert_eq!(
        (outcome.stats.threads.peak, outcome.stats.threads.refused),
        (64, 1),
        "{:?}",
        outcome.stats.threads
    );

    // Uncaught, the same bomb is the program's error exit, with the limit configurable.
    let mut req = python_request("import threading, time\nwhile True: threading.Thread(target=time.sleep, args=(30,), daemon=True).start()");
    req.thread_limit = 8;
    let outcome = run(&python_image(), &req);
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 1 },
        "{}",
        describe(&outcome)
    );
    assert!(
        String::from_utf8_lossy(&outcome.stderr)
            .ends_with("RuntimeError: can't start new thread\n"),
        "{}",
        describe(&outcome)
    );
    assert_eq!(outcome.stats.threads.peak, 8);
}

#[test]
fn threads_that_all_wait_forever_end_as_deadlocked_at_once() {
    // Two threads take two locks in opposite orders; the main thread joins them.
    let code = r#"
import threading
a, b = threading.Lock(), threading.Lock()
both = threading.Barrier(2)
def one(first, second):
    with first:
        both.wait()
        with second:
            pass
ts = [threading.Thread(target=one, args=(a, b)), threading.Thread(target=one, args=(b, a))]
for t in ts: t.start()
print("started", flush=True)
for t in ts: t.join()
"#;
    let mut req = python_request(code);
    req.timeout = scaled(Duration::from_secs(30));
    let outcome = run(&python_image(), &req);
    assert_eq!(
        outcome.status,
        RunStatus::Deadlocked { threads: 3 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(outcome.stdout, b"started\n");
    assert!(
        outcome.stats.wall < scaled(Duration::from_secs(5)),
        "ended after {:?}, not at once",
        outcome.stats.wall
    );
    assert_eq!(outcome.status.kind(), "deadlocked");

    // One thread alone: a lock acquired twice.
    let outcome = python("import threading\nl = threading.Lock()\nl.acquire()\nl.acquire()");
    assert_eq!(
        outcome.status,
        RunStatus::Deadlocked { threads: 1 },
        "{}",
        describe(&outcome)
    );
    // A timed wait is not a deadlock: it times out.
    let outcome = python(
        "import threading\nl = threading.Lock()\nl.acquire()\nprint(l.acquire(timeout=0.05))",
    );
    assert_eq!(
        (outcome.status, outcome.stdout),
        (RunStatus::Exited { code: 0 }, b"False\n".to_vec())
    );
}

#[test]
fn a_spinning_thread_does_not_starve_a_sleeping_one() {
    // The spinner holds the GIL and never blocks: the main thread's sleep, then its timed
    // wait for the GIL, must each end on time (slice preemption), or the run times out.
    let code = r#"
import threading, time
spinning = True
def spin():
    n = 0
    while spinning:
        n += 1
t = threading.Thread(target=spin)
t.start()
t0 = time.monotonic()
time.sleep(0.05)
spinning = False
t.join()
print("stopped", 0.05 <= time.monotonic() - t0 < BOUND)
"#;
    let outcome = python(&code.replace(
        "BOUND",
        &scaled(Duration::from_secs(2)).as_secs().to_string(),
    ));
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "stopped True\n",
        "{}",
        describe(&outcome)
    );
    assert!(
        outcome.stats.threads.preemptions >= 1,
        "{:?}",
        outcome.stats.threads
    );
}

#[test]
fn a_timed_poll_times_out_while_another_thread_keeps_polling() {
    // The other thread's short selects end one after another, each a return that lets every
    // readiness waiter try again: the main thread's retried select and poll must keep their
    // first timer, or neither ever times out (test_ssl's test_handshake_timeout waited so).
    let code = r#"
import select, socket, threading, time
a, b = socket.socketpair()
stop = False
def tick():
    while not stop:
        select.select([b], [], [], 0.02)
t = threading.Thread(target=tick)
t.start()
t0 = time.monotonic()
r = select.select([a], [], [], 0.3)
t1 = time.monotonic()
p = select.poll()
p.register(a, select.POLLIN)
events = p.poll(300)
t2 = time.monotonic()
stop = True
t.join()
print(r, 0.3 <= t1 - t0 < BOUND, events, 0.3 <= t2 - t1 < BOUND)
"#;
    assert_prints(
        &code.replace(
            "BOUND",
            &scaled(Duration::from_secs(5)).as_secs().to_string(),
        ),
        "([], [], []) True [] True\n",
    );
}

#[test]
fn a_waiter_gets_what_a_thread_that_never_waits_sent_it() {
    // The sender sends one byte, then keeps making calls that never wait (a writable socket's
    // select) until the receiver reports the byte, for at most BOUND s. The receiver's read
    // waits with a timeout longer than that: it must be retried after the sender's progress
    // within its slices, not only when its own timer runs out (FTP over TLS waited so).
    let code = r#"
import select, socket, threading, time
a, b = socket.socketpair()
got = []
def receive():
    a.settimeout(3 * BOUND)
    got.append(a.recv(1))
t = threading.Thread(target=receive)
t.start()
time.sleep(0.05)
b.send(b"x")
t0 = time.monotonic()
while not got and time.monotonic() - t0 < BOUND:
    select.select([], [b], [], 0)
t.join()
print(got, "while the sender spun:", time.monotonic() - t0 < BOUND)
"#;
    assert_prints(
        &code.replace(
            "BOUND",
            &scaled(Duration::from_secs(10)).as_secs().to_string(),
        ),
        "[b'x'] while the sender spun: True\n",
    );
}

#[test]
fn a_thread_preempted_and_picked_again_resumes_where_it_is_later() {
    // The reader waits for readiness (a pipe read); each getpid makes progress, so at every
    // preemption of the spinning main thread the reader is due a retry and queues behind it:
    // main gets the vCPU straight back. Its next switch at a system call must save its state
    // then, not keep the one of the preemption (resumed, it would run from there again).
    let code = r#"
import os, threading
r, w = os.pipe()
got = []
reader = threading.Thread(target=lambda: got.append(os.read(r, 1)))
reader.start()
total = 0
for i in range(30):
    os.getpid()
    total += sum(range(i, 400_000 + i))
os.write(w, b"x")
reader.join()
print(total, got)
"#;
    let expected: u64 = (0..30u64).map(|i| (i..400_000 + i).sum::<u64>()).sum();
    let outcome = python(code);
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        format!("{expected} [b'x']\n"),
        "{}",
        describe(&outcome)
    );
    assert!(
        outcome.stats.threads.preemptions >= 1,
        "{:?}",
        outcome.stats.threads
    );
}

// ---- a template snapshotted with threads alive ----

/// An agent that starts a worker thread (waiting on a queue) before the real agent reaches its
/// ready point, so the template holds two threads: the agent's, inside AWAIT_REQUEST, and the
/// worker's, blocked in a futex wait. Requests hand it jobs through `builtins`.
const THREADED_AGENT: &str = r#"
import builtins, queue, runpy, threading
jobs, done = queue.Queue(), queue.Queue()
handled = []
def work():
    while True:
        job = jobs.get()
        handled.append(job)
        done.put((job(), len(handled)))
threading.Thread(target=work, name="template-worker", daemon=True).start()
builtins.template_worker = (jobs, done)
runpy.run_path("/opt/sandfork/agent.py", run_name="__main__")
"#;
const THREADED_AGENT_PATH: &str = "/opt/test/threaded_agent.py";
const THREADED_AGENT_COMMAND: AgentCommand = AgentCommand {
    cwd: sandfork_vmm::fs::WORK_DIR,
    program: "python3",
    argv: &["python3", "-I", "-B", THREADED_AGENT_PATH],
};

/// A thread preempted while a readiness waiter was due, and picked again at once, used to keep
/// its saved registers while it ran on; its next switch then resumed it from them, back in
/// time (crashes at random addresses, about every other run of this program).
#[test]
fn a_pipe_between_two_threads_moves_every_byte() {
    let code = r#"
import os, threading
for _ in range(3):
    r, w = os.pipe()
    got = []
    def read():
        while data := os.read(r, 1024):
            got.append(len(data))
    t = threading.Thread(target=read)
    t.start()
    with open(w, "wb") as f:
        f.write(b"x" * (1 << 22))
    t.join()
    os.close(r)
    print(sum(got))
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
        "4194304\n".repeat(3)
    );
}

/// The Python template's image plus the threaded agent.
fn threaded_agent_image() -> Arc<Image> {
    static IMAGE: OnceLock<Arc<Image>> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let dir = common::process_dir("threaded-agent");
            let agent = dir.join("threaded_agent.py");
            std::fs::write(&agent, THREADED_AGENT).unwrap();
            let templates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/python");
            let mut manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(templates.join("image.json")).unwrap()).unwrap();
            let paths = manifest["paths"].as_array_mut().unwrap();
            for path in paths.iter_mut() {
                if let Some(host) = path.get("host").and_then(|h| h.as_str()) {
                    path["host"] = templates.join(host).display().to_string().into();
                }
            }
            paths.push(serde_json::json!({"host": agent.display().to_string(), "guest": THREADED_AGENT_PATH}));
            common::build_image("threaded-agent-image", &manifest.to_string())
        })
        .clone()
}

const HAND_A_JOB: &str = r#"
import builtins, threading
jobs, done = builtins.template_worker
jobs.put(lambda: sum(range(10)))
print(done.get(timeout=5), sorted(t.name for t in threading.enumerate()))
"#;

#[test]
fn a_template_with_threads_alive_forks_and_resets_them_all() {
    let image = threaded_agent_image();
    let dir = common::process_dir("threaded-template").join("t");
    let limits = RunLimits {
        timeout: scaled(Duration::from_secs(20)),
        ..common::boot_limits(vm::DEFAULT_MEM_BYTES)
    };
    snapshot::build(
        image.clone(),
        "threaded",
        &THREADED_AGENT_COMMAND,
        &limits,
        &common::test_cpu,
        &dir,
    )
    .unwrap_or_else(|e| panic!("building the template: {e}"));
    let template = Template::load(&dir, image, &THREADED_AGENT_COMMAND)
        .unwrap_or_else(|e| panic!("loading the template: {e}"));
    let expected = "(45, 1) ['MainThread', 'template-worker']\n";

    // Fresh forks: each gets both threads as the template left them.
    for _ in 0..2 {
        let restored = snapshot::serve_restored(
            &template,
            common::fork_memory(),
            &common::restore_cpu,
            AgentRequest::new(HAND_A_JOB),
            &limits,
        )
        .unwrap();
        assert_eq!(
            restored.outcome.status,
            RunStatus::Exited { code: 0 },
            "{}",
            describe(&restored.outcome)
        );
        assert_eq!(String::from_utf8_lossy(&restored.outcome.stdout), expected);
        assert!(
            restored.outcome.stats.threads.switches >= 2,
            "{:?}",
            restored.outcome.stats.threads
        );
    }

    // One VM reset after each request, as the pool does: the worker thread's registers and
    // wait come back with the memory (it handled one job each time, not one more each time).
    if common::fork_memory() != ForkMemory::CopyOnWrite {
        return;
    }
    let mem = template.new_memory(ForkMemory::CopyOnWrite).unwrap();
    let mut cpu = common::restore_cpu(&mem, template.cpu()).unwrap();
    for round in 0..3 {
        let (outcome, back) = snapshot::serve_fork(
            &template,
            &mem,
            cpu,
            Instant::now(),
            AgentRequest::new(HAND_A_JOB),
            &limits,
        )
        .unwrap();
        assert_eq!(
            outcome.status,
            RunStatus::Exited { code: 0 },
            "round {round}: {}",
            describe(&outcome)
        );
        assert_eq!(
            String::from_utf8_lossy(&outcome.stdout),
            expected,
            "round {round}"
        );
        cpu = back;
        let copied = mem.copied_ranges().unwrap().expect("a copy-on-write fork");
        snapshot::reset(&template, &mem, cpu.as_mut(), &copied).unwrap();
    }
}

// ---- CPython's own tests: the two fast suites (the rest: tests/cpython_suites.rs) ----

#[test]
fn cpython_test_thread_passes_as_natively() {
    common::cpython::run_suite("test_thread", Duration::from_secs(300));
}

#[test]
fn cpython_test_threading_local_passes_as_natively() {
    common::cpython::run_suite("test_threading_local", Duration::from_secs(300));
}
