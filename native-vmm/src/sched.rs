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
//! thread's slice ends after `QUANTUM` while another thread could run (a readiness waiter the
//! progress since may have answered counts) or at the next timer of a waiting thread: the vCPU is
//! kicked out of guest mode by the same watchdog that enforces the run's deadline, and if it
//! was in program code, the thread is saved as it is and the next one runs.
//!
//! Signals are taken here, where Linux takes them on the way back to user mode: as a system
//! call returns, as a waiting thread is interrupted (-EINTR), and when the vCPU is kicked out
//! of program code at the interval timer's expiry; a handler runs on a frame pushed below the
//! thread's registers (`process::signals`), and rt_sigreturn resumes them.
//!
//! A switch saves the running thread's user state (general registers, rip, rflags, FS/GS
//! base, XSAVE area) into the thread table and loads the next one's: a few ioctls, no exit
//! of its own. Nothing is saved while only one thread exists.

use std::io;
use std::time::{Duration, Instant};

use crate::agent::AWAIT_REQUEST_SYSCALL;
use crate::cpu::{CpuSnapshot, GuestCpu};
use crate::errno::Errno;
use crate::memory::GuestMemory;
use crate::process::signals::{self, Taken, SA_RESTART, SIG_DFL};
use crate::process::threads::{Call, Next, Resume, Wait, WaitOn, QUANTUM};
use crate::process::{GuestProcess, SigAction};
use crate::status::{GuestFault, RunStatus};
use crate::syscalls::{self, SyscallOutcome};

const GENERAL_PROTECTION: u8 = 13;

/// Where the run loop stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoopEnd {
    /// The run ended.
    Finished(RunStatus),
    /// The agent made AWAIT_REQUEST with no request pending: the template's ready point. The
    /// vCPU is stopped inside that call (no return value set yet); `call` holds its arguments.
    ReadyPoint { call: [u64; 6] },
    /// The running process asked for a child (`crate::sandbox` makes it and answers `call`).
    Fork {
        request: crate::syscalls::processes::ForkRequest,
        call: Call,
    },
    /// The running process asked to run another program (`crate::sandbox` loads it, or
    /// answers `call` with why not).
    Exec {
        request: crate::syscalls::processes::ExecRequest,
        call: Call,
    },
    /// Every thread of the running process waits, for a timer (`until`) or for what only
    /// another process of the tree can do; `crate::sandbox` runs another meanwhile.
    Blocked { until: Option<Instant> },
    /// A stop signal stopped the running process (its tree entry says so): `crate::sandbox`
    /// runs none of its threads until SIGCONT continues it, the vCPU left as it was.
    Stopped,
}

impl LoopEnd {
    /// The run's status when no ready point was expected: a program that awaits a request
    /// nobody will send (not an agent, or an agent asking twice) cannot go on.
    pub fn into_status(self) -> RunStatus {
        let unsupported = |nr: u64| RunStatus::Unsupported {
            syscall: nr,
            name: syscalls::name(nr).unwrap_or("unknown"),
        };
        match self {
            LoopEnd::Finished(status) => status,
            LoopEnd::ReadyPoint { .. } => unsupported(AWAIT_REQUEST_SYSCALL),
            // The tree answers these; they end no run.
            LoopEnd::Fork { call, .. } | LoopEnd::Exec { call, .. } => unsupported(call.nr),
            LoopEnd::Blocked { .. } | LoopEnd::Stopped => RunStatus::Deadlocked { threads: 0 },
        }
    }
}

/// How soon a slice that ended while the vCPU was in the stubs is tried again: a thread on its
/// way back to program code from a call is preempted there at the next kick.
const STUB_RETRY: Duration = Duration::from_millis(1);

/// How soon a process of a tree whose threads all wait for host sockets looks at them again
/// when another process could run meanwhile.
const HOST_RECHECK: Duration = Duration::from_millis(1);

