// Builds the gateway's Hono app from its dependencies. No I/O here beyond what requests do.

import { join } from "node:path";
import { OpenAPIHono } from "@hono/zod-openapi";
import { trace } from "@opentelemetry/api";
import { HTTPException } from "hono/http-exception";
import type { Database, Listen } from "../db/client.js";
import { BalanceLimitError, MAX_BALANCE_UNITS } from "../db/keys.js";
import { journalOf } from "../db/record-journal.js";
import type { ExecutionRuntime } from "../runtime/execution-runtime.js";
import { Admission } from "./admission.js";
import { Authenticator } from "./auth/authenticator.js";
import type { TokenService } from "./auth/tokens.js";
import type { GatewayConfig } from "./config.js";
import type { AppEnv, GatewayContext } from "./context.js";
import { CreditLeases } from "./credit-leases.js";
import { registerDocs } from "./docs.js";
import { ExecutionService } from "./execution-service.js";
import { httpTelemetry } from "./http-telemetry.js";
import {
  ConcurrencyLimiter,
  RateLimiter,
  SharedRateLimiter,
  TokenExecutionCounter,
} from "./limits.js";
import { OutputFiles } from "./output-files.js";
import { ProblemError, problemResponse } from "./problems.js";
import { registerConsole } from "./routes/console.js";
import { registerExecutionRoutes } from "./routes/executions.js";
import { registerKeyRoutes } from "./routes/keys.js";
import { registerMcpRoutes } from "./routes/mcp.js";
import { registerSessionRoutes } from "./routes/sessions.js";
import { registerSystemRoutes } from "./routes/system.js";
import { registerTemplateRoutes } from "./routes/templates.js";
import { registerTokenRoutes } from "./routes/tokens.js";
import { registerToolRoutes } from "./routes/tools.js";
import { registerUsageRoutes } from "./routes/usage.js";
import { SessionService } from "./session-service.js";
import { SERVICE_VERSION, type Telemetry } from "./telemetry.js";
import { TemplateService } from "./template-service.js";
import { ToolRunner } from "./tools/runner.js";

export interface GatewayDeps {
  db: Database;
  /** The database's LISTEN, where other gateways ask for idle credit leases (CreditLeases.start). */
  listen?: Listen;
  /** This process's id, recorded on the executions it reserves; default: a new random one. */
  gatewayId?: string;
  config: GatewayConfig;
  telemetry: Telemetry;
  tokens: TokenService;
  /** The connected runtime, if any; asked on every request so one can attach later. */
  runtime: () => ExecutionRuntime | undefined;
  shutdownSignal?: AbortSignal;
  now?: () => number;
}

export interface Gateway {
  app: OpenAPIHono<AppEnv>;
  context: GatewayContext;
}

// A credit lease grows by this many holds of the execution that found it short: at concurrency
// 16 a lease outlasts many batches. On PostgreSQL kept for half a minute after nothing holds it
// (or until another gateway asks for it), so that calls seconds apart do not take and give back
// credits each time; on embedded PGlite, which one gateway owns, kept until shutdown.
const HOLDS_PER_LEASE = 32;
const LEASE_LINGER_MS = 30_000;

const VALIDATION_TARGETS: Record<string, string> = {
  json: "request body",
  query: "query string",
  param: "path",
  header: "request headers",
};

export const OPENAPI_PATH = "/openapi.json";
export { DOCS_ASSET_ROUTE, DOCS_PATH } from "./docs.js";

