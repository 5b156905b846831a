//! The on-disk image format: an index file and one data file in the image directory.
//!
//! ```text
//! image.index  header (64 bytes, little-endian):
//!                magic "SFKIMAGE" | version u32 | reserved u32 (0) | body_len u64 | data_len u64
//!                | content_hash [32] = SHA-256(body)
//!              body (body_len bytes):
//!                name: str | writable_dirs: u32 count, str each | entries: u32 count, entry each
//!                entry: kind u8 (1 file, 2 dir, 3 symlink) | mode u32 (permission bits)
//!                       | mtime_sec i64 | mtime_nsec u32 | path: str
//!                       | file: offset u64, size u64, sha256 [32] of the contents
//!                       | symlink: target: str
//!                str: u32 length, UTF-8 bytes
//! image.data   file contents, each starting at a 4 KiB-aligned offset (so a later snapshot or
//!              fork can map them), zero padding between them, data_len a multiple of 4 KiB.
//! ```
//!
//! The content hash covers the data through the per-file hashes in the body (a two-level hash
//! tree): opening an image hashes only the index, and each file is checked against its own
//! hash when first read, so starting a VMM does not hash the whole data file.
//!
//! Entries are sorted by path (byte order), paths are absolute and normalised, the first entry
//! is "/", every entry's parent is a directory entry, and nothing lies at or under a writable
//! directory (those belong to the per-VM overlay). The decoder checks all of this, so a reader
//! can trust a decoded index without re-checking.

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use super::sha256;

pub const INDEX_FILE: &str = "image.index";
pub const DATA_FILE: &str = "image.data";
pub const MAGIC: [u8; 8] = *b"SFKIMAGE";
pub const VERSION: u32 = 1;
pub const HEADER_LEN: usize = 64;
/// File contents start at multiples of this (the page size).
pub const DATA_ALIGN: u64 = 4096;

/// Linux PATH_MAX includes the terminating NUL.
pub const PATH_MAX: usize = 4096;
/// Upper bounds that keep a hostile index from making the reader allocate without limit.
pub const MAX_BODY_LEN: u64 = 256 << 20;
const MAX_ENTRIES: u32 = 1 << 20;
const MAX_WRITABLE_DIRS: u32 = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    File {
        offset: u64,
        size: u64,
        sha256: [u8; 32],
    },
    Dir,
    Symlink {
        target: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Absolute, normalised guest path ("/" for the root).
    pub path: String,
    /// Permission bits (mode & 0o7777).
    pub mode: u32,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    pub kind: EntryKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    pub name: String,
    pub writable_dirs: Vec<String>,
    pub entries: Vec<Entry>,
}

/// The fixed-size start of the index file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub body_len: u64,
    pub data_len: u64,
    pub content_hash: [u8; 32],
}

/// Why an image directory cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    BadMagic,
    UnsupportedVersion(u32),
    /// A file is shorter or longer than its header says.
    SizeMismatch {
        file: &'static str,
        expected: u64,
        found: u64,
    },
    /// The index body does not match the header's content hash.
    HashMismatch,
    /// The index body is malformed; `offset` is the byte offset in the body.
    Malformed {
        offset: usize,
        reason: String,
    },
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::BadMagic => write!(f, "not a sandfork image index (bad magic)"),
            FormatError::UnsupportedVersion(v) => write!(
                f,
                "unsupported image format version {v} (this build reads {VERSION})"
            ),
            FormatError::SizeMismatch {
                file,
                expected,
                found,
            } => {
                write!(f, "{file} has {found} bytes but the header says {expected}: truncated or corrupted image")
            }
            FormatError::HashMismatch => {
                write!(f, "content hash mismatch: the image index is corrupted")
            }
            FormatError::Malformed { offset, reason } => {
                write!(f, "malformed image index at body byte {offset}: {reason}")
            }
        }
    }
}

impl std::error::Error for FormatError {}

impl From<FormatError> for io::Error {
    fn from(e: FormatError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

pub const fn align_up(v: u64) -> u64 {
    (v + DATA_ALIGN - 1) & !(DATA_ALIGN - 1)
}

pub fn encode_header(h: &Header) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[0..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&VERSION.to_le_bytes());
    out[16..24].copy_from_slice(&h.body_len.to_le_bytes());
    out[24..32].copy_from_slice(&h.data_len.to_le_bytes());
    out[32..64].copy_from_slice(&h.content_hash);
    out
}

pub fn decode_header(bytes: &[u8]) -> Result<Header, FormatError> {
    if bytes.len() < HEADER_LEN {
        if bytes.len() < 8 || bytes[..8] != MAGIC {
            return Err(FormatError::BadMagic);
        }
        return Err(FormatError::SizeMismatch {
            file: INDEX_FILE,
            expected: HEADER_LEN as u64,
            found: bytes.len() as u64,
        });
    }
    if bytes[..8] != MAGIC {
        return Err(FormatError::BadMagic);
    }
    let u32_at =
        |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap_or([0; 8]));
    let version = u32_at(8);
    if version != VERSION {
        return Err(FormatError::UnsupportedVersion(version));
    }
    let mut content_hash = [0u8; 32];
    content_hash.copy_from_slice(&bytes[32..64]);
    Ok(Header {
        body_len: u64_at(16),
        data_len: u64_at(24),
        content_hash,
    })
}

