// /openapi.json, /docs, /healthz and /metrics.
import { Validator } from "@seriousme/openapi-schema-validator";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DOCS_ASSET_ROUTE, DOCS_PATH, OPENAPI_PATH } from "./app.js";
import { CONSOLE_PATH } from "./routes/console.js";
import { startTestGateway, type TestGateway } from "./testing/test-gateway.js";

const API_ROUTES = [
  "POST /v1/executions",
  "GET /v1/executions/{id}",
  "GET /v1/executions/{id}/files/{path}",
  "GET /v1/executions",
  "GET /v1/templates",
  "POST /v1/templates",
  "GET /v1/templates/{name}/builds/{id}",
  "DELETE /v1/templates/{ref}",
  "POST /v1/templates/{ref}/publish",
  "GET /v1/usage",
  "GET /v1/usage/series",
  "POST /v1/keys",
  "GET /v1/keys",
  "DELETE /v1/keys/{id}",
  "PUT /v1/keys/{id}/network",
  "POST /v1/accounts/{id}/credits",
  "POST /v1/tokens",
  "GET /v1/tools",
  "POST /v1/tool-calls",
  "POST /mcp",
  "GET /mcp",
  "DELETE /mcp",
  "POST /v1/sessions",
  "GET /v1/sessions",
  "GET /v1/sessions/{id}",
  "DELETE /v1/sessions/{id}",
  "POST /v1/sessions/{id}/executions",
  "POST /v1/sessions/{id}/checkpoints",
  "POST /v1/sessions/{id}/pause",
  "POST /v1/sessions/{id}/resume",
  "POST /v1/sessions/{id}/template",
  "POST /v1/sessions/{id}/fork",
  "PUT /v1/sessions/{id}/files/{path}",
  "GET /v1/sessions/{id}/files/{path}",
  "DELETE /v1/sessions/{id}/files/{path}",
  "GET /healthz",
  "GET /metrics",
];

describe("OpenAPI document and operational endpoints", () => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway("pglite");
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  it("serves a valid OpenAPI 3.1 document that lists every route", async () => {
    const response = await gw.call("GET", OPENAPI_PATH);
    expect(response.status).toBe(200);
    const doc = (await response.json()) as {
      openapi: string;
      paths: Record<string, Record<string, unknown>>;
    };
    expect(doc.openapi).toBe("3.1.0");
    const result = await new Validator().validate(doc);
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);

    const documented = Object.entries(doc.paths).flatMap(([path, ops]) =>
      Object.keys(ops).map((m) => `${m.toUpperCase()} ${path}`),
    );
    expect(documented.sort()).toEqual([...API_ROUTES].sort());
    // Every route the app serves (other than the document, its page and the page's assets) is documented.
    const served = new Set(
      gw.app.routes
        .filter(
          (r) =>
            r.method !== "ALL" &&
            ![OPENAPI_PATH, DOCS_PATH, DOCS_ASSET_ROUTE].includes(r.path) &&
            !r.path.startsWith(CONSOLE_PATH),
        )
        // A parameter's pattern (`:path{.+}`, a file path with slashes) is not part of its name.
        .map((r) => `${r.method} ${r.path.replace(/:(\w+)(\{[^}]*\})?/g, "{$1}")}`),
    );
    expect([...served].sort()).toEqual([...API_ROUTES].sort());
  });

  it("documents problem responses and bearer security on the execute route", async () => {
    const doc = (await (await gw.call("GET", OPENAPI_PATH)).json()) as any;
    const execute = doc.paths["/v1/executions"].post;
    for (const status of ["401", "402", "413", "422", "429", "503"]) {
      expect(execute.responses[status].content["application/problem+json"], status).toBeDefined();
    }
    expect(execute.security).toEqual([{ bearerAuth: [] }]);
    expect(Object.keys(execute.responses["200"].content).sort()).toEqual([
      "application/json",
      "text/event-stream",
    ]);
    for (const [path, method] of [
      ["/v1/tools", "get"],
      ["/v1/tool-calls", "post"],
      ["/mcp", "post"],
    ] as const) {
      expect(doc.paths[path][method].security, path).toEqual([{ bearerAuth: [] }]);
    }
    expect(doc.components.securitySchemes.bearerAuth).toMatchObject({
      type: "http",
      scheme: "bearer",
    });
  });

  it("documents the Idempotency-Key header, with the pattern the gateway checks, on the routes that run code", async () => {
    const doc = (await (await gw.call("GET", OPENAPI_PATH)).json()) as any;
    for (const path of ["/v1/executions", "/v1/tool-calls"]) {
      const header = doc.paths[path].post.parameters.find(
        (p: { name: string }) => p.name === "idempotency-key",
      );
      expect(header, path).toMatchObject({
        in: "header",
        required: false,
        schema: { type: "string" },
      });
      const pattern = new RegExp(header.schema.pattern);
      expect(pattern.test("retry-1")).toBe(true);
      expect(pattern.test("bad key")).toBe(false);
      expect(pattern.test("k".repeat(256))).toBe(false);
    }
  });

  it("serves a docs page pointing at the document, with its assets from this host", async () => {
    const response = await gw.call("GET", DOCS_PATH);
    expect(response.status).toBe(200);
    const page = await response.text();
    expect(page).toContain(OPENAPI_PATH);
    expect(page).not.toMatch(/https?:\/\//);
    const script = await gw.call("GET", `${DOCS_PATH}/assets/swagger-ui-dist/swagger-ui-bundle.js`);
    expect([script.status, script.headers.get("content-type")]).toEqual([
      200,
      "text/javascript; charset=utf-8",
    ]);
    expect((await script.arrayBuffer()).byteLength).toBeGreaterThan(100_000);
    const css = await gw.call("GET", `${DOCS_PATH}/assets/swagger-ui-dist/swagger-ui.css`);
    expect([css.status, css.headers.get("content-type")]).toEqual([200, "text/css; charset=utf-8"]);
    expect((await gw.call("GET", `${DOCS_PATH}/assets/swagger-ui-dist/package.json`)).status).toBe(
      404,
    );
  });

  it("/healthz reports the database and the runtime", async () => {
    const response = await gw.call("GET", "/healthz");
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({
      status: "degraded",
      database: "ok",
      runtime: "unavailable",
    });
  });

  it("/healthz answers 503 once the database does not answer", async () => {
    const alone = await startTestGateway("pglite");
    try {
      await alone.fresh.dispose();
      const response = await alone.call("GET", "/healthz");
      expect(response.status).toBe(503);
      expect(await response.json()).toEqual({
        status: "degraded",
        database: "error",
        runtime: "unavailable",
      });
    } finally {
      await alone.telemetry.shutdown();
    }
  });

  it("/metrics exposes request metrics in Prometheus format", async () => {
    await gw.call("GET", "/healthz");
    await gw.call("GET", "/v1/usage");
    const response = await gw.call("GET", "/metrics");
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toContain("text/plain");
    const text = await response.text();
    expect(text).toMatch(
      /http_server_request_duration_(seconds_)?count\{[^}]*http_route="\/healthz"[^}]*http_response_status_code="200"[^}]*\} [1-9]/,
    );
    expect(text).toMatch(
      /sandfork_requests_rejected_total\{[^}]*problem="unauthenticated"[^}]*\} [1-9]/,
    );
  });
});
