//! DNS messages (RFC 1035) as the VM's resolver reads and writes them: a guest's question, the
//! answer it gets, the question sent upstream and the upstream answer read back. Every byte of
//! a guest's packet and of an upstream answer is hostile: lengths are checked before each read,
//! compression pointers only point backwards and are followed a bounded number of times, and
//! anything unexpected is a refusal, never a panic.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::policy::normalize_name;

pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
const TYPE_CNAME: u16 = 5;
const CLASS_IN: u16 = 1;
const HEADER: usize = 12;
/// What an answer to the guest holds at most, and the TTL it shows at most (seconds).
const MAX_ANSWERS: usize = 16;
const MAX_TTL: u32 = 300;
/// The size of a UDP DNS message without EDNS.
pub const MAX_UDP_MESSAGE: usize = 512;

/// Response codes.
pub const NOERROR: u8 = 0;
pub const FORMERR: u8 = 1;
pub const SERVFAIL: u8 = 2;
pub const NXDOMAIN: u8 = 3;
pub const NOTIMP: u8 = 4;

/// A guest's question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    pub id: u16,
    /// Recursion desired, echoed in the answer.
    pub rd: bool,
    /// Lower case, no trailing dot; None for a name no rule could allow (its answer is NXDOMAIN).
    pub name: Option<String>,
    pub qtype: u16,
    pub qclass: u16,
    /// The question section as the guest wrote it (echoed in the answer).
    raw: Vec<u8>,
}

/// Why a guest's packet gets no question back: too short to carry an id (dropped), or one
/// that is answered FORMERR / NOTIMP with its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadQuery {
    Drop,
    Answer { id: u16, rcode: u8 },
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Reads the name at `at` in `msg`, following compression pointers (backwards only, at most
/// 32). Returns the name's labels joined with dots and where the name ended in place.
fn read_name(msg: &[u8], mut at: usize) -> Option<(String, usize)> {
    let mut name = String::new();
    let mut end = None;
    let mut jumps = 0;
    loop {
        let len = *msg.get(at)?;
        match len {
            0 => {
                return Some((name, end.unwrap_or(at + 1)));
            }
            1..=63 => {
                let label = msg.get(at + 1..at + 1 + usize::from(len))?;
                if !name.is_empty() {
                    name.push('.');
                }
                // Bytes outside printable ASCII make the name invalid later (normalize_name).
                name.extend(
                    label
                        .iter()
                        .map(|&b| if b.is_ascii_graphic() { b as char } else { ' ' }),
                );
                if name.len() > 255 {
                    return None;
                }
                at += 1 + usize::from(len);
            }
            0xC0..=0xFF => {
                let target = usize::from(u16_at(msg, at)? & 0x3FFF);
                if target >= at || jumps == 32 {
                    return None;
                }
                jumps += 1;
                end.get_or_insert(at + 2);
                at = target;
            }
            _ => return None,
        }
    }
}

/// Reads a guest's query: one question, no answers, a standard query (opcode 0).
pub fn read_question(packet: &[u8]) -> Result<Question, BadQuery> {
    let id = u16_at(packet, 0).ok_or(BadQuery::Drop)?;
    let formerr = BadQuery::Answer { id, rcode: FORMERR };
    if packet.len() < HEADER || packet.len() > MAX_UDP_MESSAGE * 128 {
        return Err(formerr);
    }
    let flags = u16_at(packet, 2).ok_or(formerr)?;
    if flags & 0x8000 != 0 {
        // A response sent to the resolver: not answered.
        return Err(BadQuery::Drop);
    }
    if (flags >> 11) & 0xF != 0 {
        return Err(BadQuery::Answer { id, rcode: NOTIMP });
    }
    // One question, no answer or authority records.
    if [4, 6, 8].map(|at| u16_at(packet, at)) != [Some(1), Some(0), Some(0)] {
        return Err(formerr);
    }
    // Questions carry no compression: labels only.
    let mut at = HEADER;
    loop {
        let len = *packet.get(at).ok_or(formerr)?;
        if len == 0 {
            break;
        }
        if len > 63 {
            return Err(formerr);
        }
        at += 1 + usize::from(len);
    }
    let (name, end) = read_name(packet, HEADER).ok_or(formerr)?;
    let qtype = u16_at(packet, end).ok_or(formerr)?;
    let qclass = u16_at(packet, end + 2).ok_or(formerr)?;
    Ok(Question {
        id,
        rd: flags & 0x0100 != 0,
        name: normalize_name(&name),
        qtype,
        qclass,
        raw: packet[HEADER..end + 4].to_vec(),
    })
}

/// The answer to `q`: `rcode`, and for NOERROR the addresses (those of `q`'s type), each as
/// a record of `q`'s own name.
pub fn answer(q: &Question, rcode: u8, addresses: &[IpAddr], ttl: u32) -> Vec<u8> {
    let records: Vec<&IpAddr> = addresses
        .iter()
        .filter(|_| rcode == NOERROR)
        .filter(|a| match q.qtype {
            TYPE_A => a.is_ipv4(),
            TYPE_AAAA => a.is_ipv6(),
            _ => false,
        })
        .take(MAX_ANSWERS)
        .collect();
    let mut out = Vec::with_capacity(HEADER + q.raw.len() + records.len() * 28);
    out.extend_from_slice(&q.id.to_be_bytes());
    // QR, the opcode 0, RD echoed, RA set.
    let flags = 0x8080 | (u16::from(q.rd) << 8) | u16::from(rcode & 0xF);
    out.extend_from_slice(&flags.to_be_bytes());
    for count in [1, records.len() as u16, 0, 0] {
        out.extend_from_slice(&count.to_be_bytes());
    }
    out.extend_from_slice(&q.raw);
    for addr in records {
        out.extend_from_slice(&0xC00Cu16.to_be_bytes()); // the question's name
        out.extend_from_slice(&q.qtype.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&ttl.min(MAX_TTL).to_be_bytes());
        match addr {
            IpAddr::V4(a) => {
                out.extend_from_slice(&4u16.to_be_bytes());
                out.extend_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                out.extend_from_slice(&16u16.to_be_bytes());
                out.extend_from_slice(&a.octets());
            }
        }
    }
    out
}

/// An answer of `rcode` to a packet that had only an id to echo.
pub fn bare_answer(id: u16, rcode: u8) -> Vec<u8> {
    let mut out = id.to_be_bytes().to_vec();
    out.extend_from_slice(&(0x8080u16 | u16::from(rcode)).to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    out
}

/// The query the resolver sends upstream for `name` (normalized) and `qtype`, with `id`.
pub fn upstream_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut out = id.to_be_bytes().to_vec();
    out.extend_from_slice(&0x0100u16.to_be_bytes()); // RD
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out
}

/// What an upstream answer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamAnswer {
    pub rcode: u8,
    /// The addresses of the asked type, whatever chain of CNAMEs led to them.
    pub addresses: Vec<IpAddr>,
    /// The smallest TTL among them.
    pub ttl: u32,
}

