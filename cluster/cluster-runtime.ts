// A gateway's execution runtime in a cluster: the nodes with a fresh heartbeat in the database
// (db/nodes.ts), each reached by a DaemonClient over mutual TLS (cluster/tls.ts), re-read every
// `refreshMs`. Each execution goes to one node that serves its template (cluster/placement.ts);
// a node whose heartbeat is older than `staleMs` is drained: no new calls, and its client is
// closed, so that what it still had in flight fails retryably (runtime-unavailable, billed
// nothing) instead of waiting on a host that is gone. The gateway itself keeps no state of
// its own: any gateway reads the same rows.
import type { Database } from "../db/client.js";
import { freshNodes, type NodeRow } from "../db/nodes.js";
import { DaemonClient, type DaemonClientOptions } from "../runtime/daemon-client.js";
import { RuntimeUnavailableError } from "../runtime/errors.js";
import type {
  ExecutionRequest,
  ExecutionResult,
  ExecutionRuntime,
  OutputChunk,
  RuntimeHealth,
  Template,
} from "../runtime/execution-runtime.js";
import { ClusterSessions } from "./cluster-sessions.js";
import { pickNode } from "./placement.js";
import { type ClusterTls, nodeEndpoint } from "./tls.js";

export interface ClusterRuntimeOptions {
  db: Database;
  tls: ClusterTls;
  /** A node whose last heartbeat is older than this is drained. */
  staleMs: number;
  /** How often the node rows are read. */
  refreshMs: number;
  /** Settings of each node's client (connections, bounds, execute grace). */
  client: Omit<DaemonClientOptions, "socketPath" | "endpoint" | "log">;
  log?: (line: string) => void;
}

/** A node this gateway can route to. */
export interface ServingNode {
  row: NodeRow;
  client: DaemonClient;
  /** Calls this gateway has on it now. */
  inFlight: number;
}

export class ClusterRuntime implements ExecutionRuntime {
  private readonly nodes = new Map<string, ServingNode>();
  private readonly log: (line: string) => void;
  private timer: NodeJS.Timeout | undefined;
  private refreshing: Promise<void> | undefined;
  readonly sessions: ClusterSessions;

  constructor(private readonly options: ClusterRuntimeOptions) {
    this.log = options.log ?? (() => {});
    this.sessions = new ClusterSessions(this, options.db);
  }

  /** Reads the nodes once, then every refreshMs. */
  async start(): Promise<void> {
    await this.refresh();
    this.timer = setInterval(
      () =>
        void this.refresh().catch((error: unknown) =>
          this.log(`reading the cluster's nodes failed: ${String(error)}`),
        ),
      this.options.refreshMs,
    );
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    for (const node of this.nodes.values()) node.client.close();
    this.nodes.clear();
  }

  /** Brings the set of nodes up to the database's fresh rows (one refresh at a time). */
  refresh(): Promise<void> {
    this.refreshing ??= this.readNodes().finally(() => {
      this.refreshing = undefined;
    });
    return this.refreshing;
  }

  private async readNodes(): Promise<void> {
    const rows = await freshNodes(this.options.db, this.options.staleMs);
    const fresh = new Set(rows.map((r) => r.id));
    for (const [id, node] of this.nodes) {
      if (fresh.has(id)) continue;
      this.log(
        `node ${id} (${node.row.address}) drained: no heartbeat for ${this.options.staleMs} ms`,
      );
      node.client.close();
      this.nodes.delete(id);
    }
    for (const row of rows) {
      const known = this.nodes.get(row.id);
      if (known !== undefined && known.row.address === row.address) {
        known.row = row;
        continue;
      }
      known?.client.close();
      const client = new DaemonClient({
        ...this.options.client,
        endpoint: nodeEndpoint(row.address, this.options.tls),
        log: (line) => this.log(`node ${row.id}: ${line}`),
      });
      this.nodes.set(row.id, { row, client, inFlight: 0 });
      client.connect().catch(() => {
        // It keeps retrying in the background; placement skips it until it is connected.
      });
    }
  }

  /** The node `id` when its heartbeat is fresh (connected or not). */
  fresh(id: string): ServingNode | undefined {
    return this.nodes.get(id);
  }

  /** A connected node with a fresh heartbeat that serves `template`, picked by load. */
  pick(template: string): ServingNode {
    const candidates = [...this.nodes.values()]
      .filter((n) => n.row.templates.includes(template) && n.client.status().connected > 0)
      .map((n) => ({ id: n.row.id, load: n.row.load + n.inFlight, capacity: n.row.capacity, n }));
    const chosen = pickNode(candidates);
    if (chosen === undefined)
      throw new RuntimeUnavailableError(
        `no node with a fresh heartbeat serves the template "${template}" now`,
      );
    return chosen.n;
  }

  /** Runs `call` on `node`, counted in its load while it runs. */
  async on<T>(node: ServingNode, call: (client: DaemonClient) => Promise<T>): Promise<T> {
    node.inFlight += 1;
    try {
      return await call(node.client);
    } finally {
      node.inFlight -= 1;
    }
  }

  execute(
    request: ExecutionRequest,
    signal: AbortSignal,
    onOutput?: (chunk: OutputChunk) => void,
  ): Promise<ExecutionResult> {
    return this.on(this.pick(request.template), (client) =>
      client.execute(request, signal, onOutput),
    );
  }

  /** Every template some connected node serves (a template's entry from a node where it is ready, if any). */
  async templates(): Promise<Template[]> {
    const connected = [...this.nodes.values()].filter((n) => n.client.status().connected > 0);
    const lists = await Promise.allSettled(connected.map((n) => n.client.templates()));
    const byName = new Map<string, Template>();
    for (const list of lists)
      if (list.status === "fulfilled")
        for (const template of list.value)
          if (!byName.has(template.name) || template.ready) byName.set(template.name, template);
    if (byName.size === 0 && !lists.some((l) => l.status === "fulfilled"))
      throw new RuntimeUnavailableError("no node of the cluster is connected");
    return [...byName.values()];
  }

  async health(): Promise<RuntimeHealth> {
    const all = [...this.nodes.values()];
    const connected = all.filter((n) => n.client.status().connected > 0);
    return {
      ok: connected.length > 0,
      detail: `cluster: ${connected.length} of ${all.length} fresh node(s) connected (${connected
        .map((n) => n.row.id)
        .join(", ")})`,
    };
  }
}
