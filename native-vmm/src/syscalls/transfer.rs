//! Moving bytes from one fd to another inside the VMM, never through guest memory:
//! sendfile, copy_file_range and splice, with Linux's rules for which fds each accepts and
//! where the offsets come from. One call moves at most `MAX_TRANSFER` bytes (Linux also
//! returns short counts); a pipe end that would block waits as read and write do.

use super::files::{fd_arg, write_bytes, O_PATH};
use super::{value, wait_ready, SysResult, UserMemory};
use crate::errno::Errno;
use crate::fs::FileKind;
use crate::process::{GuestProcess, Object, PipeError, O_APPEND, O_NONBLOCK};

/// Bytes one call moves at most: bounds the host memory a call makes the VMM allocate.
const MAX_TRANSFER: u64 = 1 << 20;
const SPLICE_F_NONBLOCK: u64 = 2;
const SPLICE_FLAGS: u64 = 0xf;

/// An optional `loff_t *` argument: its value (negative: EINVAL) and where to store the new one.
fn offset_arg(user: &UserMemory, ptr: u64) -> Result<Option<(u64, u64)>, Errno> {
    if ptr == 0 {
        return Ok(None);
    }
    match user.read_u64(ptr)? {
        pos if (pos as i64) < 0 => Err(Errno::EINVAL),
        pos => Ok(Some((ptr, pos))),
    }
}

/// What a transfer reads from.
enum Source {
    /// A file of the file system at a position (a regular file or a device).
    File {
        fd: u64,
        pos: u64,
        explicit: Option<u64>,
    },
    /// An in-memory channel (a pipe's read end, a socket's receive side).
    Channel(usize),
}

/// What a transfer writes to: an fd at its own position, or a file at an explicit one.
struct Sink {
    fd: u64,
    at: Option<(u64, u64)>,
    /// The channel a pipe end or socket writes, whose room bounds the transfer.
    channel: Option<usize>,
}

fn source(
    proc: &GuestProcess,
    fd: u64,
    offset: Option<(u64, u64)>,
    allow_channel: bool,
) -> Result<Source, Errno> {
    let desc = proc.fds.get(fd)?;
    if !desc.readable() || desc.flags & O_PATH as u32 != 0 {
        return Err(Errno::EBADF);
    }
    match desc.object {
        Object::Node(node) => match proc.config.vfs.kind(node)? {
            FileKind::Directory => Err(Errno::EISDIR),
            FileKind::Regular | FileKind::CharDevice => {
                let pos = offset.map_or(desc.offset, |(_, pos)| pos);
                Ok(Source::File {
                    fd,
                    pos,
                    explicit: offset.map(|(ptr, _)| ptr),
                })
            }
            FileKind::Symlink => Err(Errno::EINVAL),
            FileKind::Socket | FileKind::Fifo => Err(Errno::ENXIO),
        },
        Object::PipeRead(pipe) | Object::Socket { rx: pipe, .. } if allow_channel => match offset {
            Some(_) => Err(Errno::ESPIPE),
            None => Ok(Source::Channel(pipe)),
        },
        _ => Err(Errno::EINVAL),
    }
}

fn sink(proc: &GuestProcess, fd: u64, offset: Option<(u64, u64)>) -> Result<Sink, Errno> {
    let desc = proc.fds.get(fd)?;
    if !desc.writable() || desc.flags & O_PATH as u32 != 0 {
        return Err(Errno::EBADF);
    }
    let channel = match desc.object {
        Object::PipeWrite(pipe)
        | Object::Socket {
            tx: pipe,
            shut_write: false,
            ..
        } => Some(pipe),
        _ => None,
    };
    if channel.is_some() && offset.is_some() {
        return Err(Errno::ESPIPE);
    }
    Ok(Sink {
        fd,
        at: offset,
        channel,
    })
}

/// Moves up to `len` bytes from `src` to `dst`; offsets given by pointer are read and written
/// back there, the others are the descriptions' positions.
fn transfer(
    proc: &mut GuestProcess,
    user: &UserMemory,
    src: Source,
    dst: Sink,
    len: u64,
    nonblocking: bool,
) -> SysResult {
    let mut max = len.min(MAX_TRANSFER);
    if let Some(channel) = dst.channel {
        let pipe = proc.fds.pipe(channel)?;
        if !pipe.has_readers() {
            return Err(Errno::EPIPE);
        }
        max = max.min(pipe.room() as u64);
        if max == 0 && len > 0 {
            return if nonblocking || proc.fds.get(dst.fd)?.flags & O_NONBLOCK != 0 {
                Err(Errno::EAGAIN)
            } else {
                wait_ready(proc, None)
            };
        }
    }
    let data = match &src {
        Source::File { fd, pos, .. } => {
            let desc = proc.fds.get(*fd)?;
            let Object::Node(node) = desc.object else {
                return Err(Errno::EBADF);
            };
            match &desc.contents {
                // A /proc file: the bytes made when it was opened, as read() gives them.
                Some(contents) => super::files::bytes_at(contents, *pos, max as usize).to_vec(),
                None => {
                    let mut bytes = vec![0u8; max as usize];
                    let n = proc.config.vfs.read_at(node, *pos, &mut bytes)?;
                    bytes.truncate(n);
                    bytes
                }
            }
        }
        Source::Channel(pipe) => match proc.fds.read_channel(*pipe, max as usize)? {
            Ok((bytes, passed)) => {
                proc.fds.discard(passed);
                proc.release(None);
                bytes
            }
            Err(PipeError::WouldBlock) if nonblocking => return Err(Errno::EAGAIN),
            Err(_) => return wait_ready(proc, None),
        },
    };
    if data.is_empty() {
        return value(0);
    }
    let outcome = write_bytes(
        proc,
        dst.fd,
        &data,
        data.len() as u64,
        dst.at.map(|(_, pos)| pos),
    )?;
    let super::SyscallOutcome::Return(n) = outcome else {
        return Ok(outcome);
    };
    if let Source::File { fd, pos, explicit } = src {
        match explicit {
            Some(ptr) => user.write_u64(ptr, pos + n)?,
            None => proc.fds.get_mut(fd)?.offset = pos + n,
        }
    }
    if let Some((ptr, pos)) = dst.at {
        user.write_u64(ptr, pos + n)?;
    }
    value(n)
}

