// `npm run loadtest:phases`: where the time of one execution goes at concurrency 1, phase by
// phase, on PGlite and on a PostgreSQL server (as `npm run loadtest` sets them up), read off the
// gateway's own OpenTelemetry traces (lib/phases.ts) and set beside the daemon alone in the same
// run. The gateway records and exports every span here, which costs CPU and time of its own, so
// the phases say where the time goes, not what an execution costs: that is `npm run loadtest`.
import { commandLine } from "../gateway/cli/command-line.js";
import { daemonRequest, EXECUTION_BODY } from "./lib/execution.js";
import { keepAliveClient } from "./lib/http-client.js";
import { onEachDatabase, parseDatabases, withLoadGateway } from "./lib/load-gateway.js";
import { drive, driveAlternating, percentile } from "./lib/measure.js";
import {
  type ExecutionPhases,
  executionPhases,
  type SpanReceiver,
  startSpanReceiver,
} from "./lib/phases.js";

const { values, fail } = commandLine(
  "npm run loadtest:phases -- [--requests N] [--warm-up N] [--databases pglite,postgres]",
  {
    requests: { type: "string", default: "2000" },
    "warm-up": { type: "string", default: "3000" },
    databases: { type: "string", default: "pglite,postgres" },
  },
);
const requests = Number(values.requests);
const warmUp = Number(values["warm-up"]);
if (!Number.isSafeInteger(requests) || requests <= 0) fail("--requests must be a positive integer");
if (!Number.isSafeInteger(warmUp) || warmUp < 0) fail("--warm-up must be a non-negative integer");
const databases = parseDatabases(values.databases, fail);

/** Blocks of the gateway taken in turn with blocks of the daemon alone. */
const ROUNDS = 5;
/** How long the gateway's last spans may take to arrive after its last answer. */
const SPANS_DUE_MS = 10_000;

const client = keepAliveClient(1);
const p50 = (values: number[]) =>
  percentile(
    [...values].sort((a, b) => a - b),
    50,
  );

interface PhaseRun {
  phases: ExecutionPhases[];
  /** What the client saw, by request id. */
  clientMs: Map<string, number>;
  daemonAlone: { clientMs: number[]; vmMs: number[] };
}

async function measure(
  database: string,
  databaseUrl: string | undefined,
  receiver: SpanReceiver,
): Promise<PhaseRun> {
  // Every span exported within a fifth of a second, none dropped for a full queue.
  const env = {
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: receiver.url,
    OTEL_BSP_SCHEDULE_DELAY: "200",
    OTEL_BSP_MAX_QUEUE_SIZE: "65536",
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE: "4096",
  };
  return withLoadGateway(client.call, { databaseUrl, env }, async ({ gateway, daemon, json }) => {
    let sequence = 0;
    const clientMs = new Map<string, number>();
    const execute = async (measured: boolean) => {
      const requestId = `phases-${sequence++}`;
      const started = performance.now();
      const r = await client.call(
        "POST",
        `${gateway.url}/v1/executions`,
        { ...json, "x-request-id": requestId },
        EXECUTION_BODY,
      );
      if (measured) clientMs.set(requestId, performance.now() - started);
      return r.status === 200;
    };
    const daemonAlone = { clientMs: [] as number[], vmMs: [] as number[] };
    const executeOnDaemon = async () => {
      const started = performance.now();
      const result = await daemon.execute(daemonRequest(), AbortSignal.timeout(30_000));
      daemonAlone.clientMs.push(performance.now() - started);
      daemonAlone.vmMs.push(result.timings.queueMs + result.timings.forkMs + result.timings.execMs);
      return result.outcome === "completed";
    };

    console.log(
      `${database}: ${warmUp} executions to warm up, then ${requests} in ${ROUNDS} blocks taken in turn with the daemon alone`,
    );
    const warm = await drive({
      scenario: "warm-up",
      requests: warmUp,
      concurrency: 1,
      maxDurationMs: Number.MAX_SAFE_INTEGER,
      send: () => execute(false),
    });
    if (warm.failures > 0)
      throw new Error(`warm-up: ${warm.failures} of ${warm.requests} executions failed`);
    const block = (scenario: string, send: () => Promise<boolean>) => ({
      scenario,
      requests,
      concurrency: 1,
      maxDurationMs: Number.MAX_SAFE_INTEGER,
      send,
    });
    const { subject, baseline } = await driveAlternating(
      block("gateway", () => execute(true)),
      block("daemon alone", executeOnDaemon),
      ROUNDS,
    );
    for (const { scenario, failures, requests: sent } of [subject, baseline]) {
      if (failures > 0) throw new Error(`${scenario}: ${failures} of ${sent} executions failed`);
    }

    // The spans of the measured executions, once they have all arrived or SPANS_DUE_MS has passed.
    const deadline = Date.now() + SPANS_DUE_MS;
    let phases: ExecutionPhases[] = [];
    while (Date.now() < deadline) {
      phases = executionPhases(receiver.spans).filter((p) => clientMs.has(p.requestId));
      if (phases.length === clientMs.size) break;
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    receiver.spans.length = 0;
    return { phases, clientMs, daemonAlone };
  });
}

function report(database: string, run: PhaseRun): void {
  const { phases, clientMs, daemonAlone } = run;
  const of = (pick: (p: ExecutionPhases) => number) => p50(phases.map(pick)).toFixed(3);
  const rows: [string, string][] = [
    ["client: the whole request", p50([...clientMs.values()]).toFixed(3)],
    [
      "  outside the gateway's server span (client, loopback, wake-ups)",
      of((p) => (clientMs.get(p.requestId) ?? 0) - p.server),
    ],
    ["  the server span", of((p) => p.server)],
    ["    auth (key or token, rate limit)", of((p) => p.auth)],
    ["    the hold (billing.reserve)", of((p) => p.hold)],
    ["    the runtime round trip (runtime.execute)", of((p) => p.runtime)],
    ["      of which the VM (queue, fork, exec)", of((p) => p.vm)],
    ["      of which the rest (runtime client, socket, daemon)", of((p) => p.runtime - p.vm)],
    ["    the record (billing.settle)", of((p) => p.record)],
    ["    the rest: HTTP, body, validation, limits, the answer", of((p) => p.rest)],
    ["daemon alone: the whole request", p50(daemonAlone.clientMs).toFixed(3)],
    ["  of which the VM (queue, fork, exec)", p50(daemonAlone.vmMs).toFixed(3)],
    [
      "  of which the rest (runtime client, socket, daemon)",
      p50(daemonAlone.clientMs.map((ms, i) => ms - (daemonAlone.vmMs[i] ?? 0))).toFixed(3),
    ],
  ];
  console.log(
    `\n${database}, p50 ms over ${phases.length} traced executions of ${clientMs.size} (each phase's own median: they need not add up):`,
  );
  const width = Math.max(...rows.map(([label]) => label.length));
  for (const [label, value] of rows) console.log(`  ${label.padEnd(width)}  ${value.padStart(7)}`);
}

const receiver = await startSpanReceiver();
try {
  const { runs, postgresDurability } = await onEachDatabase(
    databases,
    "sandfork_phases",
    (database, databaseUrl) => measure(database, databaseUrl, receiver),
  );
  if (runs.pglite !== undefined) report("pglite", runs.pglite);
  if (runs.postgres !== undefined) {
    report(
      `postgres (fsync=${postgresDurability?.fsync}, synchronous_commit=${postgresDurability?.synchronous_commit})`,
      runs.postgres,
    );
  }
} finally {
  client.destroy();
  await receiver.close();
}
