// The client of `sandfork-vmm serve` (native-vmm/PROTOCOL.md) and the gateway's ExecutionRuntime.
//
// A pool of N connections; each request goes to the connection with the fewest requests in
// flight, up to a per-connection bound (the daemon queues executions beyond its own concurrency,
// and reports that wait as queue_us). Beyond that bound, requests wait in a bounded FIFO queue;
// beyond the queue's bound they are refused at once with RuntimeQueueFullError (retryable) rather than buffered
// without limit. Every request has a deadline and may be aborted: protocol v1 has no way to
// cancel a request, so the caller stops waiting, the request keeps its place in the bounds until
// the daemon answers, and that answer is dropped. An execution's outcome is the daemon's to
// decide (its deadline ends the program): past the program's time limit and a grace the client
// asks the daemon whether it is alive (a `health` probe on the request's connection) and keeps
// waiting while it answers, up to a generous bound; a daemon that does not answer its probe is
// given up on. A daemon that is gone closes its connections, which fails their requests at once.
// A lost connection fails its requests in flight
// with RuntimeConnectionLostError (retryable) and is reopened with backoff; with no connection
// open, requests fail at once with RuntimeUnavailableError.
import { DaemonConnection } from "./daemon-connection.js";
import { type DaemonEndpoint, unixEndpoint } from "./daemon-endpoint.js";
import {
  RuntimeConnectionLostError,
  RuntimeQueueFullError,
  RuntimeTimeoutError,
  RuntimeUnavailableError,
} from "./errors.js";
import type {
  ExecutionRequest,
  ExecutionResult,
  ExecutionRuntime,
  OutputChunk,
  RuntimeAdmission,
  RuntimeHealth,
  Template,
  TemplateBuilds,
} from "./execution-runtime.js";
import type { FrameObject } from "./frames.js";
import {
  type DaemonHealth,
  type DaemonStats,
  executeFrame,
  parseExecution,
  parseHealth,
  parseOutput,
  parseStats,
  parseTemplates,
  type RequestType,
} from "./protocol.js";
import { DaemonSessions } from "./session-runtime.js";

export interface DaemonClientOptions {
  /** The daemon's Unix socket; or `endpoint`, which wins when both are given. */
  socketPath?: string;
  endpoint?: DaemonEndpoint;
  /** Connections in the pool. */
  connections?: number;
  /** Requests in flight on one connection before new ones queue. */
  maxInFlightPerConnection?: number;
  /** Requests waiting for a connection with room before new ones are refused. */
  maxQueued?: number;
  /** Deadline of list_templates, health and stats requests. */
  requestTimeoutMs?: number;
  /**
   * How long past its own time limit an execute waits for its answer before the client probes
   * the daemon's liveness, and the time between probes while the daemon answers them.
   */
  executeGraceMs?: number;
  /** The most an execute waits past its own time limit, however alive the daemon is. */
  executeMaxWaitMs?: number;
  connectTimeoutMs?: number;
  /** How long a list_templates answer is reused. */
  templatesTtlMs?: number;
  /** Reconnect backoff: first delay, doubled per failure up to the maximum. */
  reconnectMinMs?: number;
  reconnectMaxMs?: number;
  log?: (line: string) => void;
}

export interface RequestOptions {
  signal?: AbortSignal | undefined;
  timeoutMs?: number | undefined;
  /**
   * Past `timeoutMs`, keep waiting while the daemon answers a liveness probe (one every
   * `intervalMs`), up to `maxWaitMs` from the request's start. Without it `timeoutMs` is final.
   */
  liveness?: { maxWaitMs: number; intervalMs: number } | undefined;
  /** Gets the request's `output` frames (a streamed execute) as they arrive, until it is answered or given up. */
  onOutput?: ((frame: FrameObject) => void) | undefined;
}

export interface DaemonClientStatus {
  connected: number;
  inFlight: number;
  queued: number;
  /** Requests sent on each pool slot since the client started (across reconnects). */
  sentPerConnection: number[];
}

interface Slot {
  connection: DaemonConnection | null;
  connecting: boolean;
  retryTimer: NodeJS.Timeout | undefined;
  backoffMs: number;
  sent: number;
}

/** One request from submission to answer. */
interface Job {
  type: RequestType;
  fields: FrameObject;
  resolve(frame: FrameObject): void;
  reject(error: Error): void;
  output?(frame: FrameObject): void;
  /** Set once sent: where, so that a caller giving up can abandon it there. */
  sentOn?: { connection: DaemonConnection; id: number };
}

