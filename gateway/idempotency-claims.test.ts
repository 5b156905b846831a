// IdempotencyClaims on a real embedded PGlite with its record journal: where a key is found, and
// that claiming one costs no fold of the journal.
import { randomUUID } from "node:crypto";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ExecutionRecord, type Reservation, runningRecord } from "../db/billing.js";
import { journalOf, type RecordJournal } from "../db/record-journal.js";
import { accountWithKey } from "../db/testing/accounts.js";
import { type FreshDatabase, freshDatabase } from "../db/testing/fresh-database.js";
import { leasedExecution } from "../db/testing/leased-execution.js";
import { CreditLeases } from "./credit-leases.js";
import { IdempotencyClaims, type KeyClaim } from "./idempotency-claims.js";

describe("Idempotency-Keys claimed in memory on embedded PGlite", () => {
  let fresh: FreshDatabase;
  let journal: RecordJournal;
  let claims: IdempotencyClaims;
  let leases: CreditLeases;
  let ids: { accountId: string; keyId: string };
  beforeAll(async () => {
    fresh = await freshDatabase("pglite");
    journal = journalOf(fresh.db) as RecordJournal;
    claims = new IdempotencyClaims(fresh.db, journal);
    leases = new CreditLeases({
      db: fresh.db,
      gatewayId: randomUUID(),
      holdsPerLease: 4,
      lingerMs: 60_000,
      keyCheckMs: 60_000,
    });
    ids = await accountWithKey(fresh.db, 1_000);
  });
  afterAll(async () => {
    await fresh?.dispose();
  });

  const reservation = (
    idempotencyKey: string,
    keyId = ids.keyId,
  ): Reservation & { idempotencyKey: string } => ({
    executionId: randomUUID(),
    accountId: ids.accountId,
    keyId,
    tokenId: null,
    idempotencyKey,
    requestHash: "h".repeat(64),
    template: "python",
    gatewayId: leases.gatewayId,
    units: 10,
  });
  /** The running record a claim of `r` answers to the others. */
  const runningOf = (r: Reservation) => ({ ...runningRecord(r), createdAt: expect.any(Date) });

  const claimed = (claim: KeyClaim) => {
    if (claim.kind !== "claimed")
      throw new Error(`expected a claim, got the record ${JSON.stringify(claim.record)}`);
    return claim;
  };

  /** Holds, records with `idempotencyKey` through the lease (so through the journal), and answers the record. */
  async function recordKeyed(idempotencyKey: string): Promise<ExecutionRecord> {
    expect(await leases.hold(ids.accountId, ids.keyId, 10)).toEqual({ kind: "held" });
    return leases.record({ ...leasedExecution(ids, leases.gatewayId, 10, 3), idempotencyKey });
  }

  it("a key is claimed once: a second claim finds the claimer's running record; released, it is free again", async () => {
    const first = reservation("once");
    const claim = claimed(await claims.claim(first));
    expect(await claims.claim(reservation("once"))).toEqual({
      kind: "existing",
      record: runningOf(first),
    });
    // Another key of the account's, with the same Idempotency-Key, is another request.
    claimed(await claims.claim(reservation("once", randomUUID()))).release();
    claim.release();
    claimed(await claims.claim(reservation("once"))).release();
  });

  it("requests racing for a new key: one claims it, the others find its running record", async () => {
    const racing = [reservation("race"), reservation("race"), reservation("race")];
    const outcomes = await Promise.all(racing.map((r) => claims.claim(r)));
    const winners = outcomes.filter((o) => o.kind === "claimed");
    expect(winners).toHaveLength(1);
    const winner = racing[outcomes.indexOf(winners[0] as KeyClaim)];
    for (const o of outcomes)
      if (o.kind === "existing") expect(o.record).toEqual(runningOf(winner as Reservation));
  });

  it("a lookup that fails fails its request and leaves the key unclaimed: a request waiting on it looks again itself", async () => {
    await fresh.db.execute(sql`ALTER TABLE executions RENAME TO executions_away`);
    try {
      const racing = [claims.claim(reservation("failing")), claims.claim(reservation("failing"))];
      for (const outcome of await Promise.allSettled(racing))
        expect(outcome.status).toBe("rejected");
    } finally {
      await fresh.db.execute(sql`ALTER TABLE executions_away RENAME TO executions`);
    }
    claimed(await claims.claim(reservation("failing"))).release();
  });

  it("a journaled record is found in the journal before its fold, in the database after; claiming a key folds nothing", async () => {
    const claim = claimed(await claims.claim(reservation("journaled")));
    const record = await recordKeyed("journaled");
    claim.release();
    expect(journal.upToDate).toBe(false);
    expect(await claims.claim(reservation("journaled"))).toEqual({ kind: "existing", record });
    // A new key is looked up in the database without first folding what the journal holds.
    claimed(await claims.claim(reservation("new"))).release();
    expect(journal.upToDate).toBe(false);

    await journal.settled();
    expect(journal.upToDate).toBe(true);
    expect(await claims.claim(reservation("journaled"))).toEqual({ kind: "existing", record });
  });
});
