// Idempotency-Keys on embedded PGlite. One gateway owns the database (db/client.ts locks
// its directory), so that gateway alone decides which request holds a key: a request claims its
// key here, in memory, before it runs, and keeps the claim until its record, key included, is in
// the record journal (db/record-journal.ts), or until it ends without one. So an execution with a
// key is leased and journaled like one without (gateway/credit-leases.ts), and costs no running
// record reserved first and no settle after: on PGlite those were two statements in the gateway's
// own thread.
//
// A key is found, in this order: claimed by a request in flight (which answers as its running
// record would: 409, or 422 for another request), in a record journaled and not folded yet, or in
// the database. The database is read without waiting for the journal's folds: a record with this
// key can only be appended by the request holding its claim, which is this one.
import {
  type ExecutionRecord,
  findByIdempotencyKey,
  type Reservation,
  runningRecord,
} from "../db/billing.js";
import type { Database } from "../db/client.js";
import { journaledRecord } from "../db/leases.js";
import type { RecordJournal } from "../db/record-journal.js";

export type KeyClaim =
  /** The request holds the key until release(), which it calls once its record is journaled or it ended without one. */
  | { kind: "claimed"; release(): void }
  /** The key's execution: a request's running record, or its final one. */
  | { kind: "existing"; record: ExecutionRecord };

interface Claim {
  /** The claiming request's execution, as a running record. */
  running: ExecutionRecord;
  /** Set while the claim looks for the key in the database: others wait for it, then look again. */
  lookup: Promise<unknown> | undefined;
}

export class IdempotencyClaims {
  private readonly claims = new Map<string, Claim>();

  constructor(
    private readonly db: Database,
    private readonly journal: RecordJournal,
  ) {}

  /** Claims the reservation's Idempotency-Key for it, unless an execution already has the key. */
  async claim(reservation: Reservation & { idempotencyKey: string }): Promise<KeyClaim> {
    const running = runningRecord(reservation);
    const id = `${reservation.keyId}\n${reservation.idempotencyKey}`;
    for (;;) {
      const holder = this.claims.get(id);
      if (holder?.lookup !== undefined) {
        await holder.lookup.catch(() => undefined);
        continue;
      }
      if (holder !== undefined) return { kind: "existing", record: holder.running };
      const journaled = this.journal.pendingWithKey(reservation.keyId, reservation.idempotencyKey);
      if (journaled !== undefined) return { kind: "existing", record: journaledRecord(journaled) };

      const claim: Claim = { running, lookup: undefined };
      this.claims.set(id, claim);
      let existing: ExecutionRecord | undefined;
      try {
        const lookup = findByIdempotencyKey(
          this.db,
          reservation.keyId,
          reservation.idempotencyKey,
          { waitForJournal: false },
        );
        claim.lookup = lookup;
        existing = await lookup;
      } catch (error) {
        this.claims.delete(id);
        throw error;
      } finally {
        claim.lookup = undefined;
      }
      if (existing !== undefined) {
        this.claims.delete(id);
        return { kind: "existing", record: existing };
      }
      return {
        kind: "claimed",
        release: () => {
          if (this.claims.get(id) === claim) this.claims.delete(id);
        },
      };
    }
  }
}
