//! The guest's view of files: the read-only image plus a per-VM in-memory overlay.
//!
//! * [`Image`] is a built file image (see `crate::image` and ../../IMAGE.md), opened once and
//!   shared (`Arc`) by every VM of a template. The loader reads programs with
//!   [`Image::file_bytes`].
//! * [`Vfs`] is one VM's file system: the image plus a writable overlay mounted at the
//!   image's writable directories (for the Python template: `/tmp` and the working directory
//!   [`WORK_DIR`] = `/work`). Overlay contents are plain memory, counted against a per-VM limit
//!   (ENOSPC), and cloned with the VM for a fork.
//!
//! * `/proc` is synthetic and read-only: the process's own status, memory map, fds, threads and
//!   a few machine files, all made from the VM's state (procfs.rs, syscalls/procfs.rs).
//! * Extended attributes: `user.` ones on overlay files and directories, the other name spaces
//!   as Linux answers an unprivileged process (xattr.rs).
//! * `/dev` holds the character devices null, zero, random and urandom, served by the VMM
//!   ([`Device`]), ptmx and tty, opened as pseudo-terminal ends by the syscall layer, and the
//!   `pts` directory of the pseudo-terminals in use.
//!
//! Nothing outside the image is visible: the VMM never opens host paths for the guest.
//! Every operation takes guest bytes (paths, names) as untrusted and answers with an `Errno`.

mod devices;
mod file_data;
mod image;
mod overlay;
mod path;
mod procfs;
mod vfs;
mod xattr;

pub use devices::Device;
pub use image::Image;
pub(crate) use overlay::{
    F_SEAL_FUTURE_WRITE, F_SEAL_GROW, F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_WRITE,
};
pub use path::{MAX_SYMLINKS, NAME_MAX, PATH_MAX};
pub use procfs::{FdTarget, NoProcess, ProcNode, ProcessView, SystemFile, TaskFile};
pub use vfs::{DirEntry, FsStats, Node, OpenOptions, Stat, Timespec, Vfs};
pub use xattr::SetMode as XattrSetMode;
/// The extended attribute limits (XATTR_NAME_MAX, XATTR_SIZE_MAX, XATTR_LIST_MAX).
pub use xattr::{
    LIST_MAX as XATTR_LIST_MAX, NAME_MAX as XATTR_NAME_MAX, VALUE_MAX as XATTR_VALUE_MAX,
};

/// The working directory of template programs (a writable directory of the Python image).
pub const WORK_DIR: &str = "/work";

/// Default per-VM overlay limit in bytes (file data plus a per-node charge).
pub const DEFAULT_OVERLAY_LIMIT: u64 = 64 << 20;

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    CharDevice,
    /// A bound Unix socket's file.
    Socket,
    /// A FIFO (named pipe).
    Fifo,
}

impl FileKind {
    /// The S_IFMT bits of st_mode.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::Regular => 0o100000,
            FileKind::Directory => 0o040000,
            FileKind::Symlink => 0o120000,
            FileKind::CharDevice => 0o020000,
            FileKind::Socket => 0o140000,
            FileKind::Fifo => 0o010000,
        }
    }

    /// The d_type of a getdents64 record (DT_REG, DT_DIR, DT_LNK, DT_CHR, DT_SOCK, DT_FIFO).
    pub fn dirent_type(self) -> u8 {
        match self {
            FileKind::Regular => 8,
            FileKind::Directory => 4,
            FileKind::Symlink => 10,
            FileKind::CharDevice => 2,
            FileKind::Socket => 12,
            FileKind::Fifo => 1,
        }
    }
}

/// access(2) mode bits.
pub const R_OK: u32 = 4;
pub const W_OK: u32 = 2;
pub const X_OK: u32 = 1;
