// POST /v1/executions, GET /v1/executions/{id}, GET /v1/executions.
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import { trace } from "@opentelemetry/api";
import { findExecution } from "../../db/billing.js";
import { listExecutions } from "../../db/execution-list.js";
import { findOutputFile } from "../../db/output-files.js";
import { hasScope } from "../auth/principal.js";
import type { AppEnv, GatewayContext } from "../context.js";
import { authenticate, limitBodyPerKey, shedPastBounds } from "../middleware.js";
import { ProblemError } from "../problems.js";
import {
  ExecutionListQuerySchema,
  ExecutionListSchema,
  ExecutionSchema,
  executionRequestSchema,
  IdParamSchema,
} from "../schemas.js";
import { EVENT_STREAM, streamExecution, wantsStream } from "../streamed-execution.js";
import {
  AUTHENTICATED,
  executionJson,
  filePathOfUrl,
  filePathParams,
  IDEMPOTENCY_KEY_HEADER,
  idempotencyKeyOf,
  problemResponses,
} from "./openapi-helpers.js";

export function registerExecutionRoutes(app: OpenAPIHono<AppEnv>, ctx: GatewayContext): void {
  const unit = ctx.config.pricing.unitName;

  const execute = createRoute({
    method: "post",
    path: "/v1/executions",
    summary: "Run code in a fresh sandbox forked from a template",
    description:
      "Reserves the worst-case cost (the full timeout), runs, then charges the actual cost. With an Idempotency-Key, " +
      "a retry returns the first result (header Idempotent-Replayed: true) and is billed once. With Accept: text/event-stream " +
      'or "stream": true the answer is a Server-Sent Events stream: `started` ({id}), `output` ({stream: stdout|stderr, data}) ' +
      "as the program writes, then `execution` with the body of the plain answer, or `error` with a problem body. Billing is " +
      "the same; a client that disconnects stops nothing and is billed for what ran.",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "execute"), limitBodyPerKey, shedPastBounds(ctx)] as const,
    parameters: [IDEMPOTENCY_KEY_HEADER],
    request: {
      body: {
        required: true,
        content: {
          "application/json": { schema: executionRequestSchema(ctx.config.executionLimits) },
        },
      },
    },
    responses: {
      200: {
        description: "The execution ended (see status and exit_code); or, streamed, its events",
        content: {
          "application/json": { schema: ExecutionSchema },
          [EVENT_STREAM]: {
            schema: z
              .string()
              .openapi({ description: "event: started | output | execution | error; data: JSON" }),
          },
        },
      },
      ...problemResponses(400, 401, 402, 403, 409, 413, 415, 422, 429, 502, 503),
    },
  });
  app.openapi(execute, async (c) => {
    const idempotencyKey = idempotencyKeyOf(c.req.header("idempotency-key"));
    const input = c.req.valid("json");
    if (wantsStream(c.req.header("accept"), input))
      return streamExecution(c, ctx, input, idempotencyKey);
    const { record, replayed, output } = await ctx.executions.execute(
      c.get("principal"),
      input,
      idempotencyKey,
    );
    trace.getActiveSpan()?.setAttribute("sandfork.execution.id", record.id);
    if (replayed) c.header("idempotent-replayed", "true");
    return c.json(executionJson(record, unit, output), 200);
  });

  const getExecution = createRoute({
    method: "get",
    path: "/v1/executions/{id}",
    summary: "Fetch an execution recorded for the calling key",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "execute")] as const,
    request: { params: IdParamSchema },
    responses: {
      200: {
        description: "The execution",
        content: { "application/json": { schema: ExecutionSchema } },
      },
      ...problemResponses(401, 403, 404, 422, 429),
    },
  });
  app.openapi(getExecution, async (c) => {
    const principal = c.get("principal");
    const record = await findExecution(ctx.db, c.req.valid("param").id);
    const visible =
      record !== undefined &&
      (hasScope(principal, "admin") ||
        // A token (handed to an untrusted client) sees only what it ran; the key sees all its executions.
        (record.keyId === principal.keyId &&
          (principal.token === null || record.tokenId === principal.token.id)));
    if (!visible) {
      throw new ProblemError("not-found", "no such execution for this key");
    }
    const files = await ctx.outputFiles.list(record.id);
    return c.json(executionJson(record, unit, { files }), 200);
  });

  registerOutputFileRoute(app, ctx);

  const listRoute = createRoute({
    method: "get",
    path: "/v1/executions",
    summary: "The calling key's executions, newest first, without their output",
    description:
      "A page at a time: pass next_cursor back as cursor. Filters: status, template. A token that is execute-only " +
      "sees only the executions it ran; one with usage:read sees its key's.",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "execute")] as const,
    request: { query: ExecutionListQuerySchema },
    responses: {
      200: {
        description: "A page of executions",
        content: { "application/json": { schema: ExecutionListSchema } },
      },
      ...problemResponses(401, 403, 422, 429),
    },
  });
  app.openapi(listRoute, async (c) => {
    const principal = c.get("principal");
    const query = c.req.valid("query");
    const before = query.cursor === undefined ? null : decodeCursor(query.cursor);
    const { records, next } = await listExecutions(ctx.db, {
      keyId: principal.keyId,
      tokenId:
        principal.token !== null && !hasScope(principal, "usage:read") ? principal.token.id : null,
      status: query.status ?? null,
      template: query.template ?? null,
      before,
      limit: query.limit ?? 20,
    });
    const executions = records.map((record) => {
      const { stdout: _stdout, stderr: _stderr, ...summary } = executionJson(record, unit);
      return summary;
    });
    const nextCursor =
      next === null ? null : Buffer.from(`${next.createdAt}|${next.id}`).toString("base64url");
    return c.json({ executions, next_cursor: nextCursor }, 200);
  });
}

