// Stateful sessions, end to end, around the SessionRuntime boundary (runtime/session-runtime.ts):
// ownership (a key sees its sessions; a token only those it created), the key's limits (sessions
// at once, checkpoint bytes), credits (each cell is reserved and settled as an execution of the
// session's template; running time and checkpoint storage accrue and are charged by
// db/sessions.ts), and the state the gateway records in the database (running, paused, ended,
// deleted), which follows what the daemon answered. A sweep pauses sessions idle past their
// idle_timeout_s and deletes those past max_lifetime_s. A pause the daemon refuses for good (the
// session is no longer there as the row says: ended, unknown) settles the row once to what the
// daemon holds; failures are logged as one JSON line each.
import { createHash, randomUUID } from "node:crypto";
import { BillingBatches, type ExecutionRecord, release } from "../db/billing.js";
import type { Database } from "../db/client.js";
import {
  type AccrualOutcome,
  accrue,
  expiredSessions,
  findSession,
  idleRunningSessions,
  insertSessionsWithin,
  keySessionTotals,
  listSessions,
  type NewSession,
  type SessionChange,
  type SessionRow,
} from "../db/sessions.js";
import { RuntimeError } from "../runtime/errors.js";
import type { ExecutionOutcome, ExecutionRuntime } from "../runtime/execution-runtime.js";
import type {
  CellResult,
  SavedSessionTemplate,
  SessionInfo,
  SessionRuntime,
  TakenCheckpoint,
} from "../runtime/session-runtime.js";
import type { Principal } from "./auth/principal.js";
import type { ExecutionLimits } from "./config.js";
import type { CreditLeases } from "./credit-leases.js";
import { networkCharge, networkUsageOf, runtimeProblem } from "./execution-service.js";
import type { ConcurrencyLimiter } from "./limits.js";
import {
  grantedBytes,
  type NetworkPolicyInput,
  networkGrant,
  networkPolicyOf,
} from "./network-policy.js";
import { networkUnits, type Pricing, priceOf } from "./pricing.js";
import { ProblemError, type ProblemSlug } from "./problems.js";
import type { SessionSettings } from "./session-settings.js";
import { recordNetwork, type Telemetry } from "./telemetry.js";
import { isRuntimeName, type TemplateService } from "./template-service.js";

export interface SessionServiceDeps {
  db: Database;
  gatewayId: string;
  runtime: () => ExecutionRuntime | undefined;
  settings: SessionSettings;
  limits: ExecutionLimits;
  /** A cell's network bytes are priced as an execution's of its template. */
  pricing: Pricing;
  telemetry: Telemetry;
  concurrency: ConcurrencyLimiter;
  /** This gateway's credit leases: what they hold idle is given back when a session finds its account short. */
  leases: CreditLeases;
  /** Resolves a template built through the API (`name@version`, `name`) to the runtime's name. */
  templates?: Pick<TemplateService, "runtimeName">;
  now?: () => number;
  /** Where the sweep's events go, one JSON line each (default: stderr). */
  log?: (line: string) => void;
}

export interface CreateSessionInput {
  template: string;
  idle_timeout_s?: number | undefined;
  max_lifetime_s?: number | undefined;
  memory_mib?: number | undefined;
}

export interface CellOutcome {
  session: SessionRow;
  record: ExecutionRecord;
  cell: CellResult;
}

export interface CheckpointOutcome {
  session: SessionRow;
  checkpoint: TakenCheckpoint;
}

/** The protocol's execution outcome as an execution record's status. */
const SETTLED_STATUS: Record<
  ExecutionOutcome,
  Exclude<ExecutionRecord["status"], "running" | "aborted">
> = {
  completed: "completed",
  timed_out: "timed_out",
  memory_exceeded: "memory_exceeded",
  output_exceeded: "output_exceeded",
  crashed: "crashed",
  unsupported_syscall: "unsupported_syscall",
  deadlocked: "deadlocked",
  network_exceeded: "network_exceeded",
};

function isSessionEnded(error: unknown): boolean {
  return error instanceof RuntimeError && error.code === "session_ended";
}

function isNotFound(error: unknown): boolean {
  return error instanceof RuntimeError && error.code === "not_found";
}

export class SessionService {
  private readonly billing: BillingBatches;
  private readonly now: () => number;
  private sweeper: NodeJS.Timeout | undefined;
  private readonly log: (line: string) => void;
  /**
   * Sessions whose pause the daemon refused for good while it still runs them, by the activity
   * time of their row then: the sweep leaves them alone until they are used again.
   */
  private readonly unpausable = new Map<string, number>();

