//! The per-VM writable overlay: an in-memory tree of directories, files and symlinks.
//!
//! Node ids are never reused, so a stale id (a file unlinked and released) is reported as
//! missing rather than aliasing a newer file. A node stays alive while it is linked into a
//! directory or held open (open files may be unlinked, as tempfile does).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::errno::Errno;
use crate::memory::SharedMemory;

use super::file_data::FileData;
use super::vfs::Timespec;
use super::xattr::{self, Attributes, SetMode};
use super::FileKind;
use crate::codec::{DecodeError, Decoder, Encoder};

/// fcntl's file seals (F_ADD_SEALS, F_GET_SEALS).
pub(crate) const F_SEAL_SEAL: u32 = 0x1;
pub(crate) const F_SEAL_SHRINK: u32 = 0x2;
pub(crate) const F_SEAL_GROW: u32 = 0x4;
pub(crate) const F_SEAL_WRITE: u32 = 0x8;
pub(crate) const F_SEAL_FUTURE_WRITE: u32 = 0x10;

/// The most names a file can have (link(2) answers EMLINK past it).
pub(crate) const MAX_LINKS: u8 = u8::MAX;

/// Bytes charged per node on top of its data, so a guest cannot exhaust host memory with
/// millions of empty files.
pub(crate) const NODE_CHARGE: u64 = 256;

#[derive(Clone)]
pub(crate) enum OverlayKind {
    File(FileData),
    Dir(BTreeMap<Vec<u8>, u64>),
    Symlink(Vec<u8>),
    /// A bound Unix socket's file (the socket itself lives in the descriptor table).
    Socket,
    /// A FIFO (its pipe lives in the descriptor table while an end is open).
    Fifo,
}

#[derive(Clone)]
pub(crate) struct OverlayNode {
    /// None for a mount root (its parent is an image directory).
    pub parent: Option<u64>,
    pub name: Vec<u8>,
    pub mode: u32,
    pub kind: OverlayKind,
    /// The directory entries naming it (hard links; at most `MAX_LINKS`). At 0 it is unlinked
    /// and lives only while open.
    pub links: u8,
    pub open_count: u32,
    /// Modification time: when it was made, and then when its bytes or length (a directory:
    /// its entries) last changed, or what the guest set (utimensat).
    pub mtime: Timespec,
    /// Access time: when it was made, or what the guest set (reads do not move it, as with
    /// noatime).
    pub atime: Timespec,
    /// A memfd file's seals (F_SEAL_*); None for a file that cannot be sealed.
    pub seals: Option<u32>,
    /// Its extended attributes (`user.` names only; see xattr.rs).
    pub xattrs: Attributes,
}

impl OverlayNode {
    pub fn file_kind(&self) -> FileKind {
        match self.kind {
            OverlayKind::File(_) => FileKind::Regular,
            OverlayKind::Dir(_) => FileKind::Directory,
            OverlayKind::Symlink(_) => FileKind::Symlink,
            OverlayKind::Socket => FileKind::Socket,
            OverlayKind::Fifo => FileKind::Fifo,
        }
    }

    fn charge(&self) -> u64 {
        let payload = match &self.kind {
            OverlayKind::File(data) => data.len() as usize,
            OverlayKind::Dir(_) | OverlayKind::Socket | OverlayKind::Fifo => 0,
            OverlayKind::Symlink(target) => target.len(),
        };
        NODE_CHARGE * u64::from(self.links.max(1))
            + self.name.len() as u64
            + payload as u64
            + xattr::charge(&self.xattrs)
    }
}

#[derive(Clone)]
pub(crate) struct Overlay {
    nodes: HashMap<u64, OverlayNode>,
    next_id: u64,
    used: u64,
    limit: u64,
}

