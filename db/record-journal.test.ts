import { randomUUID } from "node:crypto";
import {
  appendFileSync,
  cpSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { eq } from "drizzle-orm";
import { afterAll, describe, expect, it } from "vitest";
import { CreditLeases } from "../gateway/credit-leases.js";
import { findExecution } from "./billing.js";
import type { OpenDatabase } from "./client.js";
import { getBalance } from "./keys.js";
import { leasedUnits, releaseAbandonedLeases } from "./leases.js";
import { openDatabase } from "./open.js";
import {
  JOURNAL_FILE,
  type JournaledRecord,
  type JournalStore,
  RecordJournal,
} from "./record-journal.js";
import { executions } from "./schema.js";
import { accountWithKey } from "./testing/accounts.js";
import { leasedExecution } from "./testing/leased-execution.js";
import { copySeedTo } from "./testing/pglite-seed.js";

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "sandfork-journal-"));
  dirs.push(dir);
  return dir;
}

/** Opens the PGlite database in `dataDir` (a fresh one where there is none), uses it, closes it. */
async function withDatabase<T>(
  dataDir: string,
  use: (open: OpenDatabase) => Promise<T>,
): Promise<T> {
  await copySeedTo(dataDir);
  const open = await openDatabase({ backend: "pglite", dataDir });
  try {
    return await use(open);
  } finally {
    await open.close();
  }
}

/** An account with 100 credits and a gateway's leases on the database, three executions recorded (3 units each). */
async function threeRecorded(open: OpenDatabase) {
  const ids = await accountWithKey(open.db, 100);
  const leases = new CreditLeases({
    db: open.db,
    gatewayId: randomUUID(),
    holdsPerLease: 4,
    lingerMs: 60_000,
    keyCheckMs: 60_000,
  });
  for (let i = 0; i < 3; i++)
    expect(await leases.hold(ids.accountId, ids.keyId, 10)).toEqual({ kind: "held" });
  const records = [];
  for (let i = 0; i < 3; i++)
    records.push(await leases.record(leasedExecution(ids, leases.gatewayId, 10, 3)));
  return { ids, leases, records };
}

const journalLines = (dataDir: string) =>
  readFileSync(join(dataDir, JOURNAL_FILE), "utf8")
    .split("\n")
    .filter((l) => l !== "");

