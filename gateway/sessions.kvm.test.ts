// Sessions end to end on KVM: the gateway on PGlite and the REAL supervised daemon keeping
// sessions (runtime/start.ts passes --sessions): state between cells, files, a durable
// checkpoint, pause and implicit resume, a fork and eight at once, billing (cells as executions,
// running GiB-seconds and checkpoint GiB-hours) in GET /v1/usage, the key's session limit, idle
// pause and deletion. Run by scripts/kvm-tier.sh (vitest.kvm.config.ts); waits scale with
// SANDFORK_TEST_TIME_SCALE.
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { eq } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { usageLedger } from "../db/schema.js";
import { loadRuntimeConfig } from "../runtime/config.js";
import { type StartedRuntime, startRuntime } from "../runtime/start.js";
import { requireVmmBinary } from "../runtime/testing/real-daemon.js";
import { daemonMaxima } from "./config.js";
import {
  kvmExecutionLimits,
  scaledDaemonReadyEnv,
  templatesWithPrebuilt,
} from "./testing/kvm-tier.js";
import {
  expectJson,
  expectProblem,
  startTestGateway,
  type TestGateway,
} from "./testing/test-gateway.js";

const CREDITS = 1_000_000;
const MAX_SESSIONS = 3;
let dir: string;
let runtime: StartedRuntime;
let gw: TestGateway;

interface Session {
  id: string;
  state: string;
  cells: number;
  last_checkpoint: { checkpoint: number; sha256: string } | null;
  checkpoint_bytes: number;
  usage: { units: number; running_gib_seconds: number; checkpoint_gib_hours: number };
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "sfk-sessions-"));
  await templatesWithPrebuilt(dir, ["python"]);
  const env = {
    SANDFORK_TEMPLATES: "python",
    SANDFORK_VMM_BIN: requireVmmBinary(),
    SANDFORK_VMM_CONNECTIONS: "2",
    SANDFORK_VMM_SERVE_ARGS: "--pool-size 1",
    ...scaledDaemonReadyEnv,
  };
  const started = await startRuntime(
    loadRuntimeConfig(env, dir),
    daemonMaxima(kvmExecutionLimits),
    () => {},
  );
  if (started === undefined) throw new Error("supervised mode must start a runtime");
  runtime = started;
  gw = await startTestGateway("pglite", {
    runtime: runtime.client,
    config: { executionLimits: kvmExecutionLimits },
  });
  Object.assign(gw.context.config.sessions, { maxSessionsPerKey: MAX_SESSIONS });
});

