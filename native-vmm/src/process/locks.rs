//! Advisory file locks between the tree's processes: flock(2)'s whole-file locks, owned by an
//! open file description, and fcntl(2)'s byte-range record locks, owned by a process (F_SETLK)
//! or by a description (F_OFD_SETLK). The two kinds are apart, as on Linux: a flock never
//! conflicts with a record lock. Locks are plain data beside the fd table; the syscall layer
//! decides what to wait for.

use std::collections::HashMap;

use crate::fs::Node;

/// Who holds a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockOwner {
    /// A process (fcntl F_SETLK): its locks on a file go when it closes any fd of that file.
    Process(u64),
    /// An open file description, by its index in the fd table (flock, F_OFD_SETLK): its
    /// locks go with its last reference.
    Description(usize),
}

/// Shared (read) or exclusive (write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    Read,
    Write,
}

/// Bytes [start, end) of a file as `owner` asks for them (end u64::MAX: to the end, however
/// far).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockRange {
    pub node: Node,
    pub owner: LockOwner,
    pub start: u64,
    pub end: u64,
}

/// One lock held on bytes [start, end) of a file (end u64::MAX: to the end, however far).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub owner: LockOwner,
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
}

impl Held {
    fn conflicts(&self, asked: LockRange, kind: LockKind) -> bool {
        self.owner != asked.owner
            && self.start < asked.end
            && asked.start < self.end
            && (self.kind == LockKind::Write || kind == LockKind::Write)
    }
}

/// The locks held on every file, by node.
#[derive(Debug, Clone, Default)]
pub struct FileLocks {
    /// flock's locks (each covers the whole file).
    whole: HashMap<Node, Vec<Held>>,
    /// fcntl's record locks.
    records: HashMap<Node, Vec<Held>>,
}

impl FileLocks {
    /// Whether no lock is held on any file.
    pub fn is_empty(&self) -> bool {
        self.whole.is_empty() && self.records.is_empty()
    }

    /// flock: takes (or converts to) `kind`, or lets go with None. Err carries the lock in the
    /// way, and nothing changes then.
    pub fn flock(
        &mut self,
        node: Node,
        owner: LockOwner,
        kind: Option<LockKind>,
    ) -> Result<(), Held> {
        let whole = LockRange {
            node,
            owner,
            start: 0,
            end: u64::MAX,
        };
        set(&mut self.whole, whole, kind)
    }

    /// fcntl's F_SETLK: takes `kind` over the range in place of what its owner held there
    /// (splitting its locks around the range), or lets the range go with None.
    pub fn set_record(&mut self, asked: LockRange, kind: Option<LockKind>) -> Result<(), Held> {
        set(&mut self.records, asked, kind)
    }

    /// fcntl's F_GETLK: the first record lock that would stop the range's owner taking `kind`.
    pub fn record_conflict(&self, asked: LockRange, kind: LockKind) -> Option<Held> {
        conflict(&self.records, asked, kind)
    }

    /// Lets go of everything `owner` holds (a description's last reference went, or a
    /// process ended).
    pub fn release_owner(&mut self, owner: LockOwner) {
        for map in [&mut self.whole, &mut self.records] {
            map.retain(|_, held| {
                held.retain(|h| h.owner != owner);
                !held.is_empty()
            });
        }
    }

    /// Lets go of process `pid`'s record locks on `node` (it closed an fd of that file).
    pub fn release_process_records(&mut self, pid: u64, node: Node) {
        if let Some(held) = self.records.get_mut(&node) {
            held.retain(|h| h.owner != LockOwner::Process(pid));
            if held.is_empty() {
                self.records.remove(&node);
            }
        }
    }
}

fn conflict(map: &HashMap<Node, Vec<Held>>, asked: LockRange, kind: LockKind) -> Option<Held> {
    map.get(&asked.node)?
        .iter()
        .find(|h| h.conflicts(asked, kind))
        .copied()
}

fn set(
    map: &mut HashMap<Node, Vec<Held>>,
    asked: LockRange,
    kind: Option<LockKind>,
) -> Result<(), Held> {
    if let Some(kind) = kind {
        if let Some(blocker) = conflict(map, asked, kind) {
            return Err(blocker);
        }
    }
    let LockRange {
        node,
        owner,
        start,
        end,
    } = asked;
    let held = map.entry(node).or_default();
    let mut kept = Vec::with_capacity(held.len() + 2);
    for h in held.drain(..) {
        if h.owner != owner || h.end <= start || end <= h.start {
            kept.push(h);
            continue;
        }
        if h.start < start {
            kept.push(Held { end: start, ..h });
        }
        if end < h.end {
            kept.push(Held { start: end, ..h });
        }
    }
    if let Some(kind) = kind {
        kept.push(Held {
            owner,
            kind,
            start,
            end,
        });
    }
    if kept.is_empty() {
        map.remove(&node);
    } else {
        *held = kept;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::Vfs;

    const A: LockOwner = LockOwner::Process(1);
    const B: LockOwner = LockOwner::Process(2);

    #[test]
    fn readers_share_and_a_writer_excludes() {
        let mut locks = FileLocks::default();
        let file = Vfs::pts_node(0);
        let d = |i| LockOwner::Description(i);
        assert_eq!(locks.flock(file, d(1), Some(LockKind::Read)), Ok(()));
        assert_eq!(locks.flock(file, d(2), Some(LockKind::Read)), Ok(()));
        let blocker = locks.flock(file, d(3), Some(LockKind::Write)).unwrap_err();
        assert_eq!(blocker.owner, d(1));
        // A conversion by a holder is not stopped by its own lock, only by the others'.
        assert!(locks.flock(file, d(1), Some(LockKind::Write)).is_err());
        assert_eq!(locks.flock(file, d(2), None), Ok(()));
        assert_eq!(locks.flock(file, d(1), Some(LockKind::Write)), Ok(()));
        // Record locks are another kind: a whole-file flock does not stop them.
        let all = LockRange {
            node: file,
            owner: A,
            start: 0,
            end: u64::MAX,
        };
        assert_eq!(locks.set_record(all, Some(LockKind::Write)), Ok(()));
        locks.release_owner(d(1));
        assert_eq!(locks.flock(file, d(3), Some(LockKind::Write)), Ok(()));
    }

    #[test]
    fn record_locks_split_and_conflict_by_range() {
        let mut locks = FileLocks::default();
        let file = Vfs::pts_node(0);
        let bytes = |owner, start, end| LockRange {
            node: file,
            owner,
            start,
            end,
        };
        locks
            .set_record(bytes(A, 0, 100), Some(LockKind::Write))
            .unwrap();
        // Unlocking the middle leaves two pieces; the freed bytes are B's to take.
        locks.set_record(bytes(A, 40, 60), None).unwrap();
        assert_eq!(
            locks.set_record(bytes(B, 40, 60), Some(LockKind::Write)),
            Ok(())
        );
        let blocker = locks
            .record_conflict(bytes(B, 50, 70), LockKind::Read)
            .unwrap();
        assert_eq!((blocker.owner, blocker.start, blocker.end), (A, 60, 100));
        assert!(locks
            .record_conflict(bytes(A, 0, 40), LockKind::Read)
            .is_none());
        // Closing a file lets the process's record locks on it go, and only those.
        locks.release_process_records(1, file);
        assert!(locks
            .record_conflict(bytes(B, 0, 40), LockKind::Write)
            .is_none());
        assert!(locks
            .record_conflict(bytes(A, 45, 46), LockKind::Read)
            .is_some());
        locks.release_owner(B);
        assert!(locks.is_empty());
    }
}
