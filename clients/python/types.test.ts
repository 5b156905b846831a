// The Python client's answer types (clients/python/sandfork/types.py, described by
// tests/typed_fields.py under /usr/bin/python3.11) against the OpenAPI document the gateway
// serves: the same fields, NotRequired where the schema does not require them, nullable where it
// allows null, the same string enums and scalar kinds, nested objects and arrays checked the same
// way. A field added to the API and not to the client (or the other way round) fails here.
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OPENAPI_PATH } from "../../gateway/app.js";
import { startTestGateway, type TestGateway } from "../../gateway/testing/test-gateway.js";

const CLIENT_DIR = fileURLToPath(new URL(".", import.meta.url));

interface Schema {
  type?: string | string[];
  properties?: Record<string, Schema>;
  required?: string[];
  items?: Schema;
  enum?: unknown[];
  $ref?: string;
}

/** What typed_fields.py says of a type. */
interface Described {
  kind: "string" | "integer" | "number" | "boolean" | "array" | "object" | "union";
  nullable: boolean;
  required?: boolean;
  enum?: string[];
  items?: Described;
  fields?: Record<string, Described>;
}

/** Python type → where its schema is in the document's components (a path below `schemas`). */
const CHECKED: Record<string, string[]> = {
  Execution: ["Execution"],
  RichResult: ["RichResult"],
  OutputFile: ["OutputFile"],
  ExecutionFile: ["ExecutionRequest", "properties", "files", "items"],
  Template: ["Template"],
  SessionInfo: ["Session"],
  Cell: ["SessionCell"],
  Checkpoint: ["SessionCheckpoint"],
  Problem: ["Problem"],
};

function differences(
  python: Described,
  schema: Schema,
  where: string,
  components: Record<string, Schema>,
): string[] {
  if (schema.$ref !== undefined)
    return differences(
      python,
      components[schema.$ref.replace("#/components/schemas/", "")] ?? {},
      where,
      components,
    );
  const found: string[] = [];
  const types =
    schema.type === undefined ? [] : Array.isArray(schema.type) ? schema.type : [schema.type];
  if (types.length > 0 && types.includes("null") !== python.nullable)
    found.push(
      `${where}: ${python.nullable ? "Python allows None, the API does not allow null" : "the API allows null, Python does not"}`,
    );
  const kinds = types.filter((t) => t !== "null");
  if (kinds.length === 1 && kinds[0] !== python.kind)
    found.push(`${where}: the API has ${kinds[0]}, Python ${python.kind}`);
  if (schema.enum !== undefined) {
    const expected = schema.enum.map(String).sort();
    if (JSON.stringify(python.enum ?? null) !== JSON.stringify(expected))
      found.push(
        `${where}: values ${JSON.stringify(python.enum)}, the API's ${JSON.stringify(expected)}`,
      );
  }
  if (schema.items !== undefined && python.items !== undefined)
    found.push(...differences(python.items, schema.items, `${where}[]`, components));
  if (schema.properties !== undefined) {
    const fields = python.fields ?? {};
    const required = new Set(schema.required ?? []);
    for (const [name, fieldSchema] of Object.entries(schema.properties)) {
      const field = fields[name];
      if (field === undefined) {
        found.push(`${where}.${name}: in the API, missing from Python`);
        continue;
      }
      if (field.required !== required.has(name))
        found.push(
          `${where}.${name}: ${required.has(name) ? "required in the API, NotRequired in Python" : "optional in the API, required in Python"}`,
        );
      found.push(...differences(field, fieldSchema, `${where}.${name}`, components));
    }
    for (const name of Object.keys(fields))
      if (!(name in schema.properties)) found.push(`${where}.${name}: in Python, not in the API`);
  }
  return found;
}

describe("the Python client's types against the OpenAPI document", () => {
  let gw: TestGateway;
  let components: Record<string, Schema>;
  let described: Record<string, Described>;
  beforeAll(async () => {
    gw = await startTestGateway("pglite");
    const doc = (await (await gw.call("GET", OPENAPI_PATH)).json()) as {
      components: { schemas: Record<string, Schema> };
    };
    components = doc.components.schemas;
    const { stdout } = await promisify(execFile)(
      "/usr/bin/python3.11",
      ["tests/typed_fields.py", ...Object.keys(CHECKED)],
      {
        cwd: CLIENT_DIR,
        env: { PYTHONPATH: CLIENT_DIR, PYTHONDONTWRITEBYTECODE: "1" },
        timeout: 30_000,
      },
    );
    described = JSON.parse(stdout) as Record<string, Described>;
  });
  afterAll(async () => {
    await gw?.dispose();
  });

  it.each(Object.entries(CHECKED))("%s has the fields of its schema", (name, path) => {
    let schema: unknown = components;
    for (const step of path) schema = (schema as Record<string, unknown>)[step];
    expect(schema, `the document has no ${path.join(".")}`).toBeDefined();
    const python = described[name];
    if (python === undefined) throw new Error(`typed_fields.py did not describe ${name}`);
    expect(differences(python, schema as Schema, name, components)).toEqual([]);
  });
});
