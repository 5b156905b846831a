// The daemon's rules for files placed under a VM's /work, checked at the edge so that a request the
// daemon would refuse is answered 422 (not retryable) instead of reaching it and coming back as a
// runtime failure. They are the daemon's, one for one: `check_work_path` and
// `AgentRequest::validate` in native-vmm/src/agent.rs, and strict base64 in
// native-vmm/src/daemon/base64.rs. Every schema that takes a file path uses this module, and
// native-vmm/tests/fixtures/file-paths.json holds cases with their verdicts that both sides are
// tested against (gateway/file-paths.test.ts and the daemon's request tests).
import type { RefinementCtx } from "zod";

/** A path is at most this many bytes: "/work/" and it, with a NUL, within Linux's PATH_MAX (4096). */
export const WORK_PATH_MAX_BYTES = 4096 - "/work/".length - 1;
/** Each component is at most this many bytes (Linux's NAME_MAX). */
export const NAME_MAX_BYTES = 255;

/** What the path rules say, for a schema's description. */
export const WORK_PATH_RULES =
  `Relative to /work: non-empty, no leading '/', no NUL, no empty (doubled or trailing '/'), '.' or '..' components; ` +
  `at most ${WORK_PATH_MAX_BYTES} bytes, each component at most ${NAME_MAX_BYTES} (UTF-8)`;

const utf8Bytes = (text: string): number => Buffer.byteLength(text, "utf8");

/** Why the daemon refuses `path` as a file under /work, or undefined when it takes it. */
export function workPathProblem(path: string): string | undefined {
  if (path === "") return "empty path";
  if (path.startsWith("/")) return "absolute paths are not allowed (paths are relative to /work)";
  if (path.includes("\0")) return "contains a NUL byte";
  if (utf8Bytes(path) > WORK_PATH_MAX_BYTES) return `longer than ${WORK_PATH_MAX_BYTES} bytes`;
  for (const component of path.split("/")) {
    if (component === "") return "empty path component (a doubled or trailing '/')";
    if (component === "." || component === "..")
      return `'${component}' components are not allowed (paths stay inside /work)`;
    if (utf8Bytes(component) > NAME_MAX_BYTES)
      return `a component is longer than ${NAME_MAX_BYTES} bytes`;
  }
  return undefined;
}

/**
 * Whether `text` is standard base64 (RFC 4648 §4) with its padding, in the one spelling each
 * content has: no whitespace, no missing or misplaced padding, no bits set after the last byte.
 * Node's decoder is lenient, so the test is that encoding what it decodes gives `text` back.
 */
export function isStrictBase64(text: string): boolean {
  if (text.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(text)) return false;
  return Buffer.from(text, "base64").toString("base64") === text;
}

export interface FileEntry {
  path: string;
  content: string;
  encoding?: "utf8" | "base64" | undefined;
}

export interface FileProblem {
  /** Where, relative to the files array: [index, field] or [] for the array as a whole. */
  at: (string | number)[];
  message: string;
}

/**
 * The problems the daemon would find with `files` placed beside the script `script` (argv[0];
 * undefined when it is not known yet: the checks that need it are left out). Each path must be a
 * valid work path, base64 contents strict, no path given twice or equal to the script's, and no
 * path (the script's included) inside another one, which is a file.
 */
export function filesProblems(files: readonly FileEntry[], script?: string): FileProblem[] {
  const problems: FileProblem[] = [];
  const seen = new Map<string, number>();
  if (script !== undefined) seen.set(script, -1);
  files.forEach((file, i) => {
    const why = workPathProblem(file.path);
    if (why !== undefined) problems.push({ at: [i, "path"], message: why });
    else if (seen.has(file.path))
      problems.push({
        at: [i, "path"],
        message:
          seen.get(file.path) === -1
            ? "is the script's path"
            : `is given twice (files[${seen.get(file.path)}])`,
      });
    else seen.set(file.path, i);
    if (file.encoding === "base64" && !isStrictBase64(file.content)) {
      problems.push({
        at: [i, "content"],
        message: "is not standard base64 with padding (RFC 4648)",
      });
    }
  });
  for (const [path, i] of seen) {
    for (let slash = path.indexOf("/"); slash !== -1; slash = path.indexOf("/", slash + 1)) {
      const parent = seen.get(path.slice(0, slash));
      if (parent === undefined) continue;
      const what = (n: number) => (n === -1 ? "the script" : `files[${n}]`);
      problems.push({
        at: i === -1 ? [parent, "path"] : [i, "path"],
        message: `${what(parent)} is a file, so ${what(i)} cannot be inside it`,
      });
      break;
    }
  }
  return problems;
}

/**
 * For a zod schema's `.superRefine` on a files array: the only check of its paths, so each problem
 * is told once. The script is not known there (its language may be the template's default): the
 * execution service checks the files against it once the language is resolved.
 */
export function refineFiles(files: readonly FileEntry[], ctx: RefinementCtx): void {
  for (const problem of filesProblems(files))
    ctx.addIssue({ code: "custom", message: problem.message, path: problem.at });
}
