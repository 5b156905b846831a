//! The guest's threads as the VMM sees them: one table of per-thread state, which of them the
//! vCPU holds, who is waiting for what (futex words, timers, readiness), and the order in which
//! runnable threads get the vCPU. Plain data, `Clone` and encodable like the rest of the
//! process: a template snapshot holds every thread, and each fork starts from a copy.
//!
//! Scheduling (the policy; `crate::sched` applies it to the vCPU): one vCPU, threads take
//! turns on it. A thread keeps the vCPU until it blocks (futex wait, sleep, a read or poll with
//! nothing ready), yields, exits, or its time slice ends; then the next runnable thread in
//! FIFO order gets it. A slice is `QUANTUM`, cut short by the earliest timed wait of another
//! thread, and the watchdog that enforces the run's deadline also ends slices (it kicks the
//! vCPU out of guest mode), so a thread spinning in user code cannot starve the others.
//!
//! The thread whose registers the vCPU holds is `current`, even while it is blocked: its
//! context is saved into the table only when another thread is loaded, so a program that never
//! starts a second thread pays nothing for any of this.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::codec::{DecodeError, Decoder, Encoder};
use crate::cpu::CpuSnapshot;

pub use crate::abi::MAIN_TID;
/// Live threads allowed per execution unless configured otherwise (clone fails with EAGAIN
/// beyond it).
pub const DEFAULT_THREAD_LIMIT: u64 = 64;
/// How long a thread keeps the vCPU while others are runnable.
pub const QUANTUM: Duration = Duration::from_millis(10);

/// What one thread waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitOn {
    /// nanosleep and friends: only the timer ends it (returning 0).
    Sleep,
    /// FUTEX_WAIT(_BITSET) on the 32-bit word at `addr`: a wake with a matching bitset ends it
    /// (returning 0), the timer with -ETIMEDOUT.
    Futex { addr: u64, bitset: u32 },
    /// A read, write or poll that found nothing ready: `call` runs again once another thread
    /// has made progress (`epoch` is the progress count when it last found nothing), and once
    /// more when its timer runs out, told not to wait again. `host`: the host sockets whose
    /// readiness (fd, poll events) may also end it (`crate::net`), watched while every thread
    /// waits.
    Ready {
        epoch: u64,
        call: Call,
        host: Vec<(i32, i16)>,
    },
    /// The agent's AWAIT_REQUEST with no request pending: once no other thread can run, the
    /// guest is at its ready point (`crate::agent`).
    Request,
}

/// A system call as the thread made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub nr: u64,
    pub args: [u64; 6],
}

/// A blocked thread's wait: what ends it, and when it times out (None: never).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    pub on: WaitOn,
    pub until: Option<Instant>,
}

/// How a runnable thread continues once it gets the vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// Where it was interrupted in program code, or a new thread at its first instruction.
    AsSaved,
    /// From the system call it is stopped in, with this value in rax.
    Return(u64),
    /// By making `call`, the system call it is stopped in, again (a readiness wait).
    /// `final_attempt`: its timeout ran out, and the call must answer without waiting; `until`:
    /// the timer of its first attempt, which it keeps if it waits again (progress elsewhere
    /// never postpones a timeout).
    Retry {
        call: Call,
        final_attempt: bool,
        until: Option<Instant>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThreadState {
    /// On the vCPU, running or being answered.
    Running,
    Runnable(Resume),
    /// Waiting; `seq` orders waiters first come, first woken.
    Blocked {
        wait: Wait,
        seq: u64,
    },
}

/// One guest thread.
#[derive(Debug, Clone)]
pub struct Thread {
    pub tid: u64,
    pub state: ThreadState,
    /// The registers to resume it with; None while the vCPU holds them (the current thread)
    /// and for nothing else.
    pub context: Option<CpuSnapshot>,
    /// set_tid_address / CLONE_CHILD_CLEARTID: zeroed and futex-woken when the thread exits.
    pub clear_child_tid: u64,
    /// set_robust_list: recorded; no robust mutex is recovered at exit.
    pub robust_list: u64,
    /// The signal mask (bit n-1 for signal n).
    pub blocked_signals: u64,
    /// sigaltstack: (ss_sp, ss_flags, ss_size).
    pub alt_stack: (u64, u32, u64),
    /// FS base (TLS), as ARCH_GET_FS reads it back.
    pub fs_base: u64,
    /// The thread is making a readiness call again after its timeout ran out: the call must
    /// answer without waiting (`syscalls::wait_ready`). Only true during that call.
    pub last_attempt: bool,
    /// The thread is making a readiness call again, and this is the timer of its first attempt
    /// (`Resume::Retry`, `syscalls::wait_ready`). Only set during that call.
    pub retry_until: Option<Instant>,
    /// The system call being answered for it, while it is (a readiness wait records it).
    pub calling: Option<Call>,
    /// Signals sent to this thread (tkill, tgkill) and not yet taken.
    pub pending_signals: u64,
    /// rt_sigsuspend's caller's own mask, restored once a handler returns.
    pub suspend_mask: Option<u64>,
    /// The signals its last rt_sigtimedwait waits for (meaningful only while that call waits).
    pub awaited_signals: u64,
    /// The handlers it is running, innermost last (`process::signals`).
    pub signal_frames: Vec<super::signals::SignalFrame>,
    /// CPU time it used up to the last time it stopped running (`CpuClock`), nanoseconds.
    pub cpu_ns: u64,
}

impl Thread {
    /// The readiness wait it is blocked in: the call it makes again, and the wait's timer.
    fn readiness_wait(&self) -> Option<(Call, Option<Instant>)> {
        match &self.state {
            ThreadState::Blocked {
                wait:
                    Wait {
                        on: WaitOn::Ready { call, .. },
                        until,
                    },
                ..
            } => Some((*call, *until)),
            _ => None,
        }
    }

    /// The timer of the wait it is in, if it has one.
    fn timer(&self) -> Option<Instant> {
        match &self.state {
            ThreadState::Blocked { wait, .. } => wait.until,
            ThreadState::Runnable(Resume::Retry { until, .. }) => *until,
            _ => None,
        }
    }

    fn new(tid: u64) -> Thread {
        Thread {
            tid,
            state: ThreadState::Running,
            context: None,
            clear_child_tid: 0,
            robust_list: 0,
            blocked_signals: 0,
            alt_stack: (0, super::SS_DISABLE, 0),
            fs_base: 0,
            last_attempt: false,
            retry_until: None,
            calling: None,
            pending_signals: 0,
            suspend_mask: None,
            awaited_signals: 0,
            signal_frames: Vec::new(),
            cpu_ns: 0,
        }
    }
}

/// Where the threads' CPU times come from: the CPU clock of the host thread running the vCPU
/// (guest time plus the VMM's time answering its calls), charged to the thread that held the
/// vCPU whenever it stops holding it. Not kept in snapshots: a fork of a template starts at
/// zero, as a new process would (the host thread may have run many VMs before).
#[derive(Debug, Clone, Default)]
struct CpuClock {
    /// The CPU time of threads that exited.
    exited_ns: u64,
    /// The host thread's CPU clock when the current thread started running (None: no run).
    since: Option<u64>,
}

fn host_thread_cpu_ns() -> u64 {
    u64::try_from(crate::sys::thread_cpu_time().as_nanos()).unwrap_or(u64::MAX)
}

/// Where a new thread starts: the creating thread's registers at its clone call, with these
/// changes (the scheduler builds the context from the vCPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadStart {
    pub tid: u64,
    /// The new thread's stack pointer.
    pub stack: u64,
    /// CLONE_SETTLS: its FS base.
    pub tls: Option<u64>,
}

