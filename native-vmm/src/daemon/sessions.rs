//! Stateful sessions: a VM forked from a template that is kept between requests instead of
//! reset, its agent running each request as a cell in one lasting interpreter (`crate::agent`,
//! `HandOff::Cell`), checkpointed durably (`snapshot::checkpoint`), paused (checkpointed and
//! released) and resumed from its latest checkpoint, and forked from any checkpoint.
//!
//! - Each live session VM is owned by a thread of its own (a vCPU never changes threads, as in
//!   the pool); requests reach it as jobs (`LiveVm::on_vm`) and run one at a time: every
//!   operation on a session holds the session's lock for its whole duration.
//! - On disk, a session is a folder `<sessions dir>/<id>/`: `session.json` (its template, written
//!   durably when the session is created) and its checkpoints `<n>.sfck`, numbered in the order
//!   they were taken. A checkpoint is incremental (the pages written since the VM's previous
//!   checkpoint, which it names: `snapshot::checkpoint`) except the VM's first (a new session's,
//!   a fork's) and one that would make its chain longer than `MAX_CHAIN_DEPTH` or its chain's
//!   files more than `MAX_CHAIN_FACTOR` times its full checkpoint's. A VM resumed from a
//!   checkpoint builds on it: a pause after a resume holds only the pages written since. Once
//!   a checkpoint is acknowledged, the files of those the policy does not keep (the newest
//!   `SessionsConfig::keep_checkpoints` and their chains) are deleted (`Sessions::prune`).
//!   A restarted daemon finds every session there: paused when it has a checkpoint that
//!   verifies (the newest that does; a damaged newer one is reported and skipped), ended
//!   otherwise (its VM died with the old daemon before any checkpoint).
//!   Checkpoint files being written (`.writing-*`) at a start were never acknowledged and are
//!   removed. Where the folder is on storage other daemons share, any of them can resume it.
//!   With `SessionsConfig::adopt_from_siblings` (a cluster's nodes, each with its own folder
//!   under one shared parent), a request for a session this daemon does not know moves the
//!   session's folder from a sibling folder into its own (one rename) and serves it from
//!   there, as a restart would: the gateways route a session to one node at a time, and move
//!   it only once its node stopped.
//! - A session whose program ends (os._exit, a crash, a timeout or another limit) has lost its
//!   VM: it is `ended`; its checkpoints stay, so it can be forked from one.
//! - A session's VM at its ready point can be saved as a template of its own
//!   (`Sessions::save_template`, `snapshot::save_fork`): a folder of the daemon's templates
//!   directory holding its template's image (linked) and a template snapshot of the VM, which
//!   the daemon then serves as any template (`serve_template`).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::agent::{AgentRequest, CellResult, HandOff, CELL_RESULT_MAGIC};
use crate::cpu::InvalidUserState;
use crate::daemon::executor::{Execution, ExecutionLimits, SharedRestoreFactory, Usage, VmOrigin};
use crate::daemon::templates::{self, Template as DaemonTemplate};
use crate::daemon::wire::{BusyReason, ErrorCode};
use crate::fs::{NoProcess, WORK_DIR};
use crate::image::sha256;
use crate::memory::{GuestMemory, MemoryArena, PageSet};
use crate::process::Output;
use crate::sandbox::KeptProcesses;
use crate::snapshot::checkpoint::{
    self, Chain, Checkpoint, CheckpointFile, NotCheckpointable, OpenedCheckpoint, PageFingerprints,
    Pages, Parent, Written, TEMPORARY_PREFIX,
};
use crate::snapshot::sparse::PageCounts;
use crate::snapshot::sync_group::SyncGroup;
use crate::snapshot::{self, ForkMemory, SavedFork, Template, TemplateError};
use crate::status::RunStatus;
use crate::sys::thread_cpu_time;
use crate::vm::{self, LaunchError, LoopEnd, ReadyGuest, RunStats};

/// The file a session's folder is recognised by.
const SESSION_FILE: &str = "session.json";
const CHECKPOINT_EXTENSION: &str = ".sfck";
/// Session ids: what the gateway's ids (UUIDs) and a test's names need, and safe as a folder
/// name.
pub const MAX_SESSION_ID_BYTES: usize = 64;
/// Largest file put into or read from a session's /work in one request (the frame is 16 MiB,
/// and base64 grows it by a third).
pub const MAX_SESSION_FILE_BYTES: usize = 8 << 20;
/// An incremental checkpoint has at most this many parents: a restore reads that many files
/// besides its own at most.
const MAX_CHAIN_DEPTH: u64 = 16;
/// A chain's files hold at most this many times the bytes of the full checkpoint's file it
/// starts from: what a restore after a restart reads (and hashes) at most, against one full
/// file. Judged on an incremental checkpoint once captured, by its file's bytes; one that would
/// pass it is captured again, full (`Vm::checkpoint`).
const MAX_CHAIN_FACTOR: u64 = 4;
/// `SessionsConfig::keep_checkpoints` unless `serve --keep-checkpoints` says otherwise.
pub const DEFAULT_KEEP_CHECKPOINTS: u64 = 4;
pub const MAX_KEEP_CHECKPOINTS: u64 = 1 << 20;

/// Why a session operation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionError {
    pub code: ErrorCode,
    pub message: String,
}

fn refuse<T>(code: ErrorCode, message: impl Into<String>) -> Result<T, SessionError> {
    Err(SessionError {
        code,
        message: message.into(),
    })
}

fn internal(what: &str, e: impl std::fmt::Display) -> SessionError {
    SessionError {
        code: ErrorCode::Internal,
        message: format!("{what}: {e}"),
    }
}

/// A session id that breaks `check_session_id`'s rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidSessionId;

impl std::fmt::Display for InvalidSessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "session ids are 1 to {MAX_SESSION_ID_BYTES} ASCII letters, digits, '-' or '_'"
        )
    }
}

impl std::error::Error for InvalidSessionId {}

/// Checks a session id: 1 to 64 ASCII letters, digits, '-' or '_'.
pub fn check_session_id(id: &str) -> Result<(), InvalidSessionId> {
    if id.is_empty()
        || id.len() > MAX_SESSION_ID_BYTES
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(InvalidSessionId);
    }
    Ok(())
}

/// `session.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SessionRecord {
    template: String,
}

/// A checkpoint on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub number: u64,
    /// Hex SHA-256 of the file's contents before its hash (what `Checkpoint::hash` reported
    /// when it was taken).
    pub sha256: String,
    pub file_bytes: u64,
    /// Bytes of guest pages it holds (what the VM changed against its template, or since its
    /// parent).
    pub dirty_bytes: u64,
    /// The checkpoint it holds the changes since (None: a full one); reported when it is taken.
    pub parent: Option<u64>,
}

/// A checkpoint just taken, with what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenCheckpoint {
    pub info: CheckpointInfo,
    /// Recording the VM's state (in its thread, which then serves again).
    pub capture: Duration,
    /// Writing it durably.
    pub write: Duration,
    /// CPU time the VM's thread spent on both (waiting for the disk or for a core excluded).
    pub cpu: Duration,
    /// How its pages were stored.
    pub pages: PageCounts,
}

