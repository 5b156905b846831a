//! Reading a built image: the index is decoded into a node tree, the data file is mapped.

use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::errno::Errno;
use crate::image::format::{self, EntryKind, FormatError};
use crate::image::sha256::Sha256;
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
    File { offset: u64, size: u64 },
    /// Children sorted by name (the index is sorted by path, which sorts siblings by name).
    Dir { children: Vec<u32> },
    Symlink { target: String },
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
    data: MappedFile,
}

impl Image {
    /// Opens an image directory written by `sandfork-vmm image build`. Checks the magic, version,
    /// both files' sizes, the content hash over index body and data, and the index's structure;
    /// a truncated or corrupted image is refused with an `InvalidData` error saying why.
    pub fn open(dir: &Path) -> io::Result<Arc<Image>> {
        let describe = |e: io::Error| io::Error::new(e.kind(), format!("image {}: {e}", dir.display()));
        Self::open_checked(dir).map(Arc::new).map_err(describe)
    }

    fn open_checked(dir: &Path) -> io::Result<Image> {
        let index = std::fs::read(dir.join(format::INDEX_FILE))?;
        let header = format::decode_header(&index)?;
        if header.body_len > format::MAX_BODY_LEN {
            return Err(FormatError::Malformed { offset: 0, reason: format!("index body of {} bytes is too large", header.body_len) }.into());
        }
        let expected = format::HEADER_LEN as u64 + header.body_len;
        if index.len() as u64 != expected {
            return Err(FormatError::SizeMismatch { file: format::INDEX_FILE, expected, found: index.len() as u64 }.into());
        }
        let data = MappedFile::open(&dir.join(format::DATA_FILE))?;
        if data.bytes().len() as u64 != header.data_len {
            return Err(FormatError::SizeMismatch { file: format::DATA_FILE, expected: header.data_len, found: data.bytes().len() as u64 }.into());
        }
        let body = &index[format::HEADER_LEN..];
        let mut hash = Sha256::new();
        hash.update(body);
        hash.update(data.bytes());
        if hash.finish() != header.content_hash {
            return Err(FormatError::HashMismatch.into());
        }
        let decoded = format::decode_body(body, header.data_len)?;
        Ok(Image {
            name: decoded.name,
            content_hash: header.content_hash,
            writable_dirs: decoded.writable_dirs,
            nodes: build_tree(decoded.entries),
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
    pub fn file_bytes(&self, path: &str) -> Option<&[u8]> {
        let idx = path::resolve(self, 0, path.as_bytes(), true).ok()?;
        self.contents(idx)
    }

    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn node(&self, idx: u32) -> &ImageNode {
        &self.nodes[idx as usize]
    }

    /// Exact lookup of a normalised path, without following symlinks.
    pub(crate) fn lookup(&self, path: &str) -> Option<u32> {
        self.nodes.binary_search_by(|n| n.path.as_bytes().cmp(path.as_bytes())).ok().map(|i| i as u32)
    }

    pub(crate) fn contents(&self, idx: u32) -> Option<&[u8]> {
        match self.node(idx).kind {
            // The decoder checked offset + size against the data length.
            ImageKind::File { offset, size } => self.data.bytes().get(offset as usize..(offset + size) as usize),
            _ => None,
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
            nodes.binary_search_by(|n| n.path.as_str().cmp(parent_path)).map_or(0, |i| i as u32)
        };
        if idx != 0 {
            if let ImageKind::Dir { children } = &mut nodes[parent as usize].kind {
                children.push(idx);
            }
        }
        let kind = match e.kind {
            EntryKind::File { offset, size } => ImageKind::File { offset, size },
            EntryKind::Dir => ImageKind::Dir { children: Vec::new() },
            EntryKind::Symlink { target } => ImageKind::Symlink { target },
        };
        nodes.push(ImageNode { path: e.path, parent, mode: e.mode, mtime: Timespec { sec: e.mtime_sec, nsec: e.mtime_nsec }, kind });
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
            ImageKind::Dir { children } => Ok(children.binary_search_by(|&c| self.node(c).name().as_bytes().cmp(name)).ok().map(|i| children[i])),
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
