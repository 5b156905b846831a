// `npm run cluster:node`: one KVM host of a cluster. Runs the VMM daemon under supervision as a
// single-host gateway would (runtime/start.ts), serves it to gateways over mutual TLS
// (cluster/node-server.ts) and registers the node in the cluster's database with a heartbeat
// (cluster/node-heartbeat.ts). SIGTERM takes the row out first, so that gateways stop routing
// here before the daemon stops.
import { openDatabase } from "../db/open.js";
import { daemonMaxima, loadConfig } from "../gateway/config.js";
import { loadRuntimeConfig } from "../runtime/config.js";
import { startRuntime } from "../runtime/start.js";
import { loadNodeConfig } from "./config.js";
import { NodeHeartbeat } from "./node-heartbeat.js";
import { NodeServer } from "./node-server.js";

const log = (line: string) => console.log(line);
const node = loadNodeConfig(process.env);
const { executionLimits: limits, dataDir } = loadConfig();
const runtimeConfig = loadRuntimeConfig(process.env, dataDir);
if (runtimeConfig.mode !== "supervised")
  throw new Error("a node runs its daemon under supervision: leave SANDFORK_RUNTIME unset");
const runtime = await startRuntime(
  {
    ...runtimeConfig,
    ...(node.sessionsDir === undefined ? {} : { sessionsDir: node.sessionsDir }),
    serveArgs: [
      ...(node.sessionsDir === undefined ? [] : ["--adopt-sessions"]),
      "--max-concurrency",
      String(node.capacity),
      ...runtimeConfig.serveArgs,
    ],
  },
  daemonMaxima(limits),
  log,
);
if (runtime === undefined) throw new Error("no runtime");
const open = await openDatabase({ backend: "postgres", url: node.databaseUrl, maxConnections: 2 });
const server = await NodeServer.listen({
  tls: node.tls,
  socketPath: runtimeConfig.socketPath,
  host: node.listen.host,
  port: node.listen.port,
  log,
});
const heartbeat = new NodeHeartbeat(
  open.db,
  runtime.client,
  { id: node.id, address: node.address, capacity: node.capacity },
  node.heartbeatMs,
  log,
);
await heartbeat.start();
log(
  `sandfork node ${node.id} serving its daemon on ${node.listen.host}:${server.port} (registered as ${node.address})`,
);

let stopping = false;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    heartbeat
      .stop()
      .catch((error: unknown) => log(`could not take the node's row out: ${String(error)}`))
      .then(() => Promise.all([server.close(), runtime.stop()]))
      .then(() => open.close())
      .then(
        () => process.exit(0),
        (error: unknown) => {
          console.error(error);
          process.exit(1);
        },
      );
  });
}
