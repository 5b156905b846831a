//! memfd_create and file seals: a memfd is an overlay file in no directory (named
//! "/memfd:NAME (deleted)" in /proc, as on Linux), read, written, truncated and mapped like
//! any overlay file, so a MAP_SHARED mapping of it is shared across fork. Its bytes count
//! against the overlay's limit and go at its last close. Seals (F_ADD_SEALS, F_GET_SEALS)
//! stop writes, growing and shrinking through write(2) and ftruncate(2); a shared mapping made
//! before a seal keeps writing.

use super::{value, SysResult, UserMemory};
use crate::errno::Errno;
use crate::fs::{F_SEAL_FUTURE_WRITE, F_SEAL_GROW, F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_WRITE};
use crate::process::{Description, GuestProcess, Object, O_RDWR};

const MFD_CLOEXEC: u64 = 0x1;
const MFD_ALLOW_SEALING: u64 = 0x2;
/// Linux's limit on the name, without the "memfd:" prefix and the NUL.
const NAME_MAX: usize = 249;
const O_LARGEFILE: u32 = 0o100000;
const ALL_SEALS: u32 =
    F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_FUTURE_WRITE;

/// memfd_create(name, flags): MFD_CLOEXEC and MFD_ALLOW_SEALING (without it the file starts
/// sealed against new seals); other flags (huge pages, exec control) are EINVAL.
pub(crate) fn memfd_create(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    let [name, flags, ..] = args;
    if flags & !(MFD_CLOEXEC | MFD_ALLOW_SEALING) != 0 {
        return Err(Errno::EINVAL);
    }
    let name = user.read_cstr(name, NAME_MAX, Errno::EINVAL)?;
    if name.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    let seals = if flags & MFD_ALLOW_SEALING != 0 {
        0
    } else {
        F_SEAL_SEAL
    };
    let node = proc
        .config
        .vfs
        .create_memfd(&[&b"memfd:"[..], &name].concat(), seals)?;
    let description = Description::new(Object::Node(node), O_RDWR | O_LARGEFILE);
    match proc.fds.install(description, 0, flags & MFD_CLOEXEC != 0) {
        Ok(fd) => value(fd),
        Err(e) => {
            proc.config.vfs.close(node);
            Err(e)
        }
    }
}

/// fcntl(fd, F_ADD_SEALS, seals): EINVAL for unknown seals or a file that cannot be sealed,
/// EPERM on a descriptor not open for writing or once F_SEAL_SEAL is set.
pub(super) fn add_seals(proc: &mut GuestProcess, fd: u64, seals: u64) -> SysResult {
    let desc = proc.fds.get(fd)?;
    let Object::Node(node) = desc.object else {
        return Err(Errno::EINVAL);
    };
    if seals & !u64::from(ALL_SEALS) != 0 {
        return Err(Errno::EINVAL);
    }
    proc.config.vfs.seals(node)?;
    if !desc.writable() {
        return Err(Errno::EPERM);
    }
    proc.config.vfs.add_seals(node, seals as u32)?;
    value(0)
}

/// fcntl(fd, F_GET_SEALS): EINVAL for a file that cannot be sealed.
pub(super) fn get_seals(proc: &GuestProcess, fd: u64) -> SysResult {
    match proc.fds.get(fd)?.object {
        Object::Node(node) => value(u64::from(proc.config.vfs.seals(node)?)),
        _ => Err(Errno::EINVAL),
    }
}
