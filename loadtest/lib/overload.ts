// `npm run loadtest -- --overload`: the gateway as `npm start` runs it (its admission bounds at
// their defaults, sized for this machine), first unloaded at the concurrency the machine
// sustains, then flooded at 4x that with a CPU hog beside it (a child process spinning on each
// core at nice 0, as a neighbour would; stopped at the end). The concurrency the machine sustains
// is what the gateway hands the daemon at once per template (SANDFORK_TEMPLATE_MAX_RUNNING's
// default, gateway/config.ts): past it calls wait in line and the daemon runs no more at a time.
// Every answer is classified: its true status (200 with the status and output the program must
// end with), shed (429 or 503 with Retry-After), or wrong (anything else). It prints the share
// answered with their true status or shed (goal 100%), the p99 of the shed answers (goal ≤ 5 ms),
// and executions/s of those that ran against the unloaded figure. Beside the shed answers' times,
// their floor on this machine at this time: a plain Hono server (loadtest/hello-server.ts)
// answering the same 503 with nothing done before it, to as many clients as the flood had past
// both bounds, with the same client and the same CPU hog, for as long, right after the flood.
import { availableParallelism, getPriority, loadavg, setPriority } from "node:os";
import { monitorEventLoopDelay } from "node:perf_hooks";
import { loadAdmissionSettings } from "../../gateway/config.js";
import { startCpuHog } from "./cpu-hog.js";
import { startHello } from "./hello.js";
import { keepAliveClient } from "./http-client.js";
import { withLoadGateway } from "./load-gateway.js";
import { drive, percentile, processCpuMs, round } from "./measure.js";

/** One kind of program of the mix, with what its true answer is. */
interface Kind {
  body: string;
  status: string;
  stdout?: string;
}

// Mostly programs that complete; one in ten runs past its time limit, whose true answer is
// `timed_out` however long it waited for a slot (the failure this mode exists to catch: a loaded
// machine turning a program's end into a runtime failure).
const OK: Kind = {
  body: JSON.stringify({ template: "python", code: "print(6*7)" }),
  status: "completed",
  stdout: "42\n",
};
const TIMEOUT: Kind = {
  body: JSON.stringify({ template: "python", code: "while True: pass", timeout_ms: 200 }),
  status: "timed_out",
};
const kindOf = (n: number): Kind => (n % 10 === 9 ? TIMEOUT : OK);

export interface PhaseFigures {
  concurrency: number;
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
  /** p99 of this process's own event-loop delay over the phase, ms: the client's part of its times. */
  client_loop_delay_p99_ms: number;
  loadavg_after: number[];
}

/** A plain Hono server's 503 under the flood's conditions (the module comment). */
export interface ShedFloor {
  concurrency: number;
  requests: number;
  per_s: number;
  p50_ms: number;
  p99_ms: number;
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
  sustained_concurrency: number;
  /** The machine's load average (1, 5, 15 min) as the run began. */
  loadavg_before: number[];
  unloaded: PhaseFigures;
  overloaded: PhaseFigures;
  shed_floor: ShedFloor;
  /** The nice values of the event loops' threads: the gateway's, this client's, the floor's server's. */
  nice: { gateway: number; client: number; floor_server: number };
  /** overloaded.executions_per_s / unloaded.executions_per_s, %. */
  executions_per_s_vs_unloaded_pct: number;
  /** Up to 5 wrong answers, as `status body`. */
  wrong_examples: string[];
}

/**
 * Sets the nice value of `pid`'s main thread (undefined: this one) to `nice`, where permitted;
 * answers the value it has.
 */
function raiseNice(pid: number | undefined, nice: number): number {
  try {
    if (pid === undefined) setPriority(nice);
    else setPriority(pid, nice);
  } catch {
    // Not permitted (not root): measured at the value it has, which the report gives.
  }
  return pid === undefined ? getPriority() : getPriority(pid);
}

