// Templates built through the API (POST /v1/templates). A definition (schemas.ts) is written to a
// build folder as a template.json with its files beside it (runtime/template-definition.ts), and
// built by the runtime (runtime/custom-templates.ts) as a job: a bounded number at once, a
// bounded number waiting. Its row (db/custom-templates.ts) records the step, logs and outcome;
// a failure names its step and why, and is final (a client builds the version again). A session's
// state saved as a template (POST /v1/sessions/{id}/template, `fromSession`) is a row of the same
// kind, its definition naming the session, ready once the runtime has written and loaded it.
//
// Names: a template is `name@version` of its account; `name` alone means its newest build. The
// runtime serves it as `tpl-<row id>`, a name no request may use directly; an account sees its
// own templates and published ones, and another account's are not found.
import { createHash } from "node:crypto";
import { mkdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Database } from "../db/client.js";
import {
  appendCustomTemplateLog,
  type CustomTemplateRow,
  deleteCustomTemplate,
  findBuild,
  findOwnTemplate,
  findRunnableTemplate,
  insertCustomTemplate,
  listVisibleTemplates,
  nextVersion,
  publishedElsewhere,
  updateCustomTemplate,
} from "../db/custom-templates.js";
import type { ExecutionRuntime, Template } from "../runtime/execution-runtime.js";
import type { SavedSessionTemplate } from "../runtime/session-runtime.js";
import { DEFINITION_FILE, TemplateBuildError } from "../runtime/template-definition.js";
import { hasScope, type Principal } from "./auth/principal.js";
import type { TemplateBuildSettings } from "./config.js";
import { ProblemError } from "./problems.js";
import type { TemplateDefinitionBody } from "./schemas.js";

/** The runtime's names of API-built templates: never a name a request may give. */
const RUNTIME_NAME = /^tpl-[0-9a-f-]{36}$/;

export const runtimeNameOf = (id: string) => `tpl-${id}`;

/** Whether `name` is the runtime's name of an API-built template (hidden from callers). */
export const isRuntimeName = (name: string) => RUNTIME_NAME.test(name);

/** `name@version` or `name` split. */
export function parseTemplateRef(ref: string): { name: string; version: string | null } {
  const at = ref.indexOf("@");
  return at < 0
    ? { name: ref, version: null }
    : { name: ref.slice(0, at), version: ref.slice(at + 1) };
}

export interface TemplateServiceDeps {
  db: Database;
  runtime: () => ExecutionRuntime | undefined;
  settings: TemplateBuildSettings;
  /** This gateway: its builds' rows name it, so that others fail them once it stops. */
  gatewayId: string;
  /** Where build folders (definition, wheels, files) are written. */
  buildsDir: string;
  log: (line: string) => void;
}

export class TemplateService {
  private running = 0;
  private readonly waiting: (() => void)[] = [];
  /** Builds in flight on this gateway (ids), which a delete must wait for. */
  private readonly inFlight = new Set<string>();

  constructor(private readonly deps: TemplateServiceDeps) {}

  /**
   * The runtime's name of the template `ref` that `principal`'s account may run, or undefined.
   * A built-in template's name is its own; asked on every execution, it reaches the database only
   * for names the runtime does not serve.
   */
  async runtimeName(
    accountId: string,
    ref: string,
    builtIn: Template[],
  ): Promise<string | undefined> {
    if (isRuntimeName(ref)) return undefined;
    if (builtIn.some((t) => t.name === ref)) return ref;
    const { name, version } = parseTemplateRef(ref);
    const row = await findRunnableTemplate(this.deps.db, accountId, name, version);
    return row === undefined ? undefined : runtimeNameOf(row.id);
  }

  /** The templates `principal` may see that were built through the API. */
  list(principal: Principal): Promise<CustomTemplateRow[]> {
    return listVisibleTemplates(this.deps.db, principal.accountId);
  }

  /** The runtime, when it builds templates; 501 otherwise. A built-in template's `name` is 409. */
  private async buildingRuntime(name: string): Promise<ExecutionRuntime> {
    const runtime = this.deps.runtime();
    if (runtime?.templateBuilds === undefined)
      throw new ProblemError(
        "template-builds-unsupported",
        "this gateway's runtime does not build templates (it builds them with a supervised daemon: SANDFORK_RUNTIME=supervised)",
      );
    const builtIn = await runtime.templates().catch(() => [] as Template[]);
    if (builtIn.some((t) => t.name === name))
      throw new ProblemError(
        "template-name-taken",
        `"${name}" is a built-in template; choose another name`,
      );
    return runtime;
  }

