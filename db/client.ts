// Opens the billing database: a PostgreSQL server through postgres.js when a URL is given,
// otherwise embedded PGlite persisted in a data directory (or in memory). Both are migrated on open.
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { PgDatabase, PgQueryResultHKT } from "drizzle-orm/pg-core";
import { drizzle as drizzlePglite } from "drizzle-orm/pglite";
import { migrate as migratePglite } from "drizzle-orm/pglite/migrator";
import { drizzle as drizzlePostgres } from "drizzle-orm/postgres-js";
import { migrate as migratePostgres } from "drizzle-orm/postgres-js/migrator";
import postgres from "postgres";
import {
  JOURNAL_FILE,
  JournaledPGlite,
  type JournaledRecord,
  type JournalReplay,
  RecordJournal,
} from "./record-journal.js";
import { schema } from "./schema.js";

export type Database = PgDatabase<PgQueryResultHKT, typeof schema>;

export type DatabaseBackend = "postgres" | "pglite";

/** The advisory lock migrations run under on PostgreSQL. */
const MIGRATION_LOCK = 7_413_001;

/** A gateway's PostgreSQL sessions are named this followed by its id (see liveGatewayIds). */
export const GATEWAY_APPLICATION_PREFIX = "sandfork-gateway:";

/**
 * What the PGlite record journal does with the database (db/record-journal.ts): fold journaled
 * records into it, and tell which of a set of ids it holds. Billing provides both; db/open.ts
 * wires them, so that this module only opens connections.
 */
export interface DatabaseJournalStore {
  fold(db: Database, records: JournaledRecord[]): Promise<void>;
  recorded(db: Database, ids: string[]): Promise<Set<string>>;
}

export interface OpenDatabase {
  db: Database;
  backend: DatabaseBackend;
  /** PGlite: what its record journal held at open, folded then (db/record-journal.ts). */
  journalReplay?: JournalReplay;
  /**
   * LISTENs on `channel` (on PostgreSQL over a connection of its own), calling `onPayload` with
   * each NOTIFY's payload; resolves once listening, to a function that stops it.
   */
  listen(channel: string, onPayload: (payload: string) => void): Promise<() => Promise<void>>;
  close(): Promise<void>;
}

/** OpenDatabase["listen"]'s type, for those handed only that. */
export type Listen = OpenDatabase["listen"];

export type DatabaseLocation =
  // gatewayId: names the sessions GATEWAY_APPLICATION_PREFIX + id, so other gateways see it alive.
  | { backend: "postgres"; url: string; maxConnections?: number; gatewayId?: string }
  // dataDir undefined: an in-memory database that vanishes on close, made from loadDataDir's
  // dump of a data folder (PGlite's dumpDataDir) when given.
  | { backend: "pglite"; dataDir?: string; loadDataDir?: Blob | undefined };

/** The committed SQL migrations, found beside this module whether run from source or from dist/. */
function migrationsFolder(): string {
  const candidates = [
    new URL("./migrations", import.meta.url),
    new URL("../../db/migrations", import.meta.url),
  ];
  for (const candidate of candidates) {
    const path = fileURLToPath(candidate);
    if (existsSync(path)) return path;
  }
  throw new Error("db/migrations not found next to db/client");
}

export async function openConnection(
  location: DatabaseLocation,
  store: DatabaseJournalStore,
): Promise<OpenDatabase> {
  const migrationsConfig = { migrationsFolder: migrationsFolder() };
  if (location.backend === "postgres") {
    const client = postgres(location.url, {
      max: location.maxConnections ?? 10,
      onnotice: () => {},
      ...(location.gatewayId === undefined
        ? {}
        : {
            connection: { application_name: `${GATEWAY_APPLICATION_PREFIX}${location.gatewayId}` },
          }),
    });
    const db = drizzlePostgres(client, { schema });
    // Processes starting together on an empty database (a cluster's gateways and nodes) migrate
    // it one at a time: the others then find it migrated. On a connection of its own, whose
    // session holds the lock, so a pool of one connection is not waiting on itself.
    const migrator = postgres(location.url, { max: 1, onnotice: () => {} });
    try {
      await migrator`SELECT pg_advisory_lock(${MIGRATION_LOCK})`;
      await migratePostgres(drizzlePostgres(migrator, { schema }), migrationsConfig);
    } finally {
      await migrator.end({ timeout: 5 });
    }
    // A gateway holds one connection of its own for its whole life (never recycled, outside the
    // pool, so a pool of one still serves queries): the pool recycles its connections, and
    // another gateway must never see it without a session and take it for dead.
    const presence =
      location.gatewayId === undefined
        ? undefined
        : postgres(location.url, {
            max: 1,
            max_lifetime: 0,
            onnotice: () => {},
            connection: { application_name: `${GATEWAY_APPLICATION_PREFIX}${location.gatewayId}` },
          });
    if (presence !== undefined) await presence`SELECT 1`;
    return {
      db: db as unknown as Database,
      backend: "postgres",
      listen: async (channel, onPayload) => {
        const { unlisten } = await client.listen(channel, onPayload);
        return unlisten;
      },
      close: async () => {
        await presence?.end({ timeout: 5 });
        await client.end({ timeout: 5 });
      },
    };
  }
  const unlock = location.dataDir === undefined ? () => {} : lockDataDir(location.dataDir);
  try {
    const client =
      location.dataDir === undefined
        ? new JournaledPGlite({ loadDataDir: location.loadDataDir })
        : new JournaledPGlite(location.dataDir);
    const db = drizzlePglite(client, { schema });
    await migratePglite(db, migrationsConfig);
    const database = db as unknown as Database;
    const { journal, replay } = await RecordJournal.open(
      location.dataDir === undefined ? undefined : join(location.dataDir, JOURNAL_FILE),
      {
        fold: (records) => store.fold(database, records),
        recorded: (ids) => store.recorded(database, ids),
      },
    );
    client.journal = journal;
    return {
      db: database,
      backend: "pglite",
      journalReplay: replay,
      listen: async (channel, onPayload) => {
        const unlisten = await client.listen(channel, onPayload);
        return () => unlisten();
      },
      close: async () => {
        try {
          await journal.close();
        } finally {
          await client.close();
          unlock();
        }
      },
    };
  } catch (error) {
    unlock();
    throw error;
  }
}

/** Lock files this process holds. */
const openedHere = new Set<string>();

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * PGlite is one process's database: two processes opening the same directory would corrupt it.
 * A lock file holding the owner's pid keeps a second one out (a dead owner's lock is taken over).
 */
function lockDataDir(dataDir: string): () => void {
  mkdirSync(dataDir, { recursive: true });
  const lockPath = join(dataDir, "sandfork.lock");
  const inUse = (owner: number) =>
    new Error(
      `the embedded database in ${dataDir} is in use by process ${owner}; stop it or use DATABASE_URL`,
    );
  if (openedHere.has(lockPath)) throw inUse(process.pid);
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      writeFileSync(lockPath, String(process.pid), { flag: "wx" });
      openedHere.add(lockPath);
      return () => {
        openedHere.delete(lockPath);
        rmSync(lockPath, { force: true });
      };
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      // Our own pid in a lock we do not hold: left by a crashed earlier process that had this pid.
      const owner = Number(readFileSync(lockPath, "utf8"));
      if (Number.isSafeInteger(owner) && owner > 0 && owner !== process.pid && processAlive(owner))
        throw inUse(owner);
      rmSync(lockPath, { force: true });
    }
  }
  throw new Error(`could not lock ${dataDir}`);
}
