//! The request a template's in-VM agent runs (templates/python/agent.py), its checks, and the
//! message the agent receives.
//!
//! The hand-off: the agent boots, imports what user code needs and makes Sandfork's private
//! system call `AWAIT_REQUEST(buf, buf_len)` ([`AWAIT_REQUEST_SYSCALL`]). That call is the
//! template's READY POINT. With no request pending the VMM stops the run inside it (a template
//! build; the snapshot is taken there). With one pending (`GuestProcess::agent_request`,
//! answered by `syscalls/agent.rs`) the VMM, without further exits:
//! * writes [`AgentRequest::agent_message`] (JSON: code, argv, env) to `buf` and returns its
//!   length; when it does not fit, returns -E2BIG and writes the length it needs as a
//!   little-endian u64 at `buf` (if `buf_len` >= 8), and the agent retries once;
//! * places the script (the code at /work/argv[0]) and the request's files in the overlay
//!   under /work;
//! * makes the request's stdin the guest's fd 0.
//!
//!
//! A stateful session (`daemon::sessions`) hands its requests over as CELLS instead
//! ([`HandOff::Cell`]): the message carries `"session": {"reseed": bool}`, nothing is placed in
//! /work and stdin is left alone; the agent runs the code in its lasting namespace and makes
//! AWAIT_REQUEST again as `AWAIT_REQUEST(buf, buf_len, result, result_len, CELL_RESULT_MAGIC)`,
//! `result` being the cell's outcome as JSON ([`CellResult`]). The run then stops at that call,
//! a ready point again, from which the session's VM is served its next cell or checkpointed.
//!
//! Every request is checked ([`AgentRequest::validate`]) before any VM is started or touched:
//! paths stay inside /work, sizes are bounded.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Serialize, Serializer};

use crate::fs::{NAME_MAX, PATH_MAX};

/// Sandfork's private system call number for AWAIT_REQUEST: "SF" and 1, far outside Linux's
/// x86-64 numbers (below 512), so no Linux program reaches it by accident. The agent's copy
/// is in templates/python/agent.py.
pub const AWAIT_REQUEST_SYSCALL: u64 = 0x5346_0001;

/// Sandfork's private system call PUBLISH_RESULT(buf, buf_len): a script's agent passes its
/// result ([`CellResult`] as JSON) before it exits; the execution's answer carries it.
pub const PUBLISH_RESULT_SYSCALL: u64 = 0x5346_0002;

/// The fifth AWAIT_REQUEST argument of an agent passing a cell's result ("SFCE").
pub const CELL_RESULT_MAGIC: u64 = 0x5346_4345;
/// The largest result (a cell's or a script's) the VMM reads from the guest: a repr cut to 64
/// Ki characters and rich results (a few charts). The daemon's answer carries it beside at most
/// 2 MiB of output and `MAX_OUTPUT_FILES_BYTES` of files, inside one 16 MiB frame.
pub const MAX_RESULT_BYTES: u64 = 1 << 20;

/// The folder under /work whose files an execution's answer carries back (`output_files`).
pub const OUTPUT_DIR: &str = "out";
/// Files listed from it, at most (the first in path order).
pub const MAX_OUTPUT_FILES: usize = 100;
/// Their contents together, at most: files beyond it are listed without their contents.
pub const MAX_OUTPUT_FILES_BYTES: u64 = 2 << 20;

/// How the pending request is handed to the agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HandOff {
    /// A one-shot script: files and stdin placed, the agent exits after it.
    #[default]
    Script,
    /// A session cell; `reseed`: the first cell after the VM was created from a template or
    /// a checkpoint, whose random generators every fork of it shares.
    Cell { reseed: bool },
}

/// What a session cell gave back through its next AWAIT_REQUEST (the agent's `run_cell`), or
/// a script through PUBLISH_RESULT (no `error`: its exit code and stderr say that).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, Serialize)]
pub struct CellResult {
    /// repr() of the last expression, when it was one and not None.
    pub value: Option<String>,
    /// The exception that ended the cell.
    #[serde(default)]
    pub error: Option<CellError>,
    /// What the code displayed, in order: charts, and the last expression's rich forms.
    #[serde(default)]
    pub results: Vec<RichResult>,
}

