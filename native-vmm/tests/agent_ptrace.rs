//! The Python template's in-VM agent (templates/python/agent.py) and the VMM's side of the
//! hand-off (AWAIT_REQUEST, `vm::boot_agent` / `ReadyGuest::serve` / `vm::launch_agent`), end
//! to end with Debian's python3.11 in the template's real file image.
//!
//! These tests run on the test CPU (`common::test_cpu`: KVM in the KVM tier). Timings printed
//! here (`cargo test --release --test agent_ptrace -- --nocapture`) are figures of the path the
//! test ran on (product figures only on a native /dev/kvm): they show how the cost splits
//! between booting to the ready point (what a template snapshot saves) and serving a request.

mod common;

use std::cell::Cell;
use std::io;
use std::time::{Duration, Instant};

use common::{describe, python_image, scaled, test_cpu};
use sandfork_vmm::agent::{
    AgentCommand, AgentRequest, AWAIT_REQUEST_SYSCALL, MAX_FILES_BYTES, PYTHON_AGENT,
};
use sandfork_vmm::cpu::GuestCpu;
use sandfork_vmm::loader::LoadedProgram;
use sandfork_vmm::memory::GuestMemory;
use sandfork_vmm::status::RunStatus;
use sandfork_vmm::vm::{self, LaunchError, RunLimits, RunOutcome};

const SYS_GETRANDOM: u64 = 318;
/// The agent's first AWAIT_REQUEST buffer (FIRST_BUFFER_BYTES in agent.py).
const AGENT_FIRST_BUFFER: u64 = 64 * 1024;

fn limits() -> RunLimits {
    RunLimits {
        timeout: scaled(Duration::from_secs(10)),
        boot_timeout: scaled(vm::AGENT_BOOT_TIMEOUT),
        ..RunLimits::default()
    }
}

fn execute(request: AgentRequest) -> RunOutcome {
    vm::launch_agent(python_image(), &PYTHON_AGENT, request, &limits(), &test_cpu)
        .unwrap_or_else(|e| panic!("launching the agent: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `code` and expects exit code `code` with exactly `stdout` and `stderr`.
fn assert_run(code: &str, exit: i32, stdout: &str, stderr: &str) {
    let outcome = execute(AgentRequest::new(code));
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: exit },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        (
            text(&outcome.stdout).as_str(),
            text(&outcome.stderr).as_str()
        ),
        (stdout, stderr),
        "{}",
        describe(&outcome)
    );
}

/// How often the guest made system call `nr` in the run (after the hand-off).
fn calls_of(outcome: &RunOutcome, nr: Option<u64>) -> u64 {
    outcome
        .stats
        .calls
        .iter()
        .filter(|c| c.nr == nr)
        .map(|c| c.count)
        .sum()
}

#[test]
fn prints_six_times_seven() {
    assert_run("print(6*7)", 0, "42\n", "");
}

#[test]
fn stdout_and_stderr_are_captured_separately() {
    let code = "import sys\nprint('out 1')\nprint('err 1', file=sys.stderr)\nsys.stdout.write('out 2\\n')\nsys.stderr.write('err 2\\n')\n";
    assert_run(code, 0, "out 1\nout 2\n", "err 1\nerr 2\n");
}

#[test]
fn an_uncaught_exception_is_a_standard_traceback_and_exit_code_1() {
    let code = "print('before')\ndef divide(n):\n    return n / 0\n\ndivide(1)\n";
    let outcome = execute(AgentRequest::new(code));
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 1 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        text(&outcome.stdout),
        "before\n",
        "output before the exception is flushed"
    );
    let expected = concat!(
        "Traceback (most recent call last):\n",
        "  File \"/work/main.py\", line 5, in <module>\n",
        "    divide(1)\n",
        "  File \"/work/main.py\", line 3, in divide\n",
        "    return n / 0\n",
        "           ~~^~~\n",
        "ZeroDivisionError: division by zero\n",
    );
    assert_eq!(
        text(&outcome.stderr),
        expected,
        "no agent frames, the user's lines shown"
    );
}

