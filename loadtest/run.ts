// `npm run loadtest` (flags: `-- --help`). Measures POST /v1/executions for real: the gateway as
// `npm start` runs it (gateway/main.ts in a child process, the real `sandfork-vmm serve`
// supervised under it on the python template that `npm run build` put in .sandfork/templates), on
// each database in turn, at each concurrency. Per run: p50/p99, executions/s and the gateway
// process's own CPU per execution (from /proc/<pid>/stat; the daemon is another process).
//
// Baselines come from the same minutes, in blocks alternating with the gateway's so that a shared
// machine's slow minutes fall on both: the daemon alone (the same executions sent straight to its
// socket with the runtime client, no HTTP, no billing), a plain Hono "hello" app, the runtime
// client's and a plain Hono server's CPU (CpuBaselines), and at concurrency 1 two floors: the
// daemon's run followed by a plain Hono request (what answering over HTTP adds on its own) and,
// on PostgreSQL, by its record committed on that server (lib/record-baseline.ts: what billing
// before the answer adds on its own).
//
// Each gateway is first warmed up (--warm-up): V8 keeps optimizing the request path for thousands
// of calls, and until then an execution costs more CPU than in steady state. "auto" serves blocks
// of 1000 at concurrency 1 until two blocks in a row are no longer 5% below the best before them
// (at least 6 blocks, at most 20); N serves exactly N; then 200 at the peak concurrency.
// --cpu-prof DIR writes the gateway processes' `node --cpu-prof` profiles into DIR (profiling
// costs CPU too: measure figures without it). Loopback only; every scenario is bounded in
// requests and seconds.
//
// PostgreSQL: a fresh database on the server named by DATABASE_URL or TEST_DATABASE_URL, or on a
// private one with fsync on (lib/postgres-server.ts); the run prints the server's fsync and
// synchronous_commit, since a commit that waits for the disk is part of an execution's cost.
//
// --overload measures something else instead (lib/overload.ts): on each database, the share of
// calls answered with their true status or shed with 429/503 at 4x the concurrency the machine
// sustains with a CPU hog beside it, the p99 of the shed answers, and executions/s of the rest
// against the same run's unloaded figure; --overload-seconds long each. --gateway-nice=N (default
// -10, 0: unset) is the gateway's SANDFORK_GATEWAY_NICE and --gateway-realtime=N (default 1, 0:
// unset) its SANDFORK_GATEWAY_REALTIME_PRIORITY; the measuring client and the floor's server run
// at the same.
//
// `--json` prints one object that `npm run bench:report` turns into docs/benchmarks.md's table.
import { cpus, loadavg } from "node:os";
import { setTimeout as pauseFor } from "node:timers/promises";
import { commandLine } from "../gateway/cli/command-line.js";
import { daemonRequest, EXECUTION, EXECUTION_BODY } from "./lib/execution.js";
import { parseGaps } from "./lib/gap-schedule.js";
import { type HelloServer, startHello } from "./lib/hello.js";
import { keepAliveClient } from "./lib/http-client.js";
import { GAP_REQUESTS, GAP_WARM_UP, gapTable, measureGaps } from "./lib/idle-gaps.js";
import {
  type LoadDatabase,
  onEachDatabase,
  parseDatabases,
  withLoadGateway,
} from "./lib/load-gateway.js";
import {
  cpuOverBlocks,
  drive,
  driveInTurn,
  formatTable,
  processCpuMs,
  round,
  type ScenarioSummary,
} from "./lib/measure.js";
import { overload, overloadTable } from "./lib/overload.js";
import { startSpanReceiver } from "./lib/phases.js";
import { openRecordBaseline } from "./lib/record-baseline.js";

