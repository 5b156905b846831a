// The daemon's bounds on what one request may carry, checked at the edge so that a request the
// daemon would refuse is answered 422 (not retryable) before anything is reserved, instead of
// reaching the daemon and coming back as a runtime failure. The values are the daemon's, one for
// one: `AgentRequest::validate`'s constants in native-vmm/src/agent.rs, `MAX_SESSION_FILE_BYTES`
// in native-vmm/src/daemon/sessions.rs, `MAX_PROCESS_LIMIT` in native-vmm/src/process/tree.rs and
// the frame cap of native-vmm/PROTOCOL.md (runtime/frames.ts).
// native-vmm/tests/fixtures/request-limits.json holds them under the daemon's names; both sides
// are tested against it (gateway/request-limits.test.ts and the daemon's request tests).
// Sizes are UTF-8 bytes, as the daemon counts them; a file's size is its decoded content's.
import type { RefinementCtx } from "zod";
import type { ExecutionRequest } from "../runtime/execution-runtime.js";
import { MAX_FRAME_BYTES } from "../runtime/frames.js";
import { executeFrame } from "../runtime/protocol.js";
import type { ExecutionLimits } from "./config.js";
import { type ExecutionInput, normalizeExecution } from "./execution-request.js";

/** The daemon's limits, under its constants' names. */
export const REQUEST_LIMITS = {
  MAX_CODE_BYTES: 4 << 20,
  MAX_STDIN_BYTES: 8 << 20,
  /** argv (its script name included) and env strings, each with its NUL; a variable also with its '='. */
  MAX_ARGS_ENV_BYTES: 256 << 10,
  /** argv entries, its script name included. */
  MAX_ARGS: 1024,
  MAX_ENV_VARS: 1024,
  MAX_FILES: 1000,
  /** The code and every file's decoded content together. */
  MAX_FILES_BYTES: 32 << 20,
  /** One file written to or read from a session. */
  MAX_SESSION_FILE_BYTES: 8 << 20,
  /** The execute frame the runtime sends, as JSON. */
  MAX_FRAME_BYTES,
  /** The largest process limit (`serve --max-processes`, `limits.processes`). */
  MAX_PROCESS_LIMIT: 1024,
} as const;

/** The largest request id the runtime gives a frame (runtime/daemon-connection.ts). */
const LARGEST_FRAME_ID = Number.MAX_SAFE_INTEGER;

export const utf8Bytes = (text: string): number => Buffer.byteLength(text, "utf8");

/**
 * A string that is not well-formed UTF-16 (an unpaired surrogate, which JSON can carry as an escape):
 * the daemon cannot read a frame holding one, so it could not even answer the request.
 */
const LONE_SURROGATE = /[\uD800-\uDFFF]/u;
export const isWellFormed = (text: string): boolean => !LONE_SURROGATE.test(text);

/** For a string schema's `.superRefine`: at most `max` bytes of UTF-8, and well-formed. */
export function refineText(max: number) {
  return (text: string, ctx: RefinementCtx): void => {
    const bytes = utf8Bytes(text);
    if (bytes > max)
      ctx.addIssue({ code: "custom", message: `is ${bytes} bytes of UTF-8, more than ${max}` });
    if (!isWellFormed(text))
      ctx.addIssue({
        code: "custom",
        message: "contains an unpaired surrogate (not valid Unicode)",
      });
  };
}

/** The bytes a file's content stands for: base64 decoded (its padding left out), UTF-8 as it is. */
function decodedBytes(file: { content: string; encoding?: "utf8" | "base64" | undefined }): number {
  if (file.encoding !== "base64") return utf8Bytes(file.content);
  const padding = file.content.endsWith("==") ? 2 : file.content.endsWith("=") ? 1 : 0;
  return Math.max(0, Math.floor((file.content.length * 3) / 4) - padding);
}

/** The execute frame the runtime would send for `input`, the largest it may be (streamed). */
function largestFrame(input: ExecutionInput, limits: ExecutionLimits): Record<string, unknown> {
  const request: ExecutionRequest = {
    ...normalizeExecution(input, limits),
    executionId: "",
    // Without one, the template's first language: every script name is as long as Python's.
    language: input.language ?? "python",
    // The calling key's id rides along (a UUID's length).
    keyId: "00000000-0000-0000-0000-000000000000",
  };
  return { ...executeFrame(request, true), id: LARGEST_FRAME_ID, type: "execute" };
}

