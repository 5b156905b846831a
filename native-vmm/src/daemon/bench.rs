//! `sandfork-vmm bench exec`: what one execution costs on the daemon's real path, from one run.
//!
//! - fresh fork: a VM out of the template (copy-on-write memory and a restored vCPU), no pool;
//! - pooled execution: request to response of the template's trivial program at the daemon's
//!   socket (an in-process `Server` on a Unix socket, framing and JSON included), one request at
//!   a time on a warm pool whose VMs are reset between requests; the first requests, which each
//!   pooled VM serves as a fresh fork, are a warm-up and not measured;
//! - where a pooled execution's time goes (`Breakdown`), from the same series: the hand-off
//!   (the daemon's wait for a pooled VM and readying it for the request), the guest's run, the
//!   daemon's own part (parsing, its threads, the answer), the response (socket and framing to
//!   the client), the VM exits by reason, and the reset that follows (pages written back, time);
//! - the native baseline: the same binary the guest runs, spawned on the host;
//! - VMM CPU per execution: this process's CPU time over the pooled series, divided by its
//!   requests (the client's own JSON and socket work is in it: an upper bound);
//! - daemon throughput at 1, 2, 4 and 8 concurrent clients;
//! - memory per idle VM with 100 and 1,000 fresh forks alive (`density`: this process's RSS,
//!   the memory charged to its cgroup, the host's MemAvailable), and what a warm (reset) VM
//!   holds in copied pages;
//! - the reset isolation check (`isolation`) on a pool of one VM.

use std::fmt;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::agent_executor::AgentExecutor;
use super::executor::{ExecutionLimits, Executor};
use super::request::LimitPolicy;
use super::server::{Server, ServerConfig};
use super::templates::{self, Language};
use super::{density, frame, isolation};
use crate::bench::{measure_native, time_runs, Latency};
use crate::snapshot::ForkMemory;
use crate::sys::thread_cpu_time;
use crate::{kvm, sys};

pub const DEFAULT_ITERATIONS: usize = 1000;
const CONCURRENCY: [usize; 4] = [1, 2, 4, 8];
const IDLE_VMS: [usize; 2] = [100, 1000];
/// Requests per client in a throughput run.
const REQUESTS_PER_CLIENT: usize = 200;
const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;

/// The measured program, the stdout it must print, and the native command it is compared with.
struct Workload {
    code: String,
    stdout: String,
    native: (&'static str, Vec<String>),
}

/// The template language's interpreter on the host and its option that runs a program text.
fn interpreter(language: Language) -> (&'static str, &'static str) {
    match language {
        Language::Python => ("/usr/bin/python3.11", "-c"),
        Language::Node => ("/usr/bin/node", "-e"),
    }
}

/// The measured program: `code` when given (its expected stdout is what one native run of it
/// prints), else the language's trivial program.
fn workload(language: Language, code: Option<&str>) -> Result<Workload, String> {
    let (program, option) = interpreter(language);
    let (code, stdout) = match (code, language) {
        (Some(code), _) => {
            let args = [option.to_owned(), code.to_owned()];
            let stdout = crate::bench::native_stdout(program, &args)
                .map_err(|e| format!("the native run of `{code}`: {e}"))?;
            let stdout = String::from_utf8(stdout).map_err(|_| {
                format!("the native run of `{code}` printed bytes that are not UTF-8")
            })?;
            (code.to_owned(), stdout)
        }
        (None, Language::Python) => ("print(1+1)".to_owned(), "2\n".to_owned()),
        (None, Language::Node) => ("console.log(1+1)".to_owned(), "2\n".to_owned()),
    };
    Ok(Workload {
        native: (program, vec![option.to_owned(), code.clone()]),
        code,
        stdout,
    })
}

#[derive(Debug, Clone)]
pub struct ExecReport {
    pub template: String,
    pub code: String,
    pub native_command: String,
    pub iterations: usize,
    pub pool_size: usize,
    pub fresh_fork: Latency,
    /// VMM CPU per fresh fork, in microseconds: on the forking thread until the VM is ready,
    /// and in the whole process including the blank VM made ahead and its teardown (wherever
    /// those run).
    pub fresh_fork_cpu_us: (f64, f64),
    pub pooled_exec: Latency,
    pub breakdown: Breakdown,
    pub native_spawn: Latency,
    pub vmm_cpu_us_per_exec: f64,
    /// (concurrent clients, executions per second)
    pub exec_per_s: Vec<(usize, f64)>,
    /// (VMs alive, RSS KiB per VM, host MemAvailable KiB per VM)
    pub idle_vm_kib: Vec<(usize, f64, f64)>,
    /// (VMs alive, KiB per VM charged to this process's cgroup), when it has a memory controller.
    pub cgroup_vm_kib: Vec<(usize, f64)>,
    /// Copied pages a warm VM holds after a request, in KiB (the pages its resets rewrite).
    pub warm_vm_kib: f64,
    /// None: not run, its planting and searching programs are Python (`isolation`).
    pub isolation: Option<Result<(), String>>,
}

/// Where one pooled execution's time goes: medians over the pooled series in microseconds, the
/// exits a mean per execution, the reset a mean per reset of the series' VMs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Breakdown {
    /// The daemon's wait for a pooled VM and readying it for the request (`queue_us + fork_us`).
    pub hand_off_us: f64,
    /// The guest from the hand-off to its end (`exec_us`).
    pub guest_run_us: f64,
    /// The daemon's own part: `total_us` less the three above (reading and parsing the request,
    /// handing it between its threads, writing the answer).
    pub daemon_us: f64,
    /// The client's round trip less `total_us`: the socket, framing and the client's parse.
    pub response_us: f64,
    /// System calls that left the VM (every one but the hand-off's AWAIT_REQUEST, answered
    /// before the guest runs).
    pub syscall_exits: f64,
    /// Every other exit: faults, and memory first touched outside the VM's mapped slots.
    pub other_exits: f64,
    /// Pages a reset writes back (the pages a warm VM holds copies of).
    pub reset_pages: f64,
    pub reset_us: f64,
}

