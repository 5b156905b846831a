// The agent integrations end to end on KVM: one gateway (PGlite) on a real HTTP port and the
// REAL supervised daemon serving the python template, shared by every test here.
// - MCP: the official SDK client over Streamable HTTP (API key and execute-only token), refused
//   without credentials; the stdio entry point (bin/sandfork-mcp.mjs) under the SDK's
//   StdioClientTransport; the session tools keeping a variable from one call to the next,
//   through MCP and through POST /v1/tool-calls in both formats.
// - The typed client's sessions: cells, files, pause, resume, forks, delete; network refused on
//   a key without a policy.
// - Tool loops: the official `openai` and `@anthropic-ai/sdk` clients and the Vercel AI SDK,
//   pointed at a fake model server in this file (the only test double: it answers with a
//   run_code tool call, then checks that the tool's answer came back in the next request).
// - Streaming: a program printing a line every 100 ms delivers its first chunk long before it
//   ends; the final event is the stored execution's body; a client that disconnects is billed
//   for what ran.
// Its waits are multiplied by SANDFORK_TEST_TIME_SCALE (1 native, ~15 in QEMU).

import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { resolve } from "node:path";
import { createOpenAI } from "@ai-sdk/openai";
import Anthropic from "@anthropic-ai/sdk";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { generateText, jsonSchema, stepCountIs, tool } from "ai";
import OpenAI from "openai";
import { Sandfork, type StreamEvent } from "sandfork";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { testNodeFlags, timeScale } from "./testing/kvm-tier.js";
import { type ServedGateway, startServedGateway } from "./testing/served-gateway.js";
import type { TestGateway } from "./testing/test-gateway.js";

const CREDITS = 100_000;
const TOOLS = ["run_code", "list_templates", "open_session", "run_cell", "close_session"];
const SIX_BY_SEVEN = { language: "python", code: "print(6*7)" };
let served: ServedGateway;
let gw: TestGateway;
let gatewayUrl: string;

beforeAll(async () => {
  served = await startServedGateway();
  ({ gw, url: gatewayUrl } = served);
});

afterAll(async () => {
  await served?.dispose();
});

async function sandfork() {
  const issued = await gw.issue({ credits: CREDITS });
  return { ...issued, client: new Sandfork({ baseUrl: gatewayUrl, apiKey: issued.key }) };
}

