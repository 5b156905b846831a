// Template definitions: a template described as a base template plus what it adds, turned into
// an image manifest (native-vmm/IMAGE.md) that `sandfork-vmm image build` builds. A definition
// is a `template.json` in a template source folder (templates/python-data/) or what
// `POST /v1/templates` wrote for an API caller; its host paths are relative to its folder.
//
// What it adds, and where the guest finds it:
// - Debian packages installed on the build host, with the Python, data and font packages they
//   depend on (runtime/debian-packages.ts); their shared libraries are found by the image build.
// - Wheels, unpacked under /opt/sandfork/site-packages (first on the agent's import path).
// - Files at guest paths, environment variables (/opt/sandfork/env.json) and a setup program
//   (/opt/sandfork/setup.py) that the Python agent applies and runs before its ready point,
//   so that the snapshot holds their effect (templates/python/agent.py, prepare_template).
// - The VM's memory size, which the snapshot is built with.
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { dirname, isAbsolute, join, relative, resolve } from "node:path";
import { PackageDatabase, PackageError } from "./debian-packages.js";

/** The file a template source folder holds when it is a definition rather than a manifest. */
export const DEFINITION_FILE = "template.json";
/** Where the agent looks for what a definition adds (templates/python/agent.py). */
export const GUEST_TEMPLATE_DIR = "/opt/sandfork";
const GUEST_SITE_PACKAGES = `${GUEST_TEMPLATE_DIR}/site-packages`;
/** The interpreter that unpacks wheels (zip files) on the build host. */
const HOST_PYTHON = "/usr/bin/python3.11";
export const MIN_MEMORY_MIB = 64;
/** The fields of a definition file. */
export const DEFINITION_FIELDS: readonly string[] = [
  "base",
  "debian_packages",
  "exclude_packages",
  "exclude",
  "wheels",
  "files",
  "env",
  "setup",
  "memory_mib",
];
export const MAX_MEMORY_MIB = 16384;

export interface TemplateDefinition {
  /** The template whose image manifest this one extends (a folder of the template sources). */
  base: string;
  debian_packages?: string[];
  /** Dependencies not to include (with what only they needed). */
  exclude_packages?: string[];
  /** Guest path patterns (IMAGE.md's `exclude`) left out of the packages' files. */
  exclude?: string[];
  /** Host paths of .whl files. */
  wheels?: string[];
  /** Host files placed at guest paths. */
  files?: { host: string; guest: string }[];
  env?: Record<string, string>;
  /** Host path of a Python program run once before the snapshot. */
  setup?: string;
  memory_mib?: number;
}

/** The steps of a template build, in order; a failure names the one it happened in. */
export type BuildStep = "definition" | "packages" | "wheels" | "image" | "snapshot";

export class TemplateBuildError extends Error {
  constructor(
    readonly step: BuildStep,
    message: string,
  ) {
    super(message);
  }
}

const fail = (message: string): never => {
  throw new TemplateBuildError("definition", message);
};

function stringList(value: unknown, field: string): string[] | undefined {
  if (value === undefined) return undefined;
  if (!Array.isArray(value) || value.some((item) => typeof item !== "string" || item === ""))
    fail(`${field} must be a list of non-empty strings`);
  return value as string[];
}

/** `text` checked as a definition (unknown fields are refused, so that typos are caught). */
export function parseDefinition(text: string, where: string): TemplateDefinition {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (error) {
    fail(`${where} is not JSON: ${(error as Error).message}`);
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw))
    fail(`${where} must be a JSON object`);
  const record = raw as Record<string, unknown>;
  const unknown = Object.keys(record).filter((key) => !DEFINITION_FIELDS.includes(key));
  if (unknown.length > 0) fail(`${where}: unknown field ${unknown.join(", ")}`);
  if (typeof record.base !== "string" || record.base === "")
    fail(`${where}: base must name a template`);
  const files = record.files;
  if (
    files !== undefined &&
    (!Array.isArray(files) ||
      files.some(
        (file) =>
          typeof file !== "object" ||
          file === null ||
          typeof file.host !== "string" ||
          typeof file.guest !== "string",
      ))
  )
    fail(`${where}: files must be a list of {"host": PATH, "guest": PATH}`);
  for (const file of (files ?? []) as { guest: string }[]) checkGuestPath(file.guest);
  const env = record.env;
  if (
    env !== undefined &&
    (typeof env !== "object" ||
      env === null ||
      Array.isArray(env) ||
      Object.entries(env).some(
        ([name, value]) => typeof value !== "string" || !/^[A-Za-z_][A-Za-z0-9_]*$/.test(name),
      ))
  )
    fail(`${where}: env must map variable names to strings`);
  const memory = record.memory_mib;
  if (
    memory !== undefined &&
    (!Number.isInteger(memory) ||
      (memory as number) < MIN_MEMORY_MIB ||
      (memory as number) > MAX_MEMORY_MIB)
  )
    fail(`${where}: memory_mib must be a whole number from ${MIN_MEMORY_MIB} to ${MAX_MEMORY_MIB}`);
  if (record.setup !== undefined && (typeof record.setup !== "string" || record.setup === ""))
    fail(`${where}: setup must be the path of a Python program`);
  return {
    base: record.base as string,
    debian_packages: stringList(record.debian_packages, "debian_packages"),
    exclude_packages: stringList(record.exclude_packages, "exclude_packages"),
    exclude: stringList(record.exclude, "exclude"),
    wheels: stringList(record.wheels, "wheels"),
    files: files as TemplateDefinition["files"],
    env: env as Record<string, string> | undefined,
    setup: record.setup as string | undefined,
    memory_mib: memory as number | undefined,
  };
}

