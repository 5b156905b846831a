// Messages of the daemon protocol v1 (native-vmm/PROTOCOL.md): building requests, checking
// responses, and turning them into the ExecutionRuntime's types and errors. No I/O here.
import { z } from "zod";
import {
  type DaemonErrorCode,
  RuntimeBusyError,
  type RuntimeError,
  RuntimeInternalError,
  RuntimeProtocolError,
  RuntimeRequestError,
  RuntimeUnavailableError,
} from "./errors.js";
import type {
  ExecutionOutcome,
  ExecutionRequest,
  ExecutionResult,
  NetworkGrant,
  OutputChunk,
  OutputFile,
  RichResult,
  RuntimeAdmission,
  Template,
} from "./execution-runtime.js";
import type { FrameObject } from "./frames.js";

const PROTOCOL_VERSION = 1;
/**
 * argv[0] of the program by language: the name the code runs under (Python's sys.argv[0]); a
 * Node template tells JavaScript from TypeScript by its extension (templates/node/README.md).
 */
const SCRIPT_NAMES: Record<string, string> = {
  python: "main.py",
  javascript: "main.js",
  typescript: "main.ts",
};

export type RequestType =
  | "list_templates"
  | "load_template"
  | "unload_template"
  | "execute"
  | "health"
  | "stats"
  | SessionRequestType;

/** Session requests (PROTOCOL.md, Sessions; session-runtime.ts builds and reads them). */
export type SessionRequestType =
  | "session_create"
  | "session_execute"
  | "session_write_file"
  | "session_read_file"
  | "session_delete_file"
  | "session_checkpoint"
  | "session_pause"
  | "session_resume"
  | "session_fork"
  | "session_delete"
  | "session_info"
  | "session_template";

/** The response `type` each request type is answered with (besides `error`). */
export const RESPONSE_TYPE: Record<RequestType, string> = {
  list_templates: "templates",
  load_template: "templates",
  unload_template: "templates",
  execute: "execution",
  health: "health",
  stats: "stats",
  session_create: "session",
  session_execute: "execution",
  session_write_file: "session_file",
  session_read_file: "session_file",
  session_delete_file: "session_file",
  session_checkpoint: "checkpoint",
  session_pause: "checkpoint",
  session_resume: "session",
  session_fork: "session",
  session_delete: "session",
  session_info: "session",
  session_template: "session_template",
};

export function helloFrame(): FrameObject {
  return { type: "hello", protocol: PROTOCOL_VERSION };
}

const micros = z.number().int().min(0);
const integer = z.number().int().min(0);

const HelloSchema = z.object({
  type: z.literal("hello"),
  protocol: z.number().int(),
  server: z.string(),
});

const TemplatesSchema = z.object({
  templates: z.array(
    z.object({
      name: z.string(),
      content_hash: z.string(),
      language: z.string(),
      languages: z.array(z.string()),
      ready: z.boolean(),
    }),
  ),
});

const HealthSchema = z.object({ ok: z.boolean(), kvm: z.string(), templates: integer });

const StatsSchema = z.object({
  executions: integer,
  in_flight: integer,
  admission: z.object({
    running: integer,
    queued: integer,
    queued_by_template: z.record(z.string(), integer),
    busy: z.record(z.string(), integer),
  }),
  pools: z.array(
    z.object({ template: z.string(), ready: integer, target: integer, forks: integer }),
  ),
});

/** A rich result as the agent publishes it (PROTOCOL.md, `result`). */
const RichResultSchema = z.object({ type: z.string(), data: z.string() });

const ExecutionSchema = z.object({
  status: z.enum([
    "ok",
    "error",
    "timeout",
    "out_of_memory",
    "output_limit",
    "crashed",
    "unsupported",
    "deadlocked",
    "network_limit",
  ]),
  exit_code: z.number().int().nullable(),
  stdout: z.string(),
  stderr: z.string(),
  truncated: z.boolean(),
  fault: z
    .object({ vector: integer, name: z.string(), rip: integer, address: integer.nullable() })
    .nullable(),
  limits: z.object({
    timeout_ms: integer,
    memory_mib: integer,
    output_bytes: integer,
    processes: integer,
  }),
  timings: z.object({ queue_us: micros, fork_us: micros, exec_us: micros, total_us: micros }),
  usage: z.object({
    wall_us: micros,
    cpu_us: micros,
    peak_memory_bytes: integer,
    pages_copied: integer,
    syscalls: integer,
    exits: integer,
    processes_created: integer,
    network: z
      .object({
        bytes_in: integer,
        bytes_out: integer,
        connections: integer,
        refused: integer,
        dns_queries: integer,
      })
      .optional(),
  }),
  /** What the agent published: a script's result or a cell's (whose `error` session-runtime.ts reads). */
  result: z.object({ value: z.string().nullable(), results: z.array(RichResultSchema) }).nullish(),
  files: z
    .array(z.object({ path: z.string(), bytes: integer, content: z.string().nullable() }))
    .optional(),
});

