// `npm start`: the gateway on embedded PGlite in ./.sandfork/data, or on DATABASE_URL.
// The execution runtime (runtime/start.ts, SANDFORK_RUNTIME): by default the templates are built
// if missing or stale and `sandfork-vmm serve` runs under supervision.
import { loadRuntimeConfig } from "../runtime/config.js";
import { startRuntime } from "../runtime/start.js";
import { loadConfig } from "./config.js";
import { type RunningGateway, startGateway } from "./server.js";

const config = loadConfig();
const runtime = await startRuntime(loadRuntimeConfig(process.env, config.dataDir), {
  timeoutMs: config.executionLimits.maxTimeoutMs,
  memoryMib: config.executionLimits.maxMemoryMb,
}).catch((error: Error) => {
  console.error(`cannot start the execution runtime: ${error.message}`);
  console.error(
    "(SANDFORK_RUNTIME=none starts the gateway without one: executions then answer 503)",
  );
  process.exit(1);
});
// Installed before the gateway listens: a SIGTERM right after "listening" (a supervisor, a test)
// must stop the daemon too, not kill this process and leave the daemon running until next start.
let gateway: RunningGateway | undefined;
let stopping = false;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    // Together: a terminal's Ctrl-C also reached the daemon, whose exit must not look like a crash.
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
