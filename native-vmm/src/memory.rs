//! Guest RAM: one memfd mapped into the VMM, and the only way to touch it.
//!
//! Every access from VMM code goes through the bounds-checked accessors below; guest addresses
//! are guest-physical, which equal guest-virtual because the guest runs on an identity map.
//! The raw host pointer is handed out only to KVM (memslot registration).
//!
//! Why not rust-vmm's vm-memory (Debian's 0.10, `GuestMemoryMmap`): above 8 bytes its copies are
//! a memcpy like ours, so the syscall path would run at the same speed, but it would replace
//! only the accessors and the two mmap calls (~60 lines); the rest of this file (the template
//! memfd and its copy-on-write forks, PAGEMAP_SCAN and SEEK_DATA page accounting, `MappedFile`)
//! stays, and every caller would move from a plain `u64` and `OutOfBounds` (EFAULT) to
//! `GuestAddress` and a five-variant error, or keep a wrapper as large as these accessors.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use fixedbitset::FixedBitSet;

use crate::layout::PAGE_SIZE;
use crate::sys;

/// A set of guest pages: bit i is the page at guest-physical `i * PAGE_SIZE`.
pub type PageSet = FixedBitSet;

/// The pages of `set` as sorted guest-physical ranges `[start, end)`, neighbours merged.
pub fn page_ranges(set: &PageSet) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for page in set.ones() {
        let start = page as u64 * PAGE_SIZE;
        match ranges.last_mut() {
            Some(last) if last.1 == start => last.1 = start + PAGE_SIZE,
            _ => ranges.push((start, start + PAGE_SIZE)),
        }
    }
    ranges
}

/// A guest address range that does not lie inside guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBounds {
    pub addr: u64,
    pub len: u64,
}

impl fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "guest range {:#x}+{:#x} is outside guest memory",
            self.addr, self.len
        )
    }
}

impl std::error::Error for OutOfBounds {}

/// A file a `GuestMemory` maps (`GuestMemory::file_held`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldFile {
    /// The same for every memory that maps this file.
    pub id: usize,
    /// The pages the host holds for it.
    pub pages: u64,
    /// Whether no other memory maps it.
    pub sole: bool,
}

/// This process's /proc/self/pagemap, opened once and kept: a confined daemon (`seccomp`) may
/// not open files. `open_pagemap` opens it ahead, before confinement.
fn pagemap() -> io::Result<&'static std::fs::File> {
    static PAGEMAP: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();
    if let Some(file) = PAGEMAP.get() {
        return Ok(file);
    }
    let file = std::fs::File::open("/proc/self/pagemap")?;
    Ok(PAGEMAP.get_or_init(|| file))
}

pub fn open_pagemap() -> io::Result<()> {
    pagemap().map(drop)
}

/// `GuestMemory::map_layer_holes`: the smallest hole of a layer mapped anonymously, and how
/// many at most at once, the largest (each is a host mapping of its own, made at every fork;
/// new allocations land in the large holes).
const LAYER_HOLE_MIN: u64 = 64 * PAGE_SIZE;
const LAYER_HOLES_MAX: usize = 64;

pub struct GuestMemory {
    host: *mut u8,
    /// The mapping's length; zero once `retire` unmapped it, so that every access after is
    /// out of bounds.
    size: Cell<u64>,
    /// What the mapping shows outside shared ranges. It changes when a process forks
    /// (`freeze`) or ends (`retire`).
    backing: RefCell<Backing>,
    /// With `track_writes`: the pages the VMM itself wrote (through these accessors) since
    /// `take_written`. The guest's own writes are the vCPU backend's to track
    /// (`GuestCpu::take_written_pages`).
    written: Option<RefCell<PageSet>>,
    /// The ranges that show a `SharedMemory` instead of this memory's own pages (MAP_SHARED
    /// mappings), by start: each `(end, memory, offset into it)`.
    shared: RefCell<BTreeMap<u64, SharedRange>>,
    /// Pages that show a page of the whole VMM process (`show_shared_page`: the vDSO's clock),
    /// which a release must never empty.
    shown_pages: RefCell<Vec<u64>>,
}

/// What a `GuestMemory`'s own pages are.
enum Backing {
    /// A memfd of its own, mapped shared: every write lands in the file.
    Own(Arc<OwnedFd>),
    /// A private (copy-on-write) mapping of a file that nothing writes while it is mapped
    /// so: a template's memfd (`template`), or a layer, the memfd of a process that forked,
    /// frozen then and mapped privately by it and its child (`freeze`). A write copies the
    /// page for this mapping alone.
    Private { file: Arc<OwnedFd>, template: bool },
    /// Nothing: the memory was retired (`retire`), unmapped and letting go of its file.
    Retired,
}

/// A range of guest memory that shows `memory` from `offset` on.
#[derive(Clone)]
struct SharedRange {
    end: u64,
    memory: Arc<SharedMemory>,
    offset: u64,
}

// SAFETY: the mapping is owned by this value; concurrent use is serialised by the VM that owns it
// (the vCPU is stopped whenever VMM code touches guest memory).
unsafe impl Send for GuestMemory {}

