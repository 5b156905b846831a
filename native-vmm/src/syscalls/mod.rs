//! The Linux system-call layer: one table (table.rs) mapping numbers to handlers, grouped by
//! area: files (fds, paths, pipes, output), fifo (mknod, FIFOs), sockets (in-memory socketpairs; Internet sockets
//! whose traffic leaves the VM in inet.rs; sendmsg and recvmsg's control messages in control.rs,
//! the IP options of UDP sockets and the control messages that carry them in ancillary.rs),
//! poll and epoll (readiness), eventfd, memory, ids
//! (process identity), threads (clone, exit, thread ids, yield), futex, time, signals, memfd
//! (memory files and their seals), xattr (extended attributes), terminal (pseudo-terminals),
//! and misc
//! (system information, randomness, limits).

// The guest's registers are u64; each handler reinterprets them as the C types the Linux ABI
// gives its arguments (int fds, signed offsets, flags) and its results as the signed return value.
#![allow(clippy::cast_sign_loss, clippy::cast_possible_wrap)]

mod addresses;
pub(crate) mod agent;
mod ancillary;
mod control;
mod epoll;
mod eventfd;
mod fifo;
mod files;
mod futex;
mod ids;
mod inet;
mod locks;
mod loopback;
mod memfd;
mod memory;
mod misc;
mod ownership;
pub(crate) mod pidfd;
mod poll;
pub mod processes;
mod procfs;
mod signals;
mod sockets;
mod table;
mod terminal;
mod threads;
mod time;
mod transfer;
mod unix_datagram;
mod xattr;

#[cfg(test)]
mod tests;

use crate::errno::Errno;
use crate::memory::GuestMemory;
use std::time::{Duration, Instant};

use crate::process::threads::{Call, ThreadStart, Wait, WaitOn};
use crate::process::GuestProcess;
use crate::status::RunStatus;

pub use crate::usermem::UserMemory;
pub(crate) use signals::awaits_pending_signal;
pub use table::{name, Policy, SyscallEntry, TABLE};

/// What the run loop does after a system call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyscallOutcome {
    /// Resume the guest with this value in rax (negative errno as two's complement).
    Return(u64),
    /// arch_prctl(ARCH_SET_FS): set the vCPU's FS base, return 0.
    SetFsBase(u64),
    /// Stop the guest with this status (exit, out of memory, output limit, unsupported...).
    Stop(RunStatus),
    /// The agent awaits its request and none is pending: stop the guest inside this call, the
    /// template's ready point (see `crate::agent`); the call is answered once a request is set.
    ReadyPoint,
    /// The calling thread waits (`process::threads`); the scheduler runs another meanwhile.
    Block(Wait),
    /// sched_yield: another runnable thread gets the vCPU first; the call returns 0.
    Yield,
    /// clone made a thread (already in the thread table): the scheduler gives it the caller's
    /// registers with the start's changes; the call returns the new tid.
    Spawned(ThreadStart),
    /// The calling thread exited (and is gone from the table); others go on.
    ThreadExited,
    /// rt_sigreturn: the thread resumes what its signal handler interrupted.
    SigReturn,
    /// fork, vfork or a clone of a process: the tree makes a child with a copy of the caller
    /// (`crate::sandbox`); the call returns its pid, and 0 in the child.
    Fork(processes::ForkRequest),
    /// execve: the tree loads the program into fresh memory for the calling process, which
    /// then has only that program's thread; the call returns only if that fails.
    Exec(processes::ExecRequest),
}

/// What a handler produces: an outcome, or an errno returned to the guest as -errno.
pub type SysResult = Result<SyscallOutcome, Errno>;

/// An fd argument: fds are C ints, so the upper half of the register is ignored and a
/// negative one is invalid (u64::MAX, which no fd is).
pub(crate) fn fd_arg(fd: u64) -> u64 {
    let fd = fd as u32 as i32;
    if fd < 0 {
        u64::MAX
    } else {
        fd as u64
    }
}

/// poll(2)'s event bits: poll and epoll report them, each kind of object says which it has.
const POLLIN: u16 = 0x001;
const POLLPRI: u16 = 0x002;
const POLLOUT: u16 = 0x004;
const POLLERR: u16 = 0x008;
const POLLHUP: u16 = 0x010;
const POLLNVAL: u16 = 0x020;
const POLLRDNORM: u16 = 0x040;
const POLLWRNORM: u16 = 0x100;
const POLLRDHUP: u16 = 0x2000;

/// send/recv flags that every socket reads.
const MSG_OOB: u64 = 0x1;
pub(crate) const MSG_PEEK: u64 = 0x2;
const MSG_DONTWAIT: u64 = 0x40;

