// The tools an LLM agent is given: their argument schemas (zod, one source for the validation
// and for the JSON Schema the model sees) and the definitions in the shapes the OpenAI and
// Anthropic APIs take. MCP lists the same definitions (gateway/mcp.ts).
import { z } from "zod";
import type { ExecutionLimits } from "../config.js";
import { refineFiles, WORK_PATH_RULES } from "../file-paths.js";
import { MAX_NETWORK_RULES, NETWORK_RULES_DOC, ruleProblem } from "../network-policy.js";
import { REQUEST_LIMITS } from "../request-limits.js";

export const RUN_CODE = "run_code";
export const LIST_TEMPLATES = "list_templates";
export const OPEN_SESSION = "open_session";
export const RUN_CELL = "run_cell";
export const CLOSE_SESSION = "close_session";
export const TOOL_NAMES = [
  RUN_CODE,
  LIST_TEMPLATES,
  OPEN_SESSION,
  RUN_CELL,
  CLOSE_SESSION,
] as const;
export type ToolName = (typeof TOOL_NAMES)[number];

const LANGUAGE_DESCRIPTION =
  'The language of the code, e.g. "python", "javascript" or "typescript" (list_templates names the languages available)';

const TEMPLATE = z
  .string()
  .regex(/^[a-z0-9][a-z0-9._-]{0,63}$/)
  .optional()
  .describe(
    'The template to run in (list_templates names them), e.g. "python-data" for numpy, pandas and matplotlib; default: the one named after the language',
  );

/** The limits (and the network narrowing) a run_code call or a cell may set. */
function runLimits(limits: ExecutionLimits) {
  return {
    timeout_ms: z
      .number()
      .int()
      .min(1)
      .max(limits.maxTimeoutMs)
      .optional()
      .describe(`Wall-clock limit in milliseconds (default ${limits.defaultTimeoutMs})`),
    max_processes: z
      .number()
      .int()
      .min(1)
      .max(limits.maxProcesses)
      .optional()
      .describe(
        `Processes alive at once, the program included; a fork past it fails (default ${limits.maxProcesses})`,
      ),
    network: z
      .object({
        allow: z
          .array(
            z.string().superRefine((rule, ctx) => {
              const problem = ruleProblem(rule);
              if (problem !== undefined) ctx.addIssue({ code: "custom", message: problem });
            }),
          )
          .max(MAX_NETWORK_RULES)
          .describe(
            `What this run may reach, within what the API key allows. ${NETWORK_RULES_DOC}`,
          ),
      })
      .strict()
      .optional()
      .describe(
        "Narrows the API key's network policy for this run; without it the run gets the key's policy (a key without one reaches no network)",
      ),
  };
}

export function runCodeArguments(limits: ExecutionLimits) {
  return z
    .object({
      language: z.string().min(1).max(64).describe(LANGUAGE_DESCRIPTION),
      code: z
        .string()
        .max(REQUEST_LIMITS.MAX_CODE_BYTES)
        .describe(
          `The complete program to run; what it prints is the result, with the value of its last expression, its matplotlib charts and the files it writes under /work/out. At most ${REQUEST_LIMITS.MAX_CODE_BYTES} bytes of UTF-8`,
        ),
      template: TEMPLATE,
      stdin: z
        .string()
        .max(REQUEST_LIMITS.MAX_STDIN_BYTES)
        .optional()
        .describe(
          `Text given to the program on standard input, at most ${REQUEST_LIMITS.MAX_STDIN_BYTES} bytes of UTF-8`,
        ),
      files: z
        .array(
          z
            .object({
              path: z
                .string()
                .min(1)
                .describe(`Path relative to the working directory. ${WORK_PATH_RULES}`),
              content: z.string().describe("UTF-8 text"),
            })
            .strict(),
        )
        .max(64)
        .superRefine((files, ctx) => refineFiles(files, ctx))
        .optional()
        .describe(
          `Files placed in the working directory before the program starts; their contents and the code together at most ${REQUEST_LIMITS.MAX_FILES_BYTES} bytes`,
        ),
      ...runLimits(limits),
    })
    .strict();
}

export type RunCodeArguments = z.infer<ReturnType<typeof runCodeArguments>>;

export const ListTemplatesArguments = z.object({}).strict();

const SESSION_ID = z.string().uuid().describe("The session_id that open_session answered");

export const OpenSessionArguments = z
  .object({
    language: z.string().min(1).max(64).describe(LANGUAGE_DESCRIPTION),
    template: TEMPLATE,
  })
  .strict();
export type OpenSessionArguments = z.infer<typeof OpenSessionArguments>;

export function runCellArguments(limits: ExecutionLimits) {
  return z
    .object({
      session_id: SESSION_ID,
      code: z
        .string()
        .max(REQUEST_LIMITS.MAX_CODE_BYTES)
        .describe(
          `The cell: code run in the session's interpreter, after every earlier cell; the value of its last expression is returned. At most ${REQUEST_LIMITS.MAX_CODE_BYTES} bytes of UTF-8`,
        ),
      ...runLimits(limits),
    })
    .strict();
}
export type RunCellArguments = z.infer<ReturnType<typeof runCellArguments>>;

export const CloseSessionArguments = z.object({ session_id: SESSION_ID }).strict();
export type CloseSessionArguments = z.infer<typeof CloseSessionArguments>;

export interface ToolDefinition {
  name: ToolName;
  description: string;
  /** JSON Schema (2020-12) of the arguments object. */
  parameters: Record<string, unknown>;
  /** JSON Schema of the structured result, for clients that check it (MCP). */
  result: Record<string, unknown>;
}

