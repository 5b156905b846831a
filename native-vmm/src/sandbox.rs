//! The process tree of one run. Every process runs in a KVM VM of its own: a fork gives a new
//! VM a copy-on-write view of the parent's memory (`GuestMemory::duplicate`: the parent's own
//! memfd is frozen into a layer both map privately; over a template or a layer another process
//! still maps, only what the parent wrote is copied) with a vCPU in the parent's state; an execve
//! loads the program into fresh memory and a new vCPU. One host thread runs the VMs in turn:
//! a process runs until all its threads wait, it ends, or its slice ends while another process
//! could run, so the syscall layer needs no locks, as with threads (`crate::sched`).
//!
//! What processes share lives once in `GuestProcess` (descriptions, pipes, sockets, the file
//! system, the captured output, the process table); what each has of its own (fd numbers,
//! memory map, signal dispositions, threads, command) is a `ProcessPart`, swapped in while it
//! runs. A process whose threads all wait is resumed once another process made progress (it
//! retries its readiness waits), or when its timer is due; when no process can go on, the run
//! is deadlocked. The run ends when the first process ends (or reaches its ready point): the
//! others are killed, as a PID namespace's are when its init exits; except in a session
//! (`KeptProcesses`), where at a ready point they stay, parked with their VMs until the next
//! cell's run takes them up again.

use std::cell::Cell;
use std::io;
use std::time::{Duration, Instant};

use crate::codec::{DecodeError, Decoder, Encoder};
use crate::cpu::{CpuExit, CpuSnapshot, GuestCpu};
use crate::errno::Errno;
use crate::memory::{GuestMemory, MemoryArena};
use crate::process::signals::{self, bit, ChildNews};
use crate::process::threads::{decode_call, encode_call, Call, QUANTUM};
use crate::process::tree::{exited_status, signalled_status};
use crate::process::{Command, GuestProcess, MemoryMap, Threads};
use crate::sched::{LoopEnd, Scheduler};
use crate::status::RunStatus;
use crate::syscalls::processes::{ExecRequest, ForkRequest};
use crate::syscalls::{SyscallOutcome, UserMemory};

/// How often, at most, the memory of a tree of several processes is measured
/// (`Tree::keep_memory_limit`).
const MEMORY_MEASURED_EVERY: Duration = Duration::from_millis(50);

/// SIGKILL, SIGSYS: how a child the run cannot go on with ends.
const SIGKILL: u64 = 9;
const SIGSYS: u64 = 31;

/// How a process goes on when it next gets the host thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Its vCPU runs on from where it stopped.
    Run,
    /// Its system call `call` returns `value` first.
    Answer { call: Call, value: u64 },
    /// Its threads all waited: they try again.
    Wake,
    /// SIGKILL ends it before any of its threads runs again (stopped or not).
    Kill,
    /// It made system call `call`, not handled yet (a process a checkpoint ran out of the
    /// VMM's stubs: `KeptProcesses::vms`).
    Call(Call),
}

impl Next {
    pub(crate) fn encode_state(&self, e: &mut Encoder) {
        match *self {
            Next::Run => e.u8(0),
            Next::Answer { call, value } => {
                e.u8(1);
                encode_call(call, e);
                e.u64(value);
            }
            Next::Wake => e.u8(2),
            Next::Call(call) => {
                e.u8(3);
                encode_call(call, e);
            }
            Next::Kill => e.u8(4),
        }
    }

    pub(crate) fn decode_state(d: &mut Decoder) -> Result<Next, DecodeError> {
        Ok(match d.u8("how a process goes on")? {
            0 => Next::Run,
            1 => Next::Answer {
                call: decode_call(d)?,
                value: d.u64("answer")?,
            },
            2 => Next::Wake,
            3 => Next::Call(decode_call(d)?),
            4 => Next::Kill,
            t => return Err(DecodeError::new(format!("how a process goes on: tag {t}"))),
        })
    }
}

enum State {
    Ready(Next),
    /// Every thread waits: for a timer (`until`) or for another process; `seen` is the tree's
    /// progress when it stopped.
    Blocked {
        until: Option<Instant>,
        seen: u64,
    },
    Ended,
}

/// One process of the tree. The first is the run's own (its vCPU, memory and scheduler are
/// the caller's: None here until an execve replaces them).
struct Member<'a> {
    pid: u64,
    cpu: Option<Box<dyn GuestCpu + 'a>>,
    mem: Option<&'a GuestMemory>,
    sched: Option<Scheduler>,
    state: State,
    /// The memory map's generation the vCPU was last given.
    handed_out: Option<u64>,
    /// A vfork child: who waits for it to exec or exit.
    vfork: Option<VforkLink>,
    /// The vfork child it waits for: it runs again once that child execs or exits (or to end,
    /// killed).
    waits_for: Option<u64>,
    /// The pages its memory had copied when last measured (`Tree::memory_held`); None once it
    /// may have copied more.
    copied: Cell<Option<u64>>,
}

/// What a vfork child owes the process waiting for it.
struct VforkLink {
    parent: u64,
    /// When it runs on the parent's memory: the stub stacks as the parent's vCPU left them,
    /// given back when the parent runs again.
    stub_stacks: Option<Vec<u8>>,
}

