//! Extended attributes: setxattr, getxattr, listxattr and removexattr, each by path (following
//! a final symlink), by path without following it (the l* forms) and by fd (the f* forms).
//! The arguments are checked in Linux's order (flags, name, value, then the file); the rules
//! of the name spaces and nodes are the file system's (`Vfs::set_xattr`, fs/xattr.rs).

use super::files::{fd_arg, path_at, resolve, AT_FDCWD, O_PATH};
use super::{value, SysResult, UserMemory};
use crate::errno::Errno;
use crate::fs::{Node, XattrSetMode, XATTR_LIST_MAX, XATTR_NAME_MAX, XATTR_VALUE_MAX};
use crate::process::{GuestProcess, Object};

const XATTR_CREATE: u32 = 0x1;
const XATTR_REPLACE: u32 = 0x2;

/// How a call names its file (its first argument).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Naming {
    /// A path whose final symlink is followed.
    Path,
    /// A path whose final symlink is the file (lsetxattr and the like).
    LinkPath,
    /// A file descriptor.
    Fd,
}

/// The file a call is about: a node, or None for a pipe, socket or other object of no file
/// system. An O_PATH descriptor is EBADF, as it is for every call that touches the file.
fn subject(
    proc: &GuestProcess,
    user: &UserMemory,
    naming: Naming,
    arg: u64,
) -> Result<Option<Node>, Errno> {
    if naming == Naming::Fd {
        let desc = proc.fds.get(fd_arg(arg))?;
        if desc.flags & O_PATH as u32 != 0 {
            return Err(Errno::EBADF);
        }
        return Ok(match desc.object {
            Object::Node(node) => Some(node),
            _ => None,
        });
    }
    let (base, path) = path_at(proc, user, AT_FDCWD as u64, arg)?;
    Ok(Some(resolve(proc, base, &path, naming == Naming::Path)?))
}

/// The attribute name argument: ERANGE when empty or longer than XATTR_NAME_MAX.
fn read_name(user: &UserMemory, addr: u64) -> Result<Vec<u8>, Errno> {
    let name = user.read_cstr(addr, XATTR_NAME_MAX, Errno::ERANGE)?;
    if name.is_empty() {
        return Err(Errno::ERANGE);
    }
    Ok(name)
}

/// Copies `bytes` into the caller's buffer of `size` bytes and returns their length; size 0
/// asks for the length only. A shorter buffer is ERANGE, or E2BIG when it is already the
/// largest the call fills (`max`).
fn reply(user: &UserMemory, buf: u64, size: u64, bytes: &[u8], max: usize) -> SysResult {
    if size != 0 {
        if bytes.len() as u64 > size.min(max as u64) {
            return Err(if size >= max as u64 {
                Errno::E2BIG
            } else {
                Errno::ERANGE
            });
        }
        user.write(buf, bytes)?;
    }
    value(bytes.len() as u64)
}

/// (file, name, value, size, flags)
fn set(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6], naming: Naming) -> SysResult {
    let [file, name, value_addr, size, flags, _] = args;
    let flags = flags as u32;
    if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
        return Err(Errno::EINVAL);
    }
    let name = read_name(user, name)?;
    if size > XATTR_VALUE_MAX as u64 {
        return Err(Errno::E2BIG);
    }
    let bytes = if size == 0 {
        Vec::new()
    } else {
        user.read_vec(value_addr, size)?
    };
    let subject = subject(proc, user, naming, file)?;
    let mode = XattrSetMode {
        create: flags & XATTR_CREATE != 0,
        replace: flags & XATTR_REPLACE != 0,
    };
    proc.config.vfs.set_xattr(subject, &name, &bytes, mode)?;
    value(0)
}

/// (file, name, value, size): the value's length.
fn get(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6], naming: Naming) -> SysResult {
    let [file, name, buf, size, ..] = args;
    let name = read_name(user, name)?;
    let subject = subject(proc, user, naming, file)?;
    let bytes = proc.config.vfs.get_xattr(subject, &name)?;
    reply(user, buf, size, &bytes, XATTR_VALUE_MAX)
}

/// (file, list, size): the names' length, each with its NUL.
fn list(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6], naming: Naming) -> SysResult {
    let [file, buf, size, ..] = args;
    let subject = subject(proc, user, naming, file)?;
    let names = proc.config.vfs.list_xattrs(subject)?;
    reply(user, buf, size, &names, XATTR_LIST_MAX)
}

/// (file, name)
fn remove(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6], naming: Naming) -> SysResult {
    let name = read_name(user, args[1])?;
    let subject = subject(proc, user, naming, args[0])?;
    proc.config.vfs.remove_xattr(subject, &name)?;
    value(0)
}

/// The twelve handlers: each operation by path, by path without following a final symlink,
/// and by fd.
macro_rules! handlers {
    ($($name:ident: $op:ident by $naming:ident;)*) => {
        $(
            pub(crate) fn $name(
                proc: &mut GuestProcess,
                user: &UserMemory,
                args: [u64; 6],
            ) -> SysResult {
                $op(proc, user, args, Naming::$naming)
            }
        )*
    };
}

handlers! {
    setxattr: set by Path;
    lsetxattr: set by LinkPath;
    fsetxattr: set by Fd;
    getxattr: get by Path;
    lgetxattr: get by LinkPath;
    fgetxattr: get by Fd;
    listxattr: list by Path;
    llistxattr: list by LinkPath;
    flistxattr: list by Fd;
    removexattr: remove by Path;
    lremovexattr: remove by LinkPath;
    fremovexattr: remove by Fd;
}
