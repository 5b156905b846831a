//! Template snapshots and restoring from them.
//!
//! A template is a guest booted to its agent's READY POINT (`vm::boot_agent`: stopped inside
//! AWAIT_REQUEST, see `crate::agent`) and recorded: guest memory, the vCPU's user state
//! (`cpu::CpuSnapshot`), the VMM-side process state (`GuestProcess::encode_state`: fd table,
//! memory-map records, overlay files, signal state, working directory; counters reset), and
//! what it was built from (the image's content hash, the agent's hash, the memory size). On
//! disk it is one file, `<dir>/template.sfsnap`, laid out and hashed as `file` describes; it
//! is rebuilt only when what it was built from changes (`build`).
//!
//! Restoring: `Template::load` verifies the file and puts its memory into a memfd
//! (`memory::TemplateMemory`) once. Each VM from it then needs its own memory and vCPU:
//! * product (KVM): `GuestMemory::fork_of` — a private copy-on-write mapping of the template's
//!   memfd, nothing copied — and `KvmCpu::restore` (`kvm::restore_cpu`); a pooled VM is later
//!   put back into the template's state by `reset` instead of being destroyed.
//! * the ptrace development CPU (tests, `SANDFORK_TEST_CPU=ptrace`): the traced child maps
//!   guest memory shared, which a private mapping cannot be, so `ForkMemory::Copy` gives each
//!   VM a full copy of the template's pages (`TemplateMemory::copy`).
//!   The end-to-end tests in tests/snapshot_ptrace.rs run on KVM.
//!
//! A restored guest is a `vm::ReadyGuest`: `serve` answers its pending AWAIT_REQUEST with the
//! request, exactly as on a freshly booted guest. The agent draws fresh randomness after the
//! hand-off, so forks of one template do not share random state.

#[cfg(feature = "bench")]
pub mod bench;
mod blocks;
pub mod checkpoint;
pub mod file;
pub mod sparse;
pub mod sync_group;

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::Digest;

use crate::agent::{AgentCommand, AgentRequest};
use crate::codec::{DecodeError, Decoder, Encoder};
use crate::cpu::{CpuSnapshot, GuestCpu};
use crate::fs::Image;
use crate::image::sha256::{self, Sha256};
use crate::memory::{GuestMemory, TemplateMemory};
use crate::process::{GuestProcess, Output};
use crate::vm::{self, CpuFactory, LaunchError, ReadyGuest, RunLimits, RunOutcome, RunStats};
pub use file::{MemoryStats, FORMAT_VERSION};

/// The template file inside a template directory.
pub const TEMPLATE_FILE: &str = "template.sfsnap";

/// What a template was built from: when any of it changes, the template is rebuilt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateIdentity {
    pub name: String,
    /// The file image's content hash (`Image::content_hash`).
    pub image_hash: [u8; 32],
    /// `agent_hash` of the agent command over that image.
    pub agent_hash: [u8; 32],
    /// Guest memory size: every VM of the template has exactly this much.
    pub mem_bytes: u64,
}

impl TemplateIdentity {
    pub fn new(
        name: &str,
        image: &Image,
        command: &AgentCommand,
        mem_bytes: u64,
    ) -> TemplateIdentity {
        TemplateIdentity {
            name: name.to_owned(),
            image_hash: image.content_hash(),
            agent_hash: agent_hash(image, command),
            mem_bytes,
        }
    }
}

/// SHA-256 over the agent's command line, its working directory and the image's bytes of every
/// argument that names a file in the image (the agent script): the agent changes when any does.
/// (The script is in the image too; this hash says which part of the image is the agent.)
pub fn agent_hash(image: &Image, command: &AgentCommand) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"sandfork agent\0");
    h.update(command.program.as_bytes());
    h.update(b"\0cwd\0");
    h.update(command.cwd.as_bytes());
    for arg in command.argv {
        h.update(b"\0arg\0");
        h.update(arg.as_bytes());
        if let Some(bytes) = image.file_bytes(arg) {
            h.update(b"\0file\0");
            h.update(sha256::digest(bytes));
        }
    }
    h.finalize().into()
}

