// Reserve-then-settle credit accounting around one execution. Each of reserve and settle is ONE
// prepared statement (db/prepared.ts): one round trip, atomic on its own, no BEGIN/COMMIT. Both
// take a batch (reserveAll, settleAll): the gateway group-commits concurrent executions' reserves
// and settles (BillingBatches, db/group-commit.ts), one statement and one commit for each batch.
// A batch of one is a single SQL statement of primary-key lookups; bigger batches call a PL/pgSQL
// function (db/migrations/0003_billing_functions.sql) that sums per account and locks accounts in
// id order.
//
// reserve: holds the worst-case cost with a conditional UPDATE that only succeeds while
//   balance - reserved covers it (a batch's holds summed per account), so concurrent reservations
//   on one account can never overspend, and while the key is not revoked (tokens minted from it
//   are verified without the database, so this is where a revocation reaches them), and inserts
//   the execution record where the hold succeeded. Its unique (key, Idempotency-Key) index turns a
//   duplicate request into an error of the whole statement, so nothing stays held. Only when
//   something was not held do further queries (one reservation at a time) say why.
// settle: moves the execution from running to its final state (only from running, so a second
//   settle is a no-op), spends the actual cost and frees the hold; the settled record, with its
//   charged units, is the execution's entry in the accounts' journal (db/usage.ts sums them). It
//   commits before the gateway answers.
// release: frees the hold of an execution that the runtime could not run; nothing is charged.
// Executions that need no record before they end take the cheaper path of db/leases.ts instead.
import { and, eq, inArray, lt, notInArray, or, type SQL, sql } from "drizzle-orm";
import type { AnyPgColumn } from "drizzle-orm/pg-core";
import { type Database, GATEWAY_APPLICATION_PREFIX, type OpenDatabase } from "./client.js";
import { GroupCommit } from "./group-commit.js";
import { type PreparedStatement, type RunOptions, runPrepared, type TextRow } from "./prepared.js";
import { accounts, apiKeys, executions } from "./schema.js";

export const EXECUTION_STATUSES = [
  "running",
  "completed",
  "timed_out",
  "memory_exceeded",
  "output_exceeded",
  "crashed",
  "unsupported_syscall",
  "deadlocked",
  "network_exceeded",
  "aborted",
] as const;
export type ExecutionStatus = (typeof EXECUTION_STATUSES)[number];

export interface ExecutionTimingsRecord {
  queueMs: number;
  forkMs: number;
  execMs: number;
  totalMs: number;
}

/** What an execution did on the network (stored as the record's `network`). */
export interface NetworkUsageRecord {
  bytesIn: number;
  bytesOut: number;
  connections: number;
  refused: number;
  dnsQueries: number;
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
  /** Null when the execution was granted no network. */
  network: NetworkUsageRecord | null;
  reservedUnits: number;
  chargedUnits: number | null;
  createdAt: Date;
  finishedAt: Date | null;
}

/**
 * What a settle statement answers of each record it settled, as text columns: everything the
 * settlement itself does not say (its outcome and output come from the caller, not back through
 * the database). Timestamps as epoch milliseconds.
 */
export const SETTLED_COLUMNS = `settled.id::text, settled.account_id::text, settled.key_id::text, settled.token_id, settled.idempotency_key,
  settled.request_hash, settled.template, settled.gateway_id, settled.reserved_units::text, settled.charged_units::text,
  (extract(epoch FROM settled.created_at) * 1000)::text AS created_at, (extract(epoch FROM settled.finished_at) * 1000)::text AS finished_at`;

type Outcome = Pick<
  ExecutionRecord,
  "status" | "exitCode" | "stdout" | "stderr" | "truncated" | "timings" | "network"
>;

/** How the execution ended, as a settled record holds it. */
export function settledOutcome(s: Settlement): Outcome {
  return {
    status: s.status,
    exitCode: s.exitCode,
    stdout: s.stdout,
    stderr: s.stderr,
    truncated: s.truncated,
    timings: s.timings,
    network: s.network,
  };
}

