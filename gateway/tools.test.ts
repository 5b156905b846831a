// The agent tools, MCP and streamed executions with a TEST DOUBLE of the ExecutionRuntime
// boundary (the real runs are in gateway/agents.kvm.test.ts): what the model is told when its
// call is malformed, the tool formats, the session tools keeping each session's state apart,
// MCP's error results and auth, and the order of a stream's events. Billing goes through the
// real database (PGlite).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { Sandfork, SandforkError, type StreamEvent } from "sandfork";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { RuntimeRequestError } from "../runtime/errors.js";
import type {
  ExecutionRequest,
  ExecutionResult,
  ExecutionRuntime,
  OutputChunk,
  Template,
} from "../runtime/execution-runtime.js";
import type { CellResult, SessionInfo, SessionRuntime } from "../runtime/session-runtime.js";
import { startTestGateway, type TestGateway } from "./testing/test-gateway.js";

/** Test double: writes `chunks` through onOutput, then answers a completed run of their text. */
class StreamingRuntimeTestDouble implements ExecutionRuntime {
  readonly requests: ExecutionRequest[] = [];
  readonly cells = new CellsTestDouble();
  readonly sessions = this.cells as unknown as SessionRuntime;
  chunks: OutputChunk[] = [{ stream: "stdout", data: "45\n" }];
  async execute(
    request: ExecutionRequest,
    _signal: AbortSignal,
    onOutput?: (chunk: OutputChunk) => void,
  ): Promise<ExecutionResult> {
    this.requests.push(request);
    for (const chunk of this.chunks) onOutput?.(chunk);
    const text = (stream: string) =>
      this.chunks
        .filter((c) => c.stream === stream)
        .map((c) => c.data)
        .join("");
    return {
      outcome: "completed",
      exitCode: 0,
      stdout: text("stdout"),
      stderr: text("stderr"),
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
    ];
  }
}

/**
 * Test double of the daemon's sessions: each session is a namespace of integers, and a cell is
 * `NAME = INT` (a statement) or `NAME + INT` (an expression whose value is returned). The session
 * tools use no other request.
 */
class CellsTestDouble implements Pick<SessionRuntime, "create" | "execute" | "delete" | "info"> {
  readonly namespaces = new Map<string, Map<string, number>>();

