// A key's usage over any period equals the sums over its records, whether its whole hours come
// from the hourly sums or not; the sums stop where a record might still commit.
import { randomUUID } from "node:crypto";
import postgres from "postgres";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runPrepared } from "./prepared.js";
import { BACKENDS, type FreshDatabase, freshDatabase } from "./testing/fresh-database.js";
import { insertRecords, usageFromRecords } from "./testing/usage-records.js";
import { usageForKey } from "./usage.js";

const HOUR_MS = 3_600_000;
const DAY_MS = 24 * HOUR_MS;

/** sandfork_usage_horizon(margin) in microseconds since the epoch, as text. */
async function horizonMicros(
  fresh: FreshDatabase,
  margin: string,
): Promise<string | null | undefined> {
  const text =
    "SELECT (extract(epoch FROM sandfork_usage_horizon($1::interval)) * 1e6)::int8::text AS us";
  return (await runPrepared(fresh.db, { name: "usage_test_horizon", text }, [margin]))[0]?.us;
}

/** Where the key's sums stop (its mark), in milliseconds since the epoch. */
async function markOf(fresh: FreshDatabase, keyId: string): Promise<number> {
  const text =
    "SELECT (extract(epoch FROM rolled_up_before) * 1000)::int8::text AS ms FROM execution_usage_keys WHERE key_id = $1::uuid";
  return Number((await runPrepared(fresh.db, { name: "usage_test_mark", text }, [keyId]))[0]?.ms);
}

/** Deletes the key's records that finished in [from, to). */
async function forget(fresh: FreshDatabase, keyId: string, from: Date, to: Date): Promise<void> {
  const text =
    "DELETE FROM executions WHERE key_id = $1::uuid AND finished_at >= $2::timestamptz AND finished_at < $3::timestamptz";
  await runPrepared(fresh.db, { name: "usage_test_forget", text }, [
    keyId,
    from.toISOString(),
    to.toISOString(),
  ]);
}