/** A record from the text columns of SETTLED_COLUMNS (or more) and how it ended. */
function recordOf(row: TextRow, outcome: Outcome): ExecutionRecord {
  return {
    id: row.id as string,
    accountId: row.account_id as string,
    keyId: row.key_id as string,
    tokenId: row.token_id ?? null,
    idempotencyKey: row.idempotency_key ?? null,
    requestHash: row.request_hash as string,
    template: row.template as string,
    gatewayId: row.gateway_id ?? null,
    ...outcome,
    reservedUnits: Number(row.reserved_units),
    chargedUnits: row.charged_units == null ? null : Number(row.charged_units),
    createdAt: new Date(Number(row.created_at)),
    finishedAt: row.finished_at == null ? null : new Date(Number(row.finished_at)),
  };
}

export function fromSettledRow(row: TextRow, s: Settlement): ExecutionRecord {
  return recordOf(row, settledOutcome(s));
}

/** A whole record as text columns, for the lookups (findExecution, findByIdempotencyKey). */
export const RECORD_COLUMNS = `${SETTLED_COLUMNS.replaceAll("settled.", "")}, status, exit_code::text, stdout, stderr, truncated::text, timings::text, network::text`;

/** A record as RECORD_COLUMNS gives it, running or final. */
export function fromRecordRow(row: TextRow): ExecutionRecord {
  return recordOf(row, {
    status: row.status as ExecutionStatus,
    exitCode: row.exit_code == null ? null : Number(row.exit_code),
    stdout: row.stdout ?? null,
    stderr: row.stderr ?? null,
    truncated: row.truncated == null ? null : row.truncated === "true",
    timings: row.timings == null ? null : (JSON.parse(row.timings) as ExecutionTimingsRecord),
    network: row.network == null ? null : (JSON.parse(row.network) as NetworkUsageRecord),
  });
}

/** What reserve records about a new execution, and the units it holds. */
export type Reservation = Pick<
  ExecutionRecord,
  "accountId" | "keyId" | "tokenId" | "idempotencyKey" | "requestHash" | "template"
> & {
  executionId: string;
  /** The gateway running it: the recovery pass at start releases the reservations of dead ones. */
  gatewayId: string;
  units: number;
};

/** The record reserving `r` writes: running, nothing charged yet. */
export function runningRecord(r: Reservation, createdAt = new Date()): ExecutionRecord {
  const { executionId, units, ...identity } = r;
  const outcome = {
    status: "running",
    exitCode: null,
    stdout: null,
    stderr: null,
    truncated: null,
    timings: null,
    network: null,
  } as const;
  return {
    id: executionId,
    ...identity,
    ...outcome,
    reservedUnits: units,
    chargedUnits: null,
    createdAt,
    finishedAt: null,
  };
}

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

/**
 * The account's available credits (balance - reserved) and whether `keyId` exists unrevoked, in
 * one read; undefined without the account. `lock` takes the account's row for an update of its
 * credits (FOR NO KEY UPDATE: rows whose foreign keys point at the account hold KEY SHARE locks
 * on it, which FOR UPDATE would wait for).
 */
export async function accountStanding(
  db: Pick<Database, "select">,
  accountId: string,
  keyId: string,
  lock = false,
): Promise<{ availableUnits: number; keyUsable: boolean } | undefined> {
  const query = db
    .select({
      available: sql<string>`(${accounts.balanceUnits} - ${accounts.reservedUnits})::text`,
      keyUsable: sql<boolean>`EXISTS (SELECT 1 FROM ${apiKeys} WHERE ${apiKeys.id} = ${keyId} AND ${apiKeys.revokedAt} IS NULL)`,
    })
    .from(accounts)
    .where(eq(accounts.id, accountId));
  const [row] = await (lock ? query.for("no key update") : query);
  return row === undefined
    ? undefined
    : { availableUnits: Number(row.available), keyUsable: row.keyUsable };
}

/**
 * Reserves each of `rs` (one outcome per reservation, in order) with ONE statement for the whole
 * batch: the holds are summed per account and taken only where the account covers the sum, and
 * the records are inserted where the hold succeeded. Anything unusual (a repeated
 * Idempotency-Key, which fails the whole statement; a revoked key; an account that could not
 * cover its batch's sum but might cover some of it) is then decided one reservation at a time,
 * in submission order, so every outcome is exactly what reserving alone would have answered.
 */
