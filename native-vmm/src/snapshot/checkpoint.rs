//! Session checkpoints: a session VM stopped at a ready point (between two cells, see
//! `crate::agent`), recorded against the template it was forked from, durably on disk.
//!
//! A checkpoint holds what differs from the template: the guest pages the VM holds copies
//! of (`GuestMemory::copied_ranges`; everything else still reads as the template), the vCPU's
//! user state, the VMM-side process state (`GuestProcess::encode_state`: fds and their
//! offsets, the overlay's files, the memory map, signals) and the AWAIT_REQUEST call it is
//! stopped in. Restoring one is a fork of the template (copy-on-write, nothing copied) with
//! the recorded pages written over it.
//!
//! ```text
//! 24 bytes    header: magic "SFCHKPT\0", format version (u32 LE), zero, body length (file.rs)
//! body        template identity (name, image hash, agent hash, memory size)
//!             the AWAIT_REQUEST call's six arguments
//!             CPU state (file::encode_cpu), process state (length-prefixed)
//!             page runs: count, then per run its guest address and its bytes (whole pages)
//! 32 bytes    SHA-256 of header and body
//! ```
//!
//! Durability (`Checkpoint::write_durably`, from the stopped VM's memory, hashed as it is
//! written): the file is written under a temporary name,
//! fdatasync'ed, renamed to its final name and the directory fsync'ed, in that order, before
//! the checkpoint is reported written. A crash at any instant leaves either no file under the
//! final name (the temporary is removed at the next start) or the whole, synced file. A file
//! that does not verify (a torn or damaged write the disk acknowledged) is refused by `open`
//! with why, and the session falls back to its previous checkpoint (`daemon::sessions`).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use sha2::Digest;

use super::codec::{Decoder, Encoder};
use super::{file, Template, TemplateError};
use crate::cpu::{CpuSnapshot, GuestCpu};
use crate::image::sha256::Sha256;
use crate::memory::GuestMemory;
use crate::process::GuestProcess;

pub const MAGIC: [u8; 8] = *b"SFCHKPT\0";
pub const FORMAT_VERSION: u32 = 1;

/// A session VM's state, recorded: its small parts encoded, its pages still in guest memory,
/// from where `write_durably` writes and hashes them without a copy.
pub struct Checkpoint<'m> {
    /// Identity, call, CPU and process state, and the page-run count.
    meta: Vec<u8>,
    ranges: Vec<(u64, u64)>,
    mem: &'m GuestMemory,
    /// Bytes of guest pages recorded (what the VM changed against its template).
    pub dirty_bytes: u64,
}

/// A checkpoint on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The content hash (SHA-256 of everything before it in the file): what a client records
    /// to check a restored checkpoint by.
    pub hash: [u8; 32],
    pub file_bytes: u64,
}

impl<'m> Checkpoint<'m> {
    /// Records a VM of `template` stopped at a ready point in `call`: its copy-on-write memory
    /// `mem`, its vCPU and its process (which must have no output or pending request). The
    /// VM must stay stopped until the checkpoint is written.
    pub fn capture(template: &Template, mem: &'m GuestMemory, cpu: &mut dyn GuestCpu, process: &GuestProcess, call: [u64; 6]) -> io::Result<Checkpoint<'m>> {
        let ranges = mem.copied_ranges()?.ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "only copy-on-write forks are checkpointed"))?;
        let cpu_state = cpu.snapshot()?;
        let mut e = Encoder::new();
        file::encode_identity(template.identity(), &mut e);
        for v in call {
            e.u64(v);
        }
        file::encode_cpu(&cpu_state, &mut e);
        let mut state = Encoder::new();
        process.encode_state(&mut state).map_err(|why| io::Error::new(io::ErrorKind::InvalidData, format!("process state: {why}")))?;
        e.bytes(&state.into_bytes());
        e.len(ranges.len());
        let dirty_bytes = ranges.iter().map(|(start, end)| end - start).sum();
        Ok(Checkpoint { meta: e.into_bytes(), ranges, mem, dirty_bytes })
    }

    /// Writes the file as `dir/name` durably (module docs): temporary name, fdatasync, rename,
    /// directory fsync. On error nothing is left under `name` that was not there before.
    pub fn write_durably(&self, dir: &Path, name: &str) -> io::Result<Written> {
        let body_len = self.meta.len() + self.ranges.iter().map(|(start, end)| 16 + (end - start) as usize).sum::<usize>();
        let temporary = dir.join(format!("{TEMPORARY_PREFIX}{name}"));
        let written = (|| {
            let mut out = File::create(&temporary)?;
            let mut hasher = Sha256::new();
            let mut put = |bytes: &[u8]| -> io::Result<()> {
                hasher.update(bytes);
                out.write_all(bytes)
            };
            put(&file::header(&MAGIC, FORMAT_VERSION, body_len))?;
            put(&self.meta)?;
            for &(start, end) in &self.ranges {
                let mut run = [0u8; 16];
                run[..8].copy_from_slice(&start.to_le_bytes());
                run[8..].copy_from_slice(&(end - start).to_le_bytes());
                put(&run)?;
                self.mem.with_range(start, end - start, &mut put).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))??;
            }
            let hash: [u8; 32] = hasher.finalize().into();
            out.write_all(&hash)?;
            out.sync_data()?;
            fs::rename(&temporary, dir.join(name))?;
            File::open(dir)?.sync_all()?;
            Ok(Written { hash, file_bytes: (file::HEADER_LEN + body_len + file::HASH_LEN) as u64 })
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temporary);
        }
        written
    }
}

