//! A regular overlay file's bytes: a vector, or shared memory once a process maps the file
//! shared (MAP_SHARED), so that reads, writes and every process's mapping see the same bytes.

use std::sync::Arc;

use crate::errno::Errno;
use crate::memory::SharedMemory;

pub(crate) enum FileData {
    Bytes(Vec<u8>),
    /// The file's `len` bytes are the first of `memory` (which may hold more: a mapping past the
    /// end of the file, or bytes a truncation zeroed).
    Shared {
        memory: Arc<SharedMemory>,
        len: u64,
    },
}

impl FileData {
    pub fn len(&self) -> u64 {
        match self {
            FileData::Bytes(bytes) => bytes.len() as u64,
            FileData::Shared { len, .. } => *len,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            FileData::Bytes(bytes) => bytes,
            // The view covers the overlay's whole limit, and a file never grows past it.
            FileData::Shared { memory, len } => memory.bytes(*len).unwrap_or_default(),
        }
    }

    /// Writes `data` at `offset`, zero-filling any gap (the caller reserved the space).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let end = offset + data.len() as u64;
        match self {
            FileData::Bytes(bytes) => {
                if end as usize > bytes.len() {
                    bytes.resize(end as usize, 0);
                }
                bytes[offset as usize..end as usize].copy_from_slice(data);
            }
            FileData::Shared { memory, len } => {
                memory.write(offset, data).map_err(|_| Errno::EFBIG)?;
                *len = (*len).max(end);
            }
        }
        Ok(())
    }

    /// Sets the length to `new_len`: bytes past it read as zeros if it grows again.
    pub fn truncate(&mut self, new_len: u64) -> Result<(), Errno> {
        match self {
            FileData::Bytes(bytes) => {
                let old = bytes.len() as u64;
                bytes.resize(new_len as usize, 0);
                if new_len < old {
                    bytes.shrink_to_fit();
                }
            }
            FileData::Shared { memory, len } => {
                if new_len < *len {
                    memory.zero(new_len, *len);
                } else {
                    memory.grow(new_len).map_err(|_| Errno::EFBIG)?;
                }
                *len = new_len;
            }
        }
        Ok(())
    }

    /// The shared memory that holds the file's bytes, made from them on the first call; it can
    /// grow to `reserve` bytes (the overlay's limit).
    pub fn share(&mut self, reserve: u64) -> Result<Arc<SharedMemory>, Errno> {
        if let FileData::Bytes(bytes) = self {
            let memory = SharedMemory::file(bytes, reserve).map_err(|_| Errno::ENOMEM)?;
            *self = FileData::Shared {
                len: bytes.len() as u64,
                memory,
            };
        }
        match self {
            FileData::Shared { memory, .. } => Ok(memory.clone()),
            FileData::Bytes(_) => Err(Errno::ENOMEM),
        }
    }
}

/// A copy is a file of its own: shared memory is never shared by copying (a VM made from a
/// template's state must not see another's writes).
impl Clone for FileData {
    fn clone(&self) -> FileData {
        FileData::Bytes(self.bytes().to_vec())
    }
}