export async function reserveAll(db: Database, rs: Reservation[]): Promise<ReserveOutcome[]> {
  for (const r of rs)
    if (!Number.isSafeInteger(r.units) || r.units < 0)
      throw new RangeError("a reservation is a non-negative integer");
  let held: Set<string>;
  try {
    held = new Set((await runPrepared(db, ...reserveStatement(rs))).map((row) => row.id as string));
  } catch (error) {
    if (!isUniqueViolation(error)) throw error;
    if (rs.length > 1) return reserveEach(db, rs);
    const [r] = rs as [Reservation];
    const existing =
      r.idempotencyKey === null
        ? undefined
        : await findByIdempotencyKey(db, r.keyId, r.idempotencyKey);
    if (existing) return [{ kind: "duplicate", existing }];
    throw error;
  }
  if (rs.length > 1) {
    if (held.size === rs.length) return rs.map(() => ({ kind: "reserved" }));
    const outcomes: ReserveOutcome[] = [];
    for (const r of rs)
      outcomes.push(
        held.has(r.executionId)
          ? { kind: "reserved" }
          : ((await reserveAll(db, [r]))[0] as ReserveOutcome),
      );
    return outcomes;
  }
  return [held.size > 0 ? { kind: "reserved" } : await whyNotReserved(db, rs[0] as Reservation)];
}

export async function reserve(db: Database, r: Reservation): Promise<ReserveOutcome> {
  return (await reserveAll(db, [r]))[0] as ReserveOutcome;
}

async function reserveEach(db: Database, rs: Reservation[]): Promise<ReserveOutcome[]> {
  const outcomes: ReserveOutcome[] = [];
  for (const r of rs) outcomes.push(await reserve(db, r));
  return outcomes;
}

/**
 * A batch of one (every execution at concurrency 1, most of them under load) is one statement of
 * primary-key lookups, cheaper than the function call; bigger batches are one call of
 * sandfork_reserve (migration 0003_billing_functions), which sums the holds per account and
 * locks the accounts in id order. Either is one round trip, atomic.
 */
function reserveStatement(rs: Reservation[]): [PreparedStatement, (string | null)[]] {
  if (rs.length === 1) {
    const r = rs[0] as Reservation;
    return [
      RESERVE_ONE,
      [
        r.executionId,
        r.accountId,
        r.keyId,
        r.tokenId,
        r.idempotencyKey,
        r.requestHash,
        r.template,
        r.gatewayId,
        String(r.units),
      ],
    ];
  }
  const batch = rs.map((r) => ({
    execution_id: r.executionId,
    account_id: r.accountId,
    key_id: r.keyId,
    token_id: r.tokenId,
    idempotency_key: r.idempotencyKey,
    request_hash: r.requestHash,
    template: r.template,
    gateway_id: r.gatewayId,
    units: r.units,
  }));
  return [RESERVE_BATCH, [JSON.stringify(batch)]];
}

const RESERVE_ONE: PreparedStatement = {
  name: "sandfork_reserve_one",
  text: `WITH held AS (
    UPDATE accounts SET reserved_units = reserved_units + $9::int8
    WHERE id = $2::uuid AND balance_units - reserved_units >= $9::int8
      AND EXISTS (SELECT 1 FROM api_keys WHERE api_keys.id = $3::uuid AND api_keys.revoked_at IS NULL)
    RETURNING accounts.id
  )
  INSERT INTO executions (id, account_id, key_id, token_id, idempotency_key, request_hash, template, gateway_id, status, reserved_units)
  SELECT $1::uuid, held.id, $3::uuid, $4, $5, $6, $7, $8, 'running', $9::int8 FROM held
  RETURNING executions.id::text`,
};

const RESERVE_BATCH: PreparedStatement = {
  name: "sandfork_reserve",
  text: "SELECT id::text FROM sandfork_reserve($1::jsonb) AS id",
};

/** Nothing was held for `r` alone: say why. A duplicate first (it would have failed before any credit check), then the key, then the credits. */
async function whyNotReserved(db: Database, r: Reservation): Promise<ReserveOutcome> {
  if (r.idempotencyKey !== null) {
    const existing = await findByIdempotencyKey(db, r.keyId, r.idempotencyKey);
    if (existing) return { kind: "duplicate", existing };
  }
  const account = await accountStanding(db, r.accountId, r.keyId);
  if (!account?.keyUsable) return { kind: "key-revoked" };
  return { kind: "insufficient-credits", availableUnits: account.availableUnits };
}

export interface Settlement {
  status: Exclude<ExecutionStatus, "running" | "aborted">;
  exitCode: number | null;
  stdout: string;
  stderr: string;
  truncated: boolean;
  timings: ExecutionTimingsRecord;
  /** Null when the execution was granted no network. */
  network: NetworkUsageRecord | null;
  /** Actual cost; the caller caps it at the reservation. */
  chargedUnits: number;
}

