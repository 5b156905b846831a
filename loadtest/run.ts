// `npm run loadtest -- [--requests N] [--concurrency C] [--max-seconds S]`
// Starts the gateway and a plain Hono "hello" app in a child process (loopback only), then measures
// each scenario in turn from this process and prints p50/p95/p99 and throughput side by side.
// The execute scenario runs only when the gateway has a runtime. servers.ts starts it without one
// (no daemon, and no /dev/kvm here), so it is probed once, answers 503 and is reported as not run;
// execute.k6.ts measures it against a gateway started with `npm start`.
import { spawn } from "node:child_process";
import { Agent, request as httpRequest } from "node:http";
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
// node:http with a keep-alive pool: a lighter client than fetch, so the figures are the servers'.
const agent = new Agent({ keepAlive: true, maxSockets: concurrency });

interface Call {
  method: "GET" | "POST";
  url: string;
  headers?: Record<string, string>;
  body?: string;
}

/** One request; the body is read in full so the connection is reused. Resolves to the status. */
function call(c: Call): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(c.url, { method: c.method, headers: c.headers, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(c.body);
  });
}

const json = { ...auth, "content-type": "application/json" };
const scenarios: { name: string; call: Call; expect: number }[] = [
  { name: "hello (plain Hono)", call: { method: "GET", url: `${servers.helloUrl}/hello` }, expect: 200 },
  { name: "GET /healthz", call: { method: "GET", url: `${servers.gatewayUrl}/healthz` }, expect: 200 },
  { name: "GET /v1/usage (key auth + DB)", call: { method: "GET", url: `${servers.gatewayUrl}/v1/usage`, headers: auth }, expect: 200 },
  {
    name: "POST /v1/tokens (key auth + EdDSA)",
    call: { method: "POST", url: `${servers.gatewayUrl}/v1/tokens`, headers: json, body: JSON.stringify({ ttl_seconds: 60, max_executions: 1 }) },
    expect: 201,
  },
];
const execute: Call = {
  method: "POST",
  url: `${servers.gatewayUrl}/v1/executions`,
  headers: json,
  body: JSON.stringify({ template: "python", code: "print(sum(range(1000)))" }),
};

try {
  const results: ScenarioSummary[] = [];
  const sender = (c: Call, status: number) => async () => (await call(c)).status === status;
  // Warm every path (and the client) first, then measure each in turn.
  for (const s of scenarios) await drive({ scenario: s.name, requests: Math.min(300, requests), concurrency, maxDurationMs, send: sender(s.call, s.expect) });
  for (const s of scenarios) results.push(await drive({ scenario: s.name, requests, concurrency, maxDurationMs, send: sender(s.call, s.expect) }));
  const probe = await call(execute);
  let executeNote: string;
  if (probe.status === 503) {
    const type = (JSON.parse(probe.body) as { type?: string }).type;
    executeNote = `POST /v1/executions: not measured: the gateway answers 503 (${type}); no runtime is connected yet`;
  } else {
    results.push(await drive({ scenario: "POST /v1/executions", requests, concurrency, maxDurationMs, send: sender(execute, 200) }));
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
  agent.destroy();
  stopChild();
}