/// Reads an upstream answer to `upstream_query(id, name, qtype)`; None when it is not one
/// (another id, not a response, another question, malformed).
pub fn read_upstream(msg: &[u8], id: u16, name: &str, qtype: u16) -> Option<UpstreamAnswer> {
    if u16_at(msg, 0)? != id {
        return None;
    }
    let flags = u16_at(msg, 2)?;
    if flags & 0x8000 == 0 || u16_at(msg, 4)? != 1 {
        return None;
    }
    let answers = u16_at(msg, 6)?;
    let (asked, mut at) = read_name(msg, HEADER)?;
    if normalize_name(&asked).as_deref() != Some(name)
        || u16_at(msg, at)? != qtype
        || u16_at(msg, at + 2)? != CLASS_IN
    {
        return None;
    }
    at += 4;
    let mut addresses = Vec::new();
    let mut ttl = MAX_TTL;
    for _ in 0..answers {
        let (_, end) = read_name(msg, at)?;
        let (rtype, rclass, rttl) = (
            u16_at(msg, end)?,
            u16_at(msg, end + 2)?,
            u32_at(msg, end + 4)?,
        );
        let len = usize::from(u16_at(msg, end + 8)?);
        let data = msg.get(end + 10..end + 10 + len)?;
        at = end + 10 + len;
        if rclass != CLASS_IN || rtype == TYPE_CNAME || rtype != qtype {
            continue;
        }
        let addr = match (rtype, len) {
            (TYPE_A, 4) => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(data).ok()?)),
            (TYPE_AAAA, 16) => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(data).ok()?)),
            _ => return None,
        };
        if addresses.len() < MAX_ANSWERS {
            addresses.push(addr);
            ttl = ttl.min(rttl);
        }
    }
    Some(UpstreamAnswer {
        rcode: (flags & 0xF) as u8,
        addresses,
        ttl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_reads_and_is_answered_with_its_records() {
        let query = upstream_query(0x1234, "web.example", TYPE_A);
        let q = read_question(&query).unwrap();
        assert_eq!((q.id, q.rd, q.qtype), (0x1234, true, TYPE_A));
        assert_eq!(q.name.as_deref(), Some("web.example"));
        let addrs = ["10.9.8.7".parse().unwrap(), "2001:db8::1".parse().unwrap()];
        let reply = answer(&q, NOERROR, &addrs, 9999);
        let read = read_upstream(&reply, 0x1234, "web.example", TYPE_A).unwrap();
        assert_eq!(read.rcode, NOERROR);
        assert_eq!(read.addresses, vec![addrs[0]]);
        assert_eq!(read.ttl, MAX_TTL);
        let nx = answer(&q, NXDOMAIN, &addrs, 60);
        let read = read_upstream(&nx, 0x1234, "web.example", TYPE_A).unwrap();
        assert_eq!((read.rcode, read.addresses.len()), (NXDOMAIN, 0));
    }

    #[test]
    fn upstream_cname_chains_and_compression_are_followed() {
        // Question www.example A; answers: CNAME to edge.example, then edge.example A.
        let mut msg = upstream_query(7, "www.example", TYPE_A);
        msg[2] = 0x81;
        msg[3] = 0x80;
        msg[7] = 2;
        msg.extend_from_slice(&[0xC0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 7]);
        let edge = msg.len();
        msg.extend_from_slice(&[4, b'e', b'd', b'g', b'e', 0xC0, 16]);
        msg.extend_from_slice(&[0xC0, edge as u8, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 1, 2, 3, 4]);
        let read = read_upstream(&msg, 7, "www.example", TYPE_A).unwrap();
        assert_eq!(read.addresses, vec!["1.2.3.4".parse::<IpAddr>().unwrap()]);
        assert_eq!(read.ttl, 30);
        assert!(
            read_upstream(&msg, 8, "www.example", TYPE_A).is_none(),
            "another id"
        );
        assert!(read_upstream(&msg, 7, "other.example", TYPE_A).is_none());
    }

    #[test]
    fn hostile_packets_are_refused_never_panic() {
        assert_eq!(read_question(&[1]), Err(BadQuery::Drop));
        let formerr = Err(BadQuery::Answer {
            id: 0x0102,
            rcode: FORMERR,
        });
        assert_eq!(read_question(&[1, 2, 0, 0]), formerr);
        let mut two = upstream_query(0x0102, "a.b", TYPE_A);
        two[5] = 2;
        assert_eq!(read_question(&two), formerr);
        // A pointer in a question, a pointer loop, a label past the end.
        let mut ptr = upstream_query(0x0102, "a", TYPE_A);
        ptr[12] = 0xC0;
        ptr[13] = 12;
        assert_eq!(read_question(&ptr), formerr);
        let mut long = upstream_query(0x0102, "a", TYPE_A);
        long[12] = 60;
        assert_eq!(read_question(&long), formerr);
        let mut msg = upstream_query(7, "x", TYPE_A);
        msg[2] = 0x81;
        msg[7] = 1;
        let at = msg.len();
        msg.extend_from_slice(&[0xC0, at as u8]);
        assert!(read_upstream(&msg, 7, "x", TYPE_A).is_none());
        // Opcode other than a query.
        let mut status = upstream_query(3, "a", TYPE_A);
        status[2] |= 0x10;
        assert_eq!(
            read_question(&status),
            Err(BadQuery::Answer {
                id: 3,
                rcode: NOTIMP
            })
        );
        // A name with bytes no rule allows is no name.
        let mut odd = upstream_query(4, "ab", TYPE_A);
        odd[14] = 0;
        assert_eq!(read_question(&odd).unwrap().name, None);
        // Every truncation and every byte flip of a valid message: no panic.
        let mut good = upstream_query(9, "www.example", TYPE_A);
        good[2] = 0x81;
        good[7] = 1;
        good.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 1, 2, 3, 4]);
        for n in 0..good.len() {
            let _ = read_question(&good[..n]);
            let _ = read_upstream(&good[..n], 9, "www.example", TYPE_A);
        }
        for i in 0..good.len() {
            for bit in 0..8 {
                let mut flipped = good.clone();
                flipped[i] ^= 1 << bit;
                let _ = read_question(&flipped);
                let _ = read_upstream(&flipped, 9, "www.example", TYPE_A);
            }
        }
    }
}