/// One displayed thing in one format, as Jupyter's display data: a MIME type and the data
/// (base64 for binary types such as image/png, the text itself for text types).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, Serialize)]
pub struct RichResult {
    #[serde(rename = "type")]
    pub mime: String,
    pub data: String,
}

/// A file the program left under /work/out: its path relative to /work/out, size, and
/// contents unless the files before it used up `MAX_OUTPUT_FILES_BYTES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputFile {
    pub path: String,
    pub bytes: u64,
    pub contents: Option<Vec<u8>>,
}

/// The regular files under /work/out of `vfs` (symlinks and special files are left out), in
/// path order, at most `MAX_OUTPUT_FILES`, with their contents while they fit
/// `MAX_OUTPUT_FILES_BYTES`. None when there is no such folder.
pub fn output_files(vfs: &crate::fs::Vfs) -> Option<Vec<OutputFile>> {
    let dir = format!("{}/{OUTPUT_DIR}", crate::fs::WORK_DIR);
    let root = vfs.resolve(vfs.root(), dir.as_bytes(), false).ok()?;
    if vfs.kind(root) != Ok(crate::fs::FileKind::Directory) {
        return None;
    }
    let mut files = Vec::new();
    let mut budget = MAX_OUTPUT_FILES_BYTES;
    let mut pending = vec![(root, String::new())];
    let mut found = Vec::new();
    while let Some((node, prefix)) = pending.pop() {
        let Ok(entries) = vfs.read_dir(node) else {
            continue;
        };
        for entry in entries {
            let Ok(name) = String::from_utf8(entry.name) else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let Ok(child) = vfs.resolve(node, name.as_bytes(), false) else {
                continue;
            };
            let path = format!("{prefix}{name}");
            match entry.kind {
                crate::fs::FileKind::Directory => pending.push((child, format!("{path}/"))),
                crate::fs::FileKind::Regular => found.push((path, child)),
                _ => {}
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    for (path, node) in found.into_iter().take(MAX_OUTPUT_FILES) {
        let Ok(contents) = vfs.contents(node) else {
            continue;
        };
        let bytes = contents.len() as u64;
        let kept = bytes <= budget;
        if kept {
            budget -= bytes;
        }
        files.push(OutputFile {
            path,
            bytes,
            contents: kept.then(|| contents.to_vec()),
        });
    }
    Some(files)
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, Serialize)]
pub struct CellError {
    pub name: String,
    pub message: String,
}

/// How a template's agent is started in a fresh guest: the program and its whole argv.
#[derive(Debug, Clone, Copy)]
pub struct AgentCommand {
    pub program: &'static str,
    pub argv: &'static [&'static str],
    /// The working directory it boots in.
    pub cwd: &'static str,
}

/// Where templates/python/image.json puts the Python agent.
pub const PYTHON_AGENT_PATH: &str = "/opt/sandfork/agent.py";

/// The Python template's agent. `-I` (isolated mode): PYTHON* variables (PYTHONHASHSEED,
/// PYTHONPATH, PYTHONSTARTUP...) are ignored, there is no user site directory, and the
/// agent's folder is not on sys.path. `-B`: modules the code imports from /work get no
/// `__pycache__` (each run is fresh, so writing bytecode would only cost system calls). `site`
/// is kept (no `-S`): it puts dist-packages (numpy) on sys.path. Stdout stays block-buffered
/// (no `-u`): every write is a VM exit.
///
/// Hash randomization: the interpreter draws its str/bytes hash secret once, at start-up
/// (getrandom; -I keeps PYTHONHASHSEED from fixing it). It cannot change later (strings cache
/// their hashes, every dict depends on them), so all forks of one template share it: set
/// iteration order repeats across a template's forks, and a request can learn the secret and
/// craft collisions against code of another request that hashes untrusted input (its own time
/// limit bounds the damage). Each template boot draws a new secret, so bounding a template's
/// lifetime (rebuilding its snapshot periodically) bounds the sharing.
pub const PYTHON_AGENT: AgentCommand = AgentCommand {
    program: "python3",
    argv: &["python3", "-I", "-B", PYTHON_AGENT_PATH],
    cwd: crate::fs::WORK_DIR,
};

/// Where templates/node/image.json puts the Node agent.
pub const NODE_AGENT_PATH: &str = "/opt/sandfork/agent.js";
/// Where it puts the agent's preload, templates/node/worker-defaults.js.
pub const NODE_WORKER_DEFAULTS_PATH: &str = "/opt/sandfork/worker-defaults.js";

/// The Node template's agent (templates/node/agent.js). `--max-old-space-size` lifts V8's own
/// heap limit (derived from the memory the guest reports) above the guest's memory, so a
/// program that fills memory meets the VM's limit (`out_of_memory`), as a Python one does,
/// instead of V8's fatal heap-limit abort. `--disable-wasm-trap-handler`: V8 bounds-checks
/// WebAssembly memory in its code instead of reserving a 10 GiB guard region per memory (and
/// catching out-of-bounds accesses with a SIGSEGV handler), a reservation no guest's memory
/// holds: without it every `WebAssembly.Memory` fails with "could not allocate memory".
/// `--require` the Worker defaults: Workers inherit the preload, and with it a V8 code range
/// that fits in the VM (templates/node/README.md, "Memory"). Node reads no NODE_OPTIONS here:
/// the agent's environment is the VMM's (`vm::DEFAULT_ENV`), and a request's env is applied
/// after start.
/// argv[0] is the binary's path: without /proc/self/exe, Node takes process.execPath from it.
/// It boots in `/` and moves to /work itself: Node keeps every package.json it looked for, found
/// or not, and the preload looks for one in the working directory, so a boot in /work would hide
/// a request's /work/package.json (`"type": "module"`) from the main module's loader.
pub const NODE_AGENT: AgentCommand = AgentCommand {
    program: "node",
    argv: &[
        "/usr/bin/node",
        "--max-old-space-size=65536",
        "--disable-wasm-trap-handler",
        "--require",
        NODE_WORKER_DEFAULTS_PATH,
        NODE_AGENT_PATH,
    ],
    cwd: "/",
};

/// The Node template's script when a request names none: JavaScript, CommonJS unless the code
/// is an ES module (templates/node/README.md).
pub const NODE_DEFAULT_SCRIPT: &str = "main.js";

/// The script name when a request gives no argv (the daemon protocol's default).
pub const DEFAULT_SCRIPT: &str = "main.py";

/// Bounds on one request (the daemon's frames are at most 16 MiB).
pub const MAX_CODE_BYTES: usize = 4 << 20;
/// argv and env strings together (Linux's own limit is 2 MiB; 128 KiB per string).
pub const MAX_ARGS_ENV_BYTES: usize = 256 << 10;
pub const MAX_ARGS: usize = 1024;
pub const MAX_ENV_VARS: usize = 1024;
pub const MAX_FILES: usize = 1000;
/// File contents together, script included; well inside the overlay's 64 MiB, so the program
/// keeps room for its own files.
pub const MAX_FILES_BYTES: usize = 32 << 20;
pub const MAX_STDIN_BYTES: usize = 8 << 20;

/// One execution for an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRequest {
    /// Source code, run as the script /work/argv[0].
    pub code: String,
    /// sys.argv; argv[0] is the script's path relative to /work.
    pub argv: Vec<String>,
    /// Variables added to the template's environment, in order.
    pub env: Vec<(String, String)>,
    /// Files placed under /work before the code runs: (path relative to /work, contents).
    pub files: Vec<(String, Vec<u8>)>,
    /// The guest's fd 0.
    pub stdin: Vec<u8>,
    /// The network policy and limits the run is under (none: no network).
    pub network: crate::net::Grant,
}

