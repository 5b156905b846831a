// The gateway with the runtime `npm start` wires in (runtime/start.ts, supervised mode): the REAL
// python template built by `sandfork-vmm image build`, the REAL daemon under supervision, the
// daemon client as the gateway's ExecutionRuntime, with a binary that cannot use KVM
// (`vmmBinaryWithoutKvm`, on any machine): the daemon answers execute with `unavailable`, the
// gateway must answer 503 runtime-unavailable and bill nothing. The KVM tier runs executions.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  expectProblem,
  startTestGateway,
  type TestGateway,
} from "../gateway/testing/test-gateway.js";
import { loadRuntimeConfig } from "./config.js";
import { type StartedRuntime, startRuntime } from "./start.js";
import { vmmBinaryWithoutKvm } from "./testing/real-daemon.js";

let dir: string;
let runtime: StartedRuntime;
let gw: TestGateway;
const log: string[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "sfk-gw-"));
  const config = loadRuntimeConfig(
    {
      SANDFORK_TEMPLATES: "python",
      SANDFORK_VMM_BIN: vmmBinaryWithoutKvm(),
      SANDFORK_VMM_CONNECTIONS: "2",
    },
    dir,
  );
  const started = await startRuntime(
    config,
    { timeoutMs: 30_000, memoryMib: 2_048, processes: 64 },
    (line) => log.push(line),
  );
  if (started === undefined) throw new Error("supervised mode must start a runtime");
  runtime = started;
  gw = await startTestGateway("pglite", { runtime: runtime.client });
});

afterAll(async () => {
  await gw?.dispose();
  await runtime?.stop();
  await rm(dir, { recursive: true, force: true });
});

async function usageOf(
  key: string,
): Promise<{ executions: number; units: number; balance: Record<string, number> }> {
  const response = await gw.call("GET", "/v1/usage", { credential: key });
  expect(response.status).toBe(200);
  return (await response.json()) as {
    executions: number;
    units: number;
    balance: Record<string, number>;
  };
}

describe("gateway + supervised sandfork-vmm without KVM", () => {
  it("start-up built the python template into <data>/templates and started the daemon", () => {
    const text = log.join("\n");
    expect(text).toContain(
      `template python: building its image from ${resolve("templates/python/image.json")} (no image yet)`,
    );
    expect(text).toContain(`image ready in ${join(dir, "templates", "python")}`);
    expect(text).toMatch(/kvm unavailable/);
    expect(text).toContain(`serving at ${join(dir, "run", "sandfork-vmm.sock")}`);
  });

  it("GET /healthz reports the daemon's health: KVM unavailable, executions cannot run", async () => {
    const response = await gw.call("GET", "/healthz");
    expect(response.status).toBe(200);
    const body = (await response.json()) as Record<string, string>;
    expect(body).toMatchObject({ status: "degraded", database: "ok", runtime: "unavailable" });
    expect(body.runtime_detail).toMatch(/^sandfork-vmm: kvm unavailable: .+; 1 template\(s\)$/);
  });

  it("GET /v1/templates lists the daemon's templates", async () => {
    const { key } = await gw.issue();
    const response = await gw.call("GET", "/v1/templates", { credential: key });
    expect(response.status).toBe(200);
    const { templates } = (await response.json()) as { templates: Record<string, unknown>[] };
    expect(templates).toEqual([
      expect.objectContaining({
        name: "python",
        language: "python",
        ready: false,
        content_hash: expect.stringMatching(/^[0-9a-f]{64}$/),
      }),
    ]);
  });

  it("POST /v1/executions answers 503 runtime-unavailable because the daemon has no KVM, and bills nothing", async () => {
    const { key } = await gw.issue({ credits: 1_000 });
    const response = await gw.call("POST", "/v1/executions", {
      credential: key,
      body: { template: "python", code: "print(6*7)" },
    });
    expect(response.headers.get("retry-after")).toBe("5");
    const problem = await expectProblem(response, 503, "runtime-unavailable");
    expect(problem.detail).toContain("/dev/kvm");
    expect(problem.retryable).toBe(true);
    const usage = await usageOf(key);
    expect(usage).toMatchObject({ executions: 0, units: 0 });
    expect(usage.balance).toMatchObject({
      balance_units: 1_000,
      reserved_units: 0,
      available_units: 1_000,
    });
  });

  it("while the daemon is dead and after its restart, executions still bill nothing; health comes back", async () => {
    const { key } = await gw.issue({ credits: 1_000 });
    const supervisor = runtime.supervisor;
    if (supervisor === undefined) throw new Error("supervised mode has a supervisor");
    const restarted = new Promise<void>((r) => {
      const off = supervisor.onReady(() => {
        off();
        r();
      });
    });
    process.kill(supervisor.pid as number, "SIGKILL");
    // The kill lands before the client has noticed, or after: either way a retryable 503.
    await expectProblem(
      await gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template: "python", code: "print(1)" },
      }),
      503,
      "runtime-unavailable",
    );
    await restarted;
    await runtime.client.waitUntilConnected(5_000);
    const health = (await (await gw.call("GET", "/healthz")).json()) as Record<string, string>;
    expect(health.runtime_detail).toContain("kvm unavailable");
    await expectProblem(
      await gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template: "python", code: "print(2)" },
      }),
      503,
      "runtime-unavailable",
    );
    expect((await usageOf(key)).balance).toMatchObject({ balance_units: 1_000, reserved_units: 0 });
  });
});
