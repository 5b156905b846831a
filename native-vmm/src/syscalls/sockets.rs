//! Sockets: no network, but in-memory stream sockets inside the VM: AF_UNIX socketpairs
//! (asyncio's self-pipe and similar helpers), and sockets connected through an address of the
//! VM's own namespace (addresses.rs: socket, bind, listen, accept, connect). A connected
//! socket is two in-memory channels, one per direction (process/fds.rs), bounded like pipes.
//! Its ends read and write like pipes (files.rs), plus the calls below. Any socket call on
//! an fd that is not a socket is ENOTSOCK; a transfer on one not connected yet is ENOTCONN.
//!
//! A transfer that would block forever stops the run, as for pipes (files.rs). Ancillary data
//! (control.rs lays it out): SCM_RIGHTS passes file descriptions between the processes of the
//! tree (and within one), as Linux does; credentials (SCM_CREDENTIALS) are EOPNOTSUPP. The IP
//! control messages of UDP sockets are ancillary.rs's.
//! Internet sockets whose traffic leaves the VM are inet.rs's, AF_UNIX datagram sockets
//! unix_datagram.rs's: each call here hands them over.

use super::addresses::{datagram_destination, endpoint_name, write_truncated, AF_INET, AF_INET6};
use super::ancillary::SOL_IP;
use super::control::{messages, read_control, read_msghdr, MessageHeader, Reply, CMSG_HEADER};
use super::files::{
    fd_arg, read_channel, transfer_each, write_channel, write_channel_passing, MAX_IO,
};
use super::unix_datagram::{self, received_length};
use super::{
    check_iovecs, inet, iovec_total, nonblocking_call, scatter, value, wait_ready,
    write_source_name, SysResult, SyscallOutcome, UserMemory, MSG_OOB, MSG_PEEK,
};
use crate::errno::Errno;
use crate::process::{
    GuestProcess, Object, PipeError, MAX_PASSED_PER_MESSAGE, O_NONBLOCK, PIPE_CAPACITY,
};

const AF_UNIX: u64 = 1;
const SOCK_STREAM: u64 = 1;
const SOCK_DGRAM: u64 = 2;
const SOCK_SEQPACKET: u64 = 5;
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
const SO_BROADCAST: u64 = 6;
const SO_OOBINLINE: u64 = 10;
const SO_PASSCRED: u64 = 16;
const SO_LINGER: u64 = 13;
/// struct linger's size: l_onoff and l_linger, two ints.
const LINGER_SIZE: u64 = 8;
const SO_ACCEPTCONN: u64 = 30;
const SO_PROTOCOL: u64 = 38;
const SO_DOMAIN: u64 = 39;

const ENOPROTOOPT: Errno = Errno(92);
const EPROTONOSUPPORT: Errno = Errno(93);
const ESOCKTNOSUPPORT: Errno = Errno(94);
const EISCONN: Errno = Errno::EISCONN;
const IPPROTO_TCP: u64 = 6;
const TCP_NODELAY: u64 = 1;
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
        Object::UnixDatagram(_) => Err(Errno::EOPNOTSUPP),
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
        Object::UnixDatagram(_) => Ok((AF_UNIX as u16, false)),
        _ => Err(Errno::ENOTSOCK),
    }
}

