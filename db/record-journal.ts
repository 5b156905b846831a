// The record journal of embedded PGlite. A leased execution's record (db/leases.ts) is
// committed by appending one line to a file in the database's directory before its answer is
// sent, and folded into the database up to FOLD_DELAY_MS later, together with the records answered
// meanwhile, in one statement. PGlite runs with fsync off, so its own commit is a write to the
// operating system as well: an appended record survives a SIGKILL of the gateway exactly as a
// committed one does, and neither survives a power loss (gateway/README.md, Durability). What it
// saves: at concurrency 1 every record was a commit of its own, on caches the VM's run had gone
// cold, in the gateway's own thread.
//
// Nothing reads the database without the records already answered: every statement on a
// JournaledPGlite first waits until the journal has folded what was appended before it. A
// gateway killed before a fold leaves the records in the file; the next open folds them first,
// skipping those already in the database (a record and its charge are folded in one statement,
// so its id in `executions` means it is billed). The file is emptied whenever everything in it is
// in the database. On a database in memory the journal is in memory too.
import { closeSync, ftruncateSync, openSync, readFileSync, writeSync } from "node:fs";
import { PGlite, type Results, type Transaction } from "@electric-sql/pglite";
import type { Database } from "./client.js";
import type { LeasedExecution } from "./leases.js";

/** The journal's file in the database's directory. */
export const JOURNAL_FILE = "sandfork-records.journal";

/**
 * How long an appended record waits for others to be folded with it: longer folds more records
 * into one statement and costs the gateway less CPU per execution; the records are durable in the
 * journal meanwhile.
 */
const FOLD_DELAY_MS = 50;
/** After a failed fold, how long until the next try (unless a statement asks sooner). */
const RETRY_DELAY_MS = 1_000;
/** Records in one fold statement, as in group commit. */
const MAX_FOLD = 64;

/** A record as the journal holds it: when it finished is fixed when it is answered. */
export type JournaledRecord = LeasedExecution & { finishedAt: Date };

export interface JournalStore {
  /** Folds the records into the database in one atomic statement, which must not wait for this journal. */
  fold(records: JournaledRecord[]): Promise<void>;
  /** Which of these execution ids the database holds a record of. */
  recorded(ids: string[]): Promise<Set<string>>;
}

/** What opening the journal found left by a process that stopped before folding it. */
export interface JournalReplay {
  /** Records folded now. */
  folded: number;
  /** Records in the file already in the database (folded, the file not emptied yet). */
  alreadyRecorded: number;
  /** Lines that were not a whole record: a write torn by a failure, whose execution got an error, not an answer. */
  unreadable: number;
}

export class RecordJournal {
  /** Appended, not folded yet, in order. */
  private pending: JournaledRecord[] = [];
  private folded = 0;
  private folding: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  /** Bytes in the file. */
  private size = 0;
  /** Set when a failed append could not be undone: the file's end is unknown, nothing more is appended. */
  private broken: Error | undefined;
  /** A fold failed and none has succeeded since (said once, not at every retry). */
  private failing = false;

  private constructor(
    private readonly fd: number | undefined,
    private readonly store: JournalStore,
  ) {}

  /**
   * Opens the journal at `path` (undefined: in memory), first folding into the database the
   * records a stopped process left in it.
   */
  static async open(
    path: string | undefined,
    store: JournalStore,
  ): Promise<{ journal: RecordJournal; replay: JournalReplay }> {
    const replay: JournalReplay = { folded: 0, alreadyRecorded: 0, unreadable: 0 };
    if (path === undefined) return { journal: new RecordJournal(undefined, store), replay };
    // Only this process reads it (it holds executions' output, as the database's files do).
    const fd = openSync(path, "a+", 0o600);
    const { records, unreadable } = decodeLines(readFileSync(fd, "utf8"));
    replay.unreadable = unreadable;
    for (let at = 0; at < records.length; at += MAX_FOLD) {
      const batch = records.slice(at, at + MAX_FOLD);
      const recorded = await store.recorded(batch.map((r) => r.executionId));
      const unfolded = batch.filter((r) => !recorded.has(r.executionId));
      try {
        if (unfolded.length > 0) await store.fold(unfolded);
      } catch (error) {
        // The file stays as it is: nothing in it is lost, and the next open tries again.
        closeSync(fd);
        throw new Error(
          `cannot bill the executions answered in the record journal ${path}: ${(error as Error).message}`,
          { cause: error },
        );
      }
      replay.folded += unfolded.length;
      replay.alreadyRecorded += batch.length - unfolded.length;
    }
    ftruncateSync(fd, 0);
    return { journal: new RecordJournal(fd, store), replay };
  }

  /** Commits the record: written to the file (the operating system has it) when this returns. */
  append(record: JournaledRecord): void {
    if (this.broken !== undefined)
      throw new Error(`the record journal cannot be written: ${this.broken.message}`);
    if (this.fd !== undefined) this.write(`${encodeRecord(record)}\n`);
    this.pending.push(record);
    this.foldLater(FOLD_DELAY_MS);
  }

