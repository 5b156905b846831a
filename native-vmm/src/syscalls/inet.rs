//! Internet sockets whose traffic leaves the VM (`Object::Inet`, `crate::net`): TCP streams
//! connected to an address the policy allows, UDP datagrams to such addresses, and UDP to the
//! VM's resolver (`net::RESOLVER`), which the VMM answers itself.
//!
//! A stream socket starts in the VM (addresses.rs: it may bind, listen and connect on the VM's
//! loopback); its connect to any other address comes here: the policy is checked on that very
//! address (EACCES when refused, counted in the run's `network.refused`), the connections open
//! at once are checked (EAGAIN past the limit), and a non-blocking host socket connects. A
//! blocking guest call that would block on the host waits in the scheduler with the host fd
//! named (`wait_ready_on`), so the run loop watches it while every thread waits. Bytes moved
//! count against the run's cap: a transfer past it ends the run `network_limit`.
//!
//! A datagram socket is made here at socket(2); its host socket is opened at its first send to
//! an allowed address, each of which is checked (a send to a refused one is EACCES). Datagrams
//! to the VM's own loopback stay in the VM (loopback.rs).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ancillary::{self, Outgoing};
use super::control::{messages, read_control, read_msghdr, Reply};
use super::loopback;
use super::{
    check_iovecs, fd_arg, iovec_total, nonblocking_call, scatter, value, wait_ready_on,
    write_source_name, SysResult, SyscallOutcome, UserMemory, MSG_PEEK,
};
use crate::errno::Errno;
use crate::net::loopback::IpHeader;
use crate::net::{canonical, dns, host, Connection, HostSocket, InetSocket, Lookup, RESOLVER};
use crate::process::{GuestProcess, Object, O_NONBLOCK};
use crate::status::RunStatus;

pub(super) const AF_INET: u16 = 2;
pub(super) const AF_INET6: u16 = 10;
const AF_UNSPEC: u16 = 0;
pub(crate) const EINPROGRESS: Errno = Errno(115);
const EALREADY: Errno = Errno(114);
const EDESTADDRREQ: Errno = Errno(89);
const ENOPROTOOPT: Errno = Errno(92);
/// Bytes one transfer call moves at most.
const MAX_TRANSFER: usize = 1 << 20;
/// The largest UDP datagram.
const MAX_DATAGRAM: usize = 65535;
/// How long the resolver waits for the host's DNS server.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

const POLLIN: i16 = 0x001;
const POLLOUT: i16 = 0x004;
const POLLERR: i16 = 0x008;
const POLLHUP: i16 = 0x010;
const POLLRDHUP: i16 = 0x2000;

/// A host call's failure as the guest's errno (the host's numbering is Linux x86-64's too).
fn errno_of(e: &io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(Errno::EIO.0))
}

/// Reads a sockaddr of `family` (AF_INET or AF_INET6) from `raw`; Err(EAFNOSUPPORT) for
/// another family, EINVAL when too short.
pub(super) fn parse_address(raw: &[u8], family: u16) -> Result<SocketAddr, Errno> {
    if raw.len() < 2 {
        return Err(Errno::EINVAL);
    }
    let given = u16::from_le_bytes([raw[0], raw[1]]);
    if given != family {
        return Err(Errno::EAFNOSUPPORT);
    }
    let port = |raw: &[u8]| u16::from_be_bytes([raw[2], raw[3]]);
    match family {
        AF_INET if raw.len() >= 16 => {
            let ip = Ipv4Addr::new(raw[4], raw[5], raw[6], raw[7]);
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, port(raw))))
        }
        AF_INET6 if raw.len() >= 24 => {
            let octets: [u8; 16] = raw[8..24].try_into().map_err(|_| Errno::EINVAL)?;
            let scope = raw
                .get(24..28)
                .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(octets),
                port(raw),
                0,
                scope,
            )))
        }
        _ => Err(Errno::EINVAL),
    }
}

/// `addr` as the sockaddr a socket of `ipv6` reports it (IPv4 as IPv4-mapped on AF_INET6).
pub(super) fn address_bytes(addr: SocketAddr, ipv6: bool) -> Vec<u8> {
    let addr = if ipv6 {
        for_host(addr, true)
    } else {
        canonical(addr)
    };
    let mut out = Vec::with_capacity(28);
    match addr {
        SocketAddr::V4(a) => {
            out.extend_from_slice(&AF_INET.to_le_bytes());
            out.extend_from_slice(&a.port().to_be_bytes());
            out.extend_from_slice(&a.ip().octets());
            out.resize(16, 0);
        }
        SocketAddr::V6(a) => {
            out.extend_from_slice(&AF_INET6.to_le_bytes());
            out.extend_from_slice(&a.port().to_be_bytes());
            out.extend_from_slice(&a.flowinfo().to_be_bytes());
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.scope_id().to_le_bytes());
        }
    }
    out
}

/// `addr` in the address family of a socket of `ipv6` (IPv4 mapped on an AF_INET6 one).
fn for_host(addr: SocketAddr, ipv6: bool) -> SocketAddr {
    match (addr, ipv6) {
        (SocketAddr::V4(a), true) => {
            SocketAddr::V6(SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0))
        }
        _ => addr,
    }
}

