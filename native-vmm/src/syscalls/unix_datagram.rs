//! AF_UNIX SOCK_DGRAM sockets (`Object::UnixDatagram`): socketpairs, and sockets made by
//! socket(2) that bind to a path or an abstract name in the VM's namespace and send to one
//! another by that address or through connect, within a process or across the tree (the
//! addresses are addresses.rs's, which finds the socket a call names). Each send is one
//! datagram in the receiver's queue (`net::loopback::Queue`) with the sender's address (none
//! when it is unbound), received whole, or cut to the buffer with the rest dropped
//! (MSG_TRUNC), as on Linux. A full queue makes the sender wait (EAGAIN when nonblocking); an
//! empty one the receiver. Once the peer closed, the next send is ECONNREFUSED and later ones
//! ENOTCONN, while a receive still waits, as on Linux. A socket connected to another takes
//! datagrams from that one only (others get EPERM). Passing fds (SCM_RIGHTS) on these is
//! EOPNOTSUPP.
//!
//! Connected AF_UNIX SOCK_SEQPACKET sockets (socketpairs, and connections through a listener:
//! addresses.rs) are these too, connected for good: a send ignores any address, and once the
//! peer is gone a receive of an empty queue is end of file (0) and a send EPIPE.

use super::{
    check_iovecs, iovec_total, scatter, value, wait_ready, SysResult, UserMemory, MSG_PEEK,
};
use crate::errno::Errno;
use crate::net::loopback::QUEUE_BYTES;
use crate::process::{GuestProcess, Object, O_NONBLOCK};

/// The largest datagram (Linux: the send buffer less its header): EMSGSIZE past it.
pub(super) const MAX_DATAGRAM: usize = QUEUE_BYTES - 32;
pub(super) const MSG_TRUNC: u64 = 0x20;
const EMSGSIZE: Errno = Errno(90);

/// The AF_UNIX datagram (or connected seqpacket) socket at `fd`, if it is one: (index,
/// nonblocking).
pub(super) fn index_of(proc: &GuestProcess, fd: u64) -> Option<(usize, bool)> {
    let desc = proc.fds.get(fd).ok()?;
    match desc.object {
        Object::UnixDatagram(i) => Some((i, desc.nonblocking())),
        _ => None,
    }
}

/// socket(AF_UNIX, SOCK_DGRAM): unbound and unconnected.
pub(super) fn open(proc: &mut GuestProcess, nonblocking: bool, cloexec: bool) -> SysResult {
    let flags = if nonblocking { O_NONBLOCK } else { 0 };
    let description = proc.fds.new_unix_datagram(flags);
    value(proc.fds.install(description, 0, cloexec)?)
}

/// Err(EPERM) unless socket `to` takes datagrams from `from`: it is connected to no other.
fn may_send(proc: &GuestProcess, from: usize, to: usize) -> Result<(), Errno> {
    match proc.fds.unix_datagram(to)?.peer {
        Some(peer) if peer != from => Err(Errno::EPERM),
        _ => Ok(()),
    }
}

/// connect(fd, addr, addrlen) of datagram socket `index` to socket `peer`: later sends
/// without an address go there and only its datagrams are taken; None (AF_UNSPEC) dissolves
/// the connection. A SOCK_SEQPACKET one is connected for good (EISCONN).
pub(super) fn connect(proc: &mut GuestProcess, index: usize, peer: Option<usize>) -> SysResult {
    if proc.fds.unix_datagram(index)?.seqpacket {
        return Err(Errno::EISCONN);
    }
    if let Some(to) = peer {
        may_send(proc, index, to)?;
    }
    let socket = proc.fds.unix_datagram_mut(index)?;
    socket.peer = peer;
    socket.peer_closed = false;
    value(0)
}

/// Sends the bytes of `iovecs` as one datagram from socket `index` to its peer (EPIPE once a
/// SOCK_SEQPACKET one's peer is gone).
pub(super) fn send(
    proc: &mut GuestProcess,
    user: &UserMemory,
    index: usize,
    iovecs: &[(u64, u64)],
    nonblocking: bool,
) -> SysResult {
    let socket = proc.fds.unix_datagram_mut(index)?;
    let Some(peer) = socket.peer else {
        return Err(if socket.seqpacket {
            Errno::EPIPE
        } else if std::mem::take(&mut socket.peer_closed) {
            Errno::ECONNREFUSED
        } else {
            Errno::ENOTCONN
        });
    };
    send_to(proc, user, index, iovecs, peer, nonblocking)
}

