//! The run loop's scheduler: applies each system call's outcome to the vCPU and hands the one
//! vCPU from guest thread to guest thread (the policy, and the state it works on, are
//! `process::threads`).
//!
//! Why one vCPU with cooperative switching plus slice preemption: every system call already
//! leaves the VM and is answered here, one at a time, so switching threads at calls that
//! block costs a register save and load on a path that runs anyway, and the VMM-side state
//! (fds, memory map, futex waiters) needs no locking. A second vCPU per thread would need all
//! of that shared between host threads, and the guest's CPUs would compete with other VMs'
//! for the host's two cores anyway. Blocking alone is not enough: a thread spinning in user
//! code (a busy-wait on a flag, a CPU-bound loop while another thread's timer expires, Python's
//! GIL holder while a waiter's 5 ms switch interval runs out) would starve the others, so a
//! thread's slice ends after `QUANTUM` or at the next timer of a waiting thread: the vCPU is
//! kicked out of guest mode by the same watchdog that enforces the run's deadline, and if it
//! was in program code, the thread is saved as it is and the next one runs.
//!
//! A switch saves the running thread's user state (general registers, rip, rflags, FS/GS
//! base, XSAVE area) into the thread table and loads the next one's: a few ioctls, no exit
//! of its own. Nothing is saved while only one thread exists.

use std::io;
use std::time::Instant;

use crate::cpu::{CpuSnapshot, GuestCpu};
use crate::memory::GuestMemory;
use crate::process::threads::{Call, Next, Resume, Wait, WaitOn, QUANTUM};
use crate::process::GuestProcess;
use crate::status::RunStatus;
use crate::syscalls::{self, SyscallOutcome};
use crate::vm::LoopEnd;

pub struct Scheduler {
    /// The thread whose registers the vCPU holds.
    on_cpu: u64,
    /// When the running thread's slice ends (None: not while nothing else could run).
    slice_end: Option<Instant>,
    /// The slice ended while the vCPU was in the stubs: switch at the next system call.
    switch_due: bool,
    deadline: Instant,
    limit_ms: u64,
}

