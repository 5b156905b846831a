import { describe, expect, it, vi } from "vitest";
import { GroupCommit } from "./group-commit.js";

/** A runner that records each batch and answers when `release` is called for it. */
function gatedRunner() {
  const batches: number[][] = [];
  const gates: (() => void)[] = [];
  const run = async (items: number[]) => {
    batches.push(items);
    await new Promise<void>((resolve) => gates.push(resolve));
    if (items.includes(-1)) throw new Error("commit failed");
    return items.map((n) => n * 10);
  };
  const releaseNext = async () => {
    while (gates.length === 0) await new Promise((resolve) => setImmediate(resolve));
    gates.shift()?.();
  };
  return { batches, run, releaseNext };
}

describe("GroupCommit", () => {
  it("sends a lone item alone, and batches what was submitted while a batch was in flight", async () => {
    const runner = gatedRunner();
    const group = new GroupCommit(runner.run);
    const first = group.submit(1);
    await runner.releaseNext();
    expect(await first).toBe(10);
    const second = group.submit(2);
    // While 2 is in flight, 3, 4 and 5 queue and then go together.
    while (runner.batches.length < 2) await new Promise((resolve) => setImmediate(resolve));
    const queued = [group.submit(3), group.submit(4), group.submit(5)];
    await runner.releaseNext();
    await runner.releaseNext();
    expect(await second).toBe(20);
    expect(await Promise.all(queued)).toEqual([30, 40, 50]);
    expect(runner.batches).toEqual([[1], [2], [3, 4, 5]]);
  });

  it("takes a lone item in the turn it was submitted and is done when it has committed", async () => {
    const turns = vi.spyOn(globalThis, "setImmediate");
    try {
      const group = new GroupCommit(async (items: number[]) => items.map((n) => n + 1));
      expect(await group.submit(1)).toBe(2);
      expect(turns).toHaveBeenCalledTimes(1);
      // Items submitted in one turn after that still go together.
      const seen: number[][] = [];
      const counting = new GroupCommit(async (items: number[]) => {
        seen.push(items);
        return items;
      });
      expect(await Promise.all([counting.submit(1), counting.submit(2)])).toEqual([1, 2]);
      expect(seen).toEqual([[1, 2]]);
    } finally {
      turns.mockRestore();
    }
  });

  it("a batch that fails rejects every one of its items and no other", async () => {
    const runner = gatedRunner();
    const group = new GroupCommit(runner.run);
    const inFlight = group.submit(7);
    while (runner.batches.length < 1) await new Promise((resolve) => setImmediate(resolve));
    const failing = [group.submit(8), group.submit(-1), group.submit(9)].map((p) =>
      p.then(
        () => "committed",
        (e: Error) => e.message,
      ),
    );
    await runner.releaseNext();
    await runner.releaseNext();
    expect(await inFlight).toBe(70);
    expect(await Promise.all(failing)).toEqual(["commit failed", "commit failed", "commit failed"]);
    const after = group.submit(3);
    await runner.releaseNext();
    expect(await after).toBe(30);
  });

  it("bounds a batch at maxBatch items", async () => {
    const runner = gatedRunner();
    const group = new GroupCommit(runner.run, 2);
    const all = [1, 2, 3, 4, 5].map((n) => group.submit(n));
    for (let i = 0; i < 3; i++) await runner.releaseNext();
    expect(await Promise.all(all)).toEqual([10, 20, 30, 40, 50]);
    expect(runner.batches).toEqual([[1, 2], [3, 4], [5]]);
  });
});
