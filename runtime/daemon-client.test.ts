// The daemon client against the REAL `sandfork-vmm serve`, run where it cannot use KVM
// (`vmmBinaryWithoutKvm`: its /dev/kvm masked, on any machine): the daemon serves hello, health,
// list_templates and stats, and answers execute with the retryable `unavailable` error. Executions
// that run are tested in the KVM tier. Build the binary first: cd native-vmm && cargo build --release.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { DaemonClient, type DaemonClientOptions } from "./daemon-client.js";
import {
  RuntimeConnectionLostError,
  RuntimeQueueFullError,
  RuntimeRequestError,
  RuntimeTimeoutError,
  RuntimeUnavailableError,
} from "./errors.js";
import type { ExecutionRequest } from "./execution-runtime.js";
import { MAX_FRAME_BYTES } from "./frames.js";
import {
  type DaemonFixture,
  removeSharedTemplates,
  startDaemon,
  stopProcess,
  vmmBinaryWithoutKvm,
} from "./testing/real-daemon.js";

const PRINT_REQUEST: ExecutionRequest = {
  executionId: "00000000-0000-4000-8000-000000000000",
  template: "python",
  code: "print(6*7)",
  stdin: "",
  args: ["--flag"],
  env: { LANG: "C.UTF-8" },
  files: [{ path: "data.csv", content: "a,b\n1,2\n", encoding: "utf8" }],
  language: "python",
  timeoutMs: 5_000,
  memoryMb: 128,
};

async function rejection(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected the promise to reject");
}

let daemon: DaemonFixture;
const clients: DaemonClient[] = [];

async function connectedClient(options: Partial<DaemonClientOptions> = {}): Promise<DaemonClient> {
  const client = new DaemonClient({ socketPath: daemon.socketPath, ...options });
  clients.push(client);
  await client.connect();
  return client;
}

function daemonPid(): number {
  const pid = daemon.supervisor.pid;
  if (pid === undefined) throw new Error("the daemon is not running");
  return pid;
}

beforeAll(async () => {
  daemon = await startDaemon({ binary: vmmBinaryWithoutKvm() });
});

afterEach(() => {
  for (const client of clients.splice(0)) client.close();
});

afterAll(async () => {
  await daemon?.dispose();
  await removeSharedTemplates();
});

