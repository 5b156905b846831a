//! Session checkpoints: a session VM stopped at a ready point (between two cells, see
//! `crate::agent`), recorded against the template it was forked from, durably on disk.
//!
//! A checkpoint holds the guest pages that differ from the template's (a full one) or that were
//! written since its parent (an incremental one, read back through its chain by `Chain`), each
//! kept by what it holds (`sparse`), with the vCPU's user state, the VMM-side process state
//! (`GuestProcess::encode_session_state`: the whole process tree's) and the AWAIT_REQUEST call
//! it is stopped in. Restoring one is a copy-on-write fork of the template with those pages
//! written over it. The session's other processes (`sandbox::KeptProcesses`) are recorded
//! whole in every checkpoint, full or not, in its head (`encode_children`): each one's vCPU,
//! how it goes on, and the pages its memory holds beyond its template's or zeros, sparse.
//!
//! The raw pages sit at 4 KiB file offsets and the file is whole 4 KiB blocks, so that they move
//! between guest memory and the disk with O_DIRECT (`open_direct`) instead of through the page
//! cache, whose fresh pages cost more than the copy under PVM; where a file system refuses
//! O_DIRECT the same calls go through the page cache. `Checkpoint::write_durably` writes a file
//! under a temporary name, renames it and flushes the file system (`sync_group`) before the
//! checkpoint counts as written, and a file is never overwritten, so a crash loses none that was
//! reported written. A file that does not verify (torn, damaged, or of a format older than
//! `OLDEST_READ_VERSION`) is refused with why, and the session falls back to its previous
//! checkpoint (`daemon::sessions`).
//!
//! The design and the file layout: docs/sessions.md, Checkpoints.

use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::mpsc;
use std::time::Instant;

use sha2::Digest;

use super::blocks::{Block, Blocks, BLOCK, ZERO_BLOCK};
use super::sparse::{self, PageCounts, PageKind, Unpacker};
use super::sync_group::SyncGroup;
use super::{file, Template, TemplateError};
use crate::codec::{Decoder, Encoder};
use crate::cpu::{CpuSnapshot, GuestCpu};
use crate::image::sha256::Sha256;
use crate::layout::{pages_in, PAGE_SIZE};
use crate::memory::{page_ranges, GuestMemory, PageSet, TemplateMemory};
use crate::process::GuestProcess;
use crate::sandbox::{KeptVm, Next};

/// The head's length in the file: header and metadata, up to the first page.
fn head_len_of(meta: &[u8]) -> u64 {
    crate::layout::page_align_up((file::HEADER_LEN + meta.len()) as u64)
}

pub const MAGIC: [u8; 8] = *b"SFCHKPT\0";
pub const FORMAT_VERSION: u32 = 8;
/// The oldest format read: a format-5 file is one of format 6 whose full checkpoints store every
/// page whole (6 lets them store a page as its chunks that differ from the template's); a
/// format-6 file is one of format 7 of a session with one process (7 adds the others and
/// timed waits); a format-7 file is one of format 8 without the processes' usage.
pub const OLDEST_READ_VERSION: u32 = 5;
/// The first format that holds the whole process tree.
const TREE_VERSION: u32 = 7;
/// The first format whose process table holds each process's usage and its children's.
const USAGE_VERSION: u32 = 8;

/// What a checkpoint cannot hold, said precisely: the session is left running as it was.
#[derive(Debug)]
pub struct NotCheckpointable(pub String);

impl std::fmt::Display for NotCheckpointable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotCheckpointable {}

fn not_checkpointable(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, NotCheckpointable(why))
}
/// Longest chain a restore follows (parents of one checkpoint); the writer keeps well below.
pub const MAX_DEPTH: u64 = 64;

/// The checkpoint an incremental one holds the changes since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub number: u64,
    /// Its content hash (`Written::hash`).
    pub hash: [u8; 32],
    /// Its own depth (0: a full checkpoint).
    pub depth: u64,
}

/// What a checkpoint holds of the VM's pages.
pub enum Pages<'a> {
    /// Every page the VM holds a copy of.
    Full,
    /// The pages changed since `parent` (`PageFingerprints::changed`).
    Since {
        parent: Parent,
        changed: &'a Changed,
    },
}

/// One fingerprint per 64-byte chunk of a page.
type ChunkPrints = [u64; PAGE_SIZE as usize / sparse::CHUNK_BYTES];

/// What each page of a VM held when a checkpoint last recorded it, as a 64-bit xxh3 of each of
/// its 64-byte chunks keyed with a random seed of this VM's: which written pages hold new
/// bytes, and which of their chunks (`changed`). xxh3 rather than SHA-256 because it runs at
/// memory speed (SHA-256 at ~1.5 GB/s would cost more than the pages it saves writing); the
/// file's SHA-256 still covers every byte it stores. Pages it has no fingerprints of (after a
/// restore) count as changed whole. They take 1/8 of the recorded pages' size in memory, and 4
/// bytes per guest page up to the highest recorded one for the index (a hash map's probes were
/// cache misses on entries of 520 bytes, ~15% of the time this takes).
pub struct PageFingerprints {
    seed: u64,
    /// The print of a chunk of zeros, most chunks of a fresh buffer's pages: not hashed each time.
    zero: u64,
    /// Per guest page, its record's index in `prints` plus one (0: none).
    slots: Vec<u32>,
    prints: Vec<ChunkPrints>,
}

/// Written pages whose bytes differ from what was recorded, and per page what `capture` stores
/// it by (found while fingerprinting it: not scanned a second time).
#[derive(Default)]
pub struct Changed {
    pub pages: PageSet,
    /// One per page of `pages`, in order.
    pub masks: Vec<ChunkMasks>,
}

/// A page's chunks that hold a non-zero byte (`sparse::chunk_mask`), and those that differ from
/// what was recorded of it (None: no record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkMasks {
    pub nonzero: u64,
    pub changed: Option<u64>,
}

