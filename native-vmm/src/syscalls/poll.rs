//! Readiness: poll, ppoll, select, pselect6.
//!
//! If something is ready, or the timeout is zero, the answer is returned at once. Otherwise
//! the thread waits (`syscalls::wait_ready`): only another thread can change readiness here (a
//! pipe this thread would have to fill itself stays empty), so the call is made again once
//! another thread has made progress, and once more when the timeout runs out, then reporting
//! nothing ready. With no timeout and no thread that could ever change anything, the run ends
//! as deadlocked.
//!
//! Regular files, stdin and the captured output are always ready (as Linux reports regular
//! files); a pipe's read end is ready with data or without writers, its write end with room;
//! a socketpair end combines both (and reports RDHUP/HUP as Linux does); an epoll instance is
//! readable when one of its registrations is ready (epoll.rs); a pidfd once its process ended
//! (pidfd.rs).

use std::time::Duration;

use super::pidfd::Named;
use super::{value, wait_ready_on, SysResult, SyscallOutcome, UserMemory};
use super::{
    POLLERR, POLLHUP, POLLIN, POLLNVAL, POLLOUT, POLLPRI, POLLRDHUP, POLLRDNORM, POLLWRNORM,
};
use crate::errno::Errno;
use crate::process::{GuestProcess, Object};

/// The poll bits `fd` reports now (before masking by the requested events).
pub(super) fn ready_bits(proc: &GuestProcess, fd: u64) -> u16 {
    let Ok(desc) = proc.fds.get(fd) else {
        return POLLNVAL;
    };
    let readable = POLLIN | POLLRDNORM;
    let writable = POLLOUT | POLLWRNORM;
    match desc.object {
        Object::Stdin => readable,
        Object::Output(_) => writable,
        Object::Node(_) => readable | writable,
        Object::PipeRead(p) => match proc.fds.pipe(p) {
            Ok(pipe) if pipe.buffered() > 0 && !pipe.has_writers() => readable | POLLHUP,
            Ok(pipe) if pipe.buffered() > 0 => readable,
            Ok(pipe) if !pipe.has_writers() => POLLHUP,
            Ok(_) => 0,
            Err(_) => POLLNVAL,
        },
        Object::PipeWrite(p) => match proc.fds.pipe(p) {
            Ok(pipe) if !pipe.has_readers() => POLLERR,
            Ok(pipe) if pipe.room() > 0 => writable,
            Ok(_) => 0,
            Err(_) => POLLNVAL,
        },
        Object::Socket { rx, tx, shut_write } => {
            // A shut-down write side was let go of: its channel is gone once the peer closes.
            let output = if shut_write {
                None
            } else {
                proc.fds.pipe(tx).ok()
            };
            let Ok(input) = proc.fds.pipe(rx) else {
                return POLLNVAL;
            };
            if !shut_write && output.is_none() {
                return POLLNVAL;
            }
            // As Linux's AF_UNIX stream poll: end of input is readable (and RDHUP), both
            // directions closed is HUP; a write to a closed peer fails at once, so is "ready".
            let send_closed = output.is_none_or(|o| !o.has_readers());
            let mut bits = 0;
            if input.buffered() > 0 || input.input_closed() {
                bits |= readable;
            }
            if input.input_closed() {
                bits |= POLLRDHUP;
            }
            if input.input_closed() && send_closed {
                bits |= POLLHUP;
            }
            if send_closed || output.is_some_and(|o| o.room() > 0) {
                bits |= writable;
            }
            bits
        }
        // A listener is readable while a connection waits for accept; a socket not connected
        // yet has nothing to read or write.
        Object::Endpoint(i) => match proc.fds.endpoint(i) {
            Ok(endpoint)
                if endpoint
                    .listening
                    .as_ref()
                    .is_some_and(|(_, queue)| !queue.is_empty()) =>
            {
                readable
            }
            Ok(_) => 0,
            Err(_) => POLLNVAL,
        },
        Object::EventFd { count, .. } => {
            let mut bits = if count < crate::abi::EVENTFD_MAX_COUNT {
                writable
            } else {
                0
            };
            if count > 0 {
                bits |= readable;
            }
            bits
        }
        Object::TerminalMaster(i) => super::terminal::ready_bits(proc, (i, true)),
        Object::TerminalSlave(i) => super::terminal::ready_bits(proc, (i, false)),
        Object::Inet(i) => super::inet::ready_bits(proc, i),
        Object::UnixDatagram(i) => super::unix_datagram::ready_bits(proc, i),
        // As Linux: readable once the process ended, and hung up too once it was reaped.
        Object::Pidfd(pid) => match super::pidfd::named(proc, pid) {
            Named::Running => 0,
            Named::Ended => readable,
            Named::Gone => readable | POLLHUP,
        },
        Object::Epoll(i) => match super::epoll::ready_list(proc, i) {
            Ok(list) if !list.is_empty() => readable,
            Ok(_) => 0,
            Err(_) => POLLNVAL,
        },
    }
}

