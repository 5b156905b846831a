//! The egress policy: which names a guest may resolve and which (address, port) it may reach.
//!
//! A rule is `host[:ports]`: `host` is a domain (`example.com`, exact), a domain suffix
//! (`*.example.com`: any name below it, not the name itself), an address (`192.0.2.7`,
//! `[2001:db8::7]`) or a CIDR (`192.0.2.0/24`, `[2001:db8::/32]`); `ports` is a port or a range
//! (`443`, `8000-8100`), all ports when absent. An allowlist is a list of rules; a `Policy` is
//! a stack of allowlists (the key's, then each narrowing the call made), and a destination must
//! be allowed by every one of them, so a call can narrow but never widen what its key allows.
//! No allowlist at all means no network.
//!
//! Addresses are checked at every connect and send, on the address actually reached: a domain
//! rule allows the addresses this VM's resolver answered for a name that rule allows, so a name
//! re-pointed after the check (DNS rebinding) reaches nothing new. Some ranges are refused
//! whatever a domain rule says and whatever a wider CIDR says: loopback, link-local (with the
//! cloud metadata addresses), private and shared ranges, multicast and reserved ranges,
//! documentation and benchmark ranges, NAT64, and the host's own addresses. Only a CIDR rule
//! that lies inside such a range (`10.1.2.0/24` for 10/8; the exact /32 or /128 for a host
//! address) names it explicitly and allows it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Rules per allowlist at most.
pub const MAX_RULES: usize = 256;
/// A rule's text at most (a domain is at most 253 bytes).
const MAX_RULE_BYTES: usize = 300;

/// Which host a rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    /// Exactly this name (lower case, no trailing dot).
    Name(String),
    /// Any name below this suffix (stored without the `*.`).
    Below(String),
    /// An address block.
    Cidr(IpAddr, u8),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    host: Host,
    /// Inclusive port range; (0, 65535) when the rule names none.
    ports: (u16, u16),
}

/// A rule that could not be read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRule(pub String);

impl fmt::Display for BadRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A domain name as rules and DNS questions compare them: lower case, no trailing dot, labels
/// of letters, digits, `-` and `_`, 1 to 63 bytes each, 253 at most in all.
pub fn normalize_name(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    valid.then_some(name)
}

fn parse_ports(text: &str) -> Result<(u16, u16), BadRule> {
    let port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|&n| n > 0 && p.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| BadRule(format!("'{p}' is not a port (1-65535)")))
    };
    match text.split_once('-') {
        Some((low, high)) => {
            let (low, high) = (port(low)?, port(high)?);
            if low > high {
                return Err(BadRule(format!("port range {low}-{high} is empty")));
            }
            Ok((low, high))
        }
        None => port(text).map(|p| (p, p)),
    }
}

fn parse_cidr(text: &str) -> Result<Host, BadRule> {
    let (addr, prefix) = match text.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix)),
        None => (text, None),
    };
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| BadRule(format!("'{addr}' is not an IP address")))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => max,
        Some(p) => p
            .parse::<u8>()
            .ok()
            .filter(|&n| n <= max && p.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| BadRule(format!("'/{p}' is not a prefix length (0-{max})")))?,
    };
    if mask(addr, prefix) != addr {
        return Err(BadRule(format!(
            "{text} has bits set past its prefix length"
        )));
    }
    Ok(Host::Cidr(addr, prefix))
}

impl Rule {
    /// Reads one rule (see the module comment).
    pub fn parse(text: &str) -> Result<Rule, BadRule> {
        if text.is_empty() || text.len() > MAX_RULE_BYTES {
            return Err(BadRule(format!("a rule is 1 to {MAX_RULE_BYTES} bytes")));
        }
        // [v6 or v6/prefix] with an optional :ports; a bare v6 CIDR has no ports.
        let (host_text, ports) = if let Some(rest) = text.strip_prefix('[') {
            let (inside, after) = rest
                .split_once(']')
                .ok_or_else(|| BadRule(format!("'{text}': '[' without ']'")))?;
            let ports =
                match after {
                    "" => None,
                    _ => Some(after.strip_prefix(':').ok_or_else(|| {
                        BadRule(format!("'{text}': only ':ports' may follow ']'"))
                    })?),
                };
            if !inside.contains(':') {
                return Err(BadRule(format!("'{inside}' in brackets is not IPv6")));
            }
            (inside, ports)
        } else if text.matches(':').count() > 1 {
            (text, None)
        } else {
            match text.split_once(':') {
                Some((host, ports)) => (host, Some(ports)),
                None => (text, None),
            }
        };
        let ports = ports.map_or(Ok((0, u16::MAX)), parse_ports)?;
        let first = host_text.as_bytes().first().copied().unwrap_or(b'.');
        let host = if host_text.contains(':') || host_text.contains('/') || first.is_ascii_digit() {
            // Names may start with a digit; only an all-numeric-and-dots one is an address.
            if host_text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
                && host_text.bytes().any(|b| b.is_ascii_alphabetic())
            {
                name_rule(host_text)?
            } else {
                parse_cidr(host_text)?
            }
        } else {
            name_rule(host_text)?
        };
        Ok(Rule { host, ports })
    }