  constructor(private readonly deps: SessionServiceDeps) {
    this.billing = new BillingBatches(deps.db, (accountId) => deps.leases.giveBackFree(accountId));
    this.now = deps.now ?? Date.now;
    this.log = deps.log ?? ((line) => console.error(line));
  }

  private event(event: string, fields: Record<string, unknown>): void {
    this.log(
      JSON.stringify({
        time: new Date(this.now()).toISOString(),
        component: "sessions",
        event,
        ...fields,
      }),
    );
  }

  private sessions(): SessionRuntime {
    const runtime = this.deps.runtime();
    if (runtime === undefined) {
      throw new ProblemError(
        "runtime-unavailable",
        "no execution runtime is connected to this gateway; retry later",
        { headers: { "retry-after": "5" } },
      );
    }
    if (runtime.sessions === undefined)
      throw new ProblemError("runtime-unavailable", "the connected runtime keeps no sessions");
    return runtime.sessions;
  }

  /** Accrues; an account found short once more after this gateway's idle lease credits went back to it. */
  private async accrue(id: string, change: SessionChange = {}): Promise<AccrualOutcome> {
    const outcome = await accrue(
      this.deps.db,
      id,
      new Date(this.now()),
      this.deps.settings,
      change,
    );
    if (!outcome.short || !(await this.deps.leases.giveBackFree(outcome.session.accountId)))
      return outcome;
    const rest = await accrue(this.deps.db, id, new Date(this.now()), this.deps.settings);
    return { ...rest, chargedUnits: outcome.chargedUnits + rest.chargedUnits };
  }

  /** The session `id` as `principal` may see it; 404 otherwise (and for deleted ones). */
  async owned(principal: Principal, id: string): Promise<SessionRow> {
    const row = await findSession(this.deps.db, id);
    const visible =
      row !== undefined &&
      row.state !== "deleted" &&
      row.keyId === principal.keyId &&
      (principal.token === null || row.tokenId === principal.token.id);
    if (!visible) throw new ProblemError("not-found", "no such session for this key");
    return row;
  }

  async list(principal: Principal): Promise<SessionRow[]> {
    const rows = await listSessions(this.deps.db, principal.keyId);
    return principal.token === null ? rows : rows.filter((r) => r.tokenId === principal.token?.id);
  }

  /** What the daemon holds of the session (its checkpoints); undefined when it cannot say. */
  async runtimeInfo(row: SessionRow): Promise<SessionInfo | undefined> {
    try {
      return await this.sessions().info(row.id);
    } catch {
      return undefined;
    }
  }

  async create(principal: Principal, input: CreateSessionInput): Promise<SessionRow> {
    const { settings } = this.deps;
    const grant = principal.token;
    // Templates built through the API run executions only; their runtime names are not callers'.
    if (isRuntimeName(input.template))
      throw new ProblemError(
        "unknown-template",
        `no template named "${input.template}" with sessions`,
      );
    if (grant?.templates && !grant.templates.includes(input.template)) {
      throw new ProblemError(
        "template-not-allowed",
        `this token may run ${grant.templates.join(", ")}`,
      );
    }
    const sessions = this.sessions();
    const runtimeTemplate = await this.runtimeTemplate(principal, input.template);
    const id = randomUUID();
    const row = await this.insertWithinLimit({
      id,
      accountId: principal.accountId,
      keyId: principal.keyId,
      tokenId: grant?.id ?? null,
      template: input.template,
      memoryMib: input.memory_mib ?? this.deps.limits.defaultMemoryMb,
      idleTimeoutS: input.idle_timeout_s ?? settings.defaultIdleTimeoutS,
      maxLifetimeS: input.max_lifetime_s ?? settings.defaultMaxLifetimeS,
    });
    try {
      const info = await sessions.create(id, runtimeTemplate, input.memory_mib);
      // Billed for the memory its VM has (the template's size, when the request named none).
      return info.memoryMib === row.memoryMib
        ? row
        : (await this.accrue(id, { memoryMib: info.memoryMib })).session;
    } catch (error) {
      await this.accrue(id, {
        running: false,
        state: "deleted",
        endedReason: "the runtime could not create it",
      });
      if (error instanceof RuntimeError && error.code === "unknown_template") {
        throw new ProblemError(
          "unknown-template",
          `no template named "${input.template}" with sessions`,
        );
      }
      if (error instanceof RuntimeError && error.code === "bad_request")
        throw new ProblemError("validation-failed", error.message);
      throw runtimeProblem(error);
    }
  }

