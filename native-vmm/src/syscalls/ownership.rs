//! Ownership and priority of an unprivileged process: the guest (user 1000) owns what it wrote
//! in the overlay, root the rest (see `Vfs::stat`). A chown that changes nothing succeeds
//! (after the file is found, as on Linux), as does giving its own file to itself; any other is
//! EPERM. The nice value can only be raised.

use super::files::{fd_arg, stat_of_fd, stat_target, AT_EMPTY_PATH, AT_FDCWD, AT_SYMLINK_NOFOLLOW};
use super::{value, SysResult, UserMemory};
use crate::abi::{GUEST_GID, GUEST_UID};
use crate::errno::Errno;
use crate::fs::Stat;
use crate::process::GuestProcess;

/// uid and gid -1 (as C ints): leave them as they are.
fn changes_nothing(uid: u64, gid: u64) -> bool {
    uid as u32 == u32::MAX && gid as u32 == u32::MAX
}

fn owner_change(stat: &Stat, uid: u64, gid: u64) -> SysResult {
    let unchanged =
        |given: u64, own: u64| given as u32 == u32::MAX || u64::from(given as u32) == own;
    let own_file =
        u64::from(stat.uid) == GUEST_UID && unchanged(uid, GUEST_UID) && unchanged(gid, GUEST_GID);
    if changes_nothing(uid, gid) || own_file {
        value(0)
    } else {
        Err(Errno::EPERM)
    }
}

/// fchownat(dirfd, path, uid, gid, flags)
pub(crate) fn fchownat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if args[4] & !(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH) != 0 {
        return Err(Errno::EINVAL);
    }
    let stat = stat_target(proc, user, args[0], args[1], args[4])?;
    owner_change(&stat, args[2], args[3])
}

/// chown(path, uid, gid)
pub(crate) fn chown(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    fchownat(
        proc,
        user,
        [AT_FDCWD as u64, args[0], args[1], args[2], 0, 0],
    )
}

/// lchown(path, uid, gid)
pub(crate) fn lchown(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    fchownat(
        proc,
        user,
        [
            AT_FDCWD as u64,
            args[0],
            args[1],
            args[2],
            AT_SYMLINK_NOFOLLOW,
            0,
        ],
    )
}

/// fchown(fd, uid, gid): EBADF for a descriptor that is not open.
pub(crate) fn fchown(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let stat = stat_of_fd(proc, fd_arg(args[0]))?;
    owner_change(&stat, args[1], args[2])
}

const PRIO_PROCESS: u64 = 0;
const PRIO_PGRP: u64 = 1;
const PRIO_USER: u64 = 2;

/// Whether (which, who) names the guest: its process, process group or user (0: the caller's).
fn names_the_guest(me: u64, which: u64, who: u64) -> Result<(), Errno> {
    let who = u64::from(who as u32);
    match which {
        PRIO_PROCESS | PRIO_PGRP if who == 0 || who == me => Ok(()),
        PRIO_USER if who == 0 || who == GUEST_UID => Ok(()),
        PRIO_PROCESS | PRIO_PGRP | PRIO_USER => Err(Errno::ESRCH),
        _ => Err(Errno::EINVAL),
    }
}

/// getpriority(which, who): 20 - nice, as the kernel returns it (glibc turns it into nice).
pub(crate) fn getpriority(
    proc: &mut GuestProcess,
    _user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    names_the_guest(proc.pid, args[0], args[1])?;
    value((20 - proc.nice) as u64)
}

/// setpriority(which, who, nice): clamped to -20..=19; lowering it needs privilege (EACCES).
pub(crate) fn setpriority(
    proc: &mut GuestProcess,
    _user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    names_the_guest(proc.pid, args[0], args[1])?;
    let nice = (args[2] as i32).clamp(-20, 19);
    if nice < proc.nice {
        return Err(Errno::EACCES);
    }
    proc.nice = nice;
    value(0)
}
