// One execution, end to end, around the ExecutionRuntime boundary:
// template allowed for a token → runtime present? → template known → token cap → admission (a slot
// of the key and of the template, or a bounded wait for them; past the bound shed at once) → hold the worst-case cost → execute → bill the actual cost (durable before the answer).
// An execution nobody can see before it ends (no Idempotency-Key, not streamed) holds its cost of
// this gateway's credit lease in memory and is billed with ONE statement that writes its record
// (CreditLeases); one with an Idempotency-Key or a streamed one is reserved in the database first
// (its record claims the key, or its id is announced, before it runs: a duplicate replays there)
// and settled after: two round trips. On embedded PGlite, which one gateway owns, a key is claimed
// in memory instead (IdempotencyClaims), and only a streamed execution is reserved. Each statement
// is shared with the executions that reserve, settle or record at the same time (group commit).
// Nothing is charged unless the runtime reports an end of the program.
import { createHash, randomUUID } from "node:crypto";
import {
  BillingBatches,
  type ExecutionRecord,
  findByIdempotencyKey,
  type Reservation,
  type ReserveOutcome,
  release,
  type Settlement,
} from "../db/billing.js";
import type { Database } from "../db/client.js";
import type { NetworkPolicy } from "../db/keys.js";
import { journalOf } from "../db/record-journal.js";
import { RuntimeBusyError, RuntimeUnavailableError } from "../runtime/errors.js";
import type {
  ExecutionRequest,
  ExecutionResult,
  ExecutionRuntime,
  NetworkUsage,
  OutputChunk,
  Template,
} from "../runtime/execution-runtime.js";
import { executeFrame } from "../runtime/protocol.js";
import type { Admission } from "./admission.js";
import type { Principal } from "./auth/principal.js";
import type { ExecutionLimits } from "./config.js";
import type { CreditLeases, HoldOutcome } from "./credit-leases.js";
import {
  type ExecutionInput,
  type NormalizedRequest,
  normalizeExecution,
} from "./execution-request.js";
import { filesProblems } from "./file-paths.js";
import { IdempotencyClaims } from "./idempotency-claims.js";
import type { TokenExecutionCounter } from "./limits.js";
import { grantedBytes, networkGrant, networkPolicyOf } from "./network-policy.js";
import type { OutputFileJson, OutputFiles } from "./output-files.js";
import { costUnits, networkUnits, type Pricing, priceOf, type TemplatePrice } from "./pricing.js";
import { ProblemError } from "./problems.js";
import { type CheckedResult, checkedResults } from "./rich-results.js";
import { inSpan, recordNetwork, type Telemetry } from "./telemetry.js";
import { isRuntimeName, type TemplateService } from "./template-service.js";

export type { ExecutionInput } from "./execution-request.js";

/** A run's network usage as its record keeps it: null when it was granted no network. */
export function networkUsageOf(result: ExecutionResult, granted: boolean): NetworkUsage | null {
  if (!granted) return null;
  return (
    result.usage?.network ?? { bytesIn: 0, bytesOut: 0, connections: 0, refused: 0, dnsQueries: 0 }
  );
}

/** The units a run's network bytes cost (none without a grant). */
export function networkCharge(price: TemplatePrice, network: NetworkUsage | null): number {
  return network === null ? 0 : networkUnits(price, network.bytesIn + network.bytesOut);
}

/**
 * What an execution that ran is billed as. Billed time is what the VM existed for the request:
 * fork plus run, never past its timeout; network bytes are billed as received and sent; the
 * charge never exceeds what it held.
 */
export function settlementOf(
  result: ExecutionResult,
  billing: {
    price: TemplatePrice;
    reservedUnits: number;
    timeoutMs: number;
    totalMs: number;
    networkGranted: boolean;
  },
): Settlement {
  const billedMs = Math.min(result.timings.forkMs + result.timings.execMs, billing.timeoutMs);
  const network = networkUsageOf(result, billing.networkGranted);
  return {
    status: result.outcome,
    exitCode: result.exitCode,
    stdout: result.stdout,
    stderr: result.stderr,
    truncated: result.truncated,
    timings: { ...result.timings, totalMs: billing.totalMs },
    network,
    chargedUnits: Math.min(
      costUnits(billing.price, billedMs) + networkCharge(billing.price, network),
      billing.reservedUnits,
    ),
  };
}

