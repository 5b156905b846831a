// Credit leases: a gateway takes a block of an account's available credits in one transaction
// (they join the account's reserved units, and the gateway's row in credit_leases says how many
// it holds), holds its executions' worst-case costs against the block in memory
// (gateway/credit-leases.ts), and records each execution once it has ended with ONE statement:
// the final record (the charge's entry in the accounts' journal) and its charge leaving the
// account's balance, its reserved units and the lease together. So an execution without an
// Idempotency-Key (on embedded PGlite, with one too: gateway/idempotency-claims.ts) costs one
// round trip of billing, not a reserve and a settle, and an account can still never be
// overspent: a lease is only taken where the account covers it, and the database refuses a
// charge the lease cannot cover. Unspent credits go back to the account when the gateway is done
// with them (idle, asked for by another gateway short of credits, at shutdown), or, for a gateway
// that died, at the next start (releaseAbandonedLeases).
import { and, eq, ne, sql } from "drizzle-orm";
import {
  accountStanding,
  checkCharge,
  type ExecutionRecord,
  fromSettledRow,
  networkParam,
  ofGoneGateway,
  SETTLED_COLUMNS,
  type Settlement,
  settledOutcome,
  settlementJson,
  settlementParams,
} from "./billing.js";
import type { Database } from "./client.js";
import { type PreparedStatement, type RunOptions, runPrepared } from "./prepared.js";
import { accounts, creditLeases } from "./schema.js";

export type LeaseOutcome =
  | { kind: "leased"; units: number }
  // `othersLeased`: what other gateways' leases on the account hold (idle ones go back when asked).
  | { kind: "insufficient-credits"; availableUnits: number; othersLeased: number }
  | { kind: "key-revoked" };

export interface LeaseRequest {
  gatewayId: string;
  accountId: string;
  /** The key the credits are for: a revoked key gets none. */
  keyId: string;
  /** Fewer than this and the lease is refused. */
  minUnits: number;
  /** At most this many are taken, as many as the account has available up to it. */
  maxUnits: number;
}

/** Adds up to `maxUnits` of the account's available credits (at least `minUnits`) to the gateway's lease on it. */
export async function acquireLease(db: Database, r: LeaseRequest): Promise<LeaseOutcome> {
  if (
    !Number.isSafeInteger(r.minUnits) ||
    r.minUnits < 0 ||
    !Number.isSafeInteger(r.maxUnits) ||
    r.maxUnits < r.minUnits
  ) {
    throw new RangeError("a lease is a non-negative integer range");
  }
  return db.transaction(async (tx) => {
    // Every statement that changes a lease locks its row before its account's (a record, a give
    // back, the recovery pass): so does this, or a growing lease and a record could deadlock.
    await tx
      .insert(creditLeases)
      .values({ gatewayId: r.gatewayId, accountId: r.accountId, units: 0 })
      .onConflictDoUpdate({
        target: [creditLeases.gatewayId, creditLeases.accountId],
        set: { units: sql`${creditLeases.units}` },
      });
    // Locked for the update below, under FOR NO KEY UPDATE: the lease row's foreign key holds a
    // KEY SHARE lock on the account, and two gateways' growths each holding one and waiting for
    // FOR UPDATE deadlocked.
    const account = await accountStanding(tx, r.accountId, r.keyId, true);
    if (!account?.keyUsable) return { kind: "key-revoked" } as const;
    const available = account.availableUnits;
    if (available < r.minUnits) {
      const [others] = await tx
        .select({ units: sql<string>`coalesce(sum(${creditLeases.units}), 0)::text` })
        .from(creditLeases)
        .where(
          and(eq(creditLeases.accountId, r.accountId), ne(creditLeases.gatewayId, r.gatewayId)),
        );
      return {
        kind: "insufficient-credits",
        availableUnits: available,
        othersLeased: Number(others?.units ?? 0),
      } as const;
    }
    const units = Math.min(r.maxUnits, available);
    await tx
      .update(accounts)
      .set({ reservedUnits: sql`${accounts.reservedUnits} + ${units}` })
      .where(eq(accounts.id, r.accountId));
    await tx
      .update(creditLeases)
      .set({ units: sql`${creditLeases.units} + ${units}` })
      .where(and(eq(creditLeases.gatewayId, r.gatewayId), eq(creditLeases.accountId, r.accountId)));
    return { kind: "leased", units } as const;
  });
}

/** Gives `units` of the gateway's lease on the account back to its available balance. */
export async function giveBack(
  db: Database,
  gatewayId: string,
  accountId: string,
  units: number,
): Promise<void> {
  if (!Number.isSafeInteger(units) || units < 0)
    throw new RangeError("a lease is a non-negative integer");
  if (units === 0) return;
  await runPrepared(db, GIVE_BACK, [gatewayId, accountId, String(units)]);
}