describe("MCP", () => {
  const connect = async (credential: string | undefined) => {
    const headers: Record<string, string> =
      credential === undefined ? {} : { authorization: `Bearer ${credential}` };
    const mcp = new Client({ name: "sandfork-test", version: "1.0.0" });
    await mcp.connect(
      new StreamableHTTPClientTransport(new URL("/mcp", gatewayUrl), { requestInit: { headers } }),
    );
    return mcp;
  };

  it("the SDK client lists the tools and run_code prints 42, billed, with an API key and with an execute-only token", async () => {
    const { key, accountId } = await sandfork();
    const token = (
      (await (
        await gw.call("POST", "/v1/tokens", { credential: key, body: { max_executions: 1 } })
      ).json()) as { token: string }
    ).token;
    for (const credential of [key, token]) {
      const mcp = await connect(credential);
      expect((await mcp.listTools()).tools.map((t) => t.name)).toEqual(TOOLS);
      const result = await mcp.callTool({ name: "run_code", arguments: SIX_BY_SEVEN });
      expect(result.isError, JSON.stringify(result)).toBeFalsy();
      expect(result.structuredContent).toMatchObject({
        status: "completed",
        exit_code: 0,
        stdout: "42\n",
        stderr: "",
      });
      expect((result.content as { text: string }[])[0]?.text).toContain('"stdout":"42\\n"');
      await mcp.close();
    }
    const usage = (await (await gw.call("GET", "/v1/usage", { credential: key })).json()) as {
      executions: number;
      units: number;
    };
    expect(usage.executions).toBe(2);
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: CREDITS - usage.units,
      reservedUnits: 0,
    });

    // The token's one execution is used: the next call is an isError result with our problem type.
    const mcp = await connect(token);
    const refused = await mcp.callTool({ name: "run_code", arguments: SIX_BY_SEVEN });
    expect(refused.isError).toBe(true);
    expect(JSON.parse((refused.content as { text: string }[])[0]?.text ?? "")).toMatchObject({
      type: "https://sandfork.dev/problems/token-execution-limit",
    });
    await mcp.close();
  });

  it("session tools: call 1 sets x = 41 in a session, call 2 gets 42 from x + 1 (separate MCP connections)", async () => {
    const { key, accountId } = await sandfork();
    // Each call on a connection of its own: the state is the session's, not the MCP connection's.
    const callOnce = async (name: string, args: Record<string, unknown>) => {
      const mcp = await connect(key);
      await mcp.listTools(); // the client checks structuredContent against the output schemas listed
      const result = await mcp.callTool({ name, arguments: args });
      await mcp.close();
      expect(result.isError, JSON.stringify(result)).toBeFalsy();
      return result.structuredContent as Record<string, any>;
    };
    const opened = await callOnce("open_session", { language: "python" });
    expect(opened).toMatchObject({ template: "python", state: "running" });
    const session_id = opened.session_id as string;
    const first = await callOnce("run_cell", { session_id, code: "x = 41" });
    expect(first).toMatchObject({ value: null, error: null, status: "completed", exit_code: 0 });
    const second = await callOnce("run_cell", { session_id, code: "print('adding')\nx + 1" });
    expect(second).toMatchObject({
      session_id,
      value: "42",
      error: null,
      status: "completed",
      stdout: "adding\n",
      stderr: "",
    });
    const missing = await callOnce("run_cell", { session_id, code: "y" });
    expect(missing).toMatchObject({ value: null, error: { name: "NameError" } });
    expect(missing.stderr).toContain("NameError");
    expect(await callOnce("close_session", { session_id })).toMatchObject({
      session_id,
      state: "deleted",
    });
    const session = await gw.call("GET", `/v1/sessions/${session_id}`, { credential: key });
    expect(session.status).toBe(404);
    const usage = (await (await gw.call("GET", "/v1/usage", { credential: key })).json()) as {
      units: number;
    };
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: CREDITS - usage.units,
      reservedUnits: 0,
    });
  });

  it("refuses a client without credentials", async () => {
    await expect(connect(undefined)).rejects.toThrow(/401/);
    await expect(connect("sfk_not_a_key")).rejects.toThrow(/401/);
  });

  it("the stdio entry point forwards to the gateway under the SDK's StdioClientTransport", async () => {
    const { key } = await sandfork();
    const transport = new StdioClientTransport({
      command: process.execPath,
      args: [...testNodeFlags, resolve("bin/sandfork-mcp.mjs")],
      env: { PATH: process.env.PATH ?? "", SANDFORK_URL: gatewayUrl, SANDFORK_API_KEY: key },
      stderr: "pipe",
    });
    const mcp = new Client({ name: "sandfork-test-stdio", version: "1.0.0" });
    await mcp.connect(transport);
    expect((await mcp.listTools()).tools.map((t) => t.name)).toEqual(TOOLS);
    const result = await mcp.callTool({ name: "run_code", arguments: SIX_BY_SEVEN });
    expect(result.structuredContent).toMatchObject({ status: "completed", stdout: "42\n" });
    await mcp.close();
  });
});

// ---- a fake model server: the test double of the LLM APIs ----

interface FakeModel {
  url: string;
  /** Every request body, by path. */
  requests: { path: string; body: Record<string, any> }[];
  close(): Promise<void>;
}

const PROGRAM_THE_MODEL_WRITES = { language: "python", code: "print(6*7)" };

async function readJson(request: IncomingMessage): Promise<Record<string, any>> {
  const chunks: Buffer[] = [];
  for await (const chunk of request) chunks.push(chunk as Buffer);
  return JSON.parse(Buffer.concat(chunks).toString("utf8")) as Record<string, any>;
}

/**
 * Answers OpenAI chat completions and Anthropic messages: a run_code tool call while the
 * conversation has no tool result, then a final text quoting the tool result's stdout.
 */