/** Watches one execution while it runs (a streamed POST /v1/executions). */
export interface LiveExecution {
  /** Reserved and handed to the runtime: from now on the result is a settled record. */
  onStart?(executionId: string): void;
  /** The program's output as it writes it, all of it before the execution resolves. */
  onOutput?(chunk: OutputChunk): void;
}

/** What a run produced beside its record: its rich results and the files it left. */
export interface ExecutionOutput {
  /** Absent on a replay: results are not kept. */
  results?: CheckedResult[];
  files: OutputFileJson[];
}

export interface ExecutionOutcome {
  record: ExecutionRecord;
  /** True when this answers a retry with the first request's stored result. */
  replayed: boolean;
  /** The run's results and files; a replay has only the files still kept. */
  output: ExecutionOutput;
}

export interface ExecutionServiceDeps {
  db: Database;
  /** Recorded on each reservation: the recovery pass at start releases those of dead gateways. */
  gatewayId: string;
  leases: CreditLeases;
  /** Undefined until a runtime (the daemon client) is connected. */
  runtime: () => ExecutionRuntime | undefined;
  /** Resolves the names of templates built through the API (template-service.ts). */
  templates: Pick<TemplateService, "runtimeName">;
  pricing: Pricing;
  limits: ExecutionLimits;
  /** Slots per key and per template, and the bounded lines for them. */
  admission: Admission;
  tokenExecutions: TokenExecutionCounter;
  telemetry: Telemetry;
  /** Aborts in-flight executions when the gateway shuts down. */
  shutdownSignal: AbortSignal;
  /** Extra time the runtime gets past the program's own timeout before the gateway gives up on it. */
  runtimeGraceMs: number;
  /** Where the files a run leaves under /work/out are kept. */
  outputFiles: OutputFiles;
}

/** How an execution is billed, fixed before it runs. */
interface Billing {
  /** What reserving it in the database writes, or what it holds of the lease. */
  reservation: Reservation;
  price: TemplatePrice;
  /** This gateway claimed its Idempotency-Key in memory (IdempotencyClaims): the database need not. */
  claimed: boolean;
}

/**
 * A request whose language is resolved against its template, and the runtime's name of that
 * template (a template built through the API is served under another name than the caller's).
 */
type ResolvedRequest = Omit<ExecutionRequest, "executionId"> & { runtimeTemplate: string };

/**
 * SHA-256 over a canonical JSON form (sorted keys), so key order in the body does not matter;
 * with the call's own network request (not its key's policy, which an admin may change).
 */
export function requestHash(request: NormalizedRequest, network?: NetworkPolicy): string {
  const canonical = (value: unknown): unknown => {
    if (Array.isArray(value)) return value.map(canonical);
    if (typeof value === "object" && value !== null) {
      return Object.fromEntries(
        Object.keys(value)
          .sort()
          .map((k) => [k, canonical((value as Record<string, unknown>)[k])]),
      );
    }
    return value;
  };
  return createHash("sha256")
    .update(JSON.stringify(canonical(network === undefined ? request : { ...request, network })))
    .digest("hex");
}

/** A failure of the runtime itself (errors.ts) as the problem the client sees; nothing was billed. */
export function runtimeProblem(error: unknown): ProblemError {
  if (error instanceof RuntimeUnavailableError) {
    return new ProblemError("runtime-unavailable", error.message, {
      headers: { "retry-after": "5" },
    });
  }
  if (error instanceof RuntimeBusyError) {
    // The daemon's line for this key is full: the caller's own share, as the gateway's key line.
    const slug = error.reason === "key_queue_full" ? "concurrency-limit" : "runtime-busy";
    return new ProblemError(slug, error.message, {
      headers: { "retry-after": "1" },
      extensions: { retry_after_seconds: 1 },
    });
  }
  return new ProblemError("runtime-failed", error instanceof Error ? error.message : String(error));
}

/**
 * The checks of the files that need the script's name (argv[0], which the language decides, as
 * the daemon's execute frame is built): a file may be neither the script nor hold it.
 */
function refuseCollidingFiles(request: ResolvedRequest): void {
  const [script] = executeFrame({ ...request, executionId: "", files: [] }).argv as string[];
  const problems = filesProblems(request.files, script);
  if (problems.length === 0) return;
  throw new ProblemError("validation-failed", "the request body does not match the schema", {
    extensions: {
      errors: problems.map((p) => ({ path: ["files", ...p.at].join("."), message: p.message })),
    },
  });
}

