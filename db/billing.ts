// Reserve-then-settle credit accounting around one execution. Each of reserve and settle is ONE
// SQL statement (data-modifying CTEs): one round trip, atomic on its own, no BEGIN/COMMIT.
//
// reserve: holds the worst-case cost with a conditional UPDATE that only succeeds while
//   balance - reserved covers it, so concurrent reservations on one account can never overspend,
//   and while the key is not revoked (tokens minted from it are verified without the database, so
//   this is where a revocation reaches them), and inserts the execution record where the hold
//   succeeded. Its unique (key, Idempotency-Key) index turns a duplicate request into an error of
//   the whole statement, so nothing stays held. Only when nothing was held does a further query say
//   why.
// settle: moves the execution from running to its final state (only from running, so a second
//   settle is a no-op), spends the actual cost, frees the hold and writes the single usage ledger
//   entry. It commits before the gateway answers.
// release: frees the hold of an execution that the runtime could not run; nothing is charged.
import { and, eq, lt, notInArray, or, sql } from "drizzle-orm";
import { type Database, GATEWAY_APPLICATION_PREFIX, type OpenDatabase } from "./client.js";
import { accounts, apiKeys, executions } from "./schema.js";

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
  /** The gateway process that reserved it; null for records from before gateways had ids. */
  gatewayId: string | null;
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

/** The rows of a raw db.execute: PGlite answers { rows }, postgres.js an array of rows. */
function rowsOf(result: unknown): Record<string, unknown>[] {
  return (Array.isArray(result) ? result : (result as { rows: Record<string, unknown>[] }).rows) as Record<string, unknown>[];
}

/** An executions row as raw SQL returns it (snake_case; int8 a string on postgres.js; timestamps strings). */
function fromSqlRow(row: Record<string, unknown>): ExecutionRecord {
  const units = (v: unknown) => (v === null ? null : Number(v));
  const date = (v: unknown) => (v === null ? null : new Date(v as string));
  return {
    id: row.id as string,
    accountId: row.account_id as string,
    keyId: row.key_id as string,
    tokenId: row.token_id as string | null,
    idempotencyKey: row.idempotency_key as string | null,
    requestHash: row.request_hash as string,
    template: row.template as string,
    gatewayId: row.gateway_id as string | null,
    status: row.status as ExecutionStatus,
    exitCode: row.exit_code as number | null,
    stdout: row.stdout as string | null,
    stderr: row.stderr as string | null,
    truncated: row.truncated as boolean | null,
    timings: row.timings as ExecutionTimingsRecord | null,
    reservedUnits: Number(row.reserved_units),
    chargedUnits: units(row.charged_units),
    createdAt: new Date(row.created_at as string),
    finishedAt: date(row.finished_at),
  };
}

