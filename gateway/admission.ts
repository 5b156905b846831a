// Admission control: how many executions the gateway hands to the runtime at once, and how many
// more it lets wait, per key (its max_concurrency, then SANDFORK_KEY_MAX_QUEUED waiting) and per
// template (the whole service: SANDFORK_TEMPLATE_MAX_RUNNING, then SANDFORK_TEMPLATE_MAX_QUEUED).
// A call past a bound is shed at once, before anything is reserved or billed: 429
// concurrency-limit past its key's line, 503 runtime-busy past its template's, with Retry-After.
// `refuseWhenFull` sheds such a call before its body is validated (a shed answer must cost next
// to nothing: a flood past the bounds sends them as fast as they come back).
import type { AdmissionSettings } from "./config.js";
import type { ConcurrencyLimiter } from "./limits.js";
import { ProblemError } from "./problems.js";
import { type Release, SlotTable } from "./slots.js";
import type { GatewayInstruments } from "./telemetry.js";

/**
 * Why a call was shed (the `reason` of sandfork.admission.shed): past the gateway's key or
 * template line, or refused by the runtime as busy (`runtime_` and the daemon's busy reason, or
 * `runtime_busy` when it gave none, or the runtime client's own line was full).
 */
export type ShedReason = "key_queue_full" | "template_queue_full" | `runtime_${string}`;

/** Weight of the newest run in a template's mean run time (for Retry-After). */
const RUN_TIME_WEIGHT = 0.1;
/** The longest Retry-After the service answers. */
const MAX_RETRY_AFTER_SECONDS = 60;

export class Admission {
  private readonly templates = new SlotTable();
  /** Exponentially weighted mean time a template's executions hold their slot, ms. */
  private readonly runMs = new Map<string, number>();
  /** Templates ever admitted (the runtime's, a small set): their depths read 0 when idle. */
  private readonly seen = new Set<string>();

  constructor(
    private readonly settings: AdmissionSettings,
    private readonly keys: ConcurrencyLimiter,
    private readonly instruments: Pick<GatewayInstruments, "shedCalls" | "admissionDepths">,
    private readonly shutdownSignal: AbortSignal,
  ) {
    instruments.admissionDepths.read = () => ({
      templates: [...this.seen].map((template) => ({
        template,
        running: this.templates.running(template),
        queued: this.templates.queued(template),
      })),
      keysQueued: this.keys.queued(),
    });
  }

  /**
   * Admits one execution of `template` for `keyId` (which may run `keyMax` at once): resolves,
   * possibly after a wait in line, with the function that gives its slots back, or throws the
   * problem that sheds it.
   */
  async admit(keyId: string, keyMax: number, template: string): Promise<Release> {
    const keySlot = await this.waitOrShed(
      this.keys
        .admit(keyId, keyMax, this.settings.keyMaxQueued, this.shutdownSignal)
        .catch((error: unknown) => {
          if (error instanceof ProblemError)
            this.instruments.shedCalls.add(1, { reason: "key_queue_full" });
          throw error;
        }),
    );
    let templateSlot: Release;
    try {
      this.seen.add(template);
      const { templateMaxRunning, templateMaxQueued } = this.settings;
      const taken = this.templates.take(
        template,
        templateMaxRunning,
        templateMaxQueued,
        this.shutdownSignal,
      );
      if (taken === undefined) throw this.templateFull(template);
      templateSlot = await this.waitOrShed(Promise.resolve(taken));
    } catch (error) {
      keySlot();
      throw error;
    }
    const started = performance.now();
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.noteRunTime(template, performance.now() - started);
      templateSlot();
      keySlot();
    };
  }

  /**
   * Throws the problem that sheds a call of `keyId` now, when its key's line or its template's is
   * full: what `admit` would throw, without waiting for the body's validation. `templateOf` reads
   * the call's template (undefined: not readable, left to validation); it is asked only while
   * some template's line is full.
   */
  async refuseWhenFull(
    keyId: string,
    keyMax: number,
    templateOf: () => Promise<string | undefined>,
  ): Promise<void> {
    const refused = this.keys.refusal(keyId, keyMax, this.settings.keyMaxQueued);
    if (refused !== undefined) {
      this.instruments.shedCalls.add(1, { reason: "key_queue_full" });
      throw refused;
    }
    if (!this.someTemplateFull()) return;
    const template = await templateOf();
    if (template !== undefined && this.templateLineFull(template))
      throw this.templateFull(template);
  }

  /** Counts a call the runtime itself refused as busy, with the daemon's reason (its lines, or its client's). */
  shedByRuntime(daemonReason: string | undefined): void {
    const reason: ShedReason =
      daemonReason === undefined ? "runtime_busy" : `runtime_${daemonReason}`;
    this.instruments.shedCalls.add(1, { reason });
  }

  /** A wait in line that the gateway's shutdown ends answers 503 runtime-unavailable. */
  private async waitOrShed(wait: Promise<Release>): Promise<Release> {
    try {
      return await wait;
    } catch (error) {
      if (error instanceof ProblemError) throw error;
      throw new ProblemError("runtime-unavailable", "the gateway is shutting down; retry later", {
        headers: { "retry-after": "5" },
      });
    }
  }

  private templateLineFull(template: string): boolean {
    const { templateMaxRunning, templateMaxQueued } = this.settings;
    return this.templates.lineFull(template, templateMaxRunning, templateMaxQueued);
  }

  private someTemplateFull(): boolean {
    for (const template of this.seen) if (this.templateLineFull(template)) return true;
    return false;
  }

  /** Counts a call shed past `template`'s line, and the problem that answers it. */
  private templateFull(template: string): ProblemError {
    this.instruments.shedCalls.add(1, { reason: "template_queue_full" });
    const { templateMaxRunning, templateMaxQueued } = this.settings;
    const seconds = this.retryAfterSeconds(template);
    return new ProblemError(
      "runtime-busy",
      `${templateMaxRunning} executions of ${template} run at once and ${templateMaxQueued} more wait; retry in ${seconds} s`,
      {
        headers: { "retry-after": String(seconds) },
        extensions: { retry_after_seconds: seconds },
      },
    );
  }

  private noteRunTime(template: string, ms: number): void {
    const before = this.runMs.get(template);
    this.runMs.set(template, before === undefined ? ms : before + RUN_TIME_WEIGHT * (ms - before));
  }

  /** About when a new call would find room: the line ahead of it served at the recent pace; at least 1 s. */
  private retryAfterSeconds(template: string): number {
    const runMs = this.runMs.get(template) ?? 1_000;
    const waitMs =
      ((this.templates.queued(template) + 1) * runMs) / this.settings.templateMaxRunning;
    return Math.min(MAX_RETRY_AFTER_SECONDS, Math.max(1, Math.ceil(waitMs / 1000)));
  }
}
