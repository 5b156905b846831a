import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { findByIdempotencyKey, findExecution } from "./billing.js";
import { getBalance, revokeKey } from "./keys.js";
import {
  acquireLease,
  giveBack,
  leasedUnits,
  recordAll,
  releaseAbandonedLeases,
} from "./leases.js";
import { accountWithKey } from "./testing/accounts.js";
import { BACKENDS, type FreshDatabase, freshDatabase } from "./testing/fresh-database.js";
import { leasedExecution } from "./testing/leased-execution.js";
import { usageForKey } from "./usage.js";

describe.each(BACKENDS)("credit leases on %s", (backend) => {
  let fresh: FreshDatabase;
  beforeAll(async () => {
    fresh = await freshDatabase(backend);
  });
  afterAll(async () => {
    await fresh?.dispose();
  });

  it("takes as much as the account has available up to the maximum, and refuses below the minimum", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    const gatewayId = randomUUID();
    expect(await acquireLease(fresh.db, { gatewayId, ...ids, minUnits: 10, maxUnits: 60 })).toEqual(
      { kind: "leased", units: 60 },
    );
    expect(await acquireLease(fresh.db, { gatewayId, ...ids, minUnits: 10, maxUnits: 60 })).toEqual(
      { kind: "leased", units: 40 },
    );
    expect(await leasedUnits(fresh.db, gatewayId, ids.accountId)).toBe(100);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 100,
      reservedUnits: 100,
      availableUnits: 0,
    });
    expect(
      await acquireLease(fresh.db, { gatewayId: randomUUID(), ...ids, minUnits: 1, maxUnits: 5 }),
    ).toEqual({ kind: "insufficient-credits", availableUnits: 0, othersLeased: 100 });
    await giveBack(fresh.db, gatewayId, ids.accountId, 30);
    expect(await leasedUnits(fresh.db, gatewayId, ids.accountId)).toBe(70);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      reservedUnits: 70,
      availableUnits: 30,
    });
    // More than the lease holds is refused whole.
    await expect(giveBack(fresh.db, gatewayId, ids.accountId, 71)).rejects.toThrow();
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ reservedUnits: 70 });
  });

  it("gives a revoked key nothing", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    await revokeKey(fresh.db, ids.keyId);
    expect(
      await acquireLease(fresh.db, { gatewayId: randomUUID(), ...ids, minUnits: 1, maxUnits: 10 }),
    ).toEqual({ kind: "key-revoked" });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ reservedUnits: 0 });
  });

  it("stores every outcome column of a record as given: a truncated output, a signal's exit code", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    const gatewayId = randomUUID();
    await acquireLease(fresh.db, { gatewayId, ...ids, minUnits: 10, maxUnits: 10 });
    const cut = leasedExecution(ids, gatewayId, 5, 1);
    cut.settlement = {
      ...cut.settlement,
      status: "output_exceeded",
      exitCode: -9,
      stderr: "cut",
      truncated: true,
    };
    const [record] = await recordAll(fresh.db, [cut]);
    expect(record).toMatchObject({
      status: "output_exceeded",
      exitCode: -9,
      stderr: "cut",
      truncated: true,
    });
    expect(await findExecution(fresh.db, cut.executionId)).toEqual(record);
  });

  it("records an Idempotency-Key, alone and in a batch; a second record with a key already recorded is refused, nothing of its statement billed", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    const gatewayId = randomUUID();
    await acquireLease(fresh.db, { gatewayId, ...ids, minUnits: 50, maxUnits: 50 });
    const keyed = (key: string) => ({
      ...leasedExecution(ids, gatewayId, 5, 2),
      idempotencyKey: key,
    });
    const [alone] = await recordAll(fresh.db, [keyed("alone")]);
    const batch = await recordAll(fresh.db, [
      keyed("first"),
      leasedExecution(ids, gatewayId, 5, 2),
      keyed("second"),
    ]);
    expect([alone, ...batch].map((r) => r?.idempotencyKey)).toEqual([
      "alone",
      "first",
      null,
      "second",
    ]);
    expect(await findByIdempotencyKey(fresh.db, ids.keyId, "second")).toEqual(batch[2]);

    for (const again of [
      [keyed("alone")],
      [leasedExecution(ids, gatewayId, 5, 2), keyed("first")],
    ]) {
      await expect(recordAll(fresh.db, again)).rejects.toThrow();
      for (const e of again) expect(await findExecution(fresh.db, e.executionId)).toBeUndefined();
    }
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 92,
      reservedUnits: 42,
    });
  });

  it("records an execution with one statement: its charge leaves the balance, the reserved units and the lease", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    const gatewayId = randomUUID();
    await acquireLease(fresh.db, { gatewayId, ...ids, minUnits: 50, maxUnits: 50 });
    const one = leasedExecution(ids, gatewayId, 20, 3);
    const [record] = await recordAll(fresh.db, [one]);
    expect(record).toMatchObject({
      id: one.executionId,
      status: "completed",
      stdout: "42\n",
      reservedUnits: 20,
      chargedUnits: 3,
      gatewayId,
      idempotencyKey: null,
    });
    expect(record).toEqual(await findExecution(fresh.db, one.executionId));
    expect(record?.createdAt.getTime()).toBe(one.createdAt.getTime());
    expect(await leasedUnits(fresh.db, gatewayId, ids.accountId)).toBe(47);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 97,
      reservedUnits: 47,
    });
    // A charge above the hold is capped at it.
    const [capped] = await recordAll(fresh.db, [leasedExecution(ids, gatewayId, 5, 9)]);
    expect(capped?.chargedUnits).toBe(5);
    expect(
      await usageForKey(fresh.db, ids.keyId, new Date(0), new Date(Date.now() + 60_000)),
    ).toMatchObject({ executions: 2, units: 8 });
  });

  it("records a batch across accounts in one call, or none of it when a lease cannot pay", async () => {
    const a = await accountWithKey(fresh.db, 100);
    const b = await accountWithKey(fresh.db, 100);
    const gatewayId = randomUUID();
    await acquireLease(fresh.db, { gatewayId, ...a, minUnits: 30, maxUnits: 30 });
    await acquireLease(fresh.db, { gatewayId, ...b, minUnits: 10, maxUnits: 10 });
    const batch = [
      leasedExecution(a, gatewayId, 10, 4),
      leasedExecution(b, gatewayId, 10, 6),
      leasedExecution(a, gatewayId, 10, 5),
    ];
    const records = await recordAll(fresh.db, batch);
    expect(records.map((r) => [r.id, r.chargedUnits])).toEqual(
      batch.map((e) => [e.executionId, e.settlement.chargedUnits]),
    );
    for (const r of records) expect(r).toEqual(await findExecution(fresh.db, r.id));
    expect(await getBalance(fresh.db, a.accountId)).toMatchObject({
      balanceUnits: 91,
      reservedUnits: 21,
    });
    expect(await getBalance(fresh.db, b.accountId)).toMatchObject({
      balanceUnits: 94,
      reservedUnits: 4,
    });

    // b's lease holds 4: a charge of 5 fails the whole batch, a's execution with it.
    const refused = [leasedExecution(a, gatewayId, 10, 1), leasedExecution(b, gatewayId, 10, 5)];
    await expect(recordAll(fresh.db, refused)).rejects.toThrow();
    for (const e of refused) expect(await findExecution(fresh.db, e.executionId)).toBeUndefined();
    expect(await getBalance(fresh.db, a.accountId)).toMatchObject({
      balanceUnits: 91,
      reservedUnits: 21,
    });
    // A gateway with no lease on the account records nothing, alone or in a batch.
    const stranger = randomUUID();
    await expect(recordAll(fresh.db, [leasedExecution(a, stranger, 10, 1)])).rejects.toThrow(
      /no credit lease/,
    );
    await expect(
      recordAll(fresh.db, [
        leasedExecution(a, stranger, 10, 1),
        leasedExecution(b, gatewayId, 1, 1),
      ]),
    ).rejects.toThrow(/no credit lease/);
    expect(await getBalance(fresh.db, b.accountId)).toMatchObject({
      balanceUnits: 94,
      reservedUnits: 4,
    });
  });

  it("a lease growing while its gateway records and gives back on the same account never deadlocks", async () => {
    const ids = await accountWithKey(fresh.db, 1_000_000);
    const gatewayId = randomUUID();
    await acquireLease(fresh.db, { gatewayId, ...ids, minUnits: 100, maxUnits: 100 });
    for (let round = 0; round < 30; round++) {
      await Promise.all([
        acquireLease(fresh.db, { gatewayId, ...ids, minUnits: 10, maxUnits: 10 }),
        recordAll(fresh.db, [leasedExecution(ids, gatewayId, 10, 1)]),
        recordAll(fresh.db, [
          leasedExecution(ids, gatewayId, 10, 1),
          leasedExecution(ids, gatewayId, 10, 1),
        ]),
        giveBack(fresh.db, gatewayId, ids.accountId, 5),
      ]);
    }
    expect(await leasedUnits(fresh.db, gatewayId, ids.accountId)).toBe(100 + 30 * (10 - 3 - 5));
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 1_000_000 - 90,
      reservedUnits: 160,
    });
  });

  it("gateways' leases growing while others record on the same account never deadlock", async () => {
    const ids = await accountWithKey(fresh.db, 1_000_000);
    const [g1, g2] = [randomUUID(), randomUUID()];
    await acquireLease(fresh.db, { gatewayId: g2, ...ids, minUnits: 1000, maxUnits: 1000 });
    for (let round = 0; round < 30; round++) {
      await Promise.all([
        acquireLease(fresh.db, { gatewayId: g1, ...ids, minUnits: 1, maxUnits: 1 }),
        recordAll(fresh.db, [leasedExecution(ids, g2, 10, 1)]),
        acquireLease(fresh.db, { gatewayId: g2, ...ids, minUnits: 1, maxUnits: 1 }),
        recordAll(fresh.db, [leasedExecution(ids, g2, 10, 1), leasedExecution(ids, g2, 10, 1)]),
      ]);
    }
    expect(await leasedUnits(fresh.db, g1, ids.accountId)).toBe(30);
    expect(await leasedUnits(fresh.db, g2, ids.accountId)).toBe(1000 + 30 - 90);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 1_000_000 - 90,
      reservedUnits: 970,
    });
    // Two gateways' first leases at once: each new row's foreign key holds a KEY SHARE lock on the account.
    for (let round = 0; round < 20; round++) {
      const outcomes = await Promise.all(
        [randomUUID(), randomUUID(), randomUUID()].map((gatewayId) =>
          acquireLease(fresh.db, { gatewayId, ...ids, minUnits: 1, maxUnits: 1 }),
        ),
      );
      expect(outcomes).toEqual([1, 2, 3].map(() => ({ kind: "leased", units: 1 })));
    }
  });

  it("the recovery pass gives back the leases of gateways that are gone, and only theirs", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    const live = randomUUID();
    const dead = randomUUID();
    await acquireLease(fresh.db, { gatewayId: live, ...ids, minUnits: 20, maxUnits: 20 });
    await acquireLease(fresh.db, { gatewayId: dead, ...ids, minUnits: 30, maxUnits: 30 });
    await recordAll(fresh.db, [leasedExecution(ids, dead, 10, 7)]);
    const before = await getBalance(fresh.db, ids.accountId);
    expect(before).toMatchObject({ balanceUnits: 93, reservedUnits: 43 });
    const others = await releaseAbandonedLeases(fresh.db, [live]);
    expect(others.leases).toBeGreaterThanOrEqual(1);
    expect(await leasedUnits(fresh.db, dead, ids.accountId)).toBe(0);
    expect(await leasedUnits(fresh.db, live, ids.accountId)).toBe(20);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 93,
      reservedUnits: 20,
    });
  });
});
