// KeepFresh: an entry in use is fetched again half its lifetime after each fetch, so that calls
// seconds apart find it fresh; one left unused stops costing fetches; none outlives a failure.
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { KEEP_FRESH_MS, KeepFresh } from "./keep-fresh.js";

describe("KeepFresh", () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  /** One entry "k" of a 2 s lifetime, used at `usedAt`; each refresh re-arms it as a fetch does. */
  function entry(options: { fails?: boolean } = {}) {
    const state = { usedAt: Date.now() as number | undefined, refreshes: 0 };
    const keep: KeepFresh<string> = new KeepFresh(
      2_000,
      () => state.usedAt,
      async (key) => {
        state.refreshes++;
        if (options.fails) throw new Error("the database is down");
        keep.arm(key);
      },
    );
    return { state, keep };
  }

  it("fetches an entry in use again half its lifetime after each fetch", async () => {
    const { state, keep } = entry();
    keep.arm("k");
    await vi.advanceTimersByTimeAsync(999);
    expect(state.refreshes).toBe(0);
    await vi.advanceTimersByTimeAsync(1);
    expect(state.refreshes).toBe(1);
    // A call every 3 s, longer apart than the lifetime: the entry is fetched every second meanwhile.
    for (let call = 0; call < 3; call++) {
      await vi.advanceTimersByTimeAsync(3_000);
      state.usedAt = Date.now();
    }
    expect(state.refreshes).toBe(10);
  });

  it("stops fetching an entry unused for longer than KEEP_FRESH_MS", async () => {
    const { state, keep } = entry();
    keep.arm("k");
    await vi.advanceTimersByTimeAsync(KEEP_FRESH_MS + 5_000);
    const refreshes = state.refreshes;
    expect(refreshes).toBe(KEEP_FRESH_MS / 1_000);
    await vi.advanceTimersByTimeAsync(60_000);
    expect(state.refreshes).toBe(refreshes);
  });

  it("never fetches an entry that is gone, disarmed, trusted for ever or too briefly, or whose refresh failed", async () => {
    const gone = entry();
    gone.state.usedAt = undefined;
    gone.keep.arm("k");
    const disarmed = entry();
    disarmed.keep.arm("k");
    disarmed.keep.disarm("k");
    const failing = entry({ fails: true });
    failing.keep.arm("k");
    let unkept = 0;
    for (const lifetimeMs of [Number.POSITIVE_INFINITY, 0, 499])
      new KeepFresh(
        lifetimeMs,
        () => Date.now(),
        async () => {
          unkept++;
        },
      ).arm("k");
    await vi.advanceTimersByTimeAsync(10_000);
    expect([gone.state.refreshes, disarmed.state.refreshes, failing.state.refreshes]).toEqual([
      0, 0, 1,
    ]);
    expect(unkept).toBe(0);
  });
});