impl Breakdown {
    fn to_json(self) -> Value {
        json!({
            "hand_off_us": self.hand_off_us,
            "guest_run_us": self.guest_run_us,
            "daemon_us": self.daemon_us,
            "response_us": self.response_us,
            "exits": {"syscall": self.syscall_exits, "other": self.other_exits},
            "reset": {"pages": self.reset_pages, "us": self.reset_us},
        })
    }
}

/// One pooled execution as the client saw it and the daemon reported it.
struct Sample {
    client: Duration,
    answer: Value,
}

impl Sample {
    fn field(&self, group: &str, name: &str) -> f64 {
        self.answer
            .get(group)
            .and_then(|g| g.get(name))
            .and_then(Value::as_u64)
            .unwrap_or(0) as f64
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    sum / n.max(1) as f64
}

/// The breakdown of `samples`; `resets` the pool's (count, mean µs, mean pages) before and
/// after them.
fn breakdown(samples: &[Sample], resets: [(u64, u64, u64); 2]) -> Breakdown {
    let timing = |s: &Sample, name: &str| s.field("timings", name);
    let of = |pick: &dyn Fn(&Sample) -> f64| median(samples.iter().map(pick).collect());
    let syscall_exits = |s: &Sample| (s.field("usage", "syscalls") - 1.0).max(0.0);
    let [(before, before_us, before_pages), (after, after_us, after_pages)] = resets;
    let during = |mean_before: u64, mean_after: u64| {
        (after * mean_after).saturating_sub(before * mean_before) as f64
            / after.saturating_sub(before).max(1) as f64
    };
    Breakdown {
        hand_off_us: of(&|s| timing(s, "queue_us") + timing(s, "fork_us")),
        guest_run_us: of(&|s| timing(s, "exec_us")),
        daemon_us: of(&|s| {
            timing(s, "total_us")
                - timing(s, "queue_us")
                - timing(s, "fork_us")
                - timing(s, "exec_us")
        }),
        response_us: of(&|s| s.client.as_secs_f64() * 1e6 - timing(s, "total_us")),
        syscall_exits: mean(samples.iter().map(syscall_exits)),
        other_exits: mean(
            samples
                .iter()
                .map(|s| (s.field("usage", "exits") - syscall_exits(s)).max(0.0)),
        ),
        reset_pages: during(before_pages, after_pages),
        reset_us: during(before_us, after_us),
    }
}

impl ExecReport {
    pub fn ratio(&self) -> f64 {
        self.native_spawn.p50.as_secs_f64() / self.pooled_exec.p50.as_secs_f64().max(1e-9)
    }

    pub fn to_json(&self) -> String {
        self.to_value().to_string()
    }