pub struct Scheduler {
    /// The thread whose registers the vCPU holds.
    on_cpu: u64,
    /// When the running thread's slice ends (None: not while nothing else could run).
    slice_end: Option<Instant>,
    /// The slice ended while the vCPU was in the stubs: switch at the next system call (or at
    /// the next kick, `STUB_RETRY` later, if the thread returns to program code without one).
    switch_due: bool,
    deadline: Instant,
    limit_ms: u64,
}

impl Scheduler {
    /// For a run of `process` until `deadline` (reported as a limit of `limit_ms`).
    pub fn new(
        cpu: &dyn GuestCpu,
        process: &mut GuestProcess,
        deadline: Instant,
        limit_ms: u64,
    ) -> Scheduler {
        process.threads.switching = cpu.switches_threads();
        let mut sched = Scheduler {
            on_cpu: process.threads.current_tid(),
            slice_end: None,
            switch_due: false,
            deadline,
            limit_ms,
        };
        sched.start_slice(process);
        sched
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Gives a process kept from an earlier run (a session's child) the current run's deadline.
    pub fn set_deadline(&mut self, deadline: Instant, limit_ms: u64) {
        self.deadline = deadline;
        self.limit_ms = limit_ms;
    }

    /// The run's limit as reported at its deadline.
    pub fn limit_ms(&self) -> u64 {
        self.limit_ms
    }

    /// How the run ends at its deadline.
    pub fn timeout(&self) -> RunStatus {
        RunStatus::Timeout {
            limit_ms: self.limit_ms,
        }
    }

    /// What the vCPU may run until: the run's deadline, the end of the slice, or an interval
    /// timer's next expiry.
    pub fn run_until(&self, process: &GuestProcess) -> Instant {
        [
            self.slice_end,
            process.signals.timer.map(|t| t.next),
            signals::next_cpu_timer(process),
        ]
        .into_iter()
        .flatten()
        .fold(self.deadline, Instant::min)
    }

    /// Answers system call `call` of the running thread; Some when the run ends.
    pub fn syscall(
        &mut self,
        cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
        mem: &GuestMemory,
        call: Call,
    ) -> io::Result<Option<LoopEnd>> {
        let outcome = syscalls::dispatch(process, mem, call.nr, call.args);
        self.apply(cpu, process, mem, outcome, call)
    }

    /// Runs the process again after it was `LoopEnd::Blocked`: another process may have done
    /// what its threads wait for, so readiness waits are tried again.
    pub fn resume(
        &mut self,
        cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
        mem: &GuestMemory,
    ) -> io::Result<Option<LoopEnd>> {
        process.threads.progress();
        let step = self.switch_step(cpu, process, mem)?;
        self.follow(cpu, process, mem, step)
    }

    /// The running thread faulted: its handler for the fault's signal starts on a frame below
    /// the faulting state, or, as Linux's forced fault signals do when the thread blocks or
    /// ignores the signal or has no handler for it, the run ends as Crashed.
    pub fn fault(
        &mut self,
        cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
        mem: &GuestMemory,
        fault: GuestFault,
    ) -> io::Result<Option<LoopEnd>> {
        let tid = process.threads.current_tid();
        let crashed = |fault| Ok(Some(LoopEnd::Finished(RunStatus::Crashed { fault })));
        let Some(taken) = signals::take_fault(process, tid, &fault) else {
            return crashed(fault);
        };
        let Some(state) = cpu.fault_state()? else {
            return crashed(fault);
        };
        // No room for the frame: the fault's signal ends the process.
        let no_room = LoopEnd::Finished(RunStatus::Crashed {
            fault: fault.clone(),
        });
        enter_handler(cpu, process, mem, state, taken, Some(&fault), no_room)
    }

    /// `run` returned DeadlineReached before the run's deadline: the slice ended.
    pub fn slice_ended(
        &mut self,
        cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
        mem: &GuestMemory,
    ) -> io::Result<Option<LoopEnd>> {
        let now = Instant::now();
        process.threads.expire_timers(now);
        signals::fire_timers(process, now);
        interrupt_waiters(process);
        let tid = process.threads.current_tid();
        if signals::ready_for(process, tid) != 0 {
            // In the stubs, the signal is taken as the call there returns.
            if let Some(state) = cpu.interrupted_state()? {
                if let Some(end) = self.run_handler(cpu, process, mem, state)? {
                    return Ok(Some(end));
                }
            }
        }
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
                let step = self.switch_step(cpu, process, mem)?;
                self.follow(cpu, process, mem, step)
            }
            None => {
                // In the stubs: on the way to a call's exit the switch is made at that call; on
                // the way back to program code there may be no call again (a spinning thread),
                // so the vCPU is kicked again shortly, to be preempted in program code then.
                self.slice_end = Some(now + STUB_RETRY);
                self.switch_due = true;
                Ok(None)
            }
        }
    }

