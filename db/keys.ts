// Accounts and API keys: creation, lookup by hash, listing, revocation, credit grants.
import { and, desc, eq, isNull, sql } from "drizzle-orm";
import type { Database } from "./client.js";
import { type PreparedStatement, runPrepared } from "./prepared.js";
import { accounts, apiKeys, usageLedger } from "./schema.js";

export const SCOPES = ["execute", "usage:read", "templates", "admin"] as const;
export type Scope = (typeof SCOPES)[number];

export interface KeyLimits {
  rateLimitPerMinute: number;
  maxConcurrency: number;
  maxBodyBytes: number;
}

/**
 * What a key's executions may reach over the network (gateway/network-policy.ts checks its
 * rules): every destination one of `allow` allows, at most `maxConnections` at once and
 * `maxBytes` in and out per execution (absent: the runtime's defaults).
 */
export interface NetworkPolicy {
  allow: string[];
  maxConnections?: number | undefined;
  maxBytes?: number | undefined;
}

/** A stored policy read back; anything else is no policy. */
export function readNetworkPolicy(value: unknown): NetworkPolicy | null {
  if (typeof value !== "object" || value === null) return null;
  const { allow, maxConnections, maxBytes } = value as Record<string, unknown>;
  const count = (n: unknown) => n === undefined || (Number.isSafeInteger(n) && (n as number) > 0);
  if (!Array.isArray(allow) || !allow.every((r) => typeof r === "string")) return null;
  if (!count(maxConnections) || !count(maxBytes)) return null;
  return {
    allow: allow as string[],
    ...(maxConnections === undefined ? {} : { maxConnections: maxConnections as number }),
    ...(maxBytes === undefined ? {} : { maxBytes: maxBytes as number }),
  };
}

export interface StoredKey {
  id: string;
  accountId: string;
  name: string;
  hint: string;
  scopes: Scope[];
  expiresAt: Date | null;
  revokedAt: Date | null;
  createdAt: Date;
  limits: KeyLimits;
  /** Null: the key's executions reach no network. */
  network: NetworkPolicy | null;
}

export interface NewKey {
  accountId: string;
  name: string;
  hash: string;
  hint: string;
  scopes: Scope[];
  expiresAt: Date | null;
  limits: KeyLimits;
  network: NetworkPolicy | null;
}

type KeyRow = typeof apiKeys.$inferSelect;

function toStoredKey(row: KeyRow): StoredKey {
  return {
    id: row.id,
    accountId: row.accountId,
    name: row.name,
    hint: row.hint,
    scopes: row.scopes.filter((s): s is Scope => (SCOPES as readonly string[]).includes(s)),
    expiresAt: row.expiresAt,
    revokedAt: row.revokedAt,
    createdAt: row.createdAt,
    limits: {
      rateLimitPerMinute: row.rateLimitPerMinute,
      maxConcurrency: row.maxConcurrency,
      maxBodyBytes: row.maxBodyBytes,
    },
    network: readNetworkPolicy(row.networkPolicy),
  };
}

export async function createAccount(db: Database, name: string): Promise<string> {
  const [row] = await db.insert(accounts).values({ name }).returning({ id: accounts.id });
  if (!row) throw new Error("account insert returned no row");
  return row.id;
}

export async function accountExists(db: Database, accountId: string): Promise<boolean> {
  const rows = await db
    .select({ id: accounts.id })
    .from(accounts)
    .where(eq(accounts.id, accountId));
  return rows.length > 0;
}

export async function countKeys(db: Database): Promise<number> {
  const [row] = await db.select({ n: sql<number>`count(*)::int` }).from(apiKeys);
  return row?.n ?? 0;
}

export async function insertKey(db: Database, key: NewKey): Promise<StoredKey> {
  const [row] = await db
    .insert(apiKeys)
    .values({
      accountId: key.accountId,
      name: key.name,
      keyHash: key.hash,
      hint: key.hint,
      scopes: key.scopes,
      expiresAt: key.expiresAt,
      rateLimitPerMinute: key.limits.rateLimitPerMinute,
      maxConcurrency: key.limits.maxConcurrency,
      maxBodyBytes: key.limits.maxBodyBytes,
      networkPolicy: key.network,
    })
    .returning();
  if (!row) throw new Error("key insert returned no row");
  return toStoredKey(row);
}

export async function findKeyByHash(db: Database, hash: string): Promise<StoredKey | undefined> {
  const [row] = await db.select().from(apiKeys).where(eq(apiKeys.keyHash, hash));
  return row === undefined ? undefined : toStoredKey(row);
}

