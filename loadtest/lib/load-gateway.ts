// What the load tests measure against: the gateway as `npm start` runs it, in its own process with
// its supervised daemon, on a fresh data directory and a key with credits and limits to spare; and
// the databases it runs on, PGlite and a PostgreSQL server (lib/postgres-server.ts), each fresh.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { emptyPostgresDatabase } from "../../db/testing/fresh-database.js";
import { type GatewayProcess, startGatewayProcess } from "../../gateway/testing/gateway-process.js";
import { DaemonClient } from "../../runtime/daemon-client.js";
import { TEMPLATES_DIR } from "./execution.js";
import type { Call } from "./http-client.js";
import { type Durability, durabilityOf, postgresServer } from "./postgres-server.js";

export type LoadDatabase = "pglite" | "postgres";

/** How long a gateway may take to start: its template check, daemon and database. */
const START_TIMEOUT_MS = 180_000;

/** The databases a --databases list names; anything else fails the command line. */
export function parseDatabases(list: string, fail: (message: string) => never): LoadDatabase[] {
  return list
    .split(",")
    .map((d) =>
      d === "pglite" || d === "postgres" ? d : fail(`--databases: pglite or postgres, got ${d}`),
    );
}

export interface LoadGateway {
  gateway: GatewayProcess;
  /** A client of the same daemon, for the "daemon alone" baseline. */
  daemon: DaemonClient;
  /** The load-test key's authorization header. */
  auth: { authorization: string };
  /** The load-test key and its account. */
  key: { id: string; accountId: string };
  /** The same with a JSON content type. */
  json: { authorization: string; "content-type": string };
}

/** Runs `measure` against a gateway on `databaseUrl` (undefined: PGlite), stopping it after. */
export async function withLoadGateway<T>(
  call: Call,
  options: {
    databaseUrl: string | undefined;
    env?: Record<string, string>;
    nodeArgs?: string[];
    ownSession?: boolean;
  },
  measure: (load: LoadGateway) => Promise<T>,
): Promise<T> {
  const dir = await mkdtemp(join(tmpdir(), "sfk-lt-"));
  const socketPath = join(dir, "vmm.sock");
  const gateway = await startGatewayProcess({
    dataDir: join(dir, "data"),
    socketPath,
    templatesDir: TEMPLATES_DIR,
    // A busy machine (others building beside the measurement) can take a minute to open PGlite
    // or to start the daemon.
    startTimeoutMs: START_TIMEOUT_MS,
    ...options,
    env: { SANDFORK_VMM_READY_TIMEOUT_MS: String(START_TIMEOUT_MS), ...options.env },
  });
  const daemon = new DaemonClient({ socketPath, connections: 4 });
  try {
    if (gateway.admin === undefined)
      throw new Error("the gateway printed no admin key on its fresh database");
    const admin = {
      authorization: `Bearer ${gateway.admin.key}`,
      "content-type": "application/json",
    };
    const created = await call(
      "POST",
      `${gateway.url}/v1/keys`,
      admin,
      JSON.stringify({
        name: "loadtest",
        credits: 1_000_000_000_000,
        rate_limit_per_minute: 1_000_000,
        max_concurrency: 10_000,
      }),
    );
    if (created.status !== 201)
      throw new Error(`creating the load-test key: ${created.status} ${created.body}`);
    const key = JSON.parse(created.body) as { key: string; id: string; account_id: string };
    const auth = { authorization: `Bearer ${key.key}` };
    await daemon.connect();
    return await measure({
      gateway,
      daemon,
      auth,
      key: { id: key.id, accountId: key.account_id },
      json: { ...auth, "content-type": "application/json" },
    });
  } finally {
    daemon.close();
    await gateway.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * Runs `measure` on each database in turn: PGlite in the gateway's data directory, PostgreSQL in
 * a fresh database on the load tests' server (started here when none is given, stopped after).
 * Also answers how that server makes a commit durable, which its figures include.
 */
export async function onEachDatabase<T>(
  databases: LoadDatabase[],
  freshName: string,
  measure: (database: LoadDatabase, databaseUrl: string | undefined) => Promise<T>,
): Promise<{ runs: Partial<Record<LoadDatabase, T>>; postgresDurability: Durability | undefined }> {
  const runs: Partial<Record<LoadDatabase, T>> = {};
  let pg: { url: string; stop(): void } | undefined;
  let postgresDurability: Durability | undefined;
  try {
    for (const database of databases) {
      if (database === "pglite") {
        runs.pglite = await measure("pglite", undefined);
        continue;
      }
      pg ??= postgresServer({ dirName: "sandfork-loadtest-pg", port: 54341 });
      postgresDurability = await durabilityOf(pg.url);
      const fresh = await emptyPostgresDatabase(freshName, pg.url);
      try {
        runs.postgres = await measure("postgres", fresh.url);
      } finally {
        await fresh.drop();
      }
    }
  } finally {
    pg?.stop();
  }
  return { runs, postgresDurability };
}
