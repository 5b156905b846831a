//! One VM's file system: the shared read-only image with writable overlay mounts.
//!
//! The syscall layer keeps [`Node`]s in its fd table (and one for the working directory) and
//! calls the methods below; every method answers with an `Errno` on failure, never panics on
//! guest input. Reference counting: each successful [`Vfs::open`] must be paired with one
//! [`Vfs::close`] when the open file description is released (the last fd referring to it),
//! so an unlinked file stays readable while open.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::errno::Errno;

use super::devices::{pts_rdev, DevLink, Device, DEV_DIR, PTS_DIR};
use super::file_data::FileData;
use super::image::{Image, ImageKind};
use super::overlay::{Overlay, OverlayKind, NODE_CHARGE};
use super::path::{self, MagicTarget, Tree};
use super::procfs::{NoProcess, ProcNode, ProcessView, SystemDir};
use super::xattr::{self, Holder, SetMode, Target};
use super::{FileKind, W_OK, X_OK};
use crate::codec::{DecodeError, Decoder, Encoder};

/// A file, directory or symlink in one VM's file system (cheap to copy; opaque).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Node(NodeId);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum NodeId {
    Image(u32),
    Overlay(u64),
    /// The synthetic /dev directory and its devices (devices.rs).
    DevDir,
    Device(Device),
    /// /dev/fd, /dev/stdin, /dev/stdout and /dev/stderr (symbolic links into /proc/self/fd).
    DevLink(DevLink),
    /// /dev/pts and the slave of pseudo-terminal N in it (listed while it is in use:
    /// `ProcessView::terminals`).
    PtsDir,
    Pts(u32),
    /// The synthetic /proc (procfs.rs).
    Proc(ProcNode),
}

impl Node {
    /// The root directory.
    pub const ROOT: Node = Node(NodeId::Image(0));
}

/// The synthetic /proc's name under the root.
const PROC_DIR: &[u8] = b"proc";
/// /proc's inode numbers start here (above /dev's, below the overlay's).
const PROC_INO_BASE: u64 = 3 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

/// What fstat/newfstatat/statx report. Owner is root. An image file keeps its host mtime
/// (Python compares it with the .pyc header); an overlay node's times are real (made, last
/// changed, or set by the guest: `Vfs::set_times`); /dev and /proc report [`SYNTHETIC_TIME`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub dev: u64,
    pub ino: u64,
    /// S_IFMT bits plus permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    pub blksize: u32,
    /// 512-byte blocks.
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
}

/// Fixed timestamp of /dev's and /proc's nodes (2024-01-01T00:00:00Z).
pub const SYNTHETIC_TIME: Timespec = Timespec {
    sec: 1_704_067_200,
    nsec: 0,
};
const DEVICE: u64 = 0x53;
const BLOCK_SIZE: u32 = 4096;
/// Overlay inode numbers start here, above any image inode.
const OVERLAY_INO_BASE: u64 = 1 << 32;
/// /dev and its devices have inode numbers from here (image inodes are u32 indexes + 1, far
/// fewer than 2^31).
const DEV_INO_BASE: u64 = 1 << 31;

/// What statfs/fstatfs report for the file system holding a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    /// f_type: the Linux magic number of the file system kind.
    pub magic: u64,
    pub block_size: u64,
    pub blocks: u64,
    /// Free blocks (also what an unprivileged user may use: nothing is reserved).
    pub free_blocks: u64,
    pub files: u64,
    pub free_files: u64,
    pub fsid: u64,
    pub read_only: bool,
}

const TMPFS_MAGIC: u64 = 0x0102_1994;
const SQUASHFS_MAGIC: u64 = 0x7371_7368;
const PROC_SUPER_MAGIC: u64 = 0x9fa0;

/// One getdents64 record's worth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: FileKind,
}

/// The open(2) flags the file system cares about (the syscall layer decodes O_* bits).
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// O_RDONLY or O_RDWR: on the overlay the owner's read bit is needed.
    pub read: bool,
    /// O_WRONLY or O_RDWR.
    pub write: bool,
    pub create: bool,
    /// O_EXCL (with create).
    pub exclusive: bool,
    /// O_TRUNC (applied only when writing).
    pub truncate: bool,
    /// O_DIRECTORY.
    pub directory: bool,
    /// O_NOFOLLOW: a final symlink gives ELOOP (or, with `path_only`, is the file opened).
    pub nofollow: bool,
    /// O_PATH: the file is only named (no I/O), so a symlink itself may be opened.
    pub path_only: bool,
    /// Permission bits for a created file (umask already applied).
    pub mode: u32,
}

/// Where a writable mount point is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MountParent {
    /// An image directory (the template's writable directories).
    Image(u32),
    /// The synthetic /dev (/dev/shm).
    Dev,
}

/// /dev/shm: a writable directory in the overlay, as tmpfs is on Linux.
const SHM_NAME: &[u8] = b"shm";

struct Mount {
    /// The directory holding the mount point.
    parent: MountParent,
    name: Vec<u8>,
    root: u64,
    path: String,
}

/// One VM's file system. `Clone` copies the overlay (for a fork) and shares the image.
#[derive(Clone)]
pub struct Vfs {
    image: Arc<Image>,
    overlay: Overlay,
    mounts: Arc<Vec<Mount>>,
}

impl Vfs {
    /// A fresh file system over `image` with an empty overlay directory at each of the image's
    /// writable directories, holding at most `overlay_limit` bytes (see `DEFAULT_OVERLAY_LIMIT`).
    pub fn new(image: Arc<Image>, overlay_limit: u64) -> Result<Vfs, Errno> {
        let mut overlay = Overlay::new(overlay_limit);
        let mut mounts = Vec::new();
        for path in image.writable_dirs() {
            // The image decoder checked that the parent exists as a directory.
            let parent = image
                .lookup(crate::image::format::parent_path(path))
                .ok_or(Errno::ENOENT)?;
            let name = path
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .as_bytes()
                .to_vec();
            let root = overlay.add_mount_root(&name)?;
            mounts.push(Mount {
                parent: MountParent::Image(parent),
                name,
                root,
                path: path.clone(),
            });
        }
        let root = overlay.add_mount_root(SHM_NAME)?;
        mounts.push(Mount {
            parent: MountParent::Dev,
            name: SHM_NAME.to_vec(),
            root,
            path: "/dev/shm".to_owned(),
        });
        Ok(Vfs {
            image,
            overlay,
            mounts: Arc::new(mounts),
        })
    }

    pub fn image(&self) -> &Arc<Image> {
        &self.image
    }

    pub fn root(&self) -> Node {
        Node(NodeId::Image(0))
    }

    /// statfs of the file system holding `node`. The overlay (an in-memory file system, like
    /// tmpfs) reports its limit as its size and what is left of it as free, in blocks and in
    /// node charges (each node costs NODE_CHARGE bytes plus its data). The image is read-only
    /// and full: its data file's size, its node count, nothing free. /dev is an empty tmpfs.
    pub fn statfs(&self, node: Node) -> Result<FsStats, Errno> {
        self.kind(node)?;
        let block = u64::from(BLOCK_SIZE);
        Ok(match node.0 {
            NodeId::Overlay(_) => {
                let (limit, free) = (
                    self.overlay.limit(),
                    self.overlay.limit().saturating_sub(self.overlay.used()),
                );
                FsStats {
                    magic: TMPFS_MAGIC,
                    block_size: block,
                    blocks: limit / block,
                    free_blocks: free / block,
                    files: limit / NODE_CHARGE,
                    free_files: free / NODE_CHARGE,
                    fsid: 2,
                    read_only: false,
                }
            }
            NodeId::Image(_) => {
                let nodes = self.image.node_count() as u64;
                FsStats {
                    magic: SQUASHFS_MAGIC,
                    block_size: block,
                    blocks: self.image.data_size().div_ceil(block),
                    free_blocks: 0,
                    files: nodes,
                    free_files: 0,
                    fsid: 1,
                    read_only: true,
                }
            }
            NodeId::DevDir
            | NodeId::Device(_)
            | NodeId::DevLink(_)
            | NodeId::PtsDir
            | NodeId::Pts(_) => {
                let files = 2 + (Device::ALL.len() + DevLink::ALL.len()) as u64;
                FsStats {
                    magic: TMPFS_MAGIC,
                    block_size: block,
                    blocks: 0,
                    free_blocks: 0,
                    files,
                    free_files: 0,
                    fsid: 3,
                    read_only: false,
                }
            }
            NodeId::Proc(_) => FsStats {
                magic: PROC_SUPER_MAGIC,
                block_size: block,
                blocks: 0,
                free_blocks: 0,
                files: 0,
                free_files: 0,
                fsid: 4,
                read_only: true,
            },
        })
    }

    /// Resolves `path` relative to directory `base` (ignored for absolute paths). A final
    /// symlink is followed when `follow_last` (stat vs lstat, O_NOFOLLOW, AT_SYMLINK_NOFOLLOW).
    /// Errors: ENOENT, ENOTDIR, ELOOP (more than 40 links), ENAMETOOLONG.
    pub fn resolve(&self, base: Node, path: &[u8], follow_last: bool) -> Result<Node, Errno> {
        self.resolve_in(&NoProcess, base, path, follow_last)
    }

    /// `resolve` for a running program: /proc's fd, task and cwd entries come from `view`.
    pub fn resolve_in(
        &self,
        view: &dyn ProcessView,
        base: Node,
        path: &[u8],
        follow_last: bool,
    ) -> Result<Node, Errno> {
        path::resolve(&Lookup { vfs: self, view }, base, path, follow_last)
    }

    /// openat: resolves or creates per `opts`; on success the node is held open until `close`.
    /// Writing anything in the image gives EROFS, a directory opened for writing EISDIR.
    pub fn open(&mut self, base: Node, path: &[u8], opts: &OpenOptions) -> Result<Node, Errno> {
        self.open_in(&NoProcess, base, path, opts)
    }

