//! Turning a client's frame into a typed message, checking every field.
//!
//! Policy (also in PROTOCOL.md's terms):
//! - Unknown fields are REJECTED (`bad_request` naming the field): a misspelt optional field
//!   (`"timeout": 5` for `limits.timeout_ms`) would otherwise silently run with defaults. New
//!   fields come with a new protocol version.
//! - Integers are JSON integers in 0..=2^53-1 (what every JSON client represents exactly).
//! - Strings that reach the guest as C strings (argv, env) may not contain NUL.
//! - Counts are bounded (`MAX_ARGS`, `MAX_ENV`, `MAX_FILES`); sizes are bounded by the frame.
//! - Limits: each is an integer ≥ its minimum; larger than the daemon's maximum is clamped,
//!   not refused (PROTOCOL.md), and the clamped value is what the execution runs under.

use std::collections::BTreeSet;

use crate::daemon::base64;
use crate::daemon::executor::{ExecuteRequest, ExecutionLimits, InputFile};
use crate::daemon::response::ErrorCode;
use crate::json::Value;

/// The protocol version this daemon speaks.
pub const PROTOCOL_VERSION: u64 = 1;
/// The largest integer a request may carry (JavaScript's Number.MAX_SAFE_INTEGER).
pub const MAX_INTEGER: u64 = (1 << 53) - 1;
pub const MAX_ARGS: usize = 1024;
pub const MAX_ENV: usize = 1024;
pub const MAX_FILES: usize = 1024;
/// Template names and environment variable names.
pub const MAX_NAME_BYTES: usize = 255;
/// A file path, relative to the working directory, and each of its components.
pub const MAX_PATH_BYTES: usize = 1024;
pub const MAX_COMPONENT_BYTES: usize = 255;
/// Below this a Python guest cannot even load; asking for less is a bad request.
pub const MIN_MEMORY_MIB: u64 = 16;
pub const DEFAULT_ARGV0: &str = "main.py";

/// Default and maximum limits of a daemon (`serve --max-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitPolicy {
    pub default: ExecutionLimits,
    pub max: ExecutionLimits,
}

impl LimitPolicy {
    /// Defaults are `preferred` clamped to `max`.
    pub fn new(preferred: ExecutionLimits, max: ExecutionLimits) -> LimitPolicy {
        let default = ExecutionLimits {
            timeout_ms: preferred.timeout_ms.min(max.timeout_ms),
            memory_mib: preferred.memory_mib.min(max.memory_mib),
            output_bytes: preferred.output_bytes.min(max.output_bytes),
        };
        LimitPolicy { default, max }
    }
}

/// A request after the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    ListTemplates,
    Execute(ExecuteRequest),
    Health,
    Stats,
}

/// Why a frame was refused, with the request's `id` when it could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    pub id: Option<u64>,
    pub code: ErrorCode,
    pub message: String,
}

fn bad(id: Option<u64>, message: impl Into<String>) -> RequestError {
    RequestError { id, code: ErrorCode::BadRequest, message: message.into() }
}

/// The members of one object, checked for unknown keys when created.
struct Fields<'a> {
    members: &'a [(String, Value)],
    id: Option<u64>,
    /// Where this object is, for messages ("limits", "files[2]").
    place: String,
}

impl<'a> Fields<'a> {
    fn new(value: &'a Value, place: &str, allowed: &[&str], id: Option<u64>) -> Result<Fields<'a>, RequestError> {
        let members = value.as_object().ok_or_else(|| bad(id, format!("{place} must be an object")))?;
        if let Some((key, _)) = members.iter().find(|(key, _)| !allowed.contains(&key.as_str())) {
            let at = if place.is_empty() { String::new() } else { format!(" in {place}") };
            return Err(bad(id, format!("unknown field '{}'{at}", truncate(key))));
        }
        Ok(Fields { members, id, place: place.to_owned() })
    }

    fn name(&self, key: &str) -> String {
        if self.place.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.place)
        }
    }

    /// A present, non-null member.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.members.iter().find(|(k, _)| k == key).map(|(_, v)| v).filter(|v| !v.is_null())
    }

    fn require(&self, key: &str) -> Result<&'a Value, RequestError> {
        self.get(key).ok_or_else(|| bad(self.id, format!("{} is required", self.name(key))))
    }

    fn string(&self, key: &str, value: &'a Value) -> Result<&'a str, RequestError> {
        value.as_str().ok_or_else(|| bad(self.id, format!("{} must be a string", self.name(key))))
    }

    fn integer(&self, key: &str, value: &Value, min: u64) -> Result<u64, RequestError> {
        match value.as_u64() {
            Some(n) if (min..=MAX_INTEGER).contains(&n) => Ok(n),
            _ => Err(bad(self.id, format!("{} must be an integer from {min} to {MAX_INTEGER}", self.name(key)))),
        }
    }
}

