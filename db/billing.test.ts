import { randomUUID } from "node:crypto";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  BillingBatches,
  findByIdempotencyKey,
  findExecution,
  liveGatewayIds,
  release,
  releaseAbandonedReservations,
  reserve,
  reserveAll,
  runningRecord,
  settle,
  settleAll,
} from "./billing.js";
import { getBalance, revokeKey } from "./keys.js";
import { openDatabase } from "./open.js";
import { accountWithKey } from "./testing/accounts.js";
import { BACKENDS, type FreshDatabase, freshDatabase } from "./testing/fresh-database.js";
import { usageForKey } from "./usage.js";

const settlement = (chargedUnits: number) => ({
  status: "completed" as const,
  exitCode: 0,
  stdout: "out",
  stderr: "",
  truncated: false,
  timings: { queueMs: 0, forkMs: 1, execMs: 2, totalMs: 3 },
  network: null,
  chargedUnits,
});

describe.each(BACKENDS)("billing on %s", (backend) => {
  let fresh: FreshDatabase;
  beforeAll(async () => {
    fresh = await freshDatabase(backend);
  });
  afterAll(async () => {
    await fresh?.dispose();
  });

  const reservation = (
    ids: { accountId: string; keyId: string },
    units: number,
    idempotencyKey: string | null = null,
  ) => ({
    executionId: randomUUID(),
    ...ids,
    tokenId: null,
    idempotencyKey,
    requestHash: "h",
    template: "python",
    gatewayId: "gateway-a",
    units,
  });

  it("finds a record by id and by Idempotency-Key with every column as it was written, running and final", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    const r = {
      ...reservation(ids, 30, `key-${randomUUID()}`),
      tokenId: "token-1",
      requestHash: "hash-1",
    };
    await reserve(fresh.db, r);
    const running = await findExecution(fresh.db, r.executionId);
    expect(running).toEqual({ ...runningRecord(r), createdAt: expect.any(Date) });
    expect(running).toMatchObject({
      tokenId: "token-1",
      requestHash: "hash-1",
      gatewayId: "gateway-a",
      status: "running",
      reservedUnits: 30,
      chargedUnits: null,
      stdout: null,
    });
    expect(Math.abs((running?.createdAt.getTime() ?? 0) - Date.now())).toBeLessThan(60_000);
    const outcome = {
      status: "crashed" as const,
      exitCode: -11,
      stdout: "partial\n",
      stderr: "Segmentation fault",
      truncated: true,
      timings: { queueMs: 0.5, forkMs: 1.25, execMs: 7, totalMs: 9 },
      network: { bytesIn: 4096, bytesOut: 120, connections: 2, refused: 1, dnsQueries: 3 },
      chargedUnits: 4,
    };
    const settled = await settle(fresh.db, r.executionId, outcome);
    expect(settled).toMatchObject({
      status: "crashed",
      exitCode: -11,
      truncated: true,
      stderr: "Segmentation fault",
      chargedUnits: 4,
    });
    expect(settled.finishedAt).toBeInstanceOf(Date);
    expect(await findExecution(fresh.db, r.executionId)).toEqual(settled);
    expect(await findByIdempotencyKey(fresh.db, ids.keyId, r.idempotencyKey as string)).toEqual(
      settled,
    );
    expect(await findByIdempotencyKey(fresh.db, ids.keyId, "another key")).toBeUndefined();
    expect(await findExecution(fresh.db, randomUUID())).toBeUndefined();
  });

  it("reserves, settles at the actual cost and records usage once", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    const r = reservation(ids, 30);
    expect(await reserve(fresh.db, r)).toEqual({ kind: "reserved" });
    const id = r.executionId;
    expect(await findExecution(fresh.db, id)).toMatchObject({
      status: "running",
      reservedUnits: 30,
      chargedUnits: null,
    });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 100,
      reservedUnits: 30,
      availableUnits: 70,
    });

    const settled = await settle(fresh.db, id, settlement(12));
    expect(settled).toMatchObject({ status: "completed", chargedUnits: 12, stdout: "out" });
    // The record settle answers (assembled from its columns and the settlement) is the stored one.
    expect(settled).toEqual(await findExecution(fresh.db, id));
    // A second settlement (e.g. a retried handler) changes nothing.
    const again = await settle(fresh.db, id, settlement(25));
    expect(again.chargedUnits).toBe(12);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 88,
      reservedUnits: 0,
    });

    const usage = await usageForKey(
      fresh.db,
      ids.keyId,
      new Date(Date.now() - 60_000),
      new Date(Date.now() + 60_000),
    );
    expect(usage).toEqual({
      executions: 1,
      units: 12,
      byTemplate: [{ template: "python", executions: 1, units: 12 }],
      network: { bytesIn: 0, bytesOut: 0, refused: 0 },
    });
  });

  it("never charges more than was reserved", async () => {
    const ids = await accountWithKey(fresh.db, 10);
    const r = reservation(ids, 5);
    expect(await reserve(fresh.db, r)).toEqual({ kind: "reserved" });
    const settled = await settle(fresh.db, r.executionId, settlement(9));
    expect(settled.chargedUnits).toBe(5);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 5,
      reservedUnits: 0,
    });
  });

  it("refuses a reservation the balance cannot cover", async () => {
    const ids = await accountWithKey(fresh.db, 3);
    expect(await reserve(fresh.db, reservation(ids, 4))).toEqual({
      kind: "insufficient-credits",
      availableUnits: 3,
    });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 3,
      reservedUnits: 0,
    });
  });

  it("turns a repeated Idempotency-Key into a duplicate without holding credits", async () => {
    const ids = await accountWithKey(fresh.db, 10);
    const first = reservation(ids, 2, "idem-1");
    expect(await reserve(fresh.db, first)).toEqual({ kind: "reserved" });
    const second = await reserve(fresh.db, reservation(ids, 2, "idem-1"));
    expect(second).toMatchObject({ kind: "duplicate", existing: { id: first.executionId } });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ reservedUnits: 2 });
  });

  it("release frees the hold, charges nothing and frees the Idempotency-Key", async () => {
    const ids = await accountWithKey(fresh.db, 10);
    const r = reservation(ids, 4, "idem-release");
    expect(await reserve(fresh.db, r)).toEqual({ kind: "reserved" });
    expect(await release(fresh.db, r.executionId)).toBe(true);
    expect(await release(fresh.db, r.executionId)).toBe(false);
    expect(await findExecution(fresh.db, r.executionId)).toMatchObject({
      status: "aborted",
      chargedUnits: 0,
      idempotencyKey: null,
    });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 10,
      reservedUnits: 0,
    });
    // Not usage: it was charged nothing, though its record is finished.
    expect(
      await usageForKey(
        fresh.db,
        ids.keyId,
        new Date(Date.now() - 60_000),
        new Date(Date.now() + 60_000),
      ),
    ).toMatchObject({ executions: 0, units: 0 });
    expect((await reserve(fresh.db, reservation(ids, 4, "idem-release"))).kind).toBe("reserved");
  });

  it("refuses to reserve for a revoked key", async () => {
    const ids = await accountWithKey(fresh.db, 10);
    await revokeKey(fresh.db, ids.keyId);
    expect(await reserve(fresh.db, reservation(ids, 1))).toEqual({ kind: "key-revoked" });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ reservedUnits: 0 });
  });

  it("names a revoked key rather than the missing credits when both refuse the hold", async () => {
    const ids = await accountWithKey(fresh.db, 0);
    await revokeKey(fresh.db, ids.keyId);
    const r = reservation(ids, 1);
    expect(await reserve(fresh.db, r)).toEqual({ kind: "key-revoked" });
    expect(await findExecution(fresh.db, r.executionId)).toBeUndefined();
  });

  it("the recovery pass releases the holds of gone gateways and of executions past any deadline, and keeps the live ones", async () => {
    const ids = await accountWithKey(fresh.db, 10);
    const live = reservation(ids, 3);
    const gone = { ...reservation(ids, 4), gatewayId: "gateway-gone" };
    expect(await reserve(fresh.db, live)).toEqual({ kind: "reserved" });
    expect(await reserve(fresh.db, gone)).toEqual({ kind: "reserved" });
    // (Other tests' executions in this database may be released too: the count is at least ours.)
    expect(
      await releaseAbandonedReservations(fresh.db, ["gateway-a"], new Date(Date.now() - 60_000)),
    ).toBeGreaterThanOrEqual(1);
    expect(await findExecution(fresh.db, gone.executionId)).toMatchObject({
      status: "aborted",
      chargedUnits: 0,
    });
    expect(await findExecution(fresh.db, live.executionId)).toMatchObject({
      status: "running",
      gatewayId: "gateway-a",
    });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 10,
      reservedUnits: 3,
    });
    // Older than the longest deadline: released even though its gateway still runs.
    expect(
      await releaseAbandonedReservations(fresh.db, ["gateway-a"], new Date(Date.now() + 1_000)),
    ).toBeGreaterThanOrEqual(1);
    expect(await findExecution(fresh.db, live.executionId)).toMatchObject({
      status: "aborted",
      chargedUnits: 0,
    });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 10,
      reservedUnits: 0,
    });
  });

  it("a batch's reservations come out as reserving each alone would: sums per account, revoked keys, refusals", async () => {
    const a = await accountWithKey(fresh.db, 10);
    const b = await accountWithKey(fresh.db, 2);
    const revoked = await accountWithKey(fresh.db, 10);
    await revokeKey(fresh.db, revoked.keyId);
    // A's batch sums to 13 of its 10: each of A's is then decided alone, in order.
    const batch = [
      reservation(a, 4),
      reservation(b, 1),
      reservation(a, 4),
      reservation(a, 4),
      reservation(revoked, 1),
      reservation(a, 1),
      reservation(b, 1),
    ];
    expect(await reserveAll(fresh.db, batch)).toEqual([
      { kind: "reserved" },
      { kind: "reserved" },
      { kind: "reserved" },
      { kind: "insufficient-credits", availableUnits: 2 },
      { kind: "key-revoked" },
      { kind: "reserved" },
      { kind: "reserved" },
    ]);
    expect(await getBalance(fresh.db, a.accountId)).toMatchObject({
      balanceUnits: 10,
      reservedUnits: 9,
    });
    expect(await getBalance(fresh.db, b.accountId)).toMatchObject({
      balanceUnits: 2,
      reservedUnits: 2,
    });
    expect(await getBalance(fresh.db, revoked.accountId)).toMatchObject({ reservedUnits: 0 });
    expect(await findExecution(fresh.db, batch[3]?.executionId as string)).toBeUndefined();
  });

  it("a repeated Idempotency-Key in a batch (of an earlier request or within the batch) is a duplicate, holding nothing", async () => {
    const ids = await accountWithKey(fresh.db, 10);
    const earlier = reservation(ids, 1, "idem-batch-1");
    expect(await reserve(fresh.db, earlier)).toEqual({ kind: "reserved" });
    const batch = [
      reservation(ids, 1, "idem-batch-1"),
      reservation(ids, 1, "idem-batch-2"),
      reservation(ids, 1, "idem-batch-2"),
    ];
    expect(await reserveAll(fresh.db, batch)).toMatchObject([
      { kind: "duplicate", existing: { id: earlier.executionId } },
      { kind: "reserved" },
      { kind: "duplicate", existing: { id: batch[1]?.executionId } },
    ]);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ reservedUnits: 2 });
  });

  it("settles a batch in one statement; a batch whose statement fails bills none of it", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    const rs = [reservation(ids, 10), reservation(ids, 10), reservation(ids, 10)];
    expect(await reserveAll(fresh.db, rs)).toEqual(rs.map(() => ({ kind: "reserved" })));
    // A NUL byte is not valid text in PostgreSQL: the whole statement fails.
    const failing = rs.map((r, i) => ({
      executionId: r.executionId,
      settlement: { ...settlement(3), stdout: i === 1 ? "bad\u0000" : "ok" },
    }));
    await expect(settleAll(fresh.db, failing)).rejects.toThrow();
    for (const r of rs)
      expect(await findExecution(fresh.db, r.executionId)).toMatchObject({
        status: "running",
        chargedUnits: null,
      });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 100,
      reservedUnits: 30,
    });
    const none = await usageForKey(
      fresh.db,
      ids.keyId,
      new Date(Date.now() - 60_000),
      new Date(Date.now() + 60_000),
    );
    expect(none.executions).toBe(0);

    const first = rs[0]?.executionId as string;
    expect((await settle(fresh.db, first, settlement(3))).chargedUnits).toBe(3);
    // The repeat answers its first settlement; the others settle once each, at their own cost.
    const records = await settleAll(
      fresh.db,
      rs.map((r, i) => ({ executionId: r.executionId, settlement: settlement(4 + i) })),
    );
    expect(records.map((r) => [r.id, r.chargedUnits])).toEqual(
      rs.map((r, i) => [r.executionId, i === 0 ? 3 : 4 + i]),
    );
    for (const record of records) expect(record).toEqual(await findExecution(fresh.db, record.id));
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 100 - 3 - 5 - 6,
      reservedUnits: 0,
    });
    const usage = await usageForKey(
      fresh.db,
      ids.keyId,
      new Date(Date.now() - 60_000),
      new Date(Date.now() + 60_000),
    );
    expect(usage).toMatchObject({ executions: 3, units: 14 });
  });

  it("a settlement the database refuses frees its execution's hold at once, charging nothing", async () => {
    const ids = await accountWithKey(fresh.db, 100);
    const batches = new BillingBatches(fresh.db);
    const r = reservation(ids, 10);
    expect(await batches.reserve(r)).toEqual({ kind: "reserved" });
    // A NUL byte is not valid text in PostgreSQL: the statement fails.
    await expect(
      batches.settle(r.executionId, { ...settlement(3), stdout: "bad\u0000" }),
    ).rejects.toThrow();
    expect(await findExecution(fresh.db, r.executionId)).toMatchObject({
      status: "aborted",
      chargedUnits: 0,
    });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 100,
      reservedUnits: 0,
    });
  });

  it("knows which gateways are alive: PGlite only this one; PostgreSQL every gateway with an open session", async () => {
    if (backend === "pglite") {
      expect(await liveGatewayIds(fresh, "self")).toEqual(["self"]);
      return;
    }
    const url = process.env.TEST_DATABASE_URL as string;
    const other = await openDatabase({
      backend: "postgres",
      url,
      maxConnections: 1,
      gatewayId: "gateway-other",
    });
    try {
      await other.db.execute(sql`SELECT 1`);
      expect(await liveGatewayIds(fresh, "self")).toEqual(
        expect.arrayContaining(["self", "gateway-other"]),
      );
    } finally {
      await other.close();
    }
    // Its backend exits once the connection is closed; poll briefly.
    for (let i = 0; i < 100 && (await liveGatewayIds(fresh, "self")).includes("gateway-other"); i++)
      await new Promise((r) => setTimeout(r, 20));
    expect(await liveGatewayIds(fresh, "self")).not.toContain("gateway-other");
  });
});

