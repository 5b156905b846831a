//! The daemon confines itself once it is set up (`sandfork-vmm serve`, after its socket, KVM,
//! templates, pools and /proc/self/pagemap are open): no_new_privs, then one seccomp-bpf filter
//! for every thread of the process (SECCOMP_FILTER_FLAG_TSYNC; threads started later inherit it)
//! that allows only the host system calls serving needs. Anything else kills the process
//! (SECCOMP_RET_KILL_PROCESS: SIGSYS), which the supervisor restarts; killing only the thread
//! would leave the daemon running with a worker or a connection silently gone and its locks held.
//!
//! The allow-list: KVM ioctls (type 0xAE) and PAGEMAP_SCAN, no other ioctl; memory management
//! of its own mappings; reads and writes on descriptors it already holds (the socket it serves,
//! its connections, stderr for its log); threads (clone with CLONE_THREAD only; clone3 answers
//! ENOSYS so that glibc falls back to clone, whose flags a filter can see); futexes, signals
//! between its own threads, time, entropy; guests' network egress: creating TCP and UDP sockets
//! of AF_INET and AF_INET6 only (`crate::net::host`: no Unix, netlink, packet or raw sockets,
//! no bind or listen), connecting them, reading their names. Not allowed: exec, fork, ptrace,
//! mount, changing identity. Opening a path is refused with EACCES rather than
//! fatal: glibc opens files of its own on rare paths (malloc reads
//! /sys/devices/system/cpu/online when it first wants another arena; `confine` sets the arena
//! limit so that it does not), and a refusal opens nothing either. (unlink is allowed: the daemon
//! removes its socket file when it stops.)
//!
//! A daemon that keeps sessions (`serve --sessions DIR`) writes, syncs, renames and maps their
//! checkpoint files while it serves, so its filter also allows opening files and the calls on
//! `SESSION_FILES` (`Confinement::WithSessionFiles`); everything else stays as above.

use crate::sys::{self, SockFilter};
use std::io;

const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const ENOSYS: u32 = 38;

// Offsets in struct seccomp_data.
const NR: u32 = 0;
const ARCH: u32 = 4;
/// The low 32 bits of argument `i`.
const fn arg(i: u32) -> u32 {
    16 + 8 * i
}

const KVM_IOCTL_TYPE: u32 = 0xAE00;
const IOCTL_TYPE_MASK: u32 = 0xFF00;
const CLONE_THREAD: u32 = 0x10000;
const PR_SET_NAME: u32 = 15;

// x86-64 numbers.
const IOCTL: u32 = 16;
const SOCKET: u32 = 41;
const CLONE: u32 = 56;
const PRCTL: u32 = 157;
const CLONE3: u32 = 435;
const OPEN: u32 = 2;
const OPENAT: u32 = 257;
const EACCES: u32 = 13;
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
const SOCK_STREAM: u32 = 1;
const SOCK_DGRAM: u32 = 2;
const SOCK_TYPE_MASK: u32 = 0xf;

/// Allowed whatever their arguments (x86-64 numbers).
const ALLOWED: &[(u32, &str)] = &[
    (0, "read"),
    (1, "write"),
    (3, "close"),
    (5, "fstat"),
    (7, "poll"),
    (8, "lseek"),
    (9, "mmap"),
    (10, "mprotect"),
    (11, "munmap"),
    (12, "brk"),
    (13, "rt_sigaction"),
    (14, "rt_sigprocmask"),
    (15, "rt_sigreturn"),
    (17, "pread64"),
    (18, "pwrite64"), // guest memory's memfds and layers
    (24, "sched_yield"),
    (25, "mremap"),
    (28, "madvise"),
    (35, "nanosleep"),
    (39, "getpid"),
    (44, "sendto"),
    (45, "recvfrom"),
    (46, "sendmsg"),
    (47, "recvmsg"),
    (42, "connect"), // guests' egress, to addresses their policy allows
    (48, "shutdown"),
    (51, "getsockname"),
    (52, "getpeername"),
    (54, "setsockopt"),
    (55, "getsockopt"),
    (60, "exit"),
    (72, "fcntl"),
    (77, "ftruncate"),
    (87, "unlink"), // the socket file, at shutdown
    (98, "getrusage"),
    (128, "rt_sigtimedwait"),
    (131, "sigaltstack"),
    (186, "gettid"),
    (202, "futex"),
    (204, "sched_getaffinity"),
    (219, "restart_syscall"),
    (228, "clock_gettime"),
    (230, "clock_nanosleep"),
    (231, "exit_group"),
    (234, "tgkill"),
    (262, "newfstatat"),
    (271, "ppoll"),
    (273, "set_robust_list"),
    (288, "accept4"),
    (318, "getrandom"),
    (319, "memfd_create"),
    (332, "statx"), // std's metadata calls; the socket file's, at shutdown
    (334, "rseq"),
];

