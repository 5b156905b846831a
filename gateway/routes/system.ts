// GET /healthz and GET /metrics (unauthenticated: meant for the operator's network).
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import { ping } from "../../db/prepared.js";
import type { AppEnv, GatewayContext } from "../context.js";
import { HealthSchema } from "../schemas.js";

/** How long /healthz waits for the runtime's own health answer, and /metrics for its admission. */
const RUNTIME_HEALTH_TIMEOUT_MS = 2_000;

/** Asks the runtime for its admission (its lines and busy answers) for /metrics; not shown when it cannot say. */
async function refreshRuntimeAdmission(ctx: GatewayContext): Promise<void> {
  const runtime = ctx.runtime();
  const holder = ctx.telemetry.instruments.runtimeAdmission;
  try {
    holder.latest = await runtime?.admission?.(AbortSignal.timeout(RUNTIME_HEALTH_TIMEOUT_MS));
  } catch {
    holder.latest = undefined;
  }
}

/** "connected" when a runtime is attached and (if it can tell) says executions can run now. */
async function runtimeHealth(
  ctx: GatewayContext,
): Promise<{ runtime: "connected" | "unavailable"; runtime_detail?: string }> {
  const runtime = ctx.runtime();
  if (runtime === undefined) return { runtime: "unavailable" };
  if (runtime.health === undefined) return { runtime: "connected" };
  try {
    const health = await runtime.health(AbortSignal.timeout(RUNTIME_HEALTH_TIMEOUT_MS));
    return { runtime: health.ok ? "connected" : "unavailable", runtime_detail: health.detail };
  } catch (error) {
    return {
      runtime: "unavailable",
      runtime_detail: error instanceof Error ? error.message : String(error),
    };
  }
}

export function registerSystemRoutes(app: OpenAPIHono<AppEnv>, ctx: GatewayContext): void {
  const health = createRoute({
    method: "get",
    path: "/healthz",
    summary: "Liveness and dependencies",
    description: "200 while the database answers; `runtime` says whether executions can run.",
    responses: {
      200: { description: "Healthy", content: { "application/json": { schema: HealthSchema } } },
      503: {
        description: "The database does not answer",
        content: { "application/json": { schema: HealthSchema } },
      },
    },
  });
  app.openapi(health, async (c) => {
    let database: "ok" | "error" = "ok";
    try {
      await ping(ctx.db);
    } catch {
      database = "error";
    }
    const runtime = await runtimeHealth(ctx);
    const body = {
      status: database === "ok" && runtime.runtime === "connected" ? "ok" : "degraded",
      database,
      ...runtime,
    } as const;
    return database === "ok" ? c.json(body, 200) : c.json(body, 503);
  });

  const metrics = createRoute({
    method: "get",
    path: "/metrics",
    summary: "Prometheus metrics: HTTP requests, executions, billed units, rejections",
    responses: {
      200: {
        description: "Prometheus text exposition format",
        content: { "text/plain": { schema: z.string() } },
      },
    },
  });
  app.openapi(metrics, async (c) => {
    await refreshRuntimeAdmission(ctx);
    const text = await ctx.telemetry.prometheusText();
    return c.text(text, 200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" });
  });
}
