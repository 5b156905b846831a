// The cluster's node registry and session placement: each node's row (address, templates,
// capacity, load) is rewritten at every heartbeat; gateways read the rows with a fresh heartbeat,
// judged by the database's clock so that hosts' clocks need not agree. A session's node is
// moved only by compare-and-set, so that of several gateways finding its node dead one moves it.
import { and, eq, gt, isNull, sql } from "drizzle-orm";
import type { Database } from "./client.js";
import { nodes, sessions } from "./schema.js";

export type NodeRow = typeof nodes.$inferSelect;

export interface NodeBeat {
  id: string;
  address: string;
  templates: string[];
  capacity: number;
  load: number;
}

/** Registers the node or refreshes its row; the heartbeat is the database's now(). */
export async function heartbeat(db: Database, beat: NodeBeat): Promise<void> {
  await db
    .insert(nodes)
    .values({ ...beat, heartbeatAt: sql`now()`, startedAt: sql`now()` })
    .onConflictDoUpdate({
      target: nodes.id,
      set: {
        address: beat.address,
        templates: beat.templates,
        capacity: beat.capacity,
        load: beat.load,
        heartbeatAt: sql`now()`,
      },
    });
}

/** A node leaving cleanly: gateways stop routing to it at their next read. */
export async function removeNode(db: Database, id: string): Promise<void> {
  await db.delete(nodes).where(eq(nodes.id, id));
}

/** The nodes whose last heartbeat is at most `maxAgeMs` old. */
export async function freshNodes(db: Database, maxAgeMs: number): Promise<NodeRow[]> {
  return db
    .select()
    .from(nodes)
    .where(gt(nodes.heartbeatAt, sql`now() - make_interval(secs => ${maxAgeMs / 1000})`));
}

/** The node a session's row names (null: none yet, or a single host's); undefined: no such session. */
async function sessionNode(db: Database, id: string): Promise<string | null | undefined> {
  const [row] = await db
    .select({ nodeId: sessions.nodeId })
    .from(sessions)
    .where(eq(sessions.id, id));
  return row?.nodeId;
}

/**
 * Moves session `id` from node `from` (null: none) to `to`, unless another gateway moved it
 * first. Returns the node it belongs to afterwards.
 */
export async function moveSession(
  db: Database,
  id: string,
  from: string | null,
  to: string,
): Promise<string | null | undefined> {
  const moved = await db
    .update(sessions)
    .set({ nodeId: to })
    .where(
      and(eq(sessions.id, id), from === null ? isNull(sessions.nodeId) : eq(sessions.nodeId, from)),
    )
    .returning({ nodeId: sessions.nodeId });
  if (moved.length > 0) return to;
  return sessionNode(db, id);
}
