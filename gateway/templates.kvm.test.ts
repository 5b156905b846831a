// Templates built through the API on KVM: the gateway on PGlite and the supervised daemon as
// `npm start` wires them, POST /v1/templates building a template from the python one with a
// Debian package the python template lacks (python3-yaml, installed on this host) and a wheel
// this test writes, an execution using it, builds that fail (a package not installed, a setup
// program that raises) with their step and why, two versions side by side (the second built by
// the `sandfork` command line over HTTP on loopback), and another account refused.
//
// Run by scripts/kvm-tier.sh with vitest.kvm.config.ts; waits are multiplied by
// SANDFORK_TEST_TIME_SCALE.
import { execFile, execFileSync } from "node:child_process";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { serve } from "@hono/node-server";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Sandfork, type TemplateBuild, type TemplateBuildEvent } from "../client/index.js";
import type { StartedRuntime } from "../runtime/start.js";
import { timeScale } from "./testing/kvm-tier.js";
import { startPythonGateway } from "./testing/python-gateway.js";
import { expectProblem, type TestGateway } from "./testing/test-gateway.js";

const CREDITS = 100_000;
const HOST_PYTHON = "/usr/bin/python3.11";
const CLI = fileURLToPath(new URL("../bin/sandfork.mjs", import.meta.url));
const BUILD_TIMEOUT_MS = 180_000 * timeScale;

let dir: string;
let runtime: StartedRuntime;
let gw: TestGateway;
let server: ReturnType<typeof serve>;
let url: string;
const log: string[] = [];

/** A pure-Python wheel of package `sfkwheel` whose VALUE is `value`, written to `dir`. */
async function buildWheel(at: string, value: number): Promise<string> {
  const root = join(at, `wheel-${value}`);
  const info = join(root, "sfkwheel-1.0.dist-info");
  await mkdir(join(root, "sfkwheel"), { recursive: true });
  await mkdir(info, { recursive: true });
  await writeFile(join(root, "sfkwheel", "__init__.py"), `VALUE = ${value}\n`);
  await writeFile(join(info, "METADATA"), "Metadata-Version: 2.1\nName: sfkwheel\nVersion: 1.0\n");
  await writeFile(
    join(info, "WHEEL"),
    "Wheel-Version: 1.0\nGenerator: sandfork-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
  );
  await writeFile(join(info, "RECORD"), "");
  const wheel = join(at, `sfkwheel-1.0-${value}-py3-none-any.whl`);
  execFileSync(HOST_PYTHON, ["-I", "-m", "zipfile", "-c", wheel, join(root, "sfkwheel"), info]);
  return wheel;
}

function clientFor(key: string): Sandfork {
  return new Sandfork({ baseUrl: url, apiKey: key });
}

/** Follows build `id` of `name` over SSE to its end: the events, the last being the build. */
async function follow(client: Sandfork, name: string, id: string): Promise<TemplateBuildEvent[]> {
  const events: TemplateBuildEvent[] = [];
  for await (const event of client.followTemplateBuild(name, id, {
    signal: AbortSignal.timeout(BUILD_TIMEOUT_MS),
  }))
    events.push(event);
  return events;
}

const finalBuild = (events: TemplateBuildEvent[]): TemplateBuild => {
  const last = events.at(-1);
  if (last?.event !== "build") throw new Error(`no final build event: ${JSON.stringify(events)}`);
  return last.build;
};

