// `npm run build:templates`: builds every template image that is missing or stale into the folder
// the daemon serves (.sandfork/templates/<name>/ by default), exactly as `npm start` would.
import { resolve } from "node:path";
import { loadRuntimeConfig } from "../config.js";
import { ensureTemplates, selectTemplateSources } from "../templates.js";

const config = loadRuntimeConfig(
  process.env,
  resolve(process.env.SANDFORK_DATA_DIR ?? ".sandfork"),
);
await ensureTemplates(selectTemplateSources(config.templateSourcesDir, config.templateNames), {
  binary: config.binary,
  templatesDir: config.templatesDir,
  force: config.rebuildTemplates,
  bootTimeoutMs: config.bootTimeoutMs,
  log: (line) => console.log(line),
});