/// The file-system calls of session checkpoints (`snapshot::checkpoint`, `daemon::sessions`):
/// durable (vectored) writes, vectored reads into a restored VM's memory, atomic renames, the
/// folder per session, listing them after a restart, flushing the data folder's file system
/// for the checkpoints written together (syncfs), and linking a session's template's image
/// into the template folder it is saved as (linkat).
const SESSION_FILES: &[(u32, &str)] = &[
    (20, "writev"),
    (265, "linkat"),
    (74, "fsync"),
    (75, "fdatasync"),
    (306, "syncfs"),
    (82, "rename"),
    (83, "mkdir"),
    (217, "getdents64"),
    (295, "preadv"),
    (258, "mkdirat"),
    (263, "unlinkat"),
    (264, "renameat"),
    (316, "renameat2"),
];

/// What the filter lets the daemon do with files beyond the descriptors it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confinement {
    /// Opening a path fails with EACCES.
    NoFiles,
    /// Sessions' checkpoint files: opening paths and `SESSION_FILES`.
    WithSessionFiles,
}

fn stmt(code: u16, k: u32) -> SockFilter {
    SockFilter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> SockFilter {
    SockFilter { code, jt, jf, k }
}

/// The filter program (see the module comment).
pub fn program(confinement: Confinement) -> Vec<SockFilter> {
    let allowed: Vec<(u32, &str)> = match confinement {
        Confinement::NoFiles => ALLOWED.to_vec(),
        Confinement::WithSessionFiles => ALLOWED.iter().chain(SESSION_FILES).copied().collect(),
    };
    let open = match confinement {
        Confinement::NoFiles => RET_ERRNO | EACCES,
        Confinement::WithSessionFiles => RET_ALLOW,
    };
    let mut p = vec![
        stmt(BPF_LD_W_ABS, ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET_K, RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, NR),
        // x32 numbers alias the x86-64 ones with this bit set.
        jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET_K, RET_KILL_PROCESS),
    ];
    // Each allowed number jumps to the final ALLOW; the checked calls jump to their blocks,
    // which follow the KILL below. Jump offsets count instructions after the jump.
    let checked: [(u32, Vec<SockFilter>); 7] = [
        (
            IOCTL,
            vec![
                stmt(BPF_LD_W_ABS, arg(1)),
                jump(BPF_JEQ_K, sys::PAGEMAP_SCAN as u32, 3, 0),
                stmt(BPF_AND_K, IOCTL_TYPE_MASK),
                jump(BPF_JEQ_K, KVM_IOCTL_TYPE, 1, 0),
                stmt(BPF_RET_K, RET_KILL_PROCESS),
                stmt(BPF_RET_K, RET_ALLOW),
            ],
        ),
        (
            CLONE,
            vec![
                stmt(BPF_LD_W_ABS, arg(0)),
                stmt(BPF_AND_K, CLONE_THREAD),
                jump(BPF_JEQ_K, CLONE_THREAD, 1, 0),
                stmt(BPF_RET_K, RET_KILL_PROCESS),
                stmt(BPF_RET_K, RET_ALLOW),
            ],
        ),
        (
            PRCTL,
            vec![
                stmt(BPF_LD_W_ABS, arg(0)),
                jump(BPF_JEQ_K, PR_SET_NAME, 1, 0),
                stmt(BPF_RET_K, RET_KILL_PROCESS),
                stmt(BPF_RET_K, RET_ALLOW),
            ],
        ),
        (
            SOCKET,
            vec![
                stmt(BPF_LD_W_ABS, arg(0)),
                jump(BPF_JEQ_K, AF_INET, 1, 0),
                jump(BPF_JEQ_K, AF_INET6, 0, 4),
                stmt(BPF_LD_W_ABS, arg(1)),
                stmt(BPF_AND_K, SOCK_TYPE_MASK),
                jump(BPF_JEQ_K, SOCK_STREAM, 2, 0),
                jump(BPF_JEQ_K, SOCK_DGRAM, 1, 0),
                stmt(BPF_RET_K, RET_KILL_PROCESS),
                stmt(BPF_RET_K, RET_ALLOW),
            ],
        ),
        (CLONE3, vec![stmt(BPF_RET_K, RET_ERRNO | ENOSYS)]),
        (OPEN, vec![stmt(BPF_RET_K, open)]),
        (OPENAT, vec![stmt(BPF_RET_K, open)]),
    ];
    let dispatch_len = allowed.len() + checked.len();
    // After the dispatch: KILL, then the checked blocks, then ALLOW.
    let blocks_len: usize = checked.iter().map(|(_, b)| b.len()).sum();
    for (i, &(nr, _)) in allowed.iter().enumerate() {
        let to_allow = dispatch_len - i - 1 + 1 + blocks_len;
        p.push(jump(
            BPF_JEQ_K,
            nr,
            u8::try_from(to_allow).expect("the filter's jumps fit in 8 bits"),
            0,
        ));
    }
    let mut block_start = 0;
    for (j, (nr, block)) in checked.iter().enumerate() {
        let i = allowed.len() + j;
        let to_block = dispatch_len - i - 1 + 1 + block_start;
        p.push(jump(
            BPF_JEQ_K,
            *nr,
            u8::try_from(to_block).expect("the filter's jumps fit in 8 bits"),
            0,
        ));
        block_start += block.len();
    }
    p.push(stmt(BPF_RET_K, RET_KILL_PROCESS));
    for (_, block) in checked {
        p.extend(block);
    }
    p.push(stmt(BPF_RET_K, RET_ALLOW));
    p
}