async function startFakeModel(): Promise<FakeModel> {
  const requests: FakeModel["requests"] = [];
  const server: Server = createServer((request, response) => {
    void readJson(request).then((body) => {
      const path = request.url ?? "";
      requests.push({ path, body });
      const send = (answer: unknown) => {
        response.writeHead(200, { "content-type": "application/json" });
        response.end(JSON.stringify(answer));
      };
      if (path.endsWith("/chat/completions")) {
        const result = (body.messages as { role: string; content: string }[]).find(
          (m) => m.role === "tool",
        );
        const message = result
          ? {
              role: "assistant",
              content: `The program printed ${JSON.parse(result.content).stdout.trim()}`,
            }
          : {
              role: "assistant",
              content: null,
              tool_calls: [
                {
                  id: "call_7",
                  type: "function",
                  function: {
                    name: "run_code",
                    arguments: JSON.stringify(PROGRAM_THE_MODEL_WRITES),
                  },
                },
              ],
            };
        send({
          id: "chatcmpl-1",
          object: "chat.completion",
          created: 1,
          model: body.model,
          choices: [
            { index: 0, message, finish_reason: result ? "stop" : "tool_calls", logprobs: null },
          ],
          usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
        });
      } else if (path.endsWith("/messages")) {
        const blocks = (body.messages as { content: unknown }[]).flatMap((m) =>
          Array.isArray(m.content) ? m.content : [],
        ) as Record<string, any>[];
        const result = blocks.find((b) => b.type === "tool_result");
        const content = result
          ? [
              {
                type: "text",
                text: `The program printed ${JSON.parse(result.content).stdout.trim()}`,
              },
            ]
          : [
              {
                type: "tool_use",
                id: "toolu_7",
                name: "run_code",
                input: PROGRAM_THE_MODEL_WRITES,
              },
            ];
        send({
          id: "msg_1",
          type: "message",
          role: "assistant",
          model: body.model,
          content,
          stop_reason: result ? "end_turn" : "tool_use",
          stop_sequence: null,
          usage: { input_tokens: 1, output_tokens: 1 },
        });
      } else {
        response.writeHead(404).end();
      }
    });
  });
  await new Promise<void>((listening) => server.listen(0, "127.0.0.1", listening));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests,
    close: () => new Promise((closed) => server.close(() => closed())),
  };
}

describe("tool loops with the LLM SDKs", () => {
  let model: FakeModel;
  beforeAll(async () => {
    model = await startFakeModel();
  });
  afterAll(async () => {
    await model?.close();
  });

  it("openai: the model's tool call runs through /v1/tool-calls and the tool message goes back", async () => {
    const { client } = await sandfork();
    const openai = new OpenAI({ baseURL: `${model.url}/v1`, apiKey: "test" });
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [
      { role: "user", content: "What is 6*7? Compute it." },
    ];
    const tools: OpenAI.Chat.ChatCompletionTool[] = await client.tools("openai");
    const first = await openai.chat.completions.create({ model: "fake", messages, tools });
    const asked = first.choices[0]?.message;
    if (asked?.tool_calls === undefined) throw new Error(`no tool call: ${JSON.stringify(first)}`);
    messages.push(asked);
    for (const call of asked.tool_calls) {
      if (call.type !== "function") throw new Error(`unexpected tool call ${call.type}`);
      const message: OpenAI.Chat.ChatCompletionToolMessageParam = await client.toolCall(call);
      messages.push(message);
    }
    const final = await openai.chat.completions.create({ model: "fake", messages, tools });
    expect(final.choices[0]?.message.content).toBe("The program printed 42");
    const sent = model.requests.filter((r) => r.path.endsWith("/chat/completions")).at(-1)?.body;
    expect(sent?.tools[0]).toMatchObject({ type: "function", function: { name: "run_code" } });
    expect(sent?.messages.at(-1)).toMatchObject({ role: "tool", tool_call_id: "call_7" });
    expect(JSON.parse(sent?.messages.at(-1).content)).toMatchObject({
      status: "completed",
      stdout: "42\n",
    });
  });

  it("@anthropic-ai/sdk: the tool_use block runs and the tool_result block goes back", async () => {
    const { client } = await sandfork();
    const anthropic = new Anthropic({ baseURL: model.url, apiKey: "test" });
    const messages: Anthropic.MessageParam[] = [
      { role: "user", content: "What is 6*7? Compute it." },
    ];
    const tools: Anthropic.Tool[] = await client.tools("anthropic");
    const first = await anthropic.messages.create({
      model: "fake",
      max_tokens: 100,
      messages,
      tools,
    });
    messages.push({ role: first.role, content: first.content });
    const results: Anthropic.ToolResultBlockParam[] = [];
    for (const block of first.content)
      if (block.type === "tool_use") results.push(await client.toolCall(block));
    expect(results).toHaveLength(1);
    messages.push({ role: "user", content: results });
    const final = await anthropic.messages.create({
      model: "fake",
      max_tokens: 100,
      messages,
      tools,
    });
    expect(final.content[0]).toMatchObject({ type: "text", text: "The program printed 42" });
    const sent = model.requests.filter((r) => r.path.endsWith("/messages")).at(-1)?.body;
    expect(sent?.messages.at(-1).content[0]).toMatchObject({
      type: "tool_result",
      tool_use_id: "toolu_7",
      is_error: false,
    });
  });

  it("Vercel AI SDK: generateText with our tool definition runs the loop", async () => {
    const { client } = await sandfork();
    const [definition] = await client.tools("openai");
    if (definition === undefined) throw new Error("no tools");
    const provider = createOpenAI({ baseURL: `${model.url}/v1`, apiKey: "test" });
    const result = await generateText({
      model: provider.chat("fake"),
      prompt: "What is 6*7? Compute it.",
      tools: {
        run_code: tool({
          description: definition.function.description,
          inputSchema: jsonSchema<{ language: string; code: string }>(
            definition.function.parameters,
          ),
          execute: async (input, { toolCallId }) => {
            const message = await client.toolCall({
              id: toolCallId,
              type: "function",
              function: { name: "run_code", arguments: JSON.stringify(input) },
            });
            return JSON.parse(message.content) as Record<string, unknown>;
          },
        }),
      },
      stopWhen: stepCountIs(2),
    });
    expect(result.text).toBe("The program printed 42");
    expect(result.steps[0]?.toolResults[0]?.output).toMatchObject({
      status: "completed",
      stdout: "42\n",
    });
  });
});

