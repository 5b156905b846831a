// The rich results a run answers with (templates/python/README.md): the MIME types the API
// lists, and the check of what the guest published. A program can make the agent's private
// system call itself, so a result's type and data are the guest's: a type the API does not list
// is left out, and so is an image whose data is not base64.
import type { RichResult } from "../runtime/execution-runtime.js";
import { isStrictBase64 } from "./file-paths.js";

export const RICH_RESULT_TYPES = [
  "text/plain",
  "text/html",
  "text/markdown",
  "text/latex",
  "image/png",
  "image/jpeg",
  "image/svg+xml",
  "application/json",
] as const;

export type RichResultType = (typeof RICH_RESULT_TYPES)[number];

export interface CheckedResult {
  type: RichResultType;
  data: string;
}

/** Binary types, whose data is base64. */
export const BASE64_RESULT_TYPES: ReadonlySet<RichResultType> = new Set([
  "image/png",
  "image/jpeg",
]);

const known = (type: string): type is RichResultType =>
  (RICH_RESULT_TYPES as readonly string[]).includes(type);

/** `results` with those of an unknown type, or an image that is not base64, left out. */
export function checkedResults(results: readonly RichResult[]): CheckedResult[] {
  return results.filter(
    (r): r is CheckedResult =>
      known(r.type) && (!BASE64_RESULT_TYPES.has(r.type) || isStrictBase64(r.data)),
  );
}
