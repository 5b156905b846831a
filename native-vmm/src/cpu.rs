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
    /// The deadline passed while the guest was running (the run's, or a time slice's).
    DeadlineReached,
}

/// The user-level state of a guest stopped inside a system call (a template's ready point),
/// the same for every backend: a snapshot taken on one restores on another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuSnapshot {
    /// General registers as the program left them at `syscall` (rax is the system call's
    /// number; the restored guest sees the value given to `set_syscall_return` instead; rcx
    /// and r11 hold rip and rflags, as the `syscall` instruction leaves them).
    pub regs: UserRegs,
    /// Where the program resumes: the instruction after its `syscall`.
    pub rip: u64,
    pub rflags: u64,
    pub fs_base: u64,
    pub gs_base: u64,
    /// x87/SSE/AVX state in the standard (non-compacted) XSAVE layout: the 512-byte legacy
    /// area, the 64-byte header (XSTATE_BV says which components hold state), then the
    /// components at their architectural offsets.
    pub xsave: Vec<u8>,
}

/// General-purpose registers (rip and rflags are kept beside them in `CpuSnapshot`). Laid
/// out as the first sixteen fields of `struct kvm_regs`, so the KVM backend's register block
/// (`kvm::abi::KvmRegs`) embeds them as they are instead of copying field by field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserRegs {
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rsp: u64,
    pub rbp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
}

/// The legacy FXSAVE area plus the XSAVE header: the smallest valid XSAVE image.
pub const XSAVE_MIN_BYTES: usize = 512 + 64;
/// Offset of XSTATE_BV (in the XSAVE header).
pub const XSAVE_XSTATE_BV: usize = 512;
/// Offset of XCOMP_BV; zero in the standard layout.
pub const XSAVE_XCOMP_BV: usize = 520;

pub trait GuestCpu {
    /// Runs the guest until its next system call or exception, or until `deadline`.
    fn run(&mut self, deadline: Instant) -> io::Result<CpuExit>;
    /// Sets rax for the system call the guest is stopped in; the next `run` resumes after it.
    fn set_syscall_return(&mut self, value: u64) -> io::Result<()>;
    /// Sets the FS segment base (arch_prctl ARCH_SET_FS, TLS).
    fn set_fs_base(&mut self, base: u64) -> io::Result<()>;
    /// The guest's user-level state while it is stopped inside a system call (the vCPU must
    /// have just returned `CpuExit::Syscall` and not run since). Backends that cannot take
    /// one (test doubles) keep this default.
    fn snapshot(&mut self) -> io::Result<CpuSnapshot> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this vCPU backend cannot take a snapshot",
        ))
    }
    /// Lets the guest reach exactly the guest-physical `ranges` (sorted, disjoint; rounded out
    /// as the backend needs), so that an access anywhere else faults as it would on Linux. The
    /// run loop calls it before the first run and whenever the program is handed more memory.
    /// Backends whose guest reaches all of its memory anyway keep this default.
    fn map_memory(&mut self, _ranges: &[(u64, u64)]) -> io::Result<()> {
        Ok(())
    }
    /// From now on, records which guest pages the guest writes (`take_written_pages`); false
    /// when this backend cannot, and checkpoints then hold every page the VM changed.
    fn track_writes(&mut self) -> io::Result<bool> {
        Ok(false)
    }
    /// The guest pages the guest wrote since `track_writes` or the last call (None: not
    /// tracked). The VMM's own writes are `GuestMemory::take_written`'s.
    fn take_written_pages(&mut self) -> io::Result<Option<crate::memory::PageSet>> {
        Ok(None)
    }
    /// Exits the backend answered itself since the last call, without returning from `run`
    /// (KVM: a first touch of memory whose slot waited for it), so that a run's exit count
    /// includes them.
    fn take_inner_exits(&mut self) -> u64 {
        0
    }
    /// Whether `load_thread` works, so the guest may have threads.
    fn switches_threads(&self) -> bool {
        false
    }
    /// Makes the vCPU resume another thread: `state` as `snapshot` or `interrupted_state`
    /// took it (from this vCPU or one restored from the same template). Afterwards the vCPU
    /// counts as stopped in a system call: `set_syscall_return` sets rax, `snapshot` reads the
    /// state back.
    fn load_thread(&mut self, _state: &CpuSnapshot) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this vCPU backend cannot switch threads",
        ))
    }
    /// After `run` returned `DeadlineReached` because a time slice (not the run) ended: the
    /// state of the thread it interrupted in program code, to resume later with `load_thread`;
    /// None when the vCPU was inside the VMM's stubs (it reaches its next exit within a few
    /// instructions) or the backend cannot preempt.
    fn interrupted_state(&mut self) -> io::Result<Option<CpuSnapshot>> {
        Ok(None)
    }
    /// Puts the vCPU back into `snapshot`'s state, as `restore` would create it (general,
    /// segment, control and vector registers, MSRs, XCR0), stopped inside the snapshot's
    /// system call, whatever it was doing when its last run ended. With the memory reset to
    /// the template too, the VM is then indistinguishable from a fresh fork. Backends that
    /// cannot (test doubles) keep this default, and their VMs are never reused.
    fn reset(&mut self, _snapshot: &CpuSnapshot) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this vCPU backend cannot be reset",
        ))
    }
}
