// Usage sums over one key's finished executions in a period: each settled record is its charge's
// entry in the accounts' journal, attributed to when it was charged (finished_at). A released
// execution ("aborted": the runtime never ran it) was charged nothing and is not usage.
//
// A period's whole hours are read from the key's hourly sums (execution_usage_hours), which each
// query first brings up to the horizon, 5 s ago (sandfork_roll_up_usage, migrations
// 0007_execution_usage_hours and 0008_usage_sums_to_the_horizon); the hour the sums stop in has a
// row for its part before that. Only the partial hours at the period's ends and the last seconds
// are summed from the records. So a query over a month reads a few hundred rows, not every
// execution of the month, which on PGlite would hold up every other request in the gateway's own
// thread (`npm run bench:usage`; docs/benchmarks.md, Usage queries).
import type { Database } from "./client.js";
import { type PreparedStatement, runPrepared } from "./prepared.js";

export interface TemplateUsage {
  template: string;
  executions: number;
  units: number;
}

/** Network bytes received and sent, and what the policy refused (the units are in `units`). */
export interface NetworkUsageSum {
  bytesIn: number;
  bytesOut: number;
  refused: number;
}

export interface UsageSummary {
  executions: number;
  units: number;
  byTemplate: TemplateUsage[];
  network: NetworkUsageSum;
}

const HOUR_MS = 3_600_000;

/** Usage recorded for `keyId` in [from, to). */
export async function usageForKey(
  db: Database,
  keyId: string,
  from: Date,
  to: Date,
): Promise<UsageSummary> {
  // Two statements: one that read the sums in the statement that sums the hours would not see the
  // rows it had just inserted (its snapshot is taken before them).
  const [mark] = await runPrepared(db, ROLL_UP, [keyId]);
  const summedBefore = Number(mark?.summed_before_ms);
  if (!Number.isFinite(summedBefore))
    throw new Error(`sandfork_roll_up_usage answered ${JSON.stringify(mark)}`);
  const { hoursFrom, hoursTo, recordsFrom } = summedPart(
    from.getTime(),
    to.getTime(),
    summedBefore,
  );
  const rows = await runPrepared(db, USAGE, [
    keyId,
    from.toISOString(),
    iso(hoursFrom),
    iso(hoursTo),
    iso(recordsFrom),
    to.toISOString(),
  ]);
  // Sums come back as text (a numeric); they must still be exact as JS numbers.
  const byTemplate = rows.map((r) => ({
    template: r.template as string,
    executions: exactSum(r.executions),
    units: exactSum(r.units),
  }));
  const total = (column: string) => rows.reduce((n, r) => n + exactSum(r[column]), 0);
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

const ROLL_UP: PreparedStatement = {
  name: "sandfork_roll_up_usage",
  text: "SELECT (extract(epoch FROM sandfork_roll_up_usage($1::uuid)) * 1000)::int8::text AS summed_before_ms",
};

/**
 * Which part of [from, to) the sums answer, in milliseconds: the rows of the hours in [hoursFrom,
 * hoursTo) hold exactly the records of [hoursFrom, recordsFrom); [from, hoursFrom) and
 * [recordsFrom, to) are read from the records. Every hour before the mark's is whole in the sums,
 * and the mark's own hour holds its part before the mark: a period that runs past the mark takes
 * that part too. None of it (hoursFrom = hoursTo = recordsFrom = to): all from the records.
 */
function summedPart(
  from: number,
  to: number,
  mark: number,
): { hoursFrom: number; hoursTo: number; recordsFrom: number } {
  const hoursFrom = Math.ceil(from / HOUR_MS) * HOUR_MS;
  if (to >= mark) {
    if (hoursFrom <= mark)
      return { hoursFrom, hoursTo: Math.ceil(mark / HOUR_MS) * HOUR_MS, recordsFrom: mark };
  } else {
    const hoursTo = Math.floor(to / HOUR_MS) * HOUR_MS;
    if (hoursFrom <= hoursTo) return { hoursFrom, hoursTo, recordsFrom: hoursTo };
  }
  return { hoursFrom: to, hoursTo: to, recordsFrom: to };
}

const iso = (ms: number) => new Date(ms).toISOString();

// $1 the key; $2 from, $3 and $4 the summed hours' range, $5 where the records start again, $6 to.
// Each part is summed by template before the parts are added: the records' rows go through one
// aggregate.
const USAGE: PreparedStatement = {
  name: "sandfork_usage",
  text: `SELECT template, sum(executions)::text AS executions, sum(units)::text AS units,
    sum(bytes_in)::text AS bytes_in, sum(bytes_out)::text AS bytes_out, sum(refused)::text AS refused FROM (
    SELECT template, sum(executions) AS executions, sum(units) AS units, sum(network_bytes_in) AS bytes_in,
      sum(network_bytes_out) AS bytes_out, sum(network_refused) AS refused FROM execution_usage_hours
    WHERE key_id = $1::uuid AND hour >= $3::timestamptz AND hour < $4::timestamptz
    GROUP BY template
    UNION ALL
    SELECT template, count(*), coalesce(sum(charged_units), 0), coalesce(sum((network->>'bytesIn')::int8), 0),
      coalesce(sum((network->>'bytesOut')::int8), 0), coalesce(sum((network->>'refused')::int8), 0) FROM executions
    WHERE key_id = $1::uuid AND ((finished_at >= $2::timestamptz AND finished_at < $3::timestamptz) OR (finished_at >= $5::timestamptz AND finished_at < $6::timestamptz))
      AND status <> 'aborted'
    GROUP BY template
  ) AS usage
  GROUP BY template
  ORDER BY template`,
};

function exactSum(text: string | null | undefined): number {
  const sum = Number(text);
  if (!Number.isSafeInteger(sum))
    throw new RangeError(`usage sum ${text} is beyond exact integer range`);
  return sum;
}
