//! Launching one program in a fresh guest and running it to completion: the backend-agnostic
//! run loop. The vCPU backend (KVM in the product, the ptrace development CPU in tests) is
//! passed in as a constructor, so this module never names one.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::{AgentCommand, AgentRequest, InvalidRequest, AWAIT_REQUEST_SYSCALL};
use crate::cpu::GuestCpu;
use crate::fs::Image;
use crate::layout::page_align_up;
use crate::loader::{self, LoadError, LoadedProgram};
use crate::memory::GuestMemory;
use crate::process::threads::{Call, ThreadCounters};
use crate::process::{
    GuestProcess, OutputSink, ProcessConfig, SyscallCount, DEFAULT_PROCESS_LIMIT,
    DEFAULT_THREAD_LIMIT,
};
use crate::sandbox::KeptProcesses;
pub use crate::sched::LoopEnd;
use crate::sched::Scheduler;
use crate::status::RunStatus;

pub const DEFAULT_MEM_BYTES: u64 = 256 << 20;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_OUTPUT_CAP: u64 = 1 << 20;
/// The working directory: writable (an overlay directory in every image).
pub const DEFAULT_CWD: &str = crate::fs::WORK_DIR;
/// The environment of a run. GLIBC_TUNABLES keeps glibc's malloc to one arena: by default it
/// gives each new thread (up to eight) an arena of its own, reserving 64 MiB of address space
/// for each, and here guest memory is the address space (a 256 MiB guest holds three). On one
/// vCPU extra arenas buy nothing anyway: no two threads ever run at once.
pub const DEFAULT_ENV: [&str; 4] = [
    "PATH=/usr/bin:/bin",
    "HOME=/tmp",
    "LANG=C.UTF-8",
    "GLIBC_TUNABLES=glibc.malloc.arena_max=1",
];

/// One program to run in a fresh guest.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// Path in the image, or a bare name looked up in envp's PATH.
    pub program: String,
    /// The full argument vector, argv[0] included.
    pub argv: Vec<String>,
    /// "NAME=value" strings.
    pub envp: Vec<String>,
    pub stdin: Vec<u8>,
    pub cwd: String,
    /// Guest memory size, which is the memory limit (rounded up to whole pages).
    pub mem_bytes: u64,
    /// Wall-clock limit for the guest's run (loading is not counted).
    pub timeout: Duration,
    /// Cap on stdout+stderr bytes kept.
    pub output_cap: u64,
    /// Live threads allowed at once (clone fails with EAGAIN beyond it).
    pub thread_limit: u64,
    /// Processes alive or unreaped at once, the first included (fork fails with EAGAIN beyond
    /// it).
    pub process_limit: u64,
    /// The network policy and limits the run is under (none by default: no network).
    pub network: crate::net::Grant,
}

impl RunRequest {
    /// `program` with `args` after argv[0] = `program`, and the default limits and environment.
    pub fn new(program: &str, args: &[String]) -> RunRequest {
        RunRequest {
            program: program.to_owned(),
            argv: std::iter::once(program.to_owned())
                .chain(args.iter().cloned())
                .collect(),
            envp: DEFAULT_ENV.iter().map(|s| s.to_string()).collect(),
            stdin: Vec::new(),
            cwd: DEFAULT_CWD.to_owned(),
            mem_bytes: DEFAULT_MEM_BYTES,
            timeout: DEFAULT_TIMEOUT,
            output_cap: DEFAULT_OUTPUT_CAP,
            thread_limit: DEFAULT_THREAD_LIMIT,
            process_limit: DEFAULT_PROCESS_LIMIT,
            network: crate::net::Grant::default(),
        }
    }
}

/// Counters of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunStats {
    /// System calls the guest made.
    pub syscalls: u64,
    /// Times the guest left the VM (system calls plus faults).
    pub exits: u64,
    /// Every system call the guest made, per number.
    pub calls: Vec<SyscallCount>,
    /// System calls answered ENOSYS or stopped as unsupported, per number.
    pub unsupported: Vec<SyscallCount>,
    /// From the start of the run loop to the end of the run.
    pub wall: Duration,
    /// Creating guest memory, loading the program and creating the vCPU.
    pub load: Duration,
    /// The most guest memory the program held at once (mappings plus heap).
    pub peak_memory: u64,
    /// Threads created, refused at the limit, the most alive at once, and switches between
    /// them on the vCPU (preemptions among them).
    pub threads: ThreadCounters,
    /// Network bytes, connections, refusals and DNS questions.
    pub network: crate::net::Usage,
    /// Processes the program forked (by any process of its tree).
    pub processes_created: u64,
}

