//! The image builder: collects the manifest's host paths, their symlinks and the shared
//! libraries their ELF files need, and writes the image (see `format`).
//!
//! Host paths keep their location in the image. A path is resolved on the host component by
//! component; every symlink met on the way ("/lib" -> "usr/lib" on merged-/usr Debian) goes
//! into the image as a symlink, and its target is included too, so every path that works on
//! the host works in the image. Exclude patterns prune directory walks only: a path listed
//! explicitly, a symlink's target and a library an ELF file needs are always included.
//!
//! Builds are reproducible: the image depends only on the included files' contents, modes and
//! mtimes (Python compares a source file's mtime with its .pyc) and on the directory and
//! symlink layout. A directory's time is the newest time of the files below it, a symlink's the
//! newest of the whole image (zipfile and tar refuse times before 1980; the host's own directory
//! times would make a build depend on when the host last changed a directory).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::fs::{self, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use super::format::{self, Entry, EntryKind, Index};
use super::manifest::{Manifest, PathSpec};
use super::sha256;
use crate::elf;

/// Where DT_NEEDED names are searched after DT_RUNPATH/DT_RPATH (glibc's x86-64 Debian system
/// directories; without /etc/ld.so.cache in the image, ld.so searches these).
pub const LIBRARY_SEARCH_PATH: [&str; 5] = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib",
    "/lib",
];

/// Host symlinks followed while resolving one path before giving up (as ld.so and Linux do).
const MAX_HOST_SYMLINKS: u32 = 40;

/// What a build produced.
#[derive(Debug, Clone)]
pub struct BuildReport {
    pub name: String,
    pub files: usize,
    pub dirs: usize,
    pub symlinks: usize,
    /// Sum of the file sizes.
    pub bytes: u64,
    /// Size of the data file (contents at page-aligned offsets).
    pub data_bytes: u64,
    /// Interpreters and shared libraries found for ELF files, as the paths ld.so will open.
    pub libraries: Vec<String>,
    /// Skipped optional paths, missing libraries, special files, excluded subtrees.
    pub notes: Vec<String>,
    pub content_hash: [u8; 32],
    pub seconds: f64,
}

impl fmt::Display for BuildReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        writeln!(
            f,
            "image {:?}: {} files, {} directories, {} symlinks; {:.1} MiB of file data, {:.1} MiB data file; built in {:.2} s",
            self.name,
            self.files,
            self.dirs,
            self.symlinks,
            mib(self.bytes),
            mib(self.data_bytes),
            self.seconds
        )?;
        writeln!(
            f,
            "libraries ({}): {}",
            self.libraries.len(),
            self.libraries.join(" ")
        )?;
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        write!(f, "content hash: {}", sha256::to_hex(&self.content_hash))
    }
}

/// Builds the image described by the manifest file into `out_dir` (created if missing).
pub fn build(manifest: &Path, out_dir: &Path) -> io::Result<BuildReport> {
    build_from(&Manifest::load(manifest)?, out_dir)
}

/// Builds the image described by an already parsed manifest.
pub fn build_from(manifest: &Manifest, out_dir: &Path) -> io::Result<BuildReport> {
    let started = Instant::now();
    let mut c = Collector {
        manifest,
        entries: BTreeMap::new(),
        done: HashSet::new(),
        scan: Vec::new(),
        scanned_origins: HashSet::new(),
        libraries: BTreeSet::new(),
        notes: Vec::new(),
        excluded: 0,
    };
    c.add_dir("/", Some(&fs::metadata("/")?))?;
    for spec in &manifest.paths {
        c.add_spec(spec)?;
    }
    for spec in &manifest.optional_paths {
        match fs::symlink_metadata(&spec.host) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => c.notes.push(format!(
                "optional path {} is absent; skipped",
                spec.host.display()
            )),
            _ => c.add_spec(spec)?,
        }
    }
    for dir in &manifest.writable_dirs {
        c.add_ancestors(dir)?;
    }
    c.resolve_libraries()?;
    if c.excluded > 0 {
        c.notes
            .push(format!("{} paths excluded by patterns", c.excluded));
    }
    c.finish(out_dir, started)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pending {
    Dir {
        mode: u32,
    },
    File {
        host: PathBuf,
        size: u64,
        mode: u32,
        mtime: (i64, u32),
    },
    Symlink {
        target: String,
    },
}

