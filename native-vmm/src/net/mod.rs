//! Network egress: guest Internet sockets carried onto host sockets the VMM opens itself,
//! under a policy (`policy.rs`), with names resolved by the VMM (`dns.rs`).
//!
//! - `host.rs`: the host sockets (non-blocking; the guest's blocking is the scheduler's).
//! - `loopback.rs`: the receive queues of UDP sockets talking on the VM's own loopback.
//! - `policy.rs`: allowlists of names, addresses and ports; the ranges always refused.
//! - `dns.rs`: DNS messages. The guest's /etc/resolv.conf names `RESOLVER` (127.0.0.53, on the
//!   VM's own loopback); a UDP packet to it never leaves the VMM: the question is read, a name
//!   the policy does not allow is answered NXDOMAIN, an allowed one is asked of the host's
//!   resolver (`HostConfig::upstream`) with a question of the VMM's own making, and only its
//!   addresses come back (as records of the asked name).
//!
//! `Network` is one run's state: the policy and limits it runs under, what it used, and the
//! addresses the resolver answered for allowed names (which domain rules then allow).

pub mod dns;
pub mod host;
pub mod loopback;
pub mod policy;

use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

pub use host::HostSocket;
pub use policy::{Allowlist, BadRule, Policy};

/// The VM's resolver: UDP port 53 at this address of the VM's loopback.
pub const RESOLVER: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 53)), 53);
/// DNS lookups one socket may have going at once (glibc asks A and AAAA together).
pub const MAX_LOOKUPS: usize = 8;
/// Answers the resolver keeps for a socket that does not read them.
pub const MAX_ANSWERS_QUEUED: usize = 16;
/// Addresses remembered per run as answers for allowed names.
const MAX_RESOLVED: usize = 4096;

/// What the host gives every VM's network: set once by the daemon (or `run`) at start.
#[derive(Debug, Clone, Default)]
pub struct HostConfig {
    /// The DNS server allowed names are asked of (the host's first nameserver by default).
    pub upstream: Option<SocketAddr>,
    /// The host's own addresses: refused unless named exactly.
    pub own_addresses: Vec<IpAddr>,
}

static HOST: OnceLock<HostConfig> = OnceLock::new();

/// Sets the host's network configuration (once; later calls change nothing).
pub fn configure(config: HostConfig) {
    let _ = HOST.set(config);
}

/// The configuration `configure` set, or none (no upstream resolver, no own addresses known)
/// until it is set: reading it never fixes it, so a run before `configure` does not keep a
/// later `configure` from taking effect.
pub fn host_config() -> &'static HostConfig {
    static UNSET: HostConfig = HostConfig {
        upstream: None,
        own_addresses: Vec::new(),
    };
    HOST.get().unwrap_or(&UNSET)
}

/// The first `nameserver` of a resolv.conf's text.
pub fn nameserver_of(resolv_conf: &str) -> Option<SocketAddr> {
    resolv_conf.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("nameserver"))
            .then(|| words.next()?.parse::<IpAddr>().ok())
            .flatten()
            .map(|ip| SocketAddr::new(ip, 53))
    })
}

/// `addr` with an IPv4-mapped IPv6 address read as the IPv4 address it is.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => addr,
        },
        SocketAddr::V4(_) => addr,
    }
}

/// A run's network limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections (TCP sockets carried to the host) open at once.
    pub connections: u32,
    /// Bytes in plus out the run may move (payload, as the guest sent and received it).
    pub bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections: 32,
            bytes: 256 << 20,
        }
    }
}

/// What a request grants its run: the policy and the limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    pub policy: Policy,
    pub limits: Limits,
}

/// What a run used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Connections made (TCP) and UDP destinations first sent to.
    pub connections: u64,
    /// Connects, sends and DNS questions the policy refused.
    pub refused: u64,
    pub dns_queries: u64,
}

/// One run's network state (see the module comment).
#[derive(Debug, Clone, Default)]
pub struct Network {
    grant: Grant,
    pub usage: Usage,
    /// Address -> the allowed names the resolver answered it for.
    resolved: BTreeMap<IpAddr, Vec<String>>,
}

impl Network {
    /// Starts a run (an execution, or a session's cell) under `grant`, its usage from zero.
    /// What the resolver answered before is forgotten: each run's policy speaks for itself.
    pub fn start(&mut self, grant: Grant) {
        self.grant = grant;
        self.usage = Usage::default();
        self.resolved.clear();
    }

    pub fn limits(&self) -> Limits {
        self.grant.limits
    }

    /// Bytes the run may still move.
    pub fn bytes_left(&self) -> u64 {
        self.grant
            .limits
            .bytes
            .saturating_sub(self.usage.bytes_in + self.usage.bytes_out)
    }

