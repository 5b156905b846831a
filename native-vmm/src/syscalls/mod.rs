//! The Linux system-call layer: one table (table.rs) mapping numbers to handlers.

use crate::memory::GuestMemory;
use crate::process::GuestProcess;
use crate::status::RunStatus;

/// What the run loop does after a system call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyscallOutcome {
    /// Resume the guest with this value in rax (negative errno as two's complement).
    Return(u64),
    /// arch_prctl(ARCH_SET_FS): set the vCPU's FS base, return 0.
    SetFsBase(u64),
    /// Stop the guest with this status (exit, out of memory, output limit, unsupported...).
    Stop(RunStatus),
}

/// Handles system call `nr` with its six argument registers.
pub fn dispatch(_proc: &mut GuestProcess, _mem: &GuestMemory, nr: u64, _args: [u64; 6]) -> SyscallOutcome {
    SyscallOutcome::Stop(RunStatus::Unsupported { syscall: nr, name: "unknown" })
}
