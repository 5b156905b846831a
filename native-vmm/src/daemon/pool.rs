//! A template's warm pool: VMs created ahead of demand, so that a request takes a ready VM
//! instead of waiting for one to be restored.
//!
//! A vCPU belongs to the thread that created it (KVM vCPUs are best run there; the ptrace
//! test CPU must be), so a pooled VM never changes threads. The pool is a set of worker
//! threads, each holding at most one VM: a worker restores its VM from the template's
//! snapshot, waits for a request on the template's queue, serves it on the VM it holds,
//! answers, destroys the VM (a used VM is never reused) and at once restores the next one:
//! the background refill. `target` is the number of workers; `ready` counts the workers
//! holding a VM and waiting for a request.
//!
//! A request's wait is split honestly: the part during which the VM that serves it was still
//! being created is `fork_wait` (zero when a ready VM was waiting), the rest is `queue_wait`
//! (every worker was busy serving). What creating VMs ahead of time costs is in `PoolStats`.

use std::collections::VecDeque;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::agent::AgentRequest;
use crate::daemon::executor::PoolStats;
use crate::snapshot::{self, ForkMemory, Restored, Template};
use crate::vm::{LaunchError, RunLimits};

use super::agent_executor::{thread_cpu_time, SharedRestoreFactory};

/// What a pooled run gives back to the request that waited for it.
pub struct PooledRun {
    pub restored: Restored,
    /// Waiting while every worker was busy serving other requests.
    pub queue_wait: Duration,
    /// Waiting while the VM that served the request was being created, plus readying it.
    pub fork_wait: Duration,
    /// CPU time of the worker thread for this request (not for creating its VM).
    pub cpu: Duration,
}

/// One request waiting for a worker.
struct Job {
    request: AgentRequest,
    limits: RunLimits,
    enqueued: Instant,
    reply: mpsc::Sender<Result<PooledRun, LaunchError>>,
}

struct Queue {
    jobs: VecDeque<Job>,
    /// Workers holding a created VM and waiting for a job.
    ready: u64,
    stopping: bool,
}

