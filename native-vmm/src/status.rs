//! How a guest run ended. Each limit the VMM enforces is a distinct status, reported together
//! with the output the program produced before it.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunStatus {
    /// The program called exit/exit_group.
    Exited { code: i32 },
    /// The wall-clock limit passed.
    Timeout { limit_ms: u64 },
    /// An allocation did not fit in the guest memory limit.
    OutOfMemory { limit_bytes: u64 },
    /// stdout+stderr reached the output cap; output is truncated there.
    OutputLimit { cap_bytes: u64 },
    /// The program moved (or was about to move) more network bytes than its cap.
    NetworkLimit { limit_bytes: u64 },
    /// A CPU exception at CPL3: the program crashed.
    Crashed { fault: GuestFault },
    /// The program made a system call we do not implement and could not go on.
    Unsupported { syscall: u64, name: &'static str },
    /// Every thread waits for something no thread can do any more (an untimed futex wait, a
    /// read of a pipe only a waiting thread could fill): the program could never go on, so it
    /// ends now instead of at its time limit.
    Deadlocked { threads: u64 },
}

/// A CPU exception raised by guest code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestFault {
    pub vector: u8,
    pub error_code: u64,
    pub rip: u64,
    /// CR2 for page faults.
    pub address: Option<u64>,
}

/// si_code values of the signals a fault sends (Linux's `asm-generic/siginfo.h`).
const FPE_INTDIV: i32 = 1;
const FPE_FLTINV: i32 = 7;
const ILL_ILLOPN: i32 = 2;
const SEGV_MAPERR: i32 = 1;
const SEGV_ACCERR: i32 = 2;
const BUS_ADRALN: i32 = 1;
const TRAP_TRACE: i32 = 2;
const SI_KERNEL: i32 = 0x80;

/// What Linux's trap handlers send the thread a fault happened on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultSignal {
    pub signal: u64,
    /// si_code.
    pub code: i32,
    /// si_addr: the address a page fault reached, the instruction of a divide error, an
    /// invalid opcode or a single step; zero otherwise.
    pub address: u64,
}

impl GuestFault {
    /// The signal, si_code and si_addr Linux gives this fault (arch/x86/kernel/traps.c, for
    /// floating-point errors without decoding the status word: FPE_FLTINV).
    pub fn signal(&self) -> FaultSignal {
        let (signal, code, address) = match self.vector {
            0 => (8, FPE_INTDIV, self.rip),
            1 => (5, TRAP_TRACE, self.rip),
            3 => (5, SI_KERNEL, 0),
            6 => (4, ILL_ILLOPN, self.rip),
            11 | 12 => (7, SI_KERNEL, 0),
            14 if self.error_code & 1 != 0 => (11, SEGV_ACCERR, self.address.unwrap_or(self.rip)),
            14 => (11, SEGV_MAPERR, self.address.unwrap_or(self.rip)),
            16 | 19 => (8, FPE_FLTINV, self.rip),
            17 => (7, BUS_ADRALN, 0),
            _ => (11, SI_KERNEL, 0),
        };
        FaultSignal {
            signal,
            code,
            address,
        }
    }

    pub fn name(&self) -> &'static str {
        match self.vector {
            0 => "divide error",
            1 => "debug",
            3 => "breakpoint",
            4 => "overflow",
            5 => "bound range exceeded",
            6 => "invalid opcode",
            7 => "device not available",
            8 => "double fault",
            10 => "invalid TSS",
            11 => "segment not present",
            12 => "stack fault",
            13 => "general protection fault",
            14 => "segmentation fault (page fault)",
            16 => "x87 floating-point error",
            17 => "alignment check",
            18 => "machine check",
            19 => "SIMD floating-point error",
            _ => "CPU exception",
        }
    }
}

impl RunStatus {
    /// The short, stable name used on the CLI and in the daemon protocol.
    pub fn kind(&self) -> &'static str {
        match self {
            RunStatus::Exited { code: 0 } => "ok",
            RunStatus::Exited { .. } => "error",
            RunStatus::Timeout { .. } => "timeout",
            RunStatus::OutOfMemory { .. } => "out_of_memory",
            RunStatus::OutputLimit { .. } => "output_limit",
            RunStatus::NetworkLimit { .. } => "network_limit",
            RunStatus::Crashed { .. } => "crashed",
            RunStatus::Unsupported { .. } => "unsupported",
            RunStatus::Deadlocked { .. } => "deadlocked",
        }
    }

    /// Exit code for the CLI: the program's own, or 128+signal as a shell would show it.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunStatus::Exited { code } => *code,
            RunStatus::Timeout { .. } => 124,
            RunStatus::OutOfMemory { .. } => 137,
            RunStatus::OutputLimit { .. } => 141,
            RunStatus::NetworkLimit { .. } => 153, // SIGXFSZ: a transfer past its limit
            RunStatus::Crashed { fault } => 128 + fault.signal().signal as i32,
            RunStatus::Unsupported { .. } => 159, // SIGSYS
            RunStatus::Deadlocked { .. } => 142,  // SIGALRM: ended before its time limit would have
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunStatus::Exited { code } => write!(f, "exited with code {code}"),
            RunStatus::Timeout { limit_ms } => {
                write!(f, "timeout: wall-clock limit of {limit_ms} ms reached")
            }
            RunStatus::OutOfMemory { limit_bytes } => write!(
                f,
                "out of memory: guest limit of {} MiB reached",
                limit_bytes >> 20
            ),
            RunStatus::OutputLimit { cap_bytes } => {
                write!(f, "output limit: truncated at {cap_bytes} bytes")
            }
            RunStatus::NetworkLimit { limit_bytes } => {
                write!(f, "network limit: {limit_bytes} bytes moved")
            }
            RunStatus::Crashed { fault } => {
                write!(
                    f,
                    "crashed: {} (vector {}) at rip {:#x}",
                    fault.name(),
                    fault.vector,
                    fault.rip
                )?;
                if let Some(addr) = fault.address {
                    write!(f, ", address {addr:#x}")?;
                }
                Ok(())
            }
            RunStatus::Unsupported { syscall, name } => {
                write!(f, "unsupported: system call {name} ({syscall})")
            }
            RunStatus::Deadlocked { threads: 1 } => write!(
                f,
                "deadlocked: the program's only thread waits for something that can never happen"
            ),
            RunStatus::Deadlocked { threads } => write!(
                f,
                "deadlocked: all {threads} threads wait, and none can wake another"
            ),
        }
    }
}
