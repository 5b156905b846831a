// Template definitions composed into image manifests: packages from a dpkg database (a small
// one written here, in dpkg's own format), wheels unpacked by the host's Python, env and setup,
// and each refusal naming its step.
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { PackageDatabase } from "./debian-packages.js";
import {
  composeManifest,
  parseDefinition,
  patternRegExp,
  TemplateBuildError,
} from "./template-definition.js";

let dir: string;
let dpkg: string;
let sources: string;

/** A dpkg database holding `packages` (name, Depends, the files it installed, all created). */
function writeDpkg(packages: { name: string; depends?: string; files: string[] }[]): void {
  mkdirSync(join(dpkg, "info"), { recursive: true });
  const paragraphs = packages.map((p) =>
    [
      `Package: ${p.name}`,
      "Status: install ok installed",
      "Architecture: amd64",
      ...(p.depends ? [`Depends: ${p.depends}`] : []),
    ].join("\n"),
  );
  writeFileSync(join(dpkg, "status"), `${paragraphs.join("\n\n")}\n`);
  for (const p of packages) {
    const listed = ["/."];
    for (const file of p.files) {
      const host = join(dir, "root", file);
      mkdirSync(join(host, ".."), { recursive: true });
      writeFileSync(host, file);
      listed.push(join(dir, "root", file, ".."), host);
    }
    writeFileSync(join(dpkg, "info", `${p.name}:amd64.list`), `${listed.join("\n")}\n`);
  }
}

function expectStep(run: () => unknown, step: string, message: RegExp): void {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(TemplateBuildError);
    expect((error as TemplateBuildError).step).toBe(step);
    expect((error as Error).message).toMatch(message);
    return;
  }
  throw new Error("expected a TemplateBuildError");
}

async function expectBuildError(
  run: Promise<unknown>,
  step: string,
  message: RegExp,
): Promise<void> {
  const error = await run.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(TemplateBuildError);
  expect((error as TemplateBuildError).step).toBe(step);
  expect((error as Error).message).toMatch(message);
}

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "sfk-def-"));
  dpkg = join(dir, "dpkg");
  sources = join(dir, "sources");
  mkdirSync(join(sources, "python"), { recursive: true });
  writeFileSync(join(sources, "python", "agent.py"), "# agent\n");
  writeFileSync(
    join(sources, "python", "image.json"),
    JSON.stringify({
      name: "python",
      paths: ["/usr/bin/python3.11", { host: "agent.py", guest: "/opt/sandfork/agent.py" }],
      exclude: ["/usr/lib/python3.11/test"],
      writable_dirs: ["/tmp", "/work"],
    }),
  );
  writeDpkg([
    {
      name: "python3-top",
      depends: "python3-dep (>= 1), libfoo1, python3:any, python3-skipped",
      files: ["dist/top/__init__.py", "dist/top/tests/test_top.py"],
    },
    { name: "python3-dep", depends: "python3-deeper | python3-other", files: ["dist/dep.py"] },
    { name: "python3-deeper", files: ["dist/deeper.py"] },
    { name: "python3-skipped", files: ["dist/skipped.py"] },
    { name: "libfoo1", files: ["lib/libfoo.so.1"] },
  ]);
  mkdirSync(join(dir, "root", "dist", "top", "__pycache__"));
  writeFileSync(join(dir, "root", "dist", "top", "__pycache__", "__init__.cpython-311.pyc"), "");
});

afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

describe("Debian packages", () => {
  it("follows Python dependencies, not libraries, the interpreter or skipped ones", () => {
    const database = new PackageDatabase(dpkg);
    expect(database.closure(["python3-top"], ["python3-skipped"])).toEqual([
      "python3-deeper",
      "python3-dep",
      "python3-top",
    ]);
    expect(() => database.closure(["python3-top", "python3-absent"])).toThrow(
      /python3-absent is not installed on the build host \(install with apt-get install python3-absent\)/,
    );
  });

  it("lists a package's files and bytecode folders, never its directories", () => {
    const files = new PackageDatabase(dpkg).files("python3-top");
    expect(files).toEqual(
      ["dist/top/__init__.py", "dist/top/__pycache__", "dist/top/tests/test_top.py"].map((f) =>
        join(dir, "root", f),
      ),
    );
  });
});