#[test]
fn a_syntax_error_is_reported_like_cpython_does_for_a_script() {
    assert_run("print(", 1, "", "  File \"/work/main.py\", line 1\n    print(\n         ^\nSyntaxError: '(' was never closed\n");
}

#[test]
fn system_exit_codes_follow_cpython() {
    assert_run("import sys\nprint('x')\nsys.exit(3)", 3, "x\n", "");
    assert_run("import sys\nsys.exit('msg')", 1, "", "msg\n");
    assert_run("import sys\nsys.exit()", 0, "", "");
    assert_run("raise SystemExit(None)", 0, "", "");
    assert_run("import sys\nsys.exit(256 + 4)", 4, "", "");
}

#[test]
fn the_code_runs_as_main_with_a_custom_excepthook_and_atexit_honoured() {
    let code = r#"
import atexit, pickle, sys
class Point:
    pass
atexit.register(print, "at exit")
print(__name__, __file__, type(pickle.loads(pickle.dumps(Point()))).__module__)
sys.excepthook = lambda kind, value, tb: print("hook:", kind.__name__, value, file=sys.stderr)
raise KeyError("k")
"#;
    assert_run(
        code,
        1,
        "__main__ /work/main.py __main__\nat exit\n",
        "hook: KeyError 'k'\n",
    );
}

#[test]
fn argv_env_files_and_stdin_reach_the_code() {
    let mut request = AgentRequest::new(
        r#"
import os, sys
print(sys.argv)
print(os.environ["GREETING"], os.environ["EMPTY"] == "", os.environ["LANG"])
print(os.getcwd(), __file__)
print(open("data/input.csv").read().splitlines())
import helper
print(helper.VALUE, sys.path[0], sorted(os.listdir("tools")))
print(sys.stdin.read().upper())
"#,
    );
    request.argv = vec!["tools/run.py".into(), "--flag".into(), "two words".into()];
    request.env = vec![
        ("GREETING".into(), "hello".into()),
        ("EMPTY".into(), String::new()),
    ];
    request.files = vec![
        ("data/input.csv".into(), b"a,b\n1,2\n".to_vec()),
        ("tools/helper.py".into(), b"VALUE = 42\n".to_vec()),
    ];
    request.stdin = b"from stdin".to_vec();
    let outcome = execute(request);
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    // The import from /work wrote no __pycache__ there (the agent runs with -B).
    let expected = concat!(
        "['tools/run.py', '--flag', 'two words']\n",
        "hello True C.UTF-8\n",
        "/work /work/tools/run.py\n",
        "['a,b', '1,2']\n",
        "42 /work/tools ['helper.py', 'run.py']\n",
        "FROM STDIN\n",
    );
    assert_eq!(text(&outcome.stdout), expected, "{}", describe(&outcome));
}

