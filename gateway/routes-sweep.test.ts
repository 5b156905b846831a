// Every route in the OpenAPI document, with malformed path parameters, query strings and bodies,
// sent with a valid admin key: no answer is a server error, and every error is problem+json
// (but those MCP's transport at /mcp answers as JSON-RPC errors, as its clients expect).
// The one 5xx allowed is 503 runtime-unavailable, and only from a route that needs the runtime:
// no daemon is connected here, and that is the honest answer to a well-formed request for one
// (it is retryable and says so). A malformed request never gets that far: it is refused first.
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestGateway, type TestGateway } from "./testing/test-gateway.js";

interface Operation {
  parameters?: { name: string; in: string }[];
  requestBody?: { content: Record<string, { schema?: unknown }> };
}
type Document = {
  paths: Record<string, Record<string, Operation>>;
  components: { schemas: Record<string, { properties?: Record<string, unknown> }> };
};

const MALFORMED_SEGMENTS = [
  "%ff",
  "%",
  "%E0%A4%A",
  "%00",
  "%C0%80",
  "a".repeat(20_000),
  "%2e%2e%2f",
  "-1",
  "0",
  "1e400",
  "null",
];
const WRONG_VALUES: unknown[] = [
  1e308,
  -1e308,
  2 ** 64,
  -(2 ** 63) - 1,
  0.5,
  "x",
  "",
  [],
  [{}],
  {},
  null,
  true,
  "\u0000",
];
const RAW_BODIES = [
  "",
  "{",
  "not json",
  "[]",
  "[{}]",
  "null",
  "1e400",
  '"x"',
  "{}",
  `{"a":${"[".repeat(5000)}`,
  "\u0000",
  '{"__proto__":{"admin":true}}',
];

/** How many tests the sweep is cut into. */
const SWEEP_SLICES = 8;

/** Routes a malformed request may reach the runtime through: none; well-formed ones may answer 503. */
function allowed(status: number, body: Record<string, unknown>): boolean {
  if (status < 500) return true;
  return status === 503 && body.type === "https://sandfork.dev/problems/runtime-unavailable";
}

