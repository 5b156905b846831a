// Shared pieces of route definitions.

import { z } from "@hono/zod-openapi";
import type { ExecutionRecord } from "../../db/billing.js";
import type { AccountBalance, StoredKey } from "../../db/keys.js";
import { WORK_PATH_RULES, workPathProblem } from "../file-paths.js";
import { networkPolicyJson } from "../network-policy.js";
import type { OutputFileJson } from "../output-files.js";
import { ProblemError } from "../problems.js";
import type { CheckedResult } from "../rich-results.js";
import { ProblemSchema } from "../schemas.js";

const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,255}$/;

/**
 * The Idempotency-Key request header of the routes that run code, as an OpenAPI parameter whose
 * pattern is the one idempotencyKeyOf checks. Declared as a parameter rather than a header schema:
 * a header schema adds a validator that copies every request header into a web Headers object
 * first (~1% of a gateway's main-thread samples at concurrency 1, for a header idempotencyKeyOf checks).
 */
export const IDEMPOTENCY_KEY_HEADER = {
  name: "idempotency-key",
  in: "header",
  required: false,
  description: "Up to 255 visible ASCII characters; a retry with it is billed once",
  schema: { type: "string", pattern: IDEMPOTENCY_KEY.source },
} as const;

/** The request's Idempotency-Key, or null; a malformed one is refused (422). */
export function idempotencyKeyOf(header: string | undefined): string | null {
  if (header === undefined) return null;
  if (!IDEMPOTENCY_KEY.test(header))
    throw new ProblemError(
      "validation-failed",
      "Idempotency-Key must be 1 to 255 visible ASCII characters",
    );
  return header;
}

const PROBLEM_DESCRIPTIONS: Record<number, string> = {
  400: "Malformed request (problems/malformed-request)",
  401: "Missing, invalid, expired or revoked credentials (problems/unauthenticated, invalid-credentials, credentials-expired, credentials-revoked)",
  402: "Not enough credits (problems/insufficient-credits)",
  403: "Scope, template, token limit or network without a policy (problems/insufficient-scope, template-not-allowed, token-execution-limit, network-not-allowed)",
  404: "Not found (problems/not-found)",
  409: "The first request with this Idempotency-Key is still running, the session has ended or is out of checkpoint room, or a template version exists, is in use or its name taken (problems/idempotency-conflict, session-ended, checkpoint-quota-exceeded, template-version-exists, template-in-use, template-name-taken)",
  413: "Body larger than the key allows (problems/payload-too-large)",
  415: "Body not sent as application/json (problems/unsupported-media-type)",
  422: "Validation failed (problems/validation-failed, unknown-template, idempotency-key-reused)",
  429: "Rate, concurrency or session limit, see Retry-After (problems/rate-limited, concurrency-limit, session-limit)",
  501: "This gateway's runtime cannot build templates (problems/template-builds-unsupported)",
  502: "The runtime failed during the execution; nothing was charged (problems/runtime-failed)",
  503: "The execution runtime cannot run code now (not connected, no KVM) or is at capacity; see Retry-After (problems/runtime-unavailable, runtime-busy, template-builds-busy)",
};

export function problemResponses<S extends keyof typeof PROBLEM_DESCRIPTIONS>(...statuses: S[]) {
  return Object.fromEntries(
    statuses.map((status) => [
      status,
      {
        description: PROBLEM_DESCRIPTIONS[status] ?? "Problem",
        content: { "application/problem+json": { schema: ProblemSchema } },
      },
    ]),
  ) as Record<
    S,
    {
      description: string;
      content: { "application/problem+json": { schema: typeof ProblemSchema } };
    }
  >;
}

export const AUTHENTICATED = [{ bearerAuth: [] }];

/**
 * The documented parameters of a `.../{id}/files/{path}` route (`where`: what `path` is relative
 * to, when not /work): a plain Hono route matches them (`:path{.+}`), as an OpenAPI path
 * parameter has no slashes.
 */
export function filePathParams(where = "") {
  return z.object({
    id: z
      .string()
      .uuid()
      .openapi({ param: { name: "id", in: "path" } }),
    path: z.string().openapi({
      param: { name: "path", in: "path" },
      description: `${where}${WORK_PATH_RULES}; percent-encoded once, slashes allowed`,
    }),
  });
}

/**
 * The file path of a `{collection}{id}/files/{path}` request, decoded once from the URL as it
 * arrived (Hono's param() has already decoded it, and leaves what does not decode as it was).
 * A path that is not percent-encoded UTF-8, or that the daemon would refuse, is a 422.
 */
export function filePathOfUrl(url: string, collection: string): string {
  const pathname = new URL(url).pathname;
  const raw = pathname.slice(pathname.indexOf("/files/", collection.length) + "/files/".length);
  let path: string;
  try {
    path = decodeURIComponent(raw);
  } catch {
    throw new ProblemError("validation-failed", "the file path is not percent-encoded UTF-8");
  }
  const why = workPathProblem(path);
  if (why !== undefined)
    throw new ProblemError(
      "validation-failed",
      `the file path ${JSON.stringify(path.slice(0, 64))}: ${why}`,
    );
  return path;
}

const iso = (d: Date | null) => (d === null ? null : d.toISOString());

/**
 * An execution as the API answers it; `output` (a run's results and files, or the files still
 * kept) adds `results` and `files`.
 */
export function executionJson(
  record: ExecutionRecord,
  unitName: string,
  output?: { results?: CheckedResult[]; files: OutputFileJson[] },
) {
  return {
    id: record.id,
    template: record.template,
    status: record.status,
    exit_code: record.exitCode,
    stdout: record.stdout,
    stderr: record.stderr,
    truncated: record.truncated,
    timings:
      record.timings === null
        ? null
        : {
            queue_ms: record.timings.queueMs,
            fork_ms: record.timings.forkMs,
            exec_ms: record.timings.execMs,
            total_ms: record.timings.totalMs,
          },
    usage: {
      unit: unitName,
      reserved_units: record.reservedUnits,
      units: record.chargedUnits,
      network:
        record.network === null
          ? null
          : {
              bytes_in: record.network.bytesIn,
              bytes_out: record.network.bytesOut,
              connections: record.network.connections,
              refused: record.network.refused,
              dns_queries: record.network.dnsQueries,
            },
    },
    created_at: record.createdAt.toISOString(),
    finished_at: iso(record.finishedAt),
    ...(output?.results === undefined ? {} : { results: output.results }),
    ...(output === undefined ? {} : { files: output.files }),
  };
}

export function keyJson(key: StoredKey) {
  return {
    id: key.id,
    account_id: key.accountId,
    name: key.name,
    hint: key.hint,
    scopes: key.scopes,
    expires_at: iso(key.expiresAt),
    revoked_at: iso(key.revokedAt),
    created_at: key.createdAt.toISOString(),
    rate_limit_per_minute: key.limits.rateLimitPerMinute,
    max_concurrency: key.limits.maxConcurrency,
    max_body_bytes: key.limits.maxBodyBytes,
    network: networkPolicyJson(key.network),
  };
}

/** An account's credits as the usage and credit-grant answers show them. */
export function balanceJson(balance: AccountBalance) {
  return {
    balance_units: balance.balanceUnits,
    reserved_units: balance.reservedUnits,
    available_units: balance.availableUnits,
  };
}
