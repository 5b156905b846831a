//! socket(2) stream sockets that live entirely inside the VM: AF_UNIX (path or abstract
//! names), and AF_INET/AF_INET6 on the loopback addresses only. bind puts an address in the
//! VM's own namespace (`FdTable::bind`), listen makes it take connections, connect to a
//! listening address makes an in-memory socketpair (process/fds.rs) whose other end waits for
//! accept. A connection to any other address leaves the VM under the run's network policy
//! (inet.rs); binding one is EADDRNOTAVAIL. A Unix socket bound to a path also gets a socket
//! file there (`Vfs::make_socket`: stat, chmod and unlink see it); connections still find the
//! socket by its name in the namespace. Internet datagram sockets are inet.rs's, AF_UNIX
//! datagram ones unix_datagram.rs's (their addresses are read here too); socket(2) refuses
//! other types (ESOCKTNOSUPPORT).

use super::files::{fd_arg, with_view};
pub(super) use super::write_truncated;
use super::{unix_datagram, value, wait_ready, SysResult, UserMemory};
use crate::errno::Errno;
use crate::fs::FileKind;
use crate::process::{GuestProcess, Object, O_NONBLOCK};

pub(super) const AF_UNIX: u16 = 1;
const AF_UNSPEC: u16 = 0;
pub(super) use super::inet::{AF_INET, AF_INET6};
const SOCK_STREAM: u64 = 1;
const SOCK_DGRAM: u64 = 2;
const SOCK_SEQPACKET: u64 = 5;
const IPPROTO_UDP: u64 = 17;
const IPPROTO_UDPLITE: u64 = 136;
const SOCK_TYPE_MASK: u64 = 0xf;
const SOCK_NONBLOCK: u64 = 0o4000;
const SOCK_CLOEXEC: u64 = 0o2000000;
const IPPROTO_TCP: u64 = 6;
const EPROTONOSUPPORT: Errno = Errno(93);
const ESOCKTNOSUPPORT: Errno = Errno(94);
const EPROTOTYPE: Errno = Errno(91);
/// sun_path's size.
const UNIX_PATH_MAX: usize = 108;
/// listen(2) backlogs are capped at Linux's default somaxconn.
const SOMAXCONN: usize = 4096;

/// socket(domain, type, protocol)
pub(crate) fn socket(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (domain, kind, protocol) = (
        u64::from(args[0] as u32),
        u64::from(args[1] as u32),
        u64::from(args[2] as u32),
    );
    let family = match domain as u16 {
        AF_UNIX | AF_INET | AF_INET6 if domain <= u64::from(u16::MAX) => domain as u16,
        _ => return Err(Errno::EAFNOSUPPORT),
    };
    if kind & !(SOCK_TYPE_MASK | SOCK_NONBLOCK | SOCK_CLOEXEC) != 0 {
        return Err(Errno::EINVAL);
    }
    let (nonblocking, cloexec) = (kind & SOCK_NONBLOCK != 0, kind & SOCK_CLOEXEC != 0);
    if kind & SOCK_TYPE_MASK == SOCK_DGRAM && family == AF_UNIX {
        if protocol != 0 && protocol != u64::from(AF_UNIX) {
            return Err(EPROTONOSUPPORT);
        }
        return unix_datagram::open(proc, nonblocking, cloexec);
    }
    if kind & SOCK_TYPE_MASK == SOCK_DGRAM {
        if protocol != 0 && protocol != IPPROTO_UDP && protocol != IPPROTO_UDPLITE {
            return Err(EPROTONOSUPPORT);
        }
        let lite = protocol == IPPROTO_UDPLITE;
        return super::inet::open_datagram(proc, family, lite, nonblocking, cloexec);
    }
    let seqpacket = family == AF_UNIX && kind & SOCK_TYPE_MASK == SOCK_SEQPACKET;
    if kind & SOCK_TYPE_MASK != SOCK_STREAM && !seqpacket {
        return Err(ESOCKTNOSUPPORT);
    }
    let protocol_ok = protocol == 0 || (family != AF_UNIX && protocol == IPPROTO_TCP);
    if !protocol_ok {
        return Err(EPROTONOSUPPORT);
    }
    let flags = if nonblocking { O_NONBLOCK } else { 0 };
    let description = proc.fds.new_endpoint(family, seqpacket, flags);
    value(proc.fds.install(description, 0, cloexec)?)
}

