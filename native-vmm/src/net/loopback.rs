//! Datagrams inside the VM: the receive queue of a UDP socket on the VM's own loopback, and
//! of an AF_UNIX datagram socket (its source address type `A` differs). They never touch a
//! host socket, the policy or the run's network usage; a queue holds at most `QUEUE_BYTES`
//! (each datagram counted with `DATAGRAM_OVERHEAD`, as Linux counts its buffers against the
//! receive buffer) and drops what arrives past that, as Linux does.

use std::collections::VecDeque;
use std::net::SocketAddr;

/// A socket's receive queue limit: Linux's default receive buffer.
pub const QUEUE_BYTES: usize = 212_992;
/// What each queued datagram costs beyond its bytes, so empty datagrams fill a queue too.
pub const DATAGRAM_OVERHEAD: usize = 768;

/// One datagram and the address it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram<A = SocketAddr> {
    pub from: A,
    pub data: Vec<u8>,
}

/// A socket's queue of datagrams received, oldest first.
#[derive(Debug, Clone)]
pub struct Queue<A = SocketAddr> {
    datagrams: VecDeque<Datagram<A>>,
    cost: usize,
}

impl<A> Default for Queue<A> {
    fn default() -> Self {
        Queue {
            datagrams: VecDeque::new(),
            cost: 0,
        }
    }
}

impl<A> Queue<A> {
    /// Whether a datagram of `len` bytes fits now (an empty queue takes any).
    pub fn has_room(&self, len: usize) -> bool {
        self.datagrams.is_empty() || self.cost + len + DATAGRAM_OVERHEAD <= QUEUE_BYTES
    }

    /// Queues `data` from `from`; false when the queue is full and it was dropped.
    pub fn push(&mut self, from: A, data: Vec<u8>) -> bool {
        if !self.has_room(data.len()) {
            return false;
        }
        self.cost += data.len() + DATAGRAM_OVERHEAD;
        self.datagrams.push_back(Datagram { from, data });
        true
    }

    pub fn front(&self) -> Option<&Datagram<A>> {
        self.datagrams.front()
    }

    pub fn pop(&mut self) -> Option<Datagram<A>> {
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
        assert!(!queue.has_room(size));
        queue.pop();
        assert!(queue.has_room(size));
        assert!(queue.push(from(1), vec![0; size]));
        // An empty queue takes even a datagram larger than its limit, as Linux's does.
        let mut empty = Queue::default();
        assert!(empty.push(from(1), vec![0; QUEUE_BYTES]));
    }
}