/// What a session is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    Running,
    Paused,
    Ended,
}

/// A session as `session_info` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub id: String,
    pub template: String,
    pub state: SessionState,
    pub memory_mib: u64,
    /// Oldest first.
    pub checkpoints: Vec<CheckpointInfo>,
    /// Why the session ended, when it did.
    pub ended: Option<String>,
}

/// One cell's run in a session.
#[derive(Debug, Clone)]
pub struct CellRun {
    pub execution: Execution,
    /// None when the program did not come back to its ready point (the session ended).
    pub result: Option<CellResult>,
    pub state: SessionState,
    /// The session was paused and resumed for this cell; the time that took is the
    /// execution's `vm_setup`.
    pub resumed: bool,
}

/// A session VM, as its jobs see it (on its own thread): a guest stopped at a ready point.
pub struct Vm<'m> {
    pub guest: ReadyGuest<'m>,
    /// The next cell reseeds the agent's random generators (first cell of a fresh VM or a fork).
    pub reseed: bool,
    /// Set by a job to end the VM after it (a pause, a program that ended).
    pub release: bool,
    /// Pages copied on first write as counted after the last cell: the next cell's starting
    /// count, so that each cell scans the guest's page map once, not twice.
    pub copied_pages: Option<u64>,
    /// The checkpoint the VM's memory equals except for the pages written since: the parent of
    /// its next incremental checkpoint (None: the next one is full).
    pub base: Option<Base>,
    /// Written pages taken from the logs and in no checkpoint since `base` (a checkpoint whose
    /// write failed leaves them here); None when writes are not tracked (every checkpoint full).
    pub unsaved: Option<PageSet>,
    /// What the checkpoints recorded of each page: written pages holding the same bytes again
    /// are left out of the next one.
    pub fingerprints: PageFingerprints,
    /// The processes a cell started that are still alive (`subprocess.Popen`, a server): they
    /// wait parked with the VM and run again during the next cell.
    pub children: KeptProcesses<'m>,
}

/// A VM's latest checkpoint, as its next one builds on it.
#[derive(Debug, Clone, Copy)]
pub struct Base {
    pub parent: Parent,
    /// Bytes of its chain's files, and of the full checkpoint's the chain starts from.
    pub chain_bytes: u64,
    pub full_bytes: u64,
}

impl Vm<'_> {
    /// Adds the pages written since the last call, by the guest and by the VMM, to `unsaved`.
    /// A vCPU whose write log fails stops tracking: every checkpoint after is full.
    fn take_written(&mut self) {
        let Some(unsaved) = &mut self.unsaved else {
            return;
        };
        let guest = match self.guest.cpu.take_written_pages() {
            Ok(guest) => guest,
            Err(e) => {
                super::log(format_args!(
                    "a session VM's write log failed ({e}); its checkpoints are full from now on"
                ));
                self.unsaved = None;
                return;
            }
        };
        for written in [guest, self.guest.mem.take_written()].into_iter().flatten() {
            unsaved.union_with(&written);
        }
    }

    /// Records the VM at a ready point as checkpoint `number` in `dir`, durably: incremental
    /// on `base` where the module docs allow it (a pause too), full otherwise.
    fn checkpoint(
        &mut self,
        template: &Template,
        dir: &Path,
        number: u64,
        pause: bool,
        sync: &SyncGroup,
    ) -> io::Result<(Written, u64, Option<u64>, Duration, PageCounts)> {
        let children = self.children.vms()?;
        self.take_written();
        let capturing = Instant::now();
        let mut incremental = match (&self.base, &self.unsaved) {
            (Some(base), Some(written)) if base.parent.depth < MAX_CHAIN_DEPTH => {
                Some((*base, self.fingerprints.changed(self.guest.mem, written)?))
            }
            _ => None,
        };
        let pages = match &incremental {
            Some((base, (changed, _))) => Pages::Since {
                parent: base.parent,
                changed,
            },
            None => Pages::Full,
        };
        let guest = &mut self.guest;
        let mut checkpoint = Checkpoint::capture(
            template,
            guest.mem,
            guest.cpu.as_mut(),
            &guest.process,
            &children,
            guest.call,
            pages,
        )?;
        // Judged by the file it makes (an incremental one's pages are mostly a fraction of a
        // page each); one that would make its chain too large is taken again, full.
        if incremental.as_ref().is_some_and(|(base, _)| {
            base.chain_bytes + checkpoint.file_bytes() > MAX_CHAIN_FACTOR * base.full_bytes
        }) {
            incremental = None;
            checkpoint = Checkpoint::capture(
                template,
                guest.mem,
                guest.cpu.as_mut(),
                &guest.process,
                &children,
                guest.call,
                Pages::Full,
            )?;
        }
        let fresh = match incremental {
            Some((_, (_, fresh))) => fresh,
            // A pause releases the VM once this is durable: no later checkpoint of it compares
            // pages with these, so they are not hashed. Recorded as full with none, so even
            // a VM that stayed would count every page as changed, never one as kept.
            None if pause => Vec::new(),
            None => self
                .fingerprints
                .of_ranges(self.guest.mem, checkpoint.restored_ranges())?,
        };
        let capture = capturing.elapsed();
        let written = checkpoint.write_durably(dir, &checkpoint_name(number), sync)?;
        let (dirty, parent, pages) = (checkpoint.dirty_bytes, checkpoint.parent, checkpoint.pages);
        self.fingerprints.record(parent.is_none(), fresh);
        let (chain_bytes, full_bytes) = match (parent, self.base) {
            (Some(_), Some(base)) => (base.chain_bytes + written.file_bytes, base.full_bytes),
            _ => (written.file_bytes, written.file_bytes),
        };
        self.base = Some(Base {
            parent: Parent {
                number,
                hash: written.hash,
                depth: parent.map_or(0, |p| p.depth + 1),
            },
            chain_bytes,
            full_bytes,
        });
        if let Some(unsaved) = &mut self.unsaved {
            unsaved.clear();
        }
        Ok((written, dirty, parent.map(|p| p.number), capture, pages))
    }
}

type Job = Box<dyn for<'m> FnOnce(&mut Vm<'m>) + Send>;

/// Where a new session VM comes from.
enum Origin {
    Template,
    /// Checkpoint `number`'s chain, open (`Sessions::open_chain`; files this daemon did not
    /// write are hashed to be verified). A fork reseeds (its branches must not share random
    /// state) and starts a chain of its own; a resume goes on exactly as it was, its next
    /// checkpoint building on this one.
    Checkpoint {
        chain: Chain,
        number: u64,
        fork: bool,
    },
}

/// The handle of a live session VM's thread.
struct LiveVm {
    jobs: mpsc::Sender<Job>,
    thread: Option<thread::JoinHandle<()>>,
}

