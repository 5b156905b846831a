// Runs the agent tools (definitions.ts) for a caller, through the same ExecutionService as
// POST /v1/executions and SessionService as /v1/sessions (same limits, same billing). A call never throws for anything the model
// or the run got wrong: unknown tools, arguments that are not JSON or miss fields, an unknown
// language, no credits, a runtime failure all come back as an error result carrying our problem
// body, which the model can read and act on.
import type { z } from "zod";
import type { Principal } from "../auth/principal.js";
import type { GatewayContext } from "../context.js";
import type { ExecutionInput } from "../execution-service.js";
import { type ProblemBody, ProblemError } from "../problems.js";
import type { CheckedResult } from "../rich-results.js";
import { executionJson } from "../routes/openapi-helpers.js";
import { cellJson, sessionJson } from "../routes/sessions.js";
import { executionRequestSchema } from "../schemas.js";
import {
  CLOSE_SESSION,
  CloseSessionArguments,
  type CloseSessionResult,
  LIST_TEMPLATES,
  ListTemplatesArguments,
  type ListTemplatesResult,
  OPEN_SESSION,
  OpenSessionArguments,
  type OpenSessionResult,
  RUN_CELL,
  RUN_CODE,
  type RunCellArguments,
  type RunCellResult,
  type RunCodeArguments,
  type RunCodeResult,
  runCellArguments,
  runCodeArguments,
  TOOL_NAMES,
  type ToolDefinition,
  toolDefinitions,
} from "./definitions.js";

export type ToolResult =
  | {
      isError: false;
      structured:
        | RunCodeResult
        | ListTemplatesResult
        | OpenSessionResult
        | RunCellResult
        | CloseSessionResult;
      executionId: string | null;
      /** The run's images (base64), for the formats that carry them beside the text. */
      images: ToolImage[];
    }
  | { isError: true; problem: ProblemBody };

export interface ToolImage {
  mimeType: "image/png" | "image/jpeg";
  /** base64 */
  data: string;
}

/** What a model reads in place of an image: its type, pixel size when a PNG says it, and bytes. */
export function imageDescription(image: ToolImage): string {
  const bytes = Buffer.from(image.data, "base64");
  const size = pngSize(bytes);
  const pixels = size === undefined ? "" : `${size.width}x${size.height} px, `;
  return `${image.mimeType}, ${pixels}${bytes.length} bytes`;
}

/** A PNG's width and height from its IHDR chunk; undefined for anything else. */
function pngSize(png: Buffer): { width: number; height: number } | undefined {
  const signature = "89504e470d0a1a0a";
  if (png.length < 24 || png.subarray(0, 8).toString("hex") !== signature) return undefined;
  if (png.subarray(12, 16).toString("latin1") !== "IHDR") return undefined;
  return { width: png.readUInt32BE(16), height: png.readUInt32BE(20) };
}

/**
 * An execution's answer (POST /v1/executions, a cell's `execution`) and its rich results as a
 * tool result: what the model needs, whatever more the answer carries (its files) as it is, and
 * the results with each image described in the text and handed over beside it.
 */
function executionResult(
  execution: ReturnType<typeof executionJson>,
  results: readonly CheckedResult[],
): { structured: RunCodeResult & Record<string, unknown>; images: ToolImage[] } {
  const { id, template: _, created_at, finished_at, usage, ...rest } = execution;
  const images: ToolImage[] = [];
  const listed = results.map((r) => {
    if (r.type !== "image/png" && r.type !== "image/jpeg") return { type: r.type, data: r.data };
    const image = { mimeType: r.type, data: r.data };
    images.push(image);
    return { type: r.type, description: imageDescription(image) };
  });
  const structured = {
    ...rest,
    execution_id: id,
    stdout: execution.stdout ?? "",
    stderr: execution.stderr ?? "",
    truncated: execution.truncated ?? false,
    timings: execution.timings ?? { queue_ms: 0, fork_ms: 0, exec_ms: 0, total_ms: 0 },
    usage: { unit: usage.unit, units: usage.units ?? 0, network: usage.network },
    results: listed,
    files: execution.files ?? [],
  };
  return { structured, images };
}

