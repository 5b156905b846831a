// /v1/sessions: stateful sandboxes (gateway/session-service.ts). Same authentication, scope
// ("execute"), rate and concurrency limits and body limit as /v1/executions.
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import type { SessionRow } from "../../db/sessions.js";
import type { TakenCheckpoint } from "../../runtime/session-runtime.js";
import type { AppEnv, GatewayContext } from "../context.js";
import { authenticate, limitBodyPerKey } from "../middleware.js";
import { NetworkRequestSchema } from "../network-policy.js";
import { ProblemError } from "../problems.js";
import { REQUEST_LIMITS, refineText } from "../request-limits.js";
import { checkedResults } from "../rich-results.js";
import {
  ExecutionSchema,
  maxProcessesSchema,
  RichResultSchema,
  SessionTemplateSchema,
  TemplateBuildSchema,
  TemplateRefSchema,
} from "../schemas.js";
import type { CellOutcome, SessionService } from "../session-service.js";
import {
  AUTHENTICATED,
  executionJson,
  filePathOfUrl,
  filePathParams,
  problemResponses,
} from "./openapi-helpers.js";
import { buildJson } from "./templates.js";

/** Largest file a request puts into or reads from a session (the daemon's bound). */
const { MAX_SESSION_FILE_BYTES } = REQUEST_LIMITS;

/** Sessions one fork request makes at most (`count`). */
export const MAX_FORK_COUNT = 64;

const SessionIdParam = z.object({
  id: z
    .string()
    .uuid()
    .openapi({ param: { name: "id", in: "path" } }),
});

const SessionSchema = z
  .object({
    id: z.string().uuid(),
    template: z.string(),
    state: z.enum(["running", "paused", "ended", "deleted"]).openapi({
      description:
        "running: holds a VM (billed by the ms); paused: its state is in its last checkpoint, resumed by the next call; ended: its VM is gone (fork it from a checkpoint); deleted",
    }),
    memory_mib: z.number().int(),
    idle_timeout_s: z.number().int(),
    max_lifetime_s: z.number().int(),
    last_checkpoint: z.object({ checkpoint: z.number().int(), sha256: z.string() }).nullable(),
    checkpoint_bytes: z.number().int(),
    cells: z.number().int().openapi({ description: "Cells run so far" }),
    usage: z.object({
      unit: z.string(),
      units: z.number().int().openapi({
        description:
          "Charged for running time and checkpoint storage so far (cells are charged as executions)",
      }),
      running_gib_seconds: z.number(),
      checkpoint_gib_hours: z.number(),
    }),
    ended_reason: z.string().nullable(),
    created_at: z.string().datetime(),
    last_active_at: z.string().datetime(),
  })
  .openapi("Session");

const CheckpointSchema = z
  .object({
    checkpoint: z
      .number()
      .int()
      .openapi({ description: "Its number in the session, for POST .../fork" }),
    sha256: z
      .string()
      .openapi({ description: "SHA-256 of the checkpoint file; a restore verifies it" }),
    file_bytes: z.number().int(),
    dirty_bytes: z
      .number()
      .int()
      .openapi({ description: "Memory the session changed against its template, recorded in it" }),
    timings: z.object({ capture_ms: z.number(), write_ms: z.number() }),
    session: SessionSchema,
  })
  .openapi("SessionCheckpoint");

const CellSchema = z
  .object({
    value: z.string().nullable().openapi({
      description:
        "repr() of the cell's last expression, as a notebook shows it; null for a statement or None",
    }),
    error: z
      .object({ name: z.string(), message: z.string() })
      .nullable()
      .openapi({ description: "The exception that ended the cell (its traceback is in stderr)" }),
    results: z.array(RichResultSchema).openapi({
      description:
        "The cell's rich results in the order shown (charts, display()ed objects, the value's HTML, PNG or JSON forms), then its value as text/plain",
    }),
    resumed: z
      .boolean()
      .openapi({ description: "The session was paused and resumed for this cell" }),
    execution: ExecutionSchema,
    session: SessionSchema,
  })
  .openapi("SessionCell");

const ForkSessionSchema = z
  .object({
    checkpoint: z
      .number()
      .int()
      .min(1)
      .optional()
      .openapi({ description: "Default: the session's last checkpoint" }),
    count: z.number().int().min(1).max(MAX_FORK_COUNT).optional().openapi({
      description:
        "Sessions to make from the checkpoint at once, all or none; with it the answer is a ForkedSessions list, without it the one Session",
    }),
  })
  .strict()
  .openapi("ForkSession");

