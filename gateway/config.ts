// Gateway configuration, read once from the environment.
import { availableParallelism } from "node:os";
import { resolve } from "node:path";
import type { KeyLimits } from "../db/keys.js";
import { executeMaxWaitMsFromEnv, positiveIntegerFromEnv } from "../runtime/config.js";
import type { DaemonMaxima } from "../runtime/start.js";
import { DEFAULT_PRICING, type Pricing, parsePricing } from "./pricing.js";
import { REQUEST_LIMITS } from "./request-limits.js";
import { loadSessionSettings, type SessionSettings } from "./session-settings.js";

export interface ExecutionLimits {
  defaultTimeoutMs: number;
  maxTimeoutMs: number;
  defaultMemoryMb: number;
  maxMemoryMb: number;
  /** Processes of one execution alive at once: its default and its maximum (the daemon's too). */
  maxProcesses: number;
}

/** What the daemon the gateway supervises is told: the largest limits a request may ask for. */
export function daemonMaxima(limits: ExecutionLimits): DaemonMaxima {
  return {
    timeoutMs: limits.maxTimeoutMs,
    memoryMib: limits.maxMemoryMb,
    processes: limits.maxProcesses,
  };
}

/** SANDFORK_MAX_PROCESSES: at least 1, at most what the daemon takes. */
function maxProcessesFromEnv(env: NodeJS.ProcessEnv): number {
  const value = positiveIntegerFromEnv(env, "SANDFORK_MAX_PROCESSES", 64);
  if (value > REQUEST_LIMITS.MAX_PROCESS_LIMIT)
    throw new Error(
      `SANDFORK_MAX_PROCESSES must be at most ${REQUEST_LIMITS.MAX_PROCESS_LIMIT}, got ${value}`,
    );
  return value;
}

/** Admission control's bounds (gateway/admission.ts). */
export interface AdmissionSettings {
  /** Executions of one template handed to the runtime at once. */
  templateMaxRunning: number;
  /** Executions of one template waiting for one of those; one more is shed with 503 runtime-busy. */
  templateMaxQueued: number;
  /** Executions of one key waiting for one of its max_concurrency slots; one more is shed with 429. */
  keyMaxQueued: number;
}

/**
 * The bounds from the environment. By default sized for the machine: the daemon runs 2
 * executions a core at once (`serve --max-concurrency`); the gateway hands it twice that, so that
 * the next one always waits in the daemon as a slot frees, and lets as many more wait.
 */
export function loadAdmissionSettings(
  env: NodeJS.ProcessEnv,
  cores = availableParallelism(),
): AdmissionSettings {
  return {
    templateMaxRunning: positiveIntegerFromEnv(env, "SANDFORK_TEMPLATE_MAX_RUNNING", 4 * cores),
    templateMaxQueued: nonNegativeIntegerFromEnv(env, "SANDFORK_TEMPLATE_MAX_QUEUED", 4 * cores),
    keyMaxQueued: nonNegativeIntegerFromEnv(env, "SANDFORK_KEY_MAX_QUEUED", 4),
  };
}

function nonNegativeIntegerFromEnv(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value < 0)
    throw new Error(`${name} must be a non-negative integer, got ${raw}`);
  return value;
}

function sharedLimitsFromEnv(env: NodeJS.ProcessEnv): boolean {
  const raw = env.SANDFORK_SHARED_LIMITS;
  if (raw === undefined || raw === "") return env.SANDFORK_RUNTIME === "cluster";
  if (raw !== "0" && raw !== "1")
    throw new Error(`SANDFORK_SHARED_LIMITS must be 0 or 1, got ${raw}`);
  return raw === "1";
}

/** Files executions leave under /work/out (gateway/output-files.ts). */
export interface OutputFileSettings {
  /** How long a file is kept for download after its execution. */
  ttlSeconds: number;
  /** Bytes a key's kept files may hold together; a file past it is listed but not kept. */
  quotaBytesPerKey: number;
  /** How often expired files are deleted. */
  sweepIntervalMs: number;
}

export function loadOutputFileSettings(env: NodeJS.ProcessEnv): OutputFileSettings {
  return {
    ttlSeconds: positiveIntegerFromEnv(env, "SANDFORK_OUTPUT_FILES_TTL_SECONDS", 86_400),
    quotaBytesPerKey: positiveIntegerFromEnv(
      env,
      "SANDFORK_OUTPUT_FILES_QUOTA_BYTES_PER_KEY",
      256 * 1024 * 1024,
    ),
    sweepIntervalMs: positiveIntegerFromEnv(env, "SANDFORK_OUTPUT_FILES_SWEEP_INTERVAL_MS", 60_000),
  };
}

/** The embedded database's folder inside dataDir. */
export const EMBEDDED_DATABASE_DIR = "data";

export interface TemplateBuildSettings {
  /** Builds running at once (SANDFORK_TEMPLATE_BUILDS). */
  maxRunning: number;
  /** Builds waiting for one of those; one more is refused (SANDFORK_TEMPLATE_BUILDS_QUEUED). */
  maxQueued: number;
}

