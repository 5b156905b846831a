//! File descriptors and paths: reads and writes (stdin, captured output, pipes, files),
//! the fd table calls, and path calls answered by the VM's file system (`fs::Vfs`: the
//! read-only image plus the writable overlay; writes elsewhere are EROFS).
//!
//! The standard streams are not terminals: stdin is the run's input bytes, stdout and stderr
//! are captured; all three report themselves as FIFOs (ioctl TCGETS gives ENOTTY), so
//! programs choose block buffering. A program that wants a terminal opens a pseudo-terminal
//! (terminal.rs). A transfer that would block (a blocking read of an empty
//! pipe whose write end is still open, a blocking write to a full pipe) waits for another
//! thread to move the data (`syscalls::wait_ready`).

use super::procfs::{self, ProcessFacts};
use super::{value, wait_ready, SysResult, SyscallOutcome, UserMemory};
use crate::errno::Errno;
use crate::fs::{
    Device, DirEntry, FileKind, FsStats, Node, OpenOptions, ProcNode, ProcessView, Stat, Timespec,
    Vfs,
};
use crate::process::{
    Appended, Description, GuestProcess, Object, PipeError, O_ACCMODE, O_APPEND, O_NONBLOCK,
    O_RDONLY, O_WRONLY,
};
use crate::status::RunStatus;

/// Bytes moved by one read or write call at most (Linux also returns short counts); bounds
/// the host memory a single call can make the VMM allocate.
pub(super) const MAX_IO: u64 = 1 << 20;

pub(super) const AT_FDCWD: i32 = -100;
pub(super) const AT_SYMLINK_NOFOLLOW: u64 = 0x100;
const AT_REMOVEDIR: u64 = 0x200;
const AT_EACCESS: u64 = 0x200;
pub(super) const AT_EMPTY_PATH: u64 = 0x1000;
const AT_NO_AUTOMOUNT: u64 = 0x800;
const AT_STATX_SYNC_TYPE: u64 = 0x6000;

const O_CREAT: u64 = 0o100;
const O_EXCL: u64 = 0o200;
const O_TRUNC: u64 = 0o1000;
const O_DSYNC: u64 = 0o10000;
const O_DIRECT: u64 = 0o40000;
const O_LARGEFILE: u64 = 0o100000;
const O_DIRECTORY: u64 = 0o200000;
const O_NOFOLLOW: u64 = 0o400000;
const O_NOATIME: u64 = 0o1000000;
const O_CLOEXEC: u64 = 0o2000000;
pub(super) const O_PATH: u64 = 0o10000000;
const O_TMPFILE: u64 = 0o20000000;
/// Status flags kept on a description and shown by F_GETFL.
const STATUS_FLAGS: u64 = O_ACCMODE as u64
    | O_APPEND as u64
    | O_NONBLOCK as u64
    | O_DSYNC
    | O_DIRECT
    | O_NOATIME
    | O_PATH;

const S_IFIFO: u32 = 0o010000;
const S_IFSOCK: u32 = 0o140000;

// ---- helpers ----

pub(super) use super::fd_arg;

/// The directory a *at() path is relative to: the cwd for AT_FDCWD, else a directory fd.
fn base_dir(proc: &GuestProcess, dirfd: u64, path: &[u8]) -> Result<Node, Errno> {
    if path.first() == Some(&b'/') {
        return Ok(proc.config.vfs.root());
    }
    if dirfd as u32 as i32 == AT_FDCWD {
        return Ok(proc.cwd);
    }
    match proc.fds.get(fd_arg(dirfd))?.object {
        Object::Node(node) if proc.config.vfs.kind(node)? == FileKind::Directory => Ok(node),
        _ => Err(Errno::ENOTDIR),
    }
}

/// Resolves `path` from `base` as the program sees the file system (/proc shows its fds,
/// threads and working directory).
pub(super) fn resolve(
    proc: &GuestProcess,
    base: Node,
    path: &[u8],
    follow_last: bool,
) -> Result<Node, Errno> {
    proc.config
        .vfs
        .resolve_in(&ProcessFacts::of(proc), base, path, follow_last)
}

/// Runs `op` on the file system beside the program's view of /proc (built from the process's
/// other fields, so the file system can be borrowed mutably): opening and changing the tree
/// resolve paths as `resolve` does.
pub(super) fn with_view<T>(
    proc: &mut GuestProcess,
    op: impl FnOnce(&mut Vfs, &dyn ProcessView) -> Result<T, Errno>,
) -> Result<T, Errno> {
    let facts = ProcessFacts {
        pid: proc.pid,
        fds: &proc.fds,
        threads: &proc.threads,
        cwd: proc.cwd,
        exe: &proc.config.command.exe,
        tree: &proc.tree,
        parked: &proc.parked,
    };
    op(&mut proc.config.vfs, &facts)
}

/// Reads the path argument and the directory it is relative to.
pub(super) fn path_at(
    proc: &GuestProcess,
    user: &UserMemory,
    dirfd: u64,
    path: u64,
) -> Result<(Node, Vec<u8>), Errno> {
    let path = user.read_path(path)?;
    if path.is_empty() {
        return Err(Errno::ENOENT);
    }
    Ok((base_dir(proc, dirfd, &path)?, path))
}

/// What fstat reports for stdin, the captured streams, pipes, sockets and epoll instances:
/// an anonymous FIFO, socket or (epoll) typeless inode owned by root (the VMM made it), like
/// the files of the image; `id` is the description's.
fn stream_stat(id: u64, file_type: u32) -> Stat {
    let zero = Timespec::default();
    Stat {
        dev: 0xc,
        ino: 1000 + id,
        mode: file_type | 0o600,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        size: 0,
        blksize: 4096,
        blocks: 0,
        atime: zero,
        mtime: zero,
        ctime: zero,
    }
}

/// `struct stat` as x86-64 Linux lays it out (144 bytes).
fn stat_bytes(s: &Stat) -> [u8; 144] {
    let mut b = [0u8; 144];
    let mut put = |off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    put(0, s.dev);
    put(8, s.ino);
    put(16, u64::from(s.nlink));
    put(40, s.rdev);
    put(48, s.size);
    put(56, u64::from(s.blksize));
    put(64, s.blocks);
    for (off, t) in [(72, s.atime), (88, s.mtime), (104, s.ctime)] {
        put(off, t.sec as u64);
        put(off + 8, u64::from(t.nsec));
    }
    b[24..28].copy_from_slice(&s.mode.to_le_bytes());
    b[28..32].copy_from_slice(&s.uid.to_le_bytes());
    b[32..36].copy_from_slice(&s.gid.to_le_bytes());
    b
}

/// `struct statx` (256 bytes) with the basic fields (STATX_BASIC_STATS).
fn statx_bytes(s: &Stat) -> [u8; 256] {
    const STATX_BASIC_STATS: u32 = 0x7ff;
    let mut b = [0u8; 256];
    b[0..4].copy_from_slice(&STATX_BASIC_STATS.to_le_bytes());
    b[4..8].copy_from_slice(&s.blksize.to_le_bytes());
    b[16..20].copy_from_slice(&s.nlink.to_le_bytes());
    b[20..24].copy_from_slice(&s.uid.to_le_bytes());
    b[24..28].copy_from_slice(&s.gid.to_le_bytes());
    b[28..30].copy_from_slice(&(s.mode as u16).to_le_bytes());
    b[32..40].copy_from_slice(&s.ino.to_le_bytes());
    b[40..48].copy_from_slice(&s.size.to_le_bytes());
    b[48..56].copy_from_slice(&s.blocks.to_le_bytes());
    // atime, (btime left zero: not in the mask), ctime, mtime.
    for (off, t) in [(64, s.atime), (96, s.ctime), (112, s.mtime)] {
        b[off..off + 8].copy_from_slice(&t.sec.to_le_bytes());
        b[off + 8..off + 12].copy_from_slice(&t.nsec.to_le_bytes());
    }
    b[136..140].copy_from_slice(&((s.dev >> 8) as u32).to_le_bytes());
    b[140..144].copy_from_slice(&((s.dev & 0xff) as u32).to_le_bytes());
    b
}