impl GuestMemory {
    /// Allocates `size` bytes (a multiple of 4 KiB) of zeroed guest RAM in a fresh memfd.
    pub fn new(size: u64) -> io::Result<Self> {
        if size == 0 || !size.is_multiple_of(4096) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "guest memory size must be a non-zero multiple of 4 KiB",
            ));
        }
        let fd = sys::memfd("sandfork-guest", size)?;
        // SAFETY: mapping a fresh memfd of exactly `size` bytes at a kernel-chosen address.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if host == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(GuestMemory {
            host: host as *mut u8,
            size: Cell::new(size),
            backing: RefCell::new(Backing::Own(Arc::new(fd))),
            written: None,
            shared: RefCell::default(),
            shown_pages: RefCell::default(),
        })
    }

    /// A copy-on-write fork of a template's memory: the template's memfd mapped
    /// `MAP_PRIVATE | MAP_NORESERVE`. Every page reads as the template's until the fork writes
    /// it; the host then copies that page for this fork alone. Neither the template nor any
    /// other fork sees the write, and creating the fork copies nothing.
    pub fn fork_of(template: &TemplateMemory) -> io::Result<GuestMemory> {
        GuestMemory::private_mapping_of(&template.fd, template.mem.size(), true)
    }

    /// `size` bytes of `source` (a template's memfd, or a layer) mapped
    /// `MAP_PRIVATE | MAP_NORESERVE`.
    fn private_mapping_of(
        source: &Arc<OwnedFd>,
        size: u64,
        template: bool,
    ) -> io::Result<GuestMemory> {
        // SAFETY: a fresh private mapping of the whole template memfd (exactly `size` bytes)
        // at a kernel-chosen address.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_NORESERVE,
                source.as_raw_fd(),
                0,
            )
        };
        if host == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mem = GuestMemory {
            host: host as *mut u8,
            size: Cell::new(size),
            backing: RefCell::new(Backing::Private {
                file: source.clone(),
                template,
            }),
            written: None,
            shared: RefCell::default(),
            shown_pages: RefCell::default(),
        };
        mem.map_layer_holes(&[(0, size)])?;
        Ok(mem)
    }

    /// Over a layer (a file this memory maps privately that is not a template's): maps
    /// anonymous memory over the file's holes inside `spans`, those of at least
    /// `LAYER_HOLE_MIN` bytes and the `LAYER_HOLES_MAX` largest of them, so that a page first
    /// touched there is this memory's alone. Through the file, shmem would first fill the hole
    /// with a page of the layer, and a written page would be held twice.
    fn map_layer_holes(&self, spans: &[(u64, u64)]) -> io::Result<()> {
        let file = match &*self.backing.borrow() {
            Backing::Private {
                file,
                template: false,
            } => file.clone(),
            _ => return Ok(()),
        };
        // Only the spans' own extents are read: a release maps holes in the range it gave back.
        let mut pieces = Vec::new();
        for &(span_start, span_end) in spans {
            let mut at = span_start;
            let extents = self.file_extents(&file, span_start, span_end)?;
            for (start, end) in extents.into_iter().chain([(span_end, span_end)]) {
                if start >= at + LAYER_HOLE_MIN {
                    pieces.push((at, start));
                }
                at = at.max(end);
            }
        }
        pieces.sort_unstable_by_key(|&(start, end)| std::cmp::Reverse(end - start));
        let anonymous = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        for (start, end) in pieces.into_iter().take(LAYER_HOLES_MAX) {
            self.map_over(
                start,
                end - start,
                libc::PROT_READ | libc::PROT_WRITE,
                anonymous,
                -1,
                0,
            )?;
            // Copied a page at a time, as through the layer.
            self.advise(start, end, libc::MADV_NOHUGEPAGE)?;
        }
        Ok(())
    }

    /// A copy of this memory as it is now, for a process forked inside the VM. Memory of its
    /// own is frozen into a layer that both map privately (`freeze`), so nothing is copied
    /// and each side copies a page only when it writes it; so is memory over a layer that no
    /// other process maps (the pages it wrote since go into the layer first). Otherwise (a fork
    /// of a template, a layer another process still maps) the copy maps the same file and
    /// gets copies of the pages this one wrote now: more of them than `room()` bytes (asked
    /// only then) is `ErrorKind::OutOfMemory`, before anything changes. A frozen or lent copy
    /// copies a page only when one side writes it; the process tree keeps its memory limit as
    /// they do.
    pub fn duplicate(&self, room: impl FnOnce() -> u64) -> io::Result<GuestMemory> {
        self.fork_copy(room, false)
    }

    /// `duplicate` for a fork whose caller waits while the child runs first: memory of its
    /// own is lent, not frozen. The copy maps its memfd privately and this memory stays as it
    /// is, warm in its VM, until it next runs while the copy lives (`freeze_if_lent`); a child
    /// that execs or exits first (a shell's command, `fork` then `exec`) never makes it freeze.
    pub fn lend(&self, room: impl FnOnce() -> u64) -> io::Result<GuestMemory> {
        self.fork_copy(room, true)
    }

    /// `duplicate`, or with `lend` `lend`.
    fn fork_copy(&self, room: impl FnOnce() -> u64, lend: bool) -> io::Result<GuestMemory> {
        let copied = self.copied_own_ranges()?.unwrap_or_default();
        let lent = match &*self.backing.borrow() {
            Backing::Own(file) if lend => Some(file.clone()),
            _ => None,
        };
        let copy = match lent {
            Some(file) => GuestMemory::private_mapping_of(&file, self.size.get(), false)?,
            None => match self.freeze(&copied)? {
                Some(layer) => GuestMemory::private_mapping_of(&layer, self.size.get(), false)?,
                None if crate::layout::pages_in(&copied) * PAGE_SIZE > room() => {
                    return Err(io::Error::new(
                        io::ErrorKind::OutOfMemory,
                        "the copy does not fit the memory left",
                    ))
                }
                None => self.copy_of_written(&copied)?,
            },
        };
        // Shared mappings stay shared: the copy shows the same memory at the same place.
        for (start, range) in self.shared.borrow().iter() {
            copy.share(*start, range.end - start, &range.memory, range.offset)?;
        }
        Ok(copy)
    }

    /// Before this memory's process runs or is written again: when a live copy maps its memfd
    /// (`lend`), freezes it into the layer they both map privately, as `duplicate` would have
    /// at the fork, so that neither sees the other's writes from now on.
    pub fn freeze_if_lent(&self) -> io::Result<()> {
        let lent =
            matches!(&*self.backing.borrow(), Backing::Own(file) if Arc::strong_count(file) > 1);
        if lent {
            self.freeze(&[])?;
        }
        Ok(())
    }

    /// A mapping of the file this memory maps privately with copies of the pages this memory
    /// wrote (`copied`, its `copied_own_ranges`).
    fn copy_of_written(&self, copied: &[(u64, u64)]) -> io::Result<GuestMemory> {
        let copy = match &*self.backing.borrow() {
            Backing::Private { file, template } => {
                GuestMemory::private_mapping_of(file, self.size.get(), *template)?
            }
            Backing::Retired => return Err(io::Error::other("a retired memory is not copied")),
            Backing::Own(_) => {
                return Err(io::Error::other("memory of its own is frozen, not copied"))
            }
        };
        for &(start, end) in copied {
            let bytes = self
                .range_bytes(start, end - start)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            copy.write(start, bytes)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
        Ok(copy)
    }

    /// For a fork: makes this memory's file a layer that this memory and its copy both map
    /// privately, and returns it; None when it cannot be (a template's memfd, a layer another
    /// memory maps too). Memory of its own is mapped privately from its memfd from now on;
    /// memory over a layer only it maps first writes the pages it holds copies of into the
    /// layer and shows the layer there again. Either way the bytes it shows do not change,
    /// and no mapping sees a later write of another. `copied` is its `copied_own_ranges`.
    fn freeze(&self, copied: &[(u64, u64)]) -> io::Result<Option<Arc<OwnedFd>>> {
        let (file, remap, was_own) = match &*self.backing.borrow() {
            Backing::Own(file) => (file.clone(), self.own_spans(), true),
            Backing::Private {
                file,
                template: false,
            } if Arc::strong_count(file) == 1 => {
                for &(start, end) in copied {
                    let bytes = self
                        .range_bytes(start, end - start)
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    write_to_file(file, start, bytes)?;
                }
                (file.clone(), copied.to_vec(), false)
            }
            _ => return Ok(None),
        };
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_NORESERVE;
        for &(start, end) in &remap {
            self.map_over(start, end - start, prot, flags, file.as_raw_fd(), start)?;
        }
        *self.backing.borrow_mut() = Backing::Private {
            file: file.clone(),
            template: false,
        };
        // Over a layer already, the holes are mapped and the remapped copies hold data.
        if was_own {
            self.map_layer_holes(&remap)?;
        }
        Ok(Some(file))
    }

    /// The ranges that show this memory's own pages: neither shared memory nor a page shown
    /// from elsewhere.
    fn own_spans(&self) -> Vec<(u64, u64)> {
        let mut shown = self.shown_pages.borrow().clone();
        shown.sort_unstable();
        let mut spans = Vec::new();
        for (start, end) in self.own_parts(0, self.size.get()) {
            let mut at = start;
            for &page in shown.iter().filter(|&&p| p >= start && p < end) {
                if at < page {
                    spans.push((at, page));
                }
                at = page + PAGE_SIZE;
            }
            if at < end {
                spans.push((at, end));
            }
        }
        spans
    }

    pub fn size(&self) -> u64 {
        self.size.get()
    }

    /// From now on, records which pages the VMM writes (`take_written`): a session VM's
    /// incremental checkpoints hold only the pages written since the one before.
    pub fn track_writes(&mut self) {
        self.written = Some(RefCell::new(PageSet::with_capacity(
            (self.size.get() / PAGE_SIZE) as usize,
        )));
    }

    /// Whether `track_writes` was called.
    pub fn tracks_writes(&self) -> bool {
        self.written.is_some()
    }

    /// Records `pages` as written when writes are tracked: what another VM on this memory (a
    /// vfork child's) wrote, which this VM's log never saw.
    pub fn note_written(&self, pages: &PageSet) {
        if let Some(set) = &self.written {
            set.borrow_mut().union_with(pages);
        }
    }

    /// The pages the VMM wrote since tracking began or the last call (None: not tracked).
    pub fn take_written(&self) -> Option<PageSet> {
        let pages = (self.size.get() / PAGE_SIZE) as usize;
        self.written
            .as_ref()
            .map(|set| std::mem::replace(&mut *set.borrow_mut(), PageSet::with_capacity(pages)))
    }

    /// Records a write of `[off, off+len)` (bounds-checked by the caller).
    fn mark_written(&self, off: usize, len: usize) {
        if let (Some(set), true) = (&self.written, len > 0) {
            let page = PAGE_SIZE as usize;
            set.borrow_mut()
                .insert_range(off / page..(off + len).div_ceil(page));
        }
    }

    /// The memfd behind guest RAM, which another mapping of it shares (the ptrace CPU's
    /// child). None for a copy-on-write fork: its own writes are in no file.
    pub fn fd(&self) -> Option<Arc<OwnedFd>> {
        match &*self.backing.borrow() {
            Backing::Own(file) => Some(file.clone()),
            _ => None,
        }
    }

    /// Whether this is memory of its own (a memfd mapped shared).
    fn is_own(&self) -> bool {
        matches!(*self.backing.borrow(), Backing::Own(_))
    }

    /// For a copy-on-write fork: how many of its pages the host has copied so far (pages the
    /// fork wrote: present and no longer file pages). For memory of its own (not a fork): None.
    /// It is on every restored run's response path, so the kernel is asked for the ranges of
    /// such pages (PAGEMAP_SCAN, which skips the untouched rest of the mapping); kernels
    /// without it get a read of one /proc/self/pagemap entry per page.
    pub fn copied_pages(&self) -> io::Result<Option<u64>> {
        Ok(self
            .copied_ranges()?
            .map(|ranges| crate::layout::pages_in(&ranges)))
    }

    /// For a copy-on-write fork: the guest-physical ranges `[start, end)` of the pages it holds
    /// copies of, sorted (PAGEMAP_SCAN; kernels before 6.7, Debian 12's 6.1 among them, get a
    /// read of one /proc/self/pagemap entry per page). For memory of its own (not a fork): None.
    /// The ranges that show shared memory count as copies too: their bytes are the VM's own
    /// state (a checkpoint saves them, a reset gives them the template's bytes back).
    pub fn copied_ranges(&self) -> io::Result<Option<Vec<(u64, u64)>>> {
        let Some(own) = self.copied_own_ranges()? else {
            return Ok(None);
        };
        let shared = self.shared.borrow();
        if shared.is_empty() {
            return Ok(Some(own));
        }
        Ok(Some(crate::layout::merge_ranges(
            own.into_iter()
                .chain(shared.iter().map(|(&start, range)| (start, range.end)))
                .collect(),
        )))
    }

    /// `copied_ranges` without the shared ranges: the pages the host copied for this fork.
    fn copied_own_ranges(&self) -> io::Result<Option<Vec<(u64, u64)>>> {
        if self.is_own() {
            return Ok(None);
        }
        let pagemap = pagemap()?;
        match self.scan_copied_ranges(pagemap) {
            // Host errnos of a kernel without PAGEMAP_SCAN.
            Err(e) if matches!(e.raw_os_error(), Some(25 /* ENOTTY */ | 22 /* EINVAL */)) => {
                self.read_copied_ranges(pagemap).map(Some)
            }
            scanned => scanned.map(Some),
        }
    }

    fn scan_copied_ranges(&self, pagemap: &std::fs::File) -> io::Result<Vec<(u64, u64)>> {
        let base = self.host as u64;
        let end = base + self.size.get();
        let mut regions = [sys::PageRegion::default(); 256];
        let (mut at, mut ranges) = (base, Vec::new());
        while at < end {
            let (filled, walk_end) = sys::pagemap_scan(
                pagemap.as_raw_fd(),
                at,
                end,
                sys::PAGE_IS_PRESENT | sys::PAGE_IS_FILE | sys::PAGE_IS_PFNZERO,
                sys::PAGE_IS_FILE | sys::PAGE_IS_PFNZERO,
                &mut regions,
            )?;
            let found = regions.get(..filled).ok_or_else(|| {
                io::Error::other("PAGEMAP_SCAN reported more regions than it was given room for")
            })?;
            for region in found {
                if region.start < base || region.end > end || region.start >= region.end {
                    return Err(io::Error::other(
                        "PAGEMAP_SCAN reported a region outside the mapping",
                    ));
                }
                ranges.push((region.start - base, region.end - base));
            }
            if walk_end <= at {
                return Err(io::Error::other("PAGEMAP_SCAN made no progress"));
            }
            at = walk_end;
        }
        Ok(ranges)
    }

    /// Puts a copy-on-write fork of `template` back into the template's state, given the pages
    /// it holds copies of (`copied_ranges`, current: nothing copied since): each gets the
    /// template's bytes again (zeros where the template has none), and the copies stay in
    /// place, so the host pages and KVM's mappings of them stay warm for the next request
    /// (destroying the fork would make that request fault each one in again). Pages the fork
    /// never wrote still show the template. Returns how many pages were restored.
    pub fn reset_to(&self, template: &TemplateMemory, copied: &[(u64, u64)]) -> io::Result<u64> {
        let of_template = matches!(
            &*self.backing.borrow(),
            Backing::Private { file, template: true } if Arc::ptr_eq(file, &template.fd)
        );
        if !of_template || self.size.get() != template.size() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "only a copy-on-write fork of this template can be reset to it",
            ));
        }
        // Shared ranges show the template again first, so restoring them writes no shared memory.
        self.unshare(0, self.size.get())?;
        let mut pages = 0;
        for &(start, end) in copied {
            if start >= end || end > self.size.get() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("copied range {start:#x}..{end:#x} is not inside guest memory"),
                ));
            }
            let mut at = start;
            for &(data_start, data_end) in &template.data {
                if data_end <= at || data_start >= end {
                    continue;
                }
                let (from, to) = (data_start.max(at), data_end.min(end));
                self.zero(at, from)?;
                self.copy_from(&template.mem, from, to)?;
                at = to;
            }
            self.zero(at, end)?;
            pages += (end - start) / crate::layout::PAGE_SIZE;
        }
        Ok(pages)
    }

    /// Zeroes guest memory `[start, end)` (nothing when empty).
    fn zero(&self, start: u64, end: u64) -> io::Result<()> {
        if start < end {
            self.fill(start, end - start, 0)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        }
        Ok(())
    }

    /// Copies `[start, end)` of `source` (a memory of the same size) to the same range here.
    fn copy_from(&self, source: &GuestMemory, start: u64, end: u64) -> io::Result<()> {
        let len = end.saturating_sub(start);
        let off = self
            .check(start, len)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        source
            .check(start, len)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: off..off+len was bounds-checked against both mappings just above; they are
        // distinct mappings, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(source.host.add(off), self.host.add(off), len as usize)
        };
        self.mark_written(off, len as usize);
        Ok(())
    }

    fn read_copied_ranges(&self, pagemap: &std::fs::File) -> io::Result<Vec<(u64, u64)>> {
        use std::os::unix::fs::FileExt;
        const PRESENT: u64 = 1 << 63;
        const FILE_OR_SHARED: u64 = 1 << 61;
        // Host pages are the guest's 4 KiB pages (x86-64).
        let page = crate::layout::PAGE_SIZE;
        let first = self.host as u64 / page;
        let pages = self.size.get() / page;
        let mut entries = vec![0u8; (pages.min(1 << 16) * 8) as usize];
        let (mut done, mut ranges) = (0, Vec::<(u64, u64)>::new());
        while done < pages {
            let n = (pages - done).min(1 << 16) as usize;
            pagemap.read_exact_at(&mut entries[..n * 8], (first + done) * 8)?;
            for (i, e) in entries[..n * 8].chunks_exact(8).enumerate() {
                let entry = u64::from_le_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]);
                if entry & PRESENT != 0 && entry & FILE_OR_SHARED == 0 {
                    let start = (done + i as u64) * page;
                    match ranges.last_mut() {
                        Some(last) if last.1 == start => last.1 = start + page,
                        _ => ranges.push((start, start + page)),
                    }
                }
            }
            done += n as u64;
        }
        Ok(ranges)
    }

    /// The page-aligned ranges of the memfd that hold pages (SEEK_DATA/SEEK_HOLE): everything
    /// outside them reads as zero and was never written. Over a layer: the layer's and the
    /// pages copied from it. Empty for a fork of a template.
    pub fn data_extents(&self) -> io::Result<Vec<(u64, u64)>> {
        if matches!(
            *self.backing.borrow(),
            Backing::Private { template: true, .. } | Backing::Retired
        ) {
            return Ok(Vec::new());
        }
        self.held_ranges(&self.copied_own_ranges()?.unwrap_or_default())
    }

    /// The ranges of the pages this memory holds, given `copied` (its `copied_own_ranges`):
    /// its memfd's data; over a layer, the layer's data and the copies; over a template or
    /// anonymous memory, the copies.
    fn held_ranges(&self, copied: &[(u64, u64)]) -> io::Result<Vec<(u64, u64)>> {
        match &*self.backing.borrow() {
            Backing::Own(file) => self.file_extents(file, 0, self.size.get()),
            Backing::Private {
                file,
                template: false,
            } => {
                let mut extents = self.file_extents(file, 0, self.size.get())?;
                extents.extend_from_slice(copied);
                Ok(crate::layout::merge_ranges(extents))
            }
            Backing::Private { template: true, .. } | Backing::Retired => Ok(copied.to_vec()),
        }
    }

    /// The page-aligned ranges of `fd` (a file as large as this memory) that hold pages, within
    /// `[from, to)`.
    fn file_extents(&self, fd: &OwnedFd, from: u64, to: u64) -> io::Result<Vec<(u64, u64)>> {
        let to = to.min(self.size.get());
        let mut extents = Vec::new();
        let mut at = from;
        while at < to {
            let Some(start) = sys::seek_data(fd.as_raw_fd(), at)?.filter(|&start| start < to)
            else {
                break;
            };
            let end = sys::seek_hole(fd.as_raw_fd(), start)?.min(to);
            if end <= start {
                break;
            }
            extents.push((start, end));
            at = end;
        }
        Ok(extents)
    }

    /// Host address of guest-physical 0, for KVM_SET_USER_MEMORY_REGION only.
    pub(crate) fn host_base(&self) -> u64 {
        self.host as u64
    }

    /// Checks that `[addr, addr+len)` lies inside guest memory and returns its host offset.
    pub fn check(&self, addr: u64, len: u64) -> Result<usize, OutOfBounds> {
        match addr.checked_add(len) {
            Some(end) if end <= self.size.get() => Ok(addr as usize),
            _ => Err(OutOfBounds { addr, len }),
        }
    }

    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfBounds> {
        let off = self.check(addr, buf.len() as u64)?;
        // SAFETY: off..off+len was bounds-checked against the mapping just above.
        unsafe { std::ptr::copy_nonoverlapping(self.host.add(off), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), OutOfBounds> {
        let off = self.check(addr, data.len() as u64)?;
        if !self.write_to_own_file(addr, data) {
            // SAFETY: off..off+len was bounds-checked against the mapping just above.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.host.add(off), data.len()) };
        }
        self.mark_written(off, data.len());
        Ok(())
    }

    /// Writes a large `data` at `addr` (bounds-checked by the caller) straight into this
    /// memory's own memfd, when the range shows only that: the pages it allocates are not
    /// faulted into the VMM's page tables, and the guest maps only those it touches (a
    /// library's bytes, mostly never read). False when the mapping must be written instead.
    fn write_to_own_file(&self, addr: u64, data: &[u8]) -> bool {
        const LARGE: usize = 64 << 10;
        if data.len() < LARGE {
            return false;
        }
        let end = addr + data.len() as u64;
        let backing = self.backing.borrow();
        let Backing::Own(file) = &*backing else {
            return false;
        };
        let only_own = self.own_parts(addr, data.len() as u64) == [(addr, end)]
            && !self
                .shown_pages
                .borrow()
                .iter()
                .any(|&page| page < end && page + PAGE_SIZE > addr);
        only_own && sys::write_all_at(file.as_raw_fd(), data, addr).is_ok()
    }

    pub fn fill(&self, addr: u64, len: u64, byte: u8) -> Result<(), OutOfBounds> {
        let off = self.check(addr, len)?;
        // SAFETY: off..off+len was bounds-checked against the mapping just above.
        unsafe { std::ptr::write_bytes(self.host.add(off), byte, len as usize) };
        self.mark_written(off, len as usize);
        Ok(())
    }

    /// `[addr, addr+len)` as one slice, so that guest memory can be written to a file and
    /// hashed without a copy (a session checkpoint, several ranges at once). The caller holds
    /// the VM's vCPU stopped, so nothing writes the range while the slice lives.
    pub fn range_bytes(&self, addr: u64, len: u64) -> Result<&[u8], OutOfBounds> {
        let off = self.check(addr, len)?;
        // SAFETY: off..off+len was bounds-checked against the mapping, which outlives the borrow.
        Ok(unsafe { std::slice::from_raw_parts(self.host.add(off), len as usize) })
    }

    /// Reads pieces of `file` into guest memory: `(addr, len, file offset)` each, sorted by
    /// address and not overlapping, in vectored reads (one per stretch of pieces that lie back
    /// to back in the file): filling a restored session's pages straight from its checkpoints
    /// (with O_DIRECT, by the disk itself, through no page cache). Recorded as the VMM's writes
    /// when they are tracked (a restore takes them before tracking starts).
    pub fn read_runs_from(
        &self,
        file: &std::fs::File,
        pieces: &[(u64, u64, u64)],
    ) -> io::Result<()> {
        const IOV_MAX: usize = 1024;
        let mut previous_end = 0;
        let mut group: Vec<io::IoSliceMut<'_>> = Vec::new();
        let (mut group_start, mut group_end) = (0, 0);
        for (i, &(addr, len, at)) in pieces.iter().enumerate() {
            let off = self
                .check(addr, len)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            if addr < previous_end {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "page runs overlap or are not sorted",
                ));
            }
            previous_end = addr + len;
            if at != group_end || group.len() == IOV_MAX {
                read_all_at(file, &mut group, group_start)?;
                group_start = at;
            }
            // SAFETY: off..off+len was bounds-checked against the mapping, which outlives the
            // slices; the pieces do not overlap (checked above), so no two slices alias; the
            // caller's VM is not running while its memory is filled.
            group.push(io::IoSliceMut::new(unsafe {
                std::slice::from_raw_parts_mut(self.host.add(off), len as usize)
            }));
            group_end = at.checked_add(len).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "a file offset past the end")
            })?;
            self.mark_written(off, len as usize);
            if i + 1 == pieces.len() {
                read_all_at(file, &mut group, group_start)?;
            }
        }
        Ok(())
    }

    /// Makes the pages of `[addr, addr+len)` present and writable in one call
    /// (MADV_POPULATE_WRITE; for a fork, each gets its private copy), instead of one fault per
    /// page as a write would take: filling a restored session's pages (`populate`).
    pub fn populate_for_write(&self, addr: u64, len: u64) -> io::Result<()> {
        let off = self
            .check(addr, len)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        populate(self.host as usize + off, len as usize)
    }

    /// `populate_for_write` of each range `[start, end)` of `ranges` on a thread of its own
    /// while `work` runs on this one, which must not touch them: a restore makes its packed
    /// pages present while the disk reads its raw ones into others (one waits on the page
    /// allocator, the other on the disk). `work`'s error comes first, then a populate's.
    pub fn populating_while<T, E: From<io::Error>>(
        &self,
        ranges: &[(u64, u64)],
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let outside = |e: OutOfBounds| io::Error::new(io::ErrorKind::InvalidInput, e);
        let spans = ranges
            .iter()
            .map(|&(start, end)| {
                let len = end.saturating_sub(start);
                self.check(start, len)
                    .map(|off| (self.host as usize + off, len as usize))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(outside)?;
        std::thread::scope(|scope| {
            // The mapping outlives the scope (borrowed by `self`); the spans were bounds-checked.
            let populating = scope.spawn(move || {
                spans
                    .into_iter()
                    .try_for_each(|(host, len)| populate(host, len))
            });
            let done = work();
            let populated = populating
                .join()
                .map_err(|_| io::Error::other("a thread making pages present panicked"));
            let value = done?;
            populated.and_then(|populated| populated).map_err(E::from)?;
            Ok(value)
        })
    }

    pub fn read_vec(&self, addr: u64, len: u64) -> Result<Vec<u8>, OutOfBounds> {
        self.check(addr, len)?;
        let mut v = vec![0u8; len as usize];
        self.read(addr, &mut v)?;
        Ok(v)
    }

    pub fn read_u64(&self, addr: u64) -> Result<u64, OutOfBounds> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    pub fn write_u64(&self, addr: u64, value: u64) -> Result<(), OutOfBounds> {
        self.write(addr, &value.to_le_bytes())
    }

    pub fn read_u32(&self, addr: u64) -> Result<u32, OutOfBounds> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    pub fn write_u32(&self, addr: u64, value: u32) -> Result<(), OutOfBounds> {
        self.write(addr, &value.to_le_bytes())
    }

    /// Reads a NUL-terminated string of at most `max` bytes (without the NUL).
    pub fn read_cstr(&self, addr: u64, max: usize) -> Result<Vec<u8>, OutOfBounds> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 256];
        let mut cur = addr;
        while out.len() < max {
            // Read up to the end of memory, so a string near the top still works.
            let want = (max - out.len() + 1).min(chunk.len()) as u64;
            let avail = self.size.get().saturating_sub(cur).min(want) as usize;
            if avail == 0 {
                return Err(OutOfBounds {
                    addr,
                    len: (out.len() + 1) as u64,
                });
            }
            self.read(cur, &mut chunk[..avail])?;
            if let Some(nul) = chunk[..avail].iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..nul]);
                return Ok(out);
            }
            out.extend_from_slice(&chunk[..avail]);
            cur += avail as u64;
        }
        Err(OutOfBounds {
            addr,
            len: max as u64 + 1,
        })
    }
}

