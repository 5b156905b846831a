import { describe, expect, it } from "vitest";
import { pickNode } from "./placement.js";

const node = (id: string, load: number, capacity = 4) => ({ id, load, capacity });

describe("pickNode", () => {
  it("has nothing to pick from no candidates, and the one from one", () => {
    expect(pickNode([])).toBeUndefined();
    expect(pickNode([node("a", 100)])?.id).toBe("a");
  });

  it("takes the less loaded of the two it draws, by load per capacity", () => {
    const draws = [0.1, 0.9];
    const random = () => draws.shift() ?? 0;
    // Draws index 0 (a) and then index 2 of the remaining (c).
    expect(pickNode([node("a", 3), node("b", 0), node("c", 1)], random)?.id).toBe("c");
    const big = [node("small", 2, 2), node("big", 4, 16)];
    expect(pickNode(big, () => 0)?.id).toBe("big");
  });

  it("never draws the same candidate twice, and spreads load over many calls", () => {
    const nodes = [node("a", 0), node("b", 0), node("c", 0)];
    const picked = new Map<string, number>();
    for (let i = 0; i < 3_000; i++) {
      const chosen = pickNode(nodes) as (typeof nodes)[number];
      chosen.load += 1;
      picked.set(chosen.id, (picked.get(chosen.id) ?? 0) + 1);
    }
    for (const count of picked.values()) expect(Math.abs(count - 1_000)).toBeLessThan(50);
  });
});