pub(super) fn stat_of_fd(proc: &GuestProcess, fd: u64) -> Result<Stat, Errno> {
    stat_of_description(proc, proc.fds.description_id(fd)?, proc.fds.get(fd)?)
}

/// What fstat of a descriptor of `description` (description number `id`) reports.
fn stat_of_description(
    proc: &GuestProcess,
    id: usize,
    description: &Description,
) -> Result<Stat, Errno> {
    // An anonymous object's inode number is its description's (as /proc's fd links name it),
    // so a dup or a passed fd stats the same as the original.
    let id = id as u64;
    match description.object {
        Object::Node(node) => proc.config.vfs.stat(node),
        Object::Socket { .. } | Object::Endpoint(_) | Object::Inet(_) | Object::UnixDatagram(_) => {
            Ok(stream_stat(id, S_IFSOCK))
        }
        Object::Epoll(_) | Object::EventFd { .. } | Object::Pidfd(_) => Ok(stream_stat(id, 0)),
        // A slave stats as its /dev/pts node (ttyname compares the two), a master as /dev/ptmx.
        Object::TerminalMaster(_) => proc.config.vfs.stat(Vfs::device_node(Device::Ptmx)),
        Object::TerminalSlave(n) => proc.config.vfs.stat(Vfs::pts_node(n as u32)),
        Object::Stdin | Object::Output(_) | Object::PipeRead(_) | Object::PipeWrite(_) => {
            Ok(stream_stat(id, S_IFIFO))
        }
    }
}

// ---- reading and writing ----

/// The bytes of `data` from `pos` on, at most `max` of them (none from past its end).
pub(super) fn bytes_at(data: &[u8], pos: u64, max: usize) -> &[u8] {
    let start = pos.min(data.len() as u64) as usize;
    &data[start..start + (data.len() - start).min(max)]
}

/// Reads up to `len` bytes from `fd` into guest memory at `buf`; `at` is pread's offset.
fn read_fd(
    proc: &mut GuestProcess,
    user: &UserMemory,
    fd: u64,
    buf: u64,
    len: u64,
    at: Option<u64>,
) -> SysResult {
    let desc = proc.fds.get(fd)?;
    // An O_PATH descriptor only names a file: no I/O through it.
    if !desc.readable() || desc.flags & O_PATH as u32 != 0 {
        return Err(Errno::EBADF);
    }
    let len = len.min(MAX_IO);
    user.check(buf, len)?;
    let (object, offset, nonblocking) = (desc.object.clone(), desc.offset, desc.nonblocking());
    let n = match object {
        Object::Stdin => {
            if at.is_some() {
                return Err(Errno::ESPIPE);
            }
            let bytes = bytes_at(&proc.config.stdin, offset, len as usize);
            user.write(buf, bytes)?;
            bytes.len()
        }
        Object::PipeRead(pipe) | Object::Socket { rx: pipe, .. } => {
            if at.is_some() {
                return Err(Errno::ESPIPE);
            }
            return read_channel(proc, user, pipe, buf, len, nonblocking);
        }
        // A device (/dev/zero, /dev/urandom...) makes its bytes as they are read.
        Object::Node(node) if proc.config.vfs.device(node).is_some() => {
            let mut bytes = vec![0u8; len as usize];
            let n = proc.config.vfs.read_at(node, 0, &mut bytes)?;
            user.write(buf, &bytes[..n])?;
            n
        }
        Object::Node(node) => {
            // A directory's contents are its getdents64 records, not bytes to read.
            let data = match &desc.contents {
                Some(contents) if proc.config.vfs.kind(node)? != FileKind::Directory => contents,
                _ => proc.config.vfs.contents(node)?,
            };
            let bytes = bytes_at(data, at.unwrap_or(offset), len as usize);
            user.write(buf, bytes)?;
            bytes.len()
        }
        Object::EventFd { .. } => return super::eventfd::read(proc, user, fd, buf, len),
        Object::Inet(index) => {
            if at.is_some() {
                return Err(Errno::ESPIPE);
            }
            return super::inet::read(proc, user, index, &[(buf, len)], nonblocking);
        }
        Object::UnixDatagram(index) => {
            if at.is_some() {
                return Err(Errno::ESPIPE);
            }
            return super::unix_datagram::read(proc, user, index, &[(buf, len)], nonblocking);
        }
        Object::TerminalMaster(_) | Object::TerminalSlave(_) => {
            if at.is_some() {
                return Err(Errno::ESPIPE);
            }
            let end = super::terminal::end_of(&object).ok_or(Errno::EBADF)?;
            return super::terminal::read(proc, user, end, buf, len, nonblocking);
        }
        Object::Output(_) | Object::PipeWrite(_) => return Err(Errno::EBADF),
        Object::Epoll(_) | Object::Pidfd(_) => return Err(Errno::EINVAL),
        Object::Endpoint(_) => return Err(Errno::ENOTCONN),
    };
    if at.is_none() {
        proc.fds.get_mut(fd)?.offset = offset + n as u64;
    }
    value(n as u64)
}

/// Writes `len` bytes from guest memory at `buf` to `fd`; `at` is pwrite's offset.
fn write_fd(
    proc: &mut GuestProcess,
    user: &UserMemory,
    fd: u64,
    buf: u64,
    len: u64,
    at: Option<u64>,
) -> SysResult {
    let desc = proc.fds.get(fd)?;
    if !desc.writable() || desc.flags & O_PATH as u32 != 0 {
        return Err(Errno::EBADF);
    }
    user.check(buf, len)?;
    // Only what one call can take is copied out of guest memory.
    let take = match desc.object {
        Object::EventFd { .. } => return super::eventfd::write(proc, user, fd, buf, len),
        Object::Inet(index) => {
            if at.is_some() {
                return Err(Errno::ESPIPE);
            }
            let nonblocking = desc.nonblocking();
            return super::inet::write(proc, user, index, &[(buf, len)], nonblocking);
        }
        Object::UnixDatagram(index) => {
            if at.is_some() {
                return Err(Errno::ESPIPE);
            }
            let nonblocking = desc.nonblocking();
            return super::unix_datagram::send(proc, user, index, &[(buf, len)], nonblocking);
        }
        Object::Output(_) => len.min(proc.output.remaining()),
        Object::PipeWrite(pipe) | Object::Socket { tx: pipe, .. } => {
            len.min(proc.fds.pipe(pipe).map_or(0, |p| p.capacity()) as u64)
        }
        Object::Node(_) => len.min(MAX_IO),
        Object::TerminalMaster(i) => len.min(super::terminal::write_room(proc, (i, true)) as u64),
        Object::TerminalSlave(i) => len.min(super::terminal::write_room(proc, (i, false)) as u64),
        _ => 0,
    };
    let data = user.read_vec(buf, take)?;
    write_bytes(proc, fd, &data, len, at)
}

