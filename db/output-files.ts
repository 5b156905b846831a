// Files executions left under /work/out, kept in the database until they expire: downloadable
// from any gateway by the account that ran them, counted against their key's quota of bytes kept
// (sandfork_keep_output_file, migration 0013_output_files, under the key's advisory lock), and
// deleted by the sweep once expired. An expired file not yet swept is neither served nor counted.
import { and, asc, eq, gt, lte, sql } from "drizzle-orm";
import type { Database } from "./client.js";
import { type PreparedStatement, runPrepared } from "./prepared.js";
import { outputFiles } from "./schema.js";

export type StoredOutputFile = typeof outputFiles.$inferSelect;

/** Whose files they are, and until when and within how many bytes of its key they are kept. */
export interface OutputFileOwner {
  executionId: string;
  accountId: string;
  keyId: string;
  tokenId: string | null;
  expiresAt: Date;
  /** The most bytes the key's unexpired files may hold, these included. */
  quotaBytes: number;
}

const KEEP: PreparedStatement = {
  name: "sandfork_keep_output_file",
  text:
    "SELECT sandfork_keep_output_file($1::uuid, $2::text, $3::uuid, $4::uuid, $5::text, " +
    "decode($6::text, 'base64'), $7::timestamptz, $8::bigint)::text AS kept",
};

/** Keeps one file for `owner`; false when the key's quota has no room for it. */
export async function keepOutputFile(
  db: Database,
  owner: OutputFileOwner,
  path: string,
  content: Buffer,
): Promise<boolean> {
  const [row] = await runPrepared(db, KEEP, [
    owner.executionId,
    path,
    owner.accountId,
    owner.keyId,
    owner.tokenId,
    content.toString("base64"),
    owner.expiresAt.toISOString(),
    String(owner.quotaBytes),
  ]);
  return row?.kept === "true";
}

/** One unexpired file of an execution, with its content; undefined when there is none. */
export async function findOutputFile(
  db: Database,
  executionId: string,
  path: string,
  now: Date = new Date(),
): Promise<StoredOutputFile | undefined> {
  const [row] = await db
    .select()
    .from(outputFiles)
    .where(
      and(
        eq(outputFiles.executionId, executionId),
        eq(outputFiles.path, path),
        gt(outputFiles.expiresAt, now),
      ),
    );
  return row;
}

export type OutputFileEntry = Pick<StoredOutputFile, "path" | "bytes" | "expiresAt">;

/** An execution's unexpired files, in path order, without their contents. */
export async function listOutputFiles(
  db: Database,
  executionId: string,
  now: Date = new Date(),
): Promise<OutputFileEntry[]> {
  return db
    .select({
      path: outputFiles.path,
      bytes: outputFiles.bytes,
      expiresAt: outputFiles.expiresAt,
    })
    .from(outputFiles)
    .where(and(eq(outputFiles.executionId, executionId), gt(outputFiles.expiresAt, now)))
    .orderBy(asc(outputFiles.path));
}

/** Bytes of `keyId`'s unexpired files: what its quota counts. */
export async function keptBytesOfKey(
  db: Database,
  keyId: string,
  now: Date = new Date(),
): Promise<number> {
  const [row] = await db
    .select({ bytes: sql<string>`coalesce(sum(${outputFiles.bytes}), 0)::text` })
    .from(outputFiles)
    .where(and(eq(outputFiles.keyId, keyId), gt(outputFiles.expiresAt, now)));
  return Number(row?.bytes ?? 0);
}

/** The sweep: deletes the files expired by `now`; returns how many went. */
export async function deleteExpiredOutputFiles(db: Database, now: Date): Promise<number> {
  const gone = await db
    .delete(outputFiles)
    .where(lte(outputFiles.expiresAt, now))
    .returning({ path: outputFiles.path });
  return gone.length;
}
