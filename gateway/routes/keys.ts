// Operator routes (admin scope): POST/GET/DELETE /v1/keys and POST /v1/accounts/{id}/credits.
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import { grantCredits, listKeys, revokeKey, setKeyNetwork } from "../../db/keys.js";
import type { AppEnv, GatewayContext } from "../context.js";
import { issueKey } from "../key-service.js";
import { authenticate, limitBodyPerKey } from "../middleware.js";
import { networkPolicyOf } from "../network-policy.js";
import { ProblemError } from "../problems.js";
import {
  BalanceSchema,
  CreatedKeySchema,
  CreateKeyRequestSchema,
  CreditGrantSchema,
  IdParamSchema,
  KeyNetworkRequestSchema,
  KeySchema,
} from "../schemas.js";
import { AUTHENTICATED, balanceJson, keyJson, problemResponses } from "./openapi-helpers.js";

export function registerKeyRoutes(app: OpenAPIHono<AppEnv>, ctx: GatewayContext): void {
  const admin = authenticate(ctx, "admin");

  const createKey = createRoute({
    method: "post",
    path: "/v1/keys",
    summary: "Create an API key (the secret is in this response only)",
    security: AUTHENTICATED,
    middleware: [admin, limitBodyPerKey] as const,
    request: {
      body: { required: true, content: { "application/json": { schema: CreateKeyRequestSchema } } },
    },
    responses: {
      201: {
        description: "The new key, with its secret",
        content: { "application/json": { schema: CreatedKeySchema } },
      },
      ...problemResponses(400, 401, 403, 404, 413, 415, 422, 429),
    },
  });
  app.openapi(createKey, async (c) => {
    const body = c.req.valid("json");
    const defaults = ctx.config.defaultKeyLimits;
    const { key, stored } = await issueKey(ctx.db, {
      name: body.name,
      scopes: body.scopes ?? ["execute", "usage:read"],
      accountId: body.account_id,
      credits: body.credits,
      expiresAt:
        body.expires_in_seconds === undefined
          ? null
          : new Date(Date.now() + body.expires_in_seconds * 1000),
      limits: {
        rateLimitPerMinute: body.rate_limit_per_minute ?? defaults.rateLimitPerMinute,
        maxConcurrency: body.max_concurrency ?? defaults.maxConcurrency,
        maxBodyBytes: body.max_body_bytes ?? defaults.maxBodyBytes,
      },
      network: body.network === undefined ? null : networkPolicyOf(body.network),
    });
    return c.json({ ...keyJson(stored), key }, 201);
  });

  const listRoute = createRoute({
    method: "get",
    path: "/v1/keys",
    summary: "List API keys (hints only, never secrets)",
    security: AUTHENTICATED,
    middleware: [admin] as const,
    request: { query: z.object({ account_id: z.string().uuid().optional() }) },
    responses: {
      200: {
        description: "Keys, newest first",
        content: { "application/json": { schema: z.object({ keys: z.array(KeySchema) }) } },
      },
      ...problemResponses(401, 403, 422, 429),
    },
  });
  app.openapi(listRoute, async (c) => {
    const keys = await listKeys(ctx.db, c.req.valid("query").account_id);
    return c.json({ keys: keys.map(keyJson) }, 200);
  });

  const revokeRoute = createRoute({
    method: "delete",
    path: "/v1/keys/{id}",
    summary: "Revoke an API key (this gateway at once, others within the key cache TTL)",
    security: AUTHENTICATED,
    middleware: [admin] as const,
    request: { params: IdParamSchema },
    responses: {
      200: {
        description: "The revoked key",
        content: { "application/json": { schema: KeySchema } },
      },
      ...problemResponses(401, 403, 404, 422, 429),
    },
  });
  app.openapi(revokeRoute, async (c) => {
    const { id } = c.req.valid("param");
    const revoked = await revokeKey(ctx.db, id);
    if (revoked === undefined) throw new ProblemError("not-found", `no key ${id}`);
    ctx.authenticator.forget(id);
    ctx.leases.forgetKey(id);
    return c.json(keyJson(revoked), 200);
  });

  const networkRoute = createRoute({
    method: "put",
    path: "/v1/keys/{id}/network",
    summary: "Set or clear a key's network policy",
    description:
      "What the key's executions, cells and tokens may reach over the network; null takes the network away. " +
      "Calls may narrow it, never widen it. This gateway applies it at once, others within the key cache TTL; " +
      "tokens minted before keep the policy they were minted with until they expire.",
    security: AUTHENTICATED,
    middleware: [admin, limitBodyPerKey] as const,
    request: {
      params: IdParamSchema,
      body: {
        required: true,
        content: { "application/json": { schema: KeyNetworkRequestSchema } },
      },
    },
    responses: {
      200: {
        description: "The key with its new policy",
        content: { "application/json": { schema: KeySchema } },
      },
      ...problemResponses(400, 401, 403, 404, 413, 415, 422, 429),
    },
  });
  app.openapi(networkRoute, async (c) => {
    const { id } = c.req.valid("param");
    const { network } = c.req.valid("json");
    const key = await setKeyNetwork(ctx.db, id, network === null ? null : networkPolicyOf(network));
    if (key === undefined) throw new ProblemError("not-found", `no key ${id}`);
    ctx.authenticator.forget(id);
    return c.json(keyJson(key), 200);
  });

  const grantRoute = createRoute({
    method: "post",
    path: "/v1/accounts/{id}/credits",
    summary: "Grant credits to an account",
    security: AUTHENTICATED,
    middleware: [admin, limitBodyPerKey] as const,
    request: {
      params: IdParamSchema,
      body: { required: true, content: { "application/json": { schema: CreditGrantSchema } } },
    },
    responses: {
      200: {
        description: "The account's balance after the grant",
        content: { "application/json": { schema: BalanceSchema } },
      },
      ...problemResponses(400, 401, 403, 404, 413, 415, 422, 429),
    },
  });
  app.openapi(grantRoute, async (c) => {
    const { id } = c.req.valid("param");
    const balance = await grantCredits(ctx.db, id, c.req.valid("json").units);
    if (balance === undefined) throw new ProblemError("not-found", `no account ${id}`);
    return c.json(
      { account_id: balance.accountId, ...balanceJson(ctx.leases.asSeenByCallers(balance)) },
      200,
    );
  });
}