/// socketpair(domain, type, protocol, sv): AF_UNIX SOCK_STREAM, SOCK_DGRAM and SOCK_SEQPACKET
/// (with SOCK_NONBLOCK and SOCK_CLOEXEC); other types are ESOCKTNOSUPPORT, other families
/// EOPNOTSUPP, as on Linux.
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
    let seqpacket = kind & SOCK_TYPE_MASK == SOCK_SEQPACKET;
    let datagram = seqpacket || kind & SOCK_TYPE_MASK == SOCK_DGRAM;
    if domain != AF_UNIX {
        return Err(Errno::EOPNOTSUPP);
    }
    if !(datagram || kind & SOCK_TYPE_MASK == SOCK_STREAM) {
        return Err(ESOCKTNOSUPPORT);
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
    let (a, b) = if datagram {
        proc.fds.new_datagram_pair(nonblock, seqpacket)
    } else {
        proc.fds.new_socketpair(nonblock)
    };
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

/// sendto(fd, buf, len, flags, dest_addr, addrlen): a destination on a connected Unix socket is
/// EISCONN; a TCP connection ignores it, as Linux's does.
pub(crate) fn sendto(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if inet::index_of(proc, fd_arg(args[0])).is_some() {
        return inet::sendto(proc, user, args);
    }
    let [fd, buf, len, flags, addr, addrlen] = args;
    if let Some((index, nonblocking)) = unix_datagram::index_of(proc, fd_arg(fd)) {
        let nonblocking = nonblocking_call(flags, nonblocking)?;
        let iovecs = [(buf, len)];
        let dest = (addr != 0 && addrlen as u32 != 0).then_some((addr, addrlen));
        return send_datagram(proc, user, index, &iovecs, dest, nonblocking);
    }
    let (_, tx, nonblocking) = socket(proc, fd)?;
    if addrlen as u32 != 0 && refuses_destination(proc, fd)? {
        return Err(EISCONN);
    }
    let nonblocking = stream_send_nonblocking(proc, fd, flags, nonblocking)?;
    let tx = tx.ok_or(Errno::EPIPE)?;
    write_channel(proc, user, tx, buf, len, nonblocking)
}

/// Whether a send on the connected stream socket at `fd` must not wait (`nonblocking_call`).
/// MSG_OOB is taken on a TCP connection of the VM's loopback whose receiving socket reads
/// urgent data inline (SO_OOBINLINE): the bytes go into the stream, where that receiver reads
/// them on Linux too (no urgent mark is kept: its poll reports no POLLPRI). For a receiver
/// that would read the urgent byte apart (recv with MSG_OOB) it stays EOPNOTSUPP.
fn stream_send_nonblocking(
    proc: &GuestProcess,
    fd: u64,
    flags: u64,
    nonblocking: bool,
) -> Result<bool, Errno> {
    if flags & MSG_OOB != 0 && urgent_data_goes_inline(proc, fd)? {
        return nonblocking_call(flags & !MSG_OOB, nonblocking);
    }
    nonblocking_call(flags, nonblocking)
}

/// Whether the connected socket at `fd` is TCP and its peer keeps SO_OOBINLINE.
fn urgent_data_goes_inline(proc: &GuestProcess, fd: u64) -> Result<bool, Errno> {
    let (family, _) = any_socket(proc, fd)?;
    let Object::Socket { tx, .. } = proc.fds.get(fd_arg(fd))?.object else {
        return Ok(false);
    };
    let inline = kept_bit((SOL_SOCKET, SO_OOBINLINE)).unwrap_or(0);
    Ok(matches!(family, AF_INET | AF_INET6)
        && proc
            .fds
            .receiver_of(tx)
            .is_some_and(|peer| peer.socket_options & inline != 0))
}

/// Whether the connected stream socket at `fd` refuses a send naming a destination (EISCONN):
/// a Unix one does, a TCP one ignores the address, as Linux's do.
fn refuses_destination(proc: &GuestProcess, fd: u64) -> Result<bool, Errno> {
    Ok(u64::from(any_socket(proc, fd)?.0) == AF_UNIX)
}

/// Sends the bytes of `iovecs` as one datagram from AF_UNIX datagram socket `index` to the
/// socket at `dest` (a sockaddr's address and length), or to its peer without one; a
/// SOCK_SEQPACKET one ignores the address, as Linux does.
fn send_datagram(
    proc: &mut GuestProcess,
    user: &UserMemory,
    index: usize,
    iovecs: &[(u64, u64)],
    dest: Option<(u64, u64)>,
    nonblocking: bool,
) -> SysResult {
    match dest {
        Some((addr, len)) if !proc.fds.unix_datagram(index)?.seqpacket => {
            let to = datagram_destination(proc, user, addr, len)?;
            unix_datagram::send_to(proc, user, index, iovecs, to, nonblocking)
        }
        _ => unix_datagram::send(proc, user, index, iovecs, nonblocking),
    }
}

/// recvfrom(fd, buf, len, flags, src_addr, addrlen): MSG_PEEK leaves the bytes queued; the
/// peer of a socketpair has no address, so *addrlen becomes 0. MSG_WAITALL may return less
/// (what is there), never waiting for the rest.
pub(crate) fn recvfrom(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if inet::index_of(proc, fd_arg(args[0])).is_some() {
        return inet::recvfrom(proc, user, args);
    }
    let [fd, buf, len, flags, src, addrlen] = args;
    if let Some((index, nonblocking)) = unix_datagram::index_of(proc, fd_arg(fd)) {
        let nonblocking = nonblocking_call(flags, nonblocking)?;
        let iovecs = [(buf, len)];
        return match unix_datagram::receive(proc, user, index, &iovecs, flags, nonblocking)? {
            Ok(received) => {
                write_source_name(user, (src, addrlen), received.source())?;
                value(received_length(flags, received.full, &iovecs))
            }
            Err(outcome) => outcome,
        };
    }
    let (rx, _, nonblocking) = socket(proc, fd)?;
    let nonblocking = nonblocking_call(flags, nonblocking)?;
    if src != 0 && addrlen != 0 {
        user.write_u32(addrlen, 0)?;
    }
    if flags & MSG_PEEK == 0 {
        return read_channel(proc, user, rx, buf, len, nonblocking);
    }
    let iovecs = [(buf, len)];
    peek(proc, user, rx, &iovecs, nonblocking)
}

/// MSG_PEEK on a stream socket's receive channel `rx`: up to what `iovecs` hold of the bytes
/// there, left queued (descriptions passed with them stay too), written over `iovecs`.
fn peek(
    proc: &GuestProcess,
    user: &UserMemory,
    rx: usize,
    iovecs: &[(u64, u64)],
    nonblocking: bool,
) -> SysResult {
    let max = iovec_total(iovecs).min(PIPE_CAPACITY as u64);
    check_iovecs(user, iovecs, max)?;
    match proc.fds.pipe(rx)?.peek(max as usize) {
        Ok(bytes) => {
            scatter(user, iovecs, &bytes)?;
            value(bytes.len() as u64)
        }
        Err(PipeError::WouldBlock) if nonblocking => Err(Errno::EAGAIN),
        Err(_) => wait_ready(proc, None),
    }
}

const SCM_RIGHTS: i32 = 1;
const SCM_CREDENTIALS: i32 = 2;
const MSG_CMSG_CLOEXEC: u64 = 0x4000_0000;

/// The fds sendmsg's control messages pass (SCM_RIGHTS, all of them in order); other levels
/// than SOL_SOCKET are ignored.
fn passed_fds(
    proc: &GuestProcess,
    user: &UserMemory,
    header: &MessageHeader,
) -> Result<Vec<u64>, Errno> {
    let buffer = read_control(user, header)?;
    let mut fds = Vec::new();
    for message in messages(&buffer)? {
        if u64::from(message.level.cast_unsigned()) != SOL_SOCKET {
            continue;
        }
        match message.kind {
            SCM_RIGHTS => {
                if fds.len() + message.data.len() / 4 > MAX_PASSED_PER_MESSAGE {
                    return Err(Errno::EINVAL);
                }
                for raw in message.data.chunks_exact(4) {
                    let raw = i32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
                    let fd = u64::try_from(raw).map_err(|_| Errno::EBADF)?;
                    proc.fds.get(fd)?;
                    fds.push(fd);
                }
            }
            SCM_CREDENTIALS => return Err(Errno::EOPNOTSUPP),
            _ => return Err(Errno::EINVAL),
        }
    }
    Ok(fds)
}

/// sendmsg(fd, msg, flags): the iovecs in order; SCM_RIGHTS control messages pass their fds'
/// descriptions with the first bytes sent (none are passed when no byte is).
pub(crate) fn sendmsg(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if inet::index_of(proc, fd_arg(args[0])).is_some() {
        return inet::sendmsg(proc, user, args);
    }
    let [fd, msg, flags, ..] = args;
    if let Some((index, nonblocking)) = unix_datagram::index_of(proc, fd_arg(fd)) {
        let nonblocking = nonblocking_call(flags, nonblocking)?;
        let header = read_msghdr(user, msg)?;
        if !passed_fds(proc, user, &header)?.is_empty() {
            return Err(Errno::EOPNOTSUPP);
        }
        let dest = header.name.map(|(addr, len)| (addr, u64::from(len)));
        return send_datagram(proc, user, index, &header.iovecs, dest, nonblocking);
    }
    let (_, tx, nonblocking) = socket(proc, fd)?;
    let nonblocking = stream_send_nonblocking(proc, fd, flags, nonblocking)?;
    let header = read_msghdr(user, msg)?;
    if header.name.is_some() && refuses_destination(proc, fd)? {
        return Err(EISCONN);
    }
    let mut fds = passed_fds(proc, user, &header)?;
    let tx = tx.ok_or(Errno::EPIPE)?;
    transfer_each(&header.iovecs, |base, len| {
        let data = user.read_vec(base, len.min(proc.fds.pipe(tx)?.capacity() as u64))?;
        let outcome = write_channel_passing(proc, tx, &data, &fds, nonblocking);
        if matches!(outcome, Ok(SyscallOutcome::Return(n)) if n > 0) {
            fds.clear();
        }
        outcome
    })
}

/// recvmsg(fd, msg, flags): one receive scattered over the iovecs. Descriptions passed with
/// the bytes are installed as new fds (close-on-exec with MSG_CMSG_CLOEXEC) in one
/// SCM_RIGHTS control message; those the control buffer or the fd limit has no room for are
/// closed and MSG_CTRUNC is set, as on Linux. No name comes back. MSG_PEEK leaves the bytes
/// queued and receives no descriptions.
pub(crate) fn recvmsg(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if inet::index_of(proc, fd_arg(args[0])).is_some() {
        return inet::recvmsg(proc, user, args);
    }
    let [fd, msg, flags, ..] = args;
    if let Some((index, nonblocking)) = unix_datagram::index_of(proc, fd_arg(fd)) {
        let nonblocking = nonblocking_call(flags, nonblocking)?;
        let header = read_msghdr(user, msg)?;
        let iovecs = &header.iovecs;
        return match unix_datagram::receive(proc, user, index, iovecs, flags, nonblocking)? {
            Ok(received) => {
                let name = header.name.map_or(0, |(addr, _)| addr);
                write_source_name(user, (name, msg + 8), received.source())?;
                if name == 0 {
                    user.write_u32(msg + 8, 0)?;
                }
                user.write_u64(msg + 40, 0)?;
                let msg_flags = if received.cut {
                    unix_datagram::MSG_TRUNC as u32
                } else {
                    0
                };
                user.write_u32(msg + 48, msg_flags)?;
                value(received_length(flags, received.full, iovecs))
            }
            Err(outcome) => outcome,
        };
    }
    let (rx, _, nonblocking) = socket(proc, fd)?;
    let nonblocking = nonblocking_call(flags, nonblocking)?;
    let header = read_msghdr(user, msg)?;
    if flags & MSG_PEEK != 0 {
        let peeked = peek(proc, user, rx, &header.iovecs, nonblocking)?;
        if matches!(peeked, SyscallOutcome::Return(_)) {
            user.write_u32(msg + 8, 0)?;
            user.write_u64(msg + 40, 0)?;
            user.write_u32(msg + 48, 0)?;
        }
        return Ok(peeked);
    }
    check_iovecs(user, &header.iovecs, MAX_IO)?;
    let mut reply = Reply::new(&header);
    let room = (reply.data_room() / 4).min(MAX_PASSED_PER_MESSAGE);
    if room > 0 {
        user.check(header.control, (CMSG_HEADER + 4 * room) as u64)?;
    }
    let total = iovec_total(&header.iovecs).min(MAX_IO);
    let (bytes, passed) = match proc.fds.read_channel(rx, total as usize)? {
        Ok(received) => received,
        Err(_) if nonblocking => return Err(Errno::EAGAIN),
        Err(_) => return wait_ready(proc, None),
    };
    scatter(user, &header.iovecs, &bytes)?;
    let count = passed.len();
    let fds = proc
        .fds
        .receive(passed, room, flags & MSG_CMSG_CLOEXEC != 0);
    proc.release(None);
    if !fds.is_empty() {
        let data: Vec<u8> = fds
            .iter()
            .flat_map(|&fd| (fd as u32).to_le_bytes())
            .collect();
        reply.put(SOL_SOCKET as i32, SCM_RIGHTS, &data);
    }
    if fds.len() < count {
        reply.truncate();
    }
    user.write_u32(msg + 8, 0)?;
    reply.write(user, &header, msg, 0)?;
    value(bytes.len() as u64)
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

/// getsockopt(fd, level, name, value, len): the SOL_SOCKET options programs probe, those of
/// `KEPT_OPTIONS` as set; anything else is ENOPROTOOPT.
pub(crate) fn getsockopt(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [fd, level, name, optval, optlen, _] = args;
    let kept = kept_bit((level, name))
        .map(|bit| {
            proc.fds
                .get(fd_arg(fd))
                .map(|d| d.socket_options & bit != 0)
        })
        .transpose()?;
    if let Some(index) = inet::index_of(proc, fd_arg(fd)) {
        let answer = inet::option(proc, index, level as i32, name as i32)?;
        let answer = kept.map_or(answer, u32::from);
        // IPv4's options fit a buffer shorter than an int in a byte, as Linux's do.
        let room = user.read_u32(optlen)?.cast_signed();
        if level as i32 == SOL_IP && (1..4).contains(&room) && answer <= 0xff {
            return write_truncated(user, optval, optlen, &[answer as u8]);
        }
        return write_truncated(user, optval, optlen, &answer.to_le_bytes());
    }
    let (family, listening) = any_socket(proc, fd)?;
    let internet = family == AF_INET || family == AF_INET6;
    if (u64::from(level as u32), u64::from(name as u32)) == (SOL_SOCKET, SO_LINGER) {
        let linger = proc.fds.get(fd_arg(fd))?.linger;
        let mut answer = [0u8; LINGER_SIZE as usize];
        answer[..4].copy_from_slice(&u32::from(linger.is_some()).to_le_bytes());
        answer[4..].copy_from_slice(&linger.unwrap_or(0).to_le_bytes());
        return write_truncated(user, optval, optlen, &answer);
    }
    let answer: u32 = match (u64::from(level as u32), u64::from(name as u32)) {
        (SOL_SOCKET, SO_TYPE) => {
            let seqpacket = match proc.fds.get(fd_arg(fd))?.object {
                Object::UnixDatagram(i) => Some(proc.fds.unix_datagram(i)?.seqpacket),
                Object::Endpoint(i) => proc.fds.endpoint(i)?.seqpacket.then_some(true),
                _ => None,
            };
            match seqpacket {
                Some(true) => SOCK_SEQPACKET as u32,
                Some(false) => SOCK_DGRAM as u32,
                None => SOCK_STREAM as u32,
            }
        }
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
        (SOL_SOCKET, SO_REUSEADDR | SO_REUSEPORT | SO_KEEPALIVE | SO_BROADCAST | SO_OOBINLINE) => {
            kept.map_or(0, u32::from)
        }
        (IPPROTO_IPV6, IPV6_V6ONLY) if internet => kept.map_or(0, u32::from),
        (SOL_SOCKET, SO_ERROR) => 0,
        // Options of TCP change nothing in memory: TCP_NODELAY reads back as set, the
        // others as 0.
        (IPPROTO_TCP, _) if internet => kept.map_or(0, u32::from),
        _ => return Err(ENOPROTOOPT),
    };
    write_truncated(user, optval, optlen, &answer.to_le_bytes())
}

/// setsockopt(fd, level, name, value, len): options with no effect on in-memory channels are
/// accepted (buffer sizes stay PIPE_CAPACITY; TCP's and IPV6_V6ONLY on Internet sockets), those
/// of `KEPT_OPTIONS` kept to read back;
/// SO_LINGER is kept (with a zero timeout an Internet connection's close resets it); timeouts
/// and the rest are ENOPROTOOPT, since a receive timeout could not be honoured.
pub(crate) fn setsockopt(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [fd, level, name, optval, optlen, _] = args;
    if let Some(index) = inet::index_of(proc, fd_arg(fd)) {
        let raw = user.read_vec(optval, u64::from(optlen as u32).min(4))?;
        inet::set_option(proc, index, level as i32, name as i32, &raw)?;
        keep_option(proc, fd, (level, name), raw != [0; 4])?;
        return value(0);
    }
    let (family, _) = any_socket(proc, fd)?;
    let internet = family == AF_INET || family == AF_INET6;
    if (u64::from(level as u32), u64::from(name as u32)) == (SOL_SOCKET, SO_LINGER) {
        if (optlen as u32) < LINGER_SIZE as u32 {
            return Err(Errno::EINVAL);
        }
        let raw = user.read_vec(optval, LINGER_SIZE)?;
        let on = raw[..4] != [0; 4];
        let seconds = i32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]).max(0);
        proc.fds.get_mut(fd_arg(fd))?.linger = on.then_some(seconds.cast_unsigned());
        return value(0);
    }
    let accepted = match (u64::from(level as u32), u64::from(name as u32)) {
        (
            SOL_SOCKET,
            SO_REUSEADDR | SO_REUSEPORT | SO_SNDBUF | SO_RCVBUF | SO_KEEPALIVE | SO_PASSCRED
            | SO_BROADCAST | SO_OOBINLINE,
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
    let on = user.read_u32(optval)? != 0;
    keep_option(proc, fd, (level, name), on)?;
    value(0)
}

/// Boolean options kept on a socket's description only to read back as set: they change
/// nothing in memory, and a host socket is given them as they are set (inet.rs). One bit each.
const KEPT_OPTIONS: [(u64, u64); 7] = [
    (SOL_SOCKET, SO_REUSEADDR),
    (SOL_SOCKET, SO_REUSEPORT),
    (SOL_SOCKET, SO_KEEPALIVE),
    (SOL_SOCKET, SO_BROADCAST),
    (SOL_SOCKET, SO_OOBINLINE),
    (IPPROTO_IPV6, IPV6_V6ONLY),
    (IPPROTO_TCP, TCP_NODELAY),
];

fn kept_bit((level, name): (u64, u64)) -> Option<u8> {
    let option = (u64::from(level as u32), u64::from(name as u32));
    KEPT_OPTIONS
        .iter()
        .position(|&kept| kept == option)
        .map(|i| 1 << i)
}

/// Keeps option (level, name) `on` or off on the socket at `fd` if it is one of `KEPT_OPTIONS`;
/// IPV6_V6ONLY also decides whether an unconnected socket takes IPv4 connections.
fn keep_option(
    proc: &mut GuestProcess,
    fd: u64,
    option: (u64, u64),
    on: bool,
) -> Result<(), Errno> {
    if let Some(bit) = kept_bit(option) {
        let description = proc.fds.get_mut(fd_arg(fd))?;
        if on {
            description.socket_options |= bit;
        } else {
            description.socket_options &= !bit;
        }
        let v6only = kept_bit((IPPROTO_IPV6, IPV6_V6ONLY)) == Some(bit);
        if let (Object::Endpoint(index), true) = (&description.object, v6only) {
            let index = *index;
            proc.fds.endpoint_mut(index)?.v6only = on;
        }
    }
    Ok(())
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
        Object::UnixDatagram(i) => proc
            .fds
            .unix_datagram(i)?
            .name
            .clone()
            .unwrap_or(UNNAMED_ADDRESS.to_vec()),
        _ => return Err(Errno::ENOTSOCK),
    };
    write_truncated(user, args[1], args[2], &name)
}

/// getpeername(fd, addr, addrlen): ENOTCONN before connect, and once the peer of an Internet
/// socket reset the connection.
pub(crate) fn getpeername(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let name = match proc.fds.get(fd_arg(args[0]))?.object {
        Object::Socket { rx, .. } if proc.fds.was_reset(rx) => return Err(Errno::ENOTCONN),
        Object::Socket { rx, .. } => proc
            .fds
            .socket_names(rx)
            .map_or(UNNAMED_ADDRESS.to_vec(), |(_, peer)| peer.clone()),
        Object::Endpoint(_) => return Err(Errno::ENOTCONN),
        Object::Inet(i) => inet::peer_name(proc, i)?,
        Object::UnixDatagram(i) => {
            let peer = proc.fds.unix_datagram(i)?.peer.ok_or(Errno::ENOTCONN)?;
            proc.fds
                .unix_datagram(peer)?
                .name
                .clone()
                .unwrap_or(UNNAMED_ADDRESS.to_vec())
        }
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
