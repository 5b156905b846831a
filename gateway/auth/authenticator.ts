// Turns an Authorization header into a Principal. API keys: their SHA-256 is looked up, answers
// cached for keyCacheTtlMs, which bounds how long a revocation made by another gateway process
// takes to apply (this process forgets at once; where no other exists, embedded PGlite, the TTL
// is unbounded); before the database is asked, shape and checksum turn away malformed keys. A
// cached hash is one a key with a valid checksum had (one hash, one key), so a cache hit costs
// one SHA-256, not two. A lookup used past half its TTL is fetched again in the background, so
// that calls less than a TTL apart never wait for the database, and none is served past its TTL.
import type { Database } from "../../db/client.js";
import { findKeyByHash, findKeyById, type StoredKey } from "../../db/keys.js";
import { ProblemError } from "../problems.js";
import { hashApiKey, hasValidChecksum, looksLikeApiKey } from "./api-key.js";
import type { Principal } from "./principal.js";
import type { TokenService } from "./tokens.js";

const MAX_CACHED_KEYS = 10_000;

interface CachedLookup {
  key: StoredKey | undefined;
  fetchedAt: number;
  /** A background fetch of it is on its way. */
  refreshing: boolean;
}

export class Authenticator {
  private readonly cache = new Map<string, CachedLookup>();
  /** Counts forget() calls: a fetch that began before one does not cache what it read. */
  private forgets = 0;

  constructor(
    private readonly db: Database,
    private readonly tokens: TokenService,
    private readonly keyCacheTtlMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  async authenticate(authorization: string | undefined): Promise<Principal> {
    const match = authorization?.match(/^Bearer\s+(\S+)\s*$/i);
    if (!match?.[1])
      throw new ProblemError(
        "unauthenticated",
        "send an API key or a token as 'Authorization: Bearer <credential>'",
      );
    const credential = match[1];
    if (looksLikeApiKey(credential)) return this.authenticateKey(credential);
    if (credential.split(".").length === 3) return this.authenticateToken(credential);
    throw new ProblemError(
      "invalid-credentials",
      "the credential is neither an API key nor a token",
    );
  }

  /** Drops cached lookups of a key, e.g. right after revoking it. */
  forget(keyId: string): void {
    this.forgets++;
    for (const [hash, lookup] of this.cache) if (lookup.key?.id === keyId) this.cache.delete(hash);
  }

  /**
   * An execute-only token is verified by its signature alone (its executions check the key). One
   * that carries more (usage, admin) is refused once its key is revoked or expired, and holds no
   * scope its key has since lost.
   */
  private async authenticateToken(token: string): Promise<Principal> {
    const principal = await this.tokens.verify(token);
    if (principal.scopes.every((scope) => scope === "execute")) return principal;
    const key = await findKeyById(this.db, principal.keyId);
    if (key === undefined)
      throw new ProblemError("invalid-credentials", "the token's key does not exist");
    if (key.revokedAt !== null) throw new ProblemError("credentials-revoked");
    if (key.expiresAt !== null && key.expiresAt.getTime() <= this.now())
      throw new ProblemError("credentials-expired", "the token's API key has expired");
    const held = principal.scopes.filter(
      (scope) => key.scopes.includes("admin") || key.scopes.includes(scope),
    );
    return { ...principal, scopes: held.length > 0 ? held : ["execute"] };
  }

  private async authenticateKey(key: string): Promise<Principal> {
    const stored = await this.lookup(key);
    if (stored === undefined) throw new ProblemError("invalid-credentials", "unknown API key");
    if (stored.revokedAt !== null) throw new ProblemError("credentials-revoked");
    if (stored.expiresAt !== null && stored.expiresAt.getTime() <= this.now())
      throw new ProblemError("credentials-expired", "the API key has expired");
    return {
      keyId: stored.id,
      accountId: stored.accountId,
      scopes: stored.scopes,
      limits: stored.limits,
      network: stored.network === null ? [] : [stored.network],
      expiresAt: stored.expiresAt,
      token: null,
    };
  }

  private async lookup(secret: string): Promise<StoredKey | undefined> {
    const hash = hashApiKey(secret);
    const now = this.now();
    const cached = this.cache.get(hash);
    if (cached !== undefined && now - cached.fetchedAt < this.keyCacheTtlMs) {
      if (!cached.refreshing && now - cached.fetchedAt >= this.keyCacheTtlMs / 2) {
        cached.refreshing = true;
        // Sent once this call waits for something else (its execution), not on its path. A
        // failure leaves the entry to expire: the next lookup past its TTL asks again.
        setImmediate(() =>
          this.fetch(hash, now).catch(() => {
            cached.refreshing = false;
          }),
        );
      }
      return cached.key;
    }
    if (!hasValidChecksum(secret))
      throw new ProblemError(
        "invalid-credentials",
        "the API key is malformed or mistyped (checksum mismatch)",
      );
    return this.fetch(hash, now);
  }

  /** Looks the hash up and caches the answer as of `askedAt`. */
  private async fetch(hash: string, askedAt: number): Promise<StoredKey | undefined> {
    const forgets = this.forgets;
    const key = await findKeyByHash(this.db, hash);
    this.cache.delete(hash);
    if (forgets !== this.forgets) return key;
    if (this.cache.size >= MAX_CACHED_KEYS) {
      const oldest = this.cache.keys().next();
      if (!oldest.done) this.cache.delete(oldest.value);
    }
    this.cache.set(hash, { key, fetchedAt: askedAt, refreshing: false });
    return key;
  }
}
