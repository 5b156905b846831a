// Templates built through the API, with a TEST DOUBLE of the runtime (it builds nothing: each
// build answers what the test scripts, after the gateway wrote the build folder): the
// definition's schema, the build job's statuses and its failure, versions (immutable, `name` is
// the newest), which account sees what, the names executions reach the runtime with, deletion.
// Both databases. templates.kvm.test.ts builds real ones.
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BACKENDS } from "../db/testing/fresh-database.js";
import type {
  BuiltTemplate,
  ExecutionRequest,
  ExecutionResult,
  ExecutionRuntime,
  Template,
  TemplateBuildRequest,
  TemplateBuilds,
} from "../runtime/execution-runtime.js";
import { TemplateBuildError } from "../runtime/template-definition.js";
import { expectProblem, startTestGateway, type TestGateway } from "./testing/test-gateway.js";

const PYTHON: Template = {
  name: "python",
  language: "python",
  languages: ["python"],
  contentHash: "c0ffee",
  ready: true,
};

/** Test double: serves python and whatever it "built"; records executions and builds. */
class BuildingRuntimeTestDouble implements ExecutionRuntime, TemplateBuilds {
  readonly executed: ExecutionRequest[] = [];
  readonly built: { name: string; definition: Record<string, unknown> }[] = [];
  readonly removed: string[] = [];
  private readonly served = new Set<string>();
  /** What the next builds do; default: succeed. */
  outcome: (request: TemplateBuildRequest) => Promise<BuiltTemplate> = async () => ({
    imageBytes: 1000,
    snapshotBytes: 2000,
    packages: [],
  });
  readonly templateBuilds = this;

  async execute(request: ExecutionRequest): Promise<ExecutionResult> {
    this.executed.push(request);
    return {
      outcome: "completed",
      exitCode: 0,
      stdout: `ran on ${request.template}\n`,
      stderr: "",
      truncated: false,
      timings: { queueMs: 0, forkMs: 1, execMs: 1 },
    };
  }
  async templates(): Promise<Template[]> {
    return [PYTHON, ...[...this.served].map((name) => ({ ...PYTHON, name }))];
  }
  async build(request: TemplateBuildRequest): Promise<BuiltTemplate> {
    const definition = JSON.parse(await readFile(request.definitionPath, "utf8"));
    this.built.push({ name: request.name, definition });
    request.onStep("packages");
    request.log("a line of the build");
    const built = await this.outcome(request);
    this.served.add(request.name);
    return built;
  }
  async remove(name: string): Promise<void> {
    this.removed.push(name);
    this.served.delete(name);
  }
}

interface BuildBody {
  id: string;
  name: string;
  version: string;
  status: string;
  step: string | null;
  error: string | null;
  logs: string;
}

