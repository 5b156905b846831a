import { describe, expect, it, vi } from "vitest";
import { commandLine } from "./command-line.js";

const USAGE = "npm run tool -- [--count N]";
const OPTIONS = {
  count: { type: "string", default: "1" },
  json: { type: "boolean", default: false },
} as const;

/** Runs commandLine with process.exit and the output streams caught: what it exited with and printed. */
function run(args: string[]): {
  exitCode: number | undefined;
  stdout: string;
  stderr: string;
  values?: unknown;
} {
  const out = { stdout: "", stderr: "" };
  vi.spyOn(process.stdout, "write").mockImplementation((chunk) => {
    out.stdout += String(chunk);
    return true;
  });
  vi.spyOn(process.stderr, "write").mockImplementation((chunk) => {
    out.stderr += String(chunk);
    return true;
  });
  vi.spyOn(process, "exit").mockImplementation((code) => {
    throw Object.assign(new Error("exit"), { exitCode: code });
  });
  try {
    const { values } = commandLine(USAGE, OPTIONS, args);
    return { exitCode: undefined, ...out, values };
  } catch (error) {
    return { exitCode: (error as { exitCode: number }).exitCode, ...out };
  } finally {
    vi.restoreAllMocks();
  }
}

describe("commandLine", () => {
  it("parses the flags, with their defaults", () => {
    expect(run(["--count", "3"])).toMatchObject({
      exitCode: undefined,
      values: { count: "3", json: false },
    });
    expect(run([])).toMatchObject({ exitCode: undefined, values: { count: "1", json: false } });
  });

  it("prints the usage for --help and -h and exits 0", () => {
    for (const flag of ["--help", "-h"])
      expect(run([flag])).toMatchObject({ exitCode: 0, stdout: `usage: ${USAGE}\n`, stderr: "" });
  });

  it("refuses an unknown flag or a missing value with what is wrong and the usage, exit status 2", () => {
    const unknown = run(["--bogus"]);
    expect(unknown).toMatchObject({ exitCode: 2, stdout: "" });
    expect(unknown.stderr).toContain("'--bogus'");
    expect(unknown.stderr).toContain(`usage: ${USAGE}`);
    expect(run(["--count"])).toMatchObject({ exitCode: 2 });
  });
});
