//! A template's warm pool: VMs created ahead of demand and reused, so that a request takes a
//! ready VM instead of waiting for one to be restored, and finds its pages already mapped.
//!
//! A vCPU belongs to the thread that created it (KVM vCPUs are best run there; the ptrace
//! test CPU must be), so a pooled VM never changes threads. The pool is a set of worker
//! threads, each holding at most one VM: a worker restores its VM from the template's
//! snapshot, warms it up (an empty program, then a reset: `warm_up`), waits for a request on
//! the template's queue, serves it on the VM it holds and answers. Then, off the request path,
//! it resets the VM to the template (`snapshot::reset`: the pages the request dirtied get the
//! template's bytes back, the vCPU the snapshot's state), so the next request runs on host
//! pages and KVM mappings that are already warm: a fresh fork pays a fault for every page it
//! touches first. A VM is retired (destroyed, and a fresh one restored in its place) after
//! `MAX_RESETS` resets, when its run did not end in a normal exit (crash, timeout, memory or
//! output limit, unsupported call, VMM error: nothing of such a VM is trusted again), when it
//! holds more than `MAX_WARM_PAGES` copied pages, and when its backend cannot be reset. `target` is the number of workers; `ready` counts the
//! workers holding a VM and waiting for a request.
//!
//! A request's wait is split honestly: the part during which the VM that serves it was still
//! being created is `fork_wait` (zero when a ready VM was waiting), the rest is `queue_wait`
//! (every worker was busy serving). What creating and resetting VMs ahead of time costs is in
//! `PoolStats`.

use std::collections::VecDeque;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::agent::AgentRequest;
use crate::cpu::GuestCpu;
use crate::daemon::executor::{PoolStats, SharedRestoreFactory};
use crate::layout::pages_in;
use crate::memory::GuestMemory;
use crate::snapshot::{self, ForkMemory, Restored, Template};
use crate::status::RunStatus;
use crate::sys::{self, thread_cpu_time};
use crate::vm::{LaunchError, RunLimits};

/// Resets after which a VM is retired anyway: bounds what one VM's lifetime can accumulate that
/// a reset might miss (host-side state, KVM's own).
pub const MAX_RESETS: u64 = 1000;
/// Copied pages (16 MiB) beyond which a VM is retired instead of reset: writing them all back
/// would cost more than a fresh fork, and an idle VM should not hold that much memory.
pub const MAX_WARM_PAGES: u64 = 4096;

/// What a pooled run gives back to the request that waited for it.
pub struct PooledRun {
    /// Its `pages_copied` counts the pages this request made the VM copy.
    pub restored: Restored,
    /// How many requests the VM served before this one (0: a fresh fork).
    pub resets: u64,
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
    resets: AtomicU64,
    /// Total time spent resetting VMs after their requests, in microseconds.
    reset_micros: AtomicU64,
    /// Total pages those resets wrote back.
    reset_pages: AtomicU64,
    served: AtomicU64,
    /// Whether new VMs are warmed up (`warm_up`): copy-on-write forks are, until a warm-up fails.
    warm_up: Mutex<WarmUp>,
}