/// Runs `work` on a shared mapping of `[offset, offset+len)` (page-aligned) of `file`, a
/// layer: how its bytes change while processes map it privately (the daemon's system call
/// filter has no pwrite or fallocate).
fn with_file_view(
    file: &OwnedFd,
    offset: u64,
    len: u64,
    work: impl FnOnce(*mut u8) -> io::Result<()>,
) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: a fresh shared mapping of `len` bytes of the file at a kernel-chosen address,
    // unmapped below before anything else can see it.
    let view = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset.cast_signed(),
        )
    };
    if view == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let done = work(view as *mut u8);
    // SAFETY: unmapping the view mapped just above; `work` has returned and kept no pointer.
    unsafe { libc::munmap(view, len as usize) };
    done
}

/// Writes `bytes` (whole pages) into `file` at `offset`.
fn write_to_file(file: &OwnedFd, offset: u64, bytes: &[u8]) -> io::Result<()> {
    sys::write_all_at(file.as_raw_fd(), bytes, offset)
}

/// Frees `file`'s pages in `[offset, offset+len)` (page-aligned): they read as zeros again.
fn remove_from_file(file: &OwnedFd, offset: u64, len: u64) -> io::Result<()> {
    with_file_view(file, offset, len, |view| {
        // SAFETY: advice on the whole view, which is a shared mapping of the file.
        match unsafe { libc::madvise(view as *mut c_void, len as usize, libc::MADV_REMOVE) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    })
}

/// Fills `slices` from `file` at `at`, back to back (continued after a short read), and empties
/// the list.
pub(crate) fn read_all_at(
    file: &std::fs::File,
    slices: &mut Vec<io::IoSliceMut<'_>>,
    mut at: u64,
) -> io::Result<()> {
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        match crate::sys::preadv(file.as_raw_fd(), rest, at) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file ends before its page runs",
                ))
            }
            Ok(read) => {
                io::IoSliceMut::advance_slices(&mut rest, read);
                at += read as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    slices.clear();
    Ok(())
}

