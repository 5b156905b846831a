// `npm run loadtest -- --overload`: the gateway as `npm start` runs it (its admission bounds at
// their defaults, sized for this machine; in a session of its own, as `setsid npm start`, at the
// priority --gateway-nice and --gateway-realtime give it), first unloaded at the concurrency the
// machine sustains, then at 4x that with a CPU hog beside it (a child process spinning on each
// core at nice 0, as a neighbour would; stopped at the end): first with clients that wait the
// Retry-After of a shed answer, as the answer asks, then with clients that send their next call
// at once, the harshest. The concurrency the machine sustains is what the gateway hands the daemon
// at once per template (SANDFORK_TEMPLATE_MAX_RUNNING's default, gateway/config.ts): past it calls
// wait in line and the daemon runs no more at a time. Every answer is classified: its true status
// (200 with the status and output the program must end with), shed (429 or 503 with
// Retry-After), or wrong (anything else). It prints the share answered with their true status or
// shed (goal 100%), the p99 of the shed answers (goal ≤ 5 ms), and executions/s of those that ran
// against the unloaded figure. The client measures from a process of its own at the gateway's
// priority (lib/flood.ts). Beside the harshest client's shed answers, their floor on this machine
// at this time: a plain Hono server (loadtest/hello-server.ts, at the same priority) answering
// the same 503 with nothing done before it, to as many clients as the flood had past both bounds,
// with the same client and the same CPU hog, for as long, right after the flood.
import { availableParallelism, loadavg } from "node:os";
import { loadAdmissionSettings } from "../../gateway/config.js";
import { startCpuHog } from "./cpu-hog.js";
import {
  type FloodKind,
  flood,
  type Priority,
  type PrioritySetting,
  priorityOf,
  raiseProcess,
} from "./flood.js";
import { startHello } from "./hello.js";
import { keepAliveClient } from "./http-client.js";
import { type LoadDatabase, withLoadGateway } from "./load-gateway.js";
import { percentile, processCpuMs, round } from "./measure.js";

// Mostly programs that complete; one in ten runs past its time limit, whose true answer is
// `timed_out` however long it waited for a slot (the failure this mode exists to catch: a loaded
// machine turning a program's end into a runtime failure).
const OK: FloodKind = {
  body: JSON.stringify({ template: "python", code: "print(6*7)" }),
  status: "completed",
  stdout: "42\n",
};
const TIMEOUT: FloodKind = {
  body: JSON.stringify({ template: "python", code: "while True: pass", timeout_ms: 200 }),
  status: "timed_out",
};
const MIX: FloodKind[] = [OK, OK, OK, OK, OK, OK, OK, OK, OK, TIMEOUT];

export interface PhaseFigures {
  concurrency: number;
  /** After a shed answer each client waited its Retry-After, or sent its next call at once. */
  retry_after: "wait" | "ignore";
  seconds: number;
  requests: number;
  /** Answered with the program's true status and output. */
  true_status: number;
  /** 429 or 503 with Retry-After. */
  shed: { "429": number; "503": number };
  wrong: number;
  /** (true_status + shed) / requests, %. */
  answered_truly_or_shed_pct: number;
  /** Programs that ran and were answered truly, per second. */
  executions_per_s: number;
  ran_p50_ms: number;
  ran_p99_ms: number;
  shed_p50_ms: number | null;
  shed_p99_ms: number | null;
  /**
   * The gateway's own time for its shed answers (http.server.request.duration of its 429s and
   * 503s, from routing to the answer; not the wait for its turn on the event loop or a core):
   * the share within 5 ms, and the bucket bound the p99 falls under, ms.
   */
  gateway_shed_within_5_ms_pct: number | null;
  gateway_shed_p99_at_most_ms: number | null;
  /** The gateway process's CPU time over the phase, % of one core. */
  gateway_cpu_pct: number;
  /** p99 of the gateway's event-loop delay over the phase (its nodejs.eventloop.delay.p99), ms. */
  gateway_loop_delay_p99_ms: number | null;
  /** p99 of the measuring client's own event-loop delay over the phase, ms: its part of its times. */
  client_loop_delay_p99_ms: number;
  loadavg_after: number[];
}

/** A plain Hono server's 503 under the flood's conditions (the module comment). */
export interface ShedFloor {
  concurrency: number;
  /** All its answers: each a 503 with Retry-After, else counted wrong. */
  requests: number;
  /** Its 503s a second, and their p50 and p99. */
  per_s: number;
  p50_ms: number;
  p99_ms: number;
  wrong: number;
}

