// Sessions in a cluster: each belongs to the node recorded in its row (sessions.node_id), and any
// gateway sends its requests there. A session whose node has no fresh heartbeat is moved (by
// compare-and-set, so that one gateway moves it) to another node serving its template, whose
// daemon adopts it from the shared sessions folder (`serve --adopt-sessions`): a paused session
// resumes from its newest checkpoint there.
import type { Database } from "../db/client.js";
import { moveSession } from "../db/nodes.js";
import { findSession } from "../db/sessions.js";
import { RuntimeRequestError, RuntimeUnavailableError } from "../runtime/errors.js";
import type {
  CellLimits,
  CellResult,
  SessionInfo,
  SessionRuntime,
  TakenCheckpoint,
} from "../runtime/session-runtime.js";
import type { ClusterRuntime, ServingNode } from "./cluster-runtime.js";

export class ClusterSessions implements SessionRuntime {
  constructor(
    private readonly cluster: ClusterRuntime,
    private readonly db: Database,
  ) {}

  /** The node session `id` belongs to, moved first when its node is gone. */
  private async nodeOf(id: string): Promise<ServingNode> {
    const row = await findSession(this.db, id);
    if (row === undefined) throw new RuntimeRequestError("not_found", `no session '${id}'`);
    const placed = row.nodeId === null ? undefined : this.cluster.fresh(row.nodeId);
    if (placed !== undefined) return placed;
    const target = this.cluster.pick(row.template);
    const owner = await moveSession(this.db, id, row.nodeId, target.row.id);
    if (owner === target.row.id) return target;
    const other = owner == null ? undefined : this.cluster.fresh(owner);
    if (other === undefined)
      throw new RuntimeUnavailableError(`the node of session '${id}' is not reachable; retry`);
    return other;
  }

  private async onNodeOf<T>(
    id: string,
    call: (sessions: SessionRuntime) => Promise<T>,
  ): Promise<T> {
    return this.cluster.on(await this.nodeOf(id), (client) => call(client.sessions));
  }

  async create(session: string, template: string, memoryMib?: number): Promise<SessionInfo> {
    const target = this.cluster.pick(template);
    await moveSession(this.db, session, null, target.row.id);
    return this.cluster.on(target, (client) =>
      client.sessions.create(session, template, memoryMib),
    );
  }

  execute(
    session: string,
    code: string,
    limits: CellLimits,
    signal?: AbortSignal,
  ): Promise<CellResult> {
    return this.onNodeOf(session, (s) => s.execute(session, code, limits, signal));
  }

  writeFile(session: string, path: string, content: Buffer): Promise<number> {
    return this.onNodeOf(session, (s) => s.writeFile(session, path, content));
  }

  readFile(session: string, path: string): Promise<Buffer> {
    return this.onNodeOf(session, (s) => s.readFile(session, path));
  }

  deleteFile(session: string, path: string): Promise<void> {
    return this.onNodeOf(session, (s) => s.deleteFile(session, path));
  }

  checkpoint(session: string): Promise<TakenCheckpoint> {
    return this.onNodeOf(session, (s) => s.checkpoint(session));
  }

  pause(session: string): Promise<TakenCheckpoint> {
    return this.onNodeOf(session, (s) => s.pause(session));
  }

  resume(session: string): Promise<SessionInfo> {
    return this.onNodeOf(session, (s) => s.resume(session));
  }

  /** The fork lives where its source's checkpoints are: on the source's node. */
  async fork(session: string, from: string, checkpoint: number): Promise<SessionInfo> {
    const node = await this.nodeOf(from);
    await moveSession(this.db, session, null, node.row.id);
    return this.cluster.on(node, (client) => client.sessions.fork(session, from, checkpoint));
  }

  delete(session: string): Promise<void> {
    return this.onNodeOf(session, (s) => s.delete(session));
  }

  info(session: string): Promise<SessionInfo> {
    return this.onNodeOf(session, (s) => s.info(session));
  }
}
