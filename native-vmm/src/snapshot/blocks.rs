//! Byte buffers made of whole 4 KiB blocks, each aligned to 4 KiB: what the parts of a
//! checkpoint file that are not guest memory (its head, its packed pages and hash) are written
//! from and read into with O_DIRECT, which needs aligned buffers. Bytes go in and come out
//! across block boundaries, so nothing needs a contiguous view of the blocks.

use std::fs::File;
use std::io::{self, IoSliceMut};

pub const BLOCK: usize = crate::layout::PAGE_SIZE as usize;

/// One block of a checkpoint file, aligned for O_DIRECT.
#[repr(C, align(4096))]
#[derive(Clone, Copy)]
pub struct Block(pub [u8; BLOCK]);

pub const ZERO_BLOCK: Block = Block([0; BLOCK]);

/// Bytes in blocks: `len` of them, the rest of the last block (and any block after) zero.
#[derive(Clone, Default)]
pub struct Blocks {
    blocks: Vec<Block>,
    len: usize,
}

impl Blocks {
    pub fn new() -> Blocks {
        Blocks::default()
    }

    /// `count` blocks read from `file` at `at` (a multiple of 4 KiB), in vectored reads.
    pub fn read_from(file: &File, at: u64, count: usize) -> io::Result<Blocks> {
        let mut blocks = vec![ZERO_BLOCK; count];
        const IOV_MAX: usize = 1024;
        for (i, group) in blocks.chunks_mut(IOV_MAX).enumerate() {
            let mut slices: Vec<IoSliceMut<'_>> = group
                .iter_mut()
                .map(|block| IoSliceMut::new(&mut block.0))
                .collect();
            crate::memory::read_all_at(file, &mut slices, at + (i * IOV_MAX * BLOCK) as u64)?;
        }
        Ok(Blocks {
            blocks,
            len: count * BLOCK,
        })
    }

    /// Bytes appended (`read_from`: every byte read).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// Appends `bytes` after the bytes there are.
    pub fn push(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let (index, at) = (self.len / BLOCK, self.len % BLOCK);
            if index == self.blocks.len() {
                self.blocks.push(ZERO_BLOCK);
            }
            let n = (BLOCK - at).min(bytes.len());
            self.blocks[index].0[at..at + n].copy_from_slice(&bytes[..n]);
            self.len += n;
            bytes = &bytes[n..];
        }
    }

    /// Adds zero blocks up to `count` blocks in all (the bytes appended stay as they are).
    pub fn pad_to_blocks(&mut self, count: usize) {
        if self.blocks.len() < count {
            self.blocks.resize(count, ZERO_BLOCK);
        }
    }

    /// Copies the bytes at `[at, at + out.len())` into `out`; false when that is past `end`
    /// (or past the blocks).
    pub fn read(&self, at: usize, out: &mut [u8], end: usize) -> bool {
        if at
            .checked_add(out.len())
            .is_none_or(|stop| stop > end.min(self.blocks.len() * BLOCK))
        {
            return false;
        }
        let mut done = 0;
        while done < out.len() {
            let (index, offset) = ((at + done) / BLOCK, (at + done) % BLOCK);
            let n = (BLOCK - offset).min(out.len() - done);
            out[done..done + n].copy_from_slice(&self.blocks[index].0[offset..offset + n]);
            done += n;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_cross_block_boundaries_both_ways() {
        let mut blocks = Blocks::new();
        blocks.push(&[1; 10]);
        blocks.push(&vec![2; BLOCK]);
        blocks.push(&[3; 5]);
        assert_eq!((blocks.len(), blocks.blocks().len()), (BLOCK + 15, 2));
        let mut out = [0u8; 11];
        assert!(blocks.read(BLOCK + 4, &mut out, blocks.len()));
        assert_eq!(out, [2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3]);
        let mut longer = [9u8; 12];
        assert!(
            !blocks.read(BLOCK + 4, &mut longer, blocks.len()),
            "one byte past the end"
        );
        assert!(
            blocks.read(BLOCK + 4, &mut longer, 2 * BLOCK),
            "inside the zero padding when allowed"
        );
        assert_eq!(longer[11], 0);
        assert!(
            !blocks.read(2 * BLOCK - 4, &mut longer, usize::MAX),
            "past the blocks"
        );
        blocks.pad_to_blocks(4);
        assert_eq!((blocks.len(), blocks.blocks().len()), (BLOCK + 15, 4));
        assert!(
            blocks.blocks()[0].0.as_ptr().align_offset(BLOCK) == 0
                && blocks.blocks()[3].0.as_ptr().align_offset(BLOCK) == 0
        );
    }
}
