// Admission control (gateway/admission.ts) with a TEST DOUBLE of the runtime that holds every
// execution until the test lets it finish, on PGlite: a flood past a key's line is shed with 429,
// past a template's with 503, at once, with Retry-After, and billed nothing; the daemon's own
// `busy` (a stand-in daemon on a Unix socket, through the real runtime client) is a 503 too;
// /metrics shows the lines' depths and the shed calls by reason.
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { type FreshDatabase, freshDatabase } from "../db/testing/fresh-database.js";
import { DaemonClient } from "../runtime/daemon-client.js";
import type {
  ExecutionRequest,
  ExecutionResult,
  ExecutionRuntime,
  Template,
} from "../runtime/execution-runtime.js";
import { encodeFrame, FrameDecoder } from "../runtime/frames.js";
import type { AdmissionSettings } from "./config.js";
import { expectProblem, startTestGateway, type TestGateway } from "./testing/test-gateway.js";

const TEMPLATES: Template[] = [
  { name: "python", language: "python", languages: ["python"], contentHash: "c0ffee", ready: true },
];
const PROGRAM = { template: "python", code: "print(6*7)" };
const CREDITS = 1_000;
// Default price: 1 unit + 10 units per second, billed for fork 2 ms + exec 150 ms: 3 units.
const CHARGED = 3;

/** What the test doubles' executions complete with. */
const COMPLETED: ExecutionResult = {
  outcome: "completed",
  exitCode: 0,
  stdout: "42\n",
  stderr: "",
  truncated: false,
  timings: { queueMs: 0, forkMs: 2, execMs: 150 },
};

/** Test double: every execution waits until `finish()`, then completes. */
class HeldRuntimeTestDouble implements ExecutionRuntime {
  readonly requests: ExecutionRequest[] = [];
  private open!: () => void;
  private readonly gate = new Promise<void>((resolve) => (this.open = resolve));
  async execute(request: ExecutionRequest): Promise<ExecutionResult> {
    this.requests.push(request);
    await this.gate;
    return COMPLETED;
  }
  async templates(): Promise<Template[]> {
    return TEMPLATES;
  }
  finish(): void {
    this.open();
  }
}

