// Prepared statements on PGlite through our own wire messages (db/pglite-wire.ts), against a real
// PGlite: text both ways, NULLs, multi-byte text, no result, errors as PGlite throws them.
import { PGlite, protocol } from "@electric-sql/pglite";
import { drizzle } from "drizzle-orm/pglite";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import type { Database } from "./client.js";
import { bindExecuteSync, readResponse } from "./pglite-wire.js";
import { runPrepared } from "./prepared.js";
import { seedDump } from "./testing/pglite-seed.js";

describe("prepared statements on PGlite", () => {
  let pg: PGlite;
  let db: Database;
  beforeAll(async () => {
    // From the test run's seed where there is one: an initdb is slow on a busy host.
    const seed = await seedDump();
    pg = new PGlite(seed === undefined ? {} : { loadDataDir: seed });
    db = drizzle(pg) as unknown as Database;
    await pg.exec("CREATE TABLE wire (id int PRIMARY KEY, note text)");
  });
  afterAll(async () => {
    await pg.close();
  });

  it("sends and answers text as it is: NULL, empty, multi-byte, long", async () => {
    const echo = {
      name: "wire_echo",
      text: "SELECT $1::text AS a, $2::text AS b, $3::text AS c, length($4::text)::text AS long",
    };
    const long = "x".repeat(100_000);
    for (let i = 0; i < 2; i++) {
      expect(await runPrepared(db, echo, [null, "", "ü€😀 \n\t\"'", long])).toEqual([
        { a: null, b: "", c: "ü€😀 \n\t\"'", long: "100000" },
      ]);
    }
  });

  it("leaves PGlite's own message parser out of a successful call (it would also keep what it parsed)", async () => {
    const echo = { name: "wire_parser", text: "SELECT $1::text AS a" };
    await runPrepared(db, echo, ["first"]);
    const parse = vi.spyOn(protocol.Parser.prototype, "parse");
    try {
      for (let i = 0; i < 50; i++)
        expect(await runPrepared(db, echo, [String(i)])).toEqual([{ a: String(i) }]);
      expect(parse).not.toHaveBeenCalled();
    } finally {
      parse.mockRestore();
    }
  });

  it("answers no rows for a statement without a result, and every row of one with several", async () => {
    const insert = {
      name: "wire_insert",
      text: "INSERT INTO wire (id, note) VALUES ($1::int, $2)",
    };
    expect(await runPrepared(db, insert, ["1", "one"])).toEqual([]);
    expect(await runPrepared(db, insert, ["2", null])).toEqual([]);
    const all = { name: "wire_all", text: "SELECT id::text, note FROM wire ORDER BY id" };
    expect(await runPrepared(db, all, [])).toEqual([
      { id: "1", note: "one" },
      { id: "2", note: null },
    ]);
  });

  it("throws PGlite's own error, and the statement stays usable after its first call failed", async () => {
    const claim = {
      name: "wire_claim",
      text: "INSERT INTO wire (id, note) VALUES ($1::int, 'claimed') RETURNING id::text",
    };
    await expect(runPrepared(db, claim, ["1"])).rejects.toMatchObject({
      code: "23505",
      constraint: "wire_pkey",
    });
    expect(await runPrepared(db, claim, ["3"])).toEqual([{ id: "3" }]);
    await expect(
      runPrepared(db, { name: "wire_bad", text: "SELECT nonsense FROM" }, []),
    ).rejects.toMatchObject({ code: "42601" });
  });

  it("refuses a truncated or malformed response rather than reading past it", () => {
    const bind = bindExecuteSync("s", ["abc"]);
    expect(bind[0]).toBe(0x42);
    expect(bind.readInt32BE(1)).toBe(bind.length - 1 - 15);
    const dataRow = Buffer.from([0x44, 0, 0, 0, 20, 0, 1, 0, 0, 0, 3, 0x61]);
    expect(() => readResponse(dataRow)).toThrow(/malformed/);
    expect(() => readResponse(Buffer.from([0x43, 0xff, 0xff, 0xff, 0xf0]))).toThrow(/malformed/);
  });
});