/// Why a request was refused (before any VM ran it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRequest(pub String);

impl fmt::Display for InvalidRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid request: {}", self.0)
    }
}

impl std::error::Error for InvalidRequest {}

/// Client text quoted in a refusal is cut to this many characters: a path or a name may be
/// megabytes long, and the refusal goes back in one frame.
pub const MAX_QUOTED_CHARS: usize = 64;

/// At most `max` characters of `text`, with an ellipsis where it was cut.
pub fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

fn quoted(text: &str) -> String {
    format!("{:?}", truncate(text, MAX_QUOTED_CHARS))
}

fn invalid<T>(message: String) -> Result<T, InvalidRequest> {
    Err(InvalidRequest(message))
}

impl AgentRequest {
    /// `code` as /work/main.py with no arguments, environment, files or stdin.
    pub fn new(code: &str) -> AgentRequest {
        AgentRequest {
            code: code.to_owned(),
            argv: vec![DEFAULT_SCRIPT.to_owned()],
            env: Vec::new(),
            files: Vec::new(),
            stdin: Vec::new(),
            network: Default::default(),
        }
    }

    /// The script's path relative to /work (argv[0]); `validate` guarantees it exists.
    pub fn script(&self) -> &str {
        self.argv.first().map_or(DEFAULT_SCRIPT, String::as_str)
    }

