//! The production executor: runs each request in a new VM of its template. When the template
//! folder holds a snapshot (`crate::snapshot`, built by `sandfork-vmm template build`), the VM
//! is restored from it: a copy-on-write fork of the template's memory and a vCPU in the
//! snapshot's state, stopped at the agent's ready point, handed the request
//! (`snapshot::serve_restored`). Without one (or for a request asking for another memory size
//! than the snapshot's VMs have) the agent is booted to its ready point first
//! (`vm::launch_agent`).
//!
//! On KVM (`with_kvm`) both paths are unverified: the KVM vCPU has never run a guest. The same
//! executor runs end to end on the ptrace development CPU in tests/daemon_ptrace.rs and
//! tests/snapshot_ptrace.rs.
//!
//! Boundary for what comes next: a warm pool of restored VMs replaces the restore in
//! `boot_and_run` (`execute` takes a ready VM from the template's pool) and `pools()` reports
//! its counters. Nothing outside this file changes for that: the server only sees `Executor`.

use std::io;
use std::time::Duration;

use crate::cpu::{CpuSnapshot, GuestCpu};
use crate::daemon::executor::{ExecuteError, ExecuteRequest, Execution, Executor, Health, PoolStats, TemplateInfo, Usage};
use crate::daemon::templates::Template;
use crate::kvm::{self, Kvm};
use crate::loader::LoadedProgram;
use crate::memory::GuestMemory;
use crate::snapshot::{self, ForkMemory};
use crate::sys;
use crate::vm::{self, LaunchError, RunLimits, RunOutcome};

/// A vCPU constructor the executor can share between execution threads.
pub type SharedCpuFactory = dyn for<'m> Fn(&'m GuestMemory, &LoadedProgram) -> io::Result<Box<dyn GuestCpu + 'm>> + Send + Sync;

/// A constructor of vCPUs restored from a template snapshot, shared between execution threads.
pub type SharedRestoreFactory = dyn for<'m> Fn(&'m GuestMemory, &CpuSnapshot) -> io::Result<Box<dyn GuestCpu + 'm>> + Send + Sync;

const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

/// CPU time of the calling thread (under KVM the guest runs inside this thread's KVM_RUN).
fn thread_cpu_time() -> Duration {
    match sys::clock_time(CLOCK_THREAD_CPUTIME_ID) {
        Ok((secs, nanos)) => Duration::new(secs.max(0) as u64, nanos.clamp(0, 999_999_999) as u32),
        Err(_) => Duration::ZERO,
    }
}

pub struct AgentExecutor {
    templates: Vec<Template>,
    make_cpu: Box<SharedCpuFactory>,
    /// How VMs are restored from a template's snapshot; None: always booted.
    restore: Option<(Box<SharedRestoreFactory>, ForkMemory)>,
    /// Why VMs cannot be created on this host, when they cannot.
    unavailable: Option<String>,
}

impl AgentExecutor {
    /// The production executor on KVM. /dev/kvm is checked once, here (and kept open for the
    /// VMs to come): without it the executor still lists its templates and answers every
    /// execution `Unavailable`.
    pub fn with_kvm(templates: Vec<Template>) -> AgentExecutor {
        let unavailable = Kvm::shared().err().map(|e| {
            let text = e.to_string();
            text.strip_prefix("sandfork-vmm needs KVM: ").map(str::to_owned).unwrap_or(text)
        });
        AgentExecutor::new(templates, Box::new(kvm::new_cpu), unavailable).restoring(Box::new(kvm::restore_cpu), ForkMemory::CopyOnWrite)
    }

    /// Restores VMs of templates that have a snapshot with `restore` on memory made as
    /// `memory` says, instead of booting them.
    pub fn restoring(mut self, restore: Box<SharedRestoreFactory>, memory: ForkMemory) -> AgentExecutor {
        self.restore = Some((restore, memory));
        self
    }

