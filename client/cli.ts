// `sandfork`: the gateway's API from a shell. `sandfork template build FILE.json` sends a template
// definition file (template-file.ts) to POST /v1/templates and follows the build's steps and logs
// to its end: exit status 0 when it is ready, 1 when it failed (with the step and why), 2 for a
// bad command line or file.
// Environment: SANDFORK_API_KEY (a key with the templates scope) and SANDFORK_URL (default
// http://127.0.0.1:8787).
import { parseArgs } from "node:util";
import { Sandfork, SandforkError } from "./index.js";
import { readTemplateFile, TemplateFileError } from "./template-file.js";

const USAGE =
  "sandfork template build FILE.json [--name NAME] [--version VERSION]\n" +
  "  (SANDFORK_URL: the gateway, default http://127.0.0.1:8787; SANDFORK_API_KEY: a key with the templates scope)";

const fail = (message: string): never => {
  process.stderr.write(`${message}\n\nusage: ${USAGE}\n`);
  process.exit(2);
};
const args = process.argv.slice(2);
if (args.includes("--help") || args.includes("-h")) {
  process.stdout.write(`usage: ${USAGE}\n`);
  process.exit(0);
}
let parsed: { values: { name?: string; version?: string }; positionals: string[] };
try {
  parsed = parseArgs({
    args,
    options: { name: { type: "string" }, version: { type: "string" } },
    allowPositionals: true,
  });
} catch (error) {
  parsed = fail((error as Error).message);
}
const [group, command, file, ...extra] = parsed.positionals;
if (group !== "template" || command !== "build" || file === undefined || extra.length > 0)
  fail("expected: template build FILE.json");
const apiKey = process.env.SANDFORK_API_KEY;
if (!apiKey) fail("set SANDFORK_API_KEY to an API key with the templates scope");

const client = new Sandfork({
  baseUrl: process.env.SANDFORK_URL ?? "http://127.0.0.1:8787",
  apiKey: apiKey as string,
});
try {
  const definition = await readTemplateFile(file as string, parsed.values);
  const started = performance.now();
  const queued = await client.buildTemplate(definition);
  process.stderr.write(`build ${queued.id} of ${queued.name}@${queued.version} queued\n`);
  for await (const event of client.followTemplateBuild(queued.name, queued.id)) {
    if (event.event === "log") process.stderr.write(event.text);
    else if (event.event === "build") {
      const build = event.build;
      const seconds = ((performance.now() - started) / 1000).toFixed(1);
      if (build.status === "ready") {
        const mib = (bytes: number | null) => ((bytes ?? 0) / 2 ** 20).toFixed(1);
        process.stdout.write(
          `${build.name}@${build.version} ready in ${seconds} s: image ${mib(build.image_bytes)} MiB, snapshot ${mib(build.snapshot_bytes)} MiB\n`,
        );
        process.exit(0);
      }
      process.stdout.write(
        `${build.name}@${build.version} ${build.status} at step ${build.step ?? "?"}: ${build.error ?? "(still running)"}\n`,
      );
      process.exit(1);
    }
  }
} catch (error) {
  if (error instanceof TemplateFileError) fail(error.message);
  if (error instanceof SandforkError) {
    process.stderr.write(`${error.message}\n`);
    process.exit(error.status >= 500 ? 1 : 2);
  }
  throw error;
}