/// Sets no_new_privs and installs `program(confinement)` on every thread of the process.
pub fn confine(confinement: Confinement) -> io::Result<()> {
    sys::limit_malloc_arenas(std::thread::available_parallelism().map_or(2, |n| n.get()) * 8)?;
    sys::set_no_new_privs()?;
    sys::install_seccomp_filter(&program(confinement))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BPF interpreter for the instructions `program` uses, over one seccomp_data.
    fn run(program: &[SockFilter], nr: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&AUDIT_ARCH_X86_64.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let insn = program[pc];
            pc += 1;
            match insn.code {
                BPF_LD_W_ABS => {
                    acc = u32::from_le_bytes(
                        data[insn.k as usize..insn.k as usize + 4]
                            .try_into()
                            .unwrap(),
                    )
                }
                BPF_AND_K => acc &= insn.k,
                BPF_JEQ_K => pc += usize::from(if acc == insn.k { insn.jt } else { insn.jf }),
                BPF_JGE_K => pc += usize::from(if acc >= insn.k { insn.jt } else { insn.jf }),
                BPF_RET_K => return insn.k,
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    #[test]
    fn the_filter_allows_the_list_and_kills_everything_else() {
        let p = program(Confinement::NoFiles);
        assert!(p.len() < 4096, "BPF_MAXINSNS");
        for &(nr, name) in ALLOWED {
            assert_eq!(run(&p, nr, [0; 6]), RET_ALLOW, "{name}");
        }
        assert_eq!(run(&p, OPEN, [0; 6]), RET_ERRNO | EACCES);
        assert_eq!(run(&p, OPENAT, [0; 6]), RET_ERRNO | EACCES);
        // socket: TCP and UDP of AF_INET and AF_INET6 only.
        for (family, kind) in [(2, 1), (2, 2), (10, 1), (10, 0x80802)] {
            assert_eq!(
                run(&p, SOCKET, [family, kind, 0, 0, 0, 0]),
                RET_ALLOW,
                "socket({family}, {kind:#x})"
            );
        }
        for (family, kind) in [(1, 1), (16, 3), (17, 3), (2, 3), (10, 5)] {
            assert_eq!(
                run(&p, SOCKET, [family, kind, 0, 0, 0, 0]),
                RET_KILL_PROCESS,
                "socket({family}, {kind:#x})"
            );
        }
        for (nr, name) in [
            (49, "bind"),
            (50, "listen"),
            (59, "execve"),
            (57, "fork"),
            (58, "vfork"),
            (101, "ptrace"),
            (165, "mount"),
            (105, "setuid"),
            (62, "kill"),
            (322, "execveat"),
            (1023, "unknown"),
        ] {
            assert_eq!(run(&p, nr, [0; 6]), RET_KILL_PROCESS, "{name}");
        }
        assert_eq!(
            run(&p, X32_SYSCALL_BIT | 1, [0; 6]),
            RET_KILL_PROCESS,
            "x32 write"
        );
        // ioctl: KVM's and PAGEMAP_SCAN only.
        assert_eq!(
            run(&p, IOCTL, [9, 0xAE80, 0, 0, 0, 0]),
            RET_ALLOW,
            "KVM_RUN"
        );
        assert_eq!(
            run(&p, IOCTL, [9, 0x4090_AE82, 0, 0, 0, 0]),
            RET_ALLOW,
            "KVM_SET_REGS"
        );
        assert_eq!(
            run(&p, IOCTL, [9, sys::PAGEMAP_SCAN, 0, 0, 0, 0]),
            RET_ALLOW,
            "PAGEMAP_SCAN"
        );
        assert_eq!(
            run(&p, IOCTL, [0, 0x5401, 0, 0, 0, 0]),
            RET_KILL_PROCESS,
            "TCGETS"
        );
        assert_eq!(
            run(&p, IOCTL, [0, 0x5412, 0, 0, 0, 0]),
            RET_KILL_PROCESS,
            "TIOCSTI"
        );
        // clone: threads only; clone3 falls back to clone.
        assert_eq!(
            run(&p, CLONE, [0x3d0f00, 0, 0, 0, 0, 0]),
            RET_ALLOW,
            "pthread_create's clone"
        );
        assert_eq!(
            run(&p, CLONE, [0x1200011, 0, 0, 0, 0, 0]),
            RET_KILL_PROCESS,
            "fork's clone"
        );
        assert_eq!(run(&p, CLONE3, [0; 6]), RET_ERRNO | ENOSYS);
        assert_eq!(
            run(&p, PRCTL, [15, 0, 0, 0, 0, 0]),
            RET_ALLOW,
            "PR_SET_NAME"
        );
        assert_eq!(
            run(&p, PRCTL, [22, 0, 0, 0, 0, 0]),
            RET_KILL_PROCESS,
            "PR_SET_SECCOMP"
        );
        for &(nr, name) in SESSION_FILES {
            assert_eq!(
                run(&p, nr, [0; 6]),
                RET_KILL_PROCESS,
                "{name} without sessions"
            );
        }
    }

    #[test]
    fn a_daemon_with_sessions_may_also_write_its_checkpoint_files() {
        let p = program(Confinement::WithSessionFiles);
        for &(nr, name) in ALLOWED.iter().chain(SESSION_FILES) {
            assert_eq!(run(&p, nr, [0; 6]), RET_ALLOW, "{name}");
        }
        assert_eq!(run(&p, OPENAT, [0; 6]), RET_ALLOW);
        assert_eq!(run(&p, OPEN, [0; 6]), RET_ALLOW);
        for (nr, name) in [
            (49, "bind"),
            (59, "execve"),
            (57, "fork"),
            (101, "ptrace"),
            (165, "mount"),
        ] {
            assert_eq!(run(&p, nr, [0; 6]), RET_KILL_PROCESS, "{name}");
        }
        assert_eq!(
            run(&p, CLONE, [0x1200011, 0, 0, 0, 0, 0]),
            RET_KILL_PROCESS,
            "fork's clone"
        );
    }

    #[test]
    fn the_allow_list_has_no_repeats_and_no_checked_call() {
        let mut numbers: Vec<u32> = ALLOWED
            .iter()
            .chain(SESSION_FILES)
            .map(|&(nr, _)| nr)
            .collect();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(numbers.len(), ALLOWED.len() + SESSION_FILES.len());
        assert!(![IOCTL, SOCKET, CLONE, PRCTL, CLONE3, OPEN, OPENAT]
            .iter()
            .any(|nr| numbers.contains(nr)));
    }
}