/** The runtime's templates; its failure becomes the problem the client sees. */
function templatesOf(runtime: ExecutionRuntime): Promise<Template[]> {
  return runtime.templates().catch((error: unknown) => {
    throw runtimeProblem(error);
  });
}

export class ExecutionService {
  private readonly billing: BillingBatches;
  /** Embedded PGlite's: Idempotency-Keys claimed in memory. */
  private readonly claims: IdempotencyClaims | undefined;
  /** The abort controllers of the executions in flight, which the gateway's shutdown aborts. */
  private readonly inFlight = new Set<AbortController>();

  constructor(private readonly deps: ExecutionServiceDeps) {
    this.billing = new BillingBatches(deps.db, (accountId) => deps.leases.giveBackFree(accountId));
    const journal = journalOf(deps.db);
    this.claims = journal === undefined ? undefined : new IdempotencyClaims(deps.db, journal);
    deps.shutdownSignal.addEventListener("abort", () => {
      for (const run of this.inFlight) run.abort(deps.shutdownSignal.reason);
    });
  }

  /**
   * Runs one execution with a signal that aborts at shutdown or when the runtime overstays the
   * program's timeout by runtimeGraceMs (a backstop: the runtime enforces the timeout itself).
   * One controller and one timer: AbortSignal.any and AbortSignal.timeout cost several times that
   * per request.
   */
  private async runAbortable(
    runtime: ExecutionRuntime,
    request: ExecutionRequest,
    onOutput: LiveExecution["onOutput"],
  ): Promise<ExecutionResult> {
    this.deps.shutdownSignal.throwIfAborted();
    const run = new AbortController();
    this.inFlight.add(run);
    const overstayed = setTimeout(
      () =>
        run.abort(
          new DOMException(
            "the runtime did not answer within the execution's timeout",
            "TimeoutError",
          ),
        ),
      request.timeoutMs + this.deps.runtimeGraceMs,
    );
    try {
      return await runtime.execute(request, run.signal, onOutput);
    } finally {
      clearTimeout(overstayed);
      this.inFlight.delete(run);
    }
  }

  /** Sheds a call of `principal` at once when its key's line or its template's is full (Admission). */
  refuseWhenFull(
    principal: Principal,
    templateOf: () => Promise<string | undefined>,
  ): Promise<void> {
    return this.deps.admission.refuseWhenFull(
      principal.keyId,
      principal.limits.maxConcurrency,
      templateOf,
    );
  }

  /** The runtime's built-in templates (those built through the API are the account's: template-service.ts). */
  async templates(): Promise<Template[]> {
    return (await templatesOf(this.requireRuntime())).filter((t) => !isRuntimeName(t.name));
  }

  /**
   * Runs `input` for `principal`, billed to its key. `live` watches it while it runs; a replayed
   * Idempotency-Key answers with the stored record and never starts.
   */
  async execute(
    principal: Principal,
    input: ExecutionInput,
    idempotencyKey: string | null,
    live: LiveExecution = {},
  ): Promise<ExecutionOutcome> {
    const request = normalizeExecution(input, this.deps.limits);
    const asked = input.network === undefined ? undefined : networkPolicyOf(input.network);
    const network = networkGrant(principal.network, asked);
    const grant = principal.token;
    if (grant?.templates && !grant.templates.includes(request.template)) {
      throw new ProblemError(
        "template-not-allowed",
        `this token may run ${grant.templates.join(", ")}`,
      );
    }

    let runtime: ExecutionRuntime;
    let releaseSlot: () => void;
    let resolved: ResolvedRequest;
    try {
      runtime = this.requireRuntime();
      const known = await templatesOf(runtime);
      const runtimeTemplate = await this.deps.templates.runtimeName(
        principal.accountId,
        request.template,
        known,
      );
      const template = known.find((t) => t.name === runtimeTemplate);
      if (runtimeTemplate === undefined || template === undefined) {
        throw new ProblemError("unknown-template", `no template named "${request.template}"`, {
          extensions: {
            templates: known.map((t) => t.name).filter((name) => !isRuntimeName(name)),
          },
        });
      }
      if (request.language !== undefined && !template.languages.includes(request.language)) {
        throw new ProblemError(
          "unknown-language",
          `template "${template.name}" runs ${template.languages.join(", ")}, not ${request.language}`,
          {
            extensions: { languages: template.languages },
          },
        );
      }
      resolved = {
        ...request,
        runtimeTemplate,
        language: request.language ?? template.languages[0] ?? template.language,
        network,
      };
      if (resolved.files.length > 0) refuseCollidingFiles(resolved);
      if (grant?.maxExecutions != null)
        this.deps.tokenExecutions.consume(grant.id, grant.maxExecutions, grant.expiresAt);
      try {
        releaseSlot = await this.deps.admission.admit(
          principal.keyId,
          principal.limits.maxConcurrency,
          resolved.template,
        );
      } catch (error) {
        if (grant?.maxExecutions != null) this.deps.tokenExecutions.refund(grant.id);
        throw error;
      }
    } catch (error) {
      // A retry refused before it reaches the database (no runtime, an unknown template, a limit)
      // still gets its first request's result. Other retries find it in reserve, at no extra cost.
      const first =
        idempotencyKey === null
          ? undefined
          : await findByIdempotencyKey(this.deps.db, principal.keyId, idempotencyKey);
      if (first !== undefined) return this.replay(principal, first, requestHash(request, asked));
      throw error;
    }
    const hash = requestHash(request, asked);

    try {
      const outcome = await this.claimAndRun(
        runtime,
        principal,
        resolved,
        hash,
        idempotencyKey,
        live,
      );
      if (outcome.replayed && grant?.maxExecutions != null)
        this.deps.tokenExecutions.refund(grant.id);
      return outcome;
    } catch (error) {
      if (grant?.maxExecutions != null) this.deps.tokenExecutions.refund(grant.id);
      throw error;
    } finally {
      releaseSlot();
    }
  }