pub fn encode_body(index: &Index) -> Vec<u8> {
    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    let mut out = Vec::new();
    put_str(&mut out, &index.name);
    out.extend_from_slice(&(index.writable_dirs.len() as u32).to_le_bytes());
    for dir in &index.writable_dirs {
        put_str(&mut out, dir);
    }
    out.extend_from_slice(&(index.entries.len() as u32).to_le_bytes());
    for e in &index.entries {
        let kind: u8 = match e.kind {
            EntryKind::File { .. } => 1,
            EntryKind::Dir => 2,
            EntryKind::Symlink { .. } => 3,
        };
        out.push(kind);
        out.extend_from_slice(&e.mode.to_le_bytes());
        out.extend_from_slice(&e.mtime_sec.to_le_bytes());
        out.extend_from_slice(&e.mtime_nsec.to_le_bytes());
        put_str(&mut out, &e.path);
        match &e.kind {
            EntryKind::File {
                offset,
                size,
                sha256,
            } => {
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&size.to_le_bytes());
                out.extend_from_slice(sha256);
            }
            EntryKind::Dir => {}
            EntryKind::Symlink { target } => put_str(&mut out, target),
        }
    }
    out
}

/// A bounds-checked reader over the index body.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn fail<T>(&self, reason: impl Into<String>) -> Result<T, FormatError> {
        Err(FormatError::Malformed {
            offset: self.pos,
            reason: reason.into(),
        })
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], FormatError> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.bytes.len() => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => self.fail(format!("{what} runs past the end of the index")),
        }
    }

    fn u8(&mut self, what: &str) -> Result<u8, FormatError> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32, FormatError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64, FormatError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(a))
    }

    fn str(&mut self, what: &str, max: usize) -> Result<String, FormatError> {
        let len = self.u32(what)? as usize;
        if len > max {
            return self.fail(format!("{what} is {len} bytes, more than {max}"));
        }
        let start = self.pos;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(FormatError::Malformed {
                offset: start,
                reason: format!("{what} is not UTF-8"),
            }),
        }
    }
}

/// Whether `p` is absolute and normalised: "/" or "/a/b" with no empty, "." or ".." component.
pub fn is_normal_path(p: &str) -> bool {
    if p == "/" {
        return true;
    }
    p.len() < PATH_MAX
        && p.starts_with('/')
        && p[1..]
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && c.len() <= 255 && !c.contains('\0'))
}

/// The parent of a normalised path other than "/".
pub fn parent_path(p: &str) -> &str {
    match p.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &p[..i],
    }
}

/// Whether normalised path `p` is `dir` or lies under it.
pub fn is_within(p: &str, dir: &str) -> bool {
    dir == "/" || p == dir || (p.starts_with(dir) && p.as_bytes().get(dir.len()) == Some(&b'/'))
}

