//! The guest's address-space records: the program break and the mmap regions.
//!
//! Guest page tables are built once and map all guest memory read-write-execute (DESIGN.md: a
//! present entry changed from the host is not seen by the guest), so this map is only the VMM's
//! record of what the program was given. It decides where mmap places things and what brk may
//! grow into, and it counts the memory in use. Protection changes are recorded, not enforced.
//!
//! Guest memory is reused (munmap does not return pages to the host, and a fork starts from a
//! template's memory), so every range handed out again is zeroed first. Only ranges that were
//! handed out before can hold stale bytes: they are tracked in `dirty`, so a first allocation of
//! never-used memory touches no page (in a fork, writing zeros would cost a copy-on-write each).

use std::collections::BTreeMap;

use super::AddressSpace;
use crate::codec::{DecodeError, Decoder, Encoder};
use crate::fs::Node;
use crate::layout::{page_align_up, PAGE_SIZE, USER_BASE};
use crate::memory::{GuestMemory, OutOfBounds};

/// Linux's default vm.max_map_count: a bound on host memory spent on region records.
const MAX_REGIONS: usize = 65_530;

/// Why a memory-map request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapError {
    /// Malformed request (unaligned address, zero or overflowing length...): EINVAL.
    Invalid,
    /// The range is not (entirely) mapped, or the region count limit is reached: ENOMEM.
    NotMapped,
    /// MAP_FIXED_NOREPLACE over an existing mapping: EEXIST.
    Exists,
    /// No room for the allocation inside guest memory: the run is out of memory.
    NoRoom,
}

impl From<OutOfBounds> for MapError {
    fn from(_: OutOfBounds) -> MapError {
        // Ranges are checked against guest memory before any access; this is a backstop.
        MapError::NoRoom
    }
}

/// Where a new mapping may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Anywhere; the address is a hint used when that range is free.
    Hint(u64),
    /// Exactly here, replacing what is mapped there (MAP_FIXED).
    Fixed(u64),
    /// Exactly here, failing if anything is mapped there (MAP_FIXED_NOREPLACE).
    FixedNoReplace(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Region {
    end: u64,
    prot: u32,
    /// The read-only file bytes a private file mapping copied here, while no protection let
    /// the program write them and nothing else replaced them.
    view: Option<FileView>,
}

/// A private mapping of a file that never changes (the image's), by where its offset 0 would
/// sit: a mapping of the same file at the same `start - offset` shows the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileView {
    node: Node,
    origin: u64,
}

/// mprotect's write bit: a region the program may write no longer holds its view.
const PROT_WRITE: u32 = 2;

impl Region {
    fn with(self, end: u64) -> Region {
        Region { end, ..self }
    }
}

/// A set of disjoint half-open ranges, merged when they touch.
#[derive(Debug, Clone, Default)]
struct RangeSet {
    ranges: BTreeMap<u64, u64>,
}

impl RangeSet {
    fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        // Absorb every range that overlaps or touches [start, end).
        let touching: Vec<(u64, u64)> = self
            .ranges
            .range(..=end)
            .rev()
            .take_while(|&(_, &e)| e >= start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            self.ranges.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.ranges.insert(start, end);
    }

    fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&s, &e)| (s, e))
    }

    /// The parts of [start, end) that lie inside the set.
    fn intersection(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut parts: Vec<(u64, u64)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|&(_, &e)| e > start)
            .map(|(&s, &e)| (s.max(start), e.min(end)))
            .collect();
        parts.reverse();
        parts
    }
}

#[derive(Debug, Clone)]
pub struct MemoryMap {
    space: AddressSpace,
    mem_size: u64,
    /// The program break as the guest set it (not page aligned).
    brk: u64,
    regions: BTreeMap<u64, Region>,
    mapped_bytes: u64,
    peak_bytes: u64,
    /// Everything ever handed to the program (it never shrinks): where stale bytes may be, and
    /// all the guest may legitimately touch.
    dirty: RangeSet,
    /// Bumped whenever `dirty` grows (the vCPU then makes the new part accessible).
    dirty_generation: u64,
}

