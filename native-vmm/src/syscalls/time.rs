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
//! The CPU-time clocks report the host thread running the vCPU (guest time plus the VMM's
//! time spent answering its calls), under every id Linux gives them: CLOCK_PROCESS_CPUTIME_ID,
//! CLOCK_THREAD_CPUTIME_ID and the encoded ids of clock_getcpuclockid / pthread_getcpuclockid
//! for this process and its threads (`cpu_clock`); another process's, or a thread that does not
//! exist, is EINVAL as on Linux.

use std::time::{Duration, Instant};

use super::{after, block, value, SysResult, UserMemory};
use crate::errno::Errno;
use crate::process::threads::WaitOn;
use crate::process::GuestProcess;
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
        CLOCK_REALTIME | CLOCK_MONOTONIC | CLOCK_MONOTONIC_RAW | CLOCK_REALTIME_COARSE | CLOCK_MONOTONIC_COARSE | CLOCK_BOOTTIME => Ok(clock as i32),
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
    Ok((sec.max(0) as u64).saturating_mul(1_000_000_000).saturating_add(nsec.max(0) as u64))
}

/// The calling thread sleeps for `duration`.
fn sleep(duration: Duration) -> SysResult {
    block(WaitOn::Sleep, Some(after(duration).unwrap_or_else(far_future)))
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

/// A CPU-time clock id encoded for a process or thread (Linux's CPUCLOCK layout: `~pid << 3`,
/// bit 2 per-thread, bits 0-1 which measure): the id of CLOCK_THREAD_CPUTIME_ID, which
/// measures it here, when it names this process (pid 0 or its own) or one of its live threads
/// (tid 0: the caller). Every measure (PROF, VIRT, SCHED) reads the same CPU time.
fn cpu_clock(proc: &GuestProcess, id: i32) -> Result<u64, Errno> {
    const PER_THREAD: i32 = 4;
    const WHICH_MASK: i32 = 3;
    const CLOCKFD: i32 = 3;
    if id >= 0 || id & WHICH_MASK == CLOCKFD {
        return Err(Errno::EINVAL);
    }
    let pid = !(id >> 3) as u64;
    let ours = if id & PER_THREAD != 0 { pid == 0 || proc.threads.get(pid).is_some() } else { pid == 0 || pid == super::ids::GUEST_PID };
    if ours {
        Ok(CLOCK_THREAD_CPUTIME_ID)
    } else {
        Err(Errno::EINVAL)
    }
}

/// The clock id `now_ns` reads for a guest clock id (a clockid_t, an int: the register's upper
/// half is not part of it); an encoded CPU clock becomes the CPU time.
fn readable_clock(proc: &GuestProcess, clock: u64) -> Result<u64, Errno> {
    match clock as u32 as i32 {
        id if id < 0 => cpu_clock(proc, id),
        id => Ok(id as u64),
    }
}

/// clock_gettime(clockid, tp)
pub(crate) fn clock_gettime(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let ns = now_ns(readable_clock(proc, args[0])?)?;
    user.write_timespec(args[1], ns / 1_000_000_000, ns % 1_000_000_000)?;
    value(0)
}

/// clock_getres(clockid, res): res may be NULL.
pub(crate) fn clock_getres(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    host_clock(readable_clock(proc, args[0])?)?;
    let res = if matches!(args[0], CLOCK_REALTIME_COARSE | CLOCK_MONOTONIC_COARSE) { COARSE_RESOLUTION_NS } else { 1 };
    if args[1] != 0 {
        user.write_timespec(args[1], 0, res)?;
    }
    value(0)
}

/// gettimeofday(tv, tz): either may be NULL; the time zone is always UTC.
pub(crate) fn gettimeofday(_proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
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
pub(crate) fn clock_nanosleep(_proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
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

/// times(buf): user time is the vCPU thread's CPU time; returns ticks of the monotonic clock.
pub(crate) fn times(_proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let ticks_per_ns = 1_000_000_000 / CLK_TCK;
    if args[0] != 0 {
        let cpu_ticks = now_ns(CLOCK_THREAD_CPUTIME_ID)? / ticks_per_ns;
        let mut tms = [0u8; 32];
        tms[..8].copy_from_slice(&cpu_ticks.to_le_bytes());
        user.write(args[0], &tms)?;
    }
    value(now_ns(CLOCK_MONOTONIC)? / ticks_per_ns)
}

/// getrusage(who, usage): CPU time as in times(); max RSS is the peak guest memory in use.
pub(crate) fn getrusage(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const RUSAGE_SELF: i64 = 0;
    const RUSAGE_CHILDREN: i64 = -1;
    const RUSAGE_THREAD: i64 = 1;
    let who = args[0] as i64;
    let mut usage = [0u8; 144];
    match who {
        RUSAGE_SELF | RUSAGE_THREAD => {
            let cpu = now_ns(CLOCK_THREAD_CPUTIME_ID)?;
            usage[..8].copy_from_slice(&(cpu / 1_000_000_000).to_le_bytes());
            usage[8..16].copy_from_slice(&(cpu % 1_000_000_000 / 1000).to_le_bytes());
            // ru_maxrss is in KiB.
            usage[32..40].copy_from_slice(&(proc.peak_memory() / 1024).to_le_bytes());
        }
        RUSAGE_CHILDREN => {}
        _ => return Err(Errno::EINVAL),
    }
    user.write(args[1], &usage)?;
    value(0)
}
