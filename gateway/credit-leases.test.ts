import { randomUUID } from "node:crypto";
import { eq } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { getBalance, revokeKey } from "../db/keys.js";
import { leasedUnits } from "../db/leases.js";
import { creditLeases } from "../db/schema.js";
import { accountWithKey } from "../db/testing/accounts.js";
import { BACKENDS, type FreshDatabase, freshDatabase } from "../db/testing/fresh-database.js";
import { leasedExecution } from "../db/testing/leased-execution.js";
import { CreditLeases } from "./credit-leases.js";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe.each(BACKENDS)("a gateway's credit leases on %s", (backend) => {
  let fresh: FreshDatabase;
  beforeAll(async () => {
    fresh = await freshDatabase(backend);
  });
  afterAll(async () => {
    await fresh?.dispose();
  });

  const leasesOf = (
    options: Partial<{
      holdsPerLease: number;
      lingerMs: number | null;
      keyCheckMs: number;
      listen: FreshDatabase["listen"];
    }> = {},
  ) =>
    new CreditLeases({
      db: fresh.db,
      gatewayId: randomUUID(),
      holdsPerLease: 4,
      lingerMs: 60_000,
      keyCheckMs: 60_000,
      ...options,
    });

  it("holds against one lease in memory, growing it by holdsPerLease holds when short; the database agrees", async () => {
    const ids = await accountWithKey(fresh.db, 1_000);
    const leases = leasesOf();
    for (let i = 0; i < 4; i++)
      expect(await leases.hold(ids.accountId, ids.keyId, 5)).toEqual({ kind: "held" });
    expect(leases.leaseOn(ids.accountId)).toEqual({ units: 20, held: 20 });
    expect(await leases.hold(ids.accountId, ids.keyId, 5)).toEqual({ kind: "held" });
    expect(leases.leaseOn(ids.accountId)).toEqual({ units: 40, held: 25 });
    expect(await leasedUnits(fresh.db, leases.gatewayId, ids.accountId)).toBe(40);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      reservedUnits: 40,
      availableUnits: 960,
    });
    // Callers see what nothing holds as available.
    expect(leases.asSeenByCallers((await getBalance(fresh.db, ids.accountId))!)).toMatchObject({
      reservedUnits: 25,
      availableUnits: 975,
    });
  });

  it("a free execution (a hold of 0) on an account without credits holds and records", async () => {
    const ids = await accountWithKey(fresh.db, 0);
    const leases = leasesOf();
    expect(await leases.hold(ids.accountId, ids.keyId, 0)).toEqual({ kind: "held" });
    expect(await leases.record(leasedExecution(ids, leases.gatewayId, 0, 0))).toMatchObject({
      chargedUnits: 0,
      reservedUnits: 0,
    });
    expect(await leases.hold(ids.accountId, ids.keyId, 1)).toEqual({
      kind: "insufficient-credits",
      availableUnits: 0,
    });
  });

  it("concurrent holds share one growth of the lease", async () => {
    const ids = await accountWithKey(fresh.db, 1_000);
    const leases = leasesOf();
    const outcomes = await Promise.all(
      Array.from({ length: 4 }, () => leases.hold(ids.accountId, ids.keyId, 5)),
    );
    expect(outcomes).toEqual(Array.from({ length: 4 }, () => ({ kind: "held" })));
    expect(leases.leaseOn(ids.accountId)).toEqual({ units: 20, held: 20 });
  });

  it("refuses a hold the account cannot cover, counting what the lease still has free as available", async () => {
    const ids = await accountWithKey(fresh.db, 12);
    const leases = leasesOf();
    expect(await leases.hold(ids.accountId, ids.keyId, 5)).toEqual({ kind: "held" });
    expect(await leases.hold(ids.accountId, ids.keyId, 5)).toEqual({ kind: "held" });
    expect(await leases.hold(ids.accountId, ids.keyId, 5)).toEqual({
      kind: "insufficient-credits",
      availableUnits: 2,
    });
    expect(leases.leaseOn(ids.accountId)).toEqual({ units: 12, held: 10 });
  });

  it("a record spends its charge and frees its hold; a refused record frees the hold and charges nothing", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    const leases = leasesOf();
    await leases.hold(ids.accountId, ids.keyId, 10);
    await leases.hold(ids.accountId, ids.keyId, 10);
    const record = await leases.record(leasedExecution(ids, leases.gatewayId, 10, 3));
    expect(record.chargedUnits).toBe(3);
    expect(leases.leaseOn(ids.accountId)).toEqual({ units: 37, held: 10 });
    // NUL is refused by the database (the daemon client never sends it).
    const refused = leasedExecution(ids, leases.gatewayId, 10, 3);
    refused.settlement.stdout = "bad\u0000";
    await expect(leases.record(refused)).rejects.toThrow();
    expect(leases.leaseOn(ids.accountId)).toEqual({ units: 37, held: 0 });
    expect(await leasedUnits(fresh.db, leases.gatewayId, ids.accountId)).toBe(37);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 97,
      reservedUnits: 37,
    });
  });

  it("gives back what nothing holds: after lingerMs, on demand (only the free part), and all at shutdown", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    const lingering = leasesOf({ lingerMs: 20 });
    await lingering.hold(ids.accountId, ids.keyId, 5);
    lingering.drop(ids.accountId, 5);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ reservedUnits: 20 });
    await sleep(200);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ reservedUnits: 0 });
    expect(lingering.leaseOn(ids.accountId)).toEqual({ units: 0, held: 0 });

    const leases = leasesOf();
    await leases.hold(ids.accountId, ids.keyId, 5);
    expect(await leases.giveBackFree(ids.accountId)).toBe(true);
    expect(leases.leaseOn(ids.accountId)).toEqual({ units: 5, held: 5 });
    expect(await leases.giveBackFree(ids.accountId)).toBe(false);
    leases.drop(ids.accountId, 5);
    await leases.giveBackAll();
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 100,
      reservedUnits: 0,
    });
    // Closing (at shutdown) also deletes the empty lease: the next start has nothing to recover.
    const rows = () =>
      fresh.db.select().from(creditLeases).where(eq(creditLeases.gatewayId, leases.gatewayId));
    expect(await rows()).toHaveLength(1);
    await leases.close();
    expect(await rows()).toEqual([]);
  });

  it("keeps a lease nothing holds when lingerMs is null (embedded PGlite), until shutdown", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    const leases = leasesOf({ lingerMs: null });
    await leases.hold(ids.accountId, ids.keyId, 5);
    leases.drop(ids.accountId, 5);
    await sleep(100);
    expect(leases.leaseOn(ids.accountId)).toEqual({ units: 20, held: 0 });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ reservedUnits: 20 });
    await leases.close();
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ reservedUnits: 0 });
  });

  it("a hold short of credits another gateway leases idle asks for them: that one gives back its free part at once", async () => {
    const ids = await accountWithKey(fresh.db, 30);
    const idle = leasesOf({ listen: fresh.listen });
    await idle.start();
    const short = leasesOf({ listen: fresh.listen });
    await short.start();
    try {
      // The idle gateway leases 20 of 30 and keeps 5 held by an execution in flight.
      await idle.hold(ids.accountId, ids.keyId, 5);
      await idle.hold(ids.accountId, ids.keyId, 5);
      idle.drop(ids.accountId, 5);
      expect(idle.leaseOn(ids.accountId)).toEqual({ units: 20, held: 5 });
      // 10 available: a hold of 12 needs the other's idle credits, which linger a minute unasked.
      expect(await short.hold(ids.accountId, ids.keyId, 12)).toEqual({ kind: "held" });
      expect(idle.leaseOn(ids.accountId)).toEqual({ units: 5, held: 5 });
      expect(short.leaseOn(ids.accountId).held).toBe(12);
      // Nothing idle is left to give: a hold past what exists is refused, not left waiting.
      expect(await short.hold(ids.accountId, ids.keyId, 20)).toMatchObject({
        kind: "insufficient-credits",
      });
    } finally {
      idle.drop(ids.accountId, 5);
      short.drop(ids.accountId, 12);
      await idle.close();
      await short.close();
    }
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 30,
      reservedUnits: 0,
    });
  });

  it("a revoked key gets no hold once its check is due, or at once after forgetKey", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    const leases = leasesOf({ keyCheckMs: 60_000 });
    expect(await leases.hold(ids.accountId, ids.keyId, 5)).toEqual({ kind: "held" });
    await revokeKey(fresh.db, ids.keyId);
    // Trusted for keyCheckMs, as the key cache trusts a key that long.
    expect(await leases.hold(ids.accountId, ids.keyId, 5)).toEqual({ kind: "held" });
    leases.forgetKey(ids.keyId);
    expect(await leases.hold(ids.accountId, ids.keyId, 5)).toEqual({ kind: "key-revoked" });
    const checkedEveryTime = leasesOf({ keyCheckMs: 0 });
    expect(await checkedEveryTime.hold(ids.accountId, ids.keyId, 5)).toEqual({
      kind: "key-revoked",
    });
  });
});