/// What the scheduler runs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// This thread (now `current`, state Running) gets the vCPU and continues as said.
    Run { tid: u64, resume: Resume },
    /// Every thread waits and one has a timer: sleep until then, then ask again.
    SleepUntil(Instant),
    /// No thread can run but the agent's, which awaits its request: the ready point.
    ReadyPoint { tid: u64 },
    /// Every thread waits for something only another thread could do: they never will.
    Deadlock { threads: u64 },
}

/// Counters of thread activity over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadCounters {
    /// Threads created (clone/clone3 that succeeded).
    pub created: u64,
    /// clone/clone3 refused because the thread limit was reached.
    pub refused: u64,
    /// Times the vCPU was handed from one thread to another.
    pub switches: u64,
    /// Of those, switches because a slice ended while the thread ran program code.
    pub preemptions: u64,
    /// The most threads alive at once.
    pub peak: u64,
}

#[derive(Debug, Clone)]
pub struct Threads {
    /// Live threads, by tid (ascending: new tids only grow).
    list: Vec<Thread>,
    /// The thread whose registers the vCPU holds.
    current: u64,
    /// Runnable threads in the order they get the vCPU.
    run_queue: VecDeque<u64>,
    next_tid: u64,
    next_seq: u64,
    /// Progress: system calls answered without waiting (readiness waits retry when it moves).
    epoch: u64,
    limit: u64,
    /// The vCPU backend can switch threads (it cannot in scripted unit tests).
    pub(crate) switching: bool,
    pub counters: ThreadCounters,
    cpu: CpuClock,
}

impl Threads {
    /// The main thread alone, running; at most `limit` threads alive at once.
    pub fn new(limit: u64) -> Threads {
        Threads {
            list: vec![Thread::new(MAIN_TID)],
            current: MAIN_TID,
            run_queue: VecDeque::new(),
            next_tid: MAIN_TID + 1,
            next_seq: 0,
            epoch: 0,
            limit: limit.max(1),
            switching: false,
            counters: ThreadCounters {
                peak: 1,
                ..ThreadCounters::default()
            },
            cpu: CpuClock::default(),
        }
    }

    /// A new process's threads: its main thread alone, with tid `pid` (a child made by fork or
    /// execve), running; tids for its later threads start after `next_id`.
    pub fn for_process(pid: u64, next_id: u64, limit: u64) -> Threads {
        let mut threads = Threads::new(limit);
        threads.list = vec![Thread::new(pid)];
        threads.current = pid;
        threads.next_tid = next_id.max(pid + 1);
        threads
    }

    /// The next tid this table would give; ids are shared by every process of a tree, so the
    /// tree keeps them apart with `reserve_ids_from`.
    pub fn next_id(&self) -> u64 {
        self.next_tid
    }

