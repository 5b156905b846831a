// The client's wait for an execution's answer, against a stand-in daemon on a Unix socket that
// answers when the test says: an answer that comes late (the machine is loaded, the daemon queued
// the request) is still the answer while the daemon answers its liveness probes; a daemon that
// closes its connection fails the request at once; one that answers nothing is given up on.
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { DaemonClient } from "./daemon-client.js";
import { RuntimeConnectionLostError, RuntimeTimeoutError } from "./errors.js";
import type { ExecutionRequest } from "./execution-runtime.js";
import { encodeFrame, FrameDecoder, type FrameObject } from "./frames.js";

const REQUEST: ExecutionRequest = {
  executionId: "00000000-0000-4000-8000-000000000000",
  template: "python",
  code: "while True: pass",
  stdin: "",
  args: [],
  env: {},
  files: [],
  language: "python",
  timeoutMs: 50,
};

function timedOutAnswer(id: unknown): FrameObject {
  return {
    id,
    type: "execution",
    status: "timeout",
    exit_code: null,
    stdout: "",
    stderr: "",
    truncated: false,
    fault: null,
    limits: { timeout_ms: 50, memory_mib: 256, output_bytes: 1_048_576, processes: 64 },
    vm: { origin: "fresh", resets: 0 },
    timings: { queue_us: 700_000, fork_us: 400, exec_us: 50_000, total_us: 751_000 },
    usage: {
      wall_us: 50_000,
      cpu_us: 50_000,
      peak_memory_bytes: 1,
      pages_copied: 1,
      syscalls: 1,
      exits: 1,
      threads_created: 0,
      thread_switches: 0,
      processes_created: 0,
    },
  };
}

/** What the stand-in does with an execute request (hello and health it answers itself). */
type OnExecute = (frame: FrameObject, socket: Socket) => void;

interface FakeDaemon {
  socketPath: string;
  healthProbes: number;
  /** Stops answering health (a daemon that is stuck). */
  silent: boolean;
  close(): Promise<void>;
}

async function fakeDaemon(onExecute: OnExecute): Promise<FakeDaemon> {
  const dir = mkdtempSync(join(tmpdir(), "sandfork-fake-vmm-"));
  const socketPath = join(dir, "vmm.sock");
  const sockets = new Set<Socket>();
  const daemon: FakeDaemon = {
    socketPath,
    healthProbes: 0,
    silent: false,
    close: () =>
      new Promise((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => {
          rmSync(dir, { recursive: true, force: true });
          resolve();
        });
      }),
  };
  const server: Server = createServer((socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => {});
    const decoder = new FrameDecoder();
    socket.on("data", (chunk: Buffer) => {
      decoder.push(chunk);
      for (let frame = decoder.next(); frame !== undefined; frame = decoder.next()) {
        if (frame.type === "hello")
          socket.write(encodeFrame({ type: "hello", protocol: 1, server: "fake-vmm 0" }));
        else if (frame.type === "health") {
          daemon.healthProbes += 1;
          if (!daemon.silent)
            socket.write(
              encodeFrame({
                id: frame.id,
                type: "health",
                ok: true,
                kvm: "available",
                templates: 1,
              }),
            );
        } else if (frame.type === "execute") onExecute(frame, socket);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(socketPath, resolve));
  return daemon;
}

// The wait past the time limit before the first probe: the fixed margin the client used to give up after.
const GRACE_MS = 200;

describe("DaemonClient: an execution's answer is the daemon's", () => {
  let daemon: FakeDaemon | undefined;
  let client: DaemonClient | undefined;
  afterEach(async () => {
    client?.close();
    await daemon?.close();
    client = undefined;
    daemon = undefined;
  });

  async function connect(
    onExecute: OnExecute,
    options: { executeMaxWaitMs?: number; requestTimeoutMs?: number } = {},
  ) {
    daemon = await fakeDaemon(onExecute);
    client = new DaemonClient({
      socketPath: daemon.socketPath,
      connections: 1,
      executeGraceMs: GRACE_MS,
      ...options,
    });
    await client.connect();
    return { daemon, client };
  }

  it("waits past the time limit and the grace for a daemon that answers late but is alive", async () => {
    // Answered 1 s after the request: five times the old deadline (time limit + grace).
    const { daemon, client } = await connect((frame, socket) => {
      setTimeout(() => socket.write(encodeFrame(timedOutAnswer(frame.id))), 1_000);
    });
    const result = await client.execute(REQUEST, new AbortController().signal);
    expect(result.outcome).toBe("timed_out");
    expect(daemon.healthProbes).toBeGreaterThan(0);
  });

  it("fails at once when the daemon closes the connection", async () => {
    const { client } = await connect((_frame, socket) => {
      setTimeout(() => socket.destroy(), 20);
    });
    const started = performance.now();
    const error = await client
      .execute(REQUEST, new AbortController().signal)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RuntimeConnectionLostError);
    expect(performance.now() - started).toBeLessThan(REQUEST.timeoutMs + GRACE_MS);
  });

  it("gives up on a daemon that answers neither the request nor a liveness probe", async () => {
    const { daemon, client } = await connect(() => {}, { requestTimeoutMs: 300 });
    daemon.silent = true;
    const error = await client
      .execute(REQUEST, new AbortController().signal)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RuntimeTimeoutError);
    expect((error as Error).message).toContain("nor a liveness probe within 300 ms");
    expect(daemon.healthProbes).toBe(1);
  });

  it("gives up at the bound on a daemon that answers probes but never the request", async () => {
    const { daemon, client } = await connect(() => {}, { executeMaxWaitMs: 700 });
    const started = performance.now();
    const error = await client
      .execute(REQUEST, new AbortController().signal)
      .catch((e: unknown) => e);
    const waited = performance.now() - started;
    expect(error).toBeInstanceOf(RuntimeTimeoutError);
    expect(waited).toBeGreaterThanOrEqual(REQUEST.timeoutMs + 700 - 5);
    expect(waited).toBeLessThan(REQUEST.timeoutMs + 700 + 500);
    expect(daemon.healthProbes).toBeGreaterThanOrEqual(2);
  });
});