const ForkedSessionsSchema = z
  .object({
    sessions: z
      .array(SessionSchema)
      .openapi({ description: "The new sessions, running, in no particular order" }),
  })
  .openapi("ForkedSessions");

const CreateSessionSchema = (ctx: GatewayContext) =>
  z
    .object({
      template: TemplateRefSchema.openapi({
        example: "python",
        description:
          "A template name; one built through the API (a saved session among them) as name@version, or name for its newest",
      }),
      idle_timeout_s: z
        .number()
        .int()
        .min(1)
        .max(ctx.config.sessions.maxIdleTimeoutS)
        .optional()
        .openapi({ description: "Paused after this long without a call" }),
      max_lifetime_s: z
        .number()
        .int()
        .min(1)
        .max(ctx.config.sessions.maxLifetimeS)
        .optional()
        .openapi({ description: "Deleted this long after its creation" }),
      memory_mib: z
        .number()
        .int()
        .min(16)
        .max(ctx.config.executionLimits.maxMemoryMb)
        .optional()
        .openapi({ description: "Default and only value: the template's VM size" }),
    })
    .strict()
    .openapi("CreateSession");

const CellRequestSchema = (ctx: GatewayContext) =>
  z
    .object({
      code: z
        .string()
        .max(REQUEST_LIMITS.MAX_CODE_BYTES)
        .superRefine(refineText(REQUEST_LIMITS.MAX_CODE_BYTES))
        .openapi({
          example: "x = 6 * 7\nx",
          description: `At most ${REQUEST_LIMITS.MAX_CODE_BYTES} bytes of UTF-8`,
        }),
      timeout_ms: z.number().int().min(1).max(ctx.config.executionLimits.maxTimeoutMs).optional(),
      max_processes: maxProcessesSchema(ctx.config.executionLimits),
      network: NetworkRequestSchema.optional(),
    })
    .strict()
    .openapi("SessionCellRequest");

export function sessionJson(row: SessionRow, unit: string) {
  return {
    id: row.id,
    template: row.template,
    state: row.state as "running" | "paused" | "ended" | "deleted",
    memory_mib: row.memoryMib,
    idle_timeout_s: row.idleTimeoutS,
    max_lifetime_s: row.maxLifetimeS,
    last_checkpoint:
      row.lastCheckpoint === null
        ? null
        : { checkpoint: row.lastCheckpoint, sha256: row.lastCheckpointSha256 ?? "" },
    checkpoint_bytes: row.checkpointBytes,
    cells: row.cells,
    usage: {
      unit,
      units: row.chargedUnits,
      running_gib_seconds: Number(row.runningMibMs) / (1024 * 1000),
      checkpoint_gib_hours: Number(row.storageByteMs) / (2 ** 30 * 3_600_000),
    },
    ended_reason: row.endedReason,
    created_at: row.createdAt.toISOString(),
    last_active_at: row.lastActiveAt.toISOString(),
  };
}

/** The answer of POST /v1/sessions/{id}/executions: a cell's outcome. */
export function cellJson({ session, record, cell }: CellOutcome, unit: string) {
  return {
    value: cell.value,
    error: cell.error,
    results: checkedResults(cell.execution.results ?? []),
    resumed: cell.resumed,
    execution: executionJson(record, unit),
    session: sessionJson(session, unit),
  };
}

function checkpointJson(session: SessionRow, taken: TakenCheckpoint, unit: string) {
  return {
    checkpoint: taken.checkpoint,
    sha256: taken.sha256,
    file_bytes: taken.fileBytes,
    dirty_bytes: taken.dirtyBytes,
    timings: { capture_ms: taken.captureMs, write_ms: taken.writeMs },
    session: sessionJson(session, unit),
  };
}

