//! eventfd: a 64-bit counter behind a descriptor (libuv wakes its event loop through one, so
//! Node cannot start without it). The counter lives in the open file description, so dup'd
//! fds share it as on Linux. A read that finds it zero, or a write that would take it past
//! 2^64-2, waits for another thread like a pipe does (`syscalls::wait_ready`), or fails with
//! EAGAIN when the description is non-blocking.

use super::{value, wait_ready, SysResult, UserMemory};
use crate::abi::EVENTFD_MAX_COUNT;
use crate::errno::Errno;
use crate::process::{Description, GuestProcess, Object, O_NONBLOCK, O_RDWR};

const EFD_SEMAPHORE: u64 = 1;
const EFD_NONBLOCK: u64 = O_NONBLOCK as u64;
const EFD_CLOEXEC: u64 = 0o2000000;

/// eventfd(initval): eventfd2 without flags.
pub(crate) fn eventfd(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    eventfd2(proc, user, [args[0], 0, 0, 0, 0, 0])
}

/// eventfd2(initval, flags): EFD_SEMAPHORE, EFD_NONBLOCK, EFD_CLOEXEC.
pub(crate) fn eventfd2(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (initval, flags) = (u64::from(args[0] as u32), u64::from(args[1] as u32));
    if flags & !(EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC) != 0 {
        return Err(Errno::EINVAL);
    }
    let object = Object::EventFd {
        count: initval,
        semaphore: flags & EFD_SEMAPHORE != 0,
    };
    let status = O_RDWR | (flags & EFD_NONBLOCK) as u32;
    value(proc.fds.install(
        Description::new(object, status),
        0,
        flags & EFD_CLOEXEC != 0,
    )?)
}

/// read(2) on an eventfd: the counter as 8 bytes, then zero (semaphore mode: 1, then one less).
pub(super) fn read(
    proc: &mut GuestProcess,
    user: &UserMemory,
    fd: u64,
    buf: u64,
    len: u64,
) -> SysResult {
    if len < 8 {
        return Err(Errno::EINVAL);
    }
    user.check(buf, 8)?;
    let desc = proc.fds.get_mut(fd)?;
    let nonblocking = desc.nonblocking();
    let Object::EventFd { count, semaphore } = &mut desc.object else {
        return Err(Errno::EINVAL);
    };
    let taken = if *semaphore { (*count).min(1) } else { *count };
    *count -= taken;
    if taken == 0 {
        return if nonblocking {
            Err(Errno::EAGAIN)
        } else {
            wait_ready(proc, None)
        };
    }
    user.write(buf, &taken.to_le_bytes())?;
    value(8)
}

/// write(2) on an eventfd: adds the 8-byte value to the counter (u64::MAX is EINVAL).
pub(super) fn write(
    proc: &mut GuestProcess,
    user: &UserMemory,
    fd: u64,
    buf: u64,
    len: u64,
) -> SysResult {
    if len < 8 {
        return Err(Errno::EINVAL);
    }
    let added = user.read_u64(buf)?;
    if added == u64::MAX {
        return Err(Errno::EINVAL);
    }
    let desc = proc.fds.get_mut(fd)?;
    let nonblocking = desc.nonblocking();
    let Object::EventFd { count, .. } = &mut desc.object else {
        return Err(Errno::EINVAL);
    };
    let fits = EVENTFD_MAX_COUNT - *count >= added;
    if fits {
        *count += added;
        return value(8);
    }
    if nonblocking {
        Err(Errno::EAGAIN)
    } else {
        wait_ready(proc, None)
    }
}
