#!/usr/bin/env node
// Import cycles among native-vmm's modules: prints every cycle (each strongly connected group of
// modules that reach each other through `crate::`, `super::` and sibling paths), and exits 1 when
// one is not on the allow-list below (or an allow-listed one is gone, so the list stays true).
//
//   node scripts/import-graph.mjs [--edges]     (--edges also prints every edge of a cycle)
//
// A module is a top-level file or folder under native-vmm/src (`process.rs` with `process/` is
// one: `process`), except in the folders of FILE_LEVEL, where each file is its own module
// (`daemon::pool`; the folder's mod.rs, or `process.rs`, is `daemon`, `process`). A folder root's
// uses of its own children are not edges: declaring and re-exporting them is its job; a child's
// use of its root's items is. lib.rs and main.rs (the crate's roots), comments, string literals
// and test code (tests.rs, process/testing.rs and a file's closing `#[cfg(test)] mod tests`) are
// not read: a test may use whatever it tests.
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";

const SRC = join(fileURLToPath(new URL(".", import.meta.url)), "..", "native-vmm", "src");
const FILE_LEVEL = ["daemon", "process", "syscalls"];

// Cycles that remain, each as its sorted member list, with why it is allowed for now.
const ALLOWED = new Map([
  [
    "syscalls::epoll syscalls::poll",
    "mutual recursion by design: an epoll set is itself pollable (poll asks epoll for its ready " +
      "list) and epoll asks poll for each watched descriptor's readiness",
  ],
]);

function walk(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? walk(path) : name.endsWith(".rs") ? [path] : [];
  });
}

// The module path of a file: ["process"], ["daemon", "pool"], ["syscalls"] (for syscalls/mod.rs).
function fileModule(file) {
  const parts = relative(SRC, file).split(sep);
  parts[parts.length - 1] = parts[parts.length - 1].replace(/\.rs$/, "");
  if (parts[parts.length - 1] === "mod") parts.pop();
  return parts;
}

// The graph node of a module path.
function node(path) {
  if (path.length === 0) return null;
  if (FILE_LEVEL.includes(path[0]) && path.length > 1 && subModules.get(path[0]).has(path[1])) {
    return `${path[0]}::${path[1]}`;
  }
  return path[0];
}

function stripCommentsAndStrings(text) {
  return text
    .replace(/\/\*[\s\S]*?\*\//g, "")
    .replace(/\/\/.*$/gm, "")
    .replace(/r#*"[\s\S]*?"#*/g, '""')
    .replace(/"(?:[^"\\]|\\[\s\S])*"/g, '""')
    .replace(/'(?:[^'\\\n]|\\.)'/g, "' '");
}

// The paths a `use` tree names, expanded: "a::{b, c::d}" -> ["a::b", "a::c::d"].
function expandUseTree(tree) {
  tree = tree.replace(/\s+/g, "");
  const brace = tree.indexOf("{");
  if (brace < 0) return [tree.replace(/\bas\w+$/, "")];
  const prefix = tree.slice(0, brace);
  const inner = tree.slice(brace + 1, tree.lastIndexOf("}"));
  const items = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i <= inner.length; i++) {
    const ch = inner[i];
    if (ch === "{") depth++;
    else if (ch === "}") depth--;
    else if ((ch === "," && depth === 0) || i === inner.length) {
      const item = inner.slice(start, i);
      if (item) items.push(...expandUseTree(item).map((p) => prefix + p));
      start = i + 1;
    }
  }
  return items;
}

// The module a path in `file` (module path `self`) refers to, as a path from the crate root.
function resolve(path, self, isRoot) {
  const segments = path.split("::").filter((s) => s && s !== "self");
  if (segments[0] === "crate") return segments.slice(1);
  // Inside a folder root (mod.rs, process.rs) `super` is the parent; in a child it is the root.
  let base = self;
  while (segments[0] === "super") {
    segments.shift();
    base = base.slice(0, -1);
  }
  if (base !== self) return [...base, ...segments];
  // A bare `child::item` in a root names its own submodule.
  if (isRoot && segments.length > 1) return [...self, ...segments];
  return null;
}

const files = walk(SRC).filter((f) => !/\/tests\.rs$/.test(f) && !/\/testing\.rs$/.test(f));
const subModules = new Map(
  FILE_LEVEL.map((dir) => [
    dir,
    new Set(
      readdirSync(join(SRC, dir))
        .filter((n) => n.endsWith(".rs") && n !== "mod.rs")
        .map((n) => n.replace(/\.rs$/, "")),
    ),
  ]),
);