describe.each(BACKENDS)("usage on %s", (backend) => {
  let fresh: FreshDatabase;
  beforeAll(async () => {
    fresh = await freshDatabase(backend);
  });
  afterAll(async () => {
    await fresh?.dispose();
  });

  /** Periods over the last `days` days: random ones, ones on hour boundaries, one hour's part, to the future. */
  function periods(days: number): [Date, Date][] {
    const now = Date.now();
    const hour = (ms: number) => Math.floor(ms / HOUR_MS) * HOUR_MS;
    const out: [number, number][] = [
      [now - (days + 1) * DAY_MS, now + 60_000],
      [hour(now - days * DAY_MS), hour(now)],
      [hour(now - DAY_MS) + 60_000, hour(now - DAY_MS) + 1_800_000],
      [hour(now - 2 * DAY_MS) - 1, hour(now - 2 * DAY_MS) + 2 * HOUR_MS + 1],
      [hour(now) - 1, now + HOUR_MS],
    ];
    for (let i = 0; i < 30; i++) {
      const from = now - Math.random() * days * DAY_MS;
      out.push([from, from + Math.random() * (now + HOUR_MS - from)]);
    }
    return out.map(([from, to]) => [new Date(from), new Date(to)]);
  }

  it("equals the records' sums over any period, before and after the hours are summed, and with records added since", async () => {
    const keyId = randomUUID();
    await insertRecords(fresh.db, keyId, 3_000, 3);
    await insertRecords(fresh.db, randomUUID(), 200, 3);
    for (const [from, to] of periods(3)) {
      expect(
        await usageForKey(fresh.db, keyId, from, to),
        `${from.toISOString()} to ${to.toISOString()}`,
      ).toEqual(await usageFromRecords(fresh.db, keyId, from, to));
    }
    // Periods that end or start at the mark, or in its hour on either side of it.
    const mark = await markOf(fresh, keyId);
    const markHour = Math.floor(mark / HOUR_MS) * HOUR_MS;
    for (const [from, to] of [
      [mark - DAY_MS, mark],
      [mark, mark + 1],
      [mark - 1, mark + 1],
      [markHour, mark],
      [markHour - 1, mark - 1],
      [markHour, mark + 60_000],
      [markHour + 1, mark + 60_000],
    ].map(([from, to]) => [new Date(from as number), new Date(to as number)] as const)) {
      expect(
        await usageForKey(fresh.db, keyId, from, to),
        `${from.toISOString()} to ${to.toISOString()}`,
      ).toEqual(await usageFromRecords(fresh.db, keyId, from, to));
    }
    // Finished now, after the mark: read from the records.
    await insertRecords(fresh.db, keyId, 20, 0);
    const [from, to] = [new Date(Date.now() - 4 * DAY_MS), new Date(Date.now() + 60_000)];
    const usage = await usageForKey(fresh.db, keyId, from, to);
    expect(usage).toEqual(await usageFromRecords(fresh.db, keyId, from, to));
    expect(usage.executions).toBeGreaterThan(2_500);
  });

  it("sums the current hour up to the horizon, 5 s ago, and not again for 5 s", async () => {
    const keyId = randomUUID();
    await insertRecords(fresh.db, keyId, 500, 10 / (24 * 60));
    const [from, to] = [new Date(Date.now() - DAY_MS), new Date(Date.now() + 60_000)];
    const expected = await usageFromRecords(fresh.db, keyId, from, to);
    expect(await usageForKey(fresh.db, keyId, from, to)).toEqual(expected);
    const mark = await markOf(fresh, keyId);
    expect(Date.now() - mark).toBeGreaterThanOrEqual(5_000);
    expect(Date.now() - mark).toBeLessThan(60_000);
    // What finished before the mark is read from its sums, the current hour's part included.
    await forget(fresh, keyId, from, new Date(mark));
    expect((await usageFromRecords(fresh.db, keyId, from, new Date(mark))).executions).toBe(0);
    expect(await usageForKey(fresh.db, keyId, from, to)).toEqual(expected);
    expect(await markOf(fresh, keyId)).toBe(mark);
  });

  it("adds what finished after the mark to the mark's hour, whose row then answers for all of it", async () => {
    const keyId = randomUUID();
    await insertRecords(fresh.db, keyId, 2_000, 1);
    // As if the key had last been summed at 20 minutes past the hour three hours ago: its sums
    // end there, and that hour's row holds its records before then.
    const hour = Math.floor((Date.now() - 3 * HOUR_MS) / HOUR_MS) * HOUR_MS;
    const earlierMark = new Date(hour + 20 * 60_000).toISOString();
    await runPrepared(
      fresh.db,
      {
        name: "usage_test_set_mark",
        text: "INSERT INTO execution_usage_keys VALUES ($1::uuid, $2::timestamptz)",
      },
      [keyId, earlierMark],
    );
    const sumBefore = `INSERT INTO execution_usage_hours
      SELECT key_id, date_trunc('hour', finished_at, 'UTC'), template, count(*), coalesce(sum(charged_units), 0),
        coalesce(sum((network->>'bytesIn')::int8), 0), coalesce(sum((network->>'bytesOut')::int8), 0),
        coalesce(sum((network->>'refused')::int8), 0) FROM executions
      WHERE key_id = $1::uuid AND finished_at < $2::timestamptz AND status <> 'aborted' GROUP BY 1, 2, 3`;
    await runPrepared(fresh.db, { name: "usage_test_sum_before", text: sumBefore }, [
      keyId,
      earlierMark,
    ]);
    const [from, to] = [new Date(hour), new Date(hour + HOUR_MS)];
    const [wholeFrom, wholeTo] = [new Date(Date.now() - 2 * DAY_MS), new Date(Date.now() + 60_000)];
    const [expected, expectedWhole] = [
      await usageFromRecords(fresh.db, keyId, from, to),
      await usageFromRecords(fresh.db, keyId, wholeFrom, wholeTo),
    ];
    expect(
      (await usageFromRecords(fresh.db, keyId, new Date(earlierMark), to)).executions,
    ).toBeGreaterThan(0);
    expect(await usageForKey(fresh.db, keyId, from, to)).toEqual(expected);
    await forget(fresh, keyId, from, to);
    expect(await usageForKey(fresh.db, keyId, from, to)).toEqual(expected);
    expect(await usageForKey(fresh.db, keyId, wholeFrom, wholeTo)).toEqual(expectedWhole);
  });

  it("reads a summed hour from its sum, not its records", async () => {
    const keyId = randomUUID();
    await insertRecords(fresh.db, keyId, 500, 2);
    const hour = Math.floor((Date.now() - DAY_MS) / HOUR_MS) * HOUR_MS;
    const [from, to] = [new Date(hour), new Date(hour + HOUR_MS)];
    const summed = await usageForKey(fresh.db, keyId, from, to);
    expect(summed).toEqual(await usageFromRecords(fresh.db, keyId, from, to));
    // The records of a closed hour never change; if they did, the hour's sum would still stand.
    await forget(fresh, keyId, from, to);
    expect((await usageFromRecords(fresh.db, keyId, from, to)).executions).toBe(0);
    expect(await usageForKey(fresh.db, keyId, from, to)).toEqual(summed);
    // Its part is read from the records (now none): the sum covers whole hours only.
    expect((await usageForKey(fresh.db, keyId, new Date(hour + 1), to)).executions).toBe(0);
  });

  it("answers two queries sent at once as the records do, and the same again after", async () => {
    const keyId = randomUUID();
    await insertRecords(fresh.db, keyId, 1_000, 2);
    const [from, to] = [new Date(Date.now() - 3 * DAY_MS), new Date(Date.now() + 60_000)];
    const expected = await usageFromRecords(fresh.db, keyId, from, to);
    const together = await Promise.all([
      usageForKey(fresh.db, keyId, from, to),
      usageForKey(fresh.db, keyId, from, to),
    ]);
    expect(together).toEqual([expected, expected]);
    expect(await usageForKey(fresh.db, keyId, from, to)).toEqual(expected);
  });

  it("sums up to the clock less the margin while no other transaction is open", async () => {
    const horizon = Number(await horizonMicros(fresh, "1 hour"));
    const expected = (Date.now() - HOUR_MS) * 1000;
    expect(Math.abs(horizon - expected)).toBeLessThan(10_000_000);
  });
});

