//! The production executor: runs each request in a new VM of its template, destroyed after
//! it. When the template folder holds a snapshot (`crate::snapshot`, built by `sandfork-vmm
//! template build`), the VM is restored from it: a copy-on-write fork of the template's memory
//! and a vCPU in the snapshot's state, stopped at the agent's ready point, handed the request.
//! With a warm pool (`pooled`) that VM was created ahead of the request by one of the
//! template's pool workers (`pool`); without one it is restored for the request on the
//! request's thread (`snapshot::serve_restored`). A template without a snapshot, or a request
//! asking for another memory size than the snapshot's VMs have, gets a VM whose agent is
//! booted to its ready point first (`vm::launch_agent`).
//!
//! Pooled VMs are reused: reset to the template after each request (`pool`).

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use crate::daemon::executor::{
    ExecuteError, ExecuteRequest, Execution, Executor, Health, PoolStats, TemplateInfo, Usage,
    VmOrigin,
};
use crate::daemon::pool::{Pool, PooledRun};
use crate::daemon::templates::{self, Template};
use crate::kvm::{self, Kvm};
use crate::process::OutputSink;
use crate::snapshot::{self, ForkMemory};
use crate::sys::thread_cpu_time;
use crate::vm::{self, LaunchError, RunLimits, RunOutcome};

pub use crate::daemon::executor::{SharedCpuFactory, SharedRestoreFactory};

pub struct AgentExecutor {
    /// The templates served; `load_template` and `unload_template` change it while serving.
    templates: RwLock<Vec<Arc<Template>>>,
    make_cpu: Box<SharedCpuFactory>,
    /// How VMs are restored from a template's snapshot; None: always booted.
    restore: Option<(Arc<SharedRestoreFactory>, ForkMemory)>,
    /// Warm pools by template name, for the templates with a snapshot (when pooling is on).
    pools: RwLock<Vec<(String, Arc<Pool>)>>,
    /// VMs each warm pool keeps ready (0: no pools).
    pool_size: usize,
    /// Where `load_template` finds template folders; None: it refuses.
    templates_dir: Option<PathBuf>,
    /// Why VMs cannot be created on this host, when they cannot.
    unavailable: Option<String>,
    /// The limit of booting an agent for a request (`RunLimits::boot_timeout`).
    boot_timeout: Duration,
}

impl AgentExecutor {
    /// The production executor on KVM. /dev/kvm is checked once, here (and kept open for the
    /// VMs to come): without it the executor still lists its templates and answers every
    /// execution `Unavailable`.
    /// `pool_size` VMs of each template with a snapshot are kept ready (0: none, each VM is
    /// restored for its request).
    pub fn with_kvm(templates: Vec<Template>, pool_size: usize) -> io::Result<AgentExecutor> {
        let unavailable = Kvm::shared().err().map(|e| {
            let text = e.to_string();
            text.strip_prefix("sandfork-vmm needs KVM: ")
                .map(str::to_owned)
                .unwrap_or(text)
        });
        AgentExecutor::new(templates, Box::new(kvm::new_cpu), unavailable)
            .restoring(Arc::new(kvm::restore_cpu), ForkMemory::CopyOnWrite)
            .pooled(pool_size)
    }

    /// Restores VMs of templates that have a snapshot with `restore` on memory made as
    /// `memory` says, instead of booting them.
    pub fn restoring(
        mut self,
        restore: Arc<SharedRestoreFactory>,
        memory: ForkMemory,
    ) -> AgentExecutor {
        self.restore = Some((restore, memory));
        self
    }

    /// Starts a warm pool of `size` VMs for each template with a snapshot (after `restoring`;
    /// 0 starts none). Nothing is started where VMs cannot be created.
    pub fn pooled(mut self, size: usize) -> io::Result<AgentExecutor> {
        self.pool_size = size;
        let templates = self
            .templates
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut pools = Vec::new();
        for template in &templates {
            if let Some(pool) = self.start_pool(template)? {
                pools.push((template.name.clone(), Arc::new(pool)));
            }
        }
        *self.pools.get_mut().unwrap_or_else(PoisonError::into_inner) = pools;
        Ok(self)
    }

    /// The warm pool `template` gets: none without a snapshot, restoring, pooling or KVM.
    fn start_pool(&self, template: &Template) -> io::Result<Option<Pool>> {
        let (Some((restore, memory)), Some(snapshot)) = (&self.restore, &template.snapshot) else {
            return Ok(None);
        };
        if self.pool_size == 0 || self.unavailable.is_some() {
            return Ok(None);
        }
        Pool::start(
            &template.name,
            snapshot.clone(),
            restore.clone(),
            *memory,
            self.pool_size,
        )
        .map(Some)
    }

    /// Lets `load_template` open template folders of `dir` (the daemon's templates directory).
    pub fn loading_from(mut self, dir: PathBuf) -> AgentExecutor {
        self.templates_dir = Some(dir);
        self
    }

