// Per-key limits held in the database, so that every gateway of a cluster counts the same:
// execution slots (each gateway's count per key, taken under the key's advisory lock by
// sandfork_take_key_slot, migration 0012_key_limits) and a token bucket per key, refilled and
// taken in one statement under the key's row lock. Both run on every call of a key: prepared.
import { and, eq, gt, notInArray, sql } from "drizzle-orm";
import type { Database } from "./client.js";
import { type PreparedStatement, runPrepared } from "./prepared.js";
import { keySlots } from "./schema.js";

const TAKE_SLOT: PreparedStatement = {
  name: "sandfork_take_key_slot",
  text: "SELECT sandfork_take_key_slot($1::uuid, $2::text, $3::int)::text AS taken",
};

/** Takes one of `keyId`'s `max` slots for `gatewayId`; false when every gateway's together hold them all. */
export async function takeKeySlot(
  db: Database,
  keyId: string,
  gatewayId: string,
  max: number,
): Promise<boolean> {
  const [row] = await runPrepared(db, TAKE_SLOT, [keyId, gatewayId, String(max)]);
  return row?.taken === "true";
}

/** Gives back one slot `gatewayId` took for `keyId`. */
export async function giveKeySlot(db: Database, keyId: string, gatewayId: string): Promise<void> {
  await db
    .update(keySlots)
    .set({ running: sql`${keySlots.running} - 1` })
    .where(
      and(eq(keySlots.keyId, keyId), eq(keySlots.gatewayId, gatewayId), gt(keySlots.running, 0)),
    );
}

/** The recovery pass: slots held by gateways that are gone. Returns how many rows went. */
export async function releaseAbandonedKeySlots(
  db: Database,
  liveGatewayIds: string[],
): Promise<number> {
  if (liveGatewayIds.length === 0) return 0;
  const gone = await db
    .delete(keySlots)
    .where(notInArray(keySlots.gatewayId, liveGatewayIds))
    .returning({ keyId: keySlots.keyId });
  return gone.length;
}

// $1 key, $2 requests per minute. The bucket as refilled now, capped at a minute's worth.
const REFILLED =
  "least($2::float8, key_rates.tokens + extract(epoch from clock_timestamp() - key_rates.updated_at) * $2::float8 / 60)";
const TAKE_RATE: PreparedStatement = {
  name: "sandfork_take_key_rate",
  text: `WITH taken AS (
      INSERT INTO key_rates (key_id, tokens, updated_at) VALUES ($1::uuid, $2::float8 - 1, clock_timestamp())
      ON CONFLICT (key_id) DO UPDATE SET tokens = ${REFILLED} - 1, updated_at = clock_timestamp()
        WHERE ${REFILLED} >= 1
      RETURNING tokens)
    SELECT (SELECT count(*) FROM taken)::text AS taken,
      (SELECT tokens + extract(epoch from clock_timestamp() - updated_at) * $2::float8 / 60 FROM key_rates WHERE key_id = $1::uuid)::text AS tokens`,
};

/**
 * Takes one request from `keyId`'s bucket (`perMinute` a minute, bursts up to a minute's worth).
 * Returns null when taken, else the whole seconds until one is there.
 */
export async function takeKeyRate(
  db: Database,
  keyId: string,
  perMinute: number,
): Promise<number | null> {
  const [row] = await runPrepared(db, TAKE_RATE, [keyId, String(perMinute)]);
  if (row?.taken === "1") return null;
  const missing = 1 - Number(row?.tokens ?? 0);
  return Math.max(1, Math.ceil((missing * 60) / perMinute));
}
