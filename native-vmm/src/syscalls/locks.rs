//! Advisory file locks: flock(2) and fcntl(2)'s record-lock commands, over the tree's lock
//! table (`process::FileLocks`). A lock in another process's way waits like a blocked read
//! (tried again as the tree makes progress); a cycle of such waits that nothing else can end
//! ends the run as deadlocked rather than with EDEADLK.

use super::{value, wait_ready, SysResult, UserMemory};
use crate::errno::Errno;
use crate::process::{GuestProcess, Held, LockKind, LockOwner, LockRange, Object};

const LOCK_SH: u64 = 1;
const LOCK_EX: u64 = 2;
const LOCK_NB: u64 = 4;
const LOCK_UN: u64 = 8;

const F_GETLK: u64 = 5;
const F_SETLK: u64 = 6;
const F_SETLKW: u64 = 7;
const F_OFD_GETLK: u64 = 36;
const F_OFD_SETLK: u64 = 37;
const F_OFD_SETLKW: u64 = 38;

const F_RDLCK: u16 = 0;
const F_WRLCK: u16 = 1;
const F_UNLCK: u16 = 2;

/// The fcntl commands this module answers.
pub(crate) fn is_lock_command(cmd: u64) -> bool {
    matches!(
        cmd,
        F_GETLK | F_SETLK | F_SETLKW | F_OFD_GETLK | F_OFD_SETLK | F_OFD_SETLKW
    )
}

/// flock(fd, op): a whole-file lock held by the fd's open file description, shared with
/// its dups and a fork's copies; it goes with LOCK_UN or the description's last close.
/// Files only: on a pipe or socket, where no other description can reach the same object
/// by path, it is granted as is.
pub(crate) fn flock(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let fd = u64::from(args[0] as u32);
    let op = args[1];
    let kind = match op & !LOCK_NB {
        LOCK_SH => Some(LockKind::Read),
        LOCK_EX => Some(LockKind::Write),
        LOCK_UN => None,
        _ => return Err(Errno::EINVAL),
    };
    let Object::Node(node) = proc.fds.get(fd)?.object else {
        return value(0);
    };
    let owner = LockOwner::Description(proc.fds.description_index(fd)?);
    match proc.fds.locks.flock(node, owner, kind) {
        Ok(()) => value(0),
        Err(_) if op & LOCK_NB != 0 => Err(Errno::EAGAIN),
        Err(_) => wait_ready(proc, None),
    }
}

/// fcntl(fd, F_GETLK/F_SETLK/F_SETLKW and their F_OFD_ forms, struct flock *): byte-range
/// locks of a regular file, held by the process (released when it closes any fd of the file
/// or ends) or, for the OFD forms, by the open file description.
pub(crate) fn record_lock(
    proc: &mut GuestProcess,
    user: &UserMemory,
    fd: u64,
    cmd: u64,
    arg: u64,
) -> SysResult {
    let desc = proc.fds.get(fd)?;
    let node = match desc.object {
        Object::Node(node) => Some(node),
        _ => None,
    };
    let (offset, readable, writable) = (desc.offset, desc.readable(), desc.writable());
    let mut raw = [0u8; 32];
    user.read(arg, &mut raw)?;
    let field = |at: usize| i64::from_le_bytes(raw[at..at + 8].try_into().unwrap_or([0; 8]));
    let l_type = u16::from_le_bytes([raw[0], raw[1]]);
    let whence = u16::from_le_bytes([raw[2], raw[3]]);
    let l_pid = i32::from_le_bytes([raw[24], raw[25], raw[26], raw[27]]);
    let ofd = matches!(cmd, F_OFD_GETLK | F_OFD_SETLK | F_OFD_SETLKW);
    if ofd && l_pid != 0 {
        return Err(Errno::EINVAL);
    }
    let kind = match l_type {
        F_RDLCK => Some(LockKind::Read),
        F_WRLCK => Some(LockKind::Write),
        F_UNLCK => None,
        _ => return Err(Errno::EINVAL),
    };
    let node = node.ok_or(Errno::EINVAL)?;
    let size = proc.config.vfs.stat(node)?.size;
    let (start, end) = byte_range([0, offset, size], whence, field(8), field(16))?;
    let owner = if ofd {
        LockOwner::Description(proc.fds.description_index(fd)?)
    } else {
        LockOwner::Process(proc.pid)
    };
    let asked = LockRange {
        node,
        owner,
        start,
        end,
    };
    if matches!(cmd, F_GETLK | F_OFD_GETLK) {
        let kind = kind.ok_or(Errno::EINVAL)?;
        let blocker = proc.fds.locks.record_conflict(asked, kind);
        user.write(arg, &describe(blocker, raw))?;
        return value(0);
    }
    let allowed = match kind {
        Some(LockKind::Read) => readable,
        Some(LockKind::Write) => writable,
        None => true,
    };
    if !allowed {
        return Err(Errno::EBADF);
    }
    match proc.fds.locks.set_record(asked, kind) {
        Ok(()) => value(0),
        Err(_) if matches!(cmd, F_SETLK | F_OFD_SETLK) => Err(Errno::EAGAIN),
        Err(_) => wait_ready(proc, None),
    }
}

/// The bytes a struct flock names, as [start, end): from `whence` (an index into `bases`: the
/// file's start, the description's offset, the file's end) plus `start`, `len` bytes on (0: to
/// the end, however far; negative: the bytes before).
fn byte_range(bases: [u64; 3], whence: u16, start: i64, len: i64) -> Result<(u64, u64), Errno> {
    let base = *bases.get(usize::from(whence)).ok_or(Errno::EINVAL)?;
    let from = i64::try_from(base)
        .ok()
        .and_then(|b| b.checked_add(start))
        .ok_or(Errno::EOVERFLOW)?;
    let (from, to) = match len {
        0 => (from, None),
        l if l > 0 => (from, Some(from.checked_add(l).ok_or(Errno::EOVERFLOW)?)),
        l => (from.checked_add(l).ok_or(Errno::EINVAL)?, Some(from)),
    };
    if from < 0 {
        return Err(Errno::EINVAL);
    }
    Ok((from as u64, to.map_or(u64::MAX, |t| t as u64)))
}

/// F_GETLK's answer: the lock in the way (its type, its range from the file's start, its
/// process, or -1 for a description's), or the request with F_UNLCK when none is.
fn describe(blocker: Option<Held>, mut raw: [u8; 32]) -> [u8; 32] {
    let Some(held) = blocker else {
        raw[..2].copy_from_slice(&F_UNLCK.to_le_bytes());
        return raw;
    };
    let l_type = match held.kind {
        LockKind::Read => F_RDLCK,
        LockKind::Write => F_WRLCK,
    };
    let len = if held.end == u64::MAX {
        0
    } else {
        held.end - held.start
    };
    let pid = match held.owner {
        LockOwner::Process(pid) => pid as i32,
        LockOwner::Description(_) => -1,
    };
    raw[..2].copy_from_slice(&l_type.to_le_bytes());
    raw[2..4].copy_from_slice(&0u16.to_le_bytes());
    raw[8..16].copy_from_slice(&held.start.to_le_bytes());
    raw[16..24].copy_from_slice(&len.to_le_bytes());
    raw[24..28].copy_from_slice(&pid.to_le_bytes());
    raw
}
