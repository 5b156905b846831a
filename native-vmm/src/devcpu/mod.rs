//! A development CPU for tests only: runs the guest program natively in a ptrace'd child.
//!
//! THIS IS NOT AN ISOLATION BOUNDARY and is never used by the CLI or the daemon. It exists
//! because development and CI machines have no usable /dev/kvm: with it, the ELF loader, the
//! syscall layer and the file image run real programs end to end in tests.
//!
//! How it works (the idea of gVisor's ptrace platform): a forked child maps the guest-memory
//! memfd at the same addresses as guest-physical (so guest-virtual == guest-physical, as under
//! KVM's identity map), then its registers are replaced by the guest's. It is resumed with
//! PTRACE_SYSEMU, so every `syscall` stops it *before* the host kernel runs anything and is
//! answered by our syscall layer; CPU exceptions arrive as signal stops. Guest memory below
//! the vDSO's pages (`layout::VVAR_ADDR`) is left unmapped, as the system area is invisible to
//! CPL3 under KVM. The vDSO's data page is the memfd's own, zeros: the vDSO makes system calls.
//!
//! Known differences from KVM, harmless for tests of well-behaved programs: the child still
//! has the test process's own mappings (far above guest memory), so a wild guest pointer there
//! does not fault; page-fault error codes carry only the user and present bits (ptrace does
//! not report the rest); a #GP raised by the host kernel has error code 0.
//!
//! The child is traced by the thread that created the `PtraceCpu`: run it on that thread.

// ptrace's register file is the kernel's user_regs_struct: u64 words that hold signed values.
#![allow(clippy::cast_sign_loss, clippy::cast_possible_wrap)]

mod ptrace_sys;
mod watchdog;

use std::io;
use std::os::fd::AsRawFd;
use std::time::Instant;

use crate::cpu::{CpuExit, CpuSnapshot, GuestCpu, UserRegs};
use crate::layout::VVAR_ADDR;
use crate::memory::GuestMemory;
use crate::status::GuestFault;
use ptrace_sys::{Regs, SigInfo, WaitStatus};
use watchdog::DeadlineWatchdog;

/// A guest vCPU backed by a ptrace'd host process (tests only, see the module doc).
pub struct PtraceCpu {
    // Field order matters: the watchdog (which signals the pid) stops before the tracee is reaped.
    watchdog: DeadlineWatchdog,
    tracee: Tracee,
    /// The tracee's registers as of its last stop, with our pending changes.
    regs: Regs,
    /// `regs` holds changes that must reach the tracee before it runs again.
    regs_dirty: bool,
    /// `regs` was read at the current stop (a deadline stop does not read them).
    regs_current: bool,
    /// After `load_thread`: the number of the system call the loaded thread is stopped in
    /// (what `snapshot` reports as rax; the tracee's own stop is another thread's).
    loaded_call: Option<u64>,
}

impl PtraceCpu {
    /// Starts a stopped guest whose first instruction is `entry`, with `stack_pointer` in rsp,
    /// every other general register 0 and no FS base.
    pub fn new(mem: &GuestMemory, entry: u64, stack_pointer: u64) -> io::Result<PtraceCpu> {
        PtraceCpu::start(mem, |host| Regs {
            rip: entry,
            rsp: stack_pointer,
            // Not inside a system call: nothing for the kernel to restart on resume.
            orig_rax: u64::MAX,
            // Interrupts enabled (bit 9) and the always-one bit 1, as at process start.
            eflags: 0x202,
            cs: host.cs,
            ss: host.ss,
            ds: host.ds,
            es: host.es,
            ..Regs::default()
        })
    }

    /// Starts a guest in the state `snapshot` recorded (on `mem`, which holds the snapshot's
    /// memory: the template's, copied, since the child shares it). The first `run` resumes
    /// after the system call the snapshot was taken in, returning what `set_syscall_return`
    /// set (the snapshot's rax until then).
    pub fn restore(mem: &GuestMemory, snapshot: &CpuSnapshot) -> io::Result<PtraceCpu> {
        let cpu = PtraceCpu::start(mem, |host| tracee_regs(host, snapshot))?;
        ptrace_sys::set_xstate(cpu.pid(), &snapshot.xsave)?;
        Ok(cpu)
    }

