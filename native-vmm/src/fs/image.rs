//! Reading a built image: the index is decoded into a node tree, the data file is mapped.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::errno::Errno;
use crate::image::format::{self, EntryKind, FormatError};
use crate::image::sha256;
use crate::memory::MappedFile;

use super::path::{self, Tree};
use super::vfs::Timespec;
use super::FileKind;

pub(crate) struct ImageNode {
    /// Absolute normalised path.
    pub path: String,
    /// Index of the parent directory (the root is its own parent).
    pub parent: u32,
    pub mode: u32,
    pub mtime: Timespec,
    pub kind: ImageKind,
}

pub(crate) enum ImageKind {
    File {
        offset: u64,
        size: u64,
        sha256: [u8; 32],
    },
    /// Children sorted by name (the index is sorted by path, which sorts siblings by name).
    Dir {
        children: Vec<u32>,
    },
    Symlink {
        target: String,
    },
}

impl ImageNode {
    pub fn name(&self) -> &str {
        match self.path.rfind('/') {
            Some(i) if self.path.len() > 1 => &self.path[i + 1..],
            _ => "/",
        }
    }

    pub fn file_kind(&self) -> FileKind {
        match self.kind {
            ImageKind::File { .. } => FileKind::Regular,
            ImageKind::Dir { .. } => FileKind::Directory,
            ImageKind::Symlink { .. } => FileKind::Symlink,
        }
    }
}

/// A built, read-only file image (see `crate::image` for how one is built).
pub struct Image {
    name: String,
    content_hash: [u8; 32],
    writable_dirs: Vec<String>,
    nodes: Vec<ImageNode>,
    /// Per node: whether its contents were checked against its hash yet (see `Check`).
    checked: Vec<AtomicU8>,
    data: MappedFile,
}

/// States of `Image::checked`.
#[repr(u8)]
enum Check {
    Unchecked = 0,
    Good = 1,
    Corrupt = 2,
}

impl Image {
    /// Opens an image directory written by `sandfork-vmm image build`. Checks the magic, version,
    /// both files' sizes, the content hash (over the index, which holds every file's hash) and
    /// the index's structure; a truncated or corrupted image is refused with an `InvalidData`
    /// error saying why. File contents are checked against their hashes when first read (a
    /// corrupted file reads as EIO); `verify_all` checks every file at once.
    pub fn open(dir: &Path) -> io::Result<Arc<Image>> {
        let describe =
            |e: io::Error| io::Error::new(e.kind(), format!("image {}: {e}", dir.display()));
        Self::open_checked(dir).map(Arc::new).map_err(describe)
    }