impl MemoryMap {
    /// Everything outside [brk_start, mmap_high) was written by the loader (or is the system
    /// area or stack) and counts as dirty; the pool in between is untouched, zeroed memory.
    pub fn new(space: AddressSpace, mem_size: u64) -> MemoryMap {
        let mut dirty = RangeSet::default();
        dirty.insert(0, space.brk_start.min(mem_size));
        dirty.insert(space.mmap_high.min(mem_size), mem_size);
        MemoryMap {
            space,
            mem_size,
            brk: space.brk_start,
            regions: BTreeMap::new(),
            mapped_bytes: 0,
            peak_bytes: 0,
            dirty,
            dirty_generation: 0,
        }
    }

    /// Every range of guest memory the program has ever been handed (the loaded program, the
    /// stack, the heap and mappings as they grew), sorted: what the vCPU must let it reach
    /// (`GuestCpu::map_memory`).
    pub fn handed_out(&self) -> Vec<(u64, u64)> {
        self.dirty.iter().collect()
    }

    /// Changes whenever `handed_out` grows.
    pub fn handed_out_generation(&self) -> u64 {
        self.dirty_generation
    }

    /// Bytes given to the program: mapped regions plus the heap above brk_start.
    pub fn in_use(&self) -> u64 {
        self.mapped_bytes + (self.brk_end() - self.space.brk_start)
    }

    /// The heap: [brk_start, the break rounded up to a page).
    pub fn heap(&self) -> (u64, u64) {
        (self.space.brk_start, self.brk_end())
    }

    /// The mapped regions as (start, end, prot), ascending, neighbours of one protection
    /// merged (as Linux merges adjacent anonymous mappings).
    pub fn regions(&self) -> Vec<(u64, u64, u32)> {
        let mut out: Vec<(u64, u64, u32)> = Vec::new();
        for (&start, region) in &self.regions {
            match out.last_mut() {
                Some(last) if last.1 == start && last.2 == region.prot => last.1 = region.end,
                _ => out.push((start, region.end, region.prot)),
            }
        }
        out
    }

    /// The largest `in_use` seen.
    pub fn peak(&self) -> u64 {
        self.peak_bytes
    }

    fn brk_end(&self) -> u64 {
        page_align_up(self.brk)
    }

    fn note_usage(&mut self) {
        self.peak_bytes = self.peak_bytes.max(self.in_use());
    }

    /// Zeroes the parts of [start, end) that may hold stale bytes, then marks it handed out.
    fn zero_for_reuse(
        &mut self,
        mem: &GuestMemory,
        start: u64,
        end: u64,
    ) -> Result<(), OutOfBounds> {
        let already: Vec<(u64, u64)> = self.dirty.intersection(start, end);
        for &(s, e) in &already {
            mem.fill(s, e - s, 0)?;
        }
        if already.iter().map(|(s, e)| e - s).sum::<u64>() < end - start {
            self.dirty.insert(start, end);
            self.dirty_generation += 1;
        }
        Ok(())
    }

    fn overlaps_region(&self, start: u64, end: u64) -> bool {
        self.regions
            .range(..end)
            .next_back()
            .is_some_and(|(_, r)| r.end > start)
    }

    fn overlaps_heap(&self, start: u64, end: u64) -> bool {
        start < self.brk_end() && end > self.space.brk_start
    }

