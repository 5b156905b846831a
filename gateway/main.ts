// `npm start`: the gateway on embedded PGlite in ./.sandfork/data, or on DATABASE_URL.
// The execution runtime (runtime/start.ts, SANDFORK_RUNTIME): by default the templates are built
// if missing or stale and `sandfork-vmm serve` runs under supervision; SANDFORK_RUNTIME=cluster
// routes to the nodes registered in the cluster's database instead (cluster/start.ts).

import { getPriority } from "node:os";
import { startClusterRuntime } from "../cluster/start.js";
import { loadRuntimeConfig } from "../runtime/config.js";
import { setEventLoopNice, setRealtime } from "../runtime/event-loop-priority.js";
import type { ExecutionRuntime } from "../runtime/execution-runtime.js";
import { startRuntime } from "../runtime/start.js";
import { daemonMaxima, loadConfig } from "./config.js";
import { type RunningGateway, startGateway } from "./server.js";

const config = loadConfig();
const runtimeConfig = loadRuntimeConfig(process.env, config.dataDir);
const runtime: { client: ExecutionRuntime; stop(): Promise<void> } | undefined =
  await (runtimeConfig.mode === "cluster"
    ? startClusterRuntime(process.env, runtimeConfig).then((c) => ({
        client: c.runtime,
        stop: c.stop,
      }))
    : startRuntime(runtimeConfig, daemonMaxima(config.executionLimits))
  ).catch((error: Error) => {
    console.error(`cannot start the execution runtime: ${error.message}`);
    console.error(
      "(SANDFORK_RUNTIME=none starts the gateway without one: executions then answer 503)",
    );
    process.exit(1);
  });
if (config.eventLoopNice !== undefined) {
  try {
    if (setEventLoopNice(config.eventLoopNice) === "not-session-leader")
      console.error(
        `SANDFORK_GATEWAY_NICE=${config.eventLoopNice}: this kernel schedules by session and the gateway does not lead its own, so its event loop gains only on the processes of its caller's session; start it with setsid (docs/deployment.md)`,
      );
  } catch (error) {
    console.error(
      `SANDFORK_GATEWAY_NICE=${config.eventLoopNice}: not permitted (${(error as Error).message}); the event loop keeps nice ${getPriority()}`,
    );
  }
}
if (config.eventLoopRealtimePriority !== undefined) {
  try {
    setRealtime(undefined, config.eventLoopRealtimePriority);
  } catch (error) {
    console.error(
      `SANDFORK_GATEWAY_REALTIME_PRIORITY=${config.eventLoopRealtimePriority}: not permitted (${(error as Error).message.trim()}); the event loop keeps the ordinary policy`,
    );
  }
}
// Installed before the gateway listens: a SIGTERM right after "listening" (a supervisor, a test)
// must stop the daemon too, not kill this process and leave the daemon running until next start.
let gateway: RunningGateway | undefined;
let stopping = false;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    // Together: the daemon, in a session of its own (runtime/supervisor.ts), gets no terminal's
    // Ctrl-C; it stops with the gateway, and its exit must not look like a crash.
    Promise.all([gateway?.stop(), runtime?.stop()]).then(
      () => process.exit(0),
      (error: unknown) => {
        console.error(error);
        process.exit(1);
      },
    );
  });
}
gateway = await startGateway(
  config,
  runtime === undefined ? {} : { runtime: () => runtime.client },
);
