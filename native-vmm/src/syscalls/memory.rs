//! Memory calls over the process's memory map (process/memory_map.rs).
//!
//! Protections are recorded, not enforced: the page tables are fixed and map all user memory
//! read-write-execute (DESIGN.md), so the VM boundary, not page permissions, is the isolation.
//! A file mapping is a copy of the file's bytes (MAP_PRIVATE semantics); a shared writable
//! file mapping is refused with ENODEV because its writes could never reach the file. (Why not
//! copy in and write back at msync/munmap: the page tables are fixed, so nothing marks which
//! pages were written; write-back would have to cover every unmap path (munmap, MAP_FIXED over
//! it, mremap, exit), keep the file open and live in the snapshot, and still differ from Linux,
//! where read(2) and write(2) see the mapping at once. Python's mmap with ACCESS_READ or
//! ACCESS_COPY works; its default, a shared writable mapping, raises OSError(ENODEV).)
//!
//! Out of memory: a single mmap or mremap larger than the whole guest memory can never fit
//! and gets ENOMEM, as Linux's overcommit heuristic refuses an allocation larger than RAM and
//! swap together (`bytearray(sys.maxsize // 2)` raises MemoryError and the program goes on).
//! One that would fit, but finds no room left because the program filled its memory, stops
//! the run with `RunStatus::OutOfMemory`, as if the kernel's OOM killer had struck: a memory
//! bomb ends with that status, which names the limit, not with a traceback it may catch. brk keeps Linux's contract (the old break comes back and
//! malloc falls over to mmap), so a full heap reaches the same stop through mmap. The one
//! exception is a thread stack (MAP_STACK, as glibc's pthread_create maps it): it gets ENOMEM,
//! which pthread_create turns into EAGAIN, the clean error a program starting threads expects
//! (Python: "can't start new thread"), as at the thread limit.

use super::{value, SysResult, SyscallOutcome, UserMemory};
use crate::errno::Errno;
use crate::fs::FileKind;
use crate::process::{GuestProcess, MapError, Object, Placement};
use crate::status::RunStatus;

const PROT_WRITE: u64 = 2;
const PROT_MASK: u64 = 0x7 | 0x0100_0000 | 0x0200_0000; // READ|WRITE|EXEC, GROWSDOWN, GROWSUP
const MAP_SHARED: u64 = 0x01;
const MAP_PRIVATE: u64 = 0x02;
const MAP_SHARED_VALIDATE: u64 = 0x03;
const MAP_TYPE: u64 = 0x0f;
const MAP_FIXED: u64 = 0x10;
const MAP_ANONYMOUS: u64 = 0x20;
const MAP_FIXED_NOREPLACE: u64 = 0x10_0000;
const MAP_STACK: u64 = 0x2_0000;

fn map_error(proc: &GuestProcess, err: MapError) -> SysResult {
    match err {
        MapError::Invalid => Err(Errno::EINVAL),
        MapError::NotMapped => Err(Errno::ENOMEM),
        MapError::Exists => Err(Errno::EEXIST),
        MapError::NoRoom => Ok(SyscallOutcome::Stop(RunStatus::OutOfMemory {
            limit_bytes: proc.config.mem_limit,
        })),
    }
}

/// An allocation of `len` bytes found no room: ENOMEM if it could never fit, else `map_error`.
fn no_room(proc: &GuestProcess, len: u64) -> SysResult {
    if len > proc.config.mem_limit {
        Err(Errno::ENOMEM)
    } else {
        map_error(proc, MapError::NoRoom)
    }
}