  private view(session: string): SessionInfo {
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
  private namespace(session: string): Map<string, number> {
    const names = this.namespaces.get(session);
    if (names === undefined) throw new RuntimeRequestError("not_found", `no session '${session}'`);
    return names;
  }
  async create(session: string): Promise<SessionInfo> {
    this.namespaces.set(session, new Map());
    return this.view(session);
  }
  async execute(session: string, code: string): Promise<CellResult> {
    const names = this.namespace(session);
    const assignment = /^(\w+) = (\d+)$/.exec(code);
    const sum = /^(\w+) \+ (\d+)$/.exec(code);
    let value: string | null = null;
    let error: CellResult["error"] = null;
    if (assignment !== null) names.set(assignment[1] ?? "", Number(assignment[2]));
    else if (sum !== null) {
      const bound = names.get(sum[1] ?? "");
      if (bound === undefined)
        error = { name: "NameError", message: `name '${sum[1]}' is not defined` };
      else value = String(bound + Number(sum[2]));
    }
    return {
      execution: {
        outcome: "completed",
        exitCode: 0,
        stdout: "",
        stderr: error === null ? "" : `${error.name}: ${error.message}\n`,
        truncated: false,
        timings: { queueMs: 0, forkMs: 0, execMs: 1 },
      },
      value,
      error,
      state: "running",
      resumed: false,
    };
  }
  async delete(session: string): Promise<void> {
    this.namespaces.delete(session);
  }
  async info(session: string): Promise<SessionInfo> {
    this.namespace(session);
    return this.view(session);
  }
}

const TOOLS = ["run_code", "list_templates", "open_session", "run_cell", "close_session"];

// Default price: 1 unit + 10 per second; fork 2 ms + exec 150 ms cost 3.
const CHARGED = 3;
const PROBLEMS = "https://sandfork.dev/problems/";

let gw: TestGateway;
let runtime: StreamingRuntimeTestDouble;
/** fetch through the app, no sockets. */
const appFetch = (input: string | URL | Request, init?: RequestInit) =>
  Promise.resolve(gw.app.request(input instanceof Request ? input : String(input), init));

beforeAll(async () => {
  gw = await startTestGateway("pglite");
});
afterAll(async () => {
  await gw?.dispose();
});
beforeEach(() => {
  runtime = new StreamingRuntimeTestDouble();
  gw.runtime = runtime;
});

/** A key with `credits` (null: an account without any) and a client using it. */
async function client(credits: number | null = 100) {
  const issued = await gw.issue(credits === null ? {} : { credits });
  return {
    ...issued,
    sandfork: new Sandfork({
      baseUrl: "http://gateway.test",
      apiKey: issued.key,
      fetch: appFetch as typeof fetch,
    }),
  };
}

describe("GET /v1/tools", () => {
  it("gives run_code and list_templates in each API's format, with the JSON Schema of the arguments", async () => {
    const { sandfork } = await client();
    const openai = await sandfork.tools("openai");
    expect(openai.map((t) => t.function.name)).toEqual(TOOLS);
    expect(openai[0]?.function.parameters).toMatchObject({
      type: "object",
      required: ["language", "code"],
      additionalProperties: false,
      properties: {
        language: { type: "string" },
        code: { type: "string" },
        timeout_ms: { type: "integer", maximum: gw.config.executionLimits.maxTimeoutMs },
        max_processes: {
          type: "integer",
          minimum: 1,
          maximum: gw.config.executionLimits.maxProcesses,
        },
      },
    });
    const anthropic = await sandfork.tools("anthropic");
    expect(anthropic[0]).toEqual({
      name: "run_code",
      description: openai[0]?.function.description,
      input_schema: openai[0]?.function.parameters,
    });
    const refused = await gw.call("GET", "/v1/tools?format=gemini", {
      credential: (await gw.issue()).key,
    });
    expect(refused.status).toBe(422);
    expect((await gw.call("GET", "/v1/tools?format=openai")).status).toBe(401);
  });
});

describe("POST /v1/tool-calls", () => {
  it("runs an OpenAI tool call, billed, and answers the tool message", async () => {
    const { sandfork, accountId } = await client();
    const call = {
      id: "call_1",
      type: "function" as const,
      function: {
        name: "run_code",
        arguments: JSON.stringify({ language: "python", code: "print(45)", max_processes: 4 }),
      },
    };
    const message = await sandfork.toolCall(call);
    expect(message).toMatchObject({ role: "tool", tool_call_id: "call_1" });
    expect(JSON.parse(message.content)).toMatchObject({
      status: "completed",
      exit_code: 0,
      stdout: "45\n",
      usage: { units: CHARGED },
    });
    expect(runtime.requests[0]).toMatchObject({
      template: "python",
      code: "print(45)",
      maxProcesses: 4,
    });
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: 100 - CHARGED,
      reservedUnits: 0,
    });
  });