function sessionResult(session: ReturnType<typeof sessionJson>): OpenSessionResult {
  return { session_id: session.id, template: session.template, state: session.state };
}

/**
 * What the model reads: the structured result, or the problem, as JSON; a run the network policy
 * refused something in says so in a line after it.
 */
export function toolResultText(result: ToolResult): string {
  if (result.isError) return JSON.stringify(result.problem);
  const text = JSON.stringify(result.structured);
  const { usage } = result.structured as { usage?: { network?: { refused: number } | null } };
  const refused = usage?.network?.refused ?? 0;
  return refused === 0
    ? text
    : `${text}\nThe network policy refused ${refused} connection attempt(s), send(s) or DNS question(s) of this run: the API key's network policy (or this call's network.allow) does not allow that destination.`;
}

function invalidArguments(tool: string, issues: z.core.$ZodIssue[]): ProblemError {
  const errors = issues.map((issue) => ({ path: issue.path.join("."), message: issue.message }));
  const summary = errors
    .map((e) => (e.path === "" ? e.message : `${e.path}: ${e.message}`))
    .join("; ");
  return new ProblemError(
    "invalid-tool-arguments",
    `the arguments of ${tool} do not match its schema: ${summary}`,
    { extensions: { errors } },
  );
}

function parseArguments<T>(tool: string, schema: z.ZodType<T>, args: unknown): T {
  const parsed = schema.safeParse(args);
  if (!parsed.success) throw invalidArguments(tool, parsed.error.issues);
  return parsed.data;
}

export class ToolRunner {
  readonly definitions: ToolDefinition[];
  private readonly runCodeSchema: ReturnType<typeof runCodeArguments>;
  private readonly runCellSchema: ReturnType<typeof runCellArguments>;
  private readonly executionSchema: ReturnType<typeof executionRequestSchema>;

  constructor(private readonly ctx: GatewayContext) {
    this.definitions = toolDefinitions(ctx.config.executionLimits);
    this.runCodeSchema = runCodeArguments(ctx.config.executionLimits);
    this.runCellSchema = runCellArguments(ctx.config.executionLimits);
    this.executionSchema = executionRequestSchema(ctx.config.executionLimits);
  }

  /** Runs tool `name` with `args` (already decoded); an Idempotency-Key bills a retried call once. */
  async call(
    principal: Principal,
    name: string,
    args: unknown,
    idempotencyKey: string | null = null,
  ): Promise<ToolResult> {
    try {
      switch (name) {
        case RUN_CODE:
          return await this.runCode(
            principal,
            parseArguments(RUN_CODE, this.runCodeSchema, args),
            idempotencyKey,
          );
        case LIST_TEMPLATES:
          parseArguments(LIST_TEMPLATES, ListTemplatesArguments, args);
          return await this.listTemplates();
        case OPEN_SESSION:
          return await this.openSession(
            principal,
            parseArguments(OPEN_SESSION, OpenSessionArguments, args),
          );
        case RUN_CELL:
          return await this.runCell(principal, parseArguments(RUN_CELL, this.runCellSchema, args));
        case CLOSE_SESSION:
          return await this.closeSession(
            principal,
            parseArguments(CLOSE_SESSION, CloseSessionArguments, args).session_id,
          );
        default:
          throw new ProblemError(
            "unknown-tool",
            `there is no tool named "${name}"; the tools are ${TOOL_NAMES.join(", ")}`,
            { extensions: { tools: [...TOOL_NAMES] } },
          );
      }
    } catch (error) {
      if (error instanceof ProblemError) return { isError: true, problem: error.body() };
      throw error;
    }
  }

  /** `call` with the arguments as the model wrote them: a JSON text (OpenAI's `arguments`). */
  callWithJson(
    principal: Principal,
    name: string,
    json: string,
    idempotencyKey: string | null = null,
  ): Promise<ToolResult> {
    let args: unknown;
    try {
      args = JSON.parse(json);
    } catch (error) {
      const problem = new ProblemError(
        "invalid-tool-arguments",
        `the arguments of ${name} are not valid JSON: ${(error as Error).message}`,
      );
      return Promise.resolve({ isError: true, problem: problem.body() });
    }
    return this.call(principal, name, args, idempotencyKey);
  }