    fn open_checked(dir: &Path) -> io::Result<Image> {
        let index = std::fs::read(dir.join(format::INDEX_FILE))?;
        let header = format::decode_header(&index)?;
        if header.body_len > format::MAX_BODY_LEN {
            return Err(FormatError::Malformed {
                offset: 0,
                reason: format!("index body of {} bytes is too large", header.body_len),
            }
            .into());
        }
        let expected = format::HEADER_LEN as u64 + header.body_len;
        if index.len() as u64 != expected {
            return Err(FormatError::SizeMismatch {
                file: format::INDEX_FILE,
                expected,
                found: index.len() as u64,
            }
            .into());
        }
        let data = MappedFile::open(&dir.join(format::DATA_FILE))?;
        if data.bytes().len() as u64 != header.data_len {
            return Err(FormatError::SizeMismatch {
                file: format::DATA_FILE,
                expected: header.data_len,
                found: data.bytes().len() as u64,
            }
            .into());
        }
        let body = &index[format::HEADER_LEN..];
        if sha256::digest(body) != header.content_hash {
            return Err(FormatError::HashMismatch.into());
        }
        let decoded = format::decode_body(body, header.data_len)?;
        let nodes = build_tree(decoded.entries);
        let checked = nodes
            .iter()
            .map(|_| AtomicU8::new(Check::Unchecked as u8))
            .collect();
        Ok(Image {
            name: decoded.name,
            content_hash: header.content_hash,
            writable_dirs: decoded.writable_dirs,
            nodes,
            checked,
            data,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// SHA-256 over the index body and the data: the image's identity.
    pub fn content_hash(&self) -> [u8; 32] {
        self.content_hash
    }

    /// Directories that each VM gets as a writable in-memory overlay.
    pub fn writable_dirs(&self) -> &[String] {
        &self.writable_dirs
    }

    /// The contents of a regular file in the image, following symlinks; None when absent.
    /// (Writable directories belong to the overlay and are never found here.)
    /// A corrupted file is None too (and `verify_all` says which).
    pub fn file_bytes(&self, path: &str) -> Option<&[u8]> {
        let idx = path::resolve(self, 0, path.as_bytes(), true).ok()?;
        self.contents(idx).ok()
    }

    /// Checks every file against its hash (and that the padding after it is zero, since a
    /// mapping of its last page would show it); names the first corrupted file.
    pub fn verify_all(&self) -> io::Result<()> {
        for (idx, node) in self.nodes.iter().enumerate() {
            if let (ImageKind::File { .. }, Err(_)) = (&node.kind, self.contents(idx as u32)) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "image file {} does not match its hash: the image is corrupted",
                        node.path
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Bytes of the image's data file (every file's contents).
    pub(crate) fn data_size(&self) -> u64 {
        self.data.bytes().len() as u64
    }

    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn node(&self, idx: u32) -> &ImageNode {
        &self.nodes[idx as usize]
    }

    /// Exact lookup of a normalised path, without following symlinks.
    pub(crate) fn lookup(&self, path: &str) -> Option<u32> {
        self.nodes
            .binary_search_by(|n| n.path.as_bytes().cmp(path.as_bytes()))
            .ok()
            .map(|i| i as u32)
    }

    /// The contents of file node `idx`, checked against its hash on first use: EIO if
    /// corrupted, EISDIR for a directory, EINVAL for a symlink.
    pub(crate) fn contents(&self, idx: u32) -> Result<&[u8], Errno> {
        let (offset, size, expected) = match &self.node(idx).kind {
            ImageKind::File {
                offset,
                size,
                sha256,
            } => (*offset as usize, *size as usize, sha256),
            ImageKind::Dir { .. } => return Err(Errno::EISDIR),
            ImageKind::Symlink { .. } => return Err(Errno::EINVAL),
        };
        // The decoder checked offset + size against the data length.
        let bytes = self
            .data
            .bytes()
            .get(offset..offset + size)
            .ok_or(Errno::EIO)?;
        let state = &self.checked[idx as usize];
        match state.load(Ordering::Acquire) {
            s if s == Check::Good as u8 => Ok(bytes),
            s if s == Check::Corrupt as u8 => Err(Errno::EIO),
            _ => {
                let page_end = (format::align_up((offset + size) as u64) as usize)
                    .min(self.data.bytes().len());
                let padding_clean = self.data.bytes()[offset + size..page_end]
                    .iter()
                    .all(|&b| b == 0);
                // Racing first reads compute the same answer, so a plain store is enough.
                let good = padding_clean && sha256::digest(bytes) == *expected;
                state.store(
                    if good { Check::Good } else { Check::Corrupt } as u8,
                    Ordering::Release,
                );
                if good {
                    Ok(bytes)
                } else {
                    Err(Errno::EIO)
                }
            }
        }
    }
}

/// Turns the decoded (sorted, validated) entries into nodes with parent and child links.
fn build_tree(entries: Vec<format::Entry>) -> Vec<ImageNode> {
    let mut nodes: Vec<ImageNode> = Vec::with_capacity(entries.len());
    for e in entries {
        let idx = nodes.len() as u32;
        let parent = if idx == 0 {
            0
        } else {
            let parent_path = format::parent_path(&e.path);
            // Validated by the decoder: the parent is an earlier directory entry.
            nodes
                .binary_search_by(|n| n.path.as_str().cmp(parent_path))
                .map_or(0, |i| i as u32)
        };
        if idx != 0 {
            if let ImageKind::Dir { children } = &mut nodes[parent as usize].kind {
                children.push(idx);
            }
        }
        let kind = match e.kind {
            EntryKind::File {
                offset,
                size,
                sha256,
            } => ImageKind::File {
                offset,
                size,
                sha256,
            },
            EntryKind::Dir => ImageKind::Dir {
                children: Vec::new(),
            },
            EntryKind::Symlink { target } => ImageKind::Symlink { target },
        };
        nodes.push(ImageNode {
            path: e.path,
            parent,
            mode: e.mode,
            mtime: Timespec {
                sec: e.mtime_sec,
                nsec: e.mtime_nsec,
            },
            kind,
        });
    }
    nodes
}

impl Tree for Image {
    type Node = u32;

    fn root(&self) -> u32 {
        0
    }

    fn parent(&self, node: u32) -> Result<u32, Errno> {
        Ok(self.node(node).parent)
    }

    fn child(&self, dir: u32, name: &[u8]) -> Result<Option<u32>, Errno> {
        match &self.node(dir).kind {
            ImageKind::Dir { children } => Ok(children
                .binary_search_by(|&c| self.node(c).name().as_bytes().cmp(name))
                .ok()
                .map(|i| children[i])),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn kind(&self, node: u32) -> Result<FileKind, Errno> {
        Ok(self.node(node).file_kind())
    }

    fn link_target(&self, node: u32) -> Result<Vec<u8>, Errno> {
        match &self.node(node).kind {
            ImageKind::Symlink { target } => Ok(target.as_bytes().to_vec()),
            _ => Err(Errno::EINVAL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::format::{Entry, EntryKind, Header, Index};
    use crate::image::testdir::TempDir;

    /// Seeded corruptions of an image's index body, resealed (length and content hash made to
    /// match, so the decoder and the tree builder see the damage rather than the hash check), and
    /// of the header alone: each open is refused or gives an image whose every lookup, read and
    /// check answers, never a panic.
    #[test]
    fn corrupted_indexes_are_refused_or_open_to_a_usable_image() {
        // In memory: thousands of rewrites of the index on a disk cost seconds.
        let dir = TempDir::in_memory("image-fuzz");
        let entry = |path: &str, kind| Entry {
            path: path.into(),
            mode: 0o755,
            mtime_sec: 0,
            mtime_nsec: 0,
            kind,
        };
        let file = |path: &str, size| {
            entry(
                path,
                EntryKind::File {
                    offset: 0,
                    size,
                    sha256: [0; 32],
                },
            )
        };
        let symlink = |path: &str, target: &str| {
            entry(
                path,
                EntryKind::Symlink {
                    target: target.into(),
                },
            )
        };
        let mut index = Index {
            name: "fuzz".into(),
            writable_dirs: vec!["/tmp".into()],
            entries: vec![
                entry("/", EntryKind::Dir),
                entry("/bin", EntryKind::Dir),
                file("/bin/a", 5000),
                symlink("/bin/l", "a"),
                entry("/etc", EntryKind::Dir),
                file("/etc/x", 3),
                symlink("/lib", "/bin"),
                symlink("/loop", "/loop"),
            ],
        };
        format::write(&dir.0, &mut index, |e| {
            Ok(vec![b'z'; if e.path == "/bin/a" { 5000 } else { 3 }])
        })
        .unwrap();
        let index_path = dir.0.join(format::INDEX_FILE);
        let good = std::fs::read(&index_path).unwrap();
        let header = format::decode_header(&good).unwrap();
        let body = &good[format::HEADER_LEN..];
        let paths = [
            "/bin/a",
            "/bin/l",
            "/lib/a",
            "/lib/../etc/x",
            "/loop",
            "/etc/x",
            "/tmp",
            "/nothing",
        ];
        let (mut rng, cases) = crate::fuzz::start("image reader");
        let mut opened = 0;
        for case in 0..cases {
            let bytes = if case % 4 == 0 {
                crate::fuzz::mutate(&mut rng, &good)
            } else {
                let damaged = crate::fuzz::mutate(&mut rng, body);
                let sealed = Header {
                    body_len: damaged.len() as u64,
                    data_len: header.data_len,
                    content_hash: sha256::digest(&damaged),
                };
                [format::encode_header(&sealed).as_slice(), &damaged].concat()
            };
            std::fs::write(&index_path, &bytes).unwrap();
            let Ok(image) = Image::open(&dir.0) else {
                continue;
            };
            opened += 1;
            let _ = image.verify_all();
            for path in paths {
                let _ = image.file_bytes(path);
                if let Some(idx) = image.lookup(path) {
                    let _ = image.contents(idx);
                }
            }
            for idx in 0..image.node_count() as u32 {
                let _ = image.contents(idx);
            }
        }
        eprintln!("{cases} corrupted indexes: {opened} opened, the rest refused");
    }
}
