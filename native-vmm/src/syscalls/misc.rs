//! System information, randomness, resource limits, thread setup and futexes.

use std::time::Duration;

use super::{ids::GUEST_PID, stop_unsupported, time, value, SysResult, SyscallOutcome, UserMemory};
use crate::errno::Errno;
use crate::loader::stack_size;
use crate::process::{GuestProcess, FD_LIMIT};
use crate::sys;

/// uname(buf): a fixed identity. The release names the Linux ABI the layer follows, tagged so
/// nobody mistakes it for a real kernel.
pub(crate) fn uname(_proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const FIELD: usize = 65;
    let fields: [&[u8]; 6] = [b"Linux", b"sandfork", b"6.1.0-sandfork", b"#1 SMP sandfork process VM", b"x86_64", b"(none)"];
    let mut buf = [0u8; FIELD * 6];
    for (i, field) in fields.iter().enumerate() {
        buf[i * FIELD..i * FIELD + field.len()].copy_from_slice(field);
    }
    user.write(args[0], &buf)?;
    value(0)
}

/// sysinfo(info): the guest's memory (its limit and what it holds) and one process.
pub(crate) fn sysinfo(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let total = proc.config.mem_limit;
    let free = total.saturating_sub(proc.memory_in_use());
    let uptime = time::now_ns(time::CLOCK_BOOTTIME)? / 1_000_000_000;
    let mut info = [0u8; 112];
    let mut put = |offset: usize, v: u64| info[offset..offset + 8].copy_from_slice(&v.to_le_bytes());
    put(0, uptime);
    put(32, total); // totalram
    put(40, free); // freeram
    info[80..82].copy_from_slice(&1u16.to_le_bytes()); // procs
    info[104..108].copy_from_slice(&1u32.to_le_bytes()); // mem_unit
    user.write(args[0], &info)?;
    value(0)
}

/// getrandom(buf, len, flags): fresh host entropy on every call (never a seed shared by forks).
pub(crate) fn getrandom(_proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const GRND_NONBLOCK: u64 = 1;
    const GRND_RANDOM: u64 = 2;
    const GRND_INSECURE: u64 = 4;
    /// Bytes returned per call at most (Linux returns short counts for large requests too).
    const MAX_PER_CALL: u64 = 1 << 20;
    let [buf, len, flags, ..] = args;
    if flags & !(GRND_NONBLOCK | GRND_RANDOM | GRND_INSECURE) != 0 || flags & (GRND_RANDOM | GRND_INSECURE) == GRND_RANDOM | GRND_INSECURE {
        return Err(Errno::EINVAL);
    }
    let len = len.min(MAX_PER_CALL);
    user.check(buf, len)?;
    let mut chunk = [0u8; 4096];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        sys::fill_random(&mut chunk[..n]).map_err(|_| Errno::EIO)?;
        user.write(buf + done, &chunk[..n])?;
        done += n as u64;
    }
    value(len)
}

const RLIM_INFINITY: u64 = u64::MAX;
const RLIMIT_COUNT: u64 = 16;
const RLIMIT_STACK: u64 = 3;
const RLIMIT_NOFILE: u64 = 7;

/// The limit in effect for `resource` as (soft, hard): the VM's real bounds where there is one.
fn limit(proc: &GuestProcess, resource: u64) -> Result<(u64, u64), Errno> {
    let mem = proc.config.mem_limit;
    Ok(match resource {
        0 | 1 | 5 | 10 | 15 => (RLIM_INFINITY, RLIM_INFINITY), // cpu, fsize, rss, locks, rttime
        2 | 9 => (mem, mem),                                    // data, as: guest memory
        RLIMIT_STACK => (stack_size(mem), stack_size(mem)),
        4 | 13 | 14 => (0, 0),                 // core, nice, rtprio
        6 => (1, 1),                           // nproc: the one process
        RLIMIT_NOFILE => (proc.fds.limit(), FD_LIMIT),
        8 => (8 << 20, 8 << 20),               // memlock (Linux default)
        11 => (1024, 1024),                    // sigpending
        12 => (819_200, 819_200),              // msgqueue (Linux default)
        _ => return Err(Errno::EINVAL),
    })
}

