// `sandfork`: a small typed client of the gateway's HTTP API (fetch only, no dependencies):
// executions (plain and streamed), templates, sessions (cells, checkpoints, pause, resume, fork,
// files), and the agent-tool helpers (tool definitions in the OpenAI / Anthropic formats, running
// a model's tool call).

export interface ExecutionFile {
  path: string;
  content: string;
  encoding?: "utf8" | "base64";
}

export interface ExecutionRequest {
  template: string;
  code: string;
  /** One of the template's `languages` (e.g. `typescript` on the node template); default: its first. */
  language?: string;
  stdin?: string;
  args?: string[];
  env?: Record<string, string>;
  files?: ExecutionFile[];
  timeout_ms?: number;
  memory_mb?: number;
  /** Processes alive at once, the program included; a fork past it fails (default: the gateway's maximum). */
  max_processes?: number;
  /** Narrows the API key's network policy for this run (a key without one reaches no network). */
  network?: NetworkRequest;
  /** Answer with an event stream (what `stream()` asks for with its Accept header). */
  stream?: boolean;
}

/** Rules `host[:ports]`: `example.com`, `*.example.com`, `203.0.113.0/24`, `[2001:db8::/32]:443`. */
export interface NetworkRequest {
  allow: string[];
  max_connections?: number;
  max_bytes?: number;
}

/** What a run did on the network. */
export interface NetworkUsage {
  bytes_in: number;
  bytes_out: number;
  connections: number;
  /** Connects, sends and DNS questions the policy refused. */
  refused: number;
  dns_queries: number;
}

export type ExecutionStatus =
  | "running"
  | "completed"
  | "timed_out"
  | "memory_exceeded"
  | "output_exceeded"
  | "crashed"
  | "unsupported_syscall"
  | "deadlocked"
  | "network_exceeded"
  | "aborted";

export interface Execution {
  id: string;
  template: string;
  status: ExecutionStatus;
  exit_code: number | null;
  stdout: string | null;
  stderr: string | null;
  truncated: boolean | null;
  timings: { queue_ms: number; fork_ms: number; exec_ms: number; total_ms: number } | null;
  usage: {
    unit: string;
    reserved_units: number;
    units: number | null;
    /** Null when the run was granted no network. */
    network: NetworkUsage | null;
  };
  created_at: string;
  finished_at: string | null;
  /** The run's charts, tables and last value, in the order shown (only in the run's own answer). */
  results?: RichResult[];
  /** The files the program left under /work/out (`file(url)` downloads one). */
  files?: OutputFile[];
}

export type RichResultType =
  | "text/plain"
  | "text/html"
  | "text/markdown"
  | "text/latex"
  | "image/png"
  | "image/jpeg"
  | "image/svg+xml"
  | "application/json";

export interface RichResult {
  type: RichResultType;
  /** base64 for image/png and image/jpeg, text otherwise. */
  data: string;
}

export interface OutputFile {
  path: string;
  size: number;
  /** Relative to the gateway's base URL; null when the file was not kept (see reason). */
  url: string | null;
  expires_at: string | null;
  reason?: "not_transferred" | "invalid_path" | "quota_exceeded" | "store_failed";
}

export interface Template {
  name: string;
  /** The runtime the template holds: python, node. */
  language: string;
  /** The languages an execution may ask for; the first is the default. */
  languages: string[];
  content_hash: string;
  ready: boolean;
  price: {
    unit: string;
    base_units: number;
    units_per_second: number;
    units_per_network_mib: number;
  };
}

/** A template built through the API, as GET /v1/templates lists it. */
export interface CustomTemplate {
  name: string;
  version: string;
  /** name@version, what an execution's `template` names. */
  ref: string;
  status: "queued" | "building" | "ready" | "failed";
  build_id: string;
  published: boolean;
  own: boolean;
  image_bytes: number | null;
  created_at: string;
}

/** A template definition for POST /v1/templates (docs/api.md, Templates). */
export interface TemplateDefinition {
  name: string;
  version: string;
  base: string;
  debian_packages?: string[];
  exclude_packages?: string[];
  exclude?: string[];
  wheels?: { filename: string; content_base64: string }[];
  files?: { path: string; content: string; encoding?: "utf8" | "base64" }[];
  env?: { [name: string]: string };
  /** A Python program run once before the snapshot. */
  setup?: string;
  memory_mib?: number;
}

