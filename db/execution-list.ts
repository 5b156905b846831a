// Reads for the console: a key's executions newest first, a page at a time, and its units per
// hour or day by template. The series reads the hourly sums for what they hold (db/usage.ts) and
// the records only after their horizon.

import { type ExecutionRecord, fromRecordRow, RECORD_COLUMNS } from "./billing.js";
import type { Database } from "./client.js";
import { type PreparedStatement, runPrepared } from "./prepared.js";

export interface ExecutionListQuery {
  keyId: string;
  /** Only the executions this token ran; null: every execution of the key. */
  tokenId: string | null;
  status: string | null;
  template: string | null;
  /** Keyset: only records created before this one (created_at, id), newest first. */
  before: { createdAt: string; id: string } | null;
  limit: number;
}

/**
 * Up to `limit` records, newest first, and when there may be more, the position of the last
 * (its created_at as the database writes it, to the microsecond, and its id).
 */
export async function listExecutions(
  db: Database,
  q: ExecutionListQuery,
): Promise<{ records: ExecutionRecord[]; next: { createdAt: string; id: string } | null }> {
  const rows = await runPrepared(db, LIST, [
    q.keyId,
    q.tokenId,
    q.status,
    q.template,
    q.before?.createdAt ?? null,
    q.before?.id ?? null,
    String(q.limit + 1),
  ]);
  const page = rows.slice(0, q.limit);
  const last = page.at(-1);
  const next =
    rows.length > q.limit && last !== undefined
      ? { createdAt: last.cursor_at as string, id: last.id as string }
      : null;
  return { records: page.map(fromRecordRow), next };
}

// Output is left out of a listing: the record by id carries it.
const LIST: PreparedStatement = {
  name: "sandfork_list_executions",
  text: `SELECT ${RECORD_COLUMNS.replace(", stdout, stderr", ", NULL AS stdout, NULL AS stderr")}, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS cursor_at FROM executions
    WHERE key_id = $1::uuid AND ($2::text IS NULL OR token_id = $2::text)
      AND ($3::text IS NULL OR status = $3::text) AND ($4::text IS NULL OR template = $4::text)
      AND ($5::timestamptz IS NULL OR (created_at, id) < ($5::timestamptz, $6::uuid))
    ORDER BY created_at DESC, id DESC
    LIMIT $7::int`,
};

export type Bucket = "hour" | "day";

export interface SeriesPoint {
  /** The bucket's start. */
  at: Date;
  template: string;
  executions: number;
  units: number;
}

/** Units and executions of `keyId` per UTC hour or day in [from, to), both on bucket boundaries. */
export async function usageSeries(
  db: Database,
  keyId: string,
  bucket: Bucket,
  from: Date,
  to: Date,
): Promise<SeriesPoint[]> {
  const [mark] = await runPrepared(db, ROLL_UP, [keyId]);
  const summedBefore = mark?.summed_before;
  if (summedBefore == null)
    throw new Error(`sandfork_roll_up_usage answered ${JSON.stringify(mark)}`);
  const rows = await runPrepared(db, SERIES, [
    keyId,
    bucket,
    from.toISOString(),
    to.toISOString(),
    summedBefore,
  ]);
  return rows.map((r) => ({
    at: new Date(Number(r.at_ms)),
    template: r.template as string,
    executions: Number(r.executions),
    units: Number(r.units),
  }));
}

const ROLL_UP: PreparedStatement = {
  name: "sandfork_series_roll_up",
  text: "SELECT sandfork_roll_up_usage($1::uuid)::text AS summed_before",
};

// Every hour before the mark's is whole in the sums and the mark's own hour holds its part before
// the mark; the records add what finished from the mark on.
const SERIES: PreparedStatement = {
  name: "sandfork_usage_series",
  text: `SELECT (extract(epoch FROM date_trunc($2::text, t, 'UTC')) * 1000)::int8::text AS at_ms, template,
      sum(executions)::text AS executions, sum(units)::text AS units FROM (
    SELECT hour AS t, template, executions, units FROM execution_usage_hours
    WHERE key_id = $1::uuid AND hour >= $3::timestamptz AND hour < $4::timestamptz
    UNION ALL
    SELECT finished_at, template, 1, coalesce(charged_units, 0) FROM executions
    WHERE key_id = $1::uuid AND finished_at >= greatest($5::timestamptz, $3::timestamptz) AND finished_at < $4::timestamptz
      AND status <> 'aborted'
  ) AS usage
  GROUP BY 1, template
  ORDER BY 1, template`,
};