  it("tells the model what was wrong with its call, without running anything or failing the request", async () => {
    const { sandfork } = await client();
    const openai = (name: string, args: string) =>
      sandfork.toolCall({ id: "call_x", type: "function", function: { name, arguments: args } });
    const problem = async (answer: Promise<{ content: string }>) =>
      JSON.parse((await answer).content) as Record<string, unknown>;

    expect(
      await problem(openai("run_code", '{"language": "python", "code": "print(1)"')),
    ).toMatchObject({
      type: `${PROBLEMS}invalid-tool-arguments`,
      detail: expect.stringContaining("not valid JSON"),
    });
    expect(await problem(openai("run_code", '{"language": "python"}'))).toMatchObject({
      type: `${PROBLEMS}invalid-tool-arguments`,
      errors: [{ path: "code", message: expect.any(String) }],
    });
    expect(
      await problem(
        openai(
          "run_code",
          '{"language": "python", "code": "x", "files": [{"path": "../etc/passwd", "content": ""}]}',
        ),
      ),
    ).toMatchObject({
      type: `${PROBLEMS}invalid-tool-arguments`,
      errors: [{ path: "files.0.path" }],
    });
    expect(await problem(openai("run_code", '{"language": "cobol", "code": "x"}'))).toMatchObject({
      type: `${PROBLEMS}unknown-template`,
      languages: ["python"],
    });
    expect(await problem(openai("rm_rf", "{}"))).toMatchObject({
      type: `${PROBLEMS}unknown-tool`,
      tools: TOOLS,
    });

    const anthropic = await sandfork.toolCall({
      type: "tool_use",
      id: "toolu_1",
      name: "run_code",
      input: { code: 42 },
    });
    expect(anthropic).toMatchObject({
      type: "tool_result",
      tool_use_id: "toolu_1",
      is_error: true,
    });
    expect(JSON.parse(anthropic.content as string)).toMatchObject({
      type: `${PROBLEMS}invalid-tool-arguments`,
    });
    expect(runtime.requests).toEqual([]);

    // Out of credits is the model's to report too; a malformed body is the caller's bug (422).
    const poor = await client(null);
    const broke = await poor.sandfork.toolCall({
      type: "tool_use",
      id: "toolu_2",
      name: "run_code",
      input: { language: "python", code: "1" },
    });
    expect(broke.is_error, broke.content as string).toBe(true);
    expect(JSON.parse(broke.content as string)).toMatchObject({
      type: `${PROBLEMS}insufficient-credits`,
      status: 402,
    });
    await expect(
      sandfork.toolCall({ type: "tool_use", name: "run_code" } as never),
    ).rejects.toMatchObject({ status: 422 });
  });

  it("answers an Anthropic tool_use with a tool_result block; list_templates needs no execution", async () => {
    const { sandfork } = await client();
    const result = await sandfork.toolCall({
      type: "tool_use",
      id: "toolu_3",
      name: "list_templates",
      input: {},
    });
    expect(result).toMatchObject({ type: "tool_result", tool_use_id: "toolu_3", is_error: false });
    expect(JSON.parse(result.content as string)).toEqual({
      templates: [{ name: "python", language: "python", languages: ["python"], ready: true }],
    });
    expect(runtime.requests).toEqual([]);
  });
});

