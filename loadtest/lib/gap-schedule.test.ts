// The idle-gap mode's schedule: the --gap-ms list; every gap and lane gets exactly its calls, in
// rounds that take the gaps and lanes in turn; the run's bound in time covers the gaps it sleeps.
import { describe, expect, it } from "vitest";
import { blockSize, GAP_ROUNDS, gapSchedule, parseGaps, scheduleBoundMs } from "./gap-schedule.js";

describe("the idle-gap schedule", () => {
  it("parses a list of gaps, refusing what is not an integer from 0 to a minute", () => {
    const fail = (message: string): never => {
      throw new Error(message);
    };
    expect(parseGaps("0,15,100,1000,15", fail)).toEqual([0, 15, 100, 1000]);
    for (const bad of ["1.5", "-1", "60001", "a", "0,,1"])
      expect(() => parseGaps(bad, fail)).toThrow(/--gap-ms/);
  });

  it("spreads a gap's calls over the rounds, the first rounds taking the remainder", () => {
    expect([0, 1, 2, 3, 4].map((round) => blockSize(12, round, 5))).toEqual([3, 3, 2, 2, 2]);
    expect([0, 1, 2].map((round) => blockSize(2, round, 3))).toEqual([1, 1, 0]);
  });

  it("gives every gap and lane exactly its calls", () => {
    const calls = gapSchedule(4, 23, 3);
    expect(calls).toHaveLength(4 * 23 * 3);
    for (let gap = 0; gap < 4; gap++)
      for (let lane = 0; lane < 3; lane++)
        expect(calls.filter((c) => c.gap === gap && c.lane === lane)).toHaveLength(23);
  });

  it("takes the gaps in turn within a round and each gap's lanes in turn within it", () => {
    const calls = gapSchedule(2, 4, 2, 2).map(({ gap, lane }) => `${gap}${lane}`);
    expect(calls).toEqual([
      ...["00", "00", "01", "01", "10", "10", "11", "11"],
      ...["00", "00", "01", "01", "10", "10", "11", "11"],
    ]);
  });

  it("puts every gap in every round when there are calls enough", () => {
    const calls = gapSchedule(3, GAP_ROUNDS, 1);
    const perRound = calls.length / GAP_ROUNDS;
    for (let round = 0; round < GAP_ROUNDS; round++) {
      const gaps = calls.slice(round * perRound, (round + 1) * perRound).map((c) => c.gap);
      expect(new Set(gaps)).toEqual(new Set([0, 1, 2]));
    }
  });

  it("bounds a run at twice the gaps it sleeps plus a per-call allowance", () => {
    // 10 calls per gap and lane, 2 lanes: 20 calls after each of 0 and 100 ms.
    expect(scheduleBoundMs([0, 100], 10, 2, 50)).toBe(2 * 20 * (100 + 2 * 50));
    const slept = gapSchedule(2, 10, 2).reduce((sum, c) => sum + [0, 100][c.gap]!, 0);
    expect(scheduleBoundMs([0, 100], 10, 2, 0)).toBe(2 * slept);
  });
});