afterAll(async () => {
  await gw?.dispose();
  await runtime?.stop();
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

/** A new key with one python session: a caller with the key, and the session's id. */
async function keyWithSession() {
  const { key } = await gw.issue({ credits: CREDITS });
  const call = (method: string, path: string, body?: unknown) =>
    gw.call(method, path, { credential: key, ...(body === undefined ? {} : { body }) });
  const { id } = await expectJson<Session>(
    await call("POST", "/v1/sessions", { template: "python" }),
    201,
  );
  return { call, id };
}

describe("sessions through the gateway and the supervised daemon on KVM", () => {
  it("keeps state between cells, checkpoints, pauses, resumes, forks and bills it all", async () => {
    const { key, keyId, accountId } = await gw.issue({ credits: CREDITS });
    const call = (method: string, path: string, body?: unknown) =>
      gw.call(method, path, { credential: key, ...(body === undefined ? {} : { body }) });
    const created = await expectJson<Session>(
      await call("POST", "/v1/sessions", { template: "python", idle_timeout_s: 600 }),
      201,
    );
    expect(created).toMatchObject({ state: "running", cells: 0, last_checkpoint: null });
    const base = `/v1/sessions/${created.id}`;
    const cell = async (code: string) =>
      expectJson<{
        value: string | null;
        error: unknown;
        resumed: boolean;
        execution: { status: string; stdout: string };
        session: Session;
      }>(await call("POST", `${base}/executions`, { code }), 200);

    expect(
      (
        await cell(
          "import statistics\nrows = []\nlog = open('/work/log.txt', 'w')\nlog.write('a')\n6 * 7",
        )
      ).value,
    ).toBe("42");
    const put = await gw.call("PUT", `${base}/files/data/in.csv`, {
      credential: key,
      rawBody: "x\n1\n2\n3\n",
      headers: { "content-type": "application/octet-stream" },
    });
    expect(await expectJson(put, 200)).toEqual({ path: "data/in.csv", bytes: 8 });
    const second = await cell(
      "rows = [int(v) for v in open('/work/data/in.csv').read().split()[1:]]\nlog.write('b'); log.flush()\nprint('mean', statistics.mean(rows))\nsum(rows)",
    );
    expect([second.value, second.execution.stdout, second.error]).toEqual(["6", "mean 2\n", null]);
    const file = await gw.call("GET", `${base}/files/log.txt`, { credential: key });
    expect([file.status, await file.text()]).toEqual([200, "ab"]);
    // A file is bytes, not text: every byte value goes in and comes back.
    const bytes = Uint8Array.from({ length: 256 }, (_, i) => i);
    const binary = await gw.call("PUT", `${base}/files/all.bin`, {
      credential: key,
      rawBody: bytes,
      headers: { "content-type": "application/octet-stream" },
    });
    expect(await expectJson(binary, 200)).toEqual({ path: "all.bin", bytes: 256 });
    expect(
      new Uint8Array(
        await (await gw.call("GET", `${base}/files/all.bin`, { credential: key })).arrayBuffer(),
      ),
    ).toEqual(bytes);
    await expectProblem(
      await gw.call("GET", `${base}/files/missing.txt`, { credential: key }),
      404,
      "not-found",
    );
    await expectProblem(
      await gw.call("GET", `${base}/files/..%2Fetc%2Fpasswd`, { credential: key }),
      422,
      "validation-failed",
    );

    const checkpoint = await expectJson<{
      checkpoint: number;
      sha256: string;
      file_bytes: number;
      session: Session;
    }>(await call("POST", `${base}/checkpoints`), 201);
    expect(checkpoint.sha256).toMatch(/^[0-9a-f]{64}$/);
    expect(checkpoint.session.checkpoint_bytes).toBe(checkpoint.file_bytes);
    expect((await cell("rows.append(4)\nlen(rows)")).value).toBe("4");

    const paused = await expectJson<{ session: Session }>(await call("POST", `${base}/pause`), 201);
    expect(paused.session.state).toBe("paused");
    expect(paused.session.usage.running_gib_seconds).toBeGreaterThan(0);
    const resumed = await cell(
      "log.write('c'); log.flush()\n(len(rows), open('/work/log.txt').read())",
    );
    expect([resumed.value, resumed.resumed, resumed.session.state]).toEqual([
      "(4, 'abc')",
      true,
      "running",
    ]);

    // A fork from the first checkpoint has the state of then: three rows.
    const fork = await expectJson<Session>(
      await call("POST", `${base}/fork`, { checkpoint: checkpoint.checkpoint }),
      201,
    );
    const forked = await expectJson<{ value: string }>(
      await call("POST", `/v1/sessions/${fork.id}/executions`, { code: "len(rows)" }),
      200,
    );
    expect(forked.value).toBe("3");

    const listed = await expectJson<{ sessions: Session[] }>(
      await call("GET", "/v1/sessions"),
      200,
    );
    expect(listed.sessions.map((s) => s.id).sort()).toEqual([created.id, fork.id].sort());
    const detail = await expectJson<
      Session & { checkpoints: { checkpoint: number; sha256: string }[] }
    >(await call("GET", base), 200);
    expect(detail.checkpoints).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ checkpoint: checkpoint.checkpoint, sha256: checkpoint.sha256 }),
      ]),
    );

    for (const id of [fork.id, created.id]) {
      const deleted = await expectJson<Session>(await call("DELETE", `/v1/sessions/${id}`), 200);
      expect(deleted.state).toBe("deleted");
      await expectProblem(await call("GET", `/v1/sessions/${id}`), 404, "not-found");
    }

    // Billing: 5 cells as executions, the sessions' running time and storage as session entries,
    // all taken from the balance.
    const usage = await expectJson<{
      executions: number;
      units: number;
      sessions: { units: number; running_gib_seconds: number; checkpoint_gib_hours: number };
    }>(await call("GET", "/v1/usage"), 200);
    expect(usage.executions).toBe(5);
    expect(usage.sessions.units).toBeGreaterThan(0);
    expect(usage.sessions.running_gib_seconds).toBeGreaterThan(0);
    expect(usage.sessions.checkpoint_gib_hours).toBeGreaterThan(0);
    const balance = await gw.books(accountId);
    expect(balance).toMatchObject({ balanceUnits: CREDITS - usage.units, reservedUnits: 0 });
    const entries = await gw.fresh.db
      .select()
      .from(usageLedger)
      .where(eq(usageLedger.keyId, keyId));
    expect(entries.filter((e) => e.kind === "session").every((e) => e.sessionId !== null)).toBe(
      true,
    );
  });

  it("enforces the key's session limit, pauses idle sessions and refuses an ended one", async () => {
    const { key } = await gw.issue({ credits: CREDITS });
    const call = (method: string, path: string, body?: unknown) =>
      gw.call(method, path, { credential: key, ...(body === undefined ? {} : { body }) });
    const ids: string[] = [];
    for (let i = 0; i < MAX_SESSIONS; i++)
      ids.push(
        (
          await expectJson<Session>(
            await call("POST", "/v1/sessions", { template: "python", idle_timeout_s: 1 }),
            201,
          )
        ).id,
      );
    await expectProblem(
      await call("POST", "/v1/sessions", { template: "python" }),
      429,
      "session-limit",
    );

    await expectJson(
      await call("POST", `/v1/sessions/${ids[0]}/executions`, { code: "kept = 'yes'" }),
      200,
    );
    await new Promise((resolve) => setTimeout(resolve, 1_100));
    await gw.context.sessions.sweep();
    const idle = await expectJson<Session>(await call("GET", `/v1/sessions/${ids[0]}`), 200);
    expect(idle.state).toBe("paused");
    expect(idle.last_checkpoint).not.toBeNull();
    const back = await expectJson<{ value: string; resumed: boolean }>(
      await call("POST", `/v1/sessions/${ids[0]}/executions`, { code: "kept" }),
      200,
    );
    expect([back.value, back.resumed]).toEqual(["'yes'", true]);

    const ended = await expectJson<{ session: Session; execution: { status: string } }>(
      await call("POST", `/v1/sessions/${ids[1]}/executions`, { code: "import os; os._exit(0)" }),
      200,
    );
    expect(ended.session.state).toBe("ended");
    await expectProblem(
      await call("POST", `/v1/sessions/${ids[1]}/executions`, { code: "1" }),
      409,
      "session-ended",
    );
    for (const id of ids) await expectJson(await call("DELETE", `/v1/sessions/${id}`), 200);
  });

  it("forks eight sessions from one checkpoint at once, each with its own copy of the state", async () => {
    const { key } = await gw.issue({ credits: CREDITS });
    const call = (method: string, path: string, body?: unknown) =>
      gw.call(method, path, { credential: key, ...(body === undefined ? {} : { body }) });
    const cell = async (id: string, code: string) =>
      (
        await expectJson<{ value: string | null }>(
          await call("POST", `/v1/sessions/${id}/executions`, { code }),
          200,
        )
      ).value;
    const FORKS = 8;
    const limits = gw.context.config.sessions;
    const { maxSessionsPerKey } = limits;
    Object.assign(limits, { maxSessionsPerKey: FORKS + 1 });
    try {
      const source = await expectJson<Session>(
        await call("POST", "/v1/sessions", { template: "python" }),
        201,
      );
      await cell(source.id, "x = 41");
      await expectJson(await call("POST", `/v1/sessions/${source.id}/checkpoints`), 201);
      await expectProblem(
        await call("POST", `/v1/sessions/${source.id}/fork`, { count: 0 }),
        422,
        "validation-failed",
      );
      const { sessions: forks } = await expectJson<{ sessions: Session[] }>(
        await call("POST", `/v1/sessions/${source.id}/fork`, { count: FORKS }),
        201,
      );
      expect(forks.map((f) => f.state)).toEqual(Array(FORKS).fill("running"));
      expect(new Set([source.id, ...forks.map((f) => f.id)]).size).toBe(FORKS + 1);
      // One after another, each adds 1 to its own x: a fork that saw another's change answers 43.
      for (const fork of forks) expect(await cell(fork.id, "x += 1\nx")).toBe("42");
      expect(await cell(source.id, "x")).toBe("41");
      for (const id of [...forks.map((f) => f.id), source.id])
        await expectJson(await call("DELETE", `/v1/sessions/${id}`), 200);
    } finally {
      Object.assign(limits, { maxSessionsPerKey });
    }
  });

  it("a cell's max_processes reaches the session's program; one out of range is 422", async () => {
    const { call, id } = await keyWithSession();
    const code = await readFile(
      new URL("../native-vmm/tests/programs/fork_until_refused.py", import.meta.url),
      "utf8",
    );
    const forked = await expectJson<{ execution: { status: string; stdout: string } }>(
      await call("POST", `/v1/sessions/${id}/executions`, { code, max_processes: 3 }),
      200,
    );
    // The session's program and two children: a third fork is EAGAIN.
    expect(forked.execution).toMatchObject({ status: "completed", stdout: "2 EAGAIN\n" });
    await expectProblem(
      await call("POST", `/v1/sessions/${id}/executions`, { code, max_processes: 0 }),
      422,
      "validation-failed",
    );
    await expectJson(await call("DELETE", `/v1/sessions/${id}`), 200);
  });

  it("a process a cell starts lives on into the next cell and through a pause; a socket is refused", async () => {
    const { call, id } = await keyWithSession();
    const cell = async (code: string) =>
      (
        await expectJson<{ value: string | null; error: unknown }>(
          await call("POST", `/v1/sessions/${id}/executions`, { code }),
          200,
        )
      ).value;
    await cell("import os, subprocess\nchild = subprocess.Popen(['sleep', '100'])");
    expect(await cell("(child.poll(), os.path.exists(f'/proc/{child.pid}'))")).toBe("(None, True)");
    await expectJson(await call("POST", `/v1/sessions/${id}/pause`), 201);
    expect(await cell("(child.poll(), os.path.exists(f'/proc/{child.pid}'))")).toBe("(None, True)");
    const server = await cell(
      "import sys\nserver = subprocess.Popen([sys.executable, '-c', 'import socket, time\\ns = socket.socket()\\ns.bind((\"127.0.0.1\", 0))\\nprint(1, flush=True)\\ntime.sleep(100)'], stdout=subprocess.PIPE)\nserver.stdout.readline()\nserver.pid",
    );
    const refused = await expectProblem(
      await call("POST", `/v1/sessions/${id}/pause`),
      409,
      "session-not-checkpointable",
    );
    expect(JSON.stringify(refused)).toContain(`process ${server} holds a socket`);
    expect(await cell("server.kill()\nchild.kill()\n(server.wait(), child.wait())")).toBe(
      "(-9, -9)",
    );
    await expectJson(await call("POST", `/v1/sessions/${id}/pause`), 201);
    expect(await cell("child.returncode")).toBe("-9");
    await expectJson(await call("DELETE", `/v1/sessions/${id}`), 200);
  });
});