  private requireRuntime(): ExecutionRuntime {
    const runtime = this.deps.runtime();
    if (runtime === undefined) {
      throw new ProblemError(
        "runtime-unavailable",
        "no execution runtime is connected to this gateway; retry later",
        {
          headers: { "retry-after": "5" },
        },
      );
    }
    return runtime;
  }

  /** A retry's answer: the first request's record, and the files it left that are still kept. */
  private async replay(
    principal: Principal,
    existing: ExecutionRecord,
    hash: string,
  ): Promise<ExecutionOutcome> {
    // A token only ever sees its own executions, even through another caller's Idempotency-Key.
    if (existing.requestHash !== hash || existing.tokenId !== (principal.token?.id ?? null)) {
      throw new ProblemError(
        "idempotency-key-reused",
        "this Idempotency-Key was first used with a different request",
      );
    }
    if (existing.status === "running") {
      throw new ProblemError(
        "idempotency-conflict",
        "the first request with this Idempotency-Key is still running",
        {
          headers: { "retry-after": "1" },
        },
      );
    }
    const files = await this.deps.outputFiles.list(existing.id);
    return { record: existing, replayed: true, output: { files } };
  }

  /**
   * On embedded PGlite a request with an Idempotency-Key first claims it in memory
   * (gateway/idempotency-claims.ts): a duplicate replays there, and the execution is leased and
   * journaled like one without a key, unless it is streamed.
   */
  private async claimAndRun(
    runtime: ExecutionRuntime,
    principal: Principal,
    request: ResolvedRequest,
    hash: string,
    idempotencyKey: string | null,
    live: LiveExecution,
  ): Promise<ExecutionOutcome> {
    const price = priceOf(this.deps.pricing, request.template);
    const reservation: Reservation = {
      executionId: randomUUID(),
      accountId: principal.accountId,
      keyId: principal.keyId,
      tokenId: principal.token?.id ?? null,
      idempotencyKey,
      requestHash: hash,
      template: request.template,
      gatewayId: this.deps.gatewayId,
      units:
        costUnits(price, request.timeoutMs) +
        (request.network === undefined ? 0 : networkUnits(price, grantedBytes(request.network))),
    };
    if (idempotencyKey === null || this.claims === undefined)
      return this.reserveAndRun(
        runtime,
        principal,
        request,
        { reservation, price, claimed: false },
        live,
      );
    const claim = await this.claims.claim({ ...reservation, idempotencyKey });
    if (claim.kind === "existing") return this.replay(principal, claim.record, hash);
    try {
      return await this.reserveAndRun(
        runtime,
        principal,
        request,
        { reservation, price, claimed: true },
        live,
      );
    } finally {
      claim.release();
    }
  }

