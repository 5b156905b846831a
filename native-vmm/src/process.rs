//! The guest process as the syscall layer sees it: the fd table, the memory map, the captured
//! output, signal dispositions (recorded, never delivered), limits and per-call counters.
//!
//! Everything here is plain data and `Clone`: a template's process state is copied with its
//! guest memory when a VM is forked.

mod epoll;
mod fds;
mod locks;
mod memory_map;
mod output;
pub mod signals;
pub mod terminal;
#[cfg(test)]
pub(crate) mod testing;
pub mod threads;
pub mod tree;

use std::time::Instant;

use crate::codec::{DecodeError, Decoder, Encoder};
use crate::fs::{Node, Vfs};

pub use epoll::{Edge, EpollSet, Interest};
pub use fds::{
    Description, Endpoint, FdSlots, FdTable, FifoOpen, Object, Passed, Pipe, PipeError,
    ReadinessMark, FD_LIMIT, MAX_PASSED_PER_MESSAGE, O_ACCMODE, O_APPEND, O_NONBLOCK, O_RDONLY,
    O_RDWR, O_WRONLY, PIPE_CAPACITY,
};
pub use locks::{FileLocks, Held, LockKind, LockOwner, LockRange};
pub use memory_map::{MapError, MemoryMap, Placement};
pub use output::{Appended, Output, OutputSink, Stream};
pub use threads::{Threads, DEFAULT_THREAD_LIMIT};
pub use tree::{
    ProcessEntry, ProcessPart, ProcessTable, Usage, DEFAULT_PROCESS_LIMIT, MAX_PROCESS_LIMIT,
};

/// What a run is given.
#[derive(Clone)]
pub struct ProcessConfig {
    /// The VM's file system (the template's image plus a fresh overlay:
    /// `Vfs::new(image, fs::DEFAULT_OVERLAY_LIMIT)`).
    pub vfs: Vfs,
    /// Working directory (writable, in the overlay). A path that does not resolve to a
    /// directory leaves the process in "/".
    pub cwd: String,
    pub stdin: Vec<u8>,
    /// Cap on stdout+stderr bytes kept.
    pub output_cap: u64,
    /// Guest memory size in bytes (the memory limit).
    pub mem_limit: u64,
    /// What the program was started as.
    pub command: Command,
}

/// The program's path in the image, its argument vector and environment as it was started
/// (/proc/self/exe, cmdline and environ).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Command {
    pub exe: String,
    /// The arguments and environment as execve passed them: bytes in any encoding.
    pub argv: Vec<Vec<u8>>,
    pub envp: Vec<Vec<u8>>,
}

impl Command {
    /// The program file's name, cut to Linux's 15 bytes (/proc's comm, prctl PR_GET_NAME).
    pub fn comm(&self) -> String {
        let name = self.exe.rsplit('/').next().unwrap_or(&self.exe);
        name.chars()
            .scan(0, |len, c| {
                *len += c.len_utf8();
                (*len <= 15).then_some(c)
            })
            .collect()
    }
}

/// Where the loader left room for the program's heap and mappings (guest addresses).
///
/// Contract with the loader: nothing it loaded lies in [brk_start, mmap_high); that range is
/// untouched (zero) guest memory when the process is created.
#[derive(Debug, Clone, Copy)]
pub struct AddressSpace {
    /// First byte after the highest loaded segment of the main program, page aligned.
    pub brk_start: u64,
    /// [mmap_low, mmap_high) is free for mmap; it is below the stack and above brk's reach.
    pub mmap_low: u64,
    pub mmap_high: u64,
}

/// Number of signals (1..=64); index 0 is unused.
pub const SIGNAL_COUNT: usize = 65;

/// A recorded `struct sigaction` (kernel layout, 8-byte mask).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SigAction {
    pub handler: u64,
    pub flags: u64,
    pub restorer: u64,
    pub mask: u64,
}

/// The process-wide signal state: dispositions, signals pending for the process, and the
/// real-time interval timer (delivery: `signals`). The mask, the alternate stack and
/// thread-directed signals are per thread (`threads::Thread`).
#[derive(Debug, Clone)]
pub struct SignalState {
    pub actions: [SigAction; SIGNAL_COUNT],
    /// Signals sent to the process and not yet taken (bit n-1 for signal n).
    pub pending: u64,
    /// setitimer(ITIMER_REAL) / alarm.
    pub timer: Option<signals::RealTimer>,
    /// setitimer(ITIMER_VIRTUAL) and setitimer(ITIMER_PROF), on the process's CPU time.
    pub cpu_timers: [Option<signals::CpuTimer>; 2],
}

