// Sandfork's in-VM agent for the Node template.
//
// The VMM boots this file as the guest program (`node --max-old-space-size=65536
// --disable-wasm-trap-handler --require /opt/sandfork/worker-defaults.js /opt/sandfork/agent.js`:
// NODE_AGENT in native-vmm/src/agent.rs; worker-defaults.js gives Workers a code range that fits).
// It loads what user code commonly needs, the TypeScript compiler among it, then makes
// Sandfork's private system call AWAIT_REQUEST (through its native addon, sandfork_native.c:
// JavaScript cannot make system calls): that call is the template's READY POINT. A template build stops the VM inside it and
// snapshots it there; each request answers it with the code, argv and env, the VMM having placed
// the script at /work/<argv[0]>, the request's files and stdin. Everything before that call is
// paid once per template, everything after it once per request.
//
// After the hand-off the agent runs the script as `node /work/<argv[0]>` would: as the main
// module (CommonJS or an ES module, see `formatOf`), with Node's own handling of uncaught
// exceptions and unhandled rejections (the stack on stderr, exit code 1), process.exit and
// process.exitCode, and the process ends when the event loop is empty. TypeScript (`.ts`,
// `.mts`, `.cts`) is transpiled first (transpile-only: type errors are not reported, syntax
// errors are, as Node reports its own).
"use strict";

const Module = require("node:module");
const fs = require("node:fs");
const path = require("node:path");
const v8 = require("node:v8");
const vm = require("node:vm");

const OPT = "/opt/sandfork";
const native = require(`${OPT}/sandfork_native.node`);
const ts = require(`${OPT}/typescript.js`);

// Warm-up: the built-in modules user code commonly loads are loaded before the ready point,
// where they cost nothing per request.
for (const name of [
  "assert",
  "buffer",
  "child_process",
  "crypto",
  "dns",
  "events",
  "fs/promises",
  "http",
  "https",
  "net",
  "os",
  "querystring",
  "readline",
  "stream",
  "stream/promises",
  "string_decoder",
  "timers",
  "timers/promises",
  "url",
  "util",
  "worker_threads",
  "zlib",
]) {
  require(name);
}
// The Worker defaults (a V8 code range that fits: worker-defaults.js), now that the built-ins are in.
require(`${OPT}/worker-defaults.js`).applyWorkerDefaults();

// process.stdout and process.stderr are made on first use (a stream over the fd, with its
// handle and state): made here, once. Node's CommonJS loader compiles its code lazily too: a
// module compiled here puts that in the template.
void process.stdout;
void process.stderr;
new Module(`${OPT}/warm.js`)._compile(
  "module.exports = require('node:path').join('a', 'b');",
  `${OPT}/warm.js`,
);

// The transpiler's settings: one output per module format (CommonJS unless the code needs an
// ES module: README.md).
const COMPILER_OPTIONS = {
  commonjs: {
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.CommonJS,
    esModuleInterop: true,
  },
  module: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext, esModuleInterop: true },
};

/** TypeScript to JavaScript; `diagnostics` are the syntax errors (types are not checked). */
function transpile(source, fileName, format) {
  const output = ts.transpileModule(source, {
    fileName,
    reportDiagnostics: true,
    compilerOptions: COMPILER_OPTIONS[format],
  });
  return { js: output.outputText, diagnostics: output.diagnostics ?? [] };
}

// The compiler's own code is compiled lazily by V8, on first use: transpiling once here, with
// the syntax requests use most, puts that work in the template too.
const WARM_TYPESCRIPT = `
import { readFileSync } from "node:fs";
export interface Shape { kind: "circle" | "square"; size: number; tags?: readonly string[] }
type Area<T extends Shape> = (shape: T) => number;
enum Color { Red = 1, Green, Blue }
export abstract class Base<T> { protected constructor(public readonly value: T, private seen = new Map<string, T>()) {} abstract describe(): string }
class Item extends Base<number> { constructor(v: number) { super(v); } describe(): string { return \`item \${this.value as number}\`; } }
const area: Area<Shape> = ({ kind, size }) => kind === "circle" ? Math.PI * size ** 2 : size * size;
export async function main(...args: string[]): Promise<void> {
  for await (const x of [Promise.resolve(1)]) { console.log(x satisfies number, args?.[0] ?? "", Color.Red, area({ kind: "square", size: 2 })); }
  try { readFileSync("/nonexistent"); } catch (e: unknown) { if (e instanceof Error) throw e; } finally { new Item(1).describe(); }
}
`;
for (const format of ["commonjs", "module"]) transpile(WARM_TYPESCRIPT, "warm.ts", format);

// Sandfork's private system call returns -E2BIG when the request does not fit the buffer; the
// size it needs is then at the buffer's start (native-vmm/src/agent.rs).
const E2BIG = 7;
const FIRST_BUFFER_BYTES = 64 * 1024;
const WORK_DIR = "/work";
const TYPESCRIPT = /\.[cm]?ts$/;

