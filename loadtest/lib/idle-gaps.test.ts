// The idle-gap mode's reading of its figures: each phase's p50 over one gap's executions only,
// and the table a column per gap.
import { describe, expect, it } from "vitest";
import { type GapFigures, gapTable, PHASE_NAMES, phaseMedians } from "./idle-gaps.js";
import type { ExecutionPhases } from "./phases.js";

const phase = (requestId: string, ms: number): ExecutionPhases => ({
  requestId,
  server: 10 * ms,
  auth: ms,
  hold: ms,
  runtime: 4 * ms,
  vm: 2 * ms,
  record: ms,
  rest: 3 * ms,
});

describe("loadtest --gap-ms", () => {
  it("takes each phase's p50 over the executions of one gap only", () => {
    const phases = [phase("a", 1), phase("b", 2), phase("c", 3), phase("other", 100)];
    const clientMs = new Map([
      ["a", 11],
      ["b", 22],
      ["c", 33],
    ]);
    const medians = phaseMedians(phases, clientMs);
    expect(medians).toEqual({
      outside_server_span: 2,
      server_span: 20,
      auth: 2,
      hold: 2,
      runtime: 8,
      vm: 4,
      runtime_rest: 4,
      record: 2,
      rest: 6,
    });
    expect(phaseMedians(phases, new Map([["none", 1]]))).toBeNull();
  });

  it("prints a column per gap with its distance from the back-to-back p50", () => {
    const figures = (gap: number, p50: number): GapFigures => ({
      gap_ms: gap,
      requests: 10,
      failed: 0,
      p50_ms: p50,
      p99_ms: 2 * p50,
      phases: Object.fromEntries(PHASE_NAMES.map((n) => [n, 0.5])) as GapFigures["phases"],
      traced: 10,
      baseline: { p50_ms: 1, p99_ms: 2, requests: 10, failed: 0 },
      http_floor: { p50_ms: gap === 0 ? 0.1 : 0.5, p99_ms: 3, requests: 10, failed: 0 },
    });
    const table = gapTable("pglite", [figures(0, 2), figures(1000, 2.75)]).split("\n");
    expect(table[0]).toMatch(/^pglite, ms\s+gap 0 ms\s+gap 1000 ms$/);
    expect(table.find((l) => l.includes("over the back-to-back p50"))).toMatch(/0\.000\s+0\.750$/);
    expect(table.find((l) => l.includes("the daemon alone: p50"))).toMatch(/1\.000\s+1\.000$/);
    expect(table.find((l) => l.includes("a plain Hono GET: p50"))).toMatch(/0\.100\s+0\.500$/);
  });
});
