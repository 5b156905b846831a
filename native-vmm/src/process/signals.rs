//! Signal delivery: which pending signal a thread takes, what Linux's default action does
//! with it, the real-time interval timer (alarm, setitimer ITIMER_REAL), and the frame a
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

use std::time::{Duration, Instant};

use super::{GuestProcess, SigAction, SS_DISABLE};
use crate::cpu::CpuSnapshot;
use crate::errno::Errno;
use crate::memory::GuestMemory;
use crate::status::RunStatus;
use crate::usermem::UserMemory;

pub const SIGKILL: u64 = 9;
pub const SIGSTOP: u64 = 19;
pub const SIGALRM: u64 = 14;
pub const SIG_DFL: u64 = 0;
pub const SIG_IGN: u64 = 1;
const SA_ONSTACK: u64 = 0x0800_0000;
pub const SA_RESTART: u64 = 0x1000_0000;
const SA_NODEFER: u64 = 0x4000_0000;
const SA_RESETHAND: u64 = 0x8000_0000;
const SS_ONSTACK: u32 = 1;
/// si_code: sent by kill (SI_USER), tkill/tgkill (SI_TKILL), or by the kernel (a timer).
pub const SI_USER: i32 = 0;
pub const SI_TKILL: i32 = -6;
pub const SI_KERNEL: i32 = 0x80;
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
    /// Run the handler of `sig`.
    Handler {
        sig: u64,
        action: SigAction,
        code: i32,
    },
    /// Linux's default action ends the process.
    End(RunStatus),
}

/// SIGALRM is due: made pending and the timer re-armed (or disarmed).
pub fn fire_timer(proc: &mut GuestProcess, now: Instant) {
    let Some(timer) = proc.signals.timer else {
        return;
    };
    if timer.next > now {
        return;
    }
    proc.signals.pending |= bit(SIGALRM);
    proc.signals.timer = timer.interval.map(|every| RealTimer {
        next: now.max(timer.next) + every,
        interval: Some(every),
    });
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

/// Takes the lowest signal ready for `tid` whose action is not to ignore it (ignored ones
/// are dropped on the way), as Linux does on the way back to user mode.
pub fn take(proc: &mut GuestProcess, tid: u64) -> Option<Taken> {
    const SIGCHLD: u64 = 17;
    const SIGCONT: u64 = 18;
    const SIGTSTP: u64 = 20;
    const SIGTTOU: u64 = 22;
    const SIGURG: u64 = 23;
    const SIGWINCH: u64 = 28;
    loop {
        let ready = ready_for(proc, tid);
        if ready == 0 {
            return None;
        }
        let sig = u64::from(ready.trailing_zeros()) + 1;
        let thread = proc.threads.get_mut(tid)?;
        let code = if thread.pending_signals & bit(sig) != 0 {
            SI_TKILL
        } else if sig == SIGALRM {
            SI_KERNEL
        } else {
            SI_USER
        };
        thread.pending_signals &= !bit(sig);
        proc.signals.pending &= !bit(sig);
        let action = proc.signals.actions[sig as usize];
        match action.handler {
            SIG_IGN => continue,
            SIG_DFL if matches!(sig, SIGCHLD | SIGCONT | SIGURG | SIGWINCH) => continue,
            // A stopped process with nobody to continue it never runs again.
            SIG_DFL if matches!(sig, SIGSTOP | SIGTSTP..=SIGTTOU) => {
                return Some(Taken::End(RunStatus::Unsupported {
                    syscall: 62,
                    name: "kill",
                }))
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
                return Some(Taken::Handler { sig, action, code });
            }
        }
    }
}

fn put(frame: &mut [u8], at: u64, value: u64) {
    frame[at as usize..at as usize + 8].copy_from_slice(&value.to_le_bytes());
}

/// Writes the frame for `sig`'s handler below `interrupted`'s stack (or on the alternate
/// stack with SA_ONSTACK), blocks the handler's mask for thread `tid`, and returns the
/// registers the handler starts with. A frame that does not fit in the program's memory is
/// EFAULT (Linux then kills the process with SIGSEGV).
pub fn push_frame(
    proc: &mut GuestProcess,
    mem: &GuestMemory,
    tid: u64,
    interrupted: CpuSnapshot,
    taken: (u64, SigAction, i32),
) -> Result<CpuSnapshot, Errno> {
    let (sig, action, code) = taken;
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
    // cs, gs, fs, ss as 16-bit selectors (user code and data), then err, trapno, oldmask.
    put(&mut frame, MCONTEXT_AT + 144, 0x33 | (0x2b << 48));
    put(&mut frame, MCONTEXT_AT + 168, mask);
    put(&mut frame, SIGMASK_AT, mask);
    let info = SIGINFO_AT as usize;
    frame[info..info + 4].copy_from_slice(&(sig as i32).to_le_bytes());
    frame[info + 8..info + 12].copy_from_slice(&code.to_le_bytes());
    if code != SI_KERNEL {
        frame[info + 16..info + 20].copy_from_slice(&(crate::abi::GUEST_PID as i32).to_le_bytes());
        frame[info + 20..info + 24].copy_from_slice(&(crate::abi::GUEST_UID as u32).to_le_bytes());
    }
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
/// registers the handler interrupted, and the frame's signal mask set for `tid`; None when no
/// frame of this thread is there (the stack is not what the program believes).
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
    let mask = UserMemory::new(mem).read_u64(addr + SIGMASK_AT).ok()?;
    thread.blocked_signals = mask & !(bit(SIGKILL) | bit(SIGSTOP));
    Some(frame.interrupted)
}