export function registerSessionRoutes(
  app: OpenAPIHono<AppEnv>,
  ctx: GatewayContext,
  sessions: SessionService,
): void {
  const unit = ctx.config.pricing.unitName;
  const json = <T extends z.ZodType>(schema: T, description: string) => ({
    description,
    content: { "application/json": { schema } },
  });

  app.openapi(
    createRoute({
      method: "post",
      path: "/v1/sessions",
      summary: "Create a session: a sandbox that keeps its state across calls",
      description:
        "Its own microVM forked from the template, billed per GiB-second while it runs, per cell, and per GiB-hour of checkpoints.",
      security: AUTHENTICATED,
      middleware: [authenticate(ctx, "execute"), limitBodyPerKey] as const,
      request: {
        body: {
          required: true,
          content: { "application/json": { schema: CreateSessionSchema(ctx) } },
        },
      },
      responses: {
        201: json(SessionSchema, "The session, running"),
        ...problemResponses(401, 403, 413, 415, 422, 429, 502, 503),
      },
    }),
    async (c) =>
      c.json(
        sessionJson(await sessions.create(c.get("principal"), c.req.valid("json")), unit),
        201,
      ),
  );

  app.openapi(
    createRoute({
      method: "get",
      path: "/v1/sessions",
      summary: "The calling key's sessions (not deleted)",
      security: AUTHENTICATED,
      middleware: [authenticate(ctx, "execute")] as const,
      responses: {
        200: json(z.object({ sessions: z.array(SessionSchema) }), "Sessions, newest first"),
        ...problemResponses(401, 403, 429),
      },
    }),
    async (c) =>
      c.json(
        {
          sessions: (await sessions.list(c.get("principal"))).map((row) => sessionJson(row, unit)),
        },
        200,
      ),
  );

  app.openapi(
    createRoute({
      method: "get",
      path: "/v1/sessions/{id}",
      summary: "A session, with the checkpoints the runtime holds of it",
      security: AUTHENTICATED,
      middleware: [authenticate(ctx, "execute")] as const,
      request: { params: SessionIdParam },
      responses: {
        200: json(
          SessionSchema.extend({
            checkpoints: z
              .array(
                z.object({
                  checkpoint: z.number().int(),
                  sha256: z.string(),
                  file_bytes: z.number().int(),
                }),
              )
              .nullable(),
          }),
          "The session",
        ),
        ...problemResponses(401, 403, 404, 422, 429),
      },
    }),
    async (c) => {
      const row = await sessions.owned(c.get("principal"), c.req.valid("param").id);
      const info = await sessions.runtimeInfo(row);
      const checkpoints =
        info?.checkpoints.map((k) => ({
          checkpoint: k.checkpoint,
          sha256: k.sha256,
          file_bytes: k.fileBytes,
        })) ?? null;
      return c.json({ ...sessionJson(row, unit), checkpoints }, 200);
    },
  );

  app.openapi(
    createRoute({
      method: "delete",
      path: "/v1/sessions/{id}",
      summary: "End a session and remove its checkpoints",
      security: AUTHENTICATED,
      middleware: [authenticate(ctx, "execute")] as const,
      request: { params: SessionIdParam },
      responses: {
        200: json(SessionSchema, "The session, deleted, with its final usage"),
        ...problemResponses(401, 403, 404, 422, 429, 502, 503),
      },
    }),
    async (c) =>
      c.json(
        sessionJson(await sessions.delete(c.get("principal"), c.req.valid("param").id), unit),
        200,
      ),
  );

  app.openapi(
    createRoute({
      method: "post",
      path: "/v1/sessions/{id}/executions",
      summary: "Run code as the session's next cell",
      description:
        "Variables, imports and open files stay between cells; the last expression's value is returned as a notebook shows it. A paused session is resumed first. A program that ends its process (os._exit, a crash, a limit) ends the session.",
      security: AUTHENTICATED,
      middleware: [authenticate(ctx, "execute"), limitBodyPerKey] as const,
      request: {
        params: SessionIdParam,
        body: {
          required: true,
          content: { "application/json": { schema: CellRequestSchema(ctx) } },
        },
      },
      responses: {
        200: json(CellSchema, "The cell ran (see execution.status and error)"),
        ...problemResponses(401, 402, 403, 404, 409, 413, 415, 422, 429, 502, 503),
      },
    }),
    async (c) =>
      c.json(
        cellJson(
          await sessions.execute(c.get("principal"), c.req.valid("param").id, c.req.valid("json")),
          unit,
        ),
        200,
      ),
  );

  const checkpointRoute = (path: string, summary: string, description: string) =>
    createRoute({
      method: "post",
      path,
      summary,
      description,
      security: AUTHENTICATED,
      middleware: [authenticate(ctx, "execute")] as const,
      request: { params: SessionIdParam },
      responses: {
        201: json(
          CheckpointSchema,
          "Written durably (fsynced, renamed into place) before this answer",
        ),
        ...problemResponses(401, 403, 404, 409, 422, 429, 502, 503),
      },
    });
  app.openapi(
    checkpointRoute(
      "/v1/sessions/{id}/checkpoints",
      "Checkpoint a session without pausing it",
      "Dirty memory against the template, vCPU, VMM state, /work files and every process the " +
        "session's cells started, checksummed. A process holding what a checkpoint cannot carry " +
        "(a socket with an address, memory shared between processes, a FIFO, a pidfd, a terminal, " +
        "an armed timer) is 409 session-not-checkpointable; the session runs on.",
    ),
    async (c) => {
      const { session, checkpoint } = await sessions.checkpoint(
        c.get("principal"),
        c.req.valid("param").id,
      );
      return c.json(checkpointJson(session, checkpoint, unit), 201);
    },
  );
  app.openapi(
    checkpointRoute(
      "/v1/sessions/{id}/pause",
      "Pause a session: checkpoint it and release its VM",
      "Billing for running time stops; the next call resumes it, every process included, from " +
        "this checkpoint. A process holding what a checkpoint cannot carry (a socket with an " +
        "address, memory shared between processes, ...) is 409 session-not-checkpointable; the " +
        "session runs on.",
    ),
    async (c) => {
      const { session, checkpoint } = await sessions.pause(
        c.get("principal"),
        c.req.valid("param").id,
      );
      return c.json(checkpointJson(session, checkpoint, unit), 201);
    },
  );

  app.openapi(
    createRoute({
      method: "post",
      path: "/v1/sessions/{id}/resume",
      summary: "Resume a paused session now (any call resumes it too)",
      security: AUTHENTICATED,
      middleware: [authenticate(ctx, "execute")] as const,
      request: { params: SessionIdParam },
      responses: {
        200: json(SessionSchema, "The session, running"),
        ...problemResponses(401, 403, 404, 409, 422, 429, 502, 503),
      },
    }),
    async (c) =>
      c.json(
        sessionJson(await sessions.resume(c.get("principal"), c.req.valid("param").id), unit),
        200,
      ),
  );

  app.openapi(
    createRoute({
      method: "post",
      path: "/v1/sessions/{id}/fork",
      summary: "Create a session from one of this session's checkpoints",
      description:
        "Branching: many sessions from one state, each with its random generators reseeded. With `count`, that many at once, all or none: when one cannot be made, those made are deleted again (charged for the time they ran) and the answer is the failure's problem.",
      security: AUTHENTICATED,
      middleware: [authenticate(ctx, "execute"), limitBodyPerKey] as const,
      request: {
        params: SessionIdParam,
        body: { required: true, content: { "application/json": { schema: ForkSessionSchema } } },
      },
      responses: {
        201: json(
          z.union([SessionSchema, ForkedSessionsSchema]),
          "The new session, running; with `count`, the new sessions",
        ),
        ...problemResponses(401, 403, 404, 413, 415, 422, 429, 502, 503),
      },
    }),
    async (c) => {
      const { checkpoint, count } = c.req.valid("json");
      const rows = await sessions.fork(
        c.get("principal"),
        c.req.valid("param").id,
        checkpoint,
        count,
      );
      return count === undefined
        ? c.json(sessionJson(rows[0] as SessionRow, unit), 201)
        : c.json({ sessions: rows.map((row) => sessionJson(row, unit)) }, 201);
    },
  );

  app.openapi(
    createRoute({
      method: "post",
      path: "/v1/sessions/{id}/template",
      summary: "Save the session's state as a template of the caller's account",
      description:
        "Its variables, imports, open files and /work files, as they are between cells, become template " +
        '`name@version` (immutable), which executions (`template: "name@version"`) and sessions fork as any ' +
        "template, seen and deleted as templates built through POST /v1/templates. Needs the templates scope " +
        "(or admin) and the session's own key. A paused session is resumed for it; the session runs on. " +
        "A program with child processes (alive or unreaped), holding a socket with an address or an " +
        "armed timer is 409 session-not-templatable: a template holds one process.",
      security: AUTHENTICATED,
      middleware: [authenticate(ctx, "templates"), limitBodyPerKey] as const,
      request: {
        params: SessionIdParam,
        body: {
          required: true,
          content: { "application/json": { schema: SessionTemplateSchema } },
        },
      },
      responses: {
        201: json(TemplateBuildSchema, "The template, ready"),
        ...problemResponses(401, 403, 404, 409, 413, 415, 422, 429, 501, 502, 503),
      },
    }),
    async (c) => {
      const principal = c.get("principal");
      const id = c.req.valid("param").id;
      const row = await sessions.owned(principal, id);
      const template = await ctx.templates.fromSession(
        principal,
        c.req.valid("json"),
        { session: id, template: row.template },
        (runtimeName) => sessions.saveTemplate(row, runtimeName),
      );
      c.header("location", `/v1/templates/${template.name}/builds/${template.id}`);
      return c.json(buildJson(template), 201);
    },
  );

  registerFileRoutes(app, ctx, sessions);
}