/** A guest path a definition may place a file at: absolute, normal, not the agent's folder. */
export function checkGuestPath(path: string): void {
  if (!path.startsWith("/") || path.split("/").some((part) => part === "." || part === ".."))
    fail(`file path ${JSON.stringify(path)} must be absolute, without . or .. components`);
  if (path === GUEST_TEMPLATE_DIR || path.startsWith(`${GUEST_TEMPLATE_DIR}/`))
    fail(`file path ${JSON.stringify(path)} is inside ${GUEST_TEMPLATE_DIR}, which the agent owns`);
  if (path === "/work" || path.startsWith("/work/") || path === "/tmp" || path.startsWith("/tmp/"))
    fail(
      `file path ${JSON.stringify(path)} is in a writable folder (/work, /tmp), which starts empty in every VM; place it elsewhere (a setup program may copy it there)`,
    );
}

/** An IMAGE.md exclude pattern as a regular expression over whole guest paths. */
export function patternRegExp(pattern: string): RegExp {
  let source = "";
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i] as string;
    if (pattern.startsWith("**/", i)) {
      source += "(?:.*/)?";
      i += 2;
    } else if (pattern.startsWith("**", i)) {
      source += ".*";
      i += 1;
    } else if (c === "*") source += "[^/]*";
    else if (c === "?") source += "[^/]";
    else source += c.replace(/[.+^${}()|[\]\\]/g, "\\$&");
  }
  return new RegExp(`^${source}$`);
}

interface Manifest {
  name: string;
  paths: (string | { host: string; guest: string })[];
  optional_paths?: (string | { host: string; guest: string })[];
  exclude?: string[];
  writable_dirs?: string[];
}

/** The base template's manifest with every relative host path made absolute. */
function baseManifest(sourcesRoot: string, base: string): Manifest {
  const path = join(sourcesRoot, base, "image.json");
  if (!existsSync(path))
    fail(
      `base template ${JSON.stringify(base)} is not one of the built-in templates with an image manifest`,
    );
  const manifest = JSON.parse(readFileSync(path, "utf8")) as Manifest;
  const absolute = (entry: string | { host: string; guest: string }) =>
    typeof entry === "string" || isAbsolute(entry.host)
      ? entry
      : { host: resolve(dirname(path), entry.host), guest: entry.guest };
  return {
    ...manifest,
    paths: manifest.paths.map(absolute),
    optional_paths: manifest.optional_paths?.map(absolute),
  };
}

/** Writes `text` to `path` unless it already holds it (an unchanged file keeps its mtime). */
async function writeIfChanged(path: string, text: string): Promise<void> {
  if (existsSync(path) && (await readFile(path, "utf8")) === text) return;
  await writeFile(path, text);
}

function run(command: string, args: string[]): Promise<void> {
  return new Promise((resolvePromise, reject) => {
    execFile(command, args, { maxBuffer: 1 << 20 }, (error, _stdout, stderr) => {
      if (error) reject(new Error(stderr.trim().split("\n").at(-1) || error.message));
      else resolvePromise();
    });
  });
}

/**
 * Unpacks each wheel into `dir`/<its SHA-256>/ (once: an unchanged wheel keeps its files and
 * their times, so the image is not rebuilt) and returns the manifest entries placing its files
 * under the guest's site-packages.
 */