export interface SettlementOf {
  executionId: string;
  settlement: Settlement;
}

/**
 * Settles each execution exactly once, ONE statement for the whole batch: every record still
 * running leaves it, its account pays and frees the hold (summed per account). Answers the settled record, or the already-final record of a repeat, in order.
 * Atomic: if the statement fails, none of the batch is billed.
 */
export async function settleAll(db: Database, items: SettlementOf[]): Promise<ExecutionRecord[]> {
  for (const { settlement } of items) checkCharge(settlement);
  const rows = await runPrepared(db, ...settleStatement(items));
  // The rows come back without what the caller already holds (no copy of a large output back
  // through the database); a repeat's record is read whole instead.
  const settled = new Map(rows.map((row) => [row.id as string, row]));
  const records: ExecutionRecord[] = [];
  for (const { executionId, settlement } of items) {
    const row = settled.get(executionId);
    const record =
      row !== undefined ? fromSettledRow(row, settlement) : await findExecution(db, executionId);
    if (!record) throw new Error(`no execution ${executionId}`);
    records.push(record);
  }
  return records;
}

/** Settles exactly once: returns the settled record, or the already-final record on a repeat. */
export async function settle(
  db: Database,
  executionId: string,
  settlement: Settlement,
): Promise<ExecutionRecord> {
  return (await settleAll(db, [{ executionId, settlement }]))[0] as ExecutionRecord;
}

/**
 * Only records still running settle, so a second settle is a no-op. A batch of one is one
 * statement of primary-key lookups; bigger ones are one call of sandfork_settle (migration
 * 0003_billing_functions), which locks their accounts in id order first. Each answers the
 * records it settled as SETTLED_COLUMNS.
 */
function settleStatement(items: SettlementOf[]): [PreparedStatement, (string | null)[]] {
  if (items.length === 1) {
    const { executionId, settlement: s } = items[0] as SettlementOf;
    return [
      SETTLE_ONE,
      [executionId, ...settlementParams(s), String(s.chargedUnits), networkParam(s)],
    ];
  }
  const batch = items.map(({ executionId, settlement }) => ({
    id: executionId,
    ...settlementJson(settlement),
  }));
  return [SETTLE_BATCH, [JSON.stringify(batch)]];
}

/** Throws unless the settlement's charge is a whole number of units. */
export function checkCharge(s: Settlement): void {
  if (!Number.isSafeInteger(s.chargedUnits) || s.chargedUnits < 0)
    throw new RangeError("a charge is a non-negative integer");
}

/** A settlement's outcome as the single-row statements (SETTLE_ONE, RECORD_ONE) take it, six text parameters in a row. */
export function settlementParams(s: Settlement): (string | null)[] {
  return [
    s.status,
    s.exitCode === null ? null : String(s.exitCode),
    s.stdout,
    s.stderr,
    String(s.truncated),
    JSON.stringify(s.timings),
  ];
}

/** A settlement's network usage as the single-row statements take it: their last parameter. */
export function networkParam(s: Settlement): string | null {
  return s.network === null ? null : JSON.stringify(s.network);
}

/** A settlement as the batch functions (sandfork_settle, sandfork_record) take it, one JSON object's fields. */
export function settlementJson(s: Settlement) {
  return {
    status: s.status,
    exit_code: s.exitCode,
    stdout: s.stdout,
    stderr: s.stderr,
    truncated: s.truncated,
    timings: s.timings,
    network: s.network,
    charged_units: s.chargedUnits,
  };
}

const SETTLE_ONE: PreparedStatement = {
  name: "sandfork_settle_one",
  text: `WITH settled AS (
    UPDATE executions SET status = $2, exit_code = $3::int4, stdout = $4, stderr = $5, truncated = $6::text::bool, timings = $7::jsonb,
           network = $9::jsonb, charged_units = LEAST($8::int8, reserved_units), finished_at = now()
    WHERE id = $1::uuid AND status = 'running'
    RETURNING executions.*
  ), paid AS (
    UPDATE accounts SET reserved_units = accounts.reserved_units - settled.reserved_units, balance_units = accounts.balance_units - settled.charged_units
    FROM settled WHERE accounts.id = settled.account_id
  )
  SELECT ${SETTLED_COLUMNS} FROM settled`,
};