/** A template build: its status, the step running or failed, its logs. */
export interface TemplateBuild {
  id: string;
  name: string;
  version: string;
  description: string | null;
  /** The session it was saved from; null: built from a definition. */
  from_session: string | null;
  status: "queued" | "building" | "ready" | "failed";
  step: string | null;
  error: string | null;
  logs: string;
  image_bytes: number | null;
  snapshot_bytes: number | null;
  published: boolean;
  created_at: string;
  finished_at: string | null;
}

/** POST /v1/sessions/{id}/template: the session's state as a template of the account. */
export interface SessionTemplateRequest {
  name: string;
  /** Absent: the next whole number after the name's highest version. */
  version?: string;
  description?: string;
}

/** One event of a followed template build, in order: step and log events, then build. */
export type TemplateBuildEvent =
  | { event: "step"; step: string }
  | { event: "log"; text: string }
  | { event: "build"; build: TemplateBuild };

/** An RFC 9457 problem body; `type` is https://sandfork.dev/problems/<slug>. */
export interface Problem {
  type: string;
  title: string;
  status: number;
  detail?: string;
  instance?: string;
  retryable: boolean;
  [extension: string]: unknown;
}

/** POST /v1/sessions: a sandbox whose interpreter keeps its state across cells. */
export interface CreateSession {
  template: string;
  /** Paused after this long without a call. */
  idle_timeout_s?: number;
  /** Deleted this long after its creation. */
  max_lifetime_s?: number;
  memory_mib?: number;
}

export interface SessionInfo {
  id: string;
  template: string;
  /** paused: its state is in its last checkpoint, resumed by the next call; ended: fork it. */
  state: "running" | "paused" | "ended" | "deleted";
  memory_mib: number;
  idle_timeout_s: number;
  max_lifetime_s: number;
  last_checkpoint: { checkpoint: number; sha256: string } | null;
  checkpoint_bytes: number;
  cells: number;
  usage: {
    unit: string;
    units: number;
    running_gib_seconds: number;
    checkpoint_gib_hours: number;
  };
  ended_reason: string | null;
  created_at: string;
  last_active_at: string;
}

/** A cell: the code runs in the session's interpreter, after the cells before it. */
export interface SessionCellRequest {
  code: string;
  timeout_ms?: number;
  max_processes?: number;
  /** Narrows the API key's network policy for this cell. */
  network?: NetworkRequest;
}

/** A cell's outcome: the last expression's repr as `value`, or the exception as `error`. */
export interface SessionCell {
  value: string | null;
  error: { name: string; message: string } | null;
  results: RichResult[];
  /** The session was paused and resumed for this cell. */
  resumed: boolean;
  execution: Execution;
  session: SessionInfo;
}

export interface SessionCheckpoint {
  /** Its number in the session, for `forkSession`. */
  checkpoint: number;
  sha256: string;
  file_bytes: number;
  dirty_bytes: number;
  timings: { capture_ms: number; write_ms: number };
  session: SessionInfo;
}

export interface ForkSession {
  /** Default: the session's last checkpoint. */
  checkpoint?: number;
  /** Sessions to make at once, all or none. */
  count?: number;
}

export interface ForkedSessions {
  sessions: SessionInfo[];
}

export interface SessionFile {
  path: string;
  bytes: number;
}

/** One event of a streamed execution, in order: started, output…, then execution. */
export type StreamEvent =
  | { event: "started"; id: string }
  | { event: "output"; stream: "stdout" | "stderr"; data: string }
  | { event: "execution"; execution: Execution };

export type ToolFormat = "openai" | "anthropic";

export interface OpenAITool {
  type: "function";
  function: { name: string; description: string; parameters: Record<string, unknown> };
}

export interface AnthropicTool {
  name: string;
  description: string;
  input_schema: { type: "object"; [keyword: string]: unknown };
}

/** An item of an OpenAI assistant message's `tool_calls`. */
export interface OpenAIToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

/** A `tool_use` content block of an Anthropic assistant message. */
export interface AnthropicToolUse {
  type: "tool_use";
  id: string;
  name: string;
  input?: unknown;
}