impl LiveVm {
    /// Creates the VM on a thread of its own; returns once it is ready (or why it is not).
    fn start(
        template: Arc<Template>,
        restore: Arc<SharedRestoreFactory>,
        origin: Origin,
    ) -> Result<LiveVm, SessionError> {
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), SessionError>>();
        let thread = thread::Builder::new()
            .name("sandfork-session".into())
            .spawn(move || {
                let started = panic::catch_unwind(AssertUnwindSafe(|| {
                    run_vm(&template, restore.as_ref(), origin, &ready_tx, &inbox)
                }));
                if started.is_err() {
                    let _ = ready_tx.send(refuse(
                        ErrorCode::Internal,
                        "the session VM's thread panicked",
                    ));
                }
            })
            .map_err(|e| internal("starting a session thread", e))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(LiveVm {
                jobs,
                thread: Some(thread),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => refuse(
                ErrorCode::Internal,
                "the session VM's thread ended before its VM was ready",
            ),
        }
    }

    /// Runs `job` on the VM's thread and returns what it returned; None when the VM is gone
    /// (its thread ended or a job panicked).
    fn on_vm<T: Send + 'static>(
        &self,
        job: impl for<'m> FnOnce(&mut Vm<'m>) -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move |vm| {
            let _ = tx.send(job(vm));
        });
        self.jobs.send(job).ok()?;
        rx.recv().ok()
    }
}