const ErrorSchema = z.object({
  code: z.string(),
  message: z.string(),
  retryable: z.boolean(),
  /** On `busy`: the bound it met. */
  reason: z.string().optional(),
});

export function parse<T>(schema: z.ZodType<T>, frame: FrameObject, what: string): T {
  const result = schema.safeParse(frame);
  if (!result.success) {
    const issue = result.error.issues[0];
    const where =
      issue === undefined ? "" : ` (${issue.path.join(".") || "frame"}: ${issue.message})`;
    throw new RuntimeProtocolError(`the daemon's ${what} frame does not match protocol v1${where}`);
  }
  return result.data;
}

/** The server's hello; throws unless it speaks our protocol version. */
export function parseHello(frame: FrameObject): { server: string } {
  if (frame.type === "error") throw errorFromFrame(frame);
  const hello = parse(HelloSchema, frame, "hello");
  if (hello.protocol !== PROTOCOL_VERSION) {
    throw new RuntimeProtocolError(
      `the daemon answered hello with protocol ${hello.protocol}; this client speaks ${PROTOCOL_VERSION}`,
    );
  }
  return { server: hello.server };
}

/** An execute request; `stream` asks for `output` frames before the answer. */
export function executeFrame(request: ExecutionRequest, stream = false): FrameObject {
  return {
    type: "execute",
    template: request.template,
    code: request.code,
    stdin: request.stdin,
    argv: [SCRIPT_NAMES[request.language] ?? "main.py", ...request.args],
    env: request.env,
    files: request.files.map((f) => ({ path: f.path, content: f.content, encoding: f.encoding })),
    limits: {
      timeout_ms: request.timeoutMs,
      ...(request.memoryMb === undefined ? {} : { memory_mib: request.memoryMb }),
      ...(request.maxProcesses === undefined ? {} : { processes: request.maxProcesses }),
    },
    ...(request.network === undefined ? {} : { network: networkFields(request.network) }),
    ...(stream ? { stream: true } : {}),
    ...(request.keyId === undefined ? {} : { key_id: request.keyId }),
  };
}

/** A grant as the `network` field of an execute or session_execute request. */
export function networkFields(grant: NetworkGrant): FrameObject {
  return {
    allowlists: grant.allowlists,
    ...(grant.maxConnections === undefined ? {} : { max_connections: grant.maxConnections }),
    ...(grant.maxBytes === undefined ? {} : { max_bytes: grant.maxBytes }),
  };
}

const OutputSchema = z.object({ stream: z.enum(["stdout", "stderr"]), data: z.string() });

/**
 * A program's output as text the gateway can store: the daemon already made invalid UTF-8
 * U+FFFD; NUL becomes U+FFFD too, since PostgreSQL text cannot hold it (a program printing one
 * would otherwise fail its own settlement and every other one in its batch).
 */
function outputText(text: string): string {
  return text.includes("\0") ? text.replaceAll("\0", "\uFFFD") : text;
}

/** An `output` frame of a streamed execution. */
export function parseOutput(frame: FrameObject): OutputChunk {
  const chunk = parse(OutputSchema, frame, "output");
  return { stream: chunk.stream, data: outputText(chunk.data) };
}

const OUTCOMES: Record<z.infer<typeof ExecutionSchema>["status"], ExecutionOutcome> = {
  ok: "completed",
  error: "completed",
  timeout: "timed_out",
  out_of_memory: "memory_exceeded",
  output_limit: "output_exceeded",
  crashed: "crashed",
  unsupported: "unsupported_syscall",
  deadlocked: "deadlocked",
  network_limit: "network_exceeded",
};