/// The unconnected socket at `fd`: (endpoint index, family); `if_connected` for a connected
/// one; EOPNOTSUPP for a datagram socket (it never listens).
fn endpoint(proc: &GuestProcess, fd: u64, if_connected: Errno) -> Result<(usize, u16), Errno> {
    match proc.fds.get(fd_arg(fd))?.object {
        Object::Endpoint(i) => Ok((i, proc.fds.endpoint(i)?.family)),
        Object::Socket { .. } | Object::Inet(_) => Err(if_connected),
        Object::UnixDatagram(_) => Err(Errno::EOPNOTSUPP),
        _ => Err(Errno::ENOTSOCK),
    }
}

/// An address a program passed: its namespace key and the sockaddr it reads back.
struct Address {
    key: Vec<u8>,
    name: Vec<u8>,
    /// AF_INET/AF_INET6: the port (0: pick one).
    port: Option<u16>,
}

fn inet_key(family: u16, port: u16) -> Vec<u8> {
    let mut key = family.to_le_bytes().to_vec();
    key.extend_from_slice(&port.to_be_bytes());
    key
}

/// The sockaddr of `family` at its loopback address and `port`.
fn loopback_name(family: u16, port: u16) -> Vec<u8> {
    let mut name = family.to_le_bytes().to_vec();
    name.extend_from_slice(&port.to_be_bytes());
    if family == AF_INET {
        name.extend_from_slice(&[127, 0, 0, 1]);
        name.resize(16, 0);
    } else {
        name.resize(24, 0);
        name[23] = 1; // ::1
        name.resize(28, 0);
    }
    name
}

/// Whether an IPv4 or IPv6 address is this host's: loopback, or the wildcard (which means
/// loopback here, the only interface).
fn is_local(family: u16, addr: &[u8]) -> bool {
    if family == AF_INET {
        addr[0] == 127 || addr == [0, 0, 0, 0]
    } else {
        let v4_mapped =
            addr[..10].iter().all(|&b| b == 0) && addr[10..12] == [0xff, 0xff] && addr[12] == 127;
        addr[..15].iter().all(|&b| b == 0) && addr[15] <= 1 || v4_mapped
    }
}

/// The sockaddr at `addr` (`len` bytes) as a program passed it.
fn read_sockaddr(user: &UserMemory, addr: u64, len: u64) -> Result<Vec<u8>, Errno> {
    let len = len as u32 as usize;
    if len < 2 || len > 2 + UNIX_PATH_MAX.max(26) {
        return Err(Errno::EINVAL);
    }
    user.read_vec(addr, len as u64)
}