    pub fn allows_name(&self, name: &str) -> bool {
        self.grant.policy.allows_name(name)
    }

    /// Whether `addr` may be reached (or be heard from).
    pub fn allows(&self, addr: &SocketAddr) -> bool {
        let names = self.resolved.get(&addr.ip()).map_or(&[][..], Vec::as_slice);
        self.grant
            .policy
            .allows(addr.ip(), addr.port(), names, &host_config().own_addresses)
    }

    /// Whether `addr` may be reached, counting a refusal.
    pub fn check(&mut self, addr: &SocketAddr) -> bool {
        let allowed = self.allows(addr);
        if !allowed {
            self.usage.refused += 1;
        }
        allowed
    }

    /// The resolver answered `addresses` for allowed `name`.
    pub fn remember(&mut self, name: &str, addresses: &[IpAddr]) {
        for &addr in addresses {
            if self.resolved.len() >= MAX_RESOLVED && !self.resolved.contains_key(&addr) {
                return;
            }
            let names = self.resolved.entry(addr).or_default();
            if !names.iter().any(|n| n == name) && names.len() < 16 {
                names.push(name.to_owned());
            }
        }
    }
}

/// Where a guest stream socket's connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connection {
    /// Not connected (a datagram socket, or a stream one before connect).
    None,
    /// The TCP handshake goes on; `waiting`: a blocking connect waits for it.
    Connecting {
        waiting: bool,
    },
    Connected,
}

/// A DNS question the resolver asked upstream for a guest socket.
#[derive(Debug, Clone)]
pub struct Lookup {
    pub upstream: Arc<HostSocket>,
    pub id: u16,
    pub question: dns::Question,
    pub name: String,
    /// When it is answered SERVFAIL if no answer came.
    pub deadline: Instant,
}

/// A datagram socket's IP-level options (IPPROTO_IP, IPPROTO_IPV6): what the datagrams it
/// sends carry, and which control messages its receives return. IPv4's fields serve the
/// datagrams it sends over IPv4 (an AF_INET6 socket's to IPv4-mapped addresses too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IpOptions {
    /// IP_TTL (None: the route's default).
    pub ttl: Option<u8>,
    /// IP_TOS.
    pub tos: u8,
    /// IPV6_UNICAST_HOPS (None: the route's default).
    pub hop_limit: Option<u8>,
    /// IPV6_TCLASS.
    pub traffic_class: u8,
    /// The control messages asked for (IP_RECVTTL, IPV6_RECVHOPLIMIT...), one bit each.
    pub receive: u16,
}

/// A guest AF_INET/AF_INET6 socket whose traffic leaves the VM (`Object::Inet`).
#[derive(Debug, Clone)]
pub struct InetSocket {
    pub ipv6: bool,
    pub stream: bool,
    /// A UDP-Lite datagram socket: it stays on the VM's loopback, with ports of its own.
    pub lite: bool,
    /// The host socket, once the guest connected or first sent.
    pub host: Option<Arc<HostSocket>>,
    pub connection: Connection,
    /// The address a datagram socket is connected to (send without one goes there).
    pub peer: Option<SocketAddr>,
    /// The address bind gave it (reported until a host socket has one).
    pub bound: Option<SocketAddr>,
    /// Answers of the VM's resolver waiting to be read.
    pub answers: VecDeque<Vec<u8>>,
    pub lookups: Vec<Lookup>,
    /// Datagrams other sockets of the VM sent it on the loopback.
    pub inbox: loopback::Queue,
    pub ip: IpOptions,
    /// A datagram it sent while connected found no socket at its loopback port: the next
    /// send or receive fails ECONNREFUSED (Linux's ICMP error, reported once).
    pub refused: bool,
    pub shut_read: bool,
    pub shut_write: bool,
}

impl InetSocket {
    pub fn new(ipv6: bool, stream: bool) -> InetSocket {
        InetSocket {
            ipv6,
            stream,
            lite: false,
            host: None,
            connection: Connection::None,
            peer: None,
            bound: None,
            answers: VecDeque::new(),
            lookups: Vec::new(),
            inbox: loopback::Queue::default(),
            ip: IpOptions::default(),
            refused: false,
            shut_read: false,
            shut_write: false,
        }
    }

    /// A TCP connection is open on the host (counted against `Limits::connections`).
    pub fn is_connection(&self) -> bool {
        self.stream && self.host.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_before_configure_does_not_keep_it_from_taking_effect() {
        assert_eq!(host_config().upstream, None);
        // Loopback: nothing in these tests asks the resolver, and a packet would stay local.
        let upstream: SocketAddr = "127.0.0.1:1".parse().unwrap();
        configure(HostConfig {
            upstream: Some(upstream),
            own_addresses: Vec::new(),
        });
        assert_eq!(host_config().upstream, Some(upstream));
    }
}
