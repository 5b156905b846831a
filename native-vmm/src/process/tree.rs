//! The process tree of one sandbox as the system calls see it: every process's ids, parent,
//! process group and session, its exit status once it ended (a zombie until its parent
//! waits), and the signals sent to it while another process runs. Each process runs in a VM
//! of its own (`crate::sandbox`); what is its own besides memory and vCPU (fd numbers, memory
//! map, signal dispositions, threads...) is a `ProcessPart`, swapped into `GuestProcess` while
//! it runs. Descriptions, pipes, sockets, the file system and the captured output are the
//! tree's, shared.

use std::collections::BTreeMap;
use std::time::Instant;

use super::signals::{ChildNews, JobReport, CLD_CONTINUED, CLD_EXITED, CLD_KILLED, CLD_STOPPED};
use super::{AddressSpace, Command, FdSlots, FdTable, MemoryMap, SignalState, Threads};
use crate::codec::{DecodeError, Decoder, Encoder};
use crate::fs::{Node, Vfs};

/// The highest signal number.
const MAX_SIGNAL: u64 = 64;

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
    /// What its programs that are done used: those before its latest execve, and all of them
    /// once it ended.
    pub used: Usage,
    /// What its reaped children used, each with what its own reaped children used
    /// (getrusage's RUSAGE_CHILDREN).
    pub children_used: Usage,
}

/// The resources a process used, as getrusage and wait4 report them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time: its threads' time on the vCPU and the VMM's answering their calls.
    pub cpu_ns: u64,
    /// The most guest memory it held at once, in bytes.
    pub peak_memory: u64,
}

impl Usage {
    /// Two usages together, as Linux sums a process's and its children's: times add, the peak
    /// is the larger one.
    pub fn with(self, other: Usage) -> Usage {
        Usage {
            cpu_ns: self.cpu_ns.saturating_add(other.cpu_ns),
            peak_memory: self.peak_memory.max(other.peak_memory),
        }
    }
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
                used: Usage::default(),
                children_used: Usage::default(),
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
                used: Usage::default(),
                children_used: Usage::default(),
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

    /// Adds what a program of process `pid` used (one that ended, or that an execve replaced).
    pub fn note_usage(&mut self, pid: u64, usage: Usage) {
        if let Some(entry) = self.entries.get_mut(&pid) {
            entry.used = entry.used.with(usage);
        }
    }