const DEFAULTS = {
  connections: 4,
  maxInFlightPerConnection: 32,
  maxQueued: 256,
  requestTimeoutMs: 5_000,
  executeGraceMs: 5_000,
  executeMaxWaitMs: 600_000,
  connectTimeoutMs: 2_000,
  // A daemon's list is fixed for its life, and a new daemon is a reconnect, which refreshes it: the
  // lifetime only bounds how stale a list can be, and a short one put a refresh beside calls
  // seconds apart.
  templatesTtlMs: 60_000,
  reconnectMinMs: 50,
  reconnectMaxMs: 2_000,
};

function abortReason(signal: AbortSignal): Error {
  return signal.reason instanceof Error
    ? signal.reason
    : new DOMException("the request was aborted", "AbortError");
}

export class DaemonClient implements ExecutionRuntime {
  private readonly endpoint: DaemonEndpoint;
  private readonly options: typeof DEFAULTS;
  private readonly log: (line: string) => void;
  private readonly slots: Slot[];
  private readonly queue: Job[] = [];
  private readonly connectedWaiters = new Set<() => void>();
  /** Where the least-loaded search starts, rotated so that ties spread over the pool. */
  private cursor = 0;
  private closed = false;
  private server: string | undefined;
  private templateCache: { at: number; templates: Promise<Template[]> } | undefined;
  /** The last list the daemon answered since the connection came up: served while a refresh is on its way. */
  private lastTemplates: Template[] | undefined;
  /** Per connection: the liveness probe in flight, or when the last one was answered. */
  private readonly probes = new WeakMap<
    DaemonConnection,
    { answeredAt: number; inFlight: Promise<boolean> | undefined }
  >();
  /** Set where this client's daemon is the one the runtime started (start.ts). */
  templateBuilds: TemplateBuilds | undefined = undefined;
  /**
   * Session requests over this client's connections (the daemon must run with --sessions). A
   * session saved as a template is a template more: the cached list is read again.
   */
  readonly sessions = new DaemonSessions(
    (type, fields, options) =>
      this.request(
        type,
        fields,
        type === "session_execute" && options?.timeoutMs !== undefined
          ? { ...options, liveness: this.executeLiveness(options.timeoutMs) }
          : options,
      ),
    undefined,
    async () => {
      this.replaceTemplates(parseTemplates(await this.request("list_templates", {})));
    },
  );

  constructor(options: DaemonClientOptions) {
    const endpoint =
      options.endpoint ??
      (options.socketPath === undefined ? undefined : unixEndpoint(options.socketPath));
    if (endpoint === undefined) throw new RangeError("DaemonClient: a socketPath or an endpoint");
    this.endpoint = endpoint;
    const settings = { ...DEFAULTS };
    for (const name of Object.keys(DEFAULTS) as (keyof typeof DEFAULTS)[]) {
      const value = options[name] ?? DEFAULTS[name];
      const least = name === "maxQueued" ? 0 : 1;
      if (!Number.isSafeInteger(value) || value < least)
        throw new RangeError(`DaemonClient: ${name} must be an integer ≥ ${least}, got ${value}`);
      settings[name] = value;
    }
    this.options = settings;
    this.log = options.log ?? (() => {});
    this.slots = Array.from({ length: this.options.connections }, () => ({
      connection: null,
      connecting: false,
      retryTimer: undefined,
      backoffMs: this.options.reconnectMinMs,
      sent: 0,
    }));
  }

  /**
   * Opens the pool's connections. Resolves once at least one is up; rejects with
   * RuntimeUnavailableError when none can be opened (the client keeps retrying in the background).
   */
  async connect(): Promise<void> {
    const idle = this.slots.filter((slot) => slot.connection === null && !slot.connecting);
    const attempts = idle.map((slot) => {
      clearTimeout(slot.retryTimer);
      return this.openSlot(slot);
    });
    const results = await Promise.allSettled(attempts);
    if (this.connectedCount() === 0) {
      const failure = results.find((r): r is PromiseRejectedResult => r.status === "rejected");
      throw failure?.reason instanceof Error
        ? failure.reason
        : new RuntimeUnavailableError(`cannot connect to sandfork-vmm at ${this.endpoint.label}`);
    }
  }