export async function findKeyById(db: Database, id: string): Promise<StoredKey | undefined> {
  const [row] = await db.select().from(apiKeys).where(eq(apiKeys.id, id));
  return row === undefined ? undefined : toStoredKey(row);
}

export async function listKeys(db: Database, accountId?: string): Promise<StoredKey[]> {
  const rows = await db
    .select()
    .from(apiKeys)
    .where(accountId === undefined ? undefined : eq(apiKeys.accountId, accountId))
    .orderBy(desc(apiKeys.createdAt));
  return rows.map(toStoredKey);
}

/** Sets (or with null, clears) a key's network policy. Undefined when no such key. */
export async function setKeyNetwork(
  db: Database,
  id: string,
  network: NetworkPolicy | null,
): Promise<StoredKey | undefined> {
  const [row] = await db
    .update(apiKeys)
    .set({ networkPolicy: network })
    .where(eq(apiKeys.id, id))
    .returning();
  return row === undefined ? undefined : toStoredKey(row);
}

/** Revokes once; revoking again keeps the first timestamp. Undefined when no such key. */
export async function revokeKey(db: Database, id: string): Promise<StoredKey | undefined> {
  await db
    .update(apiKeys)
    .set({ revokedAt: new Date() })
    .where(and(eq(apiKeys.id, id), isNull(apiKeys.revokedAt)));
  return findKeyById(db, id);
}

export interface AccountBalance {
  accountId: string;
  balanceUnits: number;
  reservedUnits: number;
  availableUnits: number;
}

export async function getBalance(
  db: Database,
  accountId: string,
): Promise<AccountBalance | undefined> {
  const [row] = await runPrepared(db, BALANCE, [accountId]);
  return row === undefined
    ? undefined
    : toBalance(accountId, { balance: Number(row.balance), reserved: Number(row.reserved) });
}

// Every GET /v1/usage reads it: prepared (db/prepared.ts), not parsed and typed each time.
const BALANCE: PreparedStatement = {
  name: "sandfork_balance",
  text: "SELECT balance_units::text AS balance, reserved_units::text AS reserved FROM accounts WHERE id = $1::uuid",
};

function toBalance(accountId: string, row: { balance: number; reserved: number }): AccountBalance {
  return {
    accountId,
    balanceUnits: row.balance,
    reservedUnits: row.reserved,
    availableUnits: row.balance - row.reserved,
  };
}

/**
 * The most units an account's balance holds: 2^53 - 1, the largest integer a JSON number carries
 * exactly to every client (and a JS number here). Only a grant adds to a balance, and it stops
 * there; reserved and available units, charges and a grant itself are at most the balance.
 */
export const MAX_BALANCE_UNITS = Number.MAX_SAFE_INTEGER;

/** A grant that would take a balance past MAX_BALANCE_UNITS; nothing was granted. */
export class BalanceLimitError extends RangeError {
  constructor(
    readonly accountId: string,
    readonly balanceUnits: number,
    readonly units: number,
  ) {
    super(
      `a grant of ${units} units would take account ${accountId}'s balance of ${balanceUnits} past ${MAX_BALANCE_UNITS}, the most an account holds`,
    );
    this.name = "BalanceLimitError";
  }
}

/**
 * Adds credits to an account and records the grant in the ledger, atomically. Undefined when
 * there is no such account; BalanceLimitError when the balance would pass MAX_BALANCE_UNITS.
 */
export async function grantCredits(
  db: Database,
  accountId: string,
  units: number,
): Promise<AccountBalance | undefined> {
  if (!Number.isSafeInteger(units) || units <= 0)
    throw new RangeError("a grant is a positive integer number of units");
  return db.transaction(async (tx) => {
    const [row] = await tx
      .update(accounts)
      .set({ balanceUnits: sql`${accounts.balanceUnits} + ${units}` })
      .where(
        and(
          eq(accounts.id, accountId),
          sql`${accounts.balanceUnits} <= ${MAX_BALANCE_UNITS - units}::int8`,
        ),
      )
      .returning({ balance: accounts.balanceUnits, reserved: accounts.reservedUnits });
    if (!row) {
      const [account] = await tx
        .select({ balance: accounts.balanceUnits })
        .from(accounts)
        .where(eq(accounts.id, accountId));
      if (account === undefined) return undefined;
      throw new BalanceLimitError(accountId, account.balance, units);
    }
    await tx.insert(usageLedger).values({ accountId, kind: "grant", units });
    return toBalance(accountId, row);
  });
}