    /// Spawns the tracee on `mem` and gives it the registers `regs` makes from the host's
    /// (for the segment selectors, which must stay the host's).
    fn start(mem: &GuestMemory, regs: impl FnOnce(&Regs) -> Regs) -> io::Result<PtraceCpu> {
        ensure_range_free(VVAR_ADDR, mem.size())?;
        // The child maps the memfd shared: a copy-on-write fork's private pages are in no file.
        let memfd = mem.fd().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "development CPU: a copy-on-write fork of guest memory cannot be shared with the traced child (give it a copy)"))?;
        let pid = ptrace_sys::spawn_tracee(memfd.as_raw_fd(), VVAR_ADDR, mem.size() - VVAR_ADDR)?;
        let tracee = Tracee { pid };
        match ptrace_sys::wait(pid)? {
            WaitStatus::SignalStop(ptrace_sys::SIGSTOP) => {}
            WaitStatus::Exited(code) => {
                return Err(io::Error::other(format!(
                    "development CPU: {}",
                    ptrace_sys::describe_child_exit(code)
                )))
            }
            other => {
                return Err(io::Error::other(format!(
                    "development CPU: unexpected first stop of the child: {other:?}"
                )))
            }
        }
        ptrace_sys::set_options_exitkill_sysgood(pid)?;
        let regs = regs(&ptrace_sys::get_regs(pid)?);
        let watchdog = DeadlineWatchdog::start(pid)?;
        Ok(PtraceCpu {
            watchdog,
            tracee,
            regs,
            regs_dirty: true,
            regs_current: true,
            loaded_call: None,
        })
    }

    fn pid(&self) -> i32 {
        self.tracee.pid
    }

    /// The registers at the current stop, for changing.
    fn regs_mut(&mut self) -> io::Result<&mut Regs> {
        if !self.regs_current {
            self.regs = ptrace_sys::get_regs(self.pid())?;
            self.regs_current = true;
        }
        self.regs_dirty = true;
        Ok(&mut self.regs)
    }

    fn read_regs(&mut self) -> io::Result<()> {
        self.regs = ptrace_sys::get_regs(self.pid())?;
        self.regs_current = true;
        Ok(())
    }
}

impl GuestCpu for PtraceCpu {
    fn run(&mut self, deadline: Instant) -> io::Result<CpuExit> {
        if Instant::now() >= deadline {
            return Ok(CpuExit::DeadlineReached);
        }
        self.watchdog.arm(deadline);
        if self.regs_dirty {
            ptrace_sys::set_regs(self.pid(), &self.regs)?;
            self.regs_dirty = false;
        }
        self.regs_current = false;
        self.loaded_call = None;
        loop {
            ptrace_sys::sysemu(self.pid(), 0)?;
            match ptrace_sys::wait(self.pid())? {
                WaitStatus::SyscallStop => {
                    self.read_regs()?;
                    if !ptrace_sys::stopped_at_64bit_syscall(self.pid())? {
                        return Ok(CpuExit::Fault(int80_fault(self.regs.rip)));
                    }
                    let r = &self.regs;
                    return Ok(CpuExit::Syscall {
                        nr: r.orig_rax,
                        args: [r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9],
                    });
                }
                WaitStatus::SignalStop(ptrace_sys::SIGSTOP) => {
                    if Instant::now() >= deadline {
                        return Ok(CpuExit::DeadlineReached);
                    }
                    // A watchdog stop for an earlier deadline: swallow it and go on.
                }
                WaitStatus::SignalStop(sig) => {
                    let info = ptrace_sys::get_siginfo(self.pid())?;
                    self.read_regs()?;
                    if let Some(fault) = fault_from_signal(sig, &info, self.regs.rip) {
                        return Ok(CpuExit::Fault(fault));
                    }
                    // Any other signal comes from outside the guest (the guest's own signals
                    // are emulated by the syscall layer): suppress it.
                }
                WaitStatus::Exited(code) => {
                    return Err(io::Error::other(format!(
                        "development CPU: guest process exited on its own (code {code})"
                    )))
                }
                WaitStatus::Killed(sig) => {
                    return Err(io::Error::other(format!(
                        "development CPU: guest process killed by signal {sig}"
                    )))
                }
            }
        }
    }

