//! Memory calls over the process's memory map (process/memory_map.rs).
//!
//! Protections are recorded, not enforced: the page tables are fixed and map all user memory
//! read-write-execute (DESIGN.md), so the VM boundary, not page permissions, is the isolation.
//! A private file mapping is a copy of the file's bytes. A shared mapping (MAP_SHARED) shows
//! shared memory (`memory::SharedMemory`): fresh for an anonymous one, the file's own for an
//! overlay file (whose bytes live there from then on, so read(2), write(2) and every process's
//! mappings see the same bytes); processes forked later show it at the same place. An image
//! file cannot change, so a shared mapping of it is a copy, and a writable one is EACCES, as
//! for a file opened read-only.
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
use crate::memory::SharedMemory;
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
    let shared = kind != MAP_PRIVATE;
    // What the mapping shows, checked before anything is mapped.
    let source = if flags & MAP_ANONYMOUS == 0 {
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
        if shared && prot & PROT_WRITE != 0 && !desc.writable() {
            return Err(Errno::EACCES);
        }
        if shared && proc.config.vfs.is_overlay(node) {
            Source::Shared(proc.config.vfs.share_file(node)?, offset)
        } else if shared && prot & PROT_WRITE != 0 {
            return Err(Errno::EACCES);
        } else {
            Source::Copy(node, offset)
        }
    } else if shared {
        Source::AnonymousShared
    } else {
        Source::Zero
    };
    let placement = if flags & MAP_FIXED_NOREPLACE != 0 {
        Placement::FixedNoReplace(addr)
    } else if flags & MAP_FIXED != 0 {
        // What was mapped there goes, shared memory first (the map zeroes reused memory).
        unshare(user, addr, len)?;
        Placement::Fixed(addr)
    } else {
        Placement::Hint(addr)
    };
    // A private copy of an image file (which never changes) may be mapped again over itself.
    let file = match source {
        Source::Copy(node, offset) if !proc.config.vfs.is_overlay(node) => Some((node, offset)),
        _ => None,
    };
    let mapped = proc
        .memory
        .map_view(user.guest(), placement, len, prot as u32, file);
    let (start, shown) = match mapped {
        Ok(mapped) => mapped,
        // A thread stack that does not fit is ENOMEM: pthread_create reports it as EAGAIN, an
        // error the program handles where it starts threads (see the module comment).
        Err(MapError::NoRoom) if flags & MAP_STACK != 0 => return Err(Errno::ENOMEM),
        Err(MapError::NoRoom) => return no_room(proc, len),
        Err(e) => return map_error(proc, e),
    };
    match source {
        Source::Zero => {}
        Source::Copy(..) if shown => {}
        Source::Copy(node, offset) => {
            let data = proc.config.vfs.contents(node)?;
            let from = offset.min(data.len() as u64) as usize;
            let n = (data.len() - from).min(len as usize);
            user.write(start, &data[from..from + n])?;
        }
        Source::Shared(memory, offset) => share_or_unmap(proc, user, start, len, &memory, offset)?,
        // Made once the map found room: never larger than the memory limit.
        Source::AnonymousShared => {
            let memory = SharedMemory::anonymous(crate::layout::page_align_up(len));
            match memory {
                Ok(memory) => share_or_unmap(proc, user, start, len, &memory, 0)?,
                Err(_) => {
                    let _ = proc.memory.unmap(start, len);
                    return Err(Errno::ENOMEM);
                }
            }
        }
    }
    value(start)
}

/// What a new mapping shows.
enum Source {
    /// Zeros (private anonymous memory).
    Zero,
    /// A private copy of a file's bytes from an offset.
    Copy(crate::fs::Node, u64),
    /// Shared memory from an offset.
    Shared(std::sync::Arc<SharedMemory>, u64),
    /// Fresh shared memory (anonymous MAP_SHARED).
    AnonymousShared,
}