/** Blocks in AWAIT_REQUEST (the ready point) and returns the request. */
function awaitRequest() {
  let size = FIRST_BUFFER_BYTES;
  for (;;) {
    const buffer = Buffer.alloc(size);
    const length = native.awaitRequest(buffer);
    if (length >= 0) return JSON.parse(buffer.toString("utf8", 0, length));
    const needed = Number(buffer.readBigUInt64LE(0));
    if (length !== -E2BIG || needed <= size)
      throw new Error(`AWAIT_REQUEST failed: errno ${-length}`);
    size = needed;
  }
}

/**
 * Math.random from `seed` (xoshiro128**, 53 bits a draw). V8's own generator was seeded when the
 * template booted, so every fork would draw the same numbers, and it cannot be reseeded.
 */
function seededRandom(seed) {
  let [a, b, c, d] = [0, 4, 8, 12].map((offset) => seed.readUInt32LE(offset));
  if ((a | b | c | d) === 0) a = 1;
  const rotl = (x, k) => (x << k) | (x >>> (32 - k));
  const next = () => {
    const result = Math.imul(rotl(Math.imul(b, 5), 7), 9) >>> 0;
    const t = b << 9;
    c ^= a;
    d ^= b;
    b ^= c;
    a ^= d;
    c ^= t;
    d = rotl(d, 11);
    return result;
  };
  return function random() {
    return (next() * 2 ** 21 + (next() >>> 11)) / 2 ** 53;
  };
}

// The SyntaxError messages V8 gives module-only syntax (import/export, import.meta, top-level
// await) when it compiles code as CommonJS: Node's own rule for detecting an ES module.
const MODULE_SYNTAX = [
  "Cannot use import statement outside a module",
  "Unexpected token 'export'",
  "Cannot use 'import.meta' outside a module",
  "await is only valid in async functions and the top level bodies of modules",
];

/**
 * Whether `js` needs an ES module: it does not compile as CommonJS because of module syntax,
 * or because of a top-level await (which V8 reports in several ways, "missing ) after argument
 * list" among them: such code compiles as an async function's body).
 */
function needsModule(js) {
  // Every one of those errors needs one of these words: without them the code is CommonJS, and
  // the compile (a few hundred microseconds in a fork, whose V8 caches start cold) is skipped.
  if (!/\b(?:import|export|await)\b/.test(js)) return false;
  try {
    vm.compileFunction(js, ["exports", "require", "module", "__filename", "__dirname"]);
    return false;
  } catch (error) {
    if (!(error instanceof SyntaxError)) return false;
    if (MODULE_SYNTAX.some((message) => error.message.includes(message))) return true;
    try {
      new vm.Script(`(async function () {\n${js}\n})`);
      return true;
    } catch {
      return false;
    }
  }
}

/**
 * How the script runs: `.mjs`/`.mts` as an ES module, `.cjs`/`.cts` as CommonJS, anything else
 * as CommonJS unless it needs an ES module (then `node` would need `.mjs` or a package type;
 * the agent provides the former).
 */
function formatOf(file, js) {
  if (/\.m[jt]s$/.test(file)) return "module";
  if (/\.c[jt]s$/.test(file)) return "commonjs";
  return needsModule(js) ? "module" : "commonjs";
}

/** Prints a TypeScript syntax error as Node prints a JavaScript one, and sets exit code 1. */
function reportSyntaxError(diagnostic) {
  const { line, character } = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start ?? 0);
  const text = diagnostic.file.text.split(/\r?\n/)[line] ?? "";
  const message = ts.flattenDiagnosticMessageText(diagnostic.messageText, "\n");
  process.stderr.write(
    `${diagnostic.file.fileName}:${line + 1}\n${text}\n${" ".repeat(character)}^\n\nSyntaxError: ${message}\n\nNode.js ${process.version}\n`,
  );
  process.exitCode = 1;
}

/** `.ts` and `.cts` files required as CommonJS are transpiled as they load. */
function requireTypeScript(module, filename) {
  const { js, diagnostics } = transpile(fs.readFileSync(filename, "utf8"), filename, "commonjs");
  if (diagnostics.length > 0) {
    const { line } = diagnostics[0].file.getLineAndCharacterOfPosition(diagnostics[0].start ?? 0);
    throw new SyntaxError(
      `${filename}:${line + 1}: ${ts.flattenDiagnosticMessageText(diagnostics[0].messageText, "\n")}`,
    );
  }
  module._compile(js, filename);
}
Module._extensions[".ts"] = requireTypeScript;
Module._extensions[".cts"] = requireTypeScript;

/**
 * Writes the ES module the script is run as when its own name would make Node load it as
 * CommonJS (or as TypeScript, which Node cannot load): beside it (its relative imports resolve
 * as the script's), named as the script with `.mjs`.
 */
function moduleFile(file, js) {
  const candidate = `${file.replace(/\.[^./]*$/, "")}.mjs`;
  const target = candidate !== file && !fs.existsSync(candidate) ? candidate : `${file}.mjs`;
  fs.writeFileSync(target, js);
  return target;
}

