// Mapping protocol v1 frames to the runtime's types and errors, on in-memory frames. Execution
// frames cannot come from the daemon on this machine (no /dev/kvm), so the mapping of each
// `status`, the fault and the usage counters is checked here on PROTOCOL.md's own examples
// (native-vmm/tests/fixtures/protocol/, which the daemon's tests read too).
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import {
  RuntimeBusyError,
  RuntimeInternalError,
  RuntimeProtocolError,
  RuntimeRequestError,
  RuntimeUnavailableError,
} from "./errors.js";
import type { ExecutionRequest } from "./execution-runtime.js";
import {
  errorFromFrame,
  executeFrame,
  parseExecution,
  parseHello,
  parseOutput,
} from "./protocol.js";

/** PROTOCOL.md's examples, shared with the daemon's Rust tests. */
const fixture = (name: string) =>
  JSON.parse(
    readFileSync(
      new URL(`../native-vmm/tests/fixtures/protocol/${name}.json`, import.meta.url),
      "utf8",
    ),
  ) as { request?: Record<string, any>; reply: Record<string, any> };
/** The `execution` example of native-vmm/PROTOCOL.md. */
const EXAMPLE = fixture("execute").reply;

describe("protocol v1 mapping", () => {
  it("maps an execution frame: outcome, output, microseconds to milliseconds, limits, usage", () => {
    expect(parseExecution(EXAMPLE)).toEqual({
      outcome: "completed",
      exitCode: 0,
      stdout: "42\n",
      stderr: "",
      truncated: false,
      timings: { queueMs: 0.012, forkMs: 0.41, execMs: 0.95 },
      fault: null,
      limits: { timeoutMs: 10000, memoryMib: 256, outputBytes: 1048576, processes: 64 },
      usage: {
        wallMs: 1.36,
        cpuMs: 0.9,
        peakMemoryBytes: 18350080,
        pagesCopied: 212,
        syscalls: 31,
        exits: 33,
        processesCreated: 0,
        network: { bytesIn: 0, bytesOut: 0, connections: 0, refused: 0, dnsQueries: 0 },
      },
    });
  });

  it("reads PROTOCOL.md's hello, output and error examples", () => {
    expect(parseHello(fixture("hello").reply)).toEqual({ server: "sandfork-vmm 0.1.0" });
    expect(parseOutput(fixture("output").reply)).toEqual({ stream: "stdout", data: "line 1\n" });
    const error = errorFromFrame(fixture("error").reply);
    expect(error).toBeInstanceOf(RuntimeRequestError);
    expect(error).toMatchObject({ code: "unknown_template", retryable: false });
    const busy = errorFromFrame(fixture("busy").reply);
    expect(busy).toBeInstanceOf(RuntimeBusyError);
    expect(busy).toMatchObject({ code: "busy", retryable: true, reason: "key_queue_full" });
  });

  it("maps every status to its outcome; a crash keeps its fault", () => {
    const outcome = (status: string, extra: Record<string, unknown> = {}) =>
      parseExecution({ ...EXAMPLE, status, exit_code: null, ...extra }).outcome;
    expect(outcome("error", { exit_code: 1 })).toBe("completed");
    expect(outcome("timeout")).toBe("timed_out");
    expect(outcome("out_of_memory")).toBe("memory_exceeded");
    expect(outcome("output_limit", { truncated: true })).toBe("output_exceeded");
    expect(outcome("unsupported")).toBe("unsupported_syscall");
    expect(outcome("deadlocked")).toBe("deadlocked");
    expect(outcome("network_limit")).toBe("network_exceeded");
    const fault = { vector: 14, name: "page fault", rip: 4198400, address: 0 };
    const crashed = parseExecution({ ...EXAMPLE, status: "crashed", exit_code: null, fault });
    expect(crashed).toMatchObject({ outcome: "crashed", exitCode: null, fault });
  });

  it("reads a published result and the files under /work/out; absent ones stay absent", () => {
    expect(parseExecution(EXAMPLE)).not.toHaveProperty("results");
    expect(parseExecution(EXAMPLE)).not.toHaveProperty("files");
    const png = { type: "image/png", data: "iVBORw0KGgo=" };
    const ran = parseExecution({
      ...EXAMPLE,
      result: { value: "   a\n0  1", results: [png, { type: "text/html", data: "<table/>" }] },
      files: [
        { path: "plots/a.txt", bytes: 2, content: "aGk=" },
        { path: "big.bin", bytes: 3 << 20, content: null },
      ],
    });
    // The value comes last, as text/plain (Jupyter's execute_result after the displays).
    expect(ran.results).toEqual([
      png,
      { type: "text/html", data: "<table/>" },
      { type: "text/plain", data: "   a\n0  1" },
    ]);
    expect(ran.files).toEqual([
      { path: "plots/a.txt", bytes: 2, content: Buffer.from("hi") },
      { path: "big.bin", bytes: 3 << 20, content: null },
    ]);
    // A statement's result has no value; a session cell's (with its error) reads the same way;
    // an ended cell's is null.
    expect(parseExecution({ ...EXAMPLE, result: { value: null, results: [] } }).results).toEqual(
      [],
    );
    const cell = { value: "3", error: null, results: [png] };
    expect(parseExecution({ ...EXAMPLE, session: "s", result: cell }).results).toEqual([
      png,
      { type: "text/plain", data: "3" },
    ]);
    expect(parseExecution({ ...EXAMPLE, result: null })).not.toHaveProperty("results");
    expect(() =>
      parseExecution({ ...EXAMPLE, files: [{ path: "a", bytes: -1, content: null }] }),
    ).toThrow(/files\.0\.bytes/);
    expect(() => parseExecution({ ...EXAMPLE, result: { value: 1, results: [] } })).toThrow(
      /result\.value/,
    );
  });

  it("output NUL bytes become U+FFFD, as invalid UTF-8 already is: PostgreSQL text cannot hold them", () => {
    expect(
      parseExecution({ ...EXAMPLE, stdout: "a\u0000b\u0000", stderr: "\u0000" }),
    ).toMatchObject({ stdout: "a\uFFFDb\uFFFD", stderr: "\uFFFD" });
    expect(parseOutput({ type: "output", id: 7, stream: "stdout", data: "x\u0000" })).toEqual({
      stream: "stdout",
      data: "x\uFFFD",
    });
  });

  it("refuses execution frames that break the protocol, naming the field", () => {
    expect(() => parseExecution({ ...EXAMPLE, status: "exploded" })).toThrow(RuntimeProtocolError);
    expect(() =>
      parseExecution({ ...EXAMPLE, usage: { ...EXAMPLE.usage, pages_copied: -1 } }),
    ).toThrow(/usage\.pages_copied/);
    expect(() =>
      parseExecution({ ...EXAMPLE, limits: { ...EXAMPLE.limits, processes: 1.5 } }),
    ).toThrow(/limits\.processes/);
    const { timings: _, ...withoutTimings } = EXAMPLE;
    expect(() => parseExecution(withoutTimings)).toThrow(/timings/);
  });

  it("maps each error code of PROTOCOL.md's table to its class and retryability", () => {
    const error = (code: string) =>
      errorFromFrame({ id: 1, type: "error", code, message: "why", retryable: false });
    expect(error("unavailable")).toBeInstanceOf(RuntimeUnavailableError);
    expect(error("busy")).toBeInstanceOf(RuntimeBusyError);
    expect(error("internal")).toBeInstanceOf(RuntimeInternalError);
    for (const code of ["unavailable", "busy", "internal"])
      expect(error(code)).toMatchObject({ code, retryable: true });
    for (const code of ["bad_frame", "bad_request", "unsupported_protocol", "unknown_template"]) {
      expect(error(code)).toBeInstanceOf(RuntimeRequestError);
      expect(error(code)).toMatchObject({ code, retryable: false });
    }
    expect(error("bad_request").message).toBe("sandfork-vmm: why");
    expect(error("on_fire")).toBeInstanceOf(RuntimeProtocolError);
  });

  it("checks the hello: our protocol version, or the daemon's error", () => {
    expect(parseHello({ type: "hello", protocol: 1, server: "sandfork-vmm 9.9.9" })).toEqual({
      server: "sandfork-vmm 9.9.9",
    });
    expect(() => parseHello({ type: "hello", protocol: 2, server: "x" })).toThrow(/protocol 2/);
    expect(() =>
      parseHello({
        id: null,
        type: "error",
        code: "unsupported_protocol",
        message: "no",
        retryable: false,
      }),
    ).toThrow(RuntimeRequestError);
  });

  it("builds an execute request with only protocol fields; argv[0] is the script's name", () => {
    const request: ExecutionRequest = {
      executionId: "not sent",
      template: "python",
      code: "print(1)",
      stdin: "in",
      args: ["a", "b"],
      env: { K: "v" },
      files: [{ path: "d/x.bin", content: "AAE=", encoding: "base64" }],
      language: "python",
      timeoutMs: 1500,
      memoryMb: 128,
      maxProcesses: 3,
    };
    expect(executeFrame(request)).toEqual({
      type: "execute",
      template: "python",
      code: "print(1)",
      stdin: "in",
      // PROTOCOL.md's default argv[0]: the code runs under the same name with or without arguments.
      argv: ["main.py", "a", "b"],
      env: { K: "v" },
      files: [{ path: "d/x.bin", content: "AAE=", encoding: "base64" }],
      limits: { timeout_ms: 1500, memory_mib: 128, processes: 3 },
    });
    // Streamed: the same, asking for output frames, which are checked like every frame.
    expect(executeFrame(request, true)).toEqual({ ...executeFrame(request), stream: true });
    // The script's extension tells a Node template the language; no memory: the template's size;
    // no process limit: the daemon's.
    const { memoryMb: _memory, maxProcesses: _processes, ...withoutMemory } = request;
    expect(executeFrame({ ...withoutMemory, language: "typescript", args: [] })).toMatchObject({
      argv: ["main.ts"],
      limits: { timeout_ms: 1500 },
    });
    expect(executeFrame({ ...withoutMemory, language: "javascript" }).limits).toEqual({
      timeout_ms: 1500,
    });
    // Whose it is: the key's line at the daemon (PROTOCOL.md's example names one).
    expect(executeFrame({ ...request, keyId: "key-0b7e4d4e" })).toEqual({
      ...executeFrame(request),
      key_id: "key-0b7e4d4e",
    });
    expect(fixture("execute").request?.key_id).toBe("key-0b7e4d4e");
    // The network grant, as PROTOCOL.md's example carries it: the lists in order, the limits given.
    const network = {
      allowlists: [["pypi.org:443", "*.pythonhosted.org:443"]],
      maxConnections: 8,
      maxBytes: 104857600,
    };
    expect(executeFrame({ ...request, network }).network).toEqual(
      fixture("execute").request?.network,
    );
    expect(
      executeFrame({ ...request, network: { allowlists: [["a.example"], []] } }).network,
    ).toEqual({ allowlists: [["a.example"], []] });
    expect(parseOutput({ id: 7, type: "output", stream: "stderr", data: "oops\n" })).toEqual({
      stream: "stderr",
      data: "oops\n",
    });
    expect(() => parseOutput({ id: 7, type: "output", stream: "stdin", data: "" })).toThrow(
      RuntimeProtocolError,
    );
  });
});