/// Per-number system-call counters. Numbers above the x86-64 range share one bucket, so a
/// guest cannot grow host memory by calling many distinct numbers.
#[derive(Debug, Clone)]
struct CallCounters {
    by_number: Vec<u64>,
    out_of_range: u64,
}

/// Numbers below this get their own counter (x86-64 numbers end below 512).
const COUNTED_NUMBERS: usize = 512;

impl CallCounters {
    fn new() -> CallCounters {
        CallCounters {
            by_number: vec![0; COUNTED_NUMBERS],
            out_of_range: 0,
        }
    }

    fn add(&mut self, nr: u64) {
        match usize::try_from(nr)
            .ok()
            .and_then(|i| self.by_number.get_mut(i))
        {
            Some(c) => *c += 1,
            None => self.out_of_range += 1,
        }
    }

    /// The counts, named by `name` (the system-call table's lookup: this layer has no table).
    fn list(&self, name: fn(u64) -> Option<&'static str>) -> Vec<SyscallCount> {
        let mut out: Vec<SyscallCount> = self
            .by_number
            .iter()
            .enumerate()
            .filter(|&(_, &count)| count > 0)
            .map(|(nr, &count)| SyscallCount {
                nr: Some(nr as u64),
                name: name(nr as u64),
                count,
            })
            .collect();
        if self.out_of_range > 0 {
            out.push(SyscallCount {
                nr: None,
                name: None,
                count: self.out_of_range,
            });
        }
        out
    }
}

/// How often one system call was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyscallCount {
    /// None for the shared bucket of numbers ≥ 512.
    pub nr: Option<u64>,
    /// The Linux name, when the call is in the table.
    pub name: Option<&'static str>,
    pub count: u64,
}

#[derive(Clone)]
pub struct GuestProcess {
    /// The running process's pid (its main thread's tid); the fields below down to `threads`
    /// are that process's own (`ProcessPart`), the others the tree's.
    pub(crate) pid: u64,
    pub config: ProcessConfig,
    pub space: AddressSpace,
    pub(crate) fds: FdTable,
    /// The working directory.
    pub(crate) cwd: Node,
    pub(crate) memory: MemoryMap,
    pub(crate) output: Output,
    pub(crate) signals: SignalState,
    pub(crate) umask: u32,
    /// The nice value (setpriority; only raised, as for an unprivileged process).
    pub(crate) nice: i32,
    /// The threads: per-thread state, waits and the run queue.
    pub(crate) threads: Threads,
    /// The request the agent's AWAIT_REQUEST call is answered with (`crate::agent`); None
    /// stops the run at that call, the template's ready point.
    pub(crate) agent_request: Option<crate::agent::AgentRequest>,
    /// How `agent_request` is handed over (a script, or a session's cell).
    pub(crate) hand_off: crate::agent::HandOff,
    /// What a script's agent passed with PUBLISH_RESULT, for the execution's answer.
    pub(crate) published_result: Option<crate::agent::CellResult>,
    /// Every process of the tree: ids, parents, exit statuses, signals sent to them.
    pub(crate) tree: ProcessTable,
    /// The own state of every other live process of the tree, parked while this one runs
    /// (`crate::sandbox` switches them; /proc reads them).
    pub(crate) parked: std::collections::BTreeMap<u64, ProcessPart>,
    /// The run's network: its policy, limits and usage (`crate::net`).
    pub(crate) net: crate::net::Network,
    calls: CallCounters,
    unsupported: CallCounters,
}

