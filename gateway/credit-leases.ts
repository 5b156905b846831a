// This gateway's credit leases (db/leases.ts), one an account, and the holds of its executions
// in flight against them, in memory: an execution's hold costs no database round trip unless
// its account's lease is short, and its record is the one statement billing it (group-committed
// with the records of executions that end at the same time; on embedded PGlite, appended to the
// record journal and folded into the database with the others of the next 50 ms).
//
// For each account: `units` is what the lease holds in the database, `held` what executions in
// flight hold of it; a hold needs `units - held` to cover it, else the lease first grows by up to
// `holdsPerLease` such holds (as much as the account has available). An execution's record
// spends its charge from `units` and frees its hold from `held`, both once its statement has
// committed. A lease nothing holds is given back after `lingerMs` (never on embedded PGlite,
// which one gateway owns: `lingerMs` null), at shutdown, or at once when a reservation made in
// the database (an execution with an Idempotency-Key, a session's cell) or a session's accrual
// finds the account short. The linger is long, so that calls a few seconds apart (an agent's
// pace) do not each take a lease and give it back: two transactions on their path.
//
// A hold the account cannot cover while other gateways' leases hold enough asks them for their
// idle credits (a NOTIFY on LEASES_WANTED_CHANNEL: each gives back its lease's free part at
// once) and tries again a few times over about a second and a half: several gateways on one
// PostgreSQL then share an account to its last credit, not only the one that leased it last.
//
// A revoked key gets no hold: a key is looked up at most once every `keyCheckMs` (the key
// cache's TTL: as long as a revocation made by another gateway takes to reach this one's API-key
// callers anyway), and at once after this gateway revoked it (forgetKey). A check is made again in
// the background half its time after it was made, while the key is in use, as the key cache's
// lookups are (gateway/keep-fresh.ts).

import { accountStanding, type ExecutionRecord } from "../db/billing.js";
import type { Database, Listen } from "../db/client.js";
import { GroupCommit } from "../db/group-commit.js";
import type { AccountBalance } from "../db/keys.js";
import {
  acquireLease,
  askForIdleLeases,
  checkRecordable,
  dropEmptyLeases,
  giveBack,
  journaledRecord,
  LEASES_WANTED_CHANNEL,
  type LeasedExecution,
  recordAll,
} from "../db/leases.js";
import { journalOf, type RecordJournal } from "../db/record-journal.js";
import { KeepFresh } from "./keep-fresh.js";

export type HoldOutcome =
  | { kind: "held" }
  | { kind: "insufficient-credits"; availableUnits: number }
  | { kind: "key-revoked" };
type GrowthOutcome =
  | { kind: "held" }
  | { kind: "insufficient-credits"; availableUnits: number; othersLeased: number }
  | { kind: "key-revoked" };

export interface CreditLeaseOptions {
  db: Database;
  gatewayId: string;
  /** How many holds of the size that found the lease short it grows by. */
  holdsPerLease: number;
  /** How long a lease nothing holds is kept before its credits go back to the account; null: until asked or shutdown. */
  lingerMs: number | null;
  /** Where other gateways' asks for idle credits arrive (start() listens); without it none are heard. */
  listen?: Listen | undefined;
  /** How long a key found usable is trusted before it is looked up again. */
  keyCheckMs: number;
}

/**
 * A hold that found the account short while other gateways lease enough tries again after each
 * of these waits (ms), having asked them for their idle credits.
 */
const RETRIES_AFTER_ASKING_MS = [20, 60, 180, 500, 800];

interface AccountLease {
  units: number;
  held: number;
  /** The lease's row exists (records need it, even of a free execution). */
  stored: boolean;
  /** The lease's growth in flight: other holds wait for it rather than growing it too. */
  growing: Promise<GrowthOutcome> | undefined;
  idle: NodeJS.Timeout | undefined;
}

export class CreditLeases {
  private readonly leases = new Map<string, AccountLease>();
  /** By key id: when it was last found usable, when a hold last used that, and its account. */
  private readonly keysChecked = new Map<
    string,
    { checkedAt: number; usedAt: number; accountId: string }
  >();
  /** By key id: the background checks of keys in use. */
  private readonly keepChecked: KeepFresh<string>;
  /** Counts forgetKey() calls: a check that began before one does not renew the key's trust. */
  private keyForgets = 0;
  private readonly records: GroupCommit<LeasedExecution, ExecutionRecord>;
  /** Embedded PGlite's record journal, which records go through there (db/record-journal.ts). */
  private readonly journal: RecordJournal | undefined;
  private unlisten: (() => Promise<void>) | undefined;

