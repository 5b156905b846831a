// The boundary between the gateway and whatever runs code. The daemon client (a client of
// `sandfork-vmm serve`, protocol in native-vmm/PROTOCOL.md) implements this interface; the gateway
// depends on nothing else. Durations here are milliseconds (the protocol's microseconds / 1000).
import type { SessionRuntime } from "./session-runtime.js";

export interface ExecutionFile {
  /** Path inside the sandbox's writable overlay, relative to the working directory. */
  path: string;
  content: string;
  encoding: "utf8" | "base64";
}

export interface ExecutionRequest {
  /** The execution record's id, assigned by the gateway before billing (protocol v1 does not carry it). */
  executionId: string;
  template: string;
  code: string;
  stdin: string;
  args: string[];
  env: Record<string, string>;
  files: ExecutionFile[];
  /** One of the template's `languages`: it names the script (SCRIPT_NAMES in protocol.ts). */
  language: string;
  timeoutMs: number;
  /** Absent: the template's VM size. */
  memoryMb?: number | undefined;
  /**
   * Whose execution it is (the API key's id): the runtime's executions of one key wait in one
   * bounded line (`serve --max-queue-per-key`). Absent: counted in no key's line.
   */
  keyId?: string | undefined;
  /** Processes alive at once, the program included (a fork past it fails); absent: the runtime's default. */
  maxProcesses?: number | undefined;
  /** What the program may reach over the network; absent: nothing. */
  network?: NetworkGrant | undefined;
}

/**
 * The network a run may use: a destination must be allowed by every list (each narrows the ones
 * before: the key's, then the call's), at most `maxConnections` open at once and `maxBytes` moved
 * in and out; absent limits are the runtime's defaults.
 */
export interface NetworkGrant {
  allowlists: string[][];
  maxConnections?: number | undefined;
  maxBytes?: number | undefined;
}

/**
 * How the program ended. A non-zero exit code is still `completed`: the runtime did its job.
 * Protocol statuses map as: ok, error → completed; timeout → timed_out; out_of_memory →
 * memory_exceeded; output_limit → output_exceeded; crashed → crashed (a CPU exception in the
 * guest); unsupported → unsupported_syscall; deadlocked → deadlocked (every thread of the program
 * waited for something no thread could do any more); network_limit → network_exceeded (the program
 * moved more network bytes than its grant's maxBytes). A runtime that cannot do its job throws
 * instead (see errors.ts).
 */
export type ExecutionOutcome =
  | "completed"
  | "timed_out"
  | "memory_exceeded"
  | "output_exceeded"
  | "crashed"
  | "unsupported_syscall"
  | "deadlocked"
  | "network_exceeded";

export interface ExecutionTimings {
  /** Waiting for a ready VM from the pool. */
  queueMs: number;
  /** Forking the VM from the template snapshot. */
  forkMs: number;
  /** Running the program to its end. */
  execMs: number;
}

/** The CPU exception that ended a `crashed` program. */
export interface ExecutionFault {
  /** The x86 exception vector (14 = page fault, 6 = invalid opcode, ...). */
  vector: number;
  name: string;
  /** Guest address of the faulting instruction. */
  rip: number;
  /** The address that faulted, for a page fault; else null. */
  address: number | null;
}

/** The limits the execution actually ran under (requests are clamped to the runtime's maxima). */
export interface AppliedLimits {
  timeoutMs: number;
  memoryMib: number;
  outputBytes: number;
  processes: number;
}

/** What the execution consumed, as the runtime measured it. */
export interface ExecutionUsage {
  wallMs: number;
  cpuMs: number;
  peakMemoryBytes: number;
  /** Guest pages copied on first write (the copy-on-write cost of a forked VM). */
  pagesCopied: number;
  syscalls: number;
  /** VM exits (each system call and exception is one). */
  exits: number;
  /** Processes the program and its children forked. */
  processesCreated: number;
  /** The program's network traffic; absent when the runtime does not report it. */
  network?: NetworkUsage | undefined;
}

/** What a run did on the network, as the runtime counted it. */
export interface NetworkUsage {
  /** Payload bytes received and sent. */
  bytesIn: number;
  bytesOut: number;
  /** Connections made (and UDP sockets sent from). */
  connections: number;
  /** Connects, sends and DNS questions the policy refused. */
  refused: number;
  dnsQueries: number;
}

/**
 * A rich result, as a notebook shows it (templates/python/README.md): `type` is its MIME type
 * (image/png, image/svg+xml, text/html, application/json, text/plain, ...); binary data is base64.
 */
export interface RichResult {
  type: string;
  data: string;
}