    /// Checks the request against the bounds above and the path rules of `check_work_path`.
    /// The script and the files must not collide (same path, or one inside the other).
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        if self.code.len() > MAX_CODE_BYTES {
            return invalid(format!(
                "code is {} bytes, more than {MAX_CODE_BYTES}",
                self.code.len()
            ));
        }
        if self.argv.is_empty() || self.argv.len() > MAX_ARGS {
            return invalid(format!(
                "argv must have 1 to {MAX_ARGS} entries (argv[0] is the script's path), not {}",
                self.argv.len()
            ));
        }
        check_work_path(self.script())
            .or_else(|reason| invalid(format!("argv[0] {}: {reason}", quoted(self.script()))))?;
        if let Some(i) = self.argv.iter().position(|a| a.contains('\0')) {
            return invalid(format!("argv[{i}] contains a NUL byte"));
        }
        if self.env.len() > MAX_ENV_VARS {
            return invalid(format!(
                "{} environment variables, more than {MAX_ENV_VARS}",
                self.env.len()
            ));
        }
        let mut names = BTreeSet::new();
        for (name, value) in &self.env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return invalid(format!("environment variable {}: names must be non-empty without '=' or NUL, values without NUL", quoted(name)));
            }
            if !names.insert(name.as_str()) {
                return invalid(format!(
                    "environment variable {} is given twice",
                    quoted(name)
                ));
            }
        }
        let args_env: usize = self.argv.iter().map(|a| a.len() + 1).sum::<usize>()
            + self
                .env
                .iter()
                .map(|(n, v)| n.len() + v.len() + 2)
                .sum::<usize>();
        if args_env > MAX_ARGS_ENV_BYTES {
            return invalid(format!(
                "argv and env take {args_env} bytes, more than {MAX_ARGS_ENV_BYTES}"
            ));
        }
        if self.files.len() > MAX_FILES {
            return invalid(format!("{} files, more than {MAX_FILES}", self.files.len()));
        }
        let files_bytes = self.code.len() + self.files.iter().map(|(_, c)| c.len()).sum::<usize>();
        if files_bytes > MAX_FILES_BYTES {
            return invalid(format!(
                "files and code take {files_bytes} bytes, more than {MAX_FILES_BYTES}"
            ));
        }
        let mut paths = BTreeSet::from([self.script()]);
        for (i, (path, _)) in self.files.iter().enumerate() {
            check_work_path(path)
                .or_else(|reason| invalid(format!("files[{i}].path {}: {reason}", quoted(path))))?;
            if !paths.insert(path.as_str()) {
                let what = if path == self.script() {
                    "is the script's path (argv[0])"
                } else {
                    "is given twice"
                };
                return invalid(format!("files[{i}].path {} {what}", quoted(path)));
            }
        }
        for path in &paths {
            let mut ancestors = path.match_indices('/').map(|(i, _)| &path[..i]);
            if let Some(file) = ancestors.find(|a| paths.contains(a)) {
                return invalid(format!(
                    "{} is a file, so {} cannot be inside it",
                    quoted(file),
                    quoted(path)
                ));
            }
        }
        if self.stdin.len() > MAX_STDIN_BYTES {
            return invalid(format!(
                "stdin is {} bytes, more than {MAX_STDIN_BYTES}",
                self.stdin.len()
            ));
        }
        Ok(())
    }

    /// What the agent receives from AWAIT_REQUEST: `{"code": .., "argv": [..], "env": {..},
    /// "seed": ".."}`, `seed` being `SEED_BYTES` fresh bytes of the host's CSPRNG in hex, drawn
    /// for every message. Files and stdin do not travel in it: the VMM puts them in place itself.
    /// A session cell's message (`hand_off`) also has `"session": {"reseed": bool}`.
    pub fn agent_message(&self, hand_off: HandOff) -> std::io::Result<String> {
        let mut seed = [0u8; SEED_BYTES];
        crate::sys::fill_random(&mut seed)?;
        let seed: String = seed.iter().map(|b| format!("{b:02x}")).collect();
        let session = match hand_off {
            HandOff::Script => None,
            HandOff::Cell { reseed } => Some(SessionFlags { reseed }),
        };
        let message = AgentMessage {
            code: &self.code,
            argv: &self.argv,
            env: &self.env,
            seed: &seed,
            session,
        };
        Ok(serde_json::to_string(&message).expect("strings and string pairs always serialise"))
    }
}