impl Drop for LiveVm {
    /// Ends the VM: its thread sees the closed channel, destroys the VM and ends.
    fn drop(&mut self) {
        let (closed, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.jobs, closed));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A session VM's thread: creates the VM, says it is ready, runs jobs until one releases it
/// or the handle is dropped.
fn run_vm(
    template: &Template,
    restore: &SharedRestoreFactory,
    origin: Origin,
    ready: &mpsc::Sender<Result<(), SessionError>>,
    inbox: &mpsc::Receiver<Job>,
) {
    let failed = |e: SessionError| {
        let _ = ready.send(Err(e));
    };
    // Declared first: the vCPUs borrow them (the memories of the processes cells start live
    // in the arena).
    let arena = MemoryArena::new();
    let mut mem: GuestMemory;
    let (mut cpu, process, call, reseed, base, children) = match origin {
        Origin::Template => {
            mem = match template.new_memory(ForkMemory::CopyOnWrite) {
                Ok(mem) => mem,
                Err(e) => return failed(internal("creating the session's memory", e)),
            };
            mem.track_writes();
            let cpu = match restore(&mem, template.cpu()) {
                Ok(cpu) => cpu,
                Err(e) => return failed(internal("restoring the session's vCPU", e)),
            };
            let guest = template.ready_guest(&mem, cpu, 0);
            (guest.cpu, guest.process, guest.call, true, None, Vec::new())
        }
        Origin::Checkpoint {
            chain,
            number,
            fork,
        } => {
            mem = match chain.new_memory(template) {
                Ok(mem) => mem,
                Err(e) => return failed(does_not_verify(e)),
            };
            let newest = chain.newest();
            let (process, children) = match newest.process(template, 0) {
                Ok(restored) => restored,
                Err(e) => return failed(does_not_verify(e)),
            };
            mem.track_writes();
            let cpu = match restore(&mem, &newest.cpu) {
                Ok(cpu) => cpu,
                Err(e) => return failed(internal("restoring the session's vCPU", e)),
            };
            let base = Base {
                parent: Parent {
                    number,
                    hash: newest.hash,
                    depth: newest.depth,
                },
                chain_bytes: chain.file_bytes(),
                full_bytes: chain.base_file_bytes(),
            };
            (
                cpu,
                process,
                newest.call,
                fork,
                (!fork).then_some(base),
                children,
            )
        }
    };
    let unsaved = match cpu.track_writes() {
        Ok(true) => Some(PageSet::with_capacity(
            (mem.size() / crate::layout::PAGE_SIZE) as usize,
        )),
        Ok(false) => None,
        Err(e) => return failed(internal("logging the session's writes", e)),
    };
    let fingerprints = match PageFingerprints::new() {
        Ok(fingerprints) => fingerprints,
        Err(e) => return failed(internal("seeding the page fingerprints", e)),
    };
    let mut vm = Vm {
        guest: ReadyGuest {
            mem: &mem,
            cpu,
            process,
            call,
            boot: RunStats::default(),
        },
        reseed,
        release: false,
        copied_pages: None,
        base,
        unsaved,
        fingerprints,
        children: KeptProcesses::new(&arena),
    };
    if let Err(e) = vm
        .guest
        .cpu
        .map_memory(&vm.guest.process.memory_handed_out())
    {
        return failed(internal("mapping the session's memory", e));
    }
    // The checkpoint's other processes, each on a VM of its own again (their memories are
    // written: their vCPUs map them when they next run).
    for child in children {
        let child_mem = arena.keep(child.mem);
        match restore(child_mem, &child.cpu) {
            Ok(cpu) => vm.children.adopt(child.pid, cpu, child_mem, child.next),
            Err(e) => return failed(internal("restoring a process's vCPU", e)),
        }
    }
    // What the VMM wrote to set the VM up (the chain's pages, the vCPU's, the memory map's) is
    // what any restore of `base` writes again: not a change its next checkpoint must hold.
    vm.take_written();
    if let Some(unsaved) = &mut vm.unsaved {
        unsaved.clear();
    }
    // A resumed VM's pages are what `base` recorded: a page the guest writes (or KVM logs on a
    // read of a page it maps writable) with the same bytes is left out of the next checkpoint.
    if vm.base.is_some() && vm.unsaved.is_some() {
        let recorded = vm.guest.mem.copied_ranges().and_then(|ranges| {
            vm.fingerprints
                .of_ranges(vm.guest.mem, &ranges.unwrap_or_default())
        });
        match recorded {
            Ok(fresh) => vm.fingerprints.record(true, fresh),
            Err(e) => return failed(internal("fingerprinting the resumed pages", e)),
        }
    }
    if ready.send(Ok(())).is_err() {
        return;
    }
    while let Ok(job) = inbox.recv() {
        job(&mut vm);
        if vm.release {
            return;
        }
    }
}

/// Why a checkpoint was not taken. A program in a state no checkpoint may hold (see
/// `CpuSnapshot::check_user`, `checkpoint::NotCheckpointable`: a socket with an address, shared
/// memory between processes...) is refused as the request it is, not retried: the session runs
/// on, unchanged.
fn checkpoint_failed(e: io::Error) -> SessionError {
    let inner = e.get_ref();
    let why = match (
        inner.and_then(|e| e.downcast_ref::<InvalidUserState>()),
        inner.and_then(|e| e.downcast_ref::<NotCheckpointable>()),
    ) {
        (Some(why), _) => why.to_string(),
        (_, Some(why)) => why.to_string(),
        _ => return internal("writing the checkpoint", e),
    };
    SessionError {
        code: ErrorCode::BadRequest,
        message: format!("the session's program is in a state that cannot be checkpointed: {why}"),
    }
}

/// Why a session was not saved as a template: its program's state is what no template holds
/// (a request it could fix), or writing failed.
fn not_templatable(e: TemplateError) -> SessionError {
    match e {
        TemplateError::Snapshot(why) => SessionError {
            code: ErrorCode::BadRequest,
            message: format!("the session cannot be saved as a template: {why}"),
        },
        e => internal("saving the template", e),
    }
}

/// A checkpoint that cannot be restored, said so (`not_found`: a session falls back to the one
/// before); a failed read is an internal error.
fn does_not_verify(e: TemplateError) -> SessionError {
    let why = match e {
        TemplateError::Io(e) => return internal("reading the checkpoint", e),
        TemplateError::VersionMismatch { found, expected } => format!("checkpoint format {found}; this daemon reads formats {} to {expected} (older ones are not converted: 2 is from before incremental checkpoints, 4 from before sparse pages)", checkpoint::OLDEST_READ_VERSION),
        e => e.to_string(),
    };
    SessionError {
        code: ErrorCode::NotFound,
        message: format!("the checkpoint does not verify: {why}"),
    }
}

/// Runs one cell on `vm`: the cell's outcome and result, the output taken out of the process.
fn run_cell(
    vm: &mut Vm<'_>,
    request: AgentRequest,
    limits: &ExecutionLimits,
) -> Result<(Execution, Option<CellResult>), LaunchError> {
    vm.guest.process.hand_off = HandOff::Cell { reseed: vm.reseed };
    vm.guest.process.config.output_cap = limits.output_bytes;
    vm.guest.process.output = Output::new(limits.output_bytes);
    vm.guest.process.set_process_limit(limits.processes);
    let cpu_before = thread_cpu_time();
    let faults_before = vm
        .copied_pages
        .or_else(|| vm.guest.mem.copied_pages().ok().flatten());
    let (end, stats) = vm::hand_over(
        &mut vm.guest.process,
        vm.guest.mem,
        vm.guest.cpu.as_mut(),
        vm.guest.call,
        request,
        limits.timeout(),
        Some(&mut vm.children),
    )?;
    vm.reseed = false;
    let cpu = thread_cpu_time().saturating_sub(cpu_before);
    let output = std::mem::replace(&mut vm.guest.process.output, Output::new(0));
    let (stdout, stderr) = output.into_parts();
    let (status, result) = match end {
        LoopEnd::ReadyPoint { call } => {
            vm.guest.call = call;
            let result = read_cell_result(vm.guest.mem, call);
            let code = i32::from(result.error.is_some());
            (RunStatus::Exited { code }, Some(result))
        }
        other => {
            vm.release = true;
            (other.into_status(), None)
        }
    };
    vm.copied_pages = vm.guest.mem.copied_pages().ok().flatten();
    let pages_copied = vm
        .copied_pages
        .unwrap_or(0)
        .saturating_sub(faults_before.unwrap_or(0));
    let usage = Usage {
        wall_us: stats.wall.as_micros() as u64,
        cpu_us: cpu.as_micros() as u64,
        peak_memory_bytes: stats.peak_memory,
        pages_copied,
        syscalls: stats.syscalls,
        exits: stats.exits,
        threads_created: stats.threads.created,
        thread_switches: stats.threads.switches,
        network: stats.network,
        processes_created: stats.processes_created,
    };
    let execution = Execution {
        status,
        stdout,
        stderr,
        queue: Duration::ZERO,
        vm_setup: Duration::ZERO,
        run: stats.wall,
        usage,
        vm: VmOrigin::Fresh,
        result: None,
        files: None,
    };
    Ok((execution, result))
}

/// The result the agent passed with the AWAIT_REQUEST call it stopped in (`crate::agent`); an
/// agent that passed none, or something unreadable, gets an error result saying so.
fn read_cell_result(mem: &GuestMemory, call: [u64; 6]) -> CellResult {
    let unreadable = |why: &str| CellResult {
        value: None,
        error: Some(crate::agent::CellError {
            name: "SandforkAgentError".into(),
            message: why.into(),
        }),
        results: Vec::new(),
    };
    if call[4] != CELL_RESULT_MAGIC {
        return unreadable("the agent passed no cell result");
    }
    // Read as a system call reads the program's memory: user memory only.
    let user = crate::syscalls::UserMemory::new(mem);
    crate::syscalls::agent::read_result(&user, call[2], call[3])
        .unwrap_or_else(|_| unreadable("the agent's cell result is unreadable"))
}

/// Where a session stands, under its lock.
enum Slot {
    Live(LiveVm),
    /// No VM; resumed from its newest checkpoint.
    Paused,
    Ended(String),
    Deleted,
}

struct Session {
    id: String,
    template: String,
    dir: PathBuf,
    slot: Mutex<Slot>,
}

impl Session {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What the daemon's sessions need to know.
#[derive(Clone)]
pub struct SessionsConfig {
    /// Where sessions live on disk.
    pub dir: PathBuf,
    /// Sessions holding a VM at once.
    pub max_live: usize,
    /// Of a session's checkpoints, the newest this many and every one they build on (their
    /// chains) are kept; the others are deleted once a new one is acknowledged (`prune`).
    pub keep_checkpoints: u64,
    /// A session unknown here is looked for in the folders beside `dir` and moved into it.
    pub adopt_from_siblings: bool,
    /// The daemon's templates directory, where `save_template` puts the templates it makes
    /// and finds its sessions' templates' images (None: it refuses).
    pub templates_dir: Option<PathBuf>,
}

/// Every session of a daemon.
pub struct Sessions {
    config: SessionsConfig,
    /// The snapshots sessions are forked from, by template name (`serve_template` changes them).
    templates: RwLock<Vec<(String, Arc<Template>)>>,
    restore: Arc<SharedRestoreFactory>,
    table: Mutex<HashMap<String, Arc<Session>>>,
    /// Live VMs (bounded by `max_live`).
    live: Mutex<usize>,
    /// Content hashes of the checkpoint files this daemon wrote, by path: restoring one of them
    /// does not hash it again (`Origin::Checkpoint`).
    written: Mutex<HashMap<PathBuf, [u8; 32]>>,
    /// The data folder's flushes, shared by the checkpoints written at the same time.
    sync: Arc<SyncGroup>,
    /// Held while a session is moved in from a sibling folder, so that it is moved once.
    adopting: Mutex<()>,
}

/// A file in a session's /work.
pub struct SessionFile {
    pub path: String,
    pub bytes: u64,
    pub contents: Option<Vec<u8>>,
}

impl Sessions {
    /// Opens the sessions folder (creating it), finds the sessions a previous daemon left there
    /// (module docs) and serves the templates of `templates` that have a snapshot.
    pub fn open(
        config: SessionsConfig,
        templates: &[DaemonTemplate],
        restore: Arc<SharedRestoreFactory>,
    ) -> io::Result<Sessions> {
        fs::create_dir_all(&config.dir)?;
        let templates = templates
            .iter()
            .filter_map(|t| t.snapshot.clone().map(|s| (t.name.clone(), s)))
            .collect();
        let sync = Arc::new(SyncGroup::of_folder(&config.dir)?);
        let sessions = Sessions {
            config,
            templates: RwLock::new(templates),
            restore,
            table: Mutex::new(HashMap::new()),
            live: Mutex::new(0),
            written: Mutex::new(HashMap::new()),
            sync,
            adopting: Mutex::new(()),
        };
        sessions.recover()?;
        Ok(sessions)
    }

