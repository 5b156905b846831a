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
//!             page runs: count, then per run its guest address and its length
//!             zeros up to the next 4 KiB of the file
//!             the runs' pages, back to back (every run at a 4 KiB file offset)
//!             4064 zeros
//! 32 bytes    SHA-256 of header and body
//! ```
//!
//! The pages sit at 4 KiB file offsets and the file is whole 4 KiB blocks: it is written in a
//! few vectored writes straight from guest memory, whole page-cache pages each, and a page run
//! can be mapped from the file where it is.
//!
//! Durability (`Checkpoint::write_durably`): the file is written under a temporary name
//! straight from the stopped VM's memory, its writeback started, the same bytes hashed while
//! the disk takes them, the hash appended, then fdatasync'ed, renamed to its final name and
//! the directory fsync'ed, in that order, before the checkpoint is reported written. A crash at any instant leaves either no file under the
//! final name (the temporary is removed at the next start) or the whole, synced file. A file
//! that does not verify (a torn or damaged write the disk acknowledged) is refused by `open`
//! with why, and the session falls back to its previous checkpoint (`daemon::sessions`).

use std::fs::{self, File};
use std::io::{self, IoSlice, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

use sha2::Digest;

use super::codec::{Decoder, Encoder};
use super::{file, Template, TemplateError};
use crate::cpu::{CpuSnapshot, GuestCpu};
use crate::image::sha256::Sha256;
use crate::memory::GuestMemory;
use crate::process::GuestProcess;

pub const MAGIC: [u8; 8] = *b"SFCHKPT\0";
pub const FORMAT_VERSION: u32 = 2;
const BLOCK: usize = crate::layout::PAGE_SIZE as usize;

/// A block of the file that is not guest memory (head, tail).
type Block = [u8; BLOCK];

/// A session VM's state, recorded: its small parts encoded, its pages still in guest memory,
/// from where `write_durably` writes and hashes them without a copy.
pub struct Checkpoint<'m> {
    /// Identity, call, CPU and process state, and the page-run table.
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
        for &(start, end) in &ranges {
            e.u64(start);
            e.u64(end - start);
        }
        let dirty_bytes = ranges.iter().map(|(start, end)| end - start).sum();
        Ok(Checkpoint { meta: e.into_bytes(), ranges, mem, dirty_bytes })
    }

    /// Writes the file as `dir/name` durably (module docs): temporary name, fdatasync, rename,
    /// directory fsync. On error nothing is left under `name` that was not there before.
    pub fn write_durably(&self, dir: &Path, name: &str) -> io::Result<Written> {
        let head = self.head();
        let pages = self.ranges.iter().map(|&(start, end)| self.mem.range_bytes(start, end - start)).collect::<Result<Vec<_>, _>>().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let temporary = dir.join(format!("{TEMPORARY_PREFIX}{name}"));
        let written = (|| {
            let out = File::create(&temporary)?;
            let mut slices: Vec<IoSlice<'_>> = head.iter().map(|block| IoSlice::new(block)).chain(pages.iter().map(|run| IoSlice::new(run))).collect();
            write_all_vectored(&out, &mut slices)?;
            // The disk takes the pages while they are hashed.
            crate::sys::start_writeback(out.as_raw_fd())?;
            let mut hasher = Sha256::new();
            head.iter().for_each(|block| hasher.update(block));
            pages.iter().for_each(|run| hasher.update(run));
            hasher.update([0u8; BLOCK - file::HASH_LEN]);
            let hash = <[u8; 32]>::from(hasher.finalize());
            let mut tail = [0u8; BLOCK];
            tail[BLOCK - file::HASH_LEN..].copy_from_slice(&hash);
            (&out).write_all(&tail)?;
            out.sync_data()?;
            fs::rename(&temporary, dir.join(name))?;
            File::open(dir)?.sync_all()?;
            let file_bytes = ((head.len() + 1) * BLOCK) as u64 + self.dirty_bytes;
            Ok(Written { hash, file_bytes })
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temporary);
        }
        written
    }

    /// The file's first blocks: header and `meta`, zero-padded to a whole block.
    fn head(&self) -> Vec<Block> {
        let head_len = crate::layout::page_align_up((file::HEADER_LEN + self.meta.len()) as u64) as usize;
        let body_len = head_len - file::HEADER_LEN + self.dirty_bytes as usize + BLOCK - file::HASH_LEN;
        let mut bytes = file::header(&MAGIC, FORMAT_VERSION, body_len).to_vec();
        bytes.extend_from_slice(&self.meta);
        bytes
            .chunks(BLOCK)
            .map(|chunk| {
                let mut block = [0u8; BLOCK];
                block[..chunk.len()].copy_from_slice(chunk);
                block
            })
            .collect()
    }
}

/// Writes every byte of `slices` to `out` (a vectored write per at most IOV_MAX slices,
/// continued after a short write).
fn write_all_vectored(mut out: &File, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    const IOV_MAX: usize = 1024;
    while !slices.is_empty() {
        let n = slices.len().min(IOV_MAX);
        match out.write_vectored(&slices[..n]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => IoSlice::advance_slices(&mut slices, written),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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
        let mut table = Vec::with_capacity(n);
        for _ in 0..n {
            let start = d.u64("page run address")?;
            let len = d.u64("page run length")?;
            let whole_pages = start.is_multiple_of(crate::layout::PAGE_SIZE) && len.is_multiple_of(crate::layout::PAGE_SIZE);
            if !whole_pages || start.checked_add(len).is_none_or(|end| end > identity.mem_bytes) {
                return Err(TemplateError::Corrupted(format!("page run at {start:#x} of {len} bytes is not whole pages inside memory")));
            }
            table.push((start, len));
        }
        let at = file::HEADER_LEN + body.len() - d.remaining();
        d.raw(crate::layout::page_align_up(at as u64) as usize - at, "padding before the pages")?;
        let mut runs = Vec::with_capacity(n);
        for (start, len) in table {
            runs.push((start, d.raw(len as usize, "page run")?));
        }
        d.raw(BLOCK - file::HASH_LEN, "padding after the pages")?;
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
