//! Signal system calls: dispositions, masks and the alternate stack (the mask and the
//! alternate stack are the calling thread's; dispositions and process-directed pending
//! signals the process's), sending a signal to the guest itself (kill, tkill, tgkill), the
//! interval timers (alarm, setitimer and getitimer: real time, and CPU time for
//! ITIMER_VIRTUAL and ITIMER_PROF), waiting for a signal (pause, rt_sigsuspend,
//! rt_sigtimedwait) and rt_sigreturn. A sent signal only becomes pending here:
//! the scheduler takes it on the way back to the program (`process::signals`, `crate::sched`),
//! running its handler or Linux's default action.

use std::time::{Duration, Instant};

use super::{block, value, wait_ready, SysResult, SyscallOutcome, UserMemory};
use crate::errno::Errno;
use crate::process::signals::{self, bit, CpuTimer, RealTimer, SIGKILL, SIGSTOP, SIG_IGN};
use crate::process::threads::WaitOn;
use crate::process::{GuestProcess, SigAction, SIGNAL_COUNT, SS_DISABLE};
const SIG_BLOCK: u64 = 0;
const SIG_UNBLOCK: u64 = 1;
const SIG_SETMASK: u64 = 2;
/// The kernel's sigset_t is 64 bits.
const SIGSET_SIZE: u64 = 8;
const SS_ONSTACK: u32 = 1;
const SS_AUTODISARM: u32 = 1 << 31;
const MINSIGSTKSZ: u64 = 2048;

/// A signal number 1..=64, or EINVAL.
fn signal_number(sig: u64) -> Result<u64, Errno> {
    if (1..SIGNAL_COUNT as u64).contains(&sig) {
        Ok(sig)
    } else {
        Err(Errno::EINVAL)
    }
}

/// rt_sigaction(sig, act, oldact, sigsetsize)
pub(crate) fn rt_sigaction(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    let [sig, act, old, setsize, ..] = args;
    let sig = signal_number(sig)?;
    if setsize != SIGSET_SIZE {
        return Err(Errno::EINVAL);
    }
    if act != 0 && (sig == SIGKILL || sig == SIGSTOP) {
        return Err(Errno::EINVAL);
    }
    let new = if act != 0 {
        Some(SigAction {
            handler: user.read_u64(act)?,
            flags: user.read_u64(act + 8)?,
            restorer: user.read_u64(act + 16)?,
            mask: user.read_u64(act + 24)?,
        })
    } else {
        None
    };
    if old != 0 {
        let cur = proc.signals.actions[sig as usize];
        let mut raw = [0u8; 32];
        for (i, field) in [cur.handler, cur.flags, cur.restorer, cur.mask]
            .into_iter()
            .enumerate()
        {
            raw[i * 8..i * 8 + 8].copy_from_slice(&field.to_le_bytes());
        }
        user.write(old, &raw)?;
    }
    if let Some(new) = new {
        proc.signals.actions[sig as usize] = new;
        // Setting SIG_IGN discards a pending instance, as in Linux.
        if new.handler == SIG_IGN {
            proc.signals.pending &= !bit(sig);
        }
    }
    value(0)
}

/// rt_sigprocmask(how, set, oldset, sigsetsize): a pending signal it unblocks is taken as the
/// call returns.
pub(crate) fn rt_sigprocmask(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    let [how, set, old, setsize, ..] = args;
    if setsize != SIGSET_SIZE {
        return Err(Errno::EINVAL);
    }
    let new = if set != 0 {
        Some(user.read_u64(set)?)
    } else {
        None
    };
    if new.is_some() && !matches!(how, SIG_BLOCK | SIG_UNBLOCK | SIG_SETMASK) {
        return Err(Errno::EINVAL);
    }
    if old != 0 {
        user.write_u64(old, proc.threads.current().blocked_signals)?;
    }
    if let Some(new) = new {
        let blocked = match how {
            SIG_BLOCK => proc.threads.current().blocked_signals | new,
            SIG_UNBLOCK => proc.threads.current().blocked_signals & !new,
            _ => new,
        };
        proc.threads.current_mut().blocked_signals = blocked & !(bit(SIGKILL) | bit(SIGSTOP));
    }
    value(0)
}

/// rt_sigpending(set, sigsetsize): signals sent while blocked.
pub(crate) fn rt_sigpending(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    if args[1] != SIGSET_SIZE {
        return Err(Errno::EINVAL);
    }
    let thread = proc.threads.current();
    user.write_u64(
        args[0],
        (proc.signals.pending | thread.pending_signals) & thread.blocked_signals,
    )?;
    value(0)
}