    /// An executor on any vCPU backend (tests run it on the ptrace development CPU).
    pub fn new(
        templates: Vec<Template>,
        make_cpu: Box<SharedCpuFactory>,
        unavailable: Option<String>,
    ) -> AgentExecutor {
        AgentExecutor {
            templates: RwLock::new(templates.into_iter().map(Arc::new).collect()),
            make_cpu,
            restore: None,
            pools: RwLock::new(Vec::new()),
            pool_size: 0,
            templates_dir: None,
            unavailable,
            boot_timeout: vm::AGENT_BOOT_TIMEOUT,
        }
    }

    /// Gives an agent booted for a request (a template without a usable snapshot) `limit` to
    /// reach its ready point, instead of `vm::AGENT_BOOT_TIMEOUT`.
    pub fn booting_within(mut self, limit: Duration) -> AgentExecutor {
        self.boot_timeout = limit;
        self
    }

    fn template(&self, name: &str) -> Option<Arc<Template>> {
        let templates = self
            .templates
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        templates.iter().find(|t| t.name == name).cloned()
    }

    fn pool(&self, template: &str) -> Option<Arc<Pool>> {
        let pools = self.pools.read().unwrap_or_else(PoisonError::into_inner);
        pools
            .iter()
            .find(|(name, _)| name == template)
            .map(|(_, pool)| pool.clone())
    }

    /// Serves the request on a VM of `template`: one from its warm pool, else one restored from
    /// its snapshot for the request, else (no snapshot, restoring off, or another memory size
    /// than the snapshot's VMs have) one whose agent is booted for it. The program's output also
    /// goes to `live_output` as it is written.
    fn run(
        &self,
        template: &Template,
        request: ExecuteRequest,
        live_output: OutputSink,
    ) -> Result<Ran, LaunchError> {
        let limits = RunLimits {
            timeout: request.limits.timeout(),
            mem_bytes: request.limits.memory_bytes(),
            output_cap: request.limits.output_bytes,
            boot_timeout: self.boot_timeout,
            live_output,
            processes: request.limits.processes,
            ..RunLimits::default()
        };
        let agent_request = request.agent_request;
        let snapshot = template
            .snapshot
            .as_ref()
            .filter(|s| s.identity().mem_bytes == limits.mem_bytes);
        match (
            snapshot,
            self.pool(&template.name).as_deref(),
            &self.restore,
        ) {
            (Some(_), Some(pool), _) => {
                let PooledRun {
                    restored,
                    resets,
                    queue_wait,
                    fork_wait,
                    cpu,
                } = pool.run(agent_request, limits)?;
                let mut outcome = restored.outcome;
                outcome.stats.load = fork_wait;
                let vm = if resets == 0 {
                    VmOrigin::Fresh
                } else {
                    VmOrigin::Reset { resets }
                };
                Ok(Ran {
                    outcome,
                    pages_copied: restored.pages_copied,
                    queue: queue_wait,
                    cpu,
                    vm,
                })
            }
            (Some(snapshot), None, Some((restore, memory))) => Ran::here(VmOrigin::Fresh, || {
                snapshot::serve_restored(
                    snapshot,
                    *memory,
                    restore.as_ref(),
                    agent_request,
                    &limits,
                )
                .map(|r| (r.outcome, r.pages_copied))
            }),
            _ => Ran::here(VmOrigin::Booted, || {
                vm::launch_agent(
                    template.image.clone(),
                    template.language.agent(),
                    agent_request,
                    &limits,
                    self.make_cpu.as_ref(),
                )
                .map(|outcome| (outcome, 0))
            }),
        }
    }
}

/// One request's run, wherever its VM came from.
struct Ran {
    /// Its `stats.load` is the time the request waited for its VM to be created.
    outcome: RunOutcome,
    /// Pages of guest memory the VM got copies of (none for a booted VM, which shares no
    /// pages with anything).
    pages_copied: u64,
    /// Waiting for a pool worker.
    queue: Duration,
    /// CPU time of the thread that ran the VM, for this request.
    cpu: Duration,
    vm: VmOrigin,
}

impl Ran {
    /// A run on the calling thread, on a VM created for it, its CPU time measured around it.
    fn here(
        vm: VmOrigin,
        run: impl FnOnce() -> Result<(RunOutcome, u64), LaunchError>,
    ) -> Result<Ran, LaunchError> {
        let cpu_before = thread_cpu_time();
        let (outcome, pages_copied) = run()?;
        Ok(Ran {
            outcome,
            pages_copied,
            queue: Duration::ZERO,
            cpu: thread_cpu_time().saturating_sub(cpu_before),
            vm,
        })
    }
}

/// Sorts a launch failure into the protocol's errors.
fn launch_failure(template: &Template, error: LaunchError) -> ExecuteError {
    match error {
        LaunchError::InvalidRequest(e) => ExecuteError::Rejected(e.0),
        // The limits are at least what the agent needs to boot (request::MIN_MEMORY_MIB), so
        // an agent that does not get ready is a template that is not ready.
        LaunchError::AgentNotReady { reason } => ExecuteError::Unavailable(format!(
            "template '{}' is not ready: {reason}",
            template.name
        )),
        other => ExecuteError::Internal(format!("template '{}': {other}", template.name)),
    }
}