    fn table(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn recover(&self) -> io::Result<()> {
        for entry in fs::read_dir(&self.config.dir)? {
            let loaded = self.load(
                entry?.path(),
                "the daemon restarted before the session had a checkpoint",
            )?;
            if let Some(session) = loaded {
                self.table().insert(session.id.clone(), session);
            }
        }
        Ok(())
    }

    /// The session in folder `dir` as a daemon that finds it there serves it: paused when it
    /// has a checkpoint, ended (for `why`) otherwise; checkpoint files being written there were
    /// never acknowledged and are removed. None: not a session's folder.
    fn load(&self, dir: PathBuf, why: &str) -> io::Result<Option<Arc<Session>>> {
        let Some(id) = dir.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            return Ok(None);
        };
        let Ok(record) = fs::read(dir.join(SESSION_FILE))
            .map_err(|_| ())
            .and_then(|bytes| serde_json::from_slice::<SessionRecord>(&bytes).map_err(|_| ()))
        else {
            return Ok(None);
        };
        if check_session_id(&id).is_err() {
            return Ok(None);
        }
        for file in fs::read_dir(&dir)? {
            let path = file?.path();
            if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(TEMPORARY_PREFIX))
            {
                let _ = fs::remove_file(&path);
            }
        }
        let slot = if checkpoint_numbers(&dir)?.is_empty() {
            Slot::Ended(why.into())
        } else {
            Slot::Paused
        };
        Ok(Some(Arc::new(Session {
            id,
            template: record.template,
            dir,
            slot: Mutex::new(slot),
        })))
    }

    /// Moves session `id` from a folder beside this daemon's into its own and serves it
    /// (module docs); None when no sibling holds it.
    fn adopt(&self, id: &str) -> Result<Option<Arc<Session>>, SessionError> {
        let _moving = self.adopting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(session) = self.table().get(id) {
            return Ok(Some(session.clone()));
        }
        let (Some(parent), Some(own)) = (self.config.dir.parent(), self.config.dir.file_name())
        else {
            return Ok(None);
        };
        let siblings =
            fs::read_dir(parent).map_err(|e| internal("listing the sessions' parent", e))?;
        for sibling in siblings.flatten() {
            if sibling.file_name() == own {
                continue;
            }
            let from = sibling.path().join(id);
            if !from.join(SESSION_FILE).is_file() {
                continue;
            }
            let to = self.config.dir.join(id);
            fs::rename(&from, &to).map_err(|e| internal("moving an adopted session", e))?;
            let session = self
                .load(to, "its node stopped before the session had a checkpoint")
                .map_err(|e| internal("reading an adopted session", e))?;
            if let Some(session) = &session {
                super::log(format_args!(
                    "adopted session {id} from {}",
                    sibling.path().display()
                ));
                self.table().insert(id.to_owned(), session.clone());
            }
            return Ok(session);
        }
        Ok(None)
    }

    fn template(&self, name: &str) -> Result<Arc<Template>, SessionError> {
        let templates = self
            .templates
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        match templates.iter().find(|(n, _)| n == name) {
            Some((_, template)) => Ok(template.clone()),
            None => refuse(
                ErrorCode::UnknownTemplate,
                format!(
                    "no template named '{name}' with a snapshot (sessions are forked from one)"
                ),
            ),
        }
    }

    fn session(&self, id: &str) -> Result<Arc<Session>, SessionError> {
        if let Some(session) = self.table().get(id) {
            return Ok(session.clone());
        }
        if self.config.adopt_from_siblings && check_session_id(id).is_ok() {
            if let Some(session) = self.adopt(id)? {
                return Ok(session);
            }
        }
        refuse(ErrorCode::NotFound, format!("no session '{id}'"))
    }

    /// Takes a live-VM slot (released by `release_live`).
    fn acquire_live(&self) -> Result<(), SessionError> {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if *live >= self.config.max_live {
            return refuse(
                ErrorCode::Busy(BusyReason::SessionsFull),
                format!(
                    "the daemon holds its maximum of {} running sessions; pause one",
                    self.config.max_live
                ),
            );
        }
        *live += 1;
        Ok(())
    }

    fn release_live(&self) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        *live = live.saturating_sub(1);
    }

    /// Starts a VM for a session (counted against `max_live`).
    fn start_vm(&self, template: &str, origin: Origin) -> Result<LiveVm, SessionError> {
        let template = self.template(template)?;
        self.acquire_live()?;
        LiveVm::start(template, self.restore.clone(), origin).inspect_err(|_| self.release_live())
    }

    /// Ends a slot's VM, if it has one, and puts `next` in its place.
    fn set_slot(&self, slot: &mut Slot, next: Slot) {
        if let Slot::Live(_) = std::mem::replace(slot, next) {
            self.release_live();
        }
    }

    /// Serves sessions of template `name` from `snapshot` (a template loaded after the start),
    /// replacing one of that name; None: no more new sessions of it (those running go on).
    pub fn serve_template(&self, name: &str, snapshot: Option<Arc<Template>>) {
        let mut templates = self
            .templates
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        templates.retain(|(n, _)| n != name);
        if let Some(snapshot) = snapshot {
            templates.push((name.to_owned(), snapshot));
        }
    }

    /// Saves session `id` (resumed first when paused; it runs on unchanged) as template `name`:
    /// the folder `name` of the templates directory, made under a hidden name (its session's
    /// template's image linked in, `snapshot::save_fork` of the VM) and renamed into place.
    /// Refused: a name taken (templates are immutable) or not a folder name, a session that
    /// ended, a program holding what a template cannot (`GuestProcess::encode_state`). `load`
    /// then serves it (`session_protocol::LoadTemplate`); when it fails, the folder is removed.
    pub fn save_template(
        &self,
        id: &str,
        name: &str,
        load: &dyn Fn(&str) -> Result<(), SessionError>,
    ) -> Result<SavedFork, SessionError> {
        let Some(dir) = self.config.templates_dir.clone() else {
            return refuse(ErrorCode::BadRequest, "this daemon makes no templates");
        };
        templates::check_folder_name(name)
            .or_else(|why| refuse(ErrorCode::BadRequest, format!("name: {why}")))?;
        let session = self.session(id)?;
        let base = self.template(&session.template)?;
        let mut slot = session.lock();
        let target = dir.join(name);
        if target.exists() {
            return refuse(
                ErrorCode::BadRequest,
                format!("a template named '{name}' exists; templates are immutable"),
            );
        }
        let building = dir.join(format!(".session-{id}-{name}"));
        let _ = fs::remove_dir_all(&building);
        let origin = serde_json::json!({"session": id, "template": session.template});
        let prepared = fs::create_dir_all(&building)
            .and_then(|()| templates::link_image(&dir.join(&session.template), &building))
            .and_then(|()| {
                fs::write(
                    building.join(templates::SAVED_SESSION_FILE),
                    origin.to_string(),
                )
            });
        if let Err(e) = prepared {
            let _ = fs::remove_dir_all(&building);
            return Err(internal("preparing the template's folder", e));
        }
        let (name_owned, folder) = (name.to_owned(), building.clone());
        let saved = self
            .on_live(&session, &mut slot, move |vm| {
                snapshot::save_fork(&base, &name_owned, &mut vm.guest, &folder)
            })
            .and_then(|(saved, _, _)| saved.map_err(not_templatable))
            .and_then(|saved| {
                fs::rename(&building, &target)
                    .map_err(|e| internal("moving the template into place", e))?;
                if let Err(e) = load(name) {
                    let _ = fs::remove_dir_all(&target);
                    return Err(e);
                }
                Ok(saved)
            });
        if saved.is_err() {
            let _ = fs::remove_dir_all(&building);
        }
        saved
    }