describe("session tools through POST /v1/tool-calls", () => {
  it("OpenAI then Anthropic calls share a session: x = 41, then x + 1 is 42", async () => {
    const { client } = await sandfork();
    const openai = async (name: string, args: Record<string, unknown>) =>
      JSON.parse(
        (
          await client.toolCall({
            id: `call_${name}`,
            type: "function",
            function: { name, arguments: JSON.stringify(args) },
          })
        ).content,
      ) as Record<string, any>;
    const anthropic = async (name: string, input: Record<string, unknown>) => {
      const block = await client.toolCall({ type: "tool_use", id: `toolu_${name}`, name, input });
      expect(block.is_error, block.content as string).toBe(false);
      return JSON.parse(block.content as string) as Record<string, any>;
    };
    const session_id = (await openai("open_session", { language: "python" })).session_id as string;
    expect(await openai("run_cell", { session_id, code: "x = 41" })).toMatchObject({
      value: null,
      status: "completed",
    });
    expect(await anthropic("run_cell", { session_id, code: "x + 1" })).toMatchObject({
      session_id,
      value: "42",
      error: null,
      status: "completed",
    });
    expect(await anthropic("close_session", { session_id })).toMatchObject({ state: "deleted" });
    expect(await openai("run_cell", { session_id, code: "x + 1" })).toMatchObject({
      type: "https://sandfork.dev/problems/not-found",
    });
  });
});

describe("sessions through the typed client", () => {
  it("x = 41, then x + 1 is 42 across pause, a file, forks (one and count: 2) and delete", async () => {
    const { client } = await sandfork();
    const session = await client.createSession({ template: "python", idle_timeout_s: 600 });
    expect(session).toMatchObject({ template: "python", state: "running", cells: 0 });
    expect(await client.runCell(session.id, { code: "x = 41" })).toMatchObject({
      value: null,
      error: null,
    });
    const cell = await client.runCell(session.id, { code: "print('adding')\nx + 1" });
    expect(cell).toMatchObject({ value: "42", session: { id: session.id, cells: 2 } });
    expect(cell.execution.stdout).toBe("adding\n");

    expect(await client.writeSessionFile(session.id, "data/in.txt", "from the client")).toEqual({
      path: "data/in.txt",
      bytes: 15,
    });
    await client.runCell(session.id, {
      code: "open('/work/out.bin', 'wb').write(bytes(range(256)))",
    });
    expect(await client.readSessionFile(session.id, "out.bin")).toEqual(
      new Uint8Array([...Array(256).keys()]),
    );
    const paused = await client.pauseSession(session.id);
    expect(paused.session.state).toBe("paused");
    expect(paused.sha256).toMatch(/^[0-9a-f]{64}$/);
    expect((await client.resumeSession(session.id)).state).toBe("running");
    const read = await client.runCell(session.id, { code: "open('/work/data/in.txt').read()" });
    expect(read.value).toBe("'from the client'");

    const taken = await client.checkpointSession(session.id);
    const fork = await client.forkSession(session.id, { checkpoint: taken.checkpoint });
    expect(fork.id).not.toBe(session.id);
    await client.runCell(fork.id, { code: "x = 0" });
    expect((await client.runCell(session.id, { code: "x + 1" })).value).toBe("42");
    const { sessions: copies } = await client.forkSession(session.id, { count: 2 });
    expect(new Set(copies.map((c) => c.id)).size).toBe(2);
    for (const copy of [fork, ...copies]) {
      expect((await client.deleteSession(copy.id)).state).toBe("deleted");
    }
    expect((await client.deleteSession(session.id)).state).toBe("deleted");
    await expect(client.session(session.id)).rejects.toMatchObject({
      status: 404,
      problem: { type: "https://sandfork.dev/problems/not-found" },
    });
  });

  it("network on a key without a policy: 403 network-not-allowed, on an execution and a cell", async () => {
    const { client } = await sandfork();
    const network = { allow: ["example.com:443"] };
    const refused = {
      status: 403,
      problem: { type: "https://sandfork.dev/problems/network-not-allowed" },
    };
    await expect(
      client.execute({ template: "python", code: "print(1)", network }),
    ).rejects.toMatchObject(refused);
    const session = await client.createSession({ template: "python" });
    await expect(client.runCell(session.id, { code: "print(1)", network })).rejects.toMatchObject(
      refused,
    );
    await client.deleteSession(session.id);
  });
});

