// Request and response schemas. They validate requests and produce the OpenAPI 3.1 document.
import { z } from "@hono/zod-openapi";
import { EXECUTION_STATUSES } from "../db/billing.js";
import { MAX_BALANCE_UNITS, SCOPES } from "../db/keys.js";
import { checkGuestPath, MAX_MEMORY_MIB, MIN_MEMORY_MIB } from "../runtime/template-definition.js";
import type { ExecutionLimits } from "./config.js";
import { refineFiles, WORK_PATH_RULES } from "./file-paths.js";
import { NetworkPolicySchema, NetworkRequestSchema } from "./network-policy.js";
import { REQUEST_LIMITS, refineExecutionSizes, refineText } from "./request-limits.js";
import { RICH_RESULT_TYPES } from "./rich-results.js";

export const ProblemSchema = z
  .object({
    type: z.string().openapi({ example: "https://sandfork.dev/problems/runtime-unavailable" }),
    title: z.string(),
    status: z.number().int(),
    detail: z.string().optional(),
    instance: z.string().optional(),
    retryable: z
      .boolean()
      .openapi({ description: "Whether the same request may succeed later unchanged" }),
  })
  .loose()
  .openapi("Problem", {
    description: "RFC 9457 problem details; `type` is stable for each kind of failure",
  });

/** A file's path: the files array's refinement checks it with the others (gateway/file-paths.ts). */
const workPath = z.string().min(1).openapi({ description: WORK_PATH_RULES });

/** Argument and environment strings: the daemon refuses a NUL in them. */
const noNul = z.string().regex(/^[^\0]*$/, "must not contain a NUL character");
/** The gateway's own bounds on counts, within the daemon's (argv's first entry is the script's name). */
const MAX_ARGS = Math.min(64, REQUEST_LIMITS.MAX_ARGS - 1);
const MAX_ENV_VARS = Math.min(64, REQUEST_LIMITS.MAX_ENV_VARS);
const MAX_FILES = Math.min(64, REQUEST_LIMITS.MAX_FILES);

/** An execution's or a cell's process limit, at most the gateway's (SANDFORK_MAX_PROCESSES). */
export function maxProcessesSchema(limits: ExecutionLimits) {
  return z
    .number()
    .int()
    .min(1)
    .max(limits.maxProcesses)
    .optional()
    .openapi({
      example: 8,
      description: `Processes alive at once, the program included; a fork past it fails (EAGAIN). Default and maximum ${limits.maxProcesses}`,
    });
}

/**
 * A template as an execution or a session names it: a built-in one's name, or one built through
 * the API (a saved session among them) as name@version, or name for its newest.
 */
export const TemplateRefSchema = z
  .string()
  .regex(/^[a-z0-9][a-z0-9._-]{0,63}(@[0-9A-Za-z][0-9A-Za-z._-]{0,31})?$/);