/// The address a sockaddr (`read_sockaddr`) names for a socket of `family`. Err(ENETUNREACH)
/// for an address of another host.
fn address_of(proc: &GuestProcess, family: u16, raw: &[u8]) -> Result<Address, Errno> {
    let [a, b, ..] = *raw else {
        return Err(Errno::EINVAL);
    };
    if u16::from_le_bytes([a, b]) != family {
        return Err(Errno::EAFNOSUPPORT);
    }
    match family {
        AF_UNIX => {
            let path = &raw[2..];
            if path.is_empty() {
                return Err(Errno::EINVAL);
            }
            // An abstract name (leading NUL) is all its bytes; a path ends at its NUL and is
            // keyed by its directory's resolved path and its last name, so "./s", "a/../s" and
            // "/work/s" are one address (and a missing directory is ENOENT, as on Linux).
            let key = if path[0] == 0 {
                path.to_vec()
            } else {
                let path = &path[..path.iter().position(|&b| b == 0).unwrap_or(path.len())];
                let (dir, name): (&[u8], &[u8]) = match path.iter().rposition(|&b| b == b'/') {
                    Some(0) => (b"/", &path[1..]),
                    Some(i) => (&path[..i], &path[i + 1..]),
                    None => (b".", path),
                };
                if name.is_empty() {
                    return Err(Errno::ENOENT);
                }
                let dir = proc.config.vfs.resolve(proc.cwd, dir, true)?;
                [proc.config.vfs.path_of(dir)?, b"/".to_vec(), name.to_vec()].concat()
            };
            // A path's name reads back up to its NUL, which Linux adds; an abstract one whole.
            let name = match unix_path(AF_UNIX, raw) {
                Some(path) => [&raw[..2], path, &[0]].concat(),
                None => raw.to_vec(),
            };
            Ok(Address {
                key: [b"u".as_slice(), &key].concat(),
                name,
                port: None,
            })
        }
        _ => {
            let (port, host) = match family {
                AF_INET if raw.len() >= 16 => (u16::from_be_bytes([raw[2], raw[3]]), &raw[4..8]),
                AF_INET6 if raw.len() >= 24 => (u16::from_be_bytes([raw[2], raw[3]]), &raw[8..24]),
                _ => return Err(Errno::EINVAL),
            };
            if !is_local(family, host) {
                return Err(Errno::ENETUNREACH);
            }
            // The name keeps the address given (0.0.0.0 reads back as bound); the port space is
            // one per family.
            let mut name = loopback_name(family, port);
            let at = if family == AF_INET { 4 } else { 8 };
            name[at..at + host.len()].copy_from_slice(host);
            Ok(Address {
                key: inet_key(family, port),
                name,
                port: Some(port),
            })
        }
    }
}

/// The AF_UNIX address a sockaddr names: (namespace key, name as it reads back).
fn unix_address(proc: &GuestProcess, raw: &[u8]) -> Result<(Vec<u8>, Vec<u8>), Errno> {
    let address = address_of(proc, AF_UNIX, raw)?;
    Ok((address.key, address.name))
}

/// The address bind takes for the sockaddr `raw`: for a Unix one of the family alone an
/// abstract name of five hex digits nobody holds (unix(7)'s autobind), else `raw` itself.
fn autobind(proc: &GuestProcess, raw: Vec<u8>) -> Result<Vec<u8>, Errno> {
    if raw != AF_UNIX.to_le_bytes() {
        return Ok(raw);
    }
    for n in 0..0x10_0000u32 {
        let name = [&raw[..], b"\0", format!("{n:05x}").as_bytes()].concat();
        let (key, _) = unix_address(proc, &name)?;
        if !proc.fds.stream_bound(&key) && proc.fds.unix_datagram_at(&key).is_none() {
            return Ok(name);
        }
    }
    Err(Errno::EADDRINUSE)
}

/// Binds endpoint `index` of `family` to `address`, an ephemeral port for port 0.
fn bind_address(
    proc: &mut GuestProcess,
    index: usize,
    family: u16,
    address: Address,
) -> Result<(), Errno> {
    match address.port {
        Some(0) => {
            let port = proc.fds.ephemeral_port(|p| inet_key(family, p))?;
            let mut name = if address.name.is_empty() {
                loopback_name(family, port)
            } else {
                address.name
            };
            name[2..4].copy_from_slice(&port.to_be_bytes());
            proc.fds.bind(index, inet_key(family, port), name)
        }
        _ => proc.fds.bind(index, address.key, address.name),
    }
}

