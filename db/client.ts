// Opens the billing database: a PostgreSQL server through postgres.js when a URL is given,
// otherwise embedded PGlite persisted in a data directory (or in memory). Both are migrated on open.
import { existsSync, mkdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { PGlite } from "@electric-sql/pglite";
import type { PgDatabase, PgQueryResultHKT } from "drizzle-orm/pg-core";
import { drizzle as drizzlePglite } from "drizzle-orm/pglite";
import { migrate as migratePglite } from "drizzle-orm/pglite/migrator";
import { drizzle as drizzlePostgres } from "drizzle-orm/postgres-js";
import { migrate as migratePostgres } from "drizzle-orm/postgres-js/migrator";
import postgres from "postgres";
import { schema } from "./schema.js";

export type Database = PgDatabase<PgQueryResultHKT, typeof schema>;

export type DatabaseBackend = "postgres" | "pglite";

export interface OpenDatabase {
  db: Database;
  backend: DatabaseBackend;
  close(): Promise<void>;
}

export type DatabaseLocation =
  | { backend: "postgres"; url: string; maxConnections?: number }
  // dataDir undefined: an in-memory database that vanishes on close.
  | { backend: "pglite"; dataDir?: string };

/** The committed SQL migrations, found beside this module whether run from source or from dist/. */
export function migrationsFolder(): string {
  const candidates = [new URL("./migrations", import.meta.url), new URL("../../db/migrations", import.meta.url)];
  for (const candidate of candidates) {
    const path = fileURLToPath(candidate);
    if (existsSync(path)) return path;
  }
  throw new Error("db/migrations not found next to db/client");
}

export async function openDatabase(location: DatabaseLocation): Promise<OpenDatabase> {
  const migrationsConfig = { migrationsFolder: migrationsFolder() };
  if (location.backend === "postgres") {
    const client = postgres(location.url, { max: location.maxConnections ?? 10, onnotice: () => {} });
    const db = drizzlePostgres(client, { schema });
    await migratePostgres(db, migrationsConfig);
    return { db: db as unknown as Database, backend: "postgres", close: () => client.end({ timeout: 5 }) };
  }
  if (location.dataDir !== undefined) mkdirSync(location.dataDir, { recursive: true });
  const client = location.dataDir === undefined ? new PGlite() : new PGlite(location.dataDir);
  const db = drizzlePglite(client, { schema });
  await migratePglite(db, migrationsConfig);
  return { db: db as unknown as Database, backend: "pglite", close: () => client.close() };
}
