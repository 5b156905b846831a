//! The boundary between the run loop and whatever executes guest instructions.
//!
//! The product backend is KVM (`kvm/`): a vCPU in long mode whose CPL0 stub turns every
//! `syscall` and exception into an exit. The run loop (`vm.rs`) only sees this trait, so the
//! same loader, syscall table and limits drive every backend.

use std::io;
use std::time::Instant;

use crate::codec::{DecodeError, Decoder, Encoder};
use crate::memory::GuestMemory;
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

/// The first address past the lower (user) half of the 48-bit address space.
pub const USER_ADDRESS_LIMIT: u64 = 1 << 47;

/// rflags bits a CPL3 program controls (CF, PF, AF, ZF, SF, TF, DF, OF, AC, ID). Every
/// state loaded into a vCPU keeps only these, with IF and the reserved bit 1 set, as Linux's
/// return to user space does: IOPL, NT, RF and VM never come from the program.
pub const USER_RFLAGS_MASK: u64 = 0x0024_0DD5;
const RFLAGS_ALWAYS: u64 = (1 << 1) | (1 << 9);

/// A user state no CPL3 program can be in: loading it would fault in the VMM's stubs (or fail
/// the VM entry) instead of in the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidUserState {
    /// rip is not a canonical address of the user half.
    Rip(u64),
    /// rsp is not canonical.
    Rsp(u64),
    /// The FS base is not canonical.
    FsBase(u64),
    /// The GS base is not canonical.
    GsBase(u64),
}

impl std::fmt::Display for InvalidUserState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            InvalidUserState::Rip(v) => write!(f, "rip {v:#x} is not a user address"),
            InvalidUserState::Rsp(v) => write!(f, "rsp {v:#x} is not a canonical address"),
            InvalidUserState::FsBase(v) => write!(f, "FS base {v:#x} is not a canonical address"),
            InvalidUserState::GsBase(v) => write!(f, "GS base {v:#x} is not a canonical address"),
        }
    }
}

impl std::error::Error for InvalidUserState {}

/// Whether `addr` is canonical: bits 63..47 all equal.
pub fn is_canonical(addr: u64) -> bool {
    let top = addr >> 47;
    top == 0 || top == (1 << 17) - 1
}

/// `rflags` as a CPL3 program can hold them.
pub fn user_rflags(rflags: u64) -> u64 {
    rflags & USER_RFLAGS_MASK | RFLAGS_ALWAYS
}

impl CpuSnapshot {
    /// Checks that a CPL3 program could be in this state by itself: what every path from guest
    /// memory, a checkpoint file or a program's request to a vCPU's registers runs first.
    /// Bases may be any canonical value (wrfsbase/wrgsbase set those), rip only a user one.
    pub fn check_user(&self) -> Result<(), InvalidUserState> {
        if self.rip >= USER_ADDRESS_LIMIT {
            return Err(InvalidUserState::Rip(self.rip));
        }
        if !is_canonical(self.regs.rsp) {
            return Err(InvalidUserState::Rsp(self.regs.rsp));
        }
        if !is_canonical(self.fs_base) {
            return Err(InvalidUserState::FsBase(self.fs_base));
        }
        if !is_canonical(self.gs_base) {
            return Err(InvalidUserState::GsBase(self.gs_base));
        }
        Ok(())
    }
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
    /// After `run` returned `CpuExit::Fault`: the program's state at the instruction that
    /// faulted (for a trap such as `int3`, after it), so that a signal handler can start
    /// from it with `load_thread`. None when the backend cannot resume a thread that faulted:
    /// the fault then ends the process.
    fn fault_state(&mut self) -> io::Result<Option<CpuSnapshot>> {
        Ok(None)
    }
    /// Whether `fork_onto` can make a vCPU (asked before the memory is copied for it).
    fn can_fork(&self) -> bool {
        false
    }
    /// A vCPU of the same backend in a new VM on `mem` (a copy of this VM's memory: a process
    /// forked inside the guest), stopped in the system call `state` was taken in, as
    /// `snapshot` took it. Backends that cannot keep this default: the guest cannot fork.
    fn fork_onto<'n>(
        &self,
        _mem: &'n GuestMemory,
        _state: &CpuSnapshot,
    ) -> io::Result<Box<dyn GuestCpu + 'n>> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this vCPU backend cannot fork",
        ))
    }
    /// A vCPU of the same backend in a new VM on `mem`, where a program was just loaded
    /// (execve): at `entry` with `stack_pointer`.
    fn exec_onto<'n>(
        &self,
        _mem: &'n GuestMemory,
        _entry: u64,
        _stack_pointer: u64,
    ) -> io::Result<Box<dyn GuestCpu + 'n>> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this vCPU backend cannot start a program",
        ))
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