const { values, fail } = commandLine(
  "npm run loadtest -- [--requests N] [--concurrency 1,4,16] [--databases pglite,postgres] [--warm-up N|auto] [--max-seconds S] [--json] [--cpu-prof DIR] | --gap-ms 0,15,100,1000 [--requests N] [--databases ...] [--json] | --overload [--databases ...] [--overload-seconds S] [--gateway-nice=N] [--gateway-realtime=N] [--json]",
  {
    overload: { type: "boolean", default: false },
    "gap-ms": { type: "string" },
    "overload-seconds": { type: "string", default: "20" },
    "gateway-nice": { type: "string", default: "-10" },
    "gateway-realtime": { type: "string", default: "1" },
    requests: { type: "string" },
    concurrency: { type: "string", default: "1,4,16" },
    databases: { type: "string", default: "pglite,postgres" },
    "max-seconds": { type: "string", default: "10" },
    "warm-up": { type: "string", default: "auto" },
    json: { type: "boolean", default: false },
    "cpu-prof": { type: "string" },
  },
);
const requests = Number(values.requests ?? (values["gap-ms"] === undefined ? 1000 : GAP_REQUESTS));
const warmUp = values["warm-up"] === "auto" ? "auto" : Number(values["warm-up"]);
const maxDurationMs = Number(values["max-seconds"]) * 1000;
const concurrencies = values.concurrency.split(",").map(Number);
if (warmUp !== "auto" && (!Number.isSafeInteger(warmUp) || warmUp < 0))
  fail("--warm-up must be auto or a non-negative integer");
for (const [name, n] of [
  ["requests", requests],
  ["max-seconds", maxDurationMs],
  ...concurrencies.map((c) => ["concurrency", c] as const),
] as const) {
  if (!Number.isSafeInteger(n) || n <= 0)
    fail(`--${name} must be a positive integer (or a list of them)`);
}
const databases = parseDatabases(values.databases, fail);
const peakConcurrency = Math.max(...concurrencies);
const say = values.json
  ? (line: string) => process.stderr.write(`${line}\n`)
  : (line: string) => console.log(line);

if (values.overload) {
  const seconds = Number(values["overload-seconds"]);
  if (!Number.isSafeInteger(seconds) || seconds <= 0)
    fail("--overload-seconds must be a positive integer");
  const gatewayNice = Number(values["gateway-nice"]);
  if (!Number.isInteger(gatewayNice) || gatewayNice < -20 || gatewayNice > 19)
    fail("--gateway-nice must be an integer from -20 to 19");
  const gatewayRealtime = Number(values["gateway-realtime"]);
  if (!Number.isInteger(gatewayRealtime) || gatewayRealtime < 0 || gatewayRealtime > 99)
    fail("--gateway-realtime must be an integer from 0 to 99");
  const priority = { nice: gatewayNice, realtime: gatewayRealtime };
  const { runs } = await onEachDatabase(databases, "sandfork_loadtest_overload", (database, url) =>
    overload({ database, databaseUrl: url, seconds, priority, say }),
  );
  const reports = Object.values(runs);
  if (values.json) console.log(JSON.stringify(reports));
  else
    for (const report of reports) {
      console.log(
        `\nnpm run loadtest -- --overload --databases ${report.database} --overload-seconds ${seconds} --gateway-nice=${gatewayNice} --gateway-realtime=${gatewayRealtime}: ${report.cpus} CPUs, ${report.database === "pglite" ? "PGlite" : "PostgreSQL"}, load average ${report.loadavg_before.join(", ")} before; one in ten runs past its 200 ms time limit (true status timed_out), the rest print(6*7)`,
      );
      console.log(overloadTable(report));
      if (report.wrong_examples.length > 0)
        console.log(`wrong answers, e.g.:\n  ${report.wrong_examples.join("\n  ")}`);
    }
  const wrong = (r: (typeof reports)[number]) =>
    r.unloaded.wrong +
    r.overloaded.wrong +
    r.overloaded_ignoring_retry_after.wrong +
    r.shed_floor.wrong;
  if (reports.some((r) => wrong(r) > 0)) process.exitCode = 1;
  process.exit();
}