#[derive(Debug, PartialEq, Eq)]
enum WarmUp {
    On,
    /// The pool's forks are full copies, never reused: nothing to warm up.
    Off,
    /// Why a warm-up failed; the pool's VMs go unwarmed since.
    Failed(String),
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue stays consistent across a panicking holder (none of its updates can be
        // half done): recover it.
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn warm_up(&self) -> MutexGuard<'_, WarmUp> {
        // One assignment at a time: whole across a panicking holder.
        self.warm_up
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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
    pub fn start(
        name: &str,
        template: Arc<Template>,
        restore: Arc<SharedRestoreFactory>,
        memory: ForkMemory,
        size: usize,
    ) -> io::Result<Pool> {
        let shared = Arc::new(Shared {
            template,
            restore,
            memory,
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                ready: 0,
                stopping: false,
            }),
            work: Condvar::new(),
            forks: AtomicU64::new(0),
            fork_micros: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            reset_micros: AtomicU64::new(0),
            reset_pages: AtomicU64::new(0),
            served: AtomicU64::new(0),
            warm_up: Mutex::new(if memory == ForkMemory::CopyOnWrite {
                WarmUp::On
            } else {
                WarmUp::Off
            }),
        });
        let mut pool = Pool {
            name: name.to_owned(),
            shared,
            workers: Vec::new(),
        };
        for index in 0..size.max(1) {
            let shared = pool.shared.clone();
            // A failed spawn drops `pool`, which stops the workers already started.
            let worker = thread::Builder::new()
                .name(format!("sandfork-pool-{index}"))
                .spawn(move || work(&shared))?;
            pool.workers.push(worker);
        }
        Ok(pool)
    }

    /// Runs `request` on the next pooled VM, waiting for one as long as it takes.
    pub fn run(&self, request: AgentRequest, limits: RunLimits) -> Result<PooledRun, LaunchError> {
        let (reply, answer) = mpsc::channel();
        self.shared.lock().jobs.push_back(Job {
            request,
            limits,
            enqueued: Instant::now(),
            reply,
        });
        self.shared.work.notify_one();
        // A worker that panicked mid-job dropped the sender without answering.
        answer.recv().unwrap_or_else(|_| {
            Err(LaunchError::Cpu(io::Error::other(
                "the pooled VM serving the request panicked",
            )))
        })
    }

    pub fn stats(&self) -> PoolStats {
        let forks = self.shared.forks.load(Ordering::Relaxed);
        let resets = self.shared.resets.load(Ordering::Relaxed);
        PoolStats {
            template: self.name.clone(),
            ready: self.shared.lock().ready,
            target: self.workers.len() as u64,
            forks,
            fork_us_mean: self
                .shared
                .fork_micros
                .load(Ordering::Relaxed)
                .checked_div(forks)
                .unwrap_or(0),
            resets,
            reset_us_mean: self
                .shared
                .reset_micros
                .load(Ordering::Relaxed)
                .checked_div(resets)
                .unwrap_or(0),
            reset_pages_mean: self
                .shared
                .reset_pages
                .load(Ordering::Relaxed)
                .checked_div(resets)
                .unwrap_or(0),
            served: self.shared.served.load(Ordering::Relaxed),
            warm_up: match &*self.shared.warm_up() {
                WarmUp::On => "on".to_owned(),
                WarmUp::Off => "off".to_owned(),
                WarmUp::Failed(reason) => format!("failed: {reason}"),
            },
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

/// A worker's life: create a VM, serve jobs on it (resetting it between them) until it is
/// retired, again. A panic ends only the VM and job at hand (the job's sender is dropped
/// unanswered): a pool whose workers died would leave its requests waiting forever.
fn work(shared: &Shared) {
    loop {
        match panic::catch_unwind(AssertUnwindSafe(|| serve_vm(shared))) {
            Ok(true) => {}
            Ok(false) => return,
            Err(_) => super::log(format_args!(
                "pool: a worker panicked; its VM is destroyed and the worker goes on"
            )),
        }
    }
}

/// Creates one VM and serves jobs on it until it is retired (then it is destroyed here);
/// false when the pool is stopping.
fn serve_vm(shared: &Shared) -> bool {
    let creating = Instant::now();
    let mem = match shared.template.new_memory(shared.memory) {
        Ok(mem) => mem,
        Err(e) => return fail_next_job(shared, LaunchError::Memory(e)),
    };
    // Restored, with the memory its template reaches already mapped (the run would map it on
    // the request's path otherwise).
    let restored = (shared.restore)(&mem, shared.template.cpu())
        .and_then(|mut cpu| cpu.map_memory(shared.template.handed_out()).map(|()| cpu));
    let cpu = match restored {
        Ok(cpu) => cpu,
        Err(e) => return fail_next_job(shared, LaunchError::Cpu(e)),
    };
    // The pages the VM holds copies of, as of its last reset (none for an unwarmed fork).
    let warms_up = *shared.warm_up() == WarmUp::On;
    let (mut cpu, mut warm) = if warms_up {
        match warm_up(shared, &mem, cpu) {
            Ok(warmed) => warmed,
            Err(e) => {
                // Nothing of a VM whose run went wrong is trusted: it is destroyed, and this
                // pool's VMs serve unwarmed from now on rather than fail the same way again.
                super::log(format_args!(
                    "pool: warming a new VM up failed, the pool's VMs go unwarmed: {e}"
                ));
                *shared.warm_up() = WarmUp::Failed(e.to_string());
                return true;
            }
        }
    } else {
        (cpu, Vec::new())
    };
    let mut ready_at = Instant::now();
    shared.forks.fetch_add(1, Ordering::Relaxed);
    shared.fork_micros.fetch_add(
        ready_at.duration_since(creating).as_micros() as u64,
        Ordering::Relaxed,
    );
    let mut resets = 0;
    loop {
        let Some(job) = next_job(shared, true) else {
            return false;
        };
        let taken = Instant::now();
        // The part of the job's wait that overlapped readying this VM was a wait for the VM.
        let fork_wait = ready_at.saturating_duration_since(job.enqueued.max(creating));
        let queue_wait = taken.duration_since(job.enqueued).saturating_sub(fork_wait);
        let cpu_before = thread_cpu_time();
        let faults_before = sys::thread_page_faults().ok();
        let served =
            snapshot::serve_fork(&shared.template, &mem, cpu, taken, job.request, &job.limits);
        shared.served.fetch_add(1, Ordering::Relaxed);
        let (outcome, used_cpu) = match served {
            Ok(served) => served,
            Err(e) => {
                let _ = job.reply.send(Err(e));
                return true;
            }
        };
        let copied = copied_ranges(&mem, resets, &warm, faults_before);
        let copied_pages = match &copied {
            Some(ranges) => pages_in(ranges),
            None => snapshot::pages_copied(&mem).unwrap_or(0),
        };
        let pages_copied = copied_pages.saturating_sub(pages_in(&warm));
        let reusable = matches!(outcome.status, RunStatus::Exited { .. })
            && resets < MAX_RESETS
            && copied_pages <= MAX_WARM_PAGES
            && copied.is_some();
        let fork_wait = fork_wait + outcome.stats.load;
        let run = PooledRun {
            restored: Restored {
                outcome,
                pages_copied,
            },
            resets,
            queue_wait,
            fork_wait,
            cpu: thread_cpu_time().saturating_sub(cpu_before),
        };
        let _ = job.reply.send(Ok(run));
        cpu = used_cpu;
        let Some(copied) = copied.filter(|_| reusable) else {
            return true;
        };
        let resetting = Instant::now();
        let pages = match reset(shared, &mem, cpu.as_mut(), &copied) {
            Ok(pages) => pages,
            Err(e) => {
                super::log(format_args!(
                    "pool: resetting a VM failed, it is retired: {e}"
                ));
                return true;
            }
        };
        warm = copied;
        ready_at = Instant::now();
        resets += 1;
        shared.resets.fetch_add(1, Ordering::Relaxed);
        shared.reset_micros.fetch_add(
            ready_at.duration_since(resetting).as_micros() as u64,
            Ordering::Relaxed,
        );
        shared.reset_pages.fetch_add(pages, Ordering::Relaxed);
    }
}

/// A warmed-up vCPU and the pages its VM now holds copies of.
type WarmedUp<'m> = (Box<dyn GuestCpu + 'm>, Vec<(u64, u64)>);

/// Readies a new VM as a reset one: runs an empty program on it and resets it, before it is
/// counted ready. A fork's first run pays a fault for every page it touches, many times what a
/// reset VM's run costs, and most of those pages every run touches: the interpreter's, the
/// agent's. Answers the vCPU and the pages
/// the VM now holds copies of.
fn warm_up<'m>(
    shared: &Shared,
    mem: &'m GuestMemory,
    cpu: Box<dyn GuestCpu + 'm>,
) -> io::Result<WarmedUp<'m>> {
    let limits = RunLimits {
        mem_bytes: shared.template.identity().mem_bytes,
        ..RunLimits::default()
    };
    let (outcome, mut cpu) = snapshot::serve_fork(
        &shared.template,
        mem,
        cpu,
        Instant::now(),
        AgentRequest::new(""),
        &limits,
    )
    .map_err(|e| io::Error::other(e.to_string()))?;
    // As after a request: a VM whose run did not end in an exit is not reused.
    if !matches!(outcome.status, RunStatus::Exited { .. }) {
        return Err(io::Error::other(format!(
            "the empty program ended {}",
            outcome.status
        )));
    }
    let copied = mem
        .copied_ranges()?
        .ok_or_else(|| io::Error::other("its copied pages cannot be known"))?;
    reset(shared, mem, cpu.as_mut(), &copied)?;
    Ok((cpu, copied))
}

