// Route middleware: authentication (with the per-key rate limit) and the per-key body cap (which
// also refuses bodies that are not UTF-8).
// Both run before request validation, so an anonymous caller learns nothing about the schema.
import { isUtf8 } from "node:buffer";
import { bodyLimit } from "hono/body-limit";
import { createMiddleware } from "hono/factory";
import type { Scope } from "../db/keys.js";
import { requireScope } from "./auth/principal.js";
import type { AppEnv, GatewayContext } from "./context.js";
import { ProblemError } from "./problems.js";
import { inSpan } from "./telemetry.js";

export function authenticate(ctx: GatewayContext, scope: Scope) {
  return createMiddleware<AppEnv>(async (c, next) => {
    const principal = await inSpan(ctx.telemetry.tracer, "auth", async (span) => {
      const p = await ctx.authenticator.authenticate(c.req.header("authorization"));
      span.setAttributes({ "sandfork.key.id": p.keyId, "sandfork.auth.kind": p.token ? "token" : "api_key" });
      requireScope(p, scope);
      ctx.rateLimiter.take(p.keyId, p.limits.rateLimitPerMinute);
      return p;
    });
    c.set("principal", principal);
    await next();
  });
}

/**
 * Caps the request body at the calling key's max_body_bytes (413) and refuses a body that is not
 * UTF-8 (400: JSON must be, and decoding would otherwise put U+FFFD in the caller's code). Runs
 * after authenticate.
 */
export const limitBodyPerKey = createMiddleware<AppEnv>(async (c, next) => {
  const maxSize = c.get("principal").limits.maxBodyBytes;
  const limit = bodyLimit({
    maxSize,
    onError: () => {
      throw new ProblemError("payload-too-large", `this key accepts request bodies up to ${maxSize} bytes`, {
        extensions: { max_body_bytes: maxSize },
      });
    },
  });
  return limit(c, async () => {
    if (c.req.raw.body !== null && !isUtf8(await c.req.arrayBuffer())) {
      throw new ProblemError("malformed-request", "the request body is not valid UTF-8");
    }
    await next();
  });
});