  /**
   * The runtime's name of `template` for the caller's account: a built-in template's own name, or
   * the runtime's name of one built through the API (a session saved as a template among them).
   * A name neither resolves to goes to the runtime as given, which refuses it.
   */
  private async runtimeTemplate(principal: Principal, template: string): Promise<string> {
    const runtime = this.deps.runtime();
    if (this.deps.templates === undefined || runtime === undefined) return template;
    const known = await runtime.templates().catch(() => []);
    return (
      (await this.deps.templates.runtimeName(principal.accountId, template, known)) ?? template
    );
  }

  /** Records a new session, or throws 429 session-limit when its key holds its maximum. */
  private async insertWithinLimit(session: NewSession): Promise<SessionRow> {
    return (await this.insertAllWithinLimit([session]))[0] as SessionRow;
  }

  /** Records the sessions, all or none: 429 session-limit when the key cannot hold them all. */
  private async insertAllWithinLimit(rows: NewSession[]): Promise<SessionRow[]> {
    const { maxSessionsPerKey } = this.deps.settings;
    const inserted = await insertSessionsWithin(
      this.deps.db,
      rows,
      new Date(this.now()),
      maxSessionsPerKey,
    );
    if (inserted !== undefined) return inserted;
    throw new ProblemError(
      "session-limit",
      rows.length === 1
        ? `this key may hold ${maxSessionsPerKey} sessions at once; delete one`
        : `this key may hold ${maxSessionsPerKey} sessions at once, too few for ${rows.length} more; delete some`,
      { extensions: { max_sessions: maxSessionsPerKey } },
    );
  }

  private async checkCheckpointRoom(principal: Principal): Promise<void> {
    const totals = await keySessionTotals(this.deps.db, principal.keyId);
    if (totals.checkpointBytes >= this.deps.settings.maxCheckpointBytesPerKey) {
      throw new ProblemError(
        "checkpoint-quota-exceeded",
        `this key's sessions may hold ${this.deps.settings.maxCheckpointBytesPerKey} bytes of checkpoints`,
        {
          extensions: {
            max_checkpoint_bytes: this.deps.settings.maxCheckpointBytesPerKey,
            checkpoint_bytes: totals.checkpointBytes,
          },
        },
      );
    }
  }

  /**
   * Records what a runtime failure says about the session, then throws the client's problem:
   * `refused` for a request the runtime refused as it is (bad_request; the session runs on).
   */
  private async failed(
    row: SessionRow,
    error: unknown,
    refused: ProblemSlug = "validation-failed",
  ): Promise<never> {
    if (isSessionEnded(error)) {
      await this.accrue(row.id, {
        running: false,
        state: "ended",
        endedReason: error instanceof Error ? error.message : String(error),
      });
      throw new ProblemError(
        "session-ended",
        "the session's VM has ended; fork a new session from one of its checkpoints",
      );
    }
    if (isNotFound(error))
      throw new ProblemError("not-found", error instanceof Error ? error.message : String(error));
    if (error instanceof RuntimeError && error.code === "bad_request")
      throw new ProblemError(refused, error.message);
    throw runtimeProblem(error);
  }

  private requireLive(row: SessionRow): void {
    if (row.state === "ended")
      throw new ProblemError(
        "session-ended",
        `the session has ended: ${row.endedReason ?? "its VM is gone"}`,
      );
  }

