//! The reset isolation check: one execution leaves a secret everywhere a program can, the next
//! on the same VM looks for it everywhere a program can look. A reset VM (`pool`) must be
//! indistinguishable from a fresh fork, so the search must find nothing, see the same fds,
//! signal dispositions and FS base as on a fresh fork, and draw other random numbers. Used by
//! `sandfork-vmm bench exec` (which prints whether it held) and by the KVM test tier.
//!
//! The programs are Python (the template the check runs on). Machine code (x86-64, assembled
//! with GNU as from the listings beside it) reaches what Python cannot: every general-purpose
//! and ymm register, the stack below rsp and the FS base, after which it ends the program with
//! exit_group, so the registers still hold the secret when the execution ends.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::Value;

use crate::agent::{AgentRequest, DEFAULT_SCRIPT};
use crate::daemon::executor::{ExecuteError, ExecuteRequest, ExecutionLimits, Executor, VmOrigin};
use crate::process::OutputSink;
use crate::status::RunStatus;

/// The secret's marker. Both programs spell it in two pieces, so that their own code never
/// holds it; the secret is the marker followed by a 16-hex-digit token only the host knows.
const MARKER: &str = "SFLEAK";

/// Finds every secret in the guest: all of the user memory it can reach (`SF_REACHABLE`, the
/// ranges of guest memory in a KVM memory slot when the search starts: reading anything else
/// faults, and what the search maps later is handed to it zeroed), the files under /tmp and
/// /work, the environment and argv; reports the open fds, the dispositions of the signals the
/// plant changes, the FS base, the registers as found on entry, and two random draws. Prints
/// one JSON object.
pub const SEARCH: &str = r#"
import ctypes, json, mmap, os, random, re, signal, sys
def registers_on_entry():
    # vmovdqu [rdi+32n], ymmN (n < 16); mov [rdi+512..], rbx rbp r12-r15 rsi rdx rcx r8-r11; ret
    code = bytes.fromhex(
        "c5fe7f07c5fe7f4f20c5fe7f5740c5fe7f5f60c5fe7fa780000000c5fe7fafa0000000c5fe7fb7c0000000"
        "c5fe7fbfe0000000c57e7f8700010000c57e7f8f20010000c57e7f9740010000c57e7f9f60010000c57e7fa7"
        "80010000c57e7fafa0010000c57e7fb7c0010000c57e7fbfe001000048899f000200004889af080200004c89"
        "a7100200004c89af180200004c89b7200200004c89bf280200004889b7300200004889973802000048898f40"
        "0200004c8987480200004c898f500200004c8997580200004c899f60020000c3")
    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    out = ctypes.create_string_buffer(640)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ctypes.addressof(ctypes.c_char.from_buffer(page)))(ctypes.addressof(out))
    return out.raw
regs = registers_on_entry()
marker = b"SFLE" + b"AK"
pattern = re.compile(b"SFLE" b"AK([0-9a-f]{16})")
found = set()
step = 1 << 20
for span in os.environ["SF_REACHABLE"].split(","):
    start, end = (int(x, 16) for x in span.split("-"))
    for addr in range(max(start, 1 << 20), end, step):
        found.update(m.group(1).decode() for m in pattern.finditer(ctypes.string_at(addr, min(step + 64, end - addr))))
files = []
for d in ("/tmp", "/work"):
    for root, _, names in os.walk(d):
        for name in names:
            path = os.path.join(root, name)
            files.append(path)
            with open(path, "rb") as f:
                found.update(m.group(1).decode() for m in pattern.finditer(f.read()))
text = (repr(dict(os.environ)) + repr(sys.argv)).encode()
found.update(m.group(1).decode() for m in pattern.finditer(text))
fds = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        pass
fs = ctypes.c_ulong()
ctypes.CDLL(None).syscall(158, 0x1003, ctypes.byref(fs))
print(json.dumps({
    "found": sorted(found),
    "registers_hold_marker": marker in regs,
    "files": sorted(f for f in files if not f.startswith("/work/main.py")),
    "fds": fds,
    "signals": [str(signal.getsignal(s)) for s in (signal.SIGUSR1, signal.SIGTERM)],
    "fs_base": fs.value,
    "random": [random.random(), os.urandom(8).hex()],
}))
"#;