/// Why a template could not be built, read or used.
#[derive(Debug)]
pub enum TemplateError {
    Io(io::Error),
    /// The file does not start with the template magic.
    NotATemplate,
    /// The file is shorter than its header says.
    Truncated {
        expected: u64,
        actual: u64,
    },
    /// Written by a different format version of sandfork-vmm.
    VersionMismatch {
        found: u32,
        expected: u32,
    },
    /// The content hash does not match, or the contents do not decode.
    Corrupted(String),
    /// Built from a different file image.
    ImageMismatch {
        template: [u8; 32],
        image: [u8; 32],
    },
    /// Built with a different agent (command or script).
    AgentMismatch,
    /// Booting the agent to its ready point failed.
    Boot(LaunchError),
    /// The guest at its ready point could not be recorded.
    Snapshot(String),
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = |h: &[u8; 32]| sha256::to_hex(h);
        match self {
            TemplateError::Io(e) => write!(f, "template file: {e}"),
            TemplateError::NotATemplate => write!(f, "not a Sandfork template file (bad magic)"),
            TemplateError::Truncated { expected, actual } => write!(f, "template file is truncated: {actual} bytes, expected {expected}"),
            TemplateError::VersionMismatch { found, expected } => write!(f, "template format version {found}, this sandfork-vmm reads version {expected}: rebuild the template"),
            TemplateError::Corrupted(why) => write!(f, "template file is corrupted: {why}"),
            TemplateError::ImageMismatch { template, image } => {
                write!(f, "template was built from image {} but the image is now {}: rebuild the template", hex(template), hex(image))
            }
            TemplateError::AgentMismatch => write!(f, "template was built with a different agent: rebuild the template"),
            TemplateError::Boot(e) => write!(f, "booting the template's agent: {e}"),
            TemplateError::Snapshot(why) => write!(f, "recording the template: {why}"),
        }
    }
}

impl std::error::Error for TemplateError {}

impl From<io::Error> for TemplateError {
    fn from(e: io::Error) -> TemplateError {
        TemplateError::Io(e)
    }
}

impl From<DecodeError> for TemplateError {
    fn from(e: DecodeError) -> TemplateError {
        TemplateError::Corrupted(e.0)
    }
}

/// What `build` did.
#[derive(Debug, Clone)]
pub enum BuildOutcome {
    /// The template on disk was built from the same image, agent and memory size: kept.
    UpToDate { path: PathBuf },
    Built {
        path: PathBuf,
        file_bytes: u64,
        memory: MemoryStats,
        boot: Box<RunStats>,
        snapshot: Duration,
    },
}

impl fmt::Display for BuildOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildOutcome::UpToDate { path } => write!(f, "template {} is up to date (same image, agent and memory size)", path.display()),
            BuildOutcome::Built { path, file_bytes, memory, boot, snapshot } => write!(
                f,
                "template {}: {file_bytes} bytes ({} memory runs, {} bytes of non-zero pages); agent booted to its ready point in {:?} ({} system calls), recorded in {snapshot:?}",
                path.display(),
                memory.runs,
                memory.stored_bytes,
                boot.load + boot.wall,
                boot.syscalls
            ),
        }
    }
}

/// Builds the template `name` of `image` into `dir/template.sfsnap`, unless the file there
/// verifies and was built from the same image, agent and memory size (`limits.mem_bytes`). The
/// agent boots on a vCPU from `make_cpu` (KVM in the product) to its ready point, within
/// `limits.boot_timeout`, where everything is recorded.
/// The file is written to a temporary name and renamed into place.
pub fn build(
    image: Arc<Image>,
    name: &str,
    command: &AgentCommand,
    limits: &RunLimits,
    make_cpu: &CpuFactory,
    dir: &Path,
) -> Result<BuildOutcome, TemplateError> {
    let path = dir.join(TEMPLATE_FILE);
    let identity = TemplateIdentity::new(name, &image, command, limits.mem_bytes);
    if let Ok(bytes) = std::fs::read(&path) {
        if read_identity(&bytes).is_ok_and(|existing| existing == identity) {
            return Ok(BuildOutcome::UpToDate { path });
        }
    }
    let (recorded, boot, snapshot) =
        vm::boot_agent(image, command, limits, make_cpu, |mut ready| {
            let started = Instant::now();
            let recorded = ready
                .mem
                .data_extents()
                .map_err(TemplateError::Io)
                .and_then(|extents| record(&identity, &mut ready, &extents));
            (recorded, ready.boot, started.elapsed())
        })
        .map_err(TemplateError::Boot)?;
    let (body, memory) = recorded?;
    let file_bytes = write_file(dir, &body)?;
    Ok(BuildOutcome::Built {
        path,
        file_bytes,
        memory,
        boot: Box::new(boot),
        snapshot,
    })
}

