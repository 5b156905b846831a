// A gateway's runtime in a cluster (SANDFORK_RUNTIME=cluster): a connection to the cluster's
// database of its own, and the nodes read from it (cluster/cluster-runtime.ts).
import { openDatabase } from "../db/open.js";
import type { RuntimeConfig } from "../runtime/config.js";
import { ClusterRuntime } from "./cluster-runtime.js";
import { loadGatewayClusterConfig } from "./config.js";

export interface StartedCluster {
  runtime: ClusterRuntime;
  stop(): Promise<void>;
}

export async function startClusterRuntime(
  env: NodeJS.ProcessEnv,
  runtime: RuntimeConfig,
  log: (line: string) => void = (line) => console.log(line),
): Promise<StartedCluster> {
  const config = loadGatewayClusterConfig(env);
  const open = await openDatabase({
    backend: "postgres",
    url: config.databaseUrl,
    maxConnections: 4,
  });
  const cluster = new ClusterRuntime({
    db: open.db,
    tls: config.tls,
    staleMs: config.staleMs,
    refreshMs: config.refreshMs,
    client: {
      connections: runtime.connections,
      maxInFlightPerConnection: runtime.maxInFlightPerConnection,
      maxQueued: runtime.maxQueued,
      executeGraceMs: runtime.executeGraceMs,
      executeMaxWaitMs: runtime.executeMaxWaitMs,
    },
    log: (line) => log(`[cluster] ${line}`),
  });
  try {
    await cluster.start();
  } catch (error) {
    await open.close();
    throw error;
  }
  return {
    runtime: cluster,
    async stop() {
      cluster.stop();
      await open.close();
    },
  };
}