    /// Removes a reaped zombie: what it and its reaped children used goes to its parent's
    /// children's usage, as Linux adds it when a wait reaps.
    pub fn reap(&mut self, pid: u64) -> Option<ProcessEntry> {
        let entry = self.entries.remove(&pid)?;
        if let Some(parent) = self.entries.get_mut(&entry.ppid) {
            parent.children_used = parent
                .children_used
                .with(entry.used.with(entry.children_used));
        }
        Some(entry)
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

// ---- session checkpoints (crate::snapshot::checkpoint): the tree, encoded and checked ----

impl ProcessTable {
    pub(crate) fn encode_state(&self, e: &mut Encoder) {
        e.u64(self.next_id);
        e.u64(self.limit);
        e.u64(self.created);
        e.len(self.entries.len());
        for (&pid, entry) in &self.entries {
            e.u64(pid);
            for v in [entry.ppid, entry.pgid, entry.sid] {
                e.u64(v);
            }
            match entry.exit {
                None => e.u8(0),
                Some(status) => {
                    e.u8(1);
                    e.u32(status);
                }
            }
            for v in [
                entry.signals,
                entry.exit_signal,
                entry.killed_by.unwrap_or(0),
                entry.death_signal,
                entry.nproc.0,
                entry.nproc.1,
                entry.stopped.unwrap_or(0),
            ] {
                e.u64(v);
            }
            match entry.job_report {
                None => e.u8(0),
                Some(JobReport::Stopped(sig)) => {
                    e.u8(1);
                    e.u64(sig);
                }
                Some(JobReport::Continued) => e.u8(2),
            }
            match entry.child_news {
                None => e.u8(0),
                Some(news) => {
                    e.u8(1);
                    e.u32(news.code.cast_unsigned());
                    e.u64(news.pid);
                    e.u32(news.status.cast_unsigned());
                }
            }
            for usage in [entry.used, entry.children_used] {
                e.u64(usage.cpu_ns);
                e.u64(usage.peak_memory);
            }
        }
    }

    /// What `encode_state` wrote, of a tree whose first process is `root` (alive, running, its
    /// parent outside): at most `MAX_PROCESS_LIMIT` processes, in order, every id below the next
    /// one, every other process's parent in the tree, signal numbers at most 64. A tree written
    /// before usage was kept (`with_usage` false) has none: its processes start at zero.
    pub(crate) fn decode_state(
        d: &mut Decoder,
        root: u64,
        with_usage: bool,
    ) -> Result<ProcessTable, DecodeError> {
        let next_id = d.u64("next process id")?;
        let limit = d.u64("process limit")?.clamp(1, MAX_PROCESS_LIMIT);
        let created = d.u64("processes created")?;
        let count = d.count(8, "processes")?;
        if count as u64 > MAX_PROCESS_LIMIT {
            return Err(DecodeError::new(format!(
                "{count} processes, more than {MAX_PROCESS_LIMIT}"
            )));
        }
        let mut entries = BTreeMap::new();
        for _ in 0..count {
            let pid = d.u64("pid")?;
            let (ppid, pgid, sid) = (d.u64("ppid")?, d.u64("pgid")?, d.u64("sid")?);
            let exit = match d.u8("exit")? {
                0 => None,
                1 => Some(d.u32("exit status")?),
                t => return Err(DecodeError::new(format!("exit tag {t}"))),
            };
            let signals = d.u64("pending signals")?;
            let signal = |d: &mut Decoder, what: &str| match d.u64(what)? {
                sig if sig <= MAX_SIGNAL => Ok(sig),
                sig => Err(DecodeError::new(format!("{what} {sig} of process {pid}"))),
            };
            let (exit_signal, killed_by, death_signal) = (
                signal(d, "exit signal")?,
                signal(d, "killing signal")?,
                signal(d, "death signal")?,
            );
            let nproc = (d.u64("nproc")?, d.u64("nproc")?);
            let stopped = signal(d, "stopping signal")?;
            let job_report = match d.u8("job report")? {
                0 => None,
                1 => Some(JobReport::Stopped(signal(d, "reported stop")?)),
                2 => Some(JobReport::Continued),
                t => return Err(DecodeError::new(format!("job report tag {t}"))),
            };
            let child_news = match d.u8("child news")? {
                0 => None,
                1 => Some(ChildNews {
                    code: match d.u32("child news code")?.cast_signed() {
                        code @ (CLD_EXITED | CLD_KILLED | CLD_STOPPED | CLD_CONTINUED) => code,
                        code => return Err(DecodeError::new(format!("child news code {code}"))),
                    },
                    pid: d.u64("child news pid")?,
                    status: d.u32("child news status")?.cast_signed(),
                }),
                t => return Err(DecodeError::new(format!("child news tag {t}"))),
            };
            let mut usage = || -> Result<Usage, DecodeError> {
                if !with_usage {
                    return Ok(Usage::default());
                }
                Ok(Usage {
                    cpu_ns: d.u64("cpu time")?,
                    peak_memory: d.u64("peak memory")?,
                })
            };
            let (used, children_used) = (usage()?, usage()?);
            if pid == 0 || pid >= next_id || entries.keys().next_back().is_some_and(|&p| p >= pid) {
                return Err(DecodeError::new(format!(
                    "process {pid} out of order or past the next id {next_id}"
                )));
            }
            entries.insert(
                pid,
                ProcessEntry {
                    ppid,
                    pgid,
                    sid,
                    exit,
                    signals,
                    exit_signal,
                    killed_by: (killed_by != 0).then_some(killed_by),
                    death_signal,
                    nproc,
                    stopped: (stopped != 0).then_some(stopped),
                    job_report,
                    child_news,
                    used,
                    children_used,
                },
            );
        }
        if !entries
            .get(&root)
            .is_some_and(|e| e.exit.is_none() && e.stopped.is_none() && e.ppid == 0)
        {
            return Err(DecodeError::new(format!(
                "the first process, {root}, is not in the tree alive"
            )));
        }
        if let Some((pid, e)) = entries
            .iter()
            .find(|&(&pid, e)| pid != root && !entries.contains_key(&e.ppid))
        {
            return Err(DecodeError::new(format!(
                "process {pid}'s parent {} is not in the tree",
                e.ppid
            )));
        }
        Ok(ProcessTable {
            entries,
            next_id,
            limit,
            created,
        })
    }
}

impl ProcessPart {
    /// Refuses what a checkpoint cannot hold (an armed interval timer, a thread in a signal
    /// handler); timed waits are kept as the time each has left after `now`.
    pub(crate) fn encode_state(&self, e: &mut Encoder, now: Instant) -> Result<(), &'static str> {
        e.u64(self.pid);
        self.fd_slots.encode_state(e);
        self.cwd.encode_state(e);
        self.memory.encode_state(e);
        self.signals.encode_state(e)?;
        e.u32(self.umask);
        e.u32(self.nice.cast_unsigned());
        self.threads.encode_state_timed(e)?;
        self.threads.encode_timers(e, now);
        self.command.encode_state(e);
        self.space.encode_state(e);
        Ok(())
    }

    /// What `encode_state` wrote; its fds must refer to descriptions of `fds` (the tree's),
    /// its working directory to a node of `vfs`.
    pub(crate) fn decode_state(
        d: &mut Decoder,
        fds: &FdTable,
        vfs: &Vfs,
        now: Instant,
    ) -> Result<ProcessPart, DecodeError> {
        let (pid, fd_slots, cwd, memory, signals, umask, nice) = (
            d.u64("pid")?,
            FdSlots::decode_state(d, fds)?,
            vfs.decode_node(d)?,
            MemoryMap::decode_state(d)?,
            SignalState::decode_state(d)?,
            d.u32("umask")?,
            d.u32("nice")?.cast_signed(),
        );
        let mut threads = Threads::decode_state(d)?;
        threads.decode_timers(d, now)?;
        Ok(ProcessPart {
            pid,
            fd_slots,
            cwd,
            memory,
            signals,
            umask,
            nice,
            threads,
            command: Command::decode_state(d)?,
            space: AddressSpace::decode_state(d)?,
        })
    }
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

    fn usage(cpu_ns: u64, peak_memory: u64) -> Usage {
        Usage {
            cpu_ns,
            peak_memory,
        }
    }

    #[test]
    fn a_reaped_child_adds_its_usage_and_its_reaped_childrens_to_its_parents() {
        let mut tree = ProcessTable::new(1);
        let child = tree.add_child(1, 2, 17).unwrap();
        let grandchild = tree.add_child(child, 0, 17).unwrap();
        let orphan = tree.add_child(child, 0, 17).unwrap();
        tree.note_usage(grandchild, usage(30, 4 << 20));
        tree.ended(grandchild, exited_status(0), 1);
        tree.reap(grandchild);
        assert_eq!(tree.get(child).unwrap().children_used, usage(30, 4 << 20));
        // An execve's earlier program and the last one add up.
        tree.note_usage(child, usage(100, 1 << 20));
        tree.note_usage(child, usage(5, 2 << 20));
        tree.ended(child, exited_status(0), 1);
        assert_eq!(
            tree.get(1).unwrap().children_used,
            Usage::default(),
            "a zombie not reaped yet counts nothing"
        );
        tree.reap(child);
        assert_eq!(tree.get(1).unwrap().children_used, usage(135, 4 << 20));
        // The orphan went to the reaper, which gets its usage when it reaps it.
        tree.note_usage(orphan, usage(1, 9 << 20));
        tree.ended(orphan, exited_status(0), 1);
        tree.reap(orphan);
        assert_eq!(tree.get(1).unwrap().children_used, usage(136, 9 << 20));
        assert_eq!(tree.get(1).unwrap().used, Usage::default());
    }

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

    #[test]
    fn a_tree_written_without_usage_decodes_with_none() {
        let mut tree = ProcessTable::new(1);
        tree.get_mut(1).unwrap().children_used = usage(5, 9);
        let mut e = Encoder::new();
        tree.encode_state(&mut e);
        let mut bytes = e.into_bytes();
        // The one process's usage and its children's are the last four words.
        bytes.truncate(bytes.len() - 32);
        let decoded = ProcessTable::decode_state(&mut Decoder::new(&bytes), 1, false).unwrap();
        assert_eq!(decoded.get(1).unwrap().children_used, Usage::default());
        assert!(ProcessTable::decode_state(&mut Decoder::new(&bytes), 1, true).is_err());
    }

    #[test]
    fn a_decoded_tree_is_the_encoded_one_and_out_of_range_fields_are_refused() {
        let mut tree = ProcessTable::new(1);
        let zombie = tree.add_child(1, 2, 17).unwrap();
        let orphan = tree.add_child(zombie, 0, 17).unwrap();
        tree.note_usage(zombie, usage(7, 3));
        tree.ended(zombie, exited_status(3), 1);
        tree.get_mut(1).unwrap().children_used = usage(5, 9);
        let entry = tree.get_mut(orphan).unwrap();
        entry.stopped = Some(19);
        entry.job_report = Some(JobReport::Stopped(19));
        tree.get_mut(1).unwrap().child_news = Some(ChildNews {
            code: CLD_STOPPED,
            pid: orphan,
            status: 19,
        });
        let mut e = Encoder::new();
        tree.encode_state(&mut e);
        let bytes = e.into_bytes();
        let decoded = ProcessTable::decode_state(&mut Decoder::new(&bytes), 1, true).unwrap();
        assert_eq!(decoded.entries, tree.entries);
        assert_eq!(decoded.get(orphan).unwrap().ppid, 1, "reparented");
        let refused = |at: usize, value: u64, root: u64| {
            let mut damaged = bytes.clone();
            damaged[at..at + 8].copy_from_slice(&value.to_le_bytes());
            ProcessTable::decode_state(&mut Decoder::new(&damaged), root, true)
                .err()
                .map(|e| e.0)
                .unwrap_or_default()
        };
        // Next id, limit, created, count; then process 1: pid, ppid, pgid, sid, no exit (one
        // byte), signals, exit signal, killing signal, death signal, nproc, stopping signal, no
        // job report (a byte), its child news (a byte, code, pid, status), its usage and its
        // children's (two words each); then the zombie.
        assert!(refused(0, 2, 1).contains("past the next id 2"));
        assert!(refused(24, 5000, 1).contains("processes"));
        assert!(refused(89, 65, 1).contains("death signal 65"));
        assert!(refused(171 + 8, 77, 1).contains("parent 77 is not in the tree"));
        assert!(refused(0, tree.next_id(), 9).contains("the first process, 9"));
    }
}
