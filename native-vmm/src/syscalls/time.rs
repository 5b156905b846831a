//! Clocks, sleeps and CPU-time accounting.
//!
//! The guest's clocks are the VMM's vDSO clock (`vdso::clock`: the host's TSC converted with
//! the parameters the guests' vDSO reads, so a call here and a vDSO read agree and monotonic
//! never goes backwards between them), or the host's clocks where there is none. glibc reads
//! them through the vDSO; what reaches this module is a raw system call, a clock the vDSO does
//! not serve (the CPU-time ones) or a guest without the vDSO's data page. A sleep
//! blocks the calling thread until its time (`process::threads`): other threads run meanwhile,
//! and when none can, the VMM really sleeps on the host, never past the run's deadline (a
//! program that sleeps longer than its time limit ends as a timeout at the deadline). Returning
//! at once would make `time.sleep` lie about elapsed time.
//!
//! The CPU-time clocks are each guest thread's own time on the vCPU (`process::threads`
//! charges the host thread's CPU clock, guest time plus the VMM's time answering its calls, to
//! the thread that held the vCPU) and the process's, all its threads'; a fork of a template
//! starts them at zero. They answer under every id Linux gives them: CLOCK_PROCESS_CPUTIME_ID,
//! CLOCK_THREAD_CPUTIME_ID and the encoded ids of clock_getcpuclockid / pthread_getcpuclockid
//! for this process and its threads (`cpu_time_ns`); another process's, or a thread that does
//! not exist, is EINVAL as on Linux. times() and getrusage() report the same times, and a
//! process's reaped children's (`process::tree::Usage`).

use std::time::{Duration, Instant};

use super::{after, block, value, SysResult, UserMemory};
use crate::errno::Errno;
use crate::process::threads::WaitOn;
use crate::process::{GuestProcess, Usage};
use crate::sys;
use crate::vdso::clock::{self as vdso_clock, Kind};

pub(crate) const CLOCK_REALTIME: u64 = 0;
pub(crate) const CLOCK_MONOTONIC: u64 = 1;
const CLOCK_PROCESS_CPUTIME_ID: u64 = 2;
const CLOCK_THREAD_CPUTIME_ID: u64 = 3;
const CLOCK_MONOTONIC_RAW: u64 = 4;
const CLOCK_REALTIME_COARSE: u64 = 5;
const CLOCK_MONOTONIC_COARSE: u64 = 6;
pub(crate) const CLOCK_BOOTTIME: u64 = 7;
const TIMER_ABSTIME: u64 = 1;
/// Clock ticks per second (times(2), AT_CLKTCK).
const CLK_TCK: u64 = 100;
/// Resolution of the coarse clocks (one 250 Hz tick).
const COARSE_RESOLUTION_NS: u64 = 4_000_000;

/// The host clock answering a guest clock id, or EINVAL.
fn host_clock(clock: u64) -> Result<i32, Errno> {
    match clock {
        CLOCK_REALTIME
        | CLOCK_MONOTONIC
        | CLOCK_MONOTONIC_RAW
        | CLOCK_REALTIME_COARSE
        | CLOCK_MONOTONIC_COARSE
        | CLOCK_BOOTTIME => Ok(clock as i32),
        CLOCK_PROCESS_CPUTIME_ID | CLOCK_THREAD_CPUTIME_ID => Ok(CLOCK_THREAD_CPUTIME_ID as i32),
        _ => Err(Errno::EINVAL),
    }
}

/// The vDSO clock that answers a guest clock id (MONOTONIC_RAW and the coarse clocks read the
/// same clock as their fine counterparts: never stepped, never behind them).
fn vdso_kind(clock: u64) -> Option<Kind> {
    match clock {
        CLOCK_REALTIME | CLOCK_REALTIME_COARSE => Some(Kind::Realtime),
        CLOCK_MONOTONIC | CLOCK_MONOTONIC_RAW | CLOCK_MONOTONIC_COARSE => Some(Kind::Monotonic),
        CLOCK_BOOTTIME => Some(Kind::Boottime),
        _ => None,
    }
}