impl GuestMemory {
    /// Shows `page` at guest address `addr` in place of the memory there (the vDSO's data page,
    /// shared by every VM of this process): mapped read-only over this memory's own mapping, so
    /// KVM maps it read-only into the guest and a fork's memory accounting (`copied_ranges`)
    /// sees a file page, not a copy. Nothing in the VMM writes guest memory there (it is not
    /// user memory, and the tables `arch::install` writes are elsewhere).
    pub fn show_shared_page(&self, addr: u64, page: &SharedPage) -> io::Result<()> {
        let (prot, flags) = (libc::PROT_READ, libc::MAP_SHARED);
        self.map_over(addr, PAGE_SIZE, prot, flags, page.fd.as_raw_fd(), 0)?;
        self.shown_pages.borrow_mut().push(addr);
        Ok(())
    }
}

/// Shared mappings (MAP_SHARED): a range of guest memory can show a `SharedMemory` instead of
/// the VM's own pages, so that processes of one run (each a VM of its own) see each other's
/// writes there. The host mapping of the range is replaced (KVM follows the host's mappings),
/// and put back to the VM's own backing when the guest unmaps it.
impl GuestMemory {
    /// Shows `memory` from `offset` at `[addr, addr+len)` (page-aligned), replacing whatever
    /// was there, a shared range too.
    pub fn share(
        &self,
        addr: u64,
        len: u64,
        memory: &Arc<SharedMemory>,
        offset: u64,
    ) -> io::Result<()> {
        self.check_pages(addr, len)?;
        let file_end = offset
            .checked_add(len)
            .filter(|end| end.is_multiple_of(PAGE_SIZE))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "bad shared offset"))?;
        self.unshare(addr, len)?;
        // Past the end of its file a mapping would fault on the host: the file covers it.
        memory.grow(file_end)?;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        self.map_over(
            addr,
            len,
            prot,
            libc::MAP_SHARED,
            memory.fd.as_raw_fd(),
            offset,
        )?;
        self.shared.borrow_mut().insert(
            addr,
            SharedRange {
                end: addr + len,
                memory: memory.clone(),
                offset,
            },
        );
        Ok(())
    }

    /// Gives `[addr, addr+len)` (page-aligned) its own pages back wherever it shows shared
    /// memory: a fork's the template's again, memory of its own its memfd's (stale bytes the
    /// memory map zeroes before handing the range out again).
    pub fn unshare(&self, addr: u64, len: u64) -> io::Result<()> {
        self.check_pages(addr, len)?;
        let end = addr + len;
        let overlapping: Vec<(u64, SharedRange)> = self
            .shared
            .borrow()
            .range(..end)
            .filter(|(_, range)| range.end > addr)
            .map(|(&start, range)| (start, range.clone()))
            .collect();
        for (start, range) in overlapping {
            let (from, to) = (start.max(addr), range.end.min(end));
            self.restore_own(from, to)?;
            let mut shared = self.shared.borrow_mut();
            shared.remove(&start);
            if start < from {
                let head = SharedRange {
                    end: from,
                    ..range.clone()
                };
                shared.insert(start, head);
            }
            if to < range.end {
                let tail = SharedRange {
                    offset: range.offset + (to - start),
                    ..range
                };
                shared.insert(to, tail);
            }
        }
        Ok(())
    }

    /// The shared memory at guest address `addr` and the offset there, if it shows any.
    pub fn shared_at(&self, addr: u64) -> Option<(Arc<SharedMemory>, u64)> {
        let shared = self.shared.borrow();
        let (start, range) = shared.range(..=addr).next_back()?;
        (addr < range.end).then(|| (range.memory.clone(), range.offset + (addr - start)))
    }

    /// The parts of `[addr, addr+len)` that show this memory's own pages, not shared memory.
    pub fn own_parts(&self, addr: u64, len: u64) -> Vec<(u64, u64)> {
        let end = addr.saturating_add(len);
        let mut parts = Vec::new();
        let mut at = addr;
        for (&start, range) in self.shared.borrow().range(..end) {
            if range.end <= at {
                continue;
            }
            if start > at {
                parts.push((at, start));
            }
            at = range.end;
        }
        if at < end {
            parts.push((at, end));
        }
        parts
    }

    /// Gives this memory back to the host for good (its process ended, or exec replaced it, and
    /// its vCPU is gone): the mapping is unmapped, its memfd or layer and its shared ranges are
    /// let go, and every access after is out of bounds (its size is zero). The value itself
    /// stays with the `MemoryArena` that holds it, a few bytes, so references to it stay valid.
    pub fn retire(&self) -> io::Result<()> {
        self.shared.borrow_mut().clear();
        self.shown_pages.borrow_mut().clear();
        *self.backing.borrow_mut() = Backing::Retired;
        let size = self.size.replace(0);
        if size == 0 {
            return Ok(());
        }
        // SAFETY: host/size describe this memory's own mapping; with the size now zero no
        // accessor reaches the range again, and its vCPU, the only other user, is gone.
        let unmapped = unsafe { libc::munmap(self.host as *mut c_void, size as usize) };
        if unmapped != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Gives the host back the pages of `[addr, addr+len)` (page-aligned, showing no shared
    /// memory): the range then reads as the template's bytes (a fork) or zeros (memory of its
    /// own). For memory the guest unmapped, which the memory map zeroes before reusing.
    pub fn release_range(&self, addr: u64, len: u64) -> io::Result<()> {
        self.check_pages(addr, len)?;
        // A layer only this memory maps holds pages for it alone: they go too.
        let sole_layer = match &*self.backing.borrow() {
            Backing::Private {
                file,
                template: false,
            } if Arc::strong_count(file) == 1 => Some(file.clone()),
            _ => None,
        };
        let advice = if self.is_own() {
            libc::MADV_REMOVE
        } else {
            libc::MADV_DONTNEED
        };
        // Around the pages shown from elsewhere: removing one would empty it for every VM.
        let mut shown = self.shown_pages.borrow().clone();
        shown.sort_unstable();
        let mut at = addr;
        let end = addr + len;
        let mut spans = Vec::new();
        for page in shown.into_iter().filter(|&p| p >= addr && p < end) {
            spans.push((at, page));
            at = page + PAGE_SIZE;
        }
        spans.push((at, end));
        for &(start, end) in &spans {
            self.advise(start, end, advice)?;
        }
        if let Some(file) = sole_layer {
            remove_from_file(&file, addr, len)?;
        }
        self.map_layer_holes(&spans)
    }

    /// madvise(`advice`) over `[start, end)` of this memory, checked page-aligned ranges.
    fn advise(&self, start: u64, end: u64, advice: i32) -> io::Result<()> {
        if start >= end {
            return Ok(());
        }
        let off = self.check_pages(start, end - start)?;
        // SAFETY: advice on a bounds-checked range of this value's own mapping; it frees pages,
        // and later reads see the template's bytes (a fork) or zeros (a memfd of its own),
        // never freed memory.
        let done = unsafe {
            libc::madvise(
                self.host.add(off) as *mut c_void,
                (end - start) as usize,
                advice,
            )
        };
        if done != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The file whose pages this memory shows where it wrote none, as the host holds it now:
    /// its own memfd, or a layer (which other memories may map too). None over a template's
    /// memfd, which the template holds, and once retired.
    pub fn file_held(&self) -> io::Result<Option<HeldFile>> {
        match &*self.backing.borrow() {
            Backing::Own(file)
            | Backing::Private {
                file,
                template: false,
            } => Ok(Some(HeldFile {
                id: Arc::as_ptr(file) as usize,
                pages: sys::file_pages(file.as_raw_fd())?,
                sole: Arc::strong_count(file) == 1,
            })),
            Backing::Private { template: true, .. } | Backing::Retired => Ok(None),
        }
    }

    /// How many pages the host copied for this memory alone (copy-on-write copies of its
    /// file's pages; shared ranges not counted): 0 for memory of its own.
    pub fn copied_own_pages(&self) -> io::Result<u64> {
        Ok(crate::layout::pages_in(
            &self.copied_own_ranges()?.unwrap_or_default(),
        ))
    }

    /// The ranges of the pages it holds, its file's and its copies: outside them it shows its
    /// template's bytes (`is_template_fork`) or zeros.
    pub fn held_page_ranges(&self) -> io::Result<Vec<(u64, u64)>> {
        let copied = self.copied_own_ranges()?.unwrap_or_default();
        self.held_ranges(&copied)
    }

    /// Whether it is a copy-on-write fork of a template (or of a template fork).
    pub fn is_template_fork(&self) -> bool {
        matches!(
            *self.backing.borrow(),
            Backing::Private { template: true, .. }
        )
    }

    /// Whether any range shows shared memory (a MAP_SHARED mapping).
    pub fn shows_shared_memory(&self) -> bool {
        !self.shared.borrow().is_empty()
    }

    /// Maps this memory's own backing over `[start, end)` again.
    fn restore_own(&self, start: u64, end: u64) -> io::Result<()> {
        let private = libc::MAP_PRIVATE | libc::MAP_NORESERVE;
        let (fd, flags) = match &*self.backing.borrow() {
            Backing::Own(file) => (file.as_raw_fd(), libc::MAP_SHARED),
            Backing::Private { file, .. } => (file.as_raw_fd(), private),
            Backing::Retired => return Err(io::Error::other("a retired memory has no pages")),
        };
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        self.map_over(start, end - start, prot, flags, fd, start)?;
        self.map_layer_holes(&[(start, end)])
    }

    /// Maps `len` bytes of `fd` from `offset` over `[addr, addr+len)` of this memory (page-aligned,
    /// checked), in place of what the range showed.
    fn map_over(
        &self,
        addr: u64,
        len: u64,
        prot: i32,
        flags: i32,
        fd: std::os::fd::RawFd,
        offset: u64,
    ) -> io::Result<()> {
        let off = self.check_pages(addr, len)?;
        // SAFETY: replaces pages inside this value's own mapping (bounds-checked just above) with
        // `fd`'s; the whole mapping, these pages included, is unmapped in Drop.
        let at = unsafe {
            libc::mmap(
                self.host.add(off) as *mut c_void,
                len as usize,
                prot,
                flags | libc::MAP_FIXED,
                fd,
                offset.cast_signed(),
            )
        };
        if at == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// `check` for a page-aligned range.
    fn check_pages(&self, addr: u64, len: u64) -> io::Result<usize> {
        if !addr.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("range {addr:#x}+{len:#x} is not page-aligned"),
            ));
        }
        self.check(addr, len)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    }
}

