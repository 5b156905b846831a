// Templates built from definitions while the runtime runs (POST /v1/templates): each is composed
// and built into the daemon's templates directory as a template of the sources is
// (templates.ts), its snapshot required, and then loaded into the running daemon
// (`load_template`, native-vmm/PROTOCOL.md). The folder stays there, so a restarted daemon
// serves it from its start.
import { statSync } from "node:fs";
import { rm } from "node:fs/promises";
import { join } from "node:path";
import type { DaemonClient } from "./daemon-client.js";
import { RuntimeRequestError } from "./errors.js";
import type { BuiltTemplate, TemplateBuildRequest, TemplateBuilds } from "./execution-runtime.js";
import { COMPOSED_SOURCES, ensureTemplate } from "./templates.js";

export interface DaemonTemplateBuildsOptions {
  client: DaemonClient;
  /** The `sandfork-vmm` binary. */
  binary: string;
  /** The daemon's --templates. */
  templatesDir: string;
  /** The templates a definition's `base` may name. */
  sourcesDir: string;
  bootTimeoutMs: number | undefined;
  /** The largest image a build may make (image.data, bytes). */
  maxImageBytes: number;
}

/** How long the daemon may take to open a built template and start its pool. */
const LOAD_TIMEOUT_MS = 60_000;

export class DaemonTemplateBuilds implements TemplateBuilds {
  constructor(private readonly options: DaemonTemplateBuildsOptions) {}

  async build(request: TemplateBuildRequest): Promise<BuiltTemplate> {
    const { options } = this;
    const result = await ensureTemplate(
      {
        name: request.name,
        manifestPath: request.definitionPath,
        definitionPath: request.definitionPath,
      },
      {
        binary: options.binary,
        templatesDir: options.templatesDir,
        sourcesDir: options.sourcesDir,
        bootTimeoutMs: options.bootTimeoutMs,
        maxImageBytes: options.maxImageBytes,
        requireSnapshot: true,
        force: true,
        onStep: request.onStep,
        log: request.log,
      },
    );
    request.onStep("load");
    await options.client.loadTemplate(request.name, { timeoutMs: LOAD_TIMEOUT_MS });
    return {
      imageBytes: statSync(join(result.dir, "image.data")).size,
      snapshotBytes: statSync(join(result.dir, "template.sfsnap")).size,
      packages: result.packages,
    };
  }

  async remove(name: string): Promise<void> {
    await this.options.client.unloadTemplate(name).catch((error: unknown) => {
      // Never loaded (its build failed) or already unloaded.
      if (!(error instanceof RuntimeRequestError && error.code === "unknown_template")) throw error;
    });
    await rm(join(this.options.templatesDir, name), { recursive: true, force: true });
    await rm(join(this.options.templatesDir, COMPOSED_SOURCES, name), {
      recursive: true,
      force: true,
    });
  }
}
