//! IP-level options of the VM's UDP and UDP-Lite sockets and the control messages that carry
//! them, as Linux has them: setsockopt/getsockopt of IP_TTL, IP_TOS, IPV6_UNICAST_HOPS,
//! IPV6_TCLASS and the flags that ask for control messages (IP_PKTINFO, IP_RECVTTL,
//! IP_RECVTOS, IPV6_RECVPKTINFO, IPV6_RECVHOPLIMIT, IPV6_RECVTCLASS and RFC 2292's
//! IPV6_2292PKTINFO, IPV6_2292HOPLIMIT); sendmsg's IP_PKTINFO, IP_TTL, IP_TOS, IPV6_PKTINFO,
//! IPV6_HOPLIMIT, IPV6_TCLASS and IPV6_DONTFRAG, which set one datagram's source address, hop
//! limit or traffic class over the socket's (ip_cmsg_send, ip6_datagram_send_ctl: a bad
//! length or value is EINVAL, an interface other than the loopback ENODEV, a source address
//! not the VM's EINVAL); and the control messages a recvmsg returns, in Linux's order, read
//! from the datagram's header as it arrived and the flags as they are at the receive.
//! IPv4's options serve the datagrams that go over IPv4, IPv6's those over IPv6.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::control::{Message, Reply};
use crate::errno::Errno;
use crate::net::loopback::IpHeader;
use crate::net::{canonical, IpOptions};

const SOL_SOCKET: i32 = 1;
pub(super) const SOL_IP: i32 = 0;
const SOL_IPV6: i32 = 41;
const SOL_UDP: i32 = 17;
const ENOPROTOOPT: Errno = Errno(92);
const ENODEV: Errno = Errno(19);

const IP_TOS: i32 = 1;
const IP_TTL: i32 = 2;
const IP_PKTINFO: i32 = 8;
const IP_RECVTTL: i32 = 12;
const IP_RECVTOS: i32 = 13;
const IPV6_2292PKTINFO: i32 = 2;
const IPV6_2292HOPLIMIT: i32 = 8;
const IPV6_UNICAST_HOPS: i32 = 16;
const IPV6_RECVPKTINFO: i32 = 49;
const IPV6_PKTINFO: i32 = 50;
const IPV6_RECVHOPLIMIT: i32 = 51;
const IPV6_HOPLIMIT: i32 = 52;
const IPV6_DONTFRAG: i32 = 62;
const IPV6_RECVTCLASS: i32 = 66;
const IPV6_TCLASS: i32 = 67;
const SCM_RIGHTS: i32 = 1;
const SCM_CREDENTIALS: i32 = 2;
const SO_MARK: i32 = 36;
const SO_TIMESTAMPING_OLD: i32 = 37;
const SO_TIMESTAMPING_NEW: i32 = 65;
const UDP_SEGMENT: i32 = 103;

/// The hop limit (IPv4's TTL) of the VM's loopback route, Linux's default.
const DEFAULT_HOP_LIMIT: u8 = 64;
/// The loopback's interface index, the VM's only interface.
const LOOPBACK_INDEX: u32 = 1;
/// `struct in_pktinfo` and `struct in6_pktinfo`.
const IN_PKTINFO: usize = 12;
const IN6_PKTINFO: usize = 20;

/// The options that ask for control messages, by (level, name), and their bit in
/// `IpOptions::receive`.
const RECEIVE_FLAGS: [(i32, i32, u16); 8] = [
    (SOL_IP, IP_PKTINFO, 1 << 0),
    (SOL_IP, IP_RECVTTL, 1 << 1),
    (SOL_IP, IP_RECVTOS, 1 << 2),
    (SOL_IPV6, IPV6_RECVPKTINFO, 1 << 3),
    (SOL_IPV6, IPV6_RECVHOPLIMIT, 1 << 4),
    (SOL_IPV6, IPV6_RECVTCLASS, 1 << 5),
    (SOL_IPV6, IPV6_2292PKTINFO, 1 << 6),
    (SOL_IPV6, IPV6_2292HOPLIMIT, 1 << 7),
];