impl PageFingerprints {
    pub fn new() -> io::Result<PageFingerprints> {
        let mut seed = [0u8; 8];
        crate::sys::fill_random(&mut seed)?;
        let seed = u64::from_le_bytes(seed);
        let zero = xxhash_rust::xxh3::xxh3_64_with_seed(&[0; sparse::CHUNK_BYTES], seed);
        Ok(PageFingerprints {
            seed,
            zero,
            slots: Vec::new(),
            prints: Vec::new(),
        })
    }

    /// The page's fingerprints and its non-zero chunks.
    fn of(&self, mem: &GuestMemory, page: u64) -> io::Result<(ChunkPrints, u64)> {
        let bytes = mem
            .range_bytes(page * PAGE_SIZE, PAGE_SIZE)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let nonzero = sparse::chunk_mask(bytes);
        let mut prints = [self.zero; PAGE_SIZE as usize / sparse::CHUNK_BYTES];
        for (i, (print, chunk)) in prints
            .iter_mut()
            .zip(bytes.chunks_exact(sparse::CHUNK_BYTES))
            .enumerate()
        {
            if nonzero >> i & 1 == 1 {
                *print = xxhash_rust::xxh3::xxh3_64_with_seed(chunk, self.seed);
            }
        }
        Ok((prints, nonzero))
    }

    /// What was recorded of `page`, if anything.
    fn recorded(&self, page: u64) -> Option<&ChunkPrints> {
        match self.slots.get(page as usize) {
            Some(&slot) if slot > 0 => Some(&self.prints[slot as usize - 1]),
            _ => None,
        }
    }

    /// Of the pages `written`, those whose bytes differ from what was recorded, and the
    /// fingerprints to `record` once a checkpoint holding them is durable.
    pub fn changed(
        &self,
        mem: &GuestMemory,
        written: &PageSet,
    ) -> io::Result<(Changed, Vec<(u64, ChunkPrints)>)> {
        let count = written.count_ones(..);
        let mut changed = Changed {
            pages: PageSet::with_capacity(written.len()),
            masks: Vec::with_capacity(count),
        };
        let mut fresh = Vec::with_capacity(count);
        for page in written.ones() {
            let (prints, nonzero) = self.of(mem, page as u64)?;
            let chunks = self.recorded(page as u64).map(|old| {
                old.iter()
                    .zip(&prints)
                    .enumerate()
                    .fold(0u64, |mask, (i, (was, is))| {
                        mask | (u64::from(was != is) << i)
                    })
            });
            if chunks == Some(0) {
                continue;
            }
            changed.pages.insert(page);
            changed.masks.push(ChunkMasks {
                nonzero,
                changed: chunks,
            });
            fresh.push((page as u64, prints));
        }
        Ok((changed, fresh))
    }

    /// The fingerprints of every page in `ranges` (what a full checkpoint stores).
    pub fn of_ranges(
        &self,
        mem: &GuestMemory,
        ranges: &[(u64, u64)],
    ) -> io::Result<Vec<(u64, ChunkPrints)>> {
        ranges
            .iter()
            .flat_map(|&(start, end)| {
                (start / PAGE_SIZE..end / PAGE_SIZE)
                    .map(|page| self.of(mem, page).map(|(prints, _)| (page, prints)))
            })
            .collect()
    }

    /// Takes `fresh` as what a durable checkpoint recorded (after a full one: all there is).
    pub fn record(&mut self, full: bool, fresh: Vec<(u64, ChunkPrints)>) {
        if full {
            self.slots.clear();
            self.prints.clear();
        }
        for (page, prints) in fresh {
            let page = page as usize;
            if page >= self.slots.len() {
                self.slots.resize(page + 1, 0);
            }
            match self.slots[page] {
                0 => {
                    self.prints.push(prints);
                    self.slots[page] =
                        u32::try_from(self.prints.len()).expect("fewer records than 2^32 pages");
                }
                slot => self.prints[slot as usize - 1] = prints,
            }
        }
    }
}

/// Of the pages `copied` (those a fork holds copies of), the ones whose bytes differ from the
/// template's, with their non-zero chunks and those that differ: what a full checkpoint stores.
/// A page outside the template's data differs from its zeros where it is non-zero; one inside
/// is compared chunk by chunk (CPython's heap pages differ from the template's in a few
/// reference counts, and one in four holds the template's bytes again).
fn changed_from_template(
    template: &TemplateMemory,
    mem: &GuestMemory,
    copied: &[(u64, u64)],
) -> io::Result<Changed> {
    let out_of_bounds =
        |e: crate::memory::OutOfBounds| io::Error::new(io::ErrorKind::InvalidData, e);
    let data = template.data_extents();
    let mut changed = Changed {
        pages: PageSet::with_capacity((mem.size() / PAGE_SIZE) as usize),
        masks: Vec::new(),
    };
    for &(start, end) in copied {
        for addr in (start..end).step_by(PAGE_SIZE as usize) {
            let page = mem.range_bytes(addr, PAGE_SIZE).map_err(out_of_bounds)?;
            let nonzero = sparse::chunk_mask(page);
            let next = data.partition_point(|&(_, data_end)| data_end <= addr);
            let differs = match data.get(next) {
                Some(&(data_start, _)) if data_start < addr + PAGE_SIZE => {
                    let own = template
                        .range_bytes(addr, PAGE_SIZE)
                        .map_err(out_of_bounds)?;
                    page.chunks_exact(sparse::CHUNK_BYTES)
                        .zip(own.chunks_exact(sparse::CHUNK_BYTES))
                        .enumerate()
                        .fold(0u64, |mask, (i, (is, was))| {
                            mask | (u64::from(is != was) << i)
                        })
                }
                _ => nonzero,
            };
            if differs != 0 {
                changed.pages.insert((addr / PAGE_SIZE) as usize);
                changed.masks.push(ChunkMasks {
                    nonzero,
                    changed: Some(differs),
                });
            }
        }
    }
    Ok(changed)
}