describe("template definitions", () => {
  it("refuses unknown fields, bad paths, env names and memory with the definition step", () => {
    expectStep(
      () => parseDefinition('{"base": "python", "packages": []}', "t"),
      "definition",
      /unknown field packages/,
    );
    expectStep(() => parseDefinition("[]", "t"), "definition", /must be a JSON object/);
    expectStep(() => parseDefinition("{", "t"), "definition", /is not JSON/);
    expectStep(
      () =>
        parseDefinition('{"base": "python", "files": [{"host": "a", "guest": "/work/a"}]}', "t"),
      "definition",
      /writable folder/,
    );
    expectStep(
      () =>
        parseDefinition(
          '{"base": "python", "files": [{"host": "a", "guest": "/opt/sandfork/agent.py"}]}',
          "t",
        ),
      "definition",
      /which the agent owns/,
    );
    expectStep(
      () => parseDefinition('{"base": "python", "env": {"A B": "1"}}', "t"),
      "definition",
      /env/,
    );
    expectStep(
      () => parseDefinition('{"base": "python", "memory_mib": 8}', "t"),
      "definition",
      /memory_mib/,
    );
  });

  it("matches exclude patterns as the image builder does", () => {
    const tests = patternRegExp("/dist/**/tests/**");
    expect(tests.test("/dist/top/tests/test_top.py")).toBe(true);
    expect(tests.test("/dist/tests/x.py")).toBe(true);
    expect(tests.test("/dist/top/testsuite.py")).toBe(false);
    expect(patternRegExp("/a/*.py").test("/a/b/c.py")).toBe(false);
    expect(patternRegExp("/a/?.py").test("/a/b.py")).toBe(true);
  });

  it("composes the base manifest with packages, a wheel, files, env and setup", async () => {
    const wheelSource = join(dir, "wheel-src");
    mkdirSync(join(wheelSource, "hello"), { recursive: true });
    writeFileSync(join(wheelSource, "hello", "__init__.py"), "GREETING = 'hi'\n");
    const wheel = join(dir, "def", "hello-1.0-py3-none-any.whl");
    mkdirSync(join(dir, "def"));
    execFileSync("/usr/bin/python3.11", ["-m", "zipfile", "-c", wheel, join(wheelSource, "hello")]);
    writeFileSync(join(dir, "def", "setup.py"), "import hello\n");
    writeFileSync(join(dir, "def", "data.csv"), "a,b\n");
    writeFileSync(
      join(dir, "def", "template.json"),
      JSON.stringify({
        base: "python",
        debian_packages: ["python3-top"],
        exclude_packages: ["python3-skipped"],
        exclude: [`${dir}/root/dist/**/tests/**`],
        wheels: ["hello-1.0-py3-none-any.whl"],
        files: [{ host: "data.csv", guest: "/data/data.csv" }],
        env: { GREETING: "hi" },
        setup: "setup.py",
        memory_mib: 512,
      }),
    );
    const out = join(dir, "out");
    const composed = await composeManifest(
      join(dir, "def", "template.json"),
      sources,
      out,
      () => new PackageDatabase(dpkg),
    );
    expect(composed.memoryMib).toBe(512);
    expect(composed.packages).toEqual(["python3-deeper", "python3-dep", "python3-top"]);
    const manifest = JSON.parse(readFileSync(composed.manifestPath, "utf8"));
    expect(manifest.name).toBe("python");
    expect(manifest.writable_dirs).toEqual(["/tmp", "/work"]);
    const paths = manifest.paths as (string | { host: string; guest: string })[];
    expect(paths).toContainEqual({
      host: join(sources, "python", "agent.py"),
      guest: "/opt/sandfork/agent.py",
    });
    expect(paths).toContain(join(dir, "root", "dist", "top", "__init__.py"));
    expect(paths).toContain(join(dir, "root", "dist", "deeper.py"));
    expect(paths).not.toContain(join(dir, "root", "dist", "top", "tests", "test_top.py"));
    expect(paths).not.toContain(join(dir, "root", "dist", "skipped.py"));
    expect(paths).not.toContain(join(dir, "root", "lib", "libfoo.so.1"));
    expect(paths).toContainEqual({ host: join(dir, "def", "data.csv"), guest: "/data/data.csv" });
    expect(paths).toContainEqual({
      host: join(dir, "def", "setup.py"),
      guest: "/opt/sandfork/setup.py",
    });
    const wheelFile = paths.find(
      (p) => typeof p !== "string" && p.guest === "/opt/sandfork/site-packages/hello/__init__.py",
    ) as { host: string };
    expect(readFileSync(wheelFile.host, "utf8")).toBe("GREETING = 'hi'\n");
    const env = paths.find(
      (p) => typeof p !== "string" && p.guest === "/opt/sandfork/env.json",
    ) as {
      host: string;
    };
    expect(JSON.parse(readFileSync(env.host, "utf8"))).toEqual({ GREETING: "hi" });
  });

  it("says which step failed: an unknown base, a missing package, a broken wheel", async () => {
    const write = (definition: object) =>
      writeFileSync(join(dir, "template.json"), JSON.stringify(definition));
    const compose = () =>
      composeManifest(
        join(dir, "template.json"),
        sources,
        join(dir, "out"),
        () => new PackageDatabase(dpkg),
      );
    write({ base: "ruby" });
    await expectBuildError(compose(), "definition", /base template "ruby"/);
    write({ base: "python", debian_packages: ["python3-nonexistent"] });
    await expectBuildError(compose(), "packages", /python3-nonexistent is not installed/);
    writeFileSync(join(dir, "broken.whl"), "not a zip");
    write({ base: "python", wheels: ["broken.whl"] });
    await expectBuildError(compose(), "wheels", /broken.whl is not a valid wheel/);
    write({ base: "python", setup: "missing.py" });
    await expectBuildError(compose(), "definition", /missing.py: no such file/);
    symlinkSync("/nonexistent", join(dir, "gone.whl"));
    write({ base: "python", wheels: ["gone.whl"] });
    await expectBuildError(compose(), "wheels", /gone.whl/);
  });
});
