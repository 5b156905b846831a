import { describe, expect, it } from "vitest";
import {
  cpuOverBlocks,
  drive,
  driveAlternating,
  driveInTurn,
  formatTable,
  percentile,
} from "./measure.js";

describe("load measurement", () => {
  it("takes nearest-rank percentiles", () => {
    const values = Array.from({ length: 100 }, (_, i) => i + 1);
    expect(percentile(values, 50)).toBe(50);
    expect(percentile(values, 95)).toBe(95);
    expect(percentile(values, 99)).toBe(99);
    expect(percentile([7], 99)).toBe(7);
    expect(percentile([], 50)).toBeNaN();
  });

  it("sends exactly the requested count at the given concurrency and counts failures", async () => {
    let inFlight = 0;
    let peak = 0;
    let sent = 0;
    const summary = await drive({
      scenario: "s",
      requests: 50,
      concurrency: 4,
      maxDurationMs: 10_000,
      send: async () => {
        const n = ++sent;
        inFlight++;
        peak = Math.max(peak, inFlight);
        await new Promise((r) => setTimeout(r, 1));
        inFlight--;
        return n % 10 !== 0;
      },
    });
    expect(sent).toBe(50);
    expect(peak).toBe(4);
    expect(summary).toMatchObject({ requests: 50, failures: 5 });
    expect(summary.p50Ms).toBeGreaterThan(0);
    expect(summary.p99Ms).toBeGreaterThanOrEqual(summary.p95Ms);
    expect(formatTable([summary])).toMatch(/^scenario\s+requests\s+failed\s+req\/s/);
  });

  it("alternates blocks of a subject and its baseline, wrapping each side's blocks with its own wrapper, and sums each", async () => {
    const order: string[] = [];
    let wrapped = 0;
    let baselineWrapped = 0;
    const options = (name: string, requests: number) => ({
      scenario: name,
      requests,
      concurrency: 1,
      maxDurationMs: 10_000,
      send: async () => {
        order.push(name);
        return name === "gateway" || order.length % 2 === 0;
      },
    });
    const only = (name: string, onBlock: () => void) => async (block: () => Promise<void>) => {
      onBlock();
      const before = order.length;
      await block();
      expect(order.slice(before).length).toBeGreaterThan(0);
      expect(order.slice(before).every((n) => n === name)).toBe(true);
    };
    const { subject, baseline } = await driveAlternating(
      options("gateway", 7),
      options("daemon", 5),
      3,
      {
        subject: only("gateway", () => wrapped++),
        baseline: only("daemon", () => baselineWrapped++),
      },
    );
    expect(wrapped).toBe(3);
    expect(baselineWrapped).toBe(3);
    // Blocks of 3, 2, 2 and 2, 2, 1, the baseline's first in each round.
    expect(order.join(",")).toBe(
      "daemon,daemon,gateway,gateway,gateway,daemon,daemon,gateway,gateway,daemon,gateway,gateway",
    );
    expect(subject).toMatchObject({ scenario: "gateway", requests: 7, failures: 0 });
    expect(baseline).toMatchObject({ scenario: "daemon", requests: 5 });
    expect(baseline.failures).toBeGreaterThan(0);
  });

  it("drives three sides in turn, each block wrapped by its own side's wrapper, one summary a side in the order given", async () => {
    const order: string[] = [];
    const send = (name: string) => async () => {
      order.push(name);
      return name !== "c";
    };
    const side = (name: string, requests: number) => ({
      options: {
        scenario: name,
        requests,
        concurrency: 1,
        maxDurationMs: 10_000,
        send: send(name),
      },
      around: async (block: () => Promise<void>) => {
        order.push(`[${name}`);
        await block();
        order.push(`${name}]`);
      },
    });
    const [a, b, c] = await driveInTurn([side("a", 2), side("b", 4), side("c", 3)], 2);
    // Blocks of 1, 1 | 2, 2 | 2, 1: every block inside its own wrapper, a then b then c in each round.
    expect(order.join(" ")).toBe("[a a a] [b b b b] [c c c c] [a a a] [b b b b] [c c c]");
    expect([a.scenario, a.requests, a.failures]).toEqual(["a", 2, 0]);
    expect([b.scenario, b.requests, b.failures]).toEqual(["b", 4, 0]);
    expect([c.scenario, c.requests, c.failures]).toEqual(["c", 3, 3]);
  });

  it("sums a CPU counter over the blocks it wraps only", async () => {
    let counter = 0;
    const cpu = cpuOverBlocks(() => counter);
    await cpu.wrap(async () => {
      counter += 3;
    });
    counter += 100;
    await cpu.wrap(async () => {
      counter += 4;
    });
    expect(cpu.ms).toBe(7);
  });

  it("stops at the time bound", async () => {
    const summary = await drive({
      scenario: "slow",
      requests: 1_000_000,
      concurrency: 2,
      maxDurationMs: 100,
      send: async () => {
        await new Promise((r) => setTimeout(r, 10));
        return true;
      },
    });
    expect(summary.requests).toBeLessThan(100);
    expect(summary.seconds).toBeLessThan(1);
  });
});