/// A session VM's state, recorded: its small parts encoded, its pages still in guest memory,
/// from where `write_durably` writes and hashes them without a copy.
pub struct Checkpoint<'m> {
    /// Head length, identity, call, CPU and process state, the page runs and their table.
    meta: Vec<u8>,
    /// The guest ranges of the pages a restore of it gives back as the VM holds them now: those
    /// it stores and, in a full one, those it leaves out as holding the template's bytes.
    restored: Vec<(u64, u64)>,
    /// Those of its raw pages, written straight from guest memory.
    raw: Vec<(u64, u64)>,
    /// The packed region, padded to whole blocks with room for the hash at the end.
    packed: Blocks,
    mem: &'m GuestMemory,
    /// Bytes of guest pages recorded (what the VM changed against its template, or since
    /// `parent`).
    pub dirty_bytes: u64,
    pub parent: Option<Parent>,
    pub pages: PageCounts,
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
    /// `mem` (`pages` of it; `Pages::Since`'s masks found on this stopped VM), its vCPU, its
    /// process (which must have no output or pending request) and the VMs of the tree's other
    /// processes, `children`. The VMs must stay stopped until the checkpoint is written.
    pub fn capture(
        template: &Template,
        mem: &'m GuestMemory,
        cpu: &mut dyn GuestCpu,
        process: &GuestProcess,
        children: &[KeptVm<'_>],
        call: [u64; 6],
        pages: Pages<'_>,
    ) -> io::Result<Checkpoint<'m>> {
        let from_template;
        let (changed, parent, restored) = match pages {
            Pages::Full => {
                let copied = mem.copied_ranges()?.ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::Unsupported,
                        "only copy-on-write forks are checkpointed",
                    )
                })?;
                from_template = changed_from_template(template.memory(), mem, &copied)?;
                (&from_template, None, Some(copied))
            }
            Pages::Since { parent, changed } => (changed, Some(parent), None),
        };
        let ranges = page_ranges(&changed.pages);
        let mut masks = changed.masks.iter();
        let cpu_state = cpu.snapshot()?;
        // What restoring would refuse is refused now, while the session still runs.
        std::iter::once(&cpu_state)
            .chain(process.threads.saved_contexts())
            .chain(
                process
                    .parked
                    .values()
                    .flat_map(|part| part.threads.saved_contexts()),
            )
            .chain(children.iter().map(|child| &child.cpu))
            .try_for_each(CpuSnapshot::check_user)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let mut state = Encoder::new();
        process
            .encode_session_state(&mut state)
            .map_err(not_checkpointable)?;
        let mut tree = Encoder::new();
        process
            .encode_tree(&mut tree, Instant::now())
            .map_err(not_checkpointable)?;
        encode_children(children, &mut tree)?;
        let mut e = Encoder::new();
        // The head's length, once the rest is known.
        e.u64(0);
        file::encode_identity(template.identity(), &mut e);
        match parent {
            None => e.u8(0),
            Some(parent) => {
                e.u8(1);
                e.u64(parent.number);
                e.raw(&parent.hash);
            }
        }
        e.u64(parent.map_or(0, |p| p.depth + 1));
        for v in call {
            e.u64(v);
        }
        file::encode_cpu(&cpu_state, &mut e);
        e.bytes(&state.into_bytes());
        e.bytes(&tree.into_bytes());
        e.len(ranges.len());
        for &(start, end) in &ranges {
            e.u64(start);
            e.u64(end - start);
        }
        let (mut kinds, mut raw, mut packed, mut pages) = (
            Vec::new(),
            Vec::<(u64, u64)>::new(),
            Blocks::new(),
            PageCounts::default(),
        );
        for &(start, end) in &ranges {
            for addr in (start..end).step_by(PAGE_SIZE as usize) {
                let page = mem
                    .range_bytes(addr, PAGE_SIZE)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                let masks = *masks.next().ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "fewer chunk masks than changed pages",
                    )
                })?;
                let (kind, mask) = PageKind::choose(masks.nonzero, masks.changed);
                match kind {
                    PageKind::Zero => {}
                    PageKind::Sparse | PageKind::Delta => sparse::pack(page, mask, &mut packed),
                    PageKind::Raw => match raw.last_mut() {
                        Some((_, raw_end)) if *raw_end == addr => *raw_end += PAGE_SIZE,
                        _ => raw.push((addr, addr + PAGE_SIZE)),
                    },
                }
                kinds.push(kind);
                pages.add(kind);
            }
        }
        e.bytes(&sparse::encode_kinds(&kinds));
        e.len(packed.len());
        packed.pad_to_blocks((packed.len() + file::HASH_LEN).div_ceil(BLOCK));
        let dirty_bytes = pages_in(&ranges) * PAGE_SIZE;
        // An incremental one gives back what it stores.
        let restored = restored.unwrap_or(ranges);
        let mut meta = e.into_bytes();
        let head_len = head_len_of(&meta);
        meta[..8].copy_from_slice(&head_len.to_le_bytes());
        Ok(Checkpoint {
            meta,
            restored,
            raw,
            packed,
            mem,
            dirty_bytes,
            parent,
            pages,
        })
    }

    /// Writes the file as `dir/name` durably (module docs): temporary name, rename, a flush of
    /// `dir`'s file system shared with the other files written meanwhile (`sync`). On an error
    /// before the rename nothing is left under `name`; after it, what is there is not reported
    /// written, and a restore verifies it as any file.
    pub fn write_durably(&self, dir: &Path, name: &str, sync: &SyncGroup) -> io::Result<Written> {
        let head = self.head();
        let raw = self
            .raw
            .iter()
            .map(|&(start, end)| self.mem.range_bytes(start, end - start))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let (last, packed) = self
            .packed
            .blocks()
            .split_last()
            .ok_or_else(|| io::Error::other("a checkpoint without its closing block"))?;
        let body: Vec<&[u8]> = head
            .iter()
            .map(|block| &block.0[..])
            .chain(raw.iter().copied())
            .chain(packed.iter().map(|block| &block.0[..]))
            .collect();
        let temporary = dir.join(format!("{TEMPORARY_PREFIX}{name}"));
        let written = (|| {
            let CheckpointFile { file: out, .. } = open_direct(
                OpenOptions::new().write(true).create(true).truncate(true),
                &temporary,
            )?;
            let hash = hash_and_write(&out, &body, last)?;
            fs::rename(&temporary, dir.join(name))?;
            sync.sync()?;
            Ok(Written {
                hash,
                file_bytes: self.file_bytes(),
            })
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temporary);
        }
        written
    }

    /// The guest ranges `[start, end)` of the pages a restore of it gives back as they are now
    /// (the fingerprints a full checkpoint records).
    pub fn restored_ranges(&self) -> &[(u64, u64)] {
        &self.restored
    }

    fn raw_bytes(&self) -> u64 {
        pages_in(&self.raw) * PAGE_SIZE
    }

    /// The size its file will have.
    pub fn file_bytes(&self) -> u64 {
        head_len_of(&self.meta) + self.raw_bytes() + (self.packed.blocks().len() * BLOCK) as u64
    }

    /// The file's first blocks: header and `meta`, zero-padded to a whole block.
    fn head(&self) -> Vec<Block> {
        let head_len = head_len_of(&self.meta) as usize;
        let body_len = head_len - file::HEADER_LEN
            + self.raw_bytes() as usize
            + self.packed.blocks().len() * BLOCK
            - file::HASH_LEN;
        let mut head = Blocks::new();
        head.push(&file::header(&MAGIC, FORMAT_VERSION, body_len));
        head.push(&self.meta);
        head.blocks().to_vec()
    }
}

