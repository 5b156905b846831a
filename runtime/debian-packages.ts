// Debian packages installed on the build host, as a template definition names them: which
// packages a list needs (its Python, data and font dependencies, followed through Depends and
// Pre-Depends) and the files they installed. Read from dpkg's own database
// (/var/lib/dpkg/status and info/<package>.list), never by running a package manager.
//
// Shared libraries are not followed here: `sandfork-vmm image build` adds every ELF file's
// libraries itself, as ld.so would find them.
import { existsSync, lstatSync, readFileSync, type Stats } from "node:fs";
import { join } from "node:path";

export const DPKG_DIR = "/var/lib/dpkg";

/** Dependencies of these kinds are part of what a listed package needs at run time. */
const FOLLOWED_DEPENDENCY = /^(python3-|python-|fonts-)/;
/** The interpreter's own packages: the base template already holds Python. */
const INTERPRETER_PACKAGES =
  /^(python3|python3-minimal|python3\.\d+(-minimal)?|libpython3.*|python3-all.*|python3-dev|python3-distutils|python3-lib2to3)$/;
/** What a template never needs from a package. */
const UNUSED_PREFIXES = [
  "/usr/share/doc/",
  "/usr/share/man/",
  "/usr/share/lintian/",
  "/usr/share/bug/",
  "/usr/share/info/",
];

interface InstalledPackage {
  name: string;
  /** `Architecture` (its .list file is named `name:arch.list` for Multi-Arch: same ones). */
  architecture: string;
  /** Alternatives of each dependency, names only. */
  depends: string[][];
  /** Names this package also answers to (virtual packages). */
  provides: string[];
}

export class PackageError extends Error {}

/** The installed packages of dpkg's status file, by name and by what they provide. */
export class PackageDatabase {
  private readonly byName = new Map<string, InstalledPackage>();
  private readonly providers = new Map<string, InstalledPackage>();

  constructor(private readonly dpkgDir = DPKG_DIR) {
    const status = readFileSync(join(dpkgDir, "status"), "utf8");
    for (const paragraph of status.split(/\n\n+/)) {
      const fields = parseParagraph(paragraph);
      if (!fields.Package || !/ installed$/.test(fields.Status ?? "")) continue;
      const names = (text: string | undefined) =>
        (text ?? "")
          .split(",")
          .map((dependency) =>
            dependency
              .split("|")
              .map((alternative) => alternative.trim().split(/[\s(:]/)[0] ?? "")
              .filter((name) => name !== ""),
          )
          .filter((alternatives) => alternatives.length > 0);
      const installed: InstalledPackage = {
        name: fields.Package,
        architecture: fields.Architecture ?? "all",
        depends: [...names(fields["Pre-Depends"]), ...names(fields.Depends)],
        provides: names(fields.Provides).flat(),
      };
      this.byName.set(installed.name, installed);
      for (const provided of installed.provides)
        if (!this.providers.has(provided)) this.providers.set(provided, installed);
    }
  }

  /** The package installed under `name`, or the one providing it. */
  find(name: string): InstalledPackage | undefined {
    return this.byName.get(name) ?? this.providers.get(name);
  }

  /**
   * `names` and the Python, data and font packages they depend on, transitively, without the
   * interpreter's packages and without those in `skip` (and what only they needed). Every name
   * in `names` must be installed.
   */
  closure(names: string[], skip: string[] = []): string[] {
    const missing = names.filter((name) => this.find(name) === undefined);
    if (missing.length > 0)
      throw new PackageError(
        `Debian package${missing.length > 1 ? "s" : ""} ${missing.join(", ")} ${missing.length > 1 ? "are" : "is"} not installed on the build host (install with apt-get install ${missing.join(" ")})`,
      );
    const skipped = new Set(skip);
    const included = new Set<string>();
    const queue = names.map((name) => this.find(name) as InstalledPackage);
    for (let next = queue.shift(); next !== undefined; next = queue.shift()) {
      if (included.has(next.name) || skipped.has(next.name)) continue;
      if (INTERPRETER_PACKAGES.test(next.name)) continue;
      included.add(next.name);
      for (const alternatives of next.depends) {
        const installed = alternatives
          .filter((name) => FOLLOWED_DEPENDENCY.test(name))
          .map((name) => this.find(name))
          .find((found) => found !== undefined);
        if (installed !== undefined) queue.push(installed);
      }
    }
    return [...included].sort();
  }

  /**
   * The files and symlinks `name` installed (not its directories), without documentation, and
   * with the bytecode folder beside every Python source: Debian compiles it at installation, so
   * dpkg does not list it, and the guest (which writes no bytecode) would compile on every import.
   */
  files(name: string): string[] {
    const installed = this.find(name);
    if (installed === undefined) throw new PackageError(`Debian package ${name} is not installed`);
    const list = [
      join(this.dpkgDir, "info", `${installed.name}.list`),
      join(this.dpkgDir, "info", `${installed.name}:${installed.architecture}.list`),
    ].find((path) => existsSync(path));
    if (list === undefined)
      throw new PackageError(`dpkg has no file list for the installed package ${installed.name}`);
    const paths = new Set<string>();
    for (const path of readFileSync(list, "utf8").split("\n")) {
      if (path === "" || UNUSED_PREFIXES.some((prefix) => path.startsWith(prefix))) continue;
      const stat = lstatIfPresent(path);
      // Directories are listed for their files (a listed one would be included whole).
      if (stat === undefined || stat.isDirectory()) continue;
      paths.add(path);
      const bytecode = join(path, "..", "__pycache__");
      if (path.endsWith(".py") && lstatIfPresent(bytecode)?.isDirectory()) paths.add(bytecode);
    }
    return [...paths].sort();
  }
}

function lstatIfPresent(path: string): Stats | undefined {
  try {
    return lstatSync(path);
  } catch {
    return undefined;
  }
}

/** A control-file paragraph's fields (continuation lines joined). */
function parseParagraph(paragraph: string): Record<string, string> {
  const fields: Record<string, string> = {};
  let current: string | undefined;
  for (const line of paragraph.split("\n")) {
    if (/^\s/.test(line) && current !== undefined) fields[current] += `\n${line.trim()}`;
    else {
      const colon = line.indexOf(":");
      if (colon <= 0) continue;
      current = line.slice(0, colon);
      fields[current] = line.slice(colon + 1).trim();
    }
  }
  return fields;
}
