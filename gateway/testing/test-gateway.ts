// Test support: a gateway on a fresh database (either backend), with spans kept in memory and
// helpers to issue keys and make requests through app.request (no sockets).
import { generateKeyPairSync } from "node:crypto";
import { InMemorySpanExporter } from "@opentelemetry/sdk-trace-base";
import type { DatabaseBackend } from "../../db/client.js";
import { type AccountBalance, getBalance, type NetworkPolicy, type Scope } from "../../db/keys.js";
import { leasedUnits } from "../../db/leases.js";
import { type FreshDatabase, freshDatabase } from "../../db/testing/fresh-database.js";
import type { ExecutionRuntime } from "../../runtime/execution-runtime.js";
import { createGateway, type Gateway } from "../app.js";
import { TokenService } from "../auth/tokens.js";
import { type GatewayConfig, loadConfig } from "../config.js";
import { issueKey } from "../key-service.js";
import { createTelemetry, type Telemetry } from "../telemetry.js";

export interface TestGateway extends Gateway {
  fresh: FreshDatabase;
  config: GatewayConfig;
  telemetry: Telemetry;
  spans: InMemorySpanExporter;
  tokens: TokenService;
  /** Replace to connect or disconnect a runtime. */
  runtime: ExecutionRuntime | undefined;
  issue(options?: TestKeyOptions): Promise<{ key: string; keyId: string; accountId: string }>;
  call(method: string, path: string, options?: CallOptions): Promise<Response>;
  /**
   * The account's stored balance once this gateway has given back what its credit lease holds
   * idle, after checking that the lease the database records is the one the gateway spends.
   */
  books(accountId: string): Promise<AccountBalance | undefined>;
  dispose(): Promise<void>;
}

export interface TestKeyOptions {
  scopes?: Scope[];
  credits?: number;
  accountId?: string;
  expiresAt?: Date | null;
  rateLimitPerMinute?: number;
  maxConcurrency?: number;
  maxBodyBytes?: number;
  /** Absent: no network. */
  network?: NetworkPolicy;
}

export interface CallOptions {
  credential?: string;
  body?: unknown;
  rawBody?: string | Uint8Array;
  headers?: Record<string, string>;
}

export const TEST_AUDIENCE = "sandfork-test";

function testConfig(overrides: Partial<GatewayConfig> = {}): GatewayConfig {
  // Admission bounds the same on every machine, past what a test sends unless it sets its own;
  // no wait in line for a key's slot: a call past a key's max_concurrency is refused at once.
  const admission = { templateMaxRunning: 10_000, templateMaxQueued: 10_000, keyMaxQueued: 0 };
  return { ...loadConfig({}), dataDir: "/nonexistent", admission, ...overrides };
}

export function newTokenService(audience = TEST_AUDIENCE): TokenService {
  return new TokenService(generateKeyPairSync("ed25519").privateKey, "sandfork", audience);
}

export async function startTestGateway(
  backend: DatabaseBackend,
  options: {
    config?: Partial<GatewayConfig>;
    runtime?: ExecutionRuntime;
    fresh?: FreshDatabase;
    tokens?: TokenService;
    now?: () => number;
    shutdownSignal?: AbortSignal;
  } = {},
): Promise<TestGateway> {
  const fresh = options.fresh ?? (await freshDatabase(backend, { maxConnections: 20 }));
  const config = testConfig({ tokenAudience: TEST_AUDIENCE, ...options.config });
  const spans = new InMemorySpanExporter();
  const telemetry = createTelemetry({ env: {}, spanExporter: spans });
  const tokens = options.tokens ?? newTokenService(config.tokenAudience);
  const holder: { runtime: ExecutionRuntime | undefined } = { runtime: options.runtime };
  const gateway = createGateway({
    db: fresh.db,
    listen: fresh.listen,
    config,
    telemetry,
    tokens,
    runtime: () => holder.runtime,
    ...(options.now ? { now: options.now } : {}),
    ...(options.shutdownSignal ? { shutdownSignal: options.shutdownSignal } : {}),
  });
  await gateway.context.leases.start();
  const test: TestGateway = {
    ...gateway,
    fresh,
    config,
    telemetry,
    spans,
    tokens,
    get runtime() {
      return holder.runtime;
    },
    set runtime(r) {
      holder.runtime = r;
    },
    async issue(o = {}) {
      const { key, stored } = await issueKey(fresh.db, {
        name: "test key",
        scopes: o.scopes ?? ["execute", "usage:read"],
        accountId: o.accountId,
        credits: o.credits,
        expiresAt: o.expiresAt ?? null,
        limits: {
          rateLimitPerMinute: o.rateLimitPerMinute ?? 10_000,
          maxConcurrency: o.maxConcurrency ?? 1_000,
          maxBodyBytes: o.maxBodyBytes ?? 1024 * 1024,
        },
        network: o.network ?? null,
      });
      return { key, keyId: stored.id, accountId: stored.accountId };
    },
    async books(accountId) {
      const { leases } = gateway.context;
      const stored = await leasedUnits(fresh.db, leases.gatewayId, accountId);
      const spending = leases.leaseOn(accountId).units;
      if (stored !== spending)
        throw new Error(
          `the database records a lease of ${stored} units on ${accountId}; the gateway spends one of ${spending}`,
        );
      await leases.giveBackAll();
      return getBalance(fresh.db, accountId);
    },
    call(method, path, o = {}) {
      const headers: Record<string, string> = { ...o.headers };
      if (o.credential !== undefined) headers.authorization = `Bearer ${o.credential}`;
      let body: string | Uint8Array | undefined = o.rawBody;
      if (o.body !== undefined) {
        body = JSON.stringify(o.body);
        headers["content-type"] = "application/json";
      }
      return Promise.resolve(
        gateway.app.request(path, { method, headers, ...(body === undefined ? {} : { body }) }),
      );
    },
    async dispose() {
      await gateway.context.leases.stop();
      await telemetry.shutdown();
      if (!options.fresh) await fresh.dispose();
    },
  };
  return test;
}

/** Reads a JSON answer and checks its status (the body in the failure message). */
export async function expectJson<T>(response: Response, status: number): Promise<T> {
  const text = await response.text();
  if (response.status !== status)
    throw new Error(`expected ${status}, got ${response.status} ${text}`);
  return JSON.parse(text) as T;
}

/** Reads a problem+json answer and checks its status and `type` slug. */
export async function expectProblem(
  response: Response,
  status: number,
  slug: string,
): Promise<Record<string, unknown>> {
  const text = await response.text();
  const mismatch =
    response.status !== status ||
    !response.headers.get("content-type")?.startsWith("application/problem+json");
  const body = JSON.parse(text) as Record<string, unknown>;
  if (mismatch || body.type !== `https://sandfork.dev/problems/${slug}` || body.status !== status) {
    throw new Error(`expected ${status} ${slug}, got ${response.status} ${text}`);
  }
  return body;
}