/// The other processes' VMs, for a checkpoint's head: per process its pid, how it goes on,
/// its vCPU, its memory's size and base (a fork of the template, or zeros), and the pages it
/// holds beyond that base (`GuestMemory::held_page_ranges`), each as its mask of non-zero
/// chunks and those chunks. A process whose memory shows shared memory is refused: a restore
/// would give it a copy, no longer shared.
fn encode_children(children: &[KeptVm<'_>], e: &mut Encoder) -> io::Result<()> {
    let out_of_bounds =
        |e: crate::memory::OutOfBounds| io::Error::new(io::ErrorKind::InvalidData, e);
    e.len(children.len());
    for child in children {
        if child.mem.shows_shared_memory() {
            return Err(not_checkpointable(format!(
                "process {} maps memory shared with other processes (MAP_SHARED)",
                child.pid
            )));
        }
        if children
            .iter()
            .any(|other| other.pid != child.pid && std::ptr::eq(other.mem, child.mem))
        {
            return Err(not_checkpointable(format!(
                "process {} runs on its parent's memory (a vfork child that has not exec'd)",
                child.pid
            )));
        }
        e.u64(child.pid);
        child.next.encode_state(e);
        file::encode_cpu(&child.cpu, e);
        e.u64(child.mem.size());
        e.bool(child.mem.is_template_fork());
        let ranges = child.mem.held_page_ranges()?;
        e.len(ranges.len());
        for &(start, end) in &ranges {
            e.u64(start);
            e.u64(end - start);
            for addr in (start..end).step_by(PAGE_SIZE as usize) {
                let page = child
                    .mem
                    .range_bytes(addr, PAGE_SIZE)
                    .map_err(out_of_bounds)?;
                let mask = sparse::chunk_mask(page);
                e.u64(mask);
                sparse::stored_chunks(page, mask).for_each(|chunks| e.raw(chunks));
            }
        }
    }
    Ok(())
}

/// A process of the tree besides the first, restored from a checkpoint (`encode_children`):
/// its memory rebuilt, its vCPU's registers checked, how it goes on.
pub struct RestoredChild {
    pub pid: u64,
    pub mem: GuestMemory,
    pub cpu: CpuSnapshot,
    pub next: Next,
}

/// What `encode_children` wrote, for `process` (the tree it decoded): one record per process
/// it parks and none else; every memory of the template's size or at most the memory limit,
/// every page inside it.
fn decode_children(
    d: &mut Decoder,
    template: &Template,
    process: &GuestProcess,
) -> Result<Vec<RestoredChild>, TemplateError> {
    let count = d.count(8, "processes")?;
    if count != process.parked.len() {
        return Err(TemplateError::Corrupted(format!(
            "{count} processes' VMs for {} processes",
            process.parked.len()
        )));
    }
    let template_bytes = template.memory().size();
    let mut children: Vec<RestoredChild> = Vec::with_capacity(count);
    for _ in 0..count {
        let pid = d.u64("pid")?;
        if !process.parked.contains_key(&pid) || children.iter().any(|c| c.pid == pid) {
            return Err(TemplateError::Corrupted(format!(
                "a VM for process {pid}, which the tree does not hold or has one already"
            )));
        }
        let next = Next::decode_state(d)?;
        let cpu = file::decode_cpu(d)?;
        cpu.check_user()
            .map_err(|e| TemplateError::Corrupted(format!("process {pid}: {e}")))?;
        let size = d.u64("memory size")?;
        let over_template = d.bool("memory base")?;
        let fits = if over_template {
            size == template_bytes
        } else {
            size > 0
                && size.is_multiple_of(PAGE_SIZE)
                && size <= process.config.mem_limit.max(template_bytes)
        };
        if !fits {
            return Err(TemplateError::Corrupted(format!(
                "process {pid}'s memory of {size} bytes"
            )));
        }
        let mem = if over_template {
            template.new_memory(super::ForkMemory::CopyOnWrite)?
        } else {
            GuestMemory::new(size)?
        };
        for _ in 0..d.count(16, "page runs")? {
            let (start, len) = (d.u64("page run address")?, d.u64("page run length")?);
            let whole = start.is_multiple_of(PAGE_SIZE) && len.is_multiple_of(PAGE_SIZE);
            if !whole || start.checked_add(len).is_none_or(|end| end > size) {
                return Err(TemplateError::Corrupted(format!(
                    "process {pid}'s page run at {start:#x} of {len} bytes"
                )));
            }
            for addr in (start..start + len).step_by(PAGE_SIZE as usize) {
                let mask = d.u64("chunk mask")?;
                let stored = d.raw(mask.count_ones() as usize * sparse::CHUNK_BYTES, "chunks")?;
                sparse::restore(&mem, addr, PageKind::Sparse, mask, stored)
                    .map_err(|e| TemplateError::Corrupted(e.to_string()))?;
            }
        }
        children.push(RestoredChild {
            pid,
            mem,
            cpu,
            next,
        });
    }
    Ok(children)
}

/// A file longer than this is hashed and written in pieces of it at once: its pieces are
/// written on a thread of their own as they are hashed, so that the CPU's work (capture, hash)
/// and the disk's overlap instead of adding up (`bench sessions`, the pause of 32 MiB).
const PIECE_BYTES: usize = 2 << 20;

/// Writes `body` and then `closing` with the SHA-256 of everything before its last 32 bytes in
/// them, to `out` from its start; returns the hash. The hash ends the file, so each piece is
/// hashed before it is written: a short file in one vectored write once hashed (with O_DIRECT
/// a write returns once the disk has the bytes: one wait, not two), a longer one piece by
/// piece, each written while the next is hashed.
fn hash_and_write(out: &File, body: &[&[u8]], closing: &Block) -> io::Result<[u8; 32]> {
    let mut pieces = pieces_of(body, PIECE_BYTES);
    let last_piece = pieces.pop().unwrap_or_default();
    let mut hasher = Sha256::new();
    std::thread::scope(|scope| {
        let writer = (!pieces.is_empty()).then(|| {
            let (pieces, written) = mpsc::channel::<(Vec<&[u8]>, Option<Block>)>();
            (
                pieces,
                scope.spawn(move || {
                    written
                        .into_iter()
                        .try_for_each(|(bytes, closing)| write_piece(out, &bytes, closing.as_ref()))
                }),
            )
        });
        for piece in pieces {
            piece.iter().for_each(|bytes| hasher.update(bytes));
            // A writer that stopped has failed: its error is what `join` returns below.
            if writer
                .as_ref()
                .is_some_and(|(queue, _)| queue.send((piece, None)).is_err())
            {
                break;
            }
        }
        last_piece.iter().for_each(|bytes| hasher.update(bytes));
        hasher.update(&closing.0[..BLOCK - file::HASH_LEN]);
        let hash = <[u8; 32]>::from(hasher.finalize());
        let mut closing = *closing;
        closing.0[BLOCK - file::HASH_LEN..].copy_from_slice(&hash);
        match writer {
            None => write_piece(out, &last_piece, Some(&closing))?,
            Some((queue, thread)) => {
                let _ = queue.send((last_piece, Some(closing)));
                drop(queue);
                thread
                    .join()
                    .map_err(|_| io::Error::other("the checkpoint's writer thread panicked"))??;
            }
        }
        Ok(hash)
    })
}

/// `bytes` in order, cut into pieces of at most `max` bytes (whole blocks, as every slice is).
fn pieces_of<'a>(bytes: &[&'a [u8]], max: usize) -> Vec<Vec<&'a [u8]>> {
    let mut pieces = vec![Vec::new()];
    let mut room = max;
    for &slice in bytes {
        let mut rest = slice;
        while !rest.is_empty() {
            if room == 0 {
                pieces.push(Vec::new());
                room = max;
            }
            let (now, later) = rest.split_at(rest.len().min(room));
            pieces.last_mut().expect("never empty").push(now);
            room -= now.len();
            rest = later;
        }
    }
    pieces
}

