//! Host sockets the VMM opens on a guest's behalf (after the policy allowed the destination),
//! always non-blocking and close-on-exec: a guest's blocking call waits in the scheduler, never
//! in the host kernel. The libc calls of the egress path live here, each in a safe function
//! that returns the host errno as an `io::Error`.

// FFI: libc's signed return values and C types are converted to and from Rust's unsigned ones.
#![allow(clippy::cast_sign_loss, clippy::cast_possible_wrap)]

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::sys::{check, check_len};

/// A TCP or UDP socket of the host.
#[derive(Debug)]
pub struct HostSocket {
    fd: OwnedFd,
    stream: bool,
}

/// An all-zero `sockaddr_storage` and its full length, for a call to fill in.
fn empty_storage() -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all zeros is a valid value.
    let storage = unsafe { MaybeUninit::zeroed().assume_init() };
    (
        storage,
        size_of::<libc::sockaddr_storage>() as libc::socklen_t,
    )
}

/// `addr` as a `sockaddr_storage` and its length.
fn to_raw(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    let (mut storage, _) = empty_storage();
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned.
            unsafe { std::ptr::write(std::ptr::addr_of_mut!(storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in6 and suitably aligned.
            unsafe { std::ptr::write(std::ptr::addr_of_mut!(storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The address in `storage`, if it is an Internet one.
fn from_raw(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: libc::sockaddr_in =
                unsafe { std::ptr::read(std::ptr::addr_of!(*storage).cast()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: libc::sockaddr_in6 =
                unsafe { std::ptr::read(std::ptr::addr_of!(*storage).cast()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

impl HostSocket {
    /// A new non-blocking socket: `stream` TCP, else UDP; IPv6 or IPv4.
    pub fn open(ipv6: bool, stream: bool) -> io::Result<HostSocket> {
        let family = if ipv6 { libc::AF_INET6 } else { libc::AF_INET };
        let kind = if stream {
            libc::SOCK_STREAM
        } else {
            libc::SOCK_DGRAM
        };
        // SAFETY: plain syscall with integer arguments.
        let fd = check(unsafe {
            libc::socket(family, kind | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0)
        })?;
        // SAFETY: fd was just returned by socket and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(HostSocket { fd, stream })
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// connect(2): Err(EINPROGRESS) while a TCP handshake goes on.
    pub fn connect(&self, addr: &SocketAddr) -> io::Result<()> {
        let (storage, len) = to_raw(addr);
        // SAFETY: storage holds a valid address of `len` bytes and outlives the call.
        check(unsafe { libc::connect(self.raw(), std::ptr::addr_of!(storage).cast(), len) })
            .map(drop)
    }

    /// Sends `data` (to `to`, for an unconnected UDP socket) without waiting and without
    /// SIGPIPE.
    pub fn send(&self, data: &[u8], to: Option<&SocketAddr>) -> io::Result<usize> {
        let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
        match to {
            // SAFETY: data is a valid slice for the call.
            None => check_len(unsafe {
                libc::send(self.raw(), data.as_ptr().cast(), data.len(), flags)
            }),
            Some(addr) => {
                let (storage, len) = to_raw(addr);
                // SAFETY: data and storage are valid for the call.
                check_len(unsafe {
                    libc::sendto(
                        self.raw(),
                        data.as_ptr().cast(),
                        data.len(),
                        flags,
                        std::ptr::addr_of!(storage).cast(),
                        len,
                    )
                })
            }
        }
    }

    /// Receives into `buf` without waiting (`peek`: leaving the data queued); returns the
    /// length (for UDP, the datagram's whole length, which may exceed `buf`) and the sender.
    pub fn recv(&self, buf: &mut [u8], peek: bool) -> io::Result<(usize, Option<SocketAddr>)> {
        let mut flags = libc::MSG_DONTWAIT;
        if !self.stream {
            // A datagram's whole length (on TCP, MSG_TRUNC would discard the bytes instead).
            flags |= libc::MSG_TRUNC;
        }
        if peek {
            flags |= libc::MSG_PEEK;
        }
        let (mut storage, mut len) = empty_storage();
        // SAFETY: buf and storage are valid and writable for the lengths given.
        let n = check_len(unsafe {
            libc::recvfrom(
                self.raw(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags,
                std::ptr::addr_of_mut!(storage).cast(),
                &mut len,
            )
        })?;
        Ok((n, from_raw(&storage)))
    }

    /// shutdown(2) with SHUT_RD (0), SHUT_WR (1) or SHUT_RDWR (2).
    pub fn shutdown(&self, how: i32) -> io::Result<()> {
        // SAFETY: plain syscall with integer arguments.
        check(unsafe { libc::shutdown(self.raw(), how) }).map(drop)
    }

    /// SO_ERROR: the pending error (a refused connect), cleared by reading it.
    pub fn take_error(&self) -> io::Result<i32> {
        self.int_option(libc::SOL_SOCKET, libc::SO_ERROR)
    }

    /// An int-valued socket option.
    pub fn int_option(&self, level: i32, name: i32) -> io::Result<i32> {
        let mut value: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: value and len are valid and writable for the call.
        check(unsafe {
            libc::getsockopt(
                self.raw(),
                level,
                name,
                std::ptr::addr_of_mut!(value).cast(),
                &mut len,
            )
        })?;
        Ok(value)
    }

    /// Sets an int-valued socket option.
    pub fn set_int_option(&self, level: i32, name: i32, value: i32) -> io::Result<()> {
        // SAFETY: value is valid for the call and its size is given.
        check(unsafe {
            libc::setsockopt(
                self.raw(),
                level,
                name,
                std::ptr::addr_of!(value).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        })
        .map(drop)
    }

    fn name(&self, peer: bool) -> io::Result<SocketAddr> {
        let (mut storage, mut len) = empty_storage();
        let at = std::ptr::addr_of_mut!(storage).cast();
        // SAFETY: storage and len are valid and writable for the call.
        check(unsafe {
            if peer {
                libc::getpeername(self.raw(), at, &mut len)
            } else {
                libc::getsockname(self.raw(), at, &mut len)
            }
        })?;
        from_raw(&storage).ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.name(false)
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.name(true)
    }
}

/// Waits until one of `interest` (fd, poll events) is ready or `timeout` passes; true when one
/// is (an error or hang-up counts).
pub fn wait_any(interest: &[(RawFd, i16)], timeout: Duration) -> io::Result<bool> {
    let mut fds: Vec<libc::pollfd> = interest
        .iter()
        .map(|&(fd, events)| libc::pollfd {
            fd,
            events,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    Ok(poll(&mut fds, ms)? > 0)
}

/// The poll events of `fd` now, among `events` (plus errors and hang-ups), without waiting.
pub fn ready_now(fd: RawFd, events: i16) -> i16 {
    let mut fds = [libc::pollfd {
        fd,
        events,
        revents: 0,
    }];
    match poll(&mut fds, 0) {
        Ok(1) => fds[0].revents,
        _ => 0,
    }
}

/// poll(2) of `fds` for at most `ms` milliseconds: how many have events (none when a signal
/// interrupted the wait).
fn poll(fds: &mut [libc::pollfd], ms: i32) -> io::Result<usize> {
    // SAFETY: fds is a valid, exclusively borrowed array of its length for the call.
    match check(unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) }) {
        Ok(n) => Ok(n as usize),
        Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(0),
        Err(e) => Err(e),
    }
}

/// The host's own addresses (every interface's), which guests may not reach unless named.
pub fn own_addresses() -> io::Result<Vec<IpAddr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head that freeifaddrs releases below.
    check(unsafe { libc::getifaddrs(&mut list) })?;
    let mut out = Vec::new();
    let mut at = list;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list getifaddrs returned, not freed yet.
        let entry = unsafe { &*at };
        if !entry.ifa_addr.is_null() {
            // SAFETY: ifa_addr points at a sockaddr of its family's size; sockaddr_storage is
            // read only as far as that family's struct.
            let storage = unsafe { read_sockaddr(entry.ifa_addr) };
            if let Some(addr) = storage.as_ref().and_then(from_raw) {
                out.push(addr.ip());
            }
        }
        at = entry.ifa_next;
    }
    // SAFETY: list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(out)
}

/// Copies an Internet sockaddr into a sockaddr_storage.
///
/// # Safety
/// `addr` points at a valid sockaddr of the size its family says.
unsafe fn read_sockaddr(addr: *const libc::sockaddr) -> Option<libc::sockaddr_storage> {
    // SAFETY: the caller guarantees a valid sockaddr.
    let family = i32::from(unsafe { (*addr).sa_family });
    let size = match family {
        libc::AF_INET => size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
        _ => return None,
    };
    let (mut storage, _) = empty_storage();
    // SAFETY: `size` bytes are readable at addr (its family's struct) and fit in storage.
    unsafe {
        std::ptr::copy_nonoverlapping(
            addr.cast::<u8>(),
            std::ptr::addr_of_mut!(storage).cast::<u8>(),
            size,
        );
    }
    Some(storage)
}
