//! `sandfork-vmm` command line: build a file image or a template snapshot, run one program in a
//! fresh KVM guest, benchmark guest launches and restores, and serve the daemon protocol.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use sandfork_vmm::daemon;
use sandfork_vmm::fs::Image;
use sandfork_vmm::image;
use sandfork_vmm::kvm::{self, Kvm};
use sandfork_vmm::process;
use sandfork_vmm::snapshot;
use sandfork_vmm::status::RunStatus;
use sandfork_vmm::vm::{self, RunRequest};
#[cfg(feature = "bench")]
use sandfork_vmm::{bench, net_bench, processes_bench, syscalls_bench, threads_bench};

const USAGE: &str = "\
usage: sandfork-vmm <command> [options]

commands:
  image build   build a read-only file image from a manifest
  template build  boot a template's agent to its ready point and snapshot it
  run           run one program in a fresh KVM guest
  bench run     latency of `/usr/bin/python3.11 -c pass` in a guest and natively
  bench fork    latency of VMs restored from a template's snapshot
  bench exec    cost of one execution on the daemon's path: fork, pooled run, CPU, memory
  bench density  10,000 idle VMs alive at once: memory per VM and the time to create them
  bench sessions  durable session checkpoints, pause and resume
  bench threads a Condition ping-pong between two Python threads, in a guest and natively
  bench processes  fork, exec, wait, pipelines and a process pool, in a guest and natively
  bench syscalls  a system call round trip and a vDSO clock_gettime, in a guest and natively
  bench net     TCP connect latency and 64 MiB throughput to a server in a network namespace,
                in a guest and natively (root)
  serve         the daemon: run code for clients on a Unix socket (PROTOCOL.md)

`sandfork-vmm <command> --help` describes each command.";

const IMAGE_BUILD_USAGE: &str = "\
usage: sandfork-vmm image build --manifest FILE --out DIR

Builds the file image described by the manifest (host paths plus their shared-library
dependencies) into DIR.

options:
  --manifest FILE   the template's image manifest (e.g. templates/python/image.json)
  --out DIR         output directory";

const TEMPLATE_BUILD_USAGE: &str = "\
usage: sandfork-vmm template build --image DIR --template NAME --out DIR [--mem-mib N] [--boot-timeout-ms N]

Boots the template's in-VM agent in a KVM guest over the image, runs it to its ready point and
writes the snapshot to DIR/template.sfsnap (guest memory, vCPU state, the VMM's process state,
the image's and the agent's hashes, under a SHA-256 content hash). Nothing is done when that
file already verifies and was built from the same image, agent and memory size.

