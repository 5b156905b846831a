//! The whole system-call surface the guest sees, in one sorted table (x86-64 numbers).
//!
//! Each row is (number, name, policy):
//! * `Emulate(handler)`: answered by the VMM, with Linux's semantics within the sandbox's
//!   limits (the handler's doc comment says where it differs).
//! * `Refuse(errno)`: refused by design with a fixed errno the program can handle: no identity
//!   changes (EPERM: the guest is an unprivileged user; ownership.rs for chown), no memory
//!   protection keys (pkey_alloc: ENOSPC, as on a CPU without them; V8 then protects nothing
//!   with them), rseq, which glibc probes and tolerates missing, and io_uring (ENOSYS, as a
//!   kernel built without it answers: libuv, when asked to use it with UV_USE_IO_URING=1, falls
//!   back to epoll and its thread pool). Setting a clock (settimeofday, clock_settime) is EPERM,
//!   as for any unprivileged user.
//!
//! Partly supported: the *xattr calls (xattr.rs) keep `user.` attributes of overlay files and
//! directories and answer the other name spaces as Linux answers an unprivileged user; no POSIX
//! ACLs are kept (setting one is EOPNOTSUPP) and sockets list no `system.sockprotoname`.
//!
//! Partly there, as their handlers say: ioctl (the generic fd requests and pseudo-terminals'
//! requests; terminal.rs) and open of /dev/ptmx, /dev/pts/N and /dev/tty.
//!
//! File locks (locks.rs): flock and fcntl's record locks hold between processes; a cycle of
//! blocking requests is not EDEADLK but waits (and ends the run deadlocked when nothing else
//! can go on).
//!
//! A wait that no thread could ever end (an untimed futex wait or pause while every other
//! thread waits too and no timer is armed) ends the run as deadlocked: see `crate::sched`.
//!
//! A number not in the table returns -ENOSYS. Every call is counted per number; -ENOSYS answers are
//! also counted as unsupported (see `GuestProcess::unsupported_counts`).

use super::{
    addresses, epoll, eventfd, files, futex, ids, locks, memfd, memory, misc, ownership, pidfd,
    poll, processes, signals, sockets, threads, time, transfer, xattr, SysResult, UserMemory,
};
use crate::errno::Errno;
use crate::process::{GuestProcess, SyscallCount};

pub type Handler = fn(&mut GuestProcess, &UserMemory, [u64; 6]) -> SysResult;

#[derive(Clone, Copy)]
pub enum Policy {
    Emulate(Handler),
    Refuse(Errno),
}

#[derive(Clone, Copy)]
pub struct SyscallEntry {
    pub nr: u64,
    pub name: &'static str,
    pub policy: Policy,
}

const fn emulate(nr: u64, name: &'static str, handler: Handler) -> SyscallEntry {
    SyscallEntry {
        nr,
        name,
        policy: Policy::Emulate(handler),
    }
}

const fn refuse(nr: u64, name: &'static str, errno: Errno) -> SyscallEntry {
    SyscallEntry {
        nr,
        name,
        policy: Policy::Refuse(errno),
    }
}

/// As a kernel built without io_uring: the rings' calls exist for no file descriptor.
const NO_IO_URING: Errno = Errno::ENOSYS;