    /// Creates session `id`: a VM forked from `template`, its folder on disk. `memory_mib`
    /// must be the template's VM size when given.
    pub fn create(
        &self,
        id: &str,
        template: &str,
        memory_mib: Option<u64>,
    ) -> Result<SessionInfo, SessionError> {
        let snapshot = self.template(template)?;
        let template_mib = snapshot.identity().mem_bytes >> 20;
        if memory_mib.is_some_and(|m| m != template_mib) {
            return refuse(
                ErrorCode::BadRequest,
                format!("memory_mib: the '{template}' template's sessions have {template_mib} MiB"),
            );
        }
        self.register(id, template, || self.start_vm(template, Origin::Template))
    }

    /// Adds session `id` of `template` (refused when the id is taken): its folder and record
    /// on disk, then its VM from `start`. A failure undoes both.
    fn register(
        &self,
        id: &str,
        template: &str,
        start: impl FnOnce() -> Result<LiveVm, SessionError>,
    ) -> Result<SessionInfo, SessionError> {
        let dir = self.config.dir.join(id);
        let session = Arc::new(Session {
            id: id.to_owned(),
            template: template.to_owned(),
            dir: dir.clone(),
            slot: Mutex::new(Slot::Deleted),
        });
        let mut slot = session.lock();
        {
            let mut table = self.table();
            if table.contains_key(id) {
                return refuse(
                    ErrorCode::BadRequest,
                    format!("session '{id}' already exists"),
                );
            }
            table.insert(id.to_owned(), session.clone());
        }
        match write_record(
            &dir,
            &SessionRecord {
                template: template.to_owned(),
            },
        )
        .and_then(|()| start())
        {
            Ok(vm) => {
                *slot = Slot::Live(vm);
                drop(slot);
                self.info(id)
            }
            Err(e) => {
                self.table().remove(id);
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Makes sure the session has a VM, resuming it from its newest checkpoint that verifies
    /// when paused; says whether it resumed and how long that took.
    fn ensure_live(
        &self,
        session: &Session,
        slot: &mut Slot,
    ) -> Result<Option<Duration>, SessionError> {
        match slot {
            Slot::Live(_) => return Ok(None),
            Slot::Ended(why) => {
                return refuse(
                    ErrorCode::SessionEnded,
                    format!("session '{}' has ended: {why}", session.id),
                )
            }
            Slot::Deleted => {
                return refuse(ErrorCode::NotFound, format!("no session '{}'", session.id))
            }
            Slot::Paused => {}
        }
        let started = Instant::now();
        // The newest checkpoint that verifies: a newer one that does not (a write the disk
        // acknowledged but tore) is logged and skipped.
        let numbers =
            checkpoint_numbers(&session.dir).map_err(|e| internal("listing checkpoints", e))?;
        for &number in numbers.iter().rev() {
            let started_vm = self.open_chain(session, number).and_then(|chain| {
                self.start_vm(
                    &session.template,
                    Origin::Checkpoint {
                        chain,
                        number,
                        fork: false,
                    },
                )
            });
            match started_vm {
                Ok(vm) => {
                    *slot = Slot::Live(vm);
                    return Ok(Some(started.elapsed()));
                }
                Err(e) if e.code == ErrorCode::NotFound => super::log(format_args!(
                    "session {}: checkpoint {number}: {}; using the one before",
                    session.id, e.message
                )),
                Err(e) => return Err(e),
            }
        }
        refuse(
            ErrorCode::SessionEnded,
            format!("session '{}' has no checkpoint that verifies", session.id),
        )
    }

    /// Runs `job` on the session's VM (resumed first when paused); also says how long a resume
    /// took and whether the job released the VM.
    fn with_vm<T: Send + 'static>(
        &self,
        id: &str,
        job: impl for<'m> FnOnce(&mut Vm<'m>) -> T + Send + 'static,
    ) -> Result<(T, Option<Duration>, bool), SessionError> {
        let session = self.session(id)?;
        let mut slot = session.lock();
        self.on_live(&session, &mut slot, job)
    }

    /// `with_vm` under the session's lock, held by the caller. A VM that went away under the
    /// job (a panic) ends the session.
    fn on_live<T: Send + 'static>(
        &self,
        session: &Session,
        slot: &mut Slot,
        job: impl for<'m> FnOnce(&mut Vm<'m>) -> T + Send + 'static,
    ) -> Result<(T, Option<Duration>, bool), SessionError> {
        let resumed = self.ensure_live(session, slot)?;
        let Slot::Live(vm) = &*slot else {
            unreachable!("ensure_live leaves a live VM")
        };
        let (tx, rx) = mpsc::channel();
        let answer = vm.on_vm(move |vm| {
            let value = job(vm);
            let _ = tx.send(vm.release);
            value
        });
        match answer {
            Some(value) => Ok((value, resumed, rx.recv().unwrap_or(true))),
            None => {
                self.set_slot(slot, Slot::Ended("the session's VM failed".into()));
                refuse(
                    ErrorCode::SessionEnded,
                    format!("session '{}' has ended: its VM failed", session.id),
                )
            }
        }
    }

    /// Runs `code` as the session's next cell.
    pub fn execute(
        &self,
        id: &str,
        code: String,
        env: Vec<(String, String)>,
        limits: ExecutionLimits,
        network: crate::net::Grant,
    ) -> Result<CellRun, SessionError> {
        let mut request = AgentRequest::new("");
        request.code = code;
        request.env = env;
        request.network = network;
        request
            .validate()
            .or_else(|e| refuse(ErrorCode::BadRequest, e.0))?;
        let session = self.session(id)?;
        let template_mib = self.template(&session.template)?.identity().mem_bytes >> 20;
        let limits = ExecutionLimits {
            memory_mib: template_mib,
            ..limits
        };
        let mut slot = session.lock();
        let (ran, resumed, released) = self.on_live(&session, &mut slot, move |vm| {
            run_cell(vm, request, &limits)
        })?;
        let ran = ran.map_err(|e| internal("running the cell", e));
        if released || ran.is_err() {
            let why = ran.as_ref().map_or_else(
                |e| e.message.clone(),
                |(execution, _)| format!("its program stopped ({})", execution.status.kind()),
            );
            self.set_slot(&mut slot, Slot::Ended(why));
        }
        let (mut execution, result) = ran?;
        let state = if released {
            SessionState::Ended
        } else {
            SessionState::Running
        };
        execution.vm_setup = resumed.unwrap_or_default();
        Ok(CellRun {
            execution,
            result,
            state,
            resumed: resumed.is_some(),
        })
    }

    /// Takes a checkpoint of the running (or paused: resumed first) session, durably; with
    /// `pause`, the VM is released once the checkpoint is on disk (a failed write leaves it
    /// running, its state intact).
    pub fn checkpoint(&self, id: &str, pause: bool) -> Result<TakenCheckpoint, SessionError> {
        let session = self.session(id)?;
        let template = self.template(&session.template)?;
        if pause && matches!(*session.lock(), Slot::Paused) {
            // Already paused: its newest checkpoint is its state.
            let newest = self
                .info(id)?
                .checkpoints
                .pop()
                .ok_or_else(|| internal("a paused session", "has no checkpoint"))?;
            return Ok(TakenCheckpoint {
                info: newest,
                capture: Duration::ZERO,
                write: Duration::ZERO,
                cpu: Duration::ZERO,
                pages: PageCounts::default(),
            });
        }
        if matches!(*session.lock(), Slot::Ended(_)) {
            return refuse(
                ErrorCode::SessionEnded,
                format!("session '{id}' has ended; fork it from a checkpoint"),
            );
        }
        let mut slot = session.lock();
        let number = checkpoint_numbers(&session.dir)
            .map_err(|e| internal("listing checkpoints", e))?
            .last()
            .map_or(1, |n| n + 1);
        let (dir, sync) = (session.dir.clone(), self.sync.clone());
        // Recorded and written from the stopped VM's memory on its own thread; a pause releases
        // the VM only once its checkpoint is on disk.
        let (written, _, released) = self.on_live(&session, &mut slot, move |vm| {
            let cpu_before = thread_cpu_time();
            let started = Instant::now();
            let (written, dirty_bytes, parent, capture, pages) =
                vm.checkpoint(&template, &dir, number, pause, &sync)?;
            vm.release = pause;
            Ok::<_, io::Error>((
                written,
                dirty_bytes,
                parent,
                capture,
                pages,
                started.elapsed().saturating_sub(capture),
                thread_cpu_time().saturating_sub(cpu_before),
            ))
        })?;
        if released {
            self.set_slot(&mut slot, Slot::Paused);
        }
        let (Written { hash, file_bytes }, dirty_bytes, parent, capture, pages, write, cpu) =
            written.map_err(checkpoint_failed)?;
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session.dir.join(checkpoint_name(number)), hash);
        self.prune(&session);
        let info = CheckpointInfo {
            number,
            sha256: sha256::to_hex(&hash),
            file_bytes,
            dirty_bytes,
            parent,
        };
        Ok(TakenCheckpoint {
            info,
            capture,
            write,
            cpu,
            pages,
        })
    }

    /// Deletes the checkpoints of `session` that the policy does not keep: of its newest
    /// `keep_checkpoints`, each and the parents it builds on back to its full checkpoint are
    /// kept, every other file is deleted. Called under the session's lock once a checkpoint is
    /// acknowledged; a file whose head cannot be read (torn, damaged, an old format) names no
    /// parent. What cannot be deleted now is left for the next checkpoint's prune.
    fn prune(&self, session: &Session) {
        let Ok(numbers) = checkpoint_numbers(&session.dir) else {
            return;
        };
        let Ok(template) = self.template(&session.template) else {
            return;
        };
        let newest = numbers
            .len()
            .saturating_sub(self.config.keep_checkpoints as usize);
        let mut kept: Vec<u64> = numbers[newest..].to_vec();
        let mut next = 0;
        while let Some(&number) = kept.get(next) {
            next += 1;
            let parent = self
                .open_checkpoint(session, number)
                .ok()
                .and_then(|(file, known)| {
                    OpenedCheckpoint::open(file, &template, known.as_ref())
                        .ok()
                        .and_then(|opened| opened.parent)
                });
            if let Some((parent, _)) = parent.filter(|(p, _)| !kept.contains(p)) {
                kept.push(parent);
            }
        }
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        for number in numbers.into_iter().filter(|n| !kept.contains(n)) {
            let path = session.dir.join(checkpoint_name(number));
            match fs::remove_file(&path) {
                Ok(()) => {
                    written.remove(&path);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    written.remove(&path);
                }
                Err(e) => super::log(format_args!(
                    "session '{}': deleting checkpoint {number}: {e}",
                    session.id
                )),
            }
        }
    }

    /// Resumes a paused session (a running one is left as it is); says how long it took.
    pub fn resume(&self, id: &str) -> Result<Option<Duration>, SessionError> {
        let session = self.session(id)?;
        let mut slot = session.lock();
        self.ensure_live(&session, &mut slot)
    }

    /// Creates session `id` from checkpoint `number` of session `from` (running, paused or
    /// ended): a new VM with that state, its random generators reseeded.
    pub fn fork(&self, id: &str, from: &str, number: u64) -> Result<SessionInfo, SessionError> {
        let source = self.session(from)?;
        let about = |e: SessionError| match e.code {
            ErrorCode::NotFound => SessionError {
                code: e.code,
                message: format!("checkpoint {number} of session '{from}': {}", e.message),
            },
            _ => e,
        };
        let chain = {
            let _slot = source.lock();
            self.open_chain(&source, number).map_err(about)?
        };
        self.register(id, &source.template, || {
            self.start_vm(
                &source.template,
                Origin::Checkpoint {
                    chain,
                    number,
                    fork: true,
                },
            )
            .map_err(about)
        })
    }

    /// Opens checkpoint `number` of `session` and the parents it builds on (`Chain::open`):
    /// `not_found` when it is missing or does not verify.
    fn open_chain(&self, session: &Session, number: u64) -> Result<Chain, SessionError> {
        let template = self.template(&session.template)?;
        let (file, known) = self
            .open_checkpoint(session, number)
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => SessionError {
                    code: ErrorCode::NotFound,
                    message: format!("session '{}' has no checkpoint {number}", session.id),
                },
                _ => internal("reading the checkpoint", e),
            })?;
        let newest =
            OpenedCheckpoint::open(file, &template, known.as_ref()).map_err(does_not_verify)?;
        Chain::open(newest, &template, |parent| {
            self.open_checkpoint(session, parent)
        })
        .map_err(does_not_verify)
    }

    /// Opens checkpoint `number` of `session`, with the hash this daemon wrote it with, if it did.
    fn open_checkpoint(
        &self,
        session: &Session,
        number: u64,
    ) -> io::Result<(CheckpointFile, Option<[u8; 32]>)> {
        let path = session.dir.join(checkpoint_name(number));
        let file = checkpoint::open_file(&path)?;
        let known = self
            .written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&path)
            .copied();
        Ok((file, known))
    }

    /// Ends a session and removes it and its checkpoints.
    pub fn delete(&self, id: &str) -> Result<(), SessionError> {
        let session = self.session(id)?;
        let mut slot = session.lock();
        self.set_slot(&mut slot, Slot::Deleted);
        self.table().remove(id);
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|path, _| !path.starts_with(&session.dir));
        fs::remove_dir_all(&session.dir).or_else(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(internal("removing the session's folder", e))
            }
        })
    }

    pub fn info(&self, id: &str) -> Result<SessionInfo, SessionError> {
        let session = self.session(id)?;
        let slot = session.lock();
        let (state, ended) = match &*slot {
            Slot::Live(_) => (SessionState::Running, None),
            Slot::Paused => (SessionState::Paused, None),
            Slot::Ended(why) => (SessionState::Ended, Some(why.clone())),
            Slot::Deleted => return refuse(ErrorCode::NotFound, format!("no session '{id}'")),
        };
        let mut checkpoints = Vec::new();
        for number in
            checkpoint_numbers(&session.dir).map_err(|e| internal("listing checkpoints", e))?
        {
            if let Ok((sha256, file_bytes)) =
                stored_hash(&session.dir.join(checkpoint_name(number)))
            {
                checkpoints.push(CheckpointInfo {
                    number,
                    sha256,
                    file_bytes,
                    dirty_bytes: 0,
                    parent: None,
                });
            }
        }
        let memory_mib = self
            .template(&session.template)
            .map_or(0, |t| t.identity().mem_bytes >> 20);
        Ok(SessionInfo {
            id: id.to_owned(),
            template: session.template.clone(),
            state,
            memory_mib,
            checkpoints,
            ended,
        })
    }

    /// Every session, by id.
    pub fn list(&self) -> Vec<SessionInfo> {
        let mut ids: Vec<String> = self.table().keys().cloned().collect();
        ids.sort();
        ids.iter().filter_map(|id| self.info(id).ok()).collect()
    }

    /// Writes `contents` as `path` under the session's /work (replacing a file there).
    pub fn write_file(
        &self,
        id: &str,
        path: String,
        contents: Vec<u8>,
    ) -> Result<SessionFile, SessionError> {
        check_file_path(&path)?;
        if contents.len() > MAX_SESSION_FILE_BYTES {
            return refuse(
                ErrorCode::BadRequest,
                format!(
                    "content: {} bytes, more than {MAX_SESSION_FILE_BYTES}",
                    contents.len()
                ),
            );
        }
        let bytes = contents.len() as u64;
        let target = path.clone();
        let (written, _, _) = self.with_vm(id, move |vm| {
            crate::syscalls::agent::write_work_file(
                &mut vm.guest.process.config.vfs,
                &target,
                &contents,
                true,
            )
        })?;
        written.or_else(|errno| {
            refuse(
                file_error_code(errno),
                format!("{WORK_DIR}/{path}: {}", errno_text(errno)),
            )
        })?;
        Ok(SessionFile {
            path,
            bytes,
            contents: None,
        })
    }

    /// Reads the file `path` under the session's /work.
    pub fn read_file(&self, id: &str, path: String) -> Result<SessionFile, SessionError> {
        check_file_path(&path)?;
        let target = path.clone();
        let (read, _, _) = self.with_vm(id, move |vm| {
            let vfs = &vm.guest.process.config.vfs;
            let node = vfs.resolve(vfs.root(), format!("{WORK_DIR}/{target}").as_bytes(), false)?;
            if vfs.kind(node)? != crate::fs::FileKind::Regular {
                return Err(crate::errno::Errno::EISDIR);
            }
            let contents = vfs.contents(node)?;
            if contents.len() > MAX_SESSION_FILE_BYTES {
                return Err(crate::errno::Errno::EFBIG);
            }
            Ok(contents.to_vec())
        })?;
        let contents = read.or_else(|errno| {
            refuse(
                file_error_code(errno),
                format!("{WORK_DIR}/{path}: {}", errno_text(errno)),
            )
        })?;
        Ok(SessionFile {
            path,
            bytes: contents.len() as u64,
            contents: Some(contents),
        })
    }

    /// Removes the file `path` under the session's /work (a file the program holds open stays
    /// readable through its descriptor, as on Linux).
    pub fn delete_file(&self, id: &str, path: String) -> Result<SessionFile, SessionError> {
        check_file_path(&path)?;
        let target = path.clone();
        let (removed, _, _) = self.with_vm(id, move |vm| {
            let vfs = &mut vm.guest.process.config.vfs;
            let work = vfs.resolve(vfs.root(), WORK_DIR.as_bytes(), true)?;
            vfs.unlink(&NoProcess, work, target.as_bytes())
        })?;
        removed.or_else(|errno| {
            refuse(
                file_error_code(errno),
                format!("{WORK_DIR}/{path}: {}", errno_text(errno)),
            )
        })?;
        Ok(SessionFile {
            path,
            bytes: 0,
            contents: None,
        })
    }
}