    /// brk(2): moves the break to `requested` when it fits, and returns the break in effect.
    /// Like Linux, a break that cannot grow (it would run into a mapping or past the mmap pool)
    /// is reported by returning the old break; malloc then falls back to mmap, which stops the
    /// run as out of memory if the memory is really exhausted.
    pub fn set_brk(&mut self, mem: &GuestMemory, requested: u64) -> u64 {
        if requested < self.space.brk_start {
            return self.brk;
        }
        let old_end = self.brk_end();
        let new_end = page_align_up(requested.min(u64::MAX - PAGE_SIZE));
        if new_end > old_end {
            if new_end > self.space.mmap_high.min(self.mem_size)
                || self.overlaps_region(old_end, new_end)
            {
                return self.brk;
            }
            if self.zero_for_reuse(mem, old_end, new_end).is_err() {
                return self.brk;
            }
        }
        self.brk = requested;
        self.note_usage();
        self.brk
    }

    /// Maps `len` bytes (rounded up to pages) and returns the address. The range is zeroed.
    pub fn map(
        &mut self,
        mem: &GuestMemory,
        placement: Placement,
        len: u64,
        prot: u32,
    ) -> Result<u64, MapError> {
        self.map_view(mem, placement, len, prot, None)
            .map(|(start, _)| start)
    }

    /// Maps `len` bytes (rounded up to pages), for a private copy of `file` (an unchanging
    /// file, from an offset) when given, and returns the address and whether the range already
    /// shows those bytes: a fixed map over regions that hold the same file at the same place
    /// (ld.so maps a library whole, then each segment over it), which is then left as it is.
    /// Otherwise the range is zeroed for the caller to fill.
    pub fn map_view(
        &mut self,
        mem: &GuestMemory,
        placement: Placement,
        len: u64,
        prot: u32,
        file: Option<(Node, u64)>,
    ) -> Result<(u64, bool), MapError> {
        if len == 0 || len > self.mem_size {
            return Err(if len == 0 {
                MapError::Invalid
            } else {
                MapError::NoRoom
            });
        }
        let len = page_align_up(len);
        let mut shown = false;
        let start = match placement {
            Placement::Hint(hint) => self.place(hint, len)?,
            Placement::Fixed(addr) | Placement::FixedNoReplace(addr) => {
                let end = self.check_fixed(addr, len)?;
                if self.overlaps_region(addr, end) || self.overlaps_heap(addr, end) {
                    if matches!(placement, Placement::FixedNoReplace(_)) {
                        return Err(MapError::Exists);
                    }
                    shown = file.is_some_and(|(node, offset)| {
                        let origin = addr.wrapping_sub(offset);
                        self.shows(addr, end, FileView { node, origin })
                    });
                    self.carve(addr, end);
                }
                addr
            }
        };
        if self.regions.len() >= MAX_REGIONS {
            return Err(MapError::NotMapped);
        }
        if !shown {
            self.zero_for_reuse(mem, start, start + len)?;
        }
        self.regions.insert(
            start,
            Region {
                end: start + len,
                prot,
                view: file
                    .filter(|_| prot & PROT_WRITE == 0)
                    .map(|(node, offset)| FileView {
                        node,
                        origin: start.wrapping_sub(offset),
                    }),
            },
        );
        self.mapped_bytes += len;
        self.note_usage();
        Ok((start, shown))
    }

    /// Whether a region holding a view overlaps [start, end).
    fn shows_any_view(&self, start: u64, end: u64) -> bool {
        self.regions
            .range(..end)
            .rev()
            .take_while(|(_, r)| r.end > start)
            .any(|(_, r)| r.view.is_some())
    }

    /// Whether regions holding `view` cover every byte of [start, end).
    fn shows(&self, start: u64, end: u64, view: FileView) -> bool {
        let mut cur = start;
        for (&s, r) in self.regions.range(..end) {
            if r.end <= cur {
                continue;
            }
            if s > cur || r.view != Some(view) {
                return false;
            }
            cur = r.end;
        }
        cur >= end
    }

    /// A fixed range must be page aligned and inside user memory.
    fn check_fixed(&self, addr: u64, len: u64) -> Result<u64, MapError> {
        if !addr.is_multiple_of(PAGE_SIZE) {
            return Err(MapError::Invalid);
        }
        match addr.checked_add(len) {
            Some(end) if addr >= USER_BASE && end <= self.mem_size => Ok(end),
            _ => Err(MapError::NotMapped),
        }
    }