/// Sorted by number (a unit test checks it).
pub static TABLE: &[SyscallEntry] = &[
    emulate(0, "read", files::read),
    emulate(1, "write", files::write),
    emulate(2, "open", files::open),
    emulate(3, "close", files::close),
    emulate(4, "stat", files::stat),
    emulate(5, "fstat", files::fstat),
    emulate(6, "lstat", files::lstat),
    emulate(7, "poll", poll::poll),
    emulate(8, "lseek", files::lseek),
    emulate(9, "mmap", memory::mmap),
    emulate(10, "mprotect", memory::mprotect),
    emulate(11, "munmap", memory::munmap),
    emulate(12, "brk", memory::brk),
    emulate(13, "rt_sigaction", signals::rt_sigaction),
    emulate(14, "rt_sigprocmask", signals::rt_sigprocmask),
    emulate(15, "rt_sigreturn", signals::rt_sigreturn),
    emulate(16, "ioctl", files::ioctl),
    emulate(17, "pread64", files::pread64),
    emulate(18, "pwrite64", files::pwrite64),
    emulate(19, "readv", files::readv),
    emulate(20, "writev", files::writev),
    emulate(21, "access", files::access),
    emulate(22, "pipe", files::pipe),
    emulate(23, "select", poll::select),
    emulate(24, "sched_yield", threads::sched_yield),
    emulate(25, "mremap", memory::mremap),
    emulate(26, "msync", memory::msync),
    emulate(28, "madvise", memory::madvise),
    emulate(32, "dup", files::dup),
    emulate(33, "dup2", files::dup2),
    emulate(34, "pause", signals::pause),
    emulate(35, "nanosleep", time::nanosleep),
    emulate(36, "getitimer", signals::getitimer),
    emulate(37, "alarm", signals::alarm),
    emulate(38, "setitimer", signals::setitimer),
    emulate(39, "getpid", processes::getpid),
    emulate(40, "sendfile", transfer::sendfile),
    emulate(41, "socket", addresses::socket),
    emulate(42, "connect", addresses::connect),
    emulate(43, "accept", addresses::accept),
    emulate(44, "sendto", sockets::sendto),
    emulate(45, "recvfrom", sockets::recvfrom),
    emulate(46, "sendmsg", sockets::sendmsg),
    emulate(47, "recvmsg", sockets::recvmsg),
    emulate(48, "shutdown", sockets::shutdown),
    emulate(49, "bind", addresses::bind),
    emulate(50, "listen", addresses::listen),
    emulate(51, "getsockname", sockets::getsockname),
    emulate(52, "getpeername", sockets::getpeername),
    emulate(53, "socketpair", sockets::socketpair),
    emulate(54, "setsockopt", sockets::setsockopt),
    emulate(55, "getsockopt", sockets::getsockopt),
    emulate(56, "clone", threads::clone),
    emulate(57, "fork", processes::fork),
    emulate(58, "vfork", processes::vfork),
    emulate(59, "execve", processes::execve),
    emulate(60, "exit", threads::exit),
    emulate(61, "wait4", processes::wait4),
    emulate(62, "kill", processes::kill),
    emulate(63, "uname", misc::uname),
    emulate(72, "fcntl", files::fcntl),
    emulate(73, "flock", locks::flock),
    emulate(74, "fsync", files::fsync),
    emulate(75, "fdatasync", files::fsync),
    emulate(76, "truncate", files::truncate),
    emulate(77, "ftruncate", files::ftruncate),
    emulate(79, "getcwd", files::getcwd),
    emulate(80, "chdir", files::chdir),
    emulate(81, "fchdir", files::fchdir),
    emulate(82, "rename", files::rename),
    emulate(83, "mkdir", files::mkdir),
    emulate(84, "rmdir", files::rmdir),
    emulate(85, "creat", files::creat),
    emulate(86, "link", files::link),
    emulate(87, "unlink", files::unlink),
    emulate(88, "symlink", files::symlink),
    emulate(89, "readlink", files::readlink),
    emulate(90, "chmod", files::chmod),
    emulate(91, "fchmod", files::fchmod),
    emulate(92, "chown", ownership::chown),
    emulate(93, "fchown", ownership::fchown),
    emulate(94, "lchown", ownership::lchown),
    emulate(95, "umask", ids::umask),
    emulate(96, "gettimeofday", time::gettimeofday),
    emulate(97, "getrlimit", misc::getrlimit),
    emulate(98, "getrusage", time::getrusage),
    emulate(99, "sysinfo", misc::sysinfo),
    emulate(100, "times", time::times),
    emulate(102, "getuid", ids::getuid),
    emulate(104, "getgid", ids::getgid),
    emulate(105, "setuid", ids::setuid),
    emulate(106, "setgid", ids::setgid),
    emulate(107, "geteuid", ids::getuid),
    emulate(108, "getegid", ids::getgid),
    emulate(109, "setpgid", processes::setpgid),
    emulate(110, "getppid", processes::getppid),
    emulate(111, "getpgrp", processes::getpgrp),
    emulate(112, "setsid", processes::setsid),
    emulate(113, "setreuid", ids::setreuid),
    emulate(114, "setregid", ids::setregid),
    emulate(115, "getgroups", ids::getgroups),
    refuse(116, "setgroups", Errno::EPERM),
    emulate(117, "setresuid", ids::setresuid),
    emulate(118, "getresuid", ids::getresuid),
    emulate(119, "setresgid", ids::setresgid),
    emulate(120, "getresgid", ids::getresgid),
    emulate(121, "getpgid", processes::getpgid),
    emulate(124, "getsid", processes::getsid),
    emulate(125, "capget", ids::capget),
    emulate(127, "rt_sigpending", signals::rt_sigpending),
    emulate(128, "rt_sigtimedwait", signals::rt_sigtimedwait),
    emulate(130, "rt_sigsuspend", signals::rt_sigsuspend),
    emulate(131, "sigaltstack", signals::sigaltstack),
    emulate(133, "mknod", files::mknod),
    emulate(137, "statfs", files::statfs),
    emulate(138, "fstatfs", files::fstatfs),
    emulate(140, "getpriority", ownership::getpriority),
    emulate(141, "setpriority", ownership::setpriority),
    emulate(142, "sched_setparam", misc::sched_setparam),
    emulate(143, "sched_getparam", misc::sched_getparam),
    emulate(144, "sched_setscheduler", misc::sched_setscheduler),
    emulate(145, "sched_getscheduler", misc::sched_getscheduler),
    emulate(146, "sched_get_priority_max", misc::sched_get_priority_max),
    emulate(147, "sched_get_priority_min", misc::sched_get_priority_min),
    emulate(148, "sched_rr_get_interval", misc::sched_rr_get_interval),
    emulate(157, "prctl", processes::prctl),
    emulate(158, "arch_prctl", threads::arch_prctl),
    emulate(160, "setrlimit", misc::setrlimit),
    refuse(164, "settimeofday", Errno::EPERM),
    emulate(186, "gettid", threads::gettid),
    emulate(188, "setxattr", xattr::setxattr),
    emulate(189, "lsetxattr", xattr::lsetxattr),
    emulate(190, "fsetxattr", xattr::fsetxattr),
    emulate(191, "getxattr", xattr::getxattr),
    emulate(192, "lgetxattr", xattr::lgetxattr),
    emulate(193, "fgetxattr", xattr::fgetxattr),
    emulate(194, "listxattr", xattr::listxattr),
    emulate(195, "llistxattr", xattr::llistxattr),
    emulate(196, "flistxattr", xattr::flistxattr),
    emulate(197, "removexattr", xattr::removexattr),
    emulate(198, "lremovexattr", xattr::lremovexattr),
    emulate(199, "fremovexattr", xattr::fremovexattr),
    emulate(200, "tkill", signals::tkill),
    emulate(201, "time", time::time),
    emulate(202, "futex", futex::futex),
    emulate(203, "sched_setaffinity", misc::sched_setaffinity),
    emulate(204, "sched_getaffinity", misc::sched_getaffinity),
    emulate(213, "epoll_create", epoll::epoll_create),
    emulate(217, "getdents64", files::getdents64),
    emulate(218, "set_tid_address", threads::set_tid_address),
    emulate(221, "fadvise64", files::fadvise64),
    refuse(227, "clock_settime", Errno::EPERM),
    emulate(228, "clock_gettime", time::clock_gettime),
    emulate(229, "clock_getres", time::clock_getres),
    emulate(230, "clock_nanosleep", time::clock_nanosleep),
    emulate(231, "exit_group", threads::exit_group),
    emulate(232, "epoll_wait", epoll::epoll_wait),
    emulate(233, "epoll_ctl", epoll::epoll_ctl),
    emulate(234, "tgkill", signals::tgkill),
    emulate(247, "waitid", processes::waitid),
    emulate(257, "openat", files::openat),
    emulate(258, "mkdirat", files::mkdirat),
    emulate(259, "mknodat", files::mknodat),
    emulate(260, "fchownat", ownership::fchownat),
    emulate(262, "newfstatat", files::newfstatat),
    emulate(263, "unlinkat", files::unlinkat),
    emulate(264, "renameat", files::renameat),
    emulate(265, "linkat", files::linkat),
    emulate(266, "symlinkat", files::symlinkat),
    emulate(267, "readlinkat", files::readlinkat),
    emulate(268, "fchmodat", files::fchmodat),
    emulate(269, "faccessat", files::faccessat),
    emulate(270, "pselect6", poll::pselect6),
    emulate(271, "ppoll", poll::ppoll),
    emulate(273, "set_robust_list", threads::set_robust_list),
    emulate(275, "splice", transfer::splice),
    emulate(280, "utimensat", files::utimensat),
    emulate(281, "epoll_pwait", epoll::epoll_pwait),
    emulate(284, "eventfd", eventfd::eventfd),
    emulate(285, "fallocate", files::fallocate),
    emulate(288, "accept4", addresses::accept4),
    emulate(290, "eventfd2", eventfd::eventfd2),
    emulate(291, "epoll_create1", epoll::epoll_create1),
    emulate(292, "dup3", files::dup3),
    emulate(293, "pipe2", files::pipe2),
    emulate(295, "preadv", files::preadv),
    emulate(296, "pwritev", files::pwritev),
    emulate(302, "prlimit64", misc::prlimit64),
    emulate(307, "sendmmsg", sockets::sendmmsg),
    emulate(316, "renameat2", files::renameat2),
    emulate(318, "getrandom", misc::getrandom),
    emulate(319, "memfd_create", memfd::memfd_create),
    emulate(322, "execveat", processes::execveat),
    emulate(326, "copy_file_range", transfer::copy_file_range),
    emulate(327, "preadv2", files::preadv2),
    emulate(328, "pwritev2", files::pwritev2),
    refuse(330, "pkey_alloc", Errno::ENOSPC),
    emulate(332, "statx", files::statx),
    refuse(334, "rseq", Errno::ENOSYS),
    emulate(424, "pidfd_send_signal", pidfd::pidfd_send_signal),
    refuse(425, "io_uring_setup", NO_IO_URING),
    refuse(426, "io_uring_enter", NO_IO_URING),
    refuse(427, "io_uring_register", NO_IO_URING),
    emulate(434, "pidfd_open", pidfd::pidfd_open),
    emulate(435, "clone3", threads::clone3),
    emulate(436, "close_range", files::close_range),
    emulate(438, "pidfd_getfd", pidfd::pidfd_getfd),
    emulate(439, "faccessat2", files::faccessat2),
    emulate(
        crate::agent::AWAIT_REQUEST_SYSCALL,
        "sandfork_await_request",
        super::agent::await_request,
    ),
    emulate(
        crate::agent::PUBLISH_RESULT_SYSCALL,
        "sandfork_publish_result",
        super::agent::publish_result,
    ),
];

/// The table row for `nr`.
pub fn lookup(nr: u64) -> Option<&'static SyscallEntry> {
    TABLE
        .binary_search_by_key(&nr, |e| e.nr)
        .ok()
        .map(|i| &TABLE[i])
}

/// The Linux name of `nr`, when it is in the table.
pub fn name(nr: u64) -> Option<&'static str> {
    lookup(nr).map(|e| e.name)
}

// The process keeps the counts; the table names them.
impl GuestProcess {
    /// Every system call made, per number.
    pub fn syscall_counts(&self) -> Vec<SyscallCount> {
        self.syscall_counts_named(name)
    }

    /// Calls answered -ENOSYS or stopped as unsupported, per number.
    pub fn unsupported_counts(&self) -> Vec<SyscallCount> {
        self.unsupported_counts_named(name)
    }
}
