// Usage sums over the ledger for one key and period.
import { and, eq, gte, lt, sql } from "drizzle-orm";
import type { Database } from "./client.js";
import { usageLedger } from "./schema.js";

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
      template: sql<string>`coalesce(${usageLedger.template}, '')`,
      executions: sql<number>`count(*)::int`,
      units: sql<string>`coalesce(sum(${usageLedger.units}), 0)::text`,
    })
    .from(usageLedger)
    .where(
      and(
        eq(usageLedger.keyId, keyId),
        eq(usageLedger.kind, "usage"),
        gte(usageLedger.createdAt, from),
        lt(usageLedger.createdAt, to),
      ),
    )
    .groupBy(usageLedger.template)
    .orderBy(usageLedger.template);
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