/// The pages a VM holds copies of after a run. A copy is made in a page fault taken by the
/// thread that runs the VM (the guest's write, through KVM, or the VMM's own), so a reset VM
/// whose run took no fault holds exactly its warm pages, and the scan is skipped.
/// None when they cannot be known (the pagemap cannot be read, a memory that is no fork): the
/// VM is then not reused.
fn copied_ranges(
    mem: &GuestMemory,
    resets: u64,
    warm: &[(u64, u64)],
    faults_before: Option<u64>,
) -> Option<Vec<(u64, u64)>> {
    let no_fault =
        resets > 0 && faults_before.is_some() && sys::thread_page_faults().ok() == faults_before;
    if no_fault {
        return Some(warm.to_vec());
    }
    match mem.copied_ranges() {
        Ok(ranges) => ranges,
        Err(e) => {
            super::log(format_args!(
                "pool: counting a VM's copied pages failed, it is retired: {e}"
            ));
            None
        }
    }
}

/// `snapshot::reset` for the pool's forks, then the memory its template reaches mapped again:
/// the VM as ready as a new one; answers the pages written back. Copy forks (the ptrace test
/// CPU) are never reused.
fn reset(
    shared: &Shared,
    mem: &GuestMemory,
    cpu: &mut dyn GuestCpu,
    copied: &[(u64, u64)],
) -> io::Result<u64> {
    if shared.memory != ForkMemory::CopyOnWrite {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "only copy-on-write forks are reset",
        ));
    }
    let pages = snapshot::reset(&shared.template, mem, cpu, copied)?;
    cpu.map_memory(shared.template.handed_out())?;
    Ok(pages)
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
        queue = shared
            .work
            .wait(queue)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
    };
    queue.ready -= u64::from(holding_vm);
    job
}
