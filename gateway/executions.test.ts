// The execute path with a TEST DOUBLE of the ExecutionRuntime boundary (the real daemon answers every
// execute with `unavailable` on a machine without /dev/kvm; runtime/gateway-runtime.test.ts covers
// that). The double runs no code: it returns results scripted by each test, so that the gateway's
// real reserve → execute → settle billing flow can be exercised against both databases.

import { eq } from "drizzle-orm";
import { afterAll, beforeAll, beforeEach, describe, expect, it, vi } from "vitest";
import { findExecution } from "../db/billing.js";
import { getBalance } from "../db/keys.js";
import { executions } from "../db/schema.js";
import { BACKENDS } from "../db/testing/fresh-database.js";
import { RuntimeBusyError, RuntimeUnavailableError } from "../runtime/errors.js";
import type {
  ExecutionRequest,
  ExecutionResult,
  ExecutionRuntime,
  Template,
} from "../runtime/execution-runtime.js";
import { expectProblem, startTestGateway, type TestGateway } from "./testing/test-gateway.js";

/** Test double: records requests and answers with `respond` (default: a completed run). */
class ScriptedRuntimeTestDouble implements ExecutionRuntime {
  readonly requests: ExecutionRequest[] = [];
  respond: (request: ExecutionRequest, signal: AbortSignal) => Promise<ExecutionResult> =
    async () => completed();
  async execute(request: ExecutionRequest, signal: AbortSignal): Promise<ExecutionResult> {
    this.requests.push(request);
    return this.respond(request, signal);
  }
  async templates(): Promise<Template[]> {
    return [
      {
        name: "python",
        language: "python",
        languages: ["python"],
        contentHash: "c0ffee",
        ready: true,
      },
      {
        name: "node",
        language: "node",
        languages: ["javascript", "typescript"],
        contentHash: "beef",
        ready: false,
      },
    ];
  }
}

function completed(overrides: Partial<ExecutionResult> = {}): ExecutionResult {
  return {
    outcome: "completed",
    exitCode: 0,
    stdout: "45\n",
    stderr: "",
    truncated: false,
    timings: { queueMs: 1, forkMs: 2, execMs: 150 },
    ...overrides,
  };
}

interface ExecutionBody {
  id: string;
  status: string;
  exit_code: number | null;
  stdout: string;
  stderr: string;
  truncated: boolean;
  timings: { queue_ms: number; fork_ms: number; exec_ms: number; total_ms: number };
  usage: { unit: string; units: number; reserved_units: number };
  results?: unknown[];
}

const PROGRAM = { template: "python", code: "print(sum(range(10)))" };
// Default price: 1 unit + 10 units per second. Reserve at the 5 s default timeout: 1 + 50.
// Charge for fork 2 ms + exec 150 ms: 1 + ceil(1.52) = 3.
const RESERVED = 51;
const CHARGED = 3;

