// End to end on KVM: the gateway as `npm start` wires it (runtime/start.ts, supervised mode) on
// its embedded database (PGlite): the REAL python and node templates built and snapshotted by
// `sandfork-vmm`, the REAL daemon under supervision serving from its warm pools, and POST
// /v1/executions running `print(6*7)`, JavaScript and TypeScript in KVM microVMs, then billing
// them. The KVM tier builds the node template once for all its suites and hands its folder over
// in SANDFORK_TEST_NODE_TEMPLATE_DIR (linked here, found up to date); without it, it is built.
//
// It needs a /dev/kvm that runs guests, so it is not part of the normal vitest run
// (vitest.config.ts excludes *.kvm.test.ts): scripts/kvm-tier.sh runs it with
// vitest.kvm.config.ts, on this machine's /dev/kvm or inside a QEMU guest that has one. Its
// waits are multiplied by SANDFORK_TEST_TIME_SCALE (1 native, ~15 in QEMU).
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { findExecution } from "../db/billing.js";
import { loadRuntimeConfig } from "../runtime/config.js";
import { type StartedRuntime, startRuntime } from "../runtime/start.js";
import { requireVmmBinary } from "../runtime/testing/real-daemon.js";
import { daemonMaxima } from "./config.js";
import {
  kvmExecutionLimits,
  scaledDaemonReadyEnv,
  templatesWithPrebuilt,
  timeScale,
} from "./testing/kvm-tier.js";
import { expectProblem, startTestGateway, type TestGateway } from "./testing/test-gateway.js";

const CREDITS = 100_000;
let dir: string;
let runtime: StartedRuntime;
let gw: TestGateway;
const log: string[] = [];

// Start-up builds python and python-data, whose snapshot boot imports pandas, SciPy and
// scikit-learn: longer than the tier's hook timeout on a busy host.
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "sfk-e2e-"));
  // Node from the tier; python built here: the first test checks that start-up built it.
  await templatesWithPrebuilt(dir, ["node"]);
  const env = {
    SANDFORK_VMM_BIN: requireVmmBinary(),
    SANDFORK_VMM_CONNECTIONS: "2",
    SANDFORK_VMM_SERVE_ARGS: "--pool-size 1",
    // Bounds a hung boot only: python-data's imports take minutes on a busy host.
    SANDFORK_VMM_BOOT_TIMEOUT_MS: String(180_000 * timeScale),
    ...scaledDaemonReadyEnv,
  };
  const started = await startRuntime(
    loadRuntimeConfig(env, dir),
    daemonMaxima(kvmExecutionLimits),
    (line) => log.push(line),
  );
  if (started === undefined) throw new Error("supervised mode must start a runtime");
  runtime = started;
  gw = await startTestGateway("pglite", {
    runtime: runtime.client,
    config: { executionLimits: kvmExecutionLimits },
  });
}, 300_000 * timeScale);