async function wheelEntries(
  wheels: string[],
  dir: string,
): Promise<{ host: string; guest: string }[]> {
  const entries: { host: string; guest: string }[] = [];
  const guests = new Map<string, string>();
  for (const wheel of wheels) {
    if (!wheel.endsWith(".whl"))
      throw new TemplateBuildError("wheels", `${wheel}: a wheel's file name ends in .whl`);
    let bytes: Buffer;
    try {
      bytes = await readFile(wheel);
    } catch (error) {
      throw new TemplateBuildError("wheels", `${wheel}: ${(error as Error).message}`);
    }
    const unpacked = join(dir, createHash("sha256").update(bytes).digest("hex"));
    if (!existsSync(unpacked)) {
      const partial = `${unpacked}.partial`;
      await rm(partial, { recursive: true, force: true });
      try {
        await run(HOST_PYTHON, ["-I", "-m", "zipfile", "-e", wheel, partial]);
      } catch (error) {
        await rm(partial, { recursive: true, force: true });
        throw new TemplateBuildError(
          "wheels",
          `${wheel.split("/").at(-1)} is not a valid wheel (zip file): ${(error as Error).message}`,
        );
      }
      await rename(partial, unpacked);
    }
    for (const host of walkFiles(unpacked)) {
      const guest = `${GUEST_SITE_PACKAGES}/${relative(unpacked, host)}`;
      const other = guests.get(guest);
      if (other !== undefined && other !== wheel)
        throw new TemplateBuildError(
          "wheels",
          `${wheel.split("/").at(-1)} and ${other.split("/").at(-1)} both hold ${guest.slice(GUEST_SITE_PACKAGES.length + 1)}`,
        );
      guests.set(guest, wheel);
      entries.push({ host, guest });
    }
  }
  return entries;
}

/** Every regular file under `dir`, sorted. */
function walkFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true, recursive: true })
    .filter((entry) => entry.isFile())
    .map((entry) => join(entry.parentPath, entry.name))
    .sort();
}

export interface ComposedTemplate {
  manifestPath: string;
  /** The VMs' memory (the snapshot's), when the definition sets it. */
  memoryMib: number | undefined;
  /** The Debian packages included, dependencies too. */
  packages: string[];
}

/**
 * Writes the image manifest of the definition at `definitionPath` into `outDir` (with its
 * env.json and unpacked wheels) and returns where. Every failure is a TemplateBuildError
 * naming its step.
 */
export async function composeManifest(
  definitionPath: string,
  sourcesRoot: string,
  outDir: string,
  packageDatabase: () => PackageDatabase = () => new PackageDatabase(),
): Promise<ComposedTemplate> {
  const folder = dirname(definitionPath);
  const definition = parseDefinition(await readFile(definitionPath, "utf8"), definitionPath);
  const host = (path: string) => resolve(folder, path);
  const manifest = baseManifest(sourcesRoot, definition.base);
  if (manifest.name !== "python" && (definition.setup || definition.env || definition.wheels))
    fail(`setup, env and wheels need a Python base template, not ${definition.base}`);
  for (const path of [
    ...(definition.files ?? []).map((file) => file.host),
    ...(definition.setup ? [definition.setup] : []),
  ]) {
    const stat = existsSync(host(path)) ? statSync(host(path)) : undefined;
    if (!stat?.isFile()) fail(`${path}: no such file next to the definition`);
  }

  let packages: string[] = [];
  const packageFiles: string[] = [];
  if ((definition.debian_packages ?? []).length > 0) {
    try {
      const database = packageDatabase();
      packages = database.closure(
        definition.debian_packages ?? [],
        definition.exclude_packages ?? [],
      );
      const excluded = (definition.exclude ?? []).map(patternRegExp);
      for (const name of packages)
        for (const path of database.files(name))
          if (!excluded.some((pattern) => pattern.test(path))) packageFiles.push(path);
    } catch (error) {
      if (error instanceof PackageError) throw new TemplateBuildError("packages", error.message);
      throw error;
    }
  }

  await mkdir(outDir, { recursive: true });
  const wheels = await wheelEntries((definition.wheels ?? []).map(host), join(outDir, "wheels"));
  const added: Manifest["paths"] = [...new Set(packageFiles)].sort();
  added.push(...wheels);
  for (const file of definition.files ?? [])
    added.push({ host: host(file.host), guest: file.guest });
  if (definition.env !== undefined) {
    const envPath = join(outDir, "env.json");
    await writeIfChanged(envPath, `${JSON.stringify(definition.env, null, 2)}\n`);
    added.push({ host: envPath, guest: `${GUEST_TEMPLATE_DIR}/env.json` });
  }
  if (definition.setup !== undefined)
    added.push({ host: host(definition.setup), guest: `${GUEST_TEMPLATE_DIR}/setup.py` });

  const composed: Manifest = {
    ...manifest,
    paths: [...manifest.paths, ...added],
    exclude: [...(manifest.exclude ?? []), ...(definition.exclude ?? [])],
  };
  const manifestPath = join(outDir, "image.json");
  await writeIfChanged(manifestPath, `${JSON.stringify(composed, null, 1)}\n`);
  return { manifestPath, memoryMib: definition.memory_mib, packages };
}