    /// No tid below `next` is given from now on (another process took them).
    pub fn reserve_ids_from(&mut self, next: u64) {
        self.next_tid = self.next_tid.max(next);
    }

    /// A run starts on this host thread: the current thread's CPU time counts from now.
    pub fn start_cpu_clock(&mut self) {
        self.cpu.since = Some(host_thread_cpu_ns());
    }

    /// The run ends: the current thread is charged its time, and nothing counts until the next.
    pub fn stop_cpu_clock(&mut self) {
        self.charge_current();
        self.cpu.since = None;
    }

    /// Charges the CPU time since the current thread started running to it.
    fn charge_current(&mut self) {
        let Some(since) = self.cpu.since else { return };
        let now = host_thread_cpu_ns();
        let used = now.saturating_sub(since);
        let tid = self.current;
        match self.get_mut(tid) {
            Some(thread) => thread.cpu_ns += used,
            None => self.cpu.exited_ns += used,
        }
        self.cpu.since = Some(now);
    }

    /// The time the current thread has run since it was last charged.
    fn running_ns(&self) -> u64 {
        self.cpu
            .since
            .map_or(0, |since| host_thread_cpu_ns().saturating_sub(since))
    }

    /// Thread `tid`'s CPU time (CLOCK_THREAD_CPUTIME_ID, pthread_getcpuclockid); None if it is
    /// not alive.
    pub fn thread_cpu_ns(&self, tid: u64) -> Option<u64> {
        let thread = self.get(tid)?;
        Some(
            thread.cpu_ns
                + if tid == self.current {
                    self.running_ns()
                } else {
                    0
                },
        )
    }

    /// The process's CPU time: every thread's, the exited ones' included.
    pub fn process_cpu_ns(&self) -> u64 {
        self.cpu.exited_ns + self.list.iter().map(|t| t.cpu_ns).sum::<u64>() + self.running_ns()
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit.max(1);
    }

    pub fn alive(&self) -> u64 {
        self.list.len() as u64
    }

    pub fn current_tid(&self) -> u64 {
        self.current
    }

    pub fn current(&self) -> &Thread {
        self.get(self.current).expect("the current thread is alive")
    }

    pub fn current_mut(&mut self) -> &mut Thread {
        let tid = self.current;
        self.get_mut(tid).expect("the current thread is alive")
    }

