//! The process tree of one sandbox as the system calls see it: every process's ids, parent,
//! process group and session, its exit status once it ended (a zombie until its parent
//! waits), and the signals sent to it while another process runs. Each process runs in a VM
//! of its own (`crate::sandbox`); what is its own besides memory and vCPU (fd numbers, memory
//! map, signal dispositions, threads...) is a `ProcessPart`, swapped into `GuestProcess` while
//! it runs. Descriptions, pipes, sockets, the file system and the captured output are the
//! tree's, shared.

use std::collections::BTreeMap;

use super::signals::{ChildNews, JobReport};
use super::{AddressSpace, Command, FdSlots, MemoryMap, SignalState, Threads};
use crate::fs::Node;

/// Processes alive or unreaped at once, by default: a fork past it is EAGAIN.
pub const DEFAULT_PROCESS_LIMIT: u64 = 64;
/// The largest process limit a tree takes: each process is a KVM VM with its vCPU and host
/// descriptors of its own.
pub const MAX_PROCESS_LIMIT: u64 = 1024;

/// What the tree knows of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessEntry {
    pub ppid: u64,
    pub pgid: u64,
    pub sid: u64,
    /// The wait status once it ended (Linux's encoding: code << 8, or the signal).
    pub exit: Option<u32>,
    /// Signals sent to it while it was not running (bit n-1 for signal n), taken when it next
    /// runs.
    pub signals: u64,
    /// The signal its parent gets when it ends (clone's exit signal; 0: none).
    pub exit_signal: u64,
    /// The signal whose default action ended it.
    pub killed_by: Option<u64>,
    /// The signal it gets when its parent ends (prctl PR_SET_PDEATHSIG; 0: none).
    pub death_signal: u64,
    /// Its RLIMIT_NPROC as (soft, hard), as set (u64::MAX: not lowered); in effect at most
    /// the tree's limit (`ProcessTable::nproc`). A fork copies it to the child.
    pub nproc: (u64, u64),
    /// The signal that stopped it while it is stopped: none of its threads runs.
    pub stopped: Option<u64>,
    /// A stop or continue its parent has not waited for yet (each is reported once).
    pub job_report: Option<JobReport>,
    /// What the SIGCHLD pending for it says: the news of the child that sent it, as Linux
    /// queues one SIGCHLD with its sender's siginfo.
    pub child_news: Option<ChildNews>,
}

#[derive(Debug, Clone)]
pub struct ProcessTable {
    entries: BTreeMap<u64, ProcessEntry>,
    /// The lowest id no process or thread of the tree has had.
    next_id: u64,
    limit: u64,
    /// Children added so far (forks that got a process).
    created: u64,
}

impl ProcessTable {
    /// A tree of process `pid` alone: its own group and session, its parent outside.
    pub fn new(pid: u64) -> ProcessTable {
        let mut entries = BTreeMap::new();
        entries.insert(
            pid,
            ProcessEntry {
                ppid: 0,
                pgid: pid,
                sid: pid,
                exit: None,
                signals: 0,
                exit_signal: 0,
                killed_by: None,
                death_signal: 0,
                nproc: (u64::MAX, u64::MAX),
                stopped: None,
                job_report: None,
                child_news: None,
            },
        );
        ProcessTable {
            entries,
            next_id: pid + 1,
            limit: DEFAULT_PROCESS_LIMIT,
            created: 0,
        }
    }

    /// Processes alive or unreaped at once (the tree's first included): a fork past it is
    /// EAGAIN. From 1 to `MAX_PROCESS_LIMIT`.
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit.clamp(1, MAX_PROCESS_LIMIT);
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Children added since the tree began (it only grows).
    pub fn created(&self) -> u64 {
        self.created
    }

    pub fn get(&self, pid: u64) -> Option<&ProcessEntry> {
        self.entries.get(&pid)
    }

    pub fn get_mut(&mut self, pid: u64) -> Option<&mut ProcessEntry> {
        self.entries.get_mut(&pid)
    }

