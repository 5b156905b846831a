import { randomUUID } from "node:crypto";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { findExecution, liveGatewayIds, release, releaseAbandonedReservations, reserve, settle } from "./billing.js";
import { openDatabase } from "./client.js";
import { createAccount, getBalance, grantCredits, insertKey, revokeKey } from "./keys.js";
import { BACKENDS, type FreshDatabase, freshDatabase } from "./testing/fresh-database.js";
import { usageForKey } from "./usage.js";

const limits = { rateLimitPerMinute: 60, maxConcurrency: 4, maxBodyBytes: 1024 };

async function accountWithKey(fresh: FreshDatabase, credits: number) {
  const accountId = await createAccount(fresh.db, "test");
  if (credits > 0) await grantCredits(fresh.db, accountId, credits);
  const key = await insertKey(fresh.db, {
    accountId,
    name: "k",
    hash: randomUUID(),
    hint: "sfk_…test",
    scopes: ["execute"],
    expiresAt: null,
    limits,
  });
  return { accountId, keyId: key.id };
}

const settlement = (chargedUnits: number) => ({
  status: "completed" as const,
  exitCode: 0,
  stdout: "out",
  stderr: "",
  truncated: false,
  timings: { queueMs: 0, forkMs: 1, execMs: 2, totalMs: 3 },
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

  const reservation = (ids: { accountId: string; keyId: string }, units: number, idempotencyKey: string | null = null) => ({
    executionId: randomUUID(),
    ...ids,
    tokenId: null,
    idempotencyKey,
    requestHash: "h",
    template: "python",
    gatewayId: "gateway-a",
    units,
  });

  it("reserves, settles at the actual cost and records usage once", async () => {
    const ids = await accountWithKey(fresh, 100);
    const r = reservation(ids, 30);
    expect(await reserve(fresh.db, r)).toEqual({ kind: "reserved" });
    const id = r.executionId;
    expect(await findExecution(fresh.db, id)).toMatchObject({ status: "running", reservedUnits: 30, chargedUnits: null });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ balanceUnits: 100, reservedUnits: 30, availableUnits: 70 });

    const settled = await settle(fresh.db, id, settlement(12));
    expect(settled).toMatchObject({ status: "completed", chargedUnits: 12, stdout: "out" });
    // A second settlement (e.g. a retried handler) changes nothing.
    const again = await settle(fresh.db, id, settlement(25));
    expect(again.chargedUnits).toBe(12);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ balanceUnits: 88, reservedUnits: 0 });

    const usage = await usageForKey(fresh.db, ids.keyId, new Date(Date.now() - 60_000), new Date(Date.now() + 60_000));
    expect(usage).toEqual({ executions: 1, units: 12, byTemplate: [{ template: "python", executions: 1, units: 12 }] });
  });

  it("never charges more than was reserved", async () => {
    const ids = await accountWithKey(fresh, 10);
    const r = reservation(ids, 5);
    expect(await reserve(fresh.db, r)).toEqual({ kind: "reserved" });
    const settled = await settle(fresh.db, r.executionId, settlement(9));
    expect(settled.chargedUnits).toBe(5);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ balanceUnits: 5, reservedUnits: 0 });
  });

  it("refuses a reservation the balance cannot cover", async () => {
    const ids = await accountWithKey(fresh, 3);
    expect(await reserve(fresh.db, reservation(ids, 4))).toEqual({ kind: "insufficient-credits", availableUnits: 3 });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ balanceUnits: 3, reservedUnits: 0 });
  });

  it("turns a repeated Idempotency-Key into a duplicate without holding credits", async () => {
    const ids = await accountWithKey(fresh, 10);
    const first = reservation(ids, 2, "idem-1");
    expect(await reserve(fresh.db, first)).toEqual({ kind: "reserved" });
    const second = await reserve(fresh.db, reservation(ids, 2, "idem-1"));
    expect(second).toMatchObject({ kind: "duplicate", existing: { id: first.executionId } });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ reservedUnits: 2 });
  });

  it("release frees the hold, charges nothing and frees the Idempotency-Key", async () => {
    const ids = await accountWithKey(fresh, 10);
    const r = reservation(ids, 4, "idem-release");
    expect(await reserve(fresh.db, r)).toEqual({ kind: "reserved" });
    expect(await release(fresh.db, r.executionId)).toBe(true);
    expect(await release(fresh.db, r.executionId)).toBe(false);
    expect(await findExecution(fresh.db, r.executionId)).toMatchObject({ status: "aborted", chargedUnits: 0, idempotencyKey: null });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ balanceUnits: 10, reservedUnits: 0 });
    expect((await reserve(fresh.db, reservation(ids, 4, "idem-release"))).kind).toBe("reserved");
  });

  it("refuses to reserve for a revoked key", async () => {
    const ids = await accountWithKey(fresh, 10);
    await revokeKey(fresh.db, ids.keyId);
    expect(await reserve(fresh.db, reservation(ids, 1))).toEqual({ kind: "key-revoked" });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ reservedUnits: 0 });
  });

  it("names a revoked key rather than the missing credits when both refuse the hold", async () => {
    const ids = await accountWithKey(fresh, 0);
    await revokeKey(fresh.db, ids.keyId);
    const r = reservation(ids, 1);
    expect(await reserve(fresh.db, r)).toEqual({ kind: "key-revoked" });
    expect(await findExecution(fresh.db, r.executionId)).toBeUndefined();
  });

  it("the recovery pass releases the holds of gone gateways and of executions past any deadline, and keeps the live ones", async () => {
    const ids = await accountWithKey(fresh, 10);
    const live = reservation(ids, 3);
    const gone = { ...reservation(ids, 4), gatewayId: "gateway-gone" };
    expect(await reserve(fresh.db, live)).toEqual({ kind: "reserved" });
    expect(await reserve(fresh.db, gone)).toEqual({ kind: "reserved" });
    // (Other tests' executions in this database may be released too: the count is at least ours.)
    expect(await releaseAbandonedReservations(fresh.db, ["gateway-a"], new Date(Date.now() - 60_000))).toBeGreaterThanOrEqual(1);
    expect(await findExecution(fresh.db, gone.executionId)).toMatchObject({ status: "aborted", chargedUnits: 0 });
    expect(await findExecution(fresh.db, live.executionId)).toMatchObject({ status: "running", gatewayId: "gateway-a" });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ balanceUnits: 10, reservedUnits: 3 });
    // Older than the longest deadline: released even though its gateway still runs.
    expect(await releaseAbandonedReservations(fresh.db, ["gateway-a"], new Date(Date.now() + 1_000))).toBeGreaterThanOrEqual(1);
    expect(await findExecution(fresh.db, live.executionId)).toMatchObject({ status: "aborted", chargedUnits: 0 });
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ balanceUnits: 10, reservedUnits: 0 });
  });

  it("knows which gateways are alive: PGlite only this one; PostgreSQL every gateway with an open session", async () => {
    if (backend === "pglite") {
      expect(await liveGatewayIds(fresh, "self")).toEqual(["self"]);
      return;
    }
    const url = process.env.TEST_DATABASE_URL as string;
    const other = await openDatabase({ backend: "postgres", url, maxConnections: 1, gatewayId: "gateway-other" });
    try {
      await other.db.execute(sql`SELECT 1`);
      expect(await liveGatewayIds(fresh, "self")).toEqual(expect.arrayContaining(["self", "gateway-other"]));
    } finally {
      await other.close();
    }
    // Its backend exits once the connection is closed; poll briefly.
    for (let i = 0; i < 100 && (await liveGatewayIds(fresh, "self")).includes("gateway-other"); i++) await new Promise((r) => setTimeout(r, 20));
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

  it("100 concurrent reservations with a balance for 60: exactly 60 succeed and settle, 40 are refused", async () => {
    const ids = await accountWithKey(fresh, 60);
    const requests = Array.from({ length: 100 }, () => ({
      executionId: randomUUID(),
      ...ids,
      tokenId: null,
      idempotencyKey: null,
      requestHash: "h",
      template: "python",
      gatewayId: "gateway-a",
      units: 1,
    }));
    const outcomes = await Promise.all(requests.map((r) => reserve(fresh.db, r)));
    const reserved = requests.filter((_, i) => outcomes[i]?.kind === "reserved");
    expect(reserved).toHaveLength(60);
    expect(outcomes.filter((o) => o.kind === "insufficient-credits")).toHaveLength(40);
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ balanceUnits: 60, reservedUnits: 60, availableUnits: 0 });

    await Promise.all(reserved.map((r) => settle(fresh.db, r.executionId, settlement(1))));
    expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({ balanceUnits: 0, reservedUnits: 0 });
    const usage = await usageForKey(fresh.db, ids.keyId, new Date(Date.now() - 60_000), new Date(Date.now() + 60_000));
    expect(usage.executions).toBe(60);
    expect(usage.units).toBe(60);
  });
});
