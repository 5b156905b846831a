// `npm run loadtest -- --gap-ms 0,15,100,1000`: executions at the pace agents send them, one at a
// time, each after the machine has been idle for a gap, on each database as `npm run loadtest`
// sets it up. Per gap: p50/p99 as the client saw them (the gap itself not counted), each phase's
// p50 from the gateway's own spans (lib/phases.ts), which says where the time of a call after
// idle goes, and two baselines after the same gap: below the gateway, the same execution sent
// straight to the daemon and, on PostgreSQL, its record then committed on the server
// (lib/record-baseline.ts); beside it, a GET of a plain Hono server (lib/hello.ts), the floor of
// an HTTP call on this machine; so that what an idle machine, kernel and database server cost on
// their own is told apart from what the gateway adds. The gaps and lanes are taken in turn
// (lib/gap-schedule.ts), so that a shared machine's slow minutes fall on all of them.
// The gateway exports its spans only when it stops (a long batch delay and a queue that holds
// them all), so no export wakes it between calls.
import { setTimeout as pauseFor } from "node:timers/promises";
import { daemonRequest, EXECUTION, EXECUTION_BODY } from "./execution.js";
import { gapSchedule, scheduleBoundMs } from "./gap-schedule.js";
import { startHello } from "./hello.js";
import type { Call } from "./http-client.js";
import { type LoadDatabase, withLoadGateway } from "./load-gateway.js";
import { alignedTable, percentile, round } from "./measure.js";
import { type ExecutionPhases, executionPhases, type SpanReceiver } from "./phases.js";
import { openRecordBaseline } from "./record-baseline.js";

/** One gap's figures, in ms. */
export interface GapFigures {
  gap_ms: number;
  requests: number;
  failed: number;
  p50_ms: number;
  p99_ms: number;
  /** Each phase's own p50 over the traced executions (they need not add up); null: none traced. */
  phases: Record<PhaseName, number> | null;
  traced: number;
  /** The daemon alone (PostgreSQL: then the record committed on the server), after the same gap. */
  baseline: Percentiles;
  /** A GET of a plain Hono server after the same gap: what HTTP alone costs on this machine. */
  http_floor: Percentiles;
}

/** A lane's client times, in ms. */
export interface Percentiles {
  p50_ms: number;
  p99_ms: number;
  requests: number;
  failed: number;
}

export const PHASE_NAMES = [
  "outside_server_span",
  "server_span",
  "auth",
  "hold",
  "runtime",
  "vm",
  "runtime_rest",
  "record",
  "rest",
] as const;
export type PhaseName = (typeof PHASE_NAMES)[number];

/** What each phase is, for the printed table. */
const PHASE_LABELS: Record<PhaseName, string> = {
  outside_server_span: "  outside the server span (client, loopback, wake-ups)",
  server_span: "  the server span",
  auth: "    auth (key or token, rate limit)",
  hold: "    the hold (billing.reserve)",
  runtime: "    the runtime round trip (runtime.execute)",
  vm: "      of which the VM (queue, fork, exec)",
  runtime_rest: "      of which the rest (runtime client, socket, daemon)",
  record: "    the record (billing.settle)",
  rest: "    the rest (HTTP, body, validation, limits, the answer)",
};

/** Calls per gap unless --requests says; at a gap of 1 s, 100 take about two minutes with the baseline. */
export const GAP_REQUESTS = 100;
/** Executions back to back before the gaps, unless --warm-up says how many. */
export const GAP_WARM_UP = 2000;
/** The most one call may take, for the run's bound in time. */
const CALL_BOUND_MS = 1_000;
/** How long the gateway's spans may take to arrive once it has stopped. */
const SPANS_DUE_MS = 10_000;

const p50Of = (values: number[]) =>
  percentile(
    [...values].sort((a, b) => a - b),
    50,
  );

/** The p50 of each phase of the executions whose client times are in `clientMs`. */
export function phaseMedians(
  phases: ExecutionPhases[],
  clientMs: Map<string, number>,
): Record<PhaseName, number> | null {
  const mine = phases.filter((p) => clientMs.has(p.requestId));
  if (mine.length === 0) return null;
  const p50 = (pick: (p: ExecutionPhases) => number) => round(p50Of(mine.map(pick)), 3);
  return {
    outside_server_span: p50((p) => (clientMs.get(p.requestId) ?? 0) - p.server),
    server_span: p50((p) => p.server),
    auth: p50((p) => p.auth),
    hold: p50((p) => p.hold),
    runtime: p50((p) => p.runtime),
    vm: p50((p) => p.vm),
    runtime_rest: p50((p) => p.runtime - p.vm),
    record: p50((p) => p.record),
    rest: p50((p) => p.rest),
  };
}

/** What one gap's calls (or its baseline's) came to. */
interface Tally {
  /** By request id: the client's time for each call that answered as it should. */
  clientMs: Map<string, number>;
  failed: number;
}

const tally = (): Tally => ({ clientMs: new Map(), failed: 0 });

/** Times `send` into `into` under `requestId`; a throw or a false counts as failed. */
async function timed(into: Tally, requestId: string, send: () => Promise<boolean>): Promise<void> {
  const started = performance.now();
  let ok = false;
  try {
    ok = await send();
  } catch {
    ok = false;
  }
  if (ok) into.clientMs.set(requestId, performance.now() - started);
  else into.failed++;
}

/**
 * Sends `requests` executions per gap through the gateway, one at a time, each `gap` ms after the
 * previous answer, and as many of the baseline, after `warmUp` back to back.
 */