  /**
   * The template asked for by name, which must exist (whether it runs `language` the execution
   * checks); else the one that runs `language` named after it, else the first.
   */
  private async templateFor(language: string, name?: string): Promise<string> {
    const templates = await this.ctx.executions.templates();
    if (name !== undefined) {
      if (templates.some((t) => t.name === name)) return name;
      throw new ProblemError("unknown-template", `no template named "${name}"`, {
        extensions: { templates: templates.map((t) => t.name) },
      });
    }
    const runs = templates.filter((t) => t.languages.includes(language));
    const template = runs.find((t) => t.name === language) ?? runs[0];
    if (template === undefined) {
      const languages = [...new Set(templates.flatMap((t) => t.languages))];
      throw new ProblemError(
        "unknown-template",
        `no template runs ${language}; the languages are ${languages.join(", ")}`,
        { extensions: { languages } },
      );
    }
    return template.name;
  }

  private async runCode(
    principal: Principal,
    args: RunCodeArguments,
    idempotencyKey: string | null,
  ): Promise<ToolResult> {
    // The REST API's own schema checks what run_code's does not (file paths, sizes).
    const candidate: ExecutionInput = {
      template: await this.templateFor(args.language, args.template),
      language: args.language,
      code: args.code,
      ...(args.stdin === undefined ? {} : { stdin: args.stdin }),
      ...(args.files === undefined ? {} : { files: args.files }),
      ...(args.timeout_ms === undefined ? {} : { timeout_ms: args.timeout_ms }),
      ...(args.max_processes === undefined ? {} : { max_processes: args.max_processes }),
      ...(args.network === undefined ? {} : { network: args.network }),
    };
    const input = parseArguments(RUN_CODE, this.executionSchema, candidate);
    const { record, output } = await this.ctx.executions.execute(principal, input, idempotencyKey);
    const execution = executionJson(record, this.ctx.config.pricing.unitName, {
      files: output.files,
    });
    return {
      isError: false,
      executionId: record.id,
      ...executionResult(execution, output.results ?? []),
    };
  }

  private async openSession(principal: Principal, args: OpenSessionArguments): Promise<ToolResult> {
    const row = await this.ctx.sessions.create(principal, {
      template: await this.templateFor(args.language, args.template),
    });
    return {
      isError: false,
      executionId: null,
      images: [],
      structured: sessionResult(sessionJson(row, this.ctx.config.pricing.unitName)),
    };
  }

  private async runCell(principal: Principal, args: RunCellArguments): Promise<ToolResult> {
    const outcome = await this.ctx.sessions.execute(principal, args.session_id, {
      code: args.code,
      timeout_ms: args.timeout_ms,
      max_processes: args.max_processes,
      network: args.network,
    });
    // The REST answer of the cell, flattened: its session, its own fields, its execution's.
    const { session, execution, results, ...cell } = cellJson(
      outcome,
      this.ctx.config.pricing.unitName,
    );
    const { structured, images } = executionResult(execution, results);
    return {
      isError: false,
      executionId: execution.id,
      images,
      structured: { ...sessionResult(session), ...cell, ...structured },
    };
  }

  private async closeSession(principal: Principal, id: string): Promise<ToolResult> {
    const session = sessionJson(
      await this.ctx.sessions.delete(principal, id),
      this.ctx.config.pricing.unitName,
    );
    return {
      isError: false,
      executionId: null,
      images: [],
      structured: {
        ...sessionResult(session),
        usage: { unit: session.usage.unit, units: session.usage.units },
      },
    };
  }

  private async listTemplates(): Promise<ToolResult> {
    const templates = await this.ctx.executions.templates();
    return {
      isError: false,
      executionId: null,
      images: [],
      structured: {
        templates: templates.map((t) => ({
          name: t.name,
          language: t.language,
          languages: t.languages,
          ready: t.ready,
        })),
      },
    };
  }
}
