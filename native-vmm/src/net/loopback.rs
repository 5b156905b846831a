//! UDP on the VM's own loopback: the datagrams waiting in a bound socket's receive queue.
//! They never touch a host socket, the policy or the run's network usage; a queue holds at
//! most `QUEUE_BYTES` (each datagram counted with `DATAGRAM_OVERHEAD`, as Linux counts its
//! buffers against the receive buffer) and drops what arrives past that, as Linux does.

use std::collections::VecDeque;
use std::net::SocketAddr;

/// A socket's receive queue limit: Linux's default receive buffer.
pub const QUEUE_BYTES: usize = 212_992;
/// What each queued datagram costs beyond its bytes, so empty datagrams fill a queue too.
pub const DATAGRAM_OVERHEAD: usize = 768;

/// One datagram and the address it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    pub from: SocketAddr,
    pub data: Vec<u8>,
}

/// A socket's queue of datagrams received on the loopback, oldest first.
#[derive(Debug, Clone, Default)]
pub struct Queue {
    datagrams: VecDeque<Datagram>,
    cost: usize,
}

impl Queue {
    /// Queues `data` from `from`; false when the queue is full and it was dropped.
    pub fn push(&mut self, from: SocketAddr, data: Vec<u8>) -> bool {
        let cost = data.len() + DATAGRAM_OVERHEAD;
        if self.cost + cost > QUEUE_BYTES && !self.datagrams.is_empty() {
            return false;
        }
        self.cost += cost;
        self.datagrams.push_back(Datagram { from, data });
        true
    }

    pub fn front(&self) -> Option<&Datagram> {
        self.datagrams.front()
    }

    pub fn pop(&mut self) -> Option<Datagram> {
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

    #[test]
    fn datagrams_come_out_whole_in_order_with_their_source() {
        let mut queue = Queue::default();
        assert!(queue.push(from(1), b"one".to_vec()));
        assert!(queue.push(from(2), Vec::new()));
        assert_eq!(queue.front().map(|d| d.data.as_slice()), Some(&b"one"[..]));
        assert_eq!(
            queue.pop().map(|d| (d.from, d.data)),
            Some((from(1), b"one".to_vec()))
        );
        assert_eq!(
            queue.pop().map(|d| (d.from, d.data)),
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
        queue.pop();
        assert!(queue.push(from(1), vec![0; size]));
        // An empty queue takes even a datagram larger than its limit, as Linux's does.
        let mut empty = Queue::default();
        assert!(empty.push(from(1), vec![0; QUEUE_BYTES]));
    }
}
