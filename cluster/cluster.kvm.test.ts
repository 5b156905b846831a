// The cluster on one host, on KVM: two nodes (cluster/node-main.ts, each its own supervised
// daemon) on loopback behind mutual TLS, one gateway with SANDFORK_RUNTIME=cluster, a fresh
// database on the PostgreSQL server at TEST_DATABASE_URL, sessions on one shared root. Executions
// spread over both nodes; when a node is SIGKILLed (its process and its daemon) the executions
// it was running answer 503 retryable and are billed nothing, new ones are served by the other
// node, and a session paused on it resumes on the other with its state. The multi-host test with
// network namespaces and HAProxy is `npm run test:cluster` (cluster/testing/cluster-run.ts).
import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { emptyPostgresDatabase } from "../db/testing/fresh-database.js";
import {
  freePort,
  GATEWAY_LISTENING,
  GATEWAY_MAIN,
  issueKey,
  printedAdmin,
  type ServiceProcess,
} from "../gateway/testing/gateway-process.js";
import {
  scaledDaemonReadyEnv,
  templatesWithPrebuilt,
  timeScale,
} from "../gateway/testing/kvm-tier.js";
import { DaemonClient } from "../runtime/daemon-client.js";
import { requireVmmBinary } from "../runtime/testing/real-daemon.js";
import { makeClusterCerts, tlsEnv } from "./testing/certs.js";
import { NODE_MAIN, NODE_READY, startOnHost } from "./testing/service-process.js";

const NODES = ["n1", "n2"] as const;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

let dir: string;
let database: { url: string; drop(): Promise<void> };
let sql: postgres.Sql;
const nodes = new Map<string, ServiceProcess>();
let gateway: ServiceProcess;
let url: string;
let key: string;

const socketOf = (node: string) => join(dir, node, "run", "sandfork-vmm.sock");