  private async reserveAndRun(
    runtime: ExecutionRuntime,
    principal: Principal,
    request: ResolvedRequest,
    { reservation, price, claimed }: Billing,
    live: LiveExecution,
  ): Promise<ExecutionOutcome> {
    const { tracer, instruments } = this.deps.telemetry;
    const { executionId, units: reservedUnits, requestHash: hash, idempotencyKey } = reservation;

    // The record of an execution nobody can see before it ends need not exist before it does; nor
    // need one whose Idempotency-Key this gateway claimed in memory.
    const leased = (idempotencyKey === null || claimed) && live.onStart === undefined;
    const reserved = await inSpan(
      tracer,
      "billing.reserve",
      (span): Promise<HoldOutcome | ReserveOutcome> => {
        span.setAttributes({
          "sandfork.execution.id": executionId,
          "sandfork.billing.reserved_units": reservedUnits,
          "sandfork.billing.leased": leased,
        });
        if (leased)
          return this.deps.leases.hold(principal.accountId, principal.keyId, reservedUnits);
        return this.billing.reserve(reservation);
      },
    );
    if (reserved.kind === "duplicate") return this.replay(principal, reserved.existing, hash);
    if (reserved.kind === "key-revoked")
      throw new ProblemError(
        "credentials-revoked",
        "the API key behind this credential has been revoked",
      );
    if (reserved.kind === "insufficient-credits") {
      throw new ProblemError(
        "insufficient-credits",
        `this execution needs up to ${reservedUnits} ${this.deps.pricing.unitName}s`,
        {
          extensions: { required_units: reservedUnits, available_units: reserved.availableUnits },
        },
      );
    }

    const started = performance.now();
    const startedAt = Date.now();
    const { runtimeTemplate, ...toRun } = request;
    let result: ExecutionResult;
    try {
      live.onStart?.(executionId);
      // The round trip to the runtime, with the phases the runtime reports as its children.
      result = await inSpan(tracer, "runtime.execute", async () => {
        const ran = await this.runAbortable(
          runtime,
          { executionId, keyId: principal.keyId, ...toRun, template: runtimeTemplate },
          live.onOutput,
        );
        this.recordRuntimePhases(ran, startedAt);
        return ran;
      });
    } catch (error) {
      if (leased) this.deps.leases.drop(principal.accountId, reservedUnits);
      else await release(this.deps.db, executionId);
      instruments.executions.add(1, { template: request.template, status: "aborted" });
      if (error instanceof RuntimeBusyError) this.deps.admission.shedByRuntime(error.reason);
      throw runtimeProblem(error);
    }
    const settlement = settlementOf(result, {
      price,
      reservedUnits,
      timeoutMs: request.timeoutMs,
      totalMs: performance.now() - started,
      networkGranted: request.network !== undefined,
    });
    const { chargedUnits } = settlement;
    const record = await inSpan(tracer, "billing.settle", (span) => {
      span.setAttributes({
        "sandfork.execution.id": executionId,
        "sandfork.billing.charged_units": chargedUnits,
      });
      if (!leased) return this.billing.settle(executionId, settlement);
      const { units: _, ...identity } = reservation;
      return this.deps.leases.record({
        ...identity,
        reservedUnits,
        // When it started to run, as a reserved record's created_at is when it was reserved.
        createdAt: new Date(startedAt),
        settlement,
      });
    });
    instruments.executions.add(1, { template: request.template, status: result.outcome });
    instruments.executionDuration.record(settlement.timings.totalMs / 1000, {
      template: request.template,
      status: result.outcome,
    });
    instruments.billedUnits.add(record.chargedUnits ?? 0, { template: request.template });
    if (settlement.network !== null)
      recordNetwork(instruments, request.template, settlement.network);
    const files =
      result.files === undefined || result.files.length === 0
        ? []
        : await this.deps.outputFiles.keep(principal, executionId, result.files);
    return {
      record,
      replayed: false,
      output: { results: checkedResults(result.results ?? []), files },
    };
  }

  /** The runtime reports its phases as durations; they become child spans laid end to end. */
  private recordRuntimePhases(result: ExecutionResult, startedAt: number): void {
    const { tracer } = this.deps.telemetry;
    let at = startedAt;
    for (const [name, ms] of [
      ["queue", result.timings.queueMs],
      ["fork", result.timings.forkMs],
      ["exec", result.timings.execMs],
    ] as const) {
      const span = tracer.startSpan(name, { startTime: at });
      at += ms;
      span.end(at);
    }
  }
}
