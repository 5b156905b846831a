// The idle sweep against a runtime that no longer holds a session the way the gateway's row says
// (its daemon restarted): a pause refused for good (`session_ended`, `not_found`) settles the row
// once to what the daemon holds, and is not tried again at every sweep; a retryable failure is
// tried again. Each failure is one JSON line. A stand-in SessionRuntime plays the daemon.
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { findSession } from "../db/sessions.js";
import { BACKENDS } from "../db/testing/fresh-database.js";
import { RuntimeRequestError, RuntimeUnavailableError } from "../runtime/errors.js";
import type { ExecutionRuntime } from "../runtime/execution-runtime.js";
import type { SessionInfo, SessionRuntime } from "../runtime/session-runtime.js";
import { startTestGateway, type TestGateway } from "./testing/test-gateway.js";

type DaemonView = { state: "running" | "paused" | "ended"; checkpoints: number } | "unknown";

/** A daemon's sessions as the test sets them; pause fails as `pauseFails` says. */
class StandInSessions implements SessionRuntime {
  readonly held = new Map<string, DaemonView>();
  pauses = 0;
  pauseFails: (session: string) => Error | undefined = () => undefined;

  private view(session: string): SessionInfo {
    const view = this.held.get(session) ?? "unknown";
    if (view === "unknown") throw new RuntimeRequestError("not_found", `no session '${session}'`);
    const checkpoints = Array.from({ length: view.checkpoints }, (_, i) => ({
      checkpoint: i + 1,
      sha256: `${i + 1}`.padStart(64, "0"),
      fileBytes: 1_000,
    }));
    return {
      session,
      template: "python",
      state: view.state,
      memoryMib: 256,
      checkpoints,
      checkpointBytes: 1_000 * view.checkpoints,
      ended: view.state === "ended" ? "its VM died with the previous daemon" : null,
    };
  }

  async create(session: string): Promise<SessionInfo> {
    this.held.set(session, { state: "running", checkpoints: 0 });
    return this.view(session);
  }
  async info(session: string): Promise<SessionInfo> {
    return this.view(session);
  }
  async pause(session: string): Promise<never> {
    this.pauses += 1;
    const failure = this.pauseFails(session);
    if (failure !== undefined) throw failure;
    throw new Error("the test does not pause successfully");
  }
  async delete(session: string): Promise<void> {
    this.held.delete(session);
  }
  execute(): never {
    throw new Error("not used");
  }
  writeFile(): never {
    throw new Error("not used");
  }
  readFile(): never {
    throw new Error("not used");
  }
  deleteFile(): never {
    throw new Error("not used");
  }
  checkpoint(): never {
    throw new Error("not used");
  }
  resume(): never {
    throw new Error("not used");
  }
  fork(): never {
    throw new Error("not used");
  }
}

describe.each(BACKENDS)("the idle sweep after a daemon restart, on %s", (backend) => {
  const sessions = new StandInSessions();
  const runtime: ExecutionRuntime = {
    execute: () => Promise.reject(new Error("not used")),
    templates: async () => [
      { name: "python", contentHash: "0", language: "python", languages: ["python"], ready: true },
    ],
    sessions,
  } as unknown as ExecutionRuntime;
  let clock = Date.parse("2026-01-01T00:00:00Z");
  const lines: string[] = [];
  let gw: TestGateway;
  let key: string;

  beforeAll(async () => {
    gw = await startTestGateway(backend, { runtime, now: () => clock });
    // The service logs to stderr.
    vi.spyOn(console, "error").mockImplementation(
      (...args: unknown[]) => void lines.push(args.map(String).join(" ")),
    );
    key = (await gw.issue({ credits: 1_000_000 })).key;
  });
  afterAll(async () => {
    vi.restoreAllMocks();
    await gw?.dispose();
  });

  async function idleSession(): Promise<string> {
    const response = await gw.call("POST", "/v1/sessions", {
      credential: key,
      body: { template: "python", idle_timeout_s: 1 },
    });
    expect(response.status, await response.clone().text()).toBe(201);
    return ((await response.json()) as { id: string }).id;
  }

  async function sweeps(n: number): Promise<void> {
    for (let i = 0; i < n; i++) {
      clock += 1_000;
      await gw.context.sessions.sweep();
    }
  }

  it("settles a session the daemon says ended, once, and logs one JSON line", async () => {
    const id = await idleSession();
    sessions.held.set(id, { state: "ended", checkpoints: 0 });
    sessions.pauseFails = () =>
      new RuntimeRequestError("session_ended", "the session's VM has ended");
    sessions.pauses = 0;
    lines.length = 0;
    await sweeps(5);
    expect(sessions.pauses).toBe(1);
    expect(await findSession(gw.fresh.db, id)).toMatchObject({
      state: "ended",
      runningSince: null,
      endedReason: "its VM died with the previous daemon",
    });
    expect(lines).toHaveLength(1);
    expect(lines[0]).not.toContain("\n");
    expect(JSON.parse(lines[0] as string)).toMatchObject({
      event: "pause_failed",
      session: id,
      code: "session_ended",
      retryable: false,
      settled: "ended",
    });
  });

  it("settles a session the daemon holds paused with a checkpoint as paused, resumable from it", async () => {
    const id = await idleSession();
    sessions.held.set(id, { state: "paused", checkpoints: 2 });
    sessions.pauseFails = () =>
      new RuntimeRequestError("session_ended", "the session's VM has ended");
    sessions.pauses = 0;
    await sweeps(3);
    expect(sessions.pauses).toBe(1);
    expect(await findSession(gw.fresh.db, id)).toMatchObject({
      state: "paused",
      runningSince: null,
      lastCheckpoint: 2,
      checkpointBytes: 2_000,
    });
  });

  it("ends a session the daemon no longer knows, with no checkpoint bytes left to bill", async () => {
    const id = await idleSession();
    sessions.held.delete(id);
    sessions.pauseFails = (session) =>
      new RuntimeRequestError("not_found", `no session '${session}'`);
    sessions.pauses = 0;
    await sweeps(3);
    expect(sessions.pauses).toBe(1);
    expect(await findSession(gw.fresh.db, id)).toMatchObject({
      state: "ended",
      runningSince: null,
      checkpointBytes: 0,
      endedReason: "the runtime no longer has it",
    });
  });

  it("tries a retryable failure again at the next sweep, and leaves the row running", async () => {
    const id = await idleSession();
    sessions.pauseFails = () => new RuntimeUnavailableError("not connected to sandfork-vmm");
    sessions.pauses = 0;
    lines.length = 0;
    await sweeps(3);
    expect(sessions.pauses).toBe(3);
    expect(await findSession(gw.fresh.db, id)).toMatchObject({ state: "running" });
    expect(
      lines.map((line) => JSON.parse(line) as { retryable: boolean; settled: unknown }),
    ).toEqual(
      Array.from({ length: 3 }, () => expect.objectContaining({ retryable: true, settled: null })),
    );
  });
});