/// Writes `data` (the first part of a `requested`-byte write) to `fd`, which the caller checked
/// is open for writing; `at` is pwrite's offset. Shared by write(2) and the calls that move
/// bytes between fds inside the VMM (transfer.rs).
pub(super) fn write_bytes(
    proc: &mut GuestProcess,
    fd: u64,
    data: &[u8],
    requested: u64,
    at: Option<u64>,
) -> SysResult {
    let desc = proc.fds.get(fd)?;
    let (object, offset, flags) = (desc.object.clone(), desc.offset, desc.flags);
    match object {
        Object::Output(stream) => {
            if at.is_some() {
                return Err(Errno::ESPIPE);
            }
            match proc.output.append(stream, data) {
                Appended::All if data.len() as u64 == requested => value(requested),
                _ => Ok(SyscallOutcome::Stop(RunStatus::OutputLimit {
                    cap_bytes: proc.output.cap(),
                })),
            }
        }
        Object::PipeWrite(pipe)
        | Object::Socket {
            tx: pipe,
            shut_write: false,
            ..
        } => {
            if at.is_some() {
                return Err(Errno::ESPIPE);
            }
            write_channel_bytes(proc, pipe, data, flags & O_NONBLOCK != 0)
        }
        // SIGPIPE is never delivered: the write fails with EPIPE.
        Object::Socket {
            shut_write: true, ..
        } => Err(Errno::EPIPE),
        Object::Node(node) => {
            let mut pos = match at {
                Some(pos) => pos,
                None if flags & O_APPEND != 0 => proc.config.vfs.stat(node)?.size,
                None => offset,
            };
            let n = proc.config.vfs.write_at(node, pos, data)?;
            pos += n as u64;
            if at.is_none() {
                proc.fds.get_mut(fd)?.offset = pos;
            }
            value(n as u64)
        }
        Object::TerminalMaster(_) | Object::TerminalSlave(_) => {
            if at.is_some() {
                return Err(Errno::ESPIPE);
            }
            let end = super::terminal::end_of(&object).ok_or(Errno::EBADF)?;
            super::terminal::write(proc, end, data, flags & O_NONBLOCK != 0)
        }
        Object::Stdin | Object::PipeRead(_) => Err(Errno::EBADF),
        // An eventfd takes 8-byte counts from guest memory only (write_fd), an Internet socket
        // sends from guest memory only (inet.rs).
        Object::Epoll(_)
        | Object::EventFd { .. }
        | Object::Inet(_)
        | Object::UnixDatagram(_)
        | Object::Pidfd(_) => Err(Errno::EINVAL),
        Object::Endpoint(_) => Err(Errno::ENOTCONN),
    }
}

/// Reads up to `len` bytes of in-memory channel `pipe` (a pipe's read end, a socket's receive
/// side) into guest memory at `buf`.
pub(super) fn read_channel(
    proc: &mut GuestProcess,
    user: &UserMemory,
    pipe: usize,
    buf: u64,
    len: u64,
    nonblocking: bool,
) -> SysResult {
    user.check(buf, len.min(MAX_IO))?;
    match proc.fds.read_channel(pipe, len.min(MAX_IO) as usize)? {
        Ok((bytes, passed)) => {
            // Descriptions passed on a socket go with bytes read without a control buffer.
            proc.fds.discard(passed);
            proc.release(None);
            user.write(buf, &bytes)?;
            value(bytes.len() as u64)
        }
        Err(_) if nonblocking => Err(Errno::EAGAIN),
        Err(_) => wait_ready(proc, None),
    }
}

/// Writes what fits of `len` bytes at `buf` into in-memory channel `pipe` (a pipe's write
/// end, a socket's send side).
pub(super) fn write_channel(
    proc: &mut GuestProcess,
    user: &UserMemory,
    pipe: usize,
    buf: u64,
    len: u64,
    nonblocking: bool,
) -> SysResult {
    let data = user.read_vec(buf, len.min(proc.fds.pipe(pipe)?.capacity() as u64))?;
    write_channel_bytes(proc, pipe, &data, nonblocking)
}

/// Writes what fits of `data` into in-memory channel `pipe`.
pub(super) fn write_channel_bytes(
    proc: &mut GuestProcess,
    pipe: usize,
    data: &[u8],
    nonblocking: bool,
) -> SysResult {
    write_channel_passing(proc, pipe, data, &[], nonblocking)
}

/// Writes what fits of `data` into in-memory channel `pipe` (a socket's send side), passing
/// the descriptions of `fds` with the bytes written.
pub(super) fn write_channel_passing(
    proc: &mut GuestProcess,
    pipe: usize,
    data: &[u8],
    fds: &[u64],
    nonblocking: bool,
) -> SysResult {
    match proc.fds.write_passing(pipe, data, fds)? {
        Ok(n) => value(n as u64),
        Err(PipeError::NoReader) => Err(Errno::EPIPE),
        Err(PipeError::WouldBlock) if nonblocking => Err(Errno::EAGAIN),
        Err(PipeError::WouldBlock) => wait_ready(proc, None),
    }
}

/// read(fd, buf, count)
pub(crate) fn read(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    read_fd(proc, user, fd_arg(args[0]), args[1], args[2], None)
}

/// write(fd, buf, count)
pub(crate) fn write(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    write_fd(proc, user, fd_arg(args[0]), args[1], args[2], None)
}

/// A file offset or length argument (off_t): negative is EINVAL.
fn non_negative(pos: u64) -> Result<u64, Errno> {
    if (pos as i64) < 0 {
        Err(Errno::EINVAL)
    } else {
        Ok(pos)
    }
}

/// pread64(fd, buf, count, offset)
pub(crate) fn pread64(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    read_fd(
        proc,
        user,
        fd_arg(args[0]),
        args[1],
        args[2],
        Some(non_negative(args[3])?),
    )
}

/// pwrite64(fd, buf, count, offset)
pub(crate) fn pwrite64(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    write_fd(
        proc,
        user,
        fd_arg(args[0]),
        args[1],
        args[2],
        Some(non_negative(args[3])?),
    )
}

/// readv/writev and their positioned forms (`at`: the file offset the first buffer starts at,
/// the descriptor's offset left as it was): the buffers in order, stopping at the first short
/// transfer.
fn vectored(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
    writing: bool,
    at: Option<u64>,
) -> SysResult {
    let fd = fd_arg(args[0]);
    let desc = proc.fds.get(fd)?;
    let iovecs = user.read_iovecs(args[1], args[2])?;
    // A datagram socket moves the buffers in one call (one datagram, one receive).
    if let Object::UnixDatagram(index) = desc.object {
        if at.is_some() {
            return Err(Errno::ESPIPE);
        }
        let nonblocking = desc.nonblocking();
        return if writing {
            super::unix_datagram::send(proc, user, index, &iovecs, nonblocking)
        } else {
            super::unix_datagram::read(proc, user, index, &iovecs, nonblocking)
        };
    }
    if let Object::Inet(index) = desc.object {
        if at.is_some() {
            return Err(Errno::ESPIPE);
        }
        let nonblocking = desc.nonblocking();
        let allowed = if writing {
            desc.writable()
        } else {
            desc.readable()
        };
        if !allowed {
            return Err(Errno::EBADF);
        }
        return if writing {
            super::inet::write(proc, user, index, &iovecs, nonblocking)
        } else {
            super::inet::read(proc, user, index, &iovecs, nonblocking)
        };
    }
    let mut pos = at;
    transfer_each(&iovecs, |base, len| {
        let moved = if writing {
            write_fd(proc, user, fd, base, len, pos)
        } else {
            read_fd(proc, user, fd, base, len, pos)
        };
        if let (Some(p), Ok(SyscallOutcome::Return(n))) = (pos, &moved) {
            pos = Some(p + n);
        }
        moved
    })
}

/// Runs one transfer per (base, len) buffer in order and adds up the counts, stopping at the
/// first short one; an error after some bytes moved ends the call with what moved.
pub(super) fn transfer_each(
    iovecs: &[(u64, u64)],
    mut transfer: impl FnMut(u64, u64) -> SysResult,
) -> SysResult {
    let mut total = 0u64;
    for &(base, len) in iovecs {
        if len == 0 {
            continue;
        }
        match transfer(base, len) {
            Ok(SyscallOutcome::Return(n)) => {
                total += n;
                if n < len {
                    break;
                }
            }
            // A wait after some bytes moved: those are the answer (as Linux returns a short
            // count); before any, the call waits.
            Ok(SyscallOutcome::Block(_)) if total > 0 => break,
            // A stop (output cap) ends the run now; a wait waits.
            Ok(other) => return Ok(other),
            Err(e) if total == 0 => return Err(e),
            Err(_) => break,
        }
    }
    value(total)
}

