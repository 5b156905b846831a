// What the client type tests (client/types.test.ts, clients/python/types.test.ts) share: a
// client's type, as each reads it from its language, compared with its schema in the OpenAPI
// document the gateway serves.
import { OPENAPI_PATH } from "../app.js";
import { startTestGateway } from "./test-gateway.js";

export interface Schema {
  type?: string | string[];
  properties?: Record<string, Schema>;
  required?: string[];
  items?: Schema;
  enum?: unknown[];
  $ref?: string;
}

/** A client's type as its test read it. */
export interface ClientType {
  /** How the client spells it, for the messages. */
  text: string;
  nullable: boolean;
  /** Its values when it is a union of string literals. */
  enumValues?: string[] | undefined;
  /** string, integer, number or boolean, when the client's language tells them apart. */
  scalar?: string | undefined;
  /** Its element type when it is an array. */
  items?: ClientType | undefined;
  /** Its fields when it is an object. */
  fields?: Map<string, { optional: boolean; type: ClientType }> | undefined;
}

/** The document's component schemas, from a gateway started for the purpose. */
export async function openApiComponents(): Promise<Record<string, Schema>> {
  const gw = await startTestGateway("pglite");
  try {
    const doc = (await (await gw.call("GET", OPENAPI_PATH)).json()) as {
      components: { schemas: Record<string, Schema> };
    };
    return doc.components.schemas;
  } finally {
    await gw.dispose();
  }
}

/** The schema at `path` below the components (undefined when there is none). */
export function schemaAt(components: Record<string, Schema>, path: string[]): Schema | undefined {
  let schema: unknown = components;
  for (const step of path) schema = (schema as Record<string, unknown> | undefined)?.[step];
  return schema as Schema | undefined;
}

/** The differences between the client's type and `schema`, each as "where: what". */
export function typeDifferences(
  client: ClientType,
  schema: Schema,
  where: string,
  components: Record<string, Schema>,
): string[] {
  if (schema.$ref !== undefined)
    return typeDifferences(
      client,
      components[schema.$ref.replace("#/components/schemas/", "")] ?? {},
      where,
      components,
    );
  const found: string[] = [];
  const types =
    schema.type === undefined ? [] : Array.isArray(schema.type) ? schema.type : [schema.type];
  if (types.length > 0 && types.includes("null") !== client.nullable)
    found.push(
      `${where}: ${types.includes("null") ? "the API allows null, the client does not" : "the client allows null, the API does not"}`,
    );
  const kinds = types.filter((t) => t !== "null");
  if (client.scalar !== undefined && kinds.length === 1 && kinds[0] !== client.scalar)
    found.push(`${where}: the API has ${kinds[0]}, the client ${client.scalar}`);
  if (schema.enum !== undefined && client.enumValues !== undefined) {
    const values = [...client.enumValues].sort();
    const expected = schema.enum.map(String).sort();
    if (JSON.stringify(values) !== JSON.stringify(expected))
      found.push(
        `${where}: values ${JSON.stringify(values)}, the API's ${JSON.stringify(expected)}`,
      );
  }
  if (types.includes("array") && schema.items !== undefined) {
    if (client.items === undefined)
      found.push(`${where}: the API has an array, the client ${client.text}`);
    else found.push(...typeDifferences(client.items, schema.items, `${where}[]`, components));
  }
  if (schema.properties !== undefined) {
    if (client.fields === undefined)
      return [...found, `${where}: the API has an object, the client ${client.text}`];
    const required = new Set(schema.required ?? []);
    for (const [field, fieldSchema] of Object.entries(schema.properties)) {
      const entry = client.fields.get(field);
      if (entry === undefined) {
        found.push(`${where}.${field}: in the API, missing from the client`);
        continue;
      }
      if (entry.optional === required.has(field))
        found.push(
          `${where}.${field}: ${required.has(field) ? "required in the API, optional in the client" : "optional in the API, required in the client"}`,
        );
      found.push(...typeDifferences(entry.type, fieldSchema, `${where}.${field}`, components));
    }
    for (const field of client.fields.keys())
      if (!(field in schema.properties))
        found.push(`${where}.${field}: in the client, not in the API`);
  }
  return found;
}
