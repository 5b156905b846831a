// POST /v1/sessions/{id}/fork with `count`: its validation (422 outside 1..MAX_FORK_COUNT), the
// key's session limit for all of them at once, and all or none when the runtime forks some and
// fails one (those made are deleted again and every row is settled as deleted). A stand-in
// SessionRuntime plays the daemon; gateway/sessions.kvm.test.ts forks on the real one.
import { eq } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sessions as sessionRows } from "../db/schema.js";
import { listSessions } from "../db/sessions.js";
import type { ExecutionRuntime } from "../runtime/execution-runtime.js";
import type { SessionInfo, SessionRuntime } from "../runtime/session-runtime.js";
import { MAX_FORK_COUNT } from "./routes/sessions.js";
import { expectProblem, startTestGateway, type TestGateway } from "./testing/test-gateway.js";

const MAX_SESSIONS = 12;

/** A daemon that holds the sessions it made; `fork` fails for the calls `forkFails` names. */
class StandInSessions implements Pick<SessionRuntime, "create" | "fork" | "delete"> {
  readonly held = new Set<string>();
  forks = 0;
  forkFails: (call: number) => boolean = () => false;

  private info(session: string): SessionInfo {
    return {
      session,
      template: "python",
      state: "running",
      memoryMib: 256,
      checkpoints: [],
      checkpointBytes: 0,
      ended: null,
    };
  }
  async create(session: string): Promise<SessionInfo> {
    this.held.add(session);
    return this.info(session);
  }
  async fork(session: string): Promise<SessionInfo> {
    this.forks += 1;
    if (this.forkFails(this.forks)) throw new Error("the daemon could not restore the checkpoint");
    this.held.add(session);
    return this.info(session);
  }
  async delete(session: string): Promise<void> {
    this.held.delete(session);
  }
}

describe("forking many sessions at once", () => {
  const sessions = new StandInSessions();
  const runtime = {
    execute: () => Promise.reject(new Error("not used")),
    templates: async () => [
      { name: "python", contentHash: "0", language: "python", languages: ["python"], ready: true },
    ],
    sessions,
  } as unknown as ExecutionRuntime;
  let gw: TestGateway;
  let key: string;
  let keyId: string;
  let source: string;

  beforeAll(async () => {
    gw = await startTestGateway("pglite", { runtime });
    Object.assign(gw.context.config.sessions, { maxSessionsPerKey: MAX_SESSIONS });
    ({ key, keyId } = await gw.issue({ credits: 1_000_000 }));
    const created = await gw.call("POST", "/v1/sessions", {
      credential: key,
      body: { template: "python" },
    });
    expect(created.status, await created.clone().text()).toBe(201);
    source = ((await created.json()) as { id: string }).id;
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  const fork = (body: unknown) =>
    gw.call("POST", `/v1/sessions/${source}/fork`, { credential: key, body });
  const liveRows = async () => (await listSessions(gw.fresh.db, keyId)).map((row) => row.id);

  it("refuses a count outside 1..the maximum, or not an integer, with 422 and forks nothing", async () => {
    for (const count of [0, -1, MAX_FORK_COUNT + 1, 1.5, "2", null])
      await expectProblem(await fork({ checkpoint: 1, count }), 422, "validation-failed");
    expect(sessions.forks).toBe(0);
    expect(await liveRows()).toEqual([source]);
  });

  it("answers the sessions it made, one per count, and one Session without count", async () => {
    const many = await fork({ checkpoint: 1, count: 3 });
    expect(many.status, await many.clone().text()).toBe(201);
    const { sessions: made } = (await many.json()) as {
      sessions: { id: string; state: string }[];
    };
    expect(made.map((s) => s.state)).toEqual(["running", "running", "running"]);
    expect(new Set(made.map((s) => s.id)).size).toBe(3);
    const one = await fork({ checkpoint: 1 });
    expect(one.status).toBe(201);
    const single = (await one.json()) as { id: string; state: string };
    expect(single.state).toBe("running");
    const ids = [...made.map((s) => s.id), single.id];
    expect(ids.every((id) => sessions.held.has(id))).toBe(true);
    for (const id of ids)
      expect((await gw.call("DELETE", `/v1/sessions/${id}`, { credential: key })).status).toBe(200);
  });

  it("refuses more than the key's session limit holds, all of them, before forking any", async () => {
    const before = sessions.forks;
    await expectProblem(await fork({ checkpoint: 1, count: MAX_SESSIONS }), 429, "session-limit");
    expect(sessions.forks).toBe(before);
    expect(await liveRows()).toEqual([source]);
  });

  it("deletes the forks made when one fails, and leaves no row behind", async () => {
    const before = sessions.forks;
    sessions.forkFails = (call) => call === before + 3;
    const heldBefore = new Set(sessions.held);
    await expectProblem(await fork({ checkpoint: 1, count: 5 }), 502, "runtime-failed");
    sessions.forkFails = () => false;
    expect(sessions.forks).toBe(before + 5);
    expect(sessions.held).toEqual(heldBefore);
    expect(await liveRows()).toEqual([source]);
    const deleted = (
      await gw.fresh.db.select().from(sessionRows).where(eq(sessionRows.keyId, keyId))
    ).filter((row) => row.state === "deleted");
    expect(
      deleted.filter((row) => row.endedReason === "the runtime could not fork it"),
    ).toHaveLength(1);
    expect(
      deleted.filter((row) => row.endedReason === "another fork of the same request failed"),
    ).toHaveLength(4);
    expect(deleted.every((row) => row.runningSince === null)).toBe(true);
  });
});
