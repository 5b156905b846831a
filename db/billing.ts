// Reserve-then-settle credit accounting around one execution.
//
// reserve: one transaction inserts the execution record (its unique (key, Idempotency-Key) index
//   turns a duplicate request into a conflict before anything is held) and holds the worst-case
//   cost with a conditional UPDATE that only succeeds while balance - reserved covers it, so
//   concurrent reservations on one account can never overspend, and while the key is not revoked
//   (tokens minted from it are verified without the database, so this is where a revocation
//   reaches them). Only when the hold fails does a further query say which condition did.
// settle: one transaction moves the execution from running to its final state (only from running,
//   so a second settle is a no-op), spends the actual cost, frees the hold and writes the single
//   usage ledger entry. It commits before the gateway answers.
// release: frees the hold of an execution that the runtime could not run; nothing is charged.
import { and, eq, lt, sql } from "drizzle-orm";
import type { Database } from "./client.js";
import { accounts, apiKeys, executions, usageLedger } from "./schema.js";

export const EXECUTION_STATUSES = [
  "running",
  "completed",
  "timed_out",
  "memory_exceeded",
  "output_exceeded",
  "crashed",
  "unsupported_syscall",
  "aborted",
] as const;
export type ExecutionStatus = (typeof EXECUTION_STATUSES)[number];

export interface ExecutionTimingsRecord {
  queueMs: number;
  forkMs: number;
  execMs: number;
  totalMs: number;
}

export interface ExecutionRecord {
  id: string;
  accountId: string;
  keyId: string;
  tokenId: string | null;
  idempotencyKey: string | null;
  requestHash: string;
  template: string;
  status: ExecutionStatus;
  exitCode: number | null;
  stdout: string | null;
  stderr: string | null;
  truncated: boolean | null;
  timings: ExecutionTimingsRecord | null;
  reservedUnits: number;
  chargedUnits: number | null;
  createdAt: Date;
  finishedAt: Date | null;
}

type ExecutionRow = typeof executions.$inferSelect;

function toRecord(row: ExecutionRow): ExecutionRecord {
  return { ...row, status: row.status as ExecutionStatus, timings: row.timings as ExecutionTimingsRecord | null };
}

/** What reserve records about a new execution, and the units it holds. */
export type Reservation = Pick<ExecutionRecord, "accountId" | "keyId" | "tokenId" | "idempotencyKey" | "requestHash" | "template"> & {
  executionId: string;
  units: number;
};

export type ReserveOutcome =
  | { kind: "reserved" }
  | { kind: "insufficient-credits"; availableUnits: number }
  | { kind: "duplicate"; existing: ExecutionRecord }
  // The key was revoked since the caller's credential was checked (e.g. a token minted from it).
  | { kind: "key-revoked" };

const UNIQUE_VIOLATION = "23505";

function isUniqueViolation(error: unknown): boolean {
  for (let e: unknown = error; e instanceof Error || (typeof e === "object" && e !== null); ) {
    if ((e as { code?: unknown }).code === UNIQUE_VIOLATION) return true;
    e = (e as { cause?: unknown }).cause;
    if (e === undefined) break;
  }
  return false;
}

class KeyRevoked extends Error {}

class InsufficientCredits extends Error {
  constructor(readonly availableUnits: number) {
    super("insufficient credits");
  }
}

/** True while the key exists and is not revoked; checked inside reserve's hold. */
function keyUsable(keyId: string) {
  return sql`EXISTS (SELECT 1 FROM ${apiKeys} WHERE ${apiKeys.id} = ${keyId} AND ${apiKeys.revokedAt} IS NULL)`;
}

export async function reserve(db: Database, r: Reservation): Promise<ReserveOutcome> {
  if (!Number.isSafeInteger(r.units) || r.units < 0) throw new RangeError("a reservation is a non-negative integer");
  try {
    await db.transaction(async (tx) => {
      // The record first: a duplicate Idempotency-Key fails here, before any credit check.
      await tx.insert(executions).values({
        id: r.executionId,
        accountId: r.accountId,
        keyId: r.keyId,
        tokenId: r.tokenId,
        idempotencyKey: r.idempotencyKey,
        requestHash: r.requestHash,
        template: r.template,
        status: "running",
        reservedUnits: r.units,
      });
      const held = await tx
        .update(accounts)
        .set({ reservedUnits: sql`${accounts.reservedUnits} + ${r.units}` })
        .where(and(eq(accounts.id, r.accountId), sql`${accounts.balanceUnits} - ${accounts.reservedUnits} >= ${r.units}`, keyUsable(r.keyId)))
        .returning({ id: accounts.id });
      if (held.length === 0) {
        const [account] = await tx
          .select({
            available: sql<number>`(${accounts.balanceUnits} - ${accounts.reservedUnits})::bigint`,
            keyUsable: sql<boolean>`${keyUsable(r.keyId)}`,
          })
          .from(accounts)
          .where(eq(accounts.id, r.accountId));
        // Either throw rolls the record back with the transaction.
        if (!account?.keyUsable) throw new KeyRevoked();
        throw new InsufficientCredits(Number(account.available));
      }
    });
    return { kind: "reserved" };
  } catch (error) {
    if (error instanceof InsufficientCredits) return { kind: "insufficient-credits", availableUnits: error.availableUnits };
    if (error instanceof KeyRevoked) return { kind: "key-revoked" };
    if (r.idempotencyKey !== null && isUniqueViolation(error)) {
      const existing = await findByIdempotencyKey(db, r.keyId, r.idempotencyKey);
      if (existing) return { kind: "duplicate", existing };
    }
    throw error;
  }
}

