//! Signal delivery: which pending signal a thread takes, what Linux's default action does
//! with it, the interval timers (alarm, setitimer: real time, and the process's CPU time for
//! ITIMER_VIRTUAL and ITIMER_PROF), and the frame a
//! handler runs on (the x86-64 `rt_sigframe`: return address, ucontext, siginfo).
//!
//! Signals are taken where Linux takes them on return to user mode: when a system call
//! returns, when a waiting thread is interrupted (its call returns -EINTR, or restarts after
//! the handler with SA_RESTART), and when the vCPU is kicked out of program code because the
//! timer expired. A process-directed signal goes to the main thread unless it blocks it (as
//! Linux prefers the thread-group leader), else to the first thread that does not.
//! The interrupted registers (vector state included) stay in the VMM, keyed by the frame's
//! address, and rt_sigreturn restores them with the mask the frame holds; the frame on the
//! stack is Linux's layout so SA_SIGINFO handlers read siginfo and ucontext as they would.
//!
//! Job control is decided here too, as Linux decides it: when a signal is sent (a stop signal
//! discards a pending SIGCONT; SIGCONT discards pending stops and continues a stopped process,
//! blocked or ignored; a signal the target ignores is not queued) and when a stop signal with
//! the default action is taken (the whole process stops; from a terminal's signals, not in an
//! orphaned process group). A stop or continue is recorded in the process's tree entry for its
//! parent's wait, with SIGCHLD unless the parent asked for SA_NOCLDSTOP; the tree
//! (`crate::sandbox`) runs no thread of a stopped process.

use std::time::{Duration, Instant};

use super::{GuestProcess, SigAction, SS_DISABLE};
use crate::cpu::CpuSnapshot;
use crate::errno::Errno;
use crate::memory::GuestMemory;
use crate::status::{FaultSignal, GuestFault, RunStatus};
use crate::usermem::UserMemory;

pub const SIGHUP: u64 = 1;
pub const SIGINT: u64 = 2;
pub const SIGQUIT: u64 = 3;
pub const SIGKILL: u64 = 9;
pub const SIGSTOP: u64 = 19;
pub const SIGCONT: u64 = 18;
pub const SIGTSTP: u64 = 20;
pub const SIGWINCH: u64 = 28;
pub const SIGALRM: u64 = 14;
pub const SIGCHLD: u64 = 17;
pub const SIGTTIN: u64 = 21;
pub const SIGTTOU: u64 = 22;
pub const SIGVTALRM: u64 = 26;
pub const SIGPROF: u64 = 27;
pub const SIG_DFL: u64 = 0;
pub const SIG_IGN: u64 = 1;
/// SIGCHLD's flag: no SIGCHLD when a child stops or continues.
const SA_NOCLDSTOP: u64 = 1;
const SA_ONSTACK: u64 = 0x0800_0000;
pub const SA_RESTART: u64 = 0x1000_0000;
const SA_NODEFER: u64 = 0x4000_0000;
const SA_RESETHAND: u64 = 0x8000_0000;
const SS_ONSTACK: u32 = 1;
/// si_code: sent by kill (SI_USER), tkill/tgkill (SI_TKILL), or by the kernel (a timer).
pub const SI_USER: i32 = 0;
pub const SI_TKILL: i32 = -6;
pub const SI_KERNEL: i32 = 0x80;
/// The rflags bits rt_sigreturn takes from the frame (Linux's FIX_EFLAGS: CF, PF, AF, ZF, SF,
/// TF, DF, OF, RF and AC).
const SIGRETURN_FLAGS: u64 = 0x5_0DD5;
/// Frames of handlers a thread left without rt_sigreturn (siglongjmp) are forgotten past this.
const MAX_NESTED_FRAMES: usize = 32;
/// pretcode, the kernel's struct ucontext (304 bytes) and siginfo (128 bytes).
const UCONTEXT_AT: u64 = 8;
const MCONTEXT_AT: u64 = UCONTEXT_AT + 40;
const SIGMASK_AT: u64 = UCONTEXT_AT + 296;
const SIGINFO_AT: u64 = UCONTEXT_AT + 304;
const FRAME_BYTES: u64 = SIGINFO_AT + 128;
/// The System V ABI's red zone below the stack pointer, which a frame must not overwrite.
const RED_ZONE: u64 = 128;