/// readv(fd, iov, iovcnt)
pub(crate) fn readv(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    vectored(proc, user, args, false, None)
}

/// writev(fd, iov, iovcnt)
pub(crate) fn writev(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    vectored(proc, user, args, true, None)
}

/// preadv(fd, iov, iovcnt, pos_l, pos_h): on x86-64 the whole offset is in pos_l.
pub(crate) fn preadv(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    vectored(proc, user, args, false, Some(non_negative(args[3])?))
}

/// pwritev(fd, iov, iovcnt, pos_l, pos_h)
pub(crate) fn pwritev(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    vectored(proc, user, args, true, Some(non_negative(args[3])?))
}

/// RWF_HIPRI, RWF_DSYNC and RWF_SYNC: hints that change nothing for files held in memory.
const RWF_HINTS: u64 = 0x1 | 0x2 | 0x4;

/// The offset of preadv2/pwritev2: -1 is the descriptor's own; other flags than the hints
/// (RWF_NOWAIT, RWF_APPEND) are EOPNOTSUPP.
fn offset_v2(args: [u64; 6]) -> Result<Option<u64>, Errno> {
    if args[5] & !RWF_HINTS != 0 {
        return Err(Errno::EOPNOTSUPP);
    }
    match args[3] as i64 {
        -1 => Ok(None),
        _ => non_negative(args[3]).map(Some),
    }
}

/// preadv2(fd, iov, iovcnt, pos_l, pos_h, flags)
pub(crate) fn preadv2(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let at = offset_v2(args)?;
    vectored(proc, user, args, false, at)
}

/// pwritev2(fd, iov, iovcnt, pos_l, pos_h, flags)
pub(crate) fn pwritev2(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let at = offset_v2(args)?;
    vectored(proc, user, args, true, at)
}

/// The regular file an open descriptor names, for calls about a file's storage: a pipe or a
/// socket is ESPIPE, a directory or device ENODEV.
fn regular_file(proc: &GuestProcess, fd: u64) -> Result<Node, Errno> {
    match proc.fds.get(fd)?.object {
        Object::Node(node)
            if proc.config.vfs.device(node).is_none()
                && proc.config.vfs.kind(node)? == FileKind::Regular =>
        {
            Ok(node)
        }
        Object::Node(_) | Object::Epoll(_) | Object::EventFd { .. } | Object::Pidfd(_) => {
            Err(Errno::ENODEV)
        }
        _ => Err(Errno::ESPIPE),
    }
}

/// fadvise64(fd, offset, len, advice): a hint about a file's use; the files are in memory, so
/// a valid one changes nothing.
pub(crate) fn fadvise64(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    const POSIX_FADV_NOREUSE: u64 = 5;
    let desc = proc.fds.get(fd_arg(args[0]))?;
    if !matches!(desc.object, Object::Node(_)) {
        return Err(Errno::ESPIPE);
    }
    if (args[2] as i64) < 0 || args[3] > POSIX_FADV_NOREUSE {
        return Err(Errno::EINVAL);
    }
    value(0)
}

/// fallocate(fd, mode, offset, len): mode 0 makes the file at least offset+len bytes long (the
/// overlay stores every byte, so there is nothing else to reserve); the other modes (punching
/// holes, keeping the size) are EOPNOTSUPP, which glibc's posix_fallocate answers by writing.
pub(crate) fn fallocate(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [fd, mode, offset, len, ..] = args;
    let (offset, len) = (non_negative(offset)?, non_negative(len)?);
    if len == 0 {
        return Err(Errno::EINVAL);
    }
    let fd = fd_arg(fd);
    if !proc.fds.get(fd)?.writable() {
        return Err(Errno::EBADF);
    }
    let node = regular_file(proc, fd)?;
    if mode as u32 != 0 {
        return Err(Errno::EOPNOTSUPP);
    }
    let end = offset
        .checked_add(len)
        .filter(|e| *e as i64 >= 0)
        .ok_or(Errno::EFBIG)?;
    if end > proc.config.vfs.stat(node)?.size {
        proc.config.vfs.truncate(node, end)?;
    }
    value(0)
}

/// lseek(fd, offset, whence): files and directories (whose offset is an entry index).
pub(crate) fn lseek(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    const SEEK_SET: u64 = 0;
    const SEEK_CUR: u64 = 1;
    const SEEK_END: u64 = 2;
    const SEEK_DATA: u64 = 3;
    const SEEK_HOLE: u64 = 4;
    let fd = fd_arg(args[0]);
    let (off, whence) = (args[1] as i64, args[2]);
    let desc = proc.fds.get(fd)?;
    let Object::Node(node) = desc.object else {
        return Err(Errno::ESPIPE);
    };
    let is_dir = proc.config.vfs.kind(node)? == FileKind::Directory;
    let size = proc.config.vfs.stat(node)?.size;
    let base: i64 = match whence {
        SEEK_SET => 0,
        SEEK_CUR => desc.offset as i64,
        SEEK_END if !is_dir => size as i64,
        SEEK_DATA | SEEK_HOLE if !is_dir => {
            // One data extent covering the whole file; the hole is at its end.
            if off < 0 || off as u64 >= size {
                return Err(Errno::ENXIO);
            }
            let target = if whence == SEEK_DATA {
                off as u64
            } else {
                size
            };
            proc.fds.get_mut(fd)?.offset = target;
            return value(target);
        }
        _ => return Err(Errno::EINVAL),
    };
    let target = base
        .checked_add(off)
        .filter(|&t| t >= 0)
        .ok_or(Errno::EINVAL)?;
    proc.fds.get_mut(fd)?.offset = target as u64;
    value(target as u64)
}

// ---- the fd table ----

/// openat(dirfd, path, flags, mode)
pub(crate) fn openat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    open_common(proc, user, args[0], args[1], args[2], args[3])
}

/// open(path, flags, mode)
pub(crate) fn open(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    open_common(proc, user, AT_FDCWD as u64, args[0], args[1], args[2])
}

/// creat(path, mode)
pub(crate) fn creat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    open_common(
        proc,
        user,
        AT_FDCWD as u64,
        args[0],
        O_CREAT | 1 | O_TRUNC,
        args[1],
    )
}

fn open_common(
    proc: &mut GuestProcess,
    user: &UserMemory,
    dirfd: u64,
    path: u64,
    flags: u64,
    mode: u64,
) -> SysResult {
    let accmode = flags & u64::from(O_ACCMODE);
    if accmode == u64::from(O_ACCMODE) {
        return Err(Errno::EINVAL);
    }
    if flags & O_TMPFILE == O_TMPFILE {
        return Err(Errno::EOPNOTSUPP);
    }
    let (base, path) = path_at(proc, user, dirfd, path)?;
    // With O_PATH every flag but O_DIRECTORY, O_NOFOLLOW and O_CLOEXEC is ignored.
    let path_only = flags & O_PATH != 0;
    let opts = OpenOptions {
        read: accmode != u64::from(O_WRONLY) && !path_only,
        write: accmode != u64::from(O_RDONLY) && !path_only,
        create: flags & O_CREAT != 0 && !path_only,
        exclusive: flags & O_EXCL != 0 && !path_only,
        truncate: flags & O_TRUNC != 0 && !path_only,
        directory: flags & O_DIRECTORY != 0,
        nofollow: flags & O_NOFOLLOW != 0,
        path_only,
        mode: (mode as u32) & 0o7777 & !proc.umask,
    };
    let node = with_view(proc, |vfs, view| vfs.open_in(view, base, &path, &opts))?;
    let status = (flags & STATUS_FLAGS) | O_LARGEFILE;
    if let Some(ProcNode::Fd(pid, fd)) = proc.config.vfs.proc_node(node) {
        if !path_only {
            return reopen(proc, (pid, fd), status as u32, flags & O_CLOEXEC != 0);
        }
    }
    let (device, pts) = (proc.config.vfs.device(node), proc.config.vfs.pts(node));
    if !path_only && (matches!(device, Some(Device::Ptmx | Device::Tty)) || pts.is_some()) {
        proc.config.vfs.close(node);
        return super::terminal::open(proc, device, pts, flags, status as u32);
    }
    if !path_only && proc.config.vfs.kind(node)? == FileKind::Fifo {
        return super::fifo::open(proc, node, status as u32, flags & O_CLOEXEC != 0);
    }
    let mut description = Description::new(Object::Node(node), status as u32);
    // A /proc file's bytes are made once, at open, and read from the description (an O_PATH
    // descriptor reads nothing).
    if !path_only {
        let proc_node = proc.config.vfs.proc_node(node);
        description.contents = proc_node
            .and_then(|p| procfs::render(proc, p))
            .map(Into::into);
    }
    match proc.fds.install(description, 0, flags & O_CLOEXEC != 0) {
        Ok(fd) => value(fd),
        Err(e) => {
            proc.config.vfs.close(node);
            Err(e)
        }
    }
}

