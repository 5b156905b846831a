// The daemon's size bounds at the edge (gateway/request-limits.ts): the constants are the values
// the daemon's own tests read (native-vmm/tests/fixtures/request-limits.json), and through the
// HTTP API every request past one of them is a 422 that is not retryable, refused before anything
// is reserved, while a request exactly at each bound gets through. Past a bound such a request used
// to reach the daemon and come back as a retryable 502 (or, holding an unpaired surrogate, as a
// frame the daemon could not read, answered only when the gateway stopped waiting).
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type {
  ExecutionRequest,
  ExecutionResult,
  ExecutionRuntime,
  Template,
} from "../runtime/execution-runtime.js";
import { encodeFrame } from "../runtime/frames.js";
import { executeFrame } from "../runtime/protocol.js";
import { daemonMaxima, loadConfig } from "./config.js";
import { REQUEST_LIMITS } from "./request-limits.js";
import { executionRequestSchema } from "./schemas.js";
import { expectProblem, startTestGateway, type TestGateway } from "./testing/test-gateway.js";
import { runCodeArguments } from "./tools/definitions.js";

const fixture = JSON.parse(
  readFileSync(
    new URL("../native-vmm/tests/fixtures/request-limits.json", import.meta.url),
    "utf8",
  ),
) as Record<string, number>;
const { MAX_CODE_BYTES, MAX_STDIN_BYTES, MAX_ARGS_ENV_BYTES, MAX_FILES_BYTES, MAX_FRAME_BYTES } =
  REQUEST_LIMITS;
const LIMITS = loadConfig({}).executionLimits;
const MiB = 1 << 20;

/** The frame the runtime sends for `request`, with the largest id it gives one. */
const frameOf = (request: ExecutionRequest, stream: boolean) => ({
  ...executeFrame(request, stream),
  id: Number.MAX_SAFE_INTEGER,
  type: "execute",
});

/** The bytes of the largest frame a request body may become (streamed, on the python template). */
function largestFrameBytes(body: Record<string, unknown>): number {
  const files =
    (body.files as { path: string; content: string; encoding?: "utf8" | "base64" }[] | undefined) ??
    [];
  const request: ExecutionRequest = {
    executionId: "",
    template: body.template as string,
    code: body.code as string,
    stdin: (body.stdin as string | undefined) ?? "",
    args: (body.args as string[] | undefined) ?? [],
    env: (body.env as Record<string, string> | undefined) ?? {},
    files: files.map((f) => ({ ...f, encoding: f.encoding ?? "utf8" })),
    language: "python",
    timeoutMs: (body.timeout_ms as number | undefined) ?? LIMITS.defaultTimeoutMs,
    // The calling key's id, a UUID (the test gateway's keys have one).
    keyId: "00000000-0000-0000-0000-000000000000",
  };
  return Buffer.byteLength(JSON.stringify(frameOf(request, true)));
}