export interface GatewayConfig {
  host: string;
  port: number;
  /** Set: PostgreSQL via postgres.js. Unset: embedded PGlite in dataDir. */
  databaseUrl: string | undefined;
  /** Embedded database and the token signing key live here. */
  dataDir: string;
  pricing: Pricing;
  /** Limits a new key gets unless its creator sets others. */
  defaultKeyLimits: KeyLimits;
  executionLimits: ExecutionLimits;
  admission: AdmissionSettings;
  sessions: SessionSettings;
  outputFiles: OutputFileSettings;
  /** Template builds through the API (gateway/template-service.ts). */
  templateBuilds: TemplateBuildSettings;
  /** How long a verified API key is trusted without asking the database again (revocation delay). */
  keyCacheTtlMs: number;
  tokenIssuer: string;
  tokenAudience: string;
  maxTokenTtlSeconds: number;
  /** PKCS#8 PEM of an Ed25519 key; unset: generated once and kept in dataDir. */
  tokenSigningKeyPem: string | undefined;
  /** Time a client has to send its request headers (a slowloris dribbles them); then it is cut off. */
  headersTimeoutMs: number;
  /** Time a client has to send its whole request; the response (an execution's run) is not counted. */
  requestTimeoutMs: number;
  /**
   * How long past a program's timeout the gateway waits for the runtime before it answers
   * runtime-failed: the runtime client's longest wait (SANDFORK_VMM_EXECUTE_MAX_WAIT_MS, what it
   * waits for a daemon that stays alive) and 5 s more, so that the client's typed answer always
   * comes first.
   */
  runtimeGraceMs: number;
  /** On PostgreSQL: how often the holds of gateways that are gone are released (server.ts). */
  recoveryIntervalMs: number;
  /**
   * Per-key rate and concurrency limits taken in the database, counted across every gateway
   * (SANDFORK_SHARED_LIMITS; default on with SANDFORK_RUNTIME=cluster, off otherwise).
   */
  sharedLimits: boolean;
  /**
   * The nice value of the event loop's thread (SANDFORK_GATEWAY_NICE, -20 to 19); undefined: the
   * one it started with. The daemon keeps that one (runtime/event-loop-priority.ts).
   */
  eventLoopNice: number | undefined;
  /**
   * The real-time priority of the event loop's thread (SANDFORK_GATEWAY_REALTIME_PRIORITY, 1 to
   * 99: SCHED_RR, ahead of every thread that is not real-time); undefined: not real-time. Its
   * children start with the ordinary policy (runtime/event-loop-priority.ts).
   */
  eventLoopRealtimePriority: number | undefined;
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env): GatewayConfig {
  const dataDir = resolve(env.SANDFORK_DATA_DIR ?? ".sandfork");
  return {
    host: env.HOST ?? "127.0.0.1",
    port: positiveIntegerFromEnv(env, "PORT", 8787),
    databaseUrl: env.DATABASE_URL || undefined,
    dataDir,
    pricing: env.SANDFORK_PRICING ? parsePricing(env.SANDFORK_PRICING) : DEFAULT_PRICING,
    defaultKeyLimits: {
      rateLimitPerMinute: positiveIntegerFromEnv(env, "SANDFORK_KEY_RATE_LIMIT_PER_MINUTE", 600),
      maxConcurrency: positiveIntegerFromEnv(env, "SANDFORK_KEY_MAX_CONCURRENCY", 4),
      maxBodyBytes: positiveIntegerFromEnv(env, "SANDFORK_KEY_MAX_BODY_BYTES", 1024 * 1024),
    },
    executionLimits: {
      defaultTimeoutMs: positiveIntegerFromEnv(env, "SANDFORK_DEFAULT_TIMEOUT_MS", 5_000),
      maxTimeoutMs: positiveIntegerFromEnv(env, "SANDFORK_MAX_TIMEOUT_MS", 30_000),
      defaultMemoryMb: positiveIntegerFromEnv(env, "SANDFORK_DEFAULT_MEMORY_MB", 256),
      maxMemoryMb: positiveIntegerFromEnv(env, "SANDFORK_MAX_MEMORY_MB", 2_048),
      maxProcesses: maxProcessesFromEnv(env),
    },
    admission: loadAdmissionSettings(env),
    sessions: loadSessionSettings(env),
    outputFiles: loadOutputFileSettings(env),
    templateBuilds: {
      maxRunning: positiveIntegerFromEnv(env, "SANDFORK_TEMPLATE_BUILDS", 1),
      maxQueued: nonNegativeIntegerFromEnv(env, "SANDFORK_TEMPLATE_BUILDS_QUEUED", 8),
    },
    keyCacheTtlMs: positiveIntegerFromEnv(env, "SANDFORK_KEY_CACHE_TTL_MS", 2_000),
    tokenIssuer: env.SANDFORK_TOKEN_ISSUER ?? "sandfork",
    tokenAudience: env.SANDFORK_TOKEN_AUDIENCE ?? "sandfork-gateway",
    maxTokenTtlSeconds: positiveIntegerFromEnv(env, "SANDFORK_MAX_TOKEN_TTL_SECONDS", 3_600),
    tokenSigningKeyPem: env.SANDFORK_TOKEN_SIGNING_KEY || undefined,
    headersTimeoutMs: positiveIntegerFromEnv(env, "SANDFORK_HEADERS_TIMEOUT_MS", 10_000),
    requestTimeoutMs: positiveIntegerFromEnv(env, "SANDFORK_REQUEST_TIMEOUT_MS", 30_000),
    runtimeGraceMs: executeMaxWaitMsFromEnv(env) + 5_000,
    recoveryIntervalMs: positiveIntegerFromEnv(env, "SANDFORK_RECOVERY_INTERVAL_MS", 5_000),
    sharedLimits: sharedLimitsFromEnv(env),
    eventLoopNice: integerFromEnv(env, "SANDFORK_GATEWAY_NICE", -20, 19),
    eventLoopRealtimePriority: integerFromEnv(env, "SANDFORK_GATEWAY_REALTIME_PRIORITY", 1, 99),
  };
}

function integerFromEnv(
  env: NodeJS.ProcessEnv,
  name: string,
  min: number,
  max: number,
): number | undefined {
  const raw = env[name];
  if (raw === undefined || raw === "") return undefined;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < min || value > max)
    throw new Error(`${name} must be an integer from ${min} to ${max}, got ${JSON.stringify(raw)}`);
  return value;
}
