//! How a checkpoint stores a guest page: by what it holds, in 64-byte chunks. A page whose
//! chunks are all zero is `Zero` (two bits in the file's page table, no bytes); a page with at
//! most `MAX_SPARSE_CHUNKS` non-zero chunks is `Sparse`: its chunk mask (bit i: chunk i is
//! stored) and those chunks, packed back to back with the other sparse pages; any other page is
//! `Raw`, written whole at a 4 KiB file offset straight from guest memory. These replace the
//! page (the template's, or an older checkpoint's): restoring a sparse or zero page writes its
//! zero chunks as zeros. A page can also be a `Delta`: only the chunks that differ from the page
//! a restore holds before it, packed as a sparse page is and written over that page. In an
//! incremental checkpoint that is the page as its parent's chain restores it (the chunks that
//! changed since the parent recorded it: `checkpoint::PageFingerprints` keeps a fingerprint per
//! chunk); in a full one, the template's page (a CPython cell changes a few reference counts and
//! pointers in each of ~100 pages of the interpreter's objects, which are no sparser than any
//! other data, and a session's interpreter heap differs from the template's the same way).
//!
//! Why: what the disk takes is what a durable checkpoint costs (its rate for the bytes of a
//! checkpoint after a 1 MiB cell was below 1,000 per second), and a page a cell writes is often
//! mostly zeros (fresh buffers, the interpreter's new objects). Raw above the threshold because
//! a sparse page costs a copy into the packed region (the raw ones go to the disk with no copy)
//! for little saved.

use std::ops::Range;

use super::blocks::Blocks;
use crate::layout::PAGE_SIZE;
use crate::memory::{GuestMemory, OutOfBounds};

pub const CHUNK_BYTES: usize = 64;
const CHUNKS: usize = PAGE_SIZE as usize / CHUNK_BYTES;
/// A page with more non-zero chunks than this is stored raw: sparse would save under 1 KiB of
/// its 4 KiB (mask included).
pub const MAX_SPARSE_CHUNKS: u32 = 47;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    Zero,
    Sparse,
    Raw,
    Delta,
}

impl PageKind {
    /// How a page with the non-zero chunks `mask` (`chunk_mask`) is stored whole.
    pub fn of(mask: u64) -> PageKind {
        match mask.count_ones() {
            0 => PageKind::Zero,
            n if n <= MAX_SPARSE_CHUNKS => PageKind::Sparse,
            _ => PageKind::Raw,
        }
    }

    /// How a page with the non-zero chunks `nonzero` is stored when the chunks `changed` are
    /// those that differ from what its parent recorded (None: no record, the page is stored
    /// whole), and the mask of the chunks stored: whichever costs fewer bytes.
    pub fn choose(nonzero: u64, changed: Option<u64>) -> (PageKind, u64) {
        let whole = match PageKind::of(nonzero) {
            PageKind::Sparse => (PageKind::Sparse, nonzero),
            kind => (kind, 0),
        };
        match changed {
            Some(changed)
                if changed != 0
                    && changed.count_ones() <= MAX_SPARSE_CHUNKS
                    && (whole.0 == PageKind::Raw
                        || changed.count_ones() < nonzero.count_ones()) =>
            {
                (PageKind::Delta, changed)
            }
            _ => whole,
        }
    }

    /// Whether restoring it replaces the whole page (all but `Delta`).
    pub fn replaces(self) -> bool {
        self != PageKind::Delta
    }

    /// Whether its chunks are in the packed region.
    pub fn packed(self) -> bool {
        matches!(self, PageKind::Sparse | PageKind::Delta)
    }

    fn code(self) -> u8 {
        match self {
            PageKind::Zero => 0,
            PageKind::Sparse => 1,
            PageKind::Raw => 2,
            PageKind::Delta => 3,
        }
    }
}

/// How many pages of a checkpoint went each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageCounts {
    pub zero: u64,
    pub sparse: u64,
    pub raw: u64,
    pub delta: u64,
}

impl PageCounts {
    pub fn add(&mut self, kind: PageKind) {
        match kind {
            PageKind::Zero => self.zero += 1,
            PageKind::Sparse => self.sparse += 1,
            PageKind::Raw => self.raw += 1,
            PageKind::Delta => self.delta += 1,
        }
    }
}

/// Bit i set: chunk i of `page` (4 KiB) holds a non-zero byte.
pub fn chunk_mask(page: &[u8]) -> u64 {
    page.chunks_exact(CHUNK_BYTES)
        .enumerate()
        .fold(0, |mask, (i, chunk)| {
            // Eight words OR'ed together, no early exit: the compiler keeps it branch-free.
            let any = chunk.chunks_exact(8).fold(0u64, |acc, word| {
                acc | u64::from_ne_bytes(word.try_into().expect("8 bytes"))
            });
            mask | (u64::from(any != 0) << i)
        })
}

