// Every command in the ```sh blocks of README.md and docs/*.md names things that exist: npm
// scripts in package.json, files and folders of the repository, `sandfork-vmm` subcommands and
// their flags (from the built binary's --help, else from the usage strings in main.rs), `cargo
// test --test` targets, and the routes curl calls in the gateway's OpenAPI document.
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OPENAPI_PATH } from "../gateway/app.js";
import { startTestGateway, type TestGateway } from "../gateway/testing/test-gateway.js";

const ROOT = resolve(fileURLToPath(new URL(".", import.meta.url)), "..");
const VMM = "native-vmm/target/release/sandfork-vmm";

interface Block {
  file: string;
  line: number;
  text: string;
}

function shellBlocks(file: string, markdown: string): Block[] {
  const blocks: Block[] = [];
  const lines = markdown.split("\n");
  for (let i = 0; i < lines.length; i++) {
    if (lines[i]!.trim() !== "```sh") continue;
    const start = i + 1;
    while (i + 1 < lines.length && lines[++i]!.trim() !== "```");
    blocks.push({ file, line: start + 1, text: lines.slice(start, i).join("\n") });
  }
  return blocks;
}

/** Shell words of a block's commands, split at `&&`, `||`, `;`, `|` and line ends; comments and quotes removed. */
function commands(text: string): string[][] {
  const out: string[][] = [];
  let words: string[] = [];
  let word: string | null = null;
  const endWord = () => {
    if (word !== null) words.push(word);
    word = null;
  };
  const endCommand = () => {
    endWord();
    if (words.length > 0) out.push(words);
    words = [];
  };
  const s = text.replace(/\\\n/g, " ");
  for (let i = 0; i < s.length; i++) {
    const c = s[i]!;
    if (c === "'" || c === '"') {
      const close = s.indexOf(c, i + 1);
      word = (word ?? "") + s.slice(i + 1, close < 0 ? s.length : close);
      i = close < 0 ? s.length : close;
    } else if (c === "#" && word === null) {
      while (i + 1 < s.length && s[i + 1] !== "\n") i++;
    } else if (c === "\n" || c === ";" || c === "|" || (c === "&" && s[i + 1] === "&")) {
      if (c === "&" || (c === "|" && s[i + 1] === "|")) i++;
      endCommand();
    } else if (c === " " || c === "\t") endWord();
    else word = (word ?? "") + c;
  }
  endCommand();
  return out;
}

interface Facts {
  scripts: Set<string>;
  /** "METHOD /path/{param}" */
  routes: Set<string>;
  /** The usage text of a `sandfork-vmm` subcommand (its words before the first flag), or null if there is none. */
  vmmUsage(subcommand: string[]): string | null;
  exists(path: string): boolean;
}

const NPM_BUILTINS = new Set(["ci", "install", "i", "exec", "pack", "publish", "version"]);
/** Flags whose value names something a command makes rather than reads. */
const OUTPUT_FLAGS = new Set([
  "--out",
  "--dir",
  "--keep",
  "--socket",
  "--sessions",
  "-o",
  "--output",
]);
const REPO_TOP =
  /^(\.\/)?(bin|client|console|db|docs|gateway|loadtest|native-vmm|runtime|scripts|templates)\//;

function routeMatches(routes: Set<string>, method: string, path: string): boolean {
  const segments = path.split("/");
  return [...routes].some((route) => {
    const [m, p] = route.split(" ") as [string, string];
    const want = p.split("/");
    return (
      m === method &&
      want.length === segments.length &&
      want.every((w, i) => w.startsWith("{") || w === segments[i])
    );
  });
}

