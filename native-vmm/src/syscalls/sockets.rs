//! Sockets: no network, but in-memory stream sockets inside the VM: AF_UNIX socketpairs
//! (asyncio's self-pipe and similar helpers), and sockets connected through an address of the
//! VM's own namespace (addresses.rs: socket, bind, listen, accept, connect). A connected
//! socket is two in-memory channels, one per direction (process/fds.rs), bounded like pipes.
//! Its ends read and write like pipes (files.rs), plus the calls below. Any socket call on
//! an fd that is not a socket is ENOTSOCK; a transfer on one not connected yet is ENOTCONN.
//!
//! A transfer that would block forever stops the run, as for pipes (files.rs). Ancillary data
//! (SCM_RIGHTS, credentials) is not supported: sendmsg with control data is EOPNOTSUPP.
//! Internet sockets whose traffic leaves the VM are inet.rs's: each call here hands them over.

use super::addresses::{endpoint_name, write_truncated, AF_INET, AF_INET6};
use super::files::{fd_arg, read_channel, transfer_each, write_channel};
use super::{inet, nonblocking_call, value, SysResult, UserMemory, MSG_PEEK};
use crate::errno::Errno;
use crate::process::{GuestProcess, Object, PipeError, O_NONBLOCK, PIPE_CAPACITY};

const AF_UNIX: u64 = 1;
const SOCK_STREAM: u64 = 1;
const SOCK_TYPE_MASK: u64 = 0xf;
const SOCK_NONBLOCK: u64 = 0o4000;
const SOCK_CLOEXEC: u64 = 0o2000000;

const SOL_SOCKET: u64 = 1;
const SO_REUSEADDR: u64 = 2;
const SO_TYPE: u64 = 3;
const SO_ERROR: u64 = 4;
const SO_SNDBUF: u64 = 7;
const SO_RCVBUF: u64 = 8;
const SO_KEEPALIVE: u64 = 9;
const SO_PASSCRED: u64 = 16;
const SO_ACCEPTCONN: u64 = 30;
const SO_PROTOCOL: u64 = 38;
const SO_DOMAIN: u64 = 39;

const ENOPROTOOPT: Errno = Errno(92);
const EPROTONOSUPPORT: Errno = Errno(93);
const EISCONN: Errno = Errno::EISCONN;
const IPPROTO_TCP: u64 = 6;
const IPPROTO_IPV6: u64 = 41;
const IPV6_V6ONLY: u64 = 26;
const SO_REUSEPORT: u64 = 15;

/// An unnamed AF_UNIX address: just the family (what getsockname shows for a socketpair).
const UNNAMED_ADDRESS: [u8; 2] = [AF_UNIX as u8, 0];

/// The socket end at `fd`: (receive channel, send channel or None after SHUT_WR, nonblocking).
fn socket(proc: &GuestProcess, fd: u64) -> Result<(usize, Option<usize>, bool), Errno> {
    let desc = proc.fds.get(fd_arg(fd))?;
    match desc.object {
        Object::Socket { rx, tx, shut_write } => {
            Ok((rx, (!shut_write).then_some(tx), desc.nonblocking()))
        }
        Object::Endpoint(_) => Err(Errno::ENOTCONN),
        _ => Err(Errno::ENOTSOCK),
    }
}

/// Any socket at `fd`, connected or not: (family, listening).
fn any_socket(proc: &GuestProcess, fd: u64) -> Result<(u16, bool), Errno> {
    match proc.fds.get(fd_arg(fd))?.object {
        Object::Socket { rx, .. } => {
            let family = proc
                .fds
                .socket_names(rx)
                .map_or(AF_UNIX as u16, |(local, _)| {
                    u16::from_le_bytes([local[0], local[1]])
                });
            Ok((family, false))
        }
        Object::Endpoint(i) => {
            let endpoint = proc.fds.endpoint(i)?;
            Ok((endpoint.family, endpoint.listening.is_some()))
        }
        _ => Err(Errno::ENOTSOCK),
    }
}

/// socketpair(domain, type, protocol, sv): AF_UNIX SOCK_STREAM only (with SOCK_NONBLOCK and
/// SOCK_CLOEXEC); other types are EOPNOTSUPP, other families EOPNOTSUPP too (no network).
pub(crate) fn socketpair(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [domain, kind, protocol, sv, ..] = args;
    let (domain, kind, protocol) = (
        u64::from(domain as u32),
        u64::from(kind as u32),
        u64::from(protocol as u32),
    );
    if kind & !(SOCK_TYPE_MASK | SOCK_NONBLOCK | SOCK_CLOEXEC) != 0 {
        return Err(Errno::EINVAL);
    }
    if domain != AF_UNIX || kind & SOCK_TYPE_MASK != SOCK_STREAM {
        return Err(Errno::EOPNOTSUPP);
    }
    if protocol != 0 && protocol != AF_UNIX {
        return Err(EPROTONOSUPPORT);
    }
    user.check(sv, 8)?;
    let cloexec = kind & SOCK_CLOEXEC != 0;
    let nonblock = if kind & SOCK_NONBLOCK != 0 {
        O_NONBLOCK
    } else {
        0
    };
    let (a, b) = proc.fds.new_socketpair(nonblock);
    let fd_a = proc.fds.install(a, 0, cloexec)?;
    let fd_b = match proc.fds.install(b, 0, cloexec) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = proc.fds.close(fd_a);
            return Err(e);
        }
    };
    user.write_u32(sv, fd_a as u32)?;
    user.write_u32(sv + 4, fd_b as u32)?;
    value(0)
}