fn receive_bit(level: i32, name: i32) -> Option<u16> {
    RECEIVE_FLAGS
        .iter()
        .find(|&&(l, n, _)| (l, n) == (level, name))
        .map(|&(_, _, bit)| bit)
}

/// Whether (level, name) is an option of this module.
pub(super) fn is_option(level: i32, name: i32) -> bool {
    receive_bit(level, name).is_some()
        || matches!(
            (level, name),
            (SOL_IP, IP_TOS | IP_TTL) | (SOL_IPV6, IPV6_UNICAST_HOPS | IPV6_TCLASS)
        )
}

/// setsockopt of option (level, name) on a datagram socket (`ipv6`: AF_INET6) to the value
/// in `raw` (the first bytes of optval, at most 4). IPv4's take an int or, when shorter, a
/// byte (none: 0); IPv6's an int (EINVAL when shorter), and only on an AF_INET6 socket.
pub(super) fn set(
    options: &mut IpOptions,
    ipv6: bool,
    level: i32,
    name: i32,
    raw: &[u8],
) -> Result<(), Errno> {
    let value = match (level, raw) {
        (SOL_IPV6, _) if !ipv6 => return Err(ENOPROTOOPT),
        (_, [a, b, c, d, ..]) => i32::from_le_bytes([*a, *b, *c, *d]),
        (SOL_IP, [byte, ..]) => i32::from(*byte),
        (SOL_IP, []) if name != IP_TTL => 0,
        _ => return Err(Errno::EINVAL),
    };
    if let Some(bit) = receive_bit(level, name) {
        if value != 0 {
            options.receive |= bit;
        } else {
            options.receive &= !bit;
        }
        return Ok(());
    }
    let hops = |value: i32| match value {
        -1 => Ok(None),
        0..=255 => Ok(Some(value as u8)),
        _ => Err(Errno::EINVAL),
    };
    match (level, name) {
        // A TOS is a byte: the int's low byte, as Linux keeps it.
        (SOL_IP, IP_TOS) => options.tos = value as u8,
        (SOL_IP, IP_TTL) if value == 0 => return Err(Errno::EINVAL),
        (SOL_IP, IP_TTL) => options.ttl = hops(value)?,
        (SOL_IPV6, IPV6_UNICAST_HOPS) => options.hop_limit = hops(value)?,
        // -1: the default, 0 (RFC 3542).
        (SOL_IPV6, IPV6_TCLASS) => options.traffic_class = hops(value)?.unwrap_or(0),
        _ => return Err(ENOPROTOOPT),
    }
    Ok(())
}

/// getsockopt of option (level, name) on a datagram socket: the value kept, a hop limit not
/// set as the route's. IPv6's on an AF_INET socket are EOPNOTSUPP, as Linux's UDP has it.
pub(super) fn get(options: &IpOptions, ipv6: bool, level: i32, name: i32) -> Result<u32, Errno> {
    if level == SOL_IPV6 && !ipv6 {
        return Err(Errno::EOPNOTSUPP);
    }
    if let Some(bit) = receive_bit(level, name) {
        return Ok(u32::from(options.receive & bit != 0));
    }
    Ok(match (level, name) {
        (SOL_IP, IP_TOS) => u32::from(options.tos),
        (SOL_IP, IP_TTL) => u32::from(options.ttl.unwrap_or(DEFAULT_HOP_LIMIT)),
        (SOL_IPV6, IPV6_UNICAST_HOPS) => u32::from(options.hop_limit.unwrap_or(DEFAULT_HOP_LIMIT)),
        (SOL_IPV6, IPV6_TCLASS) => u32::from(options.traffic_class),
        _ => return Err(ENOPROTOOPT),
    })
}

/// How a sendmsg's datagram goes, which decides the control messages it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// Over IPv4; `from_ipv6`: from an AF_INET6 socket (to an IPv4-mapped address), which
    /// may name its source with IPV6_PKTINFO too.
    Ipv4 {
        from_ipv6: bool,
    },
    Ipv6,
}

