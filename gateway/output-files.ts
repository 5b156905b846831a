// Files an execution left under /work/out: kept in the database (db/output-files.ts) for the
// configured time so that any gateway serves them to the account that ran it, within its key's
// quota, and listed in the execution's answer with the URL that downloads each. A file is listed
// but not kept (`url` null, `reason` says why) when its content did not travel (past the
// runtime's budget for one run), its name is not a path the download route can take, or the
// key's quota has no room for it.
import type { Database } from "../db/client.js";
import {
  deleteExpiredOutputFiles,
  keepOutputFile,
  listOutputFiles,
  type OutputFileEntry,
} from "../db/output-files.js";
import type { OutputFile } from "../runtime/execution-runtime.js";
import type { Principal } from "./auth/principal.js";
import type { OutputFileSettings } from "./config.js";
import { workPathProblem } from "./file-paths.js";

/** Why a listed file has no URL. */
export type UnkeptReason = "not_transferred" | "invalid_path" | "quota_exceeded" | "store_failed";

/** A file as an execution's answer lists it. */
export interface OutputFileJson {
  path: string;
  size: number;
  url: string | null;
  expires_at: string | null;
  reason?: UnkeptReason;
}

/** The download route's URL of a file, relative to the gateway's base: each component encoded. */
export function outputFileUrl(executionId: string, path: string): string {
  return `/v1/executions/${executionId}/files/${path.split("/").map(encodeURIComponent).join("/")}`;
}

function keptJson(executionId: string, file: OutputFileEntry): OutputFileJson {
  return {
    path: file.path,
    size: file.bytes,
    url: outputFileUrl(executionId, file.path),
    expires_at: file.expiresAt.toISOString(),
  };
}

function unkeptJson(file: OutputFile, reason: UnkeptReason): OutputFileJson {
  return { path: file.path, size: file.bytes, url: null, expires_at: null, reason };
}

export class OutputFiles {
  private sweeper: NodeJS.Timeout | undefined;

  constructor(
    private readonly db: Database,
    private readonly settings: OutputFileSettings,
    /** Where the sweep's failures go. */
    private readonly log: (line: string) => void = (line) => console.error(line),
  ) {}

  /** Keeps `files` of execution `executionId`, run by `principal`; lists them as its answer does. */
  async keep(
    principal: Principal,
    executionId: string,
    files: readonly OutputFile[],
    now: Date = new Date(),
  ): Promise<OutputFileJson[]> {
    const owner = {
      executionId,
      accountId: principal.accountId,
      keyId: principal.keyId,
      tokenId: principal.token?.id ?? null,
      expiresAt: new Date(now.getTime() + this.settings.ttlSeconds * 1000),
      quotaBytes: this.settings.quotaBytesPerKey,
    };
    const listed: OutputFileJson[] = [];
    for (const file of files) {
      if (file.content === null) listed.push(unkeptJson(file, "not_transferred"));
      else if (workPathProblem(file.path) !== undefined)
        listed.push(unkeptJson(file, "invalid_path"));
      else {
        let kept: boolean;
        try {
          kept = await keepOutputFile(this.db, owner, file.path, file.content);
        } catch (error) {
          this.log(`keeping an output file of execution ${executionId} failed: ${String(error)}`);
          listed.push(unkeptJson(file, "store_failed"));
          continue;
        }
        listed.push(
          kept
            ? keptJson(executionId, {
                ...file,
                bytes: file.content.length,
                expiresAt: owner.expiresAt,
              })
            : unkeptJson(file, "quota_exceeded"),
        );
      }
    }
    return listed;
  }

  /** The files of an execution still kept (for GET /v1/executions/{id} and a replay). */
  async list(executionId: string): Promise<OutputFileJson[]> {
    return (await listOutputFiles(this.db, executionId)).map((f) => keptJson(executionId, f));
  }

  /** Deletes the expired files; returns how many went. */
  sweep(now: Date = new Date()): Promise<number> {
    return deleteExpiredOutputFiles(this.db, now);
  }

  /** Starts the periodic sweep; `stop` ends it. */
  start(): void {
    if (this.sweeper !== undefined) return;
    this.sweeper = setInterval(
      () =>
        void this.sweep().catch((error: unknown) =>
          this.log(`the output file sweep failed: ${String(error)}`),
        ),
      this.settings.sweepIntervalMs,
    );
    this.sweeper.unref();
  }

  stop(): void {
    clearInterval(this.sweeper);
    this.sweeper = undefined;
  }
}