    /// Picks an address for a non-fixed mapping: the hint when that range is free and inside
    /// the mmap pool, otherwise the highest free gap (top-down, like Linux).
    fn place(&self, hint: u64, len: u64) -> Result<u64, MapError> {
        let floor = self.space.mmap_low.max(self.brk_end());
        let ceiling = self.space.mmap_high.min(self.mem_size);
        if hint.is_multiple_of(PAGE_SIZE) && hint >= floor {
            if let Some(end) = hint.checked_add(len) {
                if end <= ceiling && !self.overlaps_region(hint, end) {
                    return Ok(hint);
                }
            }
        }
        let mut top = ceiling;
        for (&start, region) in self.regions.range(..ceiling).rev() {
            if region.end < top {
                let low = region.end.max(floor);
                if top.checked_sub(len).is_some_and(|s| s >= low) {
                    return Ok(top - len);
                }
            }
            top = top.min(start);
            if top <= floor {
                return Err(MapError::NoRoom);
            }
        }
        match top.checked_sub(len) {
            Some(s) if s >= floor => Ok(s),
            _ => Err(MapError::NoRoom),
        }
    }

    /// Removes [start, end) from the region records, splitting regions that straddle it.
    fn carve(&mut self, start: u64, end: u64) -> Vec<(u64, Region)> {
        let hit: Vec<(u64, Region)> = self
            .regions
            .range(..end)
            .rev()
            .take_while(|(_, r)| r.end > start)
            .map(|(&s, &r)| (s, r))
            .collect();
        for &(s, r) in &hit {
            self.regions.remove(&s);
            if s < start {
                self.regions.insert(s, r.with(start));
            }
            if r.end > end {
                self.regions.insert(end, r);
            }
            self.mapped_bytes -= r.end.min(end) - s.max(start);
        }
        hit
    }

    /// munmap(2): forgets every mapping inside the range; unmapped parts are ignored.
    pub fn unmap(&mut self, addr: u64, len: u64) -> Result<Vec<(u64, u64)>, MapError> {
        if !addr.is_multiple_of(PAGE_SIZE) || len == 0 {
            return Err(MapError::Invalid);
        }
        let end = match addr.checked_add(page_align_up(len.min(u64::MAX - PAGE_SIZE))) {
            Some(end) => end,
            None => return Err(MapError::Invalid),
        };
        // What was mapped in the range (the guest's records only: never the VMM's own pages).
        let unmapped = self
            .carve(addr, end)
            .into_iter()
            .rev()
            .map(|(start, region)| (start.max(addr), region.end.min(end)))
            .collect();
        Ok(unmapped)
    }

    /// mprotect(2), recorded only. Memory the loader placed (the program's segments, the stack)
    /// is outside the records and accepted as is; inside the mmap pool every page must be mapped.
    pub fn protect(&mut self, addr: u64, len: u64, prot: u32) -> Result<(), MapError> {
        if !addr.is_multiple_of(PAGE_SIZE) {
            return Err(MapError::Invalid);
        }
        let end = addr
            .checked_add(page_align_up(len.min(u64::MAX - PAGE_SIZE)))
            .ok_or(MapError::Invalid)?;
        if end > self.mem_size || addr < USER_BASE {
            return Err(MapError::NotMapped);
        }
        if len == 0 {
            return Ok(());
        }
        let pool_start = self.space.mmap_low.min(self.space.brk_start);
        let pool_end = self.space.mmap_high;
        let (in_start, in_end) = (addr.max(pool_start), end.min(pool_end));
        if in_start < in_end && !self.covered(in_start, in_end) {
            return Err(MapError::NotMapped);
        }
        if self.regions.len() + 2 > MAX_REGIONS {
            return Err(MapError::NotMapped);
        }
        for (s, r) in self.carve(addr, end) {
            let (s, e) = (s.max(addr), r.end.min(end));
            let view = r.view.filter(|_| prot & PROT_WRITE == 0);
            self.regions.insert(s, Region { end: e, prot, view });
            self.mapped_bytes += e - s;
        }
        Ok(())
    }