impl GuestProcess {
    pub fn new(config: ProcessConfig, space: AddressSpace) -> Self {
        let memory = MemoryMap::new(space, config.mem_limit);
        let vfs = &config.vfs;
        let cwd = vfs
            .resolve(vfs.root(), config.cwd.as_bytes(), true)
            .ok()
            .filter(|&node| vfs.kind(node) == Ok(crate::fs::FileKind::Directory))
            .unwrap_or_else(|| vfs.root());
        let output = Output::new(config.output_cap);
        let signals = SignalState {
            actions: [SigAction::default(); SIGNAL_COUNT],
            pending: 0,
            timer: None,
            cpu_timers: [None; 2],
        };
        GuestProcess {
            pid: threads::MAIN_TID,
            config,
            space,
            fds: FdTable::new(),
            cwd,
            memory,
            output,
            signals,
            umask: 0o022,
            nice: 0,
            threads: Threads::new(DEFAULT_THREAD_LIMIT),
            agent_request: None,
            hand_off: crate::agent::HandOff::Script,
            published_result: None,
            tree: ProcessTable::new(threads::MAIN_TID),
            parked: Default::default(),
            net: crate::net::Network::default(),
            calls: CallCounters::new(),
            unsupported: CallCounters::new(),
        }
    }

    /// Puts `part` (a process of the tree) in place of the running process's own state, which
    /// is returned: the running process becomes `part`'s.
    pub(crate) fn exchange_part(&mut self, mut part: ProcessPart) -> ProcessPart {
        use std::mem::swap;
        self.fds.swap_slots(&mut part.fd_slots);
        swap(&mut self.pid, &mut part.pid);
        swap(&mut self.cwd, &mut part.cwd);
        swap(&mut self.memory, &mut part.memory);
        swap(&mut self.signals, &mut part.signals);
        swap(&mut self.umask, &mut part.umask);
        swap(&mut self.nice, &mut part.nice);
        swap(&mut self.threads, &mut part.threads);
        swap(&mut self.config.command, &mut part.command);
        swap(&mut self.space, &mut part.space);
        part
    }

    /// Runs `op` with process `pid`'s own state in place of the running process's (None when
    /// `pid` is neither running nor parked): what /proc shows of another process is read
    /// exactly as of the caller. The running process's part is not parked meanwhile, so `op`
    /// cannot reach it through `as_process`.
    pub(crate) fn as_process<T>(
        &mut self,
        pid: u64,
        op: impl FnOnce(&mut GuestProcess) -> T,
    ) -> Option<T> {
        if pid == self.pid {
            return Some(op(self));
        }
        let part = self.parked.remove(&pid)?;
        let own = self.exchange_part(part);
        let answer = op(self);
        let part = self.exchange_part(own);
        self.parked.insert(pid, part);
        Some(answer)
    }

    /// The state of a child forked from the running process now (its thread table holds only
    /// its main thread, tid `pid`).
    pub(crate) fn fork_part(&mut self, pid: u64) -> ProcessPart {
        let next_id = self.threads.next_id().max(pid + 1);
        let mut threads = Threads::for_process(pid, next_id, self.threads.limit());
        threads.switching = self.threads.switching;
        // The child's one thread is the caller's copy: its signal mask and alternate stack.
        let caller = self.threads.current();
        let main = threads.current_mut();
        main.blocked_signals = caller.blocked_signals;
        main.alt_stack = caller.alt_stack;
        ProcessPart {
            pid,
            fd_slots: self.fds.fork_slots(),
            cwd: self.cwd,
            memory: self.memory.clone(),
            signals: SignalState {
                actions: self.signals.actions,
                pending: 0,
                timer: None,
                cpu_timers: [None; 2],
            },
            umask: self.umask,
            nice: self.nice,
            threads,
            command: self.config.command.clone(),
            space: self.space,
        }
    }

    /// Closes every fd of the running process (it exits), releasing what that lets go of.
    pub(crate) fn close_all_fds(&mut self) {
        let released = self.fds.close_range(0, u64::MAX, false);
        self.release_each(released);
        self.fds.locks.release_owner(LockOwner::Process(self.pid));
    }

    /// `release` of each object several closes let go of (and of the closes' record locks,
    /// even when no object went).
    pub(crate) fn release_each(&mut self, objects: Vec<Object>) {
        for object in objects {
            self.release(Some(object));
        }
        self.release(None);
    }

    /// Live threads allowed at once (clone fails with EAGAIN beyond it).
    pub fn set_thread_limit(&mut self, limit: u64) {
        self.threads.set_limit(limit);
    }

    pub fn threads(&self) -> &Threads {
        &self.threads
    }