    /// `open` for a running program (see `resolve_in`).
    pub fn open_in(
        &mut self,
        view: &dyn ProcessView,
        base: Node,
        path: &[u8],
        opts: &OpenOptions,
    ) -> Result<Node, Errno> {
        if opts.create && opts.directory {
            // Linux (since 6.4) refuses O_CREAT|O_DIRECTORY outright.
            return Err(Errno::EINVAL);
        }
        let (node, created) = if opts.create {
            // Through the program's /proc (its fds, its cwd), as resolve_in is.
            let lookup = Lookup { vfs: self, view };
            let (dir, name) = path::resolve_parent(&lookup, base, path)?;
            let existing = lookup.child(dir, &name)?;
            match existing {
                Some(_) if opts.exclusive => return Err(Errno::EEXIST),
                Some(_) => (self.resolve_in(view, base, path, !opts.nofollow)?, false),
                // O_CREAT never makes a directory ("new/" or ".").
                None if name == b"." || name == b".." || path.last() == Some(&b'/') => {
                    return Err(Errno::EISDIR)
                }
                None => {
                    let dir_id = self.changeable_dir(dir)?;
                    (
                        Node(NodeId::Overlay(self.overlay.create(
                            dir_id,
                            &name,
                            opts.mode,
                            OverlayKind::File(FileData::Bytes(Vec::new())),
                        )?)),
                        true,
                    )
                }
            }
        } else {
            (self.resolve_in(view, base, path, !opts.nofollow)?, false)
        };
        let kind = self.kind(node)?;
        if kind == FileKind::Symlink && !opts.path_only {
            // A followed fd link to a pipe or the like: the caller reopens its object.
            if !opts.nofollow && matches!(node.0, NodeId::Proc(ProcNode::Fd(..))) {
                return Ok(node);
            }
            return Err(Errno::ELOOP);
        }
        if opts.create && kind == FileKind::Directory {
            return Err(Errno::EISDIR);
        }
        if opts.directory && kind != FileKind::Directory {
            return Err(Errno::ENOTDIR);
        }
        // A socket's file is reached through connect(2), not open(2) (O_PATH still opens it).
        if kind == FileKind::Socket && !opts.path_only {
            return Err(Errno::ENXIO);
        }
        // Its owner, the guest, may read an overlay file or list a directory only with the
        // owner's read bit (a file it just created is open whatever its mode, as on Linux).
        if opts.read && !created {
            if let NodeId::Overlay(id) = node.0 {
                if self.overlay.get(id)?.mode & 0o400 == 0 {
                    return Err(Errno::EACCES);
                }
            }
        }
        if opts.write {
            if kind == FileKind::Directory {
                return Err(Errno::EISDIR);
            }
            // /proc's files have no write bit for anyone (Linux: EACCES, not EROFS).
            if let NodeId::Proc(_) = node.0 {
                return Err(Errno::EACCES);
            }
            // Devices are writable; O_TRUNC does nothing to them, as on Linux.
            if kind != FileKind::CharDevice {
                let id = self.overlay_id(node)?;
                // Its owner, the guest, may write only with the owner's write bit (a file it
                // just created is open whatever its mode, as on Linux).
                if !created && self.overlay.get(id)?.mode & 0o200 == 0 {
                    return Err(Errno::EACCES);
                }
                // O_TRUNC does nothing to a FIFO either.
                if opts.truncate && kind != FileKind::Fifo {
                    self.overlay.truncate(id, 0)?;
                }
            }
        }
        if let NodeId::Overlay(id) = node.0 {
            self.overlay.open(id)?;
        }
        Ok(node)
    }

    /// Releases a node returned by `open` (frees an unlinked overlay file on its last close).
    pub fn close(&mut self, node: Node) {
        if let NodeId::Overlay(id) = node.0 {
            self.overlay.close(id);
        }
    }

    pub fn kind(&self, node: Node) -> Result<FileKind, Errno> {
        match node.0 {
            NodeId::Image(i) => Ok(self.image_node(i)?.file_kind()),
            NodeId::Overlay(id) => Ok(self.overlay.get(id)?.file_kind()),
            NodeId::DevDir | NodeId::PtsDir => Ok(FileKind::Directory),
            NodeId::Device(_) | NodeId::Pts(_) => Ok(FileKind::CharDevice),
            NodeId::DevLink(_) => Ok(FileKind::Symlink),
            NodeId::Proc(p) => Ok(p.kind()),
        }
    }

    /// The /proc node a node is, if it is one.
    pub fn proc_node(&self, node: Node) -> Option<ProcNode> {
        match node.0 {
            NodeId::Proc(p) => Some(p),
            _ => None,
        }
    }

    /// The device a node is, if it is one of /dev's.
    pub fn device(&self, node: Node) -> Option<Device> {
        match node.0 {
            NodeId::Device(device) => Some(device),
            _ => None,
        }
    }

    /// The pseudo-terminal whose slave a node is (/dev/pts/N), if it is one.
    pub fn pts(&self, node: Node) -> Option<u32> {
        match node.0 {
            NodeId::Pts(n) => Some(n),
            _ => None,
        }
    }

    /// /dev/pts/N's node (whether terminal N is in use is the caller's to know).
    pub fn pts_node(n: u32) -> Node {
        Node(NodeId::Pts(n))
    }

    /// The node of one of /dev's devices.
    pub fn device_node(device: Device) -> Node {
        Node(NodeId::Device(device))
    }

    pub fn stat(&self, node: Node) -> Result<Stat, Errno> {
        let (ino, kind, perm, size, mtime, subdirs) = match node.0 {
            NodeId::Image(i) => {
                let n = self.image_node(i)?;
                let (size, subdirs) = match &n.kind {
                    ImageKind::File { size, .. } => (*size, 0),
                    ImageKind::Dir { children } => {
                        let dirs = children
                            .iter()
                            .filter(|&&c| self.image.node(c).file_kind() == FileKind::Directory)
                            .count();
                        let synthetic = |name| {
                            usize::from(
                                i == 0 && self.image.child(0, name).ok().flatten().is_none(),
                            )
                        };
                        (
                            u64::from(BLOCK_SIZE),
                            dirs + synthetic(DEV_DIR)
                                + synthetic(PROC_DIR)
                                + self
                                    .mounts
                                    .iter()
                                    .filter(|m| m.parent == MountParent::Image(i))
                                    .count(),
                        )
                    }
                    ImageKind::Symlink { target } => (target.len() as u64, 0),
                };
                (ino(node), n.file_kind(), n.mode, size, n.mtime, subdirs)
            }
            NodeId::Overlay(id) => {
                let n = self.overlay.get(id)?;
                let (size, subdirs) = match &n.kind {
                    OverlayKind::File(data) => (data.len(), 0),
                    OverlayKind::Socket | OverlayKind::Fifo => (0, 0),
                    OverlayKind::Dir(entries) => {
                        let dirs = entries
                            .values()
                            .filter(|&&c| {
                                self.overlay
                                    .get(c)
                                    .is_ok_and(|c| c.file_kind() == FileKind::Directory)
                            })
                            .count();
                        (u64::from(BLOCK_SIZE), dirs)
                    }
                    OverlayKind::Symlink(target) => (target.len() as u64, 0),
                };
                (ino(node), n.file_kind(), n.mode, size, n.mtime, subdirs)
            }
            NodeId::DevDir => (
                ino(node),
                FileKind::Directory,
                0o755,
                u64::from(BLOCK_SIZE),
                SYNTHETIC_TIME,
                self.mounts
                    .iter()
                    .filter(|m| m.parent == MountParent::Dev)
                    .count(),
            ),
            NodeId::Device(_) => (ino(node), FileKind::CharDevice, 0o666, 0, SYNTHETIC_TIME, 0),
            NodeId::DevLink(link) => (
                ino(node),
                FileKind::Symlink,
                0o777,
                link.target().len() as u64,
                SYNTHETIC_TIME,
                0,
            ),
            NodeId::PtsDir => (ino(node), FileKind::Directory, 0o755, 0, SYNTHETIC_TIME, 0),
            // A slave is its user's, writable by the tty group, as devpts makes it.
            NodeId::Pts(_) => (ino(node), FileKind::CharDevice, 0o620, 0, SYNTHETIC_TIME, 0),
            // /proc's files read as size 0 (they are made when read); nlink 2 for every
            // directory (its subdirectories change as threads come and go).
            NodeId::Proc(p) => {
                let perm = match p.kind() {
                    FileKind::Directory => 0o555,
                    FileKind::Symlink => 0o777,
                    _ => 0o444,
                };
                (ino(node), p.kind(), perm, 0, SYNTHETIC_TIME, 0)
            }
        };
        let nlink = match (kind, node.0) {
            (FileKind::Directory, _) => 2 + subdirs as u32,
            (_, NodeId::Overlay(id)) => u32::from(self.overlay.get(id)?.links),
            _ => 1,
        };
        Ok(Stat {
            dev: DEVICE,
            ino,
            mode: kind.mode_bits() | perm,
            nlink,
            // The guest (an unprivileged user) owns what it wrote; the image and /dev are root's.
            uid: if self.owned_by_guest(node) {
                crate::abi::GUEST_UID as u32
            } else {
                0
            },
            gid: if self.owned_by_guest(node) {
                crate::abi::GUEST_GID as u32
            } else {
                0
            },
            rdev: match node.0 {
                NodeId::Pts(n) => pts_rdev(n),
                _ => self.device(node).map_or(0, Device::rdev),
            },
            size,
            blksize: BLOCK_SIZE,
            blocks: size.div_ceil(512),
            // The image keeps one time per file; the overlay an access time of its own.
            atime: match node.0 {
                NodeId::Overlay(id) => self.overlay.get(id)?.atime,
                _ => mtime,
            },
            mtime,
            ctime: mtime,
        })
    }

    /// The guest (an unprivileged user) owns what it wrote and its own /proc directory; the
    /// image, /dev and the rest of /proc are root's.
    fn owned_by_guest(&self, node: Node) -> bool {
        match node.0 {
            NodeId::Overlay(_) | NodeId::Pts(_) => true,
            NodeId::Proc(p) => p.of_process(),
            _ => false,
        }
    }

    /// The whole contents of a regular file (for mmap and exec): EISDIR for a directory,
    /// EINVAL for a symlink, ENODEV for a device, EIO for an image file that does not match
    /// its hash.
    pub fn contents(&self, node: Node) -> Result<&[u8], Errno> {
        match node.0 {
            NodeId::Image(i) => {
                self.image_node(i)?;
                self.image.contents(i)
            }
            NodeId::Overlay(id) => match &self.overlay.get(id)?.kind {
                OverlayKind::File(data) => Ok(data.bytes()),
                OverlayKind::Dir(_) => Err(Errno::EISDIR),
                OverlayKind::Symlink(_) => Err(Errno::EINVAL),
                OverlayKind::Socket | OverlayKind::Fifo => Err(Errno::ENXIO),
            },
            NodeId::DevDir | NodeId::PtsDir => Err(Errno::EISDIR),
            // A /proc file's bytes are rendered per open (syscalls::procfs), not kept here.
            NodeId::Device(_) | NodeId::Pts(_) | NodeId::Proc(_) => Err(Errno::ENODEV),
            NodeId::DevLink(_) => Err(Errno::EINVAL),
        }
    }

    /// pread: copies from `offset` into `buf`, returns the byte count (0 at or past the end);
    /// a device fills `buf` its own way (the offset means nothing to it).
    pub fn read_at(&self, node: Node, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        if let NodeId::Device(device) = node.0 {
            return device.read(buf);
        }
        let data = self.contents(node)?;
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(data.len());
        let n = buf.len().min(data.len() - start);
        buf[..n].copy_from_slice(&data[start..start + n]);
        Ok(n)
    }

    /// pwrite into an overlay file (EROFS for image files, ENOSPC past the overlay limit); a
    /// device takes (and drops) everything.
    pub fn write_at(&mut self, node: Node, offset: u64, data: &[u8]) -> Result<usize, Errno> {
        if let NodeId::Device(_) = node.0 {
            return Ok(data.len());
        }
        let id = self.overlay_id(node)?;
        self.overlay.write(id, offset, data)
    }

    /// Whether `node` is in the writable overlay (its bytes can change).
    pub fn is_overlay(&self, node: Node) -> bool {
        matches!(node.0, NodeId::Overlay(_))
    }