/** What one command names that does not exist (empty when all of it does). */
function problems(words: string[], facts: Facts): string[] {
  const found: string[] = [];
  let w = words;
  while (w.length > 0 && /^[A-Za-z_][A-Za-z0-9_]*=/.test(w[0]!)) w = w.slice(1);
  if (w.length === 0) return found;
  const [program, ...args] = w as [string, ...string[]];
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    if (OUTPUT_FLAGS.has(args[i - 1] ?? "")) continue;
    if (
      REPO_TOP.test(arg) &&
      !arg.includes("*") &&
      !arg.startsWith(VMM) &&
      !arg.includes("/target/") &&
      !facts.exists(arg)
    )
      found.push(`no file ${arg}`);
  }
  if (program === "npm") {
    const [sub, name] = args;
    const script = sub === "run" || sub === "run-script" ? name : sub;
    if (script !== undefined && !NPM_BUILTINS.has(script) && !facts.scripts.has(script))
      found.push(`no npm script ${script}`);
  } else if (
    program === "bash" ||
    program === "sh" ||
    program === "node" ||
    program === "tsx" ||
    (program === "npx" && args[0] === "tsx")
  ) {
    const file = args.find((a) => !a.startsWith("-") && a !== "tsx");
    if (file !== undefined && !facts.exists(file)) found.push(`no file ${file}`);
  } else if (program === "cd") {
    if (
      args[0] !== undefined &&
      !args[0].startsWith("/") &&
      !args[0].startsWith("$") &&
      !facts.exists(args[0])
    )
      found.push(`no folder ${args[0]}`);
  } else if (program === "cargo") {
    const at = args.indexOf("--test");
    const target = at >= 0 ? args[at + 1] : undefined;
    if (target !== undefined && !facts.exists(`native-vmm/tests/${target}.rs`))
      found.push(`no cargo test target ${target}`);
  } else if (program === "sandfork-vmm" || program === VMM || program === `./${VMM}`) {
    // A synopsis (`bench run [--iterations N]`) is checked like the command it describes.
    const subcommand = args.slice(
      0,
      args.findIndex((a) => a.startsWith("-") || a.startsWith("[")) >>> 0,
    );
    const flags = args.flatMap((a) => a.match(/^\[?(--[a-z][a-z0-9-]*)/)?.[1] ?? []);
    const usage = facts.vmmUsage(subcommand);
    if (usage === null) found.push(`no sandfork-vmm ${subcommand.join(" ")}`);
    else
      for (const flag of flags)
        if (!new RegExp(`${flag}\\b`).test(usage))
          found.push(`sandfork-vmm ${subcommand.join(" ")} has no ${flag}`);
  } else if (program === "curl") {
    const url = args.find((a) => /^https?:\/\//.test(a));
    // A path a command substitution prints (`$(jq -r .url run.json)`) is not known here.
    if (url !== undefined && !url.includes("$(")) {
      const at = args.findIndex((a) => a === "-X" || a === "--request");
      const data = args.some(
        (a) => a === "-d" || a === "--data" || a === "--data-binary" || a === "-T",
      );
      const method = at >= 0 ? args[at + 1]!.toUpperCase() : data ? "POST" : "GET";
      const path = new URL(url.replace(/\$\{?\w+\}?/g, "x")).pathname;
      if (!routeMatches(facts.routes, method, path)) found.push(`no route ${method} ${path}`);
    }
  }
  return [...new Set(found)];
}

/** The usage of `sandfork-vmm SUBCOMMAND`: the built binary's --help, else main.rs's usage string for it. */
function vmmUsage(subcommand: string[]): string | null {
  if (subcommand.length === 0) return null;
  const binary = join(ROOT, VMM);
  if (existsSync(binary)) {
    try {
      return execFileSync(binary, [...subcommand, "--help"], {
        encoding: "utf8",
        stdio: ["ignore", "pipe", "pipe"],
      });
    } catch (error) {
      const { status, stdout, stderr } = error as {
        status: number;
        stdout: string;
        stderr: string;
      };
      const text = `${stdout}${stderr}`;
      return status === 2 && text.includes(`usage: sandfork-vmm ${subcommand.join(" ")}`)
        ? text
        : null;
    }
  }
  const main = readFileSync(join(ROOT, "native-vmm/src/main.rs"), "utf8");
  const usages = main.split(/const [A-Z_]+: &str = "\\\n/).slice(1);
  return (
    usages.find(
      (u) =>
        u.startsWith(`usage: sandfork-vmm ${subcommand.join(" ")} `) ||
        u.startsWith(`usage: sandfork-vmm ${subcommand.join(" ")}\n`),
    ) ?? null
  );
}

const DOCS = [
  "README.md",
  ...readdirSync(join(ROOT, "docs"))
    .filter((f) => f.endsWith(".md"))
    .map((f) => `docs/${f}`),
];

describe("the commands in README.md and docs/", () => {
  let gw: TestGateway;
  let facts: Facts;
  beforeAll(async () => {
    gw = await startTestGateway("pglite");
    const doc = (await (await gw.call("GET", OPENAPI_PATH)).json()) as {
      paths: Record<string, Record<string, unknown>>;
    };
    const routes = new Set(
      Object.entries(doc.paths).flatMap(([path, ops]) =>
        Object.keys(ops).map((m) => `${m.toUpperCase()} ${path}`),
      ),
    );
    const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as {
      scripts: Record<string, string>;
    };
    facts = {
      scripts: new Set(Object.keys(pkg.scripts)),
      routes,
      vmmUsage,
      exists: (p) => existsSync(join(ROOT, p)),
    };
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  it.each(DOCS)("%s names only scripts, files, flags and routes that exist", (file) => {
    const blocks = shellBlocks(file, readFileSync(join(ROOT, file), "utf8"));
    const found = blocks.flatMap((b) =>
      commands(b.text).flatMap((words) =>
        problems(words, facts).map((p) => `${b.file}:${b.line}: ${words.join(" ")}: ${p}`),
      ),
    );
    expect(found).toEqual([]);
  });

  it("reads README.md's first call", () => {
    const blocks = shellBlocks("README.md", readFileSync(join(ROOT, "README.md"), "utf8"));
    const all = blocks.flatMap((b) => commands(b.text));
    expect(all.filter((w) => w[0] === "curl")).toHaveLength(3);
    expect(all).toContainEqual(["npm", "start"]);
  });

  it("fails on a missing script, file, flag, subcommand, test target or route", () => {
    const planted = [
      "npm run no-such-script",
      "npm start && bash scripts/no-such.sh",
      `${VMM} bench syscalls --no-such-flag`,
      `${VMM} no-such-command --image x`,
      "cd native-vmm && cargo test --release --test no_such_test",
      "curl -s http://127.0.0.1:8787/v1/no-such-route -H 'Authorization: Bearer $KEY'",
      `curl -s http://127.0.0.1:8787/v1/usage -d '{"a": 1}'`,
      "tsx gateway/no-such.ts",
    ].join("\n");
    const found = commands(planted).map((words) => problems(words, facts));
    expect(found).toEqual([
      ["no npm script no-such-script"],
      [],
      ["no file scripts/no-such.sh"],
      ["sandfork-vmm bench syscalls has no --no-such-flag"],
      ["no sandfork-vmm no-such-command"],
      [],
      ["no cargo test target no_such_test"],
      ["no route GET /v1/no-such-route"],
      ["no route POST /v1/usage"],
      ["no file gateway/no-such.ts"],
    ]);
    const fine = commands(
      `${VMM} bench exec --template .sandfork/templates/python --json\ncurl http://127.0.0.1:8787/v1/executions/$ID -H 'x: y'`,
    );
    expect(fine.map((words) => problems(words, facts))).toEqual([[], []]);
  });
});
