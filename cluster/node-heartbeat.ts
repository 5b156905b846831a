// A node's row in the registry (db/nodes.ts), rewritten every interval with what its daemon says
// now: the templates ready to run and the executions it runs or queues. A daemon that does not
// answer (restarting under its supervisor) is reported serving nothing, so that gateways route
// elsewhere until it is back; a node that stops beating is drained by the gateways.
import type { Database } from "../db/client.js";
import { heartbeat, removeNode } from "../db/nodes.js";
import type { DaemonClient } from "../runtime/daemon-client.js";

export interface NodeIdentity {
  id: string;
  /** host:port gateways dial. */
  address: string;
  capacity: number;
}

export class NodeHeartbeat {
  private timer: NodeJS.Timeout | undefined;
  private beating: Promise<void> | undefined;

  constructor(
    private readonly db: Database,
    private readonly daemon: DaemonClient,
    private readonly node: NodeIdentity,
    private readonly intervalMs: number,
    private readonly log: (line: string) => void = () => {},
  ) {}

  /** One heartbeat now, then one every interval. */
  async start(): Promise<void> {
    await this.beat();
    this.timer = setInterval(() => {
      this.beating ??= this.beat()
        .catch((error: unknown) => this.log(`heartbeat failed: ${String(error)}`))
        .finally(() => {
          this.beating = undefined;
        });
    }, this.intervalMs);
  }

  async beat(): Promise<void> {
    const [templates, stats] = await Promise.allSettled([
      this.daemon.templates(),
      this.daemon.stats(),
    ]);
    await heartbeat(this.db, {
      ...this.node,
      templates:
        templates.status === "fulfilled"
          ? templates.value.filter((t) => t.ready).map((t) => t.name)
          : [],
      load: stats.status === "fulfilled" ? stats.value.inFlight : 0,
    });
  }

  /** Stops beating and takes the row out, so that gateways stop routing here at once. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.beating;
    await removeNode(this.db, this.node.id);
  }
}