/// open(2) of /proc/<pid>/fd/<fd> (/dev/stdin and the like lead there) whose object has no
/// path: a new description of that object, as Linux reopens it: the pipe end the access mode
/// asks for (O_RDWR is EINVAL, as for a FIFO), the run's stdin for reading (from where its
/// reader is) or a captured output for writing (else EACCES); a socket, epoll set, eventfd or
/// pidfd is ENXIO.
fn reopen(proc: &mut GuestProcess, (pid, fd): (u32, u32), status: u32, cloexec: bool) -> SysResult {
    let (_, open) = ProcessFacts::of(proc)
        .description(pid, fd)
        .ok_or(Errno::ENOENT)?;
    let (object, offset) = (open.object.clone(), open.offset);
    let object = match (object, status & O_ACCMODE) {
        (Object::PipeRead(pipe) | Object::PipeWrite(pipe), O_RDONLY) => Object::PipeRead(pipe),
        (Object::PipeRead(pipe) | Object::PipeWrite(pipe), O_WRONLY) => Object::PipeWrite(pipe),
        (Object::PipeRead(_) | Object::PipeWrite(_), _) => return Err(Errno::EINVAL),
        (Object::Stdin, O_RDONLY) => Object::Stdin,
        (Object::Output(stream), O_WRONLY) => Object::Output(stream),
        (Object::Stdin | Object::Output(_), _) => return Err(Errno::EACCES),
        _ => return Err(Errno::ENXIO),
    };
    let mut description = Description::new(object, status);
    if description.object == Object::Stdin {
        description.offset = offset;
    }
    value(proc.fds.install(description, 0, cloexec)?)
}

/// close(fd)
pub(crate) fn close(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let released = proc.fds.close(fd_arg(args[0]))?;
    proc.release(released);
    value(0)
}

/// close_range(first, last, flags)
pub(crate) fn close_range(
    proc: &mut GuestProcess,
    _user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    const CLOSE_RANGE_UNSHARE: u64 = 2;
    const CLOSE_RANGE_CLOEXEC: u64 = 4;
    let (first, last, flags) = (
        u64::from(args[0] as u32),
        u64::from(args[1] as u32),
        args[2],
    );
    if flags & !(CLOSE_RANGE_UNSHARE | CLOSE_RANGE_CLOEXEC) != 0 || first > last {
        return Err(Errno::EINVAL);
    }
    let released = proc
        .fds
        .close_range(first, last, flags & CLOSE_RANGE_CLOEXEC != 0);
    proc.release_each(released);
    value(0)
}

/// dup(fd)
pub(crate) fn dup(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    value(proc.fds.duplicate(fd_arg(args[0]), 0, false)?)
}

/// dup2(oldfd, newfd)
pub(crate) fn dup2(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (old, new) = (fd_arg(args[0]), fd_arg(args[1]));
    proc.fds.get(old)?;
    if old == new {
        return value(new);
    }
    let released = proc.fds.duplicate_to(old, new, false)?;
    proc.release(released);
    value(new)
}

/// dup3(oldfd, newfd, flags): O_CLOEXEC is the only flag.
pub(crate) fn dup3(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (old, new, flags) = (fd_arg(args[0]), fd_arg(args[1]), args[2]);
    if flags & !O_CLOEXEC != 0 || old == new {
        return Err(Errno::EINVAL);
    }
    let released = proc.fds.duplicate_to(old, new, flags & O_CLOEXEC != 0)?;
    proc.release(released);
    value(new)
}

const S_IFMT: u64 = 0o170000;

/// mknod(path, mode, dev): a regular file, FIFO or socket file in the overlay; a device node
/// is EPERM, as for an unprivileged user.
pub(crate) fn mknod(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    mknod_at(proc, user, AT_FDCWD as u64, args[0], args[1])
}

/// mknodat(dirfd, path, mode, dev)
pub(crate) fn mknodat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    mknod_at(proc, user, args[0], args[1], args[2])
}

/// The file type in `mode` (0 is a regular file) with its permission bits under the umask.
fn mknod_at(
    proc: &mut GuestProcess,
    user: &UserMemory,
    dirfd: u64,
    path: u64,
    mode: u64,
) -> SysResult {
    let kind = match mode & S_IFMT {
        0 | 0o100000 => FileKind::Regular,
        0o010000 => FileKind::Fifo,
        0o140000 => FileKind::Socket,
        0o020000 | 0o060000 => FileKind::CharDevice,
        _ => return Err(Errno::EINVAL),
    };
    let (base, path) = path_at(proc, user, dirfd, path)?;
    let perm = (mode as u32) & 0o7777 & !proc.umask;
    with_view(proc, |vfs, view| vfs.mknod(view, base, &path, perm, kind))?;
    value(0)
}

/// fcntl(fd, cmd, arg): duplication, close-on-exec, status flags, pipe size, seals, record
/// locks (locks.rs) and F_NOTIFY (accepted on a directory; no change is ever signalled).
pub(crate) fn fcntl(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const F_DUPFD: u64 = 0;
    const F_GETFD: u64 = 1;
    const F_SETFD: u64 = 2;
    const F_GETFL: u64 = 3;
    const F_SETFL: u64 = 4;
    const F_NOTIFY: u64 = 1026;
    const F_DUPFD_CLOEXEC: u64 = 1030;
    const F_SETPIPE_SZ: u64 = 1031;
    const F_GETPIPE_SZ: u64 = 1032;
    const F_ADD_SEALS: u64 = 1033;
    const F_GET_SEALS: u64 = 1034;
    const FD_CLOEXEC: u64 = 1;
    /// Flags F_SETFL may change (O_ASYNC and O_DIRECT have no effect here).
    const SETTABLE: u32 = O_APPEND | O_NONBLOCK | 0o20000 | 0o40000 | 0o1000000;
    let fd = fd_arg(args[0]);
    let (cmd, arg) = (u64::from(args[1] as u32), args[2]);
    let desc = proc.fds.get(fd)?;
    match cmd {
        F_DUPFD | F_DUPFD_CLOEXEC => value(proc.fds.duplicate(
            fd,
            u64::from(arg as u32),
            cmd == F_DUPFD_CLOEXEC,
        )?),
        F_GETFD => value(u64::from(proc.fds.cloexec(fd)?)),
        F_SETFD => {
            proc.fds.set_cloexec(fd, arg & FD_CLOEXEC != 0)?;
            value(0)
        }
        F_GETFL => value(u64::from(desc.flags)),
        F_SETFL => {
            let desc = proc.fds.get_mut(fd)?;
            desc.flags = (desc.flags & !SETTABLE) | (arg as u32 & SETTABLE);
            value(0)
        }
        cmd if super::locks::is_lock_command(cmd) => {
            super::locks::record_lock(proc, user, fd, cmd, arg)
        }
        F_NOTIFY => match desc.object {
            Object::Node(node) if proc.config.vfs.kind(node)? == FileKind::Directory => value(0),
            _ => Err(Errno::ENOTDIR),
        },
        F_ADD_SEALS => super::memfd::add_seals(proc, fd, u64::from(arg as u32)),
        F_GET_SEALS => super::memfd::get_seals(proc, fd),
        F_GETPIPE_SZ => match desc.object {
            Object::PipeRead(pipe) | Object::PipeWrite(pipe) => {
                value(proc.fds.pipe(pipe)?.capacity() as u64)
            }
            _ => Err(Errno::EBADF),
        },
        F_SETPIPE_SZ => match desc.object {
            Object::PipeRead(pipe) | Object::PipeWrite(pipe) => {
                value(proc.fds.set_pipe_capacity(pipe, u64::from(arg as u32))? as u64)
            }
            _ => Err(Errno::EBADF),
        },
        _ => Err(Errno::EINVAL),
    }
}