pub fn bit(sig: u64) -> u64 {
    1 << (sig - 1)
}

/// The signals whose default action stops the process.
pub const STOP_SIGNALS: u64 =
    (1 << (SIGSTOP - 1)) | (1 << (SIGTSTP - 1)) | (1 << (SIGTTIN - 1)) | (1 << (SIGTTOU - 1));

/// Whether `sig`'s default action stops the process.
pub fn is_stop(sig: u64) -> bool {
    (1..=64).contains(&sig) && STOP_SIGNALS & bit(sig) != 0
}

/// Whether `sig`'s default action is to do nothing.
fn ignored_by_default(sig: u64) -> bool {
    const SIGURG: u64 = 23;
    matches!(sig, SIGCHLD | SIGCONT | SIGURG | SIGWINCH)
}

/// Sends `sig` to process `pid` of the tree: the running process gets it at once, another
/// live one when it next runs; an ended one nothing. Job control acts at once, as Linux's
/// does when a signal is sent; a signal the process ignores (and its main thread does not
/// block) is dropped, so it interrupts no wait. Whether it is pending now.
pub fn send(proc: &mut GuestProcess, pid: u64, sig: u64) -> bool {
    if proc.tree.get(pid).is_none_or(|e| e.exit.is_some()) {
        return false;
    }
    if is_stop(sig) {
        discard(proc, pid, bit(SIGCONT));
    } else if sig == SIGCONT {
        discard(proc, pid, STOP_SIGNALS);
        if proc.tree.get(pid).is_some_and(|e| e.stopped.is_some()) {
            report_job(proc, pid, JobReport::Continued);
        }
    }
    let ignored = proc.as_process(pid, |p| {
        let handler = p.signals.actions[sig as usize].handler;
        let blocked = p
            .threads
            .get(p.pid)
            .is_some_and(|t| t.blocked_signals & bit(sig) != 0);
        !blocked && (handler == SIG_IGN || (handler == SIG_DFL && ignored_by_default(sig)))
    });
    if ignored == Some(true) {
        return false;
    }
    if pid == proc.pid {
        proc.signals.pending |= bit(sig);
    } else if let Some(entry) = proc.tree.get_mut(pid) {
        entry.signals |= bit(sig);
    }
    true
}

/// Sends `sig` to parent `ppid` about its child: a SIGCHLD that was not pending yet carries
/// `news` (one is queued at a time, with its first sender's siginfo, as on Linux).
pub fn notify_parent(proc: &mut GuestProcess, ppid: u64, sig: u64, news: ChildNews) {
    let pending = |proc: &mut GuestProcess| {
        let parked = proc.tree.get(ppid).map_or(0, |e| e.signals);
        let own = proc.as_process(ppid, |p| p.signals.pending).unwrap_or(0);
        (parked | own) & bit(SIGCHLD) != 0
    };
    let fresh = sig == SIGCHLD && !pending(proc);
    if send(proc, ppid, sig) && fresh {
        if let Some(parent) = proc.tree.get_mut(ppid) {
            parent.child_news = Some(news);
        }
    }
}

/// The siginfo of a SIGCHLD the running process takes: its child's news (taken with it), or
/// a plain sender's when another process sent it.
fn sigchld_info(proc: &mut GuestProcess, code: i32) -> [u8; 128] {
    let news = proc
        .tree
        .get_mut(proc.pid)
        .and_then(|e| e.child_news.take());
    news.map_or_else(|| siginfo(SIGCHLD, code), |n| n.siginfo())
}

/// The siginfo of `sig` sent as `code`, taken now by the running process.
fn taken_info(proc: &mut GuestProcess, sig: u64, code: i32) -> [u8; 128] {
    if sig == SIGCHLD {
        sigchld_info(proc, code)
    } else {
        siginfo(sig, code)
    }
}

