// The template registry: the templates the daemon serves and the file images behind them.
//
// Sources: one folder per template under templates/ (the repository's), each with an image
// manifest `image.json` (native-vmm/IMAGE.md) and, when some of its host files are built, a
// `prepare.sh` that builds them; or with a template definition `template.json` (a base
// template and what it adds, runtime/template-definition.ts), whose manifest is composed into
// DIR/.sources/<name>/ at each build. Built images: one folder per template under the
// templates directory the daemon is started with (`sandfork-vmm serve --templates DIR`, by
// default .sandfork/templates/): DIR/<name>/ holds image.index and image.data as written by
// `sandfork-vmm image build`; the folder's name is the template's name
// (native-vmm/src/daemon/templates.rs). Beside them, DIR/<name>/build.json records what the image
// was built from, so that a start rebuilds only a missing or stale image.
//
// Stale means: the manifest's bytes changed, the builder binary changed, a host file under the
// manifest's paths changed (size or mtime, walked recursively), or the Debian package database
// changed (/var/lib/dpkg/status: an upgrade may replace a shared library the image copied from
// outside the manifest's paths). A build goes to a hidden folder (the daemon skips names
// starting with '.') and is renamed into place, so the daemon never sees a half-built image.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, lstatSync, readdirSync, readFileSync, type Stats, statSync } from "node:fs";
import { mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import {
  type BuildStep,
  composeManifest,
  DEFINITION_FILE,
  TemplateBuildError,
} from "./template-definition.js";

export interface TemplateSource {
  /** The template's name: the folder name under the templates directory. */
  name: string;
  /**
   * The image manifest (e.g. templates/python/image.json); for a definition, the definition
   * itself until `ensureTemplate` composes its manifest (under the templates directory's
   * .sources/) and builds from that.
   */
  manifestPath: string;
  /** The template definition (e.g. templates/python-data/template.json), when it is one. */
  definitionPath?: string;
}

export interface TemplateBuildOptions {
  /** The `sandfork-vmm` binary (its `image build` command builds images). */
  binary: string;
  /** Where built templates go; the daemon's --templates. */
  templatesDir: string;
  log?: (line: string) => void;
  /** Rebuild even when the recorded inputs are unchanged. */
  force?: boolean;
  /** `template build --boot-timeout-ms` (default: the binary's). */
  bootTimeoutMs?: number;
  /** The templates a definition's `base` names (default: the folder holding the definition's). */
  sourcesDir?: string;
  /**
   * A snapshot that cannot be built fails the build (a TemplateBuildError of step "snapshot")
   * instead of leaving the template to boot its agent per request.
   */
  requireSnapshot?: boolean;
  /** Told as each step of the build starts. */
  onStep?: (step: BuildStep) => void;
  /** An image larger than this (image.data, bytes) fails the build at its "image" step. */
  maxImageBytes?: number;
}

export interface TemplateBuildResult {
  name: string;
  dir: string;
  /** What happened: built now (and why), or up to date. */
  action: "built" | "up-to-date";
  reason: string;
  /**
   * The snapshot at the agent's ready point (`sandfork-vmm template build`, in the image's folder):
   * ready, or why not (it needs KVM; without one the daemon boots the agent per request).
   */
  snapshot: { ready: boolean; detail: string };
  /** A definition's Debian packages, dependencies too (none for a manifest). */
  packages: string[];
}

const BUILD_RECORD = "build.json";
/** The templates directory's folder of composed manifests (hidden from the daemon). */
export const COMPOSED_SOURCES = ".sources";
/** A template folder's script that builds host files of its manifest before the image. */
const PREPARE_SCRIPT = "prepare.sh";
const IMAGE_FILES = ["image.index", "image.data"];
/** The snapshot `sandfork-vmm template build` writes into a template's folder. */
const SNAPSHOT_FILE = "template.sfsnap";
const PACKAGE_DATABASE = "/var/lib/dpkg/status";
/** Keeps the console readable: a builder's output beyond this is summarised. */
const MAX_LOGGED_LINES = 20;

/** Every `<root>/<name>/image.json` or `<root>/<name>/template.json`, sorted by name. */
export function discoverTemplateSources(root: string): TemplateSource[] {
  if (!existsSync(root)) return [];
  return readdirSync(root, { withFileTypes: true })
    .filter((entry) => entry.isDirectory())
    .flatMap((entry): TemplateSource[] => {
      const manifestPath = join(root, entry.name, "image.json");
      if (existsSync(manifestPath)) return [{ name: entry.name, manifestPath }];
      const definitionPath = join(root, entry.name, DEFINITION_FILE);
      if (!existsSync(definitionPath)) return [];
      return [{ name: entry.name, manifestPath: definitionPath, definitionPath }];
    })
    .sort((a, b) => a.name.localeCompare(b.name));
}

/** The sources `config` selects: every one, or those named in SANDFORK_TEMPLATES (each must exist). */
export function selectTemplateSources(root: string, names: string[] | undefined): TemplateSource[] {
  const sources = discoverTemplateSources(root);
  if (names === undefined) return sources;
  const missing = names.filter((name) => !sources.some((s) => s.name === name));
  if (missing.length > 0)
    throw new Error(
      `SANDFORK_TEMPLATES names ${missing.join(", ")}, which ${root} does not hold (it has ${sources.map((s) => s.name).join(", ")})`,
    );
  return sources.filter((s) => names.includes(s.name));
}

/** The host paths a manifest names (required and optional), resolved against its folder. */
function manifestHostPaths(manifestPath: string, manifestText: string): string[] {
  let manifest: unknown;
  try {
    manifest = JSON.parse(manifestText);
  } catch (error) {
    throw new Error(`template manifest ${manifestPath} is not JSON: ${(error as Error).message}`);
  }
  const record = (typeof manifest === "object" && manifest !== null ? manifest : {}) as Record<
    string,
    unknown
  >;
  const entries = [record.paths, record.optional_paths].flatMap((list) =>
    Array.isArray(list) ? list : [],
  );
  return entries.flatMap((entry: unknown) => {
    const host =
      typeof entry === "string"
        ? entry
        : typeof entry === "object" && entry !== null
          ? (entry as { host?: unknown }).host
          : undefined;
    if (typeof host !== "string") return [];
    return [isAbsolute(host) ? host : resolve(dirname(manifestPath), host)];
  });
}

/** Size and mtime of every file under `path` (symlinks are recorded, not followed), into `hash`. */
function hashTree(path: string, hash: ReturnType<typeof createHash>): void {
  let stat: Stats;
  try {
    stat = lstatSync(path);
  } catch {
    hash.update(`${path}\0absent\n`);
    return;
  }
  hash.update(`${path}\0${stat.mode}\0${stat.size}\0${stat.mtimeMs}\n`);
  if (stat.isSymbolicLink()) {
    // The target is what the image holds; a changed target changes its stat.
    try {
      const target = statSync(path);
      hash.update(`->\0${target.size}\0${target.mtimeMs}\n`);
    } catch {
      hash.update("->\0dangling\n");
    }
  } else if (stat.isDirectory()) {
    for (const name of readdirSync(path).sort()) hashTree(join(path, name), hash);
  }
}

interface BuildRecord {
  manifestSha256: string;
  inputsSha256: string;
  builder: string;
  builtAt: string;
  /** The VMs' memory a definition set (its snapshot's); absent: the runtime's default. */
  memoryMib?: number;
}

/** What the image in `templatesDir/<name>` would be built from now. */
function currentInputs(source: TemplateSource, binary: string): Omit<BuildRecord, "builtAt"> {
  const manifestText = readFileSync(source.manifestPath, "utf8");
  const inputs = createHash("sha256");
  for (const path of manifestHostPaths(source.manifestPath, manifestText)) hashTree(path, inputs);
  hashTree(PACKAGE_DATABASE, inputs);
  const builder = statSync(binary);
  return {
    manifestSha256: createHash("sha256").update(manifestText).digest("hex"),
    inputsSha256: inputs.digest("hex"),
    builder: `${resolve(binary)} size ${builder.size} mtime ${builder.mtimeMs}`,
  };
}

async function readRecord(dir: string): Promise<BuildRecord | undefined> {
  try {
    return JSON.parse(await readFile(join(dir, BUILD_RECORD), "utf8")) as BuildRecord;
  } catch {
    return undefined;
  }
}

/** Why the template in `dir` must be (re)built, or null when it is up to date. */
async function staleness(
  dir: string,
  inputs: Omit<BuildRecord, "builtAt">,
): Promise<string | null> {
  if (IMAGE_FILES.some((file) => !existsSync(join(dir, file)))) return "no image yet";
  const record = await readRecord(dir);
  if (record === undefined) return "no build record";
  if (record.manifestSha256 !== inputs.manifestSha256) return "the manifest changed";
  if (record.builder !== inputs.builder) return "the sandfork-vmm binary changed";
  if (record.inputsSha256 !== inputs.inputsSha256)
    return "host files under the manifest's paths or installed packages changed";
  return null;
}

/** Runs `binary ...args`, echoing its output (at most MAX_LOGGED_LINES lines) to `log`. */
function runBuilder(binary: string, args: string[], log: (line: string) => void): Promise<void> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(binary, args, { stdio: ["ignore", "pipe", "pipe"] });
    const lines: string[] = [];
    const collect = (line: string) => {
      if (line.trim() !== "") lines.push(line);
    };
    createInterface({ input: child.stdout, crlfDelay: Infinity }).on("line", collect);
    createInterface({ input: child.stderr, crlfDelay: Infinity }).on("line", collect);
    child.on("error", (error) => reject(new Error(`cannot run ${binary}: ${error.message}`)));
    child.on("close", (code, signal) => {
      const shown = lines.slice(-MAX_LOGGED_LINES);
      if (lines.length > shown.length) log(`  … ${lines.length - shown.length} earlier line(s)`);
      for (const line of shown) log(`  ${line}`);
      if (code === 0) resolvePromise();
      else
        reject(
          new Error(
            `${binary} ${args.join(" ")} failed (${signal ?? `exit code ${code}`}): ${lines.find((l) => l.startsWith("sandfork-vmm:")) ?? lines.at(-1) ?? "no output"}`,
          ),
        );
    });
  });
}