describe("usage on postgres, beside other connections", () => {
  let fresh: FreshDatabase;
  beforeAll(async () => {
    fresh = await freshDatabase("postgres");
  });
  afterAll(async () => {
    await fresh?.dispose();
  });

  it("stops the sums where a transaction still open on another connection started", async () => {
    const other = postgres(fresh.url as string, { max: 1, onnotice: () => {} });
    try {
      const open = await other.reserve();
      await open`BEGIN`;
      const [started] = await open<
        { us: string }[]
      >`SELECT (extract(epoch FROM now()) * 1e6)::int8::text AS us`;
      await new Promise((resolve) => setTimeout(resolve, 20));
      expect(await horizonMicros(fresh, "0")).toBe(started?.us);
      await open`COMMIT`;
      open.release();
      expect(BigInt((await horizonMicros(fresh, "0")) as string)).toBeGreaterThan(
        BigInt(started?.us as string),
      );
    } finally {
      await other.end();
    }
  });

  it("waits for another connection's summing of the key's hours, then answers from its sums", async () => {
    const keyId = randomUUID();
    await insertRecords(fresh.db, keyId, 1_000, 2);
    const [from, to] = [new Date(Date.now() - 3 * DAY_MS), new Date(Date.now() + 60_000)];
    const expected = await usageFromRecords(fresh.db, keyId, from, to);
    const other = postgres(fresh.url as string, { max: 1, onnotice: () => {} });
    try {
      // As if the key's hours were last summed a day ago.
      await other`SELECT sandfork_roll_up_usage(${keyId}::uuid)`;
      const dayAgo = new Date(Math.floor((Date.now() - DAY_MS) / HOUR_MS) * HOUR_MS);
      await other`UPDATE execution_usage_keys SET rolled_up_before = ${dayAgo} WHERE key_id = ${keyId}::uuid`;
      await other`DELETE FROM execution_usage_hours WHERE key_id = ${keyId}::uuid AND hour >= ${dayAgo}`;
      const summing = await other.reserve();
      await summing`BEGIN`;
      await summing`SELECT sandfork_roll_up_usage(${keyId}::uuid)`;
      let answered = false;
      const usage = usageForKey(fresh.db, keyId, from, to).finally(() => (answered = true));
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(answered).toBe(false);
      await summing`COMMIT`;
      summing.release();
      expect(await usage).toEqual(expected);
    } finally {
      await other.end();
    }
  });
});