if (values["gap-ms"] !== undefined) {
  const gapsMs = parseGaps(values["gap-ms"], fail);
  const gapClient = keepAliveClient(1);
  const receiver = await startSpanReceiver();
  try {
    const { runs, postgresDurability } = await onEachDatabase(
      databases,
      "sandfork_loadtest_gaps",
      (database, databaseUrl) =>
        measureGaps({
          call: gapClient.call,
          database,
          databaseUrl,
          receiver,
          gapsMs,
          requests,
          warmUp: warmUp === "auto" ? GAP_WARM_UP : warmUp,
          say,
        }),
    );
    const report = {
      gaps: runs,
      postgres_durability: postgresDurability ?? null,
      execution: EXECUTION,
      machine: { cpus: cpus().length, loadavg: loadavg().map((l) => Number(l.toFixed(2))) },
    };
    if (values.json) console.log(JSON.stringify(report));
    else {
      console.log(
        `\n${report.machine.cpus} CPUs, load average ${report.machine.loadavg.join(" ")}`,
      );
      for (const [database, figures] of Object.entries(runs))
        console.log(`\n${gapTable(database, figures)}`);
    }
  } finally {
    gapClient.destroy();
    await receiver.close();
  }
  process.exit();
}

const client = keepAliveClient(peakConcurrency);
const { call } = client;

/** utime + stime of this process in ms. */
function ownCpuMs(): number {
  const usage = process.cpuUsage();
  return (usage.user + usage.system) / 1000;
}

interface ExecutionFigures {
  p50_ms: number;
  p99_ms: number;
  per_s: number;
  gateway_cpu_ms_per_exec: number;
  requests: number;
  failed: number;
}

interface LatencyFigures {
  p50_ms: number;
  p99_ms: number;
  per_s: number;
  requests: number;
  failed: number;
}

const latencyFigures = (s: ScenarioSummary): LatencyFigures => ({
  p50_ms: round(s.p50Ms),
  p99_ms: round(s.p99Ms),
  per_s: round(s.requestsPerSecond, 1),
  requests: s.requests,
  failed: s.failures,
});

/**
 * What a gateway's CPU per execution at concurrency 1 is read against, measured beside it: the
 * runtime client alone (this process's CPU over the daemon-alone blocks: the same request sent
 * straight to the daemon, no HTTP, no billing), and a plain Hono server's CPU per request back to
 * back, after an idle pause of 1 ms, and with one VM execution before each request. Every gateway
 * request at concurrency 1 follows a VM's run, during which the gateway waits idle: the pause
 * tells how much of what that costs the next request is the idle wait alone (on a virtual
 * machine an idle vCPU gives its core away, and comes back to cold caches).
 */
interface CpuBaselines {
  runtime_client_ms_per_exec: Record<string, number>;
  hello_ms_per_req: {
    back_to_back: number;
    after_an_idle_pause: number;
    after_an_execution: number;
  };
}

interface DatabaseRun {
  /** Without an Idempotency-Key, at each concurrency. */
  executions: Record<string, ExecutionFigures>;
  /** With a unique Idempotency-Key each, at 1 and the peak concurrency. */
  keyed: Record<string, ExecutionFigures>;
  /** Gateway CPU ms per execution of each warm-up block at c=1 (--warm-up auto). */
  warmUpBlocks: number[];
  daemon: Record<string, LatencyFigures>;
  /**
   * Concurrency 1, the daemon's run then a plain Hono request, and on PostgreSQL the daemon's run
   * then its record committed on the server (lib/record-baseline.ts), in the gateway's blocks
   * (unless --concurrency leaves 1 out: then the first in the plain Hono server's).
   */
  floors: { then_a_plain_request: LatencyFigures; then_its_record: LatencyFigures | null };
  baselines: CpuBaselines;
  scenarios: ScenarioSummary[];
}

const WARM_UP_BLOCK = 1000;
/** Blocks of executions through the gateway, each after a block of the daemon alone. */
const ALTERNATING_ROUNDS = 5;
/** The plain Hono baseline's idle pause before a request: about a VM execution's wait at c=1 (a timer's 1 ms). */
const IDLE_PAUSE_MS = 1;

