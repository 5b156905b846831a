// Rich results and output files through the gateway, with a TEST DOUBLE of the ExecutionRuntime
// boundary that answers what a daemon's agent published (the real runs are in
// gateway/rich-results.kvm.test.ts): the answer's results (a guest's unknown types and broken
// images left out), files kept and downloadable by their account only, the quota, the sweep, and
// the images in MCP, Anthropic and OpenAI tool results. Billing goes through the real database.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { Sandfork, type StreamEvent } from "sandfork";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type {
  ExecutionRequest,
  ExecutionResult,
  ExecutionRuntime,
  OutputFile,
  RichResult,
  Template,
} from "../runtime/execution-runtime.js";
import { expectProblem, startTestGateway, type TestGateway } from "./testing/test-gateway.js";
import { imageDescription } from "./tools/runner.js";

/** A 1x1 PNG (its IHDR says 1 x 1). */
const PNG =
  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
const HTML = "<table><tr><td>1</td></tr></table>";
const QUOTA = 1000;

/** Test double: answers a completed run with `results` and `files`. */
class PublishingRuntimeTestDouble implements ExecutionRuntime {
  readonly requests: ExecutionRequest[] = [];
  results: RichResult[] | undefined = [
    { type: "image/png", data: PNG },
    { type: "text/html", data: HTML },
    { type: "application/x-evil", data: "dropped" },
    { type: "image/png", data: "not base64!" },
    { type: "text/plain", data: "   a\n0  1" },
  ];
  files: OutputFile[] | undefined = [];

  async execute(request: ExecutionRequest): Promise<ExecutionResult> {
    this.requests.push(request);
    return {
      outcome: "completed",
      exitCode: 0,
      stdout: "",
      stderr: "",
      truncated: false,
      timings: { queueMs: 1, forkMs: 2, execMs: 150 },
      ...(this.results === undefined ? {} : { results: this.results }),
      ...(this.files === undefined ? {} : { files: this.files }),
    };
  }

  async templates(): Promise<Template[]> {
    return ["python", "python-data"].map((name) => ({
      name,
      language: "python",
      languages: ["python"],
      contentHash: "c0ffee",
      ready: true,
    }));
  }
}

const KEPT_RESULTS = [
  { type: "image/png", data: PNG },
  { type: "text/html", data: HTML },
  { type: "text/plain", data: "   a\n0  1" },
];

let gw: TestGateway;
let runtime: PublishingRuntimeTestDouble;
let now = Date.now();
const appFetch = (input: string | URL | Request, init?: RequestInit) =>
  Promise.resolve(gw.app.request(input instanceof Request ? input : String(input), init));

const clientFor = (key: string) =>
  new Sandfork({ baseUrl: "http://gateway.test", apiKey: key, fetch: appFetch as typeof fetch });

beforeAll(async () => {
  gw = await startTestGateway("pglite", {
    config: {
      outputFiles: { ttlSeconds: 60, quotaBytesPerKey: QUOTA, sweepIntervalMs: 60_000 },
    },
  });
});
afterAll(async () => {
  await gw?.dispose();
});
beforeEach(() => {
  runtime = new PublishingRuntimeTestDouble();
  gw.runtime = runtime;
  now = Date.now();
});

async function run(key: string, body: Record<string, unknown> = {}) {
  const response = await gw.call("POST", "/v1/executions", {
    credential: key,
    body: { template: "python", code: "x", ...body },
  });
  expect(response.status, await response.clone().text()).toBe(200);
  return (await response.json()) as {
    id: string;
    results?: unknown[];
    files?: { path: string; size: number; url: string | null; reason?: string }[];
  };
}

describe("results of POST /v1/executions", () => {
  it("answers the run's results in order, without an unknown type or an image that is not base64", async () => {
    const { key } = await gw.issue({ credits: 100 });
    const answer = await run(key);
    expect(answer.results).toEqual(KEPT_RESULTS);
    expect(answer.files).toEqual([]);
    // GET has the record and its kept files, not the results (they are not kept).
    const stored = await (
      await gw.call("GET", `/v1/executions/${answer.id}`, { credential: key })
    ).json();
    expect(stored).not.toHaveProperty("results");
    expect(stored).toMatchObject({ id: answer.id, files: [] });
    // A template whose agent published nothing (node) answers an empty list.
    runtime.results = undefined;
    runtime.files = undefined;
    expect(await run(key)).toMatchObject({ results: [], files: [] });
  });

  it("ends a streamed run with the same results", async () => {
    const { key } = await gw.issue({ credits: 100 });
    const sandfork = clientFor(key);
    const events: StreamEvent[] = [];
    for await (const event of sandfork.stream({ template: "python", code: "x" }))
      events.push(event);
    const last = events.at(-1);
    if (last?.event !== "execution") throw new Error(`no execution event: ${JSON.stringify(last)}`);
    expect(last.execution.results).toEqual(KEPT_RESULTS);
  });
});

