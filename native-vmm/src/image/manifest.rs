//! The image manifest: which host paths go into an image (schema in ../../IMAGE.md).

use std::io;
use std::path::{Path, PathBuf};

use super::format::{is_normal_path, is_within};
use super::pattern::Pattern;
use crate::json::{self, Value};

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

const KEYS: [&str; 5] = ["name", "paths", "optional_paths", "exclude", "writable_dirs"];

impl Manifest {
    pub fn load(path: &Path) -> io::Result<Manifest> {
        let text = std::fs::read(path).map_err(|e| io::Error::new(e.kind(), format!("manifest {}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let base = if base.as_os_str().is_empty() { Path::new(".") } else { base };
        let base = std::fs::canonicalize(base)?;
        Manifest::parse(&text, &base).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("manifest {}: {e}", path.display())))
    }

    /// Parses manifest JSON; relative host paths are taken relative to `base_dir`.
    pub fn parse(text: &[u8], base_dir: &Path) -> Result<Manifest, String> {
        let doc = json::parse(text).map_err(|e| e.to_string())?;
        let members = doc.as_object().ok_or("the manifest is not a JSON object")?;
        if let Some((key, _)) = members.iter().find(|(k, _)| !KEYS.contains(&k.as_str())) {
            return Err(format!("unknown key {key:?} (expected one of {KEYS:?})"));
        }
        let name = doc.get("name").and_then(Value::as_str).ok_or("\"name\" must be a string")?;
        if name.is_empty() || name.len() > 255 {
            return Err("\"name\" must be 1 to 255 bytes".into());
        }
        let paths = path_specs(&doc, "paths", base_dir)?;
        if paths.is_empty() {
            return Err("\"paths\" must list at least one path".into());
        }
        let optional_paths = path_specs(&doc, "optional_paths", base_dir)?;
        let exclude = strings(&doc, "exclude")?.iter().map(|p| Pattern::new(p)).collect::<Result<Vec<_>, _>>()?;
        let writable_dirs = strings(&doc, "writable_dirs")?;
        for (i, dir) in writable_dirs.iter().enumerate() {
            if dir == "/" || !is_normal_path(dir) {
                return Err(format!("writable directory {dir:?} must be an absolute normalised path below /"));
            }
            if writable_dirs[..i].iter().any(|other| is_within(dir, other) || is_within(other, dir)) {
                return Err(format!("writable directory {dir:?} overlaps another one"));
            }
        }
        Ok(Manifest { name: name.to_owned(), paths, optional_paths, exclude, writable_dirs })
    }
}

/// An optional array of strings.
fn strings(doc: &Value, key: &str) -> Result<Vec<String>, String> {
    match doc.get(key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| format!("\"{key}\" must contain only strings")))
            .collect(),
        Some(_) => Err(format!("\"{key}\" must be an array")),
    }
}

/// An optional array of host paths or {"host": ..., "guest": ...} objects.
fn path_specs(doc: &Value, key: &str, base_dir: &Path) -> Result<Vec<PathSpec>, String> {
    let items = match doc.get(key) {
        None => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(format!("\"{key}\" must be an array")),
    };
    items
        .iter()
        .map(|item| {
            let (host, guest) = match item {
                Value::String(host) => (host.as_str(), None),
                Value::Object(members) => {
                    if members.iter().any(|(k, _)| k != "host" && k != "guest") {
                        return Err(format!("an entry of \"{key}\" has a key other than \"host\" and \"guest\""));
                    }
                    let host = item.get("host").and_then(Value::as_str).ok_or_else(|| format!("an entry of \"{key}\" lacks a \"host\" string"))?;
                    let guest = item.get("guest").and_then(Value::as_str).ok_or_else(|| format!("an entry of \"{key}\" lacks a \"guest\" string"))?;
                    if guest == "/" || !is_normal_path(guest) {
                        return Err(format!("guest path {guest:?} must be an absolute normalised path below /"));
                    }
                    (host, Some(guest.to_owned()))
                }
                _ => return Err(format!("entries of \"{key}\" must be strings or {{\"host\", \"guest\"}} objects")),
            };
            if host.is_empty() {
                return Err(format!("an entry of \"{key}\" has an empty host path"));
            }
            Ok(PathSpec { host: base_dir.join(host), guest })
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
        assert_eq!(m.paths[0], PathSpec { host: "/usr/bin/python3".into(), guest: None });
        assert_eq!(m.paths[1], PathSpec { host: "/templates/py/agent.py".into(), guest: Some("/opt/agent.py".into()) });
        assert_eq!(m.optional_paths.len(), 1);
        assert!(m.exclude[0].matches("/usr/lib/test"));
        assert_eq!(m.writable_dirs, ["/tmp", "/work"]);
    }

    #[test]
    fn rejects_invalid_manifests() {
        let bad = |text: &str| Manifest::parse(text.as_bytes(), Path::new("/")).unwrap_err();
        assert!(bad("[]").contains("not a JSON object"));
        assert!(bad(r#"{"name": "x", "paths": ["/a"], "exlude": []}"#).contains("unknown key"));
        assert!(bad(r#"{"paths": ["/a"]}"#).contains("name"));
        assert!(bad(r#"{"name": "x", "paths": []}"#).contains("at least one"));
        assert!(bad(r#"{"name": "x", "paths": [1]}"#).contains("strings or"));
        assert!(bad(r#"{"name": "x", "paths": [{"host": "/a", "guest": "rel"}]}"#).contains("guest path"));
        assert!(bad(r#"{"name": "x", "paths": [{"host": "/a"}]}"#).contains("guest"));
        assert!(bad(r#"{"name": "x", "paths": ["/a"], "exclude": ["rel"]}"#).contains("not absolute"));
        assert!(bad(r#"{"name": "x", "paths": ["/a"], "writable_dirs": ["/"]}"#).contains("below /"));
        assert!(bad(r#"{"name": "x", "paths": ["/a"], "writable_dirs": ["/w", "/w/x"]}"#).contains("overlaps"));
        assert!(bad(r#"{"name": "x", "paths": ["/a"],}"#).contains("invalid JSON at byte"));
    }
}
