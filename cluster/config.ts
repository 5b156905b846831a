// A cluster's settings, read once from the environment: a node's (cluster/node-main.ts) and a
// gateway's (SANDFORK_RUNTIME=cluster, cluster/start.ts). docs/deployment.md lists them.
import { availableParallelism, hostname } from "node:os";
import { join, resolve } from "node:path";
import { positiveIntegerFromEnv } from "../runtime/config.js";
import { type ClusterTls, loadClusterTls, parseAddress } from "./tls.js";

/** Node ids name a folder under the shared sessions root and a row: kept to a safe alphabet. */
const NODE_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

export interface NodeConfig {
  id: string;
  databaseUrl: string;
  tls: ClusterTls;
  /** Where the TLS server listens. */
  listen: { host: string; port: number };
  /** host:port gateways dial (as registered). */
  address: string;
  capacity: number;
  heartbeatMs: number;
  /**
   * The node's sessions folder, `root/<id>` under a root every node mounts (the daemon adopts
   * the sessions of a stopped node from the folders beside it); undefined: its own data folder.
   */
  sessionsDir: string | undefined;
}

export interface GatewayClusterConfig {
  databaseUrl: string;
  tls: ClusterTls;
  staleMs: number;
  refreshMs: number;
}

function requireDatabaseUrl(env: NodeJS.ProcessEnv, who: string): string {
  const url = env.DATABASE_URL;
  if (!url) throw new Error(`${who} needs DATABASE_URL: the cluster's PostgreSQL server`);
  return url;
}

export function loadNodeConfig(env: NodeJS.ProcessEnv): NodeConfig {
  const id = env.SANDFORK_NODE_ID || hostname();
  if (!NODE_ID.test(id))
    throw new Error(
      `SANDFORK_NODE_ID must be 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit; got ${JSON.stringify(id)}`,
    );
  const listen = parseAddress(env.SANDFORK_NODE_LISTEN || "0.0.0.0:8790");
  const wildcard = listen.host === "0.0.0.0" || listen.host === "::";
  const address =
    env.SANDFORK_NODE_ADDRESS ||
    `${wildcard ? hostname() : listen.host.includes(":") ? `[${listen.host}]` : listen.host}:${listen.port}`;
  parseAddress(address);
  const root = env.SANDFORK_SESSIONS_ROOT;
  return {
    id,
    databaseUrl: requireDatabaseUrl(env, "a node"),
    tls: loadClusterTls(env),
    listen,
    address,
    capacity: positiveIntegerFromEnv(env, "SANDFORK_NODE_CAPACITY", 2 * availableParallelism()),
    heartbeatMs: positiveIntegerFromEnv(env, "SANDFORK_NODE_HEARTBEAT_MS", 1_000),
    sessionsDir: root ? join(resolve(root), id) : undefined,
  };
}

export function loadGatewayClusterConfig(env: NodeJS.ProcessEnv): GatewayClusterConfig {
  return {
    databaseUrl: requireDatabaseUrl(env, "SANDFORK_RUNTIME=cluster"),
    tls: loadClusterTls(env),
    staleMs: positiveIntegerFromEnv(env, "SANDFORK_NODE_STALE_MS", 3_000),
    refreshMs: positiveIntegerFromEnv(env, "SANDFORK_CLUSTER_REFRESH_MS", 500),
  };
}
