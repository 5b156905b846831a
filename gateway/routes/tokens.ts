// POST /v1/tokens: a key holder mints a short-lived token for an untrusted client or agent.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import type { Scope } from "../../db/keys.js";
import { hasScope } from "../auth/principal.js";
import type { AppEnv, GatewayContext } from "../context.js";
import { authenticate, limitBodyPerKey } from "../middleware.js";
import { networkGrant, networkPolicyOf } from "../network-policy.js";
import { ProblemError } from "../problems.js";
import { TokenRequestSchema, TokenSchema } from "../schemas.js";
import { AUTHENTICATED, problemResponses } from "./openapi-helpers.js";

const DEFAULT_TTL_SECONDS = 900;

export function registerTokenRoutes(app: OpenAPIHono<AppEnv>, ctx: GatewayContext): void {
  const mintRoute = createRoute({
    method: "post",
    path: "/v1/tokens",
    summary: "Mint a short-lived execute-only token (EdDSA JWT) from an API key",
    description:
      "The token carries the key's identity, limits and network policy (narrowed by `network`, if given); it is verified by signature alone.",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "execute"), limitBodyPerKey] as const,
    request: {
      body: { required: true, content: { "application/json": { schema: TokenRequestSchema } } },
    },
    responses: {
      201: { description: "The token", content: { "application/json": { schema: TokenSchema } } },
      ...problemResponses(400, 401, 403, 413, 415, 422, 429),
    },
  });
  app.openapi(mintRoute, async (c) => {
    const principal = c.get("principal");
    if (principal.token !== null)
      throw new ProblemError("insufficient-scope", "tokens cannot mint tokens; use an API key");
    const body = c.req.valid("json");
    const ttlSeconds = Math.min(
      body.ttl_seconds ?? DEFAULT_TTL_SECONDS,
      ctx.config.maxTokenTtlSeconds,
    );
    const templates = body.templates ?? null;
    const maxExecutions = body.max_executions ?? null;
    const scopes: Scope[] = [...new Set<Scope>(body.scopes ?? ["execute"])];
    const missing = scopes.filter((scope) => !hasScope(principal, scope));
    if (missing.length > 0)
      throw new ProblemError("insufficient-scope", `this key does not hold ${missing.join(", ")}`);
    const network = body.network === undefined ? undefined : networkPolicyOf(body.network);
    // Refuses network on a key without a policy, as an execution asking for it is.
    networkGrant(principal.network, network);
    const minted = await ctx.tokens.mint(principal, {
      ttlSeconds,
      templates,
      maxExecutions,
      scopes,
      network,
    });
    return c.json(
      {
        token: minted.token,
        token_id: minted.id,
        expires_at: minted.expiresAt.toISOString(),
        templates,
        max_executions: maxExecutions,
        scopes,
        network: body.network ?? null,
      },
      201,
    );
  });
}