    /// The shared memory that holds an overlay file's bytes from now on, for a writable shared
    /// mapping of it (ENODEV for an image file, which cannot change).
    pub fn share_file(&mut self, node: Node) -> Result<Arc<crate::memory::SharedMemory>, Errno> {
        let id = self.overlay_id(node).map_err(|_| Errno::ENODEV)?;
        self.overlay.share(id)
    }

    /// ftruncate/truncate of an overlay file.
    pub fn truncate(&mut self, node: Node, len: u64) -> Result<(), Errno> {
        let id = self.overlay_id(node)?;
        self.overlay.truncate(id, len)
    }

    /// utimensat of an overlay node's access and modification times (None: left as is; EROFS
    /// for the image).
    pub fn set_times(
        &mut self,
        node: Node,
        atime: Option<Timespec>,
        mtime: Option<Timespec>,
    ) -> Result<(), Errno> {
        let id = self.overlay_id(node)?;
        self.overlay.set_times(id, atime, mtime)
    }

    /// chmod/fchmod of an overlay node (EROFS for the image).
    pub fn chmod(&mut self, node: Node, mode: u32) -> Result<(), Errno> {
        let id = self.overlay_id(node)?;
        self.overlay.set_mode(id, mode)
    }

    /// getxattr: the value of attribute `name` of `subject` (None: a pipe, socket or other
    /// object of no file system); the errors are Linux's (see xattr.rs).
    pub fn get_xattr(&self, subject: Option<Node>, name: &[u8]) -> Result<Vec<u8>, Errno> {
        self.xattr_target(subject)?.check_read(name)?;
        self.stored_xattrs(subject)?
            .and_then(|attrs| attrs.get(name).cloned())
            .ok_or(Errno::ENODATA)
    }

    /// listxattr: the names of `subject`'s attributes, each ending in a NUL.
    pub fn list_xattrs(&self, subject: Option<Node>) -> Result<Vec<u8>, Errno> {
        Ok(xattr::list(self.stored_xattrs(subject)?))
    }

    /// setxattr: sets attribute `name` of `subject` to `value` per `mode`.
    pub fn set_xattr(
        &mut self,
        subject: Option<Node>,
        name: &[u8],
        value: &[u8],
        mode: SetMode,
    ) -> Result<(), Errno> {
        self.xattr_target(subject)?.check_change(name, false)?;
        let id = self.xattr_holder(subject)?;
        self.overlay.set_xattr(id, name, value, mode)
    }

    /// removexattr: removes attribute `name` of `subject` (ENODATA when it has none).
    pub fn remove_xattr(&mut self, subject: Option<Node>, name: &[u8]) -> Result<(), Errno> {
        if !self.xattr_target(subject)?.check_change(name, true)? {
            return Ok(());
        }
        let id = self.xattr_holder(subject)?;
        self.overlay.remove_xattr(id, name)
    }

    /// What the attribute rules need to know of `subject`.
    fn xattr_target(&self, subject: Option<Node>) -> Result<Target, Errno> {
        let Some(node) = subject else {
            return Ok(Target::STREAM);
        };
        let stat = self.stat(node)?;
        let owned = self.owned_by_guest(node);
        Ok(Target {
            kind: self.kind(node)?,
            access: if owned { stat.mode >> 6 } else { stat.mode } & 0o7,
            owned,
            sticky: stat.mode & 0o1000 != 0,
            read_only: matches!(node.0, NodeId::Image(_)),
            holder: match node.0 {
                NodeId::Overlay(_) => Holder::Stored,
                NodeId::Image(_) | NodeId::DevDir | NodeId::Device(_) | NodeId::DevLink(_) => {
                    Holder::Empty
                }
                // devpts, like procfs, keeps no attributes.
                NodeId::Proc(_) | NodeId::PtsDir | NodeId::Pts(_) => Holder::Unsupported,
            },
        })
    }

    /// The attributes `subject` keeps (None where it can keep none).
    fn stored_xattrs(&self, subject: Option<Node>) -> Result<Option<&xattr::Attributes>, Errno> {
        match subject.map(|n| n.0) {
            Some(NodeId::Overlay(id)) => Ok(Some(&self.overlay.get(id)?.xattrs)),
            _ => Ok(None),
        }
    }

    /// The overlay node a `user.` attribute that passed the checks is changed in: only an
    /// overlay node passes them, since every other node is read-only, refuses `user.` names,
    /// or has no attributes.
    fn xattr_holder(&self, subject: Option<Node>) -> Result<u64, Errno> {
        match subject.map(|n| n.0) {
            Some(NodeId::Overlay(id)) => Ok(id),
            _ => Err(Errno::EOPNOTSUPP),
        }
    }

    /// The entries of a directory, "." and ".." first, then by name; an image directory also
    /// lists the writable mounts it holds.
    pub fn read_dir(&self, node: Node) -> Result<Vec<DirEntry>, Errno> {
        self.read_dir_in(&NoProcess, node)
    }

    /// `read_dir` for a running program (/proc's fd and task directories list its own).
    pub fn read_dir_in(&self, view: &dyn ProcessView, node: Node) -> Result<Vec<DirEntry>, Errno> {
        if self.kind(node)? != FileKind::Directory {
            return Err(Errno::ENOTDIR);
        }
        let parent = self.parent(node)?;
        let mut entries = vec![
            DirEntry {
                name: b".".to_vec(),
                ino: ino(node),
                kind: FileKind::Directory,
            },
            DirEntry {
                name: b"..".to_vec(),
                ino: ino(parent),
                kind: FileKind::Directory,
            },
        ];
        let mut named: BTreeMap<Vec<u8>, Node> = BTreeMap::new();
        match node.0 {
            NodeId::Image(i) => {
                if let ImageKind::Dir { children } = &self.image_node(i)?.kind {
                    for &c in children {
                        named.insert(
                            self.image.node(c).name().as_bytes().to_vec(),
                            Node(NodeId::Image(c)),
                        );
                    }
                }
                if i == 0 {
                    named.insert(DEV_DIR.to_vec(), Node(NodeId::DevDir));
                    named.insert(
                        PROC_DIR.to_vec(),
                        Node(NodeId::Proc(ProcNode::Dir(SystemDir::Root))),
                    );
                }
                for m in self
                    .mounts
                    .iter()
                    .filter(|m| m.parent == MountParent::Image(i))
                {
                    named.insert(m.name.clone(), Node(NodeId::Overlay(m.root)));
                }
            }
            NodeId::DevDir => {
                for device in Device::ALL {
                    named.insert(device.name().to_vec(), Node(NodeId::Device(device)));
                }
                for link in DevLink::ALL {
                    named.insert(link.name().to_vec(), Node(NodeId::DevLink(link)));
                }
                named.insert(PTS_DIR.to_vec(), Node(NodeId::PtsDir));
                for m in self.mounts.iter().filter(|m| m.parent == MountParent::Dev) {
                    named.insert(m.name.clone(), Node(NodeId::Overlay(m.root)));
                }
            }
            NodeId::PtsDir => {
                for n in view.terminals() {
                    named.insert(n.to_string().into_bytes(), Node(NodeId::Pts(n)));
                }
            }
            NodeId::Device(_) | NodeId::DevLink(_) | NodeId::Pts(_) => {}
            // Listed in /proc's own order (the pid before the names), not sorted by name.
            NodeId::Proc(p) => {
                for (name, child) in p.entries(view) {
                    let child = Node(NodeId::Proc(child));
                    entries.push(DirEntry {
                        name,
                        ino: ino(child),
                        kind: self.kind(child)?,
                    });
                }
            }
            NodeId::Overlay(id) => {
                if let OverlayKind::Dir(children) = &self.overlay.get(id)?.kind {
                    for (name, &c) in children {
                        named.insert(name.clone(), Node(NodeId::Overlay(c)));
                    }
                }
            }
        }
        for (name, child) in named {
            entries.push(DirEntry {
                name,
                ino: ino(child),
                kind: self.kind(child)?,
            });
        }
        Ok(entries)
    }

    /// readlink: the target of a symlink node (EINVAL for anything else).
    pub fn readlink(&self, node: Node) -> Result<Vec<u8>, Errno> {
        self.readlink_in(&NoProcess, node)
    }

    /// `readlink` for a running program: /proc's exe, cwd and fd links show its own files.
    pub fn readlink_in(&self, view: &dyn ProcessView, node: Node) -> Result<Vec<u8>, Errno> {
        Lookup { vfs: self, view }.link_target(node)
    }

    /// The absolute path of a node (getcwd, /proc/self/fd style answers). An unlinked overlay
    /// file keeps the path it had when unlinked.
    pub fn path_of(&self, node: Node) -> Result<Vec<u8>, Errno> {
        match node.0 {
            NodeId::Image(i) => Ok(self.image_node(i)?.path.as_bytes().to_vec()),
            NodeId::Overlay(mut id) => {
                let mut names: Vec<Vec<u8>> = Vec::new();
                loop {
                    let n = self.overlay.get(id)?;
                    match n.parent {
                        Some(p) => {
                            names.push(n.name.clone());
                            id = p;
                        }
                        None => break,
                    }
                }
                let Some(mount) = self.mounts.iter().find(|m| m.root == id) else {
                    // A file in no directory (a memfd) is named as Linux names it: "/" and
                    // its name.
                    if !names.is_empty() {
                        return Err(Errno::ENOENT);
                    }
                    return Ok([b"/", &self.overlay.get(id)?.name[..]].concat());
                };
                let mut out = mount.path.as_bytes().to_vec();
                for name in names.iter().rev() {
                    out.push(b'/');
                    out.extend_from_slice(name);
                }
                Ok(out)
            }
            NodeId::DevDir => Ok([b"/", DEV_DIR].concat()),
            NodeId::Device(device) => Ok([b"/", DEV_DIR, b"/", device.name()].concat()),
            NodeId::DevLink(link) => Ok([b"/", DEV_DIR, b"/", link.name()].concat()),
            NodeId::PtsDir => Ok([b"/", DEV_DIR, b"/", PTS_DIR].concat()),
            NodeId::Pts(n) => Ok(format!("/dev/pts/{n}").into_bytes()),
            NodeId::Proc(p) => {
                let mut names = Vec::new();
                let mut cur = p;
                while let Some(parent) = cur.parent() {
                    let name = parent
                        .entries(&NoProcess)
                        .into_iter()
                        .find(|(_, c)| *c == cur)
                        .map(|(n, _)| n);
                    // A process's, thread's or fd's entry is a number (not listed without a
                    // process).
                    names.push(name.or_else(|| cur.number_name()).unwrap_or_default());
                    cur = parent;
                }
                let mut out = [b"/", PROC_DIR].concat();
                for name in names.iter().rev() {
                    out.push(b'/');
                    out.extend_from_slice(name);
                }
                Ok(out)
            }
        }
    }

    /// The path a /proc link shows for `node`: its path, marked " (deleted)" once an overlay
    /// file is unlinked, as Linux marks it.
    fn link_path(&self, node: Node) -> Option<Vec<u8>> {
        let mut path = self.path_of(node).ok()?;
        if let NodeId::Overlay(id) = node.0 {
            if self.overlay.get(id).ok()?.links == 0 {
                path.extend_from_slice(b" (deleted)");
            }
        }
        Some(path)
    }