    fn allows_port(&self, port: u16) -> bool {
        (self.ports.0..=self.ports.1).contains(&port)
    }

    fn allows_name(&self, name: &str) -> bool {
        match &self.host {
            Host::Name(n) => n == name,
            Host::Below(suffix) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            Host::Cidr(..) => false,
        }
    }
}

fn name_rule(text: &str) -> Result<Host, BadRule> {
    let (below, name) = match text.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let name = normalize_name(name).ok_or_else(|| BadRule(format!("'{text}' is not a domain")))?;
    if name.contains('*') {
        return Err(BadRule(format!("'{text}': '*.' only leads a rule")));
    }
    Ok(if below {
        Host::Below(name)
    } else {
        Host::Name(name)
    })
}

/// `addr` with only its first `prefix` bits kept.
fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}

fn contains(block: (IpAddr, u8), addr: IpAddr) -> bool {
    block.0.is_ipv4() == addr.is_ipv4() && mask(addr, block.1) == block.0
}

/// Blocks refused unless a rule inside them names them (see the module comment).
const SPECIAL_V4: &[([u8; 4], u8)] = &[
    ([0, 0, 0, 0], 8),       // "this network"
    ([10, 0, 0, 0], 8),      // private
    ([100, 64, 0, 0], 10),   // shared (carrier NAT; a metadata address lives here too)
    ([127, 0, 0, 0], 8),     // loopback
    ([169, 254, 0, 0], 16),  // link-local, cloud metadata 169.254.169.254
    ([172, 16, 0, 0], 12),   // private
    ([192, 0, 0, 0], 24),    // IETF protocol assignments
    ([192, 0, 2, 0], 24),    // documentation
    ([192, 88, 99, 0], 24),  // 6to4 relay
    ([192, 168, 0, 0], 16),  // private
    ([198, 18, 0, 0], 15),   // benchmarking
    ([198, 51, 100, 0], 24), // documentation
    ([203, 0, 113, 0], 24),  // documentation
    ([224, 0, 0, 0], 4),     // multicast
    ([240, 0, 0, 0], 4),     // reserved, broadcast
];

const SPECIAL_V6: &[(u128, u8)] = &[
    (0, 128),                     // unspecified
    (1, 128),                     // loopback
    (0xffff_0000_0000, 96),       // IPv4-mapped (checked as IPv4 too)
    (0x0064_ff9b << 96, 96),      // NAT64
    (0x0064_ff9b_0001 << 80, 48), // local NAT64
    (0x0100 << 112, 64),          // discard
    (0x2001 << 112, 23),          // IETF protocol assignments
    (0x2001_0db8 << 96, 32),      // documentation
    (0x2002 << 112, 16),          // 6to4
    (0xfc00 << 112, 7),           // unique local, a metadata address fd00:ec2::254
    (0xfe80 << 112, 10),          // link-local
    (0xff00 << 112, 8),           // multicast
];

/// The refused block `addr` lies in, if any, given the host's own addresses.
fn special_block(addr: IpAddr, host_addresses: &[IpAddr]) -> Option<(IpAddr, u8)> {
    if host_addresses.contains(&addr) {
        return Some((addr, if addr.is_ipv4() { 32 } else { 128 }));
    }
    match addr {
        IpAddr::V4(a) => SPECIAL_V4
            .iter()
            .map(|&(b, p)| (IpAddr::V4(Ipv4Addr::from(b)), p))
            .find(|&block| contains(block, IpAddr::V4(a))),
        IpAddr::V6(a) => SPECIAL_V6
            .iter()
            .map(|&(b, p)| (IpAddr::V6(Ipv6Addr::from(b)), p))
            .find(|&block| contains(block, IpAddr::V6(a))),
    }
}

