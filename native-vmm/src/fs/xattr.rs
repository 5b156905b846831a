//! Extended attributes as Linux's tmpfs keeps them for an unprivileged user.
//!
//! Only the `user.` name space is stored: per overlay node (so per inode: hard links share
//! them), on regular files and directories, counted against the overlay's limit. The other
//! name spaces answer as Linux answers a process without capabilities: `trusted.` is EPERM to
//! change and absent to read, `security.` EPERM to change and absent to read (only a privileged
//! process or a security module writes there), the POSIX ACL names read as absent and cannot be
//! set (no ACLs are kept), any other name EOPNOTSUPP. Image files and /dev hold none and the
//! image is read-only (EROFS); /proc, pipes and sockets have no attributes at all.
//!
//! The checks run in the kernel's order (`xattr_permission`, the capability hook, the name
//! space's handler), so each error is the one Linux gives first.

use std::collections::BTreeMap;

use super::FileKind;
use crate::errno::Errno;

/// Longest attribute name, prefix included (XATTR_NAME_MAX).
pub const NAME_MAX: usize = 255;
/// Largest attribute value (XATTR_SIZE_MAX).
pub const VALUE_MAX: usize = 65536;
/// Largest name list listxattr returns (XATTR_LIST_MAX).
pub const LIST_MAX: usize = 65536;

/// One node's attributes: full name (`user.` included) to value.
pub(crate) type Attributes = BTreeMap<Vec<u8>, Vec<u8>>;

const USER: &[u8] = b"user.";
const TRUSTED: &[u8] = b"trusted.";
const SECURITY: &[u8] = b"security.";
const SYSTEM: &[u8] = b"system.";
const ACL_NAMES: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];

/// setxattr's XATTR_CREATE and XATTR_REPLACE: whether the attribute must be new, must exist,
/// or (both) fails either way, as Linux checks them in that order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetMode {
    pub create: bool,
    pub replace: bool,
}

/// The name space a name is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Space {
    User,
    Trusted,
    Security,
    /// system.posix_acl_access and system.posix_acl_default.
    Acl,
    /// Any other system. name.
    System,
    /// No known prefix.
    Unknown,
}

impl Space {
    fn of(name: &[u8]) -> Space {
        if name.starts_with(USER) {
            Space::User
        } else if name.starts_with(TRUSTED) {
            Space::Trusted
        } else if name.starts_with(SECURITY) {
            Space::Security
        } else if ACL_NAMES.contains(&name) {
            Space::Acl
        } else if name.starts_with(SYSTEM) {
            Space::System
        } else {
            Space::Unknown
        }
    }
}

/// Whether `name` is one a node may store: a `user.` name with something after the prefix,
/// no longer than NAME_MAX (what a snapshot's decoder accepts).
pub(crate) fn is_user_name(name: &[u8]) -> bool {
    name.len() > USER.len() && name.len() <= NAME_MAX && Space::of(name) == Space::User
}

/// Where a node's attributes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// An overlay node: it stores `user.` attributes.
    Stored,
    /// A file system that supports attributes but holds none here (the image, /dev).
    Empty,
    /// A file system without attribute support (/proc, pipes, sockets).
    Unsupported,
}

/// What the rules need to know of a node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    pub kind: FileKind,
    /// The guest's permission bits on it (rwx of its owner or of others).
    pub access: u32,
    /// Whether the guest owns it.
    pub owned: bool,
    /// A directory with its sticky bit.
    pub sticky: bool,
    /// On a read-only file system (EROFS for any change).
    pub read_only: bool,
    pub holder: Holder,
}

impl Target {
    /// A pipe, socket, epoll or event fd or a standard stream: an owner-private node of no
    /// file system with attributes (pipefs, sockfs, anonymous inodes).
    pub const STREAM: Target = Target {
        kind: FileKind::Fifo,
        access: 0o6,
        owned: true,
        sticky: false,
        read_only: false,
        holder: Holder::Unsupported,
    };