    /// access/faccessat: W_OK needs the overlay or a device (EROFS); on the overlay, which the
    /// guest owns, each bit asked for needs the owner's permission bit (EACCES); elsewhere X_OK
    /// needs an execute bit on a non-directory and R_OK always passes.
    pub fn access(&self, node: Node, mode: u32) -> Result<(), Errno> {
        let stat = self.stat(node)?;
        if mode & W_OK != 0 && matches!(node.0, NodeId::Image(_) | NodeId::DevDir | NodeId::PtsDir)
        {
            return Err(Errno::EROFS);
        }
        if mode & W_OK != 0 && matches!(node.0, NodeId::Proc(_)) {
            return Err(Errno::EACCES);
        }
        if let NodeId::Overlay(_) = node.0 {
            let owner_bits = (stat.mode >> 6) & 0o7;
            return if mode & 0o7 & !owner_bits == 0 {
                Ok(())
            } else {
                Err(Errno::EACCES)
            };
        }
        if mode & X_OK != 0 && self.kind(node)? != FileKind::Directory && stat.mode & 0o111 == 0 {
            return Err(Errno::EACCES);
        }
        Ok(())
    }

    /// mkdirat (EEXIST if the name exists, EROFS outside the overlay). Like every call that
    /// changes the tree, it resolves `path` through `view`'s /proc (its cwd and fds), as
    /// `resolve_in` does; `&NoProcess` where no program asks.
    pub fn mkdir(
        &mut self,
        view: &dyn ProcessView,
        base: Node,
        path: &[u8],
        mode: u32,
    ) -> Result<(), Errno> {
        let (dir, name) = self.new_entry_dir(view, base, path)?;
        let dir_id = self.changeable_dir(dir)?;
        self.overlay
            .create(dir_id, &name, mode, OverlayKind::Dir(BTreeMap::new()))
            .map(|_| ())
    }

    /// memfd_create: an open overlay file in no directory, named `name` in /proc, with
    /// `seals` (F_SEAL_*); it counts against the overlay and goes at its last close.
    pub fn create_memfd(&mut self, name: &[u8], seals: u32) -> Result<Node, Errno> {
        let id = self.overlay.create_detached(name, seals)?;
        Ok(Node(NodeId::Overlay(id)))
    }

    /// F_ADD_SEALS on overlay file `node` (EINVAL for one that cannot be sealed).
    pub fn add_seals(&mut self, node: Node, seals: u32) -> Result<(), Errno> {
        let id = self.overlay_id(node).map_err(|_| Errno::EINVAL)?;
        self.overlay.add_seals(id, seals)
    }

    /// F_GET_SEALS: EINVAL for a file that cannot be sealed.
    pub fn seals(&self, node: Node) -> Result<u32, Errno> {
        let id = self.overlay_id(node).map_err(|_| Errno::EINVAL)?;
        self.overlay.get(id)?.seals.ok_or(Errno::EINVAL)
    }

    /// bind(2) of a Unix socket to `path`: its file (EEXIST when the name is taken, which bind
    /// answers as EADDRINUSE).
    pub fn make_socket(
        &mut self,
        view: &dyn ProcessView,
        base: Node,
        path: &[u8],
        mode: u32,
    ) -> Result<Node, Errno> {
        let (dir, name) = self.new_entry_dir(view, base, path)?;
        let dir_id = self.changeable_dir(dir)?;
        self.overlay
            .create(dir_id, &name, mode, OverlayKind::Socket)
            .map(|id| Node(NodeId::Overlay(id)))
    }

    /// mknodat: a regular file, FIFO or socket file at `path` (EEXIST when the name is taken);
    /// device nodes are EPERM, as for an unprivileged user.
    pub fn mknod(
        &mut self,
        view: &dyn ProcessView,
        base: Node,
        path: &[u8],
        mode: u32,
        kind: FileKind,
    ) -> Result<(), Errno> {
        let kind = match kind {
            FileKind::Regular => OverlayKind::File(FileData::Bytes(Vec::new())),
            FileKind::Fifo => OverlayKind::Fifo,
            FileKind::Socket => OverlayKind::Socket,
            FileKind::CharDevice => return Err(Errno::EPERM),
            FileKind::Directory | FileKind::Symlink => return Err(Errno::EINVAL),
        };
        let (dir, name) = self.new_entry_dir(view, base, path)?;
        let dir_id = self.changeable_dir(dir)?;
        self.overlay.create(dir_id, &name, mode, kind).map(|_| ())
    }

    /// symlinkat: creates a symlink at `path` whose target is `target` (stored as given).
    pub fn symlink(
        &mut self,
        view: &dyn ProcessView,
        target: &[u8],
        base: Node,
        path: &[u8],
    ) -> Result<(), Errno> {
        if target.is_empty() {
            return Err(Errno::ENOENT);
        }
        if target.len() >= path::PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let (dir, name) = self.new_entry_dir(view, base, path)?;
        let dir_id = self.changeable_dir(dir)?;
        self.overlay
            .create(dir_id, &name, 0o777, OverlayKind::Symlink(target.to_vec()))
            .map(|_| ())
    }

    /// unlinkat without AT_REMOVEDIR: removes a file or symlink (EISDIR for a directory).
    pub fn unlink(&mut self, view: &dyn ProcessView, base: Node, path: &[u8]) -> Result<(), Errno> {
        let (dir, name, node) = self.existing_entry(view, base, path)?;
        if name == b"." || name == b".." || self.kind(node)? == FileKind::Directory {
            return Err(Errno::EISDIR);
        }
        let dir_id = self.changeable_dir(dir)?;
        self.overlay.unlink(dir_id, &name)
    }

    /// linkat: names overlay file `node` `new_path` as well (EXDEV for a file outside the
    /// overlay, whose bytes belong to the image; EPERM for a directory).
    pub fn link(
        &mut self,
        view: &dyn ProcessView,
        node: Node,
        new_base: Node,
        new_path: &[u8],
    ) -> Result<(), Errno> {
        let (new_dir, new_name) =
            path::resolve_parent(&Lookup { vfs: self, view }, new_base, new_path)?;
        if new_name.as_slice() == b"." || new_name.as_slice() == b".." {
            return Err(Errno::EEXIST);
        }
        if self.kind(node)? == FileKind::Directory {
            return Err(Errno::EPERM);
        }
        let new_dir_id = self.changeable_dir(new_dir)?;
        let NodeId::Overlay(id) = node.0 else {
            return Err(Errno::EXDEV);
        };
        self.overlay.link(id, new_dir_id, &new_name)
    }

    /// rmdir / unlinkat with AT_REMOVEDIR: removes an empty overlay directory.
    pub fn rmdir(&mut self, view: &dyn ProcessView, base: Node, path: &[u8]) -> Result<(), Errno> {
        let (dir, name, node) = self.existing_entry(view, base, path)?;
        match name.as_slice() {
            b"." => return Err(Errno::EINVAL),
            b".." => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        if self.kind(node)? != FileKind::Directory {
            return Err(Errno::ENOTDIR);
        }
        self.check_removable(node)?;
        if !self.is_empty_dir(node)? {
            return Err(Errno::ENOTEMPTY);
        }
        let dir_id = self.changeable_dir(dir)?;
        self.overlay.unlink(dir_id, &name)
    }

    /// renameat: moves an overlay entry, replacing a compatible target (a file replaces a file,
    /// a directory replaces an empty directory). Both sides must be in the overlay.
    pub fn rename(
        &mut self,
        view: &dyn ProcessView,
        old_base: Node,
        old_path: &[u8],
        new_base: Node,
        new_path: &[u8],
    ) -> Result<(), Errno> {
        let (old_dir, old_name, node) = self.existing_entry(view, old_base, old_path)?;
        let (new_dir, new_name) =
            path::resolve_parent(&Lookup { vfs: self, view }, new_base, new_path)?;
        for name in [&old_name, &new_name] {
            if name.as_slice() == b"." || name.as_slice() == b".." {
                return Err(Errno::EBUSY);
            }
        }
        self.check_removable(node)?;
        let old_dir_id = self.changeable_dir(old_dir)?;
        let new_dir_id = self.changeable_dir(new_dir)?;
        let id = self.overlay_id(node)?;
        let is_dir = self.kind(node)? == FileKind::Directory;
        if is_dir && self.is_ancestor_or_self(id, new_dir_id)? {
            return Err(Errno::EINVAL);
        }
        if let Some(target) = self.child(new_dir, &new_name)? {
            if target == node {
                return Ok(());
            }
            match (is_dir, self.kind(target)? == FileKind::Directory) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                (true, true) if !self.is_empty_dir(target)? => return Err(Errno::ENOTEMPTY),
                _ => {}
            }
            self.overlay.unlink(new_dir_id, &new_name)?;
        }
        self.overlay
            .relink(id, old_dir_id, &old_name, new_dir_id, &new_name)
    }

    // ---- helpers ----

    /// Node ids come only from this image, but a Node kept from another VM's Vfs (a bug
    /// elsewhere) must not index out of bounds.
    fn image_node(&self, i: u32) -> Result<&super::image::ImageNode, Errno> {
        if (i as usize) < self.image.node_count() {
            Ok(self.image.node(i))
        } else {
            Err(Errno::ENOENT)
        }
    }

    /// The overlay id of a node that may be modified: EROFS for image nodes and /dev.
    fn overlay_id(&self, node: Node) -> Result<u64, Errno> {
        match node.0 {
            NodeId::Overlay(id) => Ok(id),
            _ => Err(Errno::EROFS),
        }
    }

    /// The overlay id of a directory whose entries may change: EROFS outside the overlay,
    /// EACCES without its owner's (the guest's) write and search bits, as Linux checks them.
    fn changeable_dir(&self, dir: Node) -> Result<u64, Errno> {
        let id = self.overlay_id(dir)?;
        if self.overlay.get(id)?.mode & 0o300 != 0o300 {
            return Err(Errno::EACCES);
        }
        Ok(id)
    }

    /// The entry named by `path` without following a final symlink, with its parent and name.
    fn existing_entry(
        &self,
        view: &dyn ProcessView,
        base: Node,
        path: &[u8],
    ) -> Result<(Node, Vec<u8>, Node), Errno> {
        let lookup = Lookup { vfs: self, view };
        let (dir, name) = path::resolve_parent(&lookup, base, path)?;
        let node = match name.as_slice() {
            b"." => dir,
            b".." => self.parent(dir)?,
            _ => lookup.child(dir, &name)?.ok_or(Errno::ENOENT)?,
        };
        // "file/" names a directory that is not there.
        if path.last() == Some(&b'/') && self.kind(node)? != FileKind::Directory {
            return Err(Errno::ENOTDIR);
        }
        Ok((dir, name, node))
    }