/**
 * Snapshots the template at its agent's ready point (in VMs of `memoryMib`, default the
 * runtime's); the binary skips an up-to-date snapshot.
 */
async function ensureSnapshot(
  options: TemplateBuildOptions,
  name: string,
  dir: string,
  memoryMib: number | undefined,
  log: (line: string) => void,
): Promise<TemplateBuildResult["snapshot"]> {
  options.onStep?.("snapshot");
  const bootTimeout =
    options.bootTimeoutMs === undefined ? [] : ["--boot-timeout-ms", String(options.bootTimeoutMs)];
  const memory = memoryMib === undefined ? [] : ["--mem-mib", String(memoryMib)];
  // The builder's own output: what a failed snapshot says beyond its last line.
  const output: string[] = [];
  try {
    await runBuilder(
      options.binary,
      [
        "template",
        "build",
        "--image",
        dir,
        "--template",
        name,
        "--out",
        dir,
        ...memory,
        ...bootTimeout,
      ],
      (line) => output.push(line),
    );
    return { ready: true, detail: `snapshot in ${join(dir, SNAPSHOT_FILE)}` };
  } catch (error) {
    if (options.requireSnapshot)
      throw new TemplateBuildError(
        "snapshot",
        [(error as Error).message, ...output.map((line) => line.slice(2))].join("\n"),
      );
    const detail = `no snapshot (${(error as Error).message}); the daemon boots the agent per request`;
    log(`template ${name}: ${detail}`);
    return { ready: false, detail };
  }
}