    /// Applies one system call's outcome: resumes the thread, or switches to another, or
    /// ends the run.
    pub fn apply(
        &mut self,
        cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
        mem: &GuestMemory,
        outcome: SyscallOutcome,
        call: Call,
    ) -> io::Result<Option<LoopEnd>> {
        let step = self.step(cpu, process, mem, outcome, call)?;
        self.follow(cpu, process, mem, step)
    }

    /// Carries out `step`: a readiness wait retried on switching in is answered here too (a
    /// loop, not recursion, however often waits retry).
    fn follow(
        &mut self,
        cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
        mem: &GuestMemory,
        mut step: Step,
    ) -> io::Result<Option<LoopEnd>> {
        loop {
            match step {
                Step::Resume => return Ok(None),
                Step::End(end) => return Ok(Some(end)),
                Step::Retry {
                    call,
                    final_attempt,
                    until,
                } => {
                    let thread = process.threads.current_mut();
                    thread.last_attempt = final_attempt;
                    thread.retry_until = until;
                    let outcome = syscalls::dispatch(process, mem, call.nr, call.args);
                    if let Some(thread) = process.threads.get_mut(process.threads.current_tid()) {
                        thread.last_attempt = false;
                        thread.retry_until = None;
                    }
                    step = self.step(cpu, process, mem, outcome, call)?;
                }
            }
        }
    }

