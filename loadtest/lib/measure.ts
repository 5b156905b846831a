// Drives one scenario with a fixed number of requests at a fixed concurrency (bounded in count and
// time) and summarizes latency percentiles and throughput.

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

export async function drive(options: DriveOptions): Promise<ScenarioSummary> {
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
  const seconds = (performance.now() - started) / 1000;
  latencies.sort((a, b) => a - b);
  return {
    scenario: options.scenario,
    requests: latencies.length,
    failures,
    seconds,
    requestsPerSecond: latencies.length / seconds,
    p50Ms: percentile(latencies, 50),
    p95Ms: percentile(latencies, 95),
    p99Ms: percentile(latencies, 99),
    maxMs: latencies.at(-1) ?? Number.NaN,
  };
}

export function formatTable(rows: ScenarioSummary[]): string {
  const header = ["scenario", "requests", "failed", "req/s", "p50 ms", "p95 ms", "p99 ms", "max ms"];
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
  const widths = header.map((h, i) => Math.max(h.length, ...cells.map((c) => (c[i] as string).length)));
  const line = (c: string[]) => c.map((v, i) => (i === 0 ? v.padEnd(widths[i] as number) : v.padStart(widths[i] as number))).join("  ");
  return [line(header), ...cells.map(line)].join("\n");
}