    /// The live threads' tids, ascending.
    pub fn tids(&self) -> impl Iterator<Item = u64> + '_ {
        self.list.iter().map(|t| t.tid)
    }

    pub fn get(&self, tid: u64) -> Option<&Thread> {
        self.list
            .binary_search_by_key(&tid, |t| t.tid)
            .ok()
            .map(|i| &self.list[i])
    }

    pub fn get_mut(&mut self, tid: u64) -> Option<&mut Thread> {
        self.list
            .binary_search_by_key(&tid, |t| t.tid)
            .ok()
            .map(|i| &mut self.list[i])
    }

    /// Adds a thread made by the current one (signal mask inherited, no alternate stack, as
    /// Linux does for CLONE_VM), runnable once the scheduler gives it its context. None when
    /// the limit is reached.
    pub fn spawn(&mut self, stack: u64, tls: Option<u64>) -> Option<ThreadStart> {
        if self.alive() >= self.limit {
            self.counters.refused += 1;
            return None;
        }
        let tid = self.next_tid;
        self.next_tid += 1;
        let parent = self.current();
        let mut thread = Thread::new(tid);
        thread.blocked_signals = parent.blocked_signals;
        thread.fs_base = tls.unwrap_or(parent.fs_base);
        thread.state = ThreadState::Runnable(Resume::AsSaved);
        self.list.push(thread);
        self.run_queue.push_back(tid);
        self.counters.created += 1;
        self.counters.peak = self.counters.peak.max(self.alive());
        Some(ThreadStart { tid, stack, tls })
    }

    /// Gives a spawned thread its first registers.
    pub fn set_context(&mut self, tid: u64, context: CpuSnapshot) {
        if let Some(thread) = self.get_mut(tid) {
            thread.context = Some(context);
        }
    }

    /// Removes the current thread (it called exit). Its registers are gone with it; the next
    /// `next` loads another thread.
    pub fn exit_current(&mut self) {
        self.charge_current();
        let tid = self.current;
        self.cpu.exited_ns += self.get(tid).map_or(0, |t| t.cpu_ns);
        self.list.retain(|t| t.tid != tid);
        self.run_queue.retain(|&t| t != tid);
    }

    /// Records the call being answered for the current thread (None: done). The thread may
    /// have exited meanwhile.
    pub fn set_calling(&mut self, call: Option<Call>) {
        let tid = self.current;
        if let Some(thread) = self.get_mut(tid) {
            thread.calling = call;
        }
    }

    /// A system call was answered without waiting: readiness waiters may try again.
    pub fn progress(&mut self) {
        self.epoch += 1;
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The current thread waits.
    pub fn block_current(&mut self, wait: Wait) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.current_mut().state = ThreadState::Blocked { wait, seq };
    }

    /// The current thread stops running and queues for the vCPU behind the others (a yield, or
    /// the end of its slice), to continue as `resume` says.
    pub fn requeue_current(&mut self, resume: Resume) {
        let tid = self.current;
        self.current_mut().state = ThreadState::Runnable(resume);
        self.run_queue.push_back(tid);
    }

    /// Another thread is waiting for the vCPU (or would run if it got it).
    pub fn others_runnable(&self) -> bool {
        !self.run_queue.is_empty()
            || self
                .list
                .iter()
                .any(|t| t.tid != self.current && self.retry_due(t))
    }

    /// A readiness waiter another thread's progress may have unblocked.
    fn retry_due(&self, thread: &Thread) -> bool {
        matches!(&thread.state, ThreadState::Blocked { wait: Wait { on: WaitOn::Ready { epoch, .. }, .. }, .. } if *epoch < self.epoch)
    }

    /// The host sockets blocked threads' readiness waits watch (fd, poll events).
    pub fn host_interest(&self) -> Vec<(i32, i16)> {
        self.list
            .iter()
            .filter_map(|t| match &t.state {
                ThreadState::Blocked {
                    wait:
                        Wait {
                            on: WaitOn::Ready { host, .. },
                            ..
                        },
                    ..
                } => Some(host.iter().copied()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// The earliest timer of any thread but the current one.
    pub fn next_timer_of_others(&self) -> Option<Instant> {
        self.list
            .iter()
            .filter(|t| t.tid != self.current)
            .filter_map(|t| match &t.state {
                ThreadState::Blocked { wait, .. } => wait.until,
                _ => None,
            })
            .min()
    }

    /// Makes every thread whose timer has passed by `now` runnable: a sleep returns 0, a futex
    /// wait -ETIMEDOUT, a readiness wait runs its call one last time.
    pub fn expire_timers(&mut self, now: Instant) {
        let mut expired: Vec<(u64, u64, Resume)> = Vec::new();
        for t in &self.list {
            if let ThreadState::Blocked {
                wait:
                    Wait {
                        on,
                        until: Some(until),
                    },
                seq,
            } = &t.state
            {
                if *until <= now {
                    let resume = match on {
                        WaitOn::Sleep => Resume::Return(0),
                        WaitOn::Futex { .. } => {
                            Resume::Return(crate::errno::Errno::ETIMEDOUT.as_return())
                        }
                        WaitOn::Ready { call, .. } => Resume::Retry {
                            call: *call,
                            final_attempt: true,
                            until: None,
                        },
                        // Never timed.
                        WaitOn::Request => continue,
                    };
                    expired.push((*seq, t.tid, resume));
                }
            }
        }
        expired.sort_unstable_by_key(|&(seq, ..)| seq);
        for (_, tid, resume) in expired {
            self.make_runnable(tid, resume);
        }
    }

    fn make_runnable(&mut self, tid: u64, resume: Resume) {
        if let Some(thread) = self.get_mut(tid) {
            thread.state = ThreadState::Runnable(resume);
            if !self.run_queue.contains(&tid) {
                self.run_queue.push_back(tid);
            }
        }
    }

    /// Futex waiters on `addr` whose bitset meets `bitset`, first come first.
    fn futex_waiters(&self, addr: u64, bitset: u32) -> Vec<u64> {
        let mut waiters: Vec<(u64, u64)> = self
            .list
            .iter()
            .filter_map(|t| match &t.state {
                ThreadState::Blocked {
                    wait:
                        Wait {
                            on: WaitOn::Futex { addr: a, bitset: b },
                            ..
                        },
                    seq,
                } if *a == addr && b & bitset != 0 => Some((*seq, t.tid)),
                _ => None,
            })
            .collect();
        waiters.sort_unstable();
        waiters.into_iter().map(|(_, tid)| tid).collect()
    }

    /// Wakes up to `count` futex waiters on `addr` matching `bitset` (their wait returns 0);
    /// returns how many.
    pub fn futex_wake(&mut self, addr: u64, count: u64, bitset: u32) -> u64 {
        let woken: Vec<u64> = self
            .futex_waiters(addr, bitset)
            .into_iter()
            .take(count.min(usize::MAX as u64) as usize)
            .collect();
        for &tid in &woken {
            self.make_runnable(tid, Resume::Return(0));
        }
        woken.len() as u64
    }

    /// Wakes up to `wake` waiters on `addr` and moves up to `requeue` of the rest to wait on
    /// `target` instead (FUTEX_REQUEUE); returns woken plus moved.
    pub fn futex_requeue(&mut self, addr: u64, wake: u64, requeue: u64, target: u64) -> u64 {
        let woken = self.futex_wake(addr, wake, u32::MAX);
        let moved: Vec<u64> = self
            .futex_waiters(addr, u32::MAX)
            .into_iter()
            .take(requeue.min(usize::MAX as u64) as usize)
            .collect();
        for &tid in &moved {
            if let Some(ThreadState::Blocked {
                wait:
                    Wait {
                        on: WaitOn::Futex { addr, .. },
                        ..
                    },
                ..
            }) = self.get_mut(tid).map(|t| &mut t.state)
            {
                *addr = target;
            }
        }
        woken + moved.len() as u64
    }

    /// Picks the thread to run next at `now` (the current one included, when nothing else
    /// can run and it can). The chosen thread becomes current; saving the old current's
    /// registers and loading the new one's is the caller's (see `crate::sched`).
    pub fn next(&mut self, now: Instant) -> Next {
        self.expire_timers(now);
        let retries: Vec<u64> = self
            .list
            .iter()
            .filter(|t| self.retry_due(t))
            .map(|t| t.tid)
            .collect();
        for tid in retries {
            self.retry(tid);
        }
        while let Some(tid) = self.run_queue.pop_front() {
            let Some(thread) = self.get_mut(tid) else {
                continue;
            };
            let ThreadState::Runnable(resume) = thread.state else {
                continue;
            };
            thread.state = ThreadState::Running;
            // The same thread again: nothing to charge (running_ns counts it on).
            if tid != self.current {
                self.charge_current();
            }
            self.current = tid;
            return Next::Run { tid, resume };
        }
        if let Some(until) = self
            .list
            .iter()
            .filter_map(|t| match &t.state {
                ThreadState::Blocked { wait, .. } => wait.until,
                _ => None,
            })
            .min()
        {
            return Next::SleepUntil(until);
        }
        if let Some(t) = self.list.iter().find(|t| {
            matches!(
                &t.state,
                ThreadState::Blocked {
                    wait: Wait {
                        on: WaitOn::Request,
                        ..
                    },
                    ..
                }
            )
        }) {
            let tid = t.tid;
            self.get_mut(tid).expect("listed").state = ThreadState::Running;
            if tid != self.current {
                self.charge_current();
            }
            self.current = tid;
            return Next::ReadyPoint { tid };
        }
        Next::Deadlock {
            threads: self.alive(),
        }
    }

    /// A signal for blocked thread `tid` ends its wait: the call returns -EINTR (or is made
    /// again after the handler, see `crate::sched`). False if it was not waiting.
    pub fn interrupt(&mut self, tid: u64) -> bool {
        if !matches!(
            self.get(tid).map(|t| &t.state),
            Some(ThreadState::Blocked { .. })
        ) {
            return false;
        }
        self.make_runnable(tid, Resume::Return(crate::errno::Errno::EINTR.as_return()));
        true
    }

    /// A readiness wait of blocked thread `tid` makes its call again now, keeping its timer
    /// (another thread made progress, or a signal rt_sigtimedwait awaits came).
    pub fn retry(&mut self, tid: u64) {
        if let Some((call, until)) = self.get(tid).and_then(Thread::readiness_wait) {
            let resume = Resume::Retry {
                call,
                final_attempt: false,
                until,
            };
            self.make_runnable(tid, resume);
        }
    }

    /// The system call blocked thread `tid` waits in to make again (a readiness wait's).
    pub fn waiting_call(&self, tid: u64) -> Option<Call> {
        self.get(tid)?.readiness_wait().map(|(call, _)| call)
    }

    /// Whether any thread has a signal directed at it pending (blocked or not).
    pub fn any_signal_pending(&self) -> bool {
        self.list.iter().any(|t| t.pending_signals != 0)
    }

    /// Blocked threads, by tid.
    pub fn blocked(&self) -> Vec<u64> {
        self.list
            .iter()
            .filter(|t| matches!(t.state, ThreadState::Blocked { .. }))
            .map(|t| t.tid)
            .collect()
    }

    /// The registers saved for the threads that are not on the vCPU.
    pub fn saved_contexts(&self) -> impl Iterator<Item = &CpuSnapshot> {
        self.list.iter().filter_map(|t| t.context.as_ref())
    }

    /// Takes the registers saved for `tid` (to load them into the vCPU).
    pub fn take_context(&mut self, tid: u64) -> Option<CpuSnapshot> {
        self.get_mut(tid).and_then(|t| t.context.take())
    }

    // ---- template snapshots ----

    /// Refuses what a snapshot cannot hold: a timed wait (its deadline would mean nothing in
    /// a fork restored later) or a thread with no saved registers but the current one.
    pub(crate) fn encode_state(&self, e: &mut Encoder) -> Result<(), &'static str> {
        self.encode_threads(e, false)
    }

    /// `encode_state` for a session checkpoint, which is restored once: timed waits are kept,
    /// their timers encoded apart (`encode_timers`).
    pub(crate) fn encode_state_timed(&self, e: &mut Encoder) -> Result<(), &'static str> {
        self.encode_threads(e, true)
    }

    fn encode_threads(&self, e: &mut Encoder, timed: bool) -> Result<(), &'static str> {
        e.u64(self.current);
        e.u64(self.next_tid);
        e.u64(self.next_seq);
        e.u64(self.limit);
        e.len(self.list.len());
        for t in &self.list {
            if !t.signal_frames.is_empty() || t.pending_signals != 0 || t.suspend_mask.is_some() {
                return Err("a thread has a signal pending or runs a signal handler");
            }
            e.u64(t.tid);
            match &t.state {
                ThreadState::Running => e.u8(0),
                ThreadState::Runnable(Resume::Retry { until: Some(_), .. }) if !timed => {
                    return Err("a thread is in a timed wait")
                }
                ThreadState::Runnable(resume) => {
                    e.u8(1);
                    encode_resume(*resume, e);
                }
                ThreadState::Blocked { wait, seq } => {
                    if wait.until.is_some() && !timed {
                        return Err("a thread is in a timed wait");
                    }
                    e.u8(2);
                    e.u64(*seq);
                    match wait.on {
                        WaitOn::Sleep => e.u8(0),
                        WaitOn::Futex { addr, bitset } => {
                            e.u8(1);
                            e.u64(addr);
                            e.u32(bitset);
                        }
                        WaitOn::Ready { call, .. } => {
                            e.u8(2);
                            encode_call(call, e);
                        }
                        WaitOn::Request => e.u8(3),
                    }
                }
            }
            match &t.context {
                Some(context) => {
                    e.bool(true);
                    crate::cpu::encode_cpu(context, e);
                }
                None if t.tid == self.current => e.bool(false),
                None => return Err("a thread has no saved registers"),
            }
            for v in [
                t.clear_child_tid,
                t.robust_list,
                t.blocked_signals,
                t.alt_stack.0,
                t.alt_stack.2,
                t.fs_base,
            ] {
                e.u64(v);
            }
            e.u32(t.alt_stack.1);
        }
        e.len(self.run_queue.len());
        for &tid in &self.run_queue {
            e.u64(tid);
        }
        Ok(())
    }

    /// The timers of its timed waits as the time each has left after `now`: a restore
    /// anchors them to its own clock (`decode_timers`), so a wait keeps what it had left.
    pub(crate) fn encode_timers(&self, e: &mut Encoder, now: Instant) {
        let timers: Vec<(u64, Instant)> = self
            .list
            .iter()
            .filter_map(|t| t.timer().map(|until| (t.tid, until)))
            .collect();
        e.len(timers.len());
        for (tid, until) in timers {
            e.u64(tid);
            let left = until.saturating_duration_since(now).as_nanos();
            e.u64(u64::try_from(left).unwrap_or(u64::MAX));
        }
    }

    /// Gives back the timers `encode_timers` wrote, each `now` plus what it had left; a timer
    /// for a thread that is in no wait that takes one is refused.
    pub(crate) fn decode_timers(
        &mut self,
        d: &mut Decoder,
        now: Instant,
    ) -> Result<(), DecodeError> {
        for _ in 0..d.count(16, "timers")? {
            let tid = d.u64("timer's thread")?;
            let left = Duration::from_nanos(d.u64("timer")?);
            let at = now
                .checked_add(left)
                .ok_or_else(|| DecodeError::new(format!("a timer {left:?} away")))?;
            let until = match self.get_mut(tid).map(|t| &mut t.state) {
                Some(ThreadState::Blocked { wait, .. }) => &mut wait.until,
                Some(ThreadState::Runnable(Resume::Retry { until, .. })) => until,
                _ => {
                    return Err(DecodeError::new(format!(
                        "a timer for thread {tid}, which is in no timed wait"
                    )))
                }
            };
            *until = Some(at);
        }
        Ok(())
    }

    pub(crate) fn decode_state(d: &mut Decoder) -> Result<Threads, DecodeError> {
        let (current, next_tid, next_seq, limit) = (
            d.u64("current thread")?,
            d.u64("next tid")?,
            d.u64("next seq")?,
            d.u64("thread limit")?,
        );
        let count = d.count(40, "threads")?;
        let mut list = Vec::with_capacity(count);
        for _ in 0..count {
            let tid = d.u64("tid")?;
            let state = match d.u8("thread state")? {
                0 => ThreadState::Running,
                1 => ThreadState::Runnable(decode_resume(d)?),
                2 => {
                    let seq = d.u64("wait seq")?;
                    let on = match d.u8("wait kind")? {
                        0 => WaitOn::Sleep,
                        1 => WaitOn::Futex {
                            addr: d.u64("futex address")?,
                            bitset: d.u32("futex bitset")?,
                        },
                        2 => WaitOn::Ready {
                            epoch: 0,
                            call: decode_call(d)?,
                            host: Vec::new(),
                        },
                        3 => WaitOn::Request,
                        other => return Err(DecodeError::new(format!("wait kind {other}"))),
                    };
                    ThreadState::Blocked {
                        wait: Wait { on, until: None },
                        seq,
                    }
                }
                other => return Err(DecodeError::new(format!("thread state {other}"))),
            };
            let context = if d.bool("thread context")? {
                Some(crate::cpu::decode_cpu(d)?)
            } else {
                None
            };
            let (clear_child_tid, robust_list, blocked_signals, ss_sp, ss_size, fs_base) = (
                d.u64("clear_child_tid")?,
                d.u64("robust list")?,
                d.u64("signal mask")?,
                d.u64("sigaltstack")?,
                d.u64("sigaltstack")?,
                d.u64("fs base")?,
            );
            let alt_stack = (ss_sp, d.u32("sigaltstack")?, ss_size);
            if list.last().is_some_and(|t: &Thread| t.tid >= tid) || tid >= next_tid {
                return Err(DecodeError::new(format!("thread {tid} out of order")));
            }
            list.push(Thread {
                tid,
                state,
                context,
                clear_child_tid,
                robust_list,
                blocked_signals,
                alt_stack,
                fs_base,
                last_attempt: false,
                retry_until: None,
                calling: None,
                pending_signals: 0,
                suspend_mask: None,
                awaited_signals: 0,
                signal_frames: Vec::new(),
                cpu_ns: 0,
            });
        }
        let queued = d.count(8, "run queue")?;
        let mut run_queue = VecDeque::with_capacity(queued);
        for _ in 0..queued {
            run_queue.push_back(d.u64("queued thread")?);
        }
        let threads = Threads {
            list,
            current,
            run_queue,
            next_tid,
            next_seq,
            epoch: 0,
            limit: limit.max(1),
            switching: false,
            counters: ThreadCounters::default(),
            cpu: CpuClock::default(),
        };
        let holds = |tid: u64| threads.get(tid).is_some();
        if !holds(current)
            || threads.run_queue.iter().any(|&t| !holds(t))
            || threads
                .list
                .iter()
                .any(|t| t.tid != current && t.context.is_none())
        {
            return Err(DecodeError::new(
                "the thread table names a thread it does not hold",
            ));
        }
        let counters = ThreadCounters {
            peak: threads.alive(),
            ..ThreadCounters::default()
        };
        Ok(Threads {
            counters,
            ..threads
        })
    }
}