// A lease that does not hold `units` fails its check constraint: nothing is given back.
const GIVE_BACK: PreparedStatement = {
  name: "sandfork_give_back",
  text: `WITH lease AS (
    UPDATE credit_leases SET units = units - $3::int8 WHERE gateway_id = $1 AND account_id = $2::uuid RETURNING account_id
  )
  UPDATE accounts SET reserved_units = reserved_units - $3::int8 FROM lease WHERE accounts.id = lease.account_id`,
};

/**
 * The channel a gateway short of an account's credits NOTIFYs with the account's id; the other
 * gateways give back what their leases on it hold idle (gateway/credit-leases.ts).
 */
export const LEASES_WANTED_CHANNEL = "sandfork_leases_wanted";

/** Asks every gateway listening on LEASES_WANTED_CHANNEL for its idle credits of the account. */
export async function askForIdleLeases(db: Database, accountId: string): Promise<void> {
  await db.execute(sql`select pg_notify(${LEASES_WANTED_CHANNEL}, ${accountId})`);
}

/** Deletes the gateway's leases that hold nothing (at its shutdown); the accounts they were on. */
export async function dropEmptyLeases(db: Database, gatewayId: string): Promise<string[]> {
  const dropped = await db
    .delete(creditLeases)
    .where(and(eq(creditLeases.gatewayId, gatewayId), eq(creditLeases.units, 0)))
    .returning({ accountId: creditLeases.accountId });
  return dropped.map((d) => d.accountId);
}

/** The units the gateway's lease on the account holds in the database (0 without one). */
export async function leasedUnits(
  db: Database,
  gatewayId: string,
  accountId: string,
): Promise<number> {
  const [row] = await db
    .select({ units: creditLeases.units })
    .from(creditLeases)
    .where(and(eq(creditLeases.gatewayId, gatewayId), eq(creditLeases.accountId, accountId)));
  return row?.units ?? 0;
}

/**
 * Gives back every lease of the gateways not among `liveGatewayIds` (see liveGatewayIds in
 * billing.ts): their executions in flight were never answered or recorded, so what they held is
 * simply available again. Returns how many leases and units were given back.
 */
export async function releaseAbandonedLeases(
  db: Database,
  liveGatewayIds: string[],
): Promise<{ leases: number; units: number }> {
  return db.transaction(async (tx) => {
    const gone = await tx
      .delete(creditLeases)
      .where(ofGoneGateway(creditLeases.gatewayId, liveGatewayIds))
      .returning({ accountId: creditLeases.accountId, units: creditLeases.units });
    const perAccount = new Map<string, number>();
    for (const g of gone) perAccount.set(g.accountId, (perAccount.get(g.accountId) ?? 0) + g.units);
    for (const [accountId, units] of [...perAccount].sort(([a], [b]) => a.localeCompare(b))) {
      await tx
        .update(accounts)
        .set({ reservedUnits: sql`${accounts.reservedUnits} - ${units}` })
        .where(eq(accounts.id, accountId));
    }
    return { leases: gone.length, units: gone.reduce((n, g) => n + g.units, 0) };
  });
}

/** An execution that ran on credits its gateway's lease held, and how it ended. */
export interface LeasedExecution {
  executionId: string;
  accountId: string;
  keyId: string;
  tokenId: string | null;
  /**
   * Only on embedded PGlite, whose one gateway claims keys in memory (gateway/idempotency-claims.ts);
   * elsewhere an execution with a key is reserved in the database first, not leased.
   */
  idempotencyKey: string | null;
  requestHash: string;
  template: string;
  gatewayId: string;
  /** What it held of the lease; the charge is capped at it. */
  reservedUnits: number;
  /** When it started to run (its record's created_at). */
  createdAt: Date;
  /** When it was answered, for a record that reaches the database after its answer (db/record-journal.ts); else its transaction's start. */
  finishedAt?: Date;
  settlement: Settlement;
}

/**
 * Records each execution, ONE statement for the whole batch (see the top of this file), and
 * answers the records in order. Atomic: if the statement fails, none of the batch is billed.
 */
export async function recordAll(
  db: Database,
  items: LeasedExecution[],
  options?: RunOptions,
): Promise<ExecutionRecord[]> {
  for (const item of items) checkHoldAndCharge(item);
  const rows = await runPrepared(db, ...recordStatement(items), options);
  const recorded = new Map(rows.map((row) => [row.id as string, row]));
  return items.map(({ executionId, accountId, settlement }) => {
    const row = recorded.get(executionId);
    if (row === undefined)
      throw new Error(
        `execution ${executionId} was not recorded: its gateway holds no credit lease on account ${accountId}`,
      );
    return fromSettledRow(row, settlement);
  });
}