/**
 * The bytes of `frame` as JSON, or undefined when it certainly fits a frame: JSON writes a UTF-16
 * unit of a string in at most 6 bytes, so a frame whose strings are short enough is not encoded.
 */
function frameBytesIfLarge(
  frame: Record<string, unknown>,
  input: ExecutionInput,
): number | undefined {
  const files = input.files ?? [];
  const env = Object.entries(input.env ?? {});
  const args = input.args ?? [];
  const chars =
    input.code.length +
    (input.stdin ?? "").length +
    args.reduce((n, a) => n + a.length, 0) +
    env.reduce((n, [k, v]) => n + k.length + v.length, 0) +
    files.reduce((n, f) => n + f.path.length + f.content.length, 0);
  const structure = 1024 + input.template.length + 64 * (args.length + env.length + files.length);
  if (6 * chars + structure <= MAX_FRAME_BYTES) return undefined;
  return utf8Bytes(JSON.stringify(frame));
}

/**
 * For the execution schema's `.superRefine`: the daemon's bounds across fields (argv with env,
 * code with files, the whole frame) and on what each string may hold. Each field's own size is
 * its schema's check.
 */
export function refineExecutionSizes(
  input: ExecutionInput,
  ctx: RefinementCtx,
  limits: ExecutionLimits,
): void {
  const frame = largestFrame(input, limits);
  const argv = frame.argv as string[];
  const env = Object.entries(input.env ?? {});
  const argsEnv =
    argv.reduce((n, a) => n + utf8Bytes(a) + 1, 0) +
    env.reduce((n, [k, v]) => n + utf8Bytes(k) + utf8Bytes(v) + 2, 0);
  if (argsEnv > REQUEST_LIMITS.MAX_ARGS_ENV_BYTES) {
    ctx.addIssue({
      code: "custom",
      path: [input.args === undefined ? "env" : "args"],
      message: `args and env take ${argsEnv} bytes (each string with a NUL, the script's name included), more than ${REQUEST_LIMITS.MAX_ARGS_ENV_BYTES}`,
    });
  }
  const files = input.files ?? [];
  const filesBytes = utf8Bytes(input.code) + files.reduce((n, f) => n + decodedBytes(f), 0);
  if (filesBytes > REQUEST_LIMITS.MAX_FILES_BYTES) {
    ctx.addIssue({
      code: "custom",
      path: ["files"],
      message: `code and files take ${filesBytes} bytes, more than ${REQUEST_LIMITS.MAX_FILES_BYTES}`,
    });
  }
  (input.args ?? []).forEach((arg, i) => {
    if (!isWellFormed(arg))
      ctx.addIssue({
        code: "custom",
        path: ["args", i],
        message: "contains an unpaired surrogate (not valid Unicode)",
      });
  });
  for (const [name, value] of env) {
    if (!isWellFormed(value))
      ctx.addIssue({
        code: "custom",
        path: ["env", name],
        message: "contains an unpaired surrogate (not valid Unicode)",
      });
  }
  files.forEach((file, i) => {
    if (!isWellFormed(file.path))
      ctx.addIssue({
        code: "custom",
        path: ["files", i, "path"],
        message: "contains an unpaired surrogate (not valid Unicode)",
      });
    if (!isWellFormed(file.content))
      ctx.addIssue({
        code: "custom",
        path: ["files", i, "content"],
        message: "contains an unpaired surrogate (not valid Unicode)",
      });
  });
  const frameBytes = frameBytesIfLarge(frame, input);
  if (frameBytes !== undefined && frameBytes > REQUEST_LIMITS.MAX_FRAME_BYTES) {
    ctx.addIssue({
      code: "custom",
      path: [],
      message: `the request takes ${frameBytes} bytes as the runtime sends it (JSON), more than ${REQUEST_LIMITS.MAX_FRAME_BYTES}`,
    });
  }
}