struct Collector<'m> {
    manifest: &'m Manifest,
    /// Guest path -> entry; a BTreeMap keeps the byte order the format requires.
    entries: BTreeMap<String, Pending>,
    /// Canonical host paths already added (a directory reached twice is walked once).
    done: HashSet<PathBuf>,
    /// Host files still to check for ELF dependencies, each with the directory ld.so will see
    /// as its `$ORIGIN` (None: the file's own folder).
    scan: Vec<(PathBuf, Option<String>)>,
    /// Libraries already scanned with an `$ORIGIN` other than their own folder.
    scanned_origins: HashSet<(PathBuf, String)>,
    libraries: BTreeSet<String>,
    notes: Vec<String>,
    excluded: usize,
}

impl Collector<'_> {
    /// Each directory's time: the newest mtime of the files anywhere below it.
    fn directory_times(&self) -> BTreeMap<String, (i64, u32)> {
        let mut times: BTreeMap<String, (i64, u32)> = BTreeMap::new();
        for (path, pending) in &self.entries {
            let Pending::File { mtime, .. } = pending else {
                continue;
            };
            let mut dir = path.as_str();
            while dir != "/" {
                dir = format::parent_path(dir);
                let time = times.entry(dir.to_owned()).or_insert(*mtime);
                *time = (*time).max(*mtime);
            }
        }
        times
    }
}