impl RunStats {
    /// The counters of a guest that ran from its first instruction: everything `process`
    /// counted, with the loop's `exits` and the times.
    fn of_whole_run(
        process: &GuestProcess,
        exits: u64,
        wall: Duration,
        load: Duration,
    ) -> RunStats {
        RunStats {
            syscalls: process.total_syscalls(),
            exits,
            calls: process.syscall_counts(),
            unsupported: process.unsupported_counts(),
            wall,
            load,
            peak_memory: process.peak_memory(),
            threads: process.threads().counters,
            network: process.net.usage,
            processes_created: process.processes().created(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub status: RunStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stats: RunStats,
    /// What the agent passed with PUBLISH_RESULT (`crate::agent`), when it did. Agent runs
    /// only (`ReadyGuest::serve`), as is `files`.
    pub result: Option<crate::agent::CellResult>,
    /// The files under /work/out when the run ended (`agent::output_files`); None: no such folder.
    pub files: Option<Vec<crate::agent::OutputFile>>,
}

impl RunOutcome {
    /// How `process` ended (`end`): its output taken out of it.
    fn of(end: LoopEnd, process: &mut GuestProcess, stats: RunStats) -> RunOutcome {
        let output = std::mem::replace(&mut process.output, crate::process::Output::new(0));
        let (stdout, stderr) = output.into_parts();
        RunOutcome {
            status: end.into_status(),
            stdout,
            stderr,
            stats,
            result: None,
            files: None,
        }
    }

    /// `of` for an agent's run, which answers a request: also the result the agent published
    /// and the files it left under /work/out.
    fn of_agent(end: LoopEnd, process: &mut GuestProcess, stats: RunStats) -> RunOutcome {
        RunOutcome {
            result: process.published_result.take(),
            files: crate::agent::output_files(&process.config.vfs),
            ..RunOutcome::of(end, process, stats)
        }
    }
}

/// Why a program could not be run at all (as opposed to how a run ended, `RunStatus`).
#[derive(Debug)]
pub enum LaunchError {
    /// The program is not in the image (neither as a path nor on PATH).
    ProgramNotFound {
        program: String,
    },
    /// Guest memory could not be allocated.
    Memory(io::Error),
    Load(LoadError),
    /// The VM's file system could not be set up over the image.
    FileSystem(crate::errno::Errno),
    /// The vCPU could not be created or failed while running.
    Cpu(io::Error),
    /// An agent request broke the rules of `AgentRequest::validate`; no guest ran it.
    InvalidRequest(InvalidRequest),
    /// The agent ended, crashed or wrote output before reaching its ready point.
    AgentNotReady {
        reason: String,
    },
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaunchError::ProgramNotFound { program } => {
                write!(f, "{program}: not found in the file image")
            }
            LaunchError::Memory(e) => write!(f, "allocating guest memory: {e}"),
            LaunchError::Load(e) => write!(f, "loading the program: {e}"),
            LaunchError::FileSystem(e) => write!(f, "setting up the file system: errno {}", e.0),
            LaunchError::Cpu(e) => write!(f, "{e}"),
            LaunchError::InvalidRequest(e) => write!(f, "{e}"),
            LaunchError::AgentNotReady { reason } => {
                write!(f, "the agent did not reach its ready point: {reason}")
            }
        }
    }
}

impl std::error::Error for LaunchError {}

impl From<LoadError> for LaunchError {
    fn from(e: LoadError) -> LaunchError {
        LaunchError::Load(e)
    }
}

/// Creates the vCPU for a loaded program (the backend is the caller's choice). The vCPU may
/// borrow the guest memory it runs on.
pub type CpuFactory<'a> =
    dyn for<'m> Fn(&'m GuestMemory, &LoadedProgram) -> io::Result<Box<dyn GuestCpu + 'm>> + 'a;

/// Finds `program` in the image: a path containing '/' as is, a bare name in envp's PATH.
pub fn resolve_program(image: &Image, program: &str, envp: &[String]) -> Option<String> {
    if program.contains('/') {
        return image.file_bytes(program).map(|_| program.to_owned());
    }
    if program.is_empty() {
        return None;
    }
    let path = envp
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or("/usr/bin:/bin");
    path.split(':')
        .filter(|dir| dir.starts_with('/'))
        .map(|dir| format!("{}/{program}", dir.trim_end_matches('/')))
        .find(|candidate| image.file_bytes(candidate).is_some())
}

/// A guest whose memory, program and process exist, before its vCPU does (the vCPU borrows
/// the memory, so the caller creates it).
struct Prepared {
    mem: GuestMemory,
    loaded: LoadedProgram,
    process: GuestProcess,
}

