// The gateway's event loop may run at a higher CPU priority (a lower nice value) than the work it
// hands out: it answers every call, sheds those past its bounds and settles their bills, and on a
// busy host a shed answer would otherwise wait for a core behind the guests and the neighbours.
// Linux keeps a nice value per thread, and a child starts with the one of the thread that forked
// it, so the daemon (spawned from the event loop's thread) is spawned at the nice value the
// process started with: only the event loop is raised, never the guests.
//
// A nice value orders threads only within their scheduling group. Where the kernel groups tasks
// by session (autogroup: kernel.sched_autogroup_enabled, for tasks outside any cpu cgroup), every
// session's group gets an equal share against the others, and a neighbour started from another
// shell is another group: a thread's nice value alone does not put it ahead of that neighbour. So
// when the gateway leads a session of its own (`setsid npm start`), it gives its session's group
// the same nice value; the daemon runs in a session of its own (runtime/supervisor.ts), whose
// group keeps the default.
import { type ChildProcess, execFileSync, type SpawnOptions, spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { getPriority, setPriority } from "node:os";

/** The event loop thread's nice value before setEventLoopNice; undefined: never changed. */
let startingNice: number | undefined;

/**
 * What setSessionGroupNice (setEventLoopNice) did to a process's scheduling group: set its nice
 * value, or left it because the kernel does not group by session here, or because the process
 * does not lead its session (the group is its caller's: a shell's, a test runner's).
 */
export type SessionGroupNice = "set" | "not-grouped-by-session" | "not-session-leader";

const AUTOGROUP_ENABLED = "/proc/sys/kernel/sched_autogroup_enabled";

/** Whether the kernel schedules tasks in groups by session (autogroup). */
export function groupedBySession(): boolean {
  try {
    return readFileSync(AUTOGROUP_ENABLED, "utf8").trim() === "1";
  } catch {
    return false;
  }
}

/** Field `field` (numbered as in proc(5)) of the stat of `pid` ("self": this process). */
function statField(pid: number | "self", field: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  // Fields 1 and 2, the pid and the parenthesised command name (which may hold spaces), go first.
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[field - 3]);
}

/** Whether `pid` (undefined: this process) leads its session: its session id, field 6 of its stat, is its pid. */
export function leadsItsSession(pid?: number): boolean {
  return statField(pid ?? "self", 6) === (pid ?? process.pid);
}

/** The nice value of the session group of `pid`, from /proc/PID/autogroup ("/autogroup-N nice V"). */
export function sessionGroupNice(pid: number): number | undefined {
  try {
    const match = / nice (-?\d+)/.exec(readFileSync(`/proc/${pid}/autogroup`, "utf8"));
    return match === null ? undefined : Number(match[1]);
  } catch {
    return undefined;
  }
}

/**
 * Sets the nice value of the session group of `pid` (undefined: this process's), where the kernel
 * groups tasks by session and `pid` leads its own; answers what it did. The kernel takes one such
 * write a tenth of a second on the whole host and answers EAGAIN to the rest, so it is tried
 * again for up to a second; other errors (EACCES, EPERM: not permitted) are thrown.
 */
export function setSessionGroupNice(pid: number | undefined, nice: number): SessionGroupNice {
  if (!groupedBySession()) return "not-grouped-by-session";
  if (!leadsItsSession(pid)) return "not-session-leader";
  for (let attempt = 1; ; attempt++) {
    try {
      writeFileSync(`/proc/${pid ?? "self"}/autogroup`, String(nice));
      return "set";
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EAGAIN" || attempt === 20) throw error;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);
    }
  }
}

/**
 * Sets the nice value of this thread, the event loop's, and where the kernel groups tasks by
 * session and this process leads its own, of its session's group (throws when not permitted,
 * e.g. EACCES).
 */
export function setEventLoopNice(nice: number): SessionGroupNice {
  const before = getPriority();
  setPriority(nice);
  startingNice ??= before;
  return setSessionGroupNice(undefined, nice);
}

/**
 * Puts the main thread of `pid` (undefined: this process's, the event loop's) under SCHED_RR at
 * `priority` (1 to 99) with the reset-on-fork flag, by util-linux's chrt (throws when not
 * permitted: it needs root or CAP_SYS_NICE).
 */
export function setRealtime(pid: number | undefined, priority: number): void {
  execFileSync(
    "chrt",
    ["--rr", "--reset-on-fork", "--pid", String(priority), String(pid ?? process.pid)],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
}

/** The scheduling policy of `pid`'s main thread (field 41 of its stat): 0 ordinary, 2 SCHED_RR. */
export function schedulingPolicyOf(pid: number): number {
  return statField(pid, 41);
}

/** `spawn`, the child at the nice value this process started with (see setEventLoopNice). */
export function spawnAtStartingNice(
  command: string,
  args: readonly string[],
  options: SpawnOptions,
): ChildProcess {
  if (startingNice === undefined || startingNice === getPriority())
    return spawn(command, args, options);
  const raised = getPriority();
  setPriority(startingNice);
  try {
    return spawn(command, args, options);
  } finally {
    try {
      setPriority(raised);
    } catch {
      // Raising it again needs the privilege the first raise had; without it the event loop
      // keeps the starting nice value, as it would have without SANDFORK_GATEWAY_NICE.
    }
  }
}