const edges = new Map(); // node -> Map(node -> [file:line])
for (const file of files) {
  const self = fileModule(file);
  if (self[0] === "lib" || self[0] === "main") continue;
  const isRoot = statSync(join(SRC, ...self), { throwIfNoEntry: false })?.isDirectory() ?? false;
  const from = node(self);
  let text = stripCommentsAndStrings(readFileSync(file, "utf8"));
  // A child's unit tests (`#[cfg(test)] mod tests { ... }` at the end of a file) are left out.
  text = text.replace(/#\[cfg\(test\)\]\s*mod\s+tests\s*\{[\s\S]*$/, "");
  const refs = [];
  for (const m of text.matchAll(/\buse\s+((?:crate|super|self)\b[^;]*);/g)) {
    refs.push(...expandUseTree(m[1]).map((p) => [p, m.index]));
  }
  for (const m of text.matchAll(/(?<![\w:])((?:crate|super)(?:::\w+)+)/g))
    refs.push([m[1], m.index]);
  if (isRoot) {
    for (const m of text.matchAll(/\buse\s+(\w+::[^;]*);/g)) {
      if (
        !/^(std|core|alloc|libc|serde|serde_json|sha2|base64|xxhash_rust|fixedbitset)\b/.test(m[1])
      ) {
        refs.push(...expandUseTree(m[1]).map((p) => [p, m.index]));
      }
    }
  }
  for (const [path, index] of refs) {
    const target = resolve(path, self, isRoot);
    if (!target) continue;
    const to = node(target);
    if (!to || to === from || to === "lib") continue;
    // A root's use of its own children is structure, not an import.
    if (isRoot && to.startsWith(`${from}::`)) continue;
    const line = text.slice(0, index).split("\n").length;
    if (!edges.has(from)) edges.set(from, new Map());
    const out = edges.get(from);
    if (!out.has(to)) out.set(to, []);
    const where = `${relative(join(SRC, ".."), file)}:${line}`;
    if (!out.get(to).includes(where)) out.get(to).push(where);
  }
}

// Tarjan's strongly connected components.
const nodes = [
  ...new Set([...edges.keys(), ...[...edges.values()].flatMap((m) => [...m.keys()])]),
].sort();
let index = 0;
const stack = [];
const info = new Map();
const components = [];
function connect(v) {
  info.set(v, { index, low: index, onStack: true });
  index++;
  stack.push(v);
  for (const w of [...(edges.get(v)?.keys() ?? [])].sort()) {
    if (!info.has(w)) {
      connect(w);
      info.get(v).low = Math.min(info.get(v).low, info.get(w).low);
    } else if (info.get(w).onStack) {
      info.get(v).low = Math.min(info.get(v).low, info.get(w).index);
    }
  }
  if (info.get(v).low === info.get(v).index) {
    const component = [];
    let w;
    do {
      w = stack.pop();
      info.get(w).onStack = false;
      component.push(w);
    } while (w !== v);
    if (component.length > 1) components.push(component.sort());
  }
}
for (const v of nodes) if (!info.has(v)) connect(v);

const showEdges = process.argv.includes("--edges");
let failed = false;
const seen = new Set();
for (const component of components.sort((a, b) => b.length - a.length)) {
  const key = component.join(" ");
  seen.add(key);
  const reason = ALLOWED.get(key);
  console.log(
    `${reason ? "allowed" : "CYCLE"}: ${component.join(" <-> ")}${reason ? ` (${reason})` : ""}`,
  );
  if (!reason) failed = true;
  if (showEdges || !reason) {
    for (const from of component) {
      for (const [to, where] of edges.get(from) ?? []) {
        if (component.includes(to))
          console.log(`    ${from} -> ${to}: ${where.slice(0, 3).join(", ")}`);
      }
    }
  }
}
for (const key of ALLOWED.keys()) {
  if (!seen.has(key)) {
    console.log(`gone: ${key} is allow-listed but no longer a cycle: take it off ALLOWED`);
    failed = true;
  }
}
console.log(
  failed ? "import-graph: cycles found" : `import-graph: no cycles but the ${ALLOWED.size} allowed`,
);
process.exit(failed ? 1 : 0);