/// The start of the plant: it plants `SF_TOKEN`'s secret in Python objects, malloc'd memory (brk and mmap sizes), an
/// anonymous mapping, files in /tmp and /work, the environment, an open fd 100, two signal
/// dispositions; prints its random draws and the FS base it will set. `PLANT_EXIT` then has
/// machine code fill every ymm and general-purpose register and 8 KiB below rsp with it, point
/// FS at it and call exit_group(0). argv carries the secret too (the request's own).
const PLANT_SETUP: &str = r#"
import ctypes, json, mmap, os, random, signal, sys
secret = ("SFLE" + "AK" + os.environ["SF_TOKEN"]).encode()
assert sys.argv[1].endswith(os.environ["SF_TOKEN"])
keep = [secret * 1000, bytearray(secret * 100000)]
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
for size in (64, 4096, 1 << 20):
    chunk = secret * (size // len(secret) + 1)
    p = libc.malloc(size)
    ctypes.memmove(p, chunk, size)
anon = mmap.mmap(-1, 1 << 20)
anon.write(secret * ((1 << 20) // len(secret)))
for d in ("/tmp", "/work"):
    with open(d + "/secret.txt", "wb") as f:
        f.write(secret)
os.environ["SF_SECRET"] = secret.decode()
os.dup2(os.open("/tmp/secret.txt", os.O_RDONLY), 100)
signal.signal(signal.SIGUSR1, lambda *_: None)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
words = ctypes.create_string_buffer((secret * 3)[:64], 64)
print(json.dumps({"random": [random.random(), os.urandom(8).hex()], "fs_base": ctypes.addressof(words)}), flush=True)
"#;

/// The end of the plant, after a search of its own (which must find the secret: that shows the
/// search can).
const PLANT_EXIT: &str = r#"
sys.stdout.flush()
# vmovdqu ymmN, [rdi] (n < 16); mov r15, rdi; rep stosq [rsp-8192] x1024 of [r15];
# arch_prctl(ARCH_SET_FS, r15); every GPR but rsp = [r15]; exit_group(0)
code = bytes.fromhex(
    "c5fe6f07c5fe6f0fc5fe6f17c5fe6f1fc5fe6f27c5fe6f2fc5fe6f37c5fe6f3fc57e6f07c57e6f0fc57e6f17"
    "c57e6f1fc57e6f27c57e6f2fc57e6f37c57e6f3f4989ff498b07488dbc2400e0ffff48c7c100040000f348ab"
    "b89e000000bf021000004c89fe0f05498b074889c34889c14889c24889c64889c54989c04989c14989c24989"
    "c34989c44989c54989c64989c7b8e700000031ff0f05")
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
ctypes.CFUNCTYPE(None, ctypes.c_void_p)(ctypes.addressof(ctypes.c_char.from_buffer(page)))(ctypes.addressof(words))
"#;

/// The plant's code: setup, a search of its own, the exit.
pub fn plant_code() -> String {
    format!("{PLANT_SETUP}{SEARCH}{PLANT_EXIT}")
}

/// The environment and argv of the plant: the token rides in both.
pub fn plant_env_argv(
    token: &str,
    reachable: &[(u64, u64)],
) -> (Vec<(String, String)>, Vec<String>) {
    let mut env = search_env(reachable);
    env.push(("SF_TOKEN".to_owned(), token.to_owned()));
    (
        env,
        vec![DEFAULT_SCRIPT.to_owned(), format!("{MARKER}{token}")],
    )
}

/// The environment of a search of a guest that can reach `reachable`.
pub fn search_env(reachable: &[(u64, u64)]) -> Vec<(String, String)> {
    let spans: Vec<String> = reachable
        .iter()
        .map(|(start, end)| format!("{start:x}-{end:x}"))
        .collect();
    vec![("SF_REACHABLE".to_owned(), spans.join(","))]
}

/// Why the isolation check failed: it could not be run, or a VM after the plant kept something
/// a fresh fork does not have.
#[derive(Debug)]
pub enum IsolationError {
    /// Drawing the secret token.
    Token(std::io::Error),
    /// One of the executions ("search", "plant") was not run.
    Execute { what: String, error: ExecuteError },
    /// One of them ran but did not exit 0.
    Exit {
        what: String,
        status: RunStatus,
        stderr: String,
    },
    /// A program's output is not what the check reads (a missing line, not JSON).
    Output(String),
    /// The plant's own search did not find the secret: the check would prove nothing.
    PlantUnseen,
    /// What the search after the plant found that differs from a fresh fork: the leaks.
    Leaks(Vec<String>),
}

impl fmt::Display for IsolationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IsolationError::Token(e) => write!(f, "drawing a token: {e}"),
            IsolationError::Execute { what, error } => write!(f, "the {what}: {error}"),
            IsolationError::Exit {
                what,
                status,
                stderr,
            } => write!(f, "the {what} ended with {status}: {stderr}"),
            IsolationError::Output(message) => f.write_str(message),
            IsolationError::PlantUnseen => f.write_str(
                "the plant's own search did not find the secret: the check would prove nothing",
            ),
            IsolationError::Leaks(leaks) => f.write_str(&leaks.join("; ")),
        }
    }
}