/// Reads a guest clock as nanoseconds.
pub(crate) fn now_ns(clock: u64) -> Result<u64, Errno> {
    if let (Some(kind), Some(shared)) = (vdso_kind(clock), vdso_clock::shared()) {
        return Ok(shared.now_ns(kind));
    }
    let (sec, nsec) = sys::clock_time(host_clock(clock)?).map_err(|_| Errno::EINVAL)?;
    let host = (sec.max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(nsec.max(0) as u64);
    // The monotonic and boot clocks count from the guest's boot, not the host's.
    Ok(match vdso_kind(clock) {
        Some(Kind::Monotonic | Kind::Boottime) => {
            host.saturating_add_signed(vdso_clock::guest_shift_ns())
        }
        _ => host,
    })
}

/// The calling thread sleeps for `duration`.
fn sleep(duration: Duration) -> SysResult {
    block(
        WaitOn::Sleep,
        Some(after(duration).unwrap_or_else(far_future)),
    )
}

/// An instant past any run's deadline, for times too far to represent.
pub(crate) fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365 * 30)
}

/// The instant when guest clock `clock` reads `absolute` (now, if it already passed).
pub(crate) fn instant_at(clock: u64, absolute: Duration) -> Result<Instant, Errno> {
    let wait = absolute.saturating_sub(Duration::from_nanos(now_ns(clock)?));
    Ok(after(wait).unwrap_or_else(far_future))
}

/// The CPU time (ns) a CPU-time clock id names: CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID
/// or an id encoded for a process or thread (Linux's CPUCLOCK layout: `~pid << 3`, bit 2
/// per-thread, bits 0-1 which measure; every measure, PROF, VIRT and SCHED, reads the same
/// time here), which must name this process (pid 0 or its own) or one of its live threads
/// (tid 0: the caller), else EINVAL. None for the other clocks. The id is a clockid_t, an int:
/// the register's upper half is not part of it.
fn cpu_time_ns(proc: &GuestProcess, clock: u64) -> Option<Result<u64, Errno>> {
    const PER_THREAD: i32 = 4;
    const WHICH_MASK: i32 = 3;
    const CLOCKFD: i32 = 3;
    let threads = &proc.threads;
    let this_thread = || Ok(threads.thread_cpu_ns(threads.current_tid()).unwrap_or(0));
    let id = clock as u32 as i32;
    Some(match id {
        id if id == CLOCK_PROCESS_CPUTIME_ID as i32 => Ok(threads.process_cpu_ns()),
        id if id == CLOCK_THREAD_CPUTIME_ID as i32 => this_thread(),
        id if id >= 0 => return None,
        id if id & WHICH_MASK == CLOCKFD => Err(Errno::EINVAL),
        id => match (!(id >> 3) as u64, id & PER_THREAD != 0) {
            (0, true) => this_thread(),
            (tid, true) => threads.thread_cpu_ns(tid).ok_or(Errno::EINVAL),
            (pid, false) if pid == 0 || pid == proc.pid => Ok(threads.process_cpu_ns()),
            _ => Err(Errno::EINVAL),
        },
    })
}

/// clock_gettime(clockid, tp)
pub(crate) fn clock_gettime(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    let ns = match cpu_time_ns(proc, args[0]) {
        Some(cpu) => cpu?,
        None => now_ns(u64::from(args[0] as u32))?,
    };
    user.write_timespec(args[1], ns / 1_000_000_000, ns % 1_000_000_000)?;
    value(0)
}

/// clock_getres(clockid, res): res may be NULL.
pub(crate) fn clock_getres(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    if let Some(cpu) = cpu_time_ns(proc, args[0]) {
        cpu?;
    } else {
        host_clock(u64::from(args[0] as u32))?;
    }
    let res = if matches!(args[0], CLOCK_REALTIME_COARSE | CLOCK_MONOTONIC_COARSE) {
        COARSE_RESOLUTION_NS
    } else {
        1
    };
    if args[1] != 0 {
        user.write_timespec(args[1], 0, res)?;
    }
    value(0)
}