/// One allowlist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    rules: Vec<Rule>,
}

impl Allowlist {
    /// Reads a list of rules: at most `MAX_RULES`, each as `Rule::parse` reads it.
    pub fn parse<S: AsRef<str>>(rules: &[S]) -> Result<Allowlist, BadRule> {
        if rules.len() > MAX_RULES {
            return Err(BadRule(format!("at most {MAX_RULES} rules")));
        }
        let rules = rules
            .iter()
            .map(|r| Rule::parse(r.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Allowlist { rules })
    }

    fn allows_name(&self, name: &str) -> bool {
        self.rules.iter().any(|r| r.allows_name(name))
    }

    /// Whether `addr:port` is allowed, `names` being what this VM's resolver answered `addr`
    /// for.
    fn allows(&self, addr: IpAddr, port: u16, names: &[String], host: &[IpAddr]) -> bool {
        let special = special_block(addr, host).or_else(|| match addr {
            IpAddr::V6(a) => a
                .to_ipv4_mapped()
                .and_then(|v4| special_block(IpAddr::V4(v4), host)),
            IpAddr::V4(_) => None,
        });
        self.rules.iter().any(|rule| {
            rule.allows_port(port)
                && match (&rule.host, special) {
                    (&Host::Cidr(block, prefix), None) => contains((block, prefix), addr),
                    // Named explicitly: the rule lies inside the refused block.
                    (&Host::Cidr(block, prefix), Some(refused)) => {
                        contains((block, prefix), addr)
                            && prefix >= refused.1
                            && contains(refused, block)
                    }
                    (_, None) => names.iter().any(|n| rule.allows_name(n)),
                    (_, Some(_)) => false,
                }
        })
    }
}

/// The stack of allowlists a run is under (see the module comment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    lists: Vec<Allowlist>,
}

impl Policy {
    /// No network at all.
    pub fn none() -> Policy {
        Policy::default()
    }

    /// Under `lists`, each narrowing the ones before.
    pub fn new(lists: Vec<Allowlist>) -> Policy {
        Policy { lists }
    }

    /// Whether the guest may reach anything at all.
    pub fn is_open(&self) -> bool {
        !self.lists.is_empty()
    }

    /// Whether the VM's resolver looks `name` (normalized) up.
    pub fn allows_name(&self, name: &str) -> bool {
        self.is_open() && self.lists.iter().all(|l| l.allows_name(name))
    }