/// The chunk runs of `mask`, in order: whether they are stored, and which chunks.
fn chunk_runs(mask: u64) -> impl Iterator<Item = (bool, Range<usize>)> {
    let mut chunk = 0;
    std::iter::from_fn(move || {
        if chunk == CHUNKS {
            return None;
        }
        let rest = mask >> chunk;
        let stored = rest & 1 == 1;
        let run = if stored {
            (!rest).trailing_zeros()
        } else {
            rest.trailing_zeros()
        } as usize;
        let run = run.min(CHUNKS - chunk);
        chunk += run;
        Some((stored, chunk - run..chunk))
    })
}

/// Appends a sparse or delta page to the packed region: its mask, then its stored chunks.
pub fn pack(page: &[u8], mask: u64, out: &mut Blocks) {
    out.push(&mask.to_le_bytes());
    for chunks in stored_chunks(page, mask) {
        out.push(chunks);
    }
}

/// The runs of chunks of `page` (4 KiB) that `mask` stores, in order.
pub fn stored_chunks(page: &[u8], mask: u64) -> impl Iterator<Item = &[u8]> {
    chunk_runs(mask)
        .filter(|(stored, _)| *stored)
        .map(move |(_, chunks)| &page[chunks.start * CHUNK_BYTES..chunks.end * CHUNK_BYTES])
}

/// Writes a stored page of `kind` into guest memory at `addr`: the chunks of `mask` from
/// `stored` (`mask`'s chunks, back to back; a zero page's mask is 0, a raw one's all ones),
/// zeros elsewhere, except for a delta, which leaves the other chunks as they are.
pub fn restore(
    mem: &GuestMemory,
    addr: u64,
    kind: PageKind,
    mask: u64,
    stored: &[u8],
) -> Result<(), OutOfBounds> {
    let mut at = 0;
    for (is_stored, chunks) in chunk_runs(mask) {
        let (to, len) = (
            addr + (chunks.start * CHUNK_BYTES) as u64,
            chunks.len() * CHUNK_BYTES,
        );
        if is_stored {
            mem.write(to, &stored[at..at + len])?;
            at += len;
        } else if kind.replaces() {
            mem.fill(to, len as u64, 0)?;
        }
    }
    Ok(())
}

/// Reads the sparse pages of a packed region back, in order.
pub struct Unpacker<'a> {
    packed: &'a Blocks,
    at: usize,
    /// The packed region's length (the blocks hold padding and the hash after it).
    end: usize,
    page: [u8; PAGE_SIZE as usize],
}