/// Applies a new limit. Only RLIMIT_NOFILE is adjustable (it bounds the fd table); the others
/// are properties of the VM, so setting them to anything but their value is EPERM.
fn set_limit(proc: &mut GuestProcess, resource: u64, soft: u64, hard: u64) -> Result<(), Errno> {
    let (_, cur_hard) = limit(proc, resource)?;
    if soft > hard {
        return Err(Errno::EINVAL);
    }
    if hard > cur_hard {
        return Err(Errno::EPERM);
    }
    if resource == RLIMIT_NOFILE {
        proc.fds.set_limit(soft);
        return Ok(());
    }
    if (soft, hard) != limit(proc, resource)? {
        return Err(Errno::EPERM);
    }
    Ok(())
}

fn write_rlimit(user: &UserMemory, addr: u64, (soft, hard): (u64, u64)) -> Result<(), Errno> {
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&soft.to_le_bytes());
    raw[8..].copy_from_slice(&hard.to_le_bytes());
    user.write(addr, &raw)
}

/// prlimit64(pid, resource, new, old)
pub(crate) fn prlimit64(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [pid, resource, new, old, ..] = args;
    if pid != 0 && pid != GUEST_PID {
        return Err(Errno::ESRCH);
    }
    if resource >= RLIMIT_COUNT {
        return Err(Errno::EINVAL);
    }
    let requested = if new != 0 { Some((user.read_u64(new)?, user.read_u64(new + 8)?)) } else { None };
    if old != 0 {
        write_rlimit(user, old, limit(proc, resource)?)?;
    }
    if let Some((soft, hard)) = requested {
        set_limit(proc, resource, soft, hard)?;
    }
    value(0)
}

/// getrlimit(resource, rlim)
pub(crate) fn getrlimit(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    write_rlimit(user, args[1], limit(proc, args[0])?)?;
    value(0)
}

/// setrlimit(resource, rlim)
pub(crate) fn setrlimit(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (soft, hard) = (user.read_u64(args[1])?, user.read_u64(args[1] + 8)?);
    set_limit(proc, args[0], soft, hard)?;
    value(0)
}

/// arch_prctl(code, addr): FS base for TLS; everything else is EINVAL.
pub(crate) fn arch_prctl(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const ARCH_SET_FS: u64 = 0x1002;
    const ARCH_GET_FS: u64 = 0x1003;
    /// Linux refuses bases at or above the end of the user half of the address space.
    const TASK_SIZE: u64 = (1 << 47) - 4096;
    match args[0] {
        ARCH_SET_FS if args[1] >= TASK_SIZE => Err(Errno::EPERM),
        ARCH_SET_FS => {
            proc.fs_base = args[1];
            Ok(SyscallOutcome::SetFsBase(args[1]))
        }
        ARCH_GET_FS => {
            user.write_u64(args[1], proc.fs_base)?;
            value(0)
        }
        _ => Err(Errno::EINVAL),
    }
}

/// set_tid_address(tidptr): recorded; returns the tid.
pub(crate) fn set_tid_address(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    proc.clear_child_tid = args[0];
    value(GUEST_PID)
}

/// set_robust_list(head, len): recorded (only a dying thread's waiters would use it).
pub(crate) fn set_robust_list(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    const ROBUST_LIST_HEAD_SIZE: u64 = 24;
    if args[1] != ROBUST_LIST_HEAD_SIZE {
        return Err(Errno::EINVAL);
    }
    proc.robust_list = args[0];
    value(0)
}

/// sched_getaffinity(pid, len, mask): one CPU.
pub(crate) fn sched_getaffinity(_proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [pid, len, mask, ..] = args;
    if pid != 0 && pid != GUEST_PID {
        return Err(Errno::ESRCH);
    }
    if len < 8 || !len.is_multiple_of(8) {
        return Err(Errno::EINVAL);
    }
    user.write_u64(mask, 1)?;
    value(8)
}

