// A KVM test's gateway on the python template: the runtime `npm start` starts (the supervised
// daemon, a warm pool of one) serving only python from DIR/templates (linked from the KVM tier's
// build, else built there), and a test gateway on it (PGlite, or PostgreSQL when asked).
import type { DatabaseBackend } from "../../db/client.js";
import { loadRuntimeConfig } from "../../runtime/config.js";
import { type StartedRuntime, startRuntime } from "../../runtime/start.js";
import { requireVmmBinary } from "../../runtime/testing/real-daemon.js";
import { daemonMaxima, type GatewayConfig } from "../config.js";
import {
  kvmExecutionLimits,
  scaledDaemonReadyEnv,
  templatesWithPrebuilt,
  timeScale,
} from "./kvm-tier.js";
import { startTestGateway, type TestGateway } from "./test-gateway.js";

export async function startPythonGateway(
  dir: string,
  log: string[],
  config: Partial<GatewayConfig> = {},
  backend: DatabaseBackend = "pglite",
): Promise<{ runtime: StartedRuntime; gw: TestGateway }> {
  await templatesWithPrebuilt(dir, ["python"]);
  const env = {
    SANDFORK_VMM_BIN: requireVmmBinary(),
    SANDFORK_TEMPLATES: "python",
    SANDFORK_VMM_CONNECTIONS: "2",
    SANDFORK_VMM_SERVE_ARGS: "--pool-size 1",
    SANDFORK_VMM_BOOT_TIMEOUT_MS: String(30_000 * timeScale),
    ...scaledDaemonReadyEnv,
  };
  const runtime = await startRuntime(
    loadRuntimeConfig(env, dir),
    daemonMaxima(kvmExecutionLimits),
    (line) => log.push(line),
  );
  if (runtime === undefined) throw new Error("supervised mode must start a runtime");
  // A gateway that cannot start (no TEST_DATABASE_URL for PostgreSQL) leaves no daemon behind:
  // the caller never gets the runtime to stop.
  const gw = await startTestGateway(backend, {
    runtime: runtime.client,
    config: { executionLimits: kvmExecutionLimits, ...config },
  }).catch(async (error: unknown) => {
    await runtime.stop();
    throw error;
  });
  return { runtime, gw };
}