/**
 * Runs the template's `prepare.sh` when its folder has one: it builds host files its manifest
 * names (the node template's native addon), leaving them untouched when they are up to date.
 */
async function prepareSources(source: TemplateSource, log: (line: string) => void): Promise<void> {
  const script = join(dirname(source.manifestPath), PREPARE_SCRIPT);
  if (!existsSync(script)) return;
  try {
    await runBuilder("bash", [script], log);
  } catch (error) {
    throw new Error(
      `template ${source.name}: ${PREPARE_SCRIPT} failed: ${(error as Error).message}`,
    );
  }
}

/** Builds the template's image into templatesDir/<name> unless an up-to-date one is there. */
export async function ensureTemplate(
  source: TemplateSource,
  options: TemplateBuildOptions,
): Promise<TemplateBuildResult> {
  const log = options.log ?? (() => {});
  const dir = join(options.templatesDir, source.name);
  if (!existsSync(options.binary)) {
    throw new Error(
      `the sandfork-vmm binary is missing at ${options.binary}; build it with \`cd native-vmm && cargo build --release\``,
    );
  }
  await prepareSources(source, log);
  let memoryMib: number | undefined;
  let packages: string[] = [];
  if (source.definitionPath !== undefined) {
    options.onStep?.("packages");
    const composed = await composeManifest(
      source.definitionPath,
      options.sourcesDir ?? dirname(dirname(source.definitionPath)),
      join(options.templatesDir, COMPOSED_SOURCES, source.name),
    );
    source = { ...source, manifestPath: composed.manifestPath };
    memoryMib = composed.memoryMib;
    packages = composed.packages;
    if (composed.packages.length > 0)
      log(`template ${source.name}: Debian packages ${composed.packages.join(", ")}`);
  }
  const inputs = currentInputs(source, options.binary);
  const reason = options.force ? "a rebuild was asked for" : await staleness(dir, inputs);
  if (reason === null) {
    const snapshot = await ensureSnapshot(options, source.name, dir, memoryMib, log);
    return {
      name: source.name,
      dir,
      action: "up-to-date",
      reason: "inputs unchanged",
      snapshot,
      packages,
    };
  }

  log(`template ${source.name}: building its image from ${source.manifestPath} (${reason})`);
  const started = performance.now();
  await mkdir(options.templatesDir, { recursive: true });
  const building = join(options.templatesDir, `.building-${source.name}-${process.pid}`);
  const replaced = join(options.templatesDir, `.replaced-${source.name}-${process.pid}`);
  await rm(building, { recursive: true, force: true });
  options.onStep?.("image");
  try {
    await runBuilder(
      options.binary,
      ["image", "build", "--manifest", source.manifestPath, "--out", building],
      log,
    ).catch((error: Error) => {
      throw new TemplateBuildError("image", error.message);
    });
    const imageBytes = statSync(join(building, "image.data")).size;
    if (options.maxImageBytes !== undefined && imageBytes > options.maxImageBytes)
      throw new TemplateBuildError(
        "image",
        `the image is ${mib(imageBytes)} MiB (${imageBytes} bytes), over the limit of ${mib(options.maxImageBytes)} MiB (${options.maxImageBytes} bytes)`,
      );
    const record: BuildRecord = {
      ...inputs,
      builtAt: new Date().toISOString(),
      ...(memoryMib === undefined ? {} : { memoryMib }),
    };
    await writeFile(join(building, BUILD_RECORD), `${JSON.stringify(record, null, 2)}\n`);
    if (existsSync(dir)) await rename(dir, replaced);
    await rename(building, dir);
  } finally {
    await rm(building, { recursive: true, force: true });
    await rm(replaced, { recursive: true, force: true });
  }
  log(
    `template ${source.name}: image ready in ${dir} (${((performance.now() - started) / 1000).toFixed(1)} s)`,
  );
  const snapshot = await ensureSnapshot(options, source.name, dir, memoryMib, log);
  return { name: source.name, dir, action: "built", reason, snapshot, packages };
}