    /// Whether every byte of [start, end) is in a region or in the heap.
    fn covered(&self, start: u64, end: u64) -> bool {
        let mut cur = start;
        if self.overlaps_heap(cur, cur + 1) {
            cur = self.brk_end();
        }
        for (&s, r) in self.regions.range(..end) {
            if r.end <= cur {
                continue;
            }
            if s > cur {
                return false;
            }
            cur = r.end;
            if cur >= end {
                return true;
            }
        }
        cur >= end
    }

    /// Recorded protection of the region holding `addr`.
    #[cfg(test)]
    pub fn prot_at(&self, addr: u64) -> Option<u32> {
        self.regions
            .range(..=addr)
            .next_back()
            .filter(|(_, r)| r.end > addr)
            .map(|(_, r)| r.prot)
    }

    /// madvise(MADV_DONTNEED): the range reads as zeros afterwards.
    pub fn discard(&mut self, mem: &GuestMemory, addr: u64, len: u64) -> Result<(), MapError> {
        if !addr.is_multiple_of(PAGE_SIZE) {
            return Err(MapError::Invalid);
        }
        let end = addr
            .checked_add(page_align_up(len.min(u64::MAX - PAGE_SIZE)))
            .ok_or(MapError::Invalid)?;
        if addr < USER_BASE || end > self.mem_size {
            return Err(MapError::NotMapped);
        }
        for (s, e) in self.dirty.intersection(addr, end) {
            mem.fill(s, e - s, 0)?;
        }
        // The zeros are no file's bytes any more.
        if self.shows_any_view(addr, end) {
            for (s, r) in self.carve(addr, end) {
                let (s, e) = (s.max(addr), r.end.min(end));
                let view = None;
                self.regions.insert(s, Region { end: e, view, ..r });
                self.mapped_bytes += e - s;
            }
        }
        Ok(())
    }

    /// mremap(2) of one whole region: shrinks in place, grows in place when the pages above
    /// are free, otherwise moves when `may_move` (copying the contents) or fails with NotMapped.
    pub fn remap(
        &mut self,
        mem: &GuestMemory,
        addr: u64,
        old_len: u64,
        new_len: u64,
        may_move: bool,
    ) -> Result<u64, MapError> {
        if !addr.is_multiple_of(PAGE_SIZE)
            || old_len == 0
            || new_len == 0
            || new_len > self.mem_size
        {
            return Err(if new_len > self.mem_size {
                MapError::NoRoom
            } else {
                MapError::Invalid
            });
        }
        let old_len = page_align_up(old_len.min(self.mem_size));
        let new_len = page_align_up(new_len);
        let old_end = addr.checked_add(old_len).ok_or(MapError::Invalid)?;
        let region = match self.regions.range(..=addr).next_back() {
            Some((_, r)) if r.end >= old_end => *r,
            _ => return Err(MapError::NotMapped),
        };
        if new_len <= old_len {
            self.carve(addr + new_len, old_end);
            return Ok(addr);
        }
        let grown_end = addr + new_len;
        let in_place = grown_end <= self.space.mmap_high.min(self.mem_size)
            && !self.overlaps_region(old_end, grown_end)
            && !self.overlaps_heap(old_end, grown_end);
        if in_place {
            self.map(
                mem,
                Placement::Fixed(old_end),
                new_len - old_len,
                region.prot,
            )?;
            return Ok(addr);
        }
        if !may_move {
            return Err(MapError::NotMapped);
        }
        let new_addr = self.map(mem, Placement::Hint(0), new_len, region.prot)?;
        let mut chunk = vec![0u8; 64 * 1024];
        let mut done = 0;
        while done < old_len {
            let n = (old_len - done).min(chunk.len() as u64) as usize;
            mem.read(addr + done, &mut chunk[..n])?;
            mem.write(new_addr + done, &chunk[..n])?;
            done += n as u64;
        }
        self.carve(addr, old_end);
        Ok(new_addr)
    }
}

