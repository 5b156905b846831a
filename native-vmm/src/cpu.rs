//! The boundary between the run loop and whatever executes guest instructions.
//!
//! The product backend is KVM (`kvm/`): a vCPU in long mode whose CPL0 stub turns every
//! `syscall` and exception into an exit. The run loop (`vm.rs`) only sees this trait, so the
//! same loader, syscall table and limits drive every backend.

use std::io;
use std::time::Instant;

use crate::status::GuestFault;

/// Why the guest stopped running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuExit {
    /// The guest executed `syscall`: rax and the six argument registers.
    Syscall { nr: u64, args: [u64; 6] },
    /// A CPU exception at CPL3.
    Fault(GuestFault),
    /// The deadline passed while the guest was running.
    DeadlineReached,
}

pub trait GuestCpu {
    /// Runs the guest until its next system call or exception, or until `deadline`.
    fn run(&mut self, deadline: Instant) -> io::Result<CpuExit>;
    /// Sets rax for the system call the guest is stopped in; the next `run` resumes after it.
    fn set_syscall_return(&mut self, value: u64) -> io::Result<()>;
    /// Sets the FS segment base (arch_prctl ARCH_SET_FS, TLS).
    fn set_fs_base(&mut self, base: u64) -> io::Result<()>;
}
