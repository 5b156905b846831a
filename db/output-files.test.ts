import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  deleteExpiredOutputFiles,
  findOutputFile,
  keepOutputFile,
  keptBytesOfKey,
  listOutputFiles,
  type OutputFileOwner,
} from "./output-files.js";
import { BACKENDS, type FreshDatabase, freshDatabase } from "./testing/fresh-database.js";

/** Every byte value, twice: what a text column would mangle. */
const BINARY = Buffer.from([...Array(512).keys()].map((i) => i % 256));

describe.each(BACKENDS)("output files on %s", (backend) => {
  let fresh: FreshDatabase;
  beforeAll(async () => {
    fresh = await freshDatabase(backend);
  });
  afterAll(async () => {
    await fresh?.dispose();
  });

  const owner = (o: Partial<OutputFileOwner> = {}): OutputFileOwner => ({
    executionId: randomUUID(),
    accountId: randomUUID(),
    keyId: randomUUID(),
    tokenId: null,
    expiresAt: new Date(Date.now() + 3_600_000),
    quotaBytes: 10_000,
    ...o,
  });

  it("keeps a file byte for byte and lists an execution's files in path order", async () => {
    const o = owner({ tokenId: "tok-1" });
    expect(await keepOutputFile(fresh.db, o, "z/last.bin", BINARY)).toBe(true);
    expect(await keepOutputFile(fresh.db, o, "a.txt", Buffer.from("hi"))).toBe(true);
    const found = await findOutputFile(fresh.db, o.executionId, "z/last.bin");
    expect(found?.content.equals(BINARY)).toBe(true);
    expect(found).toMatchObject({
      accountId: o.accountId,
      keyId: o.keyId,
      tokenId: "tok-1",
      bytes: BINARY.length,
    });
    expect(await listOutputFiles(fresh.db, o.executionId)).toEqual([
      { path: "a.txt", bytes: 2, expiresAt: o.expiresAt },
      { path: "z/last.bin", bytes: BINARY.length, expiresAt: o.expiresAt },
    ]);
    expect(await findOutputFile(fresh.db, o.executionId, "missing")).toBeUndefined();
    expect(await findOutputFile(fresh.db, randomUUID(), "a.txt")).toBeUndefined();
  });

  it("counts a key's unexpired files against its quota, concurrent keeps one after the other", async () => {
    const keyId = randomUUID();
    const file = Buffer.alloc(30, 7);
    // Ten keeps at once of 30 bytes each into 100: exactly three fit.
    const kept = await Promise.all(
      Array.from({ length: 10 }, () =>
        keepOutputFile(fresh.db, owner({ keyId, quotaBytes: 100 }), "f", file),
      ),
    );
    expect(kept.filter(Boolean)).toHaveLength(3);
    expect(await keptBytesOfKey(fresh.db, keyId)).toBe(90);
    // Exactly up to the quota is room; another key's files are not counted.
    expect(
      await keepOutputFile(fresh.db, owner({ keyId, quotaBytes: 100 }), "g", file.subarray(0, 10)),
    ).toBe(true);
    expect(
      await keepOutputFile(fresh.db, owner({ keyId, quotaBytes: 100 }), "h", Buffer.alloc(1)),
    ).toBe(false);
    expect(await keepOutputFile(fresh.db, owner({ quotaBytes: 100 }), "f", file)).toBe(true);
  });

  it("neither serves nor counts an expired file, and the sweep deletes it", async () => {
    const keyId = randomUUID();
    const past = owner({ keyId, expiresAt: new Date(Date.now() - 1000), quotaBytes: 10 });
    expect(await keepOutputFile(fresh.db, past, "old", Buffer.alloc(10))).toBe(true);
    expect(await findOutputFile(fresh.db, past.executionId, "old")).toBeUndefined();
    expect(await listOutputFiles(fresh.db, past.executionId)).toEqual([]);
    expect(await keptBytesOfKey(fresh.db, keyId)).toBe(0);
    const live = owner({ keyId, quotaBytes: 10 });
    expect(await keepOutputFile(fresh.db, live, "new", Buffer.alloc(10))).toBe(true);
    expect(await deleteExpiredOutputFiles(fresh.db, new Date())).toBeGreaterThanOrEqual(1);
    expect(await findOutputFile(fresh.db, live.executionId, "new")).toBeDefined();
    // The sweep at a later time takes the live one too.
    await deleteExpiredOutputFiles(fresh.db, new Date(Date.now() + 7_200_000));
    expect(await findOutputFile(fresh.db, live.executionId, "new")).toBeUndefined();
    expect(await keptBytesOfKey(fresh.db, keyId)).toBe(0);
  });
});