impl std::error::Error for IsolationError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            IsolationError::Token(e) => Some(e),
            _ => None,
        }
    }
}

/// A fresh 16-hex-digit token from the host's CSPRNG.
pub fn new_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 8];
    crate::sys::fill_random(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Line `index` of a program's output, as JSON.
fn parse(what: &str, stdout: &[u8], index: usize) -> Result<Value, IsolationError> {
    let line = stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .nth(index)
        .ok_or_else(|| {
            IsolationError::Output(format!(
                "the {what} printed no line {index}: {}",
                String::from_utf8_lossy(stdout)
            ))
        })?;
    serde_json::from_slice(line).map_err(|e| {
        IsolationError::Output(format!(
            "the {what}'s output is not JSON ({e}): {}",
            String::from_utf8_lossy(stdout)
        ))
    })
}

fn strings(value: Option<&Value>) -> BTreeSet<String> {
    value
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
        .collect()
}

/// Compares a search run after the plant on the same VM (`after`) with one on a fresh fork
/// (`control`): what differs is named in the error.
pub fn check(
    token: &str,
    control: &[u8],
    plant: &[u8],
    after: &[u8],
) -> Result<(), IsolationError> {
    let (control, planted, plant) = (
        parse("control search", control, 0)?,
        parse("plant", plant, 1)?,
        parse("plant", plant, 0)?,
    );
    let after = parse("search after the plant", after, 0)?;
    if !strings(planted.get("found")).contains(token) {
        return Err(IsolationError::PlantUnseen);
    }
    let mut leaks = Vec::new();
    if strings(after.get("found")).contains(token) {
        leaks.push("the secret is still in memory, a file, the environment or argv".to_owned());
    }
    if after.get("registers_hold_marker").and_then(Value::as_bool) != Some(false) {
        leaks.push("a register still holds the secret".to_owned());
    }
    for key in ["files", "fds", "signals", "fs_base"] {
        if after.get(key) != control.get(key) {
            let show = |v: &Value| v.get(key).map_or("none".to_owned(), Value::to_string);
            leaks.push(format!(
                "{key}: {} after the plant, {} on a fresh fork",
                show(&after),
                show(&control)
            ));
        }
    }
    if after.get("fs_base") == plant.get("fs_base") {
        leaks.push("the FS base is the one the plant set".to_owned());
    }
    let draws = |v: &Value| strings(v.get("random"));
    if !draws(&plant).is_disjoint(&draws(&after)) || !draws(&control).is_disjoint(&draws(&after)) {
        leaks.push("a random draw repeated".to_owned());
    }
    if leaks.is_empty() {
        Ok(())
    } else {
        Err(IsolationError::Leaks(leaks))
    }
}

/// Runs the check on `executor`: a control search, the plant, a search after it, each an
/// execution of `template` with `limits`; `reachable` is the guest memory a VM of the template
/// reaches at its start (`kvm::reachable_memory` of `snapshot::Template::handed_out`). On a
/// pool of one VM the last two run on that VM after resets; without a pool, on fresh forks.
/// Returns where each execution's VM came from, for the caller to confirm which case it checked.
pub fn run(
    executor: &dyn Executor,
    template: &str,
    limits: ExecutionLimits,
    reachable: &[(u64, u64)],
) -> Result<[VmOrigin; 3], IsolationError> {
    let token = new_token().map_err(IsolationError::Token)?;
    let execute = |what: &str, code: String, env: Vec<(String, String)>, argv: Vec<String>| {
        let agent_request = AgentRequest {
            code,
            argv,
            env,
            files: Vec::new(),
            stdin: Vec::new(),
            network: Default::default(),
        };
        let execution = executor
            .execute(
                ExecuteRequest {
                    template: template.to_owned(),
                    agent_request,
                    limits,
                    stream: false,
                    defaulted: Default::default(),
                },
                OutputSink::none(),
            )
            .map_err(|error| IsolationError::Execute {
                what: what.to_owned(),
                error,
            })?;
        if execution.status != (RunStatus::Exited { code: 0 }) {
            return Err(IsolationError::Exit {
                what: what.to_owned(),
                status: execution.status,
                stderr: String::from_utf8_lossy(&execution.stderr).into_owned(),
            });
        }
        Ok(execution)
    };
    let search = || {
        execute(
            "search",
            SEARCH.to_owned(),
            search_env(reachable),
            vec![DEFAULT_SCRIPT.to_owned()],
        )
    };
    let control = search()?;
    let (env, argv) = plant_env_argv(&token, reachable);
    let plant = execute("plant", plant_code(), env, argv)?;
    let after = search()?;
    check(&token, &control.stdout, &plant.stdout, &after.stdout)?;
    Ok([control.vm, plant.vm, after.vm])
}