impl<'a> Unpacker<'a> {
    pub fn new(packed: &'a Blocks, len: usize) -> Unpacker<'a> {
        Unpacker {
            packed,
            at: 0,
            end: len,
            page: [0; PAGE_SIZE as usize],
        }
    }

    /// The next sparse page's mask and stored chunks.
    pub fn next_page(&mut self) -> Result<(u64, &[u8]), String> {
        let mut mask = [0u8; 8];
        if !self.packed.read(self.at, &mut mask, self.end) {
            return Err(format!(
                "the packed pages end at byte {} before the page table's",
                self.at
            ));
        }
        let mask = u64::from_le_bytes(mask);
        if mask == 0 {
            return Err(format!(
                "a sparse page with no chunks at byte {} of the packed pages",
                self.at
            ));
        }
        let len = mask.count_ones() as usize * CHUNK_BYTES;
        if !self
            .packed
            .read(self.at + 8, &mut self.page[..len], self.end)
        {
            return Err(format!(
                "a sparse page at byte {} runs past the packed pages",
                self.at
            ));
        }
        self.at += 8 + len;
        Ok((mask, &self.page[..len]))
    }

    /// Fails unless every byte of the packed region was a page.
    pub fn finish(&self) -> Result<(), String> {
        match self.end - self.at {
            0 => Ok(()),
            n => Err(format!("{n} bytes after the last sparse page")),
        }
    }
}

/// The page table: two bits per page (`PageKind::code`), four pages a byte, low bits first.
pub fn encode_kinds(kinds: &[PageKind]) -> Vec<u8> {
    kinds
        .chunks(4)
        .map(|four| {
            four.iter()
                .enumerate()
                .fold(0u8, |byte, (i, kind)| byte | kind.code() << (2 * i))
        })
        .collect()
}

/// Decodes a page table of `pages` pages; refuses one of another length, an unknown code or
/// bits set past its last page.
pub fn decode_kinds(bytes: &[u8], pages: u64) -> Result<Vec<PageKind>, String> {
    if bytes.len() as u64 != pages.div_ceil(4) {
        return Err(format!(
            "a page table of {} bytes for {pages} pages",
            bytes.len()
        ));
    }
    let mut kinds = Vec::with_capacity(pages as usize);
    for (i, byte) in bytes.iter().enumerate() {
        for slot in 0..4 {
            let code = byte >> (2 * slot) & 3;
            if (i * 4 + slot) as u64 >= pages {
                if code != 0 {
                    return Err("bits set after the page table's last page".into());
                }
                continue;
            }
            kinds.push(match code {
                0 => PageKind::Zero,
                1 => PageKind::Sparse,
                2 => PageKind::Raw,
                _ => PageKind::Delta,
            });
        }
    }
    Ok(kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = PAGE_SIZE as usize;

    /// Stores `page` as its kind says (a sparse one packed after another's bytes and read
    /// back), restores it over a page of 0xee (a template's) and returns what is there. The
    /// checkpoint file around it: snapshot/tests.rs.
    fn round_trip(page: &[u8]) -> (PageKind, Vec<u8>) {
        let mask = chunk_mask(page);
        let mem = GuestMemory::new(4 * PAGE_SIZE).unwrap();
        mem.fill(0, 4 * PAGE_SIZE, 0xee).unwrap();
        match PageKind::of(mask) {
            PageKind::Sparse => {
                let mut packed = Blocks::new();
                packed.push(&[7; 3]);
                pack(page, mask, &mut packed);
                let mut unpacker = Unpacker::new(&packed, packed.len());
                unpacker.at = 3;
                let (read_mask, stored) = unpacker.next_page().unwrap();
                assert_eq!(read_mask, mask);
                restore(&mem, PAGE_SIZE, PageKind::Sparse, read_mask, stored).unwrap();
                unpacker.finish().unwrap();
            }
            PageKind::Zero => restore(&mem, PAGE_SIZE, PageKind::Zero, 0, &[]).unwrap(),
            PageKind::Raw => restore(&mem, PAGE_SIZE, PageKind::Raw, u64::MAX, page).unwrap(),
            PageKind::Delta => unreachable!("a page stored whole"),
        }
        assert_eq!(
            mem.read_vec(0, PAGE_SIZE).unwrap(),
            vec![0xee; PAGE],
            "the page before is untouched"
        );
        assert_eq!(
            mem.read_vec(2 * PAGE_SIZE, PAGE_SIZE).unwrap(),
            vec![0xee; PAGE],
            "the page after is untouched"
        );
        (
            PageKind::of(mask),
            mem.read_vec(PAGE_SIZE, PAGE_SIZE).unwrap(),
        )
    }

    #[test]
    fn the_mask_marks_exactly_the_chunks_holding_a_non_zero_byte() {
        let mut page = vec![0u8; PAGE];
        assert_eq!(chunk_mask(&page), 0);
        page[0] = 1;
        page[63 * 64 + 63] = 0x80;
        page[5 * 64 + 17] = 9;
        assert_eq!(chunk_mask(&page), 1 | 1 << 5 | 1 << 63);
        assert_eq!(chunk_mask(&[0xff; PAGE]), u64::MAX);
    }

    #[test]
    fn pages_round_trip_byte_exact_over_a_template_page() {
        // A lone non-zero byte at each offset of a chunk in turn, in every third chunk (sparse),
        // and in every chunk (raw).
        for offset in 0..CHUNK_BYTES {
            for (every, kind) in [(3, PageKind::Sparse), (1, PageKind::Raw)] {
                let page: Vec<u8> = (0..PAGE)
                    .map(|i| {
                        if i % CHUNK_BYTES == offset && (i / CHUNK_BYTES).is_multiple_of(every) {
                            (i / CHUNK_BYTES + 1) as u8
                        } else {
                            0
                        }
                    })
                    .collect();
                assert_eq!(
                    round_trip(&page),
                    (kind, page),
                    "offset {offset}, every {every} chunks"
                );
            }
        }
        // Each chunk alone, and every other chunk (alternating runs of one).
        for chunk in 0..CHUNKS {
            let page: Vec<u8> = (0..PAGE)
                .map(|i| {
                    if i / CHUNK_BYTES == chunk {
                        (i % 251 + 1) as u8
                    } else {
                        0
                    }
                })
                .collect();
            assert_eq!(round_trip(&page), (PageKind::Sparse, page), "chunk {chunk}");
        }
        let alternating: Vec<u8> = (0..PAGE)
            .map(|i| if (i / CHUNK_BYTES) % 2 == 1 { 0x5a } else { 0 })
            .collect();
        assert_eq!(round_trip(&alternating), (PageKind::Sparse, alternating));
        assert_eq!(
            round_trip(&[0; PAGE]),
            (PageKind::Zero, vec![0; PAGE]),
            "zeros written over the template's bytes"
        );
        let full: Vec<u8> = (0..PAGE).map(|i| (i * 7 % 255 + 1) as u8).collect();
        assert_eq!(round_trip(&full), (PageKind::Raw, full));
        // The threshold: 47 chunks sparse, 48 raw.
        let chunks = |n: usize| -> Vec<u8> {
            (0..PAGE)
                .map(|i| u8::from(i / CHUNK_BYTES < n && i % CHUNK_BYTES == 3))
                .collect()
        };
        assert_eq!(round_trip(&chunks(47)).0, PageKind::Sparse);
        assert_eq!(round_trip(&chunks(48)).0, PageKind::Raw);
    }

    #[test]
    fn a_delta_writes_its_chunks_over_the_page_and_leaves_the_rest() {
        let mem = GuestMemory::new(2 * PAGE_SIZE).unwrap();
        mem.fill(0, PAGE_SIZE, 0xee).unwrap();
        let mut page = vec![0xeeu8; PAGE];
        page[3 * 64..4 * 64].fill(0);
        page[63 * 64] = 1;
        let mut packed = Blocks::new();
        let changed = 1 << 3 | 1 << 63;
        pack(&page, changed, &mut packed);
        let mut unpacker = Unpacker::new(&packed, packed.len());
        let (mask, stored) = unpacker.next_page().unwrap();
        restore(&mem, 0, PageKind::Delta, mask, stored).unwrap();
        assert_eq!(mem.read_vec(0, PAGE_SIZE).unwrap(), page);
    }

    #[test]
    fn the_cheaper_of_whole_and_delta_is_chosen() {
        let few = 0b111;
        assert_eq!(
            PageKind::choose(0, Some(few)),
            (PageKind::Zero, 0),
            "zeros cost nothing"
        );
        assert_eq!(PageKind::choose(few, Some(0b1)), (PageKind::Delta, 0b1));
        assert_eq!(
            PageKind::choose(few, Some(few)),
            (PageKind::Sparse, few),
            "a tie: stored whole"
        );
        assert_eq!(
            PageKind::choose(few, None),
            (PageKind::Sparse, few),
            "no record: stored whole"
        );
        assert_eq!(
            PageKind::choose(u64::MAX, Some(1 << 40)),
            (PageKind::Delta, 1 << 40)
        );
        assert_eq!(
            PageKind::choose(u64::MAX, Some(u64::MAX >> 8)),
            (PageKind::Raw, 0),
            "too many changed chunks"
        );
        assert_eq!(
            PageKind::choose(u64::MAX, Some(0)),
            (PageKind::Raw, 0),
            "nothing changed is no delta"
        );
    }

    #[test]
    fn a_damaged_packed_region_is_refused() {
        let mut page = vec![0u8; PAGE];
        page[64] = 1;
        let mut packed = Blocks::new();
        pack(&page, chunk_mask(&page), &mut packed);
        assert_eq!(packed.len(), 8 + 64);
        assert!(Unpacker::new(&packed, packed.len() - 1)
            .next_page()
            .unwrap_err()
            .contains("runs past"));
        assert!(Unpacker::new(&packed, 4)
            .next_page()
            .unwrap_err()
            .contains("end at byte 0"));
        let mut unpacker = Unpacker::new(&packed, packed.len() + 8);
        unpacker.next_page().unwrap();
        assert!(unpacker.finish().unwrap_err().contains("8 bytes after"));
        assert!(
            unpacker.next_page().unwrap_err().contains("no chunks"),
            "zeros where a mask should be"
        );
    }

    #[test]
    fn the_page_table_round_trips_and_refuses_what_it_cannot_hold() {
        let kinds = [
            PageKind::Raw,
            PageKind::Zero,
            PageKind::Sparse,
            PageKind::Sparse,
            PageKind::Delta,
        ];
        let bytes = encode_kinds(&kinds);
        assert_eq!(bytes.len(), 2);
        assert_eq!(decode_kinds(&bytes, 5).unwrap(), kinds);
        assert!(decode_kinds(&bytes, 9).is_err(), "too short");
        assert!(
            decode_kinds(&bytes[..1], 3)
                .unwrap_err()
                .contains("bits set after"),
            "a fourth page in a table of three"
        );
        assert!(decode_kinds(&[], 0).unwrap().is_empty());
    }
}
