// Stateful sessions on the daemon (native-vmm/PROTOCOL.md, Sessions): a VM kept between
// requests, its interpreter's state kept, checkpointed durably, paused and resumed. The gateway
// sees this interface; `DaemonSessions` speaks the session requests over a DaemonClient.
import { z } from "zod";
import type { ExecutionResult, NetworkGrant } from "./execution-runtime.js";
import type { FrameObject } from "./frames.js";
import { networkFields, parse, parseExecution, type SessionRequestType } from "./protocol.js";

export type SessionState = "running" | "paused" | "ended";

export interface SessionCheckpoint {
  checkpoint: number;
  /** Hex SHA-256 of the checkpoint file before its hash: what a restore verifies. */
  sha256: string;
  fileBytes: number;
}

export interface SessionInfo {
  session: string;
  template: string;
  state: SessionState;
  memoryMib: number;
  checkpoints: SessionCheckpoint[];
  /** Bytes of all its checkpoints on disk. */
  checkpointBytes: number;
  ended: string | null;
}

export interface TakenCheckpoint extends SessionCheckpoint {
  state: SessionState;
  dirtyBytes: number;
  captureMs: number;
  writeMs: number;
}

/** A session saved as a template (`session_template`). */
export interface SavedSessionTemplate {
  /** The snapshot file (template.sfsnap). */
  fileBytes: number;
  /** Bytes of non-zero guest pages it holds. */
  storedBytes: number;
  captureMs: number;
  writeMs: number;
}

/** A cell's outcome: the execution, and the value of its last expression or its exception. */
export interface CellResult {
  execution: ExecutionResult;
  value: string | null;
  error: { name: string; message: string } | null;
  /** "ended": the program stopped (exit, crash, a limit): the session's VM is gone. */
  state: SessionState;
  /** The session was paused and resumed for this cell (its cost is the execution's forkMs). */
  resumed: boolean;
}

/** A cell's limits; absent ones are the daemon's defaults. */
export interface CellLimits {
  timeoutMs: number;
  outputBytes?: number;
  /** Processes alive at once, the session's program included. */
  maxProcesses?: number | undefined;
  /** What the cell may reach over the network; absent: nothing. */
  network?: NetworkGrant | undefined;
}

export interface SessionRuntime {
  /** `memoryMib`: refused unless it is the template's VM size (absent: that size). */
  create(session: string, template: string, memoryMib?: number): Promise<SessionInfo>;
  execute(
    session: string,
    code: string,
    limits: CellLimits,
    signal?: AbortSignal,
  ): Promise<CellResult>;
  writeFile(session: string, path: string, content: Buffer): Promise<number>;
  readFile(session: string, path: string): Promise<Buffer>;
  deleteFile(session: string, path: string): Promise<void>;
  checkpoint(session: string): Promise<TakenCheckpoint>;
  pause(session: string): Promise<TakenCheckpoint>;
  resume(session: string): Promise<SessionInfo>;
  fork(session: string, from: string, checkpoint: number): Promise<SessionInfo>;
  delete(session: string): Promise<void>;
  info(session: string): Promise<SessionInfo>;
  /**
   * Saves the session's state as template `name` (a folder of the daemon's templates) and serves
   * it; absent where the runtime cannot (a cluster's nodes).
   */
  saveTemplate?(session: string, name: string): Promise<SavedSessionTemplate>;
}

/** What DaemonSessions needs of the client (DaemonClient.request). */
export type SessionRequester = (
  type: SessionRequestType,
  fields: FrameObject,
  options?: { signal?: AbortSignal | undefined; timeoutMs?: number | undefined },
) => Promise<FrameObject>;

const CheckpointSchema = z.object({
  checkpoint: z.number().int(),
  sha256: z.string(),
  file_bytes: z.number().int(),
});
const SessionSchema = z.object({
  session: z.string(),
  template: z.string(),
  state: z.enum(["running", "paused", "ended"]),
  memory_mib: z.number().int(),
  checkpoints: z.array(CheckpointSchema),
  checkpoint_bytes: z.number().int(),
  ended: z.string().nullable(),
});
const TakenSchema = CheckpointSchema.extend({
  state: z.enum(["running", "paused", "ended"]),
  dirty_bytes: z.number().int(),
  timings: z.object({ capture_us: z.number(), write_us: z.number() }),
});
const CellSchema = z.object({
  session_state: z.enum(["running", "paused", "ended"]),
  resumed: z.boolean(),
  result: z
    .object({
      value: z.string().nullable(),
      error: z.object({ name: z.string(), message: z.string() }).nullable(),
    })
    .nullable(),
});
const SavedTemplateSchema = z.object({
  file_bytes: z.number().int(),
  stored_bytes: z.number().int(),
  timings: z.object({ capture_us: z.number(), write_us: z.number() }),
});
const FileSchema = z.object({ bytes: z.number().int(), content: z.string().optional() });

/** A checkpoint as the daemon lists it (in `session` and `checkpoint` frames). */
function checkpointOf(c: z.infer<typeof CheckpointSchema>): SessionCheckpoint {
  return { checkpoint: c.checkpoint, sha256: c.sha256, fileBytes: c.file_bytes };
}