/// gettimeofday(tv, tz): either may be NULL; the time zone is always UTC.
pub(crate) fn gettimeofday(
    _proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    let ns = now_ns(CLOCK_REALTIME)?;
    if args[0] != 0 {
        user.write_timespec(args[0], ns / 1_000_000_000, ns % 1_000_000_000 / 1000)?;
    }
    if args[1] != 0 {
        user.write(args[1], &[0u8; 8])?;
    }
    value(0)
}

/// time(tloc): tloc may be NULL.
pub(crate) fn time(_proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let sec = now_ns(CLOCK_REALTIME)? / 1_000_000_000;
    if args[0] != 0 {
        user.write_u64(args[0], sec)?;
    }
    value(sec)
}

/// nanosleep(req, rem): rem is only written when a sleep is interrupted, which never happens.
pub(crate) fn nanosleep(_proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let (sec, nsec) = user.read_timespec(args[0])?;
    sleep(Duration::new(sec, nsec))
}

/// clock_nanosleep(clockid, flags, req, rem), relative or TIMER_ABSTIME.
pub(crate) fn clock_nanosleep(
    _proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    let clock = args[0];
    if matches!(clock, CLOCK_THREAD_CPUTIME_ID) {
        return Err(Errno::EINVAL);
    }
    host_clock(clock)?;
    let (sec, nsec) = user.read_timespec(args[2])?;
    let requested = Duration::new(sec, nsec);
    if args[1] & TIMER_ABSTIME != 0 {
        return block(WaitOn::Sleep, Some(instant_at(clock, requested)?));
    }
    sleep(requested)
}

/// times(buf): user time is the process's CPU time, the children's user time its reaped
/// children's (`Usage`); returns ticks of the monotonic clock.
pub(crate) fn times(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let ticks_per_ns = 1_000_000_000 / CLK_TCK;
    if args[0] != 0 {
        let children = proc
            .tree
            .get(proc.pid)
            .map_or(0, |e| e.children_used.cpu_ns);
        let mut tms = [0u8; 32];
        tms[..8].copy_from_slice(&(proc.process_usage().cpu_ns / ticks_per_ns).to_le_bytes());
        tms[16..24].copy_from_slice(&(children / ticks_per_ns).to_le_bytes());
        user.write(args[0], &tms)?;
    }
    value(now_ns(CLOCK_MONOTONIC)? / ticks_per_ns)
}

/// A `struct rusage` of `usage`: the CPU time as user time (the VMM does not tell the guest's
/// own time from its time answering the guest's calls), the peak memory as max RSS; the
/// other counters zero.
pub(crate) fn rusage_bytes(usage: Usage) -> [u8; 144] {
    let mut bytes = [0u8; 144];
    bytes[..8].copy_from_slice(&(usage.cpu_ns / 1_000_000_000).to_le_bytes());
    bytes[8..16].copy_from_slice(&(usage.cpu_ns % 1_000_000_000 / 1000).to_le_bytes());
    // ru_maxrss is in KiB.
    bytes[32..40].copy_from_slice(&(usage.peak_memory / 1024).to_le_bytes());
    bytes
}

/// getrusage(who, usage): the process's (the programs an execve replaced included), the
/// calling thread's, or the reaped children's with their own reaped children's
/// (RUSAGE_CHILDREN), as `rusage_bytes` writes them; max RSS is the peak guest memory given
/// out (a thread reports its process's).
pub(crate) fn getrusage(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const RUSAGE_SELF: i64 = 0;
    const RUSAGE_CHILDREN: i64 = -1;
    const RUSAGE_THREAD: i64 = 1;
    let who = i64::from(args[0] as u32 as i32);
    let usage = match who {
        RUSAGE_SELF => proc.process_usage(),
        RUSAGE_THREAD => {
            let threads = &proc.threads;
            Usage {
                cpu_ns: threads.thread_cpu_ns(threads.current_tid()).unwrap_or(0),
                peak_memory: proc.peak_memory(),
            }
        }
        RUSAGE_CHILDREN => proc
            .tree
            .get(proc.pid)
            .map_or_else(Usage::default, |e| e.children_used),
        _ => return Err(Errno::EINVAL),
    };
    user.write(args[1], &rusage_bytes(usage))?;
    value(0)
}
