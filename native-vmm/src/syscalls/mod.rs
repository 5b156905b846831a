//! The Linux system-call layer: one table (table.rs) mapping numbers to handlers, grouped by
//! area: files (fds, paths, pipes, output), sockets (in-memory socketpairs), poll and epoll
//! (readiness), memory, ids (process identity and
//! creation), time, signals, and misc (system information, randomness, limits, futex, thread setup).

pub(crate) mod agent;
mod epoll;
mod files;
mod ids;
mod memory;
mod misc;
mod poll;
mod signals;
mod sockets;
mod table;
mod time;
mod user;

#[cfg(test)]
mod tests;

use crate::errno::Errno;
use crate::memory::GuestMemory;
use crate::process::GuestProcess;
use crate::status::RunStatus;

pub use table::{name, Policy, SyscallEntry, TABLE};
pub use user::UserMemory;

/// What the run loop does after a system call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyscallOutcome {
    /// Resume the guest with this value in rax (negative errno as two's complement).
    Return(u64),
    /// arch_prctl(ARCH_SET_FS): set the vCPU's FS base, return 0.
    SetFsBase(u64),
    /// Stop the guest with this status (exit, out of memory, output limit, unsupported...).
    Stop(RunStatus),
    /// The agent awaits its request and none is pending: stop the guest inside this call, the
    /// template's ready point (see `crate::agent`); the call is answered once a request is set.
    ReadyPoint,
}

/// What a handler produces: an outcome, or an errno returned to the guest as -errno.
pub type SysResult = Result<SyscallOutcome, Errno>;

/// A handler's plain return value.
pub(crate) fn value(v: u64) -> SysResult {
    Ok(SyscallOutcome::Return(v))
}

/// Stops the run as unsupported because call `nr` cannot be honoured: it would wait forever
/// (the guest has one thread and no signal is ever delivered, so nothing could wake it), or it
/// would need a signal handler to run.
pub(crate) fn stop_unsupported(nr: u64) -> SysResult {
    Ok(SyscallOutcome::Stop(RunStatus::Unsupported { syscall: nr, name: name(nr).unwrap_or("unknown") }))
}

/// Handles system call `nr` with its six argument registers.
pub fn dispatch(proc: &mut GuestProcess, mem: &GuestMemory, nr: u64, args: [u64; 6]) -> SyscallOutcome {
    proc.count_call(nr);
    let Some(entry) = table::lookup(nr) else {
        proc.count_unsupported(nr);
        return SyscallOutcome::Return(Errno::ENOSYS.as_return());
    };
    match entry.policy {
        Policy::Emulate(handler) => match handler(proc, &UserMemory::new(mem), args) {
            Ok(outcome) => {
                if matches!(outcome, SyscallOutcome::Stop(RunStatus::Unsupported { .. })) {
                    proc.count_unsupported(nr);
                }
                outcome
            }
            Err(errno) => SyscallOutcome::Return(errno.as_return()),
        },
        Policy::Refuse(errno) => {
            if errno == Errno::ENOSYS {
                proc.count_unsupported(nr);
            }
            SyscallOutcome::Return(errno.as_return())
        }
        Policy::Stop => {
            proc.count_unsupported(nr);
            SyscallOutcome::Stop(RunStatus::Unsupported { syscall: nr, name: entry.name })
        }
    }
}
