// Usage sums over one key's finished executions in a period: each settled record is its charge's
// entry in the accounts' journal, attributed to when it was charged (finished_at). A released
// execution ("aborted": the runtime never ran it) was charged nothing and is not usage.
import { and, eq, gte, lt, ne, sql } from "drizzle-orm";
import type { Database } from "./client.js";
import { executions } from "./schema.js";

export interface TemplateUsage {
  template: string;
  executions: number;
  units: number;
}

export interface UsageSummary {
  executions: number;
  units: number;
  byTemplate: TemplateUsage[];
}

/** Usage recorded for `keyId` in [from, to). */
export async function usageForKey(db: Database, keyId: string, from: Date, to: Date): Promise<UsageSummary> {
  const rows = await db
    .select({
      template: executions.template,
      executions: sql<number>`count(*)::int`,
      units: sql<string>`coalesce(sum(${executions.chargedUnits}), 0)::text`,
    })
    .from(executions)
    .where(and(eq(executions.keyId, keyId), gte(executions.finishedAt, from), lt(executions.finishedAt, to), ne(executions.status, "aborted")))
    .groupBy(executions.template)
    .orderBy(executions.template);
  // Sums come back as text (a numeric); they must still be exact as JS numbers.
  const byTemplate = rows.map((r) => ({ template: r.template, executions: r.executions, units: exactUnits(r.units) }));
  return {
    executions: byTemplate.reduce((n, t) => n + t.executions, 0),
    units: byTemplate.reduce((n, t) => n + t.units, 0),
    byTemplate,
  };
}

function exactUnits(text: string): number {
  const units = Number(text);
  if (!Number.isSafeInteger(units)) throw new RangeError(`usage sum ${text} is beyond exact integer range`);
  return units;
}
