//! What the synthetic /proc's files hold (their names and links: fs/procfs.rs), made from the
//! guest's own state when one is opened, in Linux's formats: the process's status, stat,
//! statm, memory map (what the VMM handed out), command line, environment and limits, and the
//! machine's cpuinfo, meminfo, uptime, loadavg and the kernel values programs probe. Nothing
//! comes from the host's /proc: the machine is the VM (one CPU, the guest's memory).

use std::collections::BTreeMap;
use std::fmt::Write;

use super::misc;
use super::time::{self, CLOCK_BOOTTIME, CLOCK_REALTIME};
use crate::abi::{GUEST_GID, GUEST_UID};
use crate::fs::{Device, FdTarget, Node, ProcNode, ProcessView, SystemFile, TaskFile, Vfs};
use crate::loader::stack_size;
use crate::process::{
    Description, FdTable, GuestProcess, Object, ProcessPart, ProcessTable, Threads,
};

const PAGE: u64 = 4096;
const SIG_IGN: u64 = 1;
/// Linux's clock id for the process's CPU time.
/// USER_HZ: the tick of /proc's times.
const TICKS_PER_SECOND: u64 = 100;

/// The tree's processes as /proc's lookups see them: the running one's fields, and the parts
/// of the others (built from the process's fields, so the file system can be borrowed mutably
/// beside it).
pub(super) struct ProcessFacts<'a> {
    pub pid: u64,
    pub fds: &'a FdTable,
    pub threads: &'a Threads,
    pub cwd: Node,
    pub exe: &'a str,
    pub tree: &'a ProcessTable,
    pub parked: &'a BTreeMap<u64, ProcessPart>,
}

impl<'a> ProcessFacts<'a> {
    pub fn of(proc: &'a GuestProcess) -> ProcessFacts<'a> {
        ProcessFacts {
            pid: proc.pid,
            fds: &proc.fds,
            threads: &proc.threads,
            cwd: proc.cwd,
            exe: &proc.config.command.exe,
            tree: &proc.tree,
            parked: &proc.parked,
        }
    }

    /// Fd `fd` of live process `pid`: its description's index and the description.
    pub fn description(&self, pid: u32, fd: u32) -> Option<(usize, &'a Description)> {
        let slots = self.process(pid)?.map(|p| &p.fd_slots);
        self.fds
            .fds_of(slots)
            .find(|&(open, ..)| open == u64::from(fd))
            .map(|(_, id, desc)| (id, desc))
    }

    /// Live process `pid`: the running one (Some(None)) or a parked one's part.
    fn process(&self, pid: u32) -> Option<Option<&'a ProcessPart>> {
        let pid = u64::from(pid);
        if pid == self.pid {
            return Some(None);
        }
        self.parked.get(&pid).map(Some)
    }
}

impl ProcessView for ProcessFacts<'_> {
    fn current_pid(&self) -> u32 {
        self.pid as u32
    }

    fn current_tid(&self) -> u32 {
        self.threads.current_tid() as u32
    }

    fn pids(&self) -> Vec<u32> {
        self.tree.alive().map(|pid| pid as u32).collect()
    }

    fn tids(&self, pid: u32) -> Vec<u32> {
        let threads = match self.process(pid) {
            Some(Some(part)) => &part.threads,
            Some(None) => self.threads,
            None => return Vec::new(),
        };
        threads.tids().map(|tid| tid as u32).collect()
    }

    fn fds(&self, pid: u32) -> Vec<u32> {
        let Some(part) = self.process(pid) else {
            return Vec::new();
        };
        let slots = part.map(|p| &p.fd_slots);
        self.fds.fds_of(slots).map(|(fd, ..)| fd as u32).collect()
    }

    fn fd_target(&self, pid: u32, fd: u32) -> Option<FdTarget> {
        let (id, desc) = self.description(pid, fd)?;
        // Linux names an anonymous object by its type and inode number; the description's
        // index stands in for the inode.
        Some(match &desc.object {
            Object::Node(node) => FdTarget::Node(*node),
            Object::Stdin | Object::Output(_) | Object::PipeRead(_) | Object::PipeWrite(_) => {
                FdTarget::Anonymous(format!("pipe:[{id}]").into_bytes())
            }
            Object::Socket { .. }
            | Object::Endpoint(_)
            | Object::Inet(_)
            | Object::UnixDatagram(_) => FdTarget::Anonymous(format!("socket:[{id}]").into_bytes()),
            Object::Epoll(_) => FdTarget::Anonymous(b"anon_inode:[eventpoll]".to_vec()),
            Object::EventFd { .. } => FdTarget::Anonymous(b"anon_inode:[eventfd]".to_vec()),
            Object::Pidfd(_) => FdTarget::Anonymous(b"anon_inode:[pidfd]".to_vec()),
            Object::TerminalMaster(_) => FdTarget::Node(Vfs::device_node(Device::Ptmx)),
            Object::TerminalSlave(n) => FdTarget::Node(Vfs::pts_node(*n as u32)),
        })
    }

    fn terminals(&self) -> Vec<u32> {
        self.fds.terminals().map(|(n, _)| n as u32).collect()
    }

    fn cwd(&self, pid: u32) -> Option<Node> {
        Some(self.process(pid)?.map_or(self.cwd, |p| p.cwd))
    }

    fn exe(&self, pid: u32) -> Vec<u8> {
        match self.process(pid) {
            Some(Some(part)) => part.command.exe.as_bytes().to_vec(),
            Some(None) => self.exe.as_bytes().to_vec(),
            None => Vec::new(),
        }
    }
}

