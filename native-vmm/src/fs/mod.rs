//! The guest's view of files: the read-only image plus a per-VM in-memory overlay.

use std::io;
use std::path::Path;
use std::sync::Arc;

/// A built, read-only file image (see `image` for how one is built).
pub struct Image {}

impl Image {
    /// Opens an image directory written by `sandfork-vmm image build`.
    pub fn open(_dir: &Path) -> io::Result<Arc<Image>> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "image format not implemented yet"))
    }

    /// The contents of a regular file in the image, following symlinks; None when absent.
    pub fn file_bytes(&self, _path: &str) -> Option<&[u8]> {
        None
    }
}
