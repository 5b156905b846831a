import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { getPriority, setPriority } from "node:os";
import { fileURLToPath } from "node:url";
import { afterAll, expect, it } from "vitest";
import {
  groupedBySession,
  leadsItsSession,
  schedulingPolicyOf,
  sessionGroupNice,
  setEventLoopNice,
  spawnAtStartingNice,
} from "./event-loop-priority.js";

/** The nice value of a process, field 19 of /proc/PID/stat (after the parenthesized name). */
function niceOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[16]);
}

const starting = getPriority();
afterAll(() => setPriority(starting));

it("raises the event loop's thread and spawns children at the nice value it started with", async () => {
  // The test runner's session group is its caller's: never changed.
  const groupBefore = sessionGroupNice(process.pid);
  expect(setEventLoopNice(starting - 5)).toBe(
    groupedBySession() ? "not-session-leader" : "not-grouped-by-session",
  );
  expect(sessionGroupNice(process.pid)).toBe(groupBefore);
  expect(getPriority()).toBe(starting - 5);
  const child = spawnAtStartingNice("sleep", ["5"], { stdio: "ignore" });
  try {
    expect(child.pid).toBeDefined();
    expect(niceOf(child.pid as number)).toBe(starting);
    expect(getPriority()).toBe(starting - 5);
  } finally {
    child.kill("SIGKILL");
  }
  // Back at the starting value: children are spawned as they would be anyway.
  setEventLoopNice(starting);
  const plain = spawnAtStartingNice("sleep", ["5"], { stdio: "ignore" });
  try {
    expect(niceOf(plain.pid as number)).toBe(starting);
  } finally {
    plain.kill("SIGKILL");
  }
});

const MODULE = fileURLToPath(new URL("./event-loop-priority.ts", import.meta.url));

/** Runs `script` (with `p`, this module) in a Node process in a session of its own; answers what it printed, as JSON. */
async function inOwnSession<T>(script: string): Promise<T> {
  const child = spawn(
    process.execPath,
    ["--import", "tsx", "-e", `const p = await import(${JSON.stringify(MODULE)});\n${script}`],
    { detached: true, stdio: ["ignore", "pipe", "inherit"] },
  );
  const output: Buffer[] = [];
  child.stdout.on("data", (chunk: Buffer) => output.push(chunk));
  const code = await new Promise((resolve) => child.once("exit", resolve));
  expect(code).toBe(0);
  return JSON.parse(Buffer.concat(output).toString()) as T;
}

it("raises its session's scheduling group too when it leads a session of its own", async () => {
  // As `setsid npm start` starts the gateway.
  const seen = await inOwnSession<{ done: string; leads: boolean; group: number | undefined }>(
    `const done = p.setEventLoopNice(${starting - 3});
     console.log(JSON.stringify({ done, leads: p.leadsItsSession(), group: p.sessionGroupNice(process.pid) }));`,
  );
  expect(seen.leads).toBe(true);
  if (groupedBySession()) expect(seen).toMatchObject({ done: "set", group: starting - 3 });
  else expect(seen.done).toBe("not-grouped-by-session");
  expect(leadsItsSession()).toBe(false);
}, 30_000);

it("puts the event loop's thread alone under SCHED_RR; what it spawns has the ordinary policy", async () => {
  const seen = await inOwnSession<{ self: number; child: number; childNice: number }>(
    `p.setEventLoopNice(-5);
     p.setRealtime(undefined, 1);
     const { spawn } = await import("node:child_process");
     const child = spawn("sleep", ["5"], { stdio: "ignore" });
     const { getPriority } = await import("node:os");
     console.log(JSON.stringify({ self: p.schedulingPolicyOf(process.pid), child: p.schedulingPolicyOf(child.pid), childNice: getPriority(child.pid) }));
     child.kill("SIGKILL");`,
  );
  // 2: SCHED_RR; 0: the ordinary policy, and a negative nice value reset to 0.
  expect(seen).toEqual({ self: 2, child: 0, childNice: 0 });
  expect(schedulingPolicyOf(process.pid)).toBe(0);
}, 30_000);