  /** The record appended with this key's Idempotency-Key and not folded yet, if any. */
  pendingWithKey(keyId: string, idempotencyKey: string): JournaledRecord | undefined {
    return this.pending.find((r) => r.idempotencyKey === idempotencyKey && r.keyId === keyId);
  }

  /** Every record appended is in the database. */
  get upToDate(): boolean {
    return this.pending.length === 0;
  }

  /** Resolves once every record appended before this call is in the database; rejects if a fold fails. */
  async settled(): Promise<void> {
    const target = this.folded + this.pending.length;
    while (this.folded < target) {
      this.folding ??= this.foldPending().finally(() => (this.folding = undefined));
      await this.folding;
    }
  }

  /** Folds what is left and closes the file. What cannot be folded stays in it for the next open. */
  async close(): Promise<void> {
    try {
      await this.settled();
    } finally {
      clearTimeout(this.timer);
      if (this.fd !== undefined) closeSync(this.fd);
    }
  }

  private foldLater(delayMs: number): void {
    if (this.timer !== undefined) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.settled().catch((error: Error) => {
        if (!this.failing)
          console.error(
            `sandfork: cannot fold the record journal into the database, retrying every ${RETRY_DELAY_MS} ms: ${error.message}`,
          );
        this.failing = true;
        this.foldLater(RETRY_DELAY_MS);
      });
    }, delayMs);
    this.timer.unref();
  }

  private async foldPending(): Promise<void> {
    const batch = this.pending.slice(0, MAX_FOLD);
    await this.store.fold(batch);
    this.failing = false;
    this.pending.splice(0, batch.length);
    this.folded += batch.length;
    if (
      this.pending.length === 0 &&
      this.fd !== undefined &&
      this.size > 0 &&
      this.broken === undefined
    ) {
      ftruncateSync(this.fd, 0);
      this.size = 0;
    }
  }

  /** Appends `line` whole, or not at all. */
  private write(line: string): void {
    const bytes = Buffer.from(line, "utf8");
    const fd = this.fd as number;
    try {
      for (let at = 0; at < bytes.length; ) at += writeSync(fd, bytes, at);
    } catch (error) {
      try {
        ftruncateSync(fd, this.size);
      } catch {
        this.broken = error as Error;
      }
      throw error;
    }
    this.size += bytes.length;
  }
}

function encodeRecord(r: JournaledRecord): string {
  return JSON.stringify({
    ...r,
    createdAt: r.createdAt.getTime(),
    finishedAt: r.finishedAt.getTime(),
  });
}

function decodeLines(text: string): { records: JournaledRecord[]; unreadable: number } {
  const records: JournaledRecord[] = [];
  let unreadable = 0;
  const lines = text.split("\n");
  // The last piece follows the last newline: empty, or a line whose write never completed.
  if (lines.pop() !== "") unreadable++;
  for (const line of lines) {
    const record = decodeRecord(line);
    if (record === undefined) unreadable++;
    else records.push(record);
  }
  return { records, unreadable };
}

function decodeRecord(line: string): JournaledRecord | undefined {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch {
    return undefined;
  }
  if (typeof value !== "object" || value === null) return undefined;
  const r = value as Record<string, unknown>;
  if (
    typeof r.executionId !== "string" ||
    typeof r.createdAt !== "number" ||
    typeof r.finishedAt !== "number"
  )
    return undefined;
  if (typeof r.settlement !== "object" || r.settlement === null) return undefined;
  // Lines written before records carried an Idempotency-Key have none.
  const idempotencyKey = typeof r.idempotencyKey === "string" ? r.idempotencyKey : null;
  return {
    ...(r as unknown as LeasedExecution),
    idempotencyKey,
    createdAt: new Date(r.createdAt),
    finishedAt: new Date(r.finishedAt),
  };
}

/**
 * PGlite whose every statement first waits for its record journal's folds (db/prepared.ts waits
 * too), so that no read misses a record already answered. The journal is attached once the
 * database is migrated and the journal replayed.
 */
export class JournaledPGlite extends PGlite {
  journal: RecordJournal | undefined;

  override async query<T>(
    query: string,
    params?: unknown[],
    options?: Parameters<PGlite["query"]>[2],
  ): Promise<Results<T>> {
    await this.journal?.settled();
    return super.query<T>(query, params, options);
  }

  override async exec(query: string, options?: Parameters<PGlite["exec"]>[1]): Promise<Results[]> {
    await this.journal?.settled();
    return super.exec(query, options);
  }

  override async transaction<T>(callback: (tx: Transaction) => Promise<T>): Promise<T> {
    await this.journal?.settled();
    return super.transaction(callback);
  }

  override async describeQuery(
    query: string,
    options?: Parameters<PGlite["describeQuery"]>[1],
  ): Promise<Awaited<ReturnType<PGlite["describeQuery"]>>> {
    await this.journal?.settled();
    return super.describeQuery(query, options);
  }
}

/** The journal of the database behind `db`: only embedded PGlite has one. */
export function journalOf(db: Database): RecordJournal | undefined {
  const client = (db as unknown as { $client: unknown }).$client;
  return client instanceof JournaledPGlite ? client.journal : undefined;
}
