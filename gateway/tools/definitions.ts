// The tools an LLM agent is given: their argument schemas (zod, one source for the validation
// and for the JSON Schema the model sees) and the definitions in the shapes the OpenAI and
// Anthropic APIs take. MCP lists the same definitions (gateway/mcp.ts).
import { z } from "zod";
import type { ExecutionLimits } from "../config.js";
import { refineFiles, WORK_PATH_RULES } from "../file-paths.js";
import { REQUEST_LIMITS } from "../request-limits.js";

export const RUN_CODE = "run_code";
export const LIST_TEMPLATES = "list_templates";
export type ToolName = typeof RUN_CODE | typeof LIST_TEMPLATES;

export function runCodeArguments(limits: ExecutionLimits) {
  return z
    .object({
      language: z
        .string()
        .min(1)
        .max(64)
        .describe(
          'The language of the code, e.g. "python", "javascript" or "typescript" (list_templates names the languages available)',
        ),
      code: z
        .string()
        .max(REQUEST_LIMITS.MAX_CODE_BYTES)
        .describe(
          `The complete program to run; what it prints is the result. At most ${REQUEST_LIMITS.MAX_CODE_BYTES} bytes of UTF-8`,
        ),
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
    })
    .strict();
}

export type RunCodeArguments = z.infer<ReturnType<typeof runCodeArguments>>;

export const ListTemplatesArguments = z.object({}).strict();

export interface ToolDefinition {
  name: ToolName;
  description: string;
  /** JSON Schema (2020-12) of the arguments object. */
  parameters: Record<string, unknown>;
  /** JSON Schema of the structured result, for clients that check it (MCP). */
  result: Record<string, unknown>;
}

const RunCodeResult = z.object({
  execution_id: z.string(),
  status: z
    .string()
    .describe(
      "completed (see exit_code), timed_out, memory_exceeded, output_exceeded, crashed or unsupported_syscall",
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
  usage: z.object({ unit: z.string(), units: z.number().int() }),
});
export type RunCodeResult = z.infer<typeof RunCodeResult>;

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
        "Runs a program in a fresh, isolated sandbox (no network) and returns its stdout, stderr, exit status and timings. " +
        "Print what you want to see. Each call is billed to the caller's API key.",
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