describe.each(BACKENDS)("executions on %s", (backend) => {
  let gw: TestGateway;
  let runtime: ScriptedRuntimeTestDouble;
  beforeAll(async () => {
    gw = await startTestGateway(backend);
  });
  afterAll(async () => {
    await gw?.dispose();
  });
  beforeEach(() => {
    runtime = new ScriptedRuntimeTestDouble();
    gw.runtime = runtime;
    gw.spans.reset();
  });

  const execute = (
    credential: string,
    body: unknown = PROGRAM,
    headers: Record<string, string> = {},
  ) => gw.call("POST", "/v1/executions", { credential, body, headers });

  it("runs through the runtime boundary, reserves the worst case and charges the actual cost", async () => {
    const { key, keyId, accountId } = await gw.issue({ credits: 100 });
    const response = await execute(key, {
      ...PROGRAM,
      stdin: "in",
      args: ["-q"],
      env: { A: "1" },
      files: [{ path: "d/x.txt", content: "x" }],
    });
    expect(response.status).toBe(200);
    const body = (await response.json()) as ExecutionBody;
    expect(body).toMatchObject({
      status: "completed",
      exit_code: 0,
      stdout: "45\n",
      stderr: "",
      truncated: false,
      usage: { unit: "credit", units: CHARGED, reserved_units: RESERVED },
    });
    expect(body.timings).toMatchObject({ queue_ms: 1, fork_ms: 2, exec_ms: 150 });
    expect(runtime.requests).toEqual([
      {
        executionId: body.id,
        template: "python",
        code: PROGRAM.code,
        stdin: "in",
        args: ["-q"],
        env: { A: "1" },
        files: [{ path: "d/x.txt", content: "x", encoding: "utf8" }],
        // The template's first language; no memory asked for: the template's VM size.
        language: "python",
        timeoutMs: 5_000,
        // Whose it is: the runtime's line for the key.
        keyId,
      },
    ]);
    // Durable before the answer: the record and the balance are already settled.
    expect(await findExecution(gw.fresh.db, body.id)).toMatchObject({
      status: "completed",
      chargedUnits: CHARGED,
    });
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: 100 - CHARGED,
      reservedUnits: 0,
    });

    const fetched = await gw.call("GET", `/v1/executions/${body.id}`, { credential: key });
    expect(fetched.status).toBe(200);
    expect(await fetched.json()).toMatchObject({
      id: body.id,
      status: "completed",
      stdout: "45\n",
    });
    const stranger = await gw.issue();
    await expectProblem(
      await gw.call("GET", `/v1/executions/${body.id}`, { credential: stranger.key }),
      404,
      "not-found",
    );
    const admin = await gw.issue({ scopes: ["admin"] });
    expect(
      (await gw.call("GET", `/v1/executions/${body.id}`, { credential: admin.key })).status,
    ).toBe(200);
  });

  it("runs one of the template's languages and refuses any other before billing", async () => {
    const { key } = await gw.issue({ credits: 100 });
    const ran = await execute(key, {
      template: "node",
      language: "typescript",
      code: "const n: number = 45; console.log(n)",
      memory_mb: 1024,
    });
    expect(ran.status).toBe(200);
    expect(runtime.requests).toMatchObject([
      { template: "node", language: "typescript", memoryMb: 1024 },
    ]);
    const refused = await execute(key, { template: "node", language: "python", code: "print(1)" });
    expect(refused.status).toBe(422);
    expect(await refused.json()).toMatchObject({
      type: expect.stringContaining("unknown-language"),
      languages: ["javascript", "typescript"],
    });
    expect(runtime.requests).toHaveLength(1);
  });

  it("hands max_processes to the runtime and refuses one out of range with 422 before billing", async () => {
    const { key, accountId } = await gw.issue({ credits: 100 });
    for (const max_processes of [3, 64])
      expect((await execute(key, { ...PROGRAM, max_processes })).status).toBe(200);
    expect(runtime.requests.map((r) => r.maxProcesses)).toEqual([3, 64]);
    // The gateway's maximum (SANDFORK_MAX_PROCESSES) is 64 here.
    for (const max_processes of [0, -1, 2.5, 65, "3", null]) {
      const problem = await expectProblem(
        await execute(key, { ...PROGRAM, max_processes }),
        422,
        "validation-failed",
      );
      expect((problem.errors as { path: string }[]).map((e) => e.path)).toEqual(["max_processes"]);
    }
    expect(runtime.requests).toHaveLength(2);
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: 100 - 2 * CHARGED,
      reservedUnits: 0,
    });
  });

  it("reports guest failures as statuses and bills them like any run", async () => {
    const { key } = await gw.issue({ credits: 100 });
    runtime.respond = async () =>
      completed({ outcome: "crashed", exitCode: null, stdout: "", stderr: "" });
    expect(await (await execute(key)).json()).toMatchObject({
      status: "crashed",
      exit_code: null,
      usage: { units: CHARGED },
    });
    runtime.respond = async () =>
      completed({ outcome: "completed", exitCode: 1, stderr: "Traceback" });
    expect(await (await execute(key)).json()).toMatchObject({
      status: "completed",
      exit_code: 1,
      stderr: "Traceback",
    });
  });

  it("bills a timed-out execution for at most its timeout", async () => {
    const { key, accountId } = await gw.issue({ credits: 100 });
    runtime.respond = async () =>
      completed({
        outcome: "timed_out",
        exitCode: null,
        stdout: "",
        timings: { queueMs: 0, forkMs: 1, execMs: 1_000 },
      });
    const response = await execute(key, { ...PROGRAM, timeout_ms: 1_000 });
    expect(await response.json()).toMatchObject({
      status: "timed_out",
      exit_code: null,
      usage: { reserved_units: 11, units: 11 },
    });
    expect(await gw.books(accountId)).toMatchObject({ balanceUnits: 89, reservedUnits: 0 });
  });

  it("lists templates with their prices", async () => {
    const { key } = await gw.issue();
    const response = await gw.call("GET", "/v1/templates", { credential: key });
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({
      templates: [
        {
          name: "python",
          language: "python",
          languages: ["python"],
          content_hash: "c0ffee",
          ready: true,
          price: { unit: "credit", base_units: 1, units_per_second: 10, units_per_network_mib: 1 },
        },
        {
          name: "node",
          language: "node",
          languages: ["javascript", "typescript"],
          content_hash: "beef",
          ready: false,
          price: { unit: "credit", base_units: 1, units_per_second: 10, units_per_network_mib: 1 },
        },
      ],
      custom_templates: [],
    });
  });

  it("sums usage per key and period, by template", async () => {
    const { key, keyId } = await gw.issue({ credits: 1_000 });
    const other = await gw.issue({ credits: 1_000 });
    for (const template of ["python", "python", "node"])
      expect((await execute(key, { ...PROGRAM, template })).status).toBe(200);
    expect((await execute(other.key)).status).toBe(200);

    const usage = await gw.call("GET", "/v1/usage", { credential: key });
    expect(await usage.json()).toMatchObject({
      key_id: keyId,
      executions: 3,
      units: 3 * CHARGED,
      by_template: [
        { template: "node", executions: 1, units: CHARGED },
        { template: "python", executions: 2, units: 2 * CHARGED },
      ],
      balance: {
        balance_units: 1_000 - 3 * CHARGED,
        reserved_units: 0,
        available_units: 1_000 - 3 * CHARGED,
      },
    });
    const future = new Date(Date.now() + 3_600_000).toISOString();
    const later = new Date(Date.now() + 7_200_000).toISOString();
    const empty = await gw.call(
      "GET",
      `/v1/usage?from=${encodeURIComponent(future)}&to=${encodeURIComponent(later)}`,
      { credential: key },
    );
    expect(await empty.json()).toMatchObject({ executions: 0, units: 0, by_template: [] });

    await expectProblem(
      await gw.call("GET", `/v1/usage?key_id=${other.keyId}`, { credential: key }),
      403,
      "insufficient-scope",
    );
    const admin = await gw.issue({ scopes: ["admin"] });
    const asAdmin = await gw.call("GET", `/v1/usage?key_id=${other.keyId}`, {
      credential: admin.key,
    });
    expect(await asAdmin.json()).toMatchObject({
      key_id: other.keyId,
      executions: 1,
      units: CHARGED,
    });
  });

  it("Idempotency-Key: a retry returns the first result and is billed once", async () => {
    const { key, accountId } = await gw.issue({ credits: 100 });
    const first = await execute(key, PROGRAM, { "idempotency-key": "retry-1" });
    const firstBody = (await first.json()) as ExecutionBody;
    runtime.respond = async () => completed({ stdout: "a different run\n" });
    const second = await execute(
      key,
      { code: PROGRAM.code, template: "python" },
      { "idempotency-key": "retry-1" },
    );
    expect(second.status).toBe(200);
    expect(second.headers.get("idempotent-replayed")).toBe("true");
    expect(first.headers.get("idempotent-replayed")).toBeNull();
    // The replay is the first answer but for its results, which are not kept.
    const { results: _results, ...recorded } = firstBody;
    expect(await second.json()).toEqual(recorded);
    expect(runtime.requests).toHaveLength(1);
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: 100 - CHARGED,
      reservedUnits: 0,
    });
    const usage = (await (await gw.call("GET", "/v1/usage", { credential: key })).json()) as {
      executions: number;
      units: number;
    };
    expect(usage).toMatchObject({ executions: 1, units: CHARGED });

    await expectProblem(
      await execute(key, { ...PROGRAM, code: "print(2)" }, { "idempotency-key": "retry-1" }),
      422,
      "idempotency-key-reused",
    );
    // The same Idempotency-Key on another key is another request.
    const other = await gw.issue({ credits: 100 });
    const otherBody = (await (
      await execute(other.key, PROGRAM, { "idempotency-key": "retry-1" })
    ).json()) as ExecutionBody;
    expect(otherBody.id).not.toBe(firstBody.id);
    await expectProblem(
      await execute(key, PROGRAM, { "idempotency-key": "bad key\u0001" }),
      422,
      "validation-failed",
    );
  });

  it("Idempotency-Key under concurrent duplicates: the program runs once, the others get 409 or the replay", async () => {
    const { key, accountId } = await gw.issue({ credits: 100 });
    let finish!: () => void;
    const gate = new Promise<void>((resolve) => (finish = resolve));
    runtime.respond = async () => {
      await gate;
      return completed();
    };
    const racing = Array.from({ length: 5 }, () =>
      execute(key, PROGRAM, { "idempotency-key": "race" }),
    );
    await new Promise((r) => setTimeout(r, 300));
    finish();
    const responses = await Promise.all(racing);
    const statuses = responses.map((r) => r.status).sort();
    // Exactly one answer is the run itself; any other 200 must say it is a replay.
    const ran = responses.filter(
      (r) => r.status === 200 && r.headers.get("idempotent-replayed") === null,
    );
    expect(ran).toHaveLength(1);
    expect(statuses.every((s) => s === 200 || s === 409)).toBe(true);
    for (const r of responses.filter((r) => r.status === 409)) {
      expect(r.headers.get("retry-after")).toBe("1");
      await expectProblem(r, 409, "idempotency-conflict");
    }
    expect(runtime.requests).toHaveLength(1);
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: 100 - CHARGED,
      reservedUnits: 0,
    });
  });

  it("Idempotency-Key shared by a streamed and a plain request: whichever comes second gets 409 while the first runs, then its replay", async () => {
    const { key, accountId } = await gw.issue({ credits: 100 });
    let finish!: () => void;
    runtime.respond = async () => {
      await new Promise<void>((resolve) => (finish = resolve));
      return completed();
    };
    const whileRunning = async (first: Promise<Response>, second: () => Promise<Response>) => {
      while (runtime.requests.length === 0) await new Promise((r) => setTimeout(r, 5));
      await expectProblem(await second(), 409, "idempotency-conflict");
      runtime.requests.length = 0;
      finish();
      return first;
    };
    const streamed = { ...PROGRAM, stream: true };

    const streamedFirst = await whileRunning(
      execute(key, streamed, { "idempotency-key": "s" }),
      () => execute(key, PROGRAM, { "idempotency-key": "s" }),
    );
    const final = /event: execution\ndata: (.*)\n/.exec(await streamedFirst.text())?.[1];
    const plainReplay = await execute(key, PROGRAM, { "idempotency-key": "s" });
    expect(plainReplay.headers.get("idempotent-replayed")).toBe("true");
    const { results: _streamed, ...streamedRecord } = JSON.parse(final ?? "null") as ExecutionBody;
    expect(await plainReplay.json()).toEqual(streamedRecord);

    const plainFirst = await whileRunning(execute(key, PROGRAM, { "idempotency-key": "p" }), () =>
      execute(key, streamed, { "idempotency-key": "p" }),
    );
    const plainBody = (await plainFirst.json()) as ExecutionBody;
    const streamedReplay = await (await execute(key, streamed, { "idempotency-key": "p" })).text();
    const { results: _plain, ...plainRecord } = plainBody;
    expect(
      JSON.parse(/event: execution\ndata: (.*)\n/.exec(streamedReplay)?.[1] ?? "null"),
    ).toEqual(plainRecord);

    expect(runtime.requests).toHaveLength(0);
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: 100 - 2 * CHARGED,
      reservedUnits: 0,
    });
    const records = await gw.fresh.db
      .select()
      .from(executions)
      .where(eq(executions.accountId, accountId));
    expect(records.map((r) => [r.idempotencyKey, r.status]).sort()).toEqual([
      ["p", "completed"],
      ["s", "completed"],
    ]);
  });

  it("402 when the balance cannot cover the reservation; nothing runs, nothing is held", async () => {
    const { key, accountId } = await gw.issue({ credits: RESERVED - 1 });
    const problem = await expectProblem(await execute(key), 402, "insufficient-credits");
    expect(problem).toMatchObject({ required_units: RESERVED, available_units: RESERVED - 1 });
    expect(runtime.requests).toHaveLength(0);
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: RESERVED - 1,
      reservedUnits: 0,
    });
    // A shorter timeout needs a smaller reservation and fits.
    expect((await execute(key, { ...PROGRAM, timeout_ms: 1_000 })).status).toBe(200);
  });

  it("429 with Retry-After beyond the key's concurrency", async () => {
    const { key } = await gw.issue({ credits: 1_000, maxConcurrency: 1 });
    let finish!: () => void;
    const gate = new Promise<void>((resolve) => (finish = resolve));
    runtime.respond = async () => {
      await gate;
      return completed();
    };
    const first = execute(key);
    while (runtime.requests.length === 0) await new Promise((r) => setTimeout(r, 5));
    const second = await execute(key);
    expect(second.headers.get("retry-after")).toBe("1");
    await expectProblem(second, 429, "concurrency-limit");
    finish();
    expect((await first).status).toBe(200);
    expect((await execute(key)).status).toBe(200);
  });

  it("a failing runtime releases the reservation: 502, or 503 when it lost its daemon; nothing is charged", async () => {
    const { key, accountId } = await gw.issue({ credits: 100 });
    runtime.respond = async () => {
      throw new Error("the VM crashed");
    };
    await expectProblem(
      await execute(key, PROGRAM, { "idempotency-key": "fails" }),
      502,
      "runtime-failed",
    );
    runtime.respond = async () => {
      throw new RuntimeUnavailableError("daemon connection lost");
    };
    const unavailable = await execute(key);
    expect(unavailable.headers.get("retry-after")).toBe("5");
    await expectProblem(unavailable, 503, "runtime-unavailable");
    runtime.respond = async () => {
      throw new RuntimeBusyError();
    };
    const busy = await execute(key);
    expect(busy.headers.get("retry-after")).toBe("1");
    await expectProblem(busy, 503, "runtime-busy");
    expect(await gw.books(accountId)).toMatchObject({ balanceUnits: 100, reservedUnits: 0 });
    // On a PostgreSQL server the request with an Idempotency-Key was recorded before it ran, so its
    // record stays, aborted; on PGlite its key was claimed in memory (gateway/idempotency-claims.ts).
    // The others held credits of the gateway's lease only: no record at all.
    const records = await gw.fresh.db
      .select()
      .from(executions)
      .where(eq(executions.accountId, accountId));
    expect(records.map((r) => [r.status, r.chargedUnits])).toEqual(
      backend === "postgres" ? [["aborted", 0]] : [],
    );
    // The failed request's Idempotency-Key was freed: a retry runs afresh.
    runtime.respond = async () => completed();
    expect((await execute(key, PROGRAM, { "idempotency-key": "fails" })).status).toBe(200);
  });

  it("a settlement the database would refuse answers 500 and frees the hold at once; nothing is charged", async () => {
    const { key, accountId } = await gw.issue({ credits: 100 });
    // PostgreSQL's text holds no NUL (the daemon client maps NUL away; this runtime double does
    // not): PostgreSQL refuses the record; on PGlite, the record journal before appending it
    // (db/leases.ts, checkRecordable).
    runtime.respond = async () => completed({ stdout: "bad\u0000" });
    await expectProblem(await execute(key), 500, "internal-error");
    expect(await gw.books(accountId)).toMatchObject({ balanceUnits: 100, reservedUnits: 0 });
  });

  it("503 while no runtime is connected, after authentication and validation, billing nothing", async () => {
    const { key, keyId, accountId } = await gw.issue({ credits: 100 });
    gw.runtime = undefined;
    await expectProblem(await execute("sfk_nope"), 401, "invalid-credentials");
    await expectProblem(await execute(key, { template: "python" }), 422, "validation-failed");
    const response = await execute(key);
    expect(response.headers.get("retry-after")).toBe("5");
    const problem = await expectProblem(response, 503, "runtime-unavailable");
    expect(problem.retryable).toBe(true);
    await expectProblem(
      await gw.call("GET", "/v1/templates", { credential: key }),
      503,
      "runtime-unavailable",
    );
    expect(
      await gw.fresh.db.select().from(executions).where(eq(executions.keyId, keyId)),
    ).toHaveLength(0);
    expect(await gw.books(accountId)).toMatchObject({ balanceUnits: 100, reservedUnits: 0 });
  });

  it("422 for a template the runtime does not offer", async () => {
    const { key } = await gw.issue({ credits: 100 });
    const problem = await expectProblem(
      await execute(key, { ...PROGRAM, template: "cobol" }),
      422,
      "unknown-template",
    );
    expect(problem.templates).toEqual(["python", "node"]);
  });

  it("tokens: allowed templates and a maximum number of executions, billed to the parent key", async () => {
    const { key, accountId } = await gw.issue({ credits: 100 });
    const minted = await gw.call("POST", "/v1/tokens", {
      credential: key,
      body: { templates: ["python"], max_executions: 2 },
    });
    const { token } = (await minted.json()) as { token: string };
    await expectProblem(
      await execute(token, { ...PROGRAM, template: "node" }),
      403,
      "template-not-allowed",
    );
    expect((await execute(token)).status).toBe(200);
    expect((await execute(token, PROGRAM, { "idempotency-key": "tok" })).status).toBe(200);
    // A replay of a finished execution does not count against the token.
    expect((await execute(token, PROGRAM, { "idempotency-key": "tok" })).status).toBe(200);
    await expectProblem(await execute(token), 403, "token-execution-limit");
    expect(runtime.requests).toHaveLength(2);
    expect(await gw.books(accountId)).toMatchObject({ balanceUnits: 100 - 2 * CHARGED });
  });

  it("tokens see only their own executions and cannot replay another caller's Idempotency-Key", async () => {
    const { key } = await gw.issue({ credits: 100 });
    const mint = async () =>
      (
        (await (await gw.call("POST", "/v1/tokens", { credential: key, body: {} })).json()) as {
          token: string;
        }
      ).token;
    const [alice, bob] = [await mint(), await mint()];
    const byKey = (await (
      await execute(key, PROGRAM, { "idempotency-key": "shared" })
    ).json()) as ExecutionBody;
    const byAlice = (await (await execute(alice)).json()) as ExecutionBody;
    expect(
      (await gw.call("GET", `/v1/executions/${byAlice.id}`, { credential: alice })).status,
    ).toBe(200);
    expect((await gw.call("GET", `/v1/executions/${byAlice.id}`, { credential: key })).status).toBe(
      200,
    );
    await expectProblem(
      await gw.call("GET", `/v1/executions/${byAlice.id}`, { credential: bob }),
      404,
      "not-found",
    );
    await expectProblem(
      await gw.call("GET", `/v1/executions/${byKey.id}`, { credential: bob }),
      404,
      "not-found",
    );
    await expectProblem(
      await execute(bob, PROGRAM, { "idempotency-key": "shared" }),
      422,
      "idempotency-key-reused",
    );
  });

  it("revoking a key stops the tokens minted from it at their next execution", async () => {
    const admin = await gw.issue({ scopes: ["admin"] });
    const { key, keyId, accountId } = await gw.issue({ credits: 100 });
    const { token } = (await (
      await gw.call("POST", "/v1/tokens", { credential: key, body: {} })
    ).json()) as { token: string };
    expect((await execute(token)).status).toBe(200);
    expect((await gw.call("DELETE", `/v1/keys/${keyId}`, { credential: admin.key })).status).toBe(
      200,
    );
    await expectProblem(await execute(token), 401, "credentials-revoked");
    expect(runtime.requests).toHaveLength(1);
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: 100 - CHARGED,
      reservedUnits: 0,
    });
  });

  it("gives up on a runtime that overstays the timeout by the grace, and aborts what runs at shutdown; neither is billed", async () => {
    const shutdown = new AbortController();
    const local = await startTestGateway(backend, {
      fresh: gw.fresh,
      config: { runtimeGraceMs: 50 },
      shutdownSignal: shutdown.signal,
    });
    try {
      const { key, accountId } = await local.issue({ credits: 100 });
      const reasons: unknown[] = [];
      // A runtime that never answers on its own: it gives up only when its signal aborts.
      runtime.respond = (_request, signal) =>
        new Promise((_resolve, reject) =>
          signal.addEventListener("abort", () => {
            reasons.push(signal.reason);
            reject(signal.reason);
          }),
        );
      local.runtime = runtime;
      const call = (body: unknown) =>
        local.call("POST", "/v1/executions", { credential: key, body });
      await expectProblem(await call({ ...PROGRAM, timeout_ms: 100 }), 502, "runtime-failed");
      expect(reasons[0]).toMatchObject({ name: "TimeoutError" });

      const pending = call(PROGRAM);
      await vi.waitUntil(() => runtime.requests.length === 2);
      shutdown.abort(new Error("the gateway is shutting down"));
      await expectProblem(await pending, 502, "runtime-failed");
      expect(reasons[1]).toMatchObject({ message: "the gateway is shutting down" });
      // Aborted before it started: the runtime is not asked.
      await expectProblem(await call(PROGRAM), 502, "runtime-failed");
      expect(runtime.requests).toHaveLength(2);
      expect(await local.books(accountId)).toMatchObject({ balanceUnits: 100, reservedUnits: 0 });
    } finally {
      await local.dispose();
    }
  });

  it("traces the request: server span with FaaS attributes; auth, billing and runtime children; queue, fork and exec under the runtime's", async () => {
    const { key } = await gw.issue({ credits: 100 });
    const response = await execute(key, PROGRAM, { "x-request-id": "req-123" });
    expect(response.headers.get("x-request-id")).toBe("req-123");
    const spans = gw.spans.getFinishedSpans();
    const server = spans.find((s) => s.name === "POST /v1/executions");
    expect(server?.attributes).toMatchObject({
      "faas.trigger": "http",
      "faas.invocation_id": "req-123",
      "http.response.status_code": 200,
    });
    expect(typeof server?.attributes["faas.coldstart"]).toBe("boolean");
    const traceId = server?.spanContext().traceId;
    const childOf = (parent: string | undefined, names: string[]) => {
      for (const name of names) {
        const child = spans.find((s) => s.name === name);
        expect(child, name).toBeDefined();
        expect(child?.spanContext().traceId, name).toBe(traceId);
        expect(child?.parentSpanContext?.spanId, name).toBe(parent);
      }
    };
    childOf(server?.spanContext().spanId, [
      "auth",
      "billing.reserve",
      "runtime.execute",
      "billing.settle",
    ]);
    childOf(spans.find((s) => s.name === "runtime.execute")?.spanContext().spanId, [
      "queue",
      "fork",
      "exec",
    ]);
    const fork = spans.find((s) => s.name === "fork");
    expect(fork && fork.duration[0] * 1e3 + fork.duration[1] / 1e6).toBeCloseTo(2, 0);

    const metrics = await (await gw.call("GET", "/metrics")).text();
    expect(metrics).toMatch(
      /sandfork_executions_total\{[^}]*template="python"[^}]*status="completed"[^}]*\} [1-9]/,
    );
    expect(metrics).toMatch(/sandfork_billing_units_total\{[^}]*template="python"[^}]*\} [1-9]/);
    expect(metrics).toMatch(/sandfork_execution_duration_(seconds_)?count\{[^}]*template="python"/);
  });
});

