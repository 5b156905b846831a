//! System information, randomness, resource limits and CPU affinity.

use super::{time, value, SysResult, UserMemory};
use crate::errno::Errno;
use crate::loader::stack_size;
use crate::process::{GuestProcess, FD_LIMIT};
use crate::sys;

/// uname(buf): a fixed identity. The release names the Linux ABI the layer follows, tagged so
/// nobody mistakes it for a real kernel.
/// uname's fields: sysname, nodename, release, version, machine, domainname (/proc shows
/// them too).
pub(super) const UNAME: [&[u8]; 6] = [
    b"Linux",
    b"sandfork",
    b"6.1.0-sandfork",
    b"#1 SMP sandfork process VM",
    b"x86_64",
    b"(none)",
];

pub(crate) fn uname(_proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const FIELD: usize = 65;
    let mut buf = [0u8; FIELD * 6];
    for (i, field) in UNAME.iter().enumerate() {
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
    let mut put =
        |offset: usize, v: u64| info[offset..offset + 8].copy_from_slice(&v.to_le_bytes());
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
    if flags & !(GRND_NONBLOCK | GRND_RANDOM | GRND_INSECURE) != 0
        || flags & (GRND_RANDOM | GRND_INSECURE) == GRND_RANDOM | GRND_INSECURE
    {
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
/// RLIMIT_STACK's soft limit, which glibc reads once as the default stack size of every
/// thread it creates: 2 MiB, the size glibc itself uses when the limit is unlimited, so that
/// the default thread limit's 64 threads fit in the default 256 MiB of guest memory (guest
/// memory is the address space: a stack mapping takes its whole size). The main thread's own
/// stack is the loader's (`loader::stack_size`, the hard limit); nothing in glibc or Python
/// sizes it from the soft limit.
const THREAD_STACK: u64 = 2 << 20;
const RLIMIT_NOFILE: u64 = 7;
/// Processes at once: at most the tree's limit, and lowered per process (a fork copies it).
const RLIMIT_NPROC: u64 = 6;

/// The limit in effect for `resource` as (soft, hard): the VM's real bounds where there is one.
pub(super) fn limit(proc: &GuestProcess, resource: u64) -> Result<(u64, u64), Errno> {
    let mem = proc.config.mem_limit;
    Ok(match resource {
        0 | 1 | 5 | 10 | 15 => (RLIM_INFINITY, RLIM_INFINITY), // cpu, fsize, rss, locks, rttime
        2 | 9 => (mem, mem),                                   // data, as: guest memory
        // The hard limit is the main thread's stack; the soft one is what glibc gives a new
        // thread's stack by default (see THREAD_STACK).
        RLIMIT_STACK => (stack_size(mem).min(THREAD_STACK), stack_size(mem)),
        4 | 13 | 14 => (0, 0), // core, nice, rtprio
        RLIMIT_NPROC => proc.tree.nproc(proc.pid),
        RLIMIT_NOFILE => (proc.fds.limit(), FD_LIMIT),
        8 => (8 << 20, 8 << 20),  // memlock (Linux default)
        11 => (1024, 1024),       // sigpending
        12 => (819_200, 819_200), // msgqueue (Linux default)
        _ => return Err(Errno::EINVAL),
    })
}

/// Applies a new limit. RLIMIT_NOFILE (it bounds the fd table) and RLIMIT_NPROC (it bounds
/// forks, `ProcessTable::add_child`) are adjustable below their hard limits, which can only be
/// lowered; the others are properties of the VM, so setting them to anything but their value
/// is EPERM.
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
    if resource == RLIMIT_NPROC {
        let entry = proc.tree.get_mut(proc.pid).ok_or(Errno::ESRCH)?;
        entry.nproc = (soft, hard);
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
    if pid != 0 && pid != proc.pid {
        return Err(Errno::ESRCH);
    }
    if resource >= RLIMIT_COUNT {
        return Err(Errno::EINVAL);
    }
    let requested = if new != 0 {
        Some((user.read_u64(new)?, user.read_u64(new + 8)?))
    } else {
        None
    };
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

/// sched_getaffinity(pid, len, mask): one CPU.
pub(crate) fn sched_getaffinity(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    let [pid, len, mask, ..] = args;
    if !super::threads::names_a_thread(proc, pid) {
        return Err(Errno::ESRCH);
    }
    if len < 8 || !len.is_multiple_of(8) {
        return Err(Errno::EINVAL);
    }
    user.write_u64(mask, 1)?;
    value(8)
}

/// sched_setaffinity(pid, len, mask): accepted when the mask includes the one CPU.
pub(crate) fn sched_setaffinity(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    let [pid, len, mask, ..] = args;
    if !super::threads::names_a_thread(proc, pid) {
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

const SCHED_OTHER: u64 = 0;
const SCHED_FIFO: u64 = 1;
const SCHED_RR: u64 = 2;
const SCHED_BATCH: u64 = 3;
const SCHED_IDLE: u64 = 5;
/// The real-time policies' highest priority (sched_get_priority_max(2)).
const REAL_TIME_PRIORITY_MAX: u64 = 99;

/// The thread or process a scheduling call names: 0 is the caller, a negative pid EINVAL, one
/// that is neither a thread of the caller's nor a process of the tree ESRCH.
fn scheduled(proc: &GuestProcess, pid: u64) -> Result<(), Errno> {
    let pid = i64::from(pid as u32 as i32);
    if pid < 0 {
        return Err(Errno::EINVAL);
    }
    if super::threads::names_a_thread(proc, pid as u64) || proc.tree.get(pid as u64).is_some() {
        Ok(())
    } else {
        Err(Errno::ESRCH)
    }
}

/// The priorities a policy takes, as (min, max); an unknown policy is EINVAL.
fn priority_range(policy: u64) -> Result<(u64, u64), Errno> {
    match policy {
        SCHED_FIFO | SCHED_RR => Ok((1, REAL_TIME_PRIORITY_MAX)),
        SCHED_OTHER | SCHED_BATCH | SCHED_IDLE => Ok((0, 0)),
        _ => Err(Errno::EINVAL),
    }
}

/// sched_get_priority_max(policy)
pub(crate) fn sched_get_priority_max(
    _proc: &mut GuestProcess,
    _user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    value(priority_range(args[0])?.1)
}

/// sched_get_priority_min(policy)
pub(crate) fn sched_get_priority_min(
    _proc: &mut GuestProcess,
    _user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    value(priority_range(args[0])?.0)
}

/// sched_getscheduler(pid): every thread runs under SCHED_OTHER (the VMM's own time slices).
pub(crate) fn sched_getscheduler(
    proc: &mut GuestProcess,
    _user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    scheduled(proc, args[0])?;
    value(SCHED_OTHER)
}

/// sched_getparam(pid, param): priority 0, SCHED_OTHER's only one.
pub(crate) fn sched_getparam(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    if args[1] == 0 {
        return Err(Errno::EINVAL);
    }
    scheduled(proc, args[0])?;
    user.write_u32(args[1], 0)?;
    value(0)
}

/// Checks a (policy, param) pair as Linux does for an unprivileged caller: a priority outside
/// the policy's range is EINVAL; a real-time policy is EPERM (no RLIMIT_RTPRIO), and so is
/// SCHED_BATCH or SCHED_IDLE, which the VMM's scheduler does not keep; SCHED_OTHER stays.
fn set_policy(
    proc: &GuestProcess,
    user: &UserMemory,
    pid: u64,
    policy: u64,
    param: u64,
) -> SysResult {
    if param == 0 {
        return Err(Errno::EINVAL);
    }
    let priority = user.read_u32(param)? as i32;
    scheduled(proc, pid)?;
    let (min, max) = priority_range(policy)?;
    if priority < 0 || (priority as u64) < min || priority as u64 > max {
        return Err(Errno::EINVAL);
    }
    if policy == SCHED_OTHER {
        value(0)
    } else {
        Err(Errno::EPERM)
    }
}

/// sched_setscheduler(pid, policy, param)
pub(crate) fn sched_setscheduler(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    let [pid, policy, param, ..] = args;
    set_policy(proc, user, pid, u64::from(policy as u32), param)
}

/// sched_setparam(pid, param): within the caller's policy, SCHED_OTHER.
pub(crate) fn sched_setparam(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    set_policy(proc, user, args[0], SCHED_OTHER, args[1])
}

/// sched_rr_get_interval(pid, tp): the VMM scheduler's time slice.
pub(crate) fn sched_rr_get_interval(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    scheduled(proc, args[0])?;
    let slice = crate::process::threads::QUANTUM;
    user.write_timespec(args[1], slice.as_secs(), u64::from(slice.subsec_nanos()))?;
    value(0)
}
