//! The template file (`template.sfsnap`): its layout, its content hash, and the encoding of
//! the parts that are not some other module's state (identity, CPU snapshot, memory pages).
//!
//! ```text
//! offset  size  field
//! 0       8     magic "SFTEMPL\0"
//! 8       4     format version (u32 LE, FORMAT_VERSION)
//! 12      4     reserved, zero
//! 16      8     body length B (u64 LE)
//! 24      B     body (crate::codec encoding):
//!                 identity: name, image content hash (32), agent hash (32), memory size
//!                 the AWAIT_REQUEST call's six arguments
//!                 CPU: 16 general registers, rip, rflags, FS base, GS base, XSAVE bytes
//!                 process state (GuestProcess::encode_state), length-prefixed
//!                 memory: run count, then per run its guest address and its bytes; pages
//!                 not in a run are zero (runs are whole pages, all-zero pages are left out)
//! 24+B    32    SHA-256 (crate::image::sha256) of bytes [0, 24+B)
//! ```

use super::{TemplateError, TemplateIdentity};
use crate::codec::{DecodeError, Decoder, Encoder};
pub use crate::cpu::{decode_cpu, encode_cpu};
use crate::image::sha256;
use crate::layout::PAGE_SIZE;
use crate::memory::GuestMemory;

pub const MAGIC: [u8; 8] = *b"SFTEMPL\0";
/// Bumped whenever the layout or any encoded state changes meaning.
/// 4: templates carry the vDSO (glibc keeps pointers into it) and read its data page.
/// 5: the process state keeps the program's command, pipe sizes, /proc files and access times.
pub const FORMAT_VERSION: u32 = 5;
pub const HEADER_LEN: usize = 24;
pub const HASH_LEN: usize = 32;

/// Wraps a body into a complete file: header, body, content hash.
pub fn seal(body: &[u8]) -> Vec<u8> {
    let mut file = Vec::with_capacity(HEADER_LEN + body.len() + HASH_LEN);
    file.extend_from_slice(&header(&MAGIC, FORMAT_VERSION, body.len()));
    file.extend_from_slice(body);
    let hash = sha256::digest(&file);
    file.extend_from_slice(&hash);
    file
}

/// The header of a sealed file (this layout, with another magic and version for session
/// checkpoints): magic, version, zero, body length. The content hash covers it and the body.
pub fn header(magic: &[u8; 8], version: u32, body_len: usize) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(magic);
    header[8..12].copy_from_slice(&version.to_le_bytes());
    header[16..24].copy_from_slice(&(body_len as u64).to_le_bytes());
    header
}

/// Checks magic, version, length and content hash; returns the body.
pub fn open(file: &[u8]) -> Result<&[u8], TemplateError> {
    let minimum = (HEADER_LEN + HASH_LEN) as u64;
    if file.len() < MAGIC.len() || file[..MAGIC.len()] != MAGIC {
        return Err(TemplateError::NotATemplate);
    }
    if (file.len() as u64) < minimum {
        return Err(TemplateError::Truncated {
            expected: minimum,
            actual: file.len() as u64,
        });
    }
    let word = |at: usize| u32::from_le_bytes([file[at], file[at + 1], file[at + 2], file[at + 3]]);
    let version = word(8);
    if version != FORMAT_VERSION {
        return Err(TemplateError::VersionMismatch {
            found: version,
            expected: FORMAT_VERSION,
        });
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&file[16..24]);
    let body_len = u64::from_le_bytes(len);
    let expected = body_len.saturating_add(minimum);
    if (file.len() as u64) < expected {
        return Err(TemplateError::Truncated {
            expected,
            actual: file.len() as u64,
        });
    }
    if file.len() as u64 > expected {
        return Err(TemplateError::Corrupted(format!(
            "{} bytes after the content hash",
            file.len() as u64 - expected
        )));
    }
    let (content, hash) = file.split_at(file.len() - HASH_LEN);
    if sha256::digest(content)[..] != *hash {
        return Err(TemplateError::Corrupted(
            "the content hash does not match the contents".into(),
        ));
    }
    Ok(&content[HEADER_LEN..])
}

pub fn encode_identity(id: &TemplateIdentity, e: &mut Encoder) {
    e.str(&id.name);
    e.raw(&id.image_hash);
    e.raw(&id.agent_hash);
    e.u64(id.mem_bytes);
}

pub fn decode_identity(d: &mut Decoder) -> Result<TemplateIdentity, DecodeError> {
    Ok(TemplateIdentity {
        name: d.string("template name")?,
        image_hash: d.hash("image hash")?,
        agent_hash: d.hash("agent hash")?,
        mem_bytes: d.u64("memory size")?,
    })
}

/// How much of guest memory a template stores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub runs: u64,
    pub stored_bytes: u64,
}

/// Encodes the pages of `mem` in `extents` (sorted, not overlapping) that hold non-zero bytes,
/// merged into runs. The extents are where memory was ever written: of memory of its own, its
/// memfd's data extents (reading never-touched memory through the mapping would allocate it);
/// of a copy-on-write fork, whose memfd is its template's, the template's and the pages it
/// copied.
pub fn encode_memory(
    mem: &GuestMemory,
    extents: &[(u64, u64)],
    e: &mut Encoder,
) -> std::io::Result<MemoryStats> {
    let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut page = vec![0u8; PAGE_SIZE as usize];
    for &(start, end) in extents {
        let mut at = start & !(PAGE_SIZE - 1);
        while at < end {
            mem.read(at, &mut page)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            if page.iter().any(|&b| b != 0) {
                match runs.last_mut() {
                    Some((run_start, bytes)) if *run_start + bytes.len() as u64 == at => {
                        bytes.extend_from_slice(&page)
                    }
                    _ => runs.push((at, page.clone())),
                }
            }
            at += PAGE_SIZE;
        }
    }
    e.len(runs.len());
    let mut stats = MemoryStats {
        runs: runs.len() as u64,
        stored_bytes: 0,
    };
    for (start, bytes) in &runs {
        e.u64(*start);
        e.bytes(bytes);
        stats.stored_bytes += bytes.len() as u64;
    }
    Ok(stats)
}

/// Writes the runs `encode_memory` stored into `mem` (fresh, zeroed memory of the template's
/// size); every run must be page-aligned and inside memory.
pub fn decode_memory(d: &mut Decoder, mem: &GuestMemory) -> Result<MemoryStats, DecodeError> {
    let n = d.count(16, "memory run count")?;
    let mut stats = MemoryStats {
        runs: n as u64,
        stored_bytes: 0,
    };
    for _ in 0..n {
        let start = d.u64("memory run address")?;
        let bytes = d.bytes("memory run")?;
        if !start.is_multiple_of(PAGE_SIZE) || !(bytes.len() as u64).is_multiple_of(PAGE_SIZE) {
            return Err(DecodeError::new(format!(
                "memory run at {start:#x} of {} bytes is not whole pages",
                bytes.len()
            )));
        }
        mem.write(start, bytes)
            .map_err(|e| DecodeError::new(format!("memory run: {e}")))?;
        stats.stored_bytes += bytes.len() as u64;
    }
    Ok(stats)
}
