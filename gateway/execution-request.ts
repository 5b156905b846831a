// An execution request as the API takes it, and the runtime's request it becomes with the
// defaults filled in: one definition for the execution service and for the edge's size checks.
import type { ExecutionRequest } from "../runtime/execution-runtime.js";
import type { ExecutionLimits } from "./config.js";
import type { NetworkPolicyInput } from "./network-policy.js";

/** What an execution request carries, as the execution schema reads it. */
export interface ExecutionInput {
  template: string;
  code: string;
  stdin?: string | undefined;
  args?: string[] | undefined;
  env?: Record<string, string> | undefined;
  files?: { path: string; content: string; encoding?: "utf8" | "base64" | undefined }[] | undefined;
  timeout_ms?: number | undefined;
  memory_mb?: number | undefined;
  max_processes?: number | undefined;
  /** One of the template's languages (default: its first). */
  language?: string | undefined;
  /** Narrows the key's network policy (gateway/network-policy.ts). */
  network?: NetworkPolicyInput | undefined;
}

/**
 * The runtime's request for an input, its language not yet resolved against the template and its
 * network not yet granted (that needs the caller's key).
 */
export type NormalizedRequest = Omit<ExecutionRequest, "executionId" | "language" | "network"> & {
  language?: string | undefined;
};

/** `input` with every default the runtime's request needs. */
export function normalizeExecution(
  input: ExecutionInput,
  limits: ExecutionLimits,
): NormalizedRequest {
  return {
    template: input.template,
    code: input.code,
    stdin: input.stdin ?? "",
    args: input.args ?? [],
    env: input.env ?? {},
    files: (input.files ?? []).map((f) => ({
      path: f.path,
      content: f.content,
      encoding: f.encoding ?? "utf8",
    })),
    timeoutMs: input.timeout_ms ?? limits.defaultTimeoutMs,
    // Without one, the template's VM size (its daemon knows it): a pooled VM serves the request.
    memoryMb: input.memory_mb,
    // Without one, the daemon's default, which is its maximum: the gateway's.
    maxProcesses: input.max_processes,
    language: input.language,
  };
}