/// bind(fd, addr, addrlen)
pub(crate) fn bind(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if super::inet::index_of(proc, fd_arg(args[0])).is_some() {
        return super::inet::bind(proc, user, args);
    }
    let raw = autobind(proc, read_sockaddr(user, args[1], args[2])?)?;
    if let Some((index, _)) = unix_datagram::index_of(proc, fd_arg(args[0])) {
        let (key, name) = datagram_address(proc, &raw)?;
        bind_named(proc, &name.clone(), |proc| {
            proc.fds.bind_unix_datagram(index, key, name)
        })?;
        return value(0);
    }
    let (index, family) = endpoint(proc, args[0], Errno::EINVAL)?;
    let address = address_of(proc, family, &raw).map_err(|e| {
        if e == Errno::ENETUNREACH {
            Errno::EADDRNOTAVAIL
        } else {
            e
        }
    })?;
    let name = address.name.clone();
    bind_named(proc, &name, |proc| {
        bind_address(proc, index, family, address)
    })?;
    value(0)
}

/// An AF_UNIX address a datagram call passed: (namespace key, name). Another family is
/// EINVAL, as Linux's check of a Unix address answers.
fn datagram_address(proc: &GuestProcess, raw: &[u8]) -> Result<(Vec<u8>, Vec<u8>), Errno> {
    unix_address(proc, raw).map_err(|e| {
        if e == Errno::EAFNOSUPPORT {
            Errno::EINVAL
        } else {
            e
        }
    })
}

/// The AF_UNIX datagram socket the address `raw` names. A path naming no file is ENOENT; one
/// naming a file no datagram socket is bound at is ECONNREFUSED (EPROTOTYPE when a stream
/// socket is), and so is an abstract name nobody is bound at, as on Linux.
fn datagram_socket_at(proc: &GuestProcess, raw: &[u8]) -> Result<usize, Errno> {
    let (key, name) = datagram_address(proc, raw)?;
    if let Some(path) = unix_path(AF_UNIX, &name) {
        let vfs = &proc.config.vfs;
        if vfs.kind(vfs.resolve(proc.cwd, path, true)?)? != FileKind::Socket {
            return Err(Errno::ECONNREFUSED);
        }
        if proc.fds.stream_bound(&key) {
            return Err(EPROTOTYPE);
        }
    }
    proc.fds.unix_datagram_at(&key).ok_or(Errno::ECONNREFUSED)
}

/// The AF_UNIX datagram socket a send names at `addr` (`len` bytes of sockaddr).
pub(super) fn datagram_destination(
    proc: &GuestProcess,
    user: &UserMemory,
    addr: u64,
    len: u64,
) -> Result<usize, Errno> {
    datagram_socket_at(proc, &read_sockaddr(user, addr, len)?)
}

/// Binds a socket to `name` with `bind`; a Unix path gets its socket file first, which goes
/// again when `bind` fails.
fn bind_named(
    proc: &mut GuestProcess,
    name: &[u8],
    bind: impl FnOnce(&mut GuestProcess) -> Result<(), Errno>,
) -> Result<(), Errno> {
    let [a, b, ..] = *name else {
        return Err(Errno::EINVAL);
    };
    let path = unix_path(u16::from_le_bytes([a, b]), name);
    if let Some(path) = path {
        make_socket_file(proc, path)?;
    }
    if let Err(e) = bind(proc) {
        if let Some(path) = path {
            let cwd = proc.cwd;
            let _ = with_view(proc, |vfs, view| vfs.unlink(view, cwd, path));
        }
        return Err(e);
    }
    Ok(())
}

/// The path of a Unix address that names one (not an abstract name).
fn unix_path(family: u16, name: &[u8]) -> Option<&[u8]> {
    let path = name
        .get(2..)
        .filter(|p| family == AF_UNIX && p.first().is_some_and(|&b| b != 0))?;
    Some(&path[..path.iter().position(|&b| b == 0).unwrap_or(path.len())])
}

/// Makes a bound socket's file at `path`, with the mode Linux gives it (0777 less the umask);
/// a taken name is EADDRINUSE.
fn make_socket_file(proc: &mut GuestProcess, path: &[u8]) -> Result<(), Errno> {
    let (cwd, mode) = (proc.cwd, 0o777 & !proc.umask);
    match with_view(proc, |vfs, view| vfs.make_socket(view, cwd, path, mode)) {
        Err(Errno::EEXIST) => Err(Errno::EADDRINUSE),
        made => made.map(|_| ()),
    }
}

