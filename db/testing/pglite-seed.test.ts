import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Database } from "../client.js";
import { openDatabase } from "../open.js";
import { accounts } from "../schema.js";
import { accountWithKey } from "./accounts.js";
import { freshDatabase } from "./fresh-database.js";
import { copySeedTo, makeSeed, writeSeedDump } from "./pglite-seed.js";

describe("the PGlite seed", () => {
  const dir = mkdtempSync(join(tmpdir(), "sandfork-seed-test-"));
  const before = process.env.SANDFORK_TEST_PGLITE_SEED;
  // A table of its own in the seed (folder and dump) tells a database made from it from one made from nothing.
  const fromSeed = async (db: Database) => {
    const [row] = await db
      .select({ marked: sql<boolean>`to_regclass('seed_marker') IS NOT NULL` })
      .from(sql`(SELECT 1) AS one`);
    return row;
  };
  // An initdb and the migrations, slow on a busy host: the limit bounds a hang only.
  beforeAll(async () => {
    const seed = join(dir, "seed");
    await makeSeed(seed);
    const open = await openDatabase({ backend: "pglite", dataDir: join(seed, "data") });
    await open.db.execute(sql`CREATE TABLE seed_marker (x int)`);
    await writeSeedDump(open.db, seed);
    await open.close();
    process.env.SANDFORK_TEST_PGLITE_SEED = seed;
  }, 300_000);
  afterAll(() => {
    if (before === undefined) delete process.env.SANDFORK_TEST_PGLITE_SEED;
    else process.env.SANDFORK_TEST_PGLITE_SEED = before;
    rmSync(dir, { recursive: true, force: true });
  });

  it("gives fresh databases that are migrated, empty and independent of each other", async () => {
    const [a, b] = [await freshDatabase("pglite"), await freshDatabase("pglite")];
    try {
      await accountWithKey(a.db, 100);
      const count = async (db: typeof a.db) =>
        (await db.select({ n: sql<number>`count(*)::int` }).from(accounts))[0]?.n;
      expect(await count(a.db)).toBe(1);
      expect(await count(b.db)).toBe(0);
      expect(await fromSeed(b.db)).toEqual({ marked: true });
    } finally {
      await a.dispose();
      await b.dispose();
    }
  });

  it("copies its data folder where none is yet, and leaves an existing one alone", async () => {
    const target = join(dir, "gateway-data");
    await copySeedTo(target);
    const open = await openDatabase({ backend: "pglite", dataDir: target });
    try {
      expect(await open.db.select().from(accounts)).toEqual([]);
      expect(await fromSeed(open.db)).toEqual({ marked: true });
    } finally {
      await open.close();
    }
    const existing = mkdtempSync(join(dir, "existing-"));
    writeFileSync(join(existing, "mine"), "");
    await copySeedTo(existing);
    expect(readdirSync(existing)).toEqual(["mine"]);
  });
});