impl Overlay {
    pub fn new(limit: u64) -> Overlay {
        Overlay {
            nodes: HashMap::new(),
            next_id: 1,
            used: 0,
            limit,
        }
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn get(&self, id: u64) -> Result<&OverlayNode, Errno> {
        self.nodes.get(&id).ok_or(Errno::ENOENT)
    }

    fn get_mut(&mut self, id: u64) -> Result<&mut OverlayNode, Errno> {
        self.nodes.get_mut(&id).ok_or(Errno::ENOENT)
    }

    /// utimensat: sets the modification time of node `id`.
    pub fn set_times(
        &mut self,
        id: u64,
        atime: Option<Timespec>,
        mtime: Option<Timespec>,
    ) -> Result<(), Errno> {
        let node = self.get_mut(id)?;
        node.atime = atime.unwrap_or(node.atime);
        node.mtime = mtime.unwrap_or(node.mtime);
        Ok(())
    }

    /// Node `id`'s contents (a directory's: its entries) changed now.
    fn modified(&mut self, id: u64) -> Result<(), Errno> {
        self.get_mut(id)?.mtime = now();
        Ok(())
    }

    /// chmod: replaces the permission bits of node `id`.
    pub fn set_mode(&mut self, id: u64, mode: u32) -> Result<(), Errno> {
        self.get_mut(id)?.mode = mode & 0o7777;
        Ok(())
    }

    /// setxattr of a `user.` attribute of node `id` (EEXIST, ENODATA per `mode`; ENOSPC past
    /// the limit: attributes count as data).
    pub fn set_xattr(
        &mut self,
        id: u64,
        name: &[u8],
        value: &[u8],
        mode: SetMode,
    ) -> Result<(), Errno> {
        let (before, after) = xattr::charges(&self.get(id)?.xattrs, name, value, mode)?;
        if after > before {
            self.reserve(after - before)?;
        } else {
            self.used -= before - after;
        }
        self.get_mut(id)?
            .xattrs
            .insert(name.to_vec(), value.to_vec());
        Ok(())
    }

    /// removexattr of a `user.` attribute of node `id` (ENODATA when it has none of that name).
    pub fn remove_xattr(&mut self, id: u64, name: &[u8]) -> Result<(), Errno> {
        let value = self
            .get_mut(id)?
            .xattrs
            .remove(name)
            .ok_or(Errno::ENODATA)?;
        self.used -= xattr::entry_charge(name, value.len());
        Ok(())
    }

    fn reserve(&mut self, bytes: u64) -> Result<(), Errno> {
        match self.used.checked_add(bytes) {
            Some(total) if total <= self.limit => {
                self.used = total;
                Ok(())
            }
            _ => Err(Errno::ENOSPC),
        }
    }

    /// Adds an empty directory that is the root of a writable mount.
    pub fn add_mount_root(&mut self, name: &[u8]) -> Result<u64, Errno> {
        self.insert(None, name, 0o1777, OverlayKind::Dir(BTreeMap::new()))
    }

    fn insert(
        &mut self,
        parent: Option<u64>,
        name: &[u8],
        mode: u32,
        kind: OverlayKind,
    ) -> Result<u64, Errno> {
        let node = OverlayNode {
            parent,
            name: name.to_vec(),
            mode: mode & 0o7777,
            kind,
            links: 1,
            open_count: 0,
            mtime: now(),
            atime: now(),
            seals: None,
            xattrs: Attributes::new(),
        };
        self.reserve(node.charge())?;
        let id = self.next_id;
        self.next_id += 1;
        self.nodes.insert(id, node);
        Ok(id)
    }

    pub fn child(&self, dir: u64, name: &[u8]) -> Result<Option<u64>, Errno> {
        match &self.get(dir)?.kind {
            OverlayKind::Dir(entries) => Ok(entries.get(name).copied()),
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// Creates `name` in directory `dir`; EEXIST if the name is taken.
    pub fn create(
        &mut self,
        dir: u64,
        name: &[u8],
        mode: u32,
        kind: OverlayKind,
    ) -> Result<u64, Errno> {
        if self.child(dir, name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        let id = self.insert(Some(dir), name, mode, kind)?;
        if let OverlayKind::Dir(entries) = &mut self.get_mut(dir)?.kind {
            entries.insert(name.to_vec(), id);
        }
        self.modified(dir)?;
        Ok(id)
    }

    /// A file in no directory, open once (a memfd): freed at its last close. Its name is
    /// what /proc shows for it.
    pub fn create_detached(&mut self, name: &[u8], seals: u32) -> Result<u64, Errno> {
        let id = self.insert(
            None,
            name,
            0o777,
            OverlayKind::File(FileData::Bytes(Vec::new())),
        )?;
        let node = self.get_mut(id)?;
        node.links = 0;
        node.open_count = 1;
        node.seals = Some(seals);
        Ok(id)
    }

    /// F_ADD_SEALS: EINVAL for a file that cannot be sealed, EPERM once F_SEAL_SEAL is set.
    pub fn add_seals(&mut self, id: u64, seals: u32) -> Result<(), Errno> {
        let node = self.get_mut(id)?;
        match node.seals.as_mut() {
            None => Err(Errno::EINVAL),
            Some(current) if *current & F_SEAL_SEAL != 0 => Err(Errno::EPERM),
            Some(current) => {
                *current |= seals;
                Ok(())
            }
        }
    }

    /// Whether a file's seals forbid a write or truncation from `old` to `new` bytes long
    /// (EPERM, as Linux answers).
    fn check_seals(&self, id: u64, writes: bool, old: u64, new: u64) -> Result<(), Errno> {
        let seals = self.get(id)?.seals.unwrap_or(0);
        let refused = (writes && seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE) != 0)
            || (new > old && seals & F_SEAL_GROW != 0)
            || (new < old && seals & F_SEAL_SHRINK != 0);
        if refused {
            Err(Errno::EPERM)
        } else {
            Ok(())
        }
    }

    /// Removes `name` from `dir`; the node is freed unless it is still open.
    pub fn unlink(&mut self, dir: u64, name: &[u8]) -> Result<(), Errno> {
        let id = match &mut self.get_mut(dir)?.kind {
            OverlayKind::Dir(entries) => entries.remove(name).ok_or(Errno::ENOENT)?,
            _ => return Err(Errno::ENOTDIR),
        };
        let node = self.get_mut(id)?;
        node.links = node.links.saturating_sub(1);
        if node.links > 0 {
            self.used -= NODE_CHARGE;
        }
        self.free_if_unused(id);
        self.modified(dir)
    }

    /// link(2): names file `id` `name` in `dir` as well (EEXIST if taken, EMLINK past
    /// `MAX_LINKS`, EPERM for a directory, as Linux refuses hard links to them).
    pub fn link(&mut self, id: u64, dir: u64, name: &[u8]) -> Result<(), Errno> {
        if self.child(dir, name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        let node = self.get(id)?;
        if matches!(node.kind, OverlayKind::Dir(_)) {
            return Err(Errno::EPERM);
        }
        if node.links == 0 {
            return Err(Errno::ENOENT);
        }
        if node.links == MAX_LINKS {
            return Err(Errno::EMLINK);
        }
        // Each further name is charged as a node: names cost host memory too.
        self.reserve(NODE_CHARGE)?;
        if let OverlayKind::Dir(entries) = &mut self.get_mut(dir)?.kind {
            entries.insert(name.to_vec(), id);
        }
        self.get_mut(id)?.links += 1;
        self.modified(dir)
    }

    /// Moves node `id` (currently `old_name` in `old_dir`) to `new_name` in `new_dir`, which
    /// must be free (the caller removes a replaced target first).
    pub fn relink(
        &mut self,
        id: u64,
        old_dir: u64,
        old_name: &[u8],
        new_dir: u64,
        new_name: &[u8],
    ) -> Result<(), Errno> {
        let name_growth = new_name.len() as u64;
        self.reserve(name_growth)?;
        if let OverlayKind::Dir(entries) = &mut self.get_mut(old_dir)?.kind {
            entries.remove(old_name);
        }
        if let OverlayKind::Dir(entries) = &mut self.get_mut(new_dir)?.kind {
            entries.insert(new_name.to_vec(), id);
        }
        let node = self.get_mut(id)?;
        let old_len = node.name.len() as u64;
        node.parent = Some(new_dir);
        node.name = new_name.to_vec();
        self.used -= old_len;
        self.modified(old_dir)?;
        self.modified(new_dir)
    }

    pub fn open(&mut self, id: u64) -> Result<(), Errno> {
        let node = self.get_mut(id)?;
        node.open_count = node.open_count.checked_add(1).ok_or(Errno::ENFILE)?;
        Ok(())
    }

    pub fn close(&mut self, id: u64) {
        if let Ok(node) = self.get_mut(id) {
            node.open_count = node.open_count.saturating_sub(1);
            self.free_if_unused(id);
        }
    }

    fn free_if_unused(&mut self, id: u64) {
        let unused = self
            .nodes
            .get(&id)
            .is_some_and(|n| n.links == 0 && n.open_count == 0);
        if unused {
            if let Some(node) = self.nodes.remove(&id) {
                self.used -= node.charge();
            }
        }
    }

    /// Writes `data` at `offset` of file `id`, zero-filling any gap; all or ENOSPC.
    pub fn write(&mut self, id: u64, offset: u64, data: &[u8]) -> Result<usize, Errno> {
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        let len = self.file_len(id)?;
        self.check_seals(id, true, len, end.max(len))?;
        if end > len {
            self.reserve(end - len)?;
        }
        if let OverlayKind::File(bytes) = &mut self.get_mut(id)?.kind {
            bytes.write(offset, data)?;
        }
        if !data.is_empty() {
            self.modified(id)?;
        }
        Ok(data.len())
    }

    pub fn truncate(&mut self, id: u64, len: u64) -> Result<(), Errno> {
        let old = self.file_len(id)?;
        self.check_seals(id, false, old, len)?;
        if len > old {
            self.reserve(len - old)?;
        } else {
            self.used -= old - len;
        }
        if let OverlayKind::File(bytes) = &mut self.get_mut(id)?.kind {
            bytes.truncate(len)?;
        }
        if len != old {
            self.modified(id)?;
        }
        Ok(())
    }

    /// See `Vfs::share_file`: the file's memory may grow to the overlay's limit.
    pub fn share(&mut self, id: u64) -> Result<Arc<SharedMemory>, Errno> {
        let limit = self.limit;
        match &mut self.get_mut(id)?.kind {
            OverlayKind::File(data) => data.share(limit),
            OverlayKind::Dir(_) => Err(Errno::EISDIR),
            OverlayKind::Symlink(_) => Err(Errno::EINVAL),
            OverlayKind::Socket | OverlayKind::Fifo => Err(Errno::ENODEV),
        }
    }

    fn file_len(&self, id: u64) -> Result<u64, Errno> {
        match &self.get(id)?.kind {
            OverlayKind::File(bytes) => Ok(bytes.len()),
            OverlayKind::Dir(_) => Err(Errno::EISDIR),
            OverlayKind::Symlink(_) => Err(Errno::EINVAL),
            OverlayKind::Socket | OverlayKind::Fifo => Err(Errno::ENXIO),
        }
    }
}

// ---- template snapshots (crate::snapshot): the overlay's contents, encoded and checked ----

impl Overlay {
    pub(crate) fn encode_state(&self, e: &mut Encoder) {
        // Sorted by id, so one state always encodes to the same bytes.
        let mut ids: Vec<&u64> = self.nodes.keys().collect();
        ids.sort();
        e.len(ids.len());
        for id in ids {
            let node = &self.nodes[id];
            e.u64(*id);
            match node.parent {
                None => e.u8(0),
                Some(parent) => {
                    e.u8(1);
                    e.u64(parent);
                }
            }
            e.bytes(&node.name);
            e.u32(node.mode);
            // A node without attributes encodes as before attributes were kept.
            let flag = if node.xattrs.is_empty() {
                0
            } else {
                HAS_XATTRS
            };
            match &node.kind {
                OverlayKind::File(data) => match node.seals {
                    None => {
                        e.u8(flag);
                        e.bytes(data.bytes());
                    }
                    Some(seals) => {
                        e.u8(4 | flag);
                        e.bytes(data.bytes());
                        e.u32(seals);
                    }
                },
                OverlayKind::Dir(entries) => {
                    e.u8(1 | flag);
                    e.len(entries.len());
                    for (name, child) in entries {
                        e.bytes(name);
                        e.u64(*child);
                    }
                }
                OverlayKind::Symlink(target) => {
                    e.u8(2);
                    e.bytes(target);
                }
                OverlayKind::Socket => e.u8(3),
                OverlayKind::Fifo => e.u8(5),
            }
            e.u8(node.links);
            e.u32(node.open_count);
            e.i64(node.mtime.sec);
            e.u32(node.mtime.nsec);
            e.i64(node.atime.sec);
            e.u32(node.atime.nsec);
            if flag != 0 {
                e.len(node.xattrs.len());
                for (name, value) in &node.xattrs {
                    e.bytes(name);
                    e.bytes(value);
                }
            }
        }
        e.u64(self.next_id);
        e.u64(self.limit);
    }

    /// The overlay `encode_state` wrote. Every id is below `next_id`, every directory entry
    /// and parent names an existing node, and the charge is recomputed from the nodes.
    pub(crate) fn decode_state(d: &mut Decoder) -> Result<Overlay, DecodeError> {
        let n = d.count(40, "overlay node count")?;
        let mut nodes = HashMap::with_capacity(n);
        for _ in 0..n {
            let id = d.u64("overlay node id")?;
            let parent = match d.u8("overlay parent")? {
                0 => None,
                1 => Some(d.u64("overlay parent")?),
                t => return Err(DecodeError::new(format!("overlay parent tag {t}"))),
            };
            let name = d.bytes("overlay name")?.to_vec();
            let mode = d.u32("overlay mode")?;
            let mut seals = None;
            let tag = d.u8("overlay kind")?;
            let kind = match tag & !HAS_XATTRS {
                0 => OverlayKind::File(FileData::Bytes(d.bytes("overlay file")?.to_vec())),
                4 => {
                    let data = FileData::Bytes(d.bytes("overlay file")?.to_vec());
                    seals = Some(d.u32("overlay file seals")?);
                    OverlayKind::File(data)
                }
                1 => {
                    let entries = d.count(16, "overlay directory")?;
                    let mut map = BTreeMap::new();
                    for _ in 0..entries {
                        let name = d.bytes("overlay entry name")?.to_vec();
                        map.insert(name, d.u64("overlay entry")?);
                    }
                    OverlayKind::Dir(map)
                }
                2 => OverlayKind::Symlink(d.bytes("overlay symlink")?.to_vec()),
                3 => OverlayKind::Socket,
                5 => OverlayKind::Fifo,
                t => return Err(DecodeError::new(format!("overlay kind tag {t}"))),
            };
            let (links, open_count) = (d.u8("overlay links")?, d.u32("overlay open count")?);
            let mtime = Timespec {
                sec: d.i64("overlay mtime")?,
                nsec: d.u32("overlay mtime")?,
            };
            let atime = Timespec {
                sec: d.i64("overlay atime")?,
                nsec: d.u32("overlay atime")?,
            };
            let xattrs = if tag & HAS_XATTRS == 0 {
                Attributes::new()
            } else {
                decode_xattrs(d, &kind)?
            };
            if nodes
                .insert(
                    id,
                    OverlayNode {
                        parent,
                        name,
                        mode,
                        kind,
                        links,
                        open_count,
                        mtime,
                        atime,
                        seals,
                        xattrs,
                    },
                )
                .is_some()
            {
                return Err(DecodeError::new(format!("overlay node {id} appears twice")));
            }
        }
        let (next_id, limit) = (d.u64("overlay next id")?, d.u64("overlay limit")?);
        for (id, node) in &nodes {
            let children: Vec<u64> = match &node.kind {
                OverlayKind::Dir(entries) => entries.values().copied().collect(),
                _ => Vec::new(),
            };
            if *id >= next_id
                || node
                    .parent
                    .into_iter()
                    .chain(children)
                    .any(|other| !nodes.contains_key(&other))
            {
                return Err(DecodeError::new(format!(
                    "overlay node {id} refers to a missing node or is numbered past {next_id}"
                )));
            }
        }
        let used = nodes.values().map(OverlayNode::charge).sum();
        Ok(Overlay {
            nodes,
            next_id,
            used,
            limit,
        })
    }
}

/// The kind tag's bit saying that the node's extended attributes follow it.
const HAS_XATTRS: u8 = 0x80;

/// A node's attributes as `encode_state` wrote them: at least one, each a `user.` name within
/// NAME_MAX with a value within VALUE_MAX, once, on a regular file or directory.
fn decode_xattrs(d: &mut Decoder, kind: &OverlayKind) -> Result<Attributes, DecodeError> {
    if !matches!(kind, OverlayKind::File(_) | OverlayKind::Dir(_)) {
        return Err(DecodeError::new(
            "overlay attributes on a node that cannot have them",
        ));
    }
    let n = d.count(16, "overlay attribute count")?;
    if n == 0 {
        return Err(DecodeError::new(
            "overlay attributes flagged but none follow",
        ));
    }
    let mut xattrs = Attributes::new();
    for _ in 0..n {
        let name = d.bytes("overlay attribute name")?;
        let value = d.bytes("overlay attribute value")?;
        if !xattr::is_user_name(name) || value.len() > xattr::VALUE_MAX {
            return Err(DecodeError::new(format!(
                "overlay attribute {:?} ({} bytes) is not one a file can have",
                String::from_utf8_lossy(name),
                value.len()
            )));
        }
        if xattrs.insert(name.to_vec(), value.to_vec()).is_some() {
            return Err(DecodeError::new("an overlay attribute appears twice"));
        }
    }
    Ok(xattrs)
}

/// The host's real time, which is the guest's CLOCK_REALTIME.
fn now() -> Timespec {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timespec {
        sec: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        nsec: since.subsec_nanos(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounting_tracks_data_and_nodes() {
        let mut o = Overlay::new(4096);
        let root = o.add_mount_root(b"tmp").unwrap();
        let base = o.used();
        let f = o
            .create(
                root,
                b"f",
                0o644,
                OverlayKind::File(FileData::Bytes(Vec::new())),
            )
            .unwrap();
        assert_eq!(o.used(), base + NODE_CHARGE + 1);
        o.write(f, 10, b"abc").unwrap();
        assert_eq!(o.used(), base + NODE_CHARGE + 1 + 13);
        o.truncate(f, 2).unwrap();
        assert_eq!(o.used(), base + NODE_CHARGE + 1 + 2);
        assert_eq!(o.write(f, 0, &[0u8; 4096]), Err(Errno::ENOSPC));
        assert_eq!(o.write(f, u64::MAX, b"x"), Err(Errno::EFBIG));
        o.unlink(root, b"f").unwrap();
        assert_eq!(o.used(), base);
        assert_eq!(o.get(f).err(), Some(Errno::ENOENT));
    }

    /// An overlay of 1 MiB with a mount root holding file "f" of `data`: (overlay, root, f).
    fn overlay_with_file(data: &[u8]) -> (Overlay, u64, u64) {
        let mut o = Overlay::new(1 << 20);
        let root = o.add_mount_root(b"tmp").unwrap();
        let f = o
            .create(
                root,
                b"f",
                0o600,
                OverlayKind::File(FileData::Bytes(data.to_vec())),
            )
            .unwrap();
        (o, root, f)
    }

    #[test]
    fn unlinked_open_file_lives_until_closed() {
        let (mut o, root, f) = overlay_with_file(b"");
        o.open(f).unwrap();
        o.write(f, 0, b"data").unwrap();
        o.unlink(root, b"f").unwrap();
        assert_eq!(o.child(root, b"f"), Ok(None));
        assert!(
            matches!(&o.get(f).unwrap().kind, OverlayKind::File(data) if data.bytes() == b"data")
        );
        o.close(f);
        assert!(o.get(f).is_err());
        // A new file never reuses the freed id.
        let g = o
            .create(
                root,
                b"f",
                0o600,
                OverlayKind::File(FileData::Bytes(Vec::new())),
            )
            .unwrap();
        assert_ne!(f, g);
    }

    fn encoded(o: &Overlay) -> Vec<u8> {
        let mut e = Encoder::new();
        o.encode_state(&mut e);
        e.into_bytes()
    }

    #[test]
    fn attributes_are_charged_and_survive_an_encoding() {
        let (mut o, root, f) = overlay_with_file(b"data");
        let plain = encoded(&o);
        let base = o.used();
        o.set_xattr(f, b"user.a", b"12345", SetMode::default())
            .unwrap();
        o.set_xattr(root, b"user.dir", b"", SetMode::default())
            .unwrap();
        assert_eq!(o.used(), base + 11 + 8);
        o.set_xattr(f, b"user.a", b"1", SetMode::default()).unwrap();
        assert_eq!(o.used(), base + 7 + 8);
        let bytes = encoded(&o);
        let back = Overlay::decode_state(&mut Decoder::new(&bytes)).unwrap();
        assert_eq!(back.used(), o.used());
        assert_eq!(back.get(f).unwrap().xattrs, o.get(f).unwrap().xattrs);
        assert_eq!(encoded(&back), bytes);
        o.remove_xattr(f, b"user.a").unwrap();
        o.remove_xattr(root, b"user.dir").unwrap();
        assert_eq!(o.used(), base);
        assert_eq!(o.remove_xattr(f, b"user.a"), Err(Errno::ENODATA));
        // Without attributes a node encodes as it did before they were kept.
        assert_eq!(encoded(&o), plain);
        let mut small = Overlay::new(NODE_CHARGE + 8);
        let d = small.add_mount_root(b"w").unwrap();
        assert_eq!(
            small.set_xattr(d, b"user.big", b"x", SetMode::default()),
            Err(Errno::ENOSPC)
        );
        assert!(small.get(d).unwrap().xattrs.is_empty());
    }

    #[test]
    fn hostile_attribute_encodings_are_refused() {
        let (mut o, _, f) = overlay_with_file(b"data");
        o.set_xattr(f, b"user.a", b"v", SetMode::default()).unwrap();
        let good = encoded(&o);
        // The attributes are the last field of the last node, before next_id and the limit.
        let attrs_at = good.len() - 16 - (8 + (8 + 6) + (8 + 1));
        let with_attrs = |attrs: &[u8]| {
            let mut bytes = good[..attrs_at].to_vec();
            bytes.extend_from_slice(attrs);
            bytes.extend_from_slice(&good[good.len() - 16..]);
            bytes
        };
        assert_eq!(with_attrs(&good[attrs_at..good.len() - 16]), good);
        let entry = |name: &[u8], value: &[u8]| {
            let mut e = Encoder::new();
            e.bytes(name);
            e.bytes(value);
            e.into_bytes()
        };
        let count = |n: u64| n.to_le_bytes().to_vec();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("none", count(0)),
            ("too many", count(u64::MAX)),
            ("not user.", [count(1), entry(b"trusted.a", b"")].concat()),
            ("bare prefix", [count(1), entry(b"user.", b"")].concat()),
            (
                "long name",
                [
                    count(1),
                    entry(&[&b"user."[..], &[b'a'; 251]].concat(), b""),
                ]
                .concat(),
            ),
            (
                "big value",
                [count(1), entry(b"user.a", &vec![0; xattr::VALUE_MAX + 1])].concat(),
            ),
            (
                "twice",
                [count(2), entry(b"user.a", b""), entry(b"user.a", b"")].concat(),
            ),
            ("truncated", [count(1), b"\x06\0\0".to_vec()].concat()),
        ];
        for (what, attrs) in cases {
            let bytes = with_attrs(&attrs);
            assert!(
                Overlay::decode_state(&mut Decoder::new(&bytes)).is_err(),
                "{what} was accepted"
            );
        }
        // The flag on a node that cannot hold attributes (the mount root's tag made a symlink's).
        let mut o = Overlay::new(1 << 20);
        let root = o.add_mount_root(b"work").unwrap();
        o.create(root, b"l", 0o777, OverlayKind::Symlink(b"t".to_vec()))
            .unwrap();
        let mut bytes = encoded(&o);
        // The symlink is the last node: its tag, target "t", links, open count and two times.
        let tag_at = bytes.len() - 16 - (1 + 9 + 1 + 4 + 12 + 12);
        assert_eq!(bytes[tag_at], 2);
        bytes[tag_at] |= HAS_XATTRS;
        bytes.splice(
            bytes.len() - 16..bytes.len() - 16,
            [count(1), entry(b"user.a", b"")].concat(),
        );
        let refused = Overlay::decode_state(&mut Decoder::new(&bytes)).err();
        assert!(
            refused.is_some_and(|e| format!("{e:?}").contains("cannot have them")),
            "a symlink's attributes were accepted"
        );
    }
}