afterAll(async () => {
  await gw?.dispose();
  await runtime?.stop();
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

describe("gateway + supervised sandfork-vmm on KVM, PGlite", () => {
  it("start-up built the python template's image and its snapshot, and the daemon serves it", async () => {
    const text = log.join("\n");
    expect(text).toContain(`image ready in ${join(dir, "templates", "python")}`);
    expect(text).not.toMatch(/kvm unavailable|no snapshot/);
    const health = (await (await gw.call("GET", "/healthz")).json()) as Record<string, string>;
    expect(health, log.join("\n")).toMatchObject({
      status: "ok",
      database: "ok",
      runtime: "connected",
    });
    const { key } = await gw.issue();
    const templates = (await (
      await gw.call("GET", "/v1/templates", { credential: key })
    ).json()) as { templates: Record<string, unknown>[] };
    expect(templates.templates).toEqual([
      expect.objectContaining({
        name: "node",
        language: "node",
        languages: ["javascript", "typescript"],
        ready: true,
        price: expect.objectContaining({ base_units: 1 }),
      }),
      expect.objectContaining({ name: "python", languages: ["python"], ready: true }),
      expect.objectContaining({ name: "python-data", languages: ["python"] }),
    ]);
  });

  it("POST /v1/executions runs print(6*7) in a microVM: 200 with 42, billed to the key's account", async () => {
    const { key, accountId } = await gw.issue({ credits: CREDITS });
    const response = await gw.call("POST", "/v1/executions", {
      credential: key,
      body: { template: "python", code: "print(6*7)" },
    });
    const text = await response.text();
    expect(response.status, text).toBe(200);
    const body = JSON.parse(text) as {
      id: string;
      status: string;
      exit_code: number;
      stdout: string;
      stderr: string;
      usage: { units: number };
    };
    expect(body, text).toMatchObject({
      status: "completed",
      exit_code: 0,
      stdout: "42\n",
      stderr: "",
    });
    expect(body.usage.units).toBeGreaterThan(0);

    // Billed: the record is settled (its charge's one entry), the balance is lower by exactly the charge.
    expect(await findExecution(gw.fresh.db, body.id)).toMatchObject({
      status: "completed",
      chargedUnits: body.usage.units,
    });
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: CREDITS - body.usage.units,
      reservedUnits: 0,
    });
    const usage = (await (await gw.call("GET", "/v1/usage", { credential: key })).json()) as {
      executions: number;
      units: number;
    };
    expect(usage).toMatchObject({ executions: 1, units: body.usage.units });
  });

  it("an execution's subprocesses and shell pipelines run in the sandbox, their output in its answer", async () => {
    const { key, accountId } = await gw.issue({ credits: CREDITS });
    const code = [
      "import os, subprocess, sys",
      "print(subprocess.run('seq 1 1000 | sort -rn | head -3 | paste -sd, -', shell=True, capture_output=True, text=True).stdout.strip())",
      "sys.stdout.flush()",
      "os.system('echo from the shell; echo to stderr >&2')",
      "print(subprocess.run([sys.executable, '-c', 'import sys; sys.exit(5)']).returncode)",
    ].join("\n");
    // Four processes, each a VM: on a busy host the default time limit can pass first.
    const response = await gw.call("POST", "/v1/executions", {
      credential: key,
      body: { template: "python", code, timeout_ms: kvmExecutionLimits.maxTimeoutMs },
    });
    const text = await response.text();
    expect(response.status, text).toBe(200);
    const body = JSON.parse(text) as {
      id: string;
      stdout: string;
      stderr: string;
      usage: { units: number };
    };
    expect(body, text).toMatchObject({
      status: "completed",
      exit_code: 0,
      stdout: "1000,999,998\nfrom the shell\n5\n",
      stderr: "to stderr\n",
    });
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: CREDITS - body.usage.units,
      reservedUnits: 0,
    });
  });

  it("max_processes reaches the sandbox: the program forks until refused; out of range is 422, billed nothing", async () => {
    const { key, accountId } = await gw.issue({ credits: CREDITS });
    const code = await readFile(
      new URL("../native-vmm/tests/programs/fork_until_refused.py", import.meta.url),
      "utf8",
    );
    const response = await gw.call("POST", "/v1/executions", {
      credential: key,
      body: { template: "python", code, max_processes: 3 },
    });
    const text = await response.text();
    expect(response.status, text).toBe(200);
    const body = JSON.parse(text) as { usage: { units: number } };
    // The program and two children: a third fork is EAGAIN.
    expect(body, text).toMatchObject({ status: "completed", exit_code: 0, stdout: "2 EAGAIN\n" });
    for (const max_processes of [0, kvmExecutionLimits.maxProcesses + 1])
      await expectProblem(
        await gw.call("POST", "/v1/executions", {
          credential: key,
          body: { template: "python", code, max_processes },
        }),
        422,
        "validation-failed",
      );
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: CREDITS - body.usage.units,
      reservedUnits: 0,
    });
  });

  it("output a database cannot store as text (NUL, invalid UTF-8) is answered as U+FFFD and billed", async () => {
    const { key, accountId } = await gw.issue({ credits: CREDITS });
    const code = 'import sys; sys.stdout.buffer.write(b"a\\x00b\\xffc"); sys.stderr.write("\\0")';
    const response = await gw.call("POST", "/v1/executions", {
      credential: key,
      body: { template: "python", code },
    });
    const text = await response.text();
    expect(response.status, text).toBe(200);
    const body = JSON.parse(text) as { id: string; usage: { units: number } };
    expect(body, text).toMatchObject({
      status: "completed",
      stdout: "a\uFFFDb\uFFFDc",
      stderr: "\uFFFD",
    });
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: CREDITS - body.usage.units,
      reservedUnits: 0,
    });
  });

  it("POST /v1/executions runs JavaScript and TypeScript on the node template, billed, with Python's limit statuses", async () => {
    const { key, accountId } = await gw.issue({ credits: CREDITS });
    const run = async (body: Record<string, unknown>) => {
      const response = await gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template: "node", ...body },
      });
      const text = await response.text();
      expect(response.status, text).toBe(200);
      return JSON.parse(text) as {
        id: string;
        status: string;
        exit_code: number;
        stdout: string;
        stderr: string;
        usage: { units: number };
      };
    };
    const js = await run({ code: "console.log(6 * 7, typeof require)" });
    expect(js).toMatchObject({
      status: "completed",
      exit_code: 0,
      stdout: "42 function\n",
      stderr: "",
    });
    const ts = await run({
      language: "typescript",
      // biome-ignore lint/suspicious/noTemplateCurlyInString: TypeScript source, its template literal meant
      code: "const n: number = 6 * 7;\nconsole.log(`${n}` satisfies string);",
    });
    expect(ts).toMatchObject({ status: "completed", exit_code: 0, stdout: "42\n" });
    const thrown = await run({ language: "javascript", code: "throw new Error('boom')" });
    expect(thrown).toMatchObject({
      status: "completed",
      exit_code: 1,
      stderr: expect.stringContaining("Error: boom"),
    });
    // The limits give the statuses they give in Python, each billed.
    const timedOut = await run({ code: "while (true) {}", timeout_ms: 300 * timeScale });
    expect(timedOut).toMatchObject({ status: "timed_out" });
    // The longest time limit: on a busy host the memory must run out before the time.
    const bomb = await run({
      code: "const grow = []; for (;;) grow.push(new Array(100000).fill(1.5));",
      timeout_ms: kvmExecutionLimits.maxTimeoutMs,
    });
    expect(bomb).toMatchObject({ status: "memory_exceeded" });
    const flood = await run({ code: "for (;;) process.stdout.write('x'.repeat(65536));" });
    expect(flood).toMatchObject({ status: "output_exceeded" });
    const charged = [js, ts, thrown, timedOut, bomb, flood].reduce(
      (sum, execution) => sum + execution.usage.units,
      0,
    );
    expect(js.usage.units).toBeGreaterThan(0);
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: CREDITS - charged,
      reservedUnits: 0,
    });
    const refused = await gw.call("POST", "/v1/executions", {
      credential: key,
      body: { template: "node", language: "python", code: "print(1)" },
    });
    expect(refused.status).toBe(422);
  });
});