/// The bytes of /proc file `node` as the program reads it now (None: not a regular file, or
/// of a process no longer live). Another process's file is made from its own state.
pub(super) fn render(proc: &mut GuestProcess, node: ProcNode) -> Option<Vec<u8>> {
    Some(match node {
        ProcNode::File(file) => system_file(proc, file).into_bytes(),
        // A process's own files are its main thread's, whose tid is its pid.
        ProcNode::Task(pid, tid, file) => proc.as_process(u64::from(pid), |proc| {
            task_file(proc, tid.unwrap_or(pid), file)
        })?,
        _ => return None,
    })
}

fn kib(bytes: u64) -> u64 {
    bytes / 1024
}

/// Seconds since boot as the sysinfo call reports them, with hundredths.
fn uptime_centis() -> u64 {
    time::now_ns(CLOCK_BOOTTIME).unwrap_or(0) / 10_000_000
}

fn system_file(proc: &GuestProcess, file: SystemFile) -> String {
    let [sysname, nodename, release, version, ..] = misc::UNAME.map(String::from_utf8_lossy);
    let total = proc.config.mem_limit;
    let free = total.saturating_sub(proc.memory_in_use());
    match file {
        // One CPU (sched_getaffinity's), named for the VM rather than the host's model.
        SystemFile::Cpuinfo => "processor\t: 0\nvendor_id\t: SandforkVirtual\nmodel name\t: Sandfork virtual CPU\ncpu MHz\t\t: 0.000\ncpu cores\t: 1\nsiblings\t: 1\ncore id\t\t: 0\nphysical id\t: 0\nbogomips\t: 0.00\naddress sizes\t: 48 bits physical, 48 bits virtual\n\n".to_owned(),
        SystemFile::Meminfo => {
            let mut out = String::new();
            for (name, value) in [("MemTotal", total), ("MemFree", free), ("MemAvailable", free), ("Buffers", 0), ("Cached", 0), ("SwapCached", 0), ("Active", 0), ("Inactive", 0), ("SwapTotal", 0), ("SwapFree", 0), ("Shmem", 0), ("CommitLimit", total), ("Committed_AS", proc.memory_in_use())] {
                let _ = writeln!(out, "{:<16}{:>8} kB", format!("{name}:"), kib(value));
            }
            out
        }
        SystemFile::Uptime => {
            let up = uptime_centis();
            format!("{}.{:02} 0.00\n", up / 100, up % 100)
        }
        SystemFile::Loadavg => format!("0.00 0.00 0.00 1/{} 1\n", proc.threads.alive()),
        SystemFile::Version => format!("{sysname} version {release} (sandfork@{nodename}) {version}\n"),
        SystemFile::Stat => {
            let busy = cpu_ticks(proc);
            let boot = time::now_ns(CLOCK_REALTIME).unwrap_or(0) / 1_000_000_000 - uptime_centis() / 100;
            format!("cpu  {busy} 0 0 0 0 0 0 0 0 0\ncpu0 {busy} 0 0 0 0 0 0 0 0 0\nintr 0\nctxt 0\nbtime {boot}\nprocesses 1\nprocs_running 1\nprocs_blocked 0\n")
        }
        SystemFile::OsType => format!("{sysname}\n"),
        SystemFile::OsRelease => format!("{release}\n"),
        SystemFile::Hostname => format!("{nodename}\n"),
        SystemFile::PidMax => "4194304\n".to_owned(),
        SystemFile::NgroupsMax => "65536\n".to_owned(),
        // Linux's heuristic mode: an allocation that cannot fit is refused (ENOMEM).
        SystemFile::Overcommit => "0\n".to_owned(),
    }
}