/// Entropy in each agent message: every fork of a template starts with the same generator
/// states, so the agent reseeds them per request, from these bytes rather than with
/// getrandom calls (each a VM exit).
pub const SEED_BYTES: usize = 32;

#[derive(Serialize)]
struct AgentMessage<'a> {
    code: &'a str,
    argv: &'a [String],
    #[serde(serialize_with = "object_of_pairs")]
    env: &'a [(String, String)],
    seed: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<SessionFlags>,
}

#[derive(Serialize)]
struct SessionFlags {
    reseed: bool,
}

/// Name-value pairs as one JSON object, in their order.
fn object_of_pairs<S: Serializer>(
    pairs: &&[(String, String)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(pairs.iter().map(|(name, value)| (name, value)))
}

/// Why a path is not a valid path under /work (`check_work_path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvalidWorkPath {
    Empty,
    Absolute,
    Nul,
    TooLong,
    /// A doubled or trailing '/'.
    EmptyComponent,
    /// A "." or ".." component (the one found).
    DotComponent(&'static str),
    LongComponent,
}

impl fmt::Display for InvalidWorkPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidWorkPath::Empty => f.write_str("empty path"),
            InvalidWorkPath::Absolute => {
                f.write_str("absolute paths are not allowed (paths are relative to /work)")
            }
            InvalidWorkPath::Nul => f.write_str("contains a NUL byte"),
            InvalidWorkPath::TooLong => write!(
                f,
                "longer than {} bytes",
                PATH_MAX - crate::fs::WORK_DIR.len() - 2
            ),
            InvalidWorkPath::EmptyComponent => {
                f.write_str("empty path component (a doubled or trailing '/')")
            }
            InvalidWorkPath::DotComponent(component) => write!(
                f,
                "'{component}' components are not allowed (paths stay inside /work)"
            ),
            InvalidWorkPath::LongComponent => {
                write!(f, "a component is longer than {NAME_MAX} bytes")
            }
        }
    }
}

impl std::error::Error for InvalidWorkPath {}