describe("the record journal on embedded PGlite", () => {
  it("an answered record is in the file before its fold, and every statement sees it: drizzle's, prepared ones", async () => {
    const dataDir = join(tempDir(), "data");
    await withDatabase(dataDir, async (open) => {
      const { ids, leases, records } = await threeRecorded(open);
      // Appended, not folded yet (the fold waits a few ms for others).
      expect(journalLines(dataDir)).toHaveLength(3);
      expect(leases.leaseOn(ids.accountId)).toEqual({ units: 31, held: 0 });
      // Drizzle's statements wait for the fold...
      const stored = await findExecution(open.db, records[0]!.id);
      expect(stored).toMatchObject({
        status: "completed",
        chargedUnits: 3,
        reservedUnits: 10,
        stdout: "42\n",
      });
      // ... holding what the answer said, to the millisecond.
      expect(stored?.finishedAt?.getTime()).toBe(records[0]!.finishedAt?.getTime());
      expect(stored?.createdAt.getTime()).toBe(records[0]!.createdAt.getTime());
      expect(await leasedUnits(open.db, leases.gatewayId, ids.accountId)).toBe(31);
      // ... and so do prepared ones (the balance).
      await leases.hold(ids.accountId, ids.keyId, 10);
      await leases.record(leasedExecution(ids, leases.gatewayId, 10, 3));
      expect(journalLines(dataDir)).toHaveLength(1);
      expect(await getBalance(open.db, ids.accountId)).toMatchObject({
        balanceUnits: 88,
        reservedUnits: 28,
      });
      // Everything in the file is in the database: the file is empty.
      expect(statSync(join(dataDir, JOURNAL_FILE)).size).toBe(0);
    });
  });

  it("records a killed gateway answered but never folded are billed once at the next open; folded ones are not billed again", async () => {
    const root = tempDir();
    const dataDir = join(root, "data");
    const { accountId, ids } = await withDatabase(dataDir, async (open) => {
      const recorded = await threeRecorded(open);
      const journal = readFileSync(join(dataDir, JOURNAL_FILE), "utf8");
      // What a SIGKILL now leaves: the directory as it is, nothing of the three folded. (No
      // statement runs while it is copied: PGlite runs in this thread.)
      cpSync(dataDir, join(root, "killed-before-fold"), { recursive: true });
      expect(await getBalance(open.db, recorded.ids.accountId)).toMatchObject({ balanceUnits: 91 });
      // What a SIGKILL after the fold but before the file was emptied would leave.
      cpSync(dataDir, join(root, "killed-after-fold"), { recursive: true });
      writeFileSync(join(root, "killed-after-fold", JOURNAL_FILE), journal);
      return { accountId: recorded.ids.accountId, ids: recorded.records.map((r) => r.id) };
    });

    await withDatabase(join(root, "killed-before-fold"), async (open) => {
      expect(open.journalReplay).toEqual({ folded: 3, alreadyRecorded: 0, unreadable: 0 });
      expect(
        await open.db.select().from(executions).where(eq(executions.accountId, accountId)),
      ).toHaveLength(3);
      // The recovery pass then gives back what the dead gateway's lease still held.
      expect(await releaseAbandonedLeases(open.db, [])).toEqual({ leases: 1, units: 31 });
      expect(await getBalance(open.db, accountId)).toMatchObject({
        balanceUnits: 91,
        reservedUnits: 0,
      });
    });

    await withDatabase(join(root, "killed-after-fold"), async (open) => {
      expect(open.journalReplay).toEqual({ folded: 0, alreadyRecorded: 3, unreadable: 0 });
      expect(await getBalance(open.db, accountId)).toMatchObject({
        balanceUnits: 91,
        reservedUnits: 31,
      });
      const rows = await open.db
        .select({ id: executions.id })
        .from(executions)
        .where(eq(executions.accountId, accountId));
      expect(rows.map((r) => r.id).sort()).toEqual([...ids].sort());
    });
  });

  it("a line whose write was torn is skipped and reported, the whole lines before it are billed", async () => {
    const root = tempDir();
    const dataDir = join(root, "data");
    const accountId = await withDatabase(dataDir, async (open) => {
      const { ids } = await threeRecorded(open);
      cpSync(dataDir, join(root, "torn"), { recursive: true });
      return ids.accountId;
    });
    const journal = readFileSync(join(root, "torn", JOURNAL_FILE), "utf8");
    appendFileSync(join(root, "torn", JOURNAL_FILE), journal.slice(0, journal.indexOf("\n") - 20));
    await withDatabase(join(root, "torn"), async (open) => {
      expect(open.journalReplay).toEqual({ folded: 3, alreadyRecorded: 0, unreadable: 1 });
      expect(await getBalance(open.db, accountId)).toMatchObject({ balanceUnits: 91 });
    });
  });

  it("refuses before appending what the database would refuse: the answer is an error, the hold freed, nothing charged", async () => {
    const dataDir = join(tempDir(), "data");
    await withDatabase(dataDir, async (open) => {
      const ids = await accountWithKey(open.db, 100);
      const leases = new CreditLeases({
        db: open.db,
        gatewayId: randomUUID(),
        holdsPerLease: 4,
        lingerMs: 60_000,
        keyCheckMs: 60_000,
      });
      await leases.hold(ids.accountId, ids.keyId, 10);
      const bad = leasedExecution(ids, leases.gatewayId, 10, 3);
      bad.settlement.stderr = "nul\u0000";
      await expect(leases.record(bad)).rejects.toThrow(/NUL/);
      // An Idempotency-Key is checked at the HTTP edge; the journal does not rely on it.
      await leases.hold(ids.accountId, ids.keyId, 10);
      await expect(
        leases.record({
          ...leasedExecution(ids, leases.gatewayId, 10, 3),
          idempotencyKey: "k\u0000",
        }),
      ).rejects.toThrow(/NUL/);
      expect(journalLines(dataDir)).toEqual([]);
      expect(leases.leaseOn(ids.accountId)).toEqual({ units: 40, held: 0 });
      expect(await getBalance(open.db, ids.accountId)).toMatchObject({
        balanceUnits: 100,
        reservedUnits: 40,
      });
    });
  });
});

