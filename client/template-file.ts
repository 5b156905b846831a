// A template definition file as the CLI reads it (`sandfork template build FILE.json`): the API's
// definition (TemplateDefinition) with local paths, relative to the file, where the API takes
// contents: `wheels` lists .whl files, `setup` names a Python program, `files` maps local files
// to guest paths ({"host": PATH, "guest": PATH}). A template.json of the repository's templates/
// folders is one, given a name and a version (in the file or on the command line).
import { readFile } from "node:fs/promises";
import { basename, dirname, resolve } from "node:path";
import { DEFINITION_FIELDS } from "../runtime/template-definition.js";
import type { TemplateDefinition } from "./index.js";

export class TemplateFileError extends Error {}

/** A definition file's fields, and the API's name and version. */
const FIELDS = ["name", "version", ...DEFINITION_FIELDS];

/** The definition in `path`, its local files read in; `name` and `version` override the file's. */
export async function readTemplateFile(
  path: string,
  overrides: { name?: string | undefined; version?: string | undefined } = {},
): Promise<TemplateDefinition> {
  let raw: unknown;
  try {
    raw = JSON.parse(await readFile(path, "utf8"));
  } catch (error) {
    throw new TemplateFileError(`${path}: ${(error as Error).message}`);
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw))
    throw new TemplateFileError(`${path} must hold a JSON object`);
  const file = raw as Record<string, unknown>;
  const unknown = Object.keys(file).filter((key) => !FIELDS.includes(key));
  if (unknown.length > 0)
    throw new TemplateFileError(`${path}: unknown field ${unknown.join(", ")}`);
  const local = (p: unknown, field: string): string => {
    if (typeof p !== "string" || p === "")
      throw new TemplateFileError(`${path}: ${field} must name files by path`);
    return resolve(dirname(path), p);
  };
  const read = async (p: string): Promise<Buffer> => {
    try {
      return await readFile(p);
    } catch (error) {
      throw new TemplateFileError(`${path}: ${(error as Error).message}`);
    }
  };
  const list = (value: unknown, field: string): unknown[] => {
    if (value === undefined) return [];
    if (!Array.isArray(value)) throw new TemplateFileError(`${path}: ${field} must be a list`);
    return value;
  };
  const name = overrides.name ?? file.name;
  const version = overrides.version ?? file.version;
  if (typeof name !== "string" || typeof version !== "string")
    throw new TemplateFileError(
      `${path}: give the template a name and a version (in the file, or --name and --version)`,
    );
  const definition: TemplateDefinition = {
    ...(file as object),
    name,
    version,
  } as TemplateDefinition;
  if (file.wheels !== undefined)
    definition.wheels = await Promise.all(
      list(file.wheels, "wheels").map(async (wheel) => {
        const p = local(wheel, "wheels");
        return { filename: basename(p), content_base64: (await read(p)).toString("base64") };
      }),
    );
  if (file.files !== undefined)
    definition.files = await Promise.all(
      list(file.files, "files").map(async (entry) => {
        const { host, guest } = (entry ?? {}) as { host?: unknown; guest?: unknown };
        if (typeof guest !== "string")
          throw new TemplateFileError(`${path}: files must be {"host": PATH, "guest": PATH}`);
        const content = await read(local(host, "files"));
        return { path: guest, content: content.toString("base64"), encoding: "base64" as const };
      }),
    );
  if (file.setup !== undefined)
    definition.setup = (await read(local(file.setup, "setup"))).toString("utf8");
  return definition;
}