/** --warm-up at concurrency 1: N executions, or blocks of them until the gateway's CPU per execution settles. */
async function warmUpAtOne(
  pid: number,
  execute: () => Promise<boolean>,
): Promise<{ requests: number; failures: number; blocks: number[] }> {
  const maxDurationMs = Math.max(Number(values["max-seconds"]) * 1000, 60_000);
  if (warmUp !== "auto")
    return {
      ...(await drive({
        scenario: "warm-up, c=1",
        requests: warmUp,
        concurrency: 1,
        maxDurationMs,
        send: execute,
      })),
      blocks: [],
    };
  const total = { requests: 0, failures: 0 };
  const blocks: number[] = [];
  for (let block = 0; block < 20; block++) {
    const before = processCpuMs(pid);
    const s = await drive({
      scenario: `warm-up block ${block + 1}, c=1`,
      requests: WARM_UP_BLOCK,
      concurrency: 1,
      maxDurationMs,
      send: execute,
    });
    total.requests += s.requests;
    total.failures += s.failures;
    if (s.failures > 0) break;
    blocks.push((processCpuMs(pid) - before) / Math.max(1, s.requests));
    // Settled: neither of the last two blocks came 5% below the best one before them (one such
    // block alone is often the machine's noise, not the end of the JIT's work).
    const best = Math.min(...blocks.slice(0, -2));
    // At least 6: the request path settles after some thousands of executions at concurrency 1,
    // and on a noisy minute a shorter warm-up can stop well above the steady figure.
    if (blocks.length >= 6 && blocks.slice(-2).every((b) => b > 0.95 * best)) break;
  }
  say(
    `  warm-up at c=1: ${total.requests} executions; gateway CPU ms/exec by block of ${WARM_UP_BLOCK}: ${blocks.map((b) => b.toFixed(2)).join(", ")}`,
  );
  return { ...total, blocks: blocks.map((b) => round(b, 3)) };
}

