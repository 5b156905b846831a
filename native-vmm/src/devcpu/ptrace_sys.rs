//! Host FFI for the ptrace development CPU: fork, ptrace, waitpid, kill (through the libc crate).
//!
//! Every `unsafe` block of `devcpu` lives here. The child side of the fork runs in a copy of a
//! multi-threaded process, so it makes only raw system calls (no allocation, no locks) until
//! its registers are replaced by the tracer.

use std::ffi::{c_int, c_long, c_void};
use std::io;
use std::os::fd::RawFd;

use libc::{ptrace, syscall};

pub use libc::{SIGBUS, SIGFPE, SIGILL, SIGKILL, SIGSEGV, SIGSTOP, SIGTRAP};

/// The register set holding the XSAVE area in the standard (non-compacted) layout (not in
/// Debian's libc crate, 0.2.139).
const NT_X86_XSTATE: c_long = 0x202;
/// Room for the largest XSAVE area of current CPUs (AMX tile data ends below 12 KiB).
const XSTATE_BUFFER: usize = 16 << 10;
/// `arch` of a system call made through the 64-bit `syscall` instruction (linux/audit.h).
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
/// PROT_READ | PROT_WRITE | PROT_EXEC, as a raw mmap argument.
const PROT_RWX: c_long = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as c_long;

/// Exit codes of a child that failed before its first stop (reported by `describe_child_exit`).
const CHILD_TRACEME_FAILED: c_long = 120;
const CHILD_RESUMED_UNTRACED: c_long = 122;
/// A failed mmap exits with this plus its errno (errno values below 100 fit in the status).
const CHILD_MAP_FAILED_BASE: c_long = 128;

/// The x86-64 `struct user_regs_struct` of PTRACE_GETREGS/SETREGS.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Regs {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub rbp: u64,
    pub rbx: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rax: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub orig_rax: u64,
    pub rip: u64,
    pub cs: u64,
    pub eflags: u64,
    pub rsp: u64,
    pub ss: u64,
    pub fs_base: u64,
    pub gs_base: u64,
    pub ds: u64,
    pub es: u64,
    pub fs: u64,
    pub gs: u64,
}

/// The fields of a `siginfo_t` the development CPU reads (signal number, code, faulting address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SigInfo {
    pub signo: i32,
    pub code: i32,
    pub addr: u64,
}

/// How a waited-for child changed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStatus {
    /// A PTRACE_SYSEMU system-call stop (reported as SIGTRAP|0x80 thanks to TRACESYSGOOD).
    SyscallStop,
    /// A signal-delivery stop with this signal.
    SignalStop(i32),
    Exited(i32),
    Killed(i32),
}

fn check(ret: c_long) -> io::Result<c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Forks a child that becomes a ptrace tracee of the calling thread, maps `[start, start+len)`
/// of `memfd` at the same addresses (read, write, execute; shared, so the parent's view of guest
/// memory is the child's), closes every other fd and stops itself with SIGSTOP.
pub fn spawn_tracee(memfd: RawFd, start: u64, len: u64) -> io::Result<i32> {
    // SAFETY: the child branch below makes only raw system calls and never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        child_setup(memfd, start, len);
    }
    Ok(pid)
}