/// Writes `bytes` and then `closing` to `out` at its file position.
fn write_piece(out: &File, bytes: &[&[u8]], closing: Option<&Block>) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = bytes
        .iter()
        .map(|bytes| IoSlice::new(bytes))
        .chain(closing.map(|block| IoSlice::new(&block.0)))
        .collect();
    write_all_vectored(out, &mut slices)
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
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(CheckpointFile {
            file: options.open(path)?,
            direct: false,
        }),
        opened => Ok(CheckpointFile {
            file: opened?,
            direct: true,
        }),
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
    /// The checkpoint this one holds the changes since (number and content hash), if any.
    pub parent: Option<(u64, [u8; 32])>,
    /// Parents back to a full checkpoint (0: this one is full).
    pub depth: u64,
    pub call: [u64; 6],
    pub cpu: CpuSnapshot,
    /// The encoded process state and, from format 7 on, the process tree and the other
    /// processes' VMs (`process` decodes them: only the newest of a chain needs them).
    process_state: Vec<u8>,
    tree: Option<Vec<u8>>,
    /// Whether its process table holds usage (format 8 on).
    tree_usage: bool,
    file: CheckpointFile,
    head: Vec<Block>,
    /// The page runs `(guest address, length)` it records.
    runs: Vec<(u64, u64)>,
    /// How each of their pages is stored, in order.
    kinds: Vec<PageKind>,
    /// Where the packed region starts in the file (after the raw pages) and its length.
    packed_at: u64,
    packed_len: u64,
    file_len: u64,
    /// The content hash that this process computed when it wrote the file, if it did.
    known_hash: Option<[u8; 32]>,
}