/**
 * Runs once before the ready point what every request runs after it, so that V8 compiles it (and
 * fills its caches) in the template, not in each fork: a module required from /tmp through the
 * CommonJS loader, the module-format check, console formatting (into a stream that drops it).
 */
function warmRequestPath() {
  const file = "/tmp/sandfork-warm.js";
  fs.writeFileSync(file, "module.exports = [1, 2].map((x) => x + 1).join(',');\n");
  require(file);
  delete require.cache[file];
  fs.unlinkSync(file);
  formatOf(file, "console.log(1)");
  const { Writable } = require("node:stream");
  const { Console } = require("node:console");
  new Console(new Writable({ write: (_chunk, _encoding, done) => done() })).log(
    "%s %d",
    "warm",
    1,
    { a: [1] },
  );
  // Empty writes: the output streams' write path, with nothing captured.
  process.stdout.write("");
  process.stderr.write("");
  seededRandom(Buffer.from("00112233445566778899aabbccddeeff", "hex"))();
}

/**
 * Runs the main module `entry` as `Module.runMain` does, its source being `source` already:
 * Node's `.js` loader reads the file again otherwise. Only that one load is served so (the hook
 * removes itself); a main module that Node runs as an ES module never reaches it.
 */
function runMainFrom(entry, source) {
  const loadJs = Module._extensions[".js"];
  Module._extensions[".js"] = function loadMain(module, filename) {
    Module._extensions[".js"] = loadJs;
    if (filename !== entry) return loadJs(module, filename);
    module._compile(source, filename);
  };
  Module.runMain(entry);
}

/** Runs `source`, the script at `file`, as Node runs its main module. */
function runScript(file, source) {
  let entry = file;
  if (TYPESCRIPT.test(file)) {
    const asCommonJs = /\.mts$/.test(file) ? null : transpile(source, file, "commonjs");
    const format =
      asCommonJs === null ||
      (asCommonJs.diagnostics.length === 0 && !/\.cts$/.test(file) && needsModule(asCommonJs.js))
        ? "module"
        : "commonjs";
    const { js, diagnostics } =
      format === "commonjs" ? asCommonJs : transpile(source, file, "module");
    if (diagnostics.length > 0) return reportSyntaxError(diagnostics[0]);
    // CommonJS TypeScript loads through requireTypeScript, transpiled again: a script is small.
    if (format === "module") entry = moduleFile(file, js);
  } else if (formatOf(file, source) === "module" && !/\.mjs$/.test(file)) {
    entry = moduleFile(file, source);
  }
  process.argv[1] = entry;
  if (entry === file && /\.js$/.test(file)) runMainFrom(entry, source);
  else Module.runMain(entry);
}

/**
 * Waits for the request and readies the process for it; returns the script's path and its
 * source (the request's code, which the VMM also placed at that path).
 */
function receive() {
  const request = awaitRequest();
  // Every fork starts with the template's generator states: reseed them from the request's
  // fresh entropy (a getrandom here would cost VM exits).
  const seed = Buffer.from(request.seed, "hex");
  native.reseed(seed);
  Math.random = seededRandom(seed.subarray(16));
  Object.assign(process.env, request.env);
  const file = path.join(WORK_DIR, request.argv[0]);
  process.argv = [process.execPath, file, ...request.argv.slice(1)];
  return { file, source: request.code };
}

// The agent boots in / (NODE_AGENT in native-vmm/src/agent.rs); scripts run in /work.
process.chdir(WORK_DIR);
warmRequestPath();

// The agent's own modules leave the loader's cache (they stay loaded): a script finds only its
// own modules there, as under `node`.
for (const name of Object.keys(require.cache)) delete require.cache[name];

// The objects made so far are the template's: collected once, so that a fork's first garbage
// collection has less to walk (and copy-on-write) through.
v8.setFlagsFromString("--expose-gc");
vm.runInNewContext("gc")();

let script;
try {
  script = receive();
} catch (error) {
  process.stderr.write(`sandfork agent: ${error?.stack ?? error}\n`);
  process.exit(70); // EX_SOFTWARE: the agent itself failed, not the user's code
}
// After 'exit', Node tears its whole environment down (the isolate, its heap, every handle, its
// worker threads): thousands of pages a fork would copy and system calls it would make for
// nothing, the VM being discarded or reset anyway. So, as the Python agent ends with os._exit,
// the process ends (exit_group) once the program's own 'exit' listeners (those it adds after
// this one, called here in order) have run, with the exit code they leave; stdout and stderr
// are written synchronously, nothing is left to flush. Not after an uncaught exception or rejection: Node emits 'exit' before it prints
// the error, so that exit takes Node's own way.
let uncaught = false;
process.on("uncaughtExceptionMonitor", () => {
  uncaught = true;
});
process.on("exit", function exitAtOnce(code) {
  if (uncaught) return;
  const listeners = process.listeners("exit");
  for (const listener of listeners.slice(listeners.indexOf(exitAtOnce) + 1))
    listener.call(process, code);
  native.exitNow(process.exitCode ?? code);
});
// Outside the try: what the script throws is uncaught, reported by Node as natively.
runScript(script.file, script.source);