/// A path for a file under /work: relative, non-empty, '/'-separated components that are
/// neither empty, "." nor "..", no NUL, each component at most NAME_MAX bytes and the whole
/// path (with "/work/") shorter than PATH_MAX.
pub fn check_work_path(path: &str) -> Result<(), InvalidWorkPath> {
    if path.is_empty() {
        return Err(InvalidWorkPath::Empty);
    }
    if path.starts_with('/') {
        return Err(InvalidWorkPath::Absolute);
    }
    if path.contains('\0') {
        return Err(InvalidWorkPath::Nul);
    }
    if crate::fs::WORK_DIR.len() + 1 + path.len() >= PATH_MAX {
        return Err(InvalidWorkPath::TooLong);
    }
    for component in path.split('/') {
        match component {
            "" => return Err(InvalidWorkPath::EmptyComponent),
            "." => return Err(InvalidWorkPath::DotComponent(".")),
            ".." => return Err(InvalidWorkPath::DotComponent("..")),
            c if c.len() > NAME_MAX => return Err(InvalidWorkPath::LongComponent),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_file(path: &str, bytes: usize) -> AgentRequest {
        let mut r = AgentRequest::new("print(1)");
        r.files.push((path.to_owned(), vec![b'x'; bytes]));
        r
    }

    fn refusal(r: &AgentRequest) -> String {
        r.validate().expect_err("the request should be refused").0
    }

    #[test]
    fn ordinary_requests_pass() {
        let mut r = with_file("data/in.csv", 10);
        r.files.push(("helper.py".into(), b"X = 1\n".to_vec()));
        r.argv = vec!["src/app.py".into(), "--flag".into(), "".into()];
        r.env = vec![
            ("LANG".into(), "C.UTF-8".into()),
            ("EMPTY".into(), String::new()),
        ];
        r.stdin = b"input".to_vec();
        assert_eq!(r.validate(), Ok(()));
        assert_eq!(r.script(), "src/app.py");
    }

    #[test]
    fn paths_must_stay_inside_work() {
        assert!(refusal(&with_file("../etc/x", 1)).contains("'..'"));
        assert!(refusal(&with_file("a/../../x", 1)).contains("'..'"));
        assert!(refusal(&with_file("/etc/passwd", 1)).contains("absolute"));
        assert!(refusal(&with_file("", 1)).contains("empty path"));
        assert!(refusal(&with_file("a//b", 1)).contains("empty path component"));
        assert!(refusal(&with_file("dir/", 1)).contains("empty path component"));
        assert!(refusal(&with_file("./x", 1)).contains("'.'"));
        assert!(refusal(&with_file("a\0b", 1)).contains("NUL"));
        assert!(refusal(&with_file(&"n".repeat(NAME_MAX + 1), 1)).contains("component is longer"));
        assert!(refusal(&with_file(&["d"; 2100].join("/"), 1)).contains("longer than"));
        let mut r = AgentRequest::new("");
        r.argv = vec!["../main.py".into()];
        assert!(refusal(&r).starts_with("argv[0]"));
        r.argv = vec![];
        assert!(refusal(&r).contains("1 to 1024 entries"));
    }

    /// Found by the request fuzzer: a refusal quoted a megabyte-long path whole.
    #[test]
    fn refusals_quote_at_most_a_little_of_the_client_text() {
        let long = "é".repeat(1 << 20);
        let mut r = AgentRequest::new("");
        r.argv = vec![format!("/{long}")];
        let message = refusal(&r);
        assert!(
            message.starts_with("argv[0] \"/ééé") && message.len() < 256,
            "{message}"
        );
        assert!(refusal(&with_file(&format!("../{long}"), 1)).len() < 256);
        let mut r = AgentRequest::new("");
        r.env = vec![(format!("={long}"), String::new())];
        assert!(refusal(&r).len() < 256);
    }

    #[test]
    fn files_must_not_collide_with_each_other_or_the_script() {
        assert!(refusal(&with_file("main.py", 1)).contains("script's path"));
        let mut r = with_file("a", 1);
        r.files.push(("a".into(), vec![]));
        assert!(refusal(&r).contains("given twice"));
        let mut r = with_file("a", 1);
        r.files.push(("a-b".into(), vec![]));
        r.files.push(("a/b".into(), vec![]));
        assert!(refusal(&r).contains("\"a\" is a file"));
        assert_eq!(
            refusal(&with_file("main.py/x", 1)),
            "\"main.py\" is a file, so \"main.py/x\" cannot be inside it"
        );
    }

    #[test]
    fn sizes_are_bounded() {
        assert!(refusal(&with_file("big.bin", MAX_FILES_BYTES)).contains("files and code take"));
        assert_eq!(
            with_file("fits.bin", MAX_FILES_BYTES - "print(1)".len()).validate(),
            Ok(())
        );
        let mut r = AgentRequest::new(&"#".repeat(MAX_CODE_BYTES + 1));
        assert!(refusal(&r).contains("code is"));
        r = AgentRequest::new("");
        r.stdin = vec![0; MAX_STDIN_BYTES + 1];
        assert!(refusal(&r).contains("stdin is"));
        r = AgentRequest::new("");
        r.files = (0..=MAX_FILES).map(|i| (format!("f{i}"), vec![])).collect();
        assert!(refusal(&r).contains("files, more than"));
        r = AgentRequest::new("");
        r.argv.push("a".repeat(MAX_ARGS_ENV_BYTES));
        assert!(refusal(&r).contains("argv and env take"));
    }

    #[test]
    fn environment_names_and_values_are_checked() {
        let env = |name: &str, value: &str| {
            let mut r = AgentRequest::new("");
            r.env = vec![(name.into(), value.into())];
            r
        };
        assert!(refusal(&env("", "x")).contains("non-empty"));
        assert!(refusal(&env("A=B", "x")).contains("without '='"));
        assert!(refusal(&env("A", "x\0y")).contains("NUL"));
        let mut twice = env("A", "1");
        twice.env.push(("A".into(), "2".into()));
        assert!(refusal(&twice).contains("given twice"));
    }

    #[test]
    fn output_files_are_the_regular_files_under_work_out_within_the_budget() {
        let (image, _dir) = crate::process::testing::test_image();
        let mut vfs = crate::fs::Vfs::new(image, crate::fs::DEFAULT_OVERLAY_LIMIT).unwrap();
        assert_eq!(output_files(&vfs), None, "no /work/out");
        let big = vec![7u8; (MAX_OUTPUT_FILES_BYTES - 10) as usize];
        for (path, contents) in [
            ("out/b.csv", b"1,2\n".as_slice()),
            ("out/plots/a.png", b"png".as_slice()),
            ("out/a-big.bin", big.as_slice()),
            ("out/c.txt", b"over the budget by now".as_slice()),
            ("elsewhere.txt", b"not in out".as_slice()),
        ] {
            crate::syscalls::agent::write_work_file(&mut vfs, path, contents, false).unwrap();
        }
        let files = output_files(&vfs).unwrap();
        let listed: Vec<(&str, u64, Option<usize>)> = files
            .iter()
            .map(|f| (f.path.as_str(), f.bytes, f.contents.as_ref().map(Vec::len)))
            .collect();
        assert_eq!(
            listed,
            [
                ("a-big.bin", big.len() as u64, Some(big.len())),
                ("b.csv", 4, Some(4)),
                ("c.txt", 22, None),
                ("plots/a.png", 3, Some(3)),
            ]
        );
        for i in 0..MAX_OUTPUT_FILES {
            crate::syscalls::agent::write_work_file(
                &mut vfs,
                &format!("out/many/{i:03}"),
                b"",
                false,
            )
            .unwrap();
        }
        assert_eq!(output_files(&vfs).unwrap().len(), MAX_OUTPUT_FILES);
    }

    #[test]
    fn the_agent_message_is_code_argv_and_env_as_json() {
        let mut r = with_file("f.txt", 3);
        r.code = "print(\"é\\n\")\n".into();
        r.argv.push("-x".into());
        r.env = vec![("B".into(), "2".into()), ("A".into(), "\"1\"".into())];
        r.stdin = b"not in the message".to_vec();
        let message = r.agent_message(HandOff::Script).unwrap();
        let (fixed, seed) = message.split_at(message.len() - (SEED_BYTES * 2 + 2));
        assert_eq!(
            fixed,
            r#"{"code":"print(\"é\\n\")\n","argv":["main.py","-x"],"env":{"B":"2","A":"\"1\""},"seed":""#
        );
        assert!(
            seed.ends_with("\"}")
                && seed[..SEED_BYTES * 2]
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit()),
            "{message}"
        );
        assert_ne!(
            r.agent_message(HandOff::Script).unwrap(),
            message,
            "every message has its own seed"
        );
        let parsed: serde_json::Value = serde_json::from_str(&message).unwrap();
        assert_eq!(
            parsed.get("code").and_then(serde_json::Value::as_str),
            Some(r.code.as_str())
        );
        let cell: serde_json::Value =
            serde_json::from_str(&r.agent_message(HandOff::Cell { reseed: true }).unwrap())
                .unwrap();
        assert_eq!(
            cell.get("session"),
            Some(&serde_json::json!({"reseed": true})),
            "a cell says so"
        );
    }
}