export async function measureGaps(options: {
  call: Call;
  database: LoadDatabase;
  databaseUrl: string | undefined;
  receiver: SpanReceiver;
  gapsMs: number[];
  requests: number;
  warmUp: number;
  say: (line: string) => void;
}): Promise<GapFigures[]> {
  const { call, gapsMs, requests, receiver, say, databaseUrl } = options;
  const env = {
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: receiver.url,
    OTEL_BSP_SCHEDULE_DELAY: String(3_600_000),
    OTEL_BSP_MAX_QUEUE_SIZE: "1000000",
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE: "1000000",
  };
  receiver.spans.length = 0;
  const lanes = [gapsMs.map(tally), gapsMs.map(tally), gapsMs.map(tally)];
  const [gateway, baseline, floor] = lanes as [Tally[], Tally[], Tally[]];
  const hello = await startHello();
  try {
    await withLoadGateway(call, { databaseUrl, env }, async (load) => {
      const recordBaseline =
        databaseUrl === undefined
          ? undefined
          : await openRecordBaseline(databaseUrl, load.key, {
              executions: requests * gapsMs.length,
              template: EXECUTION.template,
              timeoutMs: daemonRequest().timeoutMs,
            });
      try {
        let sequence = 0;
        const execute = async () => {
          const r = await call(
            "POST",
            `${load.gateway.url}/v1/executions`,
            { ...load.json, "x-request-id": `gap-${sequence}` },
            EXECUTION_BODY,
          );
          return r.status === 200 && r.body.includes('"status":"completed"');
        };
        const executeBelow = async () => {
          const request = daemonRequest();
          const sent = performance.now();
          const result = await load.daemon.execute(request, AbortSignal.timeout(30_000));
          await recordBaseline?.record(request, result, performance.now() - sent);
          return result.outcome === "completed";
        };
        const helloGet = async () => (await call("GET", `${hello.url}/hello`)).status === 200;
        const sends = [execute, executeBelow, helloGet];
        say(
          `${options.database}: ${options.warmUp} executions back to back to warm up, then ${requests} after each gap of ${gapsMs.join(", ")} ms and as many of each baseline (${recordBaseline === undefined ? "the daemon alone" : "the daemon alone, then its record committed"}; a plain Hono GET), in turn`,
        );
        for (let i = 0; i < options.warmUp; i++) {
          sequence++;
          await execute();
          await helloGet();
        }
        const deadline =
          performance.now() + scheduleBoundMs(gapsMs, requests, lanes.length, CALL_BOUND_MS);
        for (const { gap, lane } of gapSchedule(gapsMs.length, requests, lanes.length)) {
          if (performance.now() >= deadline) break;
          const gapMs = gapsMs[gap] as number;
          if (gapMs > 0) await pauseFor(gapMs);
          sequence++;
          await timed(
            lanes[lane]?.[gap] as Tally,
            `gap-${sequence}`,
            sends[lane] as () => Promise<boolean>,
          );
        }
      } finally {
        await recordBaseline?.close();
      }
    });
  } finally {
    hello.stop();
  }
  // The gateway exported its spans as it stopped.
  const expected = gateway.reduce((n, g) => n + g.clientMs.size, 0);
  const due = performance.now() + SPANS_DUE_MS;
  let phases: ExecutionPhases[] = [];
  while (performance.now() < due) {
    phases = executionPhases(receiver.spans);
    if (phases.length >= expected) break;
    await pauseFor(100);
  }
  receiver.spans.length = 0;
  const percentiles = ({ clientMs, failed }: Tally): Percentiles => {
    const sorted = [...clientMs.values()].sort((a, b) => a - b);
    return {
      p50_ms: round(percentile(sorted, 50), 3),
      p99_ms: round(percentile(sorted, 99), 3),
      requests: clientMs.size + failed,
      failed,
    };
  };
  return gapsMs.map((gap, index) => {
    const through = gateway[index] as Tally;
    return {
      gap_ms: gap,
      ...percentiles(through),
      phases: phaseMedians(phases, through.clientMs),
      traced: phases.filter((p) => through.clientMs.has(p.requestId)).length,
      baseline: percentiles(baseline[index] as Tally),
      http_floor: percentiles(floor[index] as Tally),
    };
  });
}

/** One database's figures as a table: a column per gap, a row per figure. */
export function gapTable(database: string, figures: GapFigures[]): string {
  const ms = (n: number) => n.toFixed(3);
  const baselineName =
    database === "postgres" ? "the daemon alone, then its record" : "the daemon alone";
  const rows: [string, (f: GapFigures) => string][] = [
    ["through the gateway: requests (failed)", (f) => `${f.requests} (${f.failed})`],
    ["  client p50", (f) => ms(f.p50_ms)],
    ["  client p99", (f) => ms(f.p99_ms)],
    [
      "  over the back-to-back p50",
      (f) => {
        const backToBack = figures.find((g) => g.gap_ms === 0);
        return backToBack === undefined ? "" : ms(f.p50_ms - backToBack.p50_ms);
      },
    ],
    ...PHASE_NAMES.map((name): [string, (f: GapFigures) => string] => [
      PHASE_LABELS[name],
      (f) => (f.phases === null ? "" : ms(f.phases[name])),
    ]),
    [`baseline, ${baselineName}: p50`, (f) => ms(f.baseline.p50_ms)],
    ["  p99", (f) => ms(f.baseline.p99_ms)],
    ["HTTP floor, a plain Hono GET: p50", (f) => ms(f.http_floor.p50_ms)],
    ["  p99", (f) => ms(f.http_floor.p99_ms)],
  ];
  const header = [`${database}, ms`, ...figures.map((f) => `gap ${f.gap_ms} ms`)];
  return alignedTable(
    header,
    rows.map(([label, cell]) => [label, ...figures.map(cell)]),
  );
}