/// mmap(addr, length, prot, flags, fd, offset)
pub(crate) fn mmap(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [addr, len, prot, flags, fd, offset] = args;
    let kind = flags & MAP_TYPE;
    if !matches!(kind, MAP_SHARED | MAP_PRIVATE | MAP_SHARED_VALIDATE)
        || len == 0
        || prot & !PROT_MASK != 0
    {
        return Err(Errno::EINVAL);
    }
    if !offset.is_multiple_of(4096) {
        return Err(Errno::EINVAL);
    }
    // The file's bytes to copy in, checked before anything is mapped.
    let file = if flags & MAP_ANONYMOUS == 0 {
        let desc = proc.fds.get(u64::from(fd as u32))?;
        let Object::Node(node) = desc.object else {
            return Err(Errno::ENODEV);
        };
        if proc.config.vfs.kind(node)? != FileKind::Regular {
            return Err(Errno::ENODEV);
        }
        if !desc.readable() {
            return Err(Errno::EACCES);
        }
        if kind != MAP_PRIVATE && prot & PROT_WRITE != 0 {
            return Err(if desc.writable() {
                Errno::ENODEV
            } else {
                Errno::EACCES
            });
        }
        Some((node, offset))
    } else {
        None
    };
    let placement = if flags & MAP_FIXED_NOREPLACE != 0 {
        Placement::FixedNoReplace(addr)
    } else if flags & MAP_FIXED != 0 {
        Placement::Fixed(addr)
    } else {
        Placement::Hint(addr)
    };
    let start = match proc.memory.map(user.guest(), placement, len, prot as u32) {
        Ok(start) => start,
        // A thread stack that does not fit is ENOMEM: pthread_create reports it as EAGAIN, an
        // error the program handles where it starts threads (see the module comment).
        Err(MapError::NoRoom) if flags & MAP_STACK != 0 => return Err(Errno::ENOMEM),
        Err(MapError::NoRoom) => return no_room(proc, len),
        Err(e) => return map_error(proc, e),
    };
    if let Some((node, offset)) = file {
        let data = proc.config.vfs.contents(node)?;
        let from = offset.min(data.len() as u64) as usize;
        let n = (data.len() - from).min(len as usize);
        user.write(start, &data[from..from + n])?;
    }
    value(start)
}

/// munmap(addr, length)
pub(crate) fn munmap(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    match proc.memory.unmap(args[0], args[1]) {
        Ok(()) => value(0),
        Err(e) => map_error(proc, e),
    }
}

/// mprotect(addr, length, prot): recorded only (see the module comment).
pub(crate) fn mprotect(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    if args[2] & !PROT_MASK != 0 {
        return Err(Errno::EINVAL);
    }
    match proc.memory.protect(args[0], args[1], args[2] as u32) {
        Ok(()) => value(0),
        Err(e) => map_error(proc, e),
    }
}

/// brk(addr): returns the new break, or the old one when it cannot move.
pub(crate) fn brk(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    value(proc.memory.set_brk(user.guest(), args[0]))
}

/// madvise(addr, length, advice): DONTNEED and REMOVE zero the range (as Linux's private
/// anonymous memory reads afterwards); the other known advice changes nothing here.
pub(crate) fn madvise(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const MADV_DONTNEED: u64 = 4;
    const MADV_REMOVE: u64 = 9;
    let [addr, len, advice, ..] = args;
    if !addr.is_multiple_of(4096) {
        return Err(Errno::EINVAL);
    }
    match advice {
        MADV_DONTNEED | MADV_REMOVE => match proc.memory.discard(user.guest(), addr, len) {
            Ok(()) => value(0),
            Err(e) => map_error(proc, e),
        },
        // NORMAL..WILLNEED, FREE, DONTFORK..PAGEOUT, POPULATE_READ/WRITE, COLLAPSE.
        0..=3 | 8 | 10..=21 | 22..=23 | 25 => value(0),
        _ => Err(Errno::EINVAL),
    }
}

/// mremap(old, old_size, new_size, flags, new_addr): MREMAP_MAYMOVE is supported;
/// MREMAP_FIXED and MREMAP_DONTUNMAP are EINVAL.
pub(crate) fn mremap(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const MREMAP_MAYMOVE: u64 = 1;
    let [addr, old_len, new_len, flags, ..] = args;
    if flags & !MREMAP_MAYMOVE != 0 {
        return Err(Errno::EINVAL);
    }
    match proc.memory.remap(
        user.guest(),
        addr,
        old_len,
        new_len,
        flags & MREMAP_MAYMOVE != 0,
    ) {
        Ok(start) => value(start),
        Err(MapError::NoRoom) => no_room(proc, new_len),
        Err(e) => map_error(proc, e),
    }
}

/// msync(addr, length, flags): nothing to write back (file mappings are private copies, and
/// shared writable file mappings are refused), so only the arguments are checked.
pub(crate) fn msync(_proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    const MS_ASYNC: u64 = 1;
    const MS_INVALIDATE: u64 = 2;
    const MS_SYNC: u64 = 4;
    let [addr, _, flags, ..] = args;
    if !addr.is_multiple_of(4096)
        || flags & !(MS_ASYNC | MS_INVALIDATE | MS_SYNC) != 0
        || flags & (MS_ASYNC | MS_SYNC) == MS_ASYNC | MS_SYNC
    {
        return Err(Errno::EINVAL);
    }
    value(0)
}
