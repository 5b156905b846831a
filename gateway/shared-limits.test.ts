// Per-key limits shared through the database (config.sharedLimits): two gateways, each with its
// own limiters on one database, count a key's executions in flight and its requests together;
// a stopped gateway's slots are freed by the recovery pass. Node ids of gateways are made up.
import { randomUUID } from "node:crypto";
import { eq, sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { releaseAbandonedKeySlots } from "../db/key-limits.js";
import { keySlots } from "../db/schema.js";
import { BACKENDS, type FreshDatabase, freshDatabase } from "../db/testing/fresh-database.js";
import { ConcurrencyLimiter, SharedRateLimiter } from "./limits.js";
import { ProblemError } from "./problems.js";

async function problemOf(call: () => Promise<unknown> | unknown): Promise<ProblemError> {
  try {
    await call();
  } catch (error) {
    if (error instanceof ProblemError) return error;
    throw error;
  }
  throw new Error("expected a problem");
}

describe.each(BACKENDS)("limits shared by two gateways on %s", (backend) => {
  let fresh: FreshDatabase;
  beforeAll(async () => {
    fresh = await freshDatabase(backend);
  });
  afterAll(async () => {
    await fresh?.dispose();
  });

  /** Waits (at most 10 s) until the database holds `n` of `key`'s slots: they go back in the background. */
  async function untilHeld(key: string, n: number): Promise<void> {
    const held = async () => {
      const [row] = await fresh.db
        .select({ running: sql<string>`coalesce(sum(${keySlots.running}), 0)` })
        .from(keySlots)
        .where(eq(keySlots.keyId, key));
      return Number(row?.running);
    };
    const until = Date.now() + 10_000;
    while ((await held()) !== n) {
      if (Date.now() > until) throw new Error(`key ${key}: ${await held()} slots held, not ${n}`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  it("holds a key's max_concurrency across both, and frees what each gives back", async () => {
    const key = randomUUID();
    const [a, b] = ["gateway-a", "gateway-b"].map(
      (gatewayId) => new ConcurrencyLimiter({ db: fresh.db, gatewayId }),
    ) as [ConcurrencyLimiter, ConcurrencyLimiter];
    const first = await a.acquire(key, 3);
    const second = await b.admit(key, 3, 4, new AbortController().signal);
    const third = await b.acquire(key, 3);
    // Each gateway alone has room (1 and 2 of 3 here), together they have none.
    expect((await problemOf(() => a.acquire(key, 3))).slug).toBe("concurrency-limit");
    expect((await problemOf(() => a.admit(key, 3, 4, new AbortController().signal))).slug).toBe(
      "concurrency-limit",
    );
    expect(a.inFlightFor(key)).toBe(1);
    second();
    second();
    // Given back once, however often it is called.
    await untilHeld(key, 2);
    const again = await a.acquire(key, 3);
    expect((await problemOf(() => b.acquire(key, 3))).slug).toBe("concurrency-limit");
    // Another key is counted apart.
    (await b.acquire(randomUUID(), 1))();
    for (const release of [first, third, again]) release();
    await untilHeld(key, 0);
    const all = await Promise.all([a.acquire(key, 3), b.acquire(key, 3), a.acquire(key, 3)]);
    expect(all).toHaveLength(3);
    for (const release of all) release();
  });

  it("frees the slots of a gateway that is gone in the recovery pass", async () => {
    const key = randomUUID();
    const gone = new ConcurrencyLimiter({ db: fresh.db, gatewayId: "gone" });
    const live = new ConcurrencyLimiter({ db: fresh.db, gatewayId: "live" });
    await gone.acquire(key, 1);
    expect((await problemOf(() => live.acquire(key, 1))).slug).toBe("concurrency-limit");
    expect(await releaseAbandonedKeySlots(fresh.db, ["live"])).toBeGreaterThan(0);
    (await live.acquire(key, 1))();
  });

  it("holds a key's rate across both: one bucket, refilled at the key's rate", async () => {
    const key = randomUUID();
    const gateways = [new SharedRateLimiter(fresh.db), new SharedRateLimiter(fresh.db)];
    const answers = await Promise.allSettled(
      Array.from({ length: 9 }, (_, i) => gateways[i % 2]?.take(key, 6)),
    );
    expect(answers.filter((a) => a.status === "fulfilled")).toHaveLength(6);
    const refused = answers.filter((a): a is PromiseRejectedResult => a.status === "rejected");
    expect(refused).toHaveLength(3);
    for (const r of refused) {
      expect(r.reason).toBeInstanceOf(ProblemError);
      expect((r.reason as ProblemError).slug).toBe("rate-limited");
      // One request every 10 s at 6 a minute.
      expect(Number((r.reason as ProblemError).headers?.["retry-after"])).toBeLessThanOrEqual(10);
    }
  });
});