/// Where one process's stint on the host thread ended.
enum Stop {
    End(LoopEnd),
    /// Its slice ended while another process could run.
    Preempted,
}

/// The processes besides the first that a session keeps between its cells: parked with their
/// VMs (none runs while the session waits at its ready point), taken up again by the next
/// cell's run. Their memories live in `arena`, which lives as long as the session's VM.
pub struct KeptProcesses<'a> {
    arena: &'a MemoryArena,
    members: Vec<Member<'a>>,
}

/// A kept process's VM as a session checkpoint records it: its memory, its vCPU's registers
/// and how it goes on.
pub struct KeptVm<'m> {
    pub pid: u64,
    pub mem: &'m GuestMemory,
    pub cpu: CpuSnapshot,
    pub next: Next,
}

impl<'a> KeptProcesses<'a> {
    pub fn new(arena: &'a MemoryArena) -> KeptProcesses<'a> {
        KeptProcesses {
            arena,
            members: Vec::new(),
        }
    }

    /// Each kept process's VM as it stopped (one whose threads all waited tries again). One
    /// whose slice ended inside the VMM's stubs, where no state is a program's, is first run on
    /// to its next system call (a few instructions), which it then makes when it next runs, or
    /// back into program code.
    pub fn vms(&mut self) -> io::Result<Vec<KeptVm<'a>>> {
        self.members
            .iter_mut()
            .map(|member| {
                let (Some(cpu), Some(mem)) = (member.cpu.as_mut(), member.mem) else {
                    return Err(io::Error::other("a kept process without its VM"));
                };
                // Its vCPU may run on out of the stubs below.
                mem.freeze_if_lent()?;
                let (state, next) = match member.state {
                    State::Ready(Next::Run) => stopped_state(cpu.as_mut(), member.pid)?,
                    // Its registers are never used again.
                    State::Ready(Next::Kill) => {
                        (stopped_state(cpu.as_mut(), member.pid)?.0, Next::Kill)
                    }
                    State::Ready(next) => (cpu.snapshot()?, next),
                    State::Blocked { .. } => (cpu.snapshot()?, Next::Wake),
                    State::Ended => return Err(io::Error::other("an ended process was kept")),
                };
                member.state = State::Ready(next);
                Ok(KeptVm {
                    pid: member.pid,
                    mem,
                    cpu: state,
                    next,
                })
            })
            .collect()
    }

    /// Keeps process `pid` (its part parked in the session's process) on `cpu` and `mem`
    /// (a memory of `arena`), to go on as `next` in the next cell: a restored checkpoint's.
    pub fn adopt(
        &mut self,
        pid: u64,
        cpu: Box<dyn GuestCpu + 'a>,
        mem: &'a GuestMemory,
        next: Next,
    ) {
        self.members.push(Member {
            pid,
            cpu: Some(cpu),
            mem: Some(mem),
            sched: None,
            state: State::Ready(next),
            handed_out: None,
            vfork: None,
            waits_for: None,
            copied: Cell::new(None),
        });
    }
}

/// Runs `process` (the tree's first process, on `cpu` and `mem`) and every process it makes
/// until the first one ends or reaches its ready point. With `kept` (a session's cell), the
/// processes kept from earlier cells run too, and the live ones are kept again when the first
/// process reaches its ready point; otherwise every other process is killed when the run
/// ends. Returns where it stopped and the number of VM exits of every process.
pub fn run<'a>(
    sched: &mut Scheduler,
    cpu: &mut dyn GuestCpu,
    process: &mut GuestProcess,
    mem: &'a GuestMemory,
    kept: Option<&mut KeptProcesses<'a>>,
) -> io::Result<(LoopEnd, u64)> {
    match kept {
        Some(kept) => {
            let children = std::mem::take(&mut kept.members);
            let (end, exits, left) =
                run_tree(sched, cpu, process, mem, kept.arena, children, true)?;
            kept.members = left;
            Ok((end, exits))
        }
        None => {
            let arena = MemoryArena::new();
            let (end, exits, _) = run_tree(sched, cpu, process, mem, &arena, Vec::new(), false)?;
            Ok((end, exits))
        }
    }
}

/// `run` with `children` (processes kept from an earlier run) beside the first process;
/// returns the live children when `keep` and the first process stopped at its ready point.
fn run_tree<'a>(
    sched: &mut Scheduler,
    cpu: &mut dyn GuestCpu,
    process: &mut GuestProcess,
    mem: &'a GuestMemory,
    arena: &'a MemoryArena,
    children: Vec<Member<'a>>,
    keep: bool,
) -> io::Result<(LoopEnd, u64, Vec<Member<'a>>)> {
    let mut members = vec![Member {
        pid: process.pid,
        cpu: None,
        mem: None,
        sched: None,
        state: State::Ready(Next::Run),
        handed_out: None,
        vfork: None,
        waits_for: None,
        copied: Cell::new(None),
    }];
    for mut child in children {
        // A wait that blocked in an earlier run is tried again; the run's deadline is this one's.
        if matches!(child.state, State::Blocked { .. }) {
            child.state = State::Ready(Next::Wake);
        }
        if let Some(child_sched) = child.sched.as_mut() {
            child_sched.set_deadline(sched.deadline(), sched.limit_ms());
        }
        members.push(child);
    }
    let mut tree = Tree {
        members,
        current: 0,
        exits: 0,
        deadline: sched.deadline(),
        limit_ms: sched.limit_ms(),
        arena,
        root_mem: mem,
        memory_measured: Instant::now(),
        memory_due: false,
    };
    let end = tree.run(sched, cpu, process);
    let exits = tree.exits;
    let end = end?;
    let keep = keep && matches!(end, LoopEnd::ReadyPoint { .. });
    let left = tree.finish(process, keep);
    Ok((end, exits, left))
}