#[test]
fn randomness_is_fresh_after_the_hand_off() {
    let code = "import os, random\nprint(random.random(), os.urandom(16).hex())";
    let first = execute(AgentRequest::new(code));
    let second = execute(AgentRequest::new(code));
    for outcome in [&first, &second] {
        assert_eq!(
            outcome.status,
            RunStatus::Exited { code: 0 },
            "{}",
            describe(outcome)
        );
        // The template's memory is shared by all forks: the agent reseeds `random` from the
        // fresh seed in each request's message (no system call), and os.urandom asks the host.
        assert!(
            calls_of(outcome, Some(SYS_GETRANDOM)) >= 1,
            "getrandom after the hand-off: {:?}",
            outcome.stats.calls
        );
    }
    let values = |o: &RunOutcome| {
        text(&o.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let (a, b) = (values(&first), values(&second));
    assert_eq!((a.len(), b.len()), (2, 2), "{a:?} {b:?}");
    assert_ne!(a[0], b[0], "random.random() repeated across runs");
    assert_ne!(a[1], b[1], "os.urandom repeated across runs");
}

#[test]
fn a_request_larger_than_the_first_buffer_is_fetched_again_with_the_size_needed() {
    let literal = "a".repeat(AGENT_FIRST_BUFFER as usize * 2);
    let outcome = execute(AgentRequest::new(&format!(
        "s = '{literal}'\nprint(len(s))"
    )));
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(text(&outcome.stdout), format!("{}\n", literal.len()));
    // The hand-off answered E2BIG with the size, the agent asked once more.
    assert_eq!(
        calls_of(&outcome, None),
        2,
        "AWAIT_REQUEST calls: {:?}",
        outcome.stats.calls
    );
}

#[test]
fn the_timeout_starts_at_the_hand_off() {
    let request = AgentRequest::new("while True:\n    pass");
    let limits = RunLimits {
        timeout: Duration::from_millis(300),
        ..limits()
    };
    let outcome =
        vm::launch_agent(python_image(), &PYTHON_AGENT, request, &limits, &test_cpu).unwrap();
    assert_eq!(
        outcome.status,
        RunStatus::Timeout { limit_ms: 300 },
        "{}",
        describe(&outcome)
    );
    assert!(
        outcome.stats.wall >= Duration::from_millis(300)
            && outcome.stats.wall < scaled(Duration::from_secs(5)),
        "{:?}",
        outcome.stats.wall
    );
}

#[test]
fn without_a_request_the_boot_stops_at_the_ready_point() {
    let ready = vm::boot_agent(
        python_image(),
        &PYTHON_AGENT,
        &limits(),
        &test_cpu,
        |ready| {
            // The template build's view: the guest is stopped inside AWAIT_REQUEST with its buffer.
            assert_eq!(
                ready.call[1], AGENT_FIRST_BUFFER,
                "call arguments: {:x?}",
                ready.call
            );
            assert!(
                ready.mem.check(ready.call[0], ready.call[1]).is_ok(),
                "the buffer is guest memory"
            );
            assert!(ready.process.stdout().is_empty() && ready.process.stderr().is_empty());
            let boot = ready.boot.clone();
            // The same stopped guest then serves a request, as a fork of it will.
            (
                boot,
                ready.serve(
                    AgentRequest::new("print('served')"),
                    scaled(Duration::from_secs(10)),
                ),
            )
        },
    );
    let (boot, served) = ready.unwrap_or_else(|e| panic!("booting the agent: {e}"));
    assert!(
        boot.syscalls > 100 && boot.unsupported.iter().all(|c| c.name == Some("rseq")),
        "{boot:?}"
    );
    let outcome = served.unwrap();
    assert_eq!(
        (outcome.status, text(&outcome.stdout)),
        (RunStatus::Exited { code: 0 }, "served\n".to_owned())
    );
    assert!(
        outcome.stats.syscalls < boot.syscalls,
        "the request's counters start at the hand-off"
    );
}

#[test]
fn a_program_that_never_awaits_a_request_is_not_a_template() {
    let exits_early = AgentCommand {
        cwd: sandfork_vmm::fs::WORK_DIR,
        program: "python3",
        argv: &["python3", "-c", "print('no agent here')"],
    };
    match vm::boot_agent(python_image(), &exits_early, &limits(), &test_cpu, |_| ()) {
        Err(LaunchError::AgentNotReady { reason }) => assert!(
            reason.starts_with("exited with code 0 before its ready point"),
            "{reason}"
        ),
        other => panic!("expected AgentNotReady, got {:?}", other.err()),
    }
    let noisy = AgentCommand {
        cwd: sandfork_vmm::fs::WORK_DIR,
        program: "python3",
        argv: &["python3", "-c", "import ctypes, sys; print('noise', file=sys.stderr); ctypes.CDLL(None).syscall(0x53460001, 0, 0)"],
    };
    match vm::boot_agent(python_image(), &noisy, &limits(), &test_cpu, |_| ()) {
        Err(LaunchError::AgentNotReady { reason }) => assert!(
            reason.contains("wrote 0 bytes to stdout and 6 to stderr")
                && reason.ends_with("noise\n"),
            "{reason}"
        ),
        other => panic!("expected AgentNotReady, got {:?}", other.err()),
    }
}

#[test]
fn awaiting_a_request_outside_an_agent_run_is_unsupported() {
    let code = format!("import ctypes\nctypes.CDLL(None).syscall({AWAIT_REQUEST_SYSCALL}, 0, 0)\nprint('not reached')");
    let outcome = execute(AgentRequest::new(&code));
    assert_eq!(
        outcome.status,
        RunStatus::Unsupported {
            syscall: AWAIT_REQUEST_SYSCALL,
            name: "sandfork_await_request"
        },
        "{}",
        describe(&outcome)
    );
    assert!(outcome.stdout.is_empty());
}

/// Gives a closure the higher-ranked signature of a `vm::CpuFactory`.
fn factory<F>(f: F) -> F
where
    F: for<'m> Fn(&'m GuestMemory, &LoadedProgram) -> io::Result<Box<dyn GuestCpu + 'm>>,
{
    f
}

#[test]
fn hostile_requests_are_refused_before_any_vm_starts() {
    let cpus_created = Cell::new(0);
    let counting_cpu = factory(|mem, program| {
        cpus_created.set(cpus_created.get() + 1);
        test_cpu(mem, program)
    });
    let with_file = |path: &str, len: usize| {
        let mut request = AgentRequest::new("print(open('x').read())");
        request.files.push((path.to_owned(), vec![b'x'; len]));
        request
    };
    let mut absolute_script = AgentRequest::new("");
    absolute_script.argv = vec!["/usr/lib/python3.11/os.py".into()];
    for (request, expected) in [
        (
            with_file("../etc/x", 1),
            "files[0].path \"../etc/x\": '..' components are not allowed",
        ),
        (
            with_file("/etc/passwd", 1),
            "files[0].path \"/etc/passwd\": absolute paths are not allowed",
        ),
        (
            with_file("huge.bin", MAX_FILES_BYTES),
            "files and code take",
        ),
        (
            absolute_script,
            "argv[0] \"/usr/lib/python3.11/os.py\": absolute paths",
        ),
    ] {
        match vm::launch_agent(
            python_image(),
            &PYTHON_AGENT,
            request,
            &limits(),
            &counting_cpu,
        ) {
            Err(LaunchError::InvalidRequest(e)) => assert!(
                e.to_string()
                    .starts_with(&format!("invalid request: {expected}")),
                "{e}"
            ),
            other => panic!(
                "expected an invalid request, got {:?}",
                other.map(|o| o.status)
            ),
        }
    }
    assert_eq!(
        cpus_created.get(),
        0,
        "no guest was created for a refused request"
    );
}

/// The split between boot and request on the test CPU's path, printed.
#[test]
fn timings_of_boot_and_request() {
    let image = python_image();
    let mut boots = Vec::new();
    let mut requests = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let outcome = vm::boot_agent(
            image.clone(),
            &PYTHON_AGENT,
            &limits(),
            &test_cpu,
            |ready| {
                let boot = (started.elapsed(), ready.boot.clone());
                let handed_off = Instant::now();
                let served = ready.serve(
                    AgentRequest::new("print(1+1)"),
                    scaled(Duration::from_secs(10)),
                );
                (boot, handed_off.elapsed(), served)
            },
        );
        let ((boot_total, boot), request_total, served) = outcome.unwrap();
        let served = served.unwrap();
        assert_eq!(text(&served.stdout), "2\n");
        boots.push((boot_total, boot.load, boot.syscalls, boot.peak_memory));
        requests.push((
            request_total,
            served.stats.wall,
            served.stats.syscalls,
            served.stats.exits,
        ));
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    eprintln!(
        "{} CPU, median of 5: boot to ready point {:?} (of which creating the guest {:?}; {} system calls; {} MiB of guest memory in use); print(1+1): hand-off to exit {:?}, with tearing the guest down {:?} ({} system calls, {} exits)",
        common::cpu_name(),
        median(boots.iter().map(|b| b.0).collect()),
        median(boots.iter().map(|b| b.1).collect()),
        boots[0].2,
        boots[0].3 >> 20,
        median(requests.iter().map(|r| r.1).collect()),
        median(requests.iter().map(|r| r.0).collect()),
        requests[0].2,
        requests[0].3,
    );
}

/// Setup (.ci/run) installs Debian's python3-numpy, so the image has it and the agent imports it
/// before its ready point; this fails (not skips) on a machine set up without it.
#[test]
fn numpy_is_preloaded_and_reseeded_per_run() {
    let code = "import sys\nprint('numpy' in sys.modules)\nimport numpy as np\nprint(int(np.arange(6).reshape(2, 3).sum()))\nprint(np.random.random())\n";
    let first = execute(AgentRequest::new(code));
    let second = execute(AgentRequest::new(code));
    assert_eq!(
        first.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&first)
    );
    let (a, b) = (text(&first.stdout), text(&second.stdout));
    let lines: Vec<&str> = a.lines().collect();
    assert_eq!(
        lines[..2],
        ["True", "15"],
        "is python3-numpy installed (apt-get install python3-numpy)? {}",
        describe(&first)
    );
    assert_ne!(
        a.lines().nth(2),
        b.lines().nth(2),
        "numpy's global generator must be reseeded per run"
    );
}

