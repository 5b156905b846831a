// Stateful sessions' records and their metering. A session accrues running time (its memory
// limit x the milliseconds it holds a running VM) and checkpoint storage (its checkpoints' bytes x
// the milliseconds they are kept), exactly, in numeric columns; each accrual (`accrue`, under the
// session row's lock) charges the units that became due since the last one, rounded up once over
// the whole, so frequent accruals cost no more than one. Its cells are charged as executions
// (db/billing.ts). A charge never overspends: an account short of credits is charged what it has,
// and the caller stops the session (`AccrualOutcome.short`).
import { and, eq, inArray, sql } from "drizzle-orm";
import type { Database } from "./client.js";
import { type PreparedStatement, runPrepared } from "./prepared.js";
import { accounts, sessions, usageLedger } from "./schema.js";

export type SessionRow = typeof sessions.$inferSelect;
export type SessionStateName = SessionRow["state"];

/** Units per GiB-second of running memory limit, per GiB-hour of checkpoints. */
export interface SessionRates {
  unitsPerGibSecond: number;
  unitsPerGibHour: number;
}

const MIB_MS_PER_GIB_SECOND = 1024n * 1000n;
const BYTE_MS_PER_GIB_HOUR = (1n << 30n) * 3_600_000n;

const ceilDiv = (a: bigint, b: bigint): bigint => (a + b - 1n) / b;

/** Units due for what a session has accrued in all. */
export function unitsDue(rates: SessionRates, runningMibMs: bigint, storageByteMs: bigint): number {
  const due =
    ceilDiv(runningMibMs * BigInt(rates.unitsPerGibSecond), MIB_MS_PER_GIB_SECOND) +
    ceilDiv(storageByteMs * BigInt(rates.unitsPerGibHour), BYTE_MS_PER_GIB_HOUR);
  return Number(due);
}

export type NewSession = Pick<
  SessionRow,
  | "id"
  | "accountId"
  | "keyId"
  | "tokenId"
  | "template"
  | "memoryMib"
  | "idleTimeoutS"
  | "maxLifetimeS"
>;

export async function insertSession(
  db: Database,
  session: NewSession,
  now: Date,
): Promise<SessionRow> {
  const [row] = await db
    .insert(sessions)
    .values({
      ...session,
      state: "running",
      runningSince: now,
      storageSince: now,
      createdAt: now,
      lastActiveAt: now,
    })
    .returning();
  return row as SessionRow;
}

/**
 * Inserts the sessions, all of one key, unless that would make the key hold more than
 * `maxSessions` (not deleted), counted under the key's advisory lock, so that gateways creating
 * sessions at once cannot pass the limit together. All or none: undefined when they do not fit.
 */
export async function insertSessionsWithin(
  db: Database,
  rows: NewSession[],
  now: Date,
  maxSessions: number,
): Promise<SessionRow[] | undefined> {
  const keyId = rows[0]?.keyId;
  if (keyId === undefined) return [];
  if (rows.some((row) => row.keyId !== keyId))
    throw new Error("insertSessionsWithin takes the sessions of one key");
  return db.transaction(async (tx) => {
    await tx.execute(sql`SELECT pg_advisory_xact_lock(hashtextextended(${keyId}::text, 7412))`);
    const held = await keySessionTotals(tx as unknown as Database, keyId);
    if (held.sessions + rows.length > maxSessions) return undefined;
    const inserted: SessionRow[] = [];
    for (const row of rows) inserted.push(await insertSession(tx as unknown as Database, row, now));
    return inserted;
  });
}

export async function findSession(db: Database, id: string): Promise<SessionRow | undefined> {
  const [row] = await db.select().from(sessions).where(eq(sessions.id, id));
  return row;
}

/** The key's sessions that are not deleted, newest first. */
export async function listSessions(db: Database, keyId: string): Promise<SessionRow[]> {
  return db
    .select()
    .from(sessions)
    .where(and(eq(sessions.keyId, keyId), inArray(sessions.state, ["running", "paused", "ended"])))
    .orderBy(sql`${sessions.createdAt} DESC`);
}

/** Sessions of the key that count against its limits: not deleted; and their checkpoint bytes. */
export async function keySessionTotals(
  db: Database,
  keyId: string,
): Promise<{ sessions: number; checkpointBytes: number }> {
  const [row] = await db
    .select({
      sessions: sql<number>`count(*)::int`,
      bytes: sql<string>`coalesce(sum(${sessions.checkpointBytes}), 0)::text`,
    })
    .from(sessions)
    .where(and(eq(sessions.keyId, keyId), inArray(sessions.state, ["running", "paused", "ended"])));
  return { sessions: row?.sessions ?? 0, checkpointBytes: Number(row?.bytes ?? "0") };
}

/** Running sessions idle since before `cutoff` for their own idle timeout, as of `now`. */
export async function idleRunningSessions(db: Database, now: Date): Promise<SessionRow[]> {
  return db
    .select()
    .from(sessions)
    .where(
      and(
        eq(sessions.state, "running"),
        sql`${sessions.lastActiveAt} + make_interval(secs => ${sessions.idleTimeoutS}) <= ${now.toISOString()}::timestamptz`,
      ),
    );
}

/** Sessions (not deleted) past their maximum lifetime as of `now`. */
export async function expiredSessions(db: Database, now: Date): Promise<SessionRow[]> {
  return db
    .select()
    .from(sessions)
    .where(
      and(
        inArray(sessions.state, ["running", "paused", "ended"]),
        sql`${sessions.createdAt} + make_interval(secs => ${sessions.maxLifetimeS}) <= ${now.toISOString()}::timestamptz`,
      ),
    );
}

