// The template registry with the REAL `sandfork-vmm image build`: build when missing, skip when
// up to date, rebuild when the manifest or a host file changes; the daemon's layout.
import { existsSync, readdirSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { TemplateBuildError } from "./template-definition.js";
import {
  discoverTemplateSources,
  ensureTemplate,
  refreshBuiltSnapshots,
  type TemplateSource,
} from "./templates.js";
import { requireVmmBinary } from "./testing/real-daemon.js";

let dir: string;
let source: TemplateSource;
let hostFile: string;
let templatesDir: string;

async function writeManifest(extra: Record<string, unknown> = {}): Promise<void> {
  await writeFile(
    source.manifestPath,
    JSON.stringify({
      name: "tiny",
      paths: [{ host: hostFile, guest: "/data/hello.txt" }],
      ...extra,
    }),
  );
}

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "sfk-tpl-"));
  await mkdir(join(dir, "sources", "tiny"), { recursive: true });
  hostFile = join(dir, "hello.txt");
  await writeFile(hostFile, "hello\n");
  source = { name: "tiny", manifestPath: join(dir, "sources", "tiny", "image.json") };
  templatesDir = join(dir, "built");
  await writeManifest();
});

afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("template images", () => {
  it("finds every folder with an image.json", async () => {
    await mkdir(join(dir, "sources", "not-a-template"));
    expect(discoverTemplateSources(join(dir, "sources"))).toEqual([source]);
    expect(discoverTemplateSources("templates")).toEqual([
      expect.objectContaining({
        name: "node",
        manifestPath: join("templates", "node", "image.json"),
      }),
      expect.objectContaining({
        name: "python",
        manifestPath: join("templates", "python", "image.json"),
      }),
      expect.objectContaining({
        name: "python-data",
        definitionPath: join("templates", "python-data", "template.json"),
      }),
    ]);
  });

  it("runs a source folder's prepare.sh before building: it makes the host files the manifest names", async () => {
    const made = join(dir, "sources", "tiny", "made.txt");
    await writeFile(
      join(dir, "sources", "tiny", "prepare.sh"),
      `echo prepared > ${JSON.stringify(made)}\n`,
    );
    await writeManifest({ paths: [{ host: "made.txt", guest: "/data/made.txt" }] });
    const built = await ensureTemplate(source, { binary: requireVmmBinary(), templatesDir });
    expect(built).toMatchObject({ action: "built" });
    expect(existsSync(made)).toBe(true);
    await writeFile(join(dir, "sources", "tiny", "prepare.sh"), "exit 3\n");
    await expect(
      ensureTemplate(source, { binary: requireVmmBinary(), templatesDir }),
    ).rejects.toThrow(/tiny: prepare.sh failed/);
  });

  it("builds a missing image into <dir>/<name>, then finds it up to date", async () => {
    const log: string[] = [];
    const binary = requireVmmBinary();
    const first = await ensureTemplate(source, { binary, templatesDir, log: (l) => log.push(l) });
    expect(first).toMatchObject({
      action: "built",
      reason: "no image yet",
      dir: join(templatesDir, "tiny"),
    });
    expect(readdirSync(first.dir).sort()).toEqual(["build.json", "image.data", "image.index"]);
    // Only the finished folder is left: the daemon never sees a half-built one.
    expect(readdirSync(templatesDir)).toEqual(["tiny"]);
    expect(log.join("\n")).toMatch(
      /template tiny: building its image .*\(no image yet\)[\s\S]*image "tiny"[\s\S]*image ready in/,
    );
    // "tiny" has no in-VM agent, so it cannot be snapshotted; the image stays usable.
    expect(first.snapshot).toEqual({
      ready: false,
      detail: expect.stringContaining("is named `tiny`, which is not a runtime"),
    });

    const second = await ensureTemplate(source, { binary, templatesDir });
    expect(second).toMatchObject({ action: "up-to-date" });
  });

  it("rebuilds when the manifest, a host file or the request says so", async () => {
    const binary = requireVmmBinary();
    await ensureTemplate(source, { binary, templatesDir });

    await writeManifest({ writable_dirs: ["/tmp"] });
    expect(await ensureTemplate(source, { binary, templatesDir })).toMatchObject({
      action: "built",
      reason: "the manifest changed",
    });

    await writeFile(hostFile, "hello again\n");
    await utimes(hostFile, new Date(), new Date(Date.now() + 5_000));
    expect(await ensureTemplate(source, { binary, templatesDir })).toMatchObject({
      action: "built",
      reason: expect.stringContaining("host files"),
    });

    expect(await ensureTemplate(source, { binary, templatesDir, force: true })).toMatchObject({
      action: "built",
    });
    expect(await ensureTemplate(source, { binary, templatesDir })).toMatchObject({
      action: "up-to-date",
    });
    expect(readdirSync(templatesDir)).toEqual(["tiny"]);
  });

  it("a failed build leaves the previous image in place and says why", async () => {
    const binary = requireVmmBinary();
    const built = await ensureTemplate(source, { binary, templatesDir });
    await writeManifest({ no_such_key: true });
    await expect(ensureTemplate(source, { binary, templatesDir })).rejects.toThrow(
      /image build --manifest .* failed \(exit code 1\)/,
    );
    expect(readdirSync(templatesDir)).toEqual(["tiny"]);
    expect(existsSync(join(built.dir, "image.index"))).toBe(true);
  });

  it("an image over maxImageBytes fails the image step and serves nothing", async () => {
    const binary = requireVmmBinary();
    const failure = await ensureTemplate(source, {
      binary,
      templatesDir,
      maxImageBytes: 1000,
    }).catch((error: unknown) => error);
    expect(failure).toBeInstanceOf(TemplateBuildError);
    expect(failure).toMatchObject({ step: "image" });
    expect((failure as Error).message).toMatch(
      /^the image is [\d.]+ MiB \(\d+ bytes\), over the limit of 0\.0 MiB \(1000 bytes\)$/,
    );
    expect(readdirSync(templatesDir)).toEqual([]);
    const fits = await ensureTemplate(source, { binary, templatesDir, maxImageBytes: 1 << 20 });
    expect(fits.action).toBe("built");
  });

  it("snapshots the python template when /dev/kvm works, and says why not when it does not", {
    timeout: 60_000,
  }, async () => {
    const python = discoverTemplateSources("templates").find((t) => t.name === "python");
    if (python === undefined) throw new Error("templates/python/image.json is missing");
    const log: string[] = [];
    const built = await ensureTemplate(python, {
      binary: requireVmmBinary(),
      templatesDir,
      log: (l) => log.push(l),
    });
    const snapshotFile = join(built.dir, "template.sfsnap");
    if (existsSync("/dev/kvm")) {
      expect(built.snapshot).toEqual({ ready: true, detail: `snapshot in ${snapshotFile}` });
      expect(existsSync(snapshotFile)).toBe(true);
    } else {
      expect(built.snapshot.ready).toBe(false);
      expect(built.snapshot.detail).toMatch(
        /needs KVM: \/dev\/kvm is missing.*the daemon boots the agent per request$/,
      );
      expect(existsSync(snapshotFile)).toBe(false);
      expect(log.join("\n")).toContain(`template python: ${built.snapshot.detail}`);
    }
  });

  it("at start, snapshots again a built template no source names when its snapshot is unreadable", {
    timeout: 120_000,
  }, async () => {
    const binary = requireVmmBinary();
    // Built like one through the API: a folder of its own name, from the python manifest.
    const custom = { name: "custom-1", manifestPath: "templates/python/image.json" };
    const built = await ensureTemplate(custom, { binary, templatesDir });
    const snapshotFile = join(built.dir, "template.sfsnap");
    await writeFile(snapshotFile, "not a snapshot of this binary's format");
    // A source's folder is ensureTemplates' to keep up to date, not this.
    await mkdir(join(templatesDir, "python"), { recursive: true });
    // Nor is a session's saved state: no build makes it again.
    const saved = join(templatesDir, "from-session-1");
    await mkdir(saved, { recursive: true });
    await writeFile(join(saved, "saved-session.json"), '{"session": "s", "template": "python"}');
    await writeFile(join(saved, "template.sfsnap"), "a session's state");
    const log: string[] = [];
    const names = await refreshBuiltSnapshots("templates", {
      binary,
      templatesDir,
      log: (l) => log.push(l),
    });
    expect(names).toEqual(["custom-1"]);
    expect(await readFile(join(saved, "template.sfsnap"), "utf8")).toBe("a session's state");
    if (existsSync("/dev/kvm")) {
      const rebuilt = await readFile(snapshotFile);
      expect(rebuilt.toString("latin1")).not.toContain("not a snapshot");
      expect(rebuilt.length).toBeGreaterThan(1 << 20);
    } else {
      // Without KVM it cannot be rebuilt: removed, so that the daemon still starts.
      expect(existsSync(snapshotFile)).toBe(false);
      expect(log.join("\n")).toContain("template custom-1: no snapshot");
    }
  });

  it("a missing binary is an error naming the build command", async () => {
    await expect(
      ensureTemplate(source, { binary: join(dir, "no-binary"), templatesDir }),
    ).rejects.toThrow(/cargo build --release/);
  });
});