/// Drops the signals of `set` pending for process `pid`, for it or any of its threads.
fn discard(proc: &mut GuestProcess, pid: u64, set: u64) {
    if let Some(entry) = proc.tree.get_mut(pid) {
        entry.signals &= !set;
    }
    proc.as_process(pid, |p| {
        p.signals.pending &= !set;
        let tids: Vec<u64> = p.threads.tids().collect();
        for tid in tids {
            if let Some(thread) = p.threads.get_mut(tid) {
                thread.pending_signals &= !set;
            }
        }
    });
}

/// Process `pid` stopped or continued: its tree entry says so until its parent waits for it,
/// and the parent gets SIGCHLD unless its SIGCHLD action has SA_NOCLDSTOP.
fn report_job(proc: &mut GuestProcess, pid: u64, report: JobReport) {
    let Some(entry) = proc.tree.get_mut(pid) else {
        return;
    };
    entry.job_report = Some(report);
    entry.stopped = match report {
        JobReport::Stopped(sig) => Some(sig),
        JobReport::Continued => None,
    };
    let ppid = entry.ppid;
    let quiet = proc.as_process(ppid, |p| {
        p.signals.actions[SIGCHLD as usize].flags & SA_NOCLDSTOP != 0
    });
    if quiet == Some(false) {
        notify_parent(proc, ppid, SIGCHLD, ChildNews::job(pid, report));
    }
}

/// Whether stop signal `sig`, taken with its default action by the running process, is
/// discarded rather than stopping it: a terminal's stop signal in an orphaned process group,
/// as Linux has it.
fn stop_discarded(proc: &GuestProcess, sig: u64) -> bool {
    let pgid = proc.tree.get(proc.pid).map_or(proc.pid, |e| e.pgid);
    sig != SIGSTOP && proc.tree.group_orphaned(pgid)
}

/// Process `pid` stopped by `sig`: its tree entry says so, for its parent's wait too.
pub fn stopped(proc: &mut GuestProcess, pid: u64, sig: u64) {
    report_job(proc, pid, JobReport::Stopped(sig));
}

/// Takes the stop signal pending for the running process that stops it without running it
/// (`sent` holds those sent since it last ran): the first whose action is the default that
/// one of its threads does not block, and that is not discarded. The caller records the stop
/// (`stopped`): this runs while the process's part is swapped in for the moment.
pub fn take_stop(proc: &mut GuestProcess, sent: &mut u64) -> Option<u64> {
    loop {
        let defaults = [SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU]
            .into_iter()
            .filter(|&s| proc.signals.actions[s as usize].handler == SIG_DFL)
            .fold(0, |set, s| set | bit(s));
        let process_wide = proc.signals.pending | *sent;
        let (tid, sig) = proc.threads.tids().find_map(|tid| {
            let thread = proc.threads.get(tid)?;
            let ready =
                (thread.pending_signals | process_wide) & !thread.blocked_signals & defaults;
            (ready != 0).then(|| (tid, u64::from(ready.trailing_zeros()) + 1))
        })?;
        *sent &= !bit(sig);
        proc.signals.pending &= !bit(sig);
        if let Some(thread) = proc.threads.get_mut(tid) {
            thread.pending_signals &= !bit(sig);
        }
        if !stop_discarded(proc, sig) {
            return Some(sig);
        }
    }
}

/// What a wait with WUNTRACED or WCONTINUED reports of a child that has not ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobReport {
    /// It stopped, by this signal.
    Stopped(u64),
    /// SIGCONT continued it.
    Continued,
}

/// A child's news as SIGCHLD's and waitid's siginfo tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildNews {
    /// si_code: CLD_EXITED, CLD_KILLED, CLD_STOPPED or CLD_CONTINUED.
    pub code: i32,
    pub pid: u64,
    /// si_status: the exit code, or the signal that ended, stopped or continued it.
    pub status: i32,
}

pub const CLD_EXITED: i32 = 1;
pub const CLD_KILLED: i32 = 2;
pub const CLD_STOPPED: i32 = 5;
pub const CLD_CONTINUED: i32 = 6;

