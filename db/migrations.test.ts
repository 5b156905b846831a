// Migrations that move data: a database at an earlier migration, with rows in it, migrated to the
// current schema, on both backends.
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { PGlite } from "@electric-sql/pglite";
import { drizzle as drizzlePglite } from "drizzle-orm/pglite";
import { migrate as migratePglite } from "drizzle-orm/pglite/migrator";
import { drizzle as drizzlePostgres } from "drizzle-orm/postgres-js";
import { migrate as migratePostgres } from "drizzle-orm/postgres-js/migrator";
import postgres from "postgres";
import { afterEach, describe, expect, it } from "vitest";
import type { Database, DatabaseBackend } from "./client.js";
import { openDatabase } from "./open.js";
import { schema } from "./schema.js";
import { BACKENDS, emptyPostgresDatabase } from "./testing/fresh-database.js";
import { usageForKey } from "./usage.js";

const MIGRATIONS = fileURLToPath(new URL("./migrations", import.meta.url));

/** A copy of the migrations folder that ends after the migration tagged `lastTag`. */
function migrationsUpTo(lastTag: string): string {
  const dir = mkdtempSync(join(tmpdir(), "sfk-migrations-"));
  cpSync(MIGRATIONS, dir, { recursive: true });
  const journalPath = join(dir, "meta", "_journal.json");
  const journal = JSON.parse(readFileSync(journalPath, "utf8")) as { entries: { tag: string }[] };
  const last = journal.entries.findIndex((e) => e.tag === lastTag);
  if (last < 0) throw new Error(`no migration ${lastTag}`);
  writeFileSync(
    journalPath,
    JSON.stringify({ ...journal, entries: journal.entries.slice(0, last + 1) }),
  );
  return dir;
}

/** An empty database on `backend`, with raw SQL, the migrator and drizzle over one connection. */
interface EmptyDatabase {
  query<T>(text: string, params?: string[]): Promise<T[]>;
  migrate(folder: string): Promise<void>;
  db: Database;
  close(): Promise<void>;
}

async function emptyDatabase(backend: DatabaseBackend): Promise<EmptyDatabase> {
  if (backend === "pglite") {
    const pg = new PGlite();
    return {
      query: async <T>(text: string, params: string[] = []) =>
        (await pg.query<T>(text, params)).rows,
      migrate: (folder) => migratePglite(drizzlePglite(pg), { migrationsFolder: folder }),
      db: drizzlePglite(pg, { schema }) as unknown as Database,
      close: () => pg.close(),
    };
  }
  const empty = await emptyPostgresDatabase("sandfork_migration");
  const client = postgres(empty.url, { max: 1, onnotice: () => {} });
  return {
    query: async <T>(text: string, params: string[] = []) =>
      (await client.unsafe(text, params)) as unknown as T[],
    migrate: (folder) => migratePostgres(drizzlePostgres(client), { migrationsFolder: folder }),
    db: drizzlePostgres(client, { schema }) as unknown as Database,
    close: async () => {
      await client.end();
      await empty.drop();
    },
  };
}

// Each test makes an empty database (on PGlite an initdb) and migrates it twice: work a busy host
// makes many times slower. Their limit bounds a hang only; they assert no speed.
const MIGRATING_TEST_LIMIT_MS = 300_000;

