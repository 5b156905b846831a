//! The Node template (templates/node: /usr/bin/node, its agent and the TypeScript compiler) end
//! to end: its image and snapshot are built once for the test binary, and every program runs in
//! a fresh fork of that snapshot, as the daemon serves it. JavaScript programs give the output
//! native `node` gives them; TypeScript ones what the same `typescript` package's transpile
//! gives natively; the limits end programs with their statuses; each execution draws fresh
//! randomness; and none of them makes a system call the VMM answers as unsupported.

mod common;
mod network_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::{describe, process_dir, restore_cpu, scaled, test_cpu};
use sandfork_vmm::agent::{AgentRequest, NODE_AGENT};
use sandfork_vmm::daemon::templates::Language;
use sandfork_vmm::fs::Image;
use sandfork_vmm::snapshot::{self, ForkMemory, Template};
use sandfork_vmm::status::RunStatus;
use sandfork_vmm::vm::{RunLimits, RunOutcome};

const NODE: &str = "/usr/bin/node";

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Node template's image and snapshot: the folder the KVM tier built for all its suites
/// (SANDFORK_TEST_NODE_TEMPLATE_DIR, scripts/kvm-tier.sh), else built once per test process: its
/// addon (prepare.sh), image and snapshot.
fn node() -> &'static (Arc<Image>, Template) {
    static NODE_TEMPLATE: OnceLock<(Arc<Image>, Template)> = OnceLock::new();
    NODE_TEMPLATE.get_or_init(|| {
        if let Some(dir) = std::env::var_os("SANDFORK_TEST_NODE_TEMPLATE_DIR") {
            let image = Image::open(Path::new(&dir))
                .unwrap_or_else(|e| panic!("the tier's node template: {e}"));
            let template = Template::load(Path::new(&dir), image.clone(), &NODE_AGENT)
                .unwrap_or_else(|e| panic!("the tier's node template: {e}"));
            return (image, template);
        }
        let source = repository().join("templates/node");
        let prepared = Command::new("bash")
            .arg(source.join("prepare.sh"))
            .status()
            .expect("running templates/node/prepare.sh");
        assert!(prepared.success(), "templates/node/prepare.sh failed");
        let folder = process_dir("node-template").join("node");
        sandfork_vmm::image::build(&source.join("image.json"), &folder)
            .unwrap_or_else(|e| panic!("building the Node image: {e}"));
        let image = Image::open(&folder).unwrap_or_else(|e| panic!("{e}"));
        let limits = common::boot_limits(Language::Node.default_memory_mib() << 20);
        snapshot::build(
            image.clone(),
            "node",
            &NODE_AGENT,
            &limits,
            &test_cpu,
            &folder,
        )
        .unwrap_or_else(|e| panic!("building the Node template: {e}"));
        let template = Template::load(&folder, image.clone(), &NODE_AGENT)
            .unwrap_or_else(|e| panic!("loading the Node template: {e}"));
        (image, template)
    })
}

fn template() -> &'static Template {
    &node().1
}

fn limits() -> RunLimits {
    RunLimits {
        timeout: scaled(Duration::from_secs(10)),
        mem_bytes: Language::Node.default_memory_mib() << 20,
        ..RunLimits::default()
    }
}

/// Runs `code` as /work/`script` in a fresh fork of the template; it must make no system call
/// the VMM answers as unsupported.
fn run_in_vm(
    script: &str,
    code: &str,
    customize: impl FnOnce(&mut AgentRequest, &mut RunLimits),
) -> RunOutcome {
    let outcome = run_counting_unsupported(script, code, customize);
    assert!(
        outcome.stats.unsupported.is_empty(),
        "{script} made system calls answered as unsupported: {}",
        describe(&outcome)
    );
    outcome
}