impl Drop for Sessions {
    /// Live VMs end with the daemon; what they hold since their last checkpoint is lost, as
    /// after a crash (a clean stop pauses nothing: the gateway decides when to pause).
    fn drop(&mut self) {
        for session in self.table().values() {
            self.set_slot(&mut session.lock(), Slot::Deleted);
        }
    }
}

fn check_file_path(path: &str) -> Result<(), SessionError> {
    crate::agent::check_work_path(path)
        .or_else(|why| refuse(ErrorCode::BadRequest, format!("path {path:?}: {why}")))
}

fn file_error_code(errno: crate::errno::Errno) -> ErrorCode {
    if errno == crate::errno::Errno::ENOENT {
        ErrorCode::NotFound
    } else {
        ErrorCode::BadRequest
    }
}

fn errno_text(errno: crate::errno::Errno) -> &'static str {
    use crate::errno::Errno;
    match errno {
        Errno::ENOENT => "no such file",
        Errno::EISDIR => "is a directory, not a file",
        Errno::ENOTDIR => "a parent is not a directory",
        Errno::ENOSPC => "the session's file system is full",
        Errno::EFBIG => "the file is larger than a request can carry",
        Errno::EEXIST => "exists",
        Errno::ELOOP => "is a symbolic link",
        _ => "refused by the file system",
    }
}