impl ChildNews {
    /// Child `pid` ended with wait status `status`.
    pub fn ended(pid: u64, status: u32) -> ChildNews {
        let (code, status) = if status & 0x7f == 0 {
            (CLD_EXITED, i32::from((status >> 8) as u8))
        } else {
            (CLD_KILLED, i32::from((status & 0x7f) as u8))
        };
        ChildNews { code, pid, status }
    }

    /// Child `pid` stopped or continued.
    pub fn job(pid: u64, report: JobReport) -> ChildNews {
        let (code, status) = match report {
            JobReport::Stopped(sig) => (CLD_STOPPED, sig as i32),
            JobReport::Continued => (CLD_CONTINUED, SIGCONT as i32),
        };
        ChildNews { code, pid, status }
    }

    /// The siginfo that tells it.
    pub fn siginfo(&self) -> [u8; 128] {
        let mut info = siginfo(SIGCHLD, self.code);
        info[16..20].copy_from_slice(&(self.pid as i32).to_le_bytes());
        info[24..28].copy_from_slice(&self.status.to_le_bytes());
        info
    }
}

/// The interval timer of setitimer(ITIMER_REAL) and alarm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RealTimer {
    pub next: Instant,
    /// Re-armed by this much after each expiry (None: once).
    pub interval: Option<Duration>,
}

/// A handler's frame: where it is on the stack, and what rt_sigreturn restores.
#[derive(Debug, Clone)]
pub struct SignalFrame {
    pub addr: u64,
    pub interrupted: CpuSnapshot,
}

/// What the next signal a thread takes does.
pub enum Taken {
    /// Run the handler of `sig`, which gets `info` as its siginfo.
    Handler {
        sig: u64,
        action: SigAction,
        info: [u8; 128],
    },
    /// Linux's default action ends the process.
    End(RunStatus),
    /// Linux's default action stopped the process (its tree entry says so): it runs again
    /// when SIGCONT continues it.
    Stop,
}

/// A CPU-time interval timer (setitimer ITIMER_VIRTUAL or ITIMER_PROF): due when the
/// process's CPU time reaches `next_ns`, then re-armed `interval_ns` later (0: once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimer {
    pub next_ns: u64,
    pub interval_ns: u64,
}

/// The signal each CPU-time timer sends (`SignalState::cpu_timers`' order).
pub const CPU_TIMER_SIGNALS: [u64; 2] = [SIGVTALRM, SIGPROF];

/// The interval timers that are due by `now` (the real one) or by the process's CPU time make
/// their signal pending and are re-armed (or disarmed).
pub fn fire_timers(proc: &mut GuestProcess, now: Instant) {
    if let Some(timer) = proc.signals.timer.filter(|t| t.next <= now) {
        proc.signals.pending |= bit(SIGALRM);
        proc.signals.timer = timer.interval.map(|every| RealTimer {
            next: now.max(timer.next) + every,
            interval: Some(every),
        });
    }
    if proc.signals.cpu_timers.iter().all(Option::is_none) {
        return;
    }
    let used = proc.threads.process_cpu_ns();
    for (slot, sig) in CPU_TIMER_SIGNALS.into_iter().enumerate() {
        let Some(timer) = proc.signals.cpu_timers[slot].filter(|t| t.next_ns <= used) else {
            continue;
        };
        proc.signals.pending |= bit(sig);
        proc.signals.cpu_timers[slot] = (timer.interval_ns > 0).then(|| CpuTimer {
            next_ns: used.max(timer.next_ns) + timer.interval_ns,
            interval_ns: timer.interval_ns,
        });
    }
}

/// When the first CPU-time timer could be due, were the process to run from now on without
/// a pause (its CPU time grows at most as fast as the wall clock); None when none is armed
/// (then without reading the clock: every vCPU entry asks).
pub fn next_cpu_timer(proc: &GuestProcess) -> Option<Instant> {
    let first = proc
        .signals
        .cpu_timers
        .iter()
        .flatten()
        .map(|t| t.next_ns)
        .min()?;
    let left = first.saturating_sub(proc.threads.process_cpu_ns());
    Instant::now().checked_add(Duration::from_nanos(left))
}

