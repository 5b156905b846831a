// The gateway as the KVM suites that call it over HTTP need it: on PGlite, serving on a loopback
// port, with the REAL supervised daemon running the python template (sessions kept), or the
// templates a suite names (python-data, built at start: its boot imports pandas and SciPy).
import { mkdtemp, rm } from "node:fs/promises";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ServerType, serve } from "@hono/node-server";
import { loadRuntimeConfig } from "../../runtime/config.js";
import { type StartedRuntime, startRuntime } from "../../runtime/start.js";
import { requireVmmBinary } from "../../runtime/testing/real-daemon.js";
import { daemonMaxima } from "../config.js";
import {
  kvmExecutionLimits,
  scaledDaemonReadyEnv,
  templatesWithPrebuilt,
  timeScale,
} from "./kvm-tier.js";
import { startTestGateway, type TestGateway } from "./test-gateway.js";

export interface ServedGateway {
  gw: TestGateway;
  /** http://127.0.0.1:PORT */
  url: string;
  /** Stops the server, the gateway and the daemon, and removes their folder. */
  dispose(): Promise<void>;
}

export async function startServedGateway(
  options: { templates?: string[]; bootTimeoutMs?: number } = {},
): Promise<ServedGateway> {
  const dir = await mkdtemp(join(tmpdir(), "sfk-served-"));
  let runtime: StartedRuntime | undefined;
  let gw: TestGateway | undefined;
  let http: ServerType | undefined;
  const dispose = async () => {
    if (http !== undefined) {
      const server = http;
      await new Promise((done) => server.close(done));
    }
    await gw?.dispose();
    await runtime?.stop();
    await rm(dir, { recursive: true, force: true });
  };
  try {
    await templatesWithPrebuilt(dir, ["python"]);
    const env = {
      SANDFORK_TEMPLATES: (options.templates ?? ["python"]).join(","),
      SANDFORK_VMM_BIN: requireVmmBinary(),
      SANDFORK_VMM_CONNECTIONS: "2",
      SANDFORK_VMM_SERVE_ARGS: "--pool-size 2",
      SANDFORK_VMM_BOOT_TIMEOUT_MS: String((options.bootTimeoutMs ?? 30_000) * timeScale),
      ...scaledDaemonReadyEnv,
    };
    runtime = await startRuntime(
      loadRuntimeConfig(env, dir),
      daemonMaxima(kvmExecutionLimits),
      () => {},
    );
    if (runtime === undefined) throw new Error("supervised mode must start a runtime");
    gw = await startTestGateway("pglite", {
      runtime: runtime.client,
      config: { executionLimits: kvmExecutionLimits },
    });
    const app = gw.app;
    http = await new Promise<ServerType>((ready) => {
      const server = serve({ fetch: app.fetch, hostname: "127.0.0.1", port: 0 }, () =>
        ready(server),
      );
    });
    return { gw, url: `http://127.0.0.1:${(http.address() as AddressInfo).port}`, dispose };
  } catch (error) {
    await dispose();
    throw error;
  }
}