fn poll_common(
    proc: &mut GuestProcess,
    user: &UserMemory,
    fds: u64,
    nfds: u64,
    timeout: Option<Duration>,
) -> SysResult {
    if nfds > proc.fds.limit() {
        return Err(Errno::EINVAL);
    }
    let mut entries = user.read_vec(fds, nfds * 8)?;
    let mut ready = 0;
    let mut host = Vec::new();
    for entry in entries.chunks_exact_mut(8) {
        let fd = i32::from_le_bytes([entry[0], entry[1], entry[2], entry[3]]);
        let events = u16::from_le_bytes([entry[4], entry[5]]);
        let revents = if fd < 0 {
            0
        } else {
            host.extend(super::inet::host_interest(proc, fd as u64, events));
            ready_bits(proc, fd as u64) & (events | POLLERR | POLLHUP | POLLNVAL)
        };
        entry[6..8].copy_from_slice(&revents.to_le_bytes());
        if revents != 0 {
            ready += 1;
        }
    }
    if ready == 0 && timeout != Some(Duration::ZERO) {
        return wait_ready_on(proc, timeout, host);
    }
    user.write(fds, &entries)?;
    value(ready)
}

/// A timeout argument in milliseconds (an int): negative waits forever (None).
pub(super) fn timeout_ms(arg: u64) -> Option<Duration> {
    let ms = arg as u32 as i32;
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// A timeout argument pointing at a `struct timespec`: NULL waits forever (None).
fn timeout_timespec(user: &UserMemory, addr: u64) -> Result<Option<Duration>, Errno> {
    if addr == 0 {
        return Ok(None);
    }
    let (sec, nsec) = user.read_timespec(addr)?;
    Ok(Some(Duration::new(sec, nsec)))
}

/// poll(fds, nfds, timeout_ms): a negative timeout waits forever.
pub(crate) fn poll(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    poll_common(proc, user, args[0], args[1], timeout_ms(args[2]))
}

/// ppoll(fds, nfds, timeout_ts, sigmask, sigsetsize): a NULL timeout waits forever; the
/// temporary signal mask changes nothing since no signal is delivered.
pub(crate) fn ppoll(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let timeout = timeout_timespec(user, args[2])?;
    poll_common(proc, user, args[0], args[1], timeout)
}

fn select_common(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
    timeout: Option<Duration>,
) -> SysResult {
    let nfds = args[0] as u32 as i32;
    if nfds < 0 || nfds as u64 > proc.fds.limit() {
        return Err(Errno::EINVAL);
    }
    let bytes = (nfds as u64).div_ceil(64) * 8;
    // (guest address, requested bits, ready bits) for the read, write and except sets.
    let mut sets = Vec::with_capacity(3);
    for (i, &addr) in args[1..4].iter().enumerate() {
        let wanted = if addr == 0 {
            vec![0u8; bytes as usize]
        } else {
            user.read_vec(addr, bytes)?
        };
        sets.push((
            addr,
            wanted,
            vec![0u8; bytes as usize],
            [POLLIN | POLLHUP | POLLERR, POLLOUT | POLLERR, POLLPRI][i],
        ));
    }
    let mut ready = 0;
    let mut host = Vec::new();
    for fd in 0..nfds as u64 {
        let (byte, bit) = ((fd / 8) as usize, 1u8 << (fd % 8));
        if sets.iter().all(|(_, wanted, _, _)| wanted[byte] & bit == 0) {
            continue;
        }
        let wanted = sets
            .iter()
            .filter(|(_, wanted, _, _)| wanted[byte] & bit != 0)
            .fold(0, |events, (.., mask)| events | mask);
        host.extend(super::inet::host_interest(proc, fd, wanted));
        let bits = ready_bits(proc, fd);
        if bits & POLLNVAL != 0 {
            return Err(Errno::EBADF);
        }
        for (_, wanted, out, mask) in sets.iter_mut() {
            if wanted[byte] & bit != 0 && bits & *mask != 0 {
                out[byte] |= bit;
                ready += 1;
            }
        }
    }
    let outcome = if ready == 0 && timeout != Some(Duration::ZERO) {
        wait_ready_on(proc, timeout, host)?
    } else {
        SyscallOutcome::Return(ready)
    };
    if matches!(outcome, SyscallOutcome::Block(_)) {
        // The sets stay as the program passed them: the call is made again with them.
        return Ok(outcome);
    }
    // The sets come back holding only the ready fds (all clear after a timeout).
    for (addr, _, out, _) in &sets {
        if *addr != 0 {
            user.write(*addr, out)?;
        }
    }
    Ok(outcome)
}

/// select(nfds, readfds, writefds, exceptfds, timeout): a NULL timeval waits forever.
pub(crate) fn select(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let timeout = if args[4] == 0 {
        None
    } else {
        Some(user.read_timeval(args[4])?)
    };
    select_common(proc, user, args, timeout)
}

/// pselect6(nfds, readfds, writefds, exceptfds, timeout_ts, sigmask_arg)
pub(crate) fn pselect6(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let timeout = timeout_timespec(user, args[4])?;
    select_common(proc, user, args, timeout)
}
