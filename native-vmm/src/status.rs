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

impl GuestFault {
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
            RunStatus::Crashed { fault } => match fault.vector {
                0 | 16 | 19 => 136, // SIGFPE
                6 => 132,           // SIGILL
                _ => 139,           // SIGSEGV
            },
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
