//! The boundary between the daemon and whatever runs code: the `Executor` trait and the types
//! that cross it. The server validates requests, clamps limits and counts in-flight work; an
//! executor only turns one validated request into one finished execution.
//!
//! The production executor (`AgentExecutor`) takes a ready VM from the template's warm pool,
//! or restores or boots one for the request; `pools` reports the pool counters that `stats`
//! shows.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::agent::AgentRequest;
use crate::cpu::{CpuSnapshot, GuestCpu};
use crate::loader::LoadedProgram;
use crate::memory::GuestMemory;
use crate::process::OutputSink;
use crate::status::RunStatus;

/// A vCPU constructor the executor can share between execution threads.
pub type SharedCpuFactory = dyn for<'m> Fn(&'m GuestMemory, &LoadedProgram) -> io::Result<Box<dyn GuestCpu + 'm>>
    + Send
    + Sync;

/// A constructor of vCPUs restored from a template snapshot, shared between execution threads.
pub type SharedRestoreFactory = dyn for<'m> Fn(&'m GuestMemory, &CpuSnapshot) -> io::Result<Box<dyn GuestCpu + 'm>>
    + Send
    + Sync;

/// The limits one execution runs under, already clamped to the daemon's maxima.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ExecutionLimits {
    pub timeout_ms: u64,
    pub memory_mib: u64,
    pub output_bytes: u64,
    /// Processes alive or unreaped at once, the first included.
    pub processes: u64,
}

impl ExecutionLimits {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib << 20
    }
}

/// One validated `execute` request (see `request.rs` for what is checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecuteRequest {
    pub template: String,
    /// What the template's in-VM agent runs: code, argv, env, files, stdin (already checked
    /// with `AgentRequest::validate`).
    pub agent_request: AgentRequest,
    pub limits: ExecutionLimits,
    /// The client asked for the output as it is written (`output` frames before the answer).
    pub stream: bool,
    /// What the request left to its template (`Executor::complete` fills it in).
    pub defaulted: Defaulted,
}

/// Parts of an execute request the client did not give, whose defaults depend on the
/// template: the script's name (argv[0]: main.py for Python, main.js for Node) and the memory
/// size (the template's VMs' size, so that a pooled VM can serve it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Defaulted {
    pub script: bool,
    pub memory: bool,
}

/// Counters of one execution, reported as `usage`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub wall_us: u64,
    /// CPU time of the thread that ran the VM (guest and VMM time under KVM).
    pub cpu_us: u64,
    pub peak_memory_bytes: u64,
    /// Guest pages copied on write (0 for a freshly booted VM, which shares nothing).
    pub pages_copied: u64,
    pub syscalls: u64,
    pub exits: u64,
    /// Threads the program started.
    pub threads_created: u64,
    /// Times the vCPU went from one guest thread to another (each inside a VM exit the run
    /// took anyway: a switch adds no exit of its own).
    pub thread_switches: u64,
    /// Processes the program forked.
    pub processes_created: u64,
    /// Network bytes in and out, connections, refusals by the policy, DNS questions.
    pub network: crate::net::Usage,
}

/// How one execution went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    pub status: RunStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Waiting inside the executor for a pool worker while all were busy serving (the server's
    /// own wait for a running slot is added to it in `queue_us`).
    pub queue: Duration,
    /// The time the request waited for its VM to be created: restoring it from its template's
    /// snapshot, or booting its agent where the template has none; for a VM taken from a warm
    /// pool, only the part of the wait during which that VM was still being created.
    pub vm_setup: Duration,
    /// Running the request in the VM.
    pub run: Duration,
    pub usage: Usage,
    pub vm: VmOrigin,
    /// The result the agent published (a script's last value and rich results).
    pub result: Option<crate::agent::CellResult>,
    /// The files under /work/out at the end; None when there was no such folder.
    pub files: Option<Vec<crate::agent::OutputFile>>,
}

/// Where the VM that ran an execution came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmOrigin {
    /// Its agent was booted for it (the template has no snapshot of that memory size).
    Booted,
    /// Forked from the template's snapshot, this execution its first.
    Fresh,
    /// A pooled VM reset to the template after `resets` earlier executions.
    Reset { resets: u64 },
}