const SETTLE_BATCH: PreparedStatement = {
  name: "sandfork_settle",
  text: `SELECT ${SETTLED_COLUMNS} FROM sandfork_settle($1::jsonb) AS settled`,
};

/**
 * Reserve and settle group-committed on one database: the executions that reserve (or settle)
 * while an earlier batch's statement is in flight share the next statement. Each caller's
 * promise settles when its batch has committed, so a settlement is still durable before the
 * answer; a lone caller's goes at once.
 */
export class BillingBatches {
  private readonly reservations: GroupCommit<Reservation, ReserveOutcome>;
  private readonly settlements: GroupCommit<SettlementOf, ExecutionRecord>;

  /**
   * `freeUp(accountId)` gives back credits of the account that this gateway holds idle (its
   * credit lease, gateway/credit-leases.ts) and says whether there were any: a reservation that
   * found the account short is then tried once more.
   */
  constructor(
    private readonly db: Database,
    private readonly freeUp: (accountId: string) => Promise<boolean> = async () => false,
  ) {
    this.reservations = new GroupCommit((rs) => reserveAll(db, rs));
    this.settlements = new GroupCommit((items) => settleAll(db, items));
  }

  async reserve(r: Reservation): Promise<ReserveOutcome> {
    const outcome = await this.reservations.submit(r);
    if (outcome.kind !== "insufficient-credits" || !(await this.freeUp(r.accountId)))
      return outcome;
    return this.reservations.submit(r);
  }

  /**
   * A settlement the database refuses (its batch's statement failed: nothing of it committed)
   * rejects, and its execution's hold is released at once, unanswered and uncharged, rather than
   * by the next start's recovery pass (which still frees it if this release fails too).
   */
  async settle(executionId: string, settlement: Settlement): Promise<ExecutionRecord> {
    try {
      return await this.settlements.submit({ executionId, settlement });
    } catch (error) {
      await release(this.db, executionId).catch(() => false);
      throw error;
    }
  }
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
export async function releaseAbandonedReservations(
  db: Database,
  liveGatewayIds: string[],
  startedBefore: Date,
): Promise<number> {
  const ownerGone = ofGoneGateway(executions.gatewayId, liveGatewayIds);
  const abandoned = await db
    .select({ id: executions.id })
    .from(executions)
    .where(
      and(eq(executions.status, "running"), or(ownerGone, lt(executions.createdAt, startedBefore))),
    );
  let released = 0;
  for (const { id } of abandoned) if (await release(db, id)) released++;
  return released;
}

/** Rows whose gateway (`column`; null: from before gateways had ids) is not among `liveGatewayIds`. */
export function ofGoneGateway(column: AnyPgColumn, liveGatewayIds: string[]): SQL {
  return liveGatewayIds.length === 0
    ? sql`true`
    : sql`${column} IS NULL OR ${notInArray(column, liveGatewayIds)}`;
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

/** Which of these execution ids have a record. */
export async function recordedIds(db: Database, ids: string[]): Promise<Set<string>> {
  if (ids.length === 0) return new Set();
  const rows = await db
    .select({ id: executions.id })
    .from(executions)
    .where(inArray(executions.id, ids));
  return new Set(rows.map((r) => r.id));
}

// Prepared (db/prepared.ts): on PGlite, drizzle's unnamed statement was a parse and plan in the gateway's thread at every lookup.
const FIND_EXECUTION: PreparedStatement = {
  name: "sandfork_find_execution",
  text: `SELECT ${RECORD_COLUMNS} FROM executions WHERE id = $1::uuid`,
};

const FIND_BY_IDEMPOTENCY_KEY: PreparedStatement = {
  name: "sandfork_find_by_idempotency_key",
  text: `SELECT ${RECORD_COLUMNS} FROM executions WHERE key_id = $1::uuid AND idempotency_key = $2`,
};

export async function findExecution(
  db: Database,
  id: string,
): Promise<ExecutionRecord | undefined> {
  const [row] = await runPrepared(db, FIND_EXECUTION, [id]);
  return row === undefined ? undefined : fromRecordRow(row);
}

export async function findByIdempotencyKey(
  db: Database,
  keyId: string,
  idempotencyKey: string,
  options?: RunOptions,
): Promise<ExecutionRecord | undefined> {
  const [row] = await runPrepared(db, FIND_BY_IDEMPOTENCY_KEY, [keyId, idempotencyKey], options);
  return row === undefined ? undefined : fromRecordRow(row);
}