  /** Runs `code` as the session's next cell: charged as an execution, and its running time. */
  async execute(
    principal: Principal,
    id: string,
    input: {
      code: string;
      timeout_ms?: number | undefined;
      max_processes?: number | undefined;
      network?: NetworkPolicyInput | undefined;
    },
  ): Promise<CellOutcome> {
    const network = networkGrant(
      principal.network,
      input.network === undefined ? undefined : networkPolicyOf(input.network),
    );
    const row = await this.owned(principal, id);
    this.requireLive(row);
    const price = priceOf(this.deps.pricing, row.template);
    const sessions = this.sessions();
    const releaseSlot = await this.deps.concurrency.acquire(
      principal.keyId,
      principal.limits.maxConcurrency,
    );
    try {
      const executionId = randomUUID();
      const units =
        this.deps.settings.unitsPerCell +
        (network === undefined ? 0 : networkUnits(price, grantedBytes(network)));
      const reservation = await this.billing.reserve({
        executionId,
        accountId: principal.accountId,
        keyId: principal.keyId,
        tokenId: principal.token?.id ?? null,
        idempotencyKey: null,
        requestHash: createHash("sha256").update(`session ${id}\0${input.code}`).digest("hex"),
        template: row.template,
        gatewayId: this.deps.gatewayId,
        units,
      });
      if (reservation.kind === "key-revoked")
        throw new ProblemError(
          "credentials-revoked",
          "the API key behind this credential has been revoked",
        );
      if (reservation.kind !== "reserved") {
        const available =
          reservation.kind === "insufficient-credits" ? reservation.availableUnits : 0;
        throw new ProblemError("insufficient-credits", `a cell needs ${units} units`, {
          extensions: { required_units: units, available_units: available },
        });
      }
      // A paused session resumes for the cell: its running time starts now.
      if (row.state === "paused") await this.accrue(id, { running: true, state: "running" });
      const started = performance.now();
      let cell: CellResult;
      try {
        cell = await sessions.execute(id, input.code, {
          timeoutMs: input.timeout_ms ?? this.deps.limits.defaultTimeoutMs,
          maxProcesses: input.max_processes,
          network,
        });
      } catch (error) {
        await release(this.deps.db, executionId);
        return await this.failed(row, error);
      }
      const e = cell.execution;
      const used = networkUsageOf(e, network !== undefined);
      const record = await this.billing.settle(executionId, {
        status: SETTLED_STATUS[e.outcome],
        exitCode: e.exitCode,
        stdout: e.stdout,
        stderr: e.stderr,
        truncated: e.truncated,
        timings: { ...e.timings, totalMs: performance.now() - started },
        network: used,
        chargedUnits: Math.min(this.deps.settings.unitsPerCell + networkCharge(price, used), units),
      });
      if (used !== null) recordNetwork(this.deps.telemetry.instruments, row.template, used);
      const ended = cell.state === "ended";
      const accrued = await this.accrue(id, {
        cells: 1,
        active: true,
        running: !ended,
        state: ended ? "ended" : "running",
        ...(ended ? { endedReason: `its program stopped (${e.outcome})` } : {}),
      });
      // Out of credits for its running time: it stops running (paused, its state kept).
      const session =
        accrued.short && !ended
          ? await this.pauseRow(accrued.session, "out of credits")
          : accrued.session;
      return { session, record, cell };
    } finally {
      releaseSlot();
    }
  }

  async checkpoint(principal: Principal, id: string): Promise<CheckpointOutcome> {
    const row = await this.owned(principal, id);
    this.requireLive(row);
    await this.checkCheckpointRoom(principal);
    let taken: TakenCheckpoint;
    try {
      taken = await this.sessions().checkpoint(id);
    } catch (error) {
      return this.failed(row, error, "session-not-checkpointable");
    }
    const change: SessionChange = {
      active: true,
      addedCheckpointBytes: taken.fileBytes,
      lastCheckpoint: { number: taken.checkpoint, sha256: taken.sha256 },
    };
    if (row.state === "paused") Object.assign(change, { running: true, state: "running" });
    return { session: (await this.accrue(id, change)).session, checkpoint: taken };
  }

  async pause(principal: Principal, id: string): Promise<CheckpointOutcome> {
    const row = await this.owned(principal, id);
    this.requireLive(row);
    if (row.state !== "paused") await this.checkCheckpointRoom(principal);
    try {
      return await this.pauseChecked(row);
    } catch (error) {
      return this.failed(row, error, "session-not-checkpointable");
    }
  }

  private async pauseChecked(row: SessionRow): Promise<CheckpointOutcome> {
    const taken = await this.sessions().pause(row.id);
    // A session the daemon already had paused wrote nothing: its checkpoints' bytes are read
    // from the daemon rather than added.
    const { checkpointBytes } = await this.sessions().info(row.id);
    const change: SessionChange = {
      running: false,
      state: "paused",
      checkpointBytes,
      lastCheckpoint: { number: taken.checkpoint, sha256: taken.sha256 },
    };
    return { session: (await this.accrue(row.id, change)).session, checkpoint: taken };
  }