/// How a datagram from a socket of `ipv6` (AF_INET6) to `dest` goes.
pub(super) fn route(ipv6: bool, dest: SocketAddr) -> Route {
    match canonical(dest) {
        SocketAddr::V4(_) => Route::Ipv4 { from_ipv6: ipv6 },
        SocketAddr::V6(_) => Route::Ipv6,
    }
}

/// What a sendmsg's control messages set for its one datagram (None: the socket's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Outgoing {
    pub source: Option<IpAddr>,
    pub hop_limit: Option<u8>,
    pub traffic_class: Option<u8>,
}

/// The int of a message that must be exactly one int, EINVAL else; `range` its values.
fn int_in(message: &Message, range: std::ops::RangeInclusive<i32>) -> Result<i32, Errno> {
    message
        .int()
        .filter(|value| range.contains(value))
        .ok_or(Errno::EINVAL)
}

/// An interface index a message names: none or the loopback's (ENODEV for any other).
fn check_interface(index: u32) -> Result<(), Errno> {
    if index == 0 || index == LOOPBACK_INDEX {
        Ok(())
    } else {
        Err(ENODEV)
    }
}

/// The source address a PKTINFO names: none when unspecified; EINVAL unless it is the
/// VM's own (the loopback's).
fn local_source(ip: IpAddr) -> Result<Option<IpAddr>, Errno> {
    match ip {
        ip if ip.is_unspecified() => Ok(None),
        ip if ip.is_loopback() => Ok(Some(ip)),
        _ => Err(Errno::EINVAL),
    }
}

/// An `in6_pktinfo`'s address and interface, EINVAL when the message is too short.
fn in6_pktinfo(message: &Message) -> Result<(Ipv6Addr, u32), Errno> {
    let data = message.data.get(..IN6_PKTINFO).ok_or(Errno::EINVAL)?;
    let address: [u8; 16] = data[..16].try_into().map_err(|_| Errno::EINVAL)?;
    let index = u32::from_le_bytes([data[16], data[17], data[18], data[19]]);
    Ok((Ipv6Addr::from(address), index))
}

/// The control messages of a sendmsg on a datagram socket, checked in order as Linux
/// checks them (udp_cmsg_send's SOL_UDP ones first); messages of other levels are ignored.
pub(super) fn outgoing(messages: &[Message], route: Route) -> Result<Outgoing, Errno> {
    // UDP_SEGMENT (segmentation offload) is not done; other SOL_UDP types do not exist.
    if let Some(message) = messages.iter().find(|m| m.level == SOL_UDP) {
        return Err(if message.kind == UDP_SEGMENT {
            Errno::EOPNOTSUPP
        } else {
            Errno::EINVAL
        });
    }
    let mut out = Outgoing::default();
    for message in messages {
        match (message.level, route) {
            (SOL_SOCKET, _) => socket_message(message)?,
            (SOL_IP, Route::Ipv4 { .. }) => ipv4_message(message, &mut out)?,
            (SOL_IPV6, Route::Ipv4 { from_ipv6: true }) if message.kind == IPV6_PKTINFO => {
                let (address, index) = in6_pktinfo(message)?;
                let v4 = address.to_ipv4_mapped().ok_or(Errno::EINVAL)?;
                check_interface(index)?;
                out.source = local_source(IpAddr::V4(v4))?;
            }
            (SOL_IPV6, Route::Ipv6) => ipv6_message(message, &mut out)?,
            _ => {}
        }
    }
    Ok(out)
}

/// The control messages of a sendmsg on a stream socket: only SOL_SOCKET's count.
pub(super) fn outgoing_stream(messages: &[Message]) -> Result<(), Errno> {
    messages
        .iter()
        .filter(|m| m.level == SOL_SOCKET)
        .try_for_each(socket_message)
}

