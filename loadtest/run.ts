// `npm run loadtest -- [--requests N] [--concurrency C] [--max-seconds S]`
// Starts the gateway and a plain Hono "hello" app in a child process (loopback only), then measures
// each scenario in turn from this process and prints p50/p95/p99 and throughput side by side.
// The execute scenario runs only when the gateway has a runtime; until the daemon exists it is
// probed once and reported as not run.
import { spawn } from "node:child_process";
import { cpus, loadavg } from "node:os";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { drive, formatTable, type ScenarioSummary } from "./lib/measure.js";

const { values } = parseArgs({
  options: {
    requests: { type: "string", default: "3000" },
    concurrency: { type: "string", default: "16" },
    "max-seconds": { type: "string", default: "20" },
  },
});
const requests = Number(values.requests);
const concurrency = Number(values.concurrency);
const maxDurationMs = Number(values["max-seconds"]) * 1000;
for (const [name, n] of [["requests", requests], ["concurrency", concurrency], ["max-seconds", maxDurationMs]] as const) {
  if (!Number.isSafeInteger(n) || n <= 0) throw new Error(`--${name} must be a positive integer`);
}

interface Servers {
  gatewayUrl: string;
  helloUrl: string;
  key: string;
}

const child = spawn(process.execPath, ["--import", "tsx", fileURLToPath(new URL("./servers.ts", import.meta.url))], {
  stdio: ["ignore", "pipe", "inherit"],
  env: process.env,
});
const stopChild = () => {
  if (child.exitCode === null) child.kill("SIGTERM");
};
process.on("exit", stopChild);

const servers = await new Promise<Servers>((resolve, reject) => {
  const lines = createInterface({ input: child.stdout });
  lines.once("line", (line) => resolve(JSON.parse(line) as Servers));
  child.once("exit", (code) => reject(new Error(`load-test servers exited early (code ${code})`)));
});

const auth = { authorization: `Bearer ${servers.key}` };
/** One request; the body is read in full so the connection is reused, as a real client would. */
async function answers(url: string, status: number, init?: RequestInit): Promise<boolean> {
  const response = await fetch(url, init);
  await response.arrayBuffer();
  return response.status === status;
}
const scenarios: { name: string; send: () => Promise<boolean> }[] = [
  { name: "hello (plain Hono)", send: () => answers(`${servers.helloUrl}/hello`, 200) },
  { name: "GET /healthz", send: () => answers(`${servers.gatewayUrl}/healthz`, 200) },
  { name: "GET /v1/usage (key auth + DB)", send: () => answers(`${servers.gatewayUrl}/v1/usage`, 200, { headers: auth }) },
  {
    name: "POST /v1/tokens (key auth + EdDSA)",
    send: () =>
      answers(`${servers.gatewayUrl}/v1/tokens`, 201, {
        method: "POST",
        headers: { ...auth, "content-type": "application/json" },
        body: JSON.stringify({ ttl_seconds: 60, max_executions: 1 }),
      }),
  },
];

const executeInit: RequestInit = {
  method: "POST",
  headers: { ...auth, "content-type": "application/json" },
  body: JSON.stringify({ template: "python", code: "print(sum(range(1000)))" }),
};

try {
  const results: ScenarioSummary[] = [];
  for (const scenario of scenarios) {
    const { name, send } = scenario;
    await drive({ scenario: name, requests: Math.min(200, requests), concurrency, maxDurationMs, send }); // warm-up
    results.push(await drive({ scenario: name, requests, concurrency, maxDurationMs, send }));
  }
  const probe = await fetch(`${servers.gatewayUrl}/v1/executions`, executeInit);
  const probeBody = (await probe.json()) as { type?: string };
  let executeNote: string;
  if (probe.status === 503) {
    executeNote = `POST /v1/executions: not measured: the gateway answers 503 (${probeBody.type}); no runtime is connected yet`;
  } else {
    const send = () => answers(`${servers.gatewayUrl}/v1/executions`, 200, executeInit);
    results.push(await drive({ scenario: "POST /v1/executions", requests, concurrency, maxDurationMs, send }));
    executeNote = "POST /v1/executions: measured above";
  }
  console.log(`\n${requests} requests per scenario (bounded to ${maxDurationMs / 1000} s), ${concurrency} concurrent, loopback, keep-alive`);
  // Client and servers share this machine: its load says how far the figures can be trusted.
  console.log(`${cpus().length} CPUs, load average ${loadavg().map((l) => l.toFixed(2)).join(" ")}\n`);
  console.log(formatTable(results));
  console.log(`\n${executeNote}`);
  const hello = results[0];
  if (hello) {
    for (const r of results.slice(1)) {
      console.log(`${r.scenario}: p50 ${(r.p50Ms / hello.p50Ms).toFixed(1)}× the plain Hono baseline, ${((r.requestsPerSecond / hello.requestsPerSecond) * 100).toFixed(0)}% of its throughput`);
    }
  }
} finally {
  stopChild();
}