describe.each(BACKENDS)("templates built through the API on %s", (backend) => {
  let gw: TestGateway;
  let runtime: BuildingRuntimeTestDouble;
  let dataDir: string;
  beforeAll(async () => {
    dataDir = await mkdtemp(join(tmpdir(), "sfk-templates-unit-"));
    runtime = new BuildingRuntimeTestDouble();
    gw = await startTestGateway(backend, { runtime, config: { dataDir } });
  });
  afterAll(async () => {
    await gw?.dispose();
    await rm(dataDir, { recursive: true, force: true });
  });

  const definition = (name: string, version: string, extra: Record<string, unknown> = {}) => ({
    name,
    version,
    base: "python",
    ...extra,
  });

  /** Posts a definition and polls its build to its end. */
  async function build(key: string, body: unknown): Promise<BuildBody> {
    const response = await gw.call("POST", "/v1/templates", { credential: key, body });
    const text = await response.text();
    expect(response.status, text).toBe(202);
    const queued = JSON.parse(text) as BuildBody;
    expect(response.headers.get("location")).toBe(
      `/v1/templates/${queued.name}/builds/${queued.id}`,
    );
    for (let i = 0; i < 200; i++) {
      const polled = (await (
        await gw.call("GET", `/v1/templates/${queued.name}/builds/${queued.id}`, {
          credential: key,
        })
      ).json()) as BuildBody;
      if (polled.status === "ready" || polled.status === "failed") return polled;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    throw new Error("the build did not end");
  }

  const run = async (key: string, template: string) => {
    const response = await gw.call("POST", "/v1/executions", {
      credential: key,
      body: { template, code: "print(1)" },
    });
    return { status: response.status, body: (await response.json()) as Record<string, unknown> };
  };

  it("refuses definitions that do not match the schema, host paths among them", async () => {
    const { key } = await gw.issue({ scopes: ["templates"] });
    const cases: [unknown, string][] = [
      [definition("Bad_Name", "1"), "name"],
      [definition("ok", "1 2"), "version"],
      [{ ...definition("ok", "1"), files: [{ host: "/etc/passwd", guest: "/etc/x" }] }, "files.0"],
      [{ ...definition("ok", "1"), files: [{ path: "/work/x", content: "x" }] }, "files.0.path"],
      [
        { ...definition("ok", "1"), files: [{ path: "/opt/sandfork/env.json", content: "{}" }] },
        "files.0.path",
      ],
      [
        {
          ...definition("ok", "1"),
          files: [{ path: "/etc/x", content: "%%", encoding: "base64" }],
        },
        "files.0.content",
      ],
      [{ ...definition("ok", "1"), wheels: ["/tmp/x.whl"] }, "wheels.0"],
      [
        { ...definition("ok", "1"), wheels: [{ filename: "x.zip", content_base64: "" }] },
        "wheels.0.filename",
      ],
      [{ ...definition("ok", "1"), setup: 7 }, "setup"],
      [{ ...definition("ok", "1"), memory_mib: 8 }, "memory_mib"],
      [{ ...definition("ok", "1"), debian_packages: ["../etc"] }, "debian_packages.0"],
      [{ ...definition("ok", "1"), host_dir: "/" }, ""],
    ];
    for (const [body, path] of cases) {
      const problem = await expectProblem(
        await gw.call("POST", "/v1/templates", { credential: key, body }),
        422,
        "validation-failed",
      );
      const errors = problem.errors as { path: string }[];
      expect(
        errors.some((e) => e.path === path || e.path.startsWith(`${path}.`) || path === ""),
        JSON.stringify(problem),
      ).toBe(true);
    }
    expect(runtime.built).toEqual([]);
  });

  it("needs the templates scope, and a name no built-in template has", async () => {
    const { key } = await gw.issue();
    await expectProblem(
      await gw.call("POST", "/v1/templates", { credential: key, body: definition("t", "1") }),
      403,
      "insufficient-scope",
    );
    const builder = await gw.issue({ scopes: ["templates"] });
    await expectProblem(
      await gw.call("POST", "/v1/templates", {
        credential: builder.key,
        body: definition("python", "1"),
      }),
      409,
      "template-name-taken",
    );
  });

  it("builds as a job, writes the definition with its files, and runs it by name@version and by name", async () => {
    const { key, accountId } = await gw.issue({ scopes: ["execute", "templates"], credits: 1000 });
    const wheel = Buffer.from("PK fake wheel").toString("base64");
    const first = await build(key, {
      ...definition("tool", "1"),
      debian_packages: ["python3-yaml"],
      wheels: [{ filename: "w-1.0-py3-none-any.whl", content_base64: wheel }],
      files: [{ path: "/etc/tool.conf", content: "k=v\n" }],
      env: { A: "1" },
      setup: "import yaml\n",
    });
    expect(first).toMatchObject({ status: "ready", step: null, error: null });
    expect(first.logs).toContain("step: packages\na line of the build\n");
    const [made] = runtime.built.slice(-1);
    expect(made?.name).toBe(`tpl-${first.id}`);
    expect(made?.definition).toEqual({
      base: "python",
      debian_packages: ["python3-yaml"],
      wheels: ["wheels/w-1.0-py3-none-any.whl"],
      files: [{ host: "files/0", guest: "/etc/tool.conf" }],
      env: { A: "1" },
      setup: "setup.py",
    });
    const folder = join(dataDir, "template-builds", first.id);
    expect(await readFile(join(folder, "wheels/w-1.0-py3-none-any.whl"), "utf8")).toBe(
      "PK fake wheel",
    );
    expect(await readFile(join(folder, "setup.py"), "utf8")).toBe("import yaml\n");

    const second = await build(key, definition("tool", "2"));
    expect(second.status).toBe("ready");
    // Versions are immutable.
    const again = await expectProblem(
      await gw.call("POST", "/v1/templates", { credential: key, body: definition("tool", "1") }),
      409,
      "template-version-exists",
    );
    expect(again.build_id).toBe(first.id);

    expect((await run(key, "tool@1")).body).toMatchObject({
      template: "tool@1",
      stdout: `ran on tpl-${first.id}\n`,
    });
    expect((await run(key, "tool")).body).toMatchObject({
      template: "tool",
      stdout: `ran on tpl-${second.id}\n`,
    });
    expect((await run(key, "python")).body.stdout).toBe("ran on python\n");
    // The runtime's names are not callers'.
    await expectProblem(
      await gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template: `tpl-${first.id}`, code: "1" },
      }),
      422,
      "unknown-template",
    );
    await expectProblem(
      await gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template: "tool@3", code: "1" },
      }),
      422,
      "unknown-template",
    );

    const listed = (await (await gw.call("GET", "/v1/templates", { credential: key })).json()) as {
      templates: { name: string }[];
      custom_templates: Record<string, unknown>[];
    };
    expect(listed.templates.map((t) => t.name)).toEqual(["python"]);
    expect(listed.custom_templates.map((t) => [t.ref, t.status, t.own])).toEqual([
      ["tool@2", "ready", true],
      ["tool@1", "ready", true],
    ]);

    // Another account: not found anywhere, cannot run, list or delete it.
    const other = await gw.issue({ scopes: ["execute", "templates"], credits: 1000 });
    expect(other.accountId).not.toBe(accountId);
    await expectProblem(
      await gw.call("GET", `/v1/templates/tool/builds/${first.id}`, { credential: other.key }),
      404,
      "not-found",
    );
    expect((await run(other.key, "tool@1")).status).toBe(422);
    expect((await run(other.key, "tool")).status).toBe(422);
    await expectProblem(
      await gw.call("DELETE", "/v1/templates/tool@1", { credential: other.key }),
      404,
      "not-found",
    );
    const theirs = (await (
      await gw.call("GET", "/v1/templates", { credential: other.key })
    ).json()) as { custom_templates: unknown[] };
    expect(theirs.custom_templates).toEqual([]);
    // Its own template of the same name is its own.
    const own = await build(other.key, definition("tool", "1"));
    expect((await run(other.key, "tool")).body.stdout).toBe(`ran on tpl-${own.id}\n`);
    expect((await run(key, "tool@1")).body.stdout).toBe(`ran on tpl-${first.id}\n`);

    // Published by an admin: visible to all; the other account's own still comes first.
    const admin = await gw.issue({ scopes: ["admin"] });
    await expectProblem(
      await gw.call("POST", "/v1/templates/tool@2/publish", {
        credential: key,
        body: { published: true },
      }),
      403,
      "insufficient-scope",
    );
    const published = await gw.call("POST", "/v1/templates/tool@2/publish", {
      credential: admin.key,
      body: { published: true },
    });
    expect(published.status).toBe(200);
    expect((await run(other.key, "tool@2")).body.stdout).toBe(`ran on tpl-${second.id}\n`);
    expect((await run(other.key, "tool")).body.stdout).toBe(`ran on tpl-${own.id}\n`);
    const third = await gw.issue({ credits: 1000 });
    expect((await run(third.key, "tool")).body.stdout).toBe(`ran on tpl-${second.id}\n`);

    // Deleted: the runtime stops serving it, the name resolves to what is left.
    const deleted = await gw.call("DELETE", "/v1/templates/tool@2", { credential: key });
    expect(deleted.status).toBe(204);
    expect(runtime.removed).toContain(`tpl-${second.id}`);
    expect((await run(key, "tool")).body.stdout).toBe(`ran on tpl-${first.id}\n`);
    expect((await run(third.key, "tool")).status).toBe(422);
  });

  it("a failed build names its step and why; the version may be built again", async () => {
    const { key } = await gw.issue({ scopes: ["execute", "templates"], credits: 1000 });
    runtime.outcome = async () => {
      throw new TemplateBuildError("packages", "python3-nope is not installed on the build host");
    };
    const failed = await build(key, definition("flaky", "1"));
    expect(failed).toMatchObject({
      status: "failed",
      step: "packages",
      error: "python3-nope is not installed on the build host",
    });
    expect(failed.logs).toContain("failed at step packages");
    expect(runtime.removed).toContain(`tpl-${failed.id}`);
    expect((await run(key, "flaky@1")).status).toBe(422);

    runtime.outcome = async () => ({ imageBytes: 1, snapshotBytes: 1, packages: [] });
    const rebuilt = await build(key, definition("flaky", "1"));
    expect(rebuilt.status).toBe("ready");
    expect(rebuilt.id).not.toBe(failed.id);
  });

  it("bounds the builds: one past the running and waiting ones is refused, retryable", async () => {
    const { key } = await gw.issue({ scopes: ["templates"] });
    const { maxRunning, maxQueued } = gw.config.templateBuilds;
    let release: () => void = () => {};
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    runtime.outcome = async () => {
      await held;
      return { imageBytes: 1, snapshotBytes: 1, packages: [] };
    };
    const ids: string[] = [];
    for (let i = 0; i < maxRunning + maxQueued; i++) {
      const response = await gw.call("POST", "/v1/templates", {
        credential: key,
        body: definition("busy", String(i)),
      });
      expect(response.status).toBe(202);
      ids.push(((await response.json()) as BuildBody).id);
    }
    const refused = await expectProblem(
      await gw.call("POST", "/v1/templates", { credential: key, body: definition("busy", "x") }),
      503,
      "template-builds-busy",
    );
    expect(refused.retryable).toBe(true);
    // A build in progress is not deleted under it.
    await expectProblem(
      await gw.call("DELETE", "/v1/templates/busy@0", { credential: key }),
      409,
      "template-in-use",
    );
    release();
    // All of them end, one after another.
    for (const id of ids)
      for (let i = 0; ; i++) {
        const polled = (await (
          await gw.call("GET", `/v1/templates/busy/builds/${id}`, { credential: key })
        ).json()) as BuildBody;
        if (polled.status === "ready") break;
        expect(i).toBeLessThan(500);
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
  });

  it("a runtime that cannot build answers 501", async () => {
    const { key } = await gw.issue({ scopes: ["templates"] });
    gw.runtime = {
      execute: runtime.execute.bind(runtime),
      templates: runtime.templates.bind(runtime),
    };
    try {
      await expectProblem(
        await gw.call("POST", "/v1/templates", { credential: key, body: definition("x", "1") }),
        501,
        "template-builds-unsupported",
      );
    } finally {
      gw.runtime = runtime;
    }
  });
});