/// Memory that several processes of a run map at once (MAP_SHARED, anonymous or of a file): a
/// memfd each mapping shows. A file's data lives here once a process maps it shared, so that
/// read(2) and write(2) see the mappings' bytes (the VMM's own view of `reserve` bytes).
pub struct SharedMemory {
    fd: OwnedFd,
    /// The memfd's length; it only grows, so no mapping of it ever reaches past its end.
    size: std::sync::Mutex<u64>,
    /// The VMM's mapping of the memfd's first `reserve` bytes (null for anonymous memory).
    view: *mut u8,
    reserve: u64,
}

// SAFETY: the memfd and the view are owned by this value; the view is written only by the
// run that holds it, on the one host thread that runs its processes.
unsafe impl Send for SharedMemory {}
// SAFETY: as for Send: the length is behind a mutex, and the view's bytes are reached only
// from that one thread.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// Zeroed anonymous shared memory of `size` bytes (a multiple of a page).
    pub fn anonymous(size: u64) -> io::Result<Arc<SharedMemory>> {
        let fd = sys::memfd("sandfork-shared", size)?;
        Ok(Arc::new(SharedMemory {
            fd,
            size: std::sync::Mutex::new(size),
            view: std::ptr::null_mut(),
            reserve: 0,
        }))
    }

    /// A file's data, `data`, that may grow to `reserve` bytes.
    pub fn file(data: &[u8], reserve: u64) -> io::Result<Arc<SharedMemory>> {
        if data.len() as u64 > reserve || reserve == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "shared file data larger than its reserve",
            ));
        }
        let fd = sys::memfd(
            "sandfork-shared-file",
            crate::layout::page_align_up(data.len() as u64),
        )?;
        // SAFETY: a fresh shared mapping of `reserve` bytes of our own memfd at a kernel-chosen
        // address; only its first `size` bytes (inside the file) are ever touched.
        let view = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if view == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let memory = SharedMemory {
            size: std::sync::Mutex::new(crate::layout::page_align_up(data.len() as u64)),
            fd,
            view: view as *mut u8,
            reserve,
        };
        memory.write(0, data)?;
        Ok(Arc::new(memory))
    }

    /// The memfd's length.
    pub fn size(&self) -> u64 {
        *self.size.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the memfd at least `size` bytes long (page-aligned up).
    pub fn grow(&self, size: u64) -> io::Result<()> {
        let mut current = self.size.lock().unwrap_or_else(|e| e.into_inner());
        let size = crate::layout::page_align_up(size);
        if size > *current {
            sys::set_len(self.fd.as_raw_fd(), size)?;
            *current = size;
        }
        Ok(())
    }

    /// The view's first `len` bytes (empty for anonymous memory). `len` must lie inside the
    /// reserve; the memfd grows to cover it.
    pub fn bytes(&self, len: u64) -> io::Result<&[u8]> {
        if self.view.is_null() || len > self.reserve {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "outside the view",
            ));
        }
        self.grow(len)?;
        // SAFETY: the view maps `reserve` bytes of the memfd, which now covers `len` of them.
        Ok(unsafe { std::slice::from_raw_parts(self.view, len as usize) })
    }

    /// Writes `data` at `offset` through the view (the memfd grows to cover it).
    pub fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&end| !self.view.is_null() && end <= self.reserve)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "outside the view"))?;
        self.grow(end)?;
        // SAFETY: offset..end lies inside the view's reserve and the memfd (grown just above).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.view.add(offset as usize), data.len())
        };
        Ok(())
    }

    /// Zeroes `[offset, end)` of the view, clipped to the memfd.
    pub fn zero(&self, offset: u64, end: u64) {
        let end = end.min(self.size()).min(self.reserve);
        if self.view.is_null() || offset >= end {
            return;
        }
        // SAFETY: offset..end lies inside the view and the memfd (clipped just above).
        unsafe {
            std::ptr::write_bytes(self.view.add(offset as usize), 0, (end - offset) as usize)
        };
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        if !self.view.is_null() {
            // SAFETY: unmapping the view mapped in `file`; no borrow of it outlives self.
            unsafe { libc::munmap(self.view as *mut c_void, self.reserve as usize) };
        }
    }
}