/// sendto(fd, buf, len, flags, dest_addr, addrlen): a destination on a connected pair is EISCONN.
pub(crate) fn sendto(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if inet::index_of(proc, fd_arg(args[0])).is_some() {
        return inet::sendto(proc, user, args);
    }
    let [fd, buf, len, flags, _, addrlen] = args;
    let (_, tx, nonblocking) = socket(proc, fd)?;
    if addrlen as u32 != 0 {
        return Err(EISCONN);
    }
    let nonblocking = nonblocking_call(flags, nonblocking)?;
    let tx = tx.ok_or(Errno::EPIPE)?;
    write_channel(proc, user, tx, buf, len, nonblocking)
}

/// recvfrom(fd, buf, len, flags, src_addr, addrlen): MSG_PEEK leaves the bytes queued; the
/// peer of a socketpair has no address, so *addrlen becomes 0. MSG_WAITALL may return less
/// (what is there), never waiting for the rest.
pub(crate) fn recvfrom(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if inet::index_of(proc, fd_arg(args[0])).is_some() {
        return inet::recvfrom(proc, user, args);
    }
    let [fd, buf, len, flags, src, addrlen] = args;
    let (rx, _, nonblocking) = socket(proc, fd)?;
    let nonblocking = nonblocking_call(flags, nonblocking)?;
    if src != 0 && addrlen != 0 {
        user.write_u32(addrlen, 0)?;
    }
    if flags & MSG_PEEK == 0 {
        return read_channel(proc, user, rx, buf, len, nonblocking);
    }
    user.check(buf, len.min(PIPE_CAPACITY as u64))?;
    match proc
        .fds
        .pipe(rx)?
        .peek(len.min(PIPE_CAPACITY as u64) as usize)
    {
        Ok(bytes) => {
            user.write(buf, &bytes)?;
            value(bytes.len() as u64)
        }
        Err(PipeError::WouldBlock) if nonblocking => Err(Errno::EAGAIN),
        Err(_) => super::wait_ready(proc, None),
    }
}

/// A `struct msghdr`'s (iovec array, iovec count, control length); a name is EISCONN.
fn read_msghdr(user: &UserMemory, msg: u64) -> Result<(Vec<(u64, u64)>, u64), Errno> {
    let namelen = user.read_u32(msg + 8)?;
    let (iov, iovlen, controllen) = (
        user.read_u64(msg + 16)?,
        user.read_u64(msg + 24)?,
        user.read_u64(msg + 40)?,
    );
    if namelen != 0 && user.read_u64(msg)? != 0 {
        return Err(EISCONN);
    }
    Ok((user.read_iovecs(iov, iovlen)?, controllen))
}

/// sendmsg(fd, msg, flags): the iovecs in order; control data (passing fds) is EOPNOTSUPP.
pub(crate) fn sendmsg(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if inet::index_of(proc, fd_arg(args[0])).is_some() {
        return inet::sendmsg(proc, user, args);
    }
    let [fd, msg, flags, ..] = args;
    let (_, tx, nonblocking) = socket(proc, fd)?;
    let nonblocking = nonblocking_call(flags, nonblocking)?;
    let (iovecs, controllen) = read_msghdr(user, msg)?;
    if controllen != 0 {
        return Err(Errno::EOPNOTSUPP);
    }
    let tx = tx.ok_or(Errno::EPIPE)?;
    transfer_each(&iovecs, |base, len| {
        write_channel(proc, user, tx, base, len, nonblocking)
    })
}

/// recvmsg(fd, msg, flags): fills the iovecs in order; no name, no control data, no flags
/// come back. MSG_PEEK is EOPNOTSUPP here (recv/recvfrom support it).
pub(crate) fn recvmsg(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if inet::index_of(proc, fd_arg(args[0])).is_some() {
        return inet::recvmsg(proc, user, args);
    }
    let [fd, msg, flags, ..] = args;
    let (rx, _, nonblocking) = socket(proc, fd)?;
    let nonblocking = nonblocking_call(flags, nonblocking)?;
    if flags & MSG_PEEK != 0 {
        return Err(Errno::EOPNOTSUPP);
    }
    let (iovecs, _) = read_msghdr(user, msg)?;
    user.write_u32(msg + 8, 0)?;
    user.write_u64(msg + 40, 0)?;
    user.write_u32(msg + 48, 0)?;
    transfer_each(&iovecs, |base, len| {
        read_channel(proc, user, rx, base, len, nonblocking)
    })
}