/// listen(fd, backlog): an unbound Internet socket gets an ephemeral port, as on Linux.
pub(crate) fn listen(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (index, family) = endpoint(proc, args[0], Errno::EINVAL)?;
    if proc.fds.endpoint(index)?.name.is_none() {
        if family == AF_UNIX {
            return Err(Errno::EINVAL);
        }
        bind_address(
            proc,
            index,
            family,
            Address {
                key: Vec::new(),
                name: Vec::new(),
                port: Some(0),
            },
        )?;
    }
    let backlog = (args[1] as i32).clamp(0, SOMAXCONN as i32) as usize;
    proc.fds.listen(index, backlog)?;
    value(0)
}

/// connect(fd, addr, addrlen): to a listening address in this VM. Nobody listening is
/// ECONNREFUSED (ENOENT for a Unix path, as Linux answers when no socket file is there). An
/// Internet address outside the VM's loopback leaves the VM under the policy (inet.rs).
pub(crate) fn connect(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if super::inet::index_of(proc, fd_arg(args[0])).is_some() {
        return super::inet::connect(proc, user, args);
    }
    if let Some((index, _)) = unix_datagram::index_of(proc, fd_arg(args[0])) {
        let raw = read_sockaddr(user, args[1], args[2])?;
        let peer = match u16::from_le_bytes([raw[0], raw[1]]) {
            AF_UNSPEC => None,
            _ => Some(datagram_socket_at(proc, &raw)?),
        };
        return unix_datagram::connect(proc, index, peer);
    }
    let (index, family) = endpoint(proc, args[0], Errno::EISCONN)?;
    let raw = read_sockaddr(user, args[1], args[2])?;
    let address = match address_of(proc, family, &raw) {
        Err(Errno::ENETUNREACH) => {
            let dest = super::inet::parse_address(&raw, family)?;
            return super::inet::connect_out(proc, fd_arg(args[0]), family, dest);
        }
        other => other?,
    };
    let abstract_name = address.key.get(1) == Some(&0);
    let seqpacket = proc.fds.endpoint(index)?.seqpacket;
    // A TCP connect that does not wait says so even on the loopback, where the connection is
    // made at once: Linux's handshake is never done inside the call. A Unix one completes.
    let connected = if family != AF_UNIX && proc.fds.get(fd_arg(args[0]))?.nonblocking() {
        Err(super::inet::EINPROGRESS)
    } else {
        value(0)
    };
    let dual_stack = match (family, address.port) {
        (AF_INET, Some(port)) if proc.fds.listener(&address.key).is_none() => {
            dual_stack_listener(proc, port)
        }
        _ => None,
    };
    // A listener of the other type: abstract names are apart per type, paths are shared.
    let listener = dual_stack
        .or_else(|| proc.fds.listener(&address.key))
        .filter(|&l| {
            proc.fds
                .endpoint(l)
                .is_ok_and(|e| e.seqpacket == seqpacket || !abstract_name)
        });
    let Some(listener) = listener else {
        return Err(if family != AF_UNIX || abstract_name {
            Errno::ECONNREFUSED
        } else if proc.fds.unix_datagram_at(&address.key).is_some() {
            EPROTOTYPE
        } else {
            Errno::ENOENT
        });
    };
    if proc.fds.endpoint(listener)?.seqpacket != seqpacket {
        return Err(EPROTOTYPE);
    }
    let local = match (family, proc.fds.endpoint(index)?.name.clone()) {
        (_, Some(name)) => name,
        (AF_UNIX, None) => AF_UNIX.to_le_bytes().to_vec(),
        (_, None) => loopback_name(family, proc.fds.ephemeral_port(|p| inet_key(family, p))?),
    };
    if dual_stack.is_some() {
        // The client sees the IPv4 address it connected to, the server IPv4-mapped ones.
        let peer = address.name;
        let server_names = (v4_mapped(&peer), v4_mapped(&local));
        proc.fds
            .connect(fd_arg(args[0]), listener, (local, peer), Some(server_names))?;
        return connected;
    }
    let peer = proc
        .fds
        .endpoint(listener)?
        .name
        .clone()
        .unwrap_or_default();
    proc.fds
        .connect(fd_arg(args[0]), listener, (local, peer), None)?;
    connected
}