    /// Whether `addr:port` may be reached; `names` are the allowed names this VM's resolver
    /// answered `addr` for, `host` the host's own addresses.
    pub fn allows(&self, addr: IpAddr, port: u16, names: &[String], host: &[IpAddr]) -> bool {
        self.is_open() && self.lists.iter().all(|l| l.allows(addr, port, names, host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(lists: &[&[&str]]) -> Policy {
        Policy::new(lists.iter().map(|l| Allowlist::parse(l).unwrap()).collect())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn rules_parse_hosts_and_ports_and_refuse_the_rest() {
        assert_eq!(
            Rule::parse("Example.COM.:443").unwrap(),
            Rule {
                host: Host::Name("example.com".into()),
                ports: (443, 443)
            }
        );
        assert_eq!(
            Rule::parse("*.pythonhosted.org").unwrap().host,
            Host::Below("pythonhosted.org".into())
        );
        assert_eq!(
            Rule::parse("10.1.0.0/16:8000-8100").unwrap(),
            Rule {
                host: Host::Cidr(ip("10.1.0.0"), 16),
                ports: (8000, 8100)
            }
        );
        assert_eq!(
            Rule::parse("[2001:db8::/32]:53").unwrap(),
            Rule {
                host: Host::Cidr(ip("2001:db8::"), 32),
                ports: (53, 53)
            }
        );
        assert_eq!(
            Rule::parse("2001:db8::1").unwrap().host,
            Host::Cidr(ip("2001:db8::1"), 128)
        );
        assert_eq!(
            Rule::parse("1.2.3.4").unwrap().host,
            Host::Cidr(ip("1.2.3.4"), 32)
        );
        assert_eq!(
            Rule::parse("3com.example").unwrap().host,
            Host::Name("3com.example".into())
        );
        for bad in [
            "",
            "a..b",
            "*.",
            "a.*.b",
            "ex ample.com",
            "example.com:0",
            "example.com:70000",
            "example.com:443-80",
            "example.com:+80",
            "10.0.0.1/33",
            "10.0.0.1/8",
            "300.1.1.1",
            "[10.0.0.1]:80",
            "[::1",
            "[::1]x",
            &"a".repeat(400),
        ] {
            assert!(Rule::parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(Allowlist::parse(&vec!["a.com"; MAX_RULES + 1]).is_err());
    }

    #[test]
    fn no_allowlist_is_no_network() {
        let none = Policy::none();
        assert!(!none.allows_name("example.com"));
        assert!(!none.allows(ip("93.184.216.34"), 80, &[], &[]));
        let empty = policy(&[&[]]);
        assert!(!empty.allows(ip("93.184.216.34"), 80, &[], &[]));
    }

    #[test]
    fn names_exact_and_below() {
        let p = policy(&[&["example.com", "*.pythonhosted.org"]]);
        assert!(p.allows_name("example.com"));
        assert!(!p.allows_name("www.example.com"));
        assert!(p.allows_name("files.pythonhosted.org"));
        assert!(!p.allows_name("pythonhosted.org"));
        assert!(!p.allows_name("evilpythonhosted.org"));
    }

    #[test]
    fn addresses_need_a_rule_and_a_port() {
        let p = policy(&[&["93.184.216.0/24:443", "example.com:80"]]);
        assert!(p.allows(ip("93.184.216.34"), 443, &[], &[]));
        assert!(!p.allows(ip("93.184.216.34"), 80, &[], &[]));
        assert!(!p.allows(ip("93.184.217.1"), 443, &[], &[]));
        // A domain rule allows what the resolver answered for its name, on its ports.
        let names = vec!["example.com".to_owned()];
        assert!(p.allows(ip("198.51.99.1"), 80, &names, &[]));
        assert!(!p.allows(ip("198.51.99.1"), 443, &names, &[]));
        assert!(!p.allows(ip("198.51.99.1"), 80, &[], &[]));
    }

    #[test]
    fn special_ranges_need_a_rule_inside_them() {
        let wide = policy(&[&["0.0.0.0/0", "::/0", "*.example.com"]]);
        let rebound = vec!["a.example.com".to_owned()];
        for addr in [
            "127.0.0.1",
            "169.254.169.254",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "100.100.100.200",
            "224.0.0.1",
            "255.255.255.255",
            "0.0.0.0",
            "::1",
            "::",
            "fe80::1",
            "fd00:ec2::254",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(!wide.allows(ip(addr), 80, &rebound, &[]), "{addr}");
        }
        assert!(wide.allows(ip("93.184.216.34"), 80, &[], &[]));
        // The host's own addresses: only the exact address named.
        let host = [ip("203.0.114.9")];
        assert!(!wide.allows(ip("203.0.114.9"), 80, &[], &host));
        let exact = policy(&[&["203.0.114.9"]]);
        assert!(exact.allows(ip("203.0.114.9"), 80, &[], &host));
        // Named inside: allowed, and only what was named.
        let named = policy(&[&["10.1.2.0/24:80", "169.254.169.254/32"]]);
        assert!(named.allows(ip("10.1.2.3"), 80, &[], &[]));
        assert!(!named.allows(ip("10.1.3.3"), 80, &[], &[]));
        assert!(!named.allows(ip("10.1.2.3"), 81, &[], &[]));
        assert!(named.allows(ip("169.254.169.254"), 80, &[], &[]));
        assert!(!policy(&[&["10.0.0.0/7"]]).allows(ip("10.1.2.3"), 80, &[], &[]));
    }

    #[test]
    fn every_allowlist_must_allow() {
        let p = policy(&[
            &["*.example.com", "10.0.0.0/8"],
            &["api.example.com", "10.0.0.5"],
        ]);
        assert!(p.allows_name("api.example.com"));
        assert!(!p.allows_name("www.example.com"));
        assert!(p.allows(ip("10.0.0.5"), 1, &[], &[]));
        assert!(!p.allows(ip("10.0.0.6"), 1, &[], &[]));
        // A call cannot widen: naming what its key does not allow changes nothing.
        let widened = policy(&[&["api.example.com"], &["api.example.com", "10.0.0.5"]]);
        assert!(!widened.allows(ip("10.0.0.5"), 1, &[], &[]));
    }
}