/**
 * GET /v1/executions/{id}/files/{path}: the path has slashes, which an OpenAPI path parameter
 * cannot match, so this is a plain Hono route documented in the registry by hand. Only the
 * account that ran the execution sees its files (a token only those of the executions it ran);
 * to anyone else, as for an expired file, there is none.
 */
function registerOutputFileRoute(app: OpenAPIHono<AppEnv>, ctx: GatewayContext): void {
  app.openAPIRegistry.registerPath({
    method: "get",
    path: "/v1/executions/{id}/files/{path}",
    summary: "Download a file an execution left under /work/out (its files[].url)",
    description: `Kept for ${ctx.config.outputFiles.ttlSeconds} s after the execution (SANDFORK_OUTPUT_FILES_TTL_SECONDS), then deleted.`,
    security: AUTHENTICATED,
    request: {
      params: filePathParams("Relative to /work/out, by the rules of a path under /work. "),
    },
    responses: {
      200: {
        description: "The file's bytes",
        content: {
          "application/octet-stream": { schema: z.string().openapi({ format: "binary" }) },
        },
      },
      ...problemResponses(401, 403, 404, 422, 429),
    },
  });
  app.get("/v1/executions/:id/files/:path{.+}", authenticate(ctx, "execute"), async (c) => {
    const id = c.req.param("id");
    const notFound = new ProblemError("not-found", "no such file of an execution of this key");
    if (!z.string().uuid().safeParse(id).success) throw notFound;
    const path = filePathOfUrl(c.req.url, "/v1/executions/");
    const principal = c.get("principal");
    const file = await findOutputFile(ctx.db, id, path);
    if (
      file === undefined ||
      file.accountId !== principal.accountId ||
      (principal.token !== null && file.tokenId !== principal.token.id)
    )
      throw notFound;
    return c.body(new Uint8Array(file.content), 200, {
      "content-type": "application/octet-stream",
      "content-disposition": `attachment; filename*=UTF-8''${attrValue(path.slice(path.lastIndexOf("/") + 1))}`,
      "x-content-type-options": "nosniff",
    });
  });
}

/** `name` as an RFC 8187 ext-value's characters: percent-encoded but for attr-char. */
function attrValue(name: string): string {
  return encodeURIComponent(name).replace(
    /['()*]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  );
}

const CURSOR_TIME = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/;
const CURSOR_UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** A cursor this route handed out: the last record's created_at (as the database wrote it) and id. */
function decodeCursor(cursor: string): { createdAt: string; id: string } {
  const [createdAt, id, ...rest] = Buffer.from(cursor, "base64url").toString("utf8").split("|");
  if (
    createdAt === undefined ||
    id === undefined ||
    rest.length > 0 ||
    !CURSOR_UUID.test(id) ||
    !CURSOR_TIME.test(createdAt)
  ) {
    throw new ProblemError("validation-failed", "`cursor` is not one this route handed out", {
      extensions: { errors: [{ path: "cursor", message: "unknown cursor" }] },
    });
  }
  return { createdAt, id };
}