impl Scheduler {
    /// For a run of `process` until `deadline` (reported as a limit of `limit_ms`).
    pub fn new(cpu: &dyn GuestCpu, process: &mut GuestProcess, deadline: Instant, limit_ms: u64) -> Scheduler {
        process.threads.switching = cpu.switches_threads();
        let mut sched = Scheduler { on_cpu: process.threads.current_tid(), slice_end: None, switch_due: false, deadline, limit_ms };
        sched.start_slice(process);
        sched
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// How the run ends at its deadline.
    pub fn timeout(&self) -> RunStatus {
        RunStatus::Timeout { limit_ms: self.limit_ms }
    }

    /// What the vCPU may run until: the run's deadline or the end of the slice.
    pub fn run_until(&self) -> Instant {
        self.slice_end.map_or(self.deadline, |end| end.min(self.deadline))
    }

    /// Answers system call `call` of the running thread; Some when the run ends.
    pub fn syscall(&mut self, cpu: &mut dyn GuestCpu, process: &mut GuestProcess, mem: &GuestMemory, call: Call) -> io::Result<Option<LoopEnd>> {
        let outcome = syscalls::dispatch(process, mem, call.nr, call.args);
        self.apply(cpu, process, mem, outcome, call)
    }

    /// `run` returned DeadlineReached before the run's deadline: the slice ended.
    pub fn slice_ended(&mut self, cpu: &mut dyn GuestCpu, process: &mut GuestProcess, mem: &GuestMemory) -> io::Result<Option<LoopEnd>> {
        process.threads.expire_timers(Instant::now());
        if !process.threads.others_runnable() {
            self.start_slice(process);
            return Ok(None);
        }
        match cpu.interrupted_state()? {
            Some(state) => {
                let tid = process.threads.current_tid();
                process.threads.set_context(tid, state);
                process.threads.requeue_current(Resume::AsSaved);
                process.threads.counters.preemptions += 1;
                let step = self.switch_step(cpu, process)?;
                self.follow(cpu, process, mem, step)
            }
            None => {
                self.slice_end = None;
                self.switch_due = true;
                Ok(None)
            }
        }
    }

    /// Applies one system call's outcome: resumes the thread, or switches to another, or
    /// ends the run.
    pub fn apply(&mut self, cpu: &mut dyn GuestCpu, process: &mut GuestProcess, mem: &GuestMemory, outcome: SyscallOutcome, call: Call) -> io::Result<Option<LoopEnd>> {
        let step = self.step(cpu, process, outcome, call)?;
        self.follow(cpu, process, mem, step)
    }

    /// Carries out `step`: a readiness wait retried on switching in is answered here too (a
    /// loop, not recursion, however often waits retry).
    fn follow(&mut self, cpu: &mut dyn GuestCpu, process: &mut GuestProcess, mem: &GuestMemory, mut step: Step) -> io::Result<Option<LoopEnd>> {
        loop {
            match step {
                Step::Resume => return Ok(None),
                Step::End(end) => return Ok(Some(end)),
                Step::Retry { call, final_attempt } => {
                    process.threads.current_mut().last_attempt = final_attempt;
                    let outcome = syscalls::dispatch(process, mem, call.nr, call.args);
                    if let Some(thread) = process.threads.get_mut(process.threads.current_tid()) {
                        thread.last_attempt = false;
                    }
                    step = self.step(cpu, process, outcome, call)?;
                }
            }
        }
    }

    fn step(&mut self, cpu: &mut dyn GuestCpu, process: &mut GuestProcess, outcome: SyscallOutcome, call: Call) -> io::Result<Step> {
        Ok(match outcome {
            SyscallOutcome::Return(value) => {
                process.threads.progress();
                if self.slice_over() && process.threads.others_runnable() {
                    process.threads.requeue_current(Resume::Return(value));
                    self.switch_step(cpu, process)?
                } else {
                    cpu.set_syscall_return(value)?;
                    self.extend_slice(process);
                    Step::Resume
                }
            }
            SyscallOutcome::SetFsBase(base) => {
                process.threads.progress();
                cpu.set_fs_base(base)?;
                cpu.set_syscall_return(0)?;
                Step::Resume
            }
            SyscallOutcome::Stop(status) => Step::End(LoopEnd::Finished(status)),
            SyscallOutcome::ReadyPoint if process.threads.alive() == 1 => Step::End(LoopEnd::ReadyPoint { call: call.args }),
            SyscallOutcome::ReadyPoint => {
                process.threads.block_current(Wait { on: WaitOn::Request, until: None });
                self.switch_step(cpu, process)?
            }
            SyscallOutcome::Block(wait) => {
                process.threads.block_current(wait);
                self.switch_step(cpu, process)?
            }
            SyscallOutcome::Yield => {
                process.threads.progress();
                if process.threads.others_runnable() {
                    process.threads.requeue_current(Resume::Return(0));
                    self.switch_step(cpu, process)?
                } else {
                    cpu.set_syscall_return(0)?;
                    Step::Resume
                }
            }
            SyscallOutcome::Spawned(start) => {
                process.threads.progress();
                let mut state = cpu.snapshot()?;
                state.regs.rax = 0;
                if start.stack != 0 {
                    state.regs.rsp = start.stack;
                }
                if let Some(tls) = start.tls {
                    state.fs_base = tls;
                }
                process.threads.set_context(start.tid, state);
                cpu.set_syscall_return(start.tid)?;
                self.extend_slice(process);
                Step::Resume
            }
            SyscallOutcome::ThreadExited => {
                process.threads.progress();
                self.switch_step(cpu, process)?
            }
        })
    }

    /// The current thread no longer runs (it waits, yielded, exited or was preempted): gives
    /// the vCPU to the next runnable thread, sleeping on the host while every thread waits for
    /// a timer, and ends the run at the deadline, at a deadlock, or at the agent's ready point.
    fn switch_step(&mut self, cpu: &mut dyn GuestCpu, process: &mut GuestProcess) -> io::Result<Step> {
        self.switch_due = false;
        loop {
            match process.threads.next(Instant::now()) {
                Next::Run { tid, resume } => {
                    self.load(cpu, process, tid)?;
                    self.start_slice(process);
                    return Ok(match resume {
                        Resume::AsSaved => Step::Resume,
                        Resume::Return(value) => {
                            cpu.set_syscall_return(value)?;
                            Step::Resume
                        }
                        Resume::Retry { call, final_attempt } => Step::Retry { call, final_attempt },
                    });
                }
                Next::SleepUntil(until) => {
                    let now = Instant::now();
                    if until >= self.deadline {
                        std::thread::sleep(self.deadline.saturating_duration_since(now));
                        return Ok(Step::End(LoopEnd::Finished(self.timeout())));
                    }
                    std::thread::sleep(until.saturating_duration_since(now));
                }
                Next::ReadyPoint { tid } => {
                    self.load(cpu, process, tid)?;
                    let state = cpu.snapshot()?;
                    let r = &state.regs;
                    return Ok(Step::End(LoopEnd::ReadyPoint { call: [r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9] }));
                }
                Next::Deadlock { threads } => return Ok(Step::End(LoopEnd::Finished(RunStatus::Deadlocked { threads }))),
            }
        }
    }

    /// Puts thread `tid` (now current) on the vCPU, saving the registers of the one there
    /// unless it exited or they are saved already (a preempted thread's).
    fn load(&mut self, cpu: &mut dyn GuestCpu, process: &mut GuestProcess, tid: u64) -> io::Result<()> {
        if self.on_cpu == tid {
            // A thread preempted and picked again at once (the readiness waiters made runnable
            // in `next` queue behind it) still holds the vCPU: the registers saved at the
            // preemption are the vCPU's own and must go, or a later switch would not save the
            // thread's newer state and would resume it at the preemption point instead.
            process.threads.take_context(tid);
            return Ok(());
        }
        if process.threads.get(self.on_cpu).is_some_and(|t| t.context.is_none()) {
            let state = cpu.snapshot()?;
            process.threads.set_context(self.on_cpu, state);
        }
        let state: CpuSnapshot = process.threads.take_context(tid).ok_or_else(|| io::Error::other(format!("thread {tid} has no saved registers")))?;
        cpu.load_thread(&state)?;
        self.on_cpu = tid;
        process.threads.counters.switches += 1;
        Ok(())
    }

    /// A new slice for the thread just switched in: `QUANTUM` while another thread is
    /// runnable, cut short by the earliest timer of a waiting one; none if neither.
    fn start_slice(&mut self, process: &GuestProcess) {
        let quantum = process.threads.others_runnable().then(|| Instant::now() + QUANTUM);
        self.slice_end = [quantum, process.threads.next_timer_of_others()].into_iter().flatten().min();
    }

    /// After a call that may have made another thread runnable (a wake, a new thread): the
    /// running thread gets a slice if it had none.
    fn extend_slice(&mut self, process: &GuestProcess) {
        if self.slice_end.is_none() && process.threads.alive() > 1 {
            self.start_slice(process);
        }
    }

    fn slice_over(&self) -> bool {
        self.switch_due || self.slice_end.is_some_and(|end| Instant::now() >= end)
    }
}

/// What happens after one outcome is applied.
enum Step {
    /// The vCPU runs on (the same thread or another).
    Resume,
    End(LoopEnd),
    /// The thread switched in makes its readiness call again.
    Retry { call: Call, final_attempt: bool },
}