struct Tree<'a> {
    members: Vec<Member<'a>>,
    current: usize,
    exits: u64,
    deadline: Instant,
    limit_ms: u64,
    arena: &'a MemoryArena,
    /// The first process's memory (its member's until an execve replaces it).
    root_mem: &'a GuestMemory,
    /// When the tree's memory was last measured (`keep_memory_limit`), and whether it is due
    /// again before `MEMORY_MEASURED_EVERY` has passed.
    memory_measured: Instant,
    memory_due: bool,
}

impl<'a> Tree<'a> {
    fn run(
        &mut self,
        root_sched: &mut Scheduler,
        root_cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
    ) -> io::Result<LoopEnd> {
        loop {
            if let Some(end) = self.keep_memory_limit(process)? {
                return Ok(end);
            }
            let stop = self.stint(root_sched, root_cpu, process)?;
            let index = self.current;
            match stop {
                Stop::Preempted => self.members[index].state = State::Ready(Next::Run),
                Stop::End(LoopEnd::Blocked { until }) => {
                    self.members[index].state = State::Blocked {
                        until,
                        seen: self.exits,
                    };
                    // The tree may wait long now: what it holds is measured first.
                    self.memory_due = true;
                }
                // It runs on from where it stopped once continued; its parent's wait may
                // report the stop.
                Stop::End(LoopEnd::Stopped) => {
                    self.members[index].state = State::Ready(Next::Run);
                    self.progress();
                }
                Stop::End(LoopEnd::Fork { request, call }) => {
                    let mut own = self.members[index].cpu.take();
                    let cpu: &mut dyn GuestCpu = match own.as_mut() {
                        Some(cpu) => cpu.as_mut(),
                        None => &mut *root_cpu,
                    };
                    let mem = self.members[index].mem.unwrap_or(self.root_mem);
                    let forked = self.fork(cpu, mem, process, &request);
                    // A fork may have frozen the caller's copies into a layer.
                    self.members[index].copied.set(None);
                    self.members[index].cpu = own;
                    match forked {
                        Ok(child) => {
                            self.members[index].state =
                                State::Ready(Next::Answer { call, value: child });
                            if request.vfork {
                                self.members[index].waits_for = Some(child);
                            }
                            // The child runs first: it usually execs or exits at once.
                            let next = self.members.len() - 1;
                            self.switch_to(next, process);
                            continue;
                        }
                        Err(errno) => {
                            self.members[index].state = State::Ready(Next::Answer {
                                call,
                                value: errno.as_return(),
                            });
                            continue;
                        }
                    }
                }
                Stop::End(LoopEnd::Exec { request, call }) => {
                    let value = match self.exec(index, root_cpu, process, request) {
                        Ok(()) => {
                            self.members[index].state = State::Ready(Next::Run);
                            continue;
                        }
                        Err(errno) => errno.as_return(),
                    };
                    self.members[index].state = State::Ready(Next::Answer { call, value });
                    continue;
                }
                Stop::End(end @ LoopEnd::ReadyPoint { .. }) if index == 0 => return Ok(end),
                Stop::End(LoopEnd::Finished(status)) if index == 0 || run_wide(&status) => {
                    return Ok(LoopEnd::Finished(status))
                }
                Stop::End(LoopEnd::Finished(status)) => self.ended(index, process, &status),
                // A child at a ready point (a forked agent) cannot be served: it ends.
                Stop::End(LoopEnd::ReadyPoint { .. }) => {
                    let status = RunStatus::Exited {
                        code: 128 + SIGSYS as i32,
                    };
                    self.ended(index, process, &status)
                }
            }
            match self.pick_next(process) {
                Some(next) => self.switch_to(next, process),
                None => {
                    let threads = process.threads.alive();
                    return Ok(LoopEnd::Finished(if Instant::now() >= self.deadline {
                        root_sched.timeout()
                    } else {
                        RunStatus::Deadlocked { threads }
                    }));
                }
            }
        }
    }

