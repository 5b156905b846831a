// Per-key limits: a token-bucket rate limit, a count of executions in flight (with a bounded line
// of those waiting for a slot), and the execution counts of minted tokens. By default held in
// this gateway process; with shared limits (a cluster's gateways: config.sharedLimits) the rate
// and the slots are also taken in the database (db/key-limits.ts), so that they hold across
// every gateway. Credits are always global, in the database.
import type { Database } from "../db/client.js";
import { giveKeySlot, takeKeyRate, takeKeySlot } from "../db/key-limits.js";
import { ProblemError } from "./problems.js";
import { type Release, SlotTable } from "./slots.js";

const MAX_TRACKED = 100_000;
/** Expired tokens' counts are dropped at most this often. */
const SWEEP_INTERVAL_MS = 10_000;

interface Bucket {
  tokens: number;
  updatedAt: number;
}

/** A key's rate limit as the gateway's authentication takes it: throws 429 past it. */
export interface KeyRateLimit {
  take(keyId: string, perMinute: number): void | Promise<void>;
}

function rateLimited(perMinute: number, retryAfterSeconds: number): ProblemError {
  return new ProblemError("rate-limited", `this key allows ${perMinute} requests per minute`, {
    headers: { "retry-after": String(retryAfterSeconds) },
    extensions: { retry_after_seconds: retryAfterSeconds },
  });
}

/** The rate limit in the database: one bucket per key for every gateway. */
export class SharedRateLimiter implements KeyRateLimit {
  constructor(private readonly db: Database) {}

  async take(keyId: string, perMinute: number): Promise<void> {
    const waitSeconds = await takeKeyRate(this.db, keyId, perMinute);
    if (waitSeconds !== null) throw rateLimited(perMinute, waitSeconds);
  }
}

/** Allows `perMinute` requests a minute per key, with bursts up to one minute's worth. */
export class RateLimiter implements KeyRateLimit {
  private readonly buckets = new Map<string, Bucket>();

  constructor(private readonly now: () => number = Date.now) {}

  /** Takes one request from the key's bucket or throws 429 with Retry-After. */
  take(keyId: string, perMinute: number): void {
    const now = this.now();
    const refillPerMs = perMinute / 60_000;
    const bucket = this.buckets.get(keyId) ?? { tokens: perMinute, updatedAt: now };
    bucket.tokens = Math.min(perMinute, bucket.tokens + (now - bucket.updatedAt) * refillPerMs);
    bucket.updatedAt = now;
    if (bucket.tokens < 1) {
      this.remember(keyId, bucket);
      throw rateLimited(
        perMinute,
        Math.max(1, Math.ceil((1 - bucket.tokens) / refillPerMs / 1000)),
      );
    }
    bucket.tokens -= 1;
    this.remember(keyId, bucket);
  }

  private remember(keyId: string, bucket: Bucket): void {
    this.buckets.delete(keyId);
    if (this.buckets.size >= MAX_TRACKED) {
      // Forgetting the least recently used bucket only ever refills it: errs on the caller's side.
      const oldest = this.buckets.keys().next();
      if (!oldest.done) this.buckets.delete(oldest.value);
    }
    this.buckets.set(keyId, bucket);
  }
}

/**
 * Executions in flight per key: up to the key's max_concurrency hold a slot, and an execution may
 * wait in line for one (admit) up to a bound, past which it is refused with 429.
 */
export class ConcurrencyLimiter {
  private readonly slots = new SlotTable();

  /** `shared`: also take each slot in the database, counted with every gateway's. */
  constructor(
    private readonly shared?: {
      db: Database;
      gatewayId: string;
      log?: (line: string) => void;
    },
  ) {}

  /** Takes a slot or throws 429 (a call never waits here); the returned function gives it back (idempotently). */
  acquire(keyId: string, max: number): Release | Promise<Release> {
    const taken = this.slots.tryTake(keyId, max);
    if (taken === undefined) throw concurrencyLimit(max, 0);
    return this.shared === undefined ? taken : this.alsoShared(keyId, max, taken);
  }

