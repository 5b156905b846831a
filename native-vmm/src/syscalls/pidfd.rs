//! pidfds: a descriptor that names one process of the tree (`Object::Pidfd`), made by
//! pidfd_open or by a clone with CLONE_PIDFD (`crate::sandbox` installs it). It is readable
//! (poll, select, epoll) once its process ended; pidfd_send_signal signals the process through
//! it (or through an open /proc/<pid> directory, as Linux allows), waitid(P_PIDFD) waits for it
//! (processes.rs), pidfd_getfd copies one of its descriptors. The tree never gives a pid twice,
//! so a pidfd whose process was reaped names no process: ESRCH, never another process.

use super::{value, SysResult, UserMemory};
use crate::errno::Errno;
use crate::fs::ProcNode;
use crate::process::{Description, GuestProcess, Object, O_NONBLOCK, O_RDWR};

/// pidfd_open's one flag: the description is non-blocking (waitid answers EAGAIN).
const PIDFD_NONBLOCK: u64 = O_NONBLOCK as u64;

/// Where the process a pidfd names is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Named {
    Running,
    /// It ended and is a zombie until its parent waits.
    Ended,
    /// It was reaped: the pidfd names no process any more.
    Gone,
}

/// How process `pid` stands, for a pidfd's readiness.
pub(super) fn named(proc: &GuestProcess, pid: u64) -> Named {
    match proc.tree.get(pid) {
        Some(entry) if entry.exit.is_none() => Named::Running,
        Some(_) => Named::Ended,
        None => Named::Gone,
    }
}

/// The pid `fd`'s pidfd names and whether its description is non-blocking; EBADF when `fd` is
/// not a pidfd.
pub(super) fn pid_of(proc: &GuestProcess, fd: u64) -> Result<(u64, bool), Errno> {
    let desc = proc.fds.get(fd)?;
    match desc.object {
        Object::Pidfd(pid) => Ok((pid, desc.nonblocking())),
        _ => Err(Errno::EBADF),
    }
}

/// A pidfd's description for process `pid`.
pub(crate) fn description(pid: u64, flags: u32) -> Description {
    Description::new(Object::Pidfd(pid), O_RDWR | (flags & O_NONBLOCK))
}

/// pidfd_open(pid, flags): a close-on-exec pidfd for process `pid` (a zombie too), with
/// PIDFD_NONBLOCK its description non-blocking. Other flags (PIDFD_THREAD) are EINVAL.
pub(crate) fn pidfd_open(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [pid, flags, ..] = args;
    if flags & !PIDFD_NONBLOCK != 0 || pid as i32 <= 0 {
        return Err(Errno::EINVAL);
    }
    let pid = u64::from(pid as u32);
    if proc.tree.get(pid).is_none() {
        return Err(Errno::ESRCH);
    }
    value(proc.fds.install(description(pid, flags as u32), 0, true)?)
}

/// pidfd_send_signal(pidfd, sig, info, flags): as kill to the one process a pidfd or an open
/// /proc/<pid> directory names (ESRCH once it was reaped). A siginfo, when given, is checked
/// as Linux checks it (its signal must be `sig`; another process may only get a user's
/// si_code) and not delivered: the receiver's siginfo names the sender as kill's does.
/// flags must be 0.
pub(crate) fn pidfd_send_signal(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    const SI_TKILL: i32 = -6;
    let [fd, sig, info, flags, ..] = args;
    if flags != 0 {
        return Err(Errno::EINVAL);
    }
    let pid = match proc.fds.get(fd)?.object {
        Object::Pidfd(pid) => pid,
        Object::Node(node) => match proc.config.vfs.proc_node(node) {
            Some(ProcNode::Process(pid)) => u64::from(pid),
            _ => return Err(Errno::EBADF),
        },
        _ => return Err(Errno::EBADF),
    };
    if info != 0 {
        let signo = user.read_u32(info)?.cast_signed();
        let code = user.read_u32(info + 8)?.cast_signed();
        if i64::from(signo) != i64::from(sig as i32) {
            return Err(Errno::EINVAL);
        }
        if pid != proc.pid && (code >= 0 || code == SI_TKILL) {
            return Err(Errno::EPERM);
        }
    }
    if proc.tree.get(pid).is_none() {
        return Err(Errno::ESRCH);
    }
    if let Some(sig) = super::signals::signal_or_probe(sig)? {
        crate::process::signals::send(proc, pid, sig);
    }
    value(0)
}

/// pidfd_getfd(pidfd, targetfd, flags): a close-on-exec fd of the caller for the description
/// the pidfd's process has at `targetfd` (every process of the tree is the same user, so each
/// may). ESRCH once that process ended, EBADF when it has no such fd; flags must be 0.
pub(crate) fn pidfd_getfd(
    proc: &mut GuestProcess,
    _user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    let [pidfd, target, flags, ..] = args;
    if flags != 0 {
        return Err(Errno::EINVAL);
    }
    let (pid, _) = pid_of(proc, pidfd)?;
    let target = u64::from(target as u32);
    if pid == proc.pid {
        return value(proc.fds.duplicate(target, 0, true)?);
    }
    let GuestProcess { fds, parked, .. } = proc;
    let part = parked.get(&pid).ok_or(Errno::ESRCH)?;
    value(fds.duplicate_from(&part.fd_slots, target)?)
}