/** The gateway on one database: executions at each concurrency, the daemon alone, other routes. */
async function measureDatabase(
  database: LoadDatabase,
  databaseUrl: string | undefined,
  hello: HelloServer,
): Promise<DatabaseRun> {
  say(`${database}: starting the gateway and its daemon`);
  const profileDir = values["cpu-prof"];
  const nodeArgs = profileDir === undefined ? [] : ["--cpu-prof", `--cpu-prof-dir=${profileDir}`];
  return withLoadGateway(
    call,
    { databaseUrl, nodeArgs },
    async ({ gateway, daemon, auth, key, json }) => {
      let sequence = 0;
      const executeWith = async (headers: Record<string, string>) => {
        const r = await call("POST", `${gateway.url}/v1/executions`, headers, EXECUTION_BODY);
        return r.status === 200 && r.body.includes('"status":"completed"');
      };
      // As the typed client and the agent tools send by default: no Idempotency-Key (the execution
      // holds credits of the gateway's lease and is billed with one statement, db/leases.ts).
      const execute = () => executeWith(json);
      // A unique Idempotency-Key per request, as a retrying client sends (and as execute.k6.ts does):
      // on PostgreSQL reserved in the database before it runs, settled after; on PGlite its key is
      // claimed in memory and looked up once, then it is billed as a keyless one is.
      const executeKeyed = () => executeWith({ ...json, "idempotency-key": `lt-${sequence++}` });
      const bounded = (
        scenario: string,
        concurrency: number,
        send: () => Promise<boolean>,
        count = requests,
      ) => drive({ scenario, requests: count, concurrency, maxDurationMs, send });

      const daemonExecute = async () =>
        (await daemon.execute(daemonRequest(), AbortSignal.timeout(30_000))).outcome ===
        "completed";
      const daemonRuns: Record<string, LatencyFigures> = {};

      // The peak's shapes first (group commit's batches), then concurrency 1 until it settles, so
      // that what the JIT does for the batches is not in the first measured run.
      let alternate = 0;
      const warmPeak = await bounded(
        "warm-up",
        peakConcurrency,
        () => (alternate++ % 2 === 0 ? execute() : executeKeyed()),
        Math.min(requests, 200),
      );
      const warmOne = await warmUpAtOne(gateway.pid, execute);
      const warm = {
        requests: warmOne.requests + warmPeak.requests,
        failures: warmOne.failures + warmPeak.failures,
      };
      if (warm.failures > 0) {
        const probe = await call("POST", `${gateway.url}/v1/executions`, json, EXECUTION_BODY);
        throw new Error(
          `warm-up: ${warm.failures} of ${warm.requests} executions failed; one answers ${probe.status} ${probe.body}`,
        );
      }

      const scenarios: ScenarioSummary[] = [];
      const figuresOf = (s: ScenarioSummary, cpuMs: number): ExecutionFigures => ({
        ...latencyFigures(s),
        gateway_cpu_ms_per_exec: round(cpuMs / Math.max(1, s.requests), 3),
      });
      const executions: Record<string, ExecutionFigures> = {};
      const runtimeClientMsPerExec: Record<string, number> = {};
      const alternating = (
        scenario: string,
        concurrency: number,
        send: () => Promise<boolean>,
      ) => ({
        scenario,
        requests,
        concurrency,
        maxDurationMs: maxDurationMs / ALTERNATING_ROUNDS,
        send,
      });
      // The plain Hono server's CPU per request at c=1: back to back, after an idle pause, after an execution.
      const sendHello = async () => (await call("GET", `${hello.url}/hello`)).status === 200;
      const helloCpu = () => cpuOverBlocks(() => processCpuMs(hello.pid));
      const [backToBack, afterAnIdlePause, afterAnExecution] = [helloCpu(), helloCpu(), helloCpu()];
      const sendHelloAfterIdle = async () => {
        await pauseFor(IDLE_PAUSE_MS);
        return sendHello();
      };
      const sendHelloAfterExecution = async () => (await daemonExecute()) && (await sendHello());
      const helloAfterAnExecution = {
        options: alternating("daemon then a plain Hono request, c=1", 1, sendHelloAfterExecution),
        around: afterAnExecution.wrap,
      };
      // At concurrency 1, in the same blocks as the gateway and the daemon alone: the daemon then a
      // plain Hono request (what an HTTP exchange adds to a VM's run), and on PostgreSQL the daemon
      // then its record committed on the server (what billing before the answer adds there).
      const recordBaseline =
        databaseUrl !== undefined && concurrencies.includes(1)
          ? await openRecordBaseline(databaseUrl, key, {
              executions: requests,
              template: EXECUTION.template,
              timeoutMs: daemonRequest().timeoutMs,
            })
          : undefined;
      let thenHello: ScenarioSummary | undefined;
      let thenRecord: ScenarioSummary | undefined;
      try {
        const executeThenRecord = async () => {
          const request = daemonRequest();
          const sent = performance.now();
          const result = await daemon.execute(request, AbortSignal.timeout(30_000));
          await recordBaseline?.record(request, result, performance.now() - sent);
          return result.outcome === "completed";
        };
        // Keyless, in blocks alternating with the daemon alone at the same concurrency (its baseline).
        for (const c of concurrencies) {
          const gatewayCpu = cpuOverBlocks(() => processCpuMs(gateway.pid));
          const clientCpu = cpuOverBlocks(ownCpuMs);
          const floorSides =
            c !== 1
              ? []
              : [
                  helloAfterAnExecution,
                  ...(recordBaseline === undefined
                    ? []
                    : [
                        {
                          options: alternating(
                            `daemon then its record (${database}), c=1`,
                            1,
                            executeThenRecord,
                          ),
                        },
                      ]),
                ];
          const [baseline, subject, ...floorRuns] = await driveInTurn(
            [
              {
                options: alternating(`daemon alone, c=${c}`, c, daemonExecute),
                around: clientCpu.wrap,
              },
              {
                options: alternating(`POST /v1/executions (${database}), c=${c}`, c, execute),
                around: gatewayCpu.wrap,
              },
              ...floorSides,
            ],
            ALTERNATING_ROUNDS,
          );
          scenarios.push(subject, ...floorRuns);
          daemonRuns[c] = latencyFigures(baseline);
          executions[c] = figuresOf(subject, gatewayCpu.ms);
          runtimeClientMsPerExec[c] = round(clientCpu.ms / Math.max(1, baseline.requests), 3);
          if (c === 1) [thenHello, thenRecord] = floorRuns;
          say(
            `  keyless c=${c}: p50 ${subject.p50Ms.toFixed(2)} ms (the daemon alone ${baseline.p50Ms.toFixed(2)}), ${subject.requestsPerSecond.toFixed(0)}/s, gateway CPU ${executions[c].gateway_cpu_ms_per_exec} ms/exec (the runtime client alone ${runtimeClientMsPerExec[c]})`,
          );
        }
      } finally {
        await recordBaseline?.close();
      }
      const helloRuns = await driveInTurn(
        [
          {
            options: alternating("hello back to back, c=1", 1, sendHello),
            around: backToBack.wrap,
          },
          {
            options: alternating(
              `hello after ${IDLE_PAUSE_MS} ms idle, c=1`,
              1,
              sendHelloAfterIdle,
            ),
            around: afterAnIdlePause.wrap,
          },
          ...(thenHello === undefined ? [helloAfterAnExecution] : []),
        ],
        ALTERNATING_ROUNDS,
      );
      thenHello ??= helloRuns[2] as ScenarioSummary;
      scenarios.push(...helloRuns);
      const perRequest = (cpu: { ms: number }, run: ScenarioSummary) =>
        round(cpu.ms / Math.max(1, run.requests), 3);
      const helloMsPerReq = {
        back_to_back: perRequest(backToBack, helloRuns[0]),
        after_an_idle_pause: perRequest(afterAnIdlePause, helloRuns[1]),
        after_an_execution: perRequest(afterAnExecution, thenHello),
      };
      say(
        `  plain Hono at c=1: ${helloMsPerReq.back_to_back} ms CPU per request back to back, ${helloMsPerReq.after_an_idle_pause} after ${IDLE_PAUSE_MS} ms idle, ${helloMsPerReq.after_an_execution} after an execution each`,
      );
      // The reference for the HTTP p50 is the daemon's at concurrency 1.
      if (daemonRuns["1"] === undefined)
        daemonRuns["1"] = latencyFigures(await bounded("daemon alone, c=1", 1, daemonExecute));
      const keyed: Record<string, ExecutionFigures> = {};
      for (const c of [...new Set([1, peakConcurrency])]) {
        const cpuBefore = processCpuMs(gateway.pid);
        const s = await bounded(
          `POST /v1/executions + Idempotency-Key (${database}), c=${c}`,
          c,
          executeKeyed,
        );
        scenarios.push(s);
        keyed[c] = figuresOf(s, processCpuMs(gateway.pid) - cpuBefore);
        say(
          `  + Idempotency-Key c=${c}: p50 ${s.p50Ms.toFixed(2)} ms, ${s.requestsPerSecond.toFixed(0)}/s, gateway CPU ${keyed[c].gateway_cpu_ms_per_exec} ms/exec`,
        );
      }
      const answered = await call("POST", `${gateway.url}/v1/executions`, json, EXECUTION_BODY);
      if (answered.status !== 200)
        throw new Error(`an execution to look up answered ${answered.status} ${answered.body}`);
      const executionId = (JSON.parse(answered.body) as { id: string }).id;
      for (const [name, method, path, body, status] of [
        ["GET /healthz", "GET", "/healthz", undefined, 200],
        [
          "GET /v1/executions/{id} (key auth + DB)",
          "GET",
          `/v1/executions/${executionId}`,
          undefined,
          200,
        ],
        ["GET /v1/usage (key auth + DB)", "GET", "/v1/usage", undefined, 200],
        [
          "POST /v1/tokens (key auth + EdDSA)",
          "POST",
          "/v1/tokens",
          JSON.stringify({ ttl_seconds: 60, max_executions: 1 }),
          201,
        ],
      ] as const) {
        const send = async () =>
          (await call(method, `${gateway.url}${path}`, body === undefined ? auth : json, body))
            .status === status;
        scenarios.push(
          await bounded(`${name} (${database}), c=${peakConcurrency}`, peakConcurrency, send),
        );
      }
      const baselines = {
        runtime_client_ms_per_exec: runtimeClientMsPerExec,
        hello_ms_per_req: helloMsPerReq,
      };
      const floors = {
        then_a_plain_request: latencyFigures(thenHello),
        then_its_record: thenRecord === undefined ? null : latencyFigures(thenRecord),
      };
      return {
        executions,
        keyed,
        warmUpBlocks: warmOne.blocks,
        daemon: daemonRuns,
        floors,
        baselines,
        scenarios,
      };
    },
  );
}

