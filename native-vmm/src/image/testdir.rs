//! A temporary directory for tests, removed on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        TempDir::under(&std::env::temp_dir(), tag)
    }

    /// In /dev/shm where there is one (a tmpfs), for tests that rewrite files thousands of times.
    pub fn in_memory(tag: &str) -> TempDir {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            TempDir::under(shm, tag)
        } else {
            TempDir::new(tag)
        }
    }

    fn under(parent: &Path, tag: &str) -> TempDir {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = parent.join(format!(
            "sandfork-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