    /// An executor on any vCPU backend (tests run it on the ptrace development CPU).
    pub fn new(templates: Vec<Template>, make_cpu: Box<SharedCpuFactory>, unavailable: Option<String>) -> AgentExecutor {
        AgentExecutor { templates, make_cpu, restore: None, unavailable }
    }

    fn template(&self, name: &str) -> Option<&Template> {
        self.templates.iter().find(|t| t.name == name)
    }

    /// Restores a VM of `template` from its snapshot, or boots one when the template has no
    /// snapshot (or restoring is off, or the request asks for another memory size than the
    /// snapshot's VMs have), serves it the request and tears it down.
    /// Returns the outcome and the pages of guest memory the VM got copies of (none for a
    /// booted VM, which shares no pages with anything).
    fn boot_and_run(&self, template: &Template, request: &ExecuteRequest) -> Result<(RunOutcome, u64), LaunchError> {
        let limits = RunLimits { timeout: request.limits.timeout(), mem_bytes: request.limits.memory_bytes(), output_cap: request.limits.output_bytes };
        if let (Some(snapshot), Some((restore, memory))) = (&template.snapshot, &self.restore) {
            if snapshot.identity().mem_bytes == limits.mem_bytes {
                let restored = snapshot::serve_restored(snapshot, *memory, restore.as_ref(), request.agent_request.clone(), &limits)?;
                return Ok((restored.outcome, restored.pages_copied));
            }
        }
        vm::launch_agent(template.image.clone(), template.language.agent(), request.agent_request.clone(), &limits, self.make_cpu.as_ref()).map(|outcome| (outcome, 0))
    }
}

/// Sorts a launch failure into the protocol's errors.
fn launch_failure(template: &Template, error: LaunchError) -> ExecuteError {
    match error {
        LaunchError::InvalidRequest(e) => ExecuteError::Rejected(e.0),
        // The limits are at least what the agent needs to boot (request::MIN_MEMORY_MIB), so
        // an agent that does not get ready is a template that is not ready.
        LaunchError::AgentNotReady { reason } => ExecuteError::Unavailable(format!("template '{}' is not ready: {reason}", template.name)),
        other => ExecuteError::Internal(format!("template '{}': {other}", template.name)),
    }
}

impl Executor for AgentExecutor {
    fn execute(&self, request: &ExecuteRequest) -> Result<Execution, ExecuteError> {
        let template = self.template(&request.template).ok_or_else(|| ExecuteError::UnknownTemplate(request.template.clone()))?;
        if let Some(reason) = &self.unavailable {
            return Err(ExecuteError::Unavailable(reason.clone()));
        }
        let cpu_before = thread_cpu_time();
        let (outcome, pages_copied) = match self.boot_and_run(template, request) {
            Ok(ran) => ran,
            Err(error) => return Err(launch_failure(template, error)),
        };
        let cpu = thread_cpu_time().saturating_sub(cpu_before);
        let stats = &outcome.stats;
        let usage = Usage {
            wall_us: (stats.load + stats.wall).as_micros() as u64,
            cpu_us: cpu.as_micros() as u64,
            peak_memory_bytes: stats.peak_memory,
            pages_copied,
            syscalls: stats.syscalls,
            exits: stats.exits,
        };
        Ok(Execution { status: outcome.status, vm_setup: stats.load, run: stats.wall, usage, stdout: outcome.stdout, stderr: outcome.stderr })
    }

    fn templates(&self) -> Vec<TemplateInfo> {
        self.templates
            .iter()
            .map(|t| TemplateInfo { name: t.name.clone(), content_hash: t.content_hash.clone(), language: t.language.name().to_owned(), ready: self.unavailable.is_none() })
            .collect()
    }

    fn health(&self) -> Health {
        Health { kvm: self.unavailable.clone().map_or(Ok(()), Err), templates: self.templates.len() }
    }

    fn pools(&self) -> Vec<PoolStats> {
        Vec::new()
    }
}