/// Sends the bytes of `iovecs` as one datagram from socket `index` to socket `to`.
pub(super) fn send_to(
    proc: &mut GuestProcess,
    user: &UserMemory,
    index: usize,
    iovecs: &[(u64, u64)],
    to: usize,
    nonblocking: bool,
) -> SysResult {
    let total = iovec_total(iovecs);
    if total > MAX_DATAGRAM as u64 {
        return Err(EMSGSIZE);
    }
    may_send(proc, index, to)?;
    if !proc.fds.unix_datagram(to)?.inbox.has_room(total as usize) {
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
    let from = proc
        .fds
        .unix_datagram(index)?
        .name
        .clone()
        .unwrap_or_default();
    proc.fds.unix_datagram_mut(to)?.inbox.push(from, data);
    value(total)
}

/// What a receive got: the datagram's whole length, whether it was cut, and its sender's
/// address (empty: unnamed).
pub(super) struct Received {
    pub full: usize,
    pub cut: bool,
    pub from: Vec<u8>,
}

impl Received {
    /// The sender's address, None for an unnamed sender.
    pub fn source(&self) -> Option<&[u8]> {
        Some(self.from.as_slice()).filter(|name| !name.is_empty())
    }
}

/// Receives the next datagram at socket `index` into `iovecs`: Ok(Ok(what came)), or
/// Ok(Err(the call's outcome)) when none is there yet. MSG_PEEK leaves it queued.
pub(super) fn receive(
    proc: &mut GuestProcess,
    user: &UserMemory,
    index: usize,
    iovecs: &[(u64, u64)],
    flags: u64,
    nonblocking: bool,
) -> Result<Result<Received, SysResult>, Errno> {
    let room = iovec_total(iovecs).min(MAX_DATAGRAM as u64) as usize;
    check_iovecs(user, iovecs, MAX_DATAGRAM as u64)?;
    let socket = proc.fds.unix_datagram_mut(index)?;
    let hung_up = socket.seqpacket && socket.peer.is_none();
    let inbox = &mut socket.inbox;
    let Some(datagram) = inbox.front() else {
        if hung_up {
            return Ok(Ok(Received {
                full: 0,
                cut: false,
                from: Vec::new(),
            }));
        }
        return Ok(Err(if nonblocking {
            Err(Errno::EAGAIN)
        } else {
            wait_ready(proc, None)
        }));
    };
    let full = datagram.data.len();
    scatter(user, iovecs, &datagram.data[..full.min(room)])?;
    let from = datagram.envelope.clone();
    if flags & MSG_PEEK == 0 {
        inbox.pop();
    }
    Ok(Ok(Received {
        full,
        cut: full > room,
        from,
    }))
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
        Ok(received) => value(received_length(0, received.full, iovecs)),
        Err(outcome) => outcome,
    }
}

/// The poll bits of socket `index`: readable with a datagram queued; writable while the
/// peer's queue has room, or with no peer (a send then names its receiver, or fails at once);
/// a SOCK_SEQPACKET one whose peer is gone is readable and hung up too.
pub(super) fn ready_bits(proc: &GuestProcess, index: usize) -> u16 {
    let Ok(socket) = proc.fds.unix_datagram(index) else {
        return 0x020; // POLLNVAL
    };
    let (readable, writable) = (0x041u16, 0x104u16);
    let mut bits = 0;
    if socket.inbox.front().is_some() {
        bits |= readable;
    }
    if socket.seqpacket && socket.peer.is_none() {
        let (hung_up, read_hung_up) = (0x010u16, 0x2000u16);
        bits |= readable | hung_up | read_hung_up;
    }
    let room = socket.peer.map_or(Ok(true), |p| {
        proc.fds.unix_datagram(p).map(|s| s.inbox.has_room(0))
    });
    if room.unwrap_or(true) {
        bits |= writable;
    }
    bits
}