/** What changes with an accrual (besides the accrued quantities and charge). */
export interface SessionChange {
  state?: SessionStateName;
  /** The session holds a running VM from now on (true), no longer (false), or as before. */
  running?: boolean;
  /** The checkpoints' bytes now (a deletion: 0). */
  checkpointBytes?: number;
  /** Bytes of a checkpoint just written, added under the row's lock. */
  addedCheckpointBytes?: number;
  memoryMib?: number;
  lastCheckpoint?: { number: number; sha256: string };
  cells?: number;
  active?: boolean;
  endedReason?: string;
}

export interface AccrualOutcome {
  session: SessionRow;
  chargedUnits: number;
  /** The account could not pay everything due. */
  short: boolean;
}

/**
 * Accrues the session's running time and storage up to `now`, charges what became due (at most
 * the account's available credits) with a ledger entry, and applies `change`, in one transaction.
 */
export async function accrue(
  db: Database,
  id: string,
  now: Date,
  rates: SessionRates,
  change: SessionChange = {},
): Promise<AccrualOutcome> {
  return db.transaction(async (tx) => {
    const [row] = await tx.select().from(sessions).where(eq(sessions.id, id)).for("update");
    if (row === undefined) throw new Error(`no session ${id}`);
    const at = now.getTime();
    const runningMs =
      row.runningSince === null ? 0n : BigInt(Math.max(0, at - row.runningSince.getTime()));
    const storedMs = BigInt(Math.max(0, at - row.storageSince.getTime()));
    const runningDelta = runningMs * BigInt(row.memoryMib);
    const storageDelta = storedMs * BigInt(row.checkpointBytes);
    const runningTotal = BigInt(row.runningMibMs) + runningDelta;
    const storageTotal = BigInt(row.storageByteMs) + storageDelta;
    const owed = Math.max(0, unitsDue(rates, runningTotal, storageTotal) - row.chargedUnits);
    let charged = 0;
    if (owed > 0) {
      const [account] = await tx
        .select({ balance: accounts.balanceUnits, reserved: accounts.reservedUnits })
        .from(accounts)
        .where(eq(accounts.id, row.accountId))
        .for("update");
      charged = Math.min(owed, Math.max(0, (account?.balance ?? 0) - (account?.reserved ?? 0)));
      if (charged > 0) {
        await tx
          .update(accounts)
          .set({ balanceUnits: sql`${accounts.balanceUnits} - ${charged}` })
          .where(eq(accounts.id, row.accountId));
      }
    }
    if (runningDelta > 0n || storageDelta > 0n || charged > 0) {
      await tx.insert(usageLedger).values({
        accountId: row.accountId,
        keyId: row.keyId,
        sessionId: row.id,
        kind: "session",
        template: row.template,
        units: charged,
        runningMibMs: runningDelta.toString(),
        storageByteMs: storageDelta.toString(),
        createdAt: now,
      });
    }
    const running = change.running ?? row.runningSince !== null;
    const [updated] = await tx
      .update(sessions)
      .set({
        runningMibMs: runningTotal.toString(),
        storageByteMs: storageTotal.toString(),
        chargedUnits: row.chargedUnits + charged,
        runningSince: running ? now : null,
        storageSince: now,
        ...(change.state === undefined ? {} : { state: change.state }),
        ...(change.checkpointBytes === undefined
          ? {}
          : { checkpointBytes: change.checkpointBytes }),
        ...(change.addedCheckpointBytes === undefined
          ? {}
          : { checkpointBytes: row.checkpointBytes + change.addedCheckpointBytes }),
        ...(change.memoryMib === undefined ? {} : { memoryMib: change.memoryMib }),
        ...(change.lastCheckpoint === undefined
          ? {}
          : {
              lastCheckpoint: change.lastCheckpoint.number,
              lastCheckpointSha256: change.lastCheckpoint.sha256,
            }),
        ...(change.cells === undefined ? {} : { cells: row.cells + change.cells }),
        ...(change.active ? { lastActiveAt: now } : {}),
        ...(change.endedReason === undefined
          ? {}
          : { endedReason: change.endedReason, endedAt: now }),
      })
      .where(eq(sessions.id, id))
      .returning();
    return { session: updated as SessionRow, chargedUnits: charged, short: charged < owed };
  });
}

export interface SessionUsage {
  units: number;
  runningGibSeconds: number;
  checkpointGibHours: number;
}

/** Session charges of `keyId` recorded in [from, to) (cells are in the executions' usage). */
export async function sessionUsageForKey(
  db: Database,
  keyId: string,
  from: Date,
  to: Date,
): Promise<SessionUsage> {
  const [row] = await runPrepared(db, SESSION_USAGE, [keyId, from.toISOString(), to.toISOString()]);
  return {
    units: Number(row?.units ?? "0"),
    runningGibSeconds: Number(row?.running ?? "0") / Number(MIB_MS_PER_GIB_SECOND),
    checkpointGibHours: Number(row?.storage ?? "0") / Number(BYTE_MS_PER_GIB_HOUR),
  };
}

// Every GET /v1/usage reads it: prepared (db/prepared.ts), not parsed and typed each time.
const SESSION_USAGE: PreparedStatement = {
  name: "sandfork_session_usage",
  text: `SELECT coalesce(sum(units), 0)::text AS units, coalesce(sum(running_mib_ms), 0)::text AS running,
      coalesce(sum(storage_byte_ms), 0)::text AS storage
    FROM usage_ledger WHERE key_id = $1::uuid AND kind = 'session' AND created_at >= $2::timestamptz AND created_at < $3::timestamptz`,
};