/// sendfile(out_fd, in_fd, offset, count): from a file (or device) to any writable fd; with
/// `offset` the file's position stays where it was.
pub(crate) fn sendfile(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (out_fd, in_fd) = (fd_arg(args[0]), fd_arg(args[1]));
    // A directory has no bytes to send: EINVAL here (copy_file_range says EISDIR).
    let src = source(proc, in_fd, offset_arg(user, args[2])?, false).map_err(|e| {
        if e == Errno::EISDIR {
            Errno::EINVAL
        } else {
            e
        }
    })?;
    let dst = sink(proc, out_fd, None)?;
    if proc.fds.get(out_fd)?.flags & O_APPEND != 0 {
        return Err(Errno::EINVAL);
    }
    transfer(proc, user, src, dst, args[3], false)
}

/// copy_file_range(fd_in, off_in, fd_out, off_out, len, flags): between regular files (no
/// flags exist); overlapping ranges of one file are EINVAL.
pub(crate) fn copy_file_range(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    let [fd_in, off_in, fd_out, off_out, len, flags] = args;
    if flags != 0 {
        return Err(Errno::EINVAL);
    }
    let (fd_in, fd_out) = (fd_arg(fd_in), fd_arg(fd_out));
    let src = source(proc, fd_in, offset_arg(user, off_in)?, false)?;
    let dst = sink(proc, fd_out, offset_arg(user, off_out)?)?;
    let out = proc.fds.get(fd_out)?;
    let Object::Node(out_node) = out.object else {
        return Err(Errno::EINVAL);
    };
    match proc.config.vfs.kind(out_node)? {
        FileKind::Directory => return Err(Errno::EISDIR),
        FileKind::Regular => {}
        _ => return Err(Errno::EINVAL),
    }
    if out.flags & O_APPEND != 0 {
        return Err(Errno::EBADF);
    }
    let Source::File { fd, pos, .. } = src else {
        return Err(Errno::EINVAL);
    };
    let Object::Node(in_node) = proc.fds.get(fd)?.object else {
        return Err(Errno::EINVAL);
    };
    if proc.config.vfs.kind(in_node)? != FileKind::Regular {
        return Err(Errno::EINVAL);
    }
    let out_pos = dst.at.map_or(out.offset, |(_, p)| p);
    // Linux first cuts the length to what the source holds: nothing to copy is no overlap.
    let n = len
        .min(MAX_TRANSFER)
        .min(proc.config.vfs.stat(in_node)?.size.saturating_sub(pos));
    if n == 0 {
        return value(0);
    }
    if in_node == out_node && pos < out_pos.saturating_add(n) && out_pos < pos.saturating_add(n) {
        return Err(Errno::EINVAL);
    }
    transfer(proc, user, src, dst, len, false)
}

/// splice(fd_in, off_in, fd_out, off_out, len, flags): one side (at least) is a pipe, whose
/// offset must be NULL; SPLICE_F_MOVE and SPLICE_F_MORE are hints, SPLICE_F_NONBLOCK makes the
/// pipe side non-blocking.
pub(crate) fn splice(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [fd_in, off_in, fd_out, off_out, len, flags] = args;
    if flags & !SPLICE_FLAGS != 0 {
        return Err(Errno::EINVAL);
    }
    let (fd_in, fd_out) = (fd_arg(fd_in), fd_arg(fd_out));
    let src = source(proc, fd_in, offset_arg(user, off_in)?, true)?;
    let dst = sink(proc, fd_out, offset_arg(user, off_out)?)?;
    let in_pipe = matches!(proc.fds.get(fd_in)?.object, Object::PipeRead(_));
    let out_pipe = matches!(proc.fds.get(fd_out)?.object, Object::PipeWrite(_));
    if !in_pipe && !out_pipe {
        return Err(Errno::EINVAL);
    }
    let nonblocking =
        flags & SPLICE_F_NONBLOCK != 0 || (in_pipe && proc.fds.get(fd_in)?.flags & O_NONBLOCK != 0);
    transfer(proc, user, src, dst, len, nonblocking)
}
