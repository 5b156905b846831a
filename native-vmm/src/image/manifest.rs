//! The image manifest: which host paths go into an image (schema in ../../IMAGE.md).

use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::format::{is_normal_path, is_within};
use super::pattern::Pattern;

/// One path to include.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathSpec {
    /// Absolute host path (relative manifest paths are resolved against the manifest's folder).
    pub host: PathBuf,
    /// Where a single file goes in the image; None keeps the host path.
    pub guest: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub name: String,
    pub paths: Vec<PathSpec>,
    /// Like `paths`, but skipped with a note when absent on the host.
    pub optional_paths: Vec<PathSpec>,
    pub exclude: Vec<Pattern>,
    /// Directories each VM gets as a writable in-memory overlay (nothing from the host).
    pub writable_dirs: Vec<String>,
}

/// The manifest as written (IMAGE.md); unknown keys are refused so a misspelt one is not ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
struct ManifestFile {
    name: String,
    paths: Vec<PathEntry>,
    #[serde(default)]
    optional_paths: Vec<PathEntry>,
    #[serde(default)]
    exclude: Vec<String>,
    #[serde(default)]
    writable_dirs: Vec<String>,
}

/// An entry of `paths` or `optional_paths`: a host path kept at the same place, or a single
/// file placed elsewhere.
#[derive(Deserialize)]
#[serde(untagged)]
enum PathEntry {
    SamePlace(String),
    Placed(PlacedFile),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlacedFile {
    host: String,
    guest: String,
}

impl Manifest {
    pub fn load(path: &Path) -> io::Result<Manifest> {
        let text = std::fs::read(path)
            .map_err(|e| io::Error::new(e.kind(), format!("manifest {}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let base = if base.as_os_str().is_empty() {
            Path::new(".")
        } else {
            base
        };
        let base = std::fs::canonicalize(base)?;
        Manifest::parse(&text, &base).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("manifest {}: {e}", path.display()),
            )
        })
    }

    /// Parses manifest JSON; relative host paths are taken relative to `base_dir`.
    pub fn parse(text: &[u8], base_dir: &Path) -> Result<Manifest, String> {
        let file: ManifestFile = serde_json::from_slice(text).map_err(|e| e.to_string())?;
        if file.name.is_empty() || file.name.len() > 255 {
            return Err("\"name\" must be 1 to 255 bytes".into());
        }
        let paths = path_specs(file.paths, "paths", base_dir)?;
        if paths.is_empty() {
            return Err("\"paths\" must list at least one path".into());
        }
        let optional_paths = path_specs(file.optional_paths, "optional_paths", base_dir)?;
        let exclude = file
            .exclude
            .iter()
            .map(|p| Pattern::new(p))
            .collect::<Result<Vec<_>, _>>()?;
        let writable_dirs = file.writable_dirs;
        for (i, dir) in writable_dirs.iter().enumerate() {
            if dir == "/" || !is_normal_path(dir) {
                return Err(format!(
                    "writable directory {dir:?} must be an absolute normalised path below /"
                ));
            }
            if writable_dirs[..i]
                .iter()
                .any(|other| is_within(dir, other) || is_within(other, dir))
            {
                return Err(format!("writable directory {dir:?} overlaps another one"));
            }
        }
        Ok(Manifest {
            name: file.name,
            paths,
            optional_paths,
            exclude,
            writable_dirs,
        })
    }
}

/// Checks the entries of `key` and resolves their host paths against `base_dir`.
fn path_specs(
    entries: Vec<PathEntry>,
    key: &str,
    base_dir: &Path,
) -> Result<Vec<PathSpec>, String> {
    entries
        .into_iter()
        .map(|entry| {
            let (host, guest) = match entry {
                PathEntry::SamePlace(host) => (host, None),
                PathEntry::Placed(PlacedFile { host, guest }) => {
                    if guest == "/" || !is_normal_path(&guest) {
                        return Err(format!(
                            "guest path {guest:?} must be an absolute normalised path below /"
                        ));
                    }
                    (host, Some(guest))
                }
            };
            if host.is_empty() {
                return Err(format!("an entry of \"{key}\" has an empty host path"));
            }
            Ok(PathSpec {
                host: base_dir.join(host),
                guest,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_manifest() {
        let text = br#"{"name": "py", "paths": ["/usr/bin/python3", {"host": "agent.py", "guest": "/opt/agent.py"}],
            "optional_paths": ["/nope"], "exclude": ["/usr/**/test"], "writable_dirs": ["/tmp", "/work"]}"#;
        let m = Manifest::parse(text, Path::new("/templates/py")).unwrap();
        assert_eq!(m.name, "py");
        assert_eq!(
            m.paths[0],
            PathSpec {
                host: "/usr/bin/python3".into(),
                guest: None
            }
        );
        assert_eq!(
            m.paths[1],
            PathSpec {
                host: "/templates/py/agent.py".into(),
                guest: Some("/opt/agent.py".into())
            }
        );
        assert_eq!(m.optional_paths.len(), 1);
        assert!(m.exclude[0].matches("/usr/lib/test"));
        assert_eq!(m.writable_dirs, ["/tmp", "/work"]);
    }

    #[test]
    fn rejects_invalid_manifests() {
        let bad = |text: &str| Manifest::parse(text.as_bytes(), Path::new("/")).unwrap_err();
        assert!(bad("[]").contains("expected a JSON object"));
        assert!(bad(r#"{"name": "x", "paths": ["/a"], "exlude": []}"#)
            .contains("unknown field `exlude`"));
        assert!(bad(r#"{"paths": ["/a"]}"#).contains("missing field `name`"));
        assert!(bad(r#"{"name": "x", "paths": []}"#).contains("at least one"));
        // An entry that is neither a string nor a {"host", "guest"} object.
        assert!(bad(r#"{"name": "x", "paths": [1]}"#).contains("did not match any variant"));
        assert!(
            bad(r#"{"name": "x", "paths": [{"host": "/a", "guest": "rel"}]}"#)
                .contains("guest path")
        );
        assert!(bad(r#"{"name": "x", "paths": [{"host": "/a"}]}"#)
            .contains("did not match any variant"));
        assert!(bad(r#"{"name": "x", "paths": [""]}"#).contains("empty host path"));
        assert!(
            bad(r#"{"name": "x", "paths": ["/a"], "exclude": ["rel"]}"#).contains("not absolute")
        );
        assert!(
            bad(r#"{"name": "x", "paths": ["/a"], "writable_dirs": ["/"]}"#).contains("below /")
        );
        assert!(
            bad(r#"{"name": "x", "paths": ["/a"], "writable_dirs": ["/w", "/w/x"]}"#)
                .contains("overlaps")
        );
        assert!(bad(r#"{"name": "x", "paths": ["/a"],}"#).contains("trailing comma at line 1"));
        assert!(bad(r#"{"name": "x", "name": "y", "paths": ["/a"]}"#)
            .contains("duplicate field `name`"));
    }
}
