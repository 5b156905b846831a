// Turns an Authorization header into a Principal. API keys: their SHA-256 is looked up, answers
// cached for keyCacheTtlMs, which bounds how long a revocation made by another gateway process
// takes to apply (this process forgets at once; where no other exists, embedded PGlite, the TTL
// is unbounded); before the database is asked, shape and checksum turn away malformed keys. A
// cached hash is one a key with a valid checksum had (one hash, one key), so a cache hit costs
// one SHA-256, not two. A lookup is fetched again in the background half its TTL after it was
// fetched, while it is in use (gateway/keep-fresh.ts), so that calls seconds apart never wait for
// the database, and none is served past its TTL.
import type { Database } from "../../db/client.js";
import { findKeyByHash, findKeyById, type StoredKey } from "../../db/keys.js";
import { KeepFresh } from "../keep-fresh.js";
import { ProblemError } from "../problems.js";
import { hashApiKey, hasValidChecksum, looksLikeApiKey } from "./api-key.js";
import type { Principal } from "./principal.js";
import type { TokenService } from "./tokens.js";

const MAX_CACHED_KEYS = 10_000;

interface CachedLookup {
  key: StoredKey | undefined;
  fetchedAt: number;
  /** When a call last used it. */
  usedAt: number;
}

export class Authenticator {
  private readonly cache = new Map<string, CachedLookup>();
  /** Counts forget() calls: a fetch that began before one does not cache what it read. */
  private forgets = 0;
  /** By key hash: the background fetches of lookups in use. */
  private readonly keepFresh: KeepFresh<string>;

  constructor(
    private readonly db: Database,
    private readonly tokens: TokenService,
    private readonly keyCacheTtlMs: number,
    private readonly now: () => number = Date.now,
  ) {
    this.keepFresh = new KeepFresh(
      keyCacheTtlMs,
      (hash) => this.cache.get(hash)?.usedAt,
      (hash) => this.fetch(hash, this.now(), 0),
      now,
    );
  }

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
    for (const [hash, lookup] of this.cache) if (lookup.key?.id === keyId) this.drop(hash);
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
      cached.usedAt = now;
      return cached.key;
    }
    if (!hasValidChecksum(secret))
      throw new ProblemError(
        "invalid-credentials",
        "the API key is malformed or mistyped (checksum mismatch)",
      );
    return this.fetch(hash, now, now);
  }

  /**
   * Looks the hash up and caches the answer as of `askedAt`, used at `usedAt` (0: a refresh, which
   * keeps when calls used it). A key's lookup is kept fresh; an unknown key's is left to expire.
   */
  private async fetch(
    hash: string,
    askedAt: number,
    usedAt: number,
  ): Promise<StoredKey | undefined> {
    const forgets = this.forgets;
    const key = await findKeyByHash(this.db, hash);
    const lastUsedAt = Math.max(usedAt, this.cache.get(hash)?.usedAt ?? 0);
    this.drop(hash);
    if (forgets !== this.forgets) return key;
    if (this.cache.size >= MAX_CACHED_KEYS) {
      const oldest = this.cache.keys().next();
      if (!oldest.done) this.drop(oldest.value);
    }
    this.cache.set(hash, { key, fetchedAt: askedAt, usedAt: lastUsedAt });
    if (key !== undefined) this.keepFresh.arm(hash);
    return key;
  }

  private drop(hash: string): void {
    this.cache.delete(hash);
    this.keepFresh.disarm(hash);
  }
}
