// The client's request and response types (client/index.ts) against the OpenAPI document the
// gateway serves: for each type, the same fields as the schema, optional where the schema does
// not require them, nullable where it allows null, string enums with the same values, and nested
// objects checked the same way: a field added to the API and not to the client (or the other way
// round) fails here.
import { readFileSync } from "node:fs";
import { beforeAll, describe, expect, it } from "vitest";
import {
  type ClientType,
  openApiComponents,
  type Schema,
  schemaAt,
  typeDifferences,
} from "../gateway/testing/client-types.js";

/** Client type → where its schema is in the document's components (a path below `schemas`). */
const CHECKED: Record<string, string[]> = {
  ExecutionRequest: ["ExecutionRequest"],
  ExecutionFile: ["ExecutionRequest", "properties", "files", "items"],
  Execution: ["Execution"],
  ExecutionStatus: ["Execution", "properties", "status"],
  RichResult: ["RichResult"],
  RichResultType: ["RichResult", "properties", "type"],
  OutputFile: ["OutputFile"],
  Template: ["Template"],
  NetworkRequest: ["NetworkRequest"],
  NetworkUsage: ["NetworkUsage"],
  CustomTemplate: ["CustomTemplate"],
  CreateSession: ["CreateSession"],
  SessionInfo: ["Session"],
  SessionCellRequest: ["SessionCellRequest"],
  SessionCell: ["SessionCell"],
  SessionCheckpoint: ["SessionCheckpoint"],
  ForkSession: ["ForkSession"],
  ForkedSessions: ["ForkedSessions"],
  SessionFile: ["SessionFile"],
  TemplateBuild: ["TemplateBuild"],
  SessionTemplateRequest: ["SessionTemplateRequest"],
  Problem: ["Problem"],
  OpenAIToolCall: ["OpenAIToolCall"],
  OpenAIToolMessage: ["OpenAIToolMessage"],
  AnthropicToolUse: ["AnthropicToolUse"],
  AnthropicToolResult: ["AnthropicToolResult"],
};

// client/index.ts, read as text: its declarations are plain interfaces and type aliases of
// fields, inline objects, arrays, string-literal unions and `| null` (the TypeScript in use here
// has no compiler API to ask).
const SOURCE = readFileSync(new URL("./index.ts", import.meta.url), "utf8")
  .replace(/\/\*[\s\S]*?\*\//g, "")
  .replace(/\/\/.*$/gm, "");

/** The text of the client's declaration `name`: an interface's `{ ... }` or an alias's right side. */
function declaration(name: string): string {
  const alias = new RegExp(`export type ${name} =([^;]+);`).exec(SOURCE);
  if (alias !== null) return (alias[1] as string).trim();
  const at = SOURCE.search(new RegExp(`export interface ${name} \\{`));
  if (at < 0) throw new Error(`client/index.ts has no type ${name}`);
  const open = SOURCE.indexOf("{", at);
  return SOURCE.slice(open, closing(SOURCE, open) + 1);
}

/** The index of the bracket closing the one at `open`. */
function closing(text: string, open: number): number {
  let depth = 0;
  for (let i = open; i < text.length; i++) {
    if ("{([<".includes(text[i] as string)) depth++;
    else if ("})]>".includes(text[i] as string) && --depth === 0) return i;
  }
  throw new Error(`unbalanced: ${text.slice(open, open + 80)}`);
}

/** Splits `text` at `separator`s outside brackets and string literals. */
function splitTop(text: string, separators: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let quote: string | null = null;
  let from = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i] as string;
    if (quote !== null) {
      if (c === quote) quote = null;
    } else if (c === '"' || c === "'") quote = c;
    else if ("{([<".includes(c)) depth++;
    else if ("})]>".includes(c)) depth--;
    else if (depth === 0 && separators.includes(c)) {
      parts.push(text.slice(from, i));
      from = i + 1;
    }
  }
  parts.push(text.slice(from));
  return parts.map((p) => p.trim()).filter((p) => p !== "");
}

/** An object type's fields: name → [optional, type text]; index signatures left out. */
function fields(body: string): Map<string, [boolean, string]> {
  const members = splitTop(body.trim().slice(1, -1), ";\n");
  const found = new Map<string, [boolean, string]>();
  for (const member of members) {
    const match = /^(\w+)(\??):\s*([\s\S]+)$/.exec(member);
    if (match !== null)
      found.set(match[1] as string, [match[2] === "?", (match[3] as string).trim()]);
  }
  return found;
}

/** The client's type written `text`, as the comparison walks it. */
function clientType(text: string): ClientType {
  let parts = splitTop(text, "|");
  if (parts.length === 1 && /^[A-Z]\w*$/.test(parts[0] as string) && parts[0] !== "Record")
    parts = splitTop(declaration(parts[0] as string), "|");
  const nonNull = parts.filter((p) => p !== "null" && p !== "undefined");
  const one = nonNull.length === 1 ? (nonNull[0] as string) : undefined;
  const body =
    one === undefined
      ? undefined
      : one.startsWith("{")
        ? one
        : /^[A-Z]\w*$/.test(one)
          ? declaration(one)
          : undefined;
  return {
    text,
    nullable: parts.includes("null"),
    enumValues: nonNull.every((p) => /^"[^"]*"$/.test(p))
      ? nonNull.map((p) => p.slice(1, -1))
      : undefined,
    items: one?.endsWith("[]") ? clientType(one.slice(0, -2)) : undefined,
    fields:
      body?.startsWith("{") === true
        ? new Map(
            [...fields(body)].map(([name, [optional, type]]) => [
              name,
              { optional, type: clientType(type) },
            ]),
          )
        : undefined,
  };
}

describe("the TypeScript client's types against the OpenAPI document", () => {
  let components: Record<string, Schema>;
  beforeAll(async () => {
    components = await openApiComponents();
  });

  it.each(Object.entries(CHECKED))("%s has the fields of its schema", (name, path) => {
    const schema = schemaAt(components, path);
    if (schema === undefined) throw new Error(`the document has no ${path.join(".")}`);
    expect(typeDifferences(clientType(name), schema, name, components)).toEqual([]);
  });
});
