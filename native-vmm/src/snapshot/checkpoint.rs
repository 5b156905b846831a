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
//! body        the head's length H: header, this, up to the first page (u64, a multiple of 4 KiB)
//!             template identity (name, image hash, agent hash, memory size)
//!             the AWAIT_REQUEST call's six arguments
//!             CPU state (file::encode_cpu), process state (length-prefixed)
//!             page runs: count, then per run its guest address and its length
//!             zeros up to H
//!             the runs' pages, back to back from H (every run at a 4 KiB file offset)
//!             4064 zeros
//! 32 bytes    SHA-256 of header and body
//! ```
//!
//! The pages sit at 4 KiB file offsets and the file is whole 4 KiB blocks, so that it moves
//! between guest memory and the disk with O_DIRECT (`open_direct`): written in a few vectored
//! writes straight from guest memory and read back straight into a restored VM's memory, by the
//! disk, through no page cache (whose fresh pages cost more than the copy itself under PVM).
//! Where the file system refuses O_DIRECT (ramfs; tmpfs on older kernels), the same calls go
//! through the page cache (`bench sessions --dir` on a ramfs ran so).
//!
//! Durability (`Checkpoint::write_durably`): the file is written under a temporary name
//! straight from the stopped VM's memory, the same bytes hashed, the hash appended, then
//! fdatasync'ed, renamed to its final name and the directory fsync'ed, in that order, before
//! the checkpoint is reported written. A crash at any instant leaves either no file under the
//! final name (the temporary is removed at the next start) or the whole, synced file. A file
//! that does not verify (a torn or damaged write the disk acknowledged) is refused with why, by
//! `OpenedCheckpoint::open` (header, lengths) or `new_memory` (content hash), and the session
//! falls back to its previous checkpoint (`daemon::sessions`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
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

/// A block of the file that is not guest memory (head, tail), aligned for O_DIRECT.
#[repr(C, align(4096))]
#[derive(Clone, Copy)]
struct Block([u8; BLOCK]);

const ZERO_BLOCK: Block = Block([0; BLOCK]);