    pub fn to_value(&self) -> Value {
        let latency =
            |l: &Latency| json!({"p50": l.p50.as_micros() as u64, "p99": l.p99.as_micros() as u64});
        let by_count = |rows: Vec<(usize, f64)>| {
            Value::Object(
                rows.into_iter()
                    .map(|(n, v)| (n.to_string(), json!(v)))
                    .collect(),
            )
        };
        json!({
            "template": self.template,
            "code": self.code,
            "native_command": self.native_command,
            "iterations": self.iterations,
            "pool_size": self.pool_size,
            "fresh_fork_us": latency(&self.fresh_fork),
            "fresh_fork_cpu_us": {"ready": self.fresh_fork_cpu_us.0, "with_teardown": self.fresh_fork_cpu_us.1},
            "pooled_exec_us": latency(&self.pooled_exec),
            "pooled_breakdown": self.breakdown.to_json(),
            "native_spawn_us": latency(&self.native_spawn),
            "native_over_pooled_p50": self.ratio(),
            "vmm_cpu_us_per_exec": self.vmm_cpu_us_per_exec,
            "daemon_exec_per_s": by_count(self.exec_per_s.clone()),
            "rss_per_idle_vm_kib": by_count(self.idle_vm_kib.iter().map(|&(n, rss, _)| (n, rss)).collect()),
            "host_memory_per_idle_vm_kib": by_count(self.idle_vm_kib.iter().map(|&(n, _, host)| (n, host)).collect()),
            "cgroup_memory_per_idle_vm_kib": by_count(self.cgroup_vm_kib.clone()),
            "warm_vm_copied_kib": self.warm_vm_kib,
            "isolation_ok": self.isolation.as_ref().map(Result::is_ok),
            "isolation_error": self.isolation.as_ref().and_then(|r| r.as_ref().err()),
        })
    }
}

impl fmt::Display for ExecReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        writeln!(
            f,
            "template {}: `{}`, {} iterations, pool of {} VMs per template",
            self.template, self.code, self.iterations, self.pool_size
        )?;
        writeln!(f, "{:<44} {:>10} {:>10}", "(microseconds)", "p50", "p99")?;
        for (name, l) in [
            ("fresh fork (VM ready, no pool)", &self.fresh_fork),
            ("pooled execution at the daemon socket", &self.pooled_exec),
            ("native spawn (baseline)", &self.native_spawn),
        ] {
            writeln!(f, "{name:<44} {:>10.0} {:>10.0}", us(l.p50), us(l.p99))?;
        }
        let b = &self.breakdown;
        writeln!(
            f,
            "a pooled execution, p50 us: hand-off {:.0}, guest run {:.0}, the daemon's own {:.0}, response {:.0}; exits per execution: {:.1} system calls, {:.1} other; then a reset writes back {:.0} pages in {:.0} us (off the request's path)",
            b.hand_off_us, b.guest_run_us, b.daemon_us, b.response_us, b.syscall_exits, b.other_exits, b.reset_pages, b.reset_us
        )?;
        writeln!(f, "VMM CPU per fresh fork: {:.0} us on its thread until ready (not the blank VM made ahead: kvm::spare), {:.0} us in the whole process with that and its teardown", self.fresh_fork_cpu_us.0, self.fresh_fork_cpu_us.1)?;
        writeln!(f, "native: {}", self.native_command)?;
        writeln!(f, "native p50 / pooled p50: {:.1}x", self.ratio())?;
        writeln!(
            f,
            "VMM CPU per pooled execution: {:.0} us",
            self.vmm_cpu_us_per_exec
        )?;
        let rates: Vec<String> = self
            .exec_per_s
            .iter()
            .map(|(c, r)| format!("{c}: {r:.0}/s"))
            .collect();
        writeln!(
            f,
            "daemon throughput by concurrent clients: {}",
            rates.join(", ")
        )?;
        for (n, rss, host) in &self.idle_vm_kib {
            let cgroup = self
                .cgroup_vm_kib
                .iter()
                .find(|(c, _)| c == n)
                .map_or(String::new(), |(_, kib)| {
                    format!(", {kib:.0} KiB charged to the cgroup")
                });
            writeln!(f, "memory per idle fresh VM with {n} alive: {rss:.0} KiB RSS{cgroup}, {host:.0} KiB of host MemAvailable")?;
        }
        writeln!(
            f,
            "a warm (reset) VM also holds {:.0} KiB of copied pages",
            self.warm_vm_kib
        )?;
        match &self.isolation {
            Some(Ok(())) => writeln!(
                f,
                "isolation across a reset: ok (nothing of the previous execution found)"
            ),
            Some(Err(e)) => writeln!(f, "isolation across a reset: FAILED: {e}"),
            None => writeln!(
                f,
                "isolation across a reset: not run (its programs are Python)"
            ),
        }
    }
}