/// socket(AF_INET/AF_INET6, SOCK_DGRAM): a datagram socket, no host socket yet.
pub(super) fn open_datagram(
    proc: &mut GuestProcess,
    family: u16,
    lite: bool,
    nonblocking: bool,
    cloexec: bool,
) -> SysResult {
    let mut socket = InetSocket::new(family == AF_INET6, false);
    socket.lite = lite;
    let flags = if nonblocking { O_NONBLOCK } else { 0 };
    let description = proc.fds.new_inet(socket, flags);
    value(proc.fds.install(description, 0, cloexec)?)
}

/// The Internet socket at `fd`: its index and whether calls on it do not wait.
fn inet_at(proc: &GuestProcess, fd: u64) -> Result<(usize, bool), Errno> {
    let desc = proc.fds.get(fd)?;
    match desc.object {
        Object::Inet(i) => Ok((i, desc.nonblocking())),
        _ => Err(Errno::ENOTSOCK),
    }
}

/// The index of the Internet socket at `fd`, if it is one.
pub(super) fn index_of(proc: &GuestProcess, fd: u64) -> Option<usize> {
    match proc.fds.get(fd).ok()?.object {
        Object::Inet(i) => Some(i),
        _ => None,
    }
}

/// Whether datagram socket `index` may reach `dest` outside the VM: UDP-Lite never
/// (ENETUNREACH: the host carries only UDP), UDP when the policy allows it.
fn outside(proc: &mut GuestProcess, index: usize, dest: SocketAddr) -> Result<(), Errno> {
    if proc.fds.inet(index)?.lite {
        return Err(Errno::ENETUNREACH);
    }
    allowed(proc, dest)
}

/// Whether the policy allows `dest` (a refusal is counted): EACCES when it does not.
fn allowed(proc: &mut GuestProcess, dest: SocketAddr) -> Result<(), Errno> {
    if proc.net.check(&canonical(dest)) {
        Ok(())
    } else {
        Err(Errno::EACCES)
    }
}

/// connect of the unconnected stream socket at `fd` (of `family`) to `dest`, outside the VM.
pub(super) fn connect_out(
    proc: &mut GuestProcess,
    fd: u64,
    family: u16,
    dest: SocketAddr,
) -> SysResult {
    let nonblocking = proc.fds.get(fd)?.nonblocking();
    allowed(proc, dest)?;
    if proc.fds.host_connections() >= proc.net.limits().connections as usize {
        return Err(Errno::EAGAIN);
    }
    let ipv6 = family == AF_INET6;
    let host = HostSocket::open(ipv6, true).map_err(|e| errno_of(&e))?;
    let connection = match host.connect(&for_host(dest, ipv6)) {
        Ok(()) => Connection::Connected,
        Err(e) if e.raw_os_error() == Some(EINPROGRESS.0) => Connection::Connecting {
            waiting: !nonblocking,
        },
        Err(e) => return Err(errno_of(&e)),
    };
    let fd_host = host.raw();
    let mut socket = InetSocket::new(ipv6, true);
    socket.host = Some(Arc::new(host));
    socket.connection = connection;
    socket.peer = Some(dest);
    proc.fds.carry_out(fd, socket)?;
    proc.net.usage.connections += 1;
    match connection {
        Connection::Connected => value(0),
        _ if nonblocking => Err(EINPROGRESS),
        _ => wait_ready_on(proc, None, vec![(fd_host, POLLOUT)]),
    }
}

/// A connect in progress on socket `index`: Some(Ok) once it connected, Some(Err) once it
/// failed (the socket is then unconnected), None while it goes on.
fn finish_connect(proc: &mut GuestProcess, index: usize) -> Result<Option<()>, Errno> {
    let socket = proc.fds.inet_mut(index)?;
    let Some(host) = socket.host.clone() else {
        return Err(Errno::ENOTCONN);
    };
    if host::ready_now(host.raw(), POLLOUT) == 0 {
        return Ok(None);
    }
    match host.take_error().map_err(|e| errno_of(&e))? {
        0 => {
            socket.connection = Connection::Connected;
            Ok(Some(()))
        }
        error => {
            socket.connection = Connection::None;
            socket.host = None;
            Err(Errno(error))
        }
    }
}

/// connect(fd, addr, addrlen) on an Internet socket made here (a stream socket connecting or
/// connected, a datagram socket).
pub(super) fn connect(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (index, nonblocking) = inet_at(proc, fd_arg(args[0]))?;
    let socket = proc.fds.inet(index)?;
    if socket.stream {
        return match socket.connection {
            Connection::Connected => Err(Errno::EISCONN),
            Connection::None => Err(Errno(103)), // ECONNABORTED: its connect failed
            Connection::Connecting { waiting } => match finish_connect(proc, index)? {
                Some(()) => value(0),
                None if nonblocking && !waiting => Err(EALREADY),
                None => {
                    // A blocking connect waits from now on, and so does one retried after it.
                    proc.fds.inet_mut(index)?.connection = Connection::Connecting { waiting: true };
                    let fd = host_fd(proc, index)?;
                    wait_ready_on(proc, None, vec![(fd, POLLOUT)])
                }
            },
        };
    }
    let len = (args[2] as u32 as usize).min(128);
    let raw = user.read_vec(args[1], len as u64)?;
    if raw.len() >= 2 && u16::from_le_bytes([raw[0], raw[1]]) == AF_UNSPEC {
        proc.fds.inet_mut(index)?.peer = None;
        return value(0);
    }
    let family = if socket.ipv6 { AF_INET6 } else { AF_INET };
    let dest = parse_address(&raw, family)?;
    if canonical(dest) != RESOLVER {
        if loopback::is_loopback(dest) {
            loopback::connect(proc, index, dest)?;
            return value(0);
        }
        outside(proc, index, dest)?;
    }
    proc.fds.inet_mut(index)?.peer = Some(dest);
    value(0)
}