/// Seals `body` into `dir/template.sfsnap` durably: written and synced under a temporary name,
/// then renamed into place. Returns the file's length.
fn write_file(dir: &Path, body: &[u8]) -> io::Result<u64> {
    let contents = file::seal(body);
    std::fs::create_dir_all(dir)?;
    let temporary = dir.join(format!(".{TEMPLATE_FILE}.{}", std::process::id()));
    let written = (|| {
        let mut out = std::fs::File::create(&temporary)?;
        out.write_all(&contents)?;
        out.sync_all()?;
        std::fs::rename(&temporary, dir.join(TEMPLATE_FILE))
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(e);
    }
    Ok(contents.len() as u64)
}

/// What `save_fork` wrote.
#[derive(Debug, Clone, Copy)]
pub struct SavedFork {
    pub file_bytes: u64,
    pub memory: MemoryStats,
    /// Recording the VM (its memory read, its state encoded), before the file was written.
    pub capture: Duration,
    pub write: Duration,
}

/// Records a VM of `base` stopped at a ready point (a session's, between cells) as a template
/// of its own named `name`, in `dir/template.sfsnap`: the same file a build writes, over the
/// same image and agent, so that it loads and forks exactly as `base` does. Its memory is
/// `base`'s with the pages the VM copied read over it; its process state is the VM's (the
/// `/work` files, fds, memory map), refused as `encode_state` refuses (a socket with an
/// address, an armed timer). The VM is left as it was.
pub fn save_fork(
    base: &Template,
    name: &str,
    ready: &mut ReadyGuest<'_>,
    dir: &Path,
) -> Result<SavedFork, TemplateError> {
    let started = Instant::now();
    let identity = TemplateIdentity {
        name: name.to_owned(),
        ..base.identity.clone()
    };
    let extents = match ready.mem.copied_ranges()? {
        Some(copied) => crate::layout::merge_ranges(
            base.memory
                .data_extents()
                .iter()
                .copied()
                .chain(copied)
                .collect(),
        ),
        None => ready.mem.data_extents()?,
    };
    let (body, memory) = record(&identity, ready, &extents)?;
    let capture = started.elapsed();
    let file_bytes = write_file(dir, &body)?;
    Ok(SavedFork {
        file_bytes,
        memory,
        capture,
        write: started.elapsed() - capture,
    })
}

/// Encodes a guest stopped at its ready point, of its memory the pages in `extents`: the body
/// of a template file.
fn record(
    identity: &TemplateIdentity,
    ready: &mut ReadyGuest<'_>,
    extents: &[(u64, u64)],
) -> Result<(Vec<u8>, MemoryStats), TemplateError> {
    if ready.mem.size() != identity.mem_bytes {
        return Err(TemplateError::Snapshot(format!(
            "guest memory is {} bytes, not {}",
            ready.mem.size(),
            identity.mem_bytes
        )));
    }
    let cpu = ready
        .cpu
        .snapshot()
        .map_err(|e| TemplateError::Snapshot(format!("vCPU state: {e}")))?;
    let mut e = Encoder::new();
    file::encode_identity(identity, &mut e);
    for v in ready.call {
        e.u64(v);
    }
    file::encode_cpu(&cpu, &mut e);
    let mut process = Encoder::new();
    ready
        .process
        .encode_state(&mut process)
        .map_err(|why| TemplateError::Snapshot(format!("process state: {why}")))?;
    e.bytes(&process.into_bytes());
    let memory = file::encode_memory(ready.mem, extents, &mut e)?;
    Ok((e.into_bytes(), memory))
}

/// Verifies a template file and reads what it was built from.
pub fn read_identity(contents: &[u8]) -> Result<TemplateIdentity, TemplateError> {
    let body = file::open(contents)?;
    Ok(file::decode_identity(&mut Decoder::new(body))?)
}

/// A loaded template: everything a VM restored from it starts from.
pub struct Template {
    identity: TemplateIdentity,
    /// The AWAIT_REQUEST call the guest is stopped in.
    call: [u64; 6],
    cpu: CpuSnapshot,
    process: GuestProcess,
    /// `process`'s handed-out memory (`Template::handed_out`), taken once at load.
    handed_out: Vec<(u64, u64)>,
    memory: TemplateMemory,
    stored: MemoryStats,
}

impl Template {
    /// Reads and verifies `dir/template.sfsnap` for `image` and `command`: magic, version,
    /// length and content hash first, then that it was built from this image and agent. Its
    /// memory goes into a memfd, with the KVM system area (`arch::install`) written into it
    /// once so that forks need not write it (it is not part of a snapshot's meaning: a
    /// template built on either backend restores on either).
    pub fn load(
        dir: &Path,
        image: Arc<Image>,
        command: &AgentCommand,
    ) -> Result<Template, TemplateError> {
        let contents = std::fs::read(dir.join(TEMPLATE_FILE))?;
        Template::from_file_contents(&contents, image, command)
    }

    pub fn from_file_contents(
        contents: &[u8],
        image: Arc<Image>,
        command: &AgentCommand,
    ) -> Result<Template, TemplateError> {
        let body = file::open(contents)?;
        let mut d = Decoder::new(body);
        let identity = file::decode_identity(&mut d)?;
        if identity.image_hash != image.content_hash() {
            return Err(TemplateError::ImageMismatch {
                template: identity.image_hash,
                image: image.content_hash(),
            });
        }
        if identity.agent_hash != agent_hash(&image, command) {
            return Err(TemplateError::AgentMismatch);
        }
        let mut call = [0u64; 6];
        for v in call.iter_mut() {
            *v = d.u64("AWAIT_REQUEST arguments")?;
        }
        let cpu = file::decode_cpu(&mut d)?;
        let process_bytes = d.bytes("process state")?;
        let mut pd = Decoder::new(process_bytes);
        let process = GuestProcess::decode_state(&mut pd, image, vm::DEFAULT_OUTPUT_CAP)?;
        pd.finish("the process state")?;
        crate::arch::paging::check_memory_size(identity.mem_bytes)
            .map_err(|e| TemplateError::Corrupted(e.to_string()))?;
        if process.config.mem_limit != identity.mem_bytes {
            return Err(TemplateError::Corrupted(format!(
                "process memory limit {} differs from the memory size {}",
                process.config.mem_limit, identity.mem_bytes
            )));
        }
        let mem = GuestMemory::new(identity.mem_bytes)?;
        let stored = file::decode_memory(&mut d, &mem)?;
        d.finish("the template body")?;
        crate::arch::install(&mem)?;
        let memory = TemplateMemory::seal(mem)?;
        let handed_out = process.memory_handed_out();
        Ok(Template {
            identity,
            call,
            cpu,
            process,
            handed_out,
            memory,
            stored,
        })
    }

    pub fn identity(&self) -> &TemplateIdentity {
        &self.identity
    }

    pub fn memory(&self) -> &TemplateMemory {
        &self.memory
    }

    pub fn cpu(&self) -> &CpuSnapshot {
        &self.cpu
    }

    /// Runs of non-zero pages the file held.
    pub fn stored(&self) -> MemoryStats {
        self.stored
    }

    /// New guest memory for one VM of this template.
    pub fn new_memory(&self, how: ForkMemory) -> io::Result<GuestMemory> {
        match how {
            ForkMemory::CopyOnWrite => GuestMemory::fork_of(&self.memory),
            ForkMemory::Copy => self.memory.copy(),
        }
    }

    /// The guest memory the template's program had been handed at its ready point
    /// (`MemoryMap::handed_out`): what a VM of it must reach from the start.
    pub fn handed_out(&self) -> &[(u64, u64)] {
        &self.handed_out
    }

    /// A guest of this template on `mem` (from `new_memory`) with a vCPU restored on it,
    /// stopped at the ready point; its output is capped at `output_cap`.
    pub fn ready_guest<'m>(
        &self,
        mem: &'m GuestMemory,
        cpu: Box<dyn GuestCpu + 'm>,
        output_cap: u64,
    ) -> ReadyGuest<'m> {
        let mut process = self.process.clone();
        process.config.output_cap = output_cap;
        process.output = Output::new(output_cap);
        ReadyGuest {
            mem,
            cpu,
            process,
            call: self.call,
            boot: RunStats::default(),
        }
    }
}