export function executionRequestSchema(limits: ExecutionLimits) {
  return z
    .object({
      template: TemplateRefSchema.openapi({
        example: "python",
        description:
          "A template name from GET /v1/templates; a template built through the API as name@version, or name for its newest build",
      }),
      code: z
        .string()
        .max(REQUEST_LIMITS.MAX_CODE_BYTES)
        .superRefine(refineText(REQUEST_LIMITS.MAX_CODE_BYTES))
        .openapi({
          example: "print(sum(range(10)))",
          description: `At most ${REQUEST_LIMITS.MAX_CODE_BYTES} bytes of UTF-8`,
        }),
      language: z
        .string()
        .regex(/^[a-z][a-z0-9+-]{0,31}$/)
        .optional()
        .openapi({
          example: "python",
          description:
            "One of the template's languages (GET /v1/templates), e.g. javascript or typescript on the node template. Default: the template's first",
        }),
      stdin: z
        .string()
        .max(REQUEST_LIMITS.MAX_STDIN_BYTES)
        .superRefine(refineText(REQUEST_LIMITS.MAX_STDIN_BYTES))
        .optional()
        .openapi({ description: `At most ${REQUEST_LIMITS.MAX_STDIN_BYTES} bytes of UTF-8` }),
      args: z
        .array(noNul.max(4096))
        .max(MAX_ARGS)
        .optional()
        .openapi({
          description: `After the script's name; with env at most ${REQUEST_LIMITS.MAX_ARGS_ENV_BYTES} bytes (each string with a NUL, the script's name included)`,
        }),
      env: z
        .record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]{0,127}$/), noNul.max(4096))
        .refine((e) => Object.keys(e).length <= MAX_ENV_VARS, {
          message: `at most ${MAX_ENV_VARS} variables`,
        })
        .optional()
        .openapi({
          description: `At most ${MAX_ENV_VARS} variables; with args at most ${REQUEST_LIMITS.MAX_ARGS_ENV_BYTES} bytes (name=value and a NUL each)`,
        }),
      files: z
        .array(
          z.object({
            path: workPath,
            content: z
              .string()
              .max(REQUEST_LIMITS.MAX_FRAME_BYTES)
              .openapi({ description: "base64: standard (RFC 4648), with its padding" }),
            encoding: z.enum(["utf8", "base64"]).optional(),
          }),
        )
        .max(MAX_FILES)
        .superRefine((files, ctx) => refineFiles(files, ctx))
        .optional()
        .openapi({
          description:
            "Placed under /work before the code runs: no path twice, none the script's (main.py, main.js or main.ts by language), none inside another file's. " +
            `Their decoded contents and the code together at most ${REQUEST_LIMITS.MAX_FILES_BYTES} bytes`,
        }),
      timeout_ms: z
        .number()
        .int()
        .min(1)
        .max(limits.maxTimeoutMs)
        .optional()
        .openapi({ example: limits.defaultTimeoutMs }),
      memory_mb: z.number().int().min(16).max(limits.maxMemoryMb).optional().openapi({
        example: limits.defaultMemoryMb,
        description:
          "Guest memory; default: the template's VM size (256 for python, 1024 for node), which pooled VMs serve",
      }),
      max_processes: maxProcessesSchema(limits),
      network: NetworkRequestSchema.optional(),
      stream: z.boolean().optional().openapi({
        description:
          "Answer with a text/event-stream of the output as it is written (as Accept: text/event-stream does)",
      }),
    })
    .strict()
    .superRefine((input, ctx) => refineExecutionSizes(input, ctx, limits))
    .openapi("ExecutionRequest", {
      description: `The whole request, as the runtime sends it on (JSON), is at most ${REQUEST_LIMITS.MAX_FRAME_BYTES} bytes`,
    });
}

const ExecutionStatusSchema = z.enum(EXECUTION_STATUSES).openapi({
  description:
    "running: reserved and in flight; completed: the program exited (see exit_code); timed_out / memory_exceeded / " +
    "output_exceeded: stopped at a limit; crashed: a CPU exception in the program; unsupported_syscall: the program " +
    "needed a system call the sandbox does not offer; deadlocked: every thread of the program waited for something no " +
    "thread could do any more, so it was ended before its time limit; network_exceeded: the program moved more network " +
    "bytes than its network max_bytes; aborted: the runtime failed and nothing was charged",
});

export const RichResultSchema = z
  .object({
    type: z.enum(RICH_RESULT_TYPES).openapi({
      description:
        "MIME type: image/png for a matplotlib chart (image/svg+xml too with SANDFORK_FIGURE_FORMATS=png,svg), text/html for a pandas DataFrame, text/plain for the last expression's value",
    }),
    data: z.string().openapi({
      description:
        "The result: base64 for image/png and image/jpeg, text otherwise (JSON text for application/json)",
    }),
  })
  .openapi("RichResult", {
    description:
      "A result as a notebook shows it: each chart shown or left open, each display()ed object, then the last expression's rich forms and its value as text/plain",
  });

export const OutputFileSchema = z
  .object({
    path: z.string().openapi({ example: "plots/chart.png", description: "Relative to /work/out" }),
    size: z.number().int().openapi({ description: "Bytes" }),
    url: z.string().nullable().openapi({
      example: "/v1/executions/0b7e…/files/plots/chart.png",
      description:
        "Where GET downloads it (relative to the gateway's base URL; only the account that ran it, and only a token that ran it); null when it was not kept (see reason)",
    }),
    expires_at: z
      .string()
      .datetime()
      .nullable()
      .openapi({ description: "When it is deleted; null when it was not kept" }),
    reason: z
      .enum(["not_transferred", "invalid_path", "quota_exceeded", "store_failed"])
      .optional()
      .openapi({
        description:
          "Why it was not kept: not_transferred (the files before it filled the 2 MiB a run's files travel in), invalid_path (a name the download route cannot take), quota_exceeded (the key's kept files would pass its quota), store_failed (the database refused it)",
      }),
  })
  .openapi("OutputFile", {
    description: "A file the program left under /work/out, kept for download for a configured time",
  });