/// One page the VMM writes and every VM of this process reads (`GuestMemory::show_shared_page`):
/// a memfd, mapped read-write here once. Its contents are 64-bit words accessed atomically.
pub struct SharedPage {
    fd: OwnedFd,
    host: *mut u8,
}

// SAFETY: the mapping lives as long as the value and is only reached through atomics.
unsafe impl Send for SharedPage {}
// SAFETY: as for Send: shared references only read and write the page through atomics.
unsafe impl Sync for SharedPage {}

impl SharedPage {
    pub fn new(name: &str) -> io::Result<SharedPage> {
        let fd = sys::memfd(name, crate::layout::PAGE_SIZE)?;
        // SAFETY: mapping a fresh memfd of exactly one page at a kernel-chosen address.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                crate::layout::PAGE_SIZE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if host == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedPage {
            fd,
            host: host as *mut u8,
        })
    }

    /// The page as 512 atomic words.
    pub fn words(&self) -> &[std::sync::atomic::AtomicU64; 512] {
        // SAFETY: the mapping is page-aligned, 4096 bytes long and lives as long as `self`;
        // every access to it (here and in the guests) is a whole aligned word.
        unsafe { &*(self.host as *const [std::sync::atomic::AtomicU64; 512]) }
    }
}

impl Drop for SharedPage {
    fn drop(&mut self) {
        // SAFETY: unmapping the page mapped in `new`; no reference from `words` outlives self.
        unsafe { libc::munmap(self.host as *mut c_void, crate::layout::PAGE_SIZE as usize) };
    }
}

impl Drop for GuestMemory {
    fn drop(&mut self) {
        let size = self.size.get();
        if size != 0 {
            // SAFETY: host/size describe the mapping created in new() (none after `retire`);
            // nothing borrows it past drop.
            unsafe { libc::munmap(self.host as *mut c_void, size as usize) };
        }
    }
}

/// Guest memories made during a run (the processes a guest forks or execs; in a session, during
/// its VM's life), kept until the arena goes: each is handed out by reference to the vCPU built
/// on it, and none moves or goes while the arena lives. One whose process ended is retired
/// (`GuestMemory::retire`): unmapped, only its few bytes stay here.
#[derive(Default)]
pub struct MemoryArena {
    // Boxed: the references handed out must not move when the list grows.
    #[allow(clippy::vec_box)]
    kept: RefCell<Vec<Box<GuestMemory>>>,
}

impl MemoryArena {
    pub fn new() -> MemoryArena {
        MemoryArena::default()
    }

    /// Keeps `mem` for as long as the arena lives.
    pub fn keep(&self, mem: GuestMemory) -> &GuestMemory {
        let boxed = Box::new(mem);
        let at: *const GuestMemory = &*boxed;
        self.kept.borrow_mut().push(boxed);
        // SAFETY: the box's allocation never moves and is dropped only with the arena, which
        // this reference cannot outlive; nothing else takes it out of the list.
        unsafe { &*at }
    }
}

/// A template's guest memory: a memfd filled once (when the template is built or loaded) and
/// then only read. Forks map it privately (`GuestMemory::fork_of`); since a private mapping
/// still shows later changes to pages it has not copied yet, this type offers no way to write.
/// MADV_POPULATE_WRITE of `[host, host+len)`, a whole-page range of a mapping of ours checked
/// by the caller. Kernels before 5.14 answer EINVAL, and the writes then fault the pages in one
/// by one.
fn populate(host: usize, len: usize) -> io::Result<()> {
    const MADV_POPULATE_WRITE: i32 = 23;
    if len == 0 {
        return Ok(());
    }
    // SAFETY: advice on a bounds-checked, page-aligned (the callers pass whole pages) range of
    // our own mapping, which outlives the call; it changes no contents.
    let done = unsafe { libc::madvise(host as *mut c_void, len, MADV_POPULATE_WRITE) };
    match done {
        0 => Ok(()),
        _ if io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

pub struct TemplateMemory {
    mem: GuestMemory,
    /// `mem`'s memfd, shared by reference with every fork (`GuestMemory::source`).
    fd: Arc<OwnedFd>,
    /// `mem.data_extents()`, sorted: where the template has bytes (a reset copies them back).
    data: Vec<(u64, u64)>,
}

// SAFETY: after `seal` nothing writes through the mapping (no method of TemplateMemory
// writes), so any number of threads may read it and fork from it at once.
unsafe impl Sync for TemplateMemory {}

impl TemplateMemory {
    /// Seals filled guest memory as a template's (it must be memfd-backed, not a fork).
    pub fn seal(mem: GuestMemory) -> io::Result<TemplateMemory> {
        let Some(fd) = mem.fd() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a copy-on-write fork cannot be a template's memory",
            ));
        };
        let data = mem.data_extents()?;
        Ok(TemplateMemory { mem, fd, data })
    }

    pub fn size(&self) -> u64 {
        self.mem.size()
    }

    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfBounds> {
        self.mem.read(addr, buf)
    }

    /// The template's bytes at `[addr, addr+len)`, borrowed (nothing writes them once sealed).
    pub fn range_bytes(&self, addr: u64, len: u64) -> Result<&[u8], OutOfBounds> {
        self.mem.range_bytes(addr, len)
    }

    /// See `GuestMemory::data_extents` (taken once, when the template was sealed).
    pub fn data_extents(&self) -> &[(u64, u64)] {
        &self.data
    }

    /// A full, independent copy in a fresh memfd (only the pages that hold data are copied).
    /// For backends that cannot run on a private mapping (the ptrace test CPU shares its
    /// memory with a child process); a KVM fork uses `GuestMemory::fork_of`.
    pub fn copy(&self) -> io::Result<GuestMemory> {
        let copy = GuestMemory::new(self.mem.size())?;
        let mut chunk = vec![0u8; 1 << 20];
        for &(start, end) in self.data_extents() {
            let mut at = start;
            while at < end {
                let n = (end - at).min(chunk.len() as u64) as usize;
                self.mem
                    .read(at, &mut chunk[..n])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                copy.write(at, &chunk[..n])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                at += n as u64;
            }
        }
        Ok(copy)
    }
}

