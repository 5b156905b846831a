// The order and bounds of the idle-gap mode's calls (`npm run loadtest -- --gap-ms`, and the k6
// script's GAP_MS scenario), with no imports so that k6 runs it too. Calls go in rounds: in each
// round, for each gap in turn, a block of calls of each lane (what is measured after that gap:
// the gateway, then its baselines), so that a shared machine's slow minutes fall on every gap and
// lane alike. The gap is slept before every call, so a block's first call follows the previous
// block's last after the same gap.

/** Rounds a gap's calls are spread over. */
export const GAP_ROUNDS = 5;

/** Parses a --gap-ms list: integers from 0 to a minute, each once. */
export function parseGaps(list: string, fail: (message: string) => never): number[] {
  const entries = list.split(",");
  if (entries.some((entry) => !/^\d{1,5}$/.test(entry) || Number(entry) > 60_000))
    fail(`--gap-ms: a list of integers from 0 to 60000, got ${list}`);
  return [...new Set(entries.map(Number))];
}

/** One call of a schedule: which gap it follows and which lane it measures (indices). */
export interface ScheduledCall {
  gap: number;
  lane: number;
}

/** How many calls of each gap and lane round `round` of `rounds` takes: the first rounds take the remainder. */
export function blockSize(requests: number, round: number, rounds: number): number {
  return Math.floor(requests / rounds) + (round < requests % rounds ? 1 : 0);
}

/** Every call of `requests` per gap and lane, in the order they are made. */
export function gapSchedule(
  gapCount: number,
  requests: number,
  lanes: number,
  rounds = GAP_ROUNDS,
): ScheduledCall[] {
  const calls: ScheduledCall[] = [];
  for (let round = 0; round < rounds; round++) {
    const block = blockSize(requests, round, rounds);
    for (let gap = 0; gap < gapCount; gap++)
      for (let lane = 0; lane < lanes; lane++)
        for (let i = 0; i < block; i++) calls.push({ gap, lane });
  }
  return calls;
}

/**
 * The longest a schedule may take before its remaining calls are dropped: every gap slept as
 * scheduled plus `perCallMs` for each call, twice over (a busy machine's timers fire late).
 */
export function scheduleBoundMs(
  gapsMs: number[],
  requests: number,
  lanes: number,
  perCallMs: number,
): number {
  const sleptPerCall = gapsMs.reduce((sum, gap) => sum + gap, 0);
  return 2 * requests * lanes * (sleptPerCall + perCallMs * gapsMs.length);
}
