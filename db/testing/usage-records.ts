// Execution records for usage's tests and benchmark (db/usage.ts), and a key's usage summed from
// its records alone, as db/usage.ts summed it before the hourly sums: the truth its tests compare
// against, and its benchmark's baseline.
import type { Database } from "../client.js";
import { runPrepared } from "../prepared.js";
import type { UsageSummary } from "../usage.js";

const FROM_RECORDS = {
  name: "sandfork_usage_from_records",
  text: `SELECT template, count(*)::text AS executions, coalesce(sum(charged_units), 0)::text AS units,
      coalesce(sum((network->>'bytesIn')::int8), 0)::text AS bytes_in, coalesce(sum((network->>'bytesOut')::int8), 0)::text AS bytes_out,
      coalesce(sum((network->>'refused')::int8), 0)::text AS refused FROM executions
    WHERE key_id = $1::uuid AND finished_at >= $2::timestamptz AND finished_at < $3::timestamptz AND status <> 'aborted'
    GROUP BY template ORDER BY template`,
};

/** The usage of `keyId` over [from, to) from its records. */
export async function usageFromRecords(
  db: Database,
  keyId: string,
  from: Date,
  to: Date,
): Promise<UsageSummary> {
  const rows = await runPrepared(db, FROM_RECORDS, [keyId, from.toISOString(), to.toISOString()]);
  const byTemplate = rows.map((r) => ({
    template: r.template as string,
    executions: Number(r.executions),
    units: Number(r.units),
  }));
  const total = (column: string) => rows.reduce((n, r) => n + Number(r[column]), 0);
  return {
    executions: byTemplate.reduce((n, t) => n + t.executions, 0),
    units: byTemplate.reduce((n, t) => n + t.units, 0),
    byTemplate,
    network: {
      bytesIn: total("bytes_in"),
      bytesOut: total("bytes_out"),
      refused: total("refused"),
    },
  };
}

const INSERT_RECORDS = {
  name: "sandfork_insert_usage_records",
  text: `INSERT INTO executions (id, account_id, key_id, request_hash, template, status, reserved_units, charged_units, network, created_at, finished_at)
    SELECT gen_random_uuid(), gen_random_uuid(), $1::uuid, 'h', CASE WHEN random() < 0.3 THEN 'node' ELSE 'python' END,
           CASE WHEN random() < 0.1 THEN 'aborted' ELSE 'completed' END, 100, (random() * 20)::int8,
           CASE WHEN random() < 0.5 THEN jsonb_build_object('bytesIn', (random() * 1e6)::int8, 'bytesOut', (random() * 1e4)::int8,
             'connections', 1, 'refused', (random() * 3)::int8, 'dnsQueries', 1) END, at, at
    FROM (SELECT CASE WHEN i % 10 = 0 AND $3::float8 > 0 THEN date_trunc('hour', now() - random() * $3::float8 * interval '1 day', 'UTC')
                      ELSE now() - random() * $3::float8 * interval '1 day' END AS at
          FROM generate_series(1, $2::int4) AS i
          ORDER BY at) AS times
    UNION ALL
    SELECT gen_random_uuid(), gen_random_uuid(), $1::uuid, 'h', 'python', 'running', 100, NULL, NULL, now(), NULL FROM generate_series(1, 3)`,
};

/**
 * Inserts `count` finished records of `keyId` at random times over the last `days` days, oldest
 * first as a gateway writes them, one in ten on an hour's first instant (none with `days` 0: all
 * finished now, after the key's sums stop), of two templates, one in ten aborted, half with
 * network traffic; and three still running.
 */
export async function insertRecords(
  db: Database,
  keyId: string,
  count: number,
  days: number,
): Promise<void> {
  await runPrepared(db, INSERT_RECORDS, [keyId, String(count), String(days)]);
}
