//! User and group identity: every process runs as the unprivileged user the loader put in the
//! auxiliary vector. Process ids, groups and sessions are processes.rs's; the tree's first
//! process is pid 1, with no parent inside the VM (ppid 0, like a container's init).

use super::{value, SysResult, UserMemory};
use crate::abi::{GUEST_GID, GUEST_UID};
use crate::errno::Errno;
use crate::process::GuestProcess;

/// getuid(), geteuid()
pub(crate) fn getuid(_proc: &mut GuestProcess, _user: &UserMemory, _args: [u64; 6]) -> SysResult {
    value(GUEST_UID)
}

/// getgid(), getegid()
pub(crate) fn getgid(_proc: &mut GuestProcess, _user: &UserMemory, _args: [u64; 6]) -> SysResult {
    value(GUEST_GID)
}

/// getresuid(ruid, euid, suid) and getresgid: three ids written as u32.
fn write_three(user: &UserMemory, args: [u64; 6], id: u64) -> SysResult {
    for &addr in &args[..3] {
        user.write_u32(addr, id as u32)?;
    }
    value(0)
}

pub(crate) fn getresuid(_proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    write_three(user, args, GUEST_UID)
}

pub(crate) fn getresgid(_proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    write_three(user, args, GUEST_GID)
}

/// Whether the first `count` id arguments each keep the guest's own id `id` (-1: unchanged):
/// an unprivileged process may set its ids only to ids it already has.
fn keeps_own_id(args: [u64; 6], count: usize, id: u64) -> SysResult {
    if args[..count]
        .iter()
        .all(|&a| a as u32 == u32::MAX || u64::from(a as u32) == id)
    {
        value(0)
    } else {
        Err(Errno::EPERM)
    }
}

/// setuid(uid): to the guest's own uid only (POSIX_SPAWN_RESETIDS asks for that); any other
/// is EPERM. Each call reads only its own arguments: the registers past them hold anything.
pub(crate) fn setuid(_proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    keeps_own_id(args, 1, GUEST_UID)
}

/// setreuid(ruid, euid)
pub(crate) fn setreuid(_proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    keeps_own_id(args, 2, GUEST_UID)
}

/// setresuid(ruid, euid, suid)
pub(crate) fn setresuid(_proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    keeps_own_id(args, 3, GUEST_UID)
}

/// setgid, setregid, setresgid: likewise for the guest's own gid.
pub(crate) fn setgid(_proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    keeps_own_id(args, 1, GUEST_GID)
}

pub(crate) fn setregid(_proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    keeps_own_id(args, 2, GUEST_GID)
}

pub(crate) fn setresgid(_proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    keeps_own_id(args, 3, GUEST_GID)
}

/// getgroups(size, list): no supplementary groups.
pub(crate) fn getgroups(_proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    if (args[0] as i32) < 0 {
        return Err(Errno::EINVAL);
    }
    value(0)
}

/// umask(mask): returns the previous mask.
pub(crate) fn umask(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let old = proc.umask;
    proc.umask = (args[0] as u32) & 0o777;
    value(u64::from(old))
}

const CAPABILITY_VERSION_1: u32 = 0x1998_0330;
const CAPABILITY_VERSION_2: u32 = 0x2007_1026;
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// One `struct __user_cap_data_struct`: effective, permitted and inheritable (u32 each).
const CAPABILITY_DATA_BYTES: u64 = 12;

/// capget(header, data): the unprivileged guest holds no capabilities, so every set is empty
/// (Node asks at start-up). An unknown version gets the preferred one written back and EINVAL,
/// as on Linux; a null `data` only probes the version.
pub(crate) fn capget(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [header, data, ..] = args;
    let structs = match user.read_u32(header)? {
        CAPABILITY_VERSION_1 => 1,
        CAPABILITY_VERSION_2 | CAPABILITY_VERSION_3 => 2,
        _ => {
            user.write_u32(header, CAPABILITY_VERSION_3)?;
            return Err(Errno::EINVAL);
        }
    };
    let pid = user.read_u32(header + 4)? as i32;
    if pid < 0 {
        return Err(Errno::EINVAL);
    }
    if pid != 0 && proc.tree.get(pid as u64).is_none() {
        return Err(Errno::ESRCH);
    }
    if data != 0 {
        user.write(
            data,
            &[0; 2 * CAPABILITY_DATA_BYTES as usize][..(structs * CAPABILITY_DATA_BYTES) as usize],
        )?;
    }
    value(0)
}