    /// Processes alive or unreaped.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Processes that have not ended.
    pub fn alive(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries
            .iter()
            .filter(|(_, e)| e.exit.is_none())
            .map(|(&pid, _)| pid)
    }

    pub fn pids(&self) -> impl Iterator<Item = (u64, &ProcessEntry)> + '_ {
        self.entries.iter().map(|(&pid, e)| (pid, e))
    }

    /// Ids are shared by processes and threads: `used` (a thread table's next id) is taken.
    pub fn note_ids_used(&mut self, used: u64) {
        self.next_id = self.next_id.max(used);
    }

    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Process `pid`'s RLIMIT_NPROC in effect as (soft, hard): what it set, at most the
    /// tree's limit.
    pub fn nproc(&self, pid: u64) -> (u64, u64) {
        let (soft, hard) = self
            .entries
            .get(&pid)
            .map_or((u64::MAX, u64::MAX), |e| e.nproc);
        (soft.min(self.limit), hard.min(self.limit))
    }

    /// A new child of `parent` in its group and session, with the first id no thread or
    /// process had (past `used`, the running thread table's next id); None at the tree's
    /// limit or the parent's RLIMIT_NPROC (processes alive or unreaped, as Linux counts a
    /// user's). Ids are never given twice, so an id names one process for the tree's life.
    pub fn add_child(&mut self, parent: u64, used: u64, exit_signal: u64) -> Option<u64> {
        let (soft, _) = self.nproc(parent);
        if self.entries.len() as u64 >= soft {
            return None;
        }
        let (pgid, sid, nproc) = self
            .entries
            .get(&parent)
            .map_or((parent, parent, (u64::MAX, u64::MAX)), |e| {
                (e.pgid, e.sid, e.nproc)
            });
        let pid = self.next_id.max(used);
        self.next_id = pid + 1;
        self.created += 1;
        self.entries.insert(
            pid,
            ProcessEntry {
                ppid: parent,
                pgid,
                sid,
                exit: None,
                signals: 0,
                exit_signal,
                killed_by: None,
                death_signal: 0,
                nproc,
                stopped: None,
                job_report: None,
                child_news: None,
            },
        );
        Some(pid)
    }

    /// `pid` ended with wait status `status`: it stays a zombie until its parent waits. Its
    /// children go to `reaper`, as Linux gives orphans to init; those that asked for a signal
    /// when their parent ends (PR_SET_PDEATHSIG) get it.
    pub fn ended(&mut self, pid: u64, status: u32, reaper: u64) {
        if let Some(entry) = self.entries.get_mut(&pid) {
            entry.exit = Some(status);
        }
        for entry in self.entries.values_mut() {
            if entry.ppid == pid {
                entry.ppid = reaper;
                if entry.death_signal != 0 && entry.exit.is_none() {
                    entry.signals |= 1 << (entry.death_signal - 1);
                }
            }
        }
    }

    /// Whether process group `pgid` is orphaned, as POSIX defines it: no live member has a
    /// parent in another group of the same session (a parent outside the tree, as init's
    /// children, connects none). A stop by a terminal's signals is discarded there.
    pub fn group_orphaned(&self, pgid: u64) -> bool {
        !self
            .entries
            .values()
            .filter(|e| e.pgid == pgid && e.exit.is_none())
            .any(|e| {
                self.entries
                    .get(&e.ppid)
                    .is_some_and(|parent| parent.pgid != pgid && parent.sid == e.sid)
            })
    }

    /// Removes a reaped zombie.
    pub fn reap(&mut self, pid: u64) -> Option<ProcessEntry> {
        self.entries.remove(&pid)
    }

    /// Every process but `keep`: the run ends.
    pub fn keep_only(&mut self, keep: u64) {
        self.entries.retain(|&pid, _| pid == keep);
    }
}