async function run(key: string, template: string, code: string) {
  const response = await gw.call("POST", "/v1/executions", {
    credential: key,
    body: { template, code },
  });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

/** Prints whether the setup program's imports were in the snapshot, the wheel's value and the env. */
const USE_BOTH = [
  "import os, sys",
  "imported = 'yaml' in sys.modules and 'sfkwheel' in sys.modules",
  "import yaml, sfkwheel",
  "print(yaml.safe_dump({'value': sfkwheel.VALUE, 'warm': os.environ['SFK_WARM'], 'imported': imported}), end='')",
].join("\n");

let owner: { key: string; accountId: string };
let stranger: { key: string; accountId: string };
let admin: { key: string };
let wheelOne: string;
let firstBuild: TemplateBuild;

beforeAll(async () => {
  expect(
    execFileSync("dpkg", ["-s", "python3-yaml"]).toString(),
    "python3-yaml must be installed on this host",
  ).toContain("Status: install ok installed");
  dir = await mkdtemp(join(tmpdir(), "sfk-templates-"));
  ({ runtime, gw } = await startPythonGateway(dir, log, { dataDir: dir }));
  server = await new Promise<ReturnType<typeof serve>>((resolve) => {
    const s = serve({ fetch: gw.app.fetch, hostname: "127.0.0.1", port: 0 }, () => resolve(s));
  });
  const address = server.address();
  if (typeof address !== "object" || address === null) throw new Error("no address");
  url = `http://127.0.0.1:${address.port}`;
  const bodyLimit = { maxBodyBytes: 8 * 1024 * 1024 };
  owner = await gw.issue({ scopes: ["execute", "templates"], credits: CREDITS, ...bodyLimit });
  stranger = await gw.issue({ scopes: ["execute", "templates"], credits: CREDITS, ...bodyLimit });
  admin = await gw.issue({ scopes: ["admin"], credits: CREDITS });
  wheelOne = await buildWheel(dir, 42);
});

afterAll(async () => {
  await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
  await gw?.dispose();
  await runtime?.stop();
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

/** The definition of yamltool at `version` with `wheel`. */
async function yamlTool(version: string, wheel: string) {
  const { readFile } = await import("node:fs/promises");
  return {
    name: "yamltool",
    version,
    base: "python",
    debian_packages: ["python3-yaml"],
    wheels: [
      {
        filename: "sfkwheel-1.0-py3-none-any.whl",
        content_base64: (await readFile(wheel)).toString("base64"),
      },
    ],
    env: { SFK_WARM: "yes" },
    files: [{ path: "/etc/sfk-marker", content: "marker\n" }],
    setup: "import yaml, sfkwheel\n",
  };
}

describe("templates built through the API, on KVM", () => {
  it(
    "builds a template with python3-yaml and an uploaded wheel, streamed step by step, and runs it",
    async () => {
      const client = clientFor(owner.key);
      const queued = await client.buildTemplate(await yamlTool("1", wheelOne));
      expect(queued).toMatchObject({ name: "yamltool", version: "1", status: "queued" });
      const events = await follow(client, "yamltool", queued.id);
      firstBuild = finalBuild(events);
      expect(firstBuild, firstBuild.logs).toMatchObject({ status: "ready", error: null });
      const steps = events.flatMap((e) => (e.event === "step" ? [e.step] : []));
      expect(steps).toEqual(expect.arrayContaining(["packages", "image", "snapshot", "load"]));
      expect(firstBuild.logs).toContain("python3-yaml");
      expect(firstBuild.image_bytes).toBeGreaterThan(0);
      expect(firstBuild.snapshot_bytes).toBeGreaterThan(0);
      // The figure docs/benchmarks.md quotes (build of a one-package template).
      console.log(`[template build] ${firstBuild.logs.trim().split("\n").at(-1)}`);
      // Same run, for comparison: the python template's own image build at start (when not
      // linked from the KVM tier's).
      const base = log.find((line) => line.startsWith("template python: image ready"));
      if (base !== undefined) console.log(`[template build, baseline] ${base}`);

      for (const template of ["yamltool@1", "yamltool"]) {
        const { status, body } = await run(owner.key, template, USE_BOTH);
        expect(status, JSON.stringify(body)).toBe(200);
        expect(body).toMatchObject({
          template,
          status: "completed",
          stdout: "imported: true\nvalue: 42\nwarm: 'yes'\n",
        });
      }
      const marker = await run(
        owner.key,
        "yamltool@1",
        "print(open('/etc/sfk-marker').read(), end='')",
      );
      expect(marker.body).toMatchObject({ stdout: "marker\n" });
      // The python template has neither.
      const plain = await run(owner.key, "python", "import yaml");
      expect(plain.body.stderr).toContain("ModuleNotFoundError");

      const listed = (await (
        await gw.call("GET", "/v1/templates", { credential: owner.key })
      ).json()) as { templates: { name: string }[]; custom_templates: Record<string, unknown>[] };
      expect(listed.templates.map((t) => t.name)).toEqual(["python"]);
      expect(listed.custom_templates).toEqual([
        expect.objectContaining({ ref: "yamltool@1", status: "ready", own: true }),
      ]);
    },
    BUILD_TIMEOUT_MS,
  );

  it(
    "a second version, built by the sandfork command line, runs beside the first; versions are immutable",
    async () => {
      const wheelTwo = await buildWheel(dir, 43);
      const setup = join(dir, "setup.py");
      await writeFile(setup, "import yaml, sfkwheel\n");
      const file = join(dir, "yamltool.json");
      await writeFile(
        file,
        JSON.stringify({
          name: "yamltool",
          base: "python",
          debian_packages: ["python3-yaml"],
          wheels: [wheelTwo],
          env: { SFK_WARM: "two" },
          setup: "setup.py",
        }),
      );
      const cli = await promisify(execFile)(
        process.execPath,
        [CLI, "template", "build", file, "--version", "2"],
        {
          env: { ...process.env, SANDFORK_URL: url, SANDFORK_API_KEY: owner.key },
          timeout: BUILD_TIMEOUT_MS,
        },
      );
      expect(cli.stdout).toMatch(
        /^yamltool@2 ready in [\d.]+ s: image [\d.]+ MiB, snapshot [\d.]+ MiB\n$/,
      );
      expect(cli.stderr).toContain("step: snapshot");
      console.log(`[template build, CLI] ${cli.stdout.trim()}`);

      const code = "import sfkwheel, os; print(sfkwheel.VALUE, os.environ['SFK_WARM'])";
      expect((await run(owner.key, "yamltool@1", code)).body.stdout).toBe("42 yes\n");
      expect((await run(owner.key, "yamltool@2", code)).body.stdout).toBe("43 two\n");
      expect((await run(owner.key, "yamltool", code)).body.stdout).toBe("43 two\n");

      const again = await gw.call("POST", "/v1/templates", {
        credential: owner.key,
        body: await yamlTool("1", wheelOne),
      });
      const problem = await expectProblem(again, 409, "template-version-exists");
      expect(problem).toMatchObject({ build_id: firstBuild.id, retryable: false });
    },
    BUILD_TIMEOUT_MS,
  );

  it(
    "a package not installed on the host fails at the packages step, naming it",
    async () => {
      const client = clientFor(owner.key);
      const queued = await client.buildTemplate({
        name: "broken",
        version: "1",
        base: "python",
        debian_packages: ["python3-sfk-not-a-package"],
      });
      const build = finalBuild(await follow(client, "broken", queued.id));
      expect(build).toMatchObject({ status: "failed", step: "packages" });
      expect(build.error).toContain("python3-sfk-not-a-package");
      expect(build.logs).toContain("failed at step packages");
      expect((await run(owner.key, "broken@1", "print(1)")).status).toBe(422);
    },
    BUILD_TIMEOUT_MS,
  );

  it(
    "a setup program that raises fails at the snapshot step with its traceback",
    async () => {
      const client = clientFor(owner.key);
      const queued = await client.buildTemplate({
        name: "raises",
        version: "1",
        base: "python",
        setup: "def load():\n    raise ValueError('the data file is missing')\nload()\n",
      });
      const build = finalBuild(await follow(client, "raises", queued.id));
      expect(build, build.logs).toMatchObject({ status: "failed", step: "snapshot" });
      expect(build.error).toContain("setup program failed");
      expect(build.error).toContain("Traceback");
      expect(build.error).toContain("ValueError: the data file is missing");
    },
    BUILD_TIMEOUT_MS,
  );

  it("another account sees none of it, until an admin publishes; the owner deletes it", async () => {
    const path = `/v1/templates/yamltool/builds/${firstBuild.id}`;
    await expectProblem(await gw.call("GET", path, { credential: stranger.key }), 404, "not-found");
    await expectProblem(
      await gw.call("DELETE", "/v1/templates/yamltool@1", { credential: stranger.key }),
      404,
      "not-found",
    );
    for (const template of ["yamltool@1", "yamltool", `tpl-${firstBuild.id}`])
      expect((await run(stranger.key, template, "print(1)")).status).toBe(422);
    const listed = (await (
      await gw.call("GET", "/v1/templates", { credential: stranger.key })
    ).json()) as { custom_templates: unknown[] };
    expect(listed.custom_templates).toEqual([]);
    // A key without the templates scope builds nothing.
    const plain = await gw.issue({ credits: CREDITS, accountId: owner.accountId });
    await expectProblem(
      await gw.call("POST", "/v1/templates", {
        credential: plain.key,
        body: { name: "x", version: "1", base: "python" },
      }),
      403,
      "insufficient-scope",
    );

    const published = await gw.call("POST", "/v1/templates/yamltool@1/publish", {
      credential: admin.key,
      body: { published: true },
    });
    // The admin's own account has no yamltool@1: publishing finds the owner's.
    expect(published.status, await published.clone().text()).toBe(200);
    expect((await run(stranger.key, "yamltool@1", USE_BOTH)).body.stdout).toContain("value: 42");

    const deleted = await gw.call("DELETE", "/v1/templates/yamltool@1", {
      credential: owner.key,
    });
    expect(deleted.status).toBe(204);
    expect((await run(owner.key, "yamltool@1", "print(1)")).status).toBe(422);
    expect(
      (await run(owner.key, "yamltool", "import sfkwheel; print(sfkwheel.VALUE)")).body.stdout,
    ).toBe("43\n");
    const daemonTemplates = await runtime.client.templates();
    expect(daemonTemplates.map((t) => t.name)).not.toContain(`tpl-${firstBuild.id}`);
  });
});