describe("streamed executions", () => {
  const TICKS =
    "import time\nfor i in range(5):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n";

  it("a line every 100 ms: the first chunk arrives before the program ends; the final event is the plain body", async () => {
    const { client, key } = await sandfork();
    const seen: { event: StreamEvent; at: number }[] = [];
    const sent = performance.now();
    for await (const event of client.stream({ template: "python", code: TICKS }))
      seen.push({ event, at: performance.now() - sent });
    const outputs = seen.filter((s) => s.event.event === "output");
    const last = seen.at(-1);
    if (last?.event.event !== "execution")
      throw new Error(`no final event: ${JSON.stringify(seen)}`);
    const execution = last.event.execution;
    expect(execution).toMatchObject({
      status: "completed",
      exit_code: 0,
      stdout: "tick 0\ntick 1\ntick 2\ntick 3\ntick 4\n",
      stderr: "",
    });
    expect(outputs.map((o) => (o.event.event === "output" ? o.event.data : "")).join("")).toBe(
      execution.stdout,
    );
    // Five lines 100 ms apart: the first is out ~400 ms before the end.
    const firstAt = outputs[0]?.at ?? Number.NaN;
    expect(
      last.at - firstAt,
      JSON.stringify(seen.map((s) => [s.event.event, Math.round(s.at)])),
    ).toBeGreaterThan(250);
    expect(outputs.length).toBeGreaterThanOrEqual(3);

    // The final event is what the plain call answers for the same execution; GET answers the
    // stored record, without the run's results (they are not kept).
    const stored = await gw.call("GET", `/v1/executions/${execution.id}`, { credential: key });
    const { results, ...recorded } = execution;
    expect(results).toEqual([]);
    expect(await stored.json()).toEqual(recorded);
    const plain = await client.execute({ template: "python", code: TICKS });
    const comparable = ({
      status,
      exit_code,
      stdout,
      stderr,
      truncated,
      template,
      usage,
    }: typeof execution) => ({
      status,
      exit_code,
      stdout,
      stderr,
      truncated,
      template,
      usage: { unit: usage.unit, reserved_units: usage.reserved_units },
    });
    expect(comparable(execution)).toEqual(comparable(plain));
    expect(Object.keys(execution).sort()).toEqual(Object.keys(plain).sort());
  });

  it("a client that disconnects mid-stream stops nothing and is billed for what ran", async () => {
    const { client, key, accountId } = await sandfork();
    const abort = new AbortController();
    let id: string | undefined;
    await expect(
      (async () => {
        for await (const event of client.stream(
          { template: "python", code: TICKS },
          { signal: abort.signal },
        )) {
          if (event.event === "started") id = event.id;
          if (event.event === "output") abort.abort();
        }
      })(),
    ).rejects.toThrow();
    if (id === undefined) throw new Error("no started event");
    let execution: { status: string; stdout: string; usage: { units: number | null } } | undefined;
    const deadline = Date.now() + 10_000 * timeScale;
    while (Date.now() < deadline) {
      execution = (await (
        await gw.call("GET", `/v1/executions/${id}`, { credential: key })
      ).json()) as typeof execution;
      if (execution?.status !== "running") break;
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(execution).toMatchObject({
      status: "completed",
      stdout: "tick 0\ntick 1\ntick 2\ntick 3\ntick 4\n",
    });
    expect(execution?.usage.units).toBeGreaterThan(0);
    expect(await gw.books(accountId)).toMatchObject({
      balanceUnits: CREDITS - (execution?.usage.units ?? 0),
      reservedUnits: 0,
    });
  });
});