fn host_fd(proc: &GuestProcess, index: usize) -> Result<i32, Errno> {
    proc.fds
        .inet(index)?
        .host
        .as_ref()
        .map(|h| h.raw())
        .ok_or(Errno::ENOTCONN)
}

/// bind(fd, addr, addrlen) of a datagram socket: a UDP port on the VM's loopback (loopback.rs;
/// a host socket it opens later picks its own); only the wildcard and loopback addresses, as
/// a guest has no others.
pub(super) fn bind(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (index, _) = inet_at(proc, fd_arg(args[0]))?;
    let socket = proc.fds.inet(index)?;
    if socket.bound.is_some() || socket.host.is_some() {
        return Err(Errno::EINVAL);
    }
    let family = if socket.ipv6 { AF_INET6 } else { AF_INET };
    let len = (args[2] as u32 as usize).min(128);
    let addr = parse_address(&user.read_vec(args[1], len as u64)?, family)?;
    let ip = canonical(addr).ip();
    if !(ip.is_unspecified() || ip.is_loopback()) {
        return Err(Errno::EADDRNOTAVAIL);
    }
    loopback::bind(proc, index, addr)?;
    value(0)
}

/// What a receive got: the bytes, the message's whole length (a datagram may be longer than
/// the buffer: MSG_TRUNC), where it came from, and a datagram of the VM's loopback its IP
/// header's fields.
pub(super) struct Received {
    pub data: Vec<u8>,
    pub full: usize,
    pub from: Option<SocketAddr>,
    pub ipv6: bool,
    pub header: Option<IpHeader>,
}

/// A receive's end: bytes, or what the thread does instead (waits, or the run ends).
pub(super) enum Receive {
    Got(Received),
    Outcome(SyscallOutcome),
}

fn wait_or_again(
    proc: &GuestProcess,
    nonblocking: bool,
    host: Vec<(i32, i16)>,
) -> Result<SyscallOutcome, Errno> {
    if nonblocking {
        Err(Errno::EAGAIN)
    } else {
        wait_ready_on(proc, None, host)
    }
}

fn network_limit(proc: &GuestProcess) -> SyscallOutcome {
    SyscallOutcome::Stop(RunStatus::NetworkLimit {
        limit_bytes: proc.net.limits().bytes,
    })
}

/// Receives up to `max` bytes from socket `index` (`peek`: leaving them queued). The caller
/// checked that guest memory can take them.
pub(super) fn receive(
    proc: &mut GuestProcess,
    index: usize,
    max: u64,
    peek: bool,
    nonblocking: bool,
) -> Result<Receive, Errno> {
    let max = (max as usize).min(MAX_TRANSFER);
    let socket = proc.fds.inet(index)?;
    let ipv6 = socket.ipv6;
    if !socket.stream {
        return receive_datagram(proc, index, max, peek, nonblocking);
    }
    let got = |data: Vec<u8>| {
        let full = data.len();
        Ok(Receive::Got(Received {
            data,
            full,
            from: None,
            ipv6,
            header: None,
        }))
    };
    if socket.shut_read {
        return got(Vec::new());
    }
    if let Connection::Connecting { .. } = socket.connection {
        if finish_connect(proc, index)?.is_none() {
            let fd = host_fd(proc, index)?;
            return wait_or_again(proc, nonblocking, vec![(fd, POLLOUT)]).map(Receive::Outcome);
        }
    }
    let host = proc.fds.inet(index)?.host.clone().ok_or(Errno::ENOTCONN)?;
    let left = proc.net.bytes_left().min(MAX_TRANSFER as u64) as usize;
    // With nothing left of the cap, one byte is peeked: end of file reads as such, data
    // waiting ends the run.
    let over = left == 0 && max > 0;
    let mut data = vec![0u8; if over { 1 } else { max.min(left) }];
    match host.recv(&mut data, peek || over) {
        Ok((n, _)) if over && n > 0 => Ok(Receive::Outcome(network_limit(proc))),
        Ok((n, _)) => {
            data.truncate(n);
            if !peek {
                proc.net.usage.bytes_in += n as u64;
            }
            got(data)
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            wait_or_again(proc, nonblocking, vec![(host.raw(), POLLIN | POLLRDHUP)])
                .map(Receive::Outcome)
        }
        Err(e) => Err(errno_of(&e)),
    }
}

/// Reads what the host's DNS server answered socket `index`'s lookups (and answers SERVFAIL
/// for those it did not answer in time) into its queue of answers.
fn collect_answers(proc: &mut GuestProcess, index: usize) -> Result<(), Errno> {
    let now = Instant::now();
    let lookups = std::mem::take(&mut proc.fds.inet_mut(index)?.lookups);
    let mut pending = Vec::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    for lookup in lookups {
        let mut reply = None;
        while let Ok((n, _)) = lookup.upstream.recv(&mut buf, false) {
            let qtype = lookup.question.qtype;
            if let Some(answer) =
                dns::read_upstream(&buf[..n.min(buf.len())], lookup.id, &lookup.name, qtype)
            {
                reply = Some(answer);
                break;
            }
        }
        let message = match reply {
            Some(answer) => {
                if answer.rcode == dns::NOERROR {
                    proc.net.remember(&lookup.name, &answer.addresses);
                }
                dns::answer(
                    &lookup.question,
                    answer.rcode,
                    &answer.addresses,
                    answer.ttl,
                )
            }
            None if now >= lookup.deadline => dns::answer(&lookup.question, dns::SERVFAIL, &[], 0),
            None => {
                pending.push(lookup);
                continue;
            }
        };
        queue_answer(proc, index, message)?;
    }
    proc.fds.inet_mut(index)?.lookups = pending;
    Ok(())
}