/** Cumulative bucket counts of http.server.request.duration over the gateway's 429s and 503s, by bound (s). */
function shedBuckets(metrics: string): Map<number, number> {
  const buckets = new Map<number, number>();
  for (const line of metrics.split("\n")) {
    if (!line.startsWith("http_server_request_duration") || !line.includes("_bucket{")) continue;
    if (!/http_response_status_code="(429|503)"/.test(line)) continue;
    const le = /le="([^"]+)"/.exec(line)?.[1];
    if (le === undefined) continue;
    const bound = le === "+Inf" ? Number.POSITIVE_INFINITY : Number(le);
    buckets.set(bound, (buckets.get(bound) ?? 0) + Number(line.slice(line.lastIndexOf(" ") + 1)));
  }
  return buckets;
}

/** A gauge's value in Prometheus text (the first series of `name`), or null. */
function gauge(metrics: string, name: string): number | null {
  const line = metrics
    .split("\n")
    .find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`));
  return line === undefined ? null : Number(line.slice(line.lastIndexOf(" ") + 1));
}

/** The share of shed answers within 5 ms and the bound their p99 falls under, over what `after` counted past `before`. */
function gatewayShedFigures(
  before: Map<number, number>,
  after: Map<number, number>,
): { within5: number | null; p99AtMost: number | null } {
  const bounds = [...after.keys()].sort((a, b) => a - b);
  const counted = (bound: number) => (after.get(bound) ?? 0) - (before.get(bound) ?? 0);
  const total = counted(Number.POSITIVE_INFINITY);
  if (total === 0) return { within5: null, p99AtMost: null };
  const p99Bound = bounds.find((b) => counted(b) >= 0.99 * total) ?? Number.POSITIVE_INFINITY;
  return {
    within5: round((100 * counted(0.005)) / total, 1),
    p99AtMost: Number.isFinite(p99Bound) ? round(p99Bound * 1000, 1) : null,
  };
}

export interface OverloadReport {
  cpus: number;
  database: LoadDatabase;
  sustained_concurrency: number;
  /** The machine's load average (1, 5, 15 min) as the run began. */
  loadavg_before: number[];
  unloaded: PhaseFigures;
  /** At 4x, each client waiting the Retry-After of a shed answer: the goal's figures. */
  overloaded: PhaseFigures;
  /** At 4x, each client sending its next call at once, a shed one too: the harshest client. */
  overloaded_ignoring_retry_after: PhaseFigures;
  /** The floor of the harshest client's shed answers. */
  shed_floor: ShedFloor;
  /** The priorities the processes ran at: the gateway, the measuring client, the floor's server, the daemon. */
  priority: { gateway: Priority; client: Priority; floor_server: Priority; daemon: Priority };
  /** overloaded.executions_per_s / unloaded.executions_per_s, %. */
  executions_per_s_vs_unloaded_pct: number;
  /** Up to 5 wrong answers, as `status body`. */
  wrong_examples: string[];
}

export async function overload(options: {
  database: LoadDatabase;
  /** A PostgreSQL database for database "postgres". */
  databaseUrl: string | undefined;
  seconds: number;
  /**
   * SANDFORK_GATEWAY_NICE and SANDFORK_GATEWAY_REALTIME_PRIORITY for the gateway (0: not set),
   * and the measuring client's and the floor's server's priority.
   */
  priority: PrioritySetting;
  say: (line: string) => void;
}): Promise<OverloadReport> {
  const cpus = availableParallelism();
  const sustained = loadAdmissionSettings({}, cpus).templateMaxRunning;
  const flood4x = 4 * sustained;
  // The gateway admits as many as it runs and as many again in its line; the rest are shed.
  const pastBounds = flood4x - 2 * sustained;
  // This process's own calls: the load-test key and /metrics.
  const client = keepAliveClient(2);
  const wrongExamples: string[] = [];
  const loadavgBefore = loadavg().map((l) => round(l));
  const hello = await startHello();
  try {
    return await withLoadGateway(
      client.call,
      {
        databaseUrl: options.databaseUrl,
        // A session of its own, as `setsid npm start`: the gateway then raises its session's
        // scheduling group with its event loop (runtime/event-loop-priority.ts).
        ownSession: true,
        env: {
          ...(options.priority.nice === 0
            ? {}
            : { SANDFORK_GATEWAY_NICE: String(options.priority.nice) }),
          ...(options.priority.realtime === 0
            ? {}
            : { SANDFORK_GATEWAY_REALTIME_PRIORITY: String(options.priority.realtime) }),
        },
      },
      async ({ gateway, json }) => {
        const url = `${gateway.url}/v1/executions`;
        const floorServer = raiseProcess(hello.pid, options.priority);
        let clientPriority: Priority | undefined;

        const phase = async (
          concurrency: number,
          seconds: number,
          retryAfter: "wait" | "ignore",
        ): Promise<PhaseFigures> => {
          const metricsBefore = shedBuckets(
            (await client.call("GET", `${gateway.url}/metrics`)).body,
          );
          const cpuBefore = processCpuMs(gateway.pid);
          const started = performance.now();
          const { result, priority } = await flood(
            { url, headers: json, kinds: MIX, concurrency, seconds, retry_after: retryAfter },
            options.priority,
          );
          clientPriority = priority;
          const elapsed = (performance.now() - started) / 1000;
          const gatewayCpuPct = (processCpuMs(gateway.pid) - cpuBefore) / (10 * elapsed);
          const metricsAfter = (await client.call("GET", `${gateway.url}/metrics`)).body;
          const gatewayShed = gatewayShedFigures(metricsBefore, shedBuckets(metricsAfter));
          const gatewayLoopP99 = gauge(metricsAfter, "nodejs_eventloop_delay_p99");
          wrongExamples.push(...result.wrong_examples.slice(0, 5 - wrongExamples.length));
          const ran = result.ran_ms.sort((a, b) => a - b);
          const shed = result.shed_ms.sort((a, b) => a - b);
          const requests = ran.length + shed.length + result.wrong;
          return {
            concurrency,
            retry_after: retryAfter,
            seconds: round(result.seconds, 1),
            requests,
            true_status: ran.length,
            shed: result.shed,
            wrong: result.wrong,
            answered_truly_or_shed_pct: round(
              (100 * (ran.length + shed.length)) / Math.max(1, requests),
              3,
            ),
            executions_per_s: round(ran.length / result.seconds, 1),
            ran_p50_ms: round(percentile(ran, 50)),
            ran_p99_ms: round(percentile(ran, 99)),
            shed_p50_ms: shed.length === 0 ? null : round(percentile(shed, 50)),
            shed_p99_ms: shed.length === 0 ? null : round(percentile(shed, 99)),
            gateway_shed_within_5_ms_pct: gatewayShed.within5,
            gateway_shed_p99_at_most_ms: gatewayShed.p99AtMost,
            gateway_cpu_pct: round(gatewayCpuPct, 1),
            gateway_loop_delay_p99_ms:
              gatewayLoopP99 === null ? null : round(gatewayLoopP99 * 1000),
            client_loop_delay_p99_ms: round(result.loop_delay_p99_ms),
            loadavg_after: loadavg().map((l) => round(l)),
          };
        };

        options.say(
          `${cpus} CPUs, ${options.database}; the gateway hands the daemon ${sustained} executions of a template at once (the concurrency sustained); flood at ${flood4x}`,
        );
        options.say("warming up at the sustained concurrency (5 s)");
        await phase(sustained, 5, "wait");
        options.say(`unloaded: c=${sustained} for ${options.seconds} s`);
        const unloaded = await phase(sustained, options.seconds, "wait");
        options.say(
          `  ${unloaded.executions_per_s}/s, p99 ${unloaded.ran_p99_ms} ms, ${unloaded.wrong} wrong`,
        );
        const hog = startCpuHog(cpus);
        let overloaded: PhaseFigures;
        let ignoring: PhaseFigures;
        let floor: ShedFloor;
        try {
          options.say(
            `overloaded: c=${flood4x} for ${options.seconds} s with a CPU hog on each of ${cpus} cores, each client waiting the Retry-After of a shed answer`,
          );
          overloaded = await phase(flood4x, options.seconds, "wait");
          options.say(
            `  shed p50 ${overloaded.shed_p50_ms} ms, p99 ${overloaded.shed_p99_ms} ms; loop delay p99: gateway ${overloaded.gateway_loop_delay_p99_ms} ms, client ${overloaded.client_loop_delay_p99_ms} ms`,
          );
          options.say(
            `overloaded: c=${flood4x} for ${options.seconds} s, each client sending its next call at once`,
          );
          ignoring = await phase(flood4x, options.seconds, "ignore");
          options.say(
            `  shed p50 ${ignoring.shed_p50_ms} ms, p99 ${ignoring.shed_p99_ms} ms; loop delay p99: gateway ${ignoring.gateway_loop_delay_p99_ms} ms, client ${ignoring.client_loop_delay_p99_ms} ms; the floor: a plain Hono 503 at c=${pastBounds} for ${options.seconds} s`,
          );
          const { result } = await flood(
            {
              url: `${hello.url}/busy`,
              headers: json,
              kinds: [OK],
              concurrency: pastBounds,
              seconds: options.seconds,
              retry_after: "ignore",
            },
            options.priority,
          );
          const shed = result.shed_ms.sort((a, b) => a - b);
          floor = {
            concurrency: pastBounds,
            requests: shed.length + result.wrong,
            per_s: round(shed.length / result.seconds, 1),
            p50_ms: round(percentile(shed, 50)),
            p99_ms: round(percentile(shed, 99)),
            wrong: result.wrong,
          };
        } finally {
          hog.stop();
        }
        return {
          cpus,
          database: options.database,
          sustained_concurrency: sustained,
          loadavg_before: loadavgBefore,
          unloaded,
          overloaded,
          overloaded_ignoring_retry_after: ignoring,
          shed_floor: floor,
          priority: {
            gateway: priorityOf(gateway.pid),
            client: clientPriority as Priority,
            floor_server: floorServer,
            daemon: priorityOf(gateway.daemonPid()),
          },
          executions_per_s_vs_unloaded_pct: round(
            (100 * overloaded.executions_per_s) / Math.max(1e-9, unloaded.executions_per_s),
            1,
          ),
          wrong_examples: wrongExamples,
        };
      },
    );
  } finally {
    hello.stop();
    client.destroy();
  }
}

/** A process's priority as the table gives it: its nice value, and its session group's where there is one. */
const priorityCell = (p: Priority) =>
  `${p.realtime ? "SCHED_RR, " : ""}${p.nice}${p.group === undefined ? "" : ` (group ${p.group})`}`;

/** The report as a Markdown table (docs/benchmarks.md takes it as printed). */
export function overloadTable(report: OverloadReport): string {
  const phases = [report.unloaded, report.overloaded, report.overloaded_ignoring_retry_after];
  const row = (name: string, cell: (f: PhaseFigures) => string) => [name, ...phases.map(cell)];
  const shed = (f: PhaseFigures, cell: () => string) =>
    f.shed["429"] + f.shed["503"] === 0 ? "none shed" : cell();
  const floor = report.shed_floor;
  const { gateway, client, floor_server, daemon } = report.priority;
  const rows = [
    [
      "",
      `unloaded, c=${report.unloaded.concurrency}`,
      `4x, c=${report.overloaded.concurrency}, CPU hog on every core; clients wait the Retry-After`,
      `the same; clients ignore the Retry-After`,
    ],
    row("requests", (f) => `${f.requests}`),
    row("answered with their true status", (f) => `${f.true_status}`),
    row("shed: 429 / 503, with Retry-After", (f) => `${f.shed["429"]} / ${f.shed["503"]}`),
    row("wrong answers", (f) => `${f.wrong}`),
    row("true status or 429/503 (goal 100%)", (f) => `${f.answered_truly_or_shed_pct}%`),
    row("p50 / p99 of the shed answers, ms (goal p99 ≤ 5)", (f) =>
      shed(f, () => `${f.shed_p50_ms} / ${f.shed_p99_ms}`),
    ),
    [
      `the floor: a plain Hono server's 503, c=${floor.concurrency}, p50 / p99, ms`,
      "",
      "",
      `${floor.p50_ms} / ${floor.p99_ms} (${floor.per_s}/s)`,
    ],
    row("the gateway's own time for them: within 5 ms / p99 at most, ms", (f) =>
      shed(
        f,
        () =>
          `${f.gateway_shed_within_5_ms_pct}% / ${f.gateway_shed_p99_at_most_ms ?? "over 10,000"}`,
      ),
    ),
    row("p50 / p99 of those that ran, ms", (f) => `${f.ran_p50_ms} / ${f.ran_p99_ms}`),
    [
      "executions/s of those that ran",
      `${report.unloaded.executions_per_s}`,
      `${report.overloaded.executions_per_s} (${report.executions_per_s_vs_unloaded_pct}% of unloaded)`,
      `${report.overloaded_ignoring_retry_after.executions_per_s}`,
    ],
    row(
      "event-loop delay p99, ms: the gateway / the client",
      (f) => `${f.gateway_loop_delay_p99_ms ?? "?"} / ${f.client_loop_delay_p99_ms}`,
    ),
    row("the gateway's CPU, % of a core", (f) => `${f.gateway_cpu_pct}`),
    [
      "priority (nice, session group's nice): the gateway's event loop / the client / the floor's server / the daemon",
      `${priorityCell(gateway)} / ${priorityCell(client)} / ${priorityCell(floor_server)} / ${priorityCell(daemon)}`,
      "the same; the hog 0",
      "the same",
    ],
    row("load average (1, 5, 15 min) after", (f) => f.loadavg_after.join(", ")),
  ];
  const line = (cells: string[]) => `| ${cells.join(" | ")} |`;
  return [
    line(rows[0] as string[]),
    line(["---", "---", "---", "---"]),
    ...rows.slice(1).map(line),
  ].join("\n");
}