/// fsync(fd), fdatasync(fd): the overlay is memory; nothing to flush.
pub(crate) fn fsync(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    proc.fds.get(fd_arg(args[0]))?;
    value(0)
}

/// pipe2(fds, flags)
pub(crate) fn pipe2(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let flags = args[1];
    if flags & !(O_CLOEXEC | u64::from(O_NONBLOCK) | O_DIRECT) != 0 {
        return Err(Errno::EINVAL);
    }
    user.check(args[0], 8)?;
    let cloexec = flags & O_CLOEXEC != 0;
    let (read_end, write_end) = proc.fds.new_pipe(flags as u32);
    let rfd = proc.fds.install(read_end, 0, cloexec)?;
    let wfd = match proc.fds.install(write_end, 0, cloexec) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = proc.fds.close(rfd);
            return Err(e);
        }
    };
    user.write_u32(args[0], rfd as u32)?;
    user.write_u32(args[0] + 4, wfd as u32)?;
    value(0)
}

/// pipe(fds)
pub(crate) fn pipe(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    pipe2(proc, user, [args[0], 0, 0, 0, 0, 0])
}

/// ioctl(fd, request, arg): the generic fd requests, and the terminal requests of a
/// pseudo-terminal's ends (terminal.rs; ENOTTY on any other fd). Partly: no packet mode
/// (TIOCPKT), no TIOCSTI, no job-control stops or background-group checks.
pub(crate) fn ioctl(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const FIONREAD: u64 = 0x541b;
    const FIONBIO: u64 = 0x5421;
    const FIONCLEX: u64 = 0x5450;
    const FIOCLEX: u64 = 0x5451;
    let fd = fd_arg(args[0]);
    let (request, arg) = (u64::from(args[1] as u32), args[2]);
    let desc = proc.fds.get(fd)?;
    match request {
        FIONBIO => {
            let on = user.read_u32(arg)? != 0;
            let desc = proc.fds.get_mut(fd)?;
            desc.flags = if on {
                desc.flags | O_NONBLOCK
            } else {
                desc.flags & !O_NONBLOCK
            };
            value(0)
        }
        FIOCLEX | FIONCLEX => {
            proc.fds.set_cloexec(fd, request == FIOCLEX)?;
            value(0)
        }
        FIONREAD => {
            let available = match desc.object {
                Object::Stdin => (proc.config.stdin.len() as u64).saturating_sub(desc.offset),
                Object::PipeRead(p) | Object::Socket { rx: p, .. } => {
                    proc.fds.pipe(p)?.buffered() as u64
                }
                Object::Node(node) if proc.config.vfs.kind(node)? == FileKind::Regular => {
                    proc.config.vfs.stat(node)?.size.saturating_sub(desc.offset)
                }
                Object::Inet(index) => super::inet::available(proc, index)? as u64,
                Object::TerminalMaster(i) => super::terminal::available(proc, (i, true))?,
                Object::TerminalSlave(i) => super::terminal::available(proc, (i, false))?,
                // The next datagram's length, as Linux answers for a Unix datagram socket.
                Object::UnixDatagram(index) => proc
                    .fds
                    .unix_datagram(index)?
                    .inbox
                    .front()
                    .map_or(0, |d| d.data.len() as u64),
                _ => return Err(Errno::ENOTTY),
            };
            user.write_u32(arg, available.min(i32::MAX as u64) as u32)?;
            value(0)
        }
        _ => match super::terminal::end_of(&desc.object) {
            Some(end) => super::terminal::ioctl(proc, user, end, request, arg),
            None => Err(Errno::ENOTTY),
        },
    }
}

// ---- metadata ----

/// fstat(fd, statbuf)
pub(crate) fn fstat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let stat = stat_of_fd(proc, fd_arg(args[0]))?;
    user.write(args[1], &stat_bytes(&stat))?;
    value(0)
}

/// The node a stat-family call names: dirfd + path, or dirfd itself with AT_EMPTY_PATH.
pub(super) fn stat_target(
    proc: &GuestProcess,
    user: &UserMemory,
    dirfd: u64,
    path: u64,
    flags: u64,
) -> Result<Stat, Errno> {
    let path_bytes = user.read_path(path)?;
    if path_bytes.is_empty() {
        if flags & AT_EMPTY_PATH == 0 {
            return Err(Errno::ENOENT);
        }
        if dirfd as u32 as i32 == AT_FDCWD {
            return proc.config.vfs.stat(proc.cwd);
        }
        return stat_of_fd(proc, fd_arg(dirfd));
    }
    let base = base_dir(proc, dirfd, &path_bytes)?;
    let follow = flags & AT_SYMLINK_NOFOLLOW == 0;
    let node = resolve(proc, base, &path_bytes, follow)?;
    // A followed fd link to a pipe or the like stats as that object, as fstat of the fd would.
    if let (true, Some(ProcNode::Fd(pid, fd))) = (follow, proc.config.vfs.proc_node(node)) {
        let (id, description) = ProcessFacts::of(proc)
            .description(pid, fd)
            .ok_or(Errno::ENOENT)?;
        return stat_of_description(proc, id, description);
    }
    proc.config.vfs.stat(node)
}

/// newfstatat(dirfd, path, statbuf, flags)
pub(crate) fn newfstatat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if args[3] & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH | AT_NO_AUTOMOUNT) != 0 {
        return Err(Errno::EINVAL);
    }
    let stat = stat_target(proc, user, args[0], args[1], args[3])?;
    user.write(args[2], &stat_bytes(&stat))?;
    value(0)
}

/// stat(path, statbuf)
pub(crate) fn stat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    newfstatat(proc, user, [AT_FDCWD as u64, args[0], args[1], 0, 0, 0])
}

/// lstat(path, statbuf)
pub(crate) fn lstat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    newfstatat(
        proc,
        user,
        [AT_FDCWD as u64, args[0], args[1], AT_SYMLINK_NOFOLLOW, 0, 0],
    )
}

/// statx(dirfd, path, flags, mask, statxbuf): the basic fields, whatever the mask asks.
pub(crate) fn statx(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let flags = args[2];
    if flags & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH | AT_NO_AUTOMOUNT | AT_STATX_SYNC_TYPE) != 0 {
        return Err(Errno::EINVAL);
    }
    let stat = stat_target(proc, user, args[0], args[1], flags)?;
    user.write(args[4], &statx_bytes(&stat))?;
    value(0)
}