    fn permits(&self, bits: u32) -> Result<(), Errno> {
        if self.access & bits == bits {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    fn user_attributes_allowed(&self) -> bool {
        matches!(self.kind, FileKind::Regular | FileKind::Directory)
    }

    /// The file system's handler for `name`: EOPNOTSUPP where there is none, EINVAL for a bare
    /// prefix.
    fn handler(&self, name: &[u8], space: Space) -> Result<(), Errno> {
        if self.holder == Holder::Unsupported {
            return Err(Errno::EOPNOTSUPP);
        }
        match space {
            Space::System | Space::Unknown => Err(Errno::EOPNOTSUPP),
            _ if [USER, TRUSTED, SECURITY].contains(&name) => Err(Errno::EINVAL),
            _ => Ok(()),
        }
    }

    /// getxattr's checks: Ok for a `user.` name whose value may be read (the caller looks it
    /// up), else the error Linux gives (ENODATA for what an unprivileged process cannot see).
    pub(crate) fn check_read(&self, name: &[u8]) -> Result<(), Errno> {
        let space = Space::of(name);
        match space {
            Space::Trusted => return Err(Errno::ENODATA),
            Space::User if !self.user_attributes_allowed() => return Err(Errno::ENODATA),
            Space::User | Space::Unknown => self.permits(super::R_OK)?,
            Space::Security | Space::System | Space::Acl => {}
        }
        if space == Space::Acl {
            return Err(if self.holder == Holder::Unsupported {
                Errno::EOPNOTSUPP
            } else {
                Errno::ENODATA
            });
        }
        self.handler(name, space)?;
        match space {
            Space::User => Ok(()),
            _ => Err(Errno::ENODATA),
        }
    }

    /// setxattr's and removexattr's checks: Ok(true) for a `user.` name that may be changed,
    /// Ok(false) for a removal that succeeds with nothing to do (an ACL that is not there).
    pub(crate) fn check_change(&self, name: &[u8], removing: bool) -> Result<bool, Errno> {
        if self.read_only {
            return Err(Errno::EROFS);
        }
        let space = Space::of(name);
        if space == Space::Acl {
            return if self.holder == Holder::Unsupported || !removing {
                Err(Errno::EOPNOTSUPP)
            } else if !self.owned {
                Err(Errno::EPERM)
            } else {
                Ok(false)
            };
        }
        match space {
            Space::Trusted => return Err(Errno::EPERM),
            Space::User if !self.user_attributes_allowed() => return Err(Errno::EPERM),
            Space::User if self.sticky && !self.owned => return Err(Errno::EPERM),
            Space::User | Space::Unknown => self.permits(super::W_OK)?,
            Space::Security | Space::System | Space::Acl => {}
        }
        // The capability hook: changing a security. name needs CAP_SYS_ADMIN (or CAP_SETFCAP).
        if space == Space::Security {
            return Err(Errno::EPERM);
        }
        self.handler(name, space)?;
        Ok(true)
    }
}

/// The bytes attribute `name` is charged before and after setting it to `value` per `mode`
/// (0 before: it is new), or EEXIST or ENODATA when `mode` forbids it.
pub(crate) fn charges(
    attrs: &Attributes,
    name: &[u8],
    value: &[u8],
    mode: SetMode,
) -> Result<(u64, u64), Errno> {
    let old = attrs.get(name).map(Vec::len);
    match old {
        Some(_) if mode.create => Err(Errno::EEXIST),
        None if mode.replace => Err(Errno::ENODATA),
        _ => Ok((
            old.map_or(0, |len| entry_charge(name, len)),
            entry_charge(name, value.len()),
        )),
    }
}

/// The bytes one attribute is charged: its name and its value's `value_len` bytes.
pub(crate) fn entry_charge(name: &[u8], value_len: usize) -> u64 {
    (name.len() + value_len) as u64
}

/// The bytes `attrs` are charged: names and values.
pub(crate) fn charge(attrs: &Attributes) -> u64 {
    attrs
        .iter()
        .map(|(name, value)| entry_charge(name, value.len()))
        .sum()
}

/// listxattr's bytes: each name with its NUL, in the order Linux's tmpfs lists them
/// (descending by name).
pub(crate) fn list(attrs: Option<&Attributes>) -> Vec<u8> {
    let mut out = Vec::new();
    for name in attrs.into_iter().flat_map(|a| a.keys().rev()) {
        out.extend_from_slice(name);
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: Target = Target {
        kind: FileKind::Regular,
        access: 0o6,
        owned: true,
        sticky: false,
        read_only: false,
        holder: Holder::Stored,
    };

    #[test]
    fn name_spaces_answer_as_for_an_unprivileged_user() {
        assert_eq!(FILE.check_change(b"user.a", false), Ok(true));
        assert_eq!(FILE.check_read(b"user.a"), Ok(()));
        assert_eq!(FILE.check_change(b"user.", false), Err(Errno::EINVAL));
        assert_eq!(FILE.check_read(b"user."), Err(Errno::EINVAL));
        assert_eq!(FILE.check_change(b"trusted.a", true), Err(Errno::EPERM));
        assert_eq!(FILE.check_read(b"trusted.a"), Err(Errno::ENODATA));
        assert_eq!(FILE.check_change(b"security.a", false), Err(Errno::EPERM));
        assert_eq!(FILE.check_read(b"security.a"), Err(Errno::ENODATA));
        assert_eq!(FILE.check_change(b"foo", false), Err(Errno::EOPNOTSUPP));
        assert_eq!(FILE.check_read(b"system.foo"), Err(Errno::EOPNOTSUPP));
        assert_eq!(
            FILE.check_read(b"system.posix_acl_access"),
            Err(Errno::ENODATA)
        );
        assert_eq!(
            FILE.check_change(b"system.posix_acl_default", true),
            Ok(false)
        );
        assert_eq!(
            FILE.check_change(b"system.posix_acl_access", false),
            Err(Errno::EOPNOTSUPP)
        );
    }

    #[test]
    fn node_kind_permissions_and_file_system_come_first() {
        let symlink = Target {
            kind: FileKind::Symlink,
            ..FILE
        };
        assert_eq!(symlink.check_change(b"user.a", false), Err(Errno::EPERM));
        assert_eq!(symlink.check_read(b"user.a"), Err(Errno::ENODATA));
        let read_only = Target {
            access: 0o4,
            ..FILE
        };
        assert_eq!(read_only.check_change(b"user.a", false), Err(Errno::EACCES));
        assert_eq!(read_only.check_change(b"foo", false), Err(Errno::EACCES));
        let write_only = Target {
            access: 0o2,
            ..FILE
        };
        assert_eq!(write_only.check_read(b"user.a"), Err(Errno::EACCES));
        let others_sticky = Target {
            kind: FileKind::Directory,
            owned: false,
            sticky: true,
            access: 0o7,
            ..FILE
        };
        assert_eq!(
            others_sticky.check_change(b"user.a", false),
            Err(Errno::EPERM)
        );
        let image = Target {
            read_only: true,
            holder: Holder::Empty,
            ..FILE
        };
        assert_eq!(image.check_change(b"user.a", true), Err(Errno::EROFS));
        assert_eq!(image.check_read(b"user.a"), Ok(()));
        let proc_file = Target {
            access: 0o4,
            holder: Holder::Unsupported,
            ..FILE
        };
        assert_eq!(proc_file.check_read(b"user.a"), Err(Errno::EOPNOTSUPP));
        assert_eq!(proc_file.check_change(b"user.a", false), Err(Errno::EACCES));
        assert_eq!(
            Target::STREAM.check_change(b"user.a", false),
            Err(Errno::EPERM)
        );
        assert_eq!(
            Target::STREAM.check_change(b"foo", false),
            Err(Errno::EOPNOTSUPP)
        );
    }

    #[test]
    fn create_replace_and_the_listing() {
        let create = SetMode {
            create: true,
            replace: false,
        };
        let replace = SetMode {
            create: false,
            replace: true,
        };
        let mut attrs = Attributes::new();
        assert_eq!(
            charges(&attrs, b"user.a", b"xy", replace),
            Err(Errno::ENODATA)
        );
        assert_eq!(charges(&attrs, b"user.a", b"xy", create), Ok((0, 8)));
        attrs.insert(b"user.a".to_vec(), b"xy".to_vec());
        assert_eq!(charges(&attrs, b"user.a", b"z", create), Err(Errno::EEXIST));
        assert_eq!(charges(&attrs, b"user.a", b"z", replace), Ok((8, 7)));
        assert_eq!(
            charges(&attrs, b"user.a", b"xyz", SetMode::default()),
            Ok((8, 9))
        );
        attrs.insert(b"user.c".to_vec(), Vec::new());
        assert_eq!(charge(&attrs), 14);
        assert_eq!(list(Some(&attrs)), b"user.c\0user.a\0");
        assert_eq!(list(None), b"");
    }
}
