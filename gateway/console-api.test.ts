// What the web console reads beyond the execution routes: tokens that carry the key's usage and
// admin scopes (refused once the key is revoked), GET /v1/executions page by page, and GET
// /v1/usage/series. The runtime is a test double that answers every execution at once.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BACKENDS } from "../db/testing/fresh-database.js";
import type { ExecutionResult, ExecutionRuntime, Template } from "../runtime/execution-runtime.js";
import { expectProblem, startTestGateway, type TestGateway } from "./testing/test-gateway.js";

class InstantRuntimeTestDouble implements ExecutionRuntime {
  async execute(): Promise<ExecutionResult> {
    return {
      outcome: "completed",
      exitCode: 0,
      stdout: "42\n",
      stderr: "",
      truncated: false,
      timings: { queueMs: 1, forkMs: 2, execMs: 150 },
    };
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
        ready: true,
      },
    ];
  }
}

interface ListBody {
  executions: {
    id: string;
    template: string;
    status: string;
    stdout?: unknown;
    usage: { units: number };
  }[];
  next_cursor: string | null;
}

describe.each(BACKENDS)("console reads on %s", (backend) => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway(backend, { runtime: new InstantRuntimeTestDouble() });
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  const mint = async (key: string, body: unknown) => {
    const response = await gw.call("POST", "/v1/tokens", { credential: key, body });
    return {
      response,
      body:
        response.status === 201
          ? ((await response.clone().json()) as { token: string; scopes: string[] })
          : undefined,
    };
  };

  it("a token carries only scopes its key holds, and stops working for usage and admin once the key is revoked", async () => {
    const { key: admin } = await gw.issue({ scopes: ["admin"], credits: 1_000 });
    const { key: plain } = await gw.issue({ scopes: ["execute"] });
    await expectProblem(
      (await mint(plain, { scopes: ["execute", "admin"] })).response,
      403,
      "insufficient-scope",
    );
    const executeOnly = await mint(plain, {});
    expect(executeOnly.body?.scopes).toEqual(["execute"]);
    await expectProblem(
      await gw.call("GET", "/v1/usage", { credential: executeOnly.body?.token }),
      403,
      "insufficient-scope",
    );

    const scoped = await mint(admin, { scopes: ["execute", "usage:read", "admin"] });
    expect(scoped.body?.scopes).toEqual(["execute", "usage:read", "admin"]);
    const token = scoped.body?.token as string;
    expect((await gw.call("GET", "/v1/keys", { credential: token })).status).toBe(200);
    expect((await gw.call("GET", "/v1/usage", { credential: token })).status).toBe(200);
    // Tokens still cannot mint tokens.
    await expectProblem((await mint(token, {})).response, 403, "insufficient-scope");

    const created = (await (
      await gw.call("POST", "/v1/keys", {
        credential: token,
        body: { name: "made by a token", scopes: ["admin"] },
      })
    ).json()) as { id: string; key: string };
    const child = (await mint(created.key, { scopes: ["admin"] })).body?.token as string;
    expect((await gw.call("GET", "/v1/keys", { credential: child })).status).toBe(200);
    expect((await gw.call("DELETE", `/v1/keys/${created.id}`, { credential: token })).status).toBe(
      200,
    );
    await expectProblem(
      await gw.call("GET", "/v1/keys", { credential: child }),
      401,
      "credentials-revoked",
    );
    await expectProblem(
      await gw.call("GET", "/v1/keys", { credential: created.key }),
      401,
      "credentials-revoked",
    );
  });

  it("GET /v1/executions pages newest first, filters, and shows a token only its own unless it reads usage", async () => {
    const { key } = await gw.issue({ credits: 10_000 });
    const ran: string[] = [];
    for (const template of ["python", "node", "python", "python", "node"]) {
      const response = await gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template, code: "print(6*7)" },
      });
      expect(response.status).toBe(200);
      ran.push(((await response.json()) as { id: string }).id);
    }
    const first = (await (
      await gw.call("GET", "/v1/executions?limit=2", { credential: key })
    ).json()) as ListBody;
    expect(first.executions.map((e) => e.id)).toEqual([ran[4], ran[3]]);
    expect(first.executions[0]).not.toHaveProperty("stdout");
    expect(first.executions[0]).toMatchObject({ status: "completed", usage: { units: 3 } });
    const seen = [...first.executions.map((e) => e.id)];
    let cursor = first.next_cursor;
    while (cursor !== null) {
      const page = (await (
        await gw.call("GET", `/v1/executions?limit=2&cursor=${cursor}`, { credential: key })
      ).json()) as ListBody;
      seen.push(...page.executions.map((e) => e.id));
      cursor = page.next_cursor;
    }
    expect(seen).toEqual([...ran].reverse());

    const node = (await (
      await gw.call("GET", "/v1/executions?template=node", { credential: key })
    ).json()) as ListBody;
    expect(node.executions.map((e) => e.id)).toEqual([ran[4], ran[1]]);
    const timedOut = (await (
      await gw.call("GET", "/v1/executions?status=timed_out", { credential: key })
    ).json()) as ListBody;
    expect(timedOut).toEqual({ executions: [], next_cursor: null });
    await expectProblem(
      await gw.call("GET", "/v1/executions?cursor=bm9wZQ", { credential: key }),
      422,
      "validation-failed",
    );
    await expectProblem(
      await gw.call("GET", "/v1/executions?status=sleeping", { credential: key }),
      422,
      "validation-failed",
    );

    const executeOnly = (await mint(key, {})).body?.token as string;
    const own = await gw.call("POST", "/v1/executions", {
      credential: executeOnly,
      body: { template: "python", code: "1" },
    });
    const ownId = ((await own.json()) as { id: string }).id;
    const byToken = (await (
      await gw.call("GET", "/v1/executions", { credential: executeOnly })
    ).json()) as ListBody;
    expect(byToken.executions.map((e) => e.id)).toEqual([ownId]);
    const reader = (await mint(key, { scopes: ["execute", "usage:read"] })).body?.token as string;
    const byReader = (await (
      await gw.call("GET", "/v1/executions", { credential: reader })
    ).json()) as ListBody;
    expect(byReader.executions).toHaveLength(6);
  });

  it("GET /v1/usage/series sums units by hour and template, as GET /v1/usage does", async () => {
    const { key } = await gw.issue({ credits: 10_000 });
    for (const template of ["python", "node", "python"]) {
      expect(
        (
          await gw.call("POST", "/v1/executions", {
            credential: key,
            body: { template, code: "1" },
          })
        ).status,
      ).toBe(200);
    }
    const response = await gw.call("GET", "/v1/usage/series?bucket=hour", { credential: key });
    expect(response.status).toBe(200);
    const series = (await response.json()) as {
      bucket: string;
      from: string;
      to: string;
      points: { at: string; template: string; executions: number; units: number }[];
    };
    expect(series.bucket).toBe("hour");
    expect(Date.parse(series.to) - Date.parse(series.from)).toBe(24 * 3_600_000);
    const byTemplate = (t: string) =>
      series.points.filter((p) => p.template === t).reduce((n, p) => n + p.units, 0);
    expect(byTemplate("python")).toBe(6);
    expect(byTemplate("node")).toBe(3);
    expect(series.points.every((p) => Date.parse(p.at) % 3_600_000 === 0)).toBe(true);
    const days = (await (
      await gw.call("GET", "/v1/usage/series?bucket=day", { credential: key })
    ).json()) as typeof series;
    expect(days.points.reduce((n, p) => n + p.executions, 0)).toBe(3);
    await expectProblem(
      await gw.call("GET", "/v1/usage/series?bucket=hour&from=2020-01-01T00:00:00Z", {
        credential: key,
      }),
      422,
      "validation-failed",
    );
  });
});