/**
 * PUT/GET/DELETE /v1/sessions/{id}/files/{path}: the path has slashes, which an OpenAPI path
 * parameter cannot match, so these are plain Hono routes documented in the registry by hand.
 */
function registerFileRoutes(
  app: OpenAPIHono<AppEnv>,
  ctx: GatewayContext,
  sessions: SessionService,
): void {
  const params = filePathParams();
  const file = z.object({ path: z.string(), bytes: z.number().int() }).openapi("SessionFile");
  const common = { security: AUTHENTICATED, request: { params } };
  app.openAPIRegistry.registerPath({
    method: "put",
    path: "/v1/sessions/{id}/files/{path}",
    summary: "Write a file under the session's /work (replacing it); the body is its bytes",
    ...common,
    request: {
      params,
      body: {
        required: true,
        content: {
          "application/octet-stream": { schema: z.string().openapi({ format: "binary" }) },
        },
      },
    },
    responses: {
      200: { description: "Written", content: { "application/json": { schema: file } } },
      ...problemResponses(401, 403, 404, 409, 413, 422, 429, 502, 503),
    },
  });
  app.openAPIRegistry.registerPath({
    method: "get",
    path: "/v1/sessions/{id}/files/{path}",
    summary: "Read a file under the session's /work",
    ...common,
    responses: {
      200: {
        description: "The file's bytes",
        content: {
          "application/octet-stream": { schema: z.string().openapi({ format: "binary" }) },
        },
      },
      ...problemResponses(401, 403, 404, 409, 422, 429, 502, 503),
    },
  });
  app.openAPIRegistry.registerPath({
    method: "delete",
    path: "/v1/sessions/{id}/files/{path}",
    summary: "Delete a file under the session's /work",
    ...common,
    responses: {
      204: { description: "Deleted" },
      ...problemResponses(401, 403, 404, 409, 422, 429, 502, 503),
    },
  });

  const route = "/v1/sessions/:id/files/:path{.+}";
  const target = (c: { req: { url: string; param(name: string): string | undefined } }) => {
    const id = c.req.param("id") ?? "";
    if (!z.string().uuid().safeParse(id).success)
      throw new ProblemError("not-found", "no such session for this key");
    return { id, path: filePathOfUrl(c.req.url, "/v1/sessions/") };
  };
  app.put(route, authenticate(ctx, "execute"), limitBodyPerKey, async (c) => {
    const { id, path } = target(c);
    const content = Buffer.from(await c.req.arrayBuffer());
    if (content.length > MAX_SESSION_FILE_BYTES)
      throw new ProblemError(
        "payload-too-large",
        `a session file is at most ${MAX_SESSION_FILE_BYTES} bytes per request`,
      );
    const bytes = await sessions.writeFile(c.get("principal"), id, path, content);
    return c.json({ path, bytes }, 200);
  });
  app.get(route, authenticate(ctx, "execute"), async (c) => {
    const { id, path } = target(c);
    const content = await sessions.readFile(c.get("principal"), id, path);
    return c.body(new Uint8Array(content), 200, { "content-type": "application/octet-stream" });
  });
  app.delete(route, authenticate(ctx, "execute"), async (c) => {
    const { id, path } = target(c);
    await sessions.deleteFile(c.get("principal"), id, path);
    return c.body(null, 204);
  });
}