/// Whether a send or receive must not wait: the fd's O_NONBLOCK or MSG_DONTWAIT; MSG_OOB is
/// EOPNOTSUPP (no socket here keeps urgent data apart: a send to a receiver that reads it
/// inline drops the flag first, sockets.rs); the other flags change nothing here.
pub(crate) fn nonblocking_call(flags: u64, nonblocking_fd: bool) -> Result<bool, Errno> {
    if flags & MSG_OOB != 0 {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(nonblocking_fd || flags & MSG_DONTWAIT != 0)
}

/// Writes an int-sized socket option or an address, truncated to the caller's buffer length
/// (read from and written back to `len_addr`), as Linux does.
pub(crate) fn write_truncated(
    user: &UserMemory,
    buf: u64,
    len_addr: u64,
    bytes: &[u8],
) -> SysResult {
    let room = user.read_u32(len_addr)? as i32;
    if room < 0 {
        return Err(Errno::EINVAL);
    }
    let n = bytes.len().min(room as usize);
    user.write(buf, &bytes[..n])?;
    user.write_u32(len_addr, n as u32)?;
    value(0)
}

/// Writes a received message's source address (None: an unnamed sender, length 0) to a
/// sockaddr buffer and its length, when the caller gave both.
pub(crate) fn write_source_name(
    user: &UserMemory,
    (addr, len_addr): (u64, u64),
    name: Option<&[u8]>,
) -> Result<(), Errno> {
    if addr == 0 || len_addr == 0 {
        return Ok(());
    }
    match name {
        Some(name) => {
            write_truncated(user, addr, len_addr, name)?;
        }
        None => user.write_u32(len_addr, 0)?,
    }
    Ok(())
}

/// The bytes `iovecs` hold together (saturating: the lengths are the guest's).
pub(crate) fn iovec_total(iovecs: &[(u64, u64)]) -> u64 {
    iovecs
        .iter()
        .fold(0u64, |sum, &(_, len)| sum.saturating_add(len))
}

/// Checks that guest memory takes each of `iovecs`, up to `max` bytes of each: a receive
/// calls it before it takes anything off its queue, so what it takes can be written.
pub(crate) fn check_iovecs(
    user: &UserMemory,
    iovecs: &[(u64, u64)],
    max: u64,
) -> Result<(), Errno> {
    for &(base, len) in iovecs {
        user.check(base, len.min(max))?;
    }
    Ok(())
}

/// Writes `data` over `iovecs` in order (a receive's bytes scattered over recvmsg's buffers).
pub(crate) fn scatter(user: &UserMemory, iovecs: &[(u64, u64)], data: &[u8]) -> Result<(), Errno> {
    let mut at = 0;
    for &(base, len) in iovecs {
        if at == data.len() {
            break;
        }
        let take = (len as usize).min(data.len() - at);
        user.write(base, &data[at..at + take])?;
        at += take;
    }
    Ok(())
}

/// A handler's plain return value.
pub(crate) fn value(v: u64) -> SysResult {
    Ok(SyscallOutcome::Return(v))
}

/// The calling thread waits for `on`, at most until `until` (None: no timeout of its own; the
/// run's deadline still ends it).
pub(crate) fn block(on: WaitOn, until: Option<Instant>) -> SysResult {
    Ok(SyscallOutcome::Block(Wait { on, until }))
}

/// `timeout` from now (None: none, or too far to represent).
pub(crate) fn after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// A read, write or poll found nothing ready: the thread waits for another one to change
/// that, for at most `timeout` (None: no limit), and then makes the same call again, which
/// keeps the first attempt's timer if it waits again. On the attempt after its timeout ran
/// out, the answer is 0 (nothing ready) instead.
pub(crate) fn wait_ready(proc: &GuestProcess, timeout: Option<Duration>) -> SysResult {
    wait_ready_on(proc, timeout, Vec::new())
}

/// `wait_ready`, also ended by the readiness of host sockets `host` (fd, poll events).
pub(crate) fn wait_ready_on(
    proc: &GuestProcess,
    timeout: Option<Duration>,
    host: Vec<(i32, i16)>,
) -> SysResult {
    let thread = proc.threads.current();
    if thread.last_attempt {
        return value(0);
    }
    let call = thread.calling.ok_or(Errno::EINTR)?;
    let until = thread.retry_until.or_else(|| timeout.and_then(after));
    block(
        WaitOn::Ready {
            epoch: proc.threads.epoch(),
            call,
            host,
        },
        until,
    )
}

/// Handles system call `nr` with its six argument registers.
pub fn dispatch(
    proc: &mut GuestProcess,
    mem: &GuestMemory,
    nr: u64,
    args: [u64; 6],
) -> SyscallOutcome {
    proc.count_call(nr);
    proc.threads.set_calling(Some(Call { nr, args }));
    let outcome = dispatch_call(proc, mem, nr, args);
    proc.threads.set_calling(None);
    outcome
}

fn dispatch_call(
    proc: &mut GuestProcess,
    mem: &GuestMemory,
    nr: u64,
    args: [u64; 6],
) -> SyscallOutcome {
    let Some(entry) = table::lookup(nr) else {
        proc.count_unsupported(nr);
        return SyscallOutcome::Return(Errno::ENOSYS.as_return());
    };
    match entry.policy {
        Policy::Emulate(handler) => match handler(proc, &UserMemory::new(mem), args) {
            Ok(outcome) => {
                if matches!(outcome, SyscallOutcome::Stop(RunStatus::Unsupported { .. })) {
                    proc.count_unsupported(nr);
                }
                outcome
            }
            Err(errno) => {
                if errno == Errno::ENOSYS {
                    proc.count_unsupported(nr);
                }
                SyscallOutcome::Return(errno.as_return())
            }
        },
        Policy::Refuse(errno) => {
            if errno == Errno::ENOSYS {
                proc.count_unsupported(nr);
            }
            SyscallOutcome::Return(errno.as_return())
        }
    }
}