export async function overload(options: {
  seconds: number;
  /** SANDFORK_GATEWAY_NICE for the gateway (0: not set), and this client's and the floor's server's nice value. */
  gatewayNice: number;
  say: (line: string) => void;
}): Promise<OverloadReport> {
  const cpus = availableParallelism();
  const sustained = loadAdmissionSettings({}, cpus).templateMaxRunning;
  const flood = 4 * sustained;
  // The gateway admits as many as it runs and as many again in its line; the rest are shed.
  const pastBounds = flood - 2 * sustained;
  const client = keepAliveClient(flood);
  const wrongExamples: string[] = [];
  const loadavgBefore = loadavg().map((l) => round(l));
  const hello = await startHello();
  try {
    return await withLoadGateway(
      client.call,
      {
        databaseUrl: undefined,
        ...(options.gatewayNice === 0
          ? {}
          : { env: { SANDFORK_GATEWAY_NICE: String(options.gatewayNice) } }),
      },
      async ({ gateway, json }) => {
        const url = `${gateway.url}/v1/executions`;
        // Raised only now: the gateway and the floor's server, spawned from this thread, would
        // have inherited it whole (their helper threads and the daemon too).
        const nice = {
          gateway: getPriority(gateway.pid),
          client: raiseNice(undefined, options.gatewayNice),
          floor_server: raiseNice(hello.pid, options.gatewayNice),
        };
        options.say(
          `nice values of the event loops: the gateway ${nice.gateway}, this client ${nice.client}, the floor's server ${nice.floor_server}`,
        );

        const phase = async (concurrency: number, seconds: number): Promise<PhaseFigures> => {
          const ran: number[] = [];
          const shed: number[] = [];
          const shedBy = { "429": 0, "503": 0 };
          let wrong = 0;
          let sent = 0;
          const metricsBefore = shedBuckets(
            (await client.call("GET", `${gateway.url}/metrics`)).body,
          );
          const cpuBefore = processCpuMs(gateway.pid);
          const loopDelay = monitorEventLoopDelay({ resolution: 1 });
          loopDelay.enable();
          const started = performance.now();
          const deadline = started + seconds * 1000;
          const worker = async () => {
            while (performance.now() < deadline) {
              const kind = kindOf(sent++);
              const t0 = performance.now();
              let answer: { status: number; body: string; retryAfter?: string } | undefined;
              try {
                answer = await client.call("POST", url, json, kind.body);
              } catch (error) {
                wrong++;
                if (wrongExamples.length < 5) wrongExamples.push(`no answer: ${String(error)}`);
                continue;
              }
              const ms = performance.now() - t0;
              if (answer.status === 200) {
                const body = JSON.parse(answer.body) as { status: string; stdout: string };
                if (
                  body.status === kind.status &&
                  (kind.stdout === undefined || body.stdout === kind.stdout)
                ) {
                  ran.push(ms);
                  continue;
                }
              } else if (
                (answer.status === 429 || answer.status === 503) &&
                answer.retryAfter !== undefined
              ) {
                shed.push(ms);
                shedBy[answer.status === 429 ? "429" : "503"]++;
                continue;
              }
              wrong++;
              if (wrongExamples.length < 5)
                wrongExamples.push(`${answer.status} ${answer.body.slice(0, 300)}`);
            }
          };
          await Promise.all(Array.from({ length: concurrency }, worker));
          loopDelay.disable();
          const elapsed = (performance.now() - started) / 1000;
          const gatewayCpuPct = (processCpuMs(gateway.pid) - cpuBefore) / (10 * elapsed);
          const metricsAfter = (await client.call("GET", `${gateway.url}/metrics`)).body;
          const gatewayShed = gatewayShedFigures(metricsBefore, shedBuckets(metricsAfter));
          const gatewayLoopP99 = gauge(metricsAfter, "nodejs_eventloop_delay_p99");
          ran.sort((a, b) => a - b);
          shed.sort((a, b) => a - b);
          const requests = ran.length + shed.length + wrong;
          return {
            concurrency,
            seconds: round(elapsed, 1),
            requests,
            true_status: ran.length,
            shed: shedBy,
            wrong,
            answered_truly_or_shed_pct: round(
              (100 * (ran.length + shed.length)) / Math.max(1, requests),
              3,
            ),
            executions_per_s: round(ran.length / elapsed, 1),
            ran_p50_ms: round(percentile(ran, 50)),
            ran_p99_ms: round(percentile(ran, 99)),
            shed_p50_ms: shed.length === 0 ? null : round(percentile(shed, 50)),
            shed_p99_ms: shed.length === 0 ? null : round(percentile(shed, 99)),
            gateway_shed_within_5_ms_pct: gatewayShed.within5,
            gateway_shed_p99_at_most_ms: gatewayShed.p99AtMost,
            gateway_cpu_pct: round(gatewayCpuPct, 1),
            gateway_loop_delay_p99_ms:
              gatewayLoopP99 === null ? null : round(gatewayLoopP99 * 1000),
            client_loop_delay_p99_ms: round(loopDelay.percentile(99) / 1e6),
            loadavg_after: loadavg().map((l) => round(l)),
          };
        };

        options.say(
          `${cpus} CPUs; the gateway hands the daemon ${sustained} executions of a template at once (the concurrency sustained); flood at ${flood}`,
        );
        options.say("warming up at the sustained concurrency (5 s)");
        await phase(sustained, 5);
        options.say(`unloaded: c=${sustained} for ${options.seconds} s`);
        const unloaded = await phase(sustained, options.seconds);
        options.say(
          `  ${unloaded.executions_per_s}/s, p99 ${unloaded.ran_p99_ms} ms, ${unloaded.wrong} wrong`,
        );
        options.say(
          `overloaded: c=${flood} for ${options.seconds} s with a CPU hog on each of ${cpus} cores`,
        );
        const hog = startCpuHog(cpus);
        let overloaded: PhaseFigures;
        let floor: ShedFloor;
        try {
          overloaded = await phase(flood, options.seconds);
          options.say(
            `  shed p50 ${overloaded.shed_p50_ms} ms, p99 ${overloaded.shed_p99_ms} ms, loop delay p99: gateway ${overloaded.gateway_loop_delay_p99_ms} ms, client ${overloaded.client_loop_delay_p99_ms} ms; the floor: a plain Hono 503 at c=${pastBounds} for ${options.seconds} s`,
          );
          const floorRun = await drive({
            scenario: "plain Hono 503",
            requests: Number.MAX_SAFE_INTEGER,
            concurrency: pastBounds,
            maxDurationMs: options.seconds * 1000,
            send: async () =>
              (await client.call("POST", `${hello.url}/busy`, json, OK.body)).status === 503,
          });
          floor = {
            concurrency: pastBounds,
            requests: floorRun.requests,
            per_s: round(floorRun.requestsPerSecond, 1),
            p50_ms: round(floorRun.p50Ms),
            p99_ms: round(floorRun.p99Ms),
          };
        } finally {
          hog.stop();
        }
        return {
          cpus,
          sustained_concurrency: sustained,
          loadavg_before: loadavgBefore,
          unloaded,
          overloaded,
          shed_floor: floor,
          nice,
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

/** The report as a Markdown table (docs/benchmarks.md takes it as printed). */
export function overloadTable(report: OverloadReport): string {
  const { unloaded: u, overloaded: o } = report;
  const shedP99 = (f: PhaseFigures) => (f.shed_p99_ms === null ? "none shed" : `${f.shed_p99_ms}`);
  const rows = [
    ["", `unloaded, c=${u.concurrency}`, `4x, c=${o.concurrency}, CPU hog on every core`],
    ["requests", `${u.requests}`, `${o.requests}`],
    ["answered with their true status", `${u.true_status}`, `${o.true_status}`],
    [
      "shed: 429 / 503, with Retry-After",
      `${u.shed["429"]} / ${u.shed["503"]}`,
      `${o.shed["429"]} / ${o.shed["503"]}`,
    ],
    ["wrong answers", `${u.wrong}`, `${o.wrong}`],
    [
      "true status or 429/503 (goal 100%)",
      `${u.answered_truly_or_shed_pct}%`,
      `${o.answered_truly_or_shed_pct}%`,
    ],
    [
      "p50 / p99 of the shed answers, ms (goal p99 ≤ 5)",
      u.shed_p50_ms === null ? "none shed" : `${u.shed_p50_ms} / ${shedP99(u)}`,
      o.shed_p50_ms === null ? "none shed" : `${o.shed_p50_ms} / ${shedP99(o)}`,
    ],
    [
      `the floor: a plain Hono server's 503, c=${report.shed_floor.concurrency}, p50 / p99, ms`,
      "",
      `${report.shed_floor.p50_ms} / ${report.shed_floor.p99_ms} (${report.shed_floor.per_s}/s)`,
    ],
    [
      "the gateway's own time for them: within 5 ms / p99 at most, ms",
      u.gateway_shed_within_5_ms_pct === null
        ? "none shed"
        : `${u.gateway_shed_within_5_ms_pct}% / ${u.gateway_shed_p99_at_most_ms ?? "over 10,000"}`,
      o.gateway_shed_within_5_ms_pct === null
        ? "none shed"
        : `${o.gateway_shed_within_5_ms_pct}% / ${o.gateway_shed_p99_at_most_ms ?? "over 10,000"}`,
    ],
    [
      "p50 / p99 of those that ran, ms",
      `${u.ran_p50_ms} / ${u.ran_p99_ms}`,
      `${o.ran_p50_ms} / ${o.ran_p99_ms}`,
    ],
    [
      "executions/s of those that ran",
      `${u.executions_per_s}`,
      `${o.executions_per_s} (${report.executions_per_s_vs_unloaded_pct}% of unloaded)`,
    ],
    [
      "event-loop delay p99, ms: the gateway / this client",
      `${u.gateway_loop_delay_p99_ms ?? "?"} / ${u.client_loop_delay_p99_ms}`,
      `${o.gateway_loop_delay_p99_ms ?? "?"} / ${o.client_loop_delay_p99_ms}`,
    ],
    ["the gateway's CPU, % of a core", `${u.gateway_cpu_pct}`, `${o.gateway_cpu_pct}`],
    [
      "nice values: the gateway's event loop / this client / the floor's server",
      `${report.nice.gateway} / ${report.nice.client} / ${report.nice.floor_server}`,
      "the same; the hog 0",
    ],
    [
      "load average (1, 5, 15 min): before the run / after",
      `${report.loadavg_before.join(", ")} / ${u.loadavg_after.join(", ")}`,
      o.loadavg_after.join(", "),
    ],
  ];
  const line = (cells: string[]) => `| ${cells.join(" | ")} |`;
  return [line(rows[0] as string[]), line(["---", "---", "---"]), ...rows.slice(1).map(line)].join(
    "\n",
  );
}