/// How a VM gets its memory from a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkMemory {
    /// A private copy-on-write mapping of the template's memfd (KVM).
    CopyOnWrite,
    /// A full copy in a fresh memfd (the ptrace test CPU, which shares memory with a child).
    Copy,
}

/// Creates a vCPU in a snapshot's state on guest memory (`KvmCpu::restore`,
/// `PtraceCpu::restore`).
pub type RestoreFactory<'a> =
    dyn for<'m> Fn(&'m GuestMemory, &CpuSnapshot) -> io::Result<Box<dyn GuestCpu + 'm>> + 'a;

/// What `serve_restored` gives back.
#[derive(Debug, Clone)]
pub struct Restored {
    pub outcome: RunOutcome,
    /// Pages of guest memory the VM got copies of: for a copy-on-write fork, the pages it
    /// wrote (`GuestMemory::copied_pages`); for a full copy, every page the copy holds.
    pub pages_copied: u64,
}

/// Runs `request` in a new VM of `template`: memory as `how` says, a vCPU from `make_cpu`,
/// served at the ready point with `limits` (its memory size must be the template's). The
/// outcome's counters cover the request; its `load` is creating the VM from the template.
pub fn serve_restored(
    template: &Template,
    how: ForkMemory,
    make_cpu: &RestoreFactory,
    request: AgentRequest,
    limits: &RunLimits,
) -> Result<Restored, LaunchError> {
    request.validate().map_err(LaunchError::InvalidRequest)?;
    check_memory_size(template, limits)?;
    let started = Instant::now();
    let mem = template.new_memory(how).map_err(LaunchError::Memory)?;
    let cpu = make_cpu(&mem, &template.cpu).map_err(LaunchError::Cpu)?;
    let (outcome, _) = serve_checked_fork(template, &mem, cpu, started, request, limits)?;
    let pages_copied = pages_copied(&mem).map_err(LaunchError::Memory)?;
    Ok(Restored {
        outcome,
        pages_copied,
    })
}