/// The signals thread `tid` would take now: its own pending ones and the process's that it
/// does not block, of those only what the main thread blocks unless it is the main thread.
pub fn ready_for(proc: &GuestProcess, tid: u64) -> u64 {
    let Some(thread) = proc.threads.get(tid) else {
        return 0;
    };
    let mut process_wide = proc.signals.pending & !thread.blocked_signals;
    if let Some(main) = proc.threads.get(proc.pid).filter(|_| tid != proc.pid) {
        process_wide &= main.blocked_signals;
    }
    (thread.pending_signals & !thread.blocked_signals) | process_wide
}

/// si_code of a signal taken: sent to the thread (tkill, tgkill), by a timer, or by kill.
fn sent_by(to_thread: bool, sig: u64) -> i32 {
    if to_thread {
        SI_TKILL
    } else if matches!(sig, SIGALRM | SIGVTALRM | SIGPROF) {
        SI_KERNEL
    } else {
        SI_USER
    }
}

/// The signals of `set` pending for `tid`, blocked or not (what rt_sigtimedwait takes).
pub fn pending_in(proc: &GuestProcess, tid: u64, set: u64) -> u64 {
    proc.threads
        .get(tid)
        .map_or(0, |t| (t.pending_signals | proc.signals.pending) & set)
}

/// Takes the lowest signal of `set` pending for `tid` without running its handler (its own
/// first, then the process's, as Linux dequeues them): the signal and its siginfo.
pub fn take_from(proc: &mut GuestProcess, tid: u64, set: u64) -> Option<(u64, [u8; 128])> {
    let thread = proc.threads.get_mut(tid)?;
    let own = thread.pending_signals & set;
    let chosen = if own != 0 {
        own
    } else {
        proc.signals.pending & set
    };
    if chosen == 0 {
        return None;
    }
    let sig = u64::from(chosen.trailing_zeros()) + 1;
    thread.pending_signals &= !bit(sig);
    if own == 0 {
        proc.signals.pending &= !bit(sig);
    }
    Some((sig, taken_info(proc, sig, sent_by(own != 0, sig))))
}

/// Linux's siginfo for `sig` sent as `code` (the sender's pid and uid unless the kernel sent it).
fn siginfo(sig: u64, code: i32) -> [u8; 128] {
    let mut info = [0u8; 128];
    info[..4].copy_from_slice(&(sig as i32).to_le_bytes());
    info[8..12].copy_from_slice(&code.to_le_bytes());
    if code != SI_KERNEL {
        info[16..20].copy_from_slice(&(crate::abi::GUEST_PID as i32).to_le_bytes());
        info[20..24].copy_from_slice(&(crate::abi::GUEST_UID as u32).to_le_bytes());
    }
    info
}

/// Takes the lowest signal ready for `tid` whose action is not to ignore it (ignored ones
/// are dropped on the way), as Linux does on the way back to user mode.
pub fn take(proc: &mut GuestProcess, tid: u64) -> Option<Taken> {
    loop {
        let ready = ready_for(proc, tid);
        if ready == 0 {
            return None;
        }
        let sig = u64::from(ready.trailing_zeros()) + 1;
        let thread = proc.threads.get_mut(tid)?;
        let code = sent_by(thread.pending_signals & bit(sig) != 0, sig);
        thread.pending_signals &= !bit(sig);
        proc.signals.pending &= !bit(sig);
        let action = proc.signals.actions[sig as usize];
        match action.handler {
            SIG_IGN => continue,
            SIG_DFL if ignored_by_default(sig) => continue,
            SIG_DFL if is_stop(sig) => {
                if !stop_discarded(proc, sig) {
                    stopped(proc, proc.pid, sig);
                    return Some(Taken::Stop);
                }
            }
            SIG_DFL => {
                if let Some(entry) = proc.tree.get_mut(proc.pid) {
                    entry.killed_by = Some(sig);
                }
                return Some(Taken::End(RunStatus::Exited {
                    code: 128 + sig as i32,
                }));
            }
            _ => {
                if action.flags & SA_RESETHAND != 0 {
                    proc.signals.actions[sig as usize] = SigAction::default();
                }
                let info = taken_info(proc, sig, code);
                return Some(Taken::Handler { sig, action, info });
            }
        }
    }
}