    /// Processes alive or unreaped at once in the tree, this one included (a fork fails with
    /// EAGAIN beyond it).
    pub fn set_process_limit(&mut self, limit: u64) {
        self.tree.set_limit(limit);
    }

    /// The process tree: its limit and how many children it has had.
    pub fn processes(&self) -> &ProcessTable {
        &self.tree
    }

    pub fn stdout(&self) -> &[u8] {
        self.output.stdout()
    }

    pub fn stderr(&self) -> &[u8] {
        self.output.stderr()
    }

    /// The captured output, consuming the process.
    pub fn into_output(self) -> Output {
        self.output
    }

    /// Releases what closing a description let go of: file-system nodes go back to the Vfs,
    /// with those of descriptions that were in flight on a socket that went with it.
    pub(crate) fn release(&mut self, object: Option<Object>) {
        for node in self.fds.take_closed_nodes() {
            self.fds.locks.release_process_records(self.pid, node);
        }
        if let Some(Object::Node(node)) = object {
            self.config.vfs.close(node);
        }
        for node in self.fds.take_released_nodes() {
            self.config.vfs.close(node);
        }
        for leader in self.fds.take_hangups() {
            signals::send(self, leader, signals::SIGHUP);
            signals::send(self, leader, signals::SIGCONT);
        }
    }

    /// Bytes of guest memory given to the program now (mappings plus heap).
    /// See `MemoryMap::handed_out`.
    pub fn memory_handed_out(&self) -> Vec<(u64, u64)> {
        self.memory.handed_out()
    }

    pub fn memory_in_use(&self) -> u64 {
        self.memory.in_use()
    }

    /// The most memory the program held at once.
    pub fn peak_memory(&self) -> u64 {
        self.memory.peak()
    }

    /// What the running program has used: its threads' CPU time and its peak memory.
    pub fn program_usage(&self) -> Usage {
        Usage {
            cpu_ns: self.threads.process_cpu_ns(),
            peak_memory: self.peak_memory(),
        }
    }

    /// What the running process has used, the programs an execve replaced included
    /// (getrusage's RUSAGE_SELF).
    pub fn process_usage(&self) -> Usage {
        self.tree
            .get(self.pid)
            .map_or_else(Usage::default, |e| e.used)
            .with(self.program_usage())
    }

    pub(crate) fn count_call(&mut self, nr: u64) {
        self.calls.add(nr);
    }

    pub(crate) fn count_unsupported(&mut self, nr: u64) {
        self.unsupported.add(nr);
    }

    /// Every system call made, per number, named by `name` (`GuestProcess::syscall_counts`,
    /// in `crate::syscalls`, names them from the table).
    pub(crate) fn syscall_counts_named(
        &self,
        name: fn(u64) -> Option<&'static str>,
    ) -> Vec<SyscallCount> {
        self.calls.list(name)
    }

    /// Calls answered -ENOSYS or stopped as unsupported, per number, named by `name`.
    pub(crate) fn unsupported_counts_named(
        &self,
        name: fn(u64) -> Option<&'static str>,
    ) -> Vec<SyscallCount> {
        self.unsupported.list(name)
    }

    pub fn total_syscalls(&self) -> u64 {
        self.calls.by_number.iter().sum::<u64>() + self.calls.out_of_range
    }
}

/// sigaltstack's "no alternate stack" flag.
pub const SS_DISABLE: u32 = 2;

// ---- template snapshots (crate::snapshot): the process state at a ready point ----

impl AddressSpace {
    pub(crate) fn encode_state(&self, e: &mut Encoder) {
        e.u64(self.brk_start);
        e.u64(self.mmap_low);
        e.u64(self.mmap_high);
    }

    pub(crate) fn decode_state(d: &mut Decoder) -> Result<AddressSpace, DecodeError> {
        Ok(AddressSpace {
            brk_start: d.u64("brk start")?,
            mmap_low: d.u64("mmap low")?,
            mmap_high: d.u64("mmap high")?,
        })
    }
}

impl Command {
    pub(crate) fn encode_state(&self, e: &mut Encoder) {
        e.str(&self.exe);
        for strings in [&self.argv, &self.envp] {
            e.len(strings.len());
            for s in strings {
                e.bytes(s);
            }
        }
    }