/// `struct statfs` as x86-64 Linux lays it out (120 bytes).
fn statfs_bytes(s: &FsStats) -> [u8; 120] {
    const ST_RDONLY: u64 = 1;
    const ST_VALID: u64 = 0x20;
    const NAME_MAX: u64 = crate::fs::NAME_MAX as u64;
    let mut b = [0u8; 120];
    let flags = ST_VALID | if s.read_only { ST_RDONLY } else { 0 };
    // f_type, f_bsize, f_blocks, f_bfree, f_bavail, f_files, f_ffree, f_fsid, f_namelen,
    // f_frsize, f_flags; f_spare stays zero.
    let fields = [
        s.magic,
        s.block_size,
        s.blocks,
        s.free_blocks,
        s.free_blocks,
        s.files,
        s.free_files,
        s.fsid,
        NAME_MAX,
        s.block_size,
        flags,
    ];
    for (i, v) in fields.iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// statfs(path, buf)
pub(crate) fn statfs(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (base, path) = path_at(proc, user, AT_FDCWD as u64, args[0])?;
    let node = resolve(proc, base, &path, true)?;
    user.write(args[1], &statfs_bytes(&proc.config.vfs.statfs(node)?))?;
    value(0)
}

/// fstatfs(fd, buf): pipes, sockets and the standard streams live in no file system here
/// (Linux reports pipefs/sockfs); they answer as /dev's in-memory file system does.
pub(crate) fn fstatfs(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let node = match proc.fds.get(fd_arg(args[0]))?.object {
        Object::Node(node) => node,
        _ => proc
            .config
            .vfs
            .resolve(proc.config.vfs.root(), b"/dev", true)?,
    };
    user.write(args[1], &statfs_bytes(&proc.config.vfs.statfs(node)?))?;
    value(0)
}

/// getdents64(fd, dirp, count): as many whole records as fit, from the description's entry
/// index on; 0 at the end.
pub(crate) fn getdents64(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let fd = fd_arg(args[0]);
    let (dirp, count) = (args[1], args[2].min(MAX_IO));
    let desc = proc.fds.get(fd)?;
    let Object::Node(node) = desc.object else {
        return Err(Errno::ENOTDIR);
    };
    user.check(dirp, count)?;
    // The records are made once, when a read starts at the first entry (opendir, rewinddir),
    // and later reads continue in them: entries removed meanwhile (closing descriptors while
    // reading /proc/self/fd, deleting files while reading a folder) do not move the rest back
    // under the position, and an entry made meanwhile may or may not be seen, as POSIX allows.
    let records = match &desc.contents {
        Some(records) if desc.offset > 0 => records.clone(),
        _ => {
            let entries = proc.config.vfs.read_dir_in(&ProcessFacts::of(proc), node)?;
            let records: std::sync::Arc<[u8]> = dirent_records(&entries).into();
            proc.fds.get_mut(fd)?.contents = Some(records.clone());
            records
        }
    };
    let offset = proc.fds.get(fd)?.offset;
    let reclen = |at: usize| usize::from(u16::from_le_bytes([records[at + 16], records[at + 17]]));
    let (mut at, mut index) = (0, 0);
    while at < records.len() && index < offset {
        at += reclen(at);
        index += 1;
    }
    let start = at;
    while at < records.len() && (at + reclen(at) - start) as u64 <= count {
        at += reclen(at);
        index += 1;
    }
    if at == start && start < records.len() {
        return Err(Errno::EINVAL);
    }
    user.write(dirp, &records[start..at])?;
    proc.fds.get_mut(fd)?.offset = index;
    value((at - start) as u64)
}

/// The linux_dirent64 records of a listing: d_ino, d_off (the next entry's index), d_reclen,
/// d_type, the name and its NUL, each padded to 8 bytes.
fn dirent_records(entries: &[DirEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let reclen = (19 + entry.name.len() + 1).next_multiple_of(8);
        out.extend_from_slice(&entry.ino.to_le_bytes());
        out.extend_from_slice(&(index as u64 + 1).to_le_bytes());
        out.extend_from_slice(&(reclen as u16).to_le_bytes());
        out.push(entry.kind.dirent_type());
        out.extend_from_slice(&entry.name);
        out.resize(out.len() + reclen - 19 - entry.name.len(), 0);
    }
    out
}

/// faccessat2(dirfd, path, mode, flags); access and faccessat are the flag-less forms.
pub(crate) fn faccessat2(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (mode, flags) = (args[2], args[3]);
    if mode & !7 != 0 || flags & !(AT_EACCESS | AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH) != 0 {
        return Err(Errno::EINVAL);
    }
    let (base, path) = path_at(proc, user, args[0], args[1])?;
    let node = resolve(proc, base, &path, flags & AT_SYMLINK_NOFOLLOW == 0)?;
    proc.config.vfs.access(node, mode as u32)?;
    value(0)
}

/// faccessat(dirfd, path, mode)
pub(crate) fn faccessat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    faccessat2(proc, user, [args[0], args[1], args[2], 0, 0, 0])
}

/// access(path, mode)
pub(crate) fn access(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    faccessat2(proc, user, [AT_FDCWD as u64, args[0], args[1], 0, 0, 0])
}

/// readlinkat(dirfd, path, buf, size): the target, truncated to size, without a NUL.
pub(crate) fn readlinkat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let size = args[3] as u32 as i32;
    if size <= 0 {
        return Err(Errno::EINVAL);
    }
    // An empty path names dirfd itself (an O_PATH|O_NOFOLLOW fd of a symlink).
    let path = user.read_path(args[1])?;
    let node = if path.is_empty() {
        match proc.fds.get(fd_arg(args[0]))?.object {
            Object::Node(node) => node,
            _ => return Err(Errno::ENOENT),
        }
    } else {
        resolve(proc, base_dir(proc, args[0], &path)?, &path, false)?
    };
    let target = proc.config.vfs.readlink_in(&ProcessFacts::of(proc), node)?;
    let n = target.len().min(size as usize);
    user.write(args[2], &target[..n])?;
    value(n as u64)
}

/// readlink(path, buf, size)
pub(crate) fn readlink(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    readlinkat(
        proc,
        user,
        [AT_FDCWD as u64, args[0], args[1], args[2], 0, 0],
    )
}

/// getcwd(buf, size): the path and its NUL; ERANGE when it does not fit.
pub(crate) fn getcwd(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let mut path = proc.config.vfs.path_of(proc.cwd)?;
    if path.is_empty() {
        path.push(b'/');
    }
    path.push(0);
    if path.len() as u64 > args[1] {
        return Err(Errno::ERANGE);
    }
    user.write(args[0], &path)?;
    value(path.len() as u64)
}

fn change_dir(proc: &mut GuestProcess, node: Node) -> SysResult {
    if proc.config.vfs.kind(node)? != FileKind::Directory {
        return Err(Errno::ENOTDIR);
    }
    proc.cwd = node;
    value(0)
}

/// chdir(path)
pub(crate) fn chdir(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (base, path) = path_at(proc, user, AT_FDCWD as u64, args[0])?;
    let node = resolve(proc, base, &path, true)?;
    change_dir(proc, node)
}

/// fchdir(fd)
pub(crate) fn fchdir(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    match proc.fds.get(fd_arg(args[0]))?.object {
        Object::Node(node) => change_dir(proc, node),
        _ => Err(Errno::ENOTDIR),
    }
}

// ---- changing the tree (overlay only; the image gives EROFS) ----

/// mkdirat(dirfd, path, mode)
pub(crate) fn mkdirat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (base, path) = path_at(proc, user, args[0], args[1])?;
    let mode = (args[2] as u32) & 0o7777 & !proc.umask;
    with_view(proc, |vfs, view| vfs.mkdir(view, base, &path, mode))?;
    value(0)
}

/// mkdir(path, mode)
pub(crate) fn mkdir(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    mkdirat(proc, user, [AT_FDCWD as u64, args[0], args[1], 0, 0, 0])
}