describe("concurrent reservations on one key against a PostgreSQL server", () => {
  let fresh: FreshDatabase;
  beforeAll(async () => {
    fresh = await freshDatabase("postgres", { maxConnections: 20 });
  });
  afterAll(async () => {
    await fresh?.dispose();
  });

  /** `count` reservations of one unit each, without Idempotency-Keys, spread over `gateways` ids. */
  const oneUnitEach = (ids: { accountId: string; keyId: string }, count: number, gateways = 1) =>
    Array.from({ length: count }, (_, i) => ({
      executionId: randomUUID(),
      ...ids,
      tokenId: null,
      idempotencyKey: null,
      requestHash: "h",
      template: "python",
      gatewayId: `gateway-${i % gateways}`,
      units: 1,
    }));

  it("100 concurrent reservations with a balance for 60: exactly 60 succeed and settle, 40 are refused", async () => {
    const ids = await accountWithKey(fresh.db, 60);
    const requests = oneUnitEach(ids, 100);
    const outcomes = await Promise.all(requests.map((r) => reserve(fresh.db, r)));
    const reserved = requests.filter((_, i) => outcomes[i]?.kind === "reserved");
    expect(reserved).toHaveLength(60);
    expect(outcomes.filter((o) => o.kind === "insufficient-credits")).toHaveLength(40);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 60,
      reservedUnits: 60,
      availableUnits: 0,
    });

    await Promise.all(reserved.map((r) => settle(fresh.db, r.executionId, settlement(1))));
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
      balanceUnits: 0,
      reservedUnits: 0,
    });
    const usage = await usageForKey(
      fresh.db,
      ids.keyId,
      new Date(Date.now() - 60_000),
      new Date(Date.now() + 60_000),
    );
    expect(usage.executions).toBe(60);
    expect(usage.units).toBe(60);
  });

  it("two gateways (their own connections and batches) on one account never overspend it", async () => {
    const ids = await accountWithKey(fresh.db, 60);
    const other = await openDatabase({
      backend: "postgres",
      url: fresh.url as string,
      maxConnections: 10,
    });
    try {
      const gateways = [new BillingBatches(fresh.db), new BillingBatches(other.db)];
      const requests = oneUnitEach(ids, 100, 2);
      const gatewayOf = (i: number) => gateways[i % 2] as BillingBatches;
      const outcomes = await Promise.all(requests.map((r, i) => gatewayOf(i).reserve(r)));
      expect(outcomes.filter((o) => o.kind === "reserved")).toHaveLength(60);
      expect(outcomes.filter((o) => o.kind === "insufficient-credits")).toHaveLength(40);
      expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
        balanceUnits: 60,
        reservedUnits: 60,
      });
      await Promise.all(
        requests.map((r, i) =>
          outcomes[i]?.kind === "reserved"
            ? gatewayOf(i).settle(r.executionId, settlement(1))
            : undefined,
        ),
      );
      expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
        balanceUnits: 0,
        reservedUnits: 0,
      });
    } finally {
      await other.close();
    }
  });
});