impl Executor for AgentExecutor {
    fn execute(
        &self,
        request: ExecuteRequest,
        live_output: OutputSink,
    ) -> Result<Execution, ExecuteError> {
        let template = self
            .template(&request.template)
            .ok_or_else(|| ExecuteError::UnknownTemplate(request.template.clone()))?;
        if let Some(reason) = &self.unavailable {
            return Err(ExecuteError::Unavailable(reason.clone()));
        }
        let Ran {
            outcome,
            pages_copied,
            queue,
            cpu,
            vm,
        } = self
            .run(&template, request, live_output)
            .map_err(|error| launch_failure(&template, error))?;
        let stats = &outcome.stats;
        let usage = Usage {
            wall_us: (stats.load + stats.wall).as_micros() as u64,
            cpu_us: cpu.as_micros() as u64,
            peak_memory_bytes: stats.peak_memory,
            pages_copied,
            syscalls: stats.syscalls,
            exits: stats.exits,
            threads_created: stats.threads.created,
            thread_switches: stats.threads.switches,
            network: stats.network,
            processes_created: stats.processes_created,
        };
        Ok(Execution {
            status: outcome.status,
            queue,
            vm_setup: stats.load,
            run: stats.wall,
            usage,
            vm,
            stdout: outcome.stdout,
            stderr: outcome.stderr,
            result: outcome.result,
            files: outcome.files,
        })
    }

    /// The template's script name, and its VMs' memory size (its snapshot's, else its
    /// runtime's default): the operator chose it when building the template.
    fn complete(&self, request: &mut ExecuteRequest) {
        let Some(template) = self.template(&request.template) else {
            return;
        };
        if request.defaulted.script {
            request.agent_request.argv[0] = template.language.default_script().to_owned();
        }
        if request.defaulted.memory {
            let mib = template
                .snapshot
                .as_ref()
                .map_or(template.language.default_memory_mib(), |s| {
                    s.identity().mem_bytes >> 20
                });
            request.limits.memory_mib = mib;
        }
    }

    fn templates(&self) -> Vec<TemplateInfo> {
        self.templates
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|t| TemplateInfo {
                name: t.name.clone(),
                content_hash: t.content_hash.clone(),
                language: t.language.name().to_owned(),
                languages: t
                    .language
                    .languages()
                    .iter()
                    .map(|l| (*l).to_owned())
                    .collect(),
                ready: self.unavailable.is_none(),
            })
            .collect()
    }

    fn health(&self) -> Health {
        Health {
            kvm: self.unavailable.clone().map_or(Ok(()), Err),
            templates: self
                .templates
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .len(),
        }
    }

    fn load_template(
        &self,
        name: &str,
    ) -> Result<Option<Arc<crate::snapshot::Template>>, ExecuteError> {
        let Some(dir) = &self.templates_dir else {
            return Err(ExecuteError::Rejected(
                "this daemon does not load templates".to_owned(),
            ));
        };
        templates::check_folder_name(name).map_err(ExecuteError::Rejected)?;
        if !dir.join(name).is_dir() {
            return Err(ExecuteError::UnknownTemplate(name.to_owned()));
        }
        let template = templates::load_one(dir, name)
            .map_err(|error| ExecuteError::Rejected(error.to_string()))?;
        let pool = self
            .start_pool(&template)
            .map_err(|error| ExecuteError::Internal(format!("template '{name}': {error}")))?;
        // The pool first, then the template: a request that finds the new template finds its
        // pool. A replaced pool stops when its last running request lets go of it.
        {
            let mut pools = self.pools.write().unwrap_or_else(PoisonError::into_inner);
            pools.retain(|(n, _)| n != name);
            if let Some(pool) = pool {
                pools.push((name.to_owned(), Arc::new(pool)));
            }
        }
        let mut templates = self
            .templates
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        templates.retain(|t| t.name != name);
        let snapshot = template.snapshot.clone();
        templates.push(Arc::new(template));
        templates.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(snapshot)
    }

    fn unload_template(&self, name: &str) -> bool {
        let removed = {
            let mut templates = self
                .templates
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let before = templates.len();
            templates.retain(|t| t.name != name);
            templates.len() != before
        };
        let pool = {
            let mut pools = self.pools.write().unwrap_or_else(PoisonError::into_inner);
            pools
                .iter()
                .position(|(n, _)| n == name)
                .map(|i| pools.remove(i))
        };
        // Dropped outside the lock: stopping a pool joins its workers.
        drop(pool);
        removed
    }

    fn pools(&self) -> Vec<PoolStats> {
        let pools = self.pools.read().unwrap_or_else(PoisonError::into_inner);
        pools.iter().map(|(_, pool)| pool.stats()).collect()
    }
}