impl OpenedCheckpoint {
    /// Reads and checks the head and tail of `file` (`open_file`): magic, version, lengths,
    /// that it was taken on a VM of `template`, and, where `known_hash` is given (the content
    /// hash this process computed while writing it: a file is never changed in place), that the
    /// stored hash is that one. The content hash itself is checked by `Chain::new_memory`,
    /// which reads the pages.
    pub fn open(
        opened: CheckpointFile,
        template: &Template,
        known_hash: Option<&[u8; 32]>,
    ) -> Result<OpenedCheckpoint, TemplateError> {
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
        if !(OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(TemplateError::VersionMismatch {
                found: version,
                expected: FORMAT_VERSION,
            });
        }
        let (body_len, head_len) = (word(16), word(file::HEADER_LEN));
        let expected = body_len.saturating_add((file::HEADER_LEN + file::HASH_LEN) as u64);
        if len != expected || read < file::HEADER_LEN + 8 {
            return Err(TemplateError::Truncated {
                expected,
                actual: len,
            });
        }
        if !len.is_multiple_of(BLOCK as u64)
            || !head_len.is_multiple_of(BLOCK as u64)
            || head_len == 0
            || head_len > len - BLOCK as u64
        {
            return Err(TemplateError::Corrupted(format!(
                "a head of {head_len} bytes in a file of {len}"
            )));
        }
        let mut head = vec![first];
        head.extend_from_slice(
            Blocks::read_from(file, BLOCK as u64, (head_len / BLOCK as u64) as usize - 1)?.blocks(),
        );
        let mut tail = ZERO_BLOCK;
        file.read_exact_at(&mut tail.0, len - BLOCK as u64)?;
        let mut hash = [0u8; 32];
        hash.copy_from_slice(&tail.0[BLOCK - file::HASH_LEN..]);
        if known_hash.is_some_and(|known| *known != hash) {
            return Err(TemplateError::Corrupted(
                "the content hash is not the one it was written with".into(),
            ));
        }
        let head_bytes: Vec<u8> = head.iter().flat_map(|block| block.0).collect();
        let mut d = Decoder::new(&head_bytes[file::HEADER_LEN + 8..]);
        let identity = file::decode_identity(&mut d)?;
        if identity != *template.identity() {
            return Err(TemplateError::Corrupted(format!(
                "the checkpoint was taken on a VM of another template build ('{}')",
                identity.name
            )));
        }
        let parent = match d.u8("parent")? {
            0 => None,
            1 => Some((d.u64("parent number")?, d.hash("parent hash")?)),
            other => return Err(TemplateError::Corrupted(format!("parent marker {other}"))),
        };
        let depth = d.u64("depth")?;
        if (depth == 0) != parent.is_none() || depth > MAX_DEPTH {
            return Err(TemplateError::Corrupted(format!(
                "a depth of {depth} (at most {MAX_DEPTH}) {} a parent",
                if parent.is_some() { "with" } else { "without" }
            )));
        }
        let mut call = [0u64; 6];
        for v in call.iter_mut() {
            *v = d.u64("AWAIT_REQUEST arguments")?;
        }
        let cpu = file::decode_cpu(&mut d)?;
        let process_state = d.bytes("process state")?.to_vec();
        let tree = if version >= TREE_VERSION {
            Some(d.bytes("process tree")?.to_vec())
        } else {
            None
        };
        let n = d.count(16, "page run count")?;
        let (mut runs, mut pages) = (Vec::with_capacity(n), 0u64);
        for _ in 0..n {
            let start = d.u64("page run address")?;
            let len = d.u64("page run length")?;
            let whole_pages = start.is_multiple_of(PAGE_SIZE) && len.is_multiple_of(PAGE_SIZE);
            if !whole_pages
                || start
                    .checked_add(len)
                    .is_none_or(|end| end > identity.mem_bytes)
            {
                return Err(TemplateError::Corrupted(format!(
                    "page run at {start:#x} of {len} bytes is not whole pages inside memory"
                )));
            }
            pages = pages.saturating_add(len / PAGE_SIZE);
            runs.push((start, len));
        }
        let kinds = sparse::decode_kinds(d.bytes("page table")?, pages)
            .map_err(TemplateError::Corrupted)?;
        let packed_len = d.u64("packed length")?;
        if d.raw(d.remaining(), "padding")?.iter().any(|&b| b != 0) {
            return Err(TemplateError::Corrupted(
                "bytes after the page table".into(),
            ));
        }
        let raw_bytes =
            kinds.iter().filter(|&&kind| kind == PageKind::Raw).count() as u64 * PAGE_SIZE;
        let packed_at = head_len + raw_bytes;
        let expected = packed_len
            .checked_add(file::HASH_LEN as u64)
            .and_then(|closing| closing.checked_next_multiple_of(BLOCK as u64))
            .and_then(|closing| packed_at.checked_add(closing));
        if expected != Some(len) {
            return Err(TemplateError::Corrupted(format!("{raw_bytes} bytes of raw pages and {packed_len} of packed ones in a file of {len} with a head of {head_len}")));
        }
        Ok(OpenedCheckpoint {
            hash,
            parent,
            depth,
            call,
            cpu,
            process_state,
            tree,
            tree_usage: version >= USAGE_VERSION,
            file: opened,
            head,
            runs,
            kinds,
            packed_at,
            packed_len,
            file_len: len,
            known_hash: known_hash.copied(),
        })
    }

    /// The VMM-side process state it recorded, its output capped at `output_cap`, and the VMs
    /// of the tree's other processes, each memory rebuilt.
    pub fn process(
        &self,
        template: &Template,
        output_cap: u64,
    ) -> Result<(GuestProcess, Vec<RestoredChild>), TemplateError> {
        let mut d = Decoder::new(&self.process_state);
        let image = template.process.config.vfs.image().clone();
        let mut process = GuestProcess::decode_state(&mut d, image, output_cap)?;
        d.finish("the process state")?;
        let Some(tree) = &self.tree else {
            return Ok((process, Vec::new()));
        };
        let mut d = Decoder::new(tree);
        process.decode_tree(&mut d, Instant::now(), self.tree_usage)?;
        let children = decode_children(&mut d, template, &process)?;
        d.finish("the process tree")?;
        Ok((process, children))
    }

    /// The file's size.
    pub fn file_bytes(&self) -> u64 {
        self.file_len
    }
}