/// Shows `memory` from `offset` at the new mapping `[start, start+len)`; ENOMEM, with the mapping
/// undone, when the host cannot.
fn share_or_unmap(
    proc: &mut GuestProcess,
    user: &UserMemory,
    start: u64,
    len: u64,
    memory: &std::sync::Arc<SharedMemory>,
    offset: u64,
) -> Result<(), Errno> {
    let size = crate::layout::page_align_up(len);
    if user.guest().share(start, size, memory, offset).is_err() {
        let _ = proc.memory.unmap(start, len);
        return Err(Errno::ENOMEM);
    }
    Ok(())
}

/// Gives `[addr, addr+len)` its own memory back where it shows shared memory.
fn unshare(user: &UserMemory, addr: u64, len: u64) -> Result<(), Errno> {
    let len = crate::layout::page_align_up(len);
    let end = addr.checked_add(len).ok_or(Errno::EINVAL)?;
    let size = user.guest().size();
    if addr >= size {
        return Ok(());
    }
    user.guest()
        .unshare(addr, end.min(size) - addr)
        .map_err(|_| Errno::ENOMEM)
}

/// munmap(addr, length)
pub(crate) fn munmap(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    match proc.memory.unmap(args[0], args[1]) {
        Ok(unmapped) => {
            unshare(user, args[0], args[1])?;
            for (start, end) in unmapped {
                // Best effort: the memory map zeroes the range before handing it out again.
                let _ = user.guest().release_range(start, end - start);
            }
            value(0)
        }
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

/// madvise(addr, length, advice): DONTNEED zeroes private memory in the range (as Linux's
/// private anonymous memory reads afterwards; shared memory keeps its bytes), REMOVE zeroes it
/// all (it frees a shared mapping's backing); the other known advice changes nothing here.
pub(crate) fn madvise(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const MADV_DONTNEED: u64 = 4;
    const MADV_REMOVE: u64 = 9;
    let [addr, len, advice, ..] = args;
    if !addr.is_multiple_of(4096) {
        return Err(Errno::EINVAL);
    }
    match advice {
        MADV_REMOVE => match proc.memory.discard(user.guest(), addr, len) {
            Ok(()) => value(0),
            Err(e) => map_error(proc, e),
        },
        MADV_DONTNEED => {
            for (start, end) in user.guest().own_parts(addr, len) {
                if let Err(e) = proc.memory.discard(user.guest(), start, end - start) {
                    return map_error(proc, e);
                }
            }
            value(0)
        }
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
    // A shared range moves or grows with what it shows.
    let shared = user.guest().shared_at(addr);
    if shared.is_some() {
        unshare(user, addr, old_len)?;
    }
    let moved = match proc.memory.remap(
        user.guest(),
        addr,
        old_len,
        new_len,
        flags & MREMAP_MAYMOVE != 0,
    ) {
        Ok(start) => start,
        Err(MapError::NoRoom) => {
            reshare(user, shared, addr, old_len)?;
            return no_room(proc, new_len);
        }
        Err(e) => {
            reshare(user, shared, addr, old_len)?;
            return map_error(proc, e);
        }
    };
    reshare(user, shared, moved, new_len)?;
    value(moved)
}

/// Shows `shared` (as `GuestMemory::shared_at` found it) at `[addr, addr+len)` again.
fn reshare(
    user: &UserMemory,
    shared: Option<(std::sync::Arc<SharedMemory>, u64)>,
    addr: u64,
    len: u64,
) -> Result<(), Errno> {
    if let Some((memory, offset)) = shared {
        let len = crate::layout::page_align_up(len);
        user.guest()
            .share(addr, len, &memory, offset)
            .map_err(|_| Errno::ENOMEM)?;
    }
    Ok(())
}

/// msync(addr, length, flags): nothing to write back (a shared file mapping shows the file's
/// own bytes, a private one a copy), so only the arguments are checked.
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