/** Issue 9's goals, each met or not (null: not measured in this run), with the figure it was read from. */
interface Goal {
  met: boolean | null;
  figure: number | null;
}

/**
 * The gateway's goals on one database, read off its keyless executions: the gateway's CPU ≤ 1 ms per
 * execution at every concurrency measured (the figure: the highest), the p50 at concurrency 1 ≤
 * the daemon alone's (in the same blocks) + 1 ms (the figure: the difference), ≥ 500 executions/s
 * at concurrency 16.
 */
function goalsOf(run: DatabaseRun): {
  cpu_ms_per_exec_at_most_1: Goal;
  p50_over_daemon_at_1_at_most_1_ms: Goal;
  per_s_at_16_at_least_500: Goal;
} {
  const cpu = Math.max(...Object.values(run.executions).map((e) => e.gateway_cpu_ms_per_exec));
  const [atOne, daemonAtOne, atSixteen] = [
    run.executions["1"],
    run.daemon["1"],
    run.executions["16"],
  ];
  const over =
    atOne === undefined || daemonAtOne === undefined
      ? null
      : round(atOne.p50_ms - daemonAtOne.p50_ms);
  return {
    cpu_ms_per_exec_at_most_1: { met: cpu <= 1, figure: cpu },
    p50_over_daemon_at_1_at_most_1_ms: { met: over === null ? null : over <= 1, figure: over },
    per_s_at_16_at_least_500: {
      met: atSixteen === undefined ? null : atSixteen.per_s >= 500,
      figure: atSixteen?.per_s ?? null,
    },
  };
}