  private async pauseRow(row: SessionRow, why: string): Promise<SessionRow> {
    try {
      return (await this.pauseChecked(row)).session;
    } catch (error) {
      const retryable = !(error instanceof RuntimeError) || error.retryable;
      const settled = retryable ? undefined : await this.settleRefused(row).catch(() => undefined);
      this.event("pause_failed", {
        session: row.id,
        why,
        code: error instanceof RuntimeError ? error.code : null,
        retryable,
        error: error instanceof Error ? error.message : String(error),
        settled: settled === undefined ? null : settled.state,
      });
      return settled ?? row;
    }
  }

  /**
   * After a pause refused for good: the row takes the state the daemon holds the session in,
   * once. Paused (it has a checkpoint to resume from) or ended (its checkpoints stay, to fork
   * from) as the daemon says; unknown to the daemon: ended, with no checkpoint left. A session
   * the daemon still runs is left as it is, and skipped by the sweep until it is used again.
   */
  private async settleRefused(row: SessionRow): Promise<SessionRow | undefined> {
    let info: SessionInfo;
    try {
      info = await this.sessions().info(row.id);
    } catch (error) {
      if (!isNotFound(error)) return undefined;
      return (
        await this.accrue(row.id, {
          running: false,
          state: "ended",
          checkpointBytes: 0,
          endedReason: "the runtime no longer has it",
        })
      ).session;
    }
    const last = info.checkpoints.at(-1);
    const lastCheckpoint =
      last === undefined
        ? {}
        : { lastCheckpoint: { number: last.checkpoint, sha256: last.sha256 } };
    if (info.state === "paused") {
      return (
        await this.accrue(row.id, {
          running: false,
          state: "paused",
          checkpointBytes: info.checkpointBytes,
          ...lastCheckpoint,
        })
      ).session;
    }
    if (info.state === "ended") {
      const reason = info.ended ?? "its VM is gone";
      return (
        await this.accrue(row.id, {
          running: false,
          state: "ended",
          checkpointBytes: info.checkpointBytes,
          ...lastCheckpoint,
          endedReason: reason,
        })
      ).session;
    }
    this.unpausable.set(row.id, row.lastActiveAt.getTime());
    return undefined;
  }

  async resume(principal: Principal, id: string): Promise<SessionRow> {
    const row = await this.owned(principal, id);
    this.requireLive(row);
    try {
      await this.sessions().resume(id);
    } catch (error) {
      return this.failed(row, error);
    }
    return (await this.accrue(id, { running: true, state: "running", active: true })).session;
  }

  /**
   * `count` new sessions from checkpoint `checkpoint` of session `id` (default: its last one),
   * all or none: their rows are inserted together within the key's session limit, the runtime
   * forks them at once, and when any fork fails the others are deleted again (charged for the
   * time they ran) before the first failure's problem is thrown.
   */
  async fork(
    principal: Principal,
    id: string,
    checkpoint: number | undefined,
    count = 1,
  ): Promise<SessionRow[]> {
    const source = await this.owned(principal, id);
    const number = checkpoint ?? source.lastCheckpoint;
    if (number === null)
      throw new ProblemError(
        "validation-failed",
        "the session has no checkpoint yet; take one first (POST .../checkpoints)",
      );
    const sessions = this.sessions();
    const rows = await this.insertAllWithinLimit(
      Array.from({ length: count }, () => ({
        id: randomUUID(),
        accountId: principal.accountId,
        keyId: principal.keyId,
        tokenId: principal.token?.id ?? null,
        template: source.template,
        memoryMib: source.memoryMib,
        idleTimeoutS: source.idleTimeoutS,
        maxLifetimeS: source.maxLifetimeS,
      })),
    );
    const forked = await Promise.allSettled(rows.map((row) => sessions.fork(row.id, id, number)));
    const failure = forked.find((outcome) => outcome.status === "rejected");
    if (failure === undefined) return rows;
    await Promise.all(
      rows.map(async (row, i) => {
        const made = forked[i]?.status === "fulfilled";
        if (made && !(await this.deleteForked(row.id))) return;
        await this.accrue(row.id, {
          running: false,
          state: "deleted",
          endedReason: made
            ? "another fork of the same request failed"
            : "the runtime could not fork it",
        });
      }),
    );
    if (isNotFound(failure.reason))
      throw new ProblemError("not-found", `the session has no checkpoint ${number}`);
    throw runtimeProblem(failure.reason);
  }