    pub(crate) fn decode_state(d: &mut Decoder) -> Result<Command, DecodeError> {
        let exe = d.string("exe")?;
        let mut strings = || -> Result<Vec<Vec<u8>>, DecodeError> {
            (0..d.count(4, "command strings")?)
                .map(|_| d.bytes("command string").map(<[u8]>::to_vec))
                .collect()
        };
        Ok(Command {
            exe,
            argv: strings()?,
            envp: strings()?,
        })
    }
}

impl SignalState {
    /// The dispositions and the signals pending; an armed interval timer is refused.
    pub(crate) fn encode_state(&self, e: &mut Encoder) -> Result<(), &'static str> {
        if self.timer.is_some() || self.cpu_timers.iter().any(Option::is_some) {
            return Err("an interval timer is armed");
        }
        for action in &self.actions {
            for v in [action.handler, action.flags, action.restorer, action.mask] {
                e.u64(v);
            }
        }
        e.u64(self.pending);
        Ok(())
    }

    pub(crate) fn decode_state(d: &mut Decoder) -> Result<SignalState, DecodeError> {
        let mut actions = [SigAction::default(); SIGNAL_COUNT];
        for action in actions.iter_mut() {
            *action = SigAction {
                handler: d.u64("sigaction")?,
                flags: d.u64("sigaction")?,
                restorer: d.u64("sigaction")?,
                mask: d.u64("sigaction")?,
            };
        }
        Ok(SignalState {
            actions,
            pending: d.u64("pending signals")?,
            timer: None,
            cpu_timers: [None; 2],
        })
    }
}