/// Files under this prefix in a session's folder are checkpoints being written; one left at a
/// start was never acknowledged.
pub const TEMPORARY_PREFIX: &str = ".writing-";

/// A verified checkpoint file, decoded, before its memory is put anywhere.
pub struct OpenedCheckpoint<'f> {
    pub hash: [u8; 32],
    pub call: [u64; 6],
    pub cpu: CpuSnapshot,
    pub process: GuestProcess,
    runs: Vec<(u64, &'f [u8])>,
}

impl<'f> OpenedCheckpoint<'f> {
    /// Verifies `contents` (magic, version, length, content hash; `known_hash`: see
    /// `file::open_sealed_with`) and that it was taken on a VM of `template`, and decodes it.
    /// The process's output is capped at `output_cap`.
    pub fn open(contents: &'f [u8], template: &Template, output_cap: u64, known_hash: Option<&[u8; 32]>) -> Result<OpenedCheckpoint<'f>, TemplateError> {
        let body = file::open_sealed_with(contents, &MAGIC, FORMAT_VERSION, known_hash)?;
        let mut hash = [0u8; 32];
        hash.copy_from_slice(&contents[contents.len() - file::HASH_LEN..]);
        let mut d = Decoder::new(body);
        let identity = file::decode_identity(&mut d)?;
        if identity != *template.identity() {
            return Err(TemplateError::Corrupted(format!("the checkpoint was taken on a VM of another template build ('{}')", identity.name)));
        }
        let mut call = [0u64; 6];
        for v in call.iter_mut() {
            *v = d.u64("AWAIT_REQUEST arguments")?;
        }
        let cpu = file::decode_cpu(&mut d)?;
        let mut pd = Decoder::new(d.bytes("process state")?);
        let process = GuestProcess::decode_state(&mut pd, template.process.config.vfs.image().clone(), output_cap)?;
        pd.finish("the process state")?;
        let n = d.count(16, "page run count")?;
        let mut runs = Vec::with_capacity(n);
        for _ in 0..n {
            let start = d.u64("page run address")?;
            let bytes = d.bytes("page run")?;
            let whole_pages = start.is_multiple_of(crate::layout::PAGE_SIZE) && (bytes.len() as u64).is_multiple_of(crate::layout::PAGE_SIZE);
            if !whole_pages || start.checked_add(bytes.len() as u64).is_none_or(|end| end > identity.mem_bytes) {
                return Err(TemplateError::Corrupted(format!("page run at {start:#x} of {} bytes is not whole pages inside memory", bytes.len())));
            }
            runs.push((start, bytes));
        }
        d.finish("the checkpoint body")?;
        Ok(OpenedCheckpoint { hash, call, cpu, process, runs })
    }

    /// A new copy-on-write fork of `template` holding this checkpoint's pages (made present
    /// in one call per run first: a write per page would fault each in).
    pub fn new_memory(&self, template: &Template) -> io::Result<GuestMemory> {
        let mem = template.new_memory(super::ForkMemory::CopyOnWrite)?;
        for &(start, bytes) in &self.runs {
            mem.populate_for_write(start, bytes.len() as u64)?;
            mem.write(start, bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
        Ok(mem)
    }
}