/// What a process has of its own besides its memory and vCPU, parked while another process of
/// the tree runs (see `GuestProcess::exchange_part`).
#[derive(Clone)]
pub struct ProcessPart {
    pub(crate) pid: u64,
    pub(crate) fd_slots: FdSlots,
    pub(crate) cwd: Node,
    pub(crate) memory: MemoryMap,
    pub(crate) signals: SignalState,
    pub(crate) umask: u32,
    pub(crate) nice: i32,
    pub(crate) threads: Threads,
    pub(crate) command: Command,
    pub(crate) space: AddressSpace,
}

/// Linux's wait status of a process that exited with `code`.
pub fn exited_status(code: i32) -> u32 {
    (code.cast_unsigned() & 0xff) << 8
}

/// Linux's wait status of a process that a signal ended.
pub fn signalled_status(sig: u64) -> u32 {
    (sig as u32) & 0x7f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_take_ids_past_every_thread_and_orphans_go_to_the_reaper() {
        let mut tree = ProcessTable::new(1);
        let a = tree.add_child(1, 5, 17).unwrap();
        assert_eq!(a, 5, "past the ids threads took");
        let b = tree.add_child(a, 0, 17).unwrap();
        assert_eq!(b, 6);
        assert_eq!(tree.get(b).unwrap().pgid, 1);
        tree.ended(a, exited_status(3), 1);
        assert_eq!(tree.get(a).unwrap().exit, Some(3 << 8));
        assert_eq!(tree.get(b).unwrap().ppid, 1);
        assert_eq!(tree.alive().collect::<Vec<_>>(), [1, b]);
        assert!(tree.reap(a).is_some());
        assert_eq!(tree.created(), 2);
        tree.set_limit(2);
        assert_eq!(tree.add_child(1, 0, 17), None, "at the limit");
        assert_eq!(tree.created(), 2, "a refused fork adds nothing");
        tree.set_limit(0);
        assert_eq!(tree.limit(), 1, "the tree's first process always fits");
        tree.set_limit(8);
        tree.get_mut(1).unwrap().nproc = (u64::MAX, 6);
        assert_eq!(tree.nproc(1), (8, 6), "in effect at most the tree's limit");
        tree.get_mut(1).unwrap().nproc = (2, 6);
        assert_eq!(
            tree.add_child(1, 0, 17),
            None,
            "two processes: at the soft limit"
        );
        tree.get_mut(1).unwrap().nproc = (3, 6);
        let c = tree.add_child(1, 0, 17).unwrap();
        assert_eq!(tree.get(c).unwrap().nproc, (3, 6), "the child inherits it");
        assert_eq!(tree.add_child(c, 0, 17), None, "and is held to it");
        assert!(c > b, "ids are never given twice");
        tree.set_limit(u64::MAX);
        assert_eq!(tree.limit(), MAX_PROCESS_LIMIT);
    }

    #[test]
    fn a_group_is_orphaned_when_no_member_has_a_parent_in_another_group_of_its_session() {
        let mut tree = ProcessTable::new(1);
        assert!(
            tree.group_orphaned(1),
            "the first process's parent is outside"
        );
        let job = tree.add_child(1, 0, 17).unwrap();
        let member = tree.add_child(job, 0, 17).unwrap();
        assert!(tree.group_orphaned(1), "every parent in the group itself");
        for pid in [job, member] {
            tree.get_mut(pid).unwrap().pgid = job;
        }
        assert!(!tree.group_orphaned(job), "the job's parent is in group 1");
        tree.get_mut(job).unwrap().sid = job;
        tree.get_mut(member).unwrap().sid = job;
        assert!(
            tree.group_orphaned(job),
            "a parent in another session connects none"
        );
        tree.get_mut(job).unwrap().sid = 1;
        tree.get_mut(member).unwrap().sid = 1;
        tree.ended(job, exited_status(0), 1);
        assert!(
            !tree.group_orphaned(job),
            "the member's new parent, 1, is in another group of its session"
        );
    }
}