export interface OpenAIToolMessage {
  role: "tool";
  tool_call_id: string;
  content: string;
}

export type AnthropicContentBlock =
  | { type: "text"; text: string }
  | {
      type: "image";
      source: { type: "base64"; media_type: "image/png" | "image/jpeg"; data: string };
    };

export interface AnthropicToolResult {
  type: "tool_result";
  tool_use_id: string;
  /** The result's JSON, with an image block per chart when there are any. */
  content: string | AnthropicContentBlock[];
  is_error: boolean;
}

/** A problem+json answer, or an `error` event of a stream. */
export class SandforkError extends Error {
  constructor(
    readonly status: number,
    readonly problem: Problem,
  ) {
    super(
      `${problem.title}${problem.detail === undefined ? "" : `: ${problem.detail}`} (${problem.type})`,
    );
    this.name = "SandforkError";
  }
}

export interface SandforkOptions {
  /** The gateway, e.g. http://127.0.0.1:8787 */
  baseUrl: string;
  /** An API key (sfk_…) or a token from POST /v1/tokens. */
  apiKey: string;
  fetch?: typeof fetch;
}

export interface CallOptions {
  idempotencyKey?: string;
  signal?: AbortSignal;
}

export class Sandfork {
  private readonly baseUrl: string;
  private readonly fetch: typeof fetch;

  constructor(private readonly options: SandforkOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.fetch = options.fetch ?? fetch;
  }

  /** Runs code and waits for its end. */
  async execute(request: ExecutionRequest, options: CallOptions = {}): Promise<Execution> {
    return (await this.json("POST", "/v1/executions", request, options)) as Execution;
  }

  /** Runs code and yields its output as the program writes it, ending with the execution. */
  async *stream(
    request: ExecutionRequest,
    options: CallOptions = {},
  ): AsyncGenerator<StreamEvent, void, undefined> {
    const response = await this.send(
      "POST",
      "/v1/executions",
      request,
      options,
      "text/event-stream",
    );
    if (response.body === null) throw new Error("the gateway sent no event stream");
    for await (const { event, data } of serverSentEvents(response.body)) {
      const payload = JSON.parse(data) as Record<string, unknown>;
      if (event === "started") yield { event, id: payload.id as string };
      else if (event === "output")
        yield {
          event,
          stream: payload.stream as "stdout" | "stderr",
          data: payload.data as string,
        };
      else if (event === "execution") {
        yield { event, execution: payload as unknown as Execution };
        return;
      } else if (event === "error")
        throw new SandforkError((payload as Problem).status, payload as Problem);
    }
    throw new Error("the event stream ended before the execution's final event");
  }

  /** Downloads an execution's output file by its `files[].url`. */
  async file(url: string, options: CallOptions = {}): Promise<Uint8Array> {
    const response = await this.send("GET", url, undefined, options, "application/octet-stream");
    return new Uint8Array(await response.arrayBuffer());
  }

  async templates(): Promise<Template[]> {
    return ((await this.json("GET", "/v1/templates", undefined, {})) as { templates: Template[] })
      .templates;
  }

  /** The templates built through the API that the caller's account may see. */
  async customTemplates(): Promise<CustomTemplate[]> {
    return (
      (await this.json("GET", "/v1/templates", undefined, {})) as {
        custom_templates: CustomTemplate[];
      }
    ).custom_templates;
  }

  /** Queues the build of a template (the key needs the templates scope). */
  async buildTemplate(definition: TemplateDefinition): Promise<TemplateBuild> {
    return (await this.json("POST", "/v1/templates", definition, {})) as TemplateBuild;
  }

  async templateBuild(name: string, id: string): Promise<TemplateBuild> {
    return (await this.json(
      "GET",
      `/v1/templates/${encodeURIComponent(name)}/builds/${encodeURIComponent(id)}`,
      undefined,
      {},
    )) as TemplateBuild;
  }

