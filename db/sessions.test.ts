// Session metering: exact accrual of running time and checkpoint storage, charged once per
// unit however often it is accrued, never beyond the account's available credits.
import { randomUUID } from "node:crypto";
import { eq } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { reserve } from "./billing.js";
import { createAccount, getBalance, grantCredits, insertKey } from "./keys.js";
import { usageLedger } from "./schema.js";
import {
  accrue,
  idleRunningSessions,
  insertSession,
  insertSessionsWithin,
  keySessionTotals,
  sessionUsageForKey,
  unitsDue,
} from "./sessions.js";
import { BACKENDS, type FreshDatabase, freshDatabase } from "./testing/fresh-database.js";

const RATES = { unitsPerGibSecond: 10, unitsPerGibHour: 1 };
const GIB = 2 ** 30;

describe("unitsDue", () => {
  it("rounds the whole up once: 1 GiB for 1 s is 10 units, 1 ms of 256 MiB is 1", () => {
    expect(unitsDue(RATES, 1024n * 1000n, 0n)).toBe(10);
    expect(unitsDue(RATES, 256n, 0n)).toBe(1);
    expect(unitsDue(RATES, 0n, BigInt(GIB) * 3_600_000n)).toBe(1);
    expect(unitsDue(RATES, 0n, 1n)).toBe(1);
    expect(unitsDue(RATES, 0n, 0n)).toBe(0);
  });
});

describe.each(BACKENDS)("session metering on %s", (backend) => {
  let fresh: FreshDatabase;
  beforeAll(async () => {
    fresh = await freshDatabase(backend);
  });
  afterAll(async () => {
    await fresh?.dispose();
  });

  async function session(credits: number, memoryMib = 1024) {
    const accountId = await createAccount(fresh.db, "s");
    if (credits > 0) await grantCredits(fresh.db, accountId, credits);
    const key = await insertKey(fresh.db, {
      accountId,
      name: "k",
      hash: randomUUID(),
      hint: "sfk_…s",
      scopes: ["execute"],
      expiresAt: null,
      limits: { rateLimitPerMinute: 60, maxConcurrency: 4, maxBodyBytes: 1024 },
      network: null,
    });
    const start = new Date("2026-01-01T00:00:00Z");
    const row = await insertSession(
      fresh.db,
      {
        id: randomUUID(),
        accountId,
        keyId: key.id,
        tokenId: null,
        template: "python",
        memoryMib,
        idleTimeoutS: 60,
        maxLifetimeS: 3600,
      },
      start,
    );
    return {
      accountId,
      keyId: key.id,
      id: row.id,
      at: (ms: number) => new Date(start.getTime() + ms),
    };
  }

  it("charges running GiB-seconds by the millisecond, the same in one accrual as in many", async () => {
    const one = await session(1_000);
    const many = await session(1_000);
    // 1 GiB for 10.5 s in one step and in 21 steps of 500 ms: ceil(105) = 105 units both ways.
    const once = await accrue(fresh.db, one.id, one.at(10_500), RATES, {
      running: false,
      state: "paused",
    });
    let charged = 0;
    for (let step = 1; step <= 21; step++)
      charged += (await accrue(fresh.db, many.id, many.at(step * 500), RATES)).chargedUnits;
    expect(once.chargedUnits).toBe(105);
    expect(charged).toBe(105);
    expect(once.session).toMatchObject({
      state: "paused",
      runningSince: null,
      runningMibMs: String(1024 * 10_500),
    });
    // Paused: no more running time accrues.
    expect((await accrue(fresh.db, one.id, one.at(60_000), RATES)).chargedUnits).toBe(0);
    expect(await getBalance(fresh.db, one.accountId)).toMatchObject({ balanceUnits: 1_000 - 105 });
  });

  it("charges checkpoint storage by GiB-hour and reports both in the key's usage", async () => {
    const s = await session(1_000, 256);
    await accrue(fresh.db, s.id, s.at(0), RATES, {
      running: false,
      state: "paused",
      checkpointBytes: 2 * GIB,
    });
    const stored = await accrue(fresh.db, s.id, s.at(3_600_000), RATES);
    expect(stored.chargedUnits).toBe(2);
    const usage = await sessionUsageForKey(fresh.db, s.keyId, s.at(-1), s.at(3_600_001));
    expect(usage).toEqual({ units: 2, runningGibSeconds: 0, checkpointGibHours: 2 });
    expect(await keySessionTotals(fresh.db, s.keyId)).toEqual({
      sessions: 1,
      checkpointBytes: 2 * GIB,
    });
    const entries = await fresh.db
      .select()
      .from(usageLedger)
      .where(eq(usageLedger.sessionId, s.id));
    expect(entries.reduce((n, e) => n + e.units, 0)).toBe(2);
  });

  it("never takes more than the account has available, and says it fell short", async () => {
    const s = await session(50);
    // 30 of the 50 units are held by an execution in flight: 20 are available.
    const held = await reserve(fresh.db, {
      executionId: randomUUID(),
      accountId: s.accountId,
      keyId: s.keyId,
      tokenId: null,
      idempotencyKey: null,
      requestHash: "h",
      template: "python",
      gatewayId: "gateway-a",
      units: 30,
    });
    expect(held.kind).toBe("reserved");
    const short = await accrue(fresh.db, s.id, s.at(10_000), RATES);
    expect([short.chargedUnits, short.short]).toEqual([20, true]);
    expect(await getBalance(fresh.db, s.accountId)).toMatchObject({
      balanceUnits: 30,
      reservedUnits: 30,
    });
  });

  it("finds running sessions idle past their own timeout", async () => {
    const s = await session(100);
    await accrue(fresh.db, s.id, s.at(1_000), RATES, { active: true });
    const idleAt = (ms: number) =>
      idleRunningSessions(fresh.db, s.at(ms)).then((rows) => rows.some((r) => r.id === s.id));
    expect(await idleAt(60_999)).toBe(false);
    expect(await idleAt(61_000)).toBe(true);
  });

  it("inserts a key's sessions up to its maximum when gateways insert at once, not one more", async () => {
    const s = await session(100);
    const inserted = await Promise.all(
      Array.from({ length: 8 }, () => insertSessionsWithin(fresh.db, [newSession(s)], s.at(0), 4)),
    );
    // The key's first session (made by session()) counts too.
    expect(inserted.filter((rows) => rows !== undefined)).toHaveLength(3);
    expect((await keySessionTotals(fresh.db, s.keyId)).sessions).toBe(4);
  });

  it("inserts several sessions all together or none when they would pass the maximum", async () => {
    const s = await session(100);
    const three = () => [newSession(s), newSession(s), newSession(s)];
    expect(await insertSessionsWithin(fresh.db, three(), s.at(0), 3)).toBeUndefined();
    expect((await keySessionTotals(fresh.db, s.keyId)).sessions).toBe(1);
    const rows = await insertSessionsWithin(fresh.db, three(), s.at(0), 4);
    expect(rows?.map((row) => row.state)).toEqual(["running", "running", "running"]);
    expect((await keySessionTotals(fresh.db, s.keyId)).sessions).toBe(4);
  });
});

/** A new session of `s`'s key. */
function newSession(s: { accountId: string; keyId: string }) {
  return {
    id: randomUUID(),
    accountId: s.accountId,
    keyId: s.keyId,
    tokenId: null,
    template: "python",
    memoryMib: 256,
    idleTimeoutS: 60,
    maxLifetimeS: 3600,
  };
}
