// k6 load test of the execute path (k6 runs TypeScript directly: `k6 run loadtest/execute.k6.ts`).
//   BASE_URL      gateway base URL (default http://127.0.0.1:8787)
//   SANDFORK_KEY  an API key with the execute scope and credits
//   TEMPLATE      template to run (default python)
//   VUS, DURATION virtual users and duration (default 16, 30s)
// Each iteration sends the node runner's execution (loadtest/run.ts: print(6*7) on python, the
// gateway's default limits) with a unique Idempotency-Key, as the runner does; a second scenario
// replays a fixed one to measure the idempotent-replay path, a third looks up one execution's record
// by id (GET /v1/executions/{id}, made in setup). A plain GET /healthz scenario is the gateway's own
// floor.
//   GAP_MS        instead, the node runner's idle-gap mode (`npm run loadtest -- --gap-ms`): one
//                 client, GAP_REQUESTS executions (default 100) after each gap of the list, e.g.
//                 0,15,100,1000, in the same order (lib/gap-schedule.ts); a trend per gap,
//                 execute_after_gap_<ms>ms, gives its p50/p99 (the gateway's phases are the node runner's)
import { check, sleep } from "k6";
import exec from "k6/execution";
import http from "k6/http";
import { Trend } from "k6/metrics";
import type { Options } from "k6/options";
import { gapSchedule, parseGaps, scheduleBoundMs } from "./lib/gap-schedule.ts";

const BASE_URL = __ENV.BASE_URL ?? "http://127.0.0.1:8787";
const KEY = __ENV.SANDFORK_KEY ?? "";
const TEMPLATE = __ENV.TEMPLATE ?? "python";
const VUS = Number(__ENV.VUS ?? "16");
const DURATION = __ENV.DURATION ?? "30s";
const GAPS_MS =
  __ENV.GAP_MS === undefined
    ? undefined
    : parseGaps(__ENV.GAP_MS, (message) => {
        throw new Error(message);
      });
const GAP_REQUESTS = Number(__ENV.GAP_REQUESTS ?? "100");
if (!Number.isSafeInteger(GAP_REQUESTS) || GAP_REQUESTS <= 0)
  throw new Error(`GAP_REQUESTS must be a positive integer, got ${__ENV.GAP_REQUESTS}`);
/** The idle-gap mode's calls in order; one lane: the gateway. */
const GAP_SCHEDULE = GAPS_MS === undefined ? [] : gapSchedule(GAPS_MS.length, GAP_REQUESTS, 1);
/** Per gap, in the order of GAPS_MS: the client's time of each execution after it. */
const afterGapTrends = (GAPS_MS ?? []).map((gap) => new Trend(`execute_after_gap_${gap}ms`, true));

const gapOptions = (gapsMs: number[]): Options => ({
  scenarios: {
    gaps: {
      executor: "per-vu-iterations",
      exec: "afterGap",
      vus: 1,
      iterations: GAP_SCHEDULE.length,
      maxDuration: `${Math.ceil(scheduleBoundMs(gapsMs, GAP_REQUESTS, 1, 1_000) / 1000)}s`,
    },
  },
  thresholds: { "http_req_failed{scenario:gaps}": ["rate<0.01"] },
  summaryTrendStats: ["avg", "p(50)", "p(99)", "max"],
});

/** The throughput scenarios. */
const throughputOptions: Options = {
  scenarios: {
    execute: { executor: "constant-vus", exec: "execute", vus: VUS, duration: DURATION },
    replay: {
      executor: "constant-vus",
      exec: "replay",
      vus: Math.max(1, Math.floor(VUS / 4)),
      duration: DURATION,
    },
    lookup: {
      executor: "constant-vus",
      exec: "lookup",
      vus: Math.max(1, Math.floor(VUS / 4)),
      duration: DURATION,
    },
    health: { executor: "constant-vus", exec: "health", vus: 1, duration: DURATION },
  },
  thresholds: {
    "http_req_failed{scenario:execute}": ["rate<0.01"],
    "http_req_duration{scenario:execute}": ["p(95)<250", "p(99)<500"],
    "http_req_duration{scenario:replay}": ["p(99)<50"],
    "http_req_duration{scenario:lookup}": ["p(99)<50"],
  },
  summaryTrendStats: ["avg", "p(50)", "p(95)", "p(99)", "max"],
};

export const options: Options = GAPS_MS === undefined ? throughputOptions : gapOptions(GAPS_MS);

const body = JSON.stringify({ template: TEMPLATE, code: "print(6*7)" });

function post(idempotencyKey: string) {
  return http.post(`${BASE_URL}/v1/executions`, body, {
    headers: {
      authorization: `Bearer ${KEY}`,
      "content-type": "application/json",
      "idempotency-key": idempotencyKey,
    },
    tags: { name: "POST /v1/executions" },
  });
}

/** What setup hands every scenario: the id of an execution to look up. */
interface SetupData {
  executionId: string;
}

export function setup(): SetupData {
  if (KEY === "") throw new Error("set SANDFORK_KEY to an API key with the execute scope");
  const first = post(`k6-lookup-${Date.now()}`);
  if (first.status !== 200) throw new Error(`an execution to look up answered ${first.status}`);
  return { executionId: String(first.json("id")) };
}

export function execute(): void {
  const response = post(`k6-${exec.vu.idInTest}-${exec.scenario.iterationInTest}-${Date.now()}`);
  check(response, {
    "status 200": (r) => r.status === 200,
    "completed with 42": (r) =>
      r.status === 200 && r.json("status") === "completed" && r.json("stdout") === "42\n",
  });
}

export function replay(): void {
  const response = post("k6-replay-fixed");
  check(response, { "status 200": (r) => r.status === 200 });
}

export function lookup(data: SetupData): void {
  const response = http.get(`${BASE_URL}/v1/executions/${data.executionId}`, {
    headers: { authorization: `Bearer ${KEY}` },
    tags: { name: "GET /v1/executions/{id}" },
  });
  check(response, { "status 200": (r) => r.status === 200 && r.json("id") === data.executionId });
}

export function afterGap(): void {
  const call = GAP_SCHEDULE[exec.scenario.iterationInTest];
  const gapMs = call === undefined ? undefined : GAPS_MS?.[call.gap];
  if (call === undefined || gapMs === undefined) return;
  if (gapMs > 0) sleep(gapMs / 1000);
  const response = post(`k6-gap-${exec.scenario.iterationInTest}-${Date.now()}`);
  afterGapTrends[call.gap]?.add(response.timings.duration);
  check(response, {
    "completed with 42": (r) =>
      r.status === 200 && r.json("status") === "completed" && r.json("stdout") === "42\n",
  });
}

export function health(): void {
  check(http.get(`${BASE_URL}/healthz`), { "status 200": (r) => r.status === 200 });
}