// ---- in template and session files (crate::snapshot), and in a thread's saved state ----

fn regs_array(r: &UserRegs) -> [u64; 16] {
    [
        r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.rsp, r.r8, r.r9, r.r10, r.r11, r.r12,
        r.r13, r.r14, r.r15,
    ]
}

pub fn encode_cpu(cpu: &CpuSnapshot, e: &mut Encoder) {
    for v in regs_array(&cpu.regs) {
        e.u64(v);
    }
    for v in [cpu.rip, cpu.rflags, cpu.fs_base, cpu.gs_base] {
        e.u64(v);
    }
    e.bytes(&cpu.xsave);
}

pub fn decode_cpu(d: &mut Decoder) -> Result<CpuSnapshot, DecodeError> {
    let mut v = [0u64; 16];
    for slot in v.iter_mut() {
        *slot = d.u64("register")?;
    }
    let [rax, rbx, rcx, rdx, rsi, rdi, rbp, rsp, r8, r9, r10, r11, r12, r13, r14, r15] = v;
    let regs = UserRegs {
        rax,
        rbx,
        rcx,
        rdx,
        rsi,
        rdi,
        rbp,
        rsp,
        r8,
        r9,
        r10,
        r11,
        r12,
        r13,
        r14,
        r15,
    };
    let (rip, rflags, fs_base, gs_base) = (
        d.u64("rip")?,
        d.u64("rflags")?,
        d.u64("fs base")?,
        d.u64("gs base")?,
    );
    let xsave = d.bytes("XSAVE area")?.to_vec();
    if xsave.len() < XSAVE_MIN_BYTES {
        return Err(DecodeError::new(format!(
            "XSAVE area of {} bytes is shorter than its header",
            xsave.len()
        )));
    }
    let cpu = CpuSnapshot {
        regs,
        rip,
        rflags,
        fs_base,
        gs_base,
        xsave,
    };
    cpu.check_user()
        .map_err(|e| DecodeError::new(format!("CPU state: {e}")))?;
    Ok(cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(rip: u64, rsp: u64, fs_base: u64, gs_base: u64) -> CpuSnapshot {
        CpuSnapshot {
            regs: UserRegs {
                rsp,
                ..UserRegs::default()
            },
            rip,
            rflags: 0x202,
            fs_base,
            gs_base,
            xsave: Vec::new(),
        }
    }

    #[test]
    fn user_states_are_those_a_cpl3_program_can_reach() {
        let kernel_half = 0xffff_8880_0000_0000;
        assert_eq!(
            state(0x40_1000, 0x7fff_f000, 0x1000, 0).check_user(),
            Ok(())
        );
        // wrfsbase/wrgsbase take any canonical value; a negative rsp is the program's.
        assert_eq!(
            state(0x40_1000, kernel_half, kernel_half, kernel_half).check_user(),
            Ok(())
        );
        let cases = [
            (
                state(USER_ADDRESS_LIMIT, 0, 0, 0),
                InvalidUserState::Rip(USER_ADDRESS_LIMIT),
            ),
            (
                state(kernel_half, 0, 0, 0),
                InvalidUserState::Rip(kernel_half),
            ),
            (
                state(0x40_1000, 1 << 63, 0, 0),
                InvalidUserState::Rsp(1 << 63),
            ),
            (
                state(0x40_1000, 0, 1 << 47, 0),
                InvalidUserState::FsBase(1 << 47),
            ),
            (
                state(0x40_1000, 0, 0, 0x8000_0000_0000_0000),
                InvalidUserState::GsBase(1 << 63),
            ),
        ];
        for (s, why) in cases {
            assert_eq!(s.check_user(), Err(why), "{s:x?}");
        }
    }

    #[test]
    fn loaded_rflags_keep_only_what_cpl3_controls() {
        // IOPL 3, NT, RF and VM dropped; IF and bit 1 set; the arithmetic flags, TF, DF, AC, ID kept.
        assert_eq!(user_rflags(0x3000 | 0x4000 | 0x1_0000 | 0x2_0000), 0x202);
        assert_eq!(user_rflags(0), 0x202);
        assert_eq!(user_rflags(0x24_0DD5), 0x24_0FD7);
    }
}
