// Drives one scenario with a fixed number of requests at a fixed concurrency (bounded in count and
// time) and summarizes latency percentiles and throughput; reads a process's CPU time.
import { readFileSync } from "node:fs";

export interface ScenarioSummary {
  scenario: string;
  requests: number;
  failures: number;
  seconds: number;
  requestsPerSecond: number;
  p50Ms: number;
  p95Ms: number;
  p99Ms: number;
  maxMs: number;
}

/** `n` to `digits` decimals, as a figure in a report. */
export const round = (n: number, digits = 2) => Number(n.toFixed(digits));

/** Nearest-rank percentile of an ascending array; NaN when empty. */
export function percentile(sortedAscending: number[], p: number): number {
  if (sortedAscending.length === 0) return Number.NaN;
  const rank = Math.ceil((p / 100) * sortedAscending.length);
  return sortedAscending[Math.min(sortedAscending.length, Math.max(1, rank)) - 1] as number;
}

export interface DriveOptions {
  scenario: string;
  requests: number;
  concurrency: number;
  /** Stops early (with fewer requests) when this much time has passed. */
  maxDurationMs: number;
  /** Sends one request and returns whether it got the expected answer. */
  send: () => Promise<boolean>;
}

interface Collected {
  latencies: number[];
  failures: number;
  seconds: number;
}

async function collect(options: DriveOptions): Promise<Collected> {
  const latencies: number[] = [];
  let failures = 0;
  let issued = 0;
  const started = performance.now();
  const deadline = started + options.maxDurationMs;
  const worker = async () => {
    while (issued < options.requests && performance.now() < deadline) {
      issued++;
      const t0 = performance.now();
      let ok = false;
      try {
        ok = await options.send();
      } catch {
        ok = false;
      }
      latencies.push(performance.now() - t0);
      if (!ok) failures++;
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, options.concurrency) }, worker));
  return { latencies, failures, seconds: (performance.now() - started) / 1000 };
}

function summarize(scenario: string, { latencies, failures, seconds }: Collected): ScenarioSummary {
  const sorted = [...latencies].sort((a, b) => a - b);
  return {
    scenario,
    requests: sorted.length,
    failures,
    seconds,
    requestsPerSecond: sorted.length / seconds,
    p50Ms: percentile(sorted, 50),
    p95Ms: percentile(sorted, 95),
    p99Ms: percentile(sorted, 99),
    maxMs: sorted.at(-1) ?? Number.NaN,
  };
}

/** Runs one block of requests, doing what it must around it. */
export type BlockWrapper = (block: () => Promise<void>) => Promise<void>;

/** Sums a CPU counter (ms) over the blocks it wraps. */
export function cpuOverBlocks(readMs: () => number): { wrap: BlockWrapper; readonly ms: number } {
  let ms = 0;
  return {
    wrap: async (block) => {
      const before = readMs();
      await block();
      ms += readMs() - before;
    },
    get ms() {
      return ms;
    },
  };
}

export async function drive(options: DriveOptions): Promise<ScenarioSummary> {
  return summarize(options.scenario, await collect(options));
}

/** One side of driveInTurn: its scenario, and what to do around each of its blocks (to read a CPU counter over that side's blocks only). */
export interface TurnSide {
  options: DriveOptions;
  around?: BlockWrapper | undefined;
}

/**
 * Drives the sides in turn, `rounds` blocks of each (their requests split evenly, each block
 * bounded by its options' time, in the order given), so that all of them meet the machine as it
 * was in the same minutes: on a shared machine a figure and the baseline it is compared with,
 * taken one after the other, can differ by the machine's mood alone. Answers one summary a side,
 * in the order given, each covering all its blocks.
 */
export async function driveInTurn<Sides extends TurnSide[]>(
  sides: [...Sides],
  rounds: number,
): Promise<{ [Side in keyof Sides]: ScenarioSummary }> {
  const unwrapped: BlockWrapper = (block) => block();
  const totals = sides.map((): Collected => ({ latencies: [], failures: 0, seconds: 0 }));
  const add = (into: Collected, block: Collected) => {
    for (const latency of block.latencies) into.latencies.push(latency);
    into.failures += block.failures;
    into.seconds += block.seconds;
  };
  const share = (options: DriveOptions, round: number) => ({
    ...options,
    requests: Math.floor(options.requests / rounds) + (round < options.requests % rounds ? 1 : 0),
  });
  for (let round = 0; round < rounds; round++) {
    for (const [index, { options, around = unwrapped }] of sides.entries()) {
      await around(async () =>
        add(totals[index] as Collected, await collect(share(options, round))),
      );
    }
  }
  // One summary a side, so the tuple type holds.
  return sides.map(({ options }, index) =>
    summarize(options.scenario, totals[index] as Collected),
  ) as { [Side in keyof Sides]: ScenarioSummary };
}

/** driveInTurn of a subject and its baseline, the baseline's block first in each round. */
export async function driveAlternating(
  subject: DriveOptions,
  baseline: DriveOptions,
  rounds: number,
  around: { subject?: BlockWrapper; baseline?: BlockWrapper } = {},
): Promise<{ subject: ScenarioSummary; baseline: ScenarioSummary }> {
  const [baselineSummary, subjectSummary] = await driveInTurn(
    [
      { options: baseline, around: around.baseline },
      { options: subject, around: around.subject },
    ],
    rounds,
  );
  return { subject: subjectSummary, baseline: baselineSummary };
}

export function formatTable(rows: ScenarioSummary[]): string {
  const header = [
    "scenario",
    "requests",
    "failed",
    "req/s",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "max ms",
  ];
  const cells = rows.map((r) => [
    r.scenario,
    String(r.requests),
    String(r.failures),
    r.requestsPerSecond.toFixed(0),
    r.p50Ms.toFixed(2),
    r.p95Ms.toFixed(2),
    r.p99Ms.toFixed(2),
    r.maxMs.toFixed(2),
  ]);
  return alignedTable(header, cells);
}

/** A plain-text table: the first column left-aligned, the others right-aligned, each as wide as its widest cell. */
export function alignedTable(header: string[], cells: string[][]): string {
  const widths = header.map((h, i) =>
    Math.max(h.length, ...cells.map((c) => (c[i] as string).length)),
  );
  const line = (c: string[]) =>
    c
      .map((v, i) => (i === 0 ? v.padEnd(widths[i] as number) : v.padStart(widths[i] as number)))
      .join("  ");
  return [line(header), ...cells.map(line)].join("\n");
}

/** utime + stime of a process in ms. /proc counts in USER_HZ ticks, 100 a second on Linux x86-64. */
export function processCpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // Fields 14 and 15 of stat(5); fields[0] here is field 3.
  return (Number(fields[11]) + Number(fields[12])) * 10;
}
