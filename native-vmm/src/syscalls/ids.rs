//! Process identity: the guest is process 1 of its own (one-process) system, its main thread's
//! tid is its pid (threads.rs), running as the unprivileged user the loader put in the
//! auxiliary vector. It has no parent inside the VM (ppid 0, like a container's init) and can
//! create no process (see the table for those calls).

use super::{value, SysResult, UserMemory};
use crate::abi::{GUEST_GID, GUEST_PID, GUEST_UID};
use crate::errno::Errno;
use crate::process::GuestProcess;

/// getpid(), getpgrp(): the one process and process group.
pub(crate) fn getpid(_proc: &mut GuestProcess, _user: &UserMemory, _args: [u64; 6]) -> SysResult {
    value(GUEST_PID)
}

pub(crate) fn getppid(_proc: &mut GuestProcess, _user: &UserMemory, _args: [u64; 6]) -> SysResult {
    value(0)
}

/// getpgid(pid), getsid(pid): for pid 0 or the guest's own pid.
pub(crate) fn getpgid(_proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    match args[0] {
        0 | GUEST_PID => value(GUEST_PID),
        _ => Err(Errno::ESRCH),
    }
}

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
pub(crate) fn capget(_proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
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
    if pid != 0 && pid as u64 != GUEST_PID {
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