// ---- template snapshots (crate::snapshot): the records' state, encoded and checked ----

impl MemoryMap {
    pub(crate) fn encode_state(&self, e: &mut Encoder) {
        self.space.encode_state(e);
        e.u64(self.mem_size);
        e.u64(self.brk);
        e.len(self.regions.len());
        for (&start, region) in &self.regions {
            e.u64(start);
            e.u64(region.end);
            e.u32(region.prot);
        }
        e.u64(self.mapped_bytes);
        e.u64(self.peak_bytes);
        e.len(self.dirty.ranges.len());
        for (&start, &end) in &self.dirty.ranges {
            e.u64(start);
            e.u64(end);
        }
    }

    /// The records `encode_state` wrote; every range must be non-empty and inside memory.
    pub(crate) fn decode_state(d: &mut Decoder) -> Result<MemoryMap, DecodeError> {
        let space = AddressSpace::decode_state(d)?;
        let mem_size = d.u64("memory size")?;
        let brk = d.u64("program break")?;
        let range = |d: &mut Decoder, what: &str| -> Result<(u64, u64), DecodeError> {
            let (start, end) = (d.u64(what)?, d.u64(what)?);
            if start >= end || end > mem_size {
                return Err(DecodeError::new(format!(
                    "{what} {start:#x}..{end:#x} is empty or outside memory"
                )));
            }
            Ok((start, end))
        };
        let n = d.count(20, "region count")?;
        if n > MAX_REGIONS {
            return Err(DecodeError::new(format!(
                "{n} regions, more than {MAX_REGIONS}"
            )));
        }
        let mut regions = BTreeMap::new();
        for _ in 0..n {
            let (start, end) = range(d, "region")?;
            regions.insert(
                start,
                Region {
                    end,
                    prot: d.u32("region protection")?,
                    view: None,
                },
            );
        }
        let (mapped_bytes, peak_bytes) = (d.u64("mapped bytes")?, d.u64("peak bytes")?);
        let n = d.count(16, "dirty range count")?;
        let mut dirty = RangeSet::default();
        for _ in 0..n {
            let (start, end) = range(d, "dirty range")?;
            dirty.insert(start, end);
        }
        Ok(MemoryMap {
            space,
            mem_size,
            brk,
            regions,
            mapped_bytes,
            peak_bytes,
            dirty,
            dirty_generation: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::Vfs;

    const MIB: u64 = 1 << 20;

    fn setup() -> (GuestMemory, MemoryMap) {
        let mem = GuestMemory::new(16 * MIB).unwrap();
        let space = AddressSpace {
            brk_start: 2 * MIB,
            mmap_low: 2 * MIB,
            mmap_high: 14 * MIB,
        };
        let map = MemoryMap::new(space, mem.size());
        (mem, map)
    }

    #[test]
    fn mmap_is_top_down_and_counted() {
        let (mem, mut map) = setup();
        let a = map.map(&mem, Placement::Hint(0), 4096, 3).unwrap();
        assert_eq!(a, 14 * MIB - 4096);
        let b = map.map(&mem, Placement::Hint(0), 5000, 3).unwrap();
        assert_eq!(b, a - 8192);
        assert_eq!(map.in_use(), 3 * 4096);
        map.unmap(a, 4096).unwrap();
        assert_eq!(map.in_use(), 2 * 4096);
        // The freed gap is reused for a request that fits.
        assert_eq!(map.map(&mem, Placement::Hint(0), 4096, 3).unwrap(), a);
        assert_eq!(map.peak(), 3 * 4096);
    }

    #[test]
    fn reused_memory_is_zeroed() {
        let (mem, mut map) = setup();
        let a = map.map(&mem, Placement::Hint(0), 4096, 3).unwrap();
        mem.fill(a, 4096, 0xAB).unwrap();
        map.unmap(a, 4096).unwrap();
        let b = map.map(&mem, Placement::Hint(0), 4096, 3).unwrap();
        assert_eq!(a, b);
        assert!(mem.read_vec(b, 4096).unwrap().iter().all(|&x| x == 0));
    }

    #[test]
    fn brk_grows_until_it_meets_a_mapping() {
        let (mem, mut map) = setup();
        assert_eq!(map.set_brk(&mem, 0), 2 * MIB);
        assert_eq!(map.set_brk(&mem, 2 * MIB + 100), 2 * MIB + 100);
        assert_eq!(map.in_use(), 4096);
        map.map(&mem, Placement::Fixed(3 * MIB), 4096, 3).unwrap();
        // Growing into the fixed mapping fails: the old break is returned.
        assert_eq!(map.set_brk(&mem, 3 * MIB + 4096), 2 * MIB + 100);
        assert_eq!(map.set_brk(&mem, 3 * MIB), 3 * MIB);
        // Non-fixed mmap never goes below the break.
        mem.fill(2 * MIB, 4096, 7).unwrap();
        map.set_brk(&mem, 2 * MIB);
        assert_eq!(map.set_brk(&mem, 2 * MIB + 4096), 2 * MIB + 4096);
        assert_eq!(mem.read_vec(2 * MIB, 4096).unwrap(), vec![0; 4096]);
    }

    #[test]
    fn exhausted_pool_reports_no_room() {
        let (mem, mut map) = setup();
        assert_eq!(
            map.map(&mem, Placement::Hint(0), 12 * MIB + 4096, 3),
            Err(MapError::NoRoom)
        );
        assert_eq!(
            map.map(&mem, Placement::Hint(0), 12 * MIB, 3).unwrap(),
            2 * MIB
        );
        assert_eq!(
            map.map(&mem, Placement::Hint(0), 4096, 3),
            Err(MapError::NoRoom)
        );
        assert_eq!(map.set_brk(&mem, 2 * MIB + 1), 2 * MIB);
    }

    #[test]
    fn fixed_maps_replace_and_noreplace_refuses() {
        let (mem, mut map) = setup();
        let a = map.map(&mem, Placement::Hint(0), 4 * 4096, 3).unwrap();
        assert_eq!(
            map.map(&mem, Placement::FixedNoReplace(a + 4096), 4096, 1),
            Err(MapError::Exists)
        );
        assert_eq!(
            map.map(&mem, Placement::Fixed(a + 4096), 4096, 1).unwrap(),
            a + 4096
        );
        assert_eq!(map.in_use(), 4 * 4096);
        assert_eq!(map.prot_at(a + 4096), Some(1));
        assert_eq!(map.prot_at(a), Some(3));
        assert_eq!(
            map.map(&mem, Placement::Fixed(a + 1), 4096, 1),
            Err(MapError::Invalid)
        );
        assert_eq!(
            map.map(&mem, Placement::Fixed(0x1000), 4096, 1),
            Err(MapError::NotMapped)
        );
        assert_eq!(
            map.map(&mem, Placement::Fixed(16 * MIB), 4096, 1),
            Err(MapError::NotMapped)
        );
    }

    #[test]
    fn protect_requires_mapped_pool_pages() {
        let (mem, mut map) = setup();
        let a = map.map(&mem, Placement::Hint(0), 2 * 4096, 3).unwrap();
        map.protect(a, 4096, 1).unwrap();
        assert_eq!(map.prot_at(a), Some(1));
        assert_eq!(map.prot_at(a + 4096), Some(3));
        assert_eq!(map.in_use(), 2 * 4096);
        assert_eq!(map.protect(a - 4096, 4096, 1), Err(MapError::NotMapped));
        // Loader-owned memory (below brk_start) is accepted.
        map.protect(MIB, 4096, 1).unwrap();
    }

    #[test]
    fn remap_grows_in_place_or_moves_with_contents() {
        let (mem, mut map) = setup();
        let a = map.map(&mem, Placement::Hint(0), 4096, 3).unwrap();
        mem.fill(a, 4096, 9).unwrap();
        // The page above a is the top of the pool: growing must move.
        assert_eq!(
            map.remap(&mem, a, 4096, 8192, false),
            Err(MapError::NotMapped)
        );
        let b = map.remap(&mem, a, 4096, 8192, true).unwrap();
        assert_ne!(a, b);
        assert_eq!(mem.read_vec(b, 4096).unwrap(), vec![9; 4096]);
        assert_eq!(mem.read_vec(b + 4096, 4096).unwrap(), vec![0; 4096]);
        assert_eq!(map.in_use(), 8192);
        assert_eq!(map.remap(&mem, b, 8192, 4096, false).unwrap(), b);
        assert_eq!(map.in_use(), 4096);
        assert_eq!(
            map.remap(&mem, a, 4096, 8192, true),
            Err(MapError::NotMapped)
        );
    }

    #[test]
    fn discard_zeroes_dirty_pages() {
        let (mem, mut map) = setup();
        let a = map.map(&mem, Placement::Hint(0), 4096, 3).unwrap();
        mem.fill(a, 4096, 5).unwrap();
        map.discard(&mem, a, 4096).unwrap();
        assert_eq!(mem.read_vec(a, 4096).unwrap(), vec![0; 4096]);
    }

    /// ld.so's pattern: a library mapped whole, then its segments over it at the same place.
    /// Those keep their bytes; a write permission, a discard, another file or another place
    /// does not.
    #[test]
    fn a_fixed_map_of_the_same_file_bytes_keeps_them() {
        let (mem, mut map) = setup();
        let (lib, other) = (Vfs::pts_node(1), Vfs::pts_node(2));
        let (whole, shown) = map
            .map_view(&mem, Placement::Hint(0), 4 * 4096, 1, Some((lib, 0)))
            .unwrap();
        assert!(!shown);
        mem.fill(whole, 4 * 4096, 7).unwrap();
        let text = Placement::Fixed(whole + 4096);
        let fixed = |map: &mut MemoryMap, place, offset, node| {
            map.map_view(&mem, place, 4096, 5, Some((node, offset)))
                .unwrap()
        };
        assert_eq!(fixed(&mut map, text, 4096, lib), (whole + 4096, true));
        assert_eq!(mem.read_vec(whole + 4096, 4096).unwrap(), vec![7; 4096]);
        assert_eq!(map.prot_at(whole + 4096), Some(5));
        // Another offset (another place for the file) or another file is copied anew.
        let data = Placement::Fixed(whole + 2 * 4096);
        assert_eq!(fixed(&mut map, data, 0, lib), (whole + 2 * 4096, false));
        assert_eq!(mem.read_vec(whole + 2 * 4096, 4096).unwrap(), vec![0; 4096]);
        let last = Placement::Fixed(whole + 3 * 4096);
        assert_eq!(
            fixed(&mut map, last, 3 * 4096, other),
            (whole + 3 * 4096, false)
        );
        // Once writable, or discarded, a region holds the program's bytes, not the file's.
        map.protect(whole, 4096, 3).unwrap();
        assert_eq!(
            fixed(&mut map, Placement::Fixed(whole), 0, lib),
            (whole, false)
        );
        mem.fill(whole + 4096, 4096, 7).unwrap();
        map.discard(&mem, whole + 4096, 4096).unwrap();
        assert_eq!(fixed(&mut map, text, 4096, lib), (whole + 4096, false));
        // Plain maps never claim a file's bytes.
        let (_, shown) = map
            .map_view(&mem, Placement::Fixed(whole), 4096, 1, None)
            .unwrap();
        assert!(!shown);
        assert_eq!(map.in_use(), 4 * 4096);
    }
}