const ExecutionFields = {
  execution_id: z.string(),
  status: z
    .string()
    .describe(
      "completed (see exit_code), timed_out, memory_exceeded, output_exceeded, network_exceeded, crashed or unsupported_syscall",
    ),
  exit_code: z.number().int().nullable(),
  stdout: z.string(),
  stderr: z.string(),
  truncated: z.boolean(),
  timings: z.object({
    queue_ms: z.number(),
    fork_ms: z.number(),
    exec_ms: z.number(),
    total_ms: z.number(),
  }),
  usage: z.object({
    unit: z.string(),
    units: z.number().int(),
    network: z
      .object({
        bytes_in: z.number().int(),
        bytes_out: z.number().int(),
        connections: z.number().int(),
        refused: z.number().int().describe("Connects, sends and DNS questions the policy refused"),
        dns_queries: z.number().int(),
      })
      .nullable()
      .describe("What the run did on the network; null when it had no network"),
  }),
  results: z
    .array(
      z.object({
        type: z.string(),
        data: z.string().optional().describe("The result, for every type but an image"),
        description: z
          .string()
          .optional()
          .describe("For an image: its size; the image itself is sent as image content"),
      }),
    )
    .describe(
      "Rich results in the order shown: charts (image/png), tables (text/html), then the last expression's value (text/plain)",
    ),
  files: z
    .array(z.object({ path: z.string(), size: z.number().int(), url: z.string().nullable() }))
    .describe("Files the program left under /work/out; url downloads one with the caller's key"),
};

// Loose: whatever more an execution's answer carries (rich results) is passed through.
const RunCodeResult = z.object(ExecutionFields).loose();
export type RunCodeResult = z.infer<typeof RunCodeResult>;

const SessionFields = {
  session_id: z.string(),
  template: z.string(),
  state: z
    .string()
    .describe(
      "running; paused (resumed by the next cell); ended (its program stopped: open a new session)",
    ),
};

const OpenSessionResult = z.object(SessionFields);
export type OpenSessionResult = z.infer<typeof OpenSessionResult>;

const RunCellResult = z
  .object({
    ...SessionFields,
    value: z
      .string()
      .nullable()
      .describe("repr() of the cell's last expression; null for a statement or None"),
    error: z
      .object({ name: z.string(), message: z.string() })
      .nullable()
      .describe("The exception that ended the cell (its traceback is in stderr)"),
    resumed: z.boolean().describe("The session was paused (idle) and resumed for this cell"),
    ...ExecutionFields,
  })
  .loose();
export type RunCellResult = z.infer<typeof RunCellResult>;

const CloseSessionResult = z.object({
  ...SessionFields,
  usage: z
    .object({ unit: z.string(), units: z.number().int() })
    .describe(
      "What the session was charged for its running time and checkpoints (cells are charged as executions)",
    ),
});
export type CloseSessionResult = z.infer<typeof CloseSessionResult>;

const ListTemplatesResult = z.object({
  templates: z.array(
    z.object({
      name: z.string(),
      language: z.string(),
      languages: z.array(z.string()),
      ready: z.boolean(),
    }),
  ),
});
export type ListTemplatesResult = z.infer<typeof ListTemplatesResult>;

function jsonSchema(schema: z.ZodType): Record<string, unknown> {
  const { $schema: _, ...rest } = z.toJSONSchema(schema) as Record<string, unknown>;
  return rest;
}

export function toolDefinitions(limits: ExecutionLimits): ToolDefinition[] {
  return [
    {
      name: RUN_CODE,
      description:
        "Runs a program in a fresh, isolated sandbox and returns its stdout, stderr, exit status and timings, " +
        "the value of its last expression, its charts (matplotlib figures, as images) and tables (pandas DataFrames, as HTML), " +
        "and the files it wrote under /work/out. It reaches the network only where the API key's network policy allows " +
        "(none by default). Print what you want to see; nothing is kept for the next call " +
        "(open_session keeps state). Each call is billed to the caller's API key.",
      parameters: jsonSchema(runCodeArguments(limits)),
      result: jsonSchema(RunCodeResult),
    },
    {
      name: LIST_TEMPLATES,
      description:
        "Lists the sandbox templates and the language each runs (the values run_code accepts as language).",
      parameters: jsonSchema(ListTemplatesArguments),
      result: jsonSchema(ListTemplatesResult),
    },
    {
      name: OPEN_SESSION,
      description:
        "Opens a session: a sandbox (no network) whose interpreter keeps its variables, imports and files from one run_cell to the next, " +
        "like a notebook. Use it when later steps build on earlier ones; close it with close_session when done. " +
        "Billed while it exists, and per cell.",
      parameters: jsonSchema(OpenSessionArguments),
      result: jsonSchema(OpenSessionResult),
    },
    {
      name: RUN_CELL,
      description:
        "Runs code as the next cell of a session from open_session: every earlier cell's variables and imports are there. " +
        "Returns the value of the last expression, stdout, stderr, the exception if one ended the cell, and the exit status.",
      parameters: jsonSchema(runCellArguments(limits)),
      result: jsonSchema(RunCellResult),
    },
    {
      name: CLOSE_SESSION,
      description: "Closes a session from open_session: its sandbox and its state are gone.",
      parameters: jsonSchema(CloseSessionArguments),
      result: jsonSchema(CloseSessionResult),
    },
  ];
}

export type ToolFormat = "openai" | "anthropic";

/** The definitions as the chat APIs take them: OpenAI `tools[]` items or Anthropic `tools[]` entries. */
export function formatTools(definitions: ToolDefinition[], format: ToolFormat) {
  return definitions.map((tool) =>
    format === "openai"
      ? {
          type: "function" as const,
          function: { name: tool.name, description: tool.description, parameters: tool.parameters },
        }
      : {
          name: tool.name,
          description: tool.description,
          input_schema: { ...tool.parameters, type: "object" as const },
        },
  );
}