    fn set_syscall_return(&mut self, value: u64) -> io::Result<()> {
        self.regs_mut()?.rax = value;
        Ok(())
    }

    fn set_fs_base(&mut self, base: u64) -> io::Result<()> {
        self.regs_mut()?.fs_base = base;
        Ok(())
    }

    /// Under PTRACE_SYSEMU a system-call stop is taken after the `syscall` instruction: rip
    /// already points past it, rcx and r11 hold rip and rflags.
    fn snapshot(&mut self) -> io::Result<CpuSnapshot> {
        let nr = match self.loaded_call {
            Some(nr) if self.regs_current => nr,
            _ if !self.regs_current || self.regs.orig_rax == u64::MAX => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "development CPU: a snapshot needs the guest stopped in a system call",
                ));
            }
            _ => self.regs.orig_rax,
        };
        Ok(user_state(
            &self.regs,
            nr,
            ptrace_sys::get_xstate(self.pid())?,
        ))
    }

    fn switches_threads(&self) -> bool {
        true
    }

    fn load_thread(&mut self, state: &CpuSnapshot) -> io::Result<()> {
        if !self.regs_current {
            self.read_regs()?;
        }
        ptrace_sys::set_xstate(self.pid(), &state.xsave)?;
        self.regs = tracee_regs(&self.regs, state);
        self.regs_dirty = true;
        self.loaded_call = Some(state.regs.rax);
        Ok(())
    }

    /// The tracee was stopped by the watchdog's SIGSTOP: wherever it was, that is program code.
    /// If `run` saw the slice over before resuming it, it is still stopped in its system call,
    /// its answer not yet written: None, it switches at its next call instead.
    fn interrupted_state(&mut self) -> io::Result<Option<CpuSnapshot>> {
        if self.regs_current {
            return Ok(None);
        }
        self.read_regs()?;
        Ok(Some(user_state(
            &self.regs,
            self.regs.rax,
            ptrace_sys::get_xstate(self.pid())?,
        )))
    }
}

/// The tracee registers that resume `state`, with the host's segment selectors from `host`.
fn tracee_regs(host: &Regs, state: &CpuSnapshot) -> Regs {
    let r = &state.regs;
    Regs {
        r15: r.r15,
        r14: r.r14,
        r13: r.r13,
        r12: r.r12,
        rbp: r.rbp,
        rbx: r.rbx,
        r11: r.r11,
        r10: r.r10,
        r9: r.r9,
        r8: r.r8,
        rax: r.rax,
        rcx: r.rcx,
        rdx: r.rdx,
        rsi: r.rsi,
        rdi: r.rdi,
        // The tracee is in a signal stop or its system call was already skipped: nothing for
        // the kernel to restart on resume.
        orig_rax: u64::MAX,
        rip: state.rip,
        eflags: state.rflags,
        rsp: r.rsp,
        fs_base: state.fs_base,
        gs_base: state.gs_base,
        cs: host.cs,
        ss: host.ss,
        ds: host.ds,
        es: host.es,
        ..Regs::default()
    }
}