fn checkpoint_name(number: u64) -> String {
    format!("{number:012}{CHECKPOINT_EXTENSION}")
}

/// The numbers of a session folder's checkpoint files, ascending.
fn checkpoint_numbers(dir: &Path) -> io::Result<Vec<u64>> {
    let mut numbers = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        if let Some(number) = name
            .to_str()
            .and_then(|n| n.strip_suffix(CHECKPOINT_EXTENSION))
            .and_then(|n| n.parse().ok())
        {
            numbers.push(number);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

/// The content hash a checkpoint file ends with (hex; verified only when it is restored) and
/// the file's size.
fn stored_hash(path: &Path) -> io::Result<(String, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = fs::File::open(path)?;
    let len = file.metadata()?.len();
    let mut hash = [0u8; 32];
    if len >= 32 {
        file.seek(SeekFrom::End(-32))?;
        file.read_exact(&mut hash)?;
    }
    Ok((sha256::to_hex(&hash), len))
}

/// Writes `session.json` durably into a new folder `dir`.
fn write_record(dir: &Path, record: &SessionRecord) -> Result<(), SessionError> {
    let written = (|| {
        fs::create_dir(dir)?;
        let temporary = dir.join(format!("{TEMPORARY_PREFIX}{SESSION_FILE}"));
        let mut file = fs::File::create(&temporary)?;
        io::Write::write_all(
            &mut file,
            &serde_json::to_vec(record).map_err(io::Error::other)?,
        )?;
        file.sync_data()?;
        fs::rename(&temporary, dir.join(SESSION_FILE))?;
        fs::File::open(dir)?.sync_all()?;
        fs::File::open(dir.parent().unwrap_or(Path::new("/")))?.sync_all()
    })();
    written.map_err(|e| internal("creating the session's folder", e))
}