/// sigaltstack(ss, old_ss)
pub(crate) fn sigaltstack(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [ss, old, ..] = args;
    let new = if ss != 0 {
        let sp = user.read_u64(ss)?;
        let flags = user.read_u32(ss + 8)?;
        let size = user.read_u64(ss + 16)?;
        if flags & !(SS_DISABLE | SS_AUTODISARM | SS_ONSTACK) != 0 {
            return Err(Errno::EINVAL);
        }
        if flags & SS_DISABLE == 0 && size < MINSIGSTKSZ {
            return Err(Errno::ENOMEM);
        }
        Some(if flags & SS_DISABLE != 0 {
            (0, SS_DISABLE, 0)
        } else {
            (sp, flags & SS_AUTODISARM, size)
        })
    } else {
        None
    };
    if old != 0 {
        let (sp, flags, size) = proc.threads.current().alt_stack;
        let mut raw = [0u8; 24];
        raw[..8].copy_from_slice(&sp.to_le_bytes());
        raw[8..12].copy_from_slice(&flags.to_le_bytes());
        raw[16..].copy_from_slice(&size.to_le_bytes());
        user.write(old, &raw)?;
    }
    if let Some(new) = new {
        proc.threads.current_mut().alt_stack = new;
    }
    value(0)
}

/// tgkill(tgid, tid, sig): to any live thread of the guest.
pub(crate) fn tgkill(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    if i64::from(args[0] as i32) <= 0 || i64::from(args[1] as i32) <= 0 {
        return Err(Errno::EINVAL);
    }
    if args[0] != proc.pid {
        return Err(Errno::ESRCH);
    }
    to_thread(proc, args[1], args[2])
}

/// tkill(tid, sig): as tgkill.
pub(crate) fn tkill(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    if i64::from(args[0] as i32) <= 0 {
        return Err(Errno::EINVAL);
    }
    to_thread(proc, args[0], args[1])
}

fn to_thread(proc: &mut GuestProcess, tid: u64, sig: u64) -> SysResult {
    let sig = signal_or_probe(sig)?;
    let thread = proc.threads.get_mut(tid).ok_or(Errno::ESRCH)?;
    if let Some(sig) = sig {
        thread.pending_signals |= bit(sig);
    }
    value(0)
}

/// A signal number, or None for 0 (which only checks that the target exists).
pub(super) fn signal_or_probe(sig: u64) -> Result<Option<u64>, Errno> {
    if sig == 0 {
        Ok(None)
    } else {
        signal_number(sig).map(Some)
    }
}

/// rt_sigreturn(): the scheduler restores what the handler interrupted.
pub(crate) fn rt_sigreturn(
    _proc: &mut GuestProcess,
    _user: &UserMemory,
    _args: [u64; 6],
) -> SysResult {
    Ok(SyscallOutcome::SigReturn)
}

/// pause(): waits until a signal interrupts it (-EINTR once its handler ran).
pub(crate) fn pause(_proc: &mut GuestProcess, _user: &UserMemory, _args: [u64; 6]) -> SysResult {
    block(WaitOn::Sleep, None)
}

/// rt_sigsuspend(mask, sigsetsize): waits with `mask` until a signal interrupts it; the
/// thread's own mask comes back when the handler returns.
pub(crate) fn rt_sigsuspend(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    if args[1] != SIGSET_SIZE {
        return Err(Errno::EINVAL);
    }
    let mask = user.read_u64(args[0])? & !(bit(SIGKILL) | bit(SIGSTOP));
    let thread = proc.threads.current_mut();
    thread.suspend_mask = Some(thread.blocked_signals);
    thread.blocked_signals = mask;
    block(WaitOn::Sleep, None)
}

const RT_SIGTIMEDWAIT: u64 = 128;

/// rt_sigtimedwait(set, info, timeout, sigsetsize): takes a pending signal of `set` (blocked
/// or not; its handler does not run) and returns its number, its siginfo written to `info`;
/// with none pending it waits for one, at most `timeout` (then EAGAIN; a zero timeout polls).
/// Another signal the thread would take ends the wait with EINTR.
pub(crate) fn rt_sigtimedwait(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    let [set, info, timeout, setsize, ..] = args;
    if setsize != SIGSET_SIZE {
        return Err(Errno::EINVAL);
    }
    let set = user.read_u64(set)? & !(bit(SIGKILL) | bit(SIGSTOP));
    let timeout = if timeout != 0 {
        let (sec, nsec) = user.read_timespec(timeout)?;
        Some(Duration::new(sec, nsec))
    } else {
        None
    };
    let tid = proc.threads.current_tid();
    if let Some((sig, siginfo)) = signals::take_from(proc, tid, set) {
        if info != 0 {
            user.write(info, &siginfo)?;
        }
        return value(sig);
    }
    let thread = proc.threads.current_mut();
    if thread.last_attempt || timeout.is_some_and(|t| t.is_zero()) {
        return Err(Errno::EAGAIN);
    }
    thread.awaited_signals = set;
    wait_ready(proc, timeout)
}