describe("every route, malformed", () => {
  let gw: TestGateway;
  let key: string;
  let accountId: string;
  let keyId: string;
  let doc: Document;
  const failures: string[] = [];
  const seen = new Map<string, number>();

  beforeAll(async () => {
    gw = await startTestGateway("pglite");
    ({ key, accountId } = await gw.issue({
      scopes: ["admin", "execute", "usage:read"],
      credits: 1000,
    }));
    // Another key for the routes that name one: revoking the sweep's own key would end the sweep.
    ({ keyId } = await gw.issue());
    doc = (await (await gw.call("GET", "/openapi.json")).json()) as Document;
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  async function send(
    method: string,
    path: string,
    init: { body?: string; contentType?: string } = {},
  ): Promise<void> {
    const headers: Record<string, string> = { authorization: `Bearer ${key}` };
    if (init.contentType !== undefined) headers["content-type"] = init.contentType;
    const response = await gw.app.request(path, {
      method: method.toUpperCase(),
      headers,
      ...(init.body === undefined ? {} : { body: init.body }),
    });
    const text = await response.text();
    const what = `${method.toUpperCase()} ${path.slice(0, 120)} ${init.body === undefined ? "" : JSON.stringify(init.body.slice(0, 60))}`;
    seen.set(`${response.status}`, (seen.get(`${response.status}`) ?? 0) + 1);
    if (response.status < 400) return;
    let body: Record<string, unknown> = {};
    try {
      body = JSON.parse(text) as Record<string, unknown>;
    } catch {
      failures.push(`${what}: ${response.status} not JSON: ${text.slice(0, 200)}`);
      return;
    }
    if (path.startsWith("/mcp") && body.jsonrpc === "2.0") {
      // MCP's transport answers its own errors as JSON-RPC, which MCP clients read: only no 5xx here.
      if (response.status >= 500)
        failures.push(`${what}: ${response.status} ${text.slice(0, 300)}`);
    } else if (
      !response.headers.get("content-type")?.startsWith("application/problem+json") ||
      body.status !== response.status ||
      typeof body.type !== "string"
    ) {
      failures.push(`${what}: ${response.status} not problem+json: ${text.slice(0, 200)}`);
    } else if (!allowed(response.status, body)) {
      failures.push(`${what}: ${response.status} ${text.slice(0, 300)}`);
    }
  }

  /** The template's path with each {param} replaced by `value` (already percent-encoded as it should travel). */
  const fill = (template: string, value: (name: string) => string) =>
    template.replace(/\{(\w+)\}/g, (_, name: string) => value(name));

  /** Request bodies to try for an operation: raw text, and each property of its schema set to each wrong value. */
  function bodies(operation: Operation): string[] {
    const out = [...RAW_BODIES];
    const schema = operation.requestBody?.content["application/json"]?.schema as
      | { $ref?: string; properties?: Record<string, unknown> }
      | undefined;
    const resolved =
      schema?.$ref === undefined
        ? schema
        : doc.components.schemas[schema.$ref.split("/").pop() ?? ""];
    for (const name of Object.keys(resolved?.properties ?? {})) {
      for (const value of WRONG_VALUES) out.push(JSON.stringify({ [name]: value }));
      out.push(
        `{"${name}": 1e400}`,
        `{"${name}": 123456789012345678901234567890}`,
        `{"${name}": -0}`,
      );
    }
    out.push(
      JSON.stringify(
        Object.fromEntries(Object.keys(resolved?.properties ?? {}).map((name) => [name, [{}]])),
      ),
    );
    return out;
  }

  /** Every operation of the document, in its order. */
  const operationsOf = (document: Document) =>
    Object.entries(document.paths).flatMap(([path, methods]) =>
      Object.entries(methods).map(([method, operation]) => ({ path, method, operation })),
    );

  // The sweep is thousands of requests, each a test's worth of work; in slices, each a test of
  // its own, so that a busy host's slower requests do not add up against one test's time limit.
  for (let slice = 0; slice < SWEEP_SLICES; slice++)
    it(`answers no malformed request with a server error, and every error as problem+json (operations ${slice + 1}, ${slice + 1 + SWEEP_SLICES}, ...)`, async () => {
      failures.length = 0;
      const operations = operationsOf(doc).filter((_, i) => i % SWEEP_SLICES === slice);
      await sweep(operations);
      expect(failures, failures.slice(0, 30).join("\n")).toEqual([]);
    });

  it("swept every operation through to the handlers, with its credentials intact", () => {
    expect(operationsOf(doc).length).toBeGreaterThan(20);
    // The sweep reached the handlers, not only the router: some requests were refused by schemas.
    expect(seen.get("422") ?? 0).toBeGreaterThan(100);
    // And with its credentials intact to the end.
    expect(seen.get("401") ?? 0).toBe(0);
  });

  async function sweep(operations: ReturnType<typeof operationsOf>): Promise<void> {
    const real: Record<string, string> = { id: randomUUID(), path: "f.txt" };
    for (const { path, method, operation } of operations) {
      // Malformed path parameters, one at a time and all at once, with an empty JSON body.
      const names = [...path.matchAll(/\{(\w+)\}/g)].map((m) => m[1] ?? "");
      const hasBody = operation.requestBody !== undefined;
      const body = hasBody
        ? {
            body: "{}",
            contentType: operation.requestBody?.content["application/json"]
              ? "application/json"
              : "application/octet-stream",
          }
        : {};
      for (const segment of MALFORMED_SEGMENTS) {
        for (const name of names)
          await send(
            method,
            fill(path, (n) => (n === name ? segment : (real[n] ?? "x"))),
            body,
          );
        if (names.length > 1)
          await send(
            method,
            fill(path, () => segment),
            body,
          );
      }
      // Valid-looking parameters (an existing account and key where the route names one), malformed bodies.
      const ids = path.startsWith("/v1/accounts/")
        ? accountId
        : path.startsWith("/v1/keys/")
          ? keyId
          : real.id;
      const target = fill(path, (n) => (n === "id" ? (ids ?? "") : (real[n] ?? "x")));
      if (hasBody || method === "post" || method === "put") {
        for (const raw of bodies(operation)) {
          await send(method, target, { body: raw, contentType: "application/json" });
        }
        await send(method, target, { body: "{}", contentType: "text/plain" });
        await send(method, target, {
          body: "\u0000\u00ff",
          contentType: "application/octet-stream",
        });
      }
      // Malformed query strings.
      for (const query of [
        "?from=%ff",
        "?from=x&to=y",
        "?key_id=%00",
        "?account_id=not-a-uuid",
        "?from=99999-01-01T00:00:00Z",
        `?x=${"a".repeat(20_000)}`,
      ]) {
        await send(
          method,
          `${target}${query}`,
          hasBody ? { body: "{}", contentType: "application/json" } : {},
        );
      }
    }
  }
});
