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
import { check } from "k6";
import exec from "k6/execution";
import http from "k6/http";
import type { Options } from "k6/options";

const BASE_URL = __ENV.BASE_URL ?? "http://127.0.0.1:8787";
const KEY = __ENV.SANDFORK_KEY ?? "";
const TEMPLATE = __ENV.TEMPLATE ?? "python";
const VUS = Number(__ENV.VUS ?? "16");
const DURATION = __ENV.DURATION ?? "30s";

export const options: Options = {
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

export function health(): void {
  check(http.get(`${BASE_URL}/healthz`), { "status 200": (r) => r.status === 200 });
}
