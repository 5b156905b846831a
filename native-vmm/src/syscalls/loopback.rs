//! UDP between the VM's own Internet datagram sockets on its loopback: a bind to a loopback
//! or wildcard address takes a UDP port in the VM (`FdTable::bind_datagram`), and a datagram
//! sent to a loopback address goes straight into the receive queue of the socket bound at
//! its port (`net::loopback`), whichever process of the tree holds it. No host socket, no
//! policy check, no network usage. A datagram nobody is bound for is dropped; on a connected
//! socket the next call then fails ECONNREFUSED, as Linux reports the ICMP error it gets.
//! Each datagram keeps the fields of its IP header a receiver may ask for (ancillary.rs).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::ancillary::{self, Outgoing};
use crate::errno::Errno;
use crate::net::canonical;
use crate::net::loopback::IpHeader;
use crate::process::GuestProcess;

/// Whether `addr` is on the VM's loopback: a loopback address or the wildcard (which means
/// loopback here, the only interface).
pub(super) fn is_loopback(addr: SocketAddr) -> bool {
    let ip = canonical(addr).ip();
    ip.is_loopback() || ip.is_unspecified()
}

fn loopback_ip(ipv6: bool) -> IpAddr {
    if ipv6 {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }
}

fn wildcard_ip(ipv6: bool) -> IpAddr {
    if ipv6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    }
}

/// Binds datagram socket `index` to `addr` (a loopback or wildcard address; port 0: an
/// ephemeral one). EADDRINUSE when another socket has the port.
pub(super) fn bind(proc: &mut GuestProcess, index: usize, addr: SocketAddr) -> Result<(), Errno> {
    let port = proc.fds.bind_datagram(index, addr.port())?;
    let mut bound = addr;
    bound.set_port(port);
    proc.fds.inet_mut(index)?.bound = Some(bound);
    Ok(())
}

/// The address datagram socket `index` sends from on the loopback: its bound address (the
/// wildcard as the loopback address), an ephemeral port bound first if it has none.
fn source(proc: &mut GuestProcess, index: usize) -> Result<SocketAddr, Errno> {
    let socket = proc.fds.inet(index)?;
    let ipv6 = socket.ipv6;
    let bound = match socket.bound {
        Some(bound) => bound,
        None => {
            bind(proc, index, SocketAddr::new(wildcard_ip(ipv6), 0))?;
            proc.fds.inet(index)?.bound.ok_or(Errno::EINVAL)?
        }
    };
    Ok(if bound.ip().is_unspecified() {
        SocketAddr::new(loopback_ip(ipv6), bound.port())
    } else {
        bound
    })
}

/// connect of datagram socket `index` to loopback `dest`: bound (an ephemeral port if it was
/// not) with the loopback as its address, as Linux picks the route's source.
pub(super) fn connect(
    proc: &mut GuestProcess,
    index: usize,
    dest: SocketAddr,
) -> Result<(), Errno> {
    let from = source(proc, index)?;
    let socket = proc.fds.inet_mut(index)?;
    socket.bound = Some(from);
    socket.peer = Some(dest);
    socket.refused = false;
    Ok(())
}

/// Whether a socket bound at `bound` and connected to `peer` (if at all) takes a datagram to
/// `dest` from `from`, as Linux's lookup of the receiving socket decides.
fn takes(bound: SocketAddr, peer: Option<SocketAddr>, dest: SocketAddr, from: SocketAddr) -> bool {
    let (bound_ip, dest_ip) = (canonical(bound).ip(), canonical(dest).ip());
    let to_address = bound_ip.is_unspecified()
        || bound_ip == dest_ip
        || (dest_ip.is_unspecified() && bound_ip.is_loopback());
    to_address && peer.is_none_or(|p| canonical(p) == canonical(from))
}

/// Sends `data` from datagram socket `index` to loopback `dest`, with what a
/// sendmsg's control messages set (`outgoing`); `connected`: to its peer (a datagram nobody
/// takes then makes the next call fail ECONNREFUSED).
pub(super) fn send(
    proc: &mut GuestProcess,
    index: usize,
    data: &[u8],
    dest: SocketAddr,
    connected: bool,
    outgoing: &Outgoing,
) -> Result<usize, Errno> {
    let mut from = source(proc, index)?;
    if let Some(ip) = outgoing.source {
        from.set_ip(ip);
    }
    let socket = proc.fds.inet(index)?;
    let (ipv6, lite) = (socket.ipv6, socket.lite);
    let route = ancillary::route(ipv6, dest);
    let (hop_limit, traffic_class) = ancillary::sent_fields(&socket.ip, route, outgoing);
    // A datagram to the wildcard goes to the source's address, as Linux routes it.
    let to = canonical(dest).ip();
    let header = IpHeader {
        source: from,
        destination: if to.is_unspecified() {
            canonical(from).ip()
        } else {
            to
        },
        hop_limit,
        traffic_class,
    };
    let receiver = proc
        .fds
        .datagram_receiver(ipv6, lite, dest.port())
        .filter(|&to| {
            proc.fds
                .inet(to)
                .is_ok_and(|s| s.bound.is_some_and(|b| takes(b, s.peer, dest, from)))
        });
    match receiver {
        // A full queue drops it, as Linux does past the receive buffer.
        Some(to) => {
            proc.fds.inet_mut(to)?.inbox.push(header, data.to_vec());
        }
        None if connected => proc.fds.inet_mut(index)?.refused = true,
        None => {}
    }
    Ok(data.len())
}

/// Err(ECONNREFUSED) once after a connected send found no receiver.
pub(super) fn take_refused(proc: &mut GuestProcess, index: usize) -> Result<(), Errno> {
    let socket = proc.fds.inet_mut(index)?;
    if std::mem::take(&mut socket.refused) {
        return Err(Errno::ECONNREFUSED);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_and_wildcard_addresses_are_the_vms_own() {
        for local in [
            "127.0.0.1:1",
            "127.9.9.9:1",
            "0.0.0.0:1",
            "[::1]:1",
            "[::]:1",
        ] {
            assert!(is_loopback(at(local)), "{local}");
        }
        assert!(is_loopback(at("[::ffff:127.0.0.1]:1")));
        for outside in ["10.0.0.1:1", "[2001:db8::1]:1", "[::ffff:10.0.0.1]:1"] {
            assert!(!is_loopback(at(outside)), "{outside}");
        }
    }

    #[test]
    fn a_socket_takes_datagrams_to_its_address_from_its_peer_only() {
        let from = at("127.0.0.1:40000");
        assert!(takes(at("0.0.0.0:5"), None, at("127.0.0.1:5"), from));
        assert!(takes(at("0.0.0.0:5"), None, at("127.0.0.7:5"), from));
        assert!(takes(at("127.0.0.1:5"), None, at("127.0.0.1:5"), from));
        assert!(takes(at("127.0.0.1:5"), None, at("0.0.0.0:5"), from));
        assert!(!takes(at("127.0.0.1:5"), None, at("127.0.0.2:5"), from));
        assert!(takes(at("[::]:5"), None, at("[::1]:5"), at("[::1]:40000")));
        assert!(takes(at("0.0.0.0:5"), Some(from), at("127.0.0.1:5"), from));
        assert!(!takes(
            at("0.0.0.0:5"),
            Some(at("127.0.0.1:40001")),
            at("127.0.0.1:5"),
            from
        ));
    }
}