/** What reserve records about a new execution, and the units it holds. */
export type Reservation = Pick<ExecutionRecord, "accountId" | "keyId" | "tokenId" | "idempotencyKey" | "requestHash" | "template" | "gatewayId"> & {
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

/** True while the key exists and is not revoked; checked inside reserve's hold. */
function keyUsable(keyId: string) {
  return sql`EXISTS (SELECT 1 FROM ${apiKeys} WHERE ${apiKeys.id} = ${keyId} AND ${apiKeys.revokedAt} IS NULL)`;
}

export async function reserve(db: Database, r: Reservation): Promise<ReserveOutcome> {
  if (!Number.isSafeInteger(r.units) || r.units < 0) throw new RangeError("a reservation is a non-negative integer");
  let inserted: Record<string, unknown>[];
  try {
    // One statement, so one round trip and atomic without BEGIN/COMMIT: the hold, then the record
    // only where the hold succeeded. A duplicate Idempotency-Key fails the whole statement (the
    // hold with it) on the unique index.
    inserted = rowsOf(
      await db.execute(sql`
        WITH held AS (
          UPDATE accounts SET reserved_units = reserved_units + ${r.units}::int8
          WHERE id = ${r.accountId}::uuid AND balance_units - reserved_units >= ${r.units}::int8 AND ${keyUsable(r.keyId)}
          RETURNING id
        )
        INSERT INTO executions (id, account_id, key_id, token_id, idempotency_key, request_hash, template, gateway_id, status, reserved_units)
        SELECT ${r.executionId}::uuid, held.id, ${r.keyId}::uuid, ${r.tokenId}::text, ${r.idempotencyKey}::text, ${r.requestHash}::text,
               ${r.template}::text, ${r.gatewayId}::text, 'running', ${r.units}::int8
        FROM held
        RETURNING id`),
    );
  } catch (error) {
    if (r.idempotencyKey !== null && isUniqueViolation(error)) {
      const existing = await findByIdempotencyKey(db, r.keyId, r.idempotencyKey);
      if (existing) return { kind: "duplicate", existing };
    }
    throw error;
  }
  if (inserted.length > 0) return { kind: "reserved" };
  // Nothing held: say why. A duplicate first (it would have failed before any credit check), then
  // the key, then the credits.
  if (r.idempotencyKey !== null) {
    const existing = await findByIdempotencyKey(db, r.keyId, r.idempotencyKey);
    if (existing) return { kind: "duplicate", existing };
  }
  const [account] = await db
    .select({
      available: sql<number>`(${accounts.balanceUnits} - ${accounts.reservedUnits})::bigint`,
      keyUsable: sql<boolean>`${keyUsable(r.keyId)}`,
    })
    .from(accounts)
    .where(eq(accounts.id, r.accountId));
  if (!account?.keyUsable) return { kind: "key-revoked" };
  return { kind: "insufficient-credits", availableUnits: Number(account.available) };
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
  // One statement (one round trip, atomic): the record leaves running, the account pays and frees
  // the hold, the ledger gets its row; all three only if the record was still running.
  const [row] = rowsOf(
    await db.execute(sql`
      WITH settled AS (
        UPDATE executions SET status = ${s.status}::text, exit_code = ${s.exitCode}::int, stdout = ${s.stdout}::text, stderr = ${s.stderr}::text,
               truncated = ${s.truncated}::boolean, timings = ${JSON.stringify(s.timings)}::jsonb,
               charged_units = LEAST(${s.chargedUnits}::int8, reserved_units), finished_at = now()
        WHERE id = ${executionId}::uuid AND status = 'running'
        RETURNING *
      ), spent AS (
        UPDATE accounts SET reserved_units = accounts.reserved_units - settled.reserved_units,
               balance_units = accounts.balance_units - settled.charged_units
        FROM settled WHERE accounts.id = settled.account_id
      ), ledger AS (
        INSERT INTO usage_ledger (account_id, key_id, execution_id, kind, template, units)
        SELECT account_id, key_id, id, 'usage', template, charged_units FROM settled
      )
      SELECT * FROM settled`),
  );
  if (row !== undefined) return fromSqlRow(row);
  const existing = await findExecution(db, executionId);
  if (!existing) throw new Error(`no execution ${executionId}`);
  return existing;
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

/**
 * The recovery pass a gateway runs when it starts: releases the holds of running executions whose
 * gateway is gone (its id not among `liveGatewayIds`), and of any running execution older than
 * `startedBefore` (certainly past its deadline, whoever ran it). Their programs' answers were
 * never sent, so nothing is charged. Returns how many were released.
 */
export async function releaseAbandonedReservations(db: Database, liveGatewayIds: string[], startedBefore: Date): Promise<number> {
  const ownerGone = liveGatewayIds.length === 0 ? sql`true` : sql`${executions.gatewayId} IS NULL OR ${notInArray(executions.gatewayId, liveGatewayIds)}`;
  const abandoned = await db
    .select({ id: executions.id })
    .from(executions)
    .where(and(eq(executions.status, "running"), or(ownerGone, lt(executions.createdAt, startedBefore))));
  let released = 0;
  for (const { id } of abandoned) if (await release(db, id)) released++;
  return released;
}

/**
 * The gateways that have the database open now, `self` among them. PGlite: only this process
 * can (db/client.ts locks its directory). PostgreSQL: every gateway's sessions carry its id in
 * application_name, and a killed process's sessions end with it.
 */
export async function liveGatewayIds(open: OpenDatabase, self: string): Promise<string[]> {
  if (open.backend === "pglite") return [self];
  const rows = await open.db
    .select({ name: sql<string>`application_name` })
    .from(sql`pg_stat_activity`)
    .where(sql`application_name LIKE ${`${GATEWAY_APPLICATION_PREFIX}%`}`);
  return [...new Set([self, ...rows.map((r) => r.name.slice(GATEWAY_APPLICATION_PREFIX.length))])];
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
