//! Datagrams inside the VM: the receive queue of a UDP socket on the VM's own loopback, and
//! of an AF_UNIX datagram socket (what comes with the bytes, `E`, differs: the IP header's
//! fields for UDP, the sender's address for AF_UNIX). They never touch a
//! host socket, the policy or the run's network usage; a queue holds at most `QUEUE_BYTES`
//! (each datagram counted with `DATAGRAM_OVERHEAD`, as Linux counts its buffers against the
//! receive buffer) and drops what arrives past that, as Linux does.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

/// A socket's receive queue limit: Linux's default receive buffer.
pub const QUEUE_BYTES: usize = 212_992;
/// What each queued datagram costs beyond its bytes, so empty datagrams fill a queue too.
pub const DATAGRAM_OVERHEAD: usize = 768;

/// What a UDP datagram on the loopback carries besides its bytes: its source, and the fields
/// of its IP header a receiver may ask for as control messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpHeader {
    pub source: SocketAddr,
    /// The address it was sent to (IP_PKTINFO, IPV6_PKTINFO).
    pub destination: IpAddr,
    /// IPv6's hop limit, IPv4's TTL.
    pub hop_limit: u8,
    /// IPv6's traffic class, IPv4's TOS byte.
    pub traffic_class: u8,
}

/// One datagram and what came with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram<E = IpHeader> {
    pub envelope: E,
    pub data: Vec<u8>,
}

/// A socket's queue of datagrams received, oldest first.
#[derive(Debug, Clone)]
pub struct Queue<E = IpHeader> {
    datagrams: VecDeque<Datagram<E>>,
    cost: usize,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Queue {
            datagrams: VecDeque::new(),
            cost: 0,
        }
    }
}

impl<E> Queue<E> {
    /// Whether a datagram of `len` bytes fits now (an empty queue takes any).
    pub fn has_room(&self, len: usize) -> bool {
        self.datagrams.is_empty() || self.cost + len + DATAGRAM_OVERHEAD <= QUEUE_BYTES
    }

    /// Queues `data` with its `envelope`; false when the queue is full and it was dropped.
    pub fn push(&mut self, envelope: E, data: Vec<u8>) -> bool {
        if !self.has_room(data.len()) {
            return false;
        }
        self.cost += data.len() + DATAGRAM_OVERHEAD;
        self.datagrams.push_back(Datagram { envelope, data });
        true
    }

    pub fn front(&self) -> Option<&Datagram<E>> {
        self.datagrams.front()
    }

    pub fn pop(&mut self) -> Option<Datagram<E>> {
        let datagram = self.datagrams.pop_front()?;
        self.cost -= datagram.data.len() + DATAGRAM_OVERHEAD;
        Some(datagram)
    }

    pub fn is_empty(&self) -> bool {
        self.datagrams.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    type Queue = super::Queue<SocketAddr>;

    #[test]
    fn datagrams_come_out_whole_in_order_with_their_source() {
        let mut queue = Queue::default();
        assert!(queue.push(from(1), b"one".to_vec()));
        assert!(queue.push(from(2), Vec::new()));
        assert_eq!(queue.front().map(|d| d.data.as_slice()), Some(&b"one"[..]));
        assert_eq!(
            queue.pop().map(|d| (d.envelope, d.data)),
            Some((from(1), b"one".to_vec()))
        );
        assert_eq!(
            queue.pop().map(|d| (d.envelope, d.data)),
            Some((from(2), Vec::new()))
        );
        assert!(queue.is_empty() && queue.pop().is_none());
    }

    #[test]
    fn a_full_queue_drops_what_arrives_until_it_is_read() {
        let mut queue = Queue::default();
        let size = 60_000;
        let fits = QUEUE_BYTES / (size + DATAGRAM_OVERHEAD);
        for _ in 0..fits {
            assert!(queue.push(from(1), vec![0; size]));
        }
        assert!(!queue.push(from(1), vec![0; size]));
        assert!(!queue.push(from(1), vec![0; QUEUE_BYTES]));
        assert!(!queue.has_room(size));
        queue.pop();
        assert!(queue.has_room(size));
        assert!(queue.push(from(1), vec![0; size]));
        // An empty queue takes even a datagram larger than its limit, as Linux's does.
        let mut empty = Queue::default();
        assert!(empty.push(from(1), vec![0; QUEUE_BYTES]));
    }
}