/// A checkpoint and the parents it builds on, newest first, back to a full one: each parent
/// the one its child names (number and content hash) and one level less deep.
pub struct Chain(Vec<OpenedCheckpoint>);

impl Chain {
    /// Follows `newest`'s parents, opening each with `open_parent` (by number: its file and the
    /// hash this process wrote it with, if it did).
    pub fn open(
        newest: OpenedCheckpoint,
        template: &Template,
        mut open_parent: impl FnMut(u64) -> io::Result<(CheckpointFile, Option<[u8; 32]>)>,
    ) -> Result<Chain, TemplateError> {
        let mut chain = vec![newest];
        while let Some(&OpenedCheckpoint {
            parent: Some((number, hash)),
            depth,
            ..
        }) = chain.last()
        {
            let (file, known) = open_parent(number).map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => {
                    TemplateError::Corrupted(format!("its parent, checkpoint {number}, is missing"))
                }
                _ => TemplateError::Io(e),
            })?;
            let parent =
                OpenedCheckpoint::open(file, template, known.as_ref()).map_err(|e| match e {
                    TemplateError::Io(e) => TemplateError::Io(e),
                    e => TemplateError::Corrupted(format!("its parent, checkpoint {number}: {e}")),
                })?;
            if parent.hash != hash || parent.depth + 1 != depth {
                return Err(TemplateError::Corrupted(format!("checkpoint {number} is not the parent it names (another content hash or depth)")));
            }
            chain.push(parent);
        }
        Ok(Chain(chain))
    }

    pub fn newest(&self) -> &OpenedCheckpoint {
        &self.0[0]
    }

    /// Bytes of all its files.
    pub fn file_bytes(&self) -> u64 {
        self.0.iter().map(OpenedCheckpoint::file_bytes).sum()
    }

    /// Bytes of the full checkpoint's file it starts from.
    pub fn base_file_bytes(&self) -> u64 {
        self.0.last().map_or(0, OpenedCheckpoint::file_bytes)
    }

    /// A new copy-on-write fork of `template` holding the chain's pages, written into it
    /// oldest first (`OpenedCheckpoint::restore_into`): of each page, the newest checkpoint
    /// that holds it whole and the changed chunks newer ones hold of it; a file whose hash was
    /// not known is read whole and its content hash checked before a newer one's pages go over
    /// it.
    pub fn new_memory(&self, template: &Template) -> Result<GuestMemory, TemplateError> {
        let mem = template.new_memory(super::ForkMemory::CopyOnWrite)?;
        let mut replaced = PageSet::with_capacity((mem.size() / PAGE_SIZE) as usize);
        let mut plans = Vec::with_capacity(self.0.len());
        for checkpoint in &self.0 {
            plans.push(checkpoint.plan(&replaced));
            for (addr, kind) in checkpoint.pages() {
                if kind.replaces() {
                    replaced.insert((addr / PAGE_SIZE) as usize);
                }
            }
        }
        for (checkpoint, plan) in self.0.iter().zip(plans).rev() {
            let which = if checkpoint.depth == self.newest().depth {
                String::new()
            } else {
                format!(" of its parent at depth {}", checkpoint.depth)
            };
            checkpoint.restore_into(&mem, &plan, &which)?;
        }
        Ok(mem)
    }
}

/// What a restore takes from one checkpoint of its chain.
struct Plan {
    /// Its raw pages to read, `(guest address, length, file offset)`, merged where they lie
    /// back to back in both.
    raw: Vec<(u64, u64, u64)>,
    /// Per page of its runs: whether to write it (no newer checkpoint holds it).
    wanted: Vec<bool>,
    /// The guest ranges of the zero, sparse and delta pages to write.
    written: Vec<(u64, u64)>,
    /// Whether a sparse or delta page is wanted (the packed region must be read).
    packed: bool,
}