export const NetworkUsageSchema = z
  .object({
    bytes_in: z.number().int().openapi({ description: "Payload bytes received" }),
    bytes_out: z.number().int().openapi({ description: "Payload bytes sent" }),
    connections: z
      .number()
      .int()
      .openapi({ description: "Connections made (and UDP sockets sent from)" }),
    refused: z
      .number()
      .int()
      .openapi({ description: "Connects, sends and DNS questions the policy refused" }),
    dns_queries: z.number().int(),
  })
  .openapi("NetworkUsage");

export const ExecutionSchema = z
  .object({
    id: z.string().uuid(),
    template: z.string(),
    status: ExecutionStatusSchema,
    exit_code: z.number().int().nullable(),
    stdout: z.string().nullable(),
    stderr: z.string().nullable(),
    truncated: z.boolean().nullable(),
    timings: z
      .object({
        queue_ms: z.number(),
        fork_ms: z.number(),
        exec_ms: z.number(),
        total_ms: z.number(),
      })
      .nullable(),
    usage: z.object({
      unit: z.string(),
      reserved_units: z.number().int(),
      units: z
        .number()
        .int()
        .nullable()
        .openapi({ description: "Charged units; null while running" }),
      // Null when the program was granted no network (a union, so that the named schema itself stays non-null).
      network: z.union([NetworkUsageSchema, z.null()]),
    }),
    created_at: z.string().datetime(),
    finished_at: z.string().datetime().nullable(),
    results: z.array(RichResultSchema).optional().openapi({
      description:
        "The run's rich results, in the order shown; in the answer of the run itself (not in GET or an Idempotency-Key replay)",
    }),
    files: z.array(OutputFileSchema).optional().openapi({
      description:
        "The files under /work/out at the end, in path order; GET and a replay list those still kept",
    }),
  })
  .openapi("Execution");

export const ExecutionSummarySchema = ExecutionSchema.omit({
  stdout: true,
  stderr: true,
  results: true,
  files: true,
}).openapi("ExecutionSummary");

export const ExecutionListQuerySchema = z.object({
  status: ExecutionStatusSchema.optional(),
  template: z.string().min(1).max(64).optional(),
  limit: z.coerce.number().int().min(1).max(100).optional().openapi({ description: "Default 20" }),
  cursor: z
    .string()
    .max(200)
    .optional()
    .openapi({ description: "next_cursor of the previous page" }),
});

export const ExecutionListSchema = z
  .object({
    executions: z.array(ExecutionSummarySchema),
    next_cursor: z
      .string()
      .nullable()
      .openapi({ description: "Pass as cursor for the next (older) page; null on the last" }),
  })
  .openapi("ExecutionList");

export const UsageSeriesQuerySchema = z.object({
  bucket: z.enum(["hour", "day"]).optional().openapi({ description: "Default hour" }),
  from: z
    .string()
    .datetime({ offset: true })
    .optional()
    .openapi({ description: "Default: 24 buckets before to; rounded down to a bucket" }),
  to: z
    .string()
    .datetime({ offset: true })
    .optional()
    .openapi({ description: "Default: now; rounded up to a bucket" }),
});

export const UsageSeriesSchema = z
  .object({
    key_id: z.string().uuid(),
    bucket: z.enum(["hour", "day"]),
    from: z.string().datetime(),
    to: z.string().datetime(),
    unit: z.string(),
    points: z.array(
      z.object({
        at: z.string().datetime(),
        template: z.string(),
        executions: z.number().int(),
        units: z.number().int(),
      }),
    ),
  })
  .openapi("UsageSeries");

export const TemplateSchema = z
  .object({
    name: z.string(),
    language: z.string().openapi({ description: "The runtime the template holds: python, node" }),
    languages: z
      .array(z.string())
      .openapi({ description: "The languages an execution may ask for; the first is the default" }),
    content_hash: z.string(),
    ready: z.boolean(),
    price: z.object({
      unit: z.string(),
      base_units: z.number().int(),
      units_per_second: z.number().int(),
      units_per_network_mib: z
        .number()
        .int()
        .openapi({ description: "Per MiB of network bytes received and sent, rounded up" }),
    }),
  })
  .openapi("Template");