const hello = await startHello();
try {
  const helloRun = await drive({
    scenario: "hello (plain Hono)",
    requests: requests * 5,
    concurrency: peakConcurrency,
    maxDurationMs,
    send: async () => (await call("GET", `${hello.url}/hello`)).status === 200,
  });
  const { runs, postgresDurability } = await onEachDatabase(
    databases,
    "sandfork_loadtest",
    (database, databaseUrl) => measureDatabase(database, databaseUrl, hello),
  );
  const first = runs.pglite ?? runs.postgres;
  const daemonAtOne = first?.daemon["1"];
  const report = {
    executions: Object.fromEntries(Object.entries(runs).map(([d, r]) => [d, r.executions])),
    idempotent_executions: Object.fromEntries(Object.entries(runs).map(([d, r]) => [d, r.keyed])),
    daemon_p50_ms: daemonAtOne?.p50_ms ?? null,
    goals: Object.fromEntries(Object.entries(runs).map(([d, r]) => [d, goalsOf(r)])),
    daemon: Object.fromEntries(Object.entries(runs).map(([d, r]) => [d, r.daemon])),
    floors_at_1: Object.fromEntries(Object.entries(runs).map(([d, r]) => [d, r.floors])),
    warm_up_cpu_ms_per_exec: Object.fromEntries(
      Object.entries(runs).map(([d, r]) => [d, r.warmUpBlocks]),
    ),
    cpu_baselines: Object.fromEntries(Object.entries(runs).map(([d, r]) => [d, r.baselines])),
    hello_per_s: round(helloRun.requestsPerSecond, 0),
    hello_p50_ms: round(helloRun.p50Ms),
    postgres_durability: postgresDurability ?? null,
    execution: EXECUTION,
    // Client, gateway, daemon and VMs share this machine: its load says how far to trust the figures.
    machine: { cpus: cpus().length, loadavg: loadavg().map((l) => round(l)) },
  };
  if (values.json) {
    console.log(JSON.stringify(report));
  } else {
    const rows = [helloRun, ...Object.values(runs).flatMap((r) => r.scenarios)];
    console.log(
      `\nup to ${requests} requests per scenario (bounded to ${maxDurationMs / 1000} s), loopback, keep-alive; each execution: ${EXECUTION_BODY}`,
    );
    console.log(`${report.machine.cpus} CPUs, load average ${report.machine.loadavg.join(" ")}`);
    if (postgresDurability !== undefined) {
      console.log(
        `PostgreSQL server: fsync=${postgresDurability.fsync}, synchronous_commit=${postgresDurability.synchronous_commit}`,
      );
    }
    console.log("");
    console.log(formatTable(rows));
    console.log(
      "\ngateway CPU ms per execution, executions/s, p50 (HTTP p50 minus the daemon's own p50 at the same concurrency, in alternating blocks):",
    );
    for (const [database, run] of Object.entries(runs)) {
      for (const [label, figures] of [
        ["", run.executions],
        [" + Idempotency-Key", run.keyed],
      ] as const) {
        for (const [c, e] of Object.entries(figures)) {
          const alone = run.daemon[c];
          const over =
            alone === undefined
              ? ""
              : ` (+${(e.p50_ms - alone.p50_ms).toFixed(2)} ms over the daemon alone, which did ${alone.per_s}/s)`;
          console.log(
            `  ${database}${label} c=${c}: ${e.gateway_cpu_ms_per_exec} ms CPU, ${e.per_s}/s, p50 ${e.p50_ms} ms${over}`,
          );
        }
      }
    }
    console.log(
      `daemon alone at c=1: p50 ${report.daemon_p50_ms} ms; plain Hono hello: ${report.hello_per_s} req/s`,
    );
    console.log(
      "floors at c=1, in the gateway's blocks (the daemon's run, then what answering over HTTP and billing before the answer cost on their own):",
    );
    for (const [database, run] of Object.entries(runs)) {
      const [alone, { then_a_plain_request: http, then_its_record: record }] = [
        run.daemon["1"],
        run.floors,
      ];
      if (alone === undefined) continue;
      const over = (f: LatencyFigures) => f.p50_ms - alone.p50_ms;
      const recordSaid =
        record === null
          ? ""
          : `; then its record committed on the server ${record.p50_ms} (+${over(record).toFixed(2)})`;
      const bound =
        record === null
          ? ""
          : `; the two together +${(over(http) + over(record)).toFixed(2)}, before any work of the gateway's own`;
      console.log(
        `  ${database}, c=1, p50 ms: the daemon alone ${alone.p50_ms}; then a plain Hono request ${http.p50_ms} (+${over(http).toFixed(2)})${recordSaid}${bound}`,
      );
    }
    const verdict = (goal: Goal) =>
      goal.met === null ? "not measured" : `${goal.met ? "met" : "NOT met"} (${goal.figure})`;
    console.log("issue 9's goals (keyless executions):");
    for (const [database, goals] of Object.entries(report.goals)) {
      console.log(
        `  ${database}: gateway CPU ≤ 1 ms/exec at every concurrency: ${verdict(goals.cpu_ms_per_exec_at_most_1)}; ` +
          `p50 at c=1 ≤ the daemon's + 1 ms: ${verdict(goals.p50_over_daemon_at_1_at_most_1_ms)}; ≥ 500/s at c=16: ${verdict(goals.per_s_at_16_at_least_500)}`,
      );
    }
    console.log(
      `CPU baselines in the same runs, ms (the runtime client alone per execution by concurrency; plain Hono per request at c=1, back to back / after ${IDLE_PAUSE_MS} ms idle / after an execution each):`,
    );
    for (const [database, run] of Object.entries(runs)) {
      const client = Object.entries(run.baselines.runtime_client_ms_per_exec)
        .map(([c, ms]) => `c=${c} ${ms}`)
        .join(", ");
      const plain = run.baselines.hello_ms_per_req;
      console.log(
        `  ${database}: runtime client ${client}; plain Hono ${plain.back_to_back} / ${plain.after_an_idle_pause} / ${plain.after_an_execution}`,
      );
    }
  }
} finally {
  client.destroy();
  hello.stop();
}