  /** Resolves when at least one connection is up; rejects with RuntimeUnavailableError after `timeoutMs`. */
  waitUntilConnected(timeoutMs: number): Promise<void> {
    if (this.connectedCount() > 0) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const done = () => {
        clearTimeout(timer);
        this.connectedWaiters.delete(done);
        resolve();
      };
      const timer = setTimeout(() => {
        this.connectedWaiters.delete(done);
        reject(
          new RuntimeUnavailableError(
            `not connected to sandfork-vmm at ${this.endpoint.label} after ${timeoutMs} ms`,
          ),
        );
      }, timeoutMs);
      this.connectedWaiters.add(done);
    });
  }

  /** Reopens every closed connection now, skipping the backoff (e.g. after the daemon restarted). */
  reconnectNow(): void {
    for (const slot of this.slots) {
      if (slot.connection !== null || slot.connecting) continue;
      clearTimeout(slot.retryTimer);
      slot.backoffMs = this.options.reconnectMinMs;
      this.openSlot(slot).catch(() => {});
    }
  }

  /** Closes every connection; requests in flight and queued fail, later ones are refused. */
  close(): void {
    this.closed = true;
    for (const slot of this.slots) {
      clearTimeout(slot.retryTimer);
      slot.connection?.close("the client is closing");
    }
    this.failQueued(() => new RuntimeUnavailableError("the sandfork-vmm client is closed"));
  }

  status(): DaemonClientStatus {
    return {
      connected: this.connectedCount(),
      inFlight: this.slots.reduce((n, s) => n + (s.connection?.pending ?? 0), 0),
      queued: this.queue.length,
      sentPerConnection: this.slots.map((s) => s.sent),
    };
  }

  /** The daemon's name and version, from the last handshake. */
  get serverVersion(): string | undefined {
    return this.server;
  }

  // ExecutionRuntime

  async execute(
    request: ExecutionRequest,
    signal: AbortSignal,
    onOutput?: (chunk: OutputChunk) => void,
  ): Promise<ExecutionResult> {
    const frame = await this.request("execute", executeFrame(request, onOutput !== undefined), {
      signal,
      timeoutMs: request.timeoutMs + this.options.executeGraceMs,
      liveness: this.executeLiveness(request.timeoutMs),
      onOutput: onOutput === undefined ? undefined : (output) => onOutput(parseOutput(output)),
    });
    return parseExecution(frame);
  }

  /** How long an execution whose time limit is `timeoutMs` waits while the daemon is alive. */
  private executeLiveness(timeoutMs: number): RequestOptions["liveness"] {
    return {
      maxWaitMs: timeoutMs + this.options.executeMaxWaitMs,
      intervalMs: this.options.executeGraceMs,
    };
  }

  /**
   * The daemon's templates, from a cache refreshed after `templatesTtlMs` or a reconnect (the
   * gateway asks on every execution). While a refresh is on its way the last list answers: a
   * daemon slow to answer under load does not hold up every call, a shed one included. Fails
   * like any request while no connection is up.
   */
  templates(): Promise<Template[]> {
    if (this.connectedCount() === 0) return Promise.reject(this.notConnected());
    const cached = this.templateCache;
    if (cached !== undefined && performance.now() - cached.at < this.options.templatesTtlMs)
      return cached.templates;
    const templates = this.request("list_templates", {}).then(parseTemplates);
    const refreshed = { at: performance.now(), templates };
    const stale = this.lastTemplates;
    const serving =
      stale === undefined ? refreshed : { at: refreshed.at, templates: Promise.resolve(stale) };
    this.templateCache = serving;
    templates.then(
      (list) => {
        this.lastTemplates = list;
        if (this.templateCache === serving) this.templateCache = refreshed;
      },
      // A failure is not cached.
      () => {
        if (this.templateCache === serving) this.templateCache = undefined;
      },
    );
    return serving.templates;
  }

  /**
   * Has the daemon serve its templates directory's folder `name` (a template built after it
   * started), and refreshes the cached list with its answer.
   */
  async loadTemplate(name: string, options: RequestOptions = {}): Promise<Template[]> {
    return this.replaceTemplates(
      parseTemplates(await this.request("load_template", { name }, options)),
    );
  }

  /** Has the daemon stop serving template `name`; refreshes the cached list. */
  async unloadTemplate(name: string): Promise<Template[]> {
    return this.replaceTemplates(parseTemplates(await this.request("unload_template", { name })));
  }

  private replaceTemplates(list: Template[]): Template[] {
    this.lastTemplates = list;
    this.templateCache = { at: performance.now(), templates: Promise.resolve(list) };
    return list;
  }

  async health(signal?: AbortSignal): Promise<RuntimeHealth> {
    const health = await this.daemonHealth({ signal });
    return {
      ok: health.ok,
      detail: `sandfork-vmm: kvm ${health.kvm}; ${health.templates} template(s)`,
    };
  }

  async admission(signal?: AbortSignal): Promise<RuntimeAdmission> {
    return (await this.stats({ signal })).admission;
  }

  // The rest of protocol v1

  async daemonHealth(options: RequestOptions = {}): Promise<DaemonHealth> {
    return parseHealth(await this.request("health", {}, options));
  }

  async stats(options: RequestOptions = {}): Promise<DaemonStats> {
    return parseStats(await this.request("stats", {}, options));
  }

  /**
   * Sends one request of `type` with `fields` (everything but `id` and `type`) and resolves with
   * the daemon's response frame; an error frame rejects with its typed error (see errors.ts).
   */
  request(
    type: RequestType,
    fields: FrameObject,
    options: RequestOptions = {},
  ): Promise<FrameObject> {
    const { signal } = options;
    const timeoutMs = options.timeoutMs ?? this.options.requestTimeoutMs;
    const { liveness } = options;
    const started = performance.now();
    return new Promise<FrameObject>((resolve, reject) => {
      if (signal?.aborted) return reject(abortReason(signal));
      if (this.closed)
        return reject(new RuntimeUnavailableError("the sandfork-vmm client is closed"));
      if (this.connectedCount() === 0) return reject(this.notConnected());

      let finished = false;
      const finish = () => {
        finished = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
      };
      const giveUp = (error: Error) => {
        if (finished) return;
        finish();
        if (job.sentOn !== undefined) {
          job.sentOn.connection.abandon(job.sentOn.id);
        } else {
          const at = this.queue.indexOf(job);
          if (at >= 0) this.queue.splice(at, 1);
        }
        reject(error);
      };
      const onAbort = () => giveUp(abortReason(signal as AbortSignal));
      // The deadline passed: final without liveness; otherwise the daemon's answer to a probe
      // decides whether to keep waiting.
      const overdue = () => {
        if (finished) return;
        const waited = Math.round(performance.now() - started);
        const left = liveness === undefined ? 0 : liveness.maxWaitMs - waited;
        const connection =
          job.sentOn?.connection ?? this.slots.find((s) => s.connection !== null)?.connection;
        if (liveness === undefined || left <= 0 || connection == null) {
          giveUp(
            new RuntimeTimeoutError(
              `sandfork-vmm did not answer the ${type} request within ${waited} ms`,
            ),
          );
          return;
        }
        void this.probe(connection).then((alive) => {
          if (finished) return;
          if (alive) {
            timer = setTimeout(overdue, Math.min(liveness.intervalMs, left));
            return;
          }
          giveUp(
            new RuntimeTimeoutError(
              `sandfork-vmm did not answer the ${type} request within ${Math.round(performance.now() - started)} ms, nor a liveness probe within ${this.options.requestTimeoutMs} ms`,
            ),
          );
        });
      };
      let timer = setTimeout(
        overdue,
        liveness === undefined ? timeoutMs : Math.min(timeoutMs, liveness.maxWaitMs),
      );
      signal?.addEventListener("abort", onAbort, { once: true });

      const job: Job = {
        type,
        fields,
        resolve: (frame) => {
          if (finished) return;
          finish();
          resolve(frame);
        },
        reject: (error) => {
          if (finished) return;
          finish();
          reject(error);
        },
        output: (frame) => {
          if (finished) return;
          try {
            options.onOutput?.(frame);
          } catch (error) {
            // A malformed output frame: the daemon broke the protocol for this request.
            job.reject(error as Error);
          }
        },
      };

      if (this.trySend(job)) return;
      if (this.queue.length >= this.options.maxQueued) {
        job.reject(
          new RuntimeQueueFullError(
            `sandfork-vmm client: ${this.options.maxQueued} request(s) already wait for a connection with room; retry shortly`,
          ),
        );
        return;
      }
      this.queue.push(job);
    });
  }

  /**
   * Whether the daemon behind `connection` answers a `health` request within requestTimeoutMs
   * (any answer counts, an error frame too). One probe per connection at a time, and an answer
   * stands for executeGraceMs: many overdue requests do not flood a loaded daemon with probes.
   * Sent past the in-flight bound: it must not queue behind the requests it vouches for.
   */
  private probe(connection: DaemonConnection): Promise<boolean> {
    const known = this.probes.get(connection) ?? { answeredAt: -Infinity, inFlight: undefined };
    this.probes.set(connection, known);
    if (known.inFlight !== undefined) return known.inFlight;
    if (performance.now() - known.answeredAt < this.options.executeGraceMs)
      return Promise.resolve(true);
    let settled = false;
    const inFlight = new Promise<boolean>((resolve) => {
      let id: number | undefined;
      const settle = (alive: boolean) => {
        settled = true;
        clearTimeout(timer);
        known.inFlight = undefined;
        if (alive) known.answeredAt = performance.now();
        resolve(alive);
      };
      const timer = setTimeout(() => {
        if (id !== undefined) connection.abandon(id);
        settle(false);
      }, this.options.requestTimeoutMs);
      try {
        id = connection.send(
          "health",
          {},
          {
            resolve: () => settle(true),
            reject: (error) => settle(!(error instanceof RuntimeConnectionLostError)),
          },
        );
      } catch {
        settle(false);
      }
    });
    if (!settled) known.inFlight = inFlight;
    return inFlight;
  }

  private notConnected(): RuntimeUnavailableError {
    return new RuntimeUnavailableError(`not connected to sandfork-vmm at ${this.endpoint.label}`);
  }

  private connectedCount(): number {
    return this.slots.reduce((n, s) => n + (s.connection !== null ? 1 : 0), 0);
  }

  /** Sends `job` on the least-loaded connection with room; false when none has room. */
  private trySend(job: Job): boolean {
    const slot = this.leastLoaded();
    if (slot === undefined) return false;
    const connection = slot.connection as DaemonConnection;
    try {
      const id = connection.send(job.type, job.fields, job);
      job.sentOn = { connection, id };
      slot.sent += 1;
    } catch (error) {
      job.reject(error as Error);
    }
    return true;
  }

  private leastLoaded(): Slot | undefined {
    let best: Slot | undefined;
    const n = this.slots.length;
    for (let k = 0; k < n; k++) {
      const slot = this.slots[(this.cursor + k) % n] as Slot;
      const pending = slot.connection?.pending;
      if (pending === undefined || pending >= this.options.maxInFlightPerConnection) continue;
      if (best === undefined || pending < (best.connection as DaemonConnection).pending)
        best = slot;
    }
    this.cursor = (this.cursor + 1) % n;
    return best;
  }

  private drainQueue(): void {
    while (this.queue.length > 0 && this.trySend(this.queue[0] as Job)) this.queue.shift();
  }

  private failQueued(error: () => Error): void {
    for (const job of this.queue.splice(0)) job.reject(error());
  }

  private async openSlot(slot: Slot): Promise<void> {
    slot.connecting = true;
    slot.retryTimer = undefined;
    let connection: DaemonConnection;
    try {
      connection = await DaemonConnection.open(this.endpoint, this.options.connectTimeoutMs);
    } catch (error) {
      slot.connecting = false;
      this.scheduleReopen(slot);
      throw error;
    }
    slot.connecting = false;
    if (this.closed) {
      connection.close("the client is closing");
      return;
    }
    const wasDisconnected = this.connectedCount() === 0;
    if (wasDisconnected) {
      this.templateCache = undefined;
      this.lastTemplates = undefined;
    }
    slot.connection = connection;
    slot.backoffMs = this.options.reconnectMinMs;
    this.server = connection.server;
    connection.onClose = (reason) => this.lost(slot, reason);
    connection.onAnswer = () => this.drainQueue();
    if (wasDisconnected) {
      this.log(`connected to ${connection.server} at ${this.endpoint.label}`);
      for (const notify of [...this.connectedWaiters]) notify();
    }
    this.drainQueue();
  }

  private lost(slot: Slot, reason: string): void {
    slot.connection = null;
    if (this.closed) return;
    if (this.connectedCount() === 0) {
      this.log(`lost every connection to sandfork-vmm (${reason}); reconnecting`);
      this.failQueued(
        () =>
          new RuntimeUnavailableError(
            `lost the connection to sandfork-vmm before the request was sent (${reason}); retry`,
          ),
      );
    }
    this.scheduleReopen(slot);
  }

  private scheduleReopen(slot: Slot): void {
    if (this.closed || slot.retryTimer !== undefined) return;
    const delay = slot.backoffMs;
    slot.backoffMs = Math.min(slot.backoffMs * 2, this.options.reconnectMaxMs);
    slot.retryTimer = setTimeout(() => {
      slot.retryTimer = undefined;
      if (slot.connection === null && !slot.connecting) this.openSlot(slot).catch(() => {});
    }, delay);
    slot.retryTimer.unref();
  }
}