/// The program's CPU time in ticks, as times() counts it: its own threads' time, not the host
/// thread's (which has run earlier VMs too).
fn cpu_ticks(proc: &GuestProcess) -> u64 {
    proc.threads.process_cpu_ns() / (1_000_000_000 / TICKS_PER_SECOND)
}

/// /proc/<pid>/comm.
fn comm(proc: &GuestProcess) -> String {
    proc.config.command.comm()
}

/// A signal set as a bitmask of the signals whose disposition matches.
fn signal_mask(proc: &GuestProcess, pick: impl Fn(u64) -> bool) -> u64 {
    proc.signals
        .actions
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, a)| pick(a.handler))
        .fold(0, |mask, (sig, _)| mask | 1 << (sig - 1))
}

fn task_file(proc: &GuestProcess, tid: u32, file: TaskFile) -> Vec<u8> {
    let thread = proc.threads.get(u64::from(tid));
    let (blocked, pending) = thread.map_or((0, 0), |t| (t.blocked_signals, t.pending_signals));
    let (in_use, peak) = (proc.memory_in_use(), proc.peak_memory());
    let stack = stack_size(proc.config.mem_limit);
    let ignored = signal_mask(proc, |h| h == SIG_IGN);
    let caught = signal_mask(proc, |h| h > SIG_IGN);
    let threads = proc.threads.alive();
    let pid = proc.pid;
    let (ppid, pgid, sid) = proc
        .tree
        .get(pid)
        .map_or((0, pid, pid), |e| (e.ppid, e.pgid, e.sid));
    let stopped = proc.tree.get(pid).is_some_and(|e| e.stopped.is_some());
    let (state, state_name) = if stopped {
        ("T", "stopped")
    } else {
        ("R", "running")
    };
    match file {
        TaskFile::Status => {
            let (uid, gid) = (GUEST_UID, GUEST_GID);
            let fd_size =
                (proc.fds.open_fds().map(|(fd, _)| fd + 1).max().unwrap_or(0)).next_multiple_of(64);
            let mut out = String::new();
            let _ = write!(
                out,
                "Name:\t{}\nUmask:\t{:04o}\nState:\t{state} ({state_name})\nTgid:\t{pid}\nNgid:\t0\nPid:\t{tid}\nPPid:\t{ppid}\nTracerPid:\t0\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{gid}\t{gid}\t{gid}\t{gid}\nFDSize:\t{fd_size}\nGroups:\t{gid}\n",
                comm(proc),
                proc.umask
            );
            for (name, bytes) in [
                ("VmPeak", peak),
                ("VmSize", in_use),
                ("VmHWM", peak),
                ("VmRSS", in_use),
                ("RssAnon", in_use),
                ("VmData", in_use),
                ("VmStk", stack),
            ] {
                let _ = writeln!(out, "{name}:\t{:>8} kB", kib(bytes));
            }
            let _ = write!(
                out,
                "Threads:\t{threads}\nSigQ:\t0/1024\nSigPnd:\t{pending:016x}\nShdPnd:\t{:016x}\nSigBlk:\t{blocked:016x}\nSigIgn:\t{ignored:016x}\nSigCgt:\t{caught:016x}\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nCpus_allowed:\t1\nCpus_allowed_list:\t0\nvoluntary_ctxt_switches:\t0\nnonvoluntary_ctxt_switches:\t0\n",
                proc.signals.pending
            );
            out.into_bytes()
        }
        TaskFile::Stat => {
            let (pages, nice) = (in_use / PAGE, i64::from(proc.nice));
            let (heap_start, _) = proc.memory.heap();
            let stack_top = proc.config.mem_limit;
            let fields: [String; 50] = [
                state.into(),
                ppid.to_string(),
                pgid.to_string(),
                sid.to_string(),
                "0".into(),
                "-1".into(),
                "4194560".into(),
                "0".into(),
                "0".into(),
                "0".into(),
                "0".into(),
                cpu_ticks(proc).to_string(),
                "0".into(),
                "0".into(),
                "0".into(),
                (20 + nice).to_string(),
                nice.to_string(),
                threads.to_string(),
                "0".into(),
                "0".into(),
                in_use.to_string(),
                pages.to_string(),
                u64::MAX.to_string(),
                "0".into(),
                "0".into(),
                stack_top.to_string(),
                "0".into(),
                "0".into(),
                "0".into(),
                blocked.to_string(),
                ignored.to_string(),
                caught.to_string(),
                "0".into(),
                "0".into(),
                "0".into(),
                "17".into(),
                "0".into(),
                "0".into(),
                "0".into(),
                "0".into(),
                "0".into(),
                "0".into(),
                "0".into(),
                "0".into(),
                heap_start.to_string(),
                "0".into(),
                "0".into(),
                "0".into(),
                "0".into(),
                "0".into(),
            ];
            format!("{tid} ({}) {}\n", comm(proc), fields.join(" ")).into_bytes()
        }
        TaskFile::Statm => {
            let pages = in_use / PAGE;
            format!("{pages} {pages} 0 0 0 {pages} 0\n").into_bytes()
        }
        TaskFile::Maps => maps(proc).into_bytes(),
        TaskFile::Cmdline => nul_terminated(&proc.config.command.argv),
        TaskFile::Environ => nul_terminated(&proc.config.command.envp),
        TaskFile::Limits => limits(proc).into_bytes(),
        TaskFile::Comm => format!("{}\n", comm(proc)).into_bytes(),
    }
}