describe("the session tools", () => {
  it("a second call sees the first call's variables, each session its own; close ends it; billed per cell", async () => {
    const { sandfork, key, accountId } = await client();
    let calls = 0;
    const call = async (name: string, args: unknown) => {
      const message = await sandfork.toolCall({
        id: `call_${++calls}`,
        type: "function",
        function: { name, arguments: JSON.stringify(args) },
      });
      return JSON.parse(message.content) as Record<string, any>;
    };
    const opened = await call("open_session", { language: "python" });
    expect(opened).toEqual({
      session_id: expect.any(String),
      template: "python",
      state: "running",
    });
    const session_id = opened.session_id as string;
    expect(await call("run_cell", { session_id, code: "x = 41" })).toMatchObject({
      session_id,
      value: null,
      error: null,
      status: "completed",
    });
    // Through the route itself: the cell's execution id is in the header.
    const answer = await gw.call("POST", "/v1/tool-calls", {
      credential: key,
      body: {
        type: "tool_use",
        id: "toolu_cell",
        name: "run_cell",
        input: { session_id, code: "x + 1" },
      },
    });
    const block = (await answer.json()) as { content: string; is_error: boolean };
    expect(block.is_error).toBe(false);
    const second = JSON.parse(block.content) as Record<string, any>;
    expect(second).toMatchObject({
      session_id,
      value: "42",
      error: null,
      resumed: false,
      status: "completed",
      exit_code: 0,
      usage: { units: gw.config.sessions.unitsPerCell },
    });
    expect(answer.headers.get("sandfork-execution-id")).toBe(second.execution_id);

    // Another session does not see x.
    const other = (await call("open_session", { language: "python" })).session_id as string;
    expect(await call("run_cell", { session_id: other, code: "x + 1" })).toMatchObject({
      value: null,
      error: { name: "NameError" },
      stderr: "NameError: name 'x' is not defined\n",
    });

    const closed = await call("close_session", { session_id });
    expect(closed).toMatchObject({
      session_id,
      state: "deleted",
      usage: { units: expect.any(Number) },
    });
    expect(runtime.cells.namespaces.has(session_id)).toBe(false);
    expect(await call("run_cell", { session_id, code: "x + 1" })).toMatchObject({
      type: `${PROBLEMS}not-found`,
    });
    const otherClosed = await call("close_session", { session_id: other });
    expect(otherClosed).toMatchObject({ state: "deleted" });
    // Three cells, and each session's running time.
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits:
        100 - 3 * gw.config.sessions.unitsPerCell - closed.usage.units - otherClosed.usage.units,
      reservedUnits: 0,
    });
    expect(runtime.requests).toEqual([]);
  });

  it("tells the model what was wrong: a malformed session id, another key's session, an unknown language", async () => {
    const { sandfork } = await client();
    const stranger = await client();
    const anthropic = async (name: string, input: unknown) => {
      const result = await sandfork.toolCall({ type: "tool_use", id: "toolu_x", name, input });
      expect(result.is_error, result.content as string).toBe(true);
      return JSON.parse(result.content as string) as Record<string, unknown>;
    };
    expect(await anthropic("run_cell", { session_id: "s1", code: "1" })).toMatchObject({
      type: `${PROBLEMS}invalid-tool-arguments`,
      errors: [{ path: "session_id" }],
    });
    expect(await anthropic("run_cell", { session_id: crypto.randomUUID() })).toMatchObject({
      type: `${PROBLEMS}invalid-tool-arguments`,
      errors: [{ path: "code" }],
    });
    expect(await anthropic("open_session", { language: "cobol" })).toMatchObject({
      type: `${PROBLEMS}unknown-template`,
    });
    const theirs = JSON.parse(
      (
        await stranger.sandfork.toolCall({
          type: "tool_use",
          id: "toolu_y",
          name: "open_session",
          input: { language: "python" },
        })
      ).content as string,
    ) as { session_id: string };
    expect(
      await anthropic("run_cell", { session_id: theirs.session_id, code: "x = 1" }),
    ).toMatchObject({ type: `${PROBLEMS}not-found`, status: 404 });
    expect(await anthropic("close_session", { session_id: theirs.session_id })).toMatchObject({
      type: `${PROBLEMS}not-found`,
    });
    expect(runtime.cells.namespaces.get(theirs.session_id)?.size).toBe(0);
  });
});

