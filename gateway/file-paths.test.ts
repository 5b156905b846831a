// The daemon's file rules at the edge (gateway/file-paths.ts): every case of the fixture the
// daemon's own tests read (native-vmm/tests/fixtures/file-paths.json) gets the daemon's verdict
// here too, from the module, from every schema that takes a file path, and through the HTTP API,
// where a path or file list the daemon would refuse is a 422 that is not retryable (it used to
// reach the daemon and come back as a retryable 502, or, for a malformed percent-encoding in a
// session file's URL, as a retryable 500).
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type {
  ExecutionRequest,
  ExecutionResult,
  ExecutionRuntime,
  Template,
} from "../runtime/execution-runtime.js";
import { loadConfig } from "./config.js";
import { type FileEntry, filesProblems, isStrictBase64, workPathProblem } from "./file-paths.js";
import { executionRequestSchema } from "./schemas.js";
import { expectProblem, startTestGateway, type TestGateway } from "./testing/test-gateway.js";
import { runCodeArguments } from "./tools/definitions.js";

interface Fixture {
  work_paths: { path: string; valid: boolean }[];
  requests: { argv0: string; files: FileEntry[]; valid: boolean; why: string }[];
}
const fixture = JSON.parse(
  readFileSync(new URL("../native-vmm/tests/fixtures/file-paths.json", import.meta.url), "utf8"),
) as Fixture;
const LANGUAGE_OF: Record<string, string> = {
  "main.py": "python",
  "main.js": "javascript",
  "main.ts": "typescript",
};
const shown = (text: string) => JSON.stringify(text.length > 40 ? `${text.slice(0, 40)}…` : text);

describe("the shared fixture", () => {
  it("has the cases both sides are tested on", () => {
    expect(fixture.work_paths.length).toBeGreaterThan(300);
    expect(fixture.work_paths.filter((c) => c.valid).length).toBeGreaterThan(50);
    expect(fixture.work_paths.filter((c) => !c.valid).length).toBeGreaterThan(50);
    expect(fixture.requests.filter((c) => !c.valid).length).toBeGreaterThan(20);
    // The daemon's side places each work path beside this script: no case may be it or hold it.
    expect(
      fixture.work_paths.filter(
        (c) => c.path === "fixture-script.py" || "fixture-script.py".startsWith(`${c.path}/`),
      ),
    ).toEqual([]);
  });

  it("every work path gets the daemon's verdict from the module and from every schema that takes a path", () => {
    const limits = loadConfig({}).executionLimits;
    const execution = executionRequestSchema(limits);
    const runCode = runCodeArguments(limits);
    for (const { path, valid } of fixture.work_paths) {
      expect(workPathProblem(path) === undefined, `workPathProblem(${shown(path)})`).toBe(valid);
      const files = [{ path, content: "" }];
      expect(
        execution.safeParse({ template: "python", code: "", files }).success,
        `executions' files: ${shown(path)}`,
      ).toBe(valid);
      expect(
        runCode.safeParse({ language: "python", code: "", files }).success,
        `run_code's files: ${shown(path)}`,
      ).toBe(valid);
    }
  });

  it("every file list gets the daemon's verdict beside its script", () => {
    for (const { argv0, files, valid, why } of fixture.requests) {
      expect(filesProblems(files, argv0).length === 0, why).toBe(valid);
      const base64 = files.filter((f) => f.encoding === "base64");
      if (base64.length === 1 && files.length === 1)
        expect(isStrictBase64(base64[0]!.content), why).toBe(valid);
    }
  });
});

/** Answers every execution at once; templates python (python) and node (javascript, typescript). */
class InstantRuntime implements ExecutionRuntime {
  readonly requests: ExecutionRequest[] = [];
  async execute(request: ExecutionRequest): Promise<ExecutionResult> {
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
      {
        name: "node",
        language: "node",
        languages: ["javascript", "typescript"],
        contentHash: "beef",
        ready: true,
      },
    ];
  }
}

describe("file paths through the API", () => {
  let gw: TestGateway;
  let runtime: InstantRuntime;
  let key: string;
  beforeAll(async () => {
    runtime = new InstantRuntime();
    gw = await startTestGateway("pglite", { runtime });
    ({ key } = await gw.issue({ credits: 1_000_000 }));
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  async function refused(response: Response, what: string): Promise<Record<string, unknown>> {
    const problem = await expectProblem(response, 422, "validation-failed").catch(
      (error: Error) => {
        throw new Error(`${what}: ${error.message}`);
      },
    );
    expect(problem.retryable, what).toBe(false);
    return problem;
  }

  it("POST /v1/executions refuses, with a 422, every file list the daemon would refuse, and runs the others", async () => {
    for (const { argv0, files, valid, why } of fixture.requests) {
      const template = argv0 === "main.py" ? "python" : "node";
      const sent = runtime.requests.length;
      const response = await gw.call("POST", "/v1/executions", {
        credential: key,
        body: { template, language: LANGUAGE_OF[argv0], code: "", files },
      });
      if (valid) {
        expect(response.status, `${why}: ${await response.clone().text()}`).toBe(200);
        expect(runtime.requests.length).toBe(sent + 1);
      } else {
        await refused(response, why);
        expect(runtime.requests.length, why).toBe(sent);
      }
    }
  });

  it("the script a file collides with is the one the language names, the template's first by default", async () => {
    const run = (body: Record<string, unknown>) =>
      gw.call("POST", "/v1/executions", { credential: key, body: { code: "", ...body } });
    const problem = await refused(
      await run({ template: "node", files: [{ path: "main.js", content: "" }] }),
      "node's default script",
    );
    expect(problem.errors).toEqual([{ path: "files.0.path", message: "is the script's path" }]);
    await refused(
      await run({ template: "python", files: [{ path: "main.py/x", content: "" }] }),
      "inside python's script",
    );
    expect(
      (
        await run({
          template: "node",
          language: "typescript",
          files: [{ path: "main.js", content: "" }],
        })
      ).status,
    ).toBe(200);
  });

  it("a session file's path is decoded once and checked by the daemon's rules before any session is looked up", async () => {
    const file = (path: string) => `/v1/sessions/${randomUUID()}/files/${path}`;
    for (const raw of [
      "%ff",
      "%",
      "%E0%A4%A",
      "%00",
      "a/%00",
      "%C0%AF",
      "a%2F%2Fb",
      "a%2F..%2Fb",
      "dir%2F",
      `${"a".repeat(256)}`,
      "%2Fetc",
    ]) {
      for (const method of ["PUT", "GET", "DELETE"]) {
        await refused(
          await gw.call(method, file(raw), {
            credential: key,
            ...(method === "PUT" ? { rawBody: "x" } : {}),
          }),
          `${method} ${raw}`,
        );
      }
    }
    // Once, not twice: %252e is the file "%2e", and %2F a slash inside the path.
    for (const raw of ["%252e", "%252e%252e/x", "a%2Fb", "%E2%82%AC", "a/b"]) {
      await expectProblem(
        await gw.call("PUT", file(raw), { credential: key, rawBody: "x" }),
        404,
        "not-found",
      );
    }
    for (const { path, valid } of fixture.work_paths) {
      // A URL whose path is a '.' or '..' segment is resolved before any route sees it; "" names no file.
      if (path === "" || path === "." || path === "..") continue;
      const response = await gw.call("PUT", file(encodeURIComponent(path)), {
        credential: key,
        rawBody: "x",
      });
      if (valid) await expectProblem(response, 404, "not-found");
      else await refused(response, `PUT ${shown(path)}`);
    }
  });
});