/** A file the program left under /work/out. */
export interface OutputFile {
  /** Relative to /work/out, as the guest named it (hostile until checked). */
  path: string;
  bytes: number;
  /** Null when the files before it used up the runtime's budget for output file contents. */
  content: Buffer | null;
}

export interface ExecutionResult {
  outcome: ExecutionOutcome;
  /** Null when the program did not exit by itself (timeout, memory limit). */
  exitCode: number | null;
  stdout: string;
  stderr: string;
  /** True when stdout or stderr was cut at the runtime's output limit. */
  truncated: boolean;
  timings: ExecutionTimings;
  /** Set for `crashed`, null otherwise; absent when the runtime does not report it. */
  fault?: ExecutionFault | null;
  limits?: AppliedLimits;
  usage?: ExecutionUsage;
  /**
   * The program's rich results in the order shown, then its last expression's value as
   * text/plain; absent when its template's agent published none.
   */
  results?: RichResult[];
  /** The files under /work/out at its end, in path order; absent when there was no /work/out. */
  files?: OutputFile[];
}

/** A piece of a streamed execution's output, as the program wrote it. */
export interface OutputChunk {
  stream: "stdout" | "stderr";
  /** Joined in order, one stream's chunks are exactly that stream's text in the result. */
  data: string;
}

export interface Template {
  name: string;
  /** The runtime the template holds: python, node. */
  language: string;
  /** The languages its executions may run; the first is the default. */
  languages: string[];
  /** Identifies the template's file image and warm snapshot. */
  contentHash: string;
  /** False while the daemon is still preparing it (executions then fail as unavailable). */
  ready: boolean;
}

/** Whether the runtime can run executions now. */
export interface RuntimeHealth {
  ok: boolean;
  /** A short human-readable account (e.g. "sandfork-vmm: kvm unavailable: …; 1 template(s)"). */
  detail: string;
}

/** The runtime's own admission (the daemon's `stats`, PROTOCOL.md). */
export interface RuntimeAdmission {
  running: number;
  queued: number;
  /** Executions waiting per template (templates with none left out). */
  queuedByTemplate: Record<string, number>;
  /** Calls it answered busy so far, by reason (queue_full, template_queue_full, key_queue_full, ...). */
  busy: Record<string, number>;
}

export interface ExecutionRuntime {
  /**
   * Runs one request to its end. `signal` aborts when the gateway stops waiting (its deadline) or
   * shuts down; the runtime then rejects with the signal's reason. (The daemon client cannot stop
   * a request already sent: protocol v1 has no cancel, so the daemon finishes it.)
   * With `onOutput`, the output is also handed over in chunks as the program writes it, all of
   * them before the result; it must not throw (a daemon's malformed chunk fails the request).
   */
  execute(
    request: ExecutionRequest,
    signal: AbortSignal,
    onOutput?: (chunk: OutputChunk) => void,
  ): Promise<ExecutionResult>;
  /** Asked on every execution (to validate the template): implementations answer from a cache. */
  templates(): Promise<Template[]>;
  /** Asks the runtime whether executions can run; absent when the runtime cannot tell. */
  health?(signal?: AbortSignal): Promise<RuntimeHealth>;
  /** What the runtime's own admission holds now (its lines and busy answers); absent when it cannot tell. */
  admission?(signal?: AbortSignal): Promise<RuntimeAdmission>;
  /** Stateful sessions (session-runtime.ts); absent when the runtime keeps none. */
  readonly sessions?: SessionRuntime;
  /** Builds templates from definitions while it runs (custom-templates.ts); absent: it cannot. */
  readonly templateBuilds?: TemplateBuilds | undefined;
}

/** One template build from a definition (runtime/template-definition.ts). */
export interface TemplateBuildRequest {
  /** The runtime's name for the template (the daemon's template folder). */
  name: string;
  /** Its definition (template.json), with the files it names beside it. */
  definitionPath: string;
  /** Told as each step starts (template-definition.ts's BuildStep). */
  onStep(step: string): void;
  log(line: string): void;
}

export interface BuiltTemplate {
  /** The file image's data (image.data). */
  imageBytes: number;
  /** The snapshot at the agent's ready point (template.sfsnap). */
  snapshotBytes: number;
  /** The Debian packages included, dependencies too. */
  packages: string[];
}

export interface TemplateBuilds {
  /**
   * Builds the template and starts serving it. A failure of the definition's own making is a
   * TemplateBuildError (template-definition.ts) naming its step.
   */
  build(request: TemplateBuildRequest): Promise<BuiltTemplate>;
  /** Stops serving the template and removes what its build made. */
  remove(name: string): Promise<void>;
}