/// A read-only private mapping of a whole host file (the file image's data file).
///
/// The image builder never modifies a data file in place (it writes a new file and renames it
/// over the old one), so the mapped bytes stay valid and unchanged for the mapping's lifetime.
pub struct MappedFile {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value; shared reads from threads are fine.
unsafe impl Send for MappedFile {}
// SAFETY: as above: nothing ever writes through the mapping.
unsafe impl Sync for MappedFile {}

impl MappedFile {
    pub fn open(path: &std::path::Path) -> io::Result<MappedFile> {
        let file = std::fs::File::open(path)?;
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large to map"))?;
        if len == 0 {
            // mmap refuses zero-length mappings; an empty file is an empty slice.
            return Ok(MappedFile {
                ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                len: 0,
            });
        }
        // SAFETY: a fresh read-only private mapping of `len` bytes of an open file at a
        // kernel-chosen address; the fd may be closed afterwards, the mapping stays.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(MappedFile {
            ptr: ptr as *const u8,
            len,
        })
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr/len describe a live read-only mapping (or a dangling pointer with len 0,
        // which from_raw_parts allows) that lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: ptr/len describe the mapping created in open(); no borrow outlives self.
            unsafe { libc::munmap(self.ptr as *mut c_void, self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_read_from_a_file_back_to_back_and_bad_runs_refused() {
        let path = std::env::temp_dir().join(format!("sandfork-runs-{}", std::process::id()));
        let contents: Vec<u8> = (0..3 * 4096u32).map(|i| (i / 4096 + 1) as u8).collect();
        std::fs::write(&path, &contents).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let mem = GuestMemory::new(64 * 1024).unwrap();
        mem.read_runs_from(&file, &[(0x2000, 4096, 4096), (0x8000, 4096, 8192)])
            .unwrap();
        assert_eq!(mem.read_vec(0x2000, 4096).unwrap(), vec![2u8; 4096]);
        assert_eq!(mem.read_vec(0x8000, 4096).unwrap(), vec![3u8; 4096]);
        assert_eq!(
            mem.read_vec(0x3000, 4096).unwrap(),
            vec![0u8; 4096],
            "nothing between the runs"
        );
        mem.read_runs_from(&file, &[(0x4000, 4096, 8192), (0x9000, 4096, 0)])
            .unwrap();
        assert_eq!(
            (
                mem.read_vec(0x4000, 4096).unwrap(),
                mem.read_vec(0x9000, 4096).unwrap()
            ),
            (vec![3u8; 4096], vec![1u8; 4096]),
            "pieces from anywhere in the file"
        );
        assert_eq!(
            mem.read_runs_from(&file, &[(0x2000, 8192, 0), (0x3000, 4096, 8192)])
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput,
            "overlapping"
        );
        assert_eq!(
            mem.read_runs_from(&file, &[(60 * 1024, 8192, 0)])
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput,
            "outside memory"
        );
        assert_eq!(
            mem.read_runs_from(&file, &[(0, 8192, 8192)])
                .unwrap_err()
                .kind(),
            io::ErrorKind::UnexpectedEof,
            "past the file's end"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn accessors_reject_ranges_outside_memory() {
        let mem = GuestMemory::new(64 * 1024).unwrap();
        mem.write_u64(0x1000, 0xdead_beef).unwrap();
        assert_eq!(mem.read_u64(0x1000).unwrap(), 0xdead_beef);
        assert!(mem.write_u64(64 * 1024 - 4, 1).is_err());
        assert!(mem.read_u64(u64::MAX - 3).is_err());
        assert!(mem.fill(0, 64 * 1024 + 1, 0).is_err());
        let mut big = vec![0u8; 16];
        assert_eq!(
            mem.read(64 * 1024 - 8, &mut big),
            Err(OutOfBounds {
                addr: 64 * 1024 - 8,
                len: 16
            })
        );
    }

    #[test]
    fn read_cstr_stops_at_nul_and_at_memory_end() {
        let mem = GuestMemory::new(4096).unwrap();
        mem.write(100, b"hello\0world").unwrap();
        assert_eq!(mem.read_cstr(100, 64).unwrap(), b"hello");
        assert!(mem.read_cstr(100, 3).is_err());
        mem.fill(4090, 6, b'x').unwrap();
        assert!(mem.read_cstr(4090, 4096).is_err());
    }

    #[test]
    fn tracked_writes_are_the_pages_written_since_the_last_take() {
        let mut mem = GuestMemory::new(64 * 1024).unwrap();
        assert!(mem.take_written().is_none(), "not tracked");
        mem.track_writes();
        mem.write_u64(0x1ff8, 1).unwrap();
        mem.write(0x3fff, &[1, 2]).unwrap();
        mem.fill(0x8000, 0x2000, 7).unwrap();
        let _ = mem.read_vec(0xc000, 0x1000).unwrap();
        assert_eq!(
            page_ranges(&mem.take_written().unwrap()),
            vec![(0x1000, 0x2000), (0x3000, 0x5000), (0x8000, 0xa000)]
        );
        assert_eq!(mem.take_written().unwrap().count_ones(..), 0, "taken");
        // Not page-aligned: without the empty-length guard its page would be marked.
        mem.fill(0x4001, 0, 1).unwrap();
        assert_eq!(
            mem.take_written().unwrap().count_ones(..),
            0,
            "an empty write"
        );
    }

    #[test]
    fn rejects_unaligned_size() {
        assert!(GuestMemory::new(1000).is_err());
    }

    #[test]
    fn forks_are_copy_on_write_and_private() {
        let mem = GuestMemory::new(1 << 20).unwrap();
        mem.write_u64(0x2000, 7).unwrap();
        let template = TemplateMemory::seal(mem).unwrap();
        let (a, b) = (
            GuestMemory::fork_of(&template).unwrap(),
            GuestMemory::fork_of(&template).unwrap(),
        );
        assert_eq!(
            (a.read_u64(0x2000).unwrap(), b.read_u64(0x2000).unwrap()),
            (7, 7)
        );
        a.write_u64(0x2000, 8).unwrap();
        a.write_u64(0x5000, 9).unwrap();
        assert_eq!(a.read_u64(0x2000).unwrap(), 8);
        assert_eq!(
            (b.read_u64(0x2000).unwrap(), b.read_u64(0x5000).unwrap()),
            (7, 0),
            "another fork"
        );
        let mut word = [0u8; 8];
        template.read(0x2000, &mut word).unwrap();
        assert_eq!(u64::from_le_bytes(word), 7, "the template");
        assert!(a.fd().is_none() && a.data_extents().unwrap().is_empty());
        assert_eq!(
            a.copied_pages().unwrap(),
            Some(2),
            "the fork wrote two pages"
        );
        let _ = b.read_u64(0x9000).unwrap();
        assert_eq!(b.copied_pages().unwrap(), Some(0), "reading copies nothing");
        assert!(TemplateMemory::seal(a).is_err(), "a fork is not a template");
        let copy = template.copy().unwrap();
        copy.write_u64(0x2000, 10).unwrap();
        assert_eq!(
            (copy.read_u64(0x2000).unwrap(), b.read_u64(0x2000).unwrap()),
            (10, 7)
        );
    }

    #[test]
    fn shared_ranges_are_seen_by_duplicates_and_let_go_on_unshare() {
        let mem = GuestMemory::new(1 << 20).unwrap();
        mem.write_u64(0x2000, 7).unwrap();
        let template = TemplateMemory::seal(mem).unwrap();
        let parent = GuestMemory::fork_of(&template).unwrap();
        let shared = SharedMemory::anonymous(0x3000).unwrap();
        parent.share(0x1000, 0x3000, &shared, 0).unwrap();
        assert_eq!(
            parent.read_u64(0x2000).unwrap(),
            0,
            "a fresh shared range reads zeros"
        );
        let child = parent.duplicate(|| u64::MAX).unwrap();
        child.write_u64(0x2000, 42).unwrap();
        assert_eq!(
            parent.read_u64(0x2000).unwrap(),
            42,
            "the child's write is the parent's"
        );
        assert!(matches!(child.shared_at(0x2008), Some((_, 0x1008))));
        assert_eq!(
            child.own_parts(0, 0x5000),
            vec![(0, 0x1000), (0x4000, 0x5000)]
        );
        // Unsharing the middle page splits the range; the page shows the template again.
        child.unshare(0x2000, 0x1000).unwrap();
        assert_eq!(child.read_u64(0x2000).unwrap(), 7);
        assert!(matches!(child.shared_at(0x3000), Some((_, 0x2000))));
        assert!(child.shared_at(0x2000).is_none());
        assert!(parent
            .copied_ranges()
            .unwrap()
            .unwrap()
            .contains(&(0x1000, 0x4000)));
        assert!(
            parent.share(0x1001, 0x1000, &shared, 0).is_err(),
            "unaligned"
        );
        assert!(
            parent.share(0xff000, 0x2000, &shared, 0).is_err(),
            "past the end"
        );
    }

    #[test]
    fn released_pages_go_back_to_the_host() {
        let template = TemplateMemory::seal(GuestMemory::new(1 << 20).unwrap()).unwrap();
        let fork = GuestMemory::fork_of(&template).unwrap();
        fork.fill(0x10000, 0x8000, 1).unwrap();
        assert_eq!(fork.copied_own_pages().unwrap(), 8);
        assert_eq!(
            fork.file_held().unwrap(),
            None,
            "the template holds its memfd"
        );
        let too_little = fork.duplicate(|| 0x7000).err().map(|e| e.kind());
        assert_eq!(
            too_little,
            Some(io::ErrorKind::OutOfMemory),
            "a copy past its room"
        );
        assert_eq!(
            fork.duplicate(|| 0x8000)
                .unwrap()
                .read_u64(0x10000)
                .unwrap(),
            0x0101010101010101
        );
        fork.release_range(0x10000, 0x4000).unwrap();
        assert_eq!(fork.copied_own_pages().unwrap(), 4);
        assert_eq!(
            fork.read_u64(0x10000).unwrap(),
            0,
            "the template's bytes again"
        );
        fork.retire().unwrap();
        assert_eq!(fork.copied_own_pages().unwrap(), 0);
        assert!(
            fork.read_u64(0x10000).is_err(),
            "out of bounds once retired"
        );
        let own = GuestMemory::new(1 << 20).unwrap();
        own.fill(0, 0x3000, 1).unwrap();
        let held = own.file_held().unwrap().unwrap();
        assert_eq!((held.pages, held.sole), (3, true));
        assert_eq!(
            own.copied_own_pages().unwrap(),
            0,
            "its writes land in its memfd"
        );
        own.retire().unwrap();
        assert_eq!((own.size(), own.file_held().unwrap()), (0, None));
        assert!(own.read_u64(0).is_err(), "out of bounds once retired");
        assert!(own.fd().is_none(), "a retired memory holds no memfd");
        own.retire().unwrap();
    }

    #[test]
    fn pages_first_touched_in_a_layers_holes_are_held_once() {
        let parent = GuestMemory::new(1 << 20).unwrap();
        parent.fill(0x10000, 0x4000, 1).unwrap();
        let child = parent.duplicate(|| 1 << 20).unwrap();
        let layer = |m: &GuestMemory| m.file_held().unwrap().map(|l| l.pages);
        child.fill(0x40000, 0x40000, 2).unwrap();
        parent.fill(0xc0000, 0x10000, 3).unwrap();
        assert_eq!(
            layer(&parent),
            Some(4),
            "the layer holds what it held at the fork"
        );
        assert_eq!(
            (
                child.copied_own_pages().unwrap(),
                parent.copied_own_pages().unwrap()
            ),
            (64, 16)
        );
        // Given back and touched again, a page is still held once.
        child.release_range(0x40000, 0x40000).unwrap();
        child.fill(0x40000, 0x1000, 4).unwrap();
        assert_eq!(
            (layer(&child), child.copied_own_pages().unwrap()),
            (Some(4), 1)
        );
        assert_eq!(
            (
                parent.read_u64(0x40000).unwrap(),
                child.read_u64(0xc0000).unwrap(),
                child.read_u64(0x41000).unwrap()
            ),
            (0, 0, 0),
            "neither sees the other's pages; a released page reads as zeros"
        );
    }

    #[test]
    fn a_fork_of_memory_of_its_own_shares_a_frozen_layer_and_neither_sees_the_others_writes() {
        let parent = GuestMemory::new(1 << 20).unwrap();
        parent.fill(0x10000, 0x4000, 1).unwrap();
        let shared = SharedMemory::anonymous(0x1000).unwrap();
        parent.share(0x20000, 0x1000, &shared, 0).unwrap();
        let child = parent.duplicate(|| 1 << 20).unwrap();
        assert!(
            parent.fd().is_none() && child.fd().is_none(),
            "both over the layer"
        );
        assert_eq!(
            (
                parent.copied_pages().unwrap(),
                child.copied_pages().unwrap()
            ),
            (Some(1), Some(1)),
            "nothing copied: only the shared page counts"
        );
        assert_eq!(child.read_u64(0x10000).unwrap(), 0x0101010101010101);
        parent.write_u64(0x10000, 2).unwrap();
        child.write_u64(0x11000, 3).unwrap();
        assert_eq!(
            (
                child.read_u64(0x10000).unwrap(),
                parent.read_u64(0x11000).unwrap()
            ),
            (0x0101010101010101, 0x0101010101010101),
            "neither sees the other's later write"
        );
        child.write_u64(0x20000, 4).unwrap();
        assert_eq!(
            parent.read_u64(0x20000).unwrap(),
            4,
            "MAP_SHARED stays shared"
        );
        // Both map the layer; each holds only the pages it copied of its own.
        let (layer, of_child) = (parent.file_held().unwrap(), child.file_held().unwrap());
        assert_eq!(layer, of_child, "one file");
        assert_eq!(layer.map(|l| (l.pages, l.sole)), Some((4, false)));
        assert_eq!(
            (
                parent.copied_own_pages().unwrap(),
                child.copied_own_pages().unwrap()
            ),
            (1, 1)
        );
        // While the child maps the layer, the parent's next fork copies what it wrote.
        let second = parent.duplicate(|| 1 << 20).unwrap();
        assert_eq!(second.read_u64(0x10000).unwrap(), 2);
        parent.write_u64(0x10000, 5).unwrap();
        assert_eq!(
            second.read_u64(0x10000).unwrap(),
            2,
            "a copy is private too"
        );
        // Once no other memory maps it, the layer takes the parent's writes at its next fork.
        child.retire().unwrap();
        second.retire().unwrap();
        assert_eq!(child.file_held().unwrap(), None);
        assert!(
            parent.file_held().unwrap().is_some_and(|l| l.sole),
            "the parent's alone"
        );
        assert!(child.read_u64(0x10000).is_err(), "retired: unmapped");
        let third = parent.duplicate(|| 1 << 20).unwrap();
        assert_eq!(third.read_u64(0x10000).unwrap(), 5);
        assert_eq!(
            parent.copied_pages().unwrap(),
            Some(1),
            "its writes went into the layer (the shared page counts)"
        );
        parent.write_u64(0x12000, 6).unwrap();
        third.write_u64(0x13000, 7).unwrap();
        assert_eq!(
            (
                third.read_u64(0x12000).unwrap(),
                parent.read_u64(0x13000).unwrap()
            ),
            (0x0101010101010101, 0x0101010101010101)
        );
        // A page a layer's only user gives back leaves the layer too.
        third.retire().unwrap();
        parent.release_range(0x10000, 0x4000).unwrap();
        assert_eq!(parent.file_held().unwrap().map(|l| l.pages), Some(0));
        assert_eq!(parent.copied_own_pages().unwrap(), 0);
        assert_eq!(parent.read_u64(0x12000).unwrap(), 0);
        // A layer is not a template.
        assert!(TemplateMemory::seal(parent).is_err());
    }

    #[test]
    fn a_template_is_made_from_memory_that_forked() {
        let mem = GuestMemory::new(1 << 20).unwrap();
        mem.write_u64(0x3000, 8).unwrap();
        let child = mem.duplicate(|| 1 << 20).unwrap();
        mem.write_u64(0x5000, 9).unwrap();
        drop(child);
        let extents = mem.data_extents().unwrap();
        let covered = |addr: u64| extents.iter().any(|&(s, e)| s <= addr && addr < e);
        assert!(covered(0x3000) && covered(0x5000), "{extents:x?}");
        assert!(!covered(0x8000), "{extents:x?}");
    }

    /// More separate runs of copied pages than one PAGEMAP_SCAN call has room for: the scan
    /// goes on from where it stopped, and agrees with the page-by-page pagemap read (which
    /// kernels without PAGEMAP_SCAN use, for counting and for resets alike).
    #[test]
    fn copied_pages_are_counted_across_many_runs() {
        let template = TemplateMemory::seal(GuestMemory::new(16 << 20).unwrap()).unwrap();
        let fork = GuestMemory::fork_of(&template).unwrap();
        for page in 0..600u64 {
            let addr = page * 2 * 4096;
            fork.write_u64(addr, page + 1).unwrap();
            let _ = fork.read_u64(addr + 4096).unwrap();
        }
        let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
        let expected: Vec<(u64, u64)> = (0..600u64)
            .map(|page| (page * 2 * 4096, page * 2 * 4096 + 4096))
            .collect();
        assert_eq!(fork.read_copied_ranges(&pagemap).unwrap(), expected);
        match fork.scan_copied_ranges(&pagemap) {
            Ok(ranges) => assert_eq!(ranges, expected),
            // A host kernel before 6.7: copied_ranges falls back to the read.
            Err(e) => assert_eq!(e.raw_os_error(), Some(25), "{e}"),
        }
        assert_eq!(fork.copied_ranges().unwrap(), Some(expected));
        assert_eq!(fork.copied_pages().unwrap(), Some(600));
    }

    #[test]
    fn data_extents_cover_written_pages_only() {
        let mem = GuestMemory::new(1 << 20).unwrap();
        assert!(mem.data_extents().unwrap().is_empty());
        mem.write(0x3001, b"x").unwrap();
        mem.write(0x8000, &[1u8; 0x2000]).unwrap();
        let extents = mem.data_extents().unwrap();
        let covered = |addr: u64| extents.iter().any(|&(s, e)| s <= addr && addr < e);
        assert!(
            covered(0x3001) && covered(0x8000) && covered(0x9fff),
            "{extents:x?}"
        );
        assert!(!covered(0x50000), "{extents:x?}");
    }

    #[test]
    fn mapped_file_shows_file_bytes() {
        let path = std::env::temp_dir().join(format!("sandfork-mapped-{}", std::process::id()));
        std::fs::write(&path, b"mapped bytes").unwrap();
        assert_eq!(MappedFile::open(&path).unwrap().bytes(), b"mapped bytes");
        std::fs::write(&path, b"").unwrap();
        assert!(MappedFile::open(&path).unwrap().bytes().is_empty());
        std::fs::remove_file(&path).unwrap();
    }
}