fn prepare(image: Arc<Image>, req: &RunRequest) -> Result<Prepared, LaunchError> {
    let program = resolve_program(&image, &req.program, &req.envp).ok_or_else(|| {
        LaunchError::ProgramNotFound {
            program: req.program.clone(),
        }
    })?;
    let mem_bytes = page_align_up(req.mem_bytes.min(u64::MAX / 2));
    let mem = GuestMemory::new(mem_bytes).map_err(LaunchError::Memory)?;
    let loaded = loader::load_program(&mem, &image, &program, &req.argv, &req.envp)?;
    let vfs = crate::fs::Vfs::new(image, crate::fs::DEFAULT_OVERLAY_LIMIT)
        .map_err(LaunchError::FileSystem)?;
    let command = crate::process::Command {
        exe: program,
        argv: req.argv.iter().map(|s| s.clone().into_bytes()).collect(),
        envp: req.envp.iter().map(|s| s.clone().into_bytes()).collect(),
    };
    let config = ProcessConfig {
        vfs,
        cwd: req.cwd.clone(),
        stdin: req.stdin.clone(),
        output_cap: req.output_cap,
        mem_limit: mem_bytes,
        command,
    };
    let mut process = GuestProcess::new(config, loaded.space);
    process.set_thread_limit(req.thread_limit);
    process.set_process_limit(req.process_limit);
    process.net.start(req.network.clone());
    Ok(Prepared {
        mem,
        loaded,
        process,
    })
}

/// The run loop's deadline `timeout` from now, and the limit in milliseconds it reports.
fn deadline_after(timeout: Duration) -> (Instant, u64) {
    let now = Instant::now();
    let limit_ms = timeout.as_millis().min(u128::from(u64::MAX)) as u64;
    // A timeout too large for Instant is no practical limit: a year stands in for it.
    (
        now.checked_add(timeout)
            .unwrap_or(now + Duration::from_secs(86_400 * 365)),
        limit_ms,
    )
}

/// Runs `req` in a fresh guest built from `image`, with a vCPU from `make_cpu`.
pub fn launch(
    image: Arc<Image>,
    req: &RunRequest,
    make_cpu: &CpuFactory,
) -> Result<RunOutcome, LaunchError> {
    let started = Instant::now();
    let Prepared {
        mem,
        loaded,
        mut process,
    } = prepare(image, req)?;
    let mut cpu = make_cpu(&mem, &loaded).map_err(LaunchError::Cpu)?;
    let load = started.elapsed();

    let run_started = Instant::now();
    let (deadline, limit_ms) = deadline_after(req.timeout);
    let (end, exits) =
        run_loop(cpu.as_mut(), &mut process, &mem, deadline, limit_ms).map_err(LaunchError::Cpu)?;
    let stats = RunStats::of_whole_run(&process, exits, run_started.elapsed(), load);
    Ok(RunOutcome::of(end, &mut process, stats))
}

/// Runs the guest until it stops: each system call goes to the syscall table and its outcome
/// to the scheduler (`crate::sched`, which switches threads), a fault ends the run as Crashed,
/// the deadline as Timeout, an agent's AWAIT_REQUEST without a pending request at the ready
/// point. Returns where it stopped and the number of VM exits.
pub fn run_loop(
    cpu: &mut dyn GuestCpu,
    process: &mut GuestProcess,
    mem: &GuestMemory,
    deadline: Instant,
    limit_ms: u64,
) -> io::Result<(LoopEnd, u64)> {
    let mut sched = Scheduler::new(cpu, process, deadline, limit_ms);
    run_scheduled(&mut sched, cpu, process, mem, None)
}

/// Runs the process tree (`crate::sandbox::run`, with a session's `kept` processes) with the
/// first process's CPU clock running.
fn run_scheduled<'a>(
    sched: &mut Scheduler,
    cpu: &mut dyn GuestCpu,
    process: &mut GuestProcess,
    mem: &'a GuestMemory,
    kept: Option<&mut KeptProcesses<'a>>,
) -> io::Result<(LoopEnd, u64)> {
    process.threads.start_cpu_clock();
    let ended = crate::sandbox::run(sched, cpu, process, mem, kept);
    process.threads.stop_cpu_clock();
    ended
}

// ---- the agent: template boot, ready point and hand-off ----

/// Limits of one agent execution, and where its output goes while it runs.
#[derive(Debug, Clone)]
pub struct RunLimits {
    /// Wall-clock limit from the hand-off to the end of the run (booting is not counted).
    pub timeout: Duration,
    /// Guest memory size: the memory limit.
    pub mem_bytes: u64,
    /// Cap on stdout+stderr bytes kept.
    pub output_cap: u64,
    /// Wall-clock limit of booting an agent to its ready point (`boot_agent`), before `timeout`.
    pub boot_timeout: Duration,
    /// Also gets the request's kept output as the program writes it (from the hand-off on:
    /// never a boot's). By default nothing does.
    pub live_output: OutputSink,
    /// Live threads allowed at once.
    pub threads: u64,
    /// Processes alive or unreaped at once.
    pub processes: u64,
}

impl Default for RunLimits {
    fn default() -> RunLimits {
        RunLimits {
            timeout: DEFAULT_TIMEOUT,
            mem_bytes: DEFAULT_MEM_BYTES,
            output_cap: DEFAULT_OUTPUT_CAP,
            boot_timeout: AGENT_BOOT_TIMEOUT,
            live_output: OutputSink::none(),
            threads: DEFAULT_THREAD_LIMIT,
            processes: DEFAULT_PROCESS_LIMIT,
        }
    }
}

