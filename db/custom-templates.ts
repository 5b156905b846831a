// Templates built through the API: their rows, which are also their builds. What an account may
// see is decided here: its own templates, and those an admin published; anything else is not
// found, so that an account cannot tell another's template from none.
import { and, desc, eq, inArray, isNull, notInArray, or, sql } from "drizzle-orm";
import type { Database } from "./client.js";
import { customTemplates } from "./schema.js";

export type CustomTemplateRow = typeof customTemplates.$inferSelect;
export type BuildStatus = "queued" | "building" | "ready" | "failed";

export interface NewCustomTemplate {
  accountId: string;
  keyId: string;
  name: string;
  version: string;
  definition: unknown;
  /** The gateway that runs the build (failAbandonedBuilds). */
  gatewayId: string;
}

/**
 * Records a build of name@version for the account: the new row, or the existing one when that
 * version is queued, building or built (versions are immutable). A failed build of it is
 * replaced.
 */
export async function insertCustomTemplate(
  db: Database,
  template: NewCustomTemplate,
): Promise<{ row: CustomTemplateRow; created: boolean }> {
  return db.transaction(async (tx) => {
    const same = and(
      eq(customTemplates.accountId, template.accountId),
      eq(customTemplates.name, template.name),
      eq(customTemplates.version, template.version),
    );
    const [existing] = await tx.select().from(customTemplates).where(same).for("update");
    if (existing !== undefined && existing.status !== "failed")
      return { row: existing, created: false };
    if (existing !== undefined) await tx.delete(customTemplates).where(same);
    const [row] = await tx
      .insert(customTemplates)
      .values({ ...template, status: "queued" })
      .returning();
    if (row === undefined) throw new Error("custom template insert returned no row");
    return { row, created: true };
  });
}

export async function updateCustomTemplate(
  db: Database,
  id: string,
  patch: Partial<
    Pick<
      CustomTemplateRow,
      "status" | "step" | "error" | "imageBytes" | "snapshotBytes" | "finishedAt" | "published"
    >
  >,
): Promise<void> {
  await db.update(customTemplates).set(patch).where(eq(customTemplates.id, id));
}

export async function appendCustomTemplateLog(
  db: Database,
  id: string,
  text: string,
): Promise<void> {
  await db
    .update(customTemplates)
    .set({ logs: sql`${customTemplates.logs} || ${text}` })
    .where(eq(customTemplates.id, id));
}

/** What `accountId` may see: its own rows, and published ones. */
const visibleTo = (accountId: string) =>
  or(eq(customTemplates.accountId, accountId), eq(customTemplates.published, true));

/** Every template `accountId` may see (its own in any status, published ready ones), by name and newest first. */
export async function listVisibleTemplates(
  db: Database,
  accountId: string,
): Promise<CustomTemplateRow[]> {
  return db
    .select()
    .from(customTemplates)
    .where(
      or(
        eq(customTemplates.accountId, accountId),
        and(eq(customTemplates.published, true), eq(customTemplates.status, "ready")),
      ),
    )
    .orderBy(customTemplates.name, desc(customTemplates.createdAt));
}

/**
 * The ready template `name` (at `version`, or its newest build when null) that `accountId` may
 * run: its own first, else a published one.
 */
export async function findRunnableTemplate(
  db: Database,
  accountId: string,
  name: string,
  version: string | null,
): Promise<CustomTemplateRow | undefined> {
  const rows = await db
    .select()
    .from(customTemplates)
    .where(
      and(
        eq(customTemplates.name, name),
        eq(customTemplates.status, "ready"),
        version === null ? undefined : eq(customTemplates.version, version),
        visibleTo(accountId),
      ),
    )
    .orderBy(
      desc(sql`${customTemplates.accountId} = ${accountId}`),
      desc(customTemplates.finishedAt),
    )
    .limit(1);
  return rows[0];
}

/** The build `id` of template `name`, when `accountId` may see it (admins: any). */
export async function findBuild(
  db: Database,
  accountId: string | null,
  name: string,
  id: string,
): Promise<CustomTemplateRow | undefined> {
  const [row] = await db
    .select()
    .from(customTemplates)
    .where(
      and(
        eq(customTemplates.id, id),
        eq(customTemplates.name, name),
        accountId === null ? undefined : visibleTo(accountId),
      ),
    );
  return row;
}

/**
 * name@version of `accountId`; with `anyAccount` (admins) of any account, its own first, then
 * a published one.
 */
export async function findOwnTemplate(
  db: Database,
  accountId: string,
  anyAccount: boolean,
  name: string,
  version: string,
): Promise<CustomTemplateRow | undefined> {
  const [row] = await db
    .select()
    .from(customTemplates)
    .where(
      and(
        eq(customTemplates.name, name),
        eq(customTemplates.version, version),
        anyAccount ? undefined : eq(customTemplates.accountId, accountId),
      ),
    )
    .orderBy(
      desc(sql`${customTemplates.accountId} = ${accountId}`),
      desc(customTemplates.published),
    )
    .limit(1);
  return row;
}

/** Another account's published template of this name, when there is one. */
export async function publishedElsewhere(
  db: Database,
  accountId: string,
  name: string,
): Promise<boolean> {
  const rows = await db
    .select({ id: customTemplates.id })
    .from(customTemplates)
    .where(
      and(
        eq(customTemplates.name, name),
        eq(customTemplates.published, true),
        sql`${customTemplates.accountId} <> ${accountId}`,
      ),
    )
    .limit(1);
  return rows.length > 0;
}

/**
 * The version after the highest whole-number version of `name` in the account ("1" when it has
 * none): what a template saved from a session gets when the caller names no version.
 */
export async function nextVersion(db: Database, accountId: string, name: string): Promise<string> {
  const rows = await db
    .select({ version: customTemplates.version })
    .from(customTemplates)
    .where(and(eq(customTemplates.accountId, accountId), eq(customTemplates.name, name)));
  const numbers = rows.map((r) => r.version).filter((v) => /^[0-9]{1,15}$/.test(v));
  return String(Math.max(0, ...numbers.map(Number)) + 1);
}

export async function deleteCustomTemplate(db: Database, id: string): Promise<void> {
  await db.delete(customTemplates).where(eq(customTemplates.id, id));
}

/**
 * Marks failed the builds left queued or building by gateways not in `live` (they will not
 * finish: a build runs in its gateway's process), saying which gateway stopped. A build of no
 * recorded gateway (from before builds recorded theirs) counts as abandoned.
 */
export async function failAbandonedBuilds(db: Database, live: string[]): Promise<number> {
  const rows = await db
    .update(customTemplates)
    .set({
      status: "failed",
      error: sql`'the gateway running the build (' || coalesce(${customTemplates.gatewayId}, 'unrecorded') || ') stopped before it ended; build it again'`,
      finishedAt: new Date(),
    })
    .where(
      and(
        inArray(customTemplates.status, ["queued", "building"]),
        or(
          isNull(customTemplates.gatewayId),
          live.length === 0 ? undefined : notInArray(customTemplates.gatewayId, live),
        ),
      ),
    )
    .returning({ id: customTemplates.id });
  return rows.length;
}
