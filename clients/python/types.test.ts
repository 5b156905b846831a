// The Python client's answer types (clients/python/sandfork/types.py, described by
// tests/typed_fields.py under /usr/bin/python3.11) against the OpenAPI document the gateway
// serves: the same fields, NotRequired where the schema does not require them, nullable where it
// allows null, the same string enums and scalar kinds, nested objects and arrays checked the same
// way. A field added to the API and not to the client (or the other way round) fails here.
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { beforeAll, describe, expect, it } from "vitest";
import {
  type ClientType,
  openApiComponents,
  type Schema,
  schemaAt,
  typeDifferences,
} from "../../gateway/testing/client-types.js";

const CLIENT_DIR = fileURLToPath(new URL(".", import.meta.url));

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
  ForkedSessions: ["ForkedSessions"],
  NetworkRequest: ["NetworkRequest"],
  Cell: ["SessionCell"],
  Checkpoint: ["SessionCheckpoint"],
  Problem: ["Problem"],
  TemplateBuild: ["TemplateBuild"],
};

/** A described Python type as the comparison walks it. */
function clientType(python: Described): ClientType {
  return {
    text: python.kind,
    nullable: python.nullable,
    enumValues: python.enum,
    scalar: ["string", "integer", "number", "boolean"].includes(python.kind)
      ? python.kind
      : undefined,
    items: python.items === undefined ? undefined : clientType(python.items),
    fields:
      python.fields === undefined
        ? undefined
        : new Map(
            Object.entries(python.fields).map(([name, field]) => [
              name,
              { optional: field.required !== true, type: clientType(field) },
            ]),
          ),
  };
}

describe("the Python client's types against the OpenAPI document", () => {
  let components: Record<string, Schema>;
  let described: Record<string, Described>;
  beforeAll(async () => {
    components = await openApiComponents();
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

  it.each(Object.entries(CHECKED))("%s has the fields of its schema", (name, path) => {
    const schema = schemaAt(components, path);
    if (schema === undefined) throw new Error(`the document has no ${path.join(".")}`);
    const python = described[name];
    if (python === undefined) throw new Error(`typed_fields.py did not describe ${name}`);
    expect(typeDifferences(clientType(python), schema, name, components)).toEqual([]);
  });
});