fn mtime(meta: &Metadata) -> (i64, u32) {
    (
        meta.mtime(),
        u32::try_from(meta.mtime_nsec().clamp(0, 999_999_999)).unwrap_or(0),
    )
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Adds the path to an I/O error so the user knows which file failed.
fn with_path(path: &Path) -> impl Fn(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn guest_path(host: &Path) -> io::Result<String> {
    let s = host
        .to_str()
        .ok_or_else(|| invalid(format!("{}: path is not UTF-8", host.display())))?;
    if !format::is_normal_path(s) {
        return Err(invalid(format!("{s}: not an absolute normalised path")));
    }
    Ok(s.to_owned())
}

impl Collector<'_> {
    fn in_writable_dir(&self, guest: &str) -> bool {
        self.manifest
            .writable_dirs
            .iter()
            .any(|w| format::is_within(guest, w))
    }

    fn insert(&mut self, guest: String, entry: Pending) -> io::Result<()> {
        if self.in_writable_dir(&guest) {
            return Err(invalid(format!(
                "{guest} lies in a writable directory (those start empty in every VM)"
            )));
        }
        if guest != "/" {
            self.add_ancestors(&guest)?;
        }
        match self.entries.get(&guest) {
            None => {
                self.entries.insert(guest, entry);
                Ok(())
            }
            Some(old) if *old == entry => Ok(()),
            Some(Pending::Dir { .. }) if matches!(entry, Pending::Dir { .. }) => Ok(()),
            Some(old) => Err(invalid(format!(
                "{guest} is listed twice with different contents ({old:?} and {entry:?})"
            ))),
        }
    }

    fn add_dir(&mut self, guest: &str, meta: Option<&Metadata>) -> io::Result<()> {
        let mode = meta.map_or(0o755, |m| m.permissions().mode() & 0o7777);
        self.insert(guest.to_owned(), Pending::Dir { mode })
    }

    /// Makes every ancestor of `guest` a directory entry (with the host directory's metadata
    /// where the host has one).
    fn add_ancestors(&mut self, guest: &str) -> io::Result<()> {
        let parent = format::parent_path(guest);
        if parent == "/" || self.entries.contains_key(parent) {
            return Ok(());
        }
        let meta = fs::symlink_metadata(parent).ok().filter(Metadata::is_dir);
        self.add_dir(parent, meta.as_ref())
    }

    fn add_spec(&mut self, spec: &PathSpec) -> io::Result<()> {
        match &spec.guest {
            None => self.add_host_path(&spec.host),
            Some(guest) => {
                let meta = fs::metadata(&spec.host).map_err(with_path(&spec.host))?;
                if !meta.is_file() {
                    return Err(invalid(format!(
                        "{}: only regular files can be given a guest path",
                        spec.host.display()
                    )));
                }
                let host = fs::canonicalize(&spec.host)?;
                let entry = Pending::File {
                    host: host.clone(),
                    size: meta.len(),
                    mode: meta.permissions().mode() & 0o7777,
                    mtime: mtime(&meta),
                };
                self.insert(guest.clone(), entry)?;
                self.scan.push((host, None));
                Ok(())
            }
        }
    }

    /// Adds a host path at its own location, with the symlinks on the way to it.
    fn add_host_path(&mut self, host: &Path) -> io::Result<()> {
        let mut budget = MAX_HOST_SYMLINKS;
        let canonical = self.resolve_recording(host, &mut budget)?;
        self.add_object(&canonical)
    }

    /// Resolves `path` on the host like the kernel does, recording each symlink it passes
    /// through as an image entry; returns the symlink-free path.
    fn resolve_recording(&mut self, path: &Path, budget: &mut u32) -> io::Result<PathBuf> {
        if !path.is_absolute() {
            return Err(invalid(format!("{}: not an absolute path", path.display())));
        }
        let mut cur = PathBuf::from("/");
        for component in path.components() {
            match component {
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
                Component::ParentDir => {
                    cur.pop();
                }
                Component::Normal(name) => {
                    let next = cur.join(name);
                    let meta = fs::symlink_metadata(&next).map_err(with_path(&next))?;
                    if !meta.file_type().is_symlink() {
                        cur = next;
                        continue;
                    }
                    if *budget == 0 {
                        return Err(invalid(format!(
                            "{}: too many levels of symbolic links",
                            path.display()
                        )));
                    }
                    *budget -= 1;
                    let target = fs::read_link(&next).map_err(with_path(&next))?;
                    let target_str = target
                        .to_str()
                        .ok_or_else(|| {
                            invalid(format!("{}: symlink target is not UTF-8", next.display()))
                        })?
                        .to_owned();
                    if target_str.is_empty() || target_str.len() >= format::PATH_MAX {
                        return Err(invalid(format!(
                            "{}: unusable symlink target",
                            next.display()
                        )));
                    }
                    self.insert(guest_path(&next)?, Pending::Symlink { target: target_str })?;
                    cur = self.resolve_recording(&cur.join(&target), budget)?;
                }
            }
        }
        Ok(cur)
    }

    /// Adds a symlink-free host path: a file, or a directory and everything below it.
    fn add_object(&mut self, canonical: &Path) -> io::Result<()> {
        if !self.done.insert(canonical.to_path_buf()) {
            return Ok(());
        }
        let guest = guest_path(canonical)?;
        let meta = fs::symlink_metadata(canonical).map_err(with_path(canonical))?;
        if meta.is_file() {
            let entry = Pending::File {
                host: canonical.to_path_buf(),
                size: meta.len(),
                mode: meta.permissions().mode() & 0o7777,
                mtime: mtime(&meta),
            };
            self.insert(guest, entry)?;
            self.scan.push((canonical.to_path_buf(), None));
            return Ok(());
        }
        if !meta.is_dir() {
            self.notes.push(format!(
                "{guest}: not a regular file, directory or symlink; skipped"
            ));
            return Ok(());
        }
        self.add_dir(&guest, Some(&meta))?;
        let mut children: Vec<PathBuf> = fs::read_dir(canonical)
            .map_err(with_path(canonical))?
            .map(|e| e.map(|e| e.path()))
            .collect::<io::Result<_>>()?;
        children.sort();
        for child in children {
            let child_guest = guest_path(&child)?;
            if self
                .manifest
                .exclude
                .iter()
                .any(|p| p.matches(&child_guest))
            {
                self.excluded += 1;
                continue;
            }
            if self.in_writable_dir(&child_guest) {
                self.notes.push(format!(
                    "{child_guest}: inside a writable directory; skipped"
                ));
                continue;
            }
            match self.add_host_path(&child) {
                // A dangling symlink inside a directory stays a (dangling) symlink, as on the host.
                Err(e) if e.kind() == io::ErrorKind::NotFound => self
                    .notes
                    .push(format!("{child_guest}: dangling symlink ({e})")),
                other => other?,
            }
        }
        Ok(())
    }

    /// Adds the interpreter and DT_NEEDED libraries of every ELF file, transitively.
    fn resolve_libraries(&mut self) -> io::Result<()> {
        while let Some((host, origin)) = self.scan.pop() {
            if !is_elf(&host)? {
                continue;
            }
            let bytes = fs::read(&host).map_err(with_path(&host))?;
            let (interp, info) = match (elf::interpreter(&bytes), elf::dynamic_info(&bytes)) {
                (Ok(interp), Ok(info)) => (interp, info),
                (Err(e), _) | (_, Err(e)) => {
                    self.notes.push(format!(
                        "{}: {e}; its dependencies were not resolved",
                        host.display()
                    ));
                    continue;
                }
            };
            if let Some(interp) = interp {
                self.add_library(&interp, &host)?;
            }
            let origin = origin.unwrap_or_else(|| folder_of(&host));
            // ld.so ignores DT_RPATH when DT_RUNPATH is present.
            let own_dirs = if info.runpath.is_empty() {
                &info.rpath
            } else {
                &info.runpath
            };
            for name in &info.needed {
                match locate_library(name, own_dirs, &origin) {
                    Some(path) => self.add_library(&path, &host)?,
                    None => self.notes.push(format!(
                        "{}: needed library {name} not found on the search path",
                        host.display()
                    )),
                }
            }
        }
        Ok(())
    }

    /// Adds the library ld.so will load from `path`. Its own `$ORIGIN` is the folder of `path`
    /// as found, not of the file a symlink there leads to (Debian's alternatives link
    /// libblas.so.3 to openblas-pthread/, and its RUNPATH $ORIGIN is then the link's folder),
    /// so a library reached through a symlink from another folder is scanned with that one too.
    fn add_library(&mut self, path: &str, needed_by: &Path) -> io::Result<()> {
        self.libraries.insert(path.to_owned());
        let mut budget = MAX_HOST_SYMLINKS;
        let canonical = self
            .resolve_recording(Path::new(path), &mut budget)
            .and_then(|canonical| self.add_object(&canonical).map(|()| canonical))
            .map_err(|e| {
                io::Error::new(e.kind(), format!("{e} (needed by {})", needed_by.display()))
            })?;
        let origin = folder_of(Path::new(path));
        if origin != folder_of(&canonical)
            && self
                .scanned_origins
                .insert((canonical.clone(), origin.clone()))
        {
            self.scan.push((canonical, Some(origin)));
        }
        Ok(())
    }

    fn finish(self, out_dir: &Path, started: Instant) -> io::Result<BuildReport> {
        let dir_times = self.directory_times();
        let newest = dir_times.get("/").copied().unwrap_or((0, 0));
        let mut report = BuildReport {
            name: self.manifest.name.clone(),
            files: 0,
            dirs: 0,
            symlinks: 0,
            bytes: 0,
            data_bytes: 0,
            libraries: self.libraries.into_iter().collect(),
            notes: self.notes,
            content_hash: [0; 32],
            seconds: 0.0,
        };
        for dir in &self.manifest.writable_dirs {
            if !matches!(
                self.entries.get(format::parent_path(dir)),
                Some(Pending::Dir { .. })
            ) {
                return Err(invalid(format!(
                    "writable directory {dir}: its parent is not a directory in the image"
                )));
            }
        }
        let mut entries = Vec::with_capacity(self.entries.len());
        let mut hosts: BTreeMap<String, PathBuf> = BTreeMap::new();
        for (path, pending) in &self.entries {
            if path != "/" {
                if let Some(parent @ (Pending::File { .. } | Pending::Symlink { .. })) =
                    self.entries.get(format::parent_path(path))
                {
                    let what = if matches!(parent, Pending::File { .. }) {
                        "a file"
                    } else {
                        "a symlink"
                    };
                    return Err(invalid(format!(
                        "{path}: its parent {} is {what} in the image",
                        format::parent_path(path)
                    )));
                }
            }
            let (mode, (mtime_sec, mtime_nsec), kind) = match pending {
                Pending::Dir { mode } => {
                    report.dirs += 1;
                    (
                        *mode,
                        dir_times.get(path.as_str()).copied().unwrap_or(newest),
                        EntryKind::Dir,
                    )
                }
                Pending::File {
                    host,
                    size,
                    mode,
                    mtime,
                } => {
                    report.files += 1;
                    report.bytes += size;
                    hosts.insert(path.clone(), host.clone());
                    (
                        *mode,
                        *mtime,
                        EntryKind::File {
                            offset: 0,
                            size: *size,
                            sha256: [0; 32],
                        },
                    )
                }
                Pending::Symlink { target } => {
                    report.symlinks += 1;
                    (
                        0o777,
                        newest,
                        EntryKind::Symlink {
                            target: target.clone(),
                        },
                    )
                }
            };
            entries.push(Entry {
                path: path.clone(),
                mode,
                mtime_sec,
                mtime_nsec,
                kind,
            });
        }
        let mut index = Index {
            name: self.manifest.name.clone(),
            writable_dirs: self.manifest.writable_dirs.clone(),
            entries,
        };
        report.content_hash = format::write(out_dir, &mut index, |entry| {
            let host = hosts
                .get(&entry.path)
                .ok_or_else(|| invalid(format!("{}: no host file", entry.path)))?;
            fs::read(host).map_err(with_path(host))
        })?;
        report.data_bytes = fs::metadata(out_dir.join(format::DATA_FILE))?.len();
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    }
}

fn is_elf(path: &Path) -> io::Result<bool> {
    let mut magic = [0u8; 4];
    let mut file = fs::File::open(path).map_err(with_path(path))?;
    match file.read_exact(&mut magic) {
        Ok(()) => Ok(magic == *b"\x7fELF"),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(with_path(path)(e)),
    }
}

/// The folder holding `path`, as text.
fn folder_of(path: &Path) -> String {
    path.parent()
        .unwrap_or(Path::new("/"))
        .to_string_lossy()
        .into_owned()
}

/// Finds a DT_NEEDED name the way ld.so would: a name with "/" is a path; otherwise the ELF's
/// own search directories ($ORIGIN expanded), then `LIBRARY_SEARCH_PATH`.
fn locate_library(name: &str, own_dirs: &[String], origin: &str) -> Option<String> {
    if name.contains('/') {
        return fs::metadata(name)
            .is_ok_and(|m| m.is_file())
            .then(|| name.to_owned());
    }
    let own = own_dirs
        .iter()
        .map(|d| d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin));
    own.chain(LIBRARY_SEARCH_PATH.iter().map(|d| d.to_string()))
        .filter(|dir| dir.starts_with('/'))
        .map(|dir| format!("{}/{name}", dir.trim_end_matches('/')))
        .find(|candidate| fs::metadata(candidate).is_ok_and(|m| m.is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{Image, Vfs, DEFAULT_OVERLAY_LIMIT};
    use crate::image::testdir::TempDir;
    use std::os::unix::fs::symlink;

    /// A host tree with files, a symlinked directory, a relative and an absolute symlink,
    /// an excluded subtree and a dangling link.
    fn host_tree(root: &Path) {
        fs::create_dir_all(root.join("real/sub")).unwrap();
        fs::create_dir_all(root.join("real/skip")).unwrap();
        fs::write(root.join("real/a.txt"), b"alpha").unwrap();
        fs::write(root.join("real/sub/b.txt"), b"beta").unwrap();
        fs::write(root.join("real/skip/c.txt"), b"gamma").unwrap();
        fs::write(root.join("real/x.opt-1.pyc"), b"opt").unwrap();
        fs::write(root.join("secret"), b"do not include").unwrap();
        symlink("real", root.join("alias")).unwrap();
        symlink("a.txt", root.join("real/rel-link")).unwrap();
        symlink("missing", root.join("real/dangling")).unwrap();
    }

    fn manifest(root: &Path, extra_paths: &str) -> Manifest {
        let r = root.display();
        let text = format!(
            r#"{{"name": "test", "paths": ["{r}/alias/", {extra_paths} {{"host": "{r}/real/a.txt", "guest": "/opt/renamed.txt"}}],
                "optional_paths": ["{r}/not-there"],
                "exclude": ["{r}/real/skip", "{r}/**/*.opt-1.pyc"], "writable_dirs": ["/scratch", "/work"]}}"#
        );
        Manifest::parse(text.as_bytes(), root).unwrap()
    }

    #[test]
    fn builds_symlinks_excludes_and_renamed_files() {
        let host = TempDir::new("build-host");
        host_tree(&host.0);
        let out = TempDir::new("build-out");
        let report = build_from(&manifest(&host.0, ""), &out.0).unwrap();
        let r = host.0.display().to_string();
        let image = Image::open(&out.0).unwrap();
        assert_eq!(image.content_hash(), report.content_hash);
        assert_eq!(image.writable_dirs(), ["/scratch", "/work"]);
        assert_eq!(
            image.file_bytes(&format!("{r}/alias/a.txt")),
            Some(&b"alpha"[..])
        );
        assert_eq!(
            image.file_bytes(&format!("{r}/real/sub/b.txt")),
            Some(&b"beta"[..])
        );
        assert_eq!(
            image.file_bytes(&format!("{r}/real/rel-link")),
            Some(&b"alpha"[..])
        );
        assert_eq!(image.file_bytes("/opt/renamed.txt"), Some(&b"alpha"[..]));
        assert_eq!(
            image.file_bytes(&format!("{r}/real/skip/c.txt")),
            None,
            "excluded directory"
        );
        assert_eq!(
            image.file_bytes(&format!("{r}/real/x.opt-1.pyc")),
            None,
            "excluded pattern"
        );
        assert_eq!(
            image.file_bytes(&format!("{r}/secret")),
            None,
            "never listed"
        );
        assert!(
            report
                .notes
                .iter()
                .any(|n| n.contains("not-there") && n.contains("absent")),
            "{:?}",
            report.notes
        );
        assert!(
            report.notes.iter().any(|n| n.contains("dangling")),
            "{:?}",
            report.notes
        );
        assert!(
            report.notes.iter().any(|n| n.contains("2 paths excluded")),
            "{:?}",
            report.notes
        );
        // The link itself is a symlink in the image, as on the host.
        let vfs = Vfs::new(image, DEFAULT_OVERLAY_LIMIT).unwrap();
        let alias = vfs
            .resolve(vfs.root(), format!("{r}/alias").as_bytes(), false)
            .unwrap();
        assert_eq!(vfs.readlink(alias).unwrap(), b"real");
        assert_eq!(report.files, 3);
        assert_eq!(report.symlinks, 3);
        assert_eq!(report.bytes, 5 + 4 + 5);
        assert_eq!(report.data_bytes, 3 * 4096);
        assert!(report.to_string().contains("content hash: "));
    }

    #[test]
    fn builds_are_deterministic() {
        let host = TempDir::new("det-host");
        host_tree(&host.0);
        let (a, b) = (TempDir::new("det-a"), TempDir::new("det-b"));
        let ra = build_from(&manifest(&host.0, ""), &a.0).unwrap();
        let rb = build_from(&manifest(&host.0, ""), &b.0).unwrap();
        assert_eq!(ra.content_hash, rb.content_hash);
        assert_eq!(
            fs::read(a.0.join(format::INDEX_FILE)).unwrap(),
            fs::read(b.0.join(format::INDEX_FILE)).unwrap()
        );
        // A changed file changes the hash.
        fs::write(host.0.join("real/sub/b.txt"), b"BETA").unwrap();
        assert_ne!(
            build_from(&manifest(&host.0, ""), &a.0)
                .unwrap()
                .content_hash,
            ra.content_hash
        );
    }

    #[test]
    fn refuses_bad_inputs() {
        let host = TempDir::new("bad-host");
        host_tree(&host.0);
        let out = TempDir::new("bad-out");
        let r = host.0.display().to_string();
        let missing =
            build_from(&manifest(&host.0, &format!(r#""{r}/nope","#)), &out.0).unwrap_err();
        assert!(missing.to_string().contains("nope"), "{missing}");
        let writable = Manifest::parse(
            format!(r#"{{"name": "t", "paths": ["{r}/real"], "writable_dirs": ["{r}/real/sub"]}}"#)
                .as_bytes(),
            &host.0,
        )
        .unwrap();
        // Walks skip the writable directory; its contents never enter the image.
        let report = build_from(&writable, &out.0).unwrap();
        assert!(
            report
                .notes
                .iter()
                .any(|n| n.contains("inside a writable directory")),
            "{:?}",
            report.notes
        );
        let under_file = Manifest::parse(
            format!(r#"{{"name": "t", "paths": ["{r}/real/a.txt", {{"host": "{r}/secret", "guest": "{r}/real/a.txt/x"}}]}}"#).as_bytes(),
            &host.0,
        )
        .unwrap();
        assert!(build_from(&under_file, &out.0)
            .unwrap_err()
            .to_string()
            .contains("is a file"));
        let under_link = Manifest::parse(
            format!(r#"{{"name": "t", "paths": ["{r}/alias"], "writable_dirs": ["{r}/alias/w"]}}"#)
                .as_bytes(),
            &host.0,
        )
        .unwrap();
        assert!(build_from(&under_link, &out.0)
            .unwrap_err()
            .to_string()
            .contains("parent is not a directory"));
        fs::create_dir_all(host.0.join("loops")).unwrap();
        symlink("l2", host.0.join("loops/l1")).unwrap();
        symlink("l1", host.0.join("loops/l2")).unwrap();
        let looped = Manifest::parse(
            format!(r#"{{"name": "t", "paths": ["{r}/loops/l1"]}}"#).as_bytes(),
            &host.0,
        )
        .unwrap();
        assert!(build_from(&looped, &out.0)
            .unwrap_err()
            .to_string()
            .contains("too many levels"));
    }

    #[test]
    fn resolves_shared_libraries_of_host_programs() {
        // /bin/true is a dynamic ELF on Debian: its interpreter and libc must come along.
        let out = TempDir::new("libs-out");
        let m = Manifest::parse(
            br#"{"name": "t", "paths": ["/bin/true"], "writable_dirs": ["/tmp"]}"#,
            Path::new("/"),
        )
        .unwrap();
        let report = build_from(&m, &out.0).unwrap();
        assert!(
            report
                .libraries
                .iter()
                .any(|l| l == "/lib64/ld-linux-x86-64.so.2"),
            "{:?}",
            report.libraries
        );
        assert!(
            report.libraries.iter().any(|l| l.ends_with("/libc.so.6")),
            "{:?}",
            report.libraries
        );
        let image = Image::open(&out.0).unwrap();
        let ld = image.file_bytes("/lib64/ld-linux-x86-64.so.2").unwrap();
        assert_eq!(&ld[..4], b"\x7fELF");
        assert_eq!(
            image.file_bytes("/bin/true").map(<[u8]>::len),
            Some(fs::metadata("/bin/true").unwrap().len() as usize)
        );
        assert!(image
            .file_bytes("/lib/x86_64-linux-gnu/libc.so.6")
            .is_some());
        assert!(image.file_bytes("/bin/false").is_none());
    }

    /// Compiles `source` with the host's cc into `out` with the extra `flags`.
    fn cc(source: &str, out: &Path, flags: &[&str]) {
        let status = std::process::Command::new("cc")
            .args(["-x", "c", "-", "-o"])
            .arg(out)
            .args(flags)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child.stdin.take().unwrap().write_all(source.as_bytes())?;
                child.wait()
            })
            .unwrap();
        assert!(status.success(), "cc {out:?}");
    }

    /// Debian's alternatives: lib/libouter.so links to real/libouter.so, whose RUNPATH
    /// $ORIGIN names lib/ (where ld.so found it), and libinner.so is in lib/ as a link too.
    #[test]
    fn origin_is_the_folder_a_library_was_found_in() {
        let host = TempDir::new("origin-host");
        let (real, lib) = (host.0.join("real"), host.0.join("lib"));
        fs::create_dir_all(&real).unwrap();
        fs::create_dir_all(&lib).unwrap();
        cc(
            "int inner(void){return 1;}",
            &real.join("libinner.so"),
            &["-shared", "-fPIC"],
        );
        let needs_inner = format!("-L{}", real.display());
        cc(
            "int inner(void); int outer(void){return inner();}",
            &real.join("libouter.so"),
            &[
                "-shared",
                "-fPIC",
                &needs_inner,
                "-linner",
                "-Wl,-rpath,$ORIGIN",
            ],
        );
        symlink("../real/libouter.so", lib.join("libouter.so")).unwrap();
        symlink("../real/libinner.so", lib.join("libinner.so")).unwrap();
        let needs_outer = format!("-L{}", lib.display());
        let rpath = format!("-Wl,-rpath,{}", lib.display());
        cc(
            "int outer(void); int main(void){return outer();}",
            &host.0.join("main"),
            &[&needs_outer, "-louter", &rpath],
        );
        let out = TempDir::new("origin-out");
        let text = format!(r#"{{"name": "t", "paths": ["{}/main"]}}"#, host.0.display());
        let report = build_from(
            &Manifest::parse(text.as_bytes(), Path::new("/")).unwrap(),
            &out.0,
        )
        .unwrap();
        let image = Image::open(&out.0).unwrap();
        let vfs = Vfs::new(image, DEFAULT_OVERLAY_LIMIT).unwrap();
        let inner_as_loaded = lib.join("libinner.so");
        let found = vfs.resolve(
            vfs.root(),
            inner_as_loaded.to_str().unwrap().as_bytes(),
            true,
        );
        assert!(
            found.is_ok(),
            "{inner_as_loaded:?} missing: {:?}",
            report.libraries
        );
        assert!(vfs
            .image()
            .file_bytes(real.join("libinner.so").to_str().unwrap())
            .is_some());
    }

    #[test]
    fn python_template_manifest_builds() {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/python/image.json");
        let out = TempDir::new("python-image");
        let report = build(&manifest, &out.0).unwrap();
        let image = Image::open(&out.0).unwrap();
        let vfs = Vfs::new(image, DEFAULT_OVERLAY_LIMIT).unwrap();
        let root = vfs.root();
        let python = vfs.resolve(root, b"/usr/bin/python3", true).unwrap();
        assert_eq!(
            vfs.resolve(root, b"/usr/bin/python3.11", true).unwrap(),
            python
        );
        assert_eq!(
            vfs.contents(python).unwrap(),
            fs::read("/usr/bin/python3.11").unwrap()
        );
        for present in [
            "/lib64/ld-linux-x86-64.so.2",
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/x86_64-linux-gnu/libexpat.so.1",
            "/usr/lib/python3.11/os.py",
            "/usr/lib/python3.11/encodings/__init__.py",
            "/usr/lib/python3.11/lib-dynload/_json.cpython-311-x86_64-linux-gnu.so",
        ] {
            assert!(
                vfs.image().file_bytes(present).is_some(),
                "{present} missing"
            );
        }
        for absent in [
            "/usr/lib/python3.11/test",
            "/usr/lib/python3.11/lib-dynload/_testcapi.cpython-311-x86_64-linux-gnu.so",
            "/etc/shadow",
        ] {
            assert_eq!(
                vfs.resolve(root, absent.as_bytes(), true).err(),
                Some(crate::errno::Errno::ENOENT),
                "{absent}"
            );
        }
        // Source mtimes survive, so the stdlib's .pyc files stay valid.
        let os_py = vfs
            .resolve(root, b"/usr/lib/python3.11/os.py", true)
            .unwrap();
        assert_eq!(
            vfs.stat(os_py).unwrap().mtime.sec,
            fs::metadata("/usr/lib/python3.11/os.py").unwrap().mtime()
        );
        assert!(
            report.libraries.iter().any(|l| l.ends_with("/libssl.so.3")),
            "lib-dynload's own libraries: {:?}",
            report.libraries
        );
        let tmp = vfs.resolve(root, b"/tmp", true).unwrap();
        assert_eq!(vfs.access(tmp, crate::fs::W_OK), Ok(()));
    }
}