    /// The vCPU of member `index`.
    fn cpu_of<'s>(
        &'s mut self,
        index: usize,
        root_cpu: &'s mut dyn GuestCpu,
    ) -> &'s mut (dyn GuestCpu + 's) {
        match &mut self.members[index].cpu {
            Some(cpu) => cpu.as_mut(),
            None => root_cpu,
        }
    }

    /// Runs the current process until it stops.
    fn stint(
        &mut self,
        root_sched: &mut Scheduler,
        root_cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
    ) -> io::Result<Stop> {
        let index = self.current;
        // Another process that can run, or that waits for what this one may have done (its
        // waits are tried again when this one's slice ends, a stopped one's signals looked
        // at), shares the host thread.
        let others_ready = self
            .members
            .iter()
            .enumerate()
            .any(|(i, m)| i != index && !matches!(m.state, State::Ended));
        // A stopped process's timer ends no slice: it does not run when it is due.
        let stopped = |m: &Member| process.tree.get(m.pid).is_some_and(|e| e.stopped.is_some());
        let other_timer = self
            .members
            .iter()
            .enumerate()
            .filter(|&(i, m)| i != index && !stopped(m))
            .filter_map(|(_, m)| match m.state {
                State::Blocked { until, .. } => until,
                _ => None,
            })
            .min();
        let quantum_end = Instant::now() + QUANTUM;
        let root_mem = self.root_mem;
        let member = &mut self.members[index];
        let next = std::mem::replace(&mut member.state, State::Ready(Next::Run));
        let mem = member.mem.unwrap_or(root_mem);
        mem.freeze_if_lent()?;
        // It may copy pages now, on its own memory or a vfork parent's.
        for other in self.members.iter_mut() {
            if std::ptr::eq(other.mem.unwrap_or(root_mem), mem) {
                other.copied.set(None);
            }
        }
        let member = &mut self.members[index];
        let (cpu, sched): (&mut dyn GuestCpu, &mut Scheduler) =
            match (&mut member.cpu, &mut member.sched) {
                (Some(cpu), Some(sched)) => (cpu.as_mut(), sched),
                _ => (root_cpu, root_sched),
            };
        // A signal sent to it while it was away is taken at once, even in a loop that makes no
        // system call: the first run is kicked out straight away (`slice_ended` takes it).
        let mut kick = matches!(next, State::Ready(Next::Run))
            && signals::ready_for(process, process.threads.current_tid()) != 0;
        let mut ended = match next {
            State::Ready(Next::Run) => None,
            State::Ready(Next::Answer { call, value }) => {
                sched.apply(cpu, process, mem, SyscallOutcome::Return(value), call)?
            }
            State::Ready(Next::Wake) | State::Blocked { .. } => sched.resume(cpu, process, mem)?,
            State::Ready(Next::Kill) => {
                if let Some(entry) = process.tree.get_mut(process.pid) {
                    entry.killed_by = Some(SIGKILL);
                }
                Some(LoopEnd::Finished(RunStatus::Exited {
                    code: 128 + SIGKILL as i32,
                }))
            }
            State::Ready(Next::Call(call)) => {
                self.exits += 1;
                sched.syscall(cpu, process, mem, call)?
            }
            State::Ended => return Ok(Stop::End(LoopEnd::Finished(RunStatus::Exited { code: 0 }))),
        };
        loop {
            if let Some(end) = ended {
                return Ok(Stop::End(end));
            }
            let generation = process.memory.handed_out_generation();
            if member.handed_out != Some(generation) {
                member.handed_out = Some(generation);
                cpu.map_memory(&process.memory_handed_out())?;
            }
            let mut until = sched.run_until(process);
            if others_ready {
                until = until.min(quantum_end);
            }
            if let Some(timer) = other_timer {
                until = until.min(timer);
            }
            if std::mem::take(&mut kick) {
                until = Instant::now();
            }
            ended = match cpu.run(until)? {
                CpuExit::Syscall { nr, args } => {
                    self.exits += 1;
                    sched.syscall(cpu, process, mem, Call { nr, args })?
                }
                CpuExit::Fault(fault) => {
                    self.exits += 1;
                    sched.fault(cpu, process, mem, fault)?
                }
                CpuExit::DeadlineReached if Instant::now() >= sched.deadline() => {
                    Some(LoopEnd::Finished(sched.timeout()))
                }
                CpuExit::DeadlineReached
                    if (others_ready && Instant::now() >= quantum_end)
                        || other_timer.is_some_and(|t| Instant::now() >= t) =>
                {
                    self.exits += cpu.take_inner_exits();
                    return Ok(Stop::Preempted);
                }
                CpuExit::DeadlineReached => sched.slice_ended(cpu, process, mem)?,
            };
            self.exits += cpu.take_inner_exits();
        }
    }

    /// The memory limit is the tree's: what it leaves beside the host memory the live
    /// processes hold now (none when it cannot be measured).
    fn memory_left(&self, limit: u64) -> u64 {
        self.memory_held()
            .map_or(0, |(held, _)| limit.saturating_sub(held))
    }

    /// The bytes of host memory the live processes hold: each memory's copies, and once each
    /// file a memory maps (its own memfd, or a layer that processes forked from one another
    /// map together). With it, the member holding the most of its own (its copies, and its
    /// file when no other memory maps it), the newest of equals.
    fn memory_held(&self) -> io::Result<(u64, Option<usize>)> {
        let (mut pages, mut files, mut counted) = (0u64, Vec::new(), Vec::new());
        let mut largest: Option<(usize, u64)> = None;
        for i in 0..self.members.len() {
            if matches!(self.members[i].state, State::Ended) {
                continue;
            }
            let mem = self.members[i].mem.unwrap_or(self.root_mem);
            if counted.contains(&std::ptr::from_ref(mem)) {
                continue;
            }
            counted.push(std::ptr::from_ref(mem));
            let copied = match self.members[i].copied.get() {
                Some(copied) => copied,
                None => mem.copied_own_pages()?,
            };
            self.members[i].copied.set(Some(copied));
            let mut own = copied;
            if let Some(file) = mem.file_held()? {
                if !files.contains(&file.id) {
                    files.push(file.id);
                    pages += file.pages;
                }
                if file.sole {
                    own += file.pages;
                }
            }
            pages += copied;
            if largest.is_none_or(|(_, most)| own >= most) {
                largest = Some((i, own));
            }
        }
        Ok((
            pages.saturating_mul(crate::layout::PAGE_SIZE),
            largest.map(|(i, _)| i),
        ))
    }

    /// Keeps the tree within its memory limit as Linux's out-of-memory killer keeps a cgroup
    /// within its own: a fork copies no memory up front (heuristic overcommit), so while
    /// several processes live their memory is measured between stints (every
    /// `MEMORY_MEASURED_EVERY` while they run, and whenever one waits), and past the limit
    /// the process holding the most of its own is killed (SIGKILL). When that is the first
    /// process, the run ends out of memory.
    fn keep_memory_limit(&mut self, process: &mut GuestProcess) -> io::Result<Option<LoopEnd>> {
        let due = std::mem::take(&mut self.memory_due)
            || self.memory_measured.elapsed() >= MEMORY_MEASURED_EVERY;
        let live = |m: &&Member| !matches!(m.state, State::Ended);
        if !due || self.members.iter().filter(live).count() < 2 {
            return Ok(None);
        }
        self.memory_measured = Instant::now();
        let limit = process.config.mem_limit;
        let (held, largest) = self.memory_held()?;
        match largest {
            Some(victim) if held > limit => {
                if victim == 0 {
                    return Ok(Some(LoopEnd::Finished(RunStatus::OutOfMemory {
                        limit_bytes: limit,
                    })));
                }
                self.members[victim].state = State::Ready(Next::Kill);
                self.switch_to(victim, process);
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// Gives member `index`'s memory `mem` back to the host (`GuestMemory::retire`), unless it
    /// is the first process's or another live process runs on it (a vfork child's parent, or
    /// its child).
    fn retire(&self, index: usize, mem: &GuestMemory) {
        let in_use = std::ptr::eq(mem, self.root_mem)
            || self.members.iter().enumerate().any(|(i, m)| {
                i != index
                    && !matches!(m.state, State::Ended)
                    && std::ptr::eq(m.mem.unwrap_or(self.root_mem), mem)
            });
        if !in_use {
            let _ = mem.retire();
        }
    }

    /// Member `index` (the current process, a vfork child) execs or ends: the process that
    /// waits for it runs again. When it ran on that process's memory, the parent gets back its
    /// stub stacks, the memory map as the child left it (one memory, one map, as on Linux) and
    /// the child's writes in the pages a session's checkpoints track.
    fn release_vfork_parent(&mut self, index: usize, process: &mut GuestProcess) {
        let Some(link) = self.members[index].vfork.take() else {
            return;
        };
        let child = self.members[index].pid;
        let mem = self.members[index].mem.unwrap_or(self.root_mem);
        if mem.tracks_writes() {
            if let Some(cpu) = self.members[index].cpu.as_mut() {
                if let Ok(Some(pages)) = cpu.take_written_pages() {
                    mem.note_written(&pages);
                }
            }
        }
        let Some(parent) = self
            .members
            .iter_mut()
            .find(|m| m.pid == link.parent && m.waits_for == Some(child))
        else {
            return;
        };
        parent.waits_for = None;
        let Some(stub_stacks) = link.stub_stacks else {
            return;
        };
        // A fork the child made maps the memory too: it must not see the parent's stacks.
        let _ = mem.freeze_if_lent();
        let _ = mem.write(crate::arch::STUB_STACKS.start, &stub_stacks);
        if let Some(part) = process.parked.get_mut(&link.parent) {
            part.memory = process.memory.clone();
            part.space = process.space;
        }
    }

    /// Makes a child of the current process: a copy of its memory in a new VM (ENOMEM when the
    /// copy does not fit in `room`, as fork answers on Linux) or, for a vfork, a new VM on the
    /// same memory; a vCPU in its state (the call returning 0 there), and its own part of the
    /// process state.
    fn fork(
        &mut self,
        cpu: &mut dyn GuestCpu,
        mem: &'a GuestMemory,
        process: &mut GuestProcess,
        request: &ForkRequest,
    ) -> Result<u64, Errno> {
        // A fork freezes the caller's memory (`GuestMemory::duplicate`): only for a backend
        // that can run the child.
        if !cpu.can_fork() {
            return Err(Errno::ENOSYS);
        }
        let parent = process.pid;
        // CLONE_PIDFD's fd is checked for before anything is made: EMFILE makes no child.
        if request.pidfd.is_some() {
            process.fds.free_fd(0)?;
        }
        let pid = process
            .tree
            .add_child(parent, process.threads.next_id(), request.exit_signal)
            .ok_or(Errno::EAGAIN)?;
        let made = (|| {
            let mut state = cpu.snapshot().map_err(|_| (Errno::EAGAIN, None))?;
            state.regs.rax = 0;
            if let Some(stack) = request.stack {
                state.regs.rsp = stack;
            }
            if let Some(tls) = request.tls {
                state.fs_base = tls;
            }
            let (child_mem, own) = if request.share_memory {
                (mem, None)
            } else {
                // The child runs first, so the caller's memory is lent to it unless the fork
                // writes in the caller's memory below, which the child must not see.
                // The tree's memory is measured only for a fork that copies pages now.
                let room = || self.memory_left(process.config.mem_limit);
                let copy = if request.parent_tid.is_some() || request.pidfd.is_some() {
                    mem.duplicate(room)
                } else {
                    mem.lend(room)
                };
                let copy = copy.map_err(|_| (Errno::ENOMEM, None))?;
                let copy = self.arena.keep(copy);
                (copy, Some(copy))
            };
            let mut child_cpu = cpu.fork_onto(child_mem, &state).map_err(|e| {
                let errno = match e.kind() {
                    io::ErrorKind::Unsupported => Errno::ENOSYS,
                    _ => Errno::EAGAIN,
                };
                (errno, own)
            })?;
            child_cpu
                .set_syscall_return(0)
                .map_err(|_| (Errno::EAGAIN, own))?;
            // The child's writes to a memory whose writes a session tracks are the parent's.
            if request.share_memory && mem.tracks_writes() {
                child_cpu.track_writes().map_err(|_| (Errno::EAGAIN, own))?;
            }
            Ok((child_mem, child_cpu))
        })();
        let (child_mem, child_cpu) = match made {
            Ok(made) => made,
            Err((errno, child_mem)) => {
                // A copy made for nothing lets go of what it shares with the caller.
                if let Some(mem) = child_mem {
                    let _ = mem.retire();
                }
                process.tree.reap(pid);
                return Err(errno);
            }
        };
        // What the flags ask to be written (a bad address is ignored, as Linux's copy-out is).
        if let Some(addr) = request.parent_tid {
            let _ = UserMemory::new(mem).write_u32(addr, pid as u32);
        }
        if let Some(addr) = request.child_tid {
            let _ = UserMemory::new(child_mem).write_u32(addr, pid as u32);
        }
        let mut part = process.fork_part(pid);
        if let Some(addr) = request.clear_child_tid {
            part.threads.current_mut().clear_child_tid = addr;
        }
        if let Some(tls) = request.tls {
            part.threads.current_mut().fs_base = tls;
        }
        process.threads.reserve_ids_from(pid + 1);
        process.tree.note_ids_used(pid + 1);
        process.parked.insert(pid, part);
        // The child's fds are copied already: the pidfd is the parent's alone. Its fd was free
        // above and nothing opened one since.
        if let Some(addr) = request.pidfd {
            let description = crate::syscalls::pidfd::description(pid, 0);
            if let Ok(fd) = process.fds.install(description, 0, true) {
                let _ = UserMemory::new(mem).write_u32(addr, fd as u32);
            }
        }
        // The parent's vCPU waits in the syscall stub, its iretq frame on the stub's stack, which
        // the child's calls overwrite on the memory they share.
        let stub_stacks = request.share_memory.then(|| {
            let stacks = &crate::arch::STUB_STACKS;
            let mut saved = vec![0; (stacks.end - stacks.start) as usize];
            let _ = mem.read(stacks.start, &mut saved);
            saved
        });
        self.members.push(Member {
            pid,
            cpu: Some(child_cpu),
            mem: Some(child_mem),
            sched: None,
            state: State::Ready(Next::Run),
            handed_out: None,
            vfork: request.vfork.then_some(VforkLink {
                parent,
                stub_stacks,
            }),
            waits_for: None,
            copied: Cell::new(None),
        });
        Ok(pid)
    }

    /// Replaces member `index`'s program (it is the current process) with the one `request`
    /// names, in fresh memory with a new vCPU; an error leaves it as it was.
    fn exec(
        &mut self,
        index: usize,
        root_cpu: &mut dyn GuestCpu,
        process: &mut GuestProcess,
        request: ExecRequest,
    ) -> Result<(), Errno> {
        let mem_limit = process.config.mem_limit;
        let new_mem = GuestMemory::new(mem_limit).map_err(|_| Errno::ENOMEM)?;
        let vfs = &process.config.vfs;
        let image = vfs.image().clone();
        let exe = vfs.contents(request.node)?;
        let loaded = crate::loader::load_elf(
            &new_mem,
            exe,
            &request.exe,
            &|p| image.file_bytes(p),
            &request.argv,
            &request.envp,
        )
        .map_err(|e| match e {
            crate::loader::LoadError::NotFound { .. } => Errno::ENOENT,
            crate::loader::LoadError::DoesNotFit { .. } => Errno::ENOMEM,
            crate::loader::LoadError::ArgumentsTooLarge { .. } => Errno::E2BIG,
            crate::loader::LoadError::NulInArgument => Errno::EINVAL,
            _ => Errno::ENOEXEC,
        })?;
        let new_mem = self.arena.keep(new_mem);
        let new_cpu = self
            .cpu_of(index, root_cpu)
            .exec_onto(new_mem, loaded.entry, loaded.stack_pointer)
            .map_err(|e| match e.kind() {
                io::ErrorKind::Unsupported => Errno::ENOSYS,
                _ => Errno::ENOMEM,
            })?;
        // The point of no return: the process is the new program from here on.
        let released = process.fds.close_on_exec();
        process.release_each(released);
        let pid = process.pid;
        let limit = process.threads.limit();
        let switching = process.threads.switching;
        let next_id = process.threads.next_id().max(process.tree.next_id());
        process.threads.stop_cpu_clock();
        // What the old program used stays the process's (getrusage, its parent's wait).
        let used = process.program_usage();
        process.tree.note_usage(pid, used);
        // The signal mask and the signals pending for the caller survive execve.
        let (blocked, pending) = {
            let caller = process.threads.current();
            (caller.blocked_signals, caller.pending_signals)
        };
        process.threads = Threads::for_process(pid, next_id, limit);
        process.threads.switching = switching;
        let main = process.threads.current_mut();
        main.blocked_signals = blocked;
        main.pending_signals = pending;
        process.threads.start_cpu_clock();
        self.release_vfork_parent(index, process);
        process.memory = MemoryMap::new(loaded.space, mem_limit);
        process.space = loaded.space;
        process.signals.timer = None;
        process.signals.cpu_timers = [None; 2];
        for action in process.signals.actions.iter_mut() {
            // Handlers are in the old program: they go back to the default; ignored stays.
            if action.handler > 1 {
                *action = crate::process::SigAction::default();
            }
        }
        process.config.command = Command {
            exe: request.exe,
            argv: request.argv,
            envp: request.envp,
        };
        let member = &mut self.members[index];
        let mut cpu = new_cpu;
        member.sched = Some(Scheduler::new(
            cpu.as_mut(),
            process,
            self.deadline,
            self.limit_ms,
        ));
        member.cpu = Some(cpu);
        // The old program's memory (a forked copy, or an earlier exec's) goes back to the host;
        // the run's own first memory is the caller's.
        let old = member.mem.replace(new_mem);
        member.handed_out = None;
        if let Some(old) = old {
            self.retire(index, old);
        }
        Ok(())
    }

    /// Member `index` (the current process) ended with `status`: a zombie until its parent
    /// waits; its fds close (its pipe ends with them), its parent gets its exit signal.
    fn ended(&mut self, index: usize, process: &mut GuestProcess, status: &RunStatus) {
        let pid = process.pid;
        let killed_by = process.tree.get(pid).and_then(|e| e.killed_by);
        let wait_status = match (status, killed_by) {
            (_, Some(sig)) => signalled_status(sig),
            (RunStatus::Exited { code }, None) => exited_status(*code),
            (RunStatus::Crashed { fault }, None) => signalled_status(fault.signal().signal),
            (RunStatus::Unsupported { .. }, None) => signalled_status(SIGSYS),
            _ => signalled_status(SIGKILL),
        };
        process.close_all_fds();
        let root = self.members[0].pid;
        let used = process.program_usage();
        process.tree.note_usage(pid, used);
        process.tree.ended(pid, wait_status, root);
        if let Some(entry) = process.tree.get(pid).cloned() {
            if entry.exit_signal != 0 {
                let news = ChildNews::ended(pid, wait_status);
                signals::notify_parent(process, entry.ppid, entry.exit_signal, news);
            }
        }
        // An end is progress even when it made no system call (a signal's default action):
        // its pidfds turn readable and its pipes lose a writer, so every waiter tries again.
        self.progress();
        self.release_vfork_parent(index, process);
        let member = &mut self.members[index];
        member.state = State::Ended;
        member.cpu = None;
        member.sched = None;
        if let Some(mem) = member.mem {
            self.retire(index, mem);
        }
    }

    /// Something happened that no system call of a waiter's did (a process ended, stopped
    /// or continued): every waiting process tries again.
    fn progress(&mut self) {
        for member in &mut self.members {
            if let State::Blocked { seen, .. } = &mut member.state {
                *seen = 0;
            }
        }
    }

    /// Job control for member `i` while it is not running: SIGKILL sent to it ends it next
    /// (a stopped one too); a stop signal sent to it stops it where it is, its state kept for
    /// when SIGCONT continues it.
    fn control(&mut self, i: usize, process: &mut GuestProcess) {
        let pid = self.members[i].pid;
        let Some(entry) = process.tree.get(pid) else {
            return;
        };
        if i == self.current || matches!(self.members[i].state, State::Ended) {
            return;
        }
        if entry.signals & bit(SIGKILL) != 0 {
            self.members[i].state = State::Ready(Next::Kill);
            return;
        }
        let mut sent = entry.signals;
        if entry.stopped.is_some() || sent & signals::STOP_SIGNALS == 0 {
            return;
        }
        let stopped = process
            .as_process(pid, |p| signals::take_stop(p, &mut sent))
            .flatten();
        if let Some(entry) = process.tree.get_mut(pid) {
            entry.signals = sent;
        }
        if let Some(sig) = stopped {
            signals::stopped(process, pid, sig);
            self.progress();
        }
    }

    /// The next process to run, round robin from the current one: one that is ready, or
    /// blocked and worth trying again (progress since, its timer due, a signal for it), and
    /// not stopped; sleeping until the first timer when only timers can wake one. None: none
    /// ever can.
    fn pick_next(&mut self, process: &mut GuestProcess) -> Option<usize> {
        loop {
            let now = Instant::now();
            let n = self.members.len();
            let mut first_timer: Option<Instant> = None;
            for i in 0..n {
                self.control(i, process);
            }
            for step in 1..=n {
                let i = (self.current + step) % n;
                let member = &mut self.members[i];
                let Some(entry) = process.tree.get(member.pid) else {
                    continue;
                };
                let killed = matches!(member.state, State::Ready(Next::Kill));
                if (entry.stopped.is_some() || member.waits_for.is_some()) && !killed {
                    continue;
                }
                let signalled = entry.signals != 0;
                match member.state {
                    State::Ready(_) => return Some(i),
                    State::Blocked { until, seen } => {
                        if seen < self.exits || signalled || until.is_some_and(|t| t <= now) {
                            member.state = State::Ready(Next::Wake);
                            return Some(i);
                        }
                        if let Some(t) = until {
                            first_timer = Some(first_timer.map_or(t, |f: Instant| f.min(t)));
                        }
                    }
                    State::Ended => {}
                }
            }
            let wake = first_timer?.min(self.deadline);
            if now >= self.deadline {
                return None;
            }
            std::thread::sleep(
                wake.saturating_duration_since(now)
                    .max(Duration::from_micros(1)),
            );
        }
    }

    /// Parks the running process's part and puts member `next`'s in its place.
    fn switch_to(&mut self, next: usize, process: &mut GuestProcess) {
        if next == self.current {
            return;
        }
        process.threads.stop_cpu_clock();
        process.tree.note_ids_used(process.threads.next_id());
        let incoming = process
            .parked
            .remove(&self.members[next].pid)
            .expect("a process that is not running has its part parked");
        let outgoing = process.exchange_part(incoming);
        if !matches!(self.members[self.current].state, State::Ended) {
            process.parked.insert(outgoing.pid, outgoing);
        }
        self.current = next;
        // Other processes ran since it last did: what its waiting threads wait for (a pipe
        // another process wrote, a shared word it changed) may be ready now, however it goes
        // on (woken, or resumed where its slice ended with another thread).
        process.threads.progress();
        process.threads.reserve_ids_from(process.tree.next_id());
        if let Some(entry) = process.tree.get_mut(process.pid) {
            process.signals.pending |= std::mem::take(&mut entry.signals);
        }
        let member = &mut self.members[next];
        if member.sched.is_none() {
            if let Some(cpu) = member.cpu.as_mut() {
                member.sched = Some(Scheduler::new(
                    cpu.as_mut(),
                    process,
                    self.deadline,
                    self.limit_ms,
                ));
            }
        }
        process.threads.start_cpu_clock();
    }

    /// The run ends: the first process's part is back in `process`. With `keep`, the other
    /// live processes are returned, their parts parked; otherwise each is killed (its fds
    /// closed) and the first process is alone in the tree.
    fn finish(&mut self, process: &mut GuestProcess, keep: bool) -> Vec<Member<'a>> {
        if keep {
            if self.current != 0 {
                self.switch_to(0, process);
            }
            return self
                .members
                .drain(1..)
                .filter(|m| !matches!(m.state, State::Ended))
                .collect();
        }
        let live: Vec<usize> = (1..self.members.len())
            .filter(|&i| !matches!(self.members[i].state, State::Ended))
            .collect();
        for i in live {
            self.switch_to(i, process);
            process.close_all_fds();
            self.members[i].state = State::Ended;
            self.members[i].cpu = None;
        }
        if self.current != 0 {
            self.switch_to(0, process);
        }
        let root = self.members[0].pid;
        process.tree.keep_only(root);
        Vec::new()
    }
}

/// How often, and for how long each time, `stopped_state` runs a vCPU out of the stubs.
const STUB_RUNS: u32 = 8;
const STUB_RUN: Duration = Duration::from_millis(2);

/// The state of process `pid`'s vCPU, stopped by its slice's end, and how it goes on: where
/// it stopped, in a system call or in program code; or, stopped inside the stubs, where it is
/// once run on to its next system call (made when it next runs) or into program code.
fn stopped_state(cpu: &mut dyn GuestCpu, pid: u64) -> io::Result<(CpuSnapshot, Next)> {
    for _ in 0..STUB_RUNS {
        match cpu.snapshot() {
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {}
            state => return Ok((state?, Next::Run)),
        }
        if let Some(state) = cpu.interrupted_state()? {
            return Ok((state, Next::Run));
        }
        match cpu.run(Instant::now() + STUB_RUN)? {
            CpuExit::Syscall { nr, args } => {
                return Ok((cpu.snapshot()?, Next::Call(Call { nr, args })))
            }
            CpuExit::DeadlineReached => {}
            CpuExit::Fault(fault) => {
                return Err(io::Error::other(format!(
                    "process {pid} faulted ({fault:?}) on its way out of the VMM's stubs"
                )))
            }
        }
    }
    Err(io::Error::other(format!(
        "process {pid} did not leave the VMM's stubs"
    )))
}

/// Whether a child's end ends the whole run: its limits are the run's.
fn run_wide(status: &RunStatus) -> bool {
    matches!(
        status,
        RunStatus::Timeout { .. } | RunStatus::OutputLimit { .. } | RunStatus::NetworkLimit { .. }
    )
}