    /// The directory and name of an entry `path` is to create: EEXIST where the name is taken.
    fn new_entry_dir(
        &self,
        view: &dyn ProcessView,
        base: Node,
        path: &[u8],
    ) -> Result<(Node, Vec<u8>), Errno> {
        let lookup = Lookup { vfs: self, view };
        let (dir, name) = path::resolve_parent(&lookup, base, path)?;
        if name == b"." || name == b".." || lookup.child(dir, &name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        Ok((dir, name))
    }

    /// Mount roots (and the image and /dev) cannot be removed or moved.
    fn check_removable(&self, node: Node) -> Result<(), Errno> {
        match node.0 {
            NodeId::Overlay(id) if self.mounts.iter().any(|m| m.root == id) => Err(Errno::EBUSY),
            NodeId::Image(_)
            | NodeId::DevDir
            | NodeId::Device(_)
            | NodeId::DevLink(_)
            | NodeId::PtsDir
            | NodeId::Pts(_)
            | NodeId::Proc(_) => Err(Errno::EROFS),
            NodeId::Overlay(_) => Ok(()),
        }
    }

    fn is_empty_dir(&self, node: Node) -> Result<bool, Errno> {
        Ok(self.read_dir(node)?.len() == 2)
    }

    fn is_ancestor_or_self(&self, ancestor: u64, mut id: u64) -> Result<bool, Errno> {
        loop {
            if id == ancestor {
                return Ok(true);
            }
            match self.overlay.get(id)?.parent {
                Some(p) => id = p,
                None => return Ok(false),
            }
        }
    }
}

/// The inode number of a node: image nodes count from 1, /dev from `DEV_INO_BASE`, overlay
/// nodes from `OVERLAY_INO_BASE`.
fn ino(node: Node) -> u64 {
    match node.0 {
        NodeId::Image(i) => u64::from(i) + 1,
        NodeId::DevDir => DEV_INO_BASE,
        NodeId::Device(device) => DEV_INO_BASE + 1 + u64::from(device.index()),
        NodeId::DevLink(link) => DEV_INO_BASE + 0x100 + u64::from(link.index()),
        // Below /proc's base: /dev/pts/N from 1 << 29 past /dev's.
        NodeId::PtsDir => DEV_INO_BASE + (1 << 29),
        NodeId::Pts(n) => DEV_INO_BASE + (1 << 29) + 1 + u64::from(n),
        NodeId::Overlay(id) => OVERLAY_INO_BASE + id,
        // Codes fit below 2^37 (procfs.rs): far from the overlay's numbers.
        NodeId::Proc(p) => PROC_INO_BASE + p.code(),
    }
}

/// Path lookups in one VM's file system as a running program sees it.
struct Lookup<'a> {
    vfs: &'a Vfs,
    view: &'a dyn ProcessView,
}

impl Tree for Lookup<'_> {
    type Node = Node;

    fn root(&self) -> Node {
        Node::ROOT
    }

    fn parent(&self, node: Node) -> Result<Node, Errno> {
        self.vfs.parent(node)
    }

    fn child(&self, dir: Node, name: &[u8]) -> Result<Option<Node>, Errno> {
        match dir.0 {
            NodeId::Proc(p) if p.kind() == FileKind::Directory => {
                Ok(p.child(self.view, name).map(|c| Node(NodeId::Proc(c))))
            }
            // A slave's name is its number written as Linux writes it ("0", never "00").
            NodeId::PtsDir => Ok(self
                .view
                .terminals()
                .into_iter()
                .find(|n| n.to_string().as_bytes() == name)
                .map(|n| Node(NodeId::Pts(n)))),
            // A name in an overlay directory is looked up only with its owner's (the guest's)
            // search bit, as Linux checks it for an unprivileged owner.
            NodeId::Overlay(id) if self.vfs.overlay.get(id)?.mode & 0o100 == 0 => {
                Err(Errno::EACCES)
            }
            _ => self.vfs.child(dir, name),
        }
    }

    fn kind(&self, node: Node) -> Result<FileKind, Errno> {
        self.vfs.kind(node)
    }

    fn link_target(&self, node: Node) -> Result<Vec<u8>, Errno> {
        match node.0 {
            NodeId::Proc(p) => p.link_text(self.view, |n| self.vfs.link_path(n)).ok_or(
                if p.kind() == FileKind::Symlink {
                    Errno::ENOENT
                } else {
                    Errno::EINVAL
                },
            ),
            _ => self.vfs.link_target(node),
        }
    }

    fn magic_target(&self, node: Node) -> Option<MagicTarget<Node>> {
        match node.0 {
            NodeId::Proc(p) => p.magic_target(self.view),
            _ => None,
        }
    }
}

impl Tree for Vfs {
    type Node = Node;

    fn root(&self) -> Node {
        Node::ROOT
    }

    fn parent(&self, node: Node) -> Result<Node, Errno> {
        match node.0 {
            NodeId::Image(i) => Ok(Node(NodeId::Image(self.image_node(i)?.parent))),
            NodeId::Overlay(id) => match self.overlay.get(id)?.parent {
                Some(p) => Ok(Node(NodeId::Overlay(p))),
                None => match self
                    .mounts
                    .iter()
                    .find(|m| m.root == id)
                    .ok_or(Errno::ENOENT)?
                    .parent
                {
                    MountParent::Image(i) => Ok(Node(NodeId::Image(i))),
                    MountParent::Dev => Ok(Node(NodeId::DevDir)),
                },
            },
            NodeId::DevDir => Ok(Node::ROOT),
            NodeId::Device(_) | NodeId::DevLink(_) | NodeId::PtsDir => Ok(Node(NodeId::DevDir)),
            NodeId::Pts(_) => Ok(Node(NodeId::PtsDir)),
            NodeId::Proc(p) => Ok(p
                .parent()
                .map_or(Node::ROOT, |parent| Node(NodeId::Proc(parent)))),
        }
    }

    /// A child as no program sees it: /proc's process parts are empty (see `Lookup`).
    fn child(&self, dir: Node, name: &[u8]) -> Result<Option<Node>, Errno> {
        match dir.0 {
            NodeId::Image(i) => {
                if let Some(m) = self
                    .mounts
                    .iter()
                    .find(|m| m.parent == MountParent::Image(i) && m.name == name)
                {
                    return Ok(Some(Node(NodeId::Overlay(m.root))));
                }
                if i == 0 && name == DEV_DIR {
                    return Ok(Some(Node(NodeId::DevDir)));
                }
                if i == 0 && name == PROC_DIR {
                    return Ok(Some(Node(NodeId::Proc(ProcNode::Dir(SystemDir::Root)))));
                }
                self.image_node(i)?;
                Ok(self.image.child(i, name)?.map(|c| Node(NodeId::Image(c))))
            }
            NodeId::Overlay(id) => Ok(self
                .overlay
                .child(id, name)?
                .map(|c| Node(NodeId::Overlay(c)))),
            NodeId::DevDir => match self
                .mounts
                .iter()
                .find(|m| m.parent == MountParent::Dev && m.name == name)
            {
                Some(m) => Ok(Some(Node(NodeId::Overlay(m.root)))),
                None if name == PTS_DIR => Ok(Some(Node(NodeId::PtsDir))),
                None => Ok(Device::by_name(name)
                    .map(|d| Node(NodeId::Device(d)))
                    .or_else(|| DevLink::by_name(name).map(|l| Node(NodeId::DevLink(l))))),
            },
            // Which slaves exist is the running program's to say (`Lookup`).
            NodeId::PtsDir => Ok(None),
            NodeId::Device(_) | NodeId::DevLink(_) | NodeId::Pts(_) => Err(Errno::ENOTDIR),
            NodeId::Proc(p) if p.kind() == FileKind::Directory => {
                Ok(p.child(&NoProcess, name).map(|c| Node(NodeId::Proc(c))))
            }
            NodeId::Proc(_) => Err(Errno::ENOTDIR),
        }
    }

    fn kind(&self, node: Node) -> Result<FileKind, Errno> {
        Vfs::kind(self, node)
    }

    fn link_target(&self, node: Node) -> Result<Vec<u8>, Errno> {
        match node.0 {
            NodeId::Image(i) => {
                self.image_node(i)?;
                self.image.link_target(i)
            }
            NodeId::Overlay(id) => match &self.overlay.get(id)?.kind {
                OverlayKind::Symlink(target) => Ok(target.clone()),
                _ => Err(Errno::EINVAL),
            },
            NodeId::DevLink(link) => Ok(link.target().to_vec()),
            NodeId::DevDir | NodeId::Device(_) | NodeId::PtsDir | NodeId::Pts(_) => {
                Err(Errno::EINVAL)
            }
            NodeId::Proc(_) => Lookup {
                vfs: self,
                view: &NoProcess,
            }
            .link_target(node),
        }
    }
}

// ---- template snapshots (crate::snapshot): the overlay and node references ----

impl Node {
    pub(crate) fn encode_state(&self, e: &mut Encoder) {
        match self.0 {
            NodeId::Image(i) => {
                e.u8(0);
                e.u32(i);
            }
            NodeId::Overlay(id) => {
                e.u8(1);
                e.u64(id);
            }
            NodeId::DevDir => e.u8(2),
            NodeId::Device(device) => {
                e.u8(3);
                e.u8(device.index());
            }
            NodeId::Proc(p) => {
                e.u8(4);
                e.u64(p.code());
            }
            NodeId::PtsDir => e.u8(5),
            // Only an open slave's description names one, and a snapshot holds none.
            NodeId::Pts(n) => {
                e.u8(6);
                e.u32(n);
            }
            NodeId::DevLink(link) => {
                e.u8(7);
                e.u8(link.index());
            }
        }
    }
}

impl Vfs {
    /// The overlay (the image is identified by the template's image hash, not stored).
    pub(crate) fn encode_state(&self, e: &mut Encoder) {
        self.overlay.encode_state(e);
    }

    /// A file system over `image` with the overlay `encode_state` wrote; the overlay must hold
    /// a directory at each of the image's writable mount points.
    pub(crate) fn decode_state(image: Arc<Image>, d: &mut Decoder) -> Result<Vfs, DecodeError> {
        let overlay = Overlay::decode_state(d)?;
        let mut vfs = Vfs::new(image, overlay.limit())
            .map_err(|e| DecodeError::new(format!("mounting the overlay: errno {}", e.0)))?;
        for mount in vfs.mounts.iter() {
            if !overlay
                .get(mount.root)
                .is_ok_and(|root| root.file_kind() == FileKind::Directory && root.parent.is_none())
            {
                return Err(DecodeError::new(format!(
                    "the overlay has no directory for the mount {}",
                    mount.path
                )));
            }
        }
        vfs.overlay = overlay;
        Ok(vfs)
    }

