// GET /v1/usage: what a key used in a period, and its account's balance.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import { usageSeries } from "../../db/execution-list.js";
import { findKeyById, getBalance } from "../../db/keys.js";
import { keptBytesOfKey } from "../../db/output-files.js";
import { sessionUsageForKey } from "../../db/sessions.js";
import { usageForKey } from "../../db/usage.js";
import { hasScope } from "../auth/principal.js";
import type { AppEnv, GatewayContext } from "../context.js";
import { authenticate } from "../middleware.js";
import { ProblemError } from "../problems.js";
import {
  UsageQuerySchema,
  UsageSchema,
  UsageSeriesQuerySchema,
  UsageSeriesSchema,
} from "../schemas.js";
import { AUTHENTICATED, balanceJson, problemResponses } from "./openapi-helpers.js";

const BUCKET_MS = { hour: 3_600_000, day: 86_400_000 } as const;
const MAX_BUCKETS = 1_000;
const startOfUtcMonth = (now: Date) =>
  new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1));

export function registerUsageRoutes(app: OpenAPIHono<AppEnv>, ctx: GatewayContext): void {
  const usageRoute = createRoute({
    method: "get",
    path: "/v1/usage",
    summary: "Usage of a key over a period, with the account's balance",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "usage:read")] as const,
    request: { query: UsageQuerySchema },
    responses: {
      200: { description: "Usage", content: { "application/json": { schema: UsageSchema } } },
      ...problemResponses(401, 403, 404, 422, 429),
    },
  });
  app.openapi(usageRoute, async (c) => {
    const principal = c.get("principal");
    const query = c.req.valid("query");
    let keyId = principal.keyId;
    let accountId = principal.accountId;
    if (query.key_id !== undefined && query.key_id !== principal.keyId) {
      if (!hasScope(principal, "admin"))
        throw new ProblemError(
          "insufficient-scope",
          "only an admin key may read another key's usage",
        );
      const key = await findKeyById(ctx.db, query.key_id);
      if (key === undefined) throw new ProblemError("not-found", `no key ${query.key_id}`);
      keyId = key.id;
      accountId = key.accountId;
    }
    const now = new Date();
    const to = query.to === undefined ? now : new Date(query.to);
    const from = query.from === undefined ? startOfUtcMonth(now) : new Date(query.from);
    if (from >= to) throw new ProblemError("validation-failed", "`from` must be before `to`");
    const [usage, sessions, balance, outputFileBytes] = await Promise.all([
      usageForKey(ctx.db, keyId, from, to),
      sessionUsageForKey(ctx.db, keyId, from, to),
      getBalance(ctx.db, accountId),
      keptBytesOfKey(ctx.db, keyId, now),
    ]);
    if (balance === undefined) throw new ProblemError("not-found", `no account ${accountId}`);
    return c.json(
      {
        key_id: keyId,
        account_id: accountId,
        from: from.toISOString(),
        to: to.toISOString(),
        unit: ctx.config.pricing.unitName,
        executions: usage.executions,
        units: usage.units + sessions.units,
        by_template: usage.byTemplate,
        network: {
          bytes_in: usage.network.bytesIn,
          bytes_out: usage.network.bytesOut,
          refused: usage.network.refused,
        },
        sessions: {
          units: sessions.units,
          running_gib_seconds: sessions.runningGibSeconds,
          checkpoint_gib_hours: sessions.checkpointGibHours,
        },
        output_files: {
          bytes: outputFileBytes,
          quota_bytes: ctx.config.outputFiles.quotaBytesPerKey,
        },
        balance: balanceJson(ctx.leases.asSeenByCallers(balance)),
      },
      200,
    );
  });

  const seriesRoute = createRoute({
    method: "get",
    path: "/v1/usage/series",
    summary: "The calling key's units and executions per UTC hour or day, by template",
    description: "Buckets with no executions are left out. At most 1000 buckets.",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "usage:read")] as const,
    request: { query: UsageSeriesQuerySchema },
    responses: {
      200: {
        description: "Usage by bucket and template",
        content: { "application/json": { schema: UsageSeriesSchema } },
      },
      ...problemResponses(401, 403, 422, 429),
    },
  });
  app.openapi(seriesRoute, async (c) => {
    const principal = c.get("principal");
    const query = c.req.valid("query");
    const bucket = query.bucket ?? "hour";
    const size = BUCKET_MS[bucket];
    const to =
      Math.ceil((query.to === undefined ? Date.now() : Date.parse(query.to)) / size) * size;
    const from =
      Math.floor((query.from === undefined ? to - 24 * size : Date.parse(query.from)) / size) *
      size;
    if (from >= to) throw new ProblemError("validation-failed", "`from` must be before `to`");
    if ((to - from) / size > MAX_BUCKETS)
      throw new ProblemError("validation-failed", `at most ${MAX_BUCKETS} buckets`);
    const points = await usageSeries(ctx.db, principal.keyId, bucket, new Date(from), new Date(to));
    return c.json(
      {
        key_id: principal.keyId,
        bucket,
        from: new Date(from).toISOString(),
        to: new Date(to).toISOString(),
        unit: ctx.config.pricing.unitName,
        points: points.map((p) => ({
          at: p.at.toISOString(),
          template: p.template,
          executions: p.executions,
          units: p.units,
        })),
      },
      200,
    );
  });
}