describe.each(BACKENDS)("0005 on %s: an execution's charge lives in its record only", (backend) => {
  const cleanup: (() => Promise<void>)[] = [];
  afterEach(async () => {
    for (const step of cleanup.splice(0)) await step();
  });

  /** A database at 0004 with a grant and two billed executions, each with its ledger usage row. */
  async function billedAt0004(): Promise<{
    pg: EmptyDatabase;
    db: Database;
    keyId: string;
    accountId: string;
  }> {
    const pg = await emptyDatabase(backend);
    const db = pg.db;
    const older = migrationsUpTo("0004_credit_leases");
    cleanup.push(async () => {
      await pg.close();
      rmSync(older, { recursive: true, force: true });
    });
    await pg.migrate(older);
    const [{ id: accountId }] = (await pg.query<{ id: string }>(
      `INSERT INTO accounts (name, balance_units) VALUES ('a', 93) RETURNING id`,
    )) as [{ id: string }];
    const [{ id: keyId }] = (await pg.query<{ id: string }>(
      `INSERT INTO api_keys (account_id, name, key_hash, hint, scopes, rate_limit_per_minute, max_concurrency, max_body_bytes)
         VALUES ($1, 'k', 'hash', 'sfk_…', '{execute}', 60, 4, 1024) RETURNING id`,
      [accountId],
    )) as [{ id: string }];
    await pg.query(`INSERT INTO usage_ledger (account_id, kind, units) VALUES ($1, 'grant', 100)`, [
      accountId,
    ]);
    for (const [template, units] of [
      ["python", 3],
      ["node", 4],
    ] as const) {
      const [{ id }] = (await pg.query<{ id: string }>(
        `INSERT INTO executions (id, account_id, key_id, request_hash, template, status, reserved_units, charged_units, finished_at)
           VALUES (gen_random_uuid(), $1, $2, 'h', $3, 'completed', 10, $4, now()) RETURNING id`,
        [accountId, keyId, template, String(units)],
      )) as [{ id: string }];
      await pg.query(
        `INSERT INTO usage_ledger (account_id, key_id, execution_id, kind, template, units) VALUES ($1, $2, $3, 'usage', $4, $5)`,
        [accountId, keyId, id, template, String(units)],
      );
    }
    return { pg, db, keyId, accountId };
  }

  it(
    "drops the ledger's usage rows that repeat their records; usage reads the same from the records",
    async () => {
      const { pg, db, keyId } = await billedAt0004();
      await pg.migrate(MIGRATIONS);
      const kinds = (
        await pg.query<{ kind: string }>(`SELECT kind FROM usage_ledger ORDER BY kind`)
      ).map((r) => r.kind);
      expect(kinds).toEqual(["grant"]);
      const usage = await usageForKey(
        db,
        keyId,
        new Date(Date.now() - 60_000),
        new Date(Date.now() + 60_000),
      );
      expect(usage).toEqual({
        executions: 2,
        units: 7,
        byTemplate: [
          { template: "node", executions: 1, units: 4 },
          { template: "python", executions: 1, units: 3 },
        ],
        network: { bytesIn: 0, bytesOut: 0, refused: 0 },
      });
    },
    MIGRATING_TEST_LIMIT_MS,
  );

  it(
    "refuses to migrate, changing nothing, when a usage row says other than its record",
    async () => {
      const { pg } = await billedAt0004();
      await pg.query(
        `UPDATE usage_ledger SET units = units + 1 WHERE kind = 'usage' AND template = 'node'`,
      );
      await expect(pg.migrate(MIGRATIONS)).rejects.toThrow(/differ from their executions/);
      const kinds = (
        await pg.query<{ kind: string }>(`SELECT kind FROM usage_ledger ORDER BY kind`)
      ).map((r) => r.kind);
      expect(kinds).toEqual(["grant", "usage", "usage"]);
    },
    MIGRATING_TEST_LIMIT_MS,
  );
});

describe("processes migrating one empty PostgreSQL database at once", () => {
  it("migrate it one at a time: every one opens it", async () => {
    const empty = await emptyPostgresDatabase("sandfork_migrate_race");
    try {
      const opened = await Promise.allSettled(
        Array.from({ length: 4 }, () =>
          openDatabase({ backend: "postgres", url: empty.url, maxConnections: 2 }),
        ),
      );
      for (const open of opened) if (open.status === "fulfilled") await open.value.close();
      expect(opened.map((o) => (o.status === "fulfilled" ? "opened" : String(o.reason)))).toEqual(
        Array(4).fill("opened"),
      );
    } finally {
      await empty.drop();
    }
  });
});