  /**
   * Takes a slot, or waits for one behind at most `maxQueued` others of the key; past that throws
   * 429 at once. `signal` aborting takes a waiting call out of line (rejects with its reason).
   * With shared slots the line is this gateway's: a key whose slots other gateways hold is
   * refused 429 once its turn here comes.
   */
  async admit(
    keyId: string,
    max: number,
    maxQueued: number,
    signal: AbortSignal,
  ): Promise<Release> {
    const taken = this.slots.take(keyId, max, maxQueued, signal);
    if (taken === undefined) throw concurrencyLimit(max, maxQueued);
    const local = await taken;
    return this.shared === undefined ? local : this.alsoShared(keyId, max, local);
  }

  /** The slot in the database besides the local `local`; refused: 429, and `local` given back. */
  private async alsoShared(keyId: string, max: number, local: Release): Promise<Release> {
    const { db, gatewayId, log } = this.shared as NonNullable<typeof this.shared>;
    let taken: boolean;
    try {
      taken = await takeKeySlot(db, keyId, gatewayId, max);
    } catch (error) {
      local();
      throw error;
    }
    if (!taken) {
      local();
      throw concurrencyLimit(max, 0);
    }
    let given = false;
    return () => {
      if (given) return;
      given = true;
      local();
      giveKeySlot(db, keyId, gatewayId).catch((error: unknown) =>
        log?.(`giving back a key slot failed (the recovery pass frees it): ${String(error)}`),
      );
    };
  }

  /** The 429 `admit` would refuse a call of `keyId` with now, or undefined. */
  refusal(keyId: string, max: number, maxQueued: number): ProblemError | undefined {
    return this.slots.lineFull(keyId, max, maxQueued)
      ? concurrencyLimit(max, maxQueued)
      : undefined;
  }

  inFlightFor(keyId: string): number {
    return this.slots.running(keyId);
  }

  /** Executions waiting for a slot of their key, over all keys. */
  queued(): number {
    return this.slots.totalQueued();
  }
}

function concurrencyLimit(max: number, maxQueued: number): ProblemError {
  const waiting = maxQueued === 0 ? "" : ` and ${maxQueued} more waiting`;
  return new ProblemError(
    "concurrency-limit",
    `this key allows ${max} executions at a time${waiting}`,
    {
      headers: { "retry-after": "1" },
      extensions: { retry_after_seconds: 1 },
    },
  );
}

interface TokenCount {
  used: number;
  expiresAt: number;
}

/** Executions started with each minted token, kept until the token expires. */
export class TokenExecutionCounter {
  private readonly counts = new Map<string, TokenCount>();
  private lastSweep = 0;

  constructor(private readonly now: () => number = Date.now) {}

  /** Counts one execution against the token or throws 403 when it has used them all. */
  consume(tokenId: string, maxExecutions: number, expiresAt: Date): void {
    if (this.now() - this.lastSweep >= SWEEP_INTERVAL_MS) this.sweep();
    const count = this.counts.get(tokenId) ?? { used: 0, expiresAt: expiresAt.getTime() };
    if (count.used >= maxExecutions) {
      throw new ProblemError(
        "token-execution-limit",
        `this token allows ${maxExecutions} executions`,
      );
    }
    count.used += 1;
    this.counts.set(tokenId, count);
  }

  /** Gives back one execution that never started (e.g. refused for credits). */
  refund(tokenId: string): void {
    const count = this.counts.get(tokenId);
    if (count !== undefined && count.used > 0) count.used -= 1;
  }

  private sweep(): void {
    const now = this.now();
    this.lastSweep = now;
    for (const [id, count] of this.counts) if (count.expiresAt <= now) this.counts.delete(id);
  }
}