  /**
   * Deletes a fork made for a request that failed; false when the runtime may still hold it:
   * its row then stays as it is, billed like any session (the idle sweep pauses it).
   */
  private async deleteForked(id: string): Promise<boolean> {
    try {
      await this.sessions().delete(id);
      return true;
    } catch (error) {
      if (isNotFound(error)) return true;
      this.event("fork_cleanup_failed", {
        session: id,
        error: error instanceof Error ? error.message : String(error),
      });
      return false;
    }
  }

  /** Ends the session and removes its checkpoints; charges what it accrued up to now. */
  async delete(principal: Principal, id: string): Promise<SessionRow> {
    const row = await this.owned(principal, id);
    return this.deleteRow(row, "deleted by the client");
  }

  private async deleteRow(row: SessionRow, reason: string): Promise<SessionRow> {
    try {
      await this.sessions().delete(row.id);
    } catch (error) {
      if (!isNotFound(error)) throw runtimeProblem(error);
    }
    return (
      await this.accrue(row.id, {
        running: false,
        state: "deleted",
        checkpointBytes: 0,
        endedReason: reason,
      })
    ).session;
  }

  async writeFile(
    principal: Principal,
    id: string,
    path: string,
    content: Buffer,
  ): Promise<number> {
    return this.fileOperation(principal, id, (sessions) => sessions.writeFile(id, path, content));
  }

  async readFile(principal: Principal, id: string, path: string): Promise<Buffer> {
    return this.fileOperation(principal, id, (sessions) => sessions.readFile(id, path));
  }

  async deleteFile(principal: Principal, id: string, path: string): Promise<void> {
    return this.fileOperation(principal, id, (sessions) => sessions.deleteFile(id, path));
  }

  /**
   * Saves the session's state as the runtime's template `runtimeName` (a paused session is
   * resumed for it, as by any call, and runs on). A program holding what a template cannot
   * carry is 409 session-not-templatable.
   */
  async saveTemplate(row: SessionRow, runtimeName: string): Promise<SavedSessionTemplate> {
    this.requireLive(row);
    const runtime = this.sessions();
    if (runtime.saveTemplate === undefined)
      throw new ProblemError(
        "template-builds-unsupported",
        "this gateway's runtime does not save sessions as templates",
      );
    let saved: SavedSessionTemplate;
    try {
      saved = await runtime.saveTemplate(row.id, runtimeName);
    } catch (error) {
      return this.failed(row, error, "session-not-templatable");
    }
    await this.accrue(
      row.id,
      row.state === "paused" ? { running: true, state: "running", active: true } : { active: true },
    );
    return saved;
  }

  /** A file operation resumes a paused session (the daemon does) and counts as activity. */
  private async fileOperation<T>(
    principal: Principal,
    id: string,
    operation: (sessions: SessionRuntime) => Promise<T>,
  ): Promise<T> {
    const row = await this.owned(principal, id);
    this.requireLive(row);
    let result: T;
    try {
      result = await operation(this.sessions());
    } catch (error) {
      return this.failed(row, error);
    }
    await this.accrue(
      id,
      row.state === "paused" ? { running: true, state: "running", active: true } : { active: true },
    );
    return result;
  }

  /** Starts the sweep (idle pause, lifetime end); `stop` ends it. */
  start(): void {
    if (this.sweeper !== undefined) return;
    this.sweeper = setInterval(
      () =>
        void this.sweep().catch((error: unknown) =>
          this.event("sweep_failed", {
            error: error instanceof Error ? error.message : String(error),
          }),
        ),
      this.deps.settings.sweepIntervalMs,
    );
    this.sweeper.unref();
  }

  stop(): void {
    clearInterval(this.sweeper);
    this.sweeper = undefined;
  }

  /** Pauses the running sessions idle past their timeout and deletes those past their lifetime. */
  async sweep(): Promise<void> {
    if (this.deps.runtime()?.sessions === undefined) return;
    const now = new Date(this.now());
    for (const row of await expiredSessions(this.deps.db, now))
      await this.deleteRow(row, "its max_lifetime_s passed").catch(() => undefined);
    for (const row of await idleRunningSessions(this.deps.db, now)) {
      const refusedAt = this.unpausable.get(row.id);
      if (refusedAt !== undefined && refusedAt === row.lastActiveAt.getTime()) continue;
      this.unpausable.delete(row.id);
      await this.pauseRow(row, "idle");
    }
  }
}