/** The value of one sample in Prometheus text, or undefined. */
function sample(text: string, metric: string, labels: Record<string, string>): number | undefined {
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${metric}{`)) continue;
    if (!Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) continue;
    return Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return undefined;
}

let fresh: FreshDatabase;
beforeAll(async () => {
  fresh = await freshDatabase("pglite");
});
afterAll(async () => {
  await fresh?.dispose();
});

async function gatewayWith(
  admission: AdmissionSettings,
  runtime: ExecutionRuntime,
): Promise<TestGateway> {
  return startTestGateway("pglite", { fresh, config: { admission }, runtime });
}

describe("admission control", () => {
  it("a key flooded past its running slots and its line: 429 with Retry-After at once, billed nothing; the line runs in turn", async () => {
    const runtime = new HeldRuntimeTestDouble();
    const gw = await gatewayWith(
      { templateMaxRunning: 100, templateMaxQueued: 100, keyMaxQueued: 3 },
      runtime,
    );
    try {
      const { key, accountId } = await gw.issue({ credits: CREDITS, maxConcurrency: 2 });
      const calls = Array.from({ length: 12 }, () =>
        gw.call("POST", "/v1/executions", { credential: key, body: PROGRAM }),
      );
      // 2 run, 3 wait for a slot of the key: the other 7 are answered while those are held.
      await vi.waitUntil(() => runtime.requests.length === 2);
      const settled = await Promise.all(
        calls.map((call) =>
          Promise.race([
            call,
            new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), 200)),
          ]),
        ),
      );
      const shed = settled.filter((r): r is Response => r !== undefined);
      expect(shed).toHaveLength(7);
      for (const response of shed) {
        expect(response.headers.get("retry-after")).toBe("1");
        const problem = await expectProblem(response, 429, "concurrency-limit");
        expect(problem).toMatchObject({ retryable: true, retry_after_seconds: 1 });
      }
      const metrics = await gw.telemetry.prometheusText();
      expect(sample(metrics, "sandfork_admission_queued", { queue: "key" })).toBe(3);
      expect(sample(metrics, "sandfork_admission_shed_total", { reason: "key_queue_full" })).toBe(
        7,
      );
      expect(runtime.requests).toHaveLength(2);

      runtime.finish();
      const served = await Promise.all(calls);
      expect(served.filter((r) => r.status === 200)).toHaveLength(5);
      expect(runtime.requests).toHaveLength(5);
      // Only what ran was charged: the shed calls held and paid nothing.
      expect(await gw.books(accountId)).toMatchObject({
        balanceUnits: CREDITS - 5 * CHARGED,
        reservedUnits: 0,
      });
      expect(
        sample(await gw.telemetry.prometheusText(), "sandfork_admission_queued", { queue: "key" }),
      ).toBe(0);
    } finally {
      await gw.dispose();
    }
  });

  it("the service flooded past a template's running slots and its line: 503 runtime-busy with Retry-After at once, billed nothing", async () => {
    const runtime = new HeldRuntimeTestDouble();
    const gw = await gatewayWith(
      { templateMaxRunning: 2, templateMaxQueued: 3, keyMaxQueued: 0 },
      runtime,
    );
    try {
      // One call each from ten keys, each well inside its own limit.
      const keys = await Promise.all(
        Array.from({ length: 10 }, () => gw.issue({ credits: CREDITS, maxConcurrency: 4 })),
      );
      const calls = keys.map(({ key }) =>
        gw.call("POST", "/v1/executions", { credential: key, body: PROGRAM }),
      );
      await vi.waitUntil(() => runtime.requests.length === 2);
      const settled = await Promise.all(
        calls.map((call) =>
          Promise.race([
            call,
            new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), 200)),
          ]),
        ),
      );
      const shedAt = settled.flatMap((r, i) => (r === undefined ? [] : [i]));
      expect(shedAt).toHaveLength(5);
      for (const i of shedAt) {
        const response = settled[i] as Response;
        expect(Number(response.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
        const problem = await expectProblem(response, 503, "runtime-busy");
        expect(problem.retryable).toBe(true);
      }
      const metrics = await gw.telemetry.prometheusText();
      expect(sample(metrics, "sandfork_admission_running", { template: "python" })).toBe(2);
      expect(
        sample(metrics, "sandfork_admission_queued", { queue: "template", template: "python" }),
      ).toBe(3);
      expect(
        sample(metrics, "sandfork_admission_shed_total", { reason: "template_queue_full" }),
      ).toBe(5);

      runtime.finish();
      const served = await Promise.all(calls);
      expect(served.filter((r) => r.status === 200)).toHaveLength(5);
      for (const [i, { accountId }] of keys.entries()) {
        const balance = shedAt.includes(i) ? CREDITS : CREDITS - CHARGED;
        expect(await gw.books(accountId)).toMatchObject({
          balanceUnits: balance,
          reservedUnits: 0,
        });
      }
      expect(
        sample(await gw.telemetry.prometheusText(), "sandfork_admission_queued", {
          queue: "template",
          template: "python",
        }),
      ).toBe(0);
    } finally {
      await gw.dispose();
    }
  });

  it("past a full line a call is shed before its body is validated; a retry with an Idempotency-Key still gets its first result", async () => {
    // Test double: `hold` runs until released, anything else completes at once.
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    const ran: string[] = [];
    const runtime: ExecutionRuntime = {
      templates: async () => TEMPLATES,
      async execute(request) {
        ran.push(request.code);
        if (request.code === "hold") await held;
        return COMPLETED;
      },
    };
    const gw = await gatewayWith(
      { templateMaxRunning: 1, templateMaxQueued: 0, keyMaxQueued: 0 },
      runtime,
    );
    try {
      const { key, accountId } = await gw.issue({ credits: CREDITS, maxConcurrency: 4 });
      const keyed = { "idempotency-key": "first-call" };
      const first = await gw.call("POST", "/v1/executions", {
        credential: key,
        body: PROGRAM,
        headers: keyed,
      });
      expect(first.status).toBe(200);
      const holding = gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template: "python", code: "hold" },
      });
      await vi.waitUntil(() => ran.includes("hold"));

      // The line is full: a body that validation would refuse is not even validated.
      const invalid = { template: "python", code: 7 };
      await expectProblem(
        await gw.call("POST", "/v1/executions", { credential: key, body: invalid }),
        503,
        "runtime-busy",
      );
      await expectProblem(
        await gw.call("POST", "/v1/executions", { credential: key, body: PROGRAM }),
        503,
        "runtime-busy",
      );
      const retry = await gw.call("POST", "/v1/executions", {
        credential: key,
        body: PROGRAM,
        headers: keyed,
      });
      expect(retry.status).toBe(200);
      expect(retry.headers.get("idempotent-replayed")).toBe("true");

      release();
      expect((await holding).status).toBe(200);
      // With room in the line the same body gets validation's answer.
      await expectProblem(
        await gw.call("POST", "/v1/executions", { credential: key, body: invalid }),
        422,
        "validation-failed",
      );
      expect(ran).toEqual(["print(6*7)", "hold"]);
      expect(await gw.books(accountId)).toMatchObject({
        balanceUnits: CREDITS - 2 * CHARGED,
        reservedUnits: 0,
      });
      // The keyed retry too was refused a slot, and answered with its first result.
      expect(
        sample(await gw.telemetry.prometheusText(), "sandfork_admission_shed_total", {
          reason: "template_queue_full",
        }),
      ).toBe(3);
    } finally {
      await gw.dispose();
    }
  });

  describe("a daemon that answers busy", () => {
    const keyIds: unknown[] = [];
    let dir: string;
    let server: Server;
    let client: DaemonClient;
    beforeAll(async () => {
      dir = mkdtempSync(join(tmpdir(), "sandfork-busy-vmm-"));
      const socketPath = join(dir, "vmm.sock");
      // A stand-in for `sandfork-vmm serve` past its bounds: every execute is `busy`, past its
      // key's line for the code "key's line", else past its template's; its stats say so.
      server = createServer((socket: Socket) => {
        socket.on("error", () => {});
        const decoder = new FrameDecoder();
        socket.on("data", (chunk: Buffer) => {
          decoder.push(chunk);
          for (let frame = decoder.next(); frame !== undefined; frame = decoder.next()) {
            if (frame.type === "hello")
              socket.write(encodeFrame({ type: "hello", protocol: 1, server: "fake-vmm 0" }));
            else if (frame.type === "execute") {
              keyIds.push(frame.key_id);
              const keys = frame.code === "key's line";
              socket.write(
                encodeFrame({
                  id: frame.id,
                  type: "error",
                  code: "busy",
                  message: keys
                    ? "4 executions of this key_id already wait for a slot"
                    : "16 executions of template 'python' already wait for a slot",
                  retryable: true,
                  reason: keys ? "key_queue_full" : "template_queue_full",
                }),
              );
            } else if (frame.type === "stats") {
              socket.write(
                encodeFrame({
                  id: frame.id,
                  type: "stats",
                  executions: 0,
                  in_flight: 20,
                  syscalls: 0,
                  thread_switches: 0,
                  admission: {
                    running: 4,
                    queued: 16,
                    queued_by_template: { python: 16 },
                    busy: { queue_full: 0, template_queue_full: 2, key_queue_full: 1 },
                  },
                  pools: [],
                }),
              );
            }
          }
        });
      });
      await new Promise<void>((resolve) => server.listen(socketPath, resolve));
      client = new DaemonClient({ socketPath, connections: 1 });
      await client.connect();
    });
    afterAll(async () => {
      client?.close();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      rmSync(dir, { recursive: true, force: true });
    });

    it("is a 503 runtime-busy past its template's line, a 429 past its key's, with Retry-After, billed nothing, counted by reason", async () => {
      const runtime: ExecutionRuntime = {
        templates: async () => TEMPLATES,
        execute: (request, signal, onOutput) => client.execute(request, signal, onOutput),
        admission: (signal) => client.admission(signal),
      };
      const gw = await gatewayWith(
        { templateMaxRunning: 100, templateMaxQueued: 100, keyMaxQueued: 0 },
        runtime,
      );
      try {
        const { key, keyId, accountId } = await gw.issue({ credits: CREDITS });
        const headerSets: Record<string, string>[] = [{}, { "idempotency-key": "busy-1" }];
        for (const headers of headerSets) {
          const response = await gw.call("POST", "/v1/executions", {
            credential: key,
            body: PROGRAM,
            headers,
          });
          expect(response.headers.get("retry-after")).toBe("1");
          const problem = await expectProblem(response, 503, "runtime-busy");
          expect(problem).toMatchObject({ retryable: true });
          expect(problem.detail).toContain("16 executions of template 'python' already wait");
        }
        const keys = await gw.call("POST", "/v1/executions", {
          credential: key,
          body: { template: "python", code: "key's line" },
        });
        expect(keys.headers.get("retry-after")).toBe("1");
        const problem = await expectProblem(keys, 429, "concurrency-limit");
        expect(problem).toMatchObject({ retryable: true, retry_after_seconds: 1 });
        // Each execution named its key to the daemon.
        expect(keyIds).toEqual([keyId, keyId, keyId]);
        expect(await gw.books(accountId)).toMatchObject({
          balanceUnits: CREDITS,
          reservedUnits: 0,
        });
        const metrics = await (await gw.call("GET", "/metrics", {})).text();
        const shed = (reason: string) =>
          sample(metrics, "sandfork_admission_shed_total", { reason });
        expect(shed("runtime_template_queue_full")).toBe(2);
        expect(shed("runtime_key_queue_full")).toBe(1);
        // The daemon's own lines, as its stats say.
        expect(sample(metrics, "sandfork_runtime_admission_running", {})).toBe(4);
        expect(
          sample(metrics, "sandfork_runtime_admission_queued", {
            queue: "template",
            template: "python",
          }),
        ).toBe(16);
        expect(sample(metrics, "sandfork_runtime_admission_queued", { queue: "all" })).toBe(16);
        expect(
          sample(metrics, "sandfork_runtime_admission_busy_total", { reason: "key_queue_full" }),
        ).toBe(1);
      } finally {
        await gw.dispose();
      }
    });
  });
});