export const UsageQuerySchema = z.object({
  key_id: z
    .string()
    .uuid()
    .optional()
    .openapi({ description: "Admin only: another key's usage. Default: the caller's key" }),
  from: z
    .string()
    .datetime({ offset: true })
    .optional()
    .openapi({ description: "Start (inclusive). Default: start of this UTC month" }),
  to: z
    .string()
    .datetime({ offset: true })
    .optional()
    .openapi({ description: "End (exclusive). Default: now" }),
});

/** An amount of units: an exact integer, at most MAX_BALANCE_UNITS (2^53 - 1), the most an account holds. */
const units = () => z.number().int().min(0).max(MAX_BALANCE_UNITS);
const BALANCE_FIELDS = {
  balance_units: units(),
  reserved_units: units(),
  available_units: units(),
};

export const UsageSchema = z
  .object({
    key_id: z.string().uuid(),
    account_id: z.string().uuid(),
    from: z.string().datetime(),
    to: z.string().datetime(),
    unit: z.string(),
    executions: z.number().int(),
    units: z
      .number()
      .int()
      .openapi({ description: "All units charged: executions, session cells and sessions" }),
    by_template: z.array(
      z.object({ template: z.string(), executions: z.number().int(), units: z.number().int() }),
    ),
    network: z
      .object({
        bytes_in: z.number().int(),
        bytes_out: z.number().int(),
        refused: z.number().int(),
      })
      .openapi({
        description:
          "Network bytes the key's executions received and sent, and what the policy refused (their cost is in units)",
      }),
    sessions: z
      .object({
        units: z.number().int(),
        running_gib_seconds: z
          .number()
          .openapi({ description: "Memory limit x time holding a running VM" }),
        checkpoint_gib_hours: z.number().openapi({ description: "Checkpoint bytes x time stored" }),
      })
      .openapi({
        description:
          "Sessions' running time and checkpoint storage; their cells count as executions above",
      }),
    output_files: z
      .object({
        bytes: z
          .number()
          .int()
          .openapi({ description: "Bytes of the key's output files kept now" }),
        quota_bytes: z.number().int().openapi({
          description: "The most they may hold (SANDFORK_OUTPUT_FILES_QUOTA_BYTES_PER_KEY)",
        }),
      })
      .openapi({
        description:
          "Files its executions left under /work/out, kept for download until they expire",
      }),
    balance: z.object(BALANCE_FIELDS),
  })
  .openapi("Usage");

const ScopeSchema = z.enum(SCOPES);

const limitFields = {
  rate_limit_per_minute: z.number().int().min(1).max(1_000_000),
  max_concurrency: z.number().int().min(1).max(10_000),
  max_body_bytes: z
    .number()
    .int()
    .min(1024)
    .max(64 * 1024 * 1024),
};

export const CreateKeyRequestSchema = z
  .object({
    // Stored as PostgreSQL text, which cannot hold a NUL.
    name: z
      .string()
      .min(1)
      .max(200)
      .regex(/^[^\0]*$/, "must not contain a NUL character"),
    scopes: z
      .array(ScopeSchema)
      .min(1)
      .optional()
      .openapi({ description: 'Default: ["execute", "usage:read"]' }),
    account_id: z
      .string()
      .uuid()
      .optional()
      .openapi({ description: "Existing account; default: a new account named after the key" }),
    credits: units()
      .min(1)
      .optional()
      .openapi({
        description: `Units granted to the account; its balance after the grant is at most ${MAX_BALANCE_UNITS} (balance-limit)`,
      }),
    expires_in_seconds: z
      .number()
      .int()
      .min(1)
      .max(10 * 365 * 24 * 3600)
      .optional(),
    rate_limit_per_minute: limitFields.rate_limit_per_minute.optional(),
    max_concurrency: limitFields.max_concurrency.optional(),
    max_body_bytes: limitFields.max_body_bytes.optional(),
    // Absent: the key's executions reach no network.
    network: NetworkPolicySchema.optional(),
  })
  .strict()
  .openapi("CreateKeyRequest");

export const KeySchema = z
  .object({
    id: z.string().uuid(),
    account_id: z.string().uuid(),
    name: z.string(),
    hint: z.string(),
    scopes: z.array(ScopeSchema),
    expires_at: z.string().datetime().nullable(),
    revoked_at: z.string().datetime().nullable(),
    created_at: z.string().datetime(),
    ...limitFields,
    // Null: the key's executions reach no network.
    network: z.union([NetworkPolicySchema, z.null()]),
  })
  .openapi("Key");