options:
  --image DIR       file image built by `sandfork-vmm image build`
  --template NAME   the template's name (its image's name says which agent to boot:
                    python or node)
  --out DIR         output directory (the image's own folder lets `serve` find it there)
  --mem-mib N       guest memory of every VM of the template, in MiB (default 256 for
                    python, 1024 for node)
  --boot-timeout-ms N
                    wall-clock limit of the agent's boot to its ready point (default 30000)";

const RUN_USAGE: &str = "\
usage: sandfork-vmm run --image DIR [options] -- PROGRAM [ARGS...]

Runs PROGRAM (a path in the image, or a name looked up on PATH=/usr/bin:/bin) in a fresh KVM
guest. Standard input is read to its end and given to the program; its stdout and stderr are
printed. The exit code is the program's; when a limit stops the program, the reason is printed
to stderr and the exit code is 124 (timeout), 137 (memory), 141 (output), 128+signal (crash),
159 (unsupported system call) or 142 (deadlocked: every thread waits forever).

options:
  --image DIR         file image built by `sandfork-vmm image build`
  --mem-mib N         guest memory limit in MiB (default 256)
  --timeout-ms N      wall-clock limit in milliseconds (default 10000)
  --output-cap N      cap on stdout+stderr bytes (default 1048576)
  --max-threads N     live threads allowed at once; clone fails with EAGAIN beyond (default 64)
  --max-processes N   processes alive or unreaped at once, the program included; fork fails
                      with EAGAIN beyond (default 64, at most 1024)";

#[cfg(feature = "bench")]
const BENCH_USAGE: &str = "\
usage: sandfork-vmm bench run --image DIR [--iterations N] [--json]

Measures `/usr/bin/python3.11 -c pass` launched in a fresh KVM guest (memory, load, vCPU, run)
and the same binary spawned natively on the host: p50/p99 latency, system calls and VM exits
per run.

options:
  --image DIR        file image built by `sandfork-vmm image build`
  --iterations N     runs of each (default 50)
  --json             print one JSON object instead of a table";

#[cfg(feature = "bench")]
const BENCH_SYSCALLS_USAGE: &str = "\
usage: sandfork-vmm bench syscalls [--calls N] [--repetitions N] [--json]

A small static C program makes N getppid() system calls and N clock_gettime(CLOCK_MONOTONIC)
calls through glibc (the vDSO), in a fresh KVM guest and natively on the host in the same run,
and times each loop itself: nanoseconds per call (the median over the repetitions), and how
many of the guest's clock_gettime calls left the VM.

options:
  --calls N          calls of each per run (default 100000)
  --repetitions N    runs of each (default 5)
  --json             print one JSON object instead of a table";

#[cfg(feature = "bench")]
const BENCH_NET_USAGE: &str = "\
usage: sandfork-vmm bench net --image DIR [--connects N] [--mib N] [--repetitions N] [--json]

Makes a network namespace with a veth pair (10.X.Y.1/30 on the host, 10.X.Y.2/30 inside; needs
root) and runs this binary's bench server there. `/usr/bin/python3.11` then times N TCP
connects (p50), a download and an upload of N MiB, in a fresh KVM guest (under a policy naming
the server) and natively on the host, in the same run; each figure is the median of the
repetitions.

options:
  --image DIR        file image built by `sandfork-vmm image build` (the Python template's)
  --connects N       connects timed per run (default 200)
  --mib N            MiB downloaded and uploaded per run (default 64)
  --repetitions N    runs of each (default 3)
  --json             print one JSON object instead of a table
  --serve ADDR:PORT  be the bench server (what the bench runs in its namespace)";

#[cfg(feature = "bench")]
const BENCH_THREADS_USAGE: &str = "\
usage: sandfork-vmm bench threads --image DIR [--handoffs N] [--repetitions N] [--json]

Two threads of `/usr/bin/python3.11` hand a value back and forth through a threading.Condition,
timed inside the program (start-up not counted), in a fresh KVM guest and natively on the host
in the same run: microseconds per hand-off, and the guest's thread switches and system calls
per hand-off.

options:
  --image DIR        file image built by `sandfork-vmm image build`
  --handoffs N       hand-offs per run (default 10000)
  --repetitions N    runs of each (default 5)
  --json             print one JSON object instead of a table";

#[cfg(feature = "bench")]
const BENCH_PROCESSES_USAGE: &str = "\
usage: sandfork-vmm bench processes --image DIR [--repetitions N] [--json]

One `/usr/bin/python3.11` program times, inside itself, fork+execve+wait of /bin/true,
subprocess.run([\"/bin/true\"]), a fork of a process holding 100 MiB, a four-stage shell
pipeline over 1 MiB and multiprocessing.Pool(4).map of 1,000 tasks, in a fresh KVM guest
and natively on the host in the same run: the median of each, and their ratio.

options:
  --image DIR        file image built by `sandfork-vmm image build` (with /bin/sh and coreutils)
  --repetitions N    repetitions of each workload (default 20; the pool a tenth)
  --json             print one JSON object instead of a table";

#[cfg(feature = "bench")]
const BENCH_FORK_USAGE: &str = "\
usage: sandfork-vmm bench fork --template DIR [--iterations N]

Restores VMs from the snapshot in a template folder (its file image plus the template.sfsnap
written by `sandfork-vmm template build`) and serves each `pass`: p50/p99 of the copy-on-write
fork of its memory, of the KVM vCPU restore, of the whole fork (both, and the copy of the
VMM-side process state: the VM ready for a request), and of the hand-off to the agent's exit.

options:
  --template DIR     template folder (image and snapshot)
  --iterations N     VMs to create (default 50)";

const SERVE_USAGE: &str = "\
usage: sandfork-vmm serve --socket PATH --templates DIR [options]

Serves the daemon protocol (native-vmm/PROTOCOL.md) on a Unix socket until SIGTERM or SIGINT,
then lets running executions finish and removes the socket. A stale socket file at PATH is
replaced; a live one (another daemon) or a non-socket file is an error. Each request runs in
a new KVM guest of its template: a copy-on-write fork of the template's snapshot when its
folder holds one (`sandfork-vmm template build --out` that folder), created ahead of the
request by the template's warm pool, a freshly booted agent otherwise. A damaged or outdated snapshot stops the daemon from starting. Without a usable
/dev/kvm the daemon still starts: health reports why and execute answers the retryable
`unavailable` error.

options:
  --socket PATH           where to listen (created owner-only)
  --templates DIR         one folder per template, each a file image built by
                          `sandfork-vmm image build` (the folder name is the template's name)
                          and optionally its snapshot (template.sfsnap)
  --max-concurrency N     executions running at once (default: 2 per core)
  --max-queue N           executions waiting for a free slot, beyond that `busy` (default 64;
                          0: `busy` as soon as all slots run)
  --max-queue-per-template N
                          executions of one template waiting, beyond that `busy` (default:
                          4 per running slot)
  --max-queue-per-key N   executions of one request `key_id` waiting, beyond that `busy`
                          (default: 2 per running slot)
  --pool-size N           VMs kept ready per template with a snapshot, each created ahead of
                          its request on its own worker thread and reset to the
                          template after each request (retired after 1000)
                          (default: 2 per core; 0: each VM is restored for its request)
  --max-timeout-ms N      largest wall-clock limit a request gets (default 60000)
  --max-memory-mib N      largest guest memory limit a request gets (default 2048)
  --max-output-bytes N    largest stdout+stderr cap a request gets (default 1048576, at most
                          2097152 so that every response fits one frame)
  --max-processes N       processes of one execution alive or unreaped at once, its program
                          included (fork fails with EAGAIN beyond): what a request gets
                          without limits.processes, and the most it gets (default 64, at
                          most 1024)
  --boot-timeout-ms N     wall-clock limit of booting an agent for a request of a template
                          without a snapshot, before the request's own limit (default 30000)
  --sessions DIR          keep stateful sessions (PROTOCOL.md, Sessions) with their durable
                          checkpoints in DIR (created); sessions found there are resumable
  --max-sessions N        sessions holding a running VM at once (default 64)
  --keep-checkpoints N    checkpoints of a session kept: its newest N and those they build
                          on; older ones are deleted when a new one is taken (default 4)
  --adopt-sessions        a request for a session not in the --sessions folder moves it in
                          from a folder beside it (a cluster's nodes share their parent)
  --dns-server IP:PORT    the DNS server names a request's network policy allows are asked of
                          (default: the first nameserver of /etc/resolv.conf, port 53)
  --test-forbidden-syscall-after-ms N
                          for tests of the confinement: N ms after startup a thread makes a
                          system call the seccomp filter forbids, which kills the daemon

Once set up, the daemon confines itself: no_new_privs and a seccomp filter that allows only the
host system calls serving needs (native-vmm/src/seccomp.rs); any other kills it (SIGSYS).
Requests asking for more than a maximum run with the maximum; without limits they get 10000
ms, 256 MiB, 1048576 bytes (each clamped to the maximum) and --max-processes processes.";

/// Limits the CLI accepts (guest memory is allocated up front, so an absurd size is an error).
const MAX_MEM_MIB: u64 = 64 << 10;
/// The most threads `run --max-threads` allows (each needs a stack in guest memory anyway).
const MAX_THREADS: u64 = 4096;

enum CliError {
    /// Wrong arguments: the message, then the command's usage, exit code 2.
    Usage(String, &'static str),
    /// `--help`: the usage on stdout, exit code 0.
    Help(&'static str),
    /// The command failed: the message, exit code 1.
    Failed(String),
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match dispatch(&args) {
        Ok(code) => code,
        Err(CliError::Help(usage)) => {
            println!("{usage}");
            ExitCode::SUCCESS
        }
        Err(CliError::Usage(message, usage)) => {
            eprintln!("sandfork-vmm: {message}\n\n{usage}");
            ExitCode::from(2)
        }
        Err(CliError::Failed(message)) => {
            // Some errors (KVM's) already name the program.
            if message.starts_with("sandfork-vmm") {
                eprintln!("{message}");
            } else {
                eprintln!("sandfork-vmm: {message}");
            }
            ExitCode::FAILURE
        }
    }
}

fn dispatch(args: &[String]) -> Result<ExitCode, CliError> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        [] => Err(CliError::Usage("no command given".into(), USAGE)),
        ["--help" | "-h" | "help", ..] | ["image" | "bench" | "template", "--help" | "-h"] => {
            Err(CliError::Help(USAGE))
        }
        ["image", "build", ..] => image_build(&args[2..]),
        ["template", "build", ..] => template_build(&args[2..]),
        ["run", ..] => run(&args[1..]),
        #[cfg(feature = "bench")]
        ["bench", "run", ..] => bench_run(&args[2..]),
        #[cfg(feature = "bench")]
        ["bench", "fork", ..] => bench_fork(&args[2..]),
        #[cfg(feature = "bench")]
        ["bench", "exec", ..] => bench_exec(&args[2..]),
        #[cfg(feature = "bench")]
        ["bench", "density", ..] => bench_density(&args[2..]),
        #[cfg(feature = "bench")]
        ["bench", "sessions", ..] => bench_sessions(&args[2..]),
        #[cfg(feature = "bench")]
        ["bench", "threads", ..] => bench_threads(&args[2..]),
        #[cfg(feature = "bench")]
        ["bench", "net", ..] => bench_net(&args[2..]),
        #[cfg(feature = "bench")]
        ["bench", "processes", ..] => bench_processes(&args[2..]),
        #[cfg(feature = "bench")]
        ["bench", "syscalls", ..] => bench_syscalls(&args[2..]),
        #[cfg(not(feature = "bench"))]
        ["bench", _, ..] => Err(CliError::Failed(
            "this sandfork-vmm was built without its `bench` feature".into(),
        )),
        ["serve", ..] => serve(&args[1..]),
        ["image" | "bench" | "template", ..] => Err(CliError::Usage(
            format!("unknown command `{}`", words.join(" ")),
            USAGE,
        )),
        [other, ..] => Err(CliError::Usage(format!("unknown command `{other}`"), USAGE)),
    }
}

/// Options of one command: `--name value` or `--name=value` pairs and bare `--flag`s, then,
/// for commands that run a program, the program and its arguments (after `--` or the first
/// argument that is not an option).
struct Options {
    values: HashMap<&'static str, String>,
    flags: Vec<&'static str>,
    rest: Vec<String>,
    usage: &'static str,
}

impl Options {
    fn parse(
        args: &[String],
        valued: &[&'static str],
        flags: &[&'static str],
        takes_rest: bool,
        usage: &'static str,
    ) -> Result<Options, CliError> {
        let mut options = Options {
            values: HashMap::new(),
            flags: Vec::new(),
            rest: Vec::new(),
            usage,
        };
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            i += 1;
            if arg == "--help" || arg == "-h" {
                return Err(CliError::Help(usage));
            }
            if arg == "--" || !arg.starts_with('-') {
                if !takes_rest {
                    return Err(CliError::Usage(
                        format!("unexpected argument `{arg}`"),
                        usage,
                    ));
                }
                let from = if arg == "--" { i } else { i - 1 };
                options.rest = args[from..].to_vec();
                break;
            }
            let (name, inline_value) = match arg.split_once('=') {
                Some((n, v)) => (n, Some(v.to_owned())),
                None => (arg.as_str(), None),
            };
            if let Some(&flag) = flags.iter().find(|f| **f == name) {
                if inline_value.is_some() {
                    return Err(CliError::Usage(format!("{flag} takes no value"), usage));
                }
                options.flags.push(flag);
            } else if let Some(&key) = valued.iter().find(|k| **k == name) {
                let value = match inline_value {
                    Some(v) => v,
                    None => {
                        let v = args.get(i).ok_or_else(|| {
                            CliError::Usage(format!("{key} needs a value"), usage)
                        })?;
                        i += 1;
                        v.clone()
                    }
                };
                if options.values.insert(key, value).is_some() {
                    return Err(CliError::Usage(format!("{key} given twice"), usage));
                }
            } else {
                return Err(CliError::Usage(format!("unknown option `{name}`"), usage));
            }
        }
        Ok(options)
    }

    fn required(&self, key: &'static str) -> Result<&str, CliError> {
        self.values
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| CliError::Usage(format!("{key} is required"), self.usage))
    }

    /// A positive integer option no larger than `max`, or `default` when absent.
    fn number(&self, key: &'static str, default: u64, max: u64) -> Result<u64, CliError> {
        let Some(text) = self.values.get(key) else {
            return Ok(default);
        };
        match text.parse::<u64>() {
            Ok(n) if n >= 1 && n <= max => Ok(n),
            _ => Err(CliError::Usage(
                format!("{key} expects an integer from 1 to {max}, got `{text}`"),
                self.usage,
            )),
        }
    }

    /// `--boot-timeout-ms` (at most an hour), or `vm::AGENT_BOOT_TIMEOUT` when absent.
    fn boot_timeout(&self) -> Result<Duration, CliError> {
        let default_ms = vm::AGENT_BOOT_TIMEOUT.as_millis() as u64;
        self.number("--boot-timeout-ms", default_ms, 3_600_000)
            .map(Duration::from_millis)
    }

    /// A non-negative integer option no larger than `max`, or `default` when absent.
    fn count(&self, key: &'static str, default: u64, max: u64) -> Result<u64, CliError> {
        let Some(text) = self.values.get(key) else {
            return Ok(default);
        };
        match text.parse::<u64>() {
            Ok(n) if n <= max => Ok(n),
            _ => Err(CliError::Usage(
                format!("{key} expects an integer from 0 to {max}, got `{text}`"),
                self.usage,
            )),
        }
    }

    // Only the bench commands have flags (--json).
    #[cfg_attr(not(feature = "bench"), allow(dead_code))]
    fn flag(&self, name: &str) -> bool {
        self.flags.contains(&name)
    }
}

fn open_image(dir: &str) -> Result<Arc<Image>, CliError> {
    Image::open(Path::new(dir)).map_err(|e| CliError::Failed(format!("opening image {dir}: {e}")))
}

fn image_build(args: &[String]) -> Result<ExitCode, CliError> {
    let options = Options::parse(
        args,
        &["--manifest", "--out"],
        &[],
        false,
        IMAGE_BUILD_USAGE,
    )?;
    let manifest = options.required("--manifest")?;
    let out = options.required("--out")?;
    let report = image::build(Path::new(manifest), Path::new(out))
        .map_err(|e| CliError::Failed(format!("building image from {manifest}: {e}")))?;
    for note in &report.notes {
        eprintln!("note: {note}");
    }
    println!(
        "image {:?} in {out}: {} files, {} bytes, {} libraries resolved",
        report.name,
        report.files,
        report.bytes,
        report.libraries.len()
    );
    Ok(ExitCode::SUCCESS)
}

fn template_build(args: &[String]) -> Result<ExitCode, CliError> {
    let options = Options::parse(
        args,
        &[
            "--image",
            "--template",
            "--out",
            "--mem-mib",
            "--boot-timeout-ms",
        ],
        &[],
        false,
        TEMPLATE_BUILD_USAGE,
    )?;
    let image_dir = options.required("--image")?;
    let name = options.required("--template")?;
    let out = options.required("--out")?;
    // Options are checked before any file is read.
    let boot_timeout = options.boot_timeout()?;
    let image = open_image(image_dir)?;
    let language = daemon::templates::Language::of_image(image.name()).ok_or_else(|| {
        CliError::Failed(format!(
            "the image in {image_dir} is named `{}`, which is not a runtime (known: {})",
            image.name(),
            daemon::templates::known_languages()
        ))
    })?;
    let mem_mib = options.number("--mem-mib", language.default_memory_mib(), MAX_MEM_MIB)?;
    let command = language.agent();
    let outcome = snapshot::build(
        image,
        name,
        command,
        &vm::RunLimits {
            mem_bytes: mem_mib << 20,
            boot_timeout,
            ..Default::default()
        },
        &kvm::new_cpu,
        Path::new(out),
    )
    .map_err(|e| CliError::Failed(e.to_string()))?;
    println!("{outcome}");
    Ok(ExitCode::SUCCESS)
}

fn run(args: &[String]) -> Result<ExitCode, CliError> {
    let options = Options::parse(
        args,
        &[
            "--image",
            "--mem-mib",
            "--timeout-ms",
            "--output-cap",
            "--max-threads",
            "--max-processes",
        ],
        &[],
        true,
        RUN_USAGE,
    )?;
    let image_dir = options.required("--image")?;
    let mem_mib = options.number("--mem-mib", vm::DEFAULT_MEM_BYTES >> 20, MAX_MEM_MIB)?;
    let timeout_ms = options.number(
        "--timeout-ms",
        vm::DEFAULT_TIMEOUT.as_millis() as u64,
        u64::MAX >> 1,
    )?;
    let output_cap = options.number("--output-cap", vm::DEFAULT_OUTPUT_CAP, u64::MAX >> 1)?;
    let thread_limit =
        options.number("--max-threads", process::DEFAULT_THREAD_LIMIT, MAX_THREADS)?;
    let process_limit = options.number(
        "--max-processes",
        process::DEFAULT_PROCESS_LIMIT,
        process::MAX_PROCESS_LIMIT,
    )?;
    let Some((program, program_args)) = options.rest.split_first() else {
        return Err(CliError::Usage("no program given".into(), RUN_USAGE));
    };

    let image = open_image(image_dir)?;
    // Fail on a host without KVM before waiting for stdin.
    Kvm::open().map_err(|e| CliError::Failed(e.to_string()))?;
    let mut request = RunRequest::new(program, program_args);
    request.mem_bytes = mem_mib << 20;
    request.timeout = Duration::from_millis(timeout_ms);
    request.output_cap = output_cap;
    request.thread_limit = thread_limit.max(1);
    request.process_limit = process_limit;
    io::stdin()
        .read_to_end(&mut request.stdin)
        .map_err(|e| CliError::Failed(format!("reading stdin: {e}")))?;

    let outcome =
        vm::launch(image, &request, &kvm::new_cpu).map_err(|e| CliError::Failed(e.to_string()))?;
    // Output is best effort: a closed pipe must not hide the exit status.
    let _ = io::stdout()
        .write_all(&outcome.stdout)
        .and_then(|()| io::stdout().flush());
    let _ = io::stderr().write_all(&outcome.stderr);
    if !matches!(outcome.status, RunStatus::Exited { .. }) {
        eprintln!("sandfork-vmm: {}", outcome.status);
    }
    // Like a shell, only the low 8 bits of an exit code are visible.
    Ok(ExitCode::from(outcome.status.exit_code().to_le_bytes()[0]))
}

/// A bench's report: one JSON object with --json, else its table.
#[cfg(feature = "bench")]
fn print_report(options: &Options, json: String, table: impl FnOnce() -> String) {
    if options.flag("--json") {
        println!("{json}");
    } else {
        print!("{}", table());
    }
}

#[cfg(feature = "bench")]
fn bench_run(args: &[String]) -> Result<ExitCode, CliError> {
    let options = Options::parse(
        args,
        &["--image", "--iterations"],
        &["--json"],
        false,
        BENCH_USAGE,
    )?;
    let image_dir = options.required("--image")?;
    let iterations =
        options.number("--iterations", bench::DEFAULT_ITERATIONS as u64, 100_000)? as usize;
    let image = open_image(image_dir)?;
    let report = bench::run(image, iterations, &kvm::new_cpu)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    print_report(&options, report.to_json(), || report.table());
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "bench")]
fn bench_threads(args: &[String]) -> Result<ExitCode, CliError> {
    let options = Options::parse(
        args,
        &["--image", "--handoffs", "--repetitions"],
        &["--json"],
        false,
        BENCH_THREADS_USAGE,
    )?;
    let image = open_image(options.required("--image")?)?;
    let handoffs = options.number("--handoffs", threads_bench::DEFAULT_HANDOFFS, 10_000_000)?;
    let repetitions = options.number(
        "--repetitions",
        threads_bench::DEFAULT_REPETITIONS as u64,
        1000,
    )? as usize;
    let report = threads_bench::run(image, handoffs, repetitions, &kvm::new_cpu)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    print_report(&options, report.to_json(), || report.table());
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "bench")]
fn bench_net(args: &[String]) -> Result<ExitCode, CliError> {
    let options = Options::parse(
        args,
        &["--image", "--connects", "--mib", "--repetitions", "--serve"],
        &["--json"],
        false,
        BENCH_NET_USAGE,
    )?;
    if let Some(addr) = options.values.get("--serve") {
        net_bench::serve(addr).map_err(|e| CliError::Failed(format!("serving on {addr}: {e}")))?;
        return Ok(ExitCode::SUCCESS);
    }
    let image = open_image(options.required("--image")?)?;
    let connects = options.number("--connects", net_bench::DEFAULT_CONNECTS, 100_000)?;
    let mib = options.number("--mib", net_bench::DEFAULT_MIB, 4096)?;
    let repetitions =
        options.number("--repetitions", net_bench::DEFAULT_REPETITIONS as u64, 1000)? as usize;
    let report = net_bench::run(image, connects, mib, repetitions, &kvm::new_cpu)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    print_report(&options, report.to_json(), || report.table());
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "bench")]
fn bench_processes(args: &[String]) -> Result<ExitCode, CliError> {
    let options = Options::parse(
        args,
        &["--image", "--repetitions"],
        &["--json"],
        false,
        BENCH_PROCESSES_USAGE,
    )?;
    let image = open_image(options.required("--image")?)?;
    let repetitions = options.number(
        "--repetitions",
        processes_bench::DEFAULT_REPETITIONS,
        10_000,
    )?;
    let report = processes_bench::run(image, repetitions, &kvm::new_cpu)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    print_report(&options, report.to_json(), || report.table());
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "bench")]
fn bench_syscalls(args: &[String]) -> Result<ExitCode, CliError> {
    let options = Options::parse(
        args,
        &["--calls", "--repetitions"],
        &["--json"],
        false,
        BENCH_SYSCALLS_USAGE,
    )?;
    let calls = options.number("--calls", syscalls_bench::DEFAULT_CALLS, 100_000_000)?;
    let repetitions = options.number(
        "--repetitions",
        syscalls_bench::DEFAULT_REPETITIONS as u64,
        1000,
    )? as usize;
    let report = syscalls_bench::run(calls, repetitions, &kvm::new_cpu)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    print_report(&options, report.to_json(), || report.table());
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "bench")]
const BENCH_EXEC_USAGE: &str = "\
usage: sandfork-vmm bench exec --template DIR [--code PROGRAM] [--iterations N] [--pool-size N]
                              [--from-session CELL] [--json]

Measures, in one run, what an execution of the template's trivial program (`print(1+1)` for
python), or of PROGRAM, costs on the daemon's path: fresh fork p50/p99 (no pool); pooled execution p50/p99
from request to response at the daemon's socket (VMs reset between requests); the same binary
spawned natively, and the ratio; VMM CPU per execution; daemon throughput at 1, 2, 4 and 8
concurrent clients; memory per idle VM at 100 and 1,000 VMs; and whether a reset VM keeps
anything of the execution before it (the isolation check).