/// The signal hardware fault `fault` sends thread `tid`, taken at once (Linux's
/// force_sig_fault) when the thread has a handler for it and does not block it; None when
/// the fault ends the process instead (blocked, ignored or the default action).
pub fn take_fault(
    proc: &mut GuestProcess,
    tid: u64,
    fault: &GuestFault,
) -> Option<(u64, SigAction, [u8; 128])> {
    let FaultSignal {
        signal,
        code,
        address,
    } = fault.signal();
    if proc.threads.get(tid)?.blocked_signals & bit(signal) != 0 {
        return None;
    }
    let action = proc.signals.actions[signal as usize];
    if matches!(action.handler, SIG_DFL | SIG_IGN) {
        return None;
    }
    if action.flags & SA_RESETHAND != 0 {
        proc.signals.actions[signal as usize] = SigAction::default();
    }
    let mut info = siginfo(signal, code);
    info[16..24].copy_from_slice(&address.to_le_bytes());
    Some((signal, action, info))
}

fn put(frame: &mut [u8], at: u64, value: u64) {
    frame[at as usize..at as usize + 8].copy_from_slice(&value.to_le_bytes());
}

/// Writes the frame for `sig`'s handler below `interrupted`'s stack (or on the alternate
/// stack with SA_ONSTACK), blocks the handler's mask for thread `tid`, and returns the
/// registers the handler starts with. The ucontext of a signal a fault sent (`trap`) also
/// holds its error code, vector and address. A frame that does not fit in the program's
/// memory is EFAULT (Linux then kills the process with SIGSEGV).
pub fn push_frame(
    proc: &mut GuestProcess,
    mem: &GuestMemory,
    tid: u64,
    interrupted: CpuSnapshot,
    taken: (u64, SigAction, [u8; 128]),
    trap: Option<&GuestFault>,
) -> Result<CpuSnapshot, Errno> {
    let (sig, action, info) = taken;
    let thread = proc.threads.get_mut(tid).ok_or(Errno::ESRCH)?;
    let (ss_sp, ss_flags, ss_size) = thread.alt_stack;
    let sp = interrupted.regs.rsp;
    let alt_enabled = ss_flags & SS_DISABLE == 0 && ss_size > 0;
    let on_alt = alt_enabled && sp > ss_sp && sp - ss_sp <= ss_size;
    let top = if action.flags & SA_ONSTACK != 0 && alt_enabled && !on_alt {
        ss_sp.wrapping_add(ss_size)
    } else {
        sp.wrapping_sub(RED_ZONE)
    };
    // At the handler's first instruction rsp + 8 is 16-byte aligned, as after a call.
    let addr = (top.wrapping_sub(FRAME_BYTES) & !15).wrapping_sub(8);
    let mask = thread.suspend_mask.take().unwrap_or(thread.blocked_signals);
    let mut frame = vec![0u8; FRAME_BYTES as usize];
    put(&mut frame, 0, action.restorer);
    put(&mut frame, UCONTEXT_AT + 16, ss_sp);
    let stack_flags = if !alt_enabled {
        SS_DISABLE
    } else if on_alt {
        SS_ONSTACK
    } else {
        0
    };
    put(&mut frame, UCONTEXT_AT + 24, u64::from(stack_flags));
    put(&mut frame, UCONTEXT_AT + 32, ss_size);
    let r = &interrupted.regs;
    let gprs = [
        r.r8,
        r.r9,
        r.r10,
        r.r11,
        r.r12,
        r.r13,
        r.r14,
        r.r15,
        r.rdi,
        r.rsi,
        r.rbp,
        r.rbx,
        r.rdx,
        r.rax,
        r.rcx,
        r.rsp,
        interrupted.rip,
        interrupted.rflags,
    ];
    for (i, v) in gprs.into_iter().enumerate() {
        put(&mut frame, MCONTEXT_AT + 8 * i as u64, v);
    }
    // cs, gs, fs, ss as 16-bit selectors (user code and data), then err, trapno, oldmask, cr2.
    put(&mut frame, MCONTEXT_AT + 144, 0x33 | (0x2b << 48));
    if let Some(fault) = trap {
        put(&mut frame, MCONTEXT_AT + 152, fault.error_code);
        put(&mut frame, MCONTEXT_AT + 160, u64::from(fault.vector));
        put(&mut frame, MCONTEXT_AT + 176, fault.address.unwrap_or(0));
    }
    put(&mut frame, MCONTEXT_AT + 168, mask);
    put(&mut frame, SIGMASK_AT, mask);
    let at = SIGINFO_AT as usize;
    frame[at..at + 128].copy_from_slice(&info);
    UserMemory::new(mem).write(addr, &frame)?;
    let mut handler = interrupted.clone();
    handler.rip = action.handler;
    handler.regs.rsp = addr;
    handler.regs.rdi = sig;
    handler.regs.rsi = addr + SIGINFO_AT;
    handler.regs.rdx = addr + UCONTEXT_AT;
    handler.regs.rax = 0;
    // DF and TF clear, as the ABI and Linux's signal entry leave them.
    handler.rflags &= !0x500;
    let nodefer = if action.flags & SA_NODEFER != 0 {
        0
    } else {
        bit(sig)
    };
    thread.blocked_signals = (mask | action.mask | nodefer) & !(bit(SIGKILL) | bit(SIGSTOP));
    if thread.signal_frames.len() == MAX_NESTED_FRAMES {
        thread.signal_frames.remove(0);
    }
    thread.signal_frames.push(SignalFrame { addr, interrupted });
    Ok(handler)
}