export const KeyNetworkRequestSchema = z
  .object({
    // Null takes the key's network away.
    network: z.union([NetworkPolicySchema, z.null()]),
  })
  .strict()
  .openapi("KeyNetworkRequest", {
    description: "The key's new network policy; null takes its network away",
  });

export const CreatedKeySchema = KeySchema.extend({
  key: z
    .string()
    .openapi({ description: "The secret. Shown this once; only its SHA-256 is stored" }),
}).openapi("CreatedKey");

export const CreditGrantSchema = z
  .object({
    units: units()
      .min(1)
      .openapi({
        description: `The balance after the grant is at most ${MAX_BALANCE_UNITS} (2^53 - 1); more is refused with balance-limit`,
      }),
  })
  .strict()
  .openapi("CreditGrant");

export const BalanceSchema = z
  .object({ account_id: z.string().uuid(), ...BALANCE_FIELDS })
  .openapi("Balance");

export const TokenRequestSchema = z
  .object({
    ttl_seconds: z.number().int().min(1).optional().openapi({
      description: "Default 900; capped by the gateway's maximum and the key's expiry",
    }),
    templates: z
      .array(z.string())
      .min(1)
      .max(64)
      .optional()
      .openapi({ description: "Templates the token may run; default: all" }),
    max_executions: z.number().int().min(1).max(1_000_000).optional(),
    scopes: z.array(ScopeSchema).min(1).optional().openapi({
      description:
        'Scopes the token carries, each one the key has; default ["execute"]. A token with more than execute is checked against its key\'s revocation on every call',
    }),
    // Narrows the key's policy for the token's calls; the token keeps the key's policy as minted.
    network: NetworkRequestSchema.optional(),
  })
  .strict()
  .openapi("TokenRequest");

export const TokenSchema = z
  .object({
    token: z.string(),
    token_id: z.string(),
    expires_at: z.string().datetime(),
    templates: z.array(z.string()).nullable(),
    max_executions: z.number().int().nullable(),
    scopes: z.array(ScopeSchema),
    network: z.union([NetworkRequestSchema, z.null()]),
  })
  .openapi("Token");

export const HealthSchema = z
  .object({
    status: z.enum(["ok", "degraded"]),
    database: z.enum(["ok", "error"]),
    runtime: z.enum(["connected", "unavailable"]),
    runtime_detail: z
      .string()
      .optional()
      .openapi({ description: "What the connected runtime reports, e.g. the daemon's KVM status" }),
  })
  .openapi("Health");

export const IdParamSchema = z.object({
  id: z
    .string()
    .uuid()
    .openapi({ param: { name: "id", in: "path" } }),
});

const TEMPLATE_NAME = /^[a-z][a-z0-9-]{0,31}$/;
const TEMPLATE_VERSION = /^[0-9A-Za-z][0-9A-Za-z._-]{0,31}$/;
/** A template's name in a definition or a saved session. */
const TemplateNameSchema = z
  .string()
  .regex(TEMPLATE_NAME)
  .openapi({ description: "Lower-case letters, digits and '-'" });
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** A guest path checked as template-definition.ts checks it, as a schema issue. */
const guestPath = z
  .string()
  .min(1)
  .max(4096)
  .superRefine((path, ctx) => {
    try {
      checkGuestPath(path);
    } catch (error) {
      ctx.addIssue({ code: "custom", message: (error as Error).message });
    }
  })
  .openapi({
    description:
      "Absolute guest path, outside /opt/sandfork (the agent's), /work and /tmp (empty in every VM)",
  });

