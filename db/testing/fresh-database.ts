// Test support: a fresh, migrated database per test file, on either backend.
// Postgres: a new database with a random name on the server at TEST_DATABASE_URL, dropped afterwards,
// so test files can run in parallel. PGlite: an in-memory instance, loaded from the run's seed
// when there is one (pglite-seed.ts).
import { randomBytes } from "node:crypto";
import postgres from "postgres";
import type { DatabaseBackend, OpenDatabase } from "../client.js";
import { openDatabase } from "../open.js";
import { seedDump } from "./pglite-seed.js";

export const BACKENDS: DatabaseBackend[] = ["postgres", "pglite"];

function serverUrl(): string {
  const url = process.env.TEST_DATABASE_URL;
  if (!url) {
    throw new Error(
      "TEST_DATABASE_URL is not set: the Postgres variants of these tests need a PostgreSQL server " +
        "(e.g. postgres://postgres@127.0.0.1:54329/postgres). scripts/test.sh starts one and sets it.",
    );
  }
  return url;
}

export interface FreshDatabase extends OpenDatabase {
  /** The database's URL on the server (PostgreSQL); undefined for PGlite. */
  url: string | undefined;
  /** Closes the connection and drops the database. */
  dispose(): Promise<void>;
}

/** An empty database named `prefix`_<random> on the server (default TEST_DATABASE_URL's): its URL, and drop(). */
export async function emptyPostgresDatabase(
  prefix = "sandfork_test",
  adminUrl = serverUrl(),
): Promise<{ url: string; drop(): Promise<void> }> {
  const name = `${prefix}_${randomBytes(6).toString("hex")}`;
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
  try {
    await admin.unsafe(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    async drop() {
      const dropper = postgres(adminUrl, { max: 1, onnotice: () => {} });
      try {
        await dropper.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      } finally {
        await dropper.end();
      }
    },
  };
}

export async function freshDatabase(
  backend: DatabaseBackend,
  options: { maxConnections?: number } = {},
): Promise<FreshDatabase> {
  if (backend === "pglite") {
    const open = await openDatabase({ backend: "pglite", loadDataDir: await seedDump() });
    return { ...open, url: undefined, dispose: () => open.close() };
  }
  const empty = await emptyPostgresDatabase();
  const open = await openDatabase({
    backend: "postgres",
    url: empty.url,
    maxConnections: options.maxConnections ?? 20,
  });
  return {
    ...open,
    url: empty.url,
    dispose: async () => {
      await open.close();
      await empty.drop();
    },
  };
}