    fn step(
        &mut self,
        cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
        mem: &GuestMemory,
        outcome: SyscallOutcome,
        call: Call,
    ) -> io::Result<Step> {
        Ok(match outcome {
            SyscallOutcome::Return(value) => {
                process.threads.progress();
                if self.slice_over() && process.threads.others_runnable() {
                    process.threads.requeue_current(Resume::Return(value));
                    self.switch_step(cpu, process, mem)?
                } else if let Some(end) = self.return_to_program(cpu, process, mem, value)? {
                    Step::End(end)
                } else {
                    self.extend_slice(process);
                    Step::Resume
                }
            }
            SyscallOutcome::SigReturn => {
                let tid = process.threads.current_tid();
                let rsp = cpu.snapshot()?.regs.rsp;
                match signals::pop_frame(process, mem, tid, rsp) {
                    Some(interrupted) => {
                        if let Some(fault) = put_thread(cpu, &interrupted)? {
                            return Ok(Step::End(fault));
                        }
                        match self.take_signal(cpu, process, mem, None)? {
                            Some(end) => Step::End(end),
                            None => Step::Resume,
                        }
                    }
                    // No handler of this thread returns here: the stack is not what the
                    // program believes.
                    None => Step::End(LoopEnd::Finished(RunStatus::Unsupported {
                        syscall: call.nr,
                        name: "rt_sigreturn",
                    })),
                }
            }
            SyscallOutcome::SetFsBase(base) => {
                process.threads.progress();
                cpu.set_fs_base(base)?;
                cpu.set_syscall_return(0)?;
                Step::Resume
            }
            SyscallOutcome::Stop(status) => Step::End(LoopEnd::Finished(status)),
            SyscallOutcome::ReadyPoint if process.threads.alive() == 1 => {
                Step::End(LoopEnd::ReadyPoint { call: call.args })
            }
            SyscallOutcome::ReadyPoint => {
                process.threads.block_current(Wait {
                    on: WaitOn::Request,
                    until: None,
                });
                self.switch_step(cpu, process, mem)?
            }
            // A signal it would take interrupts the wait before it starts.
            SyscallOutcome::Block(_)
                if signals::ready_for(process, process.threads.current_tid()) != 0 =>
            {
                match self.return_to_program(cpu, process, mem, Errno::EINTR.as_return())? {
                    Some(end) => Step::End(end),
                    None => Step::Resume,
                }
            }
            SyscallOutcome::Block(wait) => {
                process.threads.block_current(wait);
                self.switch_step(cpu, process, mem)?
            }
            SyscallOutcome::Yield => {
                process.threads.progress();
                if process.threads.others_runnable() {
                    process.threads.requeue_current(Resume::Return(0));
                    self.switch_step(cpu, process, mem)?
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
                self.switch_step(cpu, process, mem)?
            }
            SyscallOutcome::Fork(request) => Step::End(LoopEnd::Fork { request, call }),
            SyscallOutcome::Exec(request) => Step::End(LoopEnd::Exec { request, call }),
        })
    }

    /// The current thread no longer runs (it waits, yielded, exited or was preempted): gives
    /// the vCPU to the next runnable thread, sleeping on the host while every thread waits for
    /// a timer, and ends the run at the deadline, at a deadlock, or at the agent's ready point.
    fn switch_step(
        &mut self,
        cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
        mem: &GuestMemory,
    ) -> io::Result<Step> {
        self.switch_due = false;
        loop {
            let now = Instant::now();
            signals::fire_timers(process, now);
            interrupt_waiters(process);
            let timer = process.signals.timer.map(|t| t.next);
            let next = process.threads.next(now);
            let sleep_until = match next {
                Next::SleepUntil(until) => Some(Some(until)),
                Next::Deadlock { .. } => Some(None),
                _ => None,
            };
            // Every thread waits and some wait for host sockets: their readiness ends a wait
            // as another thread's progress would.
            if let Some(until) = sleep_until {
                let host = process.threads.host_interest();
                if !host.is_empty() {
                    if now >= self.deadline {
                        return Ok(Step::End(LoopEnd::Finished(self.timeout())));
                    }
                    let wake = [until, timer]
                        .into_iter()
                        .flatten()
                        .fold(self.deadline, Instant::min);
                    // In a tree, other processes get the host thread between short looks.
                    let wait = if process.tree.len() > 1 {
                        Duration::ZERO
                    } else {
                        wake.saturating_duration_since(now)
                    };
                    if crate::net::host::wait_any(&host, wait)? {
                        process.threads.progress();
                        continue;
                    }
                    if process.tree.len() > 1 {
                        return Ok(Step::End(LoopEnd::Blocked {
                            until: Some(wake.min(now + HOST_RECHECK)),
                        }));
                    }
                    continue;
                }
            }
            // With other processes in the tree, a process whose threads all wait yields the
            // vCPU to them (`crate::sandbox`) instead of sleeping or counting as deadlocked.
            if process.tree.len() > 1 {
                match next {
                    Next::SleepUntil(until) => {
                        return Ok(Step::End(LoopEnd::Blocked {
                            until: Some(timer.map_or(until, |t| t.min(until))),
                        }))
                    }
                    Next::Deadlock { .. } => {
                        return Ok(Step::End(LoopEnd::Blocked { until: timer }))
                    }
                    _ => {}
                }
            }
            match next {
                Next::Run { tid, resume } => {
                    if let Some(fault) = self.load(cpu, process, tid)? {
                        return Ok(Step::End(fault));
                    }
                    self.start_slice(process);
                    let end = match resume {
                        Resume::AsSaved => self.take_signal(cpu, process, mem, None)?,
                        Resume::Return(value) => {
                            self.return_to_program(cpu, process, mem, value)?
                        }
                        Resume::Retry {
                            call,
                            final_attempt,
                            until,
                        } => {
                            return Ok(Step::Retry {
                                call,
                                final_attempt,
                                until,
                            })
                        }
                    };
                    return Ok(end.map_or(Step::Resume, Step::End));
                }
                // Every thread waits: the interval timer may end a wait first.
                Next::SleepUntil(until)
                    if timer.is_some_and(|t| t < until && t < self.deadline) =>
                {
                    std::thread::sleep(timer.unwrap().saturating_duration_since(now))
                }
                Next::Deadlock { .. } if timer.is_some_and(|t| t < self.deadline) => {
                    std::thread::sleep(timer.unwrap().saturating_duration_since(now))
                }
                Next::SleepUntil(until) => {
                    if until >= self.deadline {
                        std::thread::sleep(self.deadline.saturating_duration_since(now));
                        return Ok(Step::End(LoopEnd::Finished(self.timeout())));
                    }
                    std::thread::sleep(until.saturating_duration_since(now));
                }
                Next::ReadyPoint { tid } => {
                    if let Some(fault) = self.load(cpu, process, tid)? {
                        return Ok(Step::End(fault));
                    }
                    let state = cpu.snapshot()?;
                    let r = &state.regs;
                    return Ok(Step::End(LoopEnd::ReadyPoint {
                        call: [r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9],
                    }));
                }
                Next::Deadlock { threads } => {
                    return Ok(Step::End(LoopEnd::Finished(RunStatus::Deadlocked {
                        threads,
                    })))
                }
            }
        }
    }

    /// The current thread's system call returns `value`: unless it takes a signal now, in
    /// which case the handler starts (with the call's return, or its restart under
    /// SA_RESTART, saved for rt_sigreturn) or the default action ends the run.
    fn return_to_program(
        &mut self,
        cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
        mem: &GuestMemory,
        value: u64,
    ) -> io::Result<Option<LoopEnd>> {
        interrupt_waiters(process);
        let tid = process.threads.current_tid();
        if signals::ready_for(process, tid) == 0 && process.threads.current().suspend_mask.is_none()
        {
            cpu.set_syscall_return(value)?;
            return Ok(None);
        }
        self.take_signal(cpu, process, mem, Some(value))
    }

    /// The current thread, stopped in a system call that returns `returned` (None: resuming
    /// as saved), takes its next signal if it has one.
    fn take_signal(
        &mut self,
        cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
        mem: &GuestMemory,
        returned: Option<u64>,
    ) -> io::Result<Option<LoopEnd>> {
        let tid = process.threads.current_tid();
        if signals::ready_for(process, tid) == 0 {
            restore_suspended_mask(process);
            if let Some(value) = returned {
                cpu.set_syscall_return(value)?;
            }
            return Ok(None);
        }
        let mut state = cpu.snapshot()?;
        if let Some(value) = returned {
            // The snapshot's rax is the call's number (see CpuSnapshot) until it returns.
            let nr = state.regs.rax;
            state.regs.rax = value;
            if value == Errno::EINTR.as_return() {
                let sig = lowest(signals::ready_for(process, tid));
                let action = process
                    .signals
                    .actions
                    .get(sig)
                    .copied()
                    .unwrap_or_default();
                // A stop runs no handler: Linux restarts the call when the process continues,
                // as it does every call it interrupts for a signal without a handler.
                let restart = (restartable(nr) && action.flags & SA_RESTART != 0)
                    || (action.handler == SIG_DFL
                        && signals::is_stop(sig as u64)
                        && !ends_on_any_signal(nr));
                if restart {
                    state.rip -= 2;
                    state.regs.rax = nr;
                }
            }
        }
        if let Some(value) = returned {
            // Taken or not, the call returns `value` (a handler's frame holds it as well).
            cpu.set_syscall_return(value)?;
        }
        self.run_handler(cpu, process, mem, state)
    }

    /// The current thread, whose registers are `state`, takes its next signal: its handler
    /// starts on a frame below them, or Linux's default action ends the run.
    fn run_handler(
        &mut self,
        cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
        mem: &GuestMemory,
        state: CpuSnapshot,
    ) -> io::Result<Option<LoopEnd>> {
        let tid = process.threads.current_tid();
        match signals::take(process, tid) {
            None => {
                restore_suspended_mask(process);
                Ok(None)
            }
            Some(Taken::End(status)) => Ok(Some(LoopEnd::Finished(status))),
            // The thread goes on from `state` once the process is continued.
            Some(Taken::Stop) => Ok(put_thread(cpu, &state)?.or(Some(LoopEnd::Stopped))),
            Some(Taken::Handler { sig, action, info }) => {
                // No room for the frame: Linux kills the process with SIGSEGV.
                let no_room = LoopEnd::Finished(RunStatus::Exited { code: 128 + 11 });
                enter_handler(cpu, process, mem, state, (sig, action, info), None, no_room)
            }
        }
    }

    /// Puts thread `tid` (now current) on the vCPU, saving the registers of the one there
    /// unless it exited or they are saved already (a preempted thread's).
    fn load(
        &mut self,
        cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
        tid: u64,
    ) -> io::Result<Option<LoopEnd>> {
        if self.on_cpu == tid {
            // Preempted and picked again at once (a readiness waiter queued behind it): the
            // vCPU holds what was saved. The saved copy must go, or the thread's next switch
            // would keep it and later resume it from there, back in time.
            process.threads.take_context(tid);
            return Ok(None);
        }
        if process
            .threads
            .get(self.on_cpu)
            .is_some_and(|t| t.context.is_none())
        {
            let state = cpu.snapshot()?;
            process.threads.set_context(self.on_cpu, state);
        }
        let state: CpuSnapshot = process
            .threads
            .take_context(tid)
            .ok_or_else(|| io::Error::other(format!("thread {tid} has no saved registers")))?;
        self.on_cpu = tid;
        process.threads.counters.switches += 1;
        put_thread(cpu, &state)
    }

    /// A new slice for the thread just switched in: `QUANTUM` while another thread is
    /// runnable, cut short by the earliest timer of a waiting one; none if neither.
    fn start_slice(&mut self, process: &GuestProcess) {
        let quantum = process
            .threads
            .others_runnable()
            .then(|| Instant::now() + QUANTUM);
        self.slice_end = [quantum, process.threads.next_timer_of_others()]
            .into_iter()
            .flatten()
            .min();
    }

    /// After a call that may have made another thread runnable (a wake, a new thread, progress
    /// a readiness waiter may see): the running thread gets a slice if it had none, and one
    /// kept long for a waiting thread's timer ends within `QUANTUM` once a waiter may go on,
    /// so that a thread which never waits cannot hold off the others until that timer.
    fn extend_slice(&mut self, process: &GuestProcess) {
        if process.threads.alive() <= 1 {
            return;
        }
        match self.slice_end {
            None => self.start_slice(process),
            Some(end) => {
                let quantum = Instant::now() + QUANTUM;
                if end > quantum && process.threads.others_runnable() {
                    self.slice_end = Some(quantum);
                }
            }
        }
    }

    fn slice_over(&self) -> bool {
        self.switch_due || self.slice_end.is_some_and(|end| Instant::now() >= end)
    }
}

/// Every waiting thread that would take a pending signal stops waiting (-EINTR), and one in
/// rt_sigtimedwait for a pending signal makes that call again to take it.
fn interrupt_waiters(process: &mut GuestProcess) {
    // Every system call returns through here: no allocation unless some signal is pending.
    if process.signals.pending == 0 && !process.threads.any_signal_pending() {
        return;
    }
    for tid in process.threads.blocked() {
        if syscalls::awaits_pending_signal(process, tid) {
            process.threads.retry(tid);
        } else if signals::ready_for(process, tid) != 0 {
            process.threads.interrupt(tid);
        }
    }
}

/// rt_sigsuspend's mask ends with the wait when no handler ran.
fn restore_suspended_mask(process: &mut GuestProcess) {
    let thread = process.threads.current_mut();
    if let Some(mask) = thread.suspend_mask.take() {
        thread.blocked_signals = mask;
    }
}

/// The index of the lowest signal in `set` (its number).
fn lowest(set: u64) -> usize {
    set.trailing_zeros() as usize + 1
}

/// Calls Linux restarts after a handler installed with SA_RESTART (reads, writes, waits on a
/// descriptor or futex; not sleeps, polls or selects, which return -EINTR whatever the flag).
fn restartable(nr: u64) -> bool {
    matches!(
        nr,
        0 | 1 | 17 | 18 | 19 | 20 | 42 | 43 | 44 | 45 | 46 | 47 | 202 | 288 | 295 | 296
    )
}

/// Calls that return EINTR for any signal that interrupts them, a stop included (epoll waits,
/// rt_sigtimedwait), where Linux restarts others after a stop.
fn ends_on_any_signal(nr: u64) -> bool {
    matches!(nr, 128 | 232 | 281 | 441)
}

/// What happens after one outcome is applied.
enum Step {
    /// The vCPU runs on (the same thread or another).
    Resume,
    End(LoopEnd),
    /// The thread switched in makes its readiness call again (see `Resume::Retry`).
    Retry {
        call: Call,
        final_attempt: bool,
        until: Option<Instant>,
    },
}

/// The current thread, interrupted in `state`, starts the handler of the signal it took
/// (`signals::push_frame`, with the fault that sent it, if one did); `no_room` ends the run
/// when the frame does not fit.
fn enter_handler(
    cpu: &mut dyn GuestCpu,
    process: &mut GuestProcess,
    mem: &GuestMemory,
    state: CpuSnapshot,
    taken: (u64, SigAction, [u8; 128]),
    trap: Option<&GuestFault>,
    no_room: LoopEnd,
) -> io::Result<Option<LoopEnd>> {
    let tid = process.threads.current_tid();
    match signals::push_frame(process, mem, tid, state, taken, trap) {
        Ok(handler) => put_thread(cpu, &handler),
        Err(_) => Ok(Some(no_room)),
    }
}

/// Puts `state` on the vCPU. A state no CPL3 program could be in (a forged syscall frame's rip,
/// a signal handler in the kernel half) is the thread's general protection fault there, as
/// Linux's return to such an address is.
fn put_thread(cpu: &mut dyn GuestCpu, state: &CpuSnapshot) -> io::Result<Option<LoopEnd>> {
    if state.check_user().is_err() {
        return Ok(Some(LoopEnd::Finished(RunStatus::Crashed {
            fault: GuestFault {
                vector: GENERAL_PROTECTION,
                error_code: 0,
                rip: state.rip,
                address: None,
            },
        })));
    }
    cpu.load_thread(state)?;
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::time::{Duration, Instant};

    use super::{put_thread, LoopEnd, Scheduler, STUB_RETRY};
    use crate::cpu::{CpuExit, CpuSnapshot, GuestCpu, UserRegs};
    use crate::memory::GuestMemory;
    use crate::process::testing::{new_process, test_image, MEM};
    use crate::status::RunStatus;

    /// A vCPU that can switch threads and was kicked while inside the VMM's stubs.
    struct InTheStubs;

    impl GuestCpu for InTheStubs {
        fn run(&mut self, _deadline: Instant) -> io::Result<CpuExit> {
            Err(io::Error::other("not run in these tests"))
        }
        fn set_syscall_return(&mut self, _value: u64) -> io::Result<()> {
            Ok(())
        }
        fn set_fs_base(&mut self, _base: u64) -> io::Result<()> {
            Ok(())
        }
        fn switches_threads(&self) -> bool {
            true
        }
        fn interrupted_state(&mut self) -> io::Result<Option<CpuSnapshot>> {
            Ok(None)
        }
    }

    #[test]
    fn a_slice_that_ends_in_the_stubs_is_tried_again_soon_not_at_the_deadline() {
        let (image, _dir) = test_image();
        let mut process = new_process(image);
        let mem = GuestMemory::new(MEM).unwrap();
        process
            .threads
            .spawn(0x10_0000, None)
            .expect("a second thread");
        let deadline = Instant::now() + Duration::from_secs(150);
        let mut cpu = InTheStubs;
        let mut sched = Scheduler::new(&cpu, &mut process, deadline, 150_000);
        assert!(
            sched.slice_end.is_some(),
            "two runnable threads share the vCPU in slices"
        );

        let kicked = Instant::now();
        assert!(sched
            .slice_ended(&mut cpu, &mut process, &mem)
            .unwrap()
            .is_none());
        // The thread may go back to program code and never call again (a spinner): without a
        // next kick it would run to the run's deadline, starving the other one.
        assert!(sched.switch_due, "a call on the way out switches");
        let next_kick = sched.run_until(&process);
        assert!(next_kick < deadline, "the vCPU would run to the deadline");
        assert!(next_kick >= kicked + STUB_RETRY && next_kick <= Instant::now() + STUB_RETRY);
    }

    /// A vCPU that records the states loaded into it.
    #[derive(Default)]
    struct Loads(Vec<CpuSnapshot>);

    impl GuestCpu for Loads {
        fn run(&mut self, _deadline: Instant) -> io::Result<CpuExit> {
            Err(io::Error::other("not run in these tests"))
        }
        fn set_syscall_return(&mut self, _value: u64) -> io::Result<()> {
            Ok(())
        }
        fn set_fs_base(&mut self, _base: u64) -> io::Result<()> {
            Ok(())
        }
        fn load_thread(&mut self, state: &CpuSnapshot) -> io::Result<()> {
            self.0.push(state.clone());
            Ok(())
        }
    }

    #[test]
    fn a_state_no_program_could_be_in_is_its_crash_and_never_reaches_the_vcpu() {
        let user = CpuSnapshot {
            regs: UserRegs {
                rsp: 0x7fff_0000,
                ..UserRegs::default()
            },
            rip: 0x40_1000,
            rflags: 0x202,
            fs_base: 0,
            gs_base: 0xffff_8880_0000_0000,
            xsave: vec![0; 576],
        };
        let mut cpu = Loads::default();
        assert!(put_thread(&mut cpu, &user).unwrap().is_none());
        assert_eq!(cpu.0, std::slice::from_ref(&user));
        for forged in [
            CpuSnapshot {
                rip: 1 << 63,
                ..user.clone()
            },
            CpuSnapshot {
                rip: 0xffff_8880_0000_0000,
                ..user.clone()
            },
            CpuSnapshot {
                regs: UserRegs {
                    rsp: 0x8000_0000_0000_1000,
                    ..user.regs
                },
                ..user.clone()
            },
        ] {
            match put_thread(&mut cpu, &forged).unwrap() {
                Some(LoopEnd::Finished(RunStatus::Crashed { fault })) => {
                    assert_eq!((fault.vector, fault.rip), (13, forged.rip))
                }
                other => panic!("{forged:x?}: {other:?}"),
            }
        }
        assert_eq!(cpu.0.len(), 1, "no forged state was loaded");
    }
}