export const TemplateDefinitionSchema = z
  .object({
    name: TemplateNameSchema.openapi({ example: "reports" }),
    version: z.string().regex(TEMPLATE_VERSION).openapi({
      example: "1",
      description: "Immutable once built; an execution names name@version, or name for the newest",
    }),
    base: z
      .string()
      .regex(/^[a-z0-9][a-z0-9._-]{0,63}$/)
      .openapi({ example: "python", description: "The built-in template it extends: python" }),
    debian_packages: z
      .array(z.string().regex(/^[a-z0-9][a-z0-9+.-]{0,127}$/))
      .max(64)
      .optional()
      .openapi({
        example: ["python3-yaml"],
        description:
          "Debian packages installed on the gateway's host, included with what they depend on",
      }),
    exclude_packages: z
      .array(z.string().regex(/^[a-z0-9][a-z0-9+.-]{0,127}$/))
      .max(64)
      .optional()
      .openapi({ description: "Dependencies not to include (with what only they needed)" }),
    exclude: z
      .array(z.string().min(1).max(512))
      .max(64)
      .optional()
      .openapi({ description: "Guest path patterns (*, **, ?) left out of the packages' files" }),
    wheels: z
      .array(
        z.object({
          filename: z.string().regex(/^[A-Za-z0-9_.+-]{1,200}\.whl$/),
          content_base64: z.string().regex(BASE64, "must be base64"),
        }),
      )
      .max(32)
      .optional()
      .openapi({
        description:
          "Wheels uploaded in the body (base64), unpacked first on the import path; the key's body limit bounds them",
      }),
    files: z
      .array(
        z.object({
          path: guestPath,
          content: z.string(),
          encoding: z.enum(["utf8", "base64"]).optional(),
        }),
      )
      .max(256)
      .optional(),
    env: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]{0,127}$/), noNul.max(4096)).optional(),
    setup: z.string().max(REQUEST_LIMITS.MAX_CODE_BYTES).optional().openapi({
      description:
        "A Python program run once before the snapshot (warm imports, data loading); if it raises, the build fails with its traceback",
    }),
    memory_mib: z.number().int().min(MIN_MEMORY_MIB).max(MAX_MEMORY_MIB).optional(),
  })
  .strict()
  .superRefine((body, ctx) => {
    for (const [i, file] of (body.files ?? []).entries())
      if (file.encoding === "base64" && !BASE64.test(file.content))
        ctx.addIssue({ code: "custom", path: ["files", i, "content"], message: "must be base64" });
  })
  .openapi("TemplateDefinition", {
    description:
      "A template built from a built-in one: Debian packages, wheels, files, environment and a setup program; no host paths",
  });

export type TemplateDefinitionBody = z.infer<typeof TemplateDefinitionSchema>;

/** POST /v1/sessions/{id}/template: the session's state as a template of the caller's account. */
export const SessionTemplateSchema = z
  .object({
    name: TemplateNameSchema.openapi({ example: "prepared" }),
    version: z.string().regex(TEMPLATE_VERSION).optional().openapi({
      example: "1",
      description: "Immutable; absent: the next whole number after the name's highest",
    }),
    description: z.string().max(1000).optional(),
  })
  .strict()
  .openapi("SessionTemplateRequest");

export const TemplateBuildSchema = z
  .object({
    id: z.string().uuid(),
    name: z.string(),
    version: z.string(),
    description: z.string().nullable(),
    from_session: z
      .string()
      .uuid()
      .nullable()
      .openapi({ description: "The session it was saved from; null: built from a definition" }),
    status: z.enum(["queued", "building", "ready", "failed"]),
    step: z.string().nullable().openapi({
      description:
        "The step running, or the one that failed: definition, packages, wheels, image, snapshot, load",
    }),
    error: z.string().nullable().openapi({ description: "Why it failed (not retryable as is)" }),
    logs: z.string(),
    image_bytes: z.number().int().nullable(),
    snapshot_bytes: z.number().int().nullable(),
    published: z.boolean(),
    created_at: z.string().datetime(),
    finished_at: z.string().datetime().nullable(),
  })
  .openapi("TemplateBuild");

export const CustomTemplateSchema = z
  .object({
    name: z.string(),
    version: z.string(),
    ref: z.string().openapi({ example: "reports@1" }),
    status: z.enum(["queued", "building", "ready", "failed"]),
    build_id: z.string().uuid(),
    published: z.boolean(),
    own: z.boolean().openapi({ description: "Built by the caller's account" }),
    image_bytes: z.number().int().nullable(),
    created_at: z.string().datetime(),
  })
  .openapi("CustomTemplate");

export const TemplateRefParamSchema = z.object({
  ref: z
    .string()
    .regex(
      new RegExp(`^${TEMPLATE_NAME.source.slice(1, -1)}@${TEMPLATE_VERSION.source.slice(1, -1)}$`),
    )
    .openapi({ param: { name: "ref", in: "path" }, example: "reports@1" }),
});

export const TemplateBuildParamSchema = z.object({
  name: z
    .string()
    .regex(TEMPLATE_NAME)
    .openapi({ param: { name: "name", in: "path" } }),
  id: z
    .string()
    .uuid()
    .openapi({ param: { name: "id", in: "path" } }),
});
