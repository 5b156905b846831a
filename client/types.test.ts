// The client's request and response types (client/index.ts) against the OpenAPI document the
// gateway serves: for each type, the same fields as the schema, optional where the schema does
// not require them, nullable where it allows null, string enums with the same values, and nested
// objects checked the same way: a field added to the API and not to the client (or the other way
// round) fails here.
import { readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OPENAPI_PATH } from "../gateway/app.js";
import { startTestGateway, type TestGateway } from "../gateway/testing/test-gateway.js";

interface Schema {
  type?: string | string[];
  properties?: Record<string, Schema>;
  required?: string[];
  items?: Schema;
  enum?: unknown[];
  $ref?: string;
}

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

/** The differences between the client's type (as text) and `schema`, each as "where: what". */
function differences(
  text: string,
  schema: Schema,
  where: string,
  components: Record<string, Schema>,
): string[] {
  if (schema.$ref !== undefined)
    return differences(
      text,
      components[schema.$ref.replace("#/components/schemas/", "")] ?? {},
      where,
      components,
    );
  const found: string[] = [];
  let parts = splitTop(text, "|");
  if (parts.length === 1 && /^[A-Z]\w*$/.test(parts[0] as string) && parts[0] !== "Record")
    parts = splitTop(declaration(parts[0] as string), "|");
  const allowsNull = parts.includes("null");
  const nonNull = parts.filter((p) => p !== "null" && p !== "undefined");
  const types =
    schema.type === undefined ? [] : Array.isArray(schema.type) ? schema.type : [schema.type];
  if (types.length > 0 && types.includes("null") !== allowsNull)
    found.push(
      `${where}: ${types.includes("null") ? "the API allows null, the client does not" : "the client allows null, the API does not"}`,
    );
  if (schema.enum !== undefined && nonNull.every((p) => /^"[^"]*"$/.test(p))) {
    const values = nonNull.map((p) => p.slice(1, -1)).sort();
    const expected = schema.enum.map(String).sort();
    if (JSON.stringify(values) !== JSON.stringify(expected))
      found.push(
        `${where}: values ${JSON.stringify(values)}, the API's ${JSON.stringify(expected)}`,
      );
  }
  const one = nonNull.length === 1 ? (nonNull[0] as string) : undefined;
  if (types.includes("array") && schema.items !== undefined) {
    if (one === undefined || !one.endsWith("[]"))
      found.push(`${where}: the API has an array, the client ${text}`);
    else found.push(...differences(one.slice(0, -2), schema.items, `${where}[]`, components));
  }
  if (schema.properties !== undefined) {
    const body =
      one === undefined
        ? undefined
        : one.startsWith("{")
          ? one
          : /^[A-Z]\w*$/.test(one)
            ? declaration(one)
            : undefined;
    if (body === undefined || !body.startsWith("{"))
      return [...found, `${where}: the API has an object, the client ${text}`];
    const required = new Set(schema.required ?? []);
    const clientFields = fields(body);
    for (const [field, fieldSchema] of Object.entries(schema.properties)) {
      const entry = clientFields.get(field);
      if (entry === undefined) {
        found.push(`${where}.${field}: in the API, missing from the client`);
        continue;
      }
      const [optional, type] = entry;
      if (optional === required.has(field))
        found.push(
          `${where}.${field}: ${required.has(field) ? "required in the API, optional in the client" : "optional in the API, required in the client"}`,
        );
      found.push(...differences(type, fieldSchema, `${where}.${field}`, components));
    }
    for (const field of clientFields.keys())
      if (!(field in schema.properties))
        found.push(`${where}.${field}: in the client, not in the API`);
  }
  return found;
}

describe("the TypeScript client's types against the OpenAPI document", () => {
  let gw: TestGateway;
  let components: Record<string, Schema>;
  beforeAll(async () => {
    gw = await startTestGateway("pglite");
    const doc = (await (await gw.call("GET", OPENAPI_PATH)).json()) as {
      components: { schemas: Record<string, Schema> };
    };
    components = doc.components.schemas;
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  it.each(Object.entries(CHECKED))("%s has the fields of its schema", (name, path) => {
    let schema: unknown = components;
    for (const step of path) schema = (schema as Record<string, unknown>)[step];
    expect(schema, `the document has no ${path.join(".")}`).toBeDefined();
    expect(differences(name, schema as Schema, name, components)).toEqual([]);
  });
});