/// unlinkat(dirfd, path, flags): AT_REMOVEDIR removes a directory.
pub(crate) fn unlinkat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let flags = args[2];
    if flags & !AT_REMOVEDIR != 0 {
        return Err(Errno::EINVAL);
    }
    let (base, path) = path_at(proc, user, args[0], args[1])?;
    if flags & AT_REMOVEDIR != 0 {
        with_view(proc, |vfs, view| vfs.rmdir(view, base, &path))?;
    } else {
        with_view(proc, |vfs, view| vfs.unlink(view, base, &path))?;
    }
    value(0)
}

/// linkat(olddirfd, oldpath, newdirfd, newpath, flags): a second name for an overlay file
/// (`Vfs::link`); AT_SYMLINK_FOLLOW and AT_EMPTY_PATH are supported.
pub(crate) fn linkat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const AT_SYMLINK_FOLLOW: u64 = 0x400;
    let flags = args[4];
    if flags & !(AT_SYMLINK_FOLLOW | AT_EMPTY_PATH) != 0 {
        return Err(Errno::EINVAL);
    }
    let old_path = user.read_path(args[1])?;
    let node = if old_path.is_empty() {
        if flags & AT_EMPTY_PATH == 0 {
            return Err(Errno::ENOENT);
        }
        match proc.fds.get(fd_arg(args[0]))?.object {
            Object::Node(node) => node,
            _ => return Err(Errno::EXDEV),
        }
    } else {
        let base = base_dir(proc, args[0], &old_path)?;
        resolve(proc, base, &old_path, flags & AT_SYMLINK_FOLLOW != 0)?
    };
    let (new_base, new_path) = path_at(proc, user, args[2], args[3])?;
    with_view(proc, |vfs, view| vfs.link(view, node, new_base, &new_path))?;
    value(0)
}

/// link(oldpath, newpath)
pub(crate) fn link(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    linkat(
        proc,
        user,
        [AT_FDCWD as u64, args[0], AT_FDCWD as u64, args[1], 0, 0],
    )
}

/// unlink(path)
pub(crate) fn unlink(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    unlinkat(proc, user, [AT_FDCWD as u64, args[0], 0, 0, 0, 0])
}

/// rmdir(path)
pub(crate) fn rmdir(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    unlinkat(
        proc,
        user,
        [AT_FDCWD as u64, args[0], AT_REMOVEDIR, 0, 0, 0],
    )
}

/// renameat2(olddirfd, oldpath, newdirfd, newpath, flags): RENAME_NOREPLACE is supported.
pub(crate) fn renameat2(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const RENAME_NOREPLACE: u64 = 1;
    let flags = args[4];
    if flags & !RENAME_NOREPLACE != 0 {
        return Err(Errno::EINVAL);
    }
    let (old_base, old_path) = path_at(proc, user, args[0], args[1])?;
    let (new_base, new_path) = path_at(proc, user, args[2], args[3])?;
    if flags & RENAME_NOREPLACE != 0 && resolve(proc, new_base, &new_path, false).is_ok() {
        return Err(Errno::EEXIST);
    }
    with_view(proc, |vfs, view| {
        vfs.rename(view, old_base, &old_path, new_base, &new_path)
    })?;
    value(0)
}

/// renameat(olddirfd, oldpath, newdirfd, newpath)
pub(crate) fn renameat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    renameat2(proc, user, [args[0], args[1], args[2], args[3], 0, 0])
}

/// rename(oldpath, newpath)
pub(crate) fn rename(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    renameat2(
        proc,
        user,
        [AT_FDCWD as u64, args[0], AT_FDCWD as u64, args[1], 0, 0],
    )
}

/// symlinkat(target, newdirfd, linkpath)
pub(crate) fn symlinkat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let target = user.read_path(args[0])?;
    let (base, path) = path_at(proc, user, args[1], args[2])?;
    with_view(proc, |vfs, view| vfs.symlink(view, &target, base, &path))?;
    value(0)
}

/// symlink(target, linkpath)
pub(crate) fn symlink(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    symlinkat(proc, user, [args[0], AT_FDCWD as u64, args[1], 0, 0, 0])
}

/// ftruncate(fd, length): the description must be open for writing.
pub(crate) fn ftruncate(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let len = non_negative(args[1])?;
    let desc = proc.fds.get(fd_arg(args[0]))?;
    match desc.object {
        Object::Node(node) if desc.writable() => {
            proc.config.vfs.truncate(node, len)?;
            value(0)
        }
        _ => Err(Errno::EINVAL),
    }
}

/// truncate(path, length)
pub(crate) fn truncate(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let len = non_negative(args[1])?;
    let (base, path) = path_at(proc, user, AT_FDCWD as u64, args[0])?;
    let node = resolve(proc, base, &path, true)?;
    if proc.config.vfs.kind(node)? == FileKind::Directory {
        return Err(Errno::EISDIR);
    }
    proc.config.vfs.truncate(node, len)?;
    value(0)
}

/// fchmodat(dirfd, path, mode): permission bits of an overlay node (EROFS in the image).
pub(crate) fn fchmodat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (base, path) = path_at(proc, user, args[0], args[1])?;
    let node = resolve(proc, base, &path, true)?;
    proc.config.vfs.chmod(node, args[2] as u32 & 0o7777)?;
    value(0)
}

/// chmod(path, mode)
pub(crate) fn chmod(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    fchmodat(proc, user, [AT_FDCWD as u64, args[0], args[1], 0, 0, 0])
}

/// fchmod(fd, mode)
pub(crate) fn fchmod(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    match proc.fds.get(fd_arg(args[0]))?.object {
        Object::Node(node) => {
            proc.config.vfs.chmod(node, args[1] as u32 & 0o7777)?;
            value(0)
        }
        // Pipes and the standard streams belong to root (see stream_stat).
        _ => Err(Errno::EPERM),
    }
}

/// utimensat(dirfd, path, times, flags): sets an overlay node's access and modification
/// times (each a timespec, UTIME_NOW or UTIME_OMIT; NULL times: both now). A NULL path means
/// dirfd itself (futimens).
pub(crate) fn utimensat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const UTIME_NOW: u64 = (1 << 30) - 1;
    const UTIME_OMIT: u64 = (1 << 30) - 2;
    let [dirfd, path, times, flags, ..] = args;
    if flags & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH) != 0 {
        return Err(Errno::EINVAL);
    }
    // One moment for both times, as Linux takes.
    let ns = super::time::now_ns(super::time::CLOCK_REALTIME)?;
    let now = Timespec {
        sec: (ns / 1_000_000_000) as i64,
        nsec: (ns % 1_000_000_000) as u32,
    };
    // [atime, mtime]: None leaves one as it is.
    let mut new_times = [None, None];
    for (i, slot) in new_times.iter_mut().enumerate() {
        let t = times + 16 * i as u64;
        *slot = match if times == 0 {
            UTIME_NOW
        } else {
            user.read_u64(t + 8)?
        } {
            UTIME_OMIT => None,
            UTIME_NOW => Some(now),
            // Times before 1970 are allowed; the nanoseconds must be a fraction of a second.
            nsec if nsec < 1_000_000_000 => Some(Timespec {
                sec: user.read_u64(t)? as i64,
                nsec: nsec as u32,
            }),
            _ => return Err(Errno::EINVAL),
        };
    }
    let node = if path == 0 {
        match proc.fds.get(fd_arg(dirfd))?.object {
            Object::Node(node) => node,
            _ => return Err(Errno::EPERM),
        }
    } else {
        let (base, path) = path_at(proc, user, dirfd, path)?;
        resolve(proc, base, &path, flags & AT_SYMLINK_NOFOLLOW == 0)?
    };
    if new_times == [None, None] {
        return value(0);
    }
    proc.config
        .vfs
        .set_times(node, new_times[0], new_times[1])?;
    value(0)
}