  /**
   * Records template `name@version` (version: the next whole number when absent) of the caller's
   * account saved from session `session` (of built-in template `base`) by `save`, which writes
   * and serves it under the runtime name it is given. It is ready when this answers; a failure
   * leaves no row.
   */
  async fromSession(
    principal: Principal,
    input: { name: string; version?: string | undefined; description?: string | undefined },
    source: { session: string; template: string },
    save: (runtimeName: string) => Promise<SavedSessionTemplate>,
  ): Promise<CustomTemplateRow> {
    const { db } = this.deps;
    await this.buildingRuntime(input.name);
    const version = input.version ?? (await nextVersion(db, principal.accountId, input.name));
    const { row, created } = await insertCustomTemplate(db, {
      accountId: principal.accountId,
      keyId: principal.keyId,
      name: input.name,
      version,
      gatewayId: this.deps.gatewayId,
      definition: {
        from_session: source.session,
        base: source.template,
        ...(input.description === undefined ? {} : { description: input.description }),
      },
    });
    if (!created)
      throw new ProblemError(
        "template-version-exists",
        `${input.name}@${version} exists; versions are immutable, save another version`,
        { extensions: { build_id: row.id, build_status: row.status } },
      );
    this.inFlight.add(row.id);
    try {
      await updateCustomTemplate(db, row.id, { status: "building", step: "snapshot" });
      const saved = await save(runtimeNameOf(row.id));
      const logs = `saved from session ${source.session} (template ${source.template}): snapshot ${saved.fileBytes} bytes, recorded in ${saved.captureMs.toFixed(0)} ms, written in ${saved.writeMs.toFixed(0)} ms\n`;
      await appendCustomTemplateLog(db, row.id, logs);
      const finishedAt = new Date();
      await updateCustomTemplate(db, row.id, {
        status: "ready",
        step: null,
        snapshotBytes: saved.fileBytes,
        finishedAt,
      });
      return {
        ...row,
        status: "ready",
        step: null,
        logs,
        snapshotBytes: saved.fileBytes,
        finishedAt,
      };
    } catch (error) {
      await deleteCustomTemplate(db, row.id).catch((e: unknown) =>
        this.deps.log(`template ${row.id} from a session: ${String(e)}`),
      );
      throw error;
    } finally {
      this.inFlight.delete(row.id);
    }
  }

  /** Records the build of `body` and queues it; answers the row (queued). */
  async create(principal: Principal, body: TemplateDefinitionBody): Promise<CustomTemplateRow> {
    await this.buildingRuntime(body.name);
    if (
      this.running + this.waiting.length >=
      this.deps.settings.maxRunning + this.deps.settings.maxQueued
    )
      throw new ProblemError(
        "template-builds-busy",
        `${this.deps.settings.maxQueued} template build(s) already wait; retry later`,
        { headers: { "retry-after": "30" } },
      );
    const { name, version, ...definition } = body;
    // The row keeps what each wheel was, not its bytes (the build folder has them).
    const stored = {
      ...definition,
      ...(definition.wheels === undefined
        ? {}
        : {
            wheels: definition.wheels.map((wheel) => {
              const bytes = Buffer.from(wheel.content_base64, "base64");
              return {
                filename: wheel.filename,
                bytes: bytes.length,
                sha256: createHash("sha256").update(bytes).digest("hex"),
              };
            }),
          }),
    };
    const { row, created } = await insertCustomTemplate(this.deps.db, {
      accountId: principal.accountId,
      keyId: principal.keyId,
      name,
      version,
      gatewayId: this.deps.gatewayId,
      definition: stored,
    });
    if (!created)
      throw new ProblemError(
        "template-version-exists",
        `${name}@${version} is ${row.status === "ready" ? "built" : "being built"}; versions are immutable, build another version`,
        { extensions: { build_id: row.id, build_status: row.status } },
      );
    this.inFlight.add(row.id);
    void this.run(row, body).finally(() => this.inFlight.delete(row.id));
    return row;
  }

  /** The build `id` of template `name`, if `principal` may see it. */
  async build(principal: Principal, name: string, id: string): Promise<CustomTemplateRow> {
    const admin = hasScope(principal, "admin");
    const row = await findBuild(this.deps.db, admin ? null : principal.accountId, name, id);
    if (row === undefined) throw new ProblemError("not-found", "no such template build");
    return row;
  }

  /** Removes `ref` (name@version) of the caller's account (an admin's: any account's). */
  async remove(principal: Principal, ref: string): Promise<void> {
    const row = await this.own(principal, ref);
    if (row.status === "queued" || row.status === "building" || this.inFlight.has(row.id))
      throw new ProblemError("template-in-use", `${ref} is being built; delete it once it ends`);
    const builds = this.deps.runtime()?.templateBuilds;
    if (builds !== undefined) await builds.remove(runtimeNameOf(row.id));
    await rm(join(this.deps.buildsDir, row.id), { recursive: true, force: true });
    await deleteCustomTemplate(this.deps.db, row.id);
  }

  /** Makes `ref` visible to every account, or only its own again (admins). */
  async publish(principal: Principal, ref: string, published: boolean): Promise<CustomTemplateRow> {
    const row = await this.own(principal, ref);
    if (row.status !== "ready")
      throw new ProblemError(
        "template-in-use",
        `${ref} is ${row.status}; only a built template is published`,
      );
    if (published && (await publishedElsewhere(this.deps.db, row.accountId, row.name)))
      throw new ProblemError(
        "template-name-taken",
        `another account has published a template named "${row.name}"`,
      );
    await updateCustomTemplate(this.deps.db, row.id, { published });
    return { ...row, published };
  }

