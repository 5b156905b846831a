// Gateway configuration, read once from the environment.
import { resolve } from "node:path";
import type { KeyLimits } from "../db/keys.js";
import { DEFAULT_PRICING, type Pricing, parsePricing } from "./pricing.js";

export interface ExecutionLimits {
  defaultTimeoutMs: number;
  maxTimeoutMs: number;
  defaultMemoryMb: number;
  maxMemoryMb: number;
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
  /** How long a verified API key is trusted without asking the database again (revocation delay). */
  keyCacheTtlMs: number;
  tokenIssuer: string;
  tokenAudience: string;
  maxTokenTtlSeconds: number;
  /** PKCS#8 PEM of an Ed25519 key; unset: generated once and kept in dataDir. */
  tokenSigningKeyPem: string | undefined;
}

function integer(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value <= 0) throw new Error(`${name} must be a positive integer, got ${raw}`);
  return value;
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env): GatewayConfig {
  const dataDir = resolve(env.SANDFORK_DATA_DIR ?? ".sandfork");
  return {
    host: env.HOST ?? "127.0.0.1",
    port: integer(env, "PORT", 8787),
    databaseUrl: env.DATABASE_URL || undefined,
    dataDir,
    pricing: env.SANDFORK_PRICING ? parsePricing(env.SANDFORK_PRICING) : DEFAULT_PRICING,
    defaultKeyLimits: {
      rateLimitPerMinute: integer(env, "SANDFORK_KEY_RATE_LIMIT_PER_MINUTE", 600),
      maxConcurrency: integer(env, "SANDFORK_KEY_MAX_CONCURRENCY", 4),
      maxBodyBytes: integer(env, "SANDFORK_KEY_MAX_BODY_BYTES", 1024 * 1024),
    },
    executionLimits: {
      defaultTimeoutMs: integer(env, "SANDFORK_DEFAULT_TIMEOUT_MS", 5_000),
      maxTimeoutMs: integer(env, "SANDFORK_MAX_TIMEOUT_MS", 30_000),
      defaultMemoryMb: integer(env, "SANDFORK_DEFAULT_MEMORY_MB", 256),
      maxMemoryMb: integer(env, "SANDFORK_MAX_MEMORY_MB", 2_048),
    },
    keyCacheTtlMs: integer(env, "SANDFORK_KEY_CACHE_TTL_MS", 2_000),
    tokenIssuer: env.SANDFORK_TOKEN_ISSUER ?? "sandfork",
    tokenAudience: env.SANDFORK_TOKEN_AUDIENCE ?? "sandfork-gateway",
    maxTokenTtlSeconds: integer(env, "SANDFORK_MAX_TOKEN_TTL_SECONDS", 3_600),
    tokenSigningKeyPem: env.SANDFORK_TOKEN_SIGNING_KEY || undefined,
  };
}