/// How long an agent may take from its first instruction to its ready point, by default
/// (`RunLimits::boot_timeout`; `serve` and `template build` take `--boot-timeout-ms`).
pub const AGENT_BOOT_TIMEOUT: Duration = Duration::from_secs(30);

/// A guest stopped at its agent's ready point, inside AWAIT_REQUEST. This is the state a
/// template snapshot records (guest memory, vCPU registers, `process` and `call`), and the
/// state a fork of it starts from; `serve` hands it one request.
pub struct ReadyGuest<'m> {
    pub mem: &'m GuestMemory,
    pub cpu: Box<dyn GuestCpu + 'm>,
    pub process: GuestProcess,
    /// The arguments of the AWAIT_REQUEST call the guest is stopped in.
    pub call: [u64; 6],
    /// The boot's counters: `load` is creating the guest, `wall` running it to the ready point.
    pub boot: RunStats,
}

impl<'m> ReadyGuest<'m> {
    /// Answers the pending AWAIT_REQUEST with `request` and runs the guest to its end, for at
    /// most `timeout`. The outcome's counters cover the request only (from the hand-off on;
    /// `load` is zero).
    pub fn serve(
        self,
        request: AgentRequest,
        timeout: Duration,
    ) -> Result<RunOutcome, LaunchError> {
        self.serve_keeping_cpu(request, timeout)
            .map(|(outcome, _)| outcome)
    }

    /// `serve`, handing the vCPU back afterwards, so that the VM can be reset and reused.
    pub fn serve_keeping_cpu(
        mut self,
        request: AgentRequest,
        timeout: Duration,
    ) -> Result<(RunOutcome, Box<dyn GuestCpu + 'm>), LaunchError> {
        let (end, stats) = hand_over(
            &mut self.process,
            self.mem,
            self.cpu.as_mut(),
            self.call,
            request,
            timeout,
            None,
        )?;
        Ok((
            RunOutcome::of_agent(end, &mut self.process, stats),
            self.cpu,
        ))
    }
}

/// Answers the AWAIT_REQUEST call `call` that `process` is stopped in with `request` and runs
/// the guest until it stops: at its end, or (a session's cell, `HandOff::Cell`) at its next
/// ready point. The counters cover this request only (from the hand-off on; `load` is zero);
/// the output stays in `process`. A session passes the processes its earlier cells left
/// (`kept`): they run beside this request, and those alive at its ready point stay.
pub fn hand_over<'a>(
    process: &mut GuestProcess,
    mem: &'a GuestMemory,
    cpu: &mut dyn GuestCpu,
    call: [u64; 6],
    request: AgentRequest,
    timeout: Duration,
    kept: Option<&mut KeptProcesses<'a>>,
) -> Result<(LoopEnd, RunStats), LaunchError> {
    request.validate().map_err(LaunchError::InvalidRequest)?;
    let (calls_before, unsupported_before, total_before) = (
        process.syscall_counts(),
        process.unsupported_counts(),
        process.total_syscalls(),
    );
    let threads_before = process.threads().counters;
    process.net.start(request.network.clone());
    let processes_before = process.processes().created();
    process.agent_request = Some(request);
    let started = Instant::now();
    let (deadline, limit_ms) = deadline_after(timeout);
    let mut sched = Scheduler::new(cpu, process, deadline, limit_ms);
    let call = Call {
        nr: AWAIT_REQUEST_SYSCALL,
        args: call,
    };
    let (end, exits) = match sched
        .syscall(cpu, process, mem, call)
        .map_err(LaunchError::Cpu)?
    {
        Some(end) => (end, 0),
        None => run_scheduled(&mut sched, cpu, process, mem, kept).map_err(LaunchError::Cpu)?,
    };
    let stats = RunStats {
        syscalls: process.total_syscalls() - total_before,
        exits,
        calls: counts_since(&calls_before, process.syscall_counts()),
        unsupported: counts_since(&unsupported_before, process.unsupported_counts()),
        wall: started.elapsed(),
        load: Duration::ZERO,
        peak_memory: process.peak_memory(),
        threads: thread_counters_since(threads_before, process.threads().counters),
        network: process.net.usage,
        processes_created: process.processes().created() - processes_before,
    };
    Ok((end, stats))
}

/// `now` minus the counts in `before` (counters only grow), without the numbers left at zero.
fn counts_since(before: &[SyscallCount], now: Vec<SyscallCount>) -> Vec<SyscallCount> {
    now.into_iter()
        .filter_map(|mut c| {
            c.count -= before.iter().find(|b| b.nr == c.nr).map_or(0, |b| b.count);
            (c.count > 0).then_some(c)
        })
        .collect()
}

/// Thread counters of a request: `now` minus `before`, except the peak, which is the most
/// threads alive during the request.
fn thread_counters_since(before: ThreadCounters, now: ThreadCounters) -> ThreadCounters {
    ThreadCounters {
        created: now.created - before.created,
        refused: now.refused - before.refused,
        switches: now.switches - before.switches,
        preemptions: now.preemptions - before.preemptions,
        peak: now.peak,
    }
}

