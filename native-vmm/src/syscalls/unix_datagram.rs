//! AF_UNIX SOCK_DGRAM socketpairs (`Object::UnixDatagram`): each send is one datagram in the
//! peer's queue (`net::loopback::Queue`), received whole, or cut to the buffer with the rest
//! dropped (MSG_TRUNC), as on Linux. A full queue makes the sender wait (EAGAIN when
//! nonblocking); an empty one the receiver. Once the peer closed, the next send is
//! ECONNREFUSED and later ones ENOTCONN, while a receive still waits, as on Linux. The sender
//! is unnamed, so no source address comes back. Sending to an address is ECONNREFUSED (no
//! datagram socket in the VM has one); passing fds (SCM_RIGHTS) on these is EOPNOTSUPP.

use super::{iovec_total, scatter, value, wait_ready, SysResult, UserMemory, MSG_PEEK};
use crate::errno::Errno;
use crate::net::loopback::QUEUE_BYTES;
use crate::process::{GuestProcess, Object};

/// The largest datagram (Linux: the send buffer less its header): EMSGSIZE past it.
pub(super) const MAX_DATAGRAM: usize = QUEUE_BYTES - 32;
pub(super) const MSG_TRUNC: u64 = 0x20;
const EMSGSIZE: Errno = Errno(90);

/// The datagram socketpair end at `fd`, if it is one: (index, nonblocking).
pub(super) fn index_of(proc: &GuestProcess, fd: u64) -> Option<(usize, bool)> {
    let desc = proc.fds.get(fd).ok()?;
    match desc.object {
        Object::UnixDatagram(i) => Some((i, desc.nonblocking())),
        _ => None,
    }
}

/// Sends the bytes of `iovecs` as one datagram from end `index` to its peer.
pub(super) fn send(
    proc: &mut GuestProcess,
    user: &UserMemory,
    index: usize,
    iovecs: &[(u64, u64)],
    nonblocking: bool,
) -> SysResult {
    let total = iovec_total(iovecs);
    if total > MAX_DATAGRAM as u64 {
        return Err(EMSGSIZE);
    }
    let socket = proc.fds.unix_datagram_mut(index)?;
    let Some(peer) = socket.peer else {
        return Err(if std::mem::take(&mut socket.peer_closed) {
            Errno::ECONNREFUSED
        } else {
            Errno::ENOTCONN
        });
    };
    if !proc.fds.unix_datagram(peer)?.inbox.has_room(total as usize) {
        return if nonblocking {
            Err(Errno::EAGAIN)
        } else {
            wait_ready(proc, None)
        };
    }
    let mut data = Vec::with_capacity(total as usize);
    for &(base, len) in iovecs {
        data.extend_from_slice(&user.read_vec(base, len)?);
    }
    proc.fds.unix_datagram_mut(peer)?.inbox.push((), data);
    value(total)
}

/// Receives the next datagram at end `index` into `iovecs`: Ok(Ok(its whole length, whether
/// it was cut)), or Ok(Err(the call's outcome)) when none is there yet. MSG_PEEK leaves it
/// queued.
pub(super) fn receive(
    proc: &mut GuestProcess,
    user: &UserMemory,
    index: usize,
    iovecs: &[(u64, u64)],
    flags: u64,
    nonblocking: bool,
) -> Result<Result<(usize, bool), SysResult>, Errno> {
    let room = iovec_total(iovecs).min(MAX_DATAGRAM as u64) as usize;
    for &(base, len) in iovecs {
        user.check(base, len.min(MAX_DATAGRAM as u64))?;
    }
    let inbox = &mut proc.fds.unix_datagram_mut(index)?.inbox;
    let Some(datagram) = inbox.front() else {
        return Ok(Err(if nonblocking {
            Err(Errno::EAGAIN)
        } else {
            wait_ready(proc, None)
        }));
    };
    let full = datagram.data.len();
    scatter(user, iovecs, &datagram.data[..full.min(room)])?;
    if flags & MSG_PEEK == 0 {
        inbox.pop();
    }
    Ok(Ok((full, full > room)))
}

/// The length a receive returns: the whole datagram's with MSG_TRUNC, else what was copied.
pub(super) fn received_length(flags: u64, full: usize, iovecs: &[(u64, u64)]) -> u64 {
    if flags & MSG_TRUNC != 0 {
        return full as u64;
    }
    iovec_total(iovecs).min(full as u64)
}

/// read/readv: one datagram.
pub(super) fn read(
    proc: &mut GuestProcess,
    user: &UserMemory,
    index: usize,
    iovecs: &[(u64, u64)],
    nonblocking: bool,
) -> SysResult {
    match receive(proc, user, index, iovecs, 0, nonblocking)? {
        Ok((full, _)) => value(received_length(0, full, iovecs)),
        Err(outcome) => outcome,
    }
}

/// The poll bits of end `index`: readable with a datagram queued; writable while the peer's
/// queue has room, or once the peer is gone (a send then fails at once).
pub(super) fn ready_bits(proc: &GuestProcess, index: usize) -> u16 {
    let Ok(socket) = proc.fds.unix_datagram(index) else {
        return 0x020; // POLLNVAL
    };
    let (readable, writable) = (0x041u16, 0x104u16);
    let mut bits = 0;
    if socket.inbox.front().is_some() {
        bits |= readable;
    }
    let room = socket.peer.map_or(Ok(true), |p| {
        proc.fds.unix_datagram(p).map(|s| s.inbox.has_room(0))
    });
    if room.unwrap_or(true) {
        bits |= writable;
    }
    bits
}