  constructor(private readonly options: CreditLeaseOptions) {
    this.records = new GroupCommit((items) => recordAll(options.db, items));
    this.journal = journalOf(options.db);
    this.keepChecked = new KeepFresh(
      options.keyCheckMs,
      (keyId) => this.keysChecked.get(keyId)?.usedAt,
      async (keyId) => {
        const checked = this.keysChecked.get(keyId);
        if (checked !== undefined) await this.checkKey(checked.accountId, keyId, Date.now(), 0);
      },
    );
  }

  get gatewayId(): string {
    return this.options.gatewayId;
  }

  /** Listens for other gateways' asks for this one's idle credits (LEASES_WANTED_CHANNEL). */
  async start(): Promise<void> {
    if (this.options.listen === undefined || this.unlisten !== undefined) return;
    this.unlisten = await this.options.listen(LEASES_WANTED_CHANNEL, (accountId) => {
      if (this.leases.has(accountId)) void this.giveBackFree(accountId).catch(() => {});
    });
  }

  /** Stops listening for asks (close() does too). */
  async stop(): Promise<void> {
    const unlisten = this.unlisten;
    this.unlisten = undefined;
    await unlisten?.();
  }

  /** Holds `units` of the account's credits for an execution of `keyId`. */
  async hold(accountId: string, keyId: string, units: number): Promise<HoldOutcome> {
    if (!(await this.keyStillUsable(accountId, keyId))) return { kind: "key-revoked" };
    const lease = this.leaseOf(accountId);
    clearTimeout(lease.idle);
    lease.idle = undefined;
    let retries = 0;
    while (!lease.stored || lease.units - lease.held < units) {
      // Another hold's growth decides nothing for this one: look again once it is done.
      if (lease.growing !== undefined) {
        await lease.growing;
        continue;
      }
      const outcome = await this.grow(accountId, keyId, lease, units);
      if (outcome.kind === "held") continue;
      const wait = RETRIES_AFTER_ASKING_MS[retries];
      if (
        outcome.kind === "insufficient-credits" &&
        wait !== undefined &&
        outcome.othersLeased >= units
      ) {
        if (retries === 0) await askForIdleLeases(this.options.db, accountId);
        retries++;
        await new Promise((resolve) => setTimeout(resolve, wait));
        continue;
      }
      this.idleLater(accountId, lease);
      return outcome.kind === "insufficient-credits"
        ? { kind: "insufficient-credits", availableUnits: outcome.availableUnits }
        : outcome;
    }
    lease.held += units;
    return { kind: "held" };
  }

  /**
   * Records an execution that held `execution.reservedUnits`: its one billing statement. The
   * hold is freed either way; a record the database refused billed nothing.
   */
  async record(execution: LeasedExecution): Promise<ExecutionRecord> {
    if (this.journal !== undefined) return this.recordInJournal(this.journal, execution);
    const lease = this.leaseOf(execution.accountId);
    try {
      const record = await this.records.submit(execution);
      lease.units -= record.chargedUnits ?? 0;
      return record;
    } finally {
      this.drop(execution.accountId, execution.reservedUnits);
    }
  }

  /**
   * On embedded PGlite: the record is committed to the journal, folded into the database with
   * others up to 50 ms later (db/record-journal.ts). The lease's checks, which the database makes of
   * a record it writes at once, are made here: it will see this one after its answer.
   */
  private recordInJournal(journal: RecordJournal, execution: LeasedExecution): ExecutionRecord {
    const lease = this.leaseOf(execution.accountId);
    try {
      checkRecordable(execution);
      if (!lease.stored || lease.held < execution.reservedUnits) {
        throw new Error(
          `execution ${execution.executionId} was not recorded: its gateway holds no credit lease covering it on account ${execution.accountId}`,
        );
      }
      const journaled = { ...execution, finishedAt: new Date() };
      journal.append(journaled);
      const record = journaledRecord(journaled);
      lease.units -= record.chargedUnits ?? 0;
      return record;
    } finally {
      this.drop(execution.accountId, execution.reservedUnits);
    }
  }

  /** Frees a hold without charging it (the execution never ran to an end). */
  drop(accountId: string, units: number): void {
    const lease = this.leaseOf(accountId);
    lease.held -= units;
    this.idleLater(accountId, lease);
  }

  /**
   * Gives the account's credits that nothing holds back to it now; true when there were any.
   * A reservation in the database that found the account short retries after this.
   */
  async giveBackFree(accountId: string): Promise<boolean> {
    const lease = this.leases.get(accountId);
    if (lease === undefined || lease.growing !== undefined) return false;
    const free = lease.units - lease.held;
    if (free <= 0) return false;
    lease.units -= free;
    try {
      await giveBack(this.options.db, this.options.gatewayId, accountId, free);
      return true;
    } catch (error) {
      lease.units += free;
      throw error;
    }
  }