pub(crate) fn encode_call(call: Call, e: &mut Encoder) {
    e.u64(call.nr);
    for v in call.args {
        e.u64(v);
    }
}

pub(crate) fn decode_call(d: &mut Decoder) -> Result<Call, DecodeError> {
    let nr = d.u64("call number")?;
    let mut args = [0u64; 6];
    for v in args.iter_mut() {
        *v = d.u64("call argument")?;
    }
    Ok(Call { nr, args })
}

fn encode_resume(resume: Resume, e: &mut Encoder) {
    match resume {
        Resume::AsSaved => e.u8(0),
        Resume::Return(v) => {
            e.u8(1);
            e.u64(v);
        }
        Resume::Retry {
            call,
            final_attempt,
            ..
        } => {
            e.u8(2);
            encode_call(call, e);
            e.bool(final_attempt);
        }
    }
}

fn decode_resume(d: &mut Decoder) -> Result<Resume, DecodeError> {
    Ok(match d.u8("resume")? {
        0 => Resume::AsSaved,
        1 => Resume::Return(d.u64("return value")?),
        // A timed one is never encoded.
        2 => Resume::Retry {
            call: decode_call(d)?,
            final_attempt: d.bool("final attempt")?,
            until: None,
        },
        other => return Err(DecodeError::new(format!("resume kind {other}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Burns at least `ns` of this thread's CPU time.
    fn spin_cpu(ns: u64) {
        let start = host_thread_cpu_ns();
        while host_thread_cpu_ns() - start < ns {
            std::hint::black_box(0);
        }
    }

    #[test]
    fn cpu_time_counts_only_while_a_run_holds_the_vcpu_and_survives_the_thread() {
        let mut threads = Threads::new(4);
        assert_eq!(
            threads.process_cpu_ns(),
            0,
            "a new process has used nothing"
        );
        spin_cpu(2_000_000);
        assert_eq!(
            threads.process_cpu_ns(),
            0,
            "the host thread's time before the run is not the guest's"
        );
        threads.start_cpu_clock();
        spin_cpu(5_000_000);
        assert!(threads.thread_cpu_ns(MAIN_TID).unwrap() >= 5_000_000);
        threads.stop_cpu_clock();
        let used = threads.thread_cpu_ns(MAIN_TID).unwrap();
        spin_cpu(2_000_000);
        assert_eq!(
            threads.thread_cpu_ns(MAIN_TID),
            Some(used),
            "nothing counts between runs"
        );
        assert_eq!(threads.process_cpu_ns(), used);
        assert_eq!(threads.thread_cpu_ns(MAIN_TID + 1), None);
        threads.exit_current();
        assert_eq!(
            threads.process_cpu_ns(),
            used,
            "an exited thread's time stays the process's"
        );
    }

    const POLL: Call = Call {
        nr: 7,
        args: [0x1000, 1, 100, 0, 0, 0],
    };

    fn wait(on: WaitOn) -> Wait {
        Wait { on, until: None }
    }

    #[test]
    fn spawned_threads_run_in_order_and_the_limit_refuses_more() {
        let mut t = Threads::new(3);
        let a = t.spawn(0x1000, Some(0x2000)).unwrap();
        let b = t.spawn(0x3000, None).unwrap();
        assert_eq!((a.tid, b.tid), (2, 3));
        assert_eq!(t.spawn(0, None), None);
        assert_eq!(t.counters.refused, 1);
        assert_eq!(t.get(2).unwrap().fs_base, 0x2000);
        t.block_current(wait(WaitOn::Futex {
            addr: 0x100,
            bitset: u32::MAX,
        }));
        assert_eq!(
            t.next(Instant::now()),
            Next::Run {
                tid: 2,
                resume: Resume::AsSaved
            }
        );
        assert_eq!(t.current_tid(), 2);
        t.requeue_current(Resume::Return(0));
        assert_eq!(
            t.next(Instant::now()),
            Next::Run {
                tid: 3,
                resume: Resume::AsSaved
            }
        );
        t.exit_current();
        assert_eq!(
            t.next(Instant::now()),
            Next::Run {
                tid: 2,
                resume: Resume::Return(0)
            }
        );
        assert_eq!(t.futex_wake(0x100, 5, u32::MAX), 1);
        t.block_current(wait(WaitOn::Futex {
            addr: 0x200,
            bitset: 1,
        }));
        assert_eq!(
            t.next(Instant::now()),
            Next::Run {
                tid: 1,
                resume: Resume::Return(0)
            }
        );
    }

    #[test]
    fn futex_bitsets_requeue_and_fifo_order() {
        let mut t = Threads::new(8);
        for _ in 0..3 {
            t.spawn(0, None).unwrap();
        }
        // Threads 2, 3, 4 wait in that order: 2 and 4 on A with bitset 1, 3 on A with bitset 2.
        for (tid, bitset) in [(2, 1), (3, 2), (4, 1)] {
            assert!(
                matches!(t.next(Instant::now()), Next::Run { tid: got, .. } if got == tid || got == 1)
            );
            while t.current_tid() != tid {
                t.requeue_current(Resume::Return(0));
                t.next(Instant::now());
            }
            t.block_current(wait(WaitOn::Futex { addr: 0xA0, bitset }));
        }
        assert_eq!(
            t.futex_wake(0xA0, 1, 2),
            1,
            "only thread 3 matches bitset 2"
        );
        assert_eq!(
            t.get(3).unwrap().state,
            ThreadState::Runnable(Resume::Return(0))
        );
        assert_eq!(
            t.futex_requeue(0xA0, 1, 10, 0xB0),
            2,
            "one woken (the first waiter), one moved"
        );
        assert_eq!(
            t.get(2).unwrap().state,
            ThreadState::Runnable(Resume::Return(0))
        );
        assert_eq!(t.futex_wake(0xA0, 10, u32::MAX), 0);
        assert_eq!(t.futex_wake(0xB0, 10, u32::MAX), 1);
    }

    #[test]
    fn timers_sleep_readiness_retries_the_ready_point_and_deadlock() {
        let now = Instant::now();
        let mut t = Threads::new(8);
        t.spawn(0, None).unwrap();
        t.block_current(Wait {
            on: WaitOn::Sleep,
            until: Some(now + Duration::from_millis(5)),
        });
        assert_eq!(
            t.next(now),
            Next::Run {
                tid: 2,
                resume: Resume::AsSaved
            }
        );
        assert_eq!(
            t.next_timer_of_others(),
            Some(now + Duration::from_millis(5))
        );
        t.block_current(wait(WaitOn::Ready {
            epoch: t.epoch(),
            call: POLL,
            host: Vec::new(),
        }));
        assert_eq!(
            t.next(now),
            Next::SleepUntil(now + Duration::from_millis(5))
        );
        assert_eq!(
            t.next(now + Duration::from_millis(5)),
            Next::Run {
                tid: 1,
                resume: Resume::Return(0)
            }
        );
        assert!(
            !t.others_runnable(),
            "no progress since thread 2 found nothing"
        );
        t.progress();
        assert!(t.others_runnable());
        t.block_current(wait(WaitOn::Request));
        assert_eq!(
            t.next(now),
            Next::Run {
                tid: 2,
                resume: Resume::Retry {
                    call: POLL,
                    final_attempt: false,
                    until: None
                }
            }
        );
        t.block_current(wait(WaitOn::Ready {
            epoch: t.epoch(),
            call: POLL,
            host: Vec::new(),
        }));
        assert_eq!(t.next(now), Next::ReadyPoint { tid: 1 });
        t.block_current(wait(WaitOn::Futex {
            addr: 4,
            bitset: u32::MAX,
        }));
        assert_eq!(t.next(now), Next::Deadlock { threads: 2 });
    }

    #[test]
    fn a_retried_readiness_wait_keeps_its_first_timer() {
        let now = Instant::now();
        let mut t = Threads::new(2);
        t.spawn(0x1000, None).unwrap();
        let first = now + Duration::from_millis(50);
        let poll_until_first = |epoch| Wait {
            on: WaitOn::Ready {
                epoch,
                call: POLL,
                host: Vec::new(),
            },
            until: Some(first),
        };
        t.block_current(poll_until_first(t.epoch()));
        // Another thread's progress: the retry carries the first attempt's timer, and a
        // snapshot cannot hold it while it waits for the vCPU.
        t.progress();
        assert_eq!(
            t.next(now),
            Next::Run {
                tid: 2,
                resume: Resume::AsSaved
            }
        );
        assert_eq!(
            t.encode_state(&mut Encoder::new()),
            Err("a thread is in a timed wait")
        );
        t.block_current(wait(WaitOn::Futex {
            addr: 0x100,
            bitset: u32::MAX,
        }));
        let retry = Resume::Retry {
            call: POLL,
            final_attempt: false,
            until: Some(first),
        };
        assert_eq!(
            t.next(now),
            Next::Run {
                tid: 1,
                resume: retry
            }
        );
        t.block_current(poll_until_first(t.epoch()));
        assert_eq!(t.next(now), Next::SleepUntil(first));
        assert_eq!(
            t.next(first),
            Next::Run {
                tid: 1,
                resume: Resume::Retry {
                    call: POLL,
                    final_attempt: true,
                    until: None
                }
            }
        );
    }
}