describe("output files", () => {
  it("keeps each file for its account: the listed URL downloads it byte for byte, anyone else gets 404", async () => {
    const binary = Buffer.from([...Array(256).keys()]);
    runtime.files = [
      { path: "chart.png", bytes: binary.length, content: binary },
      { path: "dir/a b%.txt", bytes: 2, content: Buffer.from("hi") },
      { path: "it's (1).csv", bytes: 1, content: Buffer.from("1") },
      { path: "huge.bin", bytes: 3 << 20, content: null },
      { path: "../escape", bytes: 1, content: Buffer.from("x") },
    ];
    const owner = await gw.issue({ credits: 100 });
    const answer = await run(owner.key);
    expect(answer.files).toEqual([
      {
        path: "chart.png",
        size: 256,
        url: `/v1/executions/${answer.id}/files/chart.png`,
        expires_at: expect.any(String),
      },
      {
        path: "dir/a b%.txt",
        size: 2,
        url: `/v1/executions/${answer.id}/files/dir/a%20b%25.txt`,
        expires_at: expect.any(String),
      },
      {
        path: "it's (1).csv",
        size: 1,
        url: `/v1/executions/${answer.id}/files/it's%20(1).csv`,
        expires_at: expect.any(String),
      },
      { path: "huge.bin", size: 3 << 20, url: null, expires_at: null, reason: "not_transferred" },
      { path: "../escape", size: 1, url: null, expires_at: null, reason: "invalid_path" },
    ]);
    const expires = Date.parse(answer.files?.[0] && (answer.files[0] as any).expires_at);
    expect(expires - now).toBeGreaterThan(55_000);
    expect(expires - now).toBeLessThan(65_000);

    const download = (url: string, credential: string) => gw.call("GET", url, { credential });
    const chart = await download(answer.files?.[0]?.url as string, owner.key);
    expect(chart.status).toBe(200);
    expect(chart.headers.get("content-type")).toBe("application/octet-stream");
    expect(Buffer.from(await chart.arrayBuffer()).equals(binary)).toBe(true);
    const text = await download(answer.files?.[1]?.url as string, owner.key);
    expect(text.headers.get("content-disposition")).toBe(
      "attachment; filename*=UTF-8''a%20b%25.txt",
    );
    expect(await text.text()).toBe("hi");
    const quoted = await download(answer.files?.[2]?.url as string, owner.key);
    expect(quoted.headers.get("content-disposition")).toBe(
      "attachment; filename*=UTF-8''it%27s%20%281%29.csv",
    );
    expect(await quoted.text()).toBe("1");

    // Another key of the same account may; another account's key, a token that did not run it,
    // a path not kept, a hostile path, and no credentials may not.
    const sibling = await gw.issue({ accountId: owner.accountId });
    expect((await download(answer.files?.[0]?.url as string, sibling.key)).status).toBe(200);
    const stranger = await gw.issue({ credits: 100 });
    await expectProblem(
      await download(answer.files?.[0]?.url as string, stranger.key),
      404,
      "not-found",
    );
    const token = await gw.call("POST", "/v1/tokens", { credential: owner.key, body: {} });
    const { token: tokenSecret } = (await token.json()) as { token: string };
    await expectProblem(
      await download(answer.files?.[0]?.url as string, tokenSecret),
      404,
      "not-found",
    );
    const base = `/v1/executions/${answer.id}/files/`;
    await expectProblem(await download(`${base}huge.bin`, owner.key), 404, "not-found");
    await expectProblem(await download(`${base}..%2Fescape`, owner.key), 422, "validation-failed");
    await expectProblem(await download(`${base}a%00b`, owner.key), 422, "validation-failed");
    await expectProblem(
      await download("/v1/executions/not-a-uuid/files/chart.png", owner.key),
      404,
      "not-found",
    );
    expect((await gw.call("GET", `${base}chart.png`)).status).toBe(401);

    // GET lists the kept ones; the sweep past their time deletes them.
    const listed = (await (
      await gw.call("GET", `/v1/executions/${answer.id}`, { credential: owner.key })
    ).json()) as { files: { path: string }[] };
    expect(listed.files.map((f) => f.path)).toEqual(["chart.png", "dir/a b%.txt", "it's (1).csv"]);
    expect(await gw.context.outputFiles.sweep(new Date(Date.now() + 61_000))).toBeGreaterThan(0);
    await expectProblem(
      await download(answer.files?.[0]?.url as string, owner.key),
      404,
      "not-found",
    );
  });

  it("counts the files against the key's quota: a file past it is listed, not kept", async () => {
    const { key } = await gw.issue({ credits: 100 });
    runtime.files = [
      { path: "a", bytes: 600, content: Buffer.alloc(600, 1) },
      { path: "b", bytes: 600, content: Buffer.alloc(600, 2) },
      { path: "c", bytes: 400, content: Buffer.alloc(400, 3) },
    ];
    const answer = await run(key);
    expect(answer.files?.map((f) => [f.path, f.url === null ? f.reason : "kept"])).toEqual([
      ["a", "kept"],
      ["b", "quota_exceeded"],
      ["c", "kept"],
    ]);
    const usage = (await (await gw.call("GET", "/v1/usage", { credential: key })).json()) as {
      output_files: unknown;
    };
    expect(usage.output_files).toEqual({ bytes: 1000, quota_bytes: QUOTA });
    // The next run's files find the quota full.
    runtime.files = [{ path: "d", bytes: 1, content: Buffer.alloc(1) }];
    expect((await run(key)).files?.[0]).toMatchObject({ url: null, reason: "quota_exceeded" });
  });

  it("a replay with the Idempotency-Key lists the files still kept, without results", async () => {
    const { key } = await gw.issue({ credits: 100 });
    runtime.files = [{ path: "out.csv", bytes: 4, content: Buffer.from("a,b\n") }];
    const call = () =>
      gw.call("POST", "/v1/executions", {
        credential: key,
        headers: { "idempotency-key": `files-${now}` },
        body: { template: "python", code: "x" },
      });
    const first = (await (await call()).json()) as { files: unknown[]; results: unknown[] };
    const again = await call();
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    const replayed = (await again.json()) as Record<string, unknown>;
    expect(replayed.files).toEqual(first.files);
    expect(replayed).not.toHaveProperty("results");
    expect(runtime.requests).toHaveLength(1);
  });
});

