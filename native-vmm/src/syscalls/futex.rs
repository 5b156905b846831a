//! futex(2): the operations glibc's mutexes, condition variables, semaphores, barriers,
//! pthread_join and once use. A word in the process's own memory is the process's alone (the
//! private flag changes nothing): its waiters live in the thread table (`process::threads`), a
//! wait blocks the calling thread, a wake makes waiters runnable in the order they came. A word
//! in shared memory (a MAP_SHARED mapping) may be waited on by other processes, each a VM of
//! its own: there a wait is a readiness wait, tried again whenever another thread or process
//! made progress, and it ends once the word no longer holds the value (EAGAIN, which every
//! futex user takes as "look again"), as a wake that the waiter may see spuriously.
//! Priority-inheritance operations are ENOSYS (glibc uses them only for PI mutexes).

use std::time::Duration;

use super::{after, block, time, value, wait_ready, SysResult, UserMemory};
use crate::errno::Errno;
use crate::process::threads::WaitOn;
use crate::process::GuestProcess;

const FUTEX_WAIT: u64 = 0;
const FUTEX_WAKE: u64 = 1;
const FUTEX_REQUEUE: u64 = 3;
const FUTEX_CMP_REQUEUE: u64 = 4;
const FUTEX_WAKE_OP: u64 = 5;
const FUTEX_WAIT_BITSET: u64 = 9;
const FUTEX_WAKE_BITSET: u64 = 10;
const FUTEX_PRIVATE_FLAG: u64 = 128;
const FUTEX_CLOCK_REALTIME: u64 = 256;
const FUTEX_BITSET_MATCH_ANY: u32 = u32::MAX;

/// futex(uaddr, op, val, timeout, uaddr2, val3)
pub(crate) fn futex(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [uaddr, op, val, timeout, uaddr2, val3] = args;
    if !uaddr.is_multiple_of(4) {
        return Err(Errno::EINVAL);
    }
    let cmd = op & !(FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME);
    // Only the absolute (bitset) wait takes a clock.
    if op & FUTEX_CLOCK_REALTIME != 0 && cmd != FUTEX_WAIT_BITSET && cmd != FUTEX_WAIT {
        return Err(Errno::ENOSYS);
    }
    let val = val as u32;
    match cmd {
        FUTEX_WAIT | FUTEX_WAIT_BITSET => {
            let bitset = if cmd == FUTEX_WAIT {
                FUTEX_BITSET_MATCH_ANY
            } else {
                val3 as u32
            };
            if bitset == 0 {
                return Err(Errno::EINVAL);
            }
            let until = if timeout == 0 {
                None
            } else {
                let (sec, nsec) = user.read_timespec(timeout)?;
                let requested = Duration::new(sec, nsec);
                if cmd == FUTEX_WAIT_BITSET {
                    // An absolute time on CLOCK_MONOTONIC, or CLOCK_REALTIME with the flag.
                    let clock = if op & FUTEX_CLOCK_REALTIME != 0 {
                        time::CLOCK_REALTIME
                    } else {
                        time::CLOCK_MONOTONIC
                    };
                    Some(time::instant_at(clock, requested)?)
                } else {
                    Some(after(requested).unwrap_or_else(time::far_future))
                }
            };
            // Checked after the timeout is read: a bad timeout pointer is EFAULT either way.
            if user.read_u32(uaddr)? != val {
                return Err(Errno::EAGAIN);
            }
            if user.guest().shared_at(uaddr).is_some() {
                return shared_wait(proc, until);
            }
            block(
                WaitOn::Futex {
                    addr: uaddr,
                    bitset,
                },
                until,
            )
        }
        FUTEX_WAKE => value(
            proc.threads
                .futex_wake(uaddr, count(val), FUTEX_BITSET_MATCH_ANY),
        ),
        FUTEX_WAKE_BITSET => {
            if val3 as u32 == 0 {
                return Err(Errno::EINVAL);
            }
            value(proc.threads.futex_wake(uaddr, count(val), val3 as u32))
        }
        FUTEX_REQUEUE | FUTEX_CMP_REQUEUE => {
            // The fourth argument is the requeue count here, not a timeout.
            let requeue = timeout as u32;
            if (val as i32) < 0 || (requeue as i32) < 0 || !uaddr2.is_multiple_of(4) {
                return Err(Errno::EINVAL);
            }
            if cmd == FUTEX_CMP_REQUEUE && user.read_u32(uaddr)? != val3 as u32 {
                return Err(Errno::EAGAIN);
            }
            value(
                proc.threads
                    .futex_requeue(uaddr, u64::from(val), u64::from(requeue), uaddr2),
            )
        }
        FUTEX_WAKE_OP => {
            let old = wake_op(user, uaddr2, val3 as u32)?;
            let mut woken = proc
                .threads
                .futex_wake(uaddr, count(val), FUTEX_BITSET_MATCH_ANY);
            if wake_op_compare(old, val3 as u32)? {
                woken +=
                    proc.threads
                        .futex_wake(uaddr2, count(timeout as u32), FUTEX_BITSET_MATCH_ANY);
            }
            value(woken)
        }
        _ => Err(Errno::ENOSYS),
    }
}

/// A wait on a shared word that still holds its value: a readiness wait (see the module
/// comment), which ends with ETIMEDOUT when its timer runs out first.
fn shared_wait(proc: &GuestProcess, until: Option<std::time::Instant>) -> SysResult {
    if proc.threads.current().last_attempt {
        return Err(Errno::ETIMEDOUT);
    }
    let timeout = until.map(|t| t.saturating_duration_since(std::time::Instant::now()));
    wait_ready(proc, timeout)
}

/// A wake count (an int: negative or huge both mean "all").
fn count(val: u32) -> u64 {
    if (val as i32) < 0 {
        u64::MAX
    } else {
        u64::from(val)
    }
}

/// FUTEX_WAKE_OP's atomic update of *uaddr2; returns the old value.
fn wake_op(user: &UserMemory, uaddr2: u64, encoded: u32) -> Result<u32, Errno> {
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
    user.write_u32(uaddr2, new)?;
    Ok(old)
}

/// FUTEX_WAKE_OP's comparison of the old value of *uaddr2 (signed, as Linux compares).
fn wake_op_compare(old: u32, encoded: u32) -> Result<bool, Errno> {
    let cmp = (encoded >> 24) & 15;
    let cmparg = (encoded & 0xfff) as i32;
    let old = old as i32;
    Ok(match cmp {
        0 => old == cmparg,
        1 => old != cmparg,
        2 => old < cmparg,
        3 => old <= cmparg,
        4 => old > cmparg,
        5 => old >= cmparg,
        _ => return Err(Errno::ENOSYS),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_op_compares_as_linux_does() {
        // FUTEX_OP(FUTEX_OP_SET, 0, FUTEX_OP_CMP_GT, 1): glibc's condition variables use it.
        let encoded = (4 << 24) | 1;
        assert!(wake_op_compare(2, encoded).unwrap());
        assert!(!wake_op_compare(1, encoded).unwrap());
        assert!(
            !wake_op_compare(u32::MAX, encoded).unwrap(),
            "signed: -1 is not > 1"
        );
        assert_eq!(wake_op_compare(0, 9 << 24), Err(Errno::ENOSYS));
        assert_eq!(count(u32::MAX), u64::MAX);
        assert_eq!(count(3), 3);
    }
}