/// A session VM's state, recorded: its small parts encoded, its pages still in guest memory,
/// from where `write_durably` writes and hashes them without a copy.
pub struct Checkpoint<'m> {
    /// Head length, identity, call, CPU and process state, and the page-run table.
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
        // The head's length, once the rest is known.
        e.u64(0);
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
        let mut meta = e.into_bytes();
        let head_len = crate::layout::page_align_up((file::HEADER_LEN + meta.len()) as u64);
        meta[..8].copy_from_slice(&head_len.to_le_bytes());
        Ok(Checkpoint { meta, ranges, mem, dirty_bytes })
    }

    /// Writes the file as `dir/name` durably (module docs): temporary name, fdatasync, rename,
    /// directory fsync. On error nothing is left under `name` that was not there before.
    pub fn write_durably(&self, dir: &Path, name: &str) -> io::Result<Written> {
        let head = self.head();
        let pages = self.ranges.iter().map(|&(start, end)| self.mem.range_bytes(start, end - start)).collect::<Result<Vec<_>, _>>().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let temporary = dir.join(format!("{TEMPORARY_PREFIX}{name}"));
        let written = (|| {
            let CheckpointFile { file: out, direct } = open_direct(OpenOptions::new().write(true).create(true).truncate(true), &temporary)?;
            let mut slices: Vec<IoSlice<'_>> = head.iter().map(|block| IoSlice::new(&block.0)).chain(pages.iter().map(|run| IoSlice::new(run))).collect();
            write_all_vectored(&out, &mut slices)?;
            // Where the write went to the page cache (no O_DIRECT), the disk takes the pages
            // while they are hashed; an O_DIRECT write is on its way already.
            if !direct {
                crate::sys::start_writeback(out.as_raw_fd())?;
            }
            let mut hasher = Sha256::new();
            head.iter().for_each(|block| hasher.update(block.0));
            pages.iter().for_each(|run| hasher.update(run));
            hasher.update([0u8; BLOCK - file::HASH_LEN]);
            let hash = <[u8; 32]>::from(hasher.finalize());
            let mut tail = ZERO_BLOCK;
            tail.0[BLOCK - file::HASH_LEN..].copy_from_slice(&hash);
            (&out).write_all(&tail.0)?;
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
                let mut block = ZERO_BLOCK;
                block.0[..chunk.len()].copy_from_slice(chunk);
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

/// A checkpoint file, open.
pub struct CheckpointFile {
    file: File,
    /// Opened with O_DIRECT: reads go from the disk straight into their buffers.
    direct: bool,
}

/// Opens `path` with `options` and O_DIRECT, or without it where the file system refuses it
/// (EINVAL: ramfs, tmpfs on older kernels).
fn open_direct(options: &mut OpenOptions, path: &Path) -> io::Result<CheckpointFile> {
    match options.clone().custom_flags(libc::O_DIRECT).open(path) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(CheckpointFile { file: options.open(path)?, direct: false }),
        opened => Ok(CheckpointFile { file: opened?, direct: true }),
    }
}

/// Opens a checkpoint file for `OpenedCheckpoint::open` (O_DIRECT where the file system has it).
pub fn open_file(path: &Path) -> io::Result<CheckpointFile> {
    open_direct(OpenOptions::new().read(true), path)
}

/// Files under this prefix in a session's folder are checkpoints being written; one left at a
/// start was never acknowledged.
pub const TEMPORARY_PREFIX: &str = ".writing-";

/// A checkpoint file, its head read, checked and decoded, before its pages are read anywhere.
pub struct OpenedCheckpoint {
    pub hash: [u8; 32],
    pub call: [u64; 6],
    pub cpu: CpuSnapshot,
    pub process: GuestProcess,
    file: CheckpointFile,
    head: Vec<Block>,
    /// The page runs `(guest address, length)`, back to back in the file from `head`'s end.
    runs: Vec<(u64, u64)>,
    /// The content hash that this process computed when it wrote the file, if it did.
    known_hash: Option<[u8; 32]>,
}

impl OpenedCheckpoint {
    /// Reads and checks the head and tail of `file` (`open_file`): magic, version, lengths,
    /// that it was taken on a VM of `template`, and, where `known_hash` is given (the content
    /// hash this process computed while writing it: a file is never changed in place), that the
    /// stored hash is that one. The content hash itself is checked by `new_memory`, which reads
    /// the pages. The process's output is capped at `output_cap`.
    pub fn open(opened: CheckpointFile, template: &Template, output_cap: u64, known_hash: Option<&[u8; 32]>) -> Result<OpenedCheckpoint, TemplateError> {
        let file = &opened.file;
        let len = file.metadata()?.len();
        let mut first = ZERO_BLOCK;
        // One read: O_DIRECT reads whole blocks, and a file shorter than one is refused below.
        let read = file.read_at(&mut first.0, 0)?;
        if read < MAGIC.len() || first.0[..MAGIC.len()] != MAGIC {
            return Err(TemplateError::NotATemplate);
        }
        let word = |at: usize| u64::from_le_bytes(first.0[at..at + 8].try_into().expect("8 bytes"));
        let version = word(8) as u32;
        if version != FORMAT_VERSION {
            return Err(TemplateError::VersionMismatch { found: version, expected: FORMAT_VERSION });
        }
        let (body_len, head_len) = (word(16), word(file::HEADER_LEN));
        let expected = body_len.saturating_add((file::HEADER_LEN + file::HASH_LEN) as u64);
        if len != expected || read < file::HEADER_LEN + 8 {
            return Err(TemplateError::Truncated { expected, actual: len });
        }
        if !len.is_multiple_of(BLOCK as u64) || !head_len.is_multiple_of(BLOCK as u64) || head_len == 0 || head_len > len - BLOCK as u64 {
            return Err(TemplateError::Corrupted(format!("a head of {head_len} bytes in a file of {len}")));
        }
        let mut head = vec![ZERO_BLOCK; (head_len / BLOCK as u64) as usize];
        head[0] = first;
        for (i, block) in head.iter_mut().enumerate().skip(1) {
            file.read_exact_at(&mut block.0, (i * BLOCK) as u64)?;
        }
        let mut tail = ZERO_BLOCK;
        file.read_exact_at(&mut tail.0, len - BLOCK as u64)?;
        let mut hash = [0u8; 32];
        hash.copy_from_slice(&tail.0[BLOCK - file::HASH_LEN..]);
        if known_hash.is_some_and(|known| *known != hash) {
            return Err(TemplateError::Corrupted("the content hash is not the one it was written with".into()));
        }
        let head_bytes: Vec<u8> = head.iter().flat_map(|block| block.0).collect();
        let mut d = Decoder::new(&head_bytes[file::HEADER_LEN + 8..]);
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
        let (mut runs, mut pages) = (Vec::with_capacity(n), 0u64);
        for _ in 0..n {
            let start = d.u64("page run address")?;
            let len = d.u64("page run length")?;
            let whole_pages = start.is_multiple_of(crate::layout::PAGE_SIZE) && len.is_multiple_of(crate::layout::PAGE_SIZE);
            if !whole_pages || start.checked_add(len).is_none_or(|end| end > identity.mem_bytes) {
                return Err(TemplateError::Corrupted(format!("page run at {start:#x} of {len} bytes is not whole pages inside memory")));
            }
            pages = pages.saturating_add(len);
            runs.push((start, len));
        }
        if d.raw(d.remaining(), "padding")?.iter().any(|&b| b != 0) {
            return Err(TemplateError::Corrupted("bytes after the page-run table".into()));
        }
        if head_len.saturating_add(pages).saturating_add(BLOCK as u64) != len {
            return Err(TemplateError::Corrupted(format!("page runs of {pages} bytes in a file of {len} with a head of {head_len}")));
        }
        Ok(OpenedCheckpoint { hash, call, cpu, process, file: opened, head, runs, known_hash: known_hash.copied() })
    }

    /// A new copy-on-write fork of `template` holding this checkpoint's pages, read from the
    /// file straight into it, then, unless its hash was known, the whole file's content hash
    /// checked. An O_DIRECT read makes the pages present itself, in one pass as it pins them;
    /// through the page cache they are made present in one call per run first (the copy would
    /// fault each in).
    pub fn new_memory(&self, template: &Template) -> Result<GuestMemory, TemplateError> {
        let mem = template.new_memory(super::ForkMemory::CopyOnWrite)?;
        if !self.file.direct {
            for &(start, len) in &self.runs {
                mem.populate_for_write(start, len)?;
            }
        }
        mem.read_runs_from(&self.file.file, (self.head.len() * BLOCK) as u64, &self.runs)?;
        if self.known_hash.is_none() {
            let mut hasher = Sha256::new();
            self.head.iter().for_each(|block| hasher.update(block.0));
            for &(start, len) in &self.runs {
                hasher.update(mem.range_bytes(start, len).map_err(|e| TemplateError::Corrupted(e.to_string()))?);
            }
            hasher.update([0u8; BLOCK - file::HASH_LEN]);
            if <[u8; 32]>::from(hasher.finalize()) != self.hash {
                return Err(TemplateError::Corrupted("the content hash does not match the contents".into()));
            }
        }
        Ok(mem)
    }
}
