// The Python client (clients/python) against a real gateway: the gateway on PGlite serving on a
// loopback port, the REAL supervised daemon with the python template (sessions kept), and the
// client's unittest suite run by /usr/bin/python3.11 with the gateway's URL and two keys (one
// with credits, one of an account without). Every test of the suite must run and pass: none
// skipped. Its waits scale with SANDFORK_TEST_TIME_SCALE.
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, expect, it } from "vitest";
import { timeScale } from "../../gateway/testing/kvm-tier.js";
import { type ServedGateway, startServedGateway } from "../../gateway/testing/served-gateway.js";

const CLIENT_DIR = fileURLToPath(new URL(".", import.meta.url));
/** The interpreter the client is tested with: Debian's, never whatever `python3` PATH finds. */
const PYTHON = "/usr/bin/python3.11";
/** Tests in tests/test_client.py. */
const PYTHON_TESTS = 11;
const SUITE_TIMEOUT_MS = 180_000 * timeScale;

let served: ServedGateway;

beforeAll(async () => {
  served = await startServedGateway();
});

afterAll(async () => {
  await served?.dispose();
});

/** Runs `args` under PYTHON in the client's folder; killed past `timeoutMs`. */
function python(
  args: string[],
  env: Record<string, string>,
  timeoutMs: number,
): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(PYTHON, args, {
      cwd: CLIENT_DIR,
      env: {
        PATH: process.env.PATH ?? "",
        PYTHONPATH: CLIENT_DIR,
        PYTHONDONTWRITEBYTECODE: "1",
        ...env,
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    child.stdout.on("data", (chunk: Buffer) => {
      output += chunk.toString("utf8");
    });
    child.stderr.on("data", (chunk: Buffer) => {
      output += chunk.toString("utf8");
    });
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("error", (error) => {
      clearTimeout(timer);
      reject(error);
    });
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
  });
}

it(
  "the client's unittest suite passes against the gateway, every test run",
  async () => {
    const { key } = await served.gw.issue({
      scopes: ["execute", "usage:read", "templates"],
      credits: 1_000_000,
    });
    const poor = await served.gw.issue();
    const { code, output } = await python(
      ["-m", "unittest", "discover", "-s", "tests", "-v"],
      {
        SANDFORK_URL: served.url,
        SANDFORK_API_KEY: key,
        SANDFORK_POOR_API_KEY: poor.key,
        SANDFORK_TEST_TIME_SCALE: String(timeScale),
      },
      SUITE_TIMEOUT_MS,
    );
    expect(code, output).toBe(0);
    expect(output).toContain(`Ran ${PYTHON_TESTS} tests`);
    expect(output).toMatch(/\nOK\n/);
    expect(output).not.toMatch(/skipped|expected failure/);
  },
  SUITE_TIMEOUT_MS + 10_000,
);
