//! Path resolution shared by the image (host-side lookups) and the VFS (guest lookups):
//! component walk, "." and "..", symlinks with a depth limit, and Linux's length limits.

use crate::errno::Errno;

use super::FileKind;

pub use crate::abi::{NAME_MAX, PATH_MAX};
/// Symlinks followed in one resolution before ELOOP (Linux: 40).
pub const MAX_SYMLINKS: u32 = 40;

/// A directory tree that paths can be resolved in.
pub(crate) trait Tree {
    type Node: Copy;
    fn root(&self) -> Self::Node;
    /// The parent directory; the root is its own parent, so ".." never escapes "/".
    fn parent(&self, node: Self::Node) -> Result<Self::Node, Errno>;
    fn child(&self, dir: Self::Node, name: &[u8]) -> Result<Option<Self::Node>, Errno>;
    fn kind(&self, node: Self::Node) -> Result<FileKind, Errno>;
    fn link_target(&self, node: Self::Node) -> Result<Vec<u8>, Errno>;
    /// A link followed to a node rather than by its text (/proc's fd, exe and cwd links).
    fn magic_target(&self, _node: Self::Node) -> Option<MagicTarget<Self::Node>> {
        None
    }
}

/// Where a magic link leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MagicTarget<N> {
    Node(N),
    /// Something with no path (a pipe's fd): a walk ends at the link itself, which open(2)
    /// reopens as that object (and which is no directory to walk on in).
    TheLink,
}

fn check_length(path: &[u8]) -> Result<(), Errno> {
    if path.is_empty() {
        return Err(Errno::ENOENT);
    }
    if path.len() >= PATH_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(())
}

/// Resolves `path` (absolute, or relative to directory `base`); a final symlink is followed
/// only when `follow_last` is set (or the path ends in "/").
pub(crate) fn resolve<T: Tree>(
    tree: &T,
    base: T::Node,
    path: &[u8],
    follow_last: bool,
) -> Result<T::Node, Errno> {
    check_length(path)?;
    let mut budget = MAX_SYMLINKS;
    walk(tree, base, path, follow_last, &mut budget)
}

fn walk<T: Tree>(
    tree: &T,
    base: T::Node,
    path: &[u8],
    follow_last: bool,
    budget: &mut u32,
) -> Result<T::Node, Errno> {
    let mut cur = if path.first() == Some(&b'/') {
        tree.root()
    } else {
        base
    };
    let trailing_slash = path.last() == Some(&b'/');
    let components: Vec<&[u8]> = path
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .collect();
    for (i, &name) in components.iter().enumerate() {
        if tree.kind(cur)? != FileKind::Directory {
            return Err(Errno::ENOTDIR);
        }
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        match name {
            b"." => continue,
            b".." => {
                cur = tree.parent(cur)?;
                continue;
            }
            _ => {}
        }
        let child = tree.child(cur, name)?.ok_or(Errno::ENOENT)?;
        let last = i + 1 == components.len();
        if tree.kind(child)? == FileKind::Symlink && (!last || follow_last || trailing_slash) {
            if *budget == 0 {
                return Err(Errno::ELOOP);
            }
            *budget -= 1;
            match tree.magic_target(child) {
                Some(MagicTarget::Node(target)) => {
                    cur = target;
                    continue;
                }
                Some(MagicTarget::TheLink) => {
                    cur = child;
                    continue;
                }
                None => {}
            }
            let target = tree.link_target(child)?;
            if target.is_empty() {
                return Err(Errno::ENOENT);
            }
            // A relative target is resolved from the directory holding the link.
            cur = walk(tree, cur, &target, true, budget)?;
        } else {
            cur = child;
        }
    }
    if trailing_slash && tree.kind(cur)? != FileKind::Directory {
        return Err(Errno::ENOTDIR);
    }
    Ok(cur)
}