/// A SOL_SOCKET message of a send (__sock_cmsg_send): SCM_RIGHTS and SCM_CREDENTIALS are
/// ignored (they are AF_UNIX's), SO_MARK needs a privilege the guest has not, timestamps are
/// not done, anything else is EINVAL.
fn socket_message(message: &Message) -> Result<(), Errno> {
    match message.kind {
        SCM_RIGHTS | SCM_CREDENTIALS => Ok(()),
        SO_MARK => Err(Errno::EPERM),
        SO_TIMESTAMPING_OLD | SO_TIMESTAMPING_NEW => Err(Errno::EOPNOTSUPP),
        _ => Err(Errno::EINVAL),
    }
}

fn ipv4_message(message: &Message, out: &mut Outgoing) -> Result<(), Errno> {
    match message.kind {
        IP_PKTINFO => {
            if message.data.len() != IN_PKTINFO {
                return Err(Errno::EINVAL);
            }
            let d = message.data;
            check_interface(u32::from_le_bytes([d[0], d[1], d[2], d[3]]))?;
            let spec_dst = Ipv4Addr::new(d[4], d[5], d[6], d[7]);
            out.source = local_source(IpAddr::V4(spec_dst))?;
        }
        IP_TTL => out.hop_limit = Some(int_in(message, 1..=255)? as u8),
        IP_TOS => {
            let tos = match message.data {
                [byte] => *byte,
                _ => int_in(message, 0..=255)? as u8,
            };
            out.traffic_class = Some(tos);
        }
        _ => return Err(Errno::EINVAL),
    }
    Ok(())
}

fn ipv6_message(message: &Message, out: &mut Outgoing) -> Result<(), Errno> {
    match message.kind {
        IPV6_PKTINFO | IPV6_2292PKTINFO => {
            let (address, index) = in6_pktinfo(message)?;
            check_interface(index)?;
            out.source = local_source(IpAddr::V6(address))?;
        }
        // -1: the socket's.
        IPV6_HOPLIMIT | IPV6_2292HOPLIMIT => {
            out.hop_limit = u8::try_from(int_in(message, -1..=255)?).ok();
        }
        // -1 goes out as 0xff: Linux starts from the socket's class and takes the message's
        // value as it is.
        IPV6_TCLASS => out.traffic_class = Some(int_in(message, -1..=255)? as u8),
        // Datagrams on the loopback are never fragmented: checked, nothing to do.
        IPV6_DONTFRAG => {
            int_in(message, -1..=1)?;
        }
        _ => return Err(Errno::EINVAL),
    }
    Ok(())
}

/// The hop limit and traffic class a datagram from a socket with `options` carries over
/// `route`: a control message's, else the socket's, else the route's default.
pub(super) fn sent_fields(options: &IpOptions, route: Route, outgoing: &Outgoing) -> (u8, u8) {
    let (hop_limit, traffic_class) = match route {
        Route::Ipv4 { .. } => (options.ttl, options.tos),
        Route::Ipv6 => (options.hop_limit, options.traffic_class),
    };
    (
        outgoing
            .hop_limit
            .or(hop_limit)
            .unwrap_or(DEFAULT_HOP_LIMIT),
        outgoing.traffic_class.unwrap_or(traffic_class),
    )
}