export function createGateway(deps: GatewayDeps): Gateway {
  const now = deps.now ?? Date.now;
  const gatewayId = deps.gatewayId ?? crypto.randomUUID();
  // Executions and session cells share each key's concurrency limit (in the database too when
  // the limits are shared by a cluster's gateways).
  const { sharedLimits } = deps.config;
  const concurrency = new ConcurrencyLimiter(
    sharedLimits ? { db: deps.db, gatewayId, log: (line) => console.error(line) } : undefined,
  );
  const shutdownSignal = deps.shutdownSignal ?? new AbortController().signal;
  // Embedded PGlite (the database with a record journal) is this process's alone: no other
  // gateway revokes a key or waits for credits there, so neither a key's check nor a lease expires.
  const soleGateway = journalOf(deps.db) !== undefined;
  const keyCacheTtlMs = soleGateway ? Number.POSITIVE_INFINITY : deps.config.keyCacheTtlMs;
  const leases = new CreditLeases({
    db: deps.db,
    gatewayId,
    holdsPerLease: HOLDS_PER_LEASE,
    lingerMs: soleGateway ? null : LEASE_LINGER_MS,
    listen: deps.listen,
    keyCheckMs: keyCacheTtlMs,
  });
  const outputFiles = new OutputFiles(deps.db, deps.config.outputFiles);
  const templates = new TemplateService({
    db: deps.db,
    runtime: deps.runtime,
    settings: deps.config.templateBuilds,
    gatewayId,
    buildsDir: join(deps.config.dataDir, "template-builds"),
    log: (line) => console.error(line),
  });
  const context: GatewayContext = {
    db: deps.db,
    config: deps.config,
    telemetry: deps.telemetry,
    tokens: deps.tokens,
    runtime: deps.runtime,
    authenticator: new Authenticator(deps.db, deps.tokens, keyCacheTtlMs, now),
    rateLimiter: sharedLimits ? new SharedRateLimiter(deps.db) : new RateLimiter(now),
    leases,
    outputFiles,
    executions: new ExecutionService({
      db: deps.db,
      gatewayId,
      leases,
      runtime: deps.runtime,
      templates,
      pricing: deps.config.pricing,
      limits: deps.config.executionLimits,
      admission: new Admission(
        deps.config.admission,
        concurrency,
        deps.telemetry.instruments,
        shutdownSignal,
      ),
      tokenExecutions: new TokenExecutionCounter(now),
      telemetry: deps.telemetry,
      shutdownSignal,
      runtimeGraceMs: deps.config.runtimeGraceMs,
      outputFiles,
    }),
    sessions: new SessionService({
      db: deps.db,
      gatewayId,
      runtime: deps.runtime,
      settings: deps.config.sessions,
      limits: deps.config.executionLimits,
      pricing: deps.config.pricing,
      telemetry: deps.telemetry,
      concurrency,
      leases,
      templates,
      now,
    }),
    templates,
  };

  const app = new OpenAPIHono<AppEnv>({
    defaultHook: (result) => {
      if (!result.success) {
        const where = VALIDATION_TARGETS[result.target] ?? result.target;
        throw new ProblemError("validation-failed", `the ${where} does not match the schema`, {
          extensions: {
            errors: result.error.issues.map((issue) => ({
              path: issue.path.join("."),
              message: issue.message,
            })),
          },
        });
      }
    },
  });

  app.use("*", httpTelemetry(deps.telemetry));

  // FaaS attributes on the server span; the first request this instance serves is the cold start.
  let coldStart = true;
  app.use("*", async (c, next) => {
    const incoming = c.req.header("x-request-id");
    const requestId =
      incoming !== undefined && /^[\w.:-]{1,128}$/.test(incoming) ? incoming : crypto.randomUUID();
    c.set("requestId", requestId);
    trace.getActiveSpan()?.setAttributes({
      "faas.trigger": "http",
      "faas.invocation_id": requestId,
      "faas.coldstart": coldStart,
    });
    coldStart = false;
    c.header("x-request-id", requestId);
    await next();
  });

  app.onError((error, c) => {
    const problem = toProblem(error);
    if (problem.slug === "internal-error") console.error("unhandled error", error);
    deps.telemetry.instruments.rejectedRequests.add(1, { problem: problem.slug });
    const response = problemResponse(problem, c.req.path);
    response.headers.set("x-request-id", c.get("requestId") ?? "");
    return response;
  });
  app.notFound((c) =>
    problemResponse(
      new ProblemError("not-found", `no route for ${c.req.method} ${c.req.path}`),
      c.req.path,
    ),
  );

  app.openAPIRegistry.registerComponent("securitySchemes", "bearerAuth", {
    type: "http",
    scheme: "bearer",
    description: "An API key (sfk_…) or a token minted with POST /v1/tokens",
  });
  registerExecutionRoutes(app, context);
  registerTemplateRoutes(app, context);
  const tools = new ToolRunner(context);
  registerToolRoutes(app, context, tools);
  registerMcpRoutes(app, context, tools);
  registerSessionRoutes(app, context, context.sessions);
  registerTokenRoutes(app, context);
  registerUsageRoutes(app, context);
  registerKeyRoutes(app, context);
  registerSystemRoutes(app, context);

  app.doc31(OPENAPI_PATH, {
    openapi: "3.1.0",
    info: {
      title: "Sandfork gateway",
      version: SERVICE_VERSION,
      description:
        "Runs code in microVMs forked from warm templates, metered in integer credits. Errors are RFC 9457 " +
        "problem+json; each kind has a stable `type` under https://sandfork.dev/problems/.",
    },
  });
  registerDocs(app, OPENAPI_PATH);
  registerConsole(app);
  return { app, context };
}

function toProblem(error: unknown): ProblemError {
  if (error instanceof ProblemError) return error;
  if (error instanceof BalanceLimitError)
    return new ProblemError("balance-limit", error.message, {
      extensions: { max_balance_units: MAX_BALANCE_UNITS },
    });
  if (error instanceof HTTPException) {
    if (error.status === 400) return new ProblemError("malformed-request", error.message);
    if (error.status === 413) return new ProblemError("payload-too-large", error.message);
    if (error.status === 415)
      return new ProblemError(
        "unsupported-media-type",
        "send the body with Content-Type: application/json",
      );
  }
  return new ProblemError("internal-error", "the gateway failed to handle this request");
}