  /** Follows a build as it runs: its steps and logs, ending with the build ready or failed. */
  async *followTemplateBuild(
    name: string,
    id: string,
    options: CallOptions = {},
  ): AsyncGenerator<TemplateBuildEvent, void, undefined> {
    const response = await this.send(
      "GET",
      `/v1/templates/${encodeURIComponent(name)}/builds/${encodeURIComponent(id)}`,
      undefined,
      options,
      "text/event-stream",
    );
    if (response.body === null) throw new Error("the gateway sent no event stream");
    for await (const { event, data } of serverSentEvents(response.body)) {
      const payload = JSON.parse(data) as Record<string, unknown>;
      if (event === "step") yield { event, step: payload.step as string };
      else if (event === "log") yield { event, text: payload.text as string };
      else if (event === "build") {
        yield { event, build: payload as unknown as TemplateBuild };
        return;
      }
    }
    throw new Error("the event stream ended before the build's final event");
  }

  /** Deletes name@version of the caller's account. */
  async deleteTemplate(ref: string): Promise<void> {
    await this.send("DELETE", `/v1/templates/${encodeURIComponent(ref)}`, undefined, {}, "*/*");
  }

  /** A new session of `request.template`. */
  async createSession(request: CreateSession, options: CallOptions = {}): Promise<SessionInfo> {
    return (await this.json("POST", "/v1/sessions", request, options)) as SessionInfo;
  }

  /** The key's sessions (not deleted), newest first. */
  async sessions(): Promise<SessionInfo[]> {
    return ((await this.json("GET", "/v1/sessions", undefined, {})) as { sessions: SessionInfo[] })
      .sessions;
  }

  async session(id: string): Promise<SessionInfo> {
    return (await this.json("GET", sessionPath(id), undefined, {})) as SessionInfo;
  }

  /** Runs the session's next cell; earlier cells' variables and imports are there. */
  async runCell(
    id: string,
    request: SessionCellRequest,
    options: CallOptions = {},
  ): Promise<SessionCell> {
    return (await this.json(
      "POST",
      `${sessionPath(id)}/executions`,
      request,
      options,
    )) as SessionCell;
  }

  /** A durable checkpoint; the session runs on. */
  async checkpointSession(id: string): Promise<SessionCheckpoint> {
    return (await this.json(
      "POST",
      `${sessionPath(id)}/checkpoints`,
      undefined,
      {},
    )) as SessionCheckpoint;
  }

  /** A checkpoint, then the session's VM is released (the next call resumes it). */
  async pauseSession(id: string): Promise<SessionCheckpoint> {
    return (await this.json(
      "POST",
      `${sessionPath(id)}/pause`,
      undefined,
      {},
    )) as SessionCheckpoint;
  }

  async resumeSession(id: string): Promise<SessionInfo> {
    return (await this.json("POST", `${sessionPath(id)}/resume`, undefined, {})) as SessionInfo;
  }

  /** A new session from a checkpoint; with `count`, that many at once (all or none). */
  forkSession(id: string, request?: ForkSession & { count?: undefined }): Promise<SessionInfo>;
  forkSession(id: string, request: ForkSession & { count: number }): Promise<ForkedSessions>;
  async forkSession(id: string, request: ForkSession = {}): Promise<SessionInfo | ForkedSessions> {
    return (await this.json("POST", `${sessionPath(id)}/fork`, request, {})) as
      | SessionInfo
      | ForkedSessions;
  }

  /**
   * Saves the session's state (variables, imports, /work files) as template `name@version` of the
   * account, ready when this answers; executions and sessions then name it as `template`.
   */
  async saveSessionTemplate(id: string, request: SessionTemplateRequest): Promise<TemplateBuild> {
    return (await this.json("POST", `${sessionPath(id)}/template`, request, {})) as TemplateBuild;
  }

  /** Ends the session and removes its checkpoints; answers its final usage. */
  async deleteSession(id: string): Promise<SessionInfo> {
    return (await this.json("DELETE", sessionPath(id), undefined, {})) as SessionInfo;
  }

  /** Puts `content` at the session's /work/`path`. */
  async writeSessionFile(
    id: string,
    path: string,
    content: Uint8Array | string,
  ): Promise<SessionFile> {
    const bytes = typeof content === "string" ? new TextEncoder().encode(content) : content;
    const response = await this.send(
      "PUT",
      sessionFilePath(id, path),
      bytes,
      {},
      "application/json",
    );
    return (await response.json()) as SessionFile;
  }

  async readSessionFile(id: string, path: string): Promise<Uint8Array> {
    const response = await this.send(
      "GET",
      sessionFilePath(id, path),
      undefined,
      {},
      "application/octet-stream",
    );
    return new Uint8Array(await response.arrayBuffer());
  }