impl OpenedCheckpoint {
    /// Its pages in order: guest address and how each is stored.
    fn pages(&self) -> impl Iterator<Item = (u64, PageKind)> + '_ {
        self.runs
            .iter()
            .flat_map(|&(start, len)| (start..start + len).step_by(PAGE_SIZE as usize))
            .zip(self.kinds.iter().copied())
    }

    /// Its pages that no newer checkpoint `replaced` (every page where its hash is to be
    /// checked: the whole file is read).
    fn plan(&self, replaced: &PageSet) -> Plan {
        let mut plan = Plan {
            raw: Vec::new(),
            wanted: Vec::with_capacity(self.kinds.len()),
            written: Vec::new(),
            packed: false,
        };
        let mut at = (self.head.len() * BLOCK) as u64;
        for (addr, kind) in self.pages() {
            let wanted =
                self.known_hash.is_none() || !replaced.contains((addr / PAGE_SIZE) as usize);
            plan.wanted.push(wanted);
            if kind == PageKind::Raw {
                if wanted {
                    match plan.raw.last_mut() {
                        Some((s, l, offset)) if *s + *l == addr && *offset + *l == at => {
                            *l += PAGE_SIZE
                        }
                        _ => plan.raw.push((addr, PAGE_SIZE, at)),
                    }
                }
                at += PAGE_SIZE;
            } else if wanted {
                plan.packed |= kind.packed();
                match plan.written.last_mut() {
                    Some((_, end)) if *end == addr => *end += PAGE_SIZE,
                    _ => plan.written.push((addr, addr + PAGE_SIZE)),
                }
            }
        }
        plan
    }

    /// Writes the pages of `plan` into `mem`. The raw ones are read straight into it: an
    /// O_DIRECT read makes the pages present itself, in one pass as it pins them; through the
    /// page cache they are made present in one call per run first (the copy would fault each
    /// in), as the zero, sparse and delta pages are before they are written (with O_DIRECT on
    /// another thread, while the disk reads the raw ones: `GuestMemory::populating_while`). A file whose hash was
    /// not known has its content hash checked after its raw pages are read and before anything
    /// of its packed region is used.
    /// `which` names the checkpoint in errors (empty for the newest).
    fn restore_into(
        &self,
        mem: &GuestMemory,
        plan: &Plan,
        which: &str,
    ) -> Result<(), TemplateError> {
        let read = || -> Result<Option<Blocks>, TemplateError> {
            mem.read_runs_from(&self.file.file, &plan.raw)?;
            let closing_blocks = ((self.file_len - self.packed_at) / BLOCK as u64) as usize;
            let packed = if plan.packed || self.known_hash.is_none() {
                Some(Blocks::read_from(
                    &self.file.file,
                    self.packed_at,
                    closing_blocks,
                )?)
            } else {
                None
            };
            if let (None, Some(packed)) = (self.known_hash, &packed) {
                let mut hasher = Sha256::new();
                self.head.iter().for_each(|block| hasher.update(block.0));
                for &(start, len, _) in &plan.raw {
                    hasher.update(
                        mem.range_bytes(start, len)
                            .map_err(|e| TemplateError::Corrupted(e.to_string()))?,
                    );
                }
                let (last, blocks) = packed
                    .blocks()
                    .split_last()
                    .ok_or_else(|| TemplateError::Corrupted("no closing block".into()))?;
                blocks.iter().for_each(|block| hasher.update(block.0));
                hasher.update(&last.0[..BLOCK - file::HASH_LEN]);
                if <[u8; 32]>::from(hasher.finalize()) != self.hash {
                    return Err(TemplateError::Corrupted(format!(
                        "the content hash{which} does not match the contents"
                    )));
                }
            }
            Ok(packed)
        };
        let packed = if self.file.direct && !plan.raw.is_empty() && !plan.written.is_empty() {
            // The disk fills the raw pages while another thread makes the others present.
            mem.populating_while(&plan.written, read)?
        } else {
            if !self.file.direct {
                for &(start, len, _) in &plan.raw {
                    mem.populate_for_write(start, len)?;
                }
            }
            let packed = read()?;
            for &(start, end) in &plan.written {
                mem.populate_for_write(start, end - start)?;
            }
            packed
        };
        let mut unpacker = packed
            .as_ref()
            .map(|packed| Unpacker::new(packed, self.packed_len as usize));
        let damaged =
            |why: String| TemplateError::Corrupted(format!("the packed pages{which}: {why}"));
        for ((addr, kind), &wanted) in self.pages().zip(&plan.wanted) {
            match kind {
                PageKind::Zero if wanted => {
                    sparse::restore(mem, addr, kind, 0, &[]).map_err(|e| damaged(e.to_string()))?
                }
                // Read in order whenever the region is: each page's place follows from those before.
                PageKind::Sparse | PageKind::Delta => {
                    if let Some(unpacker) = unpacker.as_mut() {
                        let (mask, stored) = unpacker.next_page().map_err(damaged)?;
                        if wanted {
                            sparse::restore(mem, addr, kind, mask, stored)
                                .map_err(|e| damaged(e.to_string()))?;
                        }
                    }
                }
                _ => {}
            }
        }
        match unpacker {
            Some(unpacker) => unpacker.finish().map_err(damaged),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_keep_the_bytes_in_order_and_none_is_longer_than_asked() {
        let (a, b, c) = ([1u8; 4096], [2u8; 3 * 4096], [3u8; 4096]);
        let pieces = pieces_of(&[&a, &b, &c], 2 * 4096);
        let lengths: Vec<Vec<usize>> = pieces
            .iter()
            .map(|piece| piece.iter().map(|bytes| bytes.len()).collect())
            .collect();
        assert_eq!(lengths, vec![vec![4096, 4096], vec![8192], vec![4096]]);
        let joined: Vec<u8> = pieces.concat().concat();
        assert_eq!(joined, [&a[..], &b[..], &c[..]].concat());
        assert_eq!(
            pieces_of(&[], 4096),
            vec![Vec::<&[u8]>::new()],
            "an empty body is one empty piece"
        );
    }

    #[test]
    fn only_pages_holding_new_bytes_count_as_changed() {
        let mem = GuestMemory::new(64 * 1024).unwrap();
        let mut fingerprints = PageFingerprints::new().unwrap();
        let mut written = PageSet::with_capacity(16);
        written.insert_range(1..4);
        let (changed, fresh) = fingerprints.changed(&mem, &written).unwrap();
        assert_eq!(
            changed.pages.ones().collect::<Vec<_>>(),
            vec![1, 2, 3],
            "nothing recorded yet"
        );
        assert!(
            changed.masks.iter().all(|masks| masks.changed.is_none()),
            "no page had a record: none is a delta"
        );
        fingerprints.record(true, fresh);
        mem.write_u64(0x2000, 7).unwrap();
        mem.write_u64(0x2000 + 130, 7).unwrap();
        mem.write_u64(0x3000, 0).unwrap();
        let (changed, fresh) = fingerprints.changed(&mem, &written).unwrap();
        assert_eq!(
            (changed.pages.ones().collect::<Vec<_>>(), fresh.len()),
            (vec![2], 1),
            "page 3 holds its bytes again, page 1 was not touched"
        );
        assert_eq!(
            changed.masks,
            vec![ChunkMasks {
                nonzero: 0b101,
                changed: Some(0b101)
            }],
            "chunks 0 and 2 (bytes 130..138) of page 2 changed, and are its only non-zero ones"
        );
        fingerprints.record(false, fresh);
        mem.write_u64(0x2000, 0).unwrap();
        let (changed, _) = fingerprints.changed(&mem, &written).unwrap();
        assert_eq!(
            (changed.pages.ones().collect::<Vec<_>>(), changed.masks),
            (
                vec![2],
                vec![ChunkMasks {
                    nonzero: 0b100,
                    changed: Some(0b1)
                }]
            ),
            "back to what an older checkpoint held is still a change"
        );
        assert_eq!(
            fingerprints
                .of_ranges(&mem, &[(0x1000, 0x3000)])
                .unwrap()
                .len(),
            2
        );
    }
}