/// Whether blocked thread `tid` waits in rt_sigtimedwait for a signal now pending.
pub(crate) fn awaits_pending_signal(proc: &GuestProcess, tid: u64) -> bool {
    proc.threads
        .waiting_call(tid)
        .is_some_and(|call| call.nr == RT_SIGTIMEDWAIT)
        && proc
            .threads
            .get(tid)
            .is_some_and(|t| signals::pending_in(proc, tid, t.awaited_signals) != 0)
}

const ITIMER_REAL: u64 = 0;

/// Which interval timer setitimer and getitimer name: the real-time one, or a CPU-time one
/// (ITIMER_VIRTUAL, ITIMER_PROF: its slot in `SignalState::cpu_timers`). Both CPU-time timers
/// count all of the process's CPU time (the VMM's answering of its calls is not told apart
/// from its own running), so they run alike.
#[derive(Clone, Copy)]
enum Which {
    Real,
    Cpu(usize),
}

/// ITIMER_REAL, ITIMER_VIRTUAL or ITIMER_PROF, or EINVAL.
fn which(which: u64) -> Result<Which, Errno> {
    match which {
        ITIMER_REAL => Ok(Which::Real),
        1 | 2 => Ok(Which::Cpu(which as usize - 1)),
        _ => Err(Errno::EINVAL),
    }
}

/// The time left on a timer, and its interval. A timer that is due reads as just about to
/// expire, never as disarmed.
fn timer_value(proc: &GuestProcess, which: Which) -> (Duration, Duration) {
    let soon = Duration::from_micros(1);
    match which {
        Which::Real => proc.signals.timer.map_or(Default::default(), |t| {
            (
                t.next.saturating_duration_since(Instant::now()).max(soon),
                t.interval.unwrap_or_default(),
            )
        }),
        Which::Cpu(slot) => proc.signals.cpu_timers[slot].map_or(Default::default(), |t| {
            let used = proc.threads.process_cpu_ns();
            (
                Duration::from_nanos(t.next_ns.saturating_sub(used)).max(soon),
                Duration::from_nanos(t.interval_ns),
            )
        }),
    }
}

fn arm(proc: &mut GuestProcess, which: Which, value: Duration, interval: Duration) {
    match which {
        Which::Real => {
            proc.signals.timer = (!value.is_zero()).then(|| RealTimer {
                next: Instant::now() + value,
                interval: (!interval.is_zero()).then_some(interval),
            });
        }
        Which::Cpu(slot) => {
            let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            proc.signals.cpu_timers[slot] = (!value.is_zero()).then(|| CpuTimer {
                next_ns: proc.threads.process_cpu_ns().saturating_add(nanos(value)),
                interval_ns: nanos(interval),
            });
        }
    }
}

fn write_itimerval(
    user: &UserMemory,
    addr: u64,
    (value, interval): (Duration, Duration),
) -> Result<(), Errno> {
    let mut raw = [0u8; 32];
    for (i, d) in [interval, value].into_iter().enumerate() {
        raw[i * 16..i * 16 + 8].copy_from_slice(&d.as_secs().to_le_bytes());
        raw[i * 16 + 8..i * 16 + 16].copy_from_slice(&u64::from(d.subsec_micros()).to_le_bytes());
    }
    user.write(addr, &raw)
}

/// getitimer(which, curr_value)
pub(crate) fn getitimer(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let which = which(args[0])?;
    write_itimerval(user, args[1], timer_value(proc, which))?;
    value(0)
}

/// setitimer(which, new_value, old_value)
pub(crate) fn setitimer(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let which = which(args[0])?;
    let new = if args[1] != 0 {
        Some((
            user.read_timeval(args[1])?,
            user.read_timeval(args[1] + 16)?,
        ))
    } else {
        None
    };
    if args[2] != 0 {
        write_itimerval(user, args[2], timer_value(proc, which))?;
    }
    let (interval, value_) = new.unwrap_or_default();
    arm(proc, which, value_, interval);
    value(0)
}

/// alarm(seconds): the seconds left on the previous timer (rounded up), 0 if none.
pub(crate) fn alarm(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (left, _) = timer_value(proc, Which::Real);
    let before = if proc.signals.timer.is_some() {
        left.as_secs() + u64::from(left.subsec_nanos() > 0)
    } else {
        0
    };
    arm(
        proc,
        Which::Real,
        Duration::from_secs(u64::from(args[0] as u32)),
        Duration::ZERO,
    );
    value(before)
}