describe("images in tool results", () => {
  it("MCP run_code returns each image as image content, in the template asked for", async () => {
    const { key } = await gw.issue({ credits: 100 });
    const mcp = new Client({ name: "test", version: "1" });
    await mcp.connect(
      new StreamableHTTPClientTransport(new URL("http://gateway.test/mcp"), {
        fetch: appFetch,
        requestInit: { headers: { authorization: `Bearer ${key}` } },
      }),
    );
    const ran = await mcp.callTool({
      name: "run_code",
      arguments: { language: "python", template: "python-data", code: "x" },
    });
    expect(runtime.requests[0]?.template).toBe("python-data");
    expect(ran.isError).toBeFalsy();
    const content = ran.content as { type: string; text?: string; data?: string }[];
    expect(content.map((c) => c.type)).toEqual(["text", "image"]);
    expect(content[1]).toEqual({ type: "image", data: PNG, mimeType: "image/png" });
    expect(ran.structuredContent).toMatchObject({
      results: [
        { type: "image/png", description: "image/png, 1x1 px, 70 bytes" },
        { type: "text/html", data: HTML },
        { type: "text/plain", data: "   a\n0  1" },
      ],
      files: [],
    });
    const unknown = await mcp.callTool({
      name: "run_code",
      arguments: { language: "python", template: "nope", code: "x" },
    });
    expect(unknown.isError).toBe(true);
    expect((unknown.content as { text: string }[])[0]?.text).toContain("unknown-template");
    await mcp.close();
  });

  it("Anthropic's tool_result carries image blocks; OpenAI's text describes the image", async () => {
    const { key } = await gw.issue({ credits: 100 });
    const sandfork = clientFor(key);
    const input = { language: "python", code: "x" };
    const anthropic = await sandfork.toolCall({
      type: "tool_use",
      id: "toolu_img",
      name: "run_code",
      input,
    });
    if (typeof anthropic.content === "string") throw new Error("no content blocks");
    expect(anthropic.content.map((b) => b.type)).toEqual(["text", "image"]);
    expect(anthropic.content[1]).toEqual({
      type: "image",
      source: { type: "base64", media_type: "image/png", data: PNG },
    });
    const openai = await sandfork.toolCall({
      id: "call_img",
      type: "function",
      function: { name: "run_code", arguments: JSON.stringify(input) },
    });
    expect(openai.content).not.toContain(PNG);
    expect(JSON.parse(openai.content).results[0]).toEqual({
      type: "image/png",
      description: "image/png, 1x1 px, 70 bytes",
    });
    // Without images, Anthropic's content stays the plain text.
    runtime.results = [];
    const plain = await sandfork.toolCall({ type: "tool_use", id: "t", name: "run_code", input });
    expect(typeof plain.content).toBe("string");
  });

  it("describes an image that is not a PNG by its type and size alone", () => {
    expect(imageDescription({ mimeType: "image/jpeg", data: "/9j/4AAQ" })).toBe(
      "image/jpeg, 6 bytes",
    );
  });
});