/// Runs the benchmark on the template folder `dir` (image and snapshot; its name is the
/// template's) with pools of `pool_size`, measuring `code` (else the template's trivial program).
pub fn run(
    dir: &Path,
    iterations: usize,
    pool_size: usize,
    code: Option<&str>,
) -> Result<ExecReport, String> {
    if iterations == 0 || pool_size == 0 {
        return Err("iterations and the pool size must be at least 1".to_owned());
    }
    kvm::Kvm::shared().map_err(|e| e.to_string())?;
    let load = || templates::load_folder(dir);
    let template = load()?;
    let name = template.name.clone();
    let snapshot = template.snapshot.clone().ok_or_else(|| {
        format!(
            "{} has no snapshot: run `sandfork-vmm template build` first",
            dir.display()
        )
    })?;
    let template_language = template.language;
    let work = workload(template_language, code)?;
    let limits = ExecutionLimits {
        timeout_ms: 10_000,
        memory_mib: snapshot.identity().mem_bytes >> 20,
        output_bytes: 1 << 20,
        processes: crate::process::DEFAULT_PROCESS_LIMIT,
    };

    let handed_out = snapshot.handed_out();
    let (process_before, mut ready_cpu) = (process_cpu(), Duration::ZERO);
    let fresh_fork = latency(time_runs(iterations, || -> io::Result<()> {
        let thread_before = thread_cpu_time();
        let mem = snapshot.new_memory(ForkMemory::CopyOnWrite)?;
        let mut cpu = kvm::restore_cpu(&mem, snapshot.cpu())?;
        cpu.map_memory(handed_out)?;
        ready_cpu += thread_cpu_time().saturating_sub(thread_before);
        Ok(())
    }))?;
    kvm::reaper::flush();
    let per_fork = |cpu: Duration| cpu.as_secs_f64() * 1e6 / iterations as f64;
    let fresh_fork_cpu_us = (
        per_fork(ready_cpu),
        per_fork(process_cpu().saturating_sub(process_before)),
    );

    let executor: Arc<dyn Executor> =
        Arc::new(AgentExecutor::with_kvm(vec![template], pool_size).map_err(|e| e.to_string())?);
    let socket = scratch_socket()?;
    let policy = LimitPolicy::new(limits, limits);
    let server = Server::bind(
        &socket,
        executor.clone(),
        ServerConfig {
            max_running: 16,
            max_queued: 64,
            max_queued_per_template: 64,
            max_queued_per_key: 64,
            max_connections: 64,
            limits: policy,
        },
    )
    .map_err(|e| format!("binding {}: {e}", socket.display()))?;
    let stopper = server.stopper().map_err(|e| e.to_string())?;
    let serving = thread::spawn(move || server.run());
    let measured = (|| {
        let mut client = Client::connect(&socket)?;
        let mut warm_pages = Vec::new();
        for _ in 0..pool_size * 2 {
            let answer = client.execute(&name, &work.code, &work.stdout)?;
            if answer
                .get("vm")
                .and_then(|v| v.get("origin"))
                .and_then(Value::as_str)
                == Some("fresh")
            {
                warm_pages.push(
                    answer
                        .get("usage")
                        .and_then(|u| u.get("pages_copied"))
                        .and_then(Value::as_u64)
                        .unwrap_or(0),
                );
            }
        }
        let pool_resets = || {
            executor
                .pools()
                .iter()
                .find(|p| p.template == name)
                .map_or((0, 0, 0), |p| {
                    (p.resets, p.reset_us_mean, p.reset_pages_mean)
                })
        };
        let resets_before = pool_resets();
        let cpu_before = process_cpu();
        let mut samples = Vec::with_capacity(iterations);
        for _ in 0..iterations {
            let started = Instant::now();
            let answer = client.execute(&name, &work.code, &work.stdout)?;
            samples.push(Sample {
                client: started.elapsed(),
                answer,
            });
        }
        let cpu = process_cpu().saturating_sub(cpu_before);
        let pooled = latency(Ok::<_, String>(samples.iter().map(|s| s.client).collect()))?;
        let resets = [resets_before, pool_resets()];
        let mut rates = Vec::new();
        for clients in CONCURRENCY {
            rates.push((clients, throughput(&socket, &name, &work, clients)?));
        }
        let warm_kib = warm_pages.iter().sum::<u64>() as f64 * 4.0 / warm_pages.len().max(1) as f64;
        Ok::<_, String>((
            pooled,
            breakdown(&samples, resets),
            cpu.as_secs_f64() * 1e6 / iterations as f64,
            rates,
            warm_kib,
        ))
    })();
    stopper.stop();
    let _ = serving.join();
    let _ = std::fs::remove_dir_all(socket.parent().unwrap_or(&socket));
    drop(executor);
    let (pooled_exec, breakdown, vmm_cpu_us_per_exec, exec_per_s, warm_vm_kib) = measured?;

    let native_args: Vec<&str> = work.native.1.iter().map(String::as_str).collect();
    let native_spawn = latency(measure_native(
        work.native.0,
        &native_args,
        (iterations / 5).max(10),
    ))?;
    let (mut idle_vm_kib, mut cgroup_vm_kib) = (Vec::new(), Vec::new());
    for count in IDLE_VMS {
        let per_vm = density::idle_vms(&snapshot, count)?.per_vm;
        idle_vm_kib.push((count, per_vm.rss_kib, per_vm.host_kib));
        cgroup_vm_kib.extend(per_vm.cgroup_kib.map(|kib| (count, kib)));
    }
    let isolation = (template_language == Language::Python).then(|| {
        AgentExecutor::with_kvm(vec![load()?], 1)
            .map_err(|e| e.to_string())
            .and_then(|executor| {
                isolation::run(
                    &executor,
                    &name,
                    ExecutionLimits {
                        timeout_ms: 60_000,
                        ..limits
                    },
                    &kvm::reachable_memory(handed_out, snapshot.identity().mem_bytes),
                )
                .map_err(|e| e.to_string())
            })
            .map(drop)
    });
    Ok(ExecReport {
        template: name,
        native_command: format!("{} {}", work.native.0, work.native.1.join(" ")),
        code: work.code,
        iterations,
        pool_size,
        fresh_fork,
        fresh_fork_cpu_us,
        pooled_exec,
        breakdown,
        native_spawn,
        vmm_cpu_us_per_exec,
        exec_per_s,
        idle_vm_kib,
        cgroup_vm_kib,
        warm_vm_kib,
        isolation,
    })
}