/// At most 64 characters of client text, for error messages.
fn truncate(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// The first frame: `{"type": "hello", "protocol": N}`. Returns the version asked for
/// (`unsupported_protocol` when it is not ours).
pub fn parse_hello(frame: &Value) -> Result<u64, RequestError> {
    let fields = Fields::new(frame, "", &["type", "protocol"], None)?;
    let kind = fields.string("type", fields.require("type")?)?;
    if kind != "hello" {
        return Err(bad(None, format!("the first frame must be a hello, not '{}'", truncate(kind))));
    }
    let protocol = fields.integer("protocol", fields.require("protocol")?, 0)?;
    if protocol != PROTOCOL_VERSION {
        return Err(RequestError { id: None, code: ErrorCode::UnsupportedProtocol, message: format!("protocol {protocol} is not supported; this daemon speaks protocol {PROTOCOL_VERSION}") });
    }
    Ok(protocol)
}

/// A request after the handshake: its `id` and what it asks.
pub fn parse_request(frame: &Value, policy: &LimitPolicy) -> Result<(u64, Request), RequestError> {
    // The id first, so that every later error can carry it.
    let id = match frame.get("id") {
        Some(value) => match value.as_u64() {
            Some(id) if id <= MAX_INTEGER => id,
            _ => return Err(bad(None, format!("id must be an integer from 0 to {MAX_INTEGER}"))),
        },
        None => return Err(bad(None, "id is required")),
    };
    let kind = match frame.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(_) => return Err(bad(Some(id), "type must be a string")),
        None => return Err(bad(Some(id), "type is required")),
    };
    let request = match kind {
        "list_templates" => {
            Fields::new(frame, "", &["id", "type"], Some(id))?;
            Request::ListTemplates
        }
        "health" => {
            Fields::new(frame, "", &["id", "type"], Some(id))?;
            Request::Health
        }
        "stats" => {
            Fields::new(frame, "", &["id", "type"], Some(id))?;
            Request::Stats
        }
        "execute" => Request::Execute(parse_execute(frame, id, policy)?),
        "hello" => return Err(bad(Some(id), "the handshake is already done")),
        other => return Err(bad(Some(id), format!("unknown request type '{}'", truncate(other)))),
    };
    Ok((id, request))
}

fn parse_execute(frame: &Value, id: u64, policy: &LimitPolicy) -> Result<ExecuteRequest, RequestError> {
    let id = Some(id);
    let fields = Fields::new(frame, "", &["id", "type", "template", "code", "stdin", "argv", "env", "files", "limits"], id)?;
    let template = fields.string("template", fields.require("template")?)?;
    if template.is_empty() || template.len() > MAX_NAME_BYTES {
        return Err(bad(id, format!("template must be 1 to {MAX_NAME_BYTES} bytes")));
    }
    let code = fields.string("code", fields.require("code")?)?;
    let stdin = match fields.get("stdin") {
        Some(value) => fields.string("stdin", value)?.as_bytes().to_vec(),
        None => Vec::new(),
    };
    let argv = match fields.get("argv") {
        Some(value) => parse_argv(value, id)?,
        None => vec![DEFAULT_ARGV0.to_owned()],
    };
    let env = match fields.get("env") {
        Some(value) => parse_env(value, id)?,
        None => Vec::new(),
    };
    let files = match fields.get("files") {
        Some(value) => parse_files(value, id)?,
        None => Vec::new(),
    };
    let limits = match fields.get("limits") {
        Some(value) => parse_limits(value, id, policy)?,
        None => policy.default,
    };
    Ok(ExecuteRequest { template: template.to_owned(), code: code.to_owned(), stdin, argv, env, files, limits })
}

fn parse_argv(value: &Value, id: Option<u64>) -> Result<Vec<String>, RequestError> {
    let items = value.as_array().ok_or_else(|| bad(id, "argv must be an array of strings"))?;
    if items.is_empty() || items.len() > MAX_ARGS {
        return Err(bad(id, format!("argv must have 1 to {MAX_ARGS} entries")));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item.as_str() {
            Some(arg) if !arg.contains('\0') => Ok(arg.to_owned()),
            Some(_) => Err(bad(id, format!("argv[{i}] contains a NUL character"))),
            None => Err(bad(id, format!("argv[{i}] must be a string"))),
        })
        .collect()
}