impl GuestProcess {
    /// Encodes what a fork of a template starts from: the file system's overlay, the fd table,
    /// the working directory, the memory map, the signal state and the per-process values.
    /// Not encoded: the counters (each run starts its own), the output (a
    /// ready point has none) and the pending request (none: that is what makes it the ready
    /// point). Refuses a process with output or a pending request, or with other processes.
    pub(crate) fn encode_state(&self, e: &mut Encoder) -> Result<(), &'static str> {
        self.refusal()?;
        if self.tree.len() > 1 {
            return Err("it has child processes, alive or not yet waited for");
        }
        self.encode_own(e)?;
        self.threads.encode_state(e)
    }

    /// `encode_state` for a session checkpoint, which is restored once: the tree may hold
    /// other processes (`encode_tree` records them) and threads may be in timed waits (their
    /// timers are `encode_tree`'s too); a socket with an address is refused naming the
    /// process and fd that hold it.
    pub(crate) fn encode_session_state(&self, e: &mut Encoder) -> Result<(), String> {
        let held = std::iter::once(self.fds.addressed_socket_fd().map(|fd| (self.pid, fd)))
            .chain(self.parked.values().map(|part| {
                part.fd_slots
                    .addressed_socket_fd(&self.fds)
                    .map(|fd| (part.pid, fd))
            }))
            .flatten()
            .next();
        if let Some((pid, fd)) = held {
            return Err(format!(
                "process {pid} holds a socket bound, listening or connected by address (fd {fd})"
            ));
        }
        self.refusal()?;
        self.encode_own(e)?;
        Ok(self.threads.encode_state_timed(e)?)
    }

    /// What a session checkpoint holds beside `encode_session_state`: the running process's
    /// timers as the time each has left after `now`, the process table and every other live
    /// process's parked part (their VMs are the checkpoint's to record).
    pub(crate) fn encode_tree(&self, e: &mut Encoder, now: Instant) -> Result<(), String> {
        self.threads.encode_timers(e, now);
        self.tree.encode_state(e);
        e.len(self.parked.len());
        for part in self.parked.values() {
            part.encode_state(e, now)
                .map_err(|why| format!("process {}: {why}", part.pid))?;
        }
        Ok(())
    }

    /// What no snapshot of the tree holds.
    fn refusal(&self) -> Result<(), &'static str> {
        if self.agent_request.is_some() {
            return Err("a request is pending");
        }
        if self.output.total() > 0 {
            return Err("the program has written output");
        }
        if self.fds.has_addressed_sockets() {
            return Err("a socket is bound, listening or connected by address");
        }
        if self.fds.has_fifos() {
            return Err("a FIFO is open");
        }
        if self.fds.has_passed_descriptions() {
            return Err("file descriptors are in flight on a socket");
        }
        if self.fds.has_pidfds() {
            return Err("a pidfd is open");
        }
        if self.fds.has_terminals() {
            return Err("a pseudo-terminal is open");
        }
        if !self.fds.locks.is_empty() {
            return Err("a file lock is held (flock or fcntl)");
        }
        Ok(())
    }

    /// The running process's state and the tree's descriptions, up to its threads.
    fn encode_own(&self, e: &mut Encoder) -> Result<(), &'static str> {
        let mut signals = Encoder::new();
        self.signals.encode_state(&mut signals)?;
        e.str(&self.config.cwd);
        e.bytes(&self.config.stdin);
        e.u64(self.config.mem_limit);
        self.config.command.encode_state(e);
        self.config.vfs.encode_state(e);
        self.space.encode_state(e);
        self.fds.encode_state(e);
        self.cwd.encode_state(e);
        self.memory.encode_state(e);
        e.raw(&signals.into_bytes());
        e.u32(self.umask);
        e.u32(self.nice.cast_unsigned());
        Ok(())
    }

    /// Gives this process (`decode_state`'s, of a session checkpoint) the tree `encode_tree`
    /// wrote, its timers `now` plus what each had left. Every process of the table but this
    /// one that has not ended must have its part, and every part be such a process. A tree
    /// written before usage was kept (`with_usage` false) starts its usage at zero.
    pub(crate) fn decode_tree(
        &mut self,
        d: &mut Decoder,
        now: Instant,
        with_usage: bool,
    ) -> Result<(), DecodeError> {
        self.threads.decode_timers(d, now)?;
        self.tree = ProcessTable::decode_state(d, self.pid, with_usage)?;
        self.tree.note_ids_used(self.threads.next_id());
        for _ in 0..d.count(1, "parked processes")? {
            let part = ProcessPart::decode_state(d, &self.fds, &self.config.vfs, now)?;
            let pid = part.pid;
            let alive = pid != self.pid && self.tree.get(pid).is_some_and(|e| e.exit.is_none());
            if !alive || self.parked.contains_key(&pid) {
                return Err(DecodeError::new(format!(
                    "a part for process {pid}, which is not a live child or has one already"
                )));
            }
            self.tree.note_ids_used(part.threads.next_id());
            self.parked.insert(pid, part);
        }
        if let Some(pid) = self
            .tree
            .alive()
            .find(|&pid| pid != self.pid && !self.parked.contains_key(&pid))
        {
            return Err(DecodeError::new(format!("live process {pid} has no part")));
        }
        Ok(())
    }

    /// The process `encode_state` wrote, over `image`, with empty output capped at
    /// `output_cap` and fresh counters.
    pub(crate) fn decode_state(
        d: &mut Decoder,
        image: std::sync::Arc<crate::fs::Image>,
        output_cap: u64,
    ) -> Result<GuestProcess, DecodeError> {
        let cwd_path = d.string("cwd")?;
        let stdin = d.bytes("stdin")?.to_vec();
        let mem_limit = d.u64("memory limit")?;
        let command = Command::decode_state(d)?;
        let vfs = Vfs::decode_state(image, d)?;
        let space = AddressSpace::decode_state(d)?;
        let fds = FdTable::decode_state(d, &vfs)?;
        let cwd = vfs.decode_node(d)?;
        let memory = MemoryMap::decode_state(d)?;
        let signals = SignalState::decode_state(d)?;
        let umask = d.u32("umask")?;
        let nice = d.u32("nice")?.cast_signed();
        let threads = Threads::decode_state(d)?;
        let config = ProcessConfig {
            vfs,
            cwd: cwd_path,
            stdin,
            output_cap,
            mem_limit,
            command,
        };
        Ok(GuestProcess {
            pid: threads::MAIN_TID,
            config,
            space,
            fds,
            cwd,
            memory,
            output: Output::new(output_cap),
            signals,
            umask,
            nice,
            threads,
            agent_request: None,
            hand_off: crate::agent::HandOff::Script,
            published_result: None,
            tree: ProcessTable::new(threads::MAIN_TID),
            parked: Default::default(),
            net: crate::net::Network::default(),
            calls: CallCounters::new(),
            unsupported: CallCounters::new(),
        })
    }
}