options:
  --template DIR     template folder (image and snapshot)
  --code PROGRAM     the program measured, in the template's language; the native baseline runs
                     it with the same interpreter (`-c`/`-e`) and its stdout is what the guest
                     must print
  --iterations N     pooled executions and fresh forks to time (default 1000)
  --pool-size N      VMs in the warm pool (default: 2 per core)
  --from-session CELL
                     also measure a template saved from a session of DIR that ran CELL (the
                     daemon's `session_template`), the same way, after DIR's own figures
  --json             print one JSON object instead of a table (with --from-session:
                     {\"template\": ..., \"from_session\": {..., \"report\": ...}})";

#[cfg(feature = "bench")]
fn bench_exec(args: &[String]) -> Result<ExitCode, CliError> {
    let options = Options::parse(
        args,
        &[
            "--template",
            "--code",
            "--iterations",
            "--pool-size",
            "--from-session",
        ],
        &["--json"],
        false,
        BENCH_EXEC_USAGE,
    )?;
    let dir = options.required("--template")?;
    let iterations = options.number(
        "--iterations",
        daemon::bench::DEFAULT_ITERATIONS as u64,
        100_000,
    )? as usize;
    let pool_size = options.number(
        "--pool-size",
        daemon::default_pool_size() as u64,
        daemon::MAX_POOL_SIZE,
    )? as usize;
    let code = options.values.get("--code").map(String::as_str);
    let report = daemon::bench::run(Path::new(dir), iterations, pool_size, code)
        .map_err(CliError::Failed)?;
    let Some(cell) = options.values.get("--from-session") else {
        print_report(&options, report.to_json(), || report.to_string());
        return Ok(isolation_exit_code(&[&report]));
    };
    let made =
        daemon::session_bench::session_template(Path::new(dir), cell).map_err(CliError::Failed)?;
    let saved = made.saved;
    let from_session =
        daemon::bench::run(&made.dir, iterations, pool_size, code).map_err(CliError::Failed)?;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    if options.flag("--json") {
        let json = serde_json::json!({
            "template": report.to_value(),
            "from_session": {"cell": cell, "file_bytes": saved.file_bytes,
                "stored_bytes": saved.memory.stored_bytes, "capture_ms": ms(saved.capture),
                "write_ms": ms(saved.write), "report": from_session.to_value()},
        });
        println!("{json}");
    } else {
        print!("{report}");
        println!(
            "\nsaved from a session after the cell `{cell}`: a snapshot of {} bytes ({} bytes of memory), recorded in {:.0} ms, written in {:.0} ms",
            saved.file_bytes,
            saved.memory.stored_bytes,
            ms(saved.capture),
            ms(saved.write)
        );
        print!("{from_session}");
    }
    Ok(isolation_exit_code(&[&report, &from_session]))
}

/// FAILURE when a report's reset isolation check failed.
#[cfg(feature = "bench")]
fn isolation_exit_code(reports: &[&daemon::bench::ExecReport]) -> ExitCode {
    if reports.iter().any(|r| matches!(r.isolation, Some(Err(_)))) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(feature = "bench")]
const BENCH_DENSITY_USAGE: &str = "\
usage: sandfork-vmm bench density --template DIR [--vms N] [--per-process N] [--json]

Creates N idle VMs of the template (fresh copy-on-write forks, each as a warm pool holds it)
and keeps them alive at once in this process, then prints the time to create them (in all,
and per VM p50/p99), the memory per VM (this process's RSS; the memory charged to its cgroup
and the kernel's share of it; the host's MemAvailable), the open files and memory mappings
per VM, and where the memory went (host-wide /proc/meminfo fields and slab caches, so other
processes move them too). Each VM holds two open files: the open-file limit is raised to what
N needs where the process may (CAP_SYS_RESOURCE), else to its hard limit, and when that leaves
too little room the VMs are spread over worker processes (this command with --worker). Run it
in a memory cgroup of its own for an exact cgroup figure.

options:
  --template DIR     template folder (image and snapshot)
  --vms N            idle VMs alive at once (default 10000)
  --per-process N    at most N of them in one process (default: as many as its open-file
                     limit allows); KVM makes each VM's creation and every host unmap of a
                     process cost in proportion to the VMs it holds already
  --json             print one JSON object instead of a table
  --worker           hold a share of the VMs for the bench that started it (line protocol on
                     stdin and stdout)";

#[cfg(feature = "bench")]
fn bench_density(args: &[String]) -> Result<ExitCode, CliError> {
    let options = Options::parse(
        args,
        &["--template", "--vms", "--per-process"],
        &["--json", "--worker"],
        false,
        BENCH_DENSITY_USAGE,
    )?;
    let dir = options.required("--template")?;
    let vms = options.number("--vms", daemon::density::DEFAULT_VMS as u64, 1_000_000)? as usize;
    if options.flag("--worker") {
        daemon::density::worker(Path::new(dir), vms).map_err(CliError::Failed)?;
        return Ok(ExitCode::SUCCESS);
    }
    // Unbounded by default: the open-file limit decides.
    let per_process = options.number("--per-process", 1_000_000, 1_000_000)? as usize;
    let report =
        daemon::density::run(Path::new(dir), vms, per_process).map_err(CliError::Failed)?;
    print_report(&options, report.to_json(), || report.to_string());
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "bench")]
const BENCH_SESSIONS_USAGE: &str = "\
usage: sandfork-vmm bench sessions --template DIR [--dir DATA] [--iterations N] [--json]

Measures, in one run, a session's durability costs: checkpoint p50/p99 (written, renamed,
the file system flushed) of a session that wrote 1 MiB and 32 MiB, pause p50, resume p50 (to
the VM ready at its first instruction), and durable checkpoints per second with 8 sessions at
once, each after a cell that wrote 1 MiB (in rounds that start together, and sustained);
baselines: the same bytes written and synced natively (one at a time and from 8 threads), and a
native spawn of /usr/bin/python3.11 -c pass.

options:
  --template DIR     template folder (image and snapshot)
  --dir DATA         where the checkpoints are written (default: the system's temporary folder)
  --iterations N     checkpoints per figure (default 100)
  --json             print one JSON object instead of a table";

#[cfg(feature = "bench")]
fn bench_sessions(args: &[String]) -> Result<ExitCode, CliError> {
    let options = Options::parse(
        args,
        &["--template", "--dir", "--iterations"],
        &["--json"],
        false,
        BENCH_SESSIONS_USAGE,
    )?;
    let dir = options.required("--template")?;
    let data = options
        .values
        .get("--dir")
        .map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let iterations = options.number(
        "--iterations",
        daemon::session_bench::DEFAULT_ITERATIONS as u64,
        100_000,
    )? as usize;
    let report =
        daemon::session_bench::run(Path::new(dir), &data, iterations).map_err(CliError::Failed)?;
    if options.flag("--json") {
        println!("{}", report.to_json());
    } else {
        print!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "bench")]
fn bench_fork(args: &[String]) -> Result<ExitCode, CliError> {
    let options = Options::parse(
        args,
        &["--template", "--iterations"],
        &[],
        false,
        BENCH_FORK_USAGE,
    )?;
    let dir = options.required("--template")?;
    let iterations =
        options.number("--iterations", bench::DEFAULT_ITERATIONS as u64, 100_000)? as usize;
    let image = open_image(dir)?;
    let language = daemon::templates::Language::of_image(image.name()).ok_or_else(|| {
        CliError::Failed(format!(
            "template {dir}: its image '{}' is not a known language",
            image.name()
        ))
    })?;
    let template = snapshot::Template::load(Path::new(dir), image, language.agent())
        .map_err(|e| CliError::Failed(format!("template {dir}: {e}")))?;
    let report = snapshot::bench::measure(
        &template,
        snapshot::ForkMemory::CopyOnWrite,
        &kvm::restore_cpu,
        iterations,
    )
    .map_err(|e| CliError::Failed(e.to_string()))?;
    print!("{report}");
    Ok(ExitCode::SUCCESS)
}

/// The host's side of guests' network (`net::configure`): the DNS server allowed names are
/// asked of, and the host's own addresses, which guests may not reach unless named.
fn configure_network(options: &Options) -> Result<(), CliError> {
    let upstream = match options.values.get("--dns-server") {
        Some(text) => Some(text.parse::<std::net::SocketAddr>().map_err(|_| {
            CliError::Usage(
                format!("--dns-server expects IP:PORT, got `{text}`"),
                options.usage,
            )
        })?),
        None => std::fs::read_to_string("/etc/resolv.conf")
            .ok()
            .and_then(|text| sandfork_vmm::net::nameserver_of(&text)),
    };
    let own_addresses = sandfork_vmm::net::host::own_addresses()
        .map_err(|e| CliError::Failed(format!("listing the host's addresses: {e}")))?;
    sandfork_vmm::net::configure(sandfork_vmm::net::HostConfig {
        upstream,
        own_addresses,
    });
    Ok(())
}

fn serve(args: &[String]) -> Result<ExitCode, CliError> {
    let options = Options::parse(
        args,
        &[
            "--socket",
            "--templates",
            "--max-concurrency",
            "--max-queue",
            "--max-queue-per-template",
            "--max-queue-per-key",
            "--pool-size",
            "--max-timeout-ms",
            "--max-memory-mib",
            "--max-output-bytes",
            "--max-processes",
            "--boot-timeout-ms",
            "--test-forbidden-syscall-after-ms",
            "--sessions",
            "--max-sessions",
            "--keep-checkpoints",
            "--dns-server",
        ],
        &["--adopt-sessions"],
        false,
        SERVE_USAGE,
    )?;
    configure_network(&options)?;
    let defaults = daemon::DEFAULT_MAXIMA;
    let max_limits = daemon::executor::ExecutionLimits {
        timeout_ms: options.number(
            "--max-timeout-ms",
            defaults.timeout_ms,
            daemon::MAX_TIMEOUT_MS_LIMIT,
        )?,
        memory_mib: options.number("--max-memory-mib", defaults.memory_mib, MAX_MEM_MIB)?,
        output_bytes: options.number(
            "--max-output-bytes",
            defaults.output_bytes,
            daemon::MAX_OUTPUT_BYTES_LIMIT,
        )?,
        processes: options.number(
            "--max-processes",
            defaults.processes,
            process::MAX_PROCESS_LIMIT,
        )?,
    };
    if max_limits.memory_mib < daemon::request::MIN_MEMORY_MIB {
        return Err(CliError::Usage(
            format!(
                "--max-memory-mib must be at least {}",
                daemon::request::MIN_MEMORY_MIB
            ),
            SERVE_USAGE,
        ));
    }
    let serve_options = daemon::ServeOptions {
        socket: options.required("--socket")?.into(),
        templates: options.required("--templates")?.into(),
        max_concurrency: options.number(
            "--max-concurrency",
            daemon::default_concurrency() as u64,
            daemon::MAX_CONCURRENCY_LIMIT,
        )? as usize,
        max_queue: options.count(
            "--max-queue",
            daemon::DEFAULT_QUEUE,
            daemon::MAX_QUEUE_LIMIT,
        )? as usize,
        max_queue_per_template: options.count(
            "--max-queue-per-template",
            daemon::default_queue_per_template() as u64,
            daemon::MAX_QUEUE_LIMIT,
        )? as usize,
        max_queue_per_key: options.count(
            "--max-queue-per-key",
            daemon::default_queue_per_key() as u64,
            daemon::MAX_QUEUE_LIMIT,
        )? as usize,
        max_limits,
        pool_size: options.count(
            "--pool-size",
            daemon::default_pool_size() as u64,
            daemon::MAX_POOL_SIZE,
        )? as usize,
        boot_timeout: options.boot_timeout()?,
        sessions: options
            .values
            .get("--sessions")
            .map(std::path::PathBuf::from),
        max_sessions: options.number(
            "--max-sessions",
            daemon::DEFAULT_MAX_SESSIONS,
            daemon::MAX_SESSIONS_LIMIT,
        )? as usize,
        keep_checkpoints: options.number(
            "--keep-checkpoints",
            daemon::sessions::DEFAULT_KEEP_CHECKPOINTS,
            daemon::sessions::MAX_KEEP_CHECKPOINTS,
        )?,
        adopt_sessions: options.flags.contains(&"--adopt-sessions"),
        forbidden_syscall_after: match options
            .values
            .contains_key("--test-forbidden-syscall-after-ms")
        {
            true => Some(std::time::Duration::from_millis(options.count(
                "--test-forbidden-syscall-after-ms",
                0,
                3_600_000,
            )?)),
            false => None,
        },
    };
    daemon::serve(&serve_options).map_err(|e| CliError::Failed(e.to_string()))?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn usage_message(result: Result<Options, CliError>) -> String {
        match result {
            Err(CliError::Usage(message, _)) => message,
            Err(CliError::Help(_)) => "help".into(),
            Err(CliError::Failed(message)) => panic!("unexpected failure: {message}"),
            Ok(_) => panic!("expected a usage error"),
        }
    }

    #[test]
    fn options_take_values_flags_and_the_program_after_them() {
        let args = strings(&[
            "--image",
            "/img",
            "--mem-mib=64",
            "--json",
            "--",
            "python3",
            "-c",
            "print(1)",
        ]);
        let o = Options::parse(
            &args,
            &["--image", "--mem-mib"],
            &["--json"],
            true,
            RUN_USAGE,
        )
        .ok()
        .unwrap();
        assert_eq!(o.required("--image").ok(), Some("/img"));
        assert_eq!(o.number("--mem-mib", 256, 1024).ok(), Some(64));
        assert!(o.flag("--json"));
        assert_eq!(o.rest, strings(&["python3", "-c", "print(1)"]));

        // Without `--`, the first non-option starts the program; its own options stay its own.
        let o = Options::parse(
            &strings(&["--image", "/i", "python3", "--version"]),
            &["--image"],
            &[],
            true,
            RUN_USAGE,
        )
        .ok()
        .unwrap();
        assert_eq!(o.rest, strings(&["python3", "--version"]));
        assert_eq!(o.number("--mem-mib", 256, 1024).ok(), Some(256));
    }

    #[test]
    fn bad_options_are_usage_errors() {
        let parse = |v: &[&str], rest| {
            Options::parse(
                &strings(v),
                &["--image", "--iterations"],
                &["--json"],
                rest,
                BENCH_USAGE,
            )
        };
        assert_eq!(
            usage_message(parse(&["--nope"], false)),
            "unknown option `--nope`"
        );
        assert_eq!(
            usage_message(parse(&["--image"], false)),
            "--image needs a value"
        );
        assert_eq!(
            usage_message(parse(&["--image", "a", "--image", "b"], false)),
            "--image given twice"
        );
        assert_eq!(
            usage_message(parse(&["--json=1"], false)),
            "--json takes no value"
        );
        assert_eq!(
            usage_message(parse(&["stray"], false)),
            "unexpected argument `stray`"
        );
        assert_eq!(
            usage_message(parse(&["--image", "a", "--help"], false)),
            "help"
        );
        let o = parse(&["--iterations", "0"], false).ok().unwrap();
        assert!(
            matches!(o.number("--iterations", 5, 10), Err(CliError::Usage(m, _)) if m.contains("from 1 to 10"))
        );
        assert!(
            matches!(o.required("--image"), Err(CliError::Usage(m, _)) if m == "--image is required")
        );
    }

    #[test]
    fn commands_are_dispatched_or_rejected_with_usage() {
        assert!(matches!(dispatch(&[]), Err(CliError::Usage(..))));
        assert!(
            matches!(dispatch(&strings(&["frob"])), Err(CliError::Usage(m, _)) if m == "unknown command `frob`")
        );
        assert!(matches!(
            dispatch(&strings(&["image", "frob"])),
            Err(CliError::Usage(..))
        ));
        assert!(matches!(
            dispatch(&strings(&["bench", "--help"])),
            Err(CliError::Help(USAGE))
        ));
        assert!(matches!(
            dispatch(&strings(&["run", "--help"])),
            Err(CliError::Help(RUN_USAGE))
        ));
        assert!(matches!(
            dispatch(&strings(&["image", "build", "--help"])),
            Err(CliError::Help(IMAGE_BUILD_USAGE))
        ));
        assert!(matches!(
            dispatch(&strings(&["bench", "run", "-h"])),
            Err(CliError::Help(BENCH_USAGE))
        ));
        assert!(matches!(
            dispatch(&strings(&["serve", "--help"])),
            Err(CliError::Help(SERVE_USAGE))
        ));
        assert!(
            matches!(dispatch(&strings(&["serve", "--templates", "/t"])), Err(CliError::Usage(m, _)) if m == "--socket is required")
        );
        assert!(
            matches!(dispatch(&strings(&["serve", "--socket", "/s", "--templates", "/t", "--max-output-bytes", "4194304"])), Err(CliError::Usage(m, _)) if m.contains("from 1 to 2097152"))
        );
        assert!(
            matches!(dispatch(&strings(&["serve", "--socket", "/s", "--templates", "/t", "--max-memory-mib", "8"])), Err(CliError::Usage(m, _)) if m.contains("at least 64"))
        );
        assert!(
            matches!(dispatch(&strings(&["serve", "--socket", "/s", "--templates", "/t", "--max-queue", "-1"])), Err(CliError::Usage(m, _)) if m.contains("from 0 to 4096"))
        );
        for flag in ["--max-queue-per-template", "--max-queue-per-key"] {
            assert!(
                matches!(dispatch(&strings(&["serve", "--socket", "/s", "--templates", "/t", flag, "4097"])), Err(CliError::Usage(m, _)) if m.contains(flag) && m.contains("from 0 to 4096"))
            );
        }
        assert!(
            matches!(dispatch(&strings(&["serve", "--socket", "/s", "--templates", "/t", "--boot-timeout-ms", "0"])), Err(CliError::Usage(m, _)) if m.contains("--boot-timeout-ms expects an integer from 1 to 3600000"))
        );
        assert!(
            matches!(dispatch(&strings(&["template", "build", "--image", "/i", "--template", "python", "--out", "/o", "--boot-timeout-ms", "x"])), Err(CliError::Usage(m, _)) if m.contains("--boot-timeout-ms"))
        );
        assert!(matches!(
            dispatch(&strings(&["bench", "fork", "--help"])),
            Err(CliError::Help(BENCH_FORK_USAGE))
        ));
        assert!(matches!(
            dispatch(&strings(&["bench", "threads", "--help"])),
            Err(CliError::Help(BENCH_THREADS_USAGE))
        ));
        assert!(matches!(
            dispatch(&strings(&["bench", "processes", "--help"])),
            Err(CliError::Help(BENCH_PROCESSES_USAGE))
        ));
        assert!(matches!(
            dispatch(&strings(&["bench", "syscalls", "--help"])),
            Err(CliError::Help(BENCH_SYSCALLS_USAGE))
        ));
        assert!(
            matches!(dispatch(&strings(&["bench", "fork"])), Err(CliError::Usage(m, _)) if m == "--template is required")
        );
        assert!(matches!(
            dispatch(&strings(&["template", "build", "--help"])),
            Err(CliError::Help(TEMPLATE_BUILD_USAGE))
        ));
        assert!(matches!(
            dispatch(&strings(&["template", "frob"])),
            Err(CliError::Usage(..))
        ));
        assert!(
            matches!(dispatch(&strings(&["template", "build", "--image", "/i", "--out", "/o"])), Err(CliError::Usage(m, _)) if m == "--template is required")
        );
        assert!(
            matches!(dispatch(&strings(&["template", "build", "--image", "/nonexistent", "--template", "python", "--out", "/o"])), Err(CliError::Failed(m)) if m.contains("/nonexistent"))
        );
        assert!(
            matches!(dispatch(&strings(&["run", "--image", "/nonexistent"])), Err(CliError::Usage(m, _)) if m == "no program given")
        );
        assert!(
            matches!(dispatch(&strings(&["run", "--image", "/nonexistent", "--", "true"])), Err(CliError::Failed(m)) if m.contains("/nonexistent"))
        );
    }
}