fn parse_env(value: &Value, id: Option<u64>) -> Result<Vec<(String, String)>, RequestError> {
    let members = value.as_object().ok_or_else(|| bad(id, "env must be an object of strings"))?;
    if members.len() > MAX_ENV {
        return Err(bad(id, format!("env may have at most {MAX_ENV} variables")));
    }
    // The JSON reader has already refused duplicate names.
    members
        .iter()
        .map(|(name, value)| {
            if name.is_empty() || name.len() > MAX_NAME_BYTES || name.contains('=') || name.contains('\0') {
                return Err(bad(id, format!("env name '{}' must be 1 to {MAX_NAME_BYTES} bytes without '=' or NUL", truncate(name))));
            }
            match value.as_str() {
                Some(text) if !text.contains('\0') => Ok((name.clone(), text.to_owned())),
                Some(_) => Err(bad(id, format!("env.{} contains a NUL character", truncate(name)))),
                None => Err(bad(id, format!("env.{} must be a string", truncate(name)))),
            }
        })
        .collect()
}

/// A relative path with no empty, `.` or `..` components, within the length bounds.
fn check_relative_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() || path.len() > MAX_PATH_BYTES {
        return Err("must be 1 to 1024 bytes");
    }
    if path.starts_with('/') {
        return Err("must be relative to the working directory");
    }
    if path.contains('\0') {
        return Err("contains a NUL character");
    }
    for component in path.split('/') {
        match component {
            "" => return Err("has an empty component"),
            "." | ".." => return Err("may not contain '.' or '..'"),
            c if c.len() > MAX_COMPONENT_BYTES => return Err("has a component longer than 255 bytes"),
            _ => {}
        }
    }
    Ok(())
}

fn parse_files(value: &Value, id: Option<u64>) -> Result<Vec<InputFile>, RequestError> {
    let items = value.as_array().ok_or_else(|| bad(id, "files must be an array of objects"))?;
    if items.len() > MAX_FILES {
        return Err(bad(id, format!("files may have at most {MAX_FILES} entries")));
    }
    let mut files = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let place = format!("files[{i}]");
        let fields = Fields::new(item, &place, &["path", "content", "encoding"], id)?;
        let path = fields.string("path", fields.require("path")?)?;
        check_relative_path(path).map_err(|why| bad(id, format!("{place}.path {why}")))?;
        let content = fields.string("content", fields.require("content")?)?;
        let encoding = match fields.get("encoding") {
            Some(value) => fields.string("encoding", value)?,
            None => "utf8",
        };
        let content = match encoding {
            "utf8" => content.as_bytes().to_vec(),
            "base64" => base64::decode(content).map_err(|why| bad(id, format!("{place}.content: {why}")))?,
            other => return Err(bad(id, format!("{place}.encoding must be 'utf8' or 'base64', not '{}'", truncate(other)))),
        };
        files.push(InputFile { path: path.to_owned(), content });
    }
    // No path twice, and no file where another one needs a directory.
    let paths: BTreeSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    if paths.len() != files.len() {
        return Err(bad(id, "files lists a path twice"));
    }
    for file in &files {
        let as_dir = format!("{}/", file.path);
        if let Some(inner) = paths.range(as_dir.as_str()..).next().filter(|p| p.starts_with(&as_dir)) {
            return Err(bad(id, format!("files: '{}' is a file, so '{}' cannot be created", truncate(&file.path), truncate(inner))));
        }
    }
    Ok(files)
}

fn parse_limits(value: &Value, id: Option<u64>, policy: &LimitPolicy) -> Result<ExecutionLimits, RequestError> {
    let fields = Fields::new(value, "limits", &["timeout_ms", "memory_mib", "output_bytes"], id)?;
    let pick = |key: &str, min: u64, default: u64, max: u64| -> Result<u64, RequestError> {
        match fields.get(key) {
            Some(value) => Ok(fields.integer(key, value, min)?.min(max)),
            None => Ok(default),
        }
    };
    let (default, max) = (policy.default, policy.max);
    Ok(ExecutionLimits {
        timeout_ms: pick("timeout_ms", 1, default.timeout_ms, max.timeout_ms)?,
        memory_mib: pick("memory_mib", MIN_MEMORY_MIB, default.memory_mib, max.memory_mib)?,
        output_bytes: pick("output_bytes", 0, default.output_bytes, max.output_bytes)?,
    })
}
