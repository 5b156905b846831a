// How the gateway gets its execution runtime, read once from the environment. Paths default
// relative to the working directory (`npm start` runs in the repository) and the data directory.
import { join, resolve } from "node:path";

/**
 * supervised: build missing templates, run `sandfork-vmm serve` as a child and connect to it;
 * external: connect to a daemon someone else runs at the socket path;
 * none: no runtime (executions answer 503 runtime-unavailable);
 * cluster: the nodes registered in the cluster's database (cluster/start.ts).
 */
export type RuntimeMode = "supervised" | "external" | "none" | "cluster";

export interface RuntimeConfig {
  mode: RuntimeMode;
  /** The `sandfork-vmm` binary. */
  binary: string;
  socketPath: string;
  /** Built templates (the daemon's --templates). */
  templatesDir: string;
  /** Template sources: one folder per template holding its image.json. */
  templateSourcesDir: string;
  /** The templates to build and serve, by name (SANDFORK_TEMPLATES, comma-separated); undefined: all. */
  templateNames: string[] | undefined;
  /** More `sandfork-vmm serve` options (e.g. --max-concurrency 8 --max-queue 128). */
  serveArgs: string[];
  /** Where the daemon keeps stateful sessions and their checkpoints (`serve --sessions`). */
  sessionsDir: string;
  /** Rebuild template images at start even when they look up to date. */
  rebuildTemplates: boolean;
  /**
   * The wall-clock limit of booting a template's agent to its ready point (`template build`
   * and `serve --boot-timeout-ms`); undefined: the binary's default (30 s). A slow machine
   * (a KVM nested in an emulated CPU) needs more.
   */
  bootTimeoutMs: number | undefined;
  /** The largest file image a template built through the API may make (SANDFORK_TEMPLATE_MAX_IMAGE_MIB). */
  maxTemplateImageBytes: number;
  /** How long a started daemon may take to answer on its socket (it loads every template first). */
  readyTimeoutMs: number;
  /**
   * How much longer than an execution's own time limit the client waits for the daemon's answer
   * (queueing in the daemon, the VM's teardown) before it probes the daemon's liveness; and the
   * time between probes while the daemon answers them.
   */
  executeGraceMs: number;
  /** The most the client waits past an execution's time limit while the daemon stays alive. */
  executeMaxWaitMs: number;
  connections: number;
  maxInFlightPerConnection: number;
  maxQueued: number;
}

/** sockaddr_un.sun_path holds 108 bytes including the terminating NUL. */
export const MAX_SOCKET_PATH_BYTES = 107;

/** The positive integer in env[name], or `fallback` when it is unset or empty; anything else throws. */
/** SANDFORK_VMM_EXECUTE_GRACE_MS: the runtime client's wait past a program's timeout before it probes the daemon. */
export function executeGraceMsFromEnv(env: NodeJS.ProcessEnv): number {
  return positiveIntegerFromEnv(env, "SANDFORK_VMM_EXECUTE_GRACE_MS", 5_000);
}

/** SANDFORK_VMM_EXECUTE_MAX_WAIT_MS: the runtime client's longest wait past a program's timeout (the gateway's deadline is derived from it). */
export function executeMaxWaitMsFromEnv(env: NodeJS.ProcessEnv): number {
  return positiveIntegerFromEnv(env, "SANDFORK_VMM_EXECUTE_MAX_WAIT_MS", 600_000);
}

export function positiveIntegerFromEnv(
  env: NodeJS.ProcessEnv,
  name: string,
  fallback: number,
): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value <= 0)
    throw new Error(`${name} must be a positive integer, got ${raw}`);
  return value;
}

export function loadRuntimeConfig(env: NodeJS.ProcessEnv, dataDir: string): RuntimeConfig {
  const mode = env.SANDFORK_RUNTIME ?? "supervised";
  if (mode !== "supervised" && mode !== "external" && mode !== "none" && mode !== "cluster") {
    throw new Error(`SANDFORK_RUNTIME must be supervised, external, none or cluster, got ${mode}`);
  }
  const socketPath = resolve(env.SANDFORK_VMM_SOCKET ?? join(dataDir, "run", "sandfork-vmm.sock"));
  if (Buffer.byteLength(socketPath) > MAX_SOCKET_PATH_BYTES) {
    throw new Error(
      `the daemon socket path ${socketPath} is longer than ${MAX_SOCKET_PATH_BYTES} bytes; set SANDFORK_VMM_SOCKET to a shorter one`,
    );
  }
  return {
    mode,
    binary: resolve(env.SANDFORK_VMM_BIN ?? "native-vmm/target/release/sandfork-vmm"),
    socketPath,
    templatesDir: resolve(env.SANDFORK_TEMPLATES_DIR ?? join(dataDir, "templates")),
    templateSourcesDir: resolve(env.SANDFORK_TEMPLATE_SOURCES ?? "templates"),
    templateNames:
      env.SANDFORK_TEMPLATES === undefined
        ? undefined
        : env.SANDFORK_TEMPLATES.split(",")
            .map((name) => name.trim())
            .filter((name) => name !== ""),
    serveArgs: (env.SANDFORK_VMM_SERVE_ARGS ?? "").split(/\s+/).filter((arg) => arg !== ""),
    sessionsDir: resolve(env.SANDFORK_SESSIONS_DIR ?? join(dataDir, "sessions")),
    rebuildTemplates: env.SANDFORK_REBUILD_TEMPLATES === "1",
    bootTimeoutMs: env.SANDFORK_VMM_BOOT_TIMEOUT_MS
      ? positiveIntegerFromEnv(env, "SANDFORK_VMM_BOOT_TIMEOUT_MS", 1)
      : undefined,
    maxTemplateImageBytes:
      positiveIntegerFromEnv(env, "SANDFORK_TEMPLATE_MAX_IMAGE_MIB", 1024) * 2 ** 20,
    readyTimeoutMs: positiveIntegerFromEnv(env, "SANDFORK_VMM_READY_TIMEOUT_MS", 15_000),
    executeGraceMs: executeGraceMsFromEnv(env),
    executeMaxWaitMs: executeMaxWaitMsFromEnv(env),
    connections: positiveIntegerFromEnv(env, "SANDFORK_VMM_CONNECTIONS", 4),
    maxInFlightPerConnection: positiveIntegerFromEnv(
      env,
      "SANDFORK_VMM_MAX_IN_FLIGHT_PER_CONNECTION",
      32,
    ),
    maxQueued: positiveIntegerFromEnv(env, "SANDFORK_VMM_MAX_QUEUED", 256),
  };
}