/// A script's result, as a notebook shows it: the last expression's value as text and its
/// Jupyter forms, what display() showed, in order; the files left under /work/out.
#[test]
fn a_script_returns_its_last_value_rich_results_and_output_files() {
    let code = r#"
import os
class Table:
    def __repr__(self): return "Table(2)"
    def _repr_html_(self): return "<table><tr><td>2</td></tr></table>"
    def _repr_json_(self): return {"rows": 2}
class Dot:
    def _repr_png_(self): return b"\x89PNG\r\n\x1a\n"
display(Dot(), "plain")
os.makedirs("/work/out/sub")
with open("/work/out/sub/r.csv", "w") as f:
    f.write("a,b\n")
print("printed")
Table()
"#;
    let outcome = execute(AgentRequest::new(code));
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(text(&outcome.stdout), "printed\n");
    let result = outcome.result.expect("the agent published a result");
    assert_eq!(result.value.as_deref(), Some("Table(2)"));
    let shown: Vec<(&str, &str)> = result
        .results
        .iter()
        .map(|r| (r.mime.as_str(), r.data.as_str()))
        .collect();
    assert_eq!(
        shown,
        [
            ("image/png", "iVBORw0KGgo="),
            ("text/plain", "'plain'"),
            ("text/html", "<table><tr><td>2</td></tr></table>"),
            ("application/json", r#"{"rows": 2}"#),
        ]
    );
    let files = outcome.files.expect("/work/out exists");
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].path, "sub/r.csv");
    assert_eq!(files[0].contents.as_deref(), Some(b"a,b\n".as_slice()));

    let plain = execute(AgentRequest::new("x = 1\n"));
    assert_eq!((plain.result, plain.files), (None, None), "nothing to show");
    let failed = execute(AgentRequest::new(
        "display('before')\nraise ValueError('x')\n",
    ));
    assert_eq!(failed.status, RunStatus::Exited { code: 1 });
    assert_eq!(
        failed.result.map(|r| r.results.len()),
        Some(1),
        "what was shown before the exception is kept"
    );
}

/// A matplotlib Figure made without pyplot (so in no figure list) as the last value: its chart
/// is the result. A stand-in `matplotlib.figure` module keeps the test to the agent's own code.
#[test]
fn a_figure_made_without_pyplot_is_a_chart_result() {
    let code = r#"
import sys, types
module = types.ModuleType("matplotlib.figure")
class Figure:
    def savefig(self, buffer, format, **options):
        buffer.write(b"chart as " + format.encode())
module.Figure = Figure
sys.modules["matplotlib.figure"] = module
Figure()
"#;
    let outcome = execute(AgentRequest::new(code));
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(text(&outcome.stderr), "");
    let result = outcome.result.expect("the agent published a result");
    let shown: Vec<(&str, &str)> = result
        .results
        .iter()
        .map(|r| (r.mime.as_str(), r.data.as_str()))
        .collect();
    assert_eq!(shown, [("image/png", "Y2hhcnQgYXMgcG5n")]);
}