fn nul_terminated(strings: &[Vec<u8>]) -> Vec<u8> {
    strings
        .iter()
        .flat_map(|s| s.iter().copied().chain([0]))
        .collect()
}

/// What the VMM's memory map knows: the heap, every mapping (anonymous: an mmap of a file is
/// a copy here) and the main thread's stack. The program's and interpreter's loaded images are
/// not listed.
fn maps(proc: &GuestProcess) -> String {
    let mut lines: Vec<(u64, u64, u32, &str)> = Vec::new();
    let (heap_start, heap_end) = proc.memory.heap();
    if heap_end > heap_start {
        lines.push((heap_start, heap_end, 0b11, "[heap]"));
    }
    lines.extend(
        proc.memory
            .regions()
            .into_iter()
            .map(|(start, end, prot)| (start, end, prot, "")),
    );
    let top = proc.config.mem_limit;
    lines.push((top - stack_size(top), top, 0b11, "[stack]"));
    lines.sort_unstable_by_key(|l| l.0);
    let mut out = String::new();
    for (start, end, prot, name) in lines {
        let perm = |bit: u32, c: char| if prot & bit != 0 { c } else { '-' };
        let line = format!(
            "{start:08x}-{end:08x} {}{}{}p 00000000 00:00 0",
            perm(1, 'r'),
            perm(2, 'w'),
            perm(4, 'x')
        );
        // Linux pads a named line's path to column 73.
        let _ = if name.is_empty() {
            writeln!(out, "{line}")
        } else {
            writeln!(out, "{line:<72} {name}")
        };
    }
    out
}

fn limits(proc: &GuestProcess) -> String {
    const ROWS: [(&str, &str); 16] = [
        ("Max cpu time", "seconds"),
        ("Max file size", "bytes"),
        ("Max data size", "bytes"),
        ("Max stack size", "bytes"),
        ("Max core file size", "bytes"),
        ("Max resident set", "bytes"),
        ("Max processes", "processes"),
        ("Max open files", "files"),
        ("Max locked memory", "bytes"),
        ("Max address space", "bytes"),
        ("Max file locks", "locks"),
        ("Max pending signals", "signals"),
        ("Max msgqueue size", "bytes"),
        ("Max nice priority", ""),
        ("Max realtime priority", ""),
        ("Max realtime timeout", "us"),
    ];
    let show = |v: u64| {
        if v == u64::MAX {
            "unlimited".to_owned()
        } else {
            v.to_string()
        }
    };
    let mut out = format!(
        "{:<26}{:<21}{:<21}{:<10}\n",
        "Limit", "Soft Limit", "Hard Limit", "Units"
    );
    for (resource, (name, unit)) in ROWS.iter().enumerate() {
        let (soft, hard) = misc::limit(proc, resource as u64).unwrap_or((0, 0));
        let _ = writeln!(
            out,
            "{name:<26}{:<21}{:<21}{unit:<10}",
            show(soft),
            show(hard)
        );
    }
    out
}