    /// A node `Node::encode_state` wrote; it must exist in this file system.
    pub(crate) fn decode_node(&self, d: &mut Decoder) -> Result<Node, DecodeError> {
        let node = match d.u8("node")? {
            0 => Node(NodeId::Image(d.u32("image node")?)),
            1 => Node(NodeId::Overlay(d.u64("overlay node")?)),
            2 => Node(NodeId::DevDir),
            3 => {
                let index = d.u8("device")?;
                Node(NodeId::Device(Device::from_index(index).ok_or_else(
                    || DecodeError::new(format!("device {index}")),
                )?))
            }
            4 => {
                let code = d.u64("proc node")?;
                Node(NodeId::Proc(ProcNode::from_code(code).ok_or_else(
                    || DecodeError::new(format!("proc node {code:#x}")),
                )?))
            }
            5 => Node(NodeId::PtsDir),
            7 => {
                let index = d.u8("dev link")?;
                Node(NodeId::DevLink(DevLink::from_index(index).ok_or_else(
                    || DecodeError::new(format!("dev link {index}")),
                )?))
            }
            t => return Err(DecodeError::new(format!("node tag {t}"))),
        };
        self.kind(node)
            .map_err(|_| DecodeError::new(format!("{node:?} does not exist")))?;
        Ok(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::format::{self, Entry, EntryKind, Index};
    use crate::image::testdir::TempDir;

    fn entry(path: &str, mode: u32, kind: EntryKind) -> Entry {
        Entry {
            path: path.into(),
            mode,
            mtime_sec: 1_600_000_000,
            mtime_nsec: 7,
            kind,
        }
    }

    fn file(path: &str, size: u64) -> Entry {
        entry(
            path,
            0o644,
            EntryKind::File {
                offset: 0,
                size,
                sha256: [0; 32],
            },
        )
    }

    fn link(path: &str, target: &str) -> Entry {
        entry(
            path,
            0o777,
            EntryKind::Symlink {
                target: target.into(),
            },
        )
    }

    /// Writes a small image straight through the format writer (independent of the builder).
    fn write_sample(dir: &std::path::Path) {
        let dir_entry = |p: &str| entry(p, 0o755, EntryKind::Dir);
        let mut index = Index {
            name: "sample".into(),
            writable_dirs: vec!["/tmp".into(), "/work".into()],
            entries: vec![
                dir_entry("/"),
                link("/bin", "usr/bin"),
                dir_entry("/etc"),
                file("/etc/passwd", 26),
                link("/lib", "/usr/lib"),
                link("/loop1", "loop2"),
                link("/loop2", "/loop1"),
                dir_entry("/usr"),
                dir_entry("/usr/bin"),
                entry(
                    "/usr/bin/prog",
                    0o755,
                    EntryKind::File {
                        offset: 0,
                        size: 5000,
                        sha256: [0; 32],
                    },
                ),
                file("/usr/empty", 0),
            ],
        };
        format::write(dir, &mut index, |e| {
            Ok(match e.path.as_str() {
                "/etc/passwd" => b"root:x:0:0:root:/root:/bin".to_vec(),
                "/usr/bin/prog" => (0..5000u32).map(|i| i as u8).collect(),
                _ => Vec::new(),
            })
        })
        .unwrap();
    }

    fn sample_vfs(limit: u64) -> (TempDir, Vfs) {
        let dir = TempDir::new("vfs");
        write_sample(&dir.0);
        let vfs = Vfs::new(Image::open(&dir.0).unwrap(), limit).unwrap();
        (dir, vfs)
    }

    fn read_all(vfs: &Vfs, node: Node) -> Vec<u8> {
        vfs.contents(node).unwrap().to_vec()
    }

    const RW_CREATE: OpenOptions = OpenOptions {
        read: true,
        write: true,
        create: true,
        exclusive: false,
        truncate: false,
        directory: false,
        nofollow: false,
        path_only: false,
        mode: 0o644,
    };
    const RO: OpenOptions = OpenOptions {
        read: true,
        write: false,
        create: false,
        exclusive: false,
        truncate: false,
        directory: false,
        nofollow: false,
        path_only: false,
        mode: 0,
    };

    #[test]
    fn image_files_resolve_through_symlinks() {
        let (_d, vfs) = sample_vfs(1 << 20);
        let root = vfs.root();
        let prog = vfs.resolve(root, b"/bin/prog", true).unwrap();
        assert_eq!(vfs.resolve(root, b"/usr/bin/prog", true).unwrap(), prog);
        let st = vfs.stat(prog).unwrap();
        assert_eq!((st.mode, st.size, st.nlink, st.uid), (0o100755, 5000, 1, 0));
        assert_eq!(
            st.mtime,
            Timespec {
                sec: 1_600_000_000,
                nsec: 7
            }
        );
        let mut buf = [0u8; 10];
        assert_eq!(vfs.read_at(prog, 4995, &mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], &[(4995u32 % 256) as u8, 132, 133, 134, 135]);
        assert_eq!(vfs.read_at(prog, u64::MAX, &mut buf).unwrap(), 0);
        assert_eq!(
            vfs.image().file_bytes("/bin/prog").map(<[u8]>::len),
            Some(5000)
        );
        assert_eq!(
            vfs.image().file_bytes("/etc/passwd"),
            Some(&b"root:x:0:0:root:/root:/bin"[..])
        );
        assert_eq!(vfs.image().file_bytes("/usr/bin"), None);
        // lstat sees the link itself.
        let bin = vfs.resolve(root, b"/bin", false).unwrap();
        assert_eq!(vfs.stat(bin).unwrap().mode, 0o120777);
        assert_eq!(vfs.readlink(bin).unwrap(), b"usr/bin");
        assert_eq!(vfs.readlink(prog), Err(Errno::EINVAL));
    }

    #[test]
    fn nothing_outside_the_image_is_visible() {
        let (_d, vfs) = sample_vfs(1 << 20);
        let root = vfs.root();
        assert_eq!(vfs.resolve(root, b"/etc/shadow", true), Err(Errno::ENOENT));
        // /proc is the VMM's own: no host entry (mem, another pid, a host file) exists in it,
        // nothing in it is writable, and it lists only what it makes.
        for absent in [
            &b"/proc/self/mem"[..],
            b"/proc/2",
            b"/proc/self/fd/0",
            b"/proc/kcore",
            b"/proc/sys/kernel/core_pattern",
            b"/proc/self/root",
        ] {
            assert_eq!(
                vfs.resolve(root, absent, true),
                Err(Errno::ENOENT),
                "{}",
                String::from_utf8_lossy(absent)
            );
        }
        let maps = vfs.resolve(root, b"/proc/self/maps", true).unwrap();
        assert_eq!(vfs.path_of(maps).unwrap(), b"/proc/1/maps");
        assert_eq!(
            vfs.contents(maps),
            Err(Errno::ENODEV),
            "made by the syscall layer, per open"
        );
        assert_eq!(vfs.access(maps, W_OK), Err(Errno::EACCES));
        assert_eq!(vfs.stat(maps).unwrap().mode, 0o100444);
        assert_eq!(vfs.statfs(maps).unwrap().magic, 0x9fa0);
        let proc_dir = vfs.resolve(root, b"/proc", true).unwrap();
        assert_eq!(vfs.resolve(proc_dir, b"..", true), Ok(root));
        assert_eq!(
            vfs.resolve(root, b"/proc/self/../self/status", true)
                .and_then(|n| vfs.path_of(n)),
            Ok(b"/proc/1/status".to_vec())
        );
        assert_eq!(
            vfs.readlink(vfs.resolve(root, b"/proc/self", false).unwrap()),
            Ok(b"1".to_vec())
        );
        let (_d, mut vfs) = sample_vfs(1 << 20);
        assert_eq!(
            vfs.mkdir(&NoProcess, root, b"/proc/x", 0o755),
            Err(Errno::EROFS)
        );
        assert_eq!(
            vfs.open(
                root,
                b"/proc/self/status",
                &OpenOptions { write: true, ..RO }
            ),
            Err(Errno::EACCES)
        );
        assert_eq!(vfs.open(root, b"/proc/new", &RW_CREATE), Err(Errno::EROFS));
        assert_eq!(
            vfs.unlink(&NoProcess, root, b"/proc/self/status"),
            Err(Errno::EROFS)
        );
        assert_eq!(vfs.rmdir(&NoProcess, root, b"/proc"), Err(Errno::EROFS));
        assert_eq!(vfs.resolve(root, b"/lib/x", true), Err(Errno::ENOENT));
        assert!(vfs.image().file_bytes("/etc/shadow").is_none());
    }

    #[test]
    fn loops_dotdot_and_limits() {
        let (_d, vfs) = sample_vfs(1 << 20);
        let root = vfs.root();
        assert_eq!(vfs.resolve(root, b"/loop1", true), Err(Errno::ELOOP));
        assert_eq!(vfs.resolve(root, b"/loop1/x", false), Err(Errno::ELOOP));
        let passwd = vfs.resolve(root, b"/etc/passwd", true).unwrap();
        assert_eq!(
            vfs.resolve(root, b"/../../../etc/passwd", true).unwrap(),
            passwd
        );
        let tmp = vfs.resolve(root, b"/tmp", true).unwrap();
        assert_eq!(
            vfs.resolve(tmp, b"../../etc/./passwd", true).unwrap(),
            passwd
        );
        assert_eq!(
            vfs.resolve(root, b"/etc/passwd/", true),
            Err(Errno::ENOTDIR)
        );
        let long = vec![b'a'; 300];
        assert_eq!(vfs.resolve(root, &long, true), Err(Errno::ENAMETOOLONG));
        assert_eq!(vfs.resolve(root, b"", true), Err(Errno::ENOENT));
        assert_eq!(vfs.path_of(passwd).unwrap(), b"/etc/passwd");
    }

    #[test]
    fn root_listing_merges_writable_mounts() {
        let (_d, vfs) = sample_vfs(1 << 20);
        let names: Vec<String> = vfs
            .read_dir(vfs.root())
            .unwrap()
            .iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .collect();
        assert_eq!(
            names,
            [
                ".", "..", "bin", "dev", "etc", "lib", "loop1", "loop2", "proc", "tmp", "usr",
                "work"
            ]
        );
        let entries = vfs.read_dir(vfs.root()).unwrap();
        assert_eq!(entries[2].kind, FileKind::Symlink);
        assert_eq!(entries[3].kind, FileKind::Directory);
        assert_eq!(entries[8].kind, FileKind::Directory);
        assert_eq!(entries[9].kind, FileKind::Directory);
        assert_eq!(entries[0].ino, entries[1].ino, "the root is its own parent");
        // Root nlink: 2 + dev, etc, proc, usr, tmp, work.
        assert_eq!(vfs.stat(vfs.root()).unwrap().nlink, 8);
        let passwd = vfs.resolve(vfs.root(), b"/etc/passwd", true).unwrap();
        assert_eq!(vfs.read_dir(passwd), Err(Errno::ENOTDIR));
    }

    #[test]
    fn image_is_read_only() {
        let (_d, mut vfs) = sample_vfs(1 << 20);
        let root = vfs.root();
        let w = OpenOptions { write: true, ..RO };
        assert_eq!(vfs.open(root, b"/etc/passwd", &w), Err(Errno::EROFS));
        assert_eq!(vfs.open(root, b"/etc/new", &RW_CREATE), Err(Errno::EROFS));
        assert_eq!(vfs.open(root, b"/etc", &w), Err(Errno::EISDIR));
        assert_eq!(
            vfs.mkdir(&NoProcess, root, b"/etc/d", 0o755),
            Err(Errno::EROFS)
        );
        assert_eq!(
            vfs.mkdir(&NoProcess, root, b"/etc", 0o755),
            Err(Errno::EEXIST)
        );
        assert_eq!(
            vfs.unlink(&NoProcess, root, b"/etc/passwd"),
            Err(Errno::EROFS)
        );
        assert_eq!(
            vfs.unlink(&NoProcess, root, b"/etc/nothing"),
            Err(Errno::ENOENT)
        );
        assert_eq!(
            vfs.rename(&NoProcess, root, b"/etc/passwd", root, b"/tmp/p"),
            Err(Errno::EROFS)
        );
        assert_eq!(
            vfs.rename(&NoProcess, root, b"/tmp", root, b"/tmp2"),
            Err(Errno::EBUSY)
        );
        assert_eq!(vfs.rmdir(&NoProcess, root, b"/work"), Err(Errno::EBUSY));
        let passwd = vfs.open(root, b"/etc/passwd", &RO).unwrap();
        assert_eq!(vfs.write_at(passwd, 0, b"x"), Err(Errno::EROFS));
        assert_eq!(vfs.access(passwd, W_OK), Err(Errno::EROFS));
        assert_eq!(vfs.access(passwd, X_OK), Err(Errno::EACCES));
        let prog = vfs.resolve(root, b"/bin/prog", true).unwrap();
        assert_eq!(vfs.access(prog, X_OK), Ok(()));
        assert_eq!(
            vfs.open(
                root,
                b"/bin",
                &OpenOptions {
                    nofollow: true,
                    ..RO
                }
            ),
            Err(Errno::ELOOP)
        );
        let link = vfs
            .open(
                root,
                b"/bin",
                &OpenOptions {
                    nofollow: true,
                    path_only: true,
                    ..RO
                },
            )
            .unwrap();
        assert_eq!(
            vfs.kind(link),
            Ok(FileKind::Symlink),
            "O_PATH|O_NOFOLLOW names the link itself"
        );
        assert_eq!(
            vfs.open(
                root,
                b"/etc/passwd",
                &OpenOptions {
                    directory: true,
                    ..RO
                }
            ),
            Err(Errno::ENOTDIR)
        );
        assert_eq!(
            vfs.open(
                root,
                b"/tmp",
                &OpenOptions {
                    write: false,
                    ..RW_CREATE
                }
            ),
            Err(Errno::EISDIR)
        );
        assert_eq!(vfs.open(root, b"/tmp/new/", &RW_CREATE), Err(Errno::EISDIR));
        assert_eq!(
            vfs.open(
                root,
                b"/tmp/new",
                &OpenOptions {
                    directory: true,
                    ..RW_CREATE
                }
            ),
            Err(Errno::EINVAL)
        );
        assert_eq!(
            vfs.resolve(root, b"/tmp/new", true),
            Err(Errno::ENOENT),
            "nothing was created"
        );
    }

    #[test]
    fn overlay_files_write_read_rename_unlink() {
        let (_d, mut vfs) = sample_vfs(1 << 20);
        let root = vfs.root();
        let work = vfs.resolve(root, b"/work", true).unwrap();
        let f = vfs.open(work, b"out.txt", &RW_CREATE).unwrap();
        assert_eq!(vfs.write_at(f, 0, b"hello").unwrap(), 5);
        assert_eq!(vfs.write_at(f, 8, b"!").unwrap(), 1);
        assert_eq!(read_all(&vfs, f), b"hello\0\0\0!");
        let st = vfs.stat(f).unwrap();
        assert_eq!((st.mode, st.size), (0o100644, 9));
        let made = st.atime;
        let at = |t: Timespec| (t.sec, t.nsec);
        assert!(
            made.sec > SYNTHETIC_TIME.sec && at(st.mtime) >= at(made),
            "{st:?}"
        );
        assert_eq!(vfs.path_of(f).unwrap(), b"/work/out.txt");
        assert_eq!(vfs.access(f, W_OK), Ok(()));
        vfs.chmod(f, 0o4755 | 0o170000).unwrap();
        assert_eq!(
            vfs.stat(f).unwrap().mode,
            0o104755,
            "only permission bits change"
        );
        assert_eq!(vfs.access(f, X_OK), Ok(()));
        vfs.chmod(f, 0o644).unwrap();
        let when = Timespec {
            sec: 1_800_000_000,
            nsec: 5,
        };
        vfs.set_times(f, None, Some(when)).unwrap();
        assert_eq!(
            (vfs.stat(f).unwrap().atime, vfs.stat(f).unwrap().mtime),
            (made, when)
        );
        let read = Timespec {
            sec: 1_700_000_000,
            nsec: 9,
        };
        vfs.set_times(f, Some(read), None).unwrap();
        assert_eq!(
            (vfs.stat(f).unwrap().atime, vfs.stat(f).unwrap().mtime),
            (read, when)
        );
        // A write, or a new entry in a directory, makes its modification time now: both are
        // set before the file was made first, and are at least that late after.
        vfs.set_times(f, None, Some(read)).unwrap();
        vfs.set_times(work, None, Some(read)).unwrap();
        vfs.write_at(f, 0, b"x").unwrap();
        assert!(
            at(vfs.stat(f).unwrap().mtime) >= at(made),
            "a write moves mtime"
        );
        let second = vfs.open(work, b"second.txt", &RW_CREATE).unwrap();
        vfs.close(second);
        assert!(
            at(vfs.stat(work).unwrap().mtime) >= at(made),
            "a new entry moves mtime"
        );
        vfs.unlink(&NoProcess, root, b"/work/second.txt").unwrap();
        assert_eq!(vfs.set_times(root, None, Some(when)), Err(Errno::EROFS));
        assert_eq!(vfs.chmod(root, 0o700), Err(Errno::EROFS));
        assert_eq!(
            vfs.open(
                root,
                b"/work/out.txt",
                &OpenOptions {
                    exclusive: true,
                    ..RW_CREATE
                }
            ),
            Err(Errno::EEXIST)
        );
        // O_TRUNC empties it.
        let again = vfs
            .open(
                root,
                b"/work/out.txt",
                &OpenOptions {
                    truncate: true,
                    ..RW_CREATE
                },
            )
            .unwrap();
        assert_eq!(again, f);
        assert_eq!(vfs.stat(f).unwrap().size, 0);
        vfs.write_at(f, 0, b"data").unwrap();

        vfs.mkdir(&NoProcess, root, b"/work/sub", 0o755).unwrap();
        assert_eq!(
            vfs.mkdir(&NoProcess, root, b"/work/sub", 0o755),
            Err(Errno::EEXIST)
        );
        vfs.rename(&NoProcess, work, b"out.txt", root, b"/work/sub/moved")
            .unwrap();
        assert_eq!(
            vfs.resolve(root, b"/work/out.txt", true),
            Err(Errno::ENOENT)
        );
        let moved = vfs.resolve(root, b"/work/sub/moved", true).unwrap();
        assert_eq!(moved, f);
        assert_eq!(vfs.path_of(f).unwrap(), b"/work/sub/moved");
        assert_eq!(read_all(&vfs, moved), b"data");
        let names: Vec<Vec<u8>> = vfs
            .read_dir(work)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, [b".".to_vec(), b"..".to_vec(), b"sub".to_vec()]);
        assert_eq!(vfs.stat(work).unwrap().nlink, 3);
        assert_eq!(
            vfs.rmdir(&NoProcess, root, b"/work/sub"),
            Err(Errno::ENOTEMPTY)
        );
        assert_eq!(
            vfs.rename(&NoProcess, root, b"/work/sub", root, b"/work/sub/inner"),
            Err(Errno::EINVAL)
        );
        // Cross-mount rename is allowed (one overlay); ".." from a mount root reaches the image.
        vfs.rename(&NoProcess, root, b"/work/sub", root, b"/tmp/sub")
            .unwrap();
        assert_eq!(
            vfs.resolve(root, b"/tmp/sub/moved/../../../etc/passwd", true),
            Err(Errno::ENOTDIR)
        );
        assert_eq!(
            vfs.resolve(root, b"/tmp/sub/../../etc/passwd", true),
            vfs.resolve(root, b"/etc/passwd", true)
        );

        // An unlinked open file stays readable until closed.
        assert_eq!(
            vfs.unlink(&NoProcess, root, b"/tmp/sub"),
            Err(Errno::EISDIR)
        );
        vfs.unlink(&NoProcess, root, b"/tmp/sub/moved").unwrap();
        assert_eq!(read_all(&vfs, f), b"data");
        vfs.close(f);
        assert_eq!(read_all(&vfs, f), b"data", "the second open still holds it");
        vfs.close(again);
        assert_eq!(vfs.stat(f), Err(Errno::ENOENT));
        let f2 = vfs.open(root, b"/tmp/sub/f2", &RW_CREATE).unwrap();
        vfs.close(f2);
        assert_eq!(
            vfs.unlink(&NoProcess, root, b"/tmp/sub/f2/"),
            Err(Errno::ENOTDIR)
        );
        assert_eq!(
            vfs.rename(&NoProcess, root, b"/tmp/sub/f2/", root, b"/tmp/f3"),
            Err(Errno::ENOTDIR)
        );
        vfs.unlink(&NoProcess, root, b"/tmp/sub/f2").unwrap();
        vfs.rmdir(&NoProcess, root, b"/tmp/sub/").unwrap();
        assert_eq!(vfs.rmdir(&NoProcess, root, b"/tmp/."), Err(Errno::EINVAL));
    }

    #[test]
    fn dev_shm_is_a_writable_overlay_directory() {
        let (_d, mut vfs) = sample_vfs(1 << 20);
        let root = vfs.root();
        let names: Vec<Vec<u8>> = vfs
            .read_dir(vfs.resolve(root, b"/dev", true).unwrap())
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(
            names,
            [
                &b"."[..],
                b"..",
                b"fd",
                b"null",
                b"ptmx",
                b"pts",
                b"random",
                b"shm",
                b"stderr",
                b"stdin",
                b"stdout",
                b"tty",
                b"urandom",
                b"zero"
            ]
        );
        let f = vfs.open(root, b"/dev/shm/sem.x", &RW_CREATE).unwrap();
        vfs.write_at(f, 0, b"x").unwrap();
        assert_eq!(vfs.path_of(f).unwrap(), b"/dev/shm/sem.x");
        assert_eq!(
            vfs.resolve(root, b"/dev/shm/../null", true),
            vfs.resolve(root, b"/dev/null", true)
        );
        assert_eq!(vfs.statfs(f).unwrap().magic, TMPFS_MAGIC);
        assert_eq!(
            vfs.stat(vfs.resolve(root, b"/dev", true).unwrap())
                .unwrap()
                .nlink,
            3
        );
        assert_eq!(vfs.rmdir(&NoProcess, root, b"/dev/shm"), Err(Errno::EBUSY));
        assert_eq!(
            vfs.stat(vfs.resolve(root, b"/dev/shm", true).unwrap())
                .unwrap()
                .mode,
            0o41777
        );
        // A fork's /dev/shm is its own, and a snapshot carries it.
        let mut e = Encoder::new();
        vfs.encode_state(&mut e);
        let bytes = e.into_bytes();
        let back = Vfs::decode_state(vfs.image().clone(), &mut Decoder::new(&bytes)).unwrap();
        assert_eq!(back.resolve(root, b"/dev/shm/sem.x", true), Ok(f));
    }

    #[test]
    fn a_directory_without_its_write_bit_keeps_its_entries() {
        let (_d, mut vfs) = sample_vfs(1 << 20);
        let root = vfs.root();
        vfs.mkdir(&NoProcess, root, b"/tmp/ro", 0o755).unwrap();
        let f = vfs.open(root, b"/tmp/ro/f", &RW_CREATE).unwrap();
        vfs.close(f);
        let ro = vfs.resolve(root, b"/tmp/ro", true).unwrap();
        vfs.chmod(ro, 0o555).unwrap();
        assert_eq!(vfs.open(root, b"/tmp/ro/g", &RW_CREATE), Err(Errno::EACCES));
        assert_eq!(
            vfs.mkdir(&NoProcess, root, b"/tmp/ro/d", 0o755),
            Err(Errno::EACCES)
        );
        assert_eq!(
            vfs.symlink(&NoProcess, b"x", root, b"/tmp/ro/l"),
            Err(Errno::EACCES)
        );
        assert_eq!(
            vfs.unlink(&NoProcess, root, b"/tmp/ro/f"),
            Err(Errno::EACCES)
        );
        assert_eq!(
            vfs.rename(&NoProcess, root, b"/tmp/ro/f", root, b"/tmp/f"),
            Err(Errno::EACCES)
        );
        assert_eq!(
            vfs.rename(&NoProcess, root, b"/work", root, b"/tmp/ro/w"),
            Err(Errno::EBUSY)
        );
        // Its files stay writable by their own bits.
        let f = vfs
            .open(root, b"/tmp/ro/f", &OpenOptions { write: true, ..RO })
            .unwrap();
        assert_eq!(vfs.write_at(f, 0, b"x"), Ok(1));
        vfs.chmod(ro, 0o755).unwrap();
        vfs.unlink(&NoProcess, root, b"/tmp/ro/f").unwrap();
    }

    #[test]
    fn reading_needs_the_owners_read_bit_and_looking_up_its_search_bit() {
        let (_d, mut vfs) = sample_vfs(1 << 20);
        let root = vfs.root();
        vfs.mkdir(&NoProcess, root, b"/tmp/hidden", 0o755).unwrap();
        // A file created without any bit is open all the same, as on Linux.
        let f = vfs
            .open(
                root,
                b"/tmp/hidden/f",
                &OpenOptions {
                    mode: 0,
                    ..RW_CREATE
                },
            )
            .unwrap();
        vfs.close(f);
        assert_eq!(vfs.open(root, b"/tmp/hidden/f", &RO), Err(Errno::EACCES));
        let write_only = OpenOptions {
            read: false,
            write: true,
            ..RO
        };
        let node = vfs.resolve(root, b"/tmp/hidden/f", true).unwrap();
        vfs.chmod(node, 0o200).unwrap();
        let f = vfs.open(root, b"/tmp/hidden/f", &write_only).unwrap();
        vfs.close(f);
        assert_eq!(vfs.open(root, b"/tmp/hidden/f", &RO), Err(Errno::EACCES));
        // A directory without its read bit cannot be opened to list it.
        let dir = vfs.resolve(root, b"/tmp/hidden", true).unwrap();
        vfs.chmod(dir, 0).unwrap();
        let listing = OpenOptions {
            directory: true,
            ..RO
        };
        assert_eq!(vfs.open(root, b"/tmp/hidden", &listing), Err(Errno::EACCES));
        vfs.chmod(dir, 0o755).unwrap();
        let d = vfs.open(root, b"/tmp/hidden", &listing).unwrap();
        vfs.close(d);
        // Without its search bit its names are not looked up, though it may be listed.
        vfs.chmod(dir, 0o600).unwrap();
        assert_eq!(
            vfs.resolve_in(&NoProcess, root, b"/tmp/hidden/f", true),
            Err(Errno::EACCES)
        );
        assert_eq!(
            vfs.open(root, b"/tmp/hidden/g", &RW_CREATE),
            Err(Errno::EACCES)
        );
        let d = vfs.open(root, b"/tmp/hidden", &listing).unwrap();
        vfs.close(d);
        vfs.chmod(dir, 0o755).unwrap();
    }

    #[test]
    fn rename_replaces_compatible_targets_only() {
        let (_d, mut vfs) = sample_vfs(1 << 20);
        let root = vfs.root();
        for p in [&b"/tmp/a"[..], b"/tmp/b"] {
            let n = vfs.open(root, p, &RW_CREATE).unwrap();
            vfs.write_at(n, 0, p).unwrap();
            vfs.close(n);
        }
        vfs.mkdir(&NoProcess, root, b"/tmp/d", 0o700).unwrap();
        assert_eq!(
            vfs.rename(&NoProcess, root, b"/tmp/a", root, b"/tmp/d"),
            Err(Errno::EISDIR)
        );
        assert_eq!(
            vfs.rename(&NoProcess, root, b"/tmp/d", root, b"/tmp/a"),
            Err(Errno::ENOTDIR)
        );
        vfs.rename(&NoProcess, root, b"/tmp/a", root, b"/tmp/b")
            .unwrap();
        let b = vfs.resolve(root, b"/tmp/b", true).unwrap();
        assert_eq!(read_all(&vfs, b), b"/tmp/a");
        vfs.rename(&NoProcess, root, b"/tmp/b", root, b"/tmp/b")
            .unwrap();
        assert_eq!(
            vfs.rename(&NoProcess, root, b"/tmp/none", root, b"/tmp/x"),
            Err(Errno::ENOENT)
        );
        assert_eq!(
            vfs.rename(&NoProcess, root, b"/tmp/b", root, b"/etc/b"),
            Err(Errno::EROFS)
        );
    }

    #[test]
    fn overlay_symlinks_and_fork_isolation() {
        let (_d, mut vfs) = sample_vfs(1 << 20);
        let root = vfs.root();
        vfs.symlink(&NoProcess, b"/etc/passwd", root, b"/tmp/pw")
            .unwrap();
        let passwd = vfs.resolve(root, b"/etc/passwd", true).unwrap();
        assert_eq!(vfs.resolve(root, b"/tmp/pw", true).unwrap(), passwd);
        assert_eq!(
            vfs.symlink(&NoProcess, b"x", root, b"/etc/x"),
            Err(Errno::EROFS)
        );
        let mut fork = vfs.clone();
        let f = fork.open(root, b"/tmp/only-in-fork", &RW_CREATE).unwrap();
        fork.write_at(f, 0, b"x").unwrap();
        assert_eq!(fork.resolve(root, b"/tmp/only-in-fork", true), Ok(f));
        assert_eq!(
            vfs.resolve(root, b"/tmp/only-in-fork", true),
            Err(Errno::ENOENT)
        );
    }

    #[test]
    fn overlay_limit_gives_enospc() {
        let (_d, mut vfs) = sample_vfs(8192);
        let root = vfs.root();
        let f = vfs.open(root, b"/tmp/big", &RW_CREATE).unwrap();
        assert_eq!(vfs.write_at(f, 0, &[1u8; 8192]), Err(Errno::ENOSPC));
        assert_eq!(vfs.write_at(f, 1 << 40, b"x"), Err(Errno::ENOSPC));
        assert_eq!(vfs.write_at(f, 0, &[1u8; 4096]).unwrap(), 4096);
        assert!(vfs.overlay.used() <= 8192);
        // Many empty files hit the limit too (each node is charged).
        let mut made = 0;
        let err = loop {
            match vfs.open(root, format!("/tmp/f{made}").as_bytes(), &RW_CREATE) {
                Ok(_) => made += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(err, Errno::ENOSPC);
        assert!(made < 20);
    }

    #[test]
    fn corrupted_or_truncated_images_are_refused() {
        let dir = TempDir::new("corrupt");
        write_sample(&dir.0);
        assert!(Image::open(&dir.0).is_ok());
        let index_path = dir.0.join(format::INDEX_FILE);
        let data_path = dir.0.join(format::DATA_FILE);
        let index = std::fs::read(&index_path).unwrap();
        let data = std::fs::read(&data_path).unwrap();
        let check = |what: &str, expect: &str| {
            let err = Image::open(&dir.0)
                .err()
                .unwrap_or_else(|| panic!("{what}: accepted"));
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{what}: {err}");
            assert!(err.to_string().contains(expect), "{what}: {err}");
        };

        // A flipped data byte: the index is intact, so the image opens, but the damaged file
        // reads as EIO (and verify_all names it) while the others stay readable.
        for (at, damaged) in [
            (10usize, "/etc/passwd"),
            (4096 + 4999, "/usr/bin/prog"),
            (100, "/etc/passwd"),
        ] {
            let mut flipped = data.clone();
            flipped[at] ^= 1;
            std::fs::write(&data_path, &flipped).unwrap();
            let image = Image::open(&dir.0).unwrap();
            assert_eq!(image.file_bytes(damaged), None, "byte {at}");
            let err = image.verify_all().unwrap_err();
            assert!(err.to_string().contains(damaged), "{err}");
            let vfs = Vfs::new(image, 1 << 20).unwrap();
            let node = vfs.resolve(vfs.root(), damaged.as_bytes(), true).unwrap();
            assert_eq!(vfs.read_at(node, 0, &mut [0u8; 8]), Err(Errno::EIO));
            assert_eq!(
                vfs.read_at(node, 0, &mut [0u8; 8]),
                Err(Errno::EIO),
                "remembered"
            );
            let other = if damaged == "/etc/passwd" {
                "/usr/bin/prog"
            } else {
                "/etc/passwd"
            };
            assert!(vfs.image().file_bytes(other).is_some());
        }
        std::fs::write(&data_path, &data[..data.len() - 1]).unwrap();
        check("data truncated", "truncated");
        std::fs::write(&data_path, &data).unwrap();
        assert!(Image::open(&dir.0).unwrap().verify_all().is_ok());

        let mut body_flip = index.clone();
        *body_flip.last_mut().unwrap() ^= 0x40;
        std::fs::write(&index_path, &body_flip).unwrap();
        check("index body flipped", "hash mismatch");
        std::fs::write(&index_path, &index[..index.len() - 3]).unwrap();
        check("index truncated", "truncated");
        std::fs::write(&index_path, &index[..40]).unwrap();
        check("header truncated", "truncated");
        let mut magic = index.clone();
        magic[0] = b'Z';
        std::fs::write(&index_path, &magic).unwrap();
        check("bad magic", "bad magic");
        let mut version = index.clone();
        version[8] = 9;
        std::fs::write(&index_path, &version).unwrap();
        check("future version", "version 9");
        std::fs::write(&index_path, &index).unwrap();
        assert!(Image::open(&dir.0).is_ok());
        std::fs::remove_file(&data_path).unwrap();
        assert_eq!(
            Image::open(&dir.0).err().map(|e| e.kind()),
            Some(std::io::ErrorKind::NotFound)
        );
    }
}