describe("the limits", () => {
  it("are the daemon's, as the shared fixture holds them", () => {
    expect(REQUEST_LIMITS).toEqual(fixture);
  });

  it("the process limit: SANDFORK_MAX_PROCESSES from 1 to the daemon's largest, told to the daemon", () => {
    expect(LIMITS.maxProcesses).toBe(64);
    const maxProcesses = (value: string) =>
      loadConfig({ SANDFORK_MAX_PROCESSES: value }).executionLimits.maxProcesses;
    expect(maxProcesses("1")).toBe(1);
    expect(maxProcesses(String(REQUEST_LIMITS.MAX_PROCESS_LIMIT))).toBe(1024);
    for (const bad of ["0", "1025", "2.5", "many"])
      expect(() => maxProcesses(bad)).toThrow(/SANDFORK_MAX_PROCESSES/);
    expect(daemonMaxima({ ...LIMITS, maxProcesses: 9 })).toEqual({
      timeoutMs: LIMITS.maxTimeoutMs,
      memoryMib: LIMITS.maxMemoryMb,
      processes: 9,
    });
  });

  it("argv[0] is as long for every language as for the default one the schema counts", () => {
    const script = (language: string) =>
      (executeFrame({ ...frameless, language }).argv as string[])[0]!;
    for (const language of ["javascript", "typescript", "ruby"])
      expect(Buffer.byteLength(script(language))).toBe(Buffer.byteLength(script("python")));
  });

  it("are in the OpenAPI document and the tool's JSON Schema where a schema can say them", async () => {
    const gw = await startTestGateway("pglite");
    try {
      const doc = (await (await gw.call("GET", "/openapi.json")).json()) as {
        components: { schemas: Record<string, any> };
      };
      const execution = doc.components.schemas.ExecutionRequest;
      expect(execution.properties.code.maxLength).toBe(MAX_CODE_BYTES);
      expect(execution.properties.stdin.maxLength).toBe(MAX_STDIN_BYTES);
      expect(execution.properties.files.items.properties.content.maxLength).toBe(MAX_FRAME_BYTES);
      expect(execution.properties.args.description).toContain(String(MAX_ARGS_ENV_BYTES));
      expect(execution.properties.files.description).toContain(String(MAX_FILES_BYTES));
      expect(execution.description).toContain(String(MAX_FRAME_BYTES));
      expect(doc.components.schemas.SessionCellRequest.properties.code.maxLength).toBe(
        MAX_CODE_BYTES,
      );
      for (const schema of [execution, doc.components.schemas.SessionCellRequest])
        expect(schema.properties.max_processes).toMatchObject({
          minimum: 1,
          maximum: LIMITS.maxProcesses,
        });
    } finally {
      await gw.dispose();
    }
    const tool = (await import("zod")).z.toJSONSchema(runCodeArguments(LIMITS)) as any;
    expect(tool.properties.code.maxLength).toBe(MAX_CODE_BYTES);
    expect(tool.properties.stdin.maxLength).toBe(MAX_STDIN_BYTES);
  });

  it("code and files past 32 MiB are refused as such, though no frame could carry even that much", () => {
    const schema = executionRequestSchema(LIMITS);
    const half = "f".repeat(MAX_FILES_BYTES / 2);
    const issues = (code: string) => {
      const result = schema.safeParse({
        template: "python",
        code,
        files: [
          { path: "a", content: half },
          { path: "b", content: half },
        ],
      });
      return result.success
        ? []
        : result.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`);
    };
    expect(issues("#")).toContainEqual(
      expect.stringMatching(/^files: code and files take 33554433 bytes/),
    );
    expect(issues("").filter((i) => i.startsWith("files:"))).toEqual([]);
    // Past the frame anyway: a frame is at most 16 MiB, half the files' bound.
    expect(issues("")).toEqual([
      expect.stringMatching(/^: the request takes \d+ bytes as the runtime sends it/),
    ]);
  });
});

const frameless: ExecutionRequest = {
  executionId: "",
  template: "python",
  code: "",
  stdin: "",
  args: [],
  env: {},
  files: [],
  language: "python",
  timeoutMs: 1,
};

/** Answers every execution at once, after checking its frame fits as the runtime would send it. */
class FramingRuntime implements ExecutionRuntime {
  readonly requests: ExecutionRequest[] = [];
  async execute(
    request: ExecutionRequest,
    _signal: AbortSignal,
    onOutput?: unknown,
  ): Promise<ExecutionResult> {
    encodeFrame(frameOf(request, onOutput !== undefined));
    this.requests.push(request);
    return {
      outcome: "completed",
      exitCode: 0,
      stdout: "",
      stderr: "",
      truncated: false,
      timings: { queueMs: 0, forkMs: 1, execMs: 1 },
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

describe("request sizes through the API", () => {
  let gw: TestGateway;
  let runtime: FramingRuntime;
  let key: string;
  let accountId: string;
  beforeAll(async () => {
    runtime = new FramingRuntime();
    gw = await startTestGateway("pglite", { runtime });
    // The largest body a key may be given: the daemon's bounds, not the body cap, are what is tested.
    ({ key, accountId } = await gw.issue({ credits: 1_000_000, maxBodyBytes: 64 * MiB }));
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  const execute = (body: Record<string, unknown>) =>
    gw.call("POST", "/v1/executions", { credential: key, body: { template: "python", ...body } });

  /** `body` is a 422 naming `path`, not retryable, with nothing sent to the runtime and nothing held or charged. */
  async function refused(body: Record<string, unknown>, path: string, what: string): Promise<void> {
    const before = await gw.books(accountId);
    const sent = runtime.requests.length;
    const problem = await expectProblem(await execute(body), 422, "validation-failed").catch(
      (error: Error) => {
        throw new Error(`${what}: ${error.message.slice(0, 500)}`);
      },
    );
    expect(problem.retryable, what).toBe(false);
    expect(
      (problem.errors as { path: string }[]).map((e) => e.path),
      what,
    ).toContain(path);
    expect(runtime.requests.length, what).toBe(sent);
    expect(await gw.books(accountId), what).toEqual(before);
  }

  async function taken(body: Record<string, unknown>, what: string): Promise<void> {
    const sent = runtime.requests.length;
    const response = await execute(body);
    expect(response.status, `${what}: ${(await response.clone().text()).slice(0, 500)}`).toBe(200);
    expect(runtime.requests.length, what).toBe(sent + 1);
  }

  it("code: at most 4 MiB of UTF-8", async () => {
    await taken({ code: "#".repeat(MAX_CODE_BYTES) }, "code at the bound");
    await refused({ code: "#".repeat(MAX_CODE_BYTES + 1) }, "code", "code a byte past it");
    // Counted in bytes, as the daemon counts: half as many characters of two bytes each.
    await taken({ code: "é".repeat(MAX_CODE_BYTES / 2) }, "two-byte code at the bound");
    await refused(
      { code: `${"é".repeat(MAX_CODE_BYTES / 2 - 1)}ab#` },
      "code",
      "two-byte code a byte past it",
    );
  });

  it("stdin: at most 8 MiB of UTF-8", async () => {
    await taken({ code: "", stdin: "x".repeat(MAX_STDIN_BYTES) }, "stdin at the bound");
    await refused(
      { code: "", stdin: "x".repeat(MAX_STDIN_BYTES + 1) },
      "stdin",
      "stdin a byte past it",
    );
    await refused(
      { code: "", stdin: `${"€".repeat(Math.floor(MAX_STDIN_BYTES / 3))}abc` },
      "stdin",
      "three-byte stdin a byte past it",
    );
  });

  it("args and env: at most 256 KiB together, the script's name and a NUL per string included", async () => {
    // "main.py" and its NUL, 63 arguments of 4096 bytes and one of 4024, each with its NUL: 262144.
    const args = [...Array.from({ length: 63 }, () => "a".repeat(4096)), "a".repeat(4024)];
    await taken({ code: "", args }, "args at the bound");
    await refused(
      { code: "", args: [...args.slice(0, -1), "a".repeat(4025)] },
      "args",
      "args a byte past it",
    );
    // Variables count as name=value and a NUL: 8 + 63 * (3 + 1 + 4096 + 1) + (1 + 1 + 3770 + 1) = 262144.
    const env = Object.fromEntries(
      Array.from({ length: 63 }, (_, i) => [`V${String(i).padStart(2, "0")}`, "v".repeat(4096)]),
    );
    await taken({ code: "", env: { ...env, X: "x".repeat(3770) } }, "env at the bound");
    await refused({ code: "", env: { ...env, X: "x".repeat(3771) } }, "env", "env a byte past it");
    await taken(
      { code: "", args: ["a"], env: { ...env, X: "x".repeat(3768) } },
      "args with env at the bound",
    );
    await refused(
      { code: "", args: ["a"], env: { ...env, X: "x".repeat(3769) } },
      "args",
      "args with env a byte past it",
    );
  });

  it("the whole request: at most a 16 MiB frame as the runtime sends it", async () => {
    const base = {
      template: "python",
      code: "#".repeat(MAX_CODE_BYTES),
      stdin: "x".repeat(MAX_STDIN_BYTES),
      files: [{ path: "data", content: "" }],
    };
    const room = MAX_FRAME_BYTES - largestFrameBytes(base);
    const at = { ...base, files: [{ path: "data", content: "d".repeat(room) }] };
    expect(largestFrameBytes(at)).toBe(MAX_FRAME_BYTES);
    await taken(at, "a request whose largest frame is at the bound");
    await taken({ ...at, stream: true }, "the same request streamed");
    await refused(
      { ...base, files: [{ path: "data", content: "d".repeat(room + 1) }] },
      "",
      "a byte past it",
    );
    // The frame's JSON, not the strings' bytes: each control character is written as \u00XX.
    await refused(
      { code: "", stdin: "\u0001".repeat(3 * MiB) },
      "",
      "3 MiB of stdin that JSON writes in 18",
    );
  });

  it("what each string may hold: no NUL in args or env, no unpaired surrogate anywhere", async () => {
    await refused({ code: "", args: ["a\0b"] }, "args.0", "a NUL in an argument");
    await refused({ code: "", env: { A: "a\0b" } }, "env.A", "a NUL in a variable");
    await refused({ code: "print(1) # \ud800" }, "code", "an unpaired surrogate in the code");
    await refused({ code: "", stdin: "\udc00" }, "stdin", "one in stdin");
    await refused({ code: "", args: ["\ud800x"] }, "args.0", "one in an argument");
    await refused({ code: "", env: { A: "\udfff" } }, "env.A", "one in a variable");
    await refused(
      { code: "", files: [{ path: "a\ud800", content: "" }] },
      "files.0.path",
      "one in a file's path",
    );
    await refused(
      { code: "", files: [{ path: "a", content: "\ud800" }] },
      "files.0.content",
      "one in a file",
    );
    await taken(
      {
        code: "print('😀')",
        stdin: "😀",
        args: ["😀"],
        env: { A: "😀" },
        files: [{ path: "😀", content: "😀" }],
      },
      "paired surrogates",
    );
  });

  it("a session cell's code: at most 4 MiB of UTF-8, refused before the session is looked up", async () => {
    const cell = (code: string) =>
      gw.call("POST", `/v1/sessions/${randomUUID()}/executions`, {
        credential: key,
        body: { code },
      });
    const problem = await expectProblem(
      await cell("#".repeat(MAX_CODE_BYTES + 1)),
      422,
      "validation-failed",
    );
    expect(problem.retryable).toBe(false);
    await expectProblem(
      await cell(`${"é".repeat(MAX_CODE_BYTES / 2 - 1)}ab#`),
      422,
      "validation-failed",
    );
    await expectProblem(await cell("\ud800"), 422, "validation-failed");
    await expectProblem(await cell("#".repeat(MAX_CODE_BYTES)), 404, "not-found");
  });

  it("run_code: the model is told, and nothing runs or is held", async () => {
    const before = await gw.books(accountId);
    const sent = runtime.requests.length;
    const call = async (args: Record<string, unknown>) => {
      const response = await gw.call("POST", "/v1/tool-calls", {
        credential: key,
        body: {
          type: "tool_use",
          id: "toolu_1",
          name: "run_code",
          input: { language: "python", ...args },
        },
      });
      expect(response.status).toBe(200);
      const answer = (await response.json()) as { is_error: boolean; content: string };
      return {
        isError: answer.is_error,
        problem: JSON.parse(answer.content) as Record<string, unknown>,
      };
    };
    for (const [args, path] of [
      [{ code: "#".repeat(MAX_CODE_BYTES + 1) }, "code"],
      [{ code: `${"é".repeat(MAX_CODE_BYTES / 2 - 1)}ab#` }, "code"],
      [{ code: "", stdin: "x".repeat(MAX_STDIN_BYTES + 1) }, "stdin"],
      [{ code: "", stdin: "\u0001".repeat(3 * MiB) }, ""],
    ] as const) {
      const { isError, problem } = await call(args);
      expect(isError).toBe(true);
      expect(problem).toMatchObject({
        type: "https://sandfork.dev/problems/invalid-tool-arguments",
        retryable: false,
      });
      expect((problem.errors as { path: string }[]).map((e) => e.path)).toContain(path);
    }
    expect(runtime.requests.length).toBe(sent);
    expect(await gw.books(accountId)).toEqual(before);
    expect((await call({ code: "#".repeat(MAX_CODE_BYTES) })).isError).toBe(false);
  });
});