const ms = (us: number): number => us / 1000;

/**
 * The rich results of a run as the gateway answers them: those shown, then the last expression's
 * value as text/plain (as Jupyter lists an execute_result after the displays before it).
 */
function richResults(published: { value: string | null; results: RichResult[] }): RichResult[] {
  const { value, results } = published;
  return value === null ? results : [...results, { type: "text/plain", data: value }];
}

function outputFiles(
  files: { path: string; bytes: number; content: string | null }[],
): OutputFile[] {
  return files.map((f) => ({
    path: f.path,
    bytes: f.bytes,
    content: f.content === null ? null : Buffer.from(f.content, "base64"),
  }));
}

export function parseExecution(frame: FrameObject): ExecutionResult {
  const e = parse(ExecutionSchema, frame, "execution");
  return {
    outcome: OUTCOMES[e.status],
    exitCode: e.exit_code,
    stdout: outputText(e.stdout),
    stderr: outputText(e.stderr),
    truncated: e.truncated,
    timings: {
      queueMs: ms(e.timings.queue_us),
      forkMs: ms(e.timings.fork_us),
      execMs: ms(e.timings.exec_us),
    },
    fault: e.fault,
    limits: {
      timeoutMs: e.limits.timeout_ms,
      memoryMib: e.limits.memory_mib,
      outputBytes: e.limits.output_bytes,
      processes: e.limits.processes,
    },
    usage: {
      wallMs: ms(e.usage.wall_us),
      cpuMs: ms(e.usage.cpu_us),
      peakMemoryBytes: e.usage.peak_memory_bytes,
      pagesCopied: e.usage.pages_copied,
      syscalls: e.usage.syscalls,
      exits: e.usage.exits,
      processesCreated: e.usage.processes_created,
      ...(e.usage.network === undefined
        ? {}
        : {
            network: {
              bytesIn: e.usage.network.bytes_in,
              bytesOut: e.usage.network.bytes_out,
              connections: e.usage.network.connections,
              refused: e.usage.network.refused,
              dnsQueries: e.usage.network.dns_queries,
            },
          }),
    },
    ...(e.result == null ? {} : { results: richResults(e.result) }),
    ...(e.files === undefined ? {} : { files: outputFiles(e.files) }),
  };
}

export function parseTemplates(frame: FrameObject): Template[] {
  return parse(TemplatesSchema, frame, "templates").templates.map((t) => ({
    name: t.name,
    language: t.language,
    languages: t.languages,
    contentHash: t.content_hash,
    ready: t.ready,
  }));
}

export interface DaemonHealth {
  /** Executions can run now (KVM usable and at least one template). */
  ok: boolean;
  /** "available", or "unavailable: <reason>". */
  kvm: string;
  templates: number;
}

export function parseHealth(frame: FrameObject): DaemonHealth {
  return parse(HealthSchema, frame, "health");
}

export interface DaemonStats {
  executions: number;
  inFlight: number;
  admission: RuntimeAdmission;
  pools: { template: string; ready: number; target: number; forks: number }[];
}

export function parseStats(frame: FrameObject): DaemonStats {
  const s = parse(StatsSchema, frame, "stats");
  const { running, queued, queued_by_template, busy } = s.admission;
  return {
    executions: s.executions,
    inFlight: s.in_flight,
    admission: { running, queued, queuedByTemplate: queued_by_template, busy },
    pools: s.pools,
  };
}

/** The typed error for a daemon's error frame (PROTOCOL.md's table decides retryability). */
export function errorFromFrame(frame: FrameObject): RuntimeError {
  const e = parse(ErrorSchema, frame, "error");
  const message = `sandfork-vmm: ${e.message}`;
  const code = e.code as DaemonErrorCode;
  switch (code) {
    case "unavailable":
      return new RuntimeUnavailableError(message, "unavailable");
    case "busy":
      return new RuntimeBusyError(message, "busy", e.reason);
    case "internal":
      return new RuntimeInternalError(message);
    case "bad_frame":
    case "bad_request":
    case "unsupported_protocol":
    case "unknown_template":
    case "not_found":
    case "session_ended":
      return new RuntimeRequestError(code, message);
    default:
      return new RuntimeProtocolError(
        `the daemon answered with an error code protocol v1 does not define: ${e.code} (${e.message})`,
      );
  }
}
