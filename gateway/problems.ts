// RFC 9457 problem details. Each failure the gateway can report has one stable `type` URI;
// clients switch on `type`, people read `title` and `detail`.
const PROBLEM_TYPE_BASE = "https://sandfork.dev/problems/";

export interface ProblemSpec {
  status: number;
  title: string;
  /** Whether the same request may succeed later unchanged. */
  retryable: boolean;
}

export const PROBLEMS = {
  "malformed-request": {
    status: 400,
    title: "The request body is not valid JSON",
    retryable: false,
  },
  unauthenticated: { status: 401, title: "Credentials are required", retryable: false },
  "invalid-credentials": { status: 401, title: "The credentials are not valid", retryable: false },
  "credentials-expired": { status: 401, title: "The credentials have expired", retryable: false },
  "credentials-revoked": { status: 401, title: "The API key has been revoked", retryable: false },
  "insufficient-credits": {
    status: 402,
    title: "The account has not enough credits for this execution",
    retryable: false,
  },
  "insufficient-scope": {
    status: 403,
    title: "The credentials do not allow this operation",
    retryable: false,
  },
  "template-not-allowed": {
    status: 403,
    title: "The token does not allow this template",
    retryable: false,
  },
  "token-execution-limit": {
    status: 403,
    title: "The token has used all of its executions",
    retryable: false,
  },
  "network-not-allowed": {
    status: 403,
    title: "The key has no network policy: its executions reach no network",
    retryable: false,
  },
  "not-found": { status: 404, title: "Not found", retryable: false },
  "idempotency-conflict": {
    status: 409,
    title: "A request with this Idempotency-Key is still in progress",
    retryable: true,
  },
  "session-ended": {
    status: 409,
    title: "The session's VM has ended; fork it from a checkpoint",
    retryable: false,
  },
  "checkpoint-quota-exceeded": {
    status: 409,
    title: "The key's sessions hold as many checkpoint bytes as it allows",
    retryable: false,
  },
  "template-version-exists": {
    status: 409,
    title: "This template version is already built or being built; versions are immutable",
    retryable: false,
  },
  "template-in-use": {
    status: 409,
    title: "The template is being built or used",
    retryable: false,
  },
  "session-not-checkpointable": {
    status: 409,
    title:
      "The session's program holds what a checkpoint cannot carry (a socket with an address, memory shared between processes)",
    retryable: false,
  },
  "session-not-templatable": {
    status: 409,
    title: "The session holds state a template cannot carry (an open socket, an armed timer)",
    retryable: false,
  },
  "template-name-taken": {
    status: 409,
    title: "Another template has this name",
    retryable: false,
  },
  "template-builds-unsupported": {
    status: 501,
    title: "This gateway's runtime cannot build templates",
    retryable: false,
  },
  "template-builds-busy": {
    status: 503,
    title: "As many template builds wait as the gateway allows",
    retryable: true,
  },
  "session-limit": {
    status: 429,
    title: "The key holds as many sessions as it allows",
    retryable: false,
  },
  "payload-too-large": {
    status: 413,
    title: "The request body is larger than this key allows",
    retryable: false,
  },
  "unsupported-media-type": {
    status: 415,
    title: "The request body must be application/json",
    retryable: false,
  },
  "validation-failed": {
    status: 422,
    title: "The request does not match the schema",
    retryable: false,
  },
  "unknown-template": { status: 422, title: "No such template", retryable: false },
  "unknown-language": {
    status: 422,
    title: "The template does not run that language",
    retryable: false,
  },
  "balance-limit": {
    status: 422,
    title: "The grant would take the balance past the most an account holds",
    retryable: false,
  },
  "idempotency-key-reused": {
    status: 422,
    title: "This Idempotency-Key was used with a different request",
    retryable: false,
  },
  "unknown-tool": { status: 422, title: "No such tool", retryable: false },
  "invalid-tool-arguments": {
    status: 422,
    title: "The tool call's arguments do not match the tool's schema",
    retryable: false,
  },
  "rate-limited": { status: 429, title: "Too many requests for this key", retryable: true },
  "concurrency-limit": {
    status: 429,
    title: "Too many executions in flight for this key",
    retryable: true,
  },
  "internal-error": { status: 500, title: "Internal error", retryable: true },
  "runtime-failed": {
    status: 502,
    title: "The execution runtime failed before finishing the execution",
    retryable: true,
  },
  "runtime-unavailable": {
    status: 503,
    title: "The execution runtime cannot run code now",
    retryable: true,
  },
  "runtime-busy": { status: 503, title: "The execution runtime is at capacity", retryable: true },
} as const satisfies Record<string, ProblemSpec>;

export type ProblemSlug = keyof typeof PROBLEMS;

const problemType = (slug: ProblemSlug): string => `${PROBLEM_TYPE_BASE}${slug}`;

export interface ProblemBody {
  type: string;
  title: string;
  status: number;
  detail?: string;
  instance?: string;
  retryable: boolean;
  [extension: string]: unknown;
}

/** Thrown anywhere in request handling; the app's error handler renders it as problem+json. */
export class ProblemError extends Error {
  readonly slug: ProblemSlug;
  readonly status: number;
  readonly extensions: Record<string, unknown>;
  readonly headers: Record<string, string>;

  constructor(
    slug: ProblemSlug,
    detail?: string,
    options: { extensions?: Record<string, unknown>; headers?: Record<string, string> } = {},
  ) {
    // A problem is an answer, not a fault: no stack trace (capturing one costs more than the rest
    // of a shed answer). An unexpected error keeps its own, and is logged with it.
    const stackTraceLimit = Error.stackTraceLimit;
    Error.stackTraceLimit = 0;
    super(detail ?? PROBLEMS[slug].title);
    Error.stackTraceLimit = stackTraceLimit;
    this.name = "ProblemError";
    this.slug = slug;
    this.status = PROBLEMS[slug].status;
    this.extensions = options.extensions ?? {};
    this.headers = options.headers ?? {};
  }

  body(instance?: string): ProblemBody {
    const spec = PROBLEMS[this.slug];
    const standard = {
      type: problemType(this.slug),
      title: spec.title,
      status: spec.status,
      detail: this.message,
      ...(instance === undefined ? {} : { instance }),
      retryable: spec.retryable,
    };
    // Standard members come first and no extension can overwrite one.
    return { ...standard, ...this.extensions, ...standard };
  }
}

export function problemResponse(error: ProblemError, instance?: string): Response {
  return new Response(JSON.stringify(error.body(instance)), {
    status: error.status,
    headers: { "content-type": "application/problem+json", ...error.headers },
  });
}