/// Decodes and validates an index body against the data file length.
pub fn decode_body(bytes: &[u8], data_len: u64) -> Result<Index, FormatError> {
    let mut c = Cursor { bytes, pos: 0 };
    let name = c.str("image name", 255)?;
    let writable_count = c.u32("writable directory count")?;
    if writable_count > MAX_WRITABLE_DIRS {
        return c.fail(format!(
            "{writable_count} writable directories, more than {MAX_WRITABLE_DIRS}"
        ));
    }
    let mut writable_dirs = Vec::new();
    for _ in 0..writable_count {
        let dir = c.str("writable directory", PATH_MAX - 1)?;
        if dir == "/" || !is_normal_path(&dir) {
            return c.fail(format!(
                "writable directory {dir:?} is not a normalised absolute path below /"
            ));
        }
        writable_dirs.push(dir);
    }
    let count = c.u32("entry count")?;
    if count > MAX_ENTRIES {
        return c.fail(format!("{count} entries, more than {MAX_ENTRIES}"));
    }
    let mut entries: Vec<Entry> = Vec::new();
    let mut kinds: HashMap<String, bool> = HashMap::new(); // path -> is a directory
    for i in 0..count {
        let at = c.pos;
        let malformed = |reason: String| Err(FormatError::Malformed { offset: at, reason });
        let kind_byte = c.u8("entry kind")?;
        let mode = c.u32("entry mode")?;
        let mtime_sec = c.u64("entry mtime")?.cast_signed();
        let mtime_nsec = c.u32("entry mtime nanoseconds")?;
        let path = c.str("entry path", PATH_MAX - 1)?;
        let kind = match kind_byte {
            1 => {
                let offset = c.u64("file offset")?;
                let size = c.u64("file size")?;
                let mut sha256 = [0u8; 32];
                sha256.copy_from_slice(c.take(32, "file hash")?);
                if offset % DATA_ALIGN != 0 {
                    return malformed(format!("{path}: data offset {offset} is not page aligned"));
                }
                if offset.checked_add(size).is_none_or(|end| end > data_len) {
                    return malformed(format!("{path}: data range {offset}+{size} lies outside the {data_len}-byte data file"));
                }
                EntryKind::File {
                    offset,
                    size,
                    sha256,
                }
            }
            2 => EntryKind::Dir,
            3 => {
                let target = c.str("symlink target", PATH_MAX - 1)?;
                if target.is_empty() || target.contains('\0') {
                    return malformed(format!("{path}: empty or NUL-containing symlink target"));
                }
                EntryKind::Symlink { target }
            }
            other => return malformed(format!("unknown entry kind {other}")),
        };
        if mode > 0o7777 || mtime_nsec >= 1_000_000_000 {
            return malformed(format!(
                "{path}: mode {mode:o} or mtime nanoseconds {mtime_nsec} out of range"
            ));
        }
        if !is_normal_path(&path) {
            return malformed(format!(
                "entry path {path:?} is not absolute and normalised"
            ));
        }
        if i == 0 {
            if path != "/" || kind != EntryKind::Dir {
                return malformed("the first entry is not the root directory".into());
            }
        } else {
            if entries
                .last()
                .is_some_and(|prev| prev.path.as_bytes() >= path.as_bytes())
            {
                return malformed(format!("entry {path} is out of order or duplicated"));
            }
            if kinds.get(parent_path(&path)) != Some(&true) {
                return malformed(format!(
                    "the parent of {path} is not a directory entry before it"
                ));
            }
        }
        if writable_dirs.iter().any(|w| is_within(&path, w)) {
            return malformed(format!(
                "{path} lies in a writable directory, which belongs to the overlay"
            ));
        }
        kinds.insert(path.clone(), kind == EntryKind::Dir);
        entries.push(Entry {
            path,
            mode,
            mtime_sec,
            mtime_nsec,
            kind,
        });
    }
    if count == 0 {
        return c.fail("the index has no root directory");
    }
    if c.pos != bytes.len() {
        return c.fail("trailing bytes after the last entry");
    }
    for w in &writable_dirs {
        if kinds.get(parent_path(w)) != Some(&true) {
            return c.fail(format!(
                "the parent of writable directory {w} is not a directory in the image"
            ));
        }
    }
    Ok(Index {
        name,
        writable_dirs,
        entries,
    })
}