/// The guest state in tracee registers `r`, with `rax` as the value of rax.
fn user_state(r: &Regs, rax: u64, xsave: Vec<u8>) -> CpuSnapshot {
    let regs = UserRegs {
        rax,
        rbx: r.rbx,
        rcx: r.rcx,
        rdx: r.rdx,
        rsi: r.rsi,
        rdi: r.rdi,
        rbp: r.rbp,
        rsp: r.rsp,
        r8: r.r8,
        r9: r.r9,
        r10: r.r10,
        r11: r.r11,
        r12: r.r12,
        r13: r.r13,
        r14: r.r14,
        r15: r.r15,
    };
    CpuSnapshot {
        regs,
        rip: r.rip,
        rflags: r.eflags,
        fs_base: r.fs_base,
        gs_base: r.gs_base,
        xsave,
    }
}

/// The fault `int 0x80` (the 32-bit system call gate) raises in the KVM guest, whose IDT ends
/// at vector 31: #GP with an error code naming IDT entry 0x80. The host kernel would instead run
/// it as an i386 system call, so the development CPU reports the fault the product would see.
fn int80_fault(rip_after: u64) -> GuestFault {
    const IDT_ENTRY_0X80: u64 = 0x80 << 3 | 2;
    GuestFault {
        vector: 13,
        error_code: IDT_ENTRY_0X80,
        rip: rip_after.wrapping_sub(2),
        address: None,
    }
}

/// Translates the signal the host kernel raised for a CPU exception back into that exception.
/// ptrace does not expose the page-fault error code, so it carries only what siginfo tells:
/// user mode (bit 2), and present (bit 0) for an access error on a mapped page.
fn fault_from_signal(sig: i32, info: &SigInfo, rip: u64) -> Option<GuestFault> {
    const SI_KERNEL: i32 = 0x80;
    const SEGV_ACCERR: i32 = 2;
    const BUS_ADRALN: i32 = 1;
    const FPE_INTDIV: i32 = 1;
    const FPE_INTOVF: i32 = 2;
    const PF_USER: u64 = 4;
    const PF_PRESENT: u64 = 1;
    let (vector, error_code, address) = match sig {
        // #GP (and other faults without an address) arrive as SIGSEGV from SI_KERNEL.
        ptrace_sys::SIGSEGV if info.code == SI_KERNEL => (13, 0, None),
        ptrace_sys::SIGSEGV => (
            14,
            PF_USER
                | if info.code == SEGV_ACCERR {
                    PF_PRESENT
                } else {
                    0
                },
            Some(info.addr),
        ),
        ptrace_sys::SIGBUS if info.code == BUS_ADRALN => (17, 0, Some(info.addr)),
        ptrace_sys::SIGBUS => (13, 0, Some(info.addr)),
        ptrace_sys::SIGILL => (6, 0, None),
        ptrace_sys::SIGFPE if info.code == FPE_INTDIV || info.code == FPE_INTOVF => (0, 0, None),
        ptrace_sys::SIGFPE => (19, 0, None),
        ptrace_sys::SIGTRAP => (3, 0, None),
        _ => return None,
    };
    Some(GuestFault {
        vector,
        error_code,
        rip,
        address,
    })
}

/// Fails unless `[start, end)` is unmapped in this process, so the child (a copy of it) can
/// map guest memory there. The test binary is PIE and mapped high, so this normally holds.
fn ensure_range_free(start: u64, end: u64) -> io::Result<()> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    for line in maps.lines() {
        let range = line.split_whitespace().next().unwrap_or("");
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        if lo < end && hi > start {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("development CPU: guest range {start:#x}..{end:#x} overlaps this process's mapping {line:?}; use a smaller guest memory"),
            ));
        }
    }
    Ok(())
}

/// The traced child: killed and reaped on drop.
struct Tracee {
    pid: i32,
}

impl Drop for Tracee {
    fn drop(&mut self) {
        let _ = ptrace_sys::send_signal(self.pid, ptrace_sys::SIGKILL);
        while let Ok(WaitStatus::SignalStop(_) | WaitStatus::SyscallStop) =
            ptrace_sys::wait(self.pid)
        {}
    }
}

#[cfg(test)]
mod tests;