function sessionInfo(frame: FrameObject): SessionInfo {
  const s = parse(SessionSchema, frame, "session");
  return {
    session: s.session,
    template: s.template,
    state: s.state,
    memoryMib: s.memory_mib,
    checkpoints: s.checkpoints.map(checkpointOf),
    checkpointBytes: s.checkpoint_bytes,
    ended: s.ended,
  };
}

function taken(frame: FrameObject): TakenCheckpoint {
  const t = parse(TakenSchema, frame, "checkpoint");
  return {
    ...checkpointOf(t),
    state: t.state,
    dirtyBytes: t.dirty_bytes,
    captureMs: t.timings.capture_us / 1000,
    writeMs: t.timings.write_us / 1000,
  };
}

/** A checkpoint of a 2 GiB VM is written in well under this on any disk we run on. */
const DURABLE_WRITE_TIMEOUT_MS = 60_000;
/** Saving a session as a template writes its whole memory and starts the template's pool. */
const SAVE_TEMPLATE_TIMEOUT_MS = 120_000;

export class DaemonSessions implements SessionRuntime {
  constructor(
    private readonly request: SessionRequester,
    /** Added to a cell's own timeout for the daemon's answer (resume included). */
    private readonly graceMs = 10_000,
    /** Told once a session saved as a template is served (the runtime's template list changed). */
    private readonly templatesChanged: () => Promise<void> = async () => {},
  ) {}

  async create(session: string, template: string, memoryMib?: number): Promise<SessionInfo> {
    const fields =
      memoryMib === undefined
        ? { session, template }
        : { session, template, memory_mib: memoryMib };
    return sessionInfo(await this.request("session_create", fields, { timeoutMs: this.graceMs }));
  }

  async execute(
    session: string,
    code: string,
    limits: CellLimits,
    signal?: AbortSignal,
  ): Promise<CellResult> {
    const frame = await this.request(
      "session_execute",
      {
        session,
        code,
        limits: {
          timeout_ms: limits.timeoutMs,
          ...(limits.outputBytes === undefined ? {} : { output_bytes: limits.outputBytes }),
          ...(limits.maxProcesses === undefined ? {} : { processes: limits.maxProcesses }),
        },
        ...(limits.network === undefined ? {} : { network: networkFields(limits.network) }),
      },
      { signal, timeoutMs: limits.timeoutMs + this.graceMs },
    );
    const cell = parse(CellSchema, frame, "execution");
    return {
      execution: parseExecution(frame),
      value: cell.result?.value ?? null,
      error: cell.result?.error ?? null,
      state: cell.session_state,
      resumed: cell.resumed,
    };
  }

  async writeFile(session: string, path: string, content: Buffer): Promise<number> {
    const frame = await this.request(
      "session_write_file",
      { session, path, content: content.toString("base64"), encoding: "base64" },
      { timeoutMs: this.graceMs },
    );
    return parse(FileSchema, frame, "session_file").bytes;
  }

  async readFile(session: string, path: string): Promise<Buffer> {
    const frame = await this.request(
      "session_read_file",
      { session, path },
      { timeoutMs: this.graceMs },
    );
    return Buffer.from(parse(FileSchema, frame, "session_file").content ?? "", "base64");
  }

  async deleteFile(session: string, path: string): Promise<void> {
    await this.request("session_delete_file", { session, path }, { timeoutMs: this.graceMs });
  }

  async checkpoint(session: string): Promise<TakenCheckpoint> {
    return taken(
      await this.request(
        "session_checkpoint",
        { session },
        { timeoutMs: DURABLE_WRITE_TIMEOUT_MS },
      ),
    );
  }

  async pause(session: string): Promise<TakenCheckpoint> {
    return taken(
      await this.request("session_pause", { session }, { timeoutMs: DURABLE_WRITE_TIMEOUT_MS }),
    );
  }

  async resume(session: string): Promise<SessionInfo> {
    return sessionInfo(
      await this.request("session_resume", { session }, { timeoutMs: this.graceMs }),
    );
  }

  async fork(session: string, from: string, checkpoint: number): Promise<SessionInfo> {
    return sessionInfo(
      await this.request(
        "session_fork",
        { session, from, checkpoint },
        { timeoutMs: this.graceMs },
      ),
    );
  }

  async delete(session: string): Promise<void> {
    await this.request("session_delete", { session }, { timeoutMs: this.graceMs });
  }

  async info(session: string): Promise<SessionInfo> {
    return sessionInfo(await this.request("session_info", { session }));
  }

  async saveTemplate(session: string, name: string): Promise<SavedSessionTemplate> {
    const frame = await this.request(
      "session_template",
      { session, name },
      { timeoutMs: SAVE_TEMPLATE_TIMEOUT_MS },
    );
    const saved = parse(SavedTemplateSchema, frame, "session_template");
    await this.templatesChanged();
    return {
      fileBytes: saved.file_bytes,
      storedBytes: saved.stored_bytes,
      captureMs: saved.timings.capture_us / 1000,
      writeMs: saved.timings.write_us / 1000,
    };
  }
}