/// Pages of guest memory a VM of a template holds copies of: for a copy-on-write fork, the
/// pages it wrote (`GuestMemory::copied_pages`); for a full copy, every page the copy holds.
pub fn pages_copied(mem: &GuestMemory) -> io::Result<u64> {
    match mem.copied_pages()? {
        Some(pages) => Ok(pages),
        None => Ok(crate::layout::pages_in(&mem.data_extents()?)),
    }
}

/// A request's memory size must be the template's: its VMs cannot have another.
fn check_memory_size(template: &Template, limits: &RunLimits) -> Result<(), LaunchError> {
    if limits.mem_bytes == template.identity.mem_bytes {
        return Ok(());
    }
    let why = format!(
        "the request asks for {} bytes of memory, the template's VMs have {}",
        limits.mem_bytes, template.identity.mem_bytes
    );
    Err(LaunchError::Memory(io::Error::new(
        io::ErrorKind::InvalidInput,
        why,
    )))
}

/// Runs `request` in a VM of `template` whose memory (`Template::new_memory`) and vCPU
/// (restored from `Template::cpu`) were created beforehand, possibly long before the request
/// (a warm pool does). The outcome's `load` is the time from `setup_started` to the guest
/// being ready for the request. The request itself is checked by `ReadyGuest::serve`, before
/// the guest runs. The vCPU comes back for `reset`; counting the pages the run copied is the
/// caller's (`GuestMemory::copied_ranges`), which knows when nothing can have been copied.
pub fn serve_fork<'m>(
    template: &Template,
    mem: &'m GuestMemory,
    cpu: Box<dyn GuestCpu + 'm>,
    setup_started: Instant,
    request: AgentRequest,
    limits: &RunLimits,
) -> Result<(RunOutcome, Box<dyn GuestCpu + 'm>), LaunchError> {
    check_memory_size(template, limits)?;
    serve_checked_fork(template, mem, cpu, setup_started, request, limits)
}

/// Puts a VM of `template` that has served a request (memory from
/// `new_memory(ForkMemory::CopyOnWrite)`, its vCPU restored from `Template::cpu`) back at the
/// template's ready point, ready for `serve_fork` again: its memory as the template's (the
/// copied pages are written back, not dropped: `GuestMemory::reset_to`) and its vCPU in the
/// snapshot's state (`GuestCpu::reset`). The VMM-side state (fds, memory map, overlay files,
/// signal dispositions) needs nothing: every `serve_fork` starts from the template's copy.
/// `copied` are the pages the VM holds copies of (`GuestMemory::copied_ranges`). Returns the
/// pages written back.
pub fn reset(
    template: &Template,
    mem: &GuestMemory,
    cpu: &mut dyn GuestCpu,
    copied: &[(u64, u64)],
) -> io::Result<u64> {
    let pages = mem.reset_to(&template.memory, copied)?;
    cpu.reset(&template.cpu)?;
    Ok(pages)
}

/// `serve_fork` once `limits` is known to fit the template.
fn serve_checked_fork<'m>(
    template: &Template,
    mem: &'m GuestMemory,
    cpu: Box<dyn GuestCpu + 'm>,
    setup_started: Instant,
    request: AgentRequest,
    limits: &RunLimits,
) -> Result<(RunOutcome, Box<dyn GuestCpu + 'm>), LaunchError> {
    let mut ready = template.ready_guest(mem, cpu, limits.output_cap);
    ready.process.output.stream_to(limits.live_output.clone());
    ready.process.set_thread_limit(limits.threads);
    ready.process.set_process_limit(limits.processes);
    let restored = setup_started.elapsed();
    let (mut outcome, cpu) = ready.serve_keeping_cpu(request, limits.timeout)?;
    outcome.stats.load = restored;
    Ok((outcome, cpu))
}

#[cfg(test)]
mod tests;
