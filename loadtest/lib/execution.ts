// What the load tests run, and where its template is built.
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { ExecutionRequest } from "../../runtime/execution-runtime.js";

export const REPOSITORY = fileURLToPath(new URL("../..", import.meta.url));
export const TEMPLATES_DIR = join(REPOSITORY, ".sandfork", "templates");
/** What every execution runs; the k6 script (execute.k6.ts) sends the same body. */
export const EXECUTION = { template: "python", code: "print(6*7)" };
export const EXECUTION_BODY = JSON.stringify(EXECUTION);

/** The same execution as a request straight to the daemon (the "daemon alone" baseline). */
export function daemonRequest(): ExecutionRequest {
  return {
    executionId: randomUUID(),
    ...EXECUTION,
    stdin: "",
    args: [],
    env: {},
    files: [],
    language: "python",
    timeoutMs: 5_000,
    memoryMb: 256,
  };
}