describe("100 concurrent executions on one key with credits for 60, against a PostgreSQL server", () => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway("postgres", {
      config: {
        pricing: { unitName: "credit", templates: { "*": { baseUnits: 1, unitsPerSecond: 0 } } },
      },
    });
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  it("exactly 60 run and are billed, 40 get 402, the balance never goes negative", async () => {
    const runtime = new ScriptedRuntimeTestDouble();
    runtime.respond = async () => {
      await new Promise((r) => setTimeout(r, 20));
      return completed();
    };
    gw.runtime = runtime;
    const { key, keyId, accountId } = await gw.issue({ credits: 60 });
    let lowest = Number.POSITIVE_INFINITY;
    let watching = true;
    const watcher = (async () => {
      while (watching) {
        const b = await getBalance(gw.fresh.db, accountId);
        if (b) lowest = Math.min(lowest, b.balanceUnits, b.availableUnits);
        await new Promise((r) => setTimeout(r, 2));
      }
    })();
    const responses = await Promise.all(
      Array.from({ length: 100 }, () =>
        gw.call("POST", "/v1/executions", { credential: key, body: PROGRAM }),
      ),
    );
    watching = false;
    await watcher;
    const statuses = responses.map((r) => r.status);
    expect(statuses.filter((s) => s === 200)).toHaveLength(60);
    expect(statuses.filter((s) => s === 402)).toHaveLength(40);
    expect(runtime.requests).toHaveLength(60);
    // Finite: the watcher saw the balance at least once (else the bound below holds vacuously).
    expect(Number.isFinite(lowest)).toBe(true);
    expect(lowest).toBeGreaterThanOrEqual(0);
    expect(await gw.books(accountId)).toEqual({
      accountId,
      balanceUnits: 0,
      reservedUnits: 0,
      availableUnits: 0,
    });
    const usage = await (await gw.call("GET", "/v1/usage", { credential: key })).json();
    expect(usage).toMatchObject({ key_id: keyId, executions: 60, units: 60 });
  });
});