async function call(
  path: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: Record<string, unknown> }> {
  const response = await fetch(`${url}${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(60_000 * timeScale),
  });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

/** Executions the node's daemon has run, asked at its socket. */
async function executionsOn(node: string): Promise<number> {
  const client = new DaemonClient({ socketPath: socketOf(node), connections: 1 });
  try {
    await client.connect();
    return (await client.stats()).executions;
  } finally {
    client.close();
  }
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "sfk-cluster-kvm-"));
  const templates = await templatesWithPrebuilt(dir, ["python"]);
  database = await emptyPostgresDatabase("sandfork_cluster");
  sql = postgres(database.url, { max: 1, onnotice: () => {} });
  const certs = makeClusterCerts(join(dir, "certs"));
  const common = {
    DATABASE_URL: database.url,
    SANDFORK_TEMPLATES: "python",
    SANDFORK_VMM_BIN: requireVmmBinary(),
    SANDFORK_TEMPLATES_DIR: templates,
    SANDFORK_SESSIONS_ROOT: join(dir, "sessions"),
    SANDFORK_VMM_BOOT_TIMEOUT_MS: String(30_000 * timeScale),
    ...scaledDaemonReadyEnv,
  };
  // One after the other: the first builds what the templates folder lacks.
  for (const name of NODES)
    nodes.set(
      name,
      await startOnHost({
        main: NODE_MAIN,
        ready: NODE_READY,
        startTimeoutMs: 180_000 * timeScale,
        env: {
          ...common,
          ...tlsEnv(certs.node),
          SANDFORK_NODE_ID: name,
          SANDFORK_NODE_LISTEN: `127.0.0.1:${await freePort()}`,
          SANDFORK_DATA_DIR: join(dir, name),
          SANDFORK_VMM_SERVE_ARGS: "--pool-size 1",
        },
      }),
    );
  gateway = await startOnHost({
    main: GATEWAY_MAIN,
    ready: GATEWAY_LISTENING,
    startTimeoutMs: 60_000 * timeScale,
    env: {
      ...common,
      ...tlsEnv(certs.gateway),
      SANDFORK_RUNTIME: "cluster",
      // Room for the tests' 12 executions at once whatever the cores (the default is four
      // a core running and as many waiting: a one-vCPU QEMU guest would shed some with 503).
      SANDFORK_TEMPLATE_MAX_RUNNING: "16",
      SANDFORK_TEMPLATE_MAX_QUEUED: "16",
      PORT: String(await freePort()),
      SANDFORK_DATA_DIR: join(dir, "gateway"),
    },
  });
  url = gateway.ready[1] as string;
  ({ key } = await issueKey(
    { url, admin: printedAdmin(gateway.log), log: gateway.log },
    "cluster",
    1_000_000,
  ));
  // Until the gateway has connected to both nodes.
  for (let i = 0; i < 100 && !gateway.log.join("\n").includes("node n2: connected"); i++)
    await sleep(100 * timeScale);
});

afterAll(async () => {
  await gateway?.stop();
  for (const node of nodes.values()) await node.stop();
  await sql?.end();
  await database?.drop();
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

describe("a cluster of two nodes and a gateway", () => {
  it("spreads executions over both nodes", async () => {
    const before = await Promise.all(NODES.map(executionsOn));
    const answers = await Promise.all(
      Array.from({ length: 12 }, () =>
        call("/v1/executions", { template: "python", code: "print(6*7)" }),
      ),
    );
    for (const answer of answers)
      expect(answer.body).toMatchObject({ status: "completed", stdout: "42\n" });
    const after = await Promise.all(NODES.map(executionsOn));
    for (const [i] of NODES.entries())
      expect((after[i] as number) - (before[i] as number)).toBeGreaterThan(0);
  });

  it(
    "a node killed mid-run: its executions answer 503 retryable, billed nothing; its paused session resumes on the other",
    async () => {
      const created = await call("/v1/sessions", { template: "python" });
      const id = created.body.id as string;
      expect((await call(`/v1/sessions/${id}/executions`, { code: "x = 41" })).status).toBe(200);
      expect((await call(`/v1/sessions/${id}/pause`, {})).status).toBe(201);
      const [{ node_id: victim }] =
        (await sql`select node_id from sessions where id = ${id}`) as unknown as [
          { node_id: string },
        ];
      const survivor = NODES.find((n) => n !== victim) as string;

      // Sleeping executions on both nodes, each with its own Idempotency-Key, still asleep when
      // the node is killed (its wait below is scaled on a software CPU: so is the sleep).
      const asleep = Math.min(2 * timeScale, 20);
      const sleepers = Array.from({ length: 8 }, (_, i) =>
        call(
          "/v1/executions",
          {
            template: "python",
            code: `import time\ntime.sleep(${asleep})\nprint('woke')`,
            timeout_ms: (asleep + 8) * 1000,
          },
          {
            "idempotency-key": `sleeper-${i}`,
          },
        ),
      );
      await sleep(700 * timeScale);
      const daemonPid = Number(readFileSync(`${socketOf(victim)}.pid`, "utf8").split(" ")[0]);
      await (nodes.get(victim) as ServiceProcess).stop("SIGKILL");
      process.kill(daemonPid, "SIGKILL");
      const answers = await Promise.all(sleepers);

      const cutOff = answers.filter((a) => a.status !== 200);
      expect(cutOff.length, "executions that were running on the killed node").toBeGreaterThan(0);
      expect(
        answers.filter((a) => a.status === 200).length,
        "executions on the other node",
      ).toBeGreaterThan(0);
      for (const a of cutOff) expect(a).toMatchObject({ status: 503, body: { retryable: true } });
      for (const a of answers.filter((x) => x.status === 200)) expect(a.body.stdout).toBe("woke\n");
      const billed =
        await sql`select count(*)::int as n from executions where idempotency_key like 'sleeper-%' and status = 'completed'`;
      expect(billed[0]?.n).toBe(answers.length - cutOff.length);
      const charged =
        await sql`select count(*)::int as n from executions where status = 'aborted' and charged_units > 0`;
      expect(charged[0]?.n).toBe(0);

      // Served again by the survivor, at once or once the dead node is drained.
      let again = await call("/v1/executions", { template: "python", code: "print(6*7)" });
      for (let i = 0; i < 20 && again.status !== 200; i++) {
        await sleep(500);
        again = await call("/v1/executions", { template: "python", code: "print(6*7)" });
      }
      expect(again.body).toMatchObject({ status: "completed", stdout: "42\n" });

      let cell = await call(`/v1/sessions/${id}/executions`, { code: "x + 1" });
      for (let i = 0; i < 20 && cell.status !== 200; i++) {
        await sleep(500);
        cell = await call(`/v1/sessions/${id}/executions`, { code: "x + 1" });
      }
      expect(cell.body).toMatchObject({ value: "42", resumed: true });
      const [{ node_id: now }] =
        (await sql`select node_id from sessions where id = ${id}`) as unknown as [
          { node_id: string },
        ];
      expect(now).toBe(survivor);
    },
    120_000 * timeScale,
  );
});