/// shutdown(fd, how): SHUT_RD, SHUT_WR or SHUT_RDWR.
pub(crate) fn shutdown(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let how = u64::from(args[1] as u32);
    if how > 2 {
        return Err(Errno::EINVAL);
    }
    if let Some(index) = inet::index_of(proc, fd_arg(args[0])) {
        return inet::shutdown(proc, index, how);
    }
    socket(proc, args[0])?;
    proc.fds
        .shutdown_socket(fd_arg(args[0]), how != 1, how != 0)?;
    value(0)
}

/// getsockopt(fd, level, name, value, len): the SOL_SOCKET options programs probe; anything
/// else is ENOPROTOOPT.
pub(crate) fn getsockopt(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [fd, level, name, optval, optlen, _] = args;
    if let Some(index) = inet::index_of(proc, fd_arg(fd)) {
        let answer = inet::option(proc, index, level as i32, name as i32)?;
        return write_truncated(user, optval, optlen, &answer.to_le_bytes());
    }
    let (family, listening) = any_socket(proc, fd)?;
    let internet = family == AF_INET || family == AF_INET6;
    let answer: u32 = match (u64::from(level as u32), u64::from(name as u32)) {
        (SOL_SOCKET, SO_TYPE) => SOCK_STREAM as u32,
        (SOL_SOCKET, SO_DOMAIN) => u32::from(family),
        (SOL_SOCKET, SO_SNDBUF | SO_RCVBUF) => PIPE_CAPACITY as u32,
        (SOL_SOCKET, SO_ACCEPTCONN) => u32::from(listening),
        (SOL_SOCKET, SO_PROTOCOL) => {
            if internet {
                IPPROTO_TCP as u32
            } else {
                0
            }
        }
        (SOL_SOCKET, SO_ERROR | SO_REUSEADDR | SO_REUSEPORT | SO_KEEPALIVE) => 0,
        // Options of TCP and IPv6 change nothing in memory: they read back as 0.
        (IPPROTO_TCP, _) | (IPPROTO_IPV6, IPV6_V6ONLY) if internet => 0,
        _ => return Err(ENOPROTOOPT),
    };
    write_truncated(user, optval, optlen, &answer.to_le_bytes())
}

/// setsockopt(fd, level, name, value, len): options with no effect on in-memory channels are
/// accepted (buffer sizes stay PIPE_CAPACITY; TCP's and IPV6_V6ONLY on Internet sockets);
/// timeouts and the rest are ENOPROTOOPT, since a receive timeout could not be honoured.
pub(crate) fn setsockopt(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [fd, level, name, optval, optlen, _] = args;
    if let Some(index) = inet::index_of(proc, fd_arg(fd)) {
        if (optlen as u32) < 4 {
            return Err(Errno::EINVAL);
        }
        let int = user.read_u32(optval)?.cast_signed();
        inet::set_option(proc, index, level as i32, name as i32, int)?;
        return value(0);
    }
    let (family, _) = any_socket(proc, fd)?;
    let internet = family == AF_INET || family == AF_INET6;
    let accepted = match (u64::from(level as u32), u64::from(name as u32)) {
        (
            SOL_SOCKET,
            SO_REUSEADDR | SO_REUSEPORT | SO_SNDBUF | SO_RCVBUF | SO_KEEPALIVE | SO_PASSCRED,
        ) => true,
        (IPPROTO_TCP, _) | (IPPROTO_IPV6, IPV6_V6ONLY) => internet,
        _ => false,
    };
    if !accepted {
        return Err(ENOPROTOOPT);
    }
    if (optlen as u32) < 4 {
        return Err(Errno::EINVAL);
    }
    user.read_u32(optval)?;
    value(0)
}

/// getsockname(fd, addr, addrlen): a socketpair's ends are unnamed.
pub(crate) fn getsockname(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let name = match proc.fds.get(fd_arg(args[0]))?.object {
        Object::Socket { rx, .. } => proc
            .fds
            .socket_names(rx)
            .map_or(UNNAMED_ADDRESS.to_vec(), |(local, _)| local.clone()),
        Object::Endpoint(i) => endpoint_name(proc, i)?,
        Object::Inet(i) => inet::local_name(proc, i)?,
        _ => return Err(Errno::ENOTSOCK),
    };
    write_truncated(user, args[1], args[2], &name)
}

/// getpeername(fd, addr, addrlen): ENOTCONN before connect.
pub(crate) fn getpeername(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let name = match proc.fds.get(fd_arg(args[0]))?.object {
        Object::Socket { rx, .. } => proc
            .fds
            .socket_names(rx)
            .map_or(UNNAMED_ADDRESS.to_vec(), |(_, peer)| peer.clone()),
        Object::Endpoint(_) => return Err(Errno::ENOTCONN),
        Object::Inet(i) => inet::peer_name(proc, i)?,
        _ => return Err(Errno::ENOTSOCK),
    };
    write_truncated(user, args[1], args[2], &name)
}

/// sendmmsg(fd, msgvec, vlen, flags): Internet sockets only (inet.rs); EOPNOTSUPP on the
/// VM's in-memory sockets.
pub(crate) fn sendmmsg(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if inet::index_of(proc, fd_arg(args[0])).is_some() {
        return inet::sendmmsg(proc, user, args);
    }
    any_socket(proc, args[0])?;
    Err(Errno::EOPNOTSUPP)
}