/// The control messages a receive of a datagram with `header` returns on a socket with
/// `options` (`ipv6`: AF_INET6), in Linux's order, put into `reply`. Nothing is built for a
/// socket that asks for none (most receives).
pub(super) fn received(options: &IpOptions, ipv6: bool, header: &IpHeader, reply: &mut Reply) {
    if options.receive == 0 {
        return;
    }
    let wants = |level, name| receive_bit(level, name).is_some_and(|b| options.receive & b != 0);
    let hop_limit = i32::from(header.hop_limit).to_le_bytes();
    if ipv6 {
        let destination = match header.destination {
            IpAddr::V6(ip) => ip,
            IpAddr::V4(ip) => ip.to_ipv6_mapped(),
        };
        let mut pktinfo = [0u8; IN6_PKTINFO];
        pktinfo[..16].copy_from_slice(&destination.octets());
        pktinfo[16..].copy_from_slice(&LOOPBACK_INDEX.to_le_bytes());
        let traffic_class = i32::from(header.traffic_class).to_le_bytes();
        let messages: [(i32, i32, &[u8]); 5] = [
            (IPV6_RECVPKTINFO, IPV6_PKTINFO, &pktinfo),
            (IPV6_RECVHOPLIMIT, IPV6_HOPLIMIT, &hop_limit),
            (IPV6_RECVTCLASS, IPV6_TCLASS, &traffic_class),
            (IPV6_2292PKTINFO, IPV6_2292PKTINFO, &pktinfo),
            (IPV6_2292HOPLIMIT, IPV6_2292HOPLIMIT, &hop_limit),
        ];
        for (flag, kind, data) in messages {
            if wants(SOL_IPV6, flag) {
                reply.put(SOL_IPV6, kind, data);
            }
        }
        return;
    }
    let destination = match header.destination {
        IpAddr::V4(ip) => ip,
        IpAddr::V6(ip) => ip.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
    }
    .octets();
    // in_pktinfo: the interface, the local address (the one it was sent to), the destination.
    let mut pktinfo = [0u8; IN_PKTINFO];
    pktinfo[..4].copy_from_slice(&LOOPBACK_INDEX.to_le_bytes());
    pktinfo[4..8].copy_from_slice(&destination);
    pktinfo[8..].copy_from_slice(&destination);
    let messages: [(i32, i32, &[u8]); 3] = [
        (IP_PKTINFO, IP_PKTINFO, &pktinfo),
        (IP_RECVTTL, IP_TTL, &hop_limit),
        (IP_RECVTOS, IP_TOS, &[header.traffic_class]),
    ];
    for (flag, kind, data) in messages {
        if wants(SOL_IP, flag) {
            reply.put(SOL_IP, kind, data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int_message(level: i32, kind: i32, data: &[u8]) -> Message<'_> {
        Message { level, kind, data }
    }

    /// setsockopt of an AF_INET6 socket's option to an int.
    fn set6(o: &mut IpOptions, name: i32, value: i32) -> Result<(), Errno> {
        set(o, true, SOL_IPV6, name, &value.to_le_bytes())
    }

    #[test]
    fn options_read_back_as_set_with_linux_defaults() {
        let mut o = IpOptions::default();
        assert_eq!(get(&o, true, SOL_IPV6, IPV6_UNICAST_HOPS), Ok(64));
        assert_eq!(get(&o, false, SOL_IP, IP_TTL), Ok(64));
        assert_eq!(get(&o, true, SOL_IPV6, IPV6_TCLASS), Ok(0));
        set6(&mut o, IPV6_UNICAST_HOPS, 7).unwrap();
        set6(&mut o, IPV6_TCLASS, 0x28).unwrap();
        set6(&mut o, IPV6_RECVHOPLIMIT, 1).unwrap();
        assert_eq!(get(&o, true, SOL_IPV6, IPV6_UNICAST_HOPS), Ok(7));
        assert_eq!(get(&o, true, SOL_IPV6, IPV6_TCLASS), Ok(0x28));
        assert_eq!(get(&o, true, SOL_IPV6, IPV6_RECVHOPLIMIT), Ok(1));
        assert_eq!(get(&o, true, SOL_IPV6, IPV6_RECVTCLASS), Ok(0));
        set6(&mut o, IPV6_UNICAST_HOPS, -1).unwrap();
        set6(&mut o, IPV6_TCLASS, -1).unwrap();
        assert_eq!(get(&o, true, SOL_IPV6, IPV6_UNICAST_HOPS), Ok(64));
        assert_eq!(get(&o, true, SOL_IPV6, IPV6_TCLASS), Ok(0));
        // IPv4 takes a byte; IPv6 needs an int.
        set(&mut o, false, SOL_IP, IP_TTL, &[9]).unwrap();
        assert_eq!(get(&o, false, SOL_IP, IP_TTL), Ok(9));
        let short = set(&mut o, true, SOL_IPV6, IPV6_TCLASS, &[1]);
        assert_eq!(short, Err(Errno::EINVAL));
    }

    #[test]
    fn out_of_range_values_and_foreign_levels_are_refused() {
        let mut o = IpOptions::default();
        for bad in [256, -2] {
            assert_eq!(set6(&mut o, IPV6_UNICAST_HOPS, bad), Err(Errno::EINVAL));
            assert_eq!(set6(&mut o, IPV6_TCLASS, bad), Err(Errno::EINVAL));
        }
        assert_eq!(
            set(&mut o, false, SOL_IP, IP_TTL, &0i32.to_le_bytes()),
            Err(Errno::EINVAL)
        );
        assert_eq!(set(&mut o, false, SOL_IP, IP_TTL, &[]), Err(Errno::EINVAL));
        let v6_on_v4 = set(
            &mut o,
            false,
            SOL_IPV6,
            IPV6_RECVTCLASS,
            &1i32.to_le_bytes(),
        );
        assert_eq!(v6_on_v4, Err(ENOPROTOOPT));
        assert_eq!(
            get(&o, false, SOL_IPV6, IPV6_TCLASS),
            Err(Errno::EOPNOTSUPP)
        );
        assert_eq!(o, IpOptions::default());
    }

    #[test]
    fn send_messages_override_one_datagram() {
        let two = 2i32.to_le_bytes();
        let default = (-1i32).to_le_bytes();
        let messages = [
            int_message(SOL_IPV6, IPV6_TCLASS, &default),
            int_message(SOL_IPV6, IPV6_HOPLIMIT, &two),
            int_message(SOL_IP, IP_TTL, &[0; 3]),
        ];
        let out = outgoing(&messages, Route::Ipv6).unwrap();
        assert_eq!((out.hop_limit, out.traffic_class), (Some(2), Some(0xff)));
        let options = IpOptions {
            traffic_class: 4,
            hop_limit: Some(9),
            ..IpOptions::default()
        };
        assert_eq!(sent_fields(&options, Route::Ipv6, &out), (2, 0xff));
        let default_hops = [int_message(SOL_IPV6, IPV6_HOPLIMIT, &default)];
        let out = outgoing(&default_hops, Route::Ipv6).unwrap();
        assert_eq!(sent_fields(&options, Route::Ipv6, &out), (9, 4));
        assert_eq!(
            sent_fields(&options, Route::Ipv6, &Outgoing::default()),
            (9, 4)
        );
        // A message one byte too long, a value out of range: EINVAL.
        let odd = [int_message(
            SOL_IPV6,
            IPV6_TCLASS,
            &[0xff, 0xff, 0xff, 0xff, 0],
        )];
        assert_eq!(outgoing(&odd, Route::Ipv6), Err(Errno::EINVAL));
        let far = 256i32.to_le_bytes();
        let range = [int_message(SOL_IPV6, IPV6_HOPLIMIT, &far)];
        assert_eq!(outgoing(&range, Route::Ipv6), Err(Errno::EINVAL));
        let unknown = [int_message(SOL_IPV6, 1000, &two)];
        assert_eq!(outgoing(&unknown, Route::Ipv6), Err(Errno::EINVAL));
        // SCM_RIGHTS is ignored, an unknown SOL_SOCKET type is not.
        let fds = [int_message(SOL_SOCKET, SCM_RIGHTS, &two)];
        assert_eq!(outgoing(&fds, Route::Ipv6), Ok(Outgoing::default()));
        let unknown = [int_message(SOL_SOCKET, 1000, &two)];
        assert_eq!(outgoing(&unknown, Route::Ipv6), Err(Errno::EINVAL));
        // IPv4's TOS may be a byte; its TTL must be 1 to 255.
        let tos = [int_message(SOL_IP, IP_TOS, &[0x10])];
        let tos = outgoing(&tos, Route::Ipv4 { from_ipv6: false }).unwrap();
        assert_eq!(tos.traffic_class, Some(0x10));
        let zero = [int_message(SOL_IP, IP_TTL, &[0; 4])];
        assert_eq!(
            outgoing(&zero, Route::Ipv4 { from_ipv6: false }),
            Err(Errno::EINVAL)
        );
    }

    #[test]
    fn pktinfo_names_a_local_source_on_the_loopback() {
        let mut info = Ipv6Addr::LOCALHOST.octets().to_vec();
        info.extend_from_slice(&1u32.to_le_bytes());
        let message = [int_message(SOL_IPV6, IPV6_PKTINFO, &info)];
        let out = outgoing(&message, Route::Ipv6).unwrap();
        assert_eq!(out.source, Some(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        info[16] = 7;
        let message = [int_message(SOL_IPV6, IPV6_PKTINFO, &info)];
        assert_eq!(outgoing(&message, Route::Ipv6), Err(ENODEV));
        let mut elsewhere = "2001:db8::1".parse::<Ipv6Addr>().unwrap().octets().to_vec();
        elsewhere.extend_from_slice(&0u32.to_le_bytes());
        let message = [int_message(SOL_IPV6, IPV6_PKTINFO, &elsewhere)];
        assert_eq!(outgoing(&message, Route::Ipv6), Err(Errno::EINVAL));
        let short = [int_message(SOL_IPV6, IPV6_PKTINFO, &info[..19])];
        assert_eq!(outgoing(&short, Route::Ipv6), Err(Errno::EINVAL));
    }

    fn reply_of(options: &IpOptions, ipv6: bool, header: &IpHeader) -> Vec<(i32, i32, Vec<u8>)> {
        use super::super::control::{messages, MessageHeader};
        let mut reply = Reply::new(&MessageHeader {
            name: None,
            iovecs: Vec::new(),
            control: 1,
            controllen: 1024,
        });
        received(options, ipv6, header, &mut reply);
        let mut buffer = vec![0u8; 1024];
        for (at, bytes) in reply.pieces() {
            buffer[*at..*at + bytes.len()].copy_from_slice(bytes);
        }
        buffer.truncate(reply.used());
        messages(&buffer)
            .unwrap()
            .into_iter()
            .map(|m| (m.level, m.kind, m.data.to_vec()))
            .collect()
    }

    #[test]
    fn receives_return_what_was_asked_for_in_linux_order() {
        let header = IpHeader {
            source: "[::1]:5".parse().unwrap(),
            destination: IpAddr::V6(Ipv6Addr::LOCALHOST),
            hop_limit: 2,
            traffic_class: 0x28,
        };
        let mut options = IpOptions::default();
        assert!(reply_of(&options, true, &header).is_empty());
        for name in [IPV6_RECVTCLASS, IPV6_RECVHOPLIMIT, IPV6_RECVPKTINFO] {
            set6(&mut options, name, 1).unwrap();
        }
        let mut pktinfo = Ipv6Addr::LOCALHOST.octets().to_vec();
        pktinfo.extend_from_slice(&1u32.to_le_bytes());
        assert_eq!(
            reply_of(&options, true, &header),
            vec![
                (SOL_IPV6, IPV6_PKTINFO, pktinfo),
                (SOL_IPV6, IPV6_HOPLIMIT, 2i32.to_le_bytes().to_vec()),
                (SOL_IPV6, IPV6_TCLASS, 0x28i32.to_le_bytes().to_vec()),
            ]
        );
        let header = IpHeader {
            source: "127.0.0.1:5".parse().unwrap(),
            destination: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)),
            hop_limit: 64,
            traffic_class: 0x10,
        };
        let mut options = IpOptions::default();
        for name in [IP_RECVTOS, IP_RECVTTL, IP_PKTINFO] {
            set(&mut options, false, SOL_IP, name, &[1]).unwrap();
        }
        assert_eq!(
            reply_of(&options, false, &header),
            vec![
                (
                    SOL_IP,
                    IP_PKTINFO,
                    vec![1, 0, 0, 0, 127, 0, 0, 9, 127, 0, 0, 9]
                ),
                (SOL_IP, IP_TTL, 64i32.to_le_bytes().to_vec()),
                (SOL_IP, IP_TOS, vec![0x10]),
            ]
        );
    }
}
