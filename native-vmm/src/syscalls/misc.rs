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
        6 => (proc.processes().limit(), proc.processes().limit()), // nproc: the tree's limit
        RLIMIT_NOFILE => (proc.fds.limit(), FD_LIMIT),
        8 => (8 << 20, 8 << 20),  // memlock (Linux default)
        11 => (1024, 1024),       // sigpending
        12 => (819_200, 819_200), // msgqueue (Linux default)
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