  /** Gives back every lease's free credits. What is still held stays (at shutdown: for the next start's recovery pass). */
  async giveBackAll(): Promise<void> {
    for (const [accountId, lease] of this.leases) {
      clearTimeout(lease.idle);
      lease.idle = undefined;
      await this.giveBackFree(accountId);
    }
  }

  /**
   * At shutdown: gives back what nothing holds and deletes the leases left empty, so the next
   * start's recovery pass finds only what a gateway left holding credits.
   */
  async close(): Promise<void> {
    await this.stop();
    await this.giveBackAll();
    for (const accountId of await dropEmptyLeases(this.options.db, this.options.gatewayId)) {
      const lease = this.leases.get(accountId);
      if (lease !== undefined) lease.stored = false;
    }
  }

  /** The next hold of `keyId` looks the key up again (this gateway just revoked it). */
  forgetKey(keyId: string): void {
    this.keyForgets++;
    this.dropKeyCheck(keyId);
  }

  /**
   * The account's balance as its callers mean it: credits this gateway's lease holds that no
   * execution holds are available, not reserved. (Another gateway's lease counts as reserved
   * until it is given back: `lingerMs` after its last execution ends, or when asked.)
   */
  asSeenByCallers(balance: AccountBalance): AccountBalance {
    const lease = this.leases.get(balance.accountId);
    const free = lease === undefined ? 0 : Math.max(0, lease.units - lease.held);
    return {
      ...balance,
      reservedUnits: balance.reservedUnits - free,
      availableUnits: balance.availableUnits + free,
    };
  }

  /** What this gateway's lease on the account holds and what its executions in flight hold of it. */
  leaseOn(accountId: string): { units: number; held: number } {
    const lease = this.leases.get(accountId);
    return { units: lease?.units ?? 0, held: lease?.held ?? 0 };
  }

  private leaseOf(accountId: string): AccountLease {
    let lease = this.leases.get(accountId);
    if (lease === undefined) {
      lease = { units: 0, held: 0, stored: false, growing: undefined, idle: undefined };
      this.leases.set(accountId, lease);
    }
    return lease;
  }

  private grow(
    accountId: string,
    keyId: string,
    lease: AccountLease,
    units: number,
  ): Promise<GrowthOutcome> {
    const short = Math.max(0, units - (lease.units - lease.held));
    lease.growing = acquireLease(this.options.db, {
      gatewayId: this.options.gatewayId,
      accountId,
      keyId,
      minUnits: short,
      maxUnits: Math.max(short, units * this.options.holdsPerLease),
    })
      .then((outcome): GrowthOutcome => {
        if (outcome.kind === "leased") {
          lease.units += outcome.units;
          lease.stored = true;
          return { kind: "held" };
        }
        if (outcome.kind === "key-revoked") {
          this.dropKeyCheck(keyId);
          return outcome;
        }
        // What this gateway could still hold counts as available too.
        return {
          ...outcome,
          availableUnits: outcome.availableUnits + Math.max(0, lease.units - lease.held),
        };
      })
      .finally(() => (lease.growing = undefined));
    return lease.growing;
  }

  private async keyStillUsable(accountId: string, keyId: string): Promise<boolean> {
    const checked = this.keysChecked.get(keyId);
    const now = Date.now();
    if (checked === undefined || now - checked.checkedAt >= this.options.keyCheckMs)
      return this.checkKey(accountId, keyId, now, now);
    checked.usedAt = now;
    return true;
  }

  /**
   * Looks the key up; a usable one is trusted for keyCheckMs from `askedAt`, unless forgotten
   * meanwhile, and kept checked while used (`usedAt`; 0: a background check, which keeps when
   * holds used it).
   */
  private async checkKey(
    accountId: string,
    keyId: string,
    askedAt: number,
    usedAt: number,
  ): Promise<boolean> {
    const forgets = this.keyForgets;
    const usable = (await accountStanding(this.options.db, accountId, keyId))?.keyUsable === true;
    const lastUsedAt = Math.max(usedAt, this.keysChecked.get(keyId)?.usedAt ?? 0);
    if (!usable) this.dropKeyCheck(keyId);
    else if (forgets === this.keyForgets) {
      this.keysChecked.set(keyId, { checkedAt: askedAt, usedAt: lastUsedAt, accountId });
      this.keepChecked.arm(keyId);
    }
    return usable;
  }

  private dropKeyCheck(keyId: string): void {
    this.keysChecked.delete(keyId);
    this.keepChecked.disarm(keyId);
  }

  private idleLater(accountId: string, lease: AccountLease): void {
    const { lingerMs } = this.options;
    if (lingerMs === null || lease.held > 0 || lease.units === 0 || lease.idle !== undefined)
      return;
    lease.idle = setTimeout(() => {
      lease.idle = undefined;
      if (lease.held === 0) void this.giveBackFree(accountId).catch(() => {});
    }, lingerMs);
    lease.idle.unref();
  }
}