/// The tail of a boot's stderr shown when an agent does not become ready.
const BOOT_STDERR_SHOWN: usize = 2000;

/// Boots `command`'s agent in a fresh guest from `image` and runs it to its ready point, then
/// hands the stopped guest to `at_ready` (a template build snapshots it there; `launch_agent`
/// serves it a request). The boot has `limits.boot_timeout`; an agent that ends or crashes first,
/// or writes any output before its ready point (every fork would repeat it), is an error.
pub fn boot_agent<T>(
    image: Arc<Image>,
    command: &AgentCommand,
    limits: &RunLimits,
    make_cpu: &CpuFactory,
    at_ready: impl FnOnce(ReadyGuest<'_>) -> T,
) -> Result<T, LaunchError> {
    let started = Instant::now();
    let mut req = RunRequest::new(command.program, &[]);
    req.argv = command.argv.iter().map(|a| a.to_string()).collect();
    req.cwd = command.cwd.to_owned();
    req.mem_bytes = limits.mem_bytes;
    req.output_cap = limits.output_cap;
    req.thread_limit = limits.threads;
    req.process_limit = limits.processes;
    let Prepared {
        mem,
        loaded,
        mut process,
    } = prepare(image, &req)?;
    let mut cpu = make_cpu(&mem, &loaded).map_err(LaunchError::Cpu)?;
    let load = started.elapsed();

    let run_started = Instant::now();
    let (deadline, limit_ms) = deadline_after(limits.boot_timeout);
    let (end, exits) =
        run_loop(cpu.as_mut(), &mut process, &mem, deadline, limit_ms).map_err(LaunchError::Cpu)?;
    let stderr_tail = || {
        let stderr = process.stderr();
        String::from_utf8_lossy(&stderr[stderr.len().saturating_sub(BOOT_STDERR_SHOWN)..])
            .into_owned()
    };
    let call = match end {
        LoopEnd::ReadyPoint { call } => call,
        other => {
            return Err(LaunchError::AgentNotReady {
                reason: format!(
                    "{} before its ready point; stderr: {}",
                    other.into_status(),
                    stderr_tail()
                ),
            })
        }
    };
    if !process.stdout().is_empty() || !process.stderr().is_empty() {
        let reason = format!(
            "it wrote {} bytes to stdout and {} to stderr before its ready point; stderr: {}",
            process.stdout().len(),
            process.stderr().len(),
            stderr_tail()
        );
        return Err(LaunchError::AgentNotReady { reason });
    }
    let boot = RunStats::of_whole_run(&process, exits, run_started.elapsed(), load);
    Ok(at_ready(ReadyGuest {
        mem: &mem,
        cpu,
        process,
        call,
        boot,
    }))
}

/// Runs `request` on a freshly booted agent: what the daemon's executor does for a template
/// without a snapshot (or for a memory size other than its snapshot's); with one it restores a
/// VM instead (`snapshot::serve_restored`). The request is checked before any guest is created. The outcome's counters
/// cover the request; its `load` is everything before the hand-off (creating the guest and
/// booting the agent to its ready point: what a fork replaces).
pub fn launch_agent(
    image: Arc<Image>,
    command: &AgentCommand,
    request: AgentRequest,
    limits: &RunLimits,
    make_cpu: &CpuFactory,
) -> Result<RunOutcome, LaunchError> {
    request.validate().map_err(LaunchError::InvalidRequest)?;
    let started = Instant::now();
    boot_agent(image, command, limits, make_cpu, |mut ready| {
        let booted = started.elapsed();
        ready.process.output.stream_to(limits.live_output.clone());
        let mut outcome = ready.serve(request, limits.timeout)?;
        outcome.stats.load = booted;
        Ok(outcome)
    })?
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;
    use crate::cpu::CpuExit;
    use crate::image::format::{self, Entry, EntryKind, Index};
    use crate::image::testdir::TempDir;
    use crate::loader::tests::tiny_elf;
    use crate::status::GuestFault;

    const PROGRAM: &str = "/bin/prog";

    /// An image holding one tiny static program at /bin/prog, in a temporary directory that
    /// lives as long as the returned guard.
    fn test_image() -> (Arc<Image>, TempDir) {
        let dir = TempDir::new("vm");
        let program = tiny_elf(2, 0x40_0000, &[0xf4], 0, None);
        let entry = |path: &str, kind| Entry {
            path: path.into(),
            mode: 0o755,
            mtime_sec: 0,
            mtime_nsec: 0,
            kind,
        };
        let mut index = Index {
            name: "vm-test".into(),
            writable_dirs: vec!["/tmp".into(), "/work".into()],
            entries: vec![
                entry("/", EntryKind::Dir),
                entry("/bin", EntryKind::Dir),
                entry(
                    PROGRAM,
                    EntryKind::File {
                        offset: 0,
                        size: program.len() as u64,
                        sha256: [0; 32],
                    },
                ),
            ],
        };
        format::write(&dir.0, &mut index, |_| Ok(program.clone())).unwrap();
        (Image::open(&dir.0).unwrap(), dir)
    }

    /// Gives a closure the higher-ranked signature of a `CpuFactory`.
    fn factory<F>(f: F) -> F
    where
        F: for<'m> Fn(&'m GuestMemory, &LoadedProgram) -> io::Result<Box<dyn GuestCpu + 'm>>,
    {
        f
    }

    /// What the fake CPU was told by the run loop.
    #[derive(Debug, Default)]
    struct Log {
        returns: Vec<u64>,
        fs_bases: Vec<u64>,
    }

    /// A vCPU that replays a fixed list of exits (and reports the deadline when it runs out).
    struct ScriptedCpu {
        script: VecDeque<CpuExit>,
        log: Arc<Mutex<Log>>,
    }

    impl GuestCpu for ScriptedCpu {
        fn run(&mut self, _deadline: Instant) -> io::Result<CpuExit> {
            Ok(self.script.pop_front().unwrap_or(CpuExit::DeadlineReached))
        }
        fn set_syscall_return(&mut self, value: u64) -> io::Result<()> {
            self.log.lock().unwrap().returns.push(value);
            Ok(())
        }
        fn set_fs_base(&mut self, base: u64) -> io::Result<()> {
            self.log.lock().unwrap().fs_bases.push(base);
            Ok(())
        }
    }

    /// Launches /bin/prog on a scripted CPU; `script` gets the loaded program and guest memory
    /// (to place syscall buffers) and returns the exits to replay.
    fn launch_scripted(
        script: impl Fn(&GuestMemory, &LoadedProgram) -> Vec<CpuExit>,
    ) -> (RunOutcome, Arc<Mutex<Log>>) {
        let (image, _dir) = test_image();
        let log = Arc::new(Mutex::new(Log::default()));
        let cpu_log = log.clone();
        let make_cpu = factory(move |mem, loaded| {
            Ok(Box::new(ScriptedCpu {
                script: script(mem, loaded).into(),
                log: cpu_log.clone(),
            }))
        });
        let mut request = RunRequest::new(PROGRAM, &[]);
        request.mem_bytes = 16 << 20;
        request.timeout = Duration::from_millis(1500);
        let outcome = launch(image, &request, &make_cpu).unwrap();
        (outcome, log)
    }

    const SYS_WRITE: u64 = 1;
    const SYS_ARCH_PRCTL: u64 = 158;
    const SYS_EXIT_GROUP: u64 = 231;
    const ARCH_SET_FS: u64 = 0x1002;

    #[test]
    fn write_then_exit_group_yields_the_bytes_and_the_exit_code() {
        let (outcome, log) = launch_scripted(|mem, loaded| {
            let buf = loaded.stack_pointer - 256;
            mem.write(buf, b"hello\n").unwrap();
            vec![
                CpuExit::Syscall {
                    nr: SYS_WRITE,
                    args: [1, buf, 6, 0, 0, 0],
                },
                CpuExit::Syscall {
                    nr: SYS_WRITE,
                    args: [2, buf, 2, 0, 0, 0],
                },
                CpuExit::Syscall {
                    nr: SYS_EXIT_GROUP,
                    args: [3, 0, 0, 0, 0, 0],
                },
            ]
        });
        assert_eq!(outcome.status, RunStatus::Exited { code: 3 });
        assert_eq!(outcome.stdout, b"hello\n");
        assert_eq!(outcome.stderr, b"he");
        assert_eq!(log.lock().unwrap().returns, vec![6, 2]);
        assert_eq!((outcome.stats.syscalls, outcome.stats.exits), (3, 3));
        assert!(outcome.stats.unsupported.is_empty());
    }

    #[test]
    fn arch_prctl_set_fs_reaches_the_cpu_and_returns_zero() {
        let (outcome, log) = launch_scripted(|_, _| {
            vec![
                CpuExit::Syscall {
                    nr: SYS_ARCH_PRCTL,
                    args: [ARCH_SET_FS, 0x7000, 0, 0, 0, 0],
                },
                CpuExit::Syscall {
                    nr: SYS_EXIT_GROUP,
                    args: [0, 0, 0, 0, 0, 0],
                },
            ]
        });
        assert_eq!(outcome.status, RunStatus::Exited { code: 0 });
        let log = log.lock().unwrap();
        assert_eq!(log.fs_bases, vec![0x7000]);
        assert_eq!(log.returns, vec![0]);
    }

    #[test]
    fn a_fault_is_a_crash_and_counts_as_an_exit() {
        let fault = GuestFault {
            vector: 14,
            error_code: 6,
            rip: 0x40_0078,
            address: Some(0),
        };
        let (outcome, _) = launch_scripted(move |_, _| vec![CpuExit::Fault(fault.clone())]);
        assert_eq!(
            outcome.status,
            RunStatus::Crashed {
                fault: GuestFault {
                    vector: 14,
                    error_code: 6,
                    rip: 0x40_0078,
                    address: Some(0)
                }
            }
        );
        assert_eq!((outcome.stats.syscalls, outcome.stats.exits), (0, 1));
    }

    #[test]
    fn the_deadline_is_a_timeout_with_the_requested_limit() {
        let (outcome, _) = launch_scripted(|_, _| vec![]);
        assert_eq!(outcome.status, RunStatus::Timeout { limit_ms: 1500 });
        assert_eq!(outcome.stats.exits, 0);
    }

    #[test]
    fn enosys_answers_are_counted_by_number() {
        const UNKNOWN: u64 = 100_000;
        use crate::errno::Errno;
        let (outcome, log) = launch_scripted(|_, _| {
            vec![
                CpuExit::Syscall {
                    nr: UNKNOWN,
                    args: [0; 6],
                },
                CpuExit::Syscall {
                    nr: UNKNOWN,
                    args: [0; 6],
                },
                CpuExit::Syscall {
                    nr: SYS_EXIT_GROUP,
                    args: [0; 6],
                },
            ]
        });
        assert_eq!(outcome.status, RunStatus::Exited { code: 0 });
        assert_eq!(
            log.lock().unwrap().returns,
            vec![Errno::ENOSYS.as_return(); 2]
        );
        let unsupported: Vec<(Option<u64>, u64)> = outcome
            .stats
            .unsupported
            .iter()
            .map(|c| (c.nr, c.count))
            .collect();
        assert_eq!(
            unsupported,
            vec![(None, 2)],
            "numbers past the x86-64 range share one bucket"
        );
    }

    #[test]
    fn programs_are_found_by_path_or_on_path() {
        let (image, _dir) = test_image();
        let env = |p: &str| vec![format!("PATH={p}")];
        assert_eq!(
            resolve_program(&image, "/bin/prog", &[]),
            Some("/bin/prog".into())
        );
        assert_eq!(
            resolve_program(&image, "prog", &env("/usr/bin:/bin")),
            Some("/bin/prog".into())
        );
        assert_eq!(resolve_program(&image, "prog", &env("/usr/bin")), None);
        assert_eq!(
            resolve_program(&image, "prog", &env("relative:/bin/")),
            Some("/bin/prog".into())
        );
        assert_eq!(resolve_program(&image, "/bin/missing", &[]), None);
        assert_eq!(resolve_program(&image, "", &[]), None);
    }

    #[test]
    fn launch_errors_are_typed() {
        let (image, _dir) = test_image();
        let never = factory(|_, _| Err(io::Error::other("no /dev/kvm")));
        let missing = RunRequest::new("missing", &[]);
        assert!(matches!(
            launch(image.clone(), &missing, &never),
            Err(LaunchError::ProgramNotFound { .. })
        ));
        let cpu_fails = RunRequest::new(PROGRAM, &[]);
        match launch(image, &cpu_fails, &never) {
            Err(LaunchError::Cpu(e)) => assert_eq!(e.to_string(), "no /dev/kvm"),
            other => panic!("expected a CPU error, got {other:?}"),
        }
    }

    // ---- the agent hand-off ----

    const AGENT: AgentCommand = AgentCommand {
        cwd: crate::fs::WORK_DIR,
        program: PROGRAM,
        argv: &[PROGRAM],
    };

    fn await_request(buf: u64, len: u64) -> CpuExit {
        CpuExit::Syscall {
            nr: AWAIT_REQUEST_SYSCALL,
            args: [buf, len, 0, 0, 0, 0],
        }
    }

    /// What a scripted agent run left behind.
    struct Served {
        outcome: Result<RunOutcome, LaunchError>,
        log: Arc<Mutex<Log>>,
        call: [u64; 6],
        /// Guest memory at the AWAIT_REQUEST buffer after the run (64 bytes).
        buffer: Vec<u8>,
    }

    /// Boots /bin/prog as an agent on a scripted CPU (`script` gets guest memory and a free
    /// address to use) and, at the ready point, serves `request`.
    fn serve_scripted(
        script: impl Fn(&GuestMemory, u64) -> Vec<CpuExit>,
        request: AgentRequest,
    ) -> Served {
        let (image, _dir) = test_image();
        let log = Arc::new(Mutex::new(Log::default()));
        let cpu_log = log.clone();
        let make_cpu = factory(move |mem, loaded| {
            Ok(Box::new(ScriptedCpu {
                script: script(mem, loaded.stack_pointer - 0x4000).into(),
                log: cpu_log.clone(),
            }))
        });
        let limits = RunLimits {
            mem_bytes: 16 << 20,
            timeout: Duration::from_millis(1500),
            output_cap: 1 << 20,
            ..RunLimits::default()
        };
        boot_agent(image, &AGENT, &limits, &make_cpu, |ready| {
            let (mem, call) = (ready.mem, ready.call);
            let outcome = ready.serve(request, Duration::from_millis(1500));
            Served {
                outcome,
                log,
                call,
                buffer: mem.read_vec(call[0], 64).unwrap(),
            }
        })
        .unwrap()
    }

    const SYS_READ: u64 = 0;
    const SYS_OPEN: u64 = 2;

    #[test]
    fn the_ready_point_is_served_the_message_the_script_the_files_and_stdin() {
        let mut request = AgentRequest::new("print(1)");
        request.files = vec![("d/e/f.txt".into(), b"file".to_vec())];
        request.stdin = b"in".to_vec();
        let message = request
            .agent_message(crate::agent::HandOff::Script)
            .unwrap();
        let served = serve_scripted(
            |mem, buf| {
                mem.write(buf + 0x1000, b"/work/d/e/f.txt\0").unwrap();
                mem.write(buf + 0x1100, b"main.py\0").unwrap();
                vec![
                    await_request(buf, 0x800),
                    CpuExit::Syscall {
                        nr: SYS_READ,
                        args: [0, buf + 0x2000, 16, 0, 0, 0],
                    },
                    CpuExit::Syscall {
                        nr: SYS_OPEN,
                        args: [buf + 0x1000, 0, 0, 0, 0, 0],
                    },
                    CpuExit::Syscall {
                        nr: SYS_READ,
                        args: [3, buf + 0x2000, 16, 0, 0, 0],
                    },
                    CpuExit::Syscall {
                        nr: SYS_OPEN,
                        args: [buf + 0x1100, 0, 0, 0, 0, 0],
                    },
                    CpuExit::Syscall {
                        nr: SYS_READ,
                        args: [4, buf + 0x2000, 16, 0, 0, 0],
                    },
                    CpuExit::Syscall {
                        nr: SYS_EXIT_GROUP,
                        args: [5, 0, 0, 0, 0, 0],
                    },
                ]
            },
            request,
        );
        assert_eq!(
            served.call[1], 0x800,
            "the ready point is the AWAIT_REQUEST call"
        );
        let outcome = served.outcome.unwrap();
        assert_eq!(outcome.status, RunStatus::Exited { code: 5 });
        assert_eq!(
            served.log.lock().unwrap().returns,
            vec![message.len() as u64, 2, 3, 4, 4, 8],
            "message, stdin, file, script (relative to /work)"
        );
        // The same message but for its seed, drawn afresh for each message.
        let before_seed = message.find("\"seed\":\"").unwrap() + 8;
        assert_eq!(
            &served.buffer[..before_seed],
            &message.as_bytes()[..before_seed]
        );
        assert_eq!(
            (outcome.stats.syscalls, outcome.stats.exits),
            (7, 6),
            "the hand-off is counted as a call, not as an exit"
        );
    }

    #[test]
    fn a_small_buffer_gets_e2big_and_the_size_then_the_retry_succeeds() {
        use crate::errno::Errno;
        let request = AgentRequest::new("x = 1");
        let needed = request
            .agent_message(crate::agent::HandOff::Script)
            .unwrap()
            .len() as u64;
        let served = serve_scripted(
            |_, buf| {
                vec![
                    await_request(buf, 7),
                    await_request(buf, 8),
                    await_request(0, 4096),
                    await_request(buf, 4096),
                    CpuExit::Syscall {
                        nr: SYS_EXIT_GROUP,
                        args: [0; 6],
                    },
                ]
            },
            request,
        );
        assert_eq!(
            served.outcome.unwrap().status,
            RunStatus::Exited { code: 0 }
        );
        let (e2big, efault) = (Errno::E2BIG.as_return(), Errno::EFAULT.as_return());
        assert_eq!(
            served.log.lock().unwrap().returns,
            vec![e2big, e2big, efault, needed],
            "too small (no room for the size), too small, bad buffer, then served"
        );
        let prefix = b"{\"code\":\"x = 1\",\"argv\":[\"main.py\"],\"env\":{},\"seed\":\"";
        assert_eq!(served.buffer[..prefix.len()], *prefix);
    }

    #[test]
    fn asking_again_after_the_hand_off_is_unsupported() {
        let served = serve_scripted(
            |_, buf| vec![await_request(buf, 4096), await_request(buf, 4096)],
            AgentRequest::new(""),
        );
        assert_eq!(
            served.outcome.unwrap().status,
            RunStatus::Unsupported {
                syscall: AWAIT_REQUEST_SYSCALL,
                name: "sandfork_await_request"
            }
        );
    }

    #[test]
    fn an_agent_that_exits_before_its_ready_point_is_not_ready() {
        let (image, _dir) = test_image();
        let make_cpu = factory(|_, _| {
            Ok(Box::new(ScriptedCpu {
                script: vec![CpuExit::Syscall {
                    nr: SYS_EXIT_GROUP,
                    args: [9, 0, 0, 0, 0, 0],
                }]
                .into(),
                log: Default::default(),
            }))
        });
        match boot_agent(image, &AGENT, &RunLimits::default(), &make_cpu, |_| ()) {
            Err(LaunchError::AgentNotReady { reason }) => assert_eq!(
                reason,
                "exited with code 9 before its ready point; stderr: "
            ),
            other => panic!("expected AgentNotReady, got {:?}", other.err()),
        }
    }
}
