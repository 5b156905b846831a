// Keeps what the gateway trusts for a while (a key's lookup, a key's check) fresh between calls
// that come seconds apart, the pace agents call at: each entry is fetched again in the
// background half its lifetime after it was fetched, for as long as it was used within
// KEEP_FRESH_MS, so that such calls find it fresh and never wait for the database. A refresh
// that fails is not retried: the entry expires, and the next call fetches it on its path.
// Timers never keep the process alive.

/**
 * How long after its last use an entry is still kept fresh: calls further apart than this wait
 * for their fetch; an entry nobody uses costs no fetches after it.
 */
export const KEEP_FRESH_MS = 30_000;
/**
 * Entries trusted for less are not kept fresh (their calls fetch them): refreshing them would
 * cost the database more fetches a second per entry than such a short trust is worth.
 */
const SHORTEST_KEPT_LIFETIME_MS = 500;

export class KeepFresh<K> {
  private readonly timers = new Map<K, NodeJS.Timeout>();

  /**
   * `lifetimeMs`: how long a fetched entry is trusted (infinite: it needs no refresh). `usedAt`: when
   * the entry was last used, undefined once it is gone. `refresh`: fetches it again (and arms it).
   */
  constructor(
    private readonly lifetimeMs: number,
    private readonly usedAt: (key: K) => number | undefined,
    private readonly refresh: (key: K) => Promise<unknown>,
    private readonly now: () => number = Date.now,
  ) {}

  /** The entry under `key` was just fetched: its refresh is due half its lifetime from now. */
  arm(key: K): void {
    this.disarm(key);
    if (!Number.isFinite(this.lifetimeMs) || this.lifetimeMs < SHORTEST_KEPT_LIFETIME_MS) return;
    const timer = setTimeout(() => {
      this.timers.delete(key);
      const usedAt = this.usedAt(key);
      if (usedAt !== undefined && this.now() - usedAt <= KEEP_FRESH_MS)
        void this.refresh(key).catch(() => {});
    }, this.lifetimeMs / 2);
    timer.unref();
    this.timers.set(key, timer);
  }

  /** The entry under `key` is gone: no refresh of it. */
  disarm(key: K): void {
    clearTimeout(this.timers.get(key));
    this.timers.delete(key);
  }
}