struct Shared {
    template: Arc<Template>,
    restore: Arc<SharedRestoreFactory>,
    memory: ForkMemory,
    queue: Mutex<Queue>,
    /// Signalled when a job is queued or the pool stops.
    work: Condvar,
    forks: AtomicU64,
    /// Total time spent creating VMs ahead of requests, in microseconds.
    fork_micros: AtomicU64,
    served: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue stays consistent across a panicking holder (none of its updates can be
        // half done): recover it.
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub struct Pool {
    name: String,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts `size` workers (at least one) for `template`, each restoring VMs with `restore`
    /// on memory made as `memory` says.
    pub fn start(name: &str, template: Arc<Template>, restore: Arc<SharedRestoreFactory>, memory: ForkMemory, size: usize) -> io::Result<Pool> {
        let shared = Arc::new(Shared {
            template,
            restore,
            memory,
            queue: Mutex::new(Queue { jobs: VecDeque::new(), ready: 0, stopping: false }),
            work: Condvar::new(),
            forks: AtomicU64::new(0),
            fork_micros: AtomicU64::new(0),
            served: AtomicU64::new(0),
        });
        let mut pool = Pool { name: name.to_owned(), shared, workers: Vec::new() };
        for index in 0..size.max(1) {
            let shared = pool.shared.clone();
            // A failed spawn drops `pool`, which stops the workers already started.
            let worker = thread::Builder::new().name(format!("sandfork-pool-{index}")).spawn(move || work(&shared))?;
            pool.workers.push(worker);
        }
        Ok(pool)
    }

    /// Runs `request` on the next pooled VM, waiting for one as long as it takes.
    pub fn run(&self, request: AgentRequest, limits: RunLimits) -> Result<PooledRun, LaunchError> {
        let (reply, answer) = mpsc::channel();
        self.shared.lock().jobs.push_back(Job { request, limits, enqueued: Instant::now(), reply });
        self.shared.work.notify_one();
        // A worker that panicked mid-job dropped the sender without answering.
        answer.recv().unwrap_or_else(|_| Err(LaunchError::Cpu(io::Error::other("the pooled VM serving the request panicked"))))
    }

    pub fn stats(&self) -> PoolStats {
        let forks = self.shared.forks.load(Ordering::Relaxed);
        PoolStats {
            template: self.name.clone(),
            ready: self.shared.lock().ready,
            target: self.workers.len() as u64,
            forks,
            fork_us_mean: self.shared.fork_micros.load(Ordering::Relaxed).checked_div(forks).unwrap_or(0),
            served: self.shared.served.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Pool {
    /// Stops the workers (each destroys the VM it holds) and waits for them. Jobs still queued
    /// are answered by the workers before they stop.
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.work.notify_all();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// A worker's life: create a VM, wait for a job, serve it, destroy the VM, again. A panic
/// ends only the VM and job at hand (the job's sender is dropped unanswered): a pool whose
/// workers died would leave its requests waiting forever.
fn work(shared: &Shared) {
    loop {
        match panic::catch_unwind(AssertUnwindSafe(|| serve_one(shared))) {
            Ok(true) => {}
            Ok(false) => return,
            Err(_) => super::log(format_args!("pool: a worker panicked; its VM is destroyed and the worker goes on")),
        }
    }
}

/// Creates one VM, serves it one job and destroys it; false when the pool is stopping.
fn serve_one(shared: &Shared) -> bool {
    let creating = Instant::now();
    let mem = match shared.template.new_memory(shared.memory) {
        Ok(mem) => mem,
        Err(e) => return fail_next_job(shared, LaunchError::Memory(e)),
    };
    let cpu = match (shared.restore)(&mem, shared.template.cpu()) {
        Ok(cpu) => cpu,
        Err(e) => return fail_next_job(shared, LaunchError::Cpu(e)),
    };
    let created = Instant::now();
    shared.forks.fetch_add(1, Ordering::Relaxed);
    shared.fork_micros.fetch_add(created.duration_since(creating).as_micros() as u64, Ordering::Relaxed);
    let Some(job) = next_job(shared, true) else { return false };
    let taken = Instant::now();
    // The part of the job's wait that overlapped creating this VM was a wait for the VM.
    let fork_wait = created.saturating_duration_since(job.enqueued.max(creating));
    let queue_wait = taken.duration_since(job.enqueued).saturating_sub(fork_wait);
    let cpu_before = thread_cpu_time();
    let result = snapshot::serve_fork(&shared.template, &mem, cpu, taken, job.request, &job.limits).map(|restored| {
        let fork_wait = fork_wait + restored.outcome.stats.load;
        PooledRun { restored, queue_wait, fork_wait, cpu: thread_cpu_time().saturating_sub(cpu_before) }
    });
    shared.served.fetch_add(1, Ordering::Relaxed);
    let _ = job.reply.send(result);
    // The used VM (`mem`, and its vCPU with it) is destroyed here, before the next is created.
    true
}

/// A worker that could not create a VM answers the next job with why (rather than leaving
/// requests waiting on a pool that cannot refill); false when the pool is stopping.
fn fail_next_job(shared: &Shared, error: LaunchError) -> bool {
    super::log(format_args!("pool: creating a VM failed: {error}"));
    match next_job(shared, false) {
        Some(job) => {
            let _ = job.reply.send(Err(error));
            true
        }
        None => false,
    }
}

/// Waits for the next job; counted `ready` while waiting when it holds a VM. None once the
/// pool is stopping and no job is left.
fn next_job(shared: &Shared, holding_vm: bool) -> Option<Job> {
    let mut queue = shared.lock();
    queue.ready += u64::from(holding_vm);
    let job = loop {
        if let Some(job) = queue.jobs.pop_front() {
            break Some(job);
        }
        if queue.stopping {
            break None;
        }
        queue = shared.work.wait(queue).unwrap_or_else(|poisoned| poisoned.into_inner());
    };
    queue.ready -= u64::from(holding_vm);
    job
}