describe("/mcp", () => {
  async function mcpClient(key: string | undefined) {
    const headers: Record<string, string> =
      key === undefined ? {} : { authorization: `Bearer ${key}` };
    const transport = new StreamableHTTPClientTransport(new URL("http://gateway.test/mcp"), {
      fetch: appFetch,
      requestInit: { headers },
    });
    const mcp = new Client({ name: "test", version: "1" });
    await mcp.connect(transport);
    return mcp;
  }

  it("refuses a client without credentials", async () => {
    await expect(mcpClient(undefined)).rejects.toThrow(/401|unauthenticated|Credentials/i);
    const response = await gw.call("POST", "/mcp", {
      body: { jsonrpc: "2.0", id: 1, method: "tools/list" },
    });
    expect(response.status).toBe(401);
    // With credentials, the stateless server offers no GET stream and no sessions to DELETE.
    const { key } = await gw.issue();
    for (const method of ["GET", "DELETE"])
      expect(
        (
          await gw.call(method, "/mcp", {
            credential: key,
            headers: { accept: "text/event-stream" },
          })
        ).status,
        method,
      ).toBe(405);
  });

  it("lists the tools, runs run_code billed, and reports failures as isError results with the problem type", async () => {
    const { key, accountId } = await gw.issue({ credits: 100 });
    const mcp = await mcpClient(key);
    const { tools } = await mcp.listTools();
    expect(tools.map((t) => t.name)).toEqual(TOOLS);
    const ran = await mcp.callTool({
      name: "run_code",
      arguments: { language: "python", code: "print(45)" },
    });
    expect(ran.isError).toBeFalsy();
    expect(ran.structuredContent).toMatchObject({
      status: "completed",
      stdout: "45\n",
      usage: { units: CHARGED },
    });
    expect(await gw.books(accountId)).toMatchObject({ balanceUnits: 100 - CHARGED });

    // The session tools' results match the output schemas the client checks them against.
    const opened = await mcp.callTool({ name: "open_session", arguments: { language: "python" } });
    const session_id = (opened.structuredContent as { session_id: string }).session_id;
    await mcp.callTool({ name: "run_cell", arguments: { session_id, code: "y = 1" } });
    const cell = await mcp.callTool({ name: "run_cell", arguments: { session_id, code: "y + 1" } });
    expect(cell.isError, JSON.stringify(cell)).toBeFalsy();
    expect(cell.structuredContent).toMatchObject({ session_id, value: "2", error: null });
    const closed = await mcp.callTool({ name: "close_session", arguments: { session_id } });
    expect(closed.structuredContent).toMatchObject({ session_id, state: "deleted" });

    const bad = await mcp.callTool({ name: "run_code", arguments: { language: "python" } });
    expect(bad.isError).toBe(true);
    expect(JSON.parse((bad.content as { text: string }[])[0]?.text ?? "")).toMatchObject({
      type: `${PROBLEMS}invalid-tool-arguments`,
    });
    await mcp.close();
  });
});

describe("streamed POST /v1/executions", () => {
  it("sends started, the output chunks in order, then the plain answer's body; billed the same", async () => {
    runtime.chunks = [
      { stream: "stdout", data: "one\n" },
      { stream: "stderr", data: "warn\n" },
      { stream: "stdout", data: "two\n" },
    ];
    const { sandfork, accountId, key } = await client();
    const events: StreamEvent[] = [];
    for await (const event of sandfork.stream({ template: "python", code: "x" }))
      events.push(event);
    const [started, ...rest] = events;
    const final = rest.pop();
    expect(started?.event).toBe("started");
    expect(rest).toEqual([
      { event: "output", stream: "stdout", data: "one\n" },
      { event: "output", stream: "stderr", data: "warn\n" },
      { event: "output", stream: "stdout", data: "two\n" },
    ]);
    if (final?.event !== "execution" || started?.event !== "started")
      throw new Error(`unexpected events ${JSON.stringify(events)}`);
    expect(final.execution).toMatchObject({
      id: started.id,
      stdout: "one\ntwo\n",
      stderr: "warn\n",
      usage: { units: CHARGED },
    });
    // GET answers the same record, without the run's results (which are not kept).
    const { results, ...recorded } = final.execution;
    expect(results).toEqual([]);
    const stored = await gw.call("GET", `/v1/executions/${started.id}`, { credential: key });
    expect(await stored.json()).toEqual(recorded);
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: 100 - CHARGED,
      reservedUnits: 0,
    });

    // "stream": true streams without the Accept header; a refusal before the start is plain problem+json.
    const viaBody = await gw.call("POST", "/v1/executions", {
      credential: (await gw.issue({ credits: 100 })).key,
      body: { template: "python", code: "x", stream: true },
    });
    expect(viaBody.headers.get("content-type")).toMatch(/^text\/event-stream/);
    expect(await viaBody.text()).toMatch(/^event: started\n[\s\S]*event: execution\n/);
    const poor = await client(null);
    await expect(async () => {
      for await (const _ of poor.sandfork.stream({ template: "python", code: "x" })) break;
    }).rejects.toThrow(SandforkError);
  });
});