/// The child half of `spawn_tracee`: async-signal-safe raw system calls only.
fn child_setup(memfd: RawFd, start: u64, len: u64) -> ! {
    // The tracer is the forking thread; die with it rather than run the guest untraced.
    // SAFETY: raw system call with integer arguments.
    unsafe {
        syscall(
            libc::SYS_prctl,
            c_long::from(libc::PR_SET_PDEATHSIG),
            c_long::from(SIGKILL),
            0 as c_long,
            0 as c_long,
            0 as c_long,
        )
    };
    // SAFETY: raw system call with integer arguments.
    if unsafe {
        syscall(
            libc::SYS_ptrace,
            c_long::from(libc::PTRACE_TRACEME),
            0 as c_long,
            0 as c_long,
            0 as c_long,
        )
    } < 0
    {
        exit_child(CHILD_TRACEME_FAILED);
    }
    // SAFETY: maps the memfd at fixed addresses that were checked to be free (NOREPLACE fails
    // rather than clobbering anything the forked copy still has there).
    let at = unsafe {
        syscall(
            libc::SYS_mmap,
            start as c_long,
            len as c_long,
            PROT_RWX,
            c_long::from(libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE),
            c_long::from(memfd),
            start as c_long,
        )
    };
    if at != start as c_long {
        // last_os_error reads errno without allocating. A kernel that ignores NOREPLACE and
        // maps elsewhere leaves errno 0.
        let errno = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(0)
            .clamp(0, 99);
        exit_child(CHILD_MAP_FAILED_BASE + c_long::from(errno));
    }
    // The guest never reaches the host kernel, so it needs no fd; holding copies of the
    // parent's pipes would only delay EOF for other threads' subprocesses.
    // SAFETY: raw system call with integer arguments; nothing in this process uses fds any more.
    unsafe {
        syscall(
            libc::SYS_close_range,
            0 as c_long,
            c_long::from(u32::MAX),
            0 as c_long,
        )
    };
    // SAFETY: raw system calls with integer arguments.
    unsafe {
        syscall(
            libc::SYS_kill,
            syscall(libc::SYS_getpid),
            c_long::from(SIGSTOP),
        )
    };
    // Reached only if the tracer resumed us without installing the guest's registers.
    exit_child(CHILD_RESUMED_UNTRACED)
}

fn exit_child(code: c_long) -> ! {
    loop {
        // SAFETY: exit_group takes an integer and does not return.
        unsafe { syscall(libc::SYS_exit_group, code) };
    }
}

/// Explains the exit code of a child that ended before its first stop.
pub fn describe_child_exit(code: i32) -> String {
    match c_long::from(code) {
        CHILD_TRACEME_FAILED => "PTRACE_TRACEME failed in the child (ptrace forbidden here?)".into(),
        CHILD_RESUMED_UNTRACED => "the child was resumed without guest registers".into(),
        c if c >= CHILD_MAP_FAILED_BASE => format!(
            "mapping guest memory (read/write/execute, shared) at its guest-physical addresses failed in the child: {}",
            io::Error::from_raw_os_error((c - CHILD_MAP_FAILED_BASE) as i32)
        ),
        _ => format!("the child exited with code {code} before its first stop"),
    }
}