/// Splits `path` into its resolved parent directory and final name (for create, mkdir, unlink,
/// rename). Trailing slashes are dropped; "/" yields (root, "."). The name may be "." or "..",
/// which each operation rejects in its own way.
pub(crate) fn resolve_parent<T: Tree>(
    tree: &T,
    base: T::Node,
    path: &[u8],
) -> Result<(T::Node, Vec<u8>), Errno> {
    check_length(path)?;
    let mut end = path.len();
    while end > 1 && path[end - 1] == b'/' {
        end -= 1;
    }
    let path = &path[..end];
    let (dir, name): (T::Node, &[u8]) = match path.iter().rposition(|&b| b == b'/') {
        None => (base, path),
        Some(0) if path.len() == 1 => (tree.root(), b"."),
        Some(0) => (tree.root(), &path[1..]),
        Some(i) => (resolve(tree, base, &path[..i], true)?, &path[i + 1..]),
    };
    if tree.kind(dir)? != FileKind::Directory {
        return Err(Errno::ENOTDIR);
    }
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok((dir, name.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy tree: node 0 is "/", the rest are listed with their parent, name, kind and target.
    struct Toy(Vec<(usize, &'static str, FileKind, &'static str)>);

    impl Tree for Toy {
        type Node = usize;
        fn root(&self) -> usize {
            0
        }
        fn parent(&self, n: usize) -> Result<usize, Errno> {
            Ok(self.0[n].0)
        }
        fn child(&self, dir: usize, name: &[u8]) -> Result<Option<usize>, Errno> {
            Ok((1..self.0.len()).find(|&i| self.0[i].0 == dir && self.0[i].1.as_bytes() == name))
        }
        fn kind(&self, n: usize) -> Result<FileKind, Errno> {
            Ok(self.0[n].2)
        }
        fn link_target(&self, n: usize) -> Result<Vec<u8>, Errno> {
            Ok(self.0[n].3.as_bytes().to_vec())
        }
    }

    fn toy() -> Toy {
        use FileKind::*;
        Toy(vec![
            (0, "", Directory, ""),
            (0, "usr", Directory, ""),           // 1
            (1, "lib", Directory, ""),           // 2
            (2, "libc.so", Regular, ""),         // 3
            (0, "lib", Symlink, "usr/lib"),      // 4
            (0, "loop", Symlink, "/loop"),       // 5
            (2, "up", Symlink, "../../lib"),     // 6
            (0, "dangling", Symlink, "nowhere"), // 7
        ])
    }

    #[test]
    fn resolves_symlinks_dots_and_limits() {
        let t = toy();
        assert_eq!(resolve(&t, 0, b"/lib/libc.so", true), Ok(3));
        assert_eq!(resolve(&t, 2, b"libc.so", true), Ok(3));
        assert_eq!(
            resolve(&t, 2, b"../../../../usr/./lib//libc.so", true),
            Ok(3)
        );
        assert_eq!(resolve(&t, 0, b"/..", true), Ok(0));
        assert_eq!(resolve(&t, 0, b"/lib", false), Ok(4));
        assert_eq!(resolve(&t, 0, b"/lib/", false), Ok(2));
        assert_eq!(resolve(&t, 0, b"/usr/lib/up/up/libc.so", true), Ok(3));
        assert_eq!(resolve(&t, 0, b"/loop", true), Err(Errno::ELOOP));
        assert_eq!(resolve(&t, 0, b"/loop", false), Ok(5));
        assert_eq!(resolve(&t, 0, b"/dangling", true), Err(Errno::ENOENT));
        assert_eq!(resolve(&t, 0, b"/lib/libc.so/x", true), Err(Errno::ENOTDIR));
        assert_eq!(resolve(&t, 0, b"/lib/libc.so/", true), Err(Errno::ENOTDIR));
        assert_eq!(resolve(&t, 0, b"", true), Err(Errno::ENOENT));
        assert_eq!(resolve(&t, 0, &[b'a'; 256], true), Err(Errno::ENAMETOOLONG));
        assert_eq!(
            resolve(&t, 0, &[b'/'; PATH_MAX], true),
            Err(Errno::ENAMETOOLONG)
        );
    }

    #[test]
    fn splits_parent_and_name() {
        let t = toy();
        assert_eq!(resolve_parent(&t, 0, b"/lib/new"), Ok((2, b"new".to_vec())));
        assert_eq!(resolve_parent(&t, 2, b"new//"), Ok((2, b"new".to_vec())));
        assert_eq!(resolve_parent(&t, 0, b"/"), Ok((0, b".".to_vec())));
        assert_eq!(resolve_parent(&t, 0, b"/usr"), Ok((0, b"usr".to_vec())));
        assert_eq!(resolve_parent(&t, 3, b"x"), Err(Errno::ENOTDIR));
        assert_eq!(resolve_parent(&t, 0, b"/nope/x"), Err(Errno::ENOENT));
    }
}