pub(crate) fn latency<E: fmt::Display>(
    samples: Result<Vec<Duration>, E>,
) -> Result<Latency, String> {
    Latency::of(&samples.map_err(|e| e.to_string())?).ok_or_else(|| "no samples".to_owned())
}

fn process_cpu() -> Duration {
    sys::clock_time(CLOCK_PROCESS_CPUTIME_ID).map_or(Duration::ZERO, |(s, ns)| {
        Duration::new(
            u64::try_from(s).unwrap_or(0),
            u32::try_from(ns.clamp(0, 999_999_999)).unwrap_or(0),
        )
    })
}

/// A private directory for the socket (short: a socket path must fit in 108 bytes).
fn scratch_socket() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("sfbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok(dir.join("d.sock"))
}

/// Executions per second with `clients` connections each sending requests one after another.
fn throughput(
    socket: &Path,
    template: &str,
    work: &Workload,
    clients: usize,
) -> Result<f64, String> {
    let started = Instant::now();
    let results: Vec<Result<(), String>> = thread::scope(|scope| {
        let workers: Vec<_> = (0..clients)
            .map(|_| {
                scope.spawn(|| {
                    let mut client = Client::connect(socket)?;
                    (0..REQUESTS_PER_CLIENT).try_for_each(|_| {
                        client.execute(template, &work.code, &work.stdout).map(drop)
                    })
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err("a client thread panicked".to_owned()))
            })
            .collect()
    });
    results.into_iter().collect::<Result<Vec<()>, String>>()?;
    Ok((clients * REQUESTS_PER_CLIENT) as f64 / started.elapsed().as_secs_f64())
}

/// A blocking protocol client.
struct Client {
    stream: UnixStream,
    next_id: u64,
}

impl Client {
    fn connect(socket: &Path) -> Result<Client, String> {
        let stream = UnixStream::connect(socket)
            .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
        let mut client = Client { stream, next_id: 1 };
        client.send_and_read(&json!({"type": "hello", "protocol": 1}))?;
        Ok(client)
    }

    fn send_and_read(&mut self, message: &Value) -> Result<Value, String> {
        frame::write_frame(&mut self.stream, message)
            .map_err(|e| format!("writing to the daemon: {e}"))?;
        let answer = frame::read_frame(&mut self.stream)
            .map_err(|e| format!("reading from the daemon: {e}"))?;
        match answer.get("type").and_then(Value::as_str) {
            Some("error") => Err(format!("the daemon answered {answer}")),
            _ => Ok(answer),
        }
    }

    /// Executes `code` and checks it printed `stdout`.
    fn execute(&mut self, template: &str, code: &str, stdout: &str) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let answer = self.send_and_read(
            &json!({"id": id, "type": "execute", "template": template, "code": code}),
        )?;
        if answer.get("stdout").and_then(Value::as_str) != Some(stdout) {
            return Err(format!("`{code}` did not print {stdout:?}: {answer}"));
        }
        Ok(answer)
    }
}
