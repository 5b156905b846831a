//! Signals: dispositions, the mask and the alternate stack are recorded so the program reads
//! back what it set, but no signal handler is ever run (there is no asynchronous event source,
//! and delivering one would mean building signal frames in guest memory).
//!
//! A signal the program sends to itself (raise, abort, os.kill(os.getpid(), ...)) takes effect
//! as Linux's default would when it is not blocked (or as soon as it is unblocked): ignored
//! signals are dropped, a terminating signal ends the run as `Exited { code: 128 + signal }`
//! (what a shell shows for a killed process), and a signal with a handler installed or one
//! that stops the process cannot be honoured and ends the run as unsupported. The mask and the
//! alternate stack are the calling thread's; dispositions and pending signals the process's.

use super::{stop_unsupported, ids::GUEST_PID, value, SysResult, SyscallOutcome, UserMemory};
use crate::errno::Errno;
use crate::process::{GuestProcess, SigAction, SIGNAL_COUNT, SS_DISABLE};
use crate::status::RunStatus;

const SIGKILL: u64 = 9;
const SIGSTOP: u64 = 19;
const SIG_DFL: u64 = 0;
const SIG_IGN: u64 = 1;
const SIG_BLOCK: u64 = 0;
const SIG_UNBLOCK: u64 = 1;
const SIG_SETMASK: u64 = 2;
/// The kernel's sigset_t is 64 bits.
const SIGSET_SIZE: u64 = 8;
const SS_ONSTACK: u32 = 1;
const SS_AUTODISARM: u32 = 1 << 31;
const MINSIGSTKSZ: u64 = 2048;

fn bit(sig: u64) -> u64 {
    1 << (sig - 1)
}

/// A signal number 1..=64, or EINVAL.
fn signal_number(sig: u64) -> Result<u64, Errno> {
    if (1..SIGNAL_COUNT as u64).contains(&sig) {
        Ok(sig)
    } else {
        Err(Errno::EINVAL)
    }
}

/// rt_sigaction(sig, act, oldact, sigsetsize)
pub(crate) fn rt_sigaction(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [sig, act, old, setsize, ..] = args;
    let sig = signal_number(sig)?;
    if setsize != SIGSET_SIZE {
        return Err(Errno::EINVAL);
    }
    if act != 0 && (sig == SIGKILL || sig == SIGSTOP) {
        return Err(Errno::EINVAL);
    }
    let new = if act != 0 {
        Some(SigAction { handler: user.read_u64(act)?, flags: user.read_u64(act + 8)?, restorer: user.read_u64(act + 16)?, mask: user.read_u64(act + 24)? })
    } else {
        None
    };
    if old != 0 {
        let cur = proc.signals.actions[sig as usize];
        let mut raw = [0u8; 32];
        for (i, field) in [cur.handler, cur.flags, cur.restorer, cur.mask].into_iter().enumerate() {
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

/// rt_sigprocmask(how, set, oldset, sigsetsize): unblocking a pending signal acts on it.
pub(crate) fn rt_sigprocmask(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [how, set, old, setsize, ..] = args;
    if setsize != SIGSET_SIZE {
        return Err(Errno::EINVAL);
    }
    let new = if set != 0 { Some(user.read_u64(set)?) } else { None };
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
    deliver_pending(proc, 14)
}

/// rt_sigpending(set, sigsetsize): signals sent while blocked.
pub(crate) fn rt_sigpending(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if args[1] != SIGSET_SIZE {
        return Err(Errno::EINVAL);
    }
    user.write_u64(args[0], proc.signals.pending & proc.threads.current().blocked_signals)?;
    value(0)
}

/// sigaltstack(ss, old_ss): recorded; SS_ONSTACK is never reported since no handler runs.
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
        Some(if flags & SS_DISABLE != 0 { (0, SS_DISABLE, 0) } else { (sp, flags & SS_AUTODISARM, size) })
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

/// kill(pid, sig): the only process is the guest itself, by its pid or as its own process
/// group (0). pid -1 means "every process but init and the caller": as pid 1 the guest is
/// init, so nothing is left to signal.
pub(crate) fn kill(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let pid = args[0] as i32 as i64;
    if pid != 0 && pid != GUEST_PID as i64 {
        return Err(Errno::ESRCH);
    }
    send_to_self(proc, args[1], 62)
}

/// tgkill(tgid, tid, sig): to any live thread of the guest (see `to_thread`).
pub(crate) fn tgkill(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    if args[0] as i32 as i64 <= 0 || args[1] as i32 as i64 <= 0 {
        return Err(Errno::EINVAL);
    }
    if args[0] != GUEST_PID {
        return Err(Errno::ESRCH);
    }
    to_thread(proc, args[1], args[2], 234)
}

/// tkill(tid, sig): as tgkill.
pub(crate) fn tkill(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    if args[0] as i32 as i64 <= 0 {
        return Err(Errno::EINVAL);
    }
    to_thread(proc, args[0], args[1], 200)
}

/// A signal to thread `tid`: since no handler ever runs, what it does (nothing, or the end of
/// the process) does not depend on which thread takes it, so it acts as one sent to the
/// process, checked against the calling thread's mask.
fn to_thread(proc: &mut GuestProcess, tid: u64, sig: u64, nr: u64) -> SysResult {
    if proc.threads.get(tid).is_none() {
        return Err(Errno::ESRCH);
    }
    send_to_self(proc, sig, nr)
}

fn send_to_self(proc: &mut GuestProcess, sig: u64, nr: u64) -> SysResult {
    if sig == 0 {
        return value(0); // only checks that the process exists
    }
    let sig = signal_number(sig)?;
    proc.signals.pending |= bit(sig);
    deliver_pending(proc, nr)
}

/// Acts on the lowest pending, unblocked signal, if any (see the module comment).
fn deliver_pending(proc: &mut GuestProcess, nr: u64) -> SysResult {
    let ready = proc.signals.pending & !proc.threads.current().blocked_signals;
    if ready == 0 {
        return value(0);
    }
    let sig = u64::from(ready.trailing_zeros()) + 1;
    proc.signals.pending &= !bit(sig);
    let handler = proc.signals.actions[sig as usize].handler;
    const SIGCHLD: u64 = 17;
    const SIGCONT: u64 = 18;
    const SIGTSTP: u64 = 20;
    const SIGTTOU: u64 = 22;
    const SIGURG: u64 = 23;
    const SIGWINCH: u64 = 28;
    match handler {
        SIG_IGN => deliver_pending(proc, nr),
        SIG_DFL if matches!(sig, SIGCHLD | SIGCONT | SIGURG | SIGWINCH) => deliver_pending(proc, nr),
        // A stopped process with nobody to continue it never runs again.
        SIG_DFL if matches!(sig, SIGSTOP | SIGTSTP..=SIGTTOU) => stop_unsupported(nr),
        SIG_DFL => Ok(SyscallOutcome::Stop(RunStatus::Exited { code: 128 + sig as i32 })),
        _ => stop_unsupported(nr),
    }
}