impl VmOrigin {
    pub fn name(&self) -> &'static str {
        match self {
            VmOrigin::Booted => "booted",
            VmOrigin::Fresh => "fresh",
            VmOrigin::Reset { .. } => "reset",
        }
    }

    pub fn resets(&self) -> u64 {
        match self {
            VmOrigin::Reset { resets } => *resets,
            _ => 0,
        }
    }
}

/// Why an execution was not run. A guest's own failure is never one of these: it is a
/// `RunStatus` in an `Execution`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecuteError {
    UnknownTemplate(String),
    /// VMs cannot be created now (no KVM, template not ready); retrying may help.
    Unavailable(String),
    /// The request cannot be run as given (a check only the executor can make).
    Rejected(String),
    /// A host failure or a bug; the request did not run.
    Internal(String),
}

impl fmt::Display for ExecuteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecuteError::UnknownTemplate(name) => write!(f, "no template named '{name}'"),
            ExecuteError::Unavailable(reason)
            | ExecuteError::Rejected(reason)
            | ExecuteError::Internal(reason) => f.write_str(reason),
        }
    }
}

/// A template as `list_templates` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TemplateInfo {
    pub name: String,
    /// Hex SHA-256 identifying the template's file image.
    pub content_hash: String,
    /// The runtime (`Language::name`: python, node).
    pub language: String,
    /// The languages its requests may run (`Language::languages`).
    pub languages: Vec<String>,
    /// Executions can run on it now.
    pub ready: bool,
}

/// What `health` reports about the executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// `Ok` when VMs can be created, else why not.
    pub kvm: Result<(), String>,
    pub templates: usize,
}

/// One template's warm pool, as `stats` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    pub template: String,
    /// VMs created and waiting for a request.
    pub ready: u64,
    /// VMs the pool keeps ready (one per worker).
    pub target: u64,
    /// VMs created so far.
    pub forks: u64,
    /// Mean time to create one of them ahead of its request, its warm-up included (not part of
    /// any request's latency unless the request had to wait for it, as `fork_us`).
    pub fork_us_mean: u64,
    /// VMs reset to the template after a request, for the next one (instead of destroyed).
    pub resets: u64,
    /// Mean time of one reset (off the request path, like creating a VM).
    pub reset_us_mean: u64,
    /// Mean pages one reset wrote back (every page the VM holds a copy of).
    pub reset_pages_mean: u64,
    /// Requests served by the pool's VMs.
    pub served: u64,
    /// Whether its new VMs are warmed up before they are counted ready: `on`; `off` where its
    /// forks are full copies (never reused); `failed: <reason>` once a warm-up failed, after
    /// which the pool's VMs serve unwarmed (each one's first request pays a fault for every page
    /// it writes).
    pub warm_up: String,
}

/// Runs code for the daemon. Called from many threads at once (one per in-flight execution).
pub trait Executor: Send + Sync {
    /// Runs `request` to completion within `request.limits`, on the calling thread. The request
    /// is handed over (not borrowed) so that its code, files and stdin (tens of MiB at most)
    /// reach the VM without a copy. The output the program writes also goes to `live_output`
    /// as it is written (`OutputSink::none()` unless the client streams).
    fn execute(
        &self,
        request: ExecuteRequest,
        live_output: OutputSink,
    ) -> Result<Execution, ExecuteError>;
    /// Gives `request` its template's defaults for what it left out (`Defaulted`), before its
    /// limits are reported; an executor without templates of its own leaves it as parsed.
    fn complete(&self, _request: &mut ExecuteRequest) {}
    fn templates(&self) -> Vec<TemplateInfo>;
    /// Starts serving the template folder `name` of the templates directory (a template built
    /// after the daemon started), replacing one of that name; an executor without a templates
    /// directory refuses. Returns its snapshot, when it has one (sessions are forked from it).
    fn load_template(
        &self,
        _name: &str,
    ) -> Result<Option<Arc<crate::snapshot::Template>>, ExecuteError> {
        Err(ExecuteError::Rejected(
            "this executor does not load templates".to_owned(),
        ))
    }
    /// Stops serving template `name` (executions already running on it finish); false when it
    /// served none of that name.
    fn unload_template(&self, _name: &str) -> bool {
        false
    }
    fn health(&self) -> Health;
    /// Warm pools, one per template that has one.
    fn pools(&self) -> Vec<PoolStats>;
}
