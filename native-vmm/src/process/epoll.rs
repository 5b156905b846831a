//! An epoll instance's interest list: which fds it watches, for which events, with the
//! program's 64-bit cookie, and for an edge-triggered registration what it last reported.
//! Readiness itself is computed by the syscall layer (syscalls/poll.rs) from the fd table when
//! the program waits.

use std::collections::BTreeMap;

use super::ReadinessMark;
use crate::codec::{DecodeError, Decoder, Encoder};
use crate::errno::Errno;

/// One registration (epoll_ctl ADD/MOD).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    /// EPOLLIN, EPOLLOUT... plus the flags EPOLLONESHOT/EPOLLET as given.
    pub events: u32,
    /// epoll_data, handed back as is.
    pub data: u64,
    /// The open file description the fd referred to when it was added: Linux drops a
    /// registration when that description is closed (`EpollSet::forget`), and one whose fd
    /// now refers to another description (the fd closed, the description still open through
    /// a dup) is stale and never reported.
    pub description: usize,
}

/// What an edge-triggered registration (EPOLLET) last reported: the events, and the mark of
/// its file's readiness then. While the mark is the same nothing happened on the file, and
/// the events reported are not reported again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    pub reported: u32,
    pub mark: ReadinessMark,
}

/// Keyed by fd; fds are below the fd limit, so the list is bounded by it.
#[derive(Debug, Clone, Default)]
pub struct EpollSet {
    interests: BTreeMap<u64, Interest>,
    /// Not kept in snapshots: a restored registration reports what is ready once more.
    edges: BTreeMap<u64, Edge>,
}

impl EpollSet {
    /// EPOLL_CTL_ADD: EEXIST when `fd` is registered (and not stale).
    pub fn add(&mut self, fd: u64, interest: Interest) -> Result<(), Errno> {
        if self
            .interests
            .get(&fd)
            .is_some_and(|old| old.description == interest.description)
        {
            return Err(Errno::EEXIST);
        }
        self.interests.insert(fd, interest);
        self.edges.remove(&fd);
        Ok(())
    }

    /// EPOLL_CTL_MOD: ENOENT when `fd` is not registered for `description`.
    pub fn modify(&mut self, fd: u64, interest: Interest) -> Result<(), Errno> {
        match self.interests.get_mut(&fd) {
            Some(old) if old.description == interest.description => {
                *old = interest;
                self.edges.remove(&fd);
                Ok(())
            }
            _ => Err(Errno::ENOENT),
        }
    }

    /// EPOLL_CTL_DEL: ENOENT when `fd` is not registered for `description`.
    pub fn remove(&mut self, fd: u64, description: usize) -> Result<(), Errno> {
        match self.interests.get(&fd) {
            Some(old) if old.description == description => {
                self.interests.remove(&fd);
                self.edges.remove(&fd);
                Ok(())
            }
            _ => Err(Errno::ENOENT),
        }
    }

    /// The registrations, by fd.
    pub fn interests(&self) -> impl Iterator<Item = (u64, Interest)> + '_ {
        self.interests.iter().map(|(&fd, &interest)| (fd, interest))
    }

    /// Open file description `description` went with its last reference: its registrations
    /// go, as Linux drops them, so a description given its slot later is not taken for it.
    pub fn forget(&mut self, description: usize) {
        self.interests.retain(|_, i| i.description != description);
        let interests = &self.interests;
        self.edges.retain(|fd, _| interests.contains_key(fd));
    }

    /// What the edge-triggered registration of `fd` last reported.
    pub fn edge(&self, fd: u64) -> Option<Edge> {
        self.edges.get(&fd).copied()
    }

    /// The edge-triggered registration of `fd` reported `edge`.
    pub fn reported(&mut self, fd: u64, edge: Edge) {
        self.edges.insert(fd, edge);
    }

    /// Disarms a one-shot registration once it was reported (EPOLLONESHOT): it stays
    /// registered with no events until EPOLL_CTL_MOD.
    pub fn disarm(&mut self, fd: u64, keep: u32) {
        if let Some(interest) = self.interests.get_mut(&fd) {
            interest.events &= keep;
        }
    }

    pub(crate) fn encode_state(&self, e: &mut Encoder) {
        e.len(self.interests.len());
        for (&fd, interest) in &self.interests {
            e.u64(fd);
            e.u32(interest.events);
            e.u64(interest.data);
            e.len(interest.description);
        }
    }

    pub(crate) fn decode_state(d: &mut Decoder, fd_limit: u64) -> Result<EpollSet, DecodeError> {
        let n = d.count(8, "epoll interest count")?;
        let mut interests = BTreeMap::new();
        for _ in 0..n {
            let fd = d.u64("epoll fd")?;
            if fd >= fd_limit {
                return Err(DecodeError::new(format!(
                    "epoll registration of fd {fd}, past the fd limit"
                )));
            }
            let interest = Interest {
                events: d.u32("epoll events")?,
                data: d.u64("epoll data")?,
                description: d.index(usize::MAX, "epoll description")?,
            };
            interests.insert(fd, interest);
        }
        Ok(EpollSet {
            interests,
            edges: BTreeMap::new(),
        })
    }
}