/// Waits for the next state change of `pid` (retrying on EINTR).
pub fn wait(pid: i32) -> io::Result<WaitStatus> {
    let mut status: c_int = 0;
    loop {
        // SAFETY: status is a valid out-pointer for the duration of the call.
        let ret = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        if ret >= 0 {
            break;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    let low = status & 0x7f;
    Ok(if low == 0 {
        WaitStatus::Exited((status >> 8) & 0xff)
    } else if status & 0xff == 0x7f {
        let sig = (status >> 8) & 0xff;
        if sig == SIGTRAP | 0x80 {
            WaitStatus::SyscallStop
        } else {
            WaitStatus::SignalStop(sig)
        }
    } else {
        WaitStatus::Killed(low)
    })
}

pub fn set_options_exitkill_sysgood(pid: i32) -> io::Result<()> {
    // SAFETY: PTRACE_SETOPTIONS reads no memory; the options travel in `data`.
    check(unsafe {
        ptrace(
            libc::PTRACE_SETOPTIONS,
            pid,
            std::ptr::null_mut::<c_void>(),
            (libc::PTRACE_O_EXITKILL | libc::PTRACE_O_TRACESYSGOOD) as usize as *mut c_void,
        )
    })?;
    Ok(())
}

pub fn get_regs(pid: i32) -> io::Result<Regs> {
    let mut regs = Regs::default();
    // SAFETY: regs is a valid, writable user_regs_struct.
    check(unsafe {
        ptrace(
            libc::PTRACE_GETREGS,
            pid,
            std::ptr::null_mut::<c_void>(),
            &mut regs as *mut Regs as *mut c_void,
        )
    })?;
    Ok(regs)
}

pub fn set_regs(pid: i32, regs: &Regs) -> io::Result<()> {
    // SAFETY: the kernel only reads the user_regs_struct behind the pointer.
    check(unsafe {
        ptrace(
            libc::PTRACE_SETREGS,
            pid,
            std::ptr::null_mut::<c_void>(),
            regs as *const Regs as *mut c_void,
        )
    })?;
    Ok(())
}

/// The tracee's XSAVE area (x87, SSE, AVX... state), standard layout, as long as the host's.
pub fn get_xstate(pid: i32) -> io::Result<Vec<u8>> {
    let mut area = vec![0u8; XSTATE_BUFFER];
    let mut iov = libc::iovec {
        iov_base: area.as_mut_ptr().cast(),
        iov_len: area.len(),
    };
    // SAFETY: iov describes `area`, writable for iov.len bytes; the kernel shrinks iov.len to
    // what it wrote.
    check(unsafe {
        ptrace(
            libc::PTRACE_GETREGSET,
            pid,
            NT_X86_XSTATE as *mut c_void,
            &mut iov as *mut libc::iovec,
        )
    })?;
    area.truncate(iov.iov_len.min(XSTATE_BUFFER));
    Ok(area)
}

/// Loads an XSAVE area (standard layout) into the tracee.
pub fn set_xstate(pid: i32, area: &[u8]) -> io::Result<()> {
    let mut copy = area.to_vec();
    let mut iov = libc::iovec {
        iov_base: copy.as_mut_ptr().cast(),
        iov_len: copy.len(),
    };
    // SAFETY: iov describes `copy`, readable for iov.len bytes, alive for the call.
    check(unsafe {
        ptrace(
            libc::PTRACE_SETREGSET,
            pid,
            NT_X86_XSTATE as *mut c_void,
            &mut iov as *mut libc::iovec,
        )
    })?;
    Ok(())
}

/// Resumes a stopped tracee until its next system call (which is not executed) or signal,
/// delivering `signal` (0 for none).
pub fn sysemu(pid: i32, signal: i32) -> io::Result<()> {
    // SAFETY: PTRACE_SYSEMU reads no memory; the signal travels in `data`.
    check(unsafe {
        ptrace(
            libc::PTRACE_SYSEMU,
            pid,
            std::ptr::null_mut::<c_void>(),
            c_long::from(signal) as *mut c_void,
        )
    })?;
    Ok(())
}

pub fn get_siginfo(pid: i32) -> io::Result<SigInfo> {
    // siginfo_t is 128 bytes: signo, errno, code (i32 each), padding, then the union whose
    // first field for SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGTRAP is si_addr.
    let mut raw = [0u64; 16];
    // SAFETY: raw is a writable 128-byte buffer, the size of siginfo_t.
    check(unsafe {
        ptrace(
            libc::PTRACE_GETSIGINFO,
            pid,
            std::ptr::null_mut::<c_void>(),
            raw.as_mut_ptr() as *mut c_void,
        )
    })?;
    Ok(SigInfo {
        signo: raw[0] as u32 as i32,
        code: (raw[1] & 0xffff_ffff) as u32 as i32,
        addr: raw[2],
    })
}

/// Whether the system call the tracee is stopped at was made with the 64-bit `syscall`
/// instruction (as opposed to a 32-bit entry such as `int 0x80`).
pub fn stopped_at_64bit_syscall(pid: i32) -> io::Result<bool> {
    // struct ptrace_syscall_info: op (u8), 3 bytes of padding, arch (u32), then fields we skip.
    let mut raw = [0u64; 11];
    let size = std::mem::size_of_val(&raw);
    // SAFETY: raw is a writable buffer of `size` bytes; the kernel writes at most that much.
    check(unsafe {
        ptrace(
            libc::PTRACE_GET_SYSCALL_INFO,
            pid,
            size as *mut c_void,
            raw.as_mut_ptr() as *mut c_void,
        )
    })?;
    Ok((raw[0] >> 32) as u32 == AUDIT_ARCH_X86_64)
}

pub fn send_signal(pid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: kill takes integers only.
    check(c_long::from(unsafe { libc::kill(pid, sig) }))?;
    Ok(())
}
