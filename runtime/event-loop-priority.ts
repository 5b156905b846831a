// The gateway's event loop may run at a higher CPU priority (a lower nice value) than the work it
// hands out: it answers every call, sheds those past its bounds and settles their bills, and on a
// busy host a shed answer would otherwise wait for a core behind the guests and the neighbours.
// Linux keeps a nice value per thread, and a child starts with the one of the thread that forked
// it, so the daemon (spawned from the event loop's thread) is spawned at the nice value the
// process started with: only the event loop is raised, never the guests.
import { type ChildProcess, type SpawnOptions, spawn } from "node:child_process";
import { getPriority, setPriority } from "node:os";

/** The event loop thread's nice value before setEventLoopNice; undefined: never changed. */
let startingNice: number | undefined;

/** Sets the nice value of this thread, the event loop's (throws when not permitted, e.g. EACCES). */
export function setEventLoopNice(nice: number): void {
  const before = getPriority();
  setPriority(nice);
  startingNice ??= before;
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