  private async own(principal: Principal, ref: string): Promise<CustomTemplateRow> {
    const { name, version } = parseTemplateRef(ref);
    if (version === null)
      throw new ProblemError("validation-failed", "name the template as name@version");
    const admin = hasScope(principal, "admin");
    const row = await findOwnTemplate(this.deps.db, principal.accountId, admin, name, version);
    if (row === undefined)
      throw new ProblemError("not-found", `no template ${ref} in this account`);
    return row;
  }

  /** Waits for a build slot, builds, records the outcome. */
  private async run(row: CustomTemplateRow, body: TemplateDefinitionBody): Promise<void> {
    const { db } = this.deps;
    if (this.running >= this.deps.settings.maxRunning)
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    this.running += 1;
    let step = "definition";
    // Steps and log lines go to the row in order, one write after another, all before the outcome.
    let logged = Promise.resolve();
    const write = (update: () => Promise<void>) => {
      logged = logged.then(update).catch(() => {});
    };
    const log = (line: string) => write(() => appendCustomTemplateLog(db, row.id, `${line}\n`));
    const started = performance.now();
    try {
      await updateCustomTemplate(db, row.id, { status: "building", step });
      log(`build of ${row.name}@${row.version} started`);
      log(`step: ${step}`);
      const definitionPath = await this.writeBuildFolder(row.id, body);
      const runtime = this.deps.runtime();
      const builds = runtime?.templateBuilds;
      if (builds === undefined) throw new Error("the runtime went away");
      const built = await builds.build({
        name: runtimeNameOf(row.id),
        definitionPath,
        onStep: (next) => {
          step = next;
          write(() => updateCustomTemplate(db, row.id, { step: next }));
          log(`step: ${next}`);
        },
        log,
      });
      const seconds = ((performance.now() - started) / 1000).toFixed(1);
      log(
        `built in ${seconds} s: image ${built.imageBytes} bytes, snapshot ${built.snapshotBytes} bytes${built.packages.length > 0 ? `, Debian packages ${built.packages.join(", ")}` : ""}`,
      );
      await logged;
      await updateCustomTemplate(db, row.id, {
        status: "ready",
        step: null,
        imageBytes: built.imageBytes,
        snapshotBytes: built.snapshotBytes,
        finishedAt: new Date(),
      });
    } catch (error) {
      const failedStep = error instanceof TemplateBuildError ? error.step : step;
      const message =
        error instanceof TemplateBuildError
          ? error.message
          : `the build failed: ${error instanceof Error ? error.message : String(error)}`;
      log(`failed at step ${failedStep}: ${message}`);
      await logged;
      await updateCustomTemplate(db, row.id, {
        status: "failed",
        step: failedStep,
        error: message,
        finishedAt: new Date(),
      }).catch((e: unknown) => this.deps.log(`template build ${row.id}: ${String(e)}`));
      // A failed build leaves nothing served.
      await this.deps
        .runtime()
        ?.templateBuilds?.remove(runtimeNameOf(row.id))
        .catch(() => {});
    } finally {
      this.running -= 1;
      this.waiting.shift()?.();
    }
  }

  /** Writes template.json and the files it names into the build's folder; answers its path. */
  private async writeBuildFolder(id: string, body: TemplateDefinitionBody): Promise<string> {
    const dir = join(this.deps.buildsDir, id);
    await rm(dir, { recursive: true, force: true });
    await mkdir(join(dir, "wheels"), { recursive: true });
    await mkdir(join(dir, "files"), { recursive: true });
    const wheels: string[] = [];
    for (const wheel of body.wheels ?? []) {
      const path = join("wheels", wheel.filename);
      await writeFile(join(dir, path), Buffer.from(wheel.content_base64, "base64"));
      wheels.push(path);
    }
    const files: { host: string; guest: string }[] = [];
    for (const [i, file] of (body.files ?? []).entries()) {
      const host = join("files", String(i));
      await writeFile(
        join(dir, host),
        Buffer.from(file.content, file.encoding === "base64" ? "base64" : "utf8"),
      );
      files.push({ host, guest: file.path });
    }
    if (body.setup !== undefined) await writeFile(join(dir, "setup.py"), body.setup);
    const definition = {
      base: body.base,
      ...(body.debian_packages === undefined ? {} : { debian_packages: body.debian_packages }),
      ...(body.exclude_packages === undefined ? {} : { exclude_packages: body.exclude_packages }),
      ...(body.exclude === undefined ? {} : { exclude: body.exclude }),
      ...(wheels.length === 0 ? {} : { wheels }),
      ...(files.length === 0 ? {} : { files }),
      ...(body.env === undefined ? {} : { env: body.env }),
      ...(body.setup === undefined ? {} : { setup: "setup.py" }),
      ...(body.memory_mib === undefined ? {} : { memory_mib: body.memory_mib }),
    };
    const path = join(dir, DEFINITION_FILE);
    await writeFile(path, `${JSON.stringify(definition, null, 2)}\n`);
    return path;
  }
}