/// Writes `index` to `out_dir`: assigns data offsets to its files (in entry order), streams each
/// file's contents from `content` into the data file, records each file's hash, and returns
/// the content hash. `content` must return exactly the size recorded in the entry.
pub fn write(
    out_dir: &Path,
    index: &mut Index,
    mut content: impl FnMut(&Entry) -> io::Result<Vec<u8>>,
) -> io::Result<[u8; 32]> {
    fs::create_dir_all(out_dir)?;
    let data_tmp = out_dir.join(format!("{DATA_FILE}.tmp"));
    let index_tmp = out_dir.join(format!("{INDEX_FILE}.tmp"));
    let mut data = io::BufWriter::new(File::create(&data_tmp)?);
    let mut written = 0u64;
    for i in 0..index.entries.len() {
        let EntryKind::File { size, .. } = index.entries[i].kind else {
            continue;
        };
        let bytes = content(&index.entries[i])?;
        if bytes.len() as u64 != size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} changed during the build ({size} bytes when listed, {} when read)",
                    index.entries[i].path,
                    bytes.len()
                ),
            ));
        }
        data.write_all(&bytes)?;
        let end = written + size;
        data.write_all(&vec![0u8; (align_up(end) - end) as usize])?;
        index.entries[i].kind = EntryKind::File {
            offset: written,
            size,
            sha256: sha256::digest(&bytes),
        };
        written = align_up(end);
    }
    data.into_inner().map_err(|e| e.into_error())?.sync_all()?;

    let body = encode_body(index);
    let content_hash = sha256::digest(&body);
    let header = encode_header(&Header {
        body_len: body.len() as u64,
        data_len: written,
        content_hash,
    });
    let mut index_file = File::create(&index_tmp)?;
    index_file.write_all(&header)?;
    index_file.write_all(&body)?;
    index_file.sync_all()?;
    // Data first, then the index: a reader never sees a new index over old data, and a crash
    // in between leaves an image whose sizes or hashes do not match rather than a mixed one.
    fs::rename(&data_tmp, out_dir.join(DATA_FILE))?;
    fs::rename(&index_tmp, out_dir.join(INDEX_FILE))?;
    Ok(content_hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, kind: EntryKind) -> Entry {
        Entry {
            path: path.into(),
            mode: 0o755,
            mtime_sec: 1_700_000_000,
            mtime_nsec: 5,
            kind,
        }
    }

    fn sample() -> Index {
        Index {
            name: "t".into(),
            writable_dirs: vec!["/tmp".into()],
            entries: vec![
                entry("/", EntryKind::Dir),
                entry("/a", EntryKind::Dir),
                entry(
                    "/a/f",
                    EntryKind::File {
                        offset: 0,
                        size: 3,
                        sha256: [9; 32],
                    },
                ),
                entry("/a/l", EntryKind::Symlink { target: "f".into() }),
            ],
        }
    }

    #[test]
    fn body_round_trips() {
        let idx = sample();
        assert_eq!(decode_body(&encode_body(&idx), 4096).unwrap(), idx);
    }

    #[test]
    fn every_truncation_of_the_body_is_refused() {
        let body = encode_body(&sample());
        for len in 0..body.len() {
            assert!(
                matches!(
                    decode_body(&body[..len], 4096),
                    Err(FormatError::Malformed { .. })
                ),
                "len {len}"
            );
        }
    }

    #[test]
    fn invalid_indexes_are_refused() {
        let bad = |f: &dyn Fn(&mut Index)| {
            let mut idx = sample();
            f(&mut idx);
            decode_body(&encode_body(&idx), 4096)
                .unwrap_err()
                .to_string()
        };
        assert!(bad(&|i| i.entries.swap(2, 3)).contains("out of order"));
        assert!(bad(&|i| i.entries[2].kind = EntryKind::File {
            offset: 4096,
            size: 1,
            sha256: [0; 32]
        })
        .contains("outside"));
        assert!(bad(&|i| i.entries[2].kind = EntryKind::File {
            offset: 1,
            size: 1,
            sha256: [0; 32]
        })
        .contains("page aligned"));
        assert!(bad(&|i| i.entries[1].path = "/a/../b".into()).contains("normalised"));
        assert!(bad(&|i| i.entries.remove(1).path.clear()).contains("parent"));
        assert!(bad(&|i| i.entries[0].kind = EntryKind::File {
            offset: 0,
            size: 0,
            sha256: [0; 32]
        })
        .contains("root"));
        assert!(bad(&|i| i.writable_dirs[0] = "/a".into()).contains("writable"));
        assert!(bad(&|i| i.writable_dirs[0] = "/nodir/tmp".into()).contains("parent of writable"));
        assert!(bad(&|i| i.entries[3].kind = EntryKind::Symlink {
            target: String::new()
        })
        .contains("symlink"));
    }

    #[test]
    fn header_checks_magic_and_version() {
        let h = Header {
            body_len: 10,
            data_len: 4096,
            content_hash: [7; 32],
        };
        let bytes = encode_header(&h);
        assert_eq!(decode_header(&bytes).unwrap(), h);
        let mut wrong = bytes;
        wrong[0] = b'X';
        assert_eq!(decode_header(&wrong), Err(FormatError::BadMagic));
        let mut v2 = bytes;
        v2[8] = 2;
        assert_eq!(decode_header(&v2), Err(FormatError::UnsupportedVersion(2)));
        assert!(matches!(
            decode_header(&bytes[..20]),
            Err(FormatError::SizeMismatch { .. })
        ));
    }

    #[test]
    fn path_helpers() {
        assert!(
            is_normal_path("/")
                && is_normal_path("/a/b")
                && !is_normal_path("a")
                && !is_normal_path("/a/")
        );
        assert!(!is_normal_path("/a//b") && !is_normal_path("/./a"));
        assert_eq!(parent_path("/a/b"), "/a");
        assert_eq!(parent_path("/a"), "/");
        assert!(
            is_within("/tmp/x", "/tmp") && is_within("/tmp", "/tmp") && !is_within("/tmpx", "/tmp")
        );
    }
}