/// `run_in_vm` without the check of unsupported calls.
fn run_counting_unsupported(
    script: &str,
    code: &str,
    customize: impl FnOnce(&mut AgentRequest, &mut RunLimits),
) -> RunOutcome {
    let mut request = AgentRequest::new(code);
    request.argv = vec![script.to_owned()];
    let mut limits = limits();
    customize(&mut request, &mut limits);
    let restored = snapshot::serve_restored(
        template(),
        ForkMemory::CopyOnWrite,
        &restore_cpu,
        request,
        &limits,
    )
    .unwrap_or_else(|e| panic!("serving {script}: {e}"));
    restored.outcome
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// What native node printed, and its exit code.
struct Native {
    stdout: String,
    stderr: String,
    code: i32,
    /// Where it ran (the VM's /work).
    dir: String,
}

/// Runs `code` natively as `script` in a fresh directory of its own (the VM's /work), with
/// `stdin`, and `args` after the script. The directory is outside the repository, whose
/// package.json (`"type": "module"`) would make node load a `.js` script as an ES module.
fn run_natively(script: &str, code: &str, args: &[&str], stdin: &str) -> Native {
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("sandfork-node-native-{}-{run}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(script), code).unwrap();
    let mut child = Command::new(NODE)
        .arg(script)
        .args(args)
        .current_dir(&dir)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running /usr/bin/node");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Native {
        stdout: text(&out.stdout),
        stderr: text(&out.stderr),
        code: out.status.code().unwrap_or(-1),
        dir: dir.display().to_string(),
    }
}

/// TypeScript transpiled natively by the template's `typescript` package, as `format`.
fn transpile_natively(source: &str, format: &str) -> String {
    let compiler = repository().join("node_modules/typescript-transpiler/lib/typescript.js");
    let script = format!(
        "const ts = require({compiler:?}); const src = require('fs').readFileSync(0, 'utf8');
         const module = {format:?} === 'module' ? ts.ModuleKind.ESNext : ts.ModuleKind.CommonJS;
         process.stdout.write(ts.transpileModule(src, {{ compilerOptions: {{ target: ts.ScriptTarget.ES2022, module, esModuleInterop: true }} }}).outputText);",
        compiler = compiler.display().to_string()
    );
    let mut child = Command::new(NODE)
        .args(["-e", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("running node");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(source.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "transpiling natively failed");
    text(&out.stdout)
}

/// Runs `code` as `script` in the VM and natively; both must exit with `code` 0 and print the
/// same stdout.
fn assert_as_native(script: &str, code: &str) -> RunOutcome {
    let native = run_natively(script, code, &[], "");
    assert_eq!(
        native.code, 0,
        "native node failed on {script}: {}",
        native.stderr
    );
    let outcome = run_in_vm(script, code, |_, _| {});
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        text(&outcome.stdout),
        native.stdout,
        "{script}: {}",
        describe(&outcome)
    );
    outcome
}

const BASICS: &str = r#"
const path = require("path"), url = require("url"), util = require("util"), { EventEmitter } = require("events");
console.log(1 + 1, [1, 2, 3].map((x) => x * 2), { a: 1, b: "two" });
process.stdout.write("written\n");
console.error("to stderr");
console.log(path.join("a", "..", "b", "c.txt"), path.extname("x.tar.gz"), path.basename(__filename), require.main === module);
console.log(new URL("https://example.com/a/b?x=1#h").searchParams.get("x"), url.pathToFileURL("/tmp/x y").href);
console.log(util.format("%s=%d %j", "n", 42, { k: [1] }), util.inspect(new Map([[1, { deep: { er: [1, 2] } }]]), { depth: 0 }));
const e = new EventEmitter();
e.on("ev", (v) => console.log("event", v));
e.emit("ev", 7);
console.log(Buffer.from("héllo").toString("base64"), Buffer.from("68656c6c6f", "hex").toString(), JSON.stringify({ s: new Set([1]) }));
class Point { #x; constructor(x) { this.#x = x; } get x() { return this.#x; } }
console.log(new Point(3).x, [..."abc"].reverse().join(""), 2n ** 70n, new Intl.NumberFormat("en-US").format(1234567.891));
"#;

const FILES: &str = r#"
const fs = require("fs"), os = require("os"), path = require("path");
fs.writeFileSync("data.txt", "line 1\nline 2\n");
fs.appendFileSync("data.txt", "line 3\n");
fs.mkdirSync("sub/deeper", { recursive: true });
fs.renameSync("data.txt", "sub/deeper/moved.txt");
console.log(fs.readFileSync("sub/deeper/moved.txt", "utf8").split("\n").length, fs.statSync("sub/deeper/moved.txt").size);
console.log(fs.readdirSync(".").sort(), fs.existsSync("data.txt"));
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "sf-"));
fs.writeFileSync(path.join(scratch, "t"), Buffer.alloc(5000, 7));
console.log(fs.readFileSync(path.join(scratch, "t")).reduce((a, b) => a + b, 0));
fs.rmSync(scratch, { recursive: true });
(async () => {
  const fsp = require("fs/promises");
  await fsp.writeFile("async.json", JSON.stringify({ ok: true }));
  console.log(JSON.parse(await fsp.readFile("async.json", "utf8")), (await fsp.readdir("sub")).length);
  fs.readFile("async.json", (err, data) => console.log("callback", err, data.length));
})();
"#;

const LIBRARIES: &str = r#"
const zlib = require("zlib"), crypto = require("crypto"), { Readable, Transform, pipeline } = require("stream");
console.log(zlib.gunzipSync(zlib.gzipSync("hello ".repeat(100))).length, zlib.inflateSync(zlib.deflateSync(Buffer.from("abc"))).toString());
console.log(zlib.brotliDecompressSync(zlib.brotliCompressSync("brotli")).toString());
console.log(crypto.createHash("sha256").update("abc").digest("hex"), crypto.createHmac("sha1", "k").update("v").digest("base64"));
const cipher = crypto.createCipheriv("aes-128-cbc", Buffer.alloc(16, 1), Buffer.alloc(16, 2));
console.log(Buffer.concat([cipher.update("secret"), cipher.final()]).toString("hex"));
console.log(crypto.randomBytes(16).length, crypto.randomUUID().length, typeof crypto.getRandomValues(new Uint8Array(4))[0]);
const upper = new Transform({ transform(chunk, _enc, done) { done(null, chunk.toString().toUpperCase()); } });
const chunks = [];
upper.on("data", (c) => chunks.push(c.toString()));
pipeline(Readable.from(["a", "b", "c"]), upper, (err) => console.log("pipeline", err ?? "ok", chunks.join("")));
// Both on libuv's thread pool, one after the other: two jobs at once may end in either order.
zlib.gzip("async", (err, buf) => {
  console.log("gzip callback", err, zlib.gunzipSync(buf).toString());
  crypto.pbkdf2("pw", "salt", 1000, 16, "sha256", (err, key) => console.log("pbkdf2 on the thread pool", err, key.toString("hex")));
});
"#;

const MODULE_WITH_TOP_LEVEL_AWAIT: &str = r#"
import { setTimeout as sleep } from "node:timers/promises";
import { basename } from "node:path";
const order = [];
setTimeout(() => order.push("timeout"), 5);
setImmediate(() => order.push("immediate"));
process.nextTick(() => order.push("tick"));
queueMicrotask(() => order.push("microtask"));
await sleep(30);
let ticks = 0;
const interval = setInterval(() => ticks++, 1);
await sleep(20);
clearInterval(interval);
console.log(order.join(","), ticks > 0, typeof import.meta.url, basename(new URL(import.meta.url).pathname).endsWith(".mjs"));
"#;

/// A Worker that posts its answer back, and asks a Worker of its own for part of it.
const WORKER: &str = r#"
const { Worker, isMainThread, parentPort, workerData } = require("worker_threads");
if (isMainThread) {
  const worker = new Worker(__filename, { workerData: 21 });
  worker.on("message", (m) => console.log("worker said", m));
  worker.on("exit", (code) => console.log("worker exited", code));
} else if (workerData === 21) {
  new Worker(__filename, { workerData: 0.5 }).on("message", (half) => parentPort.postMessage(workerData * 2 + half));
} else {
  parentPort.postMessage(workerData);
}
"#;

/// Four Workers at once, each counting the primes in its quarter of a range; the main thread
/// prints their answers once all are in (in the order of the quarters: they finish in any).
const WORKERS_AT_ONCE: &str = r#"
import { Worker } from "node:worker_threads";
const code = `
const { parentPort, workerData: [from, to] } = require("node:worker_threads");
let primes = 0;
for (let n = Math.max(from, 2); n < to; n++) { let prime = true; for (let d = 2; d * d <= n; d++) if (n % d === 0) { prime = false; break; } if (prime) primes++; }
parentPort.postMessage({ from, primes });
`;
const quarters = [0, 1, 2, 3].map((i) => [i * 50000, (i + 1) * 50000]);
const answers = await Promise.all(quarters.map((range) => new Promise((resolve, reject) => {
  new Worker(code, { eval: true, workerData: range }).on("message", resolve).on("error", reject);
})));
console.log(answers.map(({ from, primes }) => `${from}: ${primes}`).join(", "), answers.reduce((sum, a) => sum + a.primes, 0));
"#;

/// Memory shared between the main thread and a Worker: the Worker adds with Atomics and wakes the
/// main thread, which waits on the same word (a futex under both), then wakes the Worker back
/// (which may find the word already set: either way it adds one to it).
const SHARED_MEMORY: &str = r#"
const { Worker } = require("worker_threads");
const shared = new Int32Array(new SharedArrayBuffer(12));
const worker = new Worker(`
const { workerData: shared } = require("worker_threads");
for (let i = 0; i < 100000; i++) Atomics.add(shared, 0, 1);
Atomics.store(shared, 1, 1);
Atomics.notify(shared, 1);
Atomics.wait(shared, 2, 0);
Atomics.add(shared, 2, 1);
`, { eval: true, workerData: shared });
console.log("main waits:", Atomics.wait(shared, 1, 0), "count", Atomics.load(shared, 0));
Atomics.store(shared, 2, 1);
Atomics.notify(shared, 2);
worker.on("exit", (code) => console.log("worker exited", code, "woken", Atomics.load(shared, 2) === 2));
"#;

/// A WebAssembly module with a memory of its own (V8 bounds-checks it in code: the agent's
/// `--disable-wasm-trap-handler`).
const WEBASSEMBLY: &str = r#"
// (module (memory (export "memory") 1) (func (export "store") (param i32 i32) local.get 0 local.get 1 i32.store)
//         (func (export "load") (param i32) (result i32) local.get 0 i32.load))
const bytes = Buffer.from("0061736d01000000010b0260027f7f0060017f017f03030200010503010001071903066d656d6f72790200057374" +
  "6f72650000046c6f616400010a13020900200020013602000b070020002802000b", "hex");
const { exports } = new WebAssembly.Instance(new WebAssembly.Module(bytes));
exports.store(8, 12345);
console.log(exports.load(8), new Int32Array(exports.memory.buffer)[2], exports.memory.buffer.byteLength);
try { exports.load(65536); } catch (error) { console.log(error.constructor.name, error.message); }
exports.memory.grow(15);
const memory = new WebAssembly.Memory({ initial: 1 });
memory.grow(99);
console.log(exports.memory.buffer.byteLength, memory.buffer.byteLength);
"#;

const ARGS_ENV_STDIN: &str = r#"
console.log(process.argv.slice(2), process.env.GREETING, require("fs").readFileSync(0, "utf8").toUpperCase());
"#;

#[test]
fn javascript_programs_print_what_native_node_prints() {
    let basics = assert_as_native("main.js", BASICS);
    assert_eq!(text(&basics.stderr), "to stderr\n");
    assert_as_native("main.js", FILES);
    assert_as_native("main.js", LIBRARIES);
    assert_as_native("main.js", WEBASSEMBLY);
    // Module syntax in a .js script: run as an ES module, as in a package of type "module".
    let module = assert_as_native("main.mjs", MODULE_WITH_TOP_LEVEL_AWAIT);
    assert_eq!(
        text(&run_in_vm("main.js", MODULE_WITH_TOP_LEVEL_AWAIT, |_, _| {}).stdout),
        text(&module.stdout)
    );
    let native = run_natively("main.js", ARGS_ENV_STDIN, &["a", "b c"], "piped in");
    let outcome = run_in_vm("main.js", ARGS_ENV_STDIN, |request, _| {
        request.argv.extend(["a".to_owned(), "b c".to_owned()]);
        request
            .env
            .push(("GREETING".to_owned(), "hello".to_owned()));
        request.stdin = b"piped in".to_vec();
    });
    assert_eq!(
        text(&outcome.stdout),
        native.stdout.replace("undefined", "hello"),
        "{}",
        describe(&outcome)
    );
}

/// The main module loads as node loads it: its id, `require.main`, `module.loaded`, a module it
/// requires through the loader, the loader's cache; and a `.js` script under a package of type
/// "module" (a file of the request's) runs as an ES module, where `require` is not defined.
#[test]
fn the_main_module_loads_as_node_loads_it() {
    assert_as_native("main.js", MAIN_AND_REQUIRED);
    let typed = |package: Option<&str>| {
        let outcome = run_in_vm("main.js", "console.log(typeof require);", |request, _| {
            if let Some(package) = package {
                request
                    .files
                    .push(("package.json".to_owned(), package.as_bytes().to_vec()));
            }
        });
        assert_eq!(
            outcome.status,
            RunStatus::Exited { code: 0 },
            "{}",
            describe(&outcome)
        );
        text(&outcome.stdout)
    };
    assert_eq!(typed(None), "function\n");
    assert_eq!(typed(Some(r#"{"type": "commonjs"}"#)), "function\n");
    assert_eq!(typed(Some(r#"{"type": "module"}"#)), "undefined\n");
}

const MAIN_AND_REQUIRED: &str = r#"
const fs = require("fs"), path = require("path");
fs.writeFileSync(path.join(__dirname, "helper.js"), "const path = require('path');\nmodule.exports = { id: path.basename(module.id), main: require.main === module, parent: path.basename(module.parent.filename) };\n");
console.log(module.id, require.main === module, process.mainModule === module, module.loaded, path.basename(require.main.filename));
console.log(require("./helper"), require("./helper.js") === require("./helper"));
console.log(Object.keys(require.cache).map((name) => path.relative(__dirname, name)).sort());
setImmediate(() => console.log("loaded after the main module ran:", module.loaded));
"#;

/// Workers run in the template's default VM: one that posts its answer back (with the help of a
/// Worker of its own), four at once (as an ES module importing the Worker class), and memory
/// shared with Atomics; each prints what native node prints. Their V8 code range is the agent's
/// default unless the options name one.
#[test]
fn workers_run_in_the_default_template() {
    assert_as_native("main.js", WORKER);
    assert_as_native("main.mjs", WORKERS_AT_ONCE);
    assert_as_native("main.js", SHARED_MEMORY);
    let code = r#"
const { Worker } = require("worker_threads");
const limit = (options) => new Promise((resolve) => new Worker("require('worker_threads').parentPort.postMessage(require('worker_threads').resourceLimits.codeRangeSizeMb)", { eval: true, ...options }).on("message", resolve));
Promise.all([limit({}), limit({ resourceLimits: { codeRangeSizeMb: 16 } }), limit({ resourceLimits: { stackSizeMb: 2 } })]).then((sizes) => console.log(sizes.join(" ")));
"#;
    let outcome = run_in_vm("main.js", code, |_, _| {});
    assert_eq!(
        (outcome.status.clone(), text(&outcome.stdout)),
        (RunStatus::Exited { code: 0 }, "32 16 32\n".to_owned()),
        "{}",
        describe(&outcome)
    );
}

/// The signals a program handles reach its listeners as natively (Node's own SIGINT and SIGTERM
/// handlers and libuv's signal pipe underneath), and one it does not handle ends it as it ends
/// natively (the exit code 128 + SIGTERM a shell shows).
#[test]
fn signals_reach_the_programs_listeners() {
    let code = r#"
const got = [];
// Signal listeners do not keep the process alive: this does until all five came.
const alive = setInterval(() => {}, 1000);
for (const name of ["SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP"]) process.on(name, (signal) => {
  got.push(signal);
  if (got.length < 5) return;
  console.log("handled", got.sort().join(","));
  clearInterval(alive);
});
for (const name of ["SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP"]) process.kill(process.pid, name);
console.log("sent");
"#;
    assert_as_native("main.js", code);
    let code = "console.log('before'); process.kill(process.pid, 'SIGTERM'); setTimeout(() => console.log('not reached'), 1000);";
    let native = run_natively("main.js", code, &[], "");
    let outcome = run_in_vm("main.js", code, |_, _| {});
    assert_eq!(
        (outcome.status.clone(), text(&outcome.stdout)),
        (RunStatus::Exited { code: 128 + 15 }, native.stdout),
        "{}",
        describe(&outcome)
    );
}

/// libuv uses io_uring only when asked (UV_USE_IO_URING=1, read when node starts, so a request's
/// env cannot ask): then io_uring_setup is answered ENOSYS, as by a kernel without io_uring, and
/// libuv's file operations fall back to its thread pool, with native node's results. Node runs
/// here from its first instruction in a fresh VM (the template's agent started without it).
#[test]
fn without_io_uring_libuv_falls_back() {
    let code = r#"
const fs = require("fs"), fsp = require("fs/promises");
(async () => {
  await fsp.writeFile("/tmp/uring.txt", "through libuv\n".repeat(1000));
  const text = await fsp.readFile("/tmp/uring.txt", "utf8");
  const handle = await fsp.open("/tmp/uring.txt", "r");
  const { bytesRead, buffer } = await handle.read(Buffer.alloc(7), 0, 7, 8);
  await handle.close();
  fs.stat("/tmp/uring.txt", (error, stats) => console.log(text.length, bytesRead, buffer.toString(), error, stats.size));
})();
"#;
    let native = run_natively("main.js", code, &[], "");
    let mut request = common::request(NODE, &["-e", code]);
    request.envp.push("UV_USE_IO_URING=1".to_owned());
    request.mem_bytes = Language::Node.default_memory_mib() << 20;
    let outcome = common::run(&node().0, &request);
    assert_eq!(
        (outcome.status.clone(), text(&outcome.stdout)),
        (RunStatus::Exited { code: 0 }, native.stdout),
        "{}",
        describe(&outcome)
    );
    let refused: Vec<_> = outcome
        .stats
        .unsupported
        .iter()
        .filter_map(|c| c.name)
        .collect();
    // rseq: glibc's probe at start-up (table.rs).
    assert!(
        refused.contains(&"io_uring_setup")
            && refused
                .iter()
                .all(|name| ["io_uring_setup", "rseq"].contains(name)),
        "{}",
        describe(&outcome)
    );
}

/// Exit codes and what reaches stderr, as natively: process.exit, process.exitCode, an uncaught
/// exception and an unhandled rejection (exit 1 with the stack).
#[test]
fn exits_and_uncaught_errors_are_as_native() {
    for (code, exit, stderr_has) in [
        ("console.log('before'); process.exit(3); console.log('after');", 3, ""),
        ("process.exitCode = 4; setTimeout(() => console.log('later'), 5);", 4, ""),
        ("process.on('exit', (c) => { console.log('exit listener', c); process.exitCode = 6; }); console.log('body');", 6, ""),
        ("console.log('before');\nfunction boom() { throw new Error('boom'); }\nboom();\n", 1, "Error: boom\n    at boom (/work/main.js:2:"),
        ("Promise.reject(new TypeError('rejected late'));", 1, "TypeError: rejected late"),
        ("let x = ;", 1, "SyntaxError: Unexpected token ';'"),
    ] {
        let native = run_natively("main.js", code, &[], "");
        let outcome = run_in_vm("main.js", code, |_, _| {});
        assert_eq!((outcome.status.clone(), text(&outcome.stdout)), (RunStatus::Exited { code: exit }, native.stdout.clone()), "{code}: {}", describe(&outcome));
        assert_eq!(native.code, exit, "{code} natively");
        let stderr = text(&outcome.stderr);
        assert!(stderr.contains(stderr_has), "{code}: {stderr}");
        // The same first lines as natively (file and line, the line, the caret, the error), the
        // directory aside.
        let first = |s: &str| s.lines().take(5).collect::<Vec<_>>().join("\n");
        assert_eq!(first(&stderr), first(&native.stderr.replace(&native.dir, "/work")), "{code}");
    }
}

const TYPESCRIPT_COMMONJS: &str = r#"
import * as path from "node:path";
import { createHash } from "node:crypto";
interface Shape { kind: "circle" | "square"; size: number }
enum Color { Red = 1, Green, Blue }
type Area = (s: Shape) => number;
const area: Area = ({ kind, size }) => (kind === "circle" ? Math.round(Math.PI * size ** 2) : size * size);
abstract class Named<T> { constructor(protected readonly value: T) {} abstract name(): string }
class Box extends Named<number> { name(): string { return `box ${this.value}`; } }
function first<T>(items: readonly T[]): T | undefined { return items[0]; }
const shapes: Shape[] = [{ kind: "circle", size: 2 }, { kind: "square", size: 3 }];
console.log(shapes.map(area), Color.Green, Color[3], new Box(7).name(), first(["a", "b"]), path.posix.join("x", "y"));
console.log(createHash("md5").update("ts").digest("hex"), typeof require, (shapes[0] satisfies Shape).kind);
const typeError: number = "not a number" as unknown as number;
console.log("type errors are not fatal:", typeError);
"#;

const TYPESCRIPT_MODULE: &str = r#"
import { setTimeout as sleep } from "node:timers/promises";
const wait = async (ms: number): Promise<string> => { await sleep(ms); return `waited ${ms}`; };
console.log(await wait(5), [1, 2, 3].reduce((a: number, b: number) => a + b, 0));
"#;

#[test]
fn typescript_runs_as_its_native_transpile_runs() {
    for (source, format) in [
        (TYPESCRIPT_COMMONJS, "commonjs"),
        (TYPESCRIPT_MODULE, "module"),
    ] {
        let js = transpile_natively(source, format);
        let native = run_natively(
            if format == "module" {
                "main.mjs"
            } else {
                "main.js"
            },
            &js,
            &[],
            "",
        );
        assert_eq!(native.code, 0, "{}", native.stderr);
        let outcome = run_in_vm("main.ts", source, |_, _| {});
        assert_eq!(
            outcome.status,
            RunStatus::Exited { code: 0 },
            "{}",
            describe(&outcome)
        );
        assert_eq!(
            text(&outcome.stdout),
            native.stdout,
            "{}",
            describe(&outcome)
        );
    }
    // A syntax error is reported as Node reports one: file and line, the line, a caret, exit 1.
    let outcome = run_in_vm(
        "main.ts",
        "const ok: number = 1;\nlet broken = ;\n",
        |_, _| {},
    );
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 1 },
        "{}",
        describe(&outcome)
    );
    assert!(text(&outcome.stderr).starts_with("/work/main.ts:2\nlet broken = ;\n             ^\n\nSyntaxError: Expression expected.\n"), "{}", describe(&outcome));
}

#[test]
fn the_limits_end_programs_with_their_statuses() {
    let outcome = run_in_vm("main.js", "while (true) {}", |_, limits| {
        limits.timeout = Duration::from_millis(300)
    });
    assert!(
        matches!(outcome.status, RunStatus::Timeout { .. }),
        "{}",
        describe(&outcome)
    );
    // Filling the memory takes seconds on a busy host: the time limit stays out of the way.
    let outcome = run_in_vm(
        "main.js",
        "const grow = []; for (;;) grow.push(new Array(100000).fill(1.5));",
        |_, limits| limits.timeout = scaled(Duration::from_secs(120)),
    );
    assert!(
        matches!(outcome.status, RunStatus::OutOfMemory { .. }),
        "{}",
        describe(&outcome)
    );
    let outcome = run_in_vm(
        "main.js",
        "for (;;) process.stdout.write('x'.repeat(65536));",
        |_, limits| {
            limits.output_cap = 1 << 20;
            limits.timeout = scaled(Duration::from_secs(120));
        },
    );
    assert!(
        matches!(outcome.status, RunStatus::OutputLimit { .. }),
        "{}",
        describe(&outcome)
    );
}

#[test]
fn every_execution_draws_fresh_randomness() {
    let code = "const c = require('crypto'); console.log(c.randomBytes(8).toString('hex'), Math.random(), c.randomUUID(), c.randomInt(1e9));";
    let runs: Vec<String> = (0..2)
        .map(|_| text(&run_in_vm("main.js", code, |_, _| {}).stdout))
        .collect();
    let fields: Vec<Vec<&str>> = runs
        .iter()
        .map(|r| r.split_whitespace().collect())
        .collect();
    assert!(fields.iter().all(|f| f.len() == 4), "{runs:?}");
    for (i, (first, second)) in fields[0].iter().zip(&fields[1]).enumerate() {
        assert_ne!(first, second, "field {i} repeats across forks: {runs:?}");
    }
}

/// No network beyond the VM, no other process, no host files, no writes outside /work and /tmp
/// (the image is read-only): each refusal reaches the program
/// as an error it can handle, and the program goes on to exit normally; a loopback server and its
/// client inside the VM talk to each other (the VM's own socket namespace). The only calls
/// counted as unsupported are the two process-creating clones of child_process (ENOSYS by
/// design: the table).
#[test]
fn network_processes_and_host_files_fail_cleanly() {
    let code = r#"
const net = require("net"), http = require("http"), dns = require("dns"), cp = require("child_process"), fs = require("fs");
const report = (what) => (error) => console.log(what, error ? error.code : "no error");
dns.lookup("example.com", report("dns"));
net.connect(80, "127.0.0.1").on("error", report("connect"));
net.connect(80, "192.0.2.1").on("error", report("remote"));
http.get("http://127.0.0.1:1/").on("error", report("http"));
const server = net.createServer((socket) => socket.end("pong")).listen(0, "127.0.0.1", () => {
  const client = net.connect(server.address().port, "127.0.0.1").on("data", (data) => {
    console.log("loopback", data.toString());
    client.destroy();
    server.close(() => console.log("closed"));
  });
});
for (const file of ["/etc/passwd", "/proc/self/mem", "/root", "/home"]) {
  try { fs.readFileSync(file); console.log(file, "readable"); } catch (error) { console.log(file, error.code); }
}
for (const file of ["/usr/bin/node", "/opt/sandfork/agent.js", "/written"]) {
  try { fs.appendFileSync(file, "x"); console.log(`write:${file}`, "no error"); } catch (error) { console.log(`write:${file}`, error.code); }
}
console.log(fs.readdirSync("/").sort().join(" "));
const environ = fs.readFileSync("/proc/self/environ", "utf8").split("\0").filter(Boolean).sort();
console.log("environ", JSON.stringify(environ) === JSON.stringify(Object.entries(process.env).map(([k, v]) => `${k}=${v}`).sort()));
"#;
    let outcome = run_counting_unsupported("main.js", code, |_, _| {});
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    let unsupported: Vec<_> = outcome
        .stats
        .unsupported
        .iter()
        .map(|c| (c.name, c.count))
        .collect();
    assert_eq!(unsupported, vec![], "{}", describe(&outcome));
    let stdout = text(&outcome.stdout);
    for what in [
        "dns",
        "connect",
        "remote",
        "http",
        "/etc/passwd",
        "/proc/self/mem",
        "/root",
        "/home",
        "write:/usr/bin/node",
        "write:/opt/sandfork/agent.js",
        "write:/written",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.split(' ').next() == Some(what))
            .unwrap_or_else(|| panic!("no line for {what}: {stdout}"));
        assert!(
            !line.ends_with("no error") && !line.ends_with("readable"),
            "{line}"
        );
    }
    assert!(
        stdout.lines().any(|l| l == "loopback pong") && stdout.lines().any(|l| l == "closed"),
        "an in-VM connection, and its server closed: {stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l == "bin dev etc lib lib64 opt proc tmp usr work"),
        "only the image, the writable folders and the VMM's /dev and /proc: {stdout}"
    );
    assert!(
        stdout.lines().any(|l| l == "environ true"),
        "/proc/self/environ is the program's own environment: {stdout}"
    );
}

#[test]
fn child_process_runs_commands_through_the_shell() {
    let code = r#"
const cp = require("child_process");
console.log(cp.execSync("echo hi; echo $((6*7))").toString().trim().split("\n").join(" "));
const ls = cp.spawnSync("ls", ["/usr/bin/node"]);
console.log("spawnSync", ls.status, ls.stdout.toString().trim());
cp.exec("exit 3", (error) => {
  console.log("exec", error.code);
  const child = cp.spawn("cat");
  let data = "";
  child.stdout.on("data", (chunk) => (data += chunk));
  child.on("close", (code) => console.log("spawn", code, data.length));
  child.stdin.end("x".repeat(100000));
});
"#;
    let outcome = run_counting_unsupported("main.js", code, |_, _| {});
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        text(&outcome.stdout),
        "hi 42\nspawnSync 0 /usr/bin/node\nexec 3\nspawn 0 100000\n",
        "{}",
        describe(&outcome)
    );
}

/// Node's fetch (GET by name, POST) and its http module reach a host the policy allows, over
/// the VMM's carried sockets and resolver; a host it does not name is refused.
#[test]
fn fetch_and_http_reach_an_allowed_host() {
    use sandfork_vmm::net::{self, Allowlist, Grant, HostConfig, Limits, Policy};
    let test_net = network_support::TestNet::new();
    net::configure(HostConfig {
        upstream: Some(format!("{}:53", test_net.host).parse().unwrap()),
        own_addresses: Vec::new(),
    });
    let code = format!(
        "const http = require('http');\n\
         (async () => {{\n\
           const got = await fetch('http://web.test:8080/index.html');\n\
           process.stdout.write(await got.text());\n\
           const posted = await fetch('http://web.test:8080/echo', {{ method: 'POST', body: 'posted=1' }});\n\
           console.log(posted.status, await posted.text());\n\
           await new Promise((done) => http.get('http://{host}:8080/index.html', (res) => {{\n\
             res.on('data', (d) => process.stdout.write(d)); res.on('end', done); }}));\n\
           await fetch('http://{host}:8081/').catch((e) => console.log(e.cause.code));\n\
         }})();\n",
        host = test_net.host
    );
    let rules = vec![
        "web.test:8080".to_owned(),
        format!("{}/32:8080", test_net.host),
    ];
    let outcome = run_in_vm("main.js", &code, |request, limits| {
        request.network = Grant {
            policy: Policy::new(vec![Allowlist::parse(&rules).unwrap()]),
            limits: Limits::default(),
        };
        limits.timeout = scaled(Duration::from_secs(20));
    });
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        text(&outcome.stdout),
        "hello-from-netns\n200 posted=1\nhello-from-netns\nEACCES\n"
    );
    assert_eq!(outcome.stats.network.refused, 1);
    assert!(outcome.stats.network.connections >= 3);
}