/// rt_sigreturn with the stack pointer at `rsp` (just past the frame's return address): the
/// registers the handler interrupted as the frame's ucontext now holds them (a handler may
/// change them, as a runtime turning a fault into an exception does; rflags only in the bits
/// a program controls), the vector and segment state as the VMM kept it, and the frame's
/// signal mask set for `tid`; None when no frame of this thread is there (the stack is not
/// what the program believes) or the frame cannot be read.
pub fn pop_frame(
    proc: &mut GuestProcess,
    mem: &GuestMemory,
    tid: u64,
    rsp: u64,
) -> Option<CpuSnapshot> {
    let addr = rsp.wrapping_sub(8);
    let thread = proc.threads.get_mut(tid)?;
    let at = thread.signal_frames.iter().rposition(|f| f.addr == addr)?;
    let frame = thread.signal_frames.remove(at);
    // Frames above it belong to handlers that were left by a jump.
    thread.signal_frames.truncate(at);
    let user = UserMemory::new(mem);
    let mask = user.read_u64(addr + SIGMASK_AT).ok()?;
    let mut gregs = [0u8; 18 * 8];
    user.read(addr + MCONTEXT_AT, &mut gregs).ok()?;
    let greg = |i: usize| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&gregs[i * 8..i * 8 + 8]);
        u64::from_le_bytes(word)
    };
    let mut state = frame.interrupted;
    let r = &mut state.regs;
    for (i, slot) in [
        &mut r.r8, &mut r.r9, &mut r.r10, &mut r.r11, &mut r.r12, &mut r.r13, &mut r.r14,
        &mut r.r15, &mut r.rdi, &mut r.rsi, &mut r.rbp, &mut r.rbx, &mut r.rdx, &mut r.rax,
        &mut r.rcx, &mut r.rsp,
    ]
    .into_iter()
    .enumerate()
    {
        *slot = greg(i);
    }
    state.rip = greg(16);
    state.rflags = (state.rflags & !SIGRETURN_FLAGS) | (greg(17) & SIGRETURN_FLAGS);
    thread.blocked_signals = mask & !(bit(SIGKILL) | bit(SIGSTOP));
    Some(state)
}