describe("RecordJournal", () => {
  const record = (n: number): JournaledRecord => ({
    executionId: `execution-${n}`,
    accountId: "a",
    keyId: "k",
    tokenId: null,
    idempotencyKey: null,
    requestHash: "h",
    template: "python",
    gatewayId: "g",
    reservedUnits: 10,
    createdAt: new Date(1_000 + n),
    finishedAt: new Date(2_000 + n),
    settlement: {
      status: "completed",
      exitCode: 0,
      stdout: `${n}\n`,
      stderr: "",
      truncated: false,
      timings: { queueMs: 0, forkMs: 1, execMs: 1, totalMs: 2 },
      network: null,
      chargedUnits: 1,
    },
  });

  /** A database double: the ids folded, in order; `failing` makes folds throw. */
  function store() {
    const folds: string[][] = [];
    const s = {
      folds,
      failing: false as boolean,
      fold: async (records: JournaledRecord[]) => {
        if (s.failing) throw new Error("the database is down");
        folds.push(records.map((r) => r.executionId));
      },
      recorded: async (ids: string[]) => new Set(ids.filter((id) => folds.flat().includes(id))),
    } satisfies JournalStore & { folds: string[][]; failing: boolean };
    return s;
  }

  it("folds what was appended together, after the fold delay or when asked; a failed fold keeps the records, in the file and for the next try", async () => {
    const path = join(tempDir(), JOURNAL_FILE);
    const db = store();
    const { journal } = await RecordJournal.open(path, db);
    journal.append(record(1));
    journal.append(record(2));
    expect(journal.upToDate).toBe(false);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(db.folds).toEqual([["execution-1", "execution-2"]]);
    expect(statSync(path).size).toBe(0);

    db.failing = true;
    journal.append(record(3));
    await expect(journal.settled()).rejects.toThrow("the database is down");
    expect(readFileSync(path, "utf8").split("\n")).toHaveLength(2);
    db.failing = false;
    journal.append(record(4));
    await journal.settled();
    expect(db.folds).toEqual([
      ["execution-1", "execution-2"],
      ["execution-3", "execution-4"],
    ]);
    expect(journal.upToDate).toBe(true);
    expect(statSync(path).size).toBe(0);
    await journal.close();
  });

  it("a record decodes as it was appended, dates included; an open that cannot fold it keeps it", async () => {
    const path = join(tempDir(), JOURNAL_FILE);
    const writer = store();
    writer.failing = true;
    const { journal } = await RecordJournal.open(path, writer);
    journal.append(record(7));
    await expect(journal.close()).rejects.toThrow();

    // A database that cannot take it: the open fails, saying where the records are, and keeps them.
    const refusing = store();
    refusing.failing = true;
    await expect(RecordJournal.open(path, refusing)).rejects.toThrow(
      `cannot bill the executions answered in the record journal ${path}: the database is down`,
    );
    expect(readFileSync(path, "utf8").split("\n")).toHaveLength(2);

    const reader = store();
    const folded: JournaledRecord[] = [];
    const { replay } = await RecordJournal.open(path, {
      ...reader,
      fold: async (records) => void folded.push(...records),
    });
    expect(replay).toEqual({ folded: 1, alreadyRecorded: 0, unreadable: 0 });
    expect(folded).toEqual([record(7)]);
    expect(statSync(path).size).toBe(0);
  });

  it("a record's Idempotency-Key is kept, and a line written before records carried one reads as without", async () => {
    const path = join(tempDir(), JOURNAL_FILE);
    const keyed = { ...record(8), idempotencyKey: "retry-8" };
    const { idempotencyKey: _, ...older } = JSON.parse(
      JSON.stringify({ ...record(9), createdAt: 1_009, finishedAt: 2_009 }),
    ) as Record<string, unknown>;
    const writer = store();
    writer.failing = true;
    const { journal } = await RecordJournal.open(path, writer);
    journal.append(keyed);
    expect(journal.pendingWithKey("k", "retry-8")).toEqual(keyed);
    expect(journal.pendingWithKey("other key", "retry-8")).toBeUndefined();
    await expect(journal.close()).rejects.toThrow();
    appendFileSync(path, `${JSON.stringify(older)}\n`);

    const folded: JournaledRecord[] = [];
    await RecordJournal.open(path, {
      ...store(),
      fold: async (records) => void folded.push(...records),
    });
    expect(folded).toEqual([keyed, record(9)]);
  });
});