/// sched_setaffinity(pid, len, mask): accepted when the mask includes the one CPU.
pub(crate) fn sched_setaffinity(_proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [pid, len, mask, ..] = args;
    if pid != 0 && pid != GUEST_PID {
        return Err(Errno::ESRCH);
    }
    if len == 0 {
        return Err(Errno::EINVAL);
    }
    let mut first = [0u8; 1];
    user.read(mask, &mut first)?;
    if first[0] & 1 == 0 {
        return Err(Errno::EINVAL);
    }
    value(0)
}

/// sched_yield(): there is nothing else to run.
pub(crate) fn sched_yield(_proc: &mut GuestProcess, _user: &UserMemory, _args: [u64; 6]) -> SysResult {
    value(0)
}

/// futex(uaddr, op, val, timeout, uaddr2, val3) for one thread: there is never a waiter to
/// wake, and a wait whose value matches could only be ended by another thread. A timed wait
/// sleeps out its timeout (bounded by the deadline) and reports ETIMEDOUT; an untimed one would
/// hang forever, so the run stops as unsupported instead of burning the time limit.
pub(crate) fn futex(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const FUTEX_WAIT: u64 = 0;
    const FUTEX_WAKE: u64 = 1;
    const FUTEX_REQUEUE: u64 = 3;
    const FUTEX_CMP_REQUEUE: u64 = 4;
    const FUTEX_WAKE_OP: u64 = 5;
    const FUTEX_WAIT_BITSET: u64 = 9;
    const FUTEX_WAKE_BITSET: u64 = 10;
    const FUTEX_CLOCK_REALTIME: u64 = 256;
    const FUTEX_CMD_MASK: u64 = 127;
    let [uaddr, op, val, timeout, uaddr2, val3] = args;
    if !uaddr.is_multiple_of(4) {
        return Err(Errno::EINVAL);
    }
    match op & FUTEX_CMD_MASK {
        cmd @ (FUTEX_WAIT | FUTEX_WAIT_BITSET) => {
            if cmd == FUTEX_WAIT_BITSET && val3 as u32 == 0 {
                return Err(Errno::EINVAL);
            }
            if user.read_u32(uaddr)? != val as u32 {
                return Err(Errno::EAGAIN);
            }
            if timeout == 0 {
                return stop_unsupported(202);
            }
            let (sec, nsec) = user.read_timespec(timeout)?;
            let requested = Duration::new(sec, nsec);
            let wait = if cmd == FUTEX_WAIT_BITSET {
                // The bitset form takes an absolute time on CLOCK_MONOTONIC or CLOCK_REALTIME.
                let clock = if op & FUTEX_CLOCK_REALTIME != 0 { time::CLOCK_REALTIME } else { time::CLOCK_MONOTONIC };
                requested.saturating_sub(Duration::from_nanos(time::now_ns(clock)?))
            } else {
                requested
            };
            time::sleep_bounded(proc, wait);
            Err(Errno::ETIMEDOUT)
        }
        FUTEX_WAKE | FUTEX_WAKE_BITSET | FUTEX_REQUEUE => value(0),
        FUTEX_CMP_REQUEUE => {
            if user.read_u32(uaddr)? != val3 as u32 {
                return Err(Errno::EAGAIN);
            }
            value(0)
        }
        FUTEX_WAKE_OP => {
            wake_op(user, uaddr2, val3 as u32)?;
            value(0)
        }
        _ => Err(Errno::ENOSYS),
    }
}

/// FUTEX_WAKE_OP's atomic update of *uaddr2 (its comparison only decides whom to wake).
fn wake_op(user: &UserMemory, uaddr2: u64, encoded: u32) -> Result<(), Errno> {
    if !uaddr2.is_multiple_of(4) {
        return Err(Errno::EINVAL);
    }
    let op = (encoded >> 28) & 7;
    let shift = (encoded >> 28) & 8 != 0;
    let mut oparg = (encoded >> 12) & 0xfff;
    if shift {
        oparg = 1u32.checked_shl(oparg).unwrap_or(0);
    }
    let old = user.read_u32(uaddr2)?;
    let new = match op {
        0 => oparg,
        1 => old.wrapping_add(oparg),
        2 => old | oparg,
        3 => old & !oparg,
        4 => old ^ oparg,
        _ => return Err(Errno::ENOSYS),
    };
    user.write_u32(uaddr2, new)
}
