// Route middleware: authentication (with the per-key rate limit) and the per-key body cap (which
// also refuses bodies that are not UTF-8).
// Both run before request validation, so an anonymous caller learns nothing about the schema.
import { isUtf8 } from "node:buffer";
import type { IncomingMessage } from "node:http";
import type { Context } from "hono";
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
      span.setAttributes({
        "sandfork.key.id": p.keyId,
        "sandfork.auth.kind": p.token ? "token" : "api_key",
      });
      requireScope(p, scope);
      await ctx.rateLimiter.take(p.keyId, p.limits.rateLimitPerMinute);
      return p;
    });
    c.set("principal", principal);
    await next();
  });
}

/** application/json and the +json types: the bodies that must be UTF-8 (a file upload is any bytes). */
const JSON_MEDIA_TYPE = /^application\/([\w.-]+\+)?json\s*(;|$)/i;

/** The body stream of a request: Node's IncomingMessage when served by @hono/node-server, else the fetch body. */
function bodyStream(c: Context<AppEnv>): AsyncIterable<Uint8Array> | null {
  const incoming = (c.env as { incoming?: IncomingMessage } | undefined)?.incoming;
  if (incoming !== undefined) return incoming;
  return c.req.raw.body as AsyncIterable<Uint8Array> | null;
}

/**
 * Caps the request body at the calling key's max_body_bytes (413, declared or streamed) and
 * refuses a JSON body that is not UTF-8 (400: JSON must be, and decoding would otherwise put U+FFFD
 * in the caller's code). Runs after authenticate. The body is read here, once, straight from the
 * socket, and left in Hono's body cache: the validator and the handlers parse it from there, with
 * no web-stream Request or Response built around it (they cost more CPU than the rest of a
 * request's JSON work).
 */
export const limitBodyPerKey = createMiddleware<AppEnv>(async (c, next) => {
  const maxSize = c.get("principal").limits.maxBodyBytes;
  const tooLarge = () =>
    new ProblemError(
      "payload-too-large",
      `this key accepts request bodies up to ${maxSize} bytes`,
      {
        extensions: { max_body_bytes: maxSize },
      },
    );
  const declared = c.req.header("content-length");
  if (declared !== undefined && Number(declared) > maxSize) throw tooLarge();
  const stream = bodyStream(c);
  if (stream !== null) {
    const chunks: Uint8Array[] = [];
    let size = 0;
    try {
      for await (const chunk of stream) {
        size += chunk.byteLength;
        if (size > maxSize) throw tooLarge();
        chunks.push(chunk);
      }
    } catch (error) {
      if (error instanceof ProblemError) throw error;
      // The stream failed: the client went away mid-body (or the server's request timeout cut it
      // off). Nobody reads this answer, but it is the client's failure, not the gateway's.
      throw new ProblemError("malformed-request", "the request body ended before it was complete");
    }
    const body = Buffer.concat(chunks, size);
    // Hono keeps the body's promises there (its type names the resolved values), and derives any
    // other form from the one it holds: a JSON body is kept as text, anything else as bytes.
    const cache = c.req.bodyCache as unknown as Record<"text" | "arrayBuffer", Promise<unknown>>;
    if (JSON_MEDIA_TYPE.test(c.req.header("content-type") ?? "")) {
      if (!isUtf8(body))
        throw new ProblemError("malformed-request", "the request body is not valid UTF-8");
      cache.text = Promise.resolve(body.toString("utf8"));
    } else {
      cache.arrayBuffer = Promise.resolve(
        body.buffer.slice(body.byteOffset, body.byteOffset + size),
      );
    }
  }
  await next();
});

/**
 * Sheds an execution past its key's line or its template's (gateway/admission.ts) before its
 * body is validated: under a flood most calls are shed, each as fast as its answer comes back, so
 * a shed answer must cost next to nothing. Runs after limitBodyPerKey (the body's text is cached);
 * a body that is not JSON, or names no template, is left to validation, and a call with an
 * Idempotency-Key to the execution service (a retry gets its first request's result instead).
 */
export function shedPastBounds(ctx: GatewayContext) {
  return createMiddleware<AppEnv>(async (c, next) => {
    if (c.req.header("idempotency-key") !== undefined) return next();
    await ctx.executions.refuseWhenFull(c.get("principal"), async () => {
      try {
        const body: unknown = JSON.parse(await c.req.text());
        const template = (body as { template?: unknown } | null)?.template;
        return typeof template === "string" ? template : undefined;
      } catch {
        return undefined;
      }
    });
    await next();
  });
}