/// The AF_INET6 listener at `port` that takes an IPv4 connection no AF_INET one listens for:
/// bound to the wildcard without IPV6_V6ONLY, as Linux's dual stack has it.
fn dual_stack_listener(proc: &GuestProcess, port: u16) -> Option<usize> {
    let listener = proc.fds.listener(&inet_key(AF_INET6, port))?;
    let endpoint = proc.fds.endpoint(listener).ok()?;
    let wildcard = endpoint
        .name
        .as_ref()
        .and_then(|name| name.get(8..24))
        .is_some_and(|ip| ip.iter().all(|&b| b == 0));
    (wildcard && !endpoint.v6only).then_some(listener)
}

/// An AF_INET sockaddr as the IPv4-mapped AF_INET6 one an AF_INET6 socket reads.
fn v4_mapped(name: &[u8]) -> Vec<u8> {
    let mut mapped = AF_INET6.to_le_bytes().to_vec();
    mapped.extend_from_slice(&name[2..4]);
    mapped.extend_from_slice(&[0; 4]); // flow info
    mapped.extend_from_slice(&[0; 10]);
    mapped.extend_from_slice(&[0xff, 0xff]);
    mapped.extend_from_slice(&name[4..8]);
    mapped.extend_from_slice(&[0; 4]); // scope id
    mapped
}

/// accept(fd, addr, addrlen) and accept4(fd, addr, addrlen, flags): waits for a connection
/// unless the socket is nonblocking (EAGAIN).
pub(crate) fn accept4(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [fd, addr, addrlen, flags, ..] = args;
    if flags & !(SOCK_NONBLOCK | SOCK_CLOEXEC) != 0 {
        return Err(Errno::EINVAL);
    }
    let desc = proc.fds.get(fd_arg(fd))?;
    let nonblocking = desc.nonblocking();
    let Object::Endpoint(index) = desc.object else {
        return Err(match desc.object {
            Object::Socket { .. } | Object::Inet(_) => Errno::EINVAL,
            Object::UnixDatagram(_) => Errno::EOPNOTSUPP,
            _ => Errno::ENOTSOCK,
        });
    };
    let status = if flags & SOCK_NONBLOCK != 0 {
        O_NONBLOCK
    } else {
        0
    };
    let options = desc.socket_options;
    match proc.fds.accept(index, status, flags & SOCK_CLOEXEC != 0)? {
        Some((new_fd, peer)) => {
            // The connection has the listener's options, as a Linux clone of it does.
            proc.fds.get_mut(new_fd)?.socket_options = options;
            if addr != 0 {
                write_truncated(user, addr, addrlen, &peer)?;
            }
            value(new_fd)
        }
        None if nonblocking => Err(Errno::EAGAIN),
        None => wait_ready(proc, None),
    }
}

/// accept(fd, addr, addrlen)
pub(crate) fn accept(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    accept4(proc, user, [args[0], args[1], args[2], 0, 0, 0])
}

/// getsockname of an unconnected socket: its address, or its family's unnamed one.
pub(super) fn endpoint_name(proc: &GuestProcess, index: usize) -> Result<Vec<u8>, Errno> {
    let endpoint = proc.fds.endpoint(index)?;
    Ok(match (&endpoint.name, endpoint.family) {
        (Some(name), _) => name.clone(),
        (None, AF_UNIX) => AF_UNIX.to_le_bytes().to_vec(),
        (None, family) => {
            let mut name = loopback_name(family, 0);
            name[4..]
                .iter_mut()
                .take(if family == AF_INET { 4 } else { 0 })
                .for_each(|b| *b = 0);
            if family == AF_INET6 {
                name[23] = 0;
            }
            name
        }
    })
}
