// Test support: an empty, migrated PGlite database made once per test run and copied for each test
// that wants a fresh one. Creating one runs Postgres's initdb and every migration inside PGlite's
// WebAssembly: 3-4.5 s natively, and ~75 s in the KVM tier's QEMU guests (a software CPU, with
// --liftoff-only), where each TypeScript suite used to pay it at least once. Loading the seed's
// dump takes 0.55-0.85 s natively and ~26 s there (README, The KVM test tier).
//
//   tsx db/testing/pglite-seed.ts DIR   makes DIR/data (a PGlite data folder) and DIR/data.tar (its dump)
//
// scripts/test.sh and scripts/kvm-tier.sh make one and name it in SANDFORK_TEST_PGLITE_SEED; without
// it every fresh database is created from nothing, as before. Migrations added since the seed was
// made are applied on open like on any database.

import { existsSync } from "node:fs";
import { cp, mkdir, readFile, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import type { PGlite } from "@electric-sql/pglite";
import type { Database } from "../client.js";
import { openDatabase } from "../open.js";

const SEED_ENV = "SANDFORK_TEST_PGLITE_SEED";

let dump: Promise<Blob | undefined> | undefined;

/** The seed's dump (read once per process), for an in-memory PGlite's loadDataDir; undefined without a seed. */
export function seedDump(): Promise<Blob | undefined> {
  const seed = process.env[SEED_ENV];
  dump ??= seed
    ? readFile(join(seed, "data.tar")).then((bytes) => new Blob([bytes]))
    : Promise.resolve(undefined);
  return dump;
}

/** Copies the seed's data folder to `dataDir` when there is a seed and nothing at `dataDir` yet. */
export async function copySeedTo(dataDir: string): Promise<void> {
  const seed = process.env[SEED_ENV];
  if (!seed || existsSync(dataDir)) return;
  await cp(join(seed, "data"), dataDir, { recursive: true });
}

/** Writes the seed's dump, DIR/data.tar, of the PGlite database behind `db` (open on DIR/data). */
export async function writeSeedDump(db: Database, dir: string): Promise<void> {
  const client = (db as unknown as { $client: PGlite }).$client;
  await writeFile(
    join(dir, "data.tar"),
    Buffer.from(await (await client.dumpDataDir("none")).arrayBuffer()),
  );
}

/** Makes DIR/data, an empty migrated PGlite data folder, and DIR/data.tar, its dump. */
export async function makeSeed(dir: string): Promise<void> {
  await mkdir(dir, { recursive: true });
  const open = await openDatabase({ backend: "pglite", dataDir: join(dir, "data") });
  try {
    await writeSeedDump(open.db, dir);
  } finally {
    await open.close();
  }
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const dir = process.argv[2];
  if (dir === undefined) {
    console.error("usage: tsx db/testing/pglite-seed.ts DIR");
    process.exit(2);
  }
  await makeSeed(dir);
}