  async deleteSessionFile(id: string, path: string): Promise<void> {
    await this.send("DELETE", sessionFilePath(id, path), undefined, {}, "*/*");
  }

  /** The agent tools (run_code, list_templates, the session tools), for a chat request's `tools`. */
  tools(format: "openai"): Promise<OpenAITool[]>;
  tools(format: "anthropic"): Promise<AnthropicTool[]>;
  async tools(format: ToolFormat): Promise<OpenAITool[] | AnthropicTool[]> {
    return (
      (await this.json("GET", `/v1/tools?format=${format}`, undefined, {})) as {
        tools: OpenAITool[] | AnthropicTool[];
      }
    ).tools;
  }

  /** Runs a model's tool call; the answer is the message (OpenAI) or block (Anthropic) to send back. */
  toolCall(call: OpenAIToolCall, options?: CallOptions): Promise<OpenAIToolMessage>;
  toolCall(call: AnthropicToolUse, options?: CallOptions): Promise<AnthropicToolResult>;
  async toolCall(
    call: OpenAIToolCall | AnthropicToolUse,
    options: CallOptions = {},
  ): Promise<OpenAIToolMessage | AnthropicToolResult> {
    // Only what the gateway reads: SDK objects carry more (and may not serialize plainly).
    const body =
      call.type === "function"
        ? {
            id: call.id,
            type: call.type,
            function: { name: call.function.name, arguments: call.function.arguments },
          }
        : { id: call.id, type: call.type, name: call.name, input: call.input };
    return (await this.json("POST", "/v1/tool-calls", body, options)) as
      | OpenAIToolMessage
      | AnthropicToolResult;
  }

  private async json(
    method: string,
    path: string,
    body: unknown,
    options: CallOptions,
  ): Promise<unknown> {
    return (await this.send(method, path, body, options, "application/json")).json();
  }

  private async send(
    method: string,
    path: string,
    body: unknown,
    options: CallOptions,
    accept: string,
  ): Promise<Response> {
    const headers: Record<string, string> = {
      authorization: `Bearer ${this.options.apiKey}`,
      accept,
    };
    const raw = body instanceof Uint8Array;
    if (body !== undefined)
      headers["content-type"] = raw ? "application/octet-stream" : "application/json";
    if (options.idempotencyKey !== undefined) headers["idempotency-key"] = options.idempotencyKey;
    const response = await this.fetch(`${this.baseUrl}${path}`, {
      method,
      headers,
      ...(body === undefined ? {} : { body: raw ? body : JSON.stringify(body) }),
      ...(options.signal === undefined ? {} : { signal: options.signal }),
    });
    if (!response.ok) {
      const text = await response.text();
      let problem: Problem;
      try {
        problem = JSON.parse(text) as Problem;
      } catch {
        problem = {
          type: "about:blank",
          title: response.statusText,
          status: response.status,
          detail: text,
          retryable: false,
        };
      }
      throw new SandforkError(response.status, problem);
    }
    return response;
  }
}

function sessionPath(id: string): string {
  return `/v1/sessions/${encodeURIComponent(id)}`;
}

/** A session file's URL: each segment of `path` (below /work) escaped, its slashes kept. */
function sessionFilePath(id: string, path: string): string {
  return `${sessionPath(id)}/files/${path.split("/").map(encodeURIComponent).join("/")}`;
}

/** The events of a text/event-stream body (the fields this API sends: event and data). */
async function* serverSentEvents(
  body: ReadableStream<Uint8Array>,
): AsyncGenerator<{ event: string; data: string }> {
  const decoder = new TextDecoder();
  let buffered = "";
  for await (const bytes of body as unknown as AsyncIterable<Uint8Array>) {
    buffered += decoder.decode(bytes, { stream: true });
    for (let end = buffered.search(/\r?\n\r?\n/); end >= 0; end = buffered.search(/\r?\n\r?\n/)) {
      const block = buffered.slice(0, end);
      buffered = buffered.slice(end).replace(/^\r?\n\r?\n/, "");
      let event = "message";
      const data: string[] = [];
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length > 0) yield { event, data: data.join("\n") };
    }
  }
}