describe("two gateways on one PostgreSQL, one account with credits for 40", () => {
  let a: TestGateway;
  let b: TestGateway;
  const config = {
    pricing: { unitName: "credit", templates: { "*": { baseUnits: 1, unitsPerSecond: 0 } } },
  };
  beforeAll(async () => {
    a = await startTestGateway("postgres", { config });
    b = await startTestGateway("postgres", { config, fresh: a.fresh });
  });
  afterAll(async () => {
    await b?.dispose();
    await a?.dispose();
  });

  it("their leases never overspend it together, and what they hold goes back to the last credit", async () => {
    const runtime = new ScriptedRuntimeTestDouble();
    runtime.respond = async () => {
      await new Promise((r) => setTimeout(r, 10));
      return completed();
    };
    a.runtime = runtime;
    b.runtime = runtime;
    const { key, accountId } = await a.issue({ credits: 40 });
    const responses = await Promise.all(
      Array.from({ length: 60 }, (_, i) =>
        (i % 2 === 0 ? a : b).call("POST", "/v1/executions", { credential: key, body: PROGRAM }),
      ),
    );
    const statuses = responses.map((r) => r.status);
    // Each 200 was held of one gateway's lease; a 402 only where neither lease nor account had a credit left for it.
    expect(
      statuses.filter((s) => s === 200).length + statuses.filter((s) => s === 402).length,
    ).toBe(60);
    expect(statuses.filter((s) => s === 200).length).toBeLessThanOrEqual(40);
    expect(runtime.requests.length).toBe(statuses.filter((s) => s === 200).length);
    const charged = runtime.requests.length;
    await b.books(accountId);
    expect(await a.books(accountId)).toEqual({
      accountId,
      balanceUnits: 40 - charged,
      reservedUnits: 0,
      availableUnits: 40 - charged,
    });
    // What is left runs to the last credit on both gateways in turn: a hold that finds the last
    // credits in the other's idle lease waits for it to go back rather than answering 402.
    let more = 0;
    while (
      (
        await (more % 2 === 0 ? b : a).call("POST", "/v1/executions", {
          credential: key,
          body: PROGRAM,
        })
      ).status === 200
    )
      more++;
    expect(charged + more).toBe(40);
    await b.books(accountId);
    expect(await a.books(accountId)).toEqual({
      accountId,
      balanceUnits: 0,
      reservedUnits: 0,
      availableUnits: 0,
    });
  });
});