/**
 * Throws what the database would refuse of the record, but for its lease: a charge or hold that
 * is not a whole number of units, an exit code beyond int4, a NUL in a text that did not come from
 * this gateway's own ids (PostgreSQL's text holds none). For a journaled record
 * (db/record-journal.ts), checked before it is appended: the database sees it only after its
 * answer, and must take it then.
 */
export function checkRecordable(e: LeasedExecution): void {
  checkHoldAndCharge(e);
  const s = e.settlement;
  if (
    s.exitCode !== null &&
    !(Number.isInteger(s.exitCode) && s.exitCode >= -(2 ** 31) && s.exitCode < 2 ** 31)
  )
    throw new RangeError("an exit code is an int4");
  for (const text of [s.stdout, s.stderr, s.status, e.template, e.tokenId, e.idempotencyKey]) {
    if (text?.includes("\0")) throw new RangeError("a record's texts hold no NUL character");
  }
}

function checkHoldAndCharge(e: LeasedExecution): void {
  checkCharge(e.settlement);
  if (!Number.isSafeInteger(e.reservedUnits) || e.reservedUnits < 0)
    throw new RangeError("a hold is a non-negative integer");
}

/** The record the database will hold of a journaled execution, as its record statement would answer it. */
export function journaledRecord(e: LeasedExecution & { finishedAt: Date }): ExecutionRecord {
  const s = e.settlement;
  return {
    id: e.executionId,
    accountId: e.accountId,
    keyId: e.keyId,
    tokenId: e.tokenId,
    idempotencyKey: e.idempotencyKey,
    requestHash: e.requestHash,
    template: e.template,
    gatewayId: e.gatewayId,
    ...settledOutcome(s),
    reservedUnits: e.reservedUnits,
    chargedUnits: Math.min(s.chargedUnits, e.reservedUnits),
    createdAt: e.createdAt,
    finishedAt: e.finishedAt,
  };
}

/** A batch of one is one statement (no function call); bigger batches one call of sandfork_record (migration 0004_credit_leases, as 0010 redefines it). */
function recordStatement(items: LeasedExecution[]): [PreparedStatement, (string | null)[]] {
  if (items.length === 1) {
    const e = items[0] as LeasedExecution;
    const s = e.settlement;
    return [
      RECORD_ONE,
      [
        e.executionId,
        e.accountId,
        e.keyId,
        e.tokenId,
        e.requestHash,
        e.template,
        e.gatewayId,
        ...settlementParams(s),
        String(e.reservedUnits),
        String(s.chargedUnits),
        String(e.createdAt.getTime()),
        e.finishedAt === undefined ? null : String(e.finishedAt.getTime()),
        e.idempotencyKey,
        networkParam(s),
      ],
    ];
  }
  const batch = items.map((e) => ({
    id: e.executionId,
    account_id: e.accountId,
    key_id: e.keyId,
    token_id: e.tokenId,
    idempotency_key: e.idempotencyKey,
    request_hash: e.requestHash,
    template: e.template,
    gateway_id: e.gatewayId,
    ...settlementJson(e.settlement),
    reserved_units: e.reservedUnits,
    created_ms: e.createdAt.getTime(),
    finished_ms: e.finishedAt?.getTime() ?? null,
  }));
  return [RECORD_BATCH, [JSON.stringify(batch)]];
}

// The lease pays first: without one (or one that cannot cover the charge) nothing is inserted.
const RECORD_ONE: PreparedStatement = {
  name: "sandfork_record_one",
  text: `WITH spent AS (
    UPDATE credit_leases SET units = units - LEAST($15::int8, $14::int8) WHERE gateway_id = $7 AND account_id = $2::uuid RETURNING account_id
  ), settled AS (
    INSERT INTO executions (id, account_id, key_id, token_id, request_hash, template, gateway_id, status, exit_code, stdout, stderr,
                            truncated, timings, reserved_units, charged_units, created_at, finished_at, idempotency_key, network)
    SELECT $1::uuid, spent.account_id, $3::uuid, $4, $5, $6, $7, $8, $9::int4, $10, $11, $12::text::bool, $13::jsonb, $14::int8,
           LEAST($15::int8, $14::int8), to_timestamp($16::float8 / 1000), coalesce(to_timestamp($17::float8 / 1000), now()), $18,
           $19::jsonb
    FROM spent
    RETURNING executions.*
  ), paid AS (
    UPDATE accounts SET reserved_units = accounts.reserved_units - settled.charged_units, balance_units = accounts.balance_units - settled.charged_units
    FROM settled WHERE accounts.id = settled.account_id
  )
  SELECT ${SETTLED_COLUMNS} FROM settled`,
};

const RECORD_BATCH: PreparedStatement = {
  name: "sandfork_record",
  text: `SELECT ${SETTLED_COLUMNS} FROM sandfork_record($1::jsonb) AS settled`,
};