describe("DaemonClient against sandfork-vmm serve", () => {
  it("completes the handshake and reports health: KVM unavailable", async () => {
    const client = await connectedClient({ connections: 2 });
    expect(client.serverVersion).toMatch(/^sandfork-vmm \d+\.\d+\.\d+$/);
    expect(client.status().connected).toBe(2);

    const health = await client.daemonHealth();
    expect(health.ok).toBe(false);
    expect(health.kvm).toMatch(/^unavailable: .+/);
    expect(health.templates).toBe(1);

    const summary = await client.health();
    expect(summary.ok).toBe(false);
    expect(summary.detail).toContain("kvm unavailable");
  });

  it("lists the built template with the content hash of its image", async () => {
    const client = await connectedClient();
    const templates = await client.templates();
    // The image's content hash is SHA-256 of image.index after its 64-byte header (native-vmm/IMAGE.md).
    const index = readFileSync(join(daemon.templatesDir, "python", "image.index"));
    const expectedHash = createHash("sha256").update(index.subarray(64)).digest("hex");
    expect(templates).toEqual([
      {
        name: "python",
        language: "python",
        languages: ["python"],
        contentHash: expectedHash,
        ready: false,
      },
    ]);
    // Answered from the cache the second time: the same promise's value, one request sent.
    const sentBefore = client.status().sentPerConnection.reduce((a, b) => a + b, 0);
    expect(await client.templates()).toEqual(templates);
    expect(client.status().sentPerConnection.reduce((a, b) => a + b, 0)).toBe(sentBefore);
  });

  it("reports stats", async () => {
    const client = await connectedClient();
    const stats = await client.stats();
    expect(stats.inFlight).toBe(0);
    expect(stats.pools).toEqual([]);
    expect(Number.isSafeInteger(stats.executions)).toBe(true);
  });

  it("execute: the daemon's `unavailable` becomes a retryable RuntimeUnavailableError", async () => {
    const client = await connectedClient();
    const error = await rejection(client.execute(PRINT_REQUEST, new AbortController().signal));
    expect(error).toBeInstanceOf(RuntimeUnavailableError);
    expect(error).not.toBeInstanceOf(RuntimeConnectionLostError);
    expect(error).toMatchObject({ code: "unavailable", retryable: true });
    expect(error.message).toContain("/dev/kvm");
    // The connection stays usable after an error frame.
    expect((await client.daemonHealth()).templates).toBe(1);
  });

  it("a request the daemon refuses becomes a non-retryable RuntimeRequestError; the connection stays usable", async () => {
    const client = await connectedClient({ connections: 1 });
    const missingTemplate = await rejection(client.request("execute", { code: "print(1)" }));
    expect(missingTemplate).toBeInstanceOf(RuntimeRequestError);
    expect(missingTemplate).toMatchObject({ code: "bad_request", retryable: false });
    expect(missingTemplate.message).toContain("missing field `template`");

    const unknownField = await rejection(
      client.request("execute", { template: "python", code: "", timeout: 5 }),
    );
    expect(unknownField).toMatchObject({ code: "bad_request", retryable: false });
    expect(unknownField.message).toContain("unknown field `timeout`");

    const noTime = await rejection(
      client.execute({ ...PRINT_REQUEST, timeoutMs: 0 }, new AbortController().signal),
    );
    expect(noTime).toMatchObject({ code: "bad_request", retryable: false });
    expect(noTime.message).toContain("limits.timeout_ms");

    expect(client.status().connected).toBe(1);
    expect((await client.daemonHealth()).kvm).toMatch(/^unavailable/);
  });

  it("an execute for a template the daemon does not have is a non-retryable unknown_template", async () => {
    const client = await connectedClient();
    const error = await rejection(
      client.execute({ ...PRINT_REQUEST, template: "ruby" }, new AbortController().signal),
    );
    expect(error).toBeInstanceOf(RuntimeRequestError);
    expect(error).toMatchObject({ code: "unknown_template", retryable: false });
    expect(error.message).toContain("ruby");
  });

  it("a request too large for a frame is refused before it is sent", async () => {
    const client = await connectedClient({ connections: 1 });
    const error = await rejection(
      client.execute(
        { ...PRINT_REQUEST, code: "#".repeat(MAX_FRAME_BYTES) },
        new AbortController().signal,
      ),
    );
    expect(error).toBeInstanceOf(RuntimeRequestError);
    expect(error).toMatchObject({ code: "frame_too_large", retryable: false });
    expect(client.status().sentPerConnection).toEqual([0]);
    expect((await client.daemonHealth()).templates).toBe(1);
  });

  it("the pool spreads concurrent requests over its connections and matches answers by id", async () => {
    const client = await connectedClient({ connections: 4 });
    const answers = await Promise.all(
      Array.from({ length: 40 }, (_, i) => (i % 2 === 0 ? client.daemonHealth() : client.stats())),
    );
    for (const [i, answer] of answers.entries())
      expect(answer).toHaveProperty(i % 2 === 0 ? "kvm" : "pools");
    const sent = client.status().sentPerConnection;
    expect(sent.reduce((a, b) => a + b, 0)).toBe(40);
    for (const perConnection of sent) expect(perConnection).toBe(10);
  });

  it("backpressure: beyond in-flight and queue bounds, requests are refused at once with a retryable error", async () => {
    const client = await connectedClient({
      connections: 1,
      maxInFlightPerConnection: 2,
      maxQueued: 3,
    });
    const calls = Array.from({ length: 10 }, () =>
      client.daemonHealth().then(
        () => "answered",
        (error: Error) => error,
      ),
    );
    expect(client.status()).toMatchObject({ inFlight: 2, queued: 3 });
    const outcomes = await Promise.all(calls);
    expect(outcomes.slice(0, 5)).toEqual(Array(5).fill("answered"));
    for (const refused of outcomes.slice(5)) {
      expect(refused).toBeInstanceOf(RuntimeQueueFullError);
      expect(refused).toMatchObject({ code: "queue_full", retryable: true });
    }
    expect(client.status()).toMatchObject({ inFlight: 0, queued: 0 });
  });

  it("a deadline or an abort ends the wait; the late answer is dropped and the connection goes on", async () => {
    const client = await connectedClient({ connections: 1 });
    // Stopped, the daemon holds every answer back until SIGCONT.
    await stopProcess(daemonPid());
    let timedOut: Error;
    let aborted: Error;
    try {
      timedOut = await rejection(client.daemonHealth({ timeoutMs: 200 }));
      const controller = new AbortController();
      const pending = rejection(client.stats({ signal: controller.signal }));
      controller.abort();
      aborted = await pending;
      // Both are still in flight on the daemon's side (it is stopped).
      expect(client.status().inFlight).toBe(2);
    } finally {
      process.kill(daemonPid(), "SIGCONT");
    }
    expect(timedOut).toBeInstanceOf(RuntimeTimeoutError);
    expect(timedOut).toMatchObject({ code: "timeout", retryable: true });
    expect(aborted.name).toBe("AbortError");
    expect((await client.daemonHealth()).templates).toBe(1);
    expect(client.status()).toMatchObject({ connected: 1, inFlight: 0 });
  });

  it("with no daemon at the socket, connect and requests fail at once with RuntimeUnavailableError", async () => {
    const client = new DaemonClient({
      socketPath: join(daemon.dir, "nobody.sock"),
      connections: 1,
    });
    clients.push(client);
    const connectError = await rejection(client.connect());
    expect(connectError).toBeInstanceOf(RuntimeUnavailableError);
    expect(connectError.message).toContain("nobody.sock");
    const requestError = await rejection(client.templates());
    expect(requestError).toBeInstanceOf(RuntimeUnavailableError);
    expect(requestError).toMatchObject({ code: "not_connected", retryable: true });
  });
});
