// The overload mode's measuring client (loadtest/flood-client.ts), run as a child process in a
// session of its own at a given priority: its thread's nice value and, where the kernel groups
// tasks by session, its session group's. A client waiting for a core adds its wait to every time
// it takes, so it runs at the priority of the server it measures; its own event-loop delay comes
// back with its figures.
import { spawn } from "node:child_process";
import { getPriority, setPriority } from "node:os";
import { join } from "node:path";
import {
  schedulingPolicyOf,
  sessionGroupNice,
  setRealtime,
  setSessionGroupNice,
} from "../../runtime/event-loop-priority.js";
import { REPOSITORY } from "./execution.js";

/** One kind of call of a flood, with what its true answer is. */
export interface FloodKind {
  body: string;
  /** The program's status a 200 answer must have. */
  status: string;
  /** Its stdout, where it matters. */
  stdout?: string;
}

export interface FloodPhase {
  url: string;
  headers: Record<string, string>;
  /** Sent in turn. */
  kinds: FloodKind[];
  concurrency: number;
  seconds: number;
  /** After a shed answer a client waits its Retry-After, or sends its next call at once. */
  retry_after: "wait" | "ignore";
}

export interface FloodResult {
  /** Times of the calls answered with their true status, ms. */
  ran_ms: number[];
  /** Times of the shed calls (429 or 503 with Retry-After), ms. */
  shed_ms: number[];
  shed: { "429": number; "503": number };
  wrong: number;
  /** Up to 5 wrong answers, as `status body`. */
  wrong_examples: string[];
  seconds: number;
  /** p99 of the client's own event-loop delay over the phase, ms. */
  loop_delay_p99_ms: number;
}

/**
 * The priority a process runs at: its main thread's nice value, its session group's (undefined:
 * none), and whether that thread is real-time (SCHED_RR).
 */
export interface Priority {
  nice: number;
  group: number | undefined;
  realtime: boolean;
}

/** SCHED_RR in /proc/PID/stat. */
const SCHED_RR = 2;

export function priorityOf(pid: number): Priority {
  return {
    nice: getPriority(pid),
    group: sessionGroupNice(pid),
    realtime: schedulingPolicyOf(pid) === SCHED_RR,
  };
}

/** The priority to run a process at: a nice value, and a real-time priority (0: not real-time). */
export interface PrioritySetting {
  nice: number;
  realtime: number;
}

/**
 * Gives `pid`'s main thread the nice value and, when the kernel groups tasks by session and `pid`
 * leads its own, its session group too, and the real-time priority (see
 * runtime/event-loop-priority.ts), where permitted; answers the priority it has.
 */
export function raiseProcess(pid: number, setting: PrioritySetting): Priority {
  try {
    setPriority(pid, setting.nice);
    setSessionGroupNice(pid, setting.nice);
    if (setting.realtime > 0) setRealtime(pid, setting.realtime);
  } catch {
    // Not permitted (not root): measured at the priority it has, which the report gives.
  }
  return priorityOf(pid);
}

/** How an answer counts: the call's true status and output, shed with Retry-After, or wrong. */
export function floodAnswerKind(
  kind: FloodKind,
  answer: { status: number; body: string; retryAfter?: string },
): "true" | "shed" | "wrong" {
  if (answer.status === 200) {
    const body = JSON.parse(answer.body) as { status?: string; stdout?: string };
    return body.status === kind.status && (kind.stdout === undefined || body.stdout === kind.stdout)
      ? "true"
      : "wrong";
  }
  return (answer.status === 429 || answer.status === 503) && answer.retryAfter !== undefined
    ? "shed"
    : "wrong";
}

/** Runs one phase in a flood client at `priority`; resolves to its figures and the priority it ran at. */
export async function flood(
  phase: FloodPhase,
  priority: PrioritySetting,
): Promise<{ result: FloodResult; priority: Priority }> {
  const child = spawn(
    process.execPath,
    ["--import", "tsx", join(REPOSITORY, "loadtest", "flood-client.ts"), JSON.stringify(phase)],
    { detached: true, stdio: ["pipe", "pipe", "inherit"] },
  );
  const stopChild = () => child.kill("SIGKILL");
  process.once("exit", stopChild);
  try {
    const output: Buffer[] = [];
    child.stdout?.on("data", (chunk: Buffer) => output.push(chunk));
    const exited = new Promise<number | null>((resolve, reject) => {
      child.once("error", reject);
      child.once("exit", (code) => resolve(code));
    });
    const raised = raiseProcess(child.pid as number, priority);
    // It starts once raised: the go line.
    child.stdin?.end("go\n");
    const code = await exited;
    if (code !== 0) throw new Error(`the flood client exited with code ${code}`);
    return {
      result: JSON.parse(Buffer.concat(output).toString("utf8")) as FloodResult,
      priority: raised,
    };
  } finally {
    process.off("exit", stopChild);
    stopChild();
  }
}
