// A session's state saved as a template (POST /v1/sessions/{id}/template) on KVM: the gateway on
// PostgreSQL (TEST_DATABASE_URL) and the REAL supervised daemon. The template runs executions
// that see the session's variables, imports and /work files, and a session that goes on from
// there; it is listed, versioned and deleted as templates built through the API; another
// account's key, an unknown session and an ended one are refused, as is a session holding a
// bound socket (409, nothing made); the route is in the OpenAPI document.
//
// Run by scripts/kvm-tier.sh with vitest.kvm.config.ts; waits are multiplied by
// SANDFORK_TEST_TIME_SCALE.
import { randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { StartedRuntime } from "../runtime/start.js";
import { timeScale } from "./testing/kvm-tier.js";
import { startPythonGateway } from "./testing/python-gateway.js";
import { expectJson, expectProblem, type TestGateway } from "./testing/test-gateway.js";

const CREDITS = 1_000_000;
const TEST_TIMEOUT_MS = 180_000 * timeScale;

let dir: string;
let runtime: StartedRuntime;
let gw: TestGateway;
const log: string[] = [];
let owner: { key: string; accountId: string };
let stranger: { key: string };
let executeOnly: { key: string };

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "sfk-session-templates-"));
  ({ runtime, gw } = await startPythonGateway(dir, log, { dataDir: dir }, "postgres"));
  owner = await gw.issue({ scopes: ["execute", "templates"], credits: CREDITS });
  stranger = await gw.issue({ scopes: ["execute", "templates"], credits: CREDITS });
  executeOnly = await gw.issue({
    scopes: ["execute"],
    credits: CREDITS,
    accountId: owner.accountId,
  });
}, TEST_TIMEOUT_MS);

