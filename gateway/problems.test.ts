// Every failure the gateway reports without a runtime: its HTTP status and stable problem `type`.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BACKENDS } from "../db/testing/fresh-database.js";
import { PROBLEMS } from "./problems.js";
import { expectProblem, startTestGateway, type TestGateway } from "./testing/test-gateway.js";

describe.each(BACKENDS)("problem responses on %s", (backend) => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway(backend);
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  it("401 unauthenticated / invalid-credentials", async () => {
    const body = await expectProblem(await gw.call("GET", "/v1/usage"), 401, "unauthenticated");
    expect(body).toMatchObject({
      title: PROBLEMS.unauthenticated.title,
      instance: "/v1/usage",
      retryable: false,
    });
    await expectProblem(
      await gw.call("GET", "/v1/usage", { credential: "sfk_short" }),
      401,
      "invalid-credentials",
    );
  });

  it("403 insufficient-scope", async () => {
    const { key } = await gw.issue({ scopes: ["execute"] });
    await expectProblem(
      await gw.call("POST", "/v1/keys", { credential: key, body: { name: "x" } }),
      403,
      "insufficient-scope",
    );
  });

  it("404 not-found for unknown routes, executions, keys and accounts", async () => {
    const admin = await gw.issue({ scopes: ["admin"] });
    await expectProblem(await gw.call("GET", "/v1/nothing-here"), 404, "not-found");
    const missing = "00000000-0000-4000-8000-000000000000";
    await expectProblem(
      await gw.call("GET", `/v1/executions/${missing}`, { credential: admin.key }),
      404,
      "not-found",
    );
    await expectProblem(
      await gw.call("DELETE", `/v1/keys/${missing}`, { credential: admin.key }),
      404,
      "not-found",
    );
    await expectProblem(
      await gw.call("POST", `/v1/accounts/${missing}/credits`, {
        credential: admin.key,
        body: { units: 5 },
      }),
      404,
      "not-found",
    );
    await expectProblem(
      await gw.call("POST", "/v1/keys", {
        credential: admin.key,
        body: { name: "x", account_id: missing },
      }),
      404,
      "not-found",
    );
  });

  it("413 payload-too-large at the key's body cap, before validation", async () => {
    const { key } = await gw.issue({ maxBodyBytes: 1024 });
    const body = { template: "python", code: "x".repeat(2048) };
    const problem = await expectProblem(
      await gw.call("POST", "/v1/executions", { credential: key, body }),
      413,
      "payload-too-large",
    );
    expect(problem.max_body_bytes).toBe(1024);
    // Chunked (no Content-Length) bodies are cut off too.
    const stream = new ReadableStream({
      start(controller) {
        controller.enqueue(new TextEncoder().encode(JSON.stringify(body)));
        controller.close();
      },
    });
    const chunked = await gw.app.request("/v1/executions", {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: stream,
      duplex: "half",
    } as RequestInit);
    await expectProblem(chunked, 413, "payload-too-large");
  });

  it("422 validation-failed with the failing fields; 400 malformed-request for broken JSON; 415 for other media types", async () => {
    const { key } = await gw.issue();
    const problem = await expectProblem(
      await gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template: "Py thon", code: 1, timeout_ms: 10_000_000, extra: true },
      }),
      422,
      "validation-failed",
    );
    const paths = (problem.errors as { path: string }[]).map((e) => e.path).sort();
    expect(paths).toEqual(expect.arrayContaining(["code", "template", "timeout_ms"]));
    await expectProblem(
      await gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template: "python", code: "", files: [{ path: "../etc/passwd", content: "" }] },
      }),
      422,
      "validation-failed",
    );
    await expectProblem(
      await gw.call("GET", "/v1/usage?from=yesterday", { credential: key }),
      422,
      "validation-failed",
    );
    await expectProblem(
      await gw.call("GET", "/v1/executions/not-a-uuid", { credential: key }),
      422,
      "validation-failed",
    );
    await expectProblem(
      await gw.call("POST", "/v1/executions", {
        credential: key,
        rawBody: "{not json",
        headers: { "content-type": "application/json" },
      }),
      400,
      "malformed-request",
    );
    const valid = JSON.stringify({ template: "python", code: "print(1)" });
    await expectProblem(
      await gw.call("POST", "/v1/executions", { credential: key, rawBody: valid }),
      415,
      "unsupported-media-type",
    );
    await expectProblem(
      await gw.call("POST", "/v1/executions", {
        credential: key,
        rawBody: valid,
        headers: { "content-type": "text/plain" },
      }),
      415,
      "unsupported-media-type",
    );
  });

  it("429 rate-limited with Retry-After once the key's per-minute budget is spent", async () => {
    const { key } = await gw.issue({ rateLimitPerMinute: 2 });
    expect((await gw.call("GET", "/v1/usage", { credential: key })).status).toBe(200);
    expect((await gw.call("GET", "/v1/usage", { credential: key })).status).toBe(200);
    const limited = await gw.call("GET", "/v1/usage", { credential: key });
    expect(Number(limited.headers.get("retry-after"))).toBeGreaterThanOrEqual(29);
    expect(Number(limited.headers.get("retry-after"))).toBeLessThanOrEqual(30);
    const problem = await expectProblem(limited, 429, "rate-limited");
    expect(problem.retryable).toBe(true);
    // Another key is not affected.
    const other = await gw.issue({ rateLimitPerMinute: 2 });
    expect((await gw.call("GET", "/v1/usage", { credential: other.key })).status).toBe(200);
  });

  it("503 runtime-unavailable for executions while no runtime is connected; credits untouched", async () => {
    const { key } = await gw.issue({ credits: 5 });
    const response = await gw.call("POST", "/v1/executions", {
      credential: key,
      body: { template: "python", code: "print(1)" },
    });
    expect(response.headers.get("retry-after")).toBe("5");
    await expectProblem(response, 503, "runtime-unavailable");
    const usage = (await (await gw.call("GET", "/v1/usage", { credential: key })).json()) as {
      balance: unknown;
      executions: number;
    };
    expect(usage).toMatchObject({
      executions: 0,
      balance: { balance_units: 5, reserved_units: 0 },
    });
  });

  it("operators create keys with credits and limits, list them without secrets, and grant credits", async () => {
    const admin = await gw.issue({ scopes: ["admin"] });
    const created = await gw.call("POST", "/v1/keys", {
      credential: admin.key,
      body: {
        name: "ci",
        scopes: ["execute"],
        credits: 40,
        rate_limit_per_minute: 5,
        max_concurrency: 2,
        max_body_bytes: 2048,
        expires_in_seconds: 60,
      },
    });
    expect(created.status).toBe(201);
    const key = (await created.json()) as Record<string, unknown>;
    expect(key).toMatchObject({
      name: "ci",
      scopes: ["execute"],
      rate_limit_per_minute: 5,
      max_concurrency: 2,
      max_body_bytes: 2048,
      revoked_at: null,
    });
    expect(key.key).toMatch(/^sfk_/);
    expect(Date.parse(key.expires_at as string)).toBeGreaterThan(Date.now());

    const listed = (await (
      await gw.call("GET", `/v1/keys?account_id=${key.account_id}`, { credential: admin.key })
    ).json()) as { keys: unknown[] };
    expect(listed.keys).toHaveLength(1);
    expect(JSON.stringify(listed)).not.toContain(key.key as string);
    expect(listed.keys[0]).toMatchObject({
      id: key.id,
      hint: `sfk_…${(key.key as string).slice(-4)}`,
    });

    const granted = await gw.call("POST", `/v1/accounts/${key.account_id}/credits`, {
      credential: admin.key,
      body: { units: 10 },
    });
    expect(await granted.json()).toEqual({
      account_id: key.account_id,
      balance_units: 50,
      reserved_units: 0,
      available_units: 50,
    });
    await expectProblem(
      await gw.call("POST", `/v1/accounts/${key.account_id}/credits`, {
        credential: admin.key,
        body: { units: 1.5 },
      }),
      422,
      "validation-failed",
    );
  });
});