export interface Settlement {
  status: Exclude<ExecutionStatus, "running" | "aborted">;
  exitCode: number | null;
  stdout: string;
  stderr: string;
  truncated: boolean;
  timings: ExecutionTimingsRecord;
  /** Actual cost; the caller caps it at the reservation. */
  chargedUnits: number;
}

/** Settles exactly once: returns the settled record, or the already-final record on a repeat. */
export async function settle(db: Database, executionId: string, s: Settlement): Promise<ExecutionRecord> {
  if (!Number.isSafeInteger(s.chargedUnits) || s.chargedUnits < 0) throw new RangeError("a charge is a non-negative integer");
  return db.transaction(async (tx) => {
    const [row] = await tx
      .update(executions)
      .set({
        status: s.status,
        exitCode: s.exitCode,
        stdout: s.stdout,
        stderr: s.stderr,
        truncated: s.truncated,
        timings: s.timings,
        chargedUnits: sql`LEAST(${s.chargedUnits}, ${executions.reservedUnits})`,
        finishedAt: new Date(),
      })
      .where(and(eq(executions.id, executionId), eq(executions.status, "running")))
      .returning();
    if (!row) {
      const [existing] = await tx.select().from(executions).where(eq(executions.id, executionId));
      if (!existing) throw new Error(`no execution ${executionId}`);
      return toRecord(existing);
    }
    const charged = row.chargedUnits ?? 0;
    await tx
      .update(accounts)
      .set({
        reservedUnits: sql`${accounts.reservedUnits} - ${row.reservedUnits}`,
        balanceUnits: sql`${accounts.balanceUnits} - ${charged}`,
      })
      .where(eq(accounts.id, row.accountId));
    await tx.insert(usageLedger).values({
      accountId: row.accountId,
      keyId: row.keyId,
      executionId: row.id,
      kind: "usage",
      template: row.template,
      units: charged,
    });
    return toRecord(row);
  });
}

/**
 * Frees the hold of an execution that did not run to a reportable end. Its Idempotency-Key is
 * cleared so that a retry runs afresh. Returns false when it was no longer running.
 */
export async function release(db: Database, executionId: string): Promise<boolean> {
  return db.transaction(async (tx) => {
    const [row] = await tx
      .update(executions)
      .set({ status: "aborted", chargedUnits: 0, idempotencyKey: null, finishedAt: new Date() })
      .where(and(eq(executions.id, executionId), eq(executions.status, "running")))
      .returning({ accountId: executions.accountId, reservedUnits: executions.reservedUnits });
    if (!row) return false;
    await tx
      .update(accounts)
      .set({ reservedUnits: sql`${accounts.reservedUnits} - ${row.reservedUnits}` })
      .where(eq(accounts.id, row.accountId));
    return true;
  });
}

/** Releases holds left by a gateway that stopped mid-execution. Returns how many were released. */
export async function releaseStaleReservations(db: Database, startedBefore: Date): Promise<number> {
  const stale = await db
    .select({ id: executions.id })
    .from(executions)
    .where(and(eq(executions.status, "running"), lt(executions.createdAt, startedBefore)));
  let released = 0;
  for (const { id } of stale) if (await release(db, id)) released++;
  return released;
}

export async function findExecution(db: Database, id: string): Promise<ExecutionRecord | undefined> {
  const [row] = await db.select().from(executions).where(eq(executions.id, id));
  return row === undefined ? undefined : toRecord(row);
}

export async function findByIdempotencyKey(db: Database, keyId: string, idempotencyKey: string): Promise<ExecutionRecord | undefined> {
  const [row] = await db
    .select()
    .from(executions)
    .where(and(eq(executions.keyId, keyId), eq(executions.idempotencyKey, idempotencyKey)));
  return row === undefined ? undefined : toRecord(row);
}
