//! Test support: a guest process on a small image, given state through real system calls by the
//! tests that need one without booting anything.

use std::sync::Arc;

use crate::fs::{Image, Vfs, DEFAULT_OVERLAY_LIMIT};
use crate::image::format::{self, Entry, EntryKind, Index};
use crate::image::testdir::TempDir;
use crate::process::{AddressSpace, GuestProcess, ProcessConfig};

pub const MIB: u64 = 1 << 20;
/// The guest memory the process may use (its address space lies below it).
pub const MEM: u64 = 16 * MIB;

/// An image holding /, /etc and /etc/motd ("hello"), with /tmp and /work writable; removed with the TempDir.
pub fn test_image() -> (Arc<Image>, TempDir) {
    let dir = TempDir::new("process");
    let entry = |path: &str, kind| Entry {
        path: path.into(),
        mode: 0o755,
        mtime_sec: 0,
        mtime_nsec: 0,
        kind,
    };
    let mut index = Index {
        name: "process-test".into(),
        writable_dirs: vec!["/tmp".into(), "/work".into()],
        entries: vec![
            entry("/", EntryKind::Dir),
            entry("/etc", EntryKind::Dir),
            entry(
                "/etc/motd",
                EntryKind::File {
                    offset: 0,
                    size: 5,
                    sha256: [0; 32],
                },
            ),
        ],
    };
    format::write(&dir.0, &mut index, |_| Ok(b"hello".to_vec())).unwrap();
    (Image::open(&dir.0).unwrap(), dir)
}

/// A process on `image` in /work, "standard input" on its stdin, within `MEM`.
pub fn new_process(image: Arc<Image>) -> GuestProcess {
    let vfs = Vfs::new(image, DEFAULT_OVERLAY_LIMIT).unwrap();
    let config = ProcessConfig {
        vfs,
        cwd: "/work".into(),
        stdin: b"standard input".to_vec(),
        output_cap: 1 << 20,
        mem_limit: MEM,
        command: Default::default(),
    };
    GuestProcess::new(
        config,
        AddressSpace {
            brk_start: 4 * MIB,
            mmap_low: 4 * MIB,
            mmap_high: 14 * MIB,
        },
    )
}