fn queue_answer(proc: &mut GuestProcess, index: usize, message: Vec<u8>) -> Result<(), Errno> {
    let answers = &mut proc.fds.inet_mut(index)?.answers;
    if answers.len() >= crate::net::MAX_ANSWERS_QUEUED {
        answers.pop_front();
    }
    answers.push_back(message);
    Ok(())
}

fn receive_datagram(
    proc: &mut GuestProcess,
    index: usize,
    max: usize,
    peek: bool,
    nonblocking: bool,
) -> Result<Receive, Errno> {
    loopback::take_refused(proc, index)?;
    collect_answers(proc, index)?;
    let socket = proc.fds.inet_mut(index)?;
    let ipv6 = socket.ipv6;
    let answer = if peek {
        socket.answers.front().cloned()
    } else {
        socket.answers.pop_front()
    };
    let message = answer.map(|a| (a, RESOLVER, None)).or_else(|| {
        let datagram = if peek {
            socket.inbox.front().cloned()
        } else {
            socket.inbox.pop()
        };
        datagram.map(|d| (d.data, d.envelope.source, Some(d.envelope)))
    });
    if let Some((mut message, from, header)) = message {
        let full = message.len();
        message.truncate(max);
        return Ok(Receive::Got(Received {
            data: message,
            full,
            from: Some(from),
            ipv6,
            header,
        }));
    }
    let mut interest: Vec<(i32, i16)> = socket
        .lookups
        .iter()
        .map(|l| (l.upstream.raw(), POLLIN))
        .collect();
    if let Some(host) = socket.host.clone() {
        let mut data = vec![0u8; MAX_DATAGRAM];
        // Datagrams from where the policy does not allow sending are dropped unread.
        let mut peeked = host.recv(&mut data, true);
        while let Ok((_, Some(from))) = &peeked {
            if proc.net.allows(&canonical(*from)) {
                break;
            }
            host.recv(&mut data, false).map_err(|e| errno_of(&e))?;
            peeked = host.recv(&mut data, true);
        }
        match peeked {
            Ok((full, from)) => {
                if full.min(max) as u64 > proc.net.bytes_left() {
                    return Ok(Receive::Outcome(network_limit(proc)));
                }
                if !peek {
                    host.recv(&mut data, false).map_err(|e| errno_of(&e))?;
                }
                data.truncate(full.min(max));
                if !peek {
                    proc.net.usage.bytes_in += data.len() as u64;
                }
                return Ok(Receive::Got(Received {
                    data,
                    full,
                    from,
                    ipv6,
                    header: None,
                }));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => interest.push((host.raw(), POLLIN)),
            Err(e) => return Err(errno_of(&e)),
        }
    }
    wait_or_again(proc, nonblocking, interest).map(Receive::Outcome)
}

/// Sends `data` on socket `index` (to `dest`, or its peer) with what a sendmsg's control
/// messages set for a datagram (`outgoing`); the count sent, or what the thread does instead.
pub(super) fn send(
    proc: &mut GuestProcess,
    index: usize,
    data: &[u8],
    dest: Option<SocketAddr>,
    nonblocking: bool,
    outgoing: &Outgoing,
) -> SysResult {
    let socket = proc.fds.inet(index)?;
    if socket.shut_write {
        return Err(Errno::EPIPE);
    }
    if !socket.stream {
        return send_datagram(proc, index, data, dest, outgoing);
    }
    // A TCP socket ignores a destination, as Linux's does.
    match socket.connection {
        Connection::None => return Err(Errno::ENOTCONN),
        Connection::Connecting { .. } => {
            if finish_connect(proc, index)?.is_none() {
                let fd = host_fd(proc, index)?;
                return wait_or_again(proc, nonblocking, vec![(fd, POLLOUT)]);
            }
        }
        Connection::Connected => {}
    }
    let host = proc.fds.inet(index)?.host.clone().ok_or(Errno::ENOTCONN)?;
    let left = proc.net.bytes_left() as usize;
    if left == 0 && !data.is_empty() {
        return Ok(network_limit(proc));
    }
    match host.send(&data[..data.len().min(left)], None) {
        Ok(n) => {
            proc.net.usage.bytes_out += n as u64;
            value(n as u64)
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            wait_or_again(proc, nonblocking, vec![(host.raw(), POLLOUT)])
        }
        Err(e) => Err(errno_of(&e)),
    }
}

fn send_datagram(
    proc: &mut GuestProcess,
    index: usize,
    data: &[u8],
    dest: Option<SocketAddr>,
    outgoing: &Outgoing,
) -> SysResult {
    let socket = proc.fds.inet(index)?;
    let ipv6 = socket.ipv6;
    let connected = dest.is_none();
    let dest = dest.or(socket.peer).ok_or(EDESTADDRREQ)?;
    if data.len() > MAX_DATAGRAM {
        return Err(Errno(90)); // EMSGSIZE
    }
    if canonical(dest) == RESOLVER {
        ask_resolver(proc, index, data)?;
        return value(data.len() as u64);
    }
    if loopback::is_loopback(dest) {
        if socket.peer.is_some() {
            loopback::take_refused(proc, index)?;
        }
        return value(loopback::send(proc, index, data, dest, connected, outgoing)? as u64);
    }
    outside(proc, index, dest)?;
    if data.len() as u64 > proc.net.bytes_left() {
        return Ok(network_limit(proc));
    }
    let host = match proc.fds.inet(index)?.host.clone() {
        Some(host) => host,
        None => {
            let host = Arc::new(HostSocket::open(ipv6, false).map_err(|e| errno_of(&e))?);
            proc.fds.inet_mut(index)?.host = Some(host.clone());
            host
        }
    };
    let n = host
        .send(data, Some(&for_host(dest, ipv6)))
        .map_err(|e| errno_of(&e))?;
    proc.net.usage.bytes_out += n as u64;
    value(n as u64)
}

/// A DNS packet the guest sent to the VM's resolver (see `crate::net`): answered at once when
/// it is refused or malformed, else asked of the host's DNS server.
fn ask_resolver(proc: &mut GuestProcess, index: usize, packet: &[u8]) -> Result<(), Errno> {
    proc.net.usage.dns_queries += 1;
    let question = match dns::read_question(packet) {
        Ok(q) => q,
        Err(dns::BadQuery::Drop) => return Ok(()),
        Err(dns::BadQuery::Answer { id, rcode }) => {
            return queue_answer(proc, index, dns::bare_answer(id, rcode))
        }
    };
    let name = match &question.name {
        Some(name) if proc.net.allows_name(name) => name.clone(),
        _ => {
            proc.net.usage.refused += 1;
            return queue_answer(proc, index, dns::answer(&question, dns::NXDOMAIN, &[], 0));
        }
    };
    let asks_address =
        question.qclass == 1 && matches!(question.qtype, dns::TYPE_A | dns::TYPE_AAAA);
    let upstream = crate::net::host_config().upstream;
    let full = proc.fds.inet(index)?.lookups.len() >= crate::net::MAX_LOOKUPS;
    let (Some(upstream), true, false) = (upstream, asks_address, full) else {
        let rcode = if asks_address {
            dns::SERVFAIL
        } else {
            dns::NOERROR
        };
        return queue_answer(proc, index, dns::answer(&question, rcode, &[], 0));
    };
    let mut id = [0u8; 2];
    crate::sys::fill_random(&mut id).map_err(|e| errno_of(&e))?;
    let id = u16::from_ne_bytes(id);
    let asked = HostSocket::open(upstream.is_ipv6(), false)
        .and_then(|s| s.connect(&upstream).map(|()| s))
        .and_then(|s| {
            s.send(&dns::upstream_query(id, &name, question.qtype), None)
                .map(|_| s)
        });
    match asked {
        Ok(upstream) => {
            proc.fds.inet_mut(index)?.lookups.push(Lookup {
                upstream: Arc::new(upstream),
                id,
                question,
                name,
                deadline: Instant::now() + LOOKUP_TIMEOUT,
            });
            Ok(())
        }
        Err(_) => queue_answer(proc, index, dns::answer(&question, dns::SERVFAIL, &[], 0)),
    }
}

/// shutdown(fd, how) of an Internet socket.
pub(super) fn shutdown(proc: &mut GuestProcess, index: usize, how: u64) -> SysResult {
    let socket = proc.fds.inet_mut(index)?;
    if socket.stream && socket.connection != Connection::Connected {
        return Err(Errno::ENOTCONN);
    }
    let (read, write) = (how != 1, how != 0);
    socket.shut_read |= read;
    socket.shut_write |= write;
    if let Some(host) = socket.host.clone() {
        // A datagram socket's host socket may be unconnected: nothing to tell the peer.
        if let Err(e) = host.shutdown(how as i32) {
            if socket.stream {
                return Err(errno_of(&e));
            }
        }
    }
    value(0)
}

/// The poll bits of Internet socket `index` now (Linux's values, as poll.rs reports them).
pub(super) fn ready_bits(proc: &GuestProcess, index: usize) -> u16 {
    let Ok(socket) = proc.fds.inet(index) else {
        return 0x020; // POLLNVAL
    };
    let (readable, writable) = (0x041u16, 0x104u16);
    if !socket.stream {
        let mut bits = writable;
        if socket.refused {
            bits |= POLLERR as u16;
        }
        let answered = !socket.answers.is_empty()
            || !socket.inbox.is_empty()
            || socket.lookups.iter().any(|l| {
                Instant::now() >= l.deadline || host::ready_now(l.upstream.raw(), POLLIN) != 0
            })
            || socket
                .host
                .as_ref()
                .is_some_and(|h| host::ready_now(h.raw(), POLLIN) != 0);
        if answered {
            bits |= readable;
        }
        return bits;
    }
    let Some(host) = &socket.host else {
        return writable | POLLHUP as u16 | POLLERR as u16;
    };
    let events = host::ready_now(host.raw(), POLLIN | POLLOUT | POLLRDHUP).cast_unsigned();
    let mut bits = 0;
    if events & (POLLIN | POLLRDHUP | POLLHUP | POLLERR).cast_unsigned() != 0 || socket.shut_read {
        bits |= readable;
    }
    if events & (POLLOUT | POLLHUP | POLLERR).cast_unsigned() != 0 {
        bits |= writable;
    }
    bits | (events & (POLLRDHUP | POLLHUP | POLLERR).cast_unsigned())
}

/// The host fds (and events) a wait on `fd` for `events` (poll's bits) watches.
pub(super) fn host_interest(proc: &GuestProcess, fd: u64, events: u16) -> Vec<(i32, i16)> {
    let Some(socket) = index_of(proc, fd).and_then(|i| proc.fds.inet(i).ok()) else {
        return Vec::new();
    };
    let mut interest: Vec<(i32, i16)> = socket
        .lookups
        .iter()
        .map(|l| (l.upstream.raw(), POLLIN))
        .collect();
    if let Some(host) = &socket.host {
        let events = (events & (POLLIN | POLLOUT | POLLRDHUP).cast_unsigned()).cast_signed();
        interest.push((host.raw(), events));
    }
    interest
}

/// getsockname of Internet socket `index`: its host socket's local address once it has one.
pub(super) fn local_name(proc: &GuestProcess, index: usize) -> Result<Vec<u8>, Errno> {
    let socket = proc.fds.inet(index)?;
    let addr = match (&socket.host, socket.bound) {
        (Some(host), _) => host.local_addr().map_err(|e| errno_of(&e))?,
        (None, Some(bound)) => bound,
        (None, None) if socket.ipv6 => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
        (None, None) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
    };
    Ok(address_bytes(addr, socket.ipv6))
}

/// getpeername of Internet socket `index`: ENOTCONN until connected.
pub(super) fn peer_name(proc: &GuestProcess, index: usize) -> Result<Vec<u8>, Errno> {
    let socket = proc.fds.inet(index)?;
    match (socket.connection, socket.peer) {
        (Connection::Connected, Some(peer)) => Ok(address_bytes(peer, socket.ipv6)),
        (Connection::None, Some(peer)) if !socket.stream => Ok(address_bytes(peer, socket.ipv6)),
        _ => Err(Errno::ENOTCONN),
    }
}

const SOL_SOCKET: i32 = 1;
const IPPROTO_IP: i32 = 0;
const IPPROTO_TCP: i32 = 6;
const IPPROTO_IPV6: i32 = 41;

/// Options accepted and not carried to the host (they read back as 0, or as set where
/// sockets.rs keeps them): extended error reports (glibc's resolver asks for them; the VMM
/// reports errors as errnos) and SO_BROADCAST (the egress policy decides what a send reaches).
const IGNORED_OPTIONS: &[(i32, i32)] = &[
    (IPPROTO_IP, 11),   // IP_RECVERR
    (IPPROTO_IPV6, 25), // IPV6_RECVERR
    (SOL_SOCKET, 6),    // SO_BROADCAST
];

/// FIONREAD of Internet socket `index`: the next datagram's length, or the bytes a stream
/// has waiting (counted up to 64 KiB).
pub(super) fn available(proc: &mut GuestProcess, index: usize) -> Result<usize, Errno> {
    let socket = proc.fds.inet(index)?;
    if !socket.stream {
        collect_answers(proc, index)?;
    }
    let socket = proc.fds.inet(index)?;
    if let Some(answer) = socket.answers.front() {
        return Ok(answer.len());
    }
    if let Some(datagram) = socket.inbox.front() {
        return Ok(datagram.data.len());
    }
    let Some(host) = socket.host.clone() else {
        return Ok(0);
    };
    let mut buf = vec![0u8; MAX_DATAGRAM];
    match host.recv(&mut buf, true) {
        Ok((n, _)) => Ok(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(errno_of(&e)),
    }
}

/// Int options carried to the host socket: (level, name).
const HOST_OPTIONS: &[(i32, i32)] = &[
    (SOL_SOCKET, 2),    // SO_REUSEADDR
    (SOL_SOCKET, 7),    // SO_SNDBUF
    (SOL_SOCKET, 8),    // SO_RCVBUF
    (SOL_SOCKET, 9),    // SO_KEEPALIVE
    (SOL_SOCKET, 10),   // SO_OOBINLINE
    (SOL_SOCKET, 15),   // SO_REUSEPORT
    (IPPROTO_TCP, 1),   // TCP_NODELAY
    (IPPROTO_TCP, 4),   // TCP_KEEPIDLE
    (IPPROTO_TCP, 5),   // TCP_KEEPINTVL
    (IPPROTO_TCP, 6),   // TCP_KEEPCNT
    (IPPROTO_IPV6, 26), // IPV6_V6ONLY
];

/// getsockopt of Internet socket `index`: the socket's kind, its pending error (a connect
/// that failed), a datagram socket's IP-level options (ancillary.rs), and the int options of
/// `HOST_OPTIONS`, read from the host socket.
pub(super) fn option(
    proc: &mut GuestProcess,
    index: usize,
    level: i32,
    name: i32,
) -> Result<u32, Errno> {
    let socket = proc.fds.inet(index)?;
    let (stream, ipv6) = (socket.stream, socket.ipv6);
    if !stream && ancillary::is_option(level, name) {
        return ancillary::get(&socket.ip, ipv6, level, name);
    }
    Ok(match (level, name) {
        (SOL_SOCKET, 3) => {
            if stream {
                1
            } else {
                2
            }
        } // SO_TYPE
        (SOL_SOCKET, 39) => u32::from(if ipv6 { AF_INET6 } else { AF_INET }), // SO_DOMAIN
        (SOL_SOCKET, 38) => {
            if stream {
                6
            } else if socket.lite {
                136
            } else {
                17
            }
        } // SO_PROTOCOL
        (SOL_SOCKET, 30) => 0,                                                // SO_ACCEPTCONN
        (SOL_SOCKET, 4) if socket.refused => {
            proc.fds.inet_mut(index)?.refused = false;
            Errno::ECONNREFUSED.0 as u32
        }
        (SOL_SOCKET, 4) => match socket.connection {
            Connection::Connecting { .. } => match finish_connect(proc, index) {
                Err(e) => e.0 as u32,
                Ok(_) => 0,
            },
            _ => match &socket.host {
                Some(host) => host.take_error().map_err(|e| errno_of(&e))? as u32,
                None => 0,
            },
        },
        _ if IGNORED_OPTIONS.contains(&(level, name)) => 0,
        _ if HOST_OPTIONS.contains(&(level, name)) => match &socket.host {
            Some(host) => host.int_option(level, name).map_err(|e| errno_of(&e))? as u32,
            None => 0,
        },
        _ => return Err(ENOPROTOOPT),
    })
}

/// setsockopt of Internet socket `index` to the value in `raw` (optval's first bytes, at
/// most 4): a datagram socket's IP-level options (ancillary.rs), and the int options of
/// `HOST_OPTIONS`, set on the host socket (accepted and not kept before there is one).
pub(super) fn set_option(
    proc: &mut GuestProcess,
    index: usize,
    level: i32,
    name: i32,
    raw: &[u8],
) -> Result<(), Errno> {
    let socket = proc.fds.inet_mut(index)?;
    if !socket.stream && ancillary::is_option(level, name) {
        return ancillary::set(&mut socket.ip, socket.ipv6, level, name, raw);
    }
    let [a, b, c, d] = *raw else {
        return Err(Errno::EINVAL);
    };
    let value = i32::from_le_bytes([a, b, c, d]);
    if IGNORED_OPTIONS.contains(&(level, name)) {
        return Ok(());
    }
    if !HOST_OPTIONS.contains(&(level, name)) {
        return Err(ENOPROTOOPT);
    }
    match &proc.fds.inet(index)?.host {
        Some(host) => host
            .set_int_option(level, name, value)
            .map_err(|e| errno_of(&e)),
        None => Ok(()),
    }
}

// ---- the socket calls on an Internet socket (sockets.rs hands them over) ----

const MSG_TRUNC: u64 = 0x20;

/// The destination a sendto/sendmsg names (None: none given).
fn destination(
    proc: &GuestProcess,
    user: &UserMemory,
    index: usize,
    addr: u64,
    len: u64,
) -> Result<Option<SocketAddr>, Errno> {
    if addr == 0 || len as u32 == 0 {
        return Ok(None);
    }
    let family = if proc.fds.inet(index)?.ipv6 {
        AF_INET6
    } else {
        AF_INET
    };
    let raw = user.read_vec(addr, u64::from(len as u32).min(128))?;
    parse_address(&raw, family).map(Some)
}

/// sendto(fd, buf, len, flags, dest_addr, addrlen)
pub(super) fn sendto(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [fd, buf, len, flags, dest, dest_len] = args;
    let (index, nonblocking) = inet_at(proc, fd_arg(fd))?;
    let nonblocking = nonblocking_call(flags, nonblocking)?;
    let dest = destination(proc, user, index, dest, dest_len)?;
    let data = user.read_vec(buf, len.min(MAX_TRANSFER as u64))?;
    send(proc, index, &data, dest, nonblocking, &Outgoing::default())
}

/// Writes a received message's source to a sockaddr buffer and its length (if asked for).
fn write_source(
    user: &UserMemory,
    (addr, len_addr): (u64, u64),
    received: &Received,
) -> Result<(), Errno> {
    let name = received.from.map(|from| address_bytes(from, received.ipv6));
    write_source_name(user, (addr, len_addr), name.as_deref())
}

/// One receive from socket `index` written over `iovecs` in order (checked first: guest
/// memory must take what arrives).
fn receive_into(
    proc: &mut GuestProcess,
    user: &UserMemory,
    index: usize,
    iovecs: &[(u64, u64)],
    peek: bool,
    nonblocking: bool,
) -> Result<Receive, Errno> {
    check_iovecs(user, iovecs, MAX_TRANSFER as u64)?;
    let received = receive(proc, index, iovec_total(iovecs), peek, nonblocking)?;
    if let Receive::Got(received) = &received {
        scatter(user, iovecs, &received.data)?;
    }
    Ok(received)
}

/// read(2) and readv(2) of an Internet socket: a receive with no flags into `iovecs`.
pub(super) fn read(
    proc: &mut GuestProcess,
    user: &UserMemory,
    index: usize,
    iovecs: &[(u64, u64)],
    nonblocking: bool,
) -> SysResult {
    match receive_into(proc, user, index, iovecs, false, nonblocking)? {
        Receive::Outcome(outcome) => Ok(outcome),
        Receive::Got(received) => value(received.data.len() as u64),
    }
}

/// recvfrom(fd, buf, len, flags, src_addr, addrlen): MSG_PEEK, MSG_DONTWAIT and MSG_TRUNC (the
/// datagram's whole length) as on Linux; MSG_WAITALL may return less.
pub(super) fn recvfrom(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [fd, buf, len, flags, src, src_len] = args;
    let (index, nonblocking) = inet_at(proc, fd_arg(fd))?;
    let nonblocking = nonblocking_call(flags, nonblocking)?;
    user.check(buf, len.min(MAX_TRANSFER as u64))?;
    match receive(proc, index, len, flags & MSG_PEEK != 0, nonblocking)? {
        Receive::Outcome(outcome) => Ok(outcome),
        Receive::Got(received) => {
            user.write(buf, &received.data)?;
            write_source(user, (src, src_len), &received)?;
            let n = if flags & MSG_TRUNC != 0 {
                received.full
            } else {
                received.data.len()
            };
            value(n as u64)
        }
    }
}

/// The bytes of `iovecs` gathered, at most `MAX_TRANSFER`.
fn gather(user: &UserMemory, iovecs: &[(u64, u64)]) -> Result<Vec<u8>, Errno> {
    let mut data = Vec::new();
    for &(base, len) in iovecs {
        let take = len.min((MAX_TRANSFER - data.len()) as u64);
        data.extend(user.read_vec(base, take)?);
        if data.len() == MAX_TRANSFER {
            break;
        }
    }
    Ok(data)
}

/// write(2) and writev(2) of an Internet socket: a send with no flags of `iovecs`.
pub(super) fn write(
    proc: &mut GuestProcess,
    user: &UserMemory,
    index: usize,
    iovecs: &[(u64, u64)],
    nonblocking: bool,
) -> SysResult {
    let data = gather(user, iovecs)?;
    send(proc, index, &data, None, nonblocking, &Outgoing::default())
}

/// sendmsg(fd, msg, flags): the iovecs as one message (one datagram), with the control
/// messages of ancillary.rs on a datagram socket (on a stream socket: checked, and those of
/// the IP levels ignored, as Linux's TCP does).
pub(super) fn sendmsg(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [fd, msg, flags, ..] = args;
    let (index, nonblocking) = inet_at(proc, fd_arg(fd))?;
    let nonblocking = nonblocking_call(flags, nonblocking)?;
    send_message(proc, user, index, msg, nonblocking)
}

fn send_message(
    proc: &mut GuestProcess,
    user: &UserMemory,
    index: usize,
    msg: u64,
    nonblocking: bool,
) -> SysResult {
    let header = read_msghdr(user, msg)?;
    let (name, namelen) = header.name.unwrap_or((0, 0));
    let dest = destination(proc, user, index, name, u64::from(namelen))?;
    let control = read_control(user, &header)?;
    let messages = messages(&control)?;
    let socket = proc.fds.inet(index)?;
    let outgoing = match dest.or(socket.peer) {
        _ if socket.stream => {
            ancillary::outgoing_stream(&messages)?;
            Outgoing::default()
        }
        Some(to) => ancillary::outgoing(&messages, ancillary::route(socket.ipv6, to))?,
        None => Outgoing::default(),
    };
    let data = gather(user, &header.iovecs)?;
    send(proc, index, &data, dest, nonblocking, &outgoing)
}

/// sendmmsg(fd, msgvec, vlen, flags): each message in turn (glibc's resolver sends its A and
/// AAAA questions so); the count sent, or the first one's error.
pub(super) fn sendmmsg(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [fd, msgvec, vlen, flags, ..] = args;
    let (index, nonblocking) = inet_at(proc, fd_arg(fd))?;
    let nonblocking = nonblocking_call(flags, nonblocking)?;
    // struct mmsghdr: a msghdr (56 bytes) and the count sent (u32), padded to 64.
    const MMSGHDR: u64 = 64;
    let vlen = (vlen as u32).min(1024);
    let mut sent = 0u64;
    for i in 0..u64::from(vlen) {
        let msg = msgvec + i * MMSGHDR;
        let outcome = send_message(proc, user, index, msg, nonblocking || sent > 0);
        match outcome {
            Ok(SyscallOutcome::Return(n)) => {
                user.write_u32(msg + 56, n as u32)?;
                sent += 1;
            }
            other if sent == 0 => return other,
            _ => break,
        }
    }
    value(sent)
}

/// recvmsg(fd, msg, flags): one receive scattered over the iovecs; the source in msg_name,
/// MSG_TRUNC in msg_flags when a datagram was longer; the control messages a datagram
/// socket's options ask for (ancillary.rs) of a datagram of the VM's loopback.
pub(super) fn recvmsg(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [fd, msg, flags, ..] = args;
    let (index, nonblocking) = inet_at(proc, fd_arg(fd))?;
    let nonblocking = nonblocking_call(flags, nonblocking)?;
    let header = read_msghdr(user, msg)?;
    let peek = flags & MSG_PEEK != 0;
    let received = match receive_into(proc, user, index, &header.iovecs, peek, nonblocking)? {
        Receive::Outcome(outcome) => return Ok(outcome),
        Receive::Got(received) => received,
    };
    let name = user.read_u64(msg)?;
    if name != 0 {
        write_source(user, (name, msg + 8), &received)?;
    }
    let mut reply = Reply::new(&header);
    if let Some(ip_header) = &received.header {
        let socket = proc.fds.inet(index)?;
        ancillary::received(&socket.ip, socket.ipv6, ip_header, &mut reply);
    }
    let truncated = if received.full > received.data.len() {
        MSG_TRUNC
    } else {
        0
    };
    reply.write(user, &header, msg, truncated as u32)?;
    let n = if flags & MSG_TRUNC != 0 {
        received.full
    } else {
        received.data.len()
    };
    value(n as u64)
}
