// Starting the execution runtime the gateway uses, per RuntimeConfig.mode: build the templates,
// run the daemon under supervision and connect the client (supervised), only connect
// (external), or nothing (none).
import { mkdir } from "node:fs/promises";
import { dirname } from "node:path";
import type { RuntimeConfig } from "./config.js";
import { DaemonTemplateBuilds } from "./custom-templates.js";
import { DaemonClient } from "./daemon-client.js";
import { DaemonSupervisor } from "./supervisor.js";
import { ensureTemplates, refreshBuiltSnapshots, selectTemplateSources } from "./templates.js";
import { daemonUser } from "./unprivileged.js";

export interface StartedRuntime {
  client: DaemonClient;
  /** Present in supervised mode. */
  supervisor: DaemonSupervisor | undefined;
  /** Closes the client and stops the daemon this process started. */
  stop(): Promise<void>;
}

/** The largest limits the gateway lets a request ask for; the daemon is told the same maxima. */
export interface DaemonMaxima {
  timeoutMs: number;
  memoryMib: number;
  /** Processes of one execution alive at once: also what a request gets by default. */
  processes: number;
}

export async function startRuntime(
  config: RuntimeConfig,
  maxima: DaemonMaxima,
  log: (line: string) => void = (line) => console.log(line),
): Promise<StartedRuntime | undefined> {
  if (config.mode === "cluster")
    throw new Error("SANDFORK_RUNTIME=cluster starts in cluster/start.ts");
  if (config.mode === "none") {
    log("SANDFORK_RUNTIME=none: no execution runtime");
    return undefined;
  }
  const client = new DaemonClient({
    socketPath: config.socketPath,
    connections: config.connections,
    maxInFlightPerConnection: config.maxInFlightPerConnection,
    maxQueued: config.maxQueued,
    executeGraceMs: config.executeGraceMs,
    executeMaxWaitMs: config.executeMaxWaitMs,
    log,
  });

  if (config.mode === "external") {
    // The gateway serves anyway; executions answer 503 until the daemon is reachable.
    await client
      .connect()
      .catch((error: Error) => log(`${error.message}; retrying in the background`));
    return { client, supervisor: undefined, stop: async () => client.close() };
  }

  const sources = selectTemplateSources(config.templateSourcesDir, config.templateNames);
  if (sources.length === 0)
    throw new Error(
      `no template sources (folders with an image.json) in ${config.templateSourcesDir}`,
    );
  const buildOptions = {
    binary: config.binary,
    templatesDir: config.templatesDir,
    force: config.rebuildTemplates,
    bootTimeoutMs: config.bootTimeoutMs,
    log,
  };
  await ensureTemplates(sources, buildOptions);
  await refreshBuiltSnapshots(config.templateSourcesDir, buildOptions);

  await mkdir(dirname(config.socketPath), { recursive: true, mode: 0o700 });
  const runAs = await daemonUser(dirname(config.socketPath), log);
  const supervisor = new DaemonSupervisor({
    ...(runAs === undefined ? {} : { runAs }),
    binary: config.binary,
    socketPath: config.socketPath,
    templatesDir: config.templatesDir,
    readyTimeoutMs: config.readyTimeoutMs,
    serveArgs: [
      "--max-timeout-ms",
      String(maxima.timeoutMs),
      "--max-memory-mib",
      String(maxima.memoryMib),
      "--max-processes",
      String(maxima.processes),
      ...(config.bootTimeoutMs === undefined
        ? []
        : ["--boot-timeout-ms", String(config.bootTimeoutMs)]),
      "--sessions",
      config.sessionsDir,
      ...config.serveArgs,
    ],
    log,
  });
  client.templateBuilds = new DaemonTemplateBuilds({
    client,
    binary: config.binary,
    templatesDir: config.templatesDir,
    sourcesDir: config.templateSourcesDir,
    bootTimeoutMs: config.bootTimeoutMs,
    maxImageBytes: config.maxTemplateImageBytes,
  });
  await supervisor.start();
  supervisor.onReady(() => client.reconnectNow());
  try {
    await client.connect();
  } catch (error) {
    client.close();
    await supervisor.stop();
    throw error;
  }
  return {
    client,
    supervisor,
    async stop() {
      client.close();
      await supervisor.stop();
    },
  };
}