afterAll(async () => {
  await gw?.dispose();
  await runtime?.stop();
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

function call(key: string, method: string, path: string, body?: unknown) {
  return gw.call(method, path, { credential: key, body });
}

interface Build {
  id: string;
  name: string;
  version: string;
  status: string;
  description: string | null;
  from_session: string | null;
  snapshot_bytes: number | null;
}

async function newSession(key: string, template = "python"): Promise<string> {
  return (
    await expectJson<{ id: string }>(await call(key, "POST", "/v1/sessions", { template }), 201)
  ).id;
}

async function cell(key: string, session: string, code: string): Promise<string | null> {
  const answer = await expectJson<{ value: string | null; error: unknown }>(
    await call(key, "POST", `/v1/sessions/${session}/executions`, { code }),
    200,
  );
  expect(answer.error).toBeNull();
  return answer.value;
}

async function run(key: string, template: string, code: string) {
  const response = await call(key, "POST", "/v1/executions", { template, code });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

describe("a session saved as a template", () => {
  it(
    "runs executions and sessions with the session's state, as its account's template only",
    async () => {
      const session = await newSession(owner.key);
      await cell(
        owner.key,
        session,
        "import fractions\nbase = 40\nopen('/work/data.txt', 'w').write('kept')",
      );
      const saved = await expectJson<Build>(
        await call(owner.key, "POST", `/v1/sessions/${session}/template`, {
          name: "prepared",
          description: "base = 40",
        }),
        201,
      );
      expect(saved).toMatchObject({
        name: "prepared",
        version: "1",
        status: "ready",
        description: "base = 40",
        from_session: session,
      });
      expect(saved.snapshot_bytes).toBeGreaterThan(1 << 20);

      // Each execution sees the state, and none sees what the one before it changed.
      const code =
        "print(base + 2, open('/work/data.txt').read(), fractions.Fraction(base, 80))\nbase = 0";
      for (const template of ["prepared@1", "prepared", "prepared@1"]) {
        const ran = await run(owner.key, template, code);
        expect(ran.status, JSON.stringify(ran.body)).toBe(200);
        expect(ran.body.stdout).toBe("42 kept 1/2\n");
      }
      // The session runs on; a session of the template goes on from its state.
      expect(await cell(owner.key, session, "base")).toBe("40");
      const child = await newSession(owner.key, "prepared@1");
      expect(await cell(owner.key, child, "base + 1")).toBe("41");

      // Versioned like any template: the next whole number, and an existing version refused.
      const second = await expectJson<Build>(
        await call(owner.key, "POST", `/v1/sessions/${session}/template`, { name: "prepared" }),
        201,
      );
      expect(second.version).toBe("2");
      await expectProblem(
        await call(owner.key, "POST", `/v1/sessions/${session}/template`, {
          name: "prepared",
          version: "1",
        }),
        409,
        "template-version-exists",
      );
      const listed = await expectJson<{ custom_templates: { ref: string; own: boolean }[] }>(
        await call(owner.key, "GET", "/v1/templates"),
        200,
      );
      expect(listed.custom_templates.map((t) => t.ref).sort()).toEqual([
        "prepared@1",
        "prepared@2",
      ]);

      // Another account sees none of it, and cannot save the owner's session.
      const foreign = await run(stranger.key, "prepared@1", "print(base)");
      expect(foreign.status).toBe(422);
      expect(String(foreign.body.type)).toMatch(/unknown-template$/);
      await expectProblem(
        await call(stranger.key, "POST", `/v1/sessions/${session}/template`, { name: "stolen" }),
        404,
        "not-found",
      );
      // A key without the templates scope, of the same account.
      await expectProblem(
        await call(executeOnly.key, "POST", `/v1/sessions/${session}/template`, { name: "x" }),
        403,
        "insufficient-scope",
      );

      // Deleted as templates built through the API are.
      expect((await call(owner.key, "DELETE", "/v1/templates/prepared@2")).status).toBe(204);
      expect((await run(owner.key, "prepared@2", "print(base)")).status).toBe(422);
      for (const id of [session, child])
        await expectJson(await call(owner.key, "DELETE", `/v1/sessions/${id}`), 200);
    },
    TEST_TIMEOUT_MS,
  );

  it(
    "refuses an unknown session, an ended one and one holding a bound socket",
    async () => {
      await expectProblem(
        await call(owner.key, "POST", `/v1/sessions/${randomUUID()}/template`, { name: "none" }),
        404,
        "not-found",
      );
      const bound = await newSession(owner.key);
      await cell(
        owner.key,
        bound,
        "import socket\nsk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nsk.bind(('127.0.0.1', 0))",
      );
      const refused = await expectProblem(
        await call(owner.key, "POST", `/v1/sessions/${bound}/template`, { name: "bound" }),
        409,
        "session-not-templatable",
      );
      expect(String(refused.detail)).toContain("socket");
      const listed = await expectJson<{ custom_templates: { name: string }[] }>(
        await call(owner.key, "GET", "/v1/templates"),
        200,
      );
      expect(listed.custom_templates.map((t) => t.name)).not.toContain("bound");
      const ended = await newSession(owner.key);
      await expectJson(
        await call(owner.key, "POST", `/v1/sessions/${ended}/executions`, {
          code: "import os; os._exit(0)",
        }),
        200,
      );
      await expectProblem(
        await call(owner.key, "POST", `/v1/sessions/${ended}/template`, { name: "ended" }),
        409,
        "session-ended",
      );
      await expectProblem(
        await call(owner.key, "POST", `/v1/sessions/${bound}/template`, { name: "Bad Name" }),
        422,
        "validation-failed",
      );
      for (const id of [bound, ended])
        await expectJson(await call(owner.key, "DELETE", `/v1/sessions/${id}`), 200);
    },
    TEST_TIMEOUT_MS,
  );

  it("is in the OpenAPI document", async () => {
    const document = await expectJson<{ paths: Record<string, Record<string, unknown>> }>(
      await gw.call("GET", "/openapi.json"),
      200,
    );
    const route = document.paths["/v1/sessions/{id}/template"]?.post as
      | { responses: Record<string, unknown> }
      | undefined;
    expect(Object.keys(route?.responses ?? {})).toEqual(
      expect.arrayContaining(["201", "404", "409"]),
    );
  });
});