/**
 * In a template folder the daemon saved from a session (native-vmm/src/daemon/templates.rs,
 * SAVED_SESSION_FILE): its snapshot is the session's state, which no build makes again.
 */
const SAVED_SESSION_FILE = "saved-session.json";

/**
 * Snapshots again, where stale, each built template in the templates directory that no source
 * folder of `sourcesRoot` names (those built through the API): a snapshot the binary no longer
 * reads (another format version) would stop the daemon's start. One that cannot be rebuilt is
 * removed, and the daemon boots that template's agent per request. Folders saved from sessions
 * are left as they are (the daemon leaves out one whose snapshot it cannot read).
 */
export async function refreshBuiltSnapshots(
  sourcesRoot: string,
  options: TemplateBuildOptions,
): Promise<string[]> {
  const log = options.log ?? (() => {});
  const sources = new Set(discoverTemplateSources(sourcesRoot).map((s) => s.name));
  if (!existsSync(options.templatesDir)) return [];
  const names = readdirSync(options.templatesDir, { withFileTypes: true })
    .filter((e) => e.isDirectory() && !e.name.startsWith(".") && !sources.has(e.name))
    .filter((e) => !existsSync(join(options.templatesDir, e.name, SAVED_SESSION_FILE)))
    .map((e) => e.name)
    .sort();
  for (const name of names) {
    const dir = join(options.templatesDir, name);
    const record = await readRecord(dir);
    const snapshot = await ensureSnapshot(
      { ...options, requireSnapshot: false },
      name,
      dir,
      record?.memoryMib,
      log,
    );
    if (!snapshot.ready) await rm(join(dir, SNAPSHOT_FILE), { force: true });
  }
  return names;
}

const mib = (bytes: number) => (bytes / 2 ** 20).toFixed(1);

/** ensureTemplate for each source, one after another (builds are I/O-heavy on a 2-core machine). */
export async function ensureTemplates(
  sources: TemplateSource[],
  options: TemplateBuildOptions,
): Promise<TemplateBuildResult[]> {
  const results: TemplateBuildResult[] = [];
  for (const source of sources) results.push(await ensureTemplate(source, options));
  return results;
}
